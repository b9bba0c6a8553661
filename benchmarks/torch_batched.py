"""Strided-batched GEMM (issue 29): batched gemmgen.matmul beside torch.bmm (cuBLAS), in turns.

    python benchmarks/torch_batched.py --out batched.json [--precisions fp32 tf32] [--rounds 7] [--calls 10]

For each batch x M x N x K (64 x 512^3, 32 x 1024 x 1024 x 128 and 256 x 128^3 by default: A is
batch x M x K, B batch x K x N) and precision, two ways take turns on the same tensors:

- gemmgen: gemmgen.matmul(A, B, out), one strided-batched launch of the library member chosen for
  (batch, M, N, K);
- torch: torch.bmm(A, B, out=out) in the same precision (allow_tf32 off for fp32, on for tf32).

Each shape runs in two layouts of B: "k-major" (each B matrix column-major, B = Bt.mT: what the
libraries' members read as built) and "row-major" (B dense as torch.randn makes it: read in place too,
as C^T = B^T A^T by the members built with `layout A col`). Issue 29 asks gemmgen >= 2.0 x torch in fp32 and >= 0.95 x
in tf32. Every member is compiled first, in parallel; each way is warmed up, then timed as batches of
--calls calls by CUDA events, in turns, --rounds times; a way's figure is its median batch. Errors
are relative to float64 (Frobenius).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings

import torch

from torch_records import (check_timed_arguments, elapsed_ms, meta, refuse_to_overwrite, relative_error, table,
                           timed_arguments, use_device, write_record)

import gemmgen
import gemmgen.library.dispatch as dispatch
from gemmgen.gpu.compile import compile_all
from gemmgen.gpu.runtime import ShapeError

SHAPES = ((64, 512, 512, 512), (32, 1024, 1024, 128), (256, 128, 128, 128))
LAYOUTS = ("k-major", "row-major")


def parse_batched_shapes(parser, texts) -> list[tuple[int, int, int, int]]:
    shapes = []
    for text in texts:
        try:
            batch, M, N, K = (int(x) for x in text.lower().split("x"))
        except ValueError:
            parser.error(f"--shapes {text}: write batch x M x N x K as four whole numbers, like 64x512x512x512")
        if min(batch, M, N, K) < 1:
            parser.error(f"--shapes {text}: every size must be at least 1")
        shapes.append((batch, M, N, K))
    return shapes


def precompile(shapes, precisions, device: torch.device) -> None:
    """The member each batched shape runs, compiled at once in parallel processes."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    plans = []
    for precision in precisions:
        runtime = dispatch.library(precision, index)
        for batch, M, N, K in shapes:
            member = runtime.choose(M, N, K, K, K, N, batch=batch, strides=(M * K, K * N, M * N))
            plans.append(runtime.kernel_plan(member))
    compile_all(plans)


def operands(batch: int, M: int, N: int, K: int, layout: str, device: torch.device, seed: int):
    generator = torch.Generator(device="cpu").manual_seed(seed)
    A = (torch.rand(batch, M, K, generator=generator) * 2 - 1).to(device)
    B = (torch.rand(batch, K, N, generator=generator) * 2 - 1).to(device)
    if layout == "k-major":
        B = B.mT.contiguous().mT  # each matrix column-major: K contiguous
    return A, B, torch.empty(batch, M, N, device=device)


def measure(shape, precision: str, layout: str, args, device: torch.device) -> list[dict]:
    batch, M, N, K = shape
    A, B, out = operands(batch, M, N, K, layout, device, args.seed)
    expected = A.double() @ B.double()
    ways = {"gemmgen": lambda: gemmgen.matmul(A, B, out, precision=precision),
            "torch": lambda: torch.bmm(A, B, out=out)}
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        rows = []
        for way, call in ways.items():
            for _ in range(args.warmup):
                got = call()
            error = relative_error(got, expected)
            rows.append({"shape": "x".join(map(str, shape)), "precision": precision, "layout": layout, "way": way,
                         "error": error})
        times = {way: [] for way in ways}
        for _ in range(args.rounds):
            for way, call in ways.items():
                def run(call=call):
                    for _ in range(args.calls):
                        call()
                times[way].append(elapsed_ms(run, device) / args.calls)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    for row in rows:
        row["ms"] = statistics.median(times[row["way"]])
        row["ms_all"] = times[row["way"]]
        row["tflops"] = 2.0 * batch * M * N * K / row["ms"] / 1e9
    return rows


def sweep_members(shapes, precisions, args, device: torch.device) -> list[dict]:
    """Every member of each library timed at each batched shape (B k-major), beside the member the
    library chooses: whether the choice, made by a model fitted to single GEMMs, holds for batches."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(device).cuda_stream
    rows = []
    for precision in precisions:
        runtime = dispatch.library(precision, index)
        runtime.compile_all()
        for shape in shapes:
            batch, M, N, K = shape
            A, B, out = operands(batch, M, N, K, "k-major", device, args.seed)
            strides = (M * K, K * N, M * N)
            chosen = runtime.choose(M, N, K, K, K, N, (A.data_ptr(), B.data_ptr(), out.data_ptr()), 0.0, batch, strides)
            for member in range(len(runtime.plans)):
                kernel = runtime.kernel(member)

                def run(kernel=kernel):
                    for _ in range(args.calls):
                        kernel.launch(M, N, K, 1.0, A.data_ptr(), K, B.data_ptr(), K, 0.0, out.data_ptr(), N,
                                      stream=stream, batch=batch, strides=strides)
                run()
                ms = statistics.median(elapsed_ms(run, device) / args.calls for _ in range(args.rounds))
                rows.append({"shape": "x".join(map(str, shape)), "precision": precision,
                             "member": runtime.manifest.members[member].name, "chosen": member == chosen, "ms": ms,
                             "tflops": 2.0 * batch * M * N * K / ms / 1e9})
            print(f"{'x'.join(map(str, shape))} {precision}: every member timed", flush=True)
    return rows


def markdown(record: dict) -> str:
    rows = []
    results = record["results"]
    keys = dict.fromkeys((r["shape"], r["layout"], r["precision"]) for r in results)
    for shape, layout, precision in keys:
        ways = {r["way"]: r for r in results if (r["shape"], r["layout"], r["precision"]) == (shape, layout, precision)}
        ours, theirs = ways["gemmgen"], ways["torch"]
        rows.append([shape, layout, precision, f"{ours['ms']:.3f}", f"{theirs['ms']:.3f}",
                     f"{ours['tflops']:.1f}", f"{theirs['tflops']:.1f}", f"{theirs['ms'] / ours['ms']:.2f}",
                     f"{ours['error']:.1e}", f"{theirs['error']:.1e}"])
    header = ["batch x M x N x K", "B", "precision", "gemmgen ms", "torch.bmm ms", "gemmgen TFLOP/s",
              "torch TFLOP/s", "x torch", "gemmgen error", "torch error"]
    m, s = record["meta"], record["settings"]
    return (f"On {m['device']} (driver {m.get('driver')}), torch {m['torch']}, commit {m['commit']}, {m['date']}: "
            f"medians of {s['rounds']} rounds in turns, batches of {s['calls']} calls; gemmgen = "
            "gemmgen.matmul(A, B, out) (one strided-batched launch), torch = torch.bmm(A, B, out=out) in the same "
            "precision; B k-major: each matrix column-major, row-major: dense rows (both read in place); errors "
            "relative to float64:\n\n" + table(header, rows))


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    timed_arguments(parser, SHAPES, "BxMxNxK")
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS),
                        help="B's layouts to time (default both)")
    parser.add_argument("--members", action="store_true",
                        help="also time every library member at each shape (B k-major), marking the one chosen")
    args = parser.parse_args(argv)
    args.shapes = parse_batched_shapes(parser, args.shapes)
    check_timed_arguments(parser, args)
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    refuse_to_overwrite(args.out, args.force)
    device = torch.device(args.device)
    use_device(device)
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        try:
            precompile(args.shapes, args.precisions, device)
            for shape in args.shapes:
                for layout in args.layouts:
                    for precision in args.precisions:
                        results += measure(shape, precision, layout, args, device)
                        print(f"{'x'.join(map(str, shape))} B {layout} {precision}: measured", flush=True)
            members = sweep_members(args.shapes, args.precisions, args, device) if args.members else []
        except (ShapeError, FileNotFoundError, ValueError) as exc:
            sys.exit(f"error: {exc}")
    settings = {"shapes": ["x".join(map(str, s)) for s in args.shapes], "precisions": args.precisions,
                "layouts": args.layouts, "rounds": args.rounds, "calls": args.calls, "warmup": args.warmup,
                "seed": args.seed, "timing": "CUDA events over a batch of calls, median batch over rounds in turns"}
    record = {"meta": meta(args.commit, device), "settings": settings, "results": results}
    if members:
        record["members"] = members
    record["markdown"] = markdown(record)
    if members:
        record["markdown"] += "\n\nEvery member at each shape (B k-major; * the one the library chooses):\n\n" + table(
            ["batch x M x N x K", "precision", "member", "ms", "TFLOP/s"],
            [[r["shape"], r["precision"], r["member"] + (" *" if r["chosen"] else ""), f"{r['ms']:.4f}",
              f"{r['tflops']:.1f}"] for r in members])
    write_record(args.out, record)
    print(record["markdown"])
    return record


if __name__ == "__main__":
    main()
