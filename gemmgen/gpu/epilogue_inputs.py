"""What a fused epilogue (bias, scale, activation) needs to run and be checked on the GPU: its vectors
(random, of the lengths its spec asks) and the float64 value it must store,
act(alpha * scale * (A @ B) + beta * C + bias), for gemmgen check, bench, profile and tune.

The activation's float64 reference is compiled from the same C expression the kernel's store uses
(plan/parts/epilogue.py's ACTIVATIONS, float functions and literals read in double), so a new
activation is checked without another table.
"""

from __future__ import annotations

import re
from typing import Any

_kernels: dict[str, Any] = {}


def epilogue_vectors(cp, plan, M: int, N: int, seed: int = 0) -> dict[str, Any]:
    """The float32 device vectors the kernel's epilogue reads, by name: bias uniform in [-1, 1],
    scale in [0.5, 1.5]; M floats for `row`, N for `col`. Empty for a kernel without them."""
    generator = cp.random.default_rng(seed)
    vectors = {}
    for name, by in plan.epilogue.vectors:
        low, high = (-1.0, 1.0) if name == "bias" else (0.5, 1.5)
        length = M if by == "row" else N
        vectors[name] = generator.uniform(low, high, max(length, 1), dtype=cp.float64).astype(cp.float32)
    return vectors


def vector_pointers(vectors: dict[str, Any]) -> dict[str, int]:
    """Kernel.launch's bias= and scale= from epilogue_vectors' arrays."""
    return {name: int(vector.data.ptr) for name, vector in vectors.items()}


def double_expression(cuda: str) -> str:
    """A float C expression of an activation read in double: erff -> erf, 0.5f -> 0.5, ..."""
    expression = re.sub(r"\b([a-z]+)f\(", r"\1(", cuda)                 # erff( expf( tanhf( fmaxf(
    return re.sub(r"(\d\.?\d*(?:[eE][-+]?\d+)?)f\b", r"\1", expression)  # 0.5f 1.0f 1e-3f


def activation_in_double(cp, activation):
    """An elementwise float64 function of CuPy arrays computing the activation."""
    if activation.name == "none":
        return lambda x: x
    if activation.name not in _kernels:
        body = double_expression(activation.cuda).replace("{x}", "x")
        _kernels[activation.name] = cp.ElementwiseKernel("float64 x", "float64 y", f"y = {body};",
                                                         f"gemmgen_reference_{activation.name}")
    return _kernels[activation.name]


def epilogue_reference(cp, plan, A, B, C, alpha: float, beta: float, vectors: dict[str, Any]):
    """(value, magnitude): the float64 C the kernel must store for float32 A (M x K), B (K x N) and
    C (M x N), and the magnitude its tolerance scales with (|alpha| |scale| |A||B| + |beta| |C| +
    |bias|, and |value| for the activation's own rounding)."""
    A64, B64 = A.astype(cp.float64), B.astype(cp.float64)
    by = dict(plan.epilogue.vectors)

    def along(name: str):
        vector = vectors[name].astype(cp.float64)
        return vector[:, None] if by[name] == "row" else vector[None, :]

    scale = along("scale") if "scale" in by else 1.0
    value = alpha * scale * (A64 @ B64)
    magnitude = abs(alpha) * cp.abs(scale) * (cp.abs(A64) @ cp.abs(B64))
    if beta != 0.0:
        C64 = C.astype(cp.float64)
        value = value + beta * C64
        magnitude = magnitude + abs(beta) * cp.abs(C64)
    if "bias" in by:
        bias = along("bias")
        value = value + bias
        magnitude = magnitude + cp.abs(bias)
    activation = plan.epilogue.activation
    if activation.name != "none":
        value = activation_in_double(cp, activation)(value)
        # every activation here has a slope of at most about 1.13 (GELU's), and rounds its own value
        magnitude = 1.25 * magnitude + cp.abs(value)
    return value, magnitude
