"""How one input matrix (A or B) of a tiled mainloop travels: global tile -> shared tile -> register
fragments, as index expressions the templates paste into CUDA (planned by plan/tiled.py)."""

from __future__ import annotations

from dataclasses import dataclass


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
