"""Planning the tiled kernels: block, warp and thread tiles of FFMA (math simt), or warp tiles of
mma.sync tensor-core tiles (math tf32 / 3xtf32 on sm_80 to sm_90; mma_sync.py checks the
instruction's fit). Operand tiles, loads per thread, shared layouts, pipeline and resources."""

from __future__ import annotations

from math import gcd

from ..language.spec import Spec
from .arch import MAX_REGISTERS_PER_THREAD, MAX_THREADS_PER_BLOCK, WARP, Arch
from .base import Plan
from .parts.operand import Operand
from .mma_sync import ldmatrix_fits, mma_sync_shape
from .parts.mainloop import Mainloop, MmaSync, Tiled
from .parts.tile import Tile
from .parts.epilogue import check_on_tiles as check_epilogue_on_tiles
from .parts.epilogue import check_staged_fits, tiled_epilogue
from .parts.schedule import check_one_block_per_tile, check_split_by, check_split_cuts_shared_tiles, schedule_of


def _largest_vector(run: int) -> int:
    return 4 if run % 4 == 0 else 2 if run % 2 == 0 else 1


def _operand(spec: Spec, name: str, BM: int, BN: int, BK: int, threads: int) -> Operand:
    layout = spec[f"layout.{name}"]
    vector = spec[f"load.{name}.vector"]
    transpose = spec[f"load.{name}.transpose"]
    mode = spec[f"shared.{name}"]
    pad = spec[f"shared.{name}.pad"] if mode == "pad" else 0
    keys_load = (f"load.{name}.vector", f"load.{name}.transpose", f"layout.{name}")
    if name == "A":
        # math view of A: m x k. Row-major: rows are m; shared default: sA[m][k].
        free = "m"
        outer_dim, inner_dim = ("m", "k") if layout == "row" else ("k", "m")
    else:
        free = "n"
        outer_dim, inner_dim = ("k", "n") if layout == "row" else ("n", "k")
    size = {"m": BM, "n": BN, "k": BK}
    extent = {"m": "M", "n": "N", "k": "K"}
    outer, inner = size[outer_dim], size[inner_dim]
    # Shared rows: A defaults to [m][k], transposed to [k][m]; B defaults to [k][n], transposed to [n][k].
    smem_row_dim = ("k" if transpose else "m") if name == "A" else ("n" if transpose else "k")
    transposed_store = smem_row_dim != outer_dim
    smem_col_dim = inner_dim if not transposed_store else outer_dim
    smem_rows, smem_cols = size[smem_row_dim], size[smem_col_dim]

    if inner % vector:
        raise spec.error(keys_load, f"{name}'s tile is {outer} x {inner} ({outer_dim} x {inner_dim}, "
                         f"{inner_dim} contiguous for {layout}-major {name}); rows of {inner} floats "
                         f"cannot be read {vector} floats at a time",
                         f"a vector width that divides {inner}")
    chunks = outer * inner // vector
    if chunks % threads:
        raise spec.error(keys_load + ("block.m",) if vector > 1 else "block.m",
                         f"{name}'s {outer} x {inner} tile is {chunks} loads of {vector} "
                         f"float(s), which {threads} threads cannot share evenly",
                         f"a tile of a multiple of {threads * vector} floats, or another vector width")
    passes = chunks // threads

    # via registers: global → registers → shared even in a cp.async pipeline; a transposing store
    # then goes in vector x vector blocks transposed in registers.
    via_registers = spec[f"load.{name}.via"] == "registers"
    blocked = via_registers and transposed_store and vector > 1
    bands_lo = _check_blocks(spec, name, outer, inner, vector, passes, smem_cols + pad,
                             threads) if blocked else 1

    swizzle = mode == "swizzle"
    swizzle_chunks = smem_cols // 4
    if swizzle:
        if smem_cols % 4 or swizzle_chunks < 2 or swizzle_chunks & (swizzle_chunks - 1):
            raise spec.error(f"shared.{name}", f"swizzle xor permutes 16-byte chunks within a shared row; "
                             f"s{name} rows hold {smem_cols} floats ({smem_col_dim}), which is not a "
                             "power-of-two number (>= 2) of 4-float chunks",
                             "rows of 8, 16, 32, ... floats, or pad N")
    smem_ld = smem_cols + pad
    if not transposed_store and vector > 1 and smem_ld % vector:
        raise spec.error(f"shared.{name}", f"pad {pad} makes s{name} rows {smem_ld} floats long, so "
                         f"{vector}-float stores into shared memory would be misaligned",
                         f"a pad that is a multiple of {vector}")
    # Whole 16-byte units per stage, so every stage (and B after A) starts aligned for float4.
    stage_floats = -(-smem_rows * smem_ld // 4) * 4

    # Shared index of the element at math coordinates (row dim, col dim) of the shared tile.
    row_var, col_var = smem_row_dim, smem_col_dim
    if swizzle:
        col_expr = f"({col_var} ^ ((({row_var}) % {swizzle_chunks}) << 2))"
    else:
        col_expr = col_var
    smem_index = f"({row_var}) * {smem_ld} + {col_expr}"

    # The inner product reads, for one k, a thread's run of TM (A) or TN (B) consecutive
    # free-dimension values; they are contiguous in shared memory when shared rows run along k.
    run = spec["thread.m"] if name == "A" else spec["thread.n"]
    frag_vector = _largest_vector(run) if smem_row_dim == "k" else 1
    if frag_vector > 1 and smem_ld % frag_vector:
        frag_vector = 1

    left = {"m": "m_left", "n": "n_left", "k": "k_left"}
    ld = f"ld{name.lower()}"
    # The block's first tile starts at its free-dimension origin, k = 0.
    origin = "block_m0" if name == "A" else "block_n0"
    tile_origin = origin if inner_dim == free else f"(long long){origin} * {ld}"
    k_step = f"BK * (long long){ld}" if outer_dim == "k" else "BK"
    return Operand(
        name=name, layout=layout, outer_dim=outer_dim, inner_dim=inner_dim, outer=outer,
        inner=inner, vector=vector, chunks_per_row=inner // vector, passes=passes,
        transposed_store=transposed_store, smem_rows=smem_rows, smem_cols=smem_cols,
        smem_ld=smem_ld, pad=pad, swizzle=swizzle, swizzle_chunks=swizzle_chunks if swizzle else 0,
        stage_floats=stage_floats, smem_index=smem_index, frag_vector=frag_vector,
        rows_left=left[outer_dim], cols_left=left[inner_dim],
        thread_runs=spec[f"load.{name}.uncoalesced"], tile_origin=tile_origin,
        k_step=k_step, extent_outer=extent[outer_dim], extent_inner=extent[inner_dim],
        via_registers=via_registers, blocked=blocked, bands_lo=bands_lo)


def _check_unroll(spec: Spec, unroll: int, BK: int, fragments: int, uses_shared: bool) -> None:
    """`unroll N`: the k loop over a shared tile, N steps per unrolled body (a smaller body keeps
    the instruction cache warm: BK 32 of 128 FFMAs each is 80 KB of code unrolled whole)."""
    if not uses_shared:
        raise spec.error("unroll", "unroll splits the k loop over a shared-memory tile, which 'shared "
                         "off' turns off", "no unroll line, or shared memory on")
    if BK % unroll:
        example = next((d for d in (8, 4, 2) if d < BK and BK % d == 0), BK)
        raise spec.error("unroll", f"unroll {unroll} does not divide the block K step of {BK}",
                         f"a divisor of {BK}, e.g. unroll {example}")
    if fragments == 2 and unroll % 2:
        raise spec.error("unroll", f"double-buffered fragments alternate between two register sets "
                         f"every k; an unrolled body of {unroll} (odd) steps would index them at run "
                         "time, from local memory", "an even unroll, or fragments 1")


def _check_blocks(spec: Spec, name: str, outer: int, inner: int, vector: int, passes: int,
                  smem_ld: int, threads: int) -> int:
    """Checks a transposing `load X vector V ... via registers` (V x V blocks transposed in
    registers); returns how many neighbouring blocks along the outer dimension neighbouring lanes
    take (up to 8: a quarter warp's 16-byte stores then fill the 32 banks)."""
    key = f"load.{name}.via"
    if spec[f"load.{name}.uncoalesced"]:
        raise spec.error(key, "via registers lays out its own coalesced loads (blocks of rows) for "
                         f"{name}'s transposing store, which uncoalesced would undo",
                         "one of uncoalesced and via registers")
    if passes % vector or outer % vector:
        raise spec.error(key, f"each thread loads {passes * vector} floats of {name}'s {outer} x {inner} "
                         f"tile, {vector} at a time; via registers transposes {vector} x {vector} blocks, "
                         f"which needs a multiple of {vector * vector} floats per thread",
                         f"a tile of a multiple of {threads * vector * vector} floats, or a narrower vector")
    if smem_ld % vector:
        raise spec.error(f"shared.{name}", f"s{name} rows are {smem_ld} floats long, so the "
                         f"{vector}-float transposed stores of via registers would be misaligned",
                         f"a pad that is a multiple of {vector}")
    return gcd(outer // vector, 8)


def tiled_plan(spec: Spec, arch: Arch) -> Plan:
    """The Plan of a tiled kernel: math simt, or tensor-core math on mma.sync (not sm_90a)."""
    if spec.written("promote"):
        raise spec.error("promote", "promote sets how often the wgmma 3xtf32 kernel adds the tensor "
                         "cores' sums into FP32 registers; this kernel has no wgmma",
                         "no promote line, or target sm_90a with math 3xtf32")
    if spec.written("round"):
        why = ("math simt multiplies in FP32" if spec["math"] == "simt" else
               "mma.sync's fragments are rounded to TF32 as they are read")
        raise spec.error("round", "round chooses how the TMA-fed wgmma kernel's tiles become TF32; "
                         f"this kernel has no wgmma ({why})",
                         "no round line, or target sm_90a with math tf32 and stages N tma")
    BM, BN, BK = spec["block.m"], spec["block.n"], spec["block.k"]
    TM, TN, RM, RN = spec["thread.m"], spec["thread.n"], spec["repeat.m"], spec["repeat.n"]
    uses_shared = spec["shared"]
    warp_tiling = spec.written("warp.m")
    WM, WN = (spec["warp.m"], spec["warp.n"]) if warp_tiling else (BM, BN)
    notes: list[str] = []
    math = spec["math"]
    mma_shape, m_step = None, 1
    if math == "simt":
        if spec.written("mma.m"):
            raise spec.error("mma.m", "mma picks a tensor-core instruction, but math simt multiplies "
                             "with FP32 FFMA", "math tf32 or math 3xtf32, or no mma line")
    else:
        mma_shape = mma_sync_shape(spec, arch, BK, WM, WN, warp_tiling, uses_shared)
        # Each lane of an m16n8 tile holds C rows g and g + 8, columns 2t and 2t + 1 (g = lane / 4,
        # t = lane % 4): a 2 x 2 "thread tile" whose rows are 8 apart, swept over the warp tile.
        TM, TN, m_step = 2, 2, 8
        RM, RN = WM // mma_shape[0], WN // mma_shape[1]

    if not uses_shared and (RM, RN) != (1, 1):
        raise spec.error("repeat.m", "sub-tile repeats sweep a warp tile held in shared memory, "
                         "which 'shared off' turns off", "thread M x N without repeat, or shared memory on")
    if warp_tiling and not uses_shared:
        raise spec.error(("warp.m", "shared"), "warp tiles share operands through shared memory, "
                         "which 'shared off' turns off", "remove the warp line, or shared memory on")
    if BM % WM or BN % WN:
        raise spec.error("warp.m", f"the block tile {BM} x {BN} is not a whole number of "
                         f"{WM} x {WN} warp tiles", f"a warp tile that divides {BM} x {BN}")
    if WM % RM or WN % RN:
        raise spec.error("repeat.m", f"repeat {RM} x {RN} does not split the "
                         f"{'warp' if warp_tiling else 'block'} tile {WM} x {WN} evenly",
                         f"a repeat that divides {WM} x {WN}")
    SUB_M, SUB_N = WM // RM, WN // RN
    if SUB_M % TM or SUB_N % TN:
        raise spec.error("thread.m", f"thread tiles of {TM} x {TN} do not cover the "
                         f"{SUB_M} x {SUB_N} sub-tile evenly "
                         f"({'warp' if warp_tiling else 'block'} tile {WM} x {WN} / repeat {RM} x {RN})",
                         f"a thread tile that divides {SUB_M} x {SUB_N}")
    lanes_m, lanes_n = SUB_M // TM, SUB_N // TN
    if warp_tiling:
        if lanes_m * lanes_n != WARP:
            raise spec.error(("thread.m", "warp.m"), f"a warp has 32 threads, but {SUB_M} x {SUB_N} "
                             f"sub-tiles of {TM} x {TN} per thread need {lanes_m * lanes_n}",
                             "warp M x N = thread tile x repeat x a 32-thread grid "
                             "(e.g. warp 64 x 64 with thread 8 x 4 repeat 1 x 4 → 8 x 4 lanes)")
        warps_m, warps_n = BM // WM, BN // WN
    else:
        warps_m = warps_n = 1
    threads = warps_m * warps_n * lanes_m * lanes_n
    if threads > MAX_THREADS_PER_BLOCK:
        raise spec.error(("thread.m", "block.m"), f"this tiling needs {threads} threads per block; "
                         f"a block has at most {MAX_THREADS_PER_BLOCK}",
                         "a larger thread tile or repeat, or a smaller block")
    if threads % WARP:
        raise spec.error(("thread.m", "block.m"), f"this tiling makes blocks of {threads} threads, "
                         "leaving part of a warp idle", "a thread count that is a multiple of 32")

    stages, fill = spec["stages"], spec["stages.fill"]
    if fill in ("tma", "copy"):
        raise spec.error("stages.fill", f"stages N {fill} feeds wgmma kernels: target sm_90a with math tf32"
                         f"{' or 3xtf32' if fill == 'tma' else ''} (this is {arch.name}, math {math})",
                         "stages N sync or async, or target sm_90a and tensor-core math")
    async_copy = fill == "async"
    fragments = spec["fragments"]
    if not uses_shared:
        for key, default in (("stages", 1), ("fragments", 1), ("load.A.vector", 1),
                             ("load.B.vector", 1), ("load.A.transpose", False),
                             ("load.B.transpose", False), ("load.A.via", "copy"),
                             ("load.B.via", "copy"), ("shared.A", "plain"), ("shared.B", "plain")):
            if spec[key] != default:
                raise spec.error(key, f"'{key}' describes the shared-memory path, which 'shared off' "
                                 "turns off", "shared off with no load, shared A/B, stages or fragments")
        if async_copy:
            raise spec.error("stages.fill", "cp.async fills shared memory, which 'shared off' turns off",
                             "stages 1")
        if spec.written("block.k") and BK != 1:
            notes.append("block K is unused without shared memory")
        BK = 1
        a = b = None
        smem_bytes = 0
    else:
        if async_copy and stages < 2:
            raise spec.error("stages", "async copies overlap the next tile's load with this tile's "
                             "math, which needs at least 2 buffers", "stages 2 async or more")
        if not async_copy and stages > 2:
            raise spec.error("stages", f"loads through registers (sync) use 1 or 2 buffers; {stages} "
                             "buffers need cp.async", f"stages 2, or stages {stages} async")
        if fragments == 2 and BK < 2:
            raise spec.error("fragments", "double-buffered fragments prefetch the next k, but the "
                             "block K step is 1", "fragments 1, or block K >= 2")
        a = _operand(spec, "A", BM, BN, BK, threads)
        b = _operand(spec, "B", BM, BN, BK, threads)
        smem_bytes = 4 * stages * (a.stage_floats + b.stage_floats)
        if smem_bytes > arch.smem_per_block:
            raise spec.error(("stages", "block.m"), f"{stages} stage(s) of A and B tiles need "
                             f"{smem_bytes} bytes of shared memory; a block on {arch.name} gets at most "
                             f"{arch.smem_per_block}", "fewer stages, or a smaller block tile")

    unroll = spec["unroll"] or BK
    if spec["unroll"]:
        _check_unroll(spec, unroll, BK, fragments, uses_shared)

    reduce_count = spec["reduce.count"]
    check_one_block_per_tile(spec)
    check_epilogue_on_tiles(spec, uses_shared)
    check_split_cuts_shared_tiles(spec, uses_shared)
    check_split_by(spec, tma=False)
    occupancy = spec["occupancy"]
    if occupancy and occupancy * threads > arch.max_threads_per_sm:
        raise spec.error("occupancy", f"{occupancy} blocks of {threads} threads exceed the "
                         f"{arch.max_threads_per_sm} threads an SM of {arch.name} holds",
                         f"occupancy up to {arch.max_threads_per_sm // threads}")

    epilogue = tiled_epilogue(spec, BM, BN, TM, TN, m_step)
    if epilogue.staged:  # C's tile reuses the operands' shared memory
        smem_bytes = max(smem_bytes, epilogue.smem_bytes)
        check_staged_fits(spec, arch, BM, BN, smem_bytes)

    staging = 0
    if uses_shared and not async_copy and stages == 2:
        staging = a.passes * a.vector + b.passes * b.vector
    elif uses_shared and async_copy:  # an operand via registers holds its next tile there
        staging = sum(op.passes * op.vector for op in (a, b) if op.via_registers)
    if mma_shape:  # A fragments are 4 registers per m16 tile, B's 2 per n8 tile; 3xtf32 keeps big and small
        fragment_registers = (2 if math == "3xtf32" else 1) * (4 * RM + 2 * RN)
    else:
        fragment_registers = fragments * (TM * RM + TN * RN)
    # 3xtf32 keeps three sets of accumulators: the sum, the cross terms and one K tile's big*big
    accumulator_sets = 3 if mma_shape and math == "3xtf32" else 1
    registers = (accumulator_sets * TM * TN * RM * RN + fragment_registers + staging + 24
                 + 2 * reduce_count)
    if registers > MAX_REGISTERS_PER_THREAD:
        raise spec.error(("thread.m", "repeat.m", "stages", "block.m"), f"each thread would hold about {registers} values in "
                         f"registers ({TM * TN * RM * RN} accumulators); a thread has at most "
                         f"{MAX_REGISTERS_PER_THREAD} registers, and the rest would spill to local memory",
                         "a smaller thread tile or repeat")
    if registers * threads > arch.regs_per_sm:
        raise spec.error(("thread.m", "block.m", "warp.m"), f"a block of {threads} threads needing about "
                         f"{registers} registers each ({registers * threads}) does not fit the "
                         f"{arch.regs_per_sm} registers of an SM: the compiler would cap registers and spill",
                         "fewer threads per block (larger warp or thread tiles), or a smaller thread tile")
    if occupancy:
        cap = arch.regs_per_sm // (occupancy * threads)
        if registers > min(cap, MAX_REGISTERS_PER_THREAD):
            raise spec.error("occupancy", f"{occupancy} blocks of {threads} threads leave {cap} registers "
                             f"per thread, but this tiling needs about {registers}",
                             "a lower occupancy, or a smaller thread tile")

    tile = Tile(BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, TM=TM, TN=TN, RM=RM, RN=RN, SUB_M=SUB_M, SUB_N=SUB_N,
                warp_tiling=warp_tiling, warps_m=warps_m, warps_n=warps_n, lanes_m=lanes_m, lanes_n=lanes_n,
                threads=threads, order=spec["order"], m_step=m_step, occupancy=occupancy)
    pipeline = dict(math=math, stages=stages, async_copy=async_copy, fragments=fragments, unroll=unroll)
    if mma_shape:
        mainloop = MmaSync(**pipeline, a=a, b=b, mma_shape=mma_shape, ldmatrix_a=ldmatrix_fits(a, "m"),
                           ldmatrix_b=ldmatrix_fits(b, "n"))
    elif uses_shared:
        mainloop = Tiled(**pipeline, a=a, b=b)
    else:
        mainloop = Mainloop(**pipeline)
    return Plan(spec=spec, name=spec.name, arch=arch, tile=tile, mainloop=mainloop,
                scheduler=schedule_of(spec, BM, BN, BK), epilogue=epilogue, smem_bytes=smem_bytes,
                registers_estimate=registers, notes=tuple(notes))
