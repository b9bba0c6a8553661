"""GPU tests of the TMA-fed 3xTF32 kernel reading MN-major operands (a column-major A read into
registers from its MN-major tile, a row-major B transposed K-major by the producer's warps): every
layout of A and B on every schedule (data-parallel, split K, persistent, stream-K) against float64,
through the Python runtime and the nvcc-built C entry point, at sizes TMA takes (edge tiles whose
boxes TMA fills with zeros, leading dimensions past the width, strided and broadcast batches) and
at sizes it does not (the register-fed fallback). The batched cases of test_gpu_batched.py run the
same kernels too.

Run with `pytest -m gpu tests/test_gpu_mn_major.py`; skipped without an sm_90 GPU and CuPy.
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
LAYOUTS = {"cc": ("col", "col"), "rr": ("row", "row"), "cr": ("col", "row")}


def _spec(base: str, layouts: str, name: str, **values):
    spec = load_one(ROOT / "specs" / f"{base}.gemm", base)
    a, b = LAYOUTS[layouts]
    return replace(spec.with_values(layout_A=a, layout_B=b, **values), name=name)


SPECS = {}
for base, variant, values in (("hopper_3xtf32", "", {}), ("hopper_3xtf32", "_split", {"split": 4}),
                              ("hopper_3xtf32_persistent", "", {}), ("hopper_3xtf32_streamk", "", {})):
    for layouts in LAYOUTS:
        name = f"{base}{variant}_{layouts}"
        SPECS[name] = _spec(base, layouts, name, **values)
# math tf32 reads a column-major A into registers as it lies (round nearest consumer: rounded there);
# its B stays column-major (K-major).
for base, variant, values in (("hopper_tf32", "", {}), ("hopper_tf32", "_split", {"split": 4}),
                              ("hopper_tf32_persistent", "", {}), ("hopper_tf32_streamk", "", {}),
                              ("hopper_tf32_staged", "", {}), ("hopper_tf32", "_rounded", {"round": "nearest",
                                                                                          "round_by": "consumer"}),
                              ("hopper_tf32_pingpong", "", {})):
    name = f"{base}{variant}_cc"
    SPECS[name] = _spec(base, "cc", name, **values)

# (M, N, K, padding of each leading dimension, aligned): TMA-ready (each ld rounded up to a multiple
# of 4 floats before the padding: edge tiles on every side, several K tiles, ld past the width) and
# not (ld and K as they come, odd: the register-fed fallback).
SHAPES = [(517, 389, 264, 0, True), (256, 300, 1000, 8, True), (130, 97, 36, 4, True), (67, 45, 33, 1, False)]


@pytest.fixture(scope="module")
def cp():
    require_sm90("the TMA-fed wgmma kernels are built for sm_90a")
    import cupy
    return cupy


@pytest.fixture(scope="module")
def kernels(cp):
    yield from kernel_cache(SPECS)


def _check(out: np.ndarray, A, B, C, alpha, beta, what: str, math: str = "3xtf32"):
    error = check(out, A, B, C, alpha, beta, what, math)
    if math == "3xtf32":
        assert error < 2e-6, f"{what}: relative error {error:.2e} is not FP32's"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:3])) + f"+{s[3]}" + ("" if s[4] else "-odd"))
@pytest.mark.parametrize("name", list(SPECS))
def test_every_layout_and_schedule_through_python(name, shape, kernels, cp):
    kernel = kernels(name)
    M, N, K, pad, aligned = shape
    A, B, C = inputs(M, N, K, M + N + K)
    layout_a, layout_b = kernel.plan.spec["layout.A"], kernel.plan.spec["layout.B"]
    a, _, lda = operand(cp, A, layout_a, pad, aligned)
    b, _, ldb = operand(cp, B, layout_b, pad, aligned)
    c, _, ldc = operand(cp, C, "row", pad, aligned)
    pointers = {"A": a.data.ptr % 16, "B": b.data.ptr % 16}
    assert kernel.plan.mainloop.hands_over(M, N, K, lda, ldb, pointers) != aligned  # TMA takes the aligned ones
    kernel.launch(M, N, K, 1.5, a.data.ptr, lda, b.data.ptr, ldb, -0.5, c.data.ptr, ldc)
    cp.cuda.runtime.deviceSynchronize()
    host = c.get().reshape(M, ldc)
    _check(host[:, :N], A, B, C, 1.5, -0.5, f"{name} {M}x{N}x{K} pad {pad}", kernel.plan.math)
    assert np.isnan(host[:, N:]).all(), f"{name}: wrote C's padding"


@pytest.mark.parametrize("layouts", list(LAYOUTS))
def test_batches_through_the_c_entry_point(layouts, cp, tmp_path):
    """The C launcher's own tensor maps: strided batches (A packed, B broadcast by stride 0), then
    one GEMM through the single entry point."""
    from test_gpu_schedule import _build_abi
    name = f"hopper_3xtf32_{layouts}"
    single = _build_abi(name, tmp_path, SPECS[name])
    library = ctypes.CDLL(str(tmp_path / f"lib{name}.so"))
    batched = batched_entry(library, name)
    layout_a, layout_b = LAYOUTS[layouts]
    out, As, B, Cs = packed_batches_over_one_b(cp, batched, layout_a, layout_b, 300, 260, 132, 3, 11)
    for i in range(3):
        _check(out[i], As[i], B, Cs[i], 1.0, 1.0, f"{name} batch {i}")
    M, N, K = 1000, 777, 520
    A, B, C = inputs(M, N, K, 5)
    a, _, lda = operand(cp, A, layout_a, 4)
    b, _, ldb = operand(cp, B, layout_b, 4)
    c = cp.asarray(C)
    assert single(M, N, K, 2.0, a.data.ptr, lda, b.data.ptr, ldb, 0.0, c.data.ptr, N, None) == 0
    cp.cuda.runtime.deviceSynchronize()
    _check(c.get(), A, B, C, 2.0, 0.0, f"{name} {M}x{N}x{K}")
