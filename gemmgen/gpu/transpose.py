"""The copies gemmgen.matmul makes of an operand that lies in the storage order its kernels do not
read (A column-major or B row-major: wgmma takes TF32 operands K-major only): a tiled transpose
kernel of gemmgen's own, compiled with NVRTC once per GPU architecture (templates/transpose.cu.j2).
PyTorch's transposing copy (`x.t().contiguous()`) moved about 0.9 TB/s on an H100; a tiled one
reads and writes whole rows. Where every row starts 16-byte aligned, a second kernel of the same
file moves 64 x 64 tiles by float4s; other calls take the 32 x 32 one, a float at a time.

    transpose(src, rows, cols, ld_src, dst, ld_dst, device, stream)   # raw device addresses
    transpose(..., stream, batch=b, strides=(stride_src, stride_dst))   # b matrices in one launch
"""

from __future__ import annotations

import ctypes
import threading

from ..codegen.cuda import render_template
from .compile import compile_source
from .launch import Arguments, CudaError, LaunchConfig, cuda, error_text
from .runtime import device_info, on_device

TILE, ROWS = 32, 8   # as the template has them: a block moves a TILE x TILE tile with TILE x ROWS threads
VTILE, VROWS = 64, 16   # the float4 kernel's: VTILE x VTILE tiles, (VTILE / 4) x VROWS threads
KERNELS = ("gemmgen_transpose", "gemmgen_transpose_vec4")
_MAX_GRID_Y = 65535

_lock = threading.Lock()
# The kernel's parameters, as templates/transpose.cu.j2 declares them (launch.py's kinds).
SIGNATURE = (("in", "p"), ("rows", "i"), ("cols", "i"), ("ld_in", "l"), ("out", "p"), ("ld_out", "l"),
             ("batch", "i"), ("stride_in", "l"), ("stride_out", "l"))


class _Launcher:
    """The kernels on one device, ready to launch: its primary context, the two CUfunctions (a float
    at a time, float4s), an argument buffer written in place per call and a launch configuration (a
    call's host time is a few writes and one cuLaunchKernelEx, as a prepared GEMM launch's is).
    `lock` guards the buffer and config."""

    __slots__ = ("context", "functions", "arguments", "slots", "params", "config", "config_ref", "lock")

    def __init__(self, context: int, functions: tuple[int, int]):
        self.context, self.functions = context, tuple(ctypes.c_void_p(f) for f in functions)
        self.arguments = Arguments(SIGNATURE)
        self.slots = tuple(self.arguments.slot(name) for name, _ in SIGNATURE)
        self.params = ctypes.c_void_p(self.arguments.kernel_params)
        self.config = LaunchConfig(1, 1, 1, TILE, ROWS, 1, 0, None, None, 0)
        self.config_ref = ctypes.byref(self.config)
        self.lock = threading.Lock()


_launchers: dict[int, _Launcher] = {}  # device -> its launcher


def _launcher(device: int) -> _Launcher:
    """The kernel on `device`, compiled and loaded once."""
    found = _launchers.get(device)
    if found is not None:
        return found
    with _lock:
        if device not in _launchers:
            info = device_info(device)
            compiled = compile_source(render_template("transpose.cu.j2"), info.target, list(KERNELS),
                                      filename="transpose.cu")
            lib = cuda()
            with on_device(device) as context:
                module = ctypes.c_void_p()
                _call(lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(compiled.cubin)),
                      "loading gemmgen's transpose kernels")
                functions = []
                for name in KERNELS:
                    function = ctypes.c_void_p()
                    symbol = compiled.lowered_names[name].encode()
                    _call(lib.cuModuleGetFunction(ctypes.byref(function), module, ctypes.c_char_p(symbol)),
                          f"finding {name} in its cubin")
                    functions.append(function.value)
                _launchers[device] = _Launcher(int(context), tuple(functions))
        return _launchers[device]


def _call(status: int, what: str) -> None:
    if status:
        raise CudaError(f"{what}: {error_text(status)}", status)


def grid(rows: int, cols: int, batch: int = 1, tile: int = TILE) -> tuple[int, int, int]:
    """Blocks of a launch of `tile`-sided tiles: one column of tiles per block column; tile rows and
    batches beyond 65535 are walked."""
    return -(-cols // tile), min(-(-rows // tile), _MAX_GRID_Y), min(batch, _MAX_GRID_Y)


def vectorised(src: int, ld_src: int, dst: int, ld_dst: int, strides: tuple[int, int]) -> bool:
    """Whether every row of source and destination starts 16-byte aligned: the float4 kernel's
    condition."""
    return (src % 16 == 0 and dst % 16 == 0 and ld_src % 4 == 0 and ld_dst % 4 == 0
            and strides[0] % 4 == 0 and strides[1] % 4 == 0)


def transpose(src: int, rows: int, cols: int, ld_src: int, dst: int, ld_dst: int, device: int,
              stream: int, batch: int = 1, strides: tuple[int, int] = (0, 0)) -> None:
    """dst (cols x rows, row-major, ld_dst) = src (rows x cols, row-major, ld_src) transposed, on
    `stream` of `device`, for `batch` matrices `strides` floats apart (src's, dst's); nothing is
    launched for an empty matrix or batch."""
    if rows <= 0 or cols <= 0 or batch <= 0:
        return
    if ld_src < cols or ld_dst < rows:
        raise ValueError(f"transpose: leading dimensions {ld_src}, {ld_dst} below {cols}, {rows}")
    if batch > 1 and (min(strides) < 0 or strides[1] < cols * ld_dst):
        raise ValueError(f"transpose: batch strides {strides} overlap the destination's matrices "
                         f"({cols * ld_dst} floats each) or run backwards")
    launcher = _launcher(device)
    lib = cuda()
    vector = vectorised(src, ld_src, dst, ld_dst, strides if batch > 1 else (0, 0))
    gx, gy, gz = grid(rows, cols, batch, VTILE if vector else TILE)
    values = (src, rows, cols, ld_src, dst, ld_dst, batch, strides[0], strides[1])
    with launcher.lock:
        current = ctypes.c_void_p()
        lib.cuCtxGetCurrent(ctypes.byref(current))
        switch = current.value != launcher.context
        if switch:
            _call(lib.cuCtxSetCurrent(ctypes.c_void_p(launcher.context)), "making the GPU's context current")
        try:
            for (view, index), value in zip(launcher.slots, values):
                view[index] = value
            config = launcher.config
            config.grid_x, config.grid_y, config.grid_z, config.stream = gx, gy, gz, stream
            config.block_x, config.block_y = (VTILE // 4, VROWS) if vector else (TILE, ROWS)
            status = lib.cuLaunchKernelEx(launcher.config_ref, launcher.functions[vector], launcher.params, None)
            if status:
                _call(status, f"launching gemmgen_transpose on {batch} x {rows} x {cols}")
        finally:
            if switch:
                lib.cuCtxSetCurrent(current)
