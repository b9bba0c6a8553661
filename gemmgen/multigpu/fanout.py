"""One call over several devices, issued from the calling thread in rounds, then waited for device
by device: `Fanout`, shared by split_gemm, the batched split and resident_gemm.

A call's share on each device is a generator (`steps(device)`) that queues one step's copies,
kernel and events per `next`. The calling thread takes the devices in turn, one step each per
round: every device's first kernel is queued within the first round (a step is a few driver calls,
some tens of microseconds), and the later steps are queued while the first kernels run. Then
`after_issue()` (work that needs every device's events recorded, such as a K split's sum on C's
device), then `finish(device)` on each (wait for it, read its timers): the call's time is the
slowest device's, plus a few microseconds a device.

Why not a host thread per device, as this module first did: on 4 H200s (2026-11-26) posting each
device's share to a thread of its own cost 0.4 to 0.9 ms a call more than issuing everything from
the calling thread (8192^3 from resident shards, fp32 library: 2.98 ms against 2.13 ms, its
kernels 2.09 ms). Each driver call lets go of Python's GIL and must take it back, so the device
threads queued behind each other for it at every call instead of issuing side by side.

A failure is kept with its device and stage; that device issues nothing more, the others still
finish, so that nothing is in flight when the caller hears of it. An interrupt (Ctrl-C) while
issuing waits for every device too, then goes on up.
"""

from __future__ import annotations

import time
from typing import Iterator


class Fanout:
    """One call over `devices` (in the order their steps are taken): a subclass says what `steps`
    queues on a device, what `after_issue` does once every device has issued, and what `finish`
    does on each. `errors` holds (device, stage, exception) of each failure."""

    def __init__(self, devices):
        self.devices = list(dict.fromkeys(devices))
        self.stage: dict[int, str] = {}  # per device: what it is doing, for the error that names it
        self.errors: list[tuple[int, str, BaseException]] = []
        self.issue_ms = 0.0  # host time spent issuing the rounds

    def steps(self, device: int) -> Iterator[None]:
        """Queue the device's share, yielding after each step."""
        raise NotImplementedError

    def after_issue(self) -> None:
        """Once every device has issued its share (their events exist): nothing by default."""

    def finish(self, device: int) -> None:
        """After every device's share is issued: wait for it, read its timers. Nothing by default."""

    def at(self, device: int, stage: str) -> None:
        self.stage[device] = stage

    def _failed(self, device: int, exc: Exception) -> None:
        self.errors.append((device, self.stage.get(device, "running"), exc))

    def run(self, home: int) -> "Fanout":
        """Issue every device's steps in rounds, then after_issue (its failure counted on `home`),
        then finish each device."""
        started = time.perf_counter()
        try:
            active = {device: self.steps(device) for device in self.devices}
            while active:
                for device, steps in list(active.items()):
                    try:
                        next(steps)
                    except StopIteration:
                        del active[device]
                    except Exception as exc:  # noqa: BLE001 - kept for the caller, which raises it
                        self._failed(device, exc)
                        del active[device]
            self.issue_ms = (time.perf_counter() - started) * 1e3
            try:
                self.after_issue()
            except Exception as exc:  # noqa: BLE001
                self._failed(home, exc)
        finally:  # also on an interrupt: nothing may be in flight when the caller goes on
            for device in self.devices:
                try:
                    self.finish(device)
                except Exception as exc:  # noqa: BLE001
                    self._failed(device, exc)
        return self
