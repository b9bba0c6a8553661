"""The compile cache never serves a damaged entry: an entry cut short, garbage, or changed in any
byte (the cubin, the PTX or ptxas's register counts) is a miss, compiled again and replaced. A cache
that cannot work says so once and only costs compiling; processes compiling at once read no torn
entry; the least recently used entries go past a size cap, and only what the cache wrote."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

import gemmgen.outputs
from conftest import ROOT, SPECS_DIR
from gemmgen.gpu import compile as compile_mod
from gemmgen.gpu import compile_cache
from gemmgen.gpu.cubin import kernel_resources
from gemmgen.cli import main

# A kernel that NVRTC compiles in a tenth of a second: the cache does not care what it holds.
TINY = 'extern "C" __global__ void tiny(float *x) { x[threadIdx.x] = 2.0f * x[threadIdx.x]; }\n'


def entry(cache: Path) -> Path:
    (path,) = [p for p in cache.iterdir() if p.name.endswith(".entry")]
    return path


def parts(path: Path) -> tuple[dict, dict[str, bytes]]:
    decoded = compile_cache.decode(path.name[:-len(".entry")], path.read_bytes())
    assert decoded is not None
    return decoded


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("GEMMGEN_CACHE", str(folder))
    monkeypatch.delenv("GEMMGEN_CACHE_SIZE", raising=False)
    monkeypatch.setattr(compile_cache, "_warned", False)
    return folder


@pytest.fixture(scope="module")
def fresh():
    """TINY compiled without the cache: what every cached read must give back."""
    return compile_mod.compile_source(TINY, "sm_80", [], use_cache=False)


def same(a, b) -> bool:
    """The same compile result: all but ptxas's log, which says how long it took."""
    return a is not None and b is not None and replace(a, log="") == replace(b, log="")


def count_nvrtc_calls(monkeypatch) -> list:
    calls = []
    real = compile_mod._nvrtc
    monkeypatch.setattr(compile_mod, "_nvrtc", lambda: calls.append(1) or real())
    return calls


# --- what an entry holds ---------------------------------------------------------------------

def test_an_entry_is_one_file_with_the_cubin_ptx_and_ptxas_report_under_one_checksum(cache, fresh):
    compile_mod.compile_source(TINY, "sm_80", [])
    path = entry(cache)
    data = path.read_bytes()
    first, digest, body = data.split(b"\n", 2)
    assert first == b"gemmgen compile cache, format 3" and hashlib.sha256(body).hexdigest().encode() == digest
    meta, blobs = parts(path)
    assert blobs == {"cubin": fresh.cubin, "ptx": fresh.ptx.encode()}
    assert meta["resources"]["tiny"] == {"registers": fresh.resources["tiny"].registers, "spill_stores": 0,
                                         "spill_loads": 0, "stack_frame": 0, "shared_static": 0}
    assert os.listdir(cache) == [path.name]  # no temporary file left behind


def test_build_after_the_cached_entry_was_cut_short_writes_the_whole_cubin(cache, tmp_path, monkeypatch):
    # The case: a truncated cubin under intact metadata was served as it was.
    monkeypatch.chdir(tmp_path)
    spec = SPECS_DIR / "vectorized.gemm"
    assert CliRunner().invoke(main, ["build", str(spec), "--emit", "cubin", "-o", "first.cubin"]).exit_code == 0
    whole = (tmp_path / "first.cubin").read_bytes()
    path = entry(cache)
    assert parts(path)[1]["cubin"] == whole and len(whole) > 1000
    path.write_bytes(path.read_bytes()[:1000])
    result = CliRunner().invoke(main, ["build", str(spec), "--emit", "cubin", "-o", "v.cubin"])
    assert result.exit_code == 0, result.output
    # Compiled again, whole: the first build's kernels, not the 1000 bytes left (not byte for byte the
    # first build: NVRTC's optimizer varies some SIMT kernels' code from one compile to another on
    # a loaded host, test_reproducible.py); the entry replaced by what was written.
    again = (tmp_path / "v.cubin").read_bytes()
    assert len(again) > 1000 and set(kernel_resources(again)) == set(kernel_resources(whole))
    assert parts(path)[1]["cubin"] == again


def _flip(path: Path, where: bytes) -> None:
    """Change one character right after the first occurrence of `where` in the entry."""
    data = bytearray(path.read_bytes())
    at = data.index(where) + len(where)
    data[at] = ord("7") if data[at] != ord("7") else ord("8")
    path.write_bytes(bytes(data))


def _flip_blob(path: Path, name: str) -> None:
    """Change one byte in the middle of blob `name` (the checksum left as it was)."""
    data = bytearray(path.read_bytes())
    body_at = data.index(b"\n", len(compile_cache.FORMAT_LINE)) + 1
    header_end = data.index(b"\n", body_at)
    offset = header_end + 1
    for blob, size in json.loads(data[body_at:header_end])["blobs"]:
        if blob == name:
            data[offset + size // 2] ^= 1
            path.write_bytes(bytes(data))
            return
        offset += size
    raise AssertionError(f"no blob {name}")


def _forge(path: Path, change) -> None:
    """Rewrite the entry with `change(header)` applied and a checksum that matches it."""
    data = path.read_bytes()
    body = data.split(b"\n", 2)[2]
    header, _, rest = body.partition(b"\n")
    header = json.loads(header)
    change(header)
    body = json.dumps(header).encode() + b"\n" + rest
    path.write_bytes(compile_cache.FORMAT_LINE + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)


DAMAGE = {
    "cut short": lambda p: p.write_bytes(p.read_bytes()[:300]),
    "garbage of the same length": lambda p: p.write_bytes(os.urandom(p.stat().st_size)),
    "empty": lambda p: p.write_bytes(b""),
    "one byte of the cubin changed": lambda p: _flip_blob(p, "cubin"),
    "one byte of the ptx changed": lambda p: _flip_blob(p, "ptx"),
    "the register count changed": lambda p: _flip(p, b'"registers": '),
    "the spill count changed": lambda p: _flip(p, b'"spill_stores": '),
    "a byte appended": lambda p: p.write_bytes(p.read_bytes() + b"\0"),
    "another key's entry": lambda p: _forge(p, lambda h: h.update(key="0" * 32)),
    "registers not a number, checksum matching": lambda p: _forge(
        p, lambda h: h["meta"]["resources"]["tiny"].update(registers="many")),
    "a blob longer than the file, checksum matching": lambda p: _forge(
        p, lambda h: h.update(blobs=[["cubin", 10 ** 9], ["ptx", 1]])),
    "no resources, checksum matching": lambda p: _forge(p, lambda h: h["meta"].pop("resources")),
    "an older format": lambda p: p.write_bytes(p.read_bytes().replace(b"format 3", b"format 2", 1)),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_entry_is_never_served_but_compiled_again_and_replaced(cache, fresh, damage, monkeypatch, capsys):
    compile_mod.compile_source(TINY, "sm_80", [])
    path = entry(cache)
    DAMAGE[damage](path)
    calls = count_nvrtc_calls(monkeypatch)
    again = compile_mod.compile_source(TINY, "sm_80", [])
    assert same(again, fresh)
    assert len(calls) > 1, "the damaged entry was served without compiling"  # 1: the version in the key
    served = compile_mod._from_cache(path.name[:-len(".entry")])
    assert same(served, fresh), "the entry was not replaced"
    assert capsys.readouterr().err == ""  # repaired: nothing to tell


def test_the_register_counts_printed_by_build_are_the_compilers_not_an_edited_entry(cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = str(SPECS_DIR / "naive.gemm")
    first = CliRunner().invoke(main, ["build", spec, "-o", "k.cu"])
    assert first.exit_code == 0, first.output
    (true_count,) = re.findall(r"(\d+) registers", first.output)
    path = entry(cache)
    edited = re.sub(rb'"registers": \d+', b'"registers": 250', path.read_bytes())
    assert edited != path.read_bytes()
    path.write_bytes(edited)
    second = CliRunner().invoke(main, ["build", spec, "-o", "k.cu", "--force"])
    assert second.exit_code == 0, second.output
    assert f"{true_count} registers" in second.output and "250 registers" not in second.output


# --- a cache that cannot work: one warning, and compiling goes on ------------------------------

def test_an_entry_turned_into_a_folder_warns_once_naming_it_and_compiles(cache, fresh, monkeypatch, capsys):
    compile_mod.compile_source(TINY, "sm_80", [])
    path = entry(cache)
    path.unlink()
    path.mkdir()
    (path / "something").write_text("the user's")
    calls = count_nvrtc_calls(monkeypatch)
    for _ in range(3):
        assert same(compile_mod.compile_source(TINY, "sm_80", []), fresh)
    assert len(calls) >= 3 * 2  # compiled each time (and one version query per key)
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, once per process
    assert err.startswith("gemmgen: warning: ") and str(path) in err and "is a folder" in err
    assert f"rm -r '{path}'" in err
    assert (path / "something").read_text() == "the user's"  # never removed by gemmgen


def test_an_unwritable_cache_warns_once_naming_the_folder_and_what_to_do(cache, fresh, monkeypatch, capsys):
    cache.mkdir()
    cache.chmod(0o500)
    try:
        if os.access(cache, os.W_OK):  # root: permissions do not stop writes, so refuse as the OS would
            def refuse(*args, **kwargs):
                raise PermissionError(13, "Permission denied")
            monkeypatch.setattr(Path, "mkdir", refuse)
            monkeypatch.setattr(gemmgen.outputs.tempfile, "mkstemp", refuse)
        for source in (TINY, TINY.replace("2.0f", "3.0f")):
            compiled = compile_mod.compile_source(source, "sm_80", [])
        assert compiled.cubin != fresh.cubin and same(compile_mod.compile_source(TINY, "sm_80", []), fresh)
        assert list(cache.iterdir()) == []
    finally:
        cache.chmod(0o700)
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"cannot write the compile cache in {cache} (Permission denied)" in err
    assert "set GEMMGEN_CACHE to a writable folder" in err


def test_an_unreadable_entry_warns(cache, fresh, monkeypatch, capsys):
    compile_mod.compile_source(TINY, "sm_80", [])
    path = entry(cache)

    def refuse(self):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(Path, "read_bytes", refuse)
    assert same(compile_mod.compile_source(TINY, "sm_80", []), fresh)
    err = capsys.readouterr().err
    assert f"cannot read the compile cache entry {path} (Permission denied)" in err


def test_a_pipe_in_place_of_an_entry_neither_hangs_nor_is_written_into(cache, fresh, capsys):
    compile_mod.compile_source(TINY, "sm_80", [])
    path = entry(cache)
    path.unlink()
    os.mkfifo(path)
    assert same(compile_mod.compile_source(TINY, "sm_80", []), fresh)  # no open() of the pipe: no hang
    assert "is not a regular file" in capsys.readouterr().err


# --- the size cap ------------------------------------------------------------------------------

@pytest.mark.parametrize("text,size", [("1073741824", 1 << 30), ("1G", 1 << 30), ("1GiB", 1 << 30),
                                       ("512M", 512 << 20), ("512 MB", 512 << 20), ("100k", 100 << 10),
                                       ("2T", 2 << 40), ("0", 0), ("4096B", 4096)])
def test_cache_sizes_read_with_1024_based_units(text, size):
    assert compile_cache.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "abc", "1.5G", "-1", "1X", "G"])
def test_what_is_not_a_size(text):
    assert compile_cache.parse_size(text) is None


def test_an_unreadable_cap_warns_and_keeps_the_default(cache, monkeypatch, capsys):
    monkeypatch.setenv("GEMMGEN_CACHE_SIZE", "lots")
    assert compile_cache.size_cap() == compile_cache.DEFAULT_SIZE == 1 << 30
    err = capsys.readouterr().err
    assert "GEMMGEN_CACHE_SIZE='lots' is not a size" in err and "e.g. 2G" in err


def test_a_cap_of_zero_turns_the_cache_off(cache, fresh, monkeypatch):
    monkeypatch.setenv("GEMMGEN_CACHE_SIZE", "0")
    calls = count_nvrtc_calls(monkeypatch)
    for _ in range(2):
        assert same(compile_mod.compile_source(TINY, "sm_80", []), fresh)
    assert not cache.exists() or list(cache.iterdir()) == []
    assert len(calls) >= 4


def put(key: str, size: int, age: float) -> Path:
    """An entry of about `size` bytes last used `age` seconds ago."""
    compile_cache.store(key, {"note": "test"}, {"cubin": b"x" * size})
    path = compile_cache.entry_path(key)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def key(n: int) -> str:
    return f"{n:032x}"


def test_past_the_cap_the_least_recently_used_entries_go_first(cache, monkeypatch):
    monkeypatch.setenv("GEMMGEN_CACHE_SIZE", "10M")
    paths = [put(key(n), 1 << 20, age=1000 - n) for n in range(9)]  # 9 MB, entry 0 the oldest
    assert compile_cache.load(key(1)) is not None  # used just now: the most recent
    put(key(9), 1 << 20, age=0)                     # 10 MB and some headers: over the cap
    put(key(10), 1 << 20, age=0)
    left = {p.name[:-6] for p in cache.iterdir()}
    # Down to 90% of 10 MB: the oldest unused entries went, the one read stayed, the newest stayed.
    assert key(1) in left and key(10) in left
    assert key(0) not in left and key(2) not in left
    total = sum(p.stat().st_size for p in cache.iterdir())
    assert total <= 10 << 20
    assert all(p.exists() == (p.name[:-6] in left) for p in paths)


def test_eviction_removes_only_what_the_cache_wrote(cache, monkeypatch):
    monkeypatch.setenv("GEMMGEN_CACHE_SIZE", "1M")
    cache.mkdir()
    mine = cache / "notes.txt"
    mine.write_bytes(b"n" * (2 << 20))
    folder = cache / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"j" * (2 << 20))
    odd = cache / f"{key(7)}.entry.bak"
    odd.write_bytes(b"b" * 10)
    writing = cache / f".{key(8)}.entry.abcd1234.tmp.entry"  # another process is writing this entry
    writing.write_bytes(b"w" * (2 << 20))
    dead = cache / f".{key(9)}.entry.zzzz9999.tmp.entry"     # a writer that died an hour ago
    dead.write_bytes(b"d" * 100)
    old = time.time() - 2 * compile_cache.STALE_TEMPORARY_SECONDS
    os.utime(dead, (old, old))
    # A format-2 entry folder (an older gemmgen's), and one that holds something of the user's.
    legacy = cache / key(5)
    legacy.mkdir()
    for name in ("kernel.cubin", "kernel.ptx", "meta.json"):
        (legacy / name).write_bytes(b"l" * (300 << 10))
        os.utime(legacy / name, (old, old))
    not_legacy = cache / key(6)
    not_legacy.mkdir()
    (not_legacy / "kernel.cubin").write_bytes(b"c" * (600 << 10))
    (not_legacy / "mine.txt").write_text("keep")
    for n in range(3):
        put(key(n), 400 << 10, age=100 - n)
    # The old format's entry went first (least recently used), then entry 0; the dead writer's file
    # went at the first look. What is not the cache's stays, and so does a write under way.
    names = sorted(p.name for p in cache.iterdir())
    assert names == sorted(["notes.txt", "photos", odd.name, writing.name, key(6),
                            f"{key(1)}.entry", f"{key(2)}.entry"])
    assert (folder / "a.jpg").exists() and (not_legacy / "mine.txt").read_text() == "keep"


def test_the_entry_just_written_stays_even_alone_over_the_cap(cache, monkeypatch):
    monkeypatch.setenv("GEMMGEN_CACHE_SIZE", "1k")
    put(key(1), 4096, age=10)
    compile_cache.store(key(2), {}, {"cubin": b"y" * 4096})
    assert [p.name for p in cache.iterdir()] == [f"{key(2)}.entry"]
    assert compile_cache.load(key(2)) == ({}, {"cubin": b"y" * 4096})


WORKER = r"""
import hashlib, os, shutil, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from gemmgen.gpu.compile import compile_source
cache, me, rounds, expected = Path(os.environ["GEMMGEN_CACHE"]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
source = sys.argv[5]
for round in range(rounds):
    # Between compiles, disturb the other process: clear the cache, or overwrite an entry in place.
    step = (round + me) % 3
    if step == 0:
        shutil.rmtree(cache, ignore_errors=True)
    elif step == 1:
        for entry in cache.glob("*.entry"):
            try:
                entry.write_bytes(b"gemmgen compile cache, format 3\ntorn")
            except OSError:
                pass
    compiled = compile_source(source, "sm_80", [])
    if hashlib.sha256(compiled.cubin).hexdigest() != expected:
        sys.exit(f"process {me}, round {round}: a wrong cubin of {len(compiled.cubin)} bytes")
print("ok")
"""


def test_two_processes_compiling_one_kernel_twenty_times_while_the_cache_churns(cache, fresh):
    expected = hashlib.sha256(fresh.cubin).hexdigest()
    env = {**os.environ, "GEMMGEN_CACHE": str(cache)}
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(ROOT), str(me), "20", expected, TINY],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for me in range(2)]
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0 and out.strip() == "ok", f"exit {worker.returncode}:\n{out}\n{err}"
    served = compile_mod._from_cache(entry(cache).name[:-len(".entry")])
    assert served is None or same(served, fresh)


EVICTING_WORKER = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from gemmgen.gpu import compile_cache
from gemmgen.gpu.cubin import kernel_resources
me = int(sys.argv[2])
for n in range(60):
    key = f"{me:08x}{n:024x}"
    blob = bytes([me, n]) * (20000 + 997 * n)
    compile_cache.store(key, {"n": n}, {"cubin": blob})
    for back in range(max(0, n - 3), n + 1):  # what is served is whole, or nothing
        got = compile_cache.load(f"{me:08x}{back:024x}")
        if got is not None and got != ({"n": back}, {"cubin": bytes([me, back]) * (20000 + 997 * back)}):
            sys.exit(f"process {me}: entry {back} served wrong")
print("ok")
"""


def test_processes_writing_reading_and_evicting_at_once_never_serve_a_wrong_entry(cache):
    env = {**os.environ, "GEMMGEN_CACHE": str(cache), "GEMMGEN_CACHE_SIZE": "1M"}
    workers = [subprocess.Popen([sys.executable, "-c", EVICTING_WORKER, str(ROOT), str(me)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for me in range(1, 4)]
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0 and out.strip() == "ok", f"exit {worker.returncode}:\n{out}\n{err}"
        assert err == ""  # no failure to warn about
    total = sum(p.stat().st_size for p in cache.iterdir())
    assert total <= (1 << 20) + 3 * 200_000  # each process keeps at most its last entry over the cap
    assert not [p for p in cache.iterdir() if ".tmp" in p.name]


# --- retries ---------------------------------------------------------------------------------

def test_a_compile_that_spills_at_the_register_cap_is_compiled_again(monkeypatch):
    """ptxas's allocation at 255 registers varies under CPU load: the better of the compiles is kept,
    and a compile that spills below the cap (a real shortage) is not retried."""
    from gemmgen.gpu.compile import Compiled, Resources

    def result(registers, spilled):
        return Compiled("sm_80", b"\x7fELF", "", {}, {"k": Resources(registers, spilled, spilled, 0, 0)}, "", "13.0")

    outcomes = [result(255, 88), result(255, 0)]
    calls = []
    monkeypatch.setattr(compile_mod, "_compile_once", lambda *args: calls.append(args) or outcomes.pop(0))
    compiled = compile_mod.compile_source("// source", "sm_80", [], use_cache=False)
    assert len(calls) == 2 and not compiled.resources["k"].spills

    outcomes[:] = [result(200, 40)]
    calls.clear()
    compiled = compile_mod.compile_source("// other", "sm_80", [], use_cache=False)
    assert len(calls) == 1 and compiled.resources["k"].spill_stores == 40
