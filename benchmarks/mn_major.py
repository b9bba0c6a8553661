"""What reading MN-major operands in the kernel costs: a library's chosen member at each shape
(A row, B col) beside the same member built for the other three layouts of A and B (a column-major
A read into registers from its MN-major tile; a row-major B transposed K-major by the producer's
warps, with as many stages as then fit; the tf32 kernels take only the first), and beside
torch.matmul in the library's precision in each layout, in turns. For A col, B col the member is the
one the library's relaid class (layouts.RELAID) chooses, which leaves out members that cannot read
that layout at speed.

    python benchmarks/mn_major.py --out mn_major.json [--library fp32|tf32] [--shapes 4096x4096x4096 ...]
                                  [--rounds 7] [--calls 10]

Each kernel is timed by CUDA events over --calls launches, --rounds times in turns; medians. Issue 26
asks each layout >= 0.9x the library's best layout at 4096^3 and 2048x8192x2048.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace

import torch

from torch_records import elapsed_ms, meta, relative_error, table, timed_run, write_record

import gemmgen.library.dispatch as dispatch
from gemmgen.library.layouts import RELAID
from gemmgen.gpu.compile import compile_all
from gemmgen.gpu.runtime import Kernel
from gemmgen.language.errors import SpecError
from gemmgen.plan import make_plan

SHAPES = ((4096, 4096, 4096), (2048, 8192, 2048), (2048, 5632, 2048), (8192, 2048, 5632), (2048, 2048, 8192))
LAYOUTS = (("row", "col"), ("col", "col"), ("row", "row"), ("col", "row"))


def layout_variant(plan, a: str, b: str):
    """The member's spec in layouts (a, b), with the most stages up to its own that fit; or the
    planner's refusal."""
    if (a, b) == ("row", "col"):
        return plan
    error = None
    for stages in range(plan.spec["stages"], 1, -1):
        try:
            spec = plan.spec.with_values(layout_A=a, layout_B=b, stages=stages)
            return make_plan(replace(spec, name=f"{plan.spec.name}_{a[0]}{b[0]}"))
        except SpecError as exc:
            error = error or str(exc).splitlines()[0][:160]
    return error


def operand(rows: int, cols: int, layout: str, device, generator) -> torch.Tensor:
    x = torch.rand(rows, cols, device=device, generator=generator) * 2 - 1
    return x if layout == "row" else x.t().contiguous().t()


def main(argv=None) -> dict:
    def options(parser):
        parser.add_argument("--library", choices=("fp32", "tf32"), default="fp32",
                            help="the library whose members are timed, beside torch.matmul in its precision "
                                 "(default fp32)")

    args, device = timed_run(__doc__.split("\n")[0], SHAPES, argv, options)
    stream = torch.cuda.current_stream().cuda_stream
    runtime = dispatch.library(args.library, torch.cuda.current_device())
    relaid = (dispatch.library(args.library, torch.cuda.current_device(), ("col", "col"))
              if ("col", "col") in RELAID.get(args.library, ()) else None)
    work = []
    for M, N, K in args.shapes:
        plan = runtime.kernel_plan(runtime.choose(M, N, K, K, K, N))
        found = {layouts: layout_variant(plan, *layouts) for layouts in LAYOUTS}
        if relaid is not None:  # the member the relaid class runs there
            found[("col", "col")] = relaid.kernel_plan(relaid.choose(M, N, K, M, K, N))
        work.append(((M, N, K), plan, found))
    compile_all([p for *_, found in work for p in found.values() if not isinstance(p, str)])
    generator = torch.Generator(device=device).manual_seed(args.seed)
    results = []
    for (M, N, K), plan, found in work:
        runs = {}
        for (a_layout, b_layout), variant in found.items():
            label = f"A {a_layout}, B {b_layout}"
            A = operand(M, K, a_layout, device, generator)
            B = operand(K, N, b_layout, device, generator)
            out = torch.empty(M, N, device=device)
            reference = (A.double() @ B.double())

            def matmul(A=A, B=B, out=out):
                for _ in range(args.calls):
                    torch.matmul(A, B, out=out)
            runs[f"torch {label}"] = (matmul, [], None)
            if isinstance(variant, str):
                results.append({"shape": f"{M}x{N}x{K}", "layouts": label, "kernel": "-", "refused": variant})
                continue
            kernel = Kernel(variant)
            lda = A.stride(0) if a_layout == "row" else A.stride(1)
            ldb = B.stride(0) if b_layout == "row" else B.stride(1)

            def run(kernel=kernel, A=A, B=B, out=out, lda=lda, ldb=ldb):
                for _ in range(args.calls):
                    kernel.launch(M, N, K, 1.0, A.data_ptr(), lda, B.data_ptr(), ldb, 0.0, out.data_ptr(), N,
                                  stream=stream)
            run()
            torch.cuda.synchronize()
            error = relative_error(out, reference)
            runs[label] = (run, [], (variant, error))
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = args.library == "tf32"
        try:
            for run, _, _ in runs.values():
                run()
            for _ in range(args.rounds):
                for run, times, _ in runs.values():
                    times.append(elapsed_ms(run, device) / args.calls)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved
        best = min(statistics.median(t) for label, (_, t, info) in runs.items() if info)
        for label, (_, times, info) in runs.items():
            ms = statistics.median(times)
            torch_ms = statistics.median(runs[label if label.startswith("torch") else f"torch {label}"][1])
            row = {"shape": f"{M}x{N}x{K}", "layouts": label.removeprefix("torch "), "ms": ms,
                   "tflops": 2.0 * M * N * K / ms / 1e9}
            if info:
                variant, error = info
                row.update(kernel=variant.spec.name, stages=variant.stages, x_best_layout=best / ms,
                           x_torch=torch_ms / ms, error=error)
            else:
                row.update(kernel=f"torch.matmul {args.library.upper()}")
            results.append(row)
        print(f"{M}x{N}x{K}: {len(runs)} timed", flush=True)
    rows = [[r["shape"], r["layouts"], r["kernel"], str(r.get("stages", "")),
             f"{r['tflops']:.1f}" if "ms" in r else "-", f"{r['x_best_layout']:.3f}" if "x_best_layout" in r else "",
             f"{r['x_torch']:.2f}" if "x_torch" in r else "", f"{r['error']:.1e}" if "error" in r else r.get("refused", "")]
            for r in results]
    m = meta(args.commit, device)
    record = {"meta": m, "settings": {"shapes": ["x".join(map(str, s)) for s in args.shapes],
                                      "rounds": args.rounds, "calls": args.calls},
              "results": results}
    record["settings"]["library"] = args.library
    record["markdown"] = (f"On {m['device']} (driver {m.get('driver')}), commit {m['commit']}, {m['date']}: the "
                          f"{args.library} library's member chosen for each shape, built for each layout of A and "
                          f"B, beside torch.matmul {args.library.upper()} in the same layout:\n\n"
                          + table(["M x N x K", "layouts", "kernel", "stages", "TFLOP/s", "x best layout",
                                   "x torch", "error"], rows))
    write_record(args.out, record)
    print(record["markdown"])
    return record


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
