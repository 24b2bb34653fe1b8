"""Walk mode replays the database first (issue 16, deliverable 3): the walk
counterexamples a campaign saved -- on this machine or, through the shared
database, on another -- are replayed before any new walk, as Hypothesis
mode's reuse phase replays its own, in-process and with ``--jobs``.

To tell a replay from a rediscovery, the walks themselves are made to find
nothing here: only the database can then report the failure.
"""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis.database import DirectoryBasedExampleDatabase

from memspec.commands import fuzz
from memspec.invariants import fuzz as engine
from memspec.invariants import runner, walk

MiB = 1 << 20
TARGET = "mutant:foreign-free"


@pytest.fixture
def saved_db(tmp_path):
    """A database holding the shrunk walk counterexample of the mutant (S1)."""
    plan = runner.make_plan(TARGET, "mechanism", capacity=16 * MiB)
    res = walk.walk(plan, max_steps=20_000, run_length=200, seed=0)
    (wf,) = res.failures
    db_dir = tmp_path / "db"
    db = DirectoryBasedExampleDatabase(str(db_dir))
    v = walk.shrink(plan, wf, db=db)
    assert v is not None and v.invariant == "S1"
    return db_dir


def test_replay_finds_the_saved_counterexample_and_nothing_in_an_empty_database(saved_db, tmp_path):
    plan = runner.make_plan(TARGET, "mechanism", capacity=16 * MiB)
    (f,) = engine.replay_walk_database(plan, DirectoryBasedExampleDatabase(str(saved_db)))
    assert f.invariant == "S1" and f.trace and f.trace[-1].action
    assert engine.replay_walk_database(plan, DirectoryBasedExampleDatabase(str(tmp_path / "empty"))) == []
    assert engine.replay_walk_database(plan, None) == []


def _no_new_failures(monkeypatch):
    real = walk.walk

    def walk_finding_nothing(plan, **kw):
        res = real(plan, **{**kw, "max_steps": 1})
        res.failures = []
        return res

    monkeypatch.setattr(walk, "walk", walk_finding_nothing)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_fuzz_walk_reports_the_database_counterexample_first(saved_db, tmp_path, monkeypatch, jobs):
    if jobs == "2" and sys.platform != "linux":
        pytest.skip("the workers inherit the monkeypatch through fork (Linux)")
    _no_new_failures(monkeypatch)
    out = tmp_path / "fuzz.json"
    rc = fuzz.main([TARGET, "--mode", "walk", "--seconds", "1", "--jobs", jobs, "--capacity", str(16 * MiB),
                    "--db", str(saved_db), "--out", str(tmp_path / "repro"), "--quiet", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 1
    s1 = [f for f in doc["failures"] if f["invariant"] == "S1"]
    assert len(s1) == 1, doc["failures"]
    assert "not reproduced" not in s1[0]["reason"] and s1[0]["steps"] > 0
