"""Search a spec's space for the fastest kernel that is correct, for one GPU and shape.

Points the Plan rejects are pruned before anything compiles. A strategy (strategies/) proposes
batches of points; the Evaluator makes each batch jobs (jobs.py: a point validated on small awkward
shapes, then timed at the target shape, beside cuBLAS) for the runner (runner.py), which compiles
them in parallel (NVRTC, through the on-disk cache) and measures them (measure.py) on this host's
GPUs or a Dask cluster's (workers.py): a candidate that crashes the GPU context or hangs costs only
itself, recorded with its reason. Every result is appended to a JSON-lines database at once, so an
interrupted search resumes where it stopped and a repeated one measures nothing twice.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..codegen.cuda import generate
from ..gpu.verify import Case
from ..language.spec import Spec
from ..outputs import save_figure
from ..plan import Plan
from ..plan.space import Space, describe, expand, point_key
from . import database as tuning_db, strategies
from .database import CUBLAS_KEY, db_scope, load_records, shape_key
from .jobs import BASELINE, MEASURE, Job
from .measure import search_baseline
from .runner import Runner
from .workers import open_runner


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


def check_labels(db: Path, space: Space) -> None:
    """DatabaseError at a record of `space` whose label contradicts the point its key names."""
    labels = {point_key(plan.spec): describe(plan.spec) for plan in space.plans}
    tuning_db.check_labels(db, tuning_db.read(db), labels, space=space.spec.name)


@dataclass
class Evaluator:
    """evaluate(points) for a strategy: the points measured by the runner, records kept in the db."""

    space: Space
    shape: Case
    db: Path
    runner: Runner
    max_points: int | None = None
    budget_s: float = 0.2
    progress: Callable[[dict], None] | None = None
    source_patch: Callable[[Plan, str], str] | None = None
    evaluated: int = 0
    keys: dict = field(default_factory=dict)
    baseline: str = "cuBLAS FP32"

    def __post_init__(self) -> None:
        self.keys = {coords: point_key(plan.spec) for coords, plan in self.space.plan_at.items()}
        self.baseline = search_baseline(self.space)

    @property
    def scope(self) -> str:
        device = self.runner.device
        return db_scope(device.name, device.driver, self.shape, self.space.spec.name)

    @property
    def sms(self) -> int:
        """The GPU's SM count, for strategies that model the kernels (strategies/model.py)."""
        return self.runner.device.sm_count

    @property
    def gpus(self) -> int:
        return self.runner.gpus

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
            self.runner.run(self.jobs(fresh, with_cublas=CUBLAS_KEY not in done), self.db, self.progress)
        done = load_records(self.db, self.scope)
        scores = [done.get(self.keys[p], {}).get("tflops", 0.0) for p in points]
        if self.max_points is not None and self.evaluated >= self.max_points:
            raise strategies.Budget()
        return scores

    def jobs(self, points: list[tuple], with_cublas: bool) -> list[Job]:
        """The baseline (first, when it is not recorded yet) and each point, validated and timed."""
        s = self.shape
        what, owner = shape_key(s.M, s.N, s.K, batch=s.batch), self.space.spec.name
        shape = Case(s.M, s.N, s.K, batch=s.batch)  # timed with tight leading dimensions
        jobs = []
        if with_cublas:
            spec = self.space.plans[0].spec  # a space's layouts are rarely searched; cuBLAS takes the first
            jobs.append(Job(BASELINE, CUBLAS_KEY, self.baseline, what, owner, shape=shape, budget_s=self.budget_s,
                            layouts=tuple((x, spec[f"layout.{x}"]) for x in "ABC")))
        for p in points:
            plan = self.space.plan_at[p]
            source = self.source_patch(plan, generate(plan)) if self.source_patch else None
            jobs.append(Job(MEASURE, self.keys[p], describe(plan.spec), what, owner, plan=plan, source=source,
                            shape=shape, budget_s=self.budget_s))
        return jobs


def tune(spec: Spec, shape: Case, *, strategy: str = "exhaustive", options: dict | None = None,
         max_points: int | None = None, db: Path | None = None, budget_s: float = 0.2,
         progress: Callable[[dict], None] | None = None,
         source_patch: Callable[[Plan, str], str] | None = None,
         devices: list[int] | None = None, scheduler=None, runner: Runner | None = None,
         measurer=None) -> TuneResult:
    """Search `spec`'s space at `shape` with a strategy; every record of this device and shape.

    Candidates run on this host's GPU 0, or one worker process per GPU of `devices`; with a
    `scheduler` (a Dask scheduler's address, "local" for a local cluster over `devices`, or a
    distributed.Client) on one Dask worker per GPU of a cluster (distributed.py); or on the
    `runner` given, already started (a library's). RunnerError when the workers cannot tune."""

    started = time.perf_counter()
    module = strategies.get(strategy)
    settings = strategies.options_with_defaults(module, options or {})
    db = Path(db or "tune.jsonl")
    space = expand(spec)
    if not space.valid:
        raise ValueError(f"no point of {spec.name}'s space is valid: {dict(space.pruned)}")
    check_labels(db, space)  # before any GPU work: the records it resumes from name their points
    workers = (contextlib.nullcontext(runner) if runner is not None else
               open_runner(devices, scheduler, measurer))
    with workers as running:
        evaluator = Evaluator(space, shape, db, running, max_points, budget_s, progress, source_patch)
        try:
            module.tune(space, evaluator, settings)
        except strategies.Budget:
            pass
        scope, gpus = evaluator.scope, evaluator.gpus
    result = summarize(space, shape, db, scope, evaluator.evaluated, time.perf_counter() - started)
    result.gpus = gpus
    return result


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
    want = shape_key(shape.M, shape.N, shape.K, batch=shape.batch) if shape is not None else None
    candidates = [r for r in tuning_db.latest(records).values()
                  if r.get("status") == "ok" and r["key"] in by_key
                  and tuning_db.Scope.of(r).owner == spec.name
                  and (want is None or tuning_db.Scope.of(r).what == want)]
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
