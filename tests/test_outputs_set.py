"""A library's .cu, .h and manifest are replaced as a set: killed at any moment, a build leaves the
old three or the new three as a reader sees them (outputs.write_set, outputs.complete_pending),
never a new .cu beside an old manifest."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, SPECS_DIR
from gemmgen.outputs import OutputError, complete_pending, journal_of, write_set

FP32_DB = ROOT / "benchmarks" / "tuning" / "2026-11-23-h100-fp32-library.jsonl"

# Writes sets A and B in turn, for ever: each file of a set holds its letter many times over (big
# enough that writing a set takes a while), the manifest last, as build writes a library.
WRITER = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from gemmgen.outputs import write_set
folder = Path(sys.argv[2])
sizes = {"lib.cu": 1 << 20, "lib.h": 1 << 18, "lib.json": 1 << 19}
n = 0
while True:
    letter = "AB"[n % 2]
    write_set([(folder / name, letter * size) for name, size in sizes.items()], anchor=folder / "lib.json")
    n += 1
    print(n, flush=True)
"""


def letters(folder: Path) -> set[str]:
    """The letters the set's files hold (a file is one letter repeated)."""
    found = set()
    for name in ("lib.cu", "lib.h", "lib.json"):
        data = (folder / name).read_bytes()
        assert data and data == data[:1] * len(data), f"{name} is half written"
        found.add(data[:1].decode())
    return found


def test_a_set_killed_at_random_moments_is_whole_for_its_next_reader(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    folder = tmp_path / "out"
    folder.mkdir()
    chance = random.Random(3)
    seen_journal = 0
    for kill in range(25):
        writer = subprocess.Popen([sys.executable, str(script), str(ROOT), str(folder)],
                                  stdout=subprocess.PIPE, text=True)
        writer.stdout.readline()  # one set written whole: the files exist from here on
        time.sleep(chance.uniform(0.0, 0.15))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        writer.stdout.close()
        seen_journal += journal_of(folder / "lib.json").exists()
        complete_pending(folder / "lib.json")  # what every reader of a library does first
        assert len(letters(folder)) == 1, f"kill {kill}: the .cu, .h and manifest are of different sets"
        assert not journal_of(folder / "lib.json").exists()
    # Leftover temporaries of sets killed before their commit: never the files themselves.
    for path in folder.iterdir():
        assert path.name in ("lib.cu", "lib.h", "lib.json") or ".tmp" in path.name, path


def test_a_journal_names_only_gemmgens_temporary_files(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("mine")
    journal_of(tmp_path / "lib.json").write_text(json.dumps({"format": 1, "renames": [
        [str(victim), str(tmp_path / "lib.cu")]]}))
    with pytest.raises(OutputError, match="which gemmgen never writes"):
        complete_pending(tmp_path / "lib.json")
    assert victim.read_text() == "mine" and not (tmp_path / "lib.cu").exists()


def test_a_set_interrupted_before_its_commit_leaves_the_old_files_and_no_temporaries(tmp_path, monkeypatch):
    import gemmgen.outputs as outputs
    paths = [tmp_path / "lib.cu", tmp_path / "lib.h", tmp_path / "lib.json"]
    write_set([(p, "old") for p in paths], anchor=paths[2])

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(outputs, "write_atomic", interrupted)  # the journal's commit
    with pytest.raises(KeyboardInterrupt):
        write_set([(p, "new") for p in paths], anchor=paths[2])
    assert [p.read_text() for p in paths] == ["old"] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lib.cu", "lib.h", "lib.json"]


# --- the real thing: gemmgen build of a library, killed with SIGKILL while it writes ---------------

def variant(tmp_path: Path, letter: str) -> tuple[Path, Path]:
    """specs/ copied with `# variant X` in fp32.gemm's library block (its .cu quotes the block), and
    a copy of the database named after X (the manifest names its database)."""
    specs = tmp_path / f"specs_{letter}"
    shutil.copytree(SPECS_DIR, specs)
    spec = specs / "fp32.gemm"
    spec.write_text(spec.read_text().replace("library fp32 {", f"library fp32 {{  # variant {letter}"))
    db = tmp_path / f"fp32_{letter}.jsonl"
    shutil.copy(FP32_DB, db)
    return spec, db


def variant_of(out: Path) -> str:
    """The variant the library in `out` was built from, checking that its three files are whole
    and of one build."""
    cu = (out / "fp32.cu").read_text()
    header = (out / "fp32.h").read_text()
    manifest = json.loads((out / "fp32.json").read_text())  # whole JSON, or this raises
    assert cu.endswith("#endif  // __CUDACC_RTC__\n") and header.endswith("#endif  // GEMMGEN_FP32_H\n"), "half a file"
    (in_cu,) = {letter for letter in "AB" if f"# variant {letter}" in cu}
    in_manifest = Path(manifest["database"]).stem[-1]
    assert in_cu == in_manifest, f"a .cu of variant {in_cu} beside the manifest of variant {in_manifest}"
    return in_cu


def test_a_library_build_killed_while_writing_leaves_one_whole_set(tmp_path):
    out = tmp_path / "out"
    variants = {letter: variant(tmp_path, letter) for letter in "AB"}
    chance = random.Random(11)
    for kill in range(4):
        spec, db = variants["AB"[kill % 2]]
        process = subprocess.Popen([sys.executable, "-m", "gemmgen.cli", "build", str(spec), "--from-db", str(db),
                                    "-o", f"{out}/"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
        if kill == 0:  # the first build stands whole: the old set of the next
            assert process.wait(timeout=120) == 0
            assert variant_of(out) == "A"
            continue
        # Wait for its first temporary file (it has begun writing), then kill it a moment later.
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            if any(name.startswith(".fp32.") for name in os.listdir(out)):
                time.sleep(chance.uniform(0.0, 0.03))
                break
            time.sleep(0.0005)
        process.send_signal(signal.SIGKILL)
        process.wait()
        complete_pending(out / "fp32.json")  # as build, tune, bench, explain and gemmgen.matmul do
        variant_of(out)  # one whole set, old or new
