"""The cost model: what it derives from a Plan at a shape, and the strategy that learns with it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gemmgen.tuning import strategies
from gemmgen.tuning.costmodel import Model, Table, features, running_plan
from gemmgen.plan import make_plan
from gemmgen.plan.space import expand
from gemmgen.language.load import load_one, parse
from gemmgen.gpu.verify import Case

SPECS = Path(__file__).resolve().parent.parent / "specs"


def _plan(text):
    return make_plan(parse(text)[0])


TC = ("kernel t { target sm_90a; layout A row, B col, C row; block 128 x 256 x 32; math tf32; "
      "stages 4 tma }")


def test_tiles_over_the_sms_and_padding_follow_the_shape():
    f = features(_plan(TC), Case(4096, 4096, 4096), 132).as_dict()
    # 32 x 16 = 512 tiles on 132 SMs: 4 on the busiest, so 512 / 528 of the SMs' time is used
    assert math.exp(f["log SM fill"]) == pytest.approx(512 / 528)
    assert math.exp(f["log blocks per SM"]) == 4
    assert f["log tile efficiency"] == pytest.approx(0.0)
    skinny = features(_plan(TC.replace("128 x 256", "128 x 64")), Case(127, 4099, 4096), 132).as_dict()
    # 127 rows in one 128-row tile, 4099 columns in 65 tiles of 64
    assert math.exp(skinny["log tile efficiency"]) == pytest.approx(127 * 4099 / (128 * 65 * 64))
    assert math.exp(skinny["log SM fill"]) == pytest.approx(65 / 132)


def test_stream_k_is_modelled_as_its_scheduler_deals_the_work():
    data_parallel = _plan(TC.replace("128 x 256", "128 x 128"))
    stream_k = _plan(TC.replace("128 x 256", "128 x 128").replace("stages 4 tma", "stages 4 tma; schedule stream-k"))
    skinny = Case(8192, 128, 8192)   # 64 tiles on 132 SMs: half of them idle, one block per tile
    dp, sk = features(data_parallel, skinny, 132), features(stream_k, skinny, 132)
    assert math.exp(dp.as_dict()["log SM fill"]) == pytest.approx(64 / 132)
    assert math.exp(sk.as_dict()["log SM fill"]) > 0.99       # every block 124 or 125 K tiles
    assert sk.prior > dp.prior + math.log(1.5)                  # measured: 1.4x to 1.6x
    whole = Case(1536, 1408, 4096)   # 12 x 11 = 132 tiles of 128 x 128: whole waves, nothing dealt
    assert features(stream_k, whole, 132).prior == pytest.approx(features(data_parallel, whole, 132).prior, rel=0.01)


def test_a_tma_kernel_is_modelled_as_its_fallback_where_tma_cannot_load():
    plan = _plan(TC)
    assert running_plan(plan, Case(4096, 4096, 4096))[0] is plan
    fallback, _ = running_plan(plan, Case(4096, 4096, 1023))  # lda = 1023: no 16-byte rows
    assert fallback is plan.fallback and fallback.path == "wgmma_async"


def test_vector_loads_count_only_where_the_shape_allows_them():
    plan = _plan("kernel v { block 64 x 64 x 16; warp 32 x 32; thread 4 x 4 repeat 2 x 1; "
                 "load A vector 4 transpose; load B vector 4; stages 2 async }")
    assert features(plan, Case(1024, 1024, 1024), 132).as_dict()["log vector A"] == pytest.approx(math.log(4))
    assert features(plan, Case(127, 4099, 1023), 132).as_dict()["log vector A"] == 0.0


def test_predicted_bank_conflicts_lower_the_estimate():
    """vectorized's transposed A stores are 2-way conflicts (explain); bank_swizzle's are not."""
    shape = Case(4096, 4096, 4096)
    conflicted, swizzled = (features(make_plan(load_one(SPECS / f"{n}.gemm")), shape, 132)
                            for n in ("vectorized", "bank_swizzle"))
    assert conflicted.as_dict()["bank conflict"] > swizzled.as_dict()["bank conflict"] > 0
    assert conflicted.prior < swizzled.prior


def test_more_split_k_fills_the_sms_for_a_skinny_problem():
    text = ("kernel s { block 64 x 64 x 32; warp 32 x 32; thread 4 x 4 repeat 2 x 1; load A transpose; "
            "stages 2 async; split %d }")
    one, four = (features(_plan(text % s), Case(127, 1024, 8192), 132) for s in (1, 4))
    assert one.as_dict()["log SM fill"] < four.as_dict()["log SM fill"]
    assert one.prior < four.prior


@pytest.fixture(scope="module")
def refine():
    return expand(load_one(SPECS / "hopper_refine.gemm"))


def test_the_table_has_a_row_per_valid_point_and_one_hot_settings(refine):
    table = Table(refine, Case(4096, 4096, 4096), 132)
    assert table.X.shape[0] == refine.valid == len(table.prior)
    assert "stages.fill=async" in table.names and "block.m=128" in table.names
    assert np.allclose(table.X[:, :5].mean(axis=0), 0, atol=1e-9)   # numeric columns standardised


def test_the_model_moves_toward_what_was_measured(refine):
    table = Table(refine, Case(4096, 4096, 4096), 132)
    model = Model(table)
    before, _ = model.predict()
    asyncs = np.array([p[refine.keys.index("stages.fill")] == "async" for p in table.points])
    rows = list(range(0, len(table.points), 3))
    # measured: sync is twice as fast as the prior says, async half as fast
    y = before[rows] + np.where(asyncs[rows], -0.7, 0.7)
    model.fit(rows, y)
    after, std = model.predict()
    unmeasured = np.array([i not in set(rows) for i in range(len(table.points))])
    shift = after - before
    assert shift[unmeasured & asyncs].mean() < -0.4 and shift[unmeasured & ~asyncs].mean() > 0.4
    assert (std > 0).all()


class Counting:
    def __init__(self, score, shape, budget):
        self.score, self.shape, self.sms, self.budget = score, shape, 132, budget
        self.order = []

    def __call__(self, points):
        for p in points:
            if p not in self.order and len(self.order) < self.budget:
                self.order.append(p)
        if len(self.order) >= self.budget:
            raise strategies.Budget()
        return [self.score[p] for p in points]


@pytest.mark.parametrize("seed", [0, 1])
def test_model_strategy_finds_the_best_when_the_prior_has_it_backwards(refine, seed):
    """Scores ranked opposite to the prior: the refit has to undo it, within 30% of the points."""
    shape = Case(4096, 4096, 4096)
    table = Table(refine, shape, 132)
    score = {p: float(np.exp(-prior)) for p, prior in zip(table.points, table.prior)}
    best = max(score.values())
    evaluate = Counting(score, shape, budget=int(0.3 * refine.valid))
    module = strategies.get("model")
    try:
        module.tune(refine, evaluate, strategies.options_with_defaults(module, {"seed": seed}))
    except strategies.Budget:
        pass
    assert len(set(evaluate.order)) == len(evaluate.order) <= int(0.3 * refine.valid)
    assert set(evaluate.order) <= set(refine.valid_points)
    assert max(score[p] for p in evaluate.order) >= 0.97 * best
