"""gemmgen as a user gets it: the wheel built from this checkout, installed into a folder of its
own and run from a folder outside the checkout (where the source tree cannot stand in for a file the
wheel lacks).

The wheel is installed with `pip install --target` and run by the interpreter running the tests,
that folder first on its path: it sees that interpreter's packages (the wheel's dependencies,
installed by `pip install '.[test]'`, in a venv or not) and gemmgen itself from the wheel only.
(A venv made here with --system-site-packages would see the base interpreter's packages, not the
venv's that README's set-up installs into; and the NVRTC wheel is found only from the environment
it was installed in.) The GPU verbs run with CUDA_VISIBLE_DEVICES empty, so they meet no GPU on any machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import GENERATED_DIR, ROOT, SPECS_DIR

# What a build leaves in a checkout, and what the package does not need: not copied for the wheel
# (generated/ is: it holds the shipped libraries' manifests, which the wheel carries).
NOT_SOURCES = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".git", ".pytest_cache",
                                     ".hypothesis", "out", ".whl", "benchmarks")


class Installed:
    def __init__(self, wheel: Path, site: Path, workdir: Path, cache: Path):
        self.wheel, self.site, self.workdir = wheel, site, workdir  # site: the folder the wheel went into
        self.bin = site / ("Scripts" if os.name == "nt" else "bin")
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.env.update(GEMMGEN_CACHE=str(cache), COLUMNS="200", PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(site))

    def run(self, *args: str, no_gpu: bool = False, program: str = "gemmgen") -> subprocess.CompletedProcess:
        env = {**self.env, "CUDA_VISIBLE_DEVICES": ""} if no_gpu else self.env
        command = [sys.executable] if program == "python" else [sys.executable, str(self.bin / program)]
        return subprocess.run([*command, *map(str, args)], cwd=self.workdir, env=env,
                              capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def installed(tmp_path_factory, gemmgen_cache) -> Installed:
    """Build the wheel from a clean copy of the checkout, install it alone into a folder of its own."""
    root = tmp_path_factory.mktemp("installed")
    source = root / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(root / "dist"),
                            str(source)], capture_output=True, text=True)
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}\n{built.stderr}"
    (wheel,) = (root / "dist").glob("gemmgen-*.whl")
    site = root / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                              "--target", str(site), str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, f"installing the wheel failed:\n{install.stdout}\n{install.stderr}"
    workdir = root / "elsewhere"
    shutil.copytree(SPECS_DIR, workdir / "specs")
    return Installed(wheel, site, workdir, gemmgen_cache)


def assert_no_traceback(run: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr


def test_the_installed_package_is_the_wheels(installed):
    run = installed.run("-c", "import gemmgen, gemmgen.tuning.strategies; print(gemmgen.__file__)", program="python")
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.strip()).is_relative_to(installed.site), run.stdout
    shipped = installed.run("-c", "from gemmgen.library.dispatch import shipped_manifest; "
                            "print(shipped_manifest('fp32').library, shipped_manifest('tf32').library)",
                            program="python")
    assert shipped.stdout.split() == ["fp32", "tf32"], shipped.stderr  # gemmgen.matmul's libraries
    checked = installed.run("-m", "pip", "check", program="python")
    broken = [line for line in checked.stdout.splitlines() if line.startswith("gemmgen ")]
    assert not broken, "the wheel's requirements are not met:\n" + "\n".join(broken)


def test_the_wheel_holds_every_module_the_grammar_and_the_templates(installed):
    package = ROOT / "gemmgen"
    expected = {f"gemmgen/{p.relative_to(package).as_posix()}"
                for pattern in ("*.py", "*.lark", "*.cpp") for p in package.rglob(pattern) if "__pycache__" not in p.parts}
    expected |= {f"gemmgen/templates/{p.name}" for pattern in ("*.py", "*.j2")
                 for p in (ROOT / "templates").glob(pattern)}
    expected |= {f"gemmgen/libraries/{p.name}" for p in GENERATED_DIR.glob("*.json")}  # the shipped manifests
    assert "gemmgen/tuning/strategies/__init__.py" in expected and "gemmgen/templates/kernel.cu.j2" in expected
    assert "gemmgen/libraries/fp32.json" in expected and "gemmgen/torch/native.cpp" in expected
    with zipfile.ZipFile(installed.wheel) as wheel:
        shipped = {name for name in wheel.namelist() if ".dist-info/" not in name}
    assert not expected - shipped, f"missing from the wheel: {sorted(expected - shipped)}"
    assert not shipped - expected, f"in the wheel but not in the package: {sorted(shipped - expected)}"


def verbs() -> list[str]:
    from gemmgen.cli import main
    return sorted(main.commands)


def test_every_verb_has_help(installed):
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        runs = dict(zip([""] + verbs(), pool.map(lambda verb: installed.run(*filter(None, [verb, "--help"])),
                                                  [""] + verbs())))
    for verb, run in runs.items():
        assert run.returncode == 0, f"gemmgen {verb} --help: {run.stderr}"
        assert run.stdout.startswith(f"Usage: gemmgen {verb}".rstrip()), run.stdout[:200]
        assert_no_traceback(run)
    for verb in verbs():
        assert re.search(rf"^\s+{verb}\s", runs[""].stdout, re.M), f"{verb} missing from gemmgen --help"


SPEC_FILES = sorted(p.name for p in SPECS_DIR.glob("*.gemm"))


def test_build_and_explain_every_shipped_spec(installed):
    from gemmgen.language.load import load, load_file

    def run_both(name):
        return installed.run("build", f"specs/{name}"), installed.run("explain", f"specs/{name}")

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = dict(zip(SPEC_FILES, pool.map(run_both, SPEC_FILES)))
    for name, (build, explain) in results.items():
        kernels = load(SPECS_DIR / name)
        assert build.returncode == 0, f"gemmgen build specs/{name}:\n{build.stderr}"
        assert_no_traceback(build)
        for spec in kernels:
            if spec.is_concrete:  # the wheel's templates generate what is committed
                for suffix in (".cu", ".h"):
                    written = installed.workdir / "generated" / f"{spec.name}{suffix}"
                    assert written.read_bytes() == (GENERATED_DIR / f"{spec.name}{suffix}").read_bytes(), written
            else:
                assert f"skipped {spec.name}: a search space (run gemmgen tune)" in build.stdout
        assert_no_traceback(explain)
        libraries = load_file(SPECS_DIR / name).libraries
        if libraries:  # explain summarises a file's libraries, with what their manifests keep
            assert explain.returncode == 0, f"gemmgen explain specs/{name}:\n{explain.stderr}"
            assert all(f"library {lib.name}:" in explain.stdout for lib in libraries), explain.stdout
        elif any(spec.is_concrete for spec in kernels):
            assert explain.returncode == 0, f"gemmgen explain specs/{name}:\n{explain.stderr}"
            assert all(spec.name in explain.stdout for spec in kernels if spec.is_concrete)
        else:  # a search space has no single kernel to explain: a message, as for any spec error
            assert explain.returncode == 1 and "is a search space" in explain.stderr, explain.stderr


@pytest.mark.parametrize("verb,spec", [("check", "warptile.gemm"), ("bench", "warptile.gemm"),
                                       ("tune", "small_search.gemm"), ("profile", "warptile.gemm")])
def test_gpu_verbs_without_a_gpu_exit_2_with_a_message(installed, verb, spec):
    run = installed.run(verb, f"specs/{spec}", no_gpu=True)
    assert run.returncode == 2, f"gemmgen {verb}: exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    assert "no CUDA GPU found" in run.stderr and "need one" in run.stderr, run.stderr
    assert_no_traceback(run)


def test_replay_reads_the_benchmarks_of_the_folder_it_runs_in(installed, tmp_path):
    """README's replay examples, run by the installed gemmgen in a folder holding specs/ and
    benchmarks/ (not the package's folder); in a folder without them, a message, not a traceback."""
    checkout = tmp_path / "checkout"
    shutil.copytree(SPECS_DIR, checkout / "specs")
    (checkout / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "testbed.json", checkout / "benchmarks")
    shutil.copytree(ROOT / "benchmarks" / "tuning", checkout / "benchmarks" / "tuning")

    def replay(*args, cwd=checkout):
        return subprocess.run([str(installed.bin / "gemmgen"), "replay", *args], cwd=cwd, env=installed.env,
                              capture_output=True, text=True, timeout=600)

    one = replay("specs/hopper_tc_search.gemm", "--shape", "4096x4096x4096", "--strategy", "model",
                 "--strategy", "tpe")
    assert one.returncode == 0, one.stdout + one.stderr
    assert "hopper_tc_search 4096x4096x4096 (108)" in one.stdout and "tpe" in one.stdout
    bed = replay("--testbed", "--strategy", "model", "--check", "model", "--markdown", "replay.md")
    assert bed.returncode == 0, bed.stdout + bed.stderr
    assert "model: within 3% with at most 10% of the points" in bed.stdout
    assert "| hopper_tc_search 4096x4096x4096 (108) | model |" in (checkout / "replay.md").read_text()
    elsewhere = tmp_path / "empty"
    elsewhere.mkdir()
    for args in (["--testbed"], ["specs/hopper_tc_search.gemm", "--shape", "4096x4096x4096"]):
        lost = replay(*args, cwd=elsewhere)
        assert lost.returncode in (1, 2), lost.stdout + lost.stderr
        assert_no_traceback(lost)
    lost = replay("--testbed", cwd=elsewhere)
    assert "replay reads benchmarks/tuning/*.jsonl in the current folder" in lost.stderr, lost.stderr
