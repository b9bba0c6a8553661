"""Judge the `model` strategy's cost model on recordings it was not fitted on (issue 28).

Recordings: the test bed's, the exhaustive and partial searches of benchmarks/tuning/ outside it
(partial ones are replayed over the points they hold), and the libraries' recordings: at each
shape, the candidates the tf32 / fp32 library timed, as a space whose dimensions are the
candidates' settings. Options of the model strategy given as choices (--choose NAME=V1,V2,...)
are chosen leave-one-recording-out: each recording is replayed with the values that did best on
all the others (gemmgen.tuning.replay.leave_one_out); with none, each is replayed with the
defaults.

    python benchmarks/judge_costmodel.py [--seeds 20] [--jobs 2] [--choose explore=0.5,1,2] [--json out.json]
    python benchmarks/judge_costmodel.py --table out.json     # the Markdown table of a --json run

Run from a checkout's root; prints one line per recording: the options chosen without it, the
model's median (worst) evaluations to within 3% / 1%, and random_sample's; then the bar of issue
28 as a Markdown table: per recording, the budget max(2, 10% of the valid points), the model's
median evaluations to within 3% and random_sample's, and whether the model met it (within the
budget, and fewer evaluations than random_sample's or 1).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this checkout's gemmgen

from gemmgen.gpu.verify import parse_case  # noqa: E402
from gemmgen.language.load import load_one  # noqa: E402
from gemmgen.library.model import kernel_key  # noqa: E402
from gemmgen.library.resolve import load_libraries  # noqa: E402
from gemmgen.plan.space import Space, describe, expand  # noqa: E402
from gemmgen.tuning import database as tuning_db  # noqa: E402
from gemmgen.tuning.replay import THRESHOLDS, Recording, leave_one_out, load_recording, replay  # noqa: E402
from gemmgen.tuning.replay import testbed_recordings  # noqa: E402

TUNING = Path("benchmarks") / "tuning"
# Recordings outside the test bed: (spec, shape, database).
HELD_OUT = [
    ("specs/hopper_pingpong_search.gemm", "4096x4096x512", "2026-11-23-h100-33e07e1-pingpong-search-4096x4096x512.jsonl"),
    ("specs/hopper_search.gemm", "4096x4096x4096", "2026-11-23-h100-live300-6882f1e-hopper_search.jsonl"),
    ("specs/skinny_tc_search.gemm", "127x4099x1023", "2026-11-22-h100-skinny_tc_search-evolution.jsonl"),
    ("specs/skinny_search.gemm", "127x4099x1023", "2026-11-22-h100-skinny_search-evolution.jsonl"),
]
LIBRARIES = [("tf32", "specs/tf32.gemm", "2026-11-23-h100-tf32-library.jsonl"),
             ("fp32", "specs/fp32.gemm", "2026-11-23-h100-fp32-library.jsonl")]


def choices(given: list[str]) -> list[dict]:
    """Every combination of the values of NAME=V1,V2,... (numbers), or the defaults alone."""
    combos: list[dict] = [{}]
    for item in given:
        name, _, values = item.partition("=")
        combos = [{**c, name: float(v)} for c in combos for v in values.split(",")]
    return combos


def library_recordings(name: str, spec: str, db: Path, least: int = 20) -> list[Recording]:
    """A recording per shape (MxNxK, unpadded) at which the library timed `least` candidates or
    more: the candidates as the points of a space, one dimension per setting they name."""
    (library,) = load_libraries(spec, name)
    plans = {kernel_key(p): p for p in library.candidates()}
    by_shape: dict[str, dict[str, float]] = {}
    for _, entry in tuning_db.read(db):
        scope = tuning_db.Scope.of(entry)
        if scope.owner == name and entry["key"] in plans and re.fullmatch(r"\d+x\d+x\d+", scope.what):
            ok = entry.get("status") == "ok"
            by_shape.setdefault(scope.what, {})[entry["key"]] = entry.get("tflops", 0.0) if ok else 0.0
    found = []
    for shape, scores in by_shape.items():
        settings = {k: dict(t.split("=", 1) if "=" in t else (t, "yes") for t in describe(plans[k].spec).split())
                    for k in scores}
        keys = sorted({key for s in settings.values() for key in s})
        coords = {k: tuple(settings[k].get(key, "-") for key in keys) for k in scores}
        if len(scores) < least or max(scores.values()) <= 0 or len(set(coords.values())) < len(coords):
            continue
        dimensions = [sorted({c[i] for c in coords.values()}) for i in range(len(keys))]
        spec = replace(plans[next(iter(scores))].spec, name=f"{name}-library")  # names the recording
        space = Space(spec, keys, dimensions, len(scores), {coords[k]: plans[k] for k in scores})
        found.append(Recording(space, parse_case(shape), f"library {name}", db,
                               {coords[k]: v for k, v in scores.items()}, 0, 0))
    return found


def recordings() -> list[Recording]:
    found, _ = testbed_recordings()
    for spec_path, shape, db in HELD_OUT:
        spec = load_one(spec_path)
        found.append(load_recording(spec, [TUNING / db], parse_case(shape), expand(spec)))
    for name, spec, db in LIBRARIES:
        found += library_recordings(name, spec, TUNING / db)
    return found


def cell(outcome) -> str:
    return " / ".join(f"{outcome.median(w)} ({outcome.worst(w)})" for w in THRESHOLDS)


def bar_table(rows: list[dict]) -> str:
    """The replay bar per recording of a --json run, as Markdown, with the count of those met."""
    lines = ["| recording | valid points | budget | `model` median evals to 3% (worst) | "
             "random_sample median | met |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    met_count = 0
    for row in rows:
        label, valid = re.fullmatch(r"(.*) \((\d+)\)", row["recording"]).groups()
        valid = int(valid)
        budget = max(2, 0.1 * valid)
        (mine, worst), (theirs, _) = row["model"][0], row["random_sample"][0]
        met = mine is not None and mine <= budget and (theirs is None or mine < theirs or mine == 1)
        met_count += met
        show = lambda v: "never" if v is None else f"{v:g}"  # noqa: E731
        lines.append(f"| {label} | {valid} | {budget:g} | {show(mine)} ({show(worst)}) | {show(theirs)} | "
                     f"{'yes' if met else '**no**'} |")
    lines.append(f"\nMet on {met_count} of {len(rows)} recordings.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--choose", action="append", default=[], metavar="NAME=V1,V2")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--table", type=Path, help="print the bar table of an earlier --json run and stop")
    args = parser.parse_args()
    if args.table:
        print(bar_table(json.loads(args.table.read_text())), end="")
        return
    recs = recordings()
    folds = leave_one_out("model", recs, choices(args.choose), args.seeds, args.jobs)
    rows = []
    for fold in folds:
        base = replay("random_sample", fold.recording, args.seeds, jobs=args.jobs)
        label = f"{fold.recording.label} ({fold.recording.space.valid})"
        chosen = " ".join(f"{k}={v:g}" for k, v in fold.options.items()) or "defaults"
        print(f"{label}: {chosen} | model {cell(fold.outcome)} | random_sample {cell(base)}",
              flush=True)
        rows.append({"recording": label, "options": fold.options, "costs": fold.costs,
                     "model": [[fold.outcome.median(w), fold.outcome.worst(w)] for w in THRESHOLDS],
                     "random_sample": [[base.median(w), base.worst(w)] for w in THRESHOLDS]})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(bar_table(rows), end="")


if __name__ == "__main__":
    main()
