"""Planning the decode kernel (`decode columns C warps W [slices S]`, and `math simt | tf32 | 3xtf32`):
GEMMs with M <= 16 or N <= 16, read at HBM bandwidth (parts/decode.py holds its mainloop and
schedule). Checks each setting the kernel takes, and refuses, at its line, every setting of the
tiled paths it has no use for."""

from __future__ import annotations

from ..language.spec import SETTINGS, Spec
from .arch import MAX_THREADS_PER_BLOCK, WARP, Arch
from .base import Plan
from .parts.decode import MAX_ROWS, MMA_COLUMNS, PRODUCTS, TENSOR_WARPS_PER_SM, Decode, DecodeSchedule, decode_unroll
from .parts.epilogue import Epilogue
from .parts.tile import Tile

# The settings a decode kernel reads; any other one written is a SpecError at its line.
_OWN = ("target", "layout.A", "layout.B", "layout.C", "math", "epilogue.beta", "occupancy",
        "decode.columns", "decode.warps", "decode.slices")

# What to say of a setting of another path, by its first word.
_WHY = {
    "epilogue.staged": ("the decode kernel stores C straight from registers (C is tiny: at most 16 rows)",
                        "epilogue alpha beta, or epilogue alpha"),
    "bias": ("the decode kernel has no fused epilogue (bias, scale, activation) yet: the libraries never "
             "choose it for a fused call", "no bias, scale or activation line"),
    "reduce": ("the decode kernel has no fused reduction", "no reduce line"),
}
_WHY["scale"] = _WHY["activation"] = _WHY["bias"]
_OTHER = ("the decode kernel has no block, warp or thread tiles, shared-memory tiles of both operands, split "
          "K over blocks or schedules: its shape is `decode columns C warps W slices S`",
          "no {word} line in a decode kernel")


def decode_plan(spec: Spec, arch: Arch) -> Plan:
    """The Plan of a decode kernel, or a SpecError at the setting that makes it impossible."""
    for key in spec.params:  # a setting of another path, written with other than its default
        if key not in _OWN and spec[key] != SETTINGS[key].default:
            why, allowed = _WHY.get(key if key == "epilogue.staged" else key.split(".")[0], _OTHER)
            raise spec.error(key, f"'{key}' does not apply to the decode kernel: {why}",
                             allowed.format(word=key.split(".")[0]))
    math = spec["math"]
    if math not in PRODUCTS:
        raise spec.error("math", f"the decode kernel multiplies with FFMA (math simt) or with TF32 mma.sync "
                         f"(math tf32 or 3xtf32); it has no {math}",
                         "math simt, tf32 or 3xtf32")
    if (spec["layout.A"], spec["layout.B"]) != ("row", "col"):
        raise spec.error(("layout.A", "layout.B"), f"the decode kernel reads A and B along K (A row, B col: "
                         f"an nn.Linear's input and weight); this spec has A {spec['layout.A']}, "
                         f"B {spec['layout.B']}", "layout A row, B col, C row (or C col)")
    columns, warps, slices = spec["decode.columns"], spec["decode.warps"], spec["decode.slices"]
    if warps % slices:
        raise spec.error("decode.slices", f"{slices} warps per column group do not divide the block's "
                         f"{warps} warps", f"slices that divide {warps}")
    if warps * WARP > MAX_THREADS_PER_BLOCK:
        raise spec.error("decode.warps", f"{warps} warps are {warps * WARP} threads; a block has at most "
                         f"{MAX_THREADS_PER_BLOCK}", f"at most {MAX_THREADS_PER_BLOCK // WARP} warps")
    block_columns = columns * warps // slices
    if PRODUCTS[math] and block_columns % MMA_COLUMNS:
        raise spec.error(("decode.columns", "decode.warps", "decode.slices"),
                         f"math {math} multiplies {MMA_COLUMNS} columns of the big operand per mma.sync, but "
                         f"this block takes {block_columns} (columns {columns} x warps {warps} / slices "
                         f"{slices})", f"columns x warps / slices a multiple of {MMA_COLUMNS}, or math simt")
    mainloop = Decode(math=math, unroll=decode_unroll(columns), columns=columns, warps=warps, slices=slices,
                      c_layout=spec["layout.C"])
    occupancy = spec["occupancy"] or (max(1, TENSOR_WARPS_PER_SM // warps) if mainloop.products else 0)
    tile = Tile(BM=MAX_ROWS, BN=mainloop.block_columns, BK=8192 // MAX_ROWS, WM=MAX_ROWS, WN=columns,
                TM=MAX_ROWS, TN=columns, RM=1, RN=1, SUB_M=MAX_ROWS, SUB_N=columns, warp_tiling=False,
                warps_m=1, warps_n=warps, lanes_m=1, lanes_n=WARP, threads=warps * WARP, order="n",
                occupancy=occupancy)
    schedule = DecodeSchedule(BM=MAX_ROWS, BN=mainloop.block_columns, BK=tile.BK)
    epilogue = Epilogue(c_layout=spec["layout.C"], beta=spec["epilogue.beta"])
    return Plan(spec=spec, name=spec.name, arch=arch, tile=tile, mainloop=mainloop, scheduler=schedule,
                epilogue=epilogue, smem_bytes=0, registers_estimate=mainloop.registers())
