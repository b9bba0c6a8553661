"""What the PyTorch benchmarks (torch_model.py, torch_layouts.py) share: timing, the record's
metadata, its output file, and a markdown table.

- use_device(device): make a GPU named with its index (cuda:1) the current one;
- elapsed_ms(work, device): one run of `work` in milliseconds, by CUDA events on a GPU (started
  with the GPU idle, so that host time the GPU waits for counts too), by the host clock on the CPU
  (the scripts' dry runs);
- meta(commit, device): device, driver, torch and gemmgen versions, commit, date;
- refuse_to_overwrite / write_record: the output is checked before any work (an existing file
  gemmgen did not write is kept unless --force) and written whole or not at all;
- table(header, rows): a markdown table;
- parse_shapes(parser, texts): --shapes' MxNxK words as (M, N, K), a parser error for a bad one;
- timed_arguments(parser, shapes, metavar) / check_timed_arguments(parser, args): the options of a
  benchmark that times ways in turns on a CUDA GPU (--out, --force, --commit, --precisions, --shapes,
  --rounds, --calls, --warmup, --seed, --device), and their checks; timed_run(description, shapes,
  argv, options, metavar, shapes_of): all of it (parsed, checked, --out refused or free, the GPU
  made current), giving (args, device);
- relative_error(result, reference): ||result - reference||_F / ||reference||_F, in float64;
- compile_libraries(precisions, device): every member of the libraries built for these precisions
  (each operand class) compiled at once, in parallel, before the timing: otherwise each compiles
  on its first call, one after another.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import types

import torch

import gemmgen.library.dispatch as dispatch
from gemmgen.gpu.bench import run_meta
from gemmgen.outputs import OutputError, check_outputs, write_output
from gemmgen.gpu.runtime import device_info


def use_device(device: torch.device) -> None:
    """torch.cuda.set_device for cuda:N; plain "cuda" is the current GPU already (and set_device
    refuses a device without an index)."""
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device.index)


def elapsed_ms(work, device: torch.device) -> float:
    if device.type != "cuda":
        start = time.perf_counter()
        work()
        return (time.perf_counter() - start) * 1e3
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def meta(commit: str | None, device: torch.device) -> dict:
    """Who measured where and when: gemmgen's run_meta (device, driver, commit: `commit`, else
    $GEMMGEN_COMMIT, else the checkout's HEAD), with torch's and CUDA's versions."""
    found = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
             "host": platform.processor() or platform.machine()}
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return {**run_meta(device_info(index), commit), **found}
    dry = types.SimpleNamespace(name=f"{device} (a dry run: no GPU timing)", driver_version=None, sm_count=0,
                                clock_khz=0)
    return {**run_meta(dry, commit), **found}


def refuse_to_overwrite(path: str, force: bool) -> None:
    """Exit with the reason (no traceback) if `path` may not be written: checked before the work."""
    try:
        check_outputs([path], force=force)
    except OutputError as exc:
        sys.exit(f"error: {exc}")


def write_record(path: str, record: dict) -> None:
    """The record as JSON, whole or not at all, marked as gemmgen's (so a later run may replace it)."""
    try:
        write_output(path, json.dumps({"generator": "gemmgen", **record}, indent=1) + "\n")
    except OutputError as exc:
        sys.exit(f"error: {exc}")


def parse_shapes(parser, texts) -> list[tuple[int, int, int]]:
    shapes = []
    for text in texts:
        try:
            M, N, K = (int(x) for x in text.lower().split("x"))
        except ValueError:
            parser.error(f"--shapes {text}: write M x N x K as three whole numbers, like 4096x4096x4096")
        if min(M, N, K) < 1:
            parser.error(f"--shapes {text}: every size must be at least 1")
        shapes.append((M, N, K))
    return shapes


def timed_arguments(parser, shapes, metavar: str = "MxNxK") -> None:
    parser.add_argument("--out", required=True, help="JSON file to write the record to")
    parser.add_argument("--force", action="store_true", help="replace --out even if gemmgen did not write it")
    parser.add_argument("--commit", help="the commit to record (default: $GEMMGEN_COMMIT, else git's HEAD)")
    parser.add_argument("--precisions", nargs="+", choices=dispatch.PRECISIONS, default=list(dispatch.PRECISIONS))
    parser.add_argument("--shapes", nargs="+", metavar=metavar, default=["x".join(map(str, s)) for s in shapes])
    parser.add_argument("--rounds", type=int, default=7, help="timed batches of each way, in turns (default 7)")
    parser.add_argument("--calls", type=int, default=10, help="calls in a timed batch (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls of each way first (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cuda:N")


def check_timed_arguments(parser, args) -> None:
    for name in ("rounds", "calls", "warmup"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if torch.device(args.device).type != "cuda" or not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this benchmark needs a CUDA GPU that torch sees")


def timed_run(description: str, shapes, argv=None, options=None, metavar: str = "MxNxK",
              shapes_of=None) -> tuple[argparse.Namespace, torch.device]:
    """Parsed, checked arguments of a benchmark timing ways in turns on a CUDA GPU, --out refused
    before any work where it may not be written, and the GPU made current. `options(parser)` adds the
    benchmark's own; `shapes_of(parser, texts)` reads --shapes (default parse_shapes)."""
    parser = argparse.ArgumentParser(description=description)
    timed_arguments(parser, shapes, metavar)
    if options is not None:
        options(parser)
    args = parser.parse_args(argv)
    args.shapes = (shapes_of or parse_shapes)(parser, args.shapes)
    check_timed_arguments(parser, args)
    refuse_to_overwrite(args.out, args.force)
    device = torch.device(args.device)
    use_device(device)
    return args, device


def relative_error(result: torch.Tensor, reference: torch.Tensor) -> float:
    return float(torch.linalg.norm(result.double() - reference) / torch.linalg.norm(reference))


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---" if i == 0 else "---:" for i in range(len(header))) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def compile_libraries(precisions, device: torch.device) -> None:
    if device.type != "cuda":
        return
    start = time.perf_counter()
    index = device.index if device.index is not None else torch.cuda.current_device()
    names = []
    for precision in precisions:
        for klass in sorted(dispatch.available_classes(precision)):
            runtime = dispatch.library(precision, index, klass)
            runtime.compile_all()
            names.append(runtime.name)
    print(f"compiled the members of {', '.join(names)} in {time.perf_counter() - start:.1f} s", flush=True)
