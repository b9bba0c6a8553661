"""The host's share of a split GEMM (issue 30): a call key is prepared once (parts, buffers, steps,
events) and later calls only bind their arrays; each device's work is issued and waited for on its
own thread; the calling thread's work is the same for 2, 4 and 8 devices. Devices simulated on the
CPU (tests/fake_streams.py)."""

from __future__ import annotations

import sys
import threading
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


def calling_thread_work(call) -> Counter:
    """The function calls (Python functions and builtins) that gemmgen and the fake layer make on
    this thread while `call()` runs, by name. The device threads are not profiled (sys.setprofile
    is per thread); neither is the threading module's own waiting, whose steps depend on timing."""
    counts = Counter()

    def profile(frame, event, arg):
        if event in ("call", "c_call") and frame.f_code.co_filename.startswith(OURS):
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


# --- one thread per device, constant work on the caller's ----------------------------------------------

@pytest.mark.parametrize("axis, beta", [(0, 0.0), (1, 0.5), (2, 0.5)], ids=["rows", "columns-staged", "K-summed"])
def test_each_device_is_issued_from_its_own_thread_and_never_from_the_callers(axis, beta):
    layer = SimulatedDevices(4)
    A, B, C0, (dA, dB, dC) = problem(256, 256, 256, ("row",) * 3)
    split_gemm(small_plan(), dA, dB, dC, beta=beta, devices=[0, 1, 2, 3], layer=layer, axis=axis)
    np.testing.assert_allclose(dC, expected(A, B, C0, 1.0, beta), rtol=1e-4, atol=1e-4)
    caller = threading.get_ident()
    launches = [op for op in layer.ops if op.kind == "launch"]
    threads = {device: {op.thread for op in launches if op.device == device} for device in range(4)}
    assert all(len(t) == 1 for t in threads.values()), threads           # one thread per device
    assert len(set().union(*threads.values())) == 4 and caller not in set().union(*threads.values())
    # The caller's only op: copying the staged C into C, when beta reads C.
    assert {op.kind for op in layer.ops if op.thread == caller} <= ({"copy"} if beta else set())


@pytest.mark.parametrize("axis, beta", [(0, 0.0), (0, 0.5), (1, 0.0), (2, 0.5)],
                         ids=["rows", "rows-staged", "columns", "K-summed"])
def test_the_calling_threads_work_per_call_is_the_same_for_2_4_and_8_devices(axis, beta):
    """After the first call of a key, a call plans nothing, allocates nothing and makes the same
    calls on the calling thread whatever the number of devices: the copies, kernels, events and
    waits of each device are issued on that device's thread."""
    work, plan = {}, small_plan()
    for count in (2, 4, 8):
        layer = SimulatedDevices(count)
        A, B, C0, (dA, dB, dC) = problem(512, 512, 256, ("row",) * 3)
        devices = list(range(count))
        run = lambda: split_gemm(plan, dA, dB, dC, alpha=0.5, beta=beta, devices=devices,  # noqa: E731
                                 layer=layer, axis=axis)
        first = calling_thread_work(run)
        assert PLANNING & set(first)  # the first call prepares, on the calling thread
        ops = len(layer.ops)
        dC[...] = C0
        work[count] = calling_thread_work(run)
        np.testing.assert_allclose(dC, expected(A, B, C0, 0.5, beta), rtol=1e-4, atol=1e-4)
        assert len(layer.ops) - ops > 6 * count  # the devices' work was all issued, by their threads
        assert not PLANNING & set(work[count]), sorted(PLANNING & set(work[count]))
    assert work[2] == work[4] == work[8], (work[2] - work[8]) + (work[8] - work[2])
    assert sum(work[8].values()) < 150


def test_resident_shards_are_launched_and_waited_for_on_their_devices_threads():
    M, N, K = 256, 70, 90
    rng = np.random.default_rng(0)
    A, B = rng.uniform(-1, 1, (M, K)).astype(np.float32), rng.uniform(-1, 1, (K, N)).astype(np.float32)
    shards = [Shard(on_device(A[64 * d:64 * (d + 1)], d), on_device(B, d)) for d in range(4)]
    layer = SimulatedDevices(3)
    result = resident_gemm(small_plan(), shards, layer=layer)
    for d, band in enumerate(result.bands):
        np.testing.assert_allclose(band, A[64 * d:64 * (d + 1)].astype(np.float64) @ B, rtol=1e-4, atol=1e-4)
    launches = [op for op in layer.ops if op.kind == "launch"]
    assert len({op.thread for op in launches}) == 4 and threading.get_ident() not in {op.thread for op in launches}
    assert len(result.kernel_ms) == 4 and all(ms > 0 for ms in result.kernel_ms)


def test_a_resident_shard_that_fails_is_named():
    shards = [Shard(on_device(np.ones((32, 8)), d), on_device(np.ones((8, 32)), d)) for d in range(3)]
    with pytest.raises(MultiGpuError, match=r"device 2 failed while waiting for the results"):
        resident_gemm(small_plan(), shards, layer=SimulatedDevices(0, fail_on=(2, "sync")))


# --- batches (issue 29): split by batch first ------------------------------------------------------------

def test_a_batch_splits_into_whole_matrices_per_device():
    assert batch_parts(64, [0, 1, 2, 3]) == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert batch_parts(10, [0, 1, 2, 3]) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert batch_parts(2, [0, 1, 2]) == [(0, 1), (1, 2), (2, 2)]
