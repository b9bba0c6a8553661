"""The search's runner on this host: candidates compiled in a process pool (NVRTC, through the on-disk
cache), then validated and timed (measure.py) in disposable worker processes, one per GPU; a
candidate that crashes or hangs ends only its worker and is recorded with its reason. Every result
is appended to the database at once (Evaluator); the records of a search's scope are read back
by point key."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..codegen.cuda import generate
from ..gpu.compile import compile_error
from ..gpu.verify import Case
from ..outputs import write_atomic
from ..plan import Plan
from ..plan.space import Space, describe, point_key
from . import database as tuning_db, strategies
from .measure import CUBLAS_KEY, GpuBench, _compiled, search_baseline

CANDIDATE_TIMEOUT_S = 60.0


def db_scope(device: str, driver: str, shape: Case, space_name: str) -> str:
    """What a measurement depends on besides the point itself."""
    return f"{device}|{driver}|{shape.M}x{shape.N}x{shape.K}|{space_name}"


def load_records(db: Path, scope: str | None = None) -> dict[str, dict]:
    """Records of one scope (all scopes when None), by point key; later lines win.
    Raises tuning_db.DatabaseError for a malformed database."""
    records: dict[str, dict] = {}
    for _, entry in tuning_db.read(db):
        if scope is None or entry["scope"] == scope:
            records[entry["key"] if scope else entry["scope"] + "|" + entry["key"]] = entry
    return records


def check_labels(db: Path, space: Space) -> None:
    """DatabaseError at a record of `space` whose label contradicts the point its key names."""
    labels = {point_key(plan.spec): describe(plan.spec) for plan in space.plans}
    tuning_db.check_labels(db, tuning_db.read(db), labels, space=space.spec.name)


_append = tuning_db.append  # the database's one writer


def ignore_interrupts() -> None:
    """In a worker process: leave Ctrl-C to the parent, which stops the workers and exits with
    one line (a worker taking SIGINT too would print a traceback of its own)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _worker(jobs: list[tuple[Plan, str | None]], shape: Case, db: str, scope: str, state: str,
            budget_s: float, with_cublas: bool, device: int | None = None,
            baseline: str = "cuBLAS FP32", layouts: dict | None = None) -> None:
    """Validate and time candidates in order; runs in a child process that may die."""
    ignore_interrupts()
    if device is not None:  # before any CUDA call: this process sees only its own GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
    bench = GpuBench(shape, budget_s)
    if with_cublas:
        _append(Path(db), {"scope": scope, **bench.cublas(baseline, layouts)})
    for plan, source in jobs:
        key = point_key(plan.spec)
        write_atomic(state, key)  # whole: the parent reads it if this process dies
        entry = {"scope": scope, "key": key, "point": describe(plan.spec)}
        try:
            entry.update(bench.candidate(plan, _compiled(plan, source)))
        except Exception as exc:  # noqa: BLE001 - a fault poisons this process's GPU context
            entry.update(status="crash", reason=f"{type(exc).__name__}: {str(exc)[:400]}")
            _append(Path(db), entry)
            os._exit(3)  # the parent starts a fresh worker (and context) for the rest
        _append(Path(db), entry)
    write_atomic(state, "")


@dataclass
class Evaluator:
    """evaluate(points) for a strategy: compile, validate and time, with records kept in the db."""

    space: Space
    shape: Case
    db: Path
    scope: str
    max_points: int | None = None
    budget_s: float = 0.2
    progress: Callable[[dict], None] | None = None
    source_patch: Callable[[Plan, str], str] | None = None
    pool: ProcessPoolExecutor | None = None
    devices: list[int] | None = None
    evaluated: int = 0
    keys: dict = field(default_factory=dict)
    baseline: str = "cuBLAS FP32"
    sms: int = 0  # the GPU's SM count, for strategies that model the kernels (strategies/model.py)

    @property
    def gpus(self) -> int:
        return len(self.devices or [None])

    def __post_init__(self) -> None:
        self.keys = {coords: point_key(plan.spec) for coords, plan in self.space.plan_at.items()}
        self.baseline = search_baseline(self.space)

    def _source(self, plan: Plan) -> str | None:
        if self.source_patch is None:
            return None
        return self.source_patch(plan, generate(plan))

    def __call__(self, points: list[tuple]) -> list[float]:
        done = load_records(self.db, self.scope)
        fresh = [p for p in dict.fromkeys(points) if self.keys[p] not in done]
        if self.max_points is not None:
            room = self.max_points - self.evaluated
            if room <= 0:
                raise strategies.Budget()
            fresh = fresh[:room]
        self.evaluated += len(fresh)
        if fresh:
            self._evaluate(fresh, with_cublas=CUBLAS_KEY not in done)
        done = load_records(self.db, self.scope)
        scores = [done.get(self.keys[p], {}).get("tflops", 0.0) for p in points]
        if self.max_points is not None and self.evaluated >= self.max_points:
            raise strategies.Budget()
        return scores

    def _layouts(self) -> dict:
        spec = self.space.plans[0].spec  # a space's layouts are rarely searched; cuBLAS takes the first
        return {x: spec[f"layout.{x}"] for x in "ABC"}

    def _report(self, entry: dict) -> None:
        if self.progress:
            self.progress(entry)

    def _evaluate(self, points: list[tuple], with_cublas: bool) -> None:
        jobs = [(self.space.plan_at[p], self._source(self.space.plan_at[p])) for p in points]
        errors = list(self.pool.map(compile_error, jobs)) if self.pool else [compile_error(j) for j in jobs]
        runnable = []
        for (plan, source), error in zip(jobs, errors):
            if error:
                entry = {"scope": self.scope, "key": point_key(plan.spec), "point": describe(plan.spec),
                         "status": "compile", "reason": error}
                _append(self.db, entry)
                self._report(entry)
            else:
                runnable.append((plan, source))
        context = multiprocessing.get_context("spawn")
        devices = self.devices or [None]
        # One worker per GPU, candidates dealt round-robin; each worker owns an in-flight file.
        queues = {d: runnable[i::len(devices)] for i, d in enumerate(devices)}
        states = {d: Path(f"{self.db}.inflight{'' if d is None else '.' + str(d)}") for d in devices}
        while any(queues.values()) or with_cublas:
            workers = {}
            for device, jobs in queues.items():
                if jobs or (with_cublas and device == devices[0]):
                    write_atomic(states[device], "")
                    workers[device] = context.Process(
                        target=_worker, args=(jobs, self.shape, str(self.db), self.scope,
                                              str(states[device]), self.budget_s,
                                              with_cublas and device == devices[0], device,
                                              self.baseline, self._layouts()))
                    workers[device].start()
            with_cublas = False
            try:
                timed_out = self._watch(workers)
            except BaseException:  # Ctrl-C reaches this process alone (workers ignore it): stop them
                for worker in workers.values():
                    worker.terminate()
                    worker.join()
                for state in states.values():
                    state.unlink(missing_ok=True)
                raise
            done = load_records(self.db, self.scope)
            for device, worker in workers.items():
                in_flight = states[device].read_text().strip() if states[device].exists() else ""
                if in_flight and in_flight not in done:
                    plan = next(p for p, _ in queues[device] if point_key(p.spec) == in_flight)
                    entry = {"scope": self.scope, "key": in_flight, "point": describe(plan.spec),
                             "status": "timeout" if device in timed_out else "crash",
                             "reason": (f"no result within {CANDIDATE_TIMEOUT_S:.0f} s"
                                        if device in timed_out else
                                        f"the worker process died (exit code {worker.exitcode}); "
                                        "the candidate faulted on the GPU")}
                    _append(self.db, entry)
                    self._report(entry)
            done = load_records(self.db, self.scope)
            for device, worker in workers.items():
                remaining = [(p, s) for p, s in queues[device] if point_key(p.spec) not in done]
                if remaining and len(remaining) == len(queues[device]) and worker.exitcode != 0:
                    raise RuntimeError(f"the tuning worker{'' if device is None else ' on GPU ' + str(device)}"
                                       f" failed before any candidate (exit code {worker.exitcode}): "
                                       "is the GPU usable?")
                queues[device] = remaining
        for state in states.values():
            state.unlink(missing_ok=True)

    def _watch(self, workers: dict) -> set:
        """Report results as they land; stop workers silent for CANDIDATE_TIMEOUT_S. Returns those."""
        seen = len(self.db.read_text().splitlines()) if self.db.exists() else 0
        last_change = time.monotonic()
        timed_out = set()
        while any(w.is_alive() for w in workers.values()):
            for worker in workers.values():
                worker.join(0.25 / len(workers))
            lines = self.db.read_text().splitlines() if self.db.exists() else []
            if len(lines) != seen:
                for line in lines[seen:]:
                    try:
                        self._report(json.loads(line))
                    except ValueError:
                        pass
                seen, last_change = len(lines), time.monotonic()
            elif time.monotonic() - last_change > CANDIDATE_TIMEOUT_S:
                for device, worker in workers.items():
                    if worker.is_alive():
                        worker.terminate()
                        worker.join()
                        timed_out.add(device)
        return timed_out
