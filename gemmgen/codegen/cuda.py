"""Lower a Plan to CUDA C through the Jinja templates: the kernel and its extern "C" launcher."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import jinja2
from jinja2.ext import Extension

from ..outputs import marker_line
from ..plan import Plan
from ..plan.parts.warpgroup_mainloop import TMA_BATCH_CHECKS


def _template_dir() -> Path:
    source_tree = Path(__file__).resolve().parent.parent.parent / "templates"
    if source_tree.is_dir():
        return source_tree
    return Path(str(resources.files("gemmgen.templates")))


class Hook(Extension):
    """`{% hook module.macro() | indented(4) %}`: the lines a part's macro gives (each indented by 4),
    where the part has some to give. A tag, not an expression, so that a macro that gives nothing
    leaves no blank line behind."""

    tags = {"hook"}

    def __init__(self, environment: jinja2.Environment):
        super().__init__(environment)
        environment.filters["indented"] = lambda text, width: "".join(
            " " * width + line if line.strip() else line for line in str(text).splitlines(keepends=True))

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        return jinja2.nodes.Output([parser.parse_expression()], lineno=lineno)


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_template_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        extensions=[Hook],
    )


@dataclass(frozen=True)
class LaunchChecks:
    """The launcher's argument checks as C expressions, made from the Plan's tables."""

    ld_checks: tuple[str, ...]
    aligned_condition: str
    internal: bool = False  # a fallback's launcher: static, called by the file's own entry point
    c_extent: str = "0"     # C expression: floats from C's first element past its last (batches at least this far apart)
    exported_batched: bool = True  # the batched launcher is an entry point (else only the single GEMM's calls it)

    tma_batch_conditions: tuple[str, ...] = TMA_BATCH_CHECKS  # TMA can step through A's and B's batches

    @property
    def single_linkage(self) -> str:
        """The single GEMM's entry point: static inline in a file whose own entry point calls it."""
        return "static inline int" if self.internal else 'extern "C" int'

    @property
    def batched_linkage(self) -> str:
        return 'extern "C" int' if self.exported_batched and not self.internal else "static inline int"


@dataclass(frozen=True)
class WgmmaOperands:
    """The inline-PTX operand lists of one wgmma: a thread's BN / 2 accumulators, in the order the
    instruction numbers them (per 8 columns j: row g cols 2t, 2t+1, then row g + 8), then A, B."""

    placeholders: str
    outputs: str
    a_operand: int
    b_operand: int
    scale_operand: int


def _wgmma_operands(plan: Plan) -> WgmmaOperands:
    order = [(i, 2 * j + v) for j in range(plan.BN // 8) for i in (0, 1) for v in (0, 1)]
    count = len(order)
    return WgmmaOperands(
        placeholders=", ".join(f"%{n}" for n in range(count)),
        outputs=", ".join(f'"+f"(acc[{"SLAB * TM + " if plan.RM > 1 else ""}{i}][{j}])' for i, j in order),
        a_operand=count, b_operand=count + 1, scale_operand=count + 2)


def launch_checks(plan: Plan, internal: bool = False) -> LaunchChecks:
    """A launcher's argument checks, as C expressions (an entry point over several kernels repeats
    the leading dimensions' ones)."""
    ld_checks = tuple(f"{ld} < ({size} > 1 ? {size} : 1)"
                      for ld, size in plan.leading_dimension_minimums().items())
    terms = []
    for ptr, size, ld, vec in plan.vector_requirements():  # every batch's pointer aligned as the first
        terms.append((f"{size} % {vec} == 0 && " if size else "") + f"{ld} % {vec} == 0 && "
                     f"reinterpret_cast<unsigned long long>({ptr}) % {4 * vec} == 0 && stride{ptr} % {vec} == 0")
    condition = " &&\n        ".join(f"({t})" for t in terms) if terms else "true"
    batch_checks = plan.mainloop.batch_checks if plan.mainloop.tma else TMA_BATCH_CHECKS
    return LaunchChecks(ld_checks, condition, internal, plan.c.c_extent, exported_batched=not plan.reduce_count,
                        tma_batch_conditions=batch_checks)


def abi_parameters(plan: Plan) -> str:
    """The launcher's parameters, as the C ABI has them (a fused reduction adds three outputs)."""
    extra = plan.epilogue.abi_parameters
    return ("int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb, "
            f"float beta, float *C, int ldc, {extra}cudaStream_t stream")


def abi_signature(plan: Plan) -> str:
    return f'extern "C" int {plan.launcher_name}({abi_parameters(plan)});'


BATCH_ABI = "int batch, long long strideA, long long strideB, long long strideC, "


def batched_abi_parameters(plan: Plan) -> str | None:
    """The batched entry point's parameters (the single GEMM's, then the batches' before the
    stream), or None where there is none (a fused reduction ranks the entries of one C)."""
    if plan.reduce_count:
        return None
    return abi_parameters(plan).replace("cudaStream_t stream", BATCH_ABI + "cudaStream_t stream")


def derived_numbers(plan: Plan) -> list[tuple[str, str]]:
    """The Plan's numbers a reader of the kernel wants, as (label, value) rows (its parts')."""
    return plan.rows()


def header(plan: Plan, internal: bool = False) -> str:
    spec = plan.spec
    origin = Path(spec.path).name if not spec.path.startswith("<") else spec.path
    lines = [marker_line(plan.launcher_name, f" from {origin} (edit the spec, not this file)"), "//", "// spec:"]
    lines += [f"//   {line}".rstrip() for line in spec.source.splitlines()]
    if spec.parent:
        lines.append(f"//   (settings not given above come from '{spec.parent}')")
    lines += ["//", f"// layout: {plan.layouts()}", "//", "// derived by the Plan:"]
    width = max(len(label) for label, _ in derived_numbers(plan))
    lines += [f"//   {label.ljust(width)}  {value}" for label, value in derived_numbers(plan)]
    if internal:
        static = abi_signature(plan).replace('extern "C" int', "static int")
        lines += ["//", "// launcher (called by this file's entry point):", f"//   {static}"]
    else:
        lines += ["//", "// C ABI:", f"//   {abi_signature(plan)}"]
        batched = batched_abi_parameters(plan)
        if batched:
            lines.append(f'//   extern "C" int {plan.launcher_name}_batched({batched});')
    return "\n".join(lines)


def generate(plan: Plan, *, internal: bool = False) -> str:
    """The complete .cu source of a Plan. `internal`: its launcher is static, for a file (a
    library) whose own entry point calls it."""
    fallback = plan.mainloop.fallback  # a TMA kernel's file holds the kernel for calls TMA cannot take
    fallback_source = _environment().get_template("kernel.cu.j2").render(
        plan=fallback, header="", launch=launch_checks(fallback, internal=True), c=fallback.c,
        wgmma=_wgmma_operands(fallback)) if fallback else ""
    return _environment().get_template(plan.mainloop.frame).render(
        plan=plan, header=header(plan, internal), launch=launch_checks(plan, internal), c=plan.c,
        wgmma=_wgmma_operands(plan), fallback_source=fallback_source.strip("\n"))


def kernel_name_expressions(plan: Plan) -> dict[bool, str]:
    """C++ names of the two kernel variants (aligned, unaligned), for NVRTC to lower."""
    qualified = f"{plan.launcher_name}_impl::{plan.kernel_name}"
    return {True: f"{qualified}<true>", False: f"{qualified}<false>"}


def render_template(name: str, **values) -> str:
    """A template of templates/ rendered with `values` (a kernel that no Plan describes, e.g. the
    transposing copy of gemmgen/gpu/transpose.py)."""
    return _environment().get_template(name).render(**values)
