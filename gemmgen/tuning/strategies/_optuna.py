"""What the Optuna strategies (tpe, cmaes, gp) share: the space as Optuna parameters, batches by ask/tell.

Each searched setting becomes one parameter. A setting whose values are all numbers (block
sizes, stages, split, raster group, ...) is ordinal: an integer parameter over the positions of
its values in increasing order, so that the sampler sees 64 < 128 < 256 as neighbours. Any other
(sync or async, on or off, pad or swizzle) is categorical.

A batch is asked of the study and handed to evaluate() in one call, so its points compile in
parallel. Where the sampler proposes a point that is no fresh candidate, the proposal is told to
it at once at no cost: as failed where the Plan rejects the point (it is never compiled), or with
its score where it was measured already. The batch then takes the unmeasured valid point nearest
to the proposal instead (fewest steps along ordinal settings and changes of categorical ones;
ties at random), which is given to the sampler as a trial of its own (enqueued, so the sampler's
model is not consulted for it) and told its measured score like any other. Every proposal thus
yields a measurement, however small a share of the sets' product the Plan accepts.
"""

from __future__ import annotations

import random
import warnings

import numpy as np


def require():
    """Optuna, or an ImportError that says how to install it."""
    try:
        import optuna
    except ImportError as exc:
        raise ImportError("it uses Optuna: pip install 'gemmgen[search]' "
                          "(or pip install optuna)") from exc
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def default_batch(valid: int) -> int:
    """Points per batch: small for small spaces (each evaluation teaches the sampler something
    before the next is asked), up to 16 for large ones (compiles run in parallel)."""
    return max(4, min(16, valid // 25))


def is_ordinal(values: list) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


class Encoding:
    """Points of a space <-> Optuna parameters."""

    def __init__(self, space, optuna):
        self.names = [f"{i}:{key}" for i, key in enumerate(space.keys)]
        self.values = []
        self.distributions = {}
        for name, values in zip(self.names, space.dimensions):
            if is_ordinal(values):
                ordered = sorted(values)
                self.values.append(ordered)
                self.distributions[name] = optuna.distributions.IntDistribution(0, len(ordered) - 1)
            else:
                self.values.append(None)
                self.distributions[name] = optuna.distributions.CategoricalDistribution(list(values))

    def point(self, params: dict) -> tuple:
        return tuple(params[n] if ordered is None else ordered[params[n]]
                     for n, ordered in zip(self.names, self.values))

    def params(self, point: tuple) -> dict:
        return {n: v if ordered is None else ordered.index(v)
                for n, v, ordered in zip(self.names, point, self.values)}


class Nearest:
    """The unmeasured valid point nearest to a proposal, valid or not."""

    def __init__(self, space, encoding, rng):
        self.np = np
        self.points = space.valid_points
        self.slot = {p: i for i, p in enumerate(self.points)}
        self.levels = [values if ordered is None else ordered
                       for values, ordered in zip(space.dimensions, encoding.values)]
        self.ordinal = np.array([ordered is not None for ordered in encoding.values])
        self.grid = np.array([[levels.index(v) for v, levels in zip(p, self.levels)] for p in self.points],
                             dtype=float).reshape(len(self.points), len(self.levels))
        self.jitter = np.array([rng.random() for _ in self.points]) * 1e-3
        self.taken = np.zeros(len(self.points), dtype=bool)

    def take(self, point: tuple) -> None:
        if point in self.slot:
            self.taken[self.slot[point]] = True

    def to(self, point: tuple) -> tuple:
        np = self.np
        where = np.array([levels.index(v) for v, levels in zip(point, self.levels)], dtype=float)
        steps = np.abs(self.grid - where)
        distance = np.where(self.ordinal, steps, steps > 0).sum(axis=1) + self.jitter
        distance[self.taken] = np.inf
        return self.points[int(np.argmin(distance))]


def search(space, evaluate, sampler, batch: int, seed: int) -> None:
    """Ask `sampler` for batches of unmeasured valid points and evaluate them until the space
    is spent or evaluate() raises Budget."""
    optuna = require()
    rng = random.Random(seed)
    encoding = Encoding(space, optuna)
    valid = set(space.valid_points)
    nearest = Nearest(space, encoding, rng)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    known: dict[tuple, float] = {}
    batch = batch or default_batch(len(valid))
    while len(known) < len(valid):
        want = min(batch, len(valid) - len(known))
        fresh: dict[tuple, object] = {}
        while len(fresh) < want:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # experimental features, categorical fallbacks
                trial = study.ask(encoding.distributions)
            point = encoding.point(trial.params)
            if point in valid and point not in known and point not in fresh:
                fresh[point] = trial
                nearest.take(point)
                continue
            if point not in valid:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            elif point in known:
                study.tell(trial, known[point])
            else:  # proposed twice in one batch: it is measured once, with the first trial
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            stand_in = nearest.to(point)
            study.enqueue_trial(encoding.params(stand_in))
            fresh[stand_in] = study.ask(encoding.distributions)
            nearest.take(stand_in)
        points = list(fresh)
        scores = evaluate(points)
        for point, score in zip(points, scores):
            known[point] = score
            study.tell(fresh[point], score)
