"""Leading dimensions of 4 mod 8 floats (rows 16- but not 32-byte aligned) against 8 and 32 mod 32: the tf32
and fp32 libraries' chosen member and two others, and cuBLAS, in turns (an H100 probe of 2026-11-26;
benchmarks/libraries/2026-11-26-h100-58779cb-split-rows.json). Usage: split_rows.py OUT.json"""
import json, statistics, sys
import torch
import gemmgen.library.dispatch as dispatch
SHAPES = ((2560, 2560, 2500), (2500, 2500, 2500), (2000, 3000, 700), (4092, 4092, 4092), (4100, 4100, 4100),
          (5004, 5004, 5004), (1532, 1532, 1532), (4096, 4096, 4092))
ROUNDS, CALLS = 7, 10
def up(x, m): return -(-x // m) * m
def main():
    dev = torch.device("cuda"); stream = torch.cuda.current_stream().cuda_stream
    rows = []
    for prec in ("tf32", "fp32"):
        torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        rt = dispatch.library(prec, 0)
        names = [m.name for m in rt.manifest.members]
        extra = ("tf32_14", "tf32_4") if prec == "tf32" else ("fp32_2",)
        rt.compile_all()
        for M, N, K in SHAPES:
            chosen = rt.choose(M, N, K, K, K, N)
            idxs = sorted({chosen} | {names.index(e) for e in extra})
            big_a = torch.rand(M, up(K, 32) + 32, device=dev); big_b = torch.rand(N, up(K, 32) + 32, device=dev)
            out = torch.empty(M, up(N, 32), device=dev)
            runs = {}
            for ld in sorted({K, up(K, 8), up(K, 32)}):
                a = big_a.view(-1)[: M * ld].view(M, ld)[:, :K]; b = big_b.view(-1)[: N * ld].view(N, ld)[:, :K]
                for ldc in sorted({N, up(N, 32)}):
                    c = out.view(-1)[: M * ldc].view(M, ldc)[:, :N]
                    for i in idxs:
                        k = rt.kernel(i)
                        def run(k=k, a=a, b=b, c=c, ld=ld, ldc=ldc):
                            for _ in range(CALLS):
                                k.launch(M, N, K, 1.0, a.data_ptr(), ld, b.data_ptr(), ld, 0.0, c.data_ptr(), ldc, stream=stream)
                        runs[(names[i] + ("*" if i == chosen else ""), ld, ldc)] = (run, [])
                    def cub(a=a, b=b, c=c):
                        for _ in range(CALLS):
                            torch.matmul(a, b.t(), out=c)
                    runs[("cublas", ld, ldc)] = (cub, [])
            for run, _ in runs.values(): run()
            for _ in range(ROUNDS):
                for key, (run, t) in runs.items():
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record(); run(); e.record(); e.synchronize(); t.append(s.elapsed_time(e) / CALLS)
            for (name, ld, ldc), (_, t) in runs.items():
                ms = statistics.median(t)
                rows.append(dict(precision=prec, shape=f"{M}x{N}x{K}", member=name, ld=ld, ldc=ldc, ms=ms))
                print(f"{prec} {M}x{N}x{K} {name:10s} ld {ld:5d} ldc {ldc:5d} {ms*1e3:8.1f} us {2*M*N*K/ms/1e9:6.1f} TFLOP/s", flush=True)
    json.dump(rows, open(sys.argv[1], "w"), indent=1)
if __name__ == "__main__":
    main()
