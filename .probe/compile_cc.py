import sys, time
sys.path.insert(0, 'tests')
if __name__ == "__main__":
    import gemmgen.library.dispatch as dispatch
    import gemmgen.library.runtime as library_runtime
    from fake_device import INFO
    library_runtime.device_info = lambda ordinal=0: INFO
    from gemmgen.gpu.compile import compile_all
    plans = []
    for klass in (("col", "col"), ("col", "col", "col")):
        r = dispatch.library("tf32", 0, klass)
        plans += [p for i, p in enumerate(r.plans) if i not in r.left_out]
    import test_gpu_mn_major as t
    from gemmgen.plan import make_plan
    plans += [make_plan(s) for n, s in t.SPECS.items() if "3x" not in n]
    t0 = time.time()
    compile_all(plans)
    print(len(plans), "compiled", time.time() - t0)
