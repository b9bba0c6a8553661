"""gemmgen: a compiler from a small tiling spec language to fast, readable SGEMM CUDA kernels.

Pipeline (one direction): spec text → Spec (spec.py) → concrete points (space.py) → Plan (plan.py)
→ CUDA C (codegen.py) → cubin (compile.py) → launch (runtime.py) → check (verify.py) → time (bench.py)
→ search (tune.py). The command line (cli.py) only calls these.
"""

__version__ = "0.1.0"

from .language.errors import SpecError  # noqa: E402


def __getattr__(name: str):
    """gemmgen.matmul (gemmgen.dispatch.matmul): out = alpha * A @ B + beta * out on the GPU, by
    gemmgen's tuned library of a precision ("fp32": as accurate as FP32; "tf32"). Loaded on first
    use, so that `import gemmgen` stays light, and then the function itself: no wrapper per call."""
    if name == "matmul":
        from .library.dispatch import matmul
        globals()["matmul"] = matmul
        return matmul
    raise AttributeError(f"module 'gemmgen' has no attribute {name!r}")


__all__ = ["SpecError", "__version__", "matmul"]
