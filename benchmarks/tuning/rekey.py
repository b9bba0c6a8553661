"""Carry a tuning database recorded at an older commit over to today's point keys.

A point's key hashes every setting of its concrete spec (gemmgen/plan/space.py: point_key), so a new
setting in the language, or a spec line spelled differently (`stages {2, 3}` becoming
`stages {2, 3} tma` for the same kernels), changes the keys of points that did not change.
This script expands SPACE with the code of COMMIT (from `git archive`, in a temporary folder) and
with today's code, matches the points by their coordinates (the values of the spec's sets, which
must be the same at both commits), and writes the records of DB with today's keys to OUT, each
keeping its old key as `recorded_key`. Records of points that today's Plan rejects, or that no
point of COMMIT's space had, are left out and counted.

    python3 benchmarks/tuning/rekey.py specs/hopper_refine.gemm 90a1a17 \\
        benchmarks/tuning/2026-11-22-h100-hopper_refine-exhaustive.jsonl \\
        benchmarks/tuning/2026-11-22-h100-hopper_refine-exhaustive-rekeyed.jsonl
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

KEYS_BY_COORDS = """
import json, sys
sys.path.insert(0, '.')
from gemmgen.language.load import load_one
from gemmgen.plan.space import expand, point_key
space = expand(load_one(sys.argv[1]))
print(json.dumps({"keys": space.keys,
                  "points": [[list(c), point_key(p.spec)] for c, p in space.plan_at.items()]}))
"""


def keys_by_coords(tree: Path, spec: str) -> tuple[list[str], dict[tuple, str]]:
    out = subprocess.run([sys.executable, "-c", KEYS_BY_COORDS, spec], cwd=tree, check=True,
                         capture_output=True, text=True).stdout
    data = json.loads(out)
    return data["keys"], {tuple(c): k for c, k in data["points"]}


def main(spec: str, commit: str, db: str, out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", commit, "gemmgen", "specs"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        old_dims, old = keys_by_coords(Path(tmp), spec)
    new_dims, new = keys_by_coords(ROOT, spec)
    if old_dims != new_dims:
        sys.exit(f"{spec} searches {old_dims} at {commit} but {new_dims} today: coordinates differ")
    today = {old[c]: new[c] for c in old.keys() & new.keys()}
    kept, dropped = [], 0
    for line in Path(db).read_text().splitlines():
        entry = json.loads(line)
        if entry["key"] == "cublas":
            kept.append(entry)
        elif entry["key"] in today:
            kept.append({**entry, "key": today[entry["key"]], "recorded_key": entry["key"]})
        else:
            dropped += 1
    Path(out).write_text("".join(json.dumps(e) + "\n" for e in kept))
    print(f"{out}: {len(kept)} records with today's keys; {dropped} left out (no point of today's space)")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
