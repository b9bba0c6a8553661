"""Compile generated CUDA C with NVRTC to a cubin for the exact target, and read ptxas's report.

Results are cached on disk (compile_cache.py) under a key made of everything that changes them:
the source, the options, the target and the NVRTC version; the cubin, its PTX and ptxas's report
(registers, spills) are all under the entry's checksum. A cubin (SASS), never PTX, is what runs:
the NVRTC installed from PyPI may be newer than a machine's driver, which could not JIT its PTX.

Reproducible builds: NVRTC names internal-linkage entities (the namespace-scope constexpr tiling
constants, emitted as globals) `_INTERNAL_<...>_<file>_<id>`, and where a file has no
external-linkage definition to derive <id> from (every gemmgen kernel is a template), <id> is the
time and the process id. `-frandom-seed` replaces those with a seed; gemmgen's is a digest of the
source, so one source gives one set of names, and the same cubin wherever NVRTC's optimizer is
itself deterministic (see `options_for`, which also says why -lineinfo is off by default).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..codegen.cuda import generate, kernel_name_expressions
from ..plan import Plan
from . import compile_cache
from .cubin import kernel_resources

CACHE_FORMAT = 3  # 3: one file per entry, ptxas's report under its checksum; NVRTC seeded


class CompileError(RuntimeError):
    """NVRTC rejected the source; the message carries its log."""


@dataclass(frozen=True)
class Resources:
    """ptxas's report for one kernel."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    shared_static: int

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)


@dataclass(frozen=True)
class Compiled:
    """A compiled kernel: the cubin and how to find and judge what is in it."""

    target: str
    cubin: bytes
    ptx: str
    lowered_names: dict[str, str]   # C++ name expression → symbol in the cubin
    resources: dict[str, Resources]  # symbol → ptxas report
    log: str
    nvrtc_version: str

    def resources_of(self, name_expression: str) -> Resources:
        return self.resources[self.lowered_names[name_expression]]

    def sass(self) -> str:
        """The cubin's machine code as text (nvdisasm)."""
        return disassemble(self.cubin)


def _nvdisasm() -> str:
    """nvdisasm from PATH or from the nvidia-cuda-nvdisasm wheel (the test extra installs it)."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia
        for root in nvidia.__path__:
            for candidate in sorted(Path(root).glob("*/bin/nvdisasm")):
                return str(candidate)
    except ImportError:
        pass
    raise CompileError("nvdisasm was not found: install a CUDA toolkit or "
                       "`pip install nvidia-cuda-nvdisasm` to read SASS")


def disassemble(cubin: bytes) -> str:
    """SASS of a cubin, to see which instructions (FFMA, HMMA, HGMMA) a kernel really runs."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        run = subprocess.run([_nvdisasm(), str(path)], capture_output=True, text=True)
    if run.returncode:
        raise CompileError(f"nvdisasm could not read the cubin: {run.stderr.strip()}")
    return run.stdout


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError:  # cuda-python before 12.6 kept the bindings at cuda.nvrtc
        from cuda import nvrtc  # type: ignore[no-redef]
    return nvrtc


def nvrtc_version() -> str:
    nvrtc = _nvrtc()
    _, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def _check(result, what: str, program=None) -> tuple:
    nvrtc = _nvrtc()
    status = result[0]
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        log = _program_log(program) if program is not None else ""
        raise CompileError(f"NVRTC {what} failed: {status.name}\n{log}".rstrip())
    return result[1:]


def _program_log(program) -> str:
    nvrtc = _nvrtc()
    _, size = nvrtc.nvrtcGetProgramLogSize(program)
    buffer = b" " * size
    nvrtc.nvrtcGetProgramLog(program, buffer)
    return buffer.rstrip(b"\0 ").decode(errors="replace")


_ENTRY = re.compile(r"Compiling entry function '(\S+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_report(log: str) -> dict[str, Resources]:
    """Per-function registers, spills, stack and static shared memory from `ptxas -v` output."""
    frames: dict[str, tuple[int, int, int]] = {}   # stack, spill stores, spill loads
    used: dict[str, tuple[int, int]] = {}          # registers, static shared memory
    entry = properties = None
    for line in log.splitlines():
        if match := _ENTRY.search(line):
            entry = match.group(1)
        elif match := _PROPERTIES.search(line):
            properties = match.group(1)
        elif (match := _FRAME.search(line)) and properties:
            frames[properties] = tuple(int(x) for x in match.groups())
        elif (match := _USED.search(line)) and entry:
            smem = _SMEM.search(line)
            used[entry] = (int(match.group(1)), int(smem.group(1)) if smem else 0)
            entry = None
    report = {}
    for name, (registers, shared) in used.items():
        stack, stores, loads = frames.get(name, (0, 0, 0))
        report[name] = Resources(registers, stores, loads, stack, shared)
    return report


def options_for(target: str) -> list[str]:
    """NVRTC's options for `target`, less the seed (`seed_option`), which depends on the source.

    No -lineinfo unless GEMMGEN_LINEINFO=1 (for a profiler's source view): it leaves the SASS as it
    is but embeds the PTX in the cubin (3x its size), and NVRTC 13.5's optimizer does not always
    give the same PTX for the same source. For some SIMT kernels (double_buffer, hopper_simt,
    hopper_small, pingpong_async, register_fragments, split_k, vectorized, warptile) the register
    numbering and the placement of a few copies vary from compile to compile. ptxas nearly always
    makes the same SASS of them, so without the embedded PTX their cubins nearly always agree: of
    158 compiles of the shipped kernels without -lineinfo, 4 gave another cubin (double_buffer,
    split_k, vectorized, warptile, once each; warptile's SASS differed in register assignment). gemmgen
    cannot seed that away. The cache serves one result per key, so builds on one machine agree."""
    options = [f"--gpu-architecture={target}", "-std=c++17", "--ptxas-options=-v", "--diag-suppress=177",
               "-fmad=true"]
    return options + (["-lineinfo"] if os.environ.get("GEMMGEN_LINEINFO", "") == "1" else [])


def seed_option(source: str) -> str:
    """-frandom-seed from the source: internal-linkage names the same on every compile of it."""
    return f"-frandom-seed=gemmgen-{hashlib.sha256(source.encode()).hexdigest()[:16]}"


_seed_supported = True  # False once an NVRTC has refused -frandom-seed (older than the option)


def cache_key(source: str, target: str, name_expressions: list[str]) -> str:
    digest = hashlib.sha256()
    for part in (str(CACHE_FORMAT), nvrtc_version(), target, " ".join(options_for(target)),
                 "\n".join(name_expressions), source):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def _from_cache(key: str) -> Compiled | None:
    """The entry of `key`, or None (a miss) when it is missing, damaged, or not what gemmgen writes."""
    entry = compile_cache.load(key)
    if entry is None:
        return None
    meta, blobs = entry
    try:
        resources = {}
        for symbol, report in meta["resources"].items():
            if set(report) != {f.name for f in fields(Resources)} or not all(
                    type(value) is int for value in report.values()):
                return None
            resources[str(symbol)] = Resources(**report)
        if not all(isinstance(v, str) for v in (*meta["lowered_names"], *meta["lowered_names"].values())):
            return None
        return Compiled(str(meta["target"]), blobs["cubin"], blobs["ptx"].decode(), dict(meta["lowered_names"]),
                        resources, str(meta["log"]), str(meta["nvrtc_version"]))
    except (KeyError, TypeError, AttributeError, ValueError):
        return None  # an entry of another layout (its checksum held): compiled again and replaced


def _to_cache(key: str, compiled: Compiled) -> None:
    meta = {"target": compiled.target, "lowered_names": compiled.lowered_names,
            "resources": {k: asdict(v) for k, v in compiled.resources.items()},
            "log": compiled.log, "nvrtc_version": compiled.nvrtc_version}
    compile_cache.store(key, meta, {"cubin": compiled.cubin, "ptx": compiled.ptx.encode()})


# ptxas's register allocation at the 255-register cap is not the same from one compile to the next
# under CPU load (seen: the scalar variant of double_buffer for sm_80 spilled 88 bytes in 1 compile
# of 18 with the CPUs busy, and never on an idle machine): such a result is compiled again, and
# the one that spills least is kept.
SPILL_RETRIES = 2
REGISTER_CAP = 255


def _spilled_bytes(compiled: Compiled) -> int:
    return sum(r.spill_stores + r.spill_loads for r in compiled.resources.values())


def _spills_at_the_cap(compiled: Compiled) -> bool:
    return any(r.spills and r.registers >= REGISTER_CAP for r in compiled.resources.values())


def compile_source(source: str, target: str, name_expressions: list[str], *,
                   filename: str = "kernel.cu", use_cache: bool = True) -> Compiled:
    """Compile CUDA C to a cubin for `target` (e.g. "sm_90"), lowering the given kernel names."""
    key = cache_key(source, target, name_expressions)
    if use_cache:
        cached = _from_cache(key)
        if cached is not None:
            return cached
    compiled = _compile_once(source, target, name_expressions, filename)
    for _ in range(SPILL_RETRIES):
        if not _spills_at_the_cap(compiled):
            break
        again = _compile_once(source, target, name_expressions, filename)
        if _spilled_bytes(again) < _spilled_bytes(compiled):
            compiled = again
    if use_cache:
        _to_cache(key, compiled)
    return compiled


def _compile_once(source: str, target: str, name_expressions: list[str], filename: str) -> Compiled:
    """One NVRTC compile: the cubin, PTX, lowered names and ptxas's report."""
    global _seed_supported
    options = options_for(target) + ([seed_option(source)] if _seed_supported else [])
    try:
        return _nvrtc_compile(source, target, name_expressions, filename, options)
    except _SeedRefused:
        _seed_supported = False
        return _nvrtc_compile(source, target, name_expressions, filename, options[:-1])


class _SeedRefused(Exception):
    """This NVRTC does not know -frandom-seed: compiled without (names carry a per-compile id)."""


def _nvrtc_compile(source: str, target: str, name_expressions: list[str], filename: str,
                   options: list[str]) -> Compiled:
    nvrtc = _nvrtc()
    (program,) = _check(nvrtc.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], []),
                        "program creation")
    try:
        for name in name_expressions:
            _check(nvrtc.nvrtcAddNameExpression(program, name.encode()), "name expression", program)
        encoded = [o.encode() for o in options]
        status = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)[0]
        log = _program_log(program)
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            if status == nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION and "frandom-seed" in log:
                raise _SeedRefused()
            raise CompileError(f"NVRTC could not compile {filename} for {target}:\n{log}")
        (size,) = _check(nvrtc.nvrtcGetCUBINSize(program), "cubin size", program)
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(program, cubin), "cubin", program)
        (ptx_size,) = _check(nvrtc.nvrtcGetPTXSize(program), "ptx size", program)
        ptx = b" " * ptx_size
        _check(nvrtc.nvrtcGetPTX(program, ptx), "ptx", program)
        lowered = {}
        for name in name_expressions:
            (symbol,) = _check(nvrtc.nvrtcGetLoweredName(program, name.encode()), "lowered name",
                               program)
            lowered[name] = symbol.decode() if isinstance(symbol, bytes) else str(symbol)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    cubin = bytes(cubin)
    return Compiled(target, cubin, ptx.rstrip(b"\0").decode(), lowered,
                    parse_ptxas_report(log) or resources_from_cubin(cubin), log, nvrtc_version())


def resources_from_cubin(cubin: bytes) -> dict[str, Resources]:
    """Registers and stack frames read from the cubin itself, where NVRTC's log held no ptxas
    report (cubin.py says when): no spills or static shared memory are known then (0)."""
    return {name: Resources(registers, 0, 0, frame, 0) for name, (registers, frame) in kernel_resources(cubin).items()}


def compile_plan(plan: Plan, source: str | None = None, *, target: str | None = None,
                 use_cache: bool = True) -> Compiled:
    """Compile a Plan's generated source (both variants) for its target or an override."""

    source = source if source is not None else generate(plan)
    names = list(kernel_name_expressions(plan).values())
    fallback = plan.mainloop.fallback
    if fallback is not None:  # the TMA file also holds its register-fed fallback
        names += list(kernel_name_expressions(fallback).values())
    return compile_source(source, target or plan.arch.name, names,
                          filename=f"{plan.launcher_name}.cu", use_cache=use_cache)


def compile_error(job: tuple[Plan, str | None]) -> str:
    """Why a (plan, source) job does not compile, "" when it does (into the cache); for a process pool."""
    plan, source = job
    try:
        compile_plan(plan, source)
        return ""
    except Exception as exc:  # noqa: BLE001 - the caller records it as the candidate's failure
        return f"{type(exc).__name__}: {str(exc)[:500]}"


def compile_all(plans: list[Plan]) -> None:
    """NVRTC on every plan, one process per CPU core, into the disk cache (failures are left for
    whoever loads the kernel to report)."""
    jobs = [(plan, None) for plan in plans]
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(compile_error, jobs))
