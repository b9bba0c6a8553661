"""Several GPUs (or several parts on one): a split GEMM is right in every layout, axis and math
mode, and on machines with two GPUs or more, it scales (the must-holds of issue 14)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gemmgen.plan import make_plan
from gemmgen.language.load import load_one

pytestmark = pytest.mark.gpu
SPECS = Path(__file__).resolve().parent.parent / "specs"
LAYOUTS = [("row", "row", "row"), ("row", "col", "col"), ("col", "row", "row"), ("col", "col", "col")]


def _devices():
    from gemmgen.gpu.runtime import device_count
    return device_count()


def _several():
    count = _devices()
    if count < 2:
        pytest.skip(f"{count} GPU here: this needs two or more (nvidia-h200-x2 or larger)")
    return list(range(count))


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("layouts", LAYOUTS, ids=["A{}-B{}-C{}".format(*x) for x in LAYOUTS])
def test_parts_on_one_gpu_with_their_copies_match_float64_in_every_layout(layouts, axis):
    """Two parts on GPU 0 that copy their inputs as if remote: the copies, events, chunks and the
    K split's reduction, on real streams."""
    from gemmgen.multigpu.scaling import measure_scaling

    a, b, c = layouts
    plan = make_plan(load_one(SPECS / "hopper_simt.gemm").with_values(layout_A=a, layout_B=b, layout_C=c))
    report, worst = measure_scaling(plan, 1037, 1100, 777, [0, 0], runs=1, axis=axis, local_views=False)
    assert worst <= 1.0
    assert report.split.axis == axis and report.split.bytes_moved == 0
    assert all(ms > 0 for ms in report.split.kernel_ms.values())


@pytest.mark.parametrize("spec", ["hopper_3xtf32", "hopper_tf32", "tensorcore_3xtf32", "hopper_skinny"])
def test_tensor_core_kernels_split_on_one_gpu_match_float64(spec):
    """The TMA kernels (A row, B col) that issue 14 found could not be split."""
    from gemmgen.multigpu.scaling import measure_scaling

    plan = make_plan(load_one(SPECS / f"{spec}.gemm"))
    for axis in (0, 2):
        report, worst = measure_scaling(plan, 1024, 768, 1536, [0, 0], runs=1, axis=axis, local_views=False)
        assert worst <= 1.0, (spec, axis)


@pytest.mark.parametrize("beta", [0.0, 0.75], ids=["beta0-C-written-in-place", "beta-staged"])
def test_a_gemm_split_over_every_gpu_matches_float64(beta):
    import cupy as cp

    from gemmgen.multigpu.cupy_layer import CupyLayer
    from gemmgen.multigpu.scaling import _inputs, worst_error_ratio
    from gemmgen.multigpu.split import split_gemm

    devices = _several()
    layer = CupyLayer()
    for spec in ("hopper_simt", "hopper_3xtf32"):
        plan = make_plan(load_one(SPECS / f"{spec}.gemm"))
        kernel = layer.kernel(0, plan)
        for shape in ((1537, 1200, 333), (256, 4096, 1000), (512, 512, 20000)):
            with cp.cuda.Device(0):
                A, B, C = _inputs(cp, *shape, kernel.layouts, sum(shape))
                C0 = cp.random.default_rng(1).uniform(-1, 1, C.shape).astype(cp.float32)
                C[...] = C0
                result = split_gemm(plan, A, B, C, beta=beta, devices=devices, layer=layer, balance=None)
                worst = worst_error_ratio(cp, A, B, C, plan.math, beta, C0)
            assert worst <= 1.0, (spec, shape, beta)
            assert result.bytes_moved > 0 and len(result.parts) == len(devices)


def test_a_split_and_a_kernel_on_another_gpu_leave_the_callers_device_current():
    """A caller working on GPU 0 (CuPy's current device) stays there: its next array lands on
    GPU 0 after a split over every GPU and after a kernel launched on GPU 1."""
    import cupy as cp

    from gemmgen.multigpu.split import split_gemm
    from gemmgen.gpu.runtime import Kernel

    devices = _several()
    plan = make_plan(load_one(SPECS / "hopper_simt.gemm"))
    with cp.cuda.Device(1):
        A1, B1 = cp.ones((256, 64), cp.float32), cp.ones((64, 256), cp.float32)
        C1 = cp.zeros((256, 256), cp.float32)
    with cp.cuda.Device(0):
        A, B = cp.ones((512, 64), cp.float32), cp.ones((64, 512), cp.float32)
        C = cp.zeros((512, 512), cp.float32)
        split_gemm(plan, A, B, C, devices=devices, axis=0)
        assert cp.cuda.runtime.getDevice() == 0 and cp.empty(4).device.id == 0
        Kernel(plan, device=1)(A1, B1, C1)
        assert cp.cuda.runtime.getDevice() == 0 and cp.empty(4).device.id == 0
        assert float(C.min()) == float(C.max()) == 64.0
    with cp.cuda.Device(1):
        cp.cuda.Device(1).synchronize()
        assert float(C1.min()) == float(C1.max()) == 64.0


@pytest.mark.parametrize("spec", ["hopper_simt", "hopper_3xtf32"])
@pytest.mark.parametrize("shape", [(8192, 8192, 8192), (16384, 16384, 8192)], ids=["8192^3", "16384x16384x8192"])
def test_end_to_end_scaling_and_resident_shards_hold_their_must(spec, shape):
    """Issue 14's must-holds: inputs on GPU 0, checked against float64: end to end >= 0.85 N,
    shards already resident >= 0.95 N."""
    from gemmgen.multigpu.scaling import measure_scaling

    devices = _several()
    plan = make_plan(load_one(SPECS / f"{spec}.gemm"))
    report, worst = measure_scaling(plan, *shape, devices, runs=3)
    n = len(devices)
    print(f"{spec} {shape}: 1 GPU {report.one_gpu_tflops:.1f} TFLOP/s; {n} GPUs end to end "
          f"{report.end_to_end_tflops:.1f} ({report.scaling(report.end_to_end_tflops):.2f} x {n}, split along "
          f"axis {report.split.axis}, {report.split.bytes_moved / 2**20:.0f} MiB moved), resident "
          f"{report.resident_tflops:.1f} ({report.scaling(report.resident_tflops):.2f} x {n})")
    assert worst <= 1.0
    assert report.scaling(report.end_to_end_tflops) >= 0.85
    assert report.scaling(report.resident_tflops) >= 0.95
