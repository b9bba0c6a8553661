"""Skinny tf32 GEMMs (a few rows against a big weight, or a few columns against big activations): 64-row
tiles with deeper pipelines (4-8 stages) and split K, beside the library's choice and cuBLAS TF32, each
operand rotated over 256 MB, calls back to back (no L2 flush), in turns.

    python benchmarks/skinny_tiles.py OUT.json

Recorded: benchmarks/libraries/2026-11-26-h100-11df22c-skinny-probe.json (an H100, 2026-11-26)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import torch

import gemmgen.library.dispatch as dispatch
from gemmgen.gpu.compile import compile_all
from gemmgen.gpu.runtime import Kernel
from gemmgen.language.errors import SpecError
from gemmgen.plan import make_plan
from member_turns import medians_in_turns, member_index

SHAPES = ((64, 4096, 8192), (16, 4096, 4096), (12, 4096, 8192), (7, 8192, 8192), (5, 7000, 3000), (12, 5120, 5120),
          (4096, 128, 4096), (6144, 96, 6144), (96, 6144, 6144), (128, 8192, 8192))
ROUNDS, CALLS = 5, 12


def variants(runtime) -> list[tuple[str, object]]:
    """64 x {128, 256} tiles, every stage count that fits shared memory, split K 1 to 16: the library's
    first 64-row split-K member with those settings."""
    base = runtime.kernel_plan(member_index(runtime, lambda p: p.BM == 64 and p.split_k > 1 and p.tma,
                                            "64-row split-K TMA")).spec
    found = []
    for bn in (128, 256):
        for stages in (4, 5, 6, 8):
            for split in (1, 2, 4, 8, 16):
                try:
                    plan = make_plan(replace(base.with_values(block_n=bn, stages=stages, split=split),
                                             name=f"skinny_{bn}_{stages}_{split}"))
                except SpecError:  # more stages than shared memory holds
                    continue
                found.append((f"64x{bn} s{stages} k{split}", plan))
    return found


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    runtime = dispatch.library("tf32", 0)
    names = [m.name for m in runtime.manifest.members]
    tried = variants(runtime)
    print(len(tried), "variants", flush=True)
    compile_all([plan for _, plan in tried])
    runtime.compile_all()
    rows = []
    for M, N, K in SHAPES:
        copies = max(2, int(256e6 // (4 * (M * K + K * N))) + 1)
        As = [torch.rand(M, K, device=device) for _ in range(copies)]
        Bs = [torch.rand(N, K, device=device) for _ in range(copies)]
        c = torch.empty(M, N, device=device)
        chosen = runtime.choose(M, N, K, K, K, N)
        runs = {}
        for label, kernel in [(f"chosen {names[chosen]}", runtime.kernel(chosen))] + [(l, Kernel(p)) for l, p in tried]:
            def run(kernel=kernel):
                for i in range(CALLS):
                    kernel.launch(M, N, K, 1.0, As[i % copies].data_ptr(), K, Bs[i % copies].data_ptr(), K, 0.0,
                                  c.data_ptr(), N, stream=stream)
            runs[label] = run

        def cublas():
            for i in range(CALLS):
                torch.matmul(As[i % copies], Bs[i % copies].t(), out=c)
        runs["cublas"] = cublas
        ms = medians_in_turns(runs, ROUNDS, CALLS)
        gb = 4 * (M * K + K * N + M * N) / 1e9
        top = sorted((v, k) for k, v in ms.items() if k != "cublas")[:4]
        mine = next(v for k, v in ms.items() if k.startswith("chosen"))
        print(f"{M}x{N}x{K}: cublas {ms['cublas'] * 1e3:.1f} us ({gb / ms['cublas']:.2f} TB/s), chosen {mine * 1e3:.1f} "
              f"(x cublas {ms['cublas'] / mine:.2f}); best "
              + ", ".join(f"{k} {v * 1e3:.1f} ({ms['cublas'] / v:.2f}, {gb / v:.2f} TB/s)" for v, k in top), flush=True)
        rows.append(dict(shape=f"{M}x{N}x{K}", ms=ms))
    json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
