"""gemmgen: a compiler from a small tiling spec language to fast, readable SGEMM CUDA kernels.

The compiler runs one way, a package per stage, each importing only the stages before it:

- language: spec text to typed Specs, every mistake a SpecError at its line and column;
- plan: a concrete Spec to a Plan, every derived number, impossible tilings rejected; a spec's
  search space expanded into planned points (plan.space);
- codegen: a Plan to CUDA C through the templates, and its C header;
- gpu: NVRTC to a cubin and its cache, launches through the driver API, checks against float64,
  timing beside cuBLAS, Nsight Compute;
- explain: what a kernel costs before it runs (no GPU);
- tuning: the search for the fastest correct point, its database, strategies, cost model, Dask
  cluster and replays;
- multigpu: one GEMM split over several GPUs, whatever launches on each (a kernel, a library);
- library: one entry point per precision over several tuned kernels, and gemmgen.matmul (on one
  GPU, or split over several through multigpu);
- torch: the PyTorch operator and nn.Linear through gemmgen;
- cli: the command line's verbs, which only call the stages.

Beside them: version.py (__version__) and outputs.py (files written whole or not at all, never over
one that is not gemmgen's), which every stage may use; runtime.py, spec.py and torch_op.py keep the
old import paths of the documented entry points working.
"""

from .language.errors import SpecError
from .version import __version__


def __getattr__(name: str):
    """gemmgen.matmul (gemmgen.library.dispatch.matmul): out = alpha * A @ B + beta * out on the GPU, by
    gemmgen's tuned library of a precision ("fp32": as accurate as FP32; "tf32"); gemmgen.linear
    (gemmgen.torch.fused.linear): act(x @ weight^T + bias) for PyTorch tensors, the bias and the
    activation fused into the GEMM's store; gemmgen.release_workspace(device=None)
    (gemmgen.gpu.pad.release): the memory unaligned calls' padding copies keep, given back. Loaded
    on first use, so that `import gemmgen` stays light, and then the function itself: no wrapper
    per call."""
    if name == "matmul":
        from .library.dispatch import matmul
        globals()["matmul"] = matmul
        return matmul
    if name == "release_workspace":  # the padding copies' memory pool back to the GPU
        from .gpu.pad import release
        globals()["release_workspace"] = release
        return release
    if name == "linear":  # act(x @ weight^T + bias) in one GEMM, differentiable: needs PyTorch
        from .torch.fused import linear
        globals()["linear"] = linear
        return linear
    raise AttributeError(f"module 'gemmgen' has no attribute {name!r}")


__all__ = ["SpecError", "__version__", "linear", "matmul", "release_workspace"]
