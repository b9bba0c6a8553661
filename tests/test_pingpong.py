"""`schedule pingpong` on the TMA tf32 kernel: the persistent walk with the block's tiles taken by
its two consumer warpgroups in turn (each a whole 64-row tile), so that one's epilogue overlaps the
other's MMAs. The spec line and its errors at the line, the Plan, and the generated hand-over: a
consumer waits for its tile's stages only after the other has waited for all of the tile before
(named barriers), and frees a stage alone. GPU results: tests/test_gpu_schedule.py."""

from __future__ import annotations

import pytest

from conftest import SPECS_DIR
from gemmgen.codegen.cuda import generate
from gemmgen.language.errors import SpecError
from gemmgen.plan import make_plan
from gemmgen.plan.space import expand
from gemmgen.language.load import load_one, parse

KERNEL = """kernel k {{
  target   sm_90a
  layout   A row, B col, C row
  block    {bm} x {bn} x 32
  math     {math}
  stages   4 tma
  schedule pingpong{extra}
}}
"""


def spec_of(bm=64, bn=256, math="tf32", extra=""):
    (spec,) = parse(KERNEL.format(bm=bm, bn=bn, math=math, extra=extra))
    return spec


def error_of(**settings) -> str:
    with pytest.raises(SpecError) as error:
        make_plan(spec_of(**settings))
    return str(error.value)


def test_two_consumers_each_on_a_64_row_tile():
    plan = make_plan(spec_of())
    assert plan.pingpong and plan.consumers == 2 and plan.BM == 64 and plan.threads == 384
    assert plan.launch_blocks(4096, 4096, 512, 132) == 132 and plan.launch_blocks(128, 512, 512, 132) == 4


def test_a_block_of_three_slabs_is_an_error_at_the_block():
    text = error_of(bm=192)
    assert "<spec>:4:12" in text and "whole tiles of one or two 64-row slabs" in text


def test_a_consumer_of_two_slabs_multiplies_both_per_k_step():
    plan = make_plan(spec_of(bm=128, bn=128))
    assert plan.RM == 2 and plan.SUB_M == 64 and plan.consumers == 2 and plan.accumulators == 128
    source = generate(plan)
    consumers = _consumers(source)
    assert "wgmma_tf32<0>(acc, smem_descriptor(a_tile + kk), smem_descriptor(b_tile + kk));" in consumers
    assert "wgmma_tf32<1>(acc, smem_descriptor(a_tile + 64 * BK + kk), smem_descriptor(b_tile + kk));" in consumers
    assert "for (int i = 0; i < RM * TM; ++i)" in consumers
    assert "constexpr int M_STEP = 8, SUB_M = 64, SUB_N = 8;  // RM slabs of 64 rows" in source
    assert '"+f"(acc[SLAB * TM + 1][0])' in source


def test_two_slabs_of_256_columns_are_too_many_registers():
    assert "a consumer thread would hold about 304 registers (256 accumulators)" in error_of(bm=128, bn=256)


def test_a_consumer_of_two_slabs_stores_each_through_its_warps_boxes():
    plan = make_plan(spec_of(bm=128, bn=128, extra="\n  epilogue alpha beta staged"))
    assert plan.tma_store and plan.RM == 2 and plan.c_buffers == 2
    assert plan.smem_bytes == 4 * (4 * 32 * 256) + 2 * 4 * 2 * 16 * 32 * 4 + 2 * 8 * 4 + 1024  # 4 stages + boxes
    epilogue = generate(plan).split("epilogue through shared memory and TMA", 1)[1]
    assert "for (int rm = 0; rm < RM; ++rm) {  // the consumer's slabs, one after the other" in epilogue
    assert "const int warp_m0 = rm * SUB_M + warp_in_group * 16;" in epilogue
    assert "alpha * acc[rm * TM + i][a + v]" in epilogue
    assert "tma_store(&map_c, box, block_n0 + box_n * C_BOX_N, block_m0 + warp_m0);" in epilogue


def test_3xtf32_is_an_error_at_the_schedule():
    text = error_of(math="3xtf32", bn=128)
    assert "<spec>:7:12" in text and "schedule pingpong is built for math tf32" in text


def test_clusters_walk_cluster_tiles():
    plan = make_plan(spec_of(extra="\n  cluster  2 x 1"))
    assert plan.pingpong and plan.cluster_blocks == 2
    assert plan.scheduler.describe().startswith("pingpong clusters: min(cluster tiles, SMs / 2) clusters of 2 x 1 blocks")
    assert plan.launch_blocks(4096, 4096, 512, 132) == 132 and plan.launch_blocks(100, 300, 64, 132) == 4


def _consumers(source: str) -> str:
    start = source.index("// Ping-pong: the block's tiles go to the consumers in turn")
    return source[start:source.index("#endif", start)]


@pytest.mark.parametrize("extra", ["", "\n  epilogue alpha beta staged"])
def test_the_consumers_take_turns(extra):
    source = generate(make_plan(spec_of(extra=extra)))
    consumers = _consumers(source)
    assert "if (turn % CONSUMERS != consumer) {  // the other consumer's tile\n            it += k_tiles;" in consumers
    assert "if (turn > 0) turn_wait(1 + consumer);" in consumers
    assert "if (turn + 1 < block_tiles) turn_give(2 - consumer);" in consumers
    # the hand-over comes after the tile's last stage is waited for, before its MMAs are waited for
    assert consumers.index("barrier_wait(&ready[s]") < consumers.index("turn_give") < consumers.index("wgmma_wait<0>();")
    assert "const float* a_tile = sA + s * A_STAGE_FLOATS;" in consumers  # the stage is this tile's
    assert "consumer * 64" not in consumers  # rows count within the consumer's own tile
    assert "barrier_init(&empty[s], 4);" in source  # one consumer frees a stage


def test_the_register_fed_fallback_is_the_plain_kernel():
    source = generate(make_plan(spec_of()))
    fallback = source[:source.index("// Ping-pong")]
    assert "turn_wait" not in fallback.split("setmaxnreg.inc", 1)[1].split("#endif", 1)[0]


def test_explain_describes_the_turns():
    plan = make_plan(spec_of())
    assert plan.scheduler.describe().startswith("pingpong: min(C tiles, SMs) blocks")
    assert plan.mainloop.tiling_words(plan) == "block 64x256x32, 2 consumers in turn, 4 TMA stages"


@pytest.mark.parametrize("bm, bn, extra", [(64, 128, ""), (64, 256, "\n  epilogue alpha beta staged"), (128, 128, ""),
                                           (128, 128, "\n  epilogue alpha beta staged"),
                                           (128, 128, "\n  cluster 1 x 2"), (64, 256, "\n  cluster 2 x 1\n  epilogue alpha beta staged")])
def test_the_pingpong_kernels_compile_into_registers(bm, bn, extra):
    """NVRTC builds them for sm_90a, every accumulator in registers (a slab picked through a
    run-time index would put acc in local memory)."""
    pytest.importorskip("cuda.bindings")
    from gemmgen.gpu.compile import compile_plan
    compiled = compile_plan(make_plan(spec_of(bm=bm, bn=bn, extra=extra)), use_cache=False)
    assert ".local" not in compiled.ptx
    assert all(r.spill_stores == 0 for r in compiled.resources.values())


def test_the_pingpong_search_space_drops_what_does_not_fit():
    """specs/hopper_pingpong_search.gemm: 64 x 256 tiles fit 5 stages only without staged C and
    6 not at all; everything at 64 x 128 fits; two slabs (128 rows) take 128 columns (256 would need
    too many registers), with C from registers or staged; each fits with or without a 2 x 1 cluster."""
    space = expand(load_one(SPECS_DIR / "hopper_pingpong_search.gemm"))
    assert (space.total, space.valid) == (48, 30)
    mixes = {(p.BM, p.BN, p.stages, p.tma_store) for p in space.plans}
    assert (64, 128, 6, True) in mixes and (64, 256, 5, False) in mixes and (128, 128, 6, False) in mixes
    assert (128, 128, 6, True) in mixes
    assert (64, 256, 6, False) not in mixes and (64, 256, 5, True) not in mixes
    assert not any(p.BM == 128 and p.BN == 256 for p in space.plans)
    assert {p.cluster_m for p in space.plans} == {1, 2}
    assert all(p.pingpong for p in space.plans)
