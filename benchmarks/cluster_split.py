"""Split K with atomics (`split N`: a pass C = beta * C, then every slice's atomicAdd) against its twin of
another kind: `--by cluster` (`split N cluster`: block 0 stores C, the cluster's other blocks add into it)
or `--by workspace` (`split N workspace`: every slice writes a workspace, the last sums them and stores
C). Each library's split-K TMA members and their twins (the same spec with `split N <by>`), beside the
library's choice and cuBLAS in its precision, at skinny and long-K calls. Each call is timed alone
after an L2 flush (as the libraries' bench times them), in turns.

    python benchmarks/cluster_split.py OUT.json [--by cluster | workspace] [--precisions tf32 fp32] [--budget 0.15]

Recorded: benchmarks/libraries/ (see BENCHMARKS.md's run log)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import torch

from torch_records import meta, refuse_to_overwrite, table, write_record

import gemmgen.library.dispatch as dispatch
from gemmgen.gpu import bench as gpu_bench
from gemmgen.gpu.baseline import cublas_gemm
from gemmgen.gpu.compile import compile_all
from gemmgen.gpu.runtime import Kernel, device_info
from gemmgen.language.errors import SpecError
from gemmgen.plan import make_plan

SHAPES = ((64, 4096, 8192), (16, 4096, 4096), (12, 4096, 8192), (5, 7000, 3000), (12, 5120, 5120),
          (128, 4096, 4096), (4096, 32, 4096), (4096, 128, 4096), (6144, 96, 6144), (300, 300, 40000),
          (1024, 1024, 65536), (128, 1024, 65536), (2048, 2048, 16384))
ROW_COL = {"A": "row", "B": "col", "C": "row"}


def twins(runtime, by: str) -> list[tuple[str, object, object]]:
    """(label, atomic plan, twin plan) of each split-K TMA member of the library whose `split N <by>` twin
    plans (a cluster: at most 8 slices)."""
    found = []
    for index, member in enumerate(runtime.manifest.members):
        plan = runtime.kernel_plan(index)
        if plan.split_k < 2 or not plan.tma:
            continue
        try:
            twin = make_plan(replace(plan.spec.with_values(split_by=by), name=f"{plan.spec.name}_{by}"))
        except SpecError:
            continue
        found.append((f"{member.name} {plan.BM}x{plan.BN} k{plan.split_k}", plan, twin))
    return found


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the JSON record to write (refused if it exists and is not gemmgen's)")
    parser.add_argument("--by", default="cluster", choices=["cluster", "workspace"], help="the twins' kind of split K")
    parser.add_argument("--precisions", nargs="+", default=["tf32", "fp32"], choices=["tf32", "fp32"])
    parser.add_argument("--budget", type=float, default=0.15, help="seconds of timing per call and way")
    parser.add_argument("--force", action="store_true", help="replace OUT even if gemmgen did not write it")
    parser.add_argument("--commit", default=None, help="the commit measured (default: $GEMMGEN_COMMIT or HEAD)")
    args = parser.parse_args(argv)
    refuse_to_overwrite(args.out, args.force)
    device = torch.device("cuda")
    info = device_info(torch.cuda.current_device())
    flusher = gpu_bench.L2Flusher(info)
    stream = torch.cuda.current_stream().cuda_stream
    results = []
    for precision in args.precisions:
        runtime = dispatch.library(precision, torch.cuda.current_device())
        runtime.compile_all()
        pairs = twins(runtime, args.by)
        compile_all([twin for _, _, twin in pairs])
        kernels = [(label, Kernel(plan), Kernel(twin)) for label, plan, twin in pairs]
        for M, N, K in SHAPES:
            a, b = torch.rand(M, K, device=device), torch.rand(N, K, device=device)
            c = torch.empty(M, N, device=device)
            args_abi = (a.data_ptr(), K, b.data_ptr(), K, 0.0, c.data_ptr(), N)
            chosen = runtime.choose(M, N, K, K, K, N)
            ways = {f"chosen {runtime.manifest.members[chosen].name}":
                    lambda: runtime.launch(M, N, K, 1.0, *args_abi, stream=stream),
                    "cuBLAS": lambda: cublas_gemm(M, N, K, 1.0, *args_abi, ROW_COL, tf32=precision == "tf32")}
            for label, atomic, cluster in kernels:
                ways[f"{label} atomic"] = lambda k=atomic: k.launch(M, N, K, 1.0, *args_abi, stream=stream)
                ways[f"{label} {args.by}"] = lambda k=cluster: k.launch(M, N, K, 1.0, *args_abi, stream=stream)
            timings = gpu_bench.time_alternating(list(ways.values()), flush=flusher, budget_s=args.budget)
            ms = {way: t.median_ms for way, t in zip(ways, timings)}
            gains = {label: ms[f"{label} atomic"] / ms[f"{label} {args.by}"] for label, _, _ in kernels}
            best = min((v, k) for k, v in ms.items() if k != "cuBLAS")
            results.append({"precision": precision, "shape": f"{M}x{N}x{K}", "ms": ms, "twin": args.by, "twin_gain": gains,
                            "best": best[1], "best_x_cublas": ms["cuBLAS"] / best[0],
                            "chosen_x_cublas": ms["cuBLAS"] / next(v for k, v in ms.items() if k.startswith("chosen"))})
            r = results[-1]
            print(f"{precision} {M}x{N}x{K}: cuBLAS {ms['cuBLAS'] * 1e3:.1f} us, chosen x {r['chosen_x_cublas']:.2f}, "
                  f"best {best[1]} x {r['best_x_cublas']:.2f}; atomic / {args.by}: "
                  + ", ".join(f"{k.split()[0]} {v:.2f}" for k, v in gains.items()), flush=True)
    rows = []
    for r in results:
        top = sorted(((v, k) for k, v in r["ms"].items() if k != "cuBLAS"))[:1]
        rows.append([r["precision"], r["shape"], f"{r['ms']['cuBLAS'] * 1e3:.1f}", f"{r['chosen_x_cublas']:.2f}",
                     f"{top[0][1]}", f"{r['best_x_cublas']:.2f}",
                     " ".join(f"{v:.2f}" for v in r["twin_gain"].values())])
    m = meta(args.commit, device)
    record = {"meta": m, "shapes": ["x".join(map(str, s)) for s in SHAPES], "results": results}
    record["markdown"] = (
        f"On {m['device']} (driver {m.get('driver')}), commit {m['commit']}, {m['date']}: one call after an L2 "
        f"flush, in turns; `atomic / {args.by}` is each split member's time over its `split N {args.by}` twin's "
        f"(above 1: the {args.by} twin is faster).\n\n"
        + table(["precision", "M x N x K", "cuBLAS us", "chosen x cuBLAS", "fastest way", "fastest x cuBLAS",
                 f"atomic / {args.by} per split member"], rows))
    write_record(args.out, record)
    print(record["markdown"])
    return record


if __name__ == "__main__":
    main()
    sys.exit(0)
