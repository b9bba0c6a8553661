"""Optuna's Tree-structured Parzen Estimator: sample where good points are dense and bad ones sparse.

After `startup` random points, it models the settings of the best points and of the rest (one
density each, over all settings jointly) and proposes points likely under the first and unlikely
under the second; batches are proposed at once with a constant liar for the points in flight.
Ordinal settings are integer parameters over their ordered values, the others categorical
(_optuna.py beside it). Needs Optuna: pip install 'gemmgen[search]'.
"""

from ._optuna import require, search

optuna = require()

OPTIONS = {
    "seed": (0, "random seed"),
    "batch": (0, "points per batch; 0: the valid points / 25, between 4 and 16"),
    "startup": (10, "random points before the model is used (Optuna's default)"),
}


def tune(space, evaluate, options):
    sampler = optuna.samplers.TPESampler(seed=options["seed"], n_startup_trials=options["startup"],
                                         multivariate=True, constant_liar=True)
    search(space, evaluate, sampler, options["batch"], options["seed"])
