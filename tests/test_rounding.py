"""`round nearest [tma | producer | consumer] | truncate` on the TMA-fed tf32 kernel (issue 28): the
spec line and its errors at the line, the Plan, the generated code (TMA rounding as it copies into
tensor maps of type TFLOAT32, the default; producer warps rounding landed tiles in place behind a
`ready` barrier; consumers rounding A's fragments in registers), the explain rows, the copy kernel
that must say it truncates, a library refusing a truncating member, and NVRTC builds of each variant
on every schedule the tf32 library uses. GPU results: tests/test_gpu_rounding.py; timings:
benchmarks/tf32_rounding.py."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from conftest import SPECS_DIR
from gemmgen.codegen.cuda import generate
from gemmgen.language.errors import SpecError
from gemmgen.language.load import load_one, parse
from gemmgen.plan import make_plan

KERNEL = """kernel k {{
  target   sm_90a
  layout   A row, B col, C row
  block    {bm} x {bn} x 32
  math     {math}
  stages   4 {fill}
{extra}}}
"""

# The schedules of specs/tf32.gemm's members: (block M, block N, extra lines).
SCHEDULES = {
    "data-parallel": (128, 256, ""),
    "staged": (128, 256, "  epilogue alpha beta staged\n"),
    "split": (128, 128, "  raster row\n  split 4\n"),
    "persistent": (128, 256, "  schedule persistent\n"),
    "stream-k": (128, 256, "  schedule stream-k\n  epilogue alpha beta staged\n"),
    "cluster": (128, 256, "  cluster 2 x 2\n"),
    "pingpong": (64, 256, "  schedule pingpong\n"),
    "pingpong-two-slabs": (128, 128, "  schedule pingpong\n  epilogue alpha beta staged\n"),
}


def spec_of(round_line="round nearest", bm=128, bn=256, math="tf32", fill="tma", extra=""):
    lines = (f"  {round_line}\n" if round_line else "") + extra
    (spec,) = parse(KERNEL.format(bm=bm, bn=bn, math=math, fill=fill, extra=lines))
    return spec


def error_of(*args, **kwargs) -> SpecError:
    with pytest.raises(SpecError) as error:
        make_plan(spec_of(*args, **kwargs))
    return error.value


def position(error: SpecError) -> tuple[int, int]:
    return error.span.line, error.span.column


# --- the spec line ---------------------------------------------------------------------------

def test_no_round_line_and_round_nearest_alone_have_tma_round():
    for line in (None, "round nearest", "round nearest tma"):
        plan = make_plan(spec_of(line))
        assert plan.mainloop.rounding == "tma" and plan.mainloop.tma_rounds and not plan.truncates, line
    assert make_plan(spec_of("round nearest producer")).mainloop.rounding == "producer"
    assert make_plan(spec_of("round nearest consumer")).mainloop.rounding == "consumer"
    truncating = make_plan(spec_of("round truncate"))
    assert truncating.mainloop.rounding == "truncate" and truncating.truncates
    assert not make_plan(spec_of(None, math="3xtf32", bn=128)).truncates  # it splits the floats itself


def test_an_unknown_rounding_is_an_error_at_its_word():
    with pytest.raises(SpecError) as error:
        spec_of("round sideways")
    assert position(error.value) == (7, 9)
    assert "'sideways' is not a valid value for round" in str(error.value)
    assert "truncate or nearest" in str(error.value)
    with pytest.raises(SpecError) as error:
        spec_of("round nearest everyone")
    assert position(error.value) == (7, 17)
    assert "round.by" in str(error.value)


def test_truncate_takes_no_second_word():
    with pytest.raises(SpecError) as error:
        spec_of("round truncate consumer")
    assert position(error.value) == (7, 18)
    assert "'round truncate' takes no second word" in str(error.value)


def test_a_search_set_over_who_rounds_expands():
    spec = spec_of("round nearest {tma, producer, consumer}")
    assert [make_plan(point).mainloop.rounding for point in spec.points()] == ["tma", "producer", "consumer"]


@pytest.mark.parametrize("math, why", [("3xtf32", "splits each float"), ("simt", "math simt multiplies in FP32")])
def test_round_with_other_math_is_an_error_at_the_round_line(math, why):
    error = error_of("round nearest", math=math, bn=128)
    assert position(error) == (7, 9)
    assert why in str(error)


def test_round_truncate_on_the_register_fed_kernel_is_an_error():
    error = error_of("round truncate", bm=64, bn=128, fill="async")
    assert position(error) == (7, 9)
    assert "rounds each tile to TF32 in its loaders" in str(error)
    # round nearest says what that kernel does anyway: accepted, and its code is the plain kernel's
    rounded, plain = make_plan(spec_of("round nearest", bm=64, bn=128, fill="async")), \
        make_plan(spec_of(None, bm=64, bn=128, fill="async"))
    assert generate(rounded).split("derived by the Plan")[1] == generate(plain).split("derived by the Plan")[1]


def test_mma_sync_has_no_round_line():
    (spec,) = parse(KERNEL.format(bm=128, bn=128, math="tf32", fill="async",
                                  extra="  round nearest\n  warp 64 x 64\n  mma 16 x 8 x 8\n").replace("sm_90a", "sm_90"))
    with pytest.raises(SpecError) as error:
        make_plan(spec)
    assert position(error.value) == (7, 9)
    assert "mma.sync's fragments are rounded" in str(error.value)


def test_consumer_rounding_with_two_slab_pingpong_tiles_is_refused():
    bm, bn, extra = SCHEDULES["pingpong-two-slabs"]
    error = error_of("round nearest consumer", bm=bm, bn=bn, extra=extra)
    assert position(error) == (7, 9)
    assert "two slabs' fragments" in str(error)
    assert "round nearest (TMA rounds), or block 64 x N x 32" in str(error)


# --- the Plan and the generated code ---------------------------------------------------------

def test_tma_rounding_and_round_truncate_differ_only_in_the_maps_type():
    """The same kernel: TMA's rounding is the launcher's A and B tensor maps of type TFLOAT32."""
    plain, truncate = make_plan(spec_of(None)), make_plan(spec_of("round truncate"))
    body = lambda plan: tma_kernel(plan).split('extern "C"')[0]  # noqa: E731 (the kernel, not its launchers)
    assert body(plain) == body(truncate)
    assert "round_in_place" not in body(plain) and "ready = full;" in body(plain)
    rounding, truncating = generate(plain), generate(truncate)
    assert "encode(&maps[i], CU_TENSOR_MAP_DATA_TYPE_TFLOAT32, 3," in rounding
    assert "TMA rounds each float to nearest TF32 as it copies it" in rounding
    assert "TFLOAT32" not in truncating and "encode(&maps[i], CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3," in truncating
    # C's map (a staged store) stays FLOAT32; so do 3xtf32's A and B, which it splits itself
    staged = generate(make_plan(spec_of(None, extra="  epilogue alpha beta staged\n")))
    assert "encode(&map_c, CU_TENSOR_MAP_DATA_TYPE_FLOAT32," in staged and "DATA_TYPE_TFLOAT32, 3," in staged
    assert "TFLOAT32" not in generate(make_plan(spec_of(None, math="3xtf32", bn=128)))


def test_tma_rounds_a_column_major_a_too():
    """A column-major A lands MN-major and the consumers read it into registers: as TMA rounded it."""
    plan = make_plan(spec_of(None, extra="  epilogue alpha beta staged\n").with_values(layout_A="col"))
    maps = plan.mainloop.tensor_maps(plan, 512, 512, 256, 512, 256)
    assert [(m.operand, m.tf32) for m in maps] == [("A", True), ("B", True)]
    assert plan.mainloop.math_template == "wgmma_tf32_a.cuh.j2"
    assert "encode(&maps[i], CU_TENSOR_MAP_DATA_TYPE_TFLOAT32, 3," in generate(plan)
    assert any("as TMA rounded them" in note for note in plan.mainloop.notes(plan))


def test_a_copy_kernel_must_say_it_truncates():
    error = error_of(None, bm=128, bn=256, fill="copy")
    assert position(error) == (6, 14)  # the stages line's `copy`
    assert "stages N copy lands tiles as they lie, and wgmma truncates them to TF32" in str(error)
    assert "round truncate (to accept truncation)" in str(error)
    error = error_of("round nearest", bm=128, bn=256, fill="copy")
    assert position(error) == (7, 9)  # the round line
    plan = make_plan(spec_of("round truncate", fill="copy"))
    assert plan.truncates and not plan.tma


def tma_kernel(plan) -> str:
    """The TMA kernel's namespace of the generated file (the register-fed fallback comes first)."""
    code = generate(plan)
    return code[code.index(f"namespace {plan.launcher_name}_impl"):]


def test_producer_rounding_rounds_a_and_b_in_place_before_the_consumers_wait():
    plan = make_plan(spec_of("round nearest producer"))
    code = tma_kernel(plan)
    rounders = code[code.index("else if (tid >= 32)"):code.index("---- consumers")]
    assert rounders.index("barrier_wait(&full[s]") < rounders.index("round_in_place(sA + s * A_STAGE_FLOATS")
    assert rounders.index("round_in_place(sB + s * B_STAGE_FLOATS") < rounders.index("fence.proxy.async")
    assert rounders.index("fence.proxy.async") < rounders.index("barrier_arrive(&ready[s])")
    assert "unsigned long long* ready = full + STAGES;" in code
    assert "barrier_init(&ready[s], ROUNDERS);" in code
    assert 'cvt.rna.tf32.f32' in code
    consumers = code[code.index("---- consumers"):]
    assert "barrier_wait(&ready[s]" in consumers and "barrier_wait(&full[s]" not in consumers
    # three barriers a stage where there were two
    plain = make_plan(spec_of(None))
    assert plan.smem_bytes - plain.smem_bytes == 8 * plan.stages


def test_consumer_rounding_rounds_b_in_place_and_a_in_registers():
    plan = make_plan(spec_of("round nearest consumer"))
    code = tma_kernel(plan)
    rounders = code[code.index("else if (tid >= 32)"):code.index("---- consumers")]
    assert "round_in_place(sB + s * B_STAGE_FLOATS" in rounders and "sA" not in rounders
    consumers = code[code.index("---- consumers"):]
    assert "a[step][v] = to_tf32(a_stage[swizzled(row, k)]);" in consumers
    assert "wgmma_tf32(acc, a[step], smem_descriptor(b_tile + step * 8));" in consumers
    assert "const unsigned (&a)[4]" in code  # the wgmma overload with A from registers
    # A's next tile is read only once the MMAs of the tile that last used those registers are done
    loop = consumers[consumers.index("read_a(0, a_even)"):]
    assert loop.index("multiply(t, a_even)") < loop.index("wgmma_wait<1>()") < loop.index("read_a(t + 1, a_odd)")
    assert plan.registers_estimate == make_plan(spec_of(None)).registers_estimate + 32


def test_pingpong_consumer_rounding_reads_its_own_tile():
    bm, bn, extra = SCHEDULES["pingpong"]
    code = generate(make_plan(spec_of("round nearest consumer", bm=bm, bn=bn, extra=extra)))
    assert "const int a_row = warp_in_group * 16 + lane / 4;" in code
    code = generate(make_plan(spec_of("round nearest consumer")))
    assert "const int a_row = consumer * 64 + warp_in_group * 16 + lane / 4;" in code


def test_the_fallback_of_a_rounding_kernel_is_the_plain_register_fed_kernel():
    rounded, plain = make_plan(spec_of("round nearest consumer")), make_plan(spec_of(None))
    assert rounded.mainloop.fallback.mainloop == plain.mainloop.fallback.mainloop


def test_explain_rows_say_how_it_rounds_and_what_it_costs():
    producer = dict(make_plan(spec_of("round nearest producer")).rows())
    consumer = dict(make_plan(spec_of("round nearest consumer")).rows())
    assert producer["TF32 rounding"].startswith("to nearest (cvt.rna) by the producer's warps 1-3")
    # 128 x 256 x 32 tiles: TMA writes 384 x 32 floats, wgmma reads A once and B twice (two consumers)
    base = 4 * 32 * 384 + 4 * 32 * (128 + 2 * 256)
    assert f"{2 * 4 * 32 * 384} B, on TMA's writes and wgmma's reads of {base} B (+75%)" in producer["rounding traffic"]
    assert "A by the consumers" in consumer["TF32 rounding"]
    assert f"{2 * 4 * 32 * 256} B;" in consumer["rounding traffic"] and "(+50%)" in consumer["rounding traffic"]
    assert dict(make_plan(spec_of(None)).rows())["TF32 rounding"].startswith("to nearest, by TMA as it copies A and B")
    assert "TF32 rounding" not in dict(make_plan(spec_of("round truncate")).rows())
    truncating = make_plan(spec_of("round truncate"))
    assert any("truncates A and B to TF32" in note for note in truncating.mainloop.notes(truncating))


def test_explain_notes_say_how_it_rounds_and_what_it_costs():
    from gemmgen.explain.report import explain, render_text
    from gemmgen.gpu.compile import Resources
    resources = Resources(registers=168, spill_stores=0, spill_loads=0, stack_frame=0, shared_static=0)
    text = render_text(explain(make_plan(spec_of("round nearest consumer")), resources))
    assert "TF32 rounding: to nearest (cvt.rna): B by the producer's warps 1-3" in " ".join(text.split())
    assert "rounding traffic: per K tile B's tile read and written again: 65536 B;" in " ".join(text.split())
    text = render_text(explain(make_plan(spec_of("round truncate")), resources))
    assert "TF32 rounding: none (round truncate); wgmma truncates A and B to TF32" in " ".join(text.split())
    text = render_text(explain(make_plan(spec_of(None)), resources))
    assert "TF32 rounding: to nearest, by TMA as it copies A and B" in " ".join(text.split())


def test_the_shipped_rounding_specs_are_hopper_tf32_but_for_the_round_line():
    plain = load_one(SPECS_DIR / "hopper_tf32.gemm")
    for name, by in (("hopper_tf32_rounded", "producer"), ("hopper_tf32_rounded_a", "consumer")):
        spec = load_one(SPECS_DIR / "hopper_tf32_rounded.gemm", name)
        assert make_plan(spec).mainloop.rounding == by
        unrounded = {k: p.values for k, p in spec.params.items() if not k.startswith("round")}
        assert unrounded == {k: p.values for k, p in plain.params.items()}


def test_a_point_written_back_as_text_keeps_its_rounding_and_its_own_key():
    """Tuning records and library manifests keep points as text and keys: a point must come back
    rounding as it did, and the ways must not share a key. TMA's rounding (the default) keys as the
    truncating kernels did before it, whose timings it keeps (the same kernel but for its maps' type,
    measured as fast); `round truncate` has a key of its own."""
    from gemmgen.plan.space import describe, point_key, to_text
    lines = (None, "round nearest", "round truncate", "round nearest producer", "round nearest consumer")
    points = {line: spec_of(line) for line in lines}
    for line, spec in points.items():
        (again,) = parse(to_text(spec))
        assert make_plan(again).mainloop.rounding == make_plan(spec).mainloop.rounding, line
    keys = {line: point_key(spec) for line, spec in points.items()}
    assert keys[None] == keys["round nearest"]
    assert len(set(keys.values())) == 4
    assert "round=consumer" in describe(points["round nearest consumer"]) and "round" not in describe(points[None])
    assert "round=truncate" in describe(points["round truncate"])


# --- NVRTC: each variant on each schedule ----------------------------------------------------

CASES = [(by, schedule) for by in ("producer", "consumer") for schedule in SCHEDULES
         if (by, schedule) != ("consumer", "pingpong-two-slabs")]


@pytest.mark.parametrize("by, schedule", CASES)
def test_each_variant_compiles_on_each_schedule(by, schedule):
    """NVRTC builds it for sm_90a with every accumulator and A fragment in registers."""
    pytest.importorskip("cuda.bindings")
    from gemmgen.gpu.compile import compile_plan
    bm, bn, extra = SCHEDULES[schedule]
    spec = spec_of(f"round nearest {by}", bm=bm, bn=bn, extra=extra)
    name = re.sub(r"\W", "_", f"round_{by}_{schedule}")
    compiled = compile_plan(make_plan(replace(spec, name=name)))
    assert ".local" not in compiled.ptx
    assert compiled.resources and all(r.spill_stores == 0 for r in compiled.resources.values())
    assert "cvt.rna.tf32.f32" in compiled.ptx
