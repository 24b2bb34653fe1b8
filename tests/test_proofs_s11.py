"""S11 ledger-conservation: its machine encodes every spec action that
declares S11 (mechanism and system level), each new encoding is not
vacuous (a planted break in it is refuted by ``prove`` or caught by
transition agreement), and the encodings agree with the spec."""

from __future__ import annotations

from dataclasses import replace

import pytest
import z3

from memspec.invariants.formal import proofs_seed000 as E
from memspec.invariants.formal.proofs import Proof, St, at, merge, on_ok, prove, upd
from memspec.invariants.formal.proofs_catalog import declared, encoded

#: the actions S11's machine lacked before issue 13's deliverable 2
NEW = {"mechanism:commit_range", "mechanism:copy_on_write", "mechanism:create", "mechanism:decommit_range",
       "mechanism:release_handle", "mechanism:release_reservation", "mechanism:unmap", "system:reconfigure"}


def test_s11_encodes_every_action_that_declares_it() -> None:
    dec, enc = declared("S11"), encoded(E.S11)
    assert NEW <= set(dec)
    assert set(dec) <= set(enc) and len(dec) == 25  # issue 33: it encodes more (reservation and KV paths)


def _only(action: str, step) -> Proof:
    """S11's machine with one action (its step replaced): init, that step's consecution, the BMC."""
    act = replace(E.S11.action(action), step=step)
    return Proof(**{**E.S11.__dict__, "actions": [act]})


def _step_check(p: Proof, action: str):
    r = prove(p)
    return [c for c in r.checks if c.name == f"step:{action}"][0]


def test_each_new_encoding_is_proved_on_its_own() -> None:
    for a in E.S11.actions:
        if set(a.spec) & NEW:
            c = _step_check(_only(a.name, a.step), a.name)
            assert c.ok, (a.name, c.detail)


@pytest.mark.fresh_process
def test_copy_on_write_without_its_out_of_memory_guard_is_refuted() -> None:
    """Private pages taken whatever the device holds: physical bytes pass the capacity."""
    def cow_no_guard(s: St, a: St):
        b = at(s.mb, a.x)
        out = E._mapping_out(s, a, (at(s.mst, a.x) == E.I_LIVE, "InvalidRange"), (a.oom, "OutOfMemory"))
        s1 = E._m_set(s, a.x, E.I_LIVE, b)
        s1 = E._m_maybe_free(s1.set(hmaps=upd(s1.hmaps, a.h, at(s1.hmaps, a.h) - 1), ret=b), a.h)
        return on_ok(out, s, s1)

    c = _step_check(_only("m_copy_on_write", cow_no_guard), "m_copy_on_write")
    assert not c.ok, c.detail


def test_unmap_that_frees_a_freed_handle_again_is_refuted() -> None:
    """shared._maybe_free without its ``not h.freed``: the handle's bytes leave the device twice."""
    def free_again(s: St, h):
        due = z3.And(at(s.hrel, h) != 0, at(s.hmaps, h) == 0)
        return merge(due, s.set(phys=s.phys - at(s.mb, h), mst=upd(s.mst, h, E.I_GONE)), s)

    def unmap(s: St, a: St):
        out = E._mapping_out(s, a)
        private = E._m_set(s, a.x, E.I_GONE, at(s.mb, a.x))
        shared = free_again(s.set(mst=upd(s.mst, a.x, E.I_GONE), hmaps=upd(s.hmaps, a.h, at(s.hmaps, a.h) - 1)), a.h)
        return on_ok(out, s, merge(at(s.mst, a.x) == E.I_LIVE, private, shared).set(ret=at(s.mb, a.x)))

    c = _step_check(_only("m_unmap", unmap), "m_unmap")
    assert not c.ok, c.detail


def test_reconfigure_that_keeps_the_pending_bytes_is_refuted() -> None:
    """The pending tickets fail but what they held is never given back: granted keeps bytes nobody holds."""
    def keep(s: St, a: St):
        i = z3.Int("k_i")
        pend = lambda x: at(s.tstate, x) == E.T_PENDING  # noqa: E731
        return on_ok(z3.IntVal(E.OK), s, s.set(tstate=z3.Lambda([i], z3.If(pend(i), E.T_FAILED, at(s.tstate, i))),
                                               held=z3.Lambda([i], z3.If(pend(i), 0, at(s.held, i))), PP=E.Z0()))

    c = _step_check(_only("reconfigure", keep), "reconfigure")
    assert not c.ok, c.detail


def test_an_unmap_that_leaves_private_pages_behind_disagrees_with_the_spec() -> None:
    """Transition agreement compares the device's bytes: an unmap of a
    copied mapping that keeps its private pages is not the spec's unmap."""
    from memspec.invariants.formal.agreement import walk_and_compare
    from memspec.invariants.formal.agreement_adapters import MECH_ADAPTERS, _mech_init, _mech_too_big
    from memspec.spec.mechanism import MECHANISM

    def unmap_keeps_private(s: St, a: St):
        out = E._mapping_out(s, a)
        shared = E._m_maybe_free(s.set(mst=upd(s.mst, a.x, E.I_GONE),
                                       hmaps=upd(s.hmaps, a.h, at(s.hmaps, a.h) - 1)), a.h)
        keep = s.set(mst=upd(s.mst, a.x, E.I_GONE))  # the private pages stay counted on the device
        return on_ok(out, s, merge(at(s.mst, a.x) == E.I_LIVE, keep, shared).set(ret=at(s.mb, a.x)))

    wrong = Proof(**{**E.S11.__dict__, "actions": [replace(a, step=unmap_keeps_private) if a.name == "m_unmap" else a
                                                   for a in E.S11.actions]})
    ads = [replace(a, weight=1.0) for a in MECH_ADAPTERS if a.invariant == "S11" and a.action in ("m_unmap",
                                                                                                   "m_copy_on_write")]
    reps = walk_and_compare(MECHANISM, _mech_init, ads, {"S11": wrong}, 120, 3, _mech_too_big)
    unmap = [r for r in reps if r.action == "m_unmap"][0]
    assert unmap.samples > 0 and unmap.mismatches, "an unmap that keeps private pages agreed with the spec"
    assert not [r for r in reps if r.action == "m_copy_on_write" and r.mismatches]
