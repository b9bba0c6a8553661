"""What rounding to TF32 costs (issue 28): hopper_tf32 (TMA rounds A and B to nearest TF32 as it
copies them, its default) against the same kernel with `round truncate` (wgmma truncates the floats
as they lie), `round nearest producer` (warps 1-3 of the producer round each landed A and B tile in
shared memory) and `round nearest consumer` (they round B; the consumers round A in registers),
beside cuBLAS TF32 (torch.matmul with allow_tf32), in turns.

    export PYTHONPATH=/tmp/site:$PWD GEMMGEN_CACHE=/tmp/gemmgen-cache
    python benchmarks/tf32_rounding.py --out tf32_rounding.json [--shapes 4096x4096x4096 ...] [--rounds 7] [--calls 10]

Every way multiplies the same uniform(-1, 1) inputs (A row-major, B column-major: B^T row-major),
rotated over enough copies that a call finds them outside L2 (about 256 MB in all, at least two
copies). Each way is timed by CUDA events over --calls launches, in turns, --rounds times; the
median is reported as TFLOP/s, x cuBLAS, and its relative error against float64 (Frobenius norm)
beside cuBLAS TF32's. The rounding kernels have hopper_tf32's tile and schedule (128 x 256 x 32,
4 TMA stages, data-parallel): specs/hopper_tf32_rounded.gemm.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

from torch_records import elapsed_ms, meta, relative_error, table, timed_run, write_record

from gemmgen.gpu.compile import compile_all
from gemmgen.gpu.runtime import Kernel
from gemmgen.language.load import load_one
from gemmgen.plan import make_plan

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (2048, 5632, 2048), (8192, 1024, 1024))
# (label, spec file, kernel, settings on it)
KERNELS = (("round tma", "hopper_tf32.gemm", "hopper_tf32", {}),
           ("truncate", "hopper_tf32.gemm", "hopper_tf32", {"round": "truncate"}),
           ("round producer", "hopper_tf32_rounded.gemm", "hopper_tf32_rounded", {}),
           ("round consumer", "hopper_tf32_rounded.gemm", "hopper_tf32_rounded_a", {}))
ROTATED_BYTES = 256 << 20  # inputs per way rotated over at least this much (an H100's L2 is 50 MB)


def main(argv=None) -> dict:
    args, device = timed_run(__doc__.split("\n")[0], SHAPES, argv)
    index = torch.cuda.current_device()
    stream = torch.cuda.current_stream().cuda_stream
    plans = {label: make_plan(replace(load_one(ROOT / "specs" / path, name).with_values(**settings),
                                      name=name + ("_truncate" if settings else "")))
             for label, path, name, settings in KERNELS}
    compile_all(list(plans.values()))
    kernels = {label: Kernel(plan, device=index) for label, plan in plans.items()}
    generator = torch.Generator(device=device).manual_seed(args.seed)
    results = []
    try:
        for M, N, K in args.shapes:
            pair_bytes = 4 * (M + N) * K
            copies = max(2, min(16, -(-ROTATED_BYTES // pair_bytes)))
            inputs = [(torch.rand(M, K, device=device, generator=generator) * 2 - 1,
                       torch.rand(N, K, device=device, generator=generator) * 2 - 1) for _ in range(copies)]
            out = torch.empty(M, N, device=device)
            reference = inputs[0][0].double() @ inputs[0][1].double().T

            def gemmgen_way(kernel):
                def run(calls):
                    for call in range(calls):
                        a, bt = inputs[call % copies]
                        kernel.launch(M, N, K, 1.0, a.data_ptr(), K, bt.data_ptr(), K, 0.0, out.data_ptr(), N,
                                      stream=stream)
                return run

            def cublas(calls):
                for call in range(calls):
                    a, bt = inputs[call % copies]
                    torch.matmul(a, bt.T, out=out)

            ways = {label: gemmgen_way(kernel) for label, kernel in kernels.items()}
            ways["cuBLAS TF32"] = cublas
            saved = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                errors = {}
                for label, run in ways.items():  # one call on the first copy: its error
                    out.fill_(float("nan"))
                    run(1)
                    torch.cuda.synchronize(device)
                    errors[label] = relative_error(out, reference)
                for run in ways.values():
                    run(args.warmup)
                times = {label: [] for label in ways}
                for _ in range(args.rounds):
                    for label, run in ways.items():
                        times[label].append(elapsed_ms(lambda: run(args.calls), device) / args.calls)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = saved
            cublas_ms = statistics.median(times["cuBLAS TF32"])
            for label in ways:
                ms = statistics.median(times[label])
                results.append({"shape": f"{M}x{N}x{K}", "way": label, "ms": ms, "tflops": 2.0 * M * N * K / ms / 1e9,
                                "x_cublas": cublas_ms / ms, "relative_error": errors[label],
                                "error_x_cublas": errors[label] / errors["cuBLAS TF32"]})
            print(f"{M}x{N}x{K}: " + ", ".join(f"{r['way']} {r['tflops']:.1f} TFLOP/s ({r['x_cublas']:.3f}x, "
                                               f"error {r['relative_error']:.2e})"
                                               for r in results[-len(ways):]), flush=True)
    finally:
        for kernel in kernels.values():
            kernel.close()
    rows = [[r["shape"], r["way"], f"{r['tflops']:.1f}", f"{r['x_cublas']:.3f}", f"{r['relative_error']:.2e}",
             f"{r['error_x_cublas']:.2f}"] for r in results]
    m = meta(args.commit, device)
    record = {"meta": m, "settings": {"shapes": ["x".join(map(str, s)) for s in args.shapes], "rounds": args.rounds,
                                      "calls": args.calls, "warmup": args.warmup, "seed": args.seed,
                                      "kernels": {label: plan.name for label, plan in plans.items()}},
              "results": results}
    record["markdown"] = (f"On {m['device']} (driver {m.get('driver')}), commit {m['commit']}, {m['date']}: "
                          "hopper_tf32 rounding to nearest TF32 by TMA, truncating, rounding in the producer or "
                          "(A) in the consumers, and cuBLAS TF32, in turns; relative error against float64:\n\n"
                          + table(["M x N x K", "way", "TFLOP/s", "x cuBLAS", "rel. error", "error x cuBLAS"], rows))
    write_record(args.out, record)
    print(record["markdown"])
    return record


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
