"""Parse spec text into typed Spec objects; every error a SpecError with its position.

A Spec maps setting keys ("block.m", "load.A.vector", ...) to Params: the candidate values
written in the spec (one value, or several for a search set) and where they were written.
Whether the values can work together is the Plan's question (plan.py); this module checks
only that each value is one the language allows.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

import lark
from lark import Lark, Token, Transformer, v_args

from .errors import Span, SpecError
# LibraryShape and parse_shapes stay importable from here, as library.py and .ci/ import them.
from .shapes import LibraryShape, parse_shapes, read_shapes_file, shape_of  # noqa: F401
from .textfile import FileRefused, read_text, too_large

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
    "stages.fill": Setting("sync", _WORDS("sync", "async", "tma"),
                           "sync (loads through registers), async (cp.async) or tma (sm_90a)"),
    "fragments": Setting(1, _WORDS(1, 2), "1 or 2 register fragment buffers"),
    "unroll": Setting(0, lambda v: isinstance(v, int) and 0 <= v <= 256,
                      "0 (the whole block K) or N k steps per unrolled loop body"),
    "raster.group": Setting(1, lambda v: _positive(v) and v <= 64,
                            "row, or group N with N from 1 to 64"),
    "epilogue.beta": Setting(True, _WORDS(True, False), "alpha beta, or alpha"),
    "epilogue.staged": Setting(False, _WORDS(True, False), "staged or direct"),
    "reduce.count": Setting(0, lambda v: isinstance(v, int) and 0 <= v <= 8,
                            "min N with N from 1 to 8"),
    "split": Setting(1, lambda v: isinstance(v, int) and 1 <= v <= 256,
                     "1 to 256 slices of K per C tile"),
    "occupancy": Setting(0, lambda v: isinstance(v, int) and 0 <= v <= 32,
                         "0 (compiler's choice) to 32 blocks per SM"),
    "schedule": Setting("data-parallel", _WORDS(*SCHEDULES), ", ".join(SCHEDULES)),
    "cluster.m": Setting(1, _WORDS(1, 2, 4, 8), "1, 2, 4 or 8 blocks along M"),
    "cluster.n": Setting(1, _WORDS(1, 2, 4, 8), "1, 2, 4 or 8 blocks along N"),
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


# --- parsing ---------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _parser() -> Lark:
    grammar = (Path(__file__).with_name("grammar.lark")).read_text()
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=False)


# What each statement looks like, quoted when a line does not parse.
USAGE = {
    "kernel": "kernel NAME [extends PARENT] { ...settings, one per line... }",
    "target": "target sm_80 | sm_86 | sm_89 | sm_90 | sm_90a",
    "layout": "layout A row|col, B row|col, C row|col",
    "block": "block M x N x K        e.g. block 128 x 128 x 16",
    "warp": "warp M x N             e.g. warp 64 x 32",
    "thread": "thread M x N [repeat M x N]   e.g. thread 8 x 4 repeat 1 x 4",
    "order": "order m | n",
    "load": "load A|B [vector 1|2|4] [transpose] [uncoalesced] [via copy|registers]",
    "shared": "shared A|B plain | pad N | swizzle xor,  or: shared off",
    "stages": "stages N [sync|async|tma]",
    "fragments": "fragments 1 | 2",
    "unroll": "unroll N               e.g. unroll 8 (the k loop over a shared tile, 8 steps per unrolled body)",
    "raster": "raster row | group N",
    "epilogue": "epilogue alpha beta | alpha [staged | direct | {direct, staged}]",
    "reduce": "reduce min N",
    "math": "math simt | tf32 | 3xtf32",
    "mma": "mma M x N x K          e.g. mma 16 x 8 x 8 (mma.sync), mma 64 x 128 x 8 (wgmma)",
    "occupancy": "occupancy N",
    "split": "split N          (K cut into N slices whose products are added into C)",
    "schedule": "schedule data-parallel | persistent | stream-k | pingpong",
    "cluster": "cluster M x N          e.g. cluster 2 x 1 (blocks of a cluster share A and B tiles by TMA multicast)",
    "promote": "promote K              e.g. promote 64 (3xtf32: K between adds of the tensor cores' sums into FP32)",
    "library": "library NAME { members ...; shapes ... }",
    "members": "members NAME, NAME, ...   kernels or search spaces in this file or in NAME.gemm beside it",
    "shapes": 'shapes MxNxK [pad P], ...   e.g. shapes 4096x4096x4096, 127x4099x1023 pad 1; or shapes "FILE"',
    "precision": "precision fp32 | tf32",
}
LIBRARY_SETTINGS = ("layout", "members", "shapes", "precision")

_TERMINAL_WORDS = {
    "_NL": "end of line", "INT": "a number", "WORD": "a word", "NAME": "a name",
    "OPERAND": "A, B or C", "MODE": "3xtf32", "LBRACE": "'{'", "RBRACE": "'}'", "COMMA": "','", "X": "'x'",
    "$END": "end of file",
}


def _describe_expected(expected: set[str]) -> str:
    words = []
    for name in sorted(expected):
        if name in _TERMINAL_WORDS:
            words.append(_TERMINAL_WORDS[name])
        elif name.isupper() and name.lower() in USAGE:
            words.append(f"'{name.lower()}'")
        else:
            words.append(name.lower().strip("_"))
    return ", ".join(dict.fromkeys(words))


def _short(word: str, limit: int = 40) -> str:
    """A word of the spec as a message repeats it: at most `limit` characters, then '...'."""
    return word if len(word) <= limit else word[:limit] + "..."


def _syntax_error(exc: lark.exceptions.UnexpectedInput, text: str, path: str) -> SpecError:
    line, column = exc.line, exc.column
    lines = [ln.rstrip("\r") for ln in text.split("\n")]  # as the parser counts lines
    if len(lines) > 1 and not lines[-1]:
        lines.pop()
    if line is None or line < 1:
        line = len(lines) or 1
        column = len(lines[-1]) + 1 if lines else 1
    source_line = lines[line - 1] if 0 < line <= len(lines) else ""
    # The statement in error starts after the last '{' or ';' before the error on its line.
    before = source_line[:max(0, column - 1)]
    start = max(before.rfind("{"), before.rfind(";")) + 1
    statement = source_line[start:].split("#")[0].split()
    keyword = statement[0] if statement else ""
    at_keyword = column - 1 <= start + len(source_line[start:]) - len(source_line[start:].lstrip())
    if isinstance(exc, lark.exceptions.UnexpectedToken) and exc.token.type != "$END":
        token = str(exc.token).strip()
        what = "unexpected end of line" if exc.token.type == "_NL" else f"unexpected '{_short(token)}'"
        width = 1 if exc.token.type == "_NL" else max(1, len(token))
    elif isinstance(exc, lark.exceptions.UnexpectedCharacters):
        char = source_line[column - 1:column]
        what = f"unexpected character {char!r}" if char else "unexpected character"
        width = 1
        if char and not char.isprintable():
            return SpecError(f"unexpected control character {char!r}", path=path, text=text,
                             span=Span(line, column, column + 1),
                             allowed="printable text, lines ending in \\n or \\r\\n")
    else:
        return SpecError("unexpected end of file: a kernel's closing '}' is missing", path=path,
                         text=text, span=Span(line, column, column + 1), allowed="'}' after the last setting")
    expected = getattr(exc, "expected", None) or getattr(exc, "allowed", None) or set()
    if "KERNEL" in expected:
        return SpecError(f"{what}: a spec holds kernels and libraries", path=path, text=text,
                         span=Span(line, column, column + width),
                         allowed=f"{USAGE['kernel']}, or {USAGE['library']}")
    in_library = "MEMBERS" in expected or "SHAPES" in expected
    if in_library and at_keyword and keyword and keyword not in LIBRARY_SETTINGS and keyword[0].isalpha():
        return SpecError(f"'{_short(keyword)}' is not a library setting", path=path, text=text,
                         span=Span(line, column, column + len(keyword)),
                         allowed="a library setting: " + ", ".join(LIBRARY_SETTINGS))
    if keyword == "kernel" and at_keyword and "RBRACE" in expected:
        return SpecError("a kernel starts inside another one: the kernel before it is missing "
                         "its closing '}'", path=path, text=text,
                         span=Span(line, column, column + width), allowed="'}' after the last setting")
    if keyword in USAGE and not (keyword == "kernel" and not at_keyword):
        allowed = USAGE[keyword]
        message = f"{what} in '{keyword}' setting" if keyword != "kernel" else what
    elif keyword and at_keyword and (keyword[0].isalpha() or keyword[0] == "_"):
        allowed = "a setting: " + ", ".join(k for k in USAGE if k != "kernel")
        message = f"'{_short(keyword)}' is not a setting"
        width = len(keyword)
    else:
        allowed = _describe_expected(set(expected)) if expected else USAGE["kernel"]
        message = what
    return SpecError(message, path=path, text=text, span=Span(line, column, column + width),
                     allowed=allowed)


def _span(meta_or_token: Any) -> Span:
    if isinstance(meta_or_token, Token):
        return Span(meta_or_token.line, meta_or_token.column,
                    meta_or_token.column + len(str(meta_or_token)))
    meta = meta_or_token
    end = meta.end_column if meta.end_line == meta.line else meta.column + 1
    return Span(meta.line, meta.column, end)


@dataclass
class _Value:
    values: tuple
    span: Span


@dataclass
class _Statement:
    keyword: str
    span: Span
    params: dict[str, _Value] = field(default_factory=dict)


class _ToStatements(Transformer):
    """Parse tree → per-kernel lists of statements, each a dict of key → (values, span)."""

    def __init__(self, text: str, path: str):
        super().__init__()
        self.text, self.path = text, path

    def _err(self, span: Span, message: str, allowed: str = "") -> SpecError:
        return SpecError(message, path=self.path, text=self.text, span=span, allowed=allowed)

    @v_args(meta=True)
    def int_atom(self, meta, children):
        token = children[0]
        digits = token.lstrip("0") or "0"
        if len(digits) > 10 or int(digits) > 2**31 - 1:
            shown = digits if len(digits) <= 20 else f"{digits[:8]}...({len(digits)} digits)"
            raise self._err(_span(token), f"{shown} is too large for any setting",
                            "a number up to 2147483647")
        return _Value((int(digits),), _span(token))

    @v_args(meta=True)
    def word_atom(self, meta, children):
        token = children[0]
        return _Value((str(token),), _span(token))

    @v_args(meta=True)
    def set(self, meta, children):
        values = tuple(v for child in children for v in child.values)
        if len(set(values)) != len(values):
            raise self._err(_span(meta), "a set lists a value twice", "distinct values")
        return _Value(values, _span(meta))

    def _statement(self, keyword: str, meta, **params: _Value) -> _Statement:
        return _Statement(keyword, _span(meta), params)

    @v_args(meta=True)
    def target(self, meta, c):
        return self._statement("target", meta, target=c[0])

    @v_args(meta=True)
    def math(self, meta, c):
        return self._statement("math", meta, math=c[0])

    @v_args(meta=True)
    def mma(self, meta, c):
        return self._statement("mma", meta, **{"mma.m": c[0], "mma.n": c[1], "mma.k": c[2]})

    @v_args(meta=True)
    def operand_layout(self, meta, c):
        return (str(c[0]), _span(c[0]), c[1])

    @v_args(meta=True)
    def layout(self, meta, c):
        stmt = self._statement("layout", meta)
        for operand, op_span, value in c:
            key = f"layout.{operand}"
            if key in stmt.params:
                raise self._err(op_span, f"layout of {operand} given twice on this line",
                                "each of A, B, C at most once")
            stmt.params[key] = value
        return stmt

    @v_args(meta=True)
    def block(self, meta, c):
        return self._statement("block", meta, **{"block.m": c[0], "block.n": c[1], "block.k": c[2]})

    @v_args(meta=True)
    def warp(self, meta, c):
        return self._statement("warp", meta, **{"warp.m": c[0], "warp.n": c[1]})

    def repeat(self, c):
        return c

    @v_args(meta=True)
    def thread(self, meta, c):
        params = {"thread.m": c[0], "thread.n": c[1]}
        if len(c) == 3:
            params["repeat.m"], params["repeat.n"] = c[2]
        else:
            span = _span(meta)
            params["repeat.m"] = params["repeat.n"] = _Value((1,), span)
        return self._statement("thread", meta, **params)

    @v_args(meta=True)
    def order(self, meta, c):
        return self._statement("order", meta, order=c[0])

    @v_args(meta=True)
    def vector(self, meta, c):
        return ("vector", c[0])

    @v_args(meta=True)
    def transpose(self, meta, c):
        if not c:
            return ("transpose", _Value((True,), _span(meta)))
        return ("transpose", _Value(tuple(_on_off(v) for v in c[0].values), c[0].span))

    @v_args(meta=True)
    def uncoalesced(self, meta, c):
        if not c:
            return ("uncoalesced", _Value((True,), _span(meta)))
        return ("uncoalesced", _Value(tuple(_on_off(v) for v in c[0].values), c[0].span))

    @v_args(meta=True)
    def via(self, meta, c):
        return ("via", c[0])

    @v_args(meta=True)
    def load(self, meta, c):
        operand = str(c[0])
        if operand == "C":
            raise self._err(_span(c[0]), "C is not loaded through a tile loader", "load A or load B")
        stmt = self._statement("load", meta, **{
            f"load.{operand}.vector": _Value((1,), _span(meta)),
            f"load.{operand}.transpose": _Value((False,), _span(meta)),
            f"load.{operand}.uncoalesced": _Value((False,), _span(meta)),
            f"load.{operand}.via": _Value(("copy",), _span(meta))})
        seen = set()
        for name, value in c[1:]:
            if name in seen:
                raise self._err(value.span, f"'{name}' given twice for load {operand}",
                                USAGE["load"])
            seen.add(name)
            stmt.params[f"load.{operand}.{name}"] = value
        return stmt

    @v_args(meta=True)
    def pad(self, meta, c):
        return ("pad", c[0])

    @v_args(meta=True)
    def swizzle(self, meta, c):
        for v in c[0].values:
            if v != "xor":
                raise self._err(c[0].span, f"unknown swizzle '{v}'", "swizzle xor")
        return ("swizzle", None)

    @v_args(meta=True)
    def plain(self, meta, c):
        return ("plain", None)

    @v_args(meta=True)
    def shared_operand(self, meta, c):
        operand = str(c[0])
        if operand == "C":
            raise self._err(_span(c[0]), "C has no shared-memory tile", "shared A, shared B, shared off")
        mode, value = c[1]
        span = _span(meta)
        params = {f"shared.{operand}": _Value((mode,), span),
                  f"shared.{operand}.pad": value if value is not None else _Value((0,), span)}
        return self._statement("shared " + operand, meta, **params)

    @v_args(meta=True)
    def shared_off(self, meta, c):
        return self._statement("shared off", meta, shared=_Value((False,), _span(meta)))

    def stage_fill(self, c):
        return c[0]

    @v_args(meta=True)
    def stages(self, meta, c):
        fill = c[1] if len(c) > 1 else _Value(("sync",), _span(meta))
        return self._statement("stages", meta, stages=c[0], **{"stages.fill": fill})

    @v_args(meta=True)
    def fragments(self, meta, c):
        return self._statement("fragments", meta, fragments=c[0])

    @v_args(meta=True)
    def unroll(self, meta, c):
        return self._statement("unroll", meta, unroll=c[0])

    @v_args(meta=True)
    def raster(self, meta, c):
        mode = c[0]
        if mode.values == ("row",) and len(c) == 1:
            group = _Value((1,), mode.span)
        elif mode.values == ("group",) and len(c) == 2:
            group = c[1]
        else:
            raise self._err(mode.span, "raster takes 'row' or 'group N'", USAGE["raster"])
        return self._statement("raster", meta, **{"raster.group": group})

    @v_args(meta=True)
    def epilogue(self, meta, c):
        # The last item says how C is stored: `staged`, `direct` (the default) or a set of them.
        how = c[-1] if isinstance(c[-1], _Value) else None
        words = [str(t) for t in (c[:-1] if how else c)]
        if how is None and words[-1:] in (["staged"], ["direct"]):
            how = _Value((words.pop() == "staged",), _span(c[len(words)]))
        elif how is None:
            how = _Value((False,), _span(meta))
        else:
            unknown = [v for v in how.values if v not in ("staged", "direct")]
            if unknown:
                raise self._err(how.span, f"unknown epilogue store '{unknown[0]}'", "staged or direct")
            how = _Value(tuple(v == "staged" for v in how.values), how.span)
        if words == ["alpha", "beta"]:
            beta = True
        elif words == ["alpha"]:
            beta = False
        else:
            raise self._err(_span(c[0]), f"unknown epilogue '{' '.join(words)}'", USAGE["epilogue"])
        return self._statement("epilogue", meta, **{"epilogue.beta": _Value((beta,), _span(meta)),
                                                    "epilogue.staged": how})

    @v_args(meta=True)
    def reduce(self, meta, c):
        if c[0].values != ("min",):
            raise self._err(c[0].span, f"unknown reduction '{c[0].values[0]}'", USAGE["reduce"])
        return self._statement("reduce", meta, **{"reduce.count": c[1]})

    @v_args(meta=True)
    def occupancy(self, meta, c):
        return self._statement("occupancy", meta, occupancy=c[0])

    @v_args(meta=True)
    def split(self, meta, c):
        return self._statement("split", meta, split=c[0])

    @v_args(meta=True)
    def promote(self, meta, c):
        return self._statement("promote", meta, promote=c[0])

    @v_args(meta=True)
    def schedule(self, meta, c):
        return self._statement("schedule", meta, schedule=c[0])

    @v_args(meta=True)
    def cluster(self, meta, c):
        return self._statement("cluster", meta, **{"cluster.m": c[0], "cluster.n": c[1]})

    # --- libraries ---------------------------------------------------------------------

    @v_args(meta=True)
    def members(self, meta, c):
        return ("members", _span(meta), [(str(token), _span(token)) for token in c])

    @v_args(meta=True)
    def shape(self, meta, c):
        return shape_of(str(c[0]), str(c[1]) if len(c) > 1 else None, _span(meta), self.path, self.text)

    @v_args(meta=True)
    def shapes(self, meta, c):
        return ("shapes", _span(meta), list(c))

    @v_args(meta=True)
    def shapes_file(self, meta, c):
        return ("shapes file", _span(meta), (str(c[0])[1:-1], _span(c[0])))

    @v_args(meta=True)
    def precision(self, meta, c):
        word, span = str(c[0]), _span(c[0])
        if word not in PRECISIONS:
            raise self._err(span, f"unknown precision '{word}'", USAGE["precision"])
        return ("precision", _span(meta), (word, span))

    @v_args(meta=True)
    def library(self, meta, c):
        return _LibraryTree(c[0], _span(meta), meta, c[1:])

    def extends(self, c):
        return ("extends", c[0])

    @v_args(meta=True)
    def kernel(self, meta, c):
        name = c[0]
        parent = None
        statements = []
        for child in c[1:]:
            if isinstance(child, tuple) and child[0] == "extends":
                parent = child[1]
            else:
                statements.append(child)
        return (name, parent, _span(meta), meta, statements)

    def start(self, c):
        return c


def _on_off(value: Any) -> Any:
    return {"on": True, "off": False}.get(value, value)


def _check_values(stmt: _Statement, path: str, text: str) -> None:
    for key, value in stmt.params.items():
        setting = SETTINGS[key]
        for v in value.values:
            if not setting.check(v):
                shown = {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v
                raise SpecError(f"{shown!r} is not a valid value for {key}", path=path, text=text,
                                span=value.span, allowed=setting.allowed)


def _kernel_source(text: str, meta) -> str:
    lines = text.split("\n")  # as the parser counts lines
    return "\n".join(line.rstrip("\r") for line in lines[meta.line - 1: meta.end_line])


def _too_large(size: int) -> str:
    return too_large(size, MAX_SPEC_BYTES, "a spec", "a kernel is a few lines")


def read_spec_text(path: Path) -> str:
    """A spec file's text: a regular file (not a pipe or a device, which would block or never
    end), its size checked before it is read (a SpecError past MAX_SPEC_BYTES), UTF-8 with or
    without a byte-order mark. Raises SpecError, or OSError as opening does, for the caller to word."""
    return read_text(path, MAX_SPEC_BYTES, "a spec", "a kernel is a few lines")


def parse(text: str, path: str = "<spec>", *, search_dirs: tuple[Path, ...] = ()) -> list[Spec]:
    """All kernels of a spec text, parents merged in. Raises SpecError, nothing else."""
    return parse_file(text, path, search_dirs=search_dirs).kernels


@dataclass(frozen=True)
class LibrarySpec:
    """A library as written: its members (names of kernels or search spaces), the shapes to tune
    them for, its layouts and optional precision, each with where it was written. Resolving the
    members (library.py) is where they are checked against each other."""

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
class _LibraryTree:
    name: Token
    span: Span
    meta: Any
    statements: list


@dataclass
class ParsedFile:
    """What one spec file defines: kernels (and search spaces), and libraries."""

    kernels: list[Spec]
    libraries: list[LibrarySpec]


def parse_file(text: str, path: str = "<spec>", *, search_dirs: tuple[Path, ...] = ()) -> ParsedFile:
    """The kernels (parents merged in) and libraries of a spec text. Raises SpecError only."""
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some editors write
    kernels, trees = _statements(text, path)
    libraries = [_library(tree, text, path) for tree in trees]
    if not kernels and not libraries:
        raise SpecError("the spec defines no kernel", path=path, text=text,
                        span=Span(1, 1, 2), allowed=USAGE["kernel"])
    names = [str(k[0]) for k in kernels] + [lib.name for lib in libraries]
    for library in libraries:
        if names.count(library.name) > 1:
            raise SpecError(f"'{library.name}' names both a library and another definition in this file",
                            path=path, text=text, span=library.span, allowed="one definition per name")
    loader = _Loader(tuple(search_dirs), len(text.encode()))
    file = _KernelFile(kernels, text, path, loader)
    if not path.startswith("<"):
        loader.files[Path(path).resolve()] = file  # a parent's parent may be in this file
    return ParsedFile([file.resolve(name) for name in file.pending], libraries)


def _statements(text: str, path: str) -> tuple[list, list]:
    """The kernel statements and library trees of a spec text (its syntax and values checked)."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(_too_large(len(text.encode())), path=path)
    try:
        tree = _parser().parse(text if text.endswith("\n") else text + "\n")
    except lark.exceptions.UnexpectedInput as exc:
        raise _syntax_error(exc, text, path) from None
    raw = _ToStatements(text, path)
    try:
        items = raw.transform(tree)
    except lark.exceptions.VisitError as exc:
        if isinstance(exc.orig_exc, SpecError):
            raise exc.orig_exc from None
        raise
    return ([item for item in items if not isinstance(item, _LibraryTree)],
            [item for item in items if isinstance(item, _LibraryTree)])


def _library(tree: _LibraryTree, text: str, path: str) -> LibrarySpec:
    """A library's statements, each setting at most once."""
    seen: dict[str, Span] = {}
    members, shapes, layout, precision = (), (), {}, None
    for statement in tree.statements:
        if isinstance(statement, _Statement):  # the layout line, shared with kernels
            keyword, span = "layout", statement.span
        else:
            keyword, span, value = statement
        base = "shapes" if keyword == "shapes file" else keyword
        if base in seen:
            raise SpecError(f"'{base}' is given twice in library '{tree.name}' (first at line "
                            f"{seen[base].line})", path=path, text=text, span=span,
                            allowed="each setting once per library")
        seen[base] = span
        if keyword == "layout":
            _check_values(statement, path, text)
            layout = {key: Param(v.values, v.span) for key, v in statement.params.items()}
        elif keyword == "members":
            for index, (name, name_span) in enumerate(value):
                if name in [earlier for earlier, _ in value[:index]]:
                    raise SpecError(f"member '{name}' is named twice", path=path, text=text,
                                    span=name_span, allowed="each member once")
            members = tuple(value)
        elif keyword == "shapes":
            shapes = tuple(value)
        elif keyword == "shapes file":
            shapes = tuple(read_shapes_file(value[0], value[1], path, text))
        else:
            precision = value
    library_span = _span(tree.name)
    if not members:
        raise SpecError(f"library '{tree.name}' names no members", path=path, text=text,
                        span=library_span, allowed=USAGE["members"])
    if not shapes:
        raise SpecError(f"library '{tree.name}' names no shapes to tune for", path=path, text=text,
                        span=library_span, allowed=USAGE["shapes"])
    return LibrarySpec(str(tree.name), members, shapes, layout, precision, path, text, library_span,
                       _kernel_source(text, tree.meta))


# Kernels a kernel may have above it through `extends` (its parent, the parent's parent, ...): a
# chain longer than a few is a mistake, and each step costs a file read and a parse.
MAX_EXTENDS_DEPTH = 32
EXTENDS_LIMIT = f"at most {MAX_EXTENDS_DEPTH} kernels above a kernel through `extends`"
# Files a spec may read, its own among them (each at most MAX_SPEC_BYTES), and bytes in all.
MAX_SPEC_FILES = 64
MAX_LOAD_BYTES = 4 * MAX_SPEC_BYTES


@dataclass
class _Loader:
    """What one parse has read: each file a kernel extends from, parsed once (by resolved path),
    the kernels whose parents are being resolved (one chain of `extends`, to find a loop or a
    chain past MAX_EXTENDS_DEPTH), and the bytes read."""

    search_dirs: tuple[Path, ...]
    bytes_read: int
    files: dict[Path, "_KernelFile"] = field(default_factory=dict)
    chain: list[tuple["_KernelFile", str]] = field(default_factory=list)

    def file_with(self, parent: Token, child: "_KernelFile") -> "_KernelFile":
        """The file NAME.gemm beside `child`'s file (or in a search folder) defining the kernel
        NAME that `parent` names; a SpecError at `parent` when there is none or it cannot be read."""
        name = str(parent)

        def error(message: str, allowed: str) -> SpecError:
            return SpecError(message, path=child.path, text=child.text, span=_span(parent), allowed=allowed)

        dirs = list(self.search_dirs)
        if not child.path.startswith("<"):
            dirs.insert(0, Path(child.path).parent)
        for directory in dirs:
            candidate = directory / f"{name}.gemm"
            if not candidate.is_file():
                continue
            key = candidate.resolve()
            if key not in self.files:
                if len(self.files) >= MAX_SPEC_FILES:
                    raise error(f"kernel extends '{name}' from {candidate}, but this spec has read "
                                f"{MAX_SPEC_FILES} files already, gemmgen's limit",
                                f"kernels whose parents lie in at most {MAX_SPEC_FILES} files")
                try:
                    text = read_spec_text(candidate)
                except SpecError as exc:
                    raise error(f"cannot read {candidate}: {exc.message}", "a NAME.gemm spec file") from None
                except OSError as exc:
                    raise error(f"cannot read {candidate}: {exc.strerror}", "a readable NAME.gemm file") from None
                self.bytes_read += len(text.encode())
                if self.bytes_read > MAX_LOAD_BYTES:
                    raise error(f"kernel extends '{name}' from {candidate}, but this spec and the files "
                                f"of its parents would be more than {MAX_LOAD_BYTES / 1e6:g} MB in all",
                                f"a spec and parents of at most {MAX_LOAD_BYTES / 1e6:g} MB in all")
                kernels, _ = _statements(text, str(candidate))  # a parent file's libraries are not read
                self.files[key] = _KernelFile(kernels, text, str(candidate), self)
            if name in self.files[key].pending:
                return self.files[key]
        raise error(f"kernel extends '{name}', which is neither in this file nor in {name}.gemm beside it",
                    "the name of a kernel in this file or a NAME.gemm file next to it")


class _KernelFile:
    """The kernels of one file as written (each setting once), resolved on demand: each kernel once,
    its parents merged in, whether they are in this file or in another."""

    def __init__(self, kernels: list, text: str, path: str, loader: _Loader):
        self.text, self.path, self.loader = text, path, loader
        self.specs: dict[str, Spec] = {}
        self.pending: dict[str, tuple] = {}
        for name_token, parent, span, meta, statements in kernels:
            name = str(name_token)
            if name in self.pending:
                raise SpecError(f"kernel '{name}' is defined twice in this file", path=path, text=text,
                                span=_span(name_token), allowed="one kernel per name")
            params: dict[str, Param] = {}
            first_seen: dict[str, Span] = {}
            for stmt in statements:
                _check_values(stmt, path, text)
                for key, value in stmt.params.items():
                    if key in first_seen:
                        raise SpecError(
                            f"'{stmt.keyword}' sets {key} again (first set at line {first_seen[key].line})",
                            path=path, text=text, span=stmt.span, allowed="each setting once per kernel")
                    first_seen[key] = stmt.span
                    params[key] = Param(value.values, value.span)
            self.pending[name] = (name_token, parent, span, meta, params)

    def _error(self, token: Token, message: str, allowed: str) -> SpecError:
        return SpecError(message, path=self.path, text=self.text, span=_span(token), allowed=allowed)

    def resolve(self, name: str) -> Spec:
        if name in self.specs:
            return self.specs[name]
        name_token, parent, span, meta, params = self.pending[name]
        merged: dict[str, Param] = {}
        depth = 0
        if parent is not None:
            chain = self.loader.chain
            chain.append((self, name))
            try:
                parent_spec = self._parent(parent)
            finally:
                chain.pop()
            depth = parent_spec.depth + 1
            if depth > MAX_EXTENDS_DEPTH:
                raise self._error(parent, f"kernel '{name}' extends '{parent}', which has {parent_spec.depth} "
                                  "kernels above it through `extends` already, gemmgen's limit", EXTENDS_LIMIT)
            if parent_spec.path == self.path:
                merged.update(parent_spec.params)
            else:  # spans of the parent's own settings point into the parent's file
                merged.update({key: p if p.origin else replace(p, origin=(parent_spec.path, parent_spec.text))
                               for key, p in parent_spec.params.items()})
        merged.update(params)
        spec = Spec(name=name, params=merged, path=self.path, text=self.text, span=_span(name_token),
                    parent=str(parent) if parent is not None else None,
                    source=_kernel_source(self.text, meta), depth=depth)
        self.specs[name] = spec
        return spec

    def _parent(self, parent: Token) -> Spec:
        """The resolved parent kernel that `parent` names (the chain ends with its child)."""
        chain = self.loader.chain
        name = chain[-1][1]
        if len(chain) > MAX_EXTENDS_DEPTH:
            top_file, top = chain[0]
            raise self._error(parent, f"kernel '{name}' extends '{parent}': the chain of `extends` from "
                              f"kernel '{top}' ({top_file.path}) goes past {MAX_EXTENDS_DEPTH} kernels "
                              "above it, gemmgen's limit", EXTENDS_LIMIT)
        parent_name = str(parent)
        file = self if parent_name in self.pending else self.loader.file_with(parent, self)
        if (file, parent_name) in chain:
            loop = chain[chain.index((file, parent_name)):]
            if all(f is self for f, _ in loop):
                raise self._error(parent, f"kernel '{name}' extends itself through "
                                  f"{' -> '.join(n for _, n in loop)}", "a chain without loops")
            files = " -> ".join(Path(f.path).name for f, _ in loop + [(file, parent_name)])
            kernels = " -> ".join(n for _, n in loop + [(file, parent_name)])
            raise self._error(parent, f"kernel '{name}' extends '{parent_name}' from {file.path}, whose "
                              f"parents lead back to it ({files}: kernels {kernels})",
                              "a chain of files without loops")
        return file.resolve(parent_name)


def load(path: str | Path) -> list[Spec]:
    """The kernels (and search spaces) of a spec file."""
    return load_file(path).kernels


def load_file(path: str | Path) -> ParsedFile:
    """The kernels and libraries of a spec file."""
    path = Path(path)
    try:
        text = read_spec_text(path)
    except FileRefused as exc:
        if exc.reason != "not regular":
            raise
        raise SpecError(f"cannot read spec: {exc.message}", path=str(path), allowed=exc.allowed) from None
    except OSError as exc:
        raise SpecError(f"cannot read spec: {exc.strerror}", path=str(path)) from None
    return parse_file(text, str(path))


def load_one(path: str | Path, name: str | None = None) -> Spec:
    """The kernel `name` of a spec file (or its only kernel)."""
    specs = load(path)
    if name is None:
        if len(specs) > 1:
            names = ", ".join(s.name for s in specs)
            raise SpecError(f"the file defines several kernels ({names}); name one", path=str(path),
                            allowed=names)
        return specs[0]
    for spec in specs:
        if spec.name == name:
            return spec
    raise SpecError(f"no kernel named '{name}' in this file", path=str(path),
                    allowed=", ".join(s.name for s in specs))
