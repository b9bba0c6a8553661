"""A measurer (gemmgen.tuning.measure.GpuMeasurer's stand-in) that needs no GPU: deterministic
timings, and candidates that fail.

`compile` runs inline and returns a token (not a string: that would be a compile error); `describe`
answers as a GPU would; `measure` runs, as the real one does, in the GPU child process of a Dask
worker (or of this host's runner): for a candidate it appends the point's key to a log file (so
that a test counts measurements), then returns a timing derived from the key; the baseline gets
CUBLAS_TFLOPS. A point listed in `kill_worker` kills its Dask worker process (the child's parent)
mid-candidate, as a host dying would; one listed in `fault` kills the child, as a kernel faulting
on the GPU may do; one listed in `raise_in` raises, as a CUDA error does.
"""

from __future__ import annotations

import hashlib
import os
import signal

from gemmgen.plan.space import point_key
from gemmgen.tuning.jobs import BASELINE, Device

CUBLAS_TFLOPS = 10.0
DEVICE = Device("Fake GPU", "13.0", 132, (9, 0))


def tflops_of(key: str) -> float:
    return 1.0 + int(hashlib.sha256(key.encode()).hexdigest()[:6], 16) % 1000 / 100


class FakeMeasurer:
    def __init__(self, log: str, kill_worker=(), fault=(), raise_in=()):
        self.log, self.kill_worker, self.fault, self.raise_in = log, set(kill_worker), set(fault), set(raise_in)

    def compile(self, plan, source):
        return ("cubin", point_key(plan.spec))  # anything but a string, which would be a compile error

    def describe(self):
        return DEVICE

    def measure(self, job, compiled):
        shape = job.shape
        if job.kind == BASELINE:
            return {"status": "ok", "ms": 2.0 * shape.M * shape.N * shape.K / (CUBLAS_TFLOPS * 1e9),
                    "tflops": CUBLAS_TFLOPS}
        key = point_key(job.plan.spec)
        assert compiled == ("cubin", key), "the compiled candidate travels with it"
        with open(self.log, "a") as handle:
            handle.write(f"{key}\t{os.environ.get('CUDA_VISIBLE_DEVICES')}\n")
        if key in self.kill_worker:
            os.kill(os.getppid(), signal.SIGKILL)
            os._exit(0)
        if key in self.fault:
            os._exit(3)
        if key in self.raise_in:
            raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)")
        tflops = tflops_of(key)
        return {"status": "ok", "ms": 2.0 * shape.M * shape.N * shape.K / (tflops * 1e9), "tflops": tflops}
