"""The padding copy and its workspace (library/padding.py decides when a call pads): a kernel that
copies matrices whose rows are not 16-byte aligned into rows that are (templates/pad.cuh.j2, the
same kernel a library's .cu holds), compiled with NVRTC once per GPU architecture, and stream-ordered
workspace from a memory pool of gemmgen's own per device, which keeps what it has held (as PyTorch's
caching allocator does) so that a call in a loop does not map memory again.

    pad(src, rows, cols, ld_src, stride_src, dst, ld_dst, stride_dst, batch, device, stream, round_tf32)
    address = allocate(device, stream, nbytes)   # 0 where the pool cannot give it
    free(address, stream)
    release()                                    # the pools' memory back to the GPU
    capturing(stream)                            # a CUDA graph capture: no workspace is taken then
    with current(device): ...                    # its context current (two driver calls)
"""

from __future__ import annotations

import contextlib
import ctypes
import threading

from ..codegen.cuda import render_template
from .compile import compile_source
from .launch import Arguments, CudaError, LaunchConfig, cuda, error_text
from .runtime import _check, _driver, device_info, on_device

THREADS, UNROLL = 256, 4   # as templates/pad.cuh.j2 has them: a block covers THREADS x UNROLL floats of a row
KERNELS = ("gemmgen_pad", "gemmgen_pad_tf32")
_MAX_GRID_Y = 65535
SIGNATURE = (("in", "p"), ("rows", "i"), ("cols", "i"), ("ld_in", "l"), ("stride_in", "l"), ("out", "p"),
             ("ld_out", "l"), ("stride_out", "l"), ("batch", "i"))

_lock = threading.Lock()


class _Launcher:
    """The two kernels on one device (as is, rounded to TF32), an argument buffer written in place
    per call and a launch configuration; `lock` guards both."""

    __slots__ = ("context", "functions", "arguments", "slots", "params", "config", "config_ref", "lock", "pool")

    def __init__(self, context: int, functions: tuple[int, int], pool):
        self.context, self.functions = context, tuple(ctypes.c_void_p(f) for f in functions)
        self.arguments = Arguments(SIGNATURE)
        self.slots = tuple(self.arguments.slot(name) for name, _ in SIGNATURE)
        self.params = ctypes.c_void_p(self.arguments.kernel_params)
        self.config = LaunchConfig(1, 1, 1, THREADS, 1, 1, 0, None, None, 0)
        self.config_ref = ctypes.byref(self.config)
        self.lock = threading.Lock()
        self.pool = pool


_launchers: dict[int, _Launcher] = {}


def _launcher(device: int) -> _Launcher:
    """The kernels and the workspace pool on `device`, made once."""
    found = _launchers.get(device)
    if found is not None:
        return found
    with _lock:
        if device not in _launchers:
            info = device_info(device)
            compiled = compile_source(render_template("pad.cu.j2"), info.target, list(KERNELS), filename="pad.cu")
            lib = cuda()
            with on_device(device) as context:
                module = ctypes.c_void_p()
                _status(lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(compiled.cubin)),
                        "loading gemmgen's padding kernels")
                functions = []
                for name in KERNELS:
                    function = ctypes.c_void_p()
                    symbol = compiled.lowered_names[name].encode()
                    _status(lib.cuModuleGetFunction(ctypes.byref(function), module, ctypes.c_char_p(symbol)),
                            f"finding {name} in its cubin")
                    functions.append(function.value)
                _launchers[device] = _Launcher(int(context), tuple(functions), _new_pool(device))
        return _launchers[device]


def _new_pool(device: int):
    """A memory pool on `device` that keeps the memory it has held (release threshold: all of it)."""
    driver = _driver()
    props = driver.CUmemPoolProps()
    props.allocType = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = device
    pool = _check(driver.cuMemPoolCreate(props), "creating gemmgen's workspace pool")
    keep = driver.cuuint64_t(2**64 - 1)
    _check(driver.cuMemPoolSetAttribute(pool, driver.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, keep),
           "letting gemmgen's workspace pool keep its memory")
    return int(pool)  # the CUmemoryPool handle, as the driver's C functions take it


def _status(status: int, what: str) -> None:
    if status:
        raise CudaError(f"{what}: {error_text(status)}", status)


def grid(rows: int, cols: int, batch: int = 1) -> tuple[int, int, int]:
    """Blocks of a launch: THREADS x UNROLL columns a block, a block a row (rows beyond 65535 walked)."""
    return -(-cols // (THREADS * UNROLL)), min(rows * batch, _MAX_GRID_Y), 1


def capturing(stream: int) -> bool:
    """Whether `stream` is capturing a CUDA graph, or cannot say (the legacy stream while another
    thread captures): workspace is then not taken from the pool, as the library's .cu decides."""
    status = ctypes.c_int(0)
    if cuda().cuStreamIsCapturing(ctypes.c_void_p(stream), ctypes.byref(status)):
        return True
    return status.value != 0  # CU_STREAM_CAPTURE_STATUS_NONE


@contextlib.contextmanager
def current(device: int):
    """The device's primary context current inside the block (the caller's again after it), by two
    driver calls where the runtime's on_device makes several."""
    launcher = _launcher(device)
    lib = cuda()
    previous = ctypes.c_void_p()
    lib.cuCtxGetCurrent(ctypes.byref(previous))
    switch = previous.value != launcher.context
    if switch:
        _status(lib.cuCtxSetCurrent(ctypes.c_void_p(launcher.context)), "making the GPU's context current")
    try:
        yield
    finally:
        if switch:
            lib.cuCtxSetCurrent(previous)


def allocate(device: int, stream: int, nbytes: int) -> int:
    """`nbytes` of workspace on `device`, ordered on `stream`; 0 where the pool cannot give them
    (the GPU's memory is full): the caller then goes without."""
    address = ctypes.c_uint64(0)
    status = cuda().cuMemAllocFromPoolAsync(ctypes.byref(address), ctypes.c_size_t(nbytes),
                                            ctypes.c_void_p(_launcher(device).pool), ctypes.c_void_p(stream))
    return address.value if status == 0 else 0


def release(device: int | None = None) -> int:
    """Give the workspace pools' memory back (`device`'s, or every device's that has one), once the
    work queued on that device is done; returns how many pools were trimmed. The pools keep what
    they held between calls otherwise (at most the largest workspace one call took)."""
    trimmed = 0
    for ordinal, launcher in list(_launchers.items()):
        if device is not None and ordinal != device:
            continue
        lib = cuda()
        with current(ordinal):
            _status(lib.cuCtxSynchronize(), "waiting for the GPU before releasing padding workspace")
            _status(lib.cuMemPoolTrimTo(ctypes.c_void_p(launcher.pool), ctypes.c_size_t(0)),
                    "releasing padding workspace")
        trimmed += 1
    return trimmed


def free(address: int, stream: int) -> None:
    """Give workspace back to its pool once `stream` has done with it."""
    _status(cuda().cuMemFreeAsync(ctypes.c_uint64(address), ctypes.c_void_p(stream)), "freeing padding workspace")


def pad(src: int, rows: int, cols: int, ld_src: int, stride_src: int, dst: int, ld_dst: int, stride_dst: int,
        batch: int, device: int, stream: int, round_tf32: bool = False) -> None:
    """dst = src for `batch` matrices of rows x cols (row-major: rows ld apart, matrices `stride`
    floats apart), each float rounded to nearest TF32 with `round_tf32`; nothing for an empty one."""
    if rows <= 0 or cols <= 0 or batch <= 0:
        return
    if ld_src < cols or ld_dst < cols:
        raise ValueError(f"pad: leading dimensions {ld_src}, {ld_dst} below {cols}")
    launcher = _launcher(device)
    lib = cuda()
    gx, gy, gz = grid(rows, cols, batch)
    values = (src, rows, cols, ld_src, stride_src, dst, ld_dst, stride_dst, batch)
    with launcher.lock:
        current = ctypes.c_void_p()
        lib.cuCtxGetCurrent(ctypes.byref(current))
        switch = current.value != launcher.context
        if switch:
            _status(lib.cuCtxSetCurrent(ctypes.c_void_p(launcher.context)), "making the GPU's context current")
        try:
            for (view, index), value in zip(launcher.slots, values):
                view[index] = value
            config = launcher.config
            config.grid_x, config.grid_y, config.grid_z, config.stream = gx, gy, gz, stream
            status = lib.cuLaunchKernelEx(launcher.config_ref, launcher.functions[bool(round_tf32)],
                                          launcher.params, None)
            if status:
                _status(status, f"launching gemmgen_pad on {batch} x {rows} x {cols}")
        finally:
            if switch:
                lib.cuCtxSetCurrent(current)
