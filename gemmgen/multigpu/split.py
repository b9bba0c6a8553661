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

The host's share is held small: the parts, buffers, steps and events of a call key are prepared
once and kept by the layer (prepared.py), and a call only issues the devices' steps, in rounds of
one step per device from the calling thread (fanout.py), so that every device's first kernel is
queued within the first round. A block that several parts need is relayed from part to part
rather than sent from its device to each (prepared.py).

With beta != 0 nothing is written to the caller's C unless every device finished: results land
in a staging matrix on C's device, copied into C at the end. With beta = 0 (C's old values no
input) the devices write C itself, sparing that copy (0.45 ms of a 5 ms split at 8192^3 on two
H200s). A device that fails raises MultiGpuError naming it. Repeated calls of one shape are
balanced if the caller asks (`Balance`): a device that starts late or runs slower takes less.
`resident_gemm` is the case with nothing to move: each device multiplies the shards it holds.

Batched calls split by batch instead, whole matrices per device (batched.py).

What runs on a device is anything with the C ABI's `launch(M, N, K, alpha, A, lda, B, ldb, beta,
C, ldc, stream=...)` and a `layouts` dict ({"A": "row" | "col", "B": ..., "C": ...}): a gemmgen
Kernel, a library's LibraryRuntime (gemmgen.matmul(..., devices=...)); or a Plan, which the layer
compiles for each device. A launcher's `plan`, where it has one, gives the tiles the parts are cut
in. Everything that touches a device goes through a DeviceLayer (CuPy and the CUDA runtime in
cupy_layer.py), so the planning, the schedules and their event ordering are tested on the CPU
with a fake layer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Protocol, Sequence

from ..plan import Plan
from .cupy_layer import CupyLayer
from .parts import Balance, Part, Region, choose_axis, make_parts
from .prepared import PreparedCache, PreparedSplit, SplitCall
from .fanout import Fanout

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
    `synchronize` waits for the work the layer queued on a device and raises if any of it failed;
    `drain` waits for all of a device's work, its caller's too. `prepared` (a PreparedCache) keeps
    the layer's prepared splits; a layer without one prepares every call. A layer may also have
    `copy_batch(dst, dst_stride, src, src_stride, count, stream)`, a batch of matrices in one copy
    (batched.py copies them one by one otherwise). Its methods are called from the thread that
    calls the split."""

    prepared: PreparedCache

    def locate(self, array: Any, layout: str, what: str) -> Region: ...
    def device_of(self, array: Any) -> int: ...
    def device_count(self) -> int: ...
    def allocate(self, device: int, rows: int, cols: int, layout: str) -> Region: ...
    def hand_over(self, region: Region) -> Any: ...   # an allocated buffer as the caller's array
    def free(self, region: Region) -> None: ...
    def kernel(self, device: int, plan: Plan) -> Launcher: ...
    def stream(self, device: int, role: str) -> Any: ...
    def event(self, device: int) -> Any: ...   # a CUDA event (timing on), recorded again at each use
    def record(self, device: int, stream: Any, event: Any = None) -> Any: ...  # `event` or a new one
    def wait(self, device: int, stream: Any, event: Any) -> None: ...
    def copy(self, dst: Region, src: Region, stream: Any) -> None: ...
    def accumulate(self, dst: Region, src: Region, stream: Any) -> None: ...
    def launch(self, kernel: Launcher, M: int, N: int, K: int, alpha: float, a: Region, b: Region,
               beta: float, c: Region, stream: Any, *, batch: int = 1,
               strides: tuple[int, int, int] = (0, 0, 0)) -> None: ...
    def elapsed_ms(self, start: Any, end: Any) -> float: ...
    def synchronize(self, device: int) -> None: ...
    def drain(self, device: int) -> None: ...


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
    issue_ms: float = 0.0           # host time issuing the devices' steps

    @property
    def slowest_kernel_ms(self) -> float:
        return max(self.kernel_ms.values()) if self.kernel_ms else 0.0


class Failure:
    """Which device and stage a split is at, for the error that names them."""

    def __init__(self):
        self.device, self.stage = None, "planning"

    def at(self, device: int, stage: str) -> None:
        self.device, self.stage = device, stage


def default_layer() -> DeviceLayer:
    """The process's CuPy layer, made on first use: its streams, kernels and prepared splits serve
    every split_gemm and resident_gemm called without a layer."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = CupyLayer()
    return _DEFAULT


_DEFAULT: DeviceLayer | None = None


def release(layer: DeviceLayer | None = None) -> None:
    """Free the buffers a layer's prepared splits hold (the default layer's when None); later
    calls prepare again."""
    cache = getattr(layer or _DEFAULT, "prepared", None)
    if cache is not None:
        cache.release()


def resolve_devices(devices: str | Sequence[int], available: int) -> list[int]:
    """The devices a user names: "all", "0,1,..." or a sequence of ordinals (repeats allowed: [0, 0]
    splits into two parts on one GPU), each checked against the `available` count."""
    if isinstance(devices, str):
        if devices == "all":
            if available < 1:
                raise ValueError("no CUDA device found")
            return list(range(available))
        try:
            chosen = [int(x) for x in devices.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"bad device list {devices!r}: 'all' or comma-separated ordinals like 0,1") from None
    else:
        chosen = list(devices)
        if any(isinstance(d, bool) or not isinstance(d, int) for d in chosen):
            raise ValueError(f"devices {devices!r}: 'all' or a list of device ordinals like [0, 1]")
    bad = [d for d in chosen if not 0 <= d < available]
    if bad or not chosen:
        raise ValueError(f"device(s) {bad or devices} not present: this machine has {available} "
                         f"(ordinals 0 to {available - 1})")
    return chosen


def _plan(M: int, N: int, K: int, devices: list[int], home: int, beta_used: bool, granules, axis,
          weights=None) -> tuple[int, list[tuple[int, Part]]]:
    """The axis and the non-empty parts, with their positions among the devices."""
    if axis is None:
        axis = choose_axis(M, N, K, devices, home, beta_used, granules) if K else 0
    placed = [(position, p) for position, p in
              enumerate(make_parts(M, N, K, devices, axis, granules[axis], weights)) if p.size]
    if not placed:  # K = 0 along K: nothing to sum, C = beta C on one device
        placed = [(0, Part(devices[0], 0, 0, M))]
    return axis, placed


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
    GPUs, or Regions (a device address with its size, layout and leading dimension); C's device
    gathers the result. `axis` forces the split (0 rows, 1 columns, 2 K; default:
    the fewest bytes), `chunks` the blocks each part streams in. `local_views=False` copies even
    operands already on a part's device (to exercise the copies on one GPU). `balance=Balance()`
    (kept by the caller across calls) sizes the parts from the calls before of the same shape,
    for GPUs of unequal speed or links; by default the parts are even, which on two H200s over
    NVLink ended sooner in 6 of 8 measured pairs.

    The first call of a key (kernel, sizes, leading dimensions, devices of A, B and C, `devices`,
    axis, beta != 0, chunks) prepares the split: parts, buffers, steps and events (prepared.py),
    kept by the layer for the next calls; the devices' shares are issued from the calling thread in
    rounds of one step per device, then waited for (fanout.py). With a balance, the sizes are
    worked out anew each call.
    """
    layer = layer or default_layer()
    if not devices:
        raise ValueError("no devices to split over")
    kernel_on = _kernels(kernels, layer)
    where = Failure()
    started = time.perf_counter()
    cache = getattr(layer, "prepared", None)
    key = prepared = None
    try:
        where.at(devices[0], "preparing the kernel")
        first = kernel_on(devices[0])
        layouts = first.layouts
        a, b, c = (x if isinstance(x, Region) else layer.locate(x, layouts[n], n)
                   for x, n in ((A, "A"), (B, "B"), (C, "C")))
        for device in sorted({a.device, b.device, c.device}):
            layer.drain(device)  # the caller may still be writing them on a stream of its own
        M, K, N = a.rows, a.cols, b.cols
        if b.rows != K or (c.rows, c.cols) != (M, N):
            raise ValueError(f"A is {a.rows} x {a.cols}, B {b.rows} x {b.cols} and C {c.rows} x "
                             f"{c.cols}: C must be M x N for A M x K times B K x N")
        beta_used = beta != 0
        if beta_used and not _accumulates(first):
            raise ValueError("this kernel does not read C ('epilogue alpha'): beta must be 0")
        if M == 0 or N == 0:
            return SplitResult([])
        home = c.device
        key = (first, M, N, K, a.layout, a.device, a.ld, b.device, b.ld, c.layout, home, c.ld, tuple(devices),
               axis, beta_used, chunks, local_views)
        learnt = None
        if balance is not None:  # the sizes follow what the calls before measured: planned each call
            granules = _granule(first)
            axis = axis if axis is not None else (choose_axis(M, N, K, devices, home, beta_used, granules)
                                                  if K else 0)
            learnt = (getattr(first, "name", type(first).__name__), M, N, K, tuple(devices), home, axis,
                      beta_used, chunks, local_views)
            weights = balance.weights(learnt, len(devices), (M, N, K)[axis])
            axis, placed = _plan(M, N, K, devices, home, beta_used, granules, axis, weights)
            key += (tuple(p for _, p in placed),)
        prepared = cache.get(key) if cache is not None else None
        if prepared is None:
            granules = _granule(first)
            if learnt is None:
                axis, placed = _plan(M, N, K, devices, home, beta_used, granules, axis)
            prepared = PreparedSplit(layer, kernel_on, where.at, (a, b, c), placed, beta_used=beta_used,
                                     chunks=chunks, local_views=local_views, granules=granules,
                                     accumulate=_accumulates(first))
            if cache is not None:
                cache.put(key, prepared)
    except ValueError:
        raise  # arguments that cannot be split (ShapeError included): nothing was started
    except Exception as exc:  # noqa: BLE001 - any failure: say which device, write nothing
        raise MultiGpuError(f"device {where.device} failed while {where.stage}: {exc}; "
                            + written_note(beta)) from exc
    with prepared.lock:
        result = SplitResult(prepared.parts, prepared.axis, steps=prepared.steps,
                             bytes_moved=prepared.bytes_moved)
        call = SplitCall(prepared, {"A": a.ptr, "B": b.ptr, "C": c.ptr}, alpha, beta, result)
        call.run(prepared.home)  # interrupted (Ctrl-C): the devices still finish before it goes on up
        result.issue_ms = call.issue_ms
        if not call.errors and prepared.beta_used:
            try:
                where.at(prepared.home, "writing C")
                layer.copy(c, prepared.staging[1], prepared.home_out)
                layer.synchronize(prepared.home)
            except Exception as exc:  # noqa: BLE001
                call.errors.append((prepared.home, "writing C", exc))
    if call.errors:  # every device has finished or failed: nothing of the call is in flight
        if cache is not None:
            cache.drop(key)
        else:
            prepared.release()
        device, stage, exc = call.errors[0]  # the first to fail: the others may have failed for it
        raise MultiGpuError(f"device {device} failed while {stage}: {exc}; " + written_note(beta)) from exc
    if cache is None:
        prepared.release()
    if learnt is not None:
        balance.learn(learnt, len(devices), [(position, p.size, (result.kernel_ms[i], result.span_ms[i]))
                                             for i, (position, p) in enumerate(zip(prepared.positions,
                                                                                   prepared.parts))])
    result.end_to_end_ms = (time.perf_counter() - started) * 1e3
    return result


def written_note(beta: float) -> str:
    """What a failed split (or batched split) left of C."""
    return ("C was not written" if beta != 0 else
            "C is partly written (beta = 0: its old values were not an input)")


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


class _ResidentCall(Fanout):
    """Each device's shards launched, then waited for and timed, device by device."""

    def __init__(self, layer: DeviceLayer, launches: dict[int, list], alpha: float, beta: float):
        super().__init__(launches)
        self.layer, self.launches, self.alpha, self.beta = layer, launches, alpha, beta
        self.kernel_ms: dict[int, float] = {}  # per shard

    def steps(self, device: int):
        layer = self.layer
        self.at(device, "running the kernel")
        for launch in self.launches[device]:
            index, kernel, a, b, c, compute, start, end = launch
            layer.record(device, compute, start)
            layer.launch(kernel, a.rows, b.cols, a.cols, self.alpha, a, b, self.beta, c, compute)
            layer.record(device, compute, end)
            yield

    def finish(self, device: int) -> None:
        self.at(device, "waiting for the results")
        self.layer.synchronize(device)
        for index, _, _, _, _, _, start, end in self.launches[device]:
            self.kernel_ms[index] = self.layer.elapsed_ms(start, end)


def resident_gemm(kernels: Plan | Callable[[int], Launcher], shards: list[Shard], *,
                  alpha: float = 1.0, beta: float = 0.0,
                  layer: DeviceLayer | None = None) -> ResidentResult:
    """Each shard's C = alpha A B + beta C on the device that holds its A, with no copies: the
    shards are, say, bands of A's rows with B on every device (giving bands of C's rows), or bands
    of B's columns with A everywhere. Every shard is checked before any launch; the kernels are
    then launched, a shard of each device in turn, and the devices waited for (fanout.py)."""
    layer = layer or default_layer()
    kernel_on = _kernels(kernels, layer)
    where = Failure()
    started = time.perf_counter()
    bands, launches = [], {}
    try:
        for index, shard in enumerate(shards):  # everything the host must check and prepare, before any launch
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
            launches.setdefault(device, []).append((index, kernel, a, b, c, layer.stream(device, "compute"),
                                                    layer.event(device), layer.event(device)))
        for device in launches:  # once each: the caller may still be writing the shards
            where.at(device, "waiting for the caller's work")
            layer.drain(device)
    except ValueError:
        raise  # shards that do not multiply, or not on one device each
    except Exception as exc:  # noqa: BLE001
        raise MultiGpuError(f"device {where.device} failed while {where.stage}: {exc}") from exc
    if not launches:
        return ResidentResult(bands, [], (time.perf_counter() - started) * 1e3)
    call = _ResidentCall(layer, launches, alpha, beta).run(next(iter(launches)))
    if call.errors:
        device, stage, exc = call.errors[0]
        raise MultiGpuError(f"device {device} failed while {stage}: {exc}") from exc
    kernel_ms = [call.kernel_ms[index] for index in range(len(shards))]
    return ResidentResult(bands, kernel_ms, (time.perf_counter() - started) * 1e3)
