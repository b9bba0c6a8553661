"""The house holds together (issue 27): no import circle among gemmgen's modules, counting the imports
made inside functions; each stage imports only the stages before it; an import inside a function is of
a heavy optional dependency, or one of the few named here with the reason; no module is over 700
lines; every package says its job and the package's docstring names them all; the old import paths of
the documented entry points still work (CPU)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gemmgen"

# The stages in the order data flows through them: each may import only itself and those before it.
# multigpu splits any launcher over devices and comes before library, whose gemmgen.matmul(devices=...)
# splits a library's calls with it.
STAGES = ("language", "plan", "codegen", "gpu", "explain", "tuning", "multigpu", "library", "torch", "cli")
# Top-level modules beside the stages, which any stage may import.
SHARED = ("version", "outputs")
# The old import paths of documented entry points: they import the stages, and nothing imports them.
COMPAT = ("runtime", "spec", "torch_op")

# Imported inside functions because they are heavy and optional: `import gemmgen`, a build or an
# explain never needs them.
HEAVY = {"torch", "cupy", "cupy_backends", "dask", "distributed", "optuna", "cmaes", "scipy", "matplotlib"}
# Other outside modules imported inside functions, each for its reason.
LAZY_EXTERNAL = {
    "cuda": "cuda-python's NVRTC and driver bindings moved module in cuda-python 12.6: gpu/compile.py and "
            "gpu/runtime.py try both names where they need them and word a missing one as gemmgen's error",
    "nvidia": "nvdisasm from the optional nvidia-cuda-nvdisasm wheel, looked for only when SASS is read",
}
# gemmgen's own modules imported inside functions: (importer, imported) -> the reason.
LAZY_INTERNAL = {
    ("gemmgen", "gemmgen.library.dispatch"):
        "gemmgen.matmul is loaded on first use (the package's __getattr__), so that `import gemmgen` "
        "reads no library manifest and loads neither NVRTC nor CuPy",
    ("gemmgen", "gemmgen.torch.fused"):
        "gemmgen.linear is loaded on first use (the package's __getattr__): it needs PyTorch, which "
        "`import gemmgen` must not load",
    ("gemmgen", "gemmgen.gpu.pad"):
        "gemmgen.release_workspace is loaded on first use (the package's __getattr__), so that "
        "`import gemmgen` loads no CUDA bindings",
}
MAX_LINES = 700


def modules(package: Path) -> dict[str, Path]:
    """Every module of a package folder, by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports(mods: dict[str, Path]) -> list[tuple[str, str, bool]]:
    """(importer, imported, inside a function) for every import statement of every module: imported is a
    module of `mods` where the statement names one, else the outside module's top-level name.
    Relative imports are resolved; imports under `if TYPE_CHECKING:` do not count."""
    out = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        skipped, in_function = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped |= {id(x) for stmt in node.body for x in ast.walk(stmt)}
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                in_function |= {id(x) for x in ast.walk(node) if x is not node}
        for node in ast.walk(tree):
            if id(node) in skipped or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            lazy = id(node) in in_function
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module for a in node.names]
            else:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                           for a in node.names]
            for target in targets:
                inside = max((m for m in mods if target == m or target.startswith(m + ".")), key=len, default=None)
                if inside != name:
                    out.append((name, inside or target.split(".")[0], lazy))
    return out


def circles(edges: list[tuple[str, str, bool]], mods: dict[str, Path]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph = {m: sorted({b for a, b, _ in edges if a == m and b in mods}) for m in mods}
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(mods) + 100))
    try:
        for v in graph:
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


MODULES = modules(PACKAGE)
EDGES = imports(MODULES)


def where(module: str) -> str:
    """The stage, shared module or old path a module belongs to ("" for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_import_circle_even_through_imports_inside_functions():
    found = circles(EDGES, MODULES)
    assert not found, "import circles (the imports inside functions count):\n" + "\n".join(
        f"  {', '.join(c)}" for c in found)


def test_the_circle_check_sees_imports_inside_functions(tmp_path):
    """A circle closed only by an import inside a function, and one through a relative import of a
    package, are found; the same modules without the closing import are not a circle."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import thing\n")
    (package / "b.py").write_text("def thing():\n    from . import a\n    return a\n")
    (package / "sub" / "__init__.py").write_text("from .c import value\n")
    (package / "sub" / "c.py").write_text("def value():\n    from . import helper\n")
    (package / "sub" / "helper.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                               "    from . import c\n")
    mods = modules(package)
    assert circles(imports(mods), mods) == [["pkg.a", "pkg.b"]]
    (package / "sub" / "helper.py").write_text("from .. import sub\n")
    assert circles(imports(modules(package)), modules(package)) == [["pkg.a", "pkg.b"], ["pkg.sub", "pkg.sub.c",
                                                                                         "pkg.sub.helper"]]
    (package / "b.py").write_text("def thing():\n    return 1\n")
    (package / "sub" / "helper.py").write_text("")
    assert circles(imports(modules(package)), modules(package)) == []


def test_every_module_belongs_to_a_stage_or_is_named_beside_them():
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert subpackages == set(STAGES), "a package of gemmgen/ that is no stage, or a stage with no package"
    assert top == set(SHARED) | set(COMPAT), f"a top-level module that is neither shared nor an old path: {top}"


def test_each_stage_imports_only_itself_and_the_stages_before_it():
    wrong = []
    for importer, imported, lazy in EDGES:
        if not imported.startswith("gemmgen"):
            continue
        source, target = where(importer), where(imported)
        if target in COMPAT or imported == "gemmgen":
            wrong.append(f"{importer} imports {imported}: nothing in gemmgen imports the package or an old path")
        elif source in STAGES and target in STAGES and STAGES.index(target) > STAGES.index(source):
            wrong.append(f"{importer} ({source}) imports {imported} ({target}), a later stage")
        elif source in SHARED and target not in SHARED:
            wrong.append(f"{importer} is shared by every stage, and imports {imported}")
    assert not wrong, "imports against the flow:\n" + "\n".join(f"  {w}" for w in wrong)


def test_imports_inside_functions_are_only_of_heavy_optional_dependencies_or_named_with_a_reason():
    wrong, used = [], set()
    for importer, imported, lazy in EDGES:
        if not lazy:
            continue
        if imported.startswith("gemmgen"):
            key = (importer, imported)
            if key in LAZY_INTERNAL:
                used.add(key)
            else:
                wrong.append(f"{importer} imports {imported} inside a function")
        elif imported in LAZY_EXTERNAL:
            used.add(imported)
        elif imported not in HEAVY:
            wrong.append(f"{importer} imports {imported} inside a function (not a heavy optional dependency)")
    assert not wrong, "imports inside functions: move them to the top, or name them here with the reason:\n" + \
        "\n".join(f"  {w}" for w in wrong)
    stale = (set(LAZY_INTERNAL) | set(LAZY_EXTERNAL)) - used
    assert not stale, f"named as imported inside a function, but no longer is: {sorted(map(str, stale))}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_over_700_lines(name):
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(ROOT)} has {lines} lines, over {MAX_LINES}: split it"


def test_every_package_says_its_job_and_the_package_names_every_stage():
    for name, path in MODULES.items():
        if path.name == "__init__.py":
            assert ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))), f"{name} has no docstring"
    top = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8")))
    missing = [stage for stage in STAGES if f"- {stage}:" not in top]
    assert not missing, f"gemmgen's docstring does not name the stages {missing}"


def test_the_old_import_paths_of_the_documented_entry_points_still_work():
    import gemmgen.gpu.runtime
    import gemmgen.language.load
    from gemmgen.runtime import CudaError, Kernel, ShapeError
    from gemmgen.spec import load_one
    assert (Kernel, CudaError, ShapeError) == (gemmgen.gpu.runtime.Kernel, gemmgen.gpu.runtime.CudaError,
                                               gemmgen.gpu.runtime.ShapeError)
    assert load_one is gemmgen.language.load.load_one
    assert load_one(ROOT / "specs" / "warptile.gemm").name == "warptile"
