"""How a scheduled kernel's blocks take the C tiles (`schedule persistent | stream-k`): the same
arithmetic as templates/schedule.cuh.j2 and the launcher, for explain, the cost models and the
library's choice of member. tests/test_schedule.py walks the C scheduler and checks it against this.
(The schedule part itself, its rules, numbers and templates, is parts/schedule.py.)"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from .base import Plan

H100_SMS = 132  # the SM count explain assumes for sm_90a when no GPU is named


@dataclass(frozen=True)
class Dealing:
    """What one call's blocks do on a GPU of `sms` SMs."""

    blocks: int          # launched (the grid)
    tiles: int           # C tiles
    k_tiles: int         # K tiles per C tile
    whole_tiles: int     # tiles a single block multiplies from end to end
    stream_k_tiles: int  # tiles dealt out by K tile (stream-k)
    most_k_tiles: int    # K tiles of the busiest block
    least_k_tiles: int   # of the least busy
    most_pieces: int     # blocks sharing one tile, at most (1: none shared)
    workspace_bytes: int

    @property
    def balance(self) -> float:
        """Mean K tiles per block over the busiest block's (1: every block as busy)."""
        return self.tiles * self.k_tiles / (self.blocks * self.most_k_tiles) if self.most_k_tiles else 1.0


def dealt_tiles(tiles: int, blocks: int) -> int:
    """How many of `tiles` C tiles stream-K deals out by K tile among `blocks` blocks (Schedule's
    sk_tiles): none when they fill whole waves, all when there are fewer than blocks, else the last
    partial wave and one whole wave before it."""
    waves, rest = divmod(tiles, blocks)
    return 0 if rest == 0 else (tiles if waves == 0 else blocks + rest)


def deal(plan: Plan, M: int, N: int, K: int, sms: int) -> Dealing:
    """The dealing of an M x N x K call (the TMA path: K >= 1) among the blocks the launcher starts."""
    tiles = plan.grid(M, N)
    k_tiles = max(1, ceil(K / plan.BK))
    blocks = plan.launch_blocks(M, N, K, sms) if plan.scheduled else tiles * plan.split_k
    if not tiles:
        return Dealing(0, 0, k_tiles, 0, 0, 0, 0, 1, 0)
    sk_tiles = dealt_tiles(tiles, blocks) if plan.schedule == "stream-k" else 0
    whole = tiles - sk_tiles
    if plan.split_k > 1:
        per_slice = ceil(k_tiles / plan.split_k)
        return Dealing(blocks, tiles, k_tiles, 0, 0, per_slice, k_tiles - per_slice * (plan.split_k - 1),
                       ceil(k_tiles / per_slice), 0)
    whole_most, whole_least = ceil(whole / blocks), whole // blocks
    if plan.cluster_blocks > 1:  # persistent clusters walk cluster-sized groups of tiles, edge ones too
        units, clusters = plan.cluster_grid(M, N) // plan.cluster_blocks, blocks // plan.cluster_blocks
        whole_most, whole_least = ceil(units / clusters), units // clusters
    share, extra = divmod(sk_tiles * k_tiles, blocks)
    most = whole_most * k_tiles + share + (1 if extra else 0)
    least = whole_least * k_tiles + share
    long_part = extra * (share + 1)

    def block_of(i: int) -> int:  # Schedule::block_of_iteration
        return i // (share + 1) if i < long_part else extra + (i - long_part) // max(share, 1)

    pieces = max((block_of((t + 1) * k_tiles - 1) - block_of(t * k_tiles) + 1 for t in range(sk_tiles)),
                 default=1)
    return Dealing(blocks, tiles, k_tiles, whole, sk_tiles, most, least, pieces,
                   plan.workspace_bytes(blocks))
