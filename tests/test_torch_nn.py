"""gemmgen.torch.Linear and use_gemmgen on the CPU (skipped without torch).

The operator runs on CPU tensors here through host libraries (torch_on_host.py), and the `host`
fixture lets host memory stand for a GPU's in gemmgen.torch.nn (its `_on_gpu`), so that Linear's
forward and backward, routing a model and tracing it run as they would on a GPU. Without the
fixture a CPU layer is what it is: left to PyTorch, with the reason.
"""

from __future__ import annotations

import copy
import io
import warnings

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import gemmgen.library.dispatch as dispatch  # noqa: E402
import gemmgen.torch as gtorch  # noqa: E402
from gemmgen.torch import nn as gnn  # noqa: E402
from torch_on_host import fast_path_on_host  # noqa: E402


@pytest.fixture
def host(monkeypatch):
    """(libraries, copies, resolved) of the host fast path; CPU tensors count as on the GPU."""
    found = fast_path_on_host(monkeypatch)
    monkeypatch.setattr(gnn, "_on_gpu", lambda tensor: tensor.device.type == "cpu")
    monkeypatch.setattr(gnn, "_warned", set())
    return found


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(gnn, "_warned", set())


def calls_made(libraries) -> list[tuple[int, int, int]]:
    return [call for library in libraries.values() for call in library.calls]


def pointers_read(libraries) -> set[int]:
    return {pointer for library in libraries.values() for a, b, _ in library.pointers for pointer in (a, b)}


def reference_linear(x, layer):
    bias = None if layer.bias is None else layer.bias.detach().double()
    return F.linear(x.detach().double(), layer.weight.detach().double(), bias)


class Net(nn.Module):
    """Linear layers at three depths: the model's own, in a ModuleList of Sequentials, and a head."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16, bias=False))
                                    for _ in range(2))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


LINEARS = ["inp", "blocks.0.0", "blocks.0.2", "blocks.1.0", "blocks.1.2", "head"]


# --- Linear ---------------------------------------------------------------------------------------

def test_linear_is_an_nn_linear_with_its_initialisation_and_state_dict():
    torch.manual_seed(3)
    ours = gtorch.Linear(5, 3)
    torch.manual_seed(3)
    theirs = nn.Linear(5, 3)
    assert isinstance(ours, nn.Linear) and ours.precision == "fp32"
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight", "bias"]
    plain = nn.Linear(5, 3)
    plain.load_state_dict(ours.state_dict())           # a gemmgen checkpoint into nn.Linear
    assert torch.equal(plain.weight, ours.weight)
    again = gtorch.Linear(5, 3, precision="tf32")
    again.load_state_dict(theirs.state_dict())          # and back
    assert torch.equal(again.bias, theirs.bias)
    assert list(gtorch.Linear(5, 3, bias=False).state_dict()) == ["weight"]
    # nn.Linear's arguments in nn.Linear's order; precision by name
    made = gtorch.Linear(5, 3, False, "cpu", torch.float64, precision="tf32")
    assert made.bias is None and made.weight.dtype == torch.float64 and made.precision == "tf32"
    assert repr(made) == "Linear(in_features=5, out_features=3, bias=False, precision=tf32)"
    with pytest.raises(ValueError, match="precision 'fp16': one of fp32, tf32"):
        gtorch.Linear(5, 3, precision="fp16")


@pytest.mark.parametrize("shape", [(7, 5), (2, 3, 5), (5,), (2, 1, 3, 5), (0, 5)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_float64_for_any_leading_dimensions_reading_x_in_place(shape, bias, host):
    libraries, copies, _ = host
    torch.manual_seed(0)
    layer = gtorch.Linear(5, 3, bias=bias)
    x = torch.randn(shape)
    y = layer(x)
    assert y.shape == F.linear(x, layer.weight, layer.bias).shape and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), reference_linear(x, layer), rtol=1e-6, atol=1e-6)
    rows = x.numel() // 5
    assert calls_made(libraries) == [(rows, 3, 5)] and copies == []
    if rows:  # the GEMM read x's own memory (a view) and the weight's, transposed in place
        assert {x.data_ptr(), layer.weight.data_ptr()} <= pointers_read(libraries)


def test_linear_reads_a_column_major_input_in_place(host):
    libraries, copies, _ = host
    layer = gtorch.Linear(6, 4)
    x = torch.randn(6, 9).t()                           # 9 x 6, column-major
    torch.testing.assert_close(layer(x).double(), reference_linear(x, layer), rtol=1e-6, atol=1e-6)
    assert copies == [] and x.data_ptr() in pointers_read(libraries)


def test_linear_gradients_match_float64_and_the_weights_gradient_keeps_its_layout(host):
    libraries, copies, _ = host
    torch.manual_seed(1)
    layer = gtorch.Linear(5, 3)
    x = torch.randn(2, 4, 5, requires_grad=True)
    grad = torch.randn(2, 4, 3)
    layer(x).backward(grad)
    x64 = x.detach().double().requires_grad_()
    w64, b64 = (p.detach().double().requires_grad_() for p in (layer.weight, layer.bias))
    F.linear(x64, w64, b64).backward(grad.double())
    for got, expected in ((x.grad, x64.grad), (layer.weight.grad, w64.grad), (layer.bias.grad, b64.grad)):
        torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)
    assert layer.weight.grad.stride() == layer.weight.stride()
    # the forward (8 x 3 x 5), grad_x = grad W (8 x 5 x 3), grad_W = (grad^T x) (3 x 5 x 8): no copy
    assert sorted(calls_made(libraries)) == [(3, 5, 8), (8, 3, 5), (8, 5, 3)] and copies == []


def test_inputs_a_linear_cannot_take_are_refused_with_the_reason(host):
    from gemmgen.gpu.runtime import ShapeError
    layer = gtorch.Linear(5, 3)
    with pytest.raises(ShapeError, match="A is 4 x 6 but B is 5 x 3: inner sizes differ"):
        layer(torch.randn(2, 2, 6))
    with pytest.raises(RuntimeError, match="both arguments to linear need to be at least 1D"):
        layer(torch.tensor(1.0))


def test_linear_runs_in_its_precision(host, monkeypatch):
    libraries, _, _ = host
    asked = []
    monkeypatch.setattr(dispatch, "library", lambda precision, device, klass: asked.append(precision)
                        or libraries[klass])
    layer = gtorch.Linear(5, 3, precision="tf32")
    layer(torch.randn(4, 5))
    layer.precision = "fp32"
    layer(torch.randn(4, 5))
    assert asked == ["tf32", "fp32"]


def test_what_gemmgen_cannot_take_runs_torchs_linear_with_a_warning_once(fresh_warnings):
    layer = gtorch.Linear(5, 3)                         # on the CPU, no fixture: not gemmgen's
    x = torch.randn(4, 5)
    with pytest.warns(RuntimeWarning, match=r"^gemmgen.torch.Linear: gemmgen runs on CUDA GPUs, and this call "
                                            r"has a tensor on cpu; running torch's F.linear instead$"):
        y = layer(x)
    assert torch.equal(y, F.linear(x, layer.weight, layer.bias))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer(x)                                        # once per reason


def test_a_float64_layer_runs_torchs_linear_with_the_reason(host):
    libraries, _, _ = host
    layer = gtorch.Linear(5, 3, dtype=torch.float64)
    x = torch.randn(4, 5, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match=r"gemmgen multiplies float32, not input torch.float64 with weight "
                                            r"torch.float64; running torch's F.linear instead"):
        y = layer(x)
    assert torch.equal(y, F.linear(x, layer.weight, layer.bias)) and calls_made(libraries) == []


# --- use_gemmgen ----------------------------------------------------------------------------------

def test_use_gemmgen_routes_every_linear_keeping_its_parameters_and_undoes(host):
    libraries, copies, _ = host
    torch.manual_seed(2)
    model = Net()
    parameters = dict(model.named_parameters())
    state = {name: tensor.data_ptr() for name, tensor in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)   # built before the routing
    x = torch.randn(3, 8)
    before = model(x).detach()

    routing = gtorch.use_gemmgen(model)
    assert routing.routed == LINEARS and routing.skipped == {} and routing.active
    assert all(type(model.get_submodule(name)) is gtorch.Linear for name in LINEARS)
    assert all(model.get_submodule(name).precision == "fp32" for name in LINEARS)
    assert {name: p for name, p in model.named_parameters()} == parameters          # the same objects
    assert all(p is parameters[name] for name, p in model.named_parameters())
    assert {name: t.data_ptr() for name, t in model.state_dict().items()} == state
    y = model(x)
    torch.testing.assert_close(y.detach(), before, rtol=1e-5, atol=1e-6)
    assert len(calls_made(libraries)) == len(LINEARS) and copies == []
    y.square().sum().backward()
    assert len(calls_made(libraries)) == len(LINEARS) * 3 - 1   # no grad_x for the input, which needs none
    old = model.head.weight.detach().clone()
    optimizer.step()                                        # the optimizer's tensors are the model's
    assert not torch.equal(old, model.head.weight.detach())

    routing.undo()
    assert not routing.active and "undone" in repr(routing)
    assert all(type(model.get_submodule(name)) is nn.Linear for name in LINEARS)
    assert all("precision" not in model.get_submodule(name).__dict__ for name in LINEARS)
    assert all(p is parameters[name] for name, p in model.named_parameters())
    done = len(calls_made(libraries))
    model(x)
    assert len(calls_made(libraries)) == done                 # PyTorch's own again
    routing.undo()                                            # a second undo does nothing


def test_a_model_that_is_a_linear_is_routed_too(host):
    layer = nn.Linear(4, 2)
    with gtorch.use_gemmgen(layer, "tf32") as routing:
        assert routing.routed == ["(the model itself)"] and type(layer) is gtorch.Linear
    assert type(layer) is nn.Linear


def test_layers_gemmgen_cannot_take_are_left_to_pytorch_each_with_its_reason(host):
    model = nn.ModuleDict({
        "fine": nn.Linear(4, 4),
        "fp16": nn.Linear(4, 4).half(),
        "fp64": nn.Linear(4, 4).double(),
        "on_meta": nn.Linear(4, 4, device="meta"),
        "attention": nn.MultiheadAttention(4, 2),            # its out_proj is a subclass of nn.Linear
        "hooked": nn.Linear(4, 4),
    })
    hooked = model["hooked"]
    hooked.forward = lambda x: x                             # as another library might
    with pytest.warns(RuntimeWarning) as caught:
        routing = gtorch.use_gemmgen(model)
    assert routing.routed == ["fine"]
    assert routing.skipped == {
        "fp16": "its weight is torch.float16: gemmgen multiplies float32",
        "fp64": "its weight is torch.float64: gemmgen multiplies float32",
        "on_meta": "its weight is on meta: gemmgen runs on CUDA GPUs (move the model with .cuda() first)",
        "attention.out_proj": "its class torch.nn.modules.linear.NonDynamicallyQuantizableLinear is a subclass of "
                              "nn.Linear, which may not run nn.Linear's forward; replace it by gemmgen.torch.Linear "
                              "yourself if it does",
        "hooked": "its forward is replaced on the module itself (a hook of another library), which would still run",
    }
    (warning,) = caught
    assert str(warning.message).startswith("gemmgen.torch.use_gemmgen: 5 of 6 nn.Linear layers left to PyTorch. "
                                           "fp16: its weight is torch.float16")
    assert "; and" not in str(warning.message)               # five reasons fit; more are counted
    assert type(model["fp16"]) is nn.Linear and type(model["attention"].out_proj).__name__ == \
        "NonDynamicallyQuantizableLinear"
    routing.undo()
    assert type(model["fine"]) is nn.Linear


def test_without_a_gpu_every_layer_is_left_to_pytorch_and_the_warning_counts_them():
    with pytest.warns(RuntimeWarning, match=r"6 of 6 nn.Linear layers left to PyTorch\. inp: its weight is on cpu: "
                                            r"gemmgen runs on CUDA GPUs \(move the model with .cuda\(\) first\);.*"
                                            r"; and 1 more \(Routing.skipped lists them\)$"):
        routing = gtorch.use_gemmgen(Net())
    assert routing.routed == [] and list(routing.skipped) == LINEARS


def test_routings_nest_and_a_gemmgen_linear_gets_its_own_precision_back(host):
    model = nn.Sequential(nn.Linear(4, 4), gtorch.Linear(4, 4, precision="tf32"))
    with gtorch.use_gemmgen(model, "tf32"):
        inner = gtorch.use_gemmgen(model, "fp32")
        assert [type(m) for m in model] == [gtorch.Linear] * 2 and [m.precision for m in model] == ["fp32"] * 2
        inner.undo()
        assert [m.precision for m in model] == ["tf32", "tf32"]
    assert type(model[0]) is nn.Linear and "precision" not in model[0].__dict__
    assert type(model[1]) is gtorch.Linear and model[1].precision == "tf32"


def test_bad_arguments_are_refused_before_anything_changes(host):
    model = Net()
    with pytest.raises(ValueError, match="precision 'bf16': one of fp32, tf32"):
        gtorch.use_gemmgen(model, "bf16")
    assert type(model.inp) is nn.Linear
    with pytest.raises(TypeError, match="use_gemmgen takes a torch.nn.Module, not dict"):
        gtorch.use_gemmgen({"inp": model.inp})


def test_a_routed_model_copies_saves_and_loads(host):
    model = Net()
    gtorch.use_gemmgen(model)
    twin = copy.deepcopy(model)
    assert type(twin.head) is gtorch.Linear and twin.head.weight is not model.head.weight
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded.head) is gtorch.Linear and loaded.head.precision == "fp32"
    plain = Net()
    plain.load_state_dict(model.state_dict())              # a routed model's checkpoint is nn.Linear's
    assert torch.equal(plain.head.weight, model.head.weight)


def test_torch_compile_traces_a_routed_model_forward_and_backward_without_a_break(host):
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    graphs = {}

    def keep(name):
        def compiler(graph, inputs):
            graphs[name] = graph
            return make_boxed_func(graph.forward)
        return compiler

    torch.manual_seed(4)
    model = Net()
    reference = copy.deepcopy(model).double()
    gtorch.use_gemmgen(model)
    torch._dynamo.reset()
    step = torch.compile(lambda x: model(x).square().sum(), fullgraph=True,
                         backend=aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward")))
    x = torch.randn(2, 3, 8)
    step(x).backward()
    reference(x.double()).square().sum().backward()
    for (name, got), expected in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad.double(), expected.grad, rtol=1e-5, atol=1e-6, msg=name)

    def gemms(graph):
        return [n for n in graph.graph.nodes if n.op == "call_function" and str(n.target) == "gemmgen.matmul.default"]

    assert len(gemms(graphs["forward"])) == len(LINEARS)
    assert len(gemms(graphs["backward"])) == 2 * len(LINEARS) - 1
    torch._dynamo.reset()
