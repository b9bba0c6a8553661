"""How a job is measured on a GPU, in the worker process that may die: a candidate validated on small
awkward shapes (VALIDATION_CASES) against float64, timed at a shape (median of CUDA events, L2
flushed between launches; a batched shape through the strided-batched entry point, its matrices
dense one after another), or both; cuBLAS timed at a shape in the candidates' precision and
layouts, on the same buffers. The one measurer of searches and libraries, on this host or a Dask
cluster: GpuMeasurer, a small picklable object sent with each job, whose process keeps its state
(timing buffers, the L2 flusher, validation inputs, loaded kernels) between jobs."""

from __future__ import annotations

from collections import OrderedDict

from ..gpu import bench, runtime, verify
from ..gpu.baseline import baseline_for, cublas_gemm
from ..gpu.compile import compile_plan
from ..gpu.epilogue_inputs import epilogue_vectors, vector_pointers
from ..gpu.verify import Case
from ..plan import Plan
from ..plan.space import Space
from .jobs import BASELINE, MEASURE, VALIDATE, Device, Job

VALIDATION_CASES = (Case(127, 131, 137, pad=3), Case(257, 255, 253, alpha=0.5, beta=0.5, pad=5, offset=1),
                    Case(256, 256, 64, beta=1.0))
KERNELS_KEPT = 32  # loaded kernels a GPU process keeps for the jobs that follow (a library's)


def leading_dimensions(shape: Case, layouts: dict) -> dict:
    """Leading dimensions of A, B and C in their layouts: tight, as a caller's dense arrays have,
    plus the shape's pad."""
    rows = {"A": (shape.M, shape.K), "B": (shape.K, shape.N), "C": (shape.M, shape.N)}
    return {x: max(1, rows[x][1] if layouts[x] == "row" else rows[x][0]) + shape.pad for x in "ABC"}


def _cupy():
    import cupy
    return cupy


def batch_strides(shape: Case, layouts: dict) -> tuple[int, int, int]:
    """Floats between consecutive matrices of A, B and C in a batch: each matrix dense after the last,
    in its layout, with the shape's leading dimensions."""
    rows = {"A": (shape.M, shape.K), "B": (shape.K, shape.N), "C": (shape.M, shape.N)}
    lds = leading_dimensions(shape, layouts)
    return tuple(max(1, rows[x][0] if layouts[x] == "row" else rows[x][1]) * lds[x] for x in "ABC")


def _check_room(cp, shape: Case, needed: int) -> None:
    """MemoryError where the operands of `shape` (`needed` bytes) would not fit in the GPU's free
    memory (with room for cuBLAS's workspace and the kernels'), said before anything is allocated."""
    try:
        cp.get_default_memory_pool().free_all_blocks()
        free = cp.cuda.runtime.memGetInfo()[0]
    except AttributeError:  # a stand-in without memory queries (the tests' fake device)
        return
    if needed > 0.9 * free:
        raise MemoryError(f"shape {shape}: its operands need {needed / 1e9:.1f} GB, and this GPU has "
                          f"{free / 1e9:.1f} GB free")


def _tflops(shape: Case, ms: float) -> float:
    return 2.0 * shape.M * shape.N * shape.K * shape.batch / (ms * 1e-3) / 1e12 if ms else 0.0


class _State:
    """What a GPU process keeps between jobs: the L2 flusher, one shape's timing buffers (each
    operand long enough for either layout), the validation inputs, the kernels loaded last."""

    def __init__(self):
        self.flusher = bench.L2Flusher(runtime.device_info())
        self.shape: tuple | None = None
        self.buffers: dict = {}
        self.problems: dict = {}
        self.kernels: OrderedDict = OrderedDict()

    def pointers(self, shape: Case, layouts: dict) -> tuple:
        """A, lda, B, ldb, C, ldc on random inputs of this shape (made on its first job). MemoryError,
        before allocating, for a shape whose operands this GPU cannot hold."""
        key = (shape.M, shape.N, shape.K, shape.pad, shape.batch)
        if key != self.shape:
            cp = _cupy()
            self.buffers = {}  # the last shape's buffers go first
            sizes = {}  # floats of each operand: `batch` matrices, each long enough for either layout
            for name, (rows, cols) in (("A", (shape.M, shape.K)), ("B", (shape.K, shape.N)),
                                       ("C", (shape.M, shape.N))):
                size = max(max(1, rows) * (max(1, cols) + shape.pad), max(1, cols) * (max(1, rows) + shape.pad))
                sizes[name] = size * shape.batch + 64
            _check_room(cp, shape, 4 * sum(sizes.values()))
            rng = cp.random.default_rng(12345)
            for name, size in sizes.items():
                self.buffers[name] = rng.uniform(-1, 1, size, dtype=cp.float32)
            self.shape = key
        lds = leading_dimensions(shape, layouts)
        return tuple(x for name in "ABC" for x in (self.buffers[name].data.ptr, lds[name]))

    def kernel(self, job: Job, compiled) -> runtime.Kernel:
        """The job's kernel, loaded once for the jobs of the same candidate that follow."""
        key = (job.key, job.source)
        if key in self.kernels:
            self.kernels.move_to_end(key)
            return self.kernels[key]
        kernel = runtime.Kernel(job.plan, compiled)
        self.kernels[key] = kernel
        while len(self.kernels) > KERNELS_KEPT:
            self.kernels.popitem(last=False)[1].close()
        return kernel

    def forget(self, job: Job) -> None:
        kernel = self.kernels.pop((job.key, job.source), None)
        if kernel is not None:
            kernel.close()


_state: _State | None = None


def _here() -> _State:
    global _state
    if _state is None:
        _state = _State()
    return _state


def _timed(state: _State, run, job: Job) -> dict:
    options = {} if job.warmup_s is None else {"warmup_s": job.warmup_s}
    timing = bench.time_gpu(run, flush=state.flusher, budget_s=job.budget_s, **options)
    return {"status": "ok", "ms": timing.median_ms, "tflops": _tflops(job.shape, timing.median_ms)}


def measure(job: Job, compiled) -> dict:
    """The fields of `job`'s record, measured on this process's GPU (see the module docstring)."""
    state = _here()
    if job.kind == BASELINE:
        layouts = dict(job.layouts) or {"A": "row", "B": "row", "C": "row"}
        a, lda, b, ldb, c, ldc = state.pointers(job.shape, layouts)
        s = job.shape
        strides = batch_strides(s, layouts)
        return _timed(state, lambda: cublas_gemm(s.M, s.N, s.K, 1.0, a, lda, b, ldb, 0.0, c, ldc, layouts,
                                                 tf32=job.point == "cuBLAS TF32", batch=s.batch,
                                                 strides=strides), job)
    kernel = state.kernel(job, compiled)
    try:
        if job.kind in (MEASURE, VALIDATE):
            report = verify.check(kernel, VALIDATION_CASES, problems=state.problems)
            if not report.ok:
                bad = report.failures[0]
                return {"status": "invalid", "reason": f"{bad.case}: {bad.message}"}
            if job.kind == VALIDATE:
                return {"status": "ok"}
        s = job.shape
        layouts = {x: job.plan.spec[f"layout.{x}"] for x in "ABC"}
        a, lda, b, ldb, c, ldc = state.pointers(s, layouts)
        vectors = epilogue_vectors(_cupy(), job.plan, s.M, s.N)  # a fused epilogue's, kept referenced
        extra = vector_pointers(vectors)
        if s.batch != 1:
            extra.update(batch=s.batch, strides=batch_strides(s, layouts))
        return _timed(state, lambda: kernel.launch(s.M, s.N, s.K, 1.0, a, lda, b, ldb, 0.0, c, ldc, **extra), job)
    finally:
        if job.kind == MEASURE:  # a search's point is measured once: its module goes at once
            state.forget(job)


def describe_device() -> Device:
    info = runtime.device_info()
    return Device(info.name, info.driver_version, info.sm_count, tuple(info.compute_capability))


def compile_or_reason(plan: Plan, source: str | None):
    """The Compiled kernel, or why it did not compile (a string)."""
    try:
        return compile_plan(plan, source)
    except Exception as exc:  # noqa: BLE001 - the candidate's failure, recorded as such
        return f"{type(exc).__name__}: {str(exc)[:500]}"


class GpuMeasurer:
    """The measurer the runners send with every job: `compile` on any CPU (NVRTC, through the
    on-disk cache), `describe` and `measure` in a GPU process. Tests put a fake with the same three
    methods in its place (tests/fake_cluster.py, tests/library_fake.py)."""

    def compile(self, plan: Plan, source: str | None):
        return compile_or_reason(plan, source)

    def describe(self) -> Device:
        return describe_device()

    def measure(self, job: Job, compiled) -> dict:
        return measure(job, compiled)


def default_measurer():
    """What measures jobs when no measurer is named: the GPU's."""
    return GpuMeasurer()


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
