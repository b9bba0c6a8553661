"""The small kernels gemmgen launches beside its GEMMs: the transposing copy (transpose.py) and the
padding copy (pad.py). Each is a template of templates/ compiled with NVRTC once per GPU
architecture (cubins cached on disk) and loaded once per device; a launch writes its values into an
argument buffer kept per device and calls cuLaunchKernelEx, in the device's context, as a prepared
GEMM launch does (a few writes, one driver call).

    kernels = CopyKernels("transpose.cu.j2", ("gemmgen_transpose", ...), SIGNATURE, "transpose kernels")
    kernels.launch(device, which, grid, block, values, stream, what)
"""

from __future__ import annotations

import contextlib
import ctypes
import threading

from ..codegen.cuda import render_template
from .compile import compile_source
from .launch import Arguments, CudaError, LaunchConfig, cuda, error_text
from .runtime import device_info, on_device


def check(status: int, what: str) -> None:
    """A CUresult as the CudaError it is (nothing for CUDA_SUCCESS)."""
    if status:
        raise CudaError(f"{what}: {error_text(status)}", status)


class Loaded:
    """A template's kernels on one device: its primary context, the CUfunctions, an argument buffer
    written in place per call and a launch configuration; `lock` guards the buffer and config."""

    __slots__ = ("context", "functions", "arguments", "slots", "params", "config", "config_ref", "lock")

    def __init__(self, context: int, functions: list[int], signature):
        self.context, self.functions = context, tuple(ctypes.c_void_p(f) for f in functions)
        self.arguments = Arguments(signature)
        self.slots = tuple(self.arguments.slot(name) for name, _ in signature)
        self.params = ctypes.c_void_p(self.arguments.kernel_params)
        self.config = LaunchConfig(1, 1, 1, 1, 1, 1, 0, None, None, 0)
        self.config_ref = ctypes.byref(self.config)
        self.lock = threading.Lock()


class CopyKernels:
    """The kernels `names` of `template` (parameters as `signature` lists them: launch.py's kinds),
    loaded on each device the first time it launches one."""

    def __init__(self, template: str, names: tuple[str, ...], signature, what: str):
        self.template, self.names, self.signature, self.what = template, names, signature, what
        self.loaded: dict[int, Loaded] = {}
        self._lock = threading.Lock()

    def on(self, device: int) -> Loaded:
        """The kernels on `device`, compiled and loaded once."""
        found = self.loaded.get(device)
        if found is not None:
            return found
        with self._lock:
            if device not in self.loaded:
                info = device_info(device)
                compiled = compile_source(render_template(self.template), info.target, list(self.names),
                                          filename=self.template.removesuffix(".j2"))
                lib = cuda()
                with on_device(device) as context:
                    module = ctypes.c_void_p()
                    check(lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(compiled.cubin)),
                          f"loading gemmgen's {self.what}")
                    functions = []
                    for name in self.names:
                        function = ctypes.c_void_p()
                        symbol = compiled.lowered_names[name].encode()
                        check(lib.cuModuleGetFunction(ctypes.byref(function), module, ctypes.c_char_p(symbol)),
                              f"finding {name} in its cubin")
                        functions.append(function.value)
                    self.loaded[device] = Loaded(int(context), functions, self.signature)
            return self.loaded[device]

    @contextlib.contextmanager
    def current(self, device: int):
        """The device's primary context current inside the block (the caller's again after it), by
        two driver calls where the runtime's on_device makes several."""
        loaded = self.on(device)
        lib = cuda()
        previous = ctypes.c_void_p()
        lib.cuCtxGetCurrent(ctypes.byref(previous))
        switch = previous.value != loaded.context
        if switch:
            check(lib.cuCtxSetCurrent(ctypes.c_void_p(loaded.context)), "making the GPU's context current")
        try:
            yield loaded
        finally:
            if switch:
                lib.cuCtxSetCurrent(previous)

    def launch(self, device: int, which: int, grid: tuple[int, int, int], block: tuple[int, int], values: tuple,
               stream: int, what: str) -> None:
        """Kernel `which` on `device`'s `stream` over `grid` blocks of `block` threads, its parameters
        `values` (in the signature's order)."""
        loaded = self.on(device)
        with loaded.lock, self.current(device):
            for (view, index), value in zip(loaded.slots, values):
                view[index] = value
            config = loaded.config
            config.grid_x, config.grid_y, config.grid_z, config.stream = grid[0], grid[1], grid[2], stream
            config.block_x, config.block_y = block
            status = cuda().cuLaunchKernelEx(loaded.config_ref, loaded.functions[which], loaded.params, None)
            check(status, what)
