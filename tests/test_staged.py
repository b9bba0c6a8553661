"""The wgmma staged epilogue (`epilogue ... staged` on the TMA kernels): the spec line, its search
set and its errors at the line; the boxes' shared-memory layout against TMA's swizzle (what TMA
reads must be what the warp wrote, element for element); the generated kernel and launcher; what
`explain`, the header and the runtime's alignment test say. GPU results: tests/test_gpu_staged.py."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import SPECS_DIR
from gemmgen.codegen.cuda import derived_numbers, generate
from gemmgen.language.errors import SpecError
from gemmgen.explain.analysis import global_accesses
from gemmgen.plan import make_plan
from gemmgen.plan.space import describe, expand, to_text
from gemmgen.language.load import load_one, parse

KERNEL = """kernel k {{
  target   sm_90a
  layout   A row, B col, C {c}
  block    {bm} x {bn} x 32
  math     {math}
  stages   {stages} {fill}{extra}
  epilogue alpha beta {how}
}}
"""


def spec_of(how="staged", c="row", bm=128, bn=256, math="tf32", stages=4, fill="tma", extra=""):
    (spec,) = parse(KERNEL.format(how=how, c=c, bm=bm, bn=bn, math=math, stages=stages, fill=fill, extra=extra))
    return spec


def error_of(**settings) -> str:
    with pytest.raises(SpecError) as error:
        make_plan(spec_of(**settings))
    return str(error.value)


# --- the spec line ----------------------------------------------------------------------------

def test_staged_is_a_setting_and_a_search_set():
    assert make_plan(spec_of("staged")).tma_store
    assert not make_plan(spec_of("direct")).tma_store
    (space,) = parse(KERNEL.format(how="{direct, staged}", c="row", bm=128, bn=256, math="tf32", stages=4,
                                   fill="tma", extra=""))
    assert [p["epilogue.staged"] for p in space.points()] == [False, True]
    assert describe(spec_of("staged")).endswith(" staged") and "staged" not in describe(spec_of("direct"))
    assert "  epilogue alpha beta staged\n" in to_text(spec_of("staged"))
    assert "  epilogue alpha beta\n" in to_text(spec_of("direct"))


def test_the_frontier_search_space_holds_every_buildable_mix():
    """specs/hopper_frontier_search.gemm: schedules x clusters x staged, what the Plan cannot build dropped."""
    space = expand(load_one(SPECS_DIR / "hopper_frontier_search.gemm"))
    mixes = {(p.schedule, p.cluster_blocks, p.tma_store) for p in space.plans}
    assert mixes == {(schedule, blocks, staged) for schedule in ("data-parallel", "persistent", "stream-k")
                     for blocks in (1, 2) for staged in (False, True)
                     if blocks == 1 or schedule != "stream-k"}
    assert space.total == 48 and space.valid == 40


def test_an_unknown_store_is_an_error_at_the_set():
    with pytest.raises(SpecError) as error:
        spec_of("{direct, tma}")
    text = str(error.value)
    assert "<spec>:7:23" in text and "unknown epilogue store 'tma'" in text and "staged or direct" in text


def test_the_register_fed_kernel_has_no_staged_epilogue():
    text = error_of(fill="async", bn=128)
    assert "<spec>:7:23" in text and "loader warpgroups have no TMA" in text


def test_split_k_and_staged_is_an_error():
    text = error_of(extra="\n  split    2")
    assert "<spec>:8:23" in text and "a TMA store would overwrite the other slices' sums" in text


def test_the_boxes_count_in_shared_memory():
    plain, staged = make_plan(spec_of("direct")), make_plan(spec_of("staged"))
    assert staged.smem_bytes - plain.smem_bytes == 2 * 4 * 2 * 16 * 32 * 4  # warps x buffers x box
    text = error_of(stages=5)
    assert "<spec>:6:12" in text and "the staged epilogue's 32768" in text and "stages 4 or fewer" in text


# --- the boxes' layout is TMA's swizzle ----------------------------------------------------------

def _tma_offset(outer: int, inner: int, row_floats: int) -> int:
    """Where TMA's swizzle of rows of `row_floats` floats puts (outer, inner), in floats: the
    16-byte chunk bits [4, 4 + b) of the address XOR bits [7, 7 + b), b = log2(row bytes / 16)."""
    address = 4 * (outer * row_floats + inner)
    mask = (4 * row_floats) // 16 - 1
    return (address ^ (((address >> 7) & mask) << 4)) // 4


@pytest.mark.parametrize("c, bn", [("row", 256), ("row", 80), ("row", 72), ("col", 256), ("col", 72)])
def test_the_box_index_is_tmas_swizzle(c, bn):
    plan = make_plan(spec_of(c=c, bm=64, bn=bn))
    outer, inner = plan.c_box_outer, plan.c_box_inner
    assert outer * inner == 16 * (inner if c == "row" else outer)   # 16 rows of C per warp
    assert plan.c_box_swizzle == 4 * inner in (32, 64, 128)
    expression = plan.c_box_index("o + v", "i")  # C and Python agree on these operators' precedence
    seen = set()
    for o in range(outer):
        for i in range(inner):
            offset = eval(expression, {"o": o, "v": 0, "i": i})
            assert offset == _tma_offset(o, i, inner), (o, i)
            seen.add(offset)
    assert seen == set(range(outer * inner))


def _wavefronts(addresses: list[int], width: int) -> int:
    """Shared-memory wavefronts of one warp's store of `width` floats per lane at these float
    offsets: 64-bit stores go a half-warp at a time; each bank serves one 4-byte word a wavefront."""
    lanes_per_phase = 16 if width == 2 else 32
    total = 0
    for phase in range(0, 32, lanes_per_phase):
        banks: dict[int, set[int]] = {}
        for offset in addresses[phase:phase + lanes_per_phase]:
            for word in range(offset, offset + width):
                banks.setdefault(word % 32, set()).add(word)
        total += max(len(words) for words in banks.values())
    return total


@pytest.mark.parametrize("c", ["row", "col"])
def test_a_warps_box_writes_take_the_fewest_wavefronts(c):
    """The store order the template uses (odd rows swap groups 0, 1 with 2, 3 in C row; odd t swap
    their two columns in C col), evaluated on the Plan's box index: no bank conflicts."""
    plan = make_plan(spec_of(c=c, bn=256 if c == "row" else 128))
    for j8 in range(4):
        for i in range(2):
            if c == "row":
                offsets = []
                for lane in range(32):
                    group = j8 ^ 2 if lane // 4 % 2 else j8
                    offsets.append(eval(plan.c_box_index("row", "col"),
                                        {"row": lane // 4 + 8 * i, "col": group * 8 + lane % 4 * 2}))
                assert _wavefronts(offsets, 2) == 2        # 256 bytes: two 128-byte wavefronts
            else:
                for v in range(2):
                    offsets = [eval(plan.c_box_index("n_box", "row"),
                                    {"row": lane // 4 + 8 * i,
                                     "n_box": j8 * 8 + lane % 4 * 2 + (1 - v if lane % 2 else v)})
                               for lane in range(32)]
                    assert _wavefronts(offsets, 1) == 1


def test_without_the_swaps_the_writes_would_conflict():
    """What the swaps buy (and that the wavefront count above can fail)."""
    plan = make_plan(spec_of())
    offsets = [eval(plan.c_box_index("row", "col"), {"row": lane // 4, "col": lane % 4 * 2}) for lane in range(32)]
    assert _wavefronts(offsets, 2) == 4


# --- the generated kernel ----------------------------------------------------------------------

@pytest.mark.parametrize("extra", ["", "\n  schedule persistent", "\n  schedule stream-k", "\n  cluster  2 x 1"])
def test_the_kernel_stores_boxes_with_tma_where_aligned(extra):
    source = generate(make_plan(spec_of(extra=extra)))
    assert "const __grid_constant__ TensorMap map_c" in source
    assert "if (ALIGNED) {  // C and ldc 16-byte aligned: through shared memory and TMA" in source
    assert "tma_store(&map_c, box, block_n0 + box_n * C_BOX_N, block_m0 + warp_m0);" in source
    assert "tma_store_wait_read<C_BUFFERS - 1>();" in source and "fence_shared_for_tma();" in source
    assert "if (ALIGNED && lane == 0) tma_store_wait_read<0>();" in source
    assert "CU_TENSOR_MAP_SWIZZLE_128B,\n                                       CU_TENSOR_MAP_L2_PROMOTION_NONE" in source
    assert "const cuuint32_t box[2] = {32, 16};" in source


def test_column_major_c_is_stored_along_m():
    source = generate(make_plan(spec_of(c="col", bn=128)))
    assert "tma_store(&map_c, box, block_m0 + warp_m0, block_n0 + box_n * C_BOX_N);" in source
    assert "const cuuint32_t box[2] = {16, 32};" in source and "CU_TENSOR_MAP_SWIZZLE_64B" in source


def test_a_kernel_without_staged_is_unchanged():
    source = generate(make_plan(spec_of("direct")))
    assert "map_c" not in source and "tma_store" not in source and "sC" not in source


def test_the_fast_path_needs_c_ldc_and_cs_width_aligned():
    """TMA clips a stored box at C's contiguous edge only to 16 bytes (N = 13, ldc = 16 wrote
    columns 13-15 on an H100): C's width must be a multiple of 4 too; its height may be anything."""
    plan = make_plan(spec_of())
    assert plan.vector_requirements() == [("C", "N", "ldc", 4)]
    pointers = {"A": 0, "B": 0, "C": 4096}
    assert plan.aligned(1001, 1004, 999, 1000, 1000, 1004, pointers)          # odd M: TMA clips rows
    assert not plan.aligned(1001, 1003, 999, 1000, 1000, 1004, pointers)      # N
    assert not plan.aligned(1001, 1004, 999, 1000, 1000, 1003, pointers)      # ldc
    assert not plan.aligned(1001, 1004, 999, 1000, 1000, 1004, {**pointers, "C": 4100})
    source = generate(plan)
    assert "(N % 4 == 0 && ldc % 4 == 0 && reinterpret_cast<unsigned long long>(C) % 16 == 0)" in source
    rows = dict(derived_numbers(plan))
    assert rows["TMA store path needs"] == "N and ldc multiples of 4, C 16-byte aligned"
    assert "boxes of 16 x 32 floats (2 in turn, 128-byte swizzle)" in rows["epilogue"]


def test_explain_shows_whole_sectors():
    access = global_accesses(make_plan(spec_of()))[-1]  # C's store, after the (TMA) loads
    assert access.how == "TMA, 16 x 32 box" and access.efficiency == 100.0 and access.sectors == 64


@pytest.mark.parametrize("math, bn, stages, c", [("tf32", 256, 4, "row"), ("3xtf32", 128, 2, "col")])
def test_a_staged_kernel_compiles_in_a_multi_architecture_build(math, bn, stages, c, tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    source = tmp_path / "staged.cu"
    source.write_text(generate(make_plan(spec_of(math=math, bn=bn, stages=stages, c=c,
                                                 extra="\n  schedule persistent"))))
    done = subprocess.run([nvcc, "-c", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
                           "-gencode=arch=compute_80,code=sm_80", "-o", str(tmp_path / "staged.o"), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("extra, math, bn, stages", [("\n  schedule persistent", "tf32", 256, 4),
                                                     ("\n  schedule stream-k", "tf32", 256, 4),
                                                     ("\n  schedule persistent", "3xtf32", 128, 2)])
def test_the_staged_kernels_keep_everything_in_registers(extra, math, bn, stages):
    """No local memory: an accumulator picked through a run-time index or pointer (as a first
    conflict-free store order did) sends arrays to the stack, and the epilogue ran 20% slower."""
    pytest.importorskip("cuda.bindings")
    from gemmgen.gpu.compile import compile_plan
    compiled = compile_plan(make_plan(spec_of(extra=extra, math=math, bn=bn, stages=stages)), use_cache=False)
    assert ".local" not in compiled.ptx
    assert all(r.spill_stores == 0 for r in compiled.resources.values())
