"""check and bench as a user sees them, with the GPU faked at the library boundary (CPU only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import gemmgen.bench
import gemmgen.cli
import gemmgen.runtime
import gemmgen.verify
from gemmgen.bench import BenchResult
from gemmgen.runtime import DeviceInfo
from gemmgen.verify import CaseResult, CheckReport

SPECS = Path(__file__).resolve().parent.parent / "specs"


class FakeKernel:
    def __init__(self, plan, *args, **kwargs):
        self.plan, self.name = plan, plan.launcher_name


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich tables wider than a terminal, so cells do not wrap
    monkeypatch.setattr(gemmgen.cli, "_require_gpu", lambda: None)
    monkeypatch.setattr(gemmgen.runtime, "Kernel", FakeKernel)
    info = DeviceInfo("Fake GPU", 0, (9, 0), 132, 1980000, "13.0", 50 << 20, 2619000, 5120)
    monkeypatch.setattr(gemmgen.runtime, "device_info", lambda ordinal=0: info)
    monkeypatch.setattr(gemmgen.bench, "L2Flusher", lambda info: None)


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
    monkeypatch.setattr(gemmgen.verify, "check", fake_check())
    out = tmp_path / "check.json"
    result = CliRunner().invoke(gemmgen.cli.main, ["check", str(SPECS / "warptile.gemm"), "--quick",
                                                   "--layouts", "all", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "all cases passed" in result.output
    records = json.loads(out.read_text())
    assert len(records) == 4 * len(gemmgen.verify.QUICK_CASES)
    assert {r["layout"] for r in records} == {"A row, B row, C row", "A row, B col, C row",
                                              "A col, B row, C row", "A col, B col, C row"}


def test_check_fails_with_the_worst_element(fake_gpu, monkeypatch):
    monkeypatch.setattr(gemmgen.verify, "check", fake_check(failing_case="17x29x31 a=1.5 b=-0.75"))
    result = CliRunner().invoke(gemmgen.cli.main, ["check", str(SPECS / "naive.gemm"),
                                                   "--shapes", "5x7x3;17x29x31,alpha=1.5,beta=-0.75"])
    assert result.exit_code == 1
    assert "FAIL" in result.output and "worst C[3, 4] = nan" in result.output
    assert "some cases failed" in result.output


def test_bench_tabulates_every_shape(fake_gpu, monkeypatch, tmp_path):
    def bench(kernel, case, *, info=None, flusher=None, budget_s=0.5):
        return BenchResult(kernel.name, str(case), case.M, case.N, case.K, "A row, B row, C row",
                           2.0, 40.0, (1.9, 2.1), 1.8, 44.0, 90.0, 60.0, 10)
    monkeypatch.setattr(gemmgen.bench, "bench", bench)
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(gemmgen.cli.main, ["bench", str(SPECS / "hopper_simt.gemm"),
                                                   "--shapes", "1024x1024x1024;127x4099x1023",
                                                   "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "Fake GPU" in result.output and "127x4099x1023" in result.output
    assert [r["shape"] for r in json.loads(out.read_text())] == ["1024x1024x1024", "127x4099x1023"]


def test_bad_shape_is_a_usage_error(fake_gpu):
    result = CliRunner().invoke(gemmgen.cli.main, ["bench", str(SPECS / "naive.gemm"), "--shapes", "12x12"])
    assert result.exit_code == 2
    assert "expected MxNxK" in result.output
