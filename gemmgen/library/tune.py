"""Tuning a library on the GPU: every candidate kernel (each concrete member, each point of a small
space, the winners of a strategy's search in a large one) is validated once and timed at the
library's shapes, with cuBLAS in its precision, into one resumable database. To spend the GPU where
it matters, all candidates are timed at a few diverse anchor shapes first; at the other shapes only
those the model (selection.py) predicts fastest are; the members finally chosen, and the few
candidates much faster than all of them somewhere (`specialists`), are then timed at every shape.
manifest.py then builds the library from what was measured.
"""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..gpu import bench, runtime, verify
from ..gpu.baseline import cublas_gemm
from ..gpu.compile import compile_all
from ..gpu.verify import Case
from ..language.shapes import LibraryShape
from ..plan import Plan
from ..plan.space import describe, point_key
from ..tuning.database import append as _append  # the database's one writer: a JSON line, flushed and synced
from ..tuning.measure import VALIDATION_CASES, _compiled
from ..tuning.runner import CANDIDATE_TIMEOUT_S
from ..tuning.tune import tune as tune_space
from .model import (MAX_MEMBERS, WINNERS_PER_SHAPE, Library, Measurements, kernel_key, member_shape, read_db,
                    select_members, shape_class, shape_key, slots_per_sm)
from .selection import CLASSES, Model, fit_all, predict, tight_leading_dimensions

# --- measuring --------------------------------------------------------------------------------

def _scope(device: str, driver: str, what: str, library: str) -> str:
    return f"{device}|{driver}|{what}|{library}"


def _case(shape: LibraryShape):
    return Case(shape.M, shape.N, shape.K, pad=shape.pad)


def _lds(shape: LibraryShape, layouts: dict[str, str]) -> dict[str, int]:
    lda, ldb, ldc = tight_leading_dimensions(shape.M, shape.N, shape.K, layouts, shape.pad)
    return {"A": lda, "B": ldb, "C": ldc}


def _buffers(shape: LibraryShape, layouts: dict[str, str]):
    import cupy as cp
    lds = _lds(shape, layouts)
    lines = {"A": shape.M if layouts["A"] == "row" else shape.K, "B": shape.K if layouts["B"] == "row" else shape.N,
             "C": shape.M if layouts["C"] == "row" else shape.N}
    rng = cp.random.default_rng(shape.M * 7 + shape.N * 13 + shape.K)
    return {x: rng.uniform(-1, 1, max(1, lines[x]) * lds[x] + 64, dtype=cp.float32) for x in "ABC"}, lds


@dataclass
class Task:
    """One unit of GPU work: validate a candidate, time one at a shape, or time cuBLAS at a shape."""

    kind: str                      # "validate", "time" or "cublas"
    plan: Plan | None = None
    shape: LibraryShape | None = None

    @property
    def label(self) -> str:
        what = kernel_key(self.plan) if self.plan is not None else "cublas"
        return f"{self.kind}|{what}|{shape_key(self.shape) if self.shape else ''}"


def _worker(tasks: list[Task], db: str, library: str, layouts: dict, baseline: str, state: str,
            budget_s: float, device: int | None) -> None:
    """Validate and time in order; runs in a child process that may die (a faulting kernel)."""
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
    info = runtime.device_info()
    _append(Path(db), {"scope": _scope(info.name, info.driver_version, "device", library), "key": "device",
                       "sm_count": info.sm_count, "compute_capability": list(info.compute_capability)})
    flusher = bench.L2Flusher(info)
    kernels: dict[str, runtime.Kernel] = {}
    problems: dict = {}
    buffers = lds = None
    current_shape = None
    for task in tasks:
        Path(state).write_text(task.label)
        if task.kind == "validate":
            kernel = kernels.setdefault(kernel_key(task.plan), runtime.Kernel(task.plan, _compiled(task.plan, None)))
            report = verify.check(kernel, VALIDATION_CASES, problems=problems)
            entry = {"scope": _scope(info.name, info.driver_version, "validation", library),
                     "key": kernel_key(task.plan), "point": describe(task.plan.spec),
                     "status": "ok" if report.ok else "invalid"}
            if not report.ok:
                entry["reason"] = f"{report.failures[0].case}: {report.failures[0].message}"
            _append(Path(db), entry)
            continue
        if task.shape != current_shape:
            buffers = lds = None
            buffers, lds = _buffers(task.shape, layouts)
            current_shape = task.shape
        s = task.shape
        args = (s.M, s.N, s.K, 1.0, buffers["A"].data.ptr, lds["A"], buffers["B"].data.ptr, lds["B"],
                0.0, buffers["C"].data.ptr, lds["C"])
        if task.kind == "cublas":
            tf32 = baseline == "cuBLAS TF32"
            timing = bench.time_gpu(lambda: cublas_gemm(*args, layouts, tf32=tf32), flush=flusher, warmup_s=0.03,
                              budget_s=budget_s)
            key, point = "cublas", baseline
        else:
            kernel = kernels.setdefault(kernel_key(task.plan), runtime.Kernel(task.plan, _compiled(task.plan, None)))
            timing = bench.time_gpu(lambda: kernel.launch(*args), flush=flusher, warmup_s=0.03, budget_s=budget_s)
            key, point = kernel_key(task.plan), describe(task.plan.spec)
        flops = 2.0 * s.M * s.N * s.K
        _append(Path(db), {"scope": _scope(info.name, info.driver_version, shape_key(s), library),
                           "key": key, "point": point, "status": "ok", "ms": timing.median_ms,
                           "tflops": flops / (timing.median_ms * 1e-3) / 1e12 if timing.median_ms else 0.0})
    Path(state).write_text("")


def _anchors(shapes: list[LibraryShape], layouts: dict[str, str], count: int) -> list[LibraryShape]:
    """`count` shapes spread over (log M, log N, log K) by farthest-point sampling, at least two of
    each alignment class present (so each class gets a model)."""
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


@dataclass
class TuneReport:
    library: Library
    device: str
    measurements: Measurements
    evaluated: int
    seconds: float
    failures: list[dict]


def tune_library(library: Library, *, db: Path, progress: Callable[[dict], None] | None = None,
                 strategy: str = "exhaustive", options: dict | None = None, max_points: int | None = None,
                 anchors: int = 8, per_shape: int = 6, budget_s: float = 0.05,
                 device: int | None = None) -> TuneReport:
    """Measure what the library needs on this GPU (see the module docstring); resumable."""
    started = time.perf_counter()
    info = runtime.device_info(0 if device is None else device)
    device_key = f"{info.name}|{info.driver_version}"
    shapes = library.shapes
    layouts = library.layouts
    candidates = library.candidates()
    # Large spaces: a strategy's search per shape; its winners join the candidates.
    for member in library.members:
        if not member.searched:
            continue
        for shape in shapes:
            result = tune_space(member.spec, _case(shape), strategy=strategy, options=options,
                                max_points=max_points, db=db, progress=progress,
                                devices=None if device is None else [device])
            good = sorted((r for r in result.records if r.get("status") == "ok"), key=lambda r: -r["tflops"])
            by_key = {point_key(p.spec): p for p in member.plans}
            for record in good[:WINNERS_PER_SHAPE]:
                plan = by_key.get(record["key"])
                if plan is not None and all(kernel_key(plan) != kernel_key(c) for c in candidates):
                    candidates.append(plan)
    by_key = {kernel_key(p): p for p in candidates}
    compile_all(candidates)
    slots = {key: slots_per_sm(plan) for key, plan in by_key.items()}

    def measured() -> Measurements:
        return Measurements.of(read_db(db, library.name).get(device_key, {}))

    evaluated = 0

    def run(tasks: list[Task]) -> None:
        nonlocal evaluated
        done = measured()
        todo = [t for t in tasks if not _done(t, done)]
        evaluated += len(todo)
        if todo:
            _run_tasks(todo, db, library, budget_s, device, device_key, progress)

    anchor_shapes = _anchors(shapes, layouts, anchors)
    # Each phase decides from what the phases before it timed, and nothing else, so that a run
    # resumed after an interruption makes the same decisions and measures nothing twice.
    # 1. every candidate validated, then timed at the anchors (cuBLAS at every shape).
    run([Task("validate", plan) for plan in candidates] + [Task("cublas", shape=s) for s in shapes])
    valid = [p for p in candidates if measured().valid(kernel_key(p))]
    phase1 = [Task("time", p, s) for s in anchor_shapes for p in valid]
    run(phase1)
    # 2. at the other shapes, the candidates the model predicts fastest.
    models = _fit(valid, _only(measured(), phase1), slots, shapes, layouts, info.sm_count)
    phase2 = []
    for shape in shapes:
        if shape in anchor_shapes:
            continue
        cls = shape_class(shape, layouts)
        ranked = sorted(valid, key=lambda p: _predicted(p, models, slots, shape, cls, info.sm_count))
        # the best predicted overall, and the best two of each member (a model fitted at a few
        # anchors can misjudge a whole kind of kernel, e.g. split K far from them)
        picked = ranked[:per_shape]
        for member in library.members:
            picked += [p for p in ranked if p.spec.name == member.name and p not in picked][:2]
        phase2 += [Task("time", p, shape) for p in picked]
    run(phase2)
    # 3. the members a library would keep, timed at every shape (the model's data).
    m = _only(measured(), phase1 + phase2)
    valid = [p for p in valid if m.valid(kernel_key(p))]  # less any that crashed while timed
    chosen = select_members(valid, m, shapes, MAX_MEMBERS)
    run([Task("time", p, s) for s in shapes for p in chosen + specialists(valid, chosen, m, shapes)])
    m = measured()
    failures = [entry for entry in m.status.values() if entry.get("status") != "ok"]
    return TuneReport(library, device_key, m, evaluated, time.perf_counter() - started, failures)


SPECIALIST_MARGIN = 1.05   # a candidate this much faster than every chosen one at some shape ...
MAX_SPECIALISTS = 3        # ... is timed at every shape too (the fastest few such)


def specialists(valid: list[Plan], chosen: list[Plan], m: Measurements, shapes: list[LibraryShape]) -> list[Plan]:
    """Candidates that beat every chosen one by SPECIALIST_MARGIN at some shape where both were
    timed: a kernel that wins only where the rest are weak (ping-pong at short K), which the greedy
    choice over partly timed data can pass over. Timed at every shape, they are then open to the
    build's choice among fully timed candidates. Largest gain first; decided from `m` alone."""
    gains: dict[str, tuple[float, Plan]] = {}
    for shape in shapes:
        k = shape_key(shape)
        kept = [m.times[(kernel_key(p), k)] for p in chosen if (kernel_key(p), k) in m.times]
        if not kept:
            continue
        for plan in valid:
            key = kernel_key(plan)
            if plan in chosen or (key, k) not in m.times or not plan.beta:
                continue
            gain = min(kept) / m.times[(key, k)]
            if gain >= SPECIALIST_MARGIN and gain > gains.get(key, (0.0, plan))[0]:
                gains[key] = (gain, plan)
    ranked = sorted(gains.values(), key=lambda g: (-g[0], valid.index(g[1])))
    return [plan for _, plan in ranked[:MAX_SPECIALISTS]]


def _only(m: Measurements, tasks: list[Task]) -> Measurements:
    """The measurements of these timing tasks alone (validation and cuBLAS records kept)."""
    pairs = {(kernel_key(t.plan), shape_key(t.shape)) for t in tasks}
    return Measurements(m.status, {k: v for k, v in m.times.items() if k in pairs}, m.cublas)


def _done(task: Task, m: Measurements) -> bool:
    if task.kind == "validate":
        return kernel_key(task.plan) in m.status
    if task.kind == "cublas":
        return shape_key(task.shape) in m.cublas
    key = kernel_key(task.plan)
    return (key, shape_key(task.shape)) in m.times or (key in m.status and not m.valid(key))


def _run_tasks(tasks: list[Task], db: Path, library: Library, budget_s: float, device: int | None,
               device_key: str, progress: Callable[[dict], None] | None) -> None:
    """Tasks in disposable worker processes: a crash or a hang costs the candidate in flight."""
    context = multiprocessing.get_context("spawn")
    state = Path(f"{db}.inflight")
    remaining = list(tasks)
    while remaining:
        state.write_text("")
        seen = len(db.read_text().splitlines()) if db.exists() else 0
        worker = context.Process(target=_worker, args=(remaining, str(db), library.name, library.layouts,
                                                       library.baseline, str(state), budget_s, device))
        worker.start()
        last_change, timed_out = time.monotonic(), False
        while worker.is_alive():
            worker.join(0.25)
            lines = db.read_text().splitlines() if db.exists() else []
            if len(lines) != seen:
                for line in lines[seen:]:
                    if progress:
                        try:
                            progress(json.loads(line))
                        except ValueError:
                            pass
                seen, last_change = len(lines), time.monotonic()
            elif time.monotonic() - last_change > CANDIDATE_TIMEOUT_S:
                worker.terminate()
                worker.join()
                timed_out = True
        in_flight = state.read_text().strip() if state.exists() else ""
        labels = [t.label for t in remaining]
        if in_flight and in_flight in labels:
            index = labels.index(in_flight)
            task = remaining[index]
            if task.kind == "cublas" or (worker.exitcode == 0 and not timed_out):
                raise RuntimeError(f"the library worker failed at {in_flight} (exit code {worker.exitcode})")
            entry = {"scope": f"{device_key}|validation|{library.name}", "key": kernel_key(task.plan),
                     "point": describe(task.plan.spec), "status": "timeout" if timed_out else "crash",
                     "reason": (f"no result within {CANDIDATE_TIMEOUT_S:.0f} s" if timed_out else
                                f"the worker process died (exit code {worker.exitcode}) "
                                f"during {task.kind}{' at ' + shape_key(task.shape) if task.shape else ''}")}
            _append(db, entry)
            if progress:
                progress(entry)
            remaining = [t for t in remaining[index + 1:] if t.plan is None or kernel_key(t.plan) != entry["key"]]
        elif worker.exitcode != 0:
            raise RuntimeError(f"the library worker failed (exit code {worker.exitcode}): is the GPU usable?")
        else:
            remaining = []
    state.unlink(missing_ok=True)


def _fit(plans: list[Plan], m: Measurements, slots: dict[str, int], shapes: list[LibraryShape],
         layouts: dict[str, str], sm_count: int) -> dict[str, dict[str, Model | None]]:
    members = [member_shape(p, slots[kernel_key(p)]) for p in plans]
    data = [{(s.M, s.N, s.K, shape_class(s, layouts)): m.times[(kernel_key(p), shape_key(s))]
             for s in shapes if (kernel_key(p), shape_key(s)) in m.times} for p in plans]
    return {kernel_key(p): models for p, models in zip(plans, fit_all(members, data, sm_count))}


def _predicted(plan: Plan, models: dict, slots: dict, shape: LibraryShape, cls: str, sm_count: int) -> float:
    per_class = models.get(kernel_key(plan), {})
    model = per_class.get(cls) or next((m for m in per_class.values() if m), None)
    if model is None:
        return math.inf
    return predict(member_shape(plan, slots[kernel_key(plan)]), model, shape.M, shape.N, shape.K, sm_count)
