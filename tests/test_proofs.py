"""Z3: every invariant S1-S15 is inductive over its encoded actions, and the
unguarded variant of its guarding action is refuted by a concrete trace."""

from __future__ import annotations

import pytest
import z3

from memspec.invariants.proofs import Act, Proof, St, on_ok, outcome, prove, refute_unguarded
from memspec.invariants.proofs_seed000 import PROOFS

from memspec.spec.invariants import IDS


def test_catalog_covers_every_invariant() -> None:
    assert [p.id for p in PROOFS] == list(IDS)


@pytest.mark.parametrize("proof", PROOFS, ids=[p.id for p in PROOFS])
def test_proved_and_unguarded_refuted(proof: Proof) -> None:
    r = prove(proof)
    failed = [f"{c.name}: {c.detail}" for c in r.checks if not c.ok]
    assert not failed, failed
    assert {c.name for c in r.checks} >= {"init"} | {f"step:{a.name}" for a in proof.actions}
    # a model that stops catching its own counterexample is broken
    assert r.unguarded_refuted, f"{proof.id}: unguarded variant ({proof.guard}) was not refuted: {r.unguarded_trace}"
    assert "[unguarded]" in r.unguarded_trace
    assert "=>" in r.unguarded_trace


def test_a_broken_invariant_is_not_proved() -> None:
    """The engine reports a counterexample, not 'proved', for a false claim:
    S11 with the Governor's can_grant guard dropped from the *guarded* action."""
    from memspec.invariants import proofs_seed000 as m

    bad = Proof(**{**m.S11.__dict__, "actions": [m.S11.unguarded] + m.S11.actions[1:]})
    r = prove(bad)
    step = [c for c in r.checks if c.name == "step:reserve"][0]
    assert not step.ok and "free" in step.detail


def test_refutation_fails_when_the_variant_keeps_its_guard() -> None:
    """refute_unguarded finds nothing when the 'unguarded' action is the guarded one."""
    from memspec.invariants import proofs_seed000 as m

    same = Proof(**{**m.S10.__dict__, "unguarded": m.S10.action("destroy_context")})
    ok, why = refute_unguarded(same)
    assert not ok and "no violation" in why
