"""Numbers of a Plan's schedule, clusters and epilogue for cost models, as pure functions.

Each is a function of the Plan (and the problem shape and SM count where the answer depends on
them), with nothing measured in it. costmodel.py does not use them yet: folded into its estimate
(waves of persistent blocks, epilogue traffic, a DRAM floor) they did not improve the model
strategy's replays on recordings outside the test bed (docs/tuning.md, "Judged on recordings it was
not fitted on"), so they wait for a model that does better with them:

- `waves`: how the C tiles fall on the SMs under the Plan's schedule: data-parallel blocks in
  waves of `sms x resident`, persistent and pingpong blocks (or whole clusters) walking tiles,
  stream-K's dealt K tiles (plan/schedule.py's `deal`): the tiles the busiest SM runs, the mean
  work over the busiest's, and how full the last wave is;
- `multicast_saving`: the share of a block's L2 reads that a cluster's multicast saves (each SM
  still receives its whole A and B tiles; whether its intake is what limits it, as main's model
  assumes by crediting the saving to it, the replays could not settle);
- `epilogue_traffic`: per C tile, the bytes the epilogue moves through global memory (C, beta's
  read of C, the bias and scale vectors) and through shared memory (a staged or TMA store writes
  the tile there and reads it back), and its arithmetic per element (alpha, beta, vectors and the
  activation: `activation_ops`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..plan import Plan
from ..plan.schedule import deal

# What an activation's CUDA expression costs per element, in FP32 operations: each arithmetic
# operator one, each call of a special function (erff, expf, tanhf) this many (about the
# instructions CUDA's fast paths of them issue).
SPECIAL_FUNCTION_OPS = 8
_SPECIAL = re.compile(r"\b(erff|expf|tanhf|logf|sinf|cosf)\(")


@dataclass(frozen=True)
class Waves:
    """How the C tiles fall on the SMs."""

    per_sm: int        # tiles (or their K tiles' worth, under stream-K) the busiest SM runs, rounded up
    fill: float        # mean work per SM over the busiest SM's (1: all equally busy)
    last_fill: float   # the share of the SMs busy in the last wave (1: whole waves)


def waves(plan: Plan, M: int, N: int, K: int, sms: int, resident: int = 1) -> Waves:
    """The waves of `plan`'s blocks at M x N x K on `sms` SMs, `resident` blocks to an SM at once
    (data-parallel; a scheduled kernel starts one block per SM and walks tiles)."""
    if plan.schedule == "stream-k":
        dealt = deal(plan, M, N, K, sms)
        per_sm = max(1, math.ceil(dealt.tiles / max(dealt.blocks, 1)))
        busy = dealt.blocks / sms
        return Waves(per_sm, dealt.balance * busy, 1.0 if dealt.stream_k_tiles else _last(dealt.tiles, dealt.blocks))
    if plan.scheduled:
        units = plan.cluster_grid(M, N) // plan.cluster_blocks
        blocks = plan.launch_blocks(M, N, K, sms)
        clusters = max(1, blocks // plan.cluster_blocks)
        per_sm = math.ceil(units / clusters)
        return Waves(per_sm, units / (clusters * per_sm) * blocks / sms, _last(units, clusters))
    tiles_m, tiles_n = plan.cluster_tiles(M, N)
    blocks = tiles_m * tiles_n * plan.split_k
    per_sm = math.ceil(blocks / sms)
    return Waves(per_sm, blocks / (sms * per_sm), _last(blocks, sms * max(1, resident)))


def _last(work: int, slots: int) -> float:
    """The share of `slots` busy in the last of the waves that `work` units take."""
    rest = work % slots
    return 1.0 if rest == 0 else rest / slots


def multicast_saving(plan: Plan) -> float:
    """The share of a block's L2 reads of A and B that its cluster's multicast saves: A's tile is
    read once for the cluster_n blocks of a cluster row, B's once for the cluster_m of a column."""
    whole = 4 * (plan.BM + plan.BN) * plan.BK
    return 1 - plan.block_load_bytes / whole


@dataclass(frozen=True)
class EpilogueTraffic:
    """What the epilogue of one C tile moves and computes."""

    global_bytes: int     # C written, C read (beta), bias and scale vectors read
    shared_bytes: int     # the staged / TMA store's pass through shared memory (written, then read)
    ops_per_element: int  # FP32 operations per element of C

    def ops(self, plan: Plan) -> int:
        return self.ops_per_element * plan.BM * plan.BN


def activation_ops(cuda: str) -> int:
    """FP32 operations of an activation's CUDA expression ({x} standing for the value)."""
    specials = len(_SPECIAL.findall(cuda))
    operators = len(re.findall(r"[-+*/]", re.sub(r"\d+\.\d+f|\d+f", "c", cuda)))
    compares = cuda.count("fmaxf(") + cuda.count("fminf(")
    return operators + compares + SPECIAL_FUNCTION_OPS * specials


def epilogue_traffic(plan: Plan) -> EpilogueTraffic:
    """Bytes and operations of the epilogue of one BM x BN tile of C."""
    epilogue = plan.epilogue
    area = plan.BM * plan.BN
    global_bytes = 4 * area * (2 if epilogue.beta else 1)
    lengths = {"row": plan.BM, "col": plan.BN}
    global_bytes += sum(4 * lengths[by] for _, by in epilogue.vectors)
    shared = 8 * area if (epilogue.staged or epilogue.tma_store) else 0
    ops = 1 + (2 if epilogue.beta else 0) + len(epilogue.vectors) + activation_ops(epilogue.activation.cuda)
    return EpilogueTraffic(global_bytes, shared, ops)
