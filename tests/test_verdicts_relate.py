"""Several failures of one run, each blamed on the rule broken (issue 12,
deliverable 6): a failure is a consequence of another rule's when that rule
breaks in its state and not the other way round (``runner.relate``)."""

from __future__ import annotations

from memspec.invariants import runner
from memspec.spec.api import MiB

#: cuda-host-unmap-before-fence: the holder's answer polls the EP, which runs a KV release
#: before its fence; the answer's own ledger total (S11) is the first figure off
_ANSWER = [("issue_ticket", [1, 1, False, 1, 0]), ("new_stream", []), ("kv_open", [4]), ("kv_grow", [0, 0, 1, 0]),
           ("kv_use", [0, 0]), ("kv_close", [0]), ("respond", [0, 0])]
#: the same bug met at a poll: the release runs although its fence is not done (S4)
_POLL = [("allocate_owned", [0, 1]), ("new_stream", []), ("use", [0, 0]), ("drop", [0]), ("poll", [])]
#: fence-read-on-default-stream: the holder's answer raises while the EP reads a fence (S6, the answer's
#: rule), and so does a poll (S4)
_ANSWER_RAISES = [("issue_ticket", [1, 1, False, 1, 0]), ("new_stream", []), ("allocate_owned", [0, 1]),
                  ("use", [0, 0]), ("drop", [0]), ("respond", [0, 0])]


#: the holder's answer checks the queue it drains (S4's clause on ``respond``, spec/holders.py), so an
#: early release is named S4 at that very step; the tests of relating figures mask that clause, as a
#: later pass of a run would, so that the answer shows only its figures again
_RESPOND_S4 = ("respond", "S4.release-before-fence")


def test_the_answer_that_drains_an_early_release_is_blamed_on_s4_at_once():
    _plan, (answer,) = _failures("mutant:cuda-host-unmap-before-fence", (_ANSWER, 117), masks=())
    assert (answer.invariant, answer.cause) == ("S4", "outcome") and "breaks S4.release-before-fence" in answer.reason
    ref, _ = _failures("reference", masks=())
    assert runner._replay_steps(ref, runner.CallGuard(ref.timeout, ref.guard_mode), 16 * MiB, _ANSWER) is None


def _failures(target: str, *runs: tuple, masks=(_RESPOND_S4,)) -> tuple:
    plan = runner.make_plan(target, "system", capacity=16 * MiB)
    plan.masks = frozenset(masks)
    guard = runner.CallGuard(plan.timeout, plan.guard_mode)
    out = []
    for steps, det in runs:
        v = runner._replay_steps(plan, guard, 16 * MiB, steps)
        assert v is not None, "the recorded steps no longer fail (the spec draws them differently now?)"
        out.append(runner.Failure(target, "system", v.invariant, v.cause, v.reason, list(v.trace), det,
                                  capacity=16 * MiB))
    return plan, out


def test_a_ledger_total_off_where_the_fence_rule_breaks_is_a_consequence_of_the_fence_rule():
    """A *figure* (the answer's ledger total, cause ``observation``) is a
    symptom: it is related to the rule broken when a replay shows that rule
    breaking in the figure's state (the poll's step, played where the answer
    failed, fails S4) and not the other way round."""
    plan, (answer, poll) = _failures("mutant:cuda-host-unmap-before-fence", (_ANSWER, 117), (_POLL, 191))
    assert (answer.invariant, answer.cause) == ("S11", "observation")
    assert (poll.invariant, poll.cause) == ("S4", "outcome")
    for order in ([answer, poll], [poll, answer]):
        (only,) = runner.relate(plan, order)
        assert (only.invariant, only.cause) == ("S4", "outcome")
        assert only.trace == poll.trace
        assert only.steps_to_detection == 117
        assert any(c.startswith("S11 [observation] (step 7) governor.free") for c in only.consequences)


def test_a_call_the_spec_forbids_is_never_presumed_another_rules_consequence():
    """Issue 31: *a consequence is proved, not presumed*.  A holder's answer
    that raises (S6, a call the spec forbids: a rule, not a figure) and the
    fence rule broken at a poll keep their own rows: neither reproduction
    runs through the other's broken step (the old rule -- ``b``'s rule
    breaks in ``a``'s state -- filed a true S14 bug under a false S8)."""
    plan, (answer, poll) = _failures("mutant:fence-read-on-default-stream", (_ANSWER_RAISES, 177), (_POLL, 793))
    assert (answer.invariant, answer.cause) == ("S6", "outcome")
    for order in ([answer, poll], [poll, answer]):
        kept = runner.relate(plan, order)
        assert sorted(f.invariant for f in kept) == ["S4", "S6"]


def test_a_failure_through_anothers_masked_step_is_its_consequence():
    """A later pass masks the first failure's check and finds a second one
    whose steps run through the first's broken step: without that step it no
    longer fails, so it is listed as the first's consequence (proved by the
    replay), and a failure that needs no such step keeps its own row."""
    plan, (answer, poll) = _failures("mutant:fence-read-on-default-stream", (_ANSWER_RAISES, 177), (_POLL, 793))
    assert poll.invariant == "S4"
    # the poll's S4 masked: an example whose S6 failure comes after a masked S4 step that it needs
    poll.key = ("poll", "S4.outcome")
    plan.masks = frozenset({poll.key})
    guard = runner.CallGuard(plan.timeout, plan.guard_mode)
    steps = _POLL + [("issue_ticket", [1, 1, False, 1, 0]), ("respond", [0, 0])]
    v = runner._replay_steps(plan, guard, 16 * MiB, steps)
    plan.masks = frozenset()
    if v is None or v.invariant == "S4":
        return   # the continuation shows nothing past the masked poll: nothing to relate
    later = runner.Failure("t", "system", v.invariant, v.cause, v.reason, list(v.trace), 900, capacity=16 * MiB,
                           check=getattr(v, "check", None), key=getattr(v, "key", None))
    plan.masks = frozenset({poll.key, later.key})
    try:
        out = runner.relate(plan, [poll, later])
    finally:
        plan.masks = frozenset()
    alone = runner._replay_steps(plan, guard, 16 * MiB, [(t.action, list(t.choices)) for t in later.trace])
    if alone is not None and alone.invariant == later.invariant and len(alone.trace) == len(later.trace):
        assert len(out) == 2          # it fails on its own: its own row
    else:
        (only,) = out                 # it needs the masked poll: the poll's consequence
        assert only is poll and any(c.startswith(later.invariant) for c in only.consequences)


def test_two_failures_of_rules_each_fine_in_the_others_state_both_stay():
    """The reference implementation with the same steps fails nothing; two
    failures that do not break each other's rule are both kept (a fence rule
    broken at a poll, and the same fence rule: no relation within one rule)."""
    plan, (a, b) = _failures("mutant:cuda-host-unmap-before-fence", (_POLL, 10), (_POLL, 20))
    assert len(runner.relate(plan, [a, b])) == 2       # one rule: nothing to relate
    ref = runner.make_plan("reference", "system", capacity=16 * MiB)
    guard = runner.CallGuard(ref.timeout, ref.guard_mode)
    assert runner._replay_steps(ref, guard, 16 * MiB, _ANSWER) is None
    assert runner._replay_steps(ref, guard, 16 * MiB, _POLL) is None


def test_the_ledger_total_off_with_other_rules_figures_is_continued_to_the_rule_broken():
    """Alone in its run, the holder's answer whose poll ran a KV release
    before its fence shows S11's total first (the answer declares S11), with
    the pins and the queue length off too: the diagnosis continues past it
    (``synchronize``, then ``poll``) and names S4."""
    plan, (answer,) = _failures("mutant:cuda-host-unmap-before-fence", (_ANSWER, 117))
    assert runner._ledger(plan, "S11") and not runner._ledger(plan, "S4")
    assert answer.invariant == "S11" and "S10 [observation]" in answer.reason
    d = runner.diagnose(plan, answer)
    assert (d.invariant, d.cause) == ("S4", "outcome"), (d.invariant, d.reason)
    assert [t.action for t in d.trace][-2:] == ["synchronize", "poll"]
    assert d.consequences[0].startswith("S11 [observation] (step 7)")


def test_a_ledger_bug_alone_stays_blamed_on_the_ledger():
    """cancel-leaks-grant: only the ledger's total is off (the grant's bytes
    never return to free): that is the rule broken, no continuation."""
    plan, (f,) = _failures("mutant:cancel-leaks-grant", ([("reserve", [0]), ("cancel", [0])], 2))
    assert (f.invariant, f.cause) == ("S11", "observation") and "consequences" not in f.reason
    assert runner.diagnose(plan, f).invariant == "S11"
    # a small table's most declared rule is no ledger (the caching level: six actions)
    caching = runner.make_plan("reference-caching", "caching")
    assert not any(runner._ledger(caching, inv) for inv in caching.invariant_ids)
