"""Padding: an unaligned library call run by an aligned member on copies of its operands.

A call whose rows are not 16-byte aligned (an odd leading dimension, a pointer off 16 bytes, an odd
batch stride) cannot be read by TMA or float4 loads; the library's unaligned class serves it with
scalar or register-fed loads, at about half the speed. Copying each unaligned operand into workspace
whose rows are aligned (gpu/pad.py: rows ld' = cols rounded up to 32 floats, 128 bytes: rows only
16-byte aligned would make the call SPLIT, up to 2x slower on a TMA member) costs two passes over
its floats; for most calls above a few hundred microseconds that is far less than what the aligned
member saves. selection.choose_padded decides per call; C, if unaligned, is computed in workspace
and copied back. In the tf32 library the copies round A and B to nearest TF32, as cuBLAS TF32 does,
so that the tensor cores' truncation drops nothing.

The same decision and copies are a library .cu's (templates/library.cu.j2, from `c_rows` here and
selection's arithmetic in C). Workspace comes from a stream-ordered pool that keeps its memory; a
call made during a CUDA graph capture, or one the GPU has no memory left for, runs its unaligned
member instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..gpu import pad as gpu_pad
from .selection import PAD_COPY_MS, PAD_GAIN, PAD_GB_PER_MS, PAD_ROW_FLOATS

# Floats a workspace part is rounded up to (128 bytes: TMA's and float4's alignment, with room).
PART_FLOATS = 32


def rule(precision: str) -> str:
    """When a library of `precision` pads, in words (gemmgen explain)."""
    rounding = "; the copies round A and B to nearest TF32" if precision == "tf32" else ""
    return (f"an unaligned call copies its unaligned operands into aligned workspace and runs the aligned "
            f"member there where that member and the copies (each float read and written at {PAD_GB_PER_MS:g} "
            f"TB/s, rows of at least {PAD_ROW_FLOATS} floats, {PAD_COPY_MS * 1e3:g} us a copy) are predicted to "
            f"take at most {PAD_GAIN:g} times the unaligned member's time{rounding}")


def operand_aligned(ld: int, pointer: int, stride: int) -> bool:
    """Whether every row of an operand (of every batch) starts 16-byte aligned."""
    return ld % 4 == 0 and pointer % 16 == 0 and stride % 4 == 0


def stored_rows(layout: str, rows: int, cols: int) -> tuple[int, int]:
    """(stored rows, floats per stored row) of a rows x cols matrix in `layout`."""
    return (rows, cols) if layout == "row" else (cols, rows)


def c_rows(layouts: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Per operand, its stored rows and floats per row as C expressions of M, N, K (library.cu.j2)."""
    dims = {"A": ("M", "K"), "B": ("K", "N"), "C": ("M", "N")}
    return {name: stored_rows(layouts[name], *dims[name]) for name in "ABC"}


def padded_ld(cols: int) -> int:
    """A copy's leading dimension: whole 128-byte rows (the TMA members' K tile, and a row of L2)."""
    return max(PART_FLOATS, -(-cols // PART_FLOATS) * PART_FLOATS)


@dataclass(frozen=True)
class Part:
    """One operand's copy: `count` matrices of rows x cols, read ld and stride apart, written ld'
    and stride' apart at `offset` floats into the workspace."""

    name: str
    rows: int
    cols: int
    count: int
    ld: int
    stride: int
    new_ld: int
    new_stride: int
    offset: int

    @property
    def floats(self) -> int:
        return self.count * self.rows * self.new_ld


@dataclass(frozen=True)
class Padding:
    """The copies of one call key: its padded parts (A, B, C as needed), workspace floats, and the
    leading dimensions and batch strides the aligned member is called with."""

    parts: tuple[Part, ...]
    floats: int
    lds: tuple[int, int, int]
    strides: tuple[int, int, int]

    def copies(self, beta_used: bool) -> list[tuple[int, int, int]]:
        """selection.pad_ms's (matrices, rows, floats per row) of every copy kernel the call runs."""
        out = []
        for part in self.parts:
            out.append((part.count, part.rows, part.cols))
            if part.name == "C" and beta_used:
                out.append((part.count, part.rows, part.cols))  # C in, then C back out
        return out


def padding(layouts: dict[str, str], M: int, N: int, K: int, lds: tuple[int, int, int],
            residues: tuple[int, int, int], batch: int, strides: tuple[int, int, int]) -> Padding | None:
    """The copies that make a call's rows aligned, or None for a call that needs none (or has no
    K to read: then A and B are not read at all)."""
    if K <= 0 or M <= 0 or N <= 0 or batch <= 0:
        return None
    dims = {"A": (M, K), "B": (K, N), "C": (M, N)}
    parts, offset = [], 0
    new_lds, new_strides = list(lds), [s if batch > 1 else 0 for s in strides]
    for i, name in enumerate("ABC"):
        if operand_aligned(lds[i], residues[i], strides[i]):
            continue
        rows, cols = stored_rows(layouts[name], *dims[name])
        count = batch if batch > 1 and strides[i] != 0 else 1
        ld = padded_ld(cols)
        new_stride = rows * ld if count > 1 else 0
        part = Part(name, rows, cols, count, lds[i], strides[i] if count > 1 else 0, ld, new_stride, offset)
        parts.append(part)
        offset += -(-part.floats // PART_FLOATS) * PART_FLOATS
        new_lds[i], new_strides[i] = ld, new_stride
    if not parts:
        return None
    return Padding(tuple(parts), offset, tuple(new_lds), tuple(new_strides))


class PaddedLaunch:
    """A call key's padded launch: `__call__(A, B, C, alpha, beta, stream)` as a PreparedLaunch's.
    Takes workspace, copies the unaligned operands in (rounded to TF32 for `round_tf32`), runs
    `aligned` (the PreparedLaunch of the library's member `member` on the padded operands) and
    copies C back; runs `fallback` (the unaligned member's) where no workspace may be taken."""

    __slots__ = ("padding", "member", "aligned", "fallback", "device", "round_tf32")

    def __init__(self, padding_: Padding, member: int, aligned, fallback, device: int, round_tf32: bool):
        self.padding, self.member, self.aligned, self.fallback = padding_, member, aligned, fallback
        self.device, self.round_tf32 = device, round_tf32

    def pads_at(self, stream: int) -> bool:
        """Whether a call on `stream` pads now (not while it captures a graph)."""
        return not gpu_pad.capturing(stream)

    def __call__(self, A: int, B: int, C: int, alpha: float, beta: float, stream: int, *rest) -> None:
        with gpu_pad.current(self.device):
            workspace = gpu_pad.allocate(self.device, stream, 4 * self.padding.floats) if self.pads_at(stream) else 0
            if not workspace:
                self.fallback(A, B, C, alpha, beta, stream)
                return
            try:
                self._run(workspace, [A, B, C], alpha, beta, stream)
            finally:
                gpu_pad.free(workspace, stream)

    def _run(self, workspace: int, pointers: list[int], alpha: float, beta: float, stream: int) -> None:
        original = list(pointers)
        for part in self.padding.parts:
            at = workspace + 4 * part.offset
            index = "ABC".index(part.name)
            if part.name != "C" or beta != 0.0:
                gpu_pad.pad(original[index], part.rows, part.cols, part.ld, part.stride, at, part.new_ld,
                            part.new_stride, part.count, self.device, stream,
                            round_tf32=self.round_tf32 and part.name != "C")
            pointers[index] = at
        self.aligned(pointers[0], pointers[1], pointers[2], alpha, beta, stream)
        for part in self.padding.parts:
            if part.name == "C":
                gpu_pad.pad(pointers[2], part.rows, part.cols, part.new_ld, part.new_stride, original[2], part.ld,
                            part.stride, part.count, self.device, stream)
