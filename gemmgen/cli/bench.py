"""`gemmgen bench`: a spec's kernels timed beside cuBLAS, a library's chosen members, or a GEMM split
over several GPUs against one (a kernel's, or a library's with a LibraryRuntime per GPU), with the
GPUs' topology and peer bandwidth recorded beside it."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from ..gpu import bench as gpu_bench, runtime
from ..gpu.bench import DEFAULT_SHAPES, plot, plot_library, timing_record
from ..gpu.verify import UNIT_ROUNDOFF, Case
from ..library.dispatch import LibraryRuntime
from ..library.manifest import Manifest
from ..library.resolve import load_libraries
from ..multigpu.cupy_layer import CupyLayer
from ..multigpu.parts import AXIS_NAMES
from ..multigpu.scaling import measure_scaling, parse_devices, scaling_record
from ..multigpu.topology import record_links
from ..outputs import check_outputs, complete_pending, write_output
from . import common, library as cli_library
from .common import (SHAPES_HELP, acts_on_libraries, fail, force_option, input_paths, kernel_option, parse_shapes,
                     plans_of, progress_bar, spec_argument)
from .terminal import out as console, say, styled


@click.command()
@spec_argument
@kernel_option
@click.option("--shapes", metavar="CASES",
              help=SHAPES_HELP + " Default: 1024^3, 2048^3, 4092^3, 4096^3, 8192^3, 127x4099x1023.")
@click.option("--json", "json_path", type=click.Path(), help="Write the results as JSON here.")
@click.option("--plot", "plot_path", type=click.Path(), help="Write a PNG: TFLOP/s per shape and a roofline.")
@click.option("--budget", type=float, default=0.5, show_default=True,
              help="Seconds of timed runs per kernel and shape (median of at least 5).")
@click.option("--devices", metavar="all|0,1,...",
              help="Split each GEMM over these GPUs (inputs on the first; rows, columns or K, whichever "
                   "moves the fewest bytes) and report scaling against one GPU, end to end and from "
                   "resident shards ('0,0' splits into two parts on one GPU); a library splits with its "
                   "own runtime on each GPU. The GPUs' topology (nvidia-smi topo -m) and a measured peer "
                   "copy bandwidth matrix are printed and written beside the results.")
@click.option("--manifest", "manifest_path", type=click.Path(dir_okay=False), metavar="FILE.json",
              help="A library's manifest (default: generated/<library>.json, as gemmgen tune wrote it).")
@force_option
def bench(spec, kernel, shapes, json_path, plot_path, budget, devices, manifest_path, force):
    """Time SPEC beside cuBLAS on the same buffers, and measure its accuracy.

    The baseline has the kernel's input precision: math simt and 3xtf32 kernels run beside
    cuBLAS FP32 (TF32 off), math tf32 kernels beside cuBLAS in TF32 mode
    (CUBLAS_COMPUTE_32F_FAST_TF32). CUDA events around each launch, warm-up first, L2 flushed
    before every run, median and 10-90% spread. Reports TFLOP/s, % of the baseline and % of
    the device's FP32 peak, and, on the bench's own inputs (uniform in [-1, 1]), the relative
    error ||C - C64||_F / ||C64||_F of the kernel against a float64 product beside cuBLAS
    FP32's on the same inputs.

    A library (a `library` block) is timed per shape with the member it chooses, from its
    manifest (gemmgen tune or build --from-db writes it).

    \b
    Examples:
      gemmgen bench specs/warptile.gemm
      gemmgen bench specs/warptile.gemm --shapes 4096x4096x4096 --json bench.json --plot bench.png
      gemmgen bench specs/warptile.gemm --devices all
      gemmgen bench specs/fp32.gemm            # a library
      gemmgen bench specs/fp32.gemm --devices all --shapes '8192x8192x8192'
    """

    common.require_gpu()
    if acts_on_libraries(spec, kernel):
        if devices:
            return _bench_library_split(spec, kernel, shapes, devices, json_path, manifest_path, force)
        return _bench_libraries(spec, kernel, shapes, json_path, plot_path, budget, manifest_path, force)
    cases = parse_shapes(shapes, DEFAULT_SHAPES)
    plans = plans_of(spec, kernel, None)
    check_outputs(filter(None, [json_path, plot_path]), inputs=input_paths(spec, [p.spec for p in plans]),
                  force=force)
    if devices:
        return _bench_split(spec, kernel, cases, devices, json_path)
    info = runtime.device_info()
    flusher = gpu_bench.L2Flusher(info)
    results = []
    with progress_bar() as bar:
        task = bar.add_task("timing", total=len(plans) * len(cases))
        for plan in plans:
            kernel_obj = runtime.Kernel(plan)
            for case in cases:
                bar.update(task, description=f"timing {plan.name} at {case}")
                results.append(gpu_bench.bench(kernel_obj, case, info=info, flusher=flusher, budget_s=budget))
                bar.advance(task)
    # One baseline (one math mode) names the columns; kernels of several math modes get a column.
    baselines = list(dict.fromkeys(r.baseline for r in results))
    baseline = baselines[0] if len(baselines) == 1 else "baseline"
    table = Table(title=f"{info.name} (driver {info.driver_version}), FP32 peak "
                        f"{info.fp32_peak_tflops(plans[0].arch.fp32_lanes_per_sm):.1f} TFLOP/s",
                  caption="rel err: ||C - C64||_F / ||C64||_F against a float64 product, on the "
                          "bench's inputs")
    columns = ["kernel", "shape", "ms", "TFLOP/s", f"{baseline} TFLOP/s", f"% {baseline}", "% peak",
               "rel err", "cuBLAS FP32 rel err"]
    if len(baselines) > 1:
        columns.insert(4, "baseline")
    for column in columns:
        table.add_column(column, justify="right")
    for r in results:
        cells = [r.kernel, r.shape, f"{r.ms:.3f}", f"{r.tflops:.1f}", f"{r.cublas_tflops:.1f}",
                 f"{r.percent_of_cublas:.0f}%", f"{r.percent_of_peak:.0f}%", f"{r.rel_error:.2e}",
                 f"{r.cublas_fp32_rel_error:.2e}"]
        if len(baselines) > 1:
            cells.insert(4, r.baseline)
        table.add_row(*cells)
    console.print(table)
    if json_path:
        write_output(json_path, json.dumps(timing_record(info, [r.as_dict() for r in results]), indent=2))
    if plot_path:
        plot(results, info, plans[0].arch.fp32_lanes_per_sm, plot_path)
        say(f"wrote {plot_path}")


def _manifest(library, manifest_path) -> Manifest:
    path = Path(manifest_path) if manifest_path else Path("generated") / f"{library.name}.json"
    complete_pending(path)  # an interrupted build of the library is finished first
    try:
        return Manifest.read(path)
    except (OSError, ValueError) as exc:
        fail(f"cannot read the manifest of library {library.name} ({path}): "
              f"{getattr(exc, 'strerror', None) or exc}; run gemmgen tune on it, or build --from-db")


def _bench_libraries(spec, kernel, shapes, json_path, plot_path, budget, manifest_path, force):
    """bench of a library: per shape, the member it chooses beside cuBLAS (default: its tuned shapes)."""
    rows = []
    check_outputs(filter(None, [json_path, plot_path]), inputs=input_paths(spec, [], manifest_path), force=force)
    for library in load_libraries(spec, kernel):
        manifest = _manifest(library, manifest_path)
        # single GEMMs: the batched shapes a library is tuned at are timed by benchmarks/torch_batched.py
        default = tuple(Case(s.M, s.N, s.K, pad=s.pad) for s in library.shapes if s.batch == 1)
        rows += cli_library.bench(library, manifest, parse_shapes(shapes, default), budget=budget,
                                  console=console, progress_factory=progress_bar)
    if json_path:
        write_output(json_path, json.dumps(timing_record(runtime.device_info(), rows), indent=2))
    if plot_path:
        plot_library([{"shape": r["shape"], "ratio": r["cublas_ms"] / r["ms"], "member": r["member"],
                       "tuned": r["tuned_shape"]} for r in rows], rows[0]["baseline"] if rows else "cuBLAS",
                     f"{', '.join(dict.fromkeys(r['library'] for r in rows))}: bench", plot_path)
        say(f"wrote {plot_path}")


def _devices(devices_text: str) -> list[int]:
    try:
        return parse_devices(devices_text, runtime.device_count())
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--devices") from None


def _bench_split(spec, kernel, cases, devices_text, json_path):
    """bench --devices: each shape split over several GPUs, beside one GPU on the whole of it."""
    devices = _devices(devices_text)
    subjects = [(plan.name, plan, plan.math, {"kernel": plan.name, "layouts": plan.layouts(), "math": plan.math})
                for plan in plans_of(spec, kernel, None)]
    _measure_split(subjects, cases, devices, json_path)


def _bench_library_split(spec, kernel, shapes, devices_text, json_path, manifest_path, force):
    """bench LIB.gemm --devices: each shape split over several GPUs by the library, a LibraryRuntime
    per GPU choosing its member for each block, beside the library on one GPU."""
    check_outputs(filter(None, [json_path]), inputs=input_paths(spec, [], manifest_path), force=force)
    devices = _devices(devices_text)
    subjects = []
    for library in load_libraries(spec, kernel):
        manifest = _manifest(library, manifest_path)
        runtimes = {device: LibraryRuntime(manifest, device) for device in sorted(set(devices))}
        runtimes[devices[0]].compile_all()  # every member into the cubin cache, before anything is timed
        # The loosest math among its members: the tolerance of whichever one a block chooses.
        math = max((plan.math for plan in runtimes[devices[0]].plans), key=UNIT_ROUNDOFF.__getitem__)
        subjects.append((library.name, runtimes.__getitem__, math,
                         {"library": library.name, "layouts": manifest.layout, "math": math}))
    _measure_split(subjects, parse_shapes(shapes, DEFAULT_SHAPES), devices, json_path)


def _links_table(links: dict) -> Table:
    bandwidth = links["peer_bandwidth"]
    table = Table(title=f"peer copy bandwidth, GB/s ({bandwidth['bytes'] >> 20} MiB copies, median of "
                        f"{bandwidth['repeats']}; rows: from, columns: to)")
    table.add_column("from \\ to")
    for device in bandwidth["devices"]:
        table.add_column(f"GPU {device}", justify="right")
    for src, row in zip(bandwidth["devices"], bandwidth["gbps"]):
        table.add_row(f"GPU {src}", *("-" if v is None else f"{v:.1f}" for v in row))
    return table


def _measure_split(subjects, cases, devices, json_path):
    """Each subject (name, Plan or launcher per device, math, what its records say) at each case,
    after the links between the GPUs are recorded: nvidia-smi topo -m and a peer bandwidth matrix."""
    names = ", ".join(f"{d}: {runtime.device_info(d).name}" for d in sorted(set(devices)))
    n = len(devices)
    links = record_links(CupyLayer(), devices)
    console.print(_links_table(links))
    topology = links["topology"]
    say(f"{topology['command']}:\n{topology['text']}" if topology["text"] is not None else
        f"{topology['command']}: not recorded ({topology['error']})")
    table = Table(title=f"split over devices {devices} ({names}); inputs and C on GPU {devices[0]}",
                  caption=f"scaling: TFLOP/s over {n} x one GPU's; end to end includes the copies, "
                          "resident starts from shards already on each GPU; each is the host time of "
                          "a call until C is complete, the three timed in turns (medians of 3)")
    for column in ("kernel", "shape", "split", "per-GPU kernel ms", "1 GPU TFLOP/s",
                   f"{n} GPUs end to end TFLOP/s (scaling)", "resident TFLOP/s (scaling)", "check"):
        table.add_column(column, justify="right")
    records, failed = [], False
    for name, kernels, math, about in subjects:
        for case in cases:
            report, worst = measure_scaling(kernels, case.M, case.N, case.K, devices, math=math)
            ok = worst <= 1.0
            failed |= not ok
            split = report.split
            table.add_row(name, str(case), f"{AXIS_NAMES[split.axis]}",
                          " ".join(f"{ms:.2f}" for ms in split.kernel_ms.values()),
                          f"{report.one_gpu_tflops:.1f}",
                          f"{report.end_to_end_tflops:.1f} ({report.scaling(report.end_to_end_tflops):.2f} x {n})",
                          f"{report.resident_tflops:.1f} ({report.scaling(report.resident_tflops):.2f} x {n})",
                          styled("ok", "green") if ok else styled(f"FAIL {worst:.2g}", "red"))
            records.append({**about, **scaling_record(report, worst), "shape": str(case)})
    console.print(table)
    if json_path:
        write_output(json_path, json.dumps({**timing_record(runtime.device_info(), records), "links": links},
                                           indent=2))
    if failed:
        fail("the split result differs from the float64 reference")
