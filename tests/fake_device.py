"""A CPU stand-in for the GPU side of check and bench, faithful down to raw addresses.

- `cupy` becomes numpy, with arrays whose `.data.ptr` is their host address;
- cuBLAS's gemmEx computes column-major on such addresses, as cuBLAS does, and records the compute
  type it was asked for (so a test can see which baseline ran);
- `ReferenceKernel.launch` computes the gemmgen C ABI on such addresses in the plan's layouts.

Both round their inputs to TF32 where their math asks for it, so accuracy figures come out as on a
GPU: about 1e-7 relative error in FP32, about 1e-4 with TF32 inputs. Timings are faked: each timed
callable runs once and the kernel takes 2 ms, cuBLAS 1 ms.
"""

from __future__ import annotations

import ctypes
import sys
import types
from types import SimpleNamespace

import numpy as np

import gemmgen.gpu.baseline
import gemmgen.gpu.bench
import gemmgen.gpu.runtime
import gemmgen.gpu.verify
from gemmgen.gpu.bench import Timing
from gemmgen.gpu.runtime import DeviceInfo

CUBLAS_COMPUTE_32F = 68            # cublasComputeType_t (cublas_api.h)
CUBLAS_COMPUTE_32F_FAST_TF32 = 77
KERNEL_MS, CUBLAS_MS = 2.0, 1.0
INFO = DeviceInfo("Fake GPU", 0, (9, 0), 132, 1980000, "13.0", 50 << 20, 2619000, 5120)


class DeviceArray(np.ndarray):
    """A numpy array in CuPy's clothes: `.data.ptr` is its address, `.get()` a plain copy."""

    @property
    def data(self):
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])

    def get(self):
        return np.array(self)


def _device(array) -> DeviceArray:
    return np.asarray(array).view(DeviceArray)


class _Generator:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def uniform(self, low, high, size, dtype=np.float64):
        return _device(self.rng.uniform(low, high, size).astype(dtype))


def _making_device_arrays(make):
    return lambda *args, **kwargs: _device(make(*args, **kwargs))


def fake_cupy() -> types.ModuleType:
    """numpy under CuPy's name, making the arrays that stand for device memory DeviceArrays."""
    module = types.ModuleType("cupy")
    module.__getattr__ = lambda name: getattr(np, name)
    for name in ("full", "zeros", "empty", "asarray"):
        setattr(module, name, _making_device_arrays(getattr(np, name)))
    module.random = SimpleNamespace(default_rng=_Generator)
    module.cuda = SimpleNamespace(device=SimpleNamespace(get_cublas_handle=lambda: 0xC0B1A5))
    return module


def matrix_at(address: int, rows: int, cols: int, row_stride: int, col_stride: int) -> np.ndarray:
    """A writable float32 view of rows x cols floats at a host address (strides in elements)."""
    if rows == 0 or cols == 0:
        return np.zeros((rows, cols), np.float32)
    extent = (rows - 1) * row_stride + (cols - 1) * col_stride + 1
    base = np.ctypeslib.as_array((ctypes.c_float * extent).from_address(address))
    return np.lib.stride_tricks.as_strided(base, (rows, cols), (4 * row_stride, 4 * col_stride))


def to_tf32(values) -> np.ndarray:
    """Round float32 values to TF32 (10 stored mantissa bits), to nearest, as tensor cores take them."""
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)


def _gemm(alpha, a, b, beta, c, tf32: bool) -> None:
    """c = alpha a@b + beta c in float32 (c is not read when beta is 0, like BLAS and gemmgen)."""
    if tf32:
        a, b = to_tf32(a), to_tf32(b)
    result = np.float32(alpha) * (np.asarray(a, np.float32) @ np.asarray(b, np.float32))
    if beta != 0.0:
        result += np.float32(beta) * c
    c[...] = result


class FakeCublas:
    """cupy_backends.cuda.libs.cublas: the constants gemmgen uses and a column-major gemmEx."""

    CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
    CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32 = CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32
    CUBLAS_GEMM_DEFAULT = -1

    def __init__(self):
        self.compute_types: list[int] = []

    def gemmEx(self, handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb,
               beta, C, Ctype, ldc, computeType, algo):
        assert (Atype, Btype, Ctype) == (0, 0, 0), "CUDA_R_32F for A, B and C"
        assert computeType in (CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32)
        # cuBLAS's argument rules: op(A) is m x k, op(B) k x n, C m x n, all column-major.
        assert lda >= max(1, m if transa == self.CUBLAS_OP_N else k), "lda too small for cuBLAS"
        assert ldb >= max(1, k if transb == self.CUBLAS_OP_N else n), "ldb too small for cuBLAS"
        assert ldc >= max(1, m), "ldc too small for cuBLAS"
        self.compute_types.append(computeType)
        a = matrix_at(A, m, k, 1, lda) if transa == self.CUBLAS_OP_N else matrix_at(A, m, k, lda, 1)
        b = matrix_at(B, k, n, 1, ldb) if transb == self.CUBLAS_OP_N else matrix_at(B, k, n, ldb, 1)
        alpha_value = ctypes.c_float.from_address(alpha).value
        beta_value = ctypes.c_float.from_address(beta).value
        _gemm(alpha_value, a, b, beta_value, matrix_at(C, m, n, 1, ldc),
              computeType == CUBLAS_COMPUTE_32F_FAST_TF32)

    def gemmStridedBatchedEx(self, handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
                             strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo):
        """gemmEx on each of batchCount matrices, the operands' strides (in elements) apart."""
        for i in range(batchCount):
            self.gemmEx(handle, transa, transb, m, n, k, alpha, A + 4 * i * strideA, Atype, lda,
                        B + 4 * i * strideB, Btype, ldb, beta, C + 4 * i * strideC, Ctype, ldc, computeType, algo)


class ReferenceKernel:
    """gemmgen.gpu.runtime.Kernel whose launch computes the C ABI on the CPU, in the plan's layouts;
    it rounds its inputs to TF32 when its plan says math tf32 (or when told to)."""

    def __init__(self, plan, *args, tf32_inputs: bool | None = None, **kwargs):
        self.plan, self.name = plan, plan.launcher_name
        self.layouts = {"A": plan.spec["layout.A"], "B": plan.spec["layout.B"], "C": plan.c_layout}
        self.tf32_inputs = plan.spec["math"] == "tf32" if tf32_inputs is None else tf32_inputs

    def close(self) -> None:
        """Nothing loaded, nothing to unload."""

    def launch(self, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, smallest=None, stream=None, batch=1,
               strides=(0, 0, 0)):
        def view(address, rows, cols, ld, name):
            if self.plan.spec[f"layout.{name}"] == "row":
                return matrix_at(address, rows, cols, ld, 1)
            return matrix_at(address, rows, cols, 1, ld)
        for i in range(batch):  # the batched entry point's: matrices `strides` floats apart
            sa, sb, sc = (4 * i * s for s in strides)
            _gemm(alpha, view(A + sa, M, K, lda, "A"), view(B + sb, K, N, ldb, "B"), beta,
                  view(C + sc, M, N, ldc, "C"), self.tf32_inputs)


def fake_time_gpu(run, *, flush=None, **options) -> Timing:
    """Runs once; the first call of a bench is the kernel's, the second cuBLAS's."""
    run()
    fake_time_gpu.calls += 1
    ms = KERNEL_MS if fake_time_gpu.calls % 2 else CUBLAS_MS
    return Timing(ms, ms, ms, 1)


def fake_time_alternating(runs, *, flush=None, **options) -> list[Timing]:
    """Each run once, in turn: the kernel's first, cuBLAS's second."""
    return [fake_time_gpu(run) for run in runs]


def install(monkeypatch) -> SimpleNamespace:
    """Fake the GPU for gemmgen.gpu.verify, gemmgen.gpu.bench and the CLI; returns the fake cuBLAS."""
    import gemmgen.cli.common
    cublas = FakeCublas()
    fake_time_gpu.calls = 0
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy())
    monkeypatch.setattr(gemmgen.gpu.baseline, "_cublas", lambda: cublas)
    monkeypatch.setattr(gemmgen.gpu.bench, "time_gpu", fake_time_gpu)
    monkeypatch.setattr(gemmgen.gpu.bench, "time_alternating", fake_time_alternating)
    monkeypatch.setattr(gemmgen.gpu.bench, "L2Flusher", lambda info: None)
    monkeypatch.setattr(gemmgen.gpu.verify, "synchronize", lambda: None)
    monkeypatch.setattr(gemmgen.gpu.runtime, "Kernel", ReferenceKernel)
    monkeypatch.setattr(gemmgen.gpu.runtime, "device_info", lambda ordinal=0: INFO)
    monkeypatch.setattr(gemmgen.cli.common, "require_gpu", lambda: None)
    return SimpleNamespace(cublas=cublas)

