"""GPU tests of padding (gemmgen/library/padding.py): unaligned calls that pay to pad run the aligned
member on padded copies, through gemmgen.matmul on PyTorch tensors and CuPy arrays, single and
batched, against float64; only C's elements are written; the tf32 library's copies round to
nearest, so that its error is cuBLAS TF32's; a call captured in a CUDA graph runs the unaligned
member and replays right. (The .cu's C ABI: tests/test_gpu_library.py.)

Run with `pytest -m gpu tests/test_gpu_padding.py`; skipped without a GPU, torch with CUDA, or a
tuned library.
"""

from __future__ import annotations

import numpy as np
import pytest

from gemmgen.gpu import verify

torch = pytest.importorskip("torch")

from test_gpu_matmul_batched import MATH, PRECISIONS, cuda  # noqa: E402,F401 - cuda: the skips, autouse

pytestmark = pytest.mark.gpu


def operand(rows, cols, layout, seed, pad=0, batch=0):
    """uniform(-1, 1) float32 values on the GPU, row- or column-major, lines `pad` floats longer
    than they need (NaN there); `batch` > 0: that many matrices, one after another."""
    shape = (batch, rows, cols) if batch else (rows, cols)
    values = torch.from_numpy(np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)).cuda()
    lines, length = (rows, cols) if layout == "row" else (cols, rows)
    buffer = torch.full(((batch,) if batch else ()) + (lines, length + pad), float("nan"), device="cuda")
    view = buffer[..., :length]
    view.copy_(values if layout == "row" else values.mT)
    return view if layout == "row" else view.mT


def relative_error(got, reference):
    return float(torch.linalg.norm(got.double() - reference) / torch.linalg.norm(reference))


def check(got, A, B, C, alpha, beta, precision, what):
    A64, B64 = A.double(), B.double()
    reference = alpha * (A64 @ B64) + (beta * C.double() if beta else 0)
    scale = abs(alpha) * (A64.abs() @ B64.abs()) + (abs(beta) * C.double().abs() if beta else 0)
    tolerance = verify.tolerance(scale.cpu().numpy(), A.shape[-1], MATH[precision])
    bad = ~(np.abs(got.double().cpu().numpy() - reference.cpu().numpy()) <= tolerance)
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} elements wrong"
    return reference


def padded(precision, M, N, K, lds, residues=(0, 0, 0), batch=1, strides=(0, 0, 0), beta=False):
    """Whether the library pads this call key."""
    from gemmgen.library.dispatch import library
    from gemmgen.library.padding import PaddedLaunch
    run = library(precision).prepare(M, N, K, *lds, residues, beta, batch, strides)
    return isinstance(run, PaddedLaunch)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("M,N,K,pad,beta", [(2047, 2047, 2047, 0, 0.0), (4096, 4096, 4096, 1, -0.5),
                                            (3001, 2999, 1531, 0, -0.5)])
def test_an_unaligned_call_that_pays_runs_padded_and_writes_only_c(precision, M, N, K, pad, beta):
    """C copied in (beta != 0) and out; with beta 0 only out."""
    import gemmgen
    A, B = operand(M, K, "row", 1, pad), operand(K, N, "col", 2, pad)
    C = operand(M, N, "row", 3, pad)
    assert padded(precision, M, N, K, (K + pad, K + pad, N + pad), beta=beta != 0.0)
    before = C.detach().clone()
    out = gemmgen.matmul(A, B, C, alpha=1.5, beta=beta, precision=precision)
    torch.cuda.synchronize()
    assert out is C
    check(C, A, B, before, 1.5, beta, precision, f"{precision} {M}x{N}x{K} ld+{pad}")
    if pad:  # the NaN past each row of C stays NaN
        assert bool(torch.isnan(C._base[:, N:]).all()), "wrote past C's rows"


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_strided_batch_with_odd_rows_runs_padded(precision):
    import gemmgen
    batch, M, N, K = 4, 2047, 2047, 2047
    A = operand(M + 1, K, "row", 4, 0, batch)[:, :M]   # a row between matrices: no folding into one GEMM
    B = operand(K, N, "col", 5, 0, batch)
    assert padded(precision, M, N, K, (K, K, N), batch=batch, strides=((M + 1) * K, N * K, M * N))
    out = gemmgen.matmul(A, B, precision=precision)
    torch.cuda.synchronize()
    for i in (0, batch - 1):
        check(out[i], A[i], B[i], None, 1.0, 0.0, precision, f"batch {i}")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_cupy_arrays_run_padded_too(precision):
    cp = pytest.importorskip("cupy")
    import gemmgen
    M = N = K = 2047
    A, B = operand(M, K, "row", 6), operand(K, N, "col", 7)
    a, b = cp.from_dlpack(A), cp.from_dlpack(B)
    out = gemmgen.matmul(a, b, precision=precision)
    cp.cuda.runtime.deviceSynchronize()
    check(torch.from_dlpack(out), A, B, None, 1.0, 0.0, precision, "CuPy")
    assert gemmgen.release_workspace() >= 1  # the pool that call took its workspace from, trimmed
    again = gemmgen.matmul(a, b, precision=precision)
    cp.cuda.runtime.deviceSynchronize()
    assert bool(cp.allclose(again, out, rtol=1e-5, atol=1e-5))


def test_tf32_padding_rounds_to_nearest_so_its_error_is_cublas_tf32s():
    """Issue 28's error must-hold where the tf32 library pads: at most 1.1x cuBLAS TF32's (the
    truncating TMA members alone are about 2.6x)."""
    if "tf32" not in PRECISIONS:
        pytest.skip("no tf32 library")
    import gemmgen
    for M, N, K in [(2047, 2047, 2047), (3001, 2999, 1531)]:
        A, B = operand(M, K, "row", 8), operand(K, N, "col", 9)
        assert padded("tf32", M, N, K, (K, K, N))
        reference = A.double() @ B.double()
        ours = relative_error(gemmgen.matmul(A, B, precision="tf32"), reference)
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            cublas = relative_error(A @ B, reference)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
        print(f"tf32 {M}x{N}x{K} padded: error {ours:.3e}, cuBLAS TF32 {cublas:.3e}")
        assert ours <= 1.1 * cublas, (ours, cublas)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_padded_key_captured_in_a_cuda_graph_runs_unpadded_and_replays_right(precision):
    import gemmgen
    M = N = K = 2047
    A, B = operand(M, K, "row", 10), operand(K, N, "col", 11)
    out = torch.empty(M, N, device="cuda")
    gemmgen.matmul(A, B, out, precision=precision)  # warm: compiled, resolved outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemmgen.matmul(A, B, out, precision=precision)
    for seed in (1, 2):
        with torch.no_grad():
            A.copy_(operand(M, K, "row", 20 + seed))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out, A, B, None, 1.0, 0.0, precision, f"replay {seed}")
