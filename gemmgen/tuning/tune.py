"""Search a spec's space for the fastest kernel that is correct, for one GPU and shape.

Points the Plan rejects are pruned before anything compiles. A strategy (gemmgen/strategies/)
proposes batches of points; each batch compiles in parallel (NVRTC in a process pool, through
the on-disk cache), then a worker process validates each candidate on small awkward shapes and
times it at the target shape. The worker is disposable: a candidate that crashes the GPU context
or hangs ends only that worker, is recorded with its reason, and a new worker carries on. Every
result is appended to a JSON-lines database at once, so an interrupted search resumes where it
stopped and a repeated one measures nothing twice. On a Dask cluster (a scheduler's address, or a
local one over several GPUs), gemmgen/distributed.py evaluates the same batches instead.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import strategies
from . import database as tuning_db
from ..outputs import save_figure, write_atomic
from ..plan import Plan
from ..plan.space import Space, describe, expand, point_key
from ..language.spec import Spec
from ..gpu.verify import Case

VALIDATION_CASES = (Case(127, 131, 137, pad=3), Case(257, 255, 253, alpha=0.5, beta=0.5, pad=5, offset=1),
                    Case(256, 256, 64, beta=1.0))
CANDIDATE_TIMEOUT_S = 60.0
CUBLAS_KEY = "cublas"


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


_append = tuning_db.append  # the database's one writer (library.py and distributed.py use it)


def ignore_interrupts() -> None:
    """In a worker process: leave Ctrl-C to the parent, which stops the workers and exits with
    one line (a worker taking SIGINT too would print a traceback of its own)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _compile_one(job: tuple[Plan, str | None]) -> str:
    from ..gpu.compile import compile_plan
    plan, source = job
    try:
        compile_plan(plan, source)
        return ""
    except Exception as exc:  # noqa: BLE001 - recorded as the candidate's failure
        return f"{type(exc).__name__}: {str(exc)[:500]}"


def _time_setup(shape: Case):
    import cupy as cp
    rng = cp.random.default_rng(12345)
    return {name: rng.uniform(-1, 1, size + 64, dtype=cp.float32)
            for name, size in (("A", shape.M * shape.K), ("B", shape.K * shape.N), ("C", shape.M * shape.N))}


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


class GpuBench:
    """What a GPU worker keeps between candidates at one shape: timing buffers, the L2 flusher,
    the validation inputs. `candidate` validates and times one compiled point, `cublas` the
    baseline; both return the fields of a record. Call them in the process that may die."""

    def __init__(self, shape: Case, budget_s: float):
        from ..gpu.bench import L2Flusher
        from ..gpu.runtime import device_info
        self.shape, self.budget_s = shape, budget_s
        self.flusher = L2Flusher(device_info())
        self.buffers = _time_setup(shape)
        self.problems: dict = {}

    def _pointers(self, layouts: dict) -> tuple:
        lds = _leading_dimensions(self.shape, layouts)
        return tuple(x for name in "ABC" for x in (self.buffers[name].data.ptr, lds[name]))

    def cublas(self, baseline: str, layouts: dict | None) -> dict:
        """cuBLAS in the candidates' precision and layouts, on the same buffers."""
        from ..gpu.baseline import cublas_gemm
        from ..gpu.bench import time_gpu
        shape, layouts = self.shape, layouts or {"A": "row", "B": "row", "C": "row"}
        a, lda, b, ldb, c, ldc = self._pointers(layouts)
        timing = time_gpu(lambda: cublas_gemm(shape.M, shape.N, shape.K, 1.0, a, lda, b, ldb, 0.0, c, ldc,
                                              layouts, tf32=baseline == "cuBLAS TF32"),
                          flush=self.flusher, budget_s=self.budget_s)
        return {"key": CUBLAS_KEY, "point": baseline, "status": "ok", "ms": timing.median_ms,
                "tflops": _tflops(shape, timing.median_ms)}

    def candidate(self, plan: Plan, compiled) -> dict:
        """Validated on VALIDATION_CASES, then timed at the shape: status (ok or invalid) and more."""
        from ..gpu import verify
        from ..gpu.bench import time_gpu
        from ..gpu.runtime import Kernel
        shape = self.shape
        kernel = Kernel(plan, compiled)
        try:
            report = verify.check(kernel, VALIDATION_CASES, problems=self.problems)
            if not report.ok:
                bad = report.failures[0]
                return {"status": "invalid", "reason": f"{bad.case}: {bad.message}"}
            a, lda, b, ldb, c, ldc = self._pointers({x: plan.spec[f"layout.{x}"] for x in "ABC"})
            timing = time_gpu(lambda: kernel.launch(shape.M, shape.N, shape.K, 1.0, a, lda, b, ldb, 0.0, c, ldc),
                              flush=self.flusher, budget_s=self.budget_s)
            return {"status": "ok", "ms": timing.median_ms, "tflops": _tflops(shape, timing.median_ms)}
        finally:
            kernel.close()


def _leading_dimensions(shape: Case, layouts: dict) -> dict:
    """Tight leading dimensions of A, B and C in their layouts, as a caller's dense arrays have."""
    rows = {"A": (shape.M, shape.K), "B": (shape.K, shape.N), "C": (shape.M, shape.N)}
    return {x: max(1, rows[x][1] if layouts[x] == "row" else rows[x][0]) for x in "ABC"}


def search_baseline(space: Space) -> str:
    """The cuBLAS mode a space's candidates are timed against: one precision per search, since a
    TF32 kernel is faster than an FP32-accurate one by giving up accuracy, not by being better."""
    from ..gpu.baseline import baseline_for
    maths = sorted({plan.math for plan in space.plans})
    baselines = {baseline_for(m) for m in maths}
    if len(baselines) > 1:
        raise space.spec.error("math", f"math {{{', '.join(maths)}}} mixes TF32 (10-bit inputs) with "
                               "FP32-accurate modes: the search would pick TF32 for its speed and lose "
                               "the accuracy", "one search per precision: math tf32, or math "
                               "{simt, 3xtf32}")
    return baselines.pop()


def _compiled(plan: Plan, source: str | None):
    from ..gpu.compile import compile_plan
    return compile_plan(plan, source)


def _tflops(shape: Case, ms: float) -> float:
    return 2.0 * shape.M * shape.N * shape.K / (ms * 1e-3) / 1e12 if ms else 0.0


@dataclass
class TuneResult:
    shape: Case
    space: Space
    scope: str
    records: list[dict]
    best: dict | None
    best_plan: Plan | None
    cublas_tflops: float
    evaluated: int
    seconds: float
    baseline: str = "cuBLAS FP32"  # the cuBLAS mode of cublas_tflops: the candidates' precision
    gpus: int = 1                  # the GPUs that evaluated candidates at once

    @property
    def failures(self) -> list[dict]:
        return [r for r in self.records if r.get("status") != "ok"]


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
        from ..codegen.cuda import generate
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
        errors = list(self.pool.map(_compile_one, jobs)) if self.pool else [_compile_one(j) for j in jobs]
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


def tune(spec: Spec, shape: Case, *, strategy: str = "exhaustive", options: dict | None = None,
         max_points: int | None = None, db: Path | None = None, budget_s: float = 0.2,
         progress: Callable[[dict], None] | None = None,
         source_patch: Callable[[Plan, str], str] | None = None,
         devices: list[int] | None = None, scheduler=None) -> TuneResult:
    """Search `spec`'s space at `shape` with a strategy; every record of this device and shape.

    Candidates run on this host's GPU 0, or one worker process per GPU of `devices`; with a
    `scheduler` (a Dask scheduler's address, "local" for a local cluster over `devices`, or a
    distributed.Client) on one Dask worker per GPU of a cluster (gemmgen/distributed.py)."""

    started = time.perf_counter()
    module = strategies.get(strategy)
    settings = strategies.options_with_defaults(module, options or {})
    db = Path(db or "tune.jsonl")
    space = expand(spec)
    if not space.valid:
        raise ValueError(f"no point of {spec.name}'s space is valid: {dict(space.pruned)}")
    check_labels(db, space)  # before any GPU work: the records it resumes from name their points
    if scheduler is not None:
        from .distributed import cluster_evaluator
        backend = cluster_evaluator(scheduler, devices, space, shape, db, max_points, budget_s,
                                    progress, source_patch)
    else:
        backend = _local_evaluator(space, shape, db, max_points, budget_s, progress, source_patch, devices)
    with backend as evaluator:
        try:
            module.tune(space, evaluator, settings)
        except strategies.Budget:
            pass
    result = summarize(space, shape, db, evaluator.scope, evaluator.evaluated, time.perf_counter() - started)
    result.gpus = evaluator.gpus
    return result


@contextlib.contextmanager
def _local_evaluator(space, shape, db, max_points, budget_s, progress, source_patch, devices):
    """This host: a worker process per GPU, compiles in a process pool."""
    from ..gpu.runtime import device_info
    info = device_info()
    scope = db_scope(info.name, info.driver_version, shape, space.spec.name)
    # NVRTC workers start fresh (spawn): forking a process that holds a CUDA context is unsafe.
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1, mp_context=multiprocessing.get_context("spawn"),
                             initializer=ignore_interrupts) as pool:
        yield Evaluator(space, shape, db, scope, max_points, budget_s, progress, source_patch, pool, devices,
                        sms=info.sm_count)


def summarize(space: Space, shape: Case, db: Path, scope: str, evaluated: int = 0,
              seconds: float = 0.0) -> TuneResult:
    records = load_records(db, scope)
    baseline = records.pop(CUBLAS_KEY, {})
    by_key = {point_key(plan.spec): plan for plan in space.plans}
    good = [r for r in records.values() if r.get("status") == "ok" and r["key"] in by_key]
    best = max(good, key=lambda r: r.get("tflops", 0.0)) if good else None
    return TuneResult(shape, space, scope, list(records.values()), best,
                      by_key[best["key"]] if best else None, baseline.get("tflops", 0.0), evaluated,
                      seconds, baseline.get("point", "cuBLAS FP32"))


def best_recorded(spec: Spec, db: Path, shape: Case | None = None) -> tuple[Plan, dict]:
    """The fastest validated point of `spec`'s space in the database (any device, or one shape).
    Raises tuning_db.DatabaseError for a malformed database or a record whose label
    contradicts its point, LookupError when there is no such point."""
    space = expand(spec)
    by_key = {point_key(plan.spec): plan for plan in space.plans}
    records = tuning_db.read(db)
    tuning_db.check_labels(db, records, {k: describe(p.spec) for k, p in by_key.items()}, space=spec.name)
    latest = {entry["scope"] + "|" + entry["key"]: entry for _, entry in records}
    candidates = [r for r in latest.values()
                  if r.get("status") == "ok" and r["key"] in by_key
                  and r["scope"].split("|")[3] == spec.name
                  and (shape is None or r["scope"].split("|")[2] == f"{shape.M}x{shape.N}x{shape.K}")]
    if not candidates:
        raise LookupError(f"{db} holds no validated point of '{spec.name}'"
                          + (f" at {shape.M}x{shape.N}x{shape.K}" if shape else "") + "; run gemmgen tune first")
    best = max(candidates, key=lambda r: r.get("tflops", 0.0))
    return by_key[best["key"]], best


def plot_search(result: TuneResult, path: str) -> None:
    """PNG: TFLOP/s of every validated point against each searched setting, cuBLAS as a line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_key = {point_key(plan.spec): coords for coords, plan in result.space.plan_at.items()}
    good = [(by_key[r["key"]], r["tflops"]) for r in result.records
            if r.get("status") == "ok" and r["key"] in by_key]
    dims = result.space.keys or ["(no sets)"]
    columns = min(3, len(dims))
    rows = -(-len(dims) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.4 * rows), squeeze=False)
    for index, key in enumerate(dims):
        ax = axes[index // columns][index % columns]
        values = result.space.dimensions[index] if result.space.keys else [0]
        xs = [values.index(coords[index]) if result.space.keys else 0 for coords, _ in good]
        jitter = [x + 0.15 * ((i * 7919) % 13 - 6) / 6 for i, x in enumerate(xs)]
        ax.scatter(jitter, [t for _, t in good], s=12, alpha=0.6)
        if result.best:
            best_coords = by_key[result.best["key"]]
            ax.scatter([values.index(best_coords[index]) if result.space.keys else 0],
                       [result.best["tflops"]], marker="*", s=140, color="red", label="best")
        if result.cublas_tflops:
            ax.axhline(result.cublas_tflops, color="black", linestyle="--", label=result.baseline)
        ax.set_xticks(range(len(values)), [str(v) for v in values], fontsize=8)
        ax.set_title(key, fontsize=9)
        ax.set_ylabel("TFLOP/s", fontsize=8)
    for index in range(len(dims), rows * columns):
        axes[index // columns][index % columns].axis("off")
    axes[0][0].legend(fontsize=7)
    shape = result.shape
    fig.suptitle(f"{result.space.spec.name} at {shape.M}x{shape.N}x{shape.K}: {len(good)} validated points")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)  # atomically, tagged as gemmgen's
    plt.close(fig)
