"""Splitting one GEMM over several GPUs, with the device layer faked at its boundary (CPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gemmgen.multigpu import MultiGpuError, Part, parse_devices, partition, split_gemm
from gemmgen.plan import make_plan
from gemmgen.spec import load_one

SPECS = Path(__file__).resolve().parent.parent / "specs"


@pytest.fixture(scope="module")
def plan():
    return make_plan(load_one(SPECS / "warptile.gemm"))  # 128 x 128 tiles


class FakeDevices:
    """NumPy stands in for the GPUs: 'placing' copies, 'launching' multiplies in float32."""

    def __init__(self, fail_on=None, fail_at="launch"):
        self.fail_on, self.fail_at = fail_on, fail_at
        self.placed, self.launched = [], []

    def _maybe_fail(self, device, stage):
        if device == self.fail_on and stage == self.fail_at:
            raise RuntimeError(f"CUDA_ERROR_ILLEGAL_ADDRESS on fake device {device}")

    def place(self, device, array, layout):
        self._maybe_fail(device, "place")
        self.placed.append((device, array.shape, layout))
        return np.array(array, dtype=np.float32, order="C" if layout == "row" else "F")

    def stream(self, device):
        return f"stream{device}"

    def launch(self, device, plan, a, b, c, alpha, beta, stream):
        self._maybe_fail(device, "launch")
        self.launched.append((device, a.shape, b.shape, c.shape))
        c[...] = alpha * (a @ b) + beta * c

    def start_timer(self, device, stream):
        return device

    def stop_timer(self, device, stream, timer):
        self._maybe_fail(device, "sync")
        return 1.0 + device

    def synchronize(self, device):
        self._maybe_fail(device, "sync")

    def gather(self, target, part, band):
        if part.axis == 0:
            target[part.start:part.stop, :] = band
        else:
            target[:, part.start:part.stop] = band


def test_bands_follow_the_longer_side_in_whole_tiles(plan):
    rows = partition(1000, 300, [0, 1, 2], plan)
    assert [(p.axis, p.start, p.stop) for p in rows] == [(0, 0, 384), (0, 384, 768), (0, 768, 1000)]
    cols = partition(100, 1000, [0, 1], plan)
    assert [(p.axis, p.start, p.stop) for p in cols] == [(1, 0, 512), (1, 512, 1000)]
    few = partition(130, 10, [0, 1, 2, 3], plan)  # 2 tiles for 4 devices: two get nothing
    assert [p.size for p in few] == [128, 2, 0, 0]


@pytest.mark.parametrize("shape", [(517, 300, 77), (90, 1100, 33), (5, 3, 2)])
def test_split_result_equals_the_whole_product(plan, shape):
    M, N, K = shape
    rng = np.random.default_rng(0)
    A, B = rng.uniform(-1, 1, (M, K)).astype(np.float32), rng.uniform(-1, 1, (K, N)).astype(np.float32)
    C0 = rng.uniform(-1, 1, (M, N)).astype(np.float32)
    C = C0.copy()
    devices = FakeDevices()
    result = split_gemm(plan, A, B, C, alpha=0.5, beta=2.0, devices=[0, 1, 2], layer=devices)
    expected = 0.5 * (A.astype(np.float64) @ B) + 2.0 * C0
    assert np.allclose(C, expected, rtol=1e-5, atol=1e-5)
    assert sum(p.size for p in result.parts) == (M if M >= N else N)
    assert result.slowest_kernel_ms == 1.0 + max(p.device for p in result.parts)
    # each device got only its band of the split operand and all of the other one
    for _, a_shape, b_shape, c_shape in devices.launched:
        assert (a_shape[0] == c_shape[0]) and (b_shape[1] == c_shape[1])


@pytest.mark.parametrize("stage", ["place", "launch", "sync"])
def test_a_failing_device_is_named_and_C_is_left_alone(plan, stage):
    A = np.ones((300, 8), np.float32)
    B = np.ones((8, 40), np.float32)
    C = np.full((300, 40), 7.0, np.float32)
    with pytest.raises(MultiGpuError, match=r"device 1 failed while .*C was not written"):
        split_gemm(plan, A, B, C, devices=[0, 1], layer=FakeDevices(fail_on=1, fail_at=stage))
    assert (C == 7.0).all()


def test_device_lists_are_parsed_and_checked():
    assert parse_devices("all", 4) == [0, 1, 2, 3]
    assert parse_devices("0,0", 1) == [0, 0]
    with pytest.raises(ValueError, match="not present: this machine has 2"):
        parse_devices("0,3", 2)
    with pytest.raises(ValueError, match="'all' or comma-separated"):
        parse_devices("gpu0", 2)
    with pytest.raises(ValueError, match="no CUDA device"):
        parse_devices("all", 0)
    assert Part(0, 0, 3, 10).size == 7
