"""The mainloop part: how A and B reach the math, K tile by K tile (CUTLASS's collective mainloop).

- Simt: FFMA on operands read straight from global memory (`shared off`);
- Tiled: FFMA on tiles staged through shared memory (sync or cp.async pipeline, register fragments);
- MmaSync: the same tiles multiplied by warp-level mma.sync on the tensor cores (math tf32 / 3xtf32);
- WgmmaAsync: sm_90a warpgroup MMA on swizzled K-major tiles that loader warpgroups fill through
  registers (any layout and alignment);
- WgmmaTma: the same fed by a TMA producer warpgroup, with a WgmmaAsync kernel (`fallback`) for the
  calls TMA cannot describe.

The planners (plan/tiled.py, plan/mma_sync.py, plan/wgmma.py) check a spec's mainloop settings and
make these; `name` is the path's name as tests, records and the cost model know it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..arch import WARP
from .launch import MAIN, TMA_MAIN, TensorMapSpec
from .operand import Operand

if TYPE_CHECKING:
    from ..base import Plan


@dataclass(frozen=True)
class Mainloop:
    """Simt without shared memory: each thread reads its rows of A and columns of B from global
    memory, one k at a time."""

    math: str = "simt"        # simt, tf32 or 3xtf32
    stages: int = 1           # shared buffers of A and B tiles
    async_copy: bool = False  # filled by cp.async (or the wgmma kernels' own loaders)
    fragments: int = 1        # register sets of the inner product's fragments (2: double-buffered)
    unroll: int = 1           # k steps per unrolled body of the inner product's loop (BK: all)

    name = "simt"
    uses_shared = False
    frame = "kernel.cu.j2"        # the file's template: the kernel in its namespace, and its launcher
    template = "naive.cu.j2"      # the kernel (kernel.cu.j2 includes it in its namespace)
    # what the other paths hold, absent here
    a = b = None                  # Operand: a tile's journey through shared memory
    mma_shape = None              # the tensor-core instruction's (M, N, K)
    ldmatrix_a = ldmatrix_b = False
    consumers = loaders = loader_registers = consumer_registers = 0
    loader_depth = 1
    tma = False
    promote_tiles = 1
    fallback = None               # the Plan of the kernel for calls this one cannot take

    @property
    def helpers(self) -> tuple[str, ...]:
        """Device code the kernel includes after common.cuh.j2."""
        return ()

    # --- the launch: the main kernel's parameters (the parts add theirs after), whether a call goes to
    # another kernel, the tensor maps a call encodes, and the words for the variant that runs
    parameters = MAIN

    def hands_over(self, M: int, N: int, K: int, lda: int, ldb: int, pointers: dict[str, int]) -> bool:
        """Whether this call goes to the fallback kernel instead (pointers: address % 16 of A, B, C)."""
        return False

    def tensor_maps(self, plan: Plan, M: int, N: int, K: int, lda: int, ldb: int) -> list[TensorMapSpec]:
        return []

    def variant(self, aligned: bool, aligned_store: str) -> str:
        return "vector variant" if aligned else "scalar variant"

    # --- rows: what the header of the .cu and explain say about the mainloop (Plan.rows adds the
    # other parts'), and what the aligned variant needs of a call
    k_slices = "slices per C tile"           # what split K cuts, in its row
    no_needs = "nothing (scalar accesses only)"

    def rows(self, plan: Plan) -> list[tuple[str, str]]:
        return ([("target", plan.arch.name), ("block tile (BM x BN x BK)", f"{plan.BM} x {plan.BN} x {plan.BK}")]
                + self.tile_rows(plan)
                + [("threads per block", f"{plan.threads} ({plan.warps} warps), lanes {plan.lanes_m} x "
                    f"{plan.lanes_n}, consecutive threads along {plan.order.upper()}")]
                + self.memory_rows(plan))

    def tile_rows(self, plan: Plan) -> list[tuple[str, str]]:
        rows = [("warp tile (WM x WN)", f"{plan.WM} x {plan.WN}, {plan.warps_m} x {plan.warps_n} warps")
                ] if plan.warp_tiling else []
        return rows + [("thread tile (TM x TN) x repeat", f"{plan.TM} x {plan.TN} x {plan.RM} x {plan.RN} "
                        f"= {plan.accumulators} accumulators")]

    def memory_rows(self, plan: Plan) -> list[tuple[str, str]]:
        return [("shared memory per block", "none (operands read from global memory)")]

    def path_rows(self, plan: Plan) -> list[tuple[str, str]]:
        """Rows on the calls this kernel hands to another."""
        return []

    def vector_requirements(self, layout_a: str, layout_b: str) -> list[tuple[str, str | None, str, int]]:
        """(pointer, size, leading dimension, vector) that the aligned variant's loads need divisible."""
        return [(op.name, op.extent_inner, op.ld, op.vector) for op in (self.a, self.b)
                if op is not None and op.vector > 1]

    # --- what explain and the cost model read: how A and B move, the math's throughput, in words
    fragment_reads = None    # how the inner product reads shared memory: "ffma" or "mma" fragments per k
    global_loads = "direct"  # A and B from global memory: "direct" (per k), "tiles", or None (whole sectors)
    owns_sm = False          # a block takes a whole SM (wgmma: setmaxnreg splits its registers)
    k_step = 1               # k per step of the inner product
    tensor_flops_per_clock = 0   # TF32 flops per SM per clock of its instruction (0: FFMA)
    no_conflicts = "none: no shared memory"   # explain's words where no bank conflict is replayed

    def accumulators(self, plan: Plan) -> float:
        """Accumulators per thread (wgmma: of a consumer's 64 x BN slab)."""
        return plan.accumulators

    def thread_origins(self, plan: Plan) -> list[tuple[int, int]]:
        """(thread_m0, thread_n0) of warp 0's lanes, as the kernel computes them."""
        origins = []
        for lane in range(min(WARP, plan.threads)):
            if plan.order == "n":
                lane_row, lane_col = lane // plan.lanes_n, lane % plan.lanes_n
            else:
                lane_row, lane_col = lane % plan.lanes_m, lane // plan.lanes_m
            origins.append((lane_row * plan.TM, lane_col * plan.TN))  # warp_row = warp_col = 0
        return origins

    def intensities(self, plan: Plan) -> tuple[tuple[str, int, int], tuple[str, int, int] | None]:
        """(scope, flops, bytes) of global memory and of shared memory (None: none read by threads)."""
        # Each thread reads TM values of A and TN of B per k straight from global memory.
        return ("global, per thread per k", 2 * plan.TM * plan.TN, (plan.TM + plan.TN) * 4), None

    def block_intensity(self, plan: Plan) -> tuple[str, int, int]:
        BM, BN, BK = plan.BM, plan.BN, plan.BK
        return "global, per block per K step", 2 * BM * BN * BK, (BM * BK + BK * BN) * 4

    def tiling_words(self, plan: Plan) -> str:
        parts = [f"block {plan.BM}x{plan.BN}x{plan.BK}" if self.uses_shared else f"block {plan.BM}x{plan.BN}"]
        if plan.warp_tiling:
            parts.append(f"warp {plan.WM}x{plan.WN}")
        thread = f"thread {plan.TM}x{plan.TN}"
        if plan.RM * plan.RN > 1:
            thread += f" repeat {plan.RM}x{plan.RN}"
        return ", ".join(parts + [thread])

    @property
    def math_words(self) -> str:
        return "simt"

    register_split = ""       # what setmaxnreg gives each kind of warpgroup
    loader_words = ""

    @property
    def tensor_cores(self) -> bool:
        return self.math != "simt"

    @property
    def split_terms(self) -> int:
        """MMAs per product: 3xtf32 adds big*small and small*big to big*big."""
        return 3 if self.math == "3xtf32" else 1


@dataclass(frozen=True)
class Tiled(Mainloop):
    """FFMA on A and B tiles staged through STAGES shared buffers: loaded through registers (sync,
    1 or 2 buffers) or by cp.async, read into register fragments per k."""

    a: Operand | None = None
    b: Operand | None = None

    uses_shared = True
    template = "tiled.cu.j2"
    math_template = "ffma.cuh.j2"  # the inner product over one shared tile
    fragment_reads = "ffma"
    global_loads = "tiles"

    def intensities(self, plan: Plan) -> tuple[tuple[str, int, int], tuple[str, int, int] | None]:
        a_run, b_run = plan.TM * plan.RM, plan.TN * plan.RN
        return self.block_intensity(plan), ("shared, per thread per k", 2 * a_run * b_run, (a_run + b_run) * 4)

    @property
    def pipeline_template(self) -> str:
        """The K loop: tiles in flight by cp.async, or through registers."""
        return "pipeline_async.cuh.j2" if self.async_copy else "pipeline_registers.cuh.j2"

    @property
    def helpers(self) -> tuple[str, ...]:
        return ("cp_async.cuh.j2",) if self.async_copy else ()

    def memory_rows(self, plan: Plan) -> list[tuple[str, str]]:
        rows = []
        for op in (self.a, self.b):
            how = "transposed through registers" if op.transposed_store else "as laid out"
            rows.append((f"{op.name} loads", f"{op.passes} x {op.vector} float(s) per thread per tile, {how}"))
            rows.append((f"shared {op.name}", op.describe()))
        rows.append(("stages", f"{self.stages} ({'cp.async' if self.async_copy else 'through registers'})"
                     f", fragments {self.fragments}"))
        return rows + [("shared memory per block", f"{plan.smem_bytes} bytes")]


@dataclass(frozen=True)
class MmaSync(Tiled):
    """The tiled pipeline with each warp's tile multiplied by mma.sync: fragments per MMA K step,
    read with ldmatrix where the shared rows allow."""

    mma_shape: tuple[int, int, int] | None = None
    ldmatrix_a: bool = False  # A fragments read with ldmatrix (shared rows run along k)
    ldmatrix_b: bool = False

    name = "mma_sync"
    math_template = "mma_multiply.cuh.j2"
    fragment_reads = "mma"
    tensor_flops_per_clock = 1024

    @property
    def k_step(self) -> int:
        return self.mma_shape[2]

    def thread_origins(self, plan: Plan) -> list[tuple[int, int]]:
        return _mma_lanes(plan)

    def intensities(self, plan: Plan) -> tuple[tuple[str, int, int], tuple[str, int, int] | None]:
        mm, mn, mk = self.mma_shape  # a warp's fragments of one K step feed RM x RN MMAs
        return self.block_intensity(plan), ("shared, per warp per MMA k step", 2 * mm * mn * mk * plan.RM * plan.RN,
                                            (mm * mk * plan.RM + mk * mn * plan.RN) * 4)

    def tiling_words(self, plan: Plan) -> str:
        parts = [f"block {plan.BM}x{plan.BN}x{plan.BK}"] + ([f"warp {plan.WM}x{plan.WN}"] if plan.warp_tiling else [])
        return ", ".join(parts + [f"mma {'x'.join(map(str, self.mma_shape))} repeat {plan.RM}x{plan.RN}"])

    @property
    def math_words(self) -> str:
        return _tensor_math_words(self.math, self.mma_shape, "mma.sync")

    @property
    def helpers(self) -> tuple[str, ...]:
        return super().helpers + ("mma_sync.cuh.j2",)

    def tile_rows(self, plan: Plan) -> list[tuple[str, str]]:
        how = {True: "ldmatrix", False: "scalar shared loads"}
        three = " (three per tile: small*big, big*small, big*big)" if self.math == "3xtf32" else ""
        rows = [("warp tile (WM x WN)", f"{plan.WM} x {plan.WN}, {plan.warps_m} x {plan.warps_n} warps")
                ] if plan.warp_tiling else []
        return rows + [
            ("math", f"{self.math} on the tensor cores, mma.sync {' x '.join(map(str, self.mma_shape))}{three}"),
            ("MMA tiles per warp", f"{plan.RM} x {plan.RN} = {plan.accumulators} accumulators per lane"),
            ("fragments", f"A by {how[self.ldmatrix_a]}, B by {how[self.ldmatrix_b]}, rounded to TF32"),
        ]


@dataclass(frozen=True)
class WgmmaAsync(Mainloop):
    """sm_90a: consumer warpgroups multiply 64 x BN slabs with wgmma from swizzled K-major tiles that
    `loaders` warpgroups read through registers, round to TF32 and store, loader_depth tiles each."""

    mma_shape: tuple[int, int, int] | None = None
    consumers: int = 0           # warpgroups that multiply
    loaders: int = 0             # warpgroups that load tiles through registers
    loader_depth: int = 1        # K tiles each loader thread holds in flight
    loader_registers: int = 0    # setmaxnreg of loader (TMA: producer) and consumer threads
    consumer_registers: int = 0

    name = "wgmma_async"
    uses_shared = True
    template = "wgmma_async.cu.j2"
    global_loads = None   # whole 128-byte K rows, or rows along M or N: full sectors either way
    owns_sm = True
    tensor_flops_per_clock = 2048
    no_conflicts = "none predicted: wgmma reads 128-byte swizzled K-major tiles"

    def intensities(self, plan: Plan) -> tuple[tuple[str, int, int], tuple[str, int, int] | None]:
        return self.block_intensity(plan), None  # the tensor cores read shared memory themselves

    def accumulators(self, plan: Plan) -> float:
        return plan.BN / 2

    def thread_origins(self, plan: Plan) -> list[tuple[int, int]]:
        return _mma_lanes(plan)  # a warp's 16 rows of its consumer's slab, as mma.sync's tile

    def tiling_words(self, plan: Plan) -> str:
        warpgroups = f"{self.consumers} consumers in turn" if plan.pingpong else f"{self.consumers} x 64x{plan.BN} warpgroups"
        stages = f"{self.stages} TMA stages" if self.tma else f"{self.stages} stages"
        return ", ".join([f"block {plan.BM}x{plan.BN}x{plan.BK}", warpgroups, stages])

    @property
    def math_words(self) -> str:
        return _tensor_math_words(self.math, self.mma_shape, "wgmma")

    @property
    def register_split(self) -> str:
        return f"setmaxnreg: loaders {self.loader_registers}, consumers {self.consumer_registers}"

    @property
    def loader_words(self) -> str:
        return f"{self.loaders} warpgroup(s) fill the stages, {self.loader_depth} K tile(s) each"

    @property
    def math_template(self) -> str:
        """The loaders' rounding and the consumers' products: TF32, or 3xtf32's big and small."""
        return "wgmma_async_3xtf32.cuh.j2" if self.math == "3xtf32" else "wgmma_async_tf32.cuh.j2"

    @property
    def helpers(self) -> tuple[str, ...]:
        return () if self.math == "3xtf32" else ("tf32.cuh.j2",)

    k_slices = "slices of the K tiles per C tile"
    no_needs = "nothing"

    def math_row(self, plan: Plan) -> tuple[str, str]:
        terms = " (three per step: small*big, big*small, big*big)" if self.math == "3xtf32" else ""
        return ("math", f"{self.math}, wgmma {' x '.join(map(str, self.mma_shape))} per consumer warpgroup and "
                        f"K step{terms}")

    def rows(self, plan: Plan) -> list[tuple[str, str]]:
        remainders = " and A's and B's TF32 remainders" if self.math == "3xtf32" else ""
        loads = (("A", plan.spec["layout.A"] == "row"), ("B", plan.spec["layout.B"] == "col"))
        return [
            ("target", f"{plan.arch.name} (wgmma fed through registers)"),
            ("block tile (BM x BN x BK)", f"{plan.BM} x {plan.BN} x {plan.BK}"),
            self.math_row(plan),
            ("threads per block", f"{plan.threads}: {self.loaders} loader warpgroup(s), {self.loader_depth} K "
                                  f"tile(s) in flight each, + {self.consumers} consumer warpgroup(s) of "
                                  f"64 x {plan.BN}"),
            ("registers", f"{self.loader_registers} per loader thread, {self.consumer_registers} per "
                          f"consumer thread (setmaxnreg); {plan.BN // 2} accumulators"),
            ("shared memory", f"{self.stages} stages of A and B tiles rounded to TF32{remainders}, K-major, "
                              f"128-byte swizzle; {plan.smem_bytes} bytes per block"),
            ("loads", "; ".join(f"{x}: " + ("16 B along K when aligned, else 4 B" if k_major else
                                            "4 B along its contiguous rows, transposed into place")
                                for x, k_major in loads)),
        ]

    def vector_requirements(self, layout_a: str, layout_b: str) -> list[tuple[str, str | None, str, int]]:
        """16-byte loads of K-contiguous operands."""
        return ([("A", "K", "lda", 4)] if layout_a == "row" else []) + ([("B", "K", "ldb", 4)] if layout_b == "col" else [])


@dataclass(frozen=True)
class WgmmaTma(WgmmaAsync):
    """sm_90a: a producer warpgroup fills the stages with TMA under mbarriers (K-major A and B); the
    register-fed `fallback` takes calls TMA cannot describe."""

    promote_tiles: int = 1       # 3xtf32: K tiles summed in the tensor cores before each add into FP32
    fallback: Plan | None = None

    name = "wgmma"
    tma = True
    frame = "wgmma_kernel.cu.j2"
    parameters = TMA_MAIN
    loader_words = ""     # a TMA producer, no loader warpgroups

    @property
    def register_split(self) -> str:
        return f"setmaxnreg: producer {self.loader_registers}, consumers {self.consumer_registers}"
    fallback_words = "register-fed fallback (TMA cannot describe A or B)"

    @staticmethod
    def tma_ready(M: int, N: int, K: int, lda: int, ldb: int, pointers: dict[str, int]) -> bool:
        """Whether TMA can load A and B: 16-byte aligned bases and row strides (and some K)."""
        return (min(M, N, K) > 0 and lda % 4 == 0 and ldb % 4 == 0
                and pointers["A"] % 16 == 0 and pointers["B"] % 16 == 0)

    def hands_over(self, M: int, N: int, K: int, lda: int, ldb: int, pointers: dict[str, int]) -> bool:
        return not self.tma_ready(M, N, K, lda, ldb, pointers)

    def tensor_maps(self, plan: Plan, M: int, N: int, K: int, lda: int, ldb: int) -> list[TensorMapSpec]:
        # With clusters each block loads a slice of the tiles its cluster row and column share. TMA's
        # view of a K-major operand: (K, rows), rows ld floats apart, boxes of BK x slice rows with the
        # 128-byte swizzle the wgmma descriptors expect (L2 promotion of 128 bytes: rows that are not
        # 128-byte aligned, e.g. ld = 4092, measured 20% faster than with 256, aligned ones the same).
        return [TensorMapSpec("map_a", "A", K, M, lda, plan.BK, plan.BM // plan.cluster_n, 128, True),
                TensorMapSpec("map_b", "B", K, N, ldb, plan.BK, plan.BN // plan.cluster_m, 128, True)]

    def variant(self, aligned: bool, aligned_store: str) -> str:
        return f"wgmma, {aligned_store if aligned else 'scalar'} C"

    def rows(self, plan: Plan) -> list[tuple[str, str]]:
        per_stage = "A and B tiles" + (" and B's TF32 remainders" if self.math == "3xtf32" else "")
        return [
            ("target", f"{plan.arch.name} (wgmma + TMA)"),
            ("block tile (BM x BN x BK)", f"{plan.BM} x {plan.BN} x {plan.BK}"),
            self.math_row(plan),
            ("threads per block", f"{plan.threads}: 1 producer warpgroup (TMA) + {self.consumers} consumer "
                                  f"warpgroup(s) of 64 x {plan.BN}"),
            ("accumulators", f"{plan.BN // 2} floats per consumer thread"),
            ("shared memory", f"{self.stages} stages of {per_stage}, K-major, 128-byte swizzle; "
                              f"{plan.smem_bytes} bytes per block"),
        ]

    def path_rows(self, plan: Plan) -> list[tuple[str, str]]:
        fallback = self.fallback
        return [
            ("TMA path needs", "K >= 1; A and B 16-byte aligned, lda and ldb multiples of 4"),
            ("otherwise", f"the fallback {fallback.launcher_name}: wgmma fed through registers "
                          f"(block {fallback.BM} x {fallback.BN} x {fallback.BK}, "
                          f"{fallback.stages} stages, {fallback.loaders} loader warpgroups)"),
        ]

    def vector_requirements(self, layout_a: str, layout_b: str) -> list[tuple[str, str | None, str, int]]:
        return []  # TMA loads A and B, whatever the variant

    @property
    def math_template(self) -> str:
        """The consumers' math: TF32 products, or 3xtf32's three with A split in registers."""
        return "wgmma_3xtf32.cuh.j2" if self.math == "3xtf32" else "wgmma_tf32.cuh.j2"


def _tensor_math_words(math: str, shape: tuple[int, int, int], how: str) -> str:
    if math == "3xtf32":  # big*big + big*small + small*big
        return f"3xtf32: 3 {how} {'x'.join(map(str, shape))} per product"
    return f"{math}: {how} {'x'.join(map(str, shape))}"


def _mma_lanes(plan: Plan) -> list[tuple[int, int]]:
    """The MMA's lane layout: lane 4g + t holds row g, columns 2t and 2t + 1."""
    return [(lane // 4, lane % 4 * plan.TN) for lane in range(WARP)]
