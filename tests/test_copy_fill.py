"""The cp.async-fed wgmma kernels (`stages N copy`, specs/hopper_tf32_copy.gemm and, splitting each
landed tile into TF32 big and small, hopper_3xtf32_copy.gemm) without a GPU:
its plan (one loader warpgroup holding addresses only, no vector requirement on A or B: any leading
dimension), NVRTC's build of every layout without spills, and the loader's placement of a tile's
floats: each exactly once, a warp's copies on 32 different banks (tests/test_gpu_copy.py runs it)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import SPECS_DIR
from gemmgen.gpu.compile import compile_plan
from gemmgen.language.load import load_one
from gemmgen.plan import make_plan
from gemmgen.plan.space import describe

SHIPPED = load_one(SPECS_DIR / "hopper_tf32_copy.gemm", "hopper_tf32_copy")
LAYOUTS = [("row", "col"), ("col", "col"), ("row", "row"), ("col", "row")]


def plan_of(a="row", b="col", **values):
    return make_plan(replace(SHIPPED.with_values(layout_A=a, layout_B=b, **values), name=f"copy_{a}_{b}"))


def test_one_loader_warpgroup_of_addresses_feeds_any_leading_dimension():
    plan = plan_of()
    loop = plan.mainloop
    assert (loop.copies, loop.loaders, loop.consumers, plan.threads) == (True, 1, 2, 384)
    assert loop.loader_registers == 56 and loop.consumer_registers == 224 and loop.fallback is None
    # no fallback: odd leading dimensions and pointers 4 bytes off 16 run the same kernel's variant
    # of 4-byte copies; aligned K-contiguous operands its 16-byte copies
    assert not plan.aligned(517, 390, 263, 263, 263, 392, {"A": 4, "B": 8, "C": 0})
    assert plan.aligned(517, 390, 264, 264, 264, 392, {"A": 0, "B": 0, "C": 0})
    assert "stages=4c" in describe(plan.spec)
    one = plan_of(block_m=64, block_n=128, warp_m=64, warp_n=128, mma_n=128)
    assert (one.mainloop.loaders, one.mainloop.consumers, one.threads) == (1, 1, 256)


@pytest.mark.parametrize("a,b,rows", [(a, b, 128) for a, b in LAYOUTS] + [("col", "row", 64)],
                         ids=lambda x: str(x))
def test_every_layout_builds_without_spills(a, b, rows):
    plan = plan_of(a, b) if rows == 128 else plan_of(a, b, block_m=64, block_n=128, warp_m=64, warp_n=128,
                                                      mma_n=128)
    compiled = compile_plan(plan)
    assert compiled.resources, "no kernel in the cubin"
    for symbol, report in compiled.resources.items():
        assert report.spill_stores == report.spill_loads == 0, (symbol, report)
    assert "cp.async.mbarrier.arrive.noinc" in compiled.ptx and "cp.async.bulk.tensor" not in compiled.ptx


def _swizzled(row: int, k: int) -> int:  # the kernel's swizzled(): TMA's 128-byte swizzle of 32-float rows
    return row * 32 + (((k >> 2) ^ (row & 7)) << 2) + (k & 3)


def _copies(rows: int, k_contiguous: bool, vector: bool = False):
    """(warp instruction, lane, row, k) of every float a cp.async of a rows x 32 tile copies, as
    copy_tile issues them (its index arithmetic, transcribed)."""
    for thread in range(128):
        lane, warp = thread % 32, thread // 32
        if k_contiguous and vector:  # 16 bytes a copy: 4 floats of one row
            for i in range(rows // 16):
                for j in range(4):
                    yield (warp, i), lane, thread // 8 + 16 * i, thread % 8 * 4 + j
        elif k_contiguous:
            for i in range(rows // 4):
                yield (warp, i), lane, warp + 4 * i, lane
        else:
            for j in range(32 // 4):
                for r in range(rows // 32):
                    yield (warp, j, r), lane, warp * 8 + lane % 8 + 32 * r, lane // 8 + 4 * j


@pytest.mark.parametrize("rows", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("k_contiguous,vector", [(True, False), (True, True), (False, False)])
def test_the_loader_places_every_float_once_and_a_warps_copies_on_32_banks(rows, k_contiguous, vector):
    placed, banks = {}, {}
    for instruction, lane, row, k in _copies(rows, k_contiguous, vector):
        assert (row, k) not in placed, f"({row}, {k}) copied twice"
        placed[(row, k)] = _swizzled(row, k)
        banks.setdefault(instruction, []).append(_swizzled(row, k) % 32)
    assert set(placed) == {(r, k) for r in range(rows) for k in range(32)}
    assert sorted(set(placed.values())) == list(range(rows * 32))  # a permutation of the tile's places
    # each bank as often as any other in a warp's copy: 1 wavefront of 32 floats (16-byte copies: 4)
    assert all(sorted(set(b)) == list(range(32)) and len(b) == 32 * b.count(b[0]) for b in banks.values())


def _split_places(rows: int, k_contiguous: bool, vector: bool):
    """(thread, place) of every float split_copied (3xtf32) splits in place, its index arithmetic
    transcribed."""
    for thread in range(128):
        lane, warp = thread % 32, thread // 32
        if k_contiguous and vector:
            at = _swizzled(thread // 8, thread % 8 * 4)
            for i in range(rows // 16):
                for j in range(4):
                    yield thread, at + i * 16 * 32 + j
        elif k_contiguous:
            even, odd = _swizzled(warp, lane), _swizzled(warp + 4, lane) - 4 * 32
            for i in range(rows // 4):
                yield thread, (odd if i % 2 else even) + i * 4 * 32
        else:
            row, k0 = warp * 8 + lane % 8, lane // 8
            for j in range(32 // 4):
                for r in range(rows // 32):
                    yield thread, _swizzled(row, k0 + 4 * j) + r * 32 * 32


@pytest.mark.parametrize("rows", [64, 128, 256])
@pytest.mark.parametrize("k_contiguous,vector", [(True, False), (True, True), (False, False)])
def test_3xtf32_splits_exactly_the_floats_each_thread_copied(rows, k_contiguous, vector):
    """A loader thread waits for its own copies only (cp.async.wait_group), so it may split exactly
    the floats it copied: each place once, by the thread that copied it."""
    copied = {(instruction[0] * 32 + lane, _swizzled(row, k))
              for instruction, lane, row, k in _copies(rows, k_contiguous, vector)}
    written = list(_split_places(rows, k_contiguous, vector))
    assert len(written) == len(set(written)) == rows * 32
    assert set(written) == copied


THREE = load_one(SPECS_DIR / "hopper_3xtf32_copy.gemm", "hopper_3xtf32_copy")


def test_3xtf32_copies_keep_the_split_tiles_beside_each_other_one_tile_behind():
    plan = make_plan(THREE)
    loop = plan.mainloop
    assert (loop.copies, loop.math, loop.stages, loop.loader_depth) == (True, "3xtf32", 3, 1)
    assert plan.smem_bytes >= 3 * 2 * 4 * 32 * (128 + 128)  # each stage: the tiles, then their remainders
    assert make_plan(THREE.with_values(block_m=64, warp_m=64, stages=4)).mainloop.loader_depth == 2


@pytest.mark.parametrize("a,b", LAYOUTS, ids=lambda x: str(x))
def test_3xtf32_builds_without_spills_in_every_layout(a, b):
    plan = make_plan(replace(THREE.with_values(layout_A=a, layout_B=b), name=f"copy3_{a}_{b}"))
    compiled = compile_plan(plan)
    for symbol, report in compiled.resources.items():
        assert report.spill_stores == report.spill_loads == 0, (symbol, report)
    assert "cp.async.wait_group" in compiled.ptx and "cp.async.mbarrier.arrive" not in compiled.ptx
    assert "cvt.rna.tf32.f32" in compiled.ptx  # big parts rounded to nearest, as the register-fed loaders
