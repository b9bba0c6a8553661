"""Cost-model search: measure the points the model ranks best, refit it to what was measured, repeat.

The model (gemmgen/tuning/costmodel.py) starts from a roofline estimate of every valid point at the
shape (tiles over the SMs, flops per byte, bank conflicts, ...) and learns, by Bayesian linear
regression, how the measurements differ from it. Points are ranked by an upper confidence bound,
mean + explore x standard deviation of the predicted log TFLOP/s. A batch is filled one point at a
time, and after each pick the model's uncertainty is updated as if that point had been measured,
so a batch spreads over points the model knows little about instead of piling onto near-copies.
The first `lead` picks of the first batch follow the estimate alone: before anything is measured
the uncertainty only says which points are unusual, and in a space of 20 to 40 points the first
two to four evaluations are all a tuner may spend.

Once something is measured, a share of each batch (`local`) is taken among the neighbours of the
fastest points so far (one setting changed), still in the model's order: fast kernels sit close
together in a space, which a linear model sees only roughly. A share (`random`) is drawn
uniformly, against a model that is wrong in ways its uncertainty does not show. A point that
fails counts as half the slowest measured one.
"""

import math
import random

import numpy as np

from ..costmodel import Assumptions, Model, Table

OPTIONS = {
    "seed": (0, "random seed (random picks, ties)"),
    "batch": (0, "points per batch; 0: the valid points / 25, between 4 and 16"),
    "explore": (1.0, "weight of the model's standard deviation in the ranking"),
    "lead": (2, "picks of the first batch taken by the estimate alone (no uncertainty bonus)"),
    "local": (0.5, "share of each batch taken among neighbours of the fastest points"),
    "parents": (3, "fastest points whose neighbours are searched"),
    "random": (0.1, "share of each batch drawn at random from the unmeasured points"),
    "multicast": (Assumptions.multicast, "share of a cluster's multicast saving credited to L2's reads"),
    "direct": (Assumptions.direct, "clocks of a direct store of C per clock of its bytes"),
    "gpc": (Assumptions.gpc_share, "share of the SMs that clusters of 4 or more blocks fill at once"),
    "latency": (Assumptions.latency, "clocks of a loader warpgroup's global load (register-fed wgmma)"),
    "l2": (Assumptions.l2, "bytes per clock L2 delivers to each SM when all load"),
    "granule": (Assumptions.granule, "bytes L2 moves as one piece"),
    "sync": (Assumptions.sync, "clocks of each K step's hand-over between producers and consumers"),
    "dram": (Assumptions.dram, "weight of HBM's clocks per K step (0: not counted)"),
    "sms": (0, "SMs of the GPU; 0: the evaluator's (the device's, or the recording's)"),
}


# options that set the cost model's assumptions (costmodel.Assumptions), by field
ASSUMED = {"multicast": "multicast", "direct": "direct", "gpc": "gpc_share",
           "latency": "latency", "l2": "l2", "granule": "granule", "sync": "sync", "dram": "dram"}


def tune(space, evaluate, options):
    rng = random.Random(options["seed"])
    sms = options["sms"] or getattr(evaluate, "sms", 0) or 132
    shape = getattr(evaluate, "shape", None)
    if shape is None:
        raise ValueError("the model strategy derives its features at the problem size: "
                         "evaluate.shape must be set (gemmgen.tuning.tune and .replay set it)")
    table = Table(space, shape, sms, Assumptions(**{name: options[option] for option, name in ASSUMED.items()}))
    model = Model(table)
    total = len(table.points)
    batch = options["batch"] or max(4, min(16, total // 25))
    grid = np.array([[values.index(v) for v, values in zip(p, space.dimensions)] for p in table.points])
    # tiny seeded jitter: points the model cannot tell apart are taken in a random order
    jitter = np.array([rng.random() for _ in range(total)]) * 1e-9
    measured: dict[int, float] = {}
    while len(measured) < total:
        mean, std = model.predict()
        near = _neighbours(grid, measured, options["parents"])
        lead = 0 if measured else int(options["lead"])
        picks = _pick(model, mean + jitter, std, measured, near, batch, lead, options, rng)
        scores = evaluate([table.points[i] for i in picks])
        measured.update(zip(picks, scores))
        working = [s for s in measured.values() if s > 0]
        if working:
            floor = 0.5 * min(working)
            rows = list(measured)
            model.fit(rows, np.array([math.log(max(measured[i], floor)) for i in rows]))


def _neighbours(grid, measured, parents):
    """Rows one setting away from one of the `parents` fastest measured rows."""
    near = np.zeros(len(grid), dtype=bool)
    for row in sorted(measured, key=measured.get, reverse=True)[:parents]:
        if measured[row] > 0:
            near |= (grid != grid[row]).sum(axis=1) == 1
    return near


def _pick(model, mean, std, measured, near, batch, lead, options, rng):
    """Up to `batch` unmeasured rows by upper confidence bound, the local share among `near`, the
    uncertainty updated after each pick as if it had been measured; then the random share."""
    X = model.table.X
    open_rows = np.array([i for i in range(len(mean)) if i not in measured])
    size = min(batch, len(open_rows))
    randoms = sum(rng.random() < options["random"] for _ in range(size))
    locals_ = round(options["local"] * (size - randoms))
    picks: list[int] = []
    cov = model.cov.copy()
    var = std[open_rows] ** 2
    beta = 1 / model.noise ** 2
    alive = np.ones(len(open_rows), dtype=bool)
    local = near[open_rows]
    for slot in range(size - randoms):
        allowed = alive & local if slot < locals_ and (alive & local).any() else alive
        explore = 0.0 if slot < lead else options["explore"]
        ucb = np.where(allowed, mean[open_rows] + explore * np.sqrt(np.maximum(var, 0)), -np.inf)
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
