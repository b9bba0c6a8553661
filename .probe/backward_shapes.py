"""The model's backward GEMM shapes in tf32: relaid classes on (tf32_cc) vs off (copies), vs torch TF32."""
import statistics, sys
if __name__ == "__main__":
    import torch
    import gemmgen
    import gemmgen.library.dispatch as dispatch
    torch.backends.cuda.matmul.allow_tf32 = True
    T, H, F, V = 2048, 2048, 5632, 32000
    cases = []
    for i, o in ((H, H), (H, F), (F, H), (H, V)):
        cases += [("fwd", T, o, i, "row", "col"), ("igrad", T, i, o, "row", "row"), ("wgrad", o, i, T, "col", "row")]
    def op(r, c, layout):
        x = torch.rand(r, c, device="cuda") * 2 - 1
        return x if layout == "row" else x.t().contiguous().t()
    orig = dispatch.available_classes
    def classes(on):
        dispatch.available_classes.cache_clear()
        dispatch._calls.clear()
        if on:
            dispatch.available_classes = orig
        else:
            dispatch.available_classes = lambda p: frozenset({("row", "col")}) if p == "tf32" else orig(p)
    rows = []
    import warnings; warnings.simplefilter("ignore")
    for name, M, N, K, la, lb in cases:
        A, B = op(M, K, la), op(K, N, lb)
        out = torch.empty(M, N, device="cuda")
        ref = A.double() @ B.double()
        t = {}
        for mode in ("on", "off", "torch"):
            if mode != "torch":
                classes(mode == "on")
                f = lambda: gemmgen.matmul(A, B, out, precision="tf32")
            else:
                f = lambda: torch.matmul(A, B, out=out)
            f(); torch.cuda.synchronize()
            err = float((out.double() - ref).norm() / ref.norm())
            ts = []
            for _ in range(7):
                s, e = torch.cuda.Event(True), torch.cuda.Event(True)
                s.record()
                for _ in range(10): f()
                e.record(); e.synchronize(); ts.append(s.elapsed_time(e) / 10)
            t[mode] = (statistics.median(ts), err)
        classes(True)
        print(f"{name:6s} {M}x{N}x{K} {la}/{lb}: relaid {t['on'][0]*1e3:.1f} us  copies {t['off'][0]*1e3:.1f} us  torch {t['torch'][0]*1e3:.1f} us  x torch {t['torch'][0]/t['on'][0]:.2f} / {t['torch'][0]/t['off'][0]:.2f}  err {t['on'][1]:.1e}", flush=True)
