"""The library side of `gemmgen build`, `tune`, `bench` and `explain`: what they print and write for a
`library` block. The work itself is in gemmgen.library (tune.py, manifest.py, emit.py for the .cu
and header, dispatch.py for choosing and launching from Python) and gemmgen.gpu.bench (timing)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import click
from rich.table import Table

from ..gpu import bench as gpu_bench, runtime as gpu_runtime
from ..gpu.bench import plot_library
from ..language.shapes import LibraryShape
from ..library.dispatch import LibraryRuntime
from ..library.emit import library_header_source, library_source
from ..library.manifest import Manifest, ManifestError, build_manifest, loo_label
from ..library.model import Library, kernel_key, portable_member
from ..library.padding import rule as padding_rule
from ..library.tune import TuneReport, tune_library
from ..outputs import OutputError, check_outputs, complete_pending, write_set
from ..plan.space import describe
from ..tuning import database as tuning_db
from .terminal import line


def outputs(library: Library, output: str | None, manifest: str | None) -> tuple[Path, Path, Path]:
    """Where a library's .cu, header and manifest go: -o FILE.cu or a folder (default generated/);
    the header beside the .cu, and the manifest too unless --manifest names it. A -o that names
    a file of another kind is a click.UsageError (never a folder named like a file)."""
    out = Path(output) if output else Path("generated")
    folder = output is None or output.endswith(("/", os.sep)) or out.is_dir() or not out.suffix
    if not folder and out.suffix != ".cu":
        raise click.UsageError(f"-o {output}: library {library.name} is written as CUDA source: name a .cu file "
                               "(its .h and .json go beside it) or a folder")
    cu = out / f"{library.name}.cu" if folder else out
    return cu, cu.with_suffix(".h"), Path(manifest) if manifest else cu.with_suffix(".json")


def check(library: Library, output: str | None, manifest: str | None, *, inputs, force: bool) -> None:
    """Before any work: the library's outputs may be written (outputs.check_outputs), once an
    interrupted write of the same library has been finished (outputs.complete_pending)."""
    paths = outputs(library, output, manifest)
    complete_pending(paths[2])
    check_outputs(paths, inputs=inputs, force=force)


def check_labels(library: Library, db: Path) -> None:
    """tuning_db.DatabaseError at a record of the library whose label contradicts the candidate
    its key names (see tuning_db); before any work that would trust the record."""
    plans = library.candidates() + [p for m in library.members if m.searched for p in m.plans]
    labels = {kernel_key(p): describe(p.spec) for p in plans}
    tuning_db.check_labels(db, tuning_db.read(db), labels, space=library.name)


def write(library: Library, manifest: Manifest, paths: tuple[Path, Path, Path], console) -> None:
    """The library's .cu (codegen), its header and its manifest (for gemmgen.matmul and bench),
    as one set (outputs.write_set): a reader never sees a new .cu beside an old manifest."""
    cu, header, manifest_path = paths
    origin = Path(library.spec.path).name
    source = library_source(manifest, origin, library.spec.source.splitlines())
    header_text = library_header_source(manifest, manifest.plans()[0], cu.name)
    write_set([(cu, source), (header, header_text), (manifest_path, manifest.to_json())], anchor=manifest_path)
    loo = manifest.leave_one_out
    console.print(f"wrote {cu} ({len(manifest.members)} members), {header} and {manifest_path}; leave-one-out "
                  f"over {len(loo.per_shape)} tuned shapes: chosen / best median {loo.median:.3f}, "
                  f"worst {loo.worst:.3f}", soft_wrap=True)


def manifest_table(manifest: Manifest, title: str) -> Table:
    """Per tuned shape: cuBLAS, the member chosen, the best candidate timed, and leave-one-out."""
    table = Table(title=title)
    for column in ("shape", "class", f"{manifest.baseline} ms", "chosen member", "ms", "x cuBLAS",
                   "best timed ms", "leave-one-out"):
        table.add_column(column, justify="right")
    names = [m.name for m in manifest.members]
    loo = manifest.leave_one_out.per_shape
    for row in manifest.shapes:
        shape = str(LibraryShape(row.M, row.N, row.K, row.pad, batch=row.batch))
        ms = row.chosen_ms
        cublas = row.cublas_ms
        ratio = loo.get(loo_label(row.M, row.N, row.K, row.klass, row.batch))
        table.add_row(shape, row.klass, f"{cublas:.4f}" if cublas else "-", names[row.chosen],
                      f"{ms:.4f}" if ms else "-", f"{cublas / ms:.2f}" if ms and cublas else "-",
                      f"{row.best_candidate_ms:.4f}" if row.best_candidate_ms else "-",
                      f"{ratio:.3f}" if ratio is not None and math.isfinite(ratio) else "-")
    return table


def tune(library: Library, *, db: Path, output: str | None, manifest_path: str | None, strategy: str,
         options: dict, max_points: int | None, anchors: int, per_shape: int, progress_factory,
         console, write_file, json_path: str | None, plot_path: str | None, scheduler=None) -> TuneReport:
    """gemmgen tune LIB.gemm: measure (on this host's first GPU, or a Dask cluster's GPU workers
    with `scheduler`, a distributed.Client), then write the library."""
    with progress_factory() as bar:
        task = bar.add_task(f"{library.name}: validating and timing", total=None)
        counts = {"ok": 0, "failed": 0}

        def progress(entry: dict) -> None:
            status = entry.get("status")
            if entry.get("key") == "device":
                return
            counts["ok" if status == "ok" else "failed"] += 1
            if status not in ("ok", "invalid", None):
                bar.console.print(line("  ", (str(status), "yellow"), f" {entry.get('point', '')}: "
                                       f"{entry.get('reason', '')[:160]}"), soft_wrap=True)
            bar.update(task, advance=1, description=f"{library.name}: {counts['ok']} timed, "
                                                    f"{counts['failed']} failed")

        started = time.perf_counter()

        def stage(text: str) -> None:  # a line per step, so that a log shows where the time went
            bar.console.print(line(f"  {time.perf_counter() - started:5.0f} s  {text}"), soft_wrap=True)

        check_labels(library, db)
        report = tune_library(library, db=db, progress=progress, strategy=strategy, options=options,
                              max_points=max_points, anchors=anchors, per_shape=per_shape, scheduler=scheduler,
                              stage=stage)
    rate = report.evaluated / report.seconds if report.seconds else 0.0
    console.print(f"{library.name}: {report.evaluated} validations and timings in {report.seconds:.0f} s "
                  f"({rate:.2f}/s) on {report.gpus} GPU(s); {len(report.failures)} candidate(s) failed",
                  soft_wrap=True)
    for shape, reason in report.skipped.items():
        path = shape.origin[0] if shape.origin else library.spec.path
        where = f" ({path}:{shape.span.line})" if shape.span else ""
        console.print(f"[yellow]warning:[/] {library.name} was not tuned at {shape}{where}: cuBLAS failed there "
                      f"({reason})", soft_wrap=True)
    manifest = build_manifest(library, db, device=report.device.split("|")[0])
    manifest.database = str(db)
    console.print(manifest_table(manifest, f"library {library.name} on {manifest.device.name}"))
    paths = outputs(library, output, manifest_path)
    write(library, manifest, paths, console)
    if json_path:
        records = [{"library": library.name, "kernel": key, "shape": shape, "ms": ms}
                   for (key, shape), ms in report.measurements.times.items()]
        write_file(Path(json_path), json.dumps(records, indent=1))
    if plot_path:
        rows = [{"shape": r.key, "ratio": r.cublas_ms / r.chosen_ms if r.cublas_ms and r.chosen_ms else 0.0,
                 "best_ratio": r.cublas_ms / r.best_candidate_ms if r.cublas_ms and r.best_candidate_ms else 0.0,
                 "member": manifest.members[r.chosen].name} for r in manifest.shapes]
        plot_library(rows, manifest.baseline, f"library {library.name} (tuned shapes)", plot_path)
        console.print(f"wrote {plot_path}", soft_wrap=True)
    return report


def build(library: Library, *, db: str, device: str | None, output: str | None, manifest_path: str | None,
          console) -> None:
    """gemmgen build LIB.gemm --from-db DB: the library from measurements, no GPU."""
    check_labels(library, Path(db))
    manifest = build_manifest(library, Path(db), device=device)
    manifest.database = str(db)
    console.print(manifest_table(manifest, f"library {library.name} from {db} ({manifest.device.name})"))
    write(library, manifest, outputs(library, output, manifest_path), console)


class LibraryCall:
    """A library behind the interface bench times: .plan (layouts and precision), .launch, .name;
    `.chosen` is the member the last call ran."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.plan = runtime.plan
        self.name = f"gemmgen_{runtime.name}"
        self.device = runtime.device
        self.chosen: int | None = None

    def launch(self, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, smallest=None, stream=None) -> None:
        self.chosen = self.runtime.launch(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream=stream)


def bench(library: Library, manifest: Manifest, cases, *, budget: float, console, progress_factory):
    """gemmgen bench LIB.gemm: per shape, the member the library chooses, timed in turns with cuBLAS
    in the library's precision, and its error beside cuBLAS FP32's."""
    info = gpu_runtime.device_info()
    runtime = LibraryRuntime(manifest)
    runtime.compile_all()
    call = LibraryCall(runtime)
    flusher = gpu_bench.L2Flusher(info)
    rows = []
    tuned = {r.key for r in manifest.shapes}
    with progress_factory() as bar:
        task = bar.add_task("timing", total=len(cases))
        for case in cases:
            bar.update(task, description=f"timing {library.name} at {case}")
            result = gpu_bench.bench(call, case, info=info, flusher=flusher, budget_s=budget)
            member = manifest.members[call.chosen]
            key = f"{case.M}x{case.N}x{case.K}" + (f"+{case.pad}" if case.pad else "")
            rows.append({**result.as_dict(), "member": member.name, "member_point": member.point,
                         "tuned_shape": key in tuned, "library": library.name})
            bar.advance(task)
    table = Table(title=f"library {library.name} on {info.name} (driver {info.driver_version}) beside "
                        f"{manifest.baseline}, in turns", caption="rel err: ||C - C64||_F / ||C64||_F")
    for column in ("shape", "tuned", "member", "ms", "TFLOP/s", "cuBLAS ms", "x cuBLAS", "rel err",
                   "cuBLAS FP32 rel err"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["shape"], "yes" if r["tuned_shape"] else "no", r["member"], f"{r['ms']:.4f}",
                      f"{r['tflops']:.1f}", f"{r['cublas_ms']:.4f}", f"{r['cublas_ms'] / r['ms']:.2f}",
                      f"{r['rel_error']:.2e}", f"{r['cublas_fp32_rel_error']:.2e}")
    console.print(table)
    speedups = [r["cublas_ms"] / r["ms"] for r in rows if r["ms"]]
    if speedups:
        geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        slow = [r for r in rows if r["cublas_ms"] >= 0.020 and r["cublas_ms"] / r["ms"] < 1.0]
        console.print(f"geometric mean {geo:.2f}x {manifest.baseline} over {len(speedups)} shapes; "
                      f"slower than cuBLAS where it takes >= 20 us: {len(slow)}", soft_wrap=True)
    return rows


def summary(library: Library, manifest_dir: Path = Path("generated")) -> dict:
    """What `gemmgen explain` says of a library: its members and shapes, and the manifest's kept
    members when one was built (generated/<library>.json)."""
    members = [{"name": m.name, "kernels": len(m.plans), "searched per shape": m.searched,
                "targets": sorted({p.arch.name for p in m.plans}),
                "math": sorted({p.math for p in m.plans}),
                "portable": any(portable_member(p) for p in m.plans)} for m in library.members]
    result = {"library": library.name, "precision": library.precision, "baseline": library.baseline,
              "layout": library.layouts, "members": members, "candidates": len(library.candidates()),
              "shapes": [str(s) for s in library.shapes], "padding": padding_rule(library.precision)}
    path = manifest_dir / f"{library.name}.json"
    try:
        complete_pending(path)  # an interrupted build of it finished first
        manifest = Manifest.read(path)
    except (OSError, ManifestError, OutputError):
        return result
    result["manifest"] = {"path": str(path), "device": manifest.device.name,
                          "kept": [f"{m.name}: {m.point} ({m.target})" for m in manifest.members],
                          "leave_one_out": [manifest.leave_one_out.median, manifest.leave_one_out.worst]}
    return result


def render_summary(s: dict) -> str:
    lines = [f"library {s['library']}: {s['precision']} (timed against {s['baseline']}), layout "
             + ", ".join(f"{x} {v}" for x, v in s["layout"].items()), "",
             f"members ({s['candidates']} kernels timed whole)"]
    for m in s["members"]:
        how = "searched per shape" if m["searched per shape"] else f"{m['kernels']} kernel(s)"
        lines.append(f"  {m['name']:24s} {how:22s} math {'/'.join(m['math'])}, {'/'.join(m['targets'])}"
                     + ("  (runs on every GPU)" if m["portable"] else ""))
    lines += ["", f"shapes ({len(s['shapes'])}): " + ", ".join(s["shapes"])]
    lines += ["", f"padding: {s['padding']}"]
    if "manifest" in s:
        m = s["manifest"]
        lines += ["", f"tuned ({m['path']}, {m['device']}): leave-one-out median {m['leave_one_out'][0]:.3f}, "
                      f"worst {m['leave_one_out'][1]:.3f}; members kept:"]
        lines += [f"  {kept}" for kept in m["kept"]]
    else:
        lines += ["", "not tuned yet: gemmgen tune on it writes generated/<library>.cu and .json"]
    return "\n".join(lines)
