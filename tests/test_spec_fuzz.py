"""Property: however a shipped spec is mangled, gemmgen answers with a SpecError or a kernel.

Each example takes the text of a file in specs/, applies a few random edits (characters deleted,
duplicated or swapped, numbers and words replaced, lines deleted or inserted), then parses it
with its real path (so `extends` finds the sibling files), plans every kernel and generates
CUDA for those that plan. Nothing but SpecError may escape, and every SpecError must quote the
line it names, with a caret, and say what is allowed. Deterministic: derandomized, no database.
"""

from __future__ import annotations

import re
from itertools import islice
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemmgen.codegen import generate
from gemmgen.errors import SpecError
from gemmgen.plan import make_plan, try_plan
from gemmgen.spec import SETTINGS, USAGE, parse

ROOT = Path(__file__).resolve().parent.parent
SPEC_FILES = sorted((ROOT / "specs").glob("*.gemm"))
GRAMMAR = (ROOT / "gemmgen" / "grammar.lark").read_text()

# The vocabulary: the grammar's keywords, the words its values may take, kernel names.
WORDS = sorted(
    set(re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"', GRAMMAR))
    | {w for usage in USAGE.values() for w in re.findall(r"[a-z_][a-z0-9_]*", usage)}
    | {w for s in SETTINGS.values() if isinstance(s.default, str) for w in [s.default]}
    | {"row", "col", "on", "off", "xor", "sm_75", "sm_100", "A", "B", "C", "D"}
    | {path.stem for path in SPEC_FILES}
) + ["{", "}", ",", ";", "#", "x", "3xtf32"]

NUMBERS = ["0", "00", "1", "2", "3", "4", "5", "7", "8", "12", "16", "24", "32", "33", "48", "64",
           "65", "96", "128", "255", "256", "512", "1024", "1025", "4096", "65536",
           "2147483647", "2147483648", "99999999999999999999", "9" * 5000]

CHARACTERS = ["\t", " ", "\n", "\r", "\r\n", "\x00", "\x0c", "é", "{", "}", ";", "#", ",", "x",
              "-", "0", "9"]

SETTING_LINES = [
    "block {n} x {n} x {n}", "block {{{n}, {n}}} x {n} x {n}", "warp {n} x {n}",
    "thread {n} x {n}", "thread {n} x {n} repeat {n} x {n}", "load A vector {n}",
    "load B vector {n} transpose", "load A transpose {w}", "shared A pad {n}",
    "shared B swizzle xor", "shared {w} plain", "shared off", "stages {n}", "stages {n} sync",
    "stages {n} async", "fragments {n}", "raster group {n}", "raster row", "raster {w} {n}",
    "epilogue alpha", "epilogue alpha beta", "reduce min {n}", "math {w}", "occupancy {n}",
    "split {n}", "load A vector {n} uncoalesced", "load B uncoalesced {w}", "epilogue alpha beta staged",
    "epilogue {w} staged",
    "target {w}", "layout A {w}, B {w}, C {w}", "order {w}", "{w} {n}", "kernel {w} {{", "}}",
    "kernel {w} extends {w} {{",
]

positions = st.integers(min_value=0, max_value=10**6)  # taken modulo the text's length

MUTATION = st.one_of(
    st.tuples(st.just("delete"), positions, st.integers(1, 8)),
    st.tuples(st.just("duplicate"), positions, st.integers(1, 8)),
    st.tuples(st.just("swap"), positions),
    st.tuples(st.just("insert_char"), positions, st.sampled_from(CHARACTERS)),
    st.tuples(st.just("number"), positions, st.sampled_from(NUMBERS)),
    st.tuples(st.just("word"), positions, st.sampled_from(WORDS)),
    st.tuples(st.just("delete_line"), positions),
    st.tuples(st.just("insert_line"), positions, st.sampled_from(SETTING_LINES),
              st.lists(st.sampled_from(NUMBERS[:-1]), min_size=6, max_size=6),
              st.lists(st.sampled_from(WORDS), min_size=3, max_size=3)),
)


def mutate(text: str, mutation: tuple) -> str:
    kind, at = mutation[0], mutation[1]
    if kind in ("delete", "duplicate", "swap", "insert_char"):
        i = at % (len(text) + 1)
        if kind == "delete":
            return text[:i] + text[i + mutation[2]:]
        if kind == "duplicate":
            return text[:i] + text[i:i + mutation[2]] + text[i:]
        if kind == "swap":
            return text[:i] + text[i + 1:i + 2] + text[i:i + 1] + text[i + 2:]
        return text[:i] + mutation[2] + text[i:]
    if kind in ("number", "word"):
        pattern = r"\d+" if kind == "number" else r"[A-Za-z_][A-Za-z0-9_]*|[{},;#]"
        matches = list(re.finditer(pattern, text))
        if not matches:
            return text
        m = matches[at % len(matches)]
        return text[:m.start()] + mutation[2] + text[m.end():]
    lines = text.split("\n")
    if kind == "delete_line":
        del lines[at % len(lines)]
        return "\n".join(lines)
    template, numbers, words = mutation[2], iter(mutation[3]), iter(mutation[4])
    line = re.sub(r"\{([nw])\}", lambda m: next(numbers) if m.group(1) == "n" else next(words),
                  template).replace("{{", "{").replace("}}", "}")
    lines.insert(at % (len(lines) + 1), "  " + line)
    return "\n".join(lines)


def assert_good_report(err: SpecError, text: str, path: Path) -> None:
    """The error names a place in the right file, quotes that line with a caret, and hints."""
    assert type(err) is SpecError
    assert err.message and err.allowed, str(err)
    report = str(err)
    assert report.startswith(err.path), report
    assert err.span is not None, report
    source = text if err.path == str(path) else Path(err.path).read_text()
    lines = source.split("\n")
    assert 1 <= err.line <= len(lines), report
    assert err.span.column >= 1 and err.span.end_column > err.span.column, report
    shown = "".join(ch if ch.isprintable() else " " for ch in lines[err.line - 1].rstrip("\r"))
    quote = f"{err.line:5d} | {shown}"
    rendered = report.split("\n")
    assert quote in rendered, report
    caret = rendered[rendered.index(quote) + 1]
    assert re.fullmatch(r" {6}\| {%d}\^+" % err.column, caret), report


def build(text: str, path: Path) -> None:
    """parse → make_plan → generate, as `gemmgen build` would, on a few points of a search space."""
    for spec in parse(text, str(path)):
        if spec.is_concrete:
            candidates = [spec]
        else:
            with pytest.raises(SpecError) as info:
                make_plan(spec)
            assert_good_report(info.value, text, path)
            candidates = list(islice(spec.points(), 4))
        for point in candidates:
            plan, error = try_plan(point)
            if error is not None:
                assert_good_report(error, text, path)
            else:
                source = generate(plan)
                assert plan.launcher_name in source


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.stem for p in SPEC_FILES])
def test_unmutated_specs_build(path):
    build(path.read_text(), path)


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(path=st.sampled_from(SPEC_FILES), mutations=st.lists(MUTATION, min_size=1, max_size=4))
def test_mutated_specs_raise_nothing_but_spec_error(path, mutations):
    text = path.read_text()
    for mutation in mutations:
        text = mutate(text, mutation)
    try:
        build(text, path)
    except SpecError as err:
        assert_good_report(err, text, path)
