"""benchmarks/library_candidates.py (a diagnosis: every candidate of a library timed at a few shapes)
and judge_library_choice.py (the choice judged offline) run on the faked GPU of library_fake.py: the
first times each candidate and cuBLAS once, ranks them, and resumes from its database; the second
reports the library's leave-one-out and, at the candidates' shapes, the chosen member against the best."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from gemmgen.library.manifest import build_manifest
from gemmgen.library.resolve import load_libraries
from gemmgen.library.tune import tune_library
from library_fake import FakeGpu

ROOT = Path(__file__).resolve().parent.parent


def script(name: str):
    """A benchmark script as a module, loaded from its file: benchmarks/ stays off sys.path, where its
    records' folder benchmarks/torch would pass for a torch package in the tests collected after."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


library_candidates = script("library_candidates")
judge_library_choice = script("judge_library_choice")


def call(script_module, monkeypatch, capsys, *argv) -> str:
    """A script's main() with these arguments; what it printed."""
    monkeypatch.setattr(sys, "argv", [f"{script_module.__name__}.py", *argv])
    assert script_module.main() == 0
    return capsys.readouterr().out


def run(monkeypatch, capsys, *argv) -> str:
    return call(library_candidates, monkeypatch, capsys, *argv)


def run_judge(monkeypatch, capsys, *argv) -> str:
    return call(judge_library_choice, monkeypatch, capsys, *argv)


def test_every_candidate_is_timed_once_and_ranked_beside_cublas(monkeypatch, capsys, tmp_path):
    gpu = FakeGpu(tmp_path / "measured.log").install(monkeypatch)
    monkeypatch.setattr(library_candidates, "compile_all", lambda plans: None)
    db = tmp_path / "candidates.jsonl"
    out = run(monkeypatch, capsys, "tf32", "5x7000x3000", "--out", str(db), "--top", "3")
    (library,) = load_libraries(ROOT / "specs" / "tf32.gemm")
    timed = [t for t in gpu.tasks if t.what == "5x7000x3000"]
    assert sum(t.kind == "baseline" for t in timed) == 1
    assert len({t.key for t in timed if t.kind == "time"}) == len(library.candidates())
    lines = out.splitlines()
    assert lines[0].startswith("== 5x7000x3000: cuBLAS TF32 ")
    ranked = [float(line.split()[0]) for line in lines[1:]]
    assert len(ranked) == 3 and ranked == sorted(ranked)       # the fastest three, fastest first
    assert all(re.fullmatch(r" +[0-9.]+ us +[0-9.]+x  lib_tf32_\w+ (block|decode)=.*", line) for line in lines[1:])
    again = FakeGpu(tmp_path / "again.log").install(monkeypatch)
    assert run(monkeypatch, capsys, "tf32", "5x7000x3000", "--out", str(db), "--top", "3") == out
    assert again.tasks == []                                   # resumed: nothing timed twice


def test_a_shape_that_is_not_mxnxk_is_refused_before_any_work(monkeypatch, capsys, tmp_path):
    with pytest.raises(SystemExit):
        run(monkeypatch, capsys, "tf32", "5x7000", "--out", str(tmp_path / "db"))
    assert "'5x7000' is not MxNxK" in capsys.readouterr().err
    assert not (tmp_path / "db").exists()


def test_the_judge_reports_leave_one_out_and_the_choice_at_held_out_calls(monkeypatch, capsys, tmp_path):
    FakeGpu(tmp_path / "measured.log").install(monkeypatch)
    monkeypatch.setattr(library_candidates, "compile_all", lambda plans: None)
    (library,) = load_libraries(ROOT / "specs" / "fp32.gemm")
    db, held = tmp_path / "fp32.jsonl", tmp_path / "held.jsonl"
    tune_library(library, db=db)
    run(monkeypatch, capsys, "fp32", "300x5000x700", "--out", str(held))
    out = run_judge(monkeypatch, capsys, "fp32", "--db", str(db), "--candidates", str(held))
    loo = build_manifest(library, db).leave_one_out.per_shape
    first = out.splitlines()[0]
    assert f"leave-one-out over {len(loo)} tuned calls" in first
    assert f"above 1.05 at {sum(r > 1.05 for r in loo.values())}, worst {max(loo.values()):.3f}" in first
    (row,) = [line.split() for line in out.splitlines() if line.strip().startswith("300x5000x700")]
    chosen, best_member, best_candidate = float(row[2]), float(row[4]), float(row[6])
    assert row[1].startswith("fp32_") and chosen <= best_member <= best_candidate


def test_the_judge_refuses_a_missing_database(monkeypatch, capsys, tmp_path):
    with pytest.raises(SystemExit):
        run_judge(monkeypatch, capsys, "tf32", "--db", str(tmp_path / "none.jsonl"))
    assert "none.jsonl: no such database" in capsys.readouterr().err


@pytest.mark.parametrize("which", ["candidates", "judge"])
def test_a_file_that_is_no_tuning_database_gets_a_clear_error(monkeypatch, capsys, tmp_path, which):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"not a record\n')
    with pytest.raises(SystemExit):
        if which == "candidates":
            run(monkeypatch, capsys, "tf32", "5x7000x3000", "--out", str(bad))
        else:
            run_judge(monkeypatch, capsys, "tf32", "--db", str(bad))
    assert "bad.jsonl" in capsys.readouterr().err and bad.read_text() == '{"not a record\n'  # left as it was
