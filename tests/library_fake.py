"""A CPU stand-in for the GPU side of library tuning: timings from a synthetic model of each
candidate (waves of blocks, K steps, operand traffic; TMA slower on unaligned rows, mma.sync slower
than wgmma), written to the database as the GPU worker would. Deterministic."""

from __future__ import annotations

import json
import zlib

import gemmgen.library.manifest as manifest_module
import gemmgen.library.model as library_model
import gemmgen.library.tune as library_tune
from gemmgen.gpu.runtime import DeviceInfo
from gemmgen.library.selection import features

INFO = DeviceInfo("Fake H100", 0, (9, 0), 132, 1980000, "13.0", 50 << 20, 2619000, 5120)
LAYOUTS = {"A": "row", "B": "col", "C": "row"}


def true_ms(plan, shape) -> float:
    """The fake GPU's time for a candidate at a shape."""
    m = library_model.member_shape(plan, 1)
    f = features(m, shape.M, shape.N, shape.K, INFO.sm_count)
    per_step = 0.0006 if plan.math == "3xtf32" else 0.0002
    if not plan.arch.has_wgmma:
        per_step *= 3
    if library_model.shape_class(shape, LAYOUTS) == "unaligned" and plan.tma:
        per_step *= 2.5  # the fallback
    noise = 1 + 0.03 * ((zlib.crc32(f"{library_model.kernel_key(plan)}{shape}".encode()) % 1000) / 500 - 1)
    return (0.004 + per_step * f[1] + 0.002 * f[2] + 0.2 * f[3] + 1.0 * f[4]) * noise


def cublas_ms(shape) -> float:
    return 2.0 * shape.M * shape.N * shape.K / 50e12 * 1e3 + 0.006


class FakeGpu:
    """Replaces library._run_tasks (and compiling, occupancy) for one test; counts what ran."""

    def __init__(self, fail: set[str] = frozenset()):
        self.tasks: list = []
        self.fail = fail  # kernel keys whose validation fails

    def run_tasks(self, tasks, db, library, budget_s, device, device_key, progress):
        name, driver = device_key.split("|")
        scope = lambda what: f"{name}|{driver}|{what}|{library.name}"  # noqa: E731
        with open(db, "a") as handle:
            handle.write(json.dumps({"scope": scope("device"), "key": "device", "sm_count": INFO.sm_count,
                                     "compute_capability": [9, 0]}) + "\n")
            for task in tasks:
                self.tasks.append(task)
                if task.kind == "validate":
                    key = library_model.kernel_key(task.plan)
                    entry = {"scope": scope("validation"), "key": key,
                             "status": "invalid" if key in self.fail else "ok"}
                elif task.kind == "cublas":
                    entry = {"scope": scope(library_model.shape_key(task.shape)), "key": "cublas",
                             "status": "ok", "ms": cublas_ms(task.shape)}
                else:
                    entry = {"scope": scope(library_model.shape_key(task.shape)),
                             "key": library_model.kernel_key(task.plan), "status": "ok",
                             "ms": true_ms(task.plan, task.shape)}
                handle.write(json.dumps(entry) + "\n")
                if progress:
                    progress(entry)

    def install(self, monkeypatch) -> "FakeGpu":
        import gemmgen.gpu.runtime
        monkeypatch.setattr(library_tune, "_run_tasks", self.run_tasks)
        monkeypatch.setattr(library_tune, "compile_all", lambda plans: None)
        for module in (library_tune, manifest_module):  # where tuning and the manifest look it up
            monkeypatch.setattr(module, "slots_per_sm", lambda plan: 1)
        monkeypatch.setattr(gemmgen.gpu.runtime, "device_info", lambda ordinal=0: INFO)
        return self


def crashing_worker(tasks, db, library, layouts, baseline, state, budget_s, device):
    """A stand-in for library._worker in its child process: records fake results in order and
    dies (as a faulting kernel kills its process) at the first timing of a split-K candidate."""
    import os
    from pathlib import Path
    scope = lambda what: f"{INFO.name}|{INFO.driver_version}|{what}|{library}"  # noqa: E731
    for task in tasks:
        Path(state).write_text(task.label)
        if task.kind == "time" and task.plan.split_k > 1:
            os._exit(3)
        if task.kind == "validate":
            entry = {"scope": scope("validation"), "key": library_model.kernel_key(task.plan), "status": "ok"}
        else:
            entry = {"scope": scope(library_model.shape_key(task.shape)),
                     "key": "cublas" if task.kind == "cublas" else library_model.kernel_key(task.plan),
                     "status": "ok", "ms": 1.0}
        with open(db, "a") as handle:
            handle.write(json.dumps(entry) + "\n")
    Path(state).write_text("")
