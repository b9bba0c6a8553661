"""Shared test set-up: the shipped specs, a private NVRTC cache, and the `gpu` marker.

- Every test session compiles into its own cache folder (GEMMGEN_CACHE), never ~/.cache: within
  one session a kernel is compiled once, however many tests need its cubin.
- A test that takes a `shipped_spec` argument runs once per concrete kernel of specs/*.gemm
  (search spaces are left out); the `shipped_specs` fixture is the whole list.
- Tests marked `gpu` are skipped where the CUDA driver sees no GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPECS_DIR = ROOT / "specs"
GENERATED_DIR = ROOT / "generated"

NO_GPU_REASON = "no CUDA GPU found (gpu tests need one: see docs/testing.md)"


def load_shipped_specs():
    """Every concrete kernel of specs/*.gemm, in file order (search spaces left out)."""
    from gemmgen.language.load import load

    return [spec for path in sorted(SPECS_DIR.glob("*.gemm")) for spec in load(path)
            if spec.is_concrete]


def load_search_specs():
    """The search spaces of specs/*.gemm (kernels holding sets)."""
    from gemmgen.language.load import load

    return [spec for path in sorted(SPECS_DIR.glob("*.gemm")) for spec in load(path)
            if not spec.is_concrete]


@pytest.fixture(scope="session", autouse=True)
def gemmgen_cache(tmp_path_factory):
    """Point the NVRTC compile cache at a folder of this session (restored afterwards)."""
    folder = tmp_path_factory.mktemp("gemmgen-cache")
    saved = os.environ.get("GEMMGEN_CACHE")
    os.environ["GEMMGEN_CACHE"] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop("GEMMGEN_CACHE", None)
    else:
        os.environ["GEMMGEN_CACHE"] = saved


@pytest.fixture(scope="session")
def shipped_specs():
    return load_shipped_specs()


def pytest_generate_tests(metafunc):
    if "shipped_spec" in metafunc.fixturenames:
        specs = load_shipped_specs()
        metafunc.parametrize("shipped_spec", specs, ids=[spec.name for spec in specs])


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    from gemmgen.gpu.runtime import device_count

    if device_count() == 0:
        skip = pytest.mark.skip(reason=NO_GPU_REASON)
        for item in gpu_items:
            item.add_marker(skip)
