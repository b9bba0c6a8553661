"""The compile cache never serves a damaged entry: a cubin cut short, garbage, a missing file or
a hash that does not match is a miss, compiled again and replaced; a cache that cannot be written
only costs compiling; processes compiling one kernel at once read no torn files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import gemmgen.outputs
from conftest import ROOT, SPECS_DIR
from gemmgen import compile as compile_mod
from gemmgen.cli import main

# A kernel that NVRTC compiles in a tenth of a second: the cache does not care what it holds. With
# no internal-linkage names (NVRTC gives those a fresh id per compile) its cubin is the same on every
# compile, so a cached read can be compared with a fresh compile byte for byte.
TINY = 'extern "C" __global__ void tiny(float *x) { x[threadIdx.x] = 2.0f * x[threadIdx.x]; }\n'


def entry(cache: Path) -> Path:
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    return folder


def elf_is_whole(data: bytes) -> bool:
    """A 64-bit little-endian ELF (a cubin) whose header tables and sections all lie in `data`."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        return False
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    if phoff + phentsize * phnum > len(data) or shoff + shentsize * shnum > len(data):
        return False
    for i in range(shnum):
        kind, = struct.unpack_from("<I", data, shoff + i * shentsize + 4)
        offset, size = struct.unpack_from("<QQ", data, shoff + i * shentsize + 24)
        if kind != 8 and offset + size > len(data):  # 8: SHT_NOBITS, no bytes in the file
            return False
    return True


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("GEMMGEN_CACHE", str(folder))
    return folder


@pytest.fixture(scope="module")
def fresh():
    """TINY compiled without the cache: what every cached read must give back."""
    return compile_mod.compile_source(TINY, "sm_80", [], use_cache=False)


def test_meta_records_the_hash_of_the_cubin_and_the_ptx(cache, fresh):
    compile_mod.compile_source(TINY, "sm_80", [])
    folder = entry(cache)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["sha256"] == {"cubin": sha256(folder / "kernel.cubin"), "ptx": sha256(folder / "kernel.ptx")}
    assert (folder / "kernel.cubin").read_bytes() == fresh.cubin
    assert sorted(p.name for p in folder.iterdir()) == ["kernel.cubin", "kernel.ptx", "meta.json"]


def test_build_after_the_cached_cubin_was_cut_short_writes_the_whole_cubin(cache, tmp_path, monkeypatch):
    # The case: a truncated kernel.cubin under an intact meta.json was served as it was.
    monkeypatch.chdir(tmp_path)
    spec = SPECS_DIR / "vectorized.gemm"
    assert CliRunner().invoke(main, ["build", str(spec), "--emit", "cubin", "-o", "first.cubin"]).exit_code == 0
    whole = (tmp_path / "first.cubin").read_bytes()
    cached = entry(cache) / "kernel.cubin"
    assert cached.read_bytes() == whole and len(whole) > 1000
    cached.write_bytes(whole[:1000])
    result = CliRunner().invoke(main, ["build", str(spec), "--emit", "cubin", "-o", "v.cubin"])
    assert result.exit_code == 0, result.output
    written = (tmp_path / "v.cubin").read_bytes()
    # Compiled again (not byte for byte the first: internal names carry a per-compile id), whole,
    # with the kernels' symbols in it; the entry was replaced by it.
    assert elf_is_whole(written) and not elf_is_whole(whole[:1000])
    meta = json.loads((entry(cache) / "meta.json").read_text())
    assert all(symbol.encode() in written for symbol in meta["lowered_names"].values())
    assert cached.read_bytes() == written and meta["sha256"]["cubin"] == sha256(cached)


DAMAGE = {
    "cubin cut short": lambda f: (f / "kernel.cubin").write_bytes((f / "kernel.cubin").read_bytes()[:100]),
    "cubin of garbage, same length": lambda f: (f / "kernel.cubin").write_bytes(
        os.urandom((f / "kernel.cubin").stat().st_size)),
    "ptx edited": lambda f: (f / "kernel.ptx").write_text((f / "kernel.ptx").read_text() + "// edited\n"),
    "cubin missing": lambda f: (f / "kernel.cubin").unlink(),
    "ptx missing": lambda f: (f / "kernel.ptx").unlink(),
    "meta.json missing": lambda f: (f / "meta.json").unlink(),
    "meta.json garbage": lambda f: (f / "meta.json").write_bytes(b"\x00\xff{not json"),
    "meta.json a list": lambda f: (f / "meta.json").write_text("[]"),
    "meta.json without hashes": lambda f: (f / "meta.json").write_text(json.dumps(
        {k: v for k, v in json.loads((f / "meta.json").read_text()).items() if k != "sha256"})),
    "meta.json with bad resources": lambda f: (f / "meta.json").write_text(json.dumps(
        {**json.loads((f / "meta.json").read_text()), "resources": {"tiny": {"registers": "many"}}})),
    "meta.json a folder": lambda f: ((f / "meta.json").unlink(), (f / "meta.json").mkdir()),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_entry_is_a_miss_compiled_again_and_replaced(cache, fresh, damage, monkeypatch):
    compile_mod.compile_source(TINY, "sm_80", [])
    folder = entry(cache)
    DAMAGE[damage](folder)
    calls = []
    real = compile_mod._nvrtc
    monkeypatch.setattr(compile_mod, "_nvrtc", lambda: calls.append(1) or real())
    again = compile_mod.compile_source(TINY, "sm_80", [])
    assert again.cubin == fresh.cubin and again.ptx == fresh.ptx
    assert len(calls) > 1, "the damaged entry was served without compiling"  # 1: the version in the key
    if damage != "meta.json a folder":  # a folder cannot be renamed over: that entry stays a miss
        served = compile_mod._from_cache(folder.name)
        assert served is not None and served.cubin == fresh.cubin, "the entry was not replaced"


def test_a_read_only_cache_still_compiles(cache, fresh, monkeypatch):
    cache.mkdir()
    cache.chmod(0o500)
    try:
        if os.access(cache, os.W_OK):  # root: permissions do not stop writes, so refuse as the OS would
            def refuse(*args, **kwargs):
                raise PermissionError(13, "Permission denied")
            monkeypatch.setattr(Path, "mkdir", refuse)
            monkeypatch.setattr(gemmgen.outputs.tempfile, "mkstemp", refuse)
        compiled = compile_mod.compile_source(TINY, "sm_80", [])
        assert compiled.cubin == fresh.cubin
        assert list(cache.iterdir()) == []
    finally:
        cache.chmod(0o700)


WORKER = r"""
import hashlib, os, shutil, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from gemmgen.compile import compile_source
cache, me, rounds, expected = Path(os.environ["GEMMGEN_CACHE"]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
source = sys.argv[5]
for round in range(rounds):
    # Between compiles, disturb the other process: clear the cache, or overwrite a file in place.
    step = (round + me) % 3
    if step == 0:
        shutil.rmtree(cache, ignore_errors=True)
    elif step == 1:
        for entry in cache.glob("*/kernel.cubin"):
            try:
                entry.write_bytes(b"\x7fELF torn")
            except OSError:
                pass
    compiled = compile_source(source, "sm_80", [])
    if hashlib.sha256(compiled.cubin).hexdigest() != expected:
        sys.exit(f"process {me}, round {round}: a wrong cubin of {len(compiled.cubin)} bytes")
print("ok")
"""


def test_two_processes_compiling_one_kernel_twenty_times_while_the_cache_churns(cache, fresh, tmp_path):
    expected = hashlib.sha256(fresh.cubin).hexdigest()
    env = {**os.environ, "GEMMGEN_CACHE": str(cache)}
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(ROOT), str(me), "20", expected, TINY],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for me in range(2)]
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0 and out.strip() == "ok", f"exit {worker.returncode}:\n{out}\n{err}"
    served = compile_mod._from_cache(entry(cache).name)
    assert served is None or served.cubin == fresh.cubin
    shutil.rmtree(cache, ignore_errors=True)


def test_a_compile_that_spills_at_the_register_cap_is_compiled_again(monkeypatch):
    """ptxas's allocation at 255 registers varies under CPU load: the better of the compiles is kept,
    and a compile that spills below the cap (a real shortage) is not retried."""
    import gemmgen.compile as compile_module
    from gemmgen.compile import Compiled, Resources

    def result(registers, spilled):
        return Compiled("sm_80", b"\x7fELF", "", {}, {"k": Resources(registers, spilled, spilled, 0, 0)}, "", "13.0")

    outcomes = [result(255, 88), result(255, 0)]
    calls = []
    monkeypatch.setattr(compile_module, "_compile_once", lambda *args: calls.append(args) or outcomes.pop(0))
    compiled = compile_module.compile_source("// source", "sm_80", [], use_cache=False)
    assert len(calls) == 2 and not compiled.resources["k"].spills

    outcomes[:] = [result(200, 40)]
    calls.clear()
    compiled = compile_module.compile_source("// other", "sm_80", [], use_cache=False)
    assert len(calls) == 1 and compiled.resources["k"].spill_stores == 40
