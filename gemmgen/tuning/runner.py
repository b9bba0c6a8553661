"""The one runner of every tuning, a search's (tune.py) and a library's (library/tune.py): jobs
(jobs.py) compiled, then measured (measure.py) by GPU workers, each result appended to the database
where the tuning runs, as it comes back, and reported.

Runner is the supervision every place shares. Compiles and GPU work overlap; each GPU worker takes
one job at a time; a candidate that fails to compile, crashes its GPU process or hangs
(CANDIDATE_TIMEOUT_S) is recorded with its reason, and the rest go on; a candidate that crashed or
hung gets none of this run's other jobs; a baseline that fails is reported, not recorded (the
next run times it again). Where the work runs is a subclass's: LocalRunner (this host: NVRTC in a
process pool, a disposable GPU process per GPU, child.py) or distributed.ClusterRunner (a Dask
cluster's GPU workers). workers.open_runner picks one.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable

from . import database, measure as measurer_module
from .child import ChildDied, ChildTimeout, GpuProcess, ignore_interrupts
from .jobs import BASELINE, Device, Job

CANDIDATE_TIMEOUT_S = 60.0  # a job with no result for this long is killed, recorded as `timeout`
COMPILE_ATTEMPTS = 2        # a compile whose process dies this often is recorded as failed
FAILED = ("crash", "timeout")  # a candidate's results that end its part in the run


class RunnerError(RuntimeError):
    """The workers cannot tune (no GPU they can use, no cluster): the message says what to do."""


def measure_job(measurer, job: Job, compiled) -> dict:
    """In a GPU process: the fields of the job's record."""
    return measurer.measure(job, compiled)


def describe_gpu(measurer) -> Device:
    """In a GPU process: its GPU (which starts CUDA there)."""
    return measurer.describe()


def compile_job(measurer, plan, source):
    """On a CPU: the Compiled kernel, or why it did not compile (a string)."""
    return measurer.compile(plan, source)


class Runner:
    """Runs jobs on GPU workers (a subclass says where); use it as a context manager, which
    starts the workers and learns their GPU (`device`)."""

    def __init__(self, measurer=None):
        self.measurer = measurer if measurer is not None else measurer_module.default_measurer()
        self.device: Device | None = None

    @property
    def gpus(self) -> int:
        """GPUs that measure at once."""
        raise NotImplementedError

    # --- where the work runs (a subclass's) -------------------------------------------------------

    def _idle(self, running: dict) -> list:
        """The GPU workers without a job (those of `running`'s handles are busy)."""
        raise NotImplementedError

    def _abandoned(self, running: dict) -> list[tuple]:
        """(handle, fields) of the running jobs no result will come for (their worker left)."""
        return []

    def _compile(self, plan, source):
        """A handle (.done()) of compile_job on a CPU."""
        raise NotImplementedError

    def _compiled(self, handle):
        """What a finished compile gave; raises if its process died."""
        return handle.result()

    def _measure(self, worker, job: Job, compiled):
        """A handle (.done()) of the job measured by `worker`."""
        raise NotImplementedError

    def _fields(self, handle, job: Job, worker) -> dict | None:
        """A finished job's record fields (None: nothing to record)."""
        return handle.result()

    def _wait(self, handles: list, timeout: float) -> None:
        """Until one of `handles` is done, or `timeout` seconds."""
        raise NotImplementedError

    # --- the supervision ------------------------------------------------------------------------

    def run(self, jobs: list[Job], db: Path, progress: Callable[[dict], None] | None = None) -> list[dict]:
        """Measure `jobs`, appending each record to `db` as it comes (and passing it to
        `progress`); returns the records in that order."""
        db = Path(db)
        records: list[dict] = []

        def deliver(job: Job, fields: dict) -> None:
            entry = job.record(self.device, fields)
            if job.kind == BASELINE and fields.get("status") != "ok":
                if progress:  # reported; not recorded, so that the next run times it again
                    progress(entry)
                return
            database.append(db, entry)
            records.append(entry)
            if progress:
                progress(entry)

        failed: set[str] = set()          # candidates that crashed or hung in this run
        ready: deque = deque()            # (job, compiled) for a GPU worker
        groups: dict[tuple, list[Job]] = {}
        compiles: dict = {}               # handle -> (group, attempts)
        for job in jobs:
            if job.plan is None:
                ready.append((job, None))
                continue
            group = (job.key, job.source)
            if group not in groups:
                groups[group] = []
                compiles[self._compile(job.plan, job.source)] = (group, 1)
            groups[group].append(job)
        running: dict = {}                # handle -> (job, worker)
        while compiles or ready or running:
            for handle, fields in self._abandoned(running):
                job, _ = running.pop(handle)
                if job.kind != BASELINE:
                    deliver(job, fields)
            for worker in self._idle(running):
                while ready:
                    job, compiled = ready.popleft()
                    if job.key in failed and job.kind != BASELINE:
                        continue
                    running[self._measure(worker, job, compiled)] = (job, worker)
                    break
            self._wait(list(compiles) + list(running), 0.5)
            for handle in [h for h in compiles if h.done()]:
                group, attempts = compiles.pop(handle)
                try:
                    result = self._compiled(handle)
                except Exception as exc:  # noqa: BLE001 - the compiling process died
                    if attempts < COMPILE_ATTEMPTS:
                        compiles[self._compile(groups[group][0].plan, group[1])] = (group, attempts + 1)
                        continue
                    result = f"{type(exc).__name__}: {exc}"
                if isinstance(result, str):
                    for job in groups[group]:
                        deliver(job, {"status": "compile", "reason": result})
                else:
                    ready.extend((job, result) for job in groups[group])
            for handle in [h for h in running if h.done()]:
                job, worker = running.pop(handle)
                fields = self._fields(handle, job, worker)
                if fields is None:
                    continue
                if fields.get("status") in FAILED:
                    failed.add(job.key)
                deliver(job, fields)
        return records


class LocalRunner(Runner):
    """This host: NVRTC in a process pool, and one disposable GPU process per device of `devices`
    (None: the first GPU, as CUDA_VISIBLE_DEVICES gives it), each running one job at a time."""

    def __init__(self, devices: list[int] | None = None, measurer=None, compile_processes: int | None = None):
        super().__init__(measurer)
        self.devices = list(devices) if devices else [None]
        self.compile_processes = compile_processes or os.cpu_count() or 1
        self._processes: list[GpuProcess] = []
        self._threads: ThreadPoolExecutor | None = None
        self._pool: ProcessPoolExecutor | None = None

    @property
    def gpus(self) -> int:
        return len(self.devices)

    def __enter__(self) -> "LocalRunner":
        self._processes = [GpuProcess(device) for device in self.devices]
        self._threads = ThreadPoolExecutor(max_workers=len(self._processes), thread_name_prefix="gemmgen-gpu")
        # NVRTC workers start fresh (spawn): forking a process that holds a CUDA context is unsafe.
        self._pool = ProcessPoolExecutor(max_workers=self.compile_processes, initializer=ignore_interrupts,
                                         mp_context=multiprocessing.get_context("spawn"))
        try:
            self.device = self._describe()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the GPU processes (a job in flight is lost, not recorded) and the compiles."""
        for process in self._processes:
            process.close()
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._processes, self._threads, self._pool = [], None, None

    def _describe(self) -> Device:
        answers = set()
        for process in self._processes:
            try:
                answers.add(process.call(describe_gpu, (self.measurer,), CANDIDATE_TIMEOUT_S))
            except (ChildDied, ChildTimeout, RuntimeError) as exc:
                raise RunnerError(f"the tuning worker{process.where} could not start CUDA ({exc}): "
                                  "is the GPU usable?") from None
        if len(answers) > 1:
            raise RunnerError(f"the GPUs differ ({', '.join(sorted(d.name for d in answers))}): their records "
                              "would mix devices; tune on one kind of GPU at a time")
        return answers.pop()

    def _idle(self, running: dict) -> list:
        busy = {worker for _, worker in running.values()}
        return [index for index in range(len(self._processes)) if index not in busy]

    def _compile(self, plan, source):
        return self._pool.submit(compile_job, self.measurer, plan, source)

    def _measure(self, worker, job: Job, compiled):
        process = self._processes[worker]
        return self._threads.submit(process.run, measure_job, (self.measurer, job, compiled), CANDIDATE_TIMEOUT_S,
                                    job.doing)

    def _wait(self, handles: list, timeout: float) -> None:
        if handles:
            wait(handles, timeout=timeout, return_when=FIRST_COMPLETED)
