"""Load cubins through the CUDA driver API and launch them on device arrays.

Works in the device's primary context, the one CuPy and PyTorch use, so their arrays can be
passed straight in. Arrays are taken through `__cuda_array_interface__` (or DLPack, converted by
CuPy); their strides become leading dimensions. Every CUDA error becomes a CudaError that names
the kernel and the launch.

What is missing says so, with what to do, before any other package's error can: no driver or no
GPU is a NoGpuError, a host array (NumPy, a CPU tensor) a ShapeError, CuPy where it is needed but
not installed a MissingPackageError. `device_array` and `require_cupy` are those checks for
callers that take arrays from users (gemmgen.matmul).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .compile import Compiled, compile_plan
from ..codegen.cuda import kernel_name_expressions
from .launch import CudaError, PreparedLaunch, PreparedStep, decide
from ..plan import Plan


class NoGpuError(CudaError):
    """No NVIDIA driver, or a driver that sees no GPU (or not the one asked for): nothing can run."""


class ShapeError(ValueError):
    """Arrays that a kernel cannot multiply (wrong dtype, rank, layout, sizes or device)."""


class MissingPackageError(ImportError):
    """An optional package that a call needs (CuPy) is not installed; the message says how to get it."""


NO_DRIVER = ("no NVIDIA driver found (the CUDA driver library, libcuda.so.1, could not be loaded): "
             "running a kernel needs an NVIDIA GPU and its driver; gemmgen build and explain work "
             "without one")

_driver_module = None


def _driver():
    """cuda-python's driver bindings, once the driver library has loaded (NoGpuError where it can't)."""
    global _driver_module
    if _driver_module is None:
        try:
            from cuda.bindings import driver
        except ImportError:
            try:
                from cuda import cuda as driver  # type: ignore[no-redef]  # cuda-python before 12.6
            except ImportError:
                raise NoGpuError("cuda-python's driver bindings are missing: pip install 'cuda-python>=12.8' "
                                 "(gemmgen's own dependency)") from None
        try:
            driver.cuDriverGetVersion()  # the bindings load libcuda at their first call
        except Exception:  # noqa: BLE001 - cuda.pathfinder's DynamicLibNotFoundError, or dlopen's OSError
            raise NoGpuError(NO_DRIVER) from None
        _driver_module = driver
    return _driver_module


_NO_DEVICE, _INSUFFICIENT_DRIVER, _INVALID_DEVICE = 100, 35, 101  # CUresult values


def _init(driver) -> None:
    """cuInit, with what to do where the driver sees no GPU or is too old."""
    result = driver.cuInit(0)
    status = int(result[0] if isinstance(result, tuple) else result)
    if status == _NO_DEVICE:
        raise NoGpuError("no CUDA GPU found: the NVIDIA driver sees none (CUDA_ERROR_NO_DEVICE); check "
                         "nvidia-smi, and CUDA_VISIBLE_DEVICES where it is set", status)
    if status == _INSUFFICIENT_DRIVER:
        raise NoGpuError("the NVIDIA driver is too old for this cuda-python (CUDA_ERROR_INSUFFICIENT_DRIVER): "
                         "update the driver, or with a CUDA 12 driver install cuda-python 12 and "
                         "cupy-cuda12x", status)
    _check(result, "cuInit")


def _check(result, what: str):
    driver = _driver()
    status = result[0] if isinstance(result, tuple) else result
    if status != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(status)
        _, text = driver.cuGetErrorString(status)
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = text.decode() if isinstance(text, bytes) else str(text)
        raise CudaError(f"{what}: {name} ({text})", int(status))
    if isinstance(result, tuple):
        return result[1] if len(result) == 2 else result[1:]
    return None


_contexts: dict[int, Any] = {}


def device_count() -> int:
    """GPUs the driver sees; 0 where there is no driver or no GPU."""
    try:
        driver = _driver()
        if driver.cuInit(0)[0] != driver.CUresult.CUDA_SUCCESS:
            return 0
        status, count = driver.cuDeviceGetCount()
        return count if status == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:  # no driver library at all
        return 0


def use_device(ordinal: int = 0):
    """Make the device's primary context current (creating it once) and return it."""
    driver = _driver()
    if ordinal not in _contexts:
        _init(driver)
        result = driver.cuDeviceGet(ordinal)
        if int(result[0]) == _INVALID_DEVICE:
            status, count = driver.cuDeviceGetCount()
            raise NoGpuError(f"there is no GPU {ordinal}: the driver sees {count if not int(status) else 'no'} "
                             f"GPU(s), numbered from 0", _INVALID_DEVICE)
        device = _check(result, f"cuDeviceGet({ordinal})")
        _contexts[ordinal] = _check(driver.cuDevicePrimaryCtxRetain(device),
                                    f"retaining the primary context of device {ordinal}")
    _check(driver.cuCtxSetCurrent(_contexts[ordinal]), "cuCtxSetCurrent")
    return _contexts[ordinal]


@contextmanager
def on_device(ordinal: int):
    """The device's primary context current inside the block, and the caller's current again
    after it: launching on GPU 1 from code that works on GPU 0 (CuPy's or PyTorch's current
    device) leaves GPU 0 current, so the caller's next allocation lands where it meant."""
    driver = _driver()
    if not _contexts:
        _init(driver)
    previous = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    context = use_device(ordinal)
    try:
        yield context
    finally:
        if int(previous) != int(context):
            driver.cuCtxSetCurrent(previous)


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    ordinal: int
    compute_capability: tuple[int, int]
    sm_count: int
    clock_khz: int
    driver_version: str
    l2_bytes: int
    memory_clock_khz: int
    memory_bus_bits: int

    @property
    def memory_bandwidth_gbs(self) -> float:
        """DRAM bandwidth from the datasheet numbers the driver reports (double data rate)."""
        return 2 * self.memory_clock_khz * 1e3 * self.memory_bus_bits / 8 / 1e9

    @property
    def target(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    def fp32_peak_tflops(self, lanes_per_sm: int) -> float:
        """FFMA peak: lanes x 2 flops x SMs x clock."""
        return 2 * lanes_per_sm * self.sm_count * self.clock_khz * 1e3 / 1e12


def device_info(ordinal: int = 0) -> DeviceInfo:
    driver = _driver()
    with on_device(ordinal):
        device = _check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
        raw = _check(driver.cuDeviceGetName(64, device), "cuDeviceGetName")
        name = raw.split(b"\0")[0].decode() if isinstance(raw, bytes) else str(raw)
        attr = driver.CUdevice_attribute

        def get(which) -> int:
            return _check(driver.cuDeviceGetAttribute(which, device), f"cuDeviceGetAttribute({which})")

        version = _check(driver.cuDriverGetVersion(), "cuDriverGetVersion")
        return DeviceInfo(
            name=name, ordinal=ordinal,
            compute_capability=(get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                                get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
            sm_count=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            clock_khz=get(attr.CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
            driver_version=f"{version // 1000}.{version % 1000 // 10}",
            l2_bytes=get(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
            memory_clock_khz=get(attr.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
            memory_bus_bits=get(attr.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH))


@dataclass(frozen=True)
class Matrix:
    """A device matrix as a kernel sees it: address, rows, columns, layout, leading dimension."""

    ptr: int
    rows: int
    cols: int
    layout: str  # "row" or "col"
    ld: int


_DLPACK_CUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged: memory a kernel can read
_DLPACK_NAMES = {1: "host (CPU)", 3: "pinned host (CUDA host)"}


def _dlpack_device_type(array: Any) -> int | None:
    """The DLPack device type of an array (1 is the CPU, 2 CUDA), or None where it won't say."""
    try:
        return int(array.__dlpack_device__()[0])
    except Exception:  # noqa: BLE001 - no __dlpack_device__, or one that fails: let DLPack decide
        return None


def _kind(array: Any) -> str:
    """'a NumPy array', 'a PyTorch tensor', or 'a <type>': what the user passed, in their words."""
    package = type(array).__module__.split(".")[0]
    return {"numpy": "a NumPy array", "torch": "a PyTorch tensor", "cupy": "a CuPy array",
            "jax": "a JAX array", "jaxlib": "a JAX array"}.get(package, f"a {type(array).__name__}")


def require_cupy(purpose: str):
    """The cupy module, or a MissingPackageError saying that `purpose` needs it and how to get it."""
    try:
        import cupy
    except ModuleNotFoundError as exc:
        if exc.name != "cupy" and not str(exc).startswith("import of cupy halted"):
            raise MissingPackageError(f"{purpose} needs CuPy, which is installed but cannot load ({exc}): "
                                      "reinstall it for your CUDA (cupy-cuda13x, or cupy-cuda12x)") from None
        raise MissingPackageError(f"{purpose} needs CuPy, which is not installed: pip install 'gemmgen[gpu]' "
                                  "(cupy-cuda13x; cupy-cuda12x for a CUDA 12 driver), or pass PyTorch CUDA "
                                  "tensors") from None
    except ImportError as exc:
        raise MissingPackageError(f"{purpose} needs CuPy, which is installed but cannot load ({exc}): "
                                  "reinstall it for your CUDA (cupy-cuda13x, or cupy-cuda12x)") from None
    return cupy


def device_array(array: Any, what: str) -> Any:
    """`array` where a kernel can read it: itself when it has `__cuda_array_interface__` (CuPy,
    PyTorch CUDA tensors, Numba), else CuPy's view of a DLPack array on the GPU. A host array
    (NumPy, a CPU tensor) is a ShapeError before CuPy is even imported; a GPU array that only
    DLPack describes needs CuPy (MissingPackageError without it)."""
    if getattr(array, "__cuda_array_interface__", None) is not None:
        return array
    device = _dlpack_device_type(array)
    if device is not None and device not in _DLPACK_CUDA:
        where = _DLPACK_NAMES.get(device, f"DLPack device type {device}")
        kind = _kind(array)
        how = {"a NumPy array": f"cupy.asarray({what}), or torch.from_numpy({what}).cuda()",
               "a PyTorch tensor": f"{what}.cuda()"}.get(kind, f"e.g. cupy.asarray({what})")
        raise ShapeError(f"{what} is not a device array: it is {kind} in {where} memory; copy it to the GPU "
                         f"first ({how})")
    if not hasattr(array, "__dlpack__"):
        raise ShapeError(f"{what} is not a device array (no __cuda_array_interface__ or DLPack); "
                         f"got {type(array).__name__}")
    cupy = require_cupy(f"reading {what} ({_kind(array)}, by DLPack)")
    try:
        return cupy.from_dlpack(array)
    except Exception as exc:  # noqa: BLE001 - any failure means: not a device array we can read
        raise ShapeError(f"{what}: CuPy could not read {_kind(array)} by DLPack ({exc})") from None


def _float32_interface(array: Any, what: str) -> dict:
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:
        interface = device_array(array, what).__cuda_array_interface__
    if interface["typestr"] not in ("<f4", "=f4", "|f4"):
        raise ShapeError(f"{what} must hold float32, not {interface['typestr']}")
    return interface


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Byte strides of a C-contiguous float32 array (what a None `strides` means)."""
    strides, step = [], 4
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def as_matrix(array: Any, what: str, layout: str) -> Matrix:
    """A 2-D float32 device array (`__cuda_array_interface__` or DLPack) read in `layout`."""
    interface = _float32_interface(array, what)
    shape = tuple(interface["shape"])
    if len(shape) != 2:
        raise ShapeError(f"{what} must be a matrix (2-D), not {len(shape)}-D of shape {shape}")
    strides = interface.get("strides") or _contiguous_strides(shape)
    return _matrix(interface["data"][0], shape, strides, what, layout)


@dataclass(frozen=True)
class Batch:
    """A device array as a batched kernel sees it: its matrix (the first, for a 3-D array), the
    batches it holds (None: a 2-D array, one matrix for every batch) and their stride in floats."""

    matrix: Matrix
    count: int | None
    stride: int


def as_batch(array: Any, what: str, layout: str) -> Batch:
    """A 2-D float32 device array, or a 3-D one of (batch, rows, cols) whose matrices are read in
    `layout` and lie a whole number of floats apart (not backwards)."""
    interface = _float32_interface(array, what)
    shape = tuple(interface["shape"])
    if len(shape) not in (2, 3):
        raise ShapeError(f"{what} must be a matrix (2-D) or a batch of matrices (3-D: batch, rows, cols), "
                         f"not {len(shape)}-D of shape {shape}")
    strides = interface.get("strides") or _contiguous_strides(shape)
    if len(shape) == 2:
        return Batch(_matrix(interface["data"][0], shape, strides, what, layout), None, 0)
    if strides[0] % 4 or strides[0] < 0:
        raise ShapeError(f"{what}: batch stride {strides[0]} bytes is not a whole, non-negative number of "
                         "float32 elements")
    matrix = _matrix(interface["data"][0], shape[1:], strides[1:], f"{what} (each batch)", layout)
    return Batch(matrix, shape[0], strides[0] // 4 if shape[0] > 1 else 0)


def _matrix(address: int, shape: tuple[int, ...], strides: tuple[int, ...], what: str, layout: str) -> Matrix:
    rows, cols = shape
    if any(s % 4 for s in strides):
        raise ShapeError(f"{what}: strides {strides} are not whole float32 elements")
    row_stride, col_stride = strides[0] // 4, strides[1] // 4
    # Row-major: elements of a row are adjacent and rows are ld apart (column-major: transposed).
    if layout == "row":
        contiguous, ld, lines, length = col_stride == 1 or cols <= 1, row_stride, rows, cols
    else:
        contiguous, ld, lines, length = row_stride == 1 or rows <= 1, col_stride, cols, rows
    if lines <= 1:
        ld = max(1, length)
    if not contiguous or ld < max(1, length):
        raise ShapeError(f"{what} of shape {tuple(shape)} with element strides ({row_stride}, {col_stride}) "
                         f"is not {layout}-major, which this kernel was built for (layout {what.split()[0]} {layout})")
    return Matrix(address, rows, cols, layout, ld)


def stream_handle(stream: Any) -> int:
    """A raw CUstream from None, an int, a CuPy stream (.ptr) or a PyTorch stream (.cuda_stream)."""
    if stream is None:
        return 0
    for attribute in ("ptr", "cuda_stream", "handle"):
        value = getattr(stream, attribute, None)
        if isinstance(value, int):
            return value
    if isinstance(stream, int):
        return stream
    return int(stream)


class Kernel:
    """A compiled gemmgen kernel, ready to launch in the current process.

        kernel = Kernel(plan)
        kernel(A, B, C, alpha=1.0, beta=0.0)          # device arrays, layouts per the spec
        kernel(A3, B3, C3)                            # 3-D arrays: strided batches (2-D: shared)
        kernel.launch(M, N, K, alpha, a_ptr, lda, ...)  # raw pointers, exactly the C ABI
        kernel.launch(..., batch=8, strides=(sa, sb, sc))  # the batched entry point's
        run = kernel.prepare(M, N, K, lda, ldb, ldc)    # the launch of one call key, decided once:
        run(a_ptr, b_ptr, c_ptr, alpha, beta, stream)   # writes the pointers and scalars, launches

    Every launch goes through `prepare` (launch.py): the decision of what runs for a call key is
    made once and kept (the last PREPARED keys)."""

    PREPARED = 1024

    def __init__(self, plan: Plan, compiled: Compiled | None = None, device: int = 0):
        self.plan = plan
        self.device = device
        # The layout each operand must have: what a caller (a split over GPUs) places them in.
        self.layouts = {"A": plan.spec["layout.A"], "B": plan.spec["layout.B"], "C": plan.c_layout}
        with on_device(device) as context:  # loading and launching in the device's context, the caller's kept
            self._context = int(context)
            self.compiled = compiled or compile_plan(plan)
            driver = _driver()
            self._module = _check(driver.cuModuleLoadData(self.compiled.cubin),
                                  f"loading the cubin of {plan.launcher_name} "
                                  f"(built for {self.compiled.target})")
            names = kernel_name_expressions(plan)
            self._functions = {}
            for aligned, expression in names.items():
                symbol = self.compiled.lowered_names[expression]
                function = _check(driver.cuModuleGetFunction(self._module, symbol.encode()),
                                  f"finding {expression} in its cubin")
                if plan.smem_bytes > 48 * 1024:
                    _check(driver.cuFuncSetAttribute(
                        function,
                        driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        plan.smem_bytes), f"allowing {plan.smem_bytes} bytes of shared memory")
                self._functions[aligned] = int(function)
            # A TMA kernel's file holds a register-fed kernel for calls TMA cannot describe.
            fallback = plan.mainloop.fallback
            self._fallback = Kernel(fallback, self.compiled, device) if fallback else None
            for helper in plan.helper_launches:  # split K's pass over C, the reduction's kernels
                self._functions[helper.kernel] = int(_check(driver.cuModuleGetFunction(
                    self._module, f"{plan.launcher_name}_{helper.kernel}".encode()), helper.kernel))

    @property
    def name(self) -> str:
        return self.plan.launcher_name

    def _state(self):
        """The lock that this kernel's launches share (their buffers, tensor maps and stream-K
        workspaces) and its prepared launches by call key (made on first use, so that a Kernel
        made without __init__ in a test has them too)."""
        state = self.__dict__.get("_shared")
        if state is None:
            state = self.__dict__["_shared"] = (threading.Lock(), {})
        return state

    def prepare(self, M: int, N: int, K: int, lda: int, ldb: int, ldc: int,
                align: tuple[int, int, int] = (0, 0, 0), beta_used: bool = False, batch: int = 1,
                strides: tuple[int, int, int] = (0, 0, 0)) -> PreparedLaunch:
        """The launch of a call key, decided once: sizes, leading dimensions, A's, B's and C's
        address % 16, whether beta != 0, and the batches (count; A's, B's and C's strides in
        floats). Raises CudaError for arguments the C launcher refuses."""
        lock, prepared = self._state()
        strides = tuple(strides)
        key = (M, N, K, lda, ldb, ldc, align, beta_used) + ((batch, strides) if (batch, strides) != (1, (0, 0, 0)) else ())
        found = prepared.get(key)
        if found is not None:
            return found
        plan = self.plan
        problem = plan.argument_error(M, N, K, lda, ldb, ldc, batch, strides)
        if problem:
            raise CudaError(f"{self.name}: invalid arguments: {problem}", 1)
        if not plan.beta and beta_used:
            raise CudaError(f"{self.name} was built with 'epilogue alpha' and ignores C; beta must be 0", 1)
        sms = self._sm_count() if plan.scheduled else 0
        decision = decide(plan, M, N, K, lda, ldb, ldc, align, sms, batch, strides)
        if decision.fallback:
            found = self._fallback.prepare(M, N, K, lda, ldb, ldc, align, beta_used, batch, strides)
        else:
            steps = []
            for step in decision.steps:
                function = self._functions[step.aligned if step.kernel == "main" else step.kernel]
                if step.kernel == "main":
                    what = (f"launching {self.name} ({decision.variant}) on {step.grid[0]} x {step.grid[1]} blocks x "
                            f"{step.threads} threads, {step.smem} B shared, M={M} N={N} K={K}"
                            + (f" batch={batch}" if batch != 1 else ""))
                else:
                    what = f"launching {self.name}_{step.kernel}"
                steps.append(PreparedStep(step, function, what))
            found = PreparedLaunch(self._context, steps, lock, self._workspace, self.name)
        if len(prepared) >= self.PREPARED:
            prepared.pop(next(iter(prepared), None), None)
        prepared[key] = found
        return found

    def launch(self, M: int, N: int, K: int, alpha: float, A: int, lda: int, B: int, ldb: int,
               beta: float, C: int, ldc: int, smallest: tuple[int, int, int] | None = None,
               stream: Any = None, batch: int = 1, strides: tuple[int, int, int] = (0, 0, 0), *,
               bias: int | None = None, scale: int | None = None) -> None:
        """The C ABI on raw device addresses (with `batch` and `strides`, A's, B's and C's in
        floats: the batched entry point's; `bias`, `scale`: the fused epilogue's vectors, which the
        C ABI takes after ldc); raises CudaError where the launcher returns an error."""
        if self.plan.reduce_count and (smallest is None or not all(smallest)):
            raise CudaError(f"{self.name} has a fused reduction: pass smallest=(values, rows, cols)", 1)
        A, B, C = int(A or 0), int(B or 0), int(C or 0)  # a null pointer may come as None
        vectors = _vector_addresses(self.plan, self.name, {"bias": bias, "scale": scale}, M, N)
        run = self.prepare(M, N, K, lda, ldb, ldc, (A % 16, B % 16, C % 16), beta != 0.0, batch, strides)
        if M and N and batch and (not C or (K and (not A or not B))):
            raise CudaError(f"{self.name}: null pointer for a matrix with elements", 1)
        run(A, B, C, alpha, beta, stream_handle(stream), tuple(smallest) if smallest else (0, 0, 0), vectors)

    def _sm_count(self) -> int:
        if "_sms" not in self.__dict__:
            self._sms = device_info(self.device).sm_count
        return self._sms

    WORKSPACES = 16  # streams whose workspace a Kernel keeps, as the C launcher does

    def _workspace(self, stream: int, size: int) -> int:
        """The workspace of stream-K and of split K through a workspace, for launches on `stream`, as
        the C launcher keeps one: per stream (launches on one stream run in turn), grown when needed,
        zeroed when allocated (the kernels leave its counters zeroed); the workspace of the stream used longest ago goes when a
        seventeenth stream comes. Inside a CUDA graph capture (the first call on the capture
        stream) it is allocated outside the capture and zeroed on a stream of its own; one it
        outgrows there is kept until close(), since the capture's stream cannot be waited for."""
        spaces = self.__dict__.setdefault("_workspaces", {})  # stream -> (address, bytes), oldest use first
        address, held = spaces.pop(stream, (0, 0))
        if held < size:
            driver = _driver()
            capturing = int(_check(driver.cuStreamIsCapturing(stream), "asking whether the stream is capturing"))
            if address:
                if capturing:
                    self.__dict__.setdefault("_retired", []).append(address)
                else:
                    _check(driver.cuStreamSynchronize(stream), "waiting for the stream before growing a workspace")
                    _check(driver.cuMemFree(address), "freeing a workspace")
            if len(spaces) >= self.WORKSPACES and not capturing:
                # Its stream may be gone: wait for the whole context before freeing what it used.
                _check(driver.cuCtxSynchronize(), "waiting for kernels before freeing a workspace")
                _check(driver.cuMemFree(spaces.pop(next(iter(spaces)))[0]), "freeing a workspace")
            held = size + size // 4
            if capturing:
                address = self._allocate_outside_capture(held)
            else:
                address = int(_check(driver.cuMemAlloc(held), f"allocating a {held}-byte workspace"))
                _check(driver.cuMemsetD8Async(address, 0, held, stream), "zeroing a workspace")
        spaces[stream] = (address, held)
        return address

    @staticmethod
    def _allocate_outside_capture(size: int) -> int:
        """A zeroed allocation made while this thread's stream captures a graph: in relaxed capture
        mode (allocating is refused in the global mode PyTorch captures in), zeroed on a private
        non-blocking stream that is waited for, so it is zero before any launch reads it."""
        driver = _driver()
        relaxed = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        previous = _check(driver.cuThreadExchangeStreamCaptureMode(relaxed), "entering relaxed capture mode")
        try:
            address = int(_check(driver.cuMemAlloc(size), f"allocating a {size}-byte workspace"))
            side = _check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value),
                          "creating a stream to zero a workspace on")
            try:
                _check(driver.cuMemsetD8Async(address, 0, size, side), "zeroing a workspace")
                _check(driver.cuStreamSynchronize(side), "waiting for a workspace to be zeroed")
            finally:
                driver.cuStreamDestroy(side)
        finally:
            driver.cuThreadExchangeStreamCaptureMode(previous)
        return address

    def __call__(self, A: Any, B: Any, C: Any, *, alpha: float = 1.0, beta: float = 0.0,
                 smallest: tuple[Any, Any, Any] | None = None, stream: Any = None,
                 bias: Any = None, scale: Any = None) -> None:
        """C = alpha * A @ B + beta * C on device arrays whose layouts match the spec. 3-D arrays
        (batch, rows, cols) multiply strided batches, C[b] = alpha * A[b] @ B[b] + beta * C[b]; a
        2-D A or B (or one of batch 1) serves every batch. A kernel built with `bias` or `scale`
        takes that vector (float32, on C's device: M floats for `row`, N for `col`, shared by every
        batch) and applies its activation: C = act(alpha * scale * (A @ B) + beta * C + bias)."""
        spec = self.plan.spec
        batches = [as_batch(x, name, spec[f"layout.{name}"]) for x, name in ((A, "A"), (B, "B"), (C, "C"))]
        a, b, c = (x.matrix for x in batches)
        batch, strides = _batches(*batches)
        M, K = a.rows, a.cols
        if b.rows != K:
            raise ShapeError(f"A is {a.rows} x {a.cols} but B is {b.rows} x {b.cols}: inner sizes differ")
        N = b.cols
        if (c.rows, c.cols) != (M, N):
            raise ShapeError(f"C must be {M} x {N} for A {M} x {K} times B {K} x {N}, not "
                             f"{c.rows} x {c.cols}")
        pointers = None
        if smallest is not None:
            pointers = tuple(_device_pointer(x, what) for x, what in
                             zip(smallest, ("smallest values", "smallest rows", "smallest cols")))
        given = {"bias": bias, "scale": scale}
        _no_stray_vectors(self.plan, self.name, given)
        vectors = {}
        for name, by in self.plan.epilogue.vectors:
            length = M if by == "row" else N
            if given[name] is None:
                raise ShapeError(f"{self.name} was built with `{name} {by}`: pass {name}=, a float32 device "
                                 f"vector of {length} floats (one per {'row' if by == 'row' else 'column'} of C)")
            vectors[name] = as_vector(given[name], name, length, by, C)
        self.launch(M, N, K, alpha, a.ptr, a.ld, b.ptr, b.ld, beta, c.ptr, c.ld,
                    smallest=pointers, stream=stream, batch=batch, strides=strides, **vectors)

    def close(self) -> None:
        with on_device(self.device):
            spaces = [address for address, _ in self.__dict__.pop("_workspaces", {}).values()]
            spaces += self.__dict__.pop("_retired", [])
            if spaces:
                _check(_driver().cuCtxSynchronize(), "waiting for kernels before freeing their workspaces")
                for address in spaces:
                    _driver().cuMemFree(address)
            if getattr(self, "_module", None) is not None:
                _driver().cuModuleUnload(self._module)
                self._module = None


def _batches(a: Batch, b: Batch, c: Batch) -> tuple[int, tuple[int, int, int]]:
    """The batch count and strides of A, B and C as a call passes them: the 3-D arrays' batches
    agree (or are 1: one matrix for all), C holds every batch, a 2-D operand serves them all."""
    counts = {name: x.count for name, x in zip("ABC", (a, b, c)) if x.count is not None}
    if not counts:
        return 1, (0, 0, 0)
    batch = max(counts.values())
    for name, count in counts.items():
        if count not in (batch, 1):
            raise ShapeError("batch sizes differ: " + ", ".join(f"{n} holds {k}" for n, k in counts.items())
                             + f" (each must be {batch}, or 1 to serve every batch)")
    if batch > 1 and counts.get("C", 1) != batch:
        raise ShapeError(f"C must hold all {batch} batches (a 3-D array of {batch} matrices): only A and B "
                         "may serve every batch with one matrix")
    if batch > 1 and c.stride == 0:
        raise ShapeError(f"C's {batch} batches share one matrix (batch stride 0): each batch needs its own C")
    return batch, (a.stride if batch > 1 else 0, b.stride if batch > 1 else 0, c.stride if batch > 1 else 0)


def _no_stray_vectors(plan: Plan, name: str, given: dict[str, Any]) -> None:
    """A vector passed to a kernel built without it is an error, not ignored."""
    built = dict(plan.epilogue.vectors)
    for vector, value in given.items():
        if value is not None and vector not in built:
            raise ShapeError(f"{name} was built without a {vector} (no `{vector} row|col` line in its spec); "
                             f"{vector}= must be None")


def _vector_addresses(plan: Plan, name: str, given: dict[str, Any], M: int, N: int) -> tuple[int, int]:
    """(bias, scale) device addresses for the launch (0 where the kernel has none), each vector the
    kernel was built with given, and none it was not."""
    _no_stray_vectors(plan, name, given)
    built = dict(plan.epilogue.vectors)
    for vector, by in built.items():
        if not given[vector] and M and N:
            raise CudaError(f"{name} was built with `{vector} {by}`: pass {vector}= (a device vector of "
                            f"{'M' if by == 'row' else 'N'} floats)", 1)
    return tuple(int(given[vector] or 0) for vector in ("bias", "scale"))


def as_vector(array: Any, what: str, length: int, by: str, like: Any) -> int:
    """The device address of a contiguous float32 vector of `length` elements on the device of
    `like` (C): what the epilogue reads as bias or scale (`by`: "row", one per row of C, or "col")."""
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:
        interface = device_array(array, what).__cuda_array_interface__
    if interface["typestr"] not in ("<f4", "=f4", "|f4"):
        raise ShapeError(f"{what} must hold float32, not {interface['typestr']}")
    shape = tuple(interface["shape"])
    one_per = "row" if by == "row" else "column"
    if len(shape) != 1 or shape[0] != length:
        raise ShapeError(f"{what} must be a vector of {length} floats, one per {one_per} of C "
                         f"(`{what} {by}`), not of shape {shape}")
    strides = interface.get("strides")
    if strides and length > 1 and strides[0] != 4:
        raise ShapeError(f"{what} must be contiguous (a stride of 4 bytes), not a stride of {strides[0]} bytes")
    where, home = _device_of(array), _device_of(like)
    if where is not None and home is not None and where != home:
        raise ShapeError(f"{what} is on GPU {where}, but C is on GPU {home}: put them on one device")
    return interface["data"][0]


def _device_of(array: Any) -> int | None:
    """The GPU ordinal of a CuPy array or PyTorch tensor, or None where it won't say."""
    device = getattr(array, "device", None)
    for attribute in ("index", "id"):
        value = getattr(device, attribute, None)
        if isinstance(value, int):
            return value
    return None


def _device_pointer(array: Any, what: str) -> int:
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:
        raise ShapeError(f"{what} is not a device array")
    return interface["data"][0]


def synchronize() -> None:
    _check(_driver().cuCtxSynchronize(), "synchronizing the device (a kernel may have faulted)")
