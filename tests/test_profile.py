"""gemmgen.gpu.profile and the profile verb (gemmgen.cli.profile): parsing ncu's CSV, running ncu
(a stand-in on the CPU), and the real thing.

The CPU tests replace `ncu` with a small script on PATH that records its arguments and prints
what ncu prints (`--csv --page raw`: ncu's own lines, a header of quoted metric names, a row of
units, one row per profiled launch), so the whole path from spec to table runs without a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import gemmgen.cli
import gemmgen.cli.common
import gemmgen.gpu.runtime
from gemmgen.cli.profile import profile_command, render_table
from gemmgen.gpu.profile import (METRICS, STALL_REASONS, ProfileError, metric_names, parse_ncu_csv, profile,
                                 stall_metric, summarise)

ROOT = Path(__file__).resolve().parent.parent
WARPTILE = ROOT / "specs" / "warptile.gemm"
NAIVE = ROOT / "specs" / "naive.gemm"

# As `ncu --clock-control none --csv --page raw --print-units base --metrics ...` prints it for
# warptile at 4096^3 on an H100 (values made up, format as captured): ncu's progress lines, then
# the table. Numbers carry thousands separators; one metric this GPU lacks reads n/a.
SAMPLE = '''==PROF== Connected to process 48213 (/usr/bin/python3.12)
==PROF== Profiling "gemmgen_warptile_kernel": 0%....50%....100% - 19 passes
==PROF== Disconnected from process 48213
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum","l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum","l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum","launch__registers_per_thread","sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active","sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active","sm__throughput.avg.pct_of_peak_sustained_elapsed","sm__warps_active.avg.pct_of_peak_sustained_active","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio","smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio","smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio","smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio","smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio","smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct"
"","","","","","","","","","","","%","nsecond","","","","","register/thread","%","%","%","%","ratio","ratio","ratio","ratio","ratio","ratio","ratio","ratio","ratio","ratio","%"
"0","48213","python3.12","127.0.0.1","gemmgen_warptile_kernel","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","9.87","5,012,345","1,048,576","0","67,108,864","4,194,304","128","71.42","0","74.05","18.73","0.41","n/a","0.02","0.35","0.93","0.12","0.05","0.88","0.07","0.61","100"
'''

SAMPLE_METRIC = {
    "fp32_pipe": 71.42, "tensor_pipe": 0, "sm_throughput": 74.05, "occupancy": 18.73, "registers": 128,
    "smem_load_conflicts": 1048576, "smem_store_conflicts": 0,
    "smem_load_wavefronts": 67108864, "smem_store_wavefronts": 4194304,
    "global_load_efficiency": 100, "dram_throughput": 9.87,
}


def test_parse_reads_launch_attributes_units_and_every_metric():
    kernels = parse_ncu_csv(SAMPLE)
    assert len(kernels) == 1
    attributes, metrics = kernels[0]["attributes"], kernels[0]["metrics"]
    assert attributes["Kernel Name"] == "gemmgen_warptile_kernel"
    assert attributes["Block Size"] == "(128, 1, 1)" and attributes["Grid Size"] == "(1024, 1, 1)"
    assert attributes["CC"] == "9.0"
    assert set(metrics) == set(metric_names())
    assert metrics["gpu__time_duration.sum"] == (5012345, "nsecond")  # thousands separators gone
    assert metrics["launch__registers_per_thread"] == (128, "register/thread")
    assert metrics["sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"] == (71.42, "%")
    assert metrics[stall_metric("dispatch_stall")] == (None, "ratio")  # n/a


def test_parse_takes_one_row_per_launch_and_ignores_everything_else():
    header, units, row = SAMPLE.splitlines()[3:6]
    second = row.replace('"0","48213"', '"1","48213"', 1)
    text = "\n".join(["some program output", header, units, row, second, "==PROF== done"])
    assert [k["attributes"]["ID"] for k in parse_ncu_csv(text)] == ["0", "1"]
    assert parse_ncu_csv("==PROF== No kernels were profiled.\n") == []
    assert parse_ncu_csv("") == []


def test_summarise_names_metrics_converts_time_and_ranks_stalls():
    report = summarise(parse_ncu_csv(SAMPLE)[0], name="warptile", shape="4096x4096x4096",
                       M=4096, N=4096, K=4096)
    for key, value in SAMPLE_METRIC.items():
        assert report["metrics"][key] == pytest.approx(value), key
    assert report["metrics"]["duration_us"] == pytest.approx(5012.345)
    assert report["derived"]["tflops"] == pytest.approx(2 * 4096**3 / 5.012345e-3 / 1e12)
    assert report["derived"]["smem_load_conflict_pct"] == pytest.approx(100 * 1048576 / 67108864)
    assert report["derived"]["smem_store_conflict_pct"] == 0
    assert list(report["stalls"])[:3] == ["math_pipe_throttle", "not_selected", "wait"]
    assert set(report["stalls"]) == set(STALL_REASONS) - {"dispatch_stall"}  # n/a left out, not 0
    assert report["function"] == "gemmgen_warptile_kernel"
    json.dumps(report)  # the --json output


def test_summarise_converts_every_time_unit_to_microseconds():
    for unit, factor in (("nsecond", 1e-3), ("usecond", 1.0), ("msecond", 1e3), ("second", 1e6)):
        kernel = {"attributes": {}, "metrics": {"gpu__time_duration.sum": (2.5, unit)}}
        report = summarise(kernel, name="k", shape="1x1x1", M=1, N=1, K=1)
        assert report["metrics"]["duration_us"] == pytest.approx(2.5 * factor), unit


def test_table_shows_every_metric_with_its_meaning():
    from rich.console import Console

    report = summarise(parse_ncu_csv(SAMPLE)[0], name="warptile", shape="4096x4096x4096",
                       M=4096, N=4096, K=4096)
    console = Console(width=200, record=True)
    console.print(render_table(report))
    text = console.export_text()
    for metric in METRICS:
        assert metric.label in text
    assert "71.4 %" in text and "5.012 ms" in text and "TFLOP/s" in text
    assert "stall: math_pipe_throttle" in text and "1,048,576" in text


# --- profile() against a stand-in ncu ------------------------------------------------------------

FAKE_NCU = '''#!{python}
"""Stands in for ncu: records its arguments, then answers as the test asked."""
import json, os, sys
from pathlib import Path
here = Path(__file__).parent
(here / "ncu-args.json").write_text(json.dumps(sys.argv[1:]))
mode = (here / "mode").read_text().strip()
metrics = sys.argv[sys.argv.index("--metrics") + 1].split(",")
if mode == "permission":
    print("==PROF== Connected to process 4242 (/usr/bin/python3)")
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
          "Performance Counters on the target device 0.")
    sys.exit(1)
if mode == "unknown-metric" and any("dispatch_stall" in m for m in metrics):
    print("==ERROR== Failed to find metric smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio")
    sys.exit(1)
if mode == "nothing":
    print("==WARNING== No kernels were profiled.")
    sys.exit(0)
sys.stdout.write((here / "sample.csv").read_text())
'''


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    """A stand-in `ncu` first on PATH; set_mode('ok' | 'permission' | ...) picks its answer."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "ncu"
    script.write_text(FAKE_NCU.replace("{python}", sys.executable))
    script.chmod(0o755)
    (folder / "sample.csv").write_text(SAMPLE)
    (folder / "mode").write_text("ok")
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(gemmgen.cli.common, "require_gpu", lambda: None)  # the command checks for a GPU first

    class Fake:
        def set_mode(self, mode: str) -> None:
            (folder / "mode").write_text(mode)

        @property
        def args(self) -> list[str]:
            return json.loads((folder / "ncu-args.json").read_text())

    return Fake()


def test_profile_runs_ncu_on_the_second_launch_of_the_main_kernel(fake_ncu):
    report = profile(WARPTILE, shape="4096x4096x4096")
    args = fake_ncu.args
    assert args[args.index("--clock-control") + 1] == "none"
    assert "--csv" in args and args[args.index("--page") + 1] == "raw"
    assert args[args.index("--launch-skip") + 1] == "1"
    assert args[args.index("--launch-count") + 1] == "1"
    assert args[args.index("--kernel-name") + 1] == "regex:gemmgen_warptile_kernel"
    assert set(args[args.index("--metrics") + 1].split(",")) == set(metric_names())
    driver = Path(args[args.index("--metrics") + 3])
    assert driver.suffix == ".py" and args[-2:] == ["warptile", "4096x4096x4096"]
    assert report["kernel"] == "warptile" and report["shape"] == "4096x4096x4096"
    assert report["metrics"]["fp32_pipe"] == pytest.approx(71.42)
    assert report["unavailable"] == []


def test_profile_reports_ncu_permission_errors(fake_ncu):
    fake_ncu.set_mode("permission")
    with pytest.raises(ProfileError, match="ERR_NVGPUCTRPERM") as raised:
        profile(NAIVE, shape="256x256x256")
    assert "performance counters" in str(raised.value)


def test_profile_leaves_out_metrics_ncu_does_not_know(fake_ncu):
    fake_ncu.set_mode("unknown-metric")
    report = profile(NAIVE, shape="256x256x256")
    assert report["unavailable"] == [stall_metric("dispatch_stall")]
    assert "dispatch_stall" not in fake_ncu.args[fake_ncu.args.index("--metrics") + 1]


def test_profile_says_when_ncu_profiled_nothing(fake_ncu):
    fake_ncu.set_mode("nothing")
    with pytest.raises(ProfileError, match="No kernels were profiled"):
        profile(NAIVE, shape="256x256x256")


def test_profile_without_ncu_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ProfileError, match="ncu.*not on PATH"):
        profile(NAIVE, shape="256x256x256")


def test_profile_rejects_a_bad_shape_and_an_empty_product(fake_ncu):
    with pytest.raises(ProfileError, match="bad shape"):
        profile(NAIVE, shape="256x256")
    with pytest.raises(ProfileError, match="no kernel launch"):
        profile(NAIVE, shape="0x256x256")


def test_profile_command_prints_a_table_or_json(fake_ncu):
    runner = CliRunner()
    result = runner.invoke(profile_command, [str(WARPTILE), "--shape", "4096x4096x4096"])
    assert result.exit_code == 0, result.output
    assert "FP32 (FMA) pipe utilisation" in result.output and "71.4 %" in result.output
    result = runner.invoke(profile_command, [str(WARPTILE), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["metrics"]["registers"] == 128


def test_profile_command_reports_errors_without_a_traceback(fake_ncu):
    fake_ncu.set_mode("permission")
    result = CliRunner().invoke(profile_command, [str(NAIVE), "--shape", "256x256x256"])
    assert result.exit_code == 1
    assert "ERR_NVGPUCTRPERM" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(profile_command, [str(NAIVE), "--shape", "256"])
    assert result.exit_code == 2 and "--shape" in result.output


def test_profile_command_without_a_gpu_exits_2_before_looking_for_ncu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu either: the GPU is what it says is missing
    monkeypatch.setattr(gemmgen.gpu.runtime, "device_count", lambda: 0)
    result = CliRunner().invoke(gemmgen.cli.main, ["profile", str(NAIVE)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert "no CUDA GPU found" in result.output and "ncu" not in result.output


# --- the real ncu ----------------------------------------------------------------------------------

@pytest.mark.gpu
def test_profile_naive_on_the_gpu():
    if shutil.which("ncu") is None:
        pytest.skip("ncu is not on PATH")
    pytest.importorskip("cupy")
    report = profile(NAIVE, shape="256x256x256")
    metrics = report["metrics"]
    assert metrics["duration_us"] > 0
    assert metrics["registers"] > 0
    assert 0 < metrics["fp32_pipe"] <= 100
    assert 0 < metrics["occupancy"] <= 100
    assert "gemmgen_naive_kernel" in report["function"]
    assert report["block"].replace(" ", "") == "(1024,1,1)"
    assert report["stalls"], "no warp stall reasons were collected"
    assert all(value >= 0 for value in report["stalls"].values())
