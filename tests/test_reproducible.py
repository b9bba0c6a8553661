"""Reproducible builds: one source and one NVRTC give one cubin, byte for byte, in this process and
in another, with the compile cache out of the way.

NVRTC names internal-linkage entities (gemmgen's namespace-scope tiling constants) with the time
and the process id unless seeded (-frandom-seed); without -lineinfo no copy of the PTX (whose
register numbering NVRTC 13.5 varies for some large SIMT kernels) is embedded in the cubin.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys

import pytest

from conftest import ROOT, SPECS_DIR
from gemmgen.gpu import compile as compile_mod
from gemmgen.plan import make_plan
from gemmgen.language.load import load_one

# Like every gemmgen kernel: a template in a namespace with constexpr constants, and no
# external-linkage definition from which NVRTC could name the file's internal entities.
TEMPLATED = """namespace k_impl {
constexpr int SCALE = 3;
template <bool TWICE>
__global__ void scale(float* x) { x[threadIdx.x] *= TWICE ? 2 * SCALE : SCALE; }
}
"""
NAMES = ["k_impl::scale<true>", "k_impl::scale<false>"]

ELSEWHERE = r"""
import hashlib, sys
sys.path.insert(0, sys.argv[1])
from gemmgen.gpu import compile as compile_mod
from gemmgen.plan import make_plan
from gemmgen.language.load import load_one
if sys.argv[2] == "source":
    compiled = compile_mod.compile_source(sys.argv[3], "sm_80", sys.argv[4:], use_cache=False)
else:
    compiled = compile_mod.compile_plan(make_plan(load_one(sys.argv[3])), use_cache=False)
print(hashlib.sha256(compiled.cubin).hexdigest())
"""


def compiled_in_another_process(*args: str) -> str:
    """The sha256 of the cubin another Python process compiles (no cache)."""
    run = subprocess.run([sys.executable, "-c", ELSEWHERE, str(ROOT), *args], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_internal_names_carry_no_process_id_or_time():
    here = compile_mod.compile_source(TEMPLATED, "sm_80", NAMES, use_cache=False)
    names = set(re.findall(r"_INTERNAL_\w+?k_impl5SCALEE", here.ptx))
    assert len(names) == 1  # the constant is emitted, under a name of NVRTC's making
    assert hashlib.sha256(here.cubin).hexdigest() == compiled_in_another_process("source", TEMPLATED, *NAMES)


# A small SIMT kernel: NVRTC 13.5's optimizer varies the code of a few large SIMT kernels from one
# process to another on some hosts (blocktile_2d on CI's machine; docs/python.md says so).
@pytest.mark.parametrize("spec", ["naive", "tensorcore_tf32", "hopper_tf32_pingpong"],
                         ids=["simt", "mma.sync", "wgmma"])
def test_two_compiles_of_a_spec_give_the_same_cubin(spec):
    path = SPECS_DIR / f"{spec}.gemm"
    here = compile_mod.compile_plan(make_plan(load_one(path)), use_cache=False)
    assert hashlib.sha256(here.cubin).hexdigest() == compiled_in_another_process("plan", str(path))


def test_an_nvrtc_without_frandom_seed_still_compiles(monkeypatch):
    # "-frandom-seed" without a value is refused as an unknown option, as an older NVRTC refuses it.
    monkeypatch.setattr(compile_mod, "seed_option", lambda source: "-frandom-seed")
    monkeypatch.setattr(compile_mod, "_seed_supported", True)
    compiled = compile_mod.compile_source(TEMPLATED, "sm_80", NAMES, use_cache=False)
    assert set(compiled.lowered_names) == set(NAMES) and compiled.cubin.startswith(b"\x7fELF")
    assert compile_mod._seed_supported is False


def test_line_info_only_when_asked_for(monkeypatch):
    monkeypatch.delenv("GEMMGEN_LINEINFO", raising=False)
    plain = compile_mod.compile_source(TEMPLATED, "sm_80", NAMES, use_cache=False)
    key = compile_mod.cache_key(TEMPLATED, "sm_80", NAMES)
    monkeypatch.setenv("GEMMGEN_LINEINFO", "1")
    lined = compile_mod.compile_source(TEMPLATED, "sm_80", NAMES, use_cache=False)
    assert b".debug_line" in lined.cubin and b".nv_debug_ptx_txt" in lined.cubin
    assert b".debug_line" not in plain.cubin and b".nv_debug_ptx_txt" not in plain.cubin
    assert compile_mod.cache_key(TEMPLATED, "sm_80", NAMES) != key  # a cached cubin of either is not the other's
