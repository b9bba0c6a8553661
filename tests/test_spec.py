"""The spec language as a user writes it: parsing, `extends`, search sets, load_one."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gemmgen.language.errors import SpecError
from gemmgen.plan import make_plan
from gemmgen.language.load import load, load_file, load_one, parse
from gemmgen.language.spec import SETTINGS, Spec

SPECS_DIR = Path(__file__).resolve().parent.parent / "specs"
SPEC_FILES = sorted(SPECS_DIR.glob("*.gemm"))

BASE = """\
kernel base {
  target   sm_80
  block    128 x 128 x 8
  thread   8 x 8 repeat 1 x 1
  load A   vector 4 transpose
  load B   vector 4
  shared A pad 4
  stages   2 sync
}
"""


def values(spec: Spec) -> dict:
    """Every setting of a spec as its candidate values (written or default)."""
    return {key: spec.param(key).values for key in SETTINGS}


# --- every shipped spec ------------------------------------------------------------------

def test_there_are_shipped_specs():
    assert len(SPEC_FILES) >= 10


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.stem for p in SPEC_FILES])
def test_every_shipped_spec_parses(path):
    specs = load(path)
    assert specs, "a spec file defines at least one kernel"
    for spec in specs:
        assert spec.path == str(path)
        assert spec.text == path.read_text()
        assert spec.span is not None and spec.span.line >= 1
        assert spec.source.lstrip().startswith(f"kernel {spec.name}")
        assert spec.written("block.m") or spec.written("decode.columns"), \
            "every shipped kernel has a block tile (or is a decode kernel)"


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.stem for p in SPEC_FILES])
def test_shipped_kernel_is_named_like_its_file(path):
    """A file is named after its kernel, or after its library (fp32.gemm holds library fp32)."""
    parsed = load_file(path)
    assert path.stem in [spec.name for spec in parsed.kernels] + [lib.name for lib in parsed.libraries]


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.stem for p in SPEC_FILES])
def test_every_concrete_shipped_spec_plans(path):
    for spec in load(path):
        if spec.is_concrete:
            plan = make_plan(spec)
            assert plan.threads % 32 == 0


# --- extends -----------------------------------------------------------------------------

def test_extends_merges_a_parent_in_the_same_file():
    child, = [s for s in parse(BASE + "kernel child extends base {\n  raster group 4\n}\n")
              if s.name == "child"]
    assert child.parent == "base"
    assert child["target"] == "sm_80"
    assert (child["block.m"], child["block.n"], child["block.k"]) == (128, 128, 8)
    assert child["load.A.vector"] == 4 and child["load.A.transpose"] is True
    assert child["stages"] == 2
    assert child["raster.group"] == 4


def test_extends_may_name_a_kernel_defined_later_in_the_file():
    text = "kernel child extends base {\n  raster group 4\n}\n" + BASE
    child = parse(text)[0]
    assert child.name == "child"
    assert child["block.m"] == 128 and child["raster.group"] == 4


def test_parse_returns_kernels_in_file_order_with_parents_resolved():
    text = BASE + "kernel b extends base {\n  raster group 2\n}\nkernel c extends b {\n  occupancy 1\n}\n"
    specs = parse(text)
    assert [s.name for s in specs] == ["base", "b", "c"]
    c = specs[2]
    assert c.parent == "b"
    assert c["raster.group"] == 2 and c["occupancy"] == 1 and c["block.m"] == 128


def test_extends_loads_name_gemm_beside_the_file(tmp_path):
    (tmp_path / "base.gemm").write_text(BASE)
    child_path = tmp_path / "child.gemm"
    child_path.write_text("kernel child extends base {\n  stages 1\n}\n")
    child = load_one(child_path)
    assert child.parent == "base"
    assert child["block.m"] == 128 and child["target"] == "sm_80"
    assert child["stages"] == 1


def test_extends_loads_grandparents_through_sibling_files(tmp_path):
    (tmp_path / "base.gemm").write_text(BASE)
    (tmp_path / "mid.gemm").write_text("kernel mid extends base {\n  raster group 8\n}\n")
    (tmp_path / "leaf.gemm").write_text("kernel leaf extends mid {\n  occupancy 1\n}\n")
    leaf = load_one(tmp_path / "leaf.gemm")
    assert (leaf["block.m"], leaf["raster.group"], leaf["occupancy"]) == (128, 8, 1)
    make_plan(leaf)


def test_a_cycle_of_sibling_files_is_a_spec_error(tmp_path):
    (tmp_path / "a.gemm").write_text("kernel a extends b {\n  block 32 x 32 x 1\n}\n")
    (tmp_path / "b.gemm").write_text("kernel b extends a {\n  thread 1 x 1\n}\n")
    with pytest.raises(SpecError) as info:
        load(tmp_path / "a.gemm")
    err = info.value
    assert err.path == str(tmp_path / "b.gemm")
    assert (err.line, err.column) == (1, 18)
    assert "a.gemm -> b.gemm -> a.gemm" in err.message
    assert err.allowed == "a chain of files without loops"


def test_a_parent_file_that_cannot_be_read_is_a_spec_error(tmp_path):
    (tmp_path / "base.gemm").write_bytes(b"\xff\xfe kernel base {}")
    (tmp_path / "child.gemm").write_text("kernel child extends base {\n  thread 1 x 1\n}\n")
    with pytest.raises(SpecError) as info:
        load(tmp_path / "child.gemm")
    assert "is not UTF-8 text" in info.value.message
    assert (info.value.line, info.value.column) == (1, 22)


def test_an_error_in_a_parent_file_is_reported_in_that_file(tmp_path):
    (tmp_path / "base.gemm").write_text("kernel base {\n  blok 1 x 1 x 1\n}\n")
    (tmp_path / "child.gemm").write_text("kernel child extends base {\n  thread 1 x 1\n}\n")
    with pytest.raises(SpecError) as info:
        load(tmp_path / "child.gemm")
    assert info.value.path == str(tmp_path / "base.gemm")
    assert (info.value.line, info.value.column) == (2, 3)


def test_a_parent_file_without_the_kernel_is_a_spec_error(tmp_path):
    (tmp_path / "base.gemm").write_text("kernel other {\n  block 32 x 32 x 1\n}\n")
    (tmp_path / "child.gemm").write_text("kernel child extends base {\n  thread 1 x 1\n}\n")
    with pytest.raises(SpecError) as info:
        load(tmp_path / "child.gemm")
    assert "extends 'base'" in info.value.message


def test_shipped_child_spec_takes_its_parents_settings():
    vectorized = load_one(SPECS_DIR / "vectorized.gemm")
    blocktile_2d = load_one(SPECS_DIR / "blocktile_2d.gemm")
    assert vectorized.parent == "blocktile_2d"
    for key in ("block.m", "block.n", "block.k", "thread.m", "thread.n", "target", "stages"):
        assert vectorized[key] == blocktile_2d[key], key
    assert vectorized["load.A.vector"] == 4 and blocktile_2d["load.A.vector"] == 1


def test_a_parent_in_the_same_file_wins_over_a_sibling_file(tmp_path):
    (tmp_path / "base.gemm").write_text(BASE)
    text = "kernel base {\n  block 32 x 32 x 4\n}\nkernel child extends base {\n  stages 1\n}\n"
    (tmp_path / "child.gemm").write_text(text)
    child = load_one(tmp_path / "child.gemm", "child")
    assert child["block.m"] == 32


def test_child_setting_replaces_parents_line():
    text = BASE + "kernel child extends base {\n  block 64 x 32 x 16\n}\n"
    child = parse(text)[1]
    assert (child["block.m"], child["block.n"], child["block.k"]) == (64, 32, 16)
    assert child["thread.m"] == 8, "lines the child does not restate are kept"


def test_child_line_replaces_the_whole_parent_line_including_its_options():
    # `thread 4 x 4` in the child means repeat 1 x 1, whatever the parent's repeat was, and
    # `load A vector 4` means no transpose: a line is replaced, not merged option by option.
    parent = "kernel p {\n  block 64 x 64 x 16\n  thread 4 x 4 repeat 2 x 2\n  load A vector 4 transpose\n}\n"
    child = parse(parent + "kernel c extends p {\n  thread 4 x 4\n  load A vector 4\n}\n")[1]
    assert (child["repeat.m"], child["repeat.n"]) == (1, 1)
    assert child["load.A.transpose"] is False


def test_child_settings_point_at_the_childs_line():
    text = BASE + "kernel child extends base {\n  block 64 x 32 x 16\n}\n"
    child = parse(text)[1]
    assert child.param("block.m").span.line == BASE.count("\n") + 2
    assert child.param("target").span.line == 2  # inherited: the parent's line


def test_extends_does_not_change_the_parent():
    base, child = parse(BASE + "kernel child extends base {\n  block 64 x 32 x 16\n}\n")
    assert base["block.m"] == 128
    assert child["block.m"] == 64


def test_error_in_an_inherited_setting_points_into_the_parents_file(tmp_path):
    base_path = tmp_path / "base.gemm"
    base_path.write_text(
        "kernel base {\n  block 128 x 128 x 16\n  warp 64 x 64\n  thread 8 x 4 repeat 1 x 4\n}\n")
    (tmp_path / "child.gemm").write_text("kernel child extends base {\n  raster group 8\n}\n")
    child = load_one(tmp_path / "child.gemm")
    make_plan(child)
    # Both settings the error names (thread.m, warp.m) were written in base.gemm.
    with pytest.raises(SpecError) as info:
        make_plan(child.with_values(warp_m=32))
    err = info.value
    assert err.path == str(base_path)
    assert (err.line, err.column) == (4, 10)
    assert f"kernel 'child' inherits this setting from {base_path}" in err.message
    assert "    4 |   thread 8 x 4 repeat 1 x 4\n" in str(err)


def test_error_prefers_a_key_written_in_the_childs_own_file(tmp_path):
    (tmp_path / "base.gemm").write_text(
        "kernel base {\n  block 128 x 128 x 16\n  warp 64 x 64\n  thread 8 x 4 repeat 1 x 4\n}\n")
    child_path = tmp_path / "child.gemm"
    child_path.write_text("kernel child extends base {\n  warp 32 x 64\n}\n")
    with pytest.raises(SpecError) as info:
        make_plan(load_one(child_path))
    err = info.value
    assert err.path == str(child_path)
    assert (err.line, err.column) == (2, 8)
    assert "    2 |   warp 32 x 64" in str(err)


# --- search sets -------------------------------------------------------------------------

def test_a_set_of_two_values_gives_two_points():
    spec, = parse("kernel k {\n  block {64, 128} x 64 x 8\n  thread 4 x 4\n}\n")
    assert not spec.is_concrete
    assert spec.set_keys == ["block.m"]
    points = list(spec.points())
    assert [p["block.m"] for p in points] == [64, 128]
    assert all(p.is_concrete for p in points)


def test_points_are_the_product_of_the_sets_in_the_order_written():
    spec, = parse("kernel k {\n  block {64, 128} x {32, 64, 128} x 8\n  stages {1, 2}\n}\n")
    points = list(spec.points())
    assert len(points) == 2 * 3 * 2
    combos = [(p["block.m"], p["block.n"], p["stages"]) for p in points]
    assert combos[:3] == [(64, 32, 1), (64, 32, 2), (64, 64, 1)]
    assert len(set(combos)) == len(combos)


def test_a_concrete_spec_is_its_only_point():
    spec = load_one(SPECS_DIR / "warptile.gemm")
    assert spec.is_concrete
    points = list(spec.points())
    assert len(points) == 1 and values(points[0]) == values(spec)


def test_shipped_search_space_has_the_product_of_its_set_sizes():
    spec = load_one(SPECS_DIR / "warptile_search.gemm")
    sizes = [len(spec.param(key).values) for key in spec.set_keys]
    assert math.prod(sizes) == sum(1 for _ in spec.points())
    # block 3x3x3, warp 2x2, thread 2, repeat 2x3, A via copy or registers, stages 2, raster 2
    assert math.prod(sizes) == 27 * 4 * 2 * 6 * 2 * 2 * 2


def test_a_point_keeps_the_span_of_its_set():
    spec, = parse("kernel k {\n  block {64, 128} x 64 x 8\n}\n")
    for point in spec.points():
        assert point.param("block.m").span == spec.param("block.m").span


def test_indexing_a_set_is_a_spec_error():
    spec, = parse("kernel k {\n  block {64, 128} x 64 x 8\n}\n")
    with pytest.raises(SpecError) as info:
        spec["block.m"]
    assert (info.value.line, info.value.column) == (2, 9)


def test_a_one_value_set_is_one_value():
    spec, = parse("kernel k {\n  block {64} x 64 x 8\n}\n")
    assert spec.is_concrete and spec["block.m"] == 64


def test_a_set_of_words_is_a_search_space():
    spec, = parse("kernel k {\n  block 64 x 64 x 8\n  stages 2 {sync, async}\n  load A transpose {on, off}\n}\n")
    assert set(spec.set_keys) == {"stages.fill", "load.A.transpose"}
    assert sum(1 for _ in spec.points()) == 4
    assert spec.param("load.A.transpose").values == (True, False)


# --- with_values -------------------------------------------------------------------------

def test_with_values_fixes_settings_and_leaves_the_original():
    spec = load_one(SPECS_DIR / "warptile.gemm")
    other = spec.with_values(block_m=64, layout_A="col", load_A_vector=2, stages_fill="async")
    assert (other["block.m"], other["layout.A"], other["load.A.vector"], other["stages.fill"]) == \
        (64, "col", 2, "async")
    assert spec["block.m"] == 128 and spec["layout.A"] == "row"
    assert other.name == spec.name and other.text == spec.text


def test_with_values_keeps_the_span_of_the_written_setting():
    spec = load_one(SPECS_DIR / "warptile.gemm")
    assert spec.with_values(block_m=64).param("block.m").span == spec.param("block.m").span


def test_with_values_makes_a_set_concrete():
    spec = load_one(SPECS_DIR / "warptile_search.gemm")
    fixed = {key.replace(".", "_"): spec.param(key).values[0] for key in spec.set_keys}
    point = spec.with_values(**fixed)
    assert point.is_concrete
    assert values(point) == values(next(spec.points()))


def test_with_values_sets_a_default_setting():
    spec, = parse("kernel k {\n  block 64 x 64 x 8\n}\n")
    assert not spec.written("occupancy")
    assert spec.with_values(occupancy=2)["occupancy"] == 2


def test_with_values_rejects_an_unknown_name():
    spec = load_one(SPECS_DIR / "warptile.gemm")
    with pytest.raises(KeyError):
        spec.with_values(blockm=64)


# --- layout of the text: comments, separators, whitespace ------------------------------

MULTILINE = """\
kernel k {
  block 32 x 32 x 1
  thread 1 x 1
  shared off
}
"""


def test_semicolons_separate_settings_like_newlines():
    one_line, = parse("kernel k { block 32 x 32 x 1; thread 1 x 1; shared off }")
    assert values(one_line) == values(parse(MULTILINE)[0])


def test_a_trailing_semicolon_is_allowed():
    spec, = parse("kernel k { block 32 x 32 x 1; thread 1 x 1; shared off; }")
    assert spec["shared"] is False


def test_comments_are_ignored_everywhere():
    text = """\
# a comment before the kernel

kernel k {   # after the brace
  # a comment line inside
  block 32 x 32 x 1   # after a setting

  thread 1 x 1
  shared off
}  # after the closing brace
# a comment at the end"""
    assert values(parse(text)[0]) == values(parse(MULTILINE)[0])


def test_tabs_and_crlf_line_ends_parse_like_spaces_and_lf():
    text = MULTILINE.replace("  ", "\t").replace("\n", "\r\n")
    assert values(parse(text)[0]) == values(parse(MULTILINE)[0])


def test_a_file_need_not_end_in_a_newline():
    assert values(parse(MULTILINE.rstrip("\n"))[0]) == values(parse(MULTILINE)[0])


def test_leading_zeros_are_decimal():
    spec, = parse("kernel k {\n  block 064 x 0032 x 08\n}\n")
    assert (spec["block.m"], spec["block.n"], spec["block.k"]) == (64, 32, 8)


def test_kernel_source_is_the_kernels_own_lines():
    text = "# header\n" + MULTILINE + "\n# trailer\n"
    spec, = parse(text)
    assert spec.source == MULTILINE.rstrip("\n")


def test_lines_are_counted_like_the_parser_counts_them():
    # A form feed inside a comment is not a line break: the kernel's source and its spans
    # still agree with the text split at '\n'.
    text = "# page one\x0cpage two\n" + MULTILINE
    spec, = parse(text)
    assert spec.span.line == 2
    assert spec.source == MULTILINE.rstrip("\n")


def test_settings_left_out_take_their_defaults():
    spec, = parse("kernel k {\n  block 64 x 64 x 8\n}\n")
    for key, setting in SETTINGS.items():
        if key.startswith("block."):
            continue
        assert spec[key] == setting.default, key
    assert spec["layout.A"] == spec["layout.B"] == spec["layout.C"] == "row"


def test_transpose_alone_means_on():
    spec, = parse("kernel k {\n  block 64 x 64 x 8\n  load A transpose\n  load B transpose off\n}\n")
    assert spec["load.A.transpose"] is True and spec["load.B.transpose"] is False


def test_epilogue_alpha_drops_beta_and_raster_row_is_group_one():
    spec, = parse("kernel k {\n  block 64 x 64 x 8\n  epilogue alpha\n  raster row\n}\n")
    assert spec["epilogue.beta"] is False and spec["raster.group"] == 1


def test_layout_line_sets_each_operand_named():
    spec, = parse("kernel k {\n  block 64 x 64 x 8\n  layout B col, C col\n}\n")
    assert (spec["layout.A"], spec["layout.B"], spec["layout.C"]) == ("row", "col", "col")


# --- several kernels per file ------------------------------------------------------------

TWO = MULTILINE + "\nkernel j {\n  block 64 x 64 x 8\n  thread 4 x 4\n}\n"


def test_a_file_may_hold_several_kernels():
    specs = parse(TWO)
    assert [s.name for s in specs] == ["k", "j"]
    assert specs[0]["shared"] is False and specs[1]["shared"] is True
    assert specs[1].span.line == MULTILINE.count("\n") + 2
    for spec in specs:
        make_plan(spec)


def test_kernels_may_share_a_line():
    specs = parse("kernel a { block 32 x 32 x 1 } kernel b { block 64 x 64 x 1 }")
    assert [(s.name, s["block.m"]) for s in specs] == [("a", 32), ("b", 64)]


def test_kernels_of_one_file_do_not_share_settings():
    k, j = parse(TWO)
    assert k["shared"] is False and not j.written("shared")
    assert j["thread.m"] == 4 and k["thread.m"] == 1


# --- load and load_one -------------------------------------------------------------------

def test_load_one_returns_the_only_kernel():
    spec = load_one(SPECS_DIR / "naive.gemm")
    assert spec.name == "naive"


def test_load_one_picks_a_kernel_by_name(tmp_path):
    path = tmp_path / "two.gemm"
    path.write_text(TWO)
    assert load_one(path, "j").name == "j"
    assert load_one(path, "k").name == "k"


def test_load_one_of_a_several_kernel_file_needs_a_name(tmp_path):
    path = tmp_path / "two.gemm"
    path.write_text(TWO)
    with pytest.raises(SpecError) as info:
        load_one(path)
    assert "several kernels" in info.value.message
    assert info.value.allowed == "k, j"
    assert info.value.path == str(path)


def test_load_one_of_an_unknown_name_lists_the_names(tmp_path):
    path = tmp_path / "two.gemm"
    path.write_text(TWO)
    with pytest.raises(SpecError) as info:
        load_one(path, "nope")
    assert "'nope'" in info.value.message
    assert info.value.allowed == "k, j"


def test_load_of_a_missing_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError) as info:
        load_one(tmp_path / "missing.gemm")
    assert "cannot read spec" in str(info.value)
    assert str(tmp_path / "missing.gemm") in str(info.value)


def test_load_of_a_directory_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError) as info:
        load(tmp_path)
    assert "cannot read spec" in str(info.value)


def test_load_of_binary_data_is_a_spec_error(tmp_path):
    path = tmp_path / "bin.gemm"
    path.write_bytes(b"\xff\xfe\x00kernel")
    with pytest.raises(SpecError) as info:
        load(path)
    assert "UTF-8" in str(info.value)


def test_load_one_accepts_str_paths():
    assert load_one(str(SPECS_DIR / "naive.gemm")).name == "naive"


def test_a_parse_error_reports_the_files_path(tmp_path):
    path = tmp_path / "bad.gemm"
    path.write_text("kernel k {\n  blok 1 x 1 x 1\n}\n")
    with pytest.raises(SpecError) as info:
        load_one(path)
    assert str(info.value).startswith(f"{path}:2:3: ")
