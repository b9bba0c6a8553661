"""A strided batch of GEMMs split over several GPUs by batch: whole matrices per GPU.

`split_batched` takes the batched C ABI's call (the first matrix of A, B and C, the batch count and
the strides between matrices, 0 for an operand every batch shares) and gives each device a run of
whole matrices (parts.batch_parts): no GEMM is cut, no partial sum travels, and each device runs
its share as batched launches of the same launcher (a library's batched entry point, a Kernel).

A device's share is streamed in `chunks` steps of matrices: a step copies its matrices of A and B
(and of C, where beta reads it) into the device's buffers, launches the batched kernel on them and
sends its matrices of C back, while the next step's copies and the last step's gather run on
their own streams. What a device holding the caller's matrices sends leaves on its one send stream,
in the order the rounds issue it; a shared operand (stride 0) goes to each device once, relayed from
device to device (as prepared.py does a split's). The device holding C computes its share in place.
With beta != 0 the results land in a staging batch on C's device, copied into C only once every
device has finished, so that a failure leaves C as it was.

A batch of small matrices from one GPU is bound by that GPU's links rather than by the others'
arithmetic: `Shares` keeps such a batch on its GPU from a shape's third call, where its second,
split evenly, showed the others finishing no sooner than that GPU would alone.

Like split_gemm, the first call of a key prepares everything (buffers, steps, events) and later
calls only bind their addresses; the steps are issued in rounds from the calling thread
(fanout.py).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from .fanout import Fanout
from .parts import Region, batch_parts, partition
from .prepared import Ref, bind
from .split import Failure, MultiGpuError, written_note


def packed_stride(region: Region) -> int:
    """The stride of a batch of such matrices packed one after another, each dense."""
    return region.rows * region.cols


class Strided(NamedTuple):
    """Matrices of a batch: the first one (a Ref: inside the caller's operand, or a buffer) and the
    stride to the next in floats (0: one matrix for every batch)."""

    first: Ref
    stride: int

    def at(self, index: int) -> "Strided":
        slot, region = self.first
        return Strided((slot, region.shifted(index * self.stride)), self.stride)


class BatchCopy(NamedTuple):
    dst: Strided
    src: Strided
    count: int


class BatchStep(NamedTuple):
    """One batched launch of a device's share, with the copies before it and the gather after it."""

    copies: tuple[BatchCopy, ...]
    after: tuple[Any, ...]        # events of other devices' copies that these relay
    copied: Any
    pushed: tuple[tuple[int, BatchCopy, Any], ...]  # (source device, copy, its event): sent by the
                                                    # source's one "send" stream, in the order issued
    count: int
    a: Strided
    b: Strided
    c: Strided
    beta: float | None            # None: the call's beta
    start: Any
    end: Any
    gather: BatchCopy | None
    sent: Any


@dataclass
class BatchPart:
    device: int
    start: int                    # its matrices: [start, stop)
    stop: int
    kernel: Any
    copies: Any                   # streams
    compute: Any
    out: Any
    steps: list[BatchStep]
    begin: Any
    done: Any


@dataclass
class BatchResult:
    parts: list[tuple[int, int, int]]          # (device, start, stop)
    kernel_ms: dict[int, float] = field(default_factory=dict)   # per part
    span_ms: dict[int, float] = field(default_factory=dict)     # per part: its start to its C back
    end_to_end_ms: float = 0.0
    bytes_moved: int = 0
    issue_ms: float = 0.0                                        # host time issuing the devices' steps


def keep_home(batch: int, kernel_ms: float, remote_span_ms: float) -> bool:
    """Whether the GPU holding a batch's inputs should keep all of it: when, split evenly, the other
    GPUs took longer to finish their shares (copies in and out included) than that GPU would take
    to compute the whole batch at `kernel_ms` a matrix."""
    return remote_span_ms >= batch * kernel_ms


class Shares:
    """Where batched calls whose inputs lie on one GPU of the split run, by call key. The first two
    calls of a key split evenly (the first may load kernels inside its timers); the second measures
    what the inputs' GPU takes a matrix (its kernels) and when the others finished (their spans).
    Where they finished no sooner than that GPU alone would have (`keep_home`: a batch of small
    matrices from one GPU is bound by its links), later calls keep the batch there; else they split
    evenly. Decided once, so that a key is prepared at most twice.

    (Fitting shares between those two, from the spans of an even call and a sized one, was tried on
    4 H200s and measured no better: the spans shrink little with fewer matrices, and the fits
    swung between calls from 27 to 41 of 64 matrices on GPU 0 of two.)"""

    KEPT = 64

    def __init__(self):
        self.lock = threading.Lock()
        self.weights: OrderedDict[tuple, list[float] | None] = OrderedDict()
        self.seen: OrderedDict[tuple, None] = OrderedDict()  # keys called once

    def get(self, key: tuple) -> list[float] | None:
        with self.lock:
            return self.weights.get(key)

    def decided(self, key: tuple) -> bool:
        with self.lock:
            return key in self.weights

    def learn(self, key: tuple, devices: list[int], home: int, batch: int, kernel_ms_per_matrix: float,
              remote_spans: list[float]) -> None:
        """After an even call of `key`: the home GPU's kernel time a matrix, the others' spans."""
        if home not in devices or not remote_spans:
            return
        with self.lock:
            if key in self.weights:
                return
            first = key not in self.seen
            self.seen[key] = None
            if len(self.seen) > self.KEPT:
                self.seen.popitem(last=False)
        if first:
            return
        home_only = keep_home(batch, kernel_ms_per_matrix, max(remote_spans))
        weights = [1.0 if d == home else 0.0 for d in devices] if home_only else None
        with self.lock:
            self.weights[key] = weights
            if len(self.weights) > self.KEPT:
                self.weights.popitem(last=False)


SHARES = Shares()


def copy_batch(layer, copy: BatchCopy, bases: dict[str, int], stream) -> None:
    """Issue a BatchCopy: one strided copy where the layer has one, else a copy per matrix."""
    dst, src = bind(copy.dst.first, bases), bind(copy.src.first, bases)
    strided = getattr(layer, "copy_batch", None)
    if strided is not None:
        strided(dst, copy.dst.stride, src, copy.src.stride, copy.count, stream)
        return
    for index in range(copy.count):
        layer.copy(dst.shifted(index * copy.dst.stride), src.shifted(index * copy.src.stride), stream)


class PreparedBatch:
    """Everything a batched split of one call key needs, made once: each part's buffers, steps and
    events. `operands`: the first matrices of A, B and C as Regions whose ptr is 0 (the call's
    addresses are bound per call), with their strides."""

    def __init__(self, layer, kernel_on: Callable[[int], Any], at: Callable[[int, str], None],
                 operands: dict[str, Region], strides: dict[str, int], batch: int, devices: list[int], *,
                 beta_used: bool, chunks: int, weights: list[float] | None = None):
        self.layer = layer
        self.lock = threading.Lock()      # one call of it at a time: they share buffers and events
        self.allocated: list[Region] = []
        self.home = operands["C"].device
        self.beta_used = beta_used
        self.bytes_moved = 0
        self.parts: list[BatchPart] = []
        whole = {name: Strided((name, region), strides[name]) for name, region in operands.items()}
        try:
            at(self.home, "allocating the staging C")
            c = operands["C"]
            self.staging = (Strided((None, self._allocate(self.home, c, batch)), packed_stride(c))
                            if beta_used else whole["C"])
            self._prepare(kernel_on, at, operands, whole, batch, devices, chunks, weights)
        except BaseException:
            self.release()
            raise
        self.devices = [part.device for part in self.parts]
        self.home_out = layer.stream(self.home, "out")

    def _allocate(self, device: int, like: Region, count: int) -> Region:
        """A buffer of `count` dense matrices like `like` (the first of them)."""
        lines, length = (like.rows, like.cols) if like.layout == "row" else (like.cols, like.rows)
        block = self.layer.allocate(device, max(1, count) * lines, length, "row")
        self.allocated.append(block)
        return Region(device, block.ptr, like.rows, like.cols, like.layout, max(1, length))

    def _moved(self, copy: BatchCopy) -> None:
        if copy.dst.first[1].device != copy.src.first[1].device:
            self.bytes_moved += copy.count * copy.dst.first[1].nbytes

    def _prepare(self, kernel_on, at, operands, whole, batch, devices, chunks, weights) -> None:
        layer, home = self.layer, self.home
        placed = [(d, start, stop) for d, (start, stop) in zip(devices, batch_parts(batch, devices, weights))
                  if stop > start]
        relay = len({d for d, _, _ in placed}) == len(placed)
        held: dict[str, tuple[Strided, Any]] = {}  # a shared operand: the newest device holding it, its event
        for device, start, stop in placed:
            at(device, "preparing the kernel")
            kernel = kernel_on(device)
            at(device, "allocating its buffers")
            local = {name: operands[name].device == device for name in "AB"}
            bufs = {}
            for name in "AB":
                shared = whole[name].stride == 0
                if local[name]:
                    bufs[name] = whole[name].at(start)
                else:
                    count = 1 if shared else stop - start
                    bufs[name] = Strided((None, self._allocate(device, operands[name], count)),
                                         0 if shared else packed_stride(operands[name]))
            in_place = device == home
            bufs["C"] = (self.staging.at(start) if in_place else
                         Strided((None, self._allocate(device, operands["C"], stop - start)),
                                 packed_stride(operands["C"])))
            pieces = 1 if all(local.values()) and in_place else chunks
            streams = [layer.stream(device, role) for role in ("in", "compute", "out")]
            steps = []
            for first, last in partition(stop - start, [0] * max(1, pieces), 1):
                if last <= first:
                    continue
                count = last - first
                copies, after = [], []
                copied = layer.event(device)
                for name in "AB":
                    if local[name] or (whole[name].stride == 0 and first > 0):
                        continue
                    src = whole[name].at(start + first)
                    if whole[name].stride == 0:
                        holder = held.get(name) if relay else None
                        if holder is not None:
                            src = holder[0]
                            after.append(holder[1])
                        held[name] = (bufs[name], copied)
                    copies.append(BatchCopy(bufs[name].at(first), src, 1 if whole[name].stride == 0 else count))
                if self.beta_used:  # C's matrices in, where beta reads them
                    target = bufs["C"].at(first)
                    copies.append(BatchCopy(target, whole["C"].at(start + first), count))
                for copy in copies:
                    self._moved(copy)
                # From the caller's operands on another GPU: that GPU sends them, one after another.
                pushed = [(copy.src.first[1].device, copy, layer.event(copy.src.first[1].device)) for copy in copies
                          if copy.src.first[0] is not None and copy.src.first[1].device != device]
                copies = [copy for copy in copies if copy.src.first[0] is None or copy.src.first[1].device == device]
                gather = None
                if not in_place:
                    gather = BatchCopy(self.staging.at(start + first), bufs["C"].at(first), count)
                    self._moved(gather)
                steps.append(BatchStep(tuple(copies), tuple(after), copied if copies or pushed else None,
                                       tuple(pushed), count,
                                       bufs["A"].at(first), bufs["B"].at(first), bufs["C"].at(first),
                                       None, layer.event(device), layer.event(device), gather,
                                       layer.event(device) if gather else None))
            self.parts.append(BatchPart(device, start, stop, kernel, *streams, steps, layer.event(device),
                                        layer.event(device)))

    def release(self) -> None:
        for region in self.allocated:
            self.layer.free(region)
        self.allocated = []


class BatchCall(Fanout):
    """One call of a prepared batched split."""

    def __init__(self, prepared: PreparedBatch, shape: tuple[int, int, int], bases: dict[str, int],
                 alpha: float, beta: float, result: BatchResult):
        super().__init__(prepared.devices)
        self.prepared, self.shape, self.bases = prepared, shape, bases
        self.alpha, self.beta, self.result = alpha, beta, result

    def steps(self, device: int):
        prepared, bases, layer = self.prepared, self.bases, self.prepared.layer
        M, N, K = self.shape
        for part in prepared.parts:
            if part.device != device:
                continue
            layer.record(device, part.copies, part.begin)
            for step in part.steps:
                if step.copied is not None:
                    self.at(device, "copying its inputs")
                    for origin, copy, sent in step.pushed:
                        send = layer.stream(origin, "send")
                        copy_batch(layer, copy, bases, send)
                        layer.record(origin, send, sent)
                        layer.wait(device, part.copies, sent)
                    for event in step.after:
                        layer.wait(device, part.copies, event)
                    for copy in step.copies:
                        copy_batch(layer, copy, bases, part.copies)
                    layer.record(device, part.copies, step.copied)
                    layer.wait(device, part.compute, step.copied)
                self.at(device, "running the kernel")
                layer.record(device, part.compute, step.start)
                a, b, c = (bind(x.first, bases) for x in (step.a, step.b, step.c))
                layer.launch(part.kernel, M, N, K, self.alpha, a, b, self.beta, c, part.compute,
                             batch=step.count, strides=(step.a.stride, step.b.stride, step.c.stride))
                layer.record(device, part.compute, step.end)
                if step.gather is not None:
                    self.at(device, "sending its C back")
                    layer.wait(device, part.out, step.end)
                    copy_batch(layer, step.gather, bases, part.out)
                    layer.record(device, part.out, step.sent)
                yield
            layer.record(device, part.out if part.steps[-1].gather is not None else part.compute, part.done)

    def finish(self, device: int) -> None:
        layer = self.prepared.layer
        self.at(device, "waiting for the results")
        layer.synchronize(device)
        for index, part in enumerate(self.prepared.parts):
            if part.device == device:
                self.result.kernel_ms[index] = sum(layer.elapsed_ms(s.start, s.end) for s in part.steps)
                self.result.span_ms[index] = layer.elapsed_ms(part.begin, part.done)


def _kept_home(layer, kernels: Callable[[int], Any], a: Region, b: Region, c: Region, batch: int,
               strides: tuple[int, int, int], alpha: float, device: int, started: float) -> BatchResult:
    """The whole batch on the GPU that holds it (Shares kept it there, or it is the only device), C
    there too and beta 0: one batched launch in place, timed by two events; no staging, no copies,
    no fan-out (on 2 H100s the prepared path cost 0.1 ms more than this launch)."""
    M, K, N = a.rows, a.cols, b.cols
    result = BatchResult([(device, 0, batch)])
    try:
        kernel = kernels(device)
        stream = layer.stream(device, "compute")
        begin, end = layer.event(device), layer.event(device)
        layer.record(device, stream, begin)
        layer.launch(kernel, M, N, K, alpha, a, b, 0.0, c, stream, batch=batch, strides=strides)
        layer.record(device, stream, end)
        layer.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - any failure: say which device
        raise MultiGpuError(f"device {device} failed while running the kernel: {exc}; " + written_note(0.0)) from exc
    result.kernel_ms[0] = result.span_ms[0] = layer.elapsed_ms(begin, end)
    result.end_to_end_ms = (time.perf_counter() - started) * 1e3
    return result


def split_batched(kernels: Callable[[int], Any], a: Region, b: Region, c: Region, *, batch: int,
                  strides: tuple[int, int, int], alpha: float = 1.0, beta: float = 0.0, devices: list[int],
                  layer, chunks: int = 4, shares: Shares | None = SHARES) -> BatchResult:
    """C[i] = alpha A[i] B[i] + beta C[i] for i < batch, whole matrices per device. `a`, `b`, `c`:
    the first matrices (Regions: device, address, size, layout and leading dimension in the
    launcher's layouts), `strides` the floats between matrices (0: shared by every batch; C's may
    not be 0 with batch > 1). `kernels(device)` gives the launcher (its `launch` takes `batch` and
    `strides`). Returns once C is complete; raises MultiGpuError naming the device that failed.

    Where A's and B's matrices lie on one GPU of `devices` (shared operands aside), `shares` (the
    process's by default; None: always even) decides from the key's second call whether the split
    pays: a batch of small matrices is bound by that GPU's links, not by the other GPUs'
    arithmetic, and where the others finished no sooner than it would alone, it keeps the batch
    (with C there and beta 0: one batched launch in place)."""
    if batch < 0:
        raise ValueError(f"batch must be >= 0, not {batch}")
    if batch > 1 and strides[2] == 0:
        raise ValueError("C's batch stride is 0: every batch would write one matrix")
    if not devices:
        raise ValueError("no devices to split over")
    started = time.perf_counter()
    M, K, N = a.rows, a.cols, b.cols
    if b.rows != K or (c.rows, c.cols) != (M, N):
        raise ValueError(f"A's matrices are {a.rows} x {a.cols}, B's {b.rows} x {b.cols} and C's {c.rows} x "
                         f"{c.cols}: C's must be M x N for A's M x K times B's K x N")
    if batch == 0 or M == 0 or N == 0:
        return BatchResult([])
    stride = dict(zip("ABC", strides))
    for device in sorted({x.device for x in (a, b, c)}):  # the caller may still be writing them
        layer.drain(device)
    offsets = {name: Region(x.device, 0, x.rows, x.cols, x.layout, x.ld) for name, x in zip("ABC", (a, b, c))}
    where = Failure()
    where.at(devices[0], "preparing the kernel")
    first = kernels(devices[0])
    key = ("batched", first, M, N, K, batch, tuple(strides), tuple((x.device, x.layout, x.ld) for x in (a, b, c)),
           tuple(devices), beta != 0, chunks)
    learnt = key[1:]
    inputs = {x.device for x, s in ((a, strides[0]), (b, strides[1])) if s or batch == 1}
    source = next(iter(inputs)) if len(inputs) == 1 else None
    weights = shares.get(learnt) if shares is not None and source in devices else None
    parts = batch_parts(batch, devices, weights)
    if (beta == 0 and a.device == b.device == c.device == source
            and [d for d, (start, stop) in zip(devices, parts) if stop > start] == [source]):
        return _kept_home(layer, kernels, a, b, c, batch, strides, alpha, source, started)
    key += (tuple(parts),)
    cache = getattr(layer, "prepared", None)
    prepared = cache.get(key) if cache is not None else None
    if prepared is None:
        try:
            prepared = PreparedBatch(layer, kernels, where.at, offsets, stride, batch, devices,
                                     beta_used=beta != 0, chunks=chunks, weights=weights)
        except ValueError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure: say which device, write nothing
            raise MultiGpuError(f"device {where.device} failed while {where.stage}: {exc}; "
                                "C was not written") from exc
        if cache is not None:
            cache.put(key, prepared)
    result = BatchResult([(p.device, p.start, p.stop) for p in prepared.parts], bytes_moved=prepared.bytes_moved)
    bases = {"A": a.ptr, "B": b.ptr, "C": c.ptr}
    with prepared.lock:
        call = BatchCall(prepared, (M, N, K), bases, alpha, beta, result).run(prepared.home)
        result.issue_ms = call.issue_ms
        if not call.errors and prepared.beta_used:
            try:
                copy_batch(layer, BatchCopy(Strided(("C", offsets["C"]), stride["C"]), prepared.staging, batch),
                           bases, prepared.home_out)
                layer.synchronize(prepared.home)
            except Exception as exc:  # noqa: BLE001
                call.errors.append((prepared.home, "writing C", exc))
    if call.errors:
        if cache is not None:
            cache.drop(key)
        else:
            prepared.release()
        device, stage, exc = call.errors[0]
        raise MultiGpuError(f"device {device} failed while {stage}: {exc}; " + written_note(beta)) from exc
    if cache is None:
        prepared.release()
    if shares is not None and source in devices and not shares.decided(learnt):
        here = [i for i, part in enumerate(prepared.parts) if part.device == source]
        if here and result.kernel_ms.get(here[0]):
            part = prepared.parts[here[0]]
            spans = [result.span_ms[i] for i, p in enumerate(prepared.parts) if p.device != source]
            shares.learn(learnt, devices, source, batch, result.kernel_ms[here[0]] / (part.stop - part.start), spans)
    result.end_to_end_ms = (time.perf_counter() - started) * 1e3
    return result
