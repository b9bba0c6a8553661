"""gemmgen: a compiler from a small tiling spec language to fast, readable SGEMM CUDA kernels.

Pipeline (one direction): spec text → Spec (spec.py) → concrete points (space.py) → Plan (plan.py)
→ CUDA C (codegen.py) → cubin (compile.py) → launch (runtime.py) → check (verify.py) → time (bench.py)
→ search (tune.py). The command line (cli.py) only calls these.
"""

__version__ = "0.1.0"

from .errors import SpecError  # noqa: E402


def matmul(A, B, out=None, *, alpha: float = 1.0, beta: float = 0.0, precision: str = "fp32", stream=None):
    """out = alpha * A @ B + beta * out on the GPU, by gemmgen's tuned library of `precision`
    ("fp32": as accurate as FP32; "tf32"). See gemmgen.dispatch.matmul."""
    from .dispatch import matmul as run
    return run(A, B, out, alpha=alpha, beta=beta, precision=precision, stream=stream)


__all__ = ["SpecError", "__version__", "matmul"]
