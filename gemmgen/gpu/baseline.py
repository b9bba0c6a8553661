"""The baseline every kernel is measured against: cuBLAS's GEMM on raw device addresses, in the
kernel's input precision (FP32 beside simt and 3xtf32, TF32 beside tf32).

A lower module than verify and bench, which both call it (verify for accuracy, bench for time).
"""

from __future__ import annotations

import os

import numpy as np

# cublas_gemm names its compute type, so this only keeps other CuPy matmuls of the process (the
# tuner's baseline) in FP32: CuPy reads CUPY_TF32 once, at its first float32 matmul.
os.environ.setdefault("CUPY_TF32", "0")

BASELINES = {"simt": "cuBLAS FP32", "3xtf32": "cuBLAS FP32", "tf32": "cuBLAS TF32"}
CUDA_R_32F = 0  # cudaDataType_t of float (library_types.h), for A, B and C


def _cupy():
    import cupy
    return cupy


def _cublas():
    from cupy_backends.cuda.libs import cublas
    return cublas


def baseline_for(math: str) -> str:
    """The cuBLAS mode a kernel of this math mode is timed against: the same input precision."""
    if math not in BASELINES:
        raise ValueError(f"unknown math mode {math!r}: one of {', '.join(BASELINES)}")
    return BASELINES[math]


def cublas_gemm(M: int, N: int, K: int, alpha: float, A: int, lda: int, B: int, ldb: int,
                beta: float, C: int, ldc: int, layouts: dict[str, str], *, tf32: bool = False,
                batch: int = 1, strides: tuple[int, int, int] = (0, 0, 0)) -> None:
    """C = alpha A@B + beta C by cublasGemmEx on raw device addresses, the launcher's ABI, with
    `layouts` = {"A": "row" or "col", "B": ..., "C": ...}; with `batch` > 1 cublasGemmStridedBatchedEx
    over `batch` matrices `strides` floats apart (A's, B's, C's), as the batched entry point takes
    them. The compute type is named, CUBLAS_COMPUTE_32F or CUBLAS_COMPUTE_32F_FAST_TF32, so that
    neither CUPY_TF32 nor CuPy's cached choice can change what the baseline computes."""
    cp, cublas = _cupy(), _cublas()
    if M == 0 or N == 0 or batch == 0:
        return
    # cuBLAS is column-major. A column-major C is A@B as it stands; a row-major C, read
    # column-major, is C^T = B^T A^T: the operands swap places and M swaps with N. An operand
    # stored in C's order reads as the factor it must be (OP_N), one in the other order as its
    # transpose (OP_T).
    first, second = ((A, lda, "A"), (B, ldb, "B")) if layouts["C"] == "col" else ((B, ldb, "B"), (A, lda, "A"))
    m, n = (M, N) if layouts["C"] == "col" else (N, M)
    op = {name: cublas.CUBLAS_OP_N if layouts[name] == layouts["C"] else cublas.CUBLAS_OP_T
          for name in "AB"}
    compute = cublas.CUBLAS_COMPUTE_32F_FAST_TF32 if tf32 else cublas.CUBLAS_COMPUTE_32F
    scalars = np.array([alpha, beta], dtype=np.float32)  # host pointers: read before gemmEx returns
    if batch != 1:
        stride = dict(zip("ABC", strides))
        cublas.gemmStridedBatchedEx(cp.cuda.device.get_cublas_handle(), op[first[2]], op[second[2]], m, n, K,
                                    scalars.ctypes.data, first[0], CUDA_R_32F, first[1], stride[first[2]],
                                    second[0], CUDA_R_32F, second[1], stride[second[2]],
                                    scalars.ctypes.data + 4, C, CUDA_R_32F, ldc, stride["C"], batch, compute,
                                    cublas.CUBLAS_GEMM_DEFAULT)
        return
    cublas.gemmEx(cp.cuda.device.get_cublas_handle(), op[first[2]], op[second[2]], m, n, K,
                  scalars.ctypes.data, first[0], CUDA_R_32F, first[1],
                  second[0], CUDA_R_32F, second[1],
                  scalars.ctypes.data + 4, C, CUDA_R_32F, ldc, compute, cublas.CUBLAS_GEMM_DEFAULT)
