"""The PyTorch benchmarks (benchmarks/torch_model.py, torch_layouts.py) run dry on the CPU: their
records hold every mode and layout, their errors against float64 are measured on what ran, and
their output files are checked before the work (skipped without torch).

gemmgen's calls run through host libraries (torch_on_host.py) and host memory stands for a GPU's,
as in test_torch_nn.py; the timings of a dry run mean nothing and are not checked.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gemmgen.torch import nn as gnn  # noqa: E402
from torch_on_host import fast_path_on_host  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.append(str(ROOT / "benchmarks"))

import torch_layouts  # noqa: E402
import torch_model  # noqa: E402

TINY = ["--device", "cpu", "--layers", "2", "--hidden", "32", "--ffn", "48", "--heads", "4", "--vocab", "50",
        "--batch", "2", "--seq", "8", "--repeats", "2", "--warmup", "1"]


@pytest.fixture
def host(monkeypatch):
    found = fast_path_on_host(monkeypatch)
    monkeypatch.setattr(gnn, "_on_gpu", lambda tensor: tensor.device.type == "cpu")
    monkeypatch.setattr(gnn, "_warned", set())
    return found


def calls_made(libraries):
    return [call for library in libraries.values() for call in library.calls]


def test_the_model_benchmark_records_every_mode_with_its_errors_against_float64(host, tmp_path, capsys):
    libraries, copies, _ = host
    out = tmp_path / "model.json"
    torch_model.main(["--out", str(out), *TINY])
    record = json.loads(out.read_text())
    assert record["generator"] == "gemmgen" and record["benchmark"] == "torch_model"
    assert record["meta"]["torch"] == torch.__version__ and record["settings"]["layers"] == 2
    rows = {row["mode"]: row for row in record["results"]}
    assert list(rows) == list(torch_model.MODES)
    # 7 Linear layers a block and the output projection through gemmgen in its modes, none in PyTorch's
    assert [rows[m]["gemmgen_layers"] for m in torch_model.MODES] == [0, 0, 15, 15]
    assert len(calls_made(libraries)) > 0 and copies == []
    for row in rows.values():
        assert 0 < row["logits_error"] < 1e-5 and row["loss_error"] < 1e-5 and 0 < row["grad_error"] < 1e-5
        assert len(row["forward_ms_all"]) == len(row["step_ms_all"]) == 2
    assert rows["pytorch-fp32"]["forward_x_fp32"] == 1.0 and rows["pytorch-tf32"]["step_x_tf32"] == 1.0
    printed = capsys.readouterr().out
    assert "| mode | forward ms | x PyTorch FP32 | x PyTorch TF32 | training step ms |" in printed
    assert "| gemmgen-fp32 |" in printed and f"wrote {out}" in printed


def test_the_model_benchmark_measures_errors_on_what_ran():
    """The float64 reference differs from a model run in float32 (the errors are not trivially 0),
    and a model that is off shows as off."""
    torch.manual_seed(0)
    config = torch_model.Config(vocab=40, hidden=16, ffn=24, layers=1, heads=2, batch=2, seq=6)
    model = torch_model.Transformer(config)
    inputs, targets = torch_model.make_batch(config, torch.device("cpu"), 0)
    reference = torch_model.float64_reference(model, inputs, targets)
    assert all(p.grad is None for p in model.parameters())   # the reference is a copy
    found = torch_model.errors(model, inputs, targets, reference)
    assert 0 < found["grad_error"] < 1e-5 and 0 < found["logits_error"] < 1e-5
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    off = torch_model.errors(model, inputs, targets, reference)
    assert off["logits_error"] > 0.5 and off["grad_error"] > 0.1 and off["loss_error"] > 1e-4


def test_a_benchmark_keeps_a_file_that_is_not_its_own(tmp_path, capsys):
    out = tmp_path / "notes.json"
    out.write_text('{"mine": true}\n')
    with pytest.raises(SystemExit, match=r"error: refusing to overwrite .*notes.json: gemmgen did not write it"):
        torch_model.main(["--out", str(out), *TINY])
    with pytest.raises(SystemExit, match=r"refusing to overwrite"):
        torch_layouts.main(["--out", str(out), "--device", "cpu"])
    assert out.read_text() == '{"mine": true}\n'


def test_bad_benchmark_arguments_are_refused_with_the_reason(capsys):
    with pytest.raises(SystemExit):
        torch_model.main(["--out", "x.json", "--hidden", "30", "--heads", "4"])
    assert "--hidden 30 must be --heads 4 times an even head size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        torch_layouts.main(["--out", "x.json", "--shapes", "4096x4096"])
    assert "--shapes 4096x4096: write M x N x K as three whole numbers" in capsys.readouterr().err


def test_a_gpu_is_made_current_only_when_named_with_its_index(monkeypatch):
    import torch_records
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    for name in ("cuda", "cuda:1", "cpu"):
        torch_records.use_device(torch.device(name))
    assert chosen == [1]


def test_without_a_gpu_the_benchmarks_say_so(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for script in (torch_model, torch_layouts):
        with pytest.raises(SystemExit):
            script.main(["--out", "x.json"])
        assert "torch sees no CUDA GPU (--device cpu runs the script dry)" in capsys.readouterr().err


ROUTES = {("row", "col", "row"): ("fp32", False), ("row", "row", "row"): ("fp32_rr", False),
          ("col", "col", "row"): ("fp32_cc", False), ("col", "row", "row"): ("fp32_cr", False),
          ("row", "col", "col"): ("fp32", True), ("row", "row", "col"): ("fp32_cc", True),
          ("col", "col", "col"): ("fp32_rr", True), ("col", "row", "col"): ("fp32_cr", True)}


def test_the_layouts_benchmark_times_every_layout_beside_torch_and_the_best_layout(host, tmp_path, capsys):
    libraries, copies, _ = host
    out = tmp_path / "layouts.json"
    torch_layouts.main(["--out", str(out), "--device", "cpu", "--shapes", "24x16x40", "7x5x3", "--rounds", "2",
                        "--calls", "2", "--warmup", "1"])
    record = json.loads(out.read_text())
    rows = record["results"]
    assert len(rows) == 2 * 2 * 8 * 2                      # shapes x precisions x layouts x (gemmgen, torch)
    ours = [row for row in rows if row["way"] == "gemmgen"]
    for row in ours:
        library, swap = ROUTES[(row["A"], row["B"], row["C"])]
        assert row["route"] == {"library": library.replace("fp32", row["precision"]), "swap": swap, "copies": []}
        assert 0 < row["x_best_layout"] <= 1.0 and row["x_torch"] > 0
    for shape in ("24x16x40", "7x5x3"):
        for precision in ("fp32", "tf32"):
            group = [r for r in ours if r["shape"] == shape and r["precision"] == precision]
            assert len(group) == 8 and max(r["x_best_layout"] for r in group) == 1.0
    assert all(row["error"] < 1e-6 for row in rows)        # gemmgen's (host) results and torch's, vs float64
    assert copies == [] and (24, 16, 40) in calls_made(libraries)
    assert "| 24x16x40 | fp32 | col / row / col |" in capsys.readouterr().out


def test_the_padding_benchmark_refuses_an_aligned_padding_and_needs_a_gpu(capsys, monkeypatch, tmp_path):
    import padding
    with pytest.raises(SystemExit):
        padding.main(["--out", str(tmp_path / "p.json"), "--pads", "0"])
    assert "--pads must be 1 or more" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        padding.main(["--out", str(tmp_path / "p.json"), "--shapes", "2047x2047x2047"])
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_the_batched_benchmark_reads_batch_shapes_and_needs_a_gpu(capsys):
    import torch_batched
    with pytest.raises(SystemExit):
        torch_batched.parse(["--out", "x.json", "--shapes", "4x4x4"])
    assert "write batch x M x N x K as four whole numbers" in capsys.readouterr().err
    assert torch_batched.parse_batched_shapes(None, ["64x512x512x512", "2X3X4X5"]) == [(64, 512, 512, 512), (2, 3, 4, 5)]
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            torch_batched.parse(["--out", "x.json"])
        assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_epilogue_schedule_variants_of_a_member_name_what_the_planner_refuses():
    import epilogue_schedules
    import gemmgen.library.dispatch as dispatch
    plan = dispatch.shipped_manifest("fp32").plans()[0]  # 128 x 128 3xTF32, stream-K
    found = dict(epilogue_schedules.variants(plan))
    assert {"data-parallel", "persistent staged", "stream-k", "pingpong"} <= set(found)
    assert "registers" in found["pingpong"]  # two 128 x 128 3xTF32 consumers do not fit: the reason kept
    made = found["stream-k staged"]
    assert made.spec["bias"] == "col" and made.spec["activation"] == "gelu" and made.spec["epilogue.staged"]
