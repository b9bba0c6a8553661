"""What every SpecError report must show, asserted alike by the error corpus and the fuzzers:
`path:line:col: message`, the line quoted (a window of it when it is long) with a caret under
the column, and what is allowed."""

from __future__ import annotations

import re

from gemmgen.language.errors import QUOTE_WIDTH, SpecError


def assert_quotes_line_with_caret(err: SpecError, text: str) -> None:
    """`err` quotes line `err.line` of `text` (as the parser counts lines: only '\\n' ends one)
    with a caret under `err.column`; a line past QUOTE_WIDTH is quoted as a window of it around
    the caret, '...' marking the cuts, and never in full."""
    assert type(err) is SpecError or isinstance(err, SpecError)
    report = str(err).split("\n")
    assert report[0].startswith(f"{err.path}:{err.line}:{err.column}: "), str(err)
    assert err.span.end_column > err.span.column >= 1, str(err)
    lines = text.split("\n")
    assert 1 <= err.line <= len(lines), str(err)
    source = "".join(ch if ch.isprintable() else " " for ch in lines[err.line - 1].rstrip("\r"))
    gutter = f"{err.line:5d} | "
    quotes = [i for i, line in enumerate(report) if line.startswith(gutter)]
    assert len(quotes) == 1, str(err)
    shown = report[quotes[0]][len(gutter):]
    caret = re.fullmatch(r" {6}\| ( *)(\^+)", report[quotes[0] + 1])
    assert caret, f"no caret line under the quote:\n{err}"
    at = len(caret.group(1))  # index in `shown` of the caret's first character
    if len(source) <= QUOTE_WIDTH:
        assert shown == source, str(err)
        assert at == err.column - 1, str(err)
        return
    head = 3 if shown.startswith("...") else 0
    tail = 3 if shown.endswith("...") and len(shown) - head > QUOTE_WIDTH else 0
    window = shown[head:len(shown) - tail]
    assert len(window) <= QUOTE_WIDTH, f"a long line is quoted in full:\n{err}"
    start = err.column - 1 - (at - head)  # where the window starts in the source line
    assert start >= 0 and source[start:start + len(window)] == window, str(err)
    assert bool(head) == (start > 0) and bool(tail) == (start + len(window) < len(source)), str(err)


def assert_good_report(err: SpecError, text: str) -> None:
    """A full report: a message, a quoted line with its caret, and what is allowed instead."""
    assert err.message and err.allowed, str(err)
    assert err.span is not None, str(err)
    assert_quotes_line_with_caret(err, text)
    assert str(err).split("\n")[-1] == f"  allowed: {err.allowed}"
