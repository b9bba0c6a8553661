"""GPU tests: every shipped kernel on the device, through each of its interfaces.

Run with `pytest -m gpu` on a machine with an NVIDIA GPU, CuPy and (optionally) PyTorch, nvcc
and compute-sanitizer. Without a GPU or CuPy every test here is skipped; collecting them needs
only the CPU (specs are parsed at collection; nothing CUDA is imported).

- every concrete shipped spec, in each A/B layout (and C column-major for two), against the
  quick case matrix of gemmgen.gpu.verify; the default layouts against the full matrix (4092^3);
- the Python API on CuPy arrays, PyTorch tensors, column-major and padded arrays, and the
  ShapeErrors for arrays it cannot take;
- the C ABI of the emitted .cu, built by nvcc into a shared library and called through ctypes;
- compute-sanitizer memcheck and racecheck over every kernel;
- Kernel.launch refusing bad arguments with a CudaError, launching nothing.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from gemmgen.gpu import verify
from gemmgen.codegen.cuda import generate
from gemmgen.language.errors import SpecError
from gemmgen.plan import make_plan
from gemmgen.language.load import load

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = ROOT / "specs"
SEED = 20240917
LAYOUTS = (("row", "row"), ("row", "col"), ("col", "row"), ("col", "col"))
C_COL_KERNELS = ("warptile", "naive", "tensorcore_tf32", "hopper_tf32")
CUDA_ERROR_INVALID_VALUE = 1


def _shipped_specs():
    """(path, spec) of every concrete kernel in specs/ (search spaces are for `tune`), and the
    SpecErrors of files that do not load (one broken file must not stop the GPU run)."""
    found, broken = [], []
    for path in sorted(SPEC_DIR.glob("*.gemm")):
        try:
            specs = load(path)
        except SpecError as exc:
            broken.append(str(exc))
            continue
        found += [(path, spec) for spec in specs if spec.is_concrete]
    return found, broken


SHIPPED, BROKEN = _shipped_specs()
SPECS = {spec.name: spec for _, spec in SHIPPED}
SPEC_PATHS = {spec.name: path for path, spec in SHIPPED}


def _variant(name: str, layout_a: str | None = None, layout_b: str | None = None,
             layout_c: str | None = None, **values):
    spec = SPECS[name]
    return spec.with_values(layout_A=layout_a or spec["layout.A"],
                            layout_B=layout_b or spec["layout.B"],
                            layout_C=layout_c or spec["layout.C"], **values)


def _layouts(name: str):
    """The A/B layouts a spec can be built in: all four, except with TMA, whose copies need both
    operands K-major (A row, B col), and the decode kernel, which reads both along K too."""
    k_major = SPECS[name]["stages.fill"] == "tma" or SPECS[name]["decode.columns"]
    return (("row", "col"),) if k_major else LAYOUTS


LAYOUT_VARIANTS = [
    pytest.param(name, a, b, "row", id=f"{name}-A{a}-B{b}")
    for name in SPECS for a, b in _layouts(name)
] + [
    pytest.param(name, SPECS[name]["layout.A"], SPECS[name]["layout.B"], "col", id=f"{name}-Ccol")
    for name in C_COL_KERNELS
]


def _every_variant_tested():
    """Each spec variant a test here builds, so that they can be compiled in parallel first."""
    variants = [_variant(name, a, b, "row") for name in SPECS for a, b in _layouts(name)]
    variants += [_variant(name, layout_c="col") for name in C_COL_KERNELS]
    variants += [_variant("warptile", layout_a="col"), _variant("warptile", epilogue_beta=False)]
    variants += [_register_fed(consumers, a, b, math) for consumers in REGISTER_FED
                 for a, b in LAYOUTS for math in ("tf32", "3xtf32")]
    variants += [_via_registers(a, b, stages) for a, b in LAYOUTS for stages in VIA_STAGES]
    variants += [_unrolled(a, b, unroll) for a, b in LAYOUTS for unroll in UNROLLS]
    return variants


# `stages N async` on sm_90a: wgmma fed by loader warpgroups, with two consumer warpgroups and one
# loader (hopper_3xtf32's tile, in 3 stages: these hold A's remainders too), or one consumer and two
# loaders (the skinny-shape tile).
REGISTER_FED = {2: {"stages": 3}, 1: {"block_m": 64, "block_n": 64, "warp_n": 64, "mma_n": 64, "stages": 4}}


def _register_fed(consumers: int, a: str = "row", b: str = "row", math: str = "3xtf32"):
    return _variant("hopper_3xtf32", a, b, "row", stages_fill="async", math=math, promote=0,
                    **REGISTER_FED[consumers])


# `load X ... via registers` on hopper_simt's tiling: A and B both stored transposed (4 x 4 blocks
# transposed in registers), in a cp.async pipeline of 2 and 3 stages and through registers alone.
VIA_STAGES = ((2, "async"), (3, "async"), (2, "sync"), (1, "sync"))


def _via_registers(a: str, b: str, stages: tuple[int, str]):
    # A is stored transposed when its shared rows run along k: row-major A with transpose, or
    # column-major A without; B when its rows run along n: row-major B with transpose, or col without.
    return _variant("hopper_simt", a, b, "row", load_A_transpose=a == "row", load_B_transpose=b == "row",
                    load_A_via="registers", load_B_via="registers", load_A_vector=4, load_B_vector=4,
                    stages=stages[0], stages_fill=stages[1])


# `unroll N`: the k loop over a shared tile unrolled N steps at a time; 2 keeps hopper_simt's
# fragment double buffering on its minimum, 8 is the middle of the unrolls the search measured.
UNROLLS = (2, 8)


def _unrolled(a: str, b: str, unroll: int):
    return _variant("hopper_simt", a, b, "row", unroll=unroll)


# --- fixtures ----------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def gpu():
    """Skip the module unless CuPy imports and the driver sees a GPU."""
    pytest.importorskip("cupy")
    from gemmgen.gpu.runtime import device_count
    if device_count() == 0:
        pytest.skip("no CUDA GPU found")


@pytest.fixture(scope="module")
def cp(gpu):
    import cupy
    return cupy


@pytest.fixture(scope="module")
def problems():
    """verify.Problems (inputs and float64 references) shared by every kernel, one per case."""
    return {}


@pytest.fixture(scope="module")
def kernels(gpu):
    """kernels(spec) -> a loaded gemmgen Kernel, built once per spec variant.

    Every variant the module uses is compiled first on a thread pool (NVRTC releases the GIL);
    the compile cache then serves each Kernel, and the sanitizer's subprocesses too.
    """
    from gemmgen.gpu.compile import compile_plan
    from gemmgen.gpu.runtime import Kernel

    def compile_quietly(plan):
        try:
            compile_plan(plan)
        except Exception:  # noqa: BLE001 - the test that loads this kernel reports it
            pass

    plans = [make_plan(spec) for spec in _every_variant_tested()]
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        list(pool.map(compile_quietly, plans))

    loaded = {}

    def get(spec):
        plan = make_plan(spec)
        key = generate(plan)  # the same kernel however its settings were written
        if key not in loaded:
            loaded[key] = Kernel(plan)
        return loaded[key]

    return get


# --- helpers -----------------------------------------------------------------------------

def _failures(report, kernel) -> str:
    lines = [f"{kernel.name} [{kernel.plan.layouts()}] failed {len(report.failures)} of "
             f"{len(report.results)} cases:"]
    lines += [f"  {result.case}: {result.message}" for result in report.failures]
    return "\n".join(lines)


def _inputs(M: int, N: int, K: int, seed: int = SEED):
    """Host float32 A (M x K), B (K x N), C (M x N), uniform in [-1, 1]."""
    rng = np.random.default_rng(seed + 7919 * M + 31 * N + K)
    return tuple(rng.uniform(-1, 1, shape).astype(np.float32) for shape in ((M, K), (K, N), (M, N)))


def _tolerance(A, B, C, alpha: float, beta: float, math: str = "simt"):
    """float64 reference and per-element tolerance, exactly as gemmgen.gpu.verify computes them."""
    A64, B64 = np.asarray(A, np.float64), np.asarray(B, np.float64)
    reference = alpha * (A64 @ B64)
    scale = abs(alpha) * (np.abs(A64) @ np.abs(B64))
    if beta != 0.0:
        C64 = np.asarray(C, np.float64)
        reference += beta * C64
        scale += abs(beta) * np.abs(C64)
    K = A64.shape[1]
    return reference, verify.tolerance(scale, K, math)


def _assert_product(out, A, B, C, alpha: float, beta: float, what: str, math: str = "simt") -> None:
    """out == alpha * A @ B + beta * C within verify's tolerance; NaN never passes."""
    out = np.asarray(out, np.float64)
    reference, tolerance = _tolerance(A, B, C, alpha, beta, math)
    assert out.shape == reference.shape, f"{what}: shape {out.shape}, expected {reference.shape}"
    error = np.abs(out - reference)
    bad = ~(error <= tolerance)
    if bad.any():
        ratio = np.where(np.isnan(error), np.inf, error / tolerance)
        i, j = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        pytest.fail(f"{what}: {int(bad.sum())} of {bad.size} element(s) wrong; worst C[{i}, {j}] = "
                    f"{out[i, j]!r}, expected {reference[i, j]!r} (error {error[i, j]:.3g} > "
                    f"tolerance {tolerance[i, j]:.3g})")


def _same_bits(cp, a, b) -> bool:
    return bool(cp.all(a.view(cp.uint32) == b.view(cp.uint32)))


def _sync(cp) -> None:
    cp.cuda.runtime.deviceSynchronize()


# --- a. every shipped spec in every layout, quick case matrix -----------------------------

def test_every_shipped_spec_loads():
    assert not BROKEN, "\n\n".join(BROKEN)


@pytest.mark.parametrize("name,layout_a,layout_b,layout_c", LAYOUT_VARIANTS)
def test_every_layout_of_every_shipped_spec_passes_the_quick_cases(
        name, layout_a, layout_b, layout_c, kernels, problems):
    kernel = kernels(_variant(name, layout_a, layout_b, layout_c))
    report = verify.check(kernel, verify.QUICK_CASES, seed=SEED, problems=problems)
    assert report.ok, _failures(report, kernel)


# --- b. default layout of every shipped spec, full case matrix (4092^3 included) ------------

@pytest.mark.parametrize("name", list(SPECS))
def test_default_layout_of_every_shipped_spec_passes_the_full_case_matrix(name, kernels, problems):
    kernel = kernels(SPECS[name])
    report = verify.check(kernel, verify.DEFAULT_CASES, seed=SEED, problems=problems)
    assert report.ok, _failures(report, kernel)


# --- c. the Python API ------------------------------------------------------------------------

API_SHAPES = [pytest.param(127, 131, 137, id="127x131x137"),   # no multiple of anything: scalar path
              pytest.param(256, 256, 256, id="256x256x256")]   # aligned: vector path


@pytest.mark.parametrize("M,N,K", API_SHAPES)
def test_call_on_cupy_arrays_matches_float64(M, N, K, cp, kernels):
    kernel = kernels(SPECS["warptile"])
    A, B, C = _inputs(M, N, K)
    a, b, c = cp.asarray(A), cp.asarray(B), cp.asarray(C)
    kernel(a, b, c, alpha=1.5, beta=-0.5)
    _sync(cp)
    _assert_product(cp.asnumpy(c), A, B, C, 1.5, -0.5, f"{kernel.name} on CuPy arrays")

    # beta = 0 must write every element: start from NaN
    c = cp.full((M, N), cp.nan, dtype=cp.float32)
    kernel(a, b, c, alpha=0.75)
    _sync(cp)
    _assert_product(cp.asnumpy(c), A, B, None, 0.75, 0.0, f"{kernel.name} on CuPy arrays, beta 0")


@pytest.mark.parametrize("M,N,K", API_SHAPES)
def test_call_on_torch_tensors_on_a_torch_stream_matches_float64(M, N, K, kernels):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device")
    kernel = kernels(SPECS["warptile"])
    A, B, C = _inputs(M, N, K)
    a, b, c = (torch.from_numpy(x).cuda() for x in (A, B, C))
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    kernel(a, b, c, alpha=0.5, beta=2.0, stream=stream)
    stream.synchronize()
    _assert_product(c.cpu().numpy(), A, B, C, 0.5, 2.0, f"{kernel.name} on PyTorch tensors")


def test_call_on_a_dlpack_only_array(cp, kernels):
    """An array that speaks only DLPack (no __cuda_array_interface__) is read through CuPy."""

    class DLPackOnly:
        def __init__(self, array):
            self._array = array

        def __dlpack__(self, *args, **kwargs):
            return self._array.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return self._array.__dlpack_device__()

    kernel = kernels(SPECS["warptile"])
    A, B, C = _inputs(64, 96, 80)
    a, b, c = cp.asarray(A), cp.asarray(B), cp.asarray(C)
    kernel(DLPackOnly(a), DLPackOnly(b), DLPackOnly(c), alpha=1.0, beta=1.0)
    _sync(cp)
    _assert_product(cp.asnumpy(c), A, B, C, 1.0, 1.0, f"{kernel.name} on DLPack-only arrays")


@pytest.mark.parametrize("M,N,K", API_SHAPES)
def test_call_on_a_column_major_array_for_a_layout_col_kernel(M, N, K, cp, kernels):
    kernel = kernels(_variant("warptile", layout_a="col"))
    A, B, C = _inputs(M, N, K)
    a = cp.asfortranarray(cp.asarray(A))
    assert a.flags.f_contiguous and not a.flags.c_contiguous
    b, c = cp.asarray(B), cp.asarray(C)
    kernel(a, b, c, alpha=-1.0, beta=0.5)
    _sync(cp)
    _assert_product(cp.asnumpy(c), A, B, C, -1.0, 0.5, f"{kernel.name} [{kernel.plan.layouts()}]")


@pytest.mark.parametrize("M,N,K", API_SHAPES)
def test_call_on_slices_of_wider_arrays_takes_leading_dimensions_from_strides(M, N, K, cp, kernels):
    from gemmgen.gpu.runtime import as_matrix

    kernel = kernels(SPECS["warptile"])
    A, B, C = _inputs(M, N, K)
    pad_a, pad_b, pad_c = 5, 3, 7
    wide_a = cp.zeros((M, K + pad_a), cp.float32)
    wide_b = cp.zeros((K, N + pad_b), cp.float32)
    wide_c = cp.full((M, N + pad_c), 12345.0, cp.float32)   # the padding must stay as it is
    wide_a[:, :K], wide_b[:, :N], wide_c[:, :N] = cp.asarray(A), cp.asarray(B), cp.asarray(C)
    a, b, c = wide_a[:, :K], wide_b[:, :N], wide_c[:, :N]
    assert as_matrix(a, "A", "row").ld == K + pad_a
    assert as_matrix(c, "C", "row").ld == N + pad_c
    kernel(a, b, c, alpha=1.25, beta=-1.0)
    _sync(cp)
    out = cp.asnumpy(wide_c)
    _assert_product(out[:, :N], A, B, C, 1.25, -1.0, f"{kernel.name} on padded slices")
    assert np.all(out[:, N:] == 12345.0), "the kernel wrote into C's padding columns"


def _assert_rejected(cp, kernel, a, b, c, match: str) -> None:
    from gemmgen.gpu.runtime import ShapeError

    before = c.copy()
    with pytest.raises(ShapeError, match=match):
        kernel(a, b, c, alpha=1.0, beta=0.5)
    _sync(cp)
    assert _same_bits(cp, c, before), "a rejected call wrote into C"


def test_rejects_float64_arrays(cp, kernels):
    kernel = kernels(SPECS["warptile"])
    a = cp.zeros((32, 16), cp.float64)
    _assert_rejected(cp, kernel, a, cp.zeros((16, 8), cp.float32), cp.ones((32, 8), cp.float32),
                     "A must hold float32")


def test_rejects_a_batch_without_a_c_for_each_and_four_dimensional_arrays(cp, kernels):
    kernel = kernels(SPECS["warptile"])
    b = cp.zeros((2, 16, 8), cp.float32)  # two batches of B, one C: each batch needs its own C
    _assert_rejected(cp, kernel, cp.zeros((32, 16), cp.float32), b, cp.ones((32, 8), cp.float32),
                     r"C must hold all 2 batches")
    _assert_rejected(cp, kernel, cp.zeros((32, 16), cp.float32), cp.zeros((1, 2, 16, 8), cp.float32),
                     cp.ones((32, 8), cp.float32), r"B must be a matrix \(2-D\) or a batch of matrices \(3-D")


def test_rejects_mismatched_inner_sizes(cp, kernels):
    kernel = kernels(SPECS["warptile"])
    _assert_rejected(cp, kernel, cp.zeros((32, 16), cp.float32), cp.zeros((17, 8), cp.float32),
                     cp.ones((32, 8), cp.float32), "inner sizes differ")


def test_rejects_a_C_of_the_wrong_shape(cp, kernels):
    kernel = kernels(SPECS["warptile"])
    _assert_rejected(cp, kernel, cp.zeros((32, 16), cp.float32), cp.zeros((16, 8), cp.float32),
                     cp.ones((8, 32), cp.float32), "C must be 32 x 8")


def test_rejects_an_array_whose_layout_is_not_the_specs(cp, kernels):
    col_a = kernels(_variant("warptile", layout_a="col"))
    row_major = cp.zeros((32, 16), cp.float32)
    _assert_rejected(cp, col_a, row_major, cp.zeros((16, 8), cp.float32),
                     cp.ones((32, 8), cp.float32), "is not col-major")
    row_a = kernels(SPECS["warptile"])
    column_major = cp.asfortranarray(cp.zeros((32, 16), cp.float32))
    _assert_rejected(cp, row_a, column_major, cp.zeros((16, 8), cp.float32),
                     cp.ones((32, 8), cp.float32), "is not row-major")


def test_rejects_host_arrays(cp, kernels):
    kernel = kernels(SPECS["warptile"])
    c = cp.ones((32, 8), cp.float32)
    host = np.zeros((32, 16), np.float32)
    _assert_rejected(cp, kernel, host, cp.zeros((16, 8), cp.float32), c, "A is not a device array")
    try:
        import torch
    except ImportError:
        return
    _assert_rejected(cp, kernel, cp.zeros((32, 16), cp.float32), torch.zeros(16, 8), c,
                     "B is not a device array")


# --- d. the C ABI of the emitted .cu, built by nvcc -------------------------------------------

def _cuda_library_dirs(nvcc: str) -> list[str]:
    """Folders holding libcudart next to this nvcc, for the library's run path."""
    roots = [Path(nvcc).resolve().parent.parent]
    if os.environ.get("CUDA_HOME"):
        roots.append(Path(os.environ["CUDA_HOME"]))
    found = []
    for root in roots:
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            folder = root / sub
            if any(folder.glob("libcudart.so*")) and str(folder) not in found:
                found.append(str(folder))
    return found


@pytest.fixture(scope="module")
def abi(tmp_path_factory, gpu):
    """abi(name) -> (plan, ctypes function): the spec's .cu built as a shared library by nvcc."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    from gemmgen.gpu.runtime import device_info
    arch = device_info().target  # sm_90 on an H100
    built = {}

    def build(name: str):
        if name in built:
            return built[name]
        plan = make_plan(SPECS[name])
        folder = tmp_path_factory.mktemp(f"abi-{name}")
        source = folder / f"{name}.cu"
        source.write_text(generate(plan))
        library = folder / f"lib{name}.so"
        target = plan.arch.name if plan.arch.name == "sm_90a" else arch  # wgmma needs sm_90a itself
        gencode = f"-gencode=arch=compute_{target[3:]},code={target}"
        command = [nvcc, "-shared", "-Xcompiler", "-fPIC", gencode, "-std=c++17",
                   "-o", str(library), str(source), "-lcudart"]
        for folder_path in _cuda_library_dirs(nvcc):
            command += ["-Xlinker", f"-rpath={folder_path}"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"nvcc failed:\n{' '.join(command)}\n{done.stdout}\n{done.stderr}"
        function = getattr(ctypes.CDLL(str(library)), plan.launcher_name)
        function.restype = ctypes.c_int
        function.argtypes = ([ctypes.c_int] * 3 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
                                                   ctypes.c_void_p, ctypes.c_int, ctypes.c_float,
                                                   ctypes.c_void_p, ctypes.c_int]
                             + [ctypes.c_void_p] * (3 if plan.reduce_count else 0)
                             + [ctypes.c_void_p])  # cudaStream_t
        built[name] = (plan, function)
        return built[name]

    return build


def _abi_call(function, plan, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, smallest=None) -> int:
    extra = list(smallest) if plan.reduce_count else []
    return function(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, *extra, None)  # stream 0


def _smallest_buffers(cp, count: int):
    return (cp.full(count, cp.nan, cp.float32), cp.full(count, -7, cp.int32),
            cp.full(count, -7, cp.int32))


def _assert_smallest(out, buffers, count: int, what: str) -> None:
    """The reduction's outputs are the `count` smallest entries of `out`, ties by position."""
    flat = out.ravel()
    order = np.lexsort((np.arange(flat.size), flat))[:count]
    values, rows, cols = (np.asarray(x.get()) for x in buffers)
    for r, position in enumerate(order):
        i, j = divmod(int(position), out.shape[1])
        assert (int(rows[r]), int(cols[r])) == (i, j) and values[r] == flat[position], (
            f"{what}: smallest entry #{r + 1} is C[{rows[r]}, {cols[r]}] = {values[r]!r}, expected "
            f"C[{i}, {j}] = {flat[position]!r}")


ABI_SHAPES = [pytest.param(127, 131, 137, id="127x131x137"),
              pytest.param(256, 256, 256, id="256x256x256")]


@pytest.mark.parametrize("M,N,K", ABI_SHAPES)
@pytest.mark.parametrize("name", ["warptile", "smallest"])
def test_c_abi_computes_what_the_runtime_computes(name, M, N, K, cp, abi, kernels):
    plan, function = abi(name)
    assert plan.layouts() == "A row, B row, C row"
    alpha, beta = 1.25, -0.5
    A, B, C = _inputs(M, N, K)
    a, b = cp.asarray(A), cp.asarray(B)
    c_abi, c_runtime = cp.asarray(C), cp.asarray(C)
    found_abi = _smallest_buffers(cp, plan.reduce_count) if plan.reduce_count else None
    found_runtime = _smallest_buffers(cp, plan.reduce_count) if plan.reduce_count else None

    status = _abi_call(function, plan, M, N, K, alpha, a.data.ptr, K, b.data.ptr, N, beta,
                       c_abi.data.ptr, N, smallest=[x.data.ptr for x in found_abi] if found_abi else None)
    _sync(cp)
    assert status == 0, f"{plan.launcher_name} returned cudaError {status}"
    kernels(SPECS[name])(a, b, c_runtime, alpha=alpha, beta=beta, smallest=found_runtime)
    _sync(cp)

    out_abi, out_runtime = cp.asnumpy(c_abi), cp.asnumpy(c_runtime)
    _assert_product(out_abi, A, B, C, alpha, beta, f"{plan.launcher_name} through the C ABI")
    _assert_product(out_runtime, A, B, C, alpha, beta, f"{plan.launcher_name} through the runtime")
    # Same source, compiled by nvcc and by NVRTC: equal up to the compilers' choices.
    _, tolerance = _tolerance(A, B, C, alpha, beta)
    gap = np.abs(out_abi.astype(np.float64) - out_runtime)
    assert np.all(gap <= tolerance), (
        f"C ABI and runtime differ by up to {gap.max():.3g} (tolerance {tolerance.min():.3g} and up)")
    if plan.reduce_count:
        _assert_smallest(out_abi, found_abi, plan.reduce_count, f"{plan.launcher_name} (C ABI)")
        _assert_smallest(out_runtime, found_runtime, plan.reduce_count,
                         f"{plan.launcher_name} (runtime)")


@pytest.mark.parametrize("name", ["warptile", "smallest"])
def test_c_abi_return_codes_and_nothing_written_on_error(name, cp, abi):
    plan, function = abi(name)
    M, N, K = 127, 131, 137
    A, B, C = _inputs(M, N, K)
    a, b, c = cp.asarray(A), cp.asarray(B), cp.asarray(C)
    before = c.copy()
    found = _smallest_buffers(cp, plan.reduce_count) if plan.reduce_count else None
    outputs = [x.data.ptr for x in found] if found else None
    pa, pb, pc = a.data.ptr, b.data.ptr, c.data.ptr

    def call(*arguments, smallest=outputs):
        return _abi_call(function, plan, *arguments, smallest=smallest)

    invalid = {
        "negative M": (-1, N, K, 1.0, pa, K, pb, N, 0.5, pc, N),
        "negative K": (M, N, -3, 1.0, pa, K, pb, N, 0.5, pc, N),
        "lda below K": (M, N, K, 1.0, pa, K - 1, pb, N, 0.5, pc, N),
        "ldb below N": (M, N, K, 1.0, pa, K, pb, N - 1, 0.5, pc, N),
        "ldc below N": (M, N, K, 1.0, pa, K, pb, N, 0.5, pc, N - 1),
        "null C": (M, N, K, 1.0, pa, K, pb, N, 0.5, None, N),
        "null A with K > 0": (M, N, K, 1.0, None, K, pb, N, 0.5, pc, N),
    }
    for what, arguments in invalid.items():
        status = call(*arguments)
        assert status == CUDA_ERROR_INVALID_VALUE, f"{what}: returned {status}, expected 1"
    if plan.reduce_count:
        status = call(M, N, K, 1.0, pa, K, pb, N, 0.5, pc, N, smallest=[outputs[0], None, outputs[2]])
        assert status == CUDA_ERROR_INVALID_VALUE, f"null smallest_rows: returned {status}, expected 1"
    _sync(cp)
    assert _same_bits(cp, c, before), "a call that returned cudaErrorInvalidValue wrote into C"

    for what, arguments in {"M = 0": (0, N, K, 1.0, pa, K, pb, N, 0.5, pc, N),
                            "N = 0": (M, 0, K, 1.0, pa, K, pb, 1, 0.5, pc, 1)}.items():
        assert call(*arguments) == 0, what
    _sync(cp)
    assert _same_bits(cp, c, before), "an empty product wrote into C"

    # K = 0 is C = beta * C; A and B may then be null.
    assert call(M, N, 0, 1.0, None, 1, None, N, 0.5, pc, N) == 0
    _sync(cp)
    out = cp.asnumpy(c)
    _assert_product(out, np.zeros((M, 0), np.float32), np.zeros((0, N), np.float32), C, 1.0, 0.5,
                    f"{plan.launcher_name} with K = 0")
    if plan.reduce_count:
        _assert_smallest(out, found, plan.reduce_count, f"{plan.launcher_name} with K = 0")


@pytest.mark.parametrize("name", ["warptile", "smallest"])
def test_c_abi_takes_a_misaligned_pointer(name, cp, abi):
    """A + 1 element: no 16-byte loads of A are possible, so the launcher takes the scalar path."""
    plan, function = abi(name)
    M = N = K = 256
    A, B, C = _inputs(M, N, K)
    shifted = cp.zeros(M * K + 1, cp.float32)
    shifted[1:] = cp.asarray(A).ravel()
    b, c = cp.asarray(B), cp.asarray(C)
    found = _smallest_buffers(cp, plan.reduce_count) if plan.reduce_count else None
    status = _abi_call(function, plan, M, N, K, 0.5, shifted.data.ptr + 4, K, b.data.ptr, N, 1.5,
                       c.data.ptr, N, smallest=[x.data.ptr for x in found] if found else None)
    _sync(cp)
    assert status == 0, f"{plan.launcher_name} returned cudaError {status}"
    out = cp.asnumpy(c)
    _assert_product(out, A, B, C, 0.5, 1.5, f"{plan.launcher_name} with A + 1 element")
    if plan.reduce_count:
        _assert_smallest(out, found, plan.reduce_count, f"{plan.launcher_name} with A + 1 element")


def test_c_abi_smallest_of_an_empty_product(cp, abi):
    """M = 0 succeeds, and the reduction reports no entries (row and column -1)."""
    plan, function = abi("smallest")
    found = _smallest_buffers(cp, plan.reduce_count)
    a, b, c = cp.zeros((1, 8), cp.float32), cp.zeros((8, 8), cp.float32), cp.zeros((1, 8), cp.float32)
    status = _abi_call(function, plan, 0, 8, 8, 1.0, a.data.ptr, 8, b.data.ptr, 8, 0.0, c.data.ptr, 8,
                       smallest=[x.data.ptr for x in found])
    _sync(cp)
    assert status == 0
    assert np.all(found[1].get() == -1) and np.all(found[2].get() == -1)


# --- d2. tensor cores: the wgmma kernels' TMA path and fallback, accuracy of the math modes -------

@pytest.mark.parametrize("name", ["hopper_tf32", "hopper_3xtf32"])
def test_wgmma_c_abi_takes_tma_when_aligned_and_the_fallback_otherwise(name, cp, abi):
    plan, function = abi(name)
    assert plan.path == "wgmma" and plan.layouts() == "A row, B col, C row"
    M, N, K = 300, 260, 200  # no multiple of a tile; K a multiple of 4 floats: TMA can describe it
    A, B, C = _inputs(M, N, K)
    b = cp.asarray(np.ascontiguousarray(B.T))  # column-major B: N rows of K
    for lda, path in ((K, "TMA"), (K + 1, "fallback (lda not a multiple of 4)")):
        a = cp.zeros((M, lda), cp.float32)
        a[:, :K] = cp.asarray(A)
        c = cp.asarray(C)
        status = _abi_call(function, plan, M, N, K, 0.75, a.data.ptr, lda, b.data.ptr, K, -0.5,
                           c.data.ptr, N)
        _sync(cp)
        assert status == 0, f"{plan.launcher_name} ({path}) returned cudaError {status}"
        _assert_product(cp.asnumpy(c), A, B, C, 0.75, -0.5, f"{plan.launcher_name}, {path}", plan.math)


@pytest.mark.parametrize("a,b", LAYOUTS, ids=[f"A{a}-B{b}" for a, b in LAYOUTS])
@pytest.mark.parametrize("math", ["tf32", "3xtf32"])
@pytest.mark.parametrize("consumers", sorted(REGISTER_FED))
def test_wgmma_fed_through_registers_passes_the_quick_cases_in_every_layout(consumers, math, a, b, kernels,
                                                                            problems):
    kernel = kernels(_register_fed(consumers, a, b, math))
    assert kernel.plan.path == "wgmma_async" and kernel.plan.consumers == consumers
    report = verify.check(kernel, verify.QUICK_CASES, seed=SEED, problems=problems)
    assert report.ok, _failures(report, kernel)


@pytest.mark.parametrize("stages", VIA_STAGES, ids=[f"{n}{fill}" for n, fill in VIA_STAGES])
@pytest.mark.parametrize("a,b", LAYOUTS, ids=[f"A{a}-B{b}" for a, b in LAYOUTS])
def test_operands_transposed_in_registers_pass_the_quick_cases_in_every_layout(a, b, stages, kernels,
                                                                              problems):
    kernel = kernels(_via_registers(a, b, stages))
    assert kernel.plan.a.blocked and kernel.plan.b.blocked
    report = verify.check(kernel, verify.QUICK_CASES, seed=SEED, problems=problems)
    assert report.ok, _failures(report, kernel)


@pytest.mark.parametrize("unroll", UNROLLS)
@pytest.mark.parametrize("a,b", LAYOUTS, ids=[f"A{a}-B{b}" for a, b in LAYOUTS])
def test_a_partly_unrolled_k_loop_passes_the_quick_cases_in_every_layout(a, b, unroll, kernels, problems):
    kernel = kernels(_unrolled(a, b, unroll))
    assert kernel.plan.unroll == unroll < kernel.plan.BK
    report = verify.check(kernel, verify.QUICK_CASES, seed=SEED, problems=problems)
    assert report.ok, _failures(report, kernel)


@pytest.mark.parametrize("name", ["tensorcore_3xtf32", "hopper_3xtf32", "register-fed wgmma"])
def test_3xtf32_is_as_accurate_as_cublas_fp32(name, kernels):
    spec = _register_fed(1) if name == "register-fed wgmma" else SPECS[name]
    accuracy = verify.measure_accuracy(kernels(spec), verify.Case(2048, 2048, 4096), seed=SEED)
    assert accuracy.rel_error <= accuracy.cublas_fp32_rel_error, accuracy.as_dict()


@pytest.mark.parametrize("name", ["tensorcore_tf32", "hopper_tf32"])
def test_tf32_has_tf32_error_like_cublas_tf32(name, kernels):
    """TF32 keeps 10 mantissa bits: errors near 1e-4 of the result, as cuBLAS's TF32 mode gives
    (an FP32-sized error would mean the tensor cores were not used)."""
    accuracy = verify.measure_accuracy(kernels(SPECS[name]), verify.Case(1024, 1024, 2048), seed=SEED)
    assert 1e-5 < accuracy.rel_error < 4 * accuracy.cublas_tf32_rel_error, accuracy.as_dict()


# --- e. compute-sanitizer -----------------------------------------------------------------------

SANITIZER_DRIVER = r'''
"""Launch each named gemmgen kernel at a few small shapes; check each result on the host.

Usage: python driver.py REPO SPEC_PATH:NAME ...  Buffers end exactly at each matrix's last
element and CuPy's pool is off, so that memcheck sees every access outside a matrix.
"""
import math
import sys

sys.path.insert(0, sys.argv[1])
import numpy as np
import cupy as cp

cp.cuda.set_allocator(None)  # one cudaMalloc per array: exact bounds for memcheck

from gemmgen.gpu import verify
from gemmgen.gpu.epilogue_inputs import epilogue_reference, epilogue_vectors, vector_pointers
from gemmgen.plan import make_plan
from gemmgen.gpu.runtime import Kernel, synchronize
from gemmgen.language.load import load

CASES = (verify.Case(37, 45, 29, beta=0.5, pad=1),      # odd: scalar path, partial tiles
         verify.Case(64, 64, 64),                        # aligned: vector path
         verify.Case(96, 160, 40, alpha=-1.5, beta=0.5, pad=4))  # aligned, padded, several blocks


def place(values, layout, pad):
    rows, cols = values.shape
    lines, length = (rows, cols) if layout == "row" else (cols, rows)
    ld = max(1, length) + pad
    full = np.zeros((max(lines, 1), ld), np.float32)
    full[:lines, :length] = values if layout == "row" else values.T
    return full.ravel()[: (lines - 1) * ld + length].copy(), ld


def read(flat, rows, cols, layout, ld):
    lines, length = (rows, cols) if layout == "row" else (cols, rows)
    full = np.zeros(lines * ld, np.float32)
    full[: flat.size] = flat
    body = full.reshape(lines, ld)[:, :length]
    return body if layout == "row" else body.T


failed = 0
rng = np.random.default_rng(5)
for item in sys.argv[2:]:
    path, name = item.rsplit(":", 1)
    spec = next(s for s in load(path) if s.name == name)
    plan = make_plan(spec)
    kernel = Kernel(plan)
    layout = {x: spec["layout." + x] for x in "ABC"}
    for case in CASES:
        M, N, K = case.M, case.N, case.K
        A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
        B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
        C = rng.uniform(-1, 1, (M, N)).astype(np.float32) if case.beta else np.full((M, N), np.nan, np.float32)
        (a, lda), (b, ldb), (c, ldc) = (place(v, layout[x], case.pad) for v, x in ((A, "A"), (B, "B"), (C, "C")))
        a, b, c = cp.asarray(a), cp.asarray(b), cp.asarray(c)
        found = None
        if plan.reduce_count:
            found = tuple(cp.zeros(plan.reduce_count, t) for t in (cp.float32, cp.int32, cp.int32))
        vectors = epilogue_vectors(cp, plan, M, N)  # a fused epilogue's bias and scale, exactly sized
        try:
            kernel.launch(M, N, K, case.alpha, a.data.ptr, lda, b.data.ptr, ldb, case.beta, c.data.ptr,
                          ldc, smallest=tuple(x.data.ptr for x in found) if found else None,
                          **vector_pointers(vectors))
            synchronize()
        except Exception as exc:
            print(f"FAIL {name} {case}: {type(exc).__name__}: {exc}", flush=True)
            sys.exit(1)  # a fault leaves the context unusable
        out = read(cp.asnumpy(c), M, N, layout["C"], ldc).astype(np.float64)
        reference, scale = (cp.asnumpy(x) for x in epilogue_reference(
            cp, plan, cp.asarray(A), cp.asarray(B), cp.asarray(C), case.alpha, case.beta, vectors))
        tolerance = verify.tolerance(scale, K, spec["math"])
        bad = ~(np.abs(out - reference) <= tolerance)
        if bad.any():
            failed += 1
            print(f"FAIL {name} {case}: {int(bad.sum())} wrong element(s)", flush=True)
        else:
            print(f"ok {name} {case}", flush=True)
sys.exit(1 if failed else 0)
'''


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer_finds_nothing_in_any_shipped_kernel(tool, tmp_path, kernels):
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        pytest.skip("compute-sanitizer is not on PATH")
    # (the kernels fixture has compiled every kernel into the cache the driver reads)
    driver = tmp_path / "sanitize_driver.py"
    driver.write_text(SANITIZER_DRIVER)
    targets = [f"{SPEC_PATHS[name]}:{name}" for name in SPECS]
    # --report-api-errors no: cuda-python probes driver entry points with cuGetProcAddress, and
    # those expected failures would count as errors; a real API failure raises in the driver.
    command = [sanitizer, "--tool", tool, "--error-exitcode", "9", "--report-api-errors", "no",
               "--print-limit", "50", sys.executable, str(driver), str(ROOT), *targets]
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    environment["PYTHONUNBUFFERED"] = "1"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=480, env=environment)
    except subprocess.TimeoutExpired as exc:
        tail = ((exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes)
                else exc.stdout or "")[-4000:]
        pytest.fail(f"compute-sanitizer --tool {tool} ran past 480 s:\n{tail}")
    output = done.stdout + done.stderr
    tail = output[-8000:]
    assert done.returncode == 0, f"compute-sanitizer --tool {tool} exited {done.returncode}:\n{tail}"
    if tool == "memcheck":
        assert "ERROR SUMMARY: 0 errors" in output, tail
    else:
        assert re.search(r"RACECHECK SUMMARY: 0 hazards|\(0 errors|ERROR SUMMARY: 0 errors", output), tail
    missing = [name for name in SPECS if f"ok {name} " not in output]
    assert not missing, f"the driver did not check {missing} under {tool}:\n{tail}"


# --- f. a launch with invalid arguments raises and launches nothing -----------------------------

def test_launch_with_invalid_arguments_raises_a_cuda_error_naming_the_kernel(cp, kernels):
    from gemmgen.gpu.runtime import CudaError, synchronize

    kernel = kernels(SPECS["warptile"])
    M, N, K = 64, 64, 64
    A, B, C = _inputs(M, N, K)
    a, b, c = cp.asarray(A), cp.asarray(B), cp.asarray(C)
    before = c.copy()
    good = dict(M=M, N=N, K=K, alpha=1.0, A=a.data.ptr, lda=K, B=b.data.ptr, ldb=N, beta=0.5,
                C=c.data.ptr, ldc=N)
    invalid = {
        "negative M": dict(M=-1),
        "negative K": dict(K=-5),
        "lda below K": dict(lda=K - 1),
        "ldb below N": dict(ldb=N - 1),
        "ldc below N": dict(ldc=0),
        "null C": dict(C=0),
        "null A": dict(A=0),
        "null B": dict(B=0),
    }
    for what, change in invalid.items():
        with pytest.raises(CudaError) as raised:
            kernel.launch(**{**good, **change})
        assert kernel.name in str(raised.value), f"{what}: {raised.value}"
        assert raised.value.code == CUDA_ERROR_INVALID_VALUE, what
    synchronize()
    assert _same_bits(cp, c, before), "a refused launch wrote into C"

    # The process is unharmed: the next good launch works.
    kernel.launch(**good)
    synchronize()
    _assert_product(cp.asnumpy(c), A, B, C, 1.0, 0.5, f"{kernel.name} after refused launches")


def test_launch_refuses_beta_for_an_alpha_only_kernel_and_a_reduction_without_outputs(cp, kernels):
    from gemmgen.gpu.runtime import CudaError, synchronize

    M = N = K = 32
    A, B, C = _inputs(M, N, K)
    a, b, c = cp.asarray(A), cp.asarray(B), cp.asarray(C)
    before = c.copy()
    arguments = (M, N, K, 1.0, a.data.ptr, K, b.data.ptr, N, 0.5, c.data.ptr, N)

    alpha_only = kernels(_variant("warptile", epilogue_beta=False))
    with pytest.raises(CudaError, match=alpha_only.name):
        alpha_only.launch(*arguments)
    smallest = kernels(SPECS["smallest"])
    with pytest.raises(CudaError, match=smallest.name):
        smallest.launch(*arguments)
    synchronize()
    assert _same_bits(cp, c, before), "a refused launch wrote into C"
