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

from .copy_kernels import CopyKernels

TILE, ROWS = 32, 8   # as the template has them: a block moves a TILE x TILE tile with TILE x ROWS threads
VTILE, VROWS = 64, 16   # the float4 kernel's: VTILE x VTILE tiles, (VTILE / 4) x VROWS threads
KERNELS = ("gemmgen_transpose", "gemmgen_transpose_vec4")
_MAX_GRID_Y = 65535

# The kernel's parameters, as templates/transpose.cu.j2 declares them (launch.py's kinds).
SIGNATURE = (("in", "p"), ("rows", "i"), ("cols", "i"), ("ld_in", "l"), ("out", "p"), ("ld_out", "l"),
             ("batch", "i"), ("stride_in", "l"), ("stride_out", "l"))
_KERNELS = CopyKernels("transpose.cu.j2", KERNELS, SIGNATURE, "transpose kernels")


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
    vector = vectorised(src, ld_src, dst, ld_dst, strides if batch > 1 else (0, 0))
    gx, gy, gz = grid(rows, cols, batch, VTILE if vector else TILE)
    values = (src, rows, cols, ld_src, dst, ld_dst, batch, strides[0], strides[1])
    _KERNELS.launch(device, int(vector), (gx, gy, gz), (VTILE // 4, VROWS) if vector else (TILE, ROWS), values,
                    stream, f"launching gemmgen_transpose on {batch} x {rows} x {cols}")
