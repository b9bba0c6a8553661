"""Compatibility: torch.ops.gemmgen.matmul is registered by gemmgen.torch, the PyTorch stage;
importing this module registers it too."""

from .torch import matmul, matmul_op

__all__ = ["matmul", "matmul_op"]
