"""The libraries' GPU work, run by .ci/gpu: tune them, or bench them beside cuBLAS.

    python3 .ci/gpu_libraries.py tune  --out $OUT fp32 tf32   # gemmgen tune specs/<lib>.gemm
    python3 .ci/gpu_libraries.py bench --out $OUT fp32 tf32   # tuned and held-out shapes

tune resumes from the library's database in benchmarks/tuning/ when there is one (copied to $OUT
first) and leaves in $OUT the database (<lib>.jsonl) and a plot; the .cu and manifest are rebuilt
from the database on the developer's machine (`gemmgen build specs/<lib>.gemm --from-db ...`), so
that the files coming back stay few. bench times the library's committed manifest
(generated/<lib>.json) at specs/library_shapes.txt and benchmarks/library_heldout.txt in one run,
kernel and cuBLAS in turns, and writes library-bench.json, a plot per library and the log.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _shapes(path: Path):
    """A shapes file's single GEMMs (specs/library_shapes.txt's format) as bench cases (its batches
    are benchmarks/torch_batched.py's)."""
    from gemmgen.language.shapes import parse_shapes
    from gemmgen.gpu.verify import Case
    return [Case(s.M, s.N, s.K, pad=s.pad) for s in parse_shapes(path.read_text(), str(path)) if s.batch == 1]


def tune(libraries: list[str], out: Path) -> int:
    status = 0
    for name in libraries:
        db = out / f"{name}.jsonl"
        previous = sorted((ROOT / "benchmarks" / "tuning").glob(f"*-{name}-library.jsonl"))
        if previous and not db.exists():
            shutil.copy(previous[-1], db)
            print(f"resuming from {previous[-1].name}", flush=True)
        with tempfile.TemporaryDirectory() as scratch:
            command = ["gemmgen", "tune", str(ROOT / "specs" / f"{name}.gemm"), "--db", str(db),
                       "-o", str(Path(scratch) / f"{name}.cu"), "--plot", str(out / f"{name}-tuned.png")]
            print("$ " + " ".join(command), flush=True)
            status |= subprocess.run(command).returncode
    return status


def bench(libraries: list[str], out: Path) -> int:
    from gemmgen.cli import library as cli_library
    from gemmgen.gpu.bench import plot_library
    from gemmgen.library.manifest import Manifest
    from gemmgen.library.resolve import load_libraries
    from gemmgen.gpu.runtime import device_info
    from rich.console import Console

    console = Console(width=160)
    info = device_info()
    tuned = _shapes(ROOT / "specs" / "library_shapes.txt")
    heldout = _shapes(ROOT / "benchmarks" / "library_heldout.txt")
    meta = {"device": info.name, "driver": info.driver_version,
            "commit": os.environ.get("GEMMGEN_COMMIT", "unknown"),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    results = {"meta": meta, "libraries": {}}
    for name in libraries:
        (library,) = load_libraries(ROOT / "specs" / f"{name}.gemm")
        manifest = Manifest.read(ROOT / "generated" / f"{name}.json")
        rows = cli_library.bench(library, manifest, tuned + heldout, budget=0.3, console=console,
                                 progress_factory=nullcontext_progress)
        heldout_keys = {f"{c.M}x{c.N}x{c.K}" + (f" ld+{c.pad}" if c.pad else "") for c in heldout}
        for row in rows:
            row["heldout"] = row["shape"] in heldout_keys
        results["libraries"][name] = rows
        plot_library([{"shape": r["shape"], "ratio": r["cublas_ms"] / r["ms"], "member": r["member"],
                       "tuned": not r["heldout"]} for r in rows], manifest.baseline,
                     f"gemmgen_{name} on {info.name}, {meta['date']}", str(out / f"library-{name}.png"))
        speedups = [r["cublas_ms"] / r["ms"] for r in rows]
        console.print(f"{name}: geometric mean {math.exp(sum(map(math.log, speedups)) / len(speedups)):.3f}x "
                      f"over {len(rows)} shapes ({sum(r['heldout'] for r in rows)} held out)")
    (out / "library-bench.json").write_text(json.dumps(results, indent=1))
    (out / "LIBRARIES.md").write_text(markdown(results))
    return 0


MUST = {"fp32": 1.05, "tf32": 0.95}  # x cuBLAS in the library's precision, where cuBLAS takes >= 20 us


def markdown(results: dict) -> str:
    """BENCHMARKS.md's summary of a library bench: per shape, each library's member and speed beside
    cuBLAS in its precision, its error beside cuBLAS FP32's; then the must-holds, as measured."""
    meta, libraries = results["meta"], results["libraries"]
    names = list(libraries)
    shapes = list(dict.fromkeys(r["shape"] for rows in libraries.values() for r in rows))
    by = {(name, r["shape"]): r for name, rows in libraries.items() for r in rows}
    lines = [f"Measured by `.ci/gpu` (libraries part) on {meta['device']}, driver {meta['driver']}, commit "
             f"{meta['commit']}, {meta['date']}: each shape timed in turns with cuBLAS in the library's "
             "precision (median of CUDA-event timings, L2 flushed), through gemmgen.matmul's choice of "
             "member; relative errors ||C - C64||_F / ||C64||_F on the bench's inputs.", "",
             "| shape | tuned at | " + " | ".join(f"{n} member | {n} x cuBLAS {n.upper() if n == 'tf32' else 'FP32'} | "
                                                  f"{n} rel. error (cuBLAS FP32's)" for n in names) + " |",
             "| --- | --- | " + " | ".join("--- | ---: | ---:" for _ in names) + " |"]
    for shape in shapes:
        cells = [shape, "yes" if not by[(names[0], shape)]["heldout"] else "held out"]
        for name in names:
            r = by.get((name, shape))
            if r is None:
                cells += ["", "", ""]
                continue
            ratio = r["cublas_ms"] / r["ms"]
            mark = "" if r["cublas_ms"] < 0.020 or ratio >= MUST[name] else " (below)"
            cells += [r["member"], f"{ratio:.2f}{mark}", f"{r['rel_error']:.2e} ({r['cublas_fp32_rel_error']:.2e})"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for name in names:
        rows = libraries[name]
        ratios = [r["cublas_ms"] / r["ms"] for r in rows]
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        counted = [r for r in rows if r["cublas_ms"] >= 0.020]
        below = [r["shape"] for r in counted if r["cublas_ms"] / r["ms"] < MUST[name]]
        line = (f"- **{name}**: geometric mean {geo:.2f}x over {len(rows)} shapes "
                f"({sum(r['heldout'] for r in rows)} held out); {len(counted) - len(below)} of {len(counted)} shapes "
                f"where cuBLAS takes >= 20 us at >= {MUST[name]:.2f}x" + (f" (below: {', '.join(below)})" if below else ""))
        if name == "fp32":
            worse = [r["shape"] for r in rows if r["rel_error"] > r["cublas_fp32_rel_error"]]
            line += (f"; relative error at most cuBLAS FP32's at {len(rows) - len(worse)} of {len(rows)} shapes"
                     + (f" (above it: {', '.join(worse)})" if worse else ""))
        lines.append(line + ".")
    return "\n".join(lines) + "\n"


class nullcontext_progress:
    """A stand-in for the CLI's progress bar in a log: prints each step on its own line."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, description, total=None):
        return 0

    def update(self, task, description=None, **kwargs):
        if description:
            print(description, flush=True)

    def advance(self, task, amount=1):
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("tune", "bench", "markdown"))
    parser.add_argument("libraries", nargs="*", default=["fp32", "tf32"])
    parser.add_argument("--out", required=True, help="output folder (markdown: the bench's JSON file)")
    args = parser.parse_intermixed_args()
    if args.what == "markdown":  # the summary of a recorded bench, for BENCHMARKS.md
        print(markdown(json.loads(Path(args.out).read_text())), end="")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return (tune if args.what == "tune" else bench)(args.libraries, out)


if __name__ == "__main__":
    sys.exit(main())
