"""One host thread per GPU, shared by the process, issuing each device's share of a call: the calling
thread posts a call once and waits for it once, whatever the number of devices.

Why threads and not CUDA graphs: a split's launchers are any C-ABI launcher (a Kernel, a library
choosing its member per block shape, stream-K kernels with a workspace per stream), and the caller's
arrays change from call to call (a new `out` each time); a graph would bake their addresses in and
need updating per call, node by node, which costs what it saves. The driver calls (launches through
ctypes, CuPy's copies and event calls) let go of the GIL, so the threads issue and wait on their
devices side by side, and a device's first kernel starts after its own thread's few Python steps
instead of after every device before it.

A call (`Fanout`) runs in three stages on each device's thread: `issue(device)` (queue the copies,
kernels and events), then, by whichever thread finishes issuing last, `after_issue()` (work that
needs every device's events to exist, such as a K split's sum on C's device: no thread ever waits
for another, so calls posted from several threads cannot deadlock), then `finish(device)` (wait for
the device, read its timers). A failure is kept with its device and stage; the other devices still
finish, so that nothing is in flight when the caller hears of it.
"""

from __future__ import annotations

import os
import threading
from typing import Callable


class Fanout:
    """One call over several devices: a subclass says what `issue` and `finish` do on a device's
    thread and what `after_issue` does once, on the thread that issues last. `errors` holds
    (device, stage, exception) of each failure."""

    def __init__(self, devices: frozenset[int]):
        self.pending = set(devices)      # devices whose thread has not taken the call yet
        self.unissued = len(devices)
        self.unfinished = len(devices)
        self.stage: dict[int, str] = {}  # per device: what it is doing, for the error that names it
        self.errors: list[tuple[int, str, BaseException]] = []
        self.lock = threading.Lock()
        self.done = threading.Event()

    def issue(self, device: int) -> None:
        raise NotImplementedError

    def after_issue(self) -> None:
        """Once every device has issued its share (their events exist): nothing by default."""

    def finish(self, device: int) -> None:
        """After the device's share is issued: wait for it, read its timers. Nothing by default."""

    def at(self, device: int, stage: str) -> None:
        self.stage[device] = stage

    def _attempt(self, device: int, step: Callable, *args) -> None:
        try:
            step(*args)
        except BaseException as exc:  # noqa: BLE001 - kept for the caller, which raises it
            self.errors.append((device, self.stage.get(device, "running"), exc))

    def run_on(self, device: int, home: int) -> None:
        """A device thread's whole share of the call (`home`: where after_issue's failures count)."""
        self._attempt(device, self.issue, device)
        with self.lock:
            self.unissued -= 1
            last = self.unissued == 0
        if last:
            self._attempt(home, self.after_issue)
        self._attempt(device, self.finish, device)
        with self.lock:
            self.unfinished -= 1
            ended = self.unfinished == 0
        if ended:
            self.done.set()


class DeviceThreads:
    """The process's device threads: started once per device, each taking, in the order posted, the
    calls that name its device. Posting and waiting cost the same for 2 devices as for 8."""

    def __init__(self):
        self.cond = threading.Condition()
        self.posted: list[tuple[Fanout, int]] = []
        self.threads: dict[int, threading.Thread] = {}
        self.pid = os.getpid()

    def start(self, devices) -> None:
        """A thread for each device that has none (after a fork, the parent's threads are gone)."""
        with self.cond:
            if self.pid != os.getpid():
                self.threads, self.posted, self.pid = {}, [], os.getpid()
            for device in devices:
                if device not in self.threads:
                    thread = threading.Thread(target=self._serve, args=(device,), daemon=True,
                                              name=f"gemmgen-gpu{device}")
                    self.threads[device] = thread
                    thread.start()

    def post(self, call: Fanout, home: int) -> None:
        """Hand the call to its devices' threads (which must have been started)."""
        with self.cond:
            if self.pid != os.getpid():  # a forked child: its threads did not come along
                self.start(call.pending)
            self.posted.append((call, home))
            self.cond.notify_all()

    def run(self, call: Fanout, home: int) -> Fanout:
        """Post the call and wait until every device has finished it."""
        self.post(call, home)
        call.done.wait()
        return call

    def _take(self, device: int) -> tuple[Fanout, int] | None:
        for entry in self.posted:
            call = entry[0]
            if device in call.pending:
                call.pending.discard(device)
                if not call.pending:
                    self.posted.remove(entry)
                return entry
        return None

    def _serve(self, device: int) -> None:
        while True:
            with self.cond:
                entry = self._take(device)
                while entry is None:
                    self.cond.wait()
                    entry = self._take(device)
            entry[0].run_on(device, entry[1])


THREADS = DeviceThreads()
