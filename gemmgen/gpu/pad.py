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

import ctypes
import threading

from .copy_kernels import CopyKernels, check
from .launch import cuda
from .runtime import _check, _driver, on_device

THREADS, UNROLL = 256, 4   # as templates/pad.cuh.j2 has them: a block covers THREADS x UNROLL floats of a row
KERNELS = ("gemmgen_pad", "gemmgen_pad_tf32")
_MAX_GRID_Y = 65535
SIGNATURE = (("in", "p"), ("rows", "i"), ("cols", "i"), ("ld_in", "l"), ("stride_in", "l"), ("out", "p"),
             ("ld_out", "l"), ("stride_out", "l"), ("batch", "i"))
_KERNELS = CopyKernels("pad.cu.j2", KERNELS, SIGNATURE, "padding kernels")

_pools: dict[int, int] = {}   # device -> its workspace pool (a CUmemoryPool handle)
_pools_lock = threading.Lock()


def _pool(device: int) -> int:
    """The workspace pool of `device`, made once."""
    found = _pools.get(device)
    if found is None:
        with _pools_lock:
            if device not in _pools:
                with on_device(device):
                    _pools[device] = _new_pool(device)
            found = _pools[device]
    return found


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


def current(device: int):
    """The device's primary context current inside a `with` block (the caller's again after it)."""
    return _KERNELS.current(device)


def allocate(device: int, stream: int, nbytes: int) -> int:
    """`nbytes` of workspace on `device`, ordered on `stream`; 0 where the pool cannot give them
    (the GPU's memory is full): the caller then goes without."""
    address = ctypes.c_uint64(0)
    status = cuda().cuMemAllocFromPoolAsync(ctypes.byref(address), ctypes.c_size_t(nbytes),
                                            ctypes.c_void_p(_pool(device)), ctypes.c_void_p(stream))
    return address.value if status == 0 else 0


def release(device: int | None = None) -> int:
    """Give the workspace pools' memory back (`device`'s, or every device's that has one), once the
    work queued on that device is done; returns how many pools were trimmed. The pools keep what
    they held between calls otherwise (at most the largest workspace one call took)."""
    trimmed = 0
    for ordinal, pool in list(_pools.items()):
        if device is not None and ordinal != device:
            continue
        lib = cuda()
        with current(ordinal):
            check(lib.cuCtxSynchronize(), "waiting for the GPU before releasing padding workspace")
            check(lib.cuMemPoolTrimTo(ctypes.c_void_p(pool), ctypes.c_size_t(0)), "releasing padding workspace")
        trimmed += 1
    return trimmed


def free(address: int, stream: int) -> None:
    """Give workspace back to its pool once `stream` has done with it."""
    check(cuda().cuMemFreeAsync(ctypes.c_uint64(address), ctypes.c_void_p(stream)), "freeing padding workspace")


def pad(src: int, rows: int, cols: int, ld_src: int, stride_src: int, dst: int, ld_dst: int, stride_dst: int,
        batch: int, device: int, stream: int, round_tf32: bool = False) -> None:
    """dst = src for `batch` matrices of rows x cols (row-major: rows ld apart, matrices `stride`
    floats apart), each float rounded to nearest TF32 with `round_tf32`; nothing for an empty one."""
    if rows <= 0 or cols <= 0 or batch <= 0:
        return
    if ld_src < cols or ld_dst < cols:
        raise ValueError(f"pad: leading dimensions {ld_src}, {ld_dst} below {cols}")
    values = (src, rows, cols, ld_src, stride_src, dst, ld_dst, stride_dst, batch)
    _KERNELS.launch(device, int(bool(round_tf32)), grid(rows, cols, batch), (THREADS, 1), values, stream,
                    f"launching gemmgen_pad on {batch} x {rows} x {cols}")
