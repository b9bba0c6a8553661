"""Skinny tf32 GEMMs (few rows against a big weight): 64-row tiles with deeper pipelines and split K, beside the
library's choice and cuBLAS TF32, each operand rotated over 256 MB, calls back to back (no L2 flush; an H100 probe of
2026-11-26: benchmarks/libraries/2026-11-26-h100-11df22c-skinny-probe.json). Usage: skinny_tiles.py OUT.json"""
import json, statistics, sys
from dataclasses import replace
import torch
import gemmgen.library.dispatch as dispatch
from gemmgen.gpu.compile import compile_all
from gemmgen.gpu.runtime import Kernel
from gemmgen.plan import make_plan
SHAPES = ((64, 4096, 8192), (16, 4096, 4096), (12, 4096, 8192), (7, 8192, 8192), (5, 7000, 3000), (12, 5120, 5120),
          (4096, 128, 4096), (6144, 96, 6144), (96, 6144, 6144), (128, 8192, 8192))
ROUNDS, CALLS = 5, 12
def main():
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda"); stream = torch.cuda.current_stream().cuda_stream
    rt = dispatch.library("tf32", 0)
    names = [m.name for m in rt.manifest.members]
    base = rt.kernel_plan(names.index("tf32_16")).spec
    variants = []
    for bn in (128, 256):
        for stages in ((4, 6, 8) if bn == 128 else (4, 5)):
            for split in (1, 2, 4, 8, 16):
                try:
                    p = make_plan(replace(base.with_values(block_n=bn, stages=stages, split=split), name=f"v{bn}_{stages}_{split}"))
                except Exception:
                    continue
                variants.append((f"64x{bn} s{stages} k{split}", p))
    print(len(variants), "variants", flush=True)
    compile_all([p for _, p in variants]); rt.compile_all()
    rows = []
    for M, N, K in SHAPES:
        copies = max(2, int(256e6 // (4 * (M * K + K * N))) + 1)
        As = [torch.rand(M, K, device=dev) for _ in range(copies)]; Bs = [torch.rand(N, K, device=dev) for _ in range(copies)]
        c = torch.empty(M, N, device=dev)
        chosen = rt.choose(M, N, K, K, K, N)
        runs = {}
        for label, k in [(f"chosen {names[chosen]}", rt.kernel(chosen))] + [(l, Kernel(p)) for l, p in variants]:
            def run(k=k):
                for i in range(CALLS):
                    k.launch(M, N, K, 1.0, As[i % copies].data_ptr(), K, Bs[i % copies].data_ptr(), K, 0.0, c.data_ptr(), N, stream=stream)
            runs[label] = (run, [])
        def cub():
            for i in range(CALLS):
                torch.matmul(As[i % copies], Bs[i % copies].t(), out=c)
        runs["cublas"] = (cub, [])
        for run, _ in runs.values(): run()
        for _ in range(ROUNDS):
            for key, (run, t) in runs.items():
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record(); run(); e.record(); e.synchronize(); t.append(s.elapsed_time(e) / CALLS)
        ms = {k: statistics.median(t) for k, (_, t) in runs.items()}
        gb = 4 * (M * K + K * N + M * N) / 1e9
        top = sorted((v, k) for k, v in ms.items() if k != "cublas")[:4]
        ch = [v for k, v in ms.items() if k.startswith("chosen")][0]
        print(f"{M}x{N}x{K}: cublas {ms['cublas']*1e3:.1f} us ({gb/ms['cublas']:.2f} TB/s), chosen {ch*1e3:.1f} (x cublas {ms['cublas']/ch:.2f}); best "
              + ", ".join(f"{k} {v*1e3:.1f} ({ms['cublas']/v:.2f}, {gb/v:.2f} TB/s)" for v, k in top), flush=True)
        rows.append(dict(shape=f"{M}x{N}x{K}", ms=ms))
    json.dump(rows, open(sys.argv[1], "w"), indent=1)
if __name__ == "__main__":
    main()
