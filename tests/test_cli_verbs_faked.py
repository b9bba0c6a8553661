"""check and bench as a user sees them, with the GPU faked at the library boundary (CPU only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import fake_device
import gemmgen
import gemmgen.gpu.bench
import gemmgen.cli
import gemmgen.cli.common
import gemmgen.gpu.runtime
import gemmgen.gpu.verify
from gemmgen.gpu.bench import BenchResult
from gemmgen.gpu.runtime import DeviceInfo
from gemmgen.gpu.verify import CaseResult, CheckReport

SPECS = Path(__file__).resolve().parent.parent / "specs"


class FakeKernel:
    def __init__(self, plan, *args, **kwargs):
        self.plan, self.name = plan, plan.launcher_name


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich tables wider than a terminal, so cells do not wrap
    monkeypatch.setattr(gemmgen.cli.common, "require_gpu", lambda: None)
    monkeypatch.setattr(gemmgen.gpu.runtime, "Kernel", FakeKernel)
    info = DeviceInfo("Fake GPU", 0, (9, 0), 132, 1980000, "13.0", 50 << 20, 2619000, 5120)
    monkeypatch.setattr(gemmgen.gpu.runtime, "device_info", lambda ordinal=0: info)
    monkeypatch.setattr(gemmgen.gpu.bench, "L2Flusher", lambda info: None)


def fake_check(failing_case=None):
    def check(kernel, cases, *, seed=None, problems=None, progress=None):
        report = CheckReport(kernel.name)
        for case in cases:
            ok = str(case) != failing_case
            report.results.append(CaseResult(case, ok, 0.5 if ok else 9.0, 1e-6,
                                             "" if ok else "worst C[3, 4] = nan, expected 1.0"))
            if progress:
                progress(case)
        return report
    return check


def test_check_prints_every_case_and_passes(fake_gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(gemmgen.gpu.verify, "check", fake_check())
    out = tmp_path / "check.json"
    result = CliRunner().invoke(gemmgen.cli.main, ["check", str(SPECS / "warptile.gemm"), "--quick",
                                                   "--layouts", "all", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "all cases passed" in result.output
    records = json.loads(out.read_text())
    assert len(records) == 4 * len(gemmgen.gpu.verify.QUICK_CASES)
    assert {r["layout"] for r in records} == {"A row, B row, C row", "A row, B col, C row",
                                              "A col, B row, C row", "A col, B col, C row"}


def test_check_fails_with_the_worst_element(fake_gpu, monkeypatch):
    monkeypatch.setattr(gemmgen.gpu.verify, "check", fake_check(failing_case="17x29x31 a=1.5 b=-0.75"))
    result = CliRunner().invoke(gemmgen.cli.main, ["check", str(SPECS / "naive.gemm"),
                                                   "--shapes", "5x7x3;17x29x31,alpha=1.5,beta=-0.75"])
    assert result.exit_code == 1
    assert "FAIL" in result.output and "worst C[3, 4] = nan" in result.output
    assert "some cases failed" in result.output


def test_bench_tabulates_every_shape(fake_gpu, monkeypatch, tmp_path):
    def bench(kernel, case, *, info=None, flusher=None, budget_s=0.5):
        return BenchResult(kernel.name, str(case), case.M, case.N, case.K, "A row, B row, C row",
                           2.0, 40.0, (1.9, 2.1), 1.8, 44.0, 90.0, 60.0, 10)
    monkeypatch.setattr(gemmgen.gpu.bench, "bench", bench)
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(gemmgen.cli.main, ["bench", str(SPECS / "hopper_simt.gemm"),
                                                   "--shapes", "1024x1024x1024;127x4099x1023",
                                                   "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "Fake GPU" in result.output and "127x4099x1023" in result.output
    record = json.loads(out.read_text())
    assert [r["shape"] for r in record["results"]] == ["1024x1024x1024", "127x4099x1023"]
    # a record says where and when it was measured, and with what
    meta = record["meta"]
    assert record["generator"] == "gemmgen" and meta["device"] == "Fake GPU" and meta["driver"] == "13.0"
    assert meta["gemmgen"] == gemmgen.__version__ and meta["commit"] and meta["date"].endswith(" UTC")
    assert meta["sm_count"] == 132 and meta["clock_mhz"] == 1980.0


def test_bench_records_the_commit_it_is_told(fake_gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(gemmgen.gpu.bench, "bench", lambda kernel, case, **_: BenchResult(
        kernel.name, str(case), case.M, case.N, case.K, "A row, B row, C row", 2.0, 40.0, (1.9, 2.1), 1.8,
        44.0, 90.0, 60.0, 10))
    monkeypatch.setenv("GEMMGEN_COMMIT", "abc1234")
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(gemmgen.cli.main, ["bench", str(SPECS / "naive.gemm"), "--shapes", "64x64x64",
                                                   "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["meta"]["commit"] == "abc1234"
    # and a second run may replace it: it is gemmgen's own record
    result = CliRunner().invoke(gemmgen.cli.main, ["bench", str(SPECS / "naive.gemm"), "--shapes", "64x64x64",
                                                   "--json", str(out)])
    assert result.exit_code == 0, result.output


def test_bad_shape_is_a_usage_error(fake_gpu):
    result = CliRunner().invoke(gemmgen.cli.main, ["bench", str(SPECS / "naive.gemm"), "--shapes", "12x12"])
    assert result.exit_code == 2
    assert "expected MxNxK" in result.output


# --- math modes: the real check and bench over tests/fake_device.py (CPU stand-ins for the GPU) ----

@pytest.fixture
def fake_device_gpu(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    return fake_device.install(monkeypatch)


def test_bench_of_a_tf32_kernel_shows_its_tf32_baseline_and_both_errors(fake_device_gpu, tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(gemmgen.cli.main, ["bench", str(SPECS / "tensorcore_tf32.gemm"),
                                                   "--shapes", "64x48x256;32x32x32,beta=0.5", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "cuBLAS TF32 TFLOP/s" in result.output and "% cuBLAS TF32" in result.output
    assert "cuBLAS FP32 rel err" in result.output
    records = json.loads(out.read_text())["results"]
    assert [r["baseline"] for r in records] == ["cuBLAS TF32", "cuBLAS TF32"]
    assert fake_device_gpu.cublas.compute_types[-1] == fake_device.CUBLAS_COMPUTE_32F_FAST_TF32
    for r in records:
        assert 1e-5 < r["rel_error"] < 1e-3 and 0 < r["cublas_fp32_rel_error"] < 1e-6
        row = next(line for line in result.output.splitlines() if r["shape"] in line)
        assert f"{r['rel_error']:.2e}" in row and f"{r['cublas_fp32_rel_error']:.2e}" in row


def test_bench_of_a_simt_kernel_keeps_cublas_fp32(fake_device_gpu, tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(gemmgen.cli.main, ["bench", str(SPECS / "warptile.gemm"),
                                                   "--shapes", "64x64x64", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "cuBLAS FP32 TFLOP/s" in result.output and "cuBLAS TF32" not in result.output
    (record,) = json.loads(out.read_text())["results"]
    assert record["baseline"] == "cuBLAS FP32" and record["percent_of_cublas"] == pytest.approx(50.0)
    assert fake_device_gpu.cublas.compute_types[-1] == fake_device.CUBLAS_COMPUTE_32F


def test_bench_of_kernels_of_two_math_modes_names_each_rows_baseline(fake_device_gpu, tmp_path):
    both = tmp_path / "both.gemm"
    both.write_text((SPECS / "warptile.gemm").read_text() + (SPECS / "tensorcore_tf32.gemm").read_text())
    result = CliRunner().invoke(gemmgen.cli.main, ["bench", str(both), "--shapes", "64x64x64"])
    assert result.exit_code == 0, result.output
    assert "% baseline" in result.output
    rows = {name: next(line for line in result.output.splitlines() if f"gemmgen_{name} " in line)
            for name in ("warptile", "tensorcore_tf32")}
    assert "cuBLAS FP32" in rows["warptile"] and "cuBLAS TF32" in rows["tensorcore_tf32"]


def test_check_header_states_the_tolerance_rule_of_the_math_mode(fake_device_gpu, tmp_path):
    out = tmp_path / "check.json"
    result = CliRunner().invoke(gemmgen.cli.main, ["check", str(SPECS / "tensorcore_tf32.gemm"),
                                                   "--shapes", "127x131x137,beta=0.5,pad=3;5x7x3",
                                                   "--seed", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert gemmgen.gpu.verify.tolerance_rule("tf32") in result.output.replace("\n", " ")
    records = json.loads(out.read_text())
    assert {r["math"] for r in records} == {"tf32"} and all(0 < r["worst_ratio"] <= 1 for r in records)
    row = next(line for line in result.output.splitlines() if "127x131x137" in line)
    assert f"{records[0]['max_relative_error']:.2e}" in row and f"{records[0]['worst_ratio']:.2g}" in row
