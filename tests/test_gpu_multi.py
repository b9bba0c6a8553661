"""Several GPUs (or several parts on one): a split GEMM, a kernel's or a library's (gemmgen.matmul(...,
devices=...)), is right in every layout, axis and math mode; the links between GPUs are measured; and
on machines with two GPUs or more, it scales (the must-holds of issues 14 and 30, on 2 and 4 GPUs)."""

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


def _count(n):
    count = _devices()
    if count < n:
        pytest.skip(f"{count} GPU(s) here: this needs {n} (nvidia-h100-x{n} or larger)")
    return list(range(n))


def _subject(name, devices):
    """A Plan, or the fp32 library as a LibraryRuntime per device (and its math)."""
    if name == "fp32":
        from gemmgen.library.dispatch import library
        runtimes = {d: library("fp32", d) for d in devices}
        runtimes[0].compile_all()
        return runtimes.__getitem__, "3xtf32"
    plan = make_plan(load_one(SPECS / f"{name}.gemm"))
    return plan, plan.math


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
@pytest.mark.parametrize("c_layout", ["row", "col"])
def test_the_library_split_into_parts_on_one_gpu_matches_float64(precision, c_layout):
    """gemmgen.matmul(devices=[0, 0]): two parts on GPU 0, each launched by the library's runtime,
    which chooses its member per block; a second call of the same key reuses the prepared split."""
    import cupy as cp

    import gemmgen
    from gemmgen.multigpu.scaling import worst_error_ratio
    from gemmgen.multigpu.split import default_layer

    rng = cp.random.default_rng(3)
    for M, N, K in ((1537, 1200, 333), (4096, 256, 2048)):
        A = rng.uniform(-1, 1, (M, K), dtype=cp.float32)
        B = cp.asfortranarray(rng.uniform(-1, 1, (K, N), dtype=cp.float32))
        C0 = rng.uniform(-1, 1, (M, N), dtype=cp.float32)
        prepared = []
        for _ in range(2):  # a new C each time: the same key
            C = C0.copy(order="C" if c_layout == "row" else "F")
            gemmgen.matmul(A, B, C, beta=0.5, precision=precision, devices=[0, 0])
            assert worst_error_ratio(cp, A, B, C, "tf32" if precision == "tf32" else "3xtf32", 0.5, C0) <= 1.0
            prepared.append(list(default_layer().prepared.entries.values())[-1])  # the newest used
        assert prepared[0] is prepared[1]
        new = gemmgen.matmul(A, B, precision=precision, devices=[0, 0])
        assert new.device.id == 0 and worst_error_ratio(cp, A, B, new, "tf32" if precision == "tf32" else "3xtf32") <= 1.0


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_the_library_split_over_every_gpu_from_inputs_anywhere_matches_float64(precision):
    """A on GPU 1, B on the last GPU, C on GPU 0 (A row, B row: a library class by copy or by its own)."""
    import cupy as cp

    import gemmgen
    from gemmgen.multigpu.scaling import worst_error_ratio

    devices = _several()
    math = "tf32" if precision == "tf32" else "3xtf32"
    for M, N, K in ((3000, 2000, 1000), (512, 512, 20000), (256, 8192, 1024)):
        with cp.cuda.Device(1):
            A = cp.random.default_rng(1).uniform(-1, 1, (M, K), dtype=cp.float32)
        with cp.cuda.Device(devices[-1]):
            B = cp.asfortranarray(cp.random.default_rng(2).uniform(-1, 1, (K, N), dtype=cp.float32))
        with cp.cuda.Device(0):
            C = cp.full((M, N), cp.nan, cp.float32)
        gemmgen.matmul(A, B, C, precision=precision, devices="all")
        with cp.cuda.Device(0):
            assert worst_error_ratio(cp, cp.asarray(A), cp.asarray(B), C, math) <= 1.0, (M, N, K)
        made = gemmgen.matmul(A, B, precision=precision, devices=devices)
        assert made.device.id == 1  # on A's GPU
        with cp.cuda.Device(1):
            assert worst_error_ratio(cp, A, cp.asarray(B), made, math) <= 1.0, (M, N, K)


BATCH_CASES = [  # (A's lead, B's lead, out's layout per matrix, pad): shared operands, strided batches
    ((10,), (10,), "row", 0), ((10,), (), "row", 0), ((), (10,), "col", 0), ((7,), (7,), "col", 3),
    ((2, 5), (1, 5), "row", 1)]


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
@pytest.mark.parametrize("lead_a, lead_b, c_layout, pad", BATCH_CASES,
                         ids=["packed", "B-shared-folds", "A-shared", "padded-strides", "4-D-broadcast"])
def test_a_batch_split_over_every_gpu_matches_float64(precision, lead_a, lead_b, c_layout, pad):
    """gemmgen.matmul of batches with devices="all": whole matrices per GPU (a shared operand sent
    to each once, relayed), or one GEMM of stacked rows where B is shared; strides with gaps and
    leading dimensions past the width take the per-matrix copies; beta reads C."""
    import cupy as cp

    import gemmgen
    from gemmgen.multigpu.scaling import worst_error_ratio

    _several()
    math = "tf32" if precision == "tf32" else "3xtf32"
    M, N, K = 301, 257, 190
    rng = cp.random.default_rng(7)

    def batch(lead, rows, cols):
        storage = rng.uniform(-1, 1, lead + (rows, cols + pad), dtype=cp.float32)
        return storage[..., :cols]  # rows `pad` floats past the width; batches that far apart too
    A, B = batch(lead_a, M, K), batch(lead_b, K, N)
    lead = cp.broadcast_shapes(lead_a, lead_b)
    C0 = rng.uniform(-1, 1, lead + (M, N), dtype=cp.float32)
    C = C0.copy() if c_layout == "row" else cp.ascontiguousarray(C0.swapaxes(-1, -2)).swapaxes(-1, -2)
    assert gemmgen.matmul(A, B, C, alpha=0.5, beta=-1.0, precision=precision, devices="all") is C
    a, b = cp.broadcast_to(A, lead + (M, K)).reshape(-1, M, K), cp.broadcast_to(B, lead + (K, N)).reshape(-1, K, N)
    c, c0 = C.reshape(-1, M, N), C0.reshape(-1, M, N)
    for i in range(a.shape[0]):
        assert worst_error_ratio(cp, 0.5 * a[i], b[i], c[i], math, -1.0, c0[i]) <= 1.0, i


def test_the_links_between_the_gpus_are_measured_and_nvidia_smi_read():
    import shutil

    from gemmgen.multigpu.cupy_layer import CupyLayer
    from gemmgen.multigpu.topology import record_links

    devices = list(range(_devices()))
    links = record_links(CupyLayer(), devices, nbytes=64 << 20, repeats=3)
    gbps = links["peer_bandwidth"]["gbps"]
    print(links["topology"]["text"], gbps)
    assert len(gbps) == len(devices) and all(v is not None and v > 5.0 for row in gbps for v in row)
    if shutil.which("nvidia-smi"):
        assert links["topology"]["error"] is None and "GPU0" in links["topology"]["text"]


@pytest.mark.parametrize("count", [2, 4])
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_a_batch_of_64_of_1024_cubed_split_by_batch_holds_its_must(precision, count):
    """Issue 30's batched must: a batch of 64 of 1024^3 from GPU 0, end to end >= 0.9 N of one
    GPU's batched launch, checked against float64."""
    from gemmgen.library.dispatch import library
    from gemmgen.multigpu.scaling import measure_batched_scaling

    devices = _count(count)
    record = measure_batched_scaling(lambda d: library(precision, d), 64, 1024, 1024, 1024, devices,
                                     math="tf32" if precision == "tf32" else "3xtf32")
    print(record)
    assert record["worst_error_ratio"] <= 1.0
    assert record["end_to_end_scaling"] >= 0.9


@pytest.mark.parametrize("count", [2, 4])
@pytest.mark.parametrize("subject", ["fp32", "hopper_simt", "hopper_3xtf32"])
@pytest.mark.parametrize("shape", [(8192, 8192, 8192), (16384, 16384, 8192)], ids=["8192^3", "16384x16384x8192"])
def test_end_to_end_scaling_and_resident_shards_hold_their_must(subject, shape, count):
    """Issue 30's must-holds (14's on 2): inputs on GPU 0, checked against float64: end to end >=
    0.85 N, shards already resident >= 0.95 N, on 2 and on 4 GPUs, for the fp32 library (a runtime
    per GPU) and the kernels. (The batched must is the test above.)"""
    from gemmgen.multigpu.scaling import measure_scaling

    devices = _count(count)
    kernels, math = _subject(subject, devices)
    report, worst = measure_scaling(kernels, *shape, devices, runs=3, math=math)
    n = len(devices)
    print(f"{subject} {shape}: 1 GPU {report.one_gpu_tflops:.1f} TFLOP/s; {n} GPUs end to end "
          f"{report.end_to_end_tflops:.1f} ({report.scaling(report.end_to_end_tflops):.2f} x {n}, split along "
          f"axis {report.split.axis}, {report.split.bytes_moved / 2**20:.0f} MiB moved), resident "
          f"{report.resident_tflops:.1f} ({report.scaling(report.resident_tflops):.2f} x {n})")
    assert worst <= 1.0
    assert report.scaling(report.end_to_end_tflops) >= 0.85
    assert report.scaling(report.resident_tflops) >= 0.95
