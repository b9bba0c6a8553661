"""Choosing a library member per call and launching it from Python: gemmgen.matmul.

The shipped libraries (`fp32`, FP32-accurate; `tf32`) are manifests (library.py) tuned on one GPU.
For each call the member predicted fastest for its shape and alignment is compiled with NVRTC (once:
cubins are cached on disk) and launched on the caller's current stream. On a GPU the library was not
tuned for, its portable member, compiled for that GPU, serves every call, and a warning says so once.

Arrays may be CuPy, PyTorch or anything with __cuda_array_interface__ or DLPack, float32 and 2-D, in
any strides with one unit stride. The libraries take A row-major and B column-major (K contiguous in
both); other layouts are copied into those first (a transpose of A or B, on the GPU).
"""

from __future__ import annotations

import json
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

from .outputs import complete_pending
from .runtime import Kernel, ShapeError, as_matrix, device_info, on_device, stream_handle
from .selection import alignment_class, choose

PRECISIONS = ("fp32", "tf32")


def _libraries_dir() -> Path:
    """generated/ of a source checkout, or the package's copy of the shipped manifests."""
    source_tree = Path(__file__).resolve().parent.parent / "generated"
    if source_tree.is_dir():
        return source_tree
    return Path(__file__).resolve().parent / "libraries"  # the wheel's gemmgen.libraries


def shipped_manifest(precision: str) -> dict:
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    path = _libraries_dir() / f"{precision}.json"
    try:
        complete_pending(path)  # a build of the library killed while renaming its files: finish it
        return json.loads(path.read_text())
    except OSError as exc:
        raise FileNotFoundError(f"the shipped {precision} library ({path}) is missing: {exc.strerror}; "
                                "reinstall gemmgen, or tune one with gemmgen tune specs/{precision}.gemm") from None


class LibraryRuntime:
    """A library manifest ready to run on one device: choose a member per call, launch it."""

    def __init__(self, manifest: dict, device: int = 0):
        from .library import candidates_of, member_plans

        self.manifest = manifest
        self.name = manifest["library"]
        self.device = device
        self.info = device_info(device)
        self.plans = member_plans(manifest)
        self.candidates = candidates_of(manifest)
        self.layouts = manifest["layout"]
        tuned = manifest["device"]["compute_capability"]
        self.tuned_gpu = list(self.info.compute_capability) == list(tuned)
        self.portable = manifest["portable"] if manifest["portable"] is not None else 0
        self._kernels: dict[int, Kernel] = {}
        if not self.tuned_gpu:
            warnings.warn(f"gemmgen library '{self.name}' was tuned for compute capability "
                          f"{tuned[0]}.{tuned[1]} ({manifest['device']['name']}); this {self.info.name} is "
                          f"{self.info.target}: every call runs its portable member "
                          f"{manifest['members'][self.portable]['name']} ({manifest['members'][self.portable]['point']})",
                          RuntimeWarning, stacklevel=3)

    @property
    def plan(self):
        """The layouts and precision every member shares (bench reads them here)."""
        return self.plans[self.portable]

    def choose(self, M: int, N: int, K: int, lda: int, ldb: int, ldc: int,
               pointers: tuple[int, int, int] = (0, 0, 0), beta: float = 0.0) -> int:
        """Index of the member that runs this call."""
        if not self.tuned_gpu:
            return self.portable
        return self._choose(M, N, K, alignment_class(lda, ldb, ldc, pointers), beta != 0.0)

    @lru_cache(maxsize=4096)  # noqa: B019 - one runtime per library and device, kept for the process
    def _choose(self, M: int, N: int, K: int, klass: str, beta_used: bool) -> int:
        return choose(self.candidates, M, N, K, klass, self.info.sm_count, beta_used=beta_used,
                      sm90a=self.info.compute_capability == (9, 0))

    def compile_all(self) -> None:
        """Compile every member at once (NVRTC in parallel processes, into the disk cache), so that
        the first call of each does not wait for its compile."""
        from .library import compile_all
        compile_all([self.kernel_plan(i) for i in range(len(self.plans))])

    def kernel_plan(self, index: int):
        """The plan a member runs as here: its own, or (on a GPU the library was not tuned for)
        the portable member's, planned for this GPU."""
        plan = self.plans[index]
        if self.tuned_gpu:
            return plan
        from .plan import make_plan
        target = self.info.target if self.info.target in ("sm_80", "sm_86", "sm_89", "sm_90") else "sm_80"
        return make_plan(self.plans[self.portable].spec.with_values(target=target))

    def kernel(self, index: int) -> Kernel:
        if index not in self._kernels:
            self._kernels[index] = Kernel(self.kernel_plan(index), device=self.device)
        return self._kernels[index]

    def launch(self, M: int, N: int, K: int, alpha: float, A: int, lda: int, B: int, ldb: int,
               beta: float, C: int, ldc: int, stream: Any = None, smallest=None) -> int:
        """The library's C ABI on raw device addresses; returns the index of the member that ran."""
        index = self.choose(M, N, K, lda, ldb, ldc, (A, B, C), beta)
        self.kernel(index).launch(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream=stream)
        return index


_runtimes: dict[tuple[str, int], LibraryRuntime] = {}


def library(precision: str = "fp32", device: int = 0) -> LibraryRuntime:
    """The shipped library of this precision on a device (built once per process)."""
    key = (precision, device)
    if key not in _runtimes:
        _runtimes[key] = LibraryRuntime(shipped_manifest(precision), device)
    return _runtimes[key]


def _framework(array: Any) -> str:
    module = type(array).__module__.split(".")[0]
    return module if module in ("torch", "cupy") else "other"


def _device_of(array: Any) -> int:
    if _framework(array) == "torch":
        return array.device.index or 0
    device = getattr(array, "device", None)
    return int(getattr(device, "id", 0) or 0)


def _transposed_copy(array: Any):
    """The same matrix with the other storage order (a copy on the GPU)."""
    if _framework(array) == "torch":
        return array.t().contiguous().t()
    import cupy
    return cupy.asfortranarray(array) if array.flags.c_contiguous else cupy.ascontiguousarray(array)


def _as_cupy(array: Any):
    if _framework(array) in ("torch", "cupy") or hasattr(array, "__cuda_array_interface__"):
        return array
    import cupy
    return cupy.from_dlpack(array)


def _current_stream(array: Any) -> int:
    if _framework(array) == "torch":
        import torch
        return torch.cuda.current_stream(array.device).cuda_stream
    try:
        import cupy
        return cupy.cuda.get_current_stream().ptr
    except ImportError:
        return 0


def _read(array: Any, what: str, layout: str):
    """The array as a matrix in `layout`, copied into that layout where it is in the other one."""
    try:
        return array, as_matrix(array, what, layout)
    except ShapeError as exc:
        if "is not" not in str(exc) or "-major" not in str(exc):
            raise
    array = _transposed_copy(array)
    return array, as_matrix(array, what, layout)


def matmul(A: Any, B: Any, out: Any = None, *, alpha: float = 1.0, beta: float = 0.0,
           precision: str = "fp32", stream: Any = None):
    """out = alpha * A @ B + beta * out, by the shipped library of `precision` for this GPU.

    A (M x K) and B (K x N) are float32 device arrays (CuPy, PyTorch or DLPack); `out` (M x N) is
    written in place, or made (same kind as A, row-major) when None, in which case beta must be 0.
    `precision`: "fp32" (as accurate as FP32: 3xTF32 tensor-core kernels) or "tf32" (inputs rounded
    to TF32, about 1e-3 relative error). Runs on `stream` (default: the framework's current one)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    A, B = _as_cupy(A), _as_cupy(B)
    for x, what in ((A, "A"), (B, "B")):
        interface = getattr(x, "__cuda_array_interface__", None)
        if interface is None:
            as_matrix(x, what, "row")  # raises the reason (a host array, a wrong dtype, ...)
    shape_a, shape_b = tuple(A.shape), tuple(B.shape)
    if len(shape_a) != 2 or len(shape_b) != 2:
        raise ShapeError(f"A and B must be matrices, not of shapes {shape_a} and {shape_b}")
    if shape_a[1] != shape_b[0]:
        raise ShapeError(f"A is {shape_a[0]} x {shape_a[1]} but B is {shape_b[0]} x {shape_b[1]}: inner sizes differ")
    M, K, N = shape_a[0], shape_a[1], shape_b[1]
    if out is None:
        if beta != 0.0:
            raise ValueError("beta != 0 needs an `out` to read C from")
        if _framework(A) == "torch":
            import torch
            out = torch.empty((M, N), dtype=torch.float32, device=A.device)
        else:
            import cupy
            with cupy.cuda.Device(_device_of(A)):
                out = cupy.empty((M, N), dtype=cupy.float32)
    else:
        out = _as_cupy(out)
        if tuple(out.shape) != (M, N):
            raise ShapeError(f"out must be {M} x {N} for A {M} x {K} times B {K} x {N}, not {tuple(out.shape)}")
    device = _device_of(A)
    for x, what in ((B, "B"), (out, "out")):
        if _device_of(x) != device:
            raise ShapeError(f"A is on GPU {device} but {what} on GPU {_device_of(x)}")
    runtime = library(precision, device)
    layouts = runtime.layouts
    # A column-major C is C^T = B^T A^T, row-major: A and B swap places, each transposed.
    c_row = True
    try:
        c = as_matrix(out, "out", layouts["C"])
    except ShapeError:
        c, c_row = as_matrix(out, "out", "col" if layouts["C"] == "row" else "row"), False
    if c_row:
        A, a = _read(A, "A", layouts["A"])
        B, b = _read(B, "B", layouts["B"])
        first, second, m, n = a, b, M, N
    else:
        A, a = _read(A, "A", "col" if layouts["B"] == "row" else "row")
        B, b = _read(B, "B", "col" if layouts["A"] == "row" else "row")
        first, second, m, n = b, a, N, M
    with on_device(device):
        handle = stream_handle(stream) if stream is not None else _current_stream(out)
        runtime.launch(m, n, K, alpha, first.ptr, first.ld, second.ptr, second.ld, beta, c.ptr, c.ld,
                       stream=handle)
    return out
