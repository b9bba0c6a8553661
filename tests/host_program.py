"""Generated scheduling code compiled for the host and run there (CPU tests): a C++ program reads
problems from stdin and prints rows of integers, one problem's rows ended by "end"."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def run_on_host(program: str, feed: str, binary: Path):
    """Compile `program` with the host C++ compiler (the test skips without one), feed it the
    problems, and read its lines back: a list of rows (tuples of ints) per problem, and
    "tiles B COUNT" lines as {(problem, B): COUNT}."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no host C++ compiler")
    binary.with_suffix(".cpp").write_text(program)
    subprocess.run([compiler, "-std=c++17", "-O1", "-o", str(binary), str(binary.with_suffix(".cpp"))], check=True)
    out = subprocess.run([str(binary)], input=feed, capture_output=True, text=True, check=True).stdout
    runs, rows, counts = [], [], {}
    for line in out.splitlines():
        if line.startswith("tiles "):
            block, count = (int(x) for x in line.split()[1:])
            counts[len(runs), block] = count
        elif line == "end":
            runs.append(rows)
            rows = []
        else:
            rows.append(tuple(int(x) for x in line.split()))
    return runs, counts
