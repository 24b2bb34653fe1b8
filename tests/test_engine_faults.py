"""The rare-branch quota for failure paths (issue 12: every shipped mutant
killed at the CI profile).  An outcome whose one answer is *any* error of
the contract is a failure the caller's arguments injected (a fault at a
step of a transaction): the spec can only refuse it, so the guidance that
prefers accepting draws would drop it, yet only such a step shows a real
implementation's rollback.  Each test compares a structure or counts on the
same draws with and without the quota, so each can fail."""

from __future__ import annotations

import random

from memspec.invariants import draws as D
from memspec.invariants import engine as E
from memspec.invariants.choosers import RandomChooser
from memspec.invariants.planning import make_plan
from memspec.spec.api import MiB
from memspec.spec.core import Raises, Returns, only, outcomes
from memspec.spec.errors import GrantDenied, MemspecError


def test_a_failure_path_is_an_outcome_that_accepts_any_error_of_the_contract():
    inj = only(MemspecError, blame="S9", describe="injected failure at step 4: rolled back")
    assert D.failure_path(inj) == "injected failure at step 4: rolled back"
    # sizes in the description do not make new paths; the step does
    big = only(MemspecError, blame="S9", describe="injected failure at step 5 after 2097152 bytes")
    assert D.failure_path(big) == "injected failure at step 5 after N bytes"
    # a refusal the state forces names its class; an outcome with an accepting branch is no failure path
    assert D.failure_path(only(GrantDenied, blame="S9", describe="4096 > free 0")) is None
    assert D.failure_path(outcomes(Returns("0"), Raises(MemspecError), blame="S9")) is None
    assert D.failure_path(None) is None


def _failure_steps(plan, examples: int) -> tuple[int, int]:
    """(steps whose spec outcome was a failure path, examples with one), 40
    random steps per example on fresh targets, seeds 0..examples-1."""
    got = []
    orig = E.Run.apply

    def apply(self, action, args, choices=None):
        got.append(D.failure_path(D._spec_outcomes(action, self.state, args)) is not None)
        return orig(self, action, args, choices)

    steps = hit = 0
    E.Run.apply = apply
    try:
        for seed in range(examples):
            ch = RandomChooser(random.Random(seed))
            run = E.Run(plan, chooser=ch)
            del got[:]
            for _ in range(40):
                run.step(ch)
            run.close()
            steps += sum(got)
            hit += any(got)
    finally:
        E.Run.apply = orig
    return steps, hit


def test_the_quota_keeps_failure_paths_the_guidance_would_drop(monkeypatch):
    """Reference, system level, the same seeds: with the quota more steps
    take an injected failure and more examples have one; without it (quota
    0: a failure path is a refusal like any other) the guidance redraws
    most of them away.  The quota is per example: no example keeps more
    than ``FAULT_QUOTA`` of an action's failure draws by its hunt."""
    plan = make_plan("reference", "system", capacity=16 * MiB)
    with_q = _failure_steps(plan, 60)
    monkeypatch.setattr(D, "FAULT_QUOTA", 0)
    without = _failure_steps(plan, 60)
    assert with_q[0] > without[0] and with_q[1] > without[1], (with_q, without)


def test_a_failure_draw_is_kept_and_counted_per_example():
    plan = make_plan("reference", "system", capacity=16 * MiB)
    kept = 0
    for seed in range(40):
        ch = RandomChooser(random.Random(seed))
        run = E.Run(plan, chooser=ch)
        for _ in range(40):
            run.step(ch)
        # what the hunt kept, per action: never past the quota; each kept path is named
        assert all(n <= D.FAULT_QUOTA for n in run._faulted.values()), run._faulted
        assert sum(run._fault_paths.values()) == sum(run._faulted.values())
        kept += sum(run._faulted.values())
        run.close()
    assert kept > 0
