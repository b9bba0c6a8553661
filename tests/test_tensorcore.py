"""Tensor-core kernels (math tf32 / 3xtf32) on the CPU: what the Plan derives, what the templates
emit, and what the compiled SASS runs. Numerics against float64 are GPU tests (test_gpu.py)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from conftest import SPECS_DIR
from gemmgen.codegen import generate
from gemmgen.compile import compile_plan
from gemmgen.plan import make_plan
from gemmgen.spec import load_one, parse


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
    # the small cross terms go first, the big product last
    first, second, third = re.findall(r"mma_tf32\(c0, c1, c2, c3, (\w+)\[rm\], (\w+)\[rn\]\)", body)
    assert (first, second, third) == (("a_small", "b_big"), ("a_big", "b_small"), ("a_big", "b_big"))


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
