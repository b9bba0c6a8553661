"""A search space's size is the product of its sets' sizes, and it is checked before a single point
is made: a space, or a library member, past the limit is a SpecError at its largest set, at once
(not after planning 200,000 points, and not hours into planning 10^11), in every verb that
expands spaces (tune, replay, build --from-db; build, explain and tune of a library)."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import gemmgen.cli.common
from gemmgen.cli import main
from gemmgen.language.errors import SpecError
from gemmgen.library.model import MAX_LISTED_MEMBERS
from gemmgen.library.resolve import load_libraries
from gemmgen.plan.space import MAX_POINTS, check_size, expand, size
from gemmgen.language.load import load, parse
from gemmgen.tuning.tune import best_recorded, tune
from gemmgen.gpu.verify import Case

# 4^7 x 2^2 x 3^2 x 4 x 5 = 11,796,480 points; its largest set (5 values) is split's, line 8
BIG = """kernel big {
  block {32,64,128,256} x {32,64,128,256} x {8,16,32,64}
  warp {16,32,64,128} x {16,32,64,128}
  thread {1,2,4,8} x {1,2,4,8} repeat {1,2} x {1,2}
  load A vector {1,2,4}
  load B vector {1,2,4}
  stages {1,2,3,4} async
  split {1,2,4,8,16}
}
"""
BIG_POINTS = 11_796_480
# 10^10 x 8 = 8 x 10^10 points as a library member in the library's layout
HUGE = """kernel huge {
  target sm_80
  block {16,32,64,128,256,512,1024,2048,4096,8192} x {16,32,64,128,256,512,1024,2048,4096,8192} x {1,2,4,8,16,32,64,128,256,512}
  warp {16,32,64,128,256,512,1024,2048,4096,8192} x {16,32,64,128,256,512,1024,2048,4096,8192}
  thread {1,2,3,4,5,6,7,8,9,10} x {1,2,3,4,5,6,7,8,9,10} repeat {1,2,3,4,5,6,7,8,9,10} x {1,2,3,4,5,6,7,8,9,10}
  stages {1,2,3,4,5,6,7,8} async
  split {1,2,3,4,5,6,7,8,9,10}
}
"""
PORTABLE = """kernel portable {
  target sm_80
  layout A row, B col, C row
  block 64 x 64 x 32
  warp 32 x 32
  math 3xtf32
  stages 3 async
}
"""


def library(*members: str) -> str:
    return f"library L {{\n  layout A row, B col, C row\n  members {', '.join(members)}\n  shapes 64x64x64\n}}\n"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_refused_quickly(result, started: float, *lines: str) -> None:
    assert time.perf_counter() - started < 5.0, "the size must be checked before the points are made"
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    for line in lines:
        assert line in result.output, result.output


# --- the count ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [BIG, PORTABLE, "kernel s {\n  block {64, 128} x {32, 64, 96} x 8\n"
                                  "  thread 4 x {2, 4}\n  epilogue alpha beta {direct, staged}\n}\n"])
def test_size_is_the_number_of_points(text):
    (spec,) = parse(text, "t.gemm")
    expected = 1
    for key in spec.set_keys:
        expected *= len(spec.params[key].values)
    assert size(spec) == expected
    if expected < 1000:
        assert size(spec) == sum(1 for _ in spec.points())


def test_a_space_over_the_limit_is_refused_at_its_largest_set_before_any_point():
    (spec,) = parse(BIG, "big.gemm")
    started = time.perf_counter()
    with pytest.raises(SpecError) as info:
        expand(spec)
    assert time.perf_counter() - started < 0.1
    err = info.value
    assert (err.path, err.line, err.column) == ("big.gemm", 8, 9)  # split's set, the largest
    assert err.message == (f"kernel 'big' is a search space of {BIG_POINTS:,} points (4 x 4 x 4 x 4 x 4 x 4 x 4 "
                           "x 2 x 2 x 3 x 3 x 4 x 5 values in its 13 sets), over the limit of 200,000")
    assert err.allowed == ("at most 200,000 points: fewer values in the sets (this one has 5), or several "
                           "smaller spaces")
    assert "    8 |   split {1,2,4,8,16}" in str(err)


def test_the_limit_is_exact():
    (spec,) = parse("kernel s {\n  block {64, 128} x {32, 64, 96} x 8\n  thread 4 x 4\n}\n", "t.gemm")
    assert check_size(spec, limit=6) == 6
    assert expand(spec, limit=6).total == 6
    with pytest.raises(SpecError, match="search space of 6 points .* over the limit of 5"):
        expand(spec, limit=5)
    assert MAX_POINTS == 200_000


def test_the_largest_set_of_an_inherited_space_is_pointed_at_in_its_file(tmp_path):
    (tmp_path / "big.gemm").write_text(BIG)
    child = tmp_path / "child.gemm"
    child.write_text("kernel child extends big {\n  raster group 8\n}\n")
    (spec,) = load(child)
    with pytest.raises(SpecError) as info:
        expand(spec)
    assert (info.value.path, info.value.line) == (str(tmp_path / "big.gemm"), 8)
    assert "kernel 'child' is a search space of 11,796,480 points" in info.value.message


def test_tune_and_build_from_db_refuse_before_any_gpu_work(tmp_path):
    (spec,) = parse(BIG, "big.gemm")
    started = time.perf_counter()
    with pytest.raises(SpecError, match="over the limit of 200,000"):
        tune(spec, Case(64, 64, 64), db=tmp_path / "t.jsonl")
    with pytest.raises(SpecError, match="over the limit of 200,000"):
        best_recorded(spec, tmp_path / "t.jsonl")
    assert time.perf_counter() - started < 0.5
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize("verb", ["replay", "tune", "build"])
def test_verbs_refuse_a_space_over_the_limit_at_once(tmp_path, monkeypatch, verb):
    monkeypatch.setattr(gemmgen.cli.common, "require_gpu", lambda: None)  # tune checks before any GPU work
    path = tmp_path / "big.gemm"
    path.write_text(BIG)
    db = tmp_path / "t.jsonl"
    db.write_text("")
    extra = {"replay": ["--shape", "64x64x64", "--db", db], "tune": ["--db", db, "--shapes", "64x64x64"],
             "build": ["--from-db", db, "-o", tmp_path / "out"]}[verb]
    started = time.perf_counter()
    result = invoke(verb, path, *extra)
    assert_refused_quickly(result, started, f"{path}:8:9: kernel 'big' is a search space of 11,796,480 points",
                           "over the limit of 200,000")
    assert db.read_text() == "" and not (tmp_path / "out").exists()


# --- library members ---------------------------------------------------------------------------------

def test_a_huge_member_is_refused_at_its_largest_set(tmp_path):
    path = tmp_path / "lib.gemm"
    path.write_text(HUGE + PORTABLE + library("portable", "huge"))
    started = time.perf_counter()
    with pytest.raises(SpecError) as info:
        load_libraries(path)
    assert time.perf_counter() - started < 1.0
    err = info.value
    assert (err.path, err.line, err.column) == (str(path), 3, 9)  # the first of its largest sets: block M
    assert err.message.startswith("member 'huge' of library 'L' is a search space of 80,000,000,000 points")


def test_a_member_from_another_file_is_pointed_at_in_that_file(tmp_path):
    (tmp_path / "huge.gemm").write_text(HUGE)
    path = tmp_path / "lib.gemm"
    path.write_text(PORTABLE + library("portable", "huge"))
    with pytest.raises(SpecError) as info:
        load_libraries(path)
    assert (info.value.path, info.value.line) == (str(tmp_path / "huge.gemm"), 3)


def test_members_over_the_limit_in_all_are_refused_at_the_member_past_it(tmp_path):
    # two spaces of 150,000 points: each under the limit, together over it
    space = ("kernel {name} {{\n  target sm_80\n  block {{" + ",".join(str(16 * i) for i in range(1, 51))
             + "}} x {{" + ",".join(str(16 * i) for i in range(1, 51)) + "}} x {{8,16,32,64,128,256}}\n"
             "  thread {{1,2,4,8,16,32,64,128,256,512}} x 4\n}}\n")
    path = tmp_path / "lib.gemm"
    path.write_text(space.format(name="a") + space.format(name="b") + PORTABLE + library("a", "portable", "b"))
    started = time.perf_counter()
    with pytest.raises(SpecError) as info:
        load_libraries(path)
    assert time.perf_counter() - started < 1.0
    err = info.value
    members_line = path.read_text().split("\n").index("  members a, portable, b") + 1
    assert (err.line, err.column) == (members_line, 24)  # at its name, b
    assert "the members of library 'L' up to 'b' hold 300,001 points in all, over the limit of 200,000" in err.message


def test_a_library_naming_too_many_members_is_refused(tmp_path):
    names = [f"m{i}" for i in range(MAX_LISTED_MEMBERS + 1)]
    path = tmp_path / "lib.gemm"
    path.write_text(PORTABLE + library("portable", *names[1:]))
    with pytest.raises(SpecError, match=f"names {MAX_LISTED_MEMBERS + 1} members, more than {MAX_LISTED_MEMBERS}"):
        load_libraries(path)


@pytest.mark.parametrize("verb", ["build", "explain", "tune"])
def test_verbs_refuse_a_library_with_a_huge_member_at_once(tmp_path, monkeypatch, verb):
    # the issue: build, explain and tune ran on past 60 s, at 440 MB and growing
    monkeypatch.setattr(gemmgen.cli.common, "require_gpu", lambda: None)
    path = tmp_path / "lib.gemm"
    path.write_text(HUGE + PORTABLE + library("portable", "huge"))
    extra = {"build": ["--from-db", path, "-o", tmp_path / "out"], "tune": ["--db", tmp_path / "t.jsonl"]}
    started = time.perf_counter()
    result = invoke(verb, path, *extra.get(verb, []))
    assert_refused_quickly(result, started, f"{path}:3:9: member 'huge' of library 'L' is a search space of "
                           "80,000,000,000 points")
    assert not (tmp_path / "out").exists() and not (tmp_path / "t.jsonl").exists()


def test_the_shipped_spaces_and_libraries_are_under_the_limit():
    root = Path(__file__).resolve().parent.parent / "specs"
    sizes = [size(spec) for path in sorted(root.glob("*.gemm")) for spec in load(path)]
    assert max(sizes) < MAX_POINTS
    for name in ("fp32", "tf32"):
        load_libraries(root / f"{name}.gemm")


def test_size_does_not_make_points():
    (spec,) = parse(HUGE, "huge.gemm")
    started = time.perf_counter()
    assert size(spec) == 80_000_000_000
    assert time.perf_counter() - started < 0.01
    assert list(itertools.islice(spec.points(), 2))  # points() stays lazy for samplers
