"""The wgmma path (sm_90a, math tf32 / 3xtf32): consumer warpgroups multiplying 64 x N slabs from
swizzled K-major shared tiles, filled by a TMA producer or by loader warpgroups through registers;
setmaxnreg's register split, stages, split K and the TMA kernels' register-fed fallback."""

from __future__ import annotations

from dataclasses import replace

from ..language.spec import Spec
from .arch import MAX_REGISTERS_PER_THREAD, Arch
from .base import Plan
from .parts.epilogue import check_no_reduce, check_tma_store, warpgroup_epilogue
from .parts.warpgroup_mainloop import WgmmaAsync, WgmmaTma
from .parts.schedule import check_cluster, check_pingpong_tile, check_split_by, check_walk, schedule_of
from .parts.tile import Tile

WARPGROUP = 128
WGMMA_BK = 32             # floats in one 128-byte swizzled shared row: one TMA box along K
TMA_PRODUCER_REGISTERS = 40  # what setmaxnreg leaves the TMA producer: it only issues copies
WGMMA_MAX_REGISTERS = 232  # what setmaxnreg gives each consumer thread beside such a producer
# A producer that transposes a row-major B keeps 48, and its consumers get 224: setmaxnreg.inc takes
# registers from what the block's own warpgroups released (128 x (168 - 48) >= 256 x (224 - 168)).
MN_PRODUCER_REGISTERS, MN_CONSUMER_REGISTERS = 48, 224
COPY_LOADER_REGISTERS = 56  # a cp.async loader thread: its tiles' addresses and bounds, no data
SETMAXNREG_CAP = 240       # setmaxnreg takes multiples of 8; a thread addresses at most 255 registers


def wgmma_plan(spec: Spec, arch: Arch) -> Plan:
    """The sm_90a tensor-core kernels: BM / 64 consumer warpgroups each multiply a 64 x BN slab with
    wgmma from STAGES shared buffers (K-major, 128-byte swizzle). `stages N tma`: a producer
    warpgroup fills them with TMA under mbarriers, for K-major A and B (layout A row, B col); calls
    TMA cannot describe go to a `stages 4 async` fallback of 64 x 128 blocks. `stages N async`:
    loader warpgroups read tiles into registers, round them to TF32 (3xtf32: split them) and
    store them K-major, for any layout and alignment."""
    math = spec["math"]
    BM, BN, BK = spec["block.m"], spec["block.n"], spec["block.k"]
    for key, default in (("load.A.vector", 1), ("load.B.vector", 1), ("load.A.transpose", False),
                         ("load.B.transpose", False), ("load.A.uncoalesced", False),
                         ("load.B.uncoalesced", False), ("load.A.via", "copy"),
                         ("load.B.via", "copy"), ("shared.A", "plain"), ("shared.B", "plain")):
        if spec[key] != default:
            raise spec.error(key, "on the wgmma path tiles land in shared memory K-major with a 128-byte "
                             "swizzle, copied 16 bytes at a time where the data allow; load and shared "
                             "lines do not apply",
                             "no load or shared lines with target sm_90a and tensor-core math")
    if not spec["shared"]:
        raise spec.error("shared", "wgmma reads its operands from shared memory", "shared memory on")
    fill = spec["stages.fill"]
    if fill not in ("tma", "async", "copy"):
        raise spec.error("stages.fill", "a wgmma kernel's shared buffers are filled by TMA (a producer "
                         "warpgroup, K-major A and B), by loader warpgroups through registers (async), "
                         "or by a loader warpgroup's cp.async copies (copy: any layout and alignment)",
                         "stages N tma, stages N async or stages N copy")
    tma, copies = fill == "tma", fill == "copy"
    if copies:
        _check_copies(spec, math)
    promote_tiles = _promote_tiles(spec, math, tma, BK)
    a_k_major, b_k_major = spec["layout.A"] == "row", spec["layout.B"] == "col"
    if tma and not (a_k_major and b_k_major):
        _check_mn_major(spec, math, a_k_major, b_k_major)
    if spec.written("thread.m"):
        raise spec.error("thread.m", "with wgmma each warpgroup multiplies a 64 x N tile; there is no "
                         "thread tile", "no thread line")
    check_no_reduce(spec)
    for key, default, why in (("fragments", 1, "fragment double buffering"), ("order", "n", "thread order"),
                              ("unroll", 0, "FFMA k loop to unroll")):
        if spec[key] != default:
            raise spec.error(key, f"the wgmma path has no {why}", f"target sm_90 (mma.sync) for {why}")
    if BK != WGMMA_BK:
        raise spec.error("block.k", f"a wgmma K tile is one 128-byte swizzled row of {WGMMA_BK} floats, "
                         f"not {BK}", f"block M x N x {WGMMA_BK}")
    check_pingpong_tile(spec, BM)
    pingpong = spec["schedule"] == "pingpong"
    # Slabs: 64-row wgmma tiles a consumer multiplies per K step (pingpong 128 x N: two).
    slabs = BM // 64 if pingpong else 1
    rounding = rounding_of(spec, math, tma, slabs)
    if BM % 64 or not 1 <= BM // 64 <= 2:
        raise spec.error("block.m", f"each consumer warpgroup multiplies 64 rows; block M = {BM} "
                         "must be 64 or 128 (one or two consumer warpgroups)", "block 64 or 128 x N x 32")
    if BN % 8 or not 8 <= BN <= 256:
        raise spec.error("block.n", f"a wgmma tile is 64 x N with N a multiple of 8 up to 256, so "
                         f"block N = {BN} cannot be one", "block N from 8 to 256, a multiple of 8")
    if spec.written("warp.m") and (spec["warp.m"], spec["warp.n"]) != (64, BN):
        raise spec.error("warp.m", f"a consumer warpgroup's tile is 64 x {BN} (64 rows of the block, "
                         "all its columns)", f"warp 64 x {BN}, or no warp line")
    shape = (spec["mma.m"], spec["mma.n"], spec["mma.k"]) if spec.written("mma.m") else (64, BN, 8)
    if shape != (64, BN, 8):
        raise spec.error("mma.m", f"with block N = {BN}, each warpgroup issues wgmma 64 x {BN} x 8 "
                         f"(TF32 K step 8), not {' x '.join(map(str, shape))}", f"mma 64 x {BN} x 8")
    stages = spec["stages"]
    if stages < 2:
        raise spec.error("stages", "the pipeline loads tiles ahead of the math; it needs at least "
                         "2 buffers", "stages 2 to 8, e.g. stages 4")
    consumers = 2 if pingpong else BM // 64  # pingpong: two consumers, each on its own tile
    check_tma_store(spec, tma)
    epilogue = warpgroup_epilogue(spec, BN)
    c_stage_bytes = epilogue.smem_bytes(consumers) if epilogue.tma_store else 0
    # Loader warpgroups hold K tiles in registers between their loads and their stores; a single
    # consumer multiplies a tile faster than one loader's loads return, so it gets two loaders.
    # One warpgroup issues cp.async copies for any number of consumers (it holds only addresses).
    loaders = 0 if tma else (2 if consumers == 1 and not copies else 1)
    threads = (consumers + (1 if tma else loaders)) * WARPGROUP
    if tma:  # 3xtf32: B's remainders too (A is split in registers)
        stage_bytes = 4 * BK * (BM + BN * (2 if math == "3xtf32" else 1))
    else:    # 3xtf32: A's and B's remainders too
        stage_bytes = 4 * BK * (BM + BN) * (2 if math == "3xtf32" else 1)
    # mbarriers per stage (full, empty; TMA 3xtf32 or rounding by warps: ready), and slack to align buffers to 1024 B.
    barriers = (3 if tma and (math == "3xtf32" or rounding in ("producer", "consumer")) else 2) * 8 * stages
    check_split_by(spec, tma)
    if spec["split"] > 1 and spec["split.by"] in ("cluster", "workspace"):
        barriers += 8  # split K in a cluster: "block 0 has stored C"; through a workspace: "the last slice"
    smem_bytes = stages * stage_bytes + c_stage_bytes + barriers + 1024
    if smem_bytes > arch.smem_per_block:
        staged = f" and the staged epilogue's {c_stage_bytes}" if c_stage_bytes else ""
        raise spec.error(("stages", "block.m"), f"{stages} stages of {stage_bytes} bytes{staged} need "
                         f"{smem_bytes} bytes of shared memory; a block on {arch.name} gets at most "
                         f"{arch.smem_per_block}", f"stages {(arch.smem_per_block - 1024 - c_stage_bytes - barriers) // stage_bytes} "
                         "or fewer, or a smaller block")
    accumulators = slabs * BN // 2  # a 64 x BN fp32 tile (per slab) over 128 threads
    loaded_floats = (BM + BN) * BK // WARPGROUP  # a loader thread's share of one K tile
    if tma:
        loader_registers, limit = TMA_PRODUCER_REGISTERS, WGMMA_MAX_REGISTERS
        if not b_k_major:  # its warps 1-3 hold a box's columns while they transpose it
            loader_registers, limit = MN_PRODUCER_REGISTERS, MN_CONSUMER_REGISTERS
    else:
        # Each thread starts with `launch` registers. A lone consumer (64-row blocks) takes 8 from
        # each of its two loaders with setmaxnreg, for wide tiles; the loaders still hold a K tile
        # and its addresses (ptxas spilled some loaders at 152, none at 160). A cp.async loader
        # holds addresses only, and the consumers take what it releases.
        launch = min(MAX_REGISTERS_PER_THREAD, arch.regs_per_sm // threads) // 8 * 8
        loader_registers = COPY_LOADER_REGISTERS if copies else launch - 8 if loaders > consumers else launch
        limit = min(SETMAXNREG_CAP, (launch * (loaders + consumers) - loaders * loader_registers)
                    // consumers // 8 * 8)
    if math != "3xtf32":  # TMA-fed A from registers (round nearest consumer, a column-major A): two tiles' fragments (wgmma_round_a.cuh.j2)
        registers = accumulators + 48 + (2 * 4 * BK // 8 if rounding == "consumer" or (tma and not a_k_major) else 0)
    elif tma:  # also one K tile's products and A's big and small fragments (see wgmma_kernel.cu.j2)
        registers = 2 * accumulators + 32 + 40
    else:      # also one K tile's products (see wgmma_async.cu.j2)
        registers = 2 * accumulators + 40
    if registers > limit:
        raise spec.error("block.n", f"a consumer thread would hold about {registers} registers "
                         f"({accumulators} accumulators); it can have {limit}"
                         + ("" if tma else f" beside {loaders} loader warpgroup(s) of "
                            f"{loader_registers}"), "a smaller block N")
    # Two tiles in flight per loader where their registers fit (loads wait on memory most of the time);
    # cp.async copies run up to every stage ahead, holding no registers.
    loader_depth = 2 if loaders and 2 * loaded_floats + 64 <= loader_registers else 1
    if copies:  # tiles whose copies are in flight (3xtf32: behind them, one tile being split)
        loader_depth = stages - (2 if math == "3xtf32" else 1)
    elif loaders and loaded_floats + 56 > loader_registers:
        raise spec.error(("block.m", "block.n"), f"a loader thread would hold {loaded_floats} floats "
                         f"of each K tile and their addresses in {loader_registers} registers",
                         "a smaller block")
    occupancy = spec["occupancy"]
    if occupancy > 1:
        raise spec.error("occupancy", "a wgmma block takes most of an SM's shared memory and registers",
                         "occupancy 1, or no occupancy line")
    check_walk(spec, tma, math)
    check_cluster(spec, tma, BM, BN)
    fallback = None
    if tma:
        # Calls TMA cannot describe go to the register-fed kernel (stages N async) with 64 x 128
        # blocks. On an H100 in TF32 it beat mma.sync, the fallback before it, at every shape
        # measured: 4096^3 with ld + 1, 84.8 against 78.0 TFLOP/s; 2048^3 with ld + 1, 78.7
        # against 74.9; 127x4099x1023, 28.6 against 12.4 (64-row blocks spread skinny C over
        # the SMs).
        fallback = wgmma_plan(replace(spec.with_values(
            block_m=64, block_n=128, warp_m=64, warp_n=128, mma_m=64, mma_n=128, mma_k=8, stages=4,
            stages_fill="async", schedule="data-parallel", cluster_m=1, cluster_n=1, epilogue_staged=False,
            promote=0, split_by="atomic",  # (its loaders round every tile, whatever the round line)
            **({"round": "nearest", "round_by": "tma"} if spec.written("round") else {}),
            # its split K adds into C by atomics, after each slice's epilogue: no activation of a part
            **({"split": 1} if spec["activation"] != "none" else {})),
            name=f"{spec.name}_fallback"), arch)  # make_plan's choice for it: the register-fed path
    tile = Tile(BM=BM, BN=BN, BK=BK, WM=64, WN=BN, TM=2, TN=2, RM=slabs, RN=BN // 8,
                SUB_M=64 if slabs > 1 else 16, SUB_N=8, warp_tiling=True, warps_m=consumers, warps_n=1,
                lanes_m=8, lanes_n=4, threads=threads, order="n", m_step=8, occupancy=1)
    common = dict(math=math, stages=stages, async_copy=True, unroll=BK, mma_shape=shape, consumers=consumers,
                  loaders=loaders, loader_depth=loader_depth, loader_registers=loader_registers,
                  consumer_registers=limit)
    mainloop = (WgmmaTma(**common, promote_tiles=promote_tiles, fallback=fallback, rounding=rounding,
                         a_k_major=a_k_major, b_k_major=b_k_major) if tma
                else WgmmaAsync(**common, copies=copies))
    return Plan(spec=spec, name=spec.name, arch=arch, tile=tile, mainloop=mainloop,
                scheduler=schedule_of(spec, BM, BN, BK, consumers), epilogue=epilogue, smem_bytes=smem_bytes,
                registers_estimate=registers)


def _check_mn_major(spec: Spec, math: str, a_k_major: bool, b_k_major: bool) -> None:
    """TMA copies tiles as they lie, and wgmma reads TF32 operands from shared memory only K-major.
    The consumers read a column-major A's fragments from its MN-major tile into registers (3xtf32
    splits them there anyway; tf32 takes them as TMA rounded them, or rounds them with `round nearest
    consumer`) and issue wgmma with A from registers; a row-major B (3xtf32) lands MN-major and the
    producer's warps, which write B's TF32 remainders already, transpose it K-major as they split it."""
    layouts = ("layout.A", "layout.B")
    if math != "3xtf32":
        if not b_k_major:
            raise spec.error(layouts, "wgmma reads TF32 operands from shared memory only K-major, and TMA "
                             "copies tiles as they lie: with math tf32, B must be column-major (K "
                             "contiguous; a column-major A is read into registers)",
                             "layout B col; math 3xtf32 (which transposes B in shared memory); or "
                             "stages N copy (cp.async lands any layout K-major)")
        if spec.written("round") and spec["round"] == "nearest" and spec["round.by"] == "producer":
            raise spec.error(("layout.A", "round.by"), "round nearest producer rounds the landed tiles in "
                             "shared memory, where wgmma reads A K-major; a column-major A lands MN-major and "
                             "is read into registers instead", "round nearest consumer (A rounded in registers)")
        if spec["schedule"] == "pingpong" and spec["block.m"] > 64:
            raise spec.error(("layout.A", "block.m"), "with math tf32 the consumers read a column-major A's "
                             "fragments into registers, one 64-row slab's; a ping-pong consumer with a "
                             f"{spec['block.m']}-row tile would hold two slabs' fragments twice over beside "
                             "its accumulators", "block 64 x N x 32 with schedule pingpong, or layout A row")
    if spec["cluster.m"] * spec["cluster.n"] > 1:
        raise spec.error(layouts + ("cluster.m",), "the blocks of a cluster multicast slices of K-major "
                         "tiles; a column-major A or row-major B lands in 32-row boxes along M or N",
                         "no cluster line, or layout A row, B col")
    if not b_k_major and spec["block.n"] % 32:
        raise spec.error(("layout.B", "block.n"), f"a row-major B lands in boxes of 32 columns (128 bytes, "
                         f"the swizzle's row); block N = {spec['block.n']} is not a multiple of 32",
                         "block N a multiple of 32, or layout B col")


def _check_copies(spec: Spec, math: str) -> None:
    """cp.async copies floats as they lie: TF32 read by truncation, no rounding on the way (the
    register-fed loaders round, TMA as it copies), so a tf32 copy kernel must say `round truncate`.
    With 3xtf32 the loader splits each landed tile a tile behind the consumers, so it needs 3 stages."""
    if math == "3xtf32" and spec["stages"] < 3:
        raise spec.error(("stages", "math"), f"with math 3xtf32 and stages N copy, the loader splits a "
                         "landed tile into TF32 big and small while the consumers multiply the one before "
                         f"it and the next one's copies are in flight: 3 stages at least, not {spec['stages']}",
                         "stages 3 copy or more")
    if math == "tf32" and spec["round"] == "nearest":
        raise spec.error(("round", "stages.fill") if spec.written("round") else "stages.fill",
                         "stages N copy lands tiles as they lie, and wgmma truncates them to TF32 (about "
                         "2.6x cuBLAS TF32's error on random data), where math tf32 rounds them to nearest "
                         "by default; rounding them would take a pass over each tile",
                         "round truncate (to accept truncation), or stages N tma / async (which round)")
    if spec["layout.B"] == "row" and spec["block.n"] % 32:
        raise spec.error(("layout.B", "block.n"), f"the loader copies a row-major B in groups of 32 "
                         f"columns (a warp: 8 columns x 4 k, the warpgroup 32); block N = "
                         f"{spec['block.n']} is not a multiple of 32", "block N a multiple of 32, or layout B col")


def rounding_of(spec: Spec, math: str, tma: bool, slabs: int) -> str:
    """How the TMA-fed tf32 kernel's A and B become TF32 (`round`): tma (TMA rounds them to nearest
    as it copies them: tensor maps of type TFLOAT32; the default), producer (the producer's warps 1-3
    round both tiles in shared memory), consumer (those warps round B; the consumers read A into
    registers and round it there) or truncate (wgmma reads the floats TMA wrote and drops their low 13
    bits). The register-fed kernel always rounds, in its loaders; cp.async copies truncate."""
    if not spec.written("round"):
        return "tma" if tma and math == "tf32" else "truncate"
    nearest = spec["round"] == "nearest"
    if math != "tf32":
        raise spec.error("round", f"round chooses how math tf32 reads its inputs; math {math} splits "
                         "each float into TF32 big and small parts (rounded to nearest) itself",
                         "no round line, or math tf32")
    if not tma:
        if spec["stages.fill"] == "copy":
            return "truncate"  # (_check_copies: a tf32 copy kernel says so)
        if nearest and spec["round.by"] == "tma":
            return "truncate"  # the register-fed kernel's loaders round every tile already
        raise spec.error(("round", "round.by") if nearest else "round",
                         "the register-fed wgmma kernel (stages N async) rounds each tile to TF32 in its "
                         "loaders, on their way to shared memory: it neither truncates nor rounds by TMA "
                         "or a producer", "round nearest, or no round line")
    if not nearest:
        return "truncate"
    by = spec["round.by"]
    if by == "consumer" and slabs > 1:
        raise spec.error(("round", "round.by", "block.m"), "round nearest consumer reads A's fragments into "
                         "registers for each 64-row slab; a ping-pong consumer with a 128-row tile "
                         "would hold two slabs' fragments twice over beside its 128 x N accumulators",
                         "round nearest (TMA rounds), or block 64 x N x 32 with schedule pingpong")
    return by


def _promote_tiles(spec: Spec, math: str, tma: bool, BK: int) -> int:
    """K tiles whose three products the 3xtf32 consumers sum in the tensor cores before adding
    them into acc in FP32 (`promote K`; default one tile). The tensor cores round their sums
    toward zero, so the longer the sum the larger its drift; the shorter, the more often the
    tensor pipe drains while the sum is added."""
    promote = spec["promote"]
    if not promote:
        return 1
    if math != "3xtf32":
        raise spec.error("promote", f"math {math} sums in the tensor cores all along K; only 3xtf32 adds "
                         "their sums into FP32 registers", "no promote line, or math 3xtf32")
    if not tma:
        raise spec.error("promote", "the register-fed 3xtf32 kernel (stages N async) adds the sums every "
                         "K tile", "stages N tma, or no promote line")
    if promote % BK or promote // BK not in (1, 2, 4, 8):
        raise spec.error("promote", f"promote {promote} is not 1, 2, 4 or 8 K tiles of {BK} floats (the "
                         "consumers alternate two sets of A registers, so a group keeps its parity)",
                         f"promote {BK}, {2 * BK}, {4 * BK} or {8 * BK}")
    return promote // BK
