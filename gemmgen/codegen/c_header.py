"""The C and C++ header beside a generated .cu: the entry point's prototype, the layouts, and what
a call needs to take the fast path, for a host program in C or C++ that links the kernel.

    #include "warptile.h"    // int gemmgen_warptile(int M, int N, int K, float alpha, ...);

The prototype is the .cu's own definition (codegen.abi_parameters), declared extern "C" for C++
and plain for C; everything else is comments made from the Plan's numbers.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from ..outputs import marker_line
from ..plan import Plan
from .cuda import abi_parameters, batched_abi_parameters, derived_numbers

# The rows of codegen.derived_numbers that say what a call needs to take the fast path.
_FAST_PATH_ROWS = ("TMA path needs", "otherwise", "vector path needs", "TMA store path needs")


def comment_lines(text: str, indent: str = "") -> list[str]:
    """`text` as // lines of at most 100 columns, continuation lines indented by two more."""
    lines = textwrap.wrap(text, 96 - len(indent), break_on_hyphens=False)
    return [f"// {indent}{line}" if i == 0 else f"// {indent}  {line}" for i, line in enumerate(lines)]


def _prototype(launcher: str, parameters: str) -> list[str]:
    """`int launcher(...);`, wrapped between parameters at 100 columns, aligned after the '('."""
    opening = f"int {launcher}("
    pieces = [p + "," for p in parameters.split(", ")]
    pieces[-1] = pieces[-1][:-1] + ");"
    lines = [opening]
    for piece in pieces:
        if lines[-1].strip() and len(lines[-1]) + 1 + len(piece) > 100:
            lines.append(" " * len(opening))
        lines[-1] += ("" if lines[-1].endswith("(") or not lines[-1].strip() else " ") + piece
    return lines


def contract_lines(plan: Plan) -> list[str]:
    """What the entry point computes, its arguments' rules and its return value."""
    minimums = ", ".join(f"{ld} >= max(1, {size})" for ld, size in plan.leading_dimension_minimums().items())
    lines = comment_lines(f"{plan.epilogue.contract} on device pointers, A M x K, B K x N, C M x N, on `stream` "
                          "(0: the default stream); lda, ldb and ldc are leading dimensions in elements.")
    lines += comment_lines(f"layout: {plan.layouts()} (row: X(i, j) at X[i * ldx + j]; col: at X[i + j * ldx])")
    lines += comment_lines(f"leading dimensions: {minimums}")
    lines += comment_lines("returns a cudaError_t: cudaSuccess (0), or cudaErrorInvalidValue, launching nothing, "
                           "for negative sizes, null pointers or leading dimensions below these"
                           + ("" if plan.beta else ", or a beta other than 0 (epilogue alpha: C is not read)")
                           + ".")
    for note in plan.epilogue.abi_notes + plan.scheduler.abi_notes:  # extra outputs, split K's atomics
        lines += comment_lines(note)
    return lines


def batched_contract_lines(plan: Plan, launcher: str | None = None) -> list[str]:
    """What the batched entry point adds (none: a fused reduction's kernel has none). `launcher`:
    the entry point over several kernels like `plan` (a library's), else the plan's own."""
    if batched_abi_parameters(plan) is None:
        return comment_lines("no batched entry point: the fused reduction ranks the entries of one C.")
    return comment_lines(f"{launcher or plan.launcher_name}_batched: strided batches, as cuBLAS's SgemmStridedBatched: "
                         "`batch` products, batch b's A, B and C at A + b * strideA, B + b * strideB, "
                         "C + b * strideC (strides in elements). A stride of 0 gives every batch the same A "
                         "(or B); batch 0 does nothing and returns cudaSuccess. cudaErrorInvalidValue, "
                         "launching nothing, for the single GEMM's reasons, a negative batch or stride, or "
                         "batches of C that overlap (batch > 1 with strideC below C's extent, "
                         + ("(M - 1) * ldc + N" if plan.c_layout == "row" else "(N - 1) * ldc + M")
                         + "). The single GEMM is its call with batch 1."
                         + (" TMA loads batches of A (B) whose stride is 0, or a multiple of 4 and at least "
                            "M * lda (N * ldb); other batched calls run the fallback."
                            if plan.mainloop.tma and launcher is None else ""))


def fast_path_lines(plan: Plan, indent: str = "") -> list[str]:
    """What a call needs for the fast path, as the Plan derived it (none: scalar accesses only)."""
    if not plan.vector_requirements() and plan.mainloop.fallback is None:
        return comment_lines("nothing: every access is scalar, so every call runs the same kernel", indent)
    rows = dict(derived_numbers(plan))
    return [line for label in _FAST_PATH_ROWS if label in rows
            for line in comment_lines(f"{label}: {rows[label]}", indent)]


def assemble_header(launcher: str, first_line: str, about: list[str], parameters: str,
                    batched: str | None = None, more: list[str] = ()) -> str:
    """A header: `first_line`, the `about` comment lines, then the prototype of `launcher`
    (`parameters` as abi_parameters gives them), of its batched entry point (`batched`, where it
    has one) and the lines of `more` (other prototypes) for C and C++, in an include guard."""
    guard = f"{launcher.upper()}_H"
    prototypes = _prototype(launcher, parameters)
    if batched:
        prototypes += ["", *_prototype(f"{launcher}_batched", batched)]
    for line in more:
        prototypes += ["", line]
    lines = [first_line, "//", *about, f"#ifndef {guard}", f"#define {guard}", "",
             "#include <cuda_runtime.h>", "", "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
             *prototypes, "", "#ifdef __cplusplus", "}", "#endif", "",
             f"#endif  // {guard}", ""]
    return "\n".join(lines)


def header_source(plan: Plan, source_name: str) -> str:
    """The header of the kernel whose .cu is `source_name` (the file beside it)."""
    spec_path = plan.spec.path
    origin = Path(spec_path).name if not spec_path.startswith("<") else spec_path
    about = comment_lines(f"The entry point of {source_name} for C and C++ programs: compile {source_name} "
                          "with nvcc (it is self-contained), include this header, and link both with the "
                          "CUDA runtime.")
    about += ["//", *contract_lines(plan), "//", *batched_contract_lines(plan), "//"]
    about += comment_lines("Any M, N, K >= 0, pointer alignment and leading dimension works; a call takes "
                           "the fast path when it meets these (batches: with strides that keep every "
                           "batch's pointers so aligned), and a slower variant of the kernel otherwise:")
    about += fast_path_lines(plan, "  ")
    about.append("")
    return assemble_header(plan.launcher_name,
                           marker_line(plan.launcher_name, f" from {origin} (edit the spec, not this file)"),
                           about, abi_parameters(plan), batched_abi_parameters(plan))
