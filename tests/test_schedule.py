"""`schedule persistent | stream-k`: the spec line and its errors, the tile scheduler's dealing of
work (the real template, compiled by the host compiler and walked for every block), the workspace
arithmetic, and the kernels compiling without spills."""

from __future__ import annotations

from pathlib import Path

import pytest
from host_program import run_on_host

from gemmgen.codegen.cuda import _environment, generate
from gemmgen.language.errors import SpecError
from gemmgen.plan import make_plan
from gemmgen.plan.schedule import deal
from gemmgen.language.load import parse

KERNEL = """kernel k {{
  target   sm_90a
  layout   A row, B col, C row
  block    128 x {bn} x 32
  math     {math}
  stages   {stages} {fill}
  schedule {schedule}{extra}
}}
"""


def spec_of(schedule="stream-k", math="tf32", bn=256, stages=4, fill="tma", extra=""):
    (spec,) = parse(KERNEL.format(schedule=schedule, math=math, bn=bn, stages=stages, fill=fill, extra=extra))
    return spec


# --- the spec line ------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["data-parallel", "persistent", "stream-k"])
def test_schedule_is_a_setting_and_a_search_set(schedule):
    assert make_plan(spec_of(schedule)).schedule == schedule
    (space,) = parse(KERNEL.format(schedule="{persistent, stream-k}", math="tf32", bn=256, stages=4,
                                   fill="tma", extra=""))
    assert [p["schedule"] for p in space.points()] == ["persistent", "stream-k"]


def test_an_unknown_schedule_is_an_error_at_its_word():
    with pytest.raises(SpecError) as error:
        spec_of("streamk")
    text = str(error.value)
    assert "<spec>:7:12" in text and "'streamk' is not a valid value for schedule" in text
    assert "data-parallel, persistent, stream-k" in text


def test_a_schedule_needs_the_tma_kernel():
    with pytest.raises(SpecError) as error:
        make_plan(spec_of("persistent", fill="async", bn=128))
    assert "<spec>:7:12" in str(error.value) and "TMA-fed wgmma kernel" in str(error.value)
    (simt,) = parse("kernel s {\n  block 64 x 64 x 8\n  thread 4 x 4\n  schedule stream-k\n}\n")
    with pytest.raises(SpecError) as error:
        make_plan(simt)
    assert "<spec>:4:12" in str(error.value) and "one block per C tile" in str(error.value)


def test_a_schedule_and_split_k_do_not_mix():
    with pytest.raises(SpecError) as error:
        make_plan(spec_of("stream-k", extra="\n  split 4"))
    assert "both divide the work among blocks" in str(error.value)


def test_the_fallback_of_a_scheduled_kernel_takes_a_block_per_tile():
    plan = make_plan(spec_of("stream-k"))
    assert plan.fallback.schedule == "data-parallel" and plan.fallback.path == "wgmma_async"


def test_blocks_and_workspace_the_launcher_asks_for():
    plan = make_plan(spec_of("stream-k"))             # 128 x 256 tiles, BK 32
    assert plan.launch_blocks(4096, 4096, 4096, 132) == 132
    assert plan.launch_blocks(128, 256, 64, 132) == 2    # one tile of two K tiles: two blocks
    assert plan.workspace_bytes(132) == 4 * (2048 * 8 + 2 * 132 * 128 * 256)  # counters, two slots a block
    persistent = make_plan(spec_of("persistent"))
    assert persistent.launch_blocks(1024, 1024, 1024, 132) == 32 and persistent.workspace_bytes(32) == 0
    assert make_plan(spec_of("data-parallel")).launch_blocks(8192, 8192, 64, 132) == 64 * 32


# --- the tile scheduler, walked on the host ---------------------------------------------------------

def _walk_program(plan) -> str:
    """schedule.cuh.j2 as generated, with gridDim and blockIdx made host variables."""
    scheduler = _environment().get_template("schedule.cuh.j2").render(plan=plan)
    return f"""#include <stdio.h>
#include <algorithm>
using std::min; using std::max;
#define __device__
struct Dim {{ unsigned x; }};
static Dim gridDim, blockIdx;
constexpr int BM = {plan.BM}, BN = {plan.BN}, BK = {plan.BK};
{scheduler}
int main() {{
    int M, N, K, blocks, batch;
    while (scanf("%d %d %d %d %d", &M, &N, &K, &blocks, &batch) == 5) {{
        gridDim.x = blocks;
        for (unsigned b = 0; b < (unsigned)blocks; ++b) {{
            blockIdx.x = b;
            Schedule schedule(M, N, K, batch);
            for (Segment s; schedule.next(s);) {{
                int last = -1;
                int first = -1;
{"                if (s.k_begin > 0 || s.k_end < schedule.k_tiles) { first = schedule.first_block_of(s.tile); last = schedule.last_block_of(s.tile); }" if plan.schedule == "stream-k" else ""}
                printf("%u %d %d %d %d %d\\n", b, s.tile, s.k_begin, s.k_end, first, last);
            }}
        }}
        printf("end\\n");
    }}
}}
"""


def walk(plan, problems, tmp_path: Path, batch: int = 1) -> list[list[tuple[int, int, int, int, int, int]]]:
    """Every block's segments per problem, for `batch` products of M x N x K (tiles of every batch)."""
    feed = "\n".join(f"{M} {N} {K} {plan.launch_blocks(M, N, K, sms, batch)} {batch}" for M, N, K, sms in problems)
    runs, _ = run_on_host(_walk_program(plan), feed, tmp_path / f"walk_{plan.schedule.replace('-', '_')}")
    return runs


PROBLEMS = [(4096, 4096, 4096, 132),   # 512 tiles: 3 whole waves and 116 over
            (4092, 4092, 4092, 132),
            (4096, 4096, 512, 132),
            (8192, 128, 8192, 132),    # 64 tiles, fewer than SMs
            (1024, 1024, 1024, 132),
            (1536, 2816, 1000, 132),   # 12 x 11 = 132 tiles: whole waves, no stream-K
            (128, 256, 64, 132),       # one tile of two K tiles
            (1, 1, 1, 132),
            (127, 4099, 1023, 114),    # another GPU's SM count
            (5003, 5003, 5003, 78)]


@pytest.mark.parametrize("schedule", ["persistent", "stream-k"])
def test_every_k_tile_of_every_tile_is_dealt_exactly_once(schedule, tmp_path):
    plan = make_plan(spec_of(schedule))
    for (M, N, K, sms), segments in zip(PROBLEMS, walk(plan, PROBLEMS, tmp_path)):
        tiles = -(-M // plan.BM) * -(-N // plan.BN)
        k_tiles = -(-K // plan.BK)
        covered = {}
        for block, tile, k_begin, k_end, _, _ in segments:
            assert 0 <= tile < tiles and 0 <= k_begin < k_end <= k_tiles
            for k in range(k_begin, k_end):
                assert (tile, k) not in covered, f"{M}x{N}x{K}: tile {tile} K tile {k} dealt twice"
                covered[tile, k] = block
        assert len(covered) == tiles * k_tiles, f"{M}x{N}x{K}: {tiles * k_tiles - len(covered)} K tiles not dealt"
        if schedule == "persistent":
            assert all(k_begin == 0 and k_end == k_tiles for _, _, k_begin, k_end, _, _ in segments)
        # explain's and the models' account of the dealing (plan/schedule.py) is the C scheduler's
        dealing = deal(plan, M, N, K, sms)
        blocks = plan.launch_blocks(M, N, K, sms)
        work = [sum(e - b for blk, _, b, e, _, _ in segments if blk == x) for x in range(blocks)]
        pieces = {}
        for block, tile, _, _, _, _ in segments:
            pieces.setdefault(tile, set()).add(block)
        assert (dealing.blocks, dealing.tiles, dealing.k_tiles) == (blocks, tiles, k_tiles)
        assert (dealing.most_k_tiles, dealing.least_k_tiles) == (max(work), min(work)), f"{M}x{N}x{K}"
        assert dealing.most_pieces == max(len(b) for b in pieces.values()), f"{M}x{N}x{K}"


@pytest.mark.parametrize("schedule", ["persistent", "stream-k"])
def test_a_batched_walk_deals_every_k_tile_of_every_batchs_tiles_once(schedule, tmp_path):
    """Strided batches: the scheduler walks the tiles of every batch (batch b's numbered after batch
    b - 1's), so stream-K deals its last wave over K tiles whichever batch they belong to."""
    plan = make_plan(spec_of(schedule))
    batch = 5
    problems = [(1024, 1024, 1024, 132), (128, 256, 64, 132), (300, 200, 1000, 7), (1, 1, 1, 132)]
    for (M, N, K, sms), segments in zip(problems, walk(plan, problems, tmp_path, batch)):
        tiles = -(-M // plan.BM) * -(-N // plan.BN) * batch
        k_tiles = -(-K // plan.BK)
        covered = set()
        for block, tile, k_begin, k_end, _, _ in segments:
            assert 0 <= tile < tiles and 0 <= k_begin < k_end <= k_tiles
            for k in range(k_begin, k_end):
                assert (tile, k) not in covered, f"{M}x{N}x{K} x {batch}: tile {tile} K tile {k} dealt twice"
                covered.add((tile, k))
        assert len(covered) == tiles * k_tiles, f"{M}x{N}x{K} x {batch}: K tiles not dealt"
        blocks = plan.launch_blocks(M, N, K, sms, batch)
        assert blocks == min(sms, tiles * (k_tiles if schedule == "stream-k" else 1))
        assert all(tile < 2 * blocks for _, tile, k_begin, k_end, _, _ in segments
                   if k_begin > 0 or k_end < k_tiles)  # stream-K's counters stay inside the workspace's


def test_stream_k_pieces_are_counted_and_summed_in_order(tmp_path):
    """The pieces of a shared tile are held by consecutive blocks, which all agree on the first and
    the last; the first piece is the last piece of its block and every other piece the first piece
    of its block, so a block writes at most one piece that starts a tile and one that does not (its
    two workspace slots), and the sum in block order is the sum in K order."""
    plan = make_plan(spec_of("stream-k"))
    for (M, N, K, sms), segments in zip(PROBLEMS, walk(plan, PROBLEMS, tmp_path)):
        k_tiles = -(-K // plan.BK)
        by_block = {}  # each block's shared pieces, in its order (whole tiles, dealt or not, left out)
        for segment in segments:
            if not (segment[2] == 0 and segment[3] == k_tiles):
                by_block.setdefault(segment[0], []).append(segment)
        pieces = {}
        for block, tile, k_begin, k_end, first, last in segments:
            if k_begin == 0 and k_end == k_tiles:
                continue
            pieces.setdefault(tile, []).append((block, k_begin, k_end, first, last))
            if k_begin == 0:
                assert by_block[block][-1][1] == tile, f"{M}x{N}x{K}: block {block} starts tile {tile} early"
            else:
                assert by_block[block][0][1] == tile, f"{M}x{N}x{K}: block {block} ends tile {tile} late"
        for tile, held in pieces.items():
            held.sort(key=lambda p: p[1])  # along K
            blocks = [p[0] for p in held]
            assert blocks == list(range(blocks[0], blocks[-1] + 1)), f"{M}x{N}x{K}: tile {tile}"
            assert all((p[3], p[4]) == (blocks[0], blocks[-1]) for p in held), f"{M}x{N}x{K}: tile {tile}"
            assert held[0][1] == 0 and held[-1][2] == k_tiles
            assert all(a[2] == b[1] for a, b in zip(held, held[1:])), f"{M}x{N}x{K}: tile {tile} has a gap"
            assert tile < 2 * plan.launch_blocks(M, N, K, sms)  # its counter lies inside the workspace's
        tiles = -(-M // plan.BM) * -(-N // plan.BN)
        if tiles >= sms:  # whole waves plus stream-K over one more: no tile in more than 3 pieces
            assert all(len(p) <= 3 for p in pieces.values()), f"{M}x{N}x{K}"
        blocks = plan.launch_blocks(M, N, K, sms)
        work = [sum(e - b for blk, _, b, e, _, _ in segments if blk == x) for x in range(blocks)]
        if tiles % sms == 0:
            assert not pieces
        elif tiles < sms:  # every block gets the same number of K tiles, give or take one
            assert max(work) - min(work) <= 1, f"{M}x{N}x{K}: {min(work)} to {max(work)} K tiles"


# --- the kernels ------------------------------------------------------------------------------------

@pytest.mark.parametrize("math", ["tf32", "3xtf32"])
@pytest.mark.parametrize("schedule", ["persistent", "stream-k"])
def test_scheduled_kernels_compile_without_spills(math, schedule):
    from gemmgen.gpu.compile import compile_plan
    plan = make_plan(spec_of(schedule, math=math, bn=256 if math == "tf32" else 128,
                             stages=4 if math == "tf32" else 3))
    compiled = compile_plan(plan)
    assert not any(r.spills for r in compiled.resources.values()), compiled.resources
    source = generate(plan)
    assert "Schedule schedule(M, N, K, batch);" in source
    assert ("publish_piece(acc, workspace" in source) == (schedule == "stream-k")
    assert ("stream_workspace(stream, device" in source) == (schedule == "stream-k")


def test_data_parallel_kernels_hold_no_scheduler():
    source = generate(make_plan(spec_of("data-parallel")))
    assert "Schedule" not in source and "tile_of_block(M, N, block_m0, block_n0, batch_index);" in source


def test_explain_shows_how_the_work_is_dealt():
    from gemmgen.explain.report import as_dict, explain, render_text
    from gemmgen.gpu.compile import Resources
    plan = make_plan(spec_of("stream-k"))
    report = explain(plan, Resources(168, 0, 0, 0, 0))
    text = render_text(report)
    assert "schedule (dealt on 132 SMs, an H100)" in text and "the same bits every run" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("1024x1024x1024"))
    assert row.split() == ["1024x1024x1024", "132", "0", "32", "7-8", "6", "33.1", "MiB"]
    assert as_dict(report)["dealings"]["4096x4096x4096"]["whole_tiles"] == 264
    data_parallel = explain(make_plan(spec_of("data-parallel")), Resources(168, 0, 0, 0, 0))
    assert "schedule (dealt" not in render_text(data_parallel)


def test_a_scheduled_point_is_written_and_described_with_its_schedule():
    from gemmgen.plan.space import describe, point_key, to_text
    spec = spec_of("stream-k")
    assert describe(spec).endswith("schedule=stream-k") and "schedule" not in describe(spec_of("data-parallel"))
    (again,) = parse(to_text(spec, "again"))
    assert again["schedule"] == "stream-k" and make_plan(again).schedule == "stream-k"
    assert point_key(spec) != point_key(spec_of("persistent"))


def test_the_runtime_keeps_a_workspace_per_stream_grows_it_and_keeps_sixteen(monkeypatch):
    """Kernel._workspace as the C launcher's stream_workspace: one per stream, reused, grown (the
    stream waited for, the old one freed), zeroed when allocated, the least recently used of more
    than sixteen streams freed after the context is waited for."""
    import gemmgen.gpu.runtime as runtime

    class Driver:
        class CUresult:
            CUDA_SUCCESS = 0

        def __init__(self):
            self.calls, self.next, self.live = [], 0x1000, {}

        def cuMemAlloc(self, size):
            self.next += 1 << 28
            self.live[self.next] = size
            self.calls.append(("alloc", size))
            return 0, self.next

        def cuMemFree(self, address):
            self.calls.append(("free", self.live.pop(address)))
            return 0

        def cuMemsetD8Async(self, address, value, size, stream):
            assert value == 0 and self.live[address] == size
            self.calls.append(("zero", stream))
            return 0

        def cuStreamSynchronize(self, stream):
            self.calls.append(("sync stream", stream))
            return 0

        def cuCtxSynchronize(self):
            self.calls.append(("sync context",))
            return 0

        def cuStreamIsCapturing(self, stream):
            return 0, 0  # CU_STREAM_CAPTURE_STATUS_NONE

    driver = Driver()
    monkeypatch.setattr(runtime, "_driver", lambda: driver)
    kernel = runtime.Kernel.__new__(runtime.Kernel)
    a = kernel._workspace(7, 1000)
    assert kernel._workspace(7, 1200) == a and driver.calls == [("alloc", 1250), ("zero", 7)]  # 1000 + 25%
    b = kernel._workspace(7, 4000)
    assert b != a and driver.calls[2:] == [("sync stream", 7), ("free", 1250), ("alloc", 5000), ("zero", 7)]
    for stream in range(100, 115):  # 15 more streams: 16 in all
        kernel._workspace(stream, 100)
    kernel._workspace(7, 10)  # stream 7 used again: now the most recent
    driver.calls.clear()
    kernel._workspace(200, 100)  # a 17th: stream 100's goes, not 7's
    assert driver.calls == [("sync context",), ("free", 125), ("alloc", 125), ("zero", 200)]
    assert len(kernel._workspaces) == 16 and 7 in kernel._workspaces and 100 not in kernel._workspaces


def test_a_workspace_first_needed_inside_a_graph_capture_is_made_outside_it(monkeypatch):
    """In a CUDA graph capture (PyTorch's: global mode, where allocating is refused) the workspace
    is allocated in relaxed mode and zeroed on a private stream that is waited for, never on the
    capturing stream (a capture would only record the zeroing); nothing waits for the capturing
    stream, and a workspace outgrown there is freed at close(), not while the graph may use it."""
    import gemmgen.gpu.runtime as runtime
    from cuda.bindings import driver as real

    class Driver:
        CUstreamCaptureMode = real.CUstreamCaptureMode
        CUstream_flags = real.CUstream_flags

        class CUresult:
            CUDA_SUCCESS = 0

        def __init__(self):
            self.calls, self.mode, self.next = [], "global", 0x1000

        def cuStreamIsCapturing(self, stream):
            return 0, 1 if stream == 7 else 0  # CU_STREAM_CAPTURE_STATUS_ACTIVE on stream 7

        def cuThreadExchangeStreamCaptureMode(self, mode):
            previous, self.mode = self.mode, "relaxed" if mode == real.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED else mode
            self.calls.append(("mode", self.mode))
            return 0, previous

        def cuMemAlloc(self, size):
            assert self.mode == "relaxed", "allocated while the capture forbids it"
            self.next += 1 << 28
            self.calls.append(("alloc", size))
            return 0, self.next

        def cuStreamCreate(self, flags):
            assert flags == real.CUstream_flags.CU_STREAM_NON_BLOCKING.value
            return 0, 99

        def cuMemsetD8Async(self, address, value, size, stream):
            assert stream == 99, "zeroed on the capturing stream"
            self.calls.append(("zero", stream))
            return 0

        def cuStreamSynchronize(self, stream):
            assert stream == 99, "waited for the capturing stream"
            self.calls.append(("sync", stream))
            return 0

        def cuStreamDestroy(self, stream):
            return 0

        def cuMemFree(self, address):
            raise AssertionError("freed a workspace during the capture")

    driver = Driver()
    monkeypatch.setattr(runtime, "_driver", lambda: driver)
    kernel = runtime.Kernel.__new__(runtime.Kernel)
    first = kernel._workspace(7, 1000)
    assert driver.calls == [("mode", "relaxed"), ("alloc", 1250), ("zero", 99), ("sync", 99), ("mode", "global")]
    grown = kernel._workspace(7, 4000)
    assert grown != first and kernel._retired == [first]
