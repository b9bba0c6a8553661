"""The cp.async-fed TF32 wgmma kernel (`stages N copy`) beside the TMA-fed one and cuBLAS TF32, in
every layout of A and B, with leading dimensions TMA takes and ones it does not (odd: the TMA kernel
runs its register-fed fallback there), in turns.

    python benchmarks/copy_fill.py --out copy.json [--shapes 4096x4096x4096 ...] [--pads 0 1] [--rounds 7]

Kernels per shape and padding: the tf32 library's chosen member (TMA-fed, A row B col; with odd
leading dimensions it hands the call to its fallback), and `specs/hopper_tf32_copy.gemm` with
128 x 256 and 128 x 128 blocks in each layout of A and B; torch.matmul with TF32 in the same
layout is cuBLAS TF32's time. `--pads 1` adds a float to each leading dimension (odd for 4096).
Each is timed by CUDA events over --calls launches, --rounds times in turns; medians. Errors are
against float64. What it settles: whether copies keep pace with TMA (issue 28: TF32 at every
shape, the odd ones included) and make the MN-major layouts cost nothing (issue 26: each layout
>= 0.9x the best).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

from torch_records import (check_timed_arguments, elapsed_ms, meta, parse_shapes, refuse_to_overwrite, relative_error,
                           table, timed_arguments, use_device, write_record)

import gemmgen.library.dispatch as dispatch
from gemmgen.gpu.compile import compile_all
from gemmgen.gpu.runtime import Kernel
from gemmgen.language.load import load_one
from gemmgen.plan import make_plan

SHAPES = ((4096, 4096, 4096), (2048, 8192, 2048), (2047, 2047, 2047))
LAYOUTS = (("row", "col"), ("col", "col"), ("row", "row"), ("col", "row"))
SPEC = Path(__file__).resolve().parent.parent / "specs" / "hopper_tf32_copy.gemm"


def copy_plans():
    """(label, plan) of the copy kernel's blocks in every layout."""
    shipped = load_one(SPEC, "hopper_tf32_copy")
    found = []
    for block, values in (("128x256", {}), ("128x128", {"block_n": 128, "warp_n": 128, "mma_n": 128})):
        for a, b in LAYOUTS:
            spec = shipped.with_values(layout_A=a, layout_B=b, **values)
            found.append((f"copy {block} A {a}, B {b}", make_plan(replace(spec, name=f"copy_{block}_{a[0]}{b[0]}"))))
    return found


def operand(rows: int, cols: int, layout: str, pad: int, device, generator) -> torch.Tensor:
    """A rows x cols view in `layout` whose leading dimension is its contiguous extent + pad."""
    lines, length = (rows, cols) if layout == "row" else (cols, rows)
    base = torch.rand(lines, length + pad, device=device, generator=generator) * 2 - 1
    x = base[:, :length]
    return x if layout == "row" else x.t()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    timed_arguments(parser, SHAPES)
    parser.add_argument("--pads", nargs="+", type=int, default=[0, 1],
                        help="floats added to each leading dimension (default 0 1)")
    args = parser.parse_args(argv)
    args.shapes = parse_shapes(parser, args.shapes)
    check_timed_arguments(parser, args)
    if any(p < 0 for p in args.pads):
        parser.error("--pads must be 0 or more")
    refuse_to_overwrite(args.out, args.force)
    device = torch.device(args.device)
    use_device(device)
    stream = torch.cuda.current_stream().cuda_stream
    runtime = dispatch.library("tf32", torch.cuda.current_device())
    copies = copy_plans()
    members = {s: runtime.kernel_plan(runtime.choose(*s, s[2], s[2], s[1])) for s in args.shapes}
    compile_all([p for _, p in copies] + list(members.values()))
    kernels = {}
    generator = torch.Generator(device=device).manual_seed(args.seed)
    results = []
    for M, N, K in args.shapes:
        for pad in args.pads:
            runs = {}  # label -> (run, times, (layouts, kernel name) or None for torch, out, reference)
            for label, plan in [("TMA member A row, B col", members[(M, N, K)])] + copies:
                a_layout, b_layout = plan.spec["layout.A"], plan.spec["layout.B"]
                A = operand(M, K, a_layout, pad, device, generator)
                B = operand(K, N, b_layout, pad, device, generator)
                out = torch.empty(M, N, device=device)
                lda = A.stride(0) if a_layout == "row" else A.stride(1)
                ldb = B.stride(0) if b_layout == "row" else B.stride(1)
                kernel = kernels.setdefault(plan.spec.name, Kernel(plan))

                def run(kernel=kernel, A=A, B=B, out=out, lda=lda, ldb=ldb):
                    for _ in range(args.calls):
                        kernel.launch(M, N, K, 1.0, A.data_ptr(), lda, B.data_ptr(), ldb, 0.0, out.data_ptr(), N,
                                      stream=stream)
                runs[label] = (run, [], (f"A {a_layout}, B {b_layout}", plan.spec.name), out, A, B)
                torch_label = f"cuBLAS TF32 A {a_layout}, B {b_layout}"
                if torch_label not in runs:
                    torch_out = torch.empty(M, N, device=device)

                    def matmul(A=A, B=B, out=torch_out):
                        for _ in range(args.calls):
                            torch.matmul(A, B, out=out)
                    runs[torch_label] = (matmul, [], None, torch_out, A, B)
            saved = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                for run, *_ in runs.values():
                    run()
                torch.cuda.synchronize()
                for _ in range(args.rounds):
                    for run, times, *_ in runs.values():
                        times.append(elapsed_ms(run, device) / args.calls)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = saved
            for label, (_, times, info, out, A, B) in runs.items():
                ms = statistics.median(times)
                reference = A.double() @ B.double()
                layouts = info[0] if info else label.removeprefix("cuBLAS TF32 ")
                cublas = statistics.median(runs[f"cuBLAS TF32 {layouts}"][1])
                results.append({"shape": f"{M}x{N}x{K}", "pad": pad, "way": label, "kernel": info[1] if info else "-",
                                "ms": ms, "tflops": 2.0 * M * N * K / ms / 1e9, "x_cublas_tf32": cublas / ms,
                                "error": relative_error(out, reference)})
            print(f"{M}x{N}x{K} pad {pad}: {len(runs)} timed", flush=True)
    rows = [[r["shape"], str(r["pad"]), r["way"], f"{r['tflops']:.1f}", f"{r['x_cublas_tf32']:.3f}", f"{r['error']:.1e}"]
            for r in results]
    m = meta(args.commit, device)
    record = {"meta": m, "settings": {"shapes": ["x".join(map(str, s)) for s in args.shapes], "pads": args.pads,
                                      "rounds": args.rounds, "calls": args.calls},
              "results": results}
    record["markdown"] = (f"On {m['device']} (driver {m.get('driver')}), commit {m['commit']}, {m['date']}: the "
                          "cp.async-fed TF32 kernel in every layout beside the tf32 library's TMA-fed member and "
                          "cuBLAS TF32 (torch.matmul) in the same layout, leading dimensions + pad:\n\n"
                          + table(["M x N x K", "pad", "way", "TFLOP/s", "x cuBLAS TF32 (same layout)", "error"],
                                  rows))
    write_record(args.out, record)
    print(record["markdown"])
    return record


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
