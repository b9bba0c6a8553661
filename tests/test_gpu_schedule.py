"""GPU tests of `schedule persistent | stream-k` (specs/hopper_{tf32,3xtf32}_{persistent,streamk}.gemm):
results against float64 where tiles fill whole waves, part of one, or fewer than the SMs; stream-K's sums the same
bits every run; and the nvcc-built C ABI with its per-stream workspace, on two streams at once. Also
`cluster M x N` (specs/hopper_tf32_cluster.gemm and clusters of every shape on both TMA kernels): results
against float64 where clusters run past C's edge, through the Python runtime and the C ABI. And
`split N cluster` and `split N workspace`: against float64, through the Python runtime and the C ABI
(the workspace's: the same bits every run).

Run with `pytest -m gpu`; skipped without a GPU and CuPy.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import hopper_gpu
from gemmgen.gpu import verify
from gemmgen.codegen.cuda import generate
from gemmgen.plan import make_plan
from gemmgen.language.load import load_one

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
SPECS = {name: load_one(ROOT / "specs" / f"{name}.gemm") for name in (
    "hopper_tf32_persistent", "hopper_tf32_streamk", "hopper_3xtf32_persistent", "hopper_3xtf32_streamk",
    "hopper_tf32_cluster")}
# Clusters of each shape on both TMA kernels (hopper_tf32: 128 x 256 tiles, hopper_3xtf32: 128 x 128).
CLUSTERED = {f"{math}_c{m}x{n}": replace(load_one(ROOT / "specs" / f"hopper_{math}.gemm").with_values(
                 cluster_m=m, cluster_n=n), name=f"{math}_c{m}x{n}".replace("3xtf32", "x3tf32"))
             for math in ("tf32", "3xtf32") for m, n in ((1, 2), (2, 2), (4, 1), (2, 1))}
SPECS.update(CLUSTERED)
# Ping-pong: the shipped 64 x 128 tiles (6 stages), and 64 x 256 tiles (4 stages) with C from
# registers and staged.
PINGPONG = load_one(ROOT / "specs" / "hopper_tf32_pingpong.gemm")
SPECS.update({"hopper_tf32_pingpong": PINGPONG,
              "pingpong_64x256": replace(PINGPONG.with_values(block_n=256, stages=4), name="pingpong_64x256"),
              "pingpong_64x256_staged": replace(PINGPONG.with_values(block_n=256, stages=4, epilogue_staged=True),
                                                name="pingpong_64x256_staged"),
              # two 64-row slabs per consumer
              "pingpong_128x128": replace(PINGPONG.with_values(block_m=128, stages=4), name="pingpong_128x128"),
              # two slabs, each stored through the warps' boxes and TMA
              "pingpong_128x128_staged": replace(PINGPONG.with_values(block_m=128, epilogue_staged=True),
                                                 name="pingpong_128x128_staged")})
# Persistent clusters: whole clusters walking cluster tiles (staged C in one of them).
PERSISTENT_CLUSTERED = {
    "tf32_c2x1_persistent": replace(CLUSTERED["tf32_c2x1"].with_values(schedule="persistent"), name="tf32_c2x1_persistent"),
    "tf32_c2x2_persistent_staged": replace(CLUSTERED["tf32_c2x2"].with_values(schedule="persistent", epilogue_staged=True),
                                           name="tf32_c2x2_persistent_staged"),
    "x3tf32_c1x2_persistent": replace(CLUSTERED["3xtf32_c1x2"].with_values(schedule="persistent"),
                                      name="x3tf32_c1x2_persistent"),
}
# Ping-pong in clusters: 128 x 128 per consumer in 1 x 2 and 2 x 1 (cuBLAS's at short K), 64 x 256
# staged in 2 x 1.
PERSISTENT_CLUSTERED.update({
    "pingpong_128x128_c1x2": replace(SPECS["pingpong_128x128"].with_values(cluster_n=2, stages=6), name="pingpong_128x128_c1x2"),
    "pingpong_128x128_c2x1": replace(SPECS["pingpong_128x128"].with_values(cluster_m=2), name="pingpong_128x128_c2x1"),
    "pingpong_128x128_c2x1_staged": replace(SPECS["pingpong_128x128_staged"].with_values(cluster_m=2),
                                            name="pingpong_128x128_c2x1_staged"),
    "pingpong_64x256_c2x1_staged": replace(SPECS["pingpong_64x256_staged"].with_values(cluster_m=2),
                                           name="pingpong_64x256_c2x1_staged"),
})
SPECS.update(PERSISTENT_CLUSTERED)
# Split K in a cluster (`split N cluster`): block 0 of a C tile's K slices stores C, the others add
# into it; 2, 4 and 8 slices, one or two consumer warpgroups, tf32 and 3xtf32.
SPLIT_CLUSTERED = {
    "tf32_split4_cluster": replace(load_one(ROOT / "specs" / "hopper_tf32.gemm").with_values(
        split=4, split_by="cluster"), name="tf32_split4_cluster"),
    "tf32_64x256_split8_cluster": replace(load_one(ROOT / "specs" / "hopper_tf32.gemm").with_values(
        block_m=64, stages=5, raster_group=1, split=8, split_by="cluster"), name="tf32_64x256_split8_cluster"),
    "x3tf32_split2_cluster": replace(load_one(ROOT / "specs" / "hopper_3xtf32.gemm").with_values(
        split=2, split_by="cluster"), name="x3tf32_split2_cluster"),
}
SPECS.update(SPLIT_CLUSTERED)
# Split K through a workspace (`split N workspace`): every slice writes its product to the tile's
# slots, the last to finish sums them in K order and stores C; 2 to 128 slices, one or two consumer
# warpgroups, tf32 and 3xtf32, a staged (TMA-stored) C.
SPLIT_WORKSPACE = {
    "hopper_tf32_split_workspace": load_one(ROOT / "specs" / "hopper_tf32_split_workspace.gemm"),
    "tf32_split4_workspace": replace(load_one(ROOT / "specs" / "hopper_tf32.gemm").with_values(
        split=4, split_by="workspace"), name="tf32_split4_workspace"),
    "tf32_64x128_split128_workspace": replace(load_one(ROOT / "specs" / "hopper_tf32.gemm").with_values(
        block_m=64, block_n=128, warp_n=128, mma_n=128, stages=8, raster_group=1, split=128, split_by="workspace"),
        name="tf32_64x128_split128_workspace"),
    "tf32_split3_workspace_staged": replace(load_one(ROOT / "specs" / "hopper_tf32.gemm").with_values(
        split=3, split_by="workspace", epilogue_staged=True), name="tf32_split3_workspace_staged"),
    "tf32_split4_workspace_staged_acol": replace(load_one(ROOT / "specs" / "hopper_tf32.gemm").with_values(
        layout_A="col", split=4, split_by="workspace", epilogue_staged=True), name="tf32_split4_workspace_staged_acol"),
    "x3tf32_split2_workspace": replace(load_one(ROOT / "specs" / "hopper_3xtf32.gemm").with_values(
        split=2, split_by="workspace"), name="x3tf32_split2_workspace"),
}
SPECS.update(SPLIT_WORKSPACE)


@pytest.fixture(scope="module", autouse=True)
def gpu():
    hopper_gpu.require_sm90("the scheduled kernels are sm_90a (wgmma, TMA)")


@pytest.fixture(scope="module")
def cp(gpu):
    import cupy
    return cupy


@pytest.fixture(scope="module")
def kernels(gpu):
    yield from hopper_gpu.kernel_cache(SPECS)


# 128 x 256 tiles (tf32) or 128 x 128 (3xtf32) on 132 SMs: fewer tiles than SMs, whole waves with
# one partial, beta, a leading dimension TMA cannot take (the fallback), a K of one partial tile.
CASES = verify.QUICK_CASES + (
    verify.Case(1024, 1024, 4096),
    verify.Case(2000, 3000, 700, beta=0.5),
    verify.Case(1536, 2816, 200),           # 132 tiles of 128 x 256: whole waves, no stream-K
    verify.Case(8192, 128, 8192 // 4),
    verify.Case(300, 300, 40000, alpha=-1.5),
    verify.Case(777, 1500, 33),
    verify.Case(515, 1031, 2049, pad=1),
    verify.Case(3392, 1280, 96),            # 265 tiles of 64 x 256 (530 of 64 x 128): turns odd and even
)


@pytest.mark.parametrize("name", sorted(set(SPECS) - set(CLUSTERED) - set(PERSISTENT_CLUSTERED)))
def test_scheduled_kernels_match_float64(name, kernels):
    report = verify.check(kernels(name), CASES, seed=21)
    assert report.ok, "\n".join(f"{r.case}: {r.message}" for r in report.failures)


@pytest.mark.parametrize("name", ["hopper_tf32_streamk", "hopper_3xtf32_streamk", "tf32_split4_workspace",
                                  "x3tf32_split2_workspace"])
@pytest.mark.parametrize("M,N,K", [(1024, 1024, 8192), (4092, 4092, 512), (64, 64, 131072 // 4)])
def test_stream_k_gives_the_same_bits_every_run(name, M, N, K, cp, kernels):
    kernel = kernels(name)
    rng = np.random.default_rng(M + N + K)
    a = cp.asarray(rng.uniform(-1, 1, (M, K)).astype(np.float32))
    b = cp.asfortranarray(cp.asarray(rng.uniform(-1, 1, (K, N)).astype(np.float32)))
    outputs = []
    for _ in range(10):
        c = cp.full((M, N), cp.nan, cp.float32)
        kernel(a, b, c)
        outputs.append(c.view(cp.uint32).get())
    cp.cuda.runtime.deviceSynchronize()
    different = [i for i, out in enumerate(outputs) if not np.array_equal(out, outputs[0])]
    assert not different, f"runs {different} differ from run 0 in {name} at {M}x{N}x{K}"
    product = np.asarray(a.get(), np.float64) @ np.asarray(b.get(), np.float64)
    result = outputs[0].view(np.float32)
    relative = np.linalg.norm(result - product) / np.linalg.norm(product)
    assert relative < (1e-6 if "3xtf32" in name else 2e-3), relative


def _build_abi(name: str, folder: Path, spec=None):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    plan = make_plan(spec or SPECS[name])
    source = folder / f"{name}.cu"
    source.write_text(generate(plan))
    library = folder / f"lib{name}.so"
    command = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17",
               "-o", str(library), str(source), "-lcudart"]
    from test_gpu import _cuda_library_dirs
    for folder in _cuda_library_dirs(nvcc):
        command += ["-Xlinker", f"-rpath={folder}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"nvcc failed:\n{done.stderr}"
    function = getattr(ctypes.CDLL(str(library)), plan.launcher_name)
    function.restype = ctypes.c_int
    function.argtypes = ([ctypes.c_int] * 3 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                               ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
                                               ctypes.c_void_p])
    return function


@pytest.mark.parametrize("name", ["hopper_tf32_streamk", "hopper_3xtf32_streamk", "hopper_tf32_persistent",
                                  "hopper_tf32_pingpong", "tf32_64x256_split8_cluster",
                                  "tf32_split4_workspace"])
def test_c_abi_on_two_streams_at_once_matches_float64(name, cp, tmp_path):
    """Each stream gets its own workspace: two stream-K GEMMs in flight together stay right, call
    after call and grid after grid (the flags the kernels leave zeroed, in a fixed place), and
    growing the workspace works."""
    function = _build_abi(name, tmp_path)
    math = "3xtf32" if "3xtf32" in name else "tf32"
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    # 4096^2 grows the workspace; then grids of 132, 2 and 132 blocks share it (the flags stay put)
    shapes = [(1024, 1024, 4096), (2000, 3000, 700), (4096, 4096, 1024), (128, 100, 64), (300, 500, 9000)]
    for M, N, K in shapes:
        rng = np.random.default_rng(M * 7 + K)
        A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
        B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
        C = rng.uniform(-1, 1, (M, N)).astype(np.float32)
        a, b = cp.asarray(A), cp.asfortranarray(cp.asarray(B))
        outs = [cp.asarray(C) for _ in streams]
        for _ in range(3):  # C = A B - C / 2, from C afresh each time
            for out in outs:
                out[...] = cp.asarray(C)
            cp.cuda.runtime.deviceSynchronize()
            for out, stream in zip(outs, streams):  # both in flight together
                status = function(M, N, K, 1.0, a.data.ptr, K, b.data.ptr, K, -0.5, out.data.ptr, N, stream.ptr)
                assert status == 0, f"{name} returned cudaError {status}"
            cp.cuda.runtime.deviceSynchronize()
        reference = A.astype(np.float64) @ B.astype(np.float64) - 0.5 * C
        scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)) + 0.5 * np.abs(C)
        tolerance = verify.tolerance(scale, K, math)
        for i, out in enumerate(outs):
            bad = ~(np.abs(out.get() - reference) <= tolerance)
            assert not bad.any(), f"{name} {M}x{N}x{K} on stream {i}: {int(bad.sum())} elements wrong"
        if "streamk" in name or "workspace" in name:
            assert np.array_equal(outs[0].get(), outs[1].get()), "the two streams' results differ"


# Clusters past C's edge (M or N below one cluster of tiles, or one over), beta, the fallback.
CLUSTER_CASES = verify.QUICK_CASES + (
    verify.Case(100, 300, 200),
    verify.Case(129, 257, 96, beta=0.5),
    verify.Case(3 * 128 + 1, 5 * 256 + 3, 1000, alpha=-1.5),
    verify.Case(4092, 4092, 4092),
    verify.Case(8192, 128, 2048),
)


@pytest.mark.parametrize("name", sorted(CLUSTERED) + sorted(PERSISTENT_CLUSTERED))
def test_cluster_kernels_match_float64(name, kernels):
    report = verify.check(kernels(name), CLUSTER_CASES, seed=5)
    assert report.ok, "\n".join(f"{r.case}: {r.message}" for r in report.failures)


@pytest.mark.parametrize("name", ["hopper_tf32_cluster", "tf32_c2x1_persistent", "pingpong_128x128_c1x2"])
def test_cluster_c_abi_matches_float64(name, cp, tmp_path):
    """The nvcc-built launcher starts whole clusters (__cluster_dims__) with slice-sized TMA boxes
    (persistent: no more clusters than fit the SMs, each walking cluster tiles)."""
    function = _build_abi(name, tmp_path)
    for M, N, K in [(4092, 4092, 1024), (100, 300, 200), (129, 2000, 700), (1, 1, 1), (1000, 1000, 1000)]:
        rng = np.random.default_rng(M + 3 * N + K)
        A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
        B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
        C = rng.uniform(-1, 1, (M, N)).astype(np.float32)
        a, b, out = cp.asarray(A), cp.asfortranarray(cp.asarray(B)), cp.asarray(C)
        status = function(M, N, K, 1.0, a.data.ptr, K, b.data.ptr, K, 0.25, out.data.ptr, N, 0)
        assert status == 0, f"cudaError {status} at {M}x{N}x{K}"
        cp.cuda.runtime.deviceSynchronize()
        reference = A.astype(np.float64) @ B.astype(np.float64) + 0.25 * C
        scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)) + 0.25 * np.abs(C)
        bad = ~(np.abs(out.get() - reference) <= verify.tolerance(scale, K, "tf32"))
        assert not bad.any(), f"{M}x{N}x{K}: {int(bad.sum())} elements wrong"
