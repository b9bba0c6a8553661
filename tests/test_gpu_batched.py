"""GPU tests of strided-batched GEMM: every path (SIMT naive and tiled, mma.sync, register-fed wgmma,
TMA-fed wgmma) and schedule (data-parallel, split K, persistent, stream-K, ping-pong, clusters, the
staged TMA store) against float64, batch by batch, with the batches packed, padded (strides past
the matrices, the gaps never written) and broadcast (stride 0 for A or B); batch 0 and 1; odd
sizes (which the TMA kernels hand to their fallback) and TMA-ready ones. Through the Python runtime
(3-D arrays and raw pointers) and the nvcc-built C entry point, whose refused calls write nothing.

Run with `pytest -m gpu tests/test_gpu_batched.py`; skipped without a GPU and CuPy (the sm_90a
kernels without an sm_90 GPU).
"""

from __future__ import annotations

import ctypes
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gemmgen.gpu import verify
from gemmgen.language.load import load_one
from gemmgen.plan import make_plan
from hopper_gpu import batched_entry

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent


def _spec(name: str, variant: str | None = None, **values):
    spec = load_one(ROOT / "specs" / f"{name}.gemm", name)
    return replace(spec.with_values(**values), name=variant) if values else spec


SPECS = {
    "naive": _spec("naive"),                                   # SIMT, no shared memory
    "warptile": _spec("warptile"),                             # SIMT tiles
    "warptile_cols": _spec("warptile", "warptile_cols", layout_A="col", layout_C="col"),  # column-major A, C
    "split_k": _spec("split_k"),                               # SIMT tiles, split K (C = beta C first)
    "tensorcore_tf32": _spec("tensorcore_tf32"),               # mma.sync
    "hopper_skinny": _spec("hopper_skinny"),                   # register-fed wgmma
    "hopper_tf32": _spec("hopper_tf32"),                       # TMA-fed wgmma, data-parallel
    "hopper_tf32_split": _spec("hopper_tf32", "hopper_tf32_split", split=4),
    "hopper_tf32_split_workspace": _spec("hopper_tf32", "hopper_tf32_split_workspace", split=4, split_by="workspace"),
    "hopper_tf32_persistent": _spec("hopper_tf32_persistent"),
    "hopper_tf32_streamk": _spec("hopper_tf32_streamk"),
    "hopper_tf32_pingpong": _spec("hopper_tf32_pingpong"),
    "hopper_tf32_cluster": _spec("hopper_tf32_cluster"),
    "hopper_tf32_persistent_staged": load_one(ROOT / "specs" / "hopper_tf32_staged.gemm",
                                              "hopper_tf32_persistent_staged"),
    "hopper_tf32_staged_ccol": _spec("hopper_tf32", "hopper_tf32_staged_ccol", epilogue_staged=True,
                                     layout_C="col", block_n=128, warp_n=128, mma_n=128),  # TMA-stored C, column-major
    "hopper_3xtf32_streamk": _spec("hopper_3xtf32_streamk"),
    # MN-major operands on the TMA path: A read into registers, B transposed by the producer
    "hopper_3xtf32_cr": _spec("hopper_3xtf32", "hopper_3xtf32_cr", layout_A="col", layout_B="row"),
    "hopper_3xtf32_streamk_rr": _spec("hopper_3xtf32_streamk", "hopper_3xtf32_streamk_rr", layout_B="row"),
}
SM90A = {name for name, spec in SPECS.items() if spec["target"] == "sm_90a"}

# (M, N, K): odd sizes (TMA kernels: their fallback, K not a multiple of 4), and sizes TMA takes
SHAPES = [(67, 45, 33), (256, 192, 132), (1, 1, 1)]


@pytest.fixture(scope="module")
def cp():
    pytest.importorskip("cupy")
    from gemmgen.gpu.runtime import device_count
    if device_count() == 0:
        pytest.skip("no CUDA GPU found")
    import cupy
    return cupy


@pytest.fixture(scope="module")
def kernels(cp):
    from gemmgen.gpu.runtime import Kernel, device_info
    sm90 = device_info().compute_capability == (9, 0)
    built = {}

    def get(name):
        if name in SM90A and not sm90:
            pytest.skip(f"{name} is built for sm_90a")
        if name not in built:
            built[name] = Kernel(make_plan(SPECS[name]))
        return built[name]

    yield get
    for kernel in built.values():
        kernel.close()


class Operand:
    """`count` matrices of rows x cols in `layout` with leading dimension ld, in one device buffer,
    `stride` floats apart (0: one matrix for every batch), after `front` NaN floats and with NaN in
    every gap: what a strided-batched call reads (or, for C, writes)."""

    def __init__(self, cp, mats: list[np.ndarray], layout: str, pad: int, stride: int | None, front: int = 4):
        rows, cols = mats[0].shape
        self.layout, self.rows, self.cols, self.front = layout, rows, cols, front
        length = cols if layout == "row" else rows
        lines = rows if layout == "row" else cols
        self.ld = length + pad
        self.extent = (lines - 1) * self.ld + length
        self.stride = self.extent if stride is None else stride  # None: packed
        count = len(mats)
        size = front + (count - 1) * self.stride + lines * self.ld + 4
        host = np.full(size, np.nan, np.float32)
        for i, m in enumerate(mats):
            self._view(host, i)[...] = m
        self.buffer = cp.asarray(host)
        self.ptr = self.buffer.data.ptr + 4 * front

    def _view(self, flat: np.ndarray, i: int) -> np.ndarray:
        start = self.front + i * self.stride
        lines = self.rows if self.layout == "row" else self.cols
        block = flat[start:start + lines * self.ld].reshape(lines, self.ld)
        block = block[:, :self.cols] if self.layout == "row" else block[:, :self.rows].T
        return block

    def matrices(self, count: int) -> list[np.ndarray]:
        host = self.buffer.get()
        return [self._view(host, i).copy() for i in range(count)]

    def outside(self, count: int) -> np.ndarray:
        """Every float of the buffer that no matrix covers."""
        host = self.buffer.get()
        covered = np.zeros(host.size, bool)
        marks = np.arange(host.size, dtype=np.int64)
        for i in range(count):
            covered[self._view(marks, i).ravel()] = True
        return host[~covered]


def _check(kernel, name, M, N, K, batch, stride_a, stride_b, stride_c, pad, cp, alpha=1.5, beta=-0.5, seed=1):
    """One batched call through the raw entry point, every batch against float64, C's gaps untouched."""
    spec = kernel.plan.spec
    rng = np.random.default_rng(seed)
    count_a = 1 if stride_a == 0 else batch
    count_b = 1 if stride_b == 0 else batch
    As = [rng.uniform(-1, 1, (M, K)).astype(np.float32) for _ in range(max(count_a, 1))]
    Bs = [rng.uniform(-1, 1, (K, N)).astype(np.float32) for _ in range(max(count_b, 1))]
    Cs = [rng.uniform(-1, 1, (M, N)).astype(np.float32) for _ in range(max(batch, 1))]
    a = Operand(cp, As, spec["layout.A"], pad, stride_a)
    b = Operand(cp, Bs, spec["layout.B"], pad, stride_b)
    c = Operand(cp, Cs, kernel.layouts["C"], pad, stride_c)
    before = c.buffer.copy()
    kernel.launch(M, N, K, alpha, a.ptr, a.ld, b.ptr, b.ld, beta, c.ptr, c.ld, batch=batch,
                  strides=(0 if stride_a == 0 else a.stride, 0 if stride_b == 0 else b.stride, c.stride))
    cp.cuda.runtime.deviceSynchronize()
    if batch == 0:
        assert cp.array_equal(before, c.buffer, equal_nan=True), f"{name}: batch 0 wrote C"
        return
    outs = c.matrices(batch)
    for i in range(batch):
        A64, B64 = As[i if count_a > 1 else 0].astype(np.float64), Bs[i if count_b > 1 else 0].astype(np.float64)
        reference = alpha * (A64 @ B64) + beta * Cs[i]
        scale = abs(alpha) * (np.abs(A64) @ np.abs(B64)) + abs(beta) * np.abs(Cs[i])
        bad = ~(np.abs(outs[i] - reference) <= verify.tolerance(scale, K, spec["math"]))
        assert not bad.any(), f"{name} {M}x{N}x{K} batch {i} of {batch}: {int(bad.sum())} elements wrong"
    assert np.isnan(c.outside(batch)).all(), f"{name} {M}x{N}x{K} x {batch}: wrote outside the batches of C"


# (batch, A's stride, B's stride, C's stride, padding of each leading dimension); None: packed
LAYOUTS = {"packed": (5, None, None, None, 0),
           "padded": (3, "pad", "pad", "pad", 4),
           "broadcast A": (4, 0, None, None, 0),
           "broadcast B": (4, None, 0, None, 0),
           "one batch": (1, None, None, None, 0),
           "no batch": (0, None, None, None, 0)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", list(SPECS))
def test_every_path_and_schedule_multiplies_every_batch(name, layout, kernels, cp):
    kernel = kernels(name)
    batch, sa, sb, sc, pad = LAYOUTS[layout]
    for M, N, K in SHAPES:
        # padded: each batch 37 floats (a multiple of 4 plus 1: scalar path) or 64 (aligned) past its matrix
        extra = 64 if M % 4 == 0 else 37
        strides = []
        for stride, rows, cols, layout_name in ((sa, M, K, "layout.A"), (sb, K, N, "layout.B"),
                                                (sc, M, N, None)):
            lay = kernel.layouts["C"] if layout_name is None else kernel.plan.spec[layout_name]
            lines, length = (rows, cols) if lay == "row" else (cols, rows)
            strides.append(((lines - 1) * (length + pad) + length + extra) if stride == "pad" else stride)
        _check(kernel, name, M, N, K, batch, *strides, pad, cp, seed=M + N + K)


@pytest.mark.parametrize("name", ["naive", "tensorcore_tf32", "hopper_tf32", "hopper_tf32_streamk",
                                  "hopper_tf32_persistent_staged"])
def test_3d_arrays_through_the_python_call(name, kernels, cp):
    """Kernel(A, B, C) with 3-D CuPy arrays: batch b of C = alpha A[b] B[b] + beta C[b]; a 2-D B serves
    every batch."""
    kernel = kernels(name)
    layouts = kernel.layouts
    batch, M, N, K = 6, 200, 136, 96
    rng = np.random.default_rng(5)
    A = rng.uniform(-1, 1, (batch, M, K)).astype(np.float32)
    B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
    C = rng.uniform(-1, 1, (batch, M, N)).astype(np.float32)

    def device(x, layout):  # a column-major matrix per batch where the spec says so
        d = cp.asarray(x)
        return d if layout == "row" else cp.ascontiguousarray(d.swapaxes(-1, -2)).swapaxes(-1, -2)

    a, b, c = device(A, layouts["A"]), device(B, layouts["B"]), device(C, layouts["C"])
    kernel(a, b, c, alpha=2.0, beta=0.5)
    out = c.get()
    for i in range(batch):
        reference = 2.0 * (A[i].astype(np.float64) @ B.astype(np.float64)) + 0.5 * C[i]
        scale = 2.0 * (np.abs(A[i].astype(np.float64)) @ np.abs(B.astype(np.float64))) + 0.5 * np.abs(C[i])
        bad = ~(np.abs(out[i] - reference) <= verify.tolerance(scale, K, kernel.plan.spec["math"]))
        assert not bad.any(), f"{name} batch {i}: {int(bad.sum())} elements wrong"


def _build_batched_abi(name: str, folder: Path):
    from test_gpu_schedule import _build_abi
    _build_abi(name, folder, SPECS[name])
    return batched_entry(ctypes.CDLL(str(folder / f"lib{name}.so")), name)


@pytest.mark.parametrize("name", ["hopper_tf32_streamk", "hopper_tf32_persistent_staged"])
def test_the_c_entry_point_multiplies_batches_and_refuses_bad_ones_writing_nothing(name, kernels, cp, tmp_path):
    kernels(name)  # skips where the kernel cannot run
    function = _build_batched_abi(name, tmp_path)
    M, N, K, batch = 300, 260, 128, 5
    rng = np.random.default_rng(3)
    A = rng.uniform(-1, 1, (batch, M, K)).astype(np.float32)
    B = rng.uniform(-1, 1, (K, N)).astype(np.float32)  # B column-major (layout B col), one for all
    C = rng.uniform(-1, 1, (batch, M, N)).astype(np.float32)
    a = cp.asarray(A)
    b = cp.asarray(np.ascontiguousarray(B.T))  # K-major: B(k, n) at b[n * K + k]
    c = cp.asarray(C)
    status = function(M, N, K, 1.0, a.data.ptr, K, b.data.ptr, K, 1.0, c.data.ptr, N, batch, M * K, 0, M * N, None)
    assert status == 0
    cp.cuda.runtime.deviceSynchronize()
    out = c.get()
    for i in range(batch):
        reference = A[i].astype(np.float64) @ B.astype(np.float64) + C[i]
        scale = np.abs(A[i].astype(np.float64)) @ np.abs(B.astype(np.float64)) + np.abs(C[i])
        assert (np.abs(out[i] - reference) <= verify.tolerance(scale, K, "tf32")).all(), f"batch {i}"
    before = c.copy()
    for bad in ((-1, M * K, 0, M * N), (batch, -4, 0, M * N), (batch, M * K, 0, M * N - 1), (batch, M * K, 0, 0)):
        assert function(M, N, K, 1.0, a.data.ptr, K, b.data.ptr, K, 1.0, c.data.ptr, N, *bad, None) == 1, bad
    assert function(M, N, K, 1.0, None, K, None, K, 1.0, None, N, 0, 0, 0, 0, None) == 0  # batch 0: nothing
    cp.cuda.runtime.deviceSynchronize()
    assert cp.array_equal(before, c), "a refused call wrote C"
