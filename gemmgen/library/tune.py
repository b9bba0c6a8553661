"""Tuning a library: every candidate kernel (each concrete member, each point of a small space, the
winners of a strategy's search in a large one) is validated once and timed at the library's shapes,
with cuBLAS in its precision, into one resumable database. To spend the GPU where it matters, all
candidates are timed at a few diverse anchor shapes first; at the other shapes only those the model
(selection.py) predicts fastest are; the members finally chosen, and the few candidates much faster
than all of them somewhere (`specialists`), are then timed at every shape. The work is jobs
(tuning/jobs.py) for the tuning's one runner, as a search's are: on this host's GPU, one process per
GPU of several, or a Dask cluster's GPU workers (tuning/workers.py), recording the same database.
manifest.py then builds the library from what was measured.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..gpu.compile import compile_all
from ..gpu.verify import Case
from ..language.shapes import LibraryShape
from ..plan import Plan
from ..plan.parts.decode import ROW_COUNTS
from ..plan.space import describe, point_key
from ..tuning import database as tuning_db
from ..tuning.database import CUBLAS_KEY, DEVICE, DEVICE_KEY, VALIDATION, Scope
from ..tuning.jobs import BASELINE, TIME, VALIDATE, Device, Job
from ..tuning.runner import Runner
from ..tuning.tune import tune as tune_space
from ..tuning.workers import open_runner
from .model import (MAX_MEMBERS, WINNERS_PER_SHAPE, Library, Measurements, kernel_key, measured_at, member_shape,
                    allowed_times, read_db, select_members, shape_class, shape_key, slots_per_sm)
from .selection import CLASSES, SPLIT, Model, fit_all, model_class, predict, serves, short_sum_rows

BUDGET_S = 0.05   # seconds of timed launches per timing (a library times hundreds)
WARMUP_S = 0.03   # seconds of warm-up before each


# --- its jobs -----------------------------------------------------------------------------------

def _case(shape: LibraryShape) -> Case:
    return Case(shape.M, shape.N, shape.K, pad=shape.pad, batch=shape.batch)


@dataclass(frozen=True)
class Jobs:
    """The jobs of one library: a candidate validated, a candidate or cuBLAS timed at a shape."""

    library: Library
    budget_s: float = BUDGET_S

    def validate(self, plan: Plan) -> Job:
        return Job(VALIDATE, kernel_key(plan), describe(plan.spec), VALIDATION, self.library.name, plan=plan,
                   budget_s=self.budget_s, warmup_s=WARMUP_S)

    def time(self, plan: Plan, shape: LibraryShape) -> Job:
        return Job(TIME, kernel_key(plan), describe(plan.spec), shape_key(shape), self.library.name, plan=plan,
                   shape=_case(shape), budget_s=self.budget_s, warmup_s=WARMUP_S)

    def cublas(self, shape: LibraryShape) -> Job:
        return Job(BASELINE, CUBLAS_KEY, self.library.baseline, shape_key(shape), self.library.name,
                   shape=_case(shape), layouts=tuple(self.library.layouts.items()), budget_s=self.budget_s,
                   warmup_s=WARMUP_S)


def record_device(db: Path, library: Library, device: Device) -> None:
    """The GPU's facts (SM count, compute capability), once per device and library: the manifest
    models the members with them."""
    scope = Scope(device.name, device.driver, DEVICE, library.name)
    if any(entry["scope"] == str(scope) for _, entry in tuning_db.read(db)):
        return
    tuning_db.append(db, {"scope": str(scope), "key": DEVICE_KEY, "sm_count": device.sm_count,
                          "compute_capability": list(device.compute_capability)})


def _anchors(shapes: list[LibraryShape], layouts: dict[str, str], count: int) -> list[LibraryShape]:
    """`count` single-GEMM shapes spread over (log M, log N, log K) by farthest-point sampling, at
    least two of each alignment class present (so each class gets a model; strided batches are
    timed where the model predicts, as the other shapes are)."""
    shapes = [s for s in shapes if s.batch == 1]
    if len(shapes) <= count:
        return list(shapes)
    point = {s: (math.log(s.M), math.log(s.N), math.log(s.K)) for s in shapes}
    chosen = [max(shapes, key=lambda s: s.M * s.N * s.K)]
    for cls in CLASSES:
        of_class = [s for s in shapes if shape_class(s, layouts) == cls and s not in chosen]
        while sum(shape_class(s, layouts) == cls for s in chosen) < 2 and of_class:
            chosen.append(of_class.pop(0))
    while len(chosen) < count:
        def gap(s):
            return min(sum((a - b) ** 2 for a, b in zip(point[s], point[c])) for c in chosen)
        chosen.append(max((s for s in shapes if s not in chosen), key=gap))
    return chosen


def decode_anchors(shapes: list[LibraryShape], anchors: list[LibraryShape]) -> list[LibraryShape]:
    """One single-GEMM shape per row pass of the decode kernel (plan/parts/decode.py's ROW_COUNTS:
    the smallest count >= min(M, N)) that no anchor already stands for, the first the list has."""
    def row_pass(s: LibraryShape) -> int:
        return next((count for count in ROW_COUNTS if count >= min(s.M, s.N)), 0)

    covered = {row_pass(s) for s in anchors}
    picked: dict[int, LibraryShape] = {}
    for s in shapes:
        if s.batch == 1 and row_pass(s) and row_pass(s) not in covered:
            picked.setdefault(row_pass(s), s)
    return list(picked.values())


@dataclass
class TuneReport:
    library: Library
    device: str
    measurements: Measurements
    evaluated: int
    seconds: float
    failures: list[dict]
    gpus: int = 1     # the GPUs that measured at once
    skipped: dict[LibraryShape, str] = field(default_factory=dict)  # shapes where cuBLAS failed (why): not tuned


def tune_library(library: Library, *, db: Path, progress: Callable[[dict], None] | None = None,
                 strategy: str = "exhaustive", options: dict | None = None, max_points: int | None = None,
                 anchors: int = 8, per_shape: int = 6, budget_s: float = BUDGET_S,
                 devices: list[int] | None = None, scheduler=None, measurer=None,
                 stage: Callable[[str], None] | None = None) -> TuneReport:
    """Measure what the library needs (see the module docstring); resumable. On this host's GPU 0,
    one process per GPU of `devices`, or with a `scheduler` (a Dask scheduler's address, "local",
    a distributed.Client) a cluster's GPU workers; `measurer` stands in for the GPU's (tests).
    `stage(text)` hears each step as it starts. RunnerError when the workers cannot tune."""
    with open_runner(devices, scheduler, measurer) as runner:
        return tune_on(library, runner, db=db, progress=progress, strategy=strategy, options=options,
                       max_points=max_points, anchors=anchors, per_shape=per_shape, budget_s=budget_s,
                       stage=stage)


def tune_on(library: Library, runner: Runner, *, db: Path, progress: Callable[[dict], None] | None = None,
            strategy: str = "exhaustive", options: dict | None = None, max_points: int | None = None,
            anchors: int = 8, per_shape: int = 6, budget_s: float = BUDGET_S,
            stage: Callable[[str], None] | None = None) -> TuneReport:
    """tune_library on a started runner."""
    started = time.perf_counter()
    stage = stage or (lambda text: None)
    db = Path(db)
    device = runner.device
    device_key = f"{device.name}|{device.driver}"
    record_device(db, library, device)
    shapes = library.shapes
    layouts = library.layouts
    jobs = Jobs(library, budget_s)
    candidates = library.candidates()
    # Large spaces: a strategy's search per shape; its winners join the candidates.
    for member in library.members:
        if not member.searched:
            continue
        for shape in shapes:
            stage(f"searching {member.name}'s space at {shape}")
            result = tune_space(member.spec, _case(shape), strategy=strategy, options=options,
                                max_points=max_points, db=db, progress=progress, runner=runner)
            good = sorted((r for r in result.records if r.get("status") == "ok"), key=lambda r: -r["tflops"])
            by_key = {point_key(p.spec): p for p in member.plans}
            for record in good[:WINNERS_PER_SHAPE]:
                plan = by_key.get(record["key"])
                if plan is not None and all(kernel_key(plan) != kernel_key(c) for c in candidates):
                    candidates.append(plan)
    by_key = {kernel_key(p): p for p in candidates}
    stage(f"compiling {len(candidates)} candidates")
    compile_all(candidates)  # here too: slots_per_sm reads ptxas's registers of each
    slots = {key: slots_per_sm(plan) for key, plan in by_key.items()}

    def measured() -> Measurements:
        return Measurements.of(read_db(db, library.name).get(device_key, {}))

    evaluated = 0
    baseline_failures: dict[str, dict] = {}  # shape key -> cuBLAS's failed record (reported, never recorded)

    def report(entry: dict) -> None:
        if entry.get("key") == CUBLAS_KEY and entry.get("status") != "ok":
            baseline_failures[Scope.of(entry).what] = entry
        if progress:
            progress(entry)

    def run(batch: list[Job], what: str) -> None:
        nonlocal evaluated
        done = measured()
        todo = [job for job in batch if not _done(job, done) and _serves(job)]
        evaluated += len(todo)
        stage(f"{what}: {len(todo)} job(s) to run" + (f" ({len(batch) - len(todo)} recorded or not served)"
                                                       if len(todo) < len(batch) else ""))
        if todo:
            runner.run(todo, db, report)

    # Each phase decides from what the phases before it timed, and nothing else, so that a run
    # resumed after an interruption (or run on other workers) makes the same decisions and
    # measures nothing twice.
    # 1. every candidate validated, then timed at the anchors (cuBLAS at every shape). A shape where
    # cuBLAS failed (operands larger than the GPU holds, say) is timed no further: a candidate that
    # failed there would count as broken everywhere.
    run([jobs.validate(plan) for plan in candidates] + [jobs.cublas(s) for s in shapes],
        f"validating {len(candidates)} candidates, cuBLAS at {len(shapes)} shapes")
    baselines = measured().cublas
    skipped = [s for s in shapes if shape_key(s) not in baselines]
    shapes = [s for s in shapes if shape_key(s) in baselines]
    anchor_shapes = _anchors(shapes, layouts, anchors)
    done = measured()
    valid = [p for p in candidates if done.valid(kernel_key(p))]
    phase1 = [jobs.time(p, s) for s in anchor_shapes for p in valid]
    # the decode candidates also at one shape of each row pass they serve (decode_anchors): at the
    # anchors they serve only single rows, and a model of one row count cannot rank them at eight
    phase1 += [jobs.time(p, s) for s in decode_anchors(shapes, anchor_shapes) for p in valid
               if p.path == "decode"]
    run(phase1, f"timing {len(valid)} valid candidates at {len(anchor_shapes)} anchor shapes")
    # 2. at the other shapes, the candidates the model predicts fastest.
    models = _fit(valid, _only(measured(), phase1), slots, shapes, layouts, device.sm_count)
    phase2 = []
    for shape in shapes:
        if shape in anchor_shapes:
            continue
        cls = shape_class(shape, layouts)
        ranked = sorted(valid, key=lambda p: _predicted(p, models, slots, shape, cls, device.sm_count))
        # the best predicted overall, and the best two of each member (a model fitted at a few
        # anchors can misjudge a whole kind of kernel, e.g. split K far from them)
        picked = ranked[:per_shape]
        for member in library.members:
            picked += [p for p in ranked if p.spec.name == member.name and p not in picked][:2]
        phase2 += [jobs.time(p, shape) for p in picked]
    run(phase2, f"timing the predicted best at {len(shapes) - len(anchor_shapes)} other shapes")
    # 3. the members a library would keep, timed at every shape (the model's data).
    m = _only(measured(), phase1 + phase2)
    valid = [p for p in valid if m.valid(kernel_key(p))]  # less any that crashed while timed
    stage("choosing members")
    exact_rows = short_sum_rows(library.precision)
    chosen = select_members(valid, m, shapes, MAX_MEMBERS, exact_rows, library.layouts)
    # Specialists by phases 1 and 2, and by all the database holds of this GPU: a candidate an
    # earlier run timed at most shapes (before the shapes grew, say) can win where the chosen are
    # weak, and the build keeps only candidates timed at every shape.
    extra = specialists(valid, chosen, m, shapes, exact_rows, library.layouts)
    extra += [p for p in specialists(valid, chosen, measured(), shapes, exact_rows, library.layouts)
              if p not in extra]
    run([jobs.time(p, s) for s in shapes for p in chosen + extra],
        f"timing {len(chosen)} members and {len(extra)} specialists at all {len(shapes)} shapes")
    m = measured()
    failures = [entry for entry in m.status.values() if entry.get("status") != "ok"]
    return TuneReport(library, device_key, m, evaluated, time.perf_counter() - started, failures, runner.gpus,
                      {s: baseline_failures.get(shape_key(s), {}).get("reason", "no timing") for s in skipped})


SPECIALIST_MARGIN = 1.05   # a candidate this much faster than every chosen one at some shape ...
MAX_SPECIALISTS = 6        # ... is timed at every shape too (the fastest few such)


def specialists(valid: list[Plan], chosen: list[Plan], m: Measurements, shapes: list[LibraryShape],
                exact_rows: int = 0, layouts: dict[str, str] | None = None) -> list[Plan]:
    """Candidates that beat every chosen one by SPECIALIST_MARGIN at some shape where both were
    timed: a kernel that wins only where the rest are weak (ping-pong at short K), which the greedy
    choice over partly timed data can pass over. Timed at every shape, they are then open to the
    build's choice among fully timed candidates. Largest gain first; decided from `m` alone.
    As in select_members, a shape counts only the candidates the choice may take there
    (allowed_times: `exact_rows`, and with `layouts` decode_only_at): at fp32's few rows, where only FFMA decode
    members may run, an FFMA kernel 9% faster than the kept FFMA ones is a specialist even where a
    3xTF32 member, which may not run there, is faster still."""
    times = allowed_times(valid, m, shapes, exact_rows, layouts)  # chosen are among valid
    gains: dict[str, tuple[float, Plan]] = {}
    for j in range(len(shapes)):
        kept = [t for t in (times[valid.index(p)][j] for p in chosen) if t is not None]
        if not kept:
            continue
        for plan, row in zip(valid, times):
            key = kernel_key(plan)
            if plan in chosen or row[j] is None or not plan.beta:
                continue
            gain = min(kept) / row[j]
            if gain >= SPECIALIST_MARGIN and gain > gains.get(key, (0.0, plan))[0]:
                gains[key] = (gain, plan)
    ranked = sorted(gains.values(), key=lambda g: (-g[0], valid.index(g[1])))
    return [plan for _, plan in ranked[:MAX_SPECIALISTS]]


def _only(m: Measurements, jobs: list[Job]) -> Measurements:
    """The measurements of these timing jobs alone (validation and cuBLAS records kept)."""
    pairs = {(job.key, job.what) for job in jobs}
    return Measurements(m.status, {k: v for k, v in m.times.items() if k in pairs}, m.cublas)


def _serves(job: Job) -> bool:
    """Whether a job is worth running: not the decode member timed at a shape it is not built for
    (M and N above 16, where it would read the big operand once per 16 rows)."""
    return job.kind != TIME or serves(member_shape(job.plan), job.shape.M, job.shape.N)


def _done(job: Job, m: Measurements) -> bool:
    if job.kind == VALIDATE:
        return job.key in m.status
    if job.kind == BASELINE:
        return job.what in m.cublas
    return (job.key, job.what) in m.times or (job.key in m.status and not m.valid(job.key))


def _fit(plans: list[Plan], m: Measurements, slots: dict[str, int], shapes: list[LibraryShape],
         layouts: dict[str, str], sm_count: int) -> dict[str, dict[str, Model | None]]:
    members = [member_shape(p, slots[kernel_key(p)]) for p in plans]
    data = [{measured_at(s, layouts): m.times[(kernel_key(p), shape_key(s))]
             for s in shapes if (kernel_key(p), shape_key(s)) in m.times} for p in plans]
    return {kernel_key(p): models for p, models in zip(plans, fit_all(members, data, sm_count))}


def _predicted(plan: Plan, models: dict, slots: dict, shape: LibraryShape, cls: str, sm_count: int) -> float:
    per_class = models.get(kernel_key(plan), {})
    model = per_class.get(model_class(cls)) or next((m for m in per_class.values() if m), None)
    if model is None:
        return math.inf
    return predict(member_shape(plan, slots[kernel_key(plan)]), model, shape.M, shape.N, shape.K, sm_count,
                   shape.batch, cls == SPLIT)
