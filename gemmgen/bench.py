"""Time a kernel beside cuBLAS on the same buffers: CUDA events, warm-up, L2 flushed, median.

TFLOP/s count 2*M*N*K flops. cuBLAS runs in FP32 (TF32 off) through CuPy in the same process.
The FP32 peak is read off the device: FFMA lanes per SM x 2 x SMs x clock.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass
from typing import Callable

from .runtime import DeviceInfo, Kernel, device_info
from .verify import Case, place_matrix, matrix_view

os.environ.setdefault("CUPY_TF32", "0")  # cuBLAS baseline in true FP32

DEFAULT_SHAPES = (Case(1024, 1024, 1024), Case(2048, 2048, 2048), Case(4092, 4092, 4092),
                  Case(4096, 4096, 4096), Case(8192, 8192, 8192), Case(127, 4099, 1023))


@dataclass
class Timing:
    median_ms: float
    p10_ms: float
    p90_ms: float
    runs: int


@dataclass
class BenchResult:
    kernel: str
    shape: str
    M: int
    N: int
    K: int
    layout: str
    ms: float
    tflops: float
    spread_ms: tuple[float, float]
    cublas_ms: float
    cublas_tflops: float
    percent_of_cublas: float
    percent_of_peak: float
    runs: int

    def as_dict(self) -> dict:
        return asdict(self)


def _cupy():
    import cupy
    return cupy


def time_gpu(run: Callable[[], None], *, flush: Callable[[], None] | None = None,
             warmup: int = 3, budget_s: float = 0.5, min_runs: int = 5, max_runs: int = 200) -> Timing:
    """Median time of `run` between CUDA events, each run after `flush` (outside the events)."""
    cp = _cupy()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(warmup):
        run()
    cp.cuda.runtime.deviceSynchronize()
    times: list[float] = []
    spent = 0.0
    while len(times) < min_runs or (spent < budget_s * 1e3 and len(times) < max_runs):
        if flush:
            flush()
        start.record()
        run()
        end.record()
        end.synchronize()
        elapsed = cp.cuda.get_elapsed_time(start, end)
        times.append(elapsed)
        spent += elapsed
    times.sort()
    pick = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    return Timing(statistics.median(times), pick(0.1), pick(0.9), len(times))


class L2Flusher:
    """Overwrites a buffer twice the L2's size, so each timed run starts with a cold cache."""

    def __init__(self, info: DeviceInfo):
        cp = _cupy()
        self.buffer = cp.empty(max(2 * info.l2_bytes, 1 << 20) // 4, dtype=cp.float32)

    def __call__(self) -> None:
        self.buffer.fill(0.0)


def fp32_peak_tflops(info: DeviceInfo, lanes_per_sm: int) -> float:
    return info.fp32_peak_tflops(lanes_per_sm)


def bench(kernel: Kernel, case: Case, *, info: DeviceInfo | None = None,
          flusher: L2Flusher | None = None, budget_s: float = 0.5) -> BenchResult:
    cp = _cupy()
    info = info or device_info(kernel.device)
    flusher = flusher or L2Flusher(info)
    plan = kernel.plan
    layout = {name: plan.spec[f"layout.{name}"] for name in "ABC"}
    generator = cp.random.default_rng(case.M * 7 + case.N * 13 + case.K)
    values = {
        "A": generator.uniform(-1, 1, (case.M, case.K), dtype=cp.float32),
        "B": generator.uniform(-1, 1, (case.K, case.N), dtype=cp.float32),
        "C": generator.uniform(-1, 1, (case.M, case.N), dtype=cp.float32),
    }
    buffers, lds, views = {}, {}, {}
    for name, shape in (("A", (case.M, case.K)), ("B", (case.K, case.N)), ("C", (case.M, case.N))):
        buffers[name], lds[name] = place_matrix(cp, values[name], layout[name], case.pad, case.offset)
        views[name] = matrix_view(cp, buffers[name], *shape, layout[name], lds[name], case.offset)
    smallest = None
    if plan.reduce_count:
        smallest = tuple(cp.zeros(plan.reduce_count, dtype).data.ptr
                         for dtype in (cp.float32, cp.int32, cp.int32))
    ptr = {name: buffers[name].data.ptr + 4 * case.offset for name in "ABC"}

    def ours() -> None:
        kernel.launch(case.M, case.N, case.K, case.alpha, ptr["A"], lds["A"], ptr["B"], lds["B"],
                      case.beta, ptr["C"], lds["C"], smallest=smallest)

    a, b, c = views["A"], views["B"], views["C"]

    def cublas() -> None:
        # cuBLAS writes C = A @ B; a column-major C is the row-major product B^T A^T.
        if layout["C"] == "row":
            cp.matmul(a, b, out=c)
        else:
            cp.matmul(b.T, a.T, out=c.T)

    mine = time_gpu(ours, flush=flusher, budget_s=budget_s)
    theirs = time_gpu(cublas, flush=flusher, budget_s=budget_s)
    flops = 2.0 * case.M * case.N * case.K
    tflops = flops / (mine.median_ms * 1e-3) / 1e12 if mine.median_ms else 0.0
    cublas_tflops = flops / (theirs.median_ms * 1e-3) / 1e12 if theirs.median_ms else 0.0
    peak = info.fp32_peak_tflops(plan.arch.fp32_lanes_per_sm)
    return BenchResult(
        kernel=kernel.name, shape=str(case), M=case.M, N=case.N, K=case.K,
        layout=f"A {layout['A']}, B {layout['B']}, C {layout['C']}", ms=mine.median_ms,
        tflops=tflops, spread_ms=(mine.p10_ms, mine.p90_ms), cublas_ms=theirs.median_ms,
        cublas_tflops=cublas_tflops,
        percent_of_cublas=100.0 * theirs.median_ms / mine.median_ms if mine.median_ms else 0.0,
        percent_of_peak=100.0 * tflops / peak if peak else 0.0, runs=mine.runs)


def plot(results: list[BenchResult], info: DeviceInfo, lanes_per_sm: int, path: str,
         focus: str | None = None) -> None:
    """PNG: every kernel at one shape (bars), the best kernel per shape beside cuBLAS, and the
    results on a roofline."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peak = info.fp32_peak_tflops(lanes_per_sm)
    bandwidth = info.memory_bandwidth_gbs / 1e3  # TB/s
    shapes = list(dict.fromkeys(r.shape for r in results))
    focus = focus if focus in shapes else ("4096x4096x4096" if "4096x4096x4096" in shapes else shapes[0])
    cublas = {s: next(r.cublas_tflops for r in results if r.shape == s) for s in shapes}
    fig, (kernels_ax, shapes_ax, roof) = plt.subplots(1, 3, figsize=(17, 5.5),
                                                      gridspec_kw={"width_ratios": [1.2, 1.2, 1]})

    at_focus = [r for r in results if r.shape == focus]
    names = [r.kernel.removeprefix("gemmgen_") for r in at_focus]
    kernels_ax.barh(range(len(at_focus)), [r.tflops for r in at_focus], color="tab:blue")
    kernels_ax.axvline(cublas[focus], color="black", linestyle="--", label=f"cuBLAS {cublas[focus]:.1f}")
    kernels_ax.axvline(peak, color="grey", linestyle=":", label=f"FP32 peak {peak:.1f}")
    kernels_ax.set_yticks(range(len(at_focus)), names, fontsize=8)
    kernels_ax.invert_yaxis()
    kernels_ax.set_xlabel("TFLOP/s")
    kernels_ax.set_title(f"every spec at {focus}")
    kernels_ax.legend(fontsize=8, loc="lower right")

    best = {s: max((r for r in results if r.shape == s), key=lambda r: r.tflops) for s in shapes}
    xs = range(len(shapes))
    shapes_ax.bar([x - 0.2 for x in xs], [best[s].tflops for s in shapes], 0.4, label="best gemmgen spec")
    shapes_ax.bar([x + 0.2 for x in xs], [cublas[s] for s in shapes], 0.4, color="black", label="cuBLAS FP32")
    for x, s in zip(xs, shapes):
        shapes_ax.annotate(best[s].kernel.removeprefix("gemmgen_"), (x - 0.2, best[s].tflops),
                           rotation=90, fontsize=7, ha="center", va="bottom")
    shapes_ax.axhline(peak, color="grey", linestyle=":")
    shapes_ax.set_xticks(list(xs), shapes, rotation=20, fontsize=8)
    shapes_ax.set_ylabel("TFLOP/s")
    shapes_ax.set_ylim(0, peak * 1.15)
    shapes_ax.set_title(f"{info.name}: best spec per shape vs cuBLAS")
    shapes_ax.legend(fontsize=8, loc="upper left")

    def intensity(r):
        return 2 * r.M * r.N * r.K / (4 * (r.M * r.K + r.K * r.N + 2 * r.M * r.N))

    low, high = 1, max([intensity(r) for r in results] + [1e3]) * 2
    line = [low * (high / low) ** (i / 200) for i in range(201)]
    roof.plot(line, [min(peak, bandwidth * x) for x in line], color="grey", label="roofline")
    roof.scatter([intensity(r) for r in results], [r.tflops for r in results], s=10, color="lightsteelblue",
                 label="gemmgen specs")
    roof.scatter([intensity(best[s]) for s in shapes], [best[s].tflops for s in shapes], color="tab:blue",
                 label="best gemmgen spec", zorder=3)
    roof.scatter([intensity(best[s]) for s in shapes], [cublas[s] for s in shapes], marker="x",
                 color="black", label="cuBLAS", zorder=3)
    roof.set_xscale("log")
    roof.set_yscale("log")
    roof.set_xlabel("arithmetic intensity (flop per byte of ideal DRAM traffic)")
    roof.set_ylabel("TFLOP/s")
    roof.set_title(f"roofline: {peak:.0f} TFLOP/s FP32, {bandwidth:.2f} TB/s")
    roof.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
