"""The runner on a Dask cluster: one worker per GPU, on any number of hosts; the database stays here.

`tune --scheduler ADDRESS` (or `--devices`, a local cluster), for a search or a library, runs its
jobs through ClusterRunner, the runner.Runner whose workers are the cluster's:

- every candidate compiles on the workers' CPUs (any worker, any thread; NVRTC runs in helper
  processes of the worker, so compiles on one host run in parallel, through the on-disk cache);
- compiled jobs are dealt to the GPU workers, those declaring the resource GPU=1 (as dask-cuda's
  do), one at a time per worker: each measures it in a GPU process of its own (child.GpuProcess),
  started again after a candidate that kills it (a GPU fault poisons a CUDA context), so a fault
  costs only that candidate, recorded as `crash`; one silent for CANDIDATE_TIMEOUT_S is killed and
  recorded as `timeout`;
- a worker lost while holding a candidate (its host died, it was killed, or it has been missing
  from the scheduler for LEFT_GRACE_S: a late heartbeat is not a loss) costs that candidate,
  recorded as `lost` with the reason; the rest go to the workers that remain;
- results come back here and are appended to the JSON-lines database as they arrive (runner.py),
  so an interrupted tuning resumes and nothing is measured twice.

What a worker does with a job is the measurer's (measure.GpuMeasurer: NVRTC, then the GPU), so the
cluster logic runs in CI on the CPU with a fake measurer. Dask is an optional dependency:
pip install 'gemmgen[distributed]'.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from ..gpu import runtime
from .child import Child, ChildDied, ChildTimeout, GpuProcess
from .jobs import Device, Job
from .runner import CANDIDATE_TIMEOUT_S, Runner, RunnerError, compile_job, describe_gpu, measure_job

WORKER_WAIT_S = 60.0        # for a cluster's first GPU worker to join
CONNECT_TIMEOUT_S = 30.0    # for a scheduler to answer
LEFT_GRACE_S = 30.0         # a worker missing from the scheduler this long has left (not a late heartbeat)


class ClusterError(RunnerError):
    """The cluster cannot tune (no Dask, no scheduler, no GPU worker): the message says what to do."""


def require_dask():
    """The distributed module, or a message saying how to install it."""
    try:
        import distributed
    except ImportError:
        raise ClusterError("tuning on a cluster (--scheduler, --devices) runs on Dask, which is not "
                           "installed: pip install 'gemmgen[distributed]' (dask and distributed)") from None
    return distributed


# --- in a worker: its GPU process and its NVRTC helpers ---------------------------------------------

class _Children:
    """A worker process's children: one GPU process, and a pool of helpers for NVRTC."""

    def __init__(self):
        self.lock = threading.Lock()
        self.gpu = GpuProcess()  # the worker's environment names its GPU (CUDA_VISIBLE_DEVICES)
        self.idle: list[Child] = []

    def helper(self, function, args: tuple):
        with self.lock:
            child = self.idle.pop() if self.idle else None
        child = child if child is not None and child.alive else Child()
        result = child.call(function, args)
        with self.lock:
            self.idle.append(child)
        return result


_children = _Children()


def _compile_task(measurer, plan, source):
    return _children.helper(compile_job, (measurer, plan, source))


def _gpu_task(measurer, job: Job, compiled) -> dict:
    """On a GPU worker: the job measured in the worker's GPU process, one at a time."""
    with _children.lock:
        return _children.gpu.run(measure_job, (measurer, job, compiled), CANDIDATE_TIMEOUT_S, job.doing)


def _describe_task(measurer):
    """On a GPU worker: its Device, or the reason its GPU process could not start CUDA (a string)."""
    with _children.lock:
        try:
            return _children.gpu.call(describe_gpu, (measurer,), CANDIDATE_TIMEOUT_S)
        except (ChildDied, ChildTimeout, RuntimeError) as exc:
            return str(exc)


# --- the cluster -------------------------------------------------------------------------------------

def local_cluster(devices: list[int], threads_per_worker: int | None = None):
    """One Dask worker (with a nanny) per GPU of this host, pinned to it by CUDA_VISIBLE_DEVICES
    before anything in it touches CUDA, declaring the resource GPU=1. Workers differ only in that
    variable, which LocalCluster cannot vary, so this is its base, SpecCluster, as in dask-cuda."""
    distributed = require_dask()
    import dask
    threads = threads_per_worker or max(2, (os.cpu_count() or 2) // max(1, len(devices)))
    workers = {f"gpu{index}": {"cls": distributed.Nanny,
                               "options": {"nthreads": threads, "resources": {"GPU": 1},
                                           "env": {"CUDA_VISIBLE_DEVICES": str(device)}}}
               for index, device in enumerate(devices)}
    # A worker lost mid-candidate: that candidate fails (KilledWorker) instead of being retried.
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        return distributed.SpecCluster(
            workers=workers, scheduler={"cls": distributed.Scheduler, "options": {"dashboard": False}},
            silence_logs=40)  # logging.ERROR: a killed worker is reported in the records


@contextlib.contextmanager
def connect(scheduler, devices: list[int] | None = None):
    """A Client: the one given, one to a scheduler's address, or one to a local cluster ("local")."""
    distributed = require_dask()
    if isinstance(scheduler, distributed.Client):
        yield scheduler
        return
    if scheduler == "local":
        if devices is None:
            devices = list(range(runtime.device_count()))
        if not devices:
            raise ClusterError("no CUDA GPU found for a local cluster: name the devices, or start "
                               "workers with GPUs and pass --scheduler ADDRESS")
        with local_cluster(devices) as cluster, distributed.Client(cluster) as client:
            yield client
        return
    try:
        client = distributed.Client(scheduler, timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise ClusterError(f"no Dask scheduler answers at {scheduler} ({exc}): start one with "
                           "`dask scheduler`, and GPU workers with `dask worker ADDRESS --resources "
                           "GPU=1` (see docs/multi-gpu.md)") from None
    with client:
        yield client


def gpu_workers(client) -> dict[str, dict]:
    """The workers that declare a GPU, by address."""
    try:
        workers = client.scheduler_info(n_workers=-1)["workers"]
    except TypeError:  # distributed before 2025 lists every worker without being asked
        workers = client.scheduler_info()["workers"]
    return {address: w for address, w in workers.items() if w.get("resources", {}).get("GPU", 0) >= 1}


def _wait_for_gpus(client) -> dict[str, dict]:
    deadline = time.monotonic() + WORKER_WAIT_S
    while not (workers := gpu_workers(client)):
        if time.monotonic() > deadline:
            raise ClusterError(f"no worker of the cluster at {client.scheduler.address} declares a GPU after "
                               f"{WORKER_WAIT_S:.0f} s: start one worker per GPU with `dask worker "
                               "ADDRESS --resources GPU=1` and CUDA_VISIBLE_DEVICES set (see docs/multi-gpu.md)")
        time.sleep(0.2)
    return workers


class ClusterRunner(Runner):
    """runner.Runner on a Dask cluster (a distributed.Client's): compiles on any worker, jobs on the
    GPU workers, one at a time each."""

    def __init__(self, client, measurer=None):
        super().__init__(measurer)
        self.client = client
        self.workers = 0
        self.missing: dict[str, float] = {}  # worker address -> when it was first seen missing

    @property
    def gpus(self) -> int:
        return self.workers

    def __enter__(self) -> "ClusterRunner":
        self.device = self._describe()
        return self

    def __exit__(self, *exc) -> None:
        pass  # the client, and the cluster, are connect()'s

    def _describe(self) -> Device:
        """Device, driver and SM count, from every GPU worker (which starts each one's GPU process)."""
        distributed = require_dask()
        workers = _wait_for_gpus(self.client)
        futures = [self.client.submit(_describe_task, self.measurer, workers=[address], resources={"GPU": 1},
                                      pure=False) for address in workers]
        answers = set()
        for future in distributed.as_completed(futures):
            answer = future.result()
            if isinstance(answer, str):  # its GPU process died at once
                raise ClusterError(f"a GPU worker could not start CUDA: {answer}")
            answers.add(answer)
        if len(answers) > 1:
            raise ClusterError(f"the cluster's GPUs differ ({', '.join(sorted(d.name for d in answers))}): its "
                               "records would mix devices; tune on one kind of GPU at a time")
        self.workers = len(gpu_workers(self.client))
        return answers.pop()

    def _abandoned(self, running: dict) -> list[tuple]:
        """The running candidates whose worker has been missing from the scheduler for LEFT_GRACE_S:
        a worker whose heartbeats come late on a loaded host drops out and comes back under its
        own address, its candidate still due (a CI run once recorded such a one as lost)."""
        workers = gpu_workers(self.client)
        now = time.monotonic()
        self.missing = {address: since for address, since in self.missing.items() if address not in workers}
        gone = []
        for future, (_, address) in running.items():
            if future.done() or address in workers:
                continue
            since = self.missing.setdefault(address, now)
            if now - since >= LEFT_GRACE_S:
                future.cancel()  # its worker left: no result will come
                gone.append((future, {"status": "lost", "reason": f"the worker {address} left while running it"}))
        return gone

    def _idle(self, running: dict) -> list:
        workers = gpu_workers(self.client)
        if not workers and not running:
            workers = _wait_for_gpus(self.client)
        busy = {address for _, address in running.values()}
        return [address for address in workers if address not in busy]

    def _compile(self, plan, source):
        return self.client.submit(_compile_task, self.measurer, plan, source, pure=False)

    def _measure(self, worker, job: Job, compiled):
        return self.client.submit(_gpu_task, self.measurer, job, compiled, workers=[worker], resources={"GPU": 1},
                                  pure=False)

    def _fields(self, handle, job: Job, worker) -> dict | None:
        distributed = require_dask()
        try:
            return handle.result()
        except distributed.KilledWorker as exc:  # the worker died holding it
            return {"status": "lost", "reason": f"the worker {worker} was lost while running it "
                                                f"({type(exc).__name__}); the search went on without it"}
        except Exception as exc:  # noqa: BLE001 - the worker could not run it at all
            return {"status": "crash", "reason": f"{type(exc).__name__}: {exc}"}

    def _wait(self, handles: list, timeout: float) -> None:
        if not handles:
            return
        try:
            require_dask().wait(handles, timeout=timeout, return_when="FIRST_COMPLETED")
        except TimeoutError:
            pass
