"""Time a kernel beside cuBLAS on the same buffers: CUDA events, warm-up, L2 flushed, median;
the kernel's launches and cuBLAS's take turns, so both run at the same clocks.

TFLOP/s count 2*M*N*K flops. cuBLAS runs in the same process, through cublasGemmEx with an
explicit compute type: FP32 beside `math simt` and `math 3xtf32` kernels (which promise FP32
accuracy), TF32 beside `math tf32` kernels (which round their inputs to TF32 as cuBLAS's TF32 mode
does). Each bench also records the accuracy of the kernel and of cuBLAS FP32 on its own inputs.
The FP32 peak is read off the device: FFMA lanes per SM x 2 x SMs x clock.
"""

from __future__ import annotations

import datetime
import os
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from math import nan
from pathlib import Path
from typing import Callable

from ..outputs import save_figure
from ..version import __version__
from .baseline import baseline_for, cublas_gemm
from .epilogue_inputs import epilogue_vectors, vector_pointers
from .runtime import DeviceInfo, Kernel, device_info
from .verify import Case, accuracy_on, place_matrix

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
    baseline: str = "cuBLAS FP32"          # what cublas_ms and percent_of_cublas refer to
    rel_error: float = nan                 # the kernel's ||C - C64||_F / ||C64||_F
    max_rel_error: float = nan             # the kernel's max |C - C64| / max |C64|
    cublas_fp32_rel_error: float = nan     # cuBLAS FP32's, on the same inputs
    cublas_tf32_rel_error: float = nan     # cuBLAS TF32's, on the same inputs

    def as_dict(self) -> dict:
        return asdict(self)


def _cupy():
    import cupy
    return cupy


# Wall time the functions run, in turns, before they are timed. A GPU left idle (while kernels
# compile, or between processes) drops its clocks, and short kernels timed at once measure that:
# an H100 ran a 33 us GEMM and cuBLAS's both 3x slower that way. do_bench warms up 25 ms.
WARMUP_S = 0.1
BATCH = 8  # timed rounds queued before the host waits for them


def time_gpu(run: Callable[[], None], *, flush: Callable[[], None] | None = None,
             warmup: int = 3, warmup_s: float = WARMUP_S, budget_s: float = 0.5, min_runs: int = 5,
             max_runs: int = 200) -> Timing:
    """Median time of `run` between CUDA events, each run after `flush` (outside the events)."""
    return time_alternating([run], flush=flush, warmup=warmup, warmup_s=warmup_s, budget_s=budget_s,
                            min_runs=min_runs, max_runs=max_runs)[0]


def time_alternating(runs: list[Callable[[], None]], *, flush: Callable[[], None] | None = None,
                     warmup: int = 3, warmup_s: float = WARMUP_S, budget_s: float = 0.5,
                     min_runs: int = 5, max_runs: int = 200) -> list[Timing]:
    """time_gpu of several functions whose launches take turns (a, b, a, b, ...), so that each
    sees the same clocks: a GPU that heats up and slows down under tensor-core work would
    otherwise favour whichever was timed first. First they run `warmup` times each, and on
    until `warmup_s` seconds have passed."""
    cp = _cupy()
    deadline = time.perf_counter() + warmup_s
    rounds = 0
    while rounds < warmup or time.perf_counter() < deadline:
        for run in runs:
            if flush:
                flush()
            run()
        cp.cuda.runtime.deviceSynchronize()  # wall time, not queued launches, counts to the deadline
        rounds += 1
    # Rounds are queued BATCH at a time, each run between its own pair of events, and read after one
    # synchronisation: the host runs ahead of the GPU, so the Python work of a launch (arguments,
    # tensor maps) happens while the GPU flushes L2 for it, and is not counted as kernel time.
    events = [[(cp.cuda.Event(), cp.cuda.Event()) for _ in range(BATCH)] for _ in runs]
    times: list[list[float]] = [[] for _ in runs]
    spent = 0.0
    while len(times[0]) < min_runs or (spent < budget_s * 1e3 * len(runs) and len(times[0]) < max_runs):
        batch = max(1, min(BATCH, max_runs - len(times[0])))
        for i in range(batch):
            for run, pairs in zip(runs, events):
                if flush:
                    flush()
                pairs[i][0].record()
                run()
                pairs[i][1].record()
        events[-1][batch - 1][1].synchronize()
        for samples, pairs in zip(times, events):
            for start, end in pairs[:batch]:
                elapsed = cp.cuda.get_elapsed_time(start, end)
                samples.append(elapsed)
                spent += elapsed
    timings = []
    for samples in times:
        samples.sort()
        pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]  # noqa: E731
        timings.append(Timing(statistics.median(samples), pick(0.1), pick(0.9), len(samples)))
    return timings


class L2Flusher:
    """Overwrites a buffer four times the L2's size, so each timed run starts with a cold cache.
    The size also keeps the GPU busy (about 70 us on an H100) while the host prepares the timed
    launch, so that a launch's Python work (arguments, choosing a library member) is not counted
    as the kernel's time, for gemmgen's kernels and cuBLAS alike."""

    def __init__(self, info: DeviceInfo):
        cp = _cupy()
        self.buffer = cp.empty(max(4 * info.l2_bytes, 1 << 20) // 4, dtype=cp.float32)

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
    buffers, lds = {}, {}
    for name in "ABC":
        buffers[name], lds[name] = place_matrix(cp, values[name], layout[name], case.pad, case.offset)
    smallest, smallest_arrays = None, None  # the arrays stay referenced while the kernel writes them
    if plan.reduce_count:
        smallest_arrays = [cp.zeros(plan.reduce_count, dtype) for dtype in (cp.float32, cp.int32, cp.int32)]
        smallest = tuple(x.data.ptr for x in smallest_arrays)
    ptr = {name: buffers[name].data.ptr + 4 * case.offset for name in "ABC"}
    vectors = epilogue_vectors(cp, plan, case.M, case.N)  # a fused epilogue's bias and scale (kept referenced)
    extra = vector_pointers(vectors)

    def ours() -> None:
        kernel.launch(case.M, case.N, case.K, case.alpha, ptr["A"], lds["A"], ptr["B"], lds["B"],
                      case.beta, ptr["C"], lds["C"], smallest=smallest, **extra)

    baseline = baseline_for(plan.spec["math"])

    def cublas() -> None:
        cublas_gemm(case.M, case.N, case.K, case.alpha, ptr["A"], lds["A"], ptr["B"], lds["B"],
                    case.beta, ptr["C"], lds["C"], layout, tf32=baseline == "cuBLAS TF32")

    # Once, before the timed runs overwrite C: errors on these inputs against float64.
    accuracy = accuracy_on(kernel, case, values["A"], values["B"], values["C"])
    mine, theirs = time_alternating([ours, cublas], flush=flusher, budget_s=budget_s)
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
        percent_of_peak=100.0 * tflops / peak if peak else 0.0, runs=mine.runs,
        baseline=baseline, rel_error=accuracy.rel_error, max_rel_error=accuracy.max_rel_error,
        cublas_fp32_rel_error=accuracy.cublas_fp32_rel_error,
        cublas_tf32_rel_error=accuracy.cublas_tf32_rel_error)


def plot(results: list[BenchResult], info: DeviceInfo, lanes_per_sm: int, path: str,
         focus: str | None = None) -> None:
    """PNG: every kernel at one shape (bars), the best kernel per shape beside cuBLAS, and the
    results on a roofline. Kernels are compared within their precision: FP32-accurate ones (simt,
    3xtf32) with cuBLAS FP32, TF32 ones with cuBLAS TF32."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peak = info.fp32_peak_tflops(lanes_per_sm)
    bandwidth = info.memory_bandwidth_gbs / 1e3  # TB/s
    shapes = list(dict.fromkeys(r.shape for r in results))
    focus = focus if focus in shapes else ("4096x4096x4096" if "4096x4096x4096" in shapes else shapes[0])
    baselines = sorted({r.baseline for r in results})  # "cuBLAS FP32" before "cuBLAS TF32"
    colours = {"cuBLAS FP32": "tab:blue", "cuBLAS TF32": "tab:orange"}
    kind = {"cuBLAS FP32": "FP32-accurate", "cuBLAS TF32": "TF32"}
    best = {(b, s): max(rs, key=lambda r: r.tflops) for b in baselines for s in shapes
            if (rs := [r for r in results if r.shape == s and r.baseline == b])}
    cublas = {key: r.cublas_tflops for key, r in best.items()}
    fig, (kernels_ax, shapes_ax, roof) = plt.subplots(1, 3, figsize=(17, 5.5),
                                                      gridspec_kw={"width_ratios": [1.2, 1.2, 1]})

    at_focus = [r for r in results if r.shape == focus]
    names = [r.kernel.removeprefix("gemmgen_") for r in at_focus]
    kernels_ax.barh(range(len(at_focus)), [r.tflops for r in at_focus],
                    color=[colours.get(r.baseline, "tab:blue") for r in at_focus])
    for b in baselines:
        if (b, focus) in cublas:
            kernels_ax.axvline(cublas[b, focus], color=colours.get(b, "black"), linestyle="--",
                               label=f"{b} {cublas[b, focus]:.1f}")
    kernels_ax.axvline(peak, color="grey", linestyle=":", label=f"FP32 (FFMA) peak {peak:.1f}")
    kernels_ax.set_yticks(range(len(at_focus)), names, fontsize=8)
    kernels_ax.invert_yaxis()
    kernels_ax.set_xlabel("TFLOP/s")
    kernels_ax.set_title(f"every spec at {focus}")
    kernels_ax.legend(fontsize=8, loc="center right")

    xs = range(len(shapes))
    width = 0.8 / (2 * len(baselines))
    for n, b in enumerate(baselines):
        mine = [best[b, s].tflops if (b, s) in best else 0 for s in shapes]
        theirs = [cublas.get((b, s), 0) for s in shapes]
        offset = -0.4 + width * (2 * n + 0.5)
        shapes_ax.bar([x + offset for x in xs], mine, width, color=colours.get(b, "tab:blue"),
                      label=f"best {kind.get(b, b)} gemmgen spec")
        shapes_ax.bar([x + offset + width for x in xs], theirs, width, color=colours.get(b, "black"),
                      alpha=0.45, hatch="//", label=b)
        for x, s in zip(xs, shapes):
            if (b, s) in best:
                shapes_ax.annotate(best[b, s].kernel.removeprefix("gemmgen_"), (x + offset, best[b, s].tflops),
                                   rotation=90, fontsize=6, ha="center", va="bottom")
    shapes_ax.axhline(peak, color="grey", linestyle=":")
    shapes_ax.set_xticks(list(xs), shapes, rotation=20, fontsize=8)
    shapes_ax.set_ylabel("TFLOP/s")
    # Tensor-core kernels and the TF32 baseline run past the FP32 peak.
    shapes_ax.set_ylim(0, max([peak] + [r.tflops for r in best.values()] + list(cublas.values())) * 1.2)
    shapes_ax.set_title(f"{info.name}: best spec per shape vs cuBLAS, per precision")
    shapes_ax.legend(fontsize=7, loc="upper left")

    def intensity(r):
        return 2 * r.M * r.N * r.K / (4 * (r.M * r.K + r.K * r.N + 2 * r.M * r.N))

    low, high = 1, max([intensity(r) for r in results] + [1e3]) * 2
    line = [low * (high / low) ** (i / 200) for i in range(201)]
    roof.plot(line, [min(peak, bandwidth * x) for x in line], color="grey", label="FP32 (FFMA) roofline")
    for b in baselines:
        mine = [r for r in results if r.baseline == b]
        tops = [r for key, r in best.items() if key[0] == b]
        roof.scatter([intensity(r) for r in mine], [r.tflops for r in mine], s=10, alpha=0.35,
                     color=colours.get(b, "tab:blue"), label=f"{kind.get(b, b)} gemmgen specs")
        roof.scatter([intensity(r) for r in tops], [r.cublas_tflops for r in tops], marker="x",
                     color=colours.get(b, "black"), label=b, zorder=3)
    roof.set_xscale("log")
    roof.set_yscale("log")
    roof.set_xlabel("arithmetic intensity (flop per byte of ideal DRAM traffic)")
    roof.set_ylabel("TFLOP/s")
    roof.set_title(f"roofline: {peak:.0f} TFLOP/s FP32, {bandwidth:.2f} TB/s")
    roof.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)  # atomically, tagged as gemmgen's
    plt.close(fig)


def plot_library(rows: list[dict], baseline: str, title: str, path: str) -> None:
    """PNG: a library's speed over cuBLAS per shape (bars, log scale), the member it ran named on
    each; rows have "shape", "ratio" (cuBLAS time / library time), "member", and optionally
    "best_ratio" (the best candidate timed) and "tuned" (False marks a shape tuning never saw)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(rows) + 2), 5.5))
    xs = range(len(rows))
    colours = ["tab:green" if r["ratio"] >= 1 else "tab:red" for r in rows]
    hatches = ["" if r.get("tuned", True) else "//" for r in rows]
    bars = ax.bar(xs, [r["ratio"] for r in rows], color=colours, alpha=0.8)
    for bar, hatch in zip(bars, hatches):
        bar.set_hatch(hatch)
    if any("best_ratio" in r for r in rows):
        ax.scatter(xs, [r.get("best_ratio", 0) for r in rows], marker="_", s=200, color="black",
                   label="best candidate timed", zorder=3)
    for x, r in zip(xs, rows):
        ax.annotate(r["member"], (x, r["ratio"]), rotation=90, fontsize=6, ha="center", va="bottom")
    ax.axhline(1.0, color="black", linestyle="--", label=baseline)
    ax.set_yscale("log")
    ax.set_xticks(list(xs), [r["shape"] for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"speed over {baseline} (x)")
    ax.set_title(title + ("  (hatched: shapes tuning never saw)" if any(not r.get("tuned", True) for r in rows) else ""))
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)  # atomically, tagged as gemmgen's
    plt.close(fig)


def run_meta(info: DeviceInfo, commit: str | None = None) -> dict:
    """What a record of timings must say to be read later: device, driver, gemmgen's version and
    commit, date. The commit is `commit`, else $GEMMGEN_COMMIT, else the checkout's HEAD when
    gemmgen runs from one, else unknown (an installed wheel)."""

    def first_line(command: list[str], cwd: Path | None = None) -> str | None:
        try:
            done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip().splitlines()[0] if done.stdout.strip() else None

    checkout = Path(__file__).resolve().parents[2]
    commit = commit or os.environ.get("GEMMGEN_COMMIT") or (
        first_line(["git", "rev-parse", "--short", "HEAD"], checkout) if (checkout / ".git").exists() else None)
    return {"device": info.name, "driver": info.driver_version,
            "driver_full": first_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
            or info.driver_version,
            "sm_count": info.sm_count, "clock_mhz": info.clock_khz / 1000,
            "gemmgen": __version__, "commit": commit or "unknown",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def timing_record(info: DeviceInfo, results: list[dict]) -> dict:
    """What `gemmgen bench --json` writes: who measured where and when (run_meta), then the results."""
    return {"generator": "gemmgen", "meta": run_meta(info), "results": results}
