"""Where a rebuilt library manifest chooses another member than an earlier one, and what that does: the
calls of the libraries' bench (specs/library_shapes.txt and benchmarks/library_heldout.txt, single GEMMs)
whose choice differs between the manifest at a git revision and the working tree's, then on a GPU the
old and new members and cuBLAS in the library's precision at each, one call after an L2 flush, in turns.

    python benchmarks/refit_choices.py list --old REV CHANGED.json [--shapes FILE]   # no GPU (needs git)
    python benchmarks/refit_choices.py time CHANGED.json OUT.json        # on the GPU

Recorded: benchmarks/libraries/2026-11-26-h100-4a261f6-refit-choices.json (BENCHMARKS.md's run log)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROW_COL = {"A": "row", "B": "col", "C": "row"}


def changed_choices(old_rev: str, shape_files: list[Path] | None = None) -> dict[str, list[dict]]:
    """{library: [{shape, old, new}]} where the working tree's manifest chooses another member, at the
    libraries' bench shapes or at those of `shape_files` (specs/library_shapes.txt's format)."""
    from gemmgen.language.shapes import parse_shapes
    from gemmgen.library.manifest import Manifest
    from gemmgen.library.selection import alignment_class, choose, short_sum_rows, tight_leading_dimensions

    shapes = []
    for path in shape_files or (ROOT / "specs" / "library_shapes.txt", ROOT / "benchmarks" / "library_heldout.txt"):
        shapes += [s for s in parse_shapes(path.read_text(), str(path)) if s.batch == 1]
    found = {}
    for library in ("tf32", "fp32"):
        text = subprocess.run(["git", "show", f"{old_rev}:generated/{library}.json"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
        old, new = Manifest.from_json(text, library), Manifest.read(ROOT / "generated" / f"{library}.json")
        if [m.key for m in old.members] != [m.key for m in new.members]:
            sys.exit(f"error: {library}'s members differ between {old_rev} and the working tree; time them in the "
                     "libraries' bench instead")
        rows = []
        for s in shapes:
            lds = tight_leading_dimensions(s.M, s.N, s.K, ROW_COL, s.pad)
            klass = alignment_class(*lds)
            a = choose(old.candidates(), s.M, s.N, s.K, klass, old.device.sm_count,
                       exact_rows=short_sum_rows(old.precision))
            b = choose(new.candidates(), s.M, s.N, s.K, klass, new.device.sm_count,
                       exact_rows=short_sum_rows(new.precision))
            if a != b:
                rows.append({"shape": f"{s.M}x{s.N}x{s.K}", "pad": s.pad, "old": old.members[a].name,
                             "new": new.members[b].name})
        found[library] = rows
    return found


def time_choices(changed: dict[str, list[dict]]) -> dict:
    import torch

    import gemmgen.library.dispatch as dispatch
    from gemmgen.gpu import bench as gpu_bench
    from gemmgen.gpu.baseline import cublas_gemm
    from gemmgen.gpu.runtime import device_info
    from torch_records import meta

    flusher = gpu_bench.L2Flusher(device_info(0))
    stream = torch.cuda.current_stream().cuda_stream
    results = []
    for library, rows in changed.items():
        runtime = dispatch.library(library, 0)
        runtime.compile_all()
        names = [m.name for m in runtime.manifest.members]
        for row in rows:
            M, N, K = map(int, row["shape"].split("x"))
            lda, ldb, ldc = K + row["pad"], K + row["pad"], N + row["pad"]
            a, b = torch.rand(M, lda, device="cuda"), torch.rand(N, ldb, device="cuda")
            c = torch.empty(M, ldc, device="cuda")
            abi = (a.data_ptr(), lda, b.data_ptr(), ldb, 0.0, c.data_ptr(), ldc)
            old, new = runtime.kernel(names.index(row["old"])), runtime.kernel(names.index(row["new"]))
            ways = {"old": lambda: old.launch(M, N, K, 1.0, *abi, stream=stream),
                    "new": lambda: new.launch(M, N, K, 1.0, *abi, stream=stream),
                    "cuBLAS": lambda: cublas_gemm(M, N, K, 1.0, *abi, ROW_COL, tf32=library == "tf32")}
            timings = gpu_bench.time_alternating(list(ways.values()), flush=flusher, budget_s=0.3)
            ms = {way: t.median_ms for way, t in zip(ways, timings)}
            results.append({"library": library, **row, "ms": ms, "new_over_old": ms["new"] / ms["old"]})
            print(f"{library} {row['shape']}{' ld+%d' % row['pad'] if row['pad'] else ''}: {row['old']} "
                  f"{ms['old'] * 1e3:.1f} us (x cuBLAS {ms['cuBLAS'] / ms['old']:.2f}) -> {row['new']} "
                  f"{ms['new'] * 1e3:.1f} us (x cuBLAS {ms['cuBLAS'] / ms['new']:.2f})", flush=True)
    return {"meta": meta(None, torch.device("cuda")), "results": results}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="the calls whose choice changed (no GPU; needs git)")
    listing.add_argument("--old", required=True, help="the git revision of the earlier manifests")
    listing.add_argument("changed", help="the JSON to write")
    listing.add_argument("--shapes", nargs="+", type=Path, help="shape files to judge at (default: the libraries' bench's)")
    timing = verbs.add_parser("time", help="time the old and new members at those calls (GPU)")
    timing.add_argument("changed", help="the JSON `list` wrote")
    timing.add_argument("out", help="the record to write")
    args = parser.parse_args(argv)
    from torch_records import refuse_to_overwrite, write_record
    if args.verb == "list":
        refuse_to_overwrite(args.changed, False)
        found = changed_choices(args.old, args.shapes)
        write_record(args.changed, {"old": args.old, "changed": found})
        for library, rows in found.items():
            print(f"{library}: {len(rows)} calls choose another member", *(f"  {r}" for r in rows), sep="\n")
        return
    refuse_to_overwrite(args.out, False)
    changed = json.loads(Path(args.changed).read_text())["changed"]
    write_record(args.out, time_choices(changed))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
