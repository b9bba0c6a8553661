"""The old import path of the spec loaders, kept for callers: `from gemmgen.spec import load_one` still
works. The code lives in gemmgen.language: load.py (load, load_one, load_file, parse, parse_file)
and spec.py (Spec)."""

from .language.load import load, load_file, load_one, parse, parse_file
from .language.spec import Spec

__all__ = ["Spec", "load", "load_file", "load_one", "parse", "parse_file"]
