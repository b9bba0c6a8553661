"""Where a fused epilogue's cost goes (issue 29's "the epilogue is hidden"): the library's chosen
member with bias + GELU on other schedules and stores, beside the plain member, in turns.

    python benchmarks/epilogue_schedules.py --out schedules.json [--precisions fp32 tf32] [--rounds 7] [--calls 10]
    python benchmarks/epilogue_schedules.py --members --out members.json

With --members: every member of the library (the decode kernels aside), plain and with bias + GELU as
gemmgen.linear would build it were that member chosen (library/fused.py's plan), beside the member the
library chooses plain: which member's fused kernel comes closest to the library's plain GEMM.

For each shape (4096^3, 2048 x 5632 x 2048, 8192 x 1024 x 1024 by default) and precision, the member
the library chooses is timed plain (alpha beta, what gemmgen.matmul runs) and with `bias col` and
`activation gelu` (what gemmgen.linear runs), then the fused variant once more on each schedule
(data-parallel, persistent, pingpong, stream-k) and with its store staged or direct, where the
plan takes it (a variant the planner refuses is listed as such). A data-parallel block stores its
tile after its main loop with nothing to overlap; a ping-pong block's other consumer multiplies the
next tile meanwhile. Each kernel is timed by CUDA events over --calls launches, in turns, --rounds
times; medians. The record says which variant, if any, holds the fused GEMM within 3% of the plain one.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace

import torch

from torch_records import elapsed_ms, meta, table, timed_run, write_record

import gemmgen.library.dispatch as dispatch
from gemmgen.gpu.compile import compile_all
from gemmgen.gpu.runtime import Kernel
from gemmgen.language.errors import SpecError
from gemmgen.plan import make_plan

SHAPES = ((4096, 4096, 4096), (2048, 5632, 2048), (8192, 1024, 1024))
SCHEDULES = ("data-parallel", "persistent", "pingpong", "stream-k")


def variants(plan):
    """(label, plan or the planner's refusal) of the member's fused variants."""
    spec = plan.spec.with_values(bias="col", activation="gelu")
    found = []
    tiles = [{}] + ([{"block_m": 64}] if spec["block.m"] > 64 else [])  # a ping-pong consumer's registers
    for schedule, tile in [(s, {}) for s in SCHEDULES] + [("pingpong", t) for t in tiles[1:]]:
        for staged in (False, True):
            label = f"{schedule}{' staged' if staged else ''}" + ("".join(f" {k}={v}" for k, v in tile.items()))
            try:
                variant = spec.with_values(schedule=schedule, epilogue_staged=staged, **tile)
                found.append((label, make_plan(replace(variant, name=f"{plan.spec.name}_v{len(found)}"))))
            except (SpecError, ValueError) as exc:
                found.append((label, str(exc).splitlines()[0][:120]))
    return found


PARTS = (("bias", {"bias": "col"}), ("relu", {"activation": "relu"}), ("gelu", {"activation": "gelu"}),
         ("bias relu", {"bias": "col", "activation": "relu"}), ("bias gelu", {"bias": "col", "activation": "gelu"}))


def parts(plan):
    """(label, plan or the planner's refusal) of the member with each piece of the epilogue, on its
    own schedule and store."""
    found = []
    for label, values in PARTS:
        try:
            found.append((label, make_plan(replace(plan.spec.with_values(**values),
                                                   name=f"{plan.spec.name}_p{len(found)}"))))
        except (SpecError, ValueError) as exc:
            found.append((label, str(exc).splitlines()[0][:120]))
    return found


def every_member(runtime):
    """(label, plan) of each member but the decode kernels, plain ("fp32_3") and fused as
    gemmgen.linear builds it ("fp32_3 fused": library/fused.py), or the reason it cannot be fused."""
    from gemmgen.library.fused import fused_members
    fused = fused_members(runtime)
    found = []
    for index in range(len(runtime.candidates)):
        plan = runtime.kernel_plan(index)
        if plan.path == "decode":
            continue
        name = plan.spec.name
        found.append((name, plan))
        variant = fused.plan(index, True, "gelu")
        found.append((f"{name} fused", variant if variant is not None else "takes no fused epilogue"))
    return found


def main(argv=None) -> dict:
    def options(parser):
        parser.add_argument("--parts", action="store_true",
                            help="time the epilogue's pieces (bias, relu, gelu) on the member's own schedule instead")
        parser.add_argument("--members", action="store_true",
                            help="time every member plain and fused (as gemmgen.linear builds it) instead")

    args, device = timed_run(__doc__.split("\n")[0], SHAPES, argv, options)
    index = torch.cuda.current_device()
    stream = torch.cuda.current_stream().cuda_stream
    torch.manual_seed(args.seed)
    work = []  # (shape, precision, member name, [(label, plan or reason)])
    for precision in args.precisions:
        runtime = dispatch.library(precision, index)
        for M, N, K in args.shapes:
            member = runtime.choose(M, N, K, K, K, N)
            plan = runtime.kernel_plan(member)
            if args.members:
                found = [("plain", plan)] + every_member(runtime)
            else:
                found = [("plain", plan)] + (parts(plan) if args.parts else variants(plan))
            work.append(((M, N, K), precision, plan.spec.name, found))
    compile_all([p for *_, found in work for _, p in found if not isinstance(p, str)])
    results = []
    for (M, N, K), precision, name, found in work:
        x = torch.rand(M, K, device=device) * 2 - 1
        w = (torch.rand(N, K, device=device) * 2 - 1) / K ** 0.5
        bias = torch.rand(N, device=device) * 2 - 1
        out = torch.empty(M, N, device=device)
        runs = {}
        for label, plan in found:
            if isinstance(plan, str):
                results.append({"shape": f"{M}x{N}x{K}", "precision": precision, "member": name, "variant": label,
                                "refused": plan})
                continue
            try:
                kernel = Kernel(plan)
            except Exception as exc:  # noqa: BLE001 - a variant that does not build is recorded, not fatal
                results.append({"shape": f"{M}x{N}x{K}", "precision": precision, "member": name, "variant": label,
                                "refused": f"{type(exc).__name__}: {str(exc)[:120]}"})
                continue
            extra = {"bias": bias.data_ptr()} if plan.epilogue.bias != "none" else {}

            def run(kernel=kernel, extra=extra):
                for _ in range(args.calls):
                    kernel.launch(M, N, K, 1.0, x.data_ptr(), K, w.data_ptr(), K, 0.0, out.data_ptr(), N,
                                  stream=stream, **extra)
            for _ in range(args.warmup):
                run()
            runs[label] = (run, [])
        for _ in range(args.rounds):
            for label, (run, times) in runs.items():
                times.append(elapsed_ms(run, device) / args.calls)
        plain = statistics.median(runs["plain"][1])
        for label, (_, times) in runs.items():
            ms = statistics.median(times)
            results.append({"shape": f"{M}x{N}x{K}", "precision": precision, "member": name, "variant": label,
                            "ms": ms, "plain_over": plain / ms, "tflops": 2.0 * M * N * K / ms / 1e9})
        print(f"{M}x{N}x{K} {precision}: {len(runs)} kernels timed", flush=True)
    rows = [[r["shape"], r["precision"], r["member"], r["variant"],
             f"{r['ms']:.3f}" if "ms" in r else "-", f"{r['plain_over']:.3f}" if "ms" in r else r["refused"]]
            for r in results]
    m = meta(args.commit, device)
    record = {"meta": m, "settings": {"shapes": ["x".join(map(str, s)) for s in args.shapes],
                                      "precisions": args.precisions, "rounds": args.rounds, "calls": args.calls},
              "results": results}
    record["markdown"] = (f"On {m['device']} (driver {m.get('driver')}), commit {m['commit']}, {m['date']}: the "
                          "library's chosen member plain, and with bias + GELU on each schedule and store; plain / "
                          "variant >= 0.97 is issue 29's \"hidden\":\n\n"
                          + table(["M x N x K", "precision", "member", "variant", "ms", "plain / variant"], rows))
    write_record(args.out, record)
    print(record["markdown"])
    return record


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
