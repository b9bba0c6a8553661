"""Batched gemmgen.matmul and torch.ops.gemmgen.matmul on the CPU (skipped without torch): leading
dimensions that broadcast as torch.matmul's, one strided-batched launch per call (or one GEMM of
stacked rows against a shared B), copies only for batches no single stride walks, and gradients.

The host libraries (host_libraries.py) run the batched entry point's arithmetic on host memory:
`batch` matrices at A's, B's and C's strides (floats), so that a wrong stride or swap gives a
wrong product here.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gemmgen  # noqa: E402
import gemmgen.torch as gtorch  # noqa: E402
from gemmgen.gpu.runtime import ShapeError  # noqa: E402
from torch_on_host import fast_path_on_host  # noqa: E402

BASE = ("row", "col")


@pytest.fixture
def host(monkeypatch):
    return fast_path_on_host(monkeypatch)


def rand(*shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed + sum(shape)).uniform(-1, 1, shape).astype(np.float32))


def close(x, expected):
    torch.testing.assert_close(x.double(), expected, rtol=1e-5, atol=1e-5)


def calls(libraries):
    return [call for library in libraries.values() for call in library.calls]


def test_batches_of_both_operands_are_one_strided_launch(host):
    libraries, copies, _ = host
    A, B = rand(4, 13, 7), rand(4, 7, 5, seed=1).mT.contiguous().mT  # B's matrices column-major
    out = gemmgen.matmul(A, B)
    close(out, A.double() @ B.double())
    assert out.shape == (4, 13, 5) and out.is_contiguous()
    assert libraries[BASE].calls == [(4, 13, 5, 7)] and libraries[BASE].strides == [(91, 35, 65)]
    assert copies == []


def test_a_shared_weight_stacks_the_batches_rows_into_one_gemm(host):
    libraries, copies, _ = host
    x, weight = rand(3, 4, 13, 7), rand(5, 7, seed=1)  # a Linear's input and weight
    out = gemmgen.matmul(x, weight.t())
    close(out, x.double() @ weight.double().t())
    assert out.shape == (3, 4, 13, 5)
    assert libraries[BASE].calls == [(156, 5, 7)] and copies == []


def test_a_shared_left_operand_is_read_at_batch_stride_zero(host):
    libraries, copies, _ = host
    A, B = rand(13, 7), rand(6, 5, 7, seed=1).mT  # B: 6 batches of column-major 7 x 5
    out = gemmgen.matmul(A, B)
    close(out, A.double() @ B.double())
    assert libraries[BASE].calls == [(6, 13, 5, 7)] and libraries[BASE].strides == [(0, 35, 65)]
    assert copies == []


def test_several_leading_dimensions_flatten_into_one_batch(host):
    libraries, _, _ = host
    A, B = rand(2, 3, 9, 4), rand(2, 3, 4, 6, seed=1)
    close(gemmgen.matmul(A, B), A.double() @ B.double())
    ((batch, M, N, K),) = calls(libraries)
    assert (batch, M, N, K) == (6, 9, 6, 4)


def test_transposed_batches_and_a_column_major_output_are_read_in_place(host):
    libraries, copies, _ = host
    A = rand(4, 7, 13).mT                 # each matrix column-major
    B = rand(4, 7, 5, seed=1)              # row-major
    C = rand(4, 5, 13, seed=2).mT          # out column-major: computed as C^T = B^T A^T
    expected = 2.0 * (A.double() @ B.double()) + 0.5 * C.double()
    assert gemmgen.matmul(A, B, C, alpha=2.0, beta=0.5) is C
    close(C, expected)
    assert copies == []
    ((batch, M, N, K),) = calls(libraries)
    assert (batch, M, N, K) == (4, 5, 13, 7)  # swapped: the library's M is B's N
    (strides,) = [s for library in libraries.values() for s in library.strides]
    assert strides == (35, 91, 65)          # B's, A's, C's


def test_batches_no_single_stride_walks_are_copied_with_a_warning_once(host):
    libraries, copies, _ = host
    A, B = rand(2, 1, 5, 4), rand(1, 3, 4, 6, seed=1)  # A broadcast over the second dimension only
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = gemmgen.matmul(A, B)
        gemmgen.matmul(A, B)
    close(out, A.double() @ B.double())
    assert out.shape == (2, 3, 5, 6) and copies == ["row", "col"] * 2
    assert [str(w.message) for w in caught] == [
        "gemmgen: A's batches lie at no single stride (broadcast over some batch dimensions, or permuted); copying it",
        "gemmgen: B's batches lie at no single stride (broadcast over some batch dimensions, or permuted); copying it"]


def test_an_empty_batch_makes_an_empty_output(host):
    out = gemmgen.matmul(rand(0, 5, 4), rand(4, 3))
    assert out.shape == (0, 5, 3)


def test_bad_batches_are_refused_with_the_reason(host):
    with pytest.raises(ShapeError, match=r"out's batch dimensions \(3,\) must be \(2,\)"):
        gemmgen.matmul(rand(2, 4, 5), rand(2, 5, 3), rand(3, 4, 3))
    C = rand(4, 3).expand(2, 4, 3)
    with pytest.raises(ShapeError, match="out's 2 batches share one matrix"):
        gemmgen.matmul(rand(2, 4, 5), rand(2, 5, 3), C)


def test_the_fake_implementation_broadcasts_batches():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        out = gtorch.matmul(torch.empty(2, 1, 7, 3, device="cuda"), torch.empty(5, 3, 11, device="cuda"))
        assert tuple(out.shape) == (2, 5, 7, 11)
        with pytest.raises(ValueError, match="batch dimensions do not broadcast"):
            gtorch.matmul(torch.empty(2, 7, 3, device="cuda"), torch.empty(3, 3, 11, device="cuda"))


def test_a_shared_weights_gradient_is_one_gemm_over_every_batchs_rows(host):
    libraries, copies, _ = host
    x = rand(3, 13, 7).requires_grad_()
    weight = torch.nn.Parameter(rand(5, 7, seed=1))
    grad = rand(3, 13, 5, seed=2)
    gtorch.matmul(x, weight.t(), 0.5).backward(grad)
    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    (0.5 * x64 @ w64.t()).backward(grad.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weight.grad.double(), w64.grad, rtol=1e-5, atol=1e-6)
    # forward (39 stacked rows), grad_x (39 rows again), grad_w^T = grad^T x with K = 39
    assert sorted(calls(libraries)) == sorted([(39, 5, 7), (39, 7, 5), (5, 7, 39)]) and copies == []
    assert weight.grad.stride() == (7, 1)


def test_gradients_of_broadcast_batches_sum_to_each_inputs_shape(host):
    a = rand(2, 1, 6, 4).requires_grad_()
    b = rand(3, 4, 5, seed=1).requires_grad_()
    grad = rand(2, 3, 6, 5, seed=2)
    gtorch.matmul(a, b).backward(grad)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    (a64 @ b64).backward(grad.double())
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    torch.testing.assert_close(a.grad.double(), a64.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b.grad.double(), b64.grad, rtol=1e-5, atol=1e-6)
