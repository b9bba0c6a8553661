"""How a batched call's leading dimensions map onto one strided-batched launch (pure decisions).

gemmgen.matmul takes A (..., M, K) and B (..., K, N) with leading dimensions that broadcast as
torch.matmul's do, and writes C (..., M, N). A launch multiplies `batch` matrices whose starts lie
a fixed stride apart in each operand (stride 0: one matrix serves every batch). So the leading
dimensions, broadcast to their common shape, are flattened into one count, and each operand's
batch stride is the one step that walks them all:

- an operand broadcast over every leading dimension (2-D, sizes 1 or strides 0) has stride 0;
- one whose leading strides chain (each the next one's times the next size, as in any contiguous
  or sliced-along-rows tensor) has the innermost one;
- any other (broadcast over some leading dimensions only, or permuted) has none, and is copied
  dense first.

When B serves every batch and A's batches lie one after another at its row stride (A (..., M, K)
row-major and contiguous over its leading dimensions, an nn.Linear input), the call is one GEMM of
batch x M rows: it needs no batched launch at all, and the library chooses for its real shape.

Vectors (`vector_views`): a 1-D A is a row (1 x K) and a 1-D B a column (K x 1), as numpy.matmul
takes them, through views that add the dimension, which the result then drops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class BatchError(ValueError):
    """Leading dimensions that do not broadcast."""


@dataclass(frozen=True)
class Batching:
    """The launch of a batched call: the common leading shape, the batch count, each operand's
    batch stride in elements (None: not one stride; copy it dense), and whether A's rows fold
    (the call is one GEMM of batch x M rows)."""

    lead: tuple[int, ...]
    batch: int
    strides: dict[str, int | None]
    fold: bool = False


def broadcast(*leads: tuple[int, ...]) -> tuple[int, ...]:
    """The common shape of leading dimensions, as torch.broadcast_shapes finds it."""
    width = max((len(lead) for lead in leads), default=0)
    shape = []
    for i in range(width):
        sizes = {lead[i - width + len(lead)] for lead in leads if i - width + len(lead) >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise BatchError("batch dimensions do not broadcast: " + " and ".join(str(tuple(lead)) for lead in leads))
        shape.append(sizes.pop() if sizes else 1)
    return tuple(shape)


def batch_stride(shape: tuple[int, ...], strides: tuple[int, ...], lead: tuple[int, ...]) -> int | None:
    """The one stride that walks an operand's matrices over the broadcast `lead` (its own leading
    `shape` and `strides`, right-aligned to it), or None where no single stride does."""
    own = [0] * (len(lead) - len(shape)) + [0 if n == 1 else s for n, s in zip(shape, strides)]
    steps = [(n, s) for n, s in zip(lead, own) if n != 1]
    if all(s == 0 for _, s in steps):
        return 0
    for (_, outer), (n, inner) in zip(steps, steps[1:]):
        if outer != inner * n:
            return None
    return steps[-1][1] if steps[-1][1] > 0 else None  # batches walked backwards (a flipped view): copied


def plan_batches(a_shape, a_strides, b_shape, b_strides, c_shape=None, c_strides=None) -> Batching:
    """The Batching of A (..., M, K) times B (..., K, N) into C (..., M, N): shapes and strides in
    elements, C's None for an output still to be made (dense, row-major)."""
    lead = broadcast(tuple(a_shape[:-2]), tuple(b_shape[:-2]))
    M, K = a_shape[-2], a_shape[-1]
    N = b_shape[-1]
    strides = {"A": batch_stride(tuple(a_shape[:-2]), tuple(a_strides[:-2]), lead),
               "B": batch_stride(tuple(b_shape[:-2]), tuple(b_strides[:-2]), lead)}
    if c_shape is None:
        strides["C"] = M * N
        c_row, c_col, c_rows_apart = N, 1, True
    else:
        if tuple(c_shape[:-2]) != lead:
            raise BatchError(f"out's batch dimensions {tuple(c_shape[:-2])} must be {lead}, the broadcast of "
                             f"A's {tuple(a_shape[:-2])} and B's {tuple(b_shape[:-2])}")
        strides["C"] = batch_stride(tuple(c_shape[:-2]), tuple(c_strides[:-2]), lead)
        if strides["C"] == 0 and math.prod(lead) > 1:
            raise BatchError(f"out's {math.prod(lead)} batches share one matrix (batch stride 0): each batch needs "
                             "its own C")
        c_row, c_col = c_strides[-2], c_strides[-1]
        c_rows_apart = c_col == 1 or N <= 1
    batch = math.prod(lead)
    a_row, a_col = a_strides[-2], a_strides[-1]
    fold = (batch > 1 and strides["B"] == 0 and strides["A"] is not None and strides["C"] is not None
            and (a_col == 1 or K <= 1) and c_rows_apart
            and _rows_follow(M, a_row, strides["A"]) and _rows_follow(M, c_row, strides["C"]))
    return Batching(lead, batch, strides, fold)


def _rows_follow(M: int, row_stride: int, batch_stride: int) -> bool:
    """Whether the rows of consecutive batches lie one row stride apart throughout (the batches'
    rows are then the rows of one taller matrix, whose row stride is folded_row_stride's)."""
    return batch_stride == M * row_stride or (M == 1 and batch_stride > 0)


def folded_row_stride(M: int, row_stride: int, batch_stride: int) -> int:
    """The row stride of the taller matrix a fold makes (a batch of single rows: the batch stride)."""
    return row_stride if M > 1 else batch_stride


def dense_reason(name: str) -> str:
    """Why an operand whose batches no single stride walks is copied (the warning's words)."""
    if name == "C":
        return "out's batches lie at no single stride; computing into a dense copy and copying it back"
    return f"{name}'s batches lie at no single stride (broadcast over some batch dimensions, or permuted); copying it"


def vector_views(A, B, out):
    """(A, B, out, finish) for a call with a 1-D A or B: views with the row's or column's dimension
    added (PyTorch and CuPy index with None), and finish(result), the result without it. BatchError
    for a 0-D operand, or an array that gives no such view."""
    def viewed(x, index, name):
        try:
            return x[index]
        except (TypeError, IndexError, ValueError):
            raise BatchError(f"{name} ({type(x).__name__}) gives no view with a dimension added; a 1-D "
                             f"{name} needs a PyTorch tensor or a CuPy array") from None
    a_dims, b_dims = getattr(A, "ndim", 2), getattr(B, "ndim", 2)
    if a_dims == 0 or b_dims == 0:
        raise BatchError(f"A and B must be vectors, matrices or batches of matrices, not of shapes "
                         f"{tuple(A.shape)} and {tuple(B.shape)}")
    row, column = a_dims == 1, b_dims == 1
    if out is not None:
        out = viewed(out, (Ellipsis, None), "out") if column else out
        out = viewed(out, (Ellipsis, None, slice(None)), "out") if row else out

    def finish(result):
        result = result[..., 0, :] if row else result
        return result[..., 0] if column else result
    return (viewed(A, (None, slice(None)), "A") if row else A, viewed(B, (slice(None), None), "B") if column else B,
            out, finish)
