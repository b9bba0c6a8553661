"""Read a text file a user named (a spec, a shapes file) without trusting what it is.

The file must be a regular file: a named pipe would block the read until a writer comes, and a
device such as /dev/zero never ends. Its size is checked before it is read, and the read itself
is bounded (a file that grows meanwhile stops at the limit). The text is UTF-8, a byte-order
mark at its start is dropped, and line ends are read as Python's text mode reads them.
"""

from __future__ import annotations

import codecs
import os
import stat
from pathlib import Path

from .errors import SpecError

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _regular(mode: int, name: str, what: str) -> None:
    if not stat.S_ISREG(mode):
        kind = next((word for test, word in _KINDS if test(mode)), "something else")
        raise FileRefused("not regular", f"this is {kind}, not a regular file", path=name,
                          allowed=f"{what} is read from a regular file")


class FileRefused(SpecError):
    """A file refused before its text is used: not a regular file, larger than the limit, or not
    UTF-8 (the message names the line and column of the first byte that is not). `reason` is
    "not regular", "too large" or "not UTF-8"."""

    def __init__(self, reason: str, message: str, **where):
        self.reason = reason
        super().__init__(message, **where)


def read_text(path: str | Path, limit: int, what: str, hint: str = "") -> str:
    """The text of `path`, a regular file of at most `limit` bytes (`what` names it in errors:
    "a spec", "a shapes file"; `hint` says why the limit is ample).

    Raises FileRefused (a SpecError at the file) for what is not a regular file, is too large or
    is not UTF-8, and OSError as os.stat and os.open do, for the caller to word."""
    name = str(path)
    info = os.stat(path)  # before opening: opening a FIFO for reading waits for a writer
    _regular(info.st_mode, name, what)
    if info.st_size > limit:
        raise FileRefused("too large", too_large(info.st_size, limit, what, hint), path=name,
                          allowed=f"{what} of at most {limit:,} bytes")
    # O_NONBLOCK: should a pipe have taken the file's place since the stat, opening it returns
    # at once (and fstat below refuses it); on a regular file the flag changes nothing.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as handle:
        _regular(os.fstat(handle.fileno()).st_mode, name, what)
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileRefused("too large", too_large(len(data), limit, what, hint), path=name,
                          allowed=f"{what} of at most {limit:,} bytes")
    if data.startswith(codecs.BOM_UTF8):  # some editors on Windows start UTF-8 files with one
        data = data[len(codecs.BOM_UTF8):]
    try:
        return decode(data)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        before = data[data.rfind(b"\n", 0, exc.start) + 1:exc.start]
        column = len(before.decode("utf-8", "replace")) + 1
        raise FileRefused("not UTF-8", f"the file is not UTF-8 text (byte 0x{data[exc.start]:02x} at line "
                          f"{line}, column {column})",
                          path=name, allowed=f"{what} in UTF-8 text") from None


def decode(data: bytes) -> str:
    """UTF-8 bytes as text: a leading byte-order mark dropped, '\\r\\n' and '\\r' read as '\\n'."""
    text = data.decode("utf-8-sig")
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def too_large(size: int, limit: int, what: str, hint: str = "") -> str:
    """Why a file of `size` bytes is refused, in words: "the file is 4.3 MB, too large for ..."."""
    return (f"the file is {size / 1e6:.1f} MB, too large for {what} (at most {limit / 1e6:g} MB"
            + (f"; {hint}" if hint else "") + "): is it the right file?")
