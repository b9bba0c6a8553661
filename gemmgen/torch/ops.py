"""torch.ops.gemmgen.matmul: gemmgen's libraries as a differentiable PyTorch operator.

Registered with torch.library.Library("gemmgen", "DEF"): a fake (meta) implementation, and a CUDA
and an Autograd kernel. Those two are C++ where native.py can build them (native.cpp: a call that
needs no gradient never enters Python, its call key looked up and launched in C++), else Python:
the Autograd kernel is then the whole host path of a call that needs no gradient (where only the
CUDA kernel lies below it, no mode or functionalization active, it launches gemmgen at once, one
Python call from the dispatcher; else it redispatches below autograd, as
torch.library.register_autograd does). A call that needs a gradient goes through an autograd
Function whose forward runs the operator below autograd: native.cpp's MatmulFunction, which makes
no Python object a call, or, with the Python kernels, _Matmul below. register_autograd's wrapper
redispatched every call, and with custom_op's it cost 20 us a call on an H100 host
(benchmarks/torch_host.py). torch.compile(fullgraph=True) traces the operator, forward and
backward (its fake tensors take the redispatch), and CUDA graphs capture and replay it.

Batches: a and b may be (..., M, K) and (..., K, N) with leading dimensions that broadcast as
torch.matmul's (library/batches.py): one strided-batched launch, or one GEMM where a's batches
stack into rows against a shared b.

The backward's GEMMs are this operator again, in the forward's precision, on transposed views:
grad_a = alpha * grad @ b.T and grad_b = alpha * a.T @ grad; gemmgen.matmul reads a transposed
view as the other layout, so neither is copied. Each gradient comes out in its input's layout
(for b = weight.t(), grad_b is computed as (grad^T a)^T, so weight.grad is row-major like the
weight, and AccumulateGrad keeps it without a copy).
"""

from __future__ import annotations

import warnings

import torch

from ..library.batches import vector_views
from ..library.dispatch import PRECISIONS, torch_matmul
from . import native

_library = torch.library.Library("gemmgen", "DEF")
_library.define("matmul(Tensor a, Tensor b, float alpha=1.0, str precision='fp32') -> Tensor")


def _check(a: torch.Tensor, b: torch.Tensor, precision: str) -> None:
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(f"gemmgen.matmul takes matrices or batches of them (..., rows, cols), not tensors of "
                         f"shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"a's matrices are {a.shape[-2]} x {a.shape[-1]} but b's {b.shape[-2]} x {b.shape[-1]}: "
                         "inner sizes differ")
    if a.dtype != torch.float32 or b.dtype != torch.float32:
        raise ValueError(f"gemmgen.matmul takes float32 tensors, not {a.dtype} and {b.dtype}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")


def _matmul_cuda(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0, precision: str = "fp32") -> torch.Tensor:
    # gemmgen.matmul's fast path checks what the fake implementation checks, once per call key.
    return torch_matmul(a, b, alpha, precision)


def _matmul_fake(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0, precision: str = "fp32") -> torch.Tensor:
    _check(a, b, precision)
    try:
        lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except RuntimeError:
        raise ValueError(f"batch dimensions do not broadcast: {tuple(a.shape[:-2])} and {tuple(b.shape[:-2])}") from None
    return a.new_empty((*lead, a.shape[-2], b.shape[-1]))


def _column_major(x: torch.Tensor) -> bool:
    """Whether a matrix (or each of a batch) lies column-major (a transposed view of a row-major
    one): its gradient is made so too, as PyTorch's gradient layout contract wants (else
    AccumulateGrad copies it)."""
    return x.stride(-2) == 1 and x.stride(-1) != 1


def _setup_context(ctx, a, b, alpha, precision) -> None:
    # grad_a needs b, grad_b needs a: keep only what the backward will read.
    needs_a, needs_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    ctx.save_for_backward(a if needs_b else None, b if needs_a else None)
    ctx.alpha, ctx.precision = alpha, precision
    ctx.column_major = (_column_major(a), _column_major(b))
    ctx.shapes = (a.shape, b.shape)


def gradients(ctx, grad: torch.Tensor, multiply):
    """(grad_a, grad_b, None, None): grad_a = alpha grad b^T and grad_b = alpha a^T grad by
    `multiply` (alpha and precision applied), each only where needed, on transposed views, and
    each in its input's layout: a column-major one as the transposed product (grad_a^T = b grad^T,
    grad_b^T = grad^T a) seen through .mT.

    Batches: a matrix b that served every batch of a (an nn.Linear weight) gets one GEMM over all
    of them, a's rows and grad's stacked (the sum over batches is the product's K); an input
    broadcast over other batch dimensions gets the per-batch gradients summed to its shape."""
    a, b = ctx.saved_tensors
    a_column, b_column = ctx.column_major
    a_shape, b_shape = ctx.shapes
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = multiply(b, grad.mT).mT if a_column else multiply(grad, b.mT)
        if grad_a.shape != a_shape:
            grad_a = grad_a.sum_to_size(a_shape)
    if ctx.needs_input_grad[1]:
        if len(b_shape) == 2 and a.dim() > 2:  # stacked: sum over batches = one GEMM with K = batch x M
            a, grad = a.reshape(-1, a.shape[-1]), grad.reshape(-1, grad.shape[-1])
        grad_b = multiply(grad.mT, a).mT if b_column else multiply(a.mT, grad)
        if grad_b.shape != b_shape:
            grad_b = grad_b.sum_to_size(b_shape)
    return grad_a, grad_b, None, None


_BELOW_AUTOGRAD = torch._C._after_autograd_keyset
_CUDA = torch._C.DispatchKey.CUDA


def _redispatch(keyset, a, b, alpha, precision):
    with torch._C._AutoDispatchBelowAutograd():
        return matmul_op.redispatch(keyset & _BELOW_AUTOGRAD, a, b, alpha, precision)


class _Matmul(torch.autograd.Function):
    """The operator where a gradient is needed: the forward below autograd, the backward by the
    operator again (so that it, too, is traced, captured and differentiated)."""

    @staticmethod
    def forward(ctx, a, b, alpha, precision, keyset):
        out = _redispatch(keyset, a, b, alpha, precision)
        _setup_context(ctx, a, b, alpha, precision)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad_a, grad_b, _, _ = gradients(ctx, grad, lambda x, y: matmul_op(x, y, ctx.alpha, ctx.precision))
        return grad_a, grad_b, None, None, None


_only_cuda_below: dict[int, bool] = {}  # a keyset (raw) -> whether only the CUDA kernel lies below autograd


def _matmul_autograd(keyset, a, b, alpha=1.0, precision="fp32"):
    if torch._C.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _Matmul.apply(a, b, alpha, precision, keyset)
    # The keyset's answer is kept by its raw bits: asking it (a new keyset object, an enum
    # comparison) cost more than the rest of this kernel.
    raw = keyset.raw_repr()
    direct = _only_cuda_below.get(raw)
    if direct is None:
        direct = _only_cuda_below[raw] = (keyset & _BELOW_AUTOGRAD).highestPriorityTypeId() == _CUDA
    if direct:
        return torch_matmul(a, b, alpha, precision)  # what the CUDA kernel would do, one dispatch sooner
    return _redispatch(keyset, a, b, alpha, precision)


torch.library.register_fake("gemmgen::matmul", _matmul_fake, lib=_library)
matmul_op = torch.ops.gemmgen.matmul.default  # the overload itself: no overload resolution per call

# Why the Python kernels serve the operator (None: the C++ kernels do).
python_kernels_reason = native.install()
if python_kernels_reason is not None:
    if not native.disabled_reason():
        warnings.warn(f"gemmgen: torch.ops.gemmgen.matmul runs its Python kernels, a few microseconds more per "
                      f"call: {python_kernels_reason}", RuntimeWarning, stacklevel=2)
    _library.impl("matmul", _matmul_cuda, "CUDA")
    _library.impl("matmul", _matmul_autograd, "Autograd", with_keyset=True)


def matmul(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0, precision: str = "fp32") -> torch.Tensor:
    """alpha * a @ b by gemmgen's library of `precision` ("fp32" or "tf32"), differentiable. A 1-D
    operand is taken as torch.matmul takes it: a as a row (1 x K), b as a column (K x 1), and its
    dimension is dropped from the result (a matrix times a vector runs as one row, layouts.route)."""
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError(f"gemmgen.matmul takes vectors, matrices or batches of them, not tensors of shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    if a.dim() != 1 and b.dim() != 1:
        return matmul_op(a, b, alpha, precision)
    a, b, _, finish = vector_views(a, b, None)  # gemmgen.matmul's views, differentiable as any view
    return finish(matmul_op(a, b, alpha, precision))
