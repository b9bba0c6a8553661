"""How one candidate is measured on the GPU, in the worker process that may die: validated on small
awkward shapes (VALIDATION_CASES) against float64, then timed at the search's shape beside cuBLAS in
the candidates' precision (GpuBench), each a record for the database."""

from __future__ import annotations

from ..gpu import bench, runtime, verify
from ..gpu.baseline import baseline_for, cublas_gemm
from ..gpu.compile import compile_plan
from ..gpu.epilogue_inputs import epilogue_vectors, vector_pointers
from ..gpu.verify import Case
from ..plan import Plan
from ..plan.space import Space

VALIDATION_CASES = (Case(127, 131, 137, pad=3), Case(257, 255, 253, alpha=0.5, beta=0.5, pad=5, offset=1),
                    Case(256, 256, 64, beta=1.0))


CUBLAS_KEY = "cublas"


def _cupy():
    import cupy
    return cupy


def _time_setup(shape: Case):
    cp = _cupy()
    rng = cp.random.default_rng(12345)
    return {name: rng.uniform(-1, 1, size + 64, dtype=cp.float32)
            for name, size in (("A", shape.M * shape.K), ("B", shape.K * shape.N), ("C", shape.M * shape.N))}


class GpuBench:
    """What a GPU worker keeps between candidates at one shape: timing buffers, the L2 flusher,
    the validation inputs. `candidate` validates and times one compiled point, `cublas` the
    baseline; both return the fields of a record. Call them in the process that may die."""

    def __init__(self, shape: Case, budget_s: float):
        self.shape, self.budget_s = shape, budget_s
        self.flusher = bench.L2Flusher(runtime.device_info())
        self.buffers = _time_setup(shape)
        self.problems: dict = {}

    def _pointers(self, layouts: dict) -> tuple:
        lds = _leading_dimensions(self.shape, layouts)
        return tuple(x for name in "ABC" for x in (self.buffers[name].data.ptr, lds[name]))

    def cublas(self, baseline: str, layouts: dict | None) -> dict:
        """cuBLAS in the candidates' precision and layouts, on the same buffers."""
        shape, layouts = self.shape, layouts or {"A": "row", "B": "row", "C": "row"}
        a, lda, b, ldb, c, ldc = self._pointers(layouts)
        timing = bench.time_gpu(lambda: cublas_gemm(shape.M, shape.N, shape.K, 1.0, a, lda, b, ldb, 0.0, c, ldc,
                                              layouts, tf32=baseline == "cuBLAS TF32"),
                          flush=self.flusher, budget_s=self.budget_s)
        return {"key": CUBLAS_KEY, "point": baseline, "status": "ok", "ms": timing.median_ms,
                "tflops": _tflops(shape, timing.median_ms)}

    def candidate(self, plan: Plan, compiled) -> dict:
        """Validated on VALIDATION_CASES, then timed at the shape: status (ok or invalid) and more."""
        shape = self.shape
        kernel = runtime.Kernel(plan, compiled)
        try:
            report = verify.check(kernel, VALIDATION_CASES, problems=self.problems)
            if not report.ok:
                bad = report.failures[0]
                return {"status": "invalid", "reason": f"{bad.case}: {bad.message}"}
            a, lda, b, ldb, c, ldc = self._pointers({x: plan.spec[f"layout.{x}"] for x in "ABC"})
            vectors = epilogue_vectors(_cupy(), plan, shape.M, shape.N)  # a fused epilogue's, kept referenced
            extra = vector_pointers(vectors)
            timing = bench.time_gpu(lambda: kernel.launch(shape.M, shape.N, shape.K, 1.0, a, lda, b, ldb, 0.0, c, ldc,
                                                          **extra),
                              flush=self.flusher, budget_s=self.budget_s)
            return {"status": "ok", "ms": timing.median_ms, "tflops": _tflops(shape, timing.median_ms)}
        finally:
            kernel.close()


def _leading_dimensions(shape: Case, layouts: dict) -> dict:
    """Tight leading dimensions of A, B and C in their layouts, as a caller's dense arrays have."""
    rows = {"A": (shape.M, shape.K), "B": (shape.K, shape.N), "C": (shape.M, shape.N)}
    return {x: max(1, rows[x][1] if layouts[x] == "row" else rows[x][0]) for x in "ABC"}


def search_baseline(space: Space) -> str:
    """The cuBLAS mode a space's candidates are timed against: one precision per search, since a
    TF32 kernel is faster than an FP32-accurate one by giving up accuracy, not by being better."""
    maths = sorted({plan.math for plan in space.plans})
    baselines = {baseline_for(m) for m in maths}
    if len(baselines) > 1:
        raise space.spec.error("math", f"math {{{', '.join(maths)}}} mixes TF32 (10-bit inputs) with "
                               "FP32-accurate modes: the search would pick TF32 for its speed and lose "
                               "the accuracy", "one search per precision: math tf32, or math "
                               "{simt, 3xtf32}")
    return baselines.pop()


def _compiled(plan: Plan, source: str | None):
    return compile_plan(plan, source)


def _tflops(shape: Case, ms: float) -> float:
    return 2.0 * shape.M * shape.N * shape.K / (ms * 1e-3) / 1e12 if ms else 0.0
