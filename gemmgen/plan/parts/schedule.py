"""The schedule part: how a kernel's blocks take the C tiles (CUTLASS's tile scheduler).

- DataParallel: a block per C tile, numbered in raster order (with clusters: whole clusters of
  tiles, a block past C's edge storing nothing);
- SplitK: the same, and a block per slice of the K tiles too (blockIdx.y), the slices adding into
  C with atomics after the launcher has set C = beta * C;
- ClusterSplitK: the slices of a tile as one cluster, block 0 storing C and the others adding into it;
- WorkspaceSplitK: the slices writing their products to a workspace, the last of a tile's to finish
  adding them in K order and storing C as an unsplit kernel does;
- Persistent: no more blocks than SMs, block b walking tiles b, b + grid, ... (clusters: whole
  clusters walking cluster tiles); the TMA producer runs on into the next tile;
- StreamK: as persistent, but the last partial wave and one before it dealt out by K tile, the
  pieces of a shared tile summed in a workspace (plan/schedule.py deals the same in Python);
- PingPong: persistent, the block's tiles taken by its two consumer warpgroups in turn.

`schedule_of` picks the class from the spec; the planners call the `check_*` functions where a
rule applies (each raises a SpecError at the setting).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil
from typing import ClassVar

from ...language.spec import Spec
from .launch import SCALE_C, Helper, Parameter

# A scheduled kernel starts at most this many blocks (one per SM): stream-K's counters take a
# fixed place for the tiles of this many at the start of its workspace, whatever the grid.
MAX_SCHEDULED_BLOCKS = 1024


@dataclass(frozen=True)
class Schedule:
    """Data-parallel: a block per C tile (with clusters, whole clusters of cluster_m x cluster_n
    tiles). The base of every schedule: its tile counts, cluster shape and raster order."""

    BM: int
    BN: int
    BK: int
    raster_group: int = 1     # block rows per raster group (1: row order)
    cluster_m: int = 1        # thread-block clusters of cluster_m x cluster_n blocks (TMA kernels)
    cluster_n: int = 1
    consumers: int = 0        # consumer warpgroups of a wgmma kernel (stream-K counts per warp)
    split_k: int = 1          # slices of K per C tile, each in its own block (SplitK)

    name: ClassVar[str] = "data-parallel"
    scheduled: ClassVar[bool] = False   # blocks walk C tiles through a tile scheduler (Schedule struct)
    pingpong: ClassVar[bool] = False    # the block's tiles alternate between its two consumers
    split_by: ClassVar[str] = "atomic"  # how split K's slices meet: atomic, cluster or workspace
    max_scheduled_blocks: ClassVar[int] = MAX_SCHEDULED_BLOCKS
    # templates: code the kernels include (after common.cuh.j2), and the TMA kernel's walk over tiles
    helpers: ClassVar[tuple[str, ...]] = ()
    walk_template: ClassVar[str] = "wgmma_tiles.cuh.j2"
    parameters: ClassVar[tuple[Parameter, ...]] = ()  # kernel parameters after the main ones

    @property
    def in_cluster(self) -> bool:
        """Whether split K's slices of a tile are one cluster (ClusterSplitK)."""
        return self.split_by == "cluster"

    @property
    def cluster_template(self) -> str:
        """The TMA kernel's loads and stage releases: by its own block, or shared in a cluster."""
        return "wgmma_cluster.cuh.j2" if self.cluster_blocks > 1 else "wgmma_unclustered.cuh.j2"

    @property
    def raster_constants(self) -> list[tuple[str, int, str]]:
        """(name, value, comment) of the constants the tile order adds to a kernel."""
        return [("RASTER_GROUP", self.raster_group, "block rows per raster group")] if self.raster_group > 1 else []

    @property
    def split_constants(self) -> list[tuple[str, int, str]]:
        return []

    def k_tile_of(self, t: str) -> str:
        """C expression: the K tile that a block's t-th K tile is (split K: of its slice)."""
        return t

    @property
    def empty_arrivals(self) -> tuple[str, str]:
        """(C expression, comment) of the arrivals that free a stage of a TMA kernel: one per consumer
        warp (ping-pong: of the consumer whose tile the stage holds), from every block sharing it."""
        count, whose = ("4", "per warp of the consumer whose tile it holds") if self.pingpong else \
            ("CONSUMERS * 4", "per consumer warp")
        if self.cluster_blocks == 1:
            return count, f"one arrival {whose}"
        return f"{count} * SHARERS", f"one arrival {whose}" + (", in each sharer" if self.pingpong else " of each sharer")

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
    def block_load_bytes(self) -> int:
        """Bytes of A and B a block reads from L2 per K tile (TMA kernels in a cluster: a slice of
        each tile it shares, multicast to the others)."""
        return 4 * (self.BM // self.cluster_n + self.BN // self.cluster_m) * self.BK

    def cluster_words(self) -> str:
        """What the blocks of a cluster share, and the L2 reads it saves, in words ("": no clusters)."""
        if self.cluster_blocks == 1:
            return ""
        cm, cn, BM, BN, BK = self.cluster_m, self.cluster_n, self.BM, self.BN, self.BK
        shares = []
        if cm > 1:
            shares.append(f"the {cm} blocks along M share B's {BN} x {BK} tile, each loading {BN // cm} rows "
                          "and multicasting them to the others")
        if cn > 1:
            shares.append(f"the {cn} blocks along N share A's {BM} x {BK} tile, each loading {BM // cn} rows "
                          "and multicasting them to the others")
        return (f"{cm} x {cn} blocks per cluster (__cluster_dims__({self.cluster_blocks}, 1, 1)): "
                + "; ".join(shares) + f". Each block reads {self.block_load_bytes} bytes of each K tile from L2 "
                f"instead of {4 * BK * (BM + BN)}. A stage is refilled once every block that fills it has freed it; "
                "a launch takes whole clusters, and blocks past C's edge multiply zeros and store nothing.")

    abi_notes: ClassVar[list[str]] = []  # what the C header says of the schedule's results

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

    # --- the launch: blocks along x (and y) for `batch` products M x N x K on `sms` SMs, in Python
    # and in C. The C launchers compute `blocks` (c_blocks, as cluster_grid times batch: the tiles of
    # every batch, one after another), then from it and `sms` the grid (c_grid's statements, as
    # launch_blocks), and launch c_dims blocks; tests/test_parts.py runs the C on the host against
    # these methods.

    launch_template: ClassVar[str] = "launch_data_parallel.cuh.j2"  # the launcher's code around it
    launches: ClassVar[tuple[Helper, ...]] = ()  # kernels launched beside the main one
    c_dims: ClassVar[str] = "(unsigned)blocks"  # the launch's grid, a C expression
    c_grid: ClassVar[tuple[str, ...]] = ()      # C statements: `grid` from `blocks` and `sms`
    c_grid_note: ClassVar[str] = ""

    def launch_blocks(self, M: int, N: int, K: int, sms: int, batch: int = 1) -> int:
        """Blocks along x the launcher starts on a GPU of `sms` SMs (the launcher's arithmetic)."""
        return self.cluster_grid(M, N) * batch

    def launch_grid(self, M: int, N: int, K: int, sms: int, batch: int = 1) -> tuple[int, int]:
        """The grid (x, y) of the main kernel's launch (M, N, batch > 0)."""
        return self.launch_blocks(M, N, K, sms, batch), self.split_k

    @property
    def c_blocks(self) -> tuple[str, ...]:
        """C statements: `blocks`, the C tiles (with clusters, of whole clusters) as cluster_grid, of
        every batch."""
        if self.cluster_blocks == 1:
            return ("const long long blocks = (long long)((M + BM - 1) / BM) * ((N + BN - 1) / BN) * batch;",)
        return ("// Whole clusters of CLUSTER_M x CLUSTER_N C tiles (the blocks past C's edge store nothing).",
                "const long long blocks = (long long)((M + CLUSTER_M * BM - 1) / (CLUSTER_M * BM)) *",
                "                         ((N + CLUSTER_N * BN - 1) / (CLUSTER_N * BN)) * CLUSTER_BLOCKS * batch;")

    def workspace_bytes(self, blocks: int) -> int:
        """Bytes of workspace a launch of `blocks` blocks needs (stream-K's; others none)."""
        return 0

    def describe(self) -> str:
        """One line on the schedule for headers and explain."""
        return "data-parallel: one block per C tile"

    # --- rows: what the header of the .cu and explain say about the schedule (around the epilogue's)
    def order_rows(self) -> list[tuple[str, str]]:
        """The walk over the tiles (a scheduler's) and the raster order."""
        walk = [("schedule", self.describe())] if self.scheduled else []
        return walk + [("raster", "row order" if self.raster_group == 1 else f"groups of {self.raster_group} block rows")]

    def work_rows(self, k_slices: str) -> list[tuple[str, str]]:
        """How a C tile's work is divided among blocks (split K: in `k_slices`, the mainloop's words)."""
        return []


@dataclass(frozen=True)
class SplitK(Schedule):
    """Data-parallel with K cut in split_k slices: blockIdx.y takes one slice of the K tiles, and the
    slices add their products into C with atomicAdd after the launcher has set C = beta * C (for
    small M x N with a long K)."""

    helpers: ClassVar[tuple[str, ...]] = ("split_k.cuh.j2",)
    launches: ClassVar[tuple[Helper, ...]] = (Helper("scale_c", SCALE_C, 256, spread=True),)  # C = beta * C
    c_dims: ClassVar[str] = "dim3((unsigned)blocks, SPLIT_K)"

    @property
    def split_constants(self) -> list[tuple[str, int, str]]:
        return [("SPLIT_K", self.split_k, "slices of K per C tile (blockIdx.y)")]

    def k_tile_of(self, t: str) -> str:
        return f"(k_tile0 + {t})"

    def describe(self) -> str:
        return f"data-parallel: one block per C tile and K slice ({self.split_k})"

    @property
    def abi_notes(self) -> list[str]:
        return [f"split K: {self.split_k} slices of K are added into C with atomicAdd, so results "
                "may differ in the last bits from run to run."]

    def work_rows(self, k_slices: str) -> list[tuple[str, str]]:
        return [("split K", f"{self.split_k} {k_slices} (blockIdx.y), added into C with atomicAdd after C = beta * C")]


@dataclass(frozen=True)
class ClusterSplitK(SplitK):
    """`split N cluster`: split K's slices of a C tile run as one thread-block cluster of N blocks
    (blockIdx.y, its cluster rank). Block 0 stores C = alpha * (its product) + beta * C as an
    unsplit kernel does, then tells the others through their barriers, and they add their products
    into C (two floats per atomic access where C allows): no pass C = beta * C before the kernel."""

    helpers: ClassVar[tuple[str, ...]] = ("split_cluster.cuh.j2",)
    launches: ClassVar[tuple[Helper, ...]] = ()
    split_by: ClassVar[str] = "cluster"

    @property
    def cluster_template(self) -> str:
        return "wgmma_split_cluster.cuh.j2"

    @property
    def split_constants(self) -> list[tuple[str, int, str]]:
        return [("SPLIT_K", self.split_k, "slices of K per C tile (blockIdx.y), one cluster of blocks")]

    def describe(self) -> str:
        return (f"data-parallel: one cluster of {self.split_k} blocks per C tile, a block per K slice; "
                "block 0 stores C, the others add into it")

    @property
    def abi_notes(self) -> list[str]:
        return [f"split K: {self.split_k} slices of K, the first stored into C and the others added with "
                "atomics, so results may differ in the last bits from run to run."]

    def work_rows(self, k_slices: str) -> list[tuple[str, str]]:
        return [("split K", f"{self.split_k} {k_slices} (blockIdx.y), the blocks of one cluster "
                 f"(__cluster_dims__(1, {self.split_k}, 1)): block 0 stores C = alpha * (its product) + "
                 f"beta * C, then blocks 1-{self.split_k - 1} add theirs with atomics (no pass over C first)")]


@dataclass(frozen=True)
class WorkspaceSplitK(SplitK):
    """`split N workspace`: block (tile, y) writes its slice's product to the tile's slot y of a
    workspace and counts itself in; the last of the tile's N blocks to arrive adds the N slots in K
    order and stores C as an unsplit kernel does (alpha, beta, bias, scale, activation, a staged
    store): no pass C = beta * C before the kernel, no atomics into C, and the same bits every run."""

    helpers: ClassVar[tuple[str, ...]] = ("split_workspace.cuh.j2",)
    launches: ClassVar[tuple[Helper, ...]] = ()
    split_by: ClassVar[str] = "workspace"
    parameters: ClassVar[tuple[Parameter, ...]] = (Parameter("workspace", "p"),)
    launch_template: ClassVar[str] = "launch_split_workspace.cuh.j2"

    @property
    def cluster_template(self) -> str:
        return "wgmma_split_workspace.cuh.j2"

    @property
    def split_constants(self) -> list[tuple[str, int, str]]:
        return [("SPLIT_K", self.split_k, "slices of K per C tile (blockIdx.y), summed through a workspace")]

    def workspace_bytes(self, blocks: int) -> int:
        """A region per C tile (`blocks` of them, every batch's): its counter, padded to 128 bytes,
        then a slot of BM x BN sums per slice. A tile's region sits at the same place whatever the
        grid, so that a counter the last launch left zeroed is never a slot of this one."""
        return 4 * blocks * self.region_floats

    @property
    def counter_floats(self) -> int:
        return WORKSPACE_COUNTER_FLOATS

    @property
    def region_floats(self) -> int:
        return WORKSPACE_COUNTER_FLOATS + self.split_k * self.BM * self.BN

    def describe(self) -> str:
        return (f"data-parallel: one block per C tile and K slice ({self.split_k}), the slices summed "
                "through a workspace by the last to finish")

    @property
    def abi_notes(self) -> list[str]:
        return [f"split K: {self.split_k} slices of K, each written to a workspace (kept per device and "
                "stream, grown as calls need), the last to finish adding them in K order: the same bits "
                "every run."]

    def work_rows(self, k_slices: str) -> list[tuple[str, str]]:
        return [("split K", f"{self.split_k} {k_slices} (blockIdx.y), each written to the tile's slot of a "
                 f"workspace ({self.region_floats * 4 // 1024} KiB per C tile); the last to finish adds "
                 "the slots in K order and stores C (no pass over C first, no atomics)")]


# The counter at the head of each C tile's region of a `split N workspace` workspace, padded so that
# the slots after it start 128-byte aligned.
WORKSPACE_COUNTER_FLOATS = 32


@dataclass(frozen=True)
class Persistent(Schedule):
    """No more blocks than SMs (clusters: whole clusters), each walking tiles in raster order."""

    name: ClassVar[str] = "persistent"
    scheduled: ClassVar[bool] = True
    helpers: ClassVar[tuple[str, ...]] = ("schedule.cuh.j2",)
    walk_template: ClassVar[str] = "wgmma_walk.cuh.j2"
    launch_template: ClassVar[str] = "launch_persistent.cuh.j2"
    c_dims: ClassVar[str] = "grid"

    def launch_blocks(self, M: int, N: int, K: int, sms: int, batch: int = 1) -> int:
        most = min(sms, self.max_scheduled_blocks)
        if self.cluster_blocks > 1:  # whole clusters, each walking cluster-sized groups of tiles (units)
            units = self.cluster_grid(M, N) // self.cluster_blocks * batch
            return min(units, max(1, most // self.cluster_blocks)) * self.cluster_blocks
        return min(self.grid(M, N) * batch, most)

    @property
    def c_grid(self) -> tuple[str, ...]:
        most = f"const int most = sms < {self.max_scheduled_blocks} ? sms : {self.max_scheduled_blocks};"
        if self.cluster_blocks > 1:
            return ("// Whole clusters, no more blocks than SMs: each cluster walks cluster tiles, its blocks together.",
                    most,
                    "const long long clusters = blocks / CLUSTER_BLOCKS, fit = most / CLUSTER_BLOCKS > 0 ? most / CLUSTER_BLOCKS : 1;",
                    "const unsigned grid = (unsigned)((clusters < fit ? clusters : fit) * CLUSTER_BLOCKS);")
        return most, "const unsigned grid = (unsigned)(blocks < most ? blocks : most);"

    def describe(self) -> str:
        if self.cluster_blocks > 1:
            return (f"persistent clusters: min(cluster tiles, SMs / {self.cluster_blocks}) clusters of "
                    f"{self.cluster_m} x {self.cluster_n} blocks, cluster c multiplying cluster tiles c, c + clusters, "
                    "... in raster order, its blocks together; the producers run on into the next tile while "
                    "the consumers store the last")
        return ("persistent: min(C tiles, SMs) blocks, block b multiplying tiles b, b + grid, ... in raster "
                "order; the producer runs on into the next tile while the consumers store the last")


@dataclass(frozen=True)
class PingPong(Persistent):
    """schedule pingpong: the persistent walk, its tiles taken by the two consumer warpgroups in turn,
    so that one's epilogue overlaps the other's MMAs (block M = one consumer's tile: one or two
    64-row slabs)."""

    name: ClassVar[str] = "pingpong"
    pingpong: ClassVar[bool] = True

    def describe(self) -> str:
        if self.cluster_blocks > 1:
            return (f"pingpong clusters: min(cluster tiles, SMs / {self.cluster_blocks}) clusters of "
                    f"{self.cluster_m} x {self.cluster_n} blocks, cluster c walking cluster tiles c, c + clusters, "
                    "... in raster order, its blocks together, each block's two consumer warpgroups taking its "
                    "tiles in turn, so that one stores its tile while the other multiplies the next")
        return ("pingpong: min(C tiles, SMs) blocks, block b walking tiles b, b + grid, ... in raster order, "
                "its two consumer warpgroups taking them in turn, so that one stores its tile while the "
                "other multiplies the next")


@dataclass(frozen=True)
class StreamK(Persistent):
    """The K tiles of the last partial wave and one whole wave before it dealt evenly over the
    blocks; the last block to write its piece of a shared tile adds all the pieces in K order."""

    name: ClassVar[str] = "stream-k"
    helpers: ClassVar[tuple[str, ...]] = ("schedule.cuh.j2", "stream_k.cuh.j2")
    parameters: ClassVar[tuple[Parameter, ...]] = (Parameter("workspace", "p"),)
    launch_template: ClassVar[str] = "launch_stream_k.cuh.j2"
    c_grid: ClassVar[tuple[str, ...]] = ("const long long k_steps = blocks * ((K + BK - 1) / BK);",
                                         "const int most = sms < MAX_BLOCKS ? sms : MAX_BLOCKS;",
                                         "const unsigned grid = (unsigned)(k_steps < most ? k_steps : most);")
    c_grid_note: ClassVar[str] = " (nor than K tiles in all)"

    def launch_blocks(self, M: int, N: int, K: int, sms: int, batch: int = 1) -> int:
        most = min(sms, self.max_scheduled_blocks)
        return min(most, self.grid(M, N) * batch * max(1, ceil(K / self.BK)))

    def workspace_bytes(self, blocks: int) -> int:
        """A counter per shared tile (up to 2 x max_scheduled_blocks) and consumer warp, then two
        slots of BM x BN partial sums per block (the pieces it begins and ends with)."""
        return 4 * (2 * self.max_scheduled_blocks * self.consumers * 4 + 2 * blocks * self.BM * self.BN)

    def describe(self) -> str:
        return ("stream-k: min(SMs, K tiles in all) blocks; whole waves of C tiles stay whole, the last partial "
                "wave and one before it are dealt out by K tile; the last block to write its piece of a "
                "shared tile adds all the pieces in K order (workspace, no waiting: the same bits every run)")


SCHEDULES = {cls.name: cls for cls in (Schedule, Persistent, StreamK, PingPong)}


def schedule_of(spec: Spec, BM: int, BN: int, BK: int, consumers: int = 0) -> Schedule:
    """The schedule a (checked) spec asks for, dealing BM x BN tiles of BK-deep K tiles."""
    split_k = spec["split"]
    split = {"cluster": ClusterSplitK, "workspace": WorkspaceSplitK}.get(spec["split.by"], SplitK)
    cls = split if split_k > 1 else SCHEDULES[spec["schedule"]]
    return cls(BM=BM, BN=BN, BK=BK, raster_group=spec["raster.group"], cluster_m=spec["cluster.m"],
               cluster_n=spec["cluster.n"], consumers=consumers, split_k=split_k)


# --- the rules, each raised at its setting --------------------------------------------------------

def check_one_block_per_tile(spec: Spec) -> None:
    """Kernels without a TMA producer (the tiled ones) take one block per C tile, unclustered."""
    if spec["schedule"] != "data-parallel":
        raise spec.error("schedule", f"schedule {spec['schedule']} is built for the TMA-fed wgmma "
                         "kernels (target sm_90a, math tf32 or 3xtf32, stages N tma); this kernel takes "
                         "one block per C tile", "schedule data-parallel, or no schedule line")
    if spec["cluster.m"] * spec["cluster.n"] > 1:
        raise spec.error(("cluster.m", "cluster.n"), "thread-block clusters share tiles by TMA multicast, "
                         "on the TMA-fed wgmma kernels (target sm_90a, math tf32 or 3xtf32, stages N "
                         "tma); this kernel's blocks load their own tiles", "cluster 1 x 1, or no cluster line")


# A cluster of split K's slices: at most the 8 blocks every sm_90 GPU schedules as one cluster.
MAX_CLUSTER_SLICES = 8


def check_split_by(spec: Spec, tma: bool) -> None:
    """`split N cluster`: the TMA-fed wgmma kernel's blocks of one C tile form a cluster of at most 8;
    `split N workspace`: the TMA-fed wgmma kernel's slices meet in a workspace."""
    split_k = spec["split"]
    if spec["split.by"] == "workspace":
        if split_k == 1:
            raise spec.error("split.by", "split 1 workspace has no slices to sum", "split N workspace with N from 2")
        if not tma:
            raise spec.error("split.by", "split K through a workspace is built for the TMA-fed wgmma kernel "
                             "(target sm_90a, math tf32 or 3xtf32, stages N tma); this kernel's slices add "
                             "into C after a pass over C", f"split {split_k} (atomic)")
        return
    if spec["split.by"] != "cluster":
        return
    if split_k == 1:
        raise spec.error("split.by", "split 1 cluster has no slices to sum", "split N cluster with N from 2 to 8")
    if not tma:
        raise spec.error("split.by", "split K in a cluster has block 0 store C and tells the other slices' "
                         "blocks through cluster barriers, in the TMA-fed wgmma kernel (target sm_90a, math "
                         "tf32 or 3xtf32, stages N tma); this kernel's slices add into C after a pass over C",
                         f"split {split_k} (atomic)")
    if split_k > MAX_CLUSTER_SLICES:
        raise spec.error("split", f"split {split_k} cluster asks a cluster of {split_k} blocks; every "
                         f"sm_90 GPU schedules clusters of up to {MAX_CLUSTER_SLICES}",
                         f"split 2 to {MAX_CLUSTER_SLICES} cluster, or split {split_k} atomic")


def check_split_cuts_shared_tiles(spec: Spec, uses_shared: bool) -> None:
    if spec["split"] > 1 and not uses_shared:
        raise spec.error("split", "split K cuts the K loop of shared-memory tiles, which 'shared off' "
                         "turns off", "split 1, or shared memory on")


def check_pingpong_tile(spec: Spec, BM: int) -> None:
    """Ping-pong's consumers each take whole tiles of one or two 64-row slabs."""
    if spec["schedule"] == "pingpong" and BM not in (64, 128):
        raise spec.error(("block.m", "schedule"), f"schedule pingpong gives each of its two consumer "
                         f"warpgroups whole tiles of one or two 64-row slabs; block M = {BM} is the tile of one",
                         "block 64 x N x 32 or 128 x N x 32 with schedule pingpong")


def check_walk(spec: Spec, tma: bool, math: str) -> None:
    """A tile scheduler needs the TMA producer that runs ahead into the next tile, and divides the
    work itself (no split K); ping-pong's producer feeds TF32 tiles only."""
    schedule, split_k = spec["schedule"], spec["split"]
    if schedule == "data-parallel":
        return
    if not tma:
        raise spec.error("schedule", f"schedule {schedule} is built for the TMA-fed wgmma kernel, "
                         "whose producer warpgroup runs ahead into the next tile",
                         "stages N tma, or schedule data-parallel")
    if split_k > 1:
        raise spec.error(("schedule", "split"), f"schedule {schedule} and split {split_k} both divide "
                         "the work among blocks; stream-k already splits K where tiles run short",
                         "split 1 with a schedule, or schedule data-parallel with split")
    if schedule == "pingpong" and math != "tf32":
        raise spec.error(("schedule", "math"), "schedule pingpong is built for math tf32: 3xtf32's "
                         "producer writes B's remainders for the two consumers of one tile",
                         "math tf32 with schedule pingpong, or schedule persistent")


def check_cluster(spec: Spec, tma: bool, BM: int, BN: int) -> None:
    """Clusters: the cluster_m x cluster_n blocks of a cluster take neighbouring C tiles; those in
    one row of the cluster share A's tile, those in one column B's. Each loads a slice of each
    shared tile and multicasts it to the others (templates/wgmma_kernel.cu.j2)."""
    cluster_m, cluster_n = spec["cluster.m"], spec["cluster.n"]
    if cluster_m * cluster_n == 1:
        return
    cluster = ("cluster.m", "cluster.n")
    if not tma:
        raise spec.error(cluster, "the blocks of a cluster share tiles by TMA multicast; this kernel's "
                         "loader warpgroups read their tiles through registers", "stages N tma")
    if spec["schedule"] == "stream-k":
        raise spec.error(cluster + ("schedule",), "schedule stream-k deals K tiles to single blocks; a "
                         "cluster's blocks must take neighbouring tiles together, whole",
                         "cluster with schedule data-parallel or persistent, or no cluster line")
    if spec["split"] > 1:
        raise spec.error(cluster + ("split",), "split K's blocks add into C with atomics; clusters are "
                         "built for one block per C tile (split N cluster makes clusters of its own, of "
                         "a tile's K slices)", "split 1 with a cluster")
    if cluster_m * cluster_n > 8:
        raise spec.error(cluster, f"a cluster of {cluster_m} x {cluster_n} = {cluster_m * cluster_n} "
                         "blocks is more than the 8 every sm_90 GPU can schedule",
                         "cluster M x N with M x N at most 8")
    for blocks, rows, operand, along in ((cluster_m, BN, "B", "M"), (cluster_n, BM, "A", "N")):
        if rows % (8 * blocks):
            raise spec.error(cluster, f"the {blocks} blocks along {along} each load {rows}/{blocks} "
                             f"rows of the {operand} tile they share; the 128-byte swizzle needs "
                             "whole groups of 8 rows", f"a cluster that divides {operand}'s {rows} "
                             "rows into multiples of 8")
