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
            source_line = "".join(ch if ch.isprintable() else " "
                                  for ch in lines[self.span.line - 1].rstrip("\r"))
            gutter = f"{self.span.line:5d} | "
            width = max(1, self.span.end_column - self.span.column)
            parts.append(gutter + source_line)
            parts.append(" " * (len(gutter) - 2) + "| " + " " * (self.span.column - 1) + "^" * width)
        if self.allowed:
            parts.append(f"  allowed: {self.allowed}")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.render()
