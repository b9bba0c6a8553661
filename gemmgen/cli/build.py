"""`gemmgen build`: a kernel's .cu and header (or NVRTC's PTX or cubin), a search space's best recorded
point, or a library from its measurements."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..codegen import cuda
from ..codegen.c_header import header_source
from ..codegen.cuda import kernel_name_expressions
from ..gpu.compile import compile_plan
from ..library.resolve import load_libraries
from ..outputs import check_outputs, marker_line, write_output
from ..plan import make_plan
from ..tuning.database import Scope
from ..tuning.tune import best_recorded
from . import library as cli_library
from .common import (acts_on_libraries, fail, force_option, input_paths, kernel_option, load_specs, parse_shapes,
                     spec_argument, target_option)
from .terminal import out as console, say

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
    fast = compiled.resources_of(kernel_name_expressions(plan)[True])
    most = max(r.registers for r in compiled.resources.values())
    spilled = sum(r.spill_stores + r.spill_loads for r in compiled.resources.values())
    registers = f"{fast.registers} registers" + (f" ({most} in its other variants)" if most > fast.registers else "")
    return [f" ({plan.arch.name}: {registers}, {plan.smem_bytes} B shared, ",
            (f"spills {spilled} B", "red") if spilled else "no spills", ")"]


@click.command()
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

    if output and not Path(output).is_dir():  # an input, or a file not ours, said before its suffix
        check_outputs([output], inputs=[spec, from_db], force=force)
    emit, out, one_file = _build_target(output, emit, no_compile)
    libraries = []
    of_libraries = acts_on_libraries(spec, kernel)
    if of_libraries:
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
    kernel_specs = [] if (kernel and of_libraries) else load_specs(spec, kernel, target)
    shape = parse_shapes(db_shape, None)[0] if db_shape else None
    for kernel_spec in kernel_specs:
        if not kernel_spec.is_concrete and from_db:
            try:
                plan, record = best_recorded(kernel_spec, Path(from_db), shape)
            except LookupError as exc:
                fail(str(exc))
            where = Scope.of(record)
            say(f"{kernel_spec.name}: best recorded point {record['point'] or record['key']} "
                f"({record['tflops']:.2f} TFLOP/s, {where.device} at {where.what})")
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
    for library in libraries:
        cli_library.check(library, output, manifest_path, inputs=input_paths(spec, [], library_db), force=force)
    check_outputs([path for _, path in targets if emit != "header"] + list(headers.values()),
                  inputs=input_paths(spec, kernel_specs, from_db), force=force)
    for library in libraries:
        try:
            cli_library.build(library, db=library_db, device=db_device, output=output,
                              manifest_path=manifest_path, console=console)
        except LookupError as exc:
            fail(str(exc))
    for plan, path in targets:
        source = cuda.generate(plan)
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
