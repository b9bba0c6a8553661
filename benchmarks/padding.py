"""Padding (gemmgen/library/padding.py) measured: for unaligned calls of every size, the library's
decision beside both of its ways and cuBLAS, in turns with L2 flushed, so that the decision's
constants (selection.PAD_GB_PER_MS, PAD_COPY_MS, PAD_GAIN) rest on measurements.

    python benchmarks/padding.py --out padding.json [--shapes 2047x2047x2047 ...] [--pads 0 1]

Per precision, shape and padding (each leading dimension its extent + pad; an odd extent needs none):
- `decided`: the library as a call runs it (LibraryRuntime.launch);
- `unpadded`: the unaligned class's member on the call as it is;
- `padded`: the aligned class's member on padded copies (a PaddedLaunch, whatever the decision);
- `aligned`: that member alone on already padded operands (padded minus this is the copies' cost);
- cuBLAS in the library's precision (torch.matmul on the same views).
Each is timed by gemmgen's bench (CUDA events, each run after an L2 flush, in turns; medians). The
record holds per shape the predicted times (model) and the measured ones, and says where the
decision took the slower way.
"""

from __future__ import annotations

import argparse
import sys

import torch

from torch_records import (check_timed_arguments, meta, parse_shapes, refuse_to_overwrite, table, use_device,
                           write_record)

import gemmgen.library.dispatch as dispatch
from gemmgen.gpu import bench as gpu_bench
from gemmgen.gpu.baseline import cublas_gemm
from gemmgen.gpu.runtime import device_info
from gemmgen.library.padding import PaddedLaunch, padding
from gemmgen.library.selection import best_in_class, pad_ms

SHAPES = ((255, 255, 255), (511, 511, 511), (767, 767, 767), (1023, 1023, 1023), (1531, 1531, 1531),
          (2047, 2047, 2047), (3071, 3071, 3071), (4095, 4095, 4095), (1024, 1024, 1024), (4096, 4096, 4096),
          (127, 4099, 1023), (4095, 4095, 511), (511, 511, 16383), (16, 11008, 4095), (255, 4095, 4095),
          (8191, 1023, 1023))
ROW_COL = {"A": "row", "B": "col", "C": "row"}


def operand(rows: int, cols: int, layout: str, pad: int, generator) -> torch.Tensor:
    lines, length = (rows, cols) if layout == "row" else (cols, rows)
    base = torch.rand(lines, length + pad, device="cuda", generator=generator) * 2 - 1
    x = base[:, :length]
    return x if layout == "row" else x.t()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write the record to")
    parser.add_argument("--force", action="store_true", help="replace --out even if gemmgen did not write it")
    parser.add_argument("--commit", help="the commit to record (default: $GEMMGEN_COMMIT, else git's HEAD)")
    parser.add_argument("--precisions", nargs="+", choices=dispatch.PRECISIONS, default=list(dispatch.PRECISIONS))
    parser.add_argument("--shapes", nargs="+", metavar="MxNxK", default=["x".join(map(str, s)) for s in SHAPES])
    parser.add_argument("--pads", nargs="+", type=int, default=[1],
                        help="floats added to each leading dimension where the extent is a multiple of 4 "
                             "(default 1; an odd extent runs as it is)")
    parser.add_argument("--budget", type=float, default=0.3, help="seconds of timing per way and shape (default 0.3)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.shapes = parse_shapes(parser, args.shapes)
    if any(p < 1 for p in args.pads):
        parser.error("--pads must be 1 or more (0 is an aligned call, which never pads)")
    args.rounds = args.calls = args.warmup = 1
    args.device = "cuda"
    check_timed_arguments(parser, args)
    refuse_to_overwrite(args.out, args.force)
    device = torch.device("cuda")
    use_device(device)
    info = device_info(torch.cuda.current_device())
    flusher = gpu_bench.L2Flusher(info)
    stream = torch.cuda.current_stream().cuda_stream
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    results = []
    for precision in args.precisions:
        runtime = dispatch.library(precision, torch.cuda.current_device())
        runtime.compile_all()
        for M, N, K in args.shapes:
            for pad in sorted({0 if min(K % 4, N % 4) else p for p in args.pads}):
                results.append(_measure(runtime, precision, M, N, K, pad, generator, flusher, stream, args.budget))
                r = results[-1]
                print(f"{precision} {M}x{N}x{K} ld+{pad}: decided {r['decided']} "
                      + " ".join(f"{w} {r['ms'][w]:.4f}" for w in r["ms"]), flush=True)
    rows = [[r["precision"], r["shape"], str(r["pad"]), r["decided"], f"{r['predicted']['unpadded']:.4f}",
             f"{r['predicted']['padded']:.4f}", f"{r['ms']['unpadded']:.4f}", f"{r['ms']['padded']:.4f}",
             f"{r['ms']['aligned']:.4f}", f"{r['ms']['cuBLAS']:.4f}", f"{r['x_cublas']:.2f}",
             "yes" if r["right"] else "**no**"] for r in results]
    m = meta(args.commit, device)
    wrong = [f"{r['precision']} {r['shape']} ld+{r['pad']}" for r in results if not r["right"]]
    record = {"meta": m, "settings": {"shapes": ["x".join(map(str, s)) for s in args.shapes], "pads": args.pads,
                                      "budget_s": args.budget}, "results": results, "wrong": wrong}
    record["markdown"] = (
        f"On {m['device']} (driver {m.get('driver')}), commit {m['commit']}, {m['date']}: unaligned calls (each "
        "leading dimension its extent + pad), the library's decision beside both ways, in ms (L2 flushed, in "
        "turns); `aligned` is the padded way's member on already padded operands; right: the decision took the "
        "faster way (or the two are within 5%).\n\n"
        + table(["precision", "M x N x K", "pad", "decided", "model: unpadded", "model: padded", "unpadded",
                 "padded", "aligned", "cuBLAS", "decided x cuBLAS", "right"], rows)
        + f"\n\nDecided the slower way at {len(wrong)} of {len(results)}"
        + (f": {', '.join(wrong)}." if wrong else "."))
    write_record(args.out, record)
    print(record["markdown"])
    return record


def _measure(runtime, precision, M, N, K, pad, generator, flusher, stream, budget) -> dict:
    A, B = operand(M, K, "row", pad, generator), operand(K, N, "col", pad, generator)
    C = operand(M, N, "row", pad, generator)
    lds = (A.stride(0), B.stride(1), C.stride(0))
    pointers = (A.data_ptr(), B.data_ptr(), C.data_ptr())
    pads = padding(ROW_COL, M, N, K, lds, pointers, 1, (0, 0, 0))
    unaligned = runtime.choose(M, N, K, *lds, pointers, 0.0)
    sms = runtime.info.sm_count
    member, aligned_ms = best_in_class(runtime.candidates, M, N, K, "aligned", sms, False, True, 1, runtime.exact_rows)
    _, unaligned_ms = best_in_class(runtime.candidates, M, N, K, "unaligned", sms, False, True, 1, runtime.exact_rows)
    copy_ms = pad_ms(pads.copies(False))
    decided = runtime.padding(M, N, K, lds, pointers, False)
    unpadded_run = runtime.kernel(unaligned).prepare(M, N, K, *lds, tuple(p % 16 for p in pointers), False)
    aligned_run = runtime.kernel(member).prepare(M, N, K, *pads.lds, (0, 0, 0), False, 1, pads.strides)
    padded_run = PaddedLaunch(pads, member, aligned_run, unpadded_run, runtime.device, precision == "tf32")
    Ap, Bp, Cp = (operand(M, K, "row", pads.lds[0] - K, generator), operand(K, N, "col", pads.lds[1] - K, generator),
                  operand(M, N, "row", pads.lds[2] - N, generator))
    ways = {
        "decided": lambda: runtime.launch(M, N, K, 1.0, *_abi(A, B, C, lds), stream=stream),
        "unpadded": lambda: unpadded_run(*pointers, 1.0, 0.0, stream),
        "padded": lambda: padded_run(*pointers, 1.0, 0.0, stream),
        "aligned": lambda: aligned_run(Ap.data_ptr(), Bp.data_ptr(), Cp.data_ptr(), 1.0, 0.0, stream),
        "cuBLAS": lambda: cublas_gemm(M, N, K, 1.0, *_abi(A, B, C, lds), ROW_COL, tf32=precision == "tf32"),
    }
    timings = gpu_bench.time_alternating(list(ways.values()), flush=flusher, budget_s=budget)
    ms = {way: t.median_ms for way, t in zip(ways, timings)}
    chose = "padded" if decided is not None else "unpadded"
    other = "unpadded" if decided is not None else "padded"
    return {"precision": precision, "shape": f"{M}x{N}x{K}", "M": M, "N": N, "K": K, "pad": pad, "lds": lds,
            "decided": chose, "members": {"unpadded": runtime.manifest.members[unaligned].name,
                                          "padded": runtime.manifest.members[member].name},
            "predicted": {"unpadded": unaligned_ms, "padded": aligned_ms + copy_ms, "aligned": aligned_ms,
                          "copies": copy_ms},
            "copied_floats": sum(c * r * w for c, r, w in pads.copies(False)), "ms": ms,
            "x_cublas": ms["cuBLAS"] / ms["decided"], "right": ms[chose] <= 1.05 * ms[other]}


def _abi(A, B, C, lds):
    return A.data_ptr(), lds[0], B.data_ptr(), lds[1], 0.0, C.data_ptr(), lds[2]


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
