"""Where a strided-batched GEMM's time goes (issue 29's "batched, fp32 >= 2.0x torch.bmm"): the
library's chosen member at each batched shape, beside the same kernel on other schedules, stores
and C tiles, and torch.bmm, in turns.

    python benchmarks/batched_schedules.py --out schedules.json [--precisions fp32 tf32] [--rounds 7] [--calls 10]

At a short K (32 x 1024 x 1024 x 128: four K tiles a C tile) a data-parallel block stores its tile
with nothing to overlap; a persistent block's copies for its next tile run meanwhile, and a staged
store (TMA from shared memory) leaves the consumers free sooner. Each variant is the chosen
member's spec with `schedule`, the store (`epilogue alpha beta staged` or direct) and the block's
M x N changed; one the planner refuses is listed with its reason. B is k-major (what the libraries
read without a copy). Every kernel is timed by CUDA events over --calls launches, in turns with
torch.bmm in the same precision, --rounds times; medians.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace

import torch

from torch_batched import SHAPES, operands, parse_batched_shapes
from torch_records import elapsed_ms, meta, table, timed_run, write_record

import gemmgen.library.dispatch as dispatch
from gemmgen.gpu.compile import compile_all
from gemmgen.gpu.runtime import Kernel
from gemmgen.language.errors import SpecError
from gemmgen.plan import make_plan

SCHEDULES = ("data-parallel", "persistent", "stream-k", "pingpong")
TILES = ((128, 128), (128, 64), (64, 128), (128, 256))


def variants(plan):
    """(label, plan or the planner's refusal) of the member on each schedule, store and C tile."""
    found = []
    for BM, BN in TILES:
        for schedule in SCHEDULES:
            for staged in (False, True):
                label = f"{BM}x{BN} {schedule}{' staged' if staged else ''}"
                try:
                    spec = plan.spec.with_values(block_m=BM, block_n=BN, schedule=schedule, epilogue_staged=staged,
                                                 split=1)
                    found.append((label, make_plan(replace(spec, name=f"{plan.spec.name}_b{len(found)}"))))
                except (SpecError, ValueError, KeyError) as exc:
                    found.append((label, str(exc).splitlines()[0][:120]))
    return found


def main(argv=None) -> dict:
    args, device = timed_run(__doc__.split("\n")[0], SHAPES, argv, metavar="BxMxNxK", shapes_of=parse_batched_shapes)
    index = torch.cuda.current_device()
    stream = torch.cuda.current_stream().cuda_stream
    work = []
    for precision in args.precisions:
        runtime = dispatch.library(precision, index)
        for batch, M, N, K in args.shapes:
            member = runtime.choose(M, N, K, K, K, N, batch=batch, strides=(M * K, K * N, M * N))
            plan = runtime.kernel_plan(member)
            work.append(((batch, M, N, K), precision, plan.spec.name, [("chosen", plan)] + variants(plan)))
    compile_all([p for *_, found in work for _, p in found if not isinstance(p, str)])
    results = []
    for (batch, M, N, K), precision, name, found in work:
        shape = f"{batch}x{M}x{N}x{K}"
        A, B, out = operands(batch, M, N, K, "k-major", device, args.seed)
        strides = (M * K, K * N, M * N)
        runs = {}
        for label, plan in found:
            if isinstance(plan, str):
                results.append({"shape": shape, "precision": precision, "member": name, "variant": label,
                                "refused": plan})
                continue
            try:
                kernel = Kernel(plan)
            except Exception as exc:  # noqa: BLE001 - a variant that does not build is recorded, not fatal
                results.append({"shape": shape, "precision": precision, "member": name, "variant": label,
                                "refused": f"{type(exc).__name__}: {str(exc)[:120]}"})
                continue

            def run(kernel=kernel):
                for _ in range(args.calls):
                    kernel.launch(M, N, K, 1.0, A.data_ptr(), K, B.data_ptr(), K, 0.0, out.data_ptr(), N,
                                  stream=stream, batch=batch, strides=strides)
            for _ in range(args.warmup):
                run()
            runs[label] = (run, [])

        def bmm():
            for _ in range(args.calls):
                torch.bmm(A, B, out=out)
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        try:
            bmm()
            runs["torch.bmm"] = (bmm, [])
            for _ in range(args.rounds):
                for label, (run, times) in runs.items():
                    times.append(elapsed_ms(run, device) / args.calls)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved
        torch_ms = statistics.median(runs["torch.bmm"][1])
        for label, (_, times) in runs.items():
            ms = statistics.median(times)
            results.append({"shape": shape, "precision": precision, "member": name, "variant": label, "ms": ms,
                            "x_torch": torch_ms / ms, "tflops": 2.0 * batch * M * N * K / ms / 1e9})
        print(f"{shape} {precision}: {len(runs)} kernels timed", flush=True)
    rows = [[r["shape"], r["precision"], r["member"], r["variant"],
             f"{r['ms'] * 1e3:.1f}" if "ms" in r else "-", f"{r['x_torch']:.2f}" if "ms" in r else r["refused"]]
            for r in results]
    m = meta(args.commit, device)
    record = {"meta": m, "settings": {"shapes": ["x".join(map(str, s)) for s in args.shapes],
                                      "precisions": args.precisions, "rounds": args.rounds, "calls": args.calls},
              "results": results}
    record["markdown"] = (f"On {m['device']} (driver {m.get('driver')}), commit {m['commit']}, {m['date']}: the "
                          "library's chosen member at each batched shape on other schedules, stores and tiles, "
                          "beside torch.bmm in the same precision:\n\n"
                          + table(["batch x M x N x K", "precision", "member", "variant", "us", "x torch.bmm"], rows))
    write_record(args.out, record)
    print(record["markdown"])
    return record


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
