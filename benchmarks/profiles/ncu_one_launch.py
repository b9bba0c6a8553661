"""Two launches of one GEMM at M x N x K (warm-up, then the one ncu profiles): a kernel of a spec
file, or cuBLAS TF32, same A (row), B (col), C (row) buffers."""
import sys
import cupy as cp
from gemmgen.gpu.baseline import cublas_gemm
from gemmgen.plan import make_plan
from gemmgen.gpu.runtime import Kernel
from gemmgen.language.load import load
what, M, N, K = sys.argv[1], *map(int, sys.argv[2:5])
b_layout = sys.argv[5] if len(sys.argv) > 5 else "col"
A = cp.ascontiguousarray(cp.random.default_rng(0).uniform(-1, 1, (M, K), dtype=cp.float32))
B = cp.random.default_rng(1).uniform(-1, 1, (K, N), dtype=cp.float32)
B = cp.asfortranarray(B) if b_layout == "col" else cp.ascontiguousarray(B)
C = cp.zeros((M, N), cp.float32)
cp.cuda.Device().synchronize()
layouts = {"A": "row", "B": b_layout, "C": "row"}
if what in ("cublas_tf32", "cublas_fp32"):
    ldb = K if b_layout == "col" else N
    run = lambda: cublas_gemm(M, N, K, 1.0, A.data.ptr, K, B.data.ptr, ldb, 0.0, C.data.ptr, N, layouts,
                              tf32=what == "cublas_tf32")
else:
    spec_file, name = what.split(":")
    spec = next(s for s in load(spec_file) if s.name == name)
    kernel = Kernel(make_plan(spec))
    run = lambda: kernel(A, B, C)
for _ in range(2):
    run()
cp.cuda.Device().synchronize()
