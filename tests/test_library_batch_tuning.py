"""A library tuned at strided batches (`MxNxK batch B` among its shapes, issue 29's "tuned per (batch,
M, N, K)"): the shapes' syntax and its errors, the measurer timing the batched entry point (and cuBLAS's
strided-batched GEMM) on dense batches, and the choice that follows what was measured there, in
Python and in the library's .cu alike, on a faked GPU whose batches run slower on one kind of member
than a model fitted to single GEMMs foresees."""

from __future__ import annotations

import numpy as np
import pytest

import library_fake
from gemmgen.language.errors import SpecError
from gemmgen.language.load import load_file
from gemmgen.language.shapes import LibraryShape, parse_shapes
from gemmgen.library.emit import library_source
from gemmgen.library.manifest import Manifest, build_manifest
from gemmgen.library.resolve import load_libraries
from gemmgen.library.selection import choose
from gemmgen.library.tune import tune_library
from library_fake import FakeGpu
from test_library import choices_in_c

LIBRARY = """
kernel wide {
  target   sm_90a
  layout   A row, B col, C row
  block    128 x 128 x 32
  math     3xtf32
  stages   4 tma
}

kernel narrow extends wide {
  block    64 x 64 x 32
}

kernel portable {
  target   sm_80
  layout   A row, B col, C row
  block    128 x 64 x 32
  warp     32 x 32
  math     3xtf32
  mma      16 x 8 x 8
  stages   3 async
}

library batches {
  layout   A row, B col, C row
  members  wide, narrow, portable
  shapes   256x256x256, 512x512x512, 1024x1024x1024, 2048x2048x2048, 4096x4096x4096, 64x4096x4096, 4096x64x4096, 1024x1024x128, 300x300x3000, 2048x512x1024, 256x256x256 batch 64, 512x512x512 batch 16
}
"""


def test_a_batched_shape_is_written_mxnxk_batch_b_in_the_spec_and_in_a_shapes_file():
    shapes = parse_shapes("512x512x512 batch 64\n127x4099x1023 batch 3 pad 1  # both\n4096x4096x4096\n", "s.txt")
    assert [(s.M, s.N, s.K, s.batch, s.pad) for s in shapes] == [(512, 512, 512, 64, 0), (127, 4099, 1023, 3, 1),
                                                                  (4096, 4096, 4096, 1, 0)]
    assert [str(s) for s in shapes] == ["512x512x512 batch 64", "127x4099x1023 batch 3 pad 1", "4096x4096x4096"]
    assert LibraryShape(8, 8, 8, batch=2) != LibraryShape(8, 8, 8)  # a batch is a shape of its own


@pytest.mark.parametrize("line, message", [
    ("512x512x512 batch 0", "shape '512x512x512 batch 0': batch is 0: a shape's sizes are at least 1"),
    ("512x512x512 batch 99999999999", "batch is larger than 2147483647"),
    ("512x512x512 pad 1 batch 2", "not a shape: '512x512x512 pad 1 batch 2'"),
    ("512x512x512 batch", "not a shape"),
])
def test_a_bad_batch_in_a_shapes_file_is_an_error_at_its_line(line, message):
    with pytest.raises(SpecError) as error:
        parse_shapes(f"# shapes\n4096x4096x4096\n{line}\n", "shapes.txt")
    assert error.value.span.line == 3 and message in str(error.value)
    assert "MxNxK [batch B] [pad P]" in str(error.value) or "batch B from 1" in str(error.value)


def test_a_bad_batch_in_a_spec_points_at_its_shape(tmp_path):
    path = tmp_path / "lib.gemm"
    path.write_text(LIBRARY.replace("512x512x512 batch 16", "512x512x512 batch 0"))
    with pytest.raises(SpecError) as error:
        load_file(str(path))
    line = LIBRARY.split("\n").index(next(l for l in LIBRARY.split("\n") if "batch 16" in l))
    column = LIBRARY.split("\n")[line].index("512x512x512 batch 16") + 1
    assert (error.value.span.line, error.value.span.column) == (line + 1, column)
    assert "batch is 0" in str(error.value)


class SlowBatchesOfWideTiles(library_fake.LibraryMeasurer):
    """The fake GPU, but a strided batch on a 128 x 128 member runs 4 times as long as the model of its
    single GEMMs says: only measuring the batch finds that the 64 x 64 member is faster there."""

    def measure(self, job, compiled):
        result = super().measure(job, compiled)
        if job.kind == "time" and job.shape.batch != 1 and job.plan.BM == 128:
            result["ms"] *= 4.0
        return result


@pytest.fixture
def tuned(monkeypatch, tmp_path):
    gpu = FakeGpu(tmp_path / "measured.log").install(monkeypatch)
    gpu.measurer = SlowBatchesOfWideTiles(str(gpu.log))
    monkeypatch.setattr("gemmgen.tuning.measure.default_measurer", lambda: gpu.measurer)
    path = tmp_path / "batches.gemm"
    path.write_text(LIBRARY)
    (library,) = load_libraries(path)
    db = tmp_path / "batches.jsonl"
    tune_library(library, db=db)
    return library, db, gpu, build_manifest(library, db)


def test_tuning_times_the_batched_shapes_and_cublas_there(tuned):
    library, db, gpu, _ = tuned
    timed = {t.what for t in gpu.tasks if t.kind == "time"}
    baselines = {t.what for t in gpu.tasks if t.kind == "baseline"}
    assert {"256x256x256*64", "512x512x512*16"} <= timed and {"256x256x256*64", "512x512x512*16"} <= baselines
    assert "256x256x256" in timed  # the single GEMM of the same matrices is a shape of its own


def test_the_manifest_chooses_at_a_tuned_batch_what_was_fastest_there(tuned):
    library, db, gpu, manifest = tuned
    names = [m.member for m in manifest.members]
    rows = {(r.M, r.N, r.K, r.batch): r for r in manifest.shapes}
    for key in ((256, 256, 256, 64), (512, 512, 512, 16)):
        row = rows[key]
        assert row.chosen_ms == min(row.ms.values()) and names[row.chosen] == "narrow", (key, row)
    candidates = manifest.candidates()
    # the single GEMM of the same matrices still runs the member fastest for it
    assert names[choose(candidates, 256, 256, 256, "aligned", 132)] == "wide"
    # near a tuned batch (a batch count, or matrices, close to it) the measurements there correct the model
    assert names[choose(candidates, 256, 256, 256, "aligned", 132, batch=48)] == "narrow"
    assert names[choose(candidates, 512, 512, 512, "aligned", 132, batch=20)] == "narrow"
    again = Manifest.from_json(manifest.to_json())  # the batch survives the manifest file
    assert {(r.M, r.batch) for r in again.shapes} == {(r.M, r.batch) for r in manifest.shapes}
    assert [choose(again.candidates(), 256, 256, 256, "aligned", 132, batch=b) for b in (1, 48, 64)] == \
           [choose(candidates, 256, 256, 256, "aligned", 132, batch=b) for b in (1, 48, 64)]


def test_the_cu_chooses_for_batches_as_python_does(tuned, tmp_path):
    library, db, gpu, manifest = tuned
    source = library_source(manifest, "batches.gemm", [])
    rng = np.random.default_rng(3)
    cases = [(256, 256, 256, True, False, b) for b in (1, 2, 16, 48, 64, 100)]
    cases += [(512, 512, 512, True, False, b) for b in (1, 8, 16, 20, 256)]
    cases += [(int(2 ** rng.uniform(4, 12)), int(2 ** rng.uniform(4, 12)), int(2 ** rng.uniform(4, 13)), True,
               False, int(2 ** rng.uniform(0, 8))) for _ in range(300)]
    candidates = manifest.candidates()
    python = [choose(candidates, M, N, K, "aligned" if a else "unaligned", 132, beta_used=b, batch=batch)
              for M, N, K, a, b, batch in cases]
    assert choices_in_c(source, "batches", cases, tmp_path) == python
    names = [m.member for m in manifest.members]
    assert names[python[4]] == "narrow" and names[python[0]] == "wide"


def test_the_measurer_times_a_batch_through_the_batched_entry_point_and_cublas(monkeypatch):
    """gemmgen.tuning.measure on a faked device: a batched shape's buffers hold `batch` dense matrices,
    and cuBLAS (strided-batched) and the candidate (its batched entry point) each compute every one."""
    import fake_device
    import gemmgen.tuning.measure as measure
    from gemmgen.library.tune import Jobs
    fake_device.install(monkeypatch)
    monkeypatch.setattr(measure, "_state", None)
    (library,) = load_libraries(library_fake.__file__.replace("library_fake.py", "../specs/fp32.gemm"))
    plan = library.candidates()[0]
    shape = LibraryShape(24, 40, 16, batch=3)
    jobs = Jobs(library)
    assert jobs.time(plan, shape).what == "24x40x16*3"
    for job in (jobs.cublas(shape), jobs.time(plan, shape)):
        state = measure._here()
        if state.buffers:
            state.buffers["C"][:] = 0
        result = measure.measure(job, None)
        assert result["status"] == "ok" and result["tflops"] > 0
        buffers = measure._here().buffers
        A = buffers["A"][:3 * 24 * 16].reshape(3, 24, 16).astype(np.float64)       # row-major, dense
        B = buffers["B"][:3 * 40 * 16].reshape(3, 40, 16).astype(np.float64)       # column-major: K x N
        C = buffers["C"][:3 * 24 * 40].reshape(3, 24, 40)
        np.testing.assert_allclose(C, A @ B.transpose(0, 2, 1), rtol=1e-2, atol=1e-2)


class NoRoomForHugeBatches(library_fake.LibraryMeasurer):
    """The fake GPU, whose memory cannot hold a batch of 100000: every job there fails, as the measurer's
    check of its room makes it fail before allocating."""

    def measure(self, job, compiled):
        if getattr(job.shape, "batch", 1) == 100000:
            with open(self.log, "a") as handle:
                handle.write(f"{job.kind}\t{job.key}\t{job.what}\t-\t0\n")
            return {"status": "crash", "reason": "MemoryError: shape 4096x4096x4096 batch 100000: its operands "
                                                 "need 20132.7 GB, and this GPU has 80.0 GB free"}
        return super().measure(job, compiled)


def test_a_batch_the_gpu_cannot_hold_is_skipped_and_costs_no_candidate(monkeypatch, tmp_path):
    """cuBLAS fails at a shape too large for the GPU: the tuner times nothing more there, so no candidate
    is marked broken by it, and the library is built from the other shapes."""
    gpu = FakeGpu(tmp_path / "measured.log").install(monkeypatch)
    gpu.measurer = NoRoomForHugeBatches(str(gpu.log))
    monkeypatch.setattr("gemmgen.tuning.measure.default_measurer", lambda: gpu.measurer)
    path = tmp_path / "batches.gemm"
    path.write_text(LIBRARY.replace("512x512x512 batch 16", "512x512x512 batch 16, 4096x4096x4096 batch 100000"))
    (library,) = load_libraries(path)
    db = tmp_path / "batches.jsonl"
    report = tune_library(library, db=db)
    assert [str(s) for s in report.skipped] == ["4096x4096x4096 batch 100000"] and report.failures == []
    assert [t.kind for t in gpu.tasks if t.what == "4096x4096x4096*100000"] == ["baseline"]
    assert "MemoryError" in next(iter(report.skipped.values()))
    tasks = len(gpu.tasks)
    again = tune_library(library, db=db)  # resumed: only cuBLAS there again (a failed baseline is not recorded)
    assert again.evaluated == 1 and [t.what for t in gpu.tasks[tasks:]] == ["4096x4096x4096*100000"]
    assert [str(s) for s in again.skipped] == ["4096x4096x4096 batch 100000"]
    manifest = build_manifest(library, db)
    assert manifest.candidates_timed == 3 and all(r.batch != 100000 for r in manifest.shapes)  # none lost


def test_the_measurer_refuses_operands_larger_than_the_free_memory_before_allocating(monkeypatch):
    import gemmgen.tuning.measure as measure
    from types import SimpleNamespace
    from gemmgen.gpu.verify import Case
    allocated = []
    fake = SimpleNamespace(get_default_memory_pool=lambda: SimpleNamespace(free_all_blocks=lambda: None),
                           cuda=SimpleNamespace(runtime=SimpleNamespace(memGetInfo=lambda: (80 << 30, 80 << 30))),
                           random=SimpleNamespace(default_rng=lambda seed: allocated.append(seed)))
    monkeypatch.setattr(measure, "_cupy", lambda: fake)
    state = measure._State.__new__(measure._State)
    state.shape, state.buffers = None, {}
    with pytest.raises(MemoryError, match=r"4096x4096x4096 batch 100000: its operands need 20132.7 GB, and this GPU "
                                          r"has 85.9 GB free"):
        state.pointers(Case(4096, 4096, 4096, batch=100000), {"A": "row", "B": "col", "C": "row"})
    assert allocated == []  # nothing was allocated
