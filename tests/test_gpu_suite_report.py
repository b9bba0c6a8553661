""".ci/gpu_suite.py's BENCHMARKS.md section: baselines and accuracy, from records made up here (CPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gemmgen.language.load import load_one

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", ROOT / ".ci" / "gpu_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


META = {"date": "2030-01-01 00:00 UTC", "device": "Fake GPU", "driver_full": "999.1", "driver": "13.0",
        "commit": "abc1234", "fp32_peak": 66.9, "sm_count": 132, "clock_mhz": 1980}


def specs():
    return [load_one(ROOT / "specs" / f"{name}.gemm")
            for name in ("warptile", "hopper_simt", "tensorcore_tf32", "tensorcore_3xtf32")]


def bench_record(kernel, shape, baseline, tflops, cublas_tflops, rel_error, fp32_error):
    return {"kernel": f"gemmgen_{kernel}", "shape": shape, "ms": 1.0, "tflops": tflops,
            "cublas_tflops": cublas_tflops, "percent_of_cublas": 100 * tflops / cublas_tflops,
            "percent_of_peak": 50.0, "baseline": baseline, "rel_error": rel_error,
            "cublas_fp32_rel_error": fp32_error, "cublas_tf32_rel_error": 2.5e-4}


RESULTS = [
    bench_record("warptile", "4096x4096x4096", "cuBLAS FP32", 35.0, 50.0, 1.1e-7, 1.0e-7),
    bench_record("hopper_simt", "4096x4096x4096", "cuBLAS FP32", 45.0, 50.0, 1.2e-7, 1.0e-7),
    bench_record("tensorcore_tf32", "4096x4096x4096", "cuBLAS TF32", 300.0, 400.0, 2.4e-4, 1.0e-7),
    bench_record("tensorcore_tf32", "1024x1024x1024", "cuBLAS TF32", 100.0, 200.0, 2.3e-4, 0.9e-7),
]
ACCURACY = [
    {"kernel": "gemmgen_tensorcore_tf32", "shape": "4096x4096x4096", "math": "tf32", "rel_error": 2.4e-4,
     "max_rel_error": 1e-3, "cublas_fp32_rel_error": 1.0e-7, "cublas_fp32_max_rel_error": 1e-6,
     "cublas_tf32_rel_error": 2.5e-4, "cublas_tf32_max_rel_error": 1e-3, "ratio_to_fp32": 2400.0},
    {"kernel": "gemmgen_hopper_simt", "shape": "4096x4096x4096", "math": "simt", "rel_error": 1.2e-7,
     "max_rel_error": 1e-6, "cublas_fp32_rel_error": 1.0e-7, "cublas_fp32_max_rel_error": 1e-6,
     "cublas_tf32_rel_error": 2.5e-4, "cublas_tf32_max_rel_error": 1e-3, "ratio_to_fp32": 1.2},
]


def rows(text: str, heading: str) -> list[str]:
    """The table rows under a ### heading."""
    section = text.split(heading, 1)[1].split("\n### ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]


def test_every_benchmark_shows_its_baseline_and_both_relative_errors(suite):
    text = suite.benchmarks_markdown(META, specs(), [], RESULTS, ACCURACY)
    progression = rows(text, "### The seed progression at 4096x4096x4096")
    tf32 = next(r for r in progression if r.startswith("| tensorcore_tf32 "))
    assert "| TF32 |" in tf32 and "2.40e-04" in tf32 and "1.00e-07" in tf32 and "75.0%" in tf32
    assert "| FP32 |" in next(r for r in progression if r.startswith("| hopper_simt "))
    every = rows(text, "### Every spec at every shape: TFLOP/s")
    assert any(r.startswith("| **cuBLAS TF32** |") and "400.00" in r and "200.00" in r for r in every)
    assert any(r.startswith("| **cuBLAS FP32** |") and "50.00" in r for r in every)
    errors = rows(text, "### Every spec at every shape: relative error")
    assert "2.30e-04 (9.00e-08)" in next(r for r in errors if r.startswith("| tensorcore_tf32 "))
    assert "CUBLAS_COMPUTE_32F_FAST_TF32" in text


def test_cublas_gets_a_row_per_layout_it_ran_in(suite):
    # hopper_simt (B row-major) and hopper_3xtf32 (B col) both run beside cuBLAS FP32; each
    # kernel's percentage is of cuBLAS in its own layout, and so is the row that shows it.
    results = [dict(bench_record("hopper_simt", "4092x4092x4092", "cuBLAS FP32", 47.0, 47.9, 1e-6, 1e-6),
                    layout="A row, B row, C row"),
               dict(bench_record("tensorcore_3xtf32", "4092x4092x4092", "cuBLAS FP32", 120.0, 51.4, 5e-7, 1e-6),
                    layout="A row, B col, C row")]
    every = rows(suite.benchmarks_markdown(META, specs(), [], results), "### Every spec at every shape: TFLOP/s")
    assert "| **cuBLAS FP32**, A row, B row, C row | | 47.90 |" in every
    assert "| **cuBLAS FP32**, A row, B col, C row | | 51.40 |" in every
    assert "47.00 (98%)" in next(r for r in every if r.startswith("| hopper_simt "))


def test_accuracy_section_puts_each_math_mode_beside_cublas(suite):
    text = suite.benchmarks_markdown(META, specs(), [], RESULTS, ACCURACY)
    accuracy = rows(text, "### Accuracy at 4096x4096x4096")
    tf32 = next(r for r in accuracy if r.startswith("| tensorcore_tf32 "))
    assert tf32.split(" | ")[1:] == ["tf32", "2.40e-04", "1.00e-07", "2400.00", "2.50e-04 |"]
    assert "| 1.20 |" in next(r for r in accuracy if r.startswith("| hopper_simt "))


def test_records_from_before_the_accuracy_fields_still_render(suite):
    old = [{k: v for k, v in r.items() if k not in ("baseline", "rel_error", "cublas_fp32_rel_error",
                                                     "cublas_tf32_rel_error")} for r in RESULTS[:2]]
    text = suite.benchmarks_markdown(META, specs(), [], old)
    assert "### Accuracy" not in text
    assert "| **cuBLAS FP32** |" in text and "- (-)" in text


def test_accuracy_is_measured_for_every_non_simt_spec_and_the_best_simt_one(suite):
    assert [s.name for s in suite.accuracy_specs(specs())] == ["hopper_simt", "tensorcore_tf32", "tensorcore_3xtf32"]
