"""GPU tests of gemmgen.linear: act(x @ weight^T + bias), the bias and the activation fused into the
store of the library member chosen for the call (issue 29).

- every activation, with and without bias, fp32 and tf32, against float64, at odd sizes with
  leading batch dimensions;
- x a view with rows longer than its width, and x at an address 4 bytes past 16-byte alignment;
- gradients of x, weight (a Parameter) and bias against float64.

Run with `pytest -m gpu tests/test_gpu_linear.py`; skipped without a GPU or torch with CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

pytestmark = pytest.mark.gpu

REFERENCE = {"none": lambda x: x, "relu": F.relu, "gelu": F.gelu,
             "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}
# worst |error| / max |reference| against float64: FP32-accurate 3xTF32, and TF32's 10-bit inputs
TOLERANCE = {"fp32": 2e-6, "tf32": 2e-3}


@pytest.fixture(scope="module", autouse=True)
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")


def uniform(*shape, seed=0):
    values = np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)
    return torch.from_numpy(values).cuda()


def relative_error(got, reference):
    return ((got.double() - reference).abs().max() / reference.abs().max().clamp_min(1e-30)).item()


def reference(x, weight, bias, activation):
    b = None if bias is None else bias.detach().double()
    return REFERENCE[activation](F.linear(x.detach().double(), weight.detach().double(), b))


def activations():
    from gemmgen.plan.parts.epilogue import ACTIVATIONS
    return [a for a in REFERENCE if a in ACTIVATIONS]


@pytest.mark.parametrize("activation", activations())
def test_every_activation_with_a_bias_matches_float64(activation):
    import gemmgen
    x, weight, bias = uniform(3, 37, 129, seed=1), uniform(203, 129, seed=2), uniform(203, seed=3)
    y = gemmgen.linear(x, weight, bias, activation)
    assert y.shape == (3, 37, 203) and y.dtype == torch.float32
    assert relative_error(y, reference(x, weight, bias, activation)) <= TOLERANCE["fp32"]


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_without_a_bias_and_in_tf32(precision):
    import gemmgen
    x, weight = uniform(77, 96, seed=4), uniform(130, 96, seed=5)
    y = gemmgen.linear(x, weight, None, "gelu", precision=precision)
    assert relative_error(y, reference(x, weight, None, "gelu")) <= TOLERANCE[precision]
    bias = uniform(130, seed=6)
    y = gemmgen.linear(x, weight, bias, "relu", precision=precision)
    assert relative_error(y, reference(x, weight, bias, "relu")) <= TOLERANCE[precision]


@pytest.mark.parametrize("offset", [0, 1], ids=["rows-past-the-width", "misaligned"])
def test_a_view_of_a_wider_matrix(offset):
    import gemmgen
    wide = torch.full((65, 140), float("nan"), device="cuda")
    x = wide[:, offset:offset + 131]
    x.copy_(uniform(65, 131, seed=7))
    weight, bias = uniform(45, 131, seed=8), uniform(45, seed=9)
    y = gemmgen.linear(x, weight, bias, "gelu_tanh")
    assert relative_error(y, reference(x, weight, bias, "gelu_tanh")) <= TOLERANCE["fp32"]


PYTORCH = {"none": lambda t: t, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
           "silu": F.silu}


@pytest.mark.parametrize("activation", list(PYTORCH))
def test_gradients_match_float64(activation):
    """x, weight (a Parameter) and bias, through the C++ autograd Function where the C++ kernels are
    built (native.cpp's LinearFunction), else fused.py's _Linear."""
    import gemmgen
    from gemmgen.torch import fused
    x = uniform(5, 23, 64, seed=10).requires_grad_()
    weight = torch.nn.Parameter(uniform(33, 64, seed=11))
    bias = torch.nn.Parameter(uniform(33, seed=12))
    y = gemmgen.linear(x, weight, bias, activation)
    node = y.grad_fn.next_functions[0][0] if "View" in y.grad_fn.name() else y.grad_fn  # y: a view of (115, 33)
    assert ("LinearFunction" in node.name()) == fused.cpp_autograd, node.name()
    grad = uniform(5, 23, 33, seed=13)
    y.backward(grad)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, weight, bias))
    y64 = PYTORCH[activation](F.linear(x64, w64, b64))
    y64.backward(grad.double())
    assert relative_error(y, y64.detach()) <= TOLERANCE["fp32"]
    for mine, theirs in ((x.grad, x64.grad), (weight.grad, w64.grad), (bias.grad, b64.grad)):
        assert relative_error(mine, theirs) <= 1e-5


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
@pytest.mark.parametrize("tokens, width", [(16, 1024), (16, 4096), (128, 4096), (4096, 128)])
def test_a_decode_sized_call_is_fused(precision, tokens, width):
    # the libraries choose split-K members for a few tokens (or a few columns): the call runs a member
    # that can fuse (split K through a workspace fuses; atomic split K passes it on to another member)
    import gemmgen
    from gemmgen.torch import fused
    x, weight, bias = uniform(tokens, 4096, seed=14), uniform(width, 4096, seed=15), uniform(width, seed=16)
    y = gemmgen.linear(x, weight, bias, "gelu", precision=precision)
    assert relative_error(y, reference(x, weight, bias, "gelu")) <= TOLERANCE[precision]
    runs = [call[0] for key, call in fused._calls.items()
            if key[:3] == (precision, "gelu", False) and key[4] == (tokens, 4096)]
    assert runs and all(run is not None for run in runs)
