"""`gemmgen tune`: a search space searched at one or more shapes (on this host's GPUs or a Dask
cluster), or a library tuned at its shapes and written."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import click
from rich.table import Table

from ..gpu import runtime
from ..language.load import load_one
from ..library.emit import dispatcher_header_source, dispatcher_source
from ..library.resolve import load_libraries
from ..multigpu.scaling import parse_devices
from ..outputs import check_outputs, write_output
from ..plan.space import expand, to_text
from ..tuning import strategies, tune as search
from ..tuning.database import check_database
from ..tuning.distributed import connect
from ..tuning.measure import search_baseline
from ..tuning.runner import RunnerError
from ..tuning.tune import check_labels, plot_search
from . import common, library as cli_library
from .common import (acts_on_libraries, fail, force_option, input_paths, kernel_option, parse_options, parse_shapes,
                     progress_bar, spec_argument)
from .terminal import line, out as console, say


@click.command()
@spec_argument
@kernel_option
@click.option("--shapes", "shapes_text", default="4096x4096x4096", show_default=True, metavar="CASES",
              help="Problem size(s) to tune for, separated by ';'. Several shapes give one winner each.")
@click.option("--strategy", default="model", show_default=True,
              help="Search strategy, a module of gemmgen/tuning/strategies/: model (the cost model), exhaustive, "
                   "random_sample, or Optuna's tpe, cmaes and gp.")
@click.option("--option", "strategy_options", multiple=True, metavar="NAME=VALUE",
              help="A strategy option, e.g. --option seed=3 --option batch=8 (each strategy's "
                   "options: gemmgen/tuning/strategies/<name>.py, OPTIONS).")
@click.option("--max-points", type=int, metavar="N", help="Evaluate at most N points per shape.")
@click.option("--db", type=click.Path(dir_okay=False), default="tune.jsonl", show_default=True,
              help="Results database (JSON lines); a rerun skips points already measured.")
@click.option("--save", type=click.Path(dir_okay=False), metavar="FILE.gemm",
              help="Write the winner (of the first shape) as a concrete spec.")
@click.option("--dispatcher", type=click.Path(dir_okay=False), metavar="FILE.cu",
              help="Write one .cu with every shape's winner behind one extern \"C\" entry point.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write all records as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="PNG of the explored space: TFLOP/s against each searched setting, cuBLAS as a line.")
@click.option("--top", type=int, default=10, show_default=True, help="Rows in the report table.")
@click.option("--devices", metavar="all|0,1,...",
              help="Evaluate candidates on these GPUs of this host at once: a local Dask cluster, one "
                   "worker per GPU (default: GPU 0, no cluster). Needs gemmgen[distributed].")
@click.option("--scheduler", metavar="ADDRESS",
              help="Evaluate candidates on the GPU workers of this Dask cluster (e.g. tcp://host:8786; "
                   "workers declare --resources GPU=1); the database stays here. Needs gemmgen[distributed].")
@click.option("--output", "-o", type=click.Path(), metavar="PATH",
              help="A library's .cu (file or folder; default generated/<library>.cu).")
@click.option("--manifest", "manifest_path", type=click.Path(dir_okay=False), metavar="FILE.json",
              help="A library's manifest (default: beside its .cu).")
@click.option("--anchors", type=int, default=8, show_default=True,
              help="A library's anchor shapes, where every candidate is timed.")
@click.option("--per-shape", type=int, default=6, show_default=True,
              help="At a library's other shapes, the candidates timed (those predicted fastest).")
@force_option
def tune(spec, kernel, shapes_text, strategy, strategy_options, max_points, db, save, dispatcher,
         json_path, plot_path, top, devices, scheduler, output, manifest_path, anchors, per_shape, force):
    """Search the sets of SPEC for the fastest correct kernel at one or more shapes.

    Impossible points are pruned by the Plan before compiling; the rest compile in parallel
    (cached on disk), are validated on awkward small shapes, and are timed at each shape. A
    candidate that fails to compile, computes wrong results, crashes the GPU or hangs is recorded
    with its reason and skipped; the search goes on. Interrupt it with Ctrl-C and run the same
    command again to resume.

    A library (a `library` block; `gemmgen tune specs/fp32.gemm`) is tuned at its own shapes:
    every candidate kernel of its members is validated once and timed at a few anchor shapes, the
    candidates its model predicts fastest at the rest, and the members it keeps at all of them,
    cuBLAS in its precision beside; then its .cu (one entry point) and manifest are written, with
    the leave-one-out quality of its choice of member.

    \b
    Examples:
      gemmgen tune specs/hopper_search.gemm --max-points 120
      gemmgen tune specs/warptile_search.gemm --shapes '1024x1024x1024;4096x4096x4096' \\
          --dispatcher generated/warptile_tuned.cu
      gemmgen tune specs/small_search.gemm --strategy tpe --option seed=1 --max-points 60
      gemmgen tune specs/fp32.gemm --db fp32.jsonl        # a library
    """

    try:
        strategies.get(strategy)  # unknown, or its library is missing: said before any GPU work
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--strategy") from None
    if scheduler and devices:
        raise click.BadParameter("a cluster's workers choose their GPUs: give --devices for a local "
                                 "cluster, or --scheduler for one started already", param_hint="--devices")
    if acts_on_libraries(spec, kernel):
        libraries = load_libraries(spec, kernel)
        check_database(db, inputs=[spec])
        for library in libraries:
            cli_library.check(library, output, manifest_path, inputs=input_paths(spec, [], db), force=force)
        check_outputs(filter(None, [json_path, plot_path]), inputs=input_paths(spec, [], db), force=force)
        if not scheduler:  # with a scheduler, the GPUs are the workers', and this host may have none
            common.require_gpu()
        scheduler, device_list = _workers(scheduler, devices)
        client = _cluster(scheduler, device_list) if scheduler else None
        for library in libraries:
            try:
                cli_library.tune(library, db=Path(db), output=output, manifest_path=manifest_path,
                                 strategy=strategy, options=parse_options(strategy_options),
                                 max_points=max_points, anchors=anchors, per_shape=per_shape,
                                 progress_factory=lambda: progress_bar(console, transient=False),
                                 console=console, write_file=write_output, json_path=json_path,
                                 plot_path=plot_path, scheduler=client)
            except RunnerError as exc:
                fail(str(exc))
        return
    if not scheduler:
        common.require_gpu()
    shapes = parse_shapes(shapes_text, None)
    scheduler, device_list = _workers(scheduler, devices)
    space_spec = load_one(spec, kernel)
    plot_paths = {shape: plot_path if len(shapes) == 1 else
                  str(Path(plot_path).with_suffix("")) + f"_{shape.M}x{shape.N}x{shape.K}.png"
                  for shape in shapes} if plot_path else {}
    # Before the search, not after it: a refused output costs nothing yet. The database is an input.
    dispatcher_header = Path(dispatcher).with_suffix(".h") if dispatcher else None
    check_outputs(filter(None, [save, dispatcher, dispatcher_header, json_path, *plot_paths.values()]),
                  inputs=input_paths(spec, [space_spec], db), force=force)
    check_database(db, inputs=input_paths(spec, [space_spec]))  # appended to, never replaced
    space = expand(space_spec)
    check_labels(Path(db), space)  # the records a search resumes from name their points
    pruned = ", ".join(f"{n} {why}" for why, n in space.pruned.most_common(4))
    console.print(f"{space_spec.name}: {space.total} points, {space.valid} valid after pruning"
                  + (f" (dropped: {pruned})" if pruned else ""))
    if space.valid:
        search_baseline(space)  # one precision per search: a SpecError before any GPU work
    options = parse_options(strategy_options)
    winners = []
    all_records = []
    if scheduler:
        scheduler = _cluster(scheduler, device_list)
    for shape in shapes:
        total = min(space.valid, max_points or space.valid)
        best = {"tflops": 0.0, "point": ""}
        with progress_bar(console, transient=False) as bar:  # stays, with the best found
            task = bar.add_task(f"{shape}", total=total)

            def progress(entry, bar=bar, task=task, best=best, shape=shape):
                if entry.get("key") == "cublas":
                    return
                bar.advance(task)
                if entry.get("status") == "ok" and entry["tflops"] > best["tflops"]:
                    best.update(entry)
                elif entry.get("status") != "ok":
                    bar.console.print(line("  ", (entry["status"], "yellow"), f" {entry['point']}: "
                                           f"{entry.get('reason', '')[:160]}"), soft_wrap=True)
                bar.update(task, description=f"{shape}  best {best['tflops']:.2f} TFLOP/s")

            try:
                result = search.tune(space_spec, shape, strategy=strategy, options=options,
                                  max_points=max_points, db=Path(db), progress=progress,
                                  devices=device_list, scheduler=scheduler)
            except RunnerError as exc:
                fail(str(exc))
        all_records += result.records
        good = sorted((r for r in result.records if r.get("status") == "ok"), key=lambda r: -r["tflops"])
        gpus = result.gpus
        rate = result.evaluated / result.seconds if result.seconds else 0.0
        table = Table(title=f"{space_spec.name} at {shape}: {len(result.records)} measured of "
                            f"{space.valid} valid, {strategy}; {result.evaluated} evaluated in "
                            f"{result.seconds:.0f} s on {gpus} GPU(s) ({rate:.2f} points/s); "
                            f"{result.baseline} {result.cublas_tflops:.2f} TFLOP/s")
        for column in ("rank", "TFLOP/s", "% cuBLAS", "ms", "point"):
            table.add_column(column)
        for rank, r in enumerate(good[:top], 1):
            share = f"{100 * r['tflops'] / result.cublas_tflops:.0f}%" if result.cublas_tflops else "-"
            table.add_row(str(rank), f"{r['tflops']:.2f}", share, f"{r['ms']:.3f}", r["point"])
        console.print(table)
        if result.failures:
            kinds = sorted({r["status"] for r in result.failures})
            console.print(f"{len(result.failures)} candidate(s) failed: " +
                          ", ".join(f"{k} {sum(r['status'] == k for r in result.failures)}" for k in kinds))
        if result.best_plan is None:
            fail(f"no candidate passed validation at {shape}")
        winners.append((shape, result.best_plan, result.best))
        if plot_path:
            plot_search(result, plot_paths[shape])
            say(f"wrote {plot_paths[shape]}")
    if save:
        shape, plan, best = winners[0]
        write_output(save, to_text(plan.spec, Path(save).stem,
                                   f"Found by gemmgen tune {spec} at {shape}: {best['tflops']:.2f} TFLOP/s."))
        say(f"wrote {save}")
    if dispatcher:
        tuned = [(s, p) for s, p, _ in winners]
        write_output(dispatcher, dispatcher_source(space_spec.name, tuned))
        write_output(dispatcher_header, dispatcher_header_source(space_spec.name, tuned, Path(dispatcher).name))
        say(f"wrote {dispatcher} and {dispatcher_header.name}")
    if json_path:
        write_output(json_path, json.dumps(all_records, indent=1))


def _cluster(scheduler, devices):
    """One Dask client for the whole command (every shape, every library), closed when it ends."""
    cluster = contextlib.ExitStack()
    click.get_current_context().call_on_close(cluster.close)
    try:
        return cluster.enter_context(connect(scheduler, devices))
    except RunnerError as exc:
        fail(str(exc))


def _workers(scheduler: str | None, devices: str | None) -> tuple[str | None, list[int] | None]:
    """--scheduler, or --devices as a local cluster over those GPUs: (scheduler, devices)."""
    if not devices:
        return scheduler, None
    try:
        return "local", parse_devices(devices, runtime.device_count())
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--devices") from None
