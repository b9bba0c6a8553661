"""Leading dimensions of 4 mod 8 floats (rows 16- but not 32-byte aligned) against 8 and 32 mod 32: each
library's chosen member, its first tile member without split K and (tf32) its 2 x 1 cluster member, and
cuBLAS, in turns, at ld = K, K rounded up to 8 and to 32, and C's ld N or N rounded up to 32.

    python benchmarks/split_rows.py OUT.json

Recorded: benchmarks/libraries/2026-11-26-h100-58779cb-split-rows.json (an H100, 2026-11-26)."""

from __future__ import annotations

import json
import sys

import torch

from member_turns import each_library, medians_in_turns, member_index

SHAPES = ((2560, 2560, 2500), (2500, 2500, 2500), (2000, 3000, 700), (4092, 4092, 4092), (4100, 4100, 4100),
          (5004, 5004, 5004), (1532, 1532, 1532), (4096, 4096, 4092))
ROUNDS, CALLS = 7, 10


def up(x: int, m: int) -> int:
    return -(-x // m) * m


def main() -> None:
    device = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    for precision, runtime, names in each_library():
        others = {member_index(runtime, lambda p: p.cluster_m * p.cluster_n > 1, "cluster")} if precision == "tf32" else set()
        others.add(member_index(runtime, lambda p: p.path != "decode" and p.split_k == 1, "tile"))
        for M, N, K in SHAPES:
            chosen = runtime.choose(M, N, K, K, K, N)
            big_a = torch.rand(M, up(K, 32) + 32, device=device)
            big_b = torch.rand(N, up(K, 32) + 32, device=device)
            out = torch.empty(M, up(N, 32), device=device)
            runs = {}
            for ld in sorted({K, up(K, 8), up(K, 32)}):
                a = big_a.view(-1)[: M * ld].view(M, ld)[:, :K]
                b = big_b.view(-1)[: N * ld].view(N, ld)[:, :K]
                for ldc in sorted({N, up(N, 32)}):
                    c = out.view(-1)[: M * ldc].view(M, ldc)[:, :N]
                    for index in sorted({chosen} | others):
                        kernel = runtime.kernel(index)

                        def run(kernel=kernel, a=a, b=b, c=c, ld=ld, ldc=ldc):
                            for _ in range(CALLS):
                                kernel.launch(M, N, K, 1.0, a.data_ptr(), ld, b.data_ptr(), ld, 0.0, c.data_ptr(), ldc,
                                              stream=stream)
                        runs[f"{names[index]}{'*' if index == chosen else ''}|{ld}|{ldc}"] = run

                    def cublas(a=a, b=b, c=c):
                        for _ in range(CALLS):
                            torch.matmul(a, b.t(), out=c)
                    runs[f"cublas|{ld}|{ldc}"] = cublas
            for label, ms in medians_in_turns(runs, ROUNDS, CALLS).items():
                member, ld, ldc = label.split("|")
                rows.append(dict(precision=precision, shape=f"{M}x{N}x{K}", member=member, ld=int(ld), ldc=int(ldc),
                                 ms=ms))
                print(f"{precision} {M}x{N}x{K} {member:10s} ld {ld:>5} ldc {ldc:>5} {ms * 1e3:8.1f} us "
                      f"{2 * M * N * K / ms / 1e9:6.1f} TFLOP/s", flush=True)
    json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
