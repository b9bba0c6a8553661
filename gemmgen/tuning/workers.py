"""Where a tuning's jobs run, a search's or a library's: this host's GPUs (runner.LocalRunner, a
disposable process per GPU) or a Dask cluster (distributed.ClusterRunner, one worker per GPU, on any
number of hosts), behind one context manager."""

from __future__ import annotations

import contextlib
from typing import Iterator

from .distributed import ClusterRunner, connect
from .runner import LocalRunner, Runner


@contextlib.contextmanager
def open_runner(devices: list[int] | None = None, scheduler=None, measurer=None) -> Iterator[Runner]:
    """A started runner: without a `scheduler`, a GPU process per GPU of `devices` on this host (None:
    GPU 0); with one (a Dask scheduler's address, "local" for a local cluster over `devices`, or a
    distributed.Client), the GPU workers of that cluster. `measurer`: measure.GpuMeasurer's
    stand-in (tests); RunnerError (ClusterError on a cluster) when the workers cannot tune."""
    if scheduler is None:
        with LocalRunner(devices, measurer) as runner:
            yield runner
        return
    with connect(scheduler, devices) as client, ClusterRunner(client, measurer) as runner:
        yield runner
