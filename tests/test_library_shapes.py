"""A library's shapes, as written in the spec or in a shapes file: range-checked at their line, and
a shapes file read only when it is a regular file, not too large, in the spec's folder (or below
it). No error repeats more than a short, cut piece of a line it did not like."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gemmgen.cli import main
from gemmgen.language.errors import QUOTE_WIDTH, SpecError
from gemmgen.language.shapes import MAX_SHAPES_BYTES, parse_shapes
from gemmgen.language.load import load_file

PORTABLE = """kernel portable {
  target sm_80
  layout A row, B col, C row
  block 64 x 64 x 32
  warp 32 x 32
  math 3xtf32
  stages 3 async
}
"""
RANGE = "M, N and K from 1 to 2147483647"


def library(folder: Path, shapes: str, name: str = "lib.gemm") -> Path:
    """A spec in `folder` whose library L has the member above and this shapes line."""
    path = folder / name
    path.write_text(PORTABLE + f"library L {{\n  layout A row, B col, C row\n  members portable\n  shapes {shapes}\n}}\n")
    return path


SHAPES_LINE = 12     # the shapes line of library()'s spec
SHAPES_COLUMN = 10   # where its value starts


def refusal(path: Path) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_file(path)
    return info.value


def assert_at_the_shapes_line(err: SpecError, path: Path, message: str) -> None:
    assert (err.path, err.line, err.column) == (str(path), SHAPES_LINE, SHAPES_COLUMN), str(err)
    assert message in err.message, str(err)
    assert err.allowed and f"{SHAPES_LINE:5d} | " in str(err)


# --- where the file may be ---------------------------------------------------------------------------

def test_a_relative_path_escaping_the_spec_folder_is_refused_and_never_read(tmp_path):
    folder = tmp_path / "a" / "b"
    folder.mkdir(parents=True)
    (tmp_path / "secret.txt").write_text("root:x:0:0:root:/root:/bin/bash\n")
    path = library(folder, '"../../secret.txt"')
    err = refusal(path)
    assert_at_the_shapes_line(err, path, "the shapes file '../../secret.txt' lies outside the spec's folder")
    assert "root:x" not in str(err)


def test_the_issue_s_passwd_path_is_refused(tmp_path):
    path = library(tmp_path, '"../../../../etc/passwd"')
    result = CliRunner().invoke(main, ["explain", str(path)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert "lies outside the spec's folder" in result.output
    assert "root:" not in result.output and "Traceback" not in result.output


def test_an_absolute_path_is_refused(tmp_path):
    (tmp_path / "shapes.txt").write_text("64x64x64\n")
    path = library(tmp_path, f'"{tmp_path / "shapes.txt"}"')
    assert_at_the_shapes_line(refusal(path), path, "is not a path relative to the spec's folder")


def test_a_symbolic_link_leading_outside_is_refused(tmp_path):
    (tmp_path / "outside.txt").write_text("64x64x64\n")
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "shapes.txt").symlink_to(tmp_path / "outside.txt")
    path = library(folder, '"shapes.txt"')
    assert_at_the_shapes_line(refusal(path), path, "the shapes file 'shapes.txt' leads outside the spec's folder")


def test_a_file_below_the_spec_folder_is_read(tmp_path):
    (tmp_path / "shapes").mkdir()
    (tmp_path / "shapes" / "a.txt").write_text("64x64x64\n128x128x128 pad 4\n")
    (lib,) = load_file(library(tmp_path, '"shapes/../shapes/a.txt"')).libraries
    assert [str(s) for s in lib.shapes] == ["64x64x64", "128x128x128 pad 4"]


# --- what the file is -----------------------------------------------------------------------------

def test_a_named_pipe_is_refused_without_waiting_for_a_writer(tmp_path):
    os.mkfifo(tmp_path / "pipe.txt")
    path = library(tmp_path, '"pipe.txt"')
    started = time.perf_counter()
    assert_at_the_shapes_line(refusal(path), path, f"cannot read the shapes file {tmp_path / 'pipe.txt'}: "
                              "this is a named pipe (FIFO), not a regular file")
    assert time.perf_counter() - started < 1.0


def test_a_device_in_the_folder_is_refused_unread(tmp_path):
    # a link inside the folder to /dev/zero leads outside it; a folder is no file either
    (tmp_path / "zero").symlink_to("/dev/zero")
    path = library(tmp_path, '"zero"')
    assert "leads outside the spec's folder" in refusal(path).message
    (tmp_path / "dir").mkdir()
    path = library(tmp_path, '"dir"')
    assert_at_the_shapes_line(refusal(path), path, "this is a folder, not a regular file")


def test_a_shapes_file_past_the_limit_is_refused_before_it_is_read(tmp_path):
    (tmp_path / "many.txt").write_text("4096x4096x4096\n" * (MAX_SHAPES_BYTES // 15 + 1))
    path = library(tmp_path, '"many.txt"')
    started = time.perf_counter()
    err = refusal(path)
    assert time.perf_counter() - started < 0.5
    assert_at_the_shapes_line(err, path, "the file is 1.0 MB, too large for a shapes file (at most 1 MB)")


def test_a_shapes_file_at_the_limit_is_read(tmp_path):
    line = "64x64x64\n"
    text = "# " + "-" * (MAX_SHAPES_BYTES - len(line) - 3) + "\n" + line
    assert len(text) == MAX_SHAPES_BYTES
    (tmp_path / "full.txt").write_text(text)
    (lib,) = load_file(library(tmp_path, '"full.txt"')).libraries
    assert [str(s) for s in lib.shapes] == ["64x64x64"]


def test_a_shapes_file_that_is_not_utf8_is_refused(tmp_path):
    (tmp_path / "bin.txt").write_bytes(b"64x64x64\n\xff\xfe\n")
    path = library(tmp_path, '"bin.txt"')
    assert_at_the_shapes_line(refusal(path), path, "the file is not UTF-8 text (byte 0xff at line 2, column 1)")


def test_windows_line_ends_and_a_byte_order_mark_are_read(tmp_path):
    (tmp_path / "win.txt").write_bytes(b"\xef\xbb\xbf64x64x64\r\n# tuned\r\n127x4099x1023 pad 1\r\n")
    (lib,) = load_file(library(tmp_path, '"win.txt"')).libraries
    assert [str(s) for s in lib.shapes] == ["64x64x64", "127x4099x1023 pad 1"]


# --- what the shapes are ----------------------------------------------------------------------------

@pytest.mark.parametrize("line, message", [
    ("0x0x0", "shape '0x0x0': M is 0: a shape's sizes are at least 1"),
    ("64x0x64", "shape '64x0x64': N is 0"),
    ("1" + "0" * 30 + "x1x1", "M is larger than 2147483647"),
    ("64x64x" + "9" * 5000, "K is larger than 2147483647"),
    ("2147483648x1x1", "M is larger than 2147483647"),
    ("2147483647x1x1 pad 1", "pad makes a leading dimension larger than 2147483647"),
    ("64x64x64 pad 99999999999", "pad makes a leading dimension larger than 2147483647"),
])
def test_a_shape_out_of_range_in_a_shapes_file_is_refused_at_its_line(tmp_path, line, message):
    (tmp_path / "shapes.txt").write_text(f"# shapes\n64x64x64\n{line}\n")
    err = refusal(library(tmp_path, '"shapes.txt"'))
    assert (err.path, err.line, err.column) == (str(tmp_path / "shapes.txt"), 3, 1), str(err)
    assert message in err.message and RANGE in err.allowed, str(err)
    assert len(err.message) < 120, "the message repeats a short piece of the line only"


@pytest.mark.parametrize("shape, column, message", [
    ("0x0x0", 10, "M is 0"),
    ("64x64x64, 10000000000000000000000000000000x1x1", 20, "M is larger than 2147483647"),
    ("64x64x64 pad 2147483647", 10, "pad makes a leading dimension larger"),
])
def test_a_shape_out_of_range_in_the_spec_is_refused_at_its_column(tmp_path, shape, column, message):
    path = library(tmp_path, shape)
    err = refusal(path)
    assert (err.path, err.line, err.column) == (str(path), SHAPES_LINE, column), str(err)
    assert message in err.message and RANGE in err.allowed


def test_the_smallest_and_largest_shapes_are_accepted(tmp_path):
    (lib,) = load_file(library(tmp_path, "1x1x1, 2147483647x1x1, 1x2147483646x1 pad 1")).libraries
    assert [(s.M, s.N, s.K, s.pad) for s in lib.shapes] == [(1, 1, 1, 0), (2147483647, 1, 1, 0),
                                                                (1, 2147483646, 1, 1)]


def test_a_bad_line_is_quoted_short(tmp_path):
    secret = "root:x:0:0:root:/root:/bin/bash," * 50
    (tmp_path / "shapes.txt").write_text(f"64x64x64\n{secret}\n")
    err = refusal(library(tmp_path, '"shapes.txt"'))
    assert (err.line, err.column) == (2, 1)
    assert err.message == f"not a shape: {secret[:40]!r}"[:-1] + "...'"
    report = str(err)
    assert secret[:QUOTE_WIDTH] in report and secret[:QUOTE_WIDTH + 1] not in report
    assert max(len(line) for line in report.split("\n")) <= len(err.path) + 200


def test_digits_other_than_ascii_are_no_shape():
    with pytest.raises(SpecError, match="not a shape"):
        parse_shapes("\u0664x\u0664x\u0664\n", "s.txt")  # Arabic-Indic 4: int() would take it
