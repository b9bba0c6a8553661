"""Libraries that multiply on the host, for routing tests: device arrays are host memory.

- HostArray: a numpy array behind __cuda_array_interface__, as CuPy shows a device array;
- LibraryOnHost: a library runtime of one operand class (A and B layouts, C row-major) whose
  launch and prepared launches compute the C ABI on host addresses in float64 and record each
  call's sizes and pointers.
"""

from __future__ import annotations

import numpy as np

from fake_device import matrix_at


class HostArray:
    """A float32 numpy array behind __cuda_array_interface__, as a device array would show it."""

    def __init__(self, values):
        self.values = values
        self.shape = values.shape
        self.ndim = values.ndim

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.values.shape, "typestr": self.values.dtype.str, "version": 3,
                "data": (self.values.__array_interface__["data"][0], False), "strides": self.values.strides}

    def __getitem__(self, index):
        return HostArray(self.values[index])

    def __setitem__(self, index, other):
        self.values[index] = other.values


class LibraryOnHost:
    """A library runtime of one operand class (C row-major) that multiplies on the host."""

    def __init__(self, klass):
        self.layouts = {"A": klass[0], "B": klass[1], "C": "row"}
        self.calls = []      # (M, N, K) of each call
        self.pointers = []   # (A, B, C) of each call
        self.strides = []    # A's, B's and C's batch strides of each call (floats)

    def launch(self, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream=None, batch=1, strides=(0, 0, 0)):
        def view(address, rows, cols, ld, layout):
            return matrix_at(address, rows, cols, ld, 1) if layout == "row" else matrix_at(address, rows, cols, 1, ld)
        for i in range(batch):  # strides in floats, as the batched entry point takes them
            a = view(A + 4 * i * strides[0], M, K, lda, self.layouts["A"])
            b = view(B + 4 * i * strides[1], K, N, ldb, self.layouts["B"])
            c = view(C + 4 * i * strides[2], M, N, ldc, "row")
            c[...] = alpha * (a.astype(np.float64) @ b) + (beta * c if beta else 0)
        self.calls.append((M, N, K) if batch == 1 else (batch, M, N, K))
        self.pointers.append((A, B, C))
        self.strides.append(strides)
        return 0

    def prepare(self, M, N, K, lda, ldb, ldc, align=(0, 0, 0), beta_used=False, batch=1, strides=(0, 0, 0)):
        def run(A, B, C, alpha, beta, stream):
            self.launch(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream, batch, strides)
        return run
