"""GPU tests of the wgmma staged epilogue (`epilogue ... staged` on the TMA kernels: C through shared
memory and TMA stores): results against float64 on every schedule, with clusters, in 3xTF32, with C
column-major, with boxes of 8 columns (an odd number per tile, so the boxes' turns run across tiles);
nothing written outside C; a C that is not 16-byte aligned (stored from registers) beside aligned A
and B; stream-K's same bits every run; and the nvcc-built C ABI.

Run with `pytest -m gpu`; skipped without a GPU and CuPy.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import hopper_gpu
from gemmgen.gpu import verify
from gemmgen.language.load import load_one

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent


def _staged(parent: str, name: str, **values):
    spec = load_one(ROOT / "specs" / f"{parent}.gemm")
    return replace(spec.with_values(epilogue_staged=True, **values), name=name)


SPECS = {
    name: load_one(ROOT / "specs" / "hopper_tf32_staged.gemm", name)
    for name in ("hopper_tf32_staged", "hopper_tf32_persistent_staged")
} | {
    "streamk_staged": _staged("hopper_tf32_streamk", "streamk_staged"),
    "cluster_staged": _staged("hopper_tf32_cluster", "cluster_staged"),
    "x3tf32_staged": _staged("hopper_3xtf32", "x3tf32_staged"),
    "x3tf32_streamk_staged": _staged("hopper_3xtf32_streamk", "x3tf32_streamk_staged"),
    "c_col_staged": _staged("hopper_tf32", "c_col_staged", layout_C="col", block_n=128, warp_n=128, mma_n=128),
    # 64 x 72 tiles: boxes of 8 columns, 9 per tile, so a persistent block's next tile starts on the
    # other box
    "narrow_staged": _staged("hopper_tf32_persistent", "narrow_staged", block_m=64, block_n=72, warp_n=72,
                             mma_n=72),
}

CASES = verify.QUICK_CASES + (
    verify.Case(2000, 3000, 700, beta=0.5),
    verify.Case(4096, 4096, 512),
    verify.Case(1536, 2816, 200),
    verify.Case(129, 257, 96, beta=0.5),
    verify.Case(777, 1500, 33, alpha=-1.5),
    verify.Case(515, 1031, 2049, pad=4),   # ldc = N + 4: TMA stores into a wider C
    verify.Case(300, 300, 40000, pad=1),   # ldc = N + 1: C from registers
)


@pytest.fixture(scope="module", autouse=True)
def gpu():
    hopper_gpu.require_sm90("the staged epilogue is on the sm_90a kernels (wgmma, TMA)")


@pytest.fixture(scope="module")
def cp(gpu):
    import cupy
    return cupy


@pytest.fixture(scope="module")
def kernels(gpu):
    yield from hopper_gpu.kernel_cache(SPECS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_staged_kernels_match_float64(name, kernels):
    report = verify.check(kernels(name), CASES, seed=33)
    assert report.ok, "\n".join(f"{r.case}: {r.message}" for r in report.failures)


@pytest.mark.parametrize("name", ["hopper_tf32_staged", "c_col_staged", "narrow_staged"])
def test_c_alone_misaligned_is_stored_from_registers(name, cp, kernels):
    """A and B 16-byte aligned (TMA loads them), C one float off: the kernel must not TMA-store it."""
    kernel = kernels(name)
    M, N, K = 300, 520, 256
    rng = np.random.default_rng(7)
    A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
    C0 = rng.uniform(-1, 1, (M, N)).astype(np.float32)
    a, b = cp.asarray(A), cp.asfortranarray(cp.asarray(B))
    column = kernel.layouts["C"] == "col"
    buffer = cp.full(M * N + 8, cp.nan, cp.float32)
    c = buffer[1:1 + M * N].reshape((N, M)).T if column else buffer[1:1 + M * N].reshape((M, N))
    c[...] = cp.asarray(C0)
    before = buffer.copy()
    kernel.launch(M, N, K, 2.0, a.data.ptr, K, b.data.ptr, K, -1.0, c.data.ptr, M if column else N)
    cp.cuda.runtime.deviceSynchronize()
    reference = 2.0 * (A.astype(np.float64) @ B.astype(np.float64)) - C0
    scale = 2.0 * (np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))) + np.abs(C0)
    bad = ~(np.abs(c.get() - reference) <= verify.tolerance(scale, K, "tf32"))
    assert not bad.any(), f"{int(bad.sum())} elements wrong"
    outside = np.concatenate([buffer[:1].get(), buffer[1 + M * N:].get()])
    assert np.isnan(outside).all(), "wrote outside C"
    assert not cp.array_equal(before, buffer)


@pytest.mark.parametrize("name", ["streamk_staged", "x3tf32_streamk_staged"])
def test_stream_k_staged_gives_the_same_bits_every_run(name, cp, kernels):
    kernel = kernels(name)
    M, N, K = 4092, 4092, 512
    rng = np.random.default_rng(11)
    a = cp.asarray(rng.uniform(-1, 1, (M, K)).astype(np.float32))
    b = cp.asfortranarray(cp.asarray(rng.uniform(-1, 1, (K, N)).astype(np.float32)))
    outputs = []
    for _ in range(10):
        c = cp.full((M, N), cp.nan, cp.float32)
        kernel(a, b, c)
        outputs.append(c.view(cp.uint32).get())
    different = [i for i, out in enumerate(outputs) if not np.array_equal(out, outputs[0])]
    assert not different, f"runs {different} differ from run 0"


def test_staged_c_abi_matches_float64(cp, tmp_path):
    """The nvcc-built launcher encodes C's tensor map and passes it (and a null one when C is not aligned)."""
    from test_gpu_schedule import _build_abi
    function = _build_abi("hopper_tf32_staged", tmp_path, SPECS["hopper_tf32_staged"])
    for M, N, K, shift in [(4096, 4096, 512, 0), (100, 300, 200, 0), (129, 2000, 700, 1), (1, 1, 1, 0),
                           (1000, 1003, 1000, 0)]:
        rng = np.random.default_rng(M + 3 * N + K)
        A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
        B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
        C = rng.uniform(-1, 1, (M, N)).astype(np.float32)
        a, b = cp.asarray(A), cp.asfortranarray(cp.asarray(B))
        buffer = cp.zeros(M * N + shift, cp.float32)
        out = buffer[shift:].reshape(M, N)
        out[...] = cp.asarray(C)
        status = function(M, N, K, 1.0, a.data.ptr, K, b.data.ptr, K, 0.25, out.data.ptr, N, 0)
        assert status == 0, f"cudaError {status} at {M}x{N}x{K}"
        cp.cuda.runtime.deviceSynchronize()
        reference = A.astype(np.float64) @ B.astype(np.float64) + 0.25 * C
        scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)) + 0.25 * np.abs(C)
        bad = ~(np.abs(out.get() - reference) <= verify.tolerance(scale, K, "tf32"))
        assert not bad.any(), f"{M}x{N}x{K}: {int(bad.sum())} elements wrong"
