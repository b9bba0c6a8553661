"""How a split GEMM scales (`gemmgen bench --devices`): the devices a user names, random inputs, the
error against float64, and one GPU on the whole problem beside the split and the resident shards."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ..gpu.verify import tolerance
from ..plan import Plan
from .batched import Shares, split_batched
from .cupy_layer import CupyLayer
from .parts import Balance, Part, Region, make_parts
from .split import (DEFAULT_CHUNKS, Launcher, ResidentResult, Shard, SplitResult, release, resident_gemm,
                    resolve_devices, split_gemm)

# --- measuring ------------------------------------------------------------------------------------

@dataclass
class ScalingReport:
    devices: list[int]
    M: int
    N: int
    K: int
    one_gpu_ms: float                # the whole problem on the first device, host time of the call
    split: SplitResult
    resident: ResidentResult | None = None
    one_gpu_kernel_ms: float = 0.0   # the same call's kernel, CUDA events

    @property
    def flops(self) -> float:
        return 2.0 * self.M * self.N * self.K

    def _tflops(self, ms: float) -> float:
        return self.flops / (ms * 1e-3) / 1e12 if ms else 0.0

    @property
    def one_gpu_tflops(self) -> float:
        return self._tflops(self.one_gpu_ms)

    @property
    def kernel_tflops(self) -> float:
        """All devices together, limited by the slowest one's kernels."""
        return self._tflops(self.split.slowest_kernel_ms)

    @property
    def end_to_end_tflops(self) -> float:
        return self._tflops(self.split.end_to_end_ms)

    @property
    def resident_tflops(self) -> float:
        return self._tflops(self.resident.end_to_end_ms) if self.resident else 0.0

    def scaling(self, tflops: float) -> float:
        """Throughput over N times one GPU's (1.0 is perfect)."""
        return tflops / (len(self.devices) * self.one_gpu_tflops) if self.one_gpu_tflops else 0.0

    @property
    def efficiency(self) -> float:
        """The slowest device's kernels against one GPU's kernel on the whole problem (events on
        both sides): what the split costs the kernels, copies and launches left out."""
        one = self._tflops(self.one_gpu_kernel_ms or self.one_gpu_ms)
        return self.kernel_tflops / (len(self.devices) * one) if one else 0.0


def scaling_record(report: ScalingReport, worst: float) -> dict:
    """A report as bench --devices and .ci/gpu_multigpu.py write it (JSON)."""
    split = report.split
    return {"devices": report.devices, "M": report.M, "N": report.N, "K": report.K, "axis": split.axis,
            "parts": [vars(p) for p in split.parts], "steps": list(split.steps.values()),
            "kernel_ms": list(split.kernel_ms.values()), "bytes_moved": split.bytes_moved,
            "one_gpu_ms": report.one_gpu_ms, "one_gpu_tflops": report.one_gpu_tflops,
            "one_gpu_kernel_ms": report.one_gpu_kernel_ms,
            "kernel_tflops": report.kernel_tflops, "efficiency": report.efficiency,
            "end_to_end_ms": split.end_to_end_ms, "end_to_end_tflops": report.end_to_end_tflops,
            "issue_ms": split.issue_ms, "span_ms": list(split.span_ms.values()),
            "end_to_end_scaling": report.scaling(report.end_to_end_tflops),
            "resident_ms": report.resident.end_to_end_ms if report.resident else None,
            "resident_kernel_ms": list(report.resident.kernel_ms) if report.resident else None,
            "resident_tflops": report.resident_tflops,
            "resident_scaling": report.scaling(report.resident_tflops),
            "worst_error_ratio": worst}


def parse_devices(text: str, available: int) -> list[int]:
    """'all' or '0,1,...' (repeats allowed: '0,0' splits into two parts on one GPU)."""
    return resolve_devices(text, available)


def _inputs(cp, M: int, N: int, K: int, layouts: dict, seed: int):
    """Random A and B in [-1, 1] and a NaN-poisoned C, each in its layout, on the current device."""
    rng = cp.random.default_rng(seed)
    place = {"row": cp.ascontiguousarray, "col": cp.asfortranarray}
    A = place[layouts["A"]](rng.uniform(-1, 1, (M, K), dtype=cp.float32))
    B = place[layouts["B"]](rng.uniform(-1, 1, (K, N), dtype=cp.float32))
    C = place[layouts["C"]](cp.full((M, N), cp.nan, dtype=cp.float32))
    return A, B, C


def worst_error_ratio(cp, A, B, C, math: str, beta: float = 0.0, C0=None) -> float:
    """max |C - (A B + beta C0)| over the tolerance of the kernel's math mode, against float64
    (NaN: inf)."""
    reference = A.astype(cp.float64) @ B.astype(cp.float64)
    scale = cp.abs(A).astype(cp.float64) @ cp.abs(B).astype(cp.float64)
    if beta:
        reference += beta * C0.astype(cp.float64)
        scale += abs(beta) * cp.abs(C0).astype(cp.float64)
    ratio = cp.abs(C.astype(cp.float64) - reference) / tolerance(scale, A.shape[1], math)
    return float(cp.nan_to_num(ratio, nan=cp.inf).max())


def _one_gpu(layer: CupyLayer, kernel: Launcher, device: int, a: Region, b: Region, c: Region) -> SplitResult:
    """The whole problem on one GPU as a caller runs it: one launch, then wait for C."""
    started = time.perf_counter()
    compute = layer.stream(device, "compute")
    start = layer.record(device, compute)
    layer.launch(kernel, a.rows, b.cols, a.cols, 1.0, a, b, 0.0, c, compute)
    end = layer.record(device, compute)
    layer.synchronize(device)
    result = SplitResult([Part(device, 0, 0, a.rows)], 0, {0: layer.elapsed_ms(start, end)})
    result.end_to_end_ms = (time.perf_counter() - started) * 1e3
    return result


def measure_scaling(kernels: Plan | Callable[[int], Launcher], M: int, N: int, K: int, devices: list[int], *,
                    runs: int = 3, compiled=None, axis: int | None = None, chunks: int = DEFAULT_CHUNKS,
                    local_views: bool = True, balance: Balance | None = None, math: str | None = None,
                    layer: CupyLayer | None = None) -> tuple[ScalingReport, float]:
    """One GPU on the whole problem against the split over `devices` (inputs starting on the
    first, in the kernel's layouts) and against shards already resident (bands of A's rows, B and
    the band's C on each device); the split and the shards are checked against float64 first.

    `kernels` is a Plan or a function giving each device's launcher (a library's LibraryRuntime
    per device); `math` the tolerance's math mode (default: the plan's, or the launcher's plan's).
    The three are timed alike and in turns, `runs` rounds after a warm-up round: host time of one
    call until its C is complete (for one GPU: the kernel on the whole problem, launched and waited
    for), so that each side pays its own launch costs, rests as long between calls, and a GPU's
    clocks favour neither. Medians. Returns the report and the worst error ratio (<= 1 passes)."""
    import cupy as cp

    layer = layer or CupyLayer(compiled)
    home = devices[0]
    kernel_on = (lambda device: layer.kernel(device, kernels)) if isinstance(kernels, Plan) else kernels
    kernel = kernel_on(home)
    plan = kernels if isinstance(kernels, Plan) else getattr(kernel, "plan", None)
    math = math or plan.math
    rows_granule = plan.BM if plan is not None else 128
    with cp.cuda.Device(home):
        A, B, C = _inputs(cp, M, N, K, kernel.layouts, M * 31 + N * 17 + K)
        regions = [layer.locate(x, kernel.layouts[n], n) for x, n in ((A, "A"), (B, "B"), (C, "C"))]
        layer.drain(home)  # made on the null stream, which the layer's streams do not wait for
        split = lambda: split_gemm(kernels, A, B, C, devices=devices, layer=layer, axis=axis,  # noqa: E731
                                   chunks=chunks, local_views=local_views, balance=balance)
        one_gpu = lambda: _one_gpu(layer, kernel, home, *regions)  # noqa: E731
        split()
        worst = worst_error_ratio(cp, A, B, C, math)
    shards, rows = [], make_parts(M, N, K, devices, 0, rows_granule)
    for part in rows:
        with cp.cuda.Device(part.device):
            shards.append(Shard(cp.array(A[part.start:part.stop], order="C" if kernel.layouts["A"] == "row" else "F"),
                                cp.array(B, order="C" if kernel.layouts["B"] == "row" else "F"),
                                cp.empty((part.size, N), cp.float32, order="C" if kernel.layouts["C"] == "row" else "F")))
    resident = lambda: resident_gemm(kernels, shards, layer=layer)  # noqa: E731
    first = resident()
    with cp.cuda.Device(home):
        C.fill(cp.nan)
        for part, band in zip(rows, first.bands):
            C[part.start:part.stop] = cp.asarray(band) if part.device == home else cp.array(band)
        worst = max(worst, worst_error_ratio(cp, A, B, C, math))
    one_gpu(), split()  # the warm-up round (the split's second call: with a balance, the first it learns from)
    rounds = [(one_gpu(), split(), resident()) for _ in range(runs)]
    median = lambda results: sorted(results, key=lambda r: r.end_to_end_ms)[len(results) // 2]  # noqa: E731
    ones, splits, residents = (median([r[i] for r in rounds]) for i in range(3))
    report = ScalingReport(devices, M, N, K, ones.end_to_end_ms, splits, residents,
                           one_gpu_kernel_ms=ones.slowest_kernel_ms)
    release(layer)  # the split's buffers (the inputs go with this function)
    return report, worst


def measure_batched_scaling(kernel_on: Callable[[int], Launcher], batch: int, M: int, N: int, K: int,
                            devices: list[int], *, runs: int = 3, math: str = "3xtf32",
                            chunks: int = DEFAULT_CHUNKS, layer: CupyLayer | None = None) -> dict:
    """A strided batch (A, B and C packed, in the launcher's layouts, on the first device) split by
    batch over `devices` end to end, its parts sized as gemmgen.matmul sizes them (batched.Shares:
    the record's `parts`) and even, beside one GPU's batched launch on the whole batch; all checked
    against float64, then timed alike and in turns (host time of a call until C is complete;
    medians of `runs` after 3 warm-up rounds). A record for multigpu.json."""
    import cupy as cp

    layer = layer or CupyLayer()
    home = devices[0]
    kernel = kernel_on(home)
    layouts = kernel.layouts
    with cp.cuda.Device(home):
        rng = cp.random.default_rng(batch * 7 + M + N + K)
        values = {"A": rng.uniform(-1, 1, (batch, M, K), dtype=cp.float32),
                  "B": rng.uniform(-1, 1, (batch, K, N), dtype=cp.float32)}
        values["C"] = cp.full((batch, M, N), cp.nan, dtype=cp.float32)
        stored = {name: x if layouts[name] == "row" else cp.ascontiguousarray(x.transpose(0, 2, 1))
                  for name, x in values.items()}
    regions = {name: Region(home, stored[name].data.ptr, *values[name].shape[1:], layouts[name],
                            values[name].shape[2] if layouts[name] == "row" else values[name].shape[1])
               for name in "ABC"}
    strides = tuple(values[name].shape[1] * values[name].shape[2] for name in "ABC")
    compute = layer.stream(home, "compute")

    def one_gpu() -> float:
        started = time.perf_counter()
        a, b, c = regions["A"], regions["B"], regions["C"]
        layer.launch(kernel, M, N, K, 1.0, a, b, 0.0, c, compute, batch=batch, strides=strides)
        layer.synchronize(home)
        return (time.perf_counter() - started) * 1e3

    shares = Shares()

    def split(sized: bool = True) -> float:
        return split_batched(kernel_on, regions["A"], regions["B"], regions["C"], batch=batch, strides=strides,
                             devices=devices, layer=layer, chunks=chunks,
                             shares=shares if sized else None).end_to_end_ms

    def worst() -> float:
        with cp.cuda.Device(home):
            C = stored["C"] if layouts["C"] == "row" else stored["C"].transpose(0, 2, 1)
            return max(worst_error_ratio(cp, values["A"][i], values["B"][i], C[i], math) for i in range(batch))

    for _ in range(3):  # warm-up: the key's second and third split calls size the later ones' parts
        one_gpu(), split()
    error = 0.0
    for run in (one_gpu, split, lambda: split(False)):
        with cp.cuda.Device(home):
            stored["C"].fill(cp.nan)
        layer.drain(home)  # the fill ran on the null stream, which our non-blocking streams do not wait for
        run()
        error = max(error, worst())
    rounds = [(one_gpu(), split(), split(False)) for _ in range(runs)]
    ones, splits, evens = (sorted(r[i] for r in rounds)[runs // 2] for i in range(3))
    flops = 2.0 * batch * M * N * K
    parts = split_batched(kernel_on, regions["A"], regions["B"], regions["C"], batch=batch, strides=strides,
                          devices=devices, layer=layer, chunks=chunks, shares=shares).parts
    release(layer)
    return {"devices": devices, "batch": batch, "M": M, "N": N, "K": K, "chunks": chunks,
            "one_gpu_ms": ones, "one_gpu_tflops": flops / ones / 1e9,
            "end_to_end_ms": splits, "end_to_end_tflops": flops / splits / 1e9,
            "end_to_end_scaling": ones / (len(devices) * splits), "parts": [stop - start for _, start, stop in parts],
            "even_end_to_end_ms": evens, "even_scaling": ones / (len(devices) * evens), "worst_error_ratio": error}
