"""`gemmgen explain`'s report: the analysis of a Plan (analysis.py) gathered into one Report per
kernel, with notes where something costs, and rendered as aligned text or as JSON."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from ..gpu.compile import Compiled, Resources
from ..language.spec import Spec
from ..plan import WARP, Plan
from ..plan.schedule import H100_SMS, deal
from ..plan.space import size
from .analysis import (NOMINAL_LD, SHARED_BYTES_PER_CLOCK, BankAccess, GlobalAccess, Intensity, Occupancy, _resources,
                       bank_conflicts, global_accesses, intensities, occupancy)


@dataclass(frozen=True)
class Report:
    kernel: str
    arch: str
    tiling: str                # "block 128x128x16, warp 64x64, thread 8x4 repeat 1x4"
    fp32_lanes_per_sm: int
    threads: int
    warps: int
    registers: int             # ptxas, aligned variant
    registers_estimate: int    # the Plan's count of live values
    spill_stores: int
    spill_loads: int
    stack_frame: int
    smem_bytes: int            # dynamic shared memory per block (the Plan's)
    shared_static: int         # static shared memory per block (ptxas)
    requested_occupancy: int   # `occupancy N` of the spec (0: none asked)
    occupancy: Occupancy
    global_intensity: Intensity
    shared_intensity: Intensity | None
    bank_conflicts: tuple[BankAccess, ...]
    global_accesses: tuple[GlobalAccess, ...]
    summary: str
    notes: tuple[str, ...]
    math: str = "simt"         # simt, or the tensor-core path: "tf32 via mma.sync 16 x 8 x 8", ...
    register_split: str = ""   # wgmma: what setmaxnreg gives each kind of warpgroup
    loaders: str = ""          # register-fed wgmma: its loader warpgroups
    schedule: str = ""         # a tile scheduler (schedule persistent / stream-k), in words
    dealings: tuple[tuple[str, Any], ...] = ()  # (shape, plan.schedule.Dealing) on SCHEDULE_SMS SMs
    cluster: str = ""          # thread-block clusters (cluster M x N), in words
    cluster_launches: tuple[tuple[str, int, int], ...] = ()  # (shape, blocks launched, tiles past C's edge)
    no_conflicts: str = "none: no shared memory"  # what explain says where no access is replayed
    epilogue: tuple[tuple[str, str], ...] = ()  # the epilogue part's rows: what it computes, the traffic it saves

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)


# --- the report ------------------------------------------------------------------------

def _join(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _summary(occ: Occupancy) -> str:
    limits = _join(occ.limited_by)
    if occ.blocks == 0:
        return (f"the kernel cannot launch: {limits} leave room for no block of "
                f"{occ.threads_per_block} threads on an SM")
    plural = "block" if occ.blocks == 1 else "blocks"
    return (f"occupancy is limited by {limits}: {occ.blocks} {plural} of {occ.threads_per_block} "
            f"threads ({occ.warps_per_sm} warps/SM, {occ.percent:.1f}%)")


def explain(plan: Plan, compiled: Compiled | Resources | None = None) -> Report:
    """The static report of a Plan. `compiled` is compile_plan(plan)'s result (compiled here when
    None), or directly the ptxas Resources of the aligned variant."""
    res = _resources(plan, compiled)
    occ = occupancy(plan, res)
    glob, shared = intensities(plan)
    banks = bank_conflicts(plan)
    coalescing = global_accesses(plan)

    notes = plan.mainloop.notes(plan)
    if res.spill_stores or res.spill_loads:
        notes.append(f"ptxas spills registers to local memory: {res.spill_stores} bytes stored, "
                     f"{res.spill_loads} bytes loaded")
    if plan.occupancy and occ.blocks < plan.occupancy:
        notes.append(f"the spec asks for {plan.occupancy} blocks per SM (occupancy "
                     f"{plan.occupancy}), but only {occ.blocks} fit")
    for access in banks:
        if access.conflicted:
            notes.append(f"{access.label} ({access.how}) is a {access.degree}-way bank conflict: "
                         f"{access.wavefronts_per_request:g} wavefronts per request where "
                         f"{access.phases} would do")
    for g in coalescing:
        if g.uncoalesced:
            notes.append(f"{g.name}s ({g.how}) touch {g.sectors} sectors per request where "
                         f"{g.ideal_sectors} would do: uncoalesced")
    return Report(
        kernel=plan.name, arch=plan.arch.name, tiling=plan.mainloop.tiling_words(plan), fp32_lanes_per_sm=plan.arch.fp32_lanes_per_sm,
        threads=plan.threads, warps=plan.warps, registers=res.registers,
        registers_estimate=plan.registers_estimate, spill_stores=res.spill_stores,
        spill_loads=res.spill_loads, stack_frame=res.stack_frame, smem_bytes=plan.smem_bytes,
        shared_static=res.shared_static, requested_occupancy=plan.occupancy, occupancy=occ,
        global_intensity=glob, shared_intensity=shared, bank_conflicts=banks,
        global_accesses=coalescing, summary=_summary(occ), notes=tuple(notes), math=plan.mainloop.math_words,
        register_split=plan.mainloop.register_split, loaders=plan.mainloop.loader_words,
        no_conflicts=plan.mainloop.no_conflicts, epilogue=tuple(plan.epilogue.explain_rows()),
        schedule=plan.scheduler.describe() if plan.scheduled else "",
        dealings=tuple((f"{M}x{N}x{K}", deal(plan, M, N, K, SCHEDULE_SMS)) for M, N, K in SCHEDULE_SHAPES)
        if plan.scheduled else (),
        cluster=plan.scheduler.cluster_words(),
        cluster_launches=tuple((f"{M}x{N}x{K}", plan.launch_blocks(M, N, K, SCHEDULE_SMS),
                                plan.cluster_grid(M, N) - plan.grid(M, N))
                               for M, N, K in SCHEDULE_SHAPES) if plan.cluster_blocks > 1 else ())


def explain_all(plans: Sequence[Plan], progress: Callable[[int], None] | None = None) -> list[Report]:
    """The reports of several kernels (each compiled, or read from the compile cache), calling
    `progress(done)` after each."""
    reports = []
    for done, plan in enumerate(plans, 1):
        reports.append(explain(plan))
        if progress:
            progress(done)
    return reports


def kernels_to_explain(specs: Sequence[Spec], named: bool) -> tuple[list[Spec], list[str]]:
    """The kernels of a file that `gemmgen explain` reports on, and a note for each search space it
    leaves out. A file mixing kernels and spaces has its kernels explained; a space named alone
    (`named`, with --kernel), or a file of spaces only, stays with make_plan's SpecError saying
    it is a search space, as it is what the user asked about."""
    kernels = [spec for spec in specs if spec.is_concrete]
    if named or not kernels:
        return list(specs), []
    notes = [f"skipped {spec.name}: a search space of {size(spec):,} points (gemmgen tune searches it; "
             "explain takes a kernel, one value per setting)" for spec in specs if not spec.is_concrete]
    return kernels, notes


# Where explain shows a scheduled kernel's dealing of work (on an H100's SM count).
SCHEDULE_SMS = H100_SMS
SCHEDULE_SHAPES = ((4096, 4096, 4096), (4092, 4092, 4092), (2048, 2048, 2048), (1024, 1024, 1024),
                   (4096, 4096, 512), (8192, 128, 8192), (64, 64, 131072))


# --- output ----------------------------------------------------------------------------

def _table(rows: Sequence[Sequence[str]], right: Iterable[int] = (), indent: str = "  ") -> list[str]:
    """Rows of cells as aligned columns; columns in `right` are right-aligned."""
    right = set(right)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.rjust(w) if i in right else cell.ljust(w)
                 for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _flop_per_byte(x: Intensity) -> str:
    return f"{x.flops} flop / {x.bytes} B = {x.value:.2f} flop/B"


def render_text(report: Report) -> str:
    """The report as plain text with aligned columns."""
    r, occ = report, report.occupancy
    out = [f"{r.kernel} on {r.arch}", ""]

    spills = ("none" if not r.spills else
              f"{r.spill_stores} B stored, {r.spill_loads} B loaded")
    shared = f"{r.smem_bytes} bytes" if r.smem_bytes else "none"
    if r.shared_static:
        shared += f" (+{r.shared_static} static)"
    out.append("resources per block")
    out += _table([
        ("tiling", r.tiling),
        ("threads", f"{r.threads} ({r.warps} warps)"),
        ("registers per thread", f"{r.registers} (ptxas, aligned variant; the Plan estimated "
                                 f"{r.registers_estimate})"),
        *([("register split", r.register_split)] if r.register_split else []),
        *([("loaders", r.loaders)] if r.loaders else []),
        ("spills", spills),
        ("stack frame", f"{r.stack_frame} bytes"),
        ("shared memory", shared),
    ])

    if r.epilogue:
        out += ["", "epilogue"]
        width = max(len(label) for label, _ in r.epilogue)
        for label, value in r.epilogue:
            out += textwrap.wrap(value, 78, initial_indent=f"  {label.ljust(width)}  ",
                                 subsequent_indent=" " * (width + 4), break_on_hyphens=False)

    if r.schedule:
        out += ["", f"schedule (dealt on {SCHEDULE_SMS} SMs, an H100)"]
        out += textwrap.wrap(r.schedule, 76, initial_indent="  ", subsequent_indent="  ")
        rows = [("shape", "blocks", "whole", "stream-K", "K tiles/block", "pieces", "workspace")]
        for shape, d in r.dealings:
            rows.append((shape, str(d.blocks), str(d.whole_tiles), str(d.stream_k_tiles),
                         f"{d.least_k_tiles}-{d.most_k_tiles}", str(d.most_pieces),
                         f"{d.workspace_bytes / 2**20:.1f} MiB" if d.workspace_bytes else "-"))
        out += _table(rows, right=(1, 2, 3, 4, 5, 6))
        out += textwrap.wrap("whole: C tiles one block multiplies; stream-K: tiles dealt out by K tile; "
                             "pieces: most blocks sharing one tile", 76, initial_indent="  ",
                             subsequent_indent="  ")

    if r.cluster:
        out += ["", "cluster"]
        out += textwrap.wrap(r.cluster, 76, initial_indent="  ", subsequent_indent="  ")
        rows = [("shape", "blocks", "tiles past C's edge")]
        rows += [(shape, str(blocks), str(idle)) for shape, blocks, idle in r.cluster_launches]
        out += _table(rows, right=(1, 2))

    out += ["", f"occupancy per SM ({r.arch})"]
    rows = [("limit", "blocks", "because")]
    rows.append(("threads", str(occ.by_threads),
                 f"{occ.max_warps_per_sm * WARP} threads / {occ.threads_per_block} per block"))
    rows.append(("registers", str(occ.by_registers),
                 f"{occ.registers_per_warp} regs per warp x {occ.warps_per_block} warps"))
    rows.append(("shared memory", str(occ.by_shared_memory),
                 f"{occ.shared_per_block} B per block, {occ.shared_reserved} B reserve included"))
    rows.append(("blocks", str(occ.by_blocks), "hardware limit per SM"))
    for i, row in enumerate(rows[1:], 1):
        if row[0] in occ.limited_by:
            rows[i] = (row[0], row[1], row[2] + "  <- binds")
    rows.append(("resident", str(occ.blocks), f"{occ.warps_per_sm} of {occ.max_warps_per_sm} "
                 f"warps per SM ({occ.percent:.1f}% occupancy)"))
    out += _table(rows, right=(1,))

    out += ["", "arithmetic intensity"]
    rows = [(report.global_intensity.scope, _flop_per_byte(report.global_intensity))]
    if report.shared_intensity is not None:
        rows.append((report.shared_intensity.scope, _flop_per_byte(report.shared_intensity)))
    if r.math != "simt":
        rows.append(("math", r.math))
    else:
        rows.append(("FP32 peak", f"{r.fp32_lanes_per_sm} FFMA lanes per SM = "
                                  f"{2 * r.fp32_lanes_per_sm} flop/clock"))
    if report.shared_intensity is not None and r.math == "simt":
        need = 2 * r.fp32_lanes_per_sm / SHARED_BYTES_PER_CLOCK
        rows.append(("shared bandwidth", f"{SHARED_BYTES_PER_CLOCK} B/clock/SM: "
                                         f">= {need:g} flop/B keeps FFMA fed"))
    out += _table(rows)

    out += ["", "shared-memory bank conflicts (warp 0, kk = 0), wavefronts per request"]
    if not report.bank_conflicts:
        out.append(f"  {r.no_conflicts}")
    else:
        rows = [("access", "how", "width", "requests", "wavefronts", "ideal", "n-way")]
        for a in report.bank_conflicts:
            rows.append((a.label, a.how, f"{a.width_bytes} B", str(a.requests),
                         f"{a.wavefronts_per_request:g}", str(a.phases),
                         f"{a.degree}-way" if a.conflicted else "none"))
        out += _table(rows, right=(2, 3, 4, 5))

    out += ["", "global memory coalescing (warp 0, first request), 32-byte sectors",
            f"  M = N = K = leading dimensions = {NOMINAL_LD}, pointers 128-byte aligned"]
    rows = [("access", "how", "width", "sectors", "ideal", "efficiency")]
    for g in report.global_accesses:
        rows.append((g.name, g.how, f"{g.bytes_per_lane} B", str(g.sectors),
                     str(g.ideal_sectors), f"{g.efficiency:.1f}%"))
    out += _table(rows, right=(2, 3, 4, 5))

    if report.notes:
        out += ["", "notes"]
        for note in report.notes:
            out += textwrap.wrap(note, width=78, initial_indent="  - ", subsequent_indent="    ")
    out += [""] + textwrap.wrap(report.summary[0].upper() + report.summary[1:] + ".", width=80)
    return "\n".join(out) + "\n"


def as_dict(report: Report) -> dict[str, Any]:
    """The report as plain JSON types."""
    occ = report.occupancy

    def intensity(x: Intensity | None) -> dict[str, Any] | None:
        if x is None:
            return None
        return {"scope": x.scope, "flops": x.flops, "bytes": x.bytes, "flop_per_byte": x.value}

    return {
        "kernel": report.kernel,
        "arch": report.arch,
        "tiling": report.tiling,
        "math": report.math,
        "fp32_lanes_per_sm": report.fp32_lanes_per_sm,
        "threads": report.threads,
        "warps": report.warps,
        "registers": report.registers,
        "registers_estimate": report.registers_estimate,
        "register_split": report.register_split,
        "loaders": report.loaders,
        "schedule": report.schedule,
        "dealings": {shape: {"sms": SCHEDULE_SMS, **vars(d)} for shape, d in report.dealings},
        "cluster": report.cluster,
        "epilogue": dict(report.epilogue),
        "cluster_launches": {shape: {"blocks": blocks, "past_edge": idle}
                             for shape, blocks, idle in report.cluster_launches},
        "spill_stores": report.spill_stores,
        "spill_loads": report.spill_loads,
        "stack_frame": report.stack_frame,
        "smem_bytes": report.smem_bytes,
        "shared_static": report.shared_static,
        "requested_occupancy": report.requested_occupancy,
        "occupancy": {
            "limits": {name: blocks for name, blocks in occ.limits},
            "blocks": occ.blocks,
            "limited_by": list(occ.limited_by),
            "warps_per_sm": occ.warps_per_sm,
            "max_warps_per_sm": occ.max_warps_per_sm,
            "percent": occ.percent,
            "registers_per_warp": occ.registers_per_warp,
            "shared_per_block": occ.shared_per_block,
            "shared_reserved": occ.shared_reserved,
        },
        "intensity": {"global": intensity(report.global_intensity),
                      "shared": intensity(report.shared_intensity)},
        "bank_conflicts": [
            {"access": a.label, "operand": a.operand, "kind": a.kind, "how": a.how,
             "width_bytes": a.width_bytes, "requests": a.requests, "wavefronts": a.wavefronts,
             "wavefronts_per_request": a.wavefronts_per_request, "ideal_wavefronts": a.phases,
             "worst_wavefronts": a.worst_wavefronts, "degree": a.degree}
            for a in report.bank_conflicts],
        "global_coalescing": [
            {"access": g.name, "how": g.how, "bytes_per_lane": g.bytes_per_lane,
             "bytes": g.bytes, "sectors": g.sectors, "ideal_sectors": g.ideal_sectors,
             "efficiency": g.efficiency}
            for g in report.global_accesses],
        "summary": report.summary,
        "notes": list(report.notes),
    }
