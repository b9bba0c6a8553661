"""gemmgen.matmul(..., devices=...) on the CPU: a library's call split over simulated devices
(tests/fake_streams.py), one library runtime per device as the launcher; inputs on any device, C
gathered on its own (a new one on A's); what it cannot take refused before any work."""

from __future__ import annotations

import contextlib
import itertools
import types

import numpy as np
import pytest

import gemmgen
import gemmgen.library.devices as split_devices
import gemmgen.library.dispatch as dispatch
import gemmgen.library.runtime as library_runtime
from fake_device import INFO, ReferenceKernel
from fake_streams import SimulatedDevices, on_device
from gemmgen.gpu.runtime import ShapeError
from gemmgen.library.layouts import CLASSES
from host_libraries import LibraryOnHost

LAYOUTS = list(itertools.product(("row", "col"), repeat=3))


class DeviceLibrary(LibraryOnHost):
    """A host library of one operand class on one device: its calls say it ran there."""

    def __init__(self, klass, device):
        super().__init__(klass)
        self.device = device


@pytest.fixture
def devices(monkeypatch):
    """Four simulated devices behind gemmgen.matmul(devices=...), libraries of every class on each,
    and a CuPy whose `empty` makes arrays on its current device."""
    layer = SimulatedDevices(7, count=4)
    libraries = {(klass, device): DeviceLibrary(klass, device) for klass in CLASSES for device in range(4)}
    monkeypatch.setattr(split_devices, "layer", lambda: layer)
    monkeypatch.setattr(dispatch, "library", lambda precision, device, klass: libraries[klass, device])
    monkeypatch.setattr(dispatch, "available_classes", lambda precision: frozenset(CLASSES))
    current = [0]

    @contextlib.contextmanager
    def device(ordinal):
        previous, current[0] = current[0], ordinal
        yield
        current[0] = previous

    cupy = types.ModuleType("cupy")
    cupy.float32 = np.float32
    cupy.cuda = types.SimpleNamespace(Device=device)
    cupy.empty = lambda shape, dtype: on_device(np.full(shape, np.nan), current[0])
    monkeypatch.setitem(__import__("sys").modules, "cupy", cupy)
    return layer, libraries


def operands(M, N, K, layouts, places, seed=0):
    rng = np.random.default_rng(seed)
    values = [rng.uniform(-1, 1, s).astype(np.float32) for s in ((M, K), (K, N), (M, N))]
    return values, [on_device(x, d, layout) for x, d, layout in zip(values, places, layouts)]


@pytest.mark.parametrize("layouts", LAYOUTS, ids=["A{}-B{}-C{}".format(*x) for x in LAYOUTS])
def test_a_call_split_over_devices_is_right_in_every_layout_from_inputs_anywhere(layouts, devices):
    layer, libraries = devices
    (A, B, C), (dA, dB, dC) = operands(300, 260, 200, layouts, places=(1, 2, 0))
    assert gemmgen.matmul(dA, dB, dC, alpha=0.5, beta=2.0, devices=[0, 1, 2]) is dC
    np.testing.assert_allclose(dC, 0.5 * (A.astype(np.float64) @ B) + 2.0 * C, rtol=1e-5, atol=1e-5)
    used = {device for (klass, device), library in libraries.items() if library.calls}
    assert used == {0, 1, 2}                               # each device launched with its own library
    ran = {klass for (klass, _), library in libraries.items() if library.calls}
    assert len(ran) == 1                                   # the routed class, as on one GPU
    assert layer.moved > 0


def test_a_new_out_is_made_on_As_device_and_all_splits_over_every_device(devices):
    layer, libraries = devices
    (A, B, _), (dA, dB, _) = operands(512, 384, 96, ("row", "col", "row"), places=(2, 2, 2), seed=1)
    out = gemmgen.matmul(dA, dB, devices="all")
    assert out.device == 2 and out.shape == (512, 384)
    np.testing.assert_allclose(out, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)
    assert {device for (_, device), library in libraries.items() if library.calls} == {0, 1, 2, 3}


def test_what_a_split_call_cannot_take_is_refused_before_any_work(devices):
    layer, _ = devices
    (_, _, _), (dA, dB, dC) = operands(64, 64, 64, ("row", "col", "row"), places=(0, 0, 0))
    with pytest.raises(ValueError, match="takes no stream"):
        gemmgen.matmul(dA, dB, dC, devices=[0, 1], stream=5)
    with pytest.raises(ValueError, match=r"device\(s\) \[4\] not present: this machine has 4"):
        gemmgen.matmul(dA, dB, dC, devices=[0, 4])
    with pytest.raises(ValueError, match="a list of device ordinals"):
        gemmgen.matmul(dA, dB, dC, devices=[0, "1"])
    with pytest.raises(ShapeError, match="inner sizes differ"):
        gemmgen.matmul(dA, on_device(np.zeros((32, 8)), 0), devices=[0, 1])
    assert not layer.ops


def batch_of(values, device, layout):
    """A (batch, rows, cols) array on `device` whose matrices are `layout`-major."""
    if layout == "row":
        return on_device(values, device)
    return on_device(np.ascontiguousarray(values.transpose(0, 2, 1)), device).transpose(0, 2, 1)


@pytest.mark.parametrize("layouts", [("row", "row", "row"), ("row", "col", "row"), ("col", "row", "col")])
def test_a_batch_splits_over_devices_by_whole_matrices(layouts, devices):
    layer, libraries = devices
    rng = np.random.default_rng(4)
    A, B, C = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((10, 48, 32), (10, 32, 40), (10, 48, 40)))
    dA, dB, dC = (batch_of(x, d, layout) for x, d, layout in zip((A, B, C), (1, 0, 0), layouts))
    assert gemmgen.matmul(dA, dB, dC, alpha=0.5, beta=2.0, devices=[0, 1, 2, 3]) is dC
    np.testing.assert_allclose(dC, 0.5 * np.einsum("bmk,bkn->bmn", A.astype(np.float64), B) + 2.0 * C,
                               rtol=1e-5, atol=1e-5)
    matrices = {device: sum(c[0] if len(c) == 4 else 1 for c in library.calls)  # (batch, M, N, K) or (M, N, K)
                for (_, device), library in libraries.items() if library.calls}
    assert matrices == {0: 3, 1: 3, 2: 2, 3: 2}  # whole matrices, each once


def test_a_shared_operand_of_a_batch_goes_to_each_device_once(devices):
    layer, libraries = devices
    rng = np.random.default_rng(5)
    A, B = rng.uniform(-1, 1, (48, 32)).astype(np.float32), rng.uniform(-1, 1, (8, 32, 40)).astype(np.float32)
    out = gemmgen.matmul(on_device(A, 0), on_device(B, 0), devices="all")  # A broadcast over the batch
    assert out.shape == (8, 48, 40) and out.device == 0
    np.testing.assert_allclose(out, np.einsum("mk,bkn->bmn", A.astype(np.float64), B), rtol=1e-5, atol=1e-5)
    sent = [op.nbytes for op in layer.ops if op.kind == "copy" and op.link == (0, 1)]
    assert sum(sent) == 4 * (48 * 32 + 2 * 32 * 40)  # A once, B's 2 matrices
    # A batch whose rows fold into one GEMM (B shared) splits as that GEMM, by rows
    folded = gemmgen.matmul(on_device(B.transpose(0, 2, 1).copy(), 0), on_device(A.T.copy(), 0), devices=[0, 1])
    np.testing.assert_allclose(folded, np.einsum("bnk,km->bnm", B.transpose(0, 2, 1).astype(np.float64), A.T),
                               rtol=1e-5, atol=1e-5)


def test_the_shipped_library_runs_split_with_a_runtime_per_device(monkeypatch):
    """The real LibraryRuntime as the split's launcher (kernels computed on the host): each device's
    runtime chooses its member for the block shape it computes, and the product is right."""
    layer = SimulatedDevices(3, count=4)
    monkeypatch.setattr(split_devices, "layer", lambda: layer)
    monkeypatch.setattr(library_runtime, "Kernel", ReferenceKernel)
    monkeypatch.setattr(library_runtime, "device_info", lambda ordinal=0: INFO)
    monkeypatch.setattr(dispatch, "_runtimes", {})
    monkeypatch.setattr(dispatch, "available_classes", lambda precision: frozenset({("row", "col")}))
    (A, B, C), (dA, dB, dC) = operands(768, 512, 384, ("row", "col", "row"), places=(0, 0, 0), seed=2)
    gemmgen.matmul(dA, dB, dC, beta=-1.0, devices=[0, 1, 2, 3])
    np.testing.assert_allclose(dC, A.astype(np.float64) @ B - C, rtol=1e-4, atol=1e-4)
    runtimes = {device: runtime for (name, device), runtime in dispatch._runtimes.items()}
    assert sorted(runtimes) == [0, 1, 2, 3] and all(runtime._kernels for runtime in runtimes.values())
    assert all(kernel.plan.spec["layout.A"] == "row" for r in runtimes.values() for kernel in r._kernels.values())
    assert len(layer.prepared.entries) == 1
