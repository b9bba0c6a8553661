"""`gemmgen check`: a spec's kernels validated on the GPU against float64 over a matrix of shapes."""

from __future__ import annotations

import json

import click
from rich.table import Table

from ..gpu import runtime, verify
from ..gpu.verify import DEFAULT_CASES, QUICK_CASES, tolerance_rule
from ..outputs import check_outputs, write_output
from . import common
from .common import (SHAPES_HELP, fail, force_option, input_paths, kernel_option, parse_shapes, plans_of, progress_bar,
                     spec_argument)
from .terminal import out as console, say, styled


@click.command()
@spec_argument
@kernel_option
@click.option("--shapes", metavar="CASES", help=SHAPES_HELP + " Default: the full shape matrix.")
@click.option("--quick", is_flag=True, help="Skip the large shapes of the default matrix.")
@click.option("--layouts", metavar="A/B,...", help="Also check these A/B layouts ('all' for the four).")
@click.option("--seed", type=int, help="Random seed for the inputs (default: fresh each run).")
@click.option("--json", "json_path", type=click.Path(), help="Write the results as JSON here.")
@force_option
def check(spec, kernel, shapes, quick, layouts, seed, json_path, force):
    """Validate SPEC on the GPU against a float64 reference.

    Every case uses fresh random inputs, poisons the output and the guard cells around it, and
    checks every element within a tolerance that grows with sqrt(K) and follows the kernel's
    math mode: 16 sqrt(K+1) u (|alpha| |A||B| + |beta| |C|), u = 2^-24 (FP32) for math simt and
    3xtf32, 2^-11 for math tf32 (inputs rounded to TF32). NaN never passes. The default matrix
    covers 1x1x1, primes, sizes below one tile and off the vector width, alpha/beta other than
    (1, 0), padded leading dimensions, misaligned pointers and 4092^3. Each case shows the
    largest error relative to max |C| and the worst element's error over its tolerance (err/tol,
    at most 1 to pass). Exits non-zero on any failure, printing the worst element.

    \b
    Examples:
      gemmgen check specs/warptile.gemm
      gemmgen check specs/warptile.gemm --quick --layouts all
      gemmgen check specs/warptile.gemm --shapes '127x131x137,beta=0.5,pad=3;4096x4096x4096'
    """

    common.require_gpu()
    cases = parse_shapes(shapes, QUICK_CASES if quick else DEFAULT_CASES)
    problems: dict = {}
    failed = False
    records = []
    plans = plans_of(spec, kernel, None, layouts)
    check_outputs(filter(None, [json_path]), inputs=input_paths(spec, [p.spec for p in plans]), force=force)
    rules = "; ".join(tolerance_rule(m) for m in dict.fromkeys(p.spec["math"] for p in plans))
    table = Table(title=f"gemmgen check {spec}\ntolerance {rules}")
    for column in ("kernel", "layout", "case", "result", "max rel. error", "err/tol", "detail"):
        table.add_column(column)
    reports = []
    with progress_bar() as bar:
        task = bar.add_task("checking", total=len(plans) * len(cases))
        for plan in plans:
            bar.update(task, description=f"checking {plan.name} [{plan.layouts()}]")
            reports.append((plan, verify.check(runtime.Kernel(plan), cases, seed=seed, problems=problems,
                                            progress=lambda case: bar.advance(task))))
    for plan, report in reports:
        for result in report.results:
            failed |= not result.ok
            table.add_row(plan.name, plan.layouts(), str(result.case),
                          styled("ok", "green") if result.ok else styled("FAIL", "bold red"),
                          f"{result.max_relative_error:.2e}", f"{result.worst_ratio:.2g}", result.message)
            records.append({"kernel": plan.name, "layout": plan.layouts(), "case": str(result.case),
                            "ok": result.ok, "max_relative_error": result.max_relative_error,
                            "worst_ratio": result.worst_ratio, "message": result.message,
                            "math": plan.spec["math"]})
    console.print(table)
    if json_path:
        write_output(json_path, json.dumps(records, indent=2))
    if failed:
        fail("some cases failed (see the table)")
    say(("all cases passed", "green"))
