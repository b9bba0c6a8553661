"""Issue 30's must-holds on this machine's GPUs, run by .ci/gpu (GEMMGEN_GPU_PARTS=multigpu):

    python3 .ci/gpu_multigpu.py --out $OUT                 # 2 and 4 GPUs, fp32 library and hopper_simt
    python3 .ci/gpu_multigpu.py --out $OUT --counts 2 --subjects hopper_simt --shapes 8192x8192x8192

For each device count N (those this machine has), each subject (the fp32 library, a LibraryRuntime
per GPU; hopper_simt, a kernel) and each shape (8192^3 and 16384x16384x8192): inputs on GPU 0, the
split end to end and resident shards (bands of A's rows, B on every GPU), each checked against
float64, and timed in turns beside one GPU on the whole problem (multigpu.scaling.measure_scaling),
as a fraction of N x one GPU's throughput. Must: end to end >= 0.85, resident >= 0.95. Then a
batch of 64 of 1024^3 split by batch (multigpu.batched), end to end from GPU 0, for the fp32 and
tf32 libraries' batched entry points (the fp32 one must: >= 0.90 x N).

The links between the GPUs (nvidia-smi topo -m, a peer copy bandwidth matrix) are recorded first.
Writes multigpu.json (links, rows, verdicts) and multigpu.md (the same as tables) to --out; exit 1
if a must fails, a result is wrong or nothing could be measured. A count this machine cannot run is
listed as not run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COUNTS = (2, 4)
SUBJECTS = ("fp32", "hopper_simt")
SHAPES = ((8192, 8192, 8192), (16384, 16384, 8192))
MUST = {"end_to_end": 0.85, "resident": 0.95}
BATCHED = (64, 1024, 1024, 1024)
BATCHED_MUST = 0.90


def subject(name: str, devices: list[int]):
    """(kernels, math): the fp32 library as a LibraryRuntime per device, or a spec's kernel (a Plan)."""
    if name in ("fp32", "tf32"):
        from gemmgen.gpu.verify import UNIT_ROUNDOFF
        from gemmgen.library.dispatch import library
        runtimes = {device: library(name, device) for device in sorted(set(devices))}
        runtimes[devices[0]].compile_all()  # every member into the cubin cache before anything is timed
        math = max((plan.math for plan in runtimes[devices[0]].plans), key=UNIT_ROUNDOFF.__getitem__)
        return runtimes.__getitem__, math
    from gemmgen.language.load import load_one
    from gemmgen.plan import make_plan
    plan = make_plan(load_one(ROOT / "specs" / f"{name}.gemm"))
    return plan, plan.math


def verdict(row: dict) -> dict:
    """The row's must-holds: each scaling against its must, and the check against float64."""
    checks = {f"{what} >= {must:.2f} x N": row[f"{what}_scaling"] >= must for what, must in MUST.items()}
    checks["matches float64"] = row["worst_error_ratio"] <= 1.0
    return checks


def markdown(results: dict) -> str:
    """multigpu.md: who measured where, the rows with their verdicts, what was not run, the links."""
    from gemmgen.multigpu.topology import links_markdown
    meta = results["meta"]
    lines = [f"Measured by `.ci/gpu` (multigpu part) on {meta['machine']}, commit {meta['commit']}, {meta['date']}: "
             "inputs on GPU 0, each result checked against float64; the split end to end (copies included) "
             "and from resident shards, each the host time of a call until C is complete, timed in turns "
             "with one GPU on the whole problem (medians of 3), as a fraction of N x one GPU's TFLOP/s.", "",
             "| subject | GPUs | shape | split | 1 GPU TFLOP/s | end to end TFLOP/s | x N (must 0.85) | "
             "resident TFLOP/s | x N (must 0.95) | float64 check |",
             "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in results["rows"]:
        ok = row["verdict"]
        mark = lambda good: "" if good else " **below**"  # noqa: E731
        lines.append(f"| {row['subject']} | {len(row['devices'])} | {row['shape']} | {row['split']} | "
                     f"{row['one_gpu_tflops']:.1f} | {row['end_to_end_tflops']:.1f} | "
                     f"{row['end_to_end_scaling']:.2f}{mark(ok['end_to_end >= 0.85 x N'])} | "
                     f"{row['resident_tflops']:.1f} | {row['resident_scaling']:.2f}{mark(ok['resident >= 0.95 x N'])} | "
                     f"{'ok' if ok['matches float64'] else 'FAIL (%.2g)' % row['worst_error_ratio']} |")
    lines.append("")
    if results["batched"]:
        batch, M, N, K = BATCHED
        lines += [f"A batch of {batch} of {M}x{N}x{K} split by batch (whole matrices per GPU), end to end from "
                  f"GPU 0, beside one GPU's batched launch on the whole batch:", "",
                  f"| library | GPUs | 1 GPU TFLOP/s | end to end TFLOP/s (sized) | x N (must {BATCHED_MUST:.2f}) | "
                  "matrices per GPU | even parts: x N | moved per GPU (even) | float64 check |",
                  "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |"]
        for row in results["batched"]:
            good = row["verdict"][f"end_to_end >= {BATCHED_MUST:.2f} x N"]
            lines.append(f"| {row['subject']} | {len(row['devices'])} | {row['one_gpu_tflops']:.1f} | "
                         f"{row['end_to_end_tflops']:.1f} | {row['end_to_end_scaling']:.2f}{'' if good else ' **below**'} | "
                         f"{' / '.join(map(str, row['parts']))} | {row['even_scaling']:.2f} | "
                         f"{row['bound']} | {'ok' if row['verdict']['matches float64'] else 'FAIL'} |")
        lines.append("")
    for item in results["not_run"]:
        lines.append(f"- not run: {item}")
    failed = [f"{r['subject']} on {len(r['devices'])} GPUs at "
              f"{r.get('shape') or 'a batch of %d of %dx%dx%d' % (r['batch'], r['M'], r['N'], r['K'])}: {name}"
              for r in results["rows"] + results["batched"] for name, good in r["verdict"].items() if not good]
    lines += ["", f"Must-holds: {'all held' if not failed else 'failed: ' + '; '.join(failed)}"
              + f" ({len(results['rows']) + len(results['batched'])} rows).", "", links_markdown(results["links"])]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out"))
    parser.add_argument("--counts", type=int, nargs="+", default=list(COUNTS))
    parser.add_argument("--subjects", nargs="+", default=list(SUBJECTS))
    parser.add_argument("--shapes", nargs="+", default=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=None, help="blocks each part streams (default: the split's)")
    parser.add_argument("--batched", nargs="*", default=["fp32", "tf32"], metavar="LIBRARY",
                        help="libraries whose batched call is split by batch (none: skip)")
    args = parser.parse_args(argv)
    from gemmgen.gpu.runtime import device_count, device_info
    from gemmgen.multigpu.cupy_layer import CupyLayer
    from gemmgen.multigpu.parts import AXIS_NAMES
    from gemmgen.multigpu.scaling import measure_batched_scaling, measure_scaling, scaling_record
    from gemmgen.multigpu.split import DEFAULT_CHUNKS
    from gemmgen.multigpu.topology import record_links

    args.out.mkdir(parents=True, exist_ok=True)
    available = device_count()
    names = sorted({device_info(d).name for d in range(available)})
    meta = {"machine": f"{available} x {' / '.join(names) or 'no GPU'}", "commit": os.environ.get("GEMMGEN_COMMIT", "unknown"),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    shapes = [tuple(int(x) for x in s.lower().split("x")) for s in args.shapes]
    results = {"meta": meta, "links": record_links(CupyLayer(), list(range(available))), "rows": [],
               "not_run": [], "batched": []}
    chunks = args.chunks or DEFAULT_CHUNKS
    print(json.dumps(results["links"]["peer_bandwidth"]["gbps"]), flush=True)
    for count in args.counts:
        if count > available:
            results["not_run"].append(f"{count} GPUs: this machine has {available}")
            continue
        devices = list(range(count))
        for name in args.subjects:
            kernels, math = subject(name, devices)
            for M, N, K in shapes:
                report, worst = measure_scaling(kernels, M, N, K, devices, runs=args.runs, math=math, chunks=chunks)
                row = {"subject": name, "shape": f"{M}x{N}x{K}", "math": math,
                       "split": AXIS_NAMES[report.split.axis], **scaling_record(report, worst)}
                row["verdict"] = verdict(row)
                results["rows"].append(row)
                print(f"{name} on {count} GPUs at {M}x{N}x{K}: end to end {row['end_to_end_scaling']:.3f} x N, "
                      f"resident {row['resident_scaling']:.3f} x N, error ratio {worst:.2g}: "
                      + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in row["verdict"].items()), flush=True)
        for name in args.batched:
            kernels, math = subject(name, devices)
            batch, M, N, K = BATCHED
            row = {"subject": name, "math": math, **measure_batched_scaling(kernels, batch, M, N, K, devices,
                                                                             runs=args.runs, math=math, chunks=chunks)}
            # What each GPU but the first must receive and send back, in MiB: the bound the links set
            share = batch // count
            row["bound"] = f"{4 * share * (M * K + K * N + M * N) / 2**20:.0f} MiB"
            row["verdict"] = {f"end_to_end >= {BATCHED_MUST:.2f} x N": row["end_to_end_scaling"] >= BATCHED_MUST,
                              "matches float64": row["worst_error_ratio"] <= 1.0}
            results["batched"].append(row)
            print(f"{name} batched {batch} x {M}x{N}x{K} on {count} GPUs: one GPU {row['one_gpu_ms']:.3f} ms, "
                  f"split {row['end_to_end_ms']:.3f} ms: {row['end_to_end_scaling']:.3f} x N, error ratio "
                  f"{row['worst_error_ratio']:.2g}", flush=True)
    (args.out / "multigpu.json").write_text(json.dumps(results, indent=1))
    text = markdown(results)
    (args.out / "multigpu.md").write_text(text)
    print(text, flush=True)
    if not results["rows"]:
        print(f"nothing measured: this machine has {available} GPU(s); the must-holds need 2 or more", flush=True)
        return 1
    return 0 if all(all(r["verdict"].values()) for r in results["rows"] + results["batched"]) else 1


if __name__ == "__main__":
    sys.exit(main())
