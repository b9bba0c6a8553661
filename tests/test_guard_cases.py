"""The guard-cell case matrix of test_gpu_guard.py, checked without a GPU: it reaches every shipped
kernel, library member and entry point; its calls take every remainder of M, N and K modulo the
target's tile and modulo 4, under each placement and beta; its leading dimensions lie past the width
(multiples of 4 and not) and its pointers both 16-byte aligned and one float off, so that each
kernel's vector and scalar paths (TMA and fallback, TMA-stored C and C from registers) are taken;
issue 25's held-out calls are there exactly, on the path where they failed; and C's guard cells reach
a tile past its end."""

from __future__ import annotations

import json

import pytest

import guard_cases
from conftest import GENERATED_DIR

TARGETS = guard_cases.targets()
BY_NAME = {target.name: target for target in TARGETS}
LIBRARIES = [p for p in ("fp32", "tf32") if (GENERATED_DIR / f"{p}.json").is_file()]
ISSUE_25 = {(1, 1, 1, 4), (7, 13, 5, 16), (33, 65, 17, 68), (333, 129, 4097, 132), (333, 129, 4097, 136),
            (4096, 1, 257, 4), (255, 257, 1, 260)}
BASE = 1 << 20  # a buffer's address: CuPy's allocations are 256-byte aligned

by_target = pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])


def _pointers(target, case) -> dict[str, int]:
    where = guard_cases.placements(target, case)
    return {name: guard_cases.pointer(where[name], BASE) for name in "ABC"}


def _plan_paths(plan, case, pointers) -> tuple[bool, bool]:
    """(vector variant, TMA loads) as the launcher decides them for this call."""
    M, N, K = case.M, case.N, case.K
    return (plan.aligned(M, N, K, case.lda, case.ldb, case.ldc, pointers),
            plan.path == "wgmma" and plan.mainloop.tma_ready(M, N, K, case.lda, case.ldb, pointers))


def test_every_generated_kernel_and_library_is_a_target():
    kernels = {t.name for t in TARGETS if t.kind == "kernel"}
    shipped = {path.stem for path in GENERATED_DIR.glob("*.cu")}
    assert shipped == kernels | set(LIBRARIES), (
        f"generated/*.cu without a target: {sorted(shipped - kernels - set(LIBRARIES))}; "
        f"targets without a generated .cu: {sorted(kernels - shipped)}")
    for precision in LIBRARIES:
        manifest = json.loads((GENERATED_DIR / f"{precision}.json").read_text())
        names = [m["name"] for m in manifest["members"]]
        members = [t for t in TARGETS if t.kind == "member" and t.library == precision]
        assert [(t.name, t.index) for t in members] == [(n, i) for i, n in enumerate(names)]
        entry = BY_NAME[f"library_{precision}"]
        assert entry.kind == "library" and entry.members == tuple(names) and len(entry.plans) == len(names)
    for target in TARGETS:
        assert target.source.is_file(), target.source


@by_target
def test_held_out_calls_are_issue_25s_with_tma_loads(target):
    cases = guard_cases.held_out(target)
    assert {(c.M, c.N, c.K, c.ldc - c.N) for c in cases} == {(M, N, K, ldc - N) for M, N, K, ldc in ISSUE_25}
    assert {c.beta for c in cases} == ({-0.5, 0.0} if target.beta else {0.0})
    assert len(cases) == len(ISSUE_25) * (2 if target.beta else 1)
    assert all(c.alpha == 0.75 and c.offsets == (0, 0, 0) for c in cases)
    if target.layouts["C"] == "row":
        assert {(c.M, c.N, c.K, c.ldc) for c in cases} == ISSUE_25
    for plan in target.plans if target.kind != "library" else ():
        if plan.tma_store:  # where the staged kernels wrote outside C: TMA loads, and C stored by TMA
            for case in cases:  # only where N is a multiple of 4 (TMA clips a box to 16 bytes at C's edge)
                assert _plan_paths(plan, case, _pointers(target, case)) == (case.N % 4 == 0, True), case


@by_target
def test_sweep_takes_every_remainder_of_the_tile_and_of_4(target):
    cases = guard_cases.sweep(target)
    for size, tile in zip("MNK", target.tile):
        values = [getattr(c, size) for c in cases]
        assert {v % tile for v in values} == set(range(tile)), f"{size} mod {tile}"
        assert {v % 4 for v in values} == set(range(4)), f"{size} mod 4"
    assert any(c.K == 0 for c in cases)
    assert min(min(c.M, c.N) for c in cases) >= 1 and min(c.K for c in cases) >= 0


@by_target
def test_each_placement_and_beta_meets_every_remainder_mod_4(target):
    cases = guard_cases.sweep(target)
    betas = {-0.5, 0.0} if target.beta else {0.0}
    for mode, _, _ in guard_cases.MODES:
        for beta in betas:
            chosen = [c for c in cases if c.mode == mode and c.beta == beta]
            assert {c.M % 4 for c in chosen} == set(range(4)), (mode, beta, "M")
            assert {c.N % 4 for c in chosen} == set(range(4)), (mode, beta, "N")


@by_target
def test_leading_dimensions_lie_past_the_width_and_pointers_both_aligned_and_not(target):
    cases = guard_cases.sweep(target)
    for case in cases + guard_cases.held_out(target):
        for name in "ABC":
            width = guard_cases.width(name, target.layouts[name], case.M, case.N, case.K)
            assert case.lds[name] > width, (case, name)
        for plan in target.plans:
            assert plan.argument_error(case.M, case.N, case.K, case.lda, case.ldb, case.ldc) is None, case
    for name in "ABC":
        assert {case.lds[name] % 4 == 0 for case in cases} == {True, False}, name
        assert {_pointers(target, case)[name] % 16 == 0 for case in cases} == {True, False}, name
        assert {case.offset[name] for case in cases} == {0, 1}, name


@by_target
def test_sweep_takes_each_path_of_the_launcher(target):
    """Vector and scalar variants (wgmma: TMA loads and the fallback; a staged epilogue: C stored by
    TMA with each beta where N is a multiple of 4, and from registers at every other remainder)."""
    if target.kind == "library":
        pytest.skip("an entry point's paths are its members'")
    plan = target.plan
    cases = guard_cases.sweep(target)
    paths = [(case, *_plan_paths(plan, case, _pointers(target, case))) for case in cases]
    if plan.vector_requirements():
        assert {vector for _, vector, _ in paths} == {True, False}
    if plan.path == "wgmma":
        assert {tma for _, _, tma in paths} == {True, False}
    if plan.tma_store:
        stored = [case for case, vector, tma in paths if vector and tma]
        assert {c.N % 4 for c in stored} == {0}
        assert {c.beta for c in stored} == {-0.5, 0.0}
        beside = [case for case, vector, tma in paths
                  if tma and not vector and case.ldc % 4 == 0 and case.offsets[2] == 0]
        assert {c.N % 4 for c in beside} == {1, 2, 3}  # ldc aligned but C's edge not: from registers
        assert any(tma and not vector for _, vector, tma in paths)


@by_target
def test_guard_cells_reach_a_tile_past_each_matrix(target):
    BM, BN, _ = target.tile
    for case in guard_cases.sweep(target)[:8] + guard_cases.held_out(target):
        for name, where in guard_cases.placements(target, case).items():
            assert where.start >= 1 and where.ld == case.lds[name]
            tail = where.size - where.end
            assert tail >= max(BM, BN) * where.ld + max(BM, BN), (case, name)


@by_target
def test_case_count_stays_compact(target):
    BM, BN, BK = target.tile
    assert len(guard_cases.sweep(target)) <= max(BM, BN, BK, guard_cases.SWEEP_MIN) + 2
    assert len(guard_cases.held_out(target)) <= 2 * len(ISSUE_25)


def test_a_guard_cell_is_described_by_where_it_lies():
    where = guard_cases.Placement(lines=3, length=5, ld=8, start=17, size=17 + 24 + 100)
    assert guard_cases.describe_cell(where, 15) == "2 float(s) before C's first element"
    assert guard_cases.describe_cell(where, 17 + 8 + 6) == "line 1, float 6 of C (between C's width 5 and its ld 8)"
    assert guard_cases.describe_cell(where, 17 + 24 + 1) == "line 3, float 1 of C (past C's last line)"
