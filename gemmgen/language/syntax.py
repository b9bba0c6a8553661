"""The grammar applied to spec text: lark's parse, its syntax errors worded at their line and column,
and the tree turned into statements that keep their positions, each value checked against the
settings' domains (spec.SETTINGS). Merging parents and reading files is load.py's work."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import lark
from lark import Lark, Token, Transformer, v_args

from .errors import Span, SpecError
from .shapes import read_shapes_file, shape_of
from .spec import MAX_SPEC_BYTES, PRECISIONS, SETTINGS, LibrarySpec, Param
from .textfile import too_large

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
    "bias": "bias row | col | none      (C += a vector: bias[i], M floats, or bias[j], N floats)",
    "scale": "scale row | col | none     (alpha times a vector: scale[i], M floats, or scale[j], N floats)",
    "activation": "activation NAME          e.g. activation gelu (docs/spec-language.md lists the names)",
    "reduce": "reduce min N",
    "math": "math simt | tf32 | 3xtf32",
    "mma": "mma M x N x K          e.g. mma 16 x 8 x 8 (mma.sync), mma 64 x 128 x 8 (wgmma)",
    "occupancy": "occupancy N",
    "split": "split N [atomic | cluster | workspace]   (K cut into N slices whose products are added into C: "
             "by atomicAdd, in a thread-block cluster, or summed from a workspace by the tile's last slice)",
    "schedule": "schedule data-parallel | persistent | stream-k | pingpong",
    "cluster": "cluster M x N          e.g. cluster 2 x 1 (blocks of a cluster share A and B tiles by TMA multicast)",
    "promote": "promote K              e.g. promote 64 (3xtf32: K between adds of the tensor cores' sums into FP32)",
    "round": "round nearest [tma | producer | consumer] | truncate   (TMA-fed tf32: rounded to nearest TF32, by default by TMA as it copies; or truncated)",
    "decode": "decode columns C warps W [slices S]   e.g. decode columns 4 warps 8 slices 2 (M or N <= 16)",
    "library": "library NAME { members ...; shapes ... }",
    "members": "members NAME, NAME, ...   kernels or search spaces in this file or in NAME.gemm beside it",
    "shapes": 'shapes MxNxK [batch B] [pad P], ...   e.g. shapes 4096x4096x4096, 127x4099x1023 pad 1, '
              '512x512x512 batch 64; or shapes "FILE"',
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
    def bias(self, meta, c):
        return self._statement("bias", meta, bias=c[0])

    @v_args(meta=True)
    def scale(self, meta, c):
        return self._statement("scale", meta, scale=c[0])

    @v_args(meta=True)
    def activation(self, meta, c):
        return self._statement("activation", meta, activation=c[0])

    @v_args(meta=True)
    def reduce(self, meta, c):
        if c[0].values != ("min",):
            raise self._err(c[0].span, f"unknown reduction '{c[0].values[0]}'", USAGE["reduce"])
        return self._statement("reduce", meta, **{"reduce.count": c[1]})

    @v_args(meta=True)
    def occupancy(self, meta, c):
        return self._statement("occupancy", meta, occupancy=c[0])

    def split_by(self, c):
        return c[0]

    @v_args(meta=True)
    def split(self, meta, c):
        by = {"split.by": c[1]} if len(c) > 1 else {}  # unwritten: atomic (and no new key for old specs)
        return self._statement("split", meta, split=c[0], **by)

    @v_args(meta=True)
    def promote(self, meta, c):
        return self._statement("promote", meta, promote=c[0])

    @v_args(meta=True)
    def round(self, meta, c):
        # `round nearest` has TMA round A and B as it copies them, unless `producer` or `consumer` says
        # who else rounds them.
        if len(c) == 2 and c[0].values != ("nearest",):
            raise self._err(c[1].span, f"'round {c[0].values[0]}' takes no second word: only 'round "
                            "nearest' says who rounds", USAGE["round"])
        by = c[1] if len(c) == 2 else _Value(("tma",), _span(meta))
        return self._statement("round", meta, round=c[0], **{"round.by": by})

    @v_args(meta=True)
    def schedule(self, meta, c):
        return self._statement("schedule", meta, schedule=c[0])

    @v_args(meta=True)
    def cluster(self, meta, c):
        return self._statement("cluster", meta, **{"cluster.m": c[0], "cluster.n": c[1]})

    @v_args(meta=True)
    def decode(self, meta, c):
        params = {"decode.columns": c[0], "decode.warps": c[1]}
        params["decode.slices"] = c[2] if len(c) == 3 else _Value((1,), _span(meta))
        return self._statement("decode", meta, **params)

    # --- libraries ---------------------------------------------------------------------

    @v_args(meta=True)
    def members(self, meta, c):
        return ("members", _span(meta), [(str(token), _span(token)) for token in c])

    def shape_batch(self, c):
        return ("batch", str(c[0]))

    def shape_pad(self, c):
        return ("pad", str(c[0]))

    @v_args(meta=True)
    def shape(self, meta, c):
        extra = dict(c[1:])
        return shape_of(str(c[0]), extra.get("pad"), _span(meta), self.path, self.text,
                        batch_text=extra.get("batch"))

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


@dataclass
class _LibraryTree:
    name: Token
    span: Span
    meta: Any
    statements: list


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
