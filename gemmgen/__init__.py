"""gemmgen: a compiler from a small tiling spec language to fast, readable SGEMM CUDA kernels.

Pipeline (one direction): spec text → Spec (spec.py) → concrete points (space.py) → Plan (plan.py)
→ CUDA C (codegen.py) → cubin (compile.py) → launch (runtime.py) → check (verify.py) → time (bench.py)
→ search (tune.py). The command line (cli.py) only calls these.
"""

__version__ = "0.1.0"

from .errors import SpecError  # noqa: E402

__all__ = ["SpecError", "__version__"]
