"""Libraries: one GEMM entry point per precision, over several kernels and search spaces.

A library (the `library` block of a spec) names members (kernels or search spaces of one precision
class) and the shapes to tune them for. This module
- resolves it: members found and planned in the library's layouts, precisions and arguments
  checked (every problem a SpecError at its line);
- tunes it on the GPU: every candidate kernel (each concrete member, each point of a small
  space, the winners of a strategy's search in a large one) is validated once and timed at the
  shapes, with cuBLAS in the library's precision, into one resumable database. To spend the GPU
  where it matters, all candidates are timed at a few diverse anchor shapes first; at the other
  shapes only those the model (selection.py) predicts fastest are; the members finally chosen,
  and the few candidates much faster than all of them somewhere (`specialists`), are then timed
  at every shape;
- builds the manifest: which candidates the library keeps, each one's fitted model, the tuned
  table and the leave-one-out quality of the choice. codegen turns a manifest into one .cu with a
  single extern "C" entry point; gemmgen.matmul loads one to choose and launch from Python.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..tuning import database as tuning_db
from ..language.errors import SpecError
from ..plan import Plan, try_plan
from .selection import (CLASSES, Candidate, MemberShape, Model, alignment_class, choose,
                        fit_all, leave_one_out, predict, tight_leading_dimensions)
from ..plan.space import MAX_POINTS, check_size, describe, point_key, to_text
from ..language.load import load_file, parse
from ..language.shapes import LibraryShape
from ..language.spec import LibrarySpec, Spec
from ..tuning.tune import _append  # the database's one writer: a JSON line, flushed and synced

MANIFEST_FORMAT = 1
EXHAUSTIVE_LIMIT = 64      # a space with more valid points is searched per shape by a strategy
WINNERS_PER_SHAPE = 3      # candidates a searched space gives per shape
MAX_MEMBERS = 10           # kernels a library keeps (each costs compile time and .cu size)
MAX_LISTED_MEMBERS = 64    # members a library may name (each is found, and its points planned)
PRECISION_OF_MATH = {"simt": "fp32", "3xtf32": "fp32", "tf32": "tf32"}
PRECISION_WORDS = {"fp32": "FP32-accurate (math simt or 3xtf32)", "tf32": "TF32 (math tf32)"}


# --- resolving a library ------------------------------------------------------------------

@dataclass
class Member:
    """A member as the library uses it: its spec in the library's layouts, and its valid points."""

    name: str
    spec: Spec
    plans: list[Plan]
    searched: bool   # a space too large to time whole: a strategy searches it per shape


@dataclass
class Library:
    spec: LibrarySpec
    members: list[Member]
    precision: str

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def layouts(self) -> dict[str, str]:
        return self.spec.layouts()

    @property
    def shapes(self) -> list[LibraryShape]:
        return list(dict.fromkeys(self.spec.shapes))

    @property
    def baseline(self) -> str:
        return "cuBLAS TF32" if self.precision == "tf32" else "cuBLAS FP32"

    def candidates(self) -> list[Plan]:
        """Every kernel the library times whole: concrete members and the points of small spaces,
        each once."""
        seen, plans = set(), []
        for member in self.members:
            if member.searched:
                continue
            for plan in member.plans:
                if kernel_key(plan) not in seen:
                    seen.add(kernel_key(plan))
                    plans.append(plan)
        return plans


def kernel_key(plan: Plan) -> str:
    """The database key of a candidate: its settings, whatever member or library it came from."""
    return point_key(replace(plan.spec, name="kernel"))


def shape_key(shape: LibraryShape) -> str:
    return f"{shape.M}x{shape.N}x{shape.K}" + (f"+{shape.pad}" if shape.pad else "")


def _find_member(name: str, span, lib: LibrarySpec, kernels: list[Spec]) -> Spec:
    for spec in kernels:
        if spec.name == name:
            return spec
    if not lib.path.startswith("<"):
        candidate = Path(lib.path).parent / f"{name}.gemm"
        if candidate.is_file():
            for spec in load_file(candidate).kernels:
                if spec.name == name:
                    return spec
            raise lib.error(span, f"{candidate} defines no kernel named '{name}'",
                            "the name of a kernel in that file")
    raise lib.error(span, f"member '{name}' is neither a kernel in this file nor in {name}.gemm beside it",
                    "the name of a kernel or search space in this file or a NAME.gemm next to it")


def _sized(lib: LibrarySpec, kernels: list[Spec]) -> list[tuple[str, object, Spec]]:
    """The members found, each in the library's layouts, their points counted (not made): a member
    over MAX_POINTS is a SpecError at its largest set, and so are members of more than MAX_POINTS
    in all (at the first member past it)."""
    if len(lib.members) > MAX_LISTED_MEMBERS:
        name, span = lib.members[MAX_LISTED_MEMBERS]
        raise lib.error(span, f"library '{lib.name}' names {len(lib.members)} members, more than "
                        f"{MAX_LISTED_MEMBERS}", f"at most {MAX_LISTED_MEMBERS} members (it keeps {MAX_MEMBERS})")
    layouts = lib.layouts()
    found, total = [], 0
    for name, span in lib.members:
        spec = _find_member(name, span, lib, kernels)
        spec = spec.with_values(layout_A=layouts["A"], layout_B=layouts["B"], layout_C=layouts["C"])
        total += check_size(spec, what=f"member '{name}' of library '{lib.name}'")
        if total > MAX_POINTS:
            raise lib.error(span, f"the members of library '{lib.name}' up to '{name}' hold {total:,} points "
                            f"in all, over the limit of {MAX_POINTS:,}",
                            f"members of at most {MAX_POINTS:,} points in all: smaller search spaces")
        found.append((name, span, spec))
    return found


def resolve(lib: LibrarySpec, kernels: list[Spec]) -> Library:
    """The library's members found, planned in its layouts and checked against each other."""
    layouts = lib.layouts()
    members: list[Member] = []
    precision_source: tuple[str, str] | None = None
    if lib.precision:
        precision_source = (lib.precision[0], "the library's precision line")
    for name, span, spec in _sized(lib, kernels):
        maths = spec.param("math").values
        classes = {PRECISION_OF_MATH[m] for m in maths}
        if len(classes) > 1:
            raise lib.error(span, f"member '{name}' mixes math {', '.join(maths)}: TF32 and FP32-accurate "
                            "kernels cannot share a library", "members of one precision: math tf32, or math simt/3xtf32")
        (precision,) = classes
        if precision_source and precision != precision_source[0]:
            raise lib.error(span, f"member '{name}' is {PRECISION_WORDS[precision]}, but {precision_source[1]} "
                            f"is {PRECISION_WORDS[precision_source[0]]}: a library keeps to one precision",
                            f"members of {PRECISION_WORDS[precision_source[0]]}")
        precision_source = precision_source or (precision, f"member '{name}'")
        plans, reasons = [], []
        for point in spec.points():
            plan, error = try_plan(point)
            if plan is None:
                reasons.append(error.message)
                continue
            if plan.reduce_count:
                raise lib.error(span, f"member '{name}' fuses a reduction, whose entry point takes more "
                                "arguments than a library's", "kernels without a reduce line")
            plans.append(plan)
        if not plans:
            raise lib.error(span, f"member '{name}' cannot be built in this library's layout (A {layouts['A']}, "
                            f"B {layouts['B']}, C {layouts['C']}): {reasons[0] if reasons else 'no valid point'}",
                            "members that take the library's layout (stages N async and mma.sync take any)")
        members.append(Member(name, spec, plans, len(plans) > EXHAUSTIVE_LIMIT))
    library = Library(lib, members, precision_source[0])
    plans = [plan for m in members for plan in m.plans]
    if not any(plan.beta for plan in plans):
        raise lib.error(None, f"no member of library '{lib.name}' takes beta != 0 (all have 'epilogue alpha'): "
                        "it could not serve every call", "at least one member with epilogue alpha beta")
    if not any(not plan.arch.has_wgmma and plan.beta for plan in plans):
        raise lib.error(None, f"every member of library '{lib.name}' needs sm_90a (wgmma): on any other GPU "
                        "it would have no kernel", "a portable member: a kernel whose target is sm_80 to sm_90, "
                        "with epilogue alpha beta")
    return library


def load_libraries(path: str | Path, name: str | None = None) -> list[Library]:
    """The libraries of a spec file, resolved (only `name` when given)."""
    parsed = load_file(path)
    chosen = [lib for lib in parsed.libraries if name is None or lib.name == name]
    if name is not None and not chosen:
        raise SpecError(f"no library named '{name}' in this file", path=str(path),
                        allowed=", ".join(lib.name for lib in parsed.libraries) or "(this file has none)")
    return [resolve(lib, parsed.kernels) for lib in chosen]


# --- measuring --------------------------------------------------------------------------------

def _scope(device: str, driver: str, what: str, library: str) -> str:
    return f"{device}|{driver}|{what}|{library}"


def _case(shape: LibraryShape):
    from ..gpu.verify import Case
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
    from ..gpu import verify
    from ..gpu.baseline import cublas_gemm
    from ..gpu.bench import L2Flusher, time_gpu
    from ..gpu.runtime import Kernel, device_info
    from ..tuning.tune import VALIDATION_CASES, _compiled

    info = device_info()
    _append(Path(db), {"scope": _scope(info.name, info.driver_version, "device", library), "key": "device",
                       "sm_count": info.sm_count, "compute_capability": list(info.compute_capability)})
    flusher = L2Flusher(info)
    kernels: dict[str, Kernel] = {}
    problems: dict = {}
    buffers = lds = None
    current_shape = None
    for task in tasks:
        Path(state).write_text(task.label)
        if task.kind == "validate":
            kernel = kernels.setdefault(kernel_key(task.plan), Kernel(task.plan, _compiled(task.plan, None)))
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
            timing = time_gpu(lambda: cublas_gemm(*args, layouts, tf32=tf32), flush=flusher, warmup_s=0.03,
                              budget_s=budget_s)
            key, point = "cublas", baseline
        else:
            kernel = kernels.setdefault(kernel_key(task.plan), Kernel(task.plan, _compiled(task.plan, None)))
            timing = time_gpu(lambda: kernel.launch(*args), flush=flusher, warmup_s=0.03, budget_s=budget_s)
            key, point = kernel_key(task.plan), describe(task.plan.spec)
        flops = 2.0 * s.M * s.N * s.K
        _append(Path(db), {"scope": _scope(info.name, info.driver_version, shape_key(s), library),
                           "key": key, "point": point, "status": "ok", "ms": timing.median_ms,
                           "tflops": flops / (timing.median_ms * 1e-3) / 1e12 if timing.median_ms else 0.0})
    Path(state).write_text("")


def read_db(db: Path, library: str) -> dict[str, dict[str, dict]]:
    """This library's records by device: {device|driver: {what|key: record}} (later lines win).
    Raises tuning_db.DatabaseError (file:line) for a malformed database."""
    by_device: dict[str, dict[str, dict]] = {}
    for _, entry in tuning_db.read(db):
        device, driver, what, name = entry["scope"].split("|")
        if name == library:
            by_device.setdefault(f"{device}|{driver}", {})[f"{what}|{entry['key']}"] = entry
    return by_device


@dataclass
class Measurements:
    """What the database holds for one device: validation status and times per (candidate, shape)."""

    status: dict[str, dict] = field(default_factory=dict)       # kernel key -> validation record
    times: dict[tuple[str, str], float] = field(default_factory=dict)  # (kernel key, shape key) -> ms
    cublas: dict[str, float] = field(default_factory=dict)      # shape key -> ms

    @classmethod
    def of(cls, records: dict[str, dict]) -> "Measurements":
        m = cls()
        for label, entry in records.items():
            what, key = label.split("|")
            if what == "device":
                continue
            if what == "validation":
                m.status[key] = entry
            elif entry.get("status") == "ok":
                if key == "cublas":
                    m.cublas[what] = entry["ms"]
                else:
                    m.times[(key, what)] = entry["ms"]
            else:  # a crash or timeout while timing: the candidate is out
                m.status[key] = entry
        return m

    def valid(self, key: str) -> bool:
        return self.status.get(key, {}).get("status") == "ok"


def member_shape(plan: Plan, slots_per_sm: int = 1) -> MemberShape:
    return MemberShape(plan.BM, plan.BN, plan.BK, plan.split_k, slots_per_sm, plan.schedule == "stream-k",
                       plan.cluster_m, plan.cluster_n)


def slots_per_sm(plan: Plan) -> int:
    """Blocks of this kernel an SM holds at once (ptxas's registers, the Plan's shared memory)."""
    if plan.consumers:  # a wgmma block takes a whole SM (__launch_bounds__(THREADS, 1))
        return 1
    from ..gpu.compile import compile_plan
    from ..explain.analysis import occupancy
    resources = max(compile_plan(plan).resources.values(), key=lambda r: r.registers)
    return max(1, occupancy(plan, resources).blocks)


def shape_class(shape: LibraryShape, layouts: dict[str, str]) -> str:
    lda, ldb, ldc = tight_leading_dimensions(shape.M, shape.N, shape.K, layouts, shape.pad)
    return alignment_class(lda, ldb, ldc)


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
    from ..gpu.runtime import device_info
    from ..tuning.tune import tune as tune_space

    started = time.perf_counter()
    info = device_info(0 if device is None else device)
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


def compile_all(plans: list[Plan]) -> None:
    """NVRTC on every plan, one process per CPU core, into the disk cache (failures are left for
    whoever loads the kernel to report)."""
    from ..tuning.tune import _compile_one
    jobs = [(plan, None) for plan in plans]
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile_one, jobs))


def _run_tasks(tasks: list[Task], db: Path, library: Library, budget_s: float, device: int | None,
               device_key: str, progress: Callable[[dict], None] | None) -> None:
    """Tasks in disposable worker processes: a crash or a hang costs the candidate in flight."""
    from ..tuning.tune import CANDIDATE_TIMEOUT_S
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


def select_members(plans: list[Plan], m: Measurements, shapes: list[LibraryShape], limit: int) -> list[Plan]:
    """Greedy: add the candidate that most lowers the sum over shapes of log(kept best / best), where
    a shape no kept candidate was timed at counts as 4x slower; stop at `limit` or when nothing
    gains 0.2% a shape. Always keeps a portable (non-sm_90a) candidate that takes beta."""
    keys = [shape_key(s) for s in shapes]
    best = {k: min((m.times[(kernel_key(p), k)] for p in plans if (kernel_key(p), k) in m.times), default=None)
            for k in keys}

    def cost(kept: list[Plan]) -> float:
        total = 0.0
        for k in keys:
            if best[k] is None:
                continue
            times = [m.times[(kernel_key(p), k)] for p in kept if (kernel_key(p), k) in m.times]
            total += math.log(min(times) / best[k]) if times else math.log(4.0)
        return total

    kept: list[Plan] = []
    current = cost(kept)
    while len(kept) < limit:
        options = [(cost(kept + [p]), i, p) for i, p in enumerate(plans) if p not in kept and p.beta]
        if not options:
            break
        value, _, plan = min(options, key=lambda o: (o[0], o[1]))
        if kept and current - value < 0.002 * len(keys):
            break
        kept.append(plan)
        current = value
    if not any(not p.arch.has_wgmma for p in kept):
        portable = [p for p in plans if not p.arch.has_wgmma and p.beta]
        if portable:
            kept.append(max(portable, key=lambda p: (sum((kernel_key(p), k) in m.times for k in keys),
                                                     -plans.index(p))))
    return kept


# --- the manifest ----------------------------------------------------------------------------------

def build_manifest(library: Library, db: Path, *, device: str | None = None,
                   max_members: int = MAX_MEMBERS) -> dict:
    """The library as measured on one device: its kept members with their models, the tuned table,
    and the leave-one-out quality of the choice. No GPU needed."""
    by_device = read_db(db, library.name)
    if not by_device:
        raise LookupError(f"{db} holds no measurements of library '{library.name}': run gemmgen tune on it")
    if device is None:
        device = max(by_device, key=lambda d: len(by_device[d]))
    elif device not in by_device:
        matches = [d for d in by_device if d.split("|")[0] == device]
        if not matches:
            raise LookupError(f"{db} has no measurements of '{library.name}' on {device}; it has: "
                              + ", ".join(by_device))
        device = matches[0]
    m = Measurements.of(by_device[device])
    plans = [p for p in library.candidates() if m.valid(kernel_key(p))]
    for member in library.members:  # winners of searched spaces that were timed as candidates
        if member.searched:
            plans += [p for p in member.plans if m.valid(kernel_key(p)) and
                      any((kernel_key(p), shape_key(s)) in m.times for s in library.shapes)]
    if not plans:
        raise LookupError(f"no candidate of library '{library.name}' passed validation on {device}")
    layouts = library.layouts
    shapes = [s for s in library.shapes if shape_key(s) in m.cublas or
              any((kernel_key(p), shape_key(s)) in m.times for p in plans)]
    # Members come from the candidates timed at every shape (tuning's last phase times those it
    # keeps everywhere), so that each member's model and the table rest on complete data.
    complete = [p for p in plans if all((kernel_key(p), shape_key(s)) in m.times for s in shapes)]
    kept = select_members(complete if len(complete) >= 2 else plans, m, shapes, max_members)
    sm_count = _sm_count(by_device[device])
    slots = {kernel_key(p): slots_per_sm(p) for p in kept}
    member_shapes = [member_shape(p, slots[kernel_key(p)]) for p in kept]
    data = [{(s.M, s.N, s.K, shape_class(s, layouts)): m.times[(kernel_key(p), shape_key(s))]
             for s in shapes if (kernel_key(p), shape_key(s)) in m.times} for p in kept]
    models = fit_all(member_shapes, data, sm_count)
    flags = [(p.beta, p.arch.has_wgmma) for p in kept]
    loo = leave_one_out(member_shapes, data, sm_count, flags)
    members = []
    for index, (plan, shape, per_class) in enumerate(zip(kept, member_shapes, models)):
        name = f"{library.name}_{index}"
        members.append({
            "name": name, "key": kernel_key(plan), "point": describe(plan.spec),
            "member": plan.spec.name, "spec": to_text(plan.spec, name, f"member {plan.spec.name} of library "
                                                      f"{library.name}: {describe(plan.spec)}"),
            "target": plan.arch.name, "math": plan.math, "BM": shape.BM, "BN": shape.BN, "BK": shape.BK,
            "split": shape.split, "slots_per_sm": shape.slots_per_sm,
            **({"stream_k": True} if shape.stream_k else {}),
            **({"cluster": [shape.cluster_m, shape.cluster_n]} if shape.cluster_m * shape.cluster_n > 1 else {}),
            "beta": plan.beta,
            "needs_sm90a": plan.arch.has_wgmma,
            "models": {cls: model.to_dict() if model else None for cls, model in per_class.items()},
        })
    table = []
    for s in shapes:
        times = {str(i): m.times[(kernel_key(p), shape_key(s))] for i, p in enumerate(kept)
                 if (kernel_key(p), shape_key(s)) in m.times}
        candidates = [Candidate(ms, {c: x for c, x in pc.items()}, beta=f[0], needs_sm90a=f[1])
                      for ms, pc, f in zip(member_shapes, models, flags)]
        cls = shape_class(s, layouts)
        chosen = choose(candidates, s.M, s.N, s.K, cls, sm_count)
        best_any = min((m.times[(kernel_key(p), shape_key(s))] for p in plans
                        if (kernel_key(p), shape_key(s)) in m.times), default=None)
        table.append({"M": s.M, "N": s.N, "K": s.K, "pad": s.pad, "class": cls,
                      "cublas_ms": m.cublas.get(shape_key(s)), "chosen": chosen, "ms": times,
                      "best_candidate_ms": best_any})
    device_name, driver = device.split("|")
    portable = next(i for i, p in enumerate(kept) if not p.arch.has_wgmma and p.beta) \
        if any(not p.arch.has_wgmma and p.beta for p in kept) else None
    return {
        "generator": "gemmgen", "format": MANIFEST_FORMAT, "library": library.name, "precision": library.precision,
        "baseline": library.baseline, "layout": layouts,
        "device": {"name": device_name, "driver": driver, "sm_count": sm_count,
                   "compute_capability": _compute_capability(kept)},
        "members": members, "portable": portable, "shapes": table,
        "leave_one_out": {"median": loo.median, "worst": loo.worst,
                          "per_shape": {f"{M}x{N}x{K} {cls}": r for (M, N, K, cls), r in loo.ratios.items()}},
        "candidates_timed": len(plans),
    }


def _sm_count(records: dict[str, dict]) -> int:
    for entry in records.values():
        if "sm_count" in entry:
            return entry["sm_count"]
    return 132


def _compute_capability(plans: list[Plan]) -> list[int]:
    """The compute capability the library was tuned for: sm_90a members pin it to 9.0."""
    wgmma = [p for p in plans if p.arch.has_wgmma]
    return list(wgmma[0].arch.compute_capability) if wgmma else list(plans[0].arch.compute_capability)


def member_plans(manifest: dict) -> list[Plan]:
    """The kept members of a manifest, planned from the spec text it carries."""
    from ..plan import make_plan
    plans = []
    for member in manifest["members"]:
        (spec,) = parse(member["spec"], f"<library {manifest['library']}: {member['name']}>")
        plans.append(make_plan(spec))
    return plans


def candidates_of(manifest: dict) -> list[Candidate]:
    return [Candidate(MemberShape(m["BM"], m["BN"], m["BK"], m["split"], m["slots_per_sm"], m.get("stream_k", False),
                                  *m.get("cluster", (1, 1))),
                      {cls: Model.from_dict(d) if d else None for cls, d in m["models"].items()},
                      beta=m["beta"], needs_sm90a=m["needs_sm90a"]) for m in manifest["members"]]
