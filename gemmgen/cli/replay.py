"""`gemmgen replay`: search strategies replayed against recorded exhaustive searches, with no GPU."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from ..gpu.verify import parse_case
from ..language.load import load_one
from ..outputs import check_outputs, markdown_marker, write_output
from ..tuning import replay as rp, strategies
from .common import fail, force_option, kernel_option, parse_options, progress_bar
from .terminal import out as console, say


@click.command()
@click.argument("spec", required=False, type=click.Path(exists=True, dir_okay=False))
@kernel_option
@click.option("--db", "dbs", multiple=True, type=click.Path(exists=True, dir_okay=False), metavar="FILE.jsonl",
              help="Tuning database(s) holding an exhaustive search (repeatable; default: "
                   "benchmarks/tuning/*.jsonl of the current folder).")
@click.option("--shape", "shape_text", metavar="MxNxK", help="The shape of the recording to replay (with SPEC).")
@click.option("--testbed", "testbed", is_flag=False, flag_value="", default=None, metavar="[FILE.json]",
              help="Replay every space and shape of the test bed (default: benchmarks/testbed.json of the "
                   "current folder; the spec paths it names are relative to the current folder) instead of SPEC.")
@click.option("--strategy", "names", multiple=True,
              help="Strategy to replay (repeatable; default: all, random_sample always included).")
@click.option("--option", "strategy_options", multiple=True, metavar="NAME=VALUE",
              help="A strategy option, for every strategy replayed that has it.")
@click.option("--seeds", type=int, default=20, show_default=True, help="Runs per strategy, with seeds 0 to N-1.")
@click.option("--jobs", type=int, default=1, show_default=True, help="Processes to run seeds in.")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False), help="Write the table as Markdown.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the table's rows as JSON.")
@click.option("--check", "check_name", metavar="STRATEGY",
              help="Exit 1 unless STRATEGY meets the test bed's bar (issue 15) on every recording.")
@force_option
def replay(spec, kernel, dbs, shape_text, testbed, names, strategy_options, seeds, jobs, markdown_path,
           json_path, check_name, force):
    """Replay search strategies against recorded exhaustive searches, with no GPU.

    Each strategy's evaluate() is answered from the database (a failed point scores 0), over
    --seeds runs: evaluations needed to come within 3% and 1% of the exhaustive best (median,
    worst), and the median best found after 5%, 10% and 20% of the points beside random_sample's.

    Run it in a gemmgen checkout: the default databases (benchmarks/tuning/*.jsonl) and test bed
    (benchmarks/testbed.json) are read from the current folder.

    \b
    Examples:
      gemmgen replay specs/hopper_tc_search.gemm --shape 4096x4096x4096 --strategy model
      gemmgen replay --testbed --markdown replay.md --check model
    """

    chosen = list(dict.fromkeys(names or strategies.names()))
    if "random_sample" not in chosen:
        chosen.append("random_sample")
    for name in list(chosen):
        try:
            strategies.get(name)
        except ValueError as exc:
            if names:
                raise click.BadParameter(str(exc), param_hint="--strategy") from None
            say(("skipped", "yellow"), f" {exc}")
            chosen.remove(name)
    names = chosen
    if testbed is None and not (spec and shape_text):
        raise click.UsageError("give SPEC and --shape, or --testbed")
    db_paths = [Path(d) for d in dbs] if dbs else sorted(rp.TUNING.glob("*.jsonl"))
    if not db_paths:
        fail(f"no tuning database: replay reads {rp.TUNING}/*.jsonl in the current folder ({Path.cwd()}), "
              "as in a gemmgen checkout; run it there, or give --db FILE.jsonl")
    inputs = [spec, *db_paths] + ([Path(testbed or rp.TESTBED)] if testbed is not None else [])
    check_outputs(filter(None, [markdown_path, json_path]), inputs=inputs, force=force)
    if testbed is not None:
        if not Path(testbed or rp.TESTBED).is_file():
            fail(f"no test bed at {testbed or rp.TESTBED} (in {Path.cwd()}): run replay in a gemmgen "
                  "checkout, or give its path, --testbed FILE.json")
        recordings, missing = rp.testbed_recordings(Path(testbed) if testbed else rp.TESTBED, db_paths)
        for item in missing:
            say(("not recorded yet:", "yellow"), f" {item} (benchmarks/record_testbed.py records it)")
    elif spec and shape_text:
        try:
            shape = parse_case(shape_text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--shape") from None
        try:
            recordings = [rp.load_recording(load_one(spec, kernel), db_paths, shape)]
        except LookupError as exc:
            fail(str(exc))
    options = parse_options(strategy_options)
    outcomes = []
    with progress_bar() as bar:
        task = bar.add_task("replaying", total=len(recordings) * len(names))
        for recording in recordings:
            if recording.missing or recording.stale:
                console.print(f"{recording.label}: {recording.space.valid} recorded points replayed"
                              + (f"; {recording.missing} valid point(s) of today's space not in "
                                 f"{recording.db.name}" if recording.missing else "")
                              + (f"; {recording.stale} record(s) of points no longer valid ignored"
                                 if recording.stale else ""))
            for name in names:
                module = strategies.get(name)
                mine = {k: v for k, v in options.items() if k in module.OPTIONS}
                outcomes.append(rp.replay(name, recording, seeds, mine, jobs=jobs))
                bar.advance(task)
    rows = rp.table_rows(outcomes)
    table = Table(title=f"replay over {seeds} seeds: evaluations to come within 3% and 1% of the "
                        "exhaustive best (median / worst), best found at 5/10/20% of the points")
    for column in ("space, shape (valid)", "strategy", "to 3%", "to 1%", "best at 5/10/20%", "random_sample"):
        table.add_column(column)
    for r in rows:
        count = lambda v: "never" if v is None else f"{v:g}"  # noqa: E731
        table.add_row(f"{r['space']} ({r['valid']})", r["strategy"],
                      f"{count(r['median_0.03'])} / {count(r['worst_0.03'])}",
                      f"{count(r['median_0.01'])} / {count(r['worst_0.01'])}",
                      " ".join(f"{100 * r[f'best_at_{f:g}']:.1f}" for f in rp.BUDGETS),
                      " ".join(f"{100 * r[f'random_sample_at_{f:g}']:.1f}" for f in rp.BUDGETS))
    console.print(table)
    if markdown_path:
        write_output(markdown_path, markdown_marker("replay") + "\n\n" + rp.summary_markdown(rows) + "\n"
                     + rp.markdown(rows))
        say(f"wrote {markdown_path}")
    if json_path:
        write_output(json_path, json.dumps(rows, indent=1))
        say(f"wrote {json_path}")
    if check_name:
        failures = rp.must_hold(outcomes, check_name)
        for failure in failures:
            say((failure, "red"))
        if failures:
            fail(f"{check_name} misses the bar on {len(failures)} count(s)")
        say(f"{check_name}: within 3% with at most 10% of the points and within 1% with at most "
            "20% (median), and ahead of random_sample, on every recording")
