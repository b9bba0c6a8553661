"""Splitting one GEMM over several GPUs, with the devices simulated on the CPU (tests/fake_streams.py:
streams that run out of order, kept only by the events the split records)."""

from __future__ import annotations

import ctypes
import itertools
from pathlib import Path

import numpy as np
import pytest

from fake_device import ReferenceKernel, to_tf32
from fake_streams import SimulatedDevices, on_device
from gemmgen.multigpu.parts import Balance, Part, choose_axis, make_parts, partition, schedule, split_traffic
from gemmgen.multigpu.scaling import parse_devices
from gemmgen.multigpu.split import MultiGpuError, Shard, resident_gemm, split_gemm
from gemmgen.plan import make_plan
from gemmgen.language.load import load_one, parse

SPECS = Path(__file__).resolve().parent.parent / "specs"
SMALL = "kernel small { block 32 x 32 x 8; thread 4 x 4 }"   # 32 x 32 tiles: several chunks at small sizes
LAYOUTS = list(itertools.product(("row", "col"), repeat=3))


def small_plan(a="row", b="row", c="row", **values):
    spec = parse(SMALL)[0].with_values(layout_A=a, layout_B=b, layout_C=c, **values)
    return make_plan(spec)


def problem(M, N, K, layouts, home=0, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
    C = rng.uniform(-1, 1, (M, N)).astype(np.float32)
    return A, B, C, [on_device(x, home, layout) for x, layout in zip((A, B, C), layouts)]


def expected(A, B, C, alpha, beta):
    return alpha * (A.astype(np.float64) @ B) + beta * C


# --- planning ---------------------------------------------------------------------------------------

def test_bands_are_whole_tiles_spread_as_evenly_as_can_be():
    assert partition(1000, [0, 1, 2], 128) == [(0, 384), (384, 768), (768, 1000)]
    assert partition(130, [0, 1, 2, 3], 128) == [(0, 128), (128, 130), (130, 130), (130, 130)]
    assert [p.size for p in make_parts(100, 1000, 50, [0, 1], 1, 128)] == [512, 488]


@pytest.mark.parametrize("shape, axis", [
    ((8192, 8192, 8192), 0),        # square: rows (a tie with columns; K adds the reduction)
    ((16384, 256, 4096), 0),        # tall C: bands of rows carry little of B
    ((256, 16384, 4096), 1),        # wide C: bands of columns
    ((1024, 1024, 65536), 2),       # small C, long K: slabs of K, partial Cs summed
    ((127, 4099, 1023), 1),
])
def test_the_split_is_along_the_dimension_that_moves_the_fewest_bytes(shape, axis):
    M, N, K = shape
    assert choose_axis(M, N, K, [0, 1], home=0, beta=False) == axis


def test_the_byte_model_counts_what_each_part_off_the_inputs_device_receives_and_returns():
    M, N, K = 1024, 2048, 4096
    rows = make_parts(M, N, K, [0, 1], 0, 128)            # device 1 gets rows 512..1024
    assert split_traffic(M, N, K, rows, 0, beta=False).link_bytes == 4 * (512 * K + K * N + 512 * N)
    assert split_traffic(M, N, K, rows, 0, beta=True).link_bytes == 4 * (512 * K + K * N + 2 * 512 * N)
    slabs = make_parts(M, N, K, [0, 1, 2], 2, 128)         # 32 tiles of K: 11, 11 and 10
    assert [p.size for p in slabs] == [1408, 1408, 1280]
    traffic = split_traffic(M, N, K, slabs, 0, beta=True)  # beta is applied on device 0: no C sent
    assert traffic.link_bytes == 4 * ((1408 + 1280) * (M + N) + 2 * M * N)  # slabs in, partials back
    assert traffic.reduction_bytes == 4 * 3 * M * N * 2
    elsewhere = split_traffic(M, N, K, rows, home=7, beta=False)  # inputs on a GPU that takes no part
    assert elsewhere.link_bytes == 4 * (M * K + 2 * K * N + M * N)


def test_a_part_streams_its_inputs_in_chunks_each_copied_once():
    part = Part(1, 0, 0, 96)                                 # rows 0..96 of C, on a remote device
    steps = schedule(part, 96, 128, 64, beta=0.5, copy_a=True, copy_b=True, chunks=4, granule=32,
                     k_granule=16, accumulate=True, gather=True)
    # The first block of columns is cut along K; the first piece applies beta, later ones add.
    assert [(s.cols, s.ks, s.beta) for s in steps[:4]] == [((0, 32), (0, 16), 0.5), ((0, 32), (16, 32), 1.0),
                                                          ((0, 32), (32, 48), 1.0), ((0, 32), (48, 64), 1.0)]
    assert [s.cols for s in steps[4:]] == [(32, 64), (64, 96), (96, 128)]
    a_copied = np.zeros((96, 64), int)
    b_copied = np.zeros((64, 128), int)
    for s in steps:
        if s.copy_a:
            (r0, r1), (k0, k1) = s.copy_a
            a_copied[r0:r1, k0:k1] += 1
        if s.copy_b:
            (k0, k1), (c0, c1) = s.copy_b
            b_copied[k0:k1, c0:c1] += 1
    assert (a_copied == 1).all() and (b_copied == 1).all()
    assert [s.gather for s in steps if s.gather] == [((0, 96), c) for c in ((0, 32), (32, 64), (64, 96), (96, 128))]
    assert sum(s.copy_c is not None for s in steps) == 4        # C read by beta, once per block
    # A kernel that cannot accumulate (epilogue alpha) is not cut along K.
    whole_k = schedule(part, 96, 128, 64, beta=0.0, copy_a=True, copy_b=True, chunks=4, granule=32,
                       k_granule=16, accumulate=False, gather=True)
    assert all(s.ks == (0, 64) for s in whole_k) and len(whole_k) == 4


# --- results, in every layout, axis and math mode ------------------------------------------------------

@pytest.mark.parametrize("layouts", LAYOUTS, ids=["A{}-B{}-C{}".format(*x) for x in LAYOUTS])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_the_split_result_equals_the_whole_product_in_every_layout(layouts, axis):
    plan = small_plan(*layouts)
    M, N, K = 150, 137, 161
    A, B, C0, (dA, dB, dC) = problem(M, N, K, layouts)
    for seed in range(3):  # three interleavings of the streams
        dC[...] = C0
        layer = SimulatedDevices(seed)
        result = split_gemm(plan, dA, dB, dC, alpha=0.5, beta=2.0, devices=[0, 1, 2], layer=layer,
                            axis=axis)
        np.testing.assert_allclose(dC, expected(A, B, C0, 0.5, 2.0), rtol=1e-4, atol=1e-4)
        assert result.axis == axis and {p.device for p in result.parts} == {0, 1, 2}
        assert layer.moved == result.bytes_moved == split_traffic(M, N, K, result.parts, 0, True).link_bytes
        assert all(ms > 0 for ms in result.kernel_ms.values())


@pytest.mark.parametrize("shape", [(300, 40, 64), (40, 300, 64), (48, 40, 2000), (5, 3, 2)])
def test_the_chosen_split_is_right_whatever_the_shape(shape):
    M, N, K = shape
    A, B, C0, (dA, dB, dC) = problem(M, N, K, ("row", "col", "row"), seed=1)
    result = split_gemm(small_plan("row", "col"), dA, dB, dC, alpha=1.5, beta=-1.0, devices=[0, 1],
                        layer=SimulatedDevices(4))
    np.testing.assert_allclose(dC, expected(A, B, C0, 1.5, -1.0), rtol=1e-4, atol=1e-4)
    assert result.axis == (choose_axis(M, N, K, [0, 1], 0, True, (32, 32, 32)) if K else 0)


def test_inputs_on_a_gpu_that_takes_no_part_are_copied_to_every_one_that_does():
    M, N, K = 64, 64, 900
    A, B, C0, (dA, dB, dC) = problem(M, N, K, ("col", "row", "col"), home=5)
    layer = SimulatedDevices(2)
    result = split_gemm(small_plan("col", "row", "col"), dA, dB, dC, alpha=1.0, beta=3.0,
                        devices=[1, 2], layer=layer, axis=2)
    np.testing.assert_allclose(dC, expected(A, B, C0, 1.0, 3.0), rtol=1e-4, atol=1e-4)
    assert result.bytes_moved == split_traffic(M, N, K, result.parts, 5, True).link_bytes


@pytest.mark.parametrize("spec, math", [("tensorcore_tf32", "tf32"), ("tensorcore_3xtf32", "3xtf32"),
                                        ("hopper_3xtf32", "3xtf32")])
def test_tensor_core_kernels_split_like_the_whole(spec, math):
    plan = make_plan(load_one(SPECS / f"{spec}.gemm"))
    layouts = tuple(plan.spec[f"layout.{x}"] for x in "AB") + (plan.c_layout,)
    M, N, K = 300, 260, 200
    A, B, C0, (dA, dB, dC) = problem(M, N, K, layouts)
    split_gemm(plan, dA, dB, dC, alpha=1.0, beta=0.0, devices=[0, 1], layer=SimulatedDevices(1))
    if math == "tf32":  # rounded inputs, FP32 products: what one GPU computes on the whole
        A, B = to_tf32(A), to_tf32(B)
    np.testing.assert_allclose(dC, expected(A, B, C0, 1.0, 0.0), rtol=1e-4, atol=1e-4)


class Library:
    """A library entry point: not a Plan, one launch that picks a kernel per call."""

    def __init__(self):
        self.small, self.large = ReferenceKernel(small_plan()), ReferenceKernel(small_plan())
        self.layouts = self.small.layouts
        self.calls = []

    def launch(self, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream=None):
        self.calls.append((M, N, K))
        (self.small if K < 64 else self.large).launch(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)


def test_a_library_entry_point_is_split_like_a_kernel():
    libraries = {d: Library() for d in (0, 1)}
    A, B, C0, (dA, dB, dC) = problem(700, 300, 500, ("row",) * 3)
    result = split_gemm(libraries.__getitem__, dA, dB, dC, alpha=2.0, beta=0.5, devices=[0, 1],
                        layer=SimulatedDevices(3))
    np.testing.assert_allclose(dC, expected(A, B, C0, 2.0, 0.5), rtol=1e-4, atol=1e-4)
    assert all(libraries[d].calls for d in (0, 1))
    assert result.axis == 0 and [p.size for p in result.parts] == [384, 316]  # bands of 128 rows


# --- overlap: what a kernel waits for -----------------------------------------------------------------

def test_a_remote_devices_first_kernel_waits_for_its_first_chunk_not_all_its_inputs():
    A, B, C0, (dA, dB, dC) = problem(256, 256, 256, ("row",) * 3)
    layer = SimulatedDevices(0)
    split_gemm(small_plan(), dA, dB, dC, devices=[0, 1], layer=layer, axis=0, chunks=4)
    remote = [op for op in layer.ops if op.device == 1]
    copies_in = [op for op in layer.ops if op.kind == "copy" and op.link == (0, 1)]  # sent by GPU 0
    launches = [op for op in remote if op.kind == "launch"]
    gathers = [op for op in remote if op.kind == "copy" and op.stream == (1, "out")]
    first_needs = layer.ancestors(launches[0]) & set(copies_in)
    assert 0 < len(first_needs) < len(copies_in) / 4
    # The first block of C goes back while later kernels still run.
    assert launches[-1] not in layer.ancestors(gathers[0])
    assert len(gathers) == 4
    # On the inputs' own device nothing is copied in: A and B are read where they are.
    assert not [op for op in layer.ops if op.device == 0 and op.kind == "copy" and op.stream == (0, "in")]


def test_copies_can_be_forced_on_the_inputs_device_to_exercise_them_on_one_gpu():
    A, B, C0, (dA, dB, dC) = problem(200, 90, 70, ("col", "col", "row"))
    layer = SimulatedDevices(5)
    result = split_gemm(small_plan("col", "col"), dA, dB, dC, devices=[0, 0], layer=layer, local_views=False)
    np.testing.assert_allclose(dC, expected(A, B, C0, 1.0, 0.0), rtol=1e-4, atol=1e-4)
    assert result.bytes_moved == 0 and sum(op.kind == "copy" for op in layer.ops) > 4


# --- balance: devices that start late or run slower take less ---------------------------------------

def test_a_balance_gives_each_device_the_size_that_ends_all_together():
    balance = Balance()
    key = ("k", 1)
    assert balance.weights(key, 2, 1000) is None  # nothing seen: evenly
    # Device 0: 1 ms per 100 rows, nothing fixed; device 1 as fast but starting 2 ms late.
    balance.learn(key, 2, [(0, 500, (5.0, 5.0)), (1, 500, (5.0, 900.0))])  # a first call: not learnt
    assert balance.weights(key, 2, 1000) is None
    balance.learn(key, 2, [(0, 500, (5.0, 5.0)), (1, 500, (5.0, 7.0))])
    w = balance.weights(key, 2, 1000)
    assert w[0] + w[1] == pytest.approx(1000) and w[0] / 100 == pytest.approx(w[1] / 100 + 2)
    # A device whose fixed cost alone outlasts the others' work gets nothing.
    for _ in range(2):
        balance.learn(("k", 2), 2, [(0, 500, (5.0, 5.0)), (1, 500, (5.0, 50.0))])
    assert balance.weights(("k", 2), 2, 1000) == [1000, 0.0]
    assert partition(1000, [0, 1], 100, [600.0, 400.0]) == [(0, 600), (600, 1000)]
    assert partition(1000, [0, 1, 2], 100, [1.0, 1.0, 1.0]) == [(0, 400), (400, 700), (700, 1000)]


@pytest.mark.parametrize("case", ["slower GPU", "slow link"])
def test_repeated_calls_learn_to_give_the_late_device_less_and_end_sooner(case):
    """Simulated: GPU 1 computes at half speed, or its inputs cross a slow link. The first call
    splits evenly; later calls of the same shape move rows to GPU 0 until both end together, and
    every result stays right."""
    M, N, K = 512, 256, 256
    A, B, C0, (dA, dB, dC) = problem(M, N, K, ("row",) * 3)
    options = {"speed": {1: 0.5}} if case == "slower GPU" else {"link_bytes_per_ms": 16e6}
    balance, ends, sizes = Balance(), [], []
    for call in range(6):
        dC[...] = np.nan
        result = split_gemm(small_plan(), dA, dB, dC, devices=[0, 1], layer=SimulatedDevices(call, **options),
                            axis=0, balance=balance)
        np.testing.assert_allclose(dC, expected(A, B, C0, 1.0, 0.0), rtol=1e-4, atol=1e-4)
        ends.append(max(result.span_ms.values()))
        sizes.append([p.size for p in result.parts])
    assert sizes[0] == sizes[1] == [256, 256] and sizes[-1][0] > sizes[-1][1]
    assert ends[-1] < 0.85 * ends[0]
    spans = list(result.span_ms.values())
    assert max(spans) - min(spans) <= 0.25 * max(spans)   # within about a tile of ending together


# --- failures ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("stage", ["allocate", "copy", "launch", "sync"])
def test_a_failing_device_is_named_and_a_C_that_beta_reads_is_left_alone(stage):
    A, B, C0, (dA, dB, dC) = problem(300, 40, 64, ("row",) * 3)
    with pytest.raises(MultiGpuError, match=r"device 1 failed while .*C was not written"):
        split_gemm(small_plan(), dA, dB, dC, beta=0.5, devices=[0, 1],
                   layer=SimulatedDevices(0, fail_on=(1, stage)))
    assert (dC == C0).all()
    with pytest.raises(MultiGpuError, match=r"device 1 failed while .*C is partly written \(beta = 0"):
        split_gemm(small_plan(), dA, dB, dC, devices=[0, 1], layer=SimulatedDevices(0, fail_on=(1, stage)))


def test_with_beta_0_the_devices_write_C_itself_and_nothing_is_staged():
    A, B, C0, (dA, dB, dC) = problem(300, 40, 64, ("row",) * 3)
    layer = SimulatedDevices(2)
    split_gemm(small_plan(), dA, dB, dC, devices=[0, 1], layer=layer, axis=0)
    np.testing.assert_allclose(dC, expected(A, B, C0, 1.0, 0.0), rtol=1e-4, atol=1e-4)
    assert not [op for op in layer.ops if op.kind == "copy" and op.stream == (0, "out")]
    assert layer.allocated and all(region.device == 1 for region in layer.allocated)  # no staging C on GPU 0


def test_what_cannot_be_split_is_refused_before_any_work():
    A, B, C0, (dA, dB, dC) = problem(64, 64, 64, ("row",) * 3)
    with pytest.raises(ValueError, match="epilogue alpha.*beta must be 0"):
        split_gemm(small_plan(epilogue_beta=False), dA, dB, dC, beta=1.0, devices=[0, 1],
                   layer=SimulatedDevices())
    with pytest.raises(ValueError, match="reduce min.*cannot be split"):
        split_gemm(make_plan(load_one(SPECS / "smallest.gemm")), dA, dB, dC, devices=[0, 1],
                   layer=SimulatedDevices())
    with pytest.raises(ValueError, match="is not col-major"):   # arrays in another layout than the kernel's
        split_gemm(small_plan("col"), dA, dB, dC, devices=[0, 1], layer=SimulatedDevices())
    assert (dC == C0).all()


# --- shards already on their devices ------------------------------------------------------------------

def test_resident_shards_give_bands_of_C_with_no_copies():
    M, N, K = 300, 70, 90
    rng = np.random.default_rng(0)
    A, B = rng.uniform(-1, 1, (M, K)).astype(np.float32), rng.uniform(-1, 1, (K, N)).astype(np.float32)
    bands = [(0, 128), (128, 256), (256, 300)]
    shards = [Shard(on_device(A[r0:r1], d, "col"), on_device(B, d, "row")) for d, (r0, r1) in enumerate(bands)]
    layer = SimulatedDevices(7)
    result = resident_gemm(small_plan("col", "row"), shards, alpha=2.0, layer=layer)
    for (r0, r1), band, device in zip(bands, result.bands, range(3)):
        assert band.device == device
        np.testing.assert_allclose(band, 2.0 * (A[r0:r1].astype(np.float64) @ B), rtol=1e-4, atol=1e-4)
    assert not [op for op in layer.ops if op.kind == "copy"] and len(result.kernel_ms) == 3


def test_a_shard_spread_over_two_devices_is_refused_naming_them():
    A = on_device(np.ones((8, 8)), 0)
    with pytest.raises(ValueError, match="B is on device 1 and its A on 0"):
        resident_gemm(small_plan(), [Shard(A, on_device(np.ones((8, 8)), 1))], layer=SimulatedDevices())


def test_device_lists_are_parsed_and_checked():
    assert parse_devices("all", 4) == [0, 1, 2, 3]
    assert parse_devices("0,0", 1) == [0, 0]
    with pytest.raises(ValueError, match="not present: this machine has 2"):
        parse_devices("0,3", 2)
    with pytest.raises(ValueError, match="'all' or comma-separated"):
        parse_devices("gpu0", 2)
    with pytest.raises(ValueError, match="no CUDA device"):
        parse_devices("all", 0)


# --- the CuPy layer's 2-D copies, on host memory -------------------------------------------------------

class HostRuntime:
    """cupy.cuda.runtime's calls CupyLayer.copy makes, done at once on host addresses."""

    CUDARuntimeError = RuntimeError

    def __init__(self):
        self.peers = []

    def memcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):
        assert kind == 4 and width <= min(dpitch, spitch), "cudaMemcpyDefault, pitches >= width"
        for line in range(height):
            ctypes.memmove(dst + line * dpitch, src + line * spitch, width)

    def deviceCanAccessPeer(self, a, b):
        return True

    def deviceEnablePeerAccess(self, peer):
        self.peers.append(peer)


@pytest.mark.parametrize("layout", ["row", "col"])
def test_the_cupy_layer_copies_a_block_with_its_leading_dimensions(layout, monkeypatch):
    import contextlib
    import sys
    from types import SimpleNamespace

    from gemmgen.multigpu.cupy_layer import CupyLayer
    from gemmgen.multigpu.parts import Region
    runtime = HostRuntime()
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(
        cuda=SimpleNamespace(runtime=runtime, Device=lambda device: contextlib.nullcontext())))
    layer = CupyLayer()
    order = "C" if layout == "row" else "F"
    source = np.array(np.arange(7 * 9, dtype=np.float32).reshape(7, 9), order=order)
    target = np.array(np.full((4, 5), np.nan, np.float32), order=order)
    src = Region(0, source.ctypes.data, 7, 9, layout, 9 if layout == "row" else 7)
    dst = Region(1, target.ctypes.data, 4, 5, layout, 5 if layout == "row" else 4)
    layer.copy(dst, src.sub((2, 6), (3, 8)), SimpleNamespace(ptr=0))
    np.testing.assert_array_equal(target, source[2:6, 3:8])
    assert sorted(runtime.peers) == [0, 1]     # peer access both ways, once
    with pytest.raises(ValueError, match="copy between a 4 x 4"):
        layer.copy(dst, src.sub((0, 4), (0, 4)), SimpleNamespace(ptr=0))
