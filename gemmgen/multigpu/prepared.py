"""A split GEMM prepared once per call key and issued from the calling thread (fanout.py).

Preparing (`PreparedSplit`) does all the host work a split needs: each part's kernel, buffers,
schedule of steps, the regions every copy and kernel reads and writes, and the CUDA events that
order them. Regions inside the caller's A, B and C are kept as offsets from those arrays ("slots"),
since their addresses change from call to call (a new `out` each time); the split's own buffers
and events are made once and reused. A call (`SplitCall`) then only adds the call's addresses to
those offsets and issues the devices' steps in rounds. `PreparedCache` keeps the last few prepared
splits of a device layer (their buffers stay allocated: `release()` gives them back).

What a part needs from the caller's operands on another GPU, that GPU sends on its one send
stream, in the order the rounds issue the steps, rather than every receiving GPU pulling at once
(on 4 H200s three concurrent pulls of 2048 x 2048 blocks got about 120 GB/s each; sent in order,
fp32 8192^3 over 4 GPUs went from 3.56 to 3.08 ms). A block that several parts need (all of B for
bands of rows, all of A for bands of columns) is relayed: the first part gets it from where it
lies, each next part copies it from the part before, once that part has it. Its GPU sends it once
instead of once per part: on 4 H200s, 256 MiB to three GPUs took 2.2 ms sent from one and 1.0 ms
relayed along the chain, each GPU's NVLink ports then sending and receiving it once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from .parts import Part, Region, Span, _owner, schedule
from .fanout import Fanout

# A region the split touches: (slot, region). Slot "A", "B" or "C": inside the caller's array, its
# ptr an offset from the array's address; None: one of the split's own buffers, its ptr absolute.
Ref = tuple[str | None, Region]


def bind(ref: Ref, bases: dict[str, int]) -> Region:
    """The region of a call: a slot's offset moved to the call's array."""
    slot, region = ref
    if slot is None:
        return region
    return Region(region.device, region.ptr + bases[slot], region.rows, region.cols, region.layout, region.ld)


def _sub(ref: Ref, rows: Span, cols: Span) -> Ref:
    return ref[0], ref[1].sub(rows, cols)


class PreparedStep(NamedTuple):
    """One kernel of a part and what comes before and after it, every region and event made."""

    copies: tuple[tuple[Ref, Ref], ...]   # (dst, src) on the copy stream before the kernel
    after: tuple[Any, ...]                # events of other devices' copies that these relay
    copied: Any                           # event after those copies (None: no copies)
    pushed: tuple[tuple[int, tuple[Ref, Ref], Any], ...]  # (source device, (dst, src), its event): sent
                                          # by the source's "send" stream, one copy after another
    M: int
    N: int
    K: int
    a: Ref
    b: Ref
    c: Ref
    beta: float | None                    # None: the call's beta (the first K piece of a part that applies it)
    start: Any                            # timer events around the kernel; `end` also orders the gather
    end: Any
    gather: tuple[Ref, Ref] | None        # (dst, src): the finished block of C, sent back on the out stream
    sent: Any                             # event after the gather


@dataclass
class PreparedPart:
    index: int
    part: Part
    kernel: Any
    copies: Any                           # the device's streams: copies in, kernels, results out
    compute: Any
    out: Any
    steps: list[PreparedStep]
    done: Any                             # event: its C is complete where it belongs
    writes_staging: bool                  # on C's device, writing the (staging) C itself: no gathers


@dataclass
class DeviceProgram:
    device: int
    begin: Any                            # event at the start of the device's share of a call
    parts: list[PreparedPart] = field(default_factory=list)


class PreparedSplit:
    """Everything a split of one call key needs, made once. `operands` are the located A, B and C
    of the call that prepared it (only their devices, sizes, layouts and leading dimensions are
    kept); `parts` the non-empty parts with their positions among the devices."""

    def __init__(self, layer, kernel_on: Callable[[int], Any], at: Callable[[int, str], None],
                 operands: tuple[Region, Region, Region], placed: list[tuple[int, Part]], *,
                 beta_used: bool, chunks: int, local_views: bool, granules: tuple[int, int, int],
                 accumulate: bool):
        self.layer = layer
        self.lock = threading.Lock()      # one call of it at a time: they share buffers and events
        self.allocated: list[Region] = []
        a, b, c = (Region(x.device, 0, x.rows, x.cols, x.layout, x.ld) for x in operands)
        self.M, self.K, self.N = a.rows, a.cols, b.cols
        self.home = c.device
        self.positions = [position for position, _ in placed]
        self.parts = [p for _, p in placed]
        self.axis = self.parts[0].axis
        self.beta_used = beta_used
        self.bytes_moved = 0
        self.steps: dict[int, int] = {}
        self.programs: dict[int, DeviceProgram] = {}
        self.partials: list[Region] = []  # the K split's partial Cs on C's device, summed into staging
        try:
            at(self.home, "allocating the staging C")
            # With beta = 0 C's old values are no input: the parts write C itself. Otherwise a staging
            # C takes the results, and C is written only once every device has finished.
            self.staging: Ref = ("C", c) if not beta_used else (None, self._allocate(self.home, self.M, self.N,
                                                                                      c.layout))
            self._prepare(kernel_on, at, a, b, c, chunks, local_views, granules, accumulate)
        except BaseException:
            self.release()
            raise
        self.devices = list(self.programs)  # in the parts' order: relays issue after their holders
        self.reduction = layer.stream(self.home, "compute")
        self.home_out = layer.stream(self.home, "out")

    def _allocate(self, device: int, rows: int, cols: int, layout: str) -> Region:
        region = self.layer.allocate(device, rows, cols, layout)
        self.allocated.append(region)
        return region

    def _operand(self, slot: str, operand: Region, device: int, rows: Span, cols: Span, local_views: bool):
        """The operand itself where it is on the device, else a buffer for the part's block of it;
        with the global (row, col) at which it starts."""
        if local_views and operand.device == device:
            return (slot, operand), (0, 0)
        buffer = self._allocate(device, rows[1] - rows[0], cols[1] - cols[0], operand.layout)
        return (None, buffer), (rows[0], cols[0])

    @staticmethod
    def _in(buffer, rows: Span, cols: Span) -> Ref:
        ref, (r0, c0) = buffer
        return _sub(ref, (rows[0] - r0, rows[1] - r0), (cols[0] - c0, cols[1] - c0))

    @staticmethod
    def _extent(part: Part, M: int, N: int, K: int) -> tuple[Span, Span, Span]:
        """Rows and columns of C and the K range a part covers."""
        span = (part.start, part.stop)
        return ((span, (0, N), (0, K)), ((0, M), span, (0, K)), ((0, M), (0, N), span))[part.axis]

    def _moved(self, dst: Ref, src: Ref) -> None:
        if dst[1].device != src[1].device:
            self.bytes_moved += dst[1].nbytes

    def _prepare(self, kernel_on, at, a: Region, b: Region, c: Region, chunks: int, local_views: bool,
                 granules: tuple[int, int, int], accumulate: bool) -> None:
        layer, home, M, N, K = self.layer, self.home, self.M, self.N, self.K
        owner = _owner(self.parts, home)
        operands = {"A": a, "B": b, "C": c}
        # Relays need the holder's step issued before the receiver's, which rounds of one step per
        # device give when each part has a device of its own.
        relay = len({p.device for p in self.parts}) == len(self.parts)
        held: dict[tuple, tuple[Ref, Any]] = {}  # (operand, block): the newest buffer holding it, its event
        for index, part in enumerate(self.parts):
            device = part.device
            at(device, "preparing the kernel")
            kernel = kernel_on(device)
            at(device, "allocating its buffers")
            rows, cols, ks = self._extent(part, M, N, K)
            bufs = {"A": self._operand("A", a, device, rows, ks, local_views),
                    "B": self._operand("B", b, device, ks, cols, local_views)}
            applies_beta = part.axis != 2 or index == owner
            # The part writes straight into the staging C where it can: on C's device, and, for a
            # K split, as the part that applies beta (the others' partials are added to it).
            into_staging = device == home and local_views and applies_beta
            partial = part.axis == 2 and index != owner
            if into_staging:
                bufs["C"] = (self.staging, (0, 0))
            else:
                bufs["C"] = ((None, self._allocate(device, rows[1] - rows[0], cols[1] - cols[0], c.layout)),
                             (rows[0], cols[0]))
            steps = schedule(part, M, N, K, beta=1.0 if self.beta_used and applies_beta else 0.0,
                             copy_a=bufs["A"][0][0] is None, copy_b=bufs["B"][0][0] is None, chunks=chunks,
                             granule=granules[1 - part.axis] if part.axis < 2 else granules[2],
                             k_granule=granules[2], accumulate=accumulate, gather=not into_staging)
            self.steps[index] = len(steps)
            target = None
            if partial:  # summed into the staging C on `home` once it is there
                at(home, "allocating a partial C")
                target = (None, self._allocate(home, M, N, c.layout))
                self.partials.append(target[1])
            program = self.programs.get(device)
            if program is None:
                program = self.programs[device] = DeviceProgram(device, layer.event(device))
            prepared = []
            for step in steps:
                copies, after, pushed = [], [], []
                copied = layer.event(device) if step.copy_a or step.copy_b or step.copy_c else None
                for name, block in (("A", step.copy_a), ("B", step.copy_b), ("C", step.copy_c)):
                    if block is not None:
                        dst, source = self._in(bufs[name], *block), (name, operands[name].sub(*block))
                        holder = held.get((name, block)) if relay and name != "C" else None
                        if holder is not None:
                            source = holder[0]
                            after.append(holder[1])
                        held[name, block] = (dst, copied)
                        self._moved(dst, source)
                        origin = source[1].device
                        if source[0] is not None and origin != device:  # from the caller's operand
                            pushed.append((origin, (dst, source), layer.event(origin)))
                        else:
                            copies.append((dst, source))
                a_ref = self._in(bufs["A"], step.rows, step.ks)
                b_ref = self._in(bufs["B"], step.ks, step.cols)
                c_ref = self._in(bufs["C"], step.rows, step.cols)
                gather = None
                if step.gather is not None:
                    gather = (_sub(target if partial else self.staging, *step.gather),
                              self._in(bufs["C"], *step.gather))
                    self._moved(*gather)
                beta = (None if applies_beta else 0.0) if step.first else 1.0
                prepared.append(PreparedStep(tuple(copies), tuple(after), copied, tuple(pushed),
                                             c_ref[1].rows, c_ref[1].cols, a_ref[1].cols, a_ref, b_ref, c_ref,
                                             beta, layer.event(device), layer.event(device), gather,
                                             layer.event(device) if gather else None))
            done = layer.event(device) if into_staging else prepared[-1].sent
            program.parts.append(PreparedPart(index, part, kernel, *(layer.stream(device, role) for role in
                                                                     ("in", "compute", "out")), prepared, done,
                                               into_staging))

    def release(self) -> None:
        """Give the buffers back (once nothing in flight uses them)."""
        for region in self.allocated:
            self.layer.free(region)
        self.allocated = []


class SplitCall(Fanout):
    """One call of a prepared split: the caller's addresses, scalars, and the result the device
    threads fill in (kernel and span times per part)."""

    def __init__(self, prepared: PreparedSplit, bases: dict[str, int], alpha: float, beta: float, result):
        super().__init__(prepared.devices)
        self.prepared, self.bases, self.alpha, self.beta, self.result = prepared, bases, alpha, beta, result

    def steps(self, device: int):
        prepared, bases, layer = self.prepared, self.bases, self.prepared.layer
        program = prepared.programs[device]
        first = program.parts[0]
        layer.record(device, first.copies, program.begin)
        for part in program.parts:
            copies, compute, out = part.copies, part.compute, part.out
            for step in part.steps:
                if step.copied is not None:
                    self.at(device, "copying its inputs")
                    for origin, (dst, src), sent in step.pushed:  # the holder sends, in the order issued
                        send = layer.stream(origin, "send")
                        layer.copy(bind(dst, bases), bind(src, bases), send)
                        layer.record(origin, send, sent)
                        layer.wait(device, copies, sent)
                    for event in step.after:  # a relayed block: once the part before has it
                        layer.wait(device, copies, event)
                    for dst, src in step.copies:
                        layer.copy(bind(dst, bases), bind(src, bases), copies)
                    layer.record(device, copies, step.copied)
                    layer.wait(device, compute, step.copied)
                self.at(device, "running the kernel")
                layer.record(device, compute, step.start)
                layer.launch(part.kernel, step.M, step.N, step.K, self.alpha, bind(step.a, bases),
                             bind(step.b, bases), self.beta if step.beta is None else step.beta,
                             bind(step.c, bases), compute)
                layer.record(device, compute, step.end)
                if step.gather is not None:
                    self.at(device, "sending its C back")
                    layer.wait(device, out, step.end)
                    dst, src = step.gather
                    layer.copy(bind(dst, bases), bind(src, bases), out)
                    layer.record(device, out, step.sent)
                yield
            if part.writes_staging:  # complete once its last kernel is
                layer.record(device, compute, part.done)

    def after_issue(self) -> None:
        """A K split: the partial Cs summed into the staging C on C's device, once every part's
        block is there (their events, all recorded by now)."""
        prepared = self.prepared
        if not prepared.partials or self.errors:
            return
        layer, home = prepared.layer, prepared.home
        self.at(home, "summing the partial products")
        for program in prepared.programs.values():
            for part in program.parts:
                layer.wait(home, prepared.reduction, part.done)
        staging = bind(prepared.staging, self.bases)
        for partial in prepared.partials:
            layer.accumulate(staging, partial, prepared.reduction)
        layer.synchronize(home)

    def finish(self, device: int) -> None:
        layer = self.prepared.layer
        self.at(device, "waiting for the results")
        layer.synchronize(device)
        program = self.prepared.programs[device]
        for part in program.parts:
            self.result.kernel_ms[part.index] = sum(layer.elapsed_ms(s.start, s.end) for s in part.steps)
            self.result.span_ms[part.index] = layer.elapsed_ms(program.begin, part.done)


class PreparedCache:
    """A device layer's last KEPT prepared splits, by call key; the oldest goes (its buffers freed)
    when another comes."""

    KEPT = 8

    def __init__(self):
        self.lock = threading.Lock()
        self.entries: OrderedDict[tuple, PreparedSplit] = OrderedDict()

    def get(self, key: tuple) -> PreparedSplit | None:
        with self.lock:
            found = self.entries.get(key)
            if found is not None:
                self.entries.move_to_end(key)
            return found

    def put(self, key: tuple, prepared: PreparedSplit) -> None:
        with self.lock:
            self.entries[key] = prepared
            evicted = self.entries.popitem(last=False)[1] if len(self.entries) > self.KEPT else None
        if evicted is not None:
            with evicted.lock:  # after a call of it still running elsewhere
                evicted.release()

    def drop(self, key: tuple) -> None:
        """Forget a split whose call failed, freeing its buffers (nothing of it is in flight)."""
        with self.lock:
            prepared = self.entries.pop(key, None)
        if prepared is not None:
            prepared.release()

    def release(self) -> None:
        """Free every prepared split's buffers."""
        with self.lock:
            entries, self.entries = list(self.entries.values()), OrderedDict()
        for prepared in entries:
            with prepared.lock:
                prepared.release()
