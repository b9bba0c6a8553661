"""What the copy of a call in layout A col, B row costs: gemmgen's transposing copy alone (beside PyTorch's
transposing copy and a plain copy of the same bytes), then gemmgen.matmul in that layout (one operand copied
K-major first) beside the three layouts it reads without a copy, and the kernels one copied call runs.

    export PYTHONPATH=/tmp/site:$PWD
    python benchmarks/layout_copy.py --out layout-copy.json [--rounds 7] [--calls 20]

Issue 26 asks every A/B layout to run at >= 0.9x the library's best at 4096^3 and 2048 x 8192 x 2048.
wgmma reads TF32 operands K-major only, so A col, B row copies one operand (the smaller); this says
whether the copy runs at memory speed and how much of the call it is. Each way is timed as batches
of --calls calls by CUDA events, the ways of a group in turns, --rounds times; a way's figure is its
median batch, in microseconds per call. The copied call's kernels are listed from torch.profiler
(device time per call over 3 calls). Needs a CUDA GPU with torch and the shipped libraries.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings

import torch

from torch_records import elapsed_ms, meta, refuse_to_overwrite, write_record

import gemmgen
from gemmgen.gpu.transpose import transpose

MATRICES = ((2048, 2048), (4096, 4096), (2048, 8192))
SHAPES = ((4096, 4096, 4096), (2048, 8192, 2048))


def in_turns(ways: dict, rounds: int, calls: int) -> dict:
    """Each way's median batch (us per call), the ways taking turns; two untimed calls of each first."""
    for work in ways.values():
        work(), work()
    device = torch.device("cuda", torch.cuda.current_device())
    times = {name: [] for name in ways}
    for _ in range(rounds):
        for name, work in ways.items():
            times[name].append(elapsed_ms(lambda: [work() for _ in range(calls)], device) / calls * 1000)
    return {name: round(statistics.median(t), 1) for name, t in times.items()}


def copies(rounds: int, calls: int) -> list[dict]:
    stream = torch.cuda.current_stream().cuda_stream
    device = torch.cuda.current_device()
    rows_out = []
    for rows, cols in MATRICES:
        x = torch.randn(rows, cols, device="cuda")
        y = torch.empty(cols, rows, device="cuda")
        ways = {"gemmgen transpose": lambda: transpose(x.data_ptr(), rows, cols, cols, y.data_ptr(), rows, device,
                                                         stream),
                "torch x.t().contiguous()": lambda: x.t().contiguous(),
                "torch copy_ (no transpose)": lambda: y.view(rows, cols).copy_(x)}
        moved = 2 * 4 * rows * cols  # bytes read and written
        for way, us in in_turns(ways, rounds, calls).items():
            rows_out.append({"matrix": f"{rows}x{cols}", "way": way, "us": us, "tb_per_s": round(moved / us / 1e6, 2)})
            print(f"{rows}x{cols} {way}: {us} us, {moved / us / 1e6:.2f} TB/s", flush=True)
    return rows_out


def calls_by_layout(precisions, rounds: int, calls: int) -> list[dict]:
    rows_out = []
    for precision in precisions:
        for M, N, K in SHAPES:
            a_row, b_row = torch.randn(M, K, device="cuda"), torch.randn(K, N, device="cuda")
            a_col, b_col = a_row.t().contiguous().t(), b_row.t().contiguous().t()
            out = torch.empty(M, N, device="cuda")
            ways = {f"A {la}, B {lb}": (lambda a=a, b=b: gemmgen.matmul(a, b, out, precision=precision))
                    for la, a in (("row", a_row), ("col", a_col)) for lb, b in (("row", b_row), ("col", b_col))}
            result = in_turns(ways, rounds, calls)
            best = min(result.values())
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    ways["A col, B row"]()
                torch.cuda.synchronize()
            kernels = [(event.key[:80], round(event.device_time_total / 3, 1)) for event in prof.key_averages()
                       if event.device_time_total > 0]
            for way, us in result.items():
                rows_out.append({"precision": precision, "shape": f"{M}x{N}x{K}", "way": way, "us": us,
                                 "x_best_layout": round(best / us, 3)})
            rows_out.append({"precision": precision, "shape": f"{M}x{N}x{K}", "way": "A col, B row: its kernels",
                             "kernels_us_per_call": kernels})
            print(precision, f"{M}x{N}x{K}", result, "kernels of A col, B row:", kernels, flush=True)
    return rows_out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write the record to")
    parser.add_argument("--force", action="store_true", help="replace --out even if gemmgen did not write it")
    parser.add_argument("--commit", help="the commit to record (default: $GEMMGEN_COMMIT, else git's HEAD)")
    parser.add_argument("--precisions", nargs="+", choices=("fp32", "tf32"), default=["tf32", "fp32"])
    parser.add_argument("--rounds", type=int, default=7, help="timed batches of each way, in turns (default 7)")
    parser.add_argument("--calls", type=int, default=20, help="calls in a timed batch (default 20)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")
    refuse_to_overwrite(args.out, args.force)
    if not torch.cuda.is_available():
        sys.exit("error: layout_copy.py needs a CUDA GPU")
    warnings.simplefilter("ignore", RuntimeWarning)  # the copy's once-per-call-shape warning
    record = {"benchmark": "layout_copy", "meta": meta(args.commit, torch.device("cuda")),
              "settings": {"rounds": args.rounds, "calls": args.calls, "precisions": args.precisions,
                           "timing": "CUDA events over a batch of calls, median batch over rounds in turns"},
              "copies": copies(args.rounds, args.calls),
              "calls": calls_by_layout(args.precisions, args.rounds, args.calls)}
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
