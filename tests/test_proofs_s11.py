"""S11 ledger-conservation: its machine encodes every spec action that
declares S11 (mechanism and system level), each new encoding is not
vacuous (a planted break in it is refuted by ``prove`` or caught by
transition agreement), and the encodings agree with the spec."""

from __future__ import annotations

from dataclasses import replace

import pytest
import z3

from memspec.invariants.formal import proofs_seed000 as E
from memspec.invariants.formal.proofs import Proof, St, at, merge, on_ok, outcome, prove, upd
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
        sz, h = at(s.msize, a.m), at(s.mh, a.m)
        out = outcome(*E._mapping_errors(s, a), (at(s.mpriv, a.m), "InvalidRange"), (a.oom, "OutOfMemory"))
        s1 = E._dev_bytes(E._shm_unshare(s.set(mpriv=upd(s.mpriv, a.m, True), ret=sz), a.m, h), a.m, sz, "private")
        return on_ok(out, s, E._shm_maybe_free(s1, h))

    c = _step_check(_only("m_copy_on_write", cow_no_guard), "m_copy_on_write")
    assert not c.ok, c.detail


def test_unmap_that_frees_a_freed_handle_again_is_refuted() -> None:
    """shared._maybe_free without its ``not h.freed``: the handle's bytes leave the device twice."""
    def free_again(s: St, h):
        due = z3.And(at(s.hreleased, h), at(s.hmaps, h) == 0)
        return merge(due, E._dev_bytes(s.set(hfreed=upd(s.hfreed, h, True)), h, -at(s.hsize, h), "shared"), s)

    def unmap(s: St, a: St):
        out = outcome(*E._mapping_errors(s, a))
        h, sz = at(s.mh, a.m), at(s.msize, a.m)
        s1 = s.set(mlive=upd(s.mlive, a.m, False), ret=sz)
        done = merge(at(s.mpriv, a.m), E._dev_bytes(s1, a.m, -sz, "private"), free_again(E._shm_unshare(s1, a.m, h), h))
        return out, merge(out == E.OK, done, s)

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
        out = outcome(*E._mapping_errors(s, a))
        h = at(s.mh, a.m)
        s1 = s.set(mlive=upd(s.mlive, a.m, False), ret=at(s.msize, a.m))
        # the private pages stay counted on the device
        done = merge(at(s.mpriv, a.m), s1, E._shm_maybe_free(E._shm_unshare(s1, a.m, h), h))
        return out, merge(out == E.OK, done, s)

    wrong = Proof(**{**E.S11.__dict__, "actions": [replace(a, step=unmap_keeps_private) if a.name == "m_unmap" else a
                                                   for a in E.S11.actions]})
    ads = [replace(a, weight=1.0) for a in MECH_ADAPTERS if a.invariant == "S11" and a.action in ("m_unmap",
                                                                                                   "m_copy_on_write")]
    reps = walk_and_compare(MECHANISM, _mech_init, ads, {"S11": wrong}, 120, 3, _mech_too_big)
    unmap = [r for r in reps if r.action == "m_unmap"][0]
    assert unmap.samples > 0 and unmap.mismatches, "an unmap that keeps private pages agreed with the spec"
    assert not [r for r in reps if r.action == "m_copy_on_write" and r.mismatches]
