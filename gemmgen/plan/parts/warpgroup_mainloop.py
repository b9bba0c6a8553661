"""The warpgroup mainloops of sm_90a (parts/mainloop.py has the others): consumer warpgroups multiply
64 x BN slabs with wgmma from swizzled K-major shared tiles, filled

- WgmmaAsync: by loader warpgroups through registers (any layout and alignment), or with `copies`
  by one loader warpgroup's cp.async copies straight into the tiles (the same; TF32 truncated, or
  with 3xtf32 each landed tile split in place into TF32 big parts and remainders), or
- WgmmaTma: by a TMA producer warpgroup (K-major A and B, 16-byte aligned), with a WgmmaAsync
  kernel (`fallback`) for the calls TMA cannot describe.
plan/wgmma.py plans both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .launch import TMA_MAIN, TensorMapSpec
from .mainloop import Mainloop, mma_lanes, tensor_math_words

# TMA steps through batches of A and B (stride not 0) 16 bytes apart or more, below 2^40 bytes, and
# (the launcher's own rule) past the whole matrix; the C launcher's test of the same, per operand:
TMA_STRIDE_LIMIT = 1 << 38  # floats


def tma_batch_checks(a_outer: str = "M", b_outer: str = "N") -> tuple[str, ...]:
    """The C launcher's test per operand: its stride 0, or 16-byte steps past the matrix (its outer
    extent, rows K-major or K MN-major, times its leading dimension)."""
    return tuple(f"({s} == 0 || ({s} % 4 == 0 && {s} >= (long long){outer} * {ld} && {s} < (1LL << 38)))"
                 for s, outer, ld in (("strideA", a_outer, "lda"), ("strideB", b_outer, "ldb")))


TMA_BATCH_CHECKS = tma_batch_checks()
MN_BOX = 32  # floats along M or N in a box of an MN-major operand: one 128-byte swizzled row
RELAID_STAGES = 4  # the fewest TMA stages of a tf32 member relaid to read a column-major A (relaid_settings)

# The TMA-fed tf32 consumers' math per `round` (wgmma.py's rounding_of).
ROUNDING_TEMPLATES = {"tma": "wgmma_tf32.cuh.j2", "truncate": "wgmma_tf32.cuh.j2",
                      "producer": "wgmma_round_shared.cuh.j2", "consumer": "wgmma_round_a.cuh.j2"}
# The tensor maps' element type of A and B: TMA rounds floats to nearest TF32 as it copies them into a
# TFLOAT32 map (its rounding is cvt.rna's: on an H100 the tf32 members' error became cuBLAS TF32's to
# five digits, at the same speed).
MAP_DATA_TYPES = {True: "CU_TENSOR_MAP_DATA_TYPE_TFLOAT32", False: "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"}
# 3xtf32's B: the tensor core reads the float TMA wrote as its big part, truncated. Where cuBLAS
# FP32's error is small the producer's warps round the big part to nearest in place first, a store more
# per float: sums of K <= ROUND_B_SHORT_K, and small calls (batch x M x N <= ROUND_B_MAX_MN) of K <=
# ROUND_B_MAX_K. On an H100 (fa88dff, the fp32 library): the error there fell from 1.8-2.0e-7 to
# 1.2-1.6e-7 (cuBLAS FP32 1.4-2.1e-7 at 256^3 to 768^3 and 16384x4096x64), and rounding cost 1-4% of
# those calls' speed but 5-10% at large calls of K 256-1024, where cuBLAS FP32's error is 2.9-5.7e-7
# (and 7% at batches of 64 x 512^3, 4.1e-7 for torch.bmm).
ROUND_B_SHORT_K = 128
ROUND_B_MAX_K = 1024
ROUND_B_MAX_MN = 1 << 21

if TYPE_CHECKING:
    from ..base import Plan


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
    copies: bool = False         # `stages N copy`: the loader's cp.async copies land tiles as they lie

    name = "wgmma_async"
    uses_shared = True
    template = "wgmma_async.cu.j2"
    global_loads = None   # whole 128-byte K rows, or rows along M or N: full sectors either way
    owns_sm = True
    tensor_flops_per_clock = 2048
    no_conflicts = "none predicted: wgmma reads 128-byte swizzled K-major tiles"

    @property
    def truncates(self) -> bool:
        """cp.async copies land floats as they lie, and wgmma truncates them (the loaders round)."""
        return self.math == "tf32" and self.copies

    def intensities(self, plan: Plan) -> tuple[tuple[str, int, int], tuple[str, int, int] | None]:
        return self.block_intensity(plan), None  # the tensor cores read shared memory themselves

    def accumulators(self, plan: Plan) -> float:
        return plan.BN / 2

    def thread_origins(self, plan: Plan) -> list[tuple[int, int]]:
        return mma_lanes(plan)  # a warp's 16 rows of its consumer's slab, as mma.sync's tile

    def tiling_words(self, plan: Plan) -> str:
        warpgroups = f"{self.consumers} consumers in turn" if plan.pingpong else f"{self.consumers} x 64x{plan.BN} warpgroups"
        stages = f"{self.stages} TMA stages" if self.tma else f"{self.stages} stages"
        return ", ".join([f"block {plan.BM}x{plan.BN}x{plan.BK}", warpgroups, stages])

    @property
    def math_words(self) -> str:
        return tensor_math_words(self.math, self.mma_shape, "wgmma")

    @property
    def register_split(self) -> str:
        return f"setmaxnreg: loaders {self.loader_registers}, consumers {self.consumer_registers}"

    @property
    def loader_words(self) -> str:
        if self.copies:
            return f"1 warpgroup's cp.async copies, up to {self.loader_depth} K tile{'s' if self.loader_depth > 1 else ''} ahead"
        return f"{self.loaders} warpgroup(s) fill the stages, {self.loader_depth} K tile(s) each"

    @property
    def math_template(self) -> str:
        """The loaders' rounding and the consumers' products: TF32, or 3xtf32's big and small (copies:
        TF32 as the tiles lie, or 3xtf32's split once they land)."""
        if self.copies:
            return "wgmma_copy_3xtf32.cuh.j2" if self.math == "3xtf32" else "wgmma_copy_tf32.cuh.j2"
        return "wgmma_async_3xtf32.cuh.j2" if self.math == "3xtf32" else "wgmma_async_tf32.cuh.j2"

    @property
    def helpers(self) -> tuple[str, ...]:
        return () if self.math == "3xtf32" or self.copies else ("tf32.cuh.j2",)

    @property
    def loader_template(self) -> str:
        """The loader warpgroups' code: tiles read into registers and stored by the math template,
        or copied with cp.async."""
        return "wgmma_loaders_copy.cuh.j2" if self.copies else "wgmma_loaders_registers.cuh.j2"

    @property
    def a_from_registers(self) -> bool:
        """Whether wgmma.cuh.j2 defines the wgmma that takes A's fragments from registers."""
        return self.math == "3xtf32"

    k_slices = "slices of the K tiles per C tile"
    no_needs = "nothing"

    def math_row(self, plan: Plan) -> tuple[str, str]:
        terms = " (three per step: small*big, big*small, big*big)" if self.math == "3xtf32" else ""
        return ("math", f"{self.math}, wgmma {' x '.join(map(str, self.mma_shape))} per consumer warpgroup and "
                        f"K step{terms}")

    def rows(self, plan: Plan) -> list[tuple[str, str]]:
        if self.copies:
            return self.copy_rows(plan)
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

    def copy_rows(self, plan: Plan) -> list[tuple[str, str]]:
        """explain's rows of the cp.async-fed kernel."""
        tiles = ("A and B tiles split into TF32 big parts and remainders by the loader once its copies land"
                 if self.math == "3xtf32" else "A and B tiles as they lie (wgmma truncates them to TF32)")
        loads = (("A", plan.spec["layout.A"] == "row"), ("B", plan.spec["layout.B"] == "col"))
        return [
            ("target", f"{plan.arch.name} (wgmma fed by cp.async)"),
            ("block tile (BM x BN x BK)", f"{plan.BM} x {plan.BN} x {plan.BK}"),
            self.math_row(plan),
            ("threads per block", f"{plan.threads}: 1 loader warpgroup (cp.async) + {self.consumers} consumer "
                                  f"warpgroup(s) of 64 x {plan.BN}"),
            ("registers", f"{self.loader_registers} per loader thread, {self.consumer_registers} per "
                          f"consumer thread (setmaxnreg); {plan.BN // 2} accumulators"),
            ("shared memory", f"{self.stages} stages of {tiles}, K-major, 128-byte swizzle; "
                              f"{plan.smem_bytes} bytes per block"),
            ("loads", "; ".join(f"{x}: " + ("cp.async of 16 B when aligned, else 4 B, a warp along K" if k_major else
                                            "cp.async of 4 B, a warp 8 rows x 4 k, into K-major places")
                                for x, k_major in loads) + "; any leading dimension and 4-byte alignment"),
        ]

    def slow_layouts(self, plan: Plan) -> str | None:
        mn_major = [x for x, layout, k_major in (("A", plan.spec["layout.A"], "row"), ("B", plan.spec["layout.B"], "col"))
                    if layout != k_major]
        if not (self.copies and mn_major):
            return None
        return (f"its cp.async loader copies an MN-major {' and '.join(mn_major)} 4 bytes at a time (0.49-0.59x "
                "cuBLAS TF32 on an H100, BENCHMARKS.md), far from its K-major speed")

    def vector_requirements(self, layout_a: str, layout_b: str) -> list[tuple[str, str | None, str, int]]:
        """16-byte loads (copies) of K-contiguous operands."""
        return ([("A", "K", "lda", 4)] if layout_a == "row" else []) + ([("B", "K", "ldb", 4)] if layout_b == "col" else [])


@dataclass(frozen=True)
class WgmmaTma(WgmmaAsync):
    """sm_90a: a producer warpgroup fills the stages with TMA under mbarriers (K-major A and B); the
    register-fed `fallback` takes calls TMA cannot describe."""

    promote_tiles: int = 1       # 3xtf32: K tiles summed in the tensor cores before each add into FP32
    fallback: Plan | None = None
    rounding: str = "truncate"   # tf32: round to nearest by TMA, the producer (A and B) or consumer (A); or truncate
    a_k_major: bool = True       # A row-major; else its MN-major tile is read into registers
    b_k_major: bool = True       # B column-major; else (3xtf32) the producer transposes its MN-major tile

    name = "wgmma"
    tma = True
    frame = "wgmma_kernel.cu.j2"
    parameters = TMA_MAIN
    loader_words = ""     # a TMA producer, no loader warpgroups

    @property
    def register_split(self) -> str:
        return f"setmaxnreg: producer {self.loader_registers}, consumers {self.consumer_registers}"

    def notes(self, plan: Plan) -> list[str]:
        return self.rounding_notes(plan) + [f"{label}: {words}" for label, words in self.mn_major_rows()]

    @property
    def round_b_limits(self) -> dict[str, int]:
        """Where 3xtf32 rounds B's big part to nearest (the kernel's round_b): see ROUND_B_MAX_K."""
        return {"ROUND_B_SHORT_K": ROUND_B_SHORT_K, "ROUND_B_MAX_K": ROUND_B_MAX_K, "ROUND_B_MAX_MN": ROUND_B_MAX_MN}

    def rounding_notes(self, plan: Plan) -> list[str]:
        if self.math == "3xtf32":
            return [f"TF32 split of B: its big part rounded to nearest by the producer's warps 1-3 (a store more "
                    f"per float) where K <= {ROUND_B_SHORT_K}, or K <= {ROUND_B_MAX_K} and batch x M x N <= "
                    f"{ROUND_B_MAX_MN}, else truncated by the tensor core; A split in registers, rounded to "
                    "nearest"] + self.promote_notes(plan)
        if self.math == "tf32" and self.rounding == "truncate":
            return ["TF32 rounding: none (round truncate); wgmma truncates A and B to TF32 (drops each float's "
                    "low 13 bits), where cuBLAS rounds to nearest: about 2.6x its error on random data (with "
                    "no round line TMA rounds them as it copies them, at no cost)"]
        if self.rounding != "truncate":
            return [f"{label}: {value}" for label, value in self.rounding_rows(plan)]
        return self.promote_notes(plan)

    def promote_notes(self, plan: Plan) -> list[str]:
        if self.promote_tiles == 1:
            return []
        return [f"The tensor cores sum {self.promote_tiles} K tiles ({self.promote_tiles * plan.BK} of K) of "
                "products before the consumers add them into FP32 (promote): the tensor pipe drains "
                "once per group, and the sums round toward zero over that span."]
    fallback_words = "register-fed fallback (TMA cannot describe A or B)"

    @staticmethod
    def tma_ready(M: int, N: int, K: int, lda: int, ldb: int, pointers: dict[str, int]) -> bool:
        """Whether TMA can load A and B: 16-byte aligned bases and row strides (and some K)."""
        return (min(M, N, K) > 0 and lda % 4 == 0 and ldb % 4 == 0
                and pointers["A"] % 16 == 0 and pointers["B"] % 16 == 0)

    def batches_ready(self, M: int, N: int, K: int, lda: int, ldb: int, batch: int,
                      strides: tuple[int, int]) -> bool:
        """Whether TMA can step through the batches of A and B (tma_batch_checks in Python)."""
        a_outer, b_outer = (M if self.a_k_major else K), (N if self.b_k_major else K)
        return batch <= 1 or all(stride == 0 or (stride % 4 == 0 and outer * ld <= stride < TMA_STRIDE_LIMIT)
                                 for stride, outer, ld in ((strides[0], a_outer, lda), (strides[1], b_outer, ldb)))

    @property
    def batch_checks(self) -> tuple[str, ...]:
        """batches_ready as the C launcher's conditions."""
        return tma_batch_checks("M" if self.a_k_major else "K", "N" if self.b_k_major else "K")

    def hands_over(self, M: int, N: int, K: int, lda: int, ldb: int, pointers: dict[str, int],
                   batch: int = 1, strides: tuple[int, int] = (0, 0)) -> bool:
        return not (self.tma_ready(M, N, K, lda, ldb, pointers)
                    and self.batches_ready(M, N, K, lda, ldb, batch, strides))

    def relaid_settings(self, plan: Plan, layout_a: str, layout_b: str) -> dict[str, object]:
        """A TF32 kernel reading a column-major A's fragments into registers stores C through shared
        memory (staged): stored from registers, the same kernel ran 0.79-0.87x its A row speed, staged
        0.99-1.02x (H100, 537a679: 128 x 256 at 4096^3, 2048x8192x2048, 2048x5632x2048, 2048^3;
        benchmarks/layouts/2026-11-26-h100-537a679-relaid-store.json). And it keeps RELAID_STAGES
        stages at least, whose loads cover the fragments' reads: the 128 x 256 member of 3 stages ran
        331-338 TFLOP/s at 4096^3 relaid, the same tile of 4 stages 0.97-1.00x the A row member's 369
        (H100, benchmarks/torch/2026-11-27-h100-9d75c37-layouts.json against f1776b3's)."""
        if self.math != "tf32" or layout_a != "col":
            return {}
        settings: dict[str, object] = {}
        if not plan.spec["epilogue.staged"]:
            settings["epilogue_staged"] = True
        if self.tma and self.stages < RELAID_STAGES:
            settings["stages"] = RELAID_STAGES
        return settings

    @property
    def k_major(self) -> bool:
        """Both operands K-major (A row, B col): each lands as one box per stage, as wgmma reads it."""
        return self.a_k_major and self.b_k_major

    def boxes(self, plan: Plan) -> tuple[tuple[str, bool, int, int, int], ...]:
        """Per operand, how TMA views it and what one stage takes: (operand, K-major, rows of its
        tile, box along the contiguous dimension, boxes per stage). K-major: (K, rows) in one box of
        BK x rows; MN-major: (rows, K) in boxes of 32 rows (128 bytes, the swizzle's row) x BK."""
        return tuple((x, k_major, rows, plan.BK if k_major else MN_BOX, 1 if k_major else rows // MN_BOX)
                     for x, k_major, rows in (("A", self.a_k_major, plan.BM), ("B", self.b_k_major, plan.BN)))

    def launcher_views(self, plan: Plan) -> list[dict[str, str]]:
        """tensor_maps for the C launcher (wgmma_maps_mn_major.cuh.j2), per operand as C expressions:
        its dims (inner, outer), its box (inner, outer) and a line saying so."""
        views = []
        for x, k_major, _, box, _ in self.boxes(plan):
            extent, tile = ("M", "BM") if x == "A" else ("N", "BN")
            inner, outer = ("K", extent) if k_major else (extent, "K")
            box_inner, box_outer = ("BK", tile) if k_major else (str(box), "BK")
            words = (f"{x} K-major: ({inner}, {outer}), one box of {box_inner} x {box_outer} a stage" if k_major else
                     f"{x} MN-major: ({inner}, {outer}), {tile} / {box} boxes of {box_inner} x {box_outer} a stage")
            views.append({"inner": f"(cuuint64_t){inner}", "outer": f"(cuuint64_t){outer}", "box_inner": box_inner,
                          "box_outer": box_outer, "words": words})
        return views

    @property
    def maps_template(self) -> str:
        """The C launcher's encoding of A's and B's tensor maps."""
        return "wgmma_maps_k_major.cuh.j2" if self.k_major else "wgmma_maps_mn_major.cuh.j2"

    def stage_loads(self, plan: Plan, k: str) -> list[str]:
        """The producer's TMA copies of one stage (K offset `k`, a C expression) without clusters:
        one box per K-major operand, 32-row boxes along M or N of an MN-major one (B's into its own
        tile, which the producer's warps transpose in place)."""
        lines = []
        for x, k_major, _, box, boxes in self.boxes(plan):
            at = "block_m0" if x == "A" else "block_n0"
            load = f"tma_load(s{x} + s * {x}_STAGE_FLOATS{{}}, &map_{x.lower()}, &full[s], {{}}, {x.lower()}_batch);"
            if k_major:
                lines.append(load.format("", f"{k}, {at}"))
                continue
            lines.append(f"for (int box = 0; box < {boxes}; ++box)  // {x} MN-major: boxes of {box} "
                         f"{'rows' if x == 'A' else 'columns'} by BK")
            lines.append("    " + load.format(f" + box * {box} * BK", f"{at} + box * {box}, {k}"))
        return lines

    # ---- 3xtf32's B: its remainders beside the tile TMA wrote, or (row-major B) the tile TMA landed
    # MN-major, transposed K-major in place with its remainders by the producer's warps
    # (wgmma_3xtf32.cuh.j2, wgmma_mn_major.cuh.j2)

    @property
    def splitter_words(self) -> tuple[str, ...]:
        if self.b_k_major:
            return ("Warps 1-3 write the TF32 remainders of each landed B tile (with round_b rounding its big",
                    "part to nearest in place first), at their own pace behind the copies.")
        return ("Warps 1-3 transpose each landed B tile K-major and write its TF32 remainders (with round_b",
                "rounding its big part to nearest), at their own pace behind the copies.")

    @property
    def splitter_step(self) -> str:
        if self.b_k_major:
            return ("write_remainders(sB + s * B_STAGE_FLOATS, sB_small + s * B_STAGE_FLOATS, B_STAGE_FLOATS, "
                    "round_b, tid - 32, SPLITTERS);")
        return "transpose_and_split(sB + s * B_STAGE_FLOATS, sB_small + s * B_STAGE_FLOATS, round_b, tid - 32);"

    @property
    def a_index(self) -> str:
        """The device function giving (row, k)'s place in A's tile, which 3xtf32's consumers read."""
        return "swizzled" if self.a_k_major else "swizzled_mn"

    @property
    def truncates(self) -> bool:
        return self.math == "tf32" and self.rounding == "truncate"

    @property
    def tma_rounds(self) -> bool:
        """Whether TMA rounds A and B to nearest TF32 as it copies them (their maps' type TFLOAT32)."""
        return self.math == "tf32" and self.rounding == "tma"

    @property
    def map_data_type(self) -> str:
        """The CUtensorMapDataType of A's and B's maps, as the C launcher encodes them."""
        return MAP_DATA_TYPES[self.tma_rounds]

    @property
    def map_type_words(self) -> str:
        """The C launcher's comment on its maps' type, after their description: a line more where TMA
        rounds (the FLOAT32 maps' launchers read as they did)."""
        return ("\n    // Of type TFLOAT32: TMA rounds each float to nearest TF32 as it copies it, as cuBLAS "
                "rounds." if self.tma_rounds else "")

    def tensor_maps(self, plan: Plan, M: int, N: int, K: int, lda: int, ldb: int, batch: int = 1,
                    strides: tuple[int, int] = (0, 0)) -> list[TensorMapSpec]:
        # With clusters each block loads a slice of the tiles its cluster row and column share. TMA's
        # view of a K-major operand: (K, rows), rows ld floats apart, boxes of BK x slice rows with the
        # 128-byte swizzle the wgmma descriptors expect. L2 promotion of 256 bytes where every row starts
        # 128-byte aligned (on an H100 the skinny tf32 calls ran 2-4% faster than with 128, the large ones
        # the same), else of 128 (rows off 128 bytes, e.g. ld = 4092, measured 20% faster so than with 256).
        # Batches: a third dimension, the stride apart (tma_batches_ready).
        # An MN-major operand (3xtf32): (rows, K), boxes of 32 rows x BK (boxes()). TF32 rounded by TMA:
        # maps of type TFLOAT32 (tma_rounds).
        maps = []
        for (x, k_major, tile_rows, _, _), param, rows, ld, stride, sharing in zip(
                self.boxes(plan), ("map_a", "map_b"), (M, N), (lda, ldb), strides, (plan.cluster_n, plan.cluster_m)):
            if k_major:
                maps.append(TensorMapSpec(param, x, K, rows, ld, plan.BK, tile_rows // sharing, 128, 256, batch, stride,
                                          self.tma_rounds))
            else:
                maps.append(TensorMapSpec(param, x, rows, K, ld, MN_BOX, plan.BK, 128, 128, batch, stride,
                                          self.tma_rounds))
        return maps

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
        ] + self.rounding_rows(plan)

    def mn_major_rows(self) -> list[tuple[str, str]]:
        """How an MN-major operand reaches wgmma (none for A row, B col)."""
        rows = []
        if not self.a_k_major:
            how = {"3xtf32": "as they split them", "consumer": "as they round them",
                   "tma": "as TMA rounded them"}.get(self.math if self.math == "3xtf32" else self.rounding, "as they lie")
            rows.append(("A column-major", "TMA lands its tiles MN-major (boxes of 32 rows by BK); the consumers "
                                           f"read their fragments from there into registers {how} "
                                           "(2 wavefronts a read: a warp's 4 K rows share banks in pairs)"))
        if not self.b_k_major:
            rows.append(("B row-major", "TMA lands its tiles MN-major (boxes of 32 columns by BK); the "
                                        "producer's warps 1-3 transpose them K-major in place, box by box, and "
                                        "write their TF32 remainders"))
        return rows

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
        """The consumers' math: TF32 products (of tiles as TMA wrote them, of tiles the producer
        rounded, of A rounded in registers, or of an MN-major A read into registers as it lies),
        or 3xtf32's three with A split in registers."""
        if self.math == "tf32" and self.rounding in ("tma", "truncate") and not self.a_k_major:
            return "wgmma_tf32_a.cuh.j2"  # an MN-major A through registers, as it lies
        return {"3xtf32": "wgmma_3xtf32.cuh.j2"}.get(self.math, ROUNDING_TEMPLATES[self.rounding])

    @property
    def tma_helpers(self) -> tuple[str, ...]:
        """Device code the TMA kernel includes after the schedule's: rounding to TF32 in place,
        reading MN-major tiles, and transposing a row-major B's."""
        return ((("wgmma_round.cuh.j2",) if self.rounding in ("producer", "consumer") else ())
                + (() if self.k_major else ("wgmma_mn_major.cuh.j2",))
                + (() if self.b_k_major else ("wgmma_transpose_b.cuh.j2",)))

    @property
    def a_from_registers(self) -> bool:
        return self.math == "3xtf32" or self.rounding == "consumer" or not self.a_k_major

    @staticmethod
    def consumer_row0(plan: Plan) -> str:
        """C expression + ' ': the first row of this consumer's slab in a stage's A tile (ping-pong:
        the stage holds the consumer's own tile)."""
        return "" if plan.pingpong else "consumer * 64 + "

    def rounding_rows(self, plan: Plan) -> list[tuple[str, str]]:
        """How A and B become TF32, and what rounding them costs in shared-memory traffic per K tile
        (TMA's writes and wgmma's reads of A once and B once per consumer warpgroup are the base)."""
        if self.rounding == "truncate" or self.math != "tf32":
            return []  # (the truncating kernels' explain notes say so)
        if self.rounding == "tma":
            return [("TF32 rounding", "to nearest, by TMA as it copies A and B (tensor maps of type TFLOAT32), "
                                      "as cuBLAS rounds: no extra work or shared-memory traffic")]
        tile_bytes = 4 * plan.BK
        b_readers = 1 if plan.pingpong else self.consumers
        base = tile_bytes * (plan.BM + plan.BN) + tile_bytes * (plan.BM + b_readers * plan.BN)
        if self.rounding == "producer":
            extra = 2 * tile_bytes * (plan.BM + plan.BN)
            how = ("to nearest (cvt.rna) by the producer's warps 1-3, in place: A's and B's tiles once "
                   "each stage lands; the consumers wait on the stage's `ready` barrier")
            what = f"A's and B's tiles read and written again: {extra} B"
        else:
            extra = 2 * tile_bytes * plan.BN
            how = ("to nearest (cvt.rna): B by the producer's warps 1-3 in place once each stage lands, "
                   "A by the consumers as they read its fragments into registers (wgmma takes A from "
                   "registers)")
            what = (f"B's tile read and written again: {extra} B; A's {tile_bytes * plan.BM} B read by "
                    "the consumers' loads rather than by wgmma")
        return [("TF32 rounding", how),
                ("rounding traffic", f"per K tile {what}, on TMA's writes and wgmma's reads of {base} B "
                                     f"(+{100 * extra // base}%)")]
