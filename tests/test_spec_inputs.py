"""Spec files a user names that are not what they seem: a named pipe, a device, a folder, bytes
that are not UTF-8, a byte-order mark, and `extends` chains that are too long, loop, or fan out.
Each is refused with a SpecError naming the file (and line:col where there is one), promptly, and
never as a Python traceback or a hang."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gemmgen.cli import main
from gemmgen.language.errors import SpecError
from gemmgen.language.load import MAX_EXTENDS_DEPTH, MAX_LOAD_BYTES, MAX_SPEC_FILES, load, parse

KERNEL = "kernel k {\n  block 64 x 64 x 8\n  thread 4 x 4\n}\n"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_refused(result, *lines: str) -> None:
    """Exit 1 through sys.exit, no traceback, and each of `lines` in the output."""
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    for line in lines:
        assert line in result.output, result.output


@pytest.fixture
def fifo(tmp_path):
    """A named pipe, and a watchdog that opens its other end after 10 s: should gemmgen open it
    for reading (and so wait for a writer), the test fails rather than hangs."""
    path = tmp_path / "pipe.gemm"
    os.mkfifo(path)
    state = {"stop": False, "unblocked": False}

    def watchdog():
        deadline = time.monotonic() + 10
        while not state["stop"]:
            if time.monotonic() > deadline:
                try:  # succeeds only while a reader waits
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                    state["unblocked"] = True
                except OSError:
                    pass
            time.sleep(0.05)

    thread = threading.Thread(target=watchdog, daemon=True)
    thread.start()
    yield path
    state["stop"] = True
    thread.join()
    assert not state["unblocked"], "gemmgen opened the pipe and waited for a writer"


# --- not a regular file ----------------------------------------------------------------------------

def test_a_named_pipe_given_as_the_spec_is_refused_at_once(fifo):
    started = time.perf_counter()
    with pytest.raises(SpecError) as info:
        load(fifo)
    assert str(info.value).startswith(f"{fifo}: cannot read spec: this is a named pipe (FIFO), "
                                      "not a regular file")
    assert info.value.allowed == "a spec is read from a regular file"
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("verb", ["build", "explain", "tune", "replay"])
def test_every_verb_that_reads_a_spec_refuses_a_named_pipe(fifo, verb, tmp_path):
    extra = {"build": ["-o", tmp_path / "out"], "replay": ["--shape", "64x64x64"],
             "tune": ["--db", tmp_path / "t.jsonl"]}.get(verb, [])
    result = invoke(verb, fifo, *extra)
    if verb == "tune" and result.exit_code == 2:  # no GPU: tune says so before reading the spec
        assert "no CUDA GPU" in result.output and "Traceback" not in result.output
        return
    assert_refused(result, f"{fifo}: cannot read spec: this is a named pipe (FIFO), not a regular file")
    assert not (tmp_path / "out").exists()


def test_a_named_pipe_as_a_parent_is_not_taken_for_one(fifo, tmp_path):
    # pipe.gemm is no regular file, so it is no NAME.gemm beside the spec: never opened
    child = tmp_path / "child.gemm"
    child.write_text("kernel child extends pipe {\n  thread 4 x 4\n}\n")
    with pytest.raises(SpecError) as info:
        load(child)
    assert (info.value.path, info.value.line, info.value.column) == (str(child), 1, 22)
    assert "extends 'pipe', which is neither in this file nor in pipe.gemm" in info.value.message


def test_a_symbolic_link_to_a_device_is_refused(tmp_path):
    link = tmp_path / "zero.gemm"
    link.symlink_to("/dev/zero")
    with pytest.raises(SpecError, match="this is a character device, not a regular file"):
        load(link)


def test_a_spec_that_is_not_utf8_is_refused_at_its_first_bad_byte(tmp_path):
    path = tmp_path / "latin1.gemm"
    path.write_bytes("kernel k {\n  # café\n".encode() + "  # naïve\n}\n".encode("latin-1"))
    with pytest.raises(SpecError) as info:
        load(path)
    assert str(info.value).startswith(f"{path}: the file is not UTF-8 text (byte 0xef at line 3, column 7)")


# --- a byte-order mark ------------------------------------------------------------------------------

def test_a_spec_starting_with_a_byte_order_mark_builds(tmp_path):
    path = tmp_path / "bom.gemm"
    path.write_bytes(b"\xef\xbb\xbf" + KERNEL.replace("\n", "\r\n").encode())
    (spec,) = load(path)
    assert spec.name == "k" and spec["block.m"] == 64
    result = invoke("build", path, "-o", tmp_path / "out", "--no-compile")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "k.cu").exists()


def test_columns_on_the_first_line_count_after_the_byte_order_mark(tmp_path):
    path = tmp_path / "bom.gemm"
    path.write_bytes(b"\xef\xbb\xbfkernel k { blok 1 }\n")
    with pytest.raises(SpecError) as info:
        load(path)
    assert (info.value.line, info.value.column) == (1, 12)
    assert "    1 | kernel k { blok 1 }" in str(info.value)


def test_parse_of_text_with_a_byte_order_mark(tmp_path):
    (spec,) = parse("\ufeff" + KERNEL, "t.gemm")
    assert spec.name == "k"


def test_a_parent_file_with_a_byte_order_mark(tmp_path):
    (tmp_path / "base.gemm").write_bytes(b"\xef\xbb\xbf" + KERNEL.replace("kernel k", "kernel base").encode())
    (tmp_path / "child.gemm").write_text("kernel child extends base {\n  thread 8 x 8\n}\n")
    (child,) = load(tmp_path / "child.gemm")
    assert (child["block.m"], child["thread.m"]) == (64, 8)


# --- extends: depth, loops, fan-out ---------------------------------------------------------------

def chain_of_files(folder: Path, count: int) -> Path:
    """k0.gemm extends k1 (in k1.gemm), ..., k{count-1}.gemm holds the settings: `count` kernels,
    count - 1 `extends`."""
    for i in range(count - 1):
        (folder / f"k{i}.gemm").write_text(f"kernel k{i} extends k{i + 1} {{\n  raster group {1 + i % 8}\n}}\n")
    (folder / f"k{count - 1}.gemm").write_text(KERNEL.replace("kernel k", f"kernel k{count - 1}"))
    return folder / "k0.gemm"


def test_a_chain_of_extends_up_to_the_limit_loads(tmp_path):
    (spec,) = load(chain_of_files(tmp_path, MAX_EXTENDS_DEPTH + 1))
    assert spec.name == "k0" and spec["block.m"] == 64 and spec.depth == MAX_EXTENDS_DEPTH


@pytest.mark.parametrize("count", [MAX_EXTENDS_DEPTH + 2, 200])
def test_a_chain_of_extends_past_the_limit_is_refused_at_its_extends(tmp_path, count):
    # 163 files gave a RecursionError traceback; the limit is stated
    top = chain_of_files(tmp_path, count)
    started = time.perf_counter()
    with pytest.raises(SpecError) as info:
        load(top)
    assert time.perf_counter() - started < 2.0
    err = info.value
    deepest = tmp_path / f"k{MAX_EXTENDS_DEPTH}.gemm"
    assert (err.path, err.line, err.column) == (str(deepest), 1, len(f"kernel k{MAX_EXTENDS_DEPTH} extends ") + 1)
    assert (f"kernel 'k{MAX_EXTENDS_DEPTH}' extends 'k{MAX_EXTENDS_DEPTH + 1}': the chain of `extends` from "
            f"kernel 'k0' ({top}) goes past {MAX_EXTENDS_DEPTH} kernels above it, gemmgen's limit") in err.message
    assert err.allowed == f"at most {MAX_EXTENDS_DEPTH} kernels above a kernel through `extends`"
    result = invoke("explain", top)
    assert_refused(result, f"{deepest}:1:{err.column}: kernel 'k{MAX_EXTENDS_DEPTH}' extends")


def test_a_chain_within_one_file_past_the_limit_is_refused():
    kernels = [f"kernel k{i} extends k{i + 1} {{\n  raster group 2\n}}\n" for i in range(60)]
    text = "".join(kernels) + KERNEL.replace("kernel k", "kernel k60")
    with pytest.raises(SpecError) as info:
        parse(text, "t.gemm")
    assert f"kernel 'k{MAX_EXTENDS_DEPTH}' extends 'k{MAX_EXTENDS_DEPTH + 1}': the chain" in info.value.message
    assert info.value.line == 3 * MAX_EXTENDS_DEPTH + 1  # kernel k32's extends (3 lines a kernel)


def test_a_kernel_extending_a_chain_already_at_the_limit_is_refused(tmp_path):
    # p is resolved first, with 32 kernels above it (k1 ... k32); top then extends it
    chain_of_files(tmp_path, MAX_EXTENDS_DEPTH + 1)
    path = tmp_path / "over.gemm"
    path.write_text("kernel p extends k1 {\n  raster group 4\n}\nkernel top extends p {\n  thread 8 x 8\n}\n")
    with pytest.raises(SpecError) as info:
        load(path)
    assert (info.value.path, info.value.line, info.value.column) == (str(path), 4, 20)
    assert "kernel 'top' extends 'p', which has 32 kernels above it through `extends` already" in info.value.message


def test_a_loop_through_three_files_is_an_error_at_the_extends_that_closes_it(tmp_path):
    for name, parent in (("a", "b"), ("b", "c"), ("c", "a")):
        (tmp_path / f"{name}.gemm").write_text(f"kernel {name} extends {parent} {{\n  thread 1 x 1\n}}\n")
    with pytest.raises(SpecError) as info:
        load(tmp_path / "a.gemm")
    err = info.value
    assert (err.path, err.line, err.column) == (str(tmp_path / "c.gemm"), 1, 18)
    assert "(a.gemm -> b.gemm -> c.gemm -> a.gemm: kernels a -> b -> c -> a)" in err.message
    assert err.allowed == "a chain of files without loops"


def test_a_file_whose_parent_file_extends_another_kernel_of_it_is_no_loop(tmp_path):
    # top.gemm: k extends mid (mid.gemm), whose mid extends base, a kernel of top.gemm: no kernel
    # is its own ancestor, so this is allowed
    (tmp_path / "top.gemm").write_text("kernel k extends mid {\n  thread 8 x 8\n}\n"
                                       + KERNEL.replace("kernel k", "kernel top"))
    (tmp_path / "mid.gemm").write_text("kernel mid extends top {\n  raster group 4\n}\n")
    k, top = load(tmp_path / "top.gemm")
    assert (k["block.m"], k["thread.m"], k["raster.group"]) == (64, 8, 4)


def test_many_kernels_extending_files_that_fan_out_again_load_each_file_once(tmp_path):
    # each file's 10 kernels extend the next file's kernel: parsed per kernel, that was 10^29 parses
    for i in range(30):
        if i == 29:
            text = KERNEL.replace("kernel k", "kernel f29")
        else:
            text = "".join(f"kernel {'f%d' % i if j == 0 else 'g%d_%d' % (i, j)} extends f{i + 1} {{\n"
                           "  thread 8 x 8\n}\n" for j in range(10))
        (tmp_path / f"f{i}.gemm").write_text(text)
    started = time.perf_counter()
    specs = load(tmp_path / "f0.gemm")
    assert time.perf_counter() - started < 2.0
    assert len(specs) == 10 and specs[0].depth == 29


def test_a_spec_extending_more_files_than_the_limit_is_refused(tmp_path):
    for i in range(MAX_SPEC_FILES + 1):
        (tmp_path / f"p{i}.gemm").write_text(KERNEL.replace("kernel k", f"kernel p{i}"))
    path = tmp_path / "wide.gemm"
    path.write_text("".join(f"kernel c{i} extends p{i} {{\n  thread 8 x 8\n}}\n" for i in range(MAX_SPEC_FILES + 1)))
    with pytest.raises(SpecError) as info:
        load(path)
    err = info.value  # the spec is one of the files: its 64th kernel's parent would be the 65th
    assert (err.path, err.line, err.column) == (str(path), 3 * (MAX_SPEC_FILES - 1) + 1, 20)
    assert (f"kernel extends 'p{MAX_SPEC_FILES - 1}' from {tmp_path / f'p{MAX_SPEC_FILES - 1}.gemm'}, but this "
            f"spec has read {MAX_SPEC_FILES} files already, gemmgen's limit") in err.message


def test_parents_of_more_bytes_in_all_than_the_limit_are_refused(tmp_path):
    filler = ("#" * 99 + "\n") * 9_000  # 0.9 MB of comments per parent
    count = MAX_LOAD_BYTES // len(filler) + 1
    for i in range(count):
        (tmp_path / f"p{i}.gemm").write_text(KERNEL.replace("kernel k", f"kernel p{i}") + filler)
    path = tmp_path / "heavy.gemm"
    path.write_text("".join(f"kernel c{i} extends p{i} {{\n  thread 8 x 8\n}}\n" for i in range(count)))
    with pytest.raises(SpecError) as info:
        load(path)
    assert info.value.path == str(path)
    assert f"would be more than {MAX_LOAD_BYTES / 1e6:g} MB in all" in info.value.message
