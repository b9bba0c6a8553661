"""SpecError: every problem with a spec, reported at its file:line:column with the line quoted."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """Where a piece of spec text lies: 1-based line and column, end column exclusive."""

    line: int
    column: int
    end_column: int

    def __str__(self) -> str:
        return f"{self.line}:{self.column}"


QUOTE_WIDTH = 100  # characters of a source line an error quotes at most (a window around the caret)


def quoted(line: str, span: Span) -> tuple[str, int, int]:
    """The part of a source line an error quotes, the caret's column in it and the caret's width.

    A line longer than QUOTE_WIDTH is cut to a window around the span, '...' marking each cut."""
    line = "".join(ch if ch.isprintable() else " " for ch in line)
    column, width = span.column, max(1, span.end_column - span.column)
    if len(line) <= QUOTE_WIDTH:
        return line, column, width
    start = max(0, min(column - 1 - QUOTE_WIDTH // 4, len(line) - QUOTE_WIDTH))
    head = "..." if start else ""
    tail = "..." if start + QUOTE_WIDTH < len(line) else ""
    column = column - start + len(head)
    width = max(1, min(width, QUOTE_WIDTH - (span.column - 1 - start)))
    return head + line[start:start + QUOTE_WIDTH] + tail, column, width


class SpecError(Exception):
    """A spec that cannot be parsed or cannot work, with the place to fix it.

    str(error) is the full report a user sees:

        specs/k.gemm:4:9: block tile M (100) is not a multiple of the warp tile M (64)
            4 |   warp 64 x 64
              |        ^^
          allowed: a warp tile M that divides 100
    """

    def __init__(self, message: str, *, path: str = "<spec>", text: str = "",
                 span: Span | None = None, allowed: str = ""):
        self.message = message
        self.path = path
        self.text = text
        self.span = span
        self.allowed = allowed
        super().__init__(self.render())

    @property
    def line(self) -> int | None:
        return self.span.line if self.span else None

    @property
    def column(self) -> int | None:
        return self.span.column if self.span else None

    def render(self) -> str:
        where = f"{self.path}:{self.span}" if self.span else self.path
        parts = [f"{where}: {self.message}"]
        # Lines as the parser counts them: only '\n' ends one (splitlines() would also split at
        # form feeds, lone '\r' and the like, and quote the wrong line). Every other control
        # character shows as one space, so the caret stays under its column.
        lines = self.text.split("\n")
        if self.span and 1 <= self.span.line <= len(lines):
            shown, column, width = quoted(lines[self.span.line - 1].rstrip("\r"), self.span)
            gutter = f"{self.span.line:5d} | "
            parts.append(gutter + shown)
            parts.append(" " * (len(gutter) - 2) + "| " + " " * (column - 1) + "^" * width)
        if self.allowed:
            parts.append(f"  allowed: {self.allowed}")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.render()
