"""Ctrl-C ends every verb with exit status 130 (the shell's), one line on stderr, no traceback
(not even a worker process's), and nothing half-written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

import gemmgen.gpu.bench
import gemmgen.cli.common
import gemmgen.codegen.cuda
import gemmgen.explain.report
import gemmgen.gpu.profile
import gemmgen.tuning.replay
import gemmgen.gpu.runtime
import gemmgen.tuning.tune
import gemmgen.gpu.verify
from conftest import ROOT, SPECS_DIR
from gemmgen.cli import main
from gemmgen.gpu.runtime import DeviceInfo

MESSAGE = "error: interrupted: no output was left half-written"


def pressed(*args, **kwargs):
    raise KeyboardInterrupt


# verb: (arguments, the function that is running when Ctrl-C comes)
VERBS = {
    "build": (["build", SPECS_DIR / "warptile.gemm", "--no-compile"], (gemmgen.codegen.cuda, "generate")),
    "explain": (["explain", SPECS_DIR / "warptile.gemm"], (gemmgen.explain.report, "explain")),
    "check": (["check", SPECS_DIR / "warptile.gemm", "--quick"], (gemmgen.gpu.verify, "check")),
    "bench": (["bench", SPECS_DIR / "warptile.gemm", "--shapes", "64x64x64"], (gemmgen.gpu.bench, "bench")),
    "tune": (["tune", "tiny_search.gemm", "--shapes", "64x64x64"], (gemmgen.tuning.tune, "tune")),
    "replay": (["replay", SPECS_DIR / "hopper_tc_search.gemm", "--shape", "2048x2048x2048", "--strategy", "model",
                "--db", ROOT / "benchmarks" / "tuning" / "2026-11-23-h100-testbed-hopper_tc_search.jsonl"],
               (gemmgen.tuning.replay, "replay")),
    "profile": (["profile", SPECS_DIR / "warptile.gemm"], (gemmgen.gpu.profile, "profile")),
}


def test_every_verb_is_covered():
    assert set(VERBS) == set(main.commands)


@pytest.mark.parametrize("verb", list(VERBS))
def test_ctrl_c_exits_130_with_one_line(verb, monkeypatch, tmp_path):
    args, (module, name) = VERBS[verb]
    monkeypatch.chdir(tmp_path)  # outputs (generated/, tune.jsonl) land here, if anywhere
    (tmp_path / "tiny_search.gemm").write_text("kernel tiny_search {\n  block {32, 64} x 64 x 8\n  thread 4 x 4\n}\n")
    monkeypatch.setattr(gemmgen.cli.common, "require_gpu", lambda: None)
    info = DeviceInfo("Fake GPU", 0, (9, 0), 132, 1980000, "13.0", 50 << 20, 2619000, 5120)
    monkeypatch.setattr(gemmgen.gpu.runtime, "device_info", lambda ordinal=0: info)
    monkeypatch.setattr(gemmgen.gpu.runtime, "Kernel", lambda plan, *a, **k: plan)
    monkeypatch.setattr(gemmgen.gpu.bench, "L2Flusher", lambda info: None)
    monkeypatch.setattr(module, name, pressed)
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 130, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith(MESSAGE), result.output
    assert "Traceback" not in result.output
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]


def interrupt(args: list[str], tmp_path, after_s: float) -> subprocess.CompletedProcess:
    """Run gemmgen in a process of its own and press Ctrl-C (SIGINT) after `after_s` seconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GEMMGEN_CACHE": str(tmp_path / "cache")}  # compiles take time
    process = subprocess.Popen([sys.executable, "-m", "gemmgen.cli", *args], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(after_s)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def test_ctrl_c_during_a_library_build_leaves_no_file_behind(tmp_path):
    out = tmp_path / "out"
    run = interrupt(["build", "specs/fp32.gemm", "--from-db",
                     "benchmarks/tuning/2026-11-23-h100-fp32-library.jsonl", "-o", f"{out}/"], tmp_path, 1.5)
    if run.returncode == 0:  # a machine fast enough to finish first: the whole set is there
        assert sorted(p.name for p in out.iterdir()) == ["fp32.cu", "fp32.h", "fp32.json"]
        return
    assert run.returncode == 130, (run.stdout, run.stderr)
    assert run.stderr.strip().splitlines() == [run.stderr.strip()] and run.stderr.strip().startswith(MESSAGE)
    assert not out.exists() or not list(out.iterdir())  # interrupted before it wrote: nothing at all


def test_ctrl_c_during_a_replay_in_worker_processes_prints_no_worker_traceback(tmp_path):
    # 200 seeds: a run of minutes, so that the signal lands mid-replay on a fast machine too (with the
    # default 20, a fast one finished first and took the signal while shutting down)
    run = interrupt(["replay", "--testbed", "--strategy", "model", "--jobs", "2", "--seeds", "200", "--markdown",
                     str(tmp_path / "replay.md")], tmp_path, 4.0)
    assert run.returncode == 130, (run.stdout, run.stderr)
    assert run.stderr.strip().splitlines() == [run.stderr.strip()], run.stderr  # one line (a progress bar
    assert run.stderr.strip().startswith(MESSAGE), run.stderr                     # may leave a newline before it)
    assert "KeyboardInterrupt" not in run.stderr and not (tmp_path / "replay.md").exists()
