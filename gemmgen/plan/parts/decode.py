"""The decode parts: a GEMV-like mainloop for M <= 16 or N <= 16 (FFMA, or TF32 mma.sync under math
tf32 / 3xtf32), and its schedule.

One of M and N is small; the other operand (B for M small, A for N small) is read once, K-contiguous,
at HBM bandwidth. FFMA stages the small one's rows ("rows", at most 16 at a time) through shared memory
one K tile at a time; each warp streams COLUMNS columns of the big operand ("columns"), SLICES warps
sharing a column group with a slice of K each, summed through shared memory in a fixed order (the same
bits every run). The kernel picks the orientation per call (C^T = B^T A^T where N < M: both operands
stay K-contiguous), and its rows by a compile-time count of 1, 2, 4, 8 or 16 (the smallest >= the
rows left), so that a call of M = 1 multiplies one row.

Under math tf32 or 3xtf32 every pass takes the tensor path: mma.sync m16n8k8 with 16 columns of the
big operand as the MMA's M (lane 4g + t: columns g and g + 8) and the rows as its N, 8 at a time (a
pass of 9 to 16 rows takes two MMAs per k step, sharing the columns' fragments). So a warp reads half
a byte of the small operand per byte of the big one at up to 8 rows, one at 16. (With the rows as the
MMA's M and 8 columns as its N, as before 2026-11-27, it read two: 16 rows per 8 columns.) Such a
kernel compiles no FFMA pass. The block's BLOCK_COLS columns are BLOCK_COLS / 16 tiles of 16, each
taken by WARPS * 16 / BLOCK_COLS warps with a slice of K each. The sum over K is order-free, so a lane
reads two consecutive float4s along K of each of its columns per chunk of 32 k (a column's four lanes:
128 bytes in a row), and the same k of its rows, through L1 where the lane needs them: no shared tile
of the small operand and no block barrier in the K loop. Each lane keeps two batches of its columns'
loads in flight in turn; the loop over K's whole chunks has no branch but its own (rows and columns
past the edge read row or column 0, and a partial last chunk follows the loop), so that ptxas issues
the loads early. On an H100 at 16 rows this read 0.60-0.71 of HBM's bandwidth in 3xTF32 where the
rows-as-M path, A staged through shared memory, read 0.45-0.59, and 0.62-0.78 in TF32 (0.56-0.75)
(benchmarks/decode/2026-11-27-h100-*-decode-columns-as-m.json). The libraries' FFMA members (math
simt) serve the calls whose accuracy needs FFMA's short sums (the fp32 library's calls of up to 8 rows,
a matrix-vector product in the tf32 library).

- Decode (a Mainloop): the kernel's template (decode.cuh.j2), rows, the words of explain and the
  aligned variant's needs (A's and B's rows 16-byte aligned: K, lda, ldb multiples of 4);
- DecodeSchedule (a Schedule): a block per BLOCK_COLS columns of the big operand, of every batch.
plan/decode.py checks a spec's settings and makes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil
from typing import TYPE_CHECKING

from ..arch import WARP
from .mainloop import Mainloop
from .schedule import Schedule

if TYPE_CHECKING:
    from ..base import Plan

MAX_ROWS = 16               # rows of the small operand per pass (a compile-time count of 1, 2, 4, 8 or 16)
ROW_COUNTS = (1, 2, 4, 8, 16)
TILE_FLOATS = 8192          # shared floats of the small operand per K tile (32 KB): K tile = 8192 / rows
TILE_HALO = 4               # unaligned calls: the floats before each row's tile, which shifted columns read too
UNALIGNED_TILE_FLOATS = 7680  # unaligned calls: K tile = this / rows, so that the rows' tiles with their halos and a
                            # float of padding per 32 still fit TILE_FLOATS
LOADS_IN_FLIGHT = 8         # vector loads of the big operand each lane issues before its FFMAs
TENSOR_LOADS_IN_FLIGHT = 8  # the tensor path's float4s of its two columns per lane in flight: two batches of a chunk
MMA_COLUMNS = 16            # the tensor path's columns per warp (a tile): mma.sync m16n8k8's M
BLOCKED_ROWS = 8            # FFMA passes of up to this many rows sum blocks of a step's products from zero first
BLOCK_PRODUCTS = 16         # ... of at most this many products of a row and column (a 1-column step has 32)
CHUNK = 32                  # K per chunk of a column: two float4s of each of its 4 lanes (four k steps of 8)
# Warps per SM the tensor path's kernels ask ptxas to fit (__launch_bounds__'s second argument: this over
# the block's warps) unless the spec says `occupancy`: 16 give 128 registers a thread, which 3xtf32 fits
# without spills (at 24 warps, 80 registers, it spilled 164-360 bytes). In TF32, which fits 80, 24 warps
# read 0.56-0.76 of HBM on an H100 where 16 read 0.62-0.78 (two float4s of two columns a lane in flight
# per batch: 4 KB a warp).
TENSOR_WARPS_PER_SM = 16
# mma.sync per k step of 8: tf32 one product; 3xtf32 three (small x big, big x small, big x big)
PRODUCTS = {"simt": 0, "tf32": 1, "3xtf32": 3}


@dataclass(frozen=True)
class Decode(Mainloop):
    """FFMA: each lane multiplies float4s of its warp's columns by the matching float4s of every row
    of the small operand, read from shared memory once per float4 and reused over the warp's columns.
    Unaligned (a row of either operand not 16-byte aligned), a column is still read in float4s, from
    the 16-byte boundary at or before its start (its shift: 0 to 3 floats), and multiplied by the rows
    read as far back in the shared tile, which holds TILE_HALO floats before each row's K tile; a warp's
    columns are every GROUPS-th of the block's, so where GROUPS is a multiple of 4 they share their
    shift and a row's floats are read once for all of them. Up to 3 floats at each end of a column
    (outside its whole float4s) are multiplied after the K loop."""

    # unroll (the base's field): steps of a lane's loop whose loads are issued together, LOADS_IN_FLIGHT
    # vector loads in all (decode_unroll)
    columns: int = 4           # columns of the big operand per warp
    warps: int = 8
    slices: int = 1            # warps per column group, each a slice of K
    c_layout: str = "row"
    # math (the base's field): simt multiplies every pass with FFMA; tf32 / 3xtf32 every pass on the
    # tensor path

    name = "decode"
    tile_floats = TILE_FLOATS
    tile_halo = TILE_HALO
    unaligned_tile_floats = UNALIGNED_TILE_FLOATS
    chunk = CHUNK
    blocked_rows = BLOCKED_ROWS
    block_products = BLOCK_PRODUCTS
    template = "decode.cuh.j2"
    global_loads = None        # whole sectors: each element of the big operand read once
    k_step = 4
    @property
    def no_conflicts(self) -> str:
        if not self.products:
            return "none: each warp reads 512 consecutive bytes of a row of the small operand"
        return "none: the tensor path reads the small operand through L1, not shared memory"
    k_slices = "warps per column group"

    @property
    def groups(self) -> int:
        """Column groups per block."""
        return self.warps // self.slices

    @property
    def block_columns(self) -> int:
        return self.columns * self.groups

    @property
    def threads(self) -> int:
        return self.warps * WARP

    @property
    def products(self) -> int:
        """mma.sync per k step on the tensor path (0: no tensor path, FFMA at every row count)."""
        return PRODUCTS[self.math]

    @property
    def loads_in_flight(self) -> int:
        """The tensor path's float4s of its two columns each lane keeps in flight: two batches of a
        chunk of two float4s of each, the next batch issued before this one's products
        (benchmarks/decode_patterns.py: one chunk a batch read as fast as two, with fewer registers)."""
        return TENSOR_LOADS_IN_FLIGHT

    @property
    def tensor_tiles(self) -> int:
        """The tensor path's tiles of 16 columns per block (1 where it has none, for the constants)."""
        return max(1, self.block_columns // MMA_COLUMNS)

    @property
    def tensor_slices(self) -> int:
        """The tensor path's warps per tile, each a slice of K."""
        return max(1, self.warps // self.tensor_tiles)

    @property
    def part_floats(self) -> int:
        """Shared floats of the K slices' partial sums (slices 2 .. S of every group; on the tensor path
        slices 2 .. of every tile, 16 columns x 16 rows each), at least 1."""
        ffma = (self.slices - 1) * self.groups * MAX_ROWS * self.columns
        tensor = (self.tensor_slices - 1) * self.tensor_tiles * MAX_ROWS * MMA_COLUMNS if self.products else 0
        return max(1, ffma, tensor)

    @property
    def smem_static_bytes(self) -> int:
        """FFMA's tile of the small operand (the tensor path reads it through L1: one float) and the
        slices' sums."""
        return 4 * ((1 if self.products else TILE_FLOATS) + self.part_floats)

    @property
    def c_strides(self) -> tuple[str, str]:
        """C expressions: floats between C's neighbours along M and along N."""
        return ("ldc", "1") if self.c_layout == "row" else ("1", "ldc")

    def registers(self, rows: int = MAX_ROWS) -> int:
        """Live floats per lane at `rows` rows: accumulators, the loads in flight, one vector of A
        (tensor path: two 16 x 8 tiles' accumulators and a batch's sums, twice as many under 3xtf32 (the
        small products' own), the loads in flight, a chunk of two rows and one k step's TF32 fragments)."""
        if self.products:
            three = self.products == 3
            return (32 if three else 16) + TENSOR_LOADS_IN_FLIGHT * 4 + 16 + (12 if three else 6)
        blocked = self.columns if rows <= BLOCKED_ROWS else 0  # a block's partial sum per column
        return rows * self.columns + self.unroll * self.columns * 4 + 4 + blocked

    @property
    def block_loads(self) -> int:
        """float4 loads of a column whose products a blocked sum takes (decode.cuh.j2's SPAN, aligned)."""
        return min(self.unroll, BLOCK_PRODUCTS // 4)

    # --- rows, needs and explain's words
    no_needs = "nothing (unaligned: the big operand still in float4s, each column from the 16-byte boundary before it)"

    def rows(self, plan: Plan) -> list[tuple[str, str]]:
        small = "through L1" if self.products else "in shared memory"
        return [
            ("target", plan.arch.name),
            ("math", self.math_row),
            ("orientation", f"M <= N: rows of A read {small}, columns of B streamed; M > N: C^T = B^T A^T, "
                            f"columns of B read {small}, rows of A streamed"),
            ("rows per pass", f"{'8 or' if self.products else '1, 2, 4, 8 or'} {MAX_ROWS} (compile-time; the "
                              f"smallest >= the rows left; more than {MAX_ROWS} rows take several passes over "
                              f"the big operand)"),
            *self.ffma_rows(),
            ("threads per block", f"{self.threads} ({self.warps} warps: {self.groups} column group(s) of "
                                  f"{self.slices} warp(s), each a slice of K) = {self.block_columns} columns"),
            *self.tensor_rows(),
            ("K slices' sums", f"{self.part_floats} shared floats, added in slice order (deterministic)"
             if self.part_floats > 1 else "none (one warp per column group)"),
            ("registers (estimate)", f"{self.registers()} live floats per lane at {MAX_ROWS} rows, "
                                     f"{self.registers(1)} at 1"),
            ("shared memory per block", f"{plan.smem_bytes} dynamic + {self.smem_static_bytes} static bytes"),
        ]

    def ffma_rows(self) -> list[tuple[str, str]]:
        if self.products:
            return []
        return [
            ("columns per warp", f"{self.columns}, {self.unroll} step(s) of {self.columns} vector loads in "
                                 f"flight per lane ({self.unroll * self.columns} float4s)"),
            ("shared small operand", f"{TILE_FLOATS} floats per K tile: K tile = {TILE_FLOATS} / rows "
                                     f"({TILE_FLOATS // MAX_ROWS} at {MAX_ROWS} rows); unaligned, K tile = "
                                     f"{UNALIGNED_TILE_FLOATS} / rows, with the {TILE_HALO} floats before it (which "
                                     f"a column read from the 16-byte boundary before it reaches back to) and a "
                                     f"float of padding per 32 (no bank conflicts)"),
            ("lane sums", f"passes of 1 to {BLOCKED_ROWS} rows: the products of a row and column summed from "
                          f"zero in blocks of {self.block_loads * 4} (float4 loads), each then added into the "
                          f"lane's sum (chains of at most {BLOCK_PRODUCTS} adds plus the lane's blocks: cuBLAS "
                          f"FP32's error at few rows); {MAX_ROWS} rows: one sum per row and column"),
        ]

    @property
    def math_row(self) -> str:
        ffma = "FP32 FFMA (exact FP32, as cuBLAS FP32; memory bound, so no slower than TF32)"
        if not self.products:
            return f"simt: {ffma}"
        how = ("1xTF32 (A and B rounded to nearest, cvt.rna, as cuBLAS TF32)" if self.products == 1 else
               "3xTF32 (A and B split into big + small TF32 parts, rounded to nearest; big x big + big x small "
               "+ small x big: FP32-accurate)")
        return f"{self.math}: every pass on the tensor cores, mma.sync m16n8k8 {how}"

    def tensor_rows(self) -> list[tuple[str, str]]:
        if not self.products:
            return []
        return [("tensor path", f"{self.tensor_tiles} tile(s) of {MMA_COLUMNS} columns per block (the MMA's M), "
                                f"{self.tensor_slices} warp(s) per tile, each a slice of K; the rows the MMA's N, 8 "
                                f"at a time; per lane {TENSOR_LOADS_IN_FLIGHT} float4s of its two columns in flight "
                                f"(two batches of a chunk of two consecutive float4s of each: a column's 4 lanes "
                                f"read {CHUNK * 4} bytes in a row), each float4 two k steps of {self.products} "
                                f"mma.sync per 8 rows; the small operand's rows read through L1")]

    def vector_requirements(self, layout_a: str, layout_b: str) -> list[tuple[str, str | None, str, int]]:
        return [("A", "K", "lda", 4), ("B", "K", "ldb", 4)]

    def intensities(self, plan: Plan) -> tuple[tuple[str, int, int], tuple[str, int, int] | None]:
        # Per float4 of a column: 4 x rows FFMAs on 16 bytes of the big operand (at 16 rows). The
        # tensor path reads the small operand's rows through L1, not shared memory.
        glob = ("global, per float4, 16 rows", 2 * 4 * MAX_ROWS, 16)
        if self.products:
            return glob, None
        return glob, ("shared, per float4, 16 rows", 2 * 4 * MAX_ROWS * self.columns, 16 * MAX_ROWS)

    def block_intensity(self, plan: Plan) -> tuple[str, int, int]:
        return ("global, per block per K tile (16 rows)", 2 * MAX_ROWS * self.block_columns * plan.BK,
                4 * (MAX_ROWS + self.block_columns) * plan.BK)

    def tiling_words(self, plan: Plan) -> str:
        return f"decode columns {self.columns} warps {self.warps} slices {self.slices}"

    def thread_origins(self, plan: Plan) -> list[tuple[int, int]]:
        return [(0, lane % self.columns) for lane in range(WARP)]

    @property
    def math_words(self) -> str:
        return "simt (decode: FFMA)" if not self.products else f"{self.math} (decode: mma.sync)"

    def accumulators(self, plan: Plan) -> float:
        return MAX_ROWS * self.columns

    def notes(self, plan: Plan) -> list[str]:
        return ["decode: memory bound; a call's time is about the bytes of the big operand (K x max(M, N) x 4) "
                "over the HBM bandwidth"]


def decode_unroll(columns: int) -> int:
    return max(1, LOADS_IN_FLIGHT // columns)


@dataclass(frozen=True)
class DecodeSchedule(Schedule):
    """A block per BLOCK_COLS columns of the big operand (N where M <= N, else M), of every batch
    (batch b's blocks after batch b - 1's)."""

    def columns_of(self, M: int, N: int) -> int:
        return N if M <= N else M

    def grid(self, M: int, N: int) -> int:
        return ceil(self.columns_of(M, N) / self.BN) if M > 0 and N > 0 else 0

    def cluster_tiles(self, M: int, N: int) -> tuple[int, int]:
        return 1, self.grid(M, N)

    def cluster_grid(self, M: int, N: int) -> int:
        return self.grid(M, N)

    @property
    def c_blocks(self) -> tuple[str, ...]:
        return ("// A block per BLOCK_COLS columns of the big operand (B's N where M <= N, else A's M), of every batch.",
                "const long long blocks = (long long)(((M <= N ? N : M) + BLOCK_COLS - 1) / BLOCK_COLS) * batch;")

    def describe(self) -> str:
        return f"a block per {self.BN} columns of the big operand, of every batch"

    def order_rows(self) -> list[tuple[str, str]]:
        return [("schedule", self.describe())]
