"""Hostile and careless command lines: every bad flag is refused by argparse
(its type) with a clear message and exit status 2 before anything runs --
never silently replaced, never a traceback, never blamed on the target --
and an output that cannot be written fails up front, not after the run."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from memspec import cli
from memspec.commands import conform, fuzz

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = "tests.hostile_targets:TOY"


def _run(argv, capsys):
    """Run ``memspec argv`` in-process; (exit status, stderr)."""
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


BAD_FLAGS = [
    (["conform", "--timeout", "0"], "--timeout"),
    (["conform", "--timeout", "nan"], "--timeout"),
    (["conform", "--timeout", "-1"], "--timeout"),
    (["conform", "--timeout", "inf"], "--timeout"),
    (["conform", "--timeout", "abc"], "--timeout"),
    (["conform", "--examples", "0"], "--examples"),
    (["conform", "--examples", "-3"], "--examples"),
    (["conform", "--steps", "0"], "--steps"),
    (["conform", "--capacity", "0"], "--capacity"),
    (["conform", "--capacity", "-1"], "--capacity"),
    (["conform", "--until", "s11"], "--until"),
    (["conform", "--until", "S11; rm -rf /"], "--until"),
    (["fuzz", "--minutes", "-1"], "--minutes"),
    (["fuzz", "--minutes", "nan"], "--minutes"),
    (["fuzz", "--minutes", "inf"], "--minutes"),
    (["fuzz", "--minutes", "0"], "--minutes"),
    (["fuzz", "--seconds", "-5"], "--seconds"),
    (["fuzz", "--timeout", "0"], "--timeout"),
    (["fuzz", "--timeout", "-1"], "--timeout"),
    (["fuzz", "--steps", "0"], "--steps"),
    (["fuzz", "--capacity", "0"], "--capacity"),
    (["fuzz", "reference", "--target", "reference-eager"], "two different targets"),
    (["mutants", "--examples", "0"], "--examples"),
    (["mutants", "--steps", "0"], "--steps"),
    (["mutants", "--capacity", "0"], "--capacity"),
    (["spec-check", "--examples", "0"], "--examples"),
    (["spec-check", "--steps", "0"], "--steps"),
    (["snapshot", "--capacity", "0"], "--capacity"),
    (["demo", "fragmentation", "--capacity", "0"], "--capacity"),
]


@pytest.mark.parametrize("argv,flag", BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_bad_flags_are_refused_with_exit_2(argv, flag, capsys):
    rc, err = _run(argv, capsys)
    assert rc == 2
    assert flag in err and "Traceback" not in err
    assert "steps run" not in err


def test_same_target_positional_and_option_is_fine():
    ns = fuzz.parser().parse_args(["reference", "--target", "reference"])
    assert ns.target == ns.target_opt == "reference"
    assert fuzz.parser().parse_args(["--minutes", "0.5"]).minutes == 0.5


def test_timeout_minus_one_is_not_blamed_on_the_target():
    """Before: ``conform --timeout -1`` reported FAIL S5 against the correct
    reference (the harness's own setitimer error blamed on the target)."""
    p = subprocess.run([sys.executable, "-m", "memspec", "conform", "reference-eager", "--level", "mechanism",
                        "--examples", "2", "--steps", "5", "--quiet", "--timeout", "-1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    assert "FAIL" not in p.stdout and "must be a finite number > 0" in p.stderr


@pytest.fixture
def blocker(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    return f


@pytest.mark.parametrize("argv", [
    ["conform", "--json", "{b}/x.json"],
    ["conform", "--junit", "{b}/x.xml"],
    ["conform", "--out", "{b}/repro"],
    ["conform", "--db", "{b}/db"],
    ["fuzz", "--db", "{b}/db"],
    ["fuzz", "--out", "{b}/repro"],
    ["mutants", "--json", "{b}/m.json"],
    ["mutants", "--out", "{b}"],
    ["snapshot", "--svg", "{b}/x.svg"],
    ["snapshot", "--out", "{b}/x.pickle"],
    ["doc", "--output", "{b}/SPEC.md"],
])
def test_unwritable_outputs_fail_before_the_run(argv, blocker, capsys):
    argv = [a.format(b=blocker) for a in argv]
    rc, err = _run(argv, capsys)
    assert rc == 2
    assert ("not writable" in err or "not a directory" in err) and "Traceback" not in err


def test_repro_commands_are_shell_quoted(tmp_path):
    out = tmp_path / "dir with space; touch pwned"
    cmd = [sys.executable, "-m", "memspec", "conform", "tests.hostile_targets:toy_overlap", "--machine", TOY,
           "--level", "mechanism", "--examples", "20", "--steps", "20", "--quiet", "--out", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "COLUMNS": "1000"})
    assert p.returncode == 1, p.stdout + p.stderr
    # the command runs the reproduction with the interpreter that ran memspec
    exe = shlex.quote(sys.executable)
    line = next(ln for ln in p.stdout.splitlines() if f": {exe} " in ln)
    shown = line.split(f": {exe} ", 1)[1].strip()
    (path,) = shlex.split(shown)                      # one argument, exactly the file written
    assert os.path.exists(path) and os.path.dirname(path) == str(out)
    assert not (tmp_path / "pwned").exists()
