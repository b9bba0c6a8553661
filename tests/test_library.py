"""Libraries on the CPU: the spec's library block and its errors, resolving members, tuning on a
faked GPU (what gets timed, resuming), the manifest, the emitted .cu and its choice of member (the
same in C as in Python), and the model's leave-one-out quality."""

from __future__ import annotations


import json
import math
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import GENERATED_DIR, SPECS_DIR
from gemmgen.language.errors import SpecError
from gemmgen.library.manifest import Manifest, build_manifest
from gemmgen.library.model import Library, kernel_key
from gemmgen.library.resolve import load_libraries, resolve
from gemmgen.library.tune import tune_library
from gemmgen.library.selection import (MemberShape, alignment_class, choose, features, fit, leave_one_out, predict,
                                       short_sum_rows)
from gemmgen.gpu.verify import Case
from gemmgen.language.load import parse_file
from library_fake import FakeGpu

TMA = """kernel tma {
  target sm_90a
  layout A row, B col, C row
  block 128 x 128 x 32
  math 3xtf32
  stages 3 tma
}
"""
PORTABLE = """kernel portable {
  target sm_80
  layout A row, B col, C row
  block 64 x 64 x 32
  warp 32 x 32
  math 3xtf32
  stages 3 async
}
"""


def library_of(text: str, path: Path | None = None) -> Library:
    name = str(path) if path else "t.gemm"
    parsed = parse_file(text, name)
    return resolve(parsed.libraries[0], parsed.kernels)


def lib(*lines: str) -> str:
    """A library L; its first line is the layout of the kernels above unless the lines give one."""
    if not any(line.startswith("layout") for line in lines):
        lines = ("layout A row, B col, C row", *lines)
    return "library L {\n" + "".join(f"  {line}\n" for line in lines) + "}\n"


# --- the library block and its errors ------------------------------------------------------------

ERRORS = [
    pytest.param(TMA + PORTABLE + lib("members tma, nothere", "shapes 64x64x64"), 18, 16,
                 "member 'nothere' is neither a kernel in this file", "a kernel or search space", id="missing-member"),
    pytest.param(TMA + PORTABLE + lib("members tma, portable, tma", "shapes 64x64x64"), 18, 26,
                 "member 'tma' is named twice", "each member once", id="member-twice"),
    pytest.param(TMA + PORTABLE.replace("math 3xtf32", "math tf32") + lib("members tma, portable", "shapes 64x64x64"),
                 18, 16, "member 'portable' is TF32 (math tf32), but member 'tma' is FP32-accurate",
                 "members of FP32-accurate", id="mixed-precision"),
    pytest.param(TMA + PORTABLE + lib("members tma, portable", "shapes 64x64x64", "precision tf32"), 18, 11,
                 "member 'tma' is FP32-accurate (math simt or 3xtf32), but the library's precision line is TF32",
                 "members of TF32", id="precision-line"),
    pytest.param(TMA + lib("members tma", "shapes 64x64x64"), 8, 9, "every member of library 'L' needs sm_90a",
                 "a portable member", id="no-portable-member"),
    pytest.param(TMA + PORTABLE.replace("math 3xtf32\n", "math 3xtf32\n  epilogue alpha\n")
                 + lib("members portable", "shapes 64x64x64"), 17, 9, "no member of library 'L' takes beta != 0",
                 "epilogue alpha beta", id="no-member-takes-beta"),
    pytest.param(TMA.replace("math 3xtf32", "math tf32") + PORTABLE.replace("math 3xtf32", "math tf32")
                 + lib("layout A col", "members tma, portable", "shapes 64x64x64"), 18, 11,
                 "member 'tma' cannot be built in this library's layout (A col, B row, C row)",
                 "members that take the library's layout", id="member-layout"),
    pytest.param(TMA.replace("math 3xtf32", "math tf32\n  round truncate") + PORTABLE.replace("math 3xtf32", "math tf32")
                 + lib("members tma, portable", "shapes 64x64x64"), 19, 11,
                 "member 'tma' truncates A and B to TF32 (round truncate)", "members that round",
                 id="truncating-member"),
    pytest.param(PORTABLE + lib("members portable", "shapes 64x64"), 12, 10, "unexpected", "shapes MxNxK",
                 id="bad-shape"),
    pytest.param(PORTABLE + lib("members portable"), 9, 9, "names no shapes", "shapes MxNxK", id="no-shapes"),
    pytest.param(PORTABLE + lib("members portable", "shapes 64x64x64", "block 64 x 64 x 8"), 13, 3,
                 "'block' is not a library setting", "layout, members, shapes, precision", id="kernel-setting"),
    pytest.param(PORTABLE + lib("members portable", "shapes 64x64x64", "shapes 1x1x1"), 13, 3,
                 "'shapes' is given twice", "each setting once", id="shapes-twice"),
    pytest.param(PORTABLE + lib("members portable", "shapes 64x64x64", "precision bf16"), 13, 13,
                 "unknown precision 'bf16'", "fp32 | tf32", id="unknown-precision"),
    pytest.param(PORTABLE.replace("kernel portable", "kernel L") + lib("members L", "shapes 64x64x64"), 9, 9,
                 "'L' names both a library and another definition", "one definition per name", id="name-clash"),
]


@pytest.mark.parametrize("text, line, column, message, allowed", ERRORS)
def test_library_errors_point_at_their_line(text, line, column, message, allowed):
    with pytest.raises(SpecError) as info:
        library_of(text)
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert message in err.message, str(err)
    assert allowed in err.allowed, str(err)
    assert f"{line:5d} | " in str(err) and "^" in str(err)


def test_a_member_from_another_file_and_a_shapes_file(tmp_path):
    (tmp_path / "portable.gemm").write_text(PORTABLE)
    (tmp_path / "shapes.txt").write_text("# tuned at\n4096x4096x4096\n127x4099x1023 pad 1  # awkward\n")
    library = library_of(TMA + lib("members tma, portable", 'shapes "shapes.txt"'), tmp_path / "lib.gemm")
    assert [m.name for m in library.members] == ["tma", "portable"]
    assert [(s.M, s.N, s.K, s.pad) for s in library.shapes] == [(4096, 4096, 4096, 0), (127, 4099, 1023, 1)]
    assert library.precision == "fp32" and library.baseline == "cuBLAS FP32"


def test_a_bad_line_of_a_shapes_file_is_reported_in_that_file(tmp_path):
    (tmp_path / "shapes.txt").write_text("4096x4096x4096\n\n4096 x 4096\n")
    with pytest.raises(SpecError) as info:
        library_of(PORTABLE + lib("members portable", 'shapes "shapes.txt"'), tmp_path / "lib.gemm")
    assert info.value.path.endswith("shapes.txt") and info.value.line == 3
    assert "not a shape: '4096 x 4096'" in str(info.value) and "    3 | 4096 x 4096" in str(info.value)


def test_members_take_the_library_layout():
    # portable is written row/row nowhere here: the library lays every member out as it says
    library = library_of(PORTABLE.replace("layout A row, B col, C row", "layout A col, B row, C col")
                         + TMA + lib("layout A row, B col, C row", "members portable, tma", "shapes 64x64x64"))
    for member in library.members:
        assert all(plan.layouts() == "A row, B col, C row" for plan in member.plans)


@pytest.mark.parametrize("name, precision, count", [("fp32", "fp32", 96), ("tf32", "tf32", 220)])
def test_shipped_libraries_resolve(name, precision, count):
    (library,) = load_libraries(SPECS_DIR / f"{name}.gemm")
    assert library.precision == precision
    assert len(library.candidates()) == count
    assert len(library.shapes) >= 24
    assert any(not p.arch.has_wgmma for p in library.candidates())      # a portable member
    assert any(p.split_k > 1 and p.tma for p in library.candidates())   # split K on the tensor cores
    assert any(p.split_k > 1 and p.scheduler.split_by == "workspace" for p in library.candidates())  # ... summed in a workspace
    assert precision == "fp32" or any(p.cluster_blocks > 1 for p in library.candidates())  # clusters (tf32)
    assert precision == "fp32" or any(p.tma_store and p.schedule == "persistent"     # staged C (tf32)
                                      for p in library.candidates())
    assert precision == "fp32" or any(p.pingpong and p.RM == 2 for p in library.candidates())  # ping-pong (tf32)
    assert any(s.pad % 4 for s in library.shapes)                       # rows that forbid 16-byte loads
    assert any(min(s.M, s.N) <= 128 and s.K >= 16384 or s.K >= 16384 and s.M * s.N <= 512 * 512
               for s in library.shapes)


# --- the model ------------------------------------------------------------------------------

def test_waves_and_k_steps_follow_the_tiling():
    member = MemberShape(128, 128, 32, 4, 1)
    launch, main_loop, waves, operand_gb, split_gb = features(member, 1000, 1000, 4096, 132)
    # 8 x 8 tiles x 4 slices = 256 blocks over 132 SMs: 2 waves; 4096 / 32 / 4 = 32 K steps each
    assert (launch, waves, main_loop) == (1.0, 2.0, 64.0)
    assert split_gb == pytest.approx(8e-9 * 1000 * 1000)


def test_alignment_class():
    assert alignment_class(4096, 4096, 4096, (256, 512, 1024)) == "aligned"
    assert alignment_class(1023, 4096, 4096) == "unaligned"
    assert alignment_class(4096, 4096, 4096, (256, 516, 1024)) == "unaligned"  # B 4 bytes off
    # rows 16- but not 32-byte aligned: A's or B's (C's stores hardly care)
    assert alignment_class(4092, 4096, 4096) == "split" == alignment_class(4096, 4092, 4096)
    assert alignment_class(4096, 4096, 4092) == "aligned"
    assert alignment_class(4096, 4096, 4096, strides=(8, 12, 8)) == "split"


def test_fit_is_nonnegative_and_exact_at_tuned_shapes():
    member = MemberShape(64, 64, 32, 1, 2)
    points = [(M, N, K, 0.01 + 0.0003 * features(member, M, N, K, 132)[1])
              for M, N, K in [(256, 256, 256), (1024, 512, 2048), (4096, 4096, 4096), (128, 8192, 1024),
                              (2048, 64, 8192), (512, 512, 512), (8192, 8192, 256), (64, 64, 65536)]]
    model = fit(member, points, 132)
    assert all(c >= 0 for c in model.coef)
    for M, N, K, ms in points:
        assert predict(member, model, M, N, K, 132) == ms
    # off the tuned shapes the model carries the law it was fitted to
    truth = 0.01 + 0.0003 * features(member, 3000, 3000, 3000, 132)[1]
    assert predict(member, model, 3000, 3000, 3000, 132) == pytest.approx(truth, rel=0.02)


def test_a_split_call_costs_the_members_split_ratio_measured_at_split_shapes():
    """Rows only 16-byte aligned: the aligned model times the ratio the member's split measurements
    show (not less than 1); the split measurements neither fit the model nor correct its neighbours,
    and each is the prediction at its own shape and class."""
    member = MemberShape(128, 128, 32, 1, 1)
    law = lambda M, N, K: 0.01 + 0.0003 * features(member, M, N, K, 132)[1]  # noqa: E731
    shapes = [(256, 256, 256), (1024, 512, 2048), (4096, 4096, 4096), (128, 8192, 1024), (2048, 64, 8192),
              (512, 512, 512), (8192, 8192, 256), (64, 64, 65536)]
    split = [(1, 4092, 4092, 4092, 1.5 * law(4092, 4092, 4092)), (1, 2000, 3000, 700, 1.4 * law(2000, 3000, 700))]
    model = fit(member, [(M, N, K, law(M, N, K)) for M, N, K in shapes], 132, split=split)
    alone = fit(member, [(M, N, K, law(M, N, K)) for M, N, K in shapes], 132)
    assert model.coef == alone.coef and model.split_ratio == pytest.approx(math.sqrt(1.5 * 1.4), rel=0.02)
    assert predict(member, model, 4092, 4092, 4092, 132, split=True) == split[0][4]
    assert predict(member, model, 4092, 4092, 4092, 132) == predict(member, alone, 4092, 4092, 4092, 132)
    assert predict(member, model, 2500, 2500, 2500, 132, split=True) == pytest.approx(
        model.split_ratio * predict(member, alone, 2500, 2500, 2500, 132))
    faster = fit(member, [(M, N, K, law(M, N, K)) for M, N, K in shapes], 132,
                 split=[(1, 4092, 4092, 4092, 0.9 * law(4092, 4092, 4092))])
    assert faster.split_ratio == 1.0  # rows split never help
    assert type(model).from_dict(model.to_dict()) == model


# --- tuning on a faked GPU, the manifest and the .cu ----------------------------------------------

@pytest.fixture
def fp32_manifest(monkeypatch, tmp_path):
    gpu = FakeGpu(tmp_path / "measured.log").install(monkeypatch)
    (library,) = load_libraries(SPECS_DIR / "fp32.gemm")
    db = tmp_path / "fp32.jsonl"
    report = tune_library(library, db=db)
    return library, db, report, gpu


def test_tuning_times_less_than_every_candidate_at_every_shape(fp32_manifest):
    library, db, report, gpu = fp32_manifest
    candidates, shapes = len(library.candidates()), len(library.shapes)
    timed = [t for t in gpu.tasks if t.kind == "time"]
    assert sum(t.kind == "validate" for t in gpu.tasks) == candidates       # each validated once
    assert sum(t.kind == "baseline" for t in gpu.tasks) == shapes
    assert len(timed) < 0.6 * candidates * shapes
    assert len({(t.key, t.what) for t in timed}) == len(timed)              # nothing twice
    assert len(db.read_text().splitlines()) == len(gpu.tasks) + 1           # a record each, and the device's


def test_tuning_resumes_without_measuring_again(fp32_manifest, monkeypatch, tmp_path):
    library, db, report, gpu = fp32_manifest
    lines = db.read_text()
    again = FakeGpu(tmp_path / "again.log").install(monkeypatch)
    assert tune_library(library, db=db).evaluated == 0
    assert again.tasks == [] and db.read_text() == lines


def test_tuning_says_each_step_and_what_is_left_to_run(fp32_manifest, monkeypatch, tmp_path):
    # a log of a long tune shows where its time goes: one line per step, with the jobs left
    library, db, report, gpu = fp32_manifest
    FakeGpu(tmp_path / "again.log").install(monkeypatch)
    heard = []
    tune_library(library, db=db, stage=heard.append)
    assert heard[0] == f"compiling {len(library.candidates())} candidates"
    assert [text.split(":")[0].split(" ")[0] for text in heard[1:]] == ["validating", "timing", "timing", "choosing",
                                                                         "timing"]
    assert all("0 job(s) to run" in text for text in heard if "job(s)" in text)  # resumed: all recorded
    assert "members" in heard[-1] and "specialists" in heard[-1]


def test_a_candidate_that_fails_validation_is_never_timed(monkeypatch, tmp_path):
    (library,) = load_libraries(SPECS_DIR / "fp32.gemm")
    bad = kernel_key(library.candidates()[0])
    gpu = FakeGpu(tmp_path / "measured.log", fail={bad}).install(monkeypatch)
    tune_library(library, db=tmp_path / "db.jsonl")
    assert [t.kind for t in gpu.tasks if t.key == bad] == ["validate"]
    manifest = build_manifest(library, tmp_path / "db.jsonl")
    assert bad not in [m.key for m in manifest.members]


def test_manifest_keeps_a_few_members_and_chooses_well(fp32_manifest):
    library, db, report, _ = fp32_manifest
    manifest = build_manifest(library, db)
    assert 2 <= len(manifest.members) <= 10
    portable = manifest.members[manifest.portable]
    assert not portable.needs_sm90a and portable.beta
    for row in manifest.shapes:
        assert row.chosen_ms <= 1.05 * row.best_candidate_ms, row
    loo = manifest.leave_one_out
    assert len(loo.per_shape) == len(library.shapes)
    assert loo.median <= 1.05 and loo.worst <= 1.25, loo


def test_leave_one_out_scores_a_bad_chooser_badly():
    """The quality measure itself: a member that is best everywhere but one shape, where a model
    fitted without that shape cannot know, must show up as a worse-than-1 ratio there."""
    a, b = MemberShape(128, 128, 32, 1, 1), MemberShape(64, 64, 32, 1, 1)
    shapes = [(256 * i, 256 * i, 1024, "aligned") for i in range(1, 9)]
    data_a = {s: 1.0 for s in shapes}
    data_b = {s: 2.0 for s in shapes}
    data_b[shapes[4]] = 0.5
    loo = leave_one_out([a, b], [data_a, data_b], 132)
    assert loo.ratios[shapes[4]] == pytest.approx(2.0) and loo.median == 1.0


def test_emitted_cu_has_one_entry_point_and_static_members(fp32_manifest):
    from gemmgen.library.emit import library_source
    library, db, _, _ = fp32_manifest
    manifest = build_manifest(library, db)
    source = library_source(manifest, "fp32.gemm", library.spec.source.splitlines())
    assert source.count('\nextern "C" int gemmgen_fp32(') == 1
    for member in manifest.members:
        assert f"static int gemmgen_{member.name}(" in source
        assert f'extern "C" int gemmgen_{member.name}(' not in source
    assert "cudaErrorInvalidValue" in source and "gemmgen_fp32_probe" in source


def choices_in_c(source: str, name: str, cases, tmp_path: Path) -> list[int]:
    """Compile the .cu's choice of member (plain C++) with the host compiler and run it on cases of
    (M, N, K, class, beta used, batch): class True or "aligned", False or "unaligned", or "split"."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no host C++ compiler")
    start = source.index(f"namespace gemmgen_{name}_choice {{")
    end = source.index(f"}}  // namespace gemmgen_{name}_choice", start)
    program = tmp_path / "choose.cpp"
    program.write_text("#include <math.h>\n#include <stdio.h>\n" + source[start:end] + "}\n" + f"""
int main() {{
    int M, N, K, klass, beta, batch;  // klass 0: unaligned, 1: aligned, 2: split
    while (scanf("%d %d %d %d %d %d", &M, &N, &K, &klass, &beta, &batch) == 6)
        printf("%d\\n", gemmgen_{name}_choice::choose(M, N, K, klass != 0, klass == 2, 132, beta, true, batch));
}}
""")
    subprocess.run([compiler, "-O1", "-o", str(tmp_path / "choose"), str(program)], check=True)
    feed = "\n".join(f"{M} {N} {K} {CLASS_CODE[class_of(a)]} {int(b)} {batch}" for M, N, K, a, b, batch in cases)
    return [int(x) for x in subprocess.run([str(tmp_path / "choose")], input=feed, capture_output=True,
                                           text=True, check=True).stdout.split()]


CLASS_CODE = {"unaligned": 0, "aligned": 1, "split": 2}


def class_of(a) -> str:
    """A case's alignment class: a class name, or True (aligned) or False (unaligned)."""
    return a if isinstance(a, str) else ("aligned" if a else "unaligned")


def _batch(rng: random.Random) -> int:
    """Half the calls single GEMMs, the rest strided batches of 2 to 512 (log-uniform)."""
    return 1 if rng.random() < 0.5 else int(2 ** rng.uniform(1, 9))


def test_the_cu_chooses_as_python_does(fp32_manifest, tmp_path):
    """Single GEMMs and strided batches (the model's tiles and traffic times the batch; a tuned
    shape's measurement stands for one batch only): the .cu picks the member Python picks."""
    from gemmgen.library.emit import library_source
    library, db, _, _ = fp32_manifest
    manifest = build_manifest(library, db)
    source = library_source(manifest, "fp32.gemm", [])
    rng = random.Random(7)
    cases = [(int(2 ** rng.uniform(0, 15)), int(2 ** rng.uniform(0, 15)), int(2 ** rng.uniform(0, 17)),
              rng.choice(["aligned", "aligned", "split", "unaligned"]), rng.random() < 0.3, _batch(rng))
             for _ in range(1500)]
    cases += [(r.M, r.N, r.K, k, False, batch) for r in manifest.shapes for batch in (1, 8, 512)
              for k in {r.klass, "aligned" if r.klass == "split" else r.klass}]
    candidates, exact_rows = manifest.candidates(), short_sum_rows(manifest.precision)
    python = [choose(candidates, M, N, K, class_of(a), 132, beta_used=b, batch=batch, exact_rows=exact_rows)
              for M, N, K, a, b, batch in cases]
    assert choices_in_c(source, "fp32", cases, tmp_path) == python
    # split rows: somewhere a call whose rows are only 16-byte aligned runs another member than the aligned call
    assert any(choose(candidates, M, N, K, "split", 132) != choose(candidates, M, N, K, "aligned", 132)
               for M, N, K in [(4092, 4092, 4092), (2500, 2500, 2500), (3000, 2000, 700)])
    # the batch matters: somewhere a batch of small products runs another member than one of them
    assert any(choose(candidates, M, N, K, "aligned", 132, batch=64) != choose(candidates, M, N, K, "aligned", 132)
               for M, N, K in [(64, 64, 64), (128, 128, 256), (256, 256, 1024), (512, 512, 512)])


# --- the shipped libraries: generated files match their database ---------------------------------

SHIPPED = [name for name in ("fp32", "tf32") if (GENERATED_DIR / f"{name}.json").is_file()]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_library_is_up_to_date_with_its_database(name):
    from gemmgen.library.emit import library_source
    (library,) = load_libraries(SPECS_DIR / f"{name}.gemm")
    text = (GENERATED_DIR / f"{name}.json").read_text()
    shipped = Manifest.from_json(text)
    assert shipped.to_json() == text  # read and written back, the file is the same to the byte
    db = Path(shipped.database)
    manifest = build_manifest(library, Path(__file__).resolve().parent.parent / db, device=shipped.device.name)
    manifest.database = shipped.database
    assert manifest.to_json() == text, (f"generated/{name}.json is stale: rebuild it with gemmgen build "
                                        f"specs/{name}.gemm --from-db {db}")
    source = library_source(manifest, f"{name}.gemm", library.spec.source.splitlines())
    assert source == (GENERATED_DIR / f"{name}.cu").read_text(), f"generated/{name}.cu is stale"
    from gemmgen.library.emit import library_header_source
    header = library_header_source(manifest, manifest.plans()[0], f"{name}.cu")
    assert header == (GENERATED_DIR / f"{name}.h").read_text(), f"generated/{name}.h is stale"


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_library_keeps_its_promises_at_the_tuned_shapes(name):
    manifest = json.loads((GENERATED_DIR / f"{name}.json").read_text())
    assert manifest["leave_one_out"]["median"] <= 1.05
    assert not math.isinf(manifest["leave_one_out"]["worst"])


# --- the command line ---------------------------------------------------------------------------

def test_build_skips_a_library_without_measurements():
    from test_cli import assert_clean_exit, invoke
    result = invoke("build", SPECS_DIR / "fp32.gemm", "--no-compile", "-o", "/nonexistent-never-written")
    assert_clean_exit(result, 0)
    assert "skipped fp32: a library is built from measurements" in result.output
    assert "skipped lib_3xtf32_tma: a search space" in result.output


def test_build_from_db_writes_the_library_and_its_manifest(fp32_manifest, tmp_path):
    from test_cli import assert_clean_exit, invoke
    library, db, _, _ = fp32_manifest
    result = invoke("build", SPECS_DIR / "fp32.gemm", "--from-db", db, "-o", tmp_path / "out")
    assert_clean_exit(result, 0)
    source = (tmp_path / "out" / "fp32.cu").read_text()
    manifest = json.loads((tmp_path / "out" / "fp32.json").read_text())
    assert manifest["library"] == "fp32" and manifest["database"] == str(db)
    assert source.startswith("// gemmgen_fp32: generated by gemmgen")
    assert f"leave-one-out over {len(library.shapes)} tuned shapes" in result.output


def test_build_from_a_db_without_the_library_says_so(tmp_path):
    from test_cli import assert_clean_exit, invoke
    db = tmp_path / "empty.jsonl"
    db.write_text("")
    result = invoke("build", SPECS_DIR / "fp32.gemm", "--from-db", db, "-o", tmp_path)
    assert_clean_exit(result, 1)
    assert "holds no measurements of library 'fp32': run gemmgen tune on it" in result.stderr


def test_tune_and_bench_of_a_library_need_a_gpu():
    from test_cli import assert_clean_exit, invoke
    for verb in ("tune", "bench"):
        result = invoke(verb, SPECS_DIR / "fp32.gemm")
        assert_clean_exit(result, 2)
        assert "no CUDA GPU found" in result.stderr


# --- the measurer, on a faked device; the runner, with a measurer that dies ------------------------

def test_the_measurer_validates_and_times_on_a_faked_device(monkeypatch, tmp_path):
    """gemmgen.tuning.measure itself (in this process): each candidate validated against float64 by
    verify.check, cuBLAS and the candidates timed at their shapes (padded ones too), a search's
    point validated and timed in one job."""
    import fake_device
    import gemmgen.tuning.measure as measure
    from gemmgen.language.shapes import LibraryShape
    from gemmgen.library.tune import Jobs
    from gemmgen.tuning.jobs import MEASURE, Job
    gpu = fake_device.install(monkeypatch)
    monkeypatch.setattr(measure, "_state", None)  # this process's GPU state starts afresh
    (library,) = load_libraries(SPECS_DIR / "fp32.gemm")
    plans = library.candidates()[:2]
    shapes = [LibraryShape(64, 48, 40), LibraryShape(33, 17, 9, pad=1)]
    jobs = Jobs(library)
    for plan in plans:
        assert measure.measure(jobs.validate(plan), None) == {"status": "ok"}
    for shape in shapes:
        baseline = measure.measure(jobs.cublas(shape), None)
        assert baseline["status"] == "ok" and baseline["ms"] > 0
        for plan in plans:
            timed = measure.measure(jobs.time(plan, shape), None)
            assert timed["status"] == "ok" and timed["ms"] > 0 and timed["tflops"] > 0
    assert gpu.cublas.compute_types == [fake_device.CUBLAS_COMPUTE_32F] * 2  # fp32's baseline: cuBLAS FP32
    point = Job(MEASURE, "k", "p", "64x64x64", "space", plan=plans[0], shape=Case(64, 64, 64))
    assert measure.measure(point, None)["status"] == "ok"
    wrong = Job(MEASURE, "w", "p", "64x64x64", "space", plan=plans[0], shape=Case(64, 64, 64))
    monkeypatch.setattr(fake_device.ReferenceKernel, "launch", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(measure, "_state", None)
    result = measure.measure(wrong, None)
    assert result["status"] == "invalid" and "127x131x137" in result["reason"]


def test_a_gpu_process_that_dies_costs_only_the_candidate_in_flight(tmp_path):
    """The runner on this host, its GPU process killed by a candidate (as a GPU fault does): that
    candidate is recorded as a crash with what it was doing, gets no more of the run's jobs, and
    the others are measured by a fresh process."""
    from gemmgen.language.shapes import LibraryShape
    from gemmgen.library.model import Measurements, read_db
    from gemmgen.library.tune import Jobs
    from gemmgen.tuning.runner import LocalRunner
    from library_fake import LibraryMeasurer
    (library,) = load_libraries(SPECS_DIR / "fp32.gemm")
    plain = [p for p in library.candidates() if p.split_k == 1][:2]
    split = [p for p in library.candidates() if p.split_k > 1][:1]
    shapes = [LibraryShape(64, 64, 64), LibraryShape(128, 128, 128)]
    jobs = Jobs(library)
    db = tmp_path / "db.jsonl"
    seen = []
    with LocalRunner(measurer=LibraryMeasurer(str(tmp_path / "log"), crash_split=True),
                     compile_processes=1) as runner:
        runner.run([jobs.time(p, s) for s in shapes for p in split + plain], db, seen.append)
    (records,) = read_db(db, "fp32").values()
    m = Measurements.of(records)
    crashed = m.status[kernel_key(split[0])]
    assert crashed["status"] == "crash" and "died (exit code 3) during time at 64x64x64" in crashed["reason"]
    assert not any(key == kernel_key(split[0]) for key, _ in m.times)  # never timed again
    assert {(kernel_key(p), s) for p in plain for s in ("64x64x64", "128x128x128")} <= set(m.times)
    assert any(entry.get("status") == "crash" for entry in seen)
    attempts = [line for line in (tmp_path / "log").read_text().splitlines()
                if line.split("\t")[1] == kernel_key(split[0])]
    assert len(attempts) == 1  # its job at 128x128x128 never ran


def test_slots_per_sm_from_ptxas_registers_and_shared_memory():
    from gemmgen.library.model import slots_per_sm
    (library,) = load_libraries(SPECS_DIR / "fp32.gemm")
    portable = next(p for p in library.candidates() if not p.arch.has_wgmma)
    assert slots_per_sm(portable) >= 1  # compiled: ptxas's registers, the Plan's shared memory
    assert all(slots_per_sm(p) == 1 for p in library.candidates() if p.consumers)


def test_explain_summarises_a_library_and_what_its_manifest_keeps():
    from test_cli import assert_clean_exit, invoke
    result = invoke("explain", SPECS_DIR / "fp32.gemm")
    assert_clean_exit(result, 0)
    assert "library fp32: fp32 (timed against cuBLAS FP32), layout A row, B col, C row" in result.output
    assert "tensorcore_3xtf32" in result.output and "(runs on every GPU)" in result.output
    (library,) = load_libraries(SPECS_DIR / "fp32.gemm")
    assert f"shapes ({len(library.shapes)}):" in result.output
    assert "padding: an unaligned call copies its unaligned operands into aligned workspace" in result.output
    assert "nearest TF32" not in result.output  # fp32's copies are exact; tf32's round
    assert "the copies round A and B to nearest TF32" in invoke("explain", SPECS_DIR / "tf32.gemm").output
    if (GENERATED_DIR / "fp32.json").is_file():
        assert "leave-one-out median" in result.output and "members kept:" in result.output
    data = json.loads(invoke("explain", SPECS_DIR / "fp32.gemm", "--json").output)
    assert data[0]["library"] == "fp32" and data[0]["candidates"] == 96


def test_a_stream_k_member_is_modelled_and_chosen_in_c_as_in_python(monkeypatch, tmp_path):
    """A library with `schedule stream-k` candidates: the chooser's features deal the K tiles as the
    kernel does (plan/schedule.py), and the .cu chooses exactly as Python."""
    from gemmgen.library.emit import library_source
    FakeGpu(tmp_path / "measured.log").install(monkeypatch)
    shutil.copy(SPECS_DIR / "tensorcore_tf32.gemm", tmp_path)
    (tmp_path / "sk.gemm").write_text("""kernel sk_tma {
  target   sm_90a
  layout   A row, B col, C row
  block    128 x {128, 256} x 32
  math     tf32
  stages   4 tma
  raster   group 8
  schedule {data-parallel, stream-k}
}
library sk {
  layout   A row, B col, C row
  members  sk_tma, tensorcore_tf32
  shapes   4096x4096x4096, 4092x4092x4092, 2048x2048x2048, 1024x1024x1024, 4096x4096x512, 8192x128x8192,
           3000x3000x3000, 1536x2816x1000, 300x300x40000, 127x4099x1023 pad 1
  precision tf32
}
""".replace(",\n           ", ", "))
    (library,) = load_libraries(tmp_path / "sk.gemm")
    db = tmp_path / "sk.jsonl"
    tune_library(library, db=db)
    manifest = build_manifest(library, db)
    assert any(m.stream_k for m in manifest.members), "no stream-K member kept"
    source = library_source(manifest, "sk.gemm", [])
    assert "if (m.stream_k)" in source
    rng = random.Random(3)
    cases = [(int(2 ** rng.uniform(0, 14)), int(2 ** rng.uniform(0, 14)), int(2 ** rng.uniform(0, 16)),
              rng.random() < 0.7, rng.random() < 0.3, _batch(rng)) for _ in range(800)]
    candidates = manifest.candidates()
    python = [choose(candidates, M, N, K, "aligned" if a else "unaligned", 132, beta_used=b, batch=batch)
              for M, N, K, a, b, batch in cases]
    assert choices_in_c(source, "sk", cases, tmp_path) == python


def test_a_candidate_much_faster_than_every_chosen_one_somewhere_is_timed_everywhere():
    """A kernel that wins only where the rest are weak (ping-pong at short K): 5% faster than every
    chosen member at one shape makes it a specialist; 3% does not; largest gain first."""
    from gemmgen.library.model import Measurements, shape_key
    from gemmgen.library.tune import specialists
    (library,) = load_libraries(SPECS_DIR / "fp32.gemm")
    plans = [p for p in library.candidates() if p.beta][:4]
    shapes = library.shapes[:2]
    a, b = (shape_key(s) for s in shapes)
    times = {(kernel_key(plans[0]), a): 1.0, (kernel_key(plans[0]), b): 1.0,
             (kernel_key(plans[1]), a): 0.97,                                  # 3% faster: not enough
             (kernel_key(plans[2]), b): 0.90,                                  # 11%
             (kernel_key(plans[3]), a): 0.80, (kernel_key(plans[3]), b): 2.0}  # 25% at one shape
    m = Measurements({}, times, {})
    assert specialists(plans, [plans[0]], m, shapes) == [plans[3], plans[2]]
    assert specialists(plans, [plans[0], plans[3]], m, shapes) == [plans[2]]


def test_a_specialist_is_judged_against_the_members_the_choice_may_take_there():
    """At fp32's few rows only FFMA decode members may run (short_sum_call): an FFMA kernel 9% faster
    than the kept FFMA member there is a specialist, though a kept 3xTF32 member is faster still;
    counting that member, which the choice cannot take there, hid it (5x4096x4096 lost 10%)."""
    from gemmgen.language.shapes import LibraryShape
    from gemmgen.library.model import Measurements, member_shape, shape_key
    from gemmgen.library.selection import ffma_decode, short_sum_rows
    from gemmgen.library.tune import specialists
    (library,) = load_libraries(SPECS_DIR / "fp32.gemm")
    decode = [p for p in library.candidates() if p.path == "decode" and p.beta]
    ffma = [p for p in decode if ffma_decode(member_shape(p))][:2]
    tensor = next(p for p in decode if not ffma_decode(member_shape(p)))
    shape = LibraryShape(5, 4096, 4096)
    k = shape_key(shape)
    times = {(kernel_key(ffma[0]), k): 1.00, (kernel_key(ffma[1]), k): 0.91, (kernel_key(tensor), k): 0.88}
    m = Measurements({}, times, {})
    rows = short_sum_rows(library.precision)
    assert rows >= 5
    assert specialists(decode, [ffma[0], tensor], m, [shape], rows, library.layouts) == [ffma[1]]
    # with no row rule every member may run there, and the 3xTF32 one hides it
    assert specialists(decode, [ffma[0], tensor], m, [shape]) == []
