"""S15, G1 (configuration generations) and S6 (holder-chooses) on one Z3 machine: every branch of
every encoded action is sampled on reachable spec states and agrees; and
P1 (progress): a request that fits after releases is admitted -- by Z3 for
an arbitrary state, and on the executable spec by a walk; planted breaks
are caught."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memspec.invariants.formal import proofs_seed000 as E
from memspec.invariants.formal.agreement import walk_and_compare
from memspec.invariants.formal.agreement_adapters import (
    TICKET_ADAPTERS, _Restricted, _sys_too_big, _tickets_init, run_all,
)
from memspec.invariants.formal.walks import TICKET_FOCUS
from memspec.invariants.formal.proofs import branches, prove


@pytest.fixture(scope="module")
def reports():
    # the quotas of ``memspec prove``'s default run (40 agreeing samples per branch, at most 400)
    return run_all(400, 0, 40, per_branch=40, walks=("tickets",))


def test_the_ticket_machine_rows_are_proved_with_nothing_assumed() -> None:
    for p in (E.S15, E.G1, E.S6):
        r = prove(p)
        assert r.proved and not r.assumed, [c.detail for c in r.checks if not c.ok]
        assert r.unguarded_refuted and "[unguarded]" in r.unguarded_trace


def test_every_branch_of_every_ticket_action_is_sampled_and_agrees(reports) -> None:
    for r in reports:
        p = {"S15": E.S15, "G1": E.G1, "S6": E.S6, "S11": E.S11}[r.invariant]  # S11's claim shares the walk
        want = set(branches(p, p.action(r.action)))
        assert not r.mismatches, r.mismatches[:2]
        assert not r.inv_disagreements and r.inv_samples > 0
        assert {b for b, n in r.branches.items() if n} == want, (r.invariant, r.action, r.branches, want)


def test_expire_that_ignores_the_deadline_disagrees() -> None:
    """The spec's expire times out only due tickets; an encoding that times out any live one is caught."""
    def expire_any(s, a):
        st = E.at(s.tstate, a.t)
        out = E.outcome((E._terminal(st), "InvalidTicket"))
        return E.on_ok(out, s, E._end(s, a.t, E.T_TIMED_OUT))

    wrong = replace(E.S15, actions=[replace(a, step=expire_any) if a.name == "expire" else a for a in E.S15.actions])
    # S15's alone (its adapter credits G1 and S6 too, on the unbroken machine)
    ads = [replace(a, also=()) for a in TICKET_ADAPTERS if a.invariant == "S15" and a.action == "expire"]
    from memspec.spec.system import SYSTEM

    reps = walk_and_compare(_Restricted(SYSTEM, TICKET_FOCUS), _tickets_init, ads, {"S15": wrong}, 150, 3,
                            _sys_too_big)
    assert reps[0].mismatches


def test_progress_is_proved_and_not_vacuous() -> None:
    from memspec.invariants.formal.proofs_progress import check_on_spec, prove_progress

    z = prove_progress()
    assert z.proved and not z.vacuous and z.refuted_without_fit, z
    w = check_on_spec(80, 0)
    assert w.samples == 80 and w.needing_release > 0 and not w.counterexamples, w.counterexamples[:1]


def test_progress_walk_fires_when_a_holder_cannot_release() -> None:
    from memspec.invariants.formal.proofs_progress import check_on_spec
    from memspec.spec import holders

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(holders, "victims", lambda s, released: [] if released == 0 else None)
        w = check_on_spec(60, 0)
    assert w.counterexamples and "respond" in w.counterexamples[0]


def test_progress_z3_fails_when_respond_never_grants() -> None:
    from memspec.invariants.formal.proofs_progress import prove_progress

    def never_grants(s, a):
        out, s2 = E._s15_respond(s, a)
        return out, s2.set(tstate=s.tstate)

    broken = replace(E.S15, actions=[replace(a, step=never_grants) if a.name == "respond" else a
                                     for a in E.S15.actions])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(E, "S15", broken)
        assert not prove_progress().proved
