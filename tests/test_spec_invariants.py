"""Each invariant S1–S15 can fail: plant a broken transition, watch the predicate catch it.

Every test runs one scenario twice: with the spec as written (the invariant
holds) and with one transition broken -- a guard removed (``force`` follows
an answer the guard would refuse) or a step function monkeypatched -- and
then the predicate must report a reason.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from memspec.spec import context, ep, governor, holders, manager, shared
from memspec.spec.api import DeviceAllocation, DeviceKey, Identity
from memspec.spec.invariants import ALL, BY_ID, CATALOG
from memspec.spec.mechanism import MECHANISM
from memspec.spec.ep import queue_snapshot
from memspec.spec.selfcheck import drive, force
from memspec.spec.state import Seen
from memspec.spec.system import SYSTEM

PAGE = 4096


def sys_state(vb: bool = True, sm: bool = True):
    return SYSTEM.init(capacity=32 * PAGE, page=PAGE, virtual_backing=vb, shared_mapping=sm)


def mech_state():
    return MECHANISM.init(capacity=16 * PAGE, page=PAGE, virtual_backing=True, shared_mapping=True, ep=True)


def holds(inv: str, s: Any) -> bool:
    i = BY_ID[inv]
    return i.check(s) is None and (i.full_check or i.check)(s) is None


def poll_all(s: Any) -> None:
    pending = queue_snapshot(s)
    drive(SYSTEM, s, "poll", pending=pending, value=Seen(None, {"done": [True] * len(pending), "ran": len(pending)}))


def both_ways(inv: str, scenario: Callable[[], Any], plant: Callable[[pytest.MonkeyPatch], None]) -> None:
    good = scenario()
    assert holds(inv, good), f"{inv} must hold on the correct spec: {BY_ID[inv].check(good)}"
    with pytest.MonkeyPatch.context() as mp:
        plant(mp)
        bad = scenario()
    reason = BY_ID[inv].check(bad) or (BY_ID[inv].full_check or BY_ID[inv].check)(bad)
    assert reason, f"{inv} did not catch the planted bug"


def test_every_invariant_has_id_title_quote():
    assert [e.id for e in CATALOG] == [f"S{k}" for k in range(1, len(CATALOG) + 1)]
    assert [(e.id, e.title, e.quote) for e in CATALOG] == [(i.id, i.title, i.quote) for i in ALL]
    for e in CATALOG:
        assert e.title and len(e.quote) > 20 and e.seed == "000"


@pytest.mark.parametrize("entry", CATALOG, ids=[e.id for e in CATALOG])
def test_every_invariant_has_a_planted_bug_test_here(entry):
    """Adding an invariant to the catalog without a test that plants a bug it must catch fails here."""
    prefix = f"test_{entry.id.lower()}_"
    assert [n for n in globals() if n.startswith(prefix) and callable(globals()[n])], \
        f"no {prefix}* test plants a bug for {entry.id}"


# S1 -- release through the installed mechanism instead of the creator
def test_s1_creator_free():
    def scenario():
        s = sys_state()
        a = drive(SYSTEM, s, "allocate_owned", size=PAGE)
        drive(SYSTEM, s, "select", mechanism=1)
        drive(SYSTEM, s, "drop", allocation=a)
        poll_all(s)
        return s

    both_ways("S1", scenario, lambda mp: mp.setattr(ep, "releasing_mechanism", lambda s, e: s.registry.installed))


# S2 -- growth commits pages without charging them
def test_s2_charge_before_commit():
    def scenario():
        s = sys_state()
        r = s.next_ref
        drive(SYSTEM, s, "kv_open", request=(r, 4 * PAGE, None, 0))
        drive(SYSTEM, s, "kv_grow", growth=(r, 2 * PAGE, None))
        return s

    def uncharged(s, q, delta):
        from memspec.spec.state import add

        add(s.physical_by, "kv", delta)
        q.own += delta
        add(s.live_bytes_by, "kv", delta)

    both_ways("S2", scenario, lambda mp: mp.setattr(holders, "grow_commit", uncharged))


# S3 -- capabilities answered from a snapshot taken before the replacement
def test_s3_fresh_capability():
    def scenario():
        s = sys_state()
        drive(SYSTEM, s, "binding_capabilities")
        drive(SYSTEM, s, "select", mechanism=1)
        drive(SYSTEM, s, "binding_capabilities")
        return s

    snapshot = (0, True, True)
    both_ways("S3", scenario, lambda mp: mp.setattr(manager, "current_capabilities", lambda s: snapshot))


# S4 -- poll runs every queued release, fences or not
def test_s4_fence_release():
    def scenario():
        s = sys_state()
        st = drive(SYSTEM, s, "new_stream")
        a = drive(SYSTEM, s, "allocate_owned", size=PAGE)
        drive(SYSTEM, s, "use", allocation=a, stream=st)
        drive(SYSTEM, s, "drop", allocation=a)
        drive(SYSTEM, s, "poll", pending=queue_snapshot(s))  # the witness: fence not done, nothing runs
        return s

    def eager(s, pending, done):
        s.in_poll = True
        for seq, _f in pending:
            ep.run_entry(s, s.queue[seq])
        s.in_poll = False
        return len(pending)

    both_ways("S4", scenario, lambda mp: mp.setattr(ep, "run_done", eager))


# S5 -- a commit that did nothing accepted as success (the guard removed)
def test_s5_no_silent_noop():
    def scenario(noop: bool = False):
        s = mech_state()
        r = drive(MECHANISM, s, "reserve", size=4 * PAGE)
        if noop:
            force(MECHANISM, s, "commit_range", 0, span=(r, 0, 2 * PAGE))
        else:
            drive(MECHANISM, s, "commit_range", span=(r, 0, 2 * PAGE))
        return s

    assert holds("S5", scenario())
    assert BY_ID["S5"].check(scenario(noop=True))


def test_s5_absent_capability_answered():
    s = mech_state()
    s.virtual_backing = False
    force(MECHANISM, s, "query_virtual_backing", object())
    assert BY_ID["S5"].check(s)


# S6 -- the Governor evicts a holder's weight itself when a ticket is cancelled
def test_s6_holder_chooses():
    def scenario():
        s = sys_state()
        drive(SYSTEM, s, "load_weight", weight=("w0", True, PAGE))
        t = drive(SYSTEM, s, "issue_ticket", request=(PAGE, 0, 0))
        drive(SYSTEM, s, "cancel_ticket", ticket=t)
        return s

    original = governor.ticket_end

    def evicting(s, t, state):
        for w in s.weights.values():
            if w.resident:
                holders.evict(s, w, by="governor")
        return original(s, t, state)

    both_ways("S6", scenario, lambda mp: mp.setattr(governor, "ticket_end", evicting))


# S7 -- drop frees on the spot instead of enqueuing
def test_s7_drop_only_enqueues():
    def scenario():
        s = sys_state()
        a = drive(SYSTEM, s, "allocate_owned", size=PAGE)
        drive(SYSTEM, s, "drop", allocation=a)
        return s

    original = manager.drop_owned

    def freeing(s, o, fences, exact=True):
        original(s, o, fences, exact=exact)
        ep.run_entry(s, s.queue[max(s.queue)])

    both_ways("S7", scenario, lambda mp: mp.setattr(manager, "drop_owned", freeing))


# S8 -- charged at the plan, not at the actual footprint
def test_s8_exact_accounting():
    def scenario():
        s = sys_state()
        drive(SYSTEM, s, "allocate_owned", size=100)  # footprint: a page
        return s

    def at_plan(s, holder, planned, footprint):
        governor.take_grant(s, planned)
        governor.charge(s, holder, planned, planned)

    both_ways("S8", scenario, lambda mp: mp.setattr(governor, "charge_at_footprint", at_plan))


def test_s8_failed_allocation_keeps_grant():
    s = sys_state()
    drive(SYSTEM, s, "allocate_owned", size=PAGE)
    assert holds("S8", s)
    governor.take_grant(s, PAGE)          # what a failure branch that forgot the grant would leave
    s.open_grants -= PAGE                 # ... with no grant record to return it
    assert BY_ID["S8"].check(s)


# S9 -- a failed growth keeps its partial mapping (the grant returned, the pages not)
def test_s9_transactional_growth():
    def scenario():
        s = sys_state()
        r = s.next_ref
        drive(SYSTEM, s, "kv_open", request=(r, 4 * PAGE, None, 0))
        drive(SYSTEM, s, "kv_grow", growth=(r, PAGE, None))
        drive(SYSTEM, s, "kv_grow", growth=(r, 3 * PAGE, None))
        return s

    def partial(s, q, delta):
        q.own += delta  # view exposes the new pages; no charge, no live pages recorded

    both_ways("S9", scenario, lambda mp: mp.setattr(holders, "grow_commit", partial))


# S10 -- destroy ignores the pins
def test_s10_context_pinned():
    def scenario():
        s = sys_state()
        drive(SYSTEM, s, "allocate_owned", size=PAGE)
        only = SYSTEM.action("destroy_context").step(s).branches[0]  # ContextBusy, or Returns once unguarded
        only.then(None)
        return s

    both_ways("S10", scenario, lambda mp: mp.setattr(context, "pins", lambda s: 0))


# S11 -- a refund credited twice
def test_s11_ledger_conservation():
    def scenario():
        s = sys_state()
        a = drive(SYSTEM, s, "allocate_owned", size=PAGE)
        drive(SYSTEM, s, "drop", allocation=a)
        poll_all(s)
        return s

    original = ep.refund

    def twice(s, holder, n):
        original(s, holder, n)
        s.free += n

    both_ways("S11", scenario, lambda mp: mp.setattr(ep, "refund", twice))


# S12 -- a commit that moved the reservation, accepted (the guard removed)
def test_s12_stable_address():
    def scenario(moved: bool):
        s = sys_state()
        r = drive(SYSTEM, s, "reserve_owned", size=4 * PAGE)
        base = s.owned[r].base
        addr = base + (PAGE if moved else 0)
        force(SYSTEM, s, "commit_owned", Seen(None, {"bytes": PAGE, "address": addr}), span=(r, 0, PAGE))
        return s

    assert holds("S12", scenario(False))
    assert BY_ID["S12"].check(scenario(True))


# S13 -- shared pages freed while still mapped; KV prefix pages freed under a sharer
def test_s13_shared_lifetime_mechanism():
    def scenario():
        s = mech_state()
        h = drive(MECHANISM, s, "create", size=PAGE)
        a = drive(MECHANISM, s, "shared_reserve", size=2 * PAGE)
        b = drive(MECHANISM, s, "shared_reserve", size=2 * PAGE)
        drive(MECHANISM, s, "map", handle=h, place=(a, 0), read_only=True)
        m = drive(MECHANISM, s, "map", handle=h, place=(b, 0), read_only=True)
        drive(MECHANISM, s, "release_handle", handle=h)
        drive(MECHANISM, s, "unmap", mapping=(m, b, 0, PAGE))
        return s

    def eager_free(s, h):
        if h.released and not h.freed:
            h.freed = True
            s.shared_bytes -= h.size
            return h.size
        return 0

    both_ways("S13", scenario, lambda mp: mp.setattr(shared, "_maybe_free", eager_free))


def test_s13_shared_lifetime_kv():
    def scenario():
        s = sys_state()
        a = s.next_ref
        drive(SYSTEM, s, "kv_open", request=(a, 8 * PAGE, None, 0))
        drive(SYSTEM, s, "kv_grow", growth=(a, 2 * PAGE, None))
        drive(SYSTEM, s, "kv_open", request=(s.next_ref, 4 * PAGE, a, 2 * PAGE))
        drive(SYSTEM, s, "kv_close", request=a)
        poll_all(s)
        return s

    original = holders.release_request

    def forget_sharers(s, ref):
        s.kv[ref].sharers.clear()
        return original(s, ref)

    both_ways("S13", scenario, lambda mp: mp.setattr(holders, "release_request", forget_sharers))


# S14 -- an identity issued twice (the freshness guard removed)
def test_s14_no_reuse_of_identity():
    def scenario(reuse: bool):
        s = mech_state()
        dev = DeviceKey("t")
        a = drive(MECHANISM, s, "allocate", size=PAGE, value=DeviceAllocation(0, PAGE, PAGE, Identity("i", 1), dev))
        drive(MECHANISM, s, "deallocate", handle=a)
        ident = Identity("i", 1 if reuse else 2)
        force(MECHANISM, s, "allocate", DeviceAllocation(0, PAGE, PAGE, ident, dev), size=PAGE)
        return s

    assert holds("S14", scenario(False))
    assert BY_ID["S14"].check(scenario(True))


def test_s14_stale_handle_frees_the_newer_allocation():
    s = mech_state()
    dev = DeviceKey("t")
    a = drive(MECHANISM, s, "allocate", size=PAGE, value=DeviceAllocation(0, PAGE, PAGE, Identity("i", 1), dev))
    drive(MECHANISM, s, "deallocate", handle=a)
    drive(MECHANISM, s, "allocate", size=PAGE, value=DeviceAllocation(0, PAGE, PAGE, Identity("i", 2), dev))
    assert holds("S14", s)
    # an address-keyed spec would follow "returns PAGE" and free whatever lives at the address
    del s.by_address[0]
    s.physical -= PAGE
    s.eager_bytes -= PAGE
    assert BY_ID["S14"].check(s)


# S15 -- a ticket gives its bytes back without letting go of them
def test_s15_ticket_exactly_once():
    def scenario():
        s = sys_state()
        drive(SYSTEM, s, "load_weight", weight=("w0", False, PAGE))
        t = drive(SYSTEM, s, "issue_ticket", request=(PAGE, 0, 0))
        drive(SYSTEM, s, "respond", answer=(t, "weights", False), pending=queue_snapshot(s))
        drive(SYSTEM, s, "cancel_ticket", ticket=t)
        return s

    def keeps_holding(s, t, state):
        n = t.held
        s.free += n
        s.granted -= n
        t.returned += n
        t.returns += 1
        s.tickets_returned += n
        t.state = state
        return n

    both_ways("S15", scenario, lambda mp: mp.setattr(governor, "ticket_end", keeps_holding))


def test_s6_holder_reports_bytes_it_did_not_release():
    s = sys_state()
    r = s.next_ref
    drive(SYSTEM, s, "kv_open", request=(r, 4 * PAGE, None, 0))
    drive(SYSTEM, s, "kv_grow", growth=(r, PAGE, None))
    t = drive(SYSTEM, s, "issue_ticket", request=(PAGE, 0, 0))
    drive(SYSTEM, s, "respond", answer=(t, "kv", False), pending=queue_snapshot(s),
          value=Seen(None, {"done": [], "released": 0, "state": "pending", "held": 0}))
    assert holds("S6", s)
    drive(SYSTEM, s, "respond", answer=(t, "kv", False), pending=queue_snapshot(s),
          value=Seen(None, {"done": [], "released": PAGE, "state": "granted", "held": PAGE}))
    assert BY_ID["S6"].check(s)


def test_s5_unsupported_masquerading_as_success_system():
    """kv_open with its capability guard removed (the step sees the eager-only
    mechanism as if it had VirtualBacking) opens a request that cannot exist."""
    def scenario(unguarded: bool):
        s = sys_state()
        drive(SYSTEM, s, "select", mechanism=1)
        saved = s.registry.capabilities[1]
        if unguarded:
            s.registry.capabilities[1] = (True, True)
        outs = SYSTEM.action("kv_open").step(s, request=(s.next_ref, 4 * PAGE, None, 0))
        s.registry.capabilities[1] = saved
        outs.branches[0].then(None)
        return s

    assert holds("S5", scenario(False))
    assert BY_ID["S5"].check(scenario(True))
