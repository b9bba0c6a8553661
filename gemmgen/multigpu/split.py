"""One GEMM split over several GPUs, the copies overlapping the kernels; or shards already in place.

`split_gemm` cuts C = alpha A B + beta C into parts, one per device, along whichever dimension
moves the fewest bytes between devices among those that balance the work (parts.py's `choose_axis`;
the byte model is `split_traffic`):

- rows of C (axis 0): each device needs its band of A's rows and all of B;
- columns of C (axis 1): its band of B's columns and all of A;
- K (axis 2): a slab of A's columns and of B's rows; each device computes a partial C of full
  size, and the partials are summed on C's device, beta applied once. Best when M·N is small and
  K large.

Each part runs as a schedule of steps (`schedule`): its first block of C is cut along K (later
pieces accumulate with beta = 1), so its first kernel waits only for a thin slice of the inputs;
the rest of the part's output blocks stream their inputs in while earlier blocks compute, and each
finished block goes back while the next one computes. Copies run on a copy stream, kernels on a
compute stream and gathers on a third, ordered by events. Every operand keeps the layout the kernel
was built for (A, B and C row- or column-major): regions move as 2-D copies with their leading
dimensions, and an operand already on a part's device is used where it is.

With beta != 0 nothing is written to the caller's C unless every device finished: results land
in a staging matrix on C's device, copied into C at the end. With beta = 0 (C's old values no
input) the devices write C itself, sparing that copy (0.45 ms of a 5 ms split at 8192^3 on two
H200s). A device that fails raises MultiGpuError naming it. Repeated calls of one shape are
balanced if the caller asks (`Balance`): a device that starts late or runs slower takes less.
`resident_gemm` is the case with nothing to move: each device multiplies the shards it holds.

What runs on a device is anything with the C ABI's `launch(M, N, K, alpha, A, lda, B, ldb, beta,
C, ldc, stream=...)` and a `layouts` dict ({"A": "row" | "col", "B": ..., "C": ...}): a gemmgen
Kernel, a library's dispatcher; or a Plan, which the layer compiles for each device. Everything
that touches a device goes through a DeviceLayer (CuPy and the CUDA runtime in cupy_layer.py), so the
planning, the schedules and their event ordering are tested on the CPU with a fake layer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Protocol

from ..plan import Plan
from .cupy_layer import CupyLayer
from .parts import Balance, Part, Region, Span, _owner, choose_axis, make_parts, schedule

DEFAULT_CHUNKS = 4


class MultiGpuError(RuntimeError):
    """A device failed during a split GEMM; with beta != 0 the caller's C was not written."""


class Launcher(Protocol):
    """What a split launches on each device: a gemmgen Kernel, a library, anything alike."""

    layouts: dict[str, str]

    def launch(self, M: int, N: int, K: int, alpha: float, A: int, lda: int, B: int, ldb: int,
               beta: float, C: int, ldc: int, *, stream: Any = None) -> None: ...


# --- the devices ----------------------------------------------------------------------------------

class DeviceLayer(Protocol):
    """What a split GEMM needs from the devices. Streams, events and copies are asynchronous;
    `synchronize` waits for a device's work and raises if any of it failed."""

    def locate(self, array: Any, layout: str, what: str) -> Region: ...
    def device_of(self, array: Any) -> int: ...
    def allocate(self, device: int, rows: int, cols: int, layout: str) -> Region: ...
    def hand_over(self, region: Region) -> Any: ...   # an allocated buffer as the caller's array
    def free(self, region: Region) -> None: ...
    def kernel(self, device: int, plan: Plan) -> Launcher: ...
    def stream(self, device: int, role: str) -> Any: ...
    def record(self, device: int, stream: Any) -> Any: ...
    def wait(self, device: int, stream: Any, event: Any) -> None: ...
    def copy(self, dst: Region, src: Region, stream: Any) -> None: ...
    def accumulate(self, dst: Region, src: Region, stream: Any) -> None: ...
    def launch(self, kernel: Launcher, M: int, N: int, K: int, alpha: float, a: Region, b: Region,
               beta: float, c: Region, stream: Any) -> None: ...
    def elapsed_ms(self, start: Any, end: Any) -> float: ...
    def synchronize(self, device: int) -> None: ...


def _kernels(kernels: Plan | Callable[[int], Launcher], layer: DeviceLayer) -> Callable[[int], Launcher]:
    if isinstance(kernels, Plan):
        if kernels.reduce_count:
            raise ValueError(f"{kernels.name} fuses 'reduce min', which needs every entry of C on one "
                             "device: it cannot be split")
        return lambda device: layer.kernel(device, kernels)
    return kernels


def _accumulates(kernel: Launcher) -> bool:
    """Whether the kernel reads C (beta), so that a K piece can add to the one before."""
    plan = getattr(kernel, "plan", None)
    return getattr(plan, "beta", True)


def _granule(kernel: Launcher) -> tuple[int, int, int]:
    """Band and chunk sizes along M, N and K: whole tiles of the kernel where it has a plan (K in
    multiples of 32 at least, which keep every slab's address 16-byte aligned), else 128."""
    plan = getattr(kernel, "plan", None)
    if plan is None:
        return 128, 128, 128
    return plan.BM, plan.BN, max(32, plan.BK)


@dataclass
class SplitResult:
    parts: list[Part]
    axis: int = 0
    kernel_ms: dict[int, float] = field(default_factory=dict)   # per part index: its kernels' time
    span_ms: dict[int, float] = field(default_factory=dict)     # per part: call start to its C back
    end_to_end_ms: float = 0.0
    bytes_moved: int = 0            # between devices
    steps: dict[int, int] = field(default_factory=dict)          # kernels per part

    @property
    def slowest_kernel_ms(self) -> float:
        return max(self.kernel_ms.values()) if self.kernel_ms else 0.0


class _Failure:
    """Which device and stage a split is at, for the error that names them."""

    def __init__(self):
        self.device, self.stage = None, "planning"

    def at(self, device: int, stage: str) -> None:
        self.device, self.stage = device, stage


def split_gemm(kernels: Plan | Callable[[int], Launcher], A: Any, B: Any, C: Any, *,
               alpha: float = 1.0, beta: float = 0.0, devices: list[int],
               layer: DeviceLayer | None = None, axis: int | None = None,
               chunks: int = DEFAULT_CHUNKS, local_views: bool = True,
               balance: Balance | None = None) -> SplitResult:
    """C = alpha A B + beta C over `devices`. With beta != 0, C is written only once every device
    has finished (results land in a staging C first), so a failure leaves C as it was; with beta =
    0, C's old values are no input and the devices write C itself as their blocks finish (a
    failure raises all the same, C then partly written).

    `kernels` is a Plan (compiled for each device) or a function giving the kernel to launch on
    a device. A, B and C are device arrays (CuPy, PyTorch, ...) in the kernel's layouts, on any
    GPUs; C's device gathers the result. `axis` forces the split (0 rows, 1 columns, 2 K; default:
    the fewest bytes), `chunks` the blocks each part streams in. `local_views=False` copies even
    operands already on a part's device (to exercise the copies on one GPU). `balance=Balance()`
    (kept by the caller across calls) sizes the parts from the calls before of the same shape,
    for GPUs of unequal speed or links; by default the parts are even, which on two H200s over
    NVLink ended sooner in 6 of 8 measured pairs.
    """
    layer = layer or CupyLayer()
    if not devices:
        raise ValueError("no devices to split over")
    kernel_on = _kernels(kernels, layer)
    where = _Failure()
    started = time.perf_counter()
    result = SplitResult([])
    run = None
    try:
        where.at(devices[0], "preparing the kernel")
        first = kernel_on(devices[0])
        layouts = first.layouts
        a, b, c = (layer.locate(x, layouts[n], n) for x, n in ((A, "A"), (B, "B"), (C, "C")))
        M, K, N = a.rows, a.cols, b.cols
        if b.rows != K or (c.rows, c.cols) != (M, N):
            raise ValueError(f"A is {a.rows} x {a.cols}, B {b.rows} x {b.cols} and C {c.rows} x "
                             f"{c.cols}: C must be M x N for A M x K times B K x N")
        if beta != 0 and not _accumulates(first):
            raise ValueError("this kernel does not read C ('epilogue alpha'): beta must be 0")
        if M == 0 or N == 0:
            return result
        granules = _granule(first)
        home = c.device
        if axis is None:
            axis = choose_axis(M, N, K, devices, home, beta != 0, granules) if K else 0
        key = (getattr(first, "name", type(first).__name__), M, N, K, tuple(devices), home, axis,
               beta != 0, chunks, local_views)
        length = (M, N, K)[axis]
        weights = balance.weights(key, len(devices), length) if balance is not None else None
        placed = [(position, p) for position, p in
                  enumerate(make_parts(M, N, K, devices, axis, granules[axis], weights)) if p.size]
        parts = [p for _, p in placed]
        if not parts:  # K = 0 along K: nothing to sum, C = beta C on one device
            parts = [Part(devices[0], 0, 0, M)]
        result = SplitResult(parts, parts[0].axis)
        run = _SplitRun(layer, kernel_on, where, a, b, c, alpha, beta, chunks, local_views,
                        granules, _accumulates(first))
        run.issue(result)
        for device in sorted({p.device for p in parts} | {home}):
            where.at(device, "waiting for the results")
            layer.synchronize(device)
        for index, timers in run.timers.items():
            result.kernel_ms[index] = sum(layer.elapsed_ms(t0, t1) for t0, t1 in timers)
            result.span_ms[index] = layer.elapsed_ms(run.begins[parts[index].device], run.ends[index])
        if balance is not None and placed:
            balance.learn(key, len(devices), [(position, p.size, (result.kernel_ms[i], result.span_ms[i]))
                                              for i, (position, p) in enumerate(placed)])
        if run.staging is not c:
            where.at(home, "writing C")
            layer.copy(c, run.staging, layer.stream(home, "out"))
            layer.synchronize(home)
        run.free()
    except ValueError:
        raise  # arguments that cannot be split (ShapeError included): nothing was started
    except Exception as exc:  # noqa: BLE001 - any failure: say which device, write nothing
        if run is not None:
            run.drain()
        raise MultiGpuError(f"device {where.device} failed while {where.stage}: {exc}; "
                            + ("C was not written" if beta != 0 else "C is partly written (beta = 0: "
                               "its old values were not an input)")) from exc
    result.bytes_moved = run.bytes_moved
    result.end_to_end_ms = (time.perf_counter() - started) * 1e3
    return result


class _SplitRun:
    """The buffers, streams and events of one split GEMM, issued part by part."""

    def __init__(self, layer, kernel_on, where, a, b, c, alpha, beta, chunks, local_views, granules,
                 accumulate):
        self.layer, self.kernel_on, self.where = layer, kernel_on, where
        self.a, self.b, self.c = a, b, c
        self.alpha, self.beta, self.chunks = alpha, beta, chunks
        self.local_views, self.granules, self.accumulate = local_views, granules, accumulate
        self.timers: dict[int, list] = {}
        self.begins: dict[int, Any] = {}   # per device: an event at the start of the call
        self.ends: dict[int, Any] = {}     # per part: an event when its C is complete on C's device
        self.bytes_moved = 0
        self.devices: set[int] = {c.device}
        self.allocated: list[Region] = []
        # With beta = 0 C's old values are no input: the parts write C itself. Otherwise a staging
        # C takes the results, and C is written only once every device has finished.
        where.at(c.device, "allocating the staging C")
        self.staging = c if beta == 0 else self._allocate(c.device, c.rows, c.cols, c.layout)

    def _allocate(self, device: int, rows: int, cols: int, layout: str) -> Region:
        region = self.layer.allocate(device, rows, cols, layout)
        self.allocated.append(region)
        return region

    def free(self) -> None:
        """Give the buffers back, once nothing in flight uses them."""
        for region in self.allocated:
            self.layer.free(region)
        self.allocated = []

    def _copy(self, dst: Region, src: Region, stream) -> None:
        self.layer.copy(dst, src, stream)
        if dst.device != src.device:
            self.bytes_moved += dst.nbytes

    def _local(self, operand: Region, device: int) -> bool:
        return self.local_views and operand.device == device

    def issue(self, result: SplitResult) -> None:
        layer, home = self.layer, self.c.device
        M, K, N = self.a.rows, self.a.cols, self.b.cols
        parts = result.parts
        owner = _owner(parts, home)
        reduction = layer.stream(home, "compute")
        pending = []   # (event, partial) the reduction waits for and adds; partial None: just wait
        # Everything the host must prepare first (kernels, which a first call compiles or loads;
        # buffers), so that the start event of each device marks when its work can begin.
        prepared = []
        for index, part in enumerate(parts):
            device = part.device
            self.devices.add(device)
            self.where.at(device, "preparing the kernel")
            kernel = self.kernel_on(device)
            self.where.at(device, "allocating its buffers")
            rows, cols, ks = self._extent(part, M, N, K)
            bufs = {"A": self._operand(self.a, device, rows, ks),
                    "B": self._operand(self.b, device, ks, cols)}
            part_beta = self.beta if part.axis != 2 or index == owner else 0.0
            # The part writes straight into the staging C where it can: on C's device, and, for
            # a K split, as the part that applies beta (the others' partials are added to it).
            into_staging = device == home and self.local_views and (part.axis != 2 or index == owner)
            partial = part.axis == 2 and index != owner
            if into_staging:
                bufs["C"] = (self.staging, (0, 0))
            else:
                bufs["C"] = (self._allocate(device, rows[1] - rows[0], cols[1] - cols[0], self.c.layout),
                             (rows[0], cols[0]))
            steps = schedule(part, M, N, K, beta=part_beta, copy_a=bufs["A"][0] is not self.a,
                             copy_b=bufs["B"][0] is not self.b, chunks=self.chunks,
                             granule=self.granules[1 - part.axis] if part.axis < 2 else self.granules[2],
                             k_granule=self.granules[2], accumulate=self.accumulate,
                             gather=not into_staging)
            result.steps[index] = len(steps)
            target = None
            if partial:  # summed into the staging C on `home` once it is there
                self.where.at(home, "allocating a partial C")
                target = self._allocate(home, M, N, self.c.layout)
            prepared.append((kernel, bufs, steps, into_staging, partial, target))
        for device in dict.fromkeys(p.device for p in parts):  # a common start, before any work
            self.begins[device] = layer.record(device, layer.stream(device, "in"))
        for index, (part, (kernel, bufs, steps, into_staging, partial, target)) in enumerate(zip(parts, prepared)):
            device = part.device
            self.timers[index] = []
            copies, compute, out = (layer.stream(device, role) for role in ("in", "compute", "out"))
            for step in steps:
                self.where.at(device, "copying its inputs")
                copied = False
                for name, block, source in (("A", step.copy_a, self.a), ("B", step.copy_b, self.b),
                                            ("C", step.copy_c, self.c)):
                    if block is not None:
                        self._copy(self._in(bufs[name], *block), source.sub(*block), copies)
                        copied = True
                if copied:
                    layer.wait(device, compute, layer.record(device, copies))
                self.where.at(device, "running the kernel")
                a = self._in(bufs["A"], step.rows, step.ks)
                b = self._in(bufs["B"], step.ks, step.cols)
                c = self._in(bufs["C"], step.rows, step.cols)
                start = layer.record(device, compute)
                layer.launch(kernel, c.rows, c.cols, a.cols, self.alpha, a, b, step.beta, c, compute)
                self.timers[index].append((start, layer.record(device, compute)))
                if step.gather is not None:
                    self.where.at(device, "sending its C back")
                    layer.wait(device, out, layer.record(device, compute))
                    dst = (target if partial else self.staging).sub(*step.gather)
                    self._copy(dst, self._in(bufs["C"], *step.gather), out)
                    pending.append((layer.record(device, out), target if partial else None))
                    self.ends[index] = pending[-1][0]
            if into_staging:
                pending.append((layer.record(device, compute), None))
                self.ends[index] = pending[-1][0]
        self.where.at(home, "summing the partial products")
        for event, partial in pending:
            layer.wait(home, reduction, event)
        for event, partial in pending:
            if partial is not None:
                layer.accumulate(self.staging, partial, reduction)
        # The final copy into C (on home's "out" stream) waits for everything that wrote staging.
        layer.wait(home, layer.stream(home, "out"), layer.record(home, reduction))

    @staticmethod
    def _extent(part: Part, M: int, N: int, K: int) -> tuple[Span, Span, Span]:
        """Rows and columns of C and the K range a part covers."""
        span = (part.start, part.stop)
        return ((span, (0, N), (0, K)), ((0, M), span, (0, K)), ((0, M), (0, N), span))[part.axis]

    def _operand(self, operand: Region, device: int, rows: Span, cols: Span):
        """The operand itself where it is on the device, else a buffer for the part's block of it;
        with the global (row, col) at which the buffer starts."""
        if self._local(operand, device):
            return operand, (0, 0)
        return self._allocate(device, rows[1] - rows[0], cols[1] - cols[0], operand.layout), (rows[0], cols[0])

    @staticmethod
    def _in(buffer, rows: Span, cols: Span) -> Region:
        region, (r0, c0) = buffer
        return region.sub((rows[0] - r0, rows[1] - r0), (cols[0] - c0, cols[1] - c0))

    def drain(self) -> None:
        """After a failure: let whatever is still in flight finish before buffers are freed."""
        for device in self.devices:
            try:
                self.layer.synchronize(device)
            except Exception:  # noqa: BLE001 - the failure being reported is the one that matters
                pass
        self.free()


# --- shards already on their devices ---------------------------------------------------------------

class Shard(NamedTuple):
    """One device's operands, already on it: C = alpha A B + beta C there (C made when None)."""

    A: Any
    B: Any
    C: Any = None


@dataclass
class ResidentResult:
    bands: list[Any]                 # each shard's C, on its device
    kernel_ms: list[float]
    end_to_end_ms: float

    @property
    def slowest_kernel_ms(self) -> float:
        return max(self.kernel_ms, default=0.0)


def resident_gemm(kernels: Plan | Callable[[int], Launcher], shards: list[Shard], *,
                  alpha: float = 1.0, beta: float = 0.0,
                  layer: DeviceLayer | None = None) -> ResidentResult:
    """Each shard's C = alpha A B + beta C on the device that holds its A, with no copies: the
    shards are, say, bands of A's rows with B on every device (giving bands of C's rows), or bands
    of B's columns with A everywhere. Every kernel is launched before any is waited for."""
    layer = layer or CupyLayer()
    kernel_on = _kernels(kernels, layer)
    where = _Failure()
    started = time.perf_counter()
    bands, timers, devices, ready = [], [], [], []
    try:
        for shard in shards:  # everything the host must check and prepare, before any launch
            where.at(None, "reading a shard")
            device = layer.device_of(shard.A)  # its kernel then says the layouts the shard must have
            where.at(device, "preparing the kernel")
            kernel = kernel_on(device)
            layouts = kernel.layouts
            a, b = layer.locate(shard.A, layouts["A"], "A"), layer.locate(shard.B, layouts["B"], "B")
            if shard.C is None:
                if beta != 0:
                    raise ValueError("beta is not 0 but a shard has no C to read")
                c = layer.allocate(device, a.rows, b.cols, layouts["C"])
                bands.append(layer.hand_over(c))
            else:
                c = layer.locate(shard.C, layouts["C"], "C")
                bands.append(shard.C)
            for region, name in ((b, "B"), (c, "C")):
                if region.device != device:
                    raise ValueError(f"a shard's {name} is on device {region.device} and its A on "
                                     f"{device}: resident_gemm moves nothing, so each shard lives on one device")
            if b.rows != a.cols or (c.rows, c.cols) != (a.rows, b.cols):
                raise ValueError(f"a shard on device {device}: A {a.rows} x {a.cols}, B {b.rows} x "
                                 f"{b.cols}, C {c.rows} x {c.cols} do not multiply")
            ready.append((device, kernel, a, b, c, layer.stream(device, "compute")))
        for device, kernel, a, b, c, compute in ready:  # then every launch, back to back
            where.at(device, "running the kernel")
            start = layer.record(device, compute)
            layer.launch(kernel, a.rows, b.cols, a.cols, alpha, a, b, beta, c, compute)
            timers.append((start, layer.record(device, compute)))
            devices.append(device)
        for device in sorted(set(devices)):
            where.at(device, "waiting for the results")
            layer.synchronize(device)
        kernel_ms = [layer.elapsed_ms(t0, t1) for t0, t1 in timers]
    except ValueError:
        raise  # shards that do not multiply, or not on one device each
    except Exception as exc:  # noqa: BLE001
        raise MultiGpuError(f"device {where.device} failed while {where.stage}: {exc}") from exc
    return ResidentResult(bands, kernel_ms, (time.perf_counter() - started) * 1e3)
