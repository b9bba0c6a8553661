"""`gemmgen explain`: what a kernel will cost before it runs, from its Plan and ptxas's report.

Everything here is static: registers, spills and stack come from compiling the aligned variant;
occupancy is the resident-block arithmetic of the CUDA occupancy tables (threads, registers,
shared memory, blocks per SM); arithmetic intensity is flops over bytes moved per block and per
thread; shared-memory bank conflicts are predicted by replaying warp 0's addresses through the
Plan's own index expressions (the ones the templates paste into CUDA), with the thread → element
mapping of templates/operand.cuh.j2 and templates/tiled.cu.j2. The accesses are those of the
aligned (vector) variant, the one launched when sizes, leading dimensions and pointers allow.

Bank model: 32 banks of 4 bytes, bank = word address % 32. A warp request of W-byte vectors is
split into phases of 128 bytes (4 B: one phase of 32 lanes, 8 B: two of 16, 16 B: four of 8).
Within a phase, lanes that read the same vector are served together (broadcast); a phase takes as
many wavefronts as the largest number of distinct vectors that touch one bank (its n-way
conflict). A conflict-free request takes one wavefront per phase.

Global coalescing ("sectors per request" in Nsight Compute): warp 0's first request of each
global access (pass 0 of the A and B tile loads, k = 0 of a kernel without shared memory, the
first store of C) is replayed on a nominal problem, M = N = K = 4096 with every leading dimension
4096, block (0, 0), and base pointers aligned to 128 bytes. The request touches every 32-byte
sector that holds one of its bytes; the ideal is the distinct bytes it asks for / 32, rounded up
(lanes reading the same float share it, as the hardware broadcasts it).
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from ..gpu.compile import Compiled, Resources
from ..plan import WARP, Operand, Plan
from ..plan.schedule import H100_SMS, deal
from ..plan.schedule import describe as describe_schedule
from ..plan.space import size
from ..language.spec import Spec

BANKS = 32
SECTOR_BYTES = 32                # global memory moves in 32-byte sectors
NOMINAL_LD = 4096                # leading dimension of the nominal problem (M = N = K = 4096)
REG_ALLOCATION_UNIT = 256        # registers are given to warps in multiples of 256
SHARED_BYTES_PER_CLOCK = 128     # 32 banks x 4 bytes per SM per clock


# --- results ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Occupancy:
    """Resident blocks per SM under each limit; the smallest is what the SM holds."""

    by_threads: int
    by_registers: int
    by_shared_memory: int
    by_blocks: int
    threads_per_block: int
    warps_per_block: int
    max_warps_per_sm: int
    registers_per_warp: int      # allocated: registers x 32 rounded up to 256
    shared_per_block: int        # allocated: dynamic + static + the runtime's reserve
    shared_reserved: int         # the runtime's reserve per block (included above)

    @property
    def limits(self) -> tuple[tuple[str, int], ...]:
        return (("threads", self.by_threads), ("registers", self.by_registers),
                ("shared memory", self.by_shared_memory), ("blocks", self.by_blocks))

    @property
    def blocks(self) -> int:
        return min(blocks for _, blocks in self.limits)

    @property
    def limited_by(self) -> tuple[str, ...]:
        """Every limit that allows no more than `blocks` (ties are all named)."""
        return tuple(name for name, blocks in self.limits if blocks == self.blocks)

    @property
    def warps_per_sm(self) -> int:
        return self.blocks * self.warps_per_block

    @property
    def percent(self) -> float:
        return 100.0 * self.warps_per_sm / self.max_warps_per_sm


@dataclass(frozen=True)
class Intensity:
    """Flops per byte moved, over the scope it is counted on."""

    scope: str
    flops: int
    bytes: int

    @property
    def value(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")


@dataclass(frozen=True)
class BankAccess:
    """One shared-memory access of warp 0, replayed over all its requests (warp instructions)."""

    operand: str          # "A" or "B"
    kind: str             # "store" (global tile → shared) or "fragment" (shared → registers, kk = 0)
    how: str              # e.g. "float4", "scalar, transposed", "cp.async 16 B"
    width_bytes: int      # bytes per lane per request
    requests: int
    phases: int           # wavefronts of one conflict-free request
    wavefronts: int       # over all requests
    worst_wavefronts: int  # of the worst request
    degree: int           # the worst phase's n-way conflict (1: none)

    @property
    def label(self) -> str:
        return f"{self.operand} {self.kind}"

    @property
    def wavefronts_per_request(self) -> float:
        return self.wavefronts / self.requests

    @property
    def conflicted(self) -> bool:
        return self.degree > 1


@dataclass(frozen=True)
class GlobalAccess:
    """Warp 0's first request of one global-memory access, in 32-byte sectors."""

    name: str             # "A load", "B load" or "C store"
    how: str              # e.g. "float4", "scalar, per-thread runs", "float4, staged"
    bytes_per_lane: int
    bytes: int            # distinct bytes the warp asks for (lanes on one float share it)
    sectors: int          # distinct 32-byte sectors the request touches
    ideal_sectors: int    # bytes / 32, rounded up

    @property
    def efficiency(self) -> float:
        """Percent of the moved sectors' bytes that were asked for (100: fully coalesced)."""
        return 100.0 * self.ideal_sectors / self.sectors if self.sectors else 100.0

    @property
    def uncoalesced(self) -> bool:
        return self.sectors > 2 * self.ideal_sectors


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

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)


# --- occupancy -------------------------------------------------------------------------

def registers_per_warp(registers: int) -> int:
    """Registers a warp is given: registers per thread x 32, rounded up to 256."""
    return -(-registers * WARP // REG_ALLOCATION_UNIT) * REG_ALLOCATION_UNIT


def occupancy(plan: Plan, resources: Resources) -> Occupancy:
    arch = plan.arch
    warps = plan.warps
    per_warp = registers_per_warp(resources.registers)
    by_registers = arch.regs_per_sm // (per_warp * warps) if per_warp else arch.max_blocks_per_sm
    shared = plan.smem_bytes + resources.shared_static + arch.smem_reserved
    return Occupancy(
        by_threads=arch.max_threads_per_sm // plan.threads,
        by_registers=by_registers,
        by_shared_memory=arch.smem_per_sm // shared,
        by_blocks=arch.max_blocks_per_sm,
        threads_per_block=plan.threads,
        warps_per_block=warps,
        max_warps_per_sm=arch.max_threads_per_sm // WARP,
        registers_per_warp=per_warp,
        shared_per_block=shared,
        shared_reserved=arch.smem_reserved,
    )


# --- arithmetic intensity --------------------------------------------------------------

def intensities(plan: Plan) -> tuple[Intensity, Intensity | None]:
    """(global, shared) flops per byte; shared is None for kernels without shared memory."""
    if not plan.uses_shared:
        # Each thread reads TM values of A and TN of B per k straight from global memory.
        return (Intensity("global, per thread per k", 2 * plan.TM * plan.TN,
                          (plan.TM + plan.TN) * 4), None)
    BM, BN, BK = plan.BM, plan.BN, plan.BK
    glob = Intensity("global, per block per K step", 2 * BM * BN * BK, (BM * BK + BK * BN) * 4)
    if plan.consumers:  # a wgmma kernel
        return glob, None  # the tensor cores read shared memory themselves
    if plan.path == "mma_sync":
        mm, mn, mk = plan.mma_shape  # a warp's fragments of one K step feed RM x RN MMAs
        return glob, Intensity("shared, per warp per MMA k step", 2 * mm * mn * mk * plan.RM * plan.RN,
                               (mm * mk * plan.RM + mk * mn * plan.RN) * 4)
    a_run, b_run = plan.TM * plan.RM, plan.TN * plan.RN
    shared = Intensity("shared, per thread per k", 2 * a_run * b_run, (a_run + b_run) * 4)
    return glob, shared


# --- bank conflicts --------------------------------------------------------------------

def bank_wavefronts(addresses: Sequence[int | None], width: int) -> tuple[int, int]:
    """(wavefronts, worst n-way) of one warp request.

    `addresses` holds each lane's float offset in shared memory (None: lane inactive), `width`
    the floats per lane (1, 2 or 4). Lanes are split into phases of 32 / width lanes.
    """
    if width not in (1, 2, 4):
        raise ValueError(f"vector width {width} is not 1, 2 or 4 floats")
    per_phase = WARP // width
    wavefronts = worst = 0
    for start in range(0, len(addresses), per_phase):
        vectors = {a for a in addresses[start:start + per_phase] if a is not None}
        if not vectors:
            continue
        load: dict[int, int] = defaultdict(int)
        for address in vectors:            # distinct vectors: identical ones are broadcast
            for word in range(address, address + width):
                load[word % BANKS] += 1
        degree = max(load.values())
        wavefronts += degree
        worst = max(worst, degree)
    return wavefronts, worst


def smem_offset(op: Operand, coords: dict[str, int]) -> int:
    """The Plan's C index expression of `op`'s shared tile, evaluated at math coordinates."""
    return eval(op.smem_index, {"__builtins__": {}}, dict(coords))  # noqa: S307 - the Plan's own text


def _access(op: Operand, kind: str, how: str, width: int,
            requests: Iterable[list[int | None]]) -> BankAccess:
    results = [bank_wavefronts(addresses, width) for addresses in requests]
    return BankAccess(operand=op.name, kind=kind, how=how, width_bytes=4 * width,
                      requests=len(results), phases=width,  # 4 B: 1 phase, 8 B: 2, 16 B: 4
                      wavefronts=sum(w for w, _ in results),
                      worst_wavefronts=max(w for w, _ in results),
                      degree=max(d for _, d in results))


def _store_access(plan: Plan, op: Operand) -> BankAccess:
    """Global tile → shared at the positions op.position(p, tid) gives (the templates' own)."""
    def coords(lane: int, p: int, v: int) -> dict[str, int]:
        row, col = op.position(p, lane, plan.threads)
        return {op.outer_dim: row, op.inner_dim: col + v}

    lanes = range(min(WARP, plan.threads))
    if op.blocked:            # a block's column v: one store of `vector` floats along the outer dim
        requests = [[smem_offset(op, coords(lane, p, v)) for lane in lanes]
                    for p in range(0, op.passes, op.vector) for v in range(op.vector)]
        return _access(op, "store", f"{_vector_name(op.vector)}, transposed",
                       op.vector, requests)
    if op.transposed_store:   # one scalar store per float, each to its own shared row
        requests = [[smem_offset(op, coords(lane, p, v)) for lane in lanes]
                    for p in range(op.passes) for v in range(op.vector)]
        width = 1
        how = "cp.async, transposed" if plan.async_copy else "scalar, transposed"
    else:
        requests = [[smem_offset(op, coords(lane, p, 0)) for lane in lanes]
                    for p in range(op.passes)]
        width = op.vector
        how = "cp.async" if plan.async_copy else _vector_name(width)
    return _access(op, "store", how, width, requests)


def _thread_origins(plan: Plan) -> list[tuple[int, int]]:
    """(thread_m0, thread_n0) of warp 0's lanes, as tiled.cu.j2 computes them."""
    if plan.mma_shape:  # the MMA's lane layout: lane 4g + t holds row g, columns 2t and 2t + 1
        return [(lane // 4, lane % 4 * plan.TN) for lane in range(WARP)]
    origins = []
    for lane in range(min(WARP, plan.threads)):
        if plan.order == "n":
            lane_row, lane_col = lane // plan.lanes_n, lane % plan.lanes_n
        else:
            lane_row, lane_col = lane % plan.lanes_m, lane // plan.lanes_m
        origins.append((lane_row * plan.TM, lane_col * plan.TN))  # warp_row = warp_col = 0
    return origins


def _fragment_access(plan: Plan, op: Operand) -> BankAccess:
    """Shared → registers in the inner product, for kk = 0 (load_fragments in operand.cuh.j2)."""
    origins = _thread_origins(plan)
    width = op.frag_vector
    requests = []
    if op.name == "A":
        for rm in range(plan.RM):
            for i in range(0, plan.TM, width):
                requests.append([smem_offset(op, {"m": m0 + rm * plan.SUB_M + i, "k": 0})
                                 for m0, _ in origins])
    else:
        for rn in range(plan.RN):
            for j in range(0, plan.TN, width):
                requests.append([smem_offset(op, {"k": 0, "n": n0 + rn * plan.SUB_N + j})
                                 for _, n0 in origins])
    return _access(op, "fragment", _vector_name(width), width, requests)


def _mma_fragment_access(plan: Plan, op: Operand) -> BankAccess:
    """Shared → registers for one MMA K step at kk = 0 (mma_multiply.cuh.j2). ldmatrix moves 8 rows
    of 16 bytes per phase, which is what a 4-float-wide request of 8 lanes per phase models."""
    if op.name == "A":
        ldmatrix, tiles, step = plan.ldmatrix_a, plan.RM, plan.mma_shape[0]
    else:
        ldmatrix, tiles, step = plan.ldmatrix_b, plan.RN, plan.mma_shape[1]
    requests = []
    for tile in range(tiles):
        if ldmatrix and op.name == "A":  # x4: rows +0 / +8 of the tile, then k +0 / +4
            requests.append([smem_offset(op, {"m": tile * step + lane // 8 % 2 * 8 + lane % 8,
                                              "k": lane // 16 * 4}) for lane in range(WARP)])
        elif ldmatrix:  # x2: lanes 0-15 name the rows, k +0 / +4
            requests.append([smem_offset(op, {"n": tile * step + lane % 8, "k": lane // 8 * 4})
                             if lane < 16 else None for lane in range(WARP)])
        elif op.name == "A":  # a0..a3: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
            for dm, dk in ((0, 0), (8, 0), (0, 4), (8, 4)):
                requests.append([smem_offset(op, {"m": tile * step + lane // 4 + dm, "k": lane % 4 + dk})
                                 for lane in range(WARP)])
        else:  # b0, b1: (k = t, n = g), (t + 4, g)
            for dk in (0, 4):
                requests.append([smem_offset(op, {"n": tile * step + lane // 4, "k": lane % 4 + dk})
                                 for lane in range(WARP)])
    width = 4 if ldmatrix else 1
    return _access(op, "fragment", "ldmatrix" if ldmatrix else "scalar", width, requests)


def _vector_name(width: int) -> str:
    return "scalar" if width == 1 else f"float{width}"


def bank_conflicts(plan: Plan) -> tuple[BankAccess, ...]:
    """A store, B store, A fragment, B fragment; empty for kernels without shared memory."""
    if not plan.uses_shared or plan.consumers:
        return ()  # wgmma: TMA or 16-byte loader stores fill swizzled tiles the tensor cores read
    fragments = _mma_fragment_access if plan.mma_shape else _fragment_access
    return (_store_access(plan, plan.a), _store_access(plan, plan.b),
            fragments(plan, plan.a), fragments(plan, plan.b))


# --- global coalescing -----------------------------------------------------------------

def sectors_touched(addresses: Sequence[int | None], width: int) -> tuple[int, int]:
    """(sectors, distinct bytes) of one warp request.

    `addresses` holds each lane's float offset from a 128-byte-aligned base (None: lane
    inactive), `width` the floats each lane moves from there.
    """
    sectors: set[int] = set()
    floats: set[int] = set()
    for address in addresses:
        if address is None:
            continue
        first, last = 4 * address, 4 * (address + width) - 1
        sectors.update(range(first // SECTOR_BYTES, last // SECTOR_BYTES + 1))
        floats.update(range(address, address + width))
    return len(sectors), 4 * len(floats)


def _global(name: str, how: str, width: int, addresses: Sequence[int | None]) -> GlobalAccess:
    sectors, requested = sectors_touched(addresses, width)
    return GlobalAccess(name=name, how=how, bytes_per_lane=4 * width, bytes=requested,
                        sectors=sectors, ideal_sectors=-(-requested // SECTOR_BYTES))


def _tile_load(plan: Plan, op: Operand) -> GlobalAccess:
    """Pass 0 of load_to_registers / async_copy: g = tile + row * ld + col (operand.cuh.j2)."""
    width = op.vector
    if op.blocked:
        how = f"{_vector_name(width)}, via registers"
    elif plan.async_copy and op.transposed_store:
        width = 1                          # one 4-byte cp.async per float (v = 0 first)
        how = "cp.async 4 B, transposed"
    elif plan.async_copy:
        how = f"cp.async {4 * width} B"
    else:
        how = _vector_name(width)
    if op.thread_runs:
        how += ", per-thread runs"
    addresses = []
    for lane in range(min(WARP, plan.threads)):
        row, col = op.position(0, lane, plan.threads)
        addresses.append(row * NOMINAL_LD + col)
    return _global(f"{op.name} load", how, width, addresses)


def _direct_loads(plan: Plan) -> tuple[GlobalAccess, GlobalAccess]:
    """Without shared memory: A(m, k) and B(k, n) at k = 0, i = j = 0 (naive.cu.j2)."""
    origins = _thread_origins(plan)
    a_row = plan.spec["layout.A"] == "row"
    b_row = plan.spec["layout.B"] == "row"
    k = 0
    a = [m * NOMINAL_LD + k if a_row else k * NOMINAL_LD + m for m, _ in origins]
    b = [k * NOMINAL_LD + n if b_row else n * NOMINAL_LD + k for _, n in origins]
    return _global("A load", "scalar, k = 0", 1, a), _global("B load", "scalar, k = 0", 1, b)


def _c_store(plan: Plan) -> GlobalAccess:
    """Each lane's first store of C (epilogue.cuh.j2); beta's loads of C read the same way."""
    if plan.tma_store:
        # store_tma (aligned C): one warp's box, rows of c_box_inner floats along C's contiguous
        # dimension, whole 32-byte sectors each (ld a multiple of 4 floats, as TMA requires).
        row_bytes = 4 * plan.c_box_inner
        sectors = plan.c_box_outer * -(-row_bytes // SECTOR_BYTES)
        return GlobalAccess(name="C store", how=f"TMA, {plan.c_box_outer} x {plan.c_box_inner} box",
                            bytes_per_lane=row_bytes, bytes=plan.c_box_outer * row_bytes, sectors=sectors,
                            ideal_sectors=sectors)
    if plan.staged:
        # store_staged: chunk = tid, row along C's outer dimension, col along its contiguous one.
        width = plan.c_stage_vec
        per_row = plan.c_stage_cols // width
        addresses = [lane // per_row * NOMINAL_LD + lane % per_row * width
                     for lane in range(min(WARP, plan.threads))]
        return _global("C store", f"{_vector_name(width)}, staged", width, addresses)
    width = plan.c_vector                  # 1 under split K: one atomicAdd per float
    how = "atomicAdd" if plan.split_k > 1 else _vector_name(width)
    if plan.c_layout == "row":
        addresses = [m * NOMINAL_LD + n for m, n in _thread_origins(plan)]
    else:
        addresses = [n * NOMINAL_LD + m for m, n in _thread_origins(plan)]
    return _global("C store", how, width, addresses)


def global_accesses(plan: Plan) -> tuple[GlobalAccess, ...]:
    """A load, B load, C store: warp 0's first request of each on the nominal problem."""
    if plan.path == "wgmma":
        loads = ()  # TMA moves whole boxes of 128-byte rows: full sectors by construction
    elif plan.path == "wgmma_async":
        loads = ()  # loads of whole 128-byte K rows, or of rows along M or N: full sectors either way
    elif plan.uses_shared:
        loads = (_tile_load(plan, plan.a), _tile_load(plan, plan.b))
    else:
        loads = _direct_loads(plan)
    return loads + (_c_store(plan),)


# --- the report ------------------------------------------------------------------------

def _resources(plan: Plan, compiled: Compiled | Resources | None) -> Resources:
    if isinstance(compiled, Resources):
        return compiled
    if compiled is None:
        from ..gpu.compile import compile_plan
        compiled = compile_plan(plan)
    from ..codegen.cuda import kernel_name_expressions
    name = kernel_name_expressions(plan)[True]
    try:
        return compiled.resources_of(name)
    except KeyError:
        raise ValueError(f"the compile result has no ptxas report for {name}") from None


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


def _tiling(plan: Plan) -> str:
    parts = [f"block {plan.BM}x{plan.BN}x{plan.BK}" if plan.uses_shared
             else f"block {plan.BM}x{plan.BN}"]
    if plan.warp_tiling:
        parts.append(f"warp {plan.WM}x{plan.WN}")
    if plan.consumers:  # a wgmma kernel
        parts[-1] = (f"{plan.consumers} consumers in turn" if plan.pingpong
                     else f"{plan.consumers} x 64x{plan.BN} warpgroups")
        parts.append(f"{plan.stages} TMA stages" if plan.tma else f"{plan.stages} stages")
        return ", ".join(parts)
    if plan.mma_shape:
        parts.append(f"mma {'x'.join(map(str, plan.mma_shape))} repeat {plan.RM}x{plan.RN}")
        return ", ".join(parts)
    thread = f"thread {plan.TM}x{plan.TN}"
    if plan.RM * plan.RN > 1:
        thread += f" repeat {plan.RM}x{plan.RN}"
    parts.append(thread)
    return ", ".join(parts)


def _math(plan: Plan) -> str:
    if plan.path == "simt":
        return "simt"
    shape = "x".join(map(str, plan.mma_shape))
    how = "wgmma" if plan.consumers else "mma.sync"
    if plan.math == "3xtf32":  # big*big + big*small + small*big
        return f"3xtf32: 3 {how} {shape} per product"
    return f"{plan.math}: {how} {shape}"


def explain(plan: Plan, compiled: Compiled | Resources | None = None) -> Report:
    """The static report of a Plan. `compiled` is compile_plan(plan)'s result (compiled here when
    None), or directly the ptxas Resources of the aligned variant."""
    res = _resources(plan, compiled)
    occ = occupancy(plan, res)
    glob, shared = intensities(plan)
    banks = bank_conflicts(plan)
    coalescing = global_accesses(plan)

    notes = []
    if plan.promote_tiles > 1:
        notes.append(f"The tensor cores sum {plan.promote_tiles} K tiles ({plan.promote_tiles * plan.BK} of K) of "
                     "products before the consumers add them into FP32 (promote): the tensor pipe drains "
                     "once per group, and the sums round toward zero over that span.")
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
        kernel=plan.name, arch=plan.arch.name, tiling=_tiling(plan), fp32_lanes_per_sm=plan.arch.fp32_lanes_per_sm,
        threads=plan.threads, warps=plan.warps, registers=res.registers,
        registers_estimate=plan.registers_estimate, spill_stores=res.spill_stores,
        spill_loads=res.spill_loads, stack_frame=res.stack_frame, smem_bytes=plan.smem_bytes,
        shared_static=res.shared_static, requested_occupancy=plan.occupancy, occupancy=occ,
        global_intensity=glob, shared_intensity=shared, bank_conflicts=banks,
        global_accesses=coalescing, summary=_summary(occ), notes=tuple(notes), math=_math(plan),
        register_split=_register_split(plan),
        loaders=(f"{plan.loaders} warpgroup(s) fill the stages, {plan.loader_depth} K tile(s) each"
                 if plan.loaders else ""),
        schedule=describe_schedule(plan) if plan.scheduled else "",
        dealings=tuple((f"{M}x{N}x{K}", deal(plan, M, N, K, SCHEDULE_SMS)) for M, N, K in SCHEDULE_SHAPES)
        if plan.scheduled else (),
        cluster=_cluster(plan),
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


def _cluster(plan: Plan) -> str:
    """What the blocks of a cluster share, and the L2 reads it saves, in words."""
    if plan.cluster_blocks == 1:
        return ""
    cm, cn, BM, BN, BK = plan.cluster_m, plan.cluster_n, plan.BM, plan.BN, plan.BK
    shares = []
    if cm > 1:
        shares.append(f"the {cm} blocks along M share B's {BN} x {BK} tile, each loading {BN // cm} rows "
                      "and multicasting them to the others")
    if cn > 1:
        shares.append(f"the {cn} blocks along N share A's {BM} x {BK} tile, each loading {BM // cn} rows "
                      "and multicasting them to the others")
    return (f"{cm} x {cn} blocks per cluster (__cluster_dims__({plan.cluster_blocks}, 1, 1)): "
            + "; ".join(shares) + f". Each block reads {plan.block_load_bytes} bytes of each K tile from L2 "
            f"instead of {4 * BK * (BM + BN)}. A stage is refilled once every block that fills it has freed it; a launch takes "
            "whole clusters, and blocks past C's edge multiply zeros and store nothing.")


# Where explain shows a scheduled kernel's dealing of work (on an H100's SM count).
SCHEDULE_SMS = H100_SMS
SCHEDULE_SHAPES = ((4096, 4096, 4096), (4092, 4092, 4092), (2048, 2048, 2048), (1024, 1024, 1024),
                   (4096, 4096, 512), (8192, 128, 8192), (64, 64, 131072))


def _register_split(plan: Plan) -> str:
    if plan.path == "wgmma":
        return f"setmaxnreg: producer {plan.loader_registers}, consumers {plan.consumer_registers}"
    if plan.path == "wgmma_async":
        return f"setmaxnreg: loaders {plan.loader_registers}, consumers {plan.consumer_registers}"
    return ""


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
    if not report.bank_conflicts and "wgmma" in r.math:
        out.append("  none predicted: wgmma reads 128-byte swizzled K-major tiles")
    elif not report.bank_conflicts:
        out.append("  none: no shared memory")
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
