"""All GPU work in one run: validate every shipped spec, benchmark it beside cuBLAS, record it.

Run by .ci/gpu (which installs the package first) on a machine with a GPU:

    python3 .ci/gpu_suite.py --out $OUT            # everything
    python3 .ci/gpu_suite.py --out $OUT --quick    # small shapes, default layouts, no 8192^3

Writes to --out: check.json, bench.json (with the accuracy records), BENCHMARKS.md (the section
for this run), bench.png and suite.log. A spec that fails to compile, fails a check or crashes is
recorded as such and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemmgen.gpu.bench import run_meta  # noqa: E402
from gemmgen.plan import ARCHS, make_plan  # noqa: E402
from gemmgen.language.load import load  # noqa: E402

LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]


def shipped_specs(names=None):
    specs = []
    for path in sorted((ROOT / "specs").glob("*.gemm")):
        for spec in load(path):
            if spec.is_concrete and (not names or spec.name in names):
                specs.append(spec)
    return specs


def _compile(plan):
    from gemmgen.gpu.compile import compile_plan
    started = time.perf_counter()
    try:
        compile_plan(plan)
        return plan.name, plan.layouts(), None, time.perf_counter() - started
    except Exception as exc:  # noqa: BLE001 - recorded and reported
        return plan.name, plan.layouts(), f"{type(exc).__name__}: {exc}", 0.0


ACCURACY_SHAPE = "4096x4096x4096"
BEST_SIMT = "hopper_simt"  # the simt kernel whose accuracy stands beside the tensor-core ones


def accuracy_specs(specs):
    """The specs whose accuracy the run records: every one that is not simt, and the best simt one."""
    return [s for s in specs if s["math"] != "simt" or s.name == BEST_SIMT]


PROGRESSION = ("naive", "coalesced", "shared_tiles", "blocktile_1d", "uncoalesced_loads", "blocktile_2d",
               "padded_transposed", "staged_epilogue", "vectorized", "bank_swizzle", "warptile", "double_buffer",
               "pingpong_async", "register_fragments", "smallest", "split_k", "hopper_small", "hopper_simt",
               "tensorcore_tf32", "tensorcore_3xtf32", "hopper_tf32", "hopper_3xtf32")


def _summary(spec) -> str:
    """The first comment line of a spec's file: what the spec shows."""
    for line in Path(spec.path).read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").split(":")[0].rstrip(".")
    return ""


def _baseline(r: dict) -> str:
    return r.get("baseline", "cuBLAS FP32")  # records from before baselines followed the math mode


def _peak(r: dict, spec) -> str:
    """% of the FP32 (FFMA) peak; tensor-core kernels are not bound by it."""
    return f"{r['percent_of_peak']:.1f}%" if spec["math"] == "simt" else "tensor cores"


def _error(value) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2e}"  # not measured


def benchmarks_markdown(meta: dict, specs, checks: list, results: list, accuracy: list = ()) -> str:
    """This run's section of BENCHMARKS.md: the seed progression, every shape, accuracy, validation."""
    by = {(r["kernel"].removeprefix("gemmgen_"), r["shape"]): r for r in results}
    shapes = list(dict.fromkeys(r["shape"] for r in results))
    focus = "4096x4096x4096" if "4096x4096x4096" in shapes else shapes[0]
    names = [n for n in PROGRESSION if any(s.name == n for s in specs)]
    names += [s.name for s in specs if s.name not in names]
    lines = [f"## {meta['date'][:10]}: {meta['device']}, driver {meta['driver_full']} "
             f"(CUDA {meta['driver']}), commit {meta['commit']}", "",
             f"Recorded by `bash .ci/gpu` at {meta['date']}. FP32 peak {meta['fp32_peak']:.1f} TFLOP/s "
             f"({meta['sm_count']} SMs x 128 FFMA lanes x 2 x {meta['clock_mhz']:.0f} MHz). cuBLAS is "
             "cublasGemmEx through CuPy on the same buffers in the same process, with the kernel's input "
             "precision: FP32 (CUBLAS_COMPUTE_32F) beside math simt and 3xtf32 kernels, TF32 "
             "(CUBLAS_COMPUTE_32F_FAST_TF32) beside math tf32 ones. Times are medians of CUDA-event-timed "
             "launches, L2 flushed before each; inputs random in [-1, 1]. Relative errors are "
             "||C - C64||_F / ||C64||_F against a float64 product of the same inputs, the kernel's beside "
             "cuBLAS FP32's.", "",
             f"### The seed progression at {focus}", "",
             "| spec | what it shows | ms | TFLOP/s | % of cuBLAS | cuBLAS | % of FP32 peak | rel. error | "
             "cuBLAS FP32 rel. error |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    spec_by_name = {s.name: s for s in specs}
    for name in names:
        r = by.get((name, focus))
        if r:
            lines.append(f"| {name} | {_summary(spec_by_name[name])} | {r['ms']:.3f} | {r['tflops']:.2f} | "
                         f"{r['percent_of_cublas']:.1f}% | {_baseline(r).removeprefix('cuBLAS ')} | "
                         f"{_peak(r, spec_by_name[name])} | {_error(r.get('rel_error'))} | "
                         f"{_error(r.get('cublas_fp32_rel_error'))} |")
    # cuBLAS runs in each kernel's layouts: one row per baseline and layout, named by the layout
    # where a baseline ran in several (cuBLAS FP32 with B row-major is not cuBLAS FP32 with B col).
    baselines = list(dict.fromkeys((_baseline(r), r.get("layout", "")) for r in results))
    several = {b for b, _ in baselines if sum(1 for bb, _ in baselines if bb == b) > 1}
    cublas = {(_baseline(r), r.get("layout", ""), r["shape"]): r["cublas_tflops"] for r in results}
    lines += ["", "### Every spec at every shape: TFLOP/s (% of cuBLAS in the spec's precision)", "",
              "| spec | cuBLAS | " + " | ".join(shapes) + " |", "| --- | --- |" + " ---: |" * len(shapes)]
    for name in names:
        cells, baseline = [], "-"
        for shape in shapes:
            r = by.get((name, shape))
            cells.append(f"{r['tflops']:.2f} ({r['percent_of_cublas']:.0f}%)" if r else "-")
            baseline = _baseline(r).removeprefix("cuBLAS ") if r else baseline
        lines.append(f"| {name} | {baseline} | " + " | ".join(cells) + " |")
    for baseline, layout in baselines:
        label = f"**{baseline}**, {layout}" if baseline in several else f"**{baseline}**"
        lines.append(f"| {label} | | " + " | ".join(
            f"{cublas[baseline, layout, s]:.2f}" if (baseline, layout, s) in cublas else "-"
            for s in shapes) + " |")
    lines += ["", "### Every spec at every shape: relative error (cuBLAS FP32's on the same inputs)", "",
              "| spec | " + " | ".join(shapes) + " |", "| --- |" + " ---: |" * len(shapes)]
    for name in names:
        cells = []
        for shape in shapes:
            r = by.get((name, shape))
            cells.append(f"{_error(r.get('rel_error'))} ({_error(r.get('cublas_fp32_rel_error'))})" if r else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if accuracy:
        lines += ["", f"### Accuracy at {ACCURACY_SHAPE}", "",
                  "Every math mode beside cuBLAS on the same inputs (uniform in [-1, 1]): relative error "
                  "||C - C64||_F / ||C64||_F against float64, and the kernel's in units of cuBLAS FP32's "
                  "(1 = as accurate as FP32).", "",
                  "| spec | math | rel. error | cuBLAS FP32 rel. error | ratio to cuBLAS FP32 | "
                  "cuBLAS TF32 rel. error |",
                  "| --- | --- | ---: | ---: | ---: | ---: |"]
        for a in accuracy:
            name = a["kernel"].removeprefix("gemmgen_")
            if "error" in a:
                lines.append(f"| {name} | {a['math']} | failed: {a['error']} | | | |")
                continue
            lines.append(f"| {name} | {a['math']} | {_error(a['rel_error'])} | "
                         f"{_error(a['cublas_fp32_rel_error'])} | {a['ratio_to_fp32']:.2f} | "
                         f"{_error(a['cublas_tf32_rel_error'])} |")
    passed = sum(1 for c in checks if c["ok"])
    cases = sum(len(c["cases"]) for c in checks)
    lines += ["", "### Validation", "",
              f"{passed} of {len(checks)} kernel x layout combinations passed `gemmgen check` "
              f"({cases} cases in all, float64 reference, output and guard cells poisoned)."]
    for c in checks:
        if not c["ok"]:
            detail = c.get("error") or "; ".join(f"{x['case']}: {x['message']}" for x in c["cases"] if not x["ok"])
            lines.append(f"- FAILED {c['kernel']} [{c['layout']}]: {detail}")
    return "\n".join(lines) + "\n"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return os.environ.get("GEMMGEN_COMMIT", "unknown")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--specs", nargs="*", help="only these kernel names")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--bench-shapes", help="';'-separated cases instead of the defaults")
    parser.add_argument("--budget", type=float, default=0.25)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "suite.log", "a")

    def say(text: str) -> None:
        print(text, flush=True)
        log.write(text + "\n")
        log.flush()

    from gemmgen.gpu import bench as bench_mod
    from gemmgen.gpu import verify
    from gemmgen.gpu.runtime import Kernel, device_info

    info = device_info()
    # This checkout's commit: the gemmgen that runs may be an installed copy of it, outside git.
    meta = {**run_meta(info, os.environ.get("GEMMGEN_COMMIT") or git_commit()), "fp32_peak": info.fp32_peak_tflops(ARCHS[info.target].fp32_lanes_per_sm
                                                                 if info.target in ARCHS else 128)}
    say(f"# {meta}")

    order = {name: i for i, name in enumerate(PROGRESSION)}
    specs = sorted(shipped_specs(args.specs), key=lambda s: (order.get(s.name, len(order)), s.name))
    plans = []
    for spec in specs:
        # TMA copies tiles as they lie and wgmma reads them K-major only, so TMA specs are checked
        # in their own layout; every other spec in all four.
        own_layout_only = args.quick or spec["stages.fill"] == "tma"
        for a, b in ([(spec["layout.A"], spec["layout.B"])] if own_layout_only else LAYOUTS):
            plans.append(make_plan(spec.with_values(layout_A=a, layout_B=b)))
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        compile_errors = {(n, l): e for n, l, e, _ in pool.map(_compile, plans) if e}
    say(f"compiled {len(plans)} kernels in {time.perf_counter() - started:.1f} s; "
        f"{len(compile_errors)} failed")

    cases = verify.QUICK_CASES if args.quick else verify.DEFAULT_CASES
    layout_cases = verify.QUICK_CASES
    problems: dict = {}
    checks = []
    shipped_layout = {spec.name: (spec["layout.A"], spec["layout.B"]) for spec in specs}
    for plan in plans:
        default_layout = (plan.spec["layout.A"], plan.spec["layout.B"]) == shipped_layout[plan.name]
        key = (plan.name, plan.layouts())
        record = {"kernel": plan.name, "layout": plan.layouts(), "ok": False, "cases": []}
        if key in compile_errors:
            record["error"] = compile_errors[key]
            say(f"FAIL {plan.name} [{plan.layouts()}]: compile: {compile_errors[key]}")
            checks.append(record)
            continue
        try:
            kernel = Kernel(plan)
            report = verify.check(kernel, cases if default_layout else layout_cases, problems=problems)
            record["ok"] = report.ok
            record["cases"] = [{"case": str(r.case), "ok": r.ok, "max_relative_error": r.max_relative_error,
                                "worst_ratio": r.worst_ratio, "message": r.message} for r in report.results]
            status = "ok  " if report.ok else "FAIL"
            worst = max((r.max_relative_error for r in report.results), default=0.0)
            say(f"{status} {plan.name:20s} [{plan.layouts()}] {len(report.results)} cases, "
                f"max rel. error {worst:.2e}")
            for failure in report.failures:
                say(f"     {failure.case}: {failure.message}")
        except Exception as exc:  # noqa: BLE001 - a crash is a failed check, and ends CUDA use
            record["error"] = f"{type(exc).__name__}: {exc}"
            say(f"FAIL {plan.name} [{plan.layouts()}]: {record['error']}")
            say(traceback.format_exc())
            checks.append(record)
            break  # a sticky CUDA error poisons the context for the rest of the process
        checks.append(record)
    (out / "check.json").write_text(json.dumps({"meta": meta, "checks": checks}, indent=1))

    results, accuracy = [], []
    if not args.skip_bench:
        shapes = bench_mod.DEFAULT_SHAPES
        if args.bench_shapes:
            shapes = tuple(verify.parse_case(s) for s in args.bench_shapes.split(";"))
        elif args.quick:
            shapes = tuple(c for c in shapes if c.M * c.N * c.K <= 4096 ** 3)
        flusher = bench_mod.L2Flusher(info)
        for spec in specs:
            if not all(c["ok"] for c in checks if c["kernel"] == spec.name):
                say(f"skip bench {spec.name}: it failed its check")
                continue
            kernel = Kernel(make_plan(spec))
            for case in shapes:
                r = bench_mod.bench(kernel, case, info=info, flusher=flusher, budget_s=args.budget)
                results.append(r.as_dict())
                say(f"bench {r.kernel:20s} {r.shape:14s} {r.ms:9.3f} ms {r.tflops:6.2f} TFLOP/s "
                    f"{r.baseline} {r.cublas_tflops:6.2f} ({r.percent_of_cublas:5.1f}%) peak {r.percent_of_peak:5.1f}% "
                    f"rel. error {r.rel_error:.2e} (cuBLAS FP32 {r.cublas_fp32_rel_error:.2e})")
        for spec in accuracy_specs(specs):
            if not all(c["ok"] for c in checks if c["kernel"] == spec.name):
                say(f"skip accuracy {spec.name}: it failed its check")
                continue
            try:
                a = verify.measure_accuracy(Kernel(make_plan(spec)), verify.parse_case(ACCURACY_SHAPE), seed=0)
                accuracy.append(a.as_dict())
                say(f"accuracy {a.kernel:20s} math {a.math:6s} rel. error {a.rel_error:.2e} "
                    f"(cuBLAS FP32 {a.cublas_fp32_rel_error:.2e}, x {a.ratio_to_fp32:.2f}; "
                    f"cuBLAS TF32 {a.cublas_tf32_rel_error:.2e})")
            except Exception as exc:  # noqa: BLE001 - recorded; the benchmarks above are kept
                accuracy.append({"kernel": spec.name, "math": spec["math"], "error": f"{type(exc).__name__}: {exc}"})
                say(f"FAIL accuracy {spec.name}: {accuracy[-1]['error']}")
                say(traceback.format_exc())
                break  # a sticky CUDA error poisons the context for the rest of the process
        (out / "bench.json").write_text(json.dumps({"meta": meta, "results": results, "accuracy": accuracy},
                                                   indent=1))
        if results:
            lanes = make_plan(specs[0]).arch.fp32_lanes_per_sm
            bench_mod.plot([bench_mod.BenchResult(**{**r, "spread_ms": tuple(r["spread_ms"])})
                            for r in results], info, lanes, str(out / "bench.png"))

    if results:
        (out / "BENCHMARKS.md").write_text(benchmarks_markdown(meta, specs, checks, results, accuracy))

    failed = [c for c in checks if not c["ok"]]
    say(f"checks: {len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
