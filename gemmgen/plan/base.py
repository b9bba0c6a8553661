"""What a Plan holds: a kernel's parts (parts/: tile, mainloop, schedule, epilogue) and the numbers of
the whole, with the argument checks the launchers share. The planning itself is per mainloop:
tiled.py (SIMT and mma.sync), wgmma.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..language.spec import Spec
from .arch import Arch
from .parts.epilogue import Epilogue
from .parts.launch import BATCH
from .parts.mainloop import Mainloop
from .parts.schedule import Schedule
from .parts.tile import Tile


def _from(part: str, name: str, doc: str = "") -> property:
    """A shorthand on the Plan for a part's number (or method): plan.split_k is plan.scheduler.split_k."""
    return property(lambda plan: getattr(getattr(plan, part), name), doc=doc or f"{part}.{name}")


@dataclass(frozen=True)
class Plan:
    """A kernel: its spec, target and parts, and the numbers of the whole (shared memory, registers)."""

    spec: Spec
    name: str
    arch: Arch
    tile: Tile                # block, warp and thread tiles: the tile part (parts/tile.py)
    mainloop: Mainloop        # how A and B reach the math: the mainloop part (parts/mainloop.py)
    scheduler: Schedule       # how blocks take C tiles: the schedule part (parts/schedule.py)
    epilogue: Epilogue        # how the accumulators reach C: the epilogue part (parts/epilogue.py)
    smem_bytes: int           # dynamic shared memory per block
    registers_estimate: int   # live values per thread (consumer thread of a wgmma kernel)
    notes: tuple[str, ...] = field(default=())

    # The tile's numbers, by their short names.
    BM = _from("tile", "BM")
    BN = _from("tile", "BN")
    BK = _from("tile", "BK")
    WM = _from("tile", "WM")
    WN = _from("tile", "WN")
    TM = _from("tile", "TM")
    TN = _from("tile", "TN")
    RM = _from("tile", "RM")
    RN = _from("tile", "RN")
    SUB_M = _from("tile", "SUB_M")
    SUB_N = _from("tile", "SUB_N")
    warp_tiling = _from("tile", "warp_tiling")
    warps_m = _from("tile", "warps_m")
    warps_n = _from("tile", "warps_n")
    lanes_m = _from("tile", "lanes_m")
    lanes_n = _from("tile", "lanes_n")
    threads = _from("tile", "threads")
    warps = _from("tile", "warps")
    order = _from("tile", "order")
    m_step = _from("tile", "m_step")
    occupancy = _from("tile", "occupancy")
    accumulators = _from("tile", "accumulators")
    acc_row = _from("tile", "acc_row")

    # The mainloop's numbers, by their short names (each path's own, or the base's "absent" values).
    path = _from("mainloop", "name", "simt, mma_sync, wgmma_async (wgmma fed by loader warpgroups) or "
                 "wgmma (fed by TMA)")
    math = _from("mainloop", "math")
    tensor_cores = _from("mainloop", "tensor_cores")
    split_terms = _from("mainloop", "split_terms")
    uses_shared = _from("mainloop", "uses_shared")
    stages = _from("mainloop", "stages")
    async_copy = _from("mainloop", "async_copy")
    fragments = _from("mainloop", "fragments")
    unroll = _from("mainloop", "unroll")
    a = _from("mainloop", "a")
    b = _from("mainloop", "b")
    mma_shape = _from("mainloop", "mma_shape")
    ldmatrix_a = _from("mainloop", "ldmatrix_a")
    ldmatrix_b = _from("mainloop", "ldmatrix_b")
    consumers = _from("mainloop", "consumers")
    tma = _from("mainloop", "tma")
    loaders = _from("mainloop", "loaders")
    loader_depth = _from("mainloop", "loader_depth")
    loader_registers = _from("mainloop", "loader_registers")
    consumer_registers = _from("mainloop", "consumer_registers")
    promote_tiles = _from("mainloop", "promote_tiles")
    fallback = _from("mainloop", "fallback")
    truncates = _from("mainloop", "truncates", "whether A and B reach TF32 by truncation, not rounded to nearest")

    # The schedule's numbers, by their short names: how blocks take C tiles (data-parallel, split K,
    # persistent, stream-k, pingpong) and thread-block clusters (cluster_m x cluster_n blocks share
    # their A tiles along N and B tiles along M, each loading a slice and multicasting it).
    schedule = _from("scheduler", "name", "data-parallel, persistent, stream-k or pingpong")
    split_k = _from("scheduler", "split_k", "slices of K per C tile, each in its own block, summed into C")
    raster_group = _from("scheduler", "raster_group")
    cluster_m = _from("scheduler", "cluster_m")
    cluster_n = _from("scheduler", "cluster_n")
    cluster_blocks = _from("scheduler", "cluster_blocks")
    cluster_row_mask = _from("scheduler", "cluster_row_mask")
    cluster_column_mask = _from("scheduler", "cluster_column_mask")
    scheduled = _from("scheduler", "scheduled")
    pingpong = _from("scheduler", "pingpong")
    max_scheduled_blocks = _from("scheduler", "max_scheduled_blocks")
    grid = _from("scheduler", "grid")
    cluster_tiles = _from("scheduler", "cluster_tiles")
    cluster_grid = _from("scheduler", "cluster_grid")
    launch_blocks = _from("scheduler", "launch_blocks")
    workspace_bytes = _from("scheduler", "workspace_bytes")
    block_load_bytes = _from("scheduler", "block_load_bytes", "bytes of A and B a block reads from L2 per K tile")

    # The epilogue's numbers, by their short names (the staged ones exist where the store is staged).
    beta = _from("epilogue", "beta")
    reduce_count = _from("epilogue", "reduce_count")
    c_layout = _from("epilogue", "c_layout")
    c_vector = _from("epilogue", "c_vector", "floats per store of C in the aligned variant")
    c = _from("epilogue", "c", "index expressions for C (Output)")
    staged = _from("epilogue", "staged", "C tile assembled in shared memory, then stored row by row")
    c_stage_rows = _from("epilogue", "c_stage_rows")
    c_stage_cols = _from("epilogue", "c_stage_cols")
    c_stage_ld = _from("epilogue", "c_stage_ld")
    c_stage_vec = _from("epilogue", "c_stage_vec")
    tma_store = _from("epilogue", "tma_store", "the TMA wgmma kernels' staged epilogue: boxes stored by TMA")
    c_box_outer = _from("epilogue", "c_box_outer")
    c_box_inner = _from("epilogue", "c_box_inner")
    c_buffers = _from("epilogue", "c_buffers")
    c_box_swizzle = _from("epilogue", "c_box_swizzle")
    c_box_index = _from("epilogue", "c_box_index")

    @property
    def extra_parameters(self) -> tuple:
        """The kernel parameters the parts add after the mainloop's (parts/launch.py's Parameter),
        then the batches' (BATCH: count and strides)."""
        return self.epilogue.parameters + self.scheduler.parameters + BATCH

    @property
    def signature(self) -> tuple:
        """The main kernel's parameters, (name, kind) in order."""
        return self.mainloop.parameters + self.extra_parameters

    @property
    def helper_launches(self) -> tuple:
        """The kernels the parts launch beside the main one (parts/launch.py's Helper), in order."""
        return self.epilogue.launches + self.scheduler.launches

    @property
    def kernel_name(self) -> str:
        return f"gemmgen_{self.name}_kernel"

    @property
    def launcher_name(self) -> str:
        return f"gemmgen_{self.name}"

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
        None: no size need be): the mainloop's loads', then the epilogue's stores'."""
        return (self.mainloop.vector_requirements(self.spec["layout.A"], self.spec["layout.B"])
                + self.epilogue.vector_requirements())

    def vector_needs(self) -> str:
        """vector_requirements in words."""
        return ", ".join((f"{size} and {ld} multiples of {vec}" if size else f"{ld} a multiple of {vec}")
                         + f", {ptr} {4 * vec}-byte aligned" for ptr, size, ld, vec in self.vector_requirements())

    def rows(self) -> list[tuple[str, str]]:
        """The numbers a reader of the kernel wants, as (label, value) rows, from its parts: the
        header of the generated .cu and `gemmgen explain` show them."""
        mainloop, schedule, epilogue = self.mainloop, self.scheduler, self.epilogue
        return (mainloop.rows(self) + schedule.order_rows() + epilogue.rows() + schedule.work_rows(mainloop.k_slices)
                + epilogue.fusion_rows() + mainloop.path_rows(self)
                + [(epilogue.needs_label, self.vector_needs() or mainloop.no_needs)])

    def argument_error(self, M: int, N: int, K: int, lda: int, ldb: int, ldc: int, batch: int = 1,
                       strides: tuple[int, int, int] = (0, 0, 0)) -> str | None:
        """Why the launcher would return cudaErrorInvalidValue for these sizes (and `batch`
        products, A's, B's and C's strides), or None."""
        problem = self.batch_error(M, N, ldc, batch, strides)
        if problem:
            return problem
        if min(M, N, K) < 0:
            return f"sizes must be >= 0 (M={M}, N={N}, K={K})"
        sizes = {"M": M, "N": N, "K": K}
        given = {"lda": lda, "ldb": ldb, "ldc": ldc}
        for ld, size in self.leading_dimension_minimums().items():
            if given[ld] < max(1, sizes[size]):
                return f"{ld}={given[ld]} is below max(1, {size}={sizes[size]})"
        if self.reduce_count and M * N > 0xFFFFFFFF:
            return "the fused reduction numbers positions with 32 bits: M*N must be below 2^32"
        if self.cluster_grid(M, N) * max(batch, 1) > 2**31 - 1:
            return "too many thread blocks for one launch"
        return None

    def batch_error(self, M: int, N: int, ldc: int, batch: int, strides: tuple[int, int, int]) -> str | None:
        """The batched launcher's checks of `batch` and the strides (launcher_checks.cuh.j2)."""
        if batch < 0 or min(strides) < 0:
            return f"batch and strides must be >= 0 (batch={batch}, strides={tuple(strides)})"
        if batch > 1 and self.reduce_count:
            return "the fused reduction ranks the entries of one C: it multiplies one batch"
        extent = self.c.extent(M, N, ldc)
        if batch > 1 and strides[2] < extent:
            return (f"strideC={strides[2]} is below C's extent of {extent} floats: the batches of C "
                    "would overlap")
        if batch > 1 and max(strides) > (2**63 - 1) // batch:
            return "batch * stride overflows 64 bits"
        return None

    @staticmethod
    def swizzled_index(row: str, k: str) -> str:
        """C expression: float offset of (row, k) in a K-major tile of 32-float (128-byte) rows as
        TMA's 128-byte swizzle lays it out: 16-byte chunk c of row r lands at chunk c ^ (r % 8)."""
        return f"{row} * 32 + ((({k} >> 2) ^ ({row} & 7)) << 2) + ({k} & 3)"

    @staticmethod
    def swizzled_mn_index(row: str, k: str) -> str:
        """C expression: float offset of (row, k) in an MN-major tile as TMA lays out its boxes of
        32 rows by BK: box row >> 5 of 32 x BK floats, in it K row k of 128 bytes (32 rows),
        swizzled as a K-major tile's (chunk c of row k at chunk c ^ (k % 8))."""
        return f"({row} >> 5) * 32 * BK + {k} * 32 + (((({row} & 31) >> 2) ^ ({k} & 7)) << 2) + ({row} & 3)"

    def aligned(self, M: int, N: int, K: int, lda: int, ldb: int, ldc: int,
                pointers: dict[str, int], strides: dict[str, int] | None = None) -> bool:
        """Whether the vector variant is safe for these sizes, device addresses and (batches) the
        strides of A, B and C."""
        values = {"M": M, "N": N, "K": K, "lda": lda, "ldb": ldb, "ldc": ldc}
        strides = strides or {}
        return all((size is None or values[size] % vec == 0) and values[ld] % vec == 0
                   and pointers[ptr] % (4 * vec) == 0 and strides.get(ptr, 0) % vec == 0
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
