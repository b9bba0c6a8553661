"""Search a spec's space for the fastest kernel that is correct, for one GPU and shape.

Points the Plan rejects are pruned before anything compiles. A strategy (strategies/) proposes
batches of points; each batch compiles in parallel (NVRTC in a process pool, through the on-disk
cache), then a worker process validates each candidate on small awkward shapes and times it at the
target shape (runner.py, measure.py). The worker is disposable: a candidate that crashes the GPU
context or hangs ends only that worker, is recorded with its reason, and a new worker carries on.
Every result is appended to a JSON-lines database at once, so an interrupted search resumes where
it stopped and a repeated one measures nothing twice. On a Dask cluster (a scheduler's address, or
a local one over several GPUs), distributed.py evaluates the same batches instead.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..gpu import runtime
from ..gpu.verify import Case
from ..language.spec import Spec
from ..outputs import save_figure
from ..plan import Plan
from ..plan.space import Space, describe, expand, point_key
from . import database as tuning_db, strategies
from .distributed import cluster_evaluator
from .measure import CUBLAS_KEY
from .runner import Evaluator, check_labels, db_scope, ignore_interrupts, load_records


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


def tune(spec: Spec, shape: Case, *, strategy: str = "exhaustive", options: dict | None = None,
         max_points: int | None = None, db: Path | None = None, budget_s: float = 0.2,
         progress: Callable[[dict], None] | None = None,
         source_patch: Callable[[Plan, str], str] | None = None,
         devices: list[int] | None = None, scheduler=None) -> TuneResult:
    """Search `spec`'s space at `shape` with a strategy; every record of this device and shape.

    Candidates run on this host's GPU 0, or one worker process per GPU of `devices`; with a
    `scheduler` (a Dask scheduler's address, "local" for a local cluster over `devices`, or a
    distributed.Client) on one Dask worker per GPU of a cluster (distributed.py)."""

    started = time.perf_counter()
    module = strategies.get(strategy)
    settings = strategies.options_with_defaults(module, options or {})
    db = Path(db or "tune.jsonl")
    space = expand(spec)
    if not space.valid:
        raise ValueError(f"no point of {spec.name}'s space is valid: {dict(space.pruned)}")
    check_labels(db, space)  # before any GPU work: the records it resumes from name their points
    if scheduler is not None:
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
    info = runtime.device_info()
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
