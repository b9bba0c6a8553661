"""torch.ops.gemmgen.matmul's C++ kernels (gemmgen/torch/native.cpp) on a GPU: they are the ones
registered, every kind of call key they keep or send back to Python gives the right numbers, each
key is resolved once, errors are Python's, and threads may call at once.

The operator's other GPU tests (layouts, gradients, torch.compile, CUDA graphs, host time:
test_gpu_torch.py) run through the same kernels once they are installed.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

from gemmgen.gpu import verify

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

MATH = {"fp32": "3xtf32", "tf32": "tf32"}


@pytest.fixture(scope="module", autouse=True)
def native():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    import gemmgen.torch.native as native
    import gemmgen.torch.ops as ops
    return native, ops


def reference(a, b):
    a64, b64 = a.double(), b.double()
    return a64 @ b64, a64.abs() @ b64.abs()


def assert_close(got, a, b, precision, what):
    exact, scale = reference(a, b)
    tolerance = verify.tolerance(scale.cpu().numpy(), a.shape[-1], MATH[precision])
    error = np.abs(got.double().cpu().numpy() - exact.cpu().numpy())
    bad = ~(error <= tolerance)
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} elements wrong (worst {error.max():.3g})"


def test_the_cpp_kernels_are_the_ones_registered(native):
    _, ops = native
    assert ops.python_kernels_reason is None, f"the Python kernels serve the operator: {ops.python_kernels_reason}"
    table = torch._C._dispatch_dump("gemmgen::matmul")
    for key in ("CUDA", "Autograd[alias]"):
        line = next(line for line in table.splitlines() if line.startswith(key + ":"))
        assert "native.cpp" in line and "unboxed" in line, line


def _operands(case):
    g = torch.Generator(device="cuda").manual_seed(CASES.index(case))
    kind, M, N, K = case

    def rand(*shape):
        return torch.rand(*shape, device="cuda", generator=g) * 2 - 1

    if kind == "row-col":  # x @ W.t(), as nn.Linear
        return rand(M, K), rand(N, K).t()
    if kind == "row-row":
        return rand(M, K), rand(K, N)
    if kind == "col-col":
        return rand(K, M).t(), rand(N, K).t()
    if kind == "col-row":
        return rand(K, M).t(), rand(K, N)
    if kind == "misaligned":  # A and B 4 bytes past a 16-byte boundary: the unaligned members
        return rand(M * K + 1)[1:].view(M, K), rand(N * K + 1)[1:].view(N, K).t()
    if kind == "batched":
        return rand(3, M, K), rand(3, K, N)
    if kind == "broadcast":  # a shared weight over two batch dimensions
        return rand(2, 3, M, K), rand(N, K).t()
    if kind == "strided":  # no unit stride: copied first (Python serves the key)
        return rand(M, 2 * K)[:, ::2], rand(N, K).t()
    raise AssertionError(kind)


CASES = [("row-col", 1, 1, 1), ("row-col", 37, 53, 29), ("row-col", 16, 4096, 4096), ("row-col", 4096, 1, 4096),
         ("row-col", 1024, 1024, 1024), ("row-col", 2048, 2048, 2048), ("row-col", 333, 4444, 555),
         ("row-row", 300, 257, 1029), ("col-col", 127, 129, 255), ("col-row", 256, 384, 512),
         ("misaligned", 129, 67, 131), ("batched", 65, 33, 47), ("broadcast", 20, 40, 60), ("strided", 50, 60, 70)]


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
@pytest.mark.parametrize("case", CASES, ids=["%s-%dx%dx%d" % c for c in CASES])
def test_every_kind_of_call_matches_float64(native, precision, case):
    a, b = _operands(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the strided case's copy warning
        out = torch.ops.gemmgen.matmul(a, b, 0.5, precision)
        again = torch.ops.gemmgen.matmul(a, b, 0.5, precision)  # the kept key this time
    torch.cuda.synchronize()
    assert out.shape == torch.matmul(a, b).shape and out.is_contiguous()
    assert_close(out / 0.5, a, b, precision, f"{case} {precision}")
    assert_close(again / 0.5, a, b, precision, f"{case} {precision}, second call")


def test_a_call_key_is_resolved_once(native):
    module, _ = native
    a, b = torch.randn(71, 93, device="cuda"), torch.randn(57, 93, device="cuda").t()
    before = module.installed.keys_kept()
    torch.ops.gemmgen.matmul(a, b)
    assert module.installed.keys_kept() == before + 1
    for _ in range(3):
        torch.ops.gemmgen.matmul(torch.randn_like(a), b)  # the same key: sizes, strides, alignment
    assert module.installed.keys_kept() == before + 1


def test_no_matrices_give_an_empty_output(native):
    out = torch.ops.gemmgen.matmul(torch.randn(0, 5, 7, device="cuda"), torch.randn(7, 3, device="cuda"))
    assert out.shape == (0, 5, 3)


def test_wrong_arguments_get_pythons_errors(native):
    from gemmgen.gpu.runtime import ShapeError
    with pytest.raises(ShapeError, match="inner sizes differ"):
        torch.ops.gemmgen.matmul(torch.randn(4, 5, device="cuda"), torch.randn(6, 3, device="cuda"))
    with pytest.raises(ShapeError, match="B is not on a GPU"):
        torch.ops.gemmgen.matmul(torch.randn(4, 5, device="cuda"), torch.randn(5, 3))
    with pytest.raises(ShapeError, match="B must hold float32"):
        torch.ops.gemmgen.matmul(torch.randn(4, 5, device="cuda"), torch.randn(5, 3, device="cuda").half())
    with pytest.raises(ValueError, match="precision 'fp16'"):
        torch.ops.gemmgen.matmul(torch.randn(4, 5, device="cuda"), torch.randn(5, 3, device="cuda"), 1.0, "fp16")
    # and the operator still works after them
    a, b = torch.randn(4, 5, device="cuda"), torch.randn(5, 3, device="cuda")
    assert_close(torch.ops.gemmgen.matmul(a, b), a, b, "fp32", "after errors")


def test_inference_mode_and_no_grad_take_the_cpp_path(native):
    w = torch.nn.Parameter(torch.randn(64, 32, device="cuda"))
    x = torch.randn(16, 32, device="cuda")
    with torch.inference_mode():
        y = torch.ops.gemmgen.matmul(x, w.t())
    with torch.no_grad():
        z = torch.ops.gemmgen.matmul(x, w.t())
    assert not z.requires_grad
    assert_close(y, x, w.detach().t(), "fp32", "inference mode")
    assert_close(z, x, w.detach().t(), "fp32", "no_grad")
    grad = torch.ops.gemmgen.matmul(x, w.t())  # a Parameter: the C++ autograd Function, no Python object
    assert grad.requires_grad and "MatmulFunction" in grad.grad_fn.name(), grad.grad_fn.name()
    grad.backward(torch.ones_like(grad))
    assert_close(w.grad.t(), x.t(), torch.ones(16, 64, device="cuda"), "fp32", "the weight's gradient")


def test_threads_may_call_at_once(native):
    shapes = [(96, 80, 64), (33, 4096, 512), (512, 512, 512), (16, 1024, 2048)]
    operands = [(torch.randn(M, K, device="cuda"), torch.randn(N, K, device="cuda").t()) for M, N, K in shapes]
    results: dict[int, list] = {}
    failures = []

    def work(index):
        try:
            a, b = operands[index % len(operands)]
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                results[index] = [torch.ops.gemmgen.matmul(a, b) for _ in range(20)]
            stream.synchronize()
        except Exception as exc:  # reported below with the thread's number
            failures.append(f"thread {index}: {exc!r}")

    torch.cuda.synchronize()  # the operands are written before other streams read them
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    torch.cuda.synchronize()
    for index, outs in results.items():
        a, b = operands[index % len(operands)]
        for out in outs[::7]:
            assert_close(out, a, b, "fp32", f"thread {index}")


def test_gemmgen_matmul_of_torch_tensors_takes_the_cpp_path_without_autograd(native):
    import gemmgen
    module, _ = native
    a = torch.randn(45, 77, device="cuda", requires_grad=True)
    w = torch.nn.Parameter(torch.randn(31, 77, device="cuda"))
    before = module.installed.keys_kept()
    out = gemmgen.matmul(a, w.t(), alpha=2.0, precision="tf32")
    assert module.installed.keys_kept() == before + 1
    assert not out.requires_grad and out.grad_fn is None  # gemmgen.matmul records no autograd
    assert_close(out / 2.0, a.detach(), w.detach().t(), "tf32", "gemmgen.matmul, C++ path")
    c = torch.zeros(45, 31, device="cuda")
    gemmgen.matmul(a.detach(), w.detach().t(), c, beta=0.0)  # an `out`: the Python path
    assert module.installed.keys_kept() == before + 1
    assert_close(c, a.detach(), w.detach().t(), "fp32", "gemmgen.matmul into out")


def test_past_4096_call_keys_the_kept_ones_are_dropped_and_calls_go_on(native):
    module, _ = native
    b = torch.randn(24, 16, device="cuda")
    outs = {}
    for m in range(1, 4200):  # a new call key each: the C++ kernel keeps 4096, then starts again
        a = torch.randn(m, 24, device="cuda") if m % 700 == 1 else torch.empty(m, 24, device="cuda").uniform_()
        outs[m] = (a, torch.ops.gemmgen.matmul(a, b))
    assert 0 < module.installed.keys_kept() <= 4096
    torch.cuda.synchronize()
    for m in (1, 701, 2101, 4096, 4097, 4199):
        a, out = outs[m]
        assert_close(out, a, b, "fp32", f"{m} x 16 x 24 after the keys were dropped")
