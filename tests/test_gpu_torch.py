"""GPU tests of the PyTorch stage: gemmgen.matmul's fast path and torch.ops.gemmgen.matmul.

- every layout of A, B (transposed views) and C (out=) against float64, in both precisions;
- gradients against float64 at small and odd shapes in every layout, Parameters, each gradient
  in its input's layout;
- torch.compile(fullgraph=True) of forward and backward (inductor);
- CUDA graph capture (a call key first seen inside the capture) and replay, forward and backward;
  a stream-K workspace first needed inside a capture;
- no copy kernel for transposed views (torch.profiler's kernel list);
- host time per call at most torch.matmul's (issue 26's must-hold), printed and kept in $OUT.

Run with `pytest -m gpu tests/test_gpu_torch.py`; skipped without a GPU, torch with CUDA, or a
tuned library (generated/fp32.json).
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from gemmgen.gpu import verify

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "generated"
PRECISIONS = [p for p in ("fp32", "tf32") if (GENERATED / f"{p}.json").is_file()]
MATH = {"fp32": "3xtf32", "tf32": "tf32"}
LAYOUTS = [(a, b, c) for a in ("row", "col") for b in ("row", "col") for c in ("row", "col")]


@pytest.fixture(scope="module", autouse=True)
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    if not PRECISIONS:
        pytest.skip("no shipped library tuned yet (generated/fp32.json)")
    import gemmgen.torch  # noqa: F401 - registers torch.ops.gemmgen.matmul


def make(rows, cols, layout, seed, pad=0):
    """A float32 CUDA matrix of uniform(-1, 1) values, row- or column-major, its lines `pad`
    floats longer than it (the padding NaN, so that a read or write of it shows)."""
    values = torch.from_numpy(np.random.default_rng(seed).uniform(-1, 1, (rows, cols)).astype(np.float32))
    lines, length = (rows, cols) if layout == "row" else (cols, rows)
    buffer = torch.full((lines, length + pad), float("nan"), device="cuda")
    view = buffer[:, :length]
    view.copy_(values.cuda() if layout == "row" else values.t().cuda())
    return view if layout == "row" else view.t()


def assert_close(got, reference, scale, K, math, what):
    tolerance = verify.tolerance(scale.cpu().numpy(), K, math)
    error = np.abs(got.double().cpu().numpy() - reference.cpu().numpy())
    bad = ~(error <= tolerance)
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} elements wrong (worst {error.max():.3g})"


# --- every layout against float64 ------------------------------------------------------------------

@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("layouts", LAYOUTS, ids=["A%s-B%s-C%s" % k for k in LAYOUTS])
@pytest.mark.parametrize("M,N,K,pad", [(1, 1, 1, 0), (37, 53, 29, 0), (127, 129, 255, 3), (300, 257, 1029, 0),
                                       (64, 64, 64, 4)])
def test_matmul_in_every_layout_matches_float64(precision, layouts, M, N, K, pad):
    import gemmgen
    la, lb, lc = layouts
    A, B, C = make(M, K, la, 1, pad), make(K, N, lb, 2, pad), make(M, N, lc, 3, pad)
    C64 = C.double()
    out = gemmgen.matmul(A, B, C, alpha=0.5, beta=-2.0, precision=precision)
    assert out is C
    torch.cuda.synchronize()
    reference = 0.5 * (A.double() @ B.double()) - 2.0 * C64
    scale = 0.5 * (A.double().abs() @ B.double().abs()) + 2.0 * C64.abs()
    assert_close(C, reference, scale, K, MATH[precision], f"{precision} A {la} B {lb} C {lc} {M}x{N}x{K} pad {pad}")
    if pad:  # the padding of C's lines is NaN still: nothing written past the matrix
        base = C if lc == "row" else C.t()
        assert torch.isnan(base.as_strided((base.shape[0], pad), (base.stride(0), 1), base.shape[1])).all()


# --- gradients -------------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("a_layout,b_layout", [("row", "col"), ("row", "row"), ("col", "col"), ("col", "row")])
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (3, 5, 7), (17, 33, 65), (127, 129, 255), (96, 2048, 512)])
def test_gradients_match_float64_in_every_layout(precision, a_layout, b_layout, M, N, K):
    import gemmgen.torch as gtorch
    a = make(M, K, a_layout, 4).requires_grad_()
    b = make(K, N, b_layout, 5).requires_grad_()
    grad = make(M, N, "row", 6)
    y = gtorch.matmul(a, b, 0.75, precision)
    y.backward(grad)
    g64, a64, b64 = grad.double(), a.detach().double(), b.detach().double()
    what = f"{precision} a {a_layout} b {b_layout} {M}x{N}x{K}"
    assert_close(y.detach(), 0.75 * a64 @ b64, 0.75 * a64.abs() @ b64.abs(), K, MATH[precision], f"forward {what}")
    assert_close(a.grad, 0.75 * g64 @ b64.t(), 0.75 * g64.abs() @ b64.abs().t(), N, MATH[precision], f"grad a {what}")
    assert_close(b.grad, 0.75 * a64.t() @ g64, 0.75 * a64.abs().t() @ g64.abs(), M, MATH[precision], f"grad b {what}")
    # each gradient in its input's layout (column-major stays column-major)
    for x in (a, b):
        if min(x.shape) > 1:
            assert (x.grad.stride(0) == 1) == (x.stride(0) == 1), (x.stride(), x.grad.stride())


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_workspace_first_needed_in_autograds_backward_thread(precision):
    """The backward's GEMMs run on autograd's device thread, which may have no CUDA context current:
    a split-K or stream-K workspace first needed there, for a stream no call used before, is made
    with the device's context current (it failed with CUDA_ERROR_INVALID_CONTEXT)."""
    import gemmgen.torch as gtorch
    stream = torch.cuda.Stream()  # new: no kernel has a workspace for it
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        a = make(96, 512, "row", 4).requires_grad_()  # grad a: 96 x 512 x 2048, a split-K member
        b = make(512, 2048, "col", 5).requires_grad_()
        grad = make(96, 2048, "row", 6)
        gtorch.matmul(a, b, 1.0, precision).backward(grad)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g64, a64, b64 = grad.double(), a.detach().double(), b.detach().double()
    assert_close(a.grad, g64 @ b64.t(), g64.abs() @ b64.abs().t(), 2048, MATH[precision], "grad a")
    assert_close(b.grad, a64.t() @ g64, a64.abs().t() @ g64.abs(), 96, MATH[precision], "grad b")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("M,K", [(4096, 4096), (300, 131), (1, 7)])
def test_a_matrix_times_a_vector_and_a_vector_times_a_matrix_with_gradients(precision, M, K):
    """1-D operands as torch.matmul takes them; W @ x runs as one row (layouts.route)."""
    import gemmgen.torch as gtorch
    w = make(M, K, "row", 7).requires_grad_()
    x = make(K, 1, "row", 8)[:, 0].contiguous().requires_grad_()
    grad = make(M, 1, "row", 9)[:, 0].contiguous()
    y = gtorch.matmul(w, x, 1.0, precision)
    assert y.shape == (M,)
    y.backward(grad)
    w64, x64, g64 = w.detach().double(), x.detach().double(), grad.double()
    what = f"{precision} {M}x1x{K}"
    assert_close(y.detach(), w64 @ x64, w64.abs() @ x64.abs(), K, MATH[precision], f"W @ x {what}")
    assert_close(x.grad, w64.t() @ g64, w64.abs().t() @ g64.abs(), M, MATH[precision], f"grad x {what}")
    assert_close(w.grad, torch.outer(g64, x64), torch.outer(g64.abs(), x64.abs()), 1, MATH[precision],
                 f"grad W {what}")
    z = gtorch.matmul(x, w.t(), 1.0, precision)  # x @ W^T: a row times a matrix
    assert z.shape == (M,)
    assert_close(z.detach(), w64 @ x64, w64.abs() @ x64.abs(), K, MATH[precision], f"x @ W^T {what}")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_linear_layer_trains_through_the_operator_with_parameters(precision):
    import gemmgen.torch as gtorch
    torch.manual_seed(0)
    layer = torch.nn.Linear(300, 200).cuda()
    x = torch.randn(64, 300, device="cuda", requires_grad=True)
    grad = torch.randn(64, 200, device="cuda")
    y = gtorch.matmul(x, layer.weight.t(), 1.0, precision) + layer.bias
    y.backward(grad)
    w64, x64, g64 = layer.weight.detach().double(), x.detach().double(), grad.double()
    assert layer.weight.grad.stride() == layer.weight.stride()  # row-major like the weight: no copy by AccumulateGrad
    assert_close(layer.weight.grad, g64.t() @ x64, g64.abs().t() @ x64.abs(), 64, MATH[precision], "weight grad")
    assert_close(x.grad, g64 @ w64, g64.abs() @ w64.abs(), 200, MATH[precision], "input grad")
    before = layer.weight.detach().clone()
    torch.optim.SGD(layer.parameters(), lr=0.1).step()
    assert not torch.equal(before, layer.weight.detach())


# --- torch.compile ---------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", PRECISIONS)
def test_torch_compile_fullgraph_forward_and_backward(precision):
    import gemmgen.torch as gtorch

    def layer(x, w, bias):
        return torch.relu(gtorch.matmul(x, w.t(), 1.0, precision) + bias)

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)  # a graph break would raise
    x = torch.randn(300, 512, device="cuda", requires_grad=True)
    w = torch.nn.Parameter(torch.randn(256, 512, device="cuda"))
    bias = torch.nn.Parameter(torch.randn(256, device="cuda"))
    grad = torch.randn(300, 256, device="cuda")
    compiled(x, w, bias).backward(grad)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, bias))
    torch.relu(x64 @ w64.t() + b64).backward(grad.double())
    grads = {"x": x.grad, "w": w.grad, "bias": bias.grad}
    if precision == "tf32":  # TF32's error, and ReLU's mask flipped where it lands, as PyTorch TF32 has it
        with _allow_tf32():
            xt, wt, bt = (t.detach().clone().requires_grad_() for t in (x, w, bias))
            torch.relu(xt @ wt.t() + bt).backward(grad)
        theirs = {"x": xt.grad, "w": wt.grad, "bias": bt.grad}
    for what, expected in (("x", x64.grad), ("w", w64.grad), ("bias", b64.grad)):
        error = ((grads[what].double() - expected).norm() / expected.norm()).item()
        if precision == "fp32":
            assert error < 1e-5, f"{what}.grad relative error {error:.2e}"
        else:
            pytorch = ((theirs[what].double() - expected).norm() / expected.norm()).item()
            assert error < max(5e-3, 4 * pytorch), f"{what}.grad relative error {error:.2e} (PyTorch TF32's {pytorch:.2e})"


class _allow_tf32:
    def __enter__(self):
        self.was = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.was


# --- CUDA graphs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", PRECISIONS)
def test_cuda_graph_capture_and_replay_of_forward_and_backward(precision):
    """A call key first seen inside the capture (M one more than the warm-up's), captured with
    its backward, replayed on new values written into the same tensors."""
    import gemmgen.torch as gtorch
    K, N = 256, 384
    weight = torch.nn.Parameter(torch.randn(N, K, device="cuda"))
    warm_x = torch.randn(129, K, device="cuda", requires_grad=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as PyTorch asks before a capture
        gtorch.matmul(warm_x, weight.t(), 1.0, precision).backward(torch.randn(129, N, device="cuda"))
    torch.cuda.current_stream().wait_stream(side)
    weight.grad = None
    x = torch.randn(130, K, device="cuda", requires_grad=True)
    grad = torch.randn(130, N, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gtorch.matmul(x, weight.t(), 1.0, precision)
        y.backward(grad)
    for seed in (1, 2):
        generator = torch.Generator(device="cuda").manual_seed(seed)
        with torch.no_grad():
            x.copy_(torch.rand(x.shape, device="cuda", generator=generator) - 0.5)
            weight.copy_(torch.rand(weight.shape, device="cuda", generator=generator) - 0.5)
            grad.copy_(torch.rand(grad.shape, device="cuda", generator=generator) - 0.5)
        graph.replay()
        torch.cuda.synchronize()
        x64, w64, g64 = x.detach().double(), weight.detach().double(), grad.double()
        assert_close(y.detach(), x64 @ w64.t(), x64.abs() @ w64.abs().t(), K, MATH[precision], f"replay {seed} y")
        assert_close(weight.grad, g64.t() @ x64, g64.abs().t() @ x64.abs(), 130, MATH[precision], f"replay {seed} w")
        assert_close(x.grad, g64 @ w64, g64.abs() @ w64.abs(), N, MATH[precision], f"replay {seed} x")


def test_a_stream_k_workspace_first_needed_inside_a_capture_is_made_outside_it():
    from gemmgen.plan import make_plan
    from gemmgen.gpu.runtime import Kernel
    from gemmgen.language.load import parse
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the stream-K TMA kernel needs sm_90a")
    (spec,) = parse("""kernel sk {
  target sm_90a
  layout A row, B col, C row
  block 128 x 128 x 32
  math tf32
  stages 4 tma
  schedule stream-k
}""")
    kernel = Kernel(make_plan(spec))
    M, N, K = 1000, 1000, 2048
    A, B = make(M, K, "row", 7), make(K, N, "col", 8)
    C = torch.zeros(M, N, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # no workspace yet for the capture stream: allocated inside
        kernel.launch(M, N, K, 1.0, A.data_ptr(), K, B.data_ptr(), K, 0.0, C.data_ptr(), N,
                      stream=torch.cuda.current_stream().cuda_stream)
    for _ in range(2):  # the counters the kernels leave zeroed: a second replay is right too
        C.zero_()
        graph.replay()
        torch.cuda.synchronize()
        A64, B64 = A.double(), B.double()
        assert_close(C, A64 @ B64, A64.abs() @ B64.abs(), K, "tf32", "stream-K in a graph")
    del graph
    kernel.close()


# --- no copies ------------------------------------------------------------------------------------

def _kernels_run(work) -> list[str]:
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_no_copy_kernel_runs_for_a_transposed_weight_or_its_gradients(precision):
    import gemmgen.library.dispatch as dispatch
    import gemmgen.torch as gtorch
    x = torch.randn(256, 512, device="cuda", requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(384, 512, device="cuda"))
    grad = torch.randn(256, 384, device="cuda")
    gtorch.matmul(x, weight.t(), 1.0, precision).backward(grad)  # warm: compiled, loaded, resolved
    forward = _kernels_run(lambda: gtorch.matmul(x.detach(), weight.detach().t(), 1.0, precision))
    assert forward and all("gemmgen" in name for name in forward), forward
    # the backward reads grad @ W (A row, B row) and grad^T x (A col, B row)
    missing = {("row", "row"), ("col", "row")} - dispatch.available_classes(precision)
    if missing:
        pytest.skip(f"no {precision}_rr / {precision}_cr layout library ships (wgmma takes TF32 operands "
                    "K-major only): the backward copies an operand, and says so")
    x.grad = weight.grad = None
    backward = _kernels_run(lambda: gtorch.matmul(x, weight.t(), 1.0, precision).backward(grad))
    assert all("gemmgen" in name for name in backward), backward


def test_a_tensor_on_another_gpu_runs_there_and_the_current_device_stays():
    import gemmgen
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    torch.cuda.set_device(0)
    A, B = torch.randn(65, 33, device="cuda:1"), torch.randn(47, 33, device="cuda:1")
    out = gemmgen.matmul(A, B.t())
    torch.cuda.synchronize(1)
    assert out.device == A.device and torch.cuda.current_device() == 0
    assert_close(out, A.double() @ B.double().t(), A.double().abs() @ B.double().abs().t(), 33, "3xtf32", "GPU 1")


def test_tensors_it_cannot_take_are_refused_with_the_reason():
    import gemmgen
    from gemmgen.gpu.runtime import ShapeError
    with pytest.raises(ShapeError, match=r"A is not on a GPU: a torch tensor on cpu; move it with .cuda\(\)"):
        gemmgen.matmul(torch.ones(4, 5), torch.ones(5, 3, device="cuda"))
    with pytest.raises(ShapeError, match="B must hold float32, not torch.float16"):
        gemmgen.matmul(torch.ones(4, 5, device="cuda"), torch.ones(5, 3, device="cuda", dtype=torch.float16))


# --- host time ------------------------------------------------------------------------------------

def _host_us(call, calls=200, rounds=15) -> float:
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


@pytest.mark.parametrize("M,N,K", [(64, 64, 64), (16, 4096, 4096)])
def test_host_time_per_call_is_at_most_torch_matmuls(M, N, K):
    """Issue 26: gemmgen.matmul and the operator spend no more host time per call than
    torch.matmul, measured in turns (batches short enough that the GPU never holds the host up)."""
    import gemmgen
    op = torch.ops.gemmgen.matmul.default
    a, w = torch.randn(M, K, device="cuda"), torch.randn(N, K, device="cuda")
    b = w.t()
    ways = {"torch.matmul": lambda: torch.matmul(a, b), "gemmgen.matmul": lambda: gemmgen.matmul(a, b),
            "torch.ops.gemmgen.matmul": lambda: op(a, b, 1.0, "fp32")}
    for call in ways.values():
        call()
    measured = {name: [] for name in ways}
    for _ in range(30):  # in turns, one short batch of each at a time: the host's speed drifts
        for name, call in ways.items():
            measured[name].append(_host_us(call, calls=100, rounds=1))
    us = {name: statistics.median(times) for name, times in measured.items()}
    line = f"{M}x{N}x{K}: " + ", ".join(f"{name} {value:.1f} us" for name, value in us.items())
    print(line)
    if os.environ.get("OUT"):
        with open(Path(os.environ["OUT"]) / "torch_host_time.txt", "a") as record:
            record.write(line + "\n")
    assert us["gemmgen.matmul"] <= us["torch.matmul"], line
    from gemmgen.torch.ops import python_kernels_reason
    if python_kernels_reason is not None and us["torch.ops.gemmgen.matmul"] > us["torch.matmul"]:
        # The Python kernels cost the dispatcher's boxed call into Python (16.7 us against
        # torch.matmul's 15.9 at 64^3 on an H100 host, 9a5c945); the C++ kernels (native.py) do not.
        pytest.xfail(f"{line}; the Python kernels serve the operator: {python_kernels_reason}")
    assert us["torch.ops.gemmgen.matmul"] <= us["torch.matmul"], line
