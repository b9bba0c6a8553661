"""What the parts add to a kernel's launch, described once for the C launchers (the templates) and
for gemmgen/launch.py's `decide` (the Python runtime):

- the kernels' parameters (Parameter: name and kind, its C declaration, launcher type and argument),
  the main kernel's from its mainloop (MAIN, TMA_MAIN) and the parts' additions after them
  (a staged TMA epilogue's map of C, stream-K's workspace);
- the kernels a part launches beside the main one (Helper: split K's pass over C, the min-reduce's
  clear and finish), with their grids in Python and in C;
- the tensor maps a TMA kernel's call encodes (TensorMapSpec).
The schedule's own grid (C statements beside the Python arithmetic) is parts/schedule.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# kind -> (C type in the kernel's declaration, its type in the launcher, how the launcher passes a
# local of that name: a map on a line of its own)
_C = {"t": ("const __grid_constant__ TensorMap", "TensorMap", ",\n        *reinterpret_cast<const TensorMap*>(&{})"),
      "p": ("float* __restrict__", "float*", ", {}"), "i": ("int", "int", ", {}"),
      "l": ("long long", "long long", ", {}"),
      "v": ("const float* __restrict__", "const float*", ", {}")}


class Parameter(NamedTuple):
    """A kernel parameter: `kind` as gemmgen/launch.py's KINDS (i: int, l: long long, f: float,
    p: a pointer, v: a pointer to a vector the kernel reads (bias, scale), t: a CUtensorMap). A
    signature is a tuple of them, (name, kind) pairs."""

    name: str
    kind: str

    @property
    def declaration(self) -> str:
        return f"{_C[self.kind][0]} {self.name}"

    @property
    def type(self) -> str:
        return _C[self.kind][1]

    @property
    def passed(self) -> str:
        """The launcher's argument, with the comma before it."""
        return _C[self.kind][2].format(self.name)


def signature(*pairs: tuple[str, str]) -> tuple[Parameter, ...]:
    return tuple(Parameter(name, kind) for name, kind in pairs)


# The kernels' parameter lists (templates: tiled/naive/wgmma_async kernels, split_k.cuh, reduce_min.cuh,
# wgmma_kernel.cu): (name, kind) in order. Every main kernel multiplies strided batches (BATCH, last,
# named as the C ABI names them): `batch` of them, batch b's A, B and C at A + b * strideA, ... (in
# floats; a stride of 0 shares the operand); the single GEMM is the launch of one batch.
BATCH = signature(("batch", "i"), ("strideA", "l"), ("strideB", "l"), ("strideC", "l"))
MAIN = signature(("M", "i"), ("N", "i"), ("K", "i"), ("alpha", "f"), ("A", "p"), ("lda", "i"), ("B", "p"),
                 ("ldb", "i"), ("beta", "f"), ("C", "p"), ("ldc", "i"))
TMA_MAIN = signature(("map_a", "t"), ("map_b", "t"), ("M", "i"), ("N", "i"), ("K", "i"), ("alpha", "f"),
                     ("beta", "f"), ("C", "p"), ("ldc", "i"))
SCALE_C = signature(("M", "i"), ("N", "i"), ("beta", "f"), ("C", "p"), ("ldc", "i"), ("batch", "i"),
                    ("strideC", "l"))
REDUCE_CLEAR: tuple[Parameter, ...] = ()
REDUCE_FINISH = signature(("values", "p"), ("rows", "p"), ("cols", "p"), ("N", "i"))

# What the C launcher passes for a parameter, where its local has another name than the kernel's.
_LAUNCHER_LOCALS = {"values": "smallest_values", "rows": "smallest_rows", "cols": "smallest_cols"}


@dataclass(frozen=True)
class Helper:
    """A kernel gemmgen_NAME_<kernel> that a part launches before (or after) the main one, with a
    grid of one block, or (spread) one per 256 floats of C (of every batch) up to 4096, in C `c_grid`."""

    kernel: str
    params: tuple[Parameter, ...]
    threads: int
    before: bool = True       # launched before the main kernel (else after it)
    empty_too: bool = False   # launched for an empty C (M or N = 0) too
    spread: bool = False

    def runs(self, when: str) -> bool:
        """Whether it runs "before" or "after" the main kernel, or for an "empty" C."""
        return {"before": self.before, "after": not self.before, "empty": self.empty_too}[when]

    def grid(self, M: int, N: int, batch: int = 1) -> tuple[int, int]:
        return (min(M * N * batch // 256 + 1, 4096) if self.spread else 1), 1

    @property
    def c_setup(self) -> tuple[str, ...]:
        """C statements the launcher runs before the launch: grid(M, N, batch)'s x where spread."""
        if not self.spread:
            return ()
        return ("const long long elements = (long long)M * N * batch;",
                "const unsigned scale_blocks = (unsigned)(elements / 256 + 1 < 4096 ? elements / 256 + 1 : 4096);")

    @property
    def c_grid(self) -> str:
        """C expression of grid(M, N)'s x (after c_setup)."""
        return "scale_blocks" if self.spread else "1"

    @property
    def c_arguments(self) -> str:
        return ", ".join(_LAUNCHER_LOCALS.get(p.name, p.name) for p in self.params)


@dataclass(frozen=True)
class TensorMapSpec:
    """A tensor map a call encodes for one operand: where it goes, whose address it describes, and
    the rest of its key (dims, row stride, box, swizzle, L2 promotion), fixed by the call key. A map
    is 3-D: (inner, outer, batches), the batches `batch_stride` floats apart; one matrix (a stride
    of 0, or one batch) is a batch dimension of 1, stepped over by its own extent."""

    param: str
    operand: str      # "A", "B" or "C"
    inner: int
    outer: int
    ld: int
    box_inner: int
    box_outer: int
    swizzle: int      # bytes: 32, 64 or 128
    promote: int      # L2 promotion in bytes (0: none), 256 only where every row starts 128-byte aligned
    batches: int = 1
    batch_stride: int = 0
    tf32: bool = False  # elements of type TFLOAT32: TMA rounds each float to nearest TF32 as it copies it

    def promotion(self, address: int) -> int:
        """The L2 promotion (bytes) the map of a tensor at `address` gets: `promote`, but 128 for 256
        where a row (of any batch) starts off a 128-byte boundary (the C launcher decides alike)."""
        if self.promote == 256 and (address % 128 or self.ld % 32 or (self.batches > 1 and self.batch_stride % 32)):
            return 128
        return self.promote

    @property
    def batch_dims(self) -> tuple[int, int]:
        """(size, stride in floats) of the batch dimension, as the C launcher encodes it."""
        if self.batches > 1 and self.batch_stride:
            return self.batches, self.batch_stride
        return 1, self.outer * self.ld
