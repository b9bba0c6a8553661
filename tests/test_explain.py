"""gemmgen explain: occupancy, intensity and bank-conflict predictions, checked by hand.

Most tests hand explain() a ptxas report built here (Resources, or a Compiled holding one), so
that they check the arithmetic, not whichever register count the installed NVRTC produces. One
test compiles for real.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gemmgen.codegen.cuda import kernel_name_expressions
from gemmgen.gpu.compile import Compiled, Resources
from gemmgen.explain.analysis import (bank_conflicts, bank_wavefronts, global_accesses, occupancy,
                                      registers_per_warp, sectors_touched, smem_offset)
from gemmgen.explain.report import as_dict, explain, render_text
from gemmgen.plan import ARCHS, make_plan, try_plan
from gemmgen.language.load import load, load_one

SPECS = Path(__file__).resolve().parent.parent / "specs"


def plan_of(name: str, **values):
    spec = load_one(SPECS / f"{name}.gemm")
    return make_plan(spec.with_values(**values) if values else spec)


def resources(registers: int, spill_stores: int = 0, spill_loads: int = 0,
              stack_frame: int = 0, shared_static: int = 0) -> Resources:
    return Resources(registers, spill_stores, spill_loads, stack_frame, shared_static)


def fake_compiled(plan, aligned: Resources, unaligned: Resources) -> Compiled:
    names = kernel_name_expressions(plan)
    lowered = {names[True]: "_Z7alignedv", names[False]: "_Z9unalignedv"}
    return Compiled(plan.arch.name, b"", "", lowered,
                    {"_Z7alignedv": aligned, "_Z9unalignedv": unaligned}, "", "test")


def access(plan, label: str):
    return next(a for a in bank_conflicts(plan) if a.label == label)


# --- the bank model on single requests -------------------------------------------------

def test_scalar_requests_broadcast_and_conflict():
    assert bank_wavefronts(list(range(32)), 1) == (1, 1)             # one word per bank
    assert bank_wavefronts([7] * 32, 1) == (1, 1)                    # one word, broadcast
    assert bank_wavefronts([32 * lane for lane in range(32)], 1) == (32, 32)  # a column
    assert bank_wavefronts([2 * lane for lane in range(32)], 1) == (2, 2)     # stride 2
    # Two lanes on the same word of a bank are one access; a third word there is a conflict.
    assert bank_wavefronts([0, 0, 32] + list(range(1, 30)), 1) == (2, 2)
    assert bank_wavefronts([None] * 31 + [5], 1) == (1, 1)


def test_vector_requests_split_into_phases():
    # float4: 4 phases of 8 lanes; consecutive vectors fill a phase's 32 banks exactly.
    assert bank_wavefronts([4 * lane for lane in range(32)], 4) == (4, 1)
    # float4 at a stride of 8 floats: lanes 0 and 4 of each phase share banks.
    assert bank_wavefronts([8 * lane for lane in range(32)], 4) == (8, 2)
    # float4, 8 lanes of a phase on 2 vectors: broadcast, no conflict.
    assert bank_wavefronts([4 * (lane // 4 % 2) for lane in range(32)], 4) == (4, 1)
    # float2: 2 phases of 16 lanes.
    assert bank_wavefronts([2 * lane for lane in range(32)], 2) == (2, 1)
    assert bank_wavefronts([64 * lane for lane in range(32)], 2) == (32, 16)
    with pytest.raises(ValueError):
        bank_wavefronts([0] * 32, 3)


def test_index_expressions_are_evaluated_as_the_templates_use_them():
    plan = plan_of("bank_swizzle")            # sA[k][m], 128 floats per row, XOR-swizzled
    assert smem_offset(plan.a, {"m": 5, "k": 0}) == 5
    assert smem_offset(plan.a, {"m": 5, "k": 3}) == 3 * 128 + (5 ^ (3 << 2))
    plan = plan_of("warptile")                # sA[k][m] padded to 132
    assert smem_offset(plan.a, {"m": 7, "k": 2}) == 2 * 132 + 7
    assert smem_offset(plan.b, {"k": 2, "n": 7}) == 2 * 128 + 7


# --- predicted conflicts of real specs -------------------------------------------------

def test_transposed_scalar_stores_of_a_128_wide_row_conflict_until_padded_or_swizzled():
    # padded_transposed: A (128 x 8, row-major) read 1 float at a time, stored as sA[k][m].
    # A warp's 32 lanes cover m = 0..3 and k = 0..7; unpadded, all 8 k rows of one m share a bank.
    plain = plan_of("padded_transposed", shared_A="plain", shared_A_pad=0)
    store = access(plain, "A store")
    assert (store.width_bytes, store.requests, store.phases) == (4, 4, 1)
    assert store.degree == 8 and store.wavefronts_per_request == 8
    padded = access(plan_of("padded_transposed"), "A store")              # pad 4 as written
    swizzled = access(plan_of("padded_transposed", shared_A="swizzle", shared_A_pad=0), "A store")
    assert padded.degree == swizzled.degree == 1
    assert padded.wavefronts_per_request == swizzled.wavefronts_per_request == 1
    # pad 1 helps less: bank (k + m) % 32 puts 4 of the (m, k) pairs on one bank.
    assert access(plan_of("padded_transposed", shared_A_pad=1), "A store").degree == 4


def test_float4_transposed_stores_two_way_until_padded_or_swizzled():
    # vectorized: each lane stores 4 floats of A to 4 k rows; lanes 2t and 2t+1 hit k and k+4
    # of the same m, 4 rows of 128 floats apart: the same bank.
    assert access(plan_of("vectorized"), "A store").degree == 2
    assert access(plan_of("vectorized", shared_A="pad", shared_A_pad=4), "A store").degree == 1
    assert access(plan_of("bank_swizzle"), "A store").degree == 1
    assert access(plan_of("bank_swizzle"), "A store").requests == 4   # 1 pass x 4 floats


def test_warptile_pad_4_leaves_a_two_way_conflict_with_16_k_rows():
    # BK = 16: a warp's transposed stores reach k = 0, 4, 8, 12; with rows of 132 floats, k and
    # k + 8 land 8 * 132 = 1056 = 33 * 32 floats apart: the same banks.
    plan = plan_of("warptile")
    store = access(plan, "A store")
    assert (store.degree, store.requests) == (2, 16)     # 4 passes x 4 floats
    assert access(plan, "B store").how == "float4"
    assert access(plan, "B store").degree == 1
    # Rows 4 k apart must start 8 banks apart: pad 2 does it, but 130-float rows are not
    # float4-aligned, so the fragments of A fall back to scalar loads (themselves 2-way).
    pad2 = plan_of("warptile", shared_A_pad=2)
    assert access(pad2, "A store").degree == 1
    assert access(pad2, "A fragment").how == "scalar"
    assert access(pad2, "A fragment").degree == 2
    # pad 8 and the XOR swizzle (which permutes by k % 32) both leave k = 0 and k = 8 together.
    assert access(plan_of("warptile", shared_A_pad=8), "A store").degree == 4
    assert access(plan_of("warptile", shared_A="swizzle", shared_A_pad=0), "A store").degree == 2


def test_fragment_loads_follow_the_thread_order():
    # Warp tile 64 x 64 as 8 x 4 lanes of 8 x 4 values. Order n: a phase of 8 lanes reads
    # 2 distinct float4 of A; order m: 8 of them, 8 floats apart, so lanes 0 and 4 collide.
    by_n = plan_of("warptile")
    by_m = plan_of("warptile", order="m")
    for plan in (by_n, by_m):
        frag = access(plan, "A fragment")
        assert (frag.width_bytes, frag.requests, frag.phases) == (16, 2, 4)
    assert access(by_n, "A fragment").degree == 1
    assert access(by_m, "A fragment").degree == 2
    assert access(by_m, "A fragment").wavefronts_per_request == 8
    assert access(by_m, "B fragment").degree == 1      # 8 lanes on one float4 of B: broadcast
    assert access(by_n, "B fragment").requests == 4    # repeat 4 along N x one float4


def test_unpadded_b_rows_conflict_in_block_tiled_fragments():
    # vectorized: 16 x 16 threads of 8 x 8; a phase's 8 lanes read float4 at n = 0, 8, ..., 56.
    frag = access(plan_of("vectorized"), "B fragment")
    assert frag.degree == 2 and frag.wavefronts_per_request == 8


def test_cp_async_stores_are_described():
    plan = plan_of("pingpong_async")
    b_store, a_store = access(plan, "B store"), access(plan, "A store")
    assert (b_store.how, b_store.width_bytes, b_store.degree) == ("cp.async", 16, 1)
    assert (a_store.how, a_store.width_bytes) == ("cp.async, transposed", 4)


# --- occupancy -------------------------------------------------------------------------

def test_register_allocation_rounds_to_256_per_warp():
    assert registers_per_warp(32) == 1024
    assert registers_per_warp(33) == 1280       # 1056 → 1280
    assert registers_per_warp(100) == 3328      # 3200 → 13 x 256
    assert registers_per_warp(255) == 8192


def test_occupancy_by_hand_for_warptile():
    plan = plan_of("warptile")                  # 128 threads, 16640 bytes of shared memory
    sm90 = ARCHS["sm_90"]
    occ = occupancy(plan, resources(100))
    assert occ.by_threads == 2048 // 128 == 16
    assert occ.by_registers == 65536 // (3328 * 4) == 4
    assert occ.shared_per_block == 16640 + sm90.smem_reserved
    assert occ.by_shared_memory == 233472 // 17664 == 13
    assert occ.by_blocks == 32
    assert (occ.blocks, occ.limited_by) == (4, ("registers",))
    assert (occ.warps_per_sm, occ.max_warps_per_sm) == (16, 64)
    assert occ.percent == 25.0
    report = explain(plan, resources(100))
    assert report.summary == ("occupancy is limited by registers: 4 blocks of 128 threads "
                              "(16 warps/SM, 25.0%)")


def test_occupancy_limited_by_shared_memory_and_by_blocks():
    # Two cp.async stages double the shared tiles: 33280 + 1024 bytes per block, 6 per SM.
    plan = plan_of("warptile", stages=2, stages_fill="async")
    occ = occupancy(plan, resources(32))
    assert occ.by_shared_memory == 233472 // 34304 == 6
    assert (occ.blocks, occ.limited_by) == (6, ("shared memory",))
    # Blocks of 64 threads on sm_86: 24 by threads, 32 by registers, 100 by the reserve alone.
    plan = plan_of("naive", target="sm_86", block_n=2)
    occ = occupancy(plan, resources(32))
    assert (occ.by_threads, occ.by_registers, occ.by_shared_memory) == (24, 32, 100)
    assert (occ.blocks, occ.limited_by) == (16, ("blocks",))
    assert occ.warps_per_sm == 32 and round(occ.percent, 2) == 66.67


def test_static_shared_memory_counts_against_the_sm():
    plan = plan_of("warptile", stages=2, stages_fill="async")
    assert occupancy(plan, resources(32, shared_static=4096)).by_shared_memory == 233472 // 38400


def test_too_many_registers_for_one_block():
    plan = plan_of("naive")                     # 1024 threads
    report = explain(plan, resources(72))       # 2304 per warp x 32 warps > 65536
    assert report.occupancy.blocks == 0
    assert report.occupancy.limited_by == ("registers",)
    assert report.summary.startswith("the kernel cannot launch")


def test_naive_spec():
    plan = plan_of("naive")
    report = explain(plan, resources(30))
    assert (report.threads, report.warps) == (1024, 32)
    assert report.smem_bytes == 0 and report.bank_conflicts == ()
    assert report.shared_intensity is None
    occ = report.occupancy
    assert occ.by_threads == 2 and occ.blocks == 2
    assert "threads" in occ.limited_by and "shared memory" not in occ.limited_by
    assert occ.percent == 100.0
    g = report.global_intensity                 # per thread: 2 x 1 x 1 flops over 2 floats
    assert (g.flops, g.bytes, g.value) == (2, 8, 0.25)
    assert "per thread" in g.scope


def test_intensity_of_warptile():
    report = explain(plan_of("warptile"), resources(128))
    g, s = report.global_intensity, report.shared_intensity
    assert (g.flops, g.bytes) == (2 * 128 * 128 * 16, (128 * 16 + 16 * 128) * 4)
    assert g.value == 32.0
    assert (s.flops, s.bytes) == (2 * 8 * 4 * 1 * 4, (8 * 1 + 4 * 4) * 4)
    assert report.fp32_lanes_per_sm == 128


# --- the report ------------------------------------------------------------------------

def test_explain_reads_the_aligned_variant_of_a_compile():
    plan = plan_of("vectorized")
    compiled = fake_compiled(plan, resources(96, stack_frame=16), resources(200))
    report = explain(plan, compiled)
    assert (report.registers, report.stack_frame) == (96, 16)
    assert report.registers_estimate == plan.registers_estimate


def test_notes_for_spills_requested_occupancy_and_conflicts():
    plan = plan_of("vectorized", occupancy=2)
    report = explain(plan, resources(130, spill_stores=8, spill_loads=12))
    assert report.spills and report.occupancy.blocks == 1
    notes = "\n".join(report.notes)
    assert "8 bytes stored, 12 bytes loaded" in notes
    assert "asks for 2 blocks per SM" in notes and "only 1 fit" in notes
    assert "A store (scalar, transposed) is a 2-way bank conflict" in notes


def test_render_text_has_the_key_lines_in_aligned_columns():
    text = render_text(explain(plan_of("padded_transposed", shared_A="plain", shared_A_pad=0),
                               resources(100)))
    lines = text.splitlines()
    assert lines[0] == "padded_transposed on sm_90"
    assert any(line.split() == ["tiling", "block", "128x128x8,", "thread", "8x8"] for line in lines)
    assert any(line.split()[:4] == ["registers", "per", "thread", "100"] for line in lines)
    assert "Occupancy is limited by registers: 2 blocks of 256 threads (16 warps/SM, 25.0%)." in text
    assert "FP32 peak" in text and "128 FFMA lanes per SM" in text
    store = next(line for line in lines if line.lstrip().startswith("A store"))
    assert store.split()[-3:] == ["8", "1", "8-way"]
    # The occupancy table's block counts are right-aligned under "blocks".
    start = lines.index("occupancy per SM (sm_90)") + 1
    table = lines[start:start + 6]
    assert [line.split()[0] for line in table] == ["limit", "threads", "registers", "shared",
                                                   "blocks", "resident"]
    end = table[0].index("blocks") + len("blocks")
    counts = [line[:end].split()[-1] for line in table[1:]]
    assert counts == ["8", "2", "24", "32", "2"]
    assert all(line[end] == " " for line in table)
    assert "<- binds" in table[2] and "<- binds" not in table[1]


@pytest.mark.parametrize("path", sorted(SPECS.glob("*.gemm")), ids=lambda p: p.stem)
def test_render_text_fits_80_columns(path):
    for spec in load(path):  # every kernel of the file, a search space by its first valid point
        plan = next(p for p, _ in map(try_plan, spec.points()) if p is not None)
        text = render_text(explain(plan, resources(128, spill_stores=4, spill_loads=4)))
        assert max(len(line) for line in text.splitlines()) <= 80, text


def test_wgmma_kernels_show_how_setmaxnreg_shares_out_the_registers():
    skinny = render_text(explain(plan_of("hopper_skinny"), resources(168)))
    assert "register split        setmaxnreg: loaders 160, consumers 184" in skinny
    assert "loaders               2 warpgroup(s) fill the stages, 2 K tile(s) each" in skinny
    tma = render_text(explain(plan_of("hopper_tf32"), resources(168)))
    assert "setmaxnreg: producer 40, consumers 232" in tma and "loaders  " not in tma


def test_render_text_without_shared_memory():
    text = render_text(explain(plan_of("naive"), resources(32)))
    assert "none: no shared memory" in text
    assert "global, per thread per k" in text and "shared, per thread" not in text
    assert "limited by threads and registers" in text


def test_as_dict_is_json():
    report = explain(plan_of("warptile"), resources(231))
    data = json.loads(json.dumps(as_dict(report)))
    assert data["threads"] == 128 and data["registers"] == 231
    assert data["occupancy"]["limits"] == {"threads": 16, "registers": 2, "shared memory": 13,
                                           "blocks": 32}
    assert data["occupancy"]["limited_by"] == ["registers"] and data["occupancy"]["percent"] == 12.5
    assert data["intensity"]["global"]["flop_per_byte"] == 32.0
    assert [a["access"] for a in data["bank_conflicts"]] == ["A store", "B store", "A fragment",
                                                             "B fragment"]
    assert data["bank_conflicts"][0]["degree"] == 2
    assert data["summary"] == report.summary


def test_report_is_frozen():
    report = explain(plan_of("naive"), resources(32))
    with pytest.raises(AttributeError):
        report.registers = 1  # type: ignore[misc]


def test_explain_compiles_when_given_no_compile(tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc")
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path))
    plan = plan_of("naive")
    report = explain(plan)
    assert 0 < report.registers <= 255
    assert report.threads == 1024
    assert report.occupancy.by_threads == 2
    assert report.occupancy.blocks <= 2


# --- global coalescing (32-byte sectors per request) ------------------------------------

def coalescing(plan, name: str):
    return next(g for g in global_accesses(plan) if g.name == name)


def test_sector_count_of_single_requests():
    assert sectors_touched(list(range(32)), 1) == (4, 128)             # 128 adjacent bytes
    assert sectors_touched([0] * 32, 1) == (1, 4)                      # one float, broadcast
    assert sectors_touched([4096 * lane for lane in range(32)], 1) == (32, 128)  # a column
    assert sectors_touched([4 * lane for lane in range(32)], 4) == (16, 512)     # float4 row
    assert sectors_touched([8 * lane for lane in range(32)], 4) == (32, 512)     # half-sectors
    assert sectors_touched([6, None], 4) == (2, 16)   # 16 bytes across a sector boundary


def test_naive_order_m_loads_a_and_stores_c_a_column_apart_per_lane():
    # Order m: lane l computes C(l, 0); row-major A(l, 0) and C(l, 0) are 4096 floats apart
    # per lane, so each lane's 4 bytes cost a sector of their own. B(0, 0) is shared by all.
    plan = plan_of("naive")
    a, b, c = (coalescing(plan, name) for name in ("A load", "B load", "C store"))
    assert (a.sectors, a.ideal_sectors, a.efficiency) == (32, 4, 12.5)
    assert (c.sectors, c.ideal_sectors) == (32, 4)
    assert (b.sectors, b.ideal_sectors, b.bytes) == (1, 1, 4)
    assert a.uncoalesced and c.uncoalesced and not b.uncoalesced
    notes = "\n".join(explain(plan, resources(32)).notes)
    assert "A loads (scalar, k = 0) touch 32 sectors per request where 4 would do" in notes
    assert "C stores (scalar) touch 32 sectors" in notes and "B loads" not in notes


def test_coalesced_order_n_reads_b_and_writes_c_as_128_adjacent_bytes():
    # Order n: lane l computes C(0, l): B(0, l) and C(0, l) are 32 adjacent floats = 4 sectors,
    # and A(0, 0) is one float broadcast to the warp.
    plan = plan_of("coalesced")
    for name in ("B load", "C store"):
        g = coalescing(plan, name)
        assert (g.sectors, g.ideal_sectors, g.efficiency) == (4, 4, 100.0)
    a = coalescing(plan, "A load")
    assert (a.sectors, a.ideal_sectors) == (1, 1)
    assert not any("uncoalesced" in note for note in explain(plan, resources(32)).notes)
    # The layout decides too: order m with column-major A reads A(l, 0) at l, adjacent floats.
    col_a = coalescing(plan_of("naive", layout_A="col"), "A load")
    assert (col_a.sectors, col_a.ideal_sectors) == (4, 4)


def test_per_thread_runs_load_a_quarter_of_each_sector_they_touch():
    # uncoalesced_loads: 4 consecutive chunks per thread, so pass 0 reads every 4th float:
    # A (64 x 16) rows 0..7 at cols 0, 4, 8, 12 and B (16 x 64) rows 0..1 at cols 0, 4, ..., 60.
    plan = plan_of("uncoalesced_loads")
    fixed = plan_of("uncoalesced_loads", load_A_uncoalesced=False, load_B_uncoalesced=False)
    for name in ("A load", "B load"):
        bad, good = coalescing(plan, name), coalescing(fixed, name)
        assert (bad.sectors, bad.ideal_sectors, bad.efficiency) == (16, 4, 25.0)
        assert (good.sectors, good.ideal_sectors, good.efficiency) == (4, 4, 100.0)
        assert bad.efficiency < good.efficiency and bad.uncoalesced
        assert "per-thread runs" in bad.how and "runs" not in good.how


def test_warptile_float4_loads_and_stores_use_every_byte_of_their_sectors():
    # A (128 x 16): 4 lanes cover one 64-byte row, 8 rows; B (16 x 128): one 512-byte row;
    # C: 4 lanes x float4 = 64 adjacent bytes per row of the 8 x 4 lane grid.
    plan = plan_of("warptile")
    for g in global_accesses(plan):
        assert (g.bytes_per_lane, g.sectors, g.ideal_sectors, g.efficiency) == (16, 16, 16, 100.0)


def test_staged_c_stores_coalesce_while_direct_float4_stores_half_fill_sectors():
    # staged_epilogue stores C row by row: 32 lanes x float4 = 512 adjacent bytes.
    staged = coalescing(plan_of("staged_epilogue"), "C store")
    assert (staged.how, staged.sectors, staged.ideal_sectors) == ("float4, staged", 16, 16)
    # padded_transposed (thread 8 x 8, C_VEC 4): lane stores start 8 floats = 32 bytes apart,
    # so each float4 fills half a sector (the other half is its own j = 4 store, the next
    # request): twice the ideal, at the line where the report does not call it uncoalesced.
    direct = coalescing(plan_of("padded_transposed"), "C store")
    assert (direct.how, direct.bytes_per_lane) == ("float4", 16)
    assert (direct.sectors, direct.ideal_sectors, direct.efficiency) == (32, 16, 50.0)
    assert not direct.uncoalesced


def test_transposed_cp_async_and_split_k_move_4_bytes_per_lane():
    # pingpong_async copies transposed A one float per cp.async: 4 bytes 16 bytes apart.
    a = coalescing(plan_of("pingpong_async"), "A load")
    assert (a.how, a.bytes_per_lane, a.sectors, a.ideal_sectors) == (
        "cp.async 4 B, transposed", 4, 16, 4)
    assert coalescing(plan_of("pingpong_async"), "B load").efficiency == 100.0
    c = coalescing(plan_of("split_k"), "C store")
    assert (c.how, c.bytes_per_lane) == ("atomicAdd", 4)


def test_render_text_and_json_show_the_coalescing_table():
    report = explain(plan_of("naive"), resources(32))
    lines = render_text(report).splitlines()
    start = lines.index("global memory coalescing (warp 0, first request), 32-byte sectors")
    table = lines[start + 2:start + 6]
    assert table[0].split() == ["access", "how", "width", "sectors", "ideal", "efficiency"]
    assert table[1].split() == ["A", "load", "scalar,", "k", "=", "0", "4", "B", "32", "4",
                                "12.5%"]
    assert table[2].split()[-3:] == ["1", "1", "100.0%"]
    assert table[3].split()[:2] == ["C", "store"]
    data = json.loads(json.dumps(as_dict(report)))
    assert [g["access"] for g in data["global_coalescing"]] == ["A load", "B load", "C store"]
    assert data["global_coalescing"][0] == {
        "access": "A load", "how": "scalar, k = 0", "bytes_per_lane": 4, "bytes": 128,
        "sectors": 32, "ideal_sectors": 4, "efficiency": 12.5}


# --- the explain verb: files mixing kernels and spaces, and its progress bar ---------------------

MIXED = """kernel a {
  block 64 x 64 x 8
  thread 4 x 4
}
kernel s {
  block {64, 128} x 64 x 8
  thread 4 x 4
}
"""


@pytest.fixture
def no_nvrtc(monkeypatch):
    """explain() with a ptxas report made here, so that the verb's tests need no compile."""
    import gemmgen.explain.report
    real = gemmgen.explain.report.explain
    monkeypatch.setattr(gemmgen.explain.report, "explain", lambda plan, compiled=None: real(plan, resources(40)))


def invoke(*args):
    from click.testing import CliRunner
    from gemmgen.cli import main
    return CliRunner().invoke(main, [str(a) for a in args])


def test_explain_of_a_file_mixing_kernels_and_spaces_explains_the_kernels(tmp_path, no_nvrtc):
    path = tmp_path / "mixed.gemm"
    path.write_text(MIXED)
    result = invoke("explain", path)
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout.startswith("a on sm_90\n")
    assert "s on" not in result.stdout
    assert result.stderr == ("skipped s: a search space of 2 points (gemmgen tune searches it; explain "
                             "takes a kernel, one value per setting)\n")
    as_json = invoke("explain", path, "--json")
    assert as_json.exit_code == 0
    assert [r["kernel"] for r in json.loads(as_json.stdout)] == ["a"]


def test_explain_of_spaces_alone_says_they_are_spaces(tmp_path, no_nvrtc):
    path = tmp_path / "mixed.gemm"
    path.write_text(MIXED)
    for args in ([path, "--kernel", "s"], [SPECS / "small_search.gemm"]):
        result = invoke("explain", *args)
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
        assert "this spec is a search space" in result.output and "Traceback" not in result.output
    assert invoke("explain", path, "--kernel", "a").exit_code == 0


def terminal(monkeypatch, is_terminal: bool = True):
    """The CLI's stderr console, replaced by one writing to a string (a terminal or not)."""
    import io

    from rich.console import Console

    import gemmgen.cli.common
    console = Console(file=io.StringIO(), force_terminal=is_terminal, width=100)
    monkeypatch.setattr(gemmgen.cli.common, "errors", console)
    return console.file


@pytest.mark.parametrize("is_terminal, delay, shown", [(True, 0.0, True), (False, 0.0, False),
                                                       (True, 60.0, False)])
def test_the_progress_bar_shows_only_on_a_terminal_after_a_moment(monkeypatch, is_terminal, delay, shown):
    from gemmgen.cli.common import late_progress
    written = terminal(monkeypatch, is_terminal)
    with late_progress("explaining", 3, delay_s=delay) as progress:
        progress(1)
        progress(2)
        progress(3)
    assert ("explaining" in written.getvalue()) == shown
    assert ("3/3" in written.getvalue()) == shown


def test_explain_of_many_kernels_shows_progress(tmp_path, monkeypatch):
    import gemmgen.explain.report
    written = terminal(monkeypatch)
    real = gemmgen.explain.report.explain

    def slow(plan, compiled=None):  # as a compile would take
        time.sleep(0.3)
        return real(plan, resources(40))

    monkeypatch.setattr(gemmgen.explain.report, "explain", slow)
    path = tmp_path / "many.gemm"
    path.write_text("".join(f"kernel k{i} {{\n  block 64 x 64 x 8\n  thread 4 x 4\n}}\n" for i in range(4)))
    result = invoke("explain", path)
    assert result.exit_code == 0
    assert result.stdout.count(" on sm_90\n") == 4
    assert "explaining" in written.getvalue() and "/4" in written.getvalue()


def test_explain_all_reports_progress_after_each_kernel():
    from gemmgen.explain.report import explain_all
    import gemmgen.explain.report
    done = []
    plans = [plan_of("naive"), plan_of("warptile")]
    real = gemmgen.explain.report.explain
    try:
        gemmgen.explain.report.explain = lambda plan, compiled=None: real(plan, resources(40))
        reports = explain_all(plans, done.append)
    finally:
        gemmgen.explain.report.explain = real
    assert [r.kernel for r in reports] == ["naive", "warptile"] and done == [1, 2]


def test_a_column_major_a_in_tf32_says_how_it_reaches_wgmma():
    """math tf32 with layout A col: TMA lands A MN-major, rounded to TF32, and the consumers read it
    into registers as it is (with round truncate: as it lies, truncated by wgmma), or round it there
    with round nearest consumer; the kernel includes no transpose of B."""
    plain = plan_of("hopper_tf32", layout_A="col")
    text = " ".join(render_text(explain(plain, resources(168))).split())
    assert "A column-major: TMA lands its tiles MN-major" in text and "into registers as TMA rounded them" in text
    assert plain.mainloop.tma_helpers == ("wgmma_mn_major.cuh.j2",)
    truncating = plan_of("hopper_tf32", layout_A="col", round="truncate")
    assert "into registers as they lie" in dict(truncating.mainloop.mn_major_rows())["A column-major"]
    rounded = plan_of("hopper_tf32", layout_A="col", round="nearest", round_by="consumer")
    assert "into registers as they round them" in dict(rounded.mainloop.mn_major_rows())["A column-major"]


def test_3xtf32_says_where_it_rounds_b_and_the_kernel_decides_it_from_the_call():
    """math 3xtf32 on TMA: explain says B's big part is rounded to nearest where cuBLAS FP32's error is
    small (short K, small calls) and truncated by the tensor core elsewhere; the kernel decides it per
    call from K and batch x M x N, with the part's limits as named constants."""
    from gemmgen.codegen.cuda import generate
    from gemmgen.plan.parts.warpgroup_mainloop import ROUND_B_MAX_K, ROUND_B_MAX_MN, ROUND_B_SHORT_K
    plan = plan_of("hopper_3xtf32")
    text = " ".join(render_text(explain(plan, resources(168))).split())
    assert (f"TF32 split of B: its big part rounded to nearest by the producer's warps 1-3 (a store more per "
            f"float) where K <= {ROUND_B_SHORT_K}, or K <= {ROUND_B_MAX_K} and batch x M x N <= {ROUND_B_MAX_MN}, "
            "else truncated by the tensor core") in text
    source = generate(plan)
    assert f"constexpr int ROUND_B_SHORT_K = {ROUND_B_SHORT_K}, ROUND_B_MAX_K = {ROUND_B_MAX_K};" in source
    assert f"constexpr long long ROUND_B_MAX_MN = {ROUND_B_MAX_MN};" in source
    assert ("const bool round_b = K <= ROUND_B_SHORT_K || (K <= ROUND_B_MAX_K && (long long)M * N * batch <= "
            "ROUND_B_MAX_MN);") in source
    assert "write_remainders(sB + s * B_STAGE_FLOATS, sB_small + s * B_STAGE_FLOATS, B_STAGE_FLOATS, round_b" in source
    # tf32 kernels split nothing: no such row
    assert "TF32 split of B" not in " ".join(render_text(explain(plan_of("hopper_tf32"), resources(168))).split())
