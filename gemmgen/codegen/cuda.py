"""Lower a Plan to CUDA C through the Jinja templates: the kernel and its extern "C" launcher."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import jinja2

from ..outputs import marker_line
from ..plan import Plan
from ..plan.schedule import describe as describe_schedule


def _template_dir() -> Path:
    source_tree = Path(__file__).resolve().parent.parent.parent / "templates"
    if source_tree.is_dir():
        return source_tree
    return Path(str(resources.files("gemmgen.templates")))


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_template_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


@dataclass(frozen=True)
class LaunchChecks:
    """The launcher's argument checks as C expressions, made from the Plan's tables."""

    ld_checks: tuple[str, ...]
    aligned_condition: str
    internal: bool = False  # a fallback's launcher: static, called by the file's own entry point


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
    for ptr, size, ld, vec in plan.vector_requirements():
        terms.append((f"{size} % {vec} == 0 && " if size else "") + f"{ld} % {vec} == 0 && "
                     f"reinterpret_cast<unsigned long long>({ptr}) % {4 * vec} == 0")
    condition = " &&\n        ".join(f"({t})" for t in terms) if terms else "true"
    return LaunchChecks(ld_checks, condition, internal)


def abi_parameters(plan: Plan) -> str:
    """The launcher's parameters, as the C ABI has them (a fused reduction adds three outputs)."""
    extra = ("float *smallest_values, int *smallest_rows, int *smallest_cols, "
             if plan.reduce_count else "")
    return ("int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb, "
            f"float beta, float *C, int ldc, {extra}cudaStream_t stream")


def abi_signature(plan: Plan) -> str:
    return f'extern "C" int {plan.launcher_name}({abi_parameters(plan)});'


def _wgmma_numbers(plan: Plan) -> list[tuple[str, str]]:
    shape = " x ".join(map(str, plan.mma_shape))
    terms = " (three per step: small*big, big*small, big*big)" if plan.math == "3xtf32" else ""
    if plan.tma:
        per_stage = "A and B tiles" + (" and B's TF32 remainders" if plan.math == "3xtf32" else "")
        rows = [
            ("target", f"{plan.arch.name} (wgmma + TMA)"),
            ("block tile (BM x BN x BK)", f"{plan.BM} x {plan.BN} x {plan.BK}"),
            ("math", f"{plan.math}, wgmma {shape} per consumer warpgroup and K step{terms}"),
            ("threads per block", f"{plan.threads}: 1 producer warpgroup (TMA) + {plan.consumers} consumer "
                                  f"warpgroup(s) of 64 x {plan.BN}"),
            ("accumulators", f"{plan.BN // 2} floats per consumer thread"),
            ("shared memory", f"{plan.stages} stages of {per_stage}, K-major, 128-byte swizzle; "
                              f"{plan.smem_bytes} bytes per block"),
        ]
    else:
        remainders = "A's and B's TF32 remainders" if plan.math == "3xtf32" else ""
        rows = [
            ("target", f"{plan.arch.name} (wgmma fed through registers)"),
            ("block tile (BM x BN x BK)", f"{plan.BM} x {plan.BN} x {plan.BK}"),
            ("math", f"{plan.math}, wgmma {shape} per consumer warpgroup and K step{terms}"),
            ("threads per block", f"{plan.threads}: {plan.loaders} loader warpgroup(s), {plan.loader_depth} K "
                                  f"tile(s) in flight each, + {plan.consumers} consumer warpgroup(s) of "
                                  f"64 x {plan.BN}"),
            ("registers", f"{plan.loader_registers} per loader thread, {plan.consumer_registers} per "
                          f"consumer thread (setmaxnreg); {plan.BN // 2} accumulators"),
            ("shared memory", f"{plan.stages} stages of A and B tiles rounded to TF32"
                              + (f" and {remainders}" if remainders else "")
                              + f", K-major, 128-byte swizzle; {plan.smem_bytes} bytes per block"),
            ("loads", "; ".join(f"{x}: " + ("16 B along K when aligned, else 4 B" if k_major else
                                            "4 B along its contiguous rows, transposed into place")
                                for x, k_major in (("A", plan.spec["layout.A"] == "row"),
                                                   ("B", plan.spec["layout.B"] == "col")))),
        ]
    if plan.scheduled:
        rows.append(("schedule", describe_schedule(plan)))
    rows += [
        ("raster", "row order" if plan.raster_group == 1 else f"groups of {plan.raster_group} block rows"),
        ("epilogue", ("alpha * A*B + beta * C" if plan.beta else "alpha * A*B") + (
            f"; through shared memory: each consumer warp writes its 16 rows in boxes of {plan.c_box_outer} x "
            f"{plan.c_box_inner} floats ({plan.c_buffers} in turn, {plan.c_box_swizzle}-byte swizzle), "
            "each stored by TMA" if plan.tma_store else "")),
    ]
    if plan.split_k > 1:
        rows.append(("split K", f"{plan.split_k} slices of the K tiles per C tile (blockIdx.y), added into C "
                     "with atomicAdd after C = beta * C"))
    if plan.tma:
        rows += [
            ("TMA path needs", "K >= 1; A and B 16-byte aligned, lda and ldb multiples of 4"),
            ("otherwise", f"the fallback {plan.fallback.launcher_name}: wgmma fed through registers "
                          f"(block {plan.fallback.BM} x {plan.fallback.BN} x {plan.fallback.BK}, "
                          f"{plan.fallback.stages} stages, {plan.fallback.loaders} loader warpgroups)"),
        ]
    rows.append(("TMA store path needs" if plan.tma_store else "vector path needs",
                 _vector_needs(plan) or "nothing"))
    return rows


def _vector_needs(plan: Plan) -> str:
    return ", ".join((f"{size} and {ld} multiples of {vec}" if size else f"{ld} a multiple of {vec}")
                     + f", {ptr} {4 * vec}-byte aligned" for ptr, size, ld, vec in plan.vector_requirements())


def derived_numbers(plan: Plan) -> list[tuple[str, str]]:
    """The Plan's numbers a reader of the kernel wants, as (label, value) rows."""
    if plan.consumers:
        return _wgmma_numbers(plan)
    rows = [
        ("target", plan.arch.name),
        ("block tile (BM x BN x BK)", f"{plan.BM} x {plan.BN} x {plan.BK}"),
    ]
    if plan.warp_tiling:
        rows.append(("warp tile (WM x WN)", f"{plan.WM} x {plan.WN}, "
                     f"{plan.warps_m} x {plan.warps_n} warps"))
    if plan.mma_shape:
        how = {True: "ldmatrix", False: "scalar shared loads"}
        rows += [
            ("math", f"{plan.math} on the tensor cores, mma.sync {' x '.join(map(str, plan.mma_shape))}"
                     + (" (three per tile: small*big, big*small, big*big)" if plan.math == "3xtf32" else "")),
            ("MMA tiles per warp", f"{plan.RM} x {plan.RN} = {plan.accumulators} accumulators per lane"),
            ("fragments", f"A by {how[plan.ldmatrix_a]}, B by {how[plan.ldmatrix_b]}, rounded to TF32"),
        ]
    else:
        rows.append(("thread tile (TM x TN) x repeat", f"{plan.TM} x {plan.TN} x {plan.RM} x {plan.RN} "
                     f"= {plan.accumulators} accumulators"))
    rows += [
        ("threads per block", f"{plan.threads} ({plan.warps} warps), lanes {plan.lanes_m} x "
         f"{plan.lanes_n}, consecutive threads along {plan.order.upper()}"),
    ]
    if plan.uses_shared:
        for op in (plan.a, plan.b):
            how = "transposed through registers" if op.transposed_store else "as laid out"
            rows.append((f"{op.name} loads", f"{op.passes} x {op.vector} float(s) per thread per tile, "
                         f"{how}"))
            rows.append((f"shared {op.name}", op.describe()))
        rows.append(("stages", f"{plan.stages} ({'cp.async' if plan.async_copy else 'through registers'})"
                     f", fragments {plan.fragments}"))
        rows.append(("shared memory per block", f"{plan.smem_bytes} bytes"))
    else:
        rows.append(("shared memory per block", "none (operands read from global memory)"))
    rows.append(("raster", "row order" if plan.raster_group == 1 else f"groups of {plan.raster_group} block rows"))
    rows.append(("epilogue", "alpha * A*B + beta * C" if plan.beta else "alpha * A*B"))
    if plan.split_k > 1:
        rows.append(("split K", f"{plan.split_k} slices per C tile (blockIdx.y), added into C with "
                     "atomicAdd after C = beta * C"))
    if plan.reduce_count:
        rows.append(("fused reduction", f"{plan.reduce_count} smallest entries of C with row and column"))
    rows.append(("vector path needs", _vector_needs(plan) or "nothing (scalar accesses only)"))
    return rows


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
    return "\n".join(lines)


def generate(plan: Plan, *, internal: bool = False) -> str:
    """The complete .cu source of a Plan. `internal`: its launcher is static, for a file (a
    library) whose own entry point calls it."""
    if plan.path == "wgmma":
        fallback = _environment().get_template("kernel.cu.j2").render(
            plan=plan.fallback, header="", launch=launch_checks(plan.fallback, internal=True),
            c=plan.fallback.c, wgmma=_wgmma_operands(plan.fallback))
        return _environment().get_template("wgmma_kernel.cu.j2").render(
            plan=plan, header=header(plan, internal), launch=launch_checks(plan, internal), c=plan.c,
            wgmma=_wgmma_operands(plan), fallback_source=fallback.strip("\n"))
    template = _environment().get_template("kernel.cu.j2")
    return template.render(plan=plan, header=header(plan, internal), launch=launch_checks(plan, internal),
                           c=plan.c, wgmma=_wgmma_operands(plan) if plan.consumers else None)


def kernel_name_expressions(plan: Plan) -> dict[bool, str]:
    """C++ names of the two kernel variants (aligned, unaligned), for NVRTC to lower."""
    qualified = f"{plan.launcher_name}_impl::{plan.kernel_name}"
    return {True: f"{qualified}<true>", False: f"{qualified}<false>"}


def render_template(name: str, **values) -> str:
    """A template of templates/ rendered with `values` (a kernel that no Plan describes, e.g. the
    transposing copy of gemmgen/gpu/transpose.py)."""
    return _environment().get_template(name).render(**values)
