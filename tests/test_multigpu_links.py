"""The links between GPUs recorded beside every multi-GPU result (issue 30): nvidia-smi's topology
(or why it is missing) and a measured peer copy bandwidth matrix, on simulated devices; and
`gemmgen bench --devices` of a kernel and of a library writing them with its results (CPU)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

import gemmgen.cli
import gemmgen.cli.bench as cli_bench
import gemmgen.cli.common
import gemmgen.gpu.runtime
import gemmgen.library.dispatch as dispatch
import gemmgen.library.runtime as library_runtime
from fake_device import INFO, ReferenceKernel, to_tf32
from fake_streams import SimulatedDevices, on_device
from gemmgen.multigpu.scaling import ScalingReport
from gemmgen.multigpu.split import ResidentResult, split_gemm
from gemmgen.multigpu.topology import links_markdown, nvidia_smi_topology, peer_bandwidth, record_links

ROOT = Path(__file__).resolve().parent.parent
TOPO = """\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV18\t0-63\t0
GPU1\tNV18\t X \t0-63\t0"""
MiB = 1 << 20


def links_layer(**options):
    """Three devices: 0 <-> 1 fast both ways, 2 behind a slow link, 1 -> 2 slower still."""
    links = {(0, 1): 400e6, (1, 0): 400e6, (0, 2): 50e6, (2, 0): 50e6, (1, 2): 25e6, (2, 1): 50e6}
    return SimulatedDevices(0, links=links, local_bytes_per_ms=2000e6, **options)


def test_the_bandwidth_matrix_is_each_pairs_copy_rate_and_its_buffers_are_freed():
    layer = links_layer()
    measured = peer_bandwidth(layer, [2, 0, 1, 0], nbytes=4 * MiB, repeats=3)
    assert measured["devices"] == [0, 1, 2] and measured["bytes"] == 4 * MiB
    assert measured["gbps"] == [[2000.0, 400.0, 50.0], [400.0, 2000.0, 25.0], [50.0, 50.0, 2000.0]]
    assert len(layer.allocated) == 6 and set(layer.allocated) == set(layer.freed)
    copies = [op for op in layer.ops if op.kind == "copy"]
    assert len(copies) == 9 * 4 and all(op.stream[0] == op.link[1] for op in copies)  # timed on the destination


def test_a_copy_too_fast_to_time_reads_none():
    assert peer_bandwidth(SimulatedDevices(0), [0, 1], nbytes=MiB, repeats=1)["gbps"] == [[None, None], [None, None]]


def test_the_topology_is_nvidia_smis_matrix_or_why_there_is_none(monkeypatch):
    ran = []

    def run(command, **options):
        ran.append(command)
        return SimpleNamespace(returncode=0, stdout=TOPO + "\n", stderr="")
    assert nvidia_smi_topology(run) == {"command": "nvidia-smi topo -m", "text": TOPO, "error": None}
    assert ran == [["nvidia-smi", "topo", "-m"]]
    monkeypatch.setenv("PATH", "")   # no nvidia-smi at all: the real subprocess.run
    assert nvidia_smi_topology() == {"command": "nvidia-smi topo -m", "text": None,
                                     "error": "nvidia-smi is not on PATH"}
    failed = lambda command, **o: SimpleNamespace(returncode=9, stdout="", stderr="NVML: driver not loaded\n")  # noqa: E731
    assert nvidia_smi_topology(failed)["error"] == "nvidia-smi exited with 9: NVML: driver not loaded"

    def slow(command, timeout, **options):
        raise subprocess.TimeoutExpired(command, timeout)
    assert nvidia_smi_topology(slow, timeout_s=2)["error"] == "nvidia-smi did not answer within 2 s"


def test_the_links_read_as_markdown():
    layer = links_layer()
    found = record_links(layer, [0, 1, 2], run=lambda c, **o: SimpleNamespace(returncode=0, stdout=TOPO, stderr=""),
                         nbytes=2 * MiB, repeats=1)
    text = links_markdown(found)
    assert "| from \\ to | GPU 0 | GPU 1 | GPU 2 |" in text and "| GPU 1 | 400.0 | 2000.0 | 25.0 |" in text
    assert "```\n" + TOPO + "\n```" in text
    found["topology"] = nvidia_smi_topology(lambda c, **o: (_ for _ in ()).throw(FileNotFoundError()))
    assert "`nvidia-smi topo -m`:\n\nnot recorded: nvidia-smi is not on PATH" in links_markdown(found)


# --- bench --devices, as a user runs it ------------------------------------------------------------------

def fake_measure(layer):
    """measure_scaling on simulated devices: the split of the given kernel or library, checked
    against float64 as the real one does, with one GPU's time made up."""
    def measure(kernels, M, N, K, devices, *, math=None, **options):
        first = layer.kernel(devices[0], kernels) if hasattr(kernels, "BM") else kernels(devices[0])
        rng = np.random.default_rng(0)
        A, B = rng.uniform(-1, 1, (M, K)).astype(np.float32), rng.uniform(-1, 1, (K, N)).astype(np.float32)
        dA, dB = on_device(A, devices[0], first.layouts["A"]), on_device(B, devices[0], first.layouts["B"])
        dC = on_device(np.full((M, N), np.nan), devices[0], first.layouts["C"])
        split = split_gemm(kernels, dA, dB, dC, devices=devices, layer=layer)
        inputs = (to_tf32(A), to_tf32(B)) if math == "tf32" else (A, B)
        error = np.abs(dC - inputs[0].astype(np.float64) @ inputs[1]).max()
        split.end_to_end_ms = 1.0 / len(devices) * 1.25
        return ScalingReport(devices, M, N, K, 1.0, split, ResidentResult([], [1.0] * len(devices), 1.0 / len(devices)),
                             one_gpu_kernel_ms=0.9), float(error / 1e-3)
    return measure


@pytest.fixture
def fake_machine(monkeypatch):
    """Three simulated GPUs behind the CLI, with no nvidia-smi."""
    layer = links_layer(count=3)
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(gemmgen.cli.common, "require_gpu", lambda: None)
    monkeypatch.setattr(gemmgen.gpu.runtime, "device_count", lambda: 3)
    monkeypatch.setattr(gemmgen.gpu.runtime, "device_info", lambda ordinal=0: INFO)
    monkeypatch.setattr(library_runtime, "device_info", lambda ordinal=0: INFO)
    monkeypatch.setattr(library_runtime, "Kernel", ReferenceKernel)
    monkeypatch.setattr(dispatch.LibraryRuntime, "compile_all", lambda self: None)
    monkeypatch.setattr(cli_bench, "CupyLayer", lambda: layer)
    monkeypatch.setattr(cli_bench, "measure_scaling", fake_measure(layer))
    import gemmgen.multigpu.topology as topology
    monkeypatch.setattr(topology, "PROBE_BYTES", 4 * MiB)
    return layer


@pytest.mark.parametrize("spec", ["fp32", "hopper_simt"])
def test_bench_devices_writes_its_results_beside_the_gpus_links(spec, fake_machine, tmp_path):
    out = tmp_path / "split.json"
    arguments = ["bench", str(ROOT / "specs" / f"{spec}.gemm"), "--devices", "all", "--shapes", "384x256x128",
                 "--json", str(out)]
    if spec == "fp32":
        arguments += ["--manifest", str(ROOT / "generated" / "fp32.json")]
    result = CliRunner().invoke(gemmgen.cli.main, arguments)
    assert result.exit_code == 0, result.output
    assert "peer copy bandwidth, GB/s" in result.output and "nvidia-smi topo -m: not recorded" in result.output
    written = json.loads(out.read_text())
    assert written["links"]["topology"]["error"] == "nvidia-smi is not on PATH"
    assert written["links"]["peer_bandwidth"]["gbps"] == [[2000.0, 400.0, 50.0], [400.0, 2000.0, 25.0],
                                                         [50.0, 50.0, 2000.0]]
    (record,) = written["results"]
    assert record["devices"] == [0, 1, 2] and len(record["parts"]) == 3 and record["worst_error_ratio"] <= 1.0
    assert record["end_to_end_scaling"] == pytest.approx(0.8) and record["resident_scaling"] == pytest.approx(1.0)
    assert record.get("library" if spec == "fp32" else "kernel") == spec
    assert record["math"] == ("3xtf32" if spec == "fp32" else "simt")
    assert {op.device for op in fake_machine.ops if op.kind == "launch"} == {0, 1, 2}


def test_bench_devices_refuses_a_gpu_that_is_not_there(fake_machine):
    result = CliRunner().invoke(gemmgen.cli.main, ["bench", str(ROOT / "specs" / "fp32.gemm"), "--devices", "0,5"])
    assert result.exit_code == 2 and "device(s) [5] not present: this machine has 3" in result.output


# --- .ci/gpu_multigpu.py: the must-holds' command --------------------------------------------------------

@pytest.fixture
def musthold_script():
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_multigpu", ROOT / ".ci" / "gpu_multigpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_musthold_command_measures_each_subject_and_count_it_can_and_says_what_it_could_not(
        musthold_script, fake_machine, monkeypatch, tmp_path):
    """On three simulated GPUs: 2 GPUs measured for the fp32 library and hopper_simt, 4 listed as not
    run, the batch of 64 split by batch for both libraries; the made-up end to end (0.8 x N) fails
    its must, the made-up batched scaling (0.95 x N) holds its."""
    import gemmgen.multigpu.cupy_layer
    import gemmgen.multigpu.scaling
    monkeypatch.setattr(gemmgen.multigpu.cupy_layer, "CupyLayer", lambda: fake_machine)
    monkeypatch.setattr(gemmgen.multigpu.scaling, "measure_scaling", fake_measure(fake_machine))
    batched = []

    def fake_batched(kernel_on, batch, M, N, K, devices, **options):
        batched.append((kernel_on(devices[0]).name, batch, M, N, K, tuple(devices)))
        return {"devices": devices, "batch": batch, "M": M, "N": N, "K": K, "one_gpu_ms": 1.0, "one_gpu_tflops": 137.4,
                "end_to_end_ms": 0.5 / 0.95, "end_to_end_tflops": 261.1, "end_to_end_scaling": 0.95,
                "parts": [40, 24], "even_scaling": 0.5, "worst_error_ratio": 0.1}
    monkeypatch.setattr(gemmgen.multigpu.scaling, "measure_batched_scaling", fake_batched)
    monkeypatch.setattr(dispatch, "_runtimes", {})
    status = musthold_script.main(["--out", str(tmp_path), "--shapes", "384x256x128", "512x384x256"])
    assert status == 1
    written = json.loads((tmp_path / "multigpu.json").read_text())
    assert [(r["subject"], len(r["devices"]), r["shape"]) for r in written["rows"]] == [
        ("fp32", 2, "384x256x128"), ("fp32", 2, "512x384x256"),
        ("hopper_simt", 2, "384x256x128"), ("hopper_simt", 2, "512x384x256")]
    assert all(r["verdict"] == {"end_to_end >= 0.85 x N": False, "resident >= 0.95 x N": True,
                                "matches float64": True} for r in written["rows"])
    assert written["not_run"] == ["4 GPUs: this machine has 3"]
    assert written["links"]["topology"]["error"] == "nvidia-smi is not on PATH"
    text = (tmp_path / "multigpu.md").read_text()
    assert "| fp32 | 2 | 512x384x256 | rows of C (M) |" in text and "| 0.80 **below** |" in text
    assert [b[1:] for b in batched] == [(64, 1024, 1024, 1024, (0, 1))] * 2
    assert [(r["subject"], r["verdict"]) for r in written["batched"]] == [
        (name, {"end_to_end >= 0.90 x N": True, "matches float64": True}) for name in ("fp32", "tf32")]
    assert "| fp32 | 2 | 137.4 | 261.1 | 0.95 | 40 / 24 | 0.50 | 384 MiB | ok |" in text
    assert "Must-holds: failed:" in text and "a batch of 64" not in text.split("Must-holds")[1].split("\n")[0]
    assert "Must-holds: failed: fp32 on 2 GPUs at 384x256x128: end_to_end >= 0.85 x N;" in text
    assert "| GPU 1 | 400.0 | 2000.0 | 25.0 |" in text and "not recorded: nvidia-smi is not on PATH" in text
    # Rows from an honest machine pass; one that measured nothing fails, saying why.
    assert musthold_script.verdict({"end_to_end_scaling": 0.9, "resident_scaling": 0.97,
                                    "worst_error_ratio": 0.2}) == dict.fromkeys(
        ("end_to_end >= 0.85 x N", "resident >= 0.95 x N", "matches float64"), True)
    assert musthold_script.main(["--out", str(tmp_path), "--counts", "4"]) == 1
