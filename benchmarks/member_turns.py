"""Shared by the member probes (split_rows.py, split_choice.py, skinny_tiles.py): kernels and cuBLAS
timed in turns by CUDA events, and a library's members found by their settings."""

from __future__ import annotations

import statistics
from typing import Callable

import torch

import gemmgen.library.dispatch as dispatch


def medians_in_turns(runs: dict[str, Callable[[], None]], rounds: int, calls: int) -> dict[str, float]:
    """{label: median ms a call} of `runs` ({label: run}, each run making `calls` calls): every run
    once to warm up, then `rounds` rounds in which each takes its turn between two CUDA events."""
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(rounds):
        for label, run in runs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times[label].append(start.elapsed_time(end) / calls)
    return {label: statistics.median(t) for label, t in times.items()}


def member_index(runtime, wanted: Callable, what: str) -> int:
    """Index of the first member of a LibraryRuntime whose plan is `wanted` (what: its words, for the
    error where none is)."""
    for index in range(len(runtime.manifest.members)):
        if wanted(runtime.kernel_plan(index)):
            return index
    raise LookupError(f"library {runtime.name} has no {what} member")


def each_library(precisions: tuple[str, ...] = ("tf32", "fp32")):
    """(precision, LibraryRuntime on GPU 0 with every member compiled, member names) of each shipped
    library, with torch.matmul set to the same precision (TF32 allowed for tf32 only)."""
    for precision in precisions:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        runtime = dispatch.library(precision, 0)
        runtime.compile_all()
        yield precision, runtime, [member.name for member in runtime.manifest.members]
