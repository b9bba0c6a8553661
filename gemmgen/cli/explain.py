"""`gemmgen explain`: the static report of a spec's kernels, or a library's members and shapes."""

from __future__ import annotations

import json

import click

from ..explain.report import as_dict, explain_all, kernels_to_explain, render_text
from ..library.resolve import load_libraries
from ..plan import make_plan
from . import library as cli_library
from .common import acts_on_libraries, kernel_option, late_progress, load_specs, spec_argument, target_option
from .terminal import err as errors, out as console


@click.command()
@spec_argument
@kernel_option
@target_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def explain(spec, kernel, target, as_json):
    """Static report of SPEC, no GPU needed.

    Threads and warps, registers and spills (from compiling it), shared memory, occupancy per SM
    and which limit binds it, arithmetic intensity of global and shared traffic, and the bank
    conflicts each shared-memory access pattern will cause.

    For a library: its members, how many kernels each gives, which run on every GPU, its shapes,
    and (once tuned) the members its manifest keeps.

    \b
    Examples:
      gemmgen explain specs/warptile.gemm
      gemmgen explain specs/warptile.gemm --target sm_80 --json
      gemmgen explain specs/fp32.gemm          # a library
    """

    if acts_on_libraries(spec, kernel):
        summaries = [cli_library.summary(library) for library in load_libraries(spec, kernel)]
        if as_json:
            console.print_json(json.dumps(summaries))
        else:
            for summary in summaries:
                console.print(cli_library.render_summary(summary), soft_wrap=True)
        return
    specs, notes = kernels_to_explain(load_specs(spec, kernel, target), named=kernel is not None)
    for note in notes:
        errors.print(note, markup=False, soft_wrap=True)
    plans = [make_plan(s) for s in specs]
    with late_progress("explaining", len(plans)) as progress:
        reports = explain_all(plans, progress)
    if as_json:
        console.print_json(json.dumps([as_dict(r) for r in reports]))
    else:
        for report in reports:
            console.print(render_text(report))
