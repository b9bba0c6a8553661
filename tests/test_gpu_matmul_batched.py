"""GPU tests of batched gemmgen.matmul and torch.ops.gemmgen.matmul through the shipped libraries.

Against float64, in both precisions: batches packed and padded (slices of wider buffers, NaN in the
padding), broadcast (a 2-D operand, stride 0; leading dimensions of size 1), a shared weight whose
batches stack into one GEMM, transposed batches and a column-major out, odd sizes, a misaligned
start, several leading dimensions, batch 0 and 1, CuPy arrays; gradients of batches (a shared
weight's summed over batches, broadcast inputs summed to their shape).

Run with `pytest -m gpu tests/test_gpu_matmul_batched.py`; skipped without a GPU, torch with CUDA,
or a tuned library (generated/fp32.json).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from gemmgen.gpu import verify

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

GENERATED = Path(__file__).resolve().parent.parent / "generated"
PRECISIONS = [p for p in ("fp32", "tf32") if (GENERATED / f"{p}.json").is_file()]
MATH = {"fp32": "3xtf32", "tf32": "tf32"}


@pytest.fixture(scope="module", autouse=True)
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    if not PRECISIONS:
        pytest.skip("no shipped library tuned yet (generated/fp32.json)")
    import gemmgen.torch  # noqa: F401 - registers torch.ops.gemmgen.matmul


def batch_of(lead, rows, cols, layout, seed, pad=0, offset=0):
    """Float32 CUDA matrices (*lead, rows, cols) of uniform(-1, 1) values, each row- or column-major,
    lines `pad` floats longer (NaN padding), the whole `offset` floats into its buffer."""
    values = torch.from_numpy(np.random.default_rng(seed).uniform(-1, 1, (*lead, rows, cols)).astype(np.float32))
    lines, length = (rows, cols) if layout == "row" else (cols, rows)
    count = int(np.prod(lead)) if lead else 1
    buffer = torch.full((count * lines * (length + pad) + offset,), float("nan"), device="cuda")
    view = buffer[offset:].view(*lead, lines, length + pad)[..., :length]
    view.copy_(values.cuda() if layout == "row" else values.mT.cuda())
    return view if layout == "row" else view.mT


def check(got, A, B, alpha=1.0, beta=0.0, C64=None, precision="fp32", what=""):
    A64, B64 = A.double(), B.double()
    reference, scale = alpha * (A64 @ B64), abs(alpha) * (A64.abs() @ B64.abs())
    if beta:
        reference, scale = reference + beta * C64, scale + abs(beta) * C64.abs()
    torch.cuda.synchronize()
    tolerance = verify.tolerance(scale.cpu().numpy(), A.shape[-1], MATH[precision])
    error = np.abs(got.double().cpu().numpy() - reference.cpu().numpy())
    bad = ~(error <= tolerance)
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} elements wrong (worst {np.nanmax(error):.3g})"


CASES = {  # name: (A's lead, B's lead, M, N, K, A layout, B layout, pad, offset)
    "packed": ((8,), (8,), 64, 96, 128, "row", "col", 0, 0),
    "packed B row-major": ((5,), (5,), 33, 17, 45, "row", "row", 0, 0),
    "padded odd": ((6,), (6,), 37, 53, 29, "row", "col", 3, 0),
    "transposed A": ((4,), (4,), 70, 40, 96, "col", "col", 0, 0),
    "misaligned start": ((3,), (3,), 64, 64, 64, "row", "col", 0, 1),
    "shared B (stacked rows)": ((4, 3), (), 50, 70, 90, "row", "col", 0, 0),
    "shared A (stride 0)": ((), (7,), 40, 56, 72, "row", "col", 0, 0),
    "broadcast size-1 dims": ((2, 1), (1, 3), 24, 40, 16, "row", "col", 0, 0),
    "batch 1": ((1,), (1,), 129, 65, 257, "row", "col", 0, 0),
    "large K": ((2,), (2,), 128, 128, 4096, "row", "col", 0, 0),
}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_batched_matmul_matches_float64(precision, case, monkeypatch):
    import gemmgen
    import gemmgen.library.dispatch as dispatch
    monkeypatch.setattr(dispatch, "_warned", set())  # each case's copy is said again
    lead_a, lead_b, M, N, K, la, lb, pad, offset = CASES[case]
    A = batch_of(lead_a, M, K, la, 1, pad, offset)
    B = batch_of(lead_b, K, N, lb, 2, pad, offset)
    # Both precisions run a column-major A, or a row-major A and B as C^T = B^T A^T, in their
    # relaid classes, copying nothing; only a column-major A with a row-major B copies one.
    copied = "broadcast" in case or (la == "col" and lb == "row")
    with pytest.warns(RuntimeWarning, match="copied|copying") if copied else warnings.catch_warnings():
        if not copied:
            warnings.filterwarnings("error", message="gemmgen:")  # a copy nobody expected fails the case
        out = gemmgen.matmul(A, B, precision=precision)
    lead = torch.broadcast_shapes(lead_a, lead_b)
    assert out.shape == (*lead, M, N)
    check(out, A, B, precision=precision, what=f"{precision} {case}")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_column_major_padded_out_with_beta_is_written_in_place(precision):
    import gemmgen
    A, B = batch_of((5,), 45, 31, "row", 3), batch_of((5,), 31, 27, "col", 4)
    C = batch_of((5,), 45, 27, "col", 5, pad=2)
    C64 = C.double()
    assert gemmgen.matmul(A, B, C, alpha=0.5, beta=-1.5, precision=precision) is C
    check(C, A, B, 0.5, -1.5, C64, precision, f"{precision} column-major out")
    base = C.mT  # each matrix's lines: 45 values, then 2 NaN of padding
    assert torch.isnan(base.as_strided((5, 27, 2), (base.stride(0), base.stride(1), 1), base.shape[-1])).all()


@pytest.mark.parametrize("precision", PRECISIONS)
def test_an_empty_batch_and_cupy_batches(precision):
    import gemmgen
    assert gemmgen.matmul(batch_of((0,), 5, 4, "row", 1), batch_of((), 4, 3, "col", 2)).shape == (0, 5, 3)
    cp = pytest.importorskip("cupy")
    A = cp.asarray(np.random.default_rng(7).uniform(-1, 1, (6, 40, 24)).astype(np.float32))
    B = cp.asarray(np.random.default_rng(8).uniform(-1, 1, (6, 24, 33)).astype(np.float32))
    B = cp.ascontiguousarray(B.swapaxes(1, 2)).swapaxes(1, 2)
    out = gemmgen.matmul(A, B, precision=precision)
    check(torch.as_tensor(out, device="cuda"), torch.as_tensor(A, device="cuda"), torch.as_tensor(B, device="cuda"),
          precision=precision, what=f"{precision} CuPy batches")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_gradients_of_batches_match_float64(precision):
    import gemmgen.torch as gtorch
    x = batch_of((3, 4), 33, 48, "row", 11).requires_grad_()
    weight = torch.nn.Parameter(batch_of((), 40, 48, "row", 12))   # shared: x @ weight^T
    a = batch_of((2, 1), 20, 30, "row", 13).requires_grad_()
    b = batch_of((5,), 30, 25, "col", 14).requires_grad_()
    grad_y, grad_z = batch_of((3, 4), 33, 40, "row", 15), batch_of((2, 5), 20, 25, "row", 16)
    (gtorch.matmul(x, weight.t(), 1.0, precision) * grad_y).sum().backward()
    (gtorch.matmul(a, b, 1.0, precision) * grad_z).sum().backward()
    g, x64 = grad_y.double(), x.detach().double()
    check(x.grad, grad_y, weight.detach(), precision=precision, what=f"{precision} grad x")
    rows_x, rows_g = x64.reshape(-1, 48), g.reshape(-1, 40)
    check(weight.grad, rows_g.t().float(), rows_x.float(), precision=precision, what=f"{precision} grad of a shared weight")
    assert weight.grad.stride() == (48, 1)
    a64, b64, gz = a.detach().double(), b.detach().double(), grad_z.double()
    # a (2, 1) against b (5,): grad a sums over b's 5 batches (K = 5 x 25), grad b over a's 2 (K = 2 x 20)
    expected_a = (gz @ b64.mT).sum(dim=1, keepdim=True)
    scale_a = (gz.abs() @ b64.abs().mT).sum(dim=1, keepdim=True)
    expected_b = (a64.mT @ gz).sum(dim=0)
    scale_b = (a64.abs().mT @ gz.abs()).sum(dim=0)
    torch.cuda.synchronize()
    for got, expected, scale, K, what in ((a.grad, expected_a, scale_a, 125, "grad a"),
                                          (b.grad, expected_b, scale_b, 40, "grad b")):
        assert got.shape == expected.shape
        tolerance = verify.tolerance(scale.cpu().numpy(), K, MATH[precision])
        bad = ~(np.abs(got.double().cpu().numpy() - expected.cpu().numpy()) <= tolerance)
        assert not bad.any(), f"{precision} {what} of broadcast batches: {int(bad.sum())} elements wrong"
