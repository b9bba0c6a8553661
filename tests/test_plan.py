"""The Plan's derived numbers for shipped specs, the four A/B layouts, and the launcher checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from gemmgen.codegen.cuda import generate
from gemmgen.language.errors import SpecError
from gemmgen.plan import ARCHS, MAX_THREADS_PER_BLOCK, make_plan, try_plan
from gemmgen.language.load import load_one, parse

SPECS_DIR = Path(__file__).resolve().parent.parent / "specs"


def plan_of(name: str, **values):
    spec = load_one(SPECS_DIR / f"{name}.gemm")
    return make_plan(spec.with_values(**values) if values else spec)


# --- derived numbers of shipped specs -----------------------------------------------------

def test_warptile_numbers():
    p = plan_of("warptile")
    assert (p.BM, p.BN, p.BK, p.WM, p.WN) == (128, 128, 16, 64, 64)
    assert p.warp_tiling and (p.warps_m, p.warps_n) == (2, 2)
    assert (p.SUB_M, p.SUB_N) == (64, 16)           # warp 64 x 64 / repeat 1 x 4
    assert (p.lanes_m, p.lanes_n) == (8, 4)         # 64 / 8 x 16 / 4 = 32 lanes
    assert p.threads == 128 and p.warps == 4
    assert p.accumulators == 8 * 4 * 1 * 4
    assert p.raster_group == 8 and p.order == "n"
    assert p.smem_bytes == 4 * (16 * 132 + 16 * 128)  # sA padded by 4, sB plain
    assert p.smem_bytes == 16640
    assert p.c_vector == 4


def test_warptile_operands():
    p = plan_of("warptile")
    a, b = p.a, p.b
    # A: row-major 128 x 16 (m x k), float4 loads, stored transposed (k-major) and padded.
    assert (a.outer_dim, a.inner_dim, a.outer, a.inner) == ("m", "k", 128, 16)
    assert (a.vector, a.chunks_per_row, a.passes) == (4, 4, 4)
    assert a.transposed_store and (a.smem_rows, a.smem_cols, a.smem_ld, a.pad) == (16, 128, 132, 4)
    assert a.smem_index == "(k) * 132 + m"
    assert a.frag_vector == 4
    assert (a.tile_origin, a.k_step) == ("(long long)block_m0 * lda", "BK")
    # B: row-major 16 x 128 (k x n), float4 loads, stored as laid out.
    assert (b.outer_dim, b.inner_dim, b.outer, b.inner) == ("k", "n", 16, 128)
    assert (b.vector, b.chunks_per_row, b.passes) == (4, 32, 4)
    assert not b.transposed_store and (b.smem_rows, b.smem_cols, b.smem_ld) == (16, 128, 128)
    assert b.smem_index == "(k) * 128 + n"
    assert (b.tile_origin, b.k_step) == ("block_n0", "BK * (long long)ldb")
    assert (a.rows_left, a.cols_left, b.rows_left, b.cols_left) == ("m_left", "k_left", "k_left", "n_left")


def test_vectorized_numbers():
    p = plan_of("vectorized")
    assert not p.warp_tiling
    assert (p.BM, p.BN, p.BK, p.TM, p.TN) == (128, 128, 8, 8, 8)
    assert (p.lanes_m, p.lanes_n, p.threads) == (16, 16, 256)
    assert (p.a.passes, p.b.passes) == (1, 1)        # 128 x 8 floats = 256 float4 = 1 per thread
    assert (p.a.smem_index, p.b.smem_index) == ("(k) * 128 + m", "(k) * 128 + n")
    assert p.smem_bytes == 8192
    assert p.stages == 1 and not p.async_copy


def test_pingpong_async_numbers():
    p = plan_of("pingpong_async")
    assert (p.BM, p.BN, p.BK, p.WM, p.WN) == (64, 128, 16, 32, 64)
    assert (p.TM, p.TN, p.RM, p.RN) == (4, 4, 2, 2)
    assert (p.SUB_M, p.SUB_N, p.lanes_m, p.lanes_n) == (16, 32, 4, 8)
    assert (p.warps_m, p.warps_n, p.threads) == (2, 2, 128)
    assert p.stages == 2 and p.async_copy
    assert (p.a.passes, p.b.passes) == (2, 4)
    assert (p.a.smem_ld, p.a.stage_floats, p.b.stage_floats) == (68, 16 * 68, 16 * 128)
    assert p.a.smem_index == "(k) * 68 + m"
    assert p.smem_bytes == 4 * 2 * (16 * 68 + 16 * 128) == 25088


def test_naive_numbers():
    p = plan_of("naive")
    assert not p.uses_shared and p.a is None and p.b is None
    assert p.smem_bytes == 0 and p.BK == 1
    assert (p.lanes_m, p.lanes_n, p.threads) == (32, 32, 1024)
    assert p.order == "m"
    assert p.c_vector == 1 and p.vector_requirements() == []


def test_bank_swizzle_index_xors_16_byte_chunks():
    p = plan_of("bank_swizzle")
    assert p.a.swizzle and p.a.swizzle_chunks == 32
    assert p.a.smem_index == "(k) * 128 + (m ^ (((k) % 32) << 2))"
    assert "XOR-swizzled" in p.a.describe()


def test_double_buffer_counts_staging_registers():
    single, double = plan_of("warptile"), plan_of("double_buffer")
    assert double.stages == 2 and not double.async_copy
    assert double.smem_bytes == 2 * single.smem_bytes
    staged = double.a.passes * double.a.vector + double.b.passes * double.b.vector
    assert double.registers_estimate == single.registers_estimate + staged


def test_block_k_is_unused_without_shared_memory():
    spec, = parse("kernel k {\n  block 32 x 32 x 8\n  thread 1 x 1\n  shared off\n}\n")
    p = make_plan(spec)
    assert p.BK == 1 and "block K is unused without shared memory" in p.notes


def test_grid_counts_partial_tiles():
    p = plan_of("warptile")
    assert p.grid(128, 128) == 1
    assert p.grid(129, 128) == 2
    assert p.grid(1000, 1000) == 8 * 8
    assert p.grid(0, 1000) == 0


def test_names_of_the_kernel_and_launcher():
    p = plan_of("warptile")
    assert p.kernel_name == "gemmgen_warptile_kernel"
    assert p.launcher_name == "gemmgen_warptile"


def test_try_plan_returns_the_error_of_an_impossible_point():
    plan, error = try_plan(load_one(SPECS_DIR / "warptile.gemm").with_values(warp_m=48))
    assert plan is None and isinstance(error, SpecError)
    plan, error = try_plan(load_one(SPECS_DIR / "warptile.gemm"))
    assert plan is not None and error is None


def test_threads_never_exceed_the_block_limit_in_a_search_space():
    spec = load_one(SPECS_DIR / "warptile_search.gemm")
    plans = [p for p, _ in map(try_plan, spec.points()) if p is not None]
    assert plans, "some points of the shipped search space must plan"
    for p in plans:
        assert p.threads <= MAX_THREADS_PER_BLOCK and p.threads % 32 == 0
        assert p.smem_bytes <= ARCHS[p.arch.name].smem_per_block
        assert p.lanes_m * p.lanes_n == 32


# --- the four A/B layouts -----------------------------------------------------------------

LAYOUTS = [(a, b) for a in ("row", "col") for b in ("row", "col")]


@pytest.mark.parametrize("layout_a, layout_b", LAYOUTS, ids=[f"A{a}-B{b}" for a, b in LAYOUTS])
@pytest.mark.parametrize("name", ["warptile", "vectorized", "pingpong_async", "naive"])
def test_every_ab_layout_plans_and_generates(name, layout_a, layout_b):
    p = plan_of(name, layout_A=layout_a, layout_B=layout_b)
    assert p.layouts() == f"A {layout_a}, B {layout_b}, C row"
    source = generate(p)
    assert p.kernel_name in source and p.launcher_name in source


@pytest.mark.parametrize("layout_a, layout_b", LAYOUTS, ids=[f"A{a}-B{b}" for a, b in LAYOUTS])
def test_layout_decides_the_contiguous_dimension(layout_a, layout_b):
    p = plan_of("warptile", layout_A=layout_a, layout_B=layout_b)
    assert (p.a.outer_dim, p.a.inner_dim) == (("m", "k") if layout_a == "row" else ("k", "m"))
    assert (p.b.outer_dim, p.b.inner_dim) == (("k", "n") if layout_b == "row" else ("n", "k"))
    # The shared layout is what the spec asked for (sA[k][m] transposed, sB[k][n]) whatever
    # the global layout: only the loads change.
    assert p.a.smem_index == "(k) * 132 + m" and p.b.smem_index == "(k) * 128 + n"
    assert p.a.transposed_store == (layout_a == "row")
    assert p.b.transposed_store == (layout_b == "col")
    assert p.smem_bytes == 16640
    assert p.leading_dimension_minimums() == {
        "lda": "K" if layout_a == "row" else "M",
        "ldb": "N" if layout_b == "row" else "K",
        "ldc": "N"}
    assert (p.a_stride_m, p.a_stride_k) == (("lda", "1") if layout_a == "row" else ("1", "lda"))
    assert (p.b_stride_k, p.b_stride_n) == (("ldb", "1") if layout_b == "row" else ("1", "ldb"))
    assert [(ptr, size) for ptr, size, _, _ in p.vector_requirements()] == [
        ("A", "K" if layout_a == "row" else "M"), ("B", "N" if layout_b == "row" else "K"), ("C", "N")]


def test_column_major_c_indexes_and_vectorises_along_m():
    p = plan_of("warptile", layout_C="col")
    assert p.c_layout == "col"
    assert p.leading_dimension_minimums()["ldc"] == "M"
    assert p.c_vector == 4 and ("C", "M", "ldc", 4) in p.vector_requirements()
    assert p.c.index("m", "n") == "(long long)(n) * ldc + (m)"
    assert p.c.tile_origin == "batch_index * strideC + (long long)block_n0 * ldc + block_m0"
    assert plan_of("warptile").c.index("m", "n") == "(long long)(m) * ldc + (n)"


# --- argument_error and aligned -----------------------------------------------------------

def test_good_arguments_have_no_error():
    p = plan_of("warptile")
    assert p.argument_error(256, 512, 64, lda=64, ldb=512, ldc=512) is None
    assert p.argument_error(256, 512, 64, lda=100, ldb=600, ldc=700) is None  # padded rows


@pytest.mark.parametrize("sizes", [(-1, 8, 8), (8, -1, 8), (8, 8, -1)])
def test_negative_sizes_are_an_argument_error(sizes):
    error = plan_of("warptile").argument_error(*sizes, lda=8, ldb=8, ldc=8)
    assert error is not None and "sizes must be >= 0" in error


def test_leading_dimension_below_its_minimum_is_an_argument_error():
    p = plan_of("warptile")  # all row-major: lda >= K, ldb >= N, ldc >= N
    assert p.argument_error(64, 32, 16, lda=15, ldb=32, ldc=32) == "lda=15 is below max(1, K=16)"
    assert p.argument_error(64, 32, 16, lda=16, ldb=31, ldc=32) == "ldb=31 is below max(1, N=32)"
    assert p.argument_error(64, 32, 16, lda=16, ldb=32, ldc=31) == "ldc=31 is below max(1, N=32)"


def test_leading_dimension_minimum_follows_the_layout():
    p = plan_of("warptile", layout_A="col", layout_B="col", layout_C="col")
    # col-major: lda >= M, ldb >= K, ldc >= M
    assert p.argument_error(64, 32, 16, lda=64, ldb=16, ldc=64) is None
    assert "lda=16 is below max(1, M=64)" == p.argument_error(64, 32, 16, lda=16, ldb=16, ldc=64)
    assert "ldb=8 is below max(1, K=16)" == p.argument_error(64, 32, 16, lda=64, ldb=8, ldc=64)
    assert "ldc=32 is below max(1, M=64)" == p.argument_error(64, 32, 16, lda=64, ldb=16, ldc=32)


def test_empty_matrices_need_leading_dimensions_of_one():
    p = plan_of("warptile")
    assert p.argument_error(0, 0, 0, lda=1, ldb=1, ldc=1) is None
    assert p.argument_error(0, 0, 0, lda=0, ldb=1, ldc=1) == "lda=0 is below max(1, K=0)"


def test_fused_reduction_needs_m_times_n_below_2_to_the_32():
    p = plan_of("smallest")
    assert p.reduce_count == 2
    assert p.argument_error(65536, 65535, 1, lda=1, ldb=65535, ldc=65535) is None
    error = p.argument_error(65536, 65536, 1, lda=1, ldb=65536, ldc=65536)
    assert error is not None and "2^32" in error
    assert plan_of("vectorized").argument_error(65536, 65536, 1, lda=1, ldb=65536, ldc=65536) is None


def test_too_many_blocks_is_an_argument_error():
    p = plan_of("naive")  # 32 x 32 tiles
    big = 2**31
    assert p.argument_error(big, big, 1, lda=1, ldb=big, ldc=big) == "too many thread blocks for one launch"


ALIGNED_POINTERS = {"A": 0x10000, "B": 0x20000, "C": 0x30000}


def test_aligned_when_sizes_leading_dimensions_and_pointers_fit_float4():
    p = plan_of("warptile")
    assert p.aligned(128, 128, 64, lda=64, ldb=128, ldc=128, pointers=ALIGNED_POINTERS)


@pytest.mark.parametrize("pointer", ["A", "B", "C"])
@pytest.mark.parametrize("offset", [4, 8, 12])
def test_misaligned_pointer_is_not_aligned(pointer, offset):
    pointers = dict(ALIGNED_POINTERS, **{pointer: ALIGNED_POINTERS[pointer] + offset})
    assert not plan_of("warptile").aligned(128, 128, 64, lda=64, ldb=128, ldc=128, pointers=pointers)


@pytest.mark.parametrize("sizes, lds", [
    ((128, 128, 63), (63, 128, 128)),   # K not a multiple of 4 (A's rows)
    ((128, 126, 64), (64, 126, 126)),   # N not a multiple of 4 (B's and C's rows)
    ((128, 128, 64), (66, 128, 128)),   # lda not a multiple of 4
    ((128, 128, 64), (64, 130, 128)),   # ldb
    ((128, 128, 64), (64, 128, 130)),   # ldc
], ids=["K", "N", "lda", "ldb", "ldc"])
def test_sizes_or_leading_dimensions_off_the_vector_are_not_aligned(sizes, lds):
    lda, ldb, ldc = lds
    assert not plan_of("warptile").aligned(*sizes, lda=lda, ldb=ldb, ldc=ldc,
                                           pointers=ALIGNED_POINTERS)


def test_m_may_be_odd_for_row_major_operands():
    assert plan_of("warptile").aligned(127, 128, 64, lda=64, ldb=128, ldc=128,
                                       pointers=ALIGNED_POINTERS)


def test_scalar_kernel_is_always_aligned():
    odd = {"A": 0x10004, "B": 0x20008, "C": 0x3000C}
    assert plan_of("naive").aligned(127, 125, 63, lda=63, ldb=125, ldc=125, pointers=odd)


def test_column_major_a_needs_m_aligned_instead_of_k():
    p = plan_of("warptile", layout_A="col")
    assert p.aligned(128, 128, 63, lda=128, ldb=128, ldc=128, pointers=ALIGNED_POINTERS)
    assert not p.aligned(126, 128, 64, lda=128, ldb=128, ldc=128, pointers=ALIGNED_POINTERS)
