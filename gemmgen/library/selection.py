"""Predict a library member's time at any shape, and choose the fastest member for a call.

A library (tune.py) measures its members at the shapes it is tuned for. For a shape nobody
tuned, the choice rests on two things:

- What the Plan knows about a member: its C tile (BM x BN), K step, split and how many blocks an
  SM holds. From them, for any M, N, K: the blocks of a launch, the waves they take over the SMs,
  and the K steps each block walks. A member's time is modelled as
      t = c0 + c1 * waves * k_steps + c2 * waves + c3 * tile_bytes + c4 * split_bytes
  (launch cost; the main loop of the busiest SM; each wave's prologue and epilogue; operand
  traffic through L2; split K's extra pass over C), with c >= 0 fitted to the member's own
  measurements, relative error minimised, each measurement weighed by how near the fastest member
  it was there (the model matters where the member may be chosen).
- What was measured near the shape: the model's error at the tuned shapes, spread to their
  neighbours (distance in log M, log N, log K and log batch), corrects the prediction. Below one
  tile (M under BM, N under BN) a tile member does a whole tile's work, and an untuned call there
  is predicted as one of a whole tile. At a tuned
  shape the measurement itself is the prediction. The model is fitted to single GEMMs; a library
  tuned at strided batches (`MxNxK batch B`) keeps those measurements as points too, whose errors
  correct the calls of batches near them.

Calls are of two alignment classes, with separate data: "aligned" (lda, ldb, ldc multiples of 4
floats and A, B, C 16-byte aligned: vector loads, TMA) and "unaligned" (the scalar or register-fed
paths). An aligned call whose A or B rows are not all 32-byte aligned (a leading dimension or batch
stride of 4 mod 8 floats) is "split": each 128-byte row of a tile spans five 32-byte sectors, not four,
and a TMA member fed at its L2 limit slows by up to 2x (the 2 x 1 cluster members, which share
half their loads, by about 5%). Split calls are predicted by the aligned models times the member's
own split ratio, its measurements at split tuned shapes over its aligned prediction there. The same
arithmetic is emitted as C for the library's dispatcher (codegen), so the .cu and gemmgen.matmul
choose alike.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from ..plan.schedule import dealt_tiles

CLASSES = ("aligned", "unaligned")  # the classes with models of their own
SPLIT = "split"  # aligned, but some rows only 16-byte aligned: the aligned models x the split ratio
FEATURES = ("launch", "main loop (waves x K steps)", "waves", "operand traffic (GB)", "split K pass over C (GB)")
# With fewer measurements than this in a class, only the first two terms are fitted.
FULL_MODEL_POINTS = 8
# Neighbour weights 1 / (1 + d^2 / BANDWIDTH^2), d the distance in (ln M, ln N, ln K); PRIOR is the
# weight of "no correction", which takes over far from every tuned shape.
BANDWIDTH = 0.5
PRIOR = 0.25
# A member's fit weighs each of its measurements by how near the fastest member it was there: fully
# up to COMPETITIVE times the best time, then as (COMPETITIVE / ratio)^FALLOFF. Its model matters
# where it may be chosen; where it is far behind, being predicted slow is enough. On the H100
# databases, leave-one-out over the tf32 library's 53 tuned calls: geometric mean chosen / best
# 1.0845 unweighted, 1.0705 so (fp32's: 1.0597 and 1.0595).
COMPETITIVE = 1.25
FALLOFF = 4.0


def _weight(ratio: float) -> float:
    """The fit's weight of a measurement `ratio` times the fastest member's at its shape."""
    return 1.0 if ratio <= COMPETITIVE else (COMPETITIVE / ratio) ** FALLOFF


def alignment_class(lda: int, ldb: int, ldc: int, pointers: tuple[int, int, int] = (0, 0, 0),
                    strides: tuple[int, int, int] = (0, 0, 0)) -> str:
    """The class of a call: whether every row (of every batch, `strides` floats apart) starts
    16-byte aligned (4 floats), and if so whether A's and B's leading dimensions and strides keep
    their rows 32-byte aligned too (else SPLIT; the pointers are judged to 16 bytes, and C's rows
    not at all: split, its stores cost a TMA member about 7%, its loads up to 2x)."""
    aligned = (lda % 4 == 0 and ldb % 4 == 0 and ldc % 4 == 0 and all(p % 16 == 0 for p in pointers)
               and all(s % 4 == 0 for s in strides))
    if not aligned:
        return "unaligned"
    return "aligned" if all(x % 8 == 0 for x in (lda, ldb, *strides[:2])) else SPLIT


def model_class(klass: str) -> str:
    """The class whose models predict a call of `klass` (a split call: the aligned ones)."""
    return "aligned" if klass == SPLIT else klass


def tight_leading_dimensions(M: int, N: int, K: int, layouts: dict[str, str], pad: int = 0) -> tuple[int, int, int]:
    """lda, ldb, ldc of dense matrices in `layouts`, each `pad` floats longer."""
    lda = (K if layouts["A"] == "row" else M)
    ldb = (N if layouts["B"] == "row" else K)
    ldc = (N if layouts["C"] == "row" else M)
    return max(1, lda) + pad, max(1, ldb) + pad, max(1, ldc) + pad


@dataclass
class MemberShape:
    """What a prediction needs to know of a member: its tiling and how many blocks an SM holds."""

    BM: int
    BN: int
    BK: int
    split: int
    slots_per_sm: int
    stream_k: bool = False  # schedule stream-k: K tiles dealt evenly over the SMs (plan/schedule.py)
    cluster_m: int = 1      # clusters: a launch takes whole clusters of cluster_m x cluster_n tiles
    cluster_n: int = 1
    decode: bool = False    # the decode kernel (plan/decode.py): BM rows per pass, BN columns per block
    decode_products: int = 0  # its tensor path's mma.sync per k step (math tf32: 1, 3xtf32: 3; simt: 0, none)


# The decode member serves calls whose smaller dimension is at most this (more would re-read the big
# operand once per DECODE_ROWS rows): elsewhere its prediction is infinite and it is never timed.
DECODE_ROWS = 16
# Rows of the small operand whose reads from shared memory take as long as reading the big operand
# from HBM, per float of it: 4 bytes at an H100 SM's share of HBM (about 12.8 B/clk) against 4 bytes
# a row at shared memory's 128 B/clk. A decode K tile's cost grows as 1 + rows / this.
DECODE_ROWS_PER_READ = 10
# The decode tensor path (every pass of its members) reads the small operand's rows once per
# 16 columns, not once per column: no per-row term. Its mma.sync take 16 rows (padded) per product at
# about 8 times FFMA's multiply-adds per clock: the work of this many rows per product.
DECODE_TENSOR_WORK_ROWS = 2


def serves(member: MemberShape, M: int, N: int) -> bool:
    """Whether a call of M x N is one the member is built for (all but decode: every call)."""
    return not member.decode or min(M, N) <= DECODE_ROWS


def decode_features(member: MemberShape, M: int, N: int, K: int, sm_count: int, batch: int = 1) -> list[float]:
    """The decode member's terms:
    - launch;
    - its blocks' waves x K tiles, each a sync and a refill of the small operand, and the tile's
      reads of the big operand and of `rows` rows of the small one from shared memory (1 + rows /
      DECODE_ROWS_PER_READ; on the tensor path 1: a read of the rows serves 16 columns). The waves
      here are the blocks over the slots, at least 1, not rounded up: a memory-bound kernel's
      partial last wave reads as fast as a full one (an H100's 3xtf32 member of 32 columns a block,
      one block an SM, took 40.0, 67.5, 86.9 and 110.9 us at 0.97, 1.94, 2.61 and 3.39 waves of
      4096 deep: 11.6 + 29.3 us a wave within 2%; rounded up, 6% off);
    - waves;
    - the bytes of the big operand (read once per pass of BM rows) and of the small one (every block
      reads its batch's), in GB;
    - in the place of the split pass it has none of, its busiest block slot's multiply-adds (waves x
      BN columns x K x rows, in G): at 16 rows a float of the big operand costs 16 of them, and the
      kernel is no longer bound by reading it. On the tensor path, DECODE_TENSOR_WORK_ROWS x
      products in the place of rows."""
    rows, cols = min(M, N), max(M, N)
    blocks = batch * _ceil_div(cols, member.BN)
    passes = _ceil_div(rows, member.BM)
    waves = _ceil_div(blocks, max(1, sm_count * member.slots_per_sm))
    filled = max(1.0, blocks / max(1, sm_count * member.slots_per_sm))
    traffic_gb = 4.0 * K * (batch * cols * passes + blocks * rows) / 1e9
    tensor = member.decode_products > 0  # every pass on the tensor path
    work_rows = DECODE_TENSOR_WORK_ROWS * float(member.decode_products) if tensor else rows
    work_g = float(waves) * member.BN * K * work_rows / 1e9
    per_row = 0.0 if tensor else rows / DECODE_ROWS_PER_READ
    steps = filled * passes * _ceil_div(K, member.BK) * (1.0 + per_row)
    return [1.0, float(steps), float(waves), traffic_gb, work_g]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def features(member: MemberShape, M: int, N: int, K: int, sm_count: int, batch: int = 1) -> list[float]:
    """The model's terms for one call (see the module docstring). A stream-K member's main loop is
    its busiest block's K tiles, its waves the tiles each block finishes, and its last term the
    partial sums of a shared tile, which its finishing block reads one after another. A strided
    batch multiplies the tiles (every batch's are scheduled as one grid) and the traffic. The decode
    member's are decode_features."""
    if member.decode:
        return decode_features(member, M, N, K, sm_count, batch)
    tiles_m = _ceil_div(M, member.BM * member.cluster_m) * member.cluster_m
    tiles_n = _ceil_div(N, member.BN * member.cluster_n) * member.cluster_n
    if member.stream_k:
        tiles, k_tiles = batch * tiles_m * tiles_n, max(1, _ceil_div(K, member.BK))
        blocks = max(1, min(sm_count, tiles * k_tiles))
        dealt = dealt_tiles(tiles, blocks)
        busiest = _ceil_div(tiles - dealt, blocks) * k_tiles + _ceil_div(dealt * k_tiles, blocks)
        operand_gb = 4.0 * batch * (M * K * tiles_n + K * N * tiles_m) / 1e9
        # The block that arrives last at a shared tile reads all its pieces, one after another.
        share = dealt * k_tiles // blocks
        pieces = min(blocks, 1 + _ceil_div(k_tiles - 1, max(share, 1))) if dealt else 1
        partial_gb = 8.0 * member.BM * member.BN * (pieces - 1) / 1e9
        return [1.0, float(busiest), float(_ceil_div(tiles, blocks)), operand_gb, partial_gb]
    blocks = batch * tiles_m * tiles_n * member.split
    waves = _ceil_div(blocks, max(1, sm_count * member.slots_per_sm))
    k_steps = _ceil_div(_ceil_div(K, member.BK), member.split)  # K tiles of one slice
    operand_gb = 4.0 * batch * (M * K * tiles_n + K * N * tiles_m) / 1e9
    split_gb = 8.0 * batch * M * N / 1e9 if member.split > 1 else 0.0
    return [1.0, float(waves * k_steps), float(waves), operand_gb, split_gb]


def _least_squares(X: list[list[float]], y: list[float]) -> list[float] | None:
    """min ||X c - y|| by Householder QR in plain Python floats, sums taken exactly (math.fsum):
    the same bits on every machine, where numpy's lstsq follows the BLAS kernel of the CPU and
    changes a fitted manifest in its last digits. None where the columns are dependent."""
    rows, cols = len(X), len(X[0])
    R = [list(row) for row in X]
    b = list(y)
    for j in range(cols):
        norm = math.sqrt(math.fsum(R[i][j] ** 2 for i in range(j, rows)))
        if norm == 0.0:
            return None
        alpha = -norm if R[j][j] >= 0 else norm
        v = [0.0] * j + [R[j][j] - alpha] + [R[i][j] for i in range(j + 1, rows)]
        vv = math.fsum(x * x for x in v[j:])
        if vv == 0.0:
            continue
        for k in range(j, cols):
            scale = 2 * math.fsum(v[i] * R[i][k] for i in range(j, rows)) / vv
            for i in range(j, rows):
                R[i][k] -= scale * v[i]
        scale = 2 * math.fsum(v[i] * b[i] for i in range(j, rows)) / vv
        for i in range(j, rows):
            b[i] -= scale * v[i]
    biggest = max(abs(R[j][j]) for j in range(cols))
    if any(abs(R[j][j]) <= 1e-12 * biggest for j in range(cols)):
        return None
    coef = [0.0] * cols
    for j in reversed(range(cols)):
        coef[j] = (b[j] - math.fsum(R[j][k] * coef[k] for k in range(j + 1, cols))) / R[j][j]
    return coef


def _nonnegative_least_squares(X: list[list[float]], y: list[float]) -> list[float]:
    """min ||X c - y|| over c >= 0, exactly, by trying every set of active terms (at most 5)."""
    terms = len(X[0])
    best, best_error = [0.0] * terms, math.fsum(v * v for v in y)
    for size in range(1, terms + 1):
        for active in itertools.combinations(range(terms), size):
            coef = _least_squares([[row[j] for j in active] for row in X], y)
            if coef is None or any(c < 0 for c in coef):
                continue
            full = [0.0] * terms
            for j, c in zip(active, coef):
                full[j] = c
            error = math.fsum((math.fsum(c * x for c, x in zip(full, row)) - v) ** 2 for row, v in zip(X, y))
            if error < best_error - 1e-15:
                best, best_error = full, error
    return best


Point = tuple[int, int, int, float, float, float, float, float, int, float, int]


@dataclass
class Model:
    """One member's fitted model in one alignment class, and the tuned shapes it was fitted to or
    corrected by: (M, N, K, measured ms, ln M, ln N, ln K, ln(measured / model), batch, ln batch,
    split) each (batch 1: a single GEMM, which the fit uses; a strided batch's point only corrects;
    split 1: a split call's measurement, which neither fits nor corrects but sets `split_ratio`)."""

    coef: list[float]
    points: list[Point] = field(default_factory=list)
    split_ratio: float = 1.0  # a split call's time over the aligned prediction (at least 1)

    def to_dict(self) -> dict:
        return {"coef": self.coef, "points": [list(p) for p in self.points], "split_ratio": self.split_ratio}

    @classmethod
    def from_dict(cls, data: dict) -> "Model":
        # points of 8 numbers (a manifest from before batched shapes were tuned) are single GEMMs,
        # and of 10 (before split calls) aligned ones
        filled = {8: (1, 0.0, 0), 10: (0,), 11: ()}
        return cls(list(data["coef"]), [(*p, *filled[len(p)]) for p in data["points"]],
                   float(data.get("split_ratio", 1.0)))


def one_tile_up(member: MemberShape, M: int, N: int) -> tuple[int, int]:
    """M and N raised to one tile (BM rows, BN columns): a tile member does the same work below them,
    so its prediction there is its prediction at a whole tile (the decode member's work changes
    with every row: M and N as they are)."""
    if member.decode:
        return M, N
    return max(M, member.BM), max(N, member.BN)


def _point(member: MemberShape, coef: list[float], sm_count: int, batch: int, M: int, N: int, K: int, ms: float,
           split: int) -> Point:
    base = math.fsum(c * f for c, f in zip(coef, features(member, M, N, K, sm_count, batch)))
    ratio = ms / base if base > 0 else 1.0
    return (M, N, K, ms, math.log(M), math.log(N), math.log(K), math.log(ratio), batch, math.log(batch), split)


def fit(member: MemberShape, points: list[tuple[int, int, int, float]], sm_count: int,
        batched: list[tuple[int, int, int, int, float]] = (),
        split: list[tuple[int, int, int, int, float]] = (),
        best: dict[tuple[int, int, int], float] | None = None) -> Model | None:
    """The model of a member from (M, N, K, ms) measurements of single GEMMs in one class, with the
    (batch, M, N, K, ms) of strided batches as points it is corrected by, and of split calls as the
    points its split ratio comes from (the geometric mean of their time over the prediction, at
    least 1); None without two single GEMMs. `best`: the fastest member's ms at each (M, N, K) of the
    class, by which each measurement is weighed (_weight); without it, all weigh the same."""
    points = [p for p in points if p[3] > 0 and min(p[:3]) > 0]
    if len(points) < 2:
        return None
    terms = 5 if len(points) >= FULL_MODEL_POINTS else 2
    X = [[f / ms for f in features(member, M, N, K, sm_count)[:terms]] for M, N, K, ms in points]
    y = [1.0] * len(points)
    if best:  # each row weighed by how near the fastest member the measurement was (_weight)
        y = [math.sqrt(_weight(ms / best.get((M, N, K), ms))) for M, N, K, ms in points]
        X = [[v * w for v in row] for row, w in zip(X, y)]
    coef = [float(c) for c in _nonnegative_least_squares(X, y) + [0.0] * (5 - terms)]
    model = Model(coef)
    for batch, M, N, K, ms in [(1, *p) for p in points] + [p for p in batched if p[4] > 0 and min(p[:4]) > 0]:
        model.points.append(_point(member, coef, sm_count, batch, M, N, K, ms, 0))
    split = [p for p in split if p[4] > 0 and min(p[:4]) > 0]
    logs = [math.log(ms / predict(member, model, M, N, K, sm_count, batch)) for batch, M, N, K, ms in split
            if serves(member, M, N)]
    model.split_ratio = max(1.0, math.exp(math.fsum(logs) / len(logs))) if logs else 1.0
    model.points += [_point(member, coef, sm_count, batch, M, N, K, ms, 1) for batch, M, N, K, ms in split]
    return model


def predict(member: MemberShape, model: Model, M: int, N: int, K: int, sm_count: int, batch: int = 1,
            split: bool = False) -> float:
    """Predicted ms of one call (`batch` strided matrices of M x N x K; `split`: of the SPLIT class):
    the measurement at a tuned shape, else the model corrected by the errors it made at the tuned
    shapes nearby (in log M, log N, log K and log batch), times the split ratio for a split call; M and
    N below one tile predicted as one tile (one_tile_up);
    infinite where the member is not built for the call (`serves`)."""
    if not serves(member, M, N):
        return math.inf
    for pM, pN, pK, ms, *_, pb, _, p_split in model.points:
        if (pM, pN, pK, pb, p_split) == (M, N, K, batch, int(split)):
            return ms
    M, N = one_tile_up(member, M, N)
    scale = model.split_ratio if split else 1.0
    base = sum(c * f for c, f in zip(model.coef, features(member, M, N, K, sm_count, batch))) * scale
    if M <= 0 or N <= 0 or K <= 0 or batch <= 0:
        return base
    q = (math.log(M), math.log(N), math.log(K), math.log(batch))
    weighted, total = 0.0, PRIOR
    for *_, lm, ln, lk, log_ratio, _, lb, p_split in model.points:
        if p_split:
            continue
        d2 = (q[0] - lm) ** 2 + (q[1] - ln) ** 2 + (q[2] - lk) ** 2 + (q[3] - lb) ** 2
        w = 1.0 / (1.0 + d2 / (BANDWIDTH * BANDWIDTH))
        weighted += w * log_ratio
        total += w
    return base * math.exp(weighted / total)


@dataclass
class Candidate:
    """A member as the chooser sees it: its shape, its models per class, and what it can take."""

    shape: MemberShape
    models: dict[str, Model | None]
    beta: bool = True          # takes beta != 0 (epilogue alpha beta)
    needs_sm90a: bool = False  # wgmma kernels run only where sm_90a code exists


def _eligible(c: Candidate, beta_used: bool, sm90a: bool) -> bool:
    return (c.beta or not beta_used) and (sm90a or not c.needs_sm90a)


def vector_call(candidates: list[Candidate], M: int, N: int) -> bool:
    """Whether a call is a matrix-vector product (one row or one column) that a library with an FFMA
    decode member leaves to it: cuBLAS multiplies those in FP32 even in its TF32 mode (an H100 measured
    its error 1.4e-7 there, against TF32's 2.6e-4), and the FFMA decode member, exact FP32, reads the
    matrix at HBM bandwidth; a TF32 tile or tensor-path decode member would have TF32's error for no
    speed. (A decode member without models, as in a relaid library whose layouts it cannot be built in,
    does not count.)"""
    return min(M, N) == 1 and any(ffma_decode(c.shape) and _has_models(c) for c in candidates)


def _has_models(c: Candidate) -> bool:
    return any(model is not None for model in c.models.values())


# cuBLAS FP32 multiplies a call of at most this many rows (M: A's rows, C's) with short sums, as a
# matrix-vector product. An H100 measured its error at 1.2-1.4e-7 at 1 to 8 rows against weights of
# K 3000-4096 (5.8e-7 from 8 rows at 14336 x 4096, 7.6e-7 from 7 at K 14336, 4e-7 at 12 and 16: a
# tile GEMM's), and at 2 to 8 columns (N) 2.6-6.7e-7 (benchmarks/fp32_accuracy.py, a997eba). There
# the fp32 library, whose error must be no larger than cuBLAS FP32's, leaves the call to its FFMA
# decode members (exact FP32, each lane's sums blocked: 1.0-1.3e-7), where its 3xTF32 members had
# 2.1-2.3e-7.
FP32_SHORT_SUM_ROWS = 8


def short_sum_rows(precision: str) -> int:
    """Rows (M) up to which a library of this precision sums as cuBLAS does at those rows (0: none)."""
    return FP32_SHORT_SUM_ROWS if precision == "fp32" else 0


def ffma_decode(member: MemberShape) -> bool:
    """Whether the member is a decode member without a tensor path: FFMA at every row count."""
    return member.decode and member.decode_products == 0


def short_sum_call(candidates: list[Candidate], M: int, N: int, exact_rows: int) -> bool:
    """Whether a call goes only to members with FFMA sums (ffma_decode): M is at most `exact_rows`
    (short_sum_rows of the library's precision) and the library has an FFMA decode member that can run
    (with models: not left out of a relaid library), which takes every row count."""
    return 0 < M <= exact_rows and any(ffma_decode(c.shape) and _has_models(c) for c in candidates)


def decode_call(candidates: list[Candidate], M: int, N: int, cls: str) -> bool:
    """Whether a call goes only to the decode members (decode_shaped): rows 16-byte aligned (the aligned
    models' classes), the library has a decode member with aligned models, and
    - N at most DECODE_ROWS and below M (the decode kernel's mirrored orientation, C^T = B^T A^T).
      The tile members' models rest there on the few tuned calls of N <= 16 (all of 4096 rows) and
      predicted rates past HBM's at wider ones: the tf32 library sent 11008x4x4096 to a 128x128 tile
      predicted at 57 us (0.94 of an H100's peak) that ran at 0.56 of it, where the decode members
      read 0.77 (0.78x cuBLAS TF32; 1.05x with this rule);
    - or M at most DECODE_ONLY_ROWS and below N. Between that and 16 rows the models choose: a split-K
      tile beat every decode member by 19% at 10x9216x3072 (tf32).
    Unaligned rows are left to every member (the decode kernel's scalar loads lost 16% to a tile at
    13x5000x3001)."""
    return decode_shaped(M, N, cls) and any(c.shape.decode and c.models.get("aligned") for c in candidates)


# An aligned call of at most this many rows (M, below N) goes to the decode members alone
# (decode_call). The tf32 library's tile members' models misjudge calls this short: at the held-out
# 5x7000x3000 they sent it to a 64x64 tile predicted at 39 us that ran 54 us (0.83x cuBLAS TF32), where
# the decode members ran 46-47 us (0.97-0.99x; benchmarks/libraries/...-9eacd0e-tf32-candidates.log);
# at every tuned aligned call of 3 to 12 rows the best decode member was 1.5-13% faster than the best
# tile. (At 16 rows a tile can win: 16x8192x4096 by 4%; at 10x9216x3072 a split-K tile by 19%.)
DECODE_ONLY_ROWS = 8


def decode_shaped(M: int, N: int, cls: str) -> bool:
    """The calls decode_call leaves to the decode members where a library has one: rows 16-byte aligned
    (the aligned models' classes), and N at most DECODE_ROWS and below M, or M at most
    DECODE_ONLY_ROWS and below N."""
    return model_class(cls) == "aligned" and (N <= DECODE_ROWS and M > N or M <= DECODE_ONLY_ROWS and N > M)


def best_in_class(candidates: list[Candidate], M: int, N: int, K: int, cls: str, sm_count: int,
                  beta_used: bool, sm90a: bool, batch: int, exact_rows: int = 0) -> tuple[int, float]:
    """The eligible member predicted fastest in one class (SPLIT: by the aligned models), and its
    predicted ms ((-1, inf) where none has a model of that class). A matrix-vector product goes to
    the FFMA decode members (vector_call), and so does a call of M up to `exact_rows` (short_sum_call);
    an aligned call of N up to DECODE_ROWS (and below M) to the decode members (decode_call)."""
    best, best_ms = -1, math.inf
    ffma_only = vector_call(candidates, M, N) or short_sum_call(candidates, M, N, exact_rows)
    decode_only = decode_call(candidates, M, N, cls)
    for index, c in enumerate(candidates):
        model = c.models.get(model_class(cls))
        if model is None or not _eligible(c, beta_used, sm90a) or (ffma_only and not ffma_decode(c.shape)) \
                or (decode_only and not c.shape.decode):
            continue
        ms = predict(c.shape, model, M, N, K, sm_count, batch, cls == SPLIT)
        if ms < best_ms:
            best, best_ms = index, ms
    return best, best_ms


def choose(candidates: list[Candidate], M: int, N: int, K: int, klass: str, sm_count: int, *,
           beta_used: bool = True, sm90a: bool = True, batch: int = 1, exact_rows: int = 0) -> int:
    """Index of the member predicted fastest for the call (`batch` strided matrices of M x N x K)
    among those that can take it (`exact_rows`: the library's short_sum_rows). A class without data
    for any eligible member borrows the other class's models."""
    for cls in (klass, *[c for c in CLASSES if c != model_class(klass)]):
        best, _ = best_in_class(candidates, M, N, K, cls, sm_count, beta_used, sm90a, batch, exact_rows)
        if best >= 0:
            return best
    return next((i for i, c in enumerate(candidates) if _eligible(c, beta_used, sm90a)), 0)


# --- padding: an unaligned call copied into aligned workspace (padding.py) -------------------------
# An unaligned call may copy its operands whose rows are not 16-byte aligned into workspace whose
# rows are, and run there the member the aligned class predicts fastest. A copy moves its floats
# twice (read, write) at PAD_GB_PER_MS, each row at least PAD_ROW_FLOATS wide (a block of the copy
# takes a row), plus PAD_COPY_MS per copy kernel and for the workspace. Measured on an H100
# (benchmarks/padding.py, 32 calls of 255^3 to 4096^3, 73859a7): the copies took within 10% of this
# at every size. A call pads where that is predicted at most PAD_GAIN of the unaligned member's time:
# 1, for the copies' cost is known as well as the members' (in the tf32 library padding also rounds
# A and B to nearest, where the unaligned cp.async member truncates).
PAD_GB_PER_MS = 3.0
PAD_ROW_FLOATS = 256
PAD_COPY_MS = 0.0025
PAD_GAIN = 1.0


def pad_ms(copies: list[tuple[int, int, int]]) -> float:
    """Predicted ms of the padding copies, each (matrices, rows, floats per row)."""
    floats = sum(count * rows * max(cols, PAD_ROW_FLOATS) for count, rows, cols in copies)
    return 8.0 * floats / 1e9 / PAD_GB_PER_MS + PAD_COPY_MS * (len(copies) + 1)


def choose_padded(candidates: list[Candidate], M: int, N: int, K: int, copies: list[tuple[int, int, int]],
                  sm_count: int, *, beta_used: bool = True, sm90a: bool = True, batch: int = 1,
                  padded_class: str = "aligned", exact_rows: int = 0) -> int:
    """For an unaligned call whose padding copies are `copies` (pad_ms's): the aligned member to run
    on padded operands (whose class is `padded_class`: SPLIT where an operand not copied has rows
    only 16-byte aligned) where padding pays (PAD_GAIN), else -1 (the unaligned class's member runs
    as it is)."""
    if K <= 0 or not copies:
        return -1
    aligned, aligned_ms = best_in_class(candidates, M, N, K, padded_class, sm_count, beta_used, sm90a, batch,
                                        exact_rows)
    unaligned, unaligned_ms = best_in_class(candidates, M, N, K, "unaligned", sm_count, beta_used, sm90a, batch,
                                            exact_rows)
    if aligned < 0 or unaligned < 0:
        return -1
    return aligned if aligned_ms + pad_ms(copies) <= PAD_GAIN * unaligned_ms else -1


def measured_key(key: tuple) -> tuple:
    """(M, N, K, class, batch) of a measurement's key: (M, N, K, class), or with the batch after."""
    return (*key, 1) if len(key) == 4 else tuple(key)


def fit_all(shapes: list[MemberShape], measurements: list[dict[tuple, float]],
            sm_count: int) -> list[dict[str, Model | None]]:
    """Models of every member per class from {(M, N, K, class[, batch]): ms} (the aligned model
    takes the split measurements for its split ratio)."""
    bests: dict[str, dict[tuple[int, int, int], float]] = {cls: {} for cls in CLASSES}
    for measured in measurements:
        for key, ms in measured.items():
            M, N, K, c, b = measured_key(key)
            if c in bests and b == 1 and ms > 0:
                here = bests[c]
                here[(M, N, K)] = min(here.get((M, N, K), ms), ms)
    result = []
    for shape, measured in zip(shapes, measurements):
        keyed = [(measured_key(key), ms) for key, ms in measured.items()]
        split = [(b, M, N, K, ms) for (M, N, K, c, b), ms in keyed if c == SPLIT]
        result.append({cls: fit(shape, [(M, N, K, ms) for (M, N, K, c, b), ms in keyed if c == cls and b == 1],
                                sm_count, [(b, M, N, K, ms) for (M, N, K, c, b), ms in keyed if c == cls and b != 1],
                                split if cls == "aligned" else (), bests[cls])
                       for cls in CLASSES})
    return result


@dataclass
class LeaveOneOut:
    """For each tuned shape: the time of the member chosen without its measurements, over the best
    measured one there (1.0 = the best was chosen)."""

    ratios: dict[tuple, float]  # (M, N, K, class[, batch]) -> ratio

    @property
    def median(self) -> float:
        return float(np.median(list(self.ratios.values()))) if self.ratios else 1.0

    @property
    def worst(self) -> float:
        return max(self.ratios.values(), default=1.0)


def leave_one_out(shapes: list[MemberShape], measurements: list[dict[tuple, float]],
                  sm_count: int, flags: list[tuple[bool, bool]] | None = None, exact_rows: int = 0) -> LeaveOneOut:
    """Choose at each tuned shape with that shape's measurements left out of every model (`exact_rows`:
    the library's short_sum_rows)."""
    flags = flags or [(True, False)] * len(shapes)
    keys = sorted({key for measured in measurements for key in measured}, key=measured_key)
    ratios = {}
    for key in keys:
        M, N, K, cls, batch = measured_key(key)
        measured_here = [m.get(key) for m in measurements]
        models = fit_all(shapes, [{k: v for k, v in m.items() if k != key} for m in measurements], sm_count)
        candidates = [Candidate(s, models[i], beta=flags[i][0], needs_sm90a=flags[i][1])
                      for i, s in enumerate(shapes)]
        # the best of the members the choice may take here (few rows in the fp32 library: FFMA sums;
        # an aligned call of few columns: decode members)
        ffma_only = short_sum_call(candidates, M, N, exact_rows)
        decode_only = decode_call(candidates, M, N, cls)
        known = [ms for i, ms in enumerate(measured_here)
                 if ms and (not ffma_only or ffma_decode(shapes[i])) and (not decode_only or shapes[i].decode)]
        if not known:
            continue
        # Only members measured here can be judged (the rest are eligible but have no time to compare).
        chosen = choose([c if measured_here[i] else Candidate(c.shape, {}) for i, c in enumerate(candidates)],
                        M, N, K, cls, sm_count, batch=batch, exact_rows=exact_rows)
        ratios[key] = measured_here[chosen] / min(known) if measured_here[chosen] else math.inf
    return LeaveOneOut(ratios)
