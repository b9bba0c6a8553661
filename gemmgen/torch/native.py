"""torch.ops.gemmgen.matmul's kernels in C++ (native.cpp): built once as a PyTorch C++ extension,
then registered in place of the Python kernels, so that a call needing no gradient goes from the
dispatcher to cuLaunchKernelEx without entering Python.

A kernel written in Python costs every call the dispatcher's boxed call into Python: on an H100
host the operator took 16.7 us at 64x64x64 where gemmgen.matmul took 12.1 and torch.matmul 15.9.
The C++ kernels keep Python for what is decided once per call key: on a key's first call,
`describe` resolves it as gemmgen.matmul does (library/dispatch.py) and hands C++ the prepared
launch (CUfunctions, launch configurations, argument buffers, and where A, B, C, alpha, tensor
maps and stream-K's workspace go). A call that needs a gradient goes through a C++ autograd
Function (ops.py's gradients(), written again there), whose backward is the operator again; a key
whose operands must be copied first, or whose arguments are wrong,
goes to `fallback`, which serves or reports it as the Python kernel would. gemmgen.matmul of two
torch tensors into a new output takes the same C++ path (without the dispatcher, so without
autograd), registered with dispatch.use_torch_launcher.

The build needs a C++ compiler, ninja and CUDA's headers (PyTorch's CUDA stream header includes
them); it takes about a minute, once per PyTorch version, into gemmgen's cache
($GEMMGEN_CACHE/torch-native). Where it cannot be built, or PyTorch has no CUDA, ops.py keeps the
Python kernels and says why once. GEMMGEN_TORCH_NATIVE=0 keeps the Python kernels.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import sys
from pathlib import Path

import torch

from ..gpu.compile_cache import cache_dir
from ..gpu.launch import PreparedLaunch, cuda, error_text
from ..library.dispatch import nothing, resolve_torch_call, torch_matmul, use_torch_launcher

SOURCE = Path(__file__).with_name("native.cpp")


def disabled_reason() -> str | None:
    """Why the C++ kernels are not to be built here, or None."""
    if os.environ.get("GEMMGEN_TORCH_NATIVE", "1").strip() in ("0", "off", "no", "false"):
        return "GEMMGEN_TORCH_NATIVE=0"
    if torch.version.cuda is None:
        return f"this PyTorch ({torch.__version__}) has no CUDA"
    if not torch.cuda.is_available():
        return "PyTorch sees no GPU"
    return None


def build_directory() -> Path:
    """Where the extension is built: per PyTorch version and source (a changed native.cpp builds anew)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return cache_dir() / "torch-native" / f"torch-{torch.__version__}-{digest}"


def _cuda_include() -> list[str]:
    """The CUDA toolkit's include folder (cuda_runtime_api.h and what it includes), as a list of
    at most one: $CUDA_HOME's, nvcc's, /usr/local/cuda's, or a CUDA wheel's."""
    from torch.utils.cpp_extension import CUDA_HOME
    roots = [Path(CUDA_HOME) / "include"] if CUDA_HOME else []
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(Path(nvcc).resolve().parent.parent / "include")
    roots.append(Path("/usr/local/cuda/include"))
    for root in sys.path:  # the nvidia-cuda-* wheels that a CUDA build of PyTorch depends on
        roots.extend(Path(root).glob("nvidia/cu*/include") if root else ())
    for root in roots:
        if (root / "cuda_runtime_api.h").is_file() and (root / "crt" / "host_defines.h").is_file():
            return [str(root)]
    return []


FAILED = "build-failed.txt"  # in the build directory: why its build failed, so that it is not tried at every import


def build(verbose: bool = False):
    """The extension module, built (or loaded from the build directory). A failed build is
    remembered in the build directory (FAILED), so that each `import gemmgen.torch` does not spend
    the compile again: remove the directory to try again."""
    from torch.utils.cpp_extension import load
    directory = build_directory()
    failed = directory / FAILED
    if failed.is_file():
        raise RuntimeError(f"{failed.read_text().strip()}; remembered from an earlier build: remove {directory} "
                           "to build again")
    include = _cuda_include()
    if not include:
        raise RuntimeError("CUDA's headers (cuda_runtime_api.h) were not found: set CUDA_HOME")
    directory.mkdir(parents=True, exist_ok=True)
    fresh = not any(directory.glob("*.so"))
    if fresh:
        print("gemmgen: building torch.ops.gemmgen.matmul's C++ kernels (once per PyTorch version, about a "
              f"minute) in {directory}", file=sys.stderr, flush=True)
    try:
        return load(name="gemmgen_native", sources=[str(SOURCE)], build_directory=str(directory),
                    extra_include_paths=include, extra_cflags=["-O2"], extra_ldflags=["-lc10_cuda"],
                    verbose=verbose)
    except Exception as exc:  # a compiler or ninja missing, a failed compile or link
        reason = _first_error(str(exc)) or type(exc).__name__
        partial = failed.with_suffix(".partial")
        partial.write_text(reason + "\n")
        os.replace(partial, failed)  # whole or absent
        raise RuntimeError(reason) from None


def _first_error(text: str) -> str:
    """The line of a failed build's output that says what went wrong (a compiler's first error)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower() and not line.lower().startswith("error building extension"):
            return line
    return lines[-1] if lines else ""


def describe(a: torch.Tensor, b: torch.Tensor, alpha: float, precision: str):
    """(swap, shape, context, steps, keep) of a call key, or None where Python serves it."""
    call = resolve_torch_call(a, b, precision)
    if call.route is not None:
        return None
    run = call.run
    if isinstance(run, PreparedLaunch):
        steps, context = run.describe(), run.context
    elif run is nothing:  # no matrices (a batch of 0): an empty output, no launch
        steps, context = [], 0
    else:
        return None
    return (bool(call.swap), tuple(int(x) for x in call.shape), context or 0, steps, run)


def _address(function) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value


def install() -> str | None:
    """Build and register the C++ kernels; None when they are in place, else why not (the caller
    then registers the Python kernels)."""
    reason = disabled_reason()
    if reason:
        return reason
    try:
        module = build()
    except Exception as exc:  # a compiler, ninja or headers missing; a failed build
        return f"the C++ kernels could not be built ({_first_error(str(exc)) or type(exc).__name__})"
    lib = cuda()
    module.install(describe, torch_matmul, error_text, _address(lib.cuCtxGetCurrent),
                   _address(lib.cuCtxSetCurrent), _address(lib.cuLaunchKernelEx))
    global installed
    installed = module
    use_torch_launcher(module.matmul)  # gemmgen.matmul's torch path, too
    return None


def install_linear() -> bool:
    """Register gemmgen::linear's Autograd kernel in C++ (fused.py's _Linear, written again in
    native.cpp) where the C++ kernels are installed; whether it did."""
    if installed is None:
        return False
    installed.install_linear()
    return True


installed = None  # the extension module once its kernels are registered
