"""Property: whatever spec a user writes, gemmgen answers with a kernel or a clean SpecError, soon.

Two sources of specs:
- mutations of the shipped specs (specs/*.gemm, libraries included): characters deleted,
  duplicated or swapped, numbers and words replaced, lines deleted or inserted, then parsed with
  their real path (so `extends`, members and the shapes file are found beside them);
- specs generated from the grammar (gemmgen/grammar.lark): kernels of any settings with values
  in and out of their domains and small search sets, parents in the same file or in sibling
  files (loops included), libraries with members, inline shapes or a shapes file (in range or
  not, inside the spec's folder or not).

Each is taken through what `gemmgen build`, `explain` and `tune` do before any GPU work: parse,
plan every kernel and generate its CUDA, count and expand (or sample) every search space, resolve
every library. Nothing but SpecError may escape, within DEADLINE, and every SpecError names its
file, quotes the line it names with a caret, and says what is allowed. Deterministic
(derandomized, no example database), a few hundred examples in all.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from datetime import timedelta
from itertools import islice
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemmgen.codegen.cuda import generate
from gemmgen.gpu.compile import Resources
from gemmgen.language.errors import SpecError
from gemmgen.explain.report import as_dict, explain, render_text
from gemmgen.library.resolve import resolve
from gemmgen.plan import make_plan, try_plan
from gemmgen.plan.space import describe, expand, size, to_text
from gemmgen.language.load import parse, parse_file
from gemmgen.language.spec import SETTINGS
from gemmgen.language.syntax import USAGE
from spec_reports import assert_good_report

ROOT = Path(__file__).resolve().parent.parent
SPEC_FILES = sorted((ROOT / "specs").glob("*.gemm"))
GRAMMAR = (ROOT / "gemmgen" / "language" / "grammar.lark").read_text()
DEADLINE = timedelta(seconds=2)  # per example: parse, plan, generate, expand, resolve
EXPANDED = 512                   # spaces up to this many points are expanded whole, larger ones sampled
RESOLVED = 2_000                 # libraries whose members hold up to this many points are resolved

FUZZ = dict(deadline=DEADLINE, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                   HealthCheck.filter_too_much])


# --- what gemmgen does with a spec before the GPU ----------------------------------------------

def source_of(err: SpecError, files: dict[str, str]) -> str:
    """The text the error points into: one the test wrote (by path), or a file on disk; without
    the byte-order mark it may start with, which gemmgen reads past (columns count after it)."""
    if err.path in files:
        return files[err.path].removeprefix("\ufeff")
    return Path(err.path).read_text(encoding="utf-8-sig", errors="replace")


def run_like_gemmgen(text: str, path: Path) -> None:
    """parse → plan → generate each kernel; count, then expand or sample each space; resolve each
    library. SpecErrors from make_plan and try_plan are checked here; the rest propagate."""
    parsed = parse_file(text, str(path))
    files = {str(path): text}
    for spec in parsed.kernels:
        if spec.is_concrete:
            plan, error = try_plan(spec)
            if error is not None:
                assert_good_report(error, source_of(error, files))
                continue
            assert plan.launcher_name in generate(plan)
            # `explain`'s report, with ptxas's numbers stood in for (no NVRTC here)
            report = explain(plan, Resources(plan.registers_estimate or 32, 0, 0, 0, 0))
            assert render_text(report) and json.dumps(as_dict(report))
            # what `tune --save` writes back is a spec of the same kernel
            (again,) = parse(to_text(spec), "<saved>")
            assert describe(make_plan(again).spec) == describe(spec)
            continue
        with pytest.raises(SpecError) as info:  # `build` of a search space says it is one
            make_plan(spec)
        assert_good_report(info.value, source_of(info.value, files))
        if size(spec) <= EXPANDED:
            space = expand(spec)
            assert space.total == size(spec) and space.valid == len(space.plans)
        else:
            expand_refused_or_sampled(spec, files)
    for library in parsed.libraries:
        if sum(size(k) for k in parsed.kernels) <= RESOLVED:
            resolve(library, parsed.kernels)


def expand_refused_or_sampled(spec, files: dict[str, str]) -> None:
    """A space past EXPANDED: refused at once at that limit, and a few of its points planned."""
    started = time.perf_counter()
    with pytest.raises(SpecError) as info:
        expand(spec, limit=EXPANDED)
    assert time.perf_counter() - started < 0.1, "the size check must come before any point is made"
    assert f"search space of {size(spec):,} points" in info.value.message, str(info.value)
    assert_good_report(info.value, source_of(info.value, files))
    for point in islice(spec.points(), 3):
        plan, error = try_plan(point)
        if error is not None:
            assert_good_report(error, source_of(error, files))


def holds_for(text: str, path: Path) -> str:
    """The property: a kernel, or a SpecError with a full report, and nothing else. Returns the
    report ('' for none)."""
    try:
        run_like_gemmgen(text, path)
    except SpecError as err:
        if err.span is not None:
            assert_good_report(err, source_of(err, {str(path): text}))
        else:  # a refusal of a whole file: it still names the file and says what would do
            assert str(err).startswith(err.path + ": ") and err.message and err.allowed, str(err)
        longest = max(len(line) for line in str(err).split("\n"))
        assert longest <= len(err.path) + 400, f"a report line of {longest} characters:\n{str(err)[:2000]}"
        return str(err)
    return ""


# --- mutations of the shipped specs ----------------------------------------------------------

# The vocabulary: the grammar's keywords, the words its values may take, kernel names.
WORDS = sorted(
    set(re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"', GRAMMAR))
    | {w for usage in USAGE.values() for w in re.findall(r"[a-z_][a-z0-9_]*", usage)}
    | {w for s in SETTINGS.values() if isinstance(s.default, str) for w in [s.default]}
    | {"row", "col", "on", "off", "xor", "sm_75", "sm_100", "A", "B", "C", "D"}
    | {path.stem for path in SPEC_FILES}
) + ["{", "}", ",", ";", "#", "x", "3xtf32", '"library_shapes.txt"', '"../README.md"', '"/dev/zero"']

NUMBERS = ["0", "00", "1", "2", "3", "4", "5", "7", "8", "12", "16", "24", "32", "33", "48", "64",
           "65", "96", "128", "255", "256", "512", "1024", "1025", "4096", "65536",
           "2147483647", "2147483648", "99999999999999999999", "9" * 5000]

CHARACTERS = ["\t", " ", "\n", "\r", "\r\n", "\x00", "\x0c", "é", "{", "}", ";", "#", ",", "x",
              "-", "0", "9", "\ufeff", '"']

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
    "kernel {w} extends {w} {{", "members {w}, {w}", "shapes {n}x{n}x{n}", "shapes {n}x{n}x{n} pad {n}",
    'shapes "{w}"', "precision {w}", "library {w} {{",
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


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.stem for p in SPEC_FILES])
def test_unmutated_specs_build(path):
    run_like_gemmgen(path.read_text(), path)


@settings(max_examples=250, **FUZZ)
@given(path=st.sampled_from(SPEC_FILES), mutations=st.lists(MUTATION, min_size=1, max_size=4))
def test_mutated_specs_raise_nothing_but_spec_error(path, mutations):
    text = path.read_text()
    for mutation in mutations:
        text = mutate(text, mutation)
    holds_for(text, path)


# --- specs generated from the grammar ----------------------------------------------------------

# Values of each kind: mostly the domain's, sometimes just outside it.
def domain(inside: list, outside: list) -> st.SearchStrategy:
    """A value of `inside` mostly, else one of `outside` (placed amid the others: Hypothesis draws
    the ends of a list more often than its middle)."""
    return st.sampled_from(inside * 4 + outside + inside * 4)


SIZES = domain([8, 16, 32, 64, 128, 256], [0, 1, 3, 12, 96, 1024, 4096, 2147483647, 2147483648])
SMALL = domain([1, 2, 4, 8], [0, 3, 9, 32, 33, 257, 1024])
OPERANDS = domain(["A", "B"], ["C"])


def value(atoms: st.SearchStrategy, sets: bool = True) -> st.SearchStrategy:
    """An atom, or (one time in four, where sets are wanted) a set of 2 or 3 distinct atoms."""
    atom = atoms.map(str)
    if not sets:
        return atom
    group = st.lists(atom, min_size=2, max_size=3, unique=True).map(lambda xs: "{" + ", ".join(xs) + "}")
    return st.one_of(atom, atom, atom, group)


def words(inside: list, outside: list = ()) -> st.SearchStrategy:
    return domain(inside, list(outside)) if outside else st.sampled_from(inside)


def setting(sets: bool) -> st.SearchStrategy:
    """One setting line of a kernel, from the grammar's statements."""
    v = lambda atoms: value(atoms, sets)  # noqa: E731
    optional = lambda strategy: st.one_of(st.just(""), strategy)  # noqa: E731
    return st.one_of(
        st.builds("target {}".format, v(words(["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"], ["sm_75"]))),
        st.builds("layout A {}, B {}, C {}".format, *[v(words(["row", "col"], ["diag"]))] * 3),
        st.builds("block {} x {} x {}".format, v(SIZES), v(SIZES), v(SIZES)),
        st.builds("warp {} x {}".format, v(SIZES), v(SIZES)),
        st.builds("thread {} x {}{}".format, v(SMALL), v(SMALL),
                  optional(st.builds(" repeat {} x {}".format, v(SMALL), v(SMALL)))),
        st.builds("order {}".format, v(words(["m", "n"], ["k"]))),
        st.builds("load {}{}{}{}{}".format, OPERANDS, optional(st.builds(" vector {}".format, v(SMALL))),
                  optional(st.one_of(st.just(" transpose"),
                                     st.builds(" transpose {}".format, v(words(["on", "off"], ["up"]))))),
                  optional(st.just(" uncoalesced")),
                  optional(st.builds(" via {}".format, v(words(["copy", "registers"], ["mail"]))))),
        st.builds("shared {} {}".format, OPERANDS,
                  st.one_of(st.builds("pad {}".format, v(SMALL)), st.just("swizzle xor"), st.just("plain"),
                            st.just("swizzle xnor"))),
        st.just("shared off"),
        st.builds("stages {}{}".format, v(SMALL),
                  optional(st.builds(" {}".format, v(words(["sync", "async", "tma"], ["dma"]))))),
        st.builds("fragments {}".format, v(SMALL)),
        st.builds("unroll {}".format, v(SMALL)),
        st.one_of(st.just("raster row"), st.builds("raster group {}".format, v(SMALL))),
        st.builds("epilogue {}{}".format, words(["alpha", "alpha beta"], ["beta", "alpha beta gamma"]),
                  words(["", " staged", " direct", " {direct, staged}"], [" {staged, hot}"])),
        st.builds("reduce {} {}".format, words(["min"], ["max"]), v(SMALL)),
        st.builds("math {}".format, v(words(["simt", "tf32", "3xtf32"], ["fp16"]))),
        st.builds("mma {} x {} x {}".format, v(SIZES), v(SIZES), v(SIZES)),
        st.builds("occupancy {}".format, v(SMALL)),
        st.builds("split {}".format, v(SMALL)),
        st.builds("schedule {}".format, v(words(["data-parallel", "persistent", "stream-k", "pingpong"],
                                                ["split-k"]))),
        st.builds("cluster {} x {}".format, v(SMALL), v(SMALL)),
        st.builds("promote {}".format, v(words([0, 32, 64], [100, 2048]))),
    )


SETTINGS_WITH_SETS, SETTINGS_WITHOUT = setting(True), setting(False)

# Kernels that plan (from the shipped specs), for the settings drawn to change: most examples
# then get past the parser and the Plan's first checks to the paths behind them.
SKELETONS = [
    ["block 64 x 64 x 8", "thread 4 x 4"],
    ["block 128 x 128 x 16", "warp 64 x 64", "thread 8 x 4 repeat 1 x 4", "load A vector 4 transpose",
     "load B vector 4", "stages 2 sync", "raster group 8"],
    ["target sm_80", "layout A row, B col, C row", "block 64 x 64 x 32", "warp 32 x 32", "math 3xtf32",
     "stages 3 async"],
    ["target sm_90a", "layout A row, B col, C row", "block 128 x 128 x 32", "math tf32", "stages 3 tma"],
    ["block 32 x 32 x 1", "thread 1 x 1", "shared off", "order m"],
]


def keyword(line: str) -> str:
    """What a line sets, so that a drawn line replaces the skeleton's line of the same setting."""
    words_ = line.split()
    return " ".join(words_[:2]) if words_[0] in ("load", "shared") and words_[1:2] != ["off"] else words_[0]


@st.composite
def kernel(draw, name: str, parents: list[str], sets: bool = True) -> str:
    parents = [p for p in parents if p != name]  # loops come through two kernels or more
    parent = draw(st.sampled_from([None, None, None, *parents, None, "nowhere", None, *parents, None]))
    lines = {keyword(line): line for line in draw(st.sampled_from(SKELETONS))}
    if parent and draw(st.booleans()):
        lines = {}  # a child often sets little of its own
    for change in draw(st.lists(st.one_of(SETTINGS_WITH_SETS if sets else SETTINGS_WITHOUT,
                                          st.sampled_from(["-" + k for k in ("block", "thread", "stages", "math")])),
                                max_size=3)):
        if change.startswith("-"):
            lines.pop(change[1:], None)
        else:
            lines[keyword(change)] = change
    head = f"kernel {name}" + (f" extends {parent}" if parent else "") + " {"
    return "\n".join([head, *(f"  {line}" for line in lines.values()), "}"]) + "\n"


SHAPE = st.builds("{}x{}x{}{}".format, SIZES, SIZES, SIZES,
                  st.one_of(st.just(""), st.just(""), st.builds(" pad {}".format, SMALL), st.just(" pad 2147483647")))
SHAPE_LINES = domain(["64x64x64", "4096x4096x4096", "127x4099x1023 pad 1", "1x1x1 # a comment"],
                     ["4096 x 4096", "0x0x0", "1" + "0" * 30 + "x1x1", "64x64x64 pad", "\u0664x\u0664x\u0664",
                      "64x64x" + "9" * 5000, "root:x:0:0:root:/root:/bin/bash " * 20])
SHAPES_FILES = words(["shapes.txt", "sub/shapes.txt", "sub/../shapes.txt"],
                     ["../shapes.txt", "/etc/passwd", "missing.txt", "folder", "", "fifo"])


@st.composite
def library(draw, kernels: list[str]) -> tuple[str, str | None]:
    """A library block naming some of `kernels` (or others), and the shapes file's text (or None)."""
    lines = []
    lines.append(draw(domain(["layout A row, B col, C row"], ["layout A col, B row, C col", ""])))
    members = draw(st.lists(words(kernels, ["nothere", "naive"]), min_size=1, max_size=3, unique=True))
    lines.append("members " + ", ".join(members))
    shapes_text = None
    if draw(st.booleans()):
        lines.append("shapes " + ", ".join(draw(st.lists(SHAPE, min_size=1, max_size=3))))
    else:
        lines.append(f'shapes "{draw(SHAPES_FILES)}"')
        shapes_text = "\n".join(draw(st.lists(SHAPE_LINES, min_size=1, max_size=5))) + "\n"
    if draw(st.integers(0, 3)) == 0:
        lines.append(f"precision {draw(words(['fp32', 'tf32'], ['bf16']))}")
    order = draw(st.permutations([line for line in lines if line]))
    return "library mylib {\n" + "".join(f"  {line}\n" for line in order) + "}\n", shapes_text


@st.composite
def spec_folder(draw) -> dict[str, str]:
    """Files of a folder: spec.gemm (kernels, maybe a library), sibling NAME.gemm parents
    (which may extend each other, or back into spec.gemm), and a shapes file."""
    files = {}
    names = draw(st.lists(st.sampled_from(["k", "leaf", "spec", "portable", "tma"]), min_size=1, max_size=2,
                          unique=True))
    siblings = draw(st.lists(st.sampled_from(["base", "mid", "far"]), max_size=2, unique=True))
    for sibling in siblings:  # base.gemm defines kernel base, and so on
        files[f"{sibling}.gemm"] = draw(kernel(sibling, ["base", "mid", "far", "spec"], sets=False))
    text = "".join(draw(kernel(name, names + siblings)) for name in names)
    if draw(st.booleans()):
        block, shapes = draw(library(names + siblings))
        text += block
        if shapes is not None:
            files["shapes.txt"] = shapes
            files["sub/shapes.txt"] = shapes
    files["spec.gemm"] = text
    return files


SECRET = "root:x:0:0:a line of a file outside the spec's folder"


def write_folder(files: dict[str, str], top: Path) -> Path:
    """The files under top/specs, with a folder and a FIFO beside them and a file in top, outside
    the spec's folder, that no error may quote. The spec's path."""
    folder = top / "specs"
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    (folder / "folder").mkdir()
    os.mkfifo(folder / "fifo")
    (top / "shapes.txt").write_text(SECRET + "\n")
    return folder / "spec.gemm"


@settings(max_examples=250, **FUZZ)
@given(files=spec_folder())
def test_generated_specs_and_libraries_raise_nothing_but_spec_error(files):
    with tempfile.TemporaryDirectory() as top:
        report = holds_for(files["spec.gemm"], write_folder(files, Path(top)))
        assert SECRET not in report, "a file outside the spec's folder was read and quoted"


def test_the_generators_reach_kernels_spaces_libraries_and_errors():
    """The grammar fuzzer is worth its time only if its examples get past the parser: over a
    fixed sample, some build, some are search spaces, some libraries resolve, and some fail."""
    outcomes = {"kernel": 0, "space": 0, "library": 0, "error": 0}

    @settings(max_examples=100, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(files=spec_folder())
    def sample(files):
        with tempfile.TemporaryDirectory() as top:
            path = write_folder(files, Path(top))
            try:
                parsed = parse_file(files["spec.gemm"], str(path))
                for spec in parsed.kernels:
                    if spec.is_concrete and try_plan(spec)[0] is not None:
                        outcomes["kernel"] += 1
                    elif not spec.is_concrete:
                        outcomes["space"] += 1
                for lib in parsed.libraries:
                    resolve(lib, parsed.kernels)
                    outcomes["library"] += 1
            except SpecError:
                outcomes["error"] += 1

    sample()
    assert all(count >= 3 for count in outcomes.values()), outcomes
