"""`--help` teaches, and what it shows works: every verb says what it does and shows examples;
every example parses (its options exist, the files it reads are there, its strategy options are
the strategy's), and those that need no GPU run and succeed."""

from __future__ import annotations

import re
import shlex

import pytest
from click.testing import CliRunner

from conftest import ROOT
from gemmgen.tuning import strategies
from gemmgen.cli import main

NO_GPU = {"build", "explain", "replay"}  # the verbs that run here


def help_text(*verb: str) -> str:
    result = CliRunner().invoke(main, [*verb, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def examples(text: str) -> list[str]:
    """The commands a help text shows: lines starting with `gemmgen `, with their `\\` continuations."""
    commands, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if current:
            current += " " + stripped
        elif stripped.startswith("gemmgen "):
            current = stripped
        else:
            continue
        if current.endswith("\\"):
            current = current[:-1].rstrip()
        else:
            commands.append(current)
            current = ""
    return commands


ALL = [(verb, command) for verb in [""] + sorted(main.commands)
       for command in examples(help_text(*filter(None, [verb])))]


@pytest.mark.parametrize("verb", sorted(main.commands))
def test_every_verb_says_what_it_does_with_an_example(verb):
    text = help_text(verb)
    summary = text.split("\n\n")[1].strip()
    assert len(summary.split()) >= 5, f"gemmgen {verb} --help opens with no description: {summary!r}"
    assert "Examples:" in text, f"gemmgen {verb} --help shows no example"
    assert any(c.startswith(f"gemmgen {verb} ") for c in examples(text)), text


def strategy_options_named(text: str) -> list[str]:
    return re.findall(r"--option ([a-z_]+)=", text)  # (NAME=VALUE is the metavar)


def options_of(name: str) -> dict:
    """A strategy's OPTIONS; {} for one whose optional library is missing here (gp: PyTorch)."""
    try:
        return strategies.get(name).OPTIONS
    except ValueError:
        return {}


def test_every_strategy_option_help_names_is_one_a_strategy_has():
    known = {name for s in strategies.names() for name in options_of(s)}
    assert {"seed", "batch"} <= known
    for verb in main.commands:
        for name in strategy_options_named(help_text(verb)):
            assert name in known, f"gemmgen {verb} --help names --option {name}, which no strategy has"


@pytest.mark.parametrize("verb,command", ALL, ids=[c for _, c in ALL])
def test_every_example_parses_and_names_files_that_are_there(verb, command, monkeypatch):
    monkeypatch.chdir(ROOT)  # examples are written for a checkout's root
    args = shlex.split(command, comments=True)[1:]
    sub = main.commands[args[0]]
    sub.make_context(args[0], args[1:])  # unknown options, bad choices, missing input files: errors
    chosen = [args[i + 1] for i, a in enumerate(args) if a == "--strategy"] or ["model"]
    for name in strategy_options_named(command):
        assert any(name in options_of(s) for s in chosen), (command, name)


RUNNABLE = [c for v, c in ALL if shlex.split(c, comments=True)[1] in NO_GPU
            and "--testbed" not in c]  # the whole test bed takes minutes: test_replay.py runs it


@pytest.mark.parametrize("command", RUNNABLE)
def test_every_example_that_needs_no_gpu_succeeds(command, tmp_path, monkeypatch):
    # A checkout's inputs, and a fresh folder for whatever the example writes (generated/, kernels/).
    for name in ("specs", "benchmarks"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    args = shlex.split(command, comments=True)[1:]
    result = CliRunner().invoke(main, args, terminal_width=200)
    assert result.exit_code == 0, (command, result.output, result.exception)
    assert "Traceback" not in result.output


def test_the_examples_cover_the_verbs_that_run_here():
    ran = {shlex.split(c)[1] for c in RUNNABLE}
    assert ran == NO_GPU and len(RUNNABLE) >= 8
