"""Fused epilogues on the CPU (issue 29): `bias row|col`, `scale row|col` and `activation NAME`.

- Bad words and combinations that cannot work are SpecErrors at file:line:col saying what to do;
  a library refuses a member with a fused epilogue.
- Every activation of ACTIVATIONS plans from its spec word and compiles with NVRTC.
- The vectors are kernel parameters after the main ones (where the compiler put them, read from the
  cubin), C ABI arguments after ldc (bias, then scale, then a reduction's outputs), and a prepared
  launch writes each call's vector addresses into them.
- The C launchers refuse a null vector with cudaErrorInvalidValue before anything runs (compiled for
  the host with nvcc, run without a GPU).
- The runtime takes bias=/scale= device arrays with ShapeErrors for length, dtype, stride, device,
  a missing vector and one the kernel was not built with.
- `gemmgen explain` shows the epilogue and the traffic of C it saves.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from conftest import GENERATED_DIR, SPECS_DIR
from cubin_params import kernel_parameters
from gemmgen.codegen.cuda import abi_signature, generate, kernel_name_expressions
from gemmgen.explain.report import as_dict, explain, render_text
from gemmgen.gpu import launch
from gemmgen.gpu.compile import Resources, compile_plan
from gemmgen.gpu.launch import KINDS, MAIN, decide, parameter_offsets
from gemmgen.plan.parts.launch import BATCH
from gemmgen.gpu.runtime import CudaError, Kernel, ShapeError
from gemmgen.language.errors import SpecError
from gemmgen.language.load import load_file, load_one
from gemmgen.library.resolve import resolve
from gemmgen.plan import make_plan
from gemmgen.plan.parts.epilogue import ACTIVATIONS

NAIVE = """kernel t {{
  target   sm_90
  block    32 x 32 x 1
  thread   1 x 1
  shared   off
  {extra}
}}
"""


def _error(tmp_path, text: str, name: str = "bad.gemm") -> SpecError:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        for spec in load_file(path).kernels:
            make_plan(spec)
    return caught.value


def _position(error: SpecError) -> str:
    return str(error).split(": ", 1)[0]


# --- the spec: bad words and impossible combinations, at their line and column --------------------

def test_an_unknown_activation_is_an_error_at_its_word_listing_the_activations(tmp_path):
    error = _error(tmp_path, NAIVE.format(extra="bias col\n  activation swish"))
    assert _position(error) == f"{tmp_path / 'bad.gemm'}:7:14"
    assert "unknown activation 'swish'" in str(error)
    for name in ACTIVATIONS:
        assert name in error.allowed


@pytest.mark.parametrize("line,column,message", [
    ("bias diag", 8, "'diag' is not a valid value for bias"),
    ("scale {row, diag}", 9, "'diag' is not a valid value for scale"),
    ("activation 3", 14, "3 is not a valid value for activation"),
    ("bias", 7, "unexpected end of line in 'bias' setting"),
])
def test_bad_words_are_errors_at_their_column(tmp_path, line, column, message):
    error = _error(tmp_path, NAIVE.format(extra=line))
    assert _position(error) == f"{tmp_path / 'bad.gemm'}:6:{column}"
    assert message in str(error)


def test_a_nonlinear_activation_under_split_k_is_an_error_at_the_activation_saying_what_to_do(tmp_path):
    text = (SPECS_DIR / "tensorcore_tf32.gemm").read_text().replace("epilogue alpha beta",
                                                                    "epilogue alpha beta\n  split 4\n  activation gelu")
    error = _error(tmp_path, text)
    line = text.splitlines().index("  activation gelu") + 1
    assert _position(error) == f"{tmp_path / 'bad.gemm'}:{line}:14"
    assert "atomicAdd" in str(error) and "split 1" in error.allowed and "stream-k" in error.allowed
    # bias and scale are linear: split K takes them (the first slice adds the bias)
    make_plan(load_one(SPECS_DIR / "epilogue_split_k.gemm"))


def test_an_activation_set_twice_is_an_error_at_the_second(tmp_path):
    error = _error(tmp_path, NAIVE.format(extra="activation relu\n  activation gelu"))
    assert _position(error) == f"{tmp_path / 'bad.gemm'}:7:3"


def test_a_library_refuses_a_member_with_a_fused_epilogue(tmp_path):
    text = (NAIVE.format(extra="bias col") +
            "library lib {\n  layout A row, B row, C row\n  members t\n  shapes 64x64x64\n}\n")
    path = tmp_path / "lib.gemm"
    path.write_text(text)
    parsed = load_file(path)
    with pytest.raises(SpecError, match="fuses an epilogue") as caught:
        resolve(parsed.libraries[0], parsed.kernels)
    assert _position(caught.value) == f"{path}:10:11"  # at the member's name


# --- every activation: its word plans, its CUDA compiles --------------------------------------------

@pytest.mark.parametrize("name", [name for name in ACTIVATIONS if name != "none"])
def test_every_activation_plans_from_its_word_and_compiles(name):
    (spec,) = load_file_text(NAIVE.format(extra=f"layout A col, B row, C col\n  bias row\n  scale col\n"
                                                f"  activation {name}"))
    plan = make_plan(spec)
    assert plan.epilogue.activation is ACTIVATIONS[name]
    source = generate(plan)
    call = ACTIVATIONS[name].apply('x').split('(')[0] + "("
    # every store applies it: the pass that computes the values in registers where C is not read, and
    # the store where it is
    assert f"acc[rm * TM + i][rn * TN + j] = {call}" in source and f"out[v] = read_c ? {call}" in source
    compiled = compile_plan(plan, source)
    for expression in kernel_name_expressions(plan).values():
        assert compiled.lowered_names[expression] in compiled.resources


def load_file_text(text: str):
    from gemmgen.language.load import parse
    return parse(text)


# --- parameters and the C ABI -----------------------------------------------------------------------

def _signature_table(signature):
    offsets, _ = parameter_offsets(signature)
    return [(offsets[name], KINDS[kind][1]) for name, kind in signature]


@pytest.mark.parametrize("name,extra", [("epilogue_split_k", ("bias", "scale")),
                                        ("epilogue_tma_staged", ("map_c", "bias")),
                                        ("epilogue_tma", ("bias", "scale"))])
def test_the_vectors_are_kernel_parameters_after_the_main_ones_where_the_compiler_put_them(name, extra):
    plan = make_plan(load_one(SPECS_DIR / f"{name}.gemm"))
    # the epilogue's parameters, then the batches' (count and strides), last
    assert plan.signature[-len(BATCH):] == BATCH
    assert tuple(p.name for p in plan.signature[-len(extra) - len(BATCH):-len(BATCH)]) == extra
    compiled = compile_plan(plan)
    for expression in kernel_name_expressions(plan).values():
        assert kernel_parameters(compiled.cubin, compiled.lowered_names[expression]) == _signature_table(plan.signature)
    fallback = plan.mainloop.fallback
    if fallback is not None:  # the register-fed fallback reads the same vectors
        assert fallback.signature == MAIN + tuple(p for p in plan.signature if p.kind == "v") + BATCH
        for expression in kernel_name_expressions(fallback).values():
            assert (kernel_parameters(compiled.cubin, compiled.lowered_names[expression])
                    == _signature_table(fallback.signature))


def test_the_abi_takes_bias_then_scale_after_ldc_then_a_reductions_outputs():
    spec = load_one(SPECS_DIR / "smallest.gemm").with_values(bias="row", scale="col")
    signature = abi_signature(make_plan(spec))
    assert ("float *C, int ldc, const float *bias, const float *scale, float *smallest_values, int *smallest_rows, "
            "int *smallest_cols, cudaStream_t stream);") in signature
    plain = abi_signature(make_plan(load_one(SPECS_DIR / "smallest.gemm")))
    assert "bias" not in plain and "scale" not in plain


class _FakeCuda:
    def __init__(self, signature):
        self.signature, self.args = signature, []

    def cuCtxGetCurrent(self, ref):
        ref._obj.value = 0x200
        return 0

    def cuLaunchKernelEx(self, config_ref, function, params, extra):
        import ctypes
        pointers = (ctypes.c_void_p * len(self.signature)).from_address(params.value)
        self.args.append({name: KINDS[kind][0].from_address(pointer).value
                          for (name, kind), pointer in zip(self.signature, pointers) if kind != "t"})
        return 0


def test_a_prepared_launch_writes_each_calls_vector_addresses(monkeypatch):
    import threading
    from gemmgen.gpu.launch import PreparedLaunch, PreparedStep
    plan = make_plan(load_one(SPECS_DIR / "epilogue_split_k.gemm"))
    decision = decide(plan, 300, 200, 700, 700, 200, 200, (0, 0, 0), 132)
    main = next(step for step in decision.steps if step.kernel == "main")
    assert main.per_call[-2:] == ("bias", "scale")
    fake = _FakeCuda(main.signature)
    monkeypatch.setattr(launch, "_cuda", fake)
    run = PreparedLaunch(0x200, [PreparedStep(main, 1, "main")], threading.Lock(), None, "t")
    run(0xA0, 0xB0, 0xC0, 1.0, 0.0, 0, (0, 0, 0), (0xB1A5, 0x5CA1E))
    run(0xA0, 0xB0, 0xC0, 1.0, 0.0, 0, (0, 0, 0), (0xB1A6, 0x5CA1F))
    assert [(args["bias"], args["scale"]) for args in fake.args] == [(0xB1A5, 0x5CA1E), (0xB1A6, 0x5CA1F)]


# --- the C launchers' checks, compiled for the host and run without a GPU ---------------------------

HOST_MAIN = r"""
#include <stdio.h>
#include <cuda_runtime.h>
extern "C" int gemmgen_epilogue_split_k(int, int, int, float, const float*, int, const float*, int, float, float*,
                                        int, const float*, const float*, cudaStream_t);
extern "C" int gemmgen_epilogue_tma(int, int, int, float, const float*, int, const float*, int, float, float*,
                                    int, const float*, const float*, cudaStream_t);
typedef int (*Entry)(int, int, int, float, const float*, int, const float*, int, float, float*, int,
                     const float*, const float*, cudaStream_t);
int main() {
    // Pointers the checks see as given; nothing may read or write them (there is no GPU).
    float* p = (float*)4096;
    Entry entries[2] = {gemmgen_epilogue_split_k, gemmgen_epilogue_tma};
    for (int e = 0; e < 2; ++e) {
        const int lda = e == 0 ? 64 : 64;  // split_k: A row (K), B row (N); tma: A row, B col
        printf("%d %d %d %d %d\n",
               entries[e](64, 64, 64, 1.0f, p, lda, p, 64, 0.0f, p, 64, nullptr, p, 0),
               entries[e](64, 64, 64, 1.0f, p, lda, p, 64, 0.0f, p, 64, p, nullptr, 0),
               entries[e](64, 64, 64, 1.0f, p, lda, p, 64, 0.0f, p, 64, nullptr, nullptr, 0),
               entries[e](0, 64, 64, 1.0f, p, lda, p, 64, 0.0f, p, 64, nullptr, nullptr, 0),
               entries[e](64, 64, 64, 1.0f, p, lda, p, 63, 0.0f, p, 64, p, p, 0));
    }
}
"""


def test_the_launchers_refuse_a_null_vector_before_anything_runs(tmp_path):
    """bias or scale null: cudaErrorInvalidValue (1), checked before any CUDA call (this machine may
    have no GPU); an empty C needs neither; a bad ldb is refused as before."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    (tmp_path / "main.cu").write_text(HOST_MAIN)
    sources = [str(GENERATED_DIR / f"{name}.cu") for name in ("epilogue_split_k", "epilogue_tma")]
    # PTX only (no ptxas): the device code is not what this test runs.
    build = subprocess.run([nvcc, "-gencode=arch=compute_90a,code=compute_90a", "-std=c++17", "-o",
                            str(tmp_path / "checks"), str(tmp_path / "main.cu"), *sources],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(tmp_path / "checks")], capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[:2] == ["1 1 1 0 1", "1 1 1 0 1"], out.stdout + out.stderr


# --- the runtime: bias= and scale= ------------------------------------------------------------------

class _Device:
    def __init__(self, index):
        self.index = index


class _Array:
    """A host numpy array shown as a device array (only its interface is read: nothing runs)."""

    def __init__(self, values, device=0, strides=None):
        self.values, self.device = values, _Device(device)
        self._strides = strides

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.values.shape, "typestr": self.values.dtype.str, "version": 3,
                "data": (self.values.__array_interface__["data"][0], False),
                "strides": self._strides or self.values.strides}


def _kernel(spec_name: str, calls: list):
    kernel = object.__new__(Kernel)  # no compile: the call's checks come before any launch
    kernel.plan = make_plan(load_one(SPECS_DIR / f"{spec_name}.gemm"))
    kernel.launch = lambda *args, **kwargs: calls.append((args, kwargs))
    return kernel


def _operands(M=5, N=7, K=3):
    return (_Array(np.zeros((M, K), np.float32)), _Array(np.zeros((K, N), np.float32)),
            _Array(np.zeros((M, N), np.float32)))


def test_a_kernel_call_passes_its_vectors_and_refuses_bad_ones_with_shape_errors():
    calls = []
    kernel = _kernel("epilogue_staged", calls)  # bias col (N = 7), scale row (M = 5); A, B, C row-major
    A, B, C = _operands()
    bias, scale = _Array(np.ones(7, np.float32)), _Array(np.ones(5, np.float32))
    kernel(A, B, C, bias=bias, scale=scale)
    (_, kwargs), = calls
    assert kwargs["bias"] == bias.__cuda_array_interface__["data"][0]
    assert kwargs["scale"] == scale.__cuda_array_interface__["data"][0]
    bad = [
        (dict(scale=scale), "built with `bias col`: pass bias=, a float32 device vector of 7 floats"),
        (dict(bias=_Array(np.ones(5, np.float32)), scale=scale), "bias must be a vector of 7 floats, one per column"),
        (dict(bias=bias, scale=_Array(np.ones(7, np.float32))), "scale must be a vector of 5 floats, one per row"),
        (dict(bias=_Array(np.ones((7, 1), np.float32)), scale=scale), "not of shape (7, 1)"),
        (dict(bias=_Array(np.ones(7, np.float64)), scale=scale), "bias must hold float32, not <f8"),
        (dict(bias=_Array(np.ones(14, np.float32)[::2], strides=(8,)), scale=scale), "bias must be contiguous"),
        (dict(bias=_Array(np.ones(7, np.float32), device=1), scale=scale), "bias is on GPU 1, but C is on GPU 0"),
        (dict(bias=np.ones(7, np.float32), scale=scale), "bias is not a device array"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ShapeError) as caught:
            kernel(A, B, C, **kwargs)
        assert message in str(caught.value), (kwargs, str(caught.value))
    assert len(calls) == 1


def test_a_vector_for_a_kernel_built_without_it_is_refused():
    calls = []
    kernel = _kernel("epilogue_naive", calls)  # bias row only
    A, B, C = _operands()
    with pytest.raises(ShapeError, match="built without a scale"):
        kernel(A, B, C, bias=_Array(np.ones(5, np.float32)), scale=_Array(np.ones(5, np.float32)))
    plain = _kernel("naive", calls)
    with pytest.raises(ShapeError, match="built without a bias"):
        plain(A, B, C, bias=_Array(np.ones(5, np.float32)))
    assert not calls


def test_the_raw_launch_refuses_a_missing_vector_before_deciding_anything():
    kernel = object.__new__(Kernel)
    kernel.plan = make_plan(load_one(SPECS_DIR / "epilogue_split_k.gemm"))
    with pytest.raises(CudaError, match=r"built with `scale col`: pass scale="):
        kernel.launch(8, 8, 8, 1.0, 16, 8, 16, 8, 0.0, 16, 8, bias=32)


# --- explain -----------------------------------------------------------------------------------------

def test_explain_shows_the_epilogue_and_the_traffic_of_c_it_saves():
    plan = make_plan(load_one(SPECS_DIR / "epilogue_wgmma_async.gemm"))  # bias col, gelu
    report = explain(plan, Resources(128, 0, 0, 0, 0))
    text = " ".join(render_text(report).split())  # wrapped at 80 columns
    assert "C = gelu(alpha * A*B + beta * C + bias[j])" in text
    # two passes (bias, gelu), each reading and writing C: 16 bytes per element of a 2048 x 5632 C
    assert "2 passes over C not run (bias, gelu)" in text and f"{16 * 2048 * 5632 / 1e6:.1f} MB at 2048x5632" in text
    assert as_dict(report)["epilogue"]["computes"] == "C = gelu(alpha * A*B + beta * C + bias[j])"
    plain = " ".join(render_text(explain(make_plan(load_one(SPECS_DIR / "naive.gemm")), Resources(32, 0, 0, 0, 0))).split())
    assert "C = alpha * A*B + beta * C" in plain and "none: no bias, scale or activation" in plain


def test_the_generated_header_says_what_the_epilogue_computes_and_takes():
    header = (GENERATED_DIR / "epilogue_tma.h").read_text()
    assert "// C = gelu(alpha * scale[i] * (A*B) + beta * C + bias[j]) for row i and column j of C" in header
    assert "// bias: a device array of N floats, bias[j] for column j of C; a null bias is" in header
    prototype = " ".join(header[header.index("int gemmgen_epilogue_tma("):].split(";")[0].split())
    assert prototype.endswith("float *C, int ldc, const float *bias, const float *scale, cudaStream_t stream)")
