"""GPU tests of the decode kernel (issue 28) against float64: M from 1 to 16 (A's rows in shared
memory) and N from 1 to 16 with a large M (C^T = B^T A^T), more than 16 rows (several passes), odd K
and short K at every shift of a column from 16 bytes (the unaligned variant), K across several shared K tiles, leading dimensions past the width, pointers
one float off 16 bytes, beta != 0 and beta == 0 over a C full of NaN, K split over a column group's
warps (slices), C column-major, and strided batches (packed, stride 0 broadcast, batch 0). Every
matrix lies in a NaN-filled buffer: nothing outside C may be written. Each test runs on the FFMA
kernels and on the tensor path's (math tf32 / 3xtf32: mma.sync for every pass), each within its own
math's tolerance; and the tensor path's error class at 1 to 16 rows: 3xtf32 within cuBLAS FP32's (about
1e-6 relative), tf32 rounded to nearest (as cuBLAS TF32), the same bits run after run.

Run with `pytest -m gpu tests/test_gpu_decode.py` (needs PyTorch with CUDA, no CuPy); skipped
without a GPU.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gemmgen.gpu import verify
from gemmgen.gpu.launch import CudaError
from gemmgen.language.load import load_one
from gemmgen.plan import make_plan

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = load_one(ROOT / "specs" / "decode.gemm", "decode")
SPECS = {
    "decode": SHIPPED,                                                                  # 2 columns x 8 warps
    "decode_slices": replace(SHIPPED.with_values(decode_columns=4, decode_warps=8, decode_slices=4),
                             name="decode_slices"),                                    # K over 4 warps
    "decode_ccol": replace(SHIPPED.with_values(layout_C="col", decode_columns=1), name="decode_ccol"),
    # 4 column groups of 4 columns: unaligned, a warp's columns are every 4th, so they share their shift
    "decode_groups4": replace(SHIPPED.with_values(decode_columns=4, decode_warps=4), name="decode_groups4"),
    # one column, K over 2 warps: a lane's last step of a K tile reaches past it (8 float4s in flight)
    "decode_1col_slices": replace(SHIPPED.with_values(decode_columns=1, decode_warps=8, decode_slices=2),
                                  name="decode_1col_slices"),
    # the tensor path: one tile of 16 columns x 8 warps (K slices); 2 tiles x 4 warps; 2 tiles x 4 warps
    # with C column-major; 1 tile x 4 warps (a block of 4 warps); 4 tiles x 4 warps (a block of 16)
    "decode_tf32": replace(SHIPPED.with_values(math="tf32"), name="decode_tf32"),
    "decode_3xtf32": replace(SHIPPED.with_values(math="3xtf32"), name="decode_3xtf32"),
    "decode_3xtf32_tiles": replace(SHIPPED.with_values(math="3xtf32", decode_columns=4), name="decode_3xtf32_tiles"),
    "decode_tf32_ccol": replace(SHIPPED.with_values(math="tf32", layout_C="col", decode_columns=4),
                                name="decode_tf32_ccol"),
    "decode_3xtf32_w4": replace(SHIPPED.with_values(math="3xtf32", decode_columns=4, decode_warps=4),
                                name="decode_3xtf32_w4"),
    "decode_tf32_w16": replace(SHIPPED.with_values(math="tf32", decode_columns=4, decode_warps=16),
                               name="decode_tf32_w16"),
}
TENSOR = [name for name, spec in SPECS.items() if spec["math"] != "simt"]


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU found")
    return torch


@pytest.fixture(scope="module")
def kernels(torch):
    from gemmgen.gpu.runtime import Kernel
    torch.zeros(1, device="cuda")  # the primary context, which the runtime shares
    built = {}

    def get(name):
        if name not in built:
            built[name] = Kernel(make_plan(SPECS[name]))
        return built[name]

    yield get
    for kernel in built.values():
        kernel.close()


class Placed:
    """`count` matrices of rows x cols (row: each row `ld` floats apart; col: each column) in one
    NaN-filled device buffer, `stride` floats apart (0: one for every batch), the first `offset`
    floats past a 16-byte boundary."""

    def __init__(self, torch, mats, layout, pad, stride=None, offset=0):
        rows, cols = mats[0].shape
        self.layout, self.rows, self.cols = layout, rows, cols
        length, lines = (cols, rows) if layout == "row" else (rows, cols)
        self.ld = max(length + pad, 1)
        extent = (lines - 1) * self.ld + length if rows and cols else 0
        self.stride = extent if stride is None else stride
        self.front = 8 + offset
        size = self.front + max(len(mats) - 1, 0) * self.stride + lines * self.ld + 8
        host = np.full(size, np.nan, np.float32)
        for i, m in enumerate(mats):
            self._view(host, i)[...] = m
        self.buffer = torch.from_numpy(host).cuda()
        self.ptr = self.buffer.data_ptr() + 4 * self.front

    def _view(self, flat, i):
        start = self.front + i * self.stride
        lines = self.rows if self.layout == "row" else self.cols
        block = flat[start:start + lines * self.ld].reshape(lines, self.ld)
        return block[:, :self.cols] if self.layout == "row" else block[:, :self.rows].T

    def host(self):
        return self.buffer.cpu().numpy()

    def matrices(self, count):
        flat = self.host()
        return [self._view(flat, i).copy() for i in range(count)]

    def outside(self, count):
        flat = self.host()
        marks = np.arange(flat.size)
        covered = np.zeros(flat.size, bool)
        for i in range(count):
            covered[self._view(marks, i).ravel()] = True
        return flat[~covered]


def check(torch, kernel, M, N, K, *, pad=0, offset=0, beta=-0.5, alpha=1.5, batch=1, shared=None, seed=0):
    """One call (batch > 1 or shared: strided batches, `shared` "A" or "B" at stride 0) against float64."""
    rng = np.random.default_rng(seed + 7 * M + 13 * N + K)
    count_a = 1 if shared == "A" else max(batch, 1)
    count_b = 1 if shared == "B" else max(batch, 1)
    As = [rng.uniform(-1, 1, (M, K)).astype(np.float32) for _ in range(count_a)]
    Bs = [rng.uniform(-1, 1, (K, N)).astype(np.float32) for _ in range(count_b)]
    Cs = [rng.uniform(-1, 1, (M, N)).astype(np.float32) for _ in range(max(batch, 1))]
    if beta == 0:
        Cs = [np.full((M, N), np.nan, np.float32) for _ in Cs]  # beta 0: C is not read
    layout_c = kernel.plan.c_layout
    a = Placed(torch, As, "row", pad, 0 if shared == "A" else None, offset)
    b = Placed(torch, Bs, "col", pad, 0 if shared == "B" else None, offset)
    c = Placed(torch, Cs, layout_c, pad, None, offset)
    before = c.host()
    kernel.launch(M, N, K, alpha, a.ptr, a.ld, b.ptr, b.ld, beta, c.ptr, c.ld, batch=batch,
                  strides=(a.stride, b.stride, c.stride))
    torch.cuda.synchronize()
    what = f"{kernel.name} {M}x{N}x{K} pad {pad} offset {offset} beta {beta} batch {batch} shared {shared}"
    if batch == 0 or M == 0 or N == 0:
        assert np.array_equal(before, c.host(), equal_nan=True), f"{what}: wrote C"
        return
    outs = c.matrices(batch)
    for i in range(batch):
        A64 = As[0 if shared == "A" else i].astype(np.float64)
        B64 = Bs[0 if shared == "B" else i].astype(np.float64)
        old = np.zeros((M, N)) if beta == 0 else Cs[i].astype(np.float64)
        reference = alpha * (A64 @ B64) + beta * old
        scale = abs(alpha) * (np.abs(A64) @ np.abs(B64)) + abs(beta) * np.abs(old)
        bad = ~(np.abs(outs[i] - reference) <= verify.tolerance(scale, max(K, 1), kernel.plan.spec["math"]))
        assert not bad.any(), f"{what}: {int(bad.sum())} of {M * N} wrong in batch {i}"
    assert np.isnan(c.outside(batch)).all(), f"{what}: wrote outside C"


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("K", [131, 1024])  # odd (scalar variant) and a multiple of 4 (float4 loads)
def test_m_from_1_to_16(name, K, kernels, torch):
    for M in range(1, 17):
        check(torch, kernels(name), M, 257, K)


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("K", [131, 1024])
def test_n_from_1_to_16_is_the_transposed_product(name, K, kernels, torch):
    for N in range(1, 17):
        check(torch, kernels(name), 300, N, K)


@pytest.mark.parametrize("name", list(SPECS))
def test_more_than_16_rows_take_several_passes(name, kernels, torch):
    for M, N, K in ((37, 45, 70), (17, 1000, 64), (1000, 33, 65), (16, 16, 33), (5, 5, 5)):
        check(torch, kernels(name), M, N, K)


@pytest.mark.parametrize("name", list(SPECS))
def test_k_across_several_shared_tiles(name, kernels, torch):
    # K tile: 8192 floats / rows (512 at 16 rows, 8192 at 1)
    for M, N, K in ((16, 64, 2000), (1, 40, 20000), (3, 100, 8193), (64, 5, 1537)):
        check(torch, kernels(name), M, N, K)


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("pad,offset", [(3, 0), (4, 0), (0, 1), (4, 1), (5, 3)])
def test_leading_dimensions_past_the_width_and_misaligned_pointers(name, pad, offset, kernels, torch):
    for M, N, K in ((4, 333, 256), (333, 7, 256), (1, 64, 99)):
        check(torch, kernels(name), M, N, K, pad=pad, offset=offset)


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("pad,offset", [(1, 0), (2, 1), (3, 3), (5, 2)])
def test_short_unaligned_k_at_every_shift(name, pad, offset, kernels, torch):
    # Unaligned, FFMA reads a column in float4s from the 16-byte boundary at or before its start: K of
    # 1 to 9 has no float4 wholly inside it, or one, or two, beside up to 3 floats before and after
    # (and the NaNs around every matrix must not reach C).
    for K in range(1, 10):
        check(torch, kernels(name), 3, 37, K, pad=pad, offset=offset)
        check(torch, kernels(name), 37, 2, K, pad=pad, offset=offset)
        check(torch, kernels(name), 16, 70, K + 20, pad=pad, offset=offset)


@pytest.mark.parametrize("name", list(SPECS))
def test_beta_zero_never_reads_c(name, kernels, torch):
    for M, N, K in ((1, 4096, 256), (16, 100, 131), (500, 3, 64)):
        check(torch, kernels(name), M, N, K, beta=0.0)


@pytest.mark.parametrize("name", list(SPECS))
def test_k_zero_scales_c_and_empty_c_writes_nothing(name, kernels, torch):
    check(torch, kernels(name), 5, 9, 0)
    check(torch, kernels(name), 5, 9, 0, beta=0.0)
    check(torch, kernels(name), 0, 9, 16)
    check(torch, kernels(name), 7, 0, 16)


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("batch,shared", [(5, None), (4, "A"), (4, "B"), (1, None), (0, None)])
def test_strided_batches(name, batch, shared, kernels, torch):
    for M, N, K in ((4, 300, 128), (200, 3, 67)):
        check(torch, kernels(name), M, N, K, batch=batch, shared=shared)
        check(torch, kernels(name), M, N, K, batch=batch, shared=shared, pad=1, offset=1, beta=0.0)


def test_bad_arguments_are_refused_with_nothing_written(kernels, torch):
    kernel = kernels("decode")
    M, N, K = 4, 64, 32
    C = torch.full((M, N), float("nan"), device="cuda")
    A = torch.ones((M, K), device="cuda")
    B = torch.ones((N, K), device="cuda")
    for args in ((M, N, K, K - 1, K, N), (M, N, K, K, K - 1, N), (M, N, K, K, K, N - 1), (-1, N, K, K, K, N)):
        m, n, k, lda, ldb, ldc = args
        with pytest.raises(CudaError):
            kernel.launch(m, n, k, 1.0, A.data_ptr(), lda, B.data_ptr(), ldb, 0.0, C.data_ptr(), ldc)
    torch.cuda.synchronize()
    assert torch.isnan(C).all()


# --- the tensor path's error class and reproducibility

def _tf32_nearest(x: np.ndarray) -> np.ndarray:
    """float32 -> TF32 rounded to nearest, ties away from zero (cvt.rna.tf32.f32), as float64."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


def _relative(out, reference) -> float:
    return float(np.linalg.norm(out - reference) / np.linalg.norm(reference))


def _run(torch, kernel, A, Bt, transposed=False):
    """C = A B (B = Bt^T, K-contiguous, an nn.Linear weight) on the device; C^T's orientation is the
    kernel's choice (N < M)."""
    M, K = A.shape
    N = Bt.shape[0]
    a, b = torch.from_numpy(A).cuda(), torch.from_numpy(Bt).cuda()
    layout_c = kernel.plan.c_layout
    c = torch.full((M, N) if layout_c == "row" else (N, M), float("nan"), device="cuda")
    kernel.launch(M, N, K, 1.0, a.data_ptr(), K, b.data_ptr(), K, 0.0, c.data_ptr(), N if layout_c == "row" else M)
    torch.cuda.synchronize()
    out = c.cpu().numpy().astype(np.float64)
    return out if layout_c == "row" else out.T


@pytest.mark.parametrize("rows", [1, 3, 5, 8, 13, 16])
@pytest.mark.parametrize("mirror", [False, True])
def test_3xtf32_is_in_cublas_fp32s_class_and_tf32_is_rounded_to_nearest(rows, mirror, kernels, torch):
    rng = np.random.default_rng(rows)
    K, wide = 4096, 1000
    small = rng.uniform(-1, 1, (rows, K)).astype(np.float32)
    big = rng.uniform(-1, 1, (wide, K)).astype(np.float32)
    # M small (rows of A, B's columns streamed), or its mirror N small (C^T = B^T A^T)
    A, Bt = (big, small) if mirror else (small, big)
    exact = A.astype(np.float64) @ Bt.astype(np.float64).T
    three = _relative(_run(torch, kernels("decode_3xtf32"), A, Bt), exact)
    assert three < 5e-6, f"3xtf32 at {rows} rows: relative error {three:.2e}, FP32's class is about 1e-6"
    one = _run(torch, kernels("decode_tf32"), A, Bt)
    # rounded to nearest: the product of A and B rounded to TF32, summed in FP32; not FP32-exact
    rounded = _tf32_nearest(A) @ _tf32_nearest(Bt).T
    assert _relative(one, rounded) < 5e-6, f"tf32 at {rows} rows is not A and B rounded to nearest"
    assert 1e-5 < _relative(one, exact) < 2e-3, f"tf32 at {rows} rows: {_relative(one, exact):.2e} off FP32"
    truncated = ((A.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
                 @ (Bt.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64).T)
    assert _relative(one, rounded) < _relative(one, truncated) / 10  # rounded, not truncated


@pytest.mark.parametrize("name", TENSOR)
def test_the_tensor_path_gives_the_same_bits_every_run(name, kernels, torch):
    rng = np.random.default_rng(9)
    for rows, wide, K in ((16, 777, 5000), (7, 64, 131), (3000, 11, 4099)):
        A = rng.uniform(-1, 1, (rows, K)).astype(np.float32)
        Bt = rng.uniform(-1, 1, (wide, K)).astype(np.float32)
        first = _run(torch, kernels(name), A, Bt)
        for _ in range(3):
            assert np.array_equal(_run(torch, kernels(name), A, Bt), first), (name, rows, wide, K)


@pytest.mark.parametrize("rows", [5, 7, 8, 16])
def test_3xtf32_error_does_not_grow_along_k(rows, kernels, torch):
    """The tensor cores round their sums toward zero, so the kernel adds each batch of products into
    FP32 registers: the error stays 3xTF32's (about 3.4e-7 on uniform data) however long K is. A sum
    kept in the tensor cores all along K measured 2.4e-6 at 7 x 8192 x 8192 (cuBLAS FP32 5.7e-7)."""
    rng = np.random.default_rng(rows)
    errors = {}
    for K in (1024, 16384):
        A = rng.uniform(-1, 1, (rows, K)).astype(np.float32)
        Bt = rng.uniform(-1, 1, (2048, K)).astype(np.float32)
        exact = A.astype(np.float64) @ Bt.astype(np.float64).T
        errors[K] = _relative(_run(torch, kernels("decode_3xtf32"), A, Bt), exact)
    assert errors[16384] < 5e-7 and errors[16384] < 1.5 * errors[1024], (rows, errors)
