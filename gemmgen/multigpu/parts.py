"""What a split GEMM cuts and where, as pure functions with no device: matrices as regions of device
memory, the parts of an axis (and of a batch: batch_parts, for batched calls), the byte
model that chooses the axis (split_traffic, choose_axis), balancing repeated calls (Balance), and
each part's schedule of copy and kernel steps."""

from __future__ import annotations

from dataclasses import dataclass

FLOAT_BYTES = 4
AXIS_NAMES = ("rows of C (M)", "columns of C (N)", "K")
# Device memory is about ten times faster than a GPU-to-GPU link (H200: ~4.8 TB/s against NVLink's
# ~0.45 TB/s each way), so the K split's reduction on C's device counts a tenth of its bytes.
LOCAL_WEIGHT = 0.1


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

    def shifted(self, floats: int) -> Region:
        """The same matrix `floats` further on: the next matrix of a batch."""
        return Region(self.device, self.ptr + FLOAT_BYTES * floats, self.rows, self.cols, self.layout, self.ld)

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


def batch_parts(batch: int, devices: list[int], weights: list[float] | None = None) -> list[tuple[int, int]]:
    """A strided batch's parts (multigpu/batched.py): [start, stop) of whole matrices per device, as
    evenly as can be or in proportion to `weights` (a Balance's), so that no GEMM is cut, no partial
    sum travels and each device runs its share as batched launches. A batch smaller than the device
    count leaves devices idle."""
    return partition(batch, devices, 1, weights)


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
    first: bool = True                        # the first K piece of its block: it applies beta


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
                              gather=(rows, cols) if gather and i == len(ks_list) - 1 else None,
                              first=i == 0))
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
                              gather=(rows, cols) if gather and i == len(ks_list) - 1 else None,
                              first=i == 0))
    return steps
