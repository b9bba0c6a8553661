"""A library's strided-batched entry point without a GPU: the shipped library .cu (generated/fp32.cu),
built with nvcc against its header and run on the host with no GPU visible, refuses what its
members' batched launchers refuse before any CUDA call, does nothing for batch 0 or an empty C,
and its single GEMM is the batched call for one batch. (The choice of member for a batch, C
against Python, is tests/test_library.py's; tests/test_gpu_library.py runs the batches on a GPU.)
"""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import GENERATED_DIR
from gemmgen.library.manifest import Manifest
from gemmgen.library.selection import choose
from test_batched import _cases, _expected, _host_binary, _read

SHIPPED = [name for name in ("fp32", "tf32") if (GENERATED_DIR / f"{name}.json").is_file()]

# Strided batches (M, N, K, batch) for which the shipped libraries choose another member than for
# one of their matrices (on an H100's 132 SMs): tests/test_gpu_library.py runs them against float64.
MOVED_BY_THE_BATCH = [(64, 64, 4096, 32), (128, 256, 64, 64), (64, 128, 4096, 8), (128, 64, 4096, 32),
                      (64, 64, 1024, 8), (256, 256, 64, 64)]


@pytest.mark.parametrize("name", SHIPPED)
def test_the_batch_moves_the_shipped_librarys_choice_to_several_members(name):
    """A batch of small products fills the GPU as one large product does: the model sees its tiles
    and traffic, and picks (as the .cu does, see test_library.py) members a single GEMM would not."""
    candidates = Manifest.from_json((GENERATED_DIR / f"{name}.json").read_text()).candidates()
    picks = [(choose(candidates, M, N, K, "aligned", 132, batch=batch), choose(candidates, M, N, K, "aligned", 132))
             for M, N, K, batch in MOVED_BY_THE_BATCH]
    assert sum(batched != single for batched, single in picks) >= len(picks) // 2, picks
    assert len({batched for batched, _ in picks}) >= 3, picks


@pytest.mark.skipif("fp32" not in SHIPPED, reason="no shipped fp32 library")
def test_the_librarys_batched_entry_point_refuses_what_its_members_refuse_before_any_cuda_call(tmp_path):
    """The cases of tests/test_batched.py (negative batch or strides, overlapping C batches,
    batch * stride past 64 bits, null pointers, short leading dimensions, batch 0, empty C), each
    answered by gemmgen_fp32_batched and by gemmgen_fp32 for the same call with batch 1, against
    the members' Plan checks: cudaErrorInvalidValue, cudaSuccess with nothing launched, or (a valid
    call) the CUDA error of asking for a device where none is visible."""
    manifest = Manifest.from_json((GENERATED_DIR / "fp32.json").read_text())
    plan = manifest.plans()[0]  # the members share layouts, so their checks
    binary = _host_binary(GENERATED_DIR / "fp32.cu", GENERATED_DIR / "fp32.h", "gemmgen_fp32", "sm_90a", tmp_path)
    cases = _cases(plan)
    feed = "\n".join(" ".join(str(x) for x in case) for case in cases)
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # valid calls reach no GPU
    out = [line for line in subprocess.run([str(binary)], input=feed, capture_output=True, text=True, check=True,
                                           env=environment).stdout.split("\n") if line]
    assert len(out) == len(cases)
    seen = set()
    for case, line in zip(cases, out):
        batched, single = (int(x) for x in line.split())
        answers = (_read(batched), _read(single))
        assert answers == _expected(plan, case), (case, batched, single)
        seen.add(answers[0])
    assert seen == {"invalid", "nothing", "launch"}  # the cases reach every answer
