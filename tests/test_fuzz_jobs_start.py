"""``memspec fuzz --jobs N`` (issue 16, deliverable 2; issue 32): each worker
plans the target in its own supervised child -- the parent never imports the
target nor calls its factory -- says what its start cost, and a failure two
workers saved is reported once.

No timing is asserted: the start figures are checked for presence and sign
only (what they measure goes in bench/, as ratios of one run).
"""

from __future__ import annotations

import json
import sys

import pytest

from memspec.commands import fuzz
from memspec.invariants import fuzz as engine
from memspec.invariants import runner

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the plans are inherited through fork (Linux)")


def _main(tmp_path, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "fuzz.json"
    rc = fuzz.main([*extra, "--db", str(tmp_path / "db"), "--out", str(tmp_path / "repro"), "--quiet",
                    "--json", str(out)])
    return rc, json.loads(out.read_text())


def test_workers_plan_in_their_own_children_never_in_the_parent(tmp_path, monkeypatch):
    """Planning (the target's factory) is recorded with the process that did
    it: only the supervised workers, one each, never this process."""
    import os

    real = runner.make_plan
    log = tmp_path / "planned.txt"

    def recorded(*a, **kw):
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return real(*a, **kw)

    monkeypatch.setattr(runner, "make_plan", recorded)
    rc, doc = _main(tmp_path, "reference", "--mode", "walk", "--seconds", "2", "--jobs", "2",
                    "--level", "mechanism")
    pids = log.read_text().split()
    assert str(os.getpid()) not in pids and len(set(pids)) == 2, pids
    assert doc["errors"] == [], doc["errors"]
    assert rc == 0 and doc["steps"] > 0
    assert [w["worker"] for w in doc["workers"]] == [0, 1]
    for w in doc["workers"]:
        assert w["steps"] > 0
        # what starting the worker cost, reported by the worker itself
        assert w["ready_s"] >= 0 and 0 <= w["start_cpu_s"] <= w["cpu_s"]
    assert doc["parent_cpu_s"] >= 0 and doc["parent_setup_cpu_s"] > 0
    # the fuzzing CPU of a --jobs run is its workers' (the bench's CPU-normalized ratio reads it)
    assert doc["fuzz_cpu_s"] == pytest.approx(sum(w["cpu_s"] for w in doc["workers"]))


def _burn(seconds: float) -> None:
    import time

    c = time.process_time()
    while time.process_time() - c < seconds:   # CPU time, not wall: the same whatever the load
        pass


def test_jobs_1_reports_the_cpu_of_its_fuzzing_apart_from_its_planning(tmp_path, monkeypatch):
    """--jobs 1: ``fuzz_cpu_s`` counts the walks (here 0.2 s of CPU), not the
    planning before them (here 1 s)."""
    real = runner.make_plan

    def slow_plan(*a, **kw):
        _burn(1.0)
        return real(*a, **kw)

    def walks(plan, seconds, args, disp, **kw):
        _burn(0.2)
        return []

    monkeypatch.setattr(runner, "make_plan", slow_plan)
    monkeypatch.setattr(engine, "fuzz_walk", walks)
    _rc, doc = _main(tmp_path, "reference", "--mode", "walk", "--seconds", "600", "--jobs", "1",
                     "--level", "mechanism")
    assert doc["parent_cpu_s"] is None
    assert 0.2 <= doc["fuzz_cpu_s"] < 1.0


def test_a_plan_that_cannot_be_made_is_reported_by_the_workers(tmp_path, monkeypatch):
    """A plan the worker cannot make is an ERROR (exit status 1), not a pass."""
    def broken(tref, lvl, **kw):
        raise RuntimeError(f"cannot plan {lvl}")

    monkeypatch.setattr(runner, "make_plan", broken)
    rc, doc = _main(tmp_path, "reference", "--mode", "walk", "--seconds", "1", "--jobs", "2",
                    "--level", "mechanism")
    assert rc == 1
    assert any("cannot plan mechanism" in e["error"] for e in doc["errors"]), doc["errors"]
    assert doc["steps"] == 0


def test_the_parent_reports_a_failure_two_workers_saved_once(tmp_path, monkeypatch):
    """Hypothesis mode: the parent replays the shared database, where each
    worker saved its failure; two replays that shrink to the same
    counterexample are one failure in the report."""
    def twice(plan, sets, **kw):
        res = runner.PlanResult(plan.target, plan.level, plan)
        f = runner.Failure(plan.target, plan.level, "S1", "outcome", "freed a foreign handle", [], 3)
        res.failures = [f, runner.Failure(**{**f.__dict__})]
        return res

    monkeypatch.setattr(runner, "run_hypothesis", twice)
    # the shrinker (a supervised child forked from here) replays the shared database: twice S1
    opts = engine.FuzzOptions(target="reference", level="mechanism", jobs=2, db=str(tmp_path / "db"),
                              out=str(tmp_path / "r"), seconds=1.0)
    wk = engine._Worker(0)
    f = runner.Failure("reference", "mechanism", "S1", "outcome", "freed a foreign handle", [], 3)
    wk.found = [("mechanism", f, None, False), ("mechanism", runner.Failure(**{**f.__dict__}), None, False)]
    results = engine._gather(opts, [wk], lambda _t: None, engine.FuzzRun())
    fails = [f for r in results for f in r.failures]
    assert [(f.invariant, f.reason) for f in fails] == [("S1", "freed a foreign handle")]


def test_default_jobs_is_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.setattr(fuzz.os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert fuzz.default_jobs() == 3
