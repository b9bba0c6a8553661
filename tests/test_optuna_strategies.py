"""Optuna's samplers as strategies: settings mapped faithfully, impossible points never evaluated,
batches asked at once, and a clear message where Optuna is missing."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from gemmgen.tuning import strategies
from gemmgen.tuning.replay import load_recording, run_strategy
from gemmgen.plan.space import expand
from gemmgen.language.load import load_one
from gemmgen.gpu.verify import Case

optuna = pytest.importorskip("optuna", reason="the Optuna strategies need optuna (pip install '.[test]')")
from gemmgen.tuning.strategies._optuna import Encoding  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TUNING = ROOT / "benchmarks" / "tuning"


@pytest.fixture(scope="module")
def refine():
    return expand(load_one(ROOT / "specs" / "hopper_refine.gemm"))


@pytest.fixture(scope="module")
def tc_recording():
    spec = load_one(ROOT / "specs" / "hopper_tc_search.gemm")
    return load_recording(spec, sorted(TUNING.glob("*.jsonl")), Case(4096, 4096, 4096))


def test_numeric_settings_are_ordinal_and_the_others_categorical(refine):
    encoding = Encoding(refine, optuna)
    kinds = {name.split(":", 1)[1]: type(d).__name__ for name, d in encoding.distributions.items()}
    assert kinds["block.m"] == kinds["raster.group"] == kinds["shared.A.pad"] == "IntDistribution"
    assert kinds["stages.fill"] == "CategoricalDistribution"
    group = encoding.distributions[f"{refine.keys.index('raster.group')}:raster.group"]
    assert (group.low, group.high) == (0, 2)           # positions of 4 < 8 < 16
    for point in refine.valid_points[::17]:
        assert encoding.point(encoding.params(point)) == point


class Recorder:
    """evaluate() that records each call's points and scores them with a smooth landscape."""

    def __init__(self, space, budget):
        self.space, self.budget, self.calls = space, budget, []
        self.valid = set(space.valid_points)

    def __call__(self, points):
        self.calls.append(list(points))
        assert set(points) <= self.valid, "a point the Plan rejects reached evaluate()"
        score = [sum(v if isinstance(v, int) else 7 for v in p) / 100 for p in points]
        if sum(len(c) for c in self.calls) >= self.budget:
            raise strategies.Budget()
        return score


@pytest.mark.parametrize("name", ["tpe", "cmaes"])
def test_only_valid_unmeasured_points_reach_evaluate_in_batches(refine, name):
    """hopper_refine: 228 of its 768 points plan, so the samplers propose many that do not."""
    evaluate = Recorder(refine, budget=60)
    module = strategies.get(name)
    with pytest.raises(strategies.Budget):
        module.tune(refine, evaluate, strategies.options_with_defaults(module, {"seed": 1, "batch": 6}))
    evaluated = [p for call in evaluate.calls for p in call]
    assert len(evaluated) == len(set(evaluated)) == 60
    assert all(len(call) == 6 for call in evaluate.calls)


@pytest.mark.parametrize("name", ["tpe", "cmaes"])
def test_an_optuna_strategy_beats_chance_on_a_recorded_search(tc_recording, name):
    """hopper_tc_search at 4096^3: 3 of 108 points are within 1% of the best. A uniform draw of
    40 points misses all three one time in seven; the samplers, over 5 seeds, never do."""
    best = tc_recording.best
    for seed in range(5):
        run = run_strategy(name, tc_recording, seed, max_points=40, full=True)
        assert run.best_after(40) >= 0.99 * best, (name, seed)


def test_the_gp_strategy_runs_where_pytorch_is_installed(tc_recording):
    pytest.importorskip("torch", reason="Optuna's GPSampler needs PyTorch")
    run = run_strategy("gp", tc_recording, 0, max_points=20, full=True)
    assert len(run.scores) == 20 and run.best_after(20) >= 0.9 * tc_recording.best


def test_without_optuna_the_strategy_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    for name in ("gemmgen.tuning.strategies.tpe", "gemmgen.tuning.strategies._optuna"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ValueError, match=r"strategy tpe: .*pip install 'gemmgen\[search\]'"):
        strategies.get("tpe")
    monkeypatch.undo()
    importlib.import_module("gemmgen.tuning.strategies.tpe")
