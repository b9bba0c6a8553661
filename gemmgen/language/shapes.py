"""A library's shapes, `MxNxK [batch B] [pad P]`: written in the spec or read from a shapes file beside it,
each one range-checked where it was written.

A shapes file is read only from the spec's folder or below it (a spec handed to you cannot make
gemmgen read, and quote, a file elsewhere), only if it is a regular file of at most
MAX_SHAPES_BYTES, and an error quotes no more of a bad line than a short, cut piece.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import Span, SpecError
from .textfile import read_text

MAX_DIMENSION = 2**31 - 1          # M, N, K and leading dimensions are C ints in the entry point
MAX_SHAPES_BYTES = 1_000_000       # ~50,000 shapes, far more than a library is ever tuned at
QUOTED = 40                        # characters of a bad line that a message repeats
SHAPE_USAGE = "MxNxK [batch B] [pad P], e.g. 4096x4096x4096, 127x4099x1023 pad 1 or 512x512x512 batch 64"
RANGE = (f"M, N and K from 1 to {MAX_DIMENSION}; batch B from 1 to {MAX_DIMENSION}; pad P from 0 with "
         f"max(M, N, K) + P at most {MAX_DIMENSION}")


@dataclass(frozen=True)
class LibraryShape:
    """A shape a library is tuned for: M x N x K, leading dimensions `pad` floats past tight, and
    `batch` such matrices one after another (a strided-batched call; 1: a single GEMM)."""

    M: int
    N: int
    K: int
    pad: int = 0
    span: Span | None = field(default=None, compare=False)
    origin: tuple[str, str] | None = field(default=None, compare=False, repr=False)  # (path, text) of a shapes file
    batch: int = 1

    def __str__(self) -> str:
        return (f"{self.M}x{self.N}x{self.K}" + (f" batch {self.batch}" if self.batch != 1 else "")
                + (f" pad {self.pad}" if self.pad else ""))


def quote(text: str, limit: int = QUOTED) -> str:
    """`text` as a message repeats it: at most `limit` characters, then '...'."""
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _number(digits: str) -> int | None:
    """The value of a run of digits, None past MAX_DIMENSION (checked on the digits first: int()
    of thousands of digits is slow, and past 4,300 refused)."""
    digits = digits.lstrip("0") or "0"
    if len(digits) > len(str(MAX_DIMENSION)) or int(digits) > MAX_DIMENSION:
        return None
    return int(digits)


def shape_problem(M: int | None, N: int | None, K: int | None, pad: int | None, batch: int | None = 1) -> str:
    """What is out of range in a shape (its numbers None where too large to hold), or ''."""
    for name, value in (("M", M), ("N", N), ("K", K), ("batch", batch)):
        if value is None:
            return f"{name} is larger than {MAX_DIMENSION}"
        if value < 1:
            return f"{name} is {value}: a shape's sizes are at least 1"
    if pad is None or max(M, N, K) + pad > MAX_DIMENSION:
        return f"pad makes a leading dimension larger than {MAX_DIMENSION}"
    return ""


def shape_of(text: str, pad_text: str | None, span: Span, path: str, source: str,
             origin: tuple[str, str] | None = None, batch_text: str | None = None) -> LibraryShape:
    """The shape `MxNxK` (and batch, pad) written at `span`, or a SpecError there saying what is out
    of range."""
    M, N, K = (_number(x) for x in text.split("x"))
    pad = _number(pad_text) if pad_text else 0
    batch = _number(batch_text) if batch_text else 1
    problem = shape_problem(M, N, K, pad, batch)
    if problem:
        written = text + (f" batch {batch_text}" if batch_text else "") + (f" pad {pad_text}" if pad_text else "")
        raise SpecError(f"shape {quote(written)}: {problem}", path=path, text=source, span=span, allowed=RANGE)
    return LibraryShape(M, N, K, pad, span, origin, batch)


_SHAPE_LINE = re.compile(r"^[ \t]*([0-9]+x[0-9]+x[0-9]+)(?:[ \t]+batch[ \t]+([0-9]+))?(?:[ \t]+pad[ \t]+([0-9]+))?"
                         r"[ \t]*(?:#.*)?$")


def parse_shapes(content: str, path: str) -> list[LibraryShape]:
    """The shapes of a shapes file's text (one `MxNxK [batch B] [pad P]` per line, # comments); a line that is
    no shape, or a shape out of range, is a SpecError at that line of `path`."""
    shapes = []
    content = content.removeprefix("\ufeff")
    origin = (path, content)
    for number, line in enumerate(content.split("\n"), 1):
        line = line.rstrip("\r")
        if not line.split("#")[0].strip():
            continue
        span = Span(number, 1, max(2, len(line.rstrip()) + 1))
        match = _SHAPE_LINE.match(line)
        if not match:
            raise SpecError(f"not a shape: {quote(line)}", path=path, text=content, span=span,
                            allowed=SHAPE_USAGE)
        shapes.append(shape_of(match.group(1), match.group(3), span, path, content, origin, match.group(2)))
    return shapes


def read_shapes_file(name: str, span: Span, path: str, text: str) -> list[LibraryShape]:
    """The shapes of the file `name` that the spec at `path` names at `span`, read from the spec's
    folder or below it. Every problem is a SpecError: at the spec's line when the file cannot be
    used, at the file's line when a line of it is wrong."""
    def refuse(message: str, allowed: str = "a text file in the spec's folder, one MxNxK [batch B] [pad P] per line"):
        return SpecError(message, path=path, text=text, span=span, allowed=allowed)

    folder = Path(path).parent if not path.startswith("<") else Path(".")
    where = folder / name
    if not name or Path(name).is_absolute():
        raise refuse(f"the shapes file {quote(name, 80)} is not a path relative to the spec's folder")
    try:
        inside = where.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError) as exc:  # a loop of symbolic links
        raise refuse(f"cannot read the shapes file {where}: {getattr(exc, 'strerror', None) or exc}") from None
    if not inside:
        how = "leads" if ".." not in Path(name).parts else "lies"  # through a symbolic link
        raise refuse(f"the shapes file {quote(name, 80)} {how} outside the spec's folder "
                     f"({folder}): gemmgen reads shapes files from that folder or below it only")
    try:
        content = read_text(where, MAX_SHAPES_BYTES, "a shapes file")
    except SpecError as exc:
        raise refuse(f"cannot read the shapes file {where}: {exc.message}") from None
    except OSError as exc:
        raise refuse(f"cannot read the shapes file {where}: {exc.strerror}") from None
    shapes = parse_shapes(content, str(where))
    if not shapes:
        raise refuse(f"the shapes file {where} lists no shapes", "one MxNxK [batch B] [pad P] per line")
    return shapes
