"""Tuning on a local Dask cluster over this machine's GPUs: every point measured, a faulting
candidate costing only itself, and (two GPUs or more) the points per second of issue 14's
must-hold: 2 GPUs evaluate at least 1.8 times as many as one."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
import multiprocessing
from pathlib import Path

import pytest

from gemmgen.plan.space import expand, point_key
from gemmgen.language.load import load_one, parse
from gemmgen.gpu.verify import Case

pytestmark = pytest.mark.gpu
distributed = pytest.importorskip("distributed", reason="pip install 'gemmgen[distributed]' (or carry "
                                                        "the wheels of .ci/fetch_wheels_dask.sh)")
SPECS = Path(__file__).resolve().parent.parent / "specs"
SPACE = """
kernel tiny_space {
  block  {32, 64} x 64 x 8
  thread {4, 8} x 4
  load A vector 4 transpose
  load B vector 4
  stages 2 sync
}
"""


def _count():
    from gemmgen.gpu.runtime import device_count
    return device_count()


def test_a_local_cluster_measures_every_point_and_a_fault_costs_only_its_candidate(tmp_path):
    from gemmgen.tuning.tune import tune

    spec = parse(SPACE)[0]
    victims = []

    def inject_fault(plan, source):
        if not victims:  # the first candidate writes far outside any allocation
            victims.append(point_key(plan.spec))
            return source.replace("tile_of_block(M, N, block_m0, block_n0, batch_index);",
                                  "tile_of_block(M, N, block_m0, block_n0, batch_index);\n"
                                  "    if (threadIdx.x == 0) *(volatile float*)(C + (1ll << 40)) = 1.0f;", 1)
        return source

    devices = list(range(_count())) if _count() > 1 else [0, 0]
    result = tune(spec, Case(256, 256, 256), db=tmp_path / "tune.jsonl", budget_s=0.02,
                  scheduler="local", devices=devices, source_patch=inject_fault)
    by_key = {r["key"]: r for r in result.records}
    assert result.gpus == len(devices) and len(by_key) == result.space.valid
    assert by_key[victims[0]]["status"] == "crash", by_key[victims[0]]
    assert all(r["status"] == "ok" for k, r in by_key.items() if k != victims[0])
    assert result.cublas_tflops > 0 and result.best["key"] != victims[0]


def _compile(plan):
    from gemmgen.gpu.compile import compile_plan
    compile_plan(plan)


def test_two_gpus_evaluate_at_least_1_8_times_the_points_per_second_of_one(tmp_path):
    from gemmgen.tuning.distributed import local_cluster
    from gemmgen.tuning.tune import tune

    if _count() < 2:
        pytest.skip(f"{_count()} GPU here: this needs two (nvidia-h200-x2 or larger)")
    spec = load_one(SPECS / "hopper_refine.gemm")
    points = 48
    plans = expand(spec).plans[:points]
    with ProcessPoolExecutor(mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile, plans))  # a warm cache: what is compared is the GPUs' work
    rates = {}
    for gpus in (1, 2):
        with local_cluster(list(range(gpus))) as cluster, distributed.Client(cluster) as client:
            # Start every worker's GPU process (CUDA, CuPy) before the clock starts.
            tune(spec, Case(512, 512, 512), db=tmp_path / f"warm{gpus}.jsonl", budget_s=0.02,
                 scheduler=client, max_points=2 * gpus)
            result = tune(spec, Case(4096, 4096, 4096), db=tmp_path / f"tune{gpus}.jsonl", budget_s=0.2,
                          scheduler=client, max_points=points)
        assert result.evaluated == points and result.gpus == gpus
        rates[gpus] = result.evaluated / result.seconds
    print(f"points per second: 1 GPU {rates[1]:.2f}, 2 GPUs {rates[2]:.2f} ({rates[2] / rates[1]:.2f}x)")
    assert rates[2] >= 1.8 * rates[1]
