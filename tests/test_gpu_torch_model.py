"""GPU tests of gemmgen in a PyTorch model: a small transformer (benchmarks/torch_model.py's, 2
layers, hidden 128) routed through gemmgen by use_gemmgen.

- trained for 40 AdamW steps on a fixed synthetic task, its loss falls, and its loss curve and
  final weights track the same model trained in float64 by PyTorch; in fp32, as closely as
  PyTorch FP32 does (both are held to the same bounds), and its gradient error against float64 is
  at most PyTorch FP32's with a 25% slack;
- torch.compile(fullgraph=True) of a routed model's loss, its backward and AdamW steps, against
  the same steps in eager mode, every Linear's GEMMs (forward and backward) run by gemmgen;
- a CUDA graph of a routed forward, replayed on new tokens;
- Linear against float64 with batch dimensions and a bias; autocast falls back to PyTorch.

Run with `pytest -m gpu tests/test_gpu_torch_model.py`; skipped without a GPU, torch with CUDA, or a
tuned library (generated/fp32.json).
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
PRECISIONS = [p for p in ("fp32", "tf32") if (ROOT / "generated" / f"{p}.json").is_file()]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.append(str(ROOT / "benchmarks"))

CONFIG = dict(vocab=64, hidden=128, ffn=256, layers=2, heads=4, batch=8, seq=32)
LINEARS = 7 * CONFIG["layers"] + 1
STEPS, LR = 40, 3e-3

# How far a model trained in 32-bit floats may stray from the one trained in float64: the largest
# relative difference of the loss at any step, and the distance between the final weights over the
# distance the float64 weights travelled (all parameters as one vector). On the CPU, PyTorch FP32
# and an emulation of 3xTF32 stray about 1e-5 on both counts at these sizes and steps, TF32
# (10-bit mantissa) about 1e-3 and 1e-2: the bounds leave a factor of 10 or more.
BOUNDS = {"fp32": {"loss": 1e-4, "weights": 2e-4}, "tf32": {"loss": 2e-2, "weights": 0.2}}
GRADIENT_SLACK = 1.25   # gemmgen fp32's gradient error <= 1.25 x PyTorch FP32's (issue 26: no larger)
# ... or under 3xTF32's floor: this model's GEMMs are short (K <= 128 and the batch), where cuBLAS
# FP32's sums are nearly exact and 3xTF32's dropped small x small terms (~2^-22 each) dominate
# (measured on an H100: 7.9e-7 against PyTorch FP32's 3.6e-7). The transformer of
# benchmarks/torch_model.py (K of 2048 and more) is where issue 26 measures it: 3.25e-6 against 7.41e-6.
FP32_GRADIENT_FLOOR = 2e-6
TF32_GRADIENT_ERROR = 3e-3


@pytest.fixture(scope="module", autouse=True)
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    if not PRECISIONS:
        pytest.skip("no shipped library tuned yet (generated/fp32.json)")


@pytest.fixture(scope="module")
def tm():
    import torch_model
    return torch_model


@contextlib.contextmanager
def pytorch_precision(tf32: bool):
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def task(config, seed: int = 0):
    """Sequences that follow a fixed random permutation of the vocabulary from random first tokens:
    (inputs, next tokens), on the GPU. The next token is a function of the current one."""
    generator = torch.Generator().manual_seed(seed)
    follow = torch.randperm(config.vocab, generator=generator)
    tokens = [torch.randint(config.vocab, (config.batch, 1), generator=generator)]
    for _ in range(config.seq):
        tokens.append(follow[tokens[-1]])
    tokens = torch.cat(tokens, dim=1).cuda()
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def model_and_task(tm, seed: int = 0):
    config = tm.Config(**CONFIG)
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = tm.Transformer(config)
    return model, config, *task(config, seed)


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().double().reshape(-1) for p in model.parameters()])


def gradient_error(tm, model, reference, inputs, targets) -> float:
    """The relative error of one backward's gradients (all parameters as one vector) against the
    float64 model's; both models' gradients are cleared again."""
    for m in (model, reference):
        m.zero_grad(set_to_none=True)
        tm.loss_of(m(inputs), targets).backward()
    difference = total = 0.0
    for p, q in zip(model.parameters(), reference.parameters()):
        difference += (p.grad.double() - q.grad).norm().item() ** 2
        total += q.grad.norm().item() ** 2
    for m in (model, reference):
        m.zero_grad(set_to_none=True)
    return math.sqrt(difference / total)


def train(tm, model, inputs, targets) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = tm.loss_of(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_model_trained_through_gemmgen_tracks_float64_as_pytorch_does(tm, precision):
    import gemmgen.torch as gtorch
    start, config, inputs, targets = model_and_task(tm)
    reference = copy.deepcopy(start).double()
    tf32 = precision == "tf32"
    ours, theirs = copy.deepcopy(start), copy.deepcopy(start)
    routing = gtorch.use_gemmgen(ours, precision)
    assert len(routing.routed) == LINEARS and not routing.skipped

    with pytorch_precision(tf32):
        errors = {"gemmgen": gradient_error(tm, ours, reference, inputs, targets),
                  "pytorch": gradient_error(tm, theirs, reference, inputs, targets)}
        w0 = flat(reference)
        curves = {"float64": train(tm, reference, inputs, targets), "gemmgen": train(tm, ours, inputs, targets),
                  "pytorch": train(tm, theirs, inputs, targets)}
    w64 = flat(reference)
    strayed = {}
    for who, model in (("gemmgen", ours), ("pytorch", theirs)):
        loss = max(abs(a - b) / b for a, b in zip(curves[who], curves["float64"]))
        weights = ((flat(model) - w64).norm() / (w64 - w0).norm()).item()
        strayed[who] = {"loss": loss, "weights": weights}
    report = (f"{precision}: gradient errors {errors}; strayed from float64 {strayed}; losses "
              f"{curves['gemmgen'][0]:.3f} -> {curves['gemmgen'][-1]:.4f} (float64 {curves['float64'][-1]:.4f})")
    print(report)

    assert curves["gemmgen"][-1] < 0.1 * curves["gemmgen"][0], report           # it learns
    bounds = BOUNDS[precision]
    # the bounds are ones that PyTorch in the same precision keeps (else they are wrong, not gemmgen)
    assert all(strayed["pytorch"][k] <= bounds[k] for k in bounds), f"PyTorch strays past the bounds: {report}"
    assert all(strayed["gemmgen"][k] <= bounds[k] for k in bounds), report
    if precision == "fp32":
        assert errors["gemmgen"] <= max(GRADIENT_SLACK * errors["pytorch"], FP32_GRADIENT_FLOOR), report
    else:
        assert errors["gemmgen"] <= TF32_GRADIENT_ERROR, report


@pytest.mark.parametrize("precision", PRECISIONS)
def test_torch_compile_fullgraph_of_a_routed_models_training_steps(tm, precision):
    import gemmgen.torch as gtorch
    from torch.profiler import ProfilerActivity, profile
    start, _, inputs, targets = model_and_task(tm, seed=1)
    eager, compiled = copy.deepcopy(start), copy.deepcopy(start)
    gtorch.use_gemmgen(eager, precision)
    gtorch.use_gemmgen(compiled, precision)  # before compiling: a compiled model keeps its layers
    torch._dynamo.reset()
    loss_of = torch.compile(lambda x, y: tm.loss_of(compiled(x), y), fullgraph=True)  # a graph break raises
    losses = {"eager": [], "compiled": []}
    optimizers = {"eager": torch.optim.AdamW(eager.parameters(), lr=LR),
                  "compiled": torch.optim.AdamW(compiled.parameters(), lr=LR)}
    steps = {"eager": lambda: tm.loss_of(eager(inputs), targets), "compiled": lambda: loss_of(inputs, targets)}
    kernels = []
    for step in range(4):
        for name in ("eager", "compiled"):
            optimizers[name].zero_grad(set_to_none=True)
            if name == "compiled" and step == 3:  # the last step, profiled: every GEMM is gemmgen's
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    loss = steps[name]()
                    loss.backward()
                    torch.cuda.synchronize()
                kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            else:
                loss = steps[name]()
                loss.backward()
            optimizers[name].step()
            losses[name].append(loss.item())
    # Inductor fuses the elementwise work (its own rounding); AdamW magnifies gradient differences
    # where a gradient is near 0. On the CPU (host GEMMs) the losses differ by ~1e-7 and the weights
    # by ~2e-6 of their norm after 4 steps.
    loss_limit, weight_limit = (1e-5, 5e-5) if precision == "fp32" else (5e-3, 5e-2)
    for a, b in zip(losses["compiled"], losses["eager"]):
        assert abs(a - b) <= loss_limit * abs(b), losses
    difference = ((flat(compiled) - flat(eager)).norm() / flat(eager).norm()).item()
    assert difference <= weight_limit, f"weights after 4 steps differ by {difference:.2e} of their norm"
    launched = sum("gemmgen" in name for name in kernels)
    # forward, grad_x and grad_W of every Linear (the embedding needs grad_x of the first ones too)
    assert launched >= 3 * LINEARS, f"{launched} gemmgen kernels in a compiled step: {sorted(set(kernels))}"
    torch._dynamo.reset()


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_cuda_graph_of_a_routed_forward_replays_on_new_tokens(tm, precision):
    import gemmgen.torch as gtorch
    model, config, inputs, _ = model_and_task(tm, seed=2)
    reference = copy.deepcopy(model).double()
    gtorch.use_gemmgen(model, precision)
    static = inputs.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():  # warm-up on a side stream, as PyTorch asks
        for _ in range(2):
            model(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        logits = model(static)
    limit = 1e-5 if precision == "fp32" else 1e-2
    for seed in (5, 6):
        fresh, _ = task(config, seed)
        static.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            eager = model(fresh)
            expected = reference(fresh)
        assert ((logits - eager).norm() / eager.norm()).item() <= 1e-6, "replay differs from the eager forward"
        error = ((logits.double() - expected).norm() / expected.norm()).item()
        assert error <= limit, f"replay {seed}: logits error {error:.2e} against float64"


@pytest.mark.parametrize("precision", PRECISIONS)
def test_linear_with_batch_dimensions_and_a_bias_matches_float64(precision):
    import gemmgen.torch as gtorch
    torch.manual_seed(3)
    layer = gtorch.Linear(300, 200, device="cuda", precision=precision)
    x = torch.randn(3, 37, 300, device="cuda", requires_grad=True)
    grad = torch.randn(3, 37, 200, device="cuda")
    y = layer(x)
    y.backward(grad)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, layer.weight, layer.bias))
    y64 = torch.nn.functional.linear(x64, w64, b64)
    y64.backward(grad.double())
    limit = 1e-5 if precision == "fp32" else 5e-3
    for got, expected, what in ((y, y64, "y"), (x.grad, x64.grad, "x.grad"), (layer.weight.grad, w64.grad, "weight"),
                                (layer.bias.grad, b64.grad, "bias")):
        error = ((got.detach().double() - expected.detach()).norm() / expected.detach().norm()).item()
        assert error <= limit, f"{what}: relative error {error:.2e}"
    assert y.shape == (3, 37, 200) and layer.weight.grad.stride() == layer.weight.stride()


def test_under_autocast_a_routed_layer_runs_pytorchs_linear_in_autocasts_dtype(monkeypatch):
    import gemmgen.torch as gtorch
    from gemmgen.torch import nn as gnn
    monkeypatch.setattr(gnn, "_warned", set())
    layer = gtorch.Linear(64, 32, device="cuda")
    x = torch.randn(8, 64, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        with pytest.warns(RuntimeWarning, match="autocast is on"):
            y = layer(x)
    assert y.dtype == torch.bfloat16
    assert layer(x).dtype == torch.float32
