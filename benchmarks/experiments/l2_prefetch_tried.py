"""Tried and not kept: the one-tile TMA producer asking TMA to prefetch into L2 (cp.async.bulk.prefetch.tensor)
the boxes STAGES K tiles ahead of each load, against the same kernel without: each eligible member of both
libraries (data-parallel or split K, no clusters) and cuBLAS, one call after an L2 flush, in turns.

Runs at efa6b0b, which added WgmmaTma.prefetch_tiles (reverted by the next commit):

    python benchmarks/experiments/l2_prefetch_tried.py OUT.json

Recorded: benchmarks/libraries/2026-11-26-h100-l2-prefetch-tried.json."""
import json, sys
from dataclasses import replace
import torch
import gemmgen.library.dispatch as dispatch
from gemmgen.gpu import bench as gpu_bench
from gemmgen.gpu.baseline import cublas_gemm
from gemmgen.gpu.compile import compile_all
from gemmgen.gpu.runtime import Kernel, device_info

SHAPES = ((16, 4096, 4096), (128, 4096, 4096), (4096, 128, 4096), (64, 4096, 8192), (12, 5120, 5120),
          (5, 7000, 3000), (1024, 1024, 65536), (4096, 4096, 4096), (2048, 5632, 2048), (8192, 8192, 256))
if __name__ == "__main__":
    x = torch.rand(64, 64, device="cuda"); y = torch.empty(64, 64, device="cuda")
    cublas_gemm(64, 64, 64, 1.0, x.data_ptr(), 64, x.data_ptr(), 64, 0.0, y.data_ptr(), 64, {"A": "row", "B": "col", "C": "row"})
    torch.cuda.synchronize()
    flusher = gpu_bench.L2Flusher(device_info(0))
    stream = torch.cuda.current_stream().cuda_stream
    out = []
    for lib in ("tf32", "fp32"):
        rt = dispatch.library(lib, 0)
        names = [m.name for m in rt.manifest.members]
        pairs = []
        for i, name in enumerate(names):
            p = rt.kernel_plan(i)
            if p.tma and p.scheduler.walk_template == "wgmma_tiles.cuh.j2" and p.cluster_blocks == 1:
                pf = replace(p, name=p.name + '_pf', mainloop=replace(p.mainloop, prefetch_tiles=p.stages))
                pairs.append((name, p, pf))
        compile_all([x for _, a, b in pairs for x in (a, b)])
        kernels = [(n, Kernel(a), Kernel(b)) for n, a, b in pairs]
        print(lib, "members", [n for n, _, _ in pairs], flush=True)
        for M, N, K in SHAPES:
            a = torch.rand(M, K, device="cuda"); b = torch.rand(N, K, device="cuda"); c = torch.empty(M, N, device="cuda")
            abi = (a.data_ptr(), K, b.data_ptr(), K, 0.0, c.data_ptr(), N)
            ways = {}
            for n, k0, k1 in kernels:
                ways[n] = lambda k=k0: k.launch(M, N, K, 1.0, *abi, stream=stream)
                ways[n + " pf"] = lambda k=k1: k.launch(M, N, K, 1.0, *abi, stream=stream)
            ways["cuBLAS"] = lambda: cublas_gemm(M, N, K, 1.0, *abi, {"A": "row", "B": "col", "C": "row"}, tf32=lib == "tf32")
            t = gpu_bench.time_alternating(list(ways.values()), flush=flusher, budget_s=0.05, max_runs=60)
            ms = {k: v.median_ms for k, v in zip(ways, t)}
            out.append({"lib": lib, "shape": f"{M}x{N}x{K}", "ms": ms})
            r = sorted(ms[n + " pf"] / ms[n] for n, _, _ in kernels)
            b0 = min(ms[n] for n, _, _ in kernels); b1 = min(ms[n + " pf"] for n, _, _ in kernels)
            print(f"{lib} {M}x{N}x{K}: pf/plain per member {r[0]:.3f}..{r[-1]:.3f} median {r[len(r)//2]:.3f}; best plain x cuBLAS "
                  f"{ms['cuBLAS']/b0:.3f}, best pf x cuBLAS {ms['cuBLAS']/b1:.3f}", flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1)
