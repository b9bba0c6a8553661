"""A library tuned on a real GPU by the tuning's one runner and measurer: every candidate validated
once, cuBLAS and the candidates timed at each shape (a padded one and a strided batch too), a shape
whose operands the GPU cannot hold refused before anything is allocated and timed no further, a
manifest built from the records, and a second run that measures nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gemmgen.library.resolve import load_libraries

pytestmark = pytest.mark.gpu
SPECS = Path(__file__).resolve().parent.parent / "specs"

LIBRARY = """
library tiny {
  layout    A row, B row, C row
  members   warptile, hopper_simt
  shapes    256x256x256, 512x256x128 pad 1, 128x128x128 batch 4, 8192x8192x8192 batch 100000
  precision fp32
}
"""


def test_a_small_library_tunes_on_the_gpu_and_resumes_measuring_nothing(tmp_path):
    from gemmgen.library.manifest import build_manifest
    from gemmgen.library.model import Measurements, kernel_key, read_db
    from gemmgen.library.tune import tune_library

    for member in ("warptile", "hopper_simt"):  # two shipped SIMT kernels, beside the library
        shutil.copy(SPECS / f"{member}.gemm", tmp_path)
    path = tmp_path / "tiny.gemm"
    path.write_text(LIBRARY)
    (library,) = load_libraries(path)
    db = tmp_path / "tiny.jsonl"
    seen = []
    report = tune_library(library, db=db, progress=seen.append, budget_s=0.02)
    assert report.gpus == 1 and report.evaluated > 0 and not report.failures, report.failures
    ((shape, reason),) = report.skipped.items()  # refused before allocating, timed no further
    assert str(shape) == "8192x8192x8192 batch 100000" and "MemoryError" in reason and "GB free" in reason
    (records,) = read_db(db, "tiny").values()
    assert not any(label.startswith("8192x8192x8192*100000|") for label in records)
    m = Measurements.of(records)
    keys = [kernel_key(plan) for plan in library.candidates()]
    assert all(m.valid(key) for key in keys)
    assert set(m.cublas) == {"256x256x256", "512x256x128+1", "128x128x128*4"}
    assert all(ms > 0 for ms in m.cublas.values())
    assert {(key, shape) for key in keys for shape in m.cublas} <= set(m.times)  # two candidates: all timed
    assert all(ms > 0 for ms in m.times.values())
    # each record reported (less the device's), and cuBLAS's failure at the shape too large, which is not recorded
    assert len(seen) == len(db.read_text().splitlines()) - 1 + 1
    manifest = build_manifest(library, db)
    assert manifest.members and {member.key for member in manifest.members} <= set(keys)
    lines = db.read_text()
    # cuBLAS's failed timing is not recorded (the next run tries it again), and nothing else is measured again
    assert tune_library(library, db=db, budget_s=0.02).evaluated == 1 and db.read_text() == lines
