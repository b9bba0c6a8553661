"""The tile part: the C tile of a block, of a warp (or warpgroup) and of a thread, and the threads
that cover it. The mainloop planners derive it (a tensor-core instruction fixes what a thread
holds); the mainloop, the epilogue and the schedule read it."""

from __future__ import annotations

from dataclasses import dataclass

from ..arch import WARP


@dataclass(frozen=True)
class Tile:
    BM: int                   # C tile per block, and the K step
    BN: int
    BK: int
    WM: int                   # C tile per warp (no warp tiling: the block's)
    WN: int
    TM: int                   # C values per thread per sub-tile
    TN: int
    RM: int                   # sub-tiles each thread sweeps
    RN: int
    SUB_M: int                # sub-tile: WM / RM x WN / RN
    SUB_N: int
    warp_tiling: bool
    warps_m: int
    warps_n: int
    lanes_m: int              # thread grid of a sub-tile
    lanes_n: int
    threads: int
    order: str                # consecutive threads along "n" or "m"
    m_step: int = 1           # rows between a thread's accumulator rows in a sub-tile (mma: 8)
    occupancy: int = 0        # blocks per SM the spec asks for (__launch_bounds__; 0: none)

    @property
    def warps(self) -> int:
        return self.threads // WARP

    @property
    def accumulators(self) -> int:
        return self.TM * self.TN * self.RM * self.RN

    @property
    def warp_note(self) -> str:
        """What the warp tile's constants say when there is no warp tiling."""
        return "" if self.warp_tiling else " (no warp tiling: the whole block)"

    @property
    def blocks_per_sm(self) -> str:
        """__launch_bounds__'s second argument, where the spec asks for an occupancy."""
        return f", {self.occupancy}" if self.occupancy else ""

    @property
    def acc_rows(self) -> str:
        """C expression: rows of a thread's accumulator array (wgmma slabs: RM sets of TM)."""
        return "RM * TM" if self.RM > 1 else "TM"

    @property
    def acc_note(self) -> str:
        """The comment on that array's declaration, if it holds slabs."""
        return "  // slab r's rows in acc[r * TM] ... acc[r * TM + TM - 1]" if self.RM > 1 else ""

    def acc_row(self, i: str) -> str:
        """C expression: row of accumulator row `i` inside a thread's sub-tile."""
        return i if self.m_step == 1 else f"{i} * M_STEP"
