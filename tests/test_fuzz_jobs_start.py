"""``memspec fuzz --jobs N`` (issue 16, deliverable 2): the workers fuzz the
plans the parent made once, before the fork (no worker imports the engine,
probes the target or learns the spec's protocols again), say what their
start cost, and a failure two workers saved is reported once.

No timing is asserted: the start figures are checked for presence and sign
only (what they measure goes in bench/, as ratios of one run).
"""

from __future__ import annotations

import json
import sys

import pytest

from memspec.commands import fuzz
from memspec.invariants import runner

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the plans are inherited through fork (Linux)")


def _main(tmp_path, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "fuzz.json"
    rc = fuzz.main([*extra, "--db", str(tmp_path / "db"), "--out", str(tmp_path / "repro"), "--quiet",
                    "--json", str(out)])
    return rc, json.loads(out.read_text())


def test_workers_fuzz_the_plans_made_before_the_fork(tmp_path, monkeypatch):
    """After the parent built the plans, planning is made to fail: a worker
    that planned again would report that error (and the run would fail)."""
    real = fuzz._build_plans
    built_levels: list = []

    def build_then_forbid(tref, args, levels):
        plans = real(tref, args, levels)
        built_levels.extend(plans)

        def no_more(*a, **kw):
            raise AssertionError("a worker planned again instead of using the inherited plan")

        monkeypatch.setattr(runner, "make_plan", no_more)
        return plans

    monkeypatch.setattr(fuzz, "_build_plans", build_then_forbid)
    rc, doc = _main(tmp_path, "reference", "--mode", "walk", "--seconds", "2", "--jobs", "2",
                    "--level", "mechanism")
    assert built_levels == ["mechanism"]
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
    monkeypatch.setattr(fuzz, "fuzz_walk", walks)
    _rc, doc = _main(tmp_path, "reference", "--mode", "walk", "--seconds", "600", "--jobs", "1",
                     "--level", "mechanism")
    assert doc["parent_cpu_s"] is None
    assert 0.2 <= doc["fuzz_cpu_s"] < 1.0


def test_a_plan_that_cannot_be_made_is_reported_by_the_workers(tmp_path, monkeypatch):
    """The parent keeps the error of a plan it could not make; the workers
    report it as ``--jobs 1`` would (an ERROR, exit status 1), not a pass."""
    def broken(tref, args, levels):
        return {lvl: RuntimeError(f"cannot plan {lvl}") for lvl in levels}

    monkeypatch.setattr(fuzz, "_build_plans", broken)
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
    monkeypatch.setattr(runner, "write_repros", lambda *a, **kw: None)
    args = fuzz.parser().parse_args(["reference", "--db", str(tmp_path / "db"), "--out", str(tmp_path / "r")])
    from memspec.invariants.discovery import resolve

    disp = fuzz.Display("reference", "hypothesis", 1.0, 2)
    results = fuzz._shrink_in_parent(resolve("reference"), args, ["mechanism"], [],
                                     {"mechanism": {"S1": ("outcome", "freed a foreign handle", None)}}, disp)
    fails = [f for r in results for f in r.failures]
    assert [(f.invariant, f.reason) for f in fails] == [("S1", "freed a foreign handle")]


def test_default_jobs_is_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.setattr(fuzz.os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert fuzz.default_jobs() == 3
