"""Tensor-core kernels (math tf32 / 3xtf32) on the CPU: what the Plan derives, what the templates
emit, and what the compiled SASS runs. Numerics against float64 are GPU tests (test_gpu.py)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from conftest import SPECS_DIR
from gemmgen.codegen.cuda import generate
from gemmgen.gpu.compile import compile_plan
from gemmgen.plan import make_plan
from gemmgen.language.errors import SpecError
from gemmgen.language.load import load_one, parse


def plan_of(text: str):
    (spec,) = parse(text, "t.gemm")
    return make_plan(spec)


def opcodes(sass: str) -> Counter:
    return Counter(re.findall(r"\b(HGMMA|HMMA|LDSM|FFMA|UTMALDG|SYNCS)\b", sass))


MMA_KERNEL = """kernel tc {{
  target {target}
  layout A {a}, B {b}, C {c}
  block 128 x 64 x 16
  warp 32 x 32
  math {math}
  load A vector 4 {a_transpose}
  load B vector 4 {b_transpose}
  stages 3 async
}}
"""


def test_mma_tile_replaces_the_thread_tile():
    plan = plan_of(MMA_KERNEL.format(target="sm_80", a="row", b="row", c="row", math="3xtf32",
                                     a_transpose="", b_transpose=""))
    assert plan.mma_shape == (16, 8, 8)
    assert (plan.RM, plan.RN) == (2, 4)          # a 32 x 32 warp tile is 2 x 4 MMA tiles
    assert (plan.TM, plan.TN, plan.m_step) == (2, 2, 8)
    assert plan.threads == 4 * 2 * 32            # 8 warps of 32 lanes
    assert plan.accumulators == 32               # 2 x 4 tiles x 4 floats per lane
    assert plan.split_terms == 3
    assert plan.c_vector == 2                    # a lane's two columns are adjacent in row-major C


def test_column_major_c_is_stored_one_float_at_a_time():
    plan = plan_of(MMA_KERNEL.format(target="sm_80", a="row", b="row", c="col", math="tf32",
                                     a_transpose="", b_transpose=""))
    assert plan.c_vector == 1  # a lane's rows are 8 apart: never two adjacent floats of a C column


@pytest.mark.parametrize("a,a_transpose,b,b_transpose,expected", [
    ("row", "", "col", "transpose", (True, True)),  # sA[m][k], sB[n][k]: rows along K, ldmatrix
    ("row", "", "col", "", (True, False)),          # sB[k][n]: B's fragments by scalar loads
    ("row", "transpose", "row", "", (False, False)),  # sA[k][m], sB[k][n]
    ("col", "", "row", "", (True, False)),          # col-major A lands as sA[m][k] by 4-byte copies
])
def test_ldmatrix_where_shared_rows_run_along_k(a, a_transpose, b, b_transpose, expected):
    plan = plan_of(MMA_KERNEL.format(target="sm_80", a=a, b=b, c="row", math="tf32",
                                     a_transpose=a_transpose, b_transpose=b_transpose))
    assert (plan.ldmatrix_a, plan.ldmatrix_b) == expected
    source = generate(plan)
    assert ("ldmatrix_x4(raw" in source) == expected[0]
    assert ("ldmatrix_x2(raw" in source) == expected[1]


def test_tf32_rounds_and_3xtf32_splits():
    tf32 = generate(plan_of(MMA_KERNEL.format(target="sm_80", a="row", b="row", c="row", math="tf32",
                                              a_transpose="", b_transpose="")))
    three = generate(plan_of(MMA_KERNEL.format(target="sm_80", a="row", b="row", c="row",
                                               math="3xtf32", a_transpose="", b_transpose="")))
    assert "to_tf32(" in tf32 and "split_tf32(" not in tf32.split("__global__")[1]
    body = three.split("__global__")[1]
    assert body.count("mma_tf32(") == 3 and "split_tf32(" in body
    # The cross terms go into acc_small; each K tile's big*big starts from zero in tile_product
    # and is added into acc outside the tensor cores, which round sums toward zero.
    products = re.findall(r"mma_tf32\((\w+)\[rm \* TM\]\[rn \* TN\],[^;]*?(\w+)\[rm\], (\w+)\[rn\]\)", body, re.S)
    assert products == [("acc_small", "a_small", "b_big"), ("acc_small", "a_big", "b_small"),
                        ("tile_product", "a_big", "b_big")]
    assert "acc[i][j] += tile_product[i][j];" in body and "acc[i][j] += acc_small[i][j];" in body


@pytest.mark.parametrize("target", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", ["tensorcore_tf32", "tensorcore_3xtf32"])
def test_sass_runs_hmma_not_ffma_in_the_main_loop(name, target):
    spec = load_one(SPECS_DIR / f"{name}.gemm").with_values(target=target)
    plan = make_plan(spec)
    compiled = compile_plan(plan)
    ops = opcodes(compiled.sass())
    # Both variants (aligned, unaligned) run every MMA of a K tile, unrolled.
    per_k_tile = (plan.BK // plan.mma_shape[2]) * plan.RM * plan.RN * plan.split_terms
    assert ops["HMMA"] == 2 * per_k_tile, ops
    # FFMA only in the epilogue: alpha * acc + beta * C, once per accumulator and variant.
    assert ops["FFMA"] <= 2 * plan.accumulators, ops
    assert ops["LDSM"] > 0  # A's fragments come through ldmatrix
    assert not any(r.spills for r in compiled.resources.values())


# --- sm_90a: wgmma fed by TMA ----------------------------------------------------------------

WGMMA_KERNEL = """kernel wg {{
  target sm_90a
  layout A row, B col, C {c}
  block {bm} x {bn} x 32
  math {math}
  stages {stages} {fill}
  {extra}
}}
"""


def wgmma_plan(math="tf32", bm=128, bn=256, stages=4, c="row", fill="tma", a="row", b="col", extra=""):
    return plan_of(WGMMA_KERNEL.format(math=math, bm=bm, bn=bn, stages=stages, c=c, fill=fill, extra=extra)
                   .replace("layout A row, B col", f"layout A {a}, B {b}"))


def test_wgmma_plan_has_a_producer_and_consumer_warpgroups():
    plan = wgmma_plan()
    assert plan.path == "wgmma"
    assert plan.consumers == 2 and plan.threads == 3 * 128
    assert plan.mma_shape == (64, 256, 8)
    # 4 stages of a 128 x 32 A tile and a 256 x 32 B tile, two mbarriers each, 1024 B of alignment
    assert plan.smem_bytes == 4 * 4 * 32 * (128 + 256) + 2 * 8 * 4 + 1024
    three = wgmma_plan("3xtf32", bn=128, stages=3)  # B's TF32 remainders take a third tile per stage
    assert three.smem_bytes == 3 * 4 * 32 * (128 + 2 * 128) + 3 * 8 * 3 + 1024
    # calls TMA cannot describe go to the register-fed kernel, in the same layouts and math
    fallback = plan.fallback
    assert fallback.path == "wgmma_async" and fallback.arch.name == "sm_90a"
    assert (fallback.BM, fallback.BN, fallback.stages, fallback.loaders) == (64, 128, 4, 2)
    assert fallback.layouts() == plan.layouts() and fallback.math == "tf32" and fallback.fallback is None
    assert three.fallback.math == "3xtf32" and three.fallback.path == "wgmma_async"


@pytest.mark.parametrize("a,b", [("row", "row"), ("col", "row"), ("col", "col"), ("row", "col")])
def test_wgmma_fed_through_registers_takes_any_layout(a, b):
    """stages N async: loader warpgroups read (and where needed transpose) the tiles themselves."""
    plan = wgmma_plan("3xtf32", bm=64, bn=64, stages=4, fill="async", a=a, b=b)
    assert plan.path == "wgmma_async" and not plan.tma
    # a lone consumer gets two loaders, so that two K tiles' loads are in flight
    assert (plan.consumers, plan.loaders, plan.threads) == (1, 2, 3 * 128)
    # 4 stages of A, B and both their TF32 remainders; full and empty mbarriers; alignment slack
    assert plan.smem_bytes == 4 * 4 * 32 * 2 * (64 + 64) + 2 * 8 * 4 + 1024
    # 16-byte loads only for K-contiguous operands (A row-major, B column-major)
    assert [ptr for ptr, *_ in plan.vector_requirements()] == (
        (["A"] if a == "row" else []) + (["B"] if b == "col" else []) + ["C"])
    source = generate(plan)
    assert f"constexpr bool A_K_CONTIGUOUS = {'true' if a == 'row' else 'false'};" in source
    assert "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32" in source


def test_loaders_and_consumers_share_out_the_launch_registers():
    """setmaxnreg moves registers between warpgroups: never more than the block started with."""
    for bm, bn, math in [(64, 64, "3xtf32"), (64, 128, "3xtf32"), (128, 128, "3xtf32"), (128, 192, "tf32")]:
        plan = wgmma_plan(math, bm=bm, bn=bn, stages=3, fill="async", a="row", b="row")
        launch = 65536 // plan.threads // 8 * 8
        assert (plan.loaders * plan.loader_registers + plan.consumers * plan.consumer_registers
                <= launch * (plan.loaders + plan.consumers))
        assert plan.loader_registers <= launch <= plan.consumer_registers  # what ptxas requires
        source = generate(plan)
        assert f"setmaxnreg.dec.sync.aligned.u32 {plan.loader_registers};" in source
        assert f"setmaxnreg.inc.sync.aligned.u32 {plan.consumer_registers};" in source


def test_loaders_keep_two_tiles_in_flight_where_their_registers_hold_them():
    narrow = wgmma_plan("3xtf32", bm=64, bn=64, stages=4, fill="async", a="row", b="row")
    assert narrow.loader_depth == 2  # 2 x 32 floats of a 64 x 64 x 32 tile pair per loader thread
    assert "load(t + LOADERS, a_odd, b_odd);" in generate(narrow)
    wide = wgmma_plan("3xtf32", bm=128, bn=128, stages=3, fill="async", a="row", b="row")
    assert wide.loader_depth == 1    # 64 floats per tile: two would not fit beside the addresses
    assert "a_odd" not in generate(wide)


def test_wgmma_tiles_too_wide_for_the_registers_are_refused_at_the_block_line():
    with pytest.raises(SpecError, match="a consumer thread would hold about 200 registers") as info:
        wgmma_plan("3xtf32", bm=64, bn=160, stages=3, fill="async")
    assert (info.value.line, info.value.column) == (4, 14)  # at "160"


@pytest.mark.parametrize("bm,bn,math,a,b", [
    (64, 64, "3xtf32", "row", "row"),    # the skinny-shape kernel
    (128, 64, "3xtf32", "row", "row"),   # two consumers, one loader
    (128, 128, "tf32", "row", "row"),
    (64, 256, "tf32", "col", "col"),     # the widest tiles the Plan lets through, whose
    (128, 192, "tf32", "col", "col"),    # loaders spilled before they recomputed addresses
])
def test_register_fed_wgmma_compiles_without_spills_or_serialised_mmas(bm, bn, math, a, b):
    plan = wgmma_plan(math, bm=bm, bn=bn, stages=3, fill="async", a=a, b=b)
    compiled = compile_plan(plan)
    assert not any(r.spills for r in compiled.resources.values()), compiled.resources
    assert "C7514" not in compiled.log, "ptxas serialized the wgmma pipeline"
    per_k_tile = plan.BK // 8 * plan.split_terms
    assert opcodes(compiled.sass())["HGMMA"] == 2 * per_k_tile  # both C variants, one K tile each


@pytest.mark.parametrize("M,N,K,lda,ldb,a,b,ready", [
    (4096, 4096, 4096, 4096, 4096, 0, 0, True),
    (127, 4099, 1023, 1024, 1024, 0, 0, True),   # any M, N, K: TMA fills the edges with zeros
    (127, 4099, 1023, 1023, 1023, 0, 0, False),  # a row stride that is no multiple of 16 bytes
    (64, 64, 64, 64, 64, 4, 0, False),           # A 4 bytes past a 16-byte boundary
    (64, 64, 0, 64, 64, 0, 0, False),            # K = 0: nothing to load, the fallback writes beta C
])
def test_tma_serves_aligned_calls_and_the_fallback_the_rest(M, N, K, lda, ldb, a, b, ready):
    plan = wgmma_plan()
    assert plan.mainloop.tma_ready(M, N, K, lda, ldb, {"A": 1 << 20 | a, "B": 1 << 21 | b}) is ready


def test_wgmma_source_launches_tma_kernel_or_fallback():
    plan = wgmma_plan()
    source = generate(plan)
    assert "static int gemmgen_wg_fallback(" in source           # internal, not a second C entry point
    assert source.count('\nextern "C" int gemmgen_wg(') == 1  # one definition (the header quotes it too)
    assert "if (!tma_ready)\n        return gemmgen_wg_fallback(" in source
    assert "CU_TENSOR_MAP_SWIZZLE_128B" in source and "cudaGetDriverEntryPoint" in source
    assert "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32" in source
    # each wgmma's inline-PTX operand list names each of a thread's accumulators once: 64 x 256 /
    # 128 in the TMA kernel, 64 x 128 / 128 in the register-fed fallback (the file's first)
    fallback_list, tma_list = (match.group(0) for match in
                               re.finditer(r': ("\+f"\(acc\[\d\]\[\d+\]\)(, )?)+', source))
    assert tma_list.count('"+f"') == 128 and '"+f"(acc[1][63])' in tma_list
    assert fallback_list.count('"+f"') == 64 and '"+f"(acc[1][31])' in fallback_list


@pytest.mark.parametrize("name", ["hopper_tf32", "hopper_3xtf32"])
def test_sass_runs_hgmma_fed_by_tma_and_by_registers(name):
    plan = make_plan(load_one(SPECS_DIR / f"{name}.gemm"))
    compiled = compile_plan(plan)
    ops = opcodes(compiled.sass())
    per_k_tile = plan.BK // 8 * plan.split_terms
    tma_mmas = per_k_tile * (2 if plan.math == "3xtf32" else 1)  # 3xtf32's K loop is unrolled by two
    fallback_mmas = plan.fallback.BK // 8 * plan.fallback.split_terms
    # both C variants of the TMA kernel, and both of the register-fed fallback
    assert ops["HGMMA"] == 2 * tma_mmas + 2 * fallback_mmas, ops
    assert ops["HMMA"] == 0, ops
    assert ops["UTMALDG"] > 0
    assert not any(r.spills for r in compiled.resources.values())
    assert "C7514" not in compiled.log, "ptxas serialized the wgmma pipeline"


@pytest.mark.parametrize("fill,math,a,b", [("tma", "3xtf32", "row", "col"), ("async", "tf32", "col", "row")])
def test_split_k_on_wgmma_slices_k_tiles_and_adds_into_c(fill, math, a, b):
    """Split K on the wgmma paths (small M x N, long K): blockIdx.y picks a slice of the K tiles,
    C = beta * C is set first, and each slice adds alpha times its product with atomicAdd."""
    plan = wgmma_plan(math, bm=64, bn=64, stages=4, fill=fill, a=a, b=b, extra="split 8")
    assert plan.split_k == 8 and plan.c_vector == 1
    if fill == "tma":
        assert plan.fallback.split_k == 8  # calls TMA cannot take are split the same way
    source = generate(plan)
    assert "constexpr int SPLIT_K = 8;" in source
    assert "_scale_c<<<scale_blocks, 256, 0, stream>>>(M, N, beta, C, ldc);" in source
    assert "dim3((unsigned)blocks, SPLIT_K)" in source
    assert "atomicAdd(c, alpha * acc[" in source
    if fill == "tma":
        assert "(k_tile0 + t) * BK, block_m0" in source
    compiled = compile_plan(plan)
    assert not any(r.spills for r in compiled.resources.values()), compiled.resources
    assert "C7514" not in compiled.log, "ptxas serialized the wgmma pipeline"
    sass = compiled.sass()
    assert opcodes(sass)["HGMMA"] > 0 and re.search(r"\bRED(G)?\.E\.ADD\.F32", sass), "atomic adds into C"


def test_every_variant_the_gpu_tests_build_has_a_plan():
    """tests/test_gpu.py derives variants from the shipped specs (layouts, the register-fed
    kernel); one the Plan rejects fails every GPU test at collection, which only a GPU run shows.
    (hopper_3xtf32 going to 4 stages made its register-fed variant need 257 KB of shared memory.)"""
    import test_gpu
    for spec in test_gpu._every_variant_tested():
        make_plan(spec)
