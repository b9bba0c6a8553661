"""torch.ops.gemmgen.matmul on CPU tensors, for the PyTorch tests that run without a GPU.

- register_cpu_kernel(): the operator's CUDA kernel (gemmgen.matmul's fast path) registered for
  CPU tensors too, once per process, whichever test module asks first;
- fast_path_on_host(monkeypatch): that fast path given libraries that multiply on the host
  (host_libraries.py) for every operand class, so that everything but the GPU launch runs as on a
  GPU (call keys, routing, swaps, copies only for odd strides); returns the libraries, the copies
  made and the call keys resolved.
"""

from __future__ import annotations

import torch

import gemmgen.library.dispatch as dispatch
from gemmgen.library.layouts import CLASSES
from gemmgen.torch import ops
from host_libraries import LibraryOnHost

_library = None  # kept alive: the registration lasts as long as the Library object


def register_cpu_kernel() -> None:
    global _library
    if torch._C._dispatch_has_kernel_for_dispatch_key("gemmgen::matmul", "CPU"):
        return
    _library = torch.library.Library("gemmgen", "IMPL")
    _library.impl("matmul", ops._matmul_cuda, "CPU")


def fast_path_on_host(monkeypatch):
    register_cpu_kernel()
    libraries = {klass: LibraryOnHost(klass) for klass in CLASSES}
    copies, resolved = [], []
    real_copy, real_resolve = dispatch._torch_copy, dispatch._resolve_torch

    def copy(x, layout, lead=()):
        copies.append(layout)
        return real_copy(x, layout, lead)

    def resolve(*args):
        resolved.append(args[1])
        return real_resolve(*args)

    monkeypatch.setattr(dispatch, "_require_cuda", lambda x, name: None)  # CPU tensors stand in for CUDA ones
    monkeypatch.setattr(dispatch, "_torch_copy", copy)
    monkeypatch.setattr(dispatch, "_resolve_torch", resolve)
    monkeypatch.setattr(dispatch, "library", lambda precision, device, klass: libraries[klass])
    monkeypatch.setattr(dispatch, "available_classes", lambda precision: frozenset(CLASSES))
    monkeypatch.setattr(dispatch, "_calls", {})
    monkeypatch.setattr(dispatch, "_warned", set())
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0, raising=False)
    return libraries, copies, resolved
