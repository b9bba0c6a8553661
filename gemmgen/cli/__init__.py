"""The command line, `gemmgen VERB SPEC`: verbs over the stages, no logic of their own. `main` is the
console script's entry point (pyproject: gemmgen = gemmgen.cli:main).
"""

from .app import main

__all__ = ["main"]
