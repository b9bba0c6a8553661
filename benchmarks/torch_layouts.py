"""gemmgen.matmul's TFLOP/s in every layout of A, B and C, beside the library's best layout and
beside torch.matmul in the same precision, in turns.

    python benchmarks/torch_layouts.py --out layouts.json [--precisions fp32 tf32] [--rounds 5] [--calls 10]

For each shape (M x N x K: 4096^3 and 2048 x 8192 x 2048 by default) and precision, the same values
lie in every layout: A (M x K) and B (K x N) row- or column-major (a column-major one is the
transposed view of a dense copy, as x.t() or weight.t()), and C row- or column-major, eight ways.
Each way is timed through gemmgen.matmul(A, B, C, precision=...) and through torch.matmul on the
same tensors (C = A @ B into C, or for a column-major C, C^T = B^T A^T into C^T, which is how
cuBLAS takes it), with torch.backends.cuda.matmul.allow_tf32 as the precision says. Every case is
warmed up (the first gemmgen call of a layout compiles its kernels), then timed as batches of
--calls back-to-back calls by CUDA events, the cases taking turns --rounds times; a case's figure is
its median batch. Each gemmgen layout is also given as a fraction of the best gemmgen layout at
that shape and precision (issue 26 asks for >= 0.9 in the four A/B layouts), and over torch.matmul.

The record also says which library serves each layout (fp32, fp32_rr, fp32_cc, fp32_cr; tf32 alike),
whether A and B swap (a column-major C), any copy gemmgen makes (a layout library not built yet),
and each result's error against float64. `--device cpu` is a dry run of the script itself.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings

import torch

from torch_records import (compile_libraries, elapsed_ms, meta, parse_shapes, refuse_to_overwrite, relative_error,
                           table, use_device, write_record)

import gemmgen
import gemmgen.library.dispatch as dispatch
from gemmgen.library.dispatch import PRECISIONS
from gemmgen.library.layouts import Operand, library_name, route
from gemmgen.gpu.runtime import ShapeError

SHAPES = ((4096, 4096, 4096), (2048, 8192, 2048))
LAYOUTS = tuple((a, b, c) for c in ("row", "col") for a in ("row", "col") for b in ("row", "col"))


def as_layout(values: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values, row-major, or column-major (a transposed view of a dense copy)."""
    return values.contiguous() if layout == "row" else values.t().contiguous().t()


def route_of(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, precision: str) -> dict:
    """Which library serves the call, whether A and B swap, and what is copied first (and why)."""
    operands = [Operand(name, *x.shape, tuple(x.stride())) for name, x in (("A", A), ("B", B), ("out", C))]
    way = route(*operands, dispatch.available_classes(precision), precision)
    return {"library": library_name(precision, way.klass), "swap": way.swap, "copies": list(way.reasons)}


def torch_call(A, B, C):
    if C.stride(1) == 1:
        return lambda: torch.matmul(A, B, out=C)
    return lambda: torch.matmul(B.t(), A.t(), out=C.t())  # C^T = B^T A^T, C^T row-major


def cases_for(M: int, N: int, K: int, precision: str, device: torch.device, seed: int):
    """[(layouts, "gemmgen" or "torch", call, C, route)] over the eight layouts, and the float64 product."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    a = (torch.rand(M, K, generator=generator) * 2 - 1).to(device)
    b = (torch.rand(K, N, generator=generator) * 2 - 1).to(device)
    expected = a.double() @ b.double()
    cases = []
    for layouts in LAYOUTS:
        A, B = as_layout(a, layouts[0]), as_layout(b, layouts[1])
        for way in ("gemmgen", "torch"):
            C = as_layout(torch.zeros(M, N, device=device), layouts[2])
            if way == "gemmgen":
                call = (lambda A=A, B=B, C=C: gemmgen.matmul(A, B, C, precision=precision))
                cases.append((layouts, way, call, C, route_of(A, B, C, precision)))
            else:
                cases.append((layouts, way, torch_call(A, B, C), C, None))
    return cases, expected


def measure(M: int, N: int, K: int, precision: str, args, device: torch.device) -> list[dict]:
    cases, expected = cases_for(M, N, K, precision, device, args.seed)
    tf32 = precision == "tf32"
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        rows = []
        for _, _, call, _, _ in cases:  # warm: compiled, loaded, resolved
            for _ in range(args.warmup):
                call()
        for layouts, way, _, C, route_ in cases:
            error = relative_error(C, expected)
            rows.append({"shape": f"{M}x{N}x{K}", "precision": precision, "A": layouts[0], "B": layouts[1],
                         "C": layouts[2], "way": way, "error": error, **({"route": route_} if route_ else {})})
        times = [[] for _ in cases]
        for _ in range(args.rounds):
            for index, (_, _, call, _, _) in enumerate(cases):
                def batch(call=call):
                    for _ in range(args.calls):
                        call()
                times[index].append(elapsed_ms(batch, device) / args.calls)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    flops = 2.0 * M * N * K
    for row, measured in zip(rows, times):
        row["ms"] = statistics.median(measured)
        row["ms_all"] = measured
        row["tflops"] = flops / row["ms"] / 1e9
    ours = [row for row in rows if row["way"] == "gemmgen"]
    best = max(ours, key=lambda row: row["tflops"])
    for row in ours:
        row["x_best_layout"] = row["tflops"] / best["tflops"]
        row["best_layout"] = f"A {best['A']}, B {best['B']}, C {best['C']}"
        twin = next(r for r in rows if r["way"] == "torch" and (r["A"], r["B"], r["C"]) == (row["A"], row["B"], row["C"]))
        row["x_torch"] = row["tflops"] / twin["tflops"]
    return rows


def markdown(record: dict) -> str:
    rows = []
    for row in record["results"]:
        if row["way"] != "gemmgen":
            continue
        twin = next(r for r in record["results"] if r["way"] == "torch" and r["shape"] == row["shape"]
                    and r["precision"] == row["precision"] and (r["A"], r["B"], r["C"]) == (row["A"], row["B"], row["C"]))
        served = row["route"]["library"] + (" (A, B swapped)" if row["route"]["swap"] else "")
        if row["route"]["copies"]:
            served += ", copies an operand"
        rows.append([row["shape"], row["precision"], f"{row['A']} / {row['B']} / {row['C']}", f"{row['tflops']:.1f}",
                     f"{row['x_best_layout']:.2f}", f"{twin['tflops']:.1f}", f"{row['x_torch']:.2f}",
                     f"{row['error']:.1e}", f"{twin['error']:.1e}", served])
    header = ["shape", "precision", "A / B / C", "gemmgen TFLOP/s", "x best layout", "torch.matmul TFLOP/s",
              "x torch", "gemmgen error", "torch error", "served by"]
    m, s = record["meta"], record["settings"]
    return (f"On {m['device']} (driver {m.get('driver')}), torch {m['torch']}, commit {m['commit']}, {m['date']}: "
            f"medians of {s['rounds']} rounds in turns, batches of {s['calls']} calls; torch.matmul in the same "
            f"precision (allow_tf32 off for fp32, on for tf32); errors relative (Frobenius) to float64:\n\n"
            + table(header, rows))


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write the record to")
    parser.add_argument("--force", action="store_true", help="replace --out even if gemmgen did not write it")
    parser.add_argument("--commit", help="the commit to record (default: $GEMMGEN_COMMIT, else git's HEAD)")
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    parser.add_argument("--shapes", nargs="+", metavar="MxNxK", default=["x".join(map(str, s)) for s in SHAPES])
    parser.add_argument("--rounds", type=int, default=5, help="batches of each case, in turns (default 5)")
    parser.add_argument("--calls", type=int, default=10, help="calls in a timed batch (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls of each case first (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-precompile", dest="precompile", action="store_false",
                        help="compile gemmgen's kernels on first use rather than all at once, in parallel, first")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a dry run")
    args = parser.parse_args(argv)
    args.shapes = parse_shapes(parser, args.shapes)
    for name in ("rounds", "calls"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (the results' errors are read from the warm-up's output)")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        parser.error("torch sees no CUDA GPU (--device cpu runs the script dry)")
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    refuse_to_overwrite(args.out, args.force)
    device = torch.device(args.device)
    use_device(device)
    results, noted = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if args.precompile:
                compile_libraries(args.precisions, device)
            for M, N, K in args.shapes:
                for precision in args.precisions:
                    results += measure(M, N, K, precision, args, device)
                    print(f"{M}x{N}x{K} {precision}: measured", flush=True)
        except (ShapeError, FileNotFoundError) as exc:  # gemmgen's reasons (a library missing, say)
            sys.exit(f"error: {exc}")
    for warning in caught:
        text = f"{warning.category.__name__}: {warning.message}"
        if text not in noted:
            noted.append(text)
            print(f"warning: {text}", file=sys.stderr)
    settings = {"shapes": ["x".join(map(str, s)) for s in args.shapes], "precisions": args.precisions,
                "rounds": args.rounds, "calls": args.calls, "warmup": args.warmup, "seed": args.seed,
                "timing": "CUDA events over a batch of calls, median batch over rounds in turns"}
    record = {"benchmark": "torch_layouts", "meta": meta(args.commit, device), "settings": settings,
              "results": results, "warnings": noted}
    write_record(args.out, record)
    print("\n" + markdown(record) + f"\n\nwrote {args.out}")
    return record


if __name__ == "__main__":
    main()
