"""The decode kernel on the CPU (issue 28): its spec line and the errors at the line of every
setting it refuses, the Plan's launch (grid, orientation, the aligned variant's needs) and argument
checks, the generated source (every row count instantiated, the epilogue's beta rule, no C read
where beta is 0; under math tf32 / 3xtf32 the tensor path for 5 to 16 rows) and NVRTC compiles of
the libraries' decode search space without spills. The GPU tests are tests/test_gpu_decode.py."""

from __future__ import annotations

import re

import pytest

from conftest import SPECS_DIR
from gemmgen.codegen.cuda import generate
from gemmgen.gpu.compile import compile_plan
from gemmgen.gpu.launch import decide
from gemmgen.language.errors import SpecError
from gemmgen.language.load import load_one, parse
from gemmgen.plan import make_plan
from gemmgen.plan.parts.decode import Decode, DecodeSchedule

BASE = """kernel d {{
  target sm_90
  layout A row, B col, C row
  decode columns 4 warps 8 slices 2
{extra}}}
"""


def plan_of(extra: str = "", **values):
    (spec,) = parse(BASE.format(extra=extra))
    return make_plan(spec.with_values(**values) if values else spec)


def error_of(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        for spec in parse(text):
            make_plan(spec)
    return info.value


def test_the_decode_line_makes_a_decode_plan():
    plan = plan_of()
    assert isinstance(plan.mainloop, Decode) and isinstance(plan.scheduler, DecodeSchedule)
    m = plan.mainloop
    assert (m.columns, m.warps, m.slices, m.groups, m.block_columns) == (4, 8, 2, 4, 16)
    assert plan.threads == 256 and plan.path == "decode" and plan.math == "simt"
    assert m.unroll * m.columns == 8  # eight float4 loads in flight per lane
    assert m.part_floats == 1 * 4 * 16 * 4  # slice 1's sums of 16 rows x 4 columns, per group


def test_slices_default_to_one():
    text = BASE.format(extra="").replace(" slices 2", "")
    plan = make_plan(parse(text)[0])
    assert plan.mainloop.slices == 1 and plan.mainloop.block_columns == 32


# (what the spec adds or replaces, the error's words, the line and column it points at)
ERRORS = [
    (("decode columns 4 warps 8 slices 2", "decode columns 3 warps 8"), "3 is not a valid value for decode.columns", 4, 18),
    (("decode columns 4 warps 8 slices 2", "decode columns 4 warps 6 slices 4"), "do not divide the block's 6 warps", 4, 35),
    (("decode columns 4 warps 8 slices 2", "decode columns 4 warps 33"), "33 is not a valid value for decode.warps", 4, 26),
    (("  target sm_90\n", "  target sm_90\n  block 64 x 64 x 8\n"), "'block.m' does not apply to the decode kernel", 3, 9),
    (("decode columns 4 warps 8 slices 2", "decode columns 1 warps 8 slices 4\n  math tf32"),
     "math tf32 multiplies 16 columns of the big operand per mma.sync, but this block takes 2", 4, 18),
    (("decode columns 4 warps 8 slices 2", "decode columns 2 warps 4 slices 2\n  math 3xtf32"),
     "this block takes 4 (columns 2 x warps 4 / slices 2)", 4, 18),
    (("layout A row, B col", "layout A col, B col"), "reads A and B along K", 3, 12),
    (("  target sm_90\n", "  target sm_90\n  bias col\n"), "no fused epilogue", 3, 8),
    (("  target sm_90\n", "  target sm_90\n  activation gelu\n"), "no fused epilogue", 3, 14),
    (("  target sm_90\n", "  target sm_90\n  epilogue alpha beta staged\n"), "stores C straight from registers", 3, 23),
    (("  target sm_90\n", "  target sm_90\n  split 4\n"), "'split' does not apply", 3, 9),
    (("  target sm_90\n", "  target sm_90\n  reduce min 2\n"), "no fused reduction", 3, 14),
    (("  target sm_90\n", "  target sm_90\n  schedule stream-k\n"), "'schedule' does not apply", 3, 12),
]


@pytest.mark.parametrize("change,words,line,column", ERRORS)
def test_every_refused_setting_is_an_error_at_its_line(change, words, line, column):
    text = BASE.format(extra="").replace(*change)
    error = error_of(text)
    assert words in error.message, error.render()
    assert (error.line, error.column) == (line, column), error.render()
    assert "^" in error.render()


def test_a_setting_written_with_its_default_is_no_error():
    plan = plan_of("  bias none\n  epilogue alpha beta direct\n")
    assert plan.path == "decode"


def test_the_grid_takes_the_big_dimension_of_every_batch():
    plan = plan_of()  # 16 columns per block
    assert plan.scheduler.launch_grid(1, 4096, 4096, 132) == (256, 1)   # M small: N's columns
    assert plan.scheduler.launch_grid(4096, 16, 4096, 132) == (256, 1)  # N small: A's rows
    assert plan.scheduler.launch_grid(16, 17, 8, 132, batch=3) == (6, 1)
    assert plan.grid(0, 5) == 0
    assert plan.argument_error(5, 7, 9, 9, 9, 7) is None
    assert "ldb" in plan.argument_error(5, 7, 9, 9, 8, 7)  # B col: ldb >= K
    assert "lda" in plan.argument_error(5, 7, 9, 8, 9, 7)  # A row: lda >= K
    assert "ldc" in plan.argument_error(5, 7, 9, 9, 9, 6)  # C row: ldc >= N


def test_the_vector_path_needs_a_and_b_rows_aligned_and_nothing_of_c():
    plan = plan_of()
    assert plan.vector_requirements() == [("A", "K", "lda", 4), ("B", "K", "ldb", 4)]
    aligned = {"A": 0, "B": 0, "C": 4}  # C's address is never read as a vector
    assert plan.aligned(1, 7, 8, 8, 8, 7, aligned)
    assert not plan.aligned(1, 7, 9, 9, 9, 7, aligned)           # K odd
    assert not plan.aligned(1, 7, 8, 8, 8, 7, {**aligned, "B": 4})  # B one float off
    step = decide(plan, 1, 4096, 4096, 4096, 4096, 4096, (0, 0, 0), 132).steps
    assert [(s.kernel, s.aligned, s.grid, s.threads, s.smem) for s in step] == [("main", True, (256, 1), 256, 0)]


def test_the_source_instantiates_every_row_count_and_reads_c_only_where_beta_is_not_zero():
    source = generate(plan_of())
    for rows in (1, 2, 4):
        assert f"decode_pass<{rows}, ALIGNED>(" in source
    for rows in (8, 16):  # FFMA (decode_pass) under math simt, else the tensor path
        assert f"decode_pass<{rows}, ALIGNED>(" in source
    assert "*out = beta != 0.0f ? alpha * sum + beta * *out : alpha * sum;" in source
    assert "const bool transposed = M > N;" in source
    assert re.search(r"constexpr int BLOCK_COLS = 16;", source)
    assert "atomicAdd" not in source  # the K slices are summed in a fixed order


def test_alpha_only_refuses_beta_in_the_launcher_and_never_reads_c():
    source = generate(plan_of("  epilogue alpha\n"))
    assert "*out = alpha * sum;" in source
    assert "if (beta != 0.0f) return cudaErrorInvalidValue;" in source


def test_c_col_swaps_cs_strides():
    source = generate(plan_of(layout_C="col"))
    assert "const long long c_m = 1, c_n = ldc;" in source
    assert "const long long c_m = ldc, c_n = 1;" in generate(plan_of())


def test_the_shipped_spec_is_a_decode_kernel():
    plan = make_plan(load_one(SPECS_DIR / "decode.gemm", "decode"))
    assert plan.path == "decode" and plan.epilogue.beta


@pytest.mark.parametrize("columns,warps,slices,math", [(1, 8, 1, "simt"), (2, 4, 2, "simt"), (4, 4, 1, "simt"),
                                                        (4, 8, 2, "simt"), (2, 8, 1, "3xtf32"), (2, 8, 1, "tf32"),
                                                        (4, 8, 2, "3xtf32"), (4, 4, 1, "tf32"), (4, 8, 1, "3xtf32"),
                                                        (4, 16, 1, "tf32"), (2, 16, 2, "3xtf32")])
def test_the_library_search_space_compiles_every_row_count_without_spills(columns, warps, slices, math):
    plan = plan_of(decode_columns=columns, decode_warps=warps, decode_slices=slices, math=math)
    compiled = compile_plan(plan)
    assert len(compiled.resources) == 2  # the aligned and scalar variants, each with all five row counts
    for symbol, report in compiled.resources.items():
        assert not report.spills, (columns, warps, slices, symbol, report.registers)


# --- the tensor path (math tf32 / 3xtf32): mma.sync for every pass

def test_math_tf32_and_3xtf32_plan_the_tensor_path_over_the_blocks_columns():
    for math, products in (("tf32", 1), ("3xtf32", 3)):
        plan = plan_of(math=math)  # columns 4 x warps 8 / slices 2: 16 columns, one tile of 16
        m = plan.mainloop
        assert plan.math == math and m.products == products
        assert (m.tensor_tiles, m.tensor_slices) == (1, 8)  # 8 warps per tile, each a slice of K
        assert m.part_floats == (8 - 1) * 1 * 16 * 16    # slices 2 .. 8's 16 x 16 sums of the tile
        assert plan.tile.occupancy == 2  # 16 warps an SM
        assert math in dict(plan.rows())["math"] and "tensor path" in dict(plan.rows())
    simt = plan_of()
    assert simt.mainloop.products == 0 and simt.tile.occupancy == 0
    assert plan_of("  occupancy 3\n", math="tf32").tile.occupancy == 3  # the spec's own occupancy stands
    two_tiles = plan_of(math="3xtf32", decode_columns=4, decode_warps=8, decode_slices=1).mainloop
    assert (two_tiles.tensor_tiles, two_tiles.tensor_slices) == (2, 4)
    assert plan_of(math="tf32", decode_columns=4, decode_warps=4, decode_slices=1).tile.occupancy == 4  # 4 warps


def test_the_tensor_source_takes_every_pass_on_mma_sync():
    for math, products in (("tf32", 1), ("3xtf32", 3)):
        source = generate(plan_of(math=math))
        assert f"constexpr int PRODUCTS = {products};" in source
        assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in source
        assert "cvt.rna.tf32.f32" in source  # rounded to nearest, as cuBLAS TF32
        for rows in (8, 16):  # passes of up to 8 rows, and of up to 16
            assert f"decode_tensor_pass<{rows}, ALIGNED>(" in source
        # the FFMA passes sit behind `if constexpr (PRODUCTS > 0) ... else`: not compiled into a tensor kernel
        assert "if constexpr (PRODUCTS > 0) {" in source
        assert "float s_rows[PRODUCTS ? 1 : TILE_FLOATS]" in source
        assert "__launch_bounds__(THREADS, 2)" in source
        assert "__device__ __forceinline__ void decode_tensor_pass(" in source
        assert "atomicAdd" not in source  # the tiles' K slices are summed in a fixed order
    assert "constexpr int PRODUCTS = 0;" in generate(plan_of())


def test_a_tensor_points_spec_text_and_description_keep_its_math():
    from gemmgen.plan.space import describe, to_text
    (spec,) = parse(BASE.format(extra="  math 3xtf32\n"))
    assert describe(spec) == "decode=4x8x2 math=3xtf32"
    text = to_text(spec, "again", "a comment")
    (again,) = parse(text)
    assert again["math"] == "3xtf32" and make_plan(again).mainloop.products == 3
    (plain,) = parse(BASE.format(extra=""))
    assert describe(plain) == "decode=4x8x2" and "math" not in to_text(plain, "again", "a comment")
