"""gemmgen.linear on CPU tensors (skipped without torch): the operator's kernel runs with a library
and fused kernels that compute the C ABI on host memory (their launches get the pointers, leading
dimensions and bias a GPU's would), so the call's own logic, its errors and its autograd run as on a
GPU; values and gradients against float64 F.linear + activation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import gemmgen  # noqa: E402
from fake_device import matrix_at  # noqa: E402
from gemmgen.plan.parts.epilogue import ACTIVATIONS  # noqa: E402
from gemmgen.torch import fused as tfused  # noqa: E402
from torch_on_host import fast_path_on_host  # noqa: E402
REFERENCE = {"none": lambda x: x, "relu": F.relu, "gelu": F.gelu,
             "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}
NUMPY = {"none": lambda x: x, "relu": lambda x: np.maximum(x, 0.0),
         "gelu": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))),
         "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))),
         "silu": lambda x: x / (1.0 + np.exp(-x))}


class HostFusedKernel:
    """A fused member whose launch computes act(A @ B + bias) on host memory through the C ABI."""

    def __init__(self, activation, launches):
        self.activation, self.launches = activation, launches

    def launch(self, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, smallest=None, stream=None, *, bias=None,
               scale=None):
        a = matrix_at(A, M, K, lda, 1).astype(np.float64)     # A row-major
        b = matrix_at(B, K, N, 1, ldb).astype(np.float64)     # B column-major (weight^T)
        c = matrix_at(C, M, N, ldc, 1)
        value = alpha * (a @ b)
        if bias is not None:
            value = value + matrix_at(bias, 1, N, N, 1)[0]
        c[...] = NUMPY[self.activation](value)
        self.launches.append((M, N, K, lda, ldb, ldc, bias is not None, self.activation))


class HostLibrary:
    """What _linear_cuda reads of a library runtime: the member it chooses, and its plain launch."""

    def __init__(self, refuse=()):
        self.launches, self.plain, self.refuse = [], [], refuse

    def choose(self, M, N, K, lda, ldb, ldc, pointers=(0, 0, 0), beta=0.0):
        return 3

    def kernel_plan(self, index):
        return type("P", (), {"name": f"member_{index}"})()

    def launch(self, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream=None, smallest=None):
        HostFusedKernel("none", self.plain).launch(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
        return 3


class HostMembers:
    def __init__(self, library):
        self.library = library

    def kernel(self, index, bias, activation):
        assert index == 3
        if activation in self.library.refuse:
            return None
        return HostFusedKernel(activation, self.library.launches)


_REGISTRATIONS = []


@pytest.fixture
def host(monkeypatch):
    """CPU tensors stand for a GPU's: the operator's kernel registered for CPU, its library and
    fused kernels on the host, and torch.ops.gemmgen.matmul (the backward's GEMMs) on host libraries."""
    fast_path_on_host(monkeypatch)
    library = HostLibrary()
    if not torch._C._dispatch_has_kernel_for_dispatch_key("gemmgen::linear", "CPU"):
        keep = torch.library.Library("gemmgen", "IMPL")
        keep.impl("linear", tfused._linear_cuda, "CPU")
        _REGISTRATIONS.append(keep)  # the registration lasts as long as the Library object
    monkeypatch.setattr(tfused, "library", lambda precision, device: library)
    monkeypatch.setattr(tfused, "fused_members", lambda runtime: HostMembers(runtime))
    monkeypatch.setattr(tfused, "_warned", set())
    monkeypatch.setattr(tfused, "_check", lambda *args: None)  # CPU tensors: the device checks aside
    return library


def reference(x, weight, bias, activation):
    b = None if bias is None else bias.detach().double()
    return REFERENCE[activation](F.linear(x.detach().double(), weight.detach().double(), b))


@pytest.mark.parametrize("activation", [a for a in REFERENCE if a in ACTIVATIONS])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_forward_is_one_fused_launch_with_the_bias_after_ldc(host, activation, with_bias):
    torch.manual_seed(0)
    x, weight = torch.randn(2, 5, 7), torch.randn(11, 7)
    bias = torch.randn(11) if with_bias else None
    with torch.no_grad():
        y = gemmgen.linear(x, weight, bias, activation)
    assert y.shape == (2, 5, 11)
    assert torch.allclose(y.double(), reference(x, weight, bias, activation), rtol=1e-5, atol=1e-5)
    # one launch: M = 2 * 5 rows (leading dimensions flattened), lda = K, B = weight^T with ldb = K
    assert host.launches == [(10, 11, 7, 7, 7, 11, with_bias, activation)] and host.plain == []


def test_a_member_that_cannot_fuse_runs_the_epilogue_as_passes(host):
    host.refuse = ("gelu",)
    x, weight, bias = torch.randn(6, 4), torch.randn(3, 4), torch.randn(3)
    with torch.no_grad():
        y = gemmgen.linear(x, weight, bias, "gelu")
    assert torch.allclose(y.double(), reference(x, weight, bias, "gelu"), rtol=1e-5, atol=1e-5)
    assert host.launches == [] and len(host.plain) == 1


@pytest.mark.parametrize("activation", [a for a in REFERENCE if a in ACTIVATIONS])
def test_gradients_match_float64(host, activation):
    torch.manual_seed(1)
    x = torch.randn(9, 6, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(5, 6))
    bias = torch.nn.Parameter(torch.randn(5))
    y = gemmgen.linear(x, weight, bias, activation)
    grad = torch.randn(9, 5)
    y.backward(grad)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, weight, bias))
    REFERENCE[activation](F.linear(x64, w64, b64)).backward(grad.double())
    for mine, theirs in ((y, REFERENCE[activation](F.linear(x64, w64, b64))), (x.grad, x64.grad),
                         (weight.grad, w64.grad), (bias.grad, b64.grad)):
        assert torch.allclose(mine.double(), theirs, rtol=1e-4, atol=1e-4)
    # relu and no activation keep the fused output; the others fuse the bias and keep the pre-activation
    fused_activation = activation if activation in ("none", "relu") else "none"
    assert host.launches == [(9, 5, 6, 6, 6, 5, True, fused_activation)]


def test_only_the_gradients_asked_for_are_computed(host):
    x = torch.randn(4, 3)
    weight = torch.nn.Parameter(torch.randn(2, 3))
    gemmgen.linear(x, weight, None, "relu").sum().backward()
    assert weight.grad is not None and x.grad is None


def test_bad_calls_say_what_is_wrong():
    x, weight = torch.randn(4, 3), torch.randn(2, 3)
    cases = [
        (dict(x=torch.randn(4, 5), weight=weight), "does not end in weight's in_features 3"),
        (dict(x=x, weight=weight, bias=torch.randn(3)), "bias must be a vector of out_features = 2"),
        (dict(x=x.double(), weight=weight.double()), "float32"),
        (dict(x=x, weight=weight), "runs on CUDA GPUs: x is on cpu"),
        (dict(x=x, weight=weight, activation="swish"), "activation 'swish': one of"),
        (dict(x=x, weight=weight, precision="fp16"), "precision 'fp16'"),
        (dict(x=x, weight=torch.randn(2, 3, 1)), "weight must be a matrix"),
    ]
    for kwargs, words in cases:
        with pytest.raises(ValueError, match=None) as error:
            gemmgen.linear(**kwargs)
        assert words in str(error.value), (kwargs, str(error.value))


def test_gemmgen_linear_is_the_torch_stage_function():
    assert gemmgen.linear is tfused.linear
    assert "linear" in gemmgen.__all__
