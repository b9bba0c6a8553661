"""The PyTorch stage on the CPU (skipped without torch): gemmgen.matmul's fast path for tensors and
torch.ops.gemmgen.matmul's registration, autograd and tracing.

The operator's CUDA kernel is also registered for CPU tensors here, and the fast path is given
libraries that multiply on the host (host_libraries.py), so that everything but the GPU launch
runs as it would on a GPU: the per-call key, routing, swaps, copies only for odd strides, the
operator's fake implementation, autograd's backward GEMMs and torch.compile(fullgraph=True).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gemmgen  # noqa: E402
import gemmgen.library.dispatch as dispatch  # noqa: E402
import gemmgen.torch as gtorch  # noqa: E402
from gemmgen.gpu.runtime import ShapeError  # noqa: E402
from torch_on_host import fast_path_on_host, register_cpu_kernel  # noqa: E402

# The operator's CUDA kernel (gemmgen.matmul's fast path) for CPU tensors too, for these tests
# (once per process: test_torch_nn.py registers it too).
register_cpu_kernel()


@pytest.fixture
def host(monkeypatch):
    """The fast path on CPU tensors, with host libraries of every class: returns (libraries,
    copies made, call keys resolved)."""
    return fast_path_on_host(monkeypatch)


def rand(*shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed + sum(shape)).uniform(-1, 1, shape).astype(np.float32))


def as_layout(values, layout):
    """The same values, row-major or column-major (a transposed view of a dense copy)."""
    return values.contiguous() if layout == "row" else values.t().contiguous().t()


# --- gemmgen.matmul's fast path ------------------------------------------------------------------

ROUTES = {("row", "col", "row"): (("row", "col"), False), ("row", "row", "row"): (("row", "row"), False),
          ("col", "col", "row"): (("col", "col"), False), ("col", "row", "row"): (("col", "row"), False),
          ("row", "col", "col"): (("row", "col"), True), ("row", "row", "col"): (("col", "col"), True),
          ("col", "col", "col"): (("row", "row"), True), ("col", "row", "col"): (("col", "row"), True)}


@pytest.mark.parametrize("layouts", list(ROUTES), ids=["A%s-B%s-C%s" % k for k in ROUTES])
def test_tensors_in_every_layout_reach_their_library_in_place(layouts, host):
    """The library gets the views' own addresses (A and B swapped for a column-major C): no copy."""
    libraries, copies, _ = host
    la, lb, lc = layouts
    A, B, C = as_layout(rand(37, 53), la), as_layout(rand(53, 29, seed=1), lb), as_layout(rand(37, 29, seed=2), lc)
    expected = 2.0 * (A.double() @ B.double()) - 0.5 * C.double()
    out = gemmgen.matmul(A, B, C, alpha=2.0, beta=-0.5)
    assert out is C
    torch.testing.assert_close(C.double(), expected, rtol=1e-5, atol=1e-5)
    klass, swap = ROUTES[layouts]
    (pointers,) = libraries[klass].pointers
    ends = (B.data_ptr(), A.data_ptr()) if swap else (A.data_ptr(), B.data_ptr())
    assert pointers == (*ends, C.data_ptr()) and copies == []


def test_a_call_key_is_resolved_once_and_a_new_output_is_row_major(host):
    libraries, _, resolved = host
    A, W = rand(16, 64), rand(32, 64, seed=1)
    first = gemmgen.matmul(A, W.t())
    second = gemmgen.matmul(A, W.t())
    assert len(resolved) == 1 and first.stride() == (32, 1) and first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(second.double(), A.double() @ W.double().t(), rtol=1e-5, atol=1e-5)
    gemmgen.matmul(A[:8], W.t())  # another shape: another key
    assert len(resolved) == 2 and libraries[("row", "col")].calls == [(16, 32, 64)] * 2 + [(8, 32, 64)]


def test_parameters_and_tensors_that_require_grad_are_read_by_address(host):
    linear = torch.nn.Linear(64, 32, bias=False)
    x = rand(16, 64).requires_grad_()
    y = gemmgen.matmul(x, linear.weight.t())
    assert not y.requires_grad  # gemmgen.matmul records no autograd: gemmgen.torch.matmul does
    torch.testing.assert_close(y.double(), x.detach().double() @ linear.weight.detach().double().t(),
                               rtol=1e-5, atol=1e-5)


def test_only_an_operand_with_no_unit_stride_is_copied_and_a_warning_says_so_once(host):
    _, copies, _ = host
    wide = rand(40, 128)
    A, B = wide[:, ::2], rand(64, 16, seed=1)       # A: every other column
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = gemmgen.matmul(A, B)
        gemmgen.matmul(A, B)
    torch.testing.assert_close(out.double(), A.double() @ B.double(), rtol=1e-5, atol=1e-5)
    assert copies == ["row", "row"]
    (warning,) = caught
    assert str(warning.message) == "gemmgen: A of shape (40, 64) with strides (128, 2) has no unit stride; copying it"


def test_without_layout_libraries_a_transposed_operand_is_copied_with_a_warning(host, monkeypatch):
    libraries, copies, _ = host
    monkeypatch.setattr(dispatch, "available_classes", lambda precision: frozenset({("row", "col")}))
    A, B = rand(20, 30), rand(30, 10, seed=1)       # B row-major: the fp32_rr class
    with pytest.warns(RuntimeWarning, match=r"B of shape \(30, 10\) with strides \(10, 1\) is row-major; gemmgen's "
                                            r"fp32 kernels read it col-major in this call \(K contiguous\), so it is "
                                            r"copied col-major first"):
        out = gemmgen.matmul(A, B)
    torch.testing.assert_close(out.double(), A.double() @ B.double(), rtol=1e-5, atol=1e-5)
    assert copies == ["col"] and libraries[("row", "col")].calls == [(20, 10, 30)]


def test_an_output_with_no_unit_stride_is_written_through_a_copy(host):
    A, B = rand(8, 6), rand(6, 5, seed=1)
    wide = rand(8, 10, seed=2)
    before = wide.clone()
    with pytest.warns(RuntimeWarning, match=r"out of shape \(8, 5\) with strides \(10, 2\) has no unit stride"):
        gemmgen.matmul(A, B, wide[:, ::2], beta=1.0)
    torch.testing.assert_close(wide[:, ::2].double(), A.double() @ B.double() + before[:, ::2].double(),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wide[:, 1::2], before[:, 1::2])


def test_bad_tensors_are_refused_with_the_reason(host, monkeypatch):
    with pytest.raises(ShapeError, match="A must hold float32, not torch.float64"):
        gemmgen.matmul(rand(4, 5).double(), rand(5, 3))
    with pytest.raises(ShapeError, match="inner sizes differ"):
        gemmgen.matmul(rand(4, 5), rand(6, 3))
    with pytest.raises(ShapeError, match=r"B must be a matrix \(2-D\) or a batch of matrices \(\.\.\., rows, cols\), "
                                         r"not 0-D of shape \(\)"):
        gemmgen.matmul(rand(4, 5), torch.tensor(1.0))  # (a 1-D B is a column: test_gemmgen_matmul_takes_torch_vectors)
    with pytest.raises(ShapeError, match=r"A and B must be vectors, matrices or batches of matrices"):
        gemmgen.matmul(torch.tensor(1.0), rand(5))
    with pytest.raises(ShapeError, match=r"batch dimensions do not broadcast: \(2,\) and \(3,\)"):
        gemmgen.matmul(rand(2, 4, 5), rand(3, 5, 3))
    with pytest.raises(ShapeError, match=r"out must be 4 x 3"):
        gemmgen.matmul(rand(4, 5), rand(5, 3), rand(3, 4))
    with pytest.raises(ValueError, match="beta != 0 needs an `out`"):
        gemmgen.matmul(rand(4, 5), rand(5, 3), beta=2.0)
    with pytest.raises(ValueError, match="precision 'fp16'"):
        gemmgen.matmul(rand(4, 5), rand(5, 3), precision="fp16")
    monkeypatch.undo()
    with pytest.raises(ShapeError, match=r"A is not on a GPU: a torch tensor on cpu; move it with .cuda\(\)"):
        gemmgen.matmul(rand(4, 5), rand(5, 3))


# --- torch.ops.gemmgen.matmul ---------------------------------------------------------------------

def test_the_operators_schema_and_fake_implementation():
    from torch._subclasses.fake_tensor import FakeTensorMode
    assert str(torch.ops.gemmgen.matmul.default._schema) == \
        'gemmgen::matmul(Tensor a, Tensor b, float alpha=1., str precision="fp32") -> Tensor'
    with FakeTensorMode():
        a, b = torch.empty(7, 3, device="cuda"), torch.empty(11, 3, device="cuda").t()
        out = gtorch.matmul(a, b, 2.0, "tf32")
        assert (tuple(out.shape), out.stride(), out.device.type) == ((7, 11), (11, 1), "cuda")
        with pytest.raises(ValueError, match="inner sizes differ"):
            gtorch.matmul(a, a)
        with pytest.raises(ValueError, match="float32 tensors, not torch.float16"):
            gtorch.matmul(a.half(), b.half())
        with pytest.raises(ValueError, match="precision 'bf16'"):
            gtorch.matmul(a, b, 1.0, "bf16")


@pytest.mark.parametrize("a_layout,b_layout", [("row", "col"), ("row", "row"), ("col", "col"), ("col", "row")])
def test_gradients_match_float64_and_the_backward_reads_transposed_views(a_layout, b_layout, host):
    libraries, copies, _ = host
    a = as_layout(rand(13, 7), a_layout).requires_grad_()
    b = as_layout(rand(7, 5, seed=1), b_layout).requires_grad_()
    grad = rand(13, 5, seed=2)
    gtorch.matmul(a, b, 0.5).backward(grad)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    (0.5 * a64 @ b64).backward(grad.double())
    torch.testing.assert_close(a.grad.double(), a64.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b.grad.double(), b64.grad, rtol=1e-5, atol=1e-6)
    # forward; grad_a and grad_b, each made in its input's layout (a column-major one as the
    # transposed product: grad_a^T = b grad^T, grad_b^T = grad^T a)
    grad_a = (7, 13, 5) if a_layout == "col" else (13, 7, 5)
    grad_b = (5, 7, 13) if b_layout == "col" else (7, 5, 13)
    calls = [call for library in libraries.values() for call in library.calls]
    assert sorted(calls) == sorted([(13, 5, 7), grad_a, grad_b]) and copies == []
    assert (a.grad.stride(0) == 1) == (a_layout == "col") and (b.grad.stride(0) == 1) == (b_layout == "col")


def test_the_backward_computes_only_the_gradients_needed_in_the_weights_layout(host):
    libraries, copies, _ = host
    x, weight = rand(9, 4), torch.nn.Parameter(rand(6, 4, seed=1))
    grad = rand(9, 6, seed=2)
    gtorch.matmul(x, weight.t()).backward(grad)
    calls = [call for library in libraries.values() for call in library.calls]
    assert sorted(calls) == [(6, 4, 9), (9, 6, 4)] and copies == []  # forward and grad_w = grad^T x only
    assert weight.grad.stride() == (4, 1)  # row-major like the weight: AccumulateGrad keeps it as it is
    torch.testing.assert_close(weight.grad.double(), grad.double().t() @ x.double(), rtol=1e-5, atol=1e-6)


def test_torch_compile_traces_forward_and_backward_without_a_break_or_a_copy(host):
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    graphs = {}

    def keep(name):
        def compiler(graph, inputs):
            graphs[name] = graph
            return make_boxed_func(graph.forward)
        return compiler

    def layer(x, w):
        return torch.relu(gtorch.matmul(x, w.t(), 2.0)).sum()

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend=aot_autograd(fw_compiler=keep("forward"),
                                                                          bw_compiler=keep("backward")))
    x, w = rand(8, 16).requires_grad_(), torch.nn.Parameter(rand(4, 16, seed=1))
    compiled(x, w).backward()
    gx, gw = x.grad, w.grad
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    torch.relu(2.0 * x64 @ w64.t()).sum().backward()
    torch.testing.assert_close(gx.double(), x64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw.double(), w64.grad, rtol=1e-5, atol=1e-5)

    def ops_in(graph):
        return [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]

    assert ops_in(graphs["forward"]).count("gemmgen.matmul.default") == 1
    backward = ops_in(graphs["backward"])
    assert backward.count("gemmgen.matmul.default") == 2
    assert not [op for op in backward if "clone" in op or "contiguous" in op or "copy" in op], backward
    assert host[1] == []  # the fast path copied nothing either


# --- which kernels serve the operator (torch/native.py) ----------------------------------------------

def test_without_a_cuda_build_of_pytorch_the_python_kernels_serve_and_say_why(monkeypatch):
    import gemmgen.torch.native as native
    import gemmgen.torch.ops as ops
    if torch.version.cuda is not None and torch.cuda.is_available():
        pytest.skip("a GPU is here: the C++ kernels are tried (tests/test_gpu_torch_native.py)")
    assert ops.python_kernels_reason == native.disabled_reason() and native.installed is None
    table = torch._C._dispatch_dump("gemmgen::matmul")
    for key in ("CUDA", "Autograd[alias]"):
        line = next(line for line in table.splitlines() if line.startswith(key + ":"))
        assert "ops.py" in line, line
    monkeypatch.setenv("GEMMGEN_TORCH_NATIVE", "0")
    assert native.disabled_reason() == "GEMMGEN_TORCH_NATIVE=0"
    assert native.install() == "GEMMGEN_TORCH_NATIVE=0"


def test_a_failed_build_is_reported_by_the_compilers_first_error():
    from gemmgen.torch.native import _first_error
    output = ("Error building extension 'gemmgen_native': [1/2] c++ -MMD -MF native.o.d ...\n"
              "In file included from native.cpp:23:\n"
              "cuda_runtime_api.h:148:10: fatal error: crt/host_defines.h: No such file or directory\n"
              "compilation terminated.\nninja: build stopped: subcommand failed.\n")
    assert _first_error(output) == "cuda_runtime_api.h:148:10: fatal error: crt/host_defines.h: No such file or directory"
    assert _first_error("ninja: not found") == "ninja: not found"


def test_a_failed_build_is_remembered_and_not_tried_again(monkeypatch, tmp_path):
    import torch.utils.cpp_extension as cpp_extension
    import gemmgen.torch.native as native
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_cuda_include", lambda: ["/usr/local/cuda/include"])
    tries = []

    def failing_load(**kwargs):
        tries.append(kwargs["build_directory"])
        raise RuntimeError("Error building extension 'gemmgen_native':\nnative.cpp:1:10: error: no such header\n")

    monkeypatch.setattr(cpp_extension, "load", failing_load)
    with pytest.raises(RuntimeError, match="^native.cpp:1:10: error: no such header$"):
        native.build()
    directory = native.build_directory()
    assert (directory / native.FAILED).read_text() == "native.cpp:1:10: error: no such header\n"
    with pytest.raises(RuntimeError, match=r"no such header; remembered from an earlier build: remove .* to build"):
        native.build()
    assert len(tries) == 1  # the second import did not compile again
    assert [p.name for p in directory.iterdir()] == [native.FAILED]  # no partial file left


@pytest.mark.parametrize("a_shape,b_shape", [((6, 5), (5,)), ((5,), (5, 4)), ((5,), (5,)), ((3, 6, 5), (5,)),
                                             ((5,), (2, 5, 4))])
def test_vectors_are_taken_as_torch_matmul_takes_them_with_their_gradients(a_shape, b_shape, host):
    libraries, copies, _ = host
    a = rand(*a_shape).requires_grad_()
    b = rand(*b_shape, seed=1).requires_grad_()
    out = gtorch.matmul(a, b, 0.5)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    expected = 0.5 * torch.matmul(a64, b64)
    assert out.shape == expected.shape
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)
    grad = rand(*expected.shape, seed=2) if expected.dim() else torch.tensor(0.7)
    out.backward(grad)
    expected.backward(grad.double())
    torch.testing.assert_close(a.grad.double(), a64.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b.grad.double(), b64.grad, rtol=1e-5, atol=1e-6)
    assert copies == []
    if a_shape == (6, 5):  # W @ x: the library's forward call is one row (C^T = x^T W^T)
        assert (1, 6, 5) in [call for library in libraries.values() for call in library.calls]
    with pytest.raises(ValueError, match="not tensors of shapes"):
        gtorch.matmul(torch.tensor(2.0), b)


def test_gemmgen_matmul_takes_torch_vectors(host):
    libraries, copies, _ = host
    W, x = rand(8, 6), rand(6, seed=1)
    y = gemmgen.matmul(W, x)
    assert y.shape == (8,)
    torch.testing.assert_close(y.double(), W.double() @ x.double(), rtol=1e-5, atol=1e-6)
    out = torch.full((6,), float("nan"))
    assert gemmgen.matmul(rand(8, seed=2), W, out, alpha=0.5) is out
    torch.testing.assert_close(out.double(), 0.5 * (rand(8, seed=2).double() @ W.double()), rtol=1e-5, atol=1e-6)
    assert copies == []
