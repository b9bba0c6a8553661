"""What a user typed comes back as typed: paths, spec text and database labels are printed
literally, never read as rich markup (`[draft]`, `br[/]x`) or emoji codes (`a:x:b`)."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

import gemmgen.gpu.bench
import gemmgen.cli.common
import gemmgen.gpu.runtime
import gemmgen.gpu.verify
from conftest import ROOT, SPECS_DIR
from gemmgen.cli import main
from gemmgen.gpu.runtime import DeviceInfo
from gemmgen.gpu.verify import CaseResult, CheckReport

# A folder a shell makes without complaint, each of which rich would mangle or choke on.
NAMES = ["br[/]x", "[draft]", "a:x:b", "[bold red]x[/] :thumbs_up:"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], env={"COLUMNS": "250"})


@pytest.mark.parametrize("name", NAMES)
def test_build_names_the_folder_it_wrote_into_as_typed(tmp_path, name):
    folder = tmp_path / name
    result = invoke("build", SPECS_DIR / "warptile.gemm", "-o", f"{folder}/", "--no-compile")
    assert result.exit_code == 0, (result.output, result.exception)
    assert f"wrote {folder}/warptile.cu and warptile.h" in result.output
    assert (folder / "warptile.cu").is_file() and (folder / "warptile.h").is_file()


@pytest.mark.parametrize("name", NAMES)
def test_a_spec_error_quotes_its_path_and_line_as_written(tmp_path, name):
    folder = tmp_path / name
    folder.mkdir(parents=True)
    spec = folder / f"{name.replace('/', '_')}.gemm"
    bad = "  warp 48 x 64   # [red]not red[/] :x: br[/]x"
    spec.write_text(f"kernel bad {{\n  block 128 x 128 x 8\n{bad}\n  thread 8 x 4\n}}\n")
    result = invoke("explain", spec)
    assert result.exit_code == 1, (result.output, result.exception)
    assert f"{spec}:3:" in result.output and f"3 | {bad}" in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", ["br[/]x", "[draft]", "a:x:b"])
def test_a_library_and_its_database_are_named_as_typed(tmp_path, name):
    folder = tmp_path / name
    db = tmp_path / f"{name.replace('/', '_')}.jsonl"
    shutil.copy(ROOT / "benchmarks" / "tuning" / "2026-11-23-h100-fp32-library.jsonl", db)
    result = invoke("build", SPECS_DIR / "fp32.gemm", "--from-db", db, "-o", f"{folder}/")
    assert result.exit_code == 0, (result.output, result.exception)
    assert f"wrote {folder}/fp32.cu (" in result.output and f"{folder}/fp32.json" in result.output
    assert f"from {db} (" in result.output.replace("\n", "")  # the table's title
    assert json.loads((folder / "fp32.json").read_text())["database"] == str(db)


@pytest.mark.parametrize("name", ["br[/]x", "[draft]", "a:x:b"])
def test_an_error_names_the_file_as_typed(tmp_path, name):
    folder = tmp_path / name
    folder.mkdir(parents=True)
    spec = folder / "w.gemm"
    shutil.copy(SPECS_DIR / "warptile.gemm", spec)
    result = invoke("build", spec, "-o", spec)  # its own input
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"error: refusing to write {spec}: it is an input" in result.output


@pytest.fixture
def fake_gpu(monkeypatch):
    class FakeKernel:
        def __init__(self, plan, *args, **kwargs):
            self.plan, self.name = plan, plan.launcher_name

    monkeypatch.setattr(gemmgen.cli.common, "require_gpu", lambda: None)
    monkeypatch.setattr(gemmgen.gpu.runtime, "Kernel", FakeKernel)
    info = DeviceInfo("Fake [b]GPU[/b] :x:", 0, (9, 0), 132, 1980000, "13.0", 50 << 20, 2619000, 5120)
    monkeypatch.setattr(gemmgen.gpu.runtime, "device_info", lambda ordinal=0: info)


def test_check_prints_its_table_title_and_messages_as_given(tmp_path, fake_gpu, monkeypatch):
    folder = tmp_path / "[draft]"
    folder.mkdir(parents=True)
    spec = folder / "a:x:b.gemm"
    shutil.copy(SPECS_DIR / "naive.gemm", spec)

    def check(kernel, cases, *, seed=None, problems=None, progress=None):
        report = CheckReport(kernel.name)
        report.results = [CaseResult(case, False, 9.0, 1.0, "worst C[3, 4] = nan [/] :x:") for case in cases]
        return report

    monkeypatch.setattr(gemmgen.gpu.verify, "check", check)
    result = invoke("check", spec, "--shapes", "5x7x3")
    assert result.exit_code == 1, (result.output, result.exception)
    assert f"gemmgen check {spec}" in result.output
    assert "worst C[3, 4] = nan [/] :x:" in result.output and "FAIL" in result.output
