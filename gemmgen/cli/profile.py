"""`gemmgen profile`: Nsight Compute on one launch of a kernel (gemmgen.gpu.profile), its counters
shown as a table with what each means."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.table import Table

from ..gpu import profile as gpu_profile
from ..gpu.profile import DEFAULT_SHAPE, METRICS, STALL_REASONS, ProfileError
from ..gpu.verify import parse_case
from ..language.errors import SpecError
from . import common, terminal


def _show(value: Any, kind: str) -> str:
    if value is None:
        return "n/a"
    if not isinstance(value, (int, float)):
        return str(value)
    if kind == "pct":
        return f"{value:.1f} %"
    if kind == "count":
        return f"{value:,.0f}"
    if kind == "time":
        return f"{value / 1e3:.3f} ms" if value >= 1e3 else f"{value:.1f} µs"
    return f"{value:g}"


def render_table(report: dict[str, Any]):
    """A rich Table: metric, value, what it means."""
    title = f"{report['kernel']} at {report['shape']}"
    if report.get("block") or report.get("grid"):
        title += f" (block {report['block']}, grid {report['grid']})"
    table = Table(title=title)
    for column in ("metric", "value", "meaning"):
        table.add_column(column, overflow="fold")
    metrics, derived = report["metrics"], report["derived"]
    for metric in METRICS:
        table.add_row(metric.label, _show(metrics.get(metric.key), metric.kind), metric.meaning)
        if metric.key == "duration_us" and "tflops" in derived:
            table.add_row("throughput", f"{derived['tflops']:.2f} TFLOP/s", "2*M*N*K / duration")
        if metric.key == "smem_store_wavefronts":
            for op in ("load", "store"):
                if f"smem_{op}_conflict_pct" in derived:
                    table.add_row(f"shared {op} conflict share",
                                  f"{derived[f'smem_{op}_conflict_pct']:.1f} %",
                                  f"bank conflicts / wavefronts of shared {op}s")
    # Stall reasons: warps stalled for the reason, on average, per instruction issued.
    for reason, value in report["stalls"].items():
        table.add_row(f"stall: {reason}", f"{value:.2f} warps/inst", STALL_REASONS[reason])
    if report.get("unavailable"):
        table.add_row("not collected", ", ".join(report["unavailable"]), "unknown to this ncu or GPU")
    return table


@click.command("profile")
@click.argument("spec", type=click.Path(exists=True, dir_okay=False))
@click.option("--kernel", "-k", metavar="NAME", help="Only this kernel of a file that defines several.")
@click.option("--shape", default=DEFAULT_SHAPE, show_default=True, metavar="MxNxK",
              help="Problem size, with optional ,alpha=,beta=,pad=,offset= (e.g. 4096x4096x4096,beta=0.5).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def profile_command(spec, kernel, shape, as_json):
    """Profile one launch of SPEC with Nsight Compute (needs a GPU and `ncu`).

    Runs the kernel once to warm up, then once under ncu at the GPU's own clocks, and reports
    what the seed worklogs looked at: FP32 pipe utilisation, SM and DRAM throughput, achieved
    occupancy, registers per thread, shared-memory bank conflicts and wavefronts, global load
    efficiency, duration, and the warp stall reasons, largest first.

    \b
    Examples:
      gemmgen profile specs/warptile.gemm
      gemmgen profile specs/naive.gemm --shape 1024x1024x1024 --json
    """

    common.require_gpu()  # first: without a GPU nothing else matters (exit 2, as check, bench, tune)
    try:
        parse_case(shape)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--shape") from None
    try:
        report = gpu_profile.profile(spec, kernel, shape)
    except SpecError as exc:
        terminal.err.print(str(exc), soft_wrap=True)
        sys.exit(1)
    except ProfileError as exc:
        terminal.error(str(exc))
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        terminal.out.print(render_table(report))
