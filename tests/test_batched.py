"""Strided-batched GEMM without a GPU: the batched entry point's argument checks (the generated C
launcher, built with nvcc and run on the host, against the Plan's Python checks), what a batched
call launches (gemmgen/gpu/launch.py's decision: grids, tensor maps, the fallback), and the Python
runtime's reading of 3-D arrays (ShapeErrors). tests/test_gpu_batched.py runs them on a GPU.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess

import pytest

from conftest import GENERATED_DIR, SPECS_DIR
from gemmgen.codegen.cuda import generate
from gemmgen.gpu import runtime
from gemmgen.gpu.launch import decide
from gemmgen.gpu.runtime import Kernel, ShapeError
from gemmgen.language.load import load_one, parse
from gemmgen.plan import make_plan
from test_launch import TMA, plan_of  # the TMA kernel text and its planning, shared

INVALID = 1  # cudaErrorInvalidValue

COL_C = """kernel colc {
  target sm_80
  layout A col, B row, C col
  block  64 x 64 x 16
  warp   32 x 32
  thread 8 x 4
  stages 2 async
}
"""

# The host program: each line of stdin is a call of the batched entry point (pointers fake, or
# null), answered by its return code and the single GEMM's for the same call with batch 1.
MAIN = """#include <stdio.h>
#include <cuda_runtime.h>
#include "{header}"
int main() {{
    int M, N, K, lda, ldb, ldc, batch, null_a, null_b, null_c;
    long long sa, sb, sc;
    float beta;
    while (scanf("%d %d %d %d %d %d %f %d %lld %lld %lld %d %d %d", &M, &N, &K, &lda, &ldb, &ldc, &beta, &batch,
                 &sa, &sb, &sc, &null_a, &null_b, &null_c) == 14) {{
        float* A = null_a ? nullptr : (float*)4096;
        float* B = null_b ? nullptr : (float*)8192;
        float* C = null_c ? nullptr : (float*)16384;
        const int batched = {name}_batched(M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, batch, sa, sb, sc, 0);
        const int single = {name}(M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, 0);
        printf("%d %d\\n", batched, single);
    }}
}}
"""


def _host_binary(source_path, header_path, name: str, target: str, tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH (the CUDA toolkit builds the launcher for the host; CI has it)")
    main = tmp_path / "main.cpp"
    main.write_text(MAIN.format(header=header_path, name=name))
    binary = tmp_path / "calls"
    arch = target.removeprefix("sm_")
    subprocess.run([nvcc, "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-o", str(binary),
                    str(source_path), str(main)], check=True, capture_output=True, text=True)
    return binary


def _cases(plan, count: int = 160) -> list[tuple]:
    """(M, N, K, lda, ldb, ldc, beta, batch, strideA, strideB, strideC, null A, null B, null C)."""
    rng = random.Random(29)
    ld = plan.leading_dimension_minimums()

    def tight(M, N, K):
        sizes = {"M": M, "N": N, "K": K}
        return [max(1, sizes[ld[name]]) for name in ("lda", "ldb", "ldc")]

    cases = []
    M, N, K = 5, 7, 3
    lda, ldb, ldc = tight(M, N, K)
    extent = plan.c.extent(M, N, ldc)
    fixed = [
        (M, N, K, lda, ldb, ldc, 0.0, 0, 0, 0, 0, 1, 1, 1),              # batch 0: nothing, null pointers too
        (M, N, K, lda, ldb, ldc, 0.0, -1, 0, 0, extent, 0, 0, 0),        # negative batch
        (M, N, K, lda, ldb, ldc, 0.0, 2, -4, 0, extent, 0, 0, 0),        # negative stride of A
        (M, N, K, lda, ldb, ldc, 0.0, 2, 0, -1, extent, 0, 0, 0),        # of B
        (M, N, K, lda, ldb, ldc, 0.0, 2, 0, 0, -extent, 0, 0, 0),        # of C
        (M, N, K, lda, ldb, ldc, 0.0, 2, 0, 0, 0, 0, 0, 0),              # C's stride 0 with two batches
        (M, N, K, lda, ldb, ldc, 0.0, 2, 0, 0, extent - 1, 0, 0, 0),     # C batches overlapping by one
        (M, N, K, lda, ldb, ldc, 0.0, 2, 0, 0, extent, 0, 0, 0),         # C batches touching: valid
        (M, N, K, lda, ldb, ldc, 0.0, 1, 0, 0, 0, 0, 0, 0),              # one batch, C's stride 0: valid
        (M, N, K, lda, ldb, ldc, 0.0, 3, 1 << 62, 0, extent, 0, 0, 0),   # batch * stride past 64 bits
        (M, N, K, lda, ldb, ldc, 0.0, 2, 0, 0, extent, 0, 0, 1),         # null C
        (0, N, K, lda, ldb, ldc, 0.0, 4, 0, 0, 0, 1, 1, 1),              # empty C: nothing to do
        (M, N, K, lda - 1 if ld["lda"] == "K" else lda, ldb, ldc, 0.0, 2, 0, 0, extent, 0, 0, 0),
    ]
    cases += fixed
    for _ in range(count):
        M, N, K = (rng.choice([0, 1, 3, 64, 65, 130]) for _ in range(3))
        lda, ldb, ldc = (x + rng.choice([0, 0, 1, 4]) for x in tight(M, N, K))
        batch = rng.choice([0, 1, 2, 3, 9, -2])
        a_size, b_size = M * lda, N * ldb  # about the matrices' sizes, whatever the layouts
        sa = rng.choice([0, a_size, a_size + 3, max(0, a_size - 1), -8])
        sb = rng.choice([0, b_size, b_size + 4, max(0, b_size // 2)])
        extent = plan.c.extent(M, N, ldc)
        sc = rng.choice([0, extent, extent + 5, max(0, extent - 1), -1])
        cases.append((M, N, K, lda, ldb, ldc, 0.0, batch, sa, sb, sc, 0, 0, 0))
    return cases


def _expected(plan, case) -> tuple[str, str]:
    """What the batched and the single call return: "invalid", "nothing" (cudaSuccess without a
    launch) or "launch" (valid: on a machine with no GPU visible, some CUDA error other than those)."""
    M, N, K, lda, ldb, ldc, beta, batch, sa, sb, sc, null_a, null_b, null_c = case

    def outcome(batch, strides):
        if plan.argument_error(M, N, K, lda, ldb, ldc, batch, strides):
            return "invalid"
        if batch == 0 or M == 0 or N == 0:
            return "nothing"
        if null_c or (K > 0 and (null_a or null_b)):
            return "invalid"
        return "launch"

    return outcome(batch, (sa, sb, sc)), outcome(1, (0, 0, 0))


def _read(code: int) -> str:
    return {0: "nothing", INVALID: "invalid"}.get(code, "launch")


@pytest.mark.parametrize("name", ["naive", "split_k", "hopper_tf32", "col C"])
def test_the_batched_launcher_refuses_what_the_plan_refuses_before_any_cuda_call(name, tmp_path):
    """The generated launcher, built with nvcc and run on the host with no GPU visible: a call the
    Plan's checks refuse returns cudaErrorInvalidValue before any CUDA call (so nothing is launched
    or written), batch 0 and empty C return cudaSuccess, and valid calls go on to CUDA (which,
    with no GPU, answers with an error of its own). The single GEMM's entry point is the batched
    call for one batch."""
    if name == "col C":
        (spec,) = parse(COL_C)
        plan = make_plan(spec)
        source, header = tmp_path / "colc.cu", tmp_path / "colc.h"
        from gemmgen.codegen.c_header import header_source
        source.write_text(generate(plan))
        header.write_text(header_source(plan, "colc.cu"))
    else:
        plan = make_plan(load_one(SPECS_DIR / f"{name}.gemm"))
        source, header = GENERATED_DIR / f"{name}.cu", GENERATED_DIR / f"{name}.h"
    binary = _host_binary(source, header, plan.launcher_name, plan.spec["target"], tmp_path)
    cases = _cases(plan)
    feed = "\n".join(" ".join(str(x) for x in case) for case in cases)
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # valid calls reach no GPU
    out = subprocess.run([str(binary)], input=feed, capture_output=True, text=True, check=True,
                         env=environment).stdout.split("\n")
    assert len([line for line in out if line]) == len(cases)
    for case, line in zip(cases, out):
        batched, single = (int(x) for x in line.split())
        assert (_read(batched), _read(single)) == _expected(plan, case), (name, case, batched, single)


def test_the_headers_declare_the_batched_entry_point_where_there_is_one():
    naive = (GENERATED_DIR / "naive.h").read_text()
    prototype = " ".join(naive[naive.index("int gemmgen_naive_batched("):].split(";")[0].split())
    assert prototype == ("int gemmgen_naive_batched(int M, int N, int K, float alpha, const float *A, int lda, "
                         "const float *B, int ldb, float beta, float *C, int ldc, int batch, long long strideA, "
                         "long long strideB, long long strideC, cudaStream_t stream)")
    smallest = (GENERATED_DIR / "smallest.h").read_text()
    assert "_batched(" not in smallest and "no batched entry point" in smallest
    source = (GENERATED_DIR / "smallest.cu").read_text()
    assert 'extern "C" int gemmgen_smallest_batched' not in source  # the reduction's launcher stays inside


# --- what a batched call launches ------------------------------------------------------------------

@pytest.mark.parametrize("extra", ["", "schedule persistent", "schedule stream-k", "cluster 2 x 1",
                                   "epilogue alpha beta staged"])
def test_a_batched_tma_launch_covers_every_batchs_tiles_with_3d_maps(extra):
    plan = plan_of(TMA.format(extra=extra))
    M, N, K, batch = 300, 200, 64, 7
    strides = (M * K, 0, M * N + 4)  # A packed, B broadcast, C padded
    (step,) = decide(plan, M, N, K, K, K, N, (0, 0, 0), 132, batch, strides).steps
    assert step.grid == (plan.scheduler.launch_blocks(M, N, K, 132, batch), 1)
    if not plan.scheduled:
        assert step.grid[0] == plan.cluster_grid(M, N) * batch  # a block per tile of every batch
    assert {k: step.fixed[k] for k in ("batch", "strideA", "strideB", "strideC")} == \
        {"batch": 7, "strideA": M * K, "strideB": 0, "strideC": M * N + 4}
    maps = {m.param: m for m in step.maps}
    assert maps["map_a"].batch_dims == (7, M * K)   # batches of A, its stride apart
    assert maps["map_b"].batch_dims == (1, N * K)   # one B for every batch: a batch dimension of 1
    if "staged" in extra:
        assert maps["map_c"].batch_dims == (7, M * N + 4)


def test_tma_kernels_hand_batches_tma_cannot_step_through_to_their_fallback():
    plan = plan_of(TMA.format(extra=""))
    M, N, K = 256, 256, 256
    ok = dict(align=(0, 0, 0), sms=132)
    assert not decide(plan, M, N, K, K, K, N, batch=4, strides=(M * K, N * K, M * N), **ok).fallback
    assert not decide(plan, M, N, K, K, K, N, batch=4, strides=(0, 0, M * N), **ok).fallback
    for strides in ((M * K + 2, 0, M * N), (M * K - 4, 0, M * N), (0, N * K + 1, M * N), (0, 4, M * N)):
        assert decide(plan, M, N, K, K, K, N, batch=4, strides=strides, **ok).fallback, strides
    # one batch: the strides do not matter
    assert not decide(plan, M, N, K, K, K, N, batch=1, strides=(3, 5, 0), **ok).fallback
    assert decide(plan, M, N, K, K, K, N, batch=0, strides=(0, 0, 0), **ok).steps == ()


def test_a_batched_split_k_launch_scales_every_batchs_c():
    plan = make_plan(load_one(SPECS_DIR / "split_k.gemm"))
    scale, main = decide(plan, 300, 200, 5000, 5000, 200, 200, (0, 0, 0), 132, 3, (0, 0, 60000)).steps
    assert scale.fixed == {"M": 300, "N": 200, "ldc": 200, "batch": 3, "strideC": 60000}
    assert scale.grid == (3 * 300 * 200 // 256 + 1, 1)
    assert main.grid == (plan.grid(300, 200) * 3, plan.split_k)


def test_the_vector_variant_needs_every_batchs_pointers_aligned():
    plan = make_plan(load_one(SPECS_DIR / "vectorized.gemm"))
    (step,) = decide(plan, 64, 64, 64, 64, 64, 64, (0, 0, 0), 132, 2, (4096, 4096, 4096)).steps
    assert step.aligned
    (step,) = decide(plan, 64, 64, 64, 64, 64, 64, (0, 0, 0), 132, 2, (4097, 4096, 4096)).steps
    assert not step.aligned


def test_the_plan_says_why_a_batched_call_is_refused():
    plan = make_plan(load_one(SPECS_DIR / "naive.gemm"))
    assert "must be >= 0" in plan.argument_error(4, 4, 4, 4, 4, 4, -1, (0, 0, 16))
    assert "overlap" in plan.argument_error(4, 4, 4, 4, 4, 4, 2, (0, 0, 15))
    assert plan.argument_error(4, 4, 4, 4, 4, 4, 2, (0, 0, 16)) is None
    smallest = make_plan(load_one(SPECS_DIR / "smallest.gemm"))
    assert "one batch" in smallest.argument_error(4, 4, 4, 4, 4, 4, 2, (0, 0, 16))


# --- the Python runtime: 3-D arrays ----------------------------------------------------------------

class Array:
    """A device array as __cuda_array_interface__ describes it (nothing behind it)."""

    def __init__(self, shape, strides=None, address=1 << 20, typestr="<f4"):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "strides": strides, "typestr": typestr,
                                         "data": (address, False), "version": 3}


def _kernel(spec_name: str = "naive"):
    """A Kernel made without compiling or a GPU, whose launches are recorded."""
    kernel = Kernel.__new__(Kernel)
    kernel.plan = make_plan(load_one(SPECS_DIR / f"{spec_name}.gemm"))
    calls = []
    kernel.launch = lambda *args, **kwargs: calls.append((args, kwargs))
    return kernel, calls


def test_3d_arrays_call_the_batched_entry_point_with_their_strides():
    kernel, calls = _kernel()
    kernel(Array((3, 4, 5)), Array((3, 5, 6)), Array((3, 4, 6)))
    (args, kwargs), = calls
    assert args[:3] == (4, 6, 5) and kwargs["batch"] == 3 and kwargs["strides"] == (20, 30, 24)


def test_a_2d_operand_or_one_of_batch_1_serves_every_batch():
    kernel, calls = _kernel()
    kernel(Array((4, 5)), Array((2, 5, 6)), Array((2, 4, 6)))
    kernel(Array((2, 4, 5)), Array((1, 5, 6)), Array((2, 4, 6)))
    padded = (40 * 4, 6 * 4, 4)  # C's batches 40 floats apart, past its 24
    kernel(Array((2, 4, 5)), Array((2, 5, 6)), Array((2, 4, 6), strides=padded))
    assert [c[1]["strides"] for c in calls] == [(0, 30, 24), (20, 0, 24), (20, 30, 40)]
    kernel(Array((0, 4, 5)), Array((0, 5, 6)), Array((0, 4, 6)))
    assert calls[-1][1]["batch"] == 0


@pytest.mark.parametrize("arrays, message", [
    (((3, 4, 5), (2, 5, 6), (3, 4, 6)), "batch sizes differ: A holds 3, B holds 2"),
    (((3, 4, 5), (3, 5, 6), (4, 6)), "C must hold all 3 batches"),
    (((3, 4, 5), (3, 5, 6), (1, 4, 6)), "C must hold all 3 batches"),
    (((2, 3, 4, 5), (5, 6), (4, 6)), "must be a matrix (2-D) or a batch of matrices (3-D"),
])
def test_arrays_that_do_not_batch_are_shape_errors(arrays, message):
    kernel, calls = _kernel()
    with pytest.raises(ShapeError, match=re.escape(message)):
        kernel(*(Array(shape) for shape in arrays))
    assert calls == []


def test_a_c_whose_batches_share_memory_is_a_shape_error():
    kernel, calls = _kernel()
    shared = (0, 6 * 4, 4)  # an expanded C: every batch the same matrix
    with pytest.raises(ShapeError, match="share one matrix"):
        kernel(Array((2, 4, 5)), Array((2, 5, 6)), Array((2, 4, 6), strides=shared))
    with pytest.raises(ShapeError, match="batch stride .* not a whole"):
        kernel(Array((2, 4, 5), strides=(82, 20, 4)), Array((2, 5, 6)), Array((2, 4, 6)))
    assert calls == []


def test_the_prepared_launch_of_a_batched_call_is_kept_apart_from_the_single_ones(monkeypatch):
    """prepare() keys a batched call by its batch and strides, and refuses what the launcher refuses."""
    kernel, _ = _kernel()
    with pytest.raises(runtime.CudaError, match="overlap"):
        Kernel.prepare(kernel, 4, 4, 4, 4, 4, 4, batch=2, strides=(0, 0, 8))


# --- the kernels NVRTC builds take the batches --------------------------------------------------------

@pytest.mark.parametrize("name", ["naive", "warptile", "tensorcore_tf32", "hopper_skinny", "split_k"])
def test_every_paths_kernel_takes_the_batch_count_and_64_bit_strides(name):
    """SIMT (naive, tiles, split K), mma.sync and register-fed wgmma kernels, built by NVRTC (the
    shipped specs, compiled once a session): their parameters end with batch (int) and the three
    strides (64-bit), where gemmgen/gpu/launch.py writes them (test_launch.py checks the TMA kernel's)."""
    from cubin_params import kernel_parameters
    from gemmgen.codegen.cuda import kernel_name_expressions
    from gemmgen.gpu.compile import compile_plan
    from gemmgen.gpu.launch import BATCH, KINDS, MAIN, parameter_offsets
    plan = make_plan(load_one(SPECS_DIR / f"{name}.gemm"))
    compiled = compile_plan(plan)
    offsets, _ = parameter_offsets(MAIN + BATCH)
    expected = [(offsets[p], KINDS[kind][1]) for p, kind in MAIN + BATCH]
    assert expected[-4:] == [(offsets["batch"], 4), (offsets["strideA"], 8), (offsets["strideB"], 8),
                             (offsets["strideC"], 8)]
    for expression in kernel_name_expressions(plan).values():
        assert kernel_parameters(compiled.cubin, compiled.lowered_names[expression]) == expected
