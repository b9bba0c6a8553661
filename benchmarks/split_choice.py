"""At split calls (A's and B's rows 4 mod 8 floats apart): each library's choice against every member it
has for the call, beside cuBLAS in its precision, in turns.

    python benchmarks/split_choice.py OUT.json

Recorded: benchmarks/libraries/2026-11-26-h100-bbe6a59-split-choice.json (an H100, 2026-11-26)."""

from __future__ import annotations

import json
import sys

import torch

from member_turns import each_library, medians_in_turns

SHAPES = ((512, 512, 508), (768, 768, 764), (1024, 1024, 1020), (2048, 2048, 2044), (3012, 3012, 3012),
          (1500, 2500, 900), (8192, 1024, 1020), (4096, 4096, 1020), (64, 4096, 4092), (16, 4096, 4092),
          (4096, 64, 4092), (256, 4096, 2044))
ROUNDS, CALLS = 5, 10


def main() -> None:
    device = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    for precision, runtime, names in each_library():
        for M, N, K in SHAPES:
            chosen = runtime.choose(M, N, K, K, K, N)
            a, b = torch.rand(M, K, device=device), torch.rand(N, K, device=device)
            c = torch.empty(M, N, device=device)
            runs = {}
            for index, name in enumerate(names):
                if runtime.candidates[index].shape.decode and min(M, N) > 16:
                    continue  # the decode member serves 16 rows at most
                kernel = runtime.kernel(index)

                def run(kernel=kernel):
                    for _ in range(CALLS):
                        kernel.launch(M, N, K, 1.0, a.data_ptr(), K, b.data_ptr(), K, 0.0, c.data_ptr(), N, stream=stream)
                runs[name] = run

            def cublas():
                for _ in range(CALLS):
                    torch.matmul(a, b.t(), out=c)
            runs["cublas"] = cublas
            ms = medians_in_turns(runs, ROUNDS, CALLS)
            best_ms, best = min((v, k) for k, v in ms.items() if k != "cublas")
            mine = ms[names[chosen]]
            rows.append(dict(precision=precision, shape=f"{M}x{N}x{K}", chosen=names[chosen], ms=ms))
            print(f"{precision} {M}x{N}x{K}: chosen {names[chosen]} {mine * 1e3:.1f} us, best {best} {best_ms * 1e3:.1f} "
                  f"(chosen / best {mine / best_ms:.3f}), cublas {ms['cublas'] * 1e3:.1f} (x cublas "
                  f"{ms['cublas'] / mine:.2f}, best x cublas {ms['cublas'] / best_ms:.2f})", flush=True)
    json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
