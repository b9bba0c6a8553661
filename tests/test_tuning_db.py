"""The tuning database's one reader: every database in benchmarks/ reads, and a malformed one, or
a record whose label names another point, is refused with the file and line (no traceback) by
every command that takes one: build --from-db (a space and a library), replay --db, tune --db."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import gemmgen.cli.common
import gemmgen.tuning.tune
from conftest import ROOT, SPECS_DIR
from gemmgen.tuning import database as tuning_db
from gemmgen.cli import main
from gemmgen.plan.space import describe, expand, point_key
from gemmgen.language.load import load

BENCHMARK_DBS = sorted((ROOT / "benchmarks").rglob("*.jsonl"))
TC_DB = ROOT / "benchmarks" / "tuning" / "2026-11-23-h100-testbed-hopper_tc_search.jsonl"  # at 2048^3
FP32_DB = ROOT / "benchmarks" / "tuning" / "2026-11-23-h100-fp32-library.jsonl"
TC_SPEC = str(SPECS_DIR / "hopper_tc_search.gemm")


def invoke(*args) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(result, *words: str) -> None:
    """Exit 1 through sys.exit, no traceback, and a message holding every word."""
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.output, (word, result.output)


def search_spaces() -> dict:
    """Every search space of specs/ and benchmarks/experiments/, by name."""
    found = {}
    for path in sorted(SPECS_DIR.glob("*.gemm")) + sorted((ROOT / "benchmarks").rglob("*.gemm")):
        for spec in load(path):
            if not spec.is_concrete:
                found.setdefault(spec.name, spec)
    return found


# --- every database we ship reads, and its labels name its points ---------------------------------

def test_every_database_in_benchmarks_reads_and_its_labels_hold():
    from gemmgen.cli import library as cli_library
    from gemmgen.library.resolve import load_libraries

    assert len(BENCHMARK_DBS) >= 20
    spaces = search_spaces()
    libraries = {lib.name: lib for lib in load_libraries(SPECS_DIR / "fp32.gemm") + load_libraries(SPECS_DIR / "tf32.gemm")}
    checked = 0
    for db in BENCHMARK_DBS:
        records = tuning_db.read(db)
        assert len(records) == len(db.read_text().splitlines()), db  # every line is a record
        names = {entry["scope"].split("|")[3] for _, entry in records}
        for name in names:
            if name in libraries:
                cli_library.check_labels(libraries[name], db)
                checked += 1
            elif name in spaces:
                space = expand(spaces[name])
                labels = {point_key(p.spec): describe(p.spec) for p in space.plans}
                tuning_db.check_labels(db, records, labels, space=name)
                checked += sum(entry["key"] in labels for _, entry in records)
    assert checked > 2000  # the labels of thousands of records were compared with today's points


def test_a_label_older_than_todays_describe_holds_but_one_naming_another_point_does_not():
    today = "block=128x128x16 warp=32x64 thread=8x4r1x2 vec=A4B4 stages=2 frag=2 group=4 staged"
    assert tuning_db.contradiction("block=128x128x16 warp=32x64 thread=8x4r1x2 stages=2 frag=2 group=4 staged",
                                   today) is None  # recorded before vec= was in labels
    assert "block=64x128x16" in tuning_db.contradiction(today.replace("block=128", "block=64"), today)
    assert "staged" in tuning_db.contradiction(today.replace(" staged", ""), today)
    assert "split=2" in tuning_db.contradiction(today + " split=2", today)  # split 1 is left out of labels
    assert tuning_db.contradiction(today + " split=1", today) is None


# --- malformed databases: a clear error naming the file and line, from every reader ----------------

def record(**fields) -> dict:
    base = {"scope": "NVIDIA H100 80GB HBM3|13.0|2048x2048x2048|hopper_tc_search", "key": "cublas",
            "point": "cuBLAS TF32", "status": "ok", "ms": 0.05, "tflops": 340.0}
    return {**base, **fields}


def lines(*entries) -> str:
    return "".join(json.dumps(e) + "\n" for e in entries)


MALFORMED = {
    # name: (content, what the error says)
    "random bytes": (random.Random(25).randbytes(3000), ":1: not UTF-8 text"),
    "a JSON array": (json.dumps([record(), record()]), ":1: a JSON array, not a record"),
    "an indented JSON array": (json.dumps([record()], indent=1), ":1: not JSON"),
    "a time that is no number": (lines(record(), record(key="k1", ms="fast")), ":2: 'ms' is \"fast\""),
    "a NaN time": (lines(record(), record(key="k1", ms=float("nan"))), ":2: 'ms' is nan"),
    "a negative TFLOP/s": (lines(record(tflops=-3.0)), ":1: 'tflops' is -3.0"),
    "a scope of three parts": (lines(record(scope="H100|13.0|hopper_tc_search")), ":1: 'scope' is"),
    "a key that is a number": (lines(record(), record(key=7)), ":2: 'key' is 7"),
    "a timing with no time": (lines(record(), {k: v for k, v in record(key="k2").items() if k != "ms"}),
                              ":2: a timing with status ok and no 'ms'"),
    "a line of prose": (lines(record()) + "my notes on this run\n", ":2: not JSON"),
}


def write(path: Path, content) -> Path:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


@pytest.mark.parametrize("case", list(MALFORMED))
def test_build_from_db_names_the_file_and_line_of_a_malformed_database(tmp_path, case):
    content, message = MALFORMED[case]
    db = write(tmp_path / "bad.jsonl", content)
    before = db.read_bytes()
    refused(invoke("build", TC_SPEC, "--from-db", db, "--shape", "2048x2048x2048", "-o", tmp_path / "out/"),
            f"{db}{message}")
    refused(invoke("build", SPECS_DIR / "fp32.gemm", "--from-db", db, "-o", tmp_path / "out/"),
            f"{db}{message}")  # a library reads it the same way
    assert not (tmp_path / "out").exists() and db.read_bytes() == before


@pytest.mark.parametrize("case", ["random bytes", "a JSON array", "a time that is no number"])
def test_replay_names_the_file_and_line_of_a_malformed_database(tmp_path, case):
    content, message = MALFORMED[case]
    db = write(tmp_path / "bad.jsonl", content)
    refused(invoke("replay", TC_SPEC, "--shape", "2048x2048x2048", "--db", db, "--db", TC_DB,
                   "--strategy", "model", "--seeds", "1"), f"{db}{message}")


@pytest.fixture
def no_gpu_needed(monkeypatch):
    monkeypatch.setattr(gemmgen.cli.common, "require_gpu", lambda: None)


@pytest.mark.parametrize("case", ["random bytes", "a JSON array", "a time that is no number"])
def test_tune_refuses_a_malformed_database_before_any_work(tmp_path, no_gpu_needed, monkeypatch, case):
    content, message = MALFORMED[case]
    db = write(tmp_path / "bad.jsonl", content)
    monkeypatch.setattr(gemmgen.tuning.tune, "tune", lambda *a, **k: pytest.fail("tuned with a malformed database"))
    refused(invoke("tune", TC_SPEC, "--db", db), f"{db}{message}")
    refused(invoke("tune", SPECS_DIR / "fp32.gemm", "--db", db, "-o", tmp_path / "out/"), f"{db}{message}")
    assert db.read_bytes() == (content if isinstance(content, bytes) else content.encode())


def test_a_fifo_is_refused_at_once_not_read_forever(tmp_path):
    fifo = tmp_path / "db.jsonl"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args in (["build", TC_SPEC, "--from-db", str(fifo), "-o", str(tmp_path / "out/")],
                 ["replay", TC_SPEC, "--shape", "2048x2048x2048", "--db", str(fifo)]):
        run = subprocess.run([sys.executable, "-m", "gemmgen.cli", *args], capture_output=True, text=True,
                             timeout=60, env=env, cwd=tmp_path)
        assert run.returncode == 1 and f"{fifo} is not a regular file" in run.stderr, run.stderr
        assert "Traceback" not in run.stderr


# --- labels: a record that names another point than its key's is refused --------------------------

def swapped_labels(tmp_path) -> tuple[Path, int]:
    """TC_DB with the fastest and the slowest record's keys swapped: each label now names the
    other's point. Returns the copy and the line of the fastest record."""
    entries = [json.loads(line) for line in TC_DB.read_text().splitlines()]
    timed = [i for i, e in enumerate(entries) if e["key"] != "cublas" and e["status"] == "ok"]
    fast, slow = max(timed, key=lambda i: entries[i]["tflops"]), min(timed, key=lambda i: entries[i]["tflops"])
    entries[fast]["key"], entries[slow]["key"] = entries[slow]["key"], entries[fast]["key"]
    db = write(tmp_path / "swapped.jsonl", lines(*entries))
    return db, min(fast, slow) + 1


def test_a_record_whose_label_names_another_point_is_refused_by_build_and_replay(tmp_path):
    db, line = swapped_labels(tmp_path)
    out = tmp_path / "out"
    refused(invoke("build", TC_SPEC, "--from-db", db, "--shape", "2048x2048x2048", "-o", out / ""),
            f"{db}:{line}: the record of point", "is labelled", "delete the line")
    assert not out.exists()
    refused(invoke("replay", TC_SPEC, "--shape", "2048x2048x2048", "--db", db, "--strategy", "model",
                   "--seeds", "1"), f"{db}:{line}:")
    # The same database unswapped builds the point its fastest record names.
    good = invoke("build", TC_SPEC, "--from-db", TC_DB, "--shape", "2048x2048x2048", "-o", out / "", "--no-compile")
    assert good.exit_code == 0, good.output
    assert "best recorded point block=128x256x32 math=tf32" in good.output


def test_a_library_record_whose_label_names_another_candidate_is_refused(tmp_path):
    entries = FP32_DB.read_text().splitlines()
    number, first = next((n, json.loads(t)) for n, t in enumerate(entries)
                         if "|validation|" in t and '"status": "ok"' in t)
    entries[number] = json.dumps({**first, "point": first["point"].replace("block=", "block=1", 1)})
    db = write(tmp_path / "fp32.jsonl", "\n".join(entries) + "\n")
    refused(invoke("build", SPECS_DIR / "fp32.gemm", "--from-db", db, "-o", tmp_path / "out/"),
            f"{db}:{number + 1}: the record of point {first['key']}")
    assert not (tmp_path / "out").exists()


# --- the writer: an interrupted append costs only its own line -----------------------------------

def test_a_line_cut_short_stays_its_own_line_and_is_skipped(tmp_path):
    db = tmp_path / "tune.jsonl"
    tuning_db.append(db, record())
    with db.open("a") as handle:
        handle.write(json.dumps(record(key="cut"))[:40])  # killed mid-append: no newline
    tuning_db.append(db, record(key="after"))
    assert [e["key"] for _, e in tuning_db.read(db)] == ["cublas", "after"]
    assert db.read_text().splitlines()[1].startswith('{"scope"')
    write(db, json.dumps(record())[:30])  # nothing but a cut line: no database
    with pytest.raises(tuning_db.DatabaseError, match="holds no complete record"):
        tuning_db.read(db)


def test_a_library_timing_gets_its_tflops_from_its_shape(tmp_path):
    db = write(tmp_path / "lib.jsonl", lines({"scope": "H100|13.0|1024x2048x512+3|fp32", "key": "k",
                                              "status": "ok", "ms": 0.5}))
    (_, entry), = tuning_db.read(db)
    assert entry["tflops"] == pytest.approx(2 * 1024 * 2048 * 512 / 0.5e-3 / 1e12)
