"""GPU tests of the fused epilogues (issue 29): C = act(alpha * scale ⊙ (A@B) + beta * C + bias) against
float64 on every path (naive, SIMT tiles with a staged store, mma.sync with split K, register-fed
wgmma, TMA-fed wgmma with registers' and TMA's stores, persistent, stream-K, ping-pong, split K in a
cluster), in each
path's own layouts and with C (and A, B where the path takes them) column-major, bias and scale
indexed by row and by column; every activation on one kernel. The calls go through the Python
runtime (bias=/scale= CuPy arrays) with odd sizes, leading dimensions past the width, pointers one
float off 16-byte alignment (A, B, C and the vectors), beta on and off (off: C holds NaN, which must
not survive), K = 0 through the raw C ABI; nothing may be written outside C.

Run with `python -m pytest -m gpu tests/test_gpu_epilogue.py` on a machine with an sm_90 GPU and
CuPy; skipped without them. 18 kernels are compiled (NVRTC), then each runs 5 small calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

import hopper_gpu
from gemmgen.gpu import verify
from gemmgen.language.load import load_one
from gemmgen.plan.parts.epilogue import ACTIVATIONS

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent

# float64 references, written from each activation's definition (not from its CUDA)
_erf = np.vectorize(math.erf)
REFERENCE = {
    "none": lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
}
SLOPE = 1.2  # no activation's slope passes this: an error in its input grows at most so much


def _spec(parent: str, name: str, **values):
    spec = load_one(ROOT / "specs" / f"{parent}.gemm")
    return replace(spec.with_values(**values), name=name)


# Each path in its own layouts (its shipped spec), and with C (A, B where the path takes any) in the
# other layout and the vectors indexed the other way.
SPECS = {
    "naive": _spec("epilogue_naive", "naive"),
    "naive_col": _spec("epilogue_naive", "naive_col", layout_A="col", layout_B="col", layout_C="col",
                       bias="col", scale="row"),
    "staged": _spec("epilogue_staged", "staged"),
    "staged_col": _spec("epilogue_staged", "staged_col", layout_C="col", bias="row", scale="col"),
    "split_k": _spec("epilogue_split_k", "split_k"),
    "split_k_col": _spec("epilogue_split_k", "split_k_col", layout_A="col", layout_C="col", bias="row", scale="row"),
    "wgmma_async": _spec("epilogue_wgmma_async", "wgmma_async", scale="row"),
    "wgmma_async_col": _spec("epilogue_wgmma_async", "wgmma_async_col", layout_A="col", layout_B="col",
                             layout_C="col", bias="row", scale="col", activation="gelu_tanh"),
    "tma": _spec("epilogue_tma", "tma"),
    "tma_col": _spec("epilogue_tma", "tma_col", layout_C="col", bias="row", scale="col", activation="relu"),
    "tma_staged": _spec("epilogue_tma_staged", "tma_staged", scale="col"),
    "tma_staged_col": _spec("epilogue_tma_staged", "tma_staged_col", layout_C="col", bias="col", scale="row",
                            block_n=128, warp_n=128, mma_n=128, activation="gelu"),
    "streamk": _spec("epilogue_streamk", "streamk", scale="row"),
    "pingpong": _spec("epilogue_pingpong", "pingpong", bias="row"),
    # split K in a cluster: block 0 stores C with the bias, the other slices add their scaled products
    "tma_split_cluster": _spec("epilogue_tma", "tma_split_cluster", activation="none", split=4, split_by="cluster"),
    "tma_split_cluster_col": _spec("epilogue_tma", "tma_split_cluster_col", layout_C="col", bias="row", scale="col",
                                   activation="none", split=2, split_by="cluster"),
    # split K through a workspace: the last slice sums the tile and runs the whole epilogue (activation too)
    "tma_split_workspace": _spec("epilogue_tma", "tma_split_workspace", split=4, split_by="workspace"),
    "tma_split_workspace_col": _spec("epilogue_tma", "tma_split_workspace_col", layout_C="col", bias="row", scale="col",
                                     activation="silu", split=3, split_by="workspace"),
    "tma_staged_split_workspace": _spec("epilogue_tma_staged", "tma_staged_split_workspace", scale="row",
                                        schedule="data-parallel", split=2, split_by="workspace"),
} | {
    f"activation_{name}": _spec("epilogue_naive", f"activation_{name}", layout_C="col", bias="col", scale="row",
                                activation=name)
    for name in ACTIVATIONS
}


@dataclass(frozen=True)
class Call:
    M: int
    N: int
    K: int
    alpha: float = 1.0
    beta: float = 0.0
    pad: int = 0      # leading dimensions this much past the width
    offset: int = 0   # every pointer this many floats past a 16-byte boundary


CALLS = (
    Call(67, 131, 45, alpha=1.5),                        # odd sizes, beta off (C holds NaN)
    Call(129, 257, 96, alpha=-0.75, beta=0.5, pad=3),    # leading dimensions past the width
    Call(300, 200, 77, beta=-1.0, offset=1),             # every pointer misaligned
    Call(256, 384, 128, alpha=0.5, beta=1.0),            # aligned: the vector and TMA stores
    Call(1, 5, 300, beta=2.0, offset=3),
)


@pytest.fixture(scope="module", autouse=True)
def gpu():
    hopper_gpu.require_sm90("the epilogue kernels are built for sm_90 and sm_90a")


@pytest.fixture(scope="module")
def cp(gpu):
    import cupy
    return cupy


@pytest.fixture(scope="module")
def kernels(gpu):
    yield from hopper_gpu.kernel_cache(SPECS)


def _place(cp, host: np.ndarray, layout: str, pad: int, offset: int):
    """`host` in a NaN-filled device buffer: (the buffer, the matrix's view, its region mask)."""
    rows, cols = host.shape
    width, lines = (cols, rows) if layout == "row" else (rows, cols)
    ld = max(1, width + pad)
    buffer = cp.full(offset + ld * lines + 8, cp.nan, cp.float32)
    block = buffer[offset: offset + ld * lines].reshape(lines, ld)[:, :width]
    view = block if layout == "row" else block.T
    view[...] = cp.asarray(host)
    return buffer, view


def _vector(cp, host: np.ndarray, offset: int):
    buffer = cp.full(offset + host.size + 8, cp.nan, cp.float32)
    view = buffer[offset: offset + host.size]
    view[...] = cp.asarray(host)
    return buffer, view


def _reference(plan, call: Call, A, B, C0, bias, scale):
    """(float64 C, the bound on its rounding) of the epilogue's definition."""
    epilogue = plan.epilogue
    product = A.astype(np.float64) @ B.astype(np.float64)
    size = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
    factor = np.ones((call.M, call.N))
    if scale is not None:
        factor = factor * (scale[:, None] if epilogue.scale == "row" else scale[None, :])
    x = call.alpha * factor * product
    bound = np.abs(call.alpha * factor) * size
    if call.beta:
        x = x + call.beta * C0
        bound = bound + np.abs(call.beta * C0)
    if bias is not None:
        x = x + (bias[:, None] if epilogue.bias == "row" else bias[None, :])
        bound = bound + np.abs(x) * 2.0 ** -23
    allowed = SLOPE * verify.tolerance(bound, call.K, plan.spec["math"]) + 1e-6 * (1.0 + np.abs(x))
    return REFERENCE[epilogue.activation.name](x), allowed


def _run(cp, kernel, call: Call, seed: int) -> None:
    plan = kernel.plan
    rng = np.random.default_rng(seed)
    A = rng.uniform(-1, 1, (call.M, call.K)).astype(np.float32)
    B = rng.uniform(-1, 1, (call.K, call.N)).astype(np.float32)
    C0 = rng.uniform(-1, 1, (call.M, call.N)).astype(np.float32)
    lengths = {"row": call.M, "col": call.N}
    vectors = {name: rng.uniform(-1.5, 1.5, lengths[by]).astype(np.float32) for name, by in plan.epilogue.vectors}
    _, a = _place(cp, A, kernel.layouts["A"], call.pad, call.offset)
    _, b = _place(cp, B, kernel.layouts["B"], call.pad, call.offset)
    # beta off: C holds NaN, which BLAS semantics say must not be read
    c_buffer, c = _place(cp, C0 if call.beta else np.full_like(C0, np.nan), kernel.layouts["C"], call.pad, call.offset)
    region = ~cp.isnan(_place(cp, np.zeros_like(C0), kernel.layouts["C"], call.pad, call.offset)[0])
    placed = {name: _vector(cp, values, call.offset) for name, values in vectors.items()}
    kernel(a, b, c, alpha=call.alpha, beta=call.beta, **{name: view for name, (_, view) in placed.items()})
    cp.cuda.runtime.deviceSynchronize()
    expected, allowed = _reference(plan, call, A, B, C0, vectors.get("bias"), vectors.get("scale"))
    got = c.get().astype(np.float64)
    bad = ~(np.abs(got - expected) <= allowed)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        pytest.fail(f"{plan.name} {call}: {int(bad.sum())} of {bad.size} elements wrong, e.g. C{first} = "
                    f"{got[first]!r}, expected {expected[first]!r}")
    assert bool(cp.isnan(c_buffer[~region]).all()), f"{plan.name} {call}: wrote outside C"
    for name, (buffer, view) in placed.items():  # the vectors are read, never written
        assert np.array_equal(view.get(), vectors[name]), f"{plan.name} {call}: {name} changed"
        assert int(cp.isnan(buffer).sum()) == buffer.size - vectors[name].size, f"{plan.name}: wrote beside {name}"


@pytest.mark.parametrize("name", [name for name in SPECS if not name.startswith("activation_")])
def test_every_path_and_layout_matches_float64(name, cp, kernels):
    kernel = kernels(name)
    assert kernel.plan.epilogue.fused and kernel.plan.epilogue.vectors
    for index, call in enumerate(CALLS):
        _run(cp, kernel, call, seed=100 + index)


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_every_activation_matches_its_definition(activation, cp, kernels):
    assert activation in REFERENCE, f"activation {activation!r} has no float64 reference in this test"
    kernel = kernels(f"activation_{activation}")
    assert kernel.plan.epilogue.activation.name == activation
    for index, call in enumerate(CALLS[:3]):
        _run(cp, kernel, call, seed=200 + index)


@pytest.mark.parametrize("name", ["naive", "split_k", "tma", "tma_staged", "pingpong"])
def test_k_zero_gives_the_epilogue_of_beta_c(name, cp, kernels):
    """K = 0 (a TMA kernel's fallback): C = act(beta * C + bias) through the raw C ABI."""
    kernel = kernels(name)
    plan = kernel.plan
    M, N = 33, 17
    rng = np.random.default_rng(5)
    C0 = rng.uniform(-1, 1, (M, N)).astype(np.float32)
    _, c = _place(cp, C0, kernel.layouts["C"], 0, 0)
    ldc = N if kernel.layouts["C"] == "row" else M
    vectors = {name: rng.uniform(-1.5, 1.5, M if by == "row" else N).astype(np.float32)
               for name, by in plan.epilogue.vectors}
    device = {name: cp.asarray(values) for name, values in vectors.items()}
    lda = 1 if kernel.layouts["A"] == "row" else M
    ldb = N if kernel.layouts["B"] == "row" else 1
    kernel.launch(M, N, 0, 1.0, 0, lda, 0, ldb, 0.5, c.data.ptr, ldc,
                  **{name: array.data.ptr for name, array in device.items()})
    cp.cuda.runtime.deviceSynchronize()
    expected, allowed = _reference(plan, Call(M, N, 0, beta=0.5), np.zeros((M, 0), np.float32),
                                   np.zeros((0, N), np.float32), C0, vectors.get("bias"), vectors.get("scale"))
    assert np.allclose(c.get(), expected, rtol=1e-5, atol=1e-5)


def test_a_missing_vector_is_refused_before_anything_runs(cp, kernels):
    from gemmgen.gpu.runtime import ShapeError
    kernel = kernels("tma")
    a = cp.zeros((64, 64), cp.float32)
    b = cp.asfortranarray(cp.zeros((64, 64), cp.float32))
    c = cp.full((64, 64), 7.0, cp.float32)
    with pytest.raises(ShapeError, match="pass scale="):
        kernel(a, b, c, bias=cp.zeros(64, cp.float32))
    assert bool((c == 7.0).all())


@pytest.mark.parametrize("name", ["naive", "split_k", "tma", "tma_staged"])
def test_gemmgen_check_validates_an_epilogue_kernel(name, cp, kernels):
    # what `gemmgen check` runs: its own vectors, and the reference from gpu/epilogue_inputs.py
    report = verify.check(kernels(name), verify.DEFAULT_CASES[:6], seed=3)
    assert report.ok, [f"{r.case}: {r.message}" for r in report.failures]


# --- batches: every path's epilogue on strided batches ---------------------------------------------

# (batch, B shared by every batch (2-D, stride 0), padding of each leading dimension)
BATCHES = {"packed": (3, False, 0), "broadcast B": (4, True, 0), "padded": (2, False, 3)}


def _batch(cp, host: np.ndarray, layout: str, pad: int):
    """(batch, rows, cols) values in a NaN-filled device buffer, each matrix in `layout` with its lines
    `pad` floats past the width: (the buffer, the 3-D view the kernel gets)."""
    count, rows, cols = host.shape
    width, lines = (cols, rows) if layout == "row" else (rows, cols)
    buffer = cp.full((count, lines, width + pad), cp.nan, cp.float32)
    block = buffer[:, :, :width]
    view = block if layout == "row" else block.swapaxes(1, 2)
    view[...] = cp.asarray(host)
    return buffer, view


@pytest.mark.parametrize("batches", list(BATCHES))
@pytest.mark.parametrize("name", [name for name in SPECS if not name.startswith("activation_")])
def test_every_path_applies_its_epilogue_to_every_batch(name, batches, cp, kernels):
    """C[b] = act(alpha * scale (A[b] @ B[b]) + beta * C[b] + bias), one bias and scale for all batches,
    through the Python runtime's 3-D arrays; the padding of C's lines is never written."""
    kernel = kernels(name)
    plan = kernel.plan
    count, shared_b, pad = BATCHES[batches]
    for index, call in enumerate((Call(67, 131, 45, alpha=1.25, beta=0.5, pad=pad),
                                  Call(128, 256, 64, alpha=-0.5, beta=0.0, pad=pad))):
        rng = np.random.default_rng(300 + index)
        A = rng.uniform(-1, 1, (count, call.M, call.K)).astype(np.float32)
        B = rng.uniform(-1, 1, (1 if shared_b else count, call.K, call.N)).astype(np.float32)
        C0 = rng.uniform(-1, 1, (count, call.M, call.N)).astype(np.float32)
        lengths = {"row": call.M, "col": call.N}
        vectors = {v: rng.uniform(-1.5, 1.5, lengths[by]).astype(np.float32) for v, by in plan.epilogue.vectors}
        _, a = _batch(cp, A, kernel.layouts["A"], pad)
        _, b = _batch(cp, B, kernel.layouts["B"], pad)
        c_buffer, c = _batch(cp, C0 if call.beta else np.full_like(C0, np.nan), kernel.layouts["C"], pad)
        kernel(a, b[0] if shared_b else b, c, alpha=call.alpha, beta=call.beta,
               **{v: cp.asarray(values) for v, values in vectors.items()})
        cp.cuda.runtime.deviceSynchronize()
        got = c.get().astype(np.float64)
        for i in range(count):
            expected, allowed = _reference(plan, call, A[i], B[0 if shared_b else i], C0[i], vectors.get("bias"),
                                           vectors.get("scale"))
            bad = ~(np.abs(got[i] - expected) <= allowed)
            assert not bad.any(), f"{plan.name} {batches} {call} batch {i}: {int(bad.sum())} elements wrong"
        if pad:
            width = call.N if kernel.layouts["C"] == "row" else call.M
            assert bool(cp.isnan(c_buffer[:, :, width:]).all()), f"{plan.name} {batches}: wrote into C's padding"
