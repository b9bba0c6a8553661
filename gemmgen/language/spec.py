"""What a spec is: its settings, each with a default and the domain of its values (SETTINGS), and
the typed objects a spec file gives, Spec (a kernel or a search space), LibrarySpec and ParsedFile.
syntax.py parses text into them and load.py reads files and merges parents (entry points: load.py).

A Spec maps setting keys ("block.m", "load.A.vector", ...) to Params: the candidate values
written in the spec (one value, or several for a search set) and where they were written.
Whether the values can work together is the Plan's question (gemmgen.plan); the language checks
only that each value is one it allows.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

from .errors import Span, SpecError
from .shapes import LibraryShape

TARGETS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a")
MATH_MODES = ("simt", "tf32", "3xtf32")
# How blocks take the C tiles: one block per tile; one block per SM walking tiles; or the K steps
# of all tiles dealt evenly over the SMs, partial tiles summed through a workspace in a fixed order.
SCHEDULES = ("data-parallel", "persistent", "stream-k", "pingpong")

# A kernel is a dozen lines. The parser takes about a second per 100 kB, so a file past this is
# refused before it is read, not after half a minute of parsing (it is not a spec anyway).
MAX_SPEC_BYTES = 1_000_000


@dataclass(frozen=True)
class Param:
    """One setting: its candidate values and where the spec wrote them (None: a default)."""

    values: tuple
    span: Span | None = None
    # (path, text) of the file that wrote it, when that is not the spec's own file (a setting
    # inherited from a parent in NAME.gemm): its span points into that text, not the spec's.
    origin: tuple[str, str] | None = field(default=None, repr=False)

    @property
    def is_set(self) -> bool:
        return len(self.values) > 1


# --- the settings: default value and the domain of each ------------------------------

def _positive(v: Any) -> bool:
    return isinstance(v, int) and v >= 1


def _power_of_two(v: Any) -> bool:
    return _positive(v) and v & (v - 1) == 0


@dataclass(frozen=True)
class Setting:
    default: Any
    check: Callable[[Any], bool]
    allowed: str


_WORDS = lambda *words: (lambda v: v in words)  # noqa: E731

_VIA = ("copy (the stages' own copies: cp.async, or loads through registers) or registers "
        "(always through registers, a transposing store done in 4 x 4 or 2 x 2 blocks there)")

_VECTOR = ("row (a vector of M floats {what}, one per row of C), col (N floats, one per column) "
           "or none")

SETTINGS: dict[str, Setting] = {
    "target": Setting("sm_90", _WORDS(*TARGETS), ", ".join(TARGETS)),
    "math": Setting("simt", _WORDS(*MATH_MODES), ", ".join(MATH_MODES)),
    "mma.m": Setting(None, _positive, "a positive integer (rows of the MMA instruction's tile)"),
    "mma.n": Setting(None, _positive, "a positive integer (columns of the MMA instruction's tile)"),
    "mma.k": Setting(None, _positive, "a positive integer (K of the MMA instruction)"),
    "layout.A": Setting("row", _WORDS("row", "col"), "row or col"),
    "layout.B": Setting("row", _WORDS("row", "col"), "row or col"),
    "layout.C": Setting("row", _WORDS("row", "col"), "row or col"),
    "block.m": Setting(None, _positive, "a positive integer (rows of C per thread block)"),
    "block.n": Setting(None, _positive, "a positive integer (columns of C per thread block)"),
    "block.k": Setting(1, _positive, "a positive integer (K step per shared-memory tile)"),
    "warp.m": Setting(None, _positive, "a positive integer (rows of C per warp)"),
    "warp.n": Setting(None, _positive, "a positive integer (columns of C per warp)"),
    "thread.m": Setting(1, _positive, "a positive integer (rows of C per thread and sub-tile)"),
    "thread.n": Setting(1, _positive, "a positive integer (columns of C per thread and sub-tile)"),
    "repeat.m": Setting(1, _positive, "a positive integer (sub-tiles swept along M)"),
    "repeat.n": Setting(1, _positive, "a positive integer (sub-tiles swept along N)"),
    "order": Setting("n", _WORDS("m", "n"),
                     "m (consecutive threads walk down a column of C) or n (along a row)"),
    "load.A.vector": Setting(1, _WORDS(1, 2, 4), "1, 2 or 4 floats per load"),
    "load.B.vector": Setting(1, _WORDS(1, 2, 4), "1, 2 or 4 floats per load"),
    "load.A.transpose": Setting(False, lambda v: isinstance(v, bool), "on or off"),
    "load.B.transpose": Setting(False, lambda v: isinstance(v, bool), "on or off"),
    "load.A.uncoalesced": Setting(False, lambda v: isinstance(v, bool), "on or off"),
    "load.B.uncoalesced": Setting(False, lambda v: isinstance(v, bool), "on or off"),
    "load.A.via": Setting("copy", _WORDS("copy", "registers"), _VIA),
    "load.B.via": Setting("copy", _WORDS("copy", "registers"), _VIA),
    "shared": Setting(True, _WORDS(True, False), "on or off"),
    "shared.A": Setting("plain", _WORDS("plain", "pad", "swizzle"), "plain, pad N or swizzle xor"),
    "shared.B": Setting("plain", _WORDS("plain", "pad", "swizzle"), "plain, pad N or swizzle xor"),
    "shared.A.pad": Setting(0, lambda v: isinstance(v, int) and 0 <= v <= 32, "0 to 32 floats"),
    "shared.B.pad": Setting(0, lambda v: isinstance(v, int) and 0 <= v <= 32, "0 to 32 floats"),
    "stages": Setting(1, lambda v: isinstance(v, int) and 1 <= v <= 8, "1 to 8 buffers"),
    "stages.fill": Setting("sync", _WORDS("sync", "async", "tma", "copy"),
                           "sync (loads through registers), async (cp.async), tma or copy (sm_90a)"),
    "fragments": Setting(1, _WORDS(1, 2), "1 or 2 register fragment buffers"),
    "unroll": Setting(0, lambda v: isinstance(v, int) and 0 <= v <= 256,
                      "0 (the whole block K) or N k steps per unrolled loop body"),
    "raster.group": Setting(1, lambda v: _positive(v) and v <= 64,
                            "row, or group N with N from 1 to 64"),
    "epilogue.beta": Setting(True, _WORDS(True, False), "alpha beta, or alpha"),
    "epilogue.staged": Setting(False, _WORDS(True, False), "staged or direct"),
    "bias": Setting("none", _WORDS("none", "row", "col"), _VECTOR.format(what="added to C")),
    "scale": Setting("none", _WORDS("none", "row", "col"), _VECTOR.format(what="multiplying alpha")),
    # Which words name an activation is the epilogue part's table (plan/parts/epilogue.py's
    # ACTIVATIONS), checked when the kernel is planned, so adding one touches the table alone.
    "activation": Setting("none", lambda v: isinstance(v, str), "a word: none, or an activation's name"),
    "reduce.count": Setting(0, lambda v: isinstance(v, int) and 0 <= v <= 8,
                            "min N with N from 1 to 8"),
    "split": Setting(1, lambda v: isinstance(v, int) and 1 <= v <= 256,
                     "1 to 256 slices of K per C tile"),
    # How split K's slices meet: atomicAdd into C after a pass C = beta * C, or (TMA-fed wgmma) as the
    # blocks of one thread-block cluster, block 0 storing C and the others adding into it after it,
    # or through a workspace, the last slice of a tile to finish adding them all in K order.
    "split.by": Setting("atomic", _WORDS("atomic", "cluster", "workspace"), "atomic, cluster or workspace"),
    "occupancy": Setting(0, lambda v: isinstance(v, int) and 0 <= v <= 32,
                         "0 (compiler's choice) to 32 blocks per SM"),
    "schedule": Setting("data-parallel", _WORDS(*SCHEDULES), ", ".join(SCHEDULES)),
    "cluster.m": Setting(1, _WORDS(1, 2, 4, 8), "1, 2, 4 or 8 blocks along M"),
    "cluster.n": Setting(1, _WORDS(1, 2, 4, 8), "1, 2, 4 or 8 blocks along N"),
    # TMA-fed tf32: A and B rounded to nearest TF32 (as cuBLAS rounds) by TMA as it copies them
    # (tensor maps of type TFLOAT32), or by the producer's warps 1-3 in shared memory, or B so and A in
    # the consumers' registers; or (truncate) wgmma reads the floats as they lie and drops their low 13
    # bits. `stages N copy` can only truncate, and must say so.
    "round": Setting("nearest", _WORDS("truncate", "nearest"), "truncate or nearest"),
    "round.by": Setting("tma", _WORDS("tma", "producer", "consumer"),
                        "tma (TMA rounds A and B as it copies them), producer (warps 1-3 round A and B "
                        "in shared memory) or consumer (A rounded in the consumers' registers, B by the "
                        "producer's warps)"),
    # The decode kernel (plan/decode.py): a warp streams `columns` columns of the big operand, `warps`
    # warps per block, `slices` of them sharing a column group with a slice of K each (0: not a decode kernel).
    "decode.columns": Setting(0, _WORDS(1, 2, 4, 8), "1, 2, 4 or 8 columns per warp"),
    "decode.warps": Setting(0, lambda v: isinstance(v, int) and 1 <= v <= 32, "1 to 32 warps per block"),
    "decode.slices": Setting(1, _WORDS(1, 2, 4, 8), "1, 2, 4 or 8 warps sharing a column group, each a slice of K"),
    "promote": Setting(0, lambda v: isinstance(v, int) and 0 <= v <= 1024,
                       "0 (every K tile) or a multiple of the K tile up to 1024"),
}


@dataclass(frozen=True)
class Spec:
    """A kernel as the spec wrote it: its name, settings, and the text to point errors into."""

    name: str
    params: dict[str, Param]
    path: str = "<spec>"
    text: str = ""
    span: Span | None = None
    parent: str | None = None
    source: str = ""  # the kernel's own lines, quoted in the generated header
    depth: int = field(default=0, compare=False, repr=False)  # kernels above it through `extends`

    def param(self, key: str) -> Param:
        if key in self.params:
            return self.params[key]
        return Param((SETTINGS[key].default,), None)

    def __getitem__(self, key: str) -> Any:
        """The single value of a setting; a set here is a bug in the caller (expand first)."""
        param = self.param(key)
        if param.is_set:
            raise self.error(key, f"'{key}' is a search set here; `gemmgen build` needs one value "
                                  "(run `gemmgen tune` or pick a value)")
        return param.values[0]

    def written(self, key: str) -> bool:
        return key in self.params

    @property
    def is_concrete(self) -> bool:
        return not any(p.is_set for p in self.params.values())

    @property
    def set_keys(self) -> list[str]:
        return [key for key, p in self.params.items() if p.is_set]

    def points(self) -> Iterator["Spec"]:
        """Every concrete spec of this one's search sets, in the order the sets list them."""
        keys = self.set_keys
        for combo in itertools.product(*(self.params[k].values for k in keys)):
            params = dict(self.params)
            for key, value in zip(keys, combo):
                params[key] = replace(self.params[key], values=(value,))
            yield replace(self, params=params)

    def with_values(self, **values: Any) -> "Spec":
        """A copy with some settings fixed (keys use '_' for '.', e.g. block_m=64)."""
        params = dict(self.params)
        for name, value in values.items():
            key = _key_from_name(name)
            params[key] = replace(self.param(key), values=(value,))
        return replace(self, params=params)

    def error(self, key: str | tuple[str, ...], message: str, allowed: str = "") -> SpecError:
        """A SpecError at the setting `key` (the first written one of several keys)."""
        keys = (key,) if isinstance(key, str) else key
        written = [self.params[k] for k in keys if k in self.params and self.params[k].span]
        # Point into this spec's own file where one of the keys is written there.
        param = next((p for p in written if p.origin is None), written[0] if written else None)
        if param is None:
            return SpecError(message, path=self.path, text=self.text, span=self.span,
                             allowed=allowed)
        path, text = param.origin or (self.path, self.text)
        if param.origin:
            message += f" (kernel '{self.name}' inherits this setting from {path})"
        return SpecError(message, path=path, text=text, span=param.span, allowed=allowed)


def _key_from_name(name: str) -> str:
    for key in SETTINGS:
        if key.replace(".", "_") == name:
            return key
    raise KeyError(name)


@dataclass(frozen=True)
class LibrarySpec:
    """A library as written: its members (names of kernels or search spaces), the shapes to tune
    them for, its layouts and optional precision, each with where it was written. Resolving the
    members (gemmgen.library.resolve) is where they are checked against each other."""

    name: str
    members: tuple[tuple[str, Span], ...]
    shapes: tuple[LibraryShape, ...]
    layout: dict[str, Param]
    precision: tuple[str, Span] | None
    path: str = "<spec>"
    text: str = ""
    span: Span | None = None
    source: str = ""

    def error(self, span: Span | None, message: str, allowed: str = "",
              origin: tuple[str, str] | None = None) -> SpecError:
        path, text = origin or (self.path, self.text)
        return SpecError(message, path=path, text=text, span=span or self.span, allowed=allowed)

    def layouts(self) -> dict[str, str]:
        return {x: self.layout[f"layout.{x}"].values[0] if f"layout.{x}" in self.layout else
                SETTINGS[f"layout.{x}"].default for x in "ABC"}


PRECISIONS = ("fp32", "tf32")


@dataclass
class ParsedFile:
    """What one spec file defines: kernels (and search spaces), and libraries."""

    kernels: list[Spec]
    libraries: list[LibrarySpec]
