"""The mainloop part: how A and B reach the math, K tile by K tile (CUTLASS's collective mainloop).

- Mainloop (the base): FFMA on operands read straight from global memory (`shared off`);
- Tiled: FFMA on tiles staged through shared memory (sync or cp.async pipeline, register fragments);
- MmaSync: the same tiles multiplied by warp-level mma.sync on the tensor cores (math tf32 / 3xtf32);
- the warpgroup mainloops of sm_90a, WgmmaAsync and WgmmaTma: warpgroup_mainloop.py.

Each states what the kernel's templates, the launch, the header and explain need of it: its
templates, parameters and fallback, its rows, its analysis. The planners (plan/tiled.py,
plan/mma_sync.py, plan/wgmma.py) check a spec's mainloop settings and make these; `name` is the
path's name as tests, records and the cost model know it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..arch import WARP
from .launch import MAIN, TensorMapSpec
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
    truncates = False             # whether A and B reach TF32 by truncation (cuBLAS rounds to nearest)

    @property
    def helpers(self) -> tuple[str, ...]:
        """Device code the kernel includes after common.cuh.j2."""
        return ()

    # --- the launch: the main kernel's parameters (the parts add theirs after), whether a call goes to
    # another kernel, the tensor maps a call encodes, and the words for the variant that runs
    parameters = MAIN

    def slow_layouts(self, plan: Plan) -> str | None:
        """Why this mainloop runs its plan's layouts markedly slower than A row, B col, where it
        does (a library relaid into other layouts does not choose it by A row, B col timings)."""
        return None

    def relaid_settings(self, plan: Plan, layout_a: str, layout_b: str) -> dict[str, object]:
        """Settings this mainloop's plan takes besides the layouts when a library relays it into
        A `layout_a`, B `layout_b` (library/runtime.py tries them first)."""
        return {}

    def hands_over(self, M: int, N: int, K: int, lda: int, ldb: int, pointers: dict[str, int],
                   batch: int = 1, strides: tuple[int, int] = (0, 0)) -> bool:
        """Whether this call goes to the fallback kernel instead (pointers: address % 16 of A, B, C;
        `batch` products, A's and B's strides)."""
        return False

    def tensor_maps(self, plan: Plan, M: int, N: int, K: int, lda: int, ldb: int, batch: int = 1,
                    strides: tuple[int, int] = (0, 0)) -> list[TensorMapSpec]:
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

    def notes(self, plan: Plan) -> list[str]:
        """What explain should point out about the mainloop."""
        return []

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
        return mma_lanes(plan)

    def intensities(self, plan: Plan) -> tuple[tuple[str, int, int], tuple[str, int, int] | None]:
        mm, mn, mk = self.mma_shape  # a warp's fragments of one K step feed RM x RN MMAs
        return self.block_intensity(plan), ("shared, per warp per MMA k step", 2 * mm * mn * mk * plan.RM * plan.RN,
                                            (mm * mk * plan.RM + mk * mn * plan.RN) * 4)

    def tiling_words(self, plan: Plan) -> str:
        parts = [f"block {plan.BM}x{plan.BN}x{plan.BK}"] + ([f"warp {plan.WM}x{plan.WN}"] if plan.warp_tiling else [])
        return ", ".join(parts + [f"mma {'x'.join(map(str, self.mma_shape))} repeat {plan.RM}x{plan.RN}"])

    @property
    def math_words(self) -> str:
        return tensor_math_words(self.math, self.mma_shape, "mma.sync")

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


def tensor_math_words(math: str, shape: tuple[int, int, int], how: str) -> str:
    if math == "3xtf32":  # big*big + big*small + small*big
        return f"3xtf32: 3 {how} {'x'.join(map(str, shape))} per product"
    return f"{math}: {how} {'x'.join(map(str, shape))}"


def mma_lanes(plan: Plan) -> list[tuple[int, int]]:
    """The MMA's lane layout: lane 4g + t holds row g, columns 2t and 2t + 1."""
    return [(lane // 4, lane % 4 * plan.TN) for lane in range(WARP)]
