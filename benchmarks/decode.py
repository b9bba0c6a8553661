"""Decode-sized GEMMs (issue 28): the decode kernel and the fp32 / tf32 libraries beside cuBLAS, in turns.

    export PYTHONPATH=/tmp/site:$PWD
    python benchmarks/decode.py --out decode.json [--space] [--rounds 7] [--calls 10]

Shapes (M x N x K): M in {1, 4, 16} against weights of (N, K) in (4096, 4096), (11008, 4096),
(4096, 11008), (14336, 4096), (128256, 4096), and their mirrors with N in {1, 4, 16} (M = the
weight's N): A is M x K row-major, B is K x N column-major (an nn.Linear weight, K contiguous), C is
M x N row-major. The big operand is B (M small) or A (N small); its bytes over the time are the
figure that counts (issue 28 asks >= 80% of the H100's HBM3 peak, 3.35e12 B/s, where K * N >= 16M).

Ways, on the same sizes, each timed as batches of --calls calls by CUDA events, in turns, --rounds
times; a way's figure is its median batch:
- decode: gemmgen's decode kernel (specs/decode.gemm, or --spec FILE [--kernel NAME]) on raw pointers;
  with --space, also every point of the libraries' decode search spaces: decode_CxWxS (columns x warps
  x slices) of lib_fp32_decode (FFMA), decode_CxWxS_3xtf32 of lib_fp32_decode_tc and decode_CxWxS_tf32
  of lib_tf32_decode_tc (the tensor path at every row count); the best FP32-accurate one
  (FFMA or 3xtf32) reported as decode_best, the best of all (tf32 too) as decode_best_tf32;
- gemmgen_fp32, gemmgen_tf32: gemmgen.matmul(A, B, out, precision=...) (the libraries' choice);
- cublas_fp32, cublas_tf32: torch.matmul(A, B, out=out) with allow_tf32 off / on.
The big operand is rotated over copies that span at least --rotate-mb MB (default 256, five times an
H100's L2), so no call finds it in L2 (DESIGN.md's "with inputs rotated"). Errors are relative
(Frobenius) to float64.

Needs a CUDA GPU with torch, cuda-python and numpy (no CuPy).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

from torch_records import (check_timed_arguments, elapsed_ms, meta, refuse_to_overwrite, relative_error, table,
                           use_device, write_record)

import gemmgen
from gemmgen.gpu.compile import compile_all
from gemmgen.gpu.runtime import Kernel
from gemmgen.language.load import load_one
from gemmgen.plan import make_plan, try_plan

ROOT = Path(__file__).resolve().parent.parent
BEST = ("decode_best", "decode_best_tf32")  # the ways of the best --space point, shown in the summaries
HBM3_PEAK = 3.35e12  # bytes/s of an H100 SXM's HBM3
TOKENS = (1, 4, 16)
# The libraries' decode search spaces that --space times: FFMA, and the tensor path in each precision.
SPACES = (("fp32.gemm", "lib_fp32_decode"), ("fp32.gemm", "lib_fp32_decode_tc"), ("tf32.gemm", "lib_tf32_decode_tc"))
WEIGHTS = ((4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096), (128256, 4096))


def default_shapes() -> list[tuple[int, int, int]]:
    shapes = [(m, n, k) for n, k in WEIGHTS for m in TOKENS]
    return shapes + [(n, m, k) for n, k in WEIGHTS for m in TOKENS]  # the mirrors: N small


def parse_shapes(parser, texts) -> list[tuple[int, int, int]]:
    shapes = []
    for text in texts:
        try:
            M, N, K = (int(x) for x in text.lower().split("x"))
        except ValueError:
            parser.error(f"--shapes {text}: write M x N x K as three whole numbers, like 1x4096x4096")
        if min(M, N, K) < 1:
            parser.error(f"--shapes {text}: every size must be at least 1")
        shapes.append((M, N, K))
    return shapes


def decode_kernels(args) -> dict[str, Kernel]:
    """The decode kernel(s) to time: the spec's, and with --space every point of the library's space."""
    spec = load_one(Path(args.spec), args.kernel)
    plans = {"decode": make_plan(spec)}
    if args.space:
        for file, member in SPACES:
            for point in load_one(ROOT / "specs" / file, member).points():
                plan, _ = try_plan(point)  # the tensor path takes blocks of whole tiles of 16 columns alone
                if plan is None:
                    continue
                m = plan.mainloop
                name = f"decode_{m.columns}x{m.warps}x{m.slices}" + (f"_{m.math}" if m.math != "simt" else "")
                plans[name] = make_plan(replace(point, name=name))
    compile_all(list(plans.values()))
    return {name: Kernel(plan) for name, plan in plans.items()}


def operands(M: int, N: int, K: int, copies: int, device, seed: int):
    """A (M x K row-major) and B (K x N, column-major: Bt N x K contiguous), the big one of them in
    `copies` copies; C (M x N)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    A = (torch.rand(M, K, generator=generator) * 2 - 1).to(device)
    Bt = (torch.rand(N, K, generator=generator) * 2 - 1).to(device)
    As = [A] + [A.clone() for _ in range(copies - 1)] if M > N else [A]
    Bts = [Bt] + [Bt.clone() for _ in range(copies - 1)] if M <= N else [Bt]
    return As, Bts, torch.empty(M, N, device=device)


def measure(shape, kernels: dict[str, Kernel], args, device) -> list[dict]:
    M, N, K = shape
    big_bytes = 4 * K * max(M, N)
    copies = max(1, math.ceil(args.rotate_mb * 2**20 / big_bytes))
    As, Bts, out = operands(M, N, K, copies, device, args.seed)
    expected = As[0].double() @ Bts[0].double().T
    stream = torch.cuda.current_stream(device).cuda_stream

    def operand(i):  # the i-th call's A and B (B = Bt.T: K x N, K contiguous)
        return As[i % len(As)], Bts[i % len(Bts)].T

    def kernel_way(kernel):
        def call(i):
            A, B = operand(i)
            kernel.launch(M, N, K, 1.0, A.data_ptr(), K, B.data_ptr(), K, 0.0, out.data_ptr(), N, stream=stream)
        return call, False

    def library_way(precision):
        def call(i):
            A, B = operand(i)
            gemmgen.matmul(A, B, out, precision=precision)
        return call, False

    def cublas_way(tf32):
        def call(i):
            A, B = operand(i)
            torch.matmul(A, B, out=out)
        return call, tf32

    ways = {name: kernel_way(kernel) for name, kernel in kernels.items()}
    ways.update({f"gemmgen_{p}": library_way(p) for p in args.precisions})
    ways.update({f"cublas_{p}": cublas_way(p == "tf32") for p in args.precisions})
    saved = torch.backends.cuda.matmul.allow_tf32
    rows = {}
    try:
        for name, (call, tf32) in ways.items():
            torch.backends.cuda.matmul.allow_tf32 = tf32
            for i in range(args.warmup):
                call(i)
            error = relative_error(out, expected)
            rows[name] = {"shape": f"{M}x{N}x{K}", "way": name, "error": error, "ms_all": []}
        for _ in range(args.rounds):
            for name, (call, tf32) in ways.items():
                torch.backends.cuda.matmul.allow_tf32 = tf32

                def run(call=call):
                    for i in range(args.calls):
                        call(i)
                rows[name]["ms_all"].append(elapsed_ms(run, device) / args.calls)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    for row in rows.values():
        row["ms"] = statistics.median(row["ms_all"])
        row["big_operand"] = "B" if M <= N else "A"
        row["gb_per_s"] = big_bytes / row["ms"] / 1e6
        row["hbm_fraction"] = big_bytes / (row["ms"] * 1e-3) / HBM3_PEAK
        row["counts"] = K * max(M, N) >= 16 * 2**20 and min(M, N) <= 16  # issue 28's rule
    decode_points = [r for name, r in rows.items() if name.startswith("decode_")]
    result = list(rows.values())
    accurate = [r for r in decode_points if not r["way"].endswith("_tf32")]  # FFMA and 3xtf32: FP32-accurate
    for way, points in (("decode_best", accurate), ("decode_best_tf32", decode_points)):
        if points:
            best = min(points, key=lambda r: r["ms"])
            result.append({**best, "way": way, "point": best["way"]})
    return result


def markdown(record: dict) -> str:
    results = record["results"]
    ways = list(dict.fromkeys(r["way"] for r in results if not r["way"].startswith("decode_") or r["way"] in BEST))
    rows = []
    for shape in dict.fromkeys(r["shape"] for r in results):
        by_way = {r["way"]: r for r in results if r["shape"] == shape}
        cells = [shape]
        for way in ways:
            r = by_way.get(way)
            cells.append(f"{r['gb_per_s']:.0f} ({r['hbm_fraction']:.2f})" if r else "")
        for precision in record["settings"]["precisions"]:
            ours, theirs = by_way.get(f"gemmgen_{precision}"), by_way.get(f"cublas_{precision}")
            cells.append(f"{theirs['ms'] / ours['ms']:.2f}" if ours and theirs else "")
        rows.append(cells)
    header = (["M x N x K"] + [f"{w} GB/s (x peak)" for w in ways]
              + [f"gemmgen_{p} x cublas_{p}" for p in record["settings"]["precisions"]])
    m, s = record["meta"], record["settings"]
    return (f"On {m['device']} (driver {m.get('driver')}), torch {m['torch']}, commit {m['commit']}, {m['date']}: "
            f"bytes of the big operand over the median of {s['rounds']} rounds in turns (batches of {s['calls']} "
            f"calls, the big operand rotated over {s['rotate_mb']} MB); peak {HBM3_PEAK:.3g} B/s:\n\n" + table(header, rows))


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write the record to")
    parser.add_argument("--force", action="store_true", help="replace --out even if gemmgen did not write it")
    parser.add_argument("--commit", help="the commit to record (default: $GEMMGEN_COMMIT, else git's HEAD)")
    parser.add_argument("--precisions", nargs="+", choices=("fp32", "tf32"), default=["fp32", "tf32"])
    parser.add_argument("--shapes", nargs="+", metavar="MxNxK", help="default: the module docstring's 30 shapes")
    parser.add_argument("--spec", default=str(ROOT / "specs" / "decode.gemm"), help="the decode kernel's spec file")
    parser.add_argument("--kernel", default=None, help="the kernel in --spec (default: its only one)")
    parser.add_argument("--space", action="store_true",
                        help="also time every point of lib_fp32_decode, lib_fp32_decode_tc and lib_tf32_decode_tc")
    parser.add_argument("--rotate-mb", type=int, default=256, help="MB the big operand's copies span (default 256)")
    parser.add_argument("--rounds", type=int, default=7, help="timed batches of each way, in turns (default 7)")
    parser.add_argument("--calls", type=int, default=10, help="calls in a timed batch (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls of each way first (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cuda:N")
    args = parser.parse_args(argv)
    args.shapes = parse_shapes(parser, args.shapes) if args.shapes else default_shapes()
    check_timed_arguments(parser, args)
    if args.rotate_mb < 0:
        parser.error("--rotate-mb must be at least 0")
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    refuse_to_overwrite(args.out, args.force)
    device = torch.device(args.device)
    use_device(device)
    try:
        kernels = decode_kernels(args)
    except Exception as exc:  # a bad --spec: its SpecError says where
        sys.exit(f"error: {exc}")
    results = []
    for shape in args.shapes:
        rows = measure(shape, kernels, args, device)
        results += rows
        summary = ", ".join(f"{r['way']} {r['gb_per_s']:.0f} GB/s" + (f" ({r['point']})" if "point" in r else "")
                            for r in rows if not r["way"].startswith("decode_") or r["way"] in BEST)
        print(f"{'x'.join(map(str, shape))}: {summary}", flush=True)
    settings = {"shapes": ["x".join(map(str, s)) for s in args.shapes], "precisions": args.precisions,
                "spec": args.spec, "space": args.space, "rotate_mb": args.rotate_mb, "rounds": args.rounds,
                "calls": args.calls, "warmup": args.warmup, "seed": args.seed, "hbm_peak": HBM3_PEAK,
                "timing": "CUDA events over a batch of calls, median batch over rounds in turns"}
    record = {"meta": meta(args.commit, device), "settings": settings, "results": results}
    record["markdown"] = markdown(record)
    write_record(args.out, record)
    print(record["markdown"])
    return record


if __name__ == "__main__":
    main()
