"""What the sm_90a GPU tests (test_gpu_schedule.py, test_gpu_staged.py, ...) share: the skip without
an sm_90 GPU and CuPy, a module's kernels built once each and closed at the end, and a built
library's strided-batched entry point."""

from __future__ import annotations

import ctypes

import pytest

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
