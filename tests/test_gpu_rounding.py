"""GPU tests of `round nearest [tma | producer | consumer]` (issue 28; CPU side: test_rounding.py):
each way on every schedule the tf32 library uses (TMA's also with a column-major A), against float64
at shapes with odd sizes, partial tiles and the register-fed fallback; and the point of it: the
rounding kernels' relative error within 1.1x of PyTorch's TF32 matmul (cuBLAS, which rounds to
nearest) on the same inputs, while `round truncate`'s is clearly larger (so the test proves rounding
happens).

Run with `pytest -m gpu tests/test_gpu_rounding.py`; skipped without an sm_90 GPU and CuPy (the
error test also needs torch).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import hopper_gpu
from gemmgen.gpu import verify
from gemmgen.language.load import load_one

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
PLAIN = load_one(ROOT / "specs" / "hopper_tf32.gemm")
ROUNDED = {by: load_one(ROOT / "specs" / "hopper_tf32_rounded.gemm", name)
           for by, name in (("producer", "hopper_tf32_rounded"), ("consumer", "hopper_tf32_rounded_a"))}
ROUNDED["tma"] = PLAIN  # the default: TMA rounds as it copies (tensor maps of type TFLOAT32)
TRUNCATE = replace(PLAIN.with_values(round="truncate"), name="hopper_tf32_truncate")
# The schedules of specs/tf32.gemm's members, as settings on hopper_tf32_rounded{,_a}.
SCHEDULES = {
    "data-parallel": {},
    "staged": {"epilogue_staged": True},
    "split": {"block_n": 128, "warp_n": 128, "mma_n": 128, "raster_group": 1, "split": 4},
    "persistent": {"schedule": "persistent"},
    "stream-k": {"schedule": "stream-k", "epilogue_staged": True},
    "cluster": {"cluster_m": 2, "cluster_n": 2},
    "cluster-persistent": {"cluster_m": 2, "schedule": "persistent", "epilogue_staged": True},
    "pingpong": {"block_m": 64, "schedule": "pingpong"},
    "pingpong-two-slabs": {"block_n": 128, "warp_n": 128, "mma_n": 128, "schedule": "pingpong"},
}
SPECS = {f"{by}_{schedule}": replace(ROUNDED[by].with_values(**settings),
                                     name=f"round_{by}_{schedule}".replace("-", "_"))
         for by in ROUNDED for schedule, settings in SCHEDULES.items()
         if (by, schedule) != ("consumer", "pingpong-two-slabs")}  # refused by the planner (test_rounding.py)
# TMA's rounding of a column-major A's MN-major tiles, which the consumers read into registers.
SPECS.update({f"tma_a_col_{schedule}": replace(PLAIN.with_values(layout_A="col", **settings), name=f"round_tma_a_col_{i}")
              for i, (schedule, settings) in enumerate((("staged", {"epilogue_staged": True}),
                                                        ("pingpong", {"block_m": 64, "schedule": "pingpong",
                                                                      "epilogue_staged": True})))})
SPECS.update({"truncate": TRUNCATE, "tma": PLAIN, "producer": ROUNDED["producer"], "consumer": ROUNDED["consumer"]})
WAYS = ("truncate", "tma", "producer", "consumer")

# Odd M and N on the TMA path (K a multiple of 4: rows 16-byte aligned; C's odd rows stored one
# float at a time), odd K (rows not 16-byte aligned: the register-fed fallback), partial tiles on
# every edge, K of one partial tile, beta, and a size with whole waves of 128 x 256 tiles.
CASES = verify.QUICK_CASES + (
    verify.Case(1024, 1024, 4096),
    verify.Case(1000, 1500, 700, beta=0.5),
    verify.Case(1001, 999, 1004),
    verify.Case(333, 4095, 2052, beta=-1.0),
    verify.Case(1001, 999, 1003),
    verify.Case(777, 1500, 33, alpha=-1.5),
    verify.Case(515, 1031, 2049, pad=1),
    verify.Case(1536, 2816, 200),
    verify.Case(300, 300, 40000),
)


@pytest.fixture(scope="module", autouse=True)
def gpu():
    hopper_gpu.require_sm90("the rounding kernels are sm_90a (wgmma, TMA)")


@pytest.fixture(scope="module")
def kernels(gpu):
    yield from hopper_gpu.kernel_cache(SPECS)


@pytest.mark.parametrize("name", sorted(set(SPECS) - set(WAYS)))
def test_each_variant_on_each_schedule_matches_float64(name, kernels):
    report = verify.check(kernels(name), CASES, seed=28)
    assert report.ok, "\n".join(f"{r.case}: {r.message}" for r in report.failures)


def _relative_error(result, reference) -> float:
    return float(np.linalg.norm(result.astype(np.float64) - reference) / np.linalg.norm(reference))


@pytest.mark.parametrize("M, N, K", [(1024, 1024, 4096), (2048, 2048, 1024)])
def test_rounding_kernels_are_as_accurate_as_cublas_tf32(M, N, K, kernels):
    """uniform(-1, 1) inputs: the rounding kernels' error vs float64 is at most 1.1x PyTorch TF32's
    (cuBLAS rounds to nearest); `round truncate`'s is at least 1.5x it (truncation's bias: about
    2.6x measured on batches)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    generator = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = torch.rand(M, K, device="cuda", generator=generator) * 2 - 1
    bt = torch.rand(N, K, device="cuda", generator=generator) * 2 - 1  # B column-major: B^T row-major
    reference = (a.double() @ bt.double().T).cpu().numpy()
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        cublas = _relative_error((a @ bt.T).cpu().numpy(), reference)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    errors = {}
    for name in WAYS:
        c = torch.full((M, N), float("nan"), device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        kernels(name).launch(M, N, K, 1.0, a.data_ptr(), K, bt.data_ptr(), K, 0.0, c.data_ptr(), N, stream=stream)
        torch.cuda.synchronize()
        errors[name] = _relative_error(c.cpu().numpy(), reference)
    summary = f"relative errors {errors}, PyTorch TF32 (cuBLAS) {cublas:.3e}"
    assert errors["tma"] <= 1.1 * cublas, summary
    assert errors["producer"] <= 1.1 * cublas, summary
    assert errors["consumer"] <= 1.1 * cublas, summary
    assert errors["truncate"] >= 1.5 * cublas, summary
