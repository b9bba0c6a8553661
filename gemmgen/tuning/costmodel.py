"""A cost model of a search space's points: rank them before measuring, learn from what was measured.

For one Plan at one problem shape on a GPU of `sms` SMs, `features` derives the numbers that bear
on its speed: how much of the C tiles' work is padding, how evenly the tiles (times split K) fill
the SMs, the blocks and warps resident per SM, flops per byte of global and shared memory traffic,
the shared-memory bank conflicts that explain/analysis.py predicts, the K steps each block runs, stages,
vector widths the shape lets the kernel use, and so on. `prior` folds them into one estimate (log
of a relative throughput): a roofline over the time of one block's K step (math, L2 reads,
shared-memory wavefronts, a register-fed loader's latency) plus each block's fixed cost, spread
over the SMs in whole tiles; and what decides the Hopper settings (issue 28), each from the Plan's
parts: the waves of persistent, ping-pong and stream-K walks (launch and pipeline fill paid once
per block, stream-K's dealt K tiles), clusters (whole clusters on the SMs of a GPC; multicast
cutting the shared operand's L2 reads), the epilogue's traffic (C and beta's read of it from
registers, a staged or TMA store's pass through shared memory, a TMA store's writes running under
a walk's next tile, ping-pong's other consumer multiplying while one stores), and rows not aligned
to L2's pieces. What no data sheet settles is an `Assumptions` field, chosen on recordings
leave-one-out.

`Model` is Bayesian linear regression of log TFLOP/s on those features and on the one-hot values
of each searched setting, around the prior: with nothing measured it ranks by the prior, and each
measurement moves it. Its posterior gives every unmeasured point a mean and a standard deviation,
so a strategy (strategies/model.py) can pick batches by an upper confidence bound.

`Table` computes the features of every valid point of a space at once (bank-conflict replays are
cached by the operand layout they depend on, so tens of thousands of points take seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace

import numpy as np

from ..explain.analysis import FRAGMENT_ACCESS, _store_access
from ..gpu.verify import Case
from ..plan import WARP, Plan
from ..plan.schedule import deal

GLOBAL_BYTES_PER_CLOCK = 64      # L2 -> one SM, a round figure for Hopper-class GPUs
SECTOR_BYTES = 32               # what L2 moves for a thread's load, at least
SHARED_BYTES_PER_CLOCK = 128     # 32 banks x 4 bytes per SM per clock
BLOCK_OVERHEAD_CLOCKS = 2000     # launch, prologue and pipeline fill of one block
ATOMIC_COST = 4                  # an atomicAdd of C (split K) against a plain store
DRAM_BYTES_PER_CLOCK = 12.8      # HBM to one SM when all share it: 3.35 TB/s / (132 SMs x 1.98 GHz)
# Split K's launcher first runs C = beta * C as a kernel of its own: its launch, the gap between the
# two kernels and its pass over C. Measured on an H100 (testbed_small, 1024^3): split 2 took a median
# 9 us more than split 1 on the same tiles; 6 us of it are charged here, the atomics in the epilogue.
SPLIT_PASS_CLOCKS = 12000
# FFMA issues from each of an SM's 4 schedulers every clock only with about 2 warps on each to
# cover its latency: fewer resident warps leave issue slots empty.
SIMT_WARPS_TO_ISSUE = 8


@dataclass(frozen=True)
class Assumptions:
    """What the estimate assumes where no data sheet settles it. Each is an option of the model
    strategy (strategies/model.py ASSUMED), so that benchmarks/judge_costmodel.py --choose can
    choose it leave-one-recording-out (tuning/replay.py leave_one_out): each recording judged
    with the values that did best on all the others. The defaults are its choices."""

    multicast: float = 1.0   # share of a cluster's multicast saving credited to L2's reads
    direct: float = 2.0      # clocks of a direct store of C from registers, per clock of its bytes
    gpc_share: float = 0.91  # share of the SMs that clusters of 4 or more blocks can fill at once
    latency: float = 1000.0  # clocks from a loader thread's global load to its data (under load)
    l2: float = 48.0  # bytes per clock L2 delivers to each SM when all load
    sync: float = 128.0      # clocks of a warpgroup kernel's hand-over of each K step
    granule: int = 32        # bytes L2 moves as one piece for TMA (a row not aligned to it costs one more)
    # dram: chosen leave-one-recording-out from 0, 1, 2, 4 (4 on 62 of 64 folds): issue 28's bar met on 54
    # recordings against 53 without it (benchmarks/tuning/2026-11-26-costmodel-dram-judge.md)
    dram: float = 4.0        # weight of HBM's clocks per K step (a wave's A rows and B columns, in raster order)


def granules(run: int, stride: int, granule: int) -> float:
    """Pieces of `granule` bytes a run of `run` bytes takes, averaged over rows `stride` bytes
    apart, over the pieces an aligned run takes (1: every row aligned)."""
    step = math.gcd(int(stride), int(granule))
    touched = [math.ceil((offset + run) / granule) for offset in range(0, int(granule), step)]
    return sum(touched) / len(touched) / math.ceil(run / granule)


def l2_bytes(plan: Plan, shape: Case, assume: Assumptions = Assumptions()) -> float:
    """Bytes one block reads from L2 per K tile: its A and B tiles, less `assume.multicast` of what
    its cluster's multicast saves (A is shared along N, B along M), and the pieces L2 moves in
    whole where rows of the operand's contiguous runs are not aligned to them."""
    lds = _tight_lds(shape, plan)
    a_run = plan.BK if plan.spec["layout.A"] == "row" else plan.BM
    b_run = plan.BN if plan.spec["layout.B"] == "row" else plan.BK
    a = 4 * plan.BM * plan.BK * (1 - assume.multicast * (1 - 1 / plan.cluster_n))
    b = 4 * plan.BN * plan.BK * (1 - assume.multicast * (1 - 1 / plan.cluster_m))
    granule = assume.granule if plan.tma else SECTOR_BYTES  # threads' loads move whole sectors
    return (a * granules(4 * a_run, 4 * lds["A"], granule)
            + b * granules(4 * b_run, 4 * lds["B"], granule))


L2_BYTES = 40 * 2**20  # what L2 keeps of A and B (an H100 has 50 MB)


def dram_bytes(plan: Plan, M: int, N: int, K: int, sms: int) -> float:
    """Bytes one SM reads from HBM per K step: the A rows and B columns the blocks running at once
    touch in raster order (`raster group` rows of tiles at a time), shared among them; where A and
    B fit in L2 together, only their first reading, spread over every block's K steps."""
    tiles_m, tiles_n = plan.cluster_tiles(M, N)
    k_steps = max(1, math.ceil(K / (plan.BK * plan.split_k)))
    if 4 * (M + N) * K <= L2_BYTES:
        return 4 * (M + N) * K / (tiles_m * tiles_n * plan.split_k * k_steps)
    wave = max(1, min(tiles_m * tiles_n, sms))
    group = min(plan.raster_group, tiles_m)
    if group <= 1:
        rows, cols = math.ceil(wave / tiles_n), min(wave, tiles_n)
    else:
        cols = min(tiles_n, math.ceil(wave / group))
        rows = min(tiles_m, math.ceil(wave / cols))
    return 4 * plan.BK * (rows * plan.BM + cols * plan.BN) / wave


def cluster_slots(size: int, sms: int, assume: Assumptions = Assumptions()) -> int:
    """Clusters of `size` blocks (one per SM) that run at once: a cluster's blocks share one GPC,
    and SMs come in pairs (TPCs), so pairs fill every SM; larger clusters leave the SMs of a GPC
    that do not make a whole cluster idle, `assume.gpc_share` of the SMs being usable."""
    if size <= 2:
        return max(1, sms // size)
    return max(1, math.floor(sms / size * assume.gpc_share))


def epilogue_clocks(plan: Plan, assume: Assumptions = Assumptions()) -> float:
    """Clocks the epilogue of one C tile keeps its block from multiplying: C written (and read,
    with beta) from registers; a staged store's pass through shared memory; a TMA store's global
    writes run on under a scheduled block's next tile (they are exposed only where the block ends)."""
    area = plan.BM * plan.BN
    write = 4 * area / GLOBAL_BYTES_PER_CLOCK
    read = write if plan.beta else 0.0
    through_shared = 8 * area / SHARED_BYTES_PER_CLOCK
    if plan.tma_store:
        return through_shared + read + (0.0 if plan.scheduled else write)
    if plan.staged:
        return through_shared + read + write
    return assume.direct * (write + read)


@dataclass(frozen=True)
class Features:
    """The numbers of one point at one shape that bear on its speed."""

    names: tuple[str, ...]
    values: tuple[float, ...]
    prior: float                  # log of the estimated relative throughput

    def as_dict(self) -> dict[str, float]:
        return dict(zip(self.names, self.values))


def _tight_lds(shape: Case, plan: Plan) -> dict[str, int]:
    rows = {"A": (shape.M, shape.K), "B": (shape.K, shape.N), "C": (shape.M, shape.N)}
    layouts = {"A": plan.spec["layout.A"], "B": plan.spec["layout.B"], "C": plan.c_layout}
    return {x: max(1, rows[x][1] if layouts[x] == "row" else rows[x][0]) for x in "ABC"}


def running_plan(plan: Plan, shape: Case) -> tuple[Plan, bool]:
    """The kernel that runs at this shape with dense arrays (a TMA kernel hands calls TMA cannot
    describe to its fallback), and whether its vector variant does."""
    lds = _tight_lds(shape, plan)
    pointers = {"A": 0, "B": 0, "C": 0}
    if plan.mainloop.hands_over(shape.M, shape.N, shape.K, lds["A"], lds["B"], pointers):
        plan = plan.mainloop.fallback
    return plan, plan.aligned(shape.M, shape.N, shape.K, lds["A"], lds["B"], lds["C"], pointers)


@lru_cache(maxsize=None)
def _store_wavefronts(op, threads: int, async_copy: bool) -> tuple[int, float]:
    """Wavefronts of warp 0's stores of one tile into shared memory, and their ratio to a
    conflict-free layout's (explain/analysis.py's replay; it reads only these fields of the Plan)."""
    access = _store_access(SimpleNamespace(threads=threads, async_copy=async_copy), op)
    return access.wavefronts, access.wavefronts / (access.requests * access.phases)


_FRAGMENTS: dict = {}


def _fragment_wavefronts(plan: Plan, op) -> tuple[int, float]:
    """The same for the inner product's fragment loads at one k, cached by what they depend on."""
    key = (op.name, op.smem_index, op.frag_vector, plan.TM, plan.TN, plan.RM, plan.RN, plan.SUB_M,
           plan.SUB_N, plan.lanes_m, plan.lanes_n, plan.order, min(plan.threads, WARP),
           plan.mma_shape, plan.ldmatrix_a, plan.ldmatrix_b)
    if key not in _FRAGMENTS:
        access = FRAGMENT_ACCESS[plan.mainloop.fragment_reads](plan, op)
        _FRAGMENTS[key] = (access.wavefronts, access.wavefronts / (access.requests * access.phases))
    return _FRAGMENTS[key]


def blocks_per_sm(plan: Plan) -> int:
    """Resident blocks per SM from the Plan's register estimate and shared memory (as explain's
    occupancy, with the estimate in place of ptxas's count)."""
    arch = plan.arch
    if plan.mainloop.owns_sm:  # wgmma kernels take the SM (setmaxnreg splits a block's registers)
        return 1
    per_warp = -(-plan.registers_estimate * WARP // 256) * 256
    by_registers = arch.regs_per_sm // (per_warp * plan.warps)
    by_shared = arch.smem_per_sm // (plan.smem_bytes + arch.smem_reserved)
    fits = min(arch.max_threads_per_sm // plan.threads, by_shared, arch.max_blocks_per_sm)
    # `occupancy N` makes the compiler keep registers within what N blocks leave
    return max(1, min(fits, max(by_registers, plan.occupancy)))


def features(plan: Plan, shape: Case, sms: int, assume: Assumptions = Assumptions()) -> Features:
    """The cost model's numbers for one point at one shape, on a GPU of `sms` SMs."""
    plan, vectors = running_plan(plan, shape)
    M, N, K = shape.M, shape.N, shape.K
    BM, BN, BK, split = plan.BM, plan.BN, plan.BK, plan.split_k
    tiles_m, tiles_n = plan.cluster_tiles(M, N)  # with clusters, whole clusters of tiles
    k_steps = max(1, math.ceil(K / (BK * split)))
    blocks = tiles_m * tiles_n * split
    padding = (M * N * K) / (tiles_m * BM * tiles_n * BN * k_steps * BK * split)
    per_sm = math.ceil(blocks / sms)
    fill = blocks / (sms * per_sm)
    size = plan.cluster_blocks
    slots = cluster_slots(size, sms, assume)
    if size > 1:  # whole clusters, as many at once as fit the GPCs
        per_sm = math.ceil(blocks / size / slots)
        fill = blocks / (sms * per_sm)
    occupancy = blocks_per_sm(plan)
    resident = min(occupancy, per_sm)
    warps = resident * plan.warps

    flops = 2 * BM * BN * BK
    # a cluster's multicast saves L2's reads; how much of that each SM's intake gains is assumed
    global_bytes = l2_bytes(plan, shape, assume)
    tensor_rate = plan.mainloop.tensor_flops_per_clock  # TF32 per SM, or 0 for FFMA
    if not tensor_rate:
        peak = 2 * plan.arch.fp32_lanes_per_sm
    else:
        peak = tensor_rate / plan.split_terms
    conflict = 1.0
    shared_clocks = 0.0
    if plan.mainloop.fragment_reads:  # threads read shared memory (wgmma: the tensor cores do)
        a_store, a_sc = _store_wavefronts(plan.a, plan.threads, plan.async_copy)
        b_store, b_sc = _store_wavefronts(plan.b, plan.threads, plan.async_copy)
        a_frag, a_fc = _fragment_wavefronts(plan, plan.a)
        b_frag, b_fc = _fragment_wavefronts(plan, plan.b)
        per_k = BK / plan.mainloop.k_step
        # one wavefront moves up to 128 bytes: a clock of the SM's shared-memory pipe
        shared_clocks = plan.warps * (per_k * (a_frag + b_frag) + a_store + b_store)
        ideal = plan.warps * (per_k * (a_frag / a_fc + b_frag / b_fc) + a_store / a_sc + b_store / b_sc)
        conflict = shared_clocks / ideal  # wavefronts over those of a conflict-free layout
    math_clocks = flops / peak
    if not tensor_rate:
        math_clocks /= min(1.0, warps / SIMT_WARPS_TO_ISSUE)
    global_clocks = global_bytes / assume.l2
    # Loader warpgroups (wgmma fed through registers) hold loaders x loader_depth K tiles in
    # flight: a K step takes at least a load's latency shared among them.
    loader_clocks = assume.latency / (plan.loaders * plan.loader_depth) if plan.loaders else 0.0
    dram_clocks = assume.dram * dram_bytes(plan, M, N, K, sms) / DRAM_BYTES_PER_CLOCK if assume.dram else 0.0
    parts = (math_clocks, global_clocks, shared_clocks, loader_clocks, dram_clocks)
    # Loads overlap the math where the pipeline lets them: more so with cp.async and more stages.
    overlap = 1 - 1 / (plan.stages + (1 if plan.async_copy else 0))
    # ... and each K step of a warpgroup kernel pays its hand-over in full: the stage's barrier
    # wait, a wgmma batch's issue and its wait, the release of the stage
    sync = assume.sync if plan.consumers else 0.0
    step = max(parts) + (1 - overlap) * (sum(parts) - max(parts)) + sync
    epilogue = epilogue_clocks(plan, assume)
    split_by = plan.scheduler.split_by if split > 1 else ""
    if split_by == "atomic":
        epilogue = 4 * BM * BN * ATOMIC_COST / GLOBAL_BYTES_PER_CLOCK
    elif split_by == "cluster":  # block 0 stores C, then the other slices add into it
        epilogue += 4 * BM * BN * ATOMIC_COST / GLOBAL_BYTES_PER_CLOCK
    elif split_by == "workspace":  # every slice writes its sums; the last reads them all back, then stores C
        epilogue += 4 * BM * BN * (1 + split) / GLOBAL_BYTES_PER_CLOCK
    mainloop = k_steps * step
    block_clocks = mainloop + epilogue + BLOCK_OVERHEAD_CLOCKS
    if plan.schedule == "stream-k":
        # K tiles dealt evenly (plan/schedule.py): the busiest block's K tiles, an epilogue per tile
        # it finishes, and a shared tile's partial sums read back one piece after another; the
        # block's launch and pipeline fill paid once.
        dealt = deal(plan, M, N, K, sms)
        per_sm, fill = math.ceil(dealt.tiles / max(dealt.blocks, 1)), dealt.balance * dealt.blocks / sms
        sm_clocks = (dealt.most_k_tiles * step + per_sm * epilogue + BLOCK_OVERHEAD_CLOCKS
                     + (dealt.most_pieces - 1) * 8 * BM * BN / GLOBAL_BYTES_PER_CLOCK)
    elif plan.scheduled:
        # Persistent blocks (whole clusters) walk the tiles; the producer runs on into the next
        # tile while the consumers store the last, so launch and pipeline fill are paid once.
        # Ping-pong's consumers take tiles in turn: one's epilogue hides under the other's MMAs.
        blocks_launched = plan.launch_blocks(M, N, K, sms)
        units = plan.cluster_grid(M, N) // size
        clusters = max(1, min(blocks_launched // size, slots))
        per_sm = math.ceil(units / clusters)
        fill = units / (clusters * per_sm * sms) * clusters * size
        tile = max(mainloop, epilogue) if plan.pingpong else mainloop + epilogue
        sm_clocks = per_sm * tile + BLOCK_OVERHEAD_CLOCKS
    else:
        # The busiest SM runs per_sm blocks, `resident` at a time sharing its pipes; resident
        # blocks hide each other's fixed costs but not their math.
        sm_clocks = per_sm * (mainloop + (epilogue + BLOCK_OVERHEAD_CLOCKS) / resident)
    if split_by == "atomic":
        sm_clocks += SPLIT_PASS_CLOCKS + 8 * M * N / (DRAM_BYTES_PER_CLOCK * sms)
    useful = 2.0 * M * N * K / sms
    prior = math.log(useful / sm_clocks)

    a_vec = plan.a.vector if plan.a is not None and vectors else 1
    b_vec = plan.b.vector if plan.b is not None and vectors else 1
    values = {
        "log tile efficiency": math.log(padding),
        "log SM fill": math.log(fill),
        "log blocks per SM": math.log(per_sm),
        "log resident warps": math.log(warps),
        "log global flop per byte": math.log(flops / global_bytes),
        "log shared flop per wavefront": math.log(flops / shared_clocks) if shared_clocks else 0.0,
        "bank conflict": math.log(conflict),
        "log K steps": math.log(k_steps),
        "stages": plan.stages,
        "async": float(plan.async_copy),
        "log split": math.log(split),
        "log accumulators": math.log(plan.mainloop.accumulators(plan)),
        "registers": plan.registers_estimate / 255,
        "log vector A": math.log(a_vec),
        "log vector B": math.log(b_vec),
        "log raster group": math.log(plan.raster_group),
        "math share": math.log(math_clocks / step),
        "fixed share": math.log(block_clocks / (k_steps * step)),
        "prior": prior,
    }
    return Features(tuple(values), tuple(float(v) for v in values.values()), prior)


class Table:
    """Features of every point of a space at one shape: rows in `space.valid_points` order,
    each column standardised, then the one-hot value of each searched setting."""

    def __init__(self, space, shape: Case, sms: int, assume: Assumptions = Assumptions()):
        self.points = space.valid_points
        self.index = {p: i for i, p in enumerate(self.points)}
        rows = [features(space.plan_at[p], shape, sms, assume) for p in self.points]
        self.names = list(rows[0].names) if rows else []
        raw = np.array([r.values for r in rows], dtype=float).reshape(len(rows), len(self.names))
        self.prior = np.array([r.prior for r in rows])
        self.prior_spread = float(self.prior.std()) if rows else 0.0
        spread = raw.std(axis=0)
        keep = spread > 1e-9
        numeric = (raw[:, keep] - raw[:, keep].mean(axis=0)) / spread[keep]
        self.names = [n for n, k in zip(self.names, keep) if k]
        onehot, labels = [], []
        for d, (key, values) in enumerate(zip(space.keys, space.dimensions)):
            for value in values:
                column = np.array([p[d] == value for p in self.points], dtype=float)
                if 0 < column.sum() < len(self.points):
                    onehot.append(column)
                    labels.append(f"{key}={value}")
        self.names += labels
        self.X = np.hstack([numeric, np.array(onehot).T]) if onehot else numeric


class Model:
    """Bayesian linear regression of log TFLOP/s on a Table's columns, around its prior.

    y = prior + b + X w + noise, with w ~ N(0, diag(1 / alpha)) and noise ~ N(0, 1 / beta); b (the
    level, which the prior does not know) is fitted freely. The column holding the prior itself
    gets a weight as uncertain as the prior's own spread, so that measurements that contradict the
    prior can undo it. With d other columns, their part of X w has a standard deviation of about
    sqrt(d / alpha) before anything is measured: `SPREADS` are the values of that spread (in log
    TFLOP/s) and `NOISES` of the noise's that the evidence (marginal likelihood) of the
    measurements chooses between; `START` is the spread before any.
    """

    SPREADS = (1.0, 0.5, 0.3, 0.2, 0.1, 0.05)
    NOISES = (0.02, 0.05, 0.1, 0.2, 0.4)
    START = 0.3

    def __init__(self, table: Table):
        self.table = table
        d = table.X.shape[1]
        self.own = np.array([name == "prior" for name in table.names])
        self.mean = np.zeros(d)
        self.level = 0.0
        self.noise = 0.1
        self.cov = np.diag(1 / self._alphas(d / self.START ** 2))

    def _alphas(self, alpha: float) -> np.ndarray:
        own = 1 / max(self.table.prior_spread, 1e-3) ** 2
        return np.where(self.own, own, alpha)

    def fit(self, rows: list[int], y: np.ndarray) -> None:
        X = self.table.X[rows]
        r = y - self.table.prior[rows]
        self.level = float(r.mean()) if len(r) else 0.0
        r = r - self.level
        Xc = X - X.mean(axis=0) if len(rows) > 1 else X
        best = None
        n, d = Xc.shape
        others = d - int(self.own.sum())
        for spread in self.SPREADS:
            alphas = self._alphas(max(others, 1) / spread ** 2)
            for noise in self.NOISES:
                beta = 1 / noise ** 2
                precision = np.diag(alphas) + beta * Xc.T @ Xc
                chol = np.linalg.cholesky(precision)
                mean = beta * np.linalg.solve(precision, Xc.T @ r)
                fit = beta * np.sum((r - Xc @ mean) ** 2) + alphas @ mean ** 2
                evidence = (np.sum(np.log(alphas)) + n * math.log(beta) - fit
                            - 2 * np.sum(np.log(np.diag(chol))))
                if best is None or evidence > best[0]:
                    best = (evidence, noise, mean, precision)
        _, self.noise, self.mean, precision = best
        self.cov = np.linalg.inv(precision)
        self.level -= float(X.mean(axis=0) @ self.mean) if len(rows) > 1 else 0.0

    def predict(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of log TFLOP/s (less the level) at every point."""
        X = self.table.X
        mean = self.table.prior + self.level + X @ self.mean
        var = np.einsum("ij,jk,ik->i", X, self.cov, X)
        return mean, np.sqrt(np.maximum(var, 0))
