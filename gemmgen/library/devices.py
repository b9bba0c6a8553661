"""gemmgen.matmul(..., devices=[0, 1, ...] or "all"): a library's call split over several GPUs by
gemmgen.multigpu's split_gemm, with one LibraryRuntime per device as the launcher.

dispatch.py routes the call as it would on one GPU (the library class that reads A and B as they
lie, A and B swapped for a column-major C, a copy where no built library reads an operand) and hands
the routed operands here. Each device's LibraryRuntime chooses its member for each block it
computes (a band of rows is another shape than the whole), from the manifest tuned for that GPU.
The inputs may start on any GPUs; C gathers on its own device (a C that matmul makes lies on A's).
The call waits for the devices holding its operands, and returns with C complete.

A split takes 2-D matrices. Batched calls run on one GPU (one strided-batched launch); splitting a
batch over devices (whole matrices per device, gemmgen.multigpu.parts.batch_parts) is not built,
and awaits a machine with several GPUs to measure it on, so 3-D operands are refused here with that
reason, not multiplied.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from ..gpu.runtime import ShapeError, require_cupy
from ..multigpu.split import Launcher, SplitResult, default_layer, resolve_devices, split_gemm

BATCHED = ("a batch of matrices runs on one GPU: leave `devices` out (a split over devices takes 2-D "
           "matrices; splitting batches over GPUs is not built)")


def layer():
    """The device layer the library's splits run on: the process's CuPy layer."""
    return default_layer()


def check_call(A: Any, B: Any, out: Any, devices, stream) -> list[int]:
    """The device list of a split call, after refusing what it cannot take: a stream (the call
    waits for its inputs and returns with C complete) and 3-D operands (batches run on one GPU)."""
    if stream is not None:
        raise ValueError("a call split over devices takes no stream: it waits for its inputs' devices and "
                         "returns with C complete")
    for x, name in ((A, "A"), (B, "B"), (out, "out")):
        shape = getattr(x, "shape", None)
        if shape is not None and len(shape) == 3:
            raise ShapeError(f"{name} has shape {tuple(shape)}: {BATCHED}")
    return resolve_devices(devices, layer().device_count())


def detached(x: Any) -> Any:
    """A torch tensor that requires grad, seen without it (the same memory): no autograd is recorded
    by gemmgen.matmul, and such a tensor hides its __cuda_array_interface__."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach()
    return x


def new_output(A: Any, rows: int, cols: int) -> Any:
    """A row-major float32 C on A's device, of A's kind (a torch tensor, else a CuPy array)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(A, torch.Tensor):
        return torch.empty((rows, cols), dtype=torch.float32, device=A.device)
    cupy = require_cupy("gemmgen.matmul making `out` for a non-PyTorch array")
    with cupy.cuda.Device(layer().device_of(A)):
        return cupy.empty((rows, cols), dtype=cupy.float32)


def split_call(runtime_on: Callable[[int], Launcher], A: Any, B: Any, C: Any, alpha: float, beta: float,
               devices: list[int], swap: bool) -> SplitResult:
    """C = alpha A B + beta C over `devices`, each device's share launched by runtime_on(device), a
    library in the routed class. `swap`: C is column-major, computed as C^T = B^T A^T, whose
    operands are the transposed views of B, A and C (no copy)."""
    if swap:
        A, B, C = B.T, A.T, C.T
    return split_gemm(runtime_on, A, B, C, alpha=alpha, beta=beta, devices=devices, layer=layer())
