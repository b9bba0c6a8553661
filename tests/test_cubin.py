"""Registers read from a cubin's ELF (gemmgen/gpu/cubin.py), the fallback where NVRTC's log holds
no ptxas report: the same numbers ptxas reports, for SIMT, mma.sync and wgmma kernels."""

from __future__ import annotations

import pytest

from conftest import SPECS_DIR
from gemmgen.gpu import compile as compile_module
from gemmgen.gpu.compile import compile_plan, resources_from_cubin
from gemmgen.gpu.cubin import kernel_resources
from gemmgen.language.load import load
from gemmgen.plan import make_plan


def plan_of(name: str):
    return make_plan(next(s for s in load(SPECS_DIR / f"{name}.gemm") if s.name == name))


@pytest.mark.parametrize("name", ["warptile", "tensorcore_tf32", "hopper_tf32", "split_k"])
def test_the_cubin_holds_the_registers_and_frame_ptxas_reports(name):
    compiled = compile_plan(plan_of(name))
    assert compiled.resources, "ptxas's report is this test's reference: NVRTC gave none"
    from_cubin = kernel_resources(compiled.cubin)
    assert set(from_cubin) == set(compiled.resources)  # every kernel, by its mangled symbol
    for symbol, report in compiled.resources.items():
        assert from_cubin[symbol] == (report.registers, report.stack_frame), symbol


def test_a_compile_whose_log_has_no_report_reads_the_cubin(monkeypatch):
    # The reference is ptxas's report of this same compile: two compiles of a kernel near the
    # 255-register cap need not allocate alike under CPU load (249 and 255 seen in one CI run).
    reports = []
    real_parse = compile_module.parse_ptxas_report

    def no_report(log):  # NVRTC 13.0's empty log, the real report kept aside for the check
        reports.append(real_parse(log))
        return {}

    monkeypatch.setattr(compile_module, "parse_ptxas_report", no_report)
    compiled = compile_plan(plan_of("warptile"), use_cache=False)
    assert reports and reports[-1], "ptxas's report is this test's reference: NVRTC gave none"
    assert {s: r.registers for s, r in compiled.resources.items()} == {
        s: r.registers for s, r in reports[-1].items()}
    assert all(r.spill_stores == r.spill_loads == 0 for r in compiled.resources.values())


def test_what_is_no_cubin_has_no_resources():
    assert kernel_resources(b"not an elf") == {} and resources_from_cubin(b"\x7fELF\x02\x01" + bytes(58)) == {}
