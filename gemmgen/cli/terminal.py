"""What gemmgen prints, and how: every string exactly as given, colour only where the code asks.

A path, a spec's name, a database's label or a line quoted from a spec can hold `[...]` or
`:name:`. Printed through rich's defaults they are read as markup or emoji codes: `[draft]/k.cu`
prints as `/k.cu`, `a:x:b` as `a❌b`, and `br[/]x` raises a MarkupError. Here every console,
table and progress bar has markup and emoji off, and colour is applied to pieces of text
(`styled`, `line`), never parsed out of a string.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

out = Console(highlight=False, markup=False, emoji=False)
err = Console(stderr=True, highlight=False, markup=False, emoji=False)


def styled(text: str, style: str) -> Text:
    """`text` in `style` (e.g. "green", "bold red"), taken literally."""
    return Text(str(text), style=style)


def line(*parts: str | tuple[str, str] | Text) -> Text:
    """One line from plain strings, (string, style) pairs and Text, each taken literally."""
    return Text.assemble(*[Text(p) if isinstance(p, str) else p for p in parts])


def say(*parts: str | tuple[str, str] | Text, on: Console = out) -> None:
    """Print one message line (unwrapped: a long path stays whole on one line)."""
    on.print(line(*parts), soft_wrap=True)


def error(message: str) -> None:
    """`error: message` on stderr."""
    say(("error:", "bold red"), " ", message, on=err)


def progress(on: Console = err, transient: bool = True):
    """A progress bar for work that takes more than a moment; its descriptions are plain text."""
    return Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=on, transient=transient)
