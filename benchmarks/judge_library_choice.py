"""Judge a library's choice of member offline, from what its database recorded on a GPU: no GPU needed.

- **Leave-one-out over the tuned shapes.** At each tuned call, the members' models are fitted without
  that call's timings and the member they choose is compared with the fastest member timed there
  (manifest.build_manifest's leave-one-out): the geometric mean of chosen / best, the calls above
  1.05, the worst.
- **Held-out calls** (`--candidates DB`, a database of benchmarks/library_candidates.py: every candidate
  timed at shapes outside the tuning): per call, the chosen member's time, the fastest member's and the
  fastest candidate's, each over cuBLAS's.

    python benchmarks/judge_library_choice.py tf32 [--db benchmarks/tuning/...jsonl]
        [--candidates benchmarks/libraries/2026-11-27-h100-9eacd0e-tf32-candidates.jsonl] [--device "NVIDIA H100 80GB HBM3"]

Without --db, the database generated/<library>.json names (the shipped library's). The members are
chosen from the database as `gemmgen build --from-db` chooses them, so a change of the choice's
arithmetic (gemmgen/library/selection.py) is judged on the library it would build.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this checkout's gemmgen

from gemmgen.language.shapes import LibraryShape  # noqa: E402
from gemmgen.library.manifest import Manifest, build_manifest  # noqa: E402
from gemmgen.library.model import shape_class  # noqa: E402
from gemmgen.library.resolve import load_libraries  # noqa: E402
from gemmgen.library.selection import choose, short_sum_rows  # noqa: E402
from gemmgen.tuning import database as tuning_db  # noqa: E402
from gemmgen.tuning.database import CUBLAS_KEY  # noqa: E402


def geometric_mean(values: list[float]) -> float:
    return math.exp(math.fsum(math.log(v) for v in values) / len(values)) if values else math.nan


def held_out(manifest: Manifest, candidates_db: Path, layouts: dict[str, str]) -> list[dict]:
    """Per call of the candidates' database: cuBLAS's time over the chosen member's, the best
    member's and the best candidate's."""
    timed: dict[str, dict[str, float]] = {}
    for _, entry in tuning_db.read(candidates_db):
        if entry.get("ms"):
            timed.setdefault(tuning_db.Scope.of(entry).what, {})[entry["key"]] = entry["ms"]
    members = manifest.candidates()
    keys = [m.key for m in manifest.members]
    rows = []
    for what, times in timed.items():
        cublas = times.get(CUBLAS_KEY)
        M, N, K = (int(x) for x in what.split("x"))
        shape = LibraryShape(M, N, K)
        chosen = choose(members, M, N, K, shape_class(shape, layouts), manifest.device.sm_count,
                        exact_rows=short_sum_rows(manifest.precision))
        member_times = [times[k] for k in keys if k in times]
        if cublas is None or keys[chosen] not in times or not member_times:
            continue
        rows.append({"shape": what, "chosen": manifest.members[chosen].name,
                     "chosen_x": cublas / times[keys[chosen]], "best_member_x": cublas / min(member_times),
                     "best_candidate_x": cublas / min(v for k, v in times.items() if k != CUBLAS_KEY)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("library", choices=["fp32", "tf32"], help="specs/<library>.gemm")
    parser.add_argument("--db", type=Path, help="the library's tuning database (default: the shipped library's)")
    parser.add_argument("--device", default=None, help="the GPU whose timings count (default: the most timed)")
    parser.add_argument("--candidates", type=Path, help="a database of benchmarks/library_candidates.py")
    args = parser.parse_args()

    (library,) = load_libraries(ROOT / "specs" / f"{args.library}.gemm")
    db = args.db or ROOT / Manifest.read(ROOT / "generated" / f"{args.library}.json").database
    for path in (db, args.candidates):
        if path is not None and not path.is_file():
            parser.error(f"{path}: no such database")
    try:
        manifest = build_manifest(library, db, device=args.device)
        rows = held_out(manifest, args.candidates, library.layouts) if args.candidates else []
    except (tuning_db.DatabaseError, LookupError) as error:
        parser.error(str(error))
    ratios = manifest.leave_one_out.per_shape
    finite = [r for r in ratios.values() if math.isfinite(r)]
    print(f"{args.library} on {manifest.device.name} ({db.name}): leave-one-out over {len(ratios)} tuned calls, "
          f"chosen / best geometric mean {geometric_mean(finite):.4f}, above 1.05 at "
          f"{sum(r > 1.05 for r in ratios.values())}, worst {max(ratios.values()):.3f}")
    for label, ratio in sorted(ratios.items(), key=lambda kv: -kv[1]):
        if ratio > 1.05:
            print(f"   {label:32s} {ratio:.3f}")
    if args.candidates:
        print("held-out calls, x cuBLAS: chosen / best member / best candidate")
        for row in rows:
            print(f"   {row['shape']:20s} {row['chosen']:8s} {row['chosen_x']:.2f} / {row['best_member_x']:.2f} / "
                  f"{row['best_candidate_x']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
