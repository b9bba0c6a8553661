"""What the verbs share: reading a spec's kernels and plans, the files a command reads (which its
outputs never replace), shapes and strategy options from the command line, progress bars, the
check for a GPU, exiting with one line, and the arguments and options every verb takes."""

from __future__ import annotations

import contextlib
import sys
import time

import click

from ..gpu import runtime
from ..gpu.verify import parse_case
from ..language.errors import SpecError
from ..language.load import load, load_file
from ..language.spec import TARGETS
from ..plan import make_plan
from . import terminal
from .terminal import err as errors

INTERRUPTED = 130  # the shell's code for a command ended by Ctrl-C (128 + SIGINT)


def fail(message: str, code: int = 1) -> None:
    terminal.error(message)
    sys.exit(code)


def load_specs(path: str, kernel: str | None, target: str | None):
    specs = load(path)
    if kernel:
        specs = [s for s in specs if s.name == kernel]
        if not specs:
            raise SpecError(f"no kernel named '{kernel}' in this file", path=path)
    if target:
        specs = [s.with_values(target=target) for s in specs]
    return specs


def input_paths(path: str, specs=(), *others) -> list:
    """The files a command reads, which its outputs must not replace: the spec, the files its
    kernels' parents came from, and any others given (a tuning database)."""
    parents = {param.origin[0] for s in specs for param in s.params.values() if param.origin}
    return [path, *sorted(parents), *others]


def plans_of(path: str, kernel: str | None, target: str | None, layouts: str | None = None):
    """Plans of the spec's kernels, in the given A/B layouts too (a search space is an error)."""
    plans = []
    for spec in load_specs(path, kernel, target):
        variants = [spec]
        if layouts:
            variants = [spec.with_values(layout_A=a, layout_B=b) for a, b in layout_pairs(layouts)]
        plans += [make_plan(v) for v in variants]
    return plans


def layout_pairs(text: str) -> list[tuple[str, str]]:
    if text == "all":
        return [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]
    pairs = []
    for item in text.split(","):
        a, _, b = item.strip().partition("/")
        if a not in ("row", "col") or b not in ("row", "col"):
            raise click.BadParameter(f"{item!r}: use all, or A/B pairs like row/col,col/row")
        pairs.append((a, b))
    return pairs


def acts_on_libraries(path: str, kernel: str | None) -> bool:
    """Whether this command acts on the file's libraries: it holds some, and --kernel names none
    of its kernels."""
    parsed = load_file(path)
    if not parsed.libraries:
        return False
    return kernel is None or any(lib.name == kernel for lib in parsed.libraries)


def progress_bar(on=errors, transient: bool = True):
    """A progress bar for work that takes more than a moment (stderr, cleared when done)."""
    return terminal.progress(on, transient)


@contextlib.contextmanager
def late_progress(description: str, total: int, delay_s: float = 0.5):
    """`progress(done)` for work of `total` steps: a progress bar appears (stderr, cleared when
    done) once the work has taken more than `delay_s`, and only where stderr is a terminal."""
    started, bar = time.monotonic(), None

    def progress(done: int) -> None:
        nonlocal bar
        if bar is None and errors.is_terminal and done < total and time.monotonic() - started > delay_s:
            bar = progress_bar(errors)
            bar.start()
            bar.add_task(description, total=total)
        if bar is not None:
            bar.update(bar.task_ids[0], completed=done)

    try:
        yield progress
    finally:
        if bar is not None:
            bar.stop()


def require_gpu() -> None:
    """Exit 2, saying why, where there is no GPU or no CuPy. The verbs call it as common.require_gpu(),
    so that a test can stand in a GPU for it."""
    if runtime.device_count() == 0:
        fail("no CUDA GPU found (no driver or no device): check, bench, tune and profile run "
              "kernels and need one; build and explain work without", code=2)
    try:
        import cupy  # noqa: F401
    except ImportError:
        fail("check, bench, tune and profile keep their buffers in CuPy (and time cuBLAS through it): "
              "pip install 'gemmgen[gpu]' (cupy-cuda13x; cupy-cuda12x for CUDA 12 drivers)", code=2)


spec_argument = click.argument("spec", type=click.Path(exists=True, dir_okay=False))
kernel_option = click.option("--kernel", "-k", metavar="NAME",
                             help="Only this kernel of a file that defines several.")
target_option = click.option("--target", type=click.Choice(TARGETS),
                             help="Override the spec's target GPU architecture.")
force_option = click.option("--force", is_flag=True,
                            help="Replace existing output files that gemmgen did not write (a spec, a "
                                 ".cu without gemmgen's first line, ...). The command's own inputs "
                                 "are never replaced.")


def parse_shapes(text: str | None, default):
    if not text:
        return default
    try:
        return tuple(parse_case(item) for item in text.split(";") if item.strip())
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--shapes") from None


SHAPES_HELP = ("Cases separated by ';', each MxNxK with optional ,alpha=,beta=,pad=,offset= "
               "(e.g. '4096x4096x4096;127x131x137,beta=0.5,pad=3').")


def parse_options(items: tuple[str, ...]) -> dict:
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r}: use NAME=VALUE", param_hint="--option")
        try:
            options[key] = int(value)
        except ValueError:
            options[key] = float(value)
    return options
