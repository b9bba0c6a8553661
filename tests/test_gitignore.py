"""What the commands of README and docs/ write into a checkout is ignored by git (or is a committed
file they rewrite the same): `git status` stays clean after following them."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

import pytest

from conftest import ROOT

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode,
    reason="needs git and a git checkout")


def readme_commands() -> list[list[str]]:
    """The gemmgen commands in the code blocks of README.md and docs/*.md, as argument lists."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # README and its docs/ pages
    blocks = [block for page in pages
              for block in re.findall(r"^```[^\n]*\n(.*?)^```", page.read_text(), re.S | re.M)]
    text = "\n".join(blocks).replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        line = line.strip()
        for part in re.split(r"&&|;\s*do\b|;\s*done\b", line):
            part = part.strip()
            if part.startswith("gemmgen "):
                commands.append(shlex.split(part, comments=True))
    return commands


def kernels(spec: str, from_db: bool) -> list[str]:
    """The names of what `gemmgen build spec` writes: its kernels (its search spaces too, from a
    database); a library needs a database of its own, and none of README's builds gives one."""
    from gemmgen.language.load import load
    return [k.name for k in load(ROOT / spec) if k.is_concrete or from_db]


def outputs(args: list[str]) -> list[str]:
    """The files a command writes, relative to the checkout's root."""
    if args[1:3] == ["build", "$f"]:  # for f in specs/*.gemm; do gemmgen build $f; done
        return [path for spec in sorted((ROOT / "specs").glob("*.gemm"))
                for path in outputs(["gemmgen", "build", f"specs/{spec.name}"])]
    verb, spec = args[1], next((a for a in args[2:] if a.endswith(".gemm")), "")
    value = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("-")}
    written = [value[o] for o in ("--json", "--plot", "--save", "--markdown") if o in value]
    if "--dispatcher" in value:
        written += [value["--dispatcher"], value["--dispatcher"].rsplit(".", 1)[0] + ".h"]
    if verb == "tune":
        db = value.get("--db", "tune.jsonl")
        written += [db, f"{db}.inflight", f"{db}.inflight.0"]
    if verb == "build":
        out = value.get("-o", "generated/")
        emit = value.get("--emit", "cu")
        for name in kernels(spec, "--from-db" in value):
            files = [f"{name}.{emit}"] + ([f"{name}.h"] if emit == "cu" else [])
            written += [out + f if out.endswith("/") else out for f in files]
    return written


def test_readme_commands_write_only_ignored_or_committed_files():
    commands = readme_commands()
    assert len(commands) >= 20
    written = sorted({path for args in commands for path in outputs(args)})
    assert {"tune.jsonl", "bench.png", "kernels/warptile.cu", "generated/warptile.cubin", "replay.md"} <= set(written)
    committed = set(subprocess.run(["git", "-C", str(ROOT), "ls-files", *written], capture_output=True,
                                   text=True, check=True).stdout.split())
    ignored = set(subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *written],
                                 capture_output=True, text=True).stdout.split())
    loose = [path for path in written if path not in committed | ignored]
    assert not loose, f"README's commands write these, which git would show as new files: {loose}"


@pytest.mark.parametrize("path", ["generated/.fp32.cu.k2j3.tmp.cu", "generated/.fp32.json.journal",
                                  "benchmarks/tuning/x.jsonl.inflight"])
def test_what_a_killed_command_leaves_is_ignored(path):
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", path], capture_output=True)
    assert ignored.returncode == 0, path
