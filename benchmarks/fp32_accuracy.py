"""The fp32 library's error beside cuBLAS FP32's, and its speed, per shape (issue 28: "error <= cuBLAS
FP32's"): each shape's member as `gemmgen.matmul` chooses it, in turns with cuBLAS FP32
(torch.matmul, allow_tf32 off), on the same uniform(-1, 1) inputs (A row-major, B column-major).

    export PYTHONPATH=/tmp/site:$PWD GEMMGEN_CACHE=/tmp/gemmgen-cache
    python benchmarks/fp32_accuracy.py --out fp32_accuracy.json [--shapes 256x256x256 ...] [--rounds 7]

The relative error is ||C - C64||_F / ||C64||_F against a float64 product of the same inputs, for one
call of each. Times are medians over --rounds batches of CUDA-event-timed calls, in turns (--calls is
a floor: a batch has enough calls to take about a millisecond). The inputs stay in L2 where they fit:
this is a benchmark of the error, with the speed beside it to show what the error cost.

To compare two trees (before and after a change of the kernels), run it once per tree, with that tree
first on PYTHONPATH and --commit naming it, alternating the runs.
"""

from __future__ import annotations

import statistics
import sys

import torch

from torch_records import elapsed_ms, meta, relative_error, table, timed_run, write_record

import gemmgen.library.dispatch as dispatch

# short K, where cuBLAS FP32's sums are short and its error small; the decode regime (5 to 16 rows);
# and the large calls, where the speed is.
SHAPES = ((256, 256, 256), (512, 512, 512), (768, 768, 768), (1531, 1531, 1531), (2048, 2048, 128),
          (16384, 4096, 64), (8192, 8192, 256), (12288, 12288, 256), (4096, 4096, 512), (1024, 1024, 1024),
          (4, 14336, 4096), (5, 7000, 3000), (6, 8192, 4096), (8, 4096, 4096), (16, 8192, 4096),
          (16, 11008, 4096), (2048, 2048, 2048), (2048, 5632, 2048), (4096, 4096, 4096), (8192, 8192, 8192))


def main(argv=None) -> dict:
    args, device = timed_run(__doc__.split("\n")[0], SHAPES, argv)
    stream = torch.cuda.current_stream().cuda_stream
    runtime = dispatch.library("fp32", torch.cuda.current_device())
    names = [member.name for member in runtime.manifest.members]
    generator = torch.Generator(device=device).manual_seed(args.seed)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    results = []
    try:
        for M, N, K in args.shapes:
            a = torch.rand(M, K, device=device, generator=generator) * 2 - 1
            bt = torch.rand(N, K, device=device, generator=generator) * 2 - 1
            ours, theirs = torch.empty(M, N, device=device), torch.empty(M, N, device=device)
            index = runtime.choose(M, N, K, K, K, N)
            launch = runtime.kernel(index).prepare(M, N, K, K, K, N, (0, 0, 0), False)
            calls = max(args.calls, min(1000, int(1e-3 * 50e12 / (2.0 * M * N * K))))

            def gemmgen_fp32(calls):
                for _ in range(calls):
                    launch(a.data_ptr(), bt.data_ptr(), ours.data_ptr(), 1.0, 0.0, stream)

            def cublas_fp32(calls):
                for _ in range(calls):
                    torch.matmul(a, bt.T, out=theirs)

            ways = {"gemmgen fp32": gemmgen_fp32, "cuBLAS FP32": cublas_fp32}
            for run in ways.values():
                run(1)
            reference = a.double() @ bt.double().T
            errors = {"gemmgen fp32": relative_error(ours, reference), "cuBLAS FP32": relative_error(theirs, reference)}
            del reference
            for run in ways.values():
                run(args.warmup)
            times = {label: [] for label in ways}
            for _ in range(args.rounds):
                for label, run in ways.items():
                    times[label].append(elapsed_ms(lambda: run(calls), device) / calls)
            ms = {label: statistics.median(t) for label, t in times.items()}
            row = {"shape": f"{M}x{N}x{K}", "member": names[index], "ms": ms["gemmgen fp32"],
                   "cublas_ms": ms["cuBLAS FP32"], "tflops": 2.0 * M * N * K / ms["gemmgen fp32"] / 1e9,
                   "x_cublas": ms["cuBLAS FP32"] / ms["gemmgen fp32"], "relative_error": errors["gemmgen fp32"],
                   "cublas_error": errors["cuBLAS FP32"],
                   "error_x_cublas": errors["gemmgen fp32"] / errors["cuBLAS FP32"]}
            results.append(row)
            print(f"{row['shape']}: {row['member']} {row['tflops']:.1f} TFLOP/s ({row['x_cublas']:.3f}x cuBLAS FP32), "
                  f"error {row['relative_error']:.3e} (cuBLAS FP32 {row['cublas_error']:.3e})", flush=True)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    rows = [[r["shape"], r["member"], f"{r['tflops']:.1f}", f"{r['x_cublas']:.3f}", f"{r['relative_error']:.2e}",
             f"{r['cublas_error']:.2e}", f"{r['error_x_cublas']:.2f}"] for r in results]
    m = meta(args.commit, device)
    record = {"meta": m, "settings": {"shapes": ["x".join(map(str, s)) for s in args.shapes], "rounds": args.rounds,
                                      "calls": args.calls, "warmup": args.warmup, "seed": args.seed},
              "results": results}
    record["markdown"] = (f"On {m['device']} (driver {m.get('driver')}), commit {m['commit']}, {m['date']}: the fp32 "
                          "library's member for each shape and cuBLAS FP32, in turns; relative error against "
                          "float64:\n\n"
                          + table(["M x N x K", "member", "TFLOP/s", "x cuBLAS FP32", "rel. error",
                                   "cuBLAS FP32's", "error x cuBLAS"], rows))
    write_record(args.out, record)
    print(record["markdown"])
    return record


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
