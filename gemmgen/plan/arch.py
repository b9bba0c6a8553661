"""What each target offers (shared memory, threads, registers per SM, FFMA lanes) and the limits
every path is checked against: the arch table, in one place."""

from __future__ import annotations

from dataclasses import dataclass

WARP = 32


@dataclass(frozen=True)
class Arch:
    """Per-target limits (CUDA programming guide, compute capability tables)."""

    name: str
    smem_per_block: int      # bytes a block may opt in to
    smem_per_sm: int         # bytes of shared memory per SM
    smem_reserved: int       # bytes the runtime keeps per resident block
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    fp32_lanes_per_sm: int   # FFMA per clock per SM

    @property
    def compute_capability(self) -> tuple[int, int]:
        digits = self.name.removeprefix("sm_").rstrip("a")
        return int(digits[:-1]), int(digits[-1])

    @property
    def has_wgmma(self) -> bool:
        """Warpgroup MMA and TMA exist only in the arch-specific sm_90a instruction set."""
        return self.name == "sm_90a"


ARCHS = {
    "sm_80": Arch("sm_80", 166912, 167936, 1024, 2048, 32, 65536, 64),
    "sm_86": Arch("sm_86", 101376, 102400, 1024, 1536, 16, 65536, 128),
    "sm_89": Arch("sm_89", 101376, 102400, 1024, 1536, 24, 65536, 128),
    "sm_90": Arch("sm_90", 232448, 233472, 1024, 2048, 32, 65536, 128),
    "sm_90a": Arch("sm_90a", 232448, 233472, 1024, 2048, 32, 65536, 128),
}

# Tensor-core math: the warp-level instruction shape (M, N, K) each math mode supports per path.

MAX_THREADS_PER_BLOCK = 1024
MAX_REGISTERS_PER_THREAD = 255
STATIC_SMEM_LIMIT = 48 * 1024
