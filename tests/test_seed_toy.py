"""Seed 003's ``toy_alloc.py`` under the caching level (issue 31, item 7).

The toy (``tests/seed_toy_target.py``, copied verbatim from the seed and
wrapped from README.md's "Writing a target" alone) has two real bugs: a small
request crashes inside ``malloc`` (``_find`` never finds a small block in a
fresh 2 MiB segment, then ``_rem(None)``), and a double free is accepted
silently.  One ``conform`` run should report both, each with its own
reproduction that fails when run on its own.

The crash is found first at most seeds; a later pass masks it (the spec keeps
its state where the toy crashed) together with the figures the crash's
leftovers disturb at that step, so a pass is left for the double free; the
crash's leftovers are folded into it as consequences by replay.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from memspec.invariants import runner

TARGET = "tests.seed_toy_target:target"
CRASH_KEY = ("malloc", "C4.unexpected-exception")
DOUBLE_FREE_KEY = ("double_free", "C2.outcome")


def _conform(out_dir, **kw):
    (result,) = runner.conform(TARGET, "caching", out_dir=str(out_dir), **kw)
    assert result.errors == [], result.errors
    return result.failures


def _one(failures, key):
    found = [f for f in failures if f.key == key]
    assert found, (key, [(f.invariant, f.cause, f.key) for f in failures])
    return found[0]


def _replays_alone(repro: str, violation: str, cause: str) -> None:
    proc = subprocess.run([sys.executable, repro], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert violation in proc.stderr and f"[{cause}]" in proc.stderr, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    # the default seed; a modest budget (the passes end within seconds: each finds its failure early)
    return _conform(tmp_path_factory.mktemp("default"), examples=50)


def test_default_seed_reports_the_small_request_crash(default_run):
    crash = _one(default_run, CRASH_KEY)
    assert crash.invariant == "C4" and crash.cause == "unexpected-exception"
    assert "malloc(size=" in crash.reason and "AttributeError" in crash.reason
    assert crash.repro
    _replays_alone(crash.repro, "Violation_C4", "unexpected-exception")


def test_default_seed_reports_the_double_free_too(default_run):
    """Both bugs, each on its own row with its own reproduction, and nothing
    else: the crash's leftovers (the segment it reserved before crashing,
    seen in the C2 and C1 figures at the next pass) are masked with it and
    folded into it as its consequences by replay."""
    df = _one(default_run, DOUBLE_FREE_KEY)
    crash = _one(default_run, CRASH_KEY)
    assert df.repro and df.repro != crash.repro
    assert len(default_run) == 2, [(f.invariant, f.cause, f.reason[:80]) for f in default_run]
    _replays_alone(df.repro, "Violation_C2", "outcome")


def test_both_bugs_in_one_run_with_their_own_reproductions(tmp_path):
    # seed 5 draws the double free in pass 0, before the crash; short shrinking keeps it ~15 s
    failures = _conform(tmp_path, seed=5, examples=20, shrink_seconds=3)
    crash = _one(failures, CRASH_KEY)
    df = _one(failures, DOUBLE_FREE_KEY)
    assert df.invariant == "C2" and df.cause == "outcome"
    assert "double_free(" in df.reason and "DoubleFree" in df.reason
    assert crash.repro and df.repro and crash.repro != df.repro
    _replays_alone(crash.repro, "Violation_C4", "unexpected-exception")
    _replays_alone(df.repro, "Violation_C2", "outcome")
