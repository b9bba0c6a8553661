"""A CPU stand-in for the GPU side of library tuning: a measurer (gemmgen.tuning.measure.GpuMeasurer's
stand-in, run by the tuning's runner in its GPU process, or a Dask worker's) whose timings come from a
synthetic model of each candidate (waves of blocks, K steps, operand traffic; TMA slower on unaligned
rows and on split ones, clusters hardly; mma.sync slower than wgmma). Deterministic. Each job it
measures is logged to a file, so that a
test sees what ran."""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from types import SimpleNamespace

import gemmgen.library.manifest as manifest_module
import gemmgen.library.model as library_model
import gemmgen.library.tune as library_tune
import gemmgen.tuning.measure
from gemmgen.gpu.runtime import DeviceInfo
from gemmgen.library.selection import features
from gemmgen.tuning.jobs import BASELINE, VALIDATE, Device

INFO = DeviceInfo("Fake H100", 0, (9, 0), 132, 1980000, "13.0", 50 << 20, 2619000, 5120)
DEVICE = Device(INFO.name, INFO.driver_version, INFO.sm_count, INFO.compute_capability)
LAYOUTS = {"A": "row", "B": "col", "C": "row"}


def true_ms(plan, shape) -> float:
    """The fake GPU's time for a candidate at a shape (M, N, K, pad, batch)."""
    m = library_model.member_shape(plan, 1)
    batch = getattr(shape, "batch", 1)
    f = features(m, shape.M, shape.N, shape.K, INFO.sm_count, batch)
    per_step = 0.0006 if plan.math == "3xtf32" else 0.0002
    if not plan.arch.has_wgmma:
        per_step *= 3
    klass = library_model.shape_class(shape, LAYOUTS)
    if klass == "unaligned" and plan.tma:
        per_step *= 2.5  # the fallback
    if klass == "split" and plan.tma:
        per_step *= 1.05 if plan.cluster_m * plan.cluster_n > 1 else 1.5  # five sectors a row, not four
    where = f"{shape.M}x{shape.N}x{shape.K}" + (f" pad {shape.pad}" if shape.pad else "")
    where += f" batch {batch}" if batch != 1 else ""
    noise = 1 + 0.03 * ((zlib.crc32(f"{library_model.kernel_key(plan)}{where}".encode()) % 1000) / 500 - 1)
    return (0.004 + per_step * f[1] + 0.002 * f[2] + 0.2 * f[3] + 1.0 * f[4]) * noise


def cublas_ms(shape) -> float:
    return 2.0 * shape.M * shape.N * shape.K / 50e12 * 1e3 + 0.006


class LibraryMeasurer:
    """Measures a library's jobs on no GPU; logs each (kind, key, shape) to `log`. Keys in `fail`
    fail validation; the first timing of a split-K candidate kills the process when `crash_split`."""

    def __init__(self, log: str, fail=frozenset(), crash_split: bool = False):
        self.log, self.fail, self.crash_split = log, set(fail), crash_split

    def compile(self, plan, source):
        return ("cubin", library_model.kernel_key(plan))

    def describe(self):
        return DEVICE

    def measure(self, job, compiled):
        with open(self.log, "a") as handle:
            handle.write(f"{job.kind}\t{job.key}\t{job.what}\t{os.environ.get('CUDA_VISIBLE_DEVICES')}\t"
                         f"{os.getppid()}\n")
        if job.kind == BASELINE:
            return {"status": "ok", "ms": cublas_ms(job.shape)}
        assert compiled == ("cubin", job.key), "the compiled candidate travels with it"
        if job.kind == VALIDATE:
            return {"status": "invalid", "reason": "wrong"} if job.key in self.fail else {"status": "ok"}
        if self.crash_split and job.plan.split_k > 1:
            os._exit(3)
        return {"status": "ok", "ms": true_ms(job.plan, job.shape)}


class FakeGpu:
    """The library's GPU faked for one test: its measurer in place of the GPU's, compiling and
    occupancy (in this process) skipped; `tasks` is what was measured, in order."""

    def __init__(self, log: Path, fail: set[str] = frozenset()):
        self.log = Path(log)
        self.measurer = LibraryMeasurer(str(self.log), fail)

    @property
    def tasks(self) -> list[SimpleNamespace]:
        """Each job measured: .kind, .key, .what (the shape's key, or validation), .device (the
        GPU process's CUDA_VISIBLE_DEVICES) and .worker (the process id of its parent: this one, or
        a Dask worker's)."""
        if not self.log.exists():
            return []
        return [SimpleNamespace(kind=kind, key=key, what=what, device=device, worker=int(worker))
                for kind, key, what, device, worker in (line.split("\t")
                                                        for line in self.log.read_text().splitlines())]

    def install(self, monkeypatch) -> "FakeGpu":
        monkeypatch.setattr(gemmgen.tuning.measure, "default_measurer", lambda: self.measurer)
        monkeypatch.setattr(library_tune, "compile_all", lambda plans: None)
        for module in (library_tune, manifest_module):  # where tuning and the manifest look it up
            monkeypatch.setattr(module, "slots_per_sm", lambda plan: 1)
        return self
