"""The gemmgen command line: verbs over the library, no logic of its own.

    gemmgen build specs/warptile.gemm          # -> generated/warptile.cu
    gemmgen explain specs/warptile.gemm        # threads, registers, occupancy, bank conflicts
    gemmgen check specs/warptile.gemm          # validate on the GPU against float64
    gemmgen bench specs/warptile.gemm --plot bench.png
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import click
from rich.table import Table

from ..version import __version__
from . import terminal
from ..language.errors import SpecError
from ..outputs import OutputError, check_outputs, complete_pending, markdown_marker, marker_line, write_output
from ..tuning.database import check_database
from ..language.spec import TARGETS
from .terminal import err as errors, line, out as console, say, styled
from ..tuning.database import DatabaseError

INTERRUPTED = 130  # the shell's code for a command ended by Ctrl-C (128 + SIGINT)


def _fail(message: str, code: int = 1) -> None:
    terminal.error(message)
    sys.exit(code)


def _load_specs(path: str, kernel: str | None, target: str | None):
    from ..language.load import load
    specs = load(path)
    if kernel:
        specs = [s for s in specs if s.name == kernel]
        if not specs:
            raise SpecError(f"no kernel named '{kernel}' in this file", path=path)
    if target:
        specs = [s.with_values(target=target) for s in specs]
    return specs


def _inputs(path: str, specs=(), *others) -> list:
    """The files a command reads, which its outputs must not replace: the spec, the files its
    kernels' parents came from, and any others given (a tuning database)."""
    parents = {param.origin[0] for s in specs for param in s.params.values() if param.origin}
    return [path, *sorted(parents), *others]


def _plans(path: str, kernel: str | None, target: str | None, layouts: str | None = None):
    """Plans of the spec's kernels, in the given A/B layouts too (a search space is an error)."""
    from ..plan import make_plan
    plans = []
    for spec in _load_specs(path, kernel, target):
        variants = [spec]
        if layouts:
            variants = [spec.with_values(layout_A=a, layout_B=b) for a, b in _layout_pairs(layouts)]
        plans += [make_plan(v) for v in variants]
    return plans


def _layout_pairs(text: str) -> list[tuple[str, str]]:
    if text == "all":
        return [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]
    pairs = []
    for item in text.split(","):
        a, _, b = item.strip().partition("/")
        if a not in ("row", "col") or b not in ("row", "col"):
            raise click.BadParameter(f"{item!r}: use all, or A/B pairs like row/col,col/row")
        pairs.append((a, b))
    return pairs


def _libraries(path: str, kernel: str | None) -> bool:
    """Whether this command acts on the file's libraries: it holds some, and --kernel names none
    of its kernels."""
    from ..language.load import load_file
    parsed = load_file(path)
    if not parsed.libraries:
        return False
    return kernel is None or any(lib.name == kernel for lib in parsed.libraries)


def _progress(on=errors, transient: bool = True):
    """A progress bar for work that takes more than a moment (stderr, cleared when done)."""
    return terminal.progress(on, transient)


@contextlib.contextmanager
def _late_progress(description: str, total: int, delay_s: float = 0.5):
    """`progress(done)` for work of `total` steps: a progress bar appears (stderr, cleared when
    done) once the work has taken more than `delay_s`, and only where stderr is a terminal."""
    started, bar = time.monotonic(), None

    def progress(done: int) -> None:
        nonlocal bar
        if bar is None and errors.is_terminal and done < total and time.monotonic() - started > delay_s:
            bar = _progress(errors)
            bar.start()
            bar.add_task(description, total=total)
        if bar is not None:
            bar.update(bar.task_ids[0], completed=done)

    try:
        yield progress
    finally:
        if bar is not None:
            bar.stop()


def _require_gpu() -> None:
    from ..gpu.runtime import device_count
    if device_count() == 0:
        _fail("no CUDA GPU found (no driver or no device): check, bench, tune and profile run "
              "kernels and need one; build and explain work without", code=2)
    try:
        import cupy  # noqa: F401
    except ImportError:
        _fail("check, bench, tune and profile keep their buffers in CuPy (and time cuBLAS through it): "
              "pip install 'gemmgen[gpu]' (cupy-cuda13x; cupy-cuda12x for CUDA 12 drivers)", code=2)


class _Group(click.Group):
    """Turns SpecErrors, compile errors, bad databases and Ctrl-C into messages, never tracebacks."""

    def invoke(self, ctx):
        from ..gpu.compile import CompileError
        from ..multigpu.split import MultiGpuError
        from ..tuning.replay import ReplayError
        from ..gpu.runtime import CudaError, ShapeError
        try:
            return super().invoke(ctx)
        except SpecError as exc:
            errors.print(str(exc), soft_wrap=True)
            sys.exit(1)
        except CompileError as exc:
            _fail(f"the generated source did not compile (a gemmgen bug: please report it "
                  f"with the spec):\n{exc}")
        except (CudaError, ShapeError, MultiGpuError, OutputError, DatabaseError, ReplayError) as exc:
            _fail(str(exc))
        except KeyboardInterrupt:
            # Every output is written whole or not at all (outputs.py), so there is nothing to undo.
            _fail("interrupted: no output was left half-written (a tune resumes from its database "
                  "when run again)", code=INTERRUPTED)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gemmgen")
def main() -> None:
    """gemmgen: compile a tiling spec into a fast, readable SGEMM CUDA kernel.

    A spec (.gemm file) describes the tiling of C = alpha*A@B + beta*C: the block, warp and
    thread tiles, how A and B travel to shared memory (vector width, transpose, padding or
    swizzle), how many buffers the pipeline has, and the target GPU. For example:

    \b
        kernel warptile {
          target   sm_90
          block    128 x 128 x 16
          warp     64 x 64
          thread   8 x 4 repeat 1 x 4
          load A   vector 4 transpose
          load B   vector 4
          stages   2 sync
          raster   group 8
        }

    Typical session:

    \b
        gemmgen explain specs/warptile.gemm   # what it will cost, before any GPU time
        gemmgen build   specs/warptile.gemm   # writes generated/warptile.cu
        gemmgen check   specs/warptile.gemm   # correct on every shape? (GPU)
        gemmgen bench   specs/warptile.gemm   # how fast beside cuBLAS? (GPU)

    The emitted .cu has one entry point, callable from any CUDA build:

    \b
        extern "C" int gemmgen_<name>(int M, int N, int K, float alpha,
            const float *A, int lda, const float *B, int ldb, float beta,
            float *C, int ldc, cudaStream_t stream);
    """


spec_argument = click.argument("spec", type=click.Path(exists=True, dir_okay=False))
kernel_option = click.option("--kernel", "-k", metavar="NAME",
                             help="Only this kernel of a file that defines several.")
target_option = click.option("--target", type=click.Choice(TARGETS),
                             help="Override the spec's target GPU architecture.")
force_option = click.option("--force", is_flag=True,
                            help="Replace existing output files that gemmgen did not write (a spec, a "
                                 ".cu without gemmgen's first line, ...). The command's own inputs "
                                 "are never replaced.")


EMITS = {".cu": "cu", ".h": "header", ".ptx": "ptx", ".cubin": "cubin"}  # what a -o file's suffix holds


def _build_target(output: str | None, emit: str | None, no_compile: bool) -> tuple[str, Path, bool]:
    """What build writes and where: (emit, path, whether the path is one file). A -o that ends in
    /, is a folder, or is a new name with no suffix is a folder; otherwise it is a file, and its
    suffix says what it holds: a --emit that says otherwise, a suffix that is none of EMITS, or
    --no-compile with NVRTC's output is a click.UsageError."""
    if no_compile and emit in ("ptx", "cubin"):
        raise click.UsageError(f"--emit {emit} is NVRTC's output, and --no-compile skips NVRTC: drop one")
    if output is None:
        return emit or "cu", Path("generated"), False
    path = Path(output)
    if output.endswith(("/", os.sep)) or path.is_dir() or not (path.suffix or path.exists()):
        return emit or "cu", path, False
    if not path.suffix:  # an existing file with no suffix (/dev/null): what --emit says
        return emit or "cu", path, True
    inferred = EMITS.get(path.suffix)
    if inferred is None:
        raise click.UsageError(f"-o {output}: a file's suffix says what it holds, one of "
                               f"{', '.join(EMITS)}; or name a folder (-o kernels/)")
    if emit and emit != inferred:
        raise click.UsageError(f"-o {output} names a {path.suffix} file, and --emit {emit} writes "
                               f"{'a C header' if emit == 'header' else 'a .' + emit + ' file'}: name a "
                               f"file that ends in .{'h' if emit == 'header' else emit}, or drop --emit")
    if no_compile and inferred in ("ptx", "cubin"):
        raise click.UsageError(f"-o {output} is NVRTC's output, and --no-compile skips NVRTC: drop one")
    return inferred, path, True


def _resources_summary(plan, compiled) -> list:
    """What build says of a compile: the registers of the kernel's aligned variant, as explain
    reports them (from the same compile), the other variants' if they need more, shared memory,
    spills."""
    from ..codegen.cuda import kernel_name_expressions
    fast = compiled.resources_of(kernel_name_expressions(plan)[True])
    most = max(r.registers for r in compiled.resources.values())
    spilled = sum(r.spill_stores + r.spill_loads for r in compiled.resources.values())
    registers = f"{fast.registers} registers" + (f" ({most} in its other variants)" if most > fast.registers else "")
    return [f" ({plan.arch.name}: {registers}, {plan.smem_bytes} B shared, ",
            (f"spills {spilled} B", "red") if spilled else "no spills", ")"]


@main.command()
@spec_argument
@kernel_option
@target_option
@click.option("--output", "-o", type=click.Path(), metavar="PATH",
              help="Output file (one kernel; its suffix .cu, .h, .ptx or .cubin says what it holds) or "
                   "folder (ends in /, or has no suffix). Default: generated/<name>.<ext>.")
@click.option("--emit", type=click.Choice(["cu", "header", "ptx", "cubin"]), default=None,
              help="CUDA C source for your build (with its C/C++ header NAME.h beside it), the header "
                   "alone, or NVRTC's PTX or cubin for the target. Default: what -o FILE's suffix "
                   "says, else cu.")
@click.option("--no-compile", is_flag=True,
              help="Write the .cu (or .h) without compiling the kernel with NVRTC first.")
@click.option("--from-db", type=click.Path(exists=True, dir_okay=False), metavar="TUNE.jsonl",
              help="Build a search space as its fastest validated point in this `gemmgen tune` database.")
@click.option("--shape", "db_shape", metavar="MxNxK",
              help="With --from-db: the best point tuned at this shape (default: at any shape).")
@click.option("--manifest", "manifest_path", type=click.Path(dir_okay=False), metavar="FILE.json",
              help="A library's manifest (what gemmgen.matmul and bench load). Default: beside its .cu.")
@click.option("--device", "db_device", metavar="NAME",
              help="With --from-db for a library: the GPU whose measurements to use (default: the one "
                   "with the most).")
@force_option
def build(spec, kernel, target, output, emit, no_compile, from_db, db_shape, manifest_path, db_device, force):
    """Generate the kernel of SPEC as CUDA C (or PTX / cubin).

    The .cu is self-contained: a kernel, and an extern "C" launcher that checks its arguments
    (cudaErrorInvalidValue for negative sizes, short leading dimensions or null pointers) and
    handles any M, N, K and alignment. Beside it, NAME.h declares the launcher for C and C++
    callers, with the layouts and what the fast path needs. Before writing, gemmgen compiles it
    with NVRTC and reports registers and spills, so a .cu that reaches you compiles.

    \b
    Examples:
      gemmgen build specs/warptile.gemm
      gemmgen build specs/warptile.gemm --target sm_80 -o kernels/
      gemmgen build specs/warptile.gemm --emit cubin     # generated/warptile.cubin
      gemmgen build specs/hopper_tc_search.gemm --shape 2048x2048x2048 \\
          --from-db benchmarks/tuning/2026-11-23-h100-testbed-hopper_tc_search.jsonl
      gemmgen build specs/fp32.gemm --from-db benchmarks/tuning/2026-11-23-h100-fp32-library.jsonl

    A search space is built as its fastest validated point in a `gemmgen tune` database
    (--from-db). A library (a `library` block) is built from the measurements of `gemmgen tune`
    on it: one .cu with a single entry point gemmgen_<library>, its header and its manifest
    (.json) beside it, written as one set.
    """
    from ..codegen.c_header import header_source
    from ..codegen.cuda import generate
    from ..gpu.compile import compile_plan
    from ..plan import make_plan

    if output and not Path(output).is_dir():  # an input, or a file not ours, said before its suffix
        check_outputs([output], inputs=[spec, from_db], force=force)
    emit, out, one_file = _build_target(output, emit, no_compile)
    libraries = []
    of_libraries = _libraries(spec, kernel)
    if of_libraries:
        from ..library.resolve import load_libraries
        for library in load_libraries(spec, kernel):
            if from_db:
                libraries.append(library)
            else:
                say(f"skipped {library.name}: a library is built from measurements (run gemmgen tune on "
                    "it, or build --from-db TUNE.jsonl)")
    library_db = from_db
    if libraries:
        from_db = None  # the database was the libraries'; the file's search spaces are skipped

    # A file may hold search spaces beside concrete kernels (or only those): they are skipped,
    # so `gemmgen build` can run over every file of a folder. Named with --kernel, a search
    # space is an error, as make_plan reports it.
    plans = []
    kernel_specs = [] if (kernel and of_libraries) else _load_specs(spec, kernel, target)
    shape = _parse_shapes(db_shape, None)[0] if db_shape else None
    for kernel_spec in kernel_specs:
        if not kernel_spec.is_concrete and from_db:
            from ..tuning.tune import best_recorded
            try:
                plan, record = best_recorded(kernel_spec, Path(from_db), shape)
            except LookupError as exc:
                _fail(str(exc))
            where = record["scope"].split("|")
            say(f"{kernel_spec.name}: best recorded point {record['point'] or record['key']} "
                f"({record['tflops']:.2f} TFLOP/s, {where[0]} at {where[2]})")
            plans.append(plan)
            continue
        if not kernel_spec.is_concrete and not kernel:
            say(f"skipped {kernel_spec.name}: a search space (run gemmgen tune)")
            continue
        plans.append(make_plan(kernel_spec))
    built = [lib.name for lib in libraries] + [plan.name for plan in plans]
    if one_file and len(built) > 1:
        raise click.UsageError(f"-o {output} names one file, and {spec} gives {len(built)} kernels "
                               f"({', '.join(built)}): name a folder (-o {out.with_suffix('')}/), "
                               "or pick one with --kernel NAME")
    if libraries and one_file and out.suffix != ".cu":
        raise click.UsageError(f"-o {output}: a library is written as a .cu file (or into a folder)")
    if libraries and emit != "cu":
        raise click.UsageError("a library is built as CUDA source (its .cu, .h and manifest): "
                               f"drop --emit {emit}")
    suffix = "h" if emit == "header" else emit
    targets = [(plan, out if one_file else out / f"{plan.name}.{suffix}") for plan in plans]
    # A .cu has its header beside it: NAME.h, or the -o file's name with .h.
    headers = {plan.name: path.with_suffix(".h") if emit == "cu" else path for plan, path in targets
               if emit in ("cu", "header")}
    # Every output is checked before anything is written.
    from . import library as cli_library
    for library in libraries:
        cli_library.check(library, output, manifest_path, inputs=_inputs(spec, [], library_db), force=force)
    check_outputs([path for _, path in targets if emit != "header"] + list(headers.values()),
                  inputs=_inputs(spec, kernel_specs, from_db), force=force)
    for library in libraries:
        try:
            cli_library.build(library, db=library_db, device=db_device, output=output,
                              manifest_path=manifest_path, console=console)
        except LookupError as exc:
            _fail(str(exc))
    for plan, path in targets:
        source = generate(plan)
        summary = []
        compiled = None
        if not no_compile or emit not in ("cu", "header"):
            compiled = compile_plan(plan, source)
            summary = _resources_summary(plan, compiled)
        if emit == "cu":
            write_output(path, source)
        if emit in ("cu", "header"):
            write_output(headers[plan.name], header_source(plan, path.with_suffix(".cu").name))
        elif emit == "ptx":  # PTX takes // comments: the first line says whose it is
            write_output(path, marker_line(plan.launcher_name, f": NVRTC's PTX for {compiled.target}")
                         + "\n" + compiled.ptx)
        else:
            write_output(path, compiled.cubin)
        written = f"{path} and {headers[plan.name].name}" if emit == "cu" else str(path)
        say(f"wrote {written}", *summary)


@main.command()
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
    from ..explain.report import as_dict, explain_all, kernels_to_explain, render_text

    if _libraries(spec, kernel):
        from . import library as cli_library
        from ..library.resolve import load_libraries
        summaries = [cli_library.summary(library) for library in load_libraries(spec, kernel)]
        if as_json:
            console.print_json(json.dumps(summaries))
        else:
            for summary in summaries:
                console.print(cli_library.render_summary(summary), soft_wrap=True)
        return
    from ..plan import make_plan
    specs, notes = kernels_to_explain(_load_specs(spec, kernel, target), named=kernel is not None)
    for note in notes:
        errors.print(note, markup=False, soft_wrap=True)
    plans = [make_plan(s) for s in specs]
    with _late_progress("explaining", len(plans)) as progress:
        reports = explain_all(plans, progress)
    if as_json:
        console.print_json(json.dumps([as_dict(r) for r in reports]))
    else:
        for report in reports:
            console.print(render_text(report))


def _parse_shapes(text: str | None, default):
    from ..gpu.verify import parse_case
    if not text:
        return default
    try:
        return tuple(parse_case(item) for item in text.split(";") if item.strip())
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--shapes") from None


shapes_help = ("Cases separated by ';', each MxNxK with optional ,alpha=,beta=,pad=,offset= "
               "(e.g. '4096x4096x4096;127x131x137,beta=0.5,pad=3').")


@main.command()
@spec_argument
@kernel_option
@click.option("--shapes", metavar="CASES", help=shapes_help + " Default: the full shape matrix.")
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
    from ..gpu.runtime import Kernel
    from ..gpu.verify import DEFAULT_CASES, QUICK_CASES, check as run_check, tolerance_rule

    _require_gpu()
    cases = _parse_shapes(shapes, QUICK_CASES if quick else DEFAULT_CASES)
    problems: dict = {}
    failed = False
    records = []
    plans = _plans(spec, kernel, None, layouts)
    check_outputs(filter(None, [json_path]), inputs=_inputs(spec, [p.spec for p in plans]), force=force)
    rules = "; ".join(tolerance_rule(m) for m in dict.fromkeys(p.spec["math"] for p in plans))
    table = Table(title=f"gemmgen check {spec}\ntolerance {rules}")
    for column in ("kernel", "layout", "case", "result", "max rel. error", "err/tol", "detail"):
        table.add_column(column)
    reports = []
    with _progress() as bar:
        task = bar.add_task("checking", total=len(plans) * len(cases))
        for plan in plans:
            bar.update(task, description=f"checking {plan.name} [{plan.layouts()}]")
            reports.append((plan, run_check(Kernel(plan), cases, seed=seed, problems=problems,
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
        _fail("some cases failed (see the table)")
    say(("all cases passed", "green"))


@main.command()
@spec_argument
@kernel_option
@click.option("--shapes", metavar="CASES",
              help=shapes_help + " Default: 1024^3, 2048^3, 4092^3, 4096^3, 8192^3, 127x4099x1023.")
@click.option("--json", "json_path", type=click.Path(), help="Write the results as JSON here.")
@click.option("--plot", "plot_path", type=click.Path(), help="Write a PNG: TFLOP/s per shape and a roofline.")
@click.option("--budget", type=float, default=0.5, show_default=True,
              help="Seconds of timed runs per kernel and shape (median of at least 5).")
@click.option("--devices", metavar="all|0,1,...",
              help="Split each GEMM over these GPUs (inputs on the first; rows, columns or K, whichever "
                   "moves the fewest bytes) and report scaling against one GPU, end to end and from "
                   "resident shards ('0,0' splits into two parts on one GPU).")
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
    """
    from ..gpu.bench import DEFAULT_SHAPES, L2Flusher, bench as run_bench, plot, timing_record
    from ..gpu.runtime import Kernel, device_info

    _require_gpu()
    if _libraries(spec, kernel):
        return _bench_libraries(spec, kernel, shapes, json_path, plot_path, budget, manifest_path, force)
    cases = _parse_shapes(shapes, DEFAULT_SHAPES)
    plans = _plans(spec, kernel, None)
    check_outputs(filter(None, [json_path, plot_path]), inputs=_inputs(spec, [p.spec for p in plans]),
                  force=force)
    if devices:
        return _bench_split(spec, kernel, cases, devices, json_path)
    info = device_info()
    flusher = L2Flusher(info)
    results = []
    with _progress() as bar:
        task = bar.add_task("timing", total=len(plans) * len(cases))
        for plan in plans:
            kernel_obj = Kernel(plan)
            for case in cases:
                bar.update(task, description=f"timing {plan.name} at {case}")
                results.append(run_bench(kernel_obj, case, info=info, flusher=flusher, budget_s=budget))
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


def _bench_libraries(spec, kernel, shapes, json_path, plot_path, budget, manifest_path, force):
    """bench of a library: per shape, the member it chooses beside cuBLAS (default: its tuned shapes)."""
    from . import library as cli_library
    from ..gpu.bench import plot_library
    from ..library.resolve import load_libraries
    from ..gpu.verify import Case

    rows = []
    check_outputs(filter(None, [json_path, plot_path]), inputs=_inputs(spec, [], manifest_path), force=force)
    for library in load_libraries(spec, kernel):
        path = Path(manifest_path) if manifest_path else Path("generated") / f"{library.name}.json"
        complete_pending(path)  # an interrupted build of the library is finished first
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            _fail(f"cannot read the manifest of library {library.name} ({path}): "
                  f"{getattr(exc, 'strerror', None) or exc}; run gemmgen tune on it, or build --from-db")
        default = tuple(Case(s.M, s.N, s.K, pad=s.pad) for s in library.shapes)
        rows += cli_library.bench(library, manifest, _parse_shapes(shapes, default), budget=budget,
                                  console=console, progress_factory=_progress)
    if json_path:
        from ..gpu.bench import timing_record
        from ..gpu.runtime import device_info
        write_output(json_path, json.dumps(timing_record(device_info(), rows), indent=2))
    if plot_path:
        plot_library([{"shape": r["shape"], "ratio": r["cublas_ms"] / r["ms"], "member": r["member"],
                       "tuned": r["tuned_shape"]} for r in rows], rows[0]["baseline"] if rows else "cuBLAS",
                     f"{', '.join(dict.fromkeys(r['library'] for r in rows))}: bench", plot_path)
        say(f"wrote {plot_path}")


def _strategy_options(items: tuple[str, ...]) -> dict:
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r}: use NAME=VALUE", param_hint="--option")
        try:
            options[key] = int(value)
        except ValueError:
            options[key] = float(value)
    return options


def _bench_split(spec, kernel, cases, devices_text, json_path):
    """bench --devices: each shape split over several GPUs, beside one GPU on the whole of it."""
    from ..multigpu.parts import AXIS_NAMES
    from ..multigpu.scaling import measure_scaling, parse_devices
    from ..gpu.runtime import device_count, device_info

    try:
        devices = parse_devices(devices_text, device_count())
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--devices") from None
    names = ", ".join(f"{d}: {device_info(d).name}" for d in sorted(set(devices)))
    n = len(devices)
    table = Table(title=f"split over devices {devices} ({names}); inputs and C on GPU {devices[0]}",
                  caption=f"scaling: TFLOP/s over {n} x one GPU's; end to end includes the copies, "
                          "resident starts from shards already on each GPU; each is the host time of "
                          "a call until C is complete, the three timed in turns (medians of 3)")
    for column in ("kernel", "shape", "split", "per-GPU kernel ms", "1 GPU TFLOP/s",
                   f"{n} GPUs end to end TFLOP/s (scaling)", "resident TFLOP/s (scaling)", "check"):
        table.add_column(column, justify="right")
    records, failed = [], False
    for plan in _plans(spec, kernel, None):
        for case in cases:
            report, worst = measure_scaling(plan, case.M, case.N, case.K, devices)
            ok = worst <= 1.0
            failed |= not ok
            split = report.split
            table.add_row(plan.name, str(case), f"{AXIS_NAMES[split.axis]}",
                          " ".join(f"{ms:.2f}" for ms in split.kernel_ms.values()),
                          f"{report.one_gpu_tflops:.1f}",
                          f"{report.end_to_end_tflops:.1f} ({report.scaling(report.end_to_end_tflops):.2f} x {n})",
                          f"{report.resident_tflops:.1f} ({report.scaling(report.resident_tflops):.2f} x {n})",
                          styled("ok", "green") if ok else styled(f"FAIL {worst:.2g}", "red"))
            records.append({"kernel": plan.name, "shape": str(case), "devices": devices,
                            "layouts": plan.layouts(), "math": plan.math, "axis": split.axis,
                            "parts": [vars(p) for p in split.parts], "steps": list(split.steps.values()),
                            "kernel_ms": list(split.kernel_ms.values()), "bytes_moved": split.bytes_moved,
                            "one_gpu_ms": report.one_gpu_ms, "one_gpu_tflops": report.one_gpu_tflops,
                            "one_gpu_kernel_ms": report.one_gpu_kernel_ms,
                            "kernel_tflops": report.kernel_tflops, "efficiency": report.efficiency,
                            "end_to_end_ms": split.end_to_end_ms,
                            "end_to_end_tflops": report.end_to_end_tflops,
                            "end_to_end_scaling": report.scaling(report.end_to_end_tflops),
                            "resident_ms": report.resident.end_to_end_ms,
                            "resident_tflops": report.resident_tflops,
                            "resident_scaling": report.scaling(report.resident_tflops),
                            "worst_error_ratio": worst})
    console.print(table)
    if json_path:
        from ..gpu.bench import timing_record
        write_output(json_path, json.dumps(timing_record(device_info(), records), indent=2))
    if failed:
        _fail("the split result differs from the float64 reference")


@main.command()
@spec_argument
@kernel_option
@click.option("--shapes", "shapes_text", default="4096x4096x4096", show_default=True, metavar="CASES",
              help="Problem size(s) to tune for, separated by ';'. Several shapes give one winner each.")
@click.option("--strategy", default="model", show_default=True,
              help="Search strategy, a module of gemmgen/strategies/: model (the cost model), exhaustive, "
                   "random_sample, or Optuna's tpe, cmaes and gp.")
@click.option("--option", "strategy_options", multiple=True, metavar="NAME=VALUE",
              help="A strategy option, e.g. --option seed=3 --option batch=8 (each strategy's "
                   "options: gemmgen/strategies/<name>.py, OPTIONS).")
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
    from ..tuning import strategies
    from ..codegen.c_header import dispatcher_header_source
    from ..codegen.cuda import dispatcher_source
    from ..plan.space import expand, to_text
    from ..language.load import load_one
    from ..tuning.distributed import ClusterError
    from ..tuning.measure import search_baseline
    from ..tuning.runner import check_labels
    from ..tuning.tune import plot_search, tune as run_tune

    try:
        strategies.get(strategy)  # unknown, or its library is missing: said before any GPU work
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--strategy") from None
    if scheduler and devices:
        raise click.BadParameter("a cluster's workers choose their GPUs: give --devices for a local "
                                 "cluster, or --scheduler for one started already", param_hint="--devices")
    if _libraries(spec, kernel):
        if scheduler or devices:
            raise click.BadParameter("a library is tuned on this host's first GPU; --devices and "
                                     "--scheduler are for search spaces", param_hint="--devices")
        from . import library as cli_library
        from ..library.resolve import load_libraries
        libraries = load_libraries(spec, kernel)
        check_database(db, inputs=[spec])
        for library in libraries:
            cli_library.check(library, output, manifest_path, inputs=_inputs(spec, [], db), force=force)
        check_outputs(filter(None, [json_path, plot_path]), inputs=_inputs(spec, [], db), force=force)
        _require_gpu()
        for library in libraries:
            cli_library.tune(library, db=Path(db), output=output, manifest_path=manifest_path,
                             strategy=strategy, options=_strategy_options(strategy_options),
                             max_points=max_points, anchors=anchors, per_shape=per_shape,
                             progress_factory=lambda: _progress(console, transient=False),
                             console=console, write_file=write_output, json_path=json_path,
                             plot_path=plot_path)
        return
    if not scheduler:  # with a scheduler, the GPUs are the workers', and this host may have none
        _require_gpu()
    shapes = _parse_shapes(shapes_text, None)
    device_list = None
    if devices:
        scheduler = "local"
        from ..multigpu.scaling import parse_devices
        from ..gpu.runtime import device_count
        try:
            device_list = parse_devices(devices, device_count())
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--devices") from None
    space_spec = load_one(spec, kernel)
    plot_paths = {shape: plot_path if len(shapes) == 1 else
                  str(Path(plot_path).with_suffix("")) + f"_{shape.M}x{shape.N}x{shape.K}.png"
                  for shape in shapes} if plot_path else {}
    # Before the search, not after it: a refused output costs nothing yet. The database is an input.
    dispatcher_header = Path(dispatcher).with_suffix(".h") if dispatcher else None
    check_outputs(filter(None, [save, dispatcher, dispatcher_header, json_path, *plot_paths.values()]),
                  inputs=_inputs(spec, [space_spec], db), force=force)
    check_database(db, inputs=_inputs(spec, [space_spec]))  # appended to, never replaced
    space = expand(space_spec)
    check_labels(Path(db), space)  # the records a search resumes from name their points
    pruned = ", ".join(f"{n} {why}" for why, n in space.pruned.most_common(4))
    console.print(f"{space_spec.name}: {space.total} points, {space.valid} valid after pruning"
                  + (f" (dropped: {pruned})" if pruned else ""))
    if space.valid:
        search_baseline(space)  # one precision per search: a SpecError before any GPU work
    options = _strategy_options(strategy_options)
    winners = []
    all_records = []
    if scheduler:  # one cluster (or connection) for every shape, closed when the command ends
        from ..tuning.distributed import connect
        cluster = contextlib.ExitStack()
        click.get_current_context().call_on_close(cluster.close)
        try:
            scheduler = cluster.enter_context(connect(scheduler, device_list))
        except ClusterError as exc:
            _fail(str(exc))
    for shape in shapes:
        total = min(space.valid, max_points or space.valid)
        best = {"tflops": 0.0, "point": ""}
        with _progress(console, transient=False) as bar:  # stays, with the best found
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
                result = run_tune(space_spec, shape, strategy=strategy, options=options,
                                  max_points=max_points, db=Path(db), progress=progress,
                                  devices=device_list, scheduler=scheduler)
            except ClusterError as exc:
                _fail(str(exc))
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
            _fail(f"no candidate passed validation at {shape}")
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


@main.command()
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
    from ..tuning import replay as rp
    from ..tuning import strategies
    from ..language.load import load_one
    from ..gpu.verify import parse_case

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
        _fail(f"no tuning database: replay reads {rp.TUNING}/*.jsonl in the current folder ({Path.cwd()}), "
              "as in a gemmgen checkout; run it there, or give --db FILE.jsonl")
    inputs = [spec, *db_paths] + ([Path(testbed or rp.TESTBED)] if testbed is not None else [])
    check_outputs(filter(None, [markdown_path, json_path]), inputs=inputs, force=force)
    if testbed is not None:
        if not Path(testbed or rp.TESTBED).is_file():
            _fail(f"no test bed at {testbed or rp.TESTBED} (in {Path.cwd()}): run replay in a gemmgen "
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
            _fail(str(exc))
    options = _strategy_options(strategy_options)
    outcomes = []
    with _progress() as bar:
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
            _fail(f"{check_name} misses the bar on {len(failures)} count(s)")
        say(f"{check_name}: within 3% with at most 10% of the points and within 1% with at most "
            "20% (median), and ahead of random_sample, on every recording")


from ..gpu.profile import profile_command  # noqa: E402

main.add_command(profile_command)
