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

    @property
    def pipeline_template(self) -> str:
        """The K loop: tiles in flight by cp.async, or through registers."""
        return "pipeline_async.cuh.j2" if self.async_copy else "pipeline_registers.cuh.j2"

    @property
    def helpers(self) -> tuple[str, ...]:
        return ("cp_async.cuh.j2",) if self.async_copy else ()


@dataclass(frozen=True)
class MmaSync(Tiled):
    """The tiled pipeline with each warp's tile multiplied by mma.sync: fragments per MMA K step,
    read with ldmatrix where the shared rows allow."""

    mma_shape: tuple[int, int, int] | None = None
    ldmatrix_a: bool = False  # A fragments read with ldmatrix (shared rows run along k)
    ldmatrix_b: bool = False

    name = "mma_sync"
    math_template = "mma_multiply.cuh.j2"

    @property
    def helpers(self) -> tuple[str, ...]:
        return super().helpers + ("mma_sync.cuh.j2",)


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

    @property
    def math_template(self) -> str:
        """The loaders' rounding and the consumers' products: TF32, or 3xtf32's big and small."""
        return "wgmma_async_3xtf32.cuh.j2" if self.math == "3xtf32" else "wgmma_async_tf32.cuh.j2"

    @property
    def helpers(self) -> tuple[str, ...]:
        return () if self.math == "3xtf32" else ("tf32.cuh.j2",)


@dataclass(frozen=True)
class WgmmaTma(WgmmaAsync):
    """sm_90a: a producer warpgroup fills the stages with TMA under mbarriers (K-major A and B); the
    register-fed `fallback` takes calls TMA cannot describe."""

    promote_tiles: int = 1       # 3xtf32: K tiles summed in the tensor cores before each add into FP32
    fallback: Plan | None = None

    name = "wgmma"
    tma = True
    parameters = TMA_MAIN
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

    @property
    def math_template(self) -> str:
        """The consumers' math: TF32 products, or 3xtf32's three with A split in registers."""
        return "wgmma_3xtf32.cuh.j2" if self.math == "3xtf32" else "wgmma_tf32.cuh.j2"
