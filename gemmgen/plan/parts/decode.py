"""The decode parts: a GEMV-like FFMA mainloop for M <= 16 or N <= 16, and its schedule.

One of M and N is small; the other operand (B for M small, A for N small) is read once, K-contiguous,
at HBM bandwidth. The small one's rows ("rows", at most 16 at a time) are staged through shared memory
one K tile at a time; each warp streams COLUMNS columns of the big operand ("columns"), SLICES warps
sharing a column group with a slice of K each, summed through shared memory in a fixed order (the same
bits every run). The kernel picks the orientation per call (C^T = B^T A^T where N < M: both operands
stay K-contiguous), and its rows by a compile-time count of 1, 2, 4, 8 or 16 (the smallest >= the
rows left), so that a call of M = 1 multiplies one row.

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
LOADS_IN_FLIGHT = 8         # vector loads of the big operand each lane issues before its FFMAs


@dataclass(frozen=True)
class Decode(Mainloop):
    """FFMA: each lane multiplies float4s (floats, unaligned) of its warp's columns by the matching
    float4s of every row of the small operand, read from shared memory once per float4 and reused
    over the warp's columns."""

    # unroll (the base's field): steps of a lane's loop whose loads are issued together, LOADS_IN_FLIGHT
    # vector loads in all (decode_unroll)
    columns: int = 4           # columns of the big operand per warp
    warps: int = 8
    slices: int = 1            # warps per column group, each a slice of K
    c_layout: str = "row"

    name = "decode"
    tile_floats = TILE_FLOATS
    template = "decode.cuh.j2"
    global_loads = None        # whole sectors: each element of the big operand read once
    k_step = 4
    no_conflicts = "none: each warp reads 512 consecutive bytes of a row of the small operand"
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
    def part_floats(self) -> int:
        """Shared floats of the K slices' partial sums (slices 2 .. S of every group), at least 1."""
        return max(1, (self.slices - 1) * self.groups * MAX_ROWS * self.columns)

    @property
    def smem_static_bytes(self) -> int:
        return 4 * (TILE_FLOATS + self.part_floats)

    @property
    def c_strides(self) -> tuple[str, str]:
        """C expressions: floats between C's neighbours along M and along N."""
        return ("ldc", "1") if self.c_layout == "row" else ("1", "ldc")

    def registers(self, rows: int = MAX_ROWS) -> int:
        """Live floats per lane at `rows` rows: accumulators, the loads in flight, one vector of A."""
        return rows * self.columns + self.unroll * self.columns * 4 + 4

    # --- rows, needs and explain's words
    no_needs = "nothing (scalar loads only)"

    def rows(self, plan: Plan) -> list[tuple[str, str]]:
        return [
            ("target", plan.arch.name),
            ("math", "simt: FP32 FFMA (exact FP32, as cuBLAS FP32; memory bound, so no slower than TF32)"),
            ("orientation", "M <= N: rows of A in shared memory, columns of B streamed; M > N: C^T = B^T A^T, "
                            "columns of B in shared memory, rows of A streamed"),
            ("rows per pass", f"1, 2, 4, 8 or {MAX_ROWS} (compile-time; the smallest >= the rows left; "
                              f"more than {MAX_ROWS} rows take several passes over the big operand)"),
            ("columns per warp", f"{self.columns}, {self.unroll} step(s) of {self.columns} vector loads in "
                                 f"flight per lane ({self.unroll * self.columns} float4s)"),
            ("threads per block", f"{self.threads} ({self.warps} warps: {self.groups} column group(s) of "
                                  f"{self.slices} warp(s), each a slice of K) = {self.block_columns} columns"),
            ("shared small operand", f"{TILE_FLOATS} floats per K tile: K tile = {TILE_FLOATS} / rows "
                                     f"({TILE_FLOATS // MAX_ROWS} at {MAX_ROWS} rows)"),
            ("K slices' sums", f"{self.part_floats} shared floats, added in slice order (deterministic)"
             if self.slices > 1 else "none (one warp per column group)"),
            ("registers (estimate)", f"{self.registers()} live floats per lane at {MAX_ROWS} rows, "
                                     f"{self.registers(1)} at 1"),
            ("shared memory per block", f"{plan.smem_bytes} dynamic + {self.smem_static_bytes} static bytes"),
        ]

    def vector_requirements(self, layout_a: str, layout_b: str) -> list[tuple[str, str | None, str, int]]:
        return [("A", "K", "lda", 4), ("B", "K", "ldb", 4)]

    def intensities(self, plan: Plan) -> tuple[tuple[str, int, int], tuple[str, int, int] | None]:
        # Per float4 of a column: 4 x rows FFMAs on 16 bytes of the big operand (at 16 rows).
        return (("global, per float4, 16 rows", 2 * 4 * MAX_ROWS, 16),
                ("shared, per float4, 16 rows", 2 * 4 * MAX_ROWS * self.columns, 16 * MAX_ROWS))

    def block_intensity(self, plan: Plan) -> tuple[str, int, int]:
        return ("global, per block per K tile (16 rows)", 2 * MAX_ROWS * self.block_columns * plan.BK,
                4 * (MAX_ROWS + self.block_columns) * plan.BK)

    def tiling_words(self, plan: Plan) -> str:
        return f"decode columns {self.columns} warps {self.warps} slices {self.slices}"

    def thread_origins(self, plan: Plan) -> list[tuple[int, int]]:
        return [(0, lane % self.columns) for lane in range(WARP)]

    @property
    def math_words(self) -> str:
        return "simt (decode: FFMA)"

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
