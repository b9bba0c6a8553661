"""gemmgen.matmul(..., devices=[0, 1, ...] or "all"): a library's call split over several GPUs by
gemmgen.multigpu's split_gemm, with one LibraryRuntime per device as the launcher.

dispatch.py routes the call as it would on one GPU (the library class that reads A and B as they
lie, A and B swapped for a column-major C, a copy where no built library reads an operand) and hands
the routed operands here. Each device's LibraryRuntime chooses its member for each block it
computes (a band of rows is another shape than the whole), from the manifest tuned for that GPU.
The inputs may start on any GPUs; C gathers on its own device (a C that matmul makes lies on A's).
The call waits for the devices holding its operands, and returns with C complete.

A batched call (3-D or more operands) is routed as on one GPU (one strided-batched launch, or one
GEMM of stacked rows where A's batches fold) and that launch split over the devices: whole matrices
per device (gemmgen.multigpu.batched; from each shape's third call, the GPU holding the inputs
keeps the batch where the others could not finish sooner than it alone), or, for a folded batch,
the one GEMM split as any other.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from ..gpu.runtime import require_cupy
from ..multigpu.batched import BatchResult, split_batched
from ..multigpu.parts import Region
from ..multigpu.split import Launcher, SplitResult, default_layer, resolve_devices, split_gemm


def layer():
    """The device layer the library's splits run on: the process's CuPy layer."""
    return default_layer()


def check_call(A: Any, B: Any, out: Any, devices, stream) -> list[int]:
    """The device list of a split call, after refusing a stream (the call waits for its inputs and
    returns with C complete)."""
    if stream is not None:
        raise ValueError("a call split over devices takes no stream: it waits for its inputs' devices and "
                         "returns with C complete")
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


def split_batched_call(runtime_on: Callable[[int], Launcher], arrays: tuple[Any, Any, Any],
                       pointers: tuple[int, int, int], way, shape: tuple[int, int, int], batch: int,
                       strides: tuple[int, int, int], alpha: float, beta: float,
                       devices: list[int]) -> SplitResult | BatchResult:
    """A routed batched launch (dispatch.py's: A, B and C, their first matrices' addresses and
    batch strides, `way`'s layouts, leading dimensions and swap) split over `devices`: by batch,
    or, for a batch of 1 (a folded batch), as one GEMM."""
    layouts = runtime_on(devices[0]).layouts
    lda, ldb, ldc = way.lds
    (pa, pb, pc), (sa, sb, sc) = pointers, strides
    da, db, dc = (layer().device_of(x) for x in arrays)
    M, N, K = shape
    if way.swap:  # C^T = B^T A^T: B's matrices are the launch's A, A's its B
        (pa, da, sa), (pb, db, sb), M, N = (pb, db, sb), (pa, da, sa), N, M
    a, b, c = (Region(da, pa, M, K, layouts["A"], lda), Region(db, pb, K, N, layouts["B"], ldb),
               Region(dc, pc, M, N, layouts["C"], ldc))
    if batch == 1:
        return split_gemm(runtime_on, a, b, c, alpha=alpha, beta=beta, devices=devices, layer=layer())
    return split_batched(runtime_on, a, b, c, batch=batch, strides=(sa, sb, sc), alpha=alpha, beta=beta,
                         devices=devices, layer=layer())
