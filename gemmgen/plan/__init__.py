"""Derive every number of a kernel from a concrete Spec, and reject specs that cannot work.

The Plan is the only place that does arithmetic about the tiling: threads, warp layout, how
each operand tile is split into loads, the shared-memory layout and its index expressions,
resources against the target's limits. Templates place these values; they compute nothing.

A Plan is a kernel built from parts (parts/): a tile, a mainloop, a schedule and an epilogue, each
owning its settings' checks, numbers, rows, templates and share of the launch. One planner per
mainloop, make_plan choosing:
- arch.py: the targets' limits;
- base.py: what a Plan holds and the launchers' argument rules;
- tiled.py: SIMT block/warp/thread tiling, and the same tiling on mma.sync (mma_sync.py);
- wgmma.py: sm_90a warpgroup MMA fed by TMA or by loader warpgroups;
- decode.py: the decode kernel (M or N <= 16, GEMV-like FFMA at HBM bandwidth);
- schedule.py: how a scheduled kernel's blocks deal out the work (explain, the cost model).
"""

from __future__ import annotations

from ..language.errors import SpecError
from ..language.spec import Spec
from .arch import (ARCHS, MAX_REGISTERS_PER_THREAD, MAX_THREADS_PER_BLOCK, STATIC_SMEM_LIMIT, WARP,  # noqa: F401
                   Arch)
from .base import Plan  # noqa: F401
from .parts.epilogue import Output  # noqa: F401
from .parts.operand import Operand  # noqa: F401
from .mma_sync import MMA_SYNC_SHAPES  # noqa: F401
from .tiled import tiled_plan
from .wgmma import wgmma_plan
from .decode import decode_plan


def make_plan(spec: Spec) -> Plan:
    """The Plan of a concrete spec, or a SpecError at the setting that makes it impossible."""
    if not spec.is_concrete:
        keys = spec.set_keys
        raise spec.error(keys[0], f"this spec is a search space ({', '.join(keys)} hold sets); "
                         "building needs one value for each", "gemmgen tune, or one value per setting")
    arch = ARCHS[spec["target"]]
    if spec["decode.columns"]:
        return decode_plan(spec, arch)
    if not spec.written("block.m"):
        raise spec.error("block.m", f"kernel '{spec.name}' has no block setting: the C tile of a "
                         "thread block must be given", "block M x N x K, e.g. block 128 x 128 x 16")
    if spec["math"] != "simt" and arch.has_wgmma:
        return wgmma_plan(spec, arch)
    return tiled_plan(spec, arch)


def try_plan(spec: Spec) -> tuple[Plan | None, SpecError | None]:
    """make_plan for pruning a search space: the plan, or why the point is impossible."""
    try:
        return make_plan(spec), None
    except SpecError as exc:
        return None, exc
