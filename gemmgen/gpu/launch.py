"""The launch decided once: what a call of a kernel starts, prepared per call key, run by one
cuLaunchKernelEx per kernel.

What a launch needs beyond the call's pointers and scalars depends only on its sizes, leading
dimensions, batches (count and strides) and the alignment of its pointers (address % 16): which kernels run (split K's pass over
C, the vector or scalar variant, a TMA kernel's register-fed fallback), their grids, shared bytes and
the stream-K workspace's size. `decide` makes that decision from the Plan (pure, testable without a
GPU); runtime.Kernel renders it once per key into a PreparedLaunch: per kernel its CUfunction, a
launch configuration and an argument buffer laid out as the kernel's C parameters with the sizes
already written. A call writes its pointers, alpha, beta and (TMA kernels) 128-byte tensor maps
into the buffer and launches. The hot path calls libcuda through ctypes: cuda-python's wrappers
cost tens of microseconds a call.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

# The kernels' parameter lists, (name, kind) in order: the parts describe them (plan/parts/launch.py).
from ..plan.parts.launch import BATCH, MAIN, REDUCE_CLEAR, REDUCE_FINISH, SCALE_C, TMA_MAIN  # noqa: F401
from ..plan.parts.launch import Helper, TensorMapSpec


class CudaError(RuntimeError):
    """A CUDA driver call failed; `code` is the CUresult value."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


# --- kernel parameters as C lays them out ----------------------------------------------------------

TENSOR_MAP_BYTES = 128
# kind: (ctypes type, size, alignment); "t" is a CUtensorMap (struct __align__(64) TensorMap in wgmma.cuh.j2)
KINDS = {"i": (ctypes.c_int, 4, 4), "l": (ctypes.c_longlong, 8, 8), "f": (ctypes.c_float, 4, 4),
         "p": (ctypes.c_void_p, 8, 8), "v": (ctypes.c_void_p, 8, 8),
         "t": (ctypes.c_ubyte * TENSOR_MAP_BYTES, TENSOR_MAP_BYTES, 64)}



def tma_signature(tma_store: bool, stream_k: bool) -> tuple:
    """A TMA wgmma kernel's parameters: A's and B's tensor maps first, C's map (staged epilogue) and
    stream-K's workspace, then the batches' (as a Plan's `signature` has them)."""
    return (TMA_MAIN + ((("map_c", "t"),) if tma_store else ()) + ((("workspace", "p"),) if stream_k else ())
            + BATCH)


def parameter_offsets(signature: tuple) -> tuple[dict[str, int], int]:
    """Byte offset of each parameter and the total size, as C lays out a struct of them: each at
    the next multiple of its alignment, the whole a multiple of the largest (CUDA's kernel
    parameter buffer follows the same rules)."""
    offsets, end, widest = {}, 0, 1
    for name, kind in signature:
        _, size, align = KINDS[kind]
        end = -(-end // align) * align
        offsets[name] = end
        end += size
        widest = max(widest, align)
    return offsets, -(-end // widest) * widest


class Arguments:
    """One kernel's argument buffer, laid out as its parameters (64-byte aligned, kept for the
    process), the array of pointers to each parameter in it that the launch takes as
    kernelParams, and views through which a parameter is written in place (memoryview item
    assignment: the cheapest write Python has)."""

    _VIEW_FORMAT = {"i": "i", "l": "q", "f": "f", "p": "Q", "v": "Q"}

    def __init__(self, signature: tuple):
        self.signature = signature
        self.kinds = dict(signature)
        self.offsets, self.size = parameter_offsets(signature)
        self.memory = (ctypes.c_ubyte * (self.size + 64))()
        skew = -ctypes.addressof(self.memory) % 64
        self.address = ctypes.addressof(self.memory) + skew
        self.bytes = memoryview(self.memory).cast("B")[skew: skew + self.size]
        self.views = {kind: self.bytes.cast(fmt) for kind, fmt in self._VIEW_FORMAT.items()
                      if self.size % KINDS[kind][1] == 0 and any(k == kind for _, k in signature)}
        self._pointers = (ctypes.c_void_p * max(1, len(signature)))(
            *[self.address + self.offsets[name] for name, _ in signature])
        self.kernel_params = ctypes.addressof(self._pointers) if signature else None

    def slot(self, name: str):
        """(view, index) through which `name` is written: view[index] = value (a tensor map: 128
        bytes into a slice of the byte view)."""
        kind, offset = self.kinds[name], self.offsets[name]
        if kind == "t":
            return self.bytes, slice(offset, offset + TENSOR_MAP_BYTES)
        return self.views[kind], offset // KINDS[kind][1]

    def set(self, name: str, value) -> None:
        view, index = self.slot(name)
        view[index] = value

    def raw(self) -> bytes:
        return ctypes.string_at(self.address, self.size)


# --- the decision --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One kernel launch of a call, decided: which kernel (`main`, `scale_c`, `reduce_clear`,
    `reduce_finish`), which variant of main, its grid (x, y), threads, shared bytes, parameters,
    the values fixed by the call key, the tensor maps a call encodes and stream-K's workspace bytes."""

    kernel: str
    aligned: bool
    grid: tuple[int, int]
    threads: int
    smem: int
    signature: tuple
    fixed: dict = field(default_factory=dict)
    maps: tuple[TensorMapSpec, ...] = ()
    workspace: int = 0

    @property
    def per_call(self) -> tuple[str, ...]:
        """The parameters a call writes: its pointers and scalars (maps and workspace aside)."""
        written = set(self.fixed) | {m.param for m in self.maps} | {"workspace"}
        return tuple(name for name, _ in self.signature if name not in written)


@dataclass(frozen=True)
class Decision:
    """What a call key launches: steps in order, or (`fallback`) the TMA kernel's register-fed
    fallback, which makes its own decision."""

    steps: tuple[Step, ...] = ()
    fallback: bool = False
    variant: str = ""


def decide(plan, M: int, N: int, K: int, lda: int, ldb: int, ldc: int, align: tuple[int, int, int],
           sms: int, batch: int = 1, strides: tuple[int, int, int] = (0, 0, 0)) -> Decision:
    """The launch of `plan` for these sizes, leading dimensions, pointer residues (address % 16
    of A, B, C) and `batch` products with A's, B's and C's strides: the same decision as the C
    launcher (launcher.cu.j2, wgmma_launcher.cu.j2), both made of what the Plan's parts describe:
    the mainloop's parameters, tensor maps and fallback, the schedule's grid, workspace and pass
    over C, the epilogue's map of C and reduction kernels. The arguments must be valid
    (Plan.argument_error)."""
    residues = {"A": align[0], "B": align[1], "C": align[2]}
    sizes = {"M": M, "N": N, "K": K, "lda": lda, "ldb": ldb, "ldc": ldc, "batch": batch,
             "strideA": strides[0], "strideB": strides[1], "strideC": strides[2]}
    helpers = plan.helper_launches
    steps = [_helper_step(h, sizes) for h in helpers if h.before and h.empty_too]
    variant = ""
    if M and N and batch:
        mainloop = plan.mainloop
        if mainloop.hands_over(M, N, K, lda, ldb, residues, batch, strides[:2]):
            return Decision(fallback=True, variant=mainloop.fallback_words)
        aligned = plan.aligned(M, N, K, lda, ldb, ldc, residues, dict(zip("ABC", strides)))
        steps += [_helper_step(h, sizes) for h in helpers if h.before and not h.empty_too]
        maps = mainloop.tensor_maps(plan, M, N, K, lda, ldb, batch, strides[:2])
        c_maps, fixed = plan.epilogue.tensor_maps(M, N, ldc, aligned, batch, strides[2])
        signature = plan.signature
        fixed = {**{p.name: sizes[p.name] for p in signature if p.name in sizes}, **fixed}
        grid = plan.scheduler.launch_grid(M, N, K, sms, batch)
        steps.append(Step("main", aligned, grid, plan.threads, plan.smem_bytes, signature, fixed,
                          tuple(maps + c_maps), plan.scheduler.workspace_bytes(grid[0])))
        variant = mainloop.variant(aligned, plan.epilogue.aligned_store)
    steps += [_helper_step(h, sizes) for h in helpers if not h.before and (h.empty_too or (M and N and batch))]
    return Decision(tuple(steps), variant=variant)


def _helper_step(helper: Helper, sizes: dict[str, int]) -> Step:
    fixed = {p.name: sizes[p.name] for p in helper.params if p.name in sizes}
    return Step(helper.kernel, False, helper.grid(sizes["M"], sizes["N"], sizes["batch"]), helper.threads, 0,
                helper.params, fixed)


# --- libcuda through ctypes ------------------------------------------------------------------------

_cuda = None
_SWIZZLE = {32: 1, 64: 2, 128: 3}           # CUtensorMapSwizzle
_FLOAT32, _TFLOAT32 = 7, 11                 # CU_TENSOR_MAP_DATA_TYPE_FLOAT32, _TFLOAT32 (TMA rounds to nearest TF32)
_L2 = {0: 0, 64: 1, 128: 2, 256: 3}         # CUtensorMapL2promotion by bytes


def cuda():
    """libcuda.so.1 (loaded once). The hot path passes its arguments as ready ctypes objects, with
    no argtypes to convert them: that halves a call's cost. cuLaunchKernelEx takes four arguments
    where cuLaunchKernel takes eleven, its launch configuration kept in a struct per step."""
    global _cuda
    if _cuda is None:
        try:
            _cuda = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise CudaError(f"cannot load the CUDA driver library libcuda.so.1 ({exc}): is an NVIDIA "
                            "driver installed?") from None
    return _cuda


def error_text(status: int) -> str:
    """NAME (description) of a CUresult."""
    lib = cuda()
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    lib.cuGetErrorName(ctypes.c_int(status), ctypes.byref(name))
    lib.cuGetErrorString(ctypes.c_int(status), ctypes.byref(text))
    return f"{(name.value or b'CUresult %d' % status).decode()} ({(text.value or b'').decode()})"


def encode_tensor_map(spec: TensorMapSpec, address: int, what: str) -> bytes:
    """cuTensorMapEncodeTiled of a 3-D float32 tensor (inner, outer, batches) at `address`, rows ld
    floats apart and batches as spec.batch_dims has them, boxes of box_inner x box_outer x 1, of type
    TFLOAT32 where TMA rounds it to TF32 (spec.tf32): its 128 bytes, ready to be written into an
    argument (as the C launcher encodes it)."""
    out = (ctypes.c_ubyte * TENSOR_MAP_BYTES)()
    batches, batch_stride = spec.batch_dims
    dims = (ctypes.c_uint64 * 3)(spec.inner, spec.outer, batches)
    strides = (ctypes.c_uint64 * 2)(spec.ld * 4, batch_stride * 4)
    box = (ctypes.c_uint32 * 3)(spec.box_inner, spec.box_outer, 1)
    ones = (ctypes.c_uint32 * 3)(1, 1, 1)
    status = cuda().cuTensorMapEncodeTiled(out, ctypes.c_int(_TFLOAT32 if spec.tf32 else _FLOAT32), ctypes.c_uint(3),
                                           ctypes.c_void_p(address), dims, strides, box, ones, ctypes.c_int(0),
                                           ctypes.c_int(_SWIZZLE[spec.swizzle]), ctypes.c_int(_L2[spec.promotion(address)]),
                                           ctypes.c_int(0))
    if status:
        raise CudaError(f"{what}: {error_text(status)}", status)
    return bytes(out)


# Tensor maps kept per operand of a call key. A model multiplies many weights of one shape through
# one call key (a transformer's q, k, v and o projections: 4 per layer), each with its own map; 16
# kept made every such call re-encode its map in Python once the layers outnumbered them (32 weights
# of 2048 x 2048 in an 8-layer model, each call a miss, cycling).
MAPS_KEPT = 1024


class TensorMapCache:
    """The tensor maps of one operand of a prepared launch for its last `size` addresses, least
    recently used first out: the rest of a map's key (dims, ld, box, swizzle, promotion) is fixed
    by the call key, so (address, dims, ld, box) keys it. A caller that multiplies the same buffers
    again (weights; activations the allocator hands back) does not pay for encoding them. Not
    locked: its prepared launch's lock guards it."""

    def __init__(self, spec: TensorMapSpec, size: int = MAPS_KEPT):
        self.spec, self.size = spec, size
        self._maps: OrderedDict[int, bytes] = OrderedDict()

    def get(self, address: int, what: str) -> bytes:
        found = self._maps.get(address)
        if found is not None:
            self._maps.move_to_end(address)
            return found
        found = encode_tensor_map(self.spec, address, what)
        if len(self._maps) >= self.size:
            self._maps.popitem(last=False)
        self._maps[address] = found
        return found

    def __len__(self) -> int:
        return len(self._maps)


# --- a prepared launch ---------------------------------------------------------------------------

class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h): grid, block, shared bytes and stream, no launch attributes."""

    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attributes", ctypes.c_void_p),
                ("attribute_count", ctypes.c_uint)]


# Where each per-call value sits in a call's values: A, B, C, alpha, beta, the fused
# reduction's three pointers, then the epilogue's vectors.
_SOURCES = {"A": 0, "B": 1, "C": 2, "alpha": 3, "beta": 4, "values": 5, "rows": 6, "cols": 7, "bias": 8, "scale": 9}
_NO_SMALLEST = (0, 0, 0)
_NO_VECTORS = (0, 0)


class PreparedStep:
    """A decided Step rendered for one device: its CUfunction, launch configuration and argument
    buffer with the call key's values written; `writes` says where a call's values go."""

    __slots__ = ("step", "function", "config", "config_ref", "arguments", "kernel_params", "writes", "maps",
                 "workspace", "stream", "what")

    def __init__(self, step: Step, function: int, what: str, map_cache_size: int = MAPS_KEPT):
        self.step, self.what = step, what
        self.function = ctypes.c_void_p(function)
        self.config = LaunchConfig(step.grid[0], step.grid[1], 1, step.threads, 1, 1, step.smem, None, None, 0)
        self.config_ref = ctypes.byref(self.config)
        self.stream = 0
        self.arguments = arguments = Arguments(step.signature)
        self.kernel_params = ctypes.c_void_p(arguments.kernel_params)
        for name, value in step.fixed.items():
            arguments.set(name, value)
        self.writes = tuple((*arguments.slot(name), _SOURCES[name]) for name in step.per_call)
        self.maps = tuple((*arguments.slot(m.param), _SOURCES[m.operand], TensorMapCache(m, map_cache_size))
                          for m in step.maps)
        self.workspace = (*arguments.slot("workspace"), step.workspace) if step.workspace else None


class PreparedLaunch:
    """A call key's launch, ready: `launch(A, B, C, alpha, beta, stream, smallest, vectors)` writes the call's values
    into the prepared buffers and launches each kernel once, in the device's context (made current
    for the launch, and the caller's given back, when another is current).

    `lock` guards the buffers, the tensor map caches and the workspaces, which a kernel's prepared
    launches share; `workspace(stream, bytes)` gives stream-K's workspace."""

    __slots__ = ("context", "steps", "lock", "workspace", "name", "_current", "_current_ref")

    def __init__(self, context: int, steps: list[PreparedStep], lock: threading.Lock,
                 workspace: Callable[[int, int], int] | None, name: str):
        self.context = context
        self.steps = tuple(steps)
        self.lock = lock
        self.workspace = workspace
        self.name = name
        self._current = ctypes.c_void_p()
        self._current_ref = ctypes.byref(self._current)

    def describe(self) -> list[tuple]:
        """Each step as a launcher outside Python makes it (torch/native.cpp): (CUfunction,
        CUlaunchConfig's bytes, the argument buffer's bytes with the call key's values written,
        each parameter's offset in it, the call's writes as (offset, "f" | "i" | "q" | "Q",
        source), tensor maps as (offset, source, get(address) -> 128 bytes), the workspace as
        (offset, get(stream) -> address) or None, what it is). Sources index the values
        __call__ takes: 0 A, 1 B, 2 C, 3 alpha, 4 beta, then the reduction's and the epilogue's.
        The getters take this launch's lock, as __call__ does."""
        lock = self.lock

        def locked(function, *args):
            with lock:
                return function(*args)

        steps = []
        for step in self.steps:
            arguments = step.arguments
            writes = [(index * view.itemsize, view.format, source) for view, index, source in step.writes]
            maps = [(window.start, source, lambda address, cache=cache, what=step.what: locked(cache.get, address, what))
                    for _, window, source, cache in step.maps]
            workspace = None
            if step.workspace:
                view, index, size = step.workspace
                workspace = (index * view.itemsize, lambda stream, size=size: locked(self.workspace, stream, size))
            steps.append((step.function.value or 0, ctypes.string_at(ctypes.addressof(step.config),
                                                                      ctypes.sizeof(LaunchConfig)),
                          arguments.raw(), [arguments.offsets[name] for name, _ in step.step.signature],
                          writes, maps, workspace, step.what))
        return steps

    def __call__(self, A: int, B: int, C: int, alpha: float, beta: float, stream: int,
                 smallest: tuple[int, int, int] = _NO_SMALLEST, vectors: tuple[int, int] = _NO_VECTORS) -> None:
        """`vectors`: the epilogue's (bias, scale) addresses (0 where it has none)."""
        if not self.steps:
            return
        lib = _cuda or cuda()
        values = (A, B, C, alpha, beta) + smallest + vectors
        lock = self.lock
        lock.acquire()
        try:
            lib.cuCtxGetCurrent(self._current_ref)
            previous = self._current.value
            switch = previous != self.context
            if switch:
                status = lib.cuCtxSetCurrent(ctypes.c_void_p(self.context))
                if status:
                    raise CudaError(f"{self.name}: making its device's context current: {error_text(status)}", status)
            try:
                for step in self.steps:
                    for view, index, source in step.writes:
                        view[index] = values[source]
                    for view, index, source, cache in step.maps:
                        view[index] = cache.get(values[source], step.what)
                    if step.workspace:
                        view, index, size = step.workspace
                        view[index] = self.workspace(stream, size)
                    if stream != step.stream:
                        step.config.stream = stream
                        step.stream = stream
                    status = lib.cuLaunchKernelEx(step.config_ref, step.function, step.kernel_params, None)
                    if status:
                        raise CudaError(f"{step.what}: {error_text(status)}", status)
            finally:
                if switch:
                    lib.cuCtxSetCurrent(ctypes.c_void_p(previous))
        finally:
            lock.release()
