"""Every candidate of a library timed at a few shapes, beside cuBLAS in the library's precision: where
the library's choice misses, whether a kernel it holds (or could hold) would have won. A diagnosis,
never tuning data: the records go to a database of their own, not the library's.

    export PYTHONPATH=/tmp/site:$PWD GEMMGEN_CACHE=/tmp/gemmgen-cache
    python benchmarks/library_candidates.py tf32 --out candidates.jsonl 5x7000x3000 4096x128x4096

Each candidate is validated and timed as the library's tune times it (measure.py: L2 flushed,
median of CUDA-event timings), and the fastest --top of each shape are printed with their time over
cuBLAS's. The database resumes: a shape or candidate already recorded is not timed again.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gemmgen.gpu.compile import compile_all
from gemmgen.language.shapes import LibraryShape
from gemmgen.library.model import kernel_key
from gemmgen.library.resolve import load_libraries
from gemmgen.library.tune import Jobs
from gemmgen.plan.space import describe
from gemmgen.tuning import database as tuning_db
from gemmgen.tuning.database import CUBLAS_KEY
from gemmgen.tuning.workers import open_runner

ROOT = Path(__file__).resolve().parent.parent


def shape(text: str) -> LibraryShape:
    try:
        M, N, K = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not MxNxK (e.g. 5x7000x3000)") from None
    if min(M, N, K) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': M, N and K must be at least 1")
    return LibraryShape(M, N, K)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("library", choices=["fp32", "tf32"], help="specs/<library>.gemm")
    parser.add_argument("shapes", nargs="+", type=shape, help="MxNxK, one or more")
    parser.add_argument("--out", type=Path, required=True, help="the JSON-lines database of the timings")
    parser.add_argument("--top", type=int, default=12, help="candidates printed per shape (default 12)")
    args = parser.parse_args()

    try:  # a malformed database stops here, before any work
        records = [entry for _, entry in tuning_db.read(args.out)]
    except tuning_db.DatabaseError as error:
        parser.error(str(error))
    done = {(entry["key"], tuning_db.Scope.of(entry).what) for entry in records}
    (library,) = load_libraries(ROOT / "specs" / f"{args.library}.gemm")
    candidates = library.candidates()
    compile_all(candidates)
    jobs = Jobs(library)
    todo = [job for s in args.shapes for job in [jobs.cublas(s)] + [jobs.time(p, s) for p in candidates]
            if (job.key, job.what) not in done]
    if todo:
        with open_runner() as runner:
            runner.run(todo, args.out)
    names = {kernel_key(p): f"{p.spec.name} {describe(p.spec)}" for p in candidates}
    records = [entry for _, entry in tuning_db.read(args.out)]
    for s in args.shapes:
        what = f"{s.M}x{s.N}x{s.K}"
        timed = {entry["key"]: entry["ms"] for entry in records
                 if entry.get("ms") and tuning_db.Scope.of(entry).what == what}
        cublas = timed.pop(CUBLAS_KEY, None)
        print(f"== {what}: {library.baseline} {cublas * 1e3:.1f} us" if cublas else f"== {what}: no cuBLAS time")
        for key, ms in sorted(timed.items(), key=lambda kv: kv[1])[:args.top]:
            ratio = f"{cublas / ms:.2f}x" if cublas else "-"
            print(f"   {ms * 1e3:7.1f} us {ratio:>6}  {names.get(key, key)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
