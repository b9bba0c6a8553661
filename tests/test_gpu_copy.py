"""GPU tests of the cp.async-fed wgmma kernels (`stages N copy`, specs/hopper_tf32_copy.gemm and
hopper_3xtf32_copy.gemm, whose loader also writes the remainders): every layout of A and B, two
consumers and one, split K, each against float64 within its math's tolerance,
through the Python runtime and the nvcc-built C entry point, at the sizes TMA cannot take as well as
those it can: odd leading dimensions, pointers 4 bytes off 16, edge tiles on every side, K = 0,
strided and broadcast batches. Each operand lies in a NaN-filled buffer and C's padding must stay
NaN: nothing outside C is written, and a copy that read past a tile's edge would show.

Run with `pytest -m gpu tests/test_gpu_copy.py`; skipped without an sm_90 GPU and CuPy.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gemmgen.language.load import load_one
from hopper_gpu import batched_entry, check, inputs, kernel_cache, operand, packed_batches_over_one_b, require_sm90

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
LAYOUTS = {"rc": ("row", "col"), "cc": ("col", "col"), "rr": ("row", "row"), "cr": ("col", "row")}
SHIPPED = load_one(ROOT / "specs" / "hopper_tf32_copy.gemm", "hopper_tf32_copy")
SHIPPED_3XTF32 = load_one(ROOT / "specs" / "hopper_3xtf32_copy.gemm", "hopper_3xtf32_copy")

SPECS = {}
TF32_VARIANTS = (("", {}), ("_64", {"block_m": 64, "block_n": 128, "warp_m": 64, "warp_n": 128, "mma_n": 128}),
                 ("_split", {"split": 3}))
# 3xtf32: the loader writes each landed tile's remainders, stages - 2 tiles behind its copies
THREE_VARIANTS = (("", {}), ("_64", {"block_m": 64, "warp_m": 64, "stages": 4}), ("_split", {"split": 3}),
                  ("_deep", {"block_n": 64, "warp_n": 64, "mma_n": 64, "stages": 4}))
for prefix, shipped, variants in (("copy", SHIPPED, TF32_VARIANTS), ("copy3", SHIPPED_3XTF32, THREE_VARIANTS)):
    for variant, values in variants:
        for layouts, (a, b) in LAYOUTS.items():
            name = f"{prefix}{variant}_{layouts}"
            SPECS[name] = replace(shipped.with_values(layout_A=a, layout_B=b, **values), name=name)

# (M, N, K, padding of each leading dimension, 16-byte aligned leading dimensions, pointer offset in floats)
SHAPES = [(517, 389, 264, 0, True, 0), (256, 300, 1000, 8, True, 0), (130, 97, 36, 4, True, 1),
          (67, 45, 33, 1, False, 0), (301, 257, 131, 3, False, 3), (64, 128, 32, 0, True, 0)]


@pytest.fixture(scope="module")
def cp():
    require_sm90("the wgmma kernels are built for sm_90a")
    import cupy
    return cupy


@pytest.fixture(scope="module")
def kernels(cp):
    yield from kernel_cache(SPECS)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:3])) + f"+{s[3]}"
                         + ("" if s[4] else "-odd") + (f"-off{s[5]}" if s[5] else ""))
@pytest.mark.parametrize("name", list(SPECS))
def test_every_layout_leading_dimension_and_alignment_through_python(name, shape, kernels, cp):
    kernel = kernels(name)
    M, N, K, pad, aligned, offset = shape
    A, B, C = inputs(M, N, K, M + N + K)
    a, pa, lda = operand(cp, A, kernel.plan.spec["layout.A"], pad, aligned, offset)
    b, pb, ldb = operand(cp, B, kernel.plan.spec["layout.B"], pad, aligned, offset)
    c, pc, ldc = operand(cp, C, "row", pad, aligned)
    kernel.launch(M, N, K, 1.5, pa, lda, pb, ldb, -0.5, pc, ldc)
    cp.cuda.runtime.deviceSynchronize()
    host = c.get().reshape(M, ldc)
    check(host[:, :N], A, B, C, 1.5, -0.5, f"{name} {M}x{N}x{K} pad {pad} offset {offset}",
          kernel.plan.spec["math"])
    assert np.isnan(host[:, N:]).all(), f"{name}: wrote C's padding"


@pytest.mark.parametrize("name", ["copy_rc", "copy_cr", "copy3_rc", "copy3_cr"])
def test_k_zero_scales_c_and_an_empty_c_is_left_alone(name, kernels, cp):
    kernel = kernels(name)
    C = np.random.default_rng(3).uniform(-1, 1, (70, 90)).astype(np.float32)
    c = cp.asarray(C)
    a = cp.full(16, cp.nan, dtype=cp.float32)
    kernel.launch(70, 90, 0, 1.0, a.data.ptr, 70, a.data.ptr, 90, 2.0, c.data.ptr, 90)  # lds valid in either layout
    kernel.launch(0, 90, 50, 1.0, a.data.ptr, 50, a.data.ptr, 90, 0.0, c.data.ptr, 90)
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(c.get(), (2.0 * C).astype(np.float32))


@pytest.mark.parametrize("prefix", ["copy", "copy3"])
@pytest.mark.parametrize("layouts", list(LAYOUTS))
def test_batches_and_one_gemm_through_the_c_entry_point(layouts, prefix, cp, tmp_path):
    """Strided batches (A packed, B broadcast by stride 0, odd leading dimensions), then one GEMM
    through the single entry point."""
    from test_gpu_schedule import _build_abi
    name = f"{prefix}_{layouts}"
    math = SPECS[name]["math"]
    single = _build_abi(name, tmp_path, SPECS[name])
    library = ctypes.CDLL(str(tmp_path / f"lib{name}.so"))
    batched = batched_entry(library, name)
    layout_a, layout_b = LAYOUTS[layouts]
    out, As, B, Cs = packed_batches_over_one_b(cp, batched, layout_a, layout_b, 299, 261, 133, 3, 11)
    for i in range(3):
        check(out[i], As[i], B, Cs[i], 1.0, 1.0, f"{name} batch {i}", math)
    M, N, K = 1000, 777, 519
    A, B, C = inputs(M, N, K, 5)
    a, pa, lda = operand(cp, A, layout_a, 1, False, 1)
    b, pb, ldb = operand(cp, B, layout_b, 1, False, 1)
    c = cp.asarray(C)
    assert single(M, N, K, 2.0, pa, lda, pb, ldb, 0.0, c.data.ptr, N, None) == 0
    cp.cuda.runtime.deviceSynchronize()
    check(c.get(), A, B, C, 2.0, 0.0, f"{name} {M}x{N}x{K}", math)
