"""The copies gemmgen.matmul makes of an operand that lies in the storage order its kernels do not
read (A column-major or B row-major: wgmma takes TF32 operands K-major only): a tiled transpose
kernel of gemmgen's own, compiled with NVRTC once per GPU architecture (templates/transpose.cu.j2).
PyTorch's transposing copy (`x.t().contiguous()`) moved about 0.9 TB/s on an H100; a tiled one
reads and writes whole rows.

    transpose(src, rows, cols, ld_src, dst, ld_dst, device, stream)   # raw device addresses
    transpose(..., stream, batch=b, strides=(stride_src, stride_dst))   # b matrices in one launch
"""

from __future__ import annotations

import ctypes
import threading

from ..codegen.cuda import render_template
from .compile import compile_source
from .launch import CudaError, cuda, error_text
from .runtime import device_info, on_device

TILE, ROWS = 32, 8   # as the template has them: a block moves a TILE x TILE tile with TILE x ROWS threads
_MAX_GRID_Y = 65535

_lock = threading.Lock()
_functions: dict[int, tuple[int, int]] = {}  # device -> (its primary context, the kernel's CUfunction)


def _function(device: int) -> tuple[int, int]:
    """The kernel on `device` (its primary context and CUfunction), compiled and loaded once."""
    with _lock:
        if device not in _functions:
            info = device_info(device)
            compiled = compile_source(render_template("transpose.cu.j2"), info.target, ["gemmgen_transpose"],
                                      filename="transpose.cu")
            lib = cuda()
            with on_device(device) as context:
                module, function = ctypes.c_void_p(), ctypes.c_void_p()
                _call(lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(compiled.cubin)),
                      "loading gemmgen's transpose kernel")
                symbol = compiled.lowered_names["gemmgen_transpose"].encode()
                _call(lib.cuModuleGetFunction(ctypes.byref(function), module, ctypes.c_char_p(symbol)),
                      "finding gemmgen_transpose in its cubin")
                _functions[device] = (int(context), function.value)
        return _functions[device]


def _call(status: int, what: str) -> None:
    if status:
        raise CudaError(f"{what}: {error_text(status)}", status)


def grid(rows: int, cols: int, batch: int = 1) -> tuple[int, int, int]:
    """Blocks of a launch: one column of tiles per block column; tile rows and batches beyond 65535
    are walked."""
    return -(-cols // TILE), min(-(-rows // TILE), _MAX_GRID_Y), min(batch, _MAX_GRID_Y)


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
    context, function = _function(device)
    lib = cuda()
    current = ctypes.c_void_p()
    lib.cuCtxGetCurrent(ctypes.byref(current))
    switch = current.value != context
    if switch:
        _call(lib.cuCtxSetCurrent(ctypes.c_void_p(context)), "making the GPU's context current")
    try:
        values = [ctypes.c_void_p(src), ctypes.c_int(rows), ctypes.c_int(cols), ctypes.c_longlong(ld_src),
                  ctypes.c_void_p(dst), ctypes.c_longlong(ld_dst), ctypes.c_int(batch),
                  ctypes.c_longlong(strides[0]), ctypes.c_longlong(strides[1])]
        params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        gx, gy, gz = grid(rows, cols, batch)
        _call(lib.cuLaunchKernel(ctypes.c_void_p(function), ctypes.c_uint(gx), ctypes.c_uint(gy), ctypes.c_uint(gz),
                                 ctypes.c_uint(TILE), ctypes.c_uint(ROWS), ctypes.c_uint(1), ctypes.c_uint(0),
                                 ctypes.c_void_p(stream), params, None),
              f"launching gemmgen_transpose on {batch} x {rows} x {cols}")
    finally:
        if switch:
            lib.cuCtxSetCurrent(current)
