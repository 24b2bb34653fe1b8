"""Unit tests of the SYSTEM spec: every role's actions and error outcomes."""

from __future__ import annotations

import pytest

from memspec.spec.api import DeviceKey, Fence, Grant, Identity, Lease, Ticket, TicketState
from memspec.spec.errors import (
    ContextBusy,
    DoubleFree,
    GrantDenied,
    InvalidRange,
    InvalidRequest,
    InvalidTicket,
    MemspecError,
    OutOfMemory,
    Unsupported,
)
from memspec.spec.ep import queue_snapshot
from memspec.spec.selfcheck import drive, permits
from memspec.spec.state import Seen
from memspec.spec.system import SYSTEM

PAGE = 4096
CAP = 32 * PAGE


def fresh(vb: bool = True, sm: bool = True):
    return SYSTEM.init(capacity=CAP, page=PAGE, virtual_backing=vb, shared_mapping=sm)


def ok(s) -> None:
    assert SYSTEM.check_invariants(s, full=True) == []


def caps(mech: int, gen: int, vb: bool, sm: bool) -> Seen:
    return Seen(None, {"mechanism": mech, "generation": gen, "virtual_backing": vb, "shared_mapping": sm})


def owned(mech: int, size: int, fp: int, gen: int, context: bool = True) -> Seen:
    return Seen(None, {"mechanism": mech, "context": context, "size": size, "footprint": fp,
                       "identity": Identity("impl", gen)})


def poll_answer(s, done: list[bool] | None = None) -> Seen:
    pending = queue_snapshot(s)
    done = [False] * len(pending) if done is None else done
    return Seen(None, {"done": done, "ran": sum(done)})


# -- registry ----------------------------------------------------------------


def test_select_bumps_generation_and_capabilities_answer_for_the_installed_mechanism():
    s = fresh()
    drive(SYSTEM, s, "binding_capabilities", value=caps(0, 1, True, True))  # learns generation 1
    assert not permits(SYSTEM, s, "select", mechanism=1, value=1), "a replacement must bump the generation"
    assert permits(SYSTEM, s, "select", mechanism=0, value=1), "re-selecting may keep it"
    drive(SYSTEM, s, "select", mechanism=1, value=2)
    assert not permits(SYSTEM, s, "binding_capabilities", value=caps(0, 1, True, True)), "stale snapshot"
    assert not permits(SYSTEM, s, "manager_capabilities", value=caps(1, 2, True, True)), "the eager one has no VMM"
    assert permits(SYSTEM, s, "manager_capabilities", value=caps(1, 2, False, False))
    assert SYSTEM.action("select").step(s, mechanism=1).blame == "S3"
    ok(s)


# -- the allocation transaction ----------------------------------------------


def test_allocate_charges_the_actual_footprint():
    s = fresh()
    assert not permits(SYSTEM, s, "allocate_owned", size=100, value=owned(1, 100, PAGE, 1)), "not the installed mechanism"
    assert not permits(SYSTEM, s, "allocate_owned", size=100, value=owned(0, 100, PAGE, 1, context=False))
    r = drive(SYSTEM, s, "allocate_owned", size=100, value=owned(0, 100, PAGE, 1))
    assert s.charged_by["session"] == PAGE and s.free == CAP - PAGE and s.granted == 0
    assert s.owned[r].footprint == PAGE
    ok(s)


@pytest.mark.parametrize("size", [0, -1, 2.5])
def test_allocate_invalid_leaves_the_ledger(size):
    s = fresh()
    drive(SYSTEM, s, "allocate_owned", size=size, error=InvalidRequest)
    assert (s.free, s.granted, s.charged) == (CAP, 0, 0)


def test_failed_allocation_returns_the_grant():
    s = fresh()
    outs = SYSTEM.action("allocate_owned").step(s, size=CAP + 1)
    assert [b.error for b in outs.branches] == [GrantDenied]
    drive(SYSTEM, s, "allocate_owned", size=PAGE)
    drive(SYSTEM, s, "allocate_owned", size=PAGE, error=OutOfMemory)
    assert s.granted == 0 and s.free == CAP - PAGE
    ok(s)


def test_drop_only_enqueues_and_poll_waits_for_the_fence():
    s = fresh()
    st = drive(SYSTEM, s, "new_stream", value=7)
    a = drive(SYSTEM, s, "allocate_owned", size=PAGE)
    drive(SYSTEM, s, "use", allocation=a, stream=st, value=Fence(7, 1))
    drive(SYSTEM, s, "drop", allocation=a, value=None)
    assert len(s.queue) == 1 and s.charged_by["session"] == PAGE, "drop frees nothing"
    drive(SYSTEM, s, "drop", allocation=a, error=DoubleFree)
    pending = queue_snapshot(s)
    # the fence may or may not be done yet: not done -> nothing runs
    assert not permits(SYSTEM, s, "poll", pending=pending, value=Seen(None, {"done": [False], "ran": 1}))
    drive(SYSTEM, s, "poll", pending=pending, value=poll_answer(s))
    assert len(s.queue) == 1
    drive(SYSTEM, s, "synchronize", stream=st, value=None)
    pending = queue_snapshot(s)
    assert not permits(SYSTEM, s, "poll", pending=pending, value=poll_answer(s)), "a synchronized fence is done"
    drive(SYSTEM, s, "poll", pending=pending, value=poll_answer(s, [True]))
    assert not s.queue and s.charged_by["session"] == 0 and s.free == CAP
    ok(s)


def test_release_after_replacement_goes_through_the_creator():
    s = fresh()
    a = drive(SYSTEM, s, "allocate_owned", size=PAGE)
    drive(SYSTEM, s, "select", mechanism=1)
    b = drive(SYSTEM, s, "allocate_owned", size=PAGE, value=owned(1, PAGE, PAGE, 9))
    assert (s.owned[a].creator, s.owned[b].creator) == (0, 1)
    drive(SYSTEM, s, "drop", allocation=a)
    outs = SYSTEM.action("poll").step(s, pending=queue_snapshot(s))
    assert outs.blame == "S1"
    drive(SYSTEM, s, "poll", pending=queue_snapshot(s), value=poll_answer(s, [True]))
    assert s.misreleased == 0
    ok(s)


# -- Governor ------------------------------------------------------------------


def test_grants_leases_commit_without_grant():
    s = fresh()
    drive(SYSTEM, s, "reserve", nbytes=0, error=InvalidRequest)
    assert [b.error for b in SYSTEM.action("reserve").step(s, nbytes=CAP + 1).branches] == [GrantDenied]
    g = drive(SYSTEM, s, "reserve", nbytes=PAGE, value=Grant(1, "session", PAGE))
    assert not permits(SYSTEM, s, "commit", grant=(g, PAGE + 10), value=Lease(2, "session", PAGE))
    lease = drive(SYSTEM, s, "commit", grant=(g, PAGE + 10), value=Lease(2, "session", PAGE + 10))
    assert s.charged_by["session"] == PAGE + 10 and s.granted == 0
    drive(SYSTEM, s, "commit", grant=(g, PAGE), error=InvalidRequest)   # commit without a grant
    drive(SYSTEM, s, "cancel", grant=g, error=InvalidRequest)
    drive(SYSTEM, s, "refund_lease", lease=lease, value=PAGE + 10)
    drive(SYSTEM, s, "refund_lease", lease=lease, error=InvalidRequest)
    g2 = drive(SYSTEM, s, "reserve", nbytes=PAGE)
    drive(SYSTEM, s, "cancel", grant=g2, value=PAGE)
    drive(SYSTEM, s, "cancel", grant=g2, error=InvalidRequest)
    assert (s.free, s.granted, s.charged) == (CAP, 0, 0)
    ok(s)


def _ticket(s, amount: int, deadline: int = 0) -> int:
    return drive(SYSTEM, s, "issue_ticket", request=(amount, 0, deadline),
                 value=Ticket(1, "session", amount, 0, deadline, 1))


def test_holders_choose_cold_victims_and_the_ticket_is_granted_claimed():
    s = fresh()
    drive(SYSTEM, s, "load_weight", weight=("w1", False, 2 * PAGE))  # cold
    drive(SYSTEM, s, "load_weight", weight=("w2", True, 4 * PAGE))   # hot
    t = _ticket(s, 2 * PAGE)
    pend = queue_snapshot(s)
    hot = Seen(None, {"done": [], "released": 4 * PAGE, "state": TicketState.GRANTED, "held": 4 * PAGE, "drained": 0})
    assert not permits(SYSTEM, s, "respond", answer=(t, "weights", False), pending=pend, value=hot)
    kv_some = Seen(None, {"done": [], "released": PAGE, "state": TicketState.PENDING, "held": PAGE, "drained": 0})
    assert not permits(SYSTEM, s, "respond", answer=(t, "kv", False), pending=pend, value=kv_some), "KV holds nothing"
    zero = Seen(None, {"done": [], "released": 0, "state": TicketState.PENDING, "held": 0, "drained": 0})
    drive(SYSTEM, s, "respond", answer=(t, "kv", False), pending=pend, value=zero)  # 0 is a valid answer
    cold = Seen(None, {"done": [], "released": 2 * PAGE, "state": TicketState.GRANTED, "held": 2 * PAGE, "drained": 0})
    drive(SYSTEM, s, "respond", answer=(t, "weights", False), pending=pend, value=cold)
    assert not s.weights["w1"].resident and s.weights["w2"].resident
    assert s.tickets[t].state == TicketState.GRANTED and s.granted == 2 * PAGE
    g = drive(SYSTEM, s, "claim", ticket=t, value=Grant(5, "session", 2 * PAGE))
    assert s.grants[g].nbytes == 2 * PAGE and s.tickets[t].held == 0
    drive(SYSTEM, s, "claim", ticket=t, error=InvalidTicket)
    drive(SYSTEM, s, "cancel_ticket", ticket=t, error=InvalidTicket)
    drive(SYSTEM, s, "respond", answer=(t, "weights", True), pending=pend, error=InvalidTicket)
    ok(s)


def test_ticket_cancelled_after_grant_returns_the_bytes_once():
    s = fresh()
    drive(SYSTEM, s, "load_weight", weight=("w0", False, PAGE))
    t = _ticket(s, PAGE)
    drive(SYSTEM, s, "respond", answer=(t, "weights", False), pending=queue_snapshot(s))
    assert s.tickets[t].state == TicketState.GRANTED and s.free == CAP - PAGE
    assert not permits(SYSTEM, s, "cancel_ticket", ticket=t, value=0)
    drive(SYSTEM, s, "cancel_ticket", ticket=t, value=PAGE)
    assert s.free == CAP and s.tickets[t].held == 0
    outs = SYSTEM.action("cancel_ticket").step(s, ticket=t)
    assert [b.error for b in outs.branches] == [InvalidTicket], "returned exactly once"
    ok(s)


def test_expire_times_out_due_tickets_only():
    s = fresh()
    a = _ticket(s, PAGE, deadline=3)
    b = _ticket(s, PAGE, deadline=0)
    assert not permits(SYSTEM, s, "expire", now=(2, (a, b)), value=(a,))
    drive(SYSTEM, s, "expire", now=(3, (a, b)), value=(a,))
    assert s.tickets[a].state == TicketState.TIMED_OUT and s.tickets[b].state == TicketState.PENDING
    drive(SYSTEM, s, "issue_ticket", request=(0, 0, 0), error=InvalidRequest)
    ok(s)


# -- KV growth -----------------------------------------------------------------


def test_kv_needs_virtual_backing():
    s = fresh(vb=False, sm=False)
    drive(SYSTEM, s, "kv_open", request=(s.next_ref, 4 * PAGE, None, 0), error=Unsupported)
    s2 = fresh()
    drive(SYSTEM, s2, "select", mechanism=1)
    drive(SYSTEM, s2, "kv_open", request=(s2.next_ref, 4 * PAGE, None, 0), error=Unsupported)
    drive(SYSTEM, s2, "reserve_owned", size=PAGE, error=Unsupported)


def test_a_refusal_while_the_installed_mechanism_has_the_capability_is_s3s_clause():
    """An Unsupported from kv_open or reserve_owned while the mechanism
    installed now has what they need is no permitted answer, and the answer
    names S3's clause (a refusal from an earlier mechanism's snapshot), not
    the action's own rule S5; without the capability it stays S5's
    explicit refusal."""
    s = fresh()
    for name, args in (("kv_open", {"request": (s.next_ref, 4 * PAGE, None, 0)}), ("reserve_owned", {"size": PAGE}),
                       ("reserve_owned", {"size": 0})):
        outs = SYSTEM.action(name).step(s, **args)
        err = Unsupported("stale")
        assert outs.match(None, err) is None, name
        b, bad = outs.closest(None, err)
        assert [c.id for c in bad] == ["S3.capability-refused"], (name, args)
    drive(SYSTEM, s, "select", mechanism=1)          # no VirtualBacking now: Unsupported is S5's explicit refusal
    outs = SYSTEM.action("kv_open").step(s, request=(s.next_ref, 4 * PAGE, None, 0))
    assert outs.match(None, Unsupported("none")) is not None and outs.blame == "S5"


def test_kv_growth_is_transactional():
    s = fresh()
    r = s.next_ref
    drive(SYSTEM, s, "kv_open", request=(r, 4 * PAGE, None, 0), value=None)
    assert not permits(SYSTEM, s, "kv_grow", growth=(r, PAGE + 1, None), value=PAGE)
    drive(SYSTEM, s, "kv_grow", growth=(r, PAGE + 1, None), value=2 * PAGE)
    assert s.kv[r].committed == 2 * PAGE and s.charged_by["kv"] == 2 * PAGE
    before = (s.free, s.granted, s.charged, s.kv[r].committed)
    for fail_at in (4, 5):
        outs = SYSTEM.action("kv_grow").step(s, growth=(r, 3 * PAGE, fail_at))
        assert outs.match(PAGE) is None and outs.blame == "S9"
        drive(SYSTEM, s, "kv_grow", growth=(r, 3 * PAGE, fail_at), error=MemspecError)
        assert (s.free, s.granted, s.charged, s.kv[r].committed) == before
    drive(SYSTEM, s, "kv_grow", growth=(r, 3 * PAGE, None), error=OutOfMemory)
    assert (s.free, s.granted, s.charged, s.kv[r].committed) == before
    assert {b.error for b in SYSTEM.action("kv_grow").step(s, growth=(r, 5 * PAGE, None)).branches} == {InvalidRange, InvalidRequest}
    assert permits(SYSTEM, s, "kv_grow", growth=(r, PAGE, None), value=0)
    ok(s)


def test_shared_prefix_charged_once_freed_after_last_mapping():
    s = fresh()
    a = s.next_ref
    drive(SYSTEM, s, "kv_open", request=(a, 8 * PAGE, None, 0))
    drive(SYSTEM, s, "kv_grow", growth=(a, 3 * PAGE, None))
    drive(SYSTEM, s, "kv_open", request=(s.next_ref, 4 * PAGE, a, 4 * PAGE), error=InvalidRequest)  # more than a has
    b = s.next_ref
    drive(SYSTEM, s, "kv_open", request=(b, 4 * PAGE, a, 2 * PAGE), value=None)
    assert s.kv[b].committed == 2 * PAGE and s.charged_by["kv"] == 3 * PAGE, "the prefix is not charged again"
    drive(SYSTEM, s, "kv_close", request=a)
    assert s.kv[a].own == 3 * PAGE and s.charged_by["kv"] == 3 * PAGE, "nothing freed before the queue runs"
    drive(SYSTEM, s, "poll", pending=queue_snapshot(s), value=poll_answer(s, [True]))
    assert s.kv[a].own == 2 * PAGE, "pages b maps stay"
    assert s.charged_by["kv"] == 2 * PAGE
    drive(SYSTEM, s, "kv_close", request=b)
    drive(SYSTEM, s, "poll", pending=queue_snapshot(s), value=poll_answer(s, [True]))
    assert s.charged_by["kv"] == 0 and s.kv[a].own == 0
    ok(s)


# -- binding reservations ------------------------------------------------------


def test_reservation_commit_keeps_address_and_decommit_is_deferred():
    s = fresh()
    r = drive(SYSTEM, s, "reserve_owned", size=4 * PAGE,
              value=Seen(None, {"mechanism": 0, "address": 1 << 30, "size": 4 * PAGE, "identity": Identity("v", 1)}))
    moved = Seen(None, {"bytes": 2 * PAGE, "address": (1 << 30) + PAGE})
    assert not permits(SYSTEM, s, "commit_owned", span=(r, 0, 2 * PAGE), value=moved)
    drive(SYSTEM, s, "commit_owned", span=(r, 0, 2 * PAGE), value=Seen(None, {"bytes": 2 * PAGE, "address": 1 << 30}))
    assert s.charged_by["session"] == 2 * PAGE
    drive(SYSTEM, s, "commit_owned", span=(r, PAGE, 2 * PAGE), error=InvalidRange)
    drive(SYSTEM, s, "decommit_owned", span=(r, PAGE, 2 * PAGE))
    assert s.charged_by["session"] == 2 * PAGE and len(s.queue) == 1, "refund waits for the queue"
    drive(SYSTEM, s, "poll", pending=queue_snapshot(s), value=poll_answer(s, [True]))
    assert s.charged_by["session"] == PAGE
    ok(s)


def test_an_answer_that_drains_a_release_whose_fence_is_pending_breaks_s4():
    """A holder's answer runs the deferred-free queue as poll does: the queue
    may shrink by at most the releases reported done; more ran one before
    its fence (S4's clause ``release-before-fence``), not the holder's rule."""
    s = fresh()
    st = drive(SYSTEM, s, "new_stream", value=7)
    a = drive(SYSTEM, s, "allocate_owned", size=PAGE)
    drive(SYSTEM, s, "use", allocation=a, stream=st, value=Fence(7, 1))
    drive(SYSTEM, s, "drop", allocation=a, value=None)
    t = _ticket(s, PAGE)
    pend = queue_snapshot(s)
    assert len(pend) == 1 and pend[0][1], "a release queued behind a fence of its work"
    early = Seen(None, {"done": [False], "released": 0, "state": TicketState.PENDING, "held": 0, "drained": 1})
    outs = SYSTEM.action("respond").step(s, answer=(t, "kv", False), pending=pend)
    assert outs.match(early) is None
    _b, bad = outs.closest(early)
    assert [c.id for c in bad] == ["S4.release-before-fence"]
    waits = Seen(None, {"done": [False], "released": 0, "state": TicketState.PENDING, "held": 0, "drained": 0})
    assert permits(SYSTEM, s, "respond", answer=(t, "kv", False), pending=pend, value=waits)


# -- contexts ------------------------------------------------------------------


def test_destroy_of_a_pinned_context_is_refused():
    s = fresh()
    a = drive(SYSTEM, s, "allocate_owned", size=PAGE)
    assert [b.error for b in SYSTEM.action("destroy_context").step(s).branches] == [ContextBusy]
    drive(SYSTEM, s, "drop", allocation=a)
    assert [b.error for b in SYSTEM.action("destroy_context").step(s).branches] == [ContextBusy], "queued release pins"
    drive(SYSTEM, s, "poll", pending=queue_snapshot(s), value=poll_answer(s, [True]))
    drive(SYSTEM, s, "destroy_context", value=None)
    assert not s.registry.context_alive
    assert not SYSTEM.action("allocate_owned").available(s)
    ok(s)


def test_reservation_use_and_close_wait_for_the_fence():
    s = fresh()
    st = drive(SYSTEM, s, "new_stream")
    r = drive(SYSTEM, s, "reserve_owned", size=2 * PAGE)
    drive(SYSTEM, s, "commit_owned", span=(r, 0, PAGE))
    drive(SYSTEM, s, "use_owned", reservation=r, stream=st, value=Fence(0, 1))
    drive(SYSTEM, s, "close_owned", reservation=r, value=None)
    assert r not in s.reservations and s.charged_by["session"] == PAGE, "close only enqueues"
    (seq, fences), = queue_snapshot(s)
    assert fences, "the release waits for the reservation's fence"
    assert not permits(SYSTEM, s, "destroy_context", value=None)
    drive(SYSTEM, s, "synchronize", stream=None)
    drive(SYSTEM, s, "poll", pending=queue_snapshot(s), value=poll_answer(s, [True]))
    assert s.charged_by["session"] == 0
    ok(s)


def test_weights_hot_cold_unload():
    s = fresh()
    drive(SYSTEM, s, "load_weight", weight=("w2", True, 4 * PAGE), value=Seen(None, {"footprint": 4 * PAGE}))
    assert s.charged_by["weights"] == 4 * PAGE
    t = _ticket(s, PAGE)
    hot_victim = Seen(None, {"done": [], "released": 4 * PAGE, "state": TicketState.GRANTED, "held": 4 * PAGE, "drained": 0})
    assert not permits(SYSTEM, s, "respond", answer=(t, "weights", False), pending=(), value=hot_victim)
    drive(SYSTEM, s, "set_hot", weight="w2", hot=False, value=None)
    assert permits(SYSTEM, s, "respond", answer=(t, "weights", False), pending=(), value=hot_victim)
    drive(SYSTEM, s, "unload_weight", weight="w2", value=None)
    assert not s.weights["w2"].resident and s.charged_by["weights"] == 4 * PAGE, "unload only enqueues"
    drive(SYSTEM, s, "poll", pending=queue_snapshot(s), value=poll_answer(s, [True]))
    assert s.charged_by["weights"] == 0
    ok(s)


def test_kv_use_pins_pages_until_the_fence():
    s = fresh()
    st = drive(SYSTEM, s, "new_stream")
    r = s.next_ref
    drive(SYSTEM, s, "kv_open", request=(r, 4 * PAGE, None, 0))
    drive(SYSTEM, s, "kv_grow", growth=(r, PAGE, None))
    drive(SYSTEM, s, "kv_use", request=r, stream=st, value=Fence(0, 1))
    drive(SYSTEM, s, "kv_close", request=r)
    pend = queue_snapshot(s)
    assert permits(SYSTEM, s, "poll", pending=pend, value=Seen(None, {"done": [True], "ran": 1})), "it may be done"
    drive(SYSTEM, s, "poll", pending=pend, value=Seen(None, {"done": [False], "ran": 0}))
    assert s.charged_by["kv"] == PAGE, "in use by in-flight work: not freed"
    drive(SYSTEM, s, "synchronize", stream=st)
    assert not permits(SYSTEM, s, "poll", pending=queue_snapshot(s), value=Seen(None, {"done": [False], "ran": 0}))
    drive(SYSTEM, s, "poll", pending=queue_snapshot(s), value=Seen(None, {"done": [True], "ran": 1}))
    assert s.charged_by["kv"] == 0
    ok(s)
