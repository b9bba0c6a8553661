"""All GPU work in one run: validate every shipped spec, benchmark it beside cuBLAS, record it.

Run by .ci/gpu (which installs the package first) on a machine with a GPU:

    python3 .ci/gpu_suite.py --out $OUT            # everything
    python3 .ci/gpu_suite.py --out $OUT --quick    # small shapes, default layouts, no 8192^3

Writes to --out: check.json, bench.json, BENCHMARKS.md (the section for this run), bench.png
and suite.log. A spec that fails to compile, fails a check or crashes is recorded as such and
the run goes on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemmgen.plan import make_plan  # noqa: E402
from gemmgen.spec import load  # noqa: E402

LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]


def shipped_specs(names=None):
    specs = []
    for path in sorted((ROOT / "specs").glob("*.gemm")):
        for spec in load(path):
            if spec.is_concrete and (not names or spec.name in names):
                specs.append(spec)
    return specs


def _compile(plan):
    from gemmgen.compile import compile_plan
    started = time.perf_counter()
    try:
        compile_plan(plan)
        return plan.name, plan.layouts(), None, time.perf_counter() - started
    except Exception as exc:  # noqa: BLE001 - recorded and reported
        return plan.name, plan.layouts(), f"{type(exc).__name__}: {exc}", 0.0


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

    from gemmgen import bench as bench_mod
    from gemmgen import verify
    from gemmgen.runtime import Kernel, device_info

    info = device_info()
    commit = os.environ.get("GEMMGEN_COMMIT") or git_commit()
    meta = {"device": info.name, "driver": info.driver_version, "sm_count": info.sm_count,
            "clock_mhz": info.clock_khz / 1000, "commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    say(f"# {meta}")

    specs = shipped_specs(args.specs)
    plans = []
    for spec in specs:
        for a, b in (LAYOUTS if not args.quick else [(spec["layout.A"], spec["layout.B"])]):
            plans.append(make_plan(spec.with_values(layout_A=a, layout_B=b)))
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        compile_errors = {(n, l): e for n, l, e, _ in pool.map(_compile, plans) if e}
    say(f"compiled {len(plans)} kernels in {time.perf_counter() - started:.1f} s; "
        f"{len(compile_errors)} failed")

    cases = verify.QUICK_CASES if args.quick else verify.DEFAULT_CASES
    layout_cases = verify.QUICK_CASES
    problems: dict = {}
    checks = []
    for plan in plans:
        default_layout = (plan.spec["layout.A"], plan.spec["layout.B"]) == (
            next(s for s in specs if s.name == plan.name)["layout.A"],
            next(s for s in specs if s.name == plan.name)["layout.B"])
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

    results = []
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
                    f"cuBLAS {r.cublas_tflops:6.2f} ({r.percent_of_cublas:5.1f}%) peak {r.percent_of_peak:5.1f}%")
        (out / "bench.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
        if results:
            lanes = make_plan(specs[0]).arch.fp32_lanes_per_sm
            bench_mod.plot([bench_mod.BenchResult(**{**r, "spread_ms": tuple(r["spread_ms"])})
                            for r in results], info, lanes, str(out / "bench.png"))

    failed = [c for c in checks if not c["ok"]]
    say(f"checks: {len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
