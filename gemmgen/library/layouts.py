"""Which library serves a call, from how its operands lie in memory (pure decisions, no GPU).

A library multiplies C (row-major) = A B with A and B in one fixed pair of layouts, its operand
class. Four classes cover every layout of A, B and C without a copy: a column-major C is the
row-major C^T = B^T A^T, so the call runs with A and B swapped, each transposed (a transposed
row-major matrix is a column-major one, and back).

    class (A, B)   library         K contiguous in
    row, col       fp32 / tf32     A and B (TMA-fed wgmma)
    row, row       <precision>_rr  A
    col, col       <precision>_cc  B
    col, row       <precision>_cr  neither

A matrix can be read row-major when its elements along a row are adjacent (column stride 1), with
the row stride as leading dimension, and column-major likewise; a single row or column reads
either way. One with no unit stride (a strided slice, a broadcast) reads neither way and is copied,
as is an operand whose class has no library: `route` picks the way with fewest copies and says
why it copies.

Only the base class ships as a manifest. wgmma reads TF32 operands from shared memory K-major
only, and the kernels that transpose on the way (wgmma fed through registers, `stages N async`)
measured 0.27x (tf32) and 0.56x (fp32) of the TMA-fed ones at 4096^3 on an H100: slower than
copying the operand K-major first (one pass over it, 2-15% at 4096^3 and 2048x8192x2048).

RELAID lists the classes a precision serves in the kernel from its base library: the same members,
chosen by the same timings, built in the class's layouts. The TMA kernels of both precisions read a
column-major A from its MN-major tile into registers and issue wgmma with A from registers (3xTF32
splits it there anyway; tf32 takes it as it lies), at 1.00-1.02x (fp32, benchmarks/mn_major.py) and
0.97-1.01x (tf32) of their A row speed on an H100. A member that cannot be built so (clusters, the
decode member, 128-row ping-pong tiles in tf32) or would read the class's layout far slower than its
timings say (the cp.async member's 4-byte copies: Mainloop.slow_layouts) is never chosen there. A
row-major B the 3xTF32 kernels transpose in shared memory at 0.72-0.75x, which is slower than copying
it, and tf32 cannot read it at all (wgmma takes TF32 B K-major), so the classes with a row-major B are
not served that way. A relaid class may also write C column-major (A, B, C): A row, B row into a
row-major C is then C^T = B^T A^T with both operands column-major, no copy. A manifest named for a
class is used where it exists.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYOUTS = ("row", "col")
RELAID = {"fp32": (("col", "col"), ("col", "col", "col")), "tf32": (("col", "col"), ("col", "col", "col"))}
CLASSES = (("row", "col"), ("row", "row"), ("col", "col"), ("col", "row"))
SUFFIX = {("row", "col"): "", ("row", "row"): "_rr", ("col", "col"): "_cc", ("col", "row"): "_cr"}


def library_name(precision: str, klass: tuple[str, ...]) -> str:
    """The library of a precision for an operand class: fp32, fp32_rr, fp32_cc, fp32_cr (tf32 alike),
    and for a relaid class writing C column-major, fp32_cc_ccol."""
    return precision + SUFFIX[klass[:2]] + ("_ccol" if c_layout_of(klass) == "col" else "")


def flip(layout: str) -> str:
    return "col" if layout == "row" else "row"


def readings(rows: int, cols: int, row_stride: int, col_stride: int) -> dict[str, int]:
    """Each layout ("row", "col") a rows x cols matrix with these element strides can be read in,
    with its leading dimension: row-major where elements of a row are adjacent and rows are ld >=
    cols apart (column-major: transposed). A single row or column reads either way."""
    found = {}
    if col_stride == 1 or cols <= 1:
        ld = row_stride if rows > 1 else max(1, cols)
        if ld >= max(1, cols):
            found["row"] = ld
    if row_stride == 1 or rows <= 1:
        ld = col_stride if cols > 1 else max(1, rows)
        if ld >= max(1, rows):
            found["col"] = ld
    return found


def transposed(reading: dict[str, int]) -> dict[str, int]:
    """The readings of a matrix's transpose: the same memory, each layout the other."""
    return {flip(layout): ld for layout, ld in reading.items()}


@dataclass(frozen=True)
class Operand:
    """What routing needs of an operand: its shape, its readings, and its name in messages."""

    name: str
    rows: int
    cols: int
    strides: tuple[int, int]

    @property
    def reading(self) -> dict[str, int]:
        return readings(self.rows, self.cols, *self.strides)

    @property
    def size(self) -> int:
        return self.rows * self.cols

    def describe(self) -> str:
        return f"{self.name} of shape ({self.rows}, {self.cols}) with strides {tuple(self.strides)}"


@dataclass(frozen=True)
class Route:
    """How a call runs: the library class, whether A and B swap places (C column-major: the
    library computes C^T = B^T A^T), the leading dimensions the library gets (of its A, B and C),
    the layout each of A and B must first be copied into (None: read as it lies) and whether C
    is computed into a row-major copy and copied back; `reasons` says why each copy is made."""

    klass: tuple[str, str]
    swap: bool
    lds: tuple[int, int, int]
    copy_a: str | None = None
    copy_b: str | None = None
    copy_c: bool = False
    reasons: tuple[str, ...] = ()

    @property
    def copies(self) -> bool:
        return bool(self.copy_a or self.copy_b or self.copy_c)


def c_layout_of(klass: tuple[str, ...]) -> str:
    """The layout a class's library writes C in: (A, B) classes write it row-major; a relaid
    (A, B, C) class names its own."""
    return klass[2] if len(klass) > 2 else "row"


def route(a: Operand, b: Operand, c: Operand, available: frozenset | set, precision: str = "fp32") -> Route:
    """The way to run C = A B with the fewest copies over the classes whose libraries are built
    (`available`; the base class must be among them), then the fewest elements copied. Among ways
    without a copy the base class (TMA-fed, the best tuned) comes first, then the way whose library
    call has no more rows than columns, then C as it is (no swap). A library writing C in layout L
    serves C read as L (C = A B), or C read the other way (C^T = B^T A^T, A and B swapped).

    Rows before columns: a vector C reads either way, so a matrix times a column vector (M x 1) can
    run as the row vector times the matrix's transpose (1 x M), which the libraries' decode members
    serve (they take up to 16 rows, streaming the big operand once); their tile members, given one
    column, read it as a 64- to 256-column tile."""
    if ("row", "col") not in available:
        raise ValueError(f"the {precision} library (class A row, B col) must be available")
    c_reading = c.reading
    a_reading, b_reading = a.reading, b.reading
    classes = [k for k in CLASSES if k in available] + sorted(k for k in available if k not in CLASSES)
    best = None
    for rank, klass in enumerate(classes):
        library_c = c_layout_of(klass)
        options = [(swap, c_reading[layout], False) for swap, layout in ((False, library_c), (True, flip(library_c)))
                   if layout in c_reading]
        if not c_reading and library_c == "row":  # C has no unit stride: computed row-major into a copy
            options = [(False, max(1, c.cols), True)]
        for swap, ldc, copy_c in options:
            # The library's operands: (A, B), or with C^T (B^T, A^T).
            first, second = (transposed(b_reading), transposed(a_reading)) if swap else (a_reading, b_reading)
            copies = (klass[0] not in first) + (klass[1] not in second) + copy_c
            # Among ways with as many copies, the one copying the fewest elements (A is M x K, B K x N).
            copied = ((klass[0] not in first) * (b if swap else a).size
                      + (klass[1] not in second) * (a if swap else b).size)
            rows, cols = (b.cols, a.rows) if swap else (a.rows, b.cols)  # the library's M and N
            score = (copies, copied, rank, rows > cols, swap)
            if best is None or score < best[0]:
                best = (score, klass, swap, first, second, ldc, copy_c)
    _, klass, swap, first, second, ldc, copy_c = best
    # The layout each original operand is read in (the library's layout, transposed back if swapped).
    need_a, need_b = (flip(klass[1]), flip(klass[0])) if swap else klass[:2]
    copy_a = None if need_a in a_reading else need_a
    copy_b = None if need_b in b_reading else need_b
    reasons = []
    for operand, reading, copy in ((a, a_reading, copy_a), (b, b_reading, copy_b)):
        if copy is None:
            continue
        if not reading:
            reasons.append(f"{operand.describe()} has no unit stride; copying it")
        else:
            reasons.append(f"{operand.describe()} is {' or '.join(sorted(reading))}-major; gemmgen's {precision} "
                           f"kernels read it {copy}-major in this call (K contiguous), so it is copied "
                           f"{copy}-major first (one pass over it)")
    if copy_c:
        reasons.append(f"{c.describe()} has no unit stride; computing into a row-major copy and copying it back")
    lda = second_ld = 0
    if not swap:
        lda = a_reading.get(klass[0], _tight(klass[0], a.rows, a.cols))
        second_ld = b_reading.get(klass[1], _tight(klass[1], b.rows, b.cols))
    else:
        lda = first.get(klass[0], _tight(klass[0], b.cols, b.rows))
        second_ld = second.get(klass[1], _tight(klass[1], a.cols, a.rows))
    return Route(klass, swap, (lda, second_ld, ldc), copy_a, copy_b, copy_c, tuple(reasons))


def _tight(layout: str, rows: int, cols: int) -> int:
    """The leading dimension of a dense copy in `layout`."""
    return max(1, cols if layout == "row" else rows)
