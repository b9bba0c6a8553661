"""The DeviceLayer of split.py on real GPUs: CuPy's memory, streams and events and the CUDA runtime's
2-D and peer copies (CupyLayer)."""

from __future__ import annotations

import threading
from typing import Any

from ..gpu import runtime
from ..gpu.runtime import as_matrix
from ..plan import Plan
from .parts import FLOAT_BYTES, Region
from .prepared import PreparedCache

# --- CuPy and the CUDA runtime --------------------------------------------------------------------

class CupyLayer:
    """The real devices: CuPy buffers, non-blocking streams per device and role, CUDA events,
    2-D copies through cudaMemcpy2DAsync (peer to peer where the GPUs allow it). Kernels, streams
    and buffers are made on the calling thread when a split is prepared; the device threads then
    only copy, launch, record, wait and synchronize (CuPy's current device is per thread, so each
    call names its device)."""

    MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction (and peer copies) from unified addresses

    def __init__(self, compiled=None):
        import cupy
        self.cp = cupy
        self.compiled = compiled
        self.kernels: dict[tuple[int, str], Any] = {}
        self.streams: dict[tuple[int, str], Any] = {}
        self.buffers: dict[int, Any] = {}
        self.peers: set[tuple[int, int]] = set()
        self._peers_lock = threading.Lock()  # device threads copy at once
        self.prepared = PreparedCache()  # split_gemm's prepared splits of this layer

    def device_count(self) -> int:
        return runtime.device_count()

    def locate(self, array: Any, layout: str, what: str) -> Region:
        """The array as a Region. (The caller may still be writing it on a stream of its own, which
        ours do not wait for: a split drains each operand's device once before it starts.)"""
        m = as_matrix(array, what, layout)
        device = self.cp.cuda.runtime.pointerGetAttributes(m.ptr).device if m.ptr else 0
        return Region(device, m.ptr, m.rows, m.cols, m.layout, m.ld)

    def device_of(self, array: Any) -> int:
        interface = getattr(array, "__cuda_array_interface__", None)
        if interface is None:
            return self.cp.asarray(array).device.id  # DLPack, through CuPy
        ptr = interface["data"][0]
        return self.cp.cuda.runtime.pointerGetAttributes(ptr).device if ptr else 0

    def allocate(self, device: int, rows: int, cols: int, layout: str) -> Region:
        with self.cp.cuda.Device(device):
            array = self.cp.empty((rows, cols), self.cp.float32, order="C" if layout == "row" else "F")
        ptr = array.data.ptr
        self.buffers[ptr] = array  # alive as long as this layer, i.e. the split
        return Region(device, ptr, rows, cols, layout, max(1, cols if layout == "row" else rows))

    def hand_over(self, region: Region) -> Any:
        return self.buffers.pop(region.ptr)  # the caller's array now keeps the memory

    def free(self, region: Region) -> None:
        self.buffers.pop(region.ptr, None)  # back to CuPy's pool when nothing else holds it

    def kernel(self, device: int, plan: Plan):
        key = (device, plan.name)
        if key not in self.kernels:
            self.kernels[key] = runtime.Kernel(plan, self.compiled, device=device)
        return self.kernels[key]

    def stream(self, device: int, role: str) -> Any:
        if (device, role) not in self.streams:
            with self.cp.cuda.Device(device):
                self.streams[device, role] = self.cp.cuda.Stream(non_blocking=True)
        return self.streams[device, role]

    def event(self, device: int) -> Any:
        with self.cp.cuda.Device(device):
            return self.cp.cuda.Event()

    def record(self, device: int, stream: Any, event: Any = None) -> Any:
        with self.cp.cuda.Device(device):
            if event is None:
                event = self.cp.cuda.Event()
            event.record(stream)
            return event

    def wait(self, device: int, stream: Any, event: Any) -> None:
        with self.cp.cuda.Device(device):
            stream.wait_event(event)

    def _peer(self, dst: int, src: int) -> None:
        if dst == src or ((dst, src) in self.peers and (src, dst) in self.peers):
            return
        runtime = self.cp.cuda.runtime
        with self._peers_lock:
            for a, b in ((dst, src), (src, dst)):
                if (a, b) not in self.peers:
                    self.peers.add((a, b))
                    if runtime.deviceCanAccessPeer(a, b):
                        with self.cp.cuda.Device(a):
                            try:
                                runtime.deviceEnablePeerAccess(b)
                            except runtime.CUDARuntimeError:
                                pass  # already enabled
                    # Without peer access the driver stages the copy through the host.

    def copy(self, dst: Region, src: Region, stream: Any) -> None:
        if (dst.rows, dst.cols, dst.layout) != (src.rows, src.cols, src.layout):
            raise ValueError(f"copy between a {src.rows} x {src.cols} {src.layout}-major block and a "
                             f"{dst.rows} x {dst.cols} {dst.layout}-major one")
        if dst.rows == 0 or dst.cols == 0:
            return
        self._peer(dst.device, src.device)
        lines, length = (src.rows, src.cols) if src.layout == "row" else (src.cols, src.rows)
        with self.cp.cuda.Device(dst.device):
            self.cp.cuda.runtime.memcpy2DAsync(dst.ptr, FLOAT_BYTES * dst.ld, src.ptr, FLOAT_BYTES * src.ld,
                                               FLOAT_BYTES * length, lines, self.MEMCPY_DEFAULT, stream.ptr)

    def _view(self, region: Region) -> Any:
        cp = self.cp
        lines, length = (region.rows, region.cols) if region.layout == "row" else (region.cols, region.rows)
        extent = FLOAT_BYTES * ((lines - 1) * region.ld + length)
        memory = cp.cuda.UnownedMemory(region.ptr, extent, self, region.device)
        strides = ((FLOAT_BYTES * region.ld, FLOAT_BYTES) if region.layout == "row"
                   else (FLOAT_BYTES, FLOAT_BYTES * region.ld))
        return cp.ndarray((region.rows, region.cols), cp.float32, cp.cuda.MemoryPointer(memory, 0),
                          strides=strides)

    def accumulate(self, dst: Region, src: Region, stream: Any) -> None:
        with self.cp.cuda.Device(dst.device), stream:
            target = self._view(dst)
            target += self._view(src)

    def copy_batch(self, dst: Region, dst_stride: int, src: Region, src_stride: int, count: int, stream) -> None:
        """`count` matrices, `src_stride` and `dst_stride` floats apart: one 2-D copy (a matrix per
        line) where each matrix is dense at both ends, else a copy per matrix."""
        lines, length = (src.rows, src.cols) if src.layout == "row" else (src.cols, src.rows)
        size = lines * length
        if count == 1 or not (src.ld == dst.ld == length and min(src_stride, dst_stride) >= size):
            for index in range(count):
                self.copy(dst.shifted(index * dst_stride), src.shifted(index * src_stride), stream)
            return
        if (dst.rows, dst.cols, dst.layout) != (src.rows, src.cols, src.layout):
            raise ValueError("copy between batches of matrices of other sizes or layouts")
        if size == 0:
            return
        self._peer(dst.device, src.device)
        with self.cp.cuda.Device(dst.device):
            self.cp.cuda.runtime.memcpy2DAsync(dst.ptr, FLOAT_BYTES * dst_stride, src.ptr, FLOAT_BYTES * src_stride,
                                               FLOAT_BYTES * size, count, self.MEMCPY_DEFAULT, stream.ptr)

    def launch(self, kernel, M, N, K, alpha, a: Region, b: Region, beta, c: Region, stream, *, batch: int = 1,
               strides: tuple[int, int, int] = (0, 0, 0)) -> None:
        with self.cp.cuda.Device(c.device):
            if batch == 1:
                kernel.launch(M, N, K, alpha, a.ptr, a.ld, b.ptr, b.ld, beta, c.ptr, c.ld, stream=stream)
            else:
                kernel.launch(M, N, K, alpha, a.ptr, a.ld, b.ptr, b.ld, beta, c.ptr, c.ld, stream=stream,
                              batch=batch, strides=strides)

    def elapsed_ms(self, start, end) -> float:
        return self.cp.cuda.get_elapsed_time(start, end)

    def synchronize(self, device: int) -> None:
        """Wait for what this layer queued on the device, its own streams (on 4 H200s a whole-device
        synchronize cost 0.04 ms a device more)."""
        with self.cp.cuda.Device(device):
            for (owner, _), stream in list(self.streams.items()):
                if owner == device:
                    stream.synchronize()

    def drain(self, device: int) -> None:
        """Wait for everything on the device, the caller's streams too."""
        with self.cp.cuda.Device(device):
            self.cp.cuda.Device(device).synchronize()
