"""Several GPUs (or several parts on one): a split GEMM is right, and tuning spreads over GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gemmgen.plan import make_plan
from gemmgen.spec import load_one, parse
from gemmgen.verify import Case

pytestmark = pytest.mark.gpu
SPECS = Path(__file__).resolve().parent.parent / "specs"


def _devices():
    from gemmgen.runtime import device_count
    return device_count()


@pytest.mark.parametrize("shape", [(517, 300, 77), (1000, 1000, 256), (64, 2000, 100)])
def test_a_gemm_split_into_parts_on_one_gpu_matches_float64(shape):
    from gemmgen.multigpu import measure_scaling

    plan = make_plan(load_one(SPECS / "hopper_simt.gemm"))
    report, worst = measure_scaling(plan, *shape, [0, 0], runs=1)
    assert worst <= 1.0
    assert len(report.split.parts) == 2 and all(ms > 0 for ms in report.split.kernel_ms.values())


def test_a_gemm_split_over_every_gpu_matches_float64():
    from gemmgen.multigpu import measure_scaling

    count = _devices()
    if count < 2:
        pytest.skip("one GPU here: the split over several is covered by parts on one GPU")
    plan = make_plan(load_one(SPECS / "hopper_simt.gemm"))
    report, worst = measure_scaling(plan, 1537, 1200, 333, list(range(count)), runs=1)
    assert worst <= 1.0
    assert sorted({p.device for p in report.split.parts}) == list(range(count))


def test_tuning_with_one_worker_per_gpu_measures_every_point(tmp_path):
    from gemmgen.tune import tune

    spec = parse("kernel space { block {32, 64} x 64 x 8; thread {4, 8} x 4; "
                 "load A vector 4 transpose; load B vector 4; stages 2 sync }")[0]
    devices = list(range(_devices())) if _devices() > 1 else [0, 0]
    result = tune(spec, Case(256, 256, 256), db=tmp_path / "tune.jsonl", budget_s=0.02, devices=devices)
    assert result.evaluated == result.space.valid
    assert all(r["status"] == "ok" for r in result.records)
    assert result.best is not None and result.cublas_tflops > 0
