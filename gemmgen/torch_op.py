"""torch.ops.gemmgen.matmul: gemmgen's libraries as a PyTorch operator.

    import gemmgen.torch_op  # registers the operator
    C = torch.ops.gemmgen.matmul(A, B)                      # FP32-accurate
    C = torch.ops.gemmgen.matmul(A, B, 1.0, "tf32")         # alpha, precision

Registered through torch.library.custom_op, with a fake (meta) implementation that gives the
output's shape and dtype without running anything, so torch.compile traces through it without a
graph break. The operator is functional (it returns a new tensor); gemmgen.matmul also writes into
an existing one.
"""

from __future__ import annotations

import torch

from .dispatch import PRECISIONS, matmul


@torch.library.custom_op("gemmgen::matmul", mutates_args=())
def gemmgen_matmul(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0, precision: str = "fp32") -> torch.Tensor:
    """alpha * a @ b by gemmgen's library of `precision` ("fp32" or "tf32") for this GPU."""
    _check(a, b, precision)
    return matmul(a, b, alpha=alpha, precision=precision)


@gemmgen_matmul.register_fake
def _(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0, precision: str = "fp32") -> torch.Tensor:
    _check(a, b, precision)
    return a.new_empty((a.shape[0], b.shape[1]))


def _check(a: torch.Tensor, b: torch.Tensor, precision: str) -> None:
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"gemmgen.matmul takes matrices, not tensors of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a is {a.shape[0]} x {a.shape[1]} but b is {b.shape[0]} x {b.shape[1]}: inner sizes differ")
    if a.dtype != torch.float32 or b.dtype != torch.float32:
        raise ValueError(f"gemmgen.matmul takes float32 tensors, not {a.dtype} and {b.dtype}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")


matmul_op = torch.ops.gemmgen.matmul
