"""Derive every number of a kernel from a concrete Spec, and reject specs that cannot work.

The Plan is the only place that does arithmetic about the tiling: threads, warp layout, how
each operand tile is split into loads, the shared-memory layout and its index expressions,
resources against the target's limits. Templates place these values; they compute nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import ceil

from .errors import SpecError
from .spec import Spec

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
MMA_SYNC_SHAPES = ((16, 8, 8),)

MAX_THREADS_PER_BLOCK = 1024
MAX_REGISTERS_PER_THREAD = 255
STATIC_SMEM_LIMIT = 48 * 1024


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

    @property
    def chunk_index(self) -> str:
        """C expression: which chunk of the tile a thread loads in pass p. Coalesced loaders give
        a warp 32 neighbouring chunks per pass; uncoalesced ones give each thread a run of its own."""
        return f"tid * {self.passes} + p" if self.thread_runs else "p * THREADS + tid"

    def chunk_of(self, p: int, tid: int, threads: int) -> int:
        """chunk_index in Python, for the explain report's bank-conflict simulation."""
        return tid * self.passes + p if self.thread_runs else p * threads + tid

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

    def layouts(self) -> str:
        return (f"A {self.spec['layout.A']}, B {self.spec['layout.B']}, C {self.c_layout}")

    # --- what the launcher checks at run time (C strings and Python from the same tables) ---

    def leading_dimension_minimums(self) -> dict[str, str]:
        """Each leading dimension and the size it must be at least (as well as at least 1)."""
        contiguous_rows = {"A": ("K", "M"), "B": ("N", "K"), "C": ("N", "M")}
        layouts = {"A": self.spec["layout.A"], "B": self.spec["layout.B"], "C": self.c_layout}
        return {f"ld{name.lower()}": rows[0] if layouts[name] == "row" else rows[1]
                for name, rows in contiguous_rows.items()}

    def vector_requirements(self) -> list[tuple[str, str, str, int]]:
        """(pointer, size, leading dimension, vector) that the aligned variant needs divisible."""
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
        if self.grid(M, N) > 2**31 - 1:
            return "too many thread blocks for one launch"
        return None

    @staticmethod
    def swizzled_index(row: str, k: str) -> str:
        """C expression: float offset of (row, k) in a K-major tile of 32-float (128-byte) rows as
        TMA's 128-byte swizzle lays it out: 16-byte chunk c of row r lands at chunk c ^ (r % 8)."""
        return f"{row} * 32 + ((({k} >> 2) ^ ({row} & 7)) << 2) + ({k} & 3)"

    def tma_ready(self, M: int, N: int, K: int, lda: int, ldb: int, pointers: dict[str, int]) -> bool:
        """Whether TMA can load A and B (wgmma path): 16-byte aligned bases and row strides."""
        return (min(M, N, K) > 0 and lda % 4 == 0 and ldb % 4 == 0
                and pointers["A"] % 16 == 0 and pointers["B"] % 16 == 0)

    def aligned(self, M: int, N: int, K: int, lda: int, ldb: int, ldc: int,
                pointers: dict[str, int]) -> bool:
        """Whether the vector variant is safe for these sizes and device addresses."""
        values = {"M": M, "N": N, "K": K, "lda": lda, "ldb": ldb, "ldc": ldc}
        return all(values[size] % vec == 0 and values[ld] % vec == 0 and pointers[ptr] % (4 * vec) == 0
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


def _largest_vector(run: int) -> int:
    return 4 if run % 4 == 0 else 2 if run % 2 == 0 else 1


def _operand(spec: Spec, name: str, BM: int, BN: int, BK: int, threads: int) -> Operand:
    layout = spec[f"layout.{name}"]
    vector = spec[f"load.{name}.vector"]
    transpose = spec[f"load.{name}.transpose"]
    mode = spec[f"shared.{name}"]
    pad = spec[f"shared.{name}.pad"] if mode == "pad" else 0
    keys_load = (f"load.{name}.vector", f"load.{name}.transpose", f"layout.{name}")
    if name == "A":
        # math view of A: m x k. Row-major: rows are m; shared default: sA[m][k].
        free = "m"
        outer_dim, inner_dim = ("m", "k") if layout == "row" else ("k", "m")
    else:
        free = "n"
        outer_dim, inner_dim = ("k", "n") if layout == "row" else ("n", "k")
    size = {"m": BM, "n": BN, "k": BK}
    extent = {"m": "M", "n": "N", "k": "K"}
    outer, inner = size[outer_dim], size[inner_dim]
    # Shared rows: A defaults to [m][k], transposed to [k][m]; B defaults to [k][n], transposed to [n][k].
    smem_row_dim = ("k" if transpose else "m") if name == "A" else ("n" if transpose else "k")
    transposed_store = smem_row_dim != outer_dim
    smem_col_dim = inner_dim if not transposed_store else outer_dim
    smem_rows, smem_cols = size[smem_row_dim], size[smem_col_dim]

    if inner % vector:
        raise spec.error(keys_load, f"{name}'s tile is {outer} x {inner} ({outer_dim} x {inner_dim}, "
                         f"{inner_dim} contiguous for {layout}-major {name}); rows of {inner} floats "
                         f"cannot be read {vector} floats at a time",
                         f"a vector width that divides {inner}")
    chunks = outer * inner // vector
    if chunks % threads:
        raise spec.error(keys_load + ("block.m",) if vector > 1 else "block.m",
                         f"{name}'s {outer} x {inner} tile is {chunks} loads of {vector} "
                         f"float(s), which {threads} threads cannot share evenly",
                         f"a tile of a multiple of {threads * vector} floats, or another vector width")
    passes = chunks // threads

    swizzle = mode == "swizzle"
    swizzle_chunks = smem_cols // 4
    if swizzle:
        if smem_cols % 4 or swizzle_chunks < 2 or swizzle_chunks & (swizzle_chunks - 1):
            raise spec.error(f"shared.{name}", f"swizzle xor permutes 16-byte chunks within a shared row; "
                             f"s{name} rows hold {smem_cols} floats ({smem_col_dim}), which is not a "
                             "power-of-two number (>= 2) of 4-float chunks",
                             "rows of 8, 16, 32, ... floats, or pad N")
    smem_ld = smem_cols + pad
    if not transposed_store and vector > 1 and smem_ld % vector:
        raise spec.error(f"shared.{name}", f"pad {pad} makes s{name} rows {smem_ld} floats long, so "
                         f"{vector}-float stores into shared memory would be misaligned",
                         f"a pad that is a multiple of {vector}")
    # Whole 16-byte units per stage, so every stage (and B after A) starts aligned for float4.
    stage_floats = -(-smem_rows * smem_ld // 4) * 4

    # Shared index of the element at math coordinates (row dim, col dim) of the shared tile.
    row_var, col_var = smem_row_dim, smem_col_dim
    if swizzle:
        col_expr = f"({col_var} ^ ((({row_var}) % {swizzle_chunks}) << 2))"
    else:
        col_expr = col_var
    smem_index = f"({row_var}) * {smem_ld} + {col_expr}"

    # The inner product reads, for one k, a thread's run of TM (A) or TN (B) consecutive
    # free-dimension values; they are contiguous in shared memory when shared rows run along k.
    run = spec["thread.m"] if name == "A" else spec["thread.n"]
    frag_vector = _largest_vector(run) if smem_row_dim == "k" else 1
    if frag_vector > 1 and smem_ld % frag_vector:
        frag_vector = 1

    left = {"m": "m_left", "n": "n_left", "k": "k_left"}
    ld = f"ld{name.lower()}"
    # The block's first tile starts at its free-dimension origin, k = 0.
    origin = "block_m0" if name == "A" else "block_n0"
    tile_origin = origin if inner_dim == free else f"(long long){origin} * {ld}"
    k_step = f"BK * (long long){ld}" if outer_dim == "k" else "BK"
    return Operand(
        name=name, layout=layout, outer_dim=outer_dim, inner_dim=inner_dim, outer=outer,
        inner=inner, vector=vector, chunks_per_row=inner // vector, passes=passes,
        transposed_store=transposed_store, smem_rows=smem_rows, smem_cols=smem_cols,
        smem_ld=smem_ld, pad=pad, swizzle=swizzle, swizzle_chunks=swizzle_chunks if swizzle else 0,
        stage_floats=stage_floats, smem_index=smem_index, frag_vector=frag_vector,
        rows_left=left[outer_dim], cols_left=left[inner_dim],
        thread_runs=spec[f"load.{name}.uncoalesced"], tile_origin=tile_origin,
        k_step=k_step, extent_outer=extent[outer_dim], extent_inner=extent[inner_dim])


def make_plan(spec: Spec) -> Plan:
    """The Plan of a concrete spec, or a SpecError at the setting that makes it impossible."""
    if not spec.is_concrete:
        keys = spec.set_keys
        raise spec.error(keys[0], f"this spec is a search space ({', '.join(keys)} hold sets); "
                         "building needs one value for each", "gemmgen tune, or one value per setting")
    arch = ARCHS[spec["target"]]
    if not spec.written("block.m"):
        raise spec.error("block.m", f"kernel '{spec.name}' has no block setting: the C tile of a "
                         "thread block must be given", "block M x N x K, e.g. block 128 x 128 x 16")
    BM, BN, BK = spec["block.m"], spec["block.n"], spec["block.k"]
    TM, TN, RM, RN = spec["thread.m"], spec["thread.n"], spec["repeat.m"], spec["repeat.n"]
    uses_shared = spec["shared"]
    warp_tiling = spec.written("warp.m")
    WM, WN = (spec["warp.m"], spec["warp.n"]) if warp_tiling else (BM, BN)
    notes: list[str] = []
    math = spec["math"]
    mma_shape, m_step = None, 1
    if math == "simt":
        if spec.written("mma.m"):
            raise spec.error("mma.m", "mma picks a tensor-core instruction, but math simt multiplies "
                             "with FP32 FFMA", "math tf32 or math 3xtf32, or no mma line")
    else:
        if arch.has_wgmma:
            return _wgmma_plan(spec, arch)
        mma_shape = _mma_sync_shape(spec, arch, BK, WM, WN, warp_tiling, uses_shared)
        # Each lane of an m16n8 tile holds C rows g and g + 8, columns 2t and 2t + 1 (g = lane / 4,
        # t = lane % 4): a 2 x 2 "thread tile" whose rows are 8 apart, swept over the warp tile.
        TM, TN, m_step = 2, 2, 8
        RM, RN = WM // mma_shape[0], WN // mma_shape[1]

    if not uses_shared and (RM, RN) != (1, 1):
        raise spec.error("repeat.m", "sub-tile repeats sweep a warp tile held in shared memory, "
                         "which 'shared off' turns off", "thread M x N without repeat, or shared memory on")
    if warp_tiling and not uses_shared:
        raise spec.error(("warp.m", "shared"), "warp tiles share operands through shared memory, "
                         "which 'shared off' turns off", "remove the warp line, or shared memory on")
    if BM % WM or BN % WN:
        raise spec.error("warp.m", f"the block tile {BM} x {BN} is not a whole number of "
                         f"{WM} x {WN} warp tiles", f"a warp tile that divides {BM} x {BN}")
    if WM % RM or WN % RN:
        raise spec.error("repeat.m", f"repeat {RM} x {RN} does not split the "
                         f"{'warp' if warp_tiling else 'block'} tile {WM} x {WN} evenly",
                         f"a repeat that divides {WM} x {WN}")
    SUB_M, SUB_N = WM // RM, WN // RN
    if SUB_M % TM or SUB_N % TN:
        raise spec.error("thread.m", f"thread tiles of {TM} x {TN} do not cover the "
                         f"{SUB_M} x {SUB_N} sub-tile evenly "
                         f"({'warp' if warp_tiling else 'block'} tile {WM} x {WN} / repeat {RM} x {RN})",
                         f"a thread tile that divides {SUB_M} x {SUB_N}")
    lanes_m, lanes_n = SUB_M // TM, SUB_N // TN
    if warp_tiling:
        if lanes_m * lanes_n != WARP:
            raise spec.error(("thread.m", "warp.m"), f"a warp has 32 threads, but {SUB_M} x {SUB_N} "
                             f"sub-tiles of {TM} x {TN} per thread need {lanes_m * lanes_n}",
                             "warp M x N = thread tile x repeat x a 32-thread grid "
                             "(e.g. warp 64 x 64 with thread 8 x 4 repeat 1 x 4 → 8 x 4 lanes)")
        warps_m, warps_n = BM // WM, BN // WN
    else:
        warps_m = warps_n = 1
    threads = warps_m * warps_n * lanes_m * lanes_n
    if threads > MAX_THREADS_PER_BLOCK:
        raise spec.error(("thread.m", "block.m"), f"this tiling needs {threads} threads per block; "
                         f"a block has at most {MAX_THREADS_PER_BLOCK}",
                         "a larger thread tile or repeat, or a smaller block")
    if threads % WARP:
        raise spec.error(("thread.m", "block.m"), f"this tiling makes blocks of {threads} threads, "
                         "leaving part of a warp idle", "a thread count that is a multiple of 32")

    stages, fill = spec["stages"], spec["stages.fill"]
    if fill == "tma":
        raise spec.error("stages.fill", f"TMA copies feed wgmma kernels: target sm_90a with math tf32 or "
                         f"3xtf32 (this is {arch.name}, math {math})",
                         "stages N sync or async, or target sm_90a and tensor-core math")
    async_copy = fill == "async"
    fragments = spec["fragments"]
    if not uses_shared:
        for key, default in (("stages", 1), ("fragments", 1), ("load.A.vector", 1),
                             ("load.B.vector", 1), ("load.A.transpose", False),
                             ("load.B.transpose", False), ("shared.A", "plain"), ("shared.B", "plain")):
            if spec[key] != default:
                raise spec.error(key, f"'{key}' describes the shared-memory path, which 'shared off' "
                                 "turns off", "shared off with no load, shared A/B, stages or fragments")
        if async_copy:
            raise spec.error("stages.fill", "cp.async fills shared memory, which 'shared off' turns off",
                             "stages 1")
        if spec.written("block.k") and BK != 1:
            notes.append("block K is unused without shared memory")
        BK = 1
        a = b = None
        smem_bytes = 0
    else:
        if async_copy and stages < 2:
            raise spec.error("stages", "async copies overlap the next tile's load with this tile's "
                             "math, which needs at least 2 buffers", "stages 2 async or more")
        if not async_copy and stages > 2:
            raise spec.error("stages", f"loads through registers (sync) use 1 or 2 buffers; {stages} "
                             "buffers need cp.async", f"stages 2, or stages {stages} async")
        if fragments == 2 and BK < 2:
            raise spec.error("fragments", "double-buffered fragments prefetch the next k, but the "
                             "block K step is 1", "fragments 1, or block K >= 2")
        a = _operand(spec, "A", BM, BN, BK, threads)
        b = _operand(spec, "B", BM, BN, BK, threads)
        smem_bytes = 4 * stages * (a.stage_floats + b.stage_floats)
        if smem_bytes > arch.smem_per_block:
            raise spec.error(("stages", "block.m"), f"{stages} stage(s) of A and B tiles need "
                             f"{smem_bytes} bytes of shared memory; a block on {arch.name} gets at most "
                             f"{arch.smem_per_block}", "fewer stages, or a smaller block tile")

    c_layout = spec["layout.C"]
    c_vector = _largest_vector(TN if c_layout == "row" else TM)
    if c_layout == "col" and m_step > 1:
        c_vector = 1  # a lane's accumulator rows are m_step apart: no two adjacent along M
    if spec["split"] > 1:
        c_vector = 1  # split K adds into C with one atomicAdd per float
    reduce_count = spec["reduce.count"]
    split_k = spec["split"]
    if split_k > 1 and reduce_count:
        raise spec.error("split", "a split K adds partial products into C after the blocks finish, "
                         "but the fused reduction needs each entry of C final inside its block",
                         "split 1 with reduce, or no reduce")
    staged = spec["epilogue.staged"]
    if staged and not uses_shared:
        raise spec.error("epilogue.staged", "a staged epilogue assembles C in shared memory, which "
                         "'shared off' turns off", "epilogue alpha beta, or shared memory on")
    if staged and split_k > 1:
        raise spec.error("epilogue.staged", "split K adds partial tiles into C one float at a time; "
                         "staging whole tiles through shared memory gains nothing there",
                         "split 1 with staged, or an epilogue without staged")
    if split_k > 1 and not uses_shared:
        raise spec.error("split", "split K cuts the K loop of shared-memory tiles, which 'shared off' "
                         "turns off", "split 1, or shared memory on")
    occupancy = spec["occupancy"]
    if occupancy and occupancy * threads > arch.max_threads_per_sm:
        raise spec.error("occupancy", f"{occupancy} blocks of {threads} threads exceed the "
                         f"{arch.max_threads_per_sm} threads an SM of {arch.name} holds",
                         f"occupancy up to {arch.max_threads_per_sm // threads}")

    # The staged C tile runs along C's contiguous dimension and reuses the operands' shared memory.
    c_stage_rows, c_stage_cols = (BM, BN) if c_layout == "row" else (BN, BM)
    c_stage_ld = c_stage_cols + 4
    c_stage_vec = _largest_vector(c_stage_cols)
    if staged:
        smem_bytes = max(smem_bytes, 4 * c_stage_rows * c_stage_ld)
        if smem_bytes > arch.smem_per_block:
            raise spec.error("epilogue.staged", f"the staged {BM} x {BN} C tile needs {smem_bytes} "
                             f"bytes of shared memory; a block on {arch.name} gets at most "
                             f"{arch.smem_per_block}", "a smaller block tile, or no staged epilogue")

    staging = 0
    if uses_shared and not async_copy and stages == 2:
        staging = a.passes * a.vector + b.passes * b.vector
    if mma_shape:  # A fragments are 4 registers per m16 tile, B's 2 per n8 tile; 3xtf32 keeps big and small
        fragment_registers = (2 if math == "3xtf32" else 1) * (4 * RM + 2 * RN)
    else:
        fragment_registers = fragments * (TM * RM + TN * RN)
    # 3xtf32 keeps three sets of accumulators: the sum, the cross terms and one K tile's big*big
    accumulator_sets = 3 if mma_shape and math == "3xtf32" else 1
    registers = (accumulator_sets * TM * TN * RM * RN + fragment_registers + staging + 24
                 + 2 * reduce_count)
    if registers > MAX_REGISTERS_PER_THREAD:
        raise spec.error(("thread.m", "repeat.m", "stages", "block.m"), f"each thread would hold about {registers} values in "
                         f"registers ({TM * TN * RM * RN} accumulators); a thread has at most "
                         f"{MAX_REGISTERS_PER_THREAD} registers, and the rest would spill to local memory",
                         "a smaller thread tile or repeat")
    if registers * threads > arch.regs_per_sm:
        raise spec.error(("thread.m", "block.m", "warp.m"), f"a block of {threads} threads needing about "
                         f"{registers} registers each ({registers * threads}) does not fit the "
                         f"{arch.regs_per_sm} registers of an SM: the compiler would cap registers and spill",
                         "fewer threads per block (larger warp or thread tiles), or a smaller thread tile")
    if occupancy:
        cap = arch.regs_per_sm // (occupancy * threads)
        if registers > min(cap, MAX_REGISTERS_PER_THREAD):
            raise spec.error("occupancy", f"{occupancy} blocks of {threads} threads leave {cap} registers "
                             f"per thread, but this tiling needs about {registers}",
                             "a lower occupancy, or a smaller thread tile")

    return Plan(
        spec=spec, name=spec.name, arch=arch, uses_shared=uses_shared, BM=BM, BN=BN, BK=BK,
        WM=WM, WN=WN, TM=TM, TN=TN, RM=RM, RN=RN, SUB_M=SUB_M, SUB_N=SUB_N,
        warp_tiling=warp_tiling, warps_m=warps_m, warps_n=warps_n, lanes_m=lanes_m,
        lanes_n=lanes_n, threads=threads, order=spec["order"], stages=stages,
        async_copy=async_copy, fragments=fragments, raster_group=spec["raster.group"],
        occupancy=occupancy, beta=spec["epilogue.beta"], reduce_count=reduce_count,
        split_k=split_k, staged=staged, c_stage_rows=c_stage_rows, c_stage_cols=c_stage_cols,
        c_stage_ld=c_stage_ld, c_stage_vec=c_stage_vec, a=a, b=b,
        c_layout=c_layout, c_vector=c_vector, smem_bytes=smem_bytes,
        registers_estimate=registers, notes=tuple(notes), math=math, mma_shape=mma_shape,
        m_step=m_step, ldmatrix_a=bool(mma_shape) and _ldmatrix_fits(a, "m"),
        ldmatrix_b=bool(mma_shape) and _ldmatrix_fits(b, "n"))


def _ldmatrix_fits(op: Operand, free_dim: str) -> bool:
    """ldmatrix moves 8 rows of 16 bytes per matrix: it fits where shared rows run along the free
    dimension (so each row holds 4 consecutive k of one m or n) and rows start 16-byte aligned."""
    return op.smem_row_dim == free_dim and op.smem_ld % 4 == 0


def _mma_sync_shape(spec: Spec, arch: Arch, BK: int, WM: int, WN: int, warp_tiling: bool,
                    uses_shared: bool) -> tuple[int, int, int]:
    """The mma.sync instruction shape of a tensor-core spec, after checking the tiling fits it."""
    math = spec["math"]
    shape = ((spec["mma.m"], spec["mma.n"], spec["mma.k"]) if spec.written("mma.m")
             else MMA_SYNC_SHAPES[0])
    allowed = " or ".join(" x ".join(map(str, s)) for s in MMA_SYNC_SHAPES)
    if shape not in MMA_SYNC_SHAPES:
        raise spec.error("mma.m", f"mma.sync on {arch.name} multiplies TF32 in tiles of {allowed} "
                         f"(M x N x K), not {' x '.join(map(str, shape))}",
                         f"mma {allowed}, or target sm_90a for wgmma's 64 x N x 8")
    if spec.written("thread.m"):
        raise spec.error("thread.m", f"with math {math} each warp multiplies {shape[0]} x {shape[1]} "
                         "tiles on the tensor cores, which fixes what a thread holds: the MMA "
                         "instruction takes the place of the thread tile",
                         "no thread line (warp M x N sets how many MMA tiles a warp sweeps)")
    if not uses_shared:
        raise spec.error("shared", "tensor-core fragments are read from shared-memory tiles, which "
                         "'shared off' turns off", "shared memory on")
    if not warp_tiling:
        raise spec.error(("math", "block.m"), f"math {math} gives each warp its own C tile, so the "
                         "spec needs a warp tile", "warp M x N, e.g. warp 64 x 32")
    if WM % shape[0] or WN % shape[1]:
        raise spec.error("warp.m", f"the warp tile {WM} x {WN} is not a whole number of "
                         f"{shape[0]} x {shape[1]} MMA tiles",
                         f"warp M a multiple of {shape[0]} and N a multiple of {shape[1]}")
    if BK % shape[2]:
        raise spec.error("block.k", f"block K = {BK} is not a whole number of the MMA's K steps "
                         f"of {shape[2]}", f"block K a multiple of {shape[2]}")
    if spec["fragments"] != 1:
        raise spec.error("fragments", "double-buffered fragments are a simt technique; tensor-core "
                         "fragments of one K step are read just before their MMAs", "fragments 1")
    if spec["order"] != "n":
        raise spec.error("order", "the MMA instruction fixes which lane holds which C values, so "
                         "there is no thread order to choose", "no order line")
    return shape


def try_plan(spec: Spec) -> tuple[Plan | None, SpecError | None]:
    """make_plan for pruning a search space: the plan, or why the point is impossible."""
    try:
        return make_plan(spec), None
    except SpecError as exc:
        return None, exc


WARPGROUP = 128
WGMMA_BK = 32             # floats in one 128-byte swizzled shared row: one TMA box along K
TMA_PRODUCER_REGISTERS = 40  # what setmaxnreg leaves the TMA producer: it only issues copies
WGMMA_MAX_REGISTERS = 232  # what setmaxnreg gives each consumer thread beside such a producer
SETMAXNREG_CAP = 240       # setmaxnreg takes multiples of 8; a thread addresses at most 255 registers


def _wgmma_plan(spec: Spec, arch: Arch) -> Plan:
    """The sm_90a tensor-core kernels: BM / 64 consumer warpgroups each multiply a 64 x BN slab with
    wgmma from STAGES shared buffers (K-major, 128-byte swizzle). `stages N tma`: a producer
    warpgroup fills them with TMA under mbarriers, for K-major A and B (layout A row, B col); calls
    TMA cannot describe go to a `stages 4 async` fallback of 64 x 128 blocks. `stages N async`:
    loader warpgroups read tiles into registers, round them to TF32 (3xtf32: split them) and
    store them K-major, for any layout and alignment."""
    math = spec["math"]
    BM, BN, BK = spec["block.m"], spec["block.n"], spec["block.k"]
    for key, default in (("load.A.vector", 1), ("load.B.vector", 1), ("load.A.transpose", False),
                         ("load.B.transpose", False), ("load.A.uncoalesced", False),
                         ("load.B.uncoalesced", False), ("shared.A", "plain"), ("shared.B", "plain")):
        if spec[key] != default:
            raise spec.error(key, "on the wgmma path tiles land in shared memory K-major with a 128-byte "
                             "swizzle, copied 16 bytes at a time where the data allow; load and shared "
                             "lines do not apply",
                             "no load or shared lines with target sm_90a and tensor-core math")
    if not spec["shared"]:
        raise spec.error("shared", "wgmma reads its operands from shared memory", "shared memory on")
    fill = spec["stages.fill"]
    if fill not in ("tma", "async"):
        raise spec.error("stages.fill", "a wgmma kernel's shared buffers are filled by TMA (a producer "
                         "warpgroup, K-major A and B) or by cp.async (every thread, any layout)",
                         "stages N tma, or stages N async")
    tma = fill == "tma"
    if tma and (spec["layout.A"] != "row" or spec["layout.B"] != "col"):
        raise spec.error(("layout.A", "layout.B"), "wgmma reads TF32 operands from shared memory "
                         "only K-major, and TMA copies tiles as they lie: A must be row-major and B "
                         "column-major (K contiguous in both)",
                         "layout A row, B col; or stages N async (cp.async transposes on the way)")
    if spec.written("thread.m"):
        raise spec.error("thread.m", "with wgmma each warpgroup multiplies a 64 x N tile; there is no "
                         "thread tile", "no thread line")
    for key, default, why in (("reduce.count", 0, "fused reduction"), ("epilogue.staged", False, "staged epilogue"),
                              ("fragments", 1, "fragment double buffering"), ("order", "n", "thread order")):
        if spec[key] != default:
            raise spec.error(key, f"the wgmma path has no {why}", f"target sm_90 (mma.sync) for {why}")
    if BK != WGMMA_BK:
        raise spec.error("block.k", f"a wgmma K tile is one 128-byte swizzled row of {WGMMA_BK} floats, "
                         f"not {BK}", f"block M x N x {WGMMA_BK}")
    if BM % 64 or not 1 <= BM // 64 <= 2:
        raise spec.error("block.m", f"each consumer warpgroup multiplies 64 rows; block M = {BM} "
                         "must be 64 or 128 (one or two consumer warpgroups)", "block 64 or 128 x N x 32")
    if BN % 8 or not 8 <= BN <= 256:
        raise spec.error("block.n", f"a wgmma tile is 64 x N with N a multiple of 8 up to 256, so "
                         f"block N = {BN} cannot be one", "block N from 8 to 256, a multiple of 8")
    if spec.written("warp.m") and (spec["warp.m"], spec["warp.n"]) != (64, BN):
        raise spec.error("warp.m", f"a consumer warpgroup's tile is 64 x {BN} (64 rows of the block, "
                         "all its columns)", f"warp 64 x {BN}, or no warp line")
    shape = (spec["mma.m"], spec["mma.n"], spec["mma.k"]) if spec.written("mma.m") else (64, BN, 8)
    if shape != (64, BN, 8):
        raise spec.error("mma.m", f"with block N = {BN}, each warpgroup issues wgmma 64 x {BN} x 8 "
                         f"(TF32 K step 8), not {' x '.join(map(str, shape))}", f"mma 64 x {BN} x 8")
    stages = spec["stages"]
    if stages < 2:
        raise spec.error("stages", "the pipeline loads tiles ahead of the math; it needs at least "
                         "2 buffers", "stages 2 to 8, e.g. stages 4")
    consumers = BM // 64
    # Loader warpgroups hold K tiles in registers between their loads and their stores; a single
    # consumer multiplies a tile faster than one loader's loads return, so it gets two loaders.
    loaders = 0 if tma else (2 if consumers == 1 else 1)
    threads = (consumers + (1 if tma else loaders)) * WARPGROUP
    if tma:  # 3xtf32: B's remainders too (A is split in registers)
        stage_bytes = 4 * BK * (BM + BN * (2 if math == "3xtf32" else 1))
    else:    # 3xtf32: A's and B's remainders too
        stage_bytes = 4 * BK * (BM + BN) * (2 if math == "3xtf32" else 1)
    # mbarriers per stage (full, empty; TMA 3xtf32: ready), and slack to align buffers to 1024 B.
    barriers = (3 if tma and math == "3xtf32" else 2) * 8 * stages
    smem_bytes = stages * stage_bytes + barriers + 1024
    if smem_bytes > arch.smem_per_block:
        raise spec.error(("stages", "block.m"), f"{stages} stages of {stage_bytes} bytes need {smem_bytes} "
                         f"bytes of shared memory; a block on {arch.name} gets at most "
                         f"{arch.smem_per_block}", f"stages {(arch.smem_per_block - 1024) // stage_bytes} "
                         "or fewer, or a smaller block")
    accumulators = BN // 2  # a 64 x BN fp32 tile over 128 threads
    loaded_floats = (BM + BN) * BK // WARPGROUP  # a loader thread's share of one K tile
    if tma:
        loader_registers, limit = TMA_PRODUCER_REGISTERS, WGMMA_MAX_REGISTERS
    else:
        # Each thread starts with `launch` registers. A lone consumer (64-row blocks) takes 8 from
        # each of its two loaders with setmaxnreg, for wide tiles; the loaders still hold a K tile
        # and its addresses (ptxas spilled some loaders at 152, none at 160).
        launch = min(MAX_REGISTERS_PER_THREAD, arch.regs_per_sm // threads) // 8 * 8
        loader_registers = launch - 8 if loaders > consumers else launch
        limit = min(SETMAXNREG_CAP, (launch * (loaders + consumers) - loaders * loader_registers)
                    // consumers // 8 * 8)
    if math != "3xtf32":
        registers = accumulators + 48
    elif tma:  # also one K tile's products and A's big and small fragments (see wgmma_kernel.cu.j2)
        registers = 2 * accumulators + 32 + 40
    else:      # also one K tile's products (see wgmma_async.cu.j2)
        registers = 2 * accumulators + 40
    if registers > limit:
        raise spec.error("block.n", f"a consumer thread would hold about {registers} registers "
                         f"({accumulators} accumulators); it can have {limit}"
                         + ("" if tma else f" beside {loaders} loader warpgroup(s) of "
                            f"{loader_registers}"), "a smaller block N")
    # Two tiles in flight per loader where their registers fit (loads wait on memory most of the time).
    loader_depth = 2 if loaders and 2 * loaded_floats + 64 <= loader_registers else 1
    if loaders and loaded_floats + 56 > loader_registers:
        raise spec.error(("block.m", "block.n"), f"a loader thread would hold {loaded_floats} floats "
                         f"of each K tile and their addresses in {loader_registers} registers",
                         "a smaller block")
    occupancy = spec["occupancy"]
    if occupancy > 1:
        raise spec.error("occupancy", "a wgmma block takes most of an SM's shared memory and registers",
                         "occupancy 1, or no occupancy line")
    # Split K: blockIdx.y takes one slice of the K tiles, and the slices add their products into C
    # with atomicAdd after the launcher has set C = beta * C (for small M x N with a long K).
    split_k = spec["split"]
    fallback = None
    if tma:
        # Calls TMA cannot describe go to the register-fed kernel (stages N async) with 64 x 128
        # blocks. On an H100 in TF32 it beat mma.sync, the fallback before it, at every shape
        # measured: 4096^3 with ld + 1, 84.8 against 78.0 TFLOP/s; 2048^3 with ld + 1, 78.7
        # against 74.9; 127x4099x1023, 28.6 against 12.4 (64-row blocks spread skinny C over
        # the SMs).
        fallback = make_plan(replace(spec.with_values(
            block_m=64, block_n=128, warp_m=64, warp_n=128, mma_m=64, mma_n=128, mma_k=8, stages=4,
            stages_fill="async"), name=f"{spec.name}_fallback"))
    return Plan(
        spec=spec, name=spec.name, arch=arch, uses_shared=True, BM=BM, BN=BN, BK=BK, WM=64, WN=BN,
        TM=2, TN=2, RM=1, RN=BN // 8, SUB_M=16, SUB_N=8, warp_tiling=True, warps_m=consumers,
        warps_n=1, lanes_m=8, lanes_n=4, threads=threads, order="n", stages=stages, async_copy=True,
        fragments=1, raster_group=spec["raster.group"], occupancy=1, beta=spec["epilogue.beta"],
        reduce_count=0, split_k=split_k, staged=False, c_stage_rows=0, c_stage_cols=0, c_stage_ld=0,
        c_stage_vec=1, a=None, b=None, c_layout=spec["layout.C"],
        c_vector=2 if spec["layout.C"] == "row" and split_k == 1 else 1, smem_bytes=smem_bytes,
        registers_estimate=registers, math=math, mma_shape=shape, m_step=8, consumers=consumers,
        tma=tma, loaders=loaders, loader_depth=loader_depth, loader_registers=loader_registers,
        consumer_registers=limit, fallback=fallback)
