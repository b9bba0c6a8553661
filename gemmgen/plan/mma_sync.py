"""The mma.sync path (sm_80 to sm_90): which MMA instruction a tensor-core spec uses and whether its
tiling fits it, and when fragments can be read with ldmatrix. The rest of the kernel is tiled.py's."""

from __future__ import annotations

from ..language.spec import Spec
from .arch import Arch
from .parts.operand import Operand

# Tensor-core math: the warp-level instruction shape (M, N, K) each math mode supports per path.
MMA_SYNC_SHAPES = ((16, 8, 8),)


def ldmatrix_fits(op: Operand, free_dim: str) -> bool:
    """ldmatrix moves 8 rows of 16 bytes per matrix: it fits where shared rows run along the free
    dimension (so each row holds 4 consecutive k of one m or n) and rows start 16-byte aligned."""
    return op.smem_row_dim == free_dim and op.smem_ld % 4 == 0


def mma_sync_shape(spec: Spec, arch: Arch, BK: int, WM: int, WN: int, warp_tiling: bool,
                    uses_shared: bool) -> tuple[int, int, int]:
    """The mma.sync instruction shape of a tensor-core spec, after checking the tiling fits it."""
    math = spec["math"]
    shape = ((spec["mma.m"], spec["mma.n"], spec["mma.k"]) if spec.written("mma.m")
             else MMA_SYNC_SHAPES[0])
    allowed = " or ".join(" x ".join(map(str, s)) for s in MMA_SYNC_SHAPES)
    if shape not in MMA_SYNC_SHAPES:
        raise spec.error("mma.m", f"mma.sync on {arch.name} multiplies TF32 in tiles of {allowed} "
                         f"(M x N x K), not {' x '.join(map(str, shape))}",
                         f"mma {allowed}, or target sm_90a for wgmma's 64 x N x 8")
    if spec.written("thread.m"):
        raise spec.error("thread.m", f"with math {math} each warp multiplies {shape[0]} x {shape[1]} "
                         "tiles on the tensor cores, which fixes what a thread holds: the MMA "
                         "instruction takes the place of the thread tile",
                         "no thread line (warp M x N sets how many MMA tiles a warp sweeps)")
    if not uses_shared:
        raise spec.error("shared", "tensor-core fragments are read from shared-memory tiles, which "
                         "'shared off' turns off", "shared memory on")
    if not warp_tiling:
        raise spec.error(("math", "block.m"), f"math {math} gives each warp its own C tile, so the "
                         "spec needs a warp tile", "warp M x N, e.g. warp 64 x 32")
    if WM % shape[0] or WN % shape[1]:
        raise spec.error("warp.m", f"the warp tile {WM} x {WN} is not a whole number of "
                         f"{shape[0]} x {shape[1]} MMA tiles",
                         f"warp M a multiple of {shape[0]} and N a multiple of {shape[1]}")
    if BK % shape[2]:
        raise spec.error("block.k", f"block K = {BK} is not a whole number of the MMA's K steps "
                         f"of {shape[2]}", f"block K a multiple of {shape[2]}")
    if spec["fragments"] != 1:
        raise spec.error("fragments", "double-buffered fragments are a simt technique; tensor-core "
                         "fragments of one K step are read just before their MMAs", "fragments 1")
    if spec["unroll"]:
        raise spec.error("unroll", "unroll sets how much of the FFMA inner product's k loop is one "
                         "loop body; the MMA loop over a K tile is always unrolled whole", "no unroll line")
    if spec["order"] != "n":
        raise spec.error("order", "the MMA instruction fixes which lane holds which C values, so "
                         "there is no thread order to choose", "no order line")
    return shape
