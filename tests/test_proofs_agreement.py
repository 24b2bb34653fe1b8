"""Encoding agreement: on >= 1,000 reachable spec states per encoded action,
the Z3 relation and the executable spec's step give the same outcome and
next state; and a relation that differs from the spec is caught."""

from __future__ import annotations

import pytest

from memspec.invariants import proofs_seed000 as E
from memspec.invariants.agreement import _share, walk_and_compare
from memspec.invariants.agreement_adapters import run_all as run_agreement
from memspec.invariants.proofs import Proof

SAMPLES = 400


@pytest.fixture(scope="module")
def reports():
    return run_agreement(samples=SAMPLES, seed=0, inv_samples=50)


def test_every_encoded_action_agrees_with_the_spec(reports) -> None:
    bad = [f"{r.invariant}/{r.action}: {m}" for r in reports for m in r.mismatches]
    assert not bad, "\n".join(bad[:10])
    from memspec.invariants.agreement_adapters import MECH_ADAPTERS, SYS_ADAPTERS, TICKET_ADAPTERS

    cap = {(i, a.action, a.spec_action): min(a.max_samples or SAMPLES, _share(SAMPLES, a.weight))
           for a in MECH_ADAPTERS + SYS_ADAPTERS + TICKET_ADAPTERS for i in (a.invariant,) + a.also}
    got: dict = {}  # the extra walks (small device, focused, bare mechanism) add reports for the same adapters
    for r in reports:
        got[(r.invariant, r.action, r.spec_action)] = got.get((r.invariant, r.action, r.spec_action), 0) + r.samples
    short = [f"{k[0]}/{k[1]}: {n}" for k, n in got.items() if n < min(SAMPLES, cap.get(k, SAMPLES))]
    assert not short, short


def test_invariant_agreement_is_measured_and_finds_the_known_gaps(reports) -> None:
    """The encoded invariant is evaluated on every sampled projection: it
    agrees where the encoding models the whole state (S13, S15, and the
    ledger model of S8 / S11: grants, tickets, every charge item, the device)."""
    by = {}
    for r in reports:
        n, bad = by.get(r.invariant, (0, 0))
        by[r.invariant] = (n + r.inv_samples, bad + len(r.inv_disagreements))
    assert by["S13"][0] > 0 and by["S13"][1] == 0
    assert by["S15"][0] > 0 and by["S15"][1] == 0
    for inv in ("S8", "S11"):
        assert by[inv][0] > 0 and by[inv][1] == 0, (inv, by[inv])


def test_agreement_covers_the_mechanism_invariants(reports) -> None:
    covered = {r.invariant for r in reports}
    assert {"S1", "S2", "S3", "S4", "S5", "S7", "S8", "S9", "S10", "S11", "S13", "S14", "S15"} <= covered


def test_a_relation_that_differs_from_the_spec_is_caught() -> None:
    """The unguarded Governor reserve (grants more than is free) disagrees with the spec's."""
    from memspec.invariants.agreement_adapters import SYS_ADAPTERS, _sys_init, _sys_too_big
    from memspec.spec.system import SYSTEM

    wrong = Proof(**{**E.S11.__dict__, "actions": [E.S11.unguarded if a.name == "reserve" else a
                                                   for a in E.S11.actions]})
    from dataclasses import replace

    # S11's adapter alone (not credited to S8, whose reserve keeps its guard), uncapped
    ad = [replace(a, also=(), max_samples=None, weight=1.0) for a in SYS_ADAPTERS
          if a.invariant == "S11" and a.action == "reserve"]
    reps = walk_and_compare(SYSTEM, _sys_init, ad, {"S11": wrong}, 300, 1, _sys_too_big)
    assert reps[0].samples == 300
    assert reps[0].outcomes.get("GrantDenied", 0) > 0
    assert reps[0].mismatches, "a Governor that grants more than is free agreed with the spec"


# --------------------------------------------------------------------------
# S1, S2, S4, S7, S10: every branch sampled; a wrong relation is caught
# --------------------------------------------------------------------------

MINE = ("S1", "S2", "S4", "S7", "S10")


def test_every_branch_of_the_queue_and_charge_encodings_is_sampled(reports) -> None:
    """Each encoded action of S1, S2, S4, S7, S10 with a spec counterpart is
    compared on every branch the encoding can take, and its invariant
    agrees with the spec's on every sampled state."""
    from memspec.invariants.proofs import branches

    proofs = {p.id: p for p in E.PROOFS}
    for inv in MINE:
        p = proofs[inv]
        mine = [r for r in reports if r.invariant == inv]
        assert sum(r.inv_samples for r in mine) > 0 and not [d for r in mine for d in r.inv_disagreements], inv
        for act in p.actions:
            for spec_action in act.spec:
                name = spec_action.split(":")[1]
                got = {}
                for r in mine:
                    if r.action == act.name and r.spec_action == name:
                        for b, n in r.branches.items():
                            got[b] = got.get(b, 0) + n
                missing = [b for b in branches(p, act) if not got.get(b)]
                assert not missing, f"{inv}/{act.name} <- {spec_action}: no samples of {missing}"


def _walk_with(inv: str, action: str, replacement, samples: int = 150):
    """Every adapter of ``inv`` (so the walk also makes what the action needs,
    e.g. foreign handles), with ``replacement`` in place of ``action``."""
    from dataclasses import replace

    from memspec.invariants.agreement_adapters import MECH_ADAPTERS, SYS_ADAPTERS, _mech_init, _mech_too_big, \
        _sys_init, _sys_too_big
    from memspec.spec.mechanism import MECHANISM
    from memspec.spec.system import SYSTEM

    p = {x.id: x for x in E.PROOFS}[inv]
    wrong = Proof(**{**p.__dict__, "actions": [replacement if a.name == action else a for a in p.actions]})
    mine = lambda ads: [replace(a, invariant=inv, also=()) for a in ads  # noqa: E731
                        if a.invariant == inv or inv in a.also]
    mech = [a for a in mine(MECH_ADAPTERS) if a.action == action]
    if mech:
        reps = walk_and_compare(MECHANISM, _mech_init, mine(MECH_ADAPTERS), {inv: wrong}, samples, 1, _mech_too_big)
    else:
        reps = walk_and_compare(SYSTEM, _sys_init, mine(SYS_ADAPTERS), {inv: wrong}, samples, 1, _sys_too_big)
    return [r for r in reps if r.action == action]


@pytest.mark.parametrize("inv", MINE)
def test_the_unguarded_variant_disagrees_with_the_spec(inv: str) -> None:
    """The encoding without its guard (a poll that frees before the fences,
    a destroy_context that ignores pins, a commit_owned charged for less than
    it maps, a deallocate that accepts foreign handles, a drop that frees) is
    not the spec's action: the walk finds a state where they differ."""
    p = {x.id: x for x in E.PROOFS}[inv]
    # a poll with a release whose fences are still running needs use, drop, poll in that order: more samples
    reps = _walk_with(inv, p.unguarded.name, p.unguarded, samples=400 if inv == "S4" else 150)
    assert sum(r.samples for r in reps) > 0
    assert [m for r in reps for m in r.mismatches], f"{inv}: {p.unguarded.name} without its guard agreed"


@pytest.mark.parametrize("inv_id", ["S5", "S12", "S13", "S14"])
def test_mechanism_invariants_agree_on_every_branch(reports, inv_id: str) -> None:
    """S5, S12, S13, S14: every encoded action has a spec counterpart, every
    outcome branch Z3 finds for it was sampled and agreed, and the encoded
    invariant agrees with the spec's on every sampled state."""
    from memspec.invariants.proofs import branches

    p = [x for x in E.PROOFS if x.id == inv_id][0]
    mine = [r for r in reports if r.invariant == inv_id]
    assert not [m for r in mine for m in r.mismatches]
    assert sum(r.inv_samples for r in mine) > 0
    assert not [d for r in mine for d in r.inv_disagreements]
    for a in p.actions:
        got: dict[str, int] = {}
        for r in mine:
            if r.action == a.name:
                for b, n in r.branches.items():
                    got[b] = got.get(b, 0) + n
        missing = [b for b in branches(p, a) if not got.get(b)]
        assert not missing, f"{inv_id}/{a.name}: branches never sampled: {missing}"


@pytest.mark.parametrize("inv_id,spec_action", [("S5", "reserve_owned"), ("S12", "commit_owned")])
def test_an_unguarded_variant_disagrees_with_the_spec(inv_id: str, spec_action: str) -> None:
    """The guard removed (reserve without VirtualBacking; a commit past the
    reservation that moves it) is what the spec refuses: agreement catches it."""
    from memspec.invariants.agreement_adapters import SYS_ADAPTERS, _sys_init, _sys_too_big
    from memspec.spec.system import SYSTEM

    p = [x for x in E.PROOFS if x.id == inv_id][0]
    wrong = Proof(**{**p.__dict__, "actions": [p.unguarded if a.name == p.unguarded.name else a for a in p.actions]})
    ad = [a for a in SYS_ADAPTERS if a.invariant == inv_id and a.spec_action == spec_action]
    reps = walk_and_compare(SYSTEM, _sys_init, ad, {inv_id: wrong}, 150, 1, _sys_too_big)
    assert reps[0].samples == 150
    assert reps[0].mismatches, f"{inv_id}: the unguarded {spec_action} agreed with the spec"


@pytest.mark.parametrize("inv_id", ["S8", "S11"])
def test_ledger_model_agrees_on_every_branch(reports, inv_id: str) -> None:
    """S8 / S11 (one ledger model, the device included): every spec action
    that declares the invariant is compared on every outcome branch Z3 finds
    for its encoding, with no mismatch, and the encoded invariant agrees with
    the spec's on every sampled state."""
    from memspec.invariants.proofs import branches
    from memspec.invariants.proofs_catalog import declared

    p = [x for x in E.PROOFS if x.id == inv_id][0]
    mine = [r for r in reports if r.invariant == inv_id]
    assert not [m for r in mine for m in r.mismatches]
    assert sum(r.inv_samples for r in mine) > 0 and not [d for r in mine for d in r.inv_disagreements]
    compared = set()
    for a in p.actions:
        for spec_action in a.spec:
            name = spec_action.split(":")[1]
            got: dict[str, int] = {}
            for r in mine:
                if r.action == a.name and r.spec_action == name:
                    for b, n in r.branches.items():
                        got[b] = got.get(b, 0) + n
            missing = [b for b in branches(p, a) if not got.get(b)]
            assert not missing, f"{inv_id}/{a.name} <- {spec_action}: branches never sampled: {missing}"
            compared.add(spec_action)
    assert set(declared(inv_id)) <= compared
