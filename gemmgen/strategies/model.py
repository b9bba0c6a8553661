"""Cost-model search: measure the points the model ranks best, refit it to what was measured, repeat.

The model (gemmgen/costmodel.py) starts from a roofline estimate of every valid point at the
shape (tiles over the SMs, flops per byte, bank conflicts, ...) and learns, by Bayesian linear
regression, how the measurements differ from it. Each batch is chosen by an upper confidence
bound, mean + explore x standard deviation of the predicted log TFLOP/s, one point at a time:
after each pick the model's uncertainty is updated as if that point had been measured, so a batch
spreads over points the model knows little about instead of piling onto near-copies of one.
A share of each batch (`random`) is drawn uniformly from the rest, against a model that is wrong
in ways its uncertainty does not show. A point that fails counts as half the slowest measured one.
"""

import math
import random

import numpy as np

from ..costmodel import Model, Table

OPTIONS = {
    "seed": (0, "random seed (random picks, ties)"),
    "batch": (0, "points per batch; 0: the valid points / 25, between 4 and 16"),
    "explore": (1.0, "weight of the model's standard deviation in the ranking"),
    "random": (0.1, "share of each batch drawn at random from the unmeasured points"),
    "sms": (0, "SMs of the GPU; 0: the evaluator's (the device's, or the recording's)"),
}


def tune(space, evaluate, options):
    rng = random.Random(options["seed"])
    sms = options["sms"] or getattr(evaluate, "sms", 0) or 132
    table = Table(space, evaluate.shape, sms)
    model = Model(table)
    total = len(table.points)
    batch = options["batch"] or max(4, min(16, total // 25))
    # tiny seeded jitter: points the model cannot tell apart are taken in a random order
    jitter = np.array([rng.random() for _ in range(total)]) * 1e-9
    measured: dict[int, float] = {}
    while len(measured) < total:
        mean, std = model.predict()
        picks = _pick(model, mean + jitter, std, measured, batch, options, rng)
        scores = evaluate([table.points[i] for i in picks])
        measured.update(zip(picks, scores))
        working = [s for s in measured.values() if s > 0]
        if working:
            floor = 0.5 * min(working)
            rows = list(measured)
            model.fit(rows, np.array([math.log(max(measured[i], floor)) for i in rows]))


def _pick(model, mean, std, measured, batch, options, rng):
    """Up to `batch` unmeasured rows: an upper confidence bound, its uncertainty updated after each
    pick as if the pick had been measured; then the random share."""
    X = model.table.X
    open_rows = np.array([i for i in range(len(mean)) if i not in measured])
    size = min(batch, len(open_rows))
    randoms = sum(rng.random() < options["random"] for _ in range(size))
    picks: list[int] = []
    cov = model.cov.copy()
    var = std[open_rows] ** 2
    beta = 1 / model.noise ** 2
    alive = np.ones(len(open_rows), dtype=bool)
    for _ in range(size - randoms):
        ucb = np.where(alive, mean[open_rows] + options["explore"] * np.sqrt(np.maximum(var, 0)), -np.inf)
        j = int(np.argmax(ucb))
        picks.append(int(open_rows[j]))
        alive[j] = False
        x = X[open_rows[j]]
        cx = cov @ x
        denominator = 1 + beta * x @ cx
        var -= beta * (X[open_rows] @ cx) ** 2 / denominator
        cov -= beta * np.outer(cx, cx) / denominator
    rest = [int(r) for r, a in zip(open_rows, alive) if a]
    picks += rng.sample(rest, min(randoms, len(rest)))
    return picks
