"""The tuner on a real GPU: a candidate that faults costs that candidate, not the search."""

from __future__ import annotations

import pytest

from gemmgen.plan.space import point_key
from gemmgen.language.load import parse
from gemmgen.gpu.verify import Case

pytestmark = pytest.mark.gpu

SPACE = """
kernel tiny_space {
  block  {32, 64} x 64 x 8
  thread {4, 8} x 4
  load A vector 4 transpose
  load B vector 4
  stages 2 sync
}
"""


def test_a_faulting_candidate_is_recorded_and_the_search_goes_on(tmp_path):
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

    seen = []
    result = tune(spec, Case(256, 256, 256), db=tmp_path / "tune.jsonl", budget_s=0.02,
                  progress=seen.append, source_patch=inject_fault)
    by_key = {r["key"]: r for r in result.records}
    assert by_key[victims[0]]["status"] == "crash"
    assert "illegal" in by_key[victims[0]]["reason"].lower() or "launch" in by_key[victims[0]]["reason"].lower()
    survivors = [r for k, r in by_key.items() if k != victims[0]]
    assert survivors and all(r["status"] == "ok" for r in survivors)
    assert result.best is not None and result.best["key"] != victims[0]
    assert result.cublas_tflops > 0


def test_a_rerun_resumes_and_measures_nothing_twice(tmp_path):
    from gemmgen.tuning.tune import tune

    spec = parse(SPACE)[0]
    db = tmp_path / "tune.jsonl"
    first = tune(spec, Case(128, 128, 128), db=db, budget_s=0.02, max_points=2)
    assert first.evaluated == 2
    lines = len(db.read_text().splitlines())
    again = tune(spec, Case(128, 128, 128), db=db, budget_s=0.02)
    assert again.evaluated == again.space.valid - 2
    assert len(db.read_text().splitlines()) == lines + again.evaluated
