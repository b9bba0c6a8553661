"""Tuning on a Dask cluster: one worker per GPU, on any number of hosts; the database stays here.

`tune --scheduler ADDRESS` (or `--devices`, a local cluster) hands the evaluator of runner.py to
this module. For each batch of points a strategy proposes:

- every candidate compiles on the workers' CPUs (any worker, any thread; NVRTC runs in helper
  processes of the worker, so compiles on one host run in parallel, through the on-disk cache);
- compiled candidates are dealt to the GPU workers, those declaring the resource GPU=1 (as
  dask-cuda's do), one at a time per worker: each validates and times it in a child process of
  its own, restarted after a candidate that kills it (a GPU fault poisons a CUDA context), so a
  fault costs only that candidate, recorded as `crash`; one silent for CANDIDATE_TIMEOUT_S is
  killed and recorded as `timeout`;
- a worker lost while holding a candidate (its host died, it was killed) costs that candidate,
  recorded as `lost` with the reason; the rest go to the workers that remain;
- results come back here and are appended to the JSON-lines database as they arrive, so an
  interrupted search resumes and nothing is measured twice.

What a worker does with a candidate is a Runner (GpuRunner here: NVRTC, then tune.GpuBench on
the worker's GPU), so the cluster logic runs in CI on the CPU with a fake runner. Dask is an
optional dependency: pip install 'gemmgen[distributed]'.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from ..gpu import runtime
from ..gpu.compile import compile_plan
from ..plan.space import describe, point_key
from .database import append as _append  # the database's one writer
from .measure import CUBLAS_KEY, GpuBench
from .runner import CANDIDATE_TIMEOUT_S, Evaluator, db_scope

WORKER_WAIT_S = 60.0        # for a cluster's first GPU worker to join
CONNECT_TIMEOUT_S = 30.0    # for a scheduler to answer
COMPILE_ATTEMPTS = 2        # a compile whose helper process dies this often is recorded as failed


class ClusterError(RuntimeError):
    """The cluster cannot tune (no Dask, no scheduler, no GPU worker): the message says what to do."""


def require_dask():
    """The distributed module, or a message saying how to install it."""
    try:
        import distributed
    except ImportError:
        raise ClusterError("tuning on a cluster (--scheduler, --devices) runs on Dask, which is not "
                           "installed: pip install 'gemmgen[distributed]' (dask and distributed)") from None
    return distributed


# --- child processes of a worker -------------------------------------------------------------------

class ChildDied(RuntimeError):
    def __init__(self, code):
        super().__init__(f"the child process died (exit code {code})")
        self.code = code


class ChildTimeout(RuntimeError):
    pass


def _write(stream, value) -> None:
    data = pickle.dumps(value)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _read(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))


_retire = False  # set by a function whose failure poisoned this process (a CUDA fault)


def retire_after_reply() -> None:
    """Ends this child once its reply is sent: the next call gets a fresh process."""
    global _retire
    _retire = True


def _serve() -> None:
    """A child's loop: run each (function, args) sent on stdin, send back the result."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything the functions print goes to stderr, not into the replies
    requests = sys.stdin.buffer
    while (request := _read(requests)) is not None:
        function, args = request
        try:
            reply = ("ok", function(*args))
        except Exception as exc:  # noqa: BLE001 - sent back, the child lives on
            reply = ("error", f"{type(exc).__name__}: {str(exc)[:500]}")
        _write(out, reply)
        if _retire:
            os._exit(3)


class Child:
    """A Python process that runs the functions it is sent, one at a time, keeping its state (a
    CUDA context, buffers) between calls. It is a subprocess, not a multiprocessing child, since
    Dask's worker processes are daemons, which multiprocessing forbids to have children."""

    def __init__(self):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from gemmgen.tuning.distributed import _serve; _serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def call(self, function, args: tuple, timeout: float | None = None):
        try:
            _write(self.process.stdin, (function, args))
            ready, _, _ = select.select([self.process.stdout], [], [], timeout)
            if not ready:
                raise ChildTimeout(f"no result within {timeout:.0f} s")
            reply = _read(self.process.stdout)
        except (BrokenPipeError, EOFError, pickle.UnpicklingError):
            reply = None
        if reply is None:
            raise ChildDied(self.process.wait())
        status, value = reply
        if status == "error":
            raise RuntimeError(value)
        return value

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


class _Children:
    """A worker process's children: one for its GPU (restarted when it dies), a pool for NVRTC."""

    def __init__(self):
        self.lock = threading.Lock()
        self.gpu: Child | None = None
        self.idle: list[Child] = []

    def on_gpu(self, function, args: tuple, timeout: float):
        with self.lock:  # one GPU, one candidate at a time
            if self.gpu is None or self.gpu.process.poll() is not None:
                self.gpu = Child()
            try:
                return self.gpu.call(function, args, timeout)
            except ChildTimeout:
                self.gpu.kill()
                self.gpu = None
                raise
            except ChildDied:
                self.gpu = None
                raise

    def helper(self, function, args: tuple):
        with self.lock:
            child = self.idle.pop() if self.idle else None
        child = child if child is not None and child.process.poll() is None else Child()
        try:
            result = child.call(function, args)
        except ChildDied:
            raise
        with self.lock:
            self.idle.append(child)
        return result


_children = _Children()


# --- what a worker does with a candidate -------------------------------------------------------------

def _compile_or_reason(plan, source):
    try:
        return compile_plan(plan, source)
    except Exception as exc:  # noqa: BLE001 - the candidate's failure, recorded as such
        return f"{type(exc).__name__}: {str(exc)[:500]}"


_benches: dict = {}


class GpuRunner:
    """Runs in the workers: `compile` on a CPU, the rest in the worker's GPU process."""

    def compile(self, plan, source):
        """The Compiled kernel, or why it did not compile (a string)."""
        return _children.helper(_compile_or_reason, (plan, source))

    def describe(self) -> tuple[str, str, int]:
        info = runtime.device_info()
        return info.name, info.driver_version, info.sm_count

    def _bench(self, shape, budget_s) -> GpuBench:
        if (shape, budget_s) not in _benches:
            _benches.clear()  # one shape's buffers at a time
            _benches[shape, budget_s] = GpuBench(shape, budget_s)
        return _benches[shape, budget_s]

    def cublas(self, shape, budget_s, baseline, layouts) -> dict:
        return self._bench(shape, budget_s).cublas(baseline, layouts)

    def measure(self, plan, compiled, shape, budget_s) -> dict:
        return self._bench(shape, budget_s).candidate(plan, compiled)


def default_runner():
    return GpuRunner()


def _compile_task(runner, plan, source):
    return runner.compile(plan, source)


def _guarded(function, *args):
    """In the GPU process: an exception (a CUDA fault poisons the process's context) becomes a
    `crash` record, and the process ends once it has replied."""
    try:
        return function(*args)
    except Exception as exc:  # noqa: BLE001
        retire_after_reply()
        return {"status": "crash", "reason": f"{type(exc).__name__}: {str(exc)[:400]}"}


def _gpu_task(runner, method: str, *args):
    """On a GPU worker: runner.<method>(*args) in the worker's GPU process. A candidate that
    raises, kills that process or hangs becomes a record."""
    try:
        return _children.on_gpu(_guarded, (getattr(runner, method), *args), CANDIDATE_TIMEOUT_S)
    except ChildDied as exc:
        return {"status": "crash", "reason": f"the GPU process died (exit code {exc.code}); the "
                                             "candidate faulted on the GPU"}
    except ChildTimeout:
        return {"status": "timeout", "reason": f"no result within {CANDIDATE_TIMEOUT_S:.0f} s"}


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


def _wait_for_gpus(client, address_hint: str) -> dict[str, dict]:
    deadline = time.monotonic() + WORKER_WAIT_S
    while not (workers := gpu_workers(client)):
        if time.monotonic() > deadline:
            raise ClusterError(f"no worker of the cluster at {address_hint} declares a GPU after "
                               f"{WORKER_WAIT_S:.0f} s: start one worker per GPU with `dask worker "
                               "ADDRESS --resources GPU=1` and CUDA_VISIBLE_DEVICES set (see docs/multi-gpu.md)")
        time.sleep(0.2)
    return workers


def _describe(client, runner) -> tuple[str, str, int]:
    """Device, driver and SM count, from every GPU worker (which starts each one's GPU process)."""
    distributed = require_dask()
    workers = _wait_for_gpus(client, str(client.scheduler.address))
    futures = [client.submit(_gpu_task, runner, "describe", workers=[address], resources={"GPU": 1},
                             pure=False) for address in workers]
    answers = set()
    for future in distributed.as_completed(futures):
        answer = future.result()
        if isinstance(answer, dict):  # its GPU process died at once
            raise ClusterError(f"a GPU worker could not start CUDA: {answer['reason']}")
        answers.add(tuple(answer))
    if len(answers) > 1:
        raise ClusterError(f"the cluster's GPUs differ ({sorted(answers)}): its records would mix "
                           "devices; tune on one kind of GPU at a time")
    return answers.pop()


@dataclass
class DaskEvaluator(Evaluator):
    """tune.Evaluator whose points are compiled, validated and timed on a Dask cluster."""

    client: Any = None
    runner: Any = None
    workers: int = 0

    @property
    def gpus(self) -> int:
        return self.workers

    def _evaluate(self, points: list[tuple], with_cublas: bool) -> None:
        distributed = require_dask()
        client = self.client
        plans = {self.keys[p]: self.space.plan_at[p] for p in points}
        compiles = {client.submit(_compile_task, self.runner, plan, self._source(plan), pure=False): key
                    for key, plan in plans.items()}
        ready: deque = deque([CUBLAS_KEY] if with_cublas else [])
        compiled: dict[str, Any] = {}
        running: dict[Any, tuple[str, str]] = {}   # future -> (key, worker address)
        attempts = {key: 1 for key in plans}
        while compiles or ready or running:
            workers = gpu_workers(client)
            if not workers and not running:
                workers = _wait_for_gpus(client, str(client.scheduler.address))
            for future, (key, address) in list(running.items()):
                if future.status == "pending" and address not in workers:
                    future.cancel()  # its worker left: no result will come
                    del running[future]
                    self._record(key, plans, status="lost", reason=f"the worker {address} left while "
                                                                    "running it")
            busy = {address for _, address in running.values()}
            for address in workers:
                if not ready or address in busy:
                    continue
                key = ready.popleft()
                if key == CUBLAS_KEY:
                    future = client.submit(_gpu_task, self.runner, "cublas", self.shape, self.budget_s,
                                           self.baseline, self._layouts(), workers=[address],
                                           resources={"GPU": 1}, pure=False)
                else:
                    future = client.submit(_gpu_task, self.runner, "measure", plans[key], compiled.pop(key),
                                           self.shape, self.budget_s, workers=[address],
                                           resources={"GPU": 1}, pure=False)
                running[future] = (key, address)
            try:
                distributed.wait(list(compiles) + list(running), timeout=0.5, return_when="FIRST_COMPLETED")
            except TimeoutError:
                pass
            for future in [f for f in compiles if f.status != "pending"]:
                key = compiles.pop(future)
                try:
                    result = future.result()
                except Exception as exc:  # noqa: BLE001 - its worker or helper died mid-compile
                    if attempts[key] >= COMPILE_ATTEMPTS:
                        self._record(key, plans, status="compile", reason=f"{type(exc).__name__}: {exc}")
                    else:
                        attempts[key] += 1
                        compiles[client.submit(_compile_task, self.runner, plans[key],
                                               self._source(plans[key]), pure=False)] = key
                    continue
                if isinstance(result, str):
                    self._record(key, plans, status="compile", reason=result)
                else:
                    compiled[key] = result
                    ready.append(key)
            for future in [f for f in running if f.status != "pending"]:
                key, address = running.pop(future)
                try:
                    entry = future.result()
                except distributed.KilledWorker as exc:  # the worker died holding it
                    if key != CUBLAS_KEY:  # the baseline is simply timed again with the next batch
                        self._record(key, plans, status="lost",
                                     reason=f"the worker {address} was lost while running it "
                                            f"({type(exc).__name__}); the search went on without it")
                    continue
                except Exception as exc:  # noqa: BLE001 - the worker could not run it at all
                    if key != CUBLAS_KEY:
                        self._record(key, plans, status="crash", reason=f"{type(exc).__name__}: {exc}")
                    continue
                if key == CUBLAS_KEY:
                    if entry.get("status") == "ok":
                        self._store({"scope": self.scope, **entry})
                else:
                    self._record(key, plans, **entry)

    def _record(self, key: str, plans: dict, **fields) -> None:
        plan = plans[key]
        self._store({"scope": self.scope, "key": point_key(plan.spec), "point": describe(plan.spec), **fields})

    def _store(self, entry: dict) -> None:
        _append(self.db, entry)  # here, on the client: the workers never see the database
        self._report(entry)


@contextlib.contextmanager
def cluster_evaluator(scheduler, devices, space, shape, db, max_points, budget_s, progress, source_patch,
                      runner=None):
    """tune()'s evaluator on a cluster: connects (or starts a local one), asks the GPU workers
    which device they hold (the database's scope), and yields a DaskEvaluator."""
    runner = runner or default_runner()
    with connect(scheduler, devices) as client:
        name, driver, sms = _describe(client, runner)
        scope = db_scope(name, driver, shape, space.spec.name)
        yield DaskEvaluator(space, shape, db, scope, max_points, budget_s, progress, source_patch,
                            sms=sms, client=client, runner=runner, workers=len(gpu_workers(client)))
