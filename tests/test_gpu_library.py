"""GPU tests of the library side: split K on the wgmma paths, gemmgen.matmul on CuPy and PyTorch
against float64 in every layout, torch.ops.gemmgen.matmul under torch.compile, and a shipped
library's .cu built by nvcc and called through its C ABI (results, strided batches, bad arguments,
host cost of choosing a member).

Run with `pytest -m gpu`; skipped without a GPU and CuPy, and the shipped-library tests where no
library has been tuned yet (generated/<precision>.json missing).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gemmgen.gpu import verify
from gemmgen.plan import make_plan
from gemmgen.language.load import parse
from test_library_batched import MOVED_BY_THE_BATCH

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "generated"
LIBRARIES = [p for p in ("fp32", "tf32") if (GENERATED / f"{p}.json").is_file()]
MATH = {"fp32": "3xtf32", "tf32": "tf32"}
CUDA_ERROR_INVALID_VALUE = 1


@pytest.fixture(scope="module", autouse=True)
def gpu():
    pytest.importorskip("cupy")
    from gemmgen.gpu.runtime import device_count
    if device_count() == 0:
        pytest.skip("no CUDA GPU found")


@pytest.fixture(scope="module")
def cp(gpu):
    import cupy
    return cupy


def _reference(A, B, C, alpha, beta, math):
    A64, B64 = np.asarray(A, np.float64), np.asarray(B, np.float64)
    reference = alpha * (A64 @ B64)
    scale = abs(alpha) * (np.abs(A64) @ np.abs(B64))
    if beta:
        reference += beta * np.asarray(C, np.float64)
        scale += abs(beta) * np.abs(np.asarray(C, np.float64))
    return reference, verify.tolerance(scale, A64.shape[1], math)


def _assert_close(out, A, B, C, alpha, beta, math, what):
    reference, tolerance = _reference(A, B, C, alpha, beta, math)
    out = np.asarray(out, np.float64)
    bad = ~(np.abs(out - reference) <= tolerance)
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} elements wrong"


def _inputs(M, N, K, seed=5):
    rng = np.random.default_rng(seed + M * 3 + N * 5 + K)
    return tuple(rng.uniform(-1, 1, s).astype(np.float32) for s in ((M, K), (K, N), (M, N)))


# --- split K on the wgmma paths --------------------------------------------------------------------

SPLIT = """kernel s {{
  target sm_90a
  layout A {a}, B {b}, C row
  block {bm} x 64 x 32
  math {math}
  stages 4 {fill}
  split {split}
}}
"""


@pytest.mark.parametrize("fill,a,b", [("tma", "row", "col"), ("async", "row", "col"), ("async", "col", "row"),
                                      ("async", "row", "row"), ("async", "col", "col")])
@pytest.mark.parametrize("math", ["3xtf32", "tf32"])
def test_split_k_wgmma_passes_the_quick_cases(fill, a, b, math):
    from gemmgen.gpu.runtime import Kernel
    (spec,) = parse(SPLIT.format(a=a, b=b, bm=64 if fill == "async" else 128, math=math, fill=fill, split=8))
    kernel = Kernel(make_plan(spec))
    cases = verify.QUICK_CASES + (verify.Case(64, 64, 20000, beta=0.5), verify.Case(130, 70, 9000, pad=1))
    report = verify.check(kernel, cases, seed=11)
    assert report.ok, "\n".join(f"{r.case}: {r.message}" for r in report.failures)


# --- gemmgen.matmul ------------------------------------------------------------------------------

@pytest.mark.skipif(not LIBRARIES, reason="no shipped library tuned yet (generated/fp32.json)")
@pytest.mark.parametrize("precision", LIBRARIES)
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (127, 4099, 1023), (256, 256, 32768), (1000, 1000, 1000),
                                   (4096, 4096, 4096), (3, 5000, 700)])
def test_matmul_on_cupy_matches_float64(precision, M, N, K, cp):
    import gemmgen
    A, B, C = _inputs(M, N, K)
    out = gemmgen.matmul(cp.asarray(A), cp.asarray(B), precision=precision)
    _assert_close(out.get(), A, B, C, 1.0, 0.0, MATH[precision], f"{precision} {M}x{N}x{K}")


@pytest.mark.skipif(not LIBRARIES, reason="no shipped library tuned yet (generated/fp32.json)")
@pytest.mark.parametrize("precision", LIBRARIES)
@pytest.mark.parametrize("M,K", [(4096, 4096), (11008, 4096), (300, 131), (17, 1)])
def test_a_matrix_times_a_column_vector_runs_as_one_row_and_matches_float64(precision, M, K, cp):
    """A x with x (K x 1): the library computes C^T = x^T A^T (one row, layouts.route); into a new
    output, into one with beta, and into a column of a wider C (read row-major only: not swapped)."""
    import gemmgen
    from gemmgen.library.dispatch import available_classes
    from gemmgen.library.layouts import Operand, route
    A, x, C = _inputs(M, 1, K, seed=11)
    assert route(Operand("A", M, K, (K, 1)), Operand("B", K, 1, (1, 1)), Operand("out", M, 1, (1, 1)),
                 available_classes(precision), precision).swap
    out = gemmgen.matmul(cp.asarray(A), cp.asarray(x), precision=precision)
    _assert_close(out.get(), A, x, C, 1.0, 0.0, MATH[precision], f"{precision} {M}x1x{K}")
    out = cp.asarray(C)
    gemmgen.matmul(cp.asarray(A), cp.asarray(x), out, alpha=0.5, beta=-2.0, precision=precision)
    _assert_close(out.get(), A, x, C, 0.5, -2.0, MATH[precision], f"{precision} {M}x1x{K}, beta")
    wide = cp.full((M, 3), cp.nan, dtype=cp.float32)
    gemmgen.matmul(cp.asarray(A), cp.asarray(x), wide[:, 1:2], precision=precision)
    _assert_close(wide[:, 1:2].get(), A, x, C, 1.0, 0.0, MATH[precision], f"{precision} {M}x1x{K}, a column")
    assert bool(cp.isnan(wide[:, 0]).all()) and bool(cp.isnan(wide[:, 2]).all())  # its neighbours untouched
    vector = gemmgen.matmul(cp.asarray(A), cp.asarray(x[:, 0]), precision=precision)  # 1-D x: a 1-D result
    assert vector.shape == (M,)
    _assert_close(vector.get()[:, None], A, x, C, 1.0, 0.0, MATH[precision], f"{precision} {M}x1x{K}, 1-D")


@pytest.mark.skipif(not LIBRARIES, reason="no shipped library tuned yet")
@pytest.mark.parametrize("order_a,order_b,order_c", [("C", "C", "C"), ("F", "F", "F"), ("C", "F", "F"),
                                                     ("F", "C", "C")])
def test_matmul_takes_every_layout_and_writes_out_in_place(order_a, order_b, order_c, cp):
    import gemmgen
    M, N, K = 301, 257, 1029
    A, B, C = _inputs(M, N, K, seed=9)
    out = cp.array(C, order=order_c)
    result = gemmgen.matmul(cp.array(A, order=order_a), cp.array(B, order=order_b), out, alpha=0.5, beta=-2.0)
    assert result is out
    _assert_close(out.get(), A, B, C, 0.5, -2.0, "3xtf32", f"A {order_a} B {order_b} C {order_c}")


@pytest.mark.skipif(not LIBRARIES, reason="no shipped library tuned yet")
def test_matmul_on_torch_tensors_on_a_torch_stream(cp):
    torch = pytest.importorskip("torch")
    import gemmgen
    M, N, K = 777, 1500, 640
    A, B, C = _inputs(M, N, K, seed=3)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        a, b = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda()
        out = gemmgen.matmul(a, b.t().contiguous().t())  # B column-major
    stream.synchronize()
    assert isinstance(out, torch.Tensor) and out.device == a.device
    _assert_close(out.cpu().numpy(), A, B, C, 1.0, 0.0, "3xtf32", "torch")


@pytest.mark.skipif(not LIBRARIES, reason="no shipped library tuned yet")
def test_matmul_refuses_what_it_cannot_multiply(cp):
    import gemmgen
    from gemmgen.gpu.runtime import ShapeError
    with pytest.raises(ShapeError, match="inner sizes differ"):
        gemmgen.matmul(cp.ones((4, 5), cp.float32), cp.ones((6, 7), cp.float32))
    with pytest.raises(ShapeError, match="float32"):
        gemmgen.matmul(cp.ones((4, 5), cp.float64), cp.ones((5, 7), cp.float64))
    with pytest.raises(ValueError, match="precision"):
        gemmgen.matmul(cp.ones((4, 5), cp.float32), cp.ones((5, 7), cp.float32), precision="bf16")
    with pytest.raises(ValueError, match="beta"):
        gemmgen.matmul(cp.ones((4, 5), cp.float32), cp.ones((5, 7), cp.float32), beta=1.0)


# --- torch.ops.gemmgen.matmul --------------------------------------------------------------------

@pytest.mark.skipif(not LIBRARIES, reason="no shipped library tuned yet")
def test_torch_operator_under_torch_compile_without_graph_breaks(cp):
    torch = pytest.importorskip("torch")
    import gemmgen.torch_op  # noqa: F401 - registers torch.ops.gemmgen.matmul

    def layer(x, w, bias):
        return torch.relu(torch.ops.gemmgen.matmul(x, w.t()) + bias)

    compiled = torch.compile(layer, fullgraph=True)  # a graph break would raise here
    x = torch.randn(300, 512, device="cuda")
    w = torch.randn(256, 512, device="cuda")
    bias = torch.randn(256, device="cuda")
    got = compiled(x, w, bias)
    expected = torch.relu(x.double() @ w.double().t() + bias.double())
    error = (got.double() - expected).norm() / expected.norm()
    assert error < 1e-6, error
    # the fake implementation: shapes without running anything
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake = torch.ops.gemmgen.matmul(torch.empty(7, 3, device="cuda"), torch.empty(3, 11, device="cuda"))
    assert tuple(fake.shape) == (7, 11)


# --- the C ABI of a shipped library ---------------------------------------------------------------

HARNESS = r"""
#include <chrono>
#include <stdio.h>
#include "{library}.cu"

// Host time of one call of the library's entry point, and of its chosen member's own launcher,
// on the same arguments (the kernels run on a stream nobody waits for; both launch the same one).
extern "C" double host_us_per_call(int entry, int M, int N, int K, const float* A, const float* B, float* C,
                                   cudaStream_t stream, int calls) {{
    using namespace gemmgen_{library}_choice;
    Device caps;
    device_caps(caps);
    const int pick = choose(M, N, K, true, K % 8 != 0, caps.sm_count, false, caps.sm90a, 1);  // lda = ldb = K
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {{
        if (entry) gemmgen_{library}(M, N, K, 1.0f, A, K, B, K, 0.0f, C, N, stream);
        else switch (pick) {{
{cases}
        }}
    }}
    auto stop = std::chrono::steady_clock::now();
    cudaStreamSynchronize(stream);
    return std::chrono::duration<double, std::micro>(stop - start).count() / calls;
}}
"""


@pytest.fixture(scope="module")
def library_abi(tmp_path_factory, gpu):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    from test_gpu import _cuda_library_dirs
    built = {}

    def build(precision: str):
        if precision in built:
            return built[precision]
        manifest = json.loads((GENERATED / f"{precision}.json").read_text())
        folder = tmp_path_factory.mktemp(f"lib-{precision}")
        shutil.copy(GENERATED / f"{precision}.cu", folder / f"{precision}.cu")
        cases = "\n".join(f"        case {i}: gemmgen_{m['name']}(M, N, K, 1.0f, A, K, B, K, 0.0f, C, N, stream); break;"
                          for i, m in enumerate(manifest["members"]))
        (folder / "harness.cu").write_text(HARNESS.format(library=precision, cases=cases))
        so = folder / f"lib{precision}.so"
        command = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-std=c++17", "-O2", "--threads", "2",
                   "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_80,code=sm_80",
                   "-o", str(so), str(folder / "harness.cu"), "-lcudart"]
        for path in _cuda_library_dirs(nvcc):
            command += ["-Xlinker", f"-rpath={path}"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"nvcc failed:\n{done.stderr[-4000:]}"
        library = ctypes.CDLL(str(so))
        entry = getattr(library, f"gemmgen_{precision}")
        entry.restype = ctypes.c_int
        entry.argtypes = ([ctypes.c_int] * 3 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                                ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
                                                ctypes.c_void_p])
        batched = getattr(library, f"gemmgen_{precision}_batched")
        batched.restype = ctypes.c_int
        batched.argtypes = list(entry.argtypes[:-1]) + [ctypes.c_int] + [ctypes.c_longlong] * 3 + [ctypes.c_void_p]
        entry.release_workspace = getattr(library, f"gemmgen_{precision}_release_workspace")
        entry.release_workspace.restype = ctypes.c_int
        entry.release_workspace.argtypes = []
        timer = library.host_us_per_call
        timer.restype = ctypes.c_double
        timer.argtypes = [ctypes.c_int] * 4 + [ctypes.c_void_p] * 4 + [ctypes.c_int]
        built[precision] = (entry, timer, manifest, batched)
        return built[precision]

    return build


def _place(cp, values, layout, pad=0):
    rows, cols = values.shape
    lines, length = (rows, cols) if layout == "row" else (cols, rows)
    ld = max(1, length) + pad
    buffer = cp.full(max(1, lines) * ld + 16, cp.nan, dtype=cp.float32)
    view = buffer[: lines * ld].reshape(lines, ld)[:, :length]
    view[...] = cp.asarray(values if layout == "row" else values.T)
    return buffer, ld


@pytest.mark.skipif(not LIBRARIES, reason="no shipped library tuned yet")
@pytest.mark.parametrize("precision", LIBRARIES)
@pytest.mark.parametrize("M,N,K,pad", [(1, 1, 1, 0), (127, 4099, 1023, 0), (300, 300, 40000, 0),
                                       (2047, 2047, 2047, 0), (1024, 1024, 1024, 3), (4096, 4096, 4096, 0),
                                       (4096, 4096, 4096, 1), (8192, 128, 8192, 0), (5, 7000, 3000, 1)])
def test_library_c_abi_matches_float64(precision, M, N, K, pad, cp, library_abi):
    entry, _, manifest, _ = library_abi(precision)
    A, B, C = _inputs(M, N, K, seed=13)
    a, lda = _place(cp, A, "row", pad)
    b, ldb = _place(cp, B, "col", pad)
    c, ldc = _place(cp, C, "row", pad)
    status = entry(M, N, K, 1.5, a.data.ptr, lda, b.data.ptr, ldb, 0.25, c.data.ptr, ldc, None)
    cp.cuda.runtime.deviceSynchronize()
    assert status == 0
    out = c[: M * ldc].reshape(M, ldc)[:, :N].get()
    _assert_close(out, A, B, C, 1.5, 0.25, MATH[precision], f"gemmgen_{precision} {M}x{N}x{K} pad {pad}")
    assert bool(cp.isnan(c[M * ldc:]).all()), "wrote past C"


@pytest.mark.skipif("tf32" not in LIBRARIES, reason="no tf32 library tuned yet")
@pytest.mark.parametrize("M,N,K,pad", [(2047, 2047, 2047, 0), (4096, 4096, 4096, 1)])
def test_library_c_abi_pads_odd_calls_rounding_tf32_to_nearest(M, N, K, pad, cp, library_abi):
    """gemmgen_tf32 pads these unaligned calls (padding.py's decision, in C), and its copies round A
    and B to nearest TF32: the error is rounding's (about 2.6e-4 here), not truncation's (6.9e-4)."""
    entry, _, _, _ = library_abi("tf32")
    A, B, _ = _inputs(M, N, K, seed=17)
    a, lda = _place(cp, A, "row", pad)
    b, ldb = _place(cp, B, "col", pad)
    c, ldc = _place(cp, np.zeros((M, N), np.float32), "row", pad)
    assert entry(M, N, K, 1.0, a.data.ptr, lda, b.data.ptr, ldb, 0.0, c.data.ptr, ldc, None) == 0
    cp.cuda.runtime.deviceSynchronize()
    out = c[: M * ldc].reshape(M, ldc)[:, :N].get().astype(np.float64)
    reference = A.astype(np.float64) @ B.astype(np.float64)
    error = np.linalg.norm(out - reference) / np.linalg.norm(reference)
    print(f"gemmgen_tf32 {M}x{N}x{K} ld+{pad}: relative error {error:.3e}")
    assert error < 4e-4, error
    # the workspace the pool kept, given back; the next padded call takes it again
    assert entry.release_workspace() == 0
    assert entry(M, N, K, 1.0, a.data.ptr, lda, b.data.ptr, ldb, 0.0, c.data.ptr, ldc, None) == 0
    cp.cuda.runtime.deviceSynchronize()
    again = c[: M * ldc].reshape(M, ldc)[:, :N].get().astype(np.float64)
    assert np.allclose(again, out, rtol=1e-5, atol=1e-5)  # the same (a split member's sums may differ in the last bits)


def _cublas_error(A, B, reference, tf32: bool = True) -> float:
    """PyTorch's matmul of the same inputs (cuBLAS; with `tf32`, its TF32 mode, which rounds A and B
    to nearest TF32), its relative error against `reference`."""
    torch = pytest.importorskip("torch")
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        product = (torch.from_numpy(A).cuda() @ torch.from_numpy(B).cuda()).double().cpu().numpy()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return float(np.linalg.norm(product - reference) / np.linalg.norm(reference))


def _library_error(entry, cp, A, B) -> tuple[float, np.ndarray]:
    """The library's C ABI on A (row-major) and B (column-major), C = A @ B: its relative error
    against float64, and that float64 product."""
    M, K = A.shape
    N = B.shape[1]
    a, lda = _place(cp, A, "row", 0)
    b, ldb = _place(cp, B, "col", 0)
    c, ldc = _place(cp, np.zeros((M, N), np.float32), "row", 0)
    assert entry(M, N, K, 1.0, a.data.ptr, lda, b.data.ptr, ldb, 0.0, c.data.ptr, ldc, None) == 0
    cp.cuda.runtime.deviceSynchronize()
    reference = A.astype(np.float64) @ B.astype(np.float64)
    out = c[: M * ldc].reshape(M, ldc)[:, :N].get().astype(np.float64)
    return float(np.linalg.norm(out - reference) / np.linalg.norm(reference)), reference


@pytest.mark.skipif("tf32" not in LIBRARIES, reason="no tf32 library tuned yet")
@pytest.mark.parametrize("M,N,K", [(4096, 4096, 4096), (2048, 5632, 2048), (16, 4096, 4096), (128, 4096, 4096),
                                   (4096, 1, 4096), (300, 300, 40000), (5, 7000, 3000), (8192, 128, 8192),
                                   (1024, 1024, 65536), (127, 4099, 1023)])
def test_library_tf32_error_is_at_most_cublas_tf32s(M, N, K, cp, library_abi):
    """Issue 28: gemmgen_tf32's error against float64 at most 1.1x cuBLAS TF32's on the same inputs,
    in every regime (TMA rounds A and B to nearest TF32 as it copies them, as cuBLAS rounds; the
    register-fed, mma.sync and decode members round too, or multiply in FP32)."""
    entry, _, _, _ = library_abi("tf32")
    A, B, _ = _inputs(M, N, K, seed=29)
    error, reference = _library_error(entry, cp, A, B)
    cublas = _cublas_error(A, B, reference)
    print(f"gemmgen_tf32 {M}x{N}x{K}: relative error {error:.4e}, cuBLAS TF32's {cublas:.4e}")
    assert error <= 1.1 * cublas, (error, cublas)


@pytest.mark.skipif("fp32" not in LIBRARIES, reason="no fp32 library tuned yet")
@pytest.mark.parametrize("M,N,K", [(256, 256, 256), (512, 512, 512), (768, 768, 768), (2048, 2048, 128),
                                   (16384, 4096, 64), (8192, 8192, 256), (1531, 1531, 1531), (4096, 4096, 4096)])
def test_library_fp32_error_is_at_most_cublas_fp32s(M, N, K, cp, library_abi):
    """Issue 28: gemmgen_fp32's error against float64 at most cuBLAS FP32's on the same inputs, at
    short K too, where cuBLAS's sums are short: the 3xTF32 members add each K tile's small terms
    before its big ones (few of the tensor cores' adds cut toward zero at the product's full size),
    and round B's big part to nearest where K <= 128, or K <= 1024 in a small call (ROUND_B_*)."""
    entry, _, _, _ = library_abi("fp32")
    A, B, _ = _inputs(M, N, K, seed=31)
    error, reference = _library_error(entry, cp, A, B)
    cublas = _cublas_error(A, B, reference, tf32=False)
    print(f"gemmgen_fp32 {M}x{N}x{K}: relative error {error:.4e}, cuBLAS FP32's {cublas:.4e}")
    assert error <= cublas, (error, cublas)


@pytest.mark.skipif(not LIBRARIES, reason="no shipped library tuned yet")
@pytest.mark.parametrize("precision", LIBRARIES)
@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (4096, 1, 4096), (1, 14336, 4096), (1, 3001, 777)])
def test_library_matrix_vector_error_is_at_most_cublas(precision, M, N, K, cp, library_abi):
    """A matrix-vector product runs on the decode member in FP32, as cuBLAS runs it in both its
    modes: its error at most cuBLAS FP32's (fp32, issue 28) or 1.1x cuBLAS TF32's (tf32), on the same
    inputs; cuBLAS TF32's is FP32's there."""
    entry, _, _, _ = library_abi(precision)
    A, B, _ = _inputs(M, N, K, seed=37)
    error, reference = _library_error(entry, cp, A, B)
    tf32 = precision == "tf32"
    bound = (1.1 if tf32 else 1.0) * _cublas_error(A, B, reference, tf32)
    print(f"gemmgen_{precision} {M}x{N}x{K}: relative error {error:.4e}, bound {bound:.4e}")
    assert error <= bound, (error, bound)


@pytest.mark.skipif("tf32" not in LIBRARIES, reason="no tf32 library tuned yet")
def test_every_tf32_member_rounds_as_cublas_tf32(cp):
    """Each member of the tf32 library on its own, at a call its kind takes (1000 x 1536 x 2048; the
    decode member 8 rows), within 1.1x cuBLAS TF32's error on the same inputs: none truncates."""
    from gemmgen.library import dispatch
    runtime = dispatch.library("tf32", 0)
    calls = {}
    for M in (1000, 8):
        A, B, _ = _inputs(M, 1536, 2048, seed=31)
        reference = A.astype(np.float64) @ B.astype(np.float64)
        calls[M] = (cp.asarray(A), cp.asarray(np.ascontiguousarray(B.T)), reference,  # B column-major
                    _cublas_error(A, B, reference))
    N, K = 1536, 2048
    errors, bounds = {}, {}
    for index, member in enumerate(runtime.manifest.members):
        M = 8 if runtime.kernel_plan(index).path == "decode" else 1000
        a, bt, reference, cublas = calls[M]
        c = cp.zeros((M, N), np.float32)
        runtime.kernel(index).launch(M, N, K, 1.0, a.data.ptr, K, bt.data.ptr, K, 0.0, c.data.ptr, N)
        cp.cuda.runtime.deviceSynchronize()
        out = c.get().astype(np.float64)
        errors[member.name] = float(np.linalg.norm(out - reference) / np.linalg.norm(reference))
        bounds[member.name] = 1.1 * cublas
    print(", ".join(f"{n} {e:.4e} (bound {bounds[n]:.4e})" for n, e in errors.items()))
    assert all(errors[n] <= bounds[n] for n in errors), errors


@pytest.mark.skipif(not LIBRARIES, reason="no shipped library tuned yet")
@pytest.mark.parametrize("precision", LIBRARIES)
def test_library_c_abi_refuses_bad_arguments_and_writes_nothing(precision, cp, library_abi):
    entry, _, _, _ = library_abi(precision)
    a = cp.ones(64 * 64, cp.float32)
    c = cp.full(64 * 64, 7.0, cp.float32)
    for M, N, K, lda, ldb, ldc, A, C in [(-1, 8, 8, 8, 8, 8, a, c), (8, 8, 8, 7, 8, 8, a, c),
                                         (8, 8, 8, 8, 7, 8, a, c), (8, 8, 8, 8, 8, 7, a, c),
                                         (8, 8, 8, 8, 8, 8, None, c), (8, 8, 8, 8, 8, 8, a, None)]:
        status = entry(M, N, K, 1.0, A.data.ptr if A is not None else None, lda, a.data.ptr, ldb, 0.0,
                       C.data.ptr if C is not None else None, ldc, None)
        assert status == CUDA_ERROR_INVALID_VALUE, (M, N, K, lda, ldb, ldc)
    cp.cuda.runtime.deviceSynchronize()
    assert bool((c == 7.0).all()), "a refused call wrote into C"


@pytest.mark.skipif(not LIBRARIES, reason="no shipped library tuned yet")
@pytest.mark.parametrize("precision", LIBRARIES)
def test_library_entry_point_costs_at_most_3_us_over_its_member(precision, cp, library_abi):
    _, timer, _, _ = library_abi(precision)
    M = N = K = 512
    a, b, c = (cp.ones(M * K, cp.float32) for _ in range(3))
    stream = cp.cuda.Stream(non_blocking=True)
    args = (M, N, K, a.data.ptr, b.data.ptr, c.data.ptr, stream.ptr, 2000)
    timer(1, *args), timer(0, *args)  # warm: caps queried, modules loaded, tensor maps encoded once
    entry = min(timer(1, *args) for _ in range(5))
    member = min(timer(0, *args) for _ in range(5))
    print(f"gemmgen_{precision}: {entry:.2f} us per call, its member's launcher {member:.2f} us")
    if os.environ.get("OUT"):  # .ci/gpu keeps the numbers for BENCHMARKS.md
        with open(Path(os.environ["OUT"]) / "library_host_cost.txt", "a") as record:
            record.write(f"gemmgen_{precision} 512^3: entry point {entry:.2f} us per call, "
                         f"its member's launcher {member:.2f} us\n")
    assert entry - member <= 3.0, (entry, member)


# --- the shipped library's strided batches --------------------------------------------------------

# (batch, M, N, K, A's stride, B's stride, C's stride, padding of each leading dimension): None packed,
# 0 one matrix for every batch, a number that many floats past the end of each matrix
LIBRARY_BATCHES = {
    "packed, odd sizes": (5, 67, 45, 33, None, None, None, 0),
    "packed, TMA-ready": (4, 256, 192, 132, None, None, None, 0),
    "padded, unaligned": (3, 130, 70, 40, 37, 37, 37, 3),      # ld and strides past the width, odd
    "padded, aligned": (3, 128, 128, 128, 64, 64, 64, 4),
    "broadcast B": (6, 96, 128, 64, None, 0, None, 0),
    "broadcast A": (6, 96, 128, 64, 0, None, None, 0),
    "many small": (64, 32, 32, 32, None, None, None, 0),
    "one batch": (1, 300, 200, 100, None, None, None, 0),
    "no batch": (0, 64, 64, 64, None, None, None, 0),
}
# batches for which the model picks another member than for one of their matrices
LIBRARY_BATCHES.update({f"{M}x{N}x{K} x {batch}": (batch, M, N, K, None, None, None, 0)
                        for M, N, K, batch in MOVED_BY_THE_BATCH})


@pytest.mark.skipif(not LIBRARIES, reason="no shipped library tuned yet")
@pytest.mark.parametrize("precision", LIBRARIES)
@pytest.mark.parametrize("case", list(LIBRARY_BATCHES))
def test_library_batched_c_abi_matches_float64(precision, case, cp, library_abi):
    """gemmgen_<library>_batched: every batch of C = alpha A_b B_b + beta C_b against float64, the
    gaps between C's batches (and past them) untouched; batch 0 writes nothing."""
    from test_gpu_batched import Operand
    _, _, manifest, batched = library_abi(precision)
    batch, M, N, K, past_a, past_b, past_c, pad = LIBRARY_BATCHES[case]
    layouts = manifest["layout"]  # {"A": "row", "B": "col", "C": "row"}
    rng = np.random.default_rng(batch * 7 + M + N + K)
    count_a, count_b = (1 if past == 0 else max(batch, 1) for past in (past_a, past_b))
    As = [rng.uniform(-1, 1, (M, K)).astype(np.float32) for _ in range(count_a)]
    Bs = [rng.uniform(-1, 1, (K, N)).astype(np.float32) for _ in range(count_b)]
    Cs = [rng.uniform(-1, 1, (M, N)).astype(np.float32) for _ in range(max(batch, 1))]

    def operand(mats, layout, rows, cols, past):
        lines, length = (rows, cols) if layout == "row" else (cols, rows)
        extent = (lines - 1) * (length + pad) + length
        return Operand(cp, mats, layout, pad, extent + past if past else past)

    a = operand(As, layouts["A"], M, K, past_a)
    b = operand(Bs, layouts["B"], K, N, past_b)
    c = operand(Cs, layouts["C"], M, N, past_c)
    before = c.buffer.copy()
    alpha, beta = 1.5, -0.5
    status = batched(M, N, K, alpha, a.ptr, a.ld, b.ptr, b.ld, beta, c.ptr, c.ld, batch, a.stride, b.stride,
                     c.stride, None)
    cp.cuda.runtime.deviceSynchronize()
    assert status == 0, f"gemmgen_{precision}_batched {case}: status {status}"
    if batch == 0:
        assert cp.array_equal(before, c.buffer, equal_nan=True), "batch 0 wrote C"
        return
    outs = c.matrices(batch)
    for i in range(batch):
        A, B = As[i if count_a > 1 else 0], Bs[i if count_b > 1 else 0]
        _assert_close(outs[i], A, B, Cs[i], alpha, beta, MATH[precision],
                      f"gemmgen_{precision}_batched {case}: batch {i} of {batch}")
    assert np.isnan(c.outside(batch)).all(), f"gemmgen_{precision}_batched {case}: wrote outside C's batches"


@pytest.mark.skipif(not LIBRARIES, reason="no shipped library tuned yet")
@pytest.mark.parametrize("precision", LIBRARIES)
def test_library_batched_c_abi_refuses_bad_batches_and_writes_nothing(precision, cp, library_abi):
    _, _, _, batched = library_abi(precision)
    M = N = K = 64
    a = cp.ones(4 * M * K, cp.float32)
    c = cp.full(4 * M * N, 7.0, cp.float32)
    for bad in [(-1, 0, 0, M * N), (2, -4, 0, M * N), (2, 0, -1, M * N), (2, 0, 0, -M * N),
                (2, 0, 0, M * N - 1), (2, 0, 0, 0), (3, 1 << 62, 0, M * N)]:
        status = batched(M, N, K, 1.0, a.data.ptr, K, a.data.ptr, K, 0.0, c.data.ptr, N, *bad, None)
        assert status == CUDA_ERROR_INVALID_VALUE, bad
    assert batched(M, N, K, 1.0, None, K, None, K, 0.0, None, N, 0, 0, 0, 0, None) == 0  # batch 0: nothing
    cp.cuda.runtime.deviceSynchronize()
    assert bool((c == 7.0).all()), "a refused call wrote into C"
