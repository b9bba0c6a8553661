"""Nsight Compute on one launch of a kernel: the counters the seed worklogs read, in one table.

    report = profile("specs/warptile.gemm", shape="4096x4096x4096")
    report["metrics"]["fp32_pipe"]        # % of the FMA pipe's peak, the roof of an SGEMM
    report["stalls"]                      # warp stall reasons, largest first

A small driver script builds the kernel and launches it twice (a warm-up, then the measured
launch); `ncu` runs it and profiles the second launch of the kernel only, at the GPU's own clocks
(--clock-control none), and prints the raw page as CSV, which is parsed here. The CLI verb
(`gemmgen profile SPEC`) is gemmgen.cli.profile, which shows the report as a table.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..language.load import load_one
from ..plan import make_plan
from . import runtime
from .verify import parse_case

DEFAULT_SHAPE = "4096x4096x4096"


class ProfileError(RuntimeError):
    """ncu is missing, failed (e.g. no permission to read the GPU's counters) or profiled nothing."""


@dataclass(frozen=True)
class Metric:
    key: str        # name in the report
    name: str       # ncu's metric
    label: str
    meaning: str
    kind: str       # "pct", "count", "time" or "number": how to show it


METRICS = (
    Metric("fp32_pipe", "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
           "FP32 (FMA) pipe utilisation",
           "cycles the FMA pipe issued, % of its peak while SMs were active: the SGEMM roof", "pct"),
    Metric("tensor_pipe", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
           "tensor pipe utilisation",
           "cycles the tensor pipe ran HMMA/HGMMA, % of its peak while SMs were active: the roof of "
           "math tf32 and 3xtf32 kernels (0 for simt ones)", "pct"),
    Metric("sm_throughput", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM throughput",
           "busiest SM unit, % of its peak over the whole launch", "pct"),
    Metric("occupancy", "sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occupancy",
           "resident warps, % of the most an SM holds", "pct"),
    Metric("registers", "launch__registers_per_thread", "registers per thread",
           "from the launch: an SM's 65536 registers hold 65536 / this threads", "number"),
    Metric("smem_load_conflicts", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
           "shared load bank conflicts", "extra shared-memory wavefronts that loads needed", "count"),
    Metric("smem_store_conflicts", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
           "shared store bank conflicts", "extra shared-memory wavefronts that stores needed", "count"),
    Metric("smem_load_wavefronts", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
           "shared load wavefronts", "passes of shared-memory loads through the pipe", "count"),
    Metric("smem_store_wavefronts", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
           "shared store wavefronts", "passes of shared-memory stores through the pipe", "count"),
    Metric("global_load_efficiency", "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct",
           "global load efficiency",
           "bytes used of each 32-byte sector loaded, %: 100 when warps read whole sectors", "pct"),
    Metric("dram_throughput", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput",
           "% of the peak DRAM bandwidth over the launch", "pct"),
    Metric("duration_us", "gpu__time_duration.sum", "duration",
           "the one profiled launch, at the GPU's own clocks", "time"),
)

STALL_REASONS = {
    "long_scoreboard": "waiting for global or local memory (L1TEX) data",
    "short_scoreboard": "waiting for shared memory (MIO) data",
    "mio_throttle": "shared-memory instruction queue full",
    "barrier": "waiting at __syncthreads()",
    "math_pipe_throttle": "math pipe busy (where an SGEMM should be)",
    "wait": "fixed-latency dependency",
    "not_selected": "ready, another warp issued",
    "lg_throttle": "global-memory instruction queue full",
    "dispatch_stall": "dispatcher stalled",
    "no_instruction": "instruction cache miss or branch",
}


def stall_metric(reason: str) -> str:
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


def metric_names() -> list[str]:
    return [m.name for m in METRICS] + [stall_metric(r) for r in STALL_REASONS]


# --- ncu's CSV ------------------------------------------------------------------------------

_TIME_UNITS_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3,
                  "ms": 1e3, "second": 1e6, "s": 1e6}


def _number(text: str) -> float | int | str | None:
    """A CSV cell as a number ('1,234,567' has thousands separators); None for n/a or empty."""
    text = text.strip()
    if text in ("", "n/a", "N/A", "nan"):
        return None
    plain = text.replace(",", "")
    try:
        return int(plain)
    except ValueError:
        pass
    try:
        return float(plain)
    except ValueError:
        return text


def parse_ncu_csv(text: str) -> list[dict[str, Any]]:
    """The kernels of `ncu --csv --page raw` output, one dict each.

    The output has a header row (launch attributes, then one column per metric), a row of units,
    then one row per profiled launch; ncu's own '==PROF==' lines and the program's output may
    surround it. Each dict holds the launch attributes ("Kernel Name", "Block Size", ...) under
    "attributes" and {metric: (value, unit)} under "metrics".
    """
    lines = [line for line in text.splitlines() if line.startswith('"')]
    rows = list(csv.reader(lines))
    start = next((i for i, row in enumerate(rows) if row and row[0] == "ID" and "Kernel Name" in row),
                 None)
    if start is None:
        return []
    header = rows[start]
    units = [""] * len(header)
    body = rows[start + 1:]
    if body and not body[0][0].strip():  # the units row: no ID
        units = body[0] + [""] * (len(header) - len(body[0]))
        body = body[1:]
    kernels = []
    for row in body:
        if not row or row == header or len(row) < len(header):
            continue
        attributes, metrics = {}, {}
        for name, unit, cell in zip(header, units, row):
            if "__" in name:  # metric names look like unit__counter.rollup
                metrics[name] = (_number(cell), unit)
            else:
                attributes[name] = cell
        kernels.append({"attributes": attributes, "metrics": metrics})
    return kernels


def summarise(kernel: dict[str, Any], *, name: str, shape: str, M: int, N: int, K: int,
              unavailable: list[str] | None = None) -> dict[str, Any]:
    """The report of one parsed kernel: named metrics, stall reasons largest first, derived rates."""
    raw = kernel["metrics"]
    metrics: dict[str, Any] = {}
    for metric in METRICS:
        value, unit = raw.get(metric.name, (None, ""))
        if metric.kind == "time" and isinstance(value, (int, float)):
            value = value * _TIME_UNITS_US.get(unit, 1e-3)  # ncu's base unit is nanoseconds
        metrics[metric.key] = value
    stalls = {}
    for reason in STALL_REASONS:
        value, _ = raw.get(stall_metric(reason), (None, ""))
        if isinstance(value, (int, float)):
            stalls[reason] = value
    stalls = dict(sorted(stalls.items(), key=lambda item: -item[1]))

    derived: dict[str, Any] = {}
    duration = metrics.get("duration_us")
    if isinstance(duration, (int, float)) and duration > 0:
        derived["tflops"] = 2.0 * M * N * K / (duration * 1e-6) / 1e12
    for op in ("load", "store"):
        conflicts = metrics.get(f"smem_{op}_conflicts")
        wavefronts = metrics.get(f"smem_{op}_wavefronts")
        if isinstance(conflicts, (int, float)) and isinstance(wavefronts, (int, float)) and wavefronts:
            derived[f"smem_{op}_conflict_pct"] = 100.0 * conflicts / wavefronts
    attributes = kernel["attributes"]
    return {
        "kernel": name, "shape": shape, "M": M, "N": N, "K": K,
        "function": attributes.get("Kernel Name", ""),
        "block": attributes.get("Block Size", ""), "grid": attributes.get("Grid Size", ""),
        "device": attributes.get("Device", ""), "compute_capability": attributes.get("CC", ""),
        "metrics": metrics, "stalls": stalls, "derived": derived,
        "raw": {metric: {"value": value, "unit": unit} for metric, (value, unit) in raw.items()},
        "unavailable": list(unavailable or []),
    }


# --- running ncu --------------------------------------------------------------------------------

_DRIVER = r'''
"""Launch one gemmgen kernel twice (warm-up, then the launch ncu profiles). Output to stderr only."""
import sys

sys.path.insert(0, sys.argv[1])
import cupy as cp

from gemmgen.gpu.epilogue_inputs import epilogue_vectors, vector_pointers
from gemmgen.gpu.runtime import Kernel, synchronize
from gemmgen.gpu.verify import place_matrix, parse_case
from gemmgen.language.load import load_one
from gemmgen.plan import make_plan

spec = load_one(sys.argv[2], sys.argv[3])
case = parse_case(sys.argv[4])
plan = make_plan(spec)
kernel = Kernel(plan)
layout = {x: spec["layout." + x] for x in "ABC"}
shapes = {"A": (case.M, case.K), "B": (case.K, case.N), "C": (case.M, case.N)}
generator = cp.random.default_rng(0)
placed = {x: place_matrix(cp, generator.uniform(-1, 1, shapes[x], dtype=cp.float32), layout[x],
                    case.pad, case.offset) for x in "ABC"}
pointer = {x: placed[x][0].data.ptr + 4 * case.offset for x in "ABC"}
smallest = None
if plan.reduce_count:
    smallest = tuple(cp.zeros(plan.reduce_count, t).data.ptr for t in (cp.float32, cp.int32, cp.int32))
vectors = epilogue_vectors(cp, plan, case.M, case.N)  # a fused epilogue's bias and scale
for _ in range(2):
    kernel.launch(case.M, case.N, case.K, case.alpha, pointer["A"], placed["A"][1], pointer["B"],
                  placed["B"][1], case.beta, pointer["C"], placed["C"][1], smallest=smallest,
                  **vector_pointers(vectors))
synchronize()
print(f"launched {kernel.name} twice at {case}", file=sys.stderr)
'''


def _messages(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines() if line.startswith(("==ERROR==", "==WARNING=="))]


def _unknown_metrics(output: str, requested: list[str]) -> list[str]:
    """Metrics that ncu's error lines name (one this GPU or ncu version does not have)."""
    errors = [line for line in output.splitlines() if line.startswith("==ERROR==")]
    return [name for name in requested if any(name in line for line in errors)]


def _failure(output: str, returncode: int) -> str:
    messages = _messages(output)
    detail = "\n".join(messages) if messages else "\n".join(output.strip().splitlines()[-25:])
    hint = ""
    if any("ERR_NVGPUCTRPERM" in m for m in messages):
        hint = ("\nncu may not read the GPU's performance counters as this user: run as root, or "
                "allow it (NVreg_RestrictProfilingToAdminUsers=0)")
    else:
        try:
            if runtime.device_count() == 0:
                hint = "\nno CUDA GPU found: profiling runs a kernel and needs one"
        except Exception:  # noqa: BLE001 - only a hint
            pass
    return f"ncu failed (exit status {returncode}):\n{detail}{hint}"


def profile(spec_path: str | os.PathLike, kernel: str | None = None, shape: str = DEFAULT_SHAPE, *,
            timeout: float = 900.0) -> dict[str, Any]:
    """Profile one launch of a spec's kernel at `shape` with Nsight Compute; the report as a dict.

    `shape` is MxNxK with optional ,alpha=,beta=,pad=,offset= (as `gemmgen check --shapes`).
    Raises SpecError for a bad spec and ProfileError when ncu is missing, fails or profiles
    nothing; metrics that this ncu or GPU does not know are left out and listed in
    report["unavailable"].
    """
    ncu = shutil.which("ncu")
    if ncu is None:
        raise ProfileError("Nsight Compute's `ncu` is not on PATH (it comes with the CUDA toolkit, "
                           "in nsight-compute/ or bin/)")
    spec = load_one(spec_path, kernel)
    plan = make_plan(spec)
    try:
        case = parse_case(shape)
    except ValueError as exc:
        raise ProfileError(str(exc)) from None
    if not (case.M and case.N):
        raise ProfileError(f"{case} has an empty C: there is no kernel launch to profile")

    root = Path(__file__).resolve().parents[2]
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), environment.get("PYTHONPATH")]))
    requested = metric_names()
    unavailable: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gemmgen-profile-") as folder:
        driver = Path(folder) / "launch_once.py"
        driver.write_text(_DRIVER)
        for _attempt in range(3):
            command = [ncu, "--clock-control", "none", "--csv", "--page", "raw",
                       "--print-units", "base",
                       # the main kernel only (a fused reduction adds gemmgen_<name>_reduce_* launches)
                       "--kernel-name", f"regex:{plan.kernel_name}",
                       "--launch-skip", "1", "--launch-count", "1",
                       "--metrics", ",".join(requested),
                       sys.executable, str(driver), str(root), str(spec_path), spec.name, str(case)]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                      env=environment)
            except subprocess.TimeoutExpired:
                raise ProfileError(f"ncu ran past {timeout:.0f} s profiling {plan.name} at {case}") from None
            output = f"{done.stdout}\n{done.stderr}"
            kernels = parse_ncu_csv(done.stdout)
            unknown = _unknown_metrics(output, requested)
            if not kernels and unknown and len(unknown) < len(requested):
                unavailable += unknown
                requested = [name for name in requested if name not in unknown]
                continue
            break
    if done.returncode != 0 or not kernels:
        if done.returncode == 0 and not kernels:
            raise ProfileError(f"ncu profiled no launch of {plan.kernel_name} at {case}:\n"
                               + ("\n".join(_messages(output)) or output.strip()[-2000:]))
        raise ProfileError(_failure(output, done.returncode))
    return summarise(kernels[-1], name=plan.name, shape=str(case), M=case.M, N=case.N, K=case.K,
                     unavailable=unavailable)
