"""The decode member in a library (issue 28), on the CPU with the fake GPU of library_fake.py: it is
timed only at the shapes it is built for (M or N <= 16), kept where it wins there, never the portable
member, never predicted (so never chosen) where both M and N pass 16, modelled by the bytes it reads,
and chosen by the emitted C exactly as by Python. A TF32 library takes it (exact FP32 is more
accurate than TF32), and its tensor path (math tf32 / 3xtf32, mma.sync at every row count) in the
library of its precision, with the model's tensor terms in Python and C alike; a fused call never
gets it (it has no fused epilogue). The fp32 library leaves calls of M up to FP32_SHORT_SUM_ROWS to
FFMA (where cuBLAS FP32's sums are short), never to the 3xTF32 tensor path or a tile member."""

from __future__ import annotations

import math
import random
import shutil

import pytest

from conftest import SPECS_DIR
from gemmgen.language.errors import SpecError
from gemmgen.language.load import load_one
from gemmgen.library.manifest import build_manifest
from gemmgen.library.model import kernel_key, member_shape
from gemmgen.library.resolve import load_libraries
from gemmgen.library.selection import (DECODE_ROWS, DECODE_ROWS_PER_READ, DECODE_TENSOR_WORK_ROWS,
                                        FP32_SHORT_SUM_ROWS, MemberShape, choose, features, ffma_decode, predict,
                                        serves, short_sum_rows)
from gemmgen.library.tune import tune_library
from gemmgen.plan import make_plan
from library_fake import FakeGpu
from test_library import _batch, choices_in_c

LIBRARY = """kernel dec {{
  target   sm_90
  layout   A row, B col, C row
  decode   columns {{1, 4}} warps 8 slices {{1, 2}}
  math     {math}
}}
library dl {{
  layout   A row, B col, C row
  members  {members}
  shapes   4096x4096x4096, 2048x2048x2048, 1024x1024x1024, 127x4099x1023, 64x4096x8192, 1x4096x4096, 16x8192x4096, 8x11008x4096, 4096x1x4096, 4096x16x4096, 1x4096x4096 pad 1, 16x11008x4096 pad 1, 4096x4x4096 pad 1
  precision {precision}
}}
"""


# (the portable member, the decode member's math, the library's precision)
LIBRARIES = {"fp32": ("tensorcore_3xtf32", "{simt, 3xtf32}", "fp32"), "tf32": ("tensorcore_tf32", "{simt, tf32}", "tf32")}


@pytest.fixture(params=list(LIBRARIES))
def decode_library(request, monkeypatch, tmp_path):
    gpu = FakeGpu(tmp_path / "measured.log").install(monkeypatch)
    for name in ("tensorcore_3xtf32", "tensorcore_tf32"):  # the portable member and its parent
        shutil.copy(SPECS_DIR / f"{name}.gemm", tmp_path)
    portable, math, precision = LIBRARIES[request.param]
    (tmp_path / "dl.gemm").write_text(LIBRARY.format(members=f"{portable}, dec", math=math, precision=precision))
    (library,) = load_libraries(tmp_path / "dl.gemm")
    db = tmp_path / "dl.jsonl"
    tune_library(library, db=db)
    return library, build_manifest(library, db), gpu


def test_it_is_timed_only_where_it_serves_and_kept_there(decode_library):
    library, manifest, gpu = decode_library
    decode_keys = {kernel_key(p) for p in library.candidates() if p.path == "decode"}
    timed = [t for t in gpu.tasks if t.kind == "time" and t.key in decode_keys]
    assert timed, "the decode candidates were never timed"
    for task in timed:
        M, N = (int(x) for x in task.what.split("+")[0].split("x")[:2])
        assert min(M, N) <= DECODE_ROWS, task
    kept = [m for m in manifest.members if m.decode]
    assert kept, "no decode member kept"
    assert not manifest.members[manifest.portable].decode  # the portable member serves every call
    for row in manifest.shapes:
        chosen = manifest.members[row.chosen]
        assert chosen.decode == (min(row.M, row.N) <= DECODE_ROWS), row  # the fake's decode wins there


def test_each_decode_candidate_is_timed_at_every_row_pass_the_shapes_have(monkeypatch, tmp_path):
    """At the anchors the decode candidates serve only single rows; tune.decode_anchors adds a shape of
    each other row pass (1, 2, 4, 8, 16 rows: the kernel's compile-time counts) to the first phase, so
    that every decode candidate's model has seen more than one row count, not only the two points per
    space that a one-row model ranks first at each shape."""
    gpu = FakeGpu(tmp_path / "measured.log").install(monkeypatch)
    for name in ("tensorcore_3xtf32", "tensorcore_tf32"):  # the portable member and its parent
        shutil.copy(SPECS_DIR / f"{name}.gemm", tmp_path)
    text = LIBRARY.format(members="tensorcore_3xtf32, dec", math="simt", precision="fp32")
    text = text.replace("decode   columns {1, 4} warps 8 slices {1, 2}", "decode   columns {1, 2, 4} warps {4, 8} slices {1, 2}")
    (tmp_path / "dl.gemm").write_text(text)
    (library,) = load_libraries(tmp_path / "dl.gemm")
    tune_library(library, db=tmp_path / "dl.jsonl")

    def row_pass(M: int, N: int) -> int:
        return next(count for count in (1, 2, 4, 8, 16) if count >= min(M, N))

    wanted = {row_pass(s.M, s.N) for s in library.shapes if min(s.M, s.N) <= DECODE_ROWS}
    assert wanted == {1, 4, 8, 16}
    timed: dict[str, set[int]] = {}
    for task in gpu.tasks:
        if task.kind == "time" and "x" in task.what:
            M, N = (int(x) for x in task.what.split("+")[0].split("x")[:2])
            if min(M, N) <= DECODE_ROWS:
                timed.setdefault(task.key, set()).add(row_pass(M, N))
    decode = [plan for plan in library.candidates() if plan.path == "decode"]
    assert len(decode) == 12
    for plan in decode:
        assert wanted <= timed.get(kernel_key(plan), set()), (plan.spec.name, sorted(timed.get(kernel_key(plan), ())))


def test_without_a_decode_member_that_can_run_few_rows_get_the_best_tile_member(decode_library):
    """A relaid library leaves out the decode members (they are built only A row, B col): its
    matrix-vector products and few-row fp32 calls then go to the tile member predicted fastest, not
    to whichever member is first."""
    from dataclasses import replace
    _, manifest, _ = decode_library
    candidates = [replace(c, models={}) if c.shape.decode else c for c in manifest.candidates()]
    exact_rows = short_sum_rows(manifest.precision)
    for M, N, K in [(1, 4096, 4096), (4, 14336, 4096), (8, 11008, 4096), (4096, 1, 4096), (3, 300, 5000)]:
        chosen = choose(candidates, M, N, K, "aligned", 132, beta_used=False, exact_rows=exact_rows)
        tiles = [c if not c.shape.decode else replace(c, shape=replace(c.shape, decode=False)) for c in candidates]
        assert chosen == choose(tiles, M, N, K, "aligned", 132, beta_used=False), (M, N, K)
        assert not manifest.members[chosen].decode


def test_the_c_choice_is_pythons_and_never_decode_past_16(decode_library, tmp_path):
    from gemmgen.library.emit import library_source
    library, manifest, _ = decode_library
    source = library_source(manifest, "dl.gemm", [])
    assert "if (m.decode)" in source and "return HUGE_VAL;" in source
    rng = random.Random(28)
    sizes = lambda: int(2 ** rng.uniform(0, 14)) if rng.random() < 0.6 else rng.randint(1, 20)  # noqa: E731
    cases = [(sizes(), sizes(), int(2 ** rng.uniform(0, 15)), rng.random() < 0.7, rng.random() < 0.3, _batch(rng))
             for _ in range(800)]
    candidates = manifest.candidates()
    exact_rows = short_sum_rows(manifest.precision)
    python = [choose(candidates, M, N, K, "aligned" if a else "unaligned", 132, beta_used=b, batch=batch,
                     exact_rows=exact_rows) for M, N, K, a, b, batch in cases]
    assert choices_in_c(source, "dl", cases, tmp_path) == python
    for (M, N, *_), chosen in zip(cases, python):
        if min(M, N) > DECODE_ROWS:
            assert not manifest.members[chosen].decode, (M, N)
        if manifest.precision == "fp32" and M <= FP32_SHORT_SUM_ROWS:
            assert ffma_decode(candidates[chosen].shape), (M, N, manifest.members[chosen].point)
    if manifest.precision == "fp32":  # the rule had work to do: the fastest predicted there was not always FFMA
        free = [choose(candidates, M, N, K, "aligned" if a else "unaligned", 132, beta_used=b, batch=batch)
                for M, N, K, a, b, batch in cases]
        assert any(f != c and M <= FP32_SHORT_SUM_ROWS for (M, N, *_), f, c in zip(cases, free, python))
    if manifest.precision == "tf32":  # the fake's tensor path wins at 5 to 16 rows: C must model it as Python
        assert any(m.decode and m.math == "tf32" for m in manifest.members)
        assert any(manifest.members[c].math == "tf32" and manifest.members[c].decode and 5 <= min(M, N) <= 16
                   for (M, N, *_), c in zip(cases, python))
    assert any(manifest.members[c].decode for c in python)


def test_its_model_counts_the_bytes_it_reads():
    member = MemberShape(16, 8, 512, 1, 2, decode=True)
    f = features(member, 1, 4096, 4096, 132)
    blocks = 4096 // 8
    waves = math.ceil(blocks / (132 * 2))
    assert f[0] == 1.0 and f[2] == waves
    # K tiles of the waves, not rounded up (blocks over slots: a partial wave reads as fast), each costing
    # more with the rows multiplied; the busiest slot's multiply-adds
    assert f[1] == pytest.approx(blocks / (132 * 2) * (4096 // 512) * (1 + 1 / DECODE_ROWS_PER_READ))
    assert features(member, 1, 1024, 4096, 132)[1] == pytest.approx(4096 // 512 * (1 + 1 / DECODE_ROWS_PER_READ))
    assert f[4] == pytest.approx(waves * 8 * 4096 * 1 / 1e9)
    sixteen = features(member, 16, 4096, 4096, 132)
    assert sixteen[1] / f[1] == pytest.approx((1 + 16 / DECODE_ROWS_PER_READ) / (1 + 1 / DECODE_ROWS_PER_READ))
    assert sixteen[4] == pytest.approx(16 * f[4])
    assert f[3] == pytest.approx(4 * 4096 * (4096 + blocks * 1) / 1e9)  # B once, A's row per block
    assert features(member, 4096, 1, 4096, 132) == f                    # the mirror reads the same
    # 32 rows: two passes over the big operand
    assert features(member, 32, 4096, 4096, 132)[3] == pytest.approx(4 * 4096 * (2 * 4096 + blocks * 32) / 1e9)
    assert serves(member, 16, 9999) and serves(member, 9999, 3) and not serves(member, 17, 17)
    assert serves(MemberShape(128, 128, 32, 1, 1), 99999, 99999)  # other members serve every call
    from gemmgen.library.selection import Model
    assert predict(member, Model([1, 1, 1, 1, 0]), 17, 4096, 4096, 132) == math.inf
    plan = make_plan(load_one(SPECS_DIR / "decode.gemm", "decode"))
    shape = member_shape(plan, 2)
    assert shape.decode and (shape.BM, shape.BN) == (16, plan.mainloop.block_columns)
    assert shape.decode_products == 0


def test_its_tensor_path_costs_no_per_row_reads_and_a_fixed_work_per_product():
    ffma = MemberShape(16, 16, 512, 1, 2, decode=True)
    for products in (1, 3):
        tensor = MemberShape(16, 16, 512, 1, 2, decode=True, decode_products=products)
        for rows in (1, 4, 5, 8, 16):  # every pass on the tensor path
            f, g = features(tensor, rows, 11008, 4096, 132), features(ffma, rows, 11008, 4096, 132)
            waves = math.ceil(11008 / 16 / (132 * 2))
            assert f[1] == pytest.approx(11008 / 16 / (132 * 2) * (4096 // 512))  # no per-row term
            assert f[4] == pytest.approx(waves * 16 * 4096 * DECODE_TENSOR_WORK_ROWS * products / 1e9)
            assert f[:1] + f[2:4] == g[:1] + g[2:4]                              # launch, waves, bytes: the same
    # planned members carry their products into the model, and a manifest's member rebuilds them
    spec = load_one(SPECS_DIR / "decode.gemm", "decode")
    for math_, products in (("simt", 0), ("tf32", 1), ("3xtf32", 3)):
        assert member_shape(make_plan(spec.with_values(math=math_))).decode_products == products
    from gemmgen.library.manifest import ManifestMember
    kept = ManifestMember("m", "k", "p", "dec", "", "sm_90", "3xtf32", 16, 16, 512, 1, 2, True, False, {}, decode=True)
    assert kept.shape.decode_products == 3
    assert ManifestMember.from_dict(kept.to_dict()).shape == kept.shape


def test_a_tf32_library_takes_it(tmp_path):
    shutil.copy(SPECS_DIR / "tensorcore_tf32.gemm", tmp_path)
    (tmp_path / "dl.gemm").write_text(LIBRARY.format(members="tensorcore_tf32, dec", math="simt", precision="tf32"))
    (library,) = load_libraries(tmp_path / "dl.gemm")
    assert library.precision == "tf32"
    assert any(p.path == "decode" for p in library.candidates())


def test_its_tensor_math_must_be_the_librarys_precision(tmp_path):
    shutil.copy(SPECS_DIR / "tensorcore_3xtf32.gemm", tmp_path)
    shutil.copy(SPECS_DIR / "tensorcore_tf32.gemm", tmp_path)
    (tmp_path / "ok.gemm").write_text(LIBRARY.format(members="tensorcore_3xtf32, dec", math="{simt, 3xtf32}",
                                                     precision="fp32"))
    (library,) = load_libraries(tmp_path / "ok.gemm")
    assert {p.math for p in library.candidates() if p.path == "decode"} == {"simt", "3xtf32"}
    (tmp_path / "bad.gemm").write_text(LIBRARY.format(members="tensorcore_3xtf32, dec", math="{simt, tf32}",
                                                      precision="fp32"))
    with pytest.raises(SpecError) as info:
        load_libraries(tmp_path / "bad.gemm")
    assert "member 'dec' mixes math simt, tf32" in info.value.message
    assert info.value.line == 9, info.value.render()  # the library's members line


def test_the_shipped_libraries_have_a_decode_member_and_decode_shapes():
    for name in ("fp32", "tf32"):
        (library,) = load_libraries(SPECS_DIR / f"{name}.gemm")
        decode = [p for p in library.candidates() if p.path == "decode"]
        # 12 FFMA points, and the 7 tensor points whose block is a multiple of 16 columns
        assert len(decode) == 19 and sum(p.math == "simt" for p in decode) == 12
        assert {p.math for p in decode} == {"simt", "3xtf32" if name == "fp32" else "tf32"}
        decode_shapes = [s for s in library.shapes if min(s.M, s.N) <= 16 and s.K * max(s.M, s.N) >= 16 << 20]
        assert len(decode_shapes) >= 4 and any(s.N <= 16 for s in decode_shapes)


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_an_aligned_call_of_few_columns_or_rows_goes_to_a_decode_member_and_others_to_the_models(precision):
    """Both shipped libraries: an aligned call of N up to 16 below M, or of M up to 8 below N, at widths
    never tuned, runs a decode member; with unaligned rows, or 9 to 16 rows, every member may take it
    (decode_call). The tf32 library sent 5x7000x3000 to a tile that ran 0.83x cuBLAS TF32."""
    from gemmgen.library.dispatch import shipped_manifest
    from gemmgen.library.selection import choose, decode_call
    manifest = shipped_manifest(precision)
    candidates, plans = manifest.candidates(), manifest.plans()
    for M, N, K in ((11008, 4, 4096), (14336, 16, 4096), (11008, 16, 4096), (7000, 5, 3000),
                    (5, 7000, 3000), (2, 11008, 4096), (7, 8192, 8192), (8, 14336, 4096)):
        assert decode_call(candidates, M, N, "aligned") and not decode_call(candidates, M, N, "unaligned")
        assert plans[choose(candidates, M, N, K, "aligned", 132, beta_used=False)].path == "decode", (M, N, K)
    assert not decode_call(candidates, 9, 11008, "aligned") and not decode_call(candidates, 16, 4096, "aligned")
    assert not decode_call(candidates, 4096, 17, "aligned")
    assert plans[choose(candidates, 4096, 64, 4096, "aligned", 132, beta_used=False)].path != "decode"


def test_a_fused_call_never_gets_the_decode_member():
    """FusedMembers.plan plans a member with `bias col` and an activation; the decode kernel refuses
    both at their lines, so the fused call passes it over (gemmgen/library/fused.py)."""
    spec = load_one(SPECS_DIR / "decode.gemm", "decode")
    for values in ({"bias": "col"}, {"activation": "gelu"}, {"bias": "col", "activation": "relu"}):
        with pytest.raises(SpecError):
            make_plan(spec.with_values(**values))
    assert make_plan(spec.with_values(bias="none", activation="none")).path == "decode"
