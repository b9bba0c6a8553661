"""gemmgen in PyTorch models: a Linear module, and one call that routes a model's nn.Linear layers.

    layer = gemmgen.torch.Linear(2048, 5632, bias=False, device="cuda")   # an nn.Linear through gemmgen
    routing = gemmgen.torch.use_gemmgen(model, precision="fp32")         # every nn.Linear of a model
    ...train...
    routing.undo()                                                       # back to PyTorch's
    with gemmgen.torch.use_gemmgen(model): ...                           # or for a block only

Linear is an nn.Linear subclass: the same parameters (weight out x in, bias out), the same
initialisation and the same state_dict, so a checkpoint of either loads into the other. Its forward
is x @ weight^T through torch.ops.gemmgen.matmul (differentiable; weight.t() is read in place), for
any leading batch dimensions (flattened by a view, never a copy, for a contiguous x), then the bias
in one torch.add. A call gemmgen cannot take (not float32, not on a CUDA GPU, or under autocast)
runs torch's F.linear instead, and a warning says why, once per reason.

use_gemmgen(model) turns each nn.Linear of the model (nested or not) into a gemmgen Linear in
place, by its class: the module objects, their Parameters, hooks and state_dict keys stay as they
are, so an optimizer built before the call keeps training the same tensors. Layers it cannot take
(not float32, not on a CUDA GPU, a subclass of nn.Linear, a forward replaced on the instance) are
left to PyTorch, each with its reason in `routing.skipped` and in one warning. `routing.undo()`
(or leaving its `with` block) gives every layer back its class and precision.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ..library.dispatch import PRECISIONS
from .ops import matmul_op

_FLOAT32 = torch.float32
_warned: set[str] = set()


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")


def _on_gpu(tensor: torch.Tensor) -> bool:
    """Whether gemmgen can reach the tensor's memory (a CUDA tensor; the CPU tests widen this)."""
    return tensor.is_cuda


def _fallback_reason(x: torch.Tensor, weight: torch.Tensor) -> str:
    if torch.is_autocast_enabled("cuda"):
        return "autocast is on, so the layer runs in autocast's dtype"
    if x.dtype != _FLOAT32 or weight.dtype != _FLOAT32:
        return f"gemmgen multiplies float32, not input {x.dtype} with weight {weight.dtype}"
    where = x.device if not _on_gpu(x) else weight.device
    return f"gemmgen runs on CUDA GPUs, and this call has a tensor on {where}"


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           precision: str = "fp32") -> torch.Tensor:
    """F.linear(x, weight, bias) through gemmgen: x (*, in) @ weight^T (weight out x in) + bias,
    differentiable. Runs F.linear itself (with a warning, once per reason) where gemmgen cannot:
    a tensor not float32 or not on a CUDA GPU, or under autocast."""
    if x.dim() == 0:
        return F.linear(x, weight, bias)  # which says why a scalar will not do
    if (x.dtype != _FLOAT32 or weight.dtype != _FLOAT32 or not _on_gpu(x) or not _on_gpu(weight)
            or torch.is_autocast_enabled("cuda")):
        reason = _fallback_reason(x, weight)
        if reason not in _warned:
            _warned.add(reason)
            warnings.warn(f"gemmgen.torch.Linear: {reason}; running torch's F.linear instead", RuntimeWarning,
                          stacklevel=2)
        return F.linear(x, weight, bias)
    if x.dim() == 2:  # any layout with a unit stride is read as it lies
        y = matmul_op(x, weight.t(), 1.0, precision)
    else:  # leading dimensions flattened: a view for a contiguous x
        y = matmul_op(x.reshape(-1, x.shape[-1]), weight.t(), 1.0, precision).view(*x.shape[:-1], weight.shape[0])
    if bias is not None:
        # One pass over y after the GEMM; issue 29's fused epilogue (bias in the GEMM's store) will take it in.
        y = torch.add(y, bias)
    return y


class Linear(nn.Linear):
    """nn.Linear through gemmgen: y = x @ weight^T + bias by torch.ops.gemmgen.matmul in `precision`
    ("fp32": as accurate as FP32; "tf32": about 1e-3 relative error).

    Linear(in_features, out_features, bias=True, device=None, dtype=None, *, precision="fp32"):
    nn.Linear's arguments in nn.Linear's order (precision by name only), its initialisation and its
    state_dict; `precision` may be changed at any time."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 precision: str = "fp32"):
        _check_precision(precision)
        super().__init__(in_features, out_features, bias, device, dtype)
        self.precision = precision

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - nn.Linear's name
        return linear(input, self.weight, self.bias, self.precision)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, precision={self.precision}"


# --- routing a model's layers ----------------------------------------------------------------------

_NO_PRECISION = object()  # a routed layer had no precision attribute before (it was an nn.Linear)


def skip_reason(module: nn.Module) -> str | None:
    """Why use_gemmgen leaves this nn.Linear to PyTorch, or None when it routes it."""
    cls = type(module)
    if cls is not nn.Linear and cls is not Linear:
        return (f"its class {cls.__module__}.{cls.__qualname__} is a subclass of nn.Linear, which may not run "
                "nn.Linear's forward; replace it by gemmgen.torch.Linear yourself if it does")
    if "forward" in module.__dict__:
        return "its forward is replaced on the module itself (a hook of another library), which would still run"
    weight, bias = module.weight, module.bias
    for name, tensor in (("weight", weight), ("bias", bias)):
        if tensor is None:
            continue
        if tensor.dtype != _FLOAT32:
            return f"its {name} is {tensor.dtype}: gemmgen multiplies float32"
        if not _on_gpu(tensor):
            return f"its {name} is on {tensor.device}: gemmgen runs on CUDA GPUs (move the model with .cuda() first)"
    return None


class Routing:
    """What use_gemmgen did to a model, and the way back: `routed` (the names of the layers that
    now run through gemmgen), `skipped` ({name: reason} for the nn.Linear layers left to PyTorch),
    `undo()`, and use as a context manager (undone on leaving the block)."""

    def __init__(self, precision: str, changes: list, skipped: dict[str, str]):
        self.precision = precision
        self.routed = [name for name, _, _, _ in changes]
        self.skipped = skipped
        self._changes = changes
        self.active = True

    def undo(self) -> None:
        """Give every routed layer back the class and precision it had (a second call does nothing).
        Handles of the same model undo in the reverse order of their use_gemmgen calls."""
        if not self.active:
            return
        for _, module, cls, precision in reversed(self._changes):
            module.__class__ = cls
            if precision is _NO_PRECISION:
                module.__dict__.pop("precision", None)
            else:
                module.precision = precision
        self.active = False

    def __enter__(self) -> Routing:
        return self

    def __exit__(self, *exc) -> None:
        self.undo()

    def __repr__(self) -> str:
        state = "" if self.active else ", undone"
        return f"<gemmgen Routing: {len(self.routed)} layers through gemmgen {self.precision}, " \
               f"{len(self.skipped)} left to PyTorch{state}>"


def use_gemmgen(model: nn.Module, precision: str = "fp32") -> Routing:
    """Route every nn.Linear of `model` (itself included, nested at any depth) through gemmgen in
    `precision`, in place; returns the Routing that undoes it. The modules, their Parameters, hooks
    and state_dict stay the same objects; a gemmgen.torch.Linear already there takes `precision`
    (and undo gives it back its own). Layers gemmgen cannot take are left to PyTorch, their reasons
    in the Routing's `skipped` and one RuntimeWarning.

    Route before torch.compile or a CUDA graph capture of the model: a compiled or captured model
    keeps the layers it was made with."""
    _check_precision(precision)
    if not isinstance(model, nn.Module):
        raise TypeError(f"use_gemmgen takes a torch.nn.Module, not {type(model).__name__}")
    changes, skipped = [], {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        name = name or "(the model itself)"
        reason = skip_reason(module)
        if reason is not None:
            skipped[name] = reason
            continue
        changes.append((name, module, type(module), module.__dict__.get("precision", _NO_PRECISION)))
        module.__class__ = Linear
        module.precision = precision
    if skipped:
        listed = "; ".join(f"{name}: {reason}" for name, reason in list(skipped.items())[:5])
        more = f"; and {len(skipped) - 5} more (Routing.skipped lists them)" if len(skipped) > 5 else ""
        warnings.warn(f"gemmgen.torch.use_gemmgen: {len(skipped)} of {len(skipped) + len(changes)} nn.Linear "
                      f"layers left to PyTorch. {listed}{more}", RuntimeWarning, stacklevel=2)
    return Routing(precision, changes, skipped)
