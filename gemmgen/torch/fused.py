"""gemmgen.linear: act(x @ weight^T + bias) in one GEMM whose store adds the bias and applies the
activation (issue 29), differentiable.

    y = gemmgen.linear(x, weight, bias, activation="gelu")            # x (*, in), weight (out, in)
    y = gemmgen.linear(x, weight, precision="tf32")                   # no bias, no activation

torch.ops.gemmgen.linear(x, weight, bias, activation, precision) is the operator (x a matrix): a CUDA
kernel that runs the member the library chooses for the call's shape and alignment, compiled with
`bias col` and the activation (library/fused.py), and a fake implementation for torch.compile.
Where a gradient is needed, the forward keeps what the backward reads: relu and no activation keep
the fused output; gelu, gelu_tanh and silu run the GEMM with its bias fused and the activation as
PyTorch's, keeping the pre-activation. The backward is PyTorch's activation backward, the bias
gradient a sum over rows, and the two GEMMs torch.ops.gemmgen.matmul in the forward's precision.
A call with neither bias nor activation is torch.ops.gemmgen.matmul(x, weight.T) itself. Where the
C++ kernels are built (torch/native.cpp), both operators' autograd is C++ (there, _Linear's is
written again), so that a training step makes no Python object a call; else _Linear serves.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from ..library.dispatch import PRECISIONS, library
from ..library.fused import check_activation, fused_members
from . import native
from .ops import matmul_op

_library = torch.library.Library("gemmgen", "FRAGMENT")
_library.define("linear(Tensor x, Tensor weight, Tensor? bias=None, str activation='none', "
                "str precision='fp32') -> Tensor")

# PyTorch's forward and backward of each activation, for the passes gemmgen does not fuse: the
# forward given the pre-activation, the backward given (grad, what the forward kept).
_FORWARD = {
    "none": lambda pre: pre,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda pre: F.gelu(pre, approximate="tanh"),
    "silu": F.silu,
}
_BACKWARD = {
    "none": lambda grad, kept: grad,
    "relu": lambda grad, out: torch.ops.aten.threshold_backward(grad, out, 0),
    "gelu": lambda grad, pre: torch.ops.aten.gelu_backward(grad, pre, approximate="none"),
    "gelu_tanh": lambda grad, pre: torch.ops.aten.gelu_backward(grad, pre, approximate="tanh"),
    "silu": lambda grad, pre: torch.ops.aten.silu_backward(grad, pre),
}
_KEEPS_OUTPUT = ("none", "relu")  # their backward reads the output; the others the pre-activation

_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(f"gemmgen.linear: {message}", RuntimeWarning, stacklevel=4)


def _row_major(x: torch.Tensor, what: str) -> torch.Tensor:
    """x itself when its rows are contiguous (any row stride), else a copy, said once."""
    if x.stride(1) == 1 or x.shape[1] <= 1:
        return x
    _warn_once(f"{what} of shape {tuple(x.shape)} with strides {tuple(x.stride())} has no contiguous rows: "
               "it is copied first (one pass over it)")
    return x.contiguous()


_calls: dict[tuple, tuple] = {}   # call key -> (prepared launch or None, M, N, K, lda, ldb, runtime, index)
CALLS_KEPT = 4096


def _linear_cuda(x, weight, bias=None, activation="none", precision="fp32"):
    pa, pb = x.data_ptr(), weight.data_ptr()
    # What decides the launch: shapes, strides, pointer alignment, device, the epilogue, precision.
    key = (precision, activation, bias is None, x.get_device(), x.shape, weight.shape, x.stride(), weight.stride(),
           pa & 15, pb & 15)
    call = _calls.get(key)
    if call is None:
        call = _resolve(key, x, weight, bias, activation, precision)
    run, M, N, K, lda, ldb, runtime, index = call
    out = x.new_empty((M, N))
    if M == 0 or N == 0:
        return out
    pc = out.data_ptr()
    stream = torch._C._cuda_getCurrentRawStream(key[3])
    if run is None or pc & 15:  # unfused (this member cannot take the epilogue), or an odd output
        return _unfused(runtime, index, x, weight, bias, activation, out, M, N, K, lda, ldb, stream)
    run(pa, pb, pc, 1.0, 0.0, stream, (0, 0, 0), (0 if bias is None else bias.data_ptr(), 0))
    return out


def _resolve(key, x, weight, bias, activation, precision) -> tuple:
    """The call key's launch: the library's member for the shape, its fused kernel's prepared launch."""
    M, K = x.shape
    N = weight.shape[0]
    runtime = library(precision, key[3])
    lda, ldb = max(x.stride(0), K, 1), max(weight.stride(0), K, 1)
    run = index = None
    if M and N:
        members = fused_members(runtime)
        index = members.choose(M, N, K, lda, ldb, N, (key[8], key[9], 0), bias is not None, activation)
        kernel = members.kernel(index, bias is not None, activation)
        if kernel is not None:
            run = kernel.prepare(M, N, K, lda, ldb, N, (key[8], key[9], 0), False)
    if len(_calls) >= CALLS_KEPT:
        _calls.pop(next(iter(_calls), None), None)
    call = _calls[key] = (run, M, N, K, lda, ldb, runtime, index)
    return call


def _unfused(runtime, index, x, weight, bias, activation, out, M, N, K, lda, ldb, stream):
    """The plain member, then the bias and the activation as PyTorch's passes over the output."""
    kernel = fused_members(runtime).kernel(index, bias is not None, activation)
    if kernel is not None:  # fused all the same: only the output's address was odd
        kernel.launch(M, N, K, 1.0, x.data_ptr(), lda, weight.data_ptr(), ldb, 0.0, out.data_ptr(), N,
                      stream=stream, bias=None if bias is None else bias.data_ptr())
        return out
    runtime.launch(M, N, K, 1.0, x.data_ptr(), lda, weight.data_ptr(), ldb, 0.0, out.data_ptr(), N, stream=stream)
    if bias is not None:
        out.add_(bias)
    if activation not in _FORWARD:
        raise ValueError(f"{runtime.kernel_plan(index).name} cannot fuse activation {activation!r}, and "
                         "gemmgen.linear knows no PyTorch pass for it")
    return _FORWARD[activation](out)


def _linear_fake(x, weight, bias=None, activation="none", precision="fp32"):
    return x.new_empty((x.shape[0], weight.shape[0]))


_library.impl("linear", _linear_cuda, "CUDA")
torch.library.register_fake("gemmgen::linear", _linear_fake, lib=_library)
linear_op = torch.ops.gemmgen.linear.default
# Where the C++ kernels are built, the operator's Autograd kernel is native.cpp's LinearFunction (this
# module's _Linear, written again in C++: no Python object a call); else _Linear serves.
cpp_autograd = native.install_linear()


class _Linear(torch.autograd.Function):
    """gemmgen.linear where a gradient is needed (see the module's docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, activation, precision):
        if activation in _KEEPS_OUTPUT:
            out = kept = linear_op(x, weight, bias, activation, precision)
        else:
            kept = linear_op(x, weight, bias, "none", precision)
            out = _FORWARD[activation](kept)
        needs_x, needs_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        ctx.save_for_backward(x if needs_w else None, weight if needs_x else None, kept)
        ctx.activation, ctx.precision = activation, precision
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, kept = ctx.saved_tensors
        grad_pre = _BACKWARD[ctx.activation](grad, kept)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = matmul_op(grad_pre, weight, 1.0, ctx.precision)          # (M x N) (N x K)
        if ctx.needs_input_grad[1]:
            grad_w = matmul_op(grad_pre.t(), x, 1.0, ctx.precision)          # (N x M) (M x K)
        if ctx.needs_input_grad[2]:
            grad_b = grad_pre.sum(0)
        return grad_x, grad_w, grad_b, None, None


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be a matrix (out_features x in_features), not of shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x of shape {tuple(x.shape)} does not end in weight's in_features {weight.shape[1]} "
                         f"(weight {tuple(weight.shape)})")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(f"bias must be a vector of out_features = {weight.shape[0]} floats, not of shape "
                         f"{tuple(bias.shape)}")
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if t.dtype != torch.float32:
            raise ValueError(f"gemmgen.linear takes float32 tensors: {name} is {t.dtype}")
        if not t.is_cuda:
            raise ValueError(f"gemmgen.linear runs on CUDA GPUs: {name} is on {t.device} (move it with .cuda())")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x on {x.device}: put them on one GPU")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str | None = None, precision: str = "fp32") -> torch.Tensor:
    """act(x @ weight^T + bias) by gemmgen's library of `precision`, the bias and the activation in
    the GEMM's store: F.linear's x (*, in_features), weight (out_features, in_features) and bias
    (out_features); `activation` None, "relu", "gelu" (erf), "gelu_tanh" or "silu". Differentiable."""
    activation = check_activation(activation)
    _check(x, weight, bias, precision)
    if bias is None and activation == "none":  # a plain GEMM: the operator, whose autograd is C++ where built
        y = matmul_op(x.reshape(-1, x.shape[-1]), weight.t(), 1.0, precision)
        return y.view(*x.shape[:-1], weight.shape[0])
    x2 = _row_major(x.reshape(-1, x.shape[-1]), "x")
    weight = _row_major(weight, "weight")
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    if torch.is_grad_enabled() and (x2.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        if activation not in _BACKWARD:
            raise ValueError(f"activation {activation!r} runs fused, but gemmgen.linear knows no PyTorch "
                             "backward for it yet: call it under torch.no_grad(), or add it to _BACKWARD "
                             "in gemmgen/torch/fused.py")
        y = (linear_op(x2, weight, bias, activation, precision) if cpp_autograd
             else _Linear.apply(x2, weight, bias, activation, precision))
    else:
        y = linear_op(x2, weight, bias, activation, precision)
    return y.view(*x.shape[:-1], weight.shape[0])
