"""Replay a search strategy against a recorded exhaustive search, with no GPU.

`gemmgen tune --strategy exhaustive` records every valid point of a space at a shape in a tuning
database. Replaying a strategy over that recording answers its evaluate() calls from the database
instead of the GPU (a point that failed, status other than ok, scores 0 as in live tuning), so a
strategy can be run under many seeds in seconds and compared with the others on the same
landscape: how many evaluations it needs to come within 1% and 3% of the exhaustive best, and the
best it has found after a given number of evaluations.

A recording may predate today's space: points of today's space that it lacks are reported and
left out (the replay searches the recorded points only), and records of points that today's Plan
no longer accepts are ignored.

The test bed (benchmarks/testbed.json) lists the spaces and shapes that every strategy is replayed
on; benchmarks/record_testbed.py records the ones missing from benchmarks/tuning/. Those default
paths, and the spec paths a test bed names, are relative to the current folder (a checkout's
root), never to where gemmgen is installed.
"""

from __future__ import annotations

import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..gpu.verify import Case, parse_case
from ..language.load import load_one
from ..language.spec import Spec
from ..plan.space import Space, describe, expand, point_key
from . import database as tuning_db, strategies
from .child import ignore_interrupts
from .database import CUBLAS_KEY, Scope

H100_SMS = 132                  # what the cost model assumes when a recording does not say
THRESHOLDS = (0.03, 0.01)       # "within 3% / 1% of the exhaustive best"
BUDGETS = (0.05, 0.10, 0.20)    # fractions of the valid points at which best-found is compared
TESTBED = Path("benchmarks") / "testbed.json"   # relative to the current folder
TUNING = Path("benchmarks") / "tuning"


class ReplayError(Exception):
    """A test bed that cannot be read, or a spec it names that is not there."""


def shape_text(shape: Case) -> str:
    return f"{shape.M}x{shape.N}x{shape.K}"


@dataclass
class Recording:
    """An exhaustive search as the database holds it, on today's space."""

    space: Space                # today's space, restricted to the recorded points
    shape: Case
    scope: str                  # device|driver|MxNxK|space of the records
    db: Path
    scores: dict[tuple, float]  # TFLOP/s per point; 0 for a point that failed
    missing: int                # valid points of today's space that the database lacks
    stale: int                  # records of the scope that are no valid point today
    sms: int = H100_SMS

    @property
    def best(self) -> float:
        return max(self.scores.values())

    @property
    def label(self) -> str:
        return f"{self.space.spec.name} {shape_text(self.shape)}"


def _scopes(db: Path, shape: Case, space: Space) -> dict[str, dict[str, dict]]:
    """Records per scope of this space and shape in one database (later lines win). Raises
    tuning_db.DatabaseError for a malformed database, or a record of the space whose label
    contradicts the point its key names."""
    name = space.spec.name
    records = tuning_db.read(db)
    tuning_db.check_labels(db, records, {point_key(p.spec): describe(p.spec) for p in space.plans}, space=name)
    found: dict[str, dict[str, dict]] = {}
    for _, entry in records:
        scope = Scope.of(entry)
        if (scope.what, scope.owner) == (shape_text(shape), name) and entry["key"] != CUBLAS_KEY:
            found.setdefault(entry["scope"], {})[entry["key"]] = entry
    return found


def load_recording(spec: Spec, dbs: list[Path], shape: Case, space: Space | None = None,
                   sms: int = H100_SMS) -> Recording:
    """The recording of `spec`'s space at `shape` that covers the most of today's valid points,
    among the scopes (device, driver) of the given databases."""
    space = space or expand(spec)
    coords_of = {point_key(plan.spec): coords for coords, plan in space.plan_at.items()}
    best = None
    for db in dbs:
        for scope, records in _scopes(db, shape, space).items():
            matched = {coords_of[k]: r for k, r in records.items() if k in coords_of}
            # the most points, then the most recent recording
            rank = (len(matched), max((r.get("time", 0) for r in records.values()), default=0))
            if matched and (best is None or rank > best[0]):
                best = (rank, db, scope, records, matched)
    if best is None:
        raise LookupError(f"no recording of {spec.name} at {shape_text(shape)} in "
                          f"{', '.join(str(d) for d in dbs)}: record one with gemmgen tune "
                          f"--strategy exhaustive --shapes {shape_text(shape)}")
    _, db, scope, records, matched = best
    scores = {c: (r.get("tflops", 0.0) if r.get("status") == "ok" else 0.0) for c, r in matched.items()}
    if max(scores.values()) <= 0:
        raise LookupError(f"{db}: no point of {spec.name} at {shape_text(shape)} passed validation")
    recorded = Space(spec, space.keys, space.dimensions, space.total,
                     {c: p for c, p in space.plan_at.items() if c in scores}, space.pruned)
    return Recording(recorded, shape, scope, db, scores, missing=space.valid - len(scores),
                     stale=len(records) - len(matched), sms=sms)


class ReplayEvaluator:
    """evaluate(points) answered from a recording; keeps each fresh point's score in order.

    Like the live evaluator, a point already evaluated costs nothing, and Budget is raised once
    `max_points` fresh points have been evaluated. `stop_at` ends the run early (Budget) once the
    best found is within that fraction of the recording's best and `min_points` are spent: the
    replay's measurements need nothing past that, and the strategy is never told why.
    """

    def __init__(self, recording: Recording, max_points: int | None = None,
                 stop_at: float | None = None, min_points: int = 0):
        self.recording = recording
        self.shape = recording.shape
        self.sms = recording.sms
        self.max_points = max_points
        self.stop_at = stop_at
        self.min_points = min_points
        self.seen: dict[tuple, float] = {}
        self.order: list[float] = []   # scores of fresh points, in evaluation order

    def __call__(self, points: list[tuple]) -> list[float]:
        scores = self.recording.scores
        for point in dict.fromkeys(points):
            if point not in scores:
                raise KeyError(f"the strategy asked for {point}, which is no point of the recording")
            if point in self.seen:
                continue
            if self.max_points is not None and len(self.order) >= self.max_points:
                break
            self.seen[point] = scores[point]
            self.order.append(scores[point])
        answer = [self.seen.get(p, 0.0) for p in points]
        if self._done():
            raise strategies.Budget()
        return answer

    def _done(self) -> bool:
        if self.max_points is not None and len(self.order) >= self.max_points:
            return True
        if self.stop_at is None or len(self.order) < self.min_points:
            return False
        return max(self.order, default=0.0) >= (1 - self.stop_at) * self.recording.best


@dataclass
class Run:
    """One strategy on one recording with one seed: scores in the order it evaluated them."""

    seed: int
    scores: list[float]

    def evaluations_to(self, best: float, within: float) -> int | None:
        for count, score in enumerate(self.scores, 1):
            if score >= (1 - within) * best:
                return count
        return None

    def best_after(self, count: int) -> float:
        return max(self.scores[:count], default=0.0)


def run_strategy(name: str, recording: Recording, seed: int, options: dict | None = None,
                 max_points: int | None = None, full: bool = False) -> Run:
    """Replay `name` once. Unless `full`, the run stops once it is within 1% of the best and has
    spent the largest comparison budget (all the table needs)."""
    module = strategies.get(name)
    given = dict(options or {})
    if "seed" in module.OPTIONS:
        given["seed"] = seed
    settings = strategies.options_with_defaults(module, given)
    largest = max(1, round(max(BUDGETS) * recording.space.valid))
    evaluate = ReplayEvaluator(recording, max_points, None if full else min(THRESHOLDS), largest)
    try:
        module.tune(recording.space, evaluate, settings)
    except strategies.Budget:
        pass
    return Run(seed, evaluate.order)


@dataclass
class Outcome:
    """A strategy replayed over several seeds on one recording."""

    strategy: str
    recording: Recording
    runs: list[Run] = field(default_factory=list)

    @property
    def valid(self) -> int:
        return self.recording.space.valid

    def counts(self, within: float) -> list[int | None]:
        return [r.evaluations_to(self.recording.best, within) for r in self.runs]

    def median(self, within: float) -> float | None:
        """Median evaluations to come within `within` (a run that never did counts as infinite)."""
        counts = sorted(float("inf") if c is None else c for c in self.counts(within))
        value = statistics.median(counts)
        return None if value == float("inf") else value

    def worst(self, within: float) -> int | None:
        counts = self.counts(within)
        return None if None in counts else max(counts)

    def best_after(self, count: int) -> float:
        """Median over seeds of the best found after `count` evaluations, as a fraction of the
        recording's best."""
        return statistics.median(r.best_after(count) for r in self.runs) / self.recording.best

    def budget(self, fraction: float) -> int:
        return max(1, round(fraction * self.valid))


def _one(args):
    name, recording, seed, options, max_points = args
    return run_strategy(name, recording, seed, options, max_points)


def replay(name: str, recording: Recording, seeds: int = 20, options: dict | None = None,
           max_points: int | None = None, jobs: int = 1) -> Outcome:
    """`name` replayed with seeds 0 .. seeds-1 (in `jobs` processes)."""
    work = [(name, recording, seed, options, max_points) for seed in range(seeds)]
    if jobs > 1:
        with ProcessPoolExecutor(jobs, initializer=ignore_interrupts) as pool:
            runs = list(pool.map(_one, work))
    else:
        runs = [_one(w) for w in work]
    return Outcome(name, recording, runs)


# --- fitting on some recordings, judging on the others ---------------------------------

@dataclass
class Fold:
    """One recording judged with the options chosen on the other recordings."""

    recording: Recording
    options: dict               # the choice that did best on the others
    outcome: Outcome            # those options replayed on this recording
    costs: list[float]          # each choice's cost on the others, in the order of the choices


def replay_cost(outcome: Outcome) -> float:
    """What fitting minimises: the median evaluations to within 3% and to within 1%, each as a
    share of the valid points (a median that never got there counts as all of them)."""
    return sum((outcome.median(w) or outcome.valid) / outcome.valid for w in THRESHOLDS)


def leave_one_out(name: str, recordings: list[Recording], choices: list[dict], seeds: int = 20,
                  jobs: int = 1) -> list[Fold]:
    """Leave-one-recording-out: for each recording, the option set (of `choices`) with the least
    summed replay_cost on all the other recordings, and its replay on the one left out, which
    never takes part in choosing it (ties: the earlier choice)."""
    if len(recordings) < 2 or not choices:
        raise ValueError("leave-one-out needs at least two recordings and one choice of options")
    runs = [[replay(name, r, seeds, c, jobs=jobs) for c in choices] for r in recordings]
    costs = [[replay_cost(o) for o in row] for row in runs]
    folds = []
    for held, recording in enumerate(recordings):
        totals = [sum(costs[i][j] for i in range(len(recordings)) if i != held) for j in range(len(choices))]
        pick = min(range(len(choices)), key=lambda j: (totals[j], j))
        folds.append(Fold(recording, choices[pick], runs[held][pick], totals))
    return folds


# --- the test bed ------------------------------------------------------------------------

@dataclass(frozen=True)
class Bed:
    """One space of the test bed and the shapes it is recorded at."""

    kind: str
    spec: str           # path, relative to the current folder (a checkout's root)
    shapes: tuple[Case, ...]


def load_testbed(path: Path = TESTBED) -> tuple[list[Bed], int]:
    """The test bed's spaces and the SM count its recordings were made with (ReplayError, naming
    the file, for one that is not a test bed)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReplayError(f"cannot read the test bed {path}: {exc.strerror}") from None
    except ValueError as exc:  # not UTF-8, or not JSON
        raise ReplayError(f"{path}: not a test bed (JSON): {exc}") from None
    try:
        beds = [Bed(str(b["kind"]), str(b["spec"]), tuple(parse_case(s) for s in b["shapes"]))
                for b in data["spaces"]]
        sms = int(data.get("sms", H100_SMS))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ReplayError(f"{path}: not a test bed: it lists \"spaces\", each with a \"kind\", a \"spec\" "
                          f"and \"shapes\" (MxNxK) ({type(exc).__name__}: {exc})") from None
    return beds, sms


def testbed_recordings(path: Path = TESTBED, dbs: list[Path] | None = None,
                       root: Path = Path(".")) -> tuple[list[Recording], list[str]]:
    """Every (space, shape) of the test bed found in the databases, and what is missing. The
    test bed's spec paths are relative to `root` (default: the current folder)."""
    beds, sms = load_testbed(path)
    dbs = dbs if dbs is not None else sorted(TUNING.glob("*.jsonl"))
    found, missing = [], []
    for bed in beds:
        spec_path = Path(root) / bed.spec
        if not spec_path.is_file():
            raise ReplayError(f"{path} names the spec {bed.spec}, which is not in {Path(root).resolve()}: "
                              "a test bed's paths are relative to the folder gemmgen runs in (a checkout's root)")
        spec = load_one(str(spec_path))
        space = expand(spec)
        for shape in bed.shapes:
            try:
                found.append(load_recording(spec, dbs, shape, space, sms))
            except LookupError:
                missing.append(f"{spec.name} {shape_text(shape)}")
    return found, missing


# --- the table ---------------------------------------------------------------------------

def _count(value: float | int | None, valid: int) -> str:
    if value is None:
        return "never"
    return f"{value:g} ({100 * value / valid:.0f}%)"


def table_rows(outcomes: list[Outcome], baseline: str = "random_sample") -> list[dict]:
    """One row per strategy and recording: evaluations to 3% and 1% (median, worst) and the median
    best found at each comparison budget beside the baseline's."""
    by_recording: dict[str, dict[str, Outcome]] = {}
    for o in outcomes:
        by_recording.setdefault(o.recording.label, {})[o.strategy] = o
    rows = []
    for label, group in by_recording.items():
        base = group.get(baseline)
        for name, o in group.items():
            row = {"space": label, "valid": o.valid, "missing": o.recording.missing,
                   "strategy": name, "seeds": len(o.runs)}
            for within in THRESHOLDS:
                row[f"median_{within:g}"] = o.median(within)
                row[f"worst_{within:g}"] = o.worst(within)
            for fraction in BUDGETS:
                n = o.budget(fraction)
                row[f"best_at_{fraction:g}"] = o.best_after(n)
                if base is not None:
                    row[f"{baseline}_at_{fraction:g}"] = base.best_after(n)
            rows.append(row)
    return rows


def must_hold(outcomes: list[Outcome], strategy: str, baseline: str = "random_sample") -> list[str]:
    """What the default strategy must do on every recording (issue 15), as failures found."""
    failures = []
    by_label = {}
    for o in outcomes:
        by_label.setdefault(o.recording.label, {})[o.strategy] = o
    for label, group in by_label.items():
        o = group.get(strategy)
        if o is None:
            continue
        for within, share in ((0.03, 0.10), (0.01, 0.20)):
            median = o.median(within)
            if median is None or median > share * o.valid:
                failures.append(f"{label}: median {_count(median, o.valid)} evaluations to within "
                                f"{within:.0%}, more than {share:.0%} of {o.valid}")
        base = group.get(baseline)
        if base is not None:
            for fraction in BUDGETS:
                n = o.budget(fraction)
                mine, theirs = o.best_after(n), base.best_after(n)
                if mine < theirs or (mine == theirs < 1.0):
                    failures.append(f"{label}: after {n} evaluations {strategy} found "
                                    f"{mine:.1%} of the best, {baseline} {theirs:.1%}")
    return failures


def markdown(rows: list[dict], baseline: str = "random_sample") -> str:
    """The replay table as Markdown, one line per strategy and recording."""
    head = ("| space, shape (valid points) | strategy | evals to 3%: median, worst | "
            "evals to 1%: median, worst | best found at 5% / 10% / 20% of the points | "
            f"{baseline} at the same |")
    lines = [head, "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        valid = r["valid"]
        at = " / ".join(f"{100 * r[f'best_at_{f:g}']:.1f}%" for f in BUDGETS)
        base = (" / ".join(f"{100 * r[f'{baseline}_at_{f:g}']:.1f}%" for f in BUDGETS)
                if f"{baseline}_at_{BUDGETS[0]:g}" in r else "-")
        lines.append(f"| {r['space']} ({valid}) | {r['strategy']} | "
                     f"{_count(r['median_0.03'], valid)}, {_count(r['worst_0.03'], valid)} | "
                     f"{_count(r['median_0.01'], valid)}, {_count(r['worst_0.01'], valid)} | {at} | {base} |")
    return "\n".join(lines) + "\n"


def summary_markdown(rows: list[dict]) -> str:
    """One line per recording, one column per strategy: median (worst) evaluations to within 3%,
    then to within 1%."""
    strategies_seen = list(dict.fromkeys(r["strategy"] for r in rows))
    spaces = list(dict.fromkeys((r["space"], r["valid"]) for r in rows))
    cell = {(r["space"], r["strategy"]): r for r in rows}
    count = lambda v: "never" if v is None else f"{v:g}"  # noqa: E731
    lines = ["| space, shape (valid points) | " + " | ".join(strategies_seen) + " |",
             "| --- |" + " --- |" * len(strategies_seen)]
    for space, valid in spaces:
        cells = []
        for name in strategies_seen:
            r = cell.get((space, name))
            cells.append("-" if r is None else
                         f"{count(r['median_0.03'])} ({count(r['worst_0.03'])}) / "
                         f"{count(r['median_0.01'])} ({count(r['worst_0.01'])})")
        lines.append(f"| {space} ({valid}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
