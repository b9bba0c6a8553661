"""`promote K` on the 3xtf32 TMA kernels: the tensor cores sum K / BK tiles' products before the
consumers add that sum into FP32 registers. The spec line and its errors at the line, the Plan,
the generated group loop (one drain per group, each tile's buffer freed once its MMAs are done),
and that ptxas keeps the MMAs in flight (no waits of its own). GPU numerics and speed:
tests/test_gpu_schedule.py and BENCHMARKS.md."""

from __future__ import annotations

import re

import pytest

from conftest import SPECS_DIR
from gemmgen.codegen.cuda import generate
from gemmgen.language.errors import SpecError
from gemmgen.plan import make_plan
from gemmgen.plan.space import describe, expand, to_text
from gemmgen.language.load import load_one, parse

KERNEL = """kernel k {{
  target   {target}
  layout   A row, B col, C row
  block    128 x 128 x 32
  math     {math}
  stages   4 {fill}
  promote  {promote}{extra}
}}
"""


def spec_of(promote="64", math="3xtf32", fill="tma", target="sm_90a", extra=""):
    (spec,) = parse(KERNEL.format(promote=promote, math=math, fill=fill, target=target, extra=extra))
    return spec


def error_of(**settings) -> str:
    with pytest.raises(SpecError) as error:
        make_plan(spec_of(**settings))
    return str(error.value)


def test_promote_counts_k_tiles_and_is_a_search_set():
    assert make_plan(spec_of("64")).promote_tiles == 2
    assert make_plan(spec_of("256")).promote_tiles == 8
    assert make_plan(spec_of("32")).promote_tiles == 1
    (space,) = parse(KERNEL.format(promote="{0, 64}", math="3xtf32", fill="tma", target="sm_90a", extra=""))
    assert [make_plan(p).promote_tiles for p in space.points()] == [1, 2]
    assert "promote=64" in describe(spec_of("64")) and "  promote  64\n" in to_text(spec_of("64"))
    assert "promote" not in to_text(spec_of("0"))


@pytest.mark.parametrize("promote, message", [
    ("48", "promote 48 is not 1, 2, 4 or 8 K tiles of 32 floats"),
    ("96", "promote 96 is not 1, 2, 4 or 8 K tiles of 32 floats"),
])
def test_promote_must_be_whole_tiles_in_twos(promote, message):
    text = error_of(promote=promote)
    assert "<spec>:7:12" in text and message in text and "promote 32, 64, 128 or 256" in text


def test_tf32_and_the_register_fed_kernel_and_mma_sync_have_no_promote():
    assert "<spec>:7:12" in (text := error_of(math="tf32")) and "math tf32 sums in the tensor cores" in text
    assert "<spec>:7:12" in (text := error_of(fill="async")) and "adds the sums every K tile" in text
    text = error_of(target="sm_90", extra="\n  warp     64 x 64\n  mma      16 x 8 x 8")
    assert "<spec>:7:12" in text and "this kernel has no wgmma" in text


def test_an_unknown_promote_value_is_an_error_at_the_value():
    with pytest.raises(SpecError) as error:
        make_plan(spec_of("2048"))
    assert "<spec>:7:12" in str(error.value) and "a multiple of the K tile up to 1024" in str(error.value)


def _consumer_loop(source: str) -> str:
    start = source.index("if (k_tiles > 0) read_a(0, a_big_even, a_small_even);")
    return source[start:source.index("// This thread's C values", start)]


@pytest.mark.parametrize("promote, tiles", [("64", 2), ("128", 4)])
def test_a_group_drains_the_pipe_once(promote, tiles):
    source = generate(make_plan(spec_of(promote)))
    assert f"constexpr int PROMOTE_TILES = {tiles};" in source
    loop = _consumer_loop(source)
    assert "for (int t = 0; t < k_tiles; t += PROMOTE_TILES)" in loop
    assert loop.count("wgmma_wait<0>();") == 1  # the group's end
    assert loop.count("wgmma_wait<1>();") == tiles - 1  # each later tile frees the one before
    frees = re.findall(r"barrier_arrive\(&empty\[(.*?)\]\)", loop)
    assert frees == ["t % STAGES"] + [f"(t + {i}) % STAGES" for i in range(1, tiles - 1)]
    assert "add_product(min(t + PROMOTE_TILES, k_tiles) - 1);" in loop  # which frees the last tile
    assert "multiply(t, a_big_even, a_small_even, false);" in loop  # a group's first MMA zeroes the sum


def test_one_tile_per_group_is_the_kernel_as_before():
    source = generate(make_plan(spec_of("0")))
    body = lambda text: text[text.index("namespace gemmgen_k_impl"):]  # noqa: E731 (the header quotes the spec)
    assert "PROMOTE_TILES" not in source and body(source) == body(generate(make_plan(spec_of("32"))))
    assert _consumer_loop(source).count("wgmma_wait<0>();") == 2  # each of the two unrolled tiles


def test_a_persistent_kernel_frees_stages_counted_over_its_segments():
    loop = _consumer_loop(generate(make_plan(spec_of("64", extra="\n  schedule persistent"))))
    assert "barrier_arrive(&empty[(it + t) % STAGES])" in loop


def test_explain_says_how_long_the_tensor_cores_sum():
    from gemmgen.explain.report import explain
    from gemmgen.gpu.compile import Resources
    resources = Resources(registers=168, spill_stores=0, spill_loads=0, stack_frame=0, shared_static=0)
    (note,) = [n for n in explain(make_plan(spec_of("64")), resources).notes if "promote" in n]
    assert note.startswith("The tensor cores sum 2 K tiles (64 of K) of products before the consumers add")
    assert not [n for n in explain(make_plan(spec_of("0")), resources).notes if "promote" in n]


@pytest.mark.parametrize("promote, extra", [("64", ""), ("128", ""), ("64", "\n  schedule persistent"),
                                            ("64", "\n  schedule stream-k")])
def test_ptxas_keeps_the_groups_mmas_in_flight(promote, extra):
    """ptxas waits for in-flight MMAs itself (C7517) where a path may reach a use of their
    accumulators; a group loop that left MMAs in flight across its back edge got such a wait."""
    pytest.importorskip("cuda.bindings")
    from gemmgen.gpu.compile import compile_plan
    compiled = compile_plan(make_plan(spec_of(promote, extra=extra)), use_cache=False)
    assert "C7517" not in compiled.log and "C7514" not in compiled.log, compiled.log[-2000:]


def test_the_3xtf32_search_space_holds_promote_stages_and_schedules():
    """specs/hopper_3xtf32_search.gemm: every mix buildable, the measured best among them."""
    space = expand(load_one(SPECS_DIR / "hopper_3xtf32_search.gemm"))
    assert space.total == space.valid == 12
    mixes = {(p.stages, p.schedule, p.promote_tiles) for p in space.plans}
    assert (4, "persistent", 2) in mixes and len(mixes) == 12
