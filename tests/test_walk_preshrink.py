"""Walk mode's step-level pre-shrink (issue 35): before Hypothesis shrinks a
walk's failing run, whole steps are deleted from its choice sequence (delta
debugging: everything after the failing step, then halves, quarters, ...,
single steps), each candidate replayed deterministically and kept when it
fails with the same invariant, within a count of replays.  Hypothesis then
starts from the shorter run.  Counts, not times."""

from __future__ import annotations

import subprocess
import sys

import pytest

from memspec.commands import fuzz
from memspec.invariants import harness as H
from memspec.invariants import runner, walk

MiB = 1 << 20
#: a system-level mutant whose first walk failure is a long run (100+ steps)
#: of which a couple of steps matter
TARGET, LEVEL, INV = "mutant:release-before-fence", "system", "S4"


def _chunks(choices: list, starts: list) -> list[tuple]:
    """The choice sequence cut into its steps (the last runs to the end)."""
    ends = starts[1:] + [len(choices)]
    return [tuple(choices[a:b]) for a, b in zip(starts, ends)]


@pytest.fixture(scope="module")
def found():
    plan = runner.make_plan(TARGET, LEVEL, capacity=16 * MiB)
    res = walk.walk(plan, max_steps=20_000, run_length=200, seed=0)
    (wf,) = res.failures
    assert wf.violation.invariant == INV
    return plan, wf


def test_preshrink_deletes_whole_steps_and_keeps_the_invariant(found):
    plan, wf = found
    guard = H.CallGuard(plan.timeout, plan.guard_mode)
    guard.install()
    try:
        v0, consumed, starts0 = walk.replay_choices(plan, guard, len(wf.choices), list(wf.choices))
        pre = walk.preshrink(plan, wf, guard)
        v1, again, starts1 = walk.replay_choices(plan, guard, len(wf.choices), pre.choices)
    finally:
        guard.uninstall()
    assert v0 is not None and v0.invariant == INV
    assert pre.steps_before == len(starts0) >= 20
    # steps deleted, within the replay count, and the result fails with the same invariant on its own
    assert 1 <= pre.steps_after <= pre.steps_before // 4, (pre.steps_before, pre.steps_after)
    assert pre.kept >= 1 and pre.replays <= walk.PRESHRINK_REPLAYS
    assert pre.violation is not None and pre.violation.invariant == INV
    assert len(pre.violation.trace) == pre.steps_after
    assert v1 is not None and v1.invariant == INV and len(starts1) == pre.steps_after and again == pre.choices
    # whole steps: the steps left are steps of the original run, in order, each starting with the same
    # choices (its "stop?" flag and its action); the draws after may change with the state the
    # deleted steps no longer leave (e.g. fewer live objects to pick from)
    orig, left = _chunks(consumed, starts0), _chunks(pre.choices, starts1)
    it = iter(orig)
    assert all(any(c[:2] == o[:2] for o in it) for c in left), (orig, left)
    it = iter(ts.action for ts in v0.trace)
    assert all(any(a == b for b in it) for a in (ts.action for ts in pre.violation.trace))

def test_preshrink_is_bounded_by_its_replay_count(found):
    plan, wf = found
    guard = H.CallGuard(plan.timeout, plan.guard_mode)
    guard.install()
    try:
        one = walk.preshrink(plan, wf, guard, replays=1)       # the first replay only: the tail dropped
        three = walk.preshrink(plan, wf, guard, replays=3)
    finally:
        guard.uninstall()
    assert one.replays == 1 and one.kept == 0 and one.steps_after == one.steps_before
    assert one.violation is not None and one.violation.invariant == INV
    assert three.replays == 3 and three.steps_after <= one.steps_before


def test_preshrink_keeps_the_walk_choices_when_the_replay_does_not_fail(found):
    plan, wf = found
    other = walk.WalkFailure(wf.violation, wf.seed, wf.run_index, wf.choices[: 2], wf.steps)
    guard = H.CallGuard(plan.timeout, plan.guard_mode)
    guard.install()
    try:
        pre = walk.preshrink(plan, other, guard)
    finally:
        guard.uninstall()
    assert pre.violation is None and pre.choices == list(other.choices) and pre.replays == 1


def test_shrink_after_the_preshrink_fails_with_the_same_invariant_and_replays(found):
    plan, wf = found
    v = walk.shrink(plan, wf)
    assert v is not None and v.invariant == INV and 1 <= len(v.trace) <= 10
    guard = H.CallGuard(plan.timeout, plan.guard_mode)
    again = runner._replay_steps(plan, guard, 16 * MiB, [(ts.action, list(ts.choices)) for ts in v.trace])
    assert again is not None and again.invariant == INV


def test_fuzz_walk_writes_a_reproduction_that_fails(tmp_path):
    out = tmp_path / "fuzz.json"
    rc = fuzz.main([TARGET, "--mode", "walk", "--until-failure", "--jobs", "1", "--minutes", "1",
                    "--capacity", str(16 * MiB), "--db", str(tmp_path / "db"), "--out", str(tmp_path / "repro"),
                    "--quiet", "--json", str(out)])
    import json

    doc = json.loads(out.read_text())
    assert rc == 1
    (f,) = doc["failures"]
    assert f["invariant"] == INV and f["repro"] and f["steps"] <= 10, f
    p = subprocess.run([sys.executable, f["repro"]], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and INV in p.stdout + p.stderr, (p.returncode, p.stdout[-800:], p.stderr[-800:])


def _record_shrink_ceilings(monkeypatch) -> list:
    """Hypothesis's shrink ceiling (``MAX_SHRINKING_SECONDS``) each time the shrink's test runs."""
    from hypothesis.internal.conjecture import engine

    ceilings: list = []
    real_test = walk.shrink_test

    def test_spy(*a, **k):
        inner = real_test(*a, **k)
        hyp_test = inner.hypothesis.inner_test

        def record(*ia, **ik):
            ceilings.append(engine.MAX_SHRINKING_SECONDS)
            return hyp_test(*ia, **ik)

        inner.hypothesis.inner_test = record
        return inner

    monkeypatch.setattr(walk, "shrink_test", test_spy)
    return ceilings


def test_preshrink_counts_inside_the_shrink_seconds(found, monkeypatch):
    """The pre-shrink is part of ``--shrink-seconds``: with a budget already spent it makes only its
    first replay (the tail dropped), and Hypothesis's shrink gets what the pre-shrink left (here 0),
    not the whole budget again.  No wall-clock verdict: the budgets are 0 or in the past."""
    from hypothesis.internal.conjecture import engine

    plan, wf = found
    guard = H.CallGuard(plan.timeout, plan.guard_mode)
    guard.install()
    try:
        spent = walk.preshrink(plan, wf, guard, until=walk.time.perf_counter() - 1.0)
    finally:
        guard.uninstall()
    assert spent.replays == 1 and spent.kept == 0 and spent.violation is not None

    seen = []
    real = walk.preshrink

    def spy(*a, **k):
        seen.append(k.get("until"))
        return real(*a, **k)

    ceilings = _record_shrink_ceilings(monkeypatch)
    monkeypatch.setattr(walk, "preshrink", spy)
    with runner.shrink_budget(0.0):
        v = walk.shrink(plan, wf)
        restored = engine.MAX_SHRINKING_SECONDS
    # the caller's ceiling (0 s): the pre-shrink ends at once and Hypothesis's shrink gets 0 s too
    assert v is not None and v.invariant == INV
    assert seen and seen[0] is not None and seen[0] <= walk.time.perf_counter()
    assert ceilings and set(ceilings) == {0.0}, ceilings
    assert restored == 0.0   # the caller's ceiling again after the shrink
    assert engine.MAX_SHRINKING_SECONDS != 0.0   # restored after both contexts


def test_hypothesis_shrink_gets_the_budget_less_the_preshrink(found, monkeypatch):
    """A fake clock (no wall time): the pre-shrink "takes" 600 of the caller's 1000 s, so
    Hypothesis's shrink runs under a 400 s ceiling, and the caller's 1000 s is restored after."""
    from types import SimpleNamespace

    from hypothesis.internal.conjecture import engine

    plan, wf = found
    now = [5000.0]
    monkeypatch.setattr(walk, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    real = walk.preshrink

    def slow(*a, **k):
        out = real(*a, **k)
        now[0] += 600.0
        return out

    ceilings = _record_shrink_ceilings(monkeypatch)
    monkeypatch.setattr(walk, "preshrink", slow)
    with runner.shrink_budget(1000.0):
        v = walk.shrink(plan, wf)
        restored = engine.MAX_SHRINKING_SECONDS
    assert v is not None and v.invariant == INV
    assert ceilings and set(ceilings) == {400.0}, ceilings
    assert restored == 1000.0
