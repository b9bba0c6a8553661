"""What the sm_90a GPU tests (test_gpu_schedule.py, test_gpu_staged.py, ...) share: the skip without
an sm_90 GPU and CuPy, a module's kernels built once each and closed at the end, a built library's
strided-batched entry point, and operands in any layout checked against float64."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from gemmgen.gpu import verify
from gemmgen.plan import make_plan


def require_sm90(why: str) -> None:
    """Skip the module unless CuPy and an sm_90 GPU are here; `why` says what needs sm_90a."""
    pytest.importorskip("cupy")
    from gemmgen.gpu.runtime import device_count, device_info
    if device_count() == 0:
        pytest.skip("no CUDA GPU found")
    if device_info().compute_capability != (9, 0):
        pytest.skip(why)


def kernel_cache(specs: dict):
    """Yield get(name): the Kernel of specs[name], built on first use; all closed afterwards."""
    from gemmgen.gpu.runtime import Kernel
    built = {}

    def get(name):
        if name not in built:
            built[name] = Kernel(make_plan(specs[name]))
        return built[name]

    yield get
    for kernel in built.values():
        kernel.close()


def batched_entry(library: ctypes.CDLL, name: str):
    """gemmgen_<name>_batched of an nvcc-built library, as ctypes calls it: (M, N, K, alpha, A, lda,
    B, ldb, beta, C, ldc, batch, strideA, strideB, strideC, stream) -> cudaError_t."""
    batched = getattr(library, f"gemmgen_{name}_batched")
    batched.restype = ctypes.c_int
    batched.argtypes = ([ctypes.c_int] * 3 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                              ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
                                              ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong,
                                              ctypes.c_longlong, ctypes.c_void_p])
    return batched


def packed_batches_over_one_b(cp, batched, layout_a: str, layout_b: str, M: int, N: int, K: int, batch: int,
                              seed: int):
    """C_i = A_i B + C_i through a batched entry point, the A_i packed (M x K apart), one B for all
    (stride 0), each in its layout: (the C_i as computed, the A_i, B, the C_i before)."""
    rng = np.random.default_rng(seed)
    As = [rng.uniform(-1, 1, (M, K)).astype(np.float32) for _ in range(batch)]
    B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
    Cs = [rng.uniform(-1, 1, (M, N)).astype(np.float32) for _ in range(batch)]
    a = cp.asarray(np.stack([x if layout_a == "row" else np.ascontiguousarray(x.T) for x in As]))
    b = cp.asarray(B if layout_b == "row" else np.ascontiguousarray(B.T))
    c = cp.asarray(np.stack(Cs))
    lda = K if layout_a == "row" else M
    ldb = N if layout_b == "row" else K
    status = batched(M, N, K, 1.0, a.data.ptr, lda, b.data.ptr, ldb, 1.0, c.data.ptr, N, batch, M * K, 0, M * N, None)
    assert status == 0
    cp.cuda.runtime.deviceSynchronize()
    return c.get(), As, B, Cs


def inputs(M: int, N: int, K: int, seed: int):
    """A (M x K), B (K x N) and C (M x N), uniform in [-1, 1]."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (M, K)).astype(np.float32), rng.uniform(-1, 1, (K, N)).astype(np.float32),
            rng.uniform(-1, 1, (M, N)).astype(np.float32))


def operand(cp, x: np.ndarray, layout: str, pad: int, aligned: bool = True, offset: int = 0):
    """x in `layout`, leading dimension its contiguous extent (rounded up to 4 floats if `aligned`)
    + pad, `offset` floats into a NaN-filled device buffer: (buffer, pointer, ld)."""
    rows, cols = x.shape
    lines, length = (rows, cols) if layout == "row" else (cols, rows)
    ld = (-(-length // 4) * 4 if aligned else length) + pad
    host = np.full(lines * ld + offset, np.nan, np.float32)
    host[offset:].reshape(lines, ld)[:, :length] = x if layout == "row" else x.T
    buffer = cp.asarray(host)
    return buffer, buffer.data.ptr + 4 * offset, ld


def check(out: np.ndarray, A, B, C, alpha, beta, what: str, math: str):
    """Every element of alpha A B + beta C within `math`'s tolerance (3xtf32: FP32's) of float64;
    returns the relative (Frobenius) error."""
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    reference = alpha * (A64 @ B64) + beta * C
    scale = abs(alpha) * (np.abs(A64) @ np.abs(B64)) + abs(beta) * np.abs(C)
    bad = ~(np.abs(out - reference) <= verify.tolerance(scale, A.shape[1], math))
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} elements wrong"
    return np.linalg.norm(out - reference) / np.linalg.norm(reference)
