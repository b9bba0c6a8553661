"""gemmgen check, bench, profile and tune on a fused epilogue (gpu/epilogue_inputs.py), without a GPU:
the float64 reference of each activation is compiled from the kernel's own C expression, read in
double (checked here against independent formulas), and the value an epilogue must store composes
scale, beta, bias and the activation as the spec says (numpy standing in for CuPy)."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from gemmgen.gpu import epilogue_inputs
from gemmgen.language.load import parse
from gemmgen.plan import make_plan
from gemmgen.plan.parts.epilogue import ACTIVATIONS

INDEPENDENT = {
    "none": lambda x: x,
    "relu": lambda x: max(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))),
    "silu": lambda x: x / (1.0 + math.exp(-x)),
}
C_FUNCTIONS = {"erf": math.erf, "exp": math.exp, "tanh": math.tanh, "fmax": max, "fmin": min, "log": math.log,
               "sqrt": math.sqrt}


def in_python(expression: str, x: float) -> float:
    """Evaluate a double C expression of {x} with C's math functions (its ?: are not Python's)."""
    return eval(expression.replace("{x}", f"({x!r})"), {"__builtins__": {}}, C_FUNCTIONS)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_each_activation_read_in_double_is_the_function_it_names(name):
    double = epilogue_inputs.double_expression(ACTIVATIONS[name].cuda)
    assert not any(token in double for token in ("erff", "expf", "tanhf", "fmaxf", "0f", ".5f"))
    if name not in INDEPENDENT:
        pytest.skip(f"no independent formula for {name} here")
    for x in (-3.7, -1.0, -0.25, 0.0, 0.5, 1.3, 4.2):
        assert in_python(double, x) == pytest.approx(INDEPENDENT[name](x), rel=1e-7, abs=1e-9)


def test_float_literals_and_functions_become_double():
    assert epilogue_inputs.double_expression("fmaxf({x}, 0.0f) + 1e-3f * expf(-{x}) + 2.f") == \
        "fmax({x}, 0.0) + 1e-3 * exp(-{x}) + 2."


def plan_of(extra: str):
    return make_plan(parse(f"kernel k {{\n  block 64 x 64 x 8\n  thread 4 x 4\n{extra}}}\n", "k.gemm")[0])


class Generator:
    """CuPy's default_rng as numpy's, whose uniform() takes no dtype (float64 is what is asked)."""

    def __init__(self, seed):
        self.numpy = np.random.default_rng(seed)

    def uniform(self, low, high, size, dtype=np.float64):
        return self.numpy.uniform(low, high, size).astype(dtype)


def numpy_as_cupy():
    return types.SimpleNamespace(float64=np.float64, float32=np.float32, abs=np.abs,
                                 random=types.SimpleNamespace(default_rng=Generator))


@pytest.mark.parametrize("bias, scale, activation", [("col", "row", "gelu"), ("row", "none", "relu"),
                                                      ("none", "col", "none"), ("col", "none", "silu")])
def test_the_value_an_epilogue_stores(monkeypatch, bias, scale, activation):
    if activation not in ACTIVATIONS:
        pytest.skip(f"{activation} is not an activation here")
    plan = plan_of(f"  bias {bias}\n  scale {scale}\n  activation {activation}\n")
    cp = numpy_as_cupy()
    double = epilogue_inputs.double_expression(ACTIVATIONS[activation].cuda)
    monkeypatch.setattr(epilogue_inputs, "activation_in_double",
                        lambda cp_, act: np.vectorize(lambda x: in_python(double, float(x))))
    M, N, K = 5, 7, 3
    rng = np.random.default_rng(0)
    A, B, C = (rng.uniform(-1, 1, shape).astype(np.float32) for shape in ((M, K), (K, N), (M, N)))
    vectors = epilogue_inputs.epilogue_vectors(cp, plan, M, N, seed=1)
    lengths = {"row": M, "col": N}
    assert {name: v.shape for name, v in vectors.items()} == {
        name: (lengths[by],) for name, by in (("bias", bias), ("scale", scale)) if by != "none"}
    value, magnitude = epilogue_inputs.epilogue_reference(cp, plan, A, B, C, 0.5, -0.25, vectors)
    for i in range(M):
        for j in range(N):
            s = 1.0 if scale == "none" else float(vectors["scale"][i if scale == "row" else j])
            b = 0.0 if bias == "none" else float(vectors["bias"][i if bias == "row" else j])
            pre = 0.5 * s * sum(float(A[i, k]) * float(B[k, j]) for k in range(K)) - 0.25 * float(C[i, j]) + b
            assert value[i, j] == pytest.approx(INDEPENDENT[activation](pre), rel=1e-6, abs=1e-7)
            assert magnitude[i, j] >= abs(pre) - 1e-12
    if "scale" in vectors:
        assert float(vectors["scale"].min()) >= 0.5 and float(vectors["scale"].max()) <= 1.5
