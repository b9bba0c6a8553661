"""The fused epilogue's cost and gain (issue 29): gemmgen.linear with bias and GELU beside the same
library's plain GEMM, and beside PyTorch's F.gelu(F.linear(...)), in turns.

    python benchmarks/torch_epilogue.py --out epilogue.json [--precisions fp32 tf32] [--rounds 7] [--calls 10]

For each shape M x N x K (4096^3, 2048 x 5632 x 2048 and 8192 x 1024 x 1024 by default: x is M x K,
weight N x K, bias N) and precision, three cases take turns:

- plain: gemmgen.matmul(x, weight.t(), out), the library member chosen for the shape, no epilogue;
- fused: gemmgen.linear(x, weight, bias, "gelu"), the same member with the bias and GELU in its store;
- torch: F.gelu(F.linear(x, weight, bias)) in the same precision (allow_tf32 off for fp32, on for tf32).

Issue 29 asks fused >= 0.97 x plain ("the epilogue is hidden") in both precisions, and fused >= 2.2 x
torch in fp32. The kernels are compiled first, in parallel (the chosen members and their fused
variants); each case is warmed up, then timed as batches of --calls calls by CUDA events, in turns,
--rounds times; a case's figure is its median batch. Errors are relative to float64 (Frobenius).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F

from torch_records import (check_timed_arguments, elapsed_ms, meta, parse_shapes, refuse_to_overwrite, relative_error,
                           table, timed_arguments, use_device, write_record)

import gemmgen
import gemmgen.library.dispatch as dispatch
from gemmgen.gpu.compile import compile_all
from gemmgen.library.fused import fused_members
from gemmgen.gpu.runtime import ShapeError

SHAPES = ((4096, 4096, 4096), (2048, 5632, 2048), (8192, 1024, 1024))
ACTIVATION = "gelu"


def precompile(shapes, precisions, device: torch.device) -> None:
    """The member each shape runs and its fused variant, compiled at once in parallel processes."""
    if device.type != "cuda":
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    plans = []
    for precision in precisions:
        runtime = dispatch.library(precision, index)
        for M, N, K in shapes:
            member = runtime.choose(M, N, K, K, K, N)
            plans.append(runtime.kernel_plan(member))
            fused = fused_members(runtime).plan(member, True, ACTIVATION)
            if fused is not None:
                plans.append(fused)
    compile_all(plans)


def cases_for(M: int, N: int, K: int, precision: str, device: torch.device, seed: int):
    generator = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.rand(M, K, generator=generator) * 2 - 1).to(device)
    weight = ((torch.rand(N, K, generator=generator) * 2 - 1) / K ** 0.5).to(device)
    bias = (torch.rand(N, generator=generator) * 2 - 1).to(device)
    out = torch.empty(M, N, device=device)
    expected = F.gelu(F.linear(x.double(), weight.double(), bias.double()))
    plain_expected = x.double() @ weight.double().t()
    return {
        "plain": (lambda: gemmgen.matmul(x, weight.t(), out, precision=precision), plain_expected),
        "fused": (lambda: gemmgen.linear(x, weight, bias, ACTIVATION, precision=precision), expected),
        "torch": (lambda: F.gelu(F.linear(x, weight, bias)), expected),
    }


def measure(M: int, N: int, K: int, precision: str, args, device: torch.device) -> list[dict]:
    cases = cases_for(M, N, K, precision, device, args.seed)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        rows = []
        for way, (call, expected) in cases.items():
            for _ in range(args.warmup):
                got = call()
            error = relative_error(got, expected)
            rows.append({"shape": f"{M}x{N}x{K}", "precision": precision, "way": way, "error": error})
        times = {way: [] for way in cases}
        for _ in range(args.rounds):
            for way, (call, _) in cases.items():
                def batch(call=call):
                    for _ in range(args.calls):
                        call()
                times[way].append(elapsed_ms(batch, device) / args.calls)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    for row in rows:
        row["ms"] = statistics.median(times[row["way"]])
        row["ms_all"] = times[row["way"]]
        row["tflops"] = 2.0 * M * N * K / row["ms"] / 1e9
    return rows


def markdown(record: dict) -> str:
    rows = []
    results = record["results"]
    for shape in dict.fromkeys(r["shape"] for r in results):
        for precision in dict.fromkeys(r["precision"] for r in results):
            ways = {r["way"]: r for r in results if r["shape"] == shape and r["precision"] == precision}
            if not ways:
                continue
            plain, fused, torch_ = ways["plain"], ways["fused"], ways["torch"]
            rows.append([shape, precision, f"{plain['ms']:.3f}", f"{fused['ms']:.3f}", f"{torch_['ms']:.3f}",
                         f"{plain['ms'] / fused['ms']:.3f}", f"{torch_['ms'] / fused['ms']:.2f}",
                         f"{fused['error']:.1e}", f"{torch_['error']:.1e}"])
    header = ["M x N x K", "precision", "plain GEMM ms", "fused ms", "torch ms", "plain / fused",
              "torch / fused", "fused error", "torch error"]
    m, s = record["meta"], record["settings"]
    return (f"On {m['device']} (driver {m.get('driver')}), torch {m['torch']}, commit {m['commit']}, {m['date']}: "
            f"medians of {s['rounds']} rounds in turns, batches of {s['calls']} calls; fused = gemmgen.linear(x, w, b, "
            f"'{ACTIVATION}'), plain = gemmgen.matmul(x, w.t(), out) (the same library), torch = "
            f"F.{ACTIVATION}(F.linear(x, w, b)) in the same precision; errors relative to float64:\n\n"
            + table(header, rows))


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    timed_arguments(parser, SHAPES)
    args = parser.parse_args(argv)
    args.shapes = parse_shapes(parser, args.shapes)
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
            for M, N, K in args.shapes:
                for precision in args.precisions:
                    results += measure(M, N, K, precision, args, device)
                    print(f"{M}x{N}x{K} {precision}: measured", flush=True)
        except (ShapeError, FileNotFoundError, ValueError) as exc:
            sys.exit(f"error: {exc}")
    settings = {"shapes": ["x".join(map(str, s)) for s in args.shapes], "precisions": args.precisions,
                "rounds": args.rounds, "calls": args.calls, "warmup": args.warmup, "seed": args.seed,
                "activation": ACTIVATION,
                "timing": "CUDA events over a batch of calls, median batch over rounds in turns"}
    record = {"meta": meta(args.commit, device), "settings": settings, "results": results}
    record["markdown"] = markdown(record)
    write_record(args.out, record)
    print(record["markdown"])
    return record


if __name__ == "__main__":
    main()
