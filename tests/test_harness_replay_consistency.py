"""When Hypothesis draws the same choices differently (``FlakyStrategyDefinition``).

A draw whose bounds depend on the target's earlier answers (the room left on
the device, the live allocations to pick from) differs when the target
answers the same steps differently -- its answers then depend on more than the
calls made (its history, an address the OS picked) -- and it differs when the
harness's own draws depend on something carried from one example to the next.
Only the first is the target's: the run says which, with the evidence (a step
the target answered differently on a fresh instance), and judges the target by
seeded random walks, whose draws need no replay.  Never a spec error, never a
claim about the target that no replay showed.
"""

from __future__ import annotations

import itertools
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from memspec.invariants import draws, runner  # noqa: E402
from memspec.invariants import engine as E  # noqa: E402
from memspec.invariants.guard import CallGuard  # noqa: E402
from memspec.invariants.planning import make_plan  # noqa: E402

HISTORY = "tests.planted_allocators:history_dependent"
FOOTPRINT = "tests.planted_allocators:history_footprint"
CORRECT = "tests.planted_allocators:by_value_ok"


def _conform(target: str):
    results = runner.conform(target, "mechanism", examples=30, steps=20, out_dir=None)
    assert [r.level for r in results] == ["mechanism"]
    return results[0]


class _Inconsistent:
    """A chooser whose draws Hypothesis finds inconsistent with an earlier example's."""

    def weighted(self, weights: tuple) -> int:
        return 0

    def integer(self, lo: int, hi: int) -> int:
        from hypothesis.errors import FlakyStrategyDefinition

        raise FlakyStrategyDefinition("Inconsistent data generation! (planted)")

    def boolean(self) -> bool:
        return False


def test_an_inconsistent_draw_reaches_hypothesis_as_itself_not_as_a_spec_error():
    """The spec's argument draws wrapped whatever they raised in a SpecError: Hypothesis's own
    FlakyStrategyDefinition, raised by the chooser, read as a defect of the spec, and Hypothesis
    took it for the example's failure."""
    from hypothesis.errors import FlakyStrategyDefinition

    plan = make_plan(CORRECT, "mechanism", guard_mode="thread")
    run = E.Run(plan, CallGuard(5.0, "thread"))
    try:
        allocate = plan.machine.action("allocate")
        with pytest.raises(FlakyStrategyDefinition):
            run._draw_args(allocate, _Inconsistent())          # the guided draws
        with pytest.raises(FlakyStrategyDefinition):
            draws._draw(allocate, run.state, _Inconsistent())  # the plain ones
    finally:
        run.close()


def test_a_target_whose_answers_depend_on_its_history_is_judged_with_the_evidence():
    r = _conform(HISTORY)
    assert not r.errors, r.errors
    assert "NONDET" not in {f.invariant for f in r.failures}
    assert len(r.notes) == 1, r.notes
    note = r.notes[0]
    # the evidence: the first step the target answered differently, both answers
    assert "the target answered the same steps differently" in note, note
    assert "step 1 allocate(" in note and "raises OutOfMemory" in note and "returns an allocation" in note, note
    assert "on a fresh instance" in note and "judged by seeded random walks instead" in note, note
    # a correct allocator: a verdict on every row, no FAIL (OutOfMemory is an answer the spec permits it)
    statuses = {inv: st for inv, _t, st, _d in r.rows()}
    assert statuses["S1"] == statuses["S8"] == statuses["S14"] == "PASS", statuses


def test_inconsistent_draws_of_the_harness_are_an_error_never_blamed_on_the_target(monkeypatch):
    """A draw of the harness whose bounds depend on how many examples ran before (state carried
    from one example to the next): the same choices draw differently with a target whose answers
    are a function of the calls.  No replay shows the target answering differently, so the run
    says so as a harness error; before, its note said the target had answered differently."""
    count = itertools.count()
    swarm = draws.Draws._draw_swarm

    def carried(self, chooser):
        chooser.integer(0, 1 + next(count) % 2)   # the planted defect
        return swarm(self, chooser)

    monkeypatch.setattr(draws.Draws, "_draw_swarm", carried)
    r = _conform(CORRECT)
    assert r.errors and r.errors[0].startswith("harness error: Hypothesis drew the same choices differently"), \
        r.errors
    assert "not the target's" in r.errors[0], r.errors
    assert not any("the target answered" in n for n in r.notes), r.notes
    assert not any(f.invariant == "NONDET" for f in r.failures)
    assert {st for _i, _t, st, _d in r.rows()} <= {"ERROR", "N/A", "\u2014"}


def test_a_deterministic_target_is_judged_by_hypothesis_alone():
    r = _conform(CORRECT)
    assert not r.errors and not r.notes and not r.failures, (r.errors, r.notes, r.failures)


@pytest.mark.parametrize("target, evidence", [
    (FOOTPRINT, ["step 1 allocate(size=4096, alignment=256): returns DeviceAllocation(", "footprint=4096",
                 "footprint=8192", "on one fresh instance", "on another"]),
    (CORRECT, None),
])
def test_the_evidence_is_an_answer_that_differs_on_a_fresh_instance(target, evidence):
    """The same branch with another value (a footprint, as glibc's) is evidence too: it is what the
    spec's state, hence the next draws, are made of.  A target that answers alike gives none (its
    fresh identities are no evidence: every instance has its own)."""
    from memspec.invariants.stateful import replay_evidence

    plan = make_plan(target, "mechanism", guard_mode="thread")
    run = E.Run(plan, CallGuard(5.0, "thread"))
    try:
        # two allocations: their branch reads the same whatever the footprint (a deallocate's would not)
        allocate = plan.machine.action("allocate")
        run.apply(allocate, {"size": 4096, "alignment": 256})
        run.apply(allocate, {"size": 3 * 4096, "alignment": 256})
    finally:
        run.close()
    got, made = replay_evidence(plan, run)
    if evidence is None:
        assert got is None and made == 3, got
    else:
        assert got is not None and all(w in got for w in evidence), got
