"""Optuna's CMA-ES: a Gaussian over the ordinal settings, moved and reshaped toward the best points.

Ordinal settings (block sizes, stages, split, ...) are integer parameters over their ordered
values, which CMA-ES with margin searches as integers (keeping every value of a setting within
reach instead of letting its variance collapse between two); categorical settings, which it
cannot model, are sampled by TPE beside it. A generation is asked at once and evaluated as one
batch. Needs Optuna and its cmaes package: pip install 'gemmgen[search]'.
"""

import warnings

from ._optuna import require, search

optuna = require()
try:
    import cmaes  # noqa: F401
except ImportError as exc:
    raise ImportError("Optuna's CMA-ES needs the cmaes package: "
                      "pip install 'gemmgen[search]' (or pip install cmaes)") from exc

OPTIONS = {
    "seed": (0, "random seed"),
    "batch": (0, "points per batch; 0: the valid points / 25, between 4 and 16"),
}


def tune(space, evaluate, options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # with_margin is marked experimental
        sampler = optuna.samplers.CmaEsSampler(
            seed=options["seed"], with_margin=True, warn_independent_sampling=False,
            independent_sampler=optuna.samplers.TPESampler(seed=options["seed"]))
    search(space, evaluate, sampler, options["batch"], options["seed"])
