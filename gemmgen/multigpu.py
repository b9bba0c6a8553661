"""One GEMM split over several GPUs: C cut into bands of rows (or columns), one band per device.

Each device gets its band of A (or B) and all of the other input, copied from where the inputs
live (peer to peer where the GPUs allow it), runs the kernel on its own stream, and its band of C
is gathered back. Nothing is written to the caller's C unless every device finished: a device that
fails mid-run raises MultiGpuError naming it, and no partial result is presented as whole.

Everything that touches a device goes through a DeviceLayer (CuPy and the gemmgen runtime here),
so the splitting and gathering logic can be tested on the CPU with a fake layer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from .plan import Plan


class MultiGpuError(RuntimeError):
    """A device failed during a split GEMM; the caller's C was not written."""


@dataclass(frozen=True)
class Part:
    """The band of C one device computes: rows [start, stop) (axis 0) or columns (axis 1)."""

    device: int
    axis: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def partition(M: int, N: int, devices: list[int], plan: Plan) -> list[Part]:
    """Bands along the longer side of C, each a whole number of block tiles where possible."""
    if not devices:
        raise ValueError("no devices to split over")
    axis = 0 if M >= N else 1
    length, tile = (M, plan.BM) if axis == 0 else (N, plan.BN)
    tiles = -(-length // tile) if length else 0
    parts, start = [], 0
    for index, device in enumerate(devices):
        share = tiles // len(devices) + (1 if index < tiles % len(devices) else 0)
        stop = min(length, start + share * tile)
        parts.append(Part(device, axis, start, stop))
        start = stop
    return parts


class DeviceLayer(Protocol):
    """What a split GEMM needs from the devices."""

    def place(self, device: int, array: Any, layout: str) -> Any: ...
    def stream(self, device: int) -> Any: ...
    def launch(self, device: int, plan: Plan, a: Any, b: Any, c: Any, alpha: float, beta: float,
               stream: Any) -> None: ...
    def start_timer(self, device: int, stream: Any) -> Any: ...
    def stop_timer(self, device: int, stream: Any, timer: Any) -> float: ...
    def synchronize(self, device: int) -> None: ...
    def gather(self, target: Any, part: Part, band: Any) -> None: ...


@dataclass
class SplitResult:
    parts: list[Part]
    kernel_ms: dict[int, float] = field(default_factory=dict)   # per part index
    end_to_end_ms: float = 0.0

    @property
    def slowest_kernel_ms(self) -> float:
        return max(self.kernel_ms.values()) if self.kernel_ms else 0.0


def _band(array: Any, part: Part, which: str) -> Any:
    """The slice of A, B or C that a part needs (A rows for row bands, B columns for column bands)."""
    if which == "C":
        return array[part.start:part.stop, :] if part.axis == 0 else array[:, part.start:part.stop]
    if which == "A":
        return array[part.start:part.stop, :] if part.axis == 0 else array
    return array if part.axis == 0 else array[:, part.start:part.stop]


def split_gemm(plan: Plan, A: Any, B: Any, C: Any, *, alpha: float = 1.0, beta: float = 0.0,
               devices: list[int], layer: DeviceLayer | None = None) -> SplitResult:
    """C = alpha A B + beta C over `devices`; C is written only when every device has finished.

    A, B and C are CuPy arrays (on any one GPU) unless another `layer` says otherwise.
    """
    layer = layer or CupyLayer()
    M, K = A.shape
    N = B.shape[1]
    parts = [p for p in partition(M, N, devices, plan) if p.size > 0]
    result = SplitResult(parts)
    layouts = {name: plan.spec[f"layout.{name}"] for name in "ABC"}
    started = time.perf_counter()
    placed, streams, timers = {}, {}, {}
    stage, device = "copying the inputs", parts[0].device if parts else None
    try:
        for index, part in enumerate(parts):
            device = part.device
            streams[index] = layer.stream(device)
            placed[index] = tuple(layer.place(device, _band(x, part, name), layouts[name])
                                  for x, name in ((A, "A"), (B, "B"), (C, "C")))
        # Every copy has landed, whichever stream the copy engine used, before any kernel starts.
        for part in parts:
            device = part.device
            layer.synchronize(device)
        stage = "running the kernel"
        for index, part in enumerate(parts):
            device = part.device
            a, b, c = placed[index]
            timers[index] = layer.start_timer(device, streams[index])
            layer.launch(device, plan, a, b, c, alpha, beta, streams[index])
        stage = "waiting for the results"
        for index, part in enumerate(parts):
            device = part.device
            result.kernel_ms[index] = layer.stop_timer(device, streams[index], timers[index])
            layer.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - any failure: say which device, write nothing
        raise MultiGpuError(f"device {device} failed while {stage}: {exc}; C was not written") from exc
    for index, part in enumerate(parts):
        layer.gather(C, part, placed[index][2])
    result.end_to_end_ms = (time.perf_counter() - started) * 1e3
    return result


class CupyLayer:
    """The real devices: CuPy arrays, gemmgen kernels, one non-blocking stream per device."""

    def __init__(self, compiled=None):
        import cupy
        self.cp = cupy
        self.compiled = compiled
        self.kernels: dict[tuple[int, str], Any] = {}
        self.streams: dict[int, Any] = {}

    def place(self, device: int, array: Any, layout: str) -> Any:
        # The caller's array may still be being written on its device's default stream, which
        # our non-blocking streams do not wait for: finish that first.
        source = getattr(getattr(array, "device", None), "id", None)
        if source is not None:
            with self.cp.cuda.Device(source):
                self.cp.cuda.Device(source).synchronize()
                array = self.cp.ascontiguousarray(array)  # CuPy copies only dense arrays between GPUs
                self.cp.cuda.Device(source).synchronize()
        # On the device's own stream, so that its kernel cannot start before its inputs landed.
        with self.cp.cuda.Device(device), self.stream(device):
            # Always a copy (a peer copy from another GPU): the caller's C is written only by gather.
            local = self.cp.array(array, copy=True)
            return self.cp.ascontiguousarray(local) if layout == "row" else self.cp.asfortranarray(local)

    def stream(self, device: int) -> Any:
        if device not in self.streams:
            with self.cp.cuda.Device(device):
                self.streams[device] = self.cp.cuda.Stream(non_blocking=True)
        return self.streams[device]

    def kernel(self, device: int, plan: Plan):
        from .runtime import Kernel
        key = (device, plan.name)
        if key not in self.kernels:
            self.kernels[key] = Kernel(plan, self.compiled, device=device)
        return self.kernels[key]

    def launch(self, device, plan, a, b, c, alpha, beta, stream) -> None:
        with self.cp.cuda.Device(device):
            self.kernel(device, plan)(a, b, c, alpha=alpha, beta=beta, stream=stream)

    def start_timer(self, device, stream):
        with self.cp.cuda.Device(device):
            start, end = self.cp.cuda.Event(), self.cp.cuda.Event()
            start.record(stream)
            return start, end

    def stop_timer(self, device, stream, timer) -> float:
        start, end = timer
        with self.cp.cuda.Device(device):
            end.record(stream)
            end.synchronize()
            return self.cp.cuda.get_elapsed_time(start, end)

    def synchronize(self, device: int) -> None:
        with self.cp.cuda.Device(device):
            self.cp.cuda.Device(device).synchronize()

    def gather(self, target, part: Part, band) -> None:
        with self.cp.cuda.Device(target.device.id):
            _band(target, part, "C")[...] = self.cp.asarray(band)
            self.cp.cuda.Device(target.device.id).synchronize()


@dataclass
class ScalingReport:
    devices: list[int]
    M: int
    N: int
    K: int
    one_gpu_ms: float
    split: SplitResult

    @property
    def flops(self) -> float:
        return 2.0 * self.M * self.N * self.K

    @property
    def one_gpu_tflops(self) -> float:
        return self.flops / (self.one_gpu_ms * 1e-3) / 1e12

    @property
    def kernel_tflops(self) -> float:
        """All devices together, limited by the slowest one's kernel."""
        return self.flops / (self.split.slowest_kernel_ms * 1e-3) / 1e12

    @property
    def end_to_end_tflops(self) -> float:
        return self.flops / (self.split.end_to_end_ms * 1e-3) / 1e12

    @property
    def efficiency(self) -> float:
        """Kernel throughput over N times the one-GPU kernel throughput (1.0 is perfect)."""
        return self.kernel_tflops / (len(self.devices) * self.one_gpu_tflops)


def parse_devices(text: str, available: int) -> list[int]:
    """'all' or '0,1,...' (repeats allowed: '0,0' splits into two parts on one GPU)."""
    if text == "all":
        if available < 1:
            raise ValueError("no CUDA device found")
        return list(range(available))
    try:
        devices = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"bad device list {text!r}: 'all' or comma-separated ordinals like 0,1") from None
    bad = [d for d in devices if not 0 <= d < available]
    if bad or not devices:
        raise ValueError(f"device(s) {bad or text} not present: this machine has {available} "
                         f"(ordinals 0 to {available - 1})")
    return devices


def measure_scaling(plan: Plan, M: int, N: int, K: int, devices: list[int], *, runs: int = 3,
                    compiled=None) -> tuple[ScalingReport, float]:
    """Time one GPU on the whole problem and the split over `devices` (median of `runs`), after
    checking the split result against float64; returns the report and the worst error ratio."""
    import cupy as cp

    from .bench import time_gpu
    from .verify import tolerance

    layer = CupyLayer(compiled)
    home = devices[0]
    with cp.cuda.Device(home):
        rng = cp.random.default_rng(M * 31 + N * 17 + K)
        A = rng.uniform(-1, 1, (M, K), dtype=cp.float32)
        B = rng.uniform(-1, 1, (K, N), dtype=cp.float32)
        C = cp.full((M, N), cp.nan, dtype=cp.float32)
        # Check first: the split result against float64, every element written.
        split_gemm(plan, A, B, C, devices=devices, layer=layer)
        reference = A.astype(cp.float64) @ B.astype(cp.float64)
        scale = cp.abs(A).astype(cp.float64) @ cp.abs(B).astype(cp.float64)
        ratio = cp.abs(C.astype(cp.float64) - reference) / tolerance(scale, K)
        worst = float(cp.nan_to_num(ratio, nan=cp.inf).max())
        del reference, scale, ratio
        kernel = layer.kernel(home, plan)
        whole = lambda: kernel(A, B, C)  # noqa: E731
        one_gpu = time_gpu(whole, budget_s=0.2, min_runs=runs).median_ms
    results = [split_gemm(plan, A, B, C, devices=devices, layer=layer) for _ in range(runs + 1)][1:]
    results.sort(key=lambda r: r.slowest_kernel_ms)
    median = results[len(results) // 2]
    median.end_to_end_ms = sorted(r.end_to_end_ms for r in results)[len(results) // 2]
    return ScalingReport(devices, M, N, K, one_gpu, median), worst
