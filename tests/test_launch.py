"""gemmgen.gpu.launch on the CPU: the launch decided once per call key, and what a call hands the driver.

- The argument buffers are laid out as the compiler lays out each kernel's parameters (read back
  from the cubins NVRTC builds here), so what a call writes is what the kernel reads.
- `decide` makes the C launcher's decisions: variants by alignment, split K's pass over C, TMA's
  fallback, clusters, persistent and stream-K grids and workspaces.
- A PreparedLaunch, run against a stand-in for libcuda, writes only the call's values, launches
  once per kernel with kernelParams pointing into its buffers, encodes each tensor map once, makes
  the kernel's context current only when another is, and turns a failed launch into a CudaError.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import replace

import pytest

from cubin_params import kernel_parameters
from gemmgen.gpu import launch
from gemmgen.gpu.launch import (BATCH, KINDS, MAIN, REDUCE_CLEAR, REDUCE_FINISH, SCALE_C, Arguments, CudaError, PreparedLaunch,
                            PreparedStep, Step, TensorMapSpec, decide, parameter_offsets, tma_signature)
from gemmgen.codegen.cuda import generate
from gemmgen.plan import make_plan
from gemmgen.language.load import parse

TMA = """kernel t {{
  target   sm_90a
  layout   A row, B col, C row
  block    128 x 128 x 32
  math     tf32
  stages   4 tma
  {extra}
}}
"""


def plan_of(text: str):
    (spec,) = parse(text)
    return make_plan(spec)


def expected_table(signature) -> list[tuple[int, int]]:
    offsets, _ = parameter_offsets(signature)
    return [(offsets[name], KINDS[kind][1]) for name, kind in signature]


# --- the argument buffers against the compiler's parameter tables ------------------------------------

def test_a_tma_kernels_arguments_sit_where_the_compiler_put_its_parameters():
    """map_a, map_b (64-byte aligned, 128 bytes), sizes and scalars, C, ldc, map_c, workspace: the
    cubin's table for the staged stream-K kernel, and the register-fed fallback's (the C ABI)."""
    from gemmgen.gpu.compile import compile_plan
    from gemmgen.codegen.cuda import kernel_name_expressions
    plan = plan_of(TMA.format(extra="schedule stream-k\n  epilogue alpha beta staged"))
    compiled = compile_plan(plan)
    for aligned, expression in kernel_name_expressions(plan).items():
        table = kernel_parameters(compiled.cubin, compiled.lowered_names[expression])
        assert table == expected_table(tma_signature(tma_store=True, stream_k=True)), aligned
    assert expected_table(tma_signature(True, True))[9] == (320, 128)  # map_c after ldc, on 64 bytes
    for expression in kernel_name_expressions(plan.fallback).values():
        assert kernel_parameters(compiled.cubin, compiled.lowered_names[expression]) == expected_table(MAIN + BATCH)


def test_split_k_and_reduction_kernels_arguments_sit_where_the_compiler_put_them():
    from gemmgen.gpu.compile import compile_plan
    from gemmgen.language.load import load_one
    from conftest import SPECS_DIR
    split = make_plan(load_one(SPECS_DIR / "split_k.gemm"))
    compiled = compile_plan(split)
    assert kernel_parameters(compiled.cubin, f"{split.launcher_name}_scale_c") == expected_table(SCALE_C)
    smallest = make_plan(load_one(SPECS_DIR / "smallest.gemm"))
    compiled = compile_plan(smallest)
    assert kernel_parameters(compiled.cubin, f"{smallest.launcher_name}_reduce_finish") == expected_table(REDUCE_FINISH)


def test_an_argument_buffer_holds_each_value_at_its_offset_and_points_the_driver_there():
    signature = tma_signature(tma_store=True, stream_k=True)
    arguments = Arguments(signature)
    map_a, map_b, map_c = bytes(range(128)), bytes(range(128, 256)), b"\x07" * 128
    values = (map_a, map_b, 7, -3, 11, 1.5, -0.25, 0xDEAD0000, 40, map_c, 0xBEEF00, 3, 1 << 40, 0, 5 << 33)
    for (name, _), value in zip(signature, values):
        arguments.set(name, value)
    offsets, size = parameter_offsets(signature)
    assert arguments.address % 64 == 0 and size == 512
    raw = arguments.raw()
    assert raw[:256] == map_a + map_b and raw[320:448] == map_c
    assert struct.unpack_from("<iiiff", raw, offsets["M"]) == (7, -3, 11, 1.5, -0.25)
    assert struct.unpack_from("<Qi", raw, offsets["C"]) == (0xDEAD0000, 40)
    assert struct.unpack_from("<Q", raw, offsets["workspace"]) == (0xBEEF00,)
    assert struct.unpack_from("<i", raw, offsets["batch"]) == (3,)  # the batches' count and strides, 64-bit
    assert struct.unpack_from("<qqq", raw, offsets["strideA"]) == (1 << 40, 0, 5 << 33)
    pointers = (ctypes.c_void_p * len(signature)).from_address(arguments.kernel_params)
    assert [p for p in pointers] == [arguments.address + offsets[name] for name, _ in signature]


# --- the decision ----------------------------------------------------------------------------------

def test_tma_kernels_go_to_their_fallback_where_tma_cannot_describe_a_or_b():
    plan = plan_of(TMA.format(extra=""))
    assert not decide(plan, 256, 256, 256, 256, 256, 256, (0, 0, 0), 132).fallback
    for lda, ldb, align in ((257, 256, (0, 0, 0)), (256, 258, (0, 0, 0)), (256, 256, (4, 0, 0)), (256, 256, (0, 8, 0))):
        assert decide(plan, 256, 256, 256, lda, ldb, 256, align, 132).fallback, (lda, ldb, align)
    assert decide(plan, 256, 256, 0, 256, 256, 256, (0, 0, 0), 132).fallback  # K = 0: C = beta C by the fallback
    assert decide(plan, 0, 256, 256, 256, 256, 256, (0, 0, 0), 132).steps == ()  # nothing to do


def test_the_tma_step_encodes_a_and_b_in_slices_of_their_clusters_tiles():
    plan = plan_of(TMA.format(extra="cluster 2 x 1"))
    (step,) = decide(plan, 1000, 700, 300, 300, 304, 700, (0, 0, 0), 132).steps
    assert [(m.param, m.operand, m.inner, m.outer, m.ld, m.box_inner, m.box_outer, m.swizzle, m.promote)
            for m in step.maps] == [("map_a", "A", 300, 1000, 300, 32, 128, 128, 256),
                                    ("map_b", "B", 300, 700, 304, 32, 64, 128, 256)]
    assert step.grid == (plan.cluster_grid(1000, 700), 1) == (8 * 6, 1)  # tiles rounded up to whole clusters
    assert step.fixed == {"M": 1000, "N": 700, "K": 300, "ldc": 700, "batch": 1, "strideA": 0, "strideB": 0, "strideC": 0}
    assert step.per_call == ("alpha", "beta", "C")


@pytest.mark.parametrize("layouts, maps", [
    ("A col, B col", [("map_a", "A", 1000, 300, 1004, 32, 32, 128), ("map_b", "B", 300, 700, 304, 32, 128, 256)]),
    ("A row, B row", [("map_a", "A", 300, 1000, 300, 32, 128, 256), ("map_b", "B", 700, 300, 704, 32, 32, 128)]),
    ("A col, B row", [("map_a", "A", 1000, 300, 1004, 32, 32, 128), ("map_b", "B", 700, 300, 704, 32, 32, 128)])])
def test_mn_major_operands_are_encoded_as_rows_by_k_in_32_row_boxes(layouts, maps):
    """3xtf32 reads a column-major A or row-major B from MN-major tiles: TMA views it as (rows, K),
    rows contiguous, and loads boxes of 32 rows by BK; a K-major operand stays (K, rows), one box."""
    plan = plan_of(TMA.format(extra="").replace("math     tf32", "math     3xtf32")
                   .replace("layout   A row, B col", f"layout   {layouts}"))
    lda = 1004 if layouts.startswith("A col") else 300
    ldb = 704 if layouts.endswith("B row") else 304
    (step,) = decide(plan, 1000, 700, 300, lda, ldb, 700, (0, 0, 0), 132).steps
    assert [(m.param, m.operand, m.inner, m.outer, m.ld, m.box_inner, m.box_outer, m.promote)
            for m in step.maps[:2]] == maps  # L2 promotion: 256 bytes at most for K-major tiles, 128 for MN-major
    assert all(m.swizzle == 128 for m in step.maps[:2])


def test_k_major_tiles_are_promoted_256_bytes_only_where_every_row_starts_128_byte_aligned():
    """Rows off 128 bytes (ld = 4092, say) ran 20% slower with 256-byte L2 promotion on an H100; the
    C launcher's condition (wgmma_maps_k_major.cuh.j2) is the same."""
    plan = plan_of(TMA.format(extra=""))
    (step,) = decide(plan, 64, 4096, 4096, 4096, 4096, 4096, (0, 0, 0), 132).steps
    a = step.maps[0]
    assert a.promote == 256 and a.promotion(1 << 20) == 256
    assert a.promotion((1 << 20) + 64) == 128                       # the matrix starts off 128 bytes
    assert replace(a, ld=4092).promotion(1 << 20) == 128            # rows 16-byte aligned only
    assert replace(a, ld=4104).promotion(1 << 20) == 128            # rows 32-byte aligned only
    assert replace(a, batches=3, batch_stride=4096 * 4100).promotion(1 << 20) == 256
    assert replace(a, batches=3, batch_stride=4096 * 4096 + 8).promotion(1 << 20) == 128  # a later batch is off
    source = generate(plan)
    assert ("reinterpret_cast<unsigned long long>(bases[i]) % 128 == 0 && lds[i] % 32 == 0 &&\n"
            "                              (one || batch_strides[i] % 32 == 0);") in source
    assert "rows_128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_L2_128B" in source


def test_the_staged_epilogue_gets_cs_map_only_where_c_is_aligned():
    plan = plan_of(TMA.format(extra="epilogue alpha beta staged"))
    (aligned,) = decide(plan, 512, 512, 64, 64, 64, 512, (0, 0, 0), 132).steps
    assert aligned.aligned and aligned.maps[-1] == TensorMapSpec("map_c", "C", 512, 512, 512, plan.c_box_inner,
                                                                  plan.c_box_outer, plan.c_box_swizzle, False)
    (unaligned,) = decide(plan, 512, 512, 64, 64, 64, 512, (0, 0, 4), 132).steps
    assert not unaligned.aligned and [m.param for m in unaligned.maps] == ["map_a", "map_b"]
    assert bytes(unaligned.fixed["map_c"]) == bytes(128)  # a zero map the scalar variant never reads


@pytest.mark.parametrize("schedule", ["persistent", "stream-k"])
def test_scheduled_tma_kernels_start_the_launchers_blocks_and_stream_k_asks_for_its_workspace(schedule):
    plan = plan_of(TMA.format(extra=f"schedule {schedule}"))
    (step,) = decide(plan, 4096, 4096, 4096, 4096, 4096, 4096, (0, 0, 0), 132).steps
    assert step.grid == (plan.launch_blocks(4096, 4096, 4096, 132), 1) == (132, 1)
    assert step.workspace == (plan.workspace_bytes(132) if schedule == "stream-k" else 0)
    assert step.signature == tma_signature(False, schedule == "stream-k")


def test_split_k_scales_c_first_then_runs_the_slices():
    from gemmgen.language.load import load_one
    from conftest import SPECS_DIR
    plan = make_plan(load_one(SPECS_DIR / "split_k.gemm"))
    scale, main = decide(plan, 300, 200, 5000, 5000, 200, 200, (0, 0, 0), 132).steps
    assert (scale.kernel, scale.grid, scale.threads, scale.signature) == ("scale_c", (300 * 200 // 256 + 1, 1), 256, SCALE_C)
    assert scale.per_call == ("beta", "C")
    assert (main.kernel, main.grid, main.threads, main.smem) == ("main", (plan.grid(300, 200), plan.split_k),
                                                               plan.threads, plan.smem_bytes)
    assert main.per_call == ("alpha", "A", "B", "beta", "C")
    (big_scale, _) = decide(plan, 4096, 4096, 4096, 4096, 4096, 4096, (0, 0, 0), 132).steps
    assert big_scale.grid == (4096, 1)  # at most 4096 blocks, each striding over the rest


def test_the_vector_variant_needs_every_vector_access_aligned():
    from gemmgen.language.load import load_one
    from conftest import SPECS_DIR
    plan = make_plan(load_one(SPECS_DIR / "vectorized.gemm"))
    assert decide(plan, 256, 256, 256, 256, 256, 256, (0, 0, 0), 132).steps[0].aligned
    assert not decide(plan, 256, 256, 256, 256, 256, 256, (4, 0, 0), 132).steps[0].aligned
    assert not decide(plan, 256, 256, 256, 257, 256, 256, (0, 0, 0), 132).steps[0].aligned


def test_a_fused_reduction_clears_before_and_finishes_after_even_with_nothing_to_multiply():
    from gemmgen.language.load import load_one
    from conftest import SPECS_DIR
    plan = make_plan(load_one(SPECS_DIR / "smallest.gemm"))
    assert [s.kernel for s in decide(plan, 64, 64, 64, 64, 64, 64, (0, 0, 0), 132).steps] == \
        ["reduce_clear", "main", "reduce_finish"]
    clear, finish = decide(plan, 0, 64, 64, 64, 64, 64, (0, 0, 0), 132).steps
    assert (clear.signature, finish.signature, finish.fixed) == (REDUCE_CLEAR, REDUCE_FINISH, {"N": 64})
    assert finish.per_call == ("values", "rows", "cols")


# --- a prepared launch against a stand-in for libcuda ----------------------------------------------------

class FakeCuda:
    """libcuda's calls the hot path makes, with the ctypes objects it passes, recording launches
    with their arguments decoded from the kernelParams pointers by each launched function's
    signature; a tensor map's bytes say what it describes."""

    def __init__(self, signatures: dict[int, tuple], current: int = 0x100, fail: int = 0):
        self.signatures, self.current, self.fail = signatures, current, fail
        self.launches, self.encoded, self.switches, self.batch_dims, self.types = [], [], [], [], []

    def cuCtxGetCurrent(self, ref):
        ref._obj.value = self.current or None
        return 0

    def cuCtxSetCurrent(self, context):
        self.switches.append(context.value)
        self.current = context.value
        return 0

    def cuLaunchKernelEx(self, config_ref, function, params, extra):
        config = config_ref._obj
        signature = self.signatures[function.value]
        pointers = (ctypes.c_void_p * len(signature)).from_address(params.value) if signature else []
        args = {}
        for (name, kind), pointer in zip(signature, pointers):
            if kind == "t":
                args[name] = ctypes.string_at(pointer, 128)
            else:
                args[name] = KINDS[kind][0].from_address(pointer).value
        self.launches.append({"function": function.value, "grid": (config.grid_x, config.grid_y, config.grid_z),
                              "block": (config.block_x, config.block_y, config.block_z),
                              "smem": config.shared_bytes, "stream": config.stream or 0, "context": self.current,
                              "args": args, "extra": extra})
        return self.fail

    def cuTensorMapEncodeTiled(self, out, dtype, rank, address, dims, strides, box, ones, interleave, swizzle,
                               promotion, fill):
        # FLOAT32 (7), or TFLOAT32 (11): TMA rounds A and B to nearest TF32 as it copies them
        assert dtype.value in (7, 11) and (rank.value, interleave.value, fill.value) == (3, 0, 0)
        assert list(ones) == [1, 1, 1] and box[2] == 1  # one matrix of the batches at a time
        self.encoded.append(address.value)
        self.types.append(dtype.value)
        self.batch_dims.append((dims[2], strides[1]))
        described = struct.pack("<QQQQIIii", address.value, dims[0], dims[1], strides[0], box[0], box[1],
                                swizzle.value, promotion.value)
        ctypes.memmove(out, described, len(described))
        return 0

    def cuGetErrorName(self, status, ref):
        ref._obj.value = b"CUDA_ERROR_INVALID_VALUE"
        return 0

    def cuGetErrorString(self, status, ref):
        ref._obj.value = b"invalid argument"
        return 0


def prepared(decision, functions: dict[str, int], context=0x200, workspace=None, map_cache_size=launch.MAPS_KEPT):
    steps = [PreparedStep(step, functions[step.kernel], f"launching {step.kernel}", map_cache_size)
             for step in decision.steps]
    return PreparedLaunch(context, steps, threading.Lock(), workspace or (lambda stream, size: 0xF000 + size), "t")


def test_a_prepared_tma_launch_writes_the_call_and_launches_once_in_the_kernels_context(monkeypatch):
    plan = plan_of(TMA.format(extra="schedule stream-k\n  epilogue alpha beta staged"))
    decision = decide(plan, 1024, 512, 256, 256, 256, 512, (0, 0, 0), 132)
    (step,) = decision.steps
    fake = FakeCuda({0x51: step.signature}, current=0x100)
    monkeypatch.setattr(launch, "_cuda", fake)
    run = prepared(decision, {"main": 0x51})
    run(0xA000, 0xB000, 0xC000, 2.0, 0.5, 77)
    (call,) = fake.launches
    assert call["context"] == 0x200 and fake.switches == [0x200, 0x100]  # made current, then given back
    assert (call["grid"], call["block"], call["smem"], call["stream"]) == ((step.grid[0], 1, 1), (plan.threads, 1, 1),
                                                                           plan.smem_bytes, 77)
    args = call["args"]
    assert (args["M"], args["N"], args["K"], args["ldc"], args["C"]) == (1024, 512, 256, 512, 0xC000)
    assert (args["alpha"], args["beta"], args["workspace"]) == (2.0, 0.5, 0xF000 + step.workspace)
    for name, address, rows, box in (("map_a", 0xA000, 1024, 128), ("map_b", 0xB000, 512, 128)):
        # swizzle 3 (128 bytes), L2 promotion 3 (256 bytes: rows 128-byte aligned)
        assert struct.unpack_from("<QQQQIIii", args[name]) == (address, 256, rows, 256 * 4, 32, box, 3, 3)
    assert struct.unpack_from("<QQQ", args["map_c"]) == (0xC000, 512, 1024)
    fake.current = 0x200  # the kernel's context already current: no switch
    run(0xA000, 0xB000, 0xC000, 1.0, 0.0, 77)
    assert fake.switches == [0x200, 0x100] and len(fake.launches) == 2
    assert fake.encoded == [0xA000, 0xB000, 0xC000]  # the second call's maps came from the cache
    assert fake.types == [11, 11, 7]  # A and B TFLOAT32 (TMA rounds them to nearest TF32), C FLOAT32


def test_tensor_maps_of_a_truncating_or_3xtf32_kernel_are_float32(monkeypatch):
    for extra, math in (("round truncate", "tf32"), ("", "3xtf32")):
        plan = plan_of(TMA.format(extra=extra).replace("math     tf32", f"math     {math}"))
        decision = decide(plan, 256, 256, 256, 256, 256, 256, (0, 0, 0), 132)
        fake = FakeCuda({0x51: decision.steps[0].signature})
        monkeypatch.setattr(launch, "_cuda", fake)
        prepared(decision, {"main": 0x51})(0xA000, 0xB000, 0xC000, 1.0, 0.0, 0)
        assert fake.types == [7, 7], (extra, math)  # the floats as they lie (3xtf32 splits them itself)


def test_tensor_maps_are_kept_for_each_operands_last_few_addresses(monkeypatch):
    plan = plan_of(TMA.format(extra=""))
    decision = decide(plan, 256, 256, 256, 256, 256, 256, (0, 0, 0), 132)
    fake = FakeCuda({0x51: decision.steps[0].signature})
    monkeypatch.setattr(launch, "_cuda", fake)
    run = prepared(decision, {"main": 0x51}, map_cache_size=2)
    for a in (0x1000, 0x5000, 0x1000, 0x6000, 0x5000, 0x1000):  # B stays at 0x2000: encoded once
        run(a, 0x2000, 0x3000, 1.0, 0.0, 0)
    # A's cache holds 2: 0x6000 pushes out 0x5000 (0x1000 was used since), then 0x5000 pushes out 0x1000
    assert fake.encoded == [0x1000, 0x2000, 0x5000, 0x6000, 0x5000, 0x1000]
    assert [call["args"]["map_a"][:8] for call in fake.launches] == \
        [struct.pack("<Q", a) for a in (0x1000, 0x5000, 0x1000, 0x6000, 0x5000, 0x1000)]


def test_a_models_weights_of_one_shape_are_each_encoded_once(monkeypatch):
    # A transformer's q, k, v and o projections are one call key with a weight each: 4 per layer.
    # Cycling through more weights than the maps kept made every call encode its map again.
    plan = plan_of(TMA.format(extra=""))
    decision = decide(plan, 256, 256, 256, 256, 256, 256, (0, 0, 0), 132)
    fake = FakeCuda({0x51: decision.steps[0].signature})
    monkeypatch.setattr(launch, "_cuda", fake)
    run = prepared(decision, {"main": 0x51})
    weights = [0x100000 + 0x10000 * i for i in range(4 * 80)]  # an 80-layer model's projections
    for _ in range(3):  # three forwards
        for weight in weights:
            run(0x1000, weight, 0x3000, 1.0, 0.0, 0)
    assert fake.encoded == [0x1000] + weights


def test_a_split_k_launch_scales_c_then_multiplies_with_the_calls_pointers(monkeypatch):
    from gemmgen.language.load import load_one
    from conftest import SPECS_DIR
    plan = make_plan(load_one(SPECS_DIR / "split_k.gemm"))
    decision = decide(plan, 300, 200, 5000, 5000, 200, 200, (0, 0, 0), 132)
    fake = FakeCuda({1: SCALE_C, 2: MAIN + BATCH}, current=0x200)
    monkeypatch.setattr(launch, "_cuda", fake)
    prepared(decision, {"scale_c": 1, "main": 2})(0xA0, 0xB0, 0xC0, 1.5, -1.0, 5)
    scale, main = fake.launches
    assert scale["args"] == {"M": 300, "N": 200, "beta": -1.0, "C": 0xC0, "ldc": 200, "batch": 1, "strideC": 0}
    assert main["args"] == {"M": 300, "N": 200, "K": 5000, "alpha": 1.5, "A": 0xA0, "lda": 5000, "B": 0xB0,
                            "ldb": 200, "beta": -1.0, "C": 0xC0, "ldc": 200, "batch": 1, "strideA": 0, "strideB": 0, "strideC": 0}
    assert main["grid"] == (plan.grid(300, 200), plan.split_k, 1) and fake.switches == []


def test_a_failed_launch_is_a_cuda_error_naming_the_launch_and_the_callers_context_comes_back(monkeypatch):
    from gemmgen.language.load import load_one
    from conftest import SPECS_DIR
    plan = make_plan(load_one(SPECS_DIR / "vectorized.gemm"))
    decision = decide(plan, 64, 64, 64, 64, 64, 64, (0, 0, 0), 132)
    fake = FakeCuda({9: MAIN}, current=0x100, fail=1)
    monkeypatch.setattr(launch, "_cuda", fake)
    with pytest.raises(CudaError, match=r"launching main: CUDA_ERROR_INVALID_VALUE \(invalid argument\)") as error:
        prepared(decision, {"main": 9})(0xA0, 0xB0, 0xC0, 1.0, 0.0, 0)
    assert error.value.code == 1 and fake.current == 0x100


def test_a_step_writes_its_fixed_values_once_and_only_the_calls_values_per_call():
    step = Step("main", True, (4, 1), 128, 0, MAIN, {"M": 1, "N": 2, "K": 3, "lda": 3, "ldb": 3, "ldc": 2})
    assert step.per_call == ("alpha", "A", "B", "beta", "C")
    prepared_step = PreparedStep(step, 1, "x")
    assert [source for _, _, source in prepared_step.writes] == [3, 0, 1, 4, 2]
    raw = prepared_step.arguments.raw()
    assert struct.unpack_from("<iii", raw, 0) == (1, 2, 3)  # M, N, K
    assert [struct.unpack_from("<i", raw, at)[0] for at in (24, 40, 56)] == [3, 3, 2]  # lda, ldb, ldc


# --- the description a launcher outside Python takes (torch/native.cpp) ---------------------------------

def _launch_from_description(described, values, stream):
    """What native.cpp does with PreparedLaunch.describe(): per step, the argument bytes with the
    call's values, tensor maps and workspace written at their offsets, and the stream."""
    made = []
    for function, config, buffer, offsets, writes, maps, workspace, what in described:
        buffer = bytearray(buffer)
        for offset, kind, source in writes:
            struct.pack_into({"f": "<f", "i": "<i", "q": "<q", "Q": "<Q"}[kind], buffer, offset, values[source])
        for offset, source, get in maps:
            buffer[offset:offset + 128] = get(values[source])
        if workspace:
            struct.pack_into("<Q", buffer, workspace[0], workspace[1](stream))
        grid = struct.unpack_from("<III", config)
        made.append((function, grid, bytes(buffer), offsets, what))
    return made


@pytest.mark.parametrize("extra", ["schedule stream-k\n  epilogue alpha beta staged", "", "schedule persistent"])
def test_a_described_launch_writes_what_the_python_launch_writes(monkeypatch, extra):
    plan = plan_of(TMA.format(extra=extra))
    decision = decide(plan, 1024, 512, 256, 256, 256, 512, (0, 0, 0), 132)
    (step,) = decision.steps
    fake = FakeCuda({0x51: step.signature}, current=0x200)
    monkeypatch.setattr(launch, "_cuda", fake)
    run = prepared(decision, {"main": 0x51})
    described = run.describe()
    values = (0xA000, 0xB000, 0xC000, 2.0, 0.0)
    run(*values, 77)
    (call,) = fake.launches
    (function, grid, buffer, offsets, what), = _launch_from_description(described, values + (0,) * 5, 77)
    assert (function, grid, what) == (0x51, call["grid"], "launching main")
    for (name, kind), offset in zip(step.signature, offsets):
        size = KINDS[kind][1]
        expected = call["args"][name]
        got = buffer[offset:offset + size] if kind == "t" else KINDS[kind][0].from_buffer_copy(buffer, offset).value
        assert got == expected, name
    if step.workspace:  # the workspace getter takes the launch's lock, as a call does
        assert run.lock.acquire(blocking=False)
        run.lock.release()


def test_a_described_split_k_launch_has_both_steps_in_order(monkeypatch):
    from gemmgen.language.load import load_one
    from conftest import SPECS_DIR
    plan = make_plan(load_one(SPECS_DIR / "split_k.gemm"))
    decision = decide(plan, 300, 200, 5000, 5000, 200, 200, (0, 0, 0), 132)
    fake = FakeCuda({1: SCALE_C, 2: MAIN + BATCH}, current=0x200)
    monkeypatch.setattr(launch, "_cuda", fake)
    run = prepared(decision, {"scale_c": 1, "main": 2})
    values = (0xA0, 0xB0, 0xC0, 1.5, 0.0)
    run(*values, 5)
    made = _launch_from_description(run.describe(), values + (0,) * 5, 5)
    assert [m[0] for m in made] == [1, 2]
    for (function, grid, buffer, offsets, _), call in zip(made, fake.launches):
        signature = fake.signatures[function]
        got = {name: KINDS[kind][0].from_buffer_copy(buffer, offset).value
               for (name, kind), offset in zip(signature, offsets)}
        assert got == call["args"] and grid == call["grid"]
