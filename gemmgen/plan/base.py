"""What a Plan holds: every derived number of a kernel (the Plan), how each operand travels to
shared memory (Operand) and how C is indexed (Output), with the arguments checks the launchers
share. The planning itself is per path: tiled.py (SIMT and mma.sync), wgmma.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil

from ..language.spec import Spec
from .arch import WARP, Arch


@dataclass(frozen=True)
class Operand:
    """How one input matrix (A or B) travels: global tile → shared tile → register fragments.

    The global tile is `outer` x `inner`, inner being the contiguous dimension in memory. The
    shared tile has rows along `smem_row_dim`; index expressions are C expressions of the tile
    coordinates, ready to paste into CUDA.
    """

    name: str                 # "A" or "B"
    layout: str               # "row" or "col" in global memory
    outer_dim: str            # math dimension of global rows: "m", "n" or "k"
    inner_dim: str
    outer: int                # tile extent along outer_dim
    inner: int
    vector: int               # floats per global load
    chunks_per_row: int       # inner / vector
    passes: int               # loads per thread per tile
    transposed_store: bool    # shared rows run along the global inner dimension
    smem_rows: int
    smem_cols: int
    smem_ld: int              # floats between shared rows (cols + pad)
    pad: int
    swizzle: bool
    swizzle_chunks: int       # 4-float chunks per shared row when swizzled
    stage_floats: int
    smem_index: str           # C expression of (math coordinates) → float offset in one stage
    frag_vector: int          # floats per shared → register load in the inner product
    rows_left: str            # C expression: rows of the global tile still inside the matrix
    cols_left: str
    thread_runs: bool         # uncoalesced: each thread loads `passes` consecutive chunks
    tile_origin: str          # C expression: element offset of the block's first tile
    k_step: str               # C expression: element offset from one K tile to the next
    extent_outer: str         # matrix size along the outer dimension (M, N or K)
    extent_inner: str
    # via registers: global → registers → shared even in a cp.async pipeline
    via_registers: bool = False
    # a transposing store via registers: vector x vector blocks (one per `vector` passes),
    # transposed in registers and stored `vector` floats at a time
    blocked: bool = False
    bands_lo: int = 1         # neighbouring lanes take this many neighbouring blocks along outer_dim

    @property
    def chunk_index(self) -> str:
        """C expression: which chunk of the tile a thread loads in pass p. Coalesced loaders give
        a warp 32 neighbouring chunks per pass; uncoalesced ones give each thread a run of its own."""
        return f"tid * {self.passes} + p" if self.thread_runs else "p * THREADS + tid"

    def chunk_of(self, p: int, tid: int, threads: int) -> int:
        """chunk_index in Python, for the explain report's bank-conflict simulation."""
        return tid * self.passes + p if self.thread_runs else p * threads + tid

    # Blocked loads (via registers): pass p reads row p % V of block q = p / V * THREADS + tid, a
    # block being V rows by one V-float chunk. Lanes walk bands_lo blocks along the outer dimension
    # first, then along the inner one, so a quarter warp's transposed 16-byte stores fill 32 banks
    # and a warp's loads still read whole 32-byte sectors.
    @property
    def block_index(self) -> str:
        return f"p / {self.name}_VEC * THREADS + tid"

    @property
    def block_band(self) -> str:
        lo, cpr = self.bands_lo, self.chunks_per_row
        return f"q % {lo} + q / {lo * cpr} * {lo}" if lo > 1 else f"q / {cpr}"

    @property
    def block_chunk(self) -> str:
        lo, cpr = self.bands_lo, self.chunks_per_row
        return f"q / {lo} % {cpr}" if lo > 1 else f"q % {cpr}"

    def position(self, p: int, tid: int, threads: int) -> tuple[int, int]:
        """(row, first column) of the global tile that pass p of thread tid reads, as the
        templates compute it."""
        if self.blocked:
            v, lo, cpr = self.vector, self.bands_lo, self.chunks_per_row
            q = p // v * threads + tid
            band = q % lo + q // (lo * cpr) * lo
            return band * v + p % v, q // lo % cpr * v
        chunk = self.chunk_of(p, tid, threads)
        return chunk // self.chunks_per_row, chunk % self.chunks_per_row * self.vector

    @property
    def ld(self) -> str:
        return f"ld{self.name.lower()}"

    def k_offset(self, k: str) -> str:
        """C expression: element offset of column/row k of this operand (the K dimension)."""
        return f"(long long)({k}) * {self.ld}" if self.outer_dim == "k" else f"({k})"

    def smem_args(self, row: str, col: str) -> str:
        """Arguments of s{A,B}_index (math order: A(m, k), B(k, n)) for global tile (row, col)."""
        first = "m" if self.name == "A" else "k"
        return f"{row}, {col}" if self.outer_dim == first else f"{col}, {row}"

    def describe(self) -> str:
        shape = f"{self.smem_rows} x {self.smem_ld}"
        if self.swizzle:
            how = "XOR-swizzled in 16-byte chunks"
        elif self.pad:
            how = f"padded by {self.pad}"
        else:
            how = "unpadded"
        rows = self.smem_row_dim
        return f"s{self.name}[{rows}][{self.smem_col_dim}] {shape} floats, {how}"

    @property
    def smem_row_dim(self) -> str:
        return self.inner_dim if self.transposed_store else self.outer_dim

    @property
    def smem_col_dim(self) -> str:
        return self.outer_dim if self.transposed_store else self.inner_dim


@dataclass(frozen=True)
class Plan:
    spec: Spec
    name: str
    arch: Arch
    uses_shared: bool
    # tiling
    BM: int
    BN: int
    BK: int
    WM: int
    WN: int
    TM: int
    TN: int
    RM: int
    RN: int
    SUB_M: int
    SUB_N: int
    warp_tiling: bool
    warps_m: int
    warps_n: int
    lanes_m: int
    lanes_n: int
    threads: int
    order: str
    # pipeline
    stages: int
    async_copy: bool
    fragments: int
    unroll: int               # k steps per unrolled body of the inner product's loop (BK: all)
    raster_group: int
    occupancy: int
    beta: bool
    reduce_count: int
    split_k: int              # slices of K per C tile, each in its own block, summed into C
    staged: bool              # C tile assembled in shared memory, then stored row by row
    c_stage_rows: int         # staged C tile: rows along C's outer (non-contiguous) dimension
    c_stage_cols: int
    c_stage_ld: int           # floats between rows of the staged tile (cols + 4)
    c_stage_vec: int          # floats per coalesced access of the staged store
    # operands and output
    a: Operand | None
    b: Operand | None
    c_layout: str
    c_vector: int             # floats per store of C in the aligned variant
    smem_bytes: int
    registers_estimate: int
    notes: tuple[str, ...] = field(default=())
    # tensor cores (math tf32 / 3xtf32): the instruction's tile and how fragments leave shared memory
    math: str = "simt"
    mma_shape: tuple[int, int, int] | None = None
    m_step: int = 1           # rows between a thread's accumulator rows in a sub-tile (mma: 8)
    ldmatrix_a: bool = False  # A fragments read with ldmatrix (shared rows run along k)
    ldmatrix_b: bool = False
    # wgmma (sm_90a): warpgroups that multiply and load, and the kernel for calls TMA cannot serve
    consumers: int = 0
    tma: bool = False         # wgmma fed by a TMA producer warpgroup (else by loading warpgroups)
    loaders: int = 0          # wgmma_async: warpgroups that load tiles through registers
    loader_depth: int = 1     # wgmma_async: K tiles each loader thread holds in flight
    loader_registers: int = 0     # setmaxnreg of loader (wgmma: TMA producer) and consumer threads
    consumer_registers: int = 0
    fallback: "Plan | None" = None
    # how blocks take C tiles: data-parallel (a block per tile), persistent (a block per SM walking
    # the tiles) or stream-k (the K tiles of all C tiles dealt evenly over the SMs; see schedule.cuh.j2)
    schedule: str = "data-parallel"
    # thread-block clusters (wgmma TMA kernels): cluster_m x cluster_n blocks share their A tiles
    # along N and B tiles along M, each block loading a slice and multicasting it to the others
    cluster_m: int = 1
    cluster_n: int = 1
    # the TMA wgmma kernels' staged epilogue (`epilogue ... staged`): each consumer warp writes its
    # 16 rows of the C tile into shared boxes of c_box_outer x c_box_inner floats (inner: along C's
    # contiguous dimension), c_buffers of them in turn, and TMA stores each box
    tma_store: bool = False
    c_box_outer: int = 0
    c_box_inner: int = 0
    c_buffers: int = 0
    # 3xtf32 TMA kernels (`promote K`): K tiles whose products the tensor cores sum before the
    # consumers add that sum into acc in FP32
    promote_tiles: int = 1

    @property
    def cluster_blocks(self) -> int:
        """Blocks per thread-block cluster (1: no clusters)."""
        return self.cluster_m * self.cluster_n

    @property
    def cluster_row_mask(self) -> int:
        """Cluster ranks (bits) of the blocks that share block 0's A tile: rank = i + cluster_m * j
        takes the tile (i, j) of its cluster, so A's sharers are ranks 0, cluster_m, 2 cluster_m, ..."""
        return sum(1 << (self.cluster_m * j) for j in range(self.cluster_n))

    @property
    def cluster_column_mask(self) -> int:
        """Cluster ranks (bits) of the blocks that share block 0's B tile: ranks 0 ... cluster_m - 1."""
        return (1 << self.cluster_m) - 1

    @property
    def path(self) -> str:
        """simt (FFMA), mma_sync (warp-level tensor cores), wgmma (warpgroup tensor cores fed by
        TMA) or wgmma_async (fed by loader warpgroups through registers)."""
        if self.consumers:
            return "wgmma" if self.tma else "wgmma_async"
        return "mma_sync" if self.mma_shape else "simt"

    @property
    def kernel_name(self) -> str:
        return f"gemmgen_{self.name}_kernel"

    @property
    def launcher_name(self) -> str:
        return f"gemmgen_{self.name}"

    @property
    def warps(self) -> int:
        return self.threads // WARP

    @property
    def tensor_cores(self) -> bool:
        return self.math != "simt"

    @property
    def split_terms(self) -> int:
        """MMAs per product: 3xtf32 adds big*small and small*big to big*big."""
        return 3 if self.math == "3xtf32" else 1

    def acc_row(self, i: str) -> str:
        """C expression: row of accumulator row `i` inside a thread's sub-tile."""
        return i if self.m_step == 1 else f"{i} * M_STEP"

    @property
    def accumulators(self) -> int:
        return self.TM * self.TN * self.RM * self.RN

    def grid(self, M: int, N: int) -> int:
        """C tiles (blocks along x) for an M x N output; each has split_k blocks along y."""
        return ceil(M / self.BM) * ceil(N / self.BN) if M > 0 and N > 0 else 0

    def cluster_tiles(self, M: int, N: int) -> tuple[int, int]:
        """Tiles along M and N that a data-parallel launch covers: C's, or with clusters, rounded
        up to whole clusters of cluster_m x cluster_n tiles (the blocks past C's edge store nothing)."""
        return (ceil(M / (self.BM * self.cluster_m)) * self.cluster_m,
                ceil(N / (self.BN * self.cluster_n)) * self.cluster_n)

    def cluster_grid(self, M: int, N: int) -> int:
        """Blocks a data-parallel launch starts: a block per tile of cluster_tiles."""
        if M <= 0 or N <= 0:
            return 0
        tiles_m, tiles_n = self.cluster_tiles(M, N)
        return tiles_m * tiles_n

    @property
    def block_load_bytes(self) -> int:
        """Bytes of A and B a block reads from L2 per K tile (TMA kernels in a cluster: a slice of
        each tile it shares, multicast to the others)."""
        return 4 * (self.BM // self.cluster_n + self.BN // self.cluster_m) * self.BK

    @property
    def scheduled(self) -> bool:
        """Whether blocks walk C tiles through a tile scheduler (schedule persistent / stream-k)."""
        return self.schedule != "data-parallel"

    @property
    def pingpong(self) -> bool:
        """schedule pingpong: the persistent walk, its tiles taken by the two consumer warpgroups in
        turn, so that one's epilogue overlaps the other's MMAs (block M = one consumer's tile: one
        or two 64-row slabs)."""
        return self.schedule == "pingpong"

    def launch_blocks(self, M: int, N: int, K: int, sms: int) -> int:
        """Blocks along x the launcher starts on a GPU of `sms` SMs (the launcher's arithmetic):
        a block per C tile; persistent, no more blocks than SMs (with clusters, whole clusters of
        them); stream-k, as many as SMs unless there are fewer K tiles in all."""
        tiles = self.grid(M, N)
        most = min(sms, self.max_scheduled_blocks)
        if self.schedule in ("persistent", "pingpong"):
            if self.cluster_blocks > 1:  # whole clusters, each walking cluster-sized groups of tiles (units)
                units = self.cluster_grid(M, N) // self.cluster_blocks
                return min(units, max(1, most // self.cluster_blocks)) * self.cluster_blocks
            return min(tiles, most)
        if self.schedule == "stream-k":
            return min(most, tiles * max(1, ceil(K / self.BK)))
        return self.cluster_grid(M, N)

    # A scheduled kernel starts at most this many blocks (one per SM): stream-K's counters take a
    # fixed place for the tiles of this many at the start of its workspace, whatever the grid.
    max_scheduled_blocks = 1024

    def workspace_bytes(self, blocks: int) -> int:
        """stream-k: a counter per shared tile (up to 2 x max_scheduled_blocks) and consumer warp, then
        two slots of BM x BN partial sums per block (the pieces it begins and ends with)."""
        if self.schedule != "stream-k":
            return 0
        return 4 * (2 * self.max_scheduled_blocks * self.consumers * 4 + 2 * blocks * self.BM * self.BN)

    def layouts(self) -> str:
        return (f"A {self.spec['layout.A']}, B {self.spec['layout.B']}, C {self.c_layout}")

    # --- what the launcher checks at run time (C strings and Python from the same tables) ---

    def leading_dimension_minimums(self) -> dict[str, str]:
        """Each leading dimension and the size it must be at least (as well as at least 1)."""
        contiguous_rows = {"A": ("K", "M"), "B": ("N", "K"), "C": ("N", "M")}
        layouts = {"A": self.spec["layout.A"], "B": self.spec["layout.B"], "C": self.c_layout}
        return {f"ld{name.lower()}": rows[0] if layouts[name] == "row" else rows[1]
                for name, rows in contiguous_rows.items()}

    def vector_requirements(self) -> list[tuple[str, str | None, str, int]]:
        """(pointer, size, leading dimension, vector) that the aligned variant needs divisible (size
        None: no size need be)."""
        needs = []
        if self.path == "wgmma_async":  # 16-byte loads of K-contiguous operands
            if self.spec["layout.A"] == "row":
                needs.append(("A", "K", "lda", 4))
            if self.spec["layout.B"] == "col":
                needs.append(("B", "K", "ldb", 4))
        for op in (self.a, self.b):
            if op is not None and op.vector > 1:
                needs.append((op.name, op.extent_inner, op.ld, op.vector))
        if self.c_vector > 1:
            needs.append(("C", "N" if self.c_layout == "row" else "M", "ldc", self.c_vector))
        if self.tma_store:
            # TMA stores boxes of C: 16-byte aligned base and row stride, and C's contiguous extent a
            # multiple of 4 floats: a box past C's edge is clipped there only to 16 bytes, so with
            # N = 13 and ldc = 16 it wrote columns 13-15 (measured on an H100).
            needs.append(("C", "N" if self.c_layout == "row" else "M", "ldc", 4))
        return needs

    def argument_error(self, M: int, N: int, K: int, lda: int, ldb: int, ldc: int) -> str | None:
        """Why the launcher would return cudaErrorInvalidValue for these sizes, or None."""
        if min(M, N, K) < 0:
            return f"sizes must be >= 0 (M={M}, N={N}, K={K})"
        sizes = {"M": M, "N": N, "K": K}
        given = {"lda": lda, "ldb": ldb, "ldc": ldc}
        for ld, size in self.leading_dimension_minimums().items():
            if given[ld] < max(1, sizes[size]):
                return f"{ld}={given[ld]} is below max(1, {size}={sizes[size]})"
        if self.reduce_count and M * N > 0xFFFFFFFF:
            return "the fused reduction numbers positions with 32 bits: M*N must be below 2^32"
        if self.cluster_grid(M, N) > 2**31 - 1:
            return "too many thread blocks for one launch"
        return None

    @staticmethod
    def swizzled_index(row: str, k: str) -> str:
        """C expression: float offset of (row, k) in a K-major tile of 32-float (128-byte) rows as
        TMA's 128-byte swizzle lays it out: 16-byte chunk c of row r lands at chunk c ^ (r % 8)."""
        return f"{row} * 32 + ((({k} >> 2) ^ ({row} & 7)) << 2) + ({k} & 3)"

    @property
    def c_box_swizzle(self) -> int:
        """Bytes of TMA's swizzle for the staged C boxes: one box row (32, 64 or 128)."""
        return 4 * self.c_box_inner

    def c_box_index(self, outer: str, inner: str) -> str:
        """C expression: float offset of (outer, inner) in a staged C box as TMA's swizzle of one
        box row lays it out: 16-byte chunk c of each 128 bytes goes to c ^ (bits 7.. of the address),
        so a warp's writes of a fragment spread over the banks."""
        shift = {32: 0, 16: 1, 8: 2}[self.c_box_inner]  # box rows per 128 bytes: 2 ** shift
        mask = self.c_box_swizzle // 16 - 1
        outer = outer if outer.isidentifier() else f"({outer})"
        row = outer if shift == 0 else f"({outer} >> {shift})"
        return f"{outer} * {self.c_box_inner} + ({inner} ^ (({row} & {mask}) << 2))"

    def tma_ready(self, M: int, N: int, K: int, lda: int, ldb: int, pointers: dict[str, int]) -> bool:
        """Whether TMA can load A and B (wgmma path): 16-byte aligned bases and row strides."""
        return (min(M, N, K) > 0 and lda % 4 == 0 and ldb % 4 == 0
                and pointers["A"] % 16 == 0 and pointers["B"] % 16 == 0)

    def aligned(self, M: int, N: int, K: int, lda: int, ldb: int, ldc: int,
                pointers: dict[str, int]) -> bool:
        """Whether the vector variant is safe for these sizes and device addresses."""
        values = {"M": M, "N": N, "K": K, "lda": lda, "ldb": ldb, "ldc": ldc}
        return all((size is None or values[size] % vec == 0) and values[ld] % vec == 0
                   and pointers[ptr] % (4 * vec) == 0
                   for ptr, size, ld, vec in self.vector_requirements())

    @property
    def a_stride_m(self) -> str:
        return "lda" if self.spec["layout.A"] == "row" else "1"

    @property
    def a_stride_k(self) -> str:
        return "1" if self.spec["layout.A"] == "row" else "lda"

    @property
    def b_stride_k(self) -> str:
        return "ldb" if self.spec["layout.B"] == "row" else "1"

    @property
    def b_stride_n(self) -> str:
        return "1" if self.spec["layout.B"] == "row" else "ldb"

    @property
    def c(self) -> "Output":
        return Output(self.c_layout)


@dataclass(frozen=True)
class Output:
    """Index expressions for C, relative to the block's tile."""

    layout: str

    @property
    def tile_origin(self) -> str:
        if self.layout == "row":
            return "(long long)block_m0 * ldc + block_n0"
        return "(long long)block_n0 * ldc + block_m0"

    def index(self, m: str, n: str) -> str:
        if self.layout == "row":
            return f"(long long)({m}) * ldc + ({n})"
        return f"(long long)({n}) * ldc + ({m})"
