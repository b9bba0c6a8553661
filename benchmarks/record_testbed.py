"""Record the test bed's missing exhaustive searches (benchmarks/testbed.json) on this machine's GPU.

For each space of the test bed, the shapes that no database in benchmarks/tuning/ covers (every
valid point of today's space recorded at that shape) are searched with
`gemmgen tune SPACE --strategy exhaustive --shapes ...` into OUT/<date>-<gpu>-testbed-<space>.jsonl.
Copy those files into benchmarks/tuning/, and `gemmgen replay --testbed` replays them.

    python3 benchmarks/record_testbed.py --dry-run      # what would be recorded, and how long
    python3 benchmarks/record_testbed.py --out $OUT     # on the GPU machine (record_testbed.sh)
    python3 benchmarks/record_testbed.py --all          # every space and shape again
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemmgen.tuning.replay import TESTBED, TUNING, load_recording, load_testbed, shape_text  # noqa: E402
from gemmgen.plan.space import expand  # noqa: E402
from gemmgen.language.load import load_one  # noqa: E402

TESTBED, TUNING = ROOT / TESTBED, ROOT / TUNING  # this checkout's, wherever the script runs from

POINTS_PER_SECOND = 2.2  # exhaustive searches on one H100, compiles included (768 points in 357 s at cbec44c)


def missing(everything: bool) -> list[tuple[str, object, list, int]]:
    """(spec path, spec, shapes to record, valid points) per space with something to record."""
    beds, sms = load_testbed(TESTBED)
    dbs = sorted(TUNING.glob("*.jsonl"))
    todo = []
    for bed in beds:
        spec = load_one(str(ROOT / bed.spec))
        space = expand(spec)
        shapes = []
        for shape in bed.shapes:
            try:
                covered = not everything and load_recording(spec, dbs, shape, space, sms).missing == 0
            except LookupError:
                covered = False
            if not covered:
                shapes.append(shape)
        if shapes:
            todo.append((bed.spec, spec, shapes, space.valid))
    return todo


def gpu_tag() -> str:
    from gemmgen.gpu.runtime import device_info
    found = re.search(r"[A-Z]\d{2,3}", device_info().name)
    return found.group(0).lower() if found else "gpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(TUNING), help="folder for the new databases")
    parser.add_argument("--all", action="store_true", help="record every space and shape, covered or not")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and the estimate only")
    args = parser.parse_args()
    todo = missing(args.all)
    points = sum(valid * len(shapes) for _, _, shapes, valid in todo)
    print(f"to record: {points} points, about {points / POINTS_PER_SECOND / 60:.1f} min at "
          f"{POINTS_PER_SECOND:g} points/s")
    date = datetime.date.today().isoformat()
    tag = "gpu" if args.dry_run else gpu_tag()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    failed = 0
    for path, spec, shapes, valid in todo:
        db = Path(args.out) / f"{date}-{tag}-testbed-{spec.name}.jsonl"
        command = [sys.executable, "-m", "gemmgen.cli", "tune", str(ROOT / path), "--strategy", "exhaustive",
                   "--shapes", ";".join(shape_text(s) for s in shapes), "--db", str(db), "--top", "3"]
        print(f"{spec.name}: {valid} points x {len(shapes)} shape(s) -> {db}", flush=True)
        print("  " + " ".join(f"'{c}'" if ";" in c else c for c in command[1:]), flush=True)
        if args.dry_run:
            continue
        started = time.monotonic()
        status = subprocess.run(command, cwd=ROOT).returncode
        print(f"  exit {status} after {time.monotonic() - started:.0f} s", flush=True)
        failed += status != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
