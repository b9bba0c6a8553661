"""A strided batch split over several GPUs by batch (issue 30): whole matrices per device, shared
operands relayed, C written only when every device finished where beta reads it. Devices simulated
on the CPU (tests/fake_streams.py), whose streams run out of order."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from fake_streams import SimArray, SimulatedDevices
from gemmgen.multigpu.batched import Shares, keep_home, split_batched
from gemmgen.multigpu.parts import Region
from gemmgen.multigpu.prepared import PreparedCache
from gemmgen.multigpu.split import MultiGpuError
from test_multigpu import small_plan


def stack(count, rows, cols, layout, device, rng, pad=0, shared=False):
    """`count` matrices (one when shared) in one device array, each `layout`-major with its leading
    dimension `pad` past the width, the batch stride one matrix's storage plus 7 floats of gap
    when padded; the array, its first matrix as a Region, the stride and the values."""
    lines, length = (rows, cols) if layout == "row" else (cols, rows)
    ld = length + pad
    stride = lines * ld + (7 if pad else 0)
    n = 1 if shared else count
    storage = np.full(max(1, n * stride), np.nan, np.float32).view(SimArray)
    storage.device = device
    values = rng.uniform(-1, 1, (n, rows, cols)).astype(np.float32)
    for i in range(n):
        block = storage[i * stride:i * stride + lines * ld].reshape(lines, ld)[:, :length]
        block[...] = values[i] if layout == "row" else values[i].T
    region = Region(device, storage.__array_interface__["data"][0], rows, cols, layout, ld)
    return storage, region, 0 if shared else stride, np.broadcast_to(values, (count, rows, cols))


def read(storage, region, stride, count):
    lines, length = (region.rows, region.cols) if region.layout == "row" else (region.cols, region.rows)
    out = []
    for i in range(count):
        block = storage[i * stride:i * stride + lines * region.ld].reshape(lines, region.ld)[:, :length]
        out.append(block if region.layout == "row" else block.T)
    return np.array(out)


def run(count, M, N, K, layouts=("row", "row", "row"), devices=(0, 1, 2, 3), beta=0.0, shared="", pad=0,
        seed=0, layer=None, chunks=4, homes=(0, 0, 0)):
    rng = np.random.default_rng(seed)
    layer = layer or SimulatedDevices(seed)
    plan = small_plan(*layouts)
    sa, a, stride_a, A = stack(count, M, K, layouts[0], homes[0], rng, pad, "A" in shared)
    sb, b, stride_b, B = stack(count, K, N, layouts[1], homes[1], rng, pad, "B" in shared)
    sc, c, stride_c, C0 = stack(count, M, N, layouts[2], homes[2], rng, pad)
    C0 = C0.copy()
    result = split_batched(lambda d: layer.kernel(d, plan), a, b, c, batch=count,
                           strides=(stride_a, stride_b, stride_c), alpha=0.5, beta=beta, devices=list(devices),
                           layer=layer, chunks=chunks)
    want = 0.5 * np.einsum("bmk,bkn->bmn", A.astype(np.float64), B) + beta * C0
    return result, read(sc, c, stride_c, count), want, layer, (sc, C0, c, stride_c)


@pytest.mark.parametrize("layouts", [("row", "row", "row"), ("row", "col", "row"), ("col", "row", "col")])
@pytest.mark.parametrize("shared", ["", "A", "B"])
@pytest.mark.parametrize("beta", [0.0, 1.5])
@pytest.mark.parametrize("seed", range(2))
def test_every_matrix_of_the_batch_matches_float64(layouts, shared, beta, seed):
    result, got, want, _, _ = run(11, 40, 24, 16, layouts, beta=beta, shared=shared, pad=3, seed=seed)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert [(d, stop - start) for d, start, stop in result.parts] == [(0, 3), (1, 3), (2, 3), (3, 2)]
    assert len(result.kernel_ms) == 4


@pytest.mark.parametrize("homes", [(1, 2, 0), (3, 3, 3), (0, 1, 2)])
def test_operands_may_start_on_any_device(homes):
    _, got, want, _, _ = run(9, 33, 17, 20, beta=0.5, homes=homes)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_shared_b_leaves_its_device_once_and_is_relayed_device_to_device():
    M, N, K, count = 64, 48, 32, 16
    result, got, want, layer, _ = run(count, M, N, K, shared="B")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    sent = Counter()
    for op in layer.ops:
        if op.kind == "copy" and op.link[0] != op.link[1]:
            sent[op.link] += op.nbytes
    a_share, b_bytes, c_share = 4 * M * K * count // 4, 4 * K * N, 4 * M * N * count // 4
    assert sent[0, 1] == a_share + b_bytes and sent[0, 2] == sent[0, 3] == a_share
    assert sent[1, 2] == sent[2, 3] == b_bytes and not sent[1, 3]
    assert sent[1, 0] == sent[2, 0] == sent[3, 0] == c_share
    assert result.bytes_moved == sum(sent.values())


def test_a_later_call_of_the_same_shape_allocates_nothing():
    layer = SimulatedDevices(0)
    run(8, 32, 32, 32, layer=layer)
    run(8, 32, 32, 32, layer=layer, seed=2)
    allocated = len(layer.allocated)
    _, got, want, _, _ = run(8, 32, 32, 32, layer=layer, seed=1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert len(layer.allocated) == allocated and len(layer.prepared.entries) == 1


def test_the_oldest_prepared_batch_goes_with_its_buffers_when_another_comes():
    layer = SimulatedDevices(0)
    first = None
    for m in range(PreparedCache.KEPT + 1):
        _, got, want, _, _ = run(4, 16 + 8 * m, 24, 16, layer=layer)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        first = first or list(layer.allocated)
    assert len(layer.prepared.entries) == PreparedCache.KEPT and all(region in layer.freed for region in first)


def test_more_devices_than_matrices_leaves_the_rest_idle():
    result, got, want, _, _ = run(2, 32, 32, 32, devices=(0, 1, 2, 3))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert [p[0] for p in result.parts] == [0, 1]


def test_a_device_that_fails_is_named_and_with_beta_c_is_untouched():
    layer = SimulatedDevices(0, fail_on=(2, "launch"))
    with pytest.raises(MultiGpuError, match=r"device 2 failed while running the kernel: .*C was not written"):
        run(8, 32, 32, 32, beta=1.0, layer=layer)
    # run() poisoned nothing of C: read it back from a fresh failing call's arrays
    layer = SimulatedDevices(0, fail_on=(3, "sync"))
    rng = np.random.default_rng(5)
    sc, c, stride_c, C0 = stack(8, 32, 32, "row", 0, rng)
    sa, a, stride_a, _ = stack(8, 32, 32, "row", 0, rng)
    sb, b, stride_b, _ = stack(8, 32, 32, "row", 0, rng)
    plan = small_plan()
    with pytest.raises(MultiGpuError, match=r"device 3 failed while waiting for the results"):
        split_batched(lambda d: layer.kernel(d, plan), a, b, c, batch=8, strides=(stride_a, stride_b, stride_c),
                      beta=1.0, devices=[0, 1, 2, 3], layer=layer)
    assert (read(sc, c, stride_c, 8) == C0).all()


def test_bad_arguments_are_refused_before_any_work():
    layer = SimulatedDevices(0)
    rng = np.random.default_rng(0)
    _, a, _, _ = stack(4, 8, 8, "row", 0, rng)
    _, b, _, _ = stack(4, 8, 8, "row", 0, rng)
    _, c, _, _ = stack(4, 8, 8, "row", 0, rng)
    kernel = lambda d: layer.kernel(d, small_plan())  # noqa: E731
    with pytest.raises(ValueError, match="C's batch stride is 0"):
        split_batched(kernel, a, b, c, batch=4, strides=(64, 64, 0), devices=[0, 1], layer=layer)
    with pytest.raises(ValueError, match="batch must be >= 0"):
        split_batched(kernel, a, b, c, batch=-1, strides=(64, 64, 64), devices=[0, 1], layer=layer)
    assert split_batched(kernel, a, b, c, batch=0, strides=(64, 64, 64), devices=[0, 1], layer=layer).parts == []
    assert not layer.ops


def test_the_gpu_holding_the_inputs_keeps_the_batch_where_the_others_finish_no_sooner():
    assert keep_home(64, 1.0, 64.0) and keep_home(64, 1.0, 80.0)
    assert not keep_home(64, 1.0, 20.0)


@pytest.mark.parametrize("speed", ["fast", "slow"])
def test_after_its_second_call_a_batch_from_one_gpu_stays_there_when_the_others_cannot_help(speed):
    """Simulated links: fast (the split pays: even parts from then on), or each GPU's one outgoing
    port so slow that the others finish later than GPU 0 would alone: from the third call GPU 0
    keeps the batch, sooner than the even split, and every result stays right. The key is
    prepared at most twice."""
    M = N = K = 64
    flops = 2 * M * N * K / 1e9                       # simulated ms per matrix at speed 1
    port = float("inf") if speed == "fast" else 4 * 2 * M * K / (3 * flops)  # a matrix's inputs: 3 kernels
    layer = SimulatedDevices(0, port_bytes_per_ms=port)
    rng = np.random.default_rng(0)
    sa, a, stride_a, A = stack(48, M, K, "row", 0, rng)
    sb, b, stride_b, B = stack(48, K, N, "row", 0, rng)
    sc, c, stride_c, _ = stack(48, M, N, "row", 0, rng)
    plan = small_plan()
    shares, spans, parts = Shares(), [], []
    for call in range(4):
        sc[...] = np.nan
        result = split_batched(lambda d: layer.kernel(d, plan), a, b, c, batch=48,
                               strides=(stride_a, stride_b, stride_c), devices=[0, 1, 2, 3], layer=layer,
                               shares=shares)
        np.testing.assert_allclose(read(sc, c, stride_c, 48), np.einsum("bmk,bkn->bmn", A.astype(np.float64), B),
                                   rtol=1e-4, atol=1e-4)
        spans.append(max(result.span_ms.values()))
        parts.append([(d, stop - start) for d, start, stop in result.parts])
    assert parts[0] == parts[1] == [(0, 12), (1, 12), (2, 12), (3, 12)]
    if speed == "fast":
        assert parts[2] == parts[3] == parts[0]
    else:
        assert parts[2] == parts[3] == [(0, 48)] and spans[-1] < spans[1], (parts, spans)
    assert len(layer.prepared.entries) <= 2


def test_a_batch_kept_on_its_gpu_runs_as_one_launch_in_place():
    """A batch the split keeps on the GPU holding it (here the only device), C there and beta 0: one
    batched launch in place, no copies, nothing prepared; with beta the staged path runs as before,
    and a shared operand on another GPU is still copied in."""
    M, N, K = 24, 40, 16
    layer = SimulatedDevices(0)
    rng = np.random.default_rng(3)
    sa, a, stride_a, A = stack(6, M, K, "row", 0, rng)
    sb, b, stride_b, B = stack(6, K, N, "row", 0, rng)
    sc, c, stride_c, _ = stack(6, M, N, "row", 0, rng)
    plan = small_plan()
    kinds = []
    real_issue = layer._issue
    layer._issue = lambda op: (kinds.append(op.kind), real_issue(op))[1]
    result = split_batched(lambda d: layer.kernel(d, plan), a, b, c, batch=6, strides=(stride_a, stride_b, stride_c),
                           devices=[0], layer=layer, alpha=2.0)
    np.testing.assert_allclose(read(sc, c, stride_c, 6), 2.0 * np.einsum("bmk,bkn->bmn", A.astype(np.float64), B),
                               rtol=1e-4, atol=1e-4)
    assert [k for k in kinds if k in ("launch", "copy")] == ["launch"] and result.parts == [(0, 0, 6)]
    assert result.span_ms[0] > 0 and not layer.prepared.entries
    kinds.clear()
    split_batched(lambda d: layer.kernel(d, plan), a, b, c, batch=6, strides=(stride_a, stride_b, stride_c),
                  devices=[0], layer=layer, beta=0.5)
    assert "copy" in kinds and layer.prepared.entries  # beta: C staged, so that a failure leaves it as it was
