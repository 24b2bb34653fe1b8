"""Z3: every invariant S1-S15 is inductive over its encoded actions, and the
unguarded variant of its guarding action is refuted by a concrete trace."""

from __future__ import annotations

import pytest
import z3

from memspec.invariants.formal.proofs import Act, Proof, St, on_ok, prove, refute_unguarded
from memspec.invariants.formal.proofs_seed000 import PROOFS

from memspec.spec.invariants import IDS


def test_catalog_covers_every_invariant() -> None:
    assert [p.id for p in PROOFS] == list(IDS)


@pytest.mark.fresh_process
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
    # nothing assumed and nothing bounded
    assert r.status == "proved" and r.assumed == [], r.assumed
    assert not proof.bounded or proof.id not in ("S5", "S12", "S13", "S14"), proof.bounded


def test_a_lemma_the_invariant_does_not_imply_is_reported_assumed() -> None:
    """The ledger model without its prefix-sum ghost for ``charged``: the
    lemma "a lease's bytes are at most what is charged" (needed to refund it)
    no longer follows, so the proof is conditional, not proved."""
    from memspec.invariants.formal import proofs_seed000 as m

    def weak_inv(s, o):  # the ledger invariant with the PC ghost (charged == sum over items) dropped
        full = m._l_inv(s, o)
        return z3.And(*[c for c in full.children() if "PC" not in str(c)])

    weak = Proof(**{**m.S11.__dict__, "inv": weak_inv, "actions": [m.S11.action("refund_lease")],
                    "lemmas": lambda s, o, a: z3.Implies(m.at(s.ist, a["x"]) == m.I_LEASE, m.at(s.ib, a["x"]) <= s.charged)
                    if "x" in a else z3.BoolVal(True)})
    r = prove(weak)
    assert r.assumed and r.status != "proved" and not r.proved
    # with the ghost the same lemma is derived, and nothing is assumed
    strong = Proof(**{**weak.__dict__, "inv": m._l_inv})
    r2 = prove(strong)
    assert r2.proved and r2.assumed == []


def test_ledger_model_encodes_every_action_declaring_s8() -> None:
    """S8's machine encodes every spec action whose table declares S8, and
    S11's every one."""
    from memspec.invariants.formal import proofs_seed000 as m
    from memspec.invariants.formal.proofs_catalog import declared, encoded

    assert set(declared("S8")) <= set(encoded(m.S8))
    # S11's every one, at both levels (the device side: allocations, reservations, handles, mappings)
    assert set(declared("S11")) <= set(encoded(m.S11))  # issue 33: and the reservation and KV paths
    assert {"mechanism:allocate", "mechanism:commit_range", "mechanism:unmap", "system:reconfigure"} <= set(encoded(m.S11))


def test_s8_unguarded_commit_breaks_s8_itself() -> None:
    """The unguarded commit (a committed or cancelled grant committed again)
    breaks S8's own conjunct: granted is no longer the open grants plus the
    tickets' holdings (the refutation is checked against S8's named
    invariant, not any conjunct of the ledger model)."""
    from memspec.invariants.formal import proofs_seed000 as m

    ok, trace = refute_unguarded(m.S8)
    assert ok and "invariant broken" in trace and "[unguarded]" in trace
    # the guarded commit keeps it: no violation of S8 within the same depth
    same = Proof(**{**m.S8.__dict__, "unguarded": m.S8.action("commit")})
    ok2, why = refute_unguarded(same)
    assert not ok2 and "no violation" in why


def test_catalog_is_read_from_the_spec() -> None:
    from memspec.spec.invariants import BY_ID

    for p in PROOFS:
        assert p.quote == BY_ID[p.id].quote and BY_ID[p.id].title.startswith(p.title)


def test_encoded_actions_are_checked_against_the_spec_tables() -> None:
    from dataclasses import replace

    from memspec.invariants.formal.proofs_catalog import declared, encoded

    s9 = [p for p in PROOFS if p.id == "S9"][0]
    assert declared("S9") == ["system:kv_grow"] and "system:kv_grow" in encoded(s9)  # issue 33: S9 encodes more
    bogus = replace(s9, actions=[replace(a, spec=("system:no_such_action",)) for a in s9.actions])
    with pytest.raises(ValueError, match="no spec machine"):
        encoded(bogus)


def test_a_broken_invariant_is_not_proved() -> None:
    """The engine reports a counterexample, not 'proved', for a false claim:
    S11 with the Governor's can_grant guard dropped from the *guarded* action."""
    from memspec.invariants.formal import proofs_seed000 as m

    bad = Proof(**{**m.S11.__dict__, "actions": [m.S11.unguarded]})
    r = prove(bad)
    step = [c for c in r.checks if c.name == "step:reserve"][0]
    # with quantified ghosts Z3 may answer unknown rather than give a model: either way, not proved
    assert not step.ok and r.status == "FAILED" and not r.proved
    ok, trace = refute_unguarded(m.S11)  # the concrete counterexample, from Init
    assert ok and "free=-" in trace


def test_refutation_fails_when_the_variant_keeps_its_guard() -> None:
    """refute_unguarded finds nothing when the 'unguarded' action is the guarded one."""
    from memspec.invariants.formal import proofs_seed000 as m

    same = Proof(**{**m.S10.__dict__, "unguarded": m.S10.action("destroy_context")})
    ok, why = refute_unguarded(same)
    assert not ok and "no violation" in why


# --------------------------------------------------------------------------
# S5, S12, S13, S14: every declaring action encoded; each guard is necessary
# --------------------------------------------------------------------------

@pytest.mark.parametrize("inv_id", ["S5", "S12", "S13", "S14"])
def test_mechanism_invariants_encode_every_declaring_action(inv_id: str) -> None:
    from memspec.invariants.formal.proofs_catalog import declared, encoded

    p = [x for x in PROOFS if x.id == inv_id][0]
    assert set(declared(inv_id)) <= set(encoded(p)), sorted(set(declared(inv_id)) - set(encoded(p)))


def _without_guard(p: Proof) -> Proof:
    """The proof with its guarded action replaced by the unguarded variant."""
    return Proof(**{**p.__dict__, "actions": [p.unguarded if a.name == p.unguarded.name else a for a in p.actions]})


@pytest.mark.fresh_process
@pytest.mark.parametrize("inv_id", ["S5", "S12", "S13", "S14"])
def test_removing_the_guard_breaks_the_proof(inv_id: str) -> None:
    """The unguarded variant is the same action with one guard removed: put in
    place of the guarded one, consecution fails at that action (the guard is
    what the proof rests on, not a body that cannot violate anything)."""
    p = [x for x in PROOFS if x.id == inv_id][0]
    r = prove(_without_guard(p))
    bad = [c.name for c in r.checks if not c.ok]
    assert f"step:{p.unguarded.name}" in bad, (bad, [c.detail for c in r.checks if not c.ok])
    assert not r.proved


def test_s12_guarded_commit_writes_the_base() -> None:
    """S12's committing actions share one body that re-reserves (moves the
    base) when the range does not fit: only the range guard keeps the address.
    S12 is on S5's VMM machine: its commit is the machine's commit_owned."""
    from memspec.invariants.formal import proofs_seed000 as m

    s = St({"ostate": z3.K(z3.IntSort(), z3.IntVal(m.LIVE)), "base": z3.K(z3.IntSort(), z3.IntVal(5)),
            "base0": z3.K(z3.IntSort(), z3.IntVal(5)), "osize": z3.K(z3.IntSort(), z3.IntVal(8)),
            "ocb": z3.K(z3.IntSort(), z3.IntVal(0)), "rcap": z3.K(z3.IntSort(), z3.BoolVal(True)),
            "nextva": z3.IntVal(100), "free": z3.IntVal(100), "cap": z3.BoolVal(True), "scap": z3.BoolVal(True),
            "ret": z3.IntVal(0)})
    a = St({"r": z3.IntVal(0), "lo": z3.IntVal(0), "hi": z3.IntVal(16), "bad": z3.BoolVal(False),
            "oom": z3.BoolVal(False)})
    assert m.S12.action("commit_owned").step is m.S5.action("commit_owned").step
    out, s2 = m.S12.unguarded.step(s, a)
    assert z3.simplify(out).as_long() == 0 and z3.simplify(at_(s2.base, 0)).as_long() == 100
    out, s2 = m.S12.action("commit_owned").step(s, a)
    assert z3.simplify(out).as_long() != 0 and z3.simplify(at_(s2.base, 0)).as_long() == 5


def at_(arr, i):
    return z3.Select(arr, i)
@pytest.mark.fresh_process
def test_s13_read_only_write_counter_can_fail() -> None:
    """``rowrites`` is the spec's readonly_writes: a write_through without the
    read-only guard counts one, and the invariant fails there."""
    from memspec.invariants.formal import proofs_seed000 as m

    unguarded = Act("write_through", {"m": "int"}, lambda s, a: on_ok(z3.IntVal(0), s, s.set(
        rowrites=s.rowrites + m.K.ite(z3.And(m.at(s.mro, a.m), z3.Not(m.at(s.mpriv, a.m))), 1, 0))),
        pre=lambda s, a: m.at(s.mlive, a.m))
    bad = Proof(**{**m.S13.__dict__, "actions": [unguarded if a.name == "write_through" else a for a in m.S13.actions]})
    r = prove(bad)
    assert not [c for c in r.checks if c.name == "step:write_through"][0].ok


@pytest.mark.parametrize("inv_id,action", [("S5", "commit_range"), ("S12", "kv_grow"), ("S13", "kv_open"),
                                           ("S14", "free_shared_reservation")])
def test_dropping_an_encoded_action_drops_coverage(inv_id: str, action: str) -> None:
    from dataclasses import replace

    from memspec.invariants.formal.proofs_catalog import declared, encoded

    p = [x for x in PROOFS if x.id == inv_id][0]
    fewer = replace(p, actions=[a for a in p.actions if a.name != action])
    assert set(declared(inv_id)) - set(encoded(fewer))


# --------------------------------------------------------------------------
# S1, S2, S4, S7, S10: every declaring action encoded; each guard is necessary
# --------------------------------------------------------------------------

MINE = ["S1", "S2", "S4", "S7", "S10"]


@pytest.mark.parametrize("inv_id", MINE)
def test_queue_and_charge_invariants_encode_every_declaring_action(inv_id: str) -> None:
    from memspec.invariants.formal.proofs_catalog import declared, encoded

    p = [x for x in PROOFS if x.id == inv_id][0]
    assert set(declared(inv_id)) <= set(encoded(p)), sorted(set(declared(inv_id)) - set(encoded(p)))


@pytest.mark.fresh_process
@pytest.mark.parametrize("inv_id", MINE)
def test_removing_the_guard_breaks_the_proof_queue_and_charge(inv_id: str) -> None:
    """The unguarded variant in place of its guarded action: consecution fails
    at that action, and nothing was assumed (the guard carries the proof).

    The unguarded proof runs first: after the guarded proof's terms, Z3 spent S7's whole budget on the
    unguarded drop (38 s of CPU, ``unknown``) where in a fresh context it answers ``sat`` with a model in
    0.1 s; the guarded proof, run second, is still proved (0.1 s)."""
    p = [x for x in PROOFS if x.id == inv_id][0]
    r = prove(_without_guard(p))
    bad = [c.name for c in r.checks if not c.ok]
    assert f"step:{p.unguarded.name}" in bad, (bad, [c.detail for c in r.checks if not c.ok])
    assert prove(p).proved


@pytest.mark.parametrize("inv_id,action", [("S1", "poll"), ("S1", "select"), ("S2", "kv_grow"),
                                           ("S2", "allocate_owned"), ("S4", "decommit"), ("S4", "use"),
                                           ("S7", "close"), ("S10", "close")])
def test_dropping_an_encoded_action_drops_coverage_queue_and_charge(inv_id: str, action: str) -> None:
    from dataclasses import replace

    from memspec.invariants.formal.proofs_catalog import declared, encoded

    p = [x for x in PROOFS if x.id == inv_id][0]
    fewer = replace(p, actions=[a for a in p.actions if a.name != action])
    assert set(declared(inv_id)) - set(encoded(fewer))


def test_rows_credited_by_one_adapter_share_its_machine() -> None:
    """Issue 33 (one Z3 relation per spec action): an agreement adapter credits its samples to the
    further rows of ``also`` only where they are proved on the adapter's very machine (the same
    fields; the encoded action by the same step and precondition functions).  S1, S7 and S10 are on S4's
    deferred-free queue machine (S14 too), G1 and S6 on S15's ticket machine, S12 and S13 on S5's VMM machine,
    S2, S8 and S9 on S11's ledger model: one projection per state record, one adapter per spec action,
    for every row of the machine."""
    from memspec.invariants.formal import agreement_adapters as A
    from memspec.invariants.formal.proofs_seed000 import MORE_PROOFS

    proofs = {p.id: p for p in PROOFS + MORE_PROOFS}
    shared: dict[str, set[str]] = {}
    for ad in A.MECH_ADAPTERS + A.SYS_ADAPTERS + A.TICKET_ADAPTERS + A.SMALL_SYS_ADAPTERS:
        p = proofs[ad.invariant]
        for other in ad.also:
            q = proofs[other]
            assert q.fields == p.fields, (ad.invariant, other)
            assert q.action(ad.action).step is p.action(ad.action).step, (ad.invariant, other, ad.action)
            assert q.action(ad.action).pre is p.action(ad.action).pre, (ad.invariant, other, ad.action)
            shared.setdefault(ad.invariant, set()).add(other)
    assert shared.get("S4") == {"S1", "S7", "S10", "S14"}, shared
    assert shared.get("S15") == {"G1", "S6"}, shared
    assert shared.get("S11") == {"S2", "S8", "S9"}, shared   # S2, S8 and S9 on S11's ledger model
    assert shared.get("S5") == {"S12", "S13"}, shared
    for base, other in (("S4", "S1"), ("S4", "S7"), ("S4", "S10"), ("S4", "S14"), ("S15", "S6"), ("S15", "G1"),
                        ("S5", "S12"),
                        ("S5", "S13")):
        p, q = proofs[base], proofs[other]
        assert [a.name for a in q.actions] == [a.name for a in p.actions]
        assert all(a.step is b.step and a.pre is b.pre for a, b in zip(p.actions, q.actions))
    # no adapter of S1's, S7's, S10's, S6's, G1's, S12's or S13's own: their samples come from the shared
    # machine's adapters
    ads = A.SYS_ADAPTERS + A.MECH_ADAPTERS + A.TICKET_ADAPTERS + A.SMALL_SYS_ADAPTERS
    assert not [ad for ad in ads if ad.invariant in ("S1", "S7", "S10", "S6", "G1", "S12", "S13")]
    # S9's own: kv_use only (a fence recorded, not S11's action), on the ledger projection
    assert [(ad.action, ad.project) for ad in ads if ad.invariant == "S9"] == [("kv_use", A._L_PROJECT["kv_use"])]


def test_s4_poll_checks_every_stream_not_two() -> None:
    """Streams are unbounded: a poll that checks only streams 0 and 1 is
    refuted (work on a third stream is still running)."""
    from memspec.invariants.formal import proofs_seed000 as m

    def poll_two_streams(s, a):
        j = z3.Int("j")
        done = z3.And(*[m.at(m.at(s.use, j), k) <= m.at(s.done, k) for k in (0, 1)])
        runs = z3.And(m.at(s.astate, j) == m.QUEUED, done)
        return on_ok(z3.IntVal(0), s, s.set(astate=z3.Lambda([j], z3.If(runs, m.FREED, m.at(s.astate, j)))))

    two = Proof(**{**m.S4.__dict__, "actions": [Act("poll", {}, poll_two_streams) if a.name == "poll" else a
                                                for a in m.S4.actions]})
    r = prove(two)
    assert not [c for c in r.checks if c.name == "step:poll"][0].ok
