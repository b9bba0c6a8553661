"""Large inputs: a spec file past MAX_SPEC_BYTES is refused at once, before it is read or parsed."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from gemmgen.cli import main
from gemmgen.language.errors import SpecError
from gemmgen.language.load import load, parse
from gemmgen.language.spec import MAX_SPEC_BYTES

SMALL_KERNEL = "kernel small {\n  block 64 x 64 x 8\n  thread 4 x 4\n}\n"


def padded(size: int) -> str:
    """SMALL_KERNEL followed by comment lines, exactly `size` bytes long."""
    filler = size - len(SMALL_KERNEL)
    line = "#" * 99 + "\n"
    text = SMALL_KERNEL + line * (filler // len(line))
    return text + "#" * (size - len(text) - 1) + "\n"


def test_a_4_mb_spec_repeating_a_setting_is_refused_at_once(tmp_path):
    # The case: line 3 repeats a setting, and the parser used to take 27 s to say so.
    path = tmp_path / "huge.gemm"
    lines = ["kernel huge {", "  block 64 x 64 x 8", "  block 64 x 64 x 8"] + ["  thread 4 x 4"] * 300_000
    path.write_text("\n".join(lines + ["}"]) + "\n")
    assert path.stat().st_size > 4_000_000
    started = time.perf_counter()
    result = CliRunner().invoke(main, ["build", str(path), "-o", str(tmp_path / "out")])
    elapsed = time.perf_counter() - started
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    size = path.stat().st_size / 1e6
    assert f"{path}: the file is {size:.1f} MB, too large for a spec (at most 1 MB" in result.output
    assert elapsed < 2.0, f"refusing a 4 MB spec took {elapsed:.1f} s"
    assert not (tmp_path / "out").exists()


def test_the_limit_is_exact_and_comments_up_to_it_are_read(tmp_path):
    path = tmp_path / "big.gemm"
    path.write_text(padded(MAX_SPEC_BYTES))
    assert path.stat().st_size == MAX_SPEC_BYTES
    assert [s.name for s in load(path)] == ["small"]
    path.write_text(padded(MAX_SPEC_BYTES + 1))
    with pytest.raises(SpecError, match="too large for a spec"):
        load(path)


def test_a_parent_past_the_limit_is_refused_at_the_extends(tmp_path):
    (tmp_path / "parent.gemm").write_text(padded(MAX_SPEC_BYTES + 100))
    child = tmp_path / "child.gemm"
    child.write_text("kernel child extends parent {\n  thread 8 x 8\n}\n")
    with pytest.raises(SpecError) as info:
        load(child)
    assert info.value.path == str(child) and info.value.line == 1
    assert "parent.gemm" in info.value.message and "too large for a spec" in info.value.message


def test_text_past_the_limit_is_refused_by_parse():
    started = time.perf_counter()
    with pytest.raises(SpecError, match="too large for a spec"):
        parse(SMALL_KERNEL + "  thread 4 x 4\n" * 100_000, "big.gemm")
    assert time.perf_counter() - started < 0.5


def test_a_device_is_refused_before_it_is_read():
    started = time.perf_counter()
    with pytest.raises(SpecError) as info:
        load("/dev/zero")  # endless, and st_size is 0: it must not be read at all
    assert str(info.value).startswith("/dev/zero: cannot read spec: this is a character device, "
                                      "not a regular file")
    assert time.perf_counter() - started < 0.5
