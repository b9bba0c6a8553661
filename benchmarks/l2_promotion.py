"""The TMA maps' L2 promotion, 128 against 256 bytes: every TMA member of each library and cuBLAS in its
precision at skinny and large calls (K-major operands, rows 128-byte aligned), one call after an L2 flush,
in turns, with every A and B map encoded at the promotion PROMO says. Run it once per promotion, in
separate processes (the prepared launches keep their maps), and compare the records.

    PROMO=128 python benchmarks/l2_promotion.py p128.json tf32 fp32
    PROMO=256 python benchmarks/l2_promotion.py p256.json tf32 fp32

Recorded (two rounds of each, at 5c5c393, where a module constant played PROMO's part):
benchmarks/libraries/2026-11-26-h100-5c5c393-l2-promotion-{128,256}-round{1,2}.json."""

from __future__ import annotations

import json
import os
import sys

import torch

import gemmgen.library.dispatch as dispatch
from gemmgen.gpu import bench as gpu_bench
from gemmgen.gpu.baseline import cublas_gemm
from gemmgen.gpu.runtime import device_info
from gemmgen.plan.parts.launch import TensorMapSpec

SHAPES = ((16, 4096, 4096), (128, 4096, 4096), (4096, 128, 4096), (64, 4096, 8192), (5, 7000, 3000),
          (12, 5120, 5120), (4096, 4096, 4096), (2048, 5632, 2048), (1024, 1024, 65536), (8192, 8192, 256))
ROW_COL = {"A": "row", "B": "col", "C": "row"}


def main() -> None:
    if len(sys.argv) < 3 or os.environ.get("PROMO") not in ("128", "256"):
        sys.exit(__doc__)
    promo = int(os.environ["PROMO"])
    TensorMapSpec.promotion = lambda self, address: promo if self.promote else 0  # A's and B's maps, not C's
    flusher = gpu_bench.L2Flusher(device_info(0))
    stream = torch.cuda.current_stream().cuda_stream
    out = []
    for library in sys.argv[2:]:
        runtime = dispatch.library(library, 0)
        runtime.compile_all()
        names = [m.name for m in runtime.manifest.members]
        tma = [i for i in range(len(names)) if runtime.kernel_plan(i).tma]
        for M, N, K in SHAPES:
            a, b = torch.rand(M, K, device="cuda"), torch.rand(N, K, device="cuda")
            c = torch.empty(M, N, device="cuda")
            abi = (a.data_ptr(), K, b.data_ptr(), K, 0.0, c.data_ptr(), N)
            ways = {names[i]: (lambda k=runtime.kernel(i): k.launch(M, N, K, 1.0, *abi, stream=stream)) for i in tma}
            ways["cuBLAS"] = lambda: cublas_gemm(M, N, K, 1.0, *abi, ROW_COL, tf32=library == "tf32")
            timings = gpu_bench.time_alternating(list(ways.values()), flush=flusher, budget_s=0.05, max_runs=60)
            ms = {way: t.median_ms for way, t in zip(ways, timings)}
            out.append({"lib": library, "shape": f"{M}x{N}x{K}", "promotion": promo, "ms": ms})
            best = min((v, k) for k, v in ms.items() if k != "cuBLAS")
            print(f"{library} {M}x{N}x{K}: fastest {best[1]} {best[0] * 1e3:.1f} us, x cuBLAS {ms['cuBLAS'] / best[0]:.3f}",
                  flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
