"""Choosing a library member per call and launching it from Python: gemmgen.matmul.

The shipped libraries (`fp32`, FP32-accurate; `tf32`) are manifests (manifest.py) tuned on one GPU,
each for one operand class (layouts.py): `fp32` takes A row-major and B column-major, `fp32_rr`,
`fp32_cc` and `fp32_cr` the other three (tf32 alike), and a column-major C is computed as the
row-major C^T = B^T A^T. For each call the member predicted fastest for its shape and alignment is
compiled with NVRTC (once: cubins are cached on disk) and launched on the caller's current stream.
On a GPU the library was not tuned for, its portable member, compiled for that GPU, serves every
call, and a warning says so once.

PyTorch tensors take the fast path: everything that decides a launch (shapes, strides, pointer
alignment, dtype, device, beta != 0, precision) is one dictionary key, resolved once into the
chosen member's prepared launch (launch.py) and whether A and B swap; a call then reads its
tensors' addresses, allocates the output and launches. Parameters and tensors that require grad
work (no autograd is recorded: see gemmgen.torch for the differentiable operator); no CuPy is
needed. CuPy arrays and anything with __cuda_array_interface__ or DLPack take the general path.

An operand with no unit stride, or whose class has no library built yet (generated/fp32_rr.json
...), is copied once per call into a layout a built library takes, and a warning says so, once.
"""

from __future__ import annotations

import sys
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..gpu.runtime import ShapeError, as_matrix, device_array, require_cupy, stream_handle
from ..gpu.transpose import transpose
from ..outputs import complete_pending
from . import devices as split_devices
from .batches import (BatchError, Batching, batch_stride, broadcast, dense_reason, folded_row_stride, plan_batches,
                      vector_views)
from .layouts import CLASSES, RELAID, Operand, Route, library_name, route
from .manifest import Manifest, ManifestError
from .runtime import LibraryRuntime

PRECISIONS = ("fp32", "tf32")
BASE = ("row", "col")


def _libraries_dir() -> Path:
    """generated/ of a source checkout, or the package's copy of the shipped manifests."""
    source_tree = Path(__file__).resolve().parents[2] / "generated"
    if source_tree.is_dir():
        return source_tree
    return Path(__file__).resolve().parents[1] / "libraries"  # the wheel's gemmgen.libraries


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")


def shipped_manifest(precision: str, klass: tuple[str, str] = BASE) -> Manifest:
    """The manifest of the shipped library of a precision and operand class (ManifestError, a
    ValueError, for a file that is none)."""
    _check_precision(precision)
    name = library_name(precision, klass)
    path = _libraries_dir() / f"{name}.json"
    try:
        complete_pending(path)  # a build of the library killed while renaming its files: finish it
        manifest = Manifest.read(path)
    except OSError as exc:
        how = (f"reinstall gemmgen, or tune one with gemmgen tune specs/{precision}.gemm" if klass == BASE else
               f"build a library {name} with layout A {klass[0]}, B {klass[1]}, C row (none ships yet)")
        raise FileNotFoundError(f"the {name} library ({path}) is missing: {exc.strerror}; {how}") from None
    expected = {"A": klass[0], "B": klass[1], "C": "row"}
    if manifest.layout != expected:
        raise ManifestError(f"{path}: library {manifest.library} has layout {manifest.layout}, "
                            f"not {expected} as {name} must")
    return manifest


@lru_cache(maxsize=None)
def available_classes(precision: str) -> frozenset:
    """The operand classes whose libraries of this precision are built (their manifests exist);
    the base class always counts (its absence is an error when it is loaded)."""
    return _shipped_classes(precision) | {BASE, *RELAID.get(precision, ())}


_runtimes: dict[tuple[str, int], LibraryRuntime] = {}


def library(precision: str = "fp32", device: int = 0, klass: tuple[str, ...] = BASE) -> LibraryRuntime:
    """The shipped library of this precision and operand class on a device (built once per process)."""
    key = (library_name(precision, klass), device)
    if key not in _runtimes:
        if klass in RELAID.get(precision, ()) and klass not in _shipped_classes(precision):
            _runtimes[key] = LibraryRuntime(shipped_manifest(precision), device, relaid=klass)
        else:
            _runtimes[key] = LibraryRuntime(shipped_manifest(precision, klass), device)
    return _runtimes[key]


def _shipped_classes(precision: str) -> frozenset:
    """The operand classes whose manifests of this precision exist."""
    folder = _libraries_dir()
    return frozenset(k for k in CLASSES if (folder / f"{library_name(precision, k)}.json").is_file())


_warned: set[str] = set()


def _warn_once(reasons: tuple[str, ...]) -> None:
    for reason in reasons:
        if reason not in _warned:
            _warned.add(reason)
            warnings.warn(f"gemmgen: {reason}", RuntimeWarning, stacklevel=4)


def matmul(A: Any, B: Any, out: Any = None, *, alpha: float = 1.0, beta: float = 0.0,
           precision: str = "fp32", stream: Any = None, devices: str | list[int] | None = None):
    """out = alpha * A @ B + beta * out, by the shipped library of `precision` for this GPU.

    A (M x K) and B (K x N) are float32 device arrays (PyTorch, CuPy or DLPack) in any layout with
    a unit stride; `out` (M x N, row- or column-major) is written in place, or made (same kind as A,
    row-major) when None, in which case beta must be 0. `precision`: "fp32" (as accurate as FP32:
    3xTF32 tensor-core kernels) or "tf32" (inputs rounded to TF32, about 1e-3 relative error). Runs
    on `stream` (default: the framework's current one). No autograd: gemmgen.torch.matmul is the
    differentiable operator.

    `devices` ([0, 1, ...] or "all") splits the call over those GPUs (devices.py): A, B and `out`
    may start on any of them, a new `out` is made on A's device, and the call returns with it
    complete (no `stream`).

    A 1-D A or B (PyTorch, CuPy) is taken as numpy.matmul takes it: A as a row (1 x K), B as a
    column (K x N), and that dimension is not in the result (nor in `out`); a matrix times a vector
    runs as one row (layouts.route)."""
    if getattr(A, "ndim", 2) == 1 or getattr(B, "ndim", 2) == 1:
        return _vector_matmul(A, B, out, alpha, beta, precision, stream, devices)
    if devices is not None:
        devices = split_devices.check_call(A, B, out, devices, stream)
        A, B = split_devices.detached(A), split_devices.detached(B)
        out = None if out is None else split_devices.detached(out)
        return _array_matmul(A, B, out, alpha, beta, precision, None, devices)
    torch = sys.modules.get("torch")
    if (torch is not None and isinstance(A, torch.Tensor) and isinstance(B, torch.Tensor)
            and (out is None or isinstance(out, torch.Tensor))):
        if (_torch_launcher is not None and out is None and stream is None and beta == 0.0
                and precision.__class__ is str and alpha.__class__ in (float, int)):
            return _torch_launcher(A, B, alpha, precision)
        return _torch_matmul(torch, A, B, out, alpha, beta, precision, stream)
    return _array_matmul(A, B, out, alpha, beta, precision, stream)


def _vector_matmul(A, B, out, alpha, beta, precision, stream, devices):
    """matmul with a 1-D A (a row) or B (a column), through views that add the missing dimension."""
    try:
        A2, B2, out2, finish = vector_views(A, B, out)
    except BatchError as exc:
        raise ShapeError(str(exc)) from None
    result = matmul(A2, B2, out2, alpha=alpha, beta=beta, precision=precision, stream=stream, devices=devices)
    return out if out is not None else finish(result)


_torch_launcher = None


def use_torch_launcher(launcher) -> None:
    """Serve gemmgen.matmul(A, B[, alpha=, precision=]) of two torch tensors into a new output by
    `launcher(A, B, alpha, precision)`: the PyTorch stage's C++ kernel (torch/native.py), which
    keeps each call key's launch as _torch_matmul does and hands back to it the keys it does not
    serve. None: this module's Python path."""
    global _torch_launcher
    _torch_launcher = launcher


# --- PyTorch tensors: one lookup, one launch -------------------------------------------------------

def torch_matmul(A, B, alpha: float = 1.0, precision: str = "fp32"):
    """alpha * A @ B for two torch tensors: the fast path without gemmgen.matmul's argument
    handling (torch.ops.gemmgen.matmul's CUDA kernel)."""
    return _torch_matmul(sys.modules["torch"], A, B, None, alpha, 0.0, precision, None)


class _Call:
    """A resolved call key: the prepared launch, whether A and B swap, the output's shape and
    device; or (`route` with copies) the copies to make first."""

    __slots__ = ("run", "swap", "shape", "device", "index", "route")

    def __init__(self, run, swap, shape, device, index, route_=None):
        self.run, self.swap, self.shape, self.device, self.index, self.route = run, swap, shape, device, index, route_


_calls: dict[tuple, _Call] = {}
CALLS_KEPT = 4096  # call keys resolved and kept (the oldest goes)


def resolve_torch_call(A, B, precision: str) -> _Call:
    """The resolved call of `alpha * A @ B` into a new output (what torch.ops.gemmgen.matmul's C++
    kernel keeps per call key, torch/native.py): `run` is a PreparedLaunch or `nothing`, unless
    `route` says what to copy first. Raises what gemmgen.matmul raises for wrong arguments."""
    pa, pb = A.data_ptr(), B.data_ptr()
    key = _new_output_key(A, B, precision, pa, pb, False)
    call = _calls.get(key)
    if call is None:
        call = _resolve_torch(sys.modules["torch"], key, A, B, None, 0.0, precision, (pa & 15, pb & 15, 0))
    return call


def _new_output_key(A, B, precision: str, pa: int, pb: int, beta_used: bool) -> tuple:
    """The call key of A @ B into a new output: what decides its launch (get_device() is -1 for a
    CPU tensor, so the device says CUDA or not)."""
    return (precision, A.dtype, B.dtype, A.get_device(), B.get_device(), A.shape, B.shape,
            A.stride(), B.stride(), pa & 15, pb & 15, beta_used)


def _torch_matmul(torch, A, B, out, alpha, beta, precision, stream):
    pa, pb = A.data_ptr(), B.data_ptr()
    if out is None:
        pc = 0
        key = _new_output_key(A, B, precision, pa, pb, beta != 0.0)
    else:
        pc = out.data_ptr()
        key = (precision, A.dtype, B.dtype, A.get_device(), B.get_device(), A.shape, B.shape,
               A.stride(), B.stride(), pa & 15, pb & 15, beta != 0.0,
               out.dtype, out.get_device(), out.shape, out.stride(), pc & 15)
    call = _calls.get(key)
    if call is None:
        call = _resolve_torch(torch, key, A, B, out, beta, precision, (pa & 15, pb & 15, pc & 15))
    if call.route is not None:
        return _torch_with_copies(torch, call, A, B, out, alpha, beta, precision, stream)
    if out is None:
        out = A.new_empty(call.shape)  # float32 on A's device (the key holds both); cheaper than torch.empty
        pc = out.data_ptr()
        if pc & 15:  # never from PyTorch's allocator; served all the same
            return _torch_matmul(torch, A, B, out, alpha, beta, precision, stream)
    handle = torch._C._cuda_getCurrentRawStream(call.index) if stream is None else stream_handle(stream)
    if call.swap:
        call.run(pb, pa, pc, alpha, beta, handle)
    else:
        call.run(pa, pb, pc, alpha, beta, handle)
    return out


def _torch_operand(torch, x, name: str) -> Operand:
    """The matrix (the last two dimensions) of an operand as routing sees it."""
    if x.dtype != torch.float32:
        raise ShapeError(f"{name} must hold float32, not {x.dtype}")
    if x.dim() < 2:
        raise ShapeError(f"{name} must be a matrix (2-D) or a batch of matrices (..., rows, cols), not "
                         f"{x.dim()}-D of shape {tuple(x.shape)}")
    _require_cuda(x, name)
    return Operand(name, x.shape[-2], x.shape[-1], (x.stride(-2), x.stride(-1)))


def _require_cuda(x, name: str) -> None:
    if not x.is_cuda:
        raise ShapeError(f"{name} is not on a GPU: a torch tensor on {x.device}; move it with .cuda()")


def _resolve_torch(torch, key, A, B, out, beta, precision, residues) -> _Call:
    _check_precision(precision)
    a, b = _torch_operand(torch, A, "A"), _torch_operand(torch, B, "B")
    M, K, N = a.rows, a.cols, b.cols
    if b.rows != K:
        raise ShapeError(f"A is {M} x {K} but B is {b.rows} x {N}: inner sizes differ")
    device = A.get_device()
    if B.get_device() != device:
        raise ShapeError(f"A is on GPU {device} but B on GPU {B.get_device()}")
    if out is None:
        if beta != 0.0:
            raise ValueError("beta != 0 needs an `out` to read C from")
        c = Operand("out", M, N, (N, 1))
    else:
        c = _torch_operand(torch, out, "out")
        if (c.rows, c.cols) != (M, N):
            raise ShapeError(f"out must be {M} x {N} for A {M} x {K} times B {K} x {N}, not {tuple(out.shape)}")
        if out.get_device() != device:
            raise ShapeError(f"A is on GPU {device} but out on GPU {out.get_device()}")
    if A.dim() > 2 or B.dim() > 2 or (out is not None and out.dim() > 2):
        try:
            batching = plan_batches(A.shape, A.stride(), B.shape, B.stride(), None if out is None else out.shape,
                                    None if out is None else out.stride())
        except BatchError as exc:
            raise ShapeError(str(exc)) from None
        call = _resolve_batched(batching, a, b, c, residues, precision, device, beta, A.device)
    else:
        way = route(a, b, c, available_classes(precision), precision)
        if way.copies:
            call = _Call(None, False, (M, N), A.device, device, way)
        else:
            call = _Call(_prepare(way, M, N, K, residues, precision, device, beta), way.swap, (M, N), A.device, device)
    if len(_calls) >= CALLS_KEPT:
        _calls.pop(next(iter(_calls), None), None)
    _calls[key] = call
    return call


def _batched_route(batching: Batching, a: Operand, b: Operand, c: Operand, precision: str):
    """How a batched call (batches.py) runs, for tensors and arrays alike: (its route, the launch's
    M, batch count and A's, B's and C's batch strides). An operand whose batches no single stride
    walks is copied dense first (A row-major, B column-major, as the base library reads them);
    where A's rows fold, the launch is one GEMM of batch x M rows."""
    M, K, N = a.rows, a.cols, b.cols
    strides = batching.strides
    dense = [name for name in "ABC" if strides[name] is None]
    if dense:
        way = Route(BASE, False, (0, 0, 0), "row" if "A" in dense else None, "col" if "B" in dense else None,
                    "C" in dense, tuple(dense_reason(name) for name in dense))
        return way, M, batching.batch, (0, 0, 0)
    if batching.fold:
        rows = batching.batch * M
        a = Operand("A", rows, K, (folded_row_stride(M, a.strides[0], strides["A"]), a.strides[1]))
        c = Operand("out", rows, N, (folded_row_stride(M, c.strides[0], strides["C"]), c.strides[1]))
        return route(a, b, c, available_classes(precision), precision), rows, 1, (0, 0, 0)
    way = route(a, b, c, available_classes(precision), precision)
    return way, M, batching.batch, (strides["A"], strides["B"], strides["C"])


def _resolve_batched(batching: Batching, a: Operand, b: Operand, c: Operand, residues, precision: str,
                     device: int, beta: float, where) -> _Call:
    shape = batching.lead + (a.rows, b.cols)
    if batching.batch == 0:  # no matrices: nothing to read or write
        return _Call(nothing, False, shape, where, device)
    way, M, batch, strides = _batched_route(batching, a, b, c, precision)
    if way.copies:
        return _Call(None, False, shape, where, device, way)
    return _Call(_prepare(way, M, b.cols, a.cols, residues, precision, device, beta, batch, strides),
                 way.swap, shape, where, device)


def nothing(A: int, B: int, C: int, alpha: float, beta: float, stream: int) -> None:
    """The launch of a call with no matrices."""


def _prepare(way: Route, M: int, N: int, K: int, residues: tuple[int, int, int], precision: str, device: int,
             beta: float, batch: int = 1, strides: tuple[int, int, int] = (0, 0, 0)):
    """The library's prepared (or padded) launch for a route without copies (residues: A's, B's and C's
    address % 16; a new output's is 0; `batch` matrices, A's, B's and C's `strides` apart)."""
    a16, b16, c16 = residues
    runtime = library(precision, device, way.klass)
    lda, ldb, ldc = way.lds
    sa, sb, sc = strides
    if way.swap:
        return runtime.prepare(N, M, K, lda, ldb, ldc, (b16, a16, c16), beta != 0.0, batch, (sb, sa, sc))
    return runtime.prepare(M, N, K, lda, ldb, ldc, (a16, b16, c16), beta != 0.0, batch, strides)


def _torch_copy(x, layout: str, lead: tuple[int, ...] = ()):
    """x (a matrix, or a batch of them) with each matrix dense in `layout`: by gemmgen's transposing
    copy where x lies the other way on a GPU (a unit stride, batches at one stride), else PyTorch's
    copy (no unit stride: a strided slice, a broadcast; a batch whose own batches lie at no single
    stride is first broadcast to the call's leading dimensions `lead`)."""
    own = tuple(x.shape[:-2])
    if x.dim() > 2 and lead and batch_stride(own, tuple(x.stride()[:-2]), lead) is None:
        x = x.expand(lead + tuple(x.shape[-2:]))
        own = lead
    rows, cols = x.shape[-2:]
    row_stride, col_stride = x.stride()[-2:]
    step = batch_stride(own, tuple(x.stride()[:-2]), own) if own else 0
    other = "col" if layout == "row" else "row"
    reads_other = (row_stride == 1 or cols <= 1) if other == "col" else (col_stride == 1 or rows <= 1)
    if x.is_cuda and reads_other and rows > 1 and cols > 1 and step is not None and x.numel():
        import torch
        device = x.get_device()
        stream = torch._C._cuda_getCurrentRawStream(device)
        count = x.numel() // (rows * cols)
        if layout == "row":  # x column-major: its transpose (cols x rows) lies row-major, ld its column stride
            out = x.new_empty((*own, rows, cols))
            transpose(x.data_ptr(), cols, rows, col_stride, out.data_ptr(), cols, device, stream,
                      count, (step, rows * cols))
            return out
        out = x.new_empty((*own, cols, rows))  # x row-major: written as its transpose, row-major, then seen as x
        transpose(x.data_ptr(), rows, cols, row_stride, out.data_ptr(), rows, device, stream, count, (step, rows * cols))
        return out.mT
    return x.contiguous() if layout == "row" else x.mT.contiguous().mT


def _torch_with_copies(torch, call: _Call, A, B, out, alpha, beta, precision, stream):
    way = call.route
    _warn_once(way.reasons)
    lead = tuple(call.shape[:-2])
    if way.copy_a:
        A = _torch_copy(A, way.copy_a, lead)
    if way.copy_b:
        B = _torch_copy(B, way.copy_b, lead)
    if not way.copy_c:
        return _torch_matmul(torch, A, B, out, alpha, beta, precision, stream)
    staged = out.contiguous() if beta != 0.0 else torch.empty(call.shape, dtype=torch.float32, device=call.device)
    _torch_matmul(torch, A, B, staged, alpha, beta, precision, stream)
    out.copy_(staged)
    return out


# --- CuPy, DLPack, __cuda_array_interface__ ------------------------------------------------------

def _framework(array: Any) -> str:
    module = type(array).__module__.split(".")[0]
    return module if module in ("torch", "cupy") else "other"


def _device_of(array: Any) -> int:
    if _framework(array) == "torch":
        return array.device.index or 0
    device = getattr(array, "device", None)
    return int(getattr(device, "id", 0) or 0)


def _copy(array: Any, layout: str, lead: tuple[int, ...] = ()):
    """The same matrix (or batch, broadcast to `lead` where no single stride walks it), dense in
    `layout` (a copy on the GPU)."""
    if _framework(array) == "torch":
        return _torch_copy(array, layout, lead)
    cupy = require_cupy("copying an operand into the layout a library takes")
    with cupy.cuda.Device(_device_of(array)):  # on the operand's own GPU (a split's may be on any)
        if array.ndim == 2:
            return cupy.ascontiguousarray(array) if layout == "row" else cupy.asfortranarray(array)
        shape, strides = array.shape, tuple(s // 4 for s in array.strides)
        if lead and batch_stride(shape[:-2], strides[:-2], lead) is None:
            array = cupy.broadcast_to(array, lead + shape[-2:])
        if layout == "row":
            return cupy.ascontiguousarray(array)
        return cupy.ascontiguousarray(array.swapaxes(-1, -2)).swapaxes(-1, -2)


def _as_array(array: Any, name: str):
    """The array itself, or (a device array that only speaks DLPack) CuPy's view of it."""
    if _framework(array) in ("torch", "cupy"):
        return array
    return device_array(array, name)  # says why it is no device array (host memory; DLPack without CuPy)


def _readable(array: Any, name: str) -> None:
    """as_matrix's checks that an array can be read at all (device memory, float32, 2-D), with
    the layout left to routing."""
    try:
        as_matrix(array, name, "row")
    except ShapeError as exc:
        if "-major" not in str(exc):
            raise


def _current_stream(array: Any) -> int:
    if _framework(array) == "torch":
        import torch
        return torch.cuda.current_stream(array.device).cuda_stream
    try:
        import cupy
        return cupy.cuda.get_current_stream().ptr
    except ImportError:
        return 0


def _array_operand(array: Any, name: str) -> tuple[Operand, int]:
    """The operand as routing sees it, and its address. as_matrix says why an array cannot be read
    at all (a host array, a wrong dtype, not 2-D); whether it reads row- or column-major, or
    neither (then it is copied), is routing's question."""
    _readable(array, name)
    interface = array.__cuda_array_interface__
    rows, cols = interface["shape"]
    strides = interface.get("strides") or (cols * 4, 4)
    return Operand(name, rows, cols, (strides[0] // 4, strides[1] // 4)), interface["data"][0]


def _array_matmul(A, B, out, alpha, beta, precision, stream, devices=None):
    _check_precision(precision)
    A, B = _as_array(A, "A"), _as_array(B, "B")
    if len(A.shape) != 2 or len(B.shape) != 2 or (out is not None and len(out.shape) != 2):
        return _array_batched(A, B, None if out is None else _as_array(out, "out"), alpha, beta, precision, stream,
                              devices)
    a, pa = _array_operand(A, "A")
    b, pb = _array_operand(B, "B")
    if a.cols != b.rows:
        raise ShapeError(f"A is {a.rows} x {a.cols} but B is {b.rows} x {b.cols}: inner sizes differ")
    M, K, N = a.rows, a.cols, b.cols
    if out is None:
        if beta != 0.0:
            raise ValueError("beta != 0 needs an `out` to read C from")
        if devices is not None:
            out = split_devices.new_output(A, M, N)
        elif _framework(A) == "torch":
            import torch
            out = torch.empty((M, N), dtype=torch.float32, device=A.device)
        else:
            cupy = require_cupy("gemmgen.matmul making `out` for a non-PyTorch array")
            with cupy.cuda.Device(_device_of(A)):
                out = cupy.empty((M, N), dtype=cupy.float32)
    else:
        out = _as_array(out, "out")
    c, pc = _array_operand(out, "out")
    if (c.rows, c.cols) != (M, N):
        raise ShapeError(f"out must be {M} x {N} for A {M} x {K} times B {K} x {N}, not {(c.rows, c.cols)}")
    device = _device_of(A)
    for x, what in ((B, "B"), (out, "out")):
        if devices is None and _device_of(x) != device:
            raise ShapeError(f"A is on GPU {device} but {what} on GPU {_device_of(x)}")
    way = route(a, b, c, available_classes(precision), precision)
    if way.copies:
        _warn_once(way.reasons)
        A = _copy(A, way.copy_a) if way.copy_a else A
        B = _copy(B, way.copy_b) if way.copy_b else B
        if not way.copy_c:
            return _array_matmul(A, B, out, alpha, beta, precision, stream, devices)
        staged = _copy(out, "row")
        _array_matmul(A, B, staged, alpha, beta, precision, stream, devices)
        out[...] = staged
        return out
    if devices is not None:
        split_devices.split_call(lambda d: library(precision, d, way.klass), A, B, out, alpha, beta, devices,
                                 way.swap)
        return out
    runtime = library(precision, device, way.klass)
    handle = stream_handle(stream) if stream is not None else _current_stream(out)
    lda, ldb, ldc = way.lds
    if way.swap:
        runtime.launch(N, M, K, alpha, pb, lda, pa, ldb, beta, pc, ldc, stream=handle)
    else:
        runtime.launch(M, N, K, alpha, pa, lda, pb, ldb, beta, pc, ldc, stream=handle)
    return out


# --- batches of CuPy (or DLPack) arrays ----------------------------------------------------------

def _array_dims(array: Any, name: str) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Shape, strides in floats and address of a float32 device array of matrices (..., rows, cols)."""
    interface = array.__cuda_array_interface__
    shape = tuple(interface["shape"])
    if len(shape) < 2:
        raise ShapeError(f"{name} must be a matrix (2-D) or a batch of matrices (..., rows, cols), not "
                         f"{len(shape)}-D of shape {shape}")
    if all(shape[:-2]):
        _readable(array[(0,) * (len(shape) - 2)], name)  # float32 device memory: as one matrix says
    strides = interface.get("strides")
    if strides is None:
        strides, step = [], 4
        for n in reversed(shape):
            strides.insert(0, step)
            step *= max(n, 1)
    if any(s % 4 for s in strides):
        raise ShapeError(f"{name}: strides {tuple(strides)} bytes are not whole float32 elements")
    return shape, tuple(s // 4 for s in strides), interface["data"][0]


def _array_batched(A, B, out, alpha, beta, precision, stream, devices=None):
    """gemmgen.matmul of arrays with batch dimensions: as the torch path decides (batches.py), one
    GEMM of stacked rows or one strided-batched launch, copies only where no single stride walks
    an operand's batches; with `devices`, that launch split over them (devices.py)."""
    (a_shape, a_str, pa), (b_shape, b_str, pb) = _array_dims(A, "A"), _array_dims(B, "B")
    M, K, N = a_shape[-2], a_shape[-1], b_shape[-1]
    if b_shape[-2] != K:
        raise ShapeError(f"A's matrices are {M} x {K} but B's {b_shape[-2]} x {N}: inner sizes differ")
    try:
        if out is None:
            if beta != 0.0:
                raise ValueError("beta != 0 needs an `out` to read C from")
            lead = broadcast(a_shape[:-2], b_shape[:-2])
            out = _new_like(A, lead + (M, N))
        c_shape, c_str, pc = _array_dims(out, "out")
        if c_shape[-2:] != (M, N):
            raise ShapeError(f"out's matrices must be {M} x {N} for A's {M} x {K} times B's {K} x {N}, not "
                             f"{c_shape[-2]} x {c_shape[-1]}")
        batching = plan_batches(a_shape, a_str, b_shape, b_str, c_shape, c_str)
    except BatchError as exc:
        raise ShapeError(str(exc)) from None
    device = _device_of(A)
    for x, what in ((B, "B"), (out, "out")):
        if devices is None and _device_of(x) != device:
            raise ShapeError(f"A is on GPU {device} but {what} on GPU {_device_of(x)}")
    if batching.batch == 0 or M == 0 or N == 0:
        return out
    a, b = Operand("A", M, K, a_str[-2:]), Operand("B", K, N, b_str[-2:])
    way, M, batch, (sa, sb, sc) = _batched_route(batching, a, b, Operand("out", M, N, c_str[-2:]), precision)
    if way.copies:
        _warn_once(way.reasons)
        A = _copy(A, way.copy_a, batching.lead) if way.copy_a else A
        B = _copy(B, way.copy_b, batching.lead) if way.copy_b else B
        if not way.copy_c:
            return _array_batched(A, B, out, alpha, beta, precision, stream, devices)
        staged = _copy(out, "row")
        _array_batched(A, B, staged, alpha, beta, precision, stream, devices)
        out[...] = staged
        return out
    if devices is not None:
        split_devices.split_batched_call(lambda d: library(precision, d, way.klass), (A, B, out), (pa, pb, pc),
                                         way, (M, N, K), batch, (sa, sb, sc), alpha, beta, devices)
        return out
    runtime = library(precision, device, way.klass)
    handle = stream_handle(stream) if stream is not None else _current_stream(out)
    lda, ldb, ldc = way.lds
    if way.swap:
        runtime.launch(N, M, K, alpha, pb, lda, pa, ldb, beta, pc, ldc, stream=handle, batch=batch,
                       strides=(sb, sa, sc))
    else:
        runtime.launch(M, N, K, alpha, pa, lda, pb, ldb, beta, pc, ldc, stream=handle, batch=batch,
                       strides=(sa, sb, sc))
    return out


def _new_like(A: Any, shape: tuple[int, ...]):
    """A new float32 array of `shape` on A's device, of A's framework."""
    if _framework(A) == "torch":
        import torch
        return torch.empty(shape, dtype=torch.float32, device=A.device)
    cupy = require_cupy("gemmgen.matmul making `out` for a non-PyTorch array")
    with cupy.cuda.Device(_device_of(A)):
        return cupy.empty(shape, dtype=cupy.float32)
