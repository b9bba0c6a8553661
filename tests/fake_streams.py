"""Several GPUs on the CPU, whose streams really run out of order: a multigpu.DeviceLayer.

Memory is host memory (NaN-poisoned when allocated), addressed by raw pointers as on a GPU, each
buffer tagged with its device. Streams are queues: nothing runs when issued. `synchronize` runs
queued work in a random order (seeded) that keeps only what CUDA promises: order within a stream,
and a stream that waits on an event held until the work recorded before that event ran (a wait on
an event never recorded waits for nothing, as in CUDA). So a missing event shows up as a wrong
result, a kernel reading NaN before its copy landed, for some seed.

Kernels are fake_device.ReferenceKernel (the C ABI computed on host addresses in the plan's
layouts); a launch or copy whose operands sit on another device than its stream is refused. Every
operation is kept with what it waited for, so a test can ask what a kernel depended on.

Time is simulated too: an op starts when its stream's previous op and the event it waits for have
ended, and not before the host issued it (the host's clock moves to the end of a device's work when
it waits for that device); a kernel lasts its GFLOP (divided by its device's `speed`), a copy between devices its
bytes over `link_bytes_per_ms` (or that pair's entry in `links`), a copy on one device its bytes
over `local_bytes_per_ms`, anything else nothing; with `port_bytes_per_ms`, a device's outgoing
copies also take turns on its one port at that rate. Events read those clocks (elapsed_ms), so a
split's timings, what a balance learns from them and a measured peer bandwidth follow the
simulated machine.

The layer takes a lock around its queues (a caller may split from several threads), and each op
records the thread that issued it. An event may be recorded again (as a CUDA event is): a wait
waits for its latest record at the time of the wait.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

import numpy as np

from fake_device import ReferenceKernel, matrix_at
from gemmgen.multigpu.parts import Region
from gemmgen.multigpu.prepared import PreparedCache


class SimArray(np.ndarray):
    """A host array standing for device memory: `.device` and `__cuda_array_interface__`."""

    device: int = 0

    def __array_finalize__(self, obj):
        self.device = getattr(obj, "device", 0)  # a view (A.T) stays on its array's device

    @property
    def __cuda_array_interface__(self):
        interface = self.__array_interface__
        return {"shape": self.shape, "typestr": interface["typestr"], "data": interface["data"],
                "strides": self.strides, "version": 3}


def on_device(array, device: int, layout: str = "row") -> SimArray:
    """A float32 copy of `array` 'on' `device`, row- or column-major."""
    out = np.array(array, dtype=np.float32, order="C" if layout == "row" else "F").view(SimArray)
    out.device = device
    return out


@dataclass(eq=False)
class Op:
    kind: str                  # copy, launch, accumulate, record, wait
    device: int
    stream: tuple[int, str]
    run: object = None
    waits_for: "Op | None" = None
    after: "Op | None" = None   # the previous op of its stream
    done: bool = False
    flops: float = 0.0          # a launch's floating-point operations
    moved: int = 0              # bytes a copy moves between devices
    end: float = 0.0            # simulated ms at which it ended
    link: tuple[int, int] | None = None   # a copy's (source, destination) devices
    nbytes: int = 0             # a copy's bytes
    thread: int = 0             # the host thread that issued it
    issued: float = 0.0         # simulated ms at which the host issued it: it starts no sooner


@dataclass(eq=False)
class Event:
    op: Op | None = None


class SimulatedDevices:
    """The layer. fail_on=(device, stage) raises there: stage 'allocate', 'copy', 'launch' (when
    issued) or 'sync' (when the device is synchronized, as a kernel fault surfaces)."""

    def __init__(self, seed: int = 0, fail_on: tuple[int, str] | None = None, tf32: bool = False,
                 speed: dict[int, float] | None = None, link_bytes_per_ms: float = float("inf"),
                 links: dict[tuple[int, int], float] | None = None, local_bytes_per_ms: float = float("inf"),
                 count: int = 8, port_bytes_per_ms: float = float("inf")):
        self.speed, self.link_bytes_per_ms = speed or {}, link_bytes_per_ms
        self.links, self.local_bytes_per_ms, self.count = links or {}, local_bytes_per_ms, count
        self.port_bytes_per_ms = port_bytes_per_ms
        self.port_free: dict[int, float] = {}  # per device: when its outgoing port is next free
        self.lock = threading.RLock()
        self.prepared = PreparedCache()
        self.allocated: list[Region] = []
        self.rng = random.Random(seed)
        self.fail_on = fail_on
        self.memory: list[np.ndarray] = []
        self.queues: dict[tuple[int, str], list[Op]] = {}
        self.last: dict[tuple[int, str], Op] = {}
        self.ops: list[Op] = []
        self.moved = 0
        self.host_ms = 0.0  # the host's simulated clock: where its last wait for a device ended
        self.kernels: dict = {}
        self.freed: list[Region] = []

    def _maybe_fail(self, device, stage):
        if self.fail_on == (device, stage):
            raise RuntimeError(f"CUDA_ERROR_ILLEGAL_ADDRESS on simulated device {device} ({stage})")

    # --- memory -------------------------------------------------------------------------------
    def locate(self, array, layout, what):
        from gemmgen.gpu.runtime import as_matrix
        m = as_matrix(array, what, layout)
        return Region(array.device, m.ptr, m.rows, m.cols, m.layout, m.ld)

    def device_of(self, array) -> int:
        return array.device

    def device_count(self) -> int:
        return self.count

    def allocate(self, device, rows, cols, layout):
        self._maybe_fail(device, "allocate")
        array = on_device(np.full((rows, cols), np.nan, np.float32), device, layout)
        with self.lock:
            self.memory.append(array)
        region = self.locate(array, layout, "buffer")
        self.allocated.append(region)
        return region

    def hand_over(self, region):
        for array in self.memory:
            if array.__array_interface__["data"][0] == region.ptr:
                return array
        raise KeyError(region)

    def free(self, region):
        """Poisons the buffer (NaN): a split that read it after freeing it computes NaN."""
        self.hand_over(region)[...] = np.nan
        self.freed.append(region)

    @staticmethod
    def view(region: Region) -> np.ndarray:
        if region.layout == "row":
            return matrix_at(region.ptr, region.rows, region.cols, region.ld, 1)
        return matrix_at(region.ptr, region.rows, region.cols, 1, region.ld)

    # --- streams and events ---------------------------------------------------------------------
    def kernel(self, device, plan):
        if (device, plan.name) not in self.kernels:
            self.kernels[device, plan.name] = ReferenceKernel(plan)
        return self.kernels[device, plan.name]

    def stream(self, device, role):
        return (device, role)

    def _issue(self, op: Op) -> Op:
        with self.lock:
            op.thread = threading.get_ident()
            op.issued = self.host_ms
            op.after = self.last.get(op.stream)
            self.last[op.stream] = op
            self.queues.setdefault(op.stream, []).append(op)
            self.ops.append(op)
            self.moved += op.moved
        return op

    def event(self, device):
        return Event()

    def record(self, device, stream, event=None):
        assert stream[0] == device, "an event is recorded on a stream of its own device"
        event = event if event is not None else Event()
        event.op = self._issue(Op("record", device, stream))
        return event

    def wait(self, device, stream, event):
        assert stream[0] == device
        self._issue(Op("wait", device, stream, waits_for=event.op))

    def copy(self, dst, src, stream):
        self._maybe_fail(stream[0], "copy")
        assert (dst.rows, dst.cols, dst.layout) == (src.rows, src.cols, src.layout), (dst, src)
        assert stream[0] in (dst.device, src.device), "a copy runs on a stream of one of its ends"

        def run():
            self.view(dst)[...] = self.view(src)
        moved = dst.nbytes if dst.device != src.device else 0
        self._issue(Op("copy", stream[0], stream, run, moved=moved, link=(src.device, dst.device),
                       nbytes=dst.nbytes))

    def accumulate(self, dst, src, stream):
        assert dst.device == src.device == stream[0], "accumulate adds on one device"

        def run():
            self.view(dst)[...] += self.view(src)
        self._issue(Op("accumulate", stream[0], stream, run))

    def launch(self, kernel, M, N, K, alpha, a, b, beta, c, stream, *, batch=1, strides=(0, 0, 0)):
        device = stream[0]
        self._maybe_fail(device, "launch")
        assert a.device == b.device == c.device == device, \
            f"a kernel on device {device} given operands on {a.device}, {b.device}, {c.device}"
        assert (a.rows, a.cols, b.rows, b.cols, c.rows, c.cols) == (M, K, K, N, M, N)

        def run():
            batched = {"batch": batch, "strides": strides} if batch != 1 else {}  # a 2-D launcher takes none
            kernel.launch(M, N, K, alpha, a.ptr, a.ld, b.ptr, b.ld, beta, c.ptr, c.ld, **batched)
        self._issue(Op("launch", device, stream, run, flops=2.0 * M * N * K * batch))

    def elapsed_ms(self, start, end):
        assert start.op.done and end.op.done, "elapsed time of events that have not completed"
        return end.op.end - start.op.end

    def _duration(self, op: Op) -> float:
        if op.kind == "launch":
            return op.flops / 1e9 / self.speed.get(op.device, 1.0)  # 1 GFLOP per fake millisecond
        if op.kind != "copy":
            return 0.0
        if op.link[0] == op.link[1]:
            return op.nbytes / self.local_bytes_per_ms
        return op.nbytes / self.links.get(op.link, self.link_bytes_per_ms)

    # --- running ----------------------------------------------------------------------------------
    def _ready(self, op: Op) -> bool:
        return (op.after is None or op.after.done) and (op.waits_for is None or op.waits_for.done)

    def synchronize(self, device):
        self._maybe_fail(device, "sync")
        with self.lock:
            self._run_until_idle(device)
            ends = [op.end for op in self.ops if op.device == device and op.done]
            self.host_ms = max([self.host_ms] + ends)  # the host waited until then

    def drain(self, device):
        """The caller's streams are not simulated: the layer's own work is all there is (a fault
        planted at 'sync' is the layer's kernels', surfacing when the layer waits for them)."""
        with self.lock:
            self._run_until_idle(device)

    def _run_until_idle(self, device):
        while any(q for (d, _), q in self.queues.items() if d == device):
            heads = [q[0] for q in self.queues.values() if q and self._ready(q[0])]
            if not heads:
                raise RuntimeError("deadlock: every stream waits on an event that cannot complete")
            op = self.rng.choice(heads)
            self.queues[op.stream].pop(0)
            op.end = max([x.end for x in (op.after, op.waits_for) if x is not None] + [op.issued])
            if op.kind == "copy" and op.link[0] != op.link[1] and self.port_bytes_per_ms != float("inf"):
                # the source's outgoing port carries one copy at a time
                op.end = max(op.end, self.port_free.get(op.link[0], 0.0))
                op.end += max(self._duration(op), op.nbytes / self.port_bytes_per_ms)
                self.port_free[op.link[0]] = op.end
            else:
                op.end += self._duration(op)
            if op.run is not None:
                op.run()
            op.done = True

    # --- what a test asks -------------------------------------------------------------------------
    @staticmethod
    def ancestors(op: Op) -> set:
        """Every op that must have run before `op` could."""
        seen, todo = set(), [op]
        while todo:
            current = todo.pop()
            for parent in (current.after, current.waits_for):
                if parent is not None and parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        return seen
