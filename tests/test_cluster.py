"""`cluster M x N` on the TMA-fed wgmma kernels: the spec line and its errors at the line, the
Plan's launch arithmetic, the generated kernel (multicast, cluster barriers, whole clusters in the
launcher), and the tile each block takes (the real generated function, compiled by the host
compiler and walked for every block)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from host_program import run_on_host

from gemmgen.codegen.cuda import generate
from gemmgen.tuning.costmodel import features
from gemmgen.language.errors import SpecError
from gemmgen.plan import make_plan
from gemmgen.plan.space import describe, to_text
from gemmgen.language.load import parse
from gemmgen.gpu.verify import Case

KERNEL = """kernel k {{
  target   sm_90a
  layout   A row, B col, C row
  block    {bm} x {bn} x 32
  math     {math}
  stages   {stages} {fill}
  raster   group {group}
  cluster  {cluster}{extra}
}}
"""


def spec_of(cluster="2 x 1", math="tf32", bm=128, bn=256, stages=4, fill="tma", group=8, extra=""):
    (spec,) = parse(KERNEL.format(cluster=cluster, math=math, bm=bm, bn=bn, stages=stages, fill=fill,
                                  group=group, extra=extra))
    return spec


# --- the spec line and its errors -----------------------------------------------------------------

def test_cluster_is_a_setting_and_a_search_set():
    plan = make_plan(spec_of("2 x 1"))
    assert (plan.cluster_m, plan.cluster_n, plan.cluster_blocks) == (2, 1, 2)
    (space,) = parse(KERNEL.format(cluster="{1, 2} x {1, 2}", math="tf32", bm=128, bn=256, stages=4,
                                   fill="tma", group=8, extra=""))
    assert [(p["cluster.m"], p["cluster.n"]) for p in space.points()] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert "cluster=2x1" in describe(spec_of("2 x 1"))
    assert "  cluster  2 x 1\n" in to_text(spec_of("2 x 1"))
    assert "cluster" not in to_text(spec_of("1 x 1"))


def test_a_cluster_size_that_is_no_power_of_two_is_an_error_at_its_number():
    with pytest.raises(SpecError) as error:
        spec_of("3 x 1")
    text = str(error.value)
    assert "<spec>:8:12" in text and "3 is not a valid value for cluster.m" in text
    assert "1, 2, 4 or 8" in text


@pytest.mark.parametrize("cluster, extra, fill, bn, message", [
    ("4 x 4", "", "tma", 256, "more than the 8 every sm_90 GPU can schedule"),
    ("2 x 1", "\n  schedule stream-k", "tma", 256, "deals K tiles to single blocks"),
    ("2 x 1", "\n  split 4", "tma", 256, "clusters are built for one block per C tile"),
    ("2 x 1", "", "async", 128, "this kernel's loader warpgroups read their tiles through registers"),
    ("8 x 1", "", "tma", 32, "each load 32/8 rows of the B tile they share"),
])
def test_what_a_cluster_cannot_do_is_an_error_at_the_cluster_line(cluster, extra, fill, bn, message):
    with pytest.raises(SpecError) as error:
        make_plan(spec_of(cluster, extra=extra, fill=fill, bn=bn))
    assert "<spec>:8:12" in str(error.value) and message in str(error.value), str(error.value)


def test_simt_and_mma_sync_kernels_take_no_cluster():
    (simt,) = parse("kernel s {\n  block 64 x 64 x 8\n  thread 4 x 4\n  cluster 2 x 1\n}\n")
    with pytest.raises(SpecError) as error:
        make_plan(simt)
    assert "<spec>:4:11" in str(error.value) and "this kernel's blocks load their own tiles" in str(error.value)


def test_the_fallback_has_no_cluster():
    plan = make_plan(spec_of("2 x 2"))
    assert plan.fallback.cluster_blocks == 1 and plan.fallback.path == "wgmma_async"


# --- what the launcher starts -------------------------------------------------------------------

def test_a_launch_takes_whole_clusters():
    plan = make_plan(spec_of("2 x 1"))                     # 128 x 256 tiles
    assert plan.cluster_grid(4096, 4096) == 512 == plan.grid(4096, 4096)
    assert plan.cluster_grid(100, 300) == 4                # 1 x 2 tiles -> one cluster row of two
    assert plan.launch_blocks(64, 64, 131072, 132) == 2
    wide = make_plan(spec_of("2 x 2"))
    assert wide.cluster_grid(129, 257) == 4 and wide.cluster_grid(1, 1) == 4
    assert (wide.cluster_row_mask, wide.cluster_column_mask) == (0b0101, 0b0011)
    four = make_plan(spec_of("1 x 4", bn=128))
    assert (four.cluster_row_mask, four.cluster_column_mask) == (0b1111, 0b0001)


def test_the_cost_model_charges_blocks_past_the_edge():
    alone = make_plan(spec_of("1 x 1"))
    paired = make_plan(spec_of("2 x 1"))
    shape = Case(128 * 3, 256 * 4, 4096)                   # 3 tile rows: the pairs take 4
    mine, theirs = features(paired, shape, 132).as_dict(), features(alone, shape, 132).as_dict()
    assert mine["log tile efficiency"] < theirs["log tile efficiency"] == 0.0
    # and counts the L2 reads a block saves: each loads half of B's tile
    assert mine["log global flop per byte"] > theirs["log global flop per byte"]


def test_explain_says_what_the_blocks_share():
    words = make_plan(spec_of("2 x 1")).scheduler.cluster_words()
    assert "the 2 blocks along M share B's 256 x 32 tile, each loading 128 rows" in words
    assert "32768 bytes of each K tile from L2 instead of 49152" in words
    assert make_plan(spec_of("1 x 1")).scheduler.cluster_words() == ""


# --- the generated kernel -----------------------------------------------------------------------

@pytest.mark.parametrize("math, bn, stages", [("tf32", 256, 4), ("3xtf32", 128, 3)])
def test_the_kernel_multicasts_and_frees_stages_in_every_sharer(math, bn, stages):
    source = generate(make_plan(spec_of("2 x 2", math=math, bn=bn, stages=stages)))
    assert "\n__cluster_dims__(CLUSTER_BLOCKS, 1, 1)\n" in source
    assert "constexpr int CLUSTER_M = 2, CLUSTER_N = 2" in source
    assert source.count("tma_load_multicast(s") == 2                # A's slice and B's
    assert "barrier_init(&empty[s], CONSUMERS * 4 * SHARERS)" in source
    assert "cluster_sync();" in source
    assert "barrier_arrive_in(&empty[" in source
    assert "const cuuint32_t box_rows[2] = {A_SLICE_ROWS, B_SLICE_ROWS};" in source
    # The producer stays until every sharer has freed each stage for the last time.
    assert "barrier_wait(&empty[t % STAGES], (t / STAGES) & 1);" in source


def test_a_kernel_without_cluster_is_unchanged():
    source = generate(make_plan(spec_of("1 x 1")))
    assert "cluster_dims" not in source and "multicast" not in source and "CLUSTER" not in source


def test_one_by_two_loads_b_whole_and_multicasts_a():
    source = generate(make_plan(spec_of("1 x 2")))
    assert "tma_load_multicast(sA" in source and "tma_load(sB + s * B_STAGE_FLOATS, &map_b" in source


# --- which tile each block takes, walked on the host ---------------------------------------------

def _tile_function(plan) -> str:
    source = generate(plan)
    main = source[source.index(f"namespace {plan.launcher_name}_impl"):]
    match = re.search(r"__device__ __forceinline__ void tile_of_block\(.*?\n}\n", main, re.S)
    return match.group(0)


def walk_tiles(plan, problems, tmp_path: Path):
    program = f"""#include <stdio.h>
#include <algorithm>
using std::min;
#define __device__
#define __forceinline__ inline
struct Dim {{ unsigned x; }};
static Dim blockIdx;
constexpr int BM = {plan.BM}, BN = {plan.BN};
constexpr int CLUSTER_M = {plan.cluster_m}, CLUSTER_N = {plan.cluster_n}, CLUSTER_BLOCKS = CLUSTER_M * CLUSTER_N;
constexpr int RASTER_GROUP = {plan.raster_group};
{_tile_function(plan)}
int main() {{
    int M, N, blocks;
    while (scanf("%d %d %d", &M, &N, &blocks) == 3) {{
        for (unsigned b = 0; b < (unsigned)blocks; ++b) {{
            int m0, n0, batch;
            blockIdx.x = b;
            tile_of_block(M, N, m0, n0, batch);
            printf("%u %d %d %d\\n", b, m0, n0, batch);
        }}
        printf("end\\n");
    }}
}}
"""
    feed = "\n".join(f"{M} {N} {plan.cluster_grid(M, N) * batch}" for M, N, batch in problems)
    runs, _ = run_on_host(program, feed, tmp_path / "tiles")
    return runs


@pytest.mark.parametrize("cluster, bn, group", [("2 x 1", 256, 8), ("1 x 2", 256, 8), ("2 x 2", 128, 1),
                                                ("4 x 2", 128, 8), ("1 x 8", 64, 4)])
def test_every_tile_is_taken_once_and_sharers_share_their_tiles(cluster, bn, group, tmp_path):
    plan = make_plan(spec_of(cluster, bn=bn, group=group))
    # (M, N, batch): a batched launch numbers the tiles of batch b after those of batch b - 1
    problems = [(4096, 4096, 1), (4092, 4092, 1), (100, 300, 1), (1, 1, 1), (8192, 128, 1), (5003, 777, 1),
                (3 * 128 + 1, 5 * bn, 1), (100, 300, 5), (1, 1, 3), (3 * 128 + 1, 5 * bn, 2), (1000, 999, 4)]
    for (M, N, batch), rows in zip(problems, walk_tiles(plan, problems, tmp_path)):
        inside = [(k, m0, n0) for _, m0, n0, k in rows if m0 < M and n0 < N]
        every = {(k, m * plan.BM, n * plan.BN) for m in range(-(-M // plan.BM)) for n in range(-(-N // plan.BN))
                 for k in range(batch)}
        assert sorted(inside) == sorted(every), f"{cluster} at {M}x{N}x{batch}: a C tile missed or taken twice"
        assert len(set((k, m0, n0) for _, m0, n0, k in rows)) == len(rows), "two blocks take one tile"
        for start in range(0, len(rows), plan.cluster_blocks):
            cluster_rows = rows[start:start + plan.cluster_blocks]
            assert len({k for *_, k in cluster_rows}) == 1, "a cluster's blocks multiply one batch"
            for rank, (_, m0, n0, _) in enumerate(cluster_rows):
                rank_m, rank_n = rank % plan.cluster_m, rank // plan.cluster_m
                first_m0 = cluster_rows[rank_m][1]                     # rank (rank_m, 0)
                first_n0 = cluster_rows[rank_n * plan.cluster_m][2]    # rank (0, rank_n)
                assert m0 == first_m0, "blocks sharing A's tile must take the same rows of C"
                assert n0 == first_n0, "blocks sharing B's tile must take the same columns of C"
                assert m0 == cluster_rows[0][1] + rank_m * plan.BM and n0 == cluster_rows[0][2] + rank_n * plan.BN


def test_a_cluster_kernel_compiles_in_a_multi_architecture_build(tmp_path):
    """A library's .cu is built for sm_80 and sm_90a at once; __cluster_dims__ only exists on the latter."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    source = tmp_path / "clustered.cu"
    source.write_text(generate(make_plan(spec_of("2 x 1"))))
    done = subprocess.run([nvcc, "-c", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
                           "-gencode=arch=compute_80,code=sm_80", "-o", str(tmp_path / "clustered.o"), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


# --- persistent clusters: whole clusters walk cluster tiles ---------------------------------------

def test_a_persistent_cluster_launch_takes_whole_clusters_up_to_the_sms():
    plan = make_plan(spec_of("2 x 1", extra="\n  schedule persistent"))
    assert plan.launch_blocks(4096, 4096, 4096, 132) == 132          # 256 cluster tiles, 66 clusters
    assert plan.launch_blocks(100, 300, 64, 132) == 4                # two cluster tiles along N
    assert make_plan(spec_of("4 x 2", bn=128, extra="\n  schedule persistent")).launch_blocks(8192, 8192, 64, 132) == 128
    from gemmgen.plan.schedule import deal
    dealing = deal(plan, 4096, 4096, 4096, 132)
    assert dealing.blocks == 132 and dealing.most_k_tiles == 4 * 128   # 256 units over 66 clusters
    source = generate(plan)
    assert "next_tile = blockIdx.x / CLUSTER_BLOCKS;" in source and "next_tile += gridDim.x / CLUSTER_BLOCKS;" in source
    assert "barrier_arrive_in(&empty[(it + k_tiles - 1) % STAGES], sharers);  // the segment's last buffer" in source
    assert source.count("tma_load_multicast(sB") == 1 and "for (int t = it > STAGES ? it - STAGES : 0; t < it; ++t)" in source
    grid = source.index("const unsigned grid = (unsigned)((clusters < fit ? clusters : fit) * CLUSTER_BLOCKS);")
    # ... and launches the kernel on that grid (a launcher that computed it and returned ran nothing)
    assert source.index("kernel<<<grid, THREADS, SMEM_BYTES, stream>>>", grid) < source.index("return (int)cudaGetLastError();", grid)


def walk_schedule(plan, problems, sms, tmp_path: Path):
    """The generated Schedule and tile_origin, compiled for the host: every block's tiles, in order,
    per problem, and the ping-pong consumers' count of them ({(problem, block): count})."""
    source = generate(plan)
    main = source[source.index(f"namespace {plan.launcher_name}_impl"):]
    origin = re.search(r"__device__ __forceinline__ void tile_origin\(.*?\n}\n", main, re.S).group(0)
    schedule = re.search(r"struct Segment \{.*?\nstruct Schedule \{.*?\n};\n", main, re.S).group(0)
    # ping-pong: the consumers' count of the block's tiles (the turn that ends the hand-overs)
    counted = re.search(r"\n( *const int clusters = .*?\n)?( *const int block_tiles = .*?;)\n", main)
    count = "".join(line or "" for line in counted.groups()) if counted else "const int block_tiles = -1;"
    program = f"""#include <stdio.h>
#include <algorithm>
using std::min; using std::max;
#define __device__
#define __forceinline__ inline
struct Dim {{ unsigned x; }};
static Dim blockIdx, gridDim;
constexpr int BM = {plan.BM}, BN = {plan.BN}, BK = {plan.BK};
constexpr int CLUSTER_M = {plan.cluster_m}, CLUSTER_N = {plan.cluster_n}, CLUSTER_BLOCKS = CLUSTER_M * CLUSTER_N;
constexpr int RASTER_GROUP = {plan.raster_group};
{origin}
{schedule}
int main() {{
    int M, N, K, blocks, batch;
    while (scanf("%d %d %d %d %d", &M, &N, &K, &blocks, &batch) == 5) {{
        gridDim.x = blocks;
        for (unsigned b = 0; b < (unsigned)blocks; ++b) {{
            blockIdx.x = b;
            Schedule schedule(M, N, K, batch);
            {count}
            printf("tiles %u %d\\n", b, block_tiles);
            for (Segment segment; schedule.next(segment);) {{
                int m0, n0, batch_index;
                tile_origin(segment.tile, M, N, m0, n0, batch_index);
                printf("%u %d %d %d %d %d %d\\n", b, segment.tile, m0, n0, segment.k_begin, segment.k_end, batch_index);
            }}
        }}
        printf("end\\n");
    }}
}}
"""
    feed = "\n".join(f"{M} {N} {K} {plan.launch_blocks(M, N, K, sms, batch)} {batch}" for M, N, K, batch in problems)
    return run_on_host(program, feed, tmp_path / "schedule")


@pytest.mark.parametrize("cluster, bn, group", [("2 x 1", 256, 8), ("1 x 2", 256, 1), ("2 x 2", 128, 8),
                                                ("4 x 2", 128, 4)])
def test_persistent_clusters_take_every_tile_once_together(cluster, bn, group, tmp_path):
    plan = make_plan(spec_of(cluster, bn=bn, group=group, extra="\n  schedule persistent"))
    problems = [(4096, 4096, 512, 1), (4092, 4092, 64, 1), (100, 300, 64, 1), (1, 1, 1, 1), (8192, 128, 64, 1),
                (5003, 777, 64, 1), (3 * 128 + 1, 5 * bn, 64, 1), (100, 300, 64, 7), (1000, 1000, 64, 3)]
    runs, _ = walk_schedule(plan, problems, 132, tmp_path)
    for (M, N, K, batch), rows in zip(problems, runs):
        blocks = plan.launch_blocks(M, N, K, 132, batch)
        assert blocks % plan.cluster_blocks == 0
        inside = [(k, m0, n0) for _, _, m0, n0, _, _, k in rows if m0 < M and n0 < N]
        every = {(k, m * plan.BM, n * plan.BN) for m in range(-(-M // plan.BM)) for n in range(-(-N // plan.BN))
                 for k in range(batch)}
        assert sorted(inside) == sorted(every), f"{cluster} at {M}x{N}x{batch}: a C tile missed or taken twice"
        walks = {b: [r for r in rows if r[0] == b] for b in range(blocks)}
        for first in range(0, blocks, plan.cluster_blocks):
            members = [walks[first + rank] for rank in range(plan.cluster_blocks)]
            # the blocks of a cluster walk the same cluster tiles, whole, in the same order
            units = [[(r[1], r[4], r[5], r[6]) for r in walk] for walk in members]
            assert all(u == units[0] for u in units), "a cluster's blocks walk different tiles"
            assert all(r[4] == 0 and r[5] == -(-K // plan.BK) for r in members[0])
            for step in range(len(members[0])):
                m0s = [walk[step][2] for walk in members]
                n0s = [walk[step][3] for walk in members]
                for rank in range(plan.cluster_blocks):
                    rank_m, rank_n = rank % plan.cluster_m, rank // plan.cluster_m
                    assert m0s[rank] == m0s[rank_m] and n0s[rank] == n0s[rank_n * plan.cluster_m]
                    assert (m0s[rank], n0s[rank]) == (m0s[0] + rank_m * plan.BM, n0s[0] + rank_n * plan.BN)


@pytest.mark.parametrize("cluster, bm, bn", [("1 x 2", 128, 128), ("2 x 1", 128, 128), ("2 x 1", 64, 128),
                                             ("2 x 2", 64, 256)])
def test_pingpong_clusters_take_every_tile_once_together_and_count_their_turns(cluster, bm, bn, tmp_path):
    """schedule pingpong in clusters: the blocks of a cluster walk the same cluster tiles, and each
    block's consumers count its tiles right (the last hand-over is skipped, none is left waiting)."""
    plan = make_plan(spec_of(cluster, bm=bm, bn=bn, stages=4, extra="\n  schedule pingpong"))
    assert plan.pingpong and plan.cluster_blocks == 2 * (cluster == "2 x 2") + 2
    problems = [(4096, 4096, 512, 1), (4092, 4092, 64, 1), (100, 300, 64, 1), (1, 1, 1, 1), (8192, 128, 64, 1),
                (5003, 777, 64, 1), (3 * 128 + 1, 5 * bn, 64, 1), (100, 300, 64, 9), (1, 1, 1, 4)]
    runs, counts = walk_schedule(plan, problems, 132, tmp_path)
    for index, ((M, N, K, batch), rows) in enumerate(zip(problems, runs)):
        blocks = plan.launch_blocks(M, N, K, 132, batch)
        assert blocks % plan.cluster_blocks == 0 and blocks <= 132
        inside = [(k, m0, n0) for _, _, m0, n0, _, _, k in rows if m0 < M and n0 < N]
        every = {(k, m * plan.BM, n * plan.BN) for m in range(-(-M // plan.BM)) for n in range(-(-N // plan.BN))
                 for k in range(batch)}
        assert sorted(inside) == sorted(every), f"{cluster} at {M}x{N}x{batch}: a C tile missed or taken twice"
        for block in range(blocks):
            walked = [r[1] for r in rows if r[0] == block]
            peer = [r[1] for r in rows if r[0] == block - block % plan.cluster_blocks]
            assert walked == peer, "a cluster's blocks walk different tiles"
            assert len(walked) == counts[index, block], f"block {block} at {M}x{N} counts its tiles wrong"
    source = generate(plan)
    assert "barrier_init(&empty[s], 4 * SHARERS);" in source  # one consumer frees a stage, in every sharer
    assert "pingpong clusters" in source


# --- split K in a cluster (`split N cluster`) -----------------------------------------------------

SPLIT_KERNEL = """kernel s {{
  target   {target}
  layout   A row, B col, C row
  block    64 x {bn} x 32
  math     tf32
  stages   {stages}
  split    {split}{extra}
}}
"""


def split_spec(split="4 cluster", target="sm_90a", bn=256, stages="5 tma", extra=""):
    (spec,) = parse(SPLIT_KERNEL.format(split=split, target=target, bn=bn, stages=stages, extra=extra))
    return spec


def test_split_cluster_stores_c_from_block_0_without_a_pass_over_c():
    plan = make_plan(split_spec())
    assert plan.split_k == 4 and plan.scheduler.in_cluster and not plan.epilogue.atomic
    source = generate(plan)
    assert "__cluster_dims__(1, SPLIT_K, 1)" in source and "constexpr int SPLIT_K = 4;" in source
    # the TMA kernel launches alone; only its register-fed fallback keeps atomic split K's pass
    assert "gemmgen_s_scale_c" not in source and "gemmgen_s_fallback_scale_c<<<" in source
    assert "barrier_wait_cluster(c_stored, 0);" in source and "add_pair(" in source
    assert "split=4-cluster" in describe(plan.spec) and "  split    4 cluster\n" in to_text(plan.spec)
    assert "  split    4\n" in to_text(split_spec("4"))
    # written without a word, split is atomic, and its spec is the same point as before the word existed
    assert not split_spec("4").written("split.by") and make_plan(split_spec("4")).epilogue.atomic


@pytest.mark.parametrize("split, target, stages, extra, where, message", [
    ("16 cluster", "sm_90a", "5 tma", "", "7:12", "clusters of up to 8"),
    ("1 cluster", "sm_90a", "5 tma", "", "7:14", "split 1 cluster has no slices to sum"),
    ("4 cluster", "sm_90a", "4 async", "", "7:14", "in the TMA-fed wgmma kernel"),
    ("4 cluster", "sm_90a", "5 tma", "\n  activation gelu", "8:14", "gelu of a partial sum is not gelu"),
    ("4 wide", "sm_90a", "5 tma", "", "7:14", "atomic, cluster or workspace"),
])
def test_what_split_cluster_cannot_do_is_an_error_at_its_line(split, target, stages, extra, where, message):
    with pytest.raises(SpecError) as error:
        make_plan(split_spec(split, target=target, stages=stages, extra=extra))
    assert f"<spec>:{where}" in str(error.value) and message in str(error.value), str(error.value)


def test_a_tiled_kernel_takes_no_split_cluster():
    (tiled,) = parse("kernel t {\n  target sm_80\n  block 64 x 64 x 8\n  thread 4 x 4\n  split 2 cluster\n}\n")
    with pytest.raises(SpecError) as error:
        make_plan(tiled)
    assert "<spec>:5:11" in str(error.value) and "in the TMA-fed wgmma kernel" in str(error.value), str(error.value)


# --- split K through a workspace (`split N workspace`) ---------------------------------------------

def test_split_workspace_sums_the_slices_in_its_last_block_without_a_pass_over_c():
    plan = make_plan(split_spec("4 workspace"))
    assert plan.split_k == 4 and plan.scheduler.split_by == "workspace" and not plan.epilogue.atomic
    source = generate(plan)
    assert "constexpr int SPLIT_K = 4;" in source and "__cluster_dims__" not in source
    # the TMA kernel launches alone, with its workspace; its register-fed fallback keeps atomic split K's pass
    assert "gemmgen_s_scale_c" not in source and "gemmgen_s_fallback_scale_c<<<" in source
    assert "if (!sum_slices(acc, workspace, tid - 128, last_slice)) return;" in source
    assert "stream_workspace(stream, device, 4 * (size_t)blocks * (size_t)REGION_FLOATS, &workspace)" in source
    assert "split=4-workspace" in describe(plan.spec) and "  split    4 workspace\n" in to_text(plan.spec)
    # a region per C tile: its counter (128 bytes), then a 64 x 256 slot per slice
    assert plan.scheduler.workspace_bytes(10) == 4 * 10 * (32 + 4 * 64 * 256)
    # the kernel takes the workspace after C's parameters, before the batches'
    assert [name for name, _ in plan.signature][-5:] == ["workspace", "batch", "strideA", "strideB", "strideC"]


def test_split_workspace_takes_an_activation_and_a_staged_store():
    """The last slice runs the whole epilogue on the whole sum: activations and staged stores are fine;
    the register-fed fallback (atomic split K) then runs unsplit."""
    plan = make_plan(split_spec("3 workspace", extra="\n  activation gelu\n  epilogue alpha beta staged"))
    assert plan.epilogue.tma_store and plan.epilogue.activation.name == "gelu" and plan.fallback.split_k == 1
    assert make_plan(split_spec("3 workspace")).fallback.split_k == 3


@pytest.mark.parametrize("split, stages, where, message", [
    ("1 workspace", "5 tma", "7:14", "split 1 workspace has no slices to sum"),
    ("4 workspace", "4 async", "7:14", "built for the TMA-fed wgmma kernel"),
])
def test_what_split_workspace_cannot_do_is_an_error_at_its_line(split, stages, where, message):
    with pytest.raises(SpecError) as error:
        make_plan(split_spec(split, stages=stages))
    assert f"<spec>:{where}" in str(error.value) and message in str(error.value), str(error.value)
