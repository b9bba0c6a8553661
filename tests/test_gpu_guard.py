"""GPU tests: no shipped kernel, library member or library entry point writes outside C (issue 25).

Every target of guard_cases (each concrete kernel of specs/, each member of generated/fp32.json and
tf32.json, and each library's own entry point) is called both ways users call it:
- runtime: the Python runtime on raw device pointers (gemmgen.gpu.runtime.Kernel.launch; an entry point
  through gemmgen.library.dispatch's LibraryRuntime.launch, which chooses the member as gemmgen.matmul does);
- abi: the emitted C ABI. The shipped generated/<name>.cu (a library's generated/<precision>.cu) is
  built by nvcc into a shared library, once per session, and called through ctypes on stream 0; a
  member's launcher, static in its library's .cu, through a few lines that include that .cu.
A, B and C are views into wider buffers filled with verify.GUARD_BITS. After each call every guard
cell of C (before it, between its width and ldc, past its end) and every float of A's and B's buffers
must hold the bits it held before, and C must match the float64 product within verify's tolerance for
the target's math mode (beta = 0: C starts as NaN, so every element must be written).

Items: per target and path, one per held-out call of issue 25, and one for the remainder sweep of
guard_cases (its failure lists the calls that failed). Skipped without a GPU or CuPy; a target this
GPU cannot run is skipped, and so are the abi items where nvcc is missing.

    python -m pytest -q -m gpu tests/test_gpu_guard.py
    GEMMGEN_GPU_PARTS=tests GEMMGEN_GPU_TESTS=tests/test_gpu_guard.py .ci/gpu   # a bare GPU machine
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import guard_cases
import hopper_gpu
from gemmgen.gpu import verify
from gemmgen.gpu.epilogue_inputs import epilogue_reference, epilogue_vectors, vector_pointers
from gemmgen.gpu.runtime import synchronize

pytestmark = pytest.mark.gpu

TARGETS = {target.name: target for target in guard_cases.targets()}
PATHS = ("runtime", "abi")
HELD_OUT = [pytest.param(name, path, case, id=f"{name}-{path}-{case.id}")
            for name, target in TARGETS.items() for path in PATHS for case in guard_cases.held_out(target)]
SWEEPS = [pytest.param(name, path, id=f"{name}-{path}") for name in TARGETS for path in PATHS]
ABI = [ctypes.c_int] * 3 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                            ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
SHOWN = 12          # failing calls a sweep's failure lists
PROBLEMS_KEPT = 512  # inputs and references kept for reuse (both paths, targets of one tile)

# A member's launcher is static in its library's .cu: this exports it by index.
MEMBER_HARNESS = """// The members of library {library}, callable by index (their launchers are static in {library}.cu).
#include "{source}"

extern "C" int gemmgen_guard_member(int member, int M, int N, int K, float alpha, const float* A, int lda,
        const float* B, int ldb, float beta, float* C, int ldc, cudaStream_t stream) {{
    switch (member) {{
{cases}
    }}
    return cudaErrorInvalidValue;
}}
"""


# --- fixtures -----------------------------------------------------------------------------------

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
def capability(gpu) -> tuple[int, int]:
    from gemmgen.gpu.runtime import device_info
    return device_info().compute_capability


def _selected(request) -> dict[str, set[str]]:
    """The targets of each path among the items this session runs (what to compile)."""
    chosen: dict[str, set[str]] = {path: set() for path in PATHS}
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and getattr(item, "module", None) is request.module:
            chosen[callspec.params["path"]].add(callspec.params["name"])
    return chosen


class Builds:
    """The nvcc-built shared libraries, by content: each target's .so is built once per session in a
    thread of its own (nvcc runs as a subprocess), all at once; abi(target) waits for its own."""

    def __init__(self, nvcc: str | None, folder: Path, capability: tuple[int, int]):
        self.nvcc, self.folder, self.capability = nvcc, folder, capability
        self.pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 4)
        self.futures: dict[str, object] = {}
        self.libraries: dict[Path, ctypes.CDLL] = {}
        self.version = (subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
                        if nvcc else "")

    def _job(self, target) -> tuple[str, str, str, list[str]]:
        """(key, file name, source text, -gencode targets) of the .so a target is called through."""
        device = f"sm_{self.capability[0]}{self.capability[1]}"
        if target.kind == "kernel":
            arch = target.plan.arch.name
            return (target.name, target.name, target.source.read_text(),
                    [arch if arch.endswith("a") else device])
        # A library: the sm_90a members, and the portable one for a GPU it was not tuned for.
        cases = "\n".join(f"    case {i}: return gemmgen_{name}(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream);"
                          for i, name in enumerate(target.members))
        text = MEMBER_HARNESS.format(library=target.library, source=target.source, cases=cases)
        return (target.library, f"{target.library}_harness", text,
                ["sm_90a"] + ([] if self.capability == (9, 0) else [device]))

    def start(self, target) -> None:
        key, *_ = job = self._job(target)
        if key not in self.futures:
            self.futures[key] = self.pool.submit(self._build, *job)

    def _build(self, key: str, name: str, text: str, gencodes: list[str]) -> Path:
        from test_gpu import _cuda_library_dirs
        options = ["-shared", "-Xcompiler", "-fPIC", "-std=c++17"]
        options += [f"-gencode=arch=compute_{code[3:]},code={code}" for code in gencodes]
        included = Path(re.search(r'#include "(.*)"', text).group(1)).read_text() if name.endswith("_harness") else ""
        if re.search(r"\bcu[A-Z]\w*\s*\(", text + included):  # the driver API called directly
            options.append("-lcuda")
        digest = hashlib.sha256("\0".join([self.version, *options, text, included]).encode()).hexdigest()[:24]
        folder = self.folder / digest
        library = folder / f"lib{name}.so"
        if library.is_file():
            return library
        folder.mkdir(parents=True, exist_ok=True)
        source = folder / f"{name}.cu"
        source.write_text(text)
        partial = folder / f"lib{name}.so.partial"
        command = [self.nvcc, *options, "-o", str(partial), str(source), "-lcudart"]
        for path in _cuda_library_dirs(self.nvcc):
            command += ["-Xlinker", f"-rpath={path}"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (f"nvcc could not build {key}:\n{' '.join(command)}\n"
                                      f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        os.replace(partial, library)
        return library

    def abi(self, target):
        """The ctypes function a target is called through (for a member: its index comes first)."""
        self.start(target)
        path = self.futures[self._job(target)[0]].result()
        if path not in self.libraries:
            self.libraries[path] = ctypes.CDLL(str(path))
        library = self.libraries[path]
        if target.kind == "kernel":
            function = getattr(library, target.plan.launcher_name)
            extra = [ctypes.c_void_p] * ((3 if target.plan.reduce_count else 0) + len(target.plan.epilogue.vectors))
            function.argtypes = ABI + extra + [ctypes.c_void_p]
        elif target.kind == "member":
            function = library.gemmgen_guard_member
            function.argtypes = [ctypes.c_int] + ABI + [ctypes.c_void_p]
        else:
            function = getattr(library, f"gemmgen_{target.library}")
            function.argtypes = ABI + [ctypes.c_void_p]
        function.restype = ctypes.c_int
        return function

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def builds(request, tmp_path_factory, capability):
    """Compile everything the selected items call, in parallel, before the first call: the nvcc
    builds start in threads, then NVRTC compiles every runtime kernel (gpu.compile.compile_all: one
    process per core, into the session's cache), while the nvcc builds go on."""
    from gemmgen.gpu.compile import compile_all

    chosen = _selected(request)
    runnable = {name for name, target in TARGETS.items() if not target.runs_on(capability)}
    nvcc = shutil.which("nvcc")
    built = Builds(nvcc, tmp_path_factory.getbasetemp() / "abi-cache", capability)
    if nvcc:
        # the libraries first: each takes several times a kernel's build
        for name in sorted(chosen["abi"] & runnable, key=lambda n: TARGETS[n].kind == "kernel"):
            built.start(TARGETS[name])
    plans = {plan.launcher_name: plan for name in chosen["runtime"] & runnable for plan in TARGETS[name].plans}
    if plans:
        compile_all(list(plans.values()))
    yield built
    built.close()


@pytest.fixture(scope="module")
def kernels(gpu, builds):
    """kernels(name) -> the loaded runtime Kernel of a kernel or member target."""
    yield from hopper_gpu.kernel_cache({name: target.plan.spec for name, target in TARGETS.items()
                                        if target.kind != "library"})


@pytest.fixture(scope="module")
def problems(cp):
    """problems(case) -> verify.Problem (inputs and float64 reference on the device) for its M, N, K,
    alpha and beta, the same inputs whichever target or path asks; the last few hundred are kept."""
    kept: OrderedDict = OrderedDict()

    def get(case):
        key = (case.M, case.N, case.K, case.alpha, case.beta)
        if key in kept:
            kept.move_to_end(key)
        else:
            rng = np.random.default_rng([case.M, case.N, case.K, int(2 * case.beta + 4)])
            kept[key] = verify.Problem(verify.Case(*key), rng)
            if len(kept) > PROBLEMS_KEPT:
                kept.popitem(last=False)
        return kept[key]

    return get


@pytest.fixture
def call(request, cp, capability, builds, kernels):
    """call(name, path) -> (target, function(case, A, B, C, vectors) -> (cudaError, note)); skips a
    target this GPU cannot run, and the abi path without nvcc. `vectors`: a fused epilogue's bias and
    scale addresses by name (empty for a kernel without them), passed after ldc."""

    def make(name: str, path: str):
        target = TARGETS[name]
        reason = target.runs_on(capability)
        if reason:
            pytest.skip(reason)
        if path == "abi" and builds.nvcc is None:
            pytest.skip("nvcc is not on PATH: the C ABI items build the emitted .cu with it")
        smallest = None
        if target.plan.reduce_count and target.kind == "kernel":
            outputs = [cp.zeros(target.plan.reduce_count, t) for t in (cp.float32, cp.int32, cp.int32)]
            request.addfinalizer(outputs.clear)  # alive until the item's last launch is done
            smallest = [x.data.ptr for x in outputs]

        def scalars(case, a, b, c):
            return (case.M, case.N, case.K, case.alpha, a, case.lda, b, case.ldb, case.beta, c, case.ldc)

        if path == "runtime" and target.kind == "library":
            from gemmgen.library.dispatch import library
            runtime = library(target.library)

            def function(case, a, b, c, vectors):
                index = runtime.launch(*scalars(case, a, b, c))
                return 0, f"member {target.members[index]}"
        elif path == "runtime":
            kernel = kernels(name)

            def function(case, a, b, c, vectors):
                kernel.launch(*scalars(case, a, b, c), smallest=tuple(smallest) if smallest else None, **vectors)
                return 0, ""
        else:
            abi = builds.abi(target)
            first = [target.index] if target.kind == "member" else []
            extra = smallest or []

            def function(case, a, b, c, vectors):
                return abi(*first, *scalars(case, a, b, c), *extra, *vectors.values(), None), ""
        return target, function

    return make


# --- one call, checked ----------------------------------------------------------------------------

def _placed(cp, values, placement, layout: str):
    """A buffer of guard bits with `values` (rows x cols) at `placement` in `layout`."""
    buffer = cp.full(placement.size, verify.GUARD_BITS, dtype=cp.uint32).view(cp.float32)
    rows, cols = values.shape
    verify.matrix_view(cp, buffer, rows, cols, layout, placement.ld, placement.start)[...] = values
    return buffer


def check_call(cp, target, case, function, problem) -> str:
    """Place A, B and C of `case` in guarded buffers, call, and say what went wrong ("" if nothing)."""
    M, N, K = case.M, case.N, case.K
    where = guard_cases.placements(target, case)
    layouts = target.layouts
    c_values = problem.C if case.beta != 0.0 else cp.full((M, N), cp.nan, dtype=cp.float32)
    buffers = {name: _placed(cp, values, where[name], layouts[name])
               for name, values in (("A", problem.A), ("B", problem.B), ("C", c_values))}
    before = {name: buffer.view(cp.uint32).copy() for name, buffer in buffers.items()}
    # A fused epilogue's vectors (in its ABI's order) and the value it must store.
    plan = target.plan
    vectors = epilogue_vectors(cp, plan, M, N) if plan.epilogue.fused else {}
    reference, scale = (epilogue_reference(cp, plan, problem.A, problem.B, problem.C, case.alpha, case.beta, vectors)
                        if plan.epilogue.fused else (problem.reference, problem.scale))
    status, note = function(case, *(buffers[n].data.ptr + 4 * where[n].start for n in "ABC"), vector_pointers(vectors))
    synchronize()  # a fault is this call's
    if status:
        return f"returned cudaError {status}, expected 0"

    changed = {name: buffers[name].view(cp.uint32) != before[name] for name in "ABC"}
    verify.matrix_view(cp, changed["C"], M, N, layouts["C"], case.ldc, where["C"].start)[...] = False
    out = verify.matrix_view(cp, buffers["C"], M, N, layouts["C"], case.ldc, where["C"].start).astype(cp.float64)
    allowed = verify.tolerance(scale, K, target.math)
    error = cp.abs(out - reference)
    ratio = error / allowed
    bad = ~(ratio <= 1.0)  # NaN compares false: it never passes
    worst = cp.argmax(cp.where(cp.isnan(ratio), cp.inf, ratio))
    stats = cp.stack([x.astype(cp.float64) for x in (
        changed["C"].sum(), cp.argmax(changed["C"]), changed["A"].sum(), changed["B"].sum(), bad.sum(), worst,
        cp.take(out, worst), cp.take(reference, worst), cp.take(allowed, worst))]).get()
    touched, first, a_changed, b_changed, wrong, worst, got, expected, tolerance = (float(x) for x in stats)

    found = []
    if touched:
        found.append(f"wrote {int(touched)} guard cell(s) of C, the first at "
                     f"{guard_cases.describe_cell(where['C'], int(first))}")
    for name, count in (("A", a_changed), ("B", b_changed)):
        if count:
            found.append(f"changed {int(count)} float(s) of {name}'s buffer (an input)")
    if wrong:
        i, j = divmod(int(worst), N)
        found.append(f"{int(wrong)} of {M * N} elements of C wrong, worst C[{i}, {j}] = {got!r}, expected "
                     f"{expected!r} (tolerance {tolerance:.3g})")
    if found and note:
        found.append(note)
    return "; ".join(found)


# --- the tests ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,path,case", HELD_OUT)
def test_held_out_call_writes_only_c(name, path, case, cp, call, problems):
    target, function = call(name, path)
    problem = problems(case)
    found = check_call(cp, target, case, function, problem)
    assert not found, f"{name} via {path}, {case}: {found}"


@pytest.mark.parametrize("name,path", SWEEPS)
def test_every_remainder_writes_only_c(name, path, cp, call, problems):
    target, function = call(name, path)
    cases = guard_cases.sweep(target)
    failures = []
    for case in cases:
        try:
            found = check_call(cp, target, case, function, problems(case))
        except Exception as exc:  # noqa: BLE001 - a fault leaves the context unusable: stop here
            failures.append(f"{case}: {type(exc).__name__}: {exc}")
            break
        if found:
            failures.append(f"{case}: {found}")
    shown = "\n  ".join(failures[:SHOWN]) + (f"\n  ... and {len(failures) - SHOWN} more" if len(failures) > SHOWN else "")
    assert not failures, f"{name} via {path}: {len(failures)} of {len(cases)} calls failed:\n  {shown}"


def test_the_check_catches_writes_outside_c_into_inputs_and_unwritten_elements(cp, problems):
    """The check itself, on a stand-in kernel (CuPy on the raw pointers) that computes C right: it
    passes, and each single wrong store is reported where it landed."""
    target = TARGETS["warptile"]  # A, B and C row-major
    case = next(c for c in guard_cases.held_out(target) if (c.M, c.N, c.beta) == (33, 65, -0.5))
    M, N, K = case.M, case.N, case.K

    def view(address, rows, cols, ld):
        memory = cp.cuda.UnownedMemory(address, 4 * ((rows - 1) * ld + cols), None)
        return cp.ndarray((rows, cols), cp.float32, cp.cuda.MemoryPointer(memory, 0), strides=(4 * ld, 4))

    def stand_in(wrong):
        def function(case, a, b, c, vectors):
            A, B, C = view(a, M, K, case.lda), view(b, K, N, case.ldb), view(c, M, N, case.ldc)
            C[...] = (case.alpha * (A.astype(cp.float64) @ B.astype(cp.float64))
                      + case.beta * C.astype(cp.float64)).astype(cp.float32)
            if wrong:
                address, value = wrong(a, b, c)
                view(address, 1, 1, 1)[...] = value
            return 0, ""
        return function

    assert check_call(cp, target, case, stand_in(None), problems(case)) == ""
    expected = {
        "slack": (lambda a, b, c: (c + 4 * N, 1.0), "the first at line 0, float 65 of C (between C's width 65"),
        "past": (lambda a, b, c: (c + 4 * (M * case.ldc + 2), 1.0), "the first at line 33, float 2 of C (past"),
        "before": (lambda a, b, c: (c - 4, 1.0), "the first at 1 float(s) before C's first element"),
        "input": (lambda a, b, c: (b + 4 * N, 1.0), "changed 1 float(s) of B's buffer"),
        "unwritten": (lambda a, b, c: (c + 4 * (5 * case.ldc + 7), float("nan")), f"1 of {M * N} elements of C wrong, worst C[5, 7]"),
    }
    for what, (wrong, words) in expected.items():
        found = check_call(cp, target, case, stand_in(wrong), problems(case))
        assert words in found, f"{what}: {found!r}"
