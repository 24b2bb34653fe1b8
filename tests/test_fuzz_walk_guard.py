"""The walk's "watched" guard: a whole run on one worker thread, calls direct,
a hang still caught and blamed (no thread hand-off per call)."""

import threading

import pytest

from memspec.invariants import harness as H
from memspec.invariants import runner, walk
from memspec.invariants.guard import Abandoned


def test_run_watched_returns_the_units_value_and_counts_its_calls():
    g = H.CallGuard(60.0, "watched")     # nothing here hangs: a generous timeout, immune to a loaded machine

    def unit(x):
        a = g.call(lambda: x + 1)
        b = g.call(lambda: {}["missing"])
        return a, b

    (a, b), err = g.run_watched(unit, 41)
    assert err is None and a == (42, None) and isinstance(b[1], KeyError)
    assert g.calls == 2 and g.depth == 0


def test_run_watched_reports_a_hang_with_what_the_call_was_for_and_stops_the_abandoned_unit():
    g = H.CallGuard(0.2, "watched")
    release = threading.Event()
    finished = threading.Event()
    after: list = []

    def unit():
        g.blame, g.what = "X1", "step 3: frobnicate"
        g.call(release.wait, 60)
        try:
            g.call(lambda: after.append("ran"))
        except Abandoned:
            after.append("abandoned")
        finished.set()

    value, err = g.run_watched(unit)
    assert isinstance(err, H.HangResult) and value is None
    # reported while the unit is still inside the waiting call (no clock read: the
    # call is released only below), not after it came back
    assert g.depth == 1 and not release.is_set() and after == []
    assert (g.blame, g.what) == ("X1", "step 3: frobnicate")
    release.set()
    assert finished.wait(60)            # the abandoned unit runs to its end
    assert after == ["abandoned"]       # the late unit never called the target again
    # the hang shortened the guard's timeout (for shrinking); the next, healthy unit gets a
    # generous one so that a loaded machine cannot make it a hang
    g.timeout = 60
    assert g.run_watched(lambda: g.call(lambda: 7)) == ((7, None), None)  # a fresh worker serves the next unit


def test_run_watched_needs_watched_mode():
    with pytest.raises(ValueError):
        H.CallGuard(1.0, "thread").run_watched(lambda: None)


def test_walk_reports_a_hanging_reference_as_a_hang_of_the_step():
    plan = runner.make_plan("tests.hostile_targets:reference_hangs", "mechanism", timeout=0.3)
    res = walk.walk(plan, max_steps=2000, seed=0, run_length=50)
    assert not res.errors and res.failures
    v = res.failures[0].violation
    assert v.cause == "hang" and "did not return within" in v.reason
    assert v.trace and v.trace[-1].outcome == "hangs" and v.reason.startswith(f"step {len(v.trace)}: ")
    assert plan.stats.first_failure_steps.get(v.invariant) is not None
