"""Each math mode's tolerance, cuBLAS baseline and measured accuracy, with the GPU faked (CPU only).

tests/fake_device.py stands in for CuPy, cuBLAS and the kernel on raw host addresses, so the
layouts, leading dimensions and pointer offsets that reach cuBLAS are checked as cuBLAS reads them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import gemmgen.gpu.baseline
import gemmgen.gpu.bench
import gemmgen.gpu.verify
from fake_device import (CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32, INFO, ReferenceKernel,
                         install, to_tf32)
from gemmgen.plan import make_plan
from gemmgen.language.load import load_one
from gemmgen.gpu.verify import Case

SPECS = Path(__file__).resolve().parent.parent / "specs"


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch)


SPEC_OF_MATH = {"simt": "warptile.gemm", "tf32": "tensorcore_tf32.gemm", "3xtf32": "tensorcore_3xtf32.gemm"}


def plan_of(math_mode: str):
    """A shipped kernel of this math mode (ReferenceKernel computes the ABI whatever the tiling)."""
    plan = make_plan(load_one(SPECS / SPEC_OF_MATH[math_mode]))
    assert plan.spec["math"] == math_mode
    return plan


# --- tolerance ---------------------------------------------------------------------------------

def test_tf32_tolerance_is_2_to_the_13_times_fp32s_and_3xtf32_keeps_fp32s():
    simt = gemmgen.gpu.verify.tolerance(1.0, 1023)
    assert gemmgen.gpu.verify.tolerance(1.0, 1023, "tf32") == pytest.approx(simt * 2 ** 13)
    assert gemmgen.gpu.verify.tolerance(1.0, 1023, math="3xtf32") == simt
    assert gemmgen.gpu.verify.tolerance(1.0, 4 * 1023 + 3) == pytest.approx(2 * simt)  # sqrt(K + 1) growth


def test_tolerance_rejects_an_unknown_math_mode_naming_the_known_ones():
    with pytest.raises(ValueError, match="simt, tf32, 3xtf32"):
        gemmgen.gpu.verify.tolerance(1.0, 10, "fp16")


def test_tolerance_rule_states_each_modes_unit_roundoff():
    assert "2^-24" in gemmgen.gpu.verify.tolerance_rule("simt")
    assert "2^-11" in gemmgen.gpu.verify.tolerance_rule("tf32")
    assert "2^-24" in gemmgen.gpu.verify.tolerance_rule("3xtf32")
    assert "math tf32" in gemmgen.gpu.verify.tolerance_rule("tf32")


def test_check_judges_a_tf32_result_by_the_tf32_rule(fake):
    # The same TF32-rounded results pass as a tf32 kernel and fail as an FP32 (simt) one.
    case = Case(127, 131, 137, alpha=1.5, beta=-0.5, pad=3, offset=1)
    tf32 = gemmgen.gpu.verify.check(ReferenceKernel(plan_of("tf32")), [case], seed=1)
    assert tf32.ok, tf32.failures
    simt = gemmgen.gpu.verify.check(ReferenceKernel(plan_of("simt"), tf32_inputs=True), [case], seed=1)
    assert not simt.ok and "tolerance" in simt.failures[0].message


def test_check_passes_an_fp32_result_under_3xtf32(fake):
    report = gemmgen.gpu.verify.check(ReferenceKernel(plan_of("3xtf32")), [Case(33, 65, 17, offset=1)], seed=2)
    assert report.ok, report.failures


# --- cuBLAS through the launcher's ABI -------------------------------------------------------------

LAYOUTS = [(a, b, c) for a in ("row", "col") for b in ("row", "col") for c in ("row", "col")]


@pytest.mark.parametrize("a_layout, b_layout, c_layout", LAYOUTS)
def test_cublas_gemm_computes_c_in_every_layout(fake, a_layout, b_layout, c_layout):
    # Column-major cuBLAS must compute the row- or column-major C of the launcher's ABI, with
    # padded leading dimensions and an offset pointer, or its baseline times a different product.
    cp = __import__("cupy")
    case = Case(37, 23, 19, alpha=0.5, beta=2.0, pad=3, offset=1)
    rng = np.random.default_rng(0)
    A, B, C = (rng.uniform(-1, 1, shape).astype(np.float32) for shape in ((37, 19), (19, 23), (37, 23)))
    buffers = {}
    for name, values, layout in (("A", A, a_layout), ("B", B, b_layout), ("C", C, c_layout)):
        buffers[name] = gemmgen.gpu.verify.place_matrix(cp, values, layout, case.pad, case.offset)
    address = {name: buf.data.ptr + 4 * case.offset for name, (buf, _) in buffers.items()}
    ld = {name: ld for name, (_, ld) in buffers.items()}
    gemmgen.gpu.baseline.cublas_gemm(case.M, case.N, case.K, case.alpha, address["A"], ld["A"], address["B"], ld["B"],
                              case.beta, address["C"], ld["C"], {"A": a_layout, "B": b_layout, "C": c_layout})
    out = gemmgen.gpu.verify.matrix_view(cp, buffers["C"][0], 37, 23, c_layout, ld["C"], case.offset)
    expected = 0.5 * (A.astype(np.float64) @ B) + 2.0 * C
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5)
    assert fake.cublas.compute_types == [CUBLAS_COMPUTE_32F]


def test_cublas_gemm_asks_for_tf32_only_when_told(fake):
    cp = __import__("cupy")
    a, b, c = (cp.zeros((4, 4), dtype=cp.float32) for _ in range(3))
    layouts = {"A": "row", "B": "row", "C": "row"}
    for tf32 in (False, True):
        gemmgen.gpu.baseline.cublas_gemm(4, 4, 4, 1.0, a.data.ptr, 4, b.data.ptr, 4, 0.0, c.data.ptr, 4, layouts, tf32=tf32)
    assert fake.cublas.compute_types == [CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32]


# --- bench: the baseline follows the math mode ----------------------------------------------------

@pytest.mark.parametrize("math_mode, baseline, compute_type", [
    ("simt", "cuBLAS FP32", CUBLAS_COMPUTE_32F),
    ("tf32", "cuBLAS TF32", CUBLAS_COMPUTE_32F_FAST_TF32),
    ("3xtf32", "cuBLAS FP32", CUBLAS_COMPUTE_32F),
])
def test_bench_times_the_baseline_of_the_math_mode(fake, math_mode, baseline, compute_type):
    kernel = ReferenceKernel(plan_of(math_mode))
    result = gemmgen.gpu.bench.bench(kernel, Case(96, 80, 64), info=INFO)
    assert result.baseline == baseline
    assert fake.cublas.compute_types[-1] == compute_type  # the timed call comes last
    assert result.percent_of_cublas == pytest.approx(50.0)  # baseline 1 ms, kernel 2 ms
    assert result.as_dict()["baseline"] == baseline


def test_bench_reports_the_kernels_error_beside_cublas_fp32s_on_its_inputs(fake):
    tf32 = gemmgen.gpu.bench.bench(ReferenceKernel(plan_of("tf32")), Case(128, 96, 256, beta=0.5, pad=2), info=INFO)
    fp32 = gemmgen.gpu.bench.bench(ReferenceKernel(plan_of("simt")), Case(128, 96, 256, beta=0.5, pad=2), info=INFO)
    for r in (tf32, fp32):
        assert 0 < r.cublas_fp32_rel_error < 1e-6
        assert 1e-5 < r.cublas_tf32_rel_error < 1e-3
        assert r.max_rel_error > 0
    assert 1e-5 < tf32.rel_error < 1e-3                      # TF32 inputs: ~2^-11 relative
    assert fp32.rel_error < 10 * fp32.cublas_fp32_rel_error  # FP32: as cuBLAS FP32
    assert set(tf32.as_dict()) >= {"rel_error", "max_rel_error", "cublas_fp32_rel_error",
                                   "cublas_tf32_rel_error", "cublas_tflops", "percent_of_cublas"}


def test_bench_result_reads_records_from_before_the_accuracy_fields():
    old = {"kernel": "k", "shape": "8x8x8", "M": 8, "N": 8, "K": 8, "layout": "A row, B row, C row", "ms": 1.0,
           "tflops": 1.0, "spread_ms": (1.0, 1.0), "cublas_ms": 1.0, "cublas_tflops": 1.0,
           "percent_of_cublas": 100.0, "percent_of_peak": 1.0, "runs": 5}
    result = gemmgen.gpu.bench.BenchResult(**old)
    assert result.baseline == "cuBLAS FP32" and math.isnan(result.rel_error)


def test_baseline_for_each_math_mode():
    assert [gemmgen.gpu.baseline.baseline_for(m) for m in ("simt", "tf32", "3xtf32")] == \
        ["cuBLAS FP32", "cuBLAS TF32", "cuBLAS FP32"]
    with pytest.raises(ValueError):
        gemmgen.gpu.baseline.baseline_for("bf16")


# --- the accuracy record --------------------------------------------------------------------------

def test_measure_accuracy_puts_tf32_beside_cublas_tf32_and_simt_beside_fp32(fake):
    shape = Case(64, 48, 512)
    tf32 = gemmgen.gpu.verify.measure_accuracy(ReferenceKernel(plan_of("tf32")), shape, seed=3)
    simt = gemmgen.gpu.verify.measure_accuracy(ReferenceKernel(plan_of("simt")), shape, seed=3)
    assert tf32.math == "tf32" and simt.math == "simt" and tf32.shape == "64x48x512"
    # The same inputs for all three, so a TF32 kernel lands on cuBLAS TF32's error, far above FP32's.
    assert tf32.rel_error == pytest.approx(tf32.cublas_tf32_rel_error, rel=0.2)
    assert tf32.ratio_to_fp32 > 100
    assert simt.ratio_to_fp32 < 10
    assert simt.cublas_fp32_rel_error == tf32.cublas_fp32_rel_error
    record = tf32.as_dict()
    assert record["ratio_to_fp32"] == tf32.ratio_to_fp32
    assert set(record) == {"kernel", "shape", "math", "rel_error", "max_rel_error", "cublas_fp32_rel_error",
                           "cublas_fp32_max_rel_error", "cublas_tf32_rel_error", "cublas_tf32_max_rel_error",
                           "ratio_to_fp32"}


def test_an_unwritten_element_makes_the_error_infinite(fake):
    class SkipsOneElement(ReferenceKernel):
        def launch(self, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, **kwargs):
            super().launch(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, **kwargs)
            from fake_device import matrix_at
            matrix_at(C, 1, 1, 1, 1)[0, 0] = np.nan
    accuracy = gemmgen.gpu.verify.measure_accuracy(SkipsOneElement(plan_of("simt")), Case(8, 8, 8))
    assert math.isinf(accuracy.rel_error) and math.isinf(accuracy.max_rel_error)
    assert accuracy.cublas_fp32_rel_error < 1e-6


def test_relative_errors_are_frobenius_and_max_norm_ratios(fake):
    cp = __import__("cupy")
    reference = np.array([[3.0, 0.0], [0.0, 4.0]])
    out = np.array([[3.0, 0.5], [0.0, 4.0]], dtype=np.float32)
    assert gemmgen.gpu.verify.relative_errors(cp, out, reference) == pytest.approx((0.5 / 5.0, 0.5 / 4.0))
    assert gemmgen.gpu.verify.relative_errors(cp, np.zeros((0, 3), np.float32), np.zeros((0, 3))) == (0.0, 0.0)


def test_tf32_rounding_of_the_fake_keeps_10_mantissa_bits():
    # The fakes' TF32 model, on which the figures above rest: 1 + 2^-10 survives, 1 + 2^-12 does not.
    assert to_tf32(np.float32(1 + 2 ** -10)) == np.float32(1 + 2 ** -10)
    assert to_tf32(np.float32(1 + 2 ** -12)) == np.float32(1.0)
