"""The host's share of a split GEMM (issue 30): a call key is prepared once (parts, buffers, steps,
events) and later calls only bind their arrays; the devices' steps are issued in rounds from the
calling thread, a fixed amount of work per device; a block every part needs is relayed from part
to part. Devices simulated on the CPU (tests/fake_streams.py)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import fake_streams
import gemmgen
from fake_streams import SimulatedDevices, on_device
from gemmgen.multigpu.parts import batch_parts
from gemmgen.multigpu.prepared import PreparedCache
from gemmgen.multigpu.split import MultiGpuError, Shard, release, resident_gemm, split_gemm
from test_multigpu import expected, problem, small_plan

PLANNING = {"schedule", "make_parts", "partition", "choose_axis", "split_traffic", "_prepare", "_plan",
            "allocate", "kernel_plan"}
OURS = (str(Path(gemmgen.__file__).parent), fake_streams.__file__)


def calling_thread_work(call, where=OURS) -> Counter:
    """The function calls (Python functions and builtins) made on this thread while `call()` runs,
    by name, in the files under `where` (gemmgen's and the fake layer's by default)."""
    counts = Counter()

    def profile(frame, event, arg):
        if event in ("call", "c_call") and frame.f_code.co_filename.startswith(where):
            counts[frame.f_code.co_name if event == "call" else getattr(arg, "__qualname__", str(arg))] += 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return counts


# --- prepared once, bound per call ----------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2])
def test_a_call_key_is_prepared_once_and_later_calls_bind_their_own_arrays(axis):
    layer = SimulatedDevices(3)
    plan = small_plan()
    for call in range(3):  # new A, B and C each call: other addresses, same key
        A, B, C0, (dA, dB, dC) = problem(200, 96, 80, ("row",) * 3, seed=call)
        before = len(layer.allocated)
        result = split_gemm(plan, dA, dB, dC, alpha=0.5, beta=2.0, devices=[0, 1, 2], layer=layer, axis=axis)
        np.testing.assert_allclose(dC, expected(A, B, C0, 0.5, 2.0), rtol=1e-4, atol=1e-4)
        assert result.axis == axis and result.bytes_moved > 0 and all(ms > 0 for ms in result.kernel_ms.values())
        if call:
            assert len(layer.allocated) == before  # nothing allocated after the first call
    assert len(layer.prepared.entries) == 1


def test_calls_with_beta_0_and_other_scalars_reuse_the_split_and_write_C_in_place():
    layer = SimulatedDevices(5)
    A, B, C0, (dA, dB, dC) = problem(256, 64, 96, ("row", "col", "row"))
    plan = small_plan("row", "col")
    for alpha in (1.0, -3.0):
        split_gemm(plan, dA, dB, dC, alpha=alpha, devices=[0, 1, 2, 3], layer=layer, axis=2)
        np.testing.assert_allclose(dC, expected(A, B, C0, alpha, 0.0), rtol=1e-4, atol=1e-4)
    assert len(layer.prepared.entries) == 1


def test_the_oldest_prepared_split_goes_with_its_buffers_when_another_comes():
    layer = SimulatedDevices(1)
    plan = small_plan()
    first = None
    for m in range(PreparedCache.KEPT + 1):
        A, B, C0, (dA, dB, dC) = problem(64 + 32 * m, 40, 48, ("row",) * 3)
        split_gemm(plan, dA, dB, dC, devices=[0, 1], layer=layer, axis=0)
        np.testing.assert_allclose(dC, expected(A, B, C0, 1.0, 0.0), rtol=1e-4, atol=1e-4)
        if first is None:
            first = list(layer.allocated)
    assert len(layer.prepared.entries) == PreparedCache.KEPT
    assert first and all(region in layer.freed for region in first)
    release(layer)
    assert not layer.prepared.entries and set(layer.allocated) <= set(layer.freed)


def test_after_a_failed_call_the_next_one_prepares_afresh_and_is_right():
    layer = SimulatedDevices(2, fail_on=(1, "launch"))
    A, B, C0, (dA, dB, dC) = problem(200, 64, 64, ("row",) * 3)
    with pytest.raises(MultiGpuError, match=r"device 1 failed while running the kernel: .*C was not written"):
        split_gemm(small_plan(), dA, dB, dC, beta=1.0, devices=[0, 1], layer=layer)
    assert (dC == C0).all() and not layer.prepared.entries
    layer.fail_on = None
    split_gemm(small_plan(), dA, dB, dC, beta=1.0, devices=[0, 1], layer=layer)
    np.testing.assert_allclose(dC, expected(A, B, C0, 1.0, 1.0), rtol=1e-4, atol=1e-4)


# --- issued in rounds from the calling thread; B relayed ------------------------------------------

@pytest.mark.parametrize("axis, beta", [(0, 0.0), (1, 0.5), (2, 0.5)], ids=["rows", "columns-staged", "K-summed"])
def test_every_devices_first_kernel_is_queued_before_any_devices_second(axis, beta):
    layer = SimulatedDevices(4)
    A, B, C0, (dA, dB, dC) = problem(256, 256, 256, ("row",) * 3)
    split_gemm(small_plan(), dA, dB, dC, beta=beta, devices=[0, 1, 2, 3], layer=layer, axis=axis)
    np.testing.assert_allclose(dC, expected(A, B, C0, 1.0, beta), rtol=1e-4, atol=1e-4)
    launches = [op.device for op in layer.ops if op.kind == "launch"]
    firsts = [launches.index(device) for device in range(4)]
    seconds = [i for i, device in enumerate(launches) if launches.index(device) != i]
    assert max(firsts) < min(seconds), launches


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("seed", range(4))
def test_a_block_every_part_needs_leaves_its_device_once_and_is_relayed_part_to_part(axis, seed):
    """Bands of rows all need B (bands of columns all need A): device 0 sends it once, to device
    1; device 2 takes it from device 1 once it has landed there, device 3 from device 2. Right for
    any order the simulated streams run in."""
    layer = SimulatedDevices(seed)
    M, N, K = 256, 256, 192
    A, B, C0, (dA, dB, dC) = problem(M, N, K, ("row",) * 3, seed=seed)
    split_gemm(small_plan(), dA, dB, dC, devices=[0, 1, 2, 3], layer=layer, axis=axis)
    np.testing.assert_allclose(dC, expected(A, B, C0, 1.0, 0.0), rtol=1e-4, atol=1e-4)
    copies = [op for op in layer.ops if op.kind == "copy" and op.link[0] != op.link[1]]
    shared = 4 * K * (N if axis == 0 else M)  # all of B (or A)
    band = 4 * K * (M if axis == 0 else N) // 4  # a part's own band of A (or B)
    out_band = 4 * M * N // 4
    sent = Counter()
    for op in copies:
        sent[op.link] += op.nbytes
    assert sent[0, 1] == shared + band and sent[0, 2] == sent[0, 3] == band
    assert sent[1, 2] == sent[2, 3] == shared and not sent[1, 3]
    assert sent[1, 0] == sent[2, 0] == sent[3, 0] == out_band  # C's bands back
    for relayed in (op for op in copies if op.link in ((1, 2), (2, 3))):
        holders = [op for op in SimulatedDevices.ancestors(relayed) if op.kind == "copy"
                   and op.link == (relayed.link[0] - 1, relayed.link[0]) and op.nbytes == relayed.nbytes]
        assert holders, "a relayed block waits for its copy into the part before"


def test_the_inputs_device_sends_each_block_on_one_stream_in_the_order_the_rounds_need_them():
    """GPU 0 holds A and B: what it sends goes out on its one send stream, a block after another,
    in the order the rounds issue them (GPU 1's slices of A and B, then GPU 2's and GPU 3's slices
    of A, B reaching them from GPU 1 and 2), not as three streams pulling at once."""
    layer = SimulatedDevices(1)
    A, B, C0, (dA, dB, dC) = problem(256, 256, 192, ("row",) * 3)
    split_gemm(small_plan(), dA, dB, dC, devices=[0, 1, 2, 3], layer=layer, axis=0)
    np.testing.assert_allclose(dC, expected(A, B, C0, 1.0, 0.0), rtol=1e-4, atol=1e-4)
    leaving = [op for op in layer.ops if op.kind == "copy" and op.link[0] == 0 and op.link[1] != 0]
    assert {op.stream for op in leaving} == {(0, "send")}
    assert [op.link[1] for op in leaving][:8] == [1, 1, 2, 3, 1, 1, 2, 3]


@pytest.mark.parametrize("axis, beta", [(0, 0.0), (0, 0.5), (1, 0.0), (2, 0.5)],
                         ids=["rows", "rows-staged", "columns", "K-summed"])
def test_after_the_first_call_a_call_only_issues_a_fixed_amount_per_device(axis, beta):
    """After the first call of a key, a call plans nothing and allocates nothing; what it does on
    the calling thread is bounded by a fixed amount per step (a step's copies, kernel and events)
    and per device (waiting for it), nothing more."""
    work, steps, plan = {}, {}, small_plan()
    for count in (2, 4, 8):
        layer = SimulatedDevices(count)
        A, B, C0, (dA, dB, dC) = problem(512, 512, 256, ("row",) * 3)
        devices = list(range(count))
        run = lambda: split_gemm(plan, dA, dB, dC, alpha=0.5, beta=beta, devices=devices,  # noqa: E731
                                 layer=layer, axis=axis)
        first = calling_thread_work(run)
        assert PLANNING & set(first)  # the first call prepares
        allocated = len(layer.allocated)
        dC[...] = C0
        # gemmgen's own calls: the simulated devices' running of the queued work is not the host's
        launched = sum(op.kind == "launch" for op in layer.ops)
        work[count] = sum(calling_thread_work(run, OURS[:1]).values())
        steps[count] = sum(op.kind == "launch" for op in layer.ops) - launched
        np.testing.assert_allclose(dC, expected(A, B, C0, 0.5, beta), rtol=1e-4, atol=1e-4)
        assert len(layer.allocated) == allocated
        assert not PLANNING & set(calling_thread_work(run)), "a later call plans again"
    assert all(work[n] <= 35 * (steps[n] + n) for n in work), (work, steps)


def test_resident_shards_are_launched_a_device_at_a_time_before_any_is_waited_for():
    M, N, K = 256, 70, 90
    rng = np.random.default_rng(0)
    A, B = rng.uniform(-1, 1, (M, K)).astype(np.float32), rng.uniform(-1, 1, (K, N)).astype(np.float32)
    shards = [Shard(on_device(A[32 * d:32 * (d + 1)], d % 4), on_device(B, d % 4)) for d in range(8)]
    layer = SimulatedDevices(3)
    result = resident_gemm(small_plan(), shards, layer=layer)
    for d, band in enumerate(result.bands):
        np.testing.assert_allclose(band, A[32 * d:32 * (d + 1)].astype(np.float64) @ B, rtol=1e-4, atol=1e-4)
    launches = [op.device for op in layer.ops if op.kind == "launch"]
    assert launches == [0, 1, 2, 3, 0, 1, 2, 3]  # a shard of each device in turn
    assert len(result.kernel_ms) == 8 and all(ms > 0 for ms in result.kernel_ms)


def test_a_resident_shard_that_fails_is_named():
    shards = [Shard(on_device(np.ones((32, 8)), d), on_device(np.ones((8, 32)), d)) for d in range(3)]
    with pytest.raises(MultiGpuError, match=r"device 2 failed while waiting for the results"):
        resident_gemm(small_plan(), shards, layer=SimulatedDevices(0, fail_on=(2, "sync")))


# --- batches: split by batch first --------------------------------------------------------------------------

def test_a_batch_splits_into_whole_matrices_per_device():
    assert batch_parts(64, [0, 1, 2, 3]) == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert batch_parts(10, [0, 1, 2, 3]) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert batch_parts(2, [0, 1, 2]) == [(0, 1), (1, 2), (2, 2)]
