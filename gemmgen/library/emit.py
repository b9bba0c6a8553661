"""The files of one extern "C" entry point over several kernels: a library's .cu (its manifest's
members with static launchers, the choice of member per call in C, gemmgen_<library> and its strided
batches' gemmgen_<library>_batched) and the .cu of `gemmgen tune --dispatcher` (a search's winners,
the one tuned for the nearest shape chosen per call), both rendered from templates/entry_point.cu.j2;
and their C/C++ headers. The members' code is
codegen's (generate, the launcher's checks, the header's pieces)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from ..codegen.c_header import (assemble_header, batched_contract_lines, comment_lines, contract_lines,
                                fast_path_lines)
from ..codegen.cuda import abi_parameters, batched_abi_parameters, generate, launch_checks, render_template
from ..gpu.verify import Case
from ..outputs import marker_line
from ..plan import Plan, make_plan
from ..plan.space import describe, point_key
from .manifest import Manifest
from .padding import c_rows
from .selection import (BANDWIDTH, DECODE_ONLY_ROWS, DECODE_ROWS, DECODE_ROWS_PER_READ, DECODE_TENSOR_WORK_ROWS, PAD_COPY_MS,
                        PAD_GAIN, PAD_GB_PER_MS, PAD_ROW_FLOATS, PRIOR, ffma_decode,
                        short_sum_rows)



def library_source(manifest: Manifest, origin: str, source_lines: list[str]) -> str:
    """One .cu for a library manifest (manifest.py): every kept member with a static launcher, the
    choice of member per call in C (selection.py's arithmetic), and extern "C" gemmgen_<library>
    and gemmgen_<library>_batched."""
    plans = manifest.plans()
    members = []
    for member in manifest.members:
        models = {}
        for cls, model in member.models.items():
            if model:
                points = [[int(M), int(N), int(K)] + [repr(float(x)) for x in fitted]
                          + [int(batch), repr(float(lb)), int(split)]
                          for M, N, K, *fitted, batch, lb, split in model.points]
                models[cls] = SimpleNamespace(points=points, coef=[repr(float(c)) for c in model.coef],
                                              split_ratio=repr(float(model.split_ratio)))
            else:
                models[cls] = None
        members.append(SimpleNamespace(**{**vars(member), "models": models,
                                          "decode_products": member.shape.decode_products}))
    first = plans[0]
    cc = manifest.device.compute_capability
    portable = manifest.portable_index
    lib = SimpleNamespace(
        name=manifest.library, source_lines=source_lines,
        precision_words=("FP32-accurate (timed against cuBLAS FP32)" if manifest.precision == "fp32"
                         else "TF32 inputs (timed against cuBLAS TF32)"),
        layouts=first.layouts(), device=manifest.device.name, sm_count=manifest.device.sm_count,
        driver=manifest.device.driver, shape_count=len(manifest.shapes),
        candidates=manifest.candidates_timed, members=members,
        name_width=max(len(m.name) for m in members), stream_k=any(m.stream_k for m in members),
        clusters=any(tuple(m.cluster) != (1, 1) for m in members),
        decode_template="library_decode.cuh.j2" if any(m.decode for m in members) else "library_plain.cuh.j2",
        decode_rows=DECODE_ROWS, decode_rows_per_read=DECODE_ROWS_PER_READ,
        decode_tensor_work_rows=repr(float(DECODE_TENSOR_WORK_ROWS)),
        # the fp32 library's calls of few rows: FFMA decode members only (selection.short_sum_call)
        short_sum_rows=short_sum_rows(manifest.precision) if any(ffma_decode(m.shape) for m in manifest.members) else 0,
        # a matrix-vector product: FFMA decode members only, where there is one (selection.vector_call)
        vector_rule="true" if any(ffma_decode(m.shape) for m in manifest.members) else "false",
        # an aligned call of N <= DECODE_ROWS (below M) or of M <= DECODE_ONLY_ROWS (below N): decode members
        # only, where one has aligned models (decode_call)
        decode_rule="true" if any(m.decode and m.models.get("aligned") for m in manifest.members) else "false",
        decode_only_rows=DECODE_ONLY_ROWS,
        loo_median=manifest.leave_one_out.median, loo_worst=manifest.leave_one_out.worst,
        cc=f"{cc[0]}.{cc[1]}", cc_major=cc[0], cc_minor=cc[1], portable=portable,
        portable_name=members[portable].name, prior=repr(PRIOR), bandwidth=repr(BANDWIDTH),
        # the argument checks of the members' launchers (launcher_checks.cuh.j2), for any beta
        beta=True, launch=launch_checks(first),
        # padding (padding.py, selection.choose_padded): each operand's stored rows and floats a row
        pad=SimpleNamespace(rows=c_rows(manifest.layout), round="true" if manifest.precision == "tf32" else "false",
                            gb_per_ms=repr(PAD_GB_PER_MS), row_floats=PAD_ROW_FLOATS, copy_ms=repr(PAD_COPY_MS),
                            gain=repr(PAD_GAIN)),
        signatures=[f'extern "C" int gemmgen_{manifest.library}({abi_parameters(first)});',
                    f'extern "C" int gemmgen_{manifest.library}_batched({batched_abi_parameters(first)});',
                    f'extern "C" int gemmgen_{manifest.library}_release_workspace(void);'])
    return render_template(
        "library.cu.j2", lib=lib, entry=manifest.library, members=members, extra_parameters="", extra_arguments="",
        batched_linkage='extern "C" int',
        first_line=marker_line(f"gemmgen_{manifest.library}", f" from {origin} (edit the spec, not this file)"),
        member_sources=[generate(plan, internal=True).strip("\n") for plan in plans])


def library_header_source(manifest: Manifest, plan: Plan, source_name: str) -> str:
    """The header of a library's .cu (manifest.py's manifest; `plan` any member, for the layouts)."""
    launcher = f"gemmgen_{manifest.library}"
    about = comment_lines(f"The entry point of {source_name} for C and C++ programs: compile {source_name} "
                          "with nvcc (-gencode arch=compute_90a,code=sm_90a, and any other targets), include "
                          "this header, and link both with the CUDA runtime. Each call runs the member "
                          "predicted fastest for its shape and alignment on this GPU; a GPU of another "
                          "compute capability than the one tuned for runs the portable member.")
    about += ["//", *contract_lines(plan), "//", *batched_contract_lines(plan, launcher), "//"]
    about += comment_lines(f"Tuned on {manifest.device.name} at {len(manifest.shapes)} shapes; "
                           f"{manifest.precision} ({manifest.baseline}'s precision). Any M, N, K >= 0, "
                           "pointer alignment and leading dimension works; a batch is chosen for by its "
                           "matrices' M, N, K, its batch count and its strides' alignment.")
    about += ["//"] + comment_lines(
        "A call whose rows are not 16-byte aligned may copy its unaligned operands into workspace whose "
        "rows are, where the model says that pays, and run an aligned member there (stream-ordered, from a "
        "memory pool of this library's own, none while the stream captures a graph). The pool keeps what it "
        f"has held between calls; {launcher}_release_workspace() gives it back to the current device, once "
        "the device's queued work is done (a cudaError_t).")
    about.append("")
    return assemble_header(launcher, marker_line(launcher, ": a library (tune it again, do not edit this file)"),
                           about, abi_parameters(plan), batched_abi_parameters(plan),
                           more=[f"int {launcher}_release_workspace(void);"])


# --- tune --dispatcher: a search's winners behind one entry point -----------------------------------

def dispatcher_members(name: str, winners: list[tuple[Case, Plan]]) -> tuple[list[Plan], list[int]]:
    """The distinct kernels of (shape, Plan) winners, renamed <name>_0, <name>_1, ... in order of
    first appearance, and for each shape the index of its kernel. ValueError for winners that
    differ in layouts, epilogue or reduction (one entry point takes one set of arguments)."""
    def calling(plan: Plan) -> tuple:  # what the entry point computes, and its arguments
        return plan.layouts(), plan.beta, plan.reduce_count, plan.epilogue.contract, plan.epilogue.abi_parameters

    first = winners[0][1]
    for _, plan in winners[1:]:
        if calling(plan) != calling(first):
            raise ValueError("a dispatcher's kernels must share layouts, epilogue and reduction")
    keys: dict[str, int] = {}
    members, chosen = [], []
    for _, plan in winners:
        key = point_key(plan.spec)
        if key not in keys:
            keys[key] = len(members)
            members.append(make_plan(replace(plan.spec, name=f"{name}_{len(members)}")))
        chosen.append(keys[key])
    return members, chosen


def dispatcher_source(name: str, winners: list[tuple[Case, Plan]]) -> str:
    """One self-contained .cu: each distinct winner with a static launcher, and extern "C"
    gemmgen_<name> with the C ABI of the winners, which runs, for the M, N, K it is called with,
    the kernel tuned for the nearest shape (the smallest sum of |log| ratios of M, N and K), and
    gemmgen_<name>_batched for strided batches (extern "C" where the winners' is: not for a fused
    reduction's)."""
    members, chosen = dispatcher_members(name, winners)
    shapes = [shape for shape, _ in winners]
    views = [SimpleNamespace(name=plan.name, point=describe(plan.spec), target=plan.arch.name,
                             shapes=", ".join(f"{s.M}x{s.N}x{s.K}" for s, i in zip(shapes, chosen) if i == index))
             for index, plan in enumerate(members)]
    epilogue = members[0].epilogue  # its vectors and a reduction's outputs follow ldc
    batched = batched_abi_parameters(members[0])
    return render_template(
        "dispatcher.cu.j2", entry=name, members=views, extra_parameters=epilogue.abi_parameters,
        extra_arguments=epilogue.abi_arguments, name_width=max(len(v.name) for v in views),
        tuned=[(s.M, s.N, s.K, i) for s, i in zip(shapes, chosen)], layouts=members[0].layouts(),
        targets=sorted({plan.arch.name for plan in members}),
        batched_linkage=launch_checks(members[0]).batched_linkage,
        signatures=[f'extern "C" int gemmgen_{name}({abi_parameters(members[0])});']
        + ([f'extern "C" int gemmgen_{name}_batched({batched});'] if batched else []),
        first_line=marker_line(f"gemmgen_{name}", ": a dispatcher over the winners of `gemmgen tune` at "
                               + ", ".join(f"{s.M}x{s.N}x{s.K}" for s in shapes)),
        member_sources=[generate(plan, internal=True).strip("\n") for plan in members])


def dispatcher_header_source(name: str, winners: list[tuple[Case, Plan]], source_name: str) -> str:
    """The header of a `gemmgen tune --dispatcher` file (dispatcher_source's)."""
    launcher = f"gemmgen_{name}"
    members, chosen = dispatcher_members(name, winners)
    about = comment_lines(f"The entry point of {source_name} for C and C++ programs: compile {source_name} "
                          "with nvcc, include this header, and link both with the CUDA runtime. Each call "
                          "goes to the kernel tuned for the nearest shape.")
    about += ["//", *contract_lines(members[0]), "//", *batched_contract_lines(members[0], launcher), "//"]
    about += comment_lines("Any M, N, K >= 0, pointer alignment and leading dimension works; each kernel "
                           "takes its fast path when a call meets these, and a slower variant otherwise:")
    for (shape, _), index in zip(winners, chosen):
        about += comment_lines(f"tuned at {shape.M}x{shape.N}x{shape.K} ({members[index].name}):", "  ")
        about += fast_path_lines(members[index], "    ")
    about.append("")
    return assemble_header(launcher, marker_line(launcher, ": the dispatcher of `gemmgen tune` (tune again, "
                                                           "do not edit this file)"),
                           about, abi_parameters(members[0]), batched_abi_parameters(members[0]))
