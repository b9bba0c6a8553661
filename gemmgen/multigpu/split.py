"""One GEMM split over several GPUs, the copies overlapping the kernels; or shards already in place.

`split_gemm` cuts C = alpha A B + beta C into parts, one per device, along whichever dimension
moves the fewest bytes between devices among those that balance the work (`choose_axis`; the
byte model is `split_traffic`):

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
that touches a device goes through a DeviceLayer (CuPy and the CUDA runtime in CupyLayer), so the
planning, the schedules and their event ordering are tested on the CPU with a fake layer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Protocol

from ..plan import Plan

FLOAT_BYTES = 4
AXIS_NAMES = ("rows of C (M)", "columns of C (N)", "K")
# Device memory is about ten times faster than a GPU-to-GPU link (H200: ~4.8 TB/s against NVLink's
# ~0.45 TB/s each way), so the K split's reduction on C's device counts a tenth of its bytes.
LOCAL_WEIGHT = 0.1
DEFAULT_CHUNKS = 4


class MultiGpuError(RuntimeError):
    """A device failed during a split GEMM; with beta != 0 the caller's C was not written."""


class Launcher(Protocol):
    """What a split launches on each device: a gemmgen Kernel, a library, anything alike."""

    layouts: dict[str, str]

    def launch(self, M: int, N: int, K: int, alpha: float, A: int, lda: int, B: int, ldb: int,
               beta: float, C: int, ldc: int, *, stream: Any = None) -> None: ...


# --- where matrices are ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Region:
    """A matrix in device memory: its device, address, size, layout and leading dimension (in
    floats). `sub` is a block of it at the same leading dimension: no copy, just arithmetic."""

    device: int
    ptr: int
    rows: int
    cols: int
    layout: str  # "row" or "col"
    ld: int

    def sub(self, rows: tuple[int, int], cols: tuple[int, int]) -> Region:
        (r0, r1), (c0, c1) = rows, cols
        if not (0 <= r0 <= r1 <= self.rows and 0 <= c0 <= c1 <= self.cols):
            raise IndexError(f"block rows {rows} cols {cols} outside a {self.rows} x {self.cols} matrix")
        offset = r0 * self.ld + c0 if self.layout == "row" else c0 * self.ld + r0
        # (A plain constructor: dataclasses.replace cost 10 us a call, hundreds per split.)
        return Region(self.device, self.ptr + FLOAT_BYTES * offset, r1 - r0, c1 - c0, self.layout, self.ld)

    @property
    def nbytes(self) -> int:
        return FLOAT_BYTES * self.rows * self.cols


# --- what to split and where: pure functions -----------------------------------------------------

@dataclass(frozen=True)
class Part:
    """What one device computes: rows [start, stop) of C (axis 0), columns (axis 1), or a slab
    of K (axis 2) whose partial product is summed with the others'."""

    device: int
    axis: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def partition(length: int, devices: list[int], granule: int,
              weights: list[float] | None = None) -> list[tuple[int, int]]:
    """[start, stop) per device, in whole granules (the kernel's tile): spread as evenly as can be,
    or in proportion to `weights` (largest remainders rounded up)."""
    if not devices:
        raise ValueError("no devices to split over")
    granules = -(-length // granule) if length > 0 else 0
    if weights is None or len(weights) != len(devices) or sum(max(w, 0.0) for w in weights) <= 0:
        shares = [granules // len(devices) + (1 if index < granules % len(devices) else 0)
                  for index in range(len(devices))]
    else:
        total = sum(max(w, 0.0) for w in weights)
        exact = [granules * max(w, 0.0) / total for w in weights]
        shares = [int(x) for x in exact]
        by_remainder = sorted(range(len(devices)), key=lambda i: (shares[i] - exact[i], i))
        for index in by_remainder[:granules - sum(shares)]:
            shares[index] += 1
    bounds, start = [], 0
    for share in shares:
        stop = min(length, start + share * granule)
        bounds.append((start, stop))
        start = stop
    return bounds


def make_parts(M: int, N: int, K: int, devices: list[int], axis: int, granule: int,
               weights: list[float] | None = None) -> list[Part]:
    length = (M, N, K)[axis]
    return [Part(d, axis, start, stop)
            for d, (start, stop) in zip(devices, partition(length, devices, granule, weights))]


class Balance:
    """How much of a GEMM each device takes, learned from the calls before it of the same shape.

    A device that must first receive its inputs, or whose GPU is slower, finishes its equal part
    later than C's own device. After each call the split reports, per part, its kernels' time and
    its span (from the start of the call until its last block of C is back, CUDA events on its
    device). That gives each device a cost per row (or column, or K step) `a` and a fixed cost `L`
    (span minus kernels: waiting for the first inputs, sending the last block back); the next call
    of the same shape, kernel, devices and split gives device i the size (T - L_i) / a_i that makes
    every device finish at the same T. The first two calls of a shape split evenly, and the first
    teaches nothing (it pays once for loading kernels and enabling peer access). Estimates are
    averaged over calls (the newest weighing half), so that one noisy call moves little."""

    def __init__(self):
        self.seen: dict[tuple, list[tuple[float, float] | None]] = {}  # [] after one call

    def weights(self, key: tuple, count: int, length: int) -> list[float] | None:
        """Target sizes per device (in rows, columns or K steps), or None: split evenly."""
        costs = self.seen.get(key)
        if not costs or len(costs) != count or all(c is None for c in costs):
            return None
        known = [c for c in costs if c is not None]
        mean_a = sum(a for a, _ in known) / len(known)
        costs = [c if c is not None else (mean_a, 0.0) for c in costs]
        active = list(range(count))
        while active:
            # Equal finish T over the active devices: sum_i (T - L_i) / a_i = length.
            inverse = sum(1.0 / costs[i][0] for i in active)
            finish = (length + sum(costs[i][1] / costs[i][0] for i in active)) / inverse
            late = [i for i in active if costs[i][1] >= finish]
            if not late:
                break
            active = [i for i in active if i not in late]  # its fixed cost alone exceeds T: no part
        return [max(0.0, (finish - costs[i][1]) / costs[i][0]) if i in active else 0.0 for i in range(count)]

    def learn(self, key: tuple, count: int, parts: list[tuple[int, int, tuple[float, float]]]) -> None:
        """parts: (position among the devices, size, (kernel ms, span ms)) of each non-empty part."""
        if key not in self.seen:  # a first call pays once (loading kernels, enabling peer access)
            self.seen[key] = []
            return
        old = self.seen[key] or [None] * count
        # A device left out (its fixed cost seemed to outlast the others' work) is not measured
        # again; shrinking that cost at each call it sits out brings it back if it was a fluke.
        new = [(c[0], c[1] * 0.75) if c is not None else None for c in old]
        for position, size, (kernel_ms, span_ms) in parts:
            if size <= 0 or kernel_ms <= 0:
                continue
            estimate = (kernel_ms / size, max(0.0, span_ms - kernel_ms))
            previous = old[position]
            new[position] = estimate if previous is None else tuple(
                (p + e) / 2 for p, e in zip(previous, estimate))
        self.seen[key] = new


@dataclass(frozen=True)
class Traffic:
    """Bytes a split moves: over the links between devices, and on C's device to sum partials."""

    link_bytes: int
    reduction_bytes: int = 0

    @property
    def cost(self) -> float:
        return self.link_bytes + LOCAL_WEIGHT * self.reduction_bytes


def _owner(parts: list[Part], home: int) -> int:
    """The K split's part that applies beta: the one on C's device where there is one."""
    live = [p for p in parts if p.size]
    return next((i for i, p in enumerate(parts) if p.size and p.device == home),
                parts.index(live[0]) if live else 0)


def split_traffic(M: int, N: int, K: int, parts: list[Part], home: int, beta: bool) -> Traffic:
    """The byte model: what each part off C's device (`home`, where the inputs live) must receive
    and send back, and for a K split the partial sums added on `home`."""
    floats = 0
    owner = _owner(parts, home)
    live = [p for p in parts if p.size]
    for index, part in enumerate(parts):
        if not part.size or part.device == home:
            continue
        s = part.size
        a, b, c = ((s * K, K * N, s * N), (M * K, K * s, M * s), (M * s, s * N, M * N))[part.axis]
        reads_c = beta and (part.axis != 2 or index == owner)
        floats += a + b + c + (c if reads_c else 0)
    reduction = 3 * M * N * (len(live) - 1) if live and live[0].axis == 2 else 0
    return Traffic(FLOAT_BYTES * floats, FLOAT_BYTES * reduction)


def choose_axis(M: int, N: int, K: int, devices: list[int], home: int, beta: bool,
                granules: tuple[int, int, int] = (128, 128, 128)) -> int:
    """The split (0: rows of C, 1: columns, 2: K) that moves the fewest bytes among those that
    balance the work best: the busiest device sets the time, so a split whose largest part is more
    than 10% above the best one's is out (tiles make small differences) (127 rows in tiles of 128 would leave all but one device
    idle). Ties go to rows, then columns (K adds a reduction and partial buffers)."""
    options = []
    for axis in (0, 1, 2):
        length = (M, N, K)[axis]
        if length == 0:
            continue
        parts = make_parts(M, N, K, devices, axis, granules[axis])
        largest = max(p.size for p in parts) / length
        options.append((largest, split_traffic(M, N, K, parts, home, beta).cost, axis))
    if not options:
        return 0
    balanced = min(largest for largest, _, _ in options) * 1.1
    return min((cost, axis) for largest, cost, axis in options if largest <= balanced)[1]


Span = tuple[int, int]


@dataclass(frozen=True)
class Step:
    """One kernel of a part: C[rows, cols] (+)= A[rows, ks] B[ks, cols], in global coordinates,
    with the copies it needs first and the block of C it completes (None: not yet complete)."""

    rows: Span
    cols: Span
    ks: Span
    beta: float
    copy_a: tuple[Span, Span] | None = None   # (rows, ks) of A
    copy_b: tuple[Span, Span] | None = None   # (ks, cols) of B
    copy_c: tuple[Span, Span] | None = None   # (rows, cols) of C, read by beta
    gather: tuple[Span, Span] | None = None   # (rows, cols) of the result to send back


def _cuts(span: Span, pieces: int, granule: int) -> list[Span]:
    start, stop = span
    return [(start + a, start + b) for a, b in partition(stop - start, [0] * max(1, pieces), granule) if b > a]


def schedule(part: Part, M: int, N: int, K: int, *, beta: float, copy_a: bool, copy_b: bool,
             chunks: int, granule: int, k_granule: int, accumulate: bool, gather: bool) -> list[Step]:
    """The steps of a part. Inputs that must travel (`copy_a`, `copy_b`) are streamed: the output
    is cut into `chunks` blocks (of whole `granule`s) along the dimension the part does not split
    (columns for a band of rows, rows for a band of columns), and the first block is also cut
    along K (when the kernel can accumulate with beta = 1) so that the first kernel waits for
    little. A K slab is cut along K. Each step copies only what no earlier step brought; C is
    copied in where beta reads it, and `gather` sends each finished block back."""
    pieces = chunks if copy_a or copy_b else 1
    k_pieces = pieces if accumulate else 1
    remote = {"A": copy_a, "B": copy_b, "C": beta != 0}
    if part.axis == 2:
        rows, cols = (0, M), (0, N)
        ks_list = _cuts((part.start, part.stop), k_pieces, k_granule) or [(part.start, part.stop)]
        steps = []
        for i, ks in enumerate(ks_list):
            steps.append(Step(rows, cols, ks, beta if i == 0 else 1.0,
                              copy_a=(rows, ks) if remote["A"] else None,
                              copy_b=(ks, cols) if remote["B"] else None,
                              copy_c=(rows, cols) if i == 0 and beta != 0 and remote["C"] else None,
                              gather=(rows, cols) if gather and i == len(ks_list) - 1 else None))
        return steps
    band = (part.start, part.stop)
    full = (0, N) if part.axis == 0 else (0, M)
    blocks = _cuts(full, pieces, granule) or [full]
    steps = []
    for j, block in enumerate(blocks):
        rows, cols = (band, block) if part.axis == 0 else (block, band)
        ks_list = (_cuts((0, K), k_pieces, k_granule) or [(0, K)]) if j == 0 else [(0, K)]
        for i, ks in enumerate(ks_list):
            # A band of rows streams B by columns: A's band comes with the first block's K pieces
            # (and is then whole); a band of columns streams A by rows, B's band coming first.
            needs_a = remote["A"] and (part.axis == 1 or j == 0)
            needs_b = remote["B"] and (part.axis == 0 or j == 0)
            steps.append(Step(rows, cols, ks, beta if i == 0 else 1.0,
                              copy_a=(rows, ks) if needs_a else None,
                              copy_b=(ks, cols) if needs_b else None,
                              copy_c=(rows, cols) if i == 0 and beta != 0 and remote["C"] else None,
                              gather=(rows, cols) if gather and i == len(ks_list) - 1 else None))
    return steps


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


# --- CuPy and the CUDA runtime --------------------------------------------------------------------

class CupyLayer:
    """The real devices: CuPy buffers, non-blocking streams per device and role, CUDA events,
    2-D copies through cudaMemcpy2DAsync (peer to peer where the GPUs allow it)."""

    MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction (and peer copies) from unified addresses

    def __init__(self, compiled=None):
        import cupy
        self.cp = cupy
        self.compiled = compiled
        self.kernels: dict[tuple[int, str], Any] = {}
        self.streams: dict[tuple[int, str], Any] = {}
        self.buffers: dict[int, Any] = {}
        self.peers: set[tuple[int, int]] = set()

    def locate(self, array: Any, layout: str, what: str) -> Region:
        from ..gpu.runtime import as_matrix
        m = as_matrix(array, what, layout)
        device = self.cp.cuda.runtime.pointerGetAttributes(m.ptr).device if m.ptr else 0
        # The caller may still be writing it on its own stream, which ours do not wait for.
        with self.cp.cuda.Device(device):
            self.cp.cuda.Device(device).synchronize()
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
        from ..gpu.runtime import Kernel
        key = (device, plan.name)
        if key not in self.kernels:
            self.kernels[key] = Kernel(plan, self.compiled, device=device)
        return self.kernels[key]

    def stream(self, device: int, role: str) -> Any:
        if (device, role) not in self.streams:
            with self.cp.cuda.Device(device):
                self.streams[device, role] = self.cp.cuda.Stream(non_blocking=True)
        return self.streams[device, role]

    def record(self, device: int, stream: Any) -> Any:
        with self.cp.cuda.Device(device):
            event = self.cp.cuda.Event()
            event.record(stream)
            return event

    def wait(self, device: int, stream: Any, event: Any) -> None:
        with self.cp.cuda.Device(device):
            stream.wait_event(event)

    def _peer(self, dst: int, src: int) -> None:
        runtime = self.cp.cuda.runtime
        for a, b in ((dst, src), (src, dst)):
            if a != b and (a, b) not in self.peers:
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

    def launch(self, kernel, M, N, K, alpha, a: Region, b: Region, beta, c: Region, stream) -> None:
        with self.cp.cuda.Device(c.device):
            kernel.launch(M, N, K, alpha, a.ptr, a.ld, b.ptr, b.ld, beta, c.ptr, c.ld, stream=stream)

    def elapsed_ms(self, start, end) -> float:
        return self.cp.cuda.get_elapsed_time(start, end)

    def synchronize(self, device: int) -> None:
        with self.cp.cuda.Device(device):
            self.cp.cuda.Device(device).synchronize()


# --- measuring ------------------------------------------------------------------------------------

@dataclass
class ScalingReport:
    devices: list[int]
    M: int
    N: int
    K: int
    one_gpu_ms: float                # the whole problem on the first device, host time of the call
    split: SplitResult
    resident: ResidentResult | None = None
    one_gpu_kernel_ms: float = 0.0   # the same call's kernel, CUDA events

    @property
    def flops(self) -> float:
        return 2.0 * self.M * self.N * self.K

    def _tflops(self, ms: float) -> float:
        return self.flops / (ms * 1e-3) / 1e12 if ms else 0.0

    @property
    def one_gpu_tflops(self) -> float:
        return self._tflops(self.one_gpu_ms)

    @property
    def kernel_tflops(self) -> float:
        """All devices together, limited by the slowest one's kernels."""
        return self._tflops(self.split.slowest_kernel_ms)

    @property
    def end_to_end_tflops(self) -> float:
        return self._tflops(self.split.end_to_end_ms)

    @property
    def resident_tflops(self) -> float:
        return self._tflops(self.resident.end_to_end_ms) if self.resident else 0.0

    def scaling(self, tflops: float) -> float:
        """Throughput over N times one GPU's (1.0 is perfect)."""
        return tflops / (len(self.devices) * self.one_gpu_tflops) if self.one_gpu_tflops else 0.0

    @property
    def efficiency(self) -> float:
        """The slowest device's kernels against one GPU's kernel on the whole problem (events on
        both sides): what the split costs the kernels, copies and launches left out."""
        one = self._tflops(self.one_gpu_kernel_ms or self.one_gpu_ms)
        return self.kernel_tflops / (len(self.devices) * one) if one else 0.0


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


def _inputs(cp, M: int, N: int, K: int, layouts: dict, seed: int):
    """Random A and B in [-1, 1] and a NaN-poisoned C, each in its layout, on the current device."""
    rng = cp.random.default_rng(seed)
    place = {"row": cp.ascontiguousarray, "col": cp.asfortranarray}
    A = place[layouts["A"]](rng.uniform(-1, 1, (M, K), dtype=cp.float32))
    B = place[layouts["B"]](rng.uniform(-1, 1, (K, N), dtype=cp.float32))
    C = place[layouts["C"]](cp.full((M, N), cp.nan, dtype=cp.float32))
    return A, B, C


def worst_error_ratio(cp, A, B, C, math: str, beta: float = 0.0, C0=None) -> float:
    """max |C - (A B + beta C0)| over the tolerance of the kernel's math mode, against float64
    (NaN: inf)."""
    from ..gpu.verify import tolerance
    reference = A.astype(cp.float64) @ B.astype(cp.float64)
    scale = cp.abs(A).astype(cp.float64) @ cp.abs(B).astype(cp.float64)
    if beta:
        reference += beta * C0.astype(cp.float64)
        scale += abs(beta) * cp.abs(C0).astype(cp.float64)
    ratio = cp.abs(C.astype(cp.float64) - reference) / tolerance(scale, A.shape[1], math)
    return float(cp.nan_to_num(ratio, nan=cp.inf).max())


def _one_gpu(layer: CupyLayer, kernel: Launcher, device: int, A: Any, B: Any, C: Any) -> SplitResult:
    """The whole problem on one GPU as a caller runs it: one launch, then wait for C."""
    started = time.perf_counter()
    compute = layer.stream(device, "compute")
    start = layer.record(device, compute)
    with layer.cp.cuda.Device(device):
        kernel(A, B, C, stream=compute)
    end = layer.record(device, compute)
    layer.synchronize(device)
    result = SplitResult([Part(device, 0, 0, A.shape[0])], 0, {0: layer.elapsed_ms(start, end)})
    result.end_to_end_ms = (time.perf_counter() - started) * 1e3
    return result


def measure_scaling(plan: Plan, M: int, N: int, K: int, devices: list[int], *, runs: int = 3,
                    compiled=None, axis: int | None = None, chunks: int = DEFAULT_CHUNKS,
                    local_views: bool = True, balance: Balance | None = None) -> tuple[ScalingReport, float]:
    """One GPU on the whole problem against the split over `devices` (inputs starting on the
    first, in the kernel's layouts) and against shards already resident (bands of A's rows, B on
    each device); the split and the shards are checked against float64 first.

    The three are timed alike and in turns, `runs` rounds after a warm-up round: host time of one
    call until its C is complete (for one GPU: the kernel on the whole problem, launched and waited
    for), so that each side pays its own launch costs, rests as long between calls, and a GPU's
    clocks favour neither. Medians. Returns the report and the worst error ratio (<= 1 passes)."""
    import cupy as cp

    layer = CupyLayer(compiled)
    home = devices[0]
    kernel = layer.kernel(home, plan)
    with cp.cuda.Device(home):
        A, B, C = _inputs(cp, M, N, K, kernel.layouts, M * 31 + N * 17 + K)
        split = lambda: split_gemm(plan, A, B, C, devices=devices, layer=layer, axis=axis,  # noqa: E731
                                   chunks=chunks, local_views=local_views, balance=balance)
        one_gpu = lambda: _one_gpu(layer, kernel, home, A, B, C)  # noqa: E731
        split()
        worst = worst_error_ratio(cp, A, B, C, plan.math)
    shards, rows = [], make_parts(M, N, K, devices, 0, plan.BM)
    for part in rows:
        with cp.cuda.Device(part.device):
            shards.append(Shard(cp.array(A[part.start:part.stop], order="C" if kernel.layouts["A"] == "row" else "F"),
                                cp.array(B, order="C" if kernel.layouts["B"] == "row" else "F")))
    resident = lambda: resident_gemm(plan, shards, layer=layer)  # noqa: E731
    first = resident()
    with cp.cuda.Device(home):
        C.fill(cp.nan)
        for part, band in zip(rows, first.bands):
            C[part.start:part.stop] = cp.asarray(band) if part.device == home else cp.array(band)
        worst = max(worst, worst_error_ratio(cp, A, B, C, plan.math))
    one_gpu(), split()  # the warm-up round (the split's second call: with a balance, the first it learns from)
    rounds = [(one_gpu(), split(), resident()) for _ in range(runs)]
    median = lambda results: sorted(results, key=lambda r: r.end_to_end_ms)[len(results) // 2]  # noqa: E731
    ones, splits, residents = (median([r[i] for r in rounds]) for i in range(3))
    return ScalingReport(devices, M, N, K, ones.end_to_end_ms, splits, residents,
                         one_gpu_kernel_ms=ones.slowest_kernel_ms), worst
