"""The generated CUDA C: committed copies (and their C headers) up to date, compiling with nvcc
and NVRTC, no spills, and a header that says where it came from and how to call it.

The NVRTC compiles are cached per session (see conftest.py), so a kernel compiled here is not
compiled again by another test.
"""

from __future__ import annotations

import difflib
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import GENERATED_DIR, ROOT, SPECS_DIR, load_shipped_specs
from gemmgen.codegen.c_header import header_source
from gemmgen.codegen.cuda import generate, kernel_name_expressions
from gemmgen.gpu.compile import compile_plan
from gemmgen.plan import make_plan
from gemmgen.language.load import load_one

REGENERATE = "for f in specs/*.gemm; do gemmgen build $f; done"


def spec_file(spec) -> str:
    return str(Path(spec.path).resolve().relative_to(ROOT))


def design_signature(spec) -> str:
    """The extern "C" entry point that DESIGN.md promises, written out independently of codegen."""
    vectors = "".join(f"const float *{name}, " for name in ("bias", "scale") if spec[name] != "none")
    extra = vectors + ("float *smallest_values, int *smallest_rows, int *smallest_cols, "
                       if spec["reduce.count"] else "")
    return (f'extern "C" int gemmgen_{spec.name}(int M, int N, int K, float alpha, '
            "const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc, "
            f"{extra}cudaStream_t stream);")


def assert_compiled_without_spills(compiled, plan) -> None:
    """Both variants (and any helper kernels) have a ptxas report, and none spills."""
    for expression in kernel_name_expressions(plan).values():
        symbol = compiled.lowered_names[expression]
        assert symbol in compiled.resources, (
            f"no ptxas report for {expression} ({symbol}) in the NVRTC log:\n{compiled.log}")
    for symbol, report in compiled.resources.items():
        assert not report.spills, (
            f"{plan.name} ({plan.layouts()}) for {compiled.target}: {symbol} spills "
            f"{report.spill_stores} B stored / {report.spill_loads} B loaded with "
            f"{report.registers} registers")


# --- (a) generated/ holds exactly what the specs generate today ------------------------

@pytest.mark.parametrize("suffix", [".cu", ".h"])
def test_generated_matches_the_spec(shipped_spec, suffix):
    path = GENERATED_DIR / f"{shipped_spec.name}{suffix}"
    fix = (f"regenerate it with `gemmgen build {spec_file(shipped_spec)}` (or all of them: "
           f"`{REGENERATE}`) and commit the result")
    assert path.is_file(), f"generated/{path.name} is missing: {fix}"
    plan = make_plan(shipped_spec)
    expected = generate(plan) if suffix == ".cu" else header_source(plan, f"{shipped_spec.name}.cu")
    committed = path.read_bytes()
    if committed != expected.encode("utf-8"):
        diff = difflib.unified_diff(committed.decode("utf-8", errors="replace").splitlines(),
                                    expected.splitlines(), f"generated/{path.name} (committed)",
                                    f"{path.name} (generated now)", lineterm="", n=1)
        shown = "\n".join(list(diff)[:40])
        pytest.fail(f"generated/{path.name} is stale: {fix}\n{shown}", pytrace=False)


def test_generated_has_no_orphans(shipped_specs):
    """Every generated .cu and .h comes from a concrete kernel of specs/, or from a library there
    (whose .cu and manifest test_library.py checks against its tuning database)."""
    from gemmgen.language.load import load_file
    libraries = {lib.name for path in SPECS_DIR.glob("*.gemm") for lib in load_file(path).libraries}
    names = {spec.name for spec in shipped_specs} | libraries
    orphans = sorted(p.name for p in GENERATED_DIR.glob("*.[ch]*") if p.stem not in names)
    orphans += sorted(p.name for p in GENERATED_DIR.glob("*.json") if p.stem not in libraries)
    assert not orphans, (f"generated/ holds {', '.join(orphans)}, made by no concrete kernel or library "
                         "of specs/: delete them, or restore their specs")


# --- (b) every committed .cu compiles with nvcc, as a user's build would compile it ----

@pytest.fixture(scope="session")
def nvcc_results(tmp_path_factory):
    """nvcc -c of every generated/<name>.cu (two at a time): name -> (returncode, log, symbols).

    Each compile includes generated/<name>.h first: a prototype there that differs from the .cu's
    definition is an error ("more than one instance ... has "C" linkage")."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH (install the CUDA toolkit to compile generated/*.cu; "
                    "CI has it)")
    folder = tmp_path_factory.mktemp("nvcc")

    def compile_one(spec):
        source = GENERATED_DIR / f"{spec.name}.cu"
        if not source.is_file():
            return spec.name, (None, f"{source} is missing", "")
        target = spec["target"].removeprefix("sm_")
        obj = folder / f"{spec.name}.o"
        # sm_90a needs the arch-specific virtual target too (-arch=sm_90a alone emits compute_90)
        arch = [f"-gencode=arch=compute_{target},code=sm_{target}"]
        header = GENERATED_DIR / f"{spec.name}.h"
        include = ["-include", str(header)] if header.is_file() else []  # missing: a staleness failure
        run = subprocess.run([nvcc, "-c", *arch, "-std=c++17", *include, "-o", str(obj), str(source)],
                             capture_output=True, text=True)
        symbols = ""
        if run.returncode == 0 and shutil.which("nm"):
            symbols = subprocess.run(["nm", "-g", str(obj)], capture_output=True, text=True).stdout
        return spec.name, (run.returncode, run.stdout + run.stderr, symbols)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(compile_one, load_shipped_specs()))


def test_generated_compiles_with_nvcc(shipped_spec, nvcc_results):
    returncode, log, symbols = nvcc_results[shipped_spec.name]
    assert returncode is not None, log
    assert returncode == 0, f"nvcc -c generated/{shipped_spec.name}.cu failed:\n{log}"
    if symbols:  # the launcher has C linkage: an unmangled, defined symbol
        assert re.search(rf"^\S+ T gemmgen_{shipped_spec.name}$", symbols, re.M), symbols


# --- (c) NVRTC: every shipped kernel for every target, planned for it, without spills ------

@pytest.mark.parametrize("target", ["sm_80", "sm_86", "sm_89", "sm_90"])
def test_nvrtc_compiles_without_spills(shipped_spec, target):
    if shipped_spec["target"] == "sm_90a":  # wgmma and TMA exist in sm_90a's instruction set only
        if target != "sm_90":
            pytest.skip("a wgmma kernel is built for sm_90a only (compiled in the sm_90 case)")
        target = "sm_90a"
    plan = make_plan(shipped_spec.with_values(target=target))  # the target's own limits
    compiled = compile_plan(plan)
    assert compiled.target == target
    assert compiled.cubin[:4] == b"\x7fELF"
    assert_compiled_without_spills(compiled, plan)


# --- (d) the header: spec, layout, C ABI -------------------------------------------------

def test_header_quotes_spec_layout_and_abi(shipped_spec):
    source = generate(make_plan(shipped_spec))
    header = source.split("\n#", 1)[0].splitlines()  # the comment block before the first directive
    assert all(line.startswith("//") for line in header), "the header is one block of // comments"
    for line in shipped_spec.source.splitlines():
        assert f"//   {line}".rstrip() in header, f"spec line {line!r} is not quoted in the header"
    layout = (f"// layout: A {shipped_spec['layout.A']}, B {shipped_spec['layout.B']}, "
              f"C {shipped_spec['layout.C']}")
    assert any(line.startswith(layout) for line in header), f"no line starting {layout!r}"
    signature = design_signature(shipped_spec)
    assert any(line.strip("/ ") == signature for line in header), f"no C ABI line {signature!r}"
    # ... and the definition in the code has that signature (up to spacing around '*').
    def normal(text):
        return re.sub(r"\s*\*\s*", " *", re.sub(r"\s+", " ", text))
    code = normal("\n".join(source.splitlines()[len(header):]))
    assert normal(signature[:-1]) + " {" in code or normal(signature[:-1]) + "{" in code, (
        f"the launcher's definition differs from {signature}")


def test_header_layout_line_follows_the_spec():
    spec = load_one(SPECS_DIR / "warptile.gemm").with_values(layout_A="col", layout_B="row",
                                                             layout_C="col")
    source = generate(make_plan(spec))
    assert "\n// layout: A col, B row, C col\n" in source


# --- (e) every layout of the main kernel shapes ------------------------------------------

LAYOUT_KERNELS = ["warptile", "vectorized", "pingpong_async", "naive", "tensorcore_3xtf32"]
AB_LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]


@pytest.mark.parametrize("c_layout", ["row", "col"])
@pytest.mark.parametrize("a_layout,b_layout", AB_LAYOUTS, ids=[f"A{a}-B{b}" for a, b in AB_LAYOUTS])
@pytest.mark.parametrize("name", LAYOUT_KERNELS)
def test_layouts_compile_without_spills(name, a_layout, b_layout, c_layout):
    spec = load_one(SPECS_DIR / f"{name}.gemm").with_values(
        layout_A=a_layout, layout_B=b_layout, layout_C=c_layout, target="sm_90")
    plan = make_plan(spec)
    source = generate(plan)
    assert f"// layout: A {a_layout}, B {b_layout}, C {c_layout}\n" in source
    compiled = compile_plan(plan, source, target="sm_90")
    assert_compiled_without_spills(compiled, plan)
