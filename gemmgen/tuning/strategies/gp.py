"""Optuna's Gaussian-process Bayesian optimisation: fit a GP to the measurements, measure where the
expected improvement is largest.

The GP (Matern 5/2 kernel, one length scale per setting) treats ordinal settings as numbers over
their ordered values and categorical ones by matching; a batch is chosen with the points in flight
taken into account (q-expected improvement). Needs Optuna with PyTorch and SciPy:
pip install 'gemmgen[search]' torch scipy (the CPU build of PyTorch is enough).
"""

from ._optuna import require, search

optuna = require()
try:
    import scipy  # noqa: F401
    import torch  # noqa: F401
except ImportError as exc:
    raise ImportError("Optuna's GPSampler needs PyTorch and SciPy: "
                      "pip install torch scipy (the CPU build of PyTorch is enough)") from exc

OPTIONS = {
    "seed": (0, "random seed"),
    "batch": (0, "points per batch; 0: the valid points / 25, between 4 and 16"),
    "startup": (10, "random points before the GP is used (Optuna's default)"),
}


def tune(space, evaluate, options):
    sampler = optuna.samplers.GPSampler(seed=options["seed"], n_startup_trials=options["startup"])
    search(space, evaluate, sampler, options["batch"], options["seed"])
