"""What a kernel will cost before it runs, from its Plan and ptxas's report (`gemmgen explain`'s
analysis; report.py gathers and prints it).

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

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..codegen.cuda import kernel_name_expressions
from ..gpu.compile import Compiled, Resources, compile_plan
from ..plan import WARP, Operand, Plan

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
    """(global, shared) flops per byte (the mainloop's numbers); shared is None where threads read no
    shared memory (none, or the tensor cores read it themselves)."""
    glob, shared = plan.mainloop.intensities(plan)
    return Intensity(*glob), (Intensity(*shared) if shared else None)


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
    """(thread_m0, thread_n0) of warp 0's lanes, as tiled.cu.j2 computes them (the mainloop's)."""
    return plan.mainloop.thread_origins(plan)


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


# How the mainloop's inner product reads its fragments (Mainloop.fragment_reads) -> their replay.
FRAGMENT_ACCESS = {"ffma": _fragment_access, "mma": _mma_fragment_access}


def bank_conflicts(plan: Plan) -> tuple[BankAccess, ...]:
    """A store, B store, A fragment, B fragment; empty for kernels without shared memory."""
    reads = plan.mainloop.fragment_reads
    if reads is None:
        return ()  # wgmma: TMA or 16-byte loader stores fill swizzled tiles the tensor cores read
    fragments = FRAGMENT_ACCESS[reads]
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


def _tma_store(plan: Plan) -> GlobalAccess:
    """store_tma (aligned C): one warp's box, rows of c_box_inner floats along C's contiguous
    dimension, whole 32-byte sectors each (ld a multiple of 4 floats, as TMA requires)."""
    row_bytes = 4 * plan.c_box_inner
    sectors = plan.c_box_outer * -(-row_bytes // SECTOR_BYTES)
    return GlobalAccess(name="C store", how=f"TMA, {plan.c_box_outer} x {plan.c_box_inner} box",
                        bytes_per_lane=row_bytes, bytes=plan.c_box_outer * row_bytes, sectors=sectors,
                        ideal_sectors=sectors)


def _staged_store(plan: Plan) -> GlobalAccess:
    """store_staged: chunk = tid, row along C's outer dimension, col along its contiguous one."""
    width = plan.c_stage_vec
    per_row = plan.c_stage_cols // width
    addresses = [lane // per_row * NOMINAL_LD + lane % per_row * width
                 for lane in range(min(WARP, plan.threads))]
    return _global("C store", f"{_vector_name(width)}, staged", width, addresses)


def _register_store(plan: Plan) -> GlobalAccess:
    """Each lane's first store of C (epilogue_direct.cuh.j2); beta's loads of C read the same way."""
    width = plan.c_vector                  # 1 under split K: one atomicAdd per float
    how = "atomicAdd" if plan.epilogue.atomic else _vector_name(width)
    if plan.c_layout == "row":
        addresses = [m * NOMINAL_LD + n for m, n in _thread_origins(plan)]
    else:
        addresses = [n * NOMINAL_LD + m for m, n in _thread_origins(plan)]
    return _global("C store", how, width, addresses)


# How the epilogue writes C (Epilogue.store) -> the replay of a warp's first store.
C_STORES = {"registers": _register_store, "staged": _staged_store, "tma": _tma_store}


def global_accesses(plan: Plan) -> tuple[GlobalAccess, ...]:
    """A load, B load, C store: warp 0's first request of each on the nominal problem."""
    how = plan.mainloop.global_loads
    if how == "tiles":
        loads = (_tile_load(plan, plan.a), _tile_load(plan, plan.b))
    elif how == "direct":
        loads = _direct_loads(plan)
    else:
        loads = ()  # TMA boxes, or loader warpgroups' 128-byte K rows or rows along M or N: full sectors
    return loads + (C_STORES[plan.epilogue.store](plan),)


def _resources(plan: Plan, compiled: Compiled | Resources | None) -> Resources:
    if isinstance(compiled, Resources):
        return compiled
    if compiled is None:
        compiled = compile_plan(plan)
    name = kernel_name_expressions(plan)[True]
    try:
        return compiled.resources_of(name)
    except KeyError:
        raise ValueError(f"the compile result has no ptxas report for {name}") from None
