"""Search strategies for `gemmgen tune`, one module each.

A strategy module has a docstring line, an OPTIONS dict of {name: (default, meaning)}, and
`tune(space, evaluate, options)`: it calls `evaluate(points)` with lists of points of the space
(tuples of values, one per dimension) and gets back their TFLOP/s (0 for a point that failed),
until it is done or `evaluate` raises Budget. Adding a strategy is adding a module here.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


class Budget(Exception):
    """Raised by evaluate() when the evaluation budget is spent; the strategy just stops."""


def names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def get(name: str) -> ModuleType:
    if name not in names():
        raise ValueError(f"unknown strategy {name!r}: one of {', '.join(names())}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ImportError as exc:  # a strategy built on an optional library that is missing
        raise ValueError(f"strategy {name}: {exc}") from exc


def options_with_defaults(module: ModuleType, given: dict) -> dict:
    unknown = set(given) - set(module.OPTIONS)
    if unknown:
        raise ValueError(f"strategy {module.__name__.rsplit('.', 1)[-1]} has no option(s) "
                         f"{', '.join(sorted(unknown))}; it takes {', '.join(module.OPTIONS) or 'none'}")
    return {key: given.get(key, default) for key, (default, _) in module.OPTIONS.items()}
