"""At split calls (A and B rows 4 mod 8 floats apart): each library's choice against every member, beside
cuBLAS (benchmarks/libraries/2026-11-26-h100-bbe6a59-split-choice.json). Usage: split_choice.py OUT.json"""
import json, statistics, sys
import torch
import gemmgen.library.dispatch as dispatch
SHAPES = ((512, 512, 508), (768, 768, 764), (1024, 1024, 1020), (2048, 2048, 2044), (3012, 3012, 3012),
          (1500, 2500, 900), (8192, 1024, 1020), (4096, 4096, 1020), (64, 4096, 4092), (16, 4096, 4092),
          (4096, 64, 4092), (256, 4096, 2044))
ROUNDS, CALLS = 5, 10
def main():
    dev = torch.device("cuda"); stream = torch.cuda.current_stream().cuda_stream
    rows = []
    for prec in ("tf32", "fp32"):
        torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        rt = dispatch.library(prec, 0)
        names = [m.name for m in rt.manifest.members]
        rt.compile_all()
        for M, N, K in SHAPES:
            chosen = rt.choose(M, N, K, K, K, N)
            a = torch.rand(M, K, device=dev); b = torch.rand(N, K, device=dev); c = torch.empty(M, N, device=dev)
            runs = {}
            for i, name in enumerate(names):
                if rt.candidates[i].shape.decode and min(M, N) > 16:
                    continue
                k = rt.kernel(i)
                def run(k=k):
                    for _ in range(CALLS):
                        k.launch(M, N, K, 1.0, a.data_ptr(), K, b.data_ptr(), K, 0.0, c.data_ptr(), N, stream=stream)
                runs[name] = (run, [])
            def cub():
                for _ in range(CALLS):
                    torch.matmul(a, b.t(), out=c)
            runs["cublas"] = (cub, [])
            for run, _ in runs.values(): run()
            for _ in range(ROUNDS):
                for key, (run, t) in runs.items():
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record(); run(); e.record(); e.synchronize(); t.append(s.elapsed_time(e) / CALLS)
            ms = {k: statistics.median(t) for k, (_, t) in runs.items()}
            best = min((v, k) for k, v in ms.items() if k != "cublas")
            ch = ms[names[chosen]]
            rows.append(dict(precision=prec, shape=f"{M}x{N}x{K}", chosen=names[chosen], ms=ms))
            print(f"{prec} {M}x{N}x{K}: chosen {names[chosen]} {ch*1e3:.1f} us, best {best[1]} {best[0]*1e3:.1f} "
                  f"(chosen/best {ch/best[0]:.3f}), cublas {ms['cublas']*1e3:.1f} (x cublas {ms['cublas']/ch:.2f}, best x cublas {ms['cublas']/best[0]:.2f})", flush=True)
    json.dump(rows, open(sys.argv[1], "w"), indent=1)
if __name__ == "__main__":
    main()
