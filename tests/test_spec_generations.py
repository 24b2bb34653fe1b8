"""Configuration generations (issue 13, deliverable 8) on the executable spec:
``reconfigure`` fails the pending tickets of the older generation (their
bytes back to free, exactly once; never granted or claimed afterwards; a
holder answering one is told), granted tickets are kept; and S15's check
fires when a reconfigure leaves an old ticket pending."""

from __future__ import annotations

from typing import Any

import pytest

from memspec.spec import governor
from memspec.spec.api import TicketState
from memspec.spec.ep import queue_snapshot
from memspec.spec.errors import InvalidTicket
from memspec.spec.invariants import BY_ID
from memspec.spec.selfcheck import drive
from memspec.spec.state import Seen
from memspec.spec.system import SYSTEM

PAGE = 4096


def _scenario() -> tuple[Any, int, int]:
    """Two tickets: one pending holding 2 pages (of 8 asked), one granted."""
    s = SYSTEM.init(capacity=32 * PAGE, page=PAGE, virtual_backing=True, shared_mapping=True)
    for name in ("w1", "w2"):  # 2 + 4 pages, cold
        drive(SYSTEM, s, "load_weight", weight=(name, False, s.weights[name].pages * PAGE))
    pending = drive(SYSTEM, s, "issue_ticket", request=(8 * PAGE, 0, 0))
    q = queue_snapshot(s)
    drive(SYSTEM, s, "respond", answer=(pending, "weights", False), pending=q,
          value=Seen(None, {"done": [], "released": 2 * PAGE, "state": TicketState.PENDING, "held": 2 * PAGE}))
    granted = drive(SYSTEM, s, "issue_ticket", request=(PAGE, 0, 0))
    drive(SYSTEM, s, "respond", answer=(granted, "weights", False), pending=queue_snapshot(s),
          value=Seen(None, {"done": [], "released": 4 * PAGE, "state": TicketState.GRANTED, "held": 4 * PAGE}))
    return s, pending, granted


def test_reconfigure_fails_the_pending_tickets_and_keeps_the_granted() -> None:
    s, pending, granted = _scenario()
    free, held = s.free, s.tickets_held
    assert s.tickets[pending].held == 2 * PAGE and s.tickets[granted].state == TicketState.GRANTED
    drive(SYSTEM, s, "reconfigure", value=2)
    t = s.tickets[pending]
    assert (t.state, t.held, t.returns, t.returned) == (TicketState.FAILED, 0, 1, 2 * PAGE)
    assert s.free == free + 2 * PAGE and s.tickets_held == held - 2 * PAGE
    assert s.tickets[granted].state == TicketState.GRANTED and s.generation == 2
    assert BY_ID["S15"].check(s) is None and BY_ID["S11"].check(s) is None
    # the failed ticket can never be granted or claimed; a holder answering it is told
    for name, args in (("respond", {"answer": (pending, "weights", True), "pending": queue_snapshot(s)}),
                       ("claim", {"ticket": pending}), ("cancel_ticket", {"ticket": pending})):
        outs = SYSTEM.action(name).step(s, **args)
        assert [getattr(b, "error", None) for b in outs.branches] == [InvalidTicket], name
    # the granted one is still the requester's
    g = drive(SYSTEM, s, "claim", ticket=granted)
    assert s.grants[g].nbytes == 4 * PAGE


def test_a_ticket_issued_after_the_reconfigure_has_the_new_generation() -> None:
    s, _pending, _granted = _scenario()
    drive(SYSTEM, s, "reconfigure", value=7)
    t = drive(SYSTEM, s, "issue_ticket", request=(PAGE, 0, 0))
    assert s.tickets[t].generation == s.generation == 2
    drive(SYSTEM, s, "reconfigure", value=8)
    assert s.tickets[t].state == TicketState.FAILED


def test_s15_fires_when_a_reconfigure_leaves_an_old_ticket_pending() -> None:
    s, pending, _granted = _scenario()
    original = governor.ticket_end

    def keeps_failed(s_: Any, t: Any, state: str) -> int:
        return 0 if state == TicketState.FAILED else original(s_, t, state)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(governor, "ticket_end", keeps_failed)
        drive(SYSTEM, s, "reconfigure", value=2)
    why = BY_ID["S15"].full_check(s)
    assert why and "pending from generation 1" in why
    # the record a later answer leaves fires the O(1) check too
    drive(SYSTEM, s, "respond", answer=(pending, "kv", False), pending=queue_snapshot(s),
          value=Seen(None, {"done": [], "released": 0, "state": TicketState.PENDING, "held": 2 * PAGE}))
    assert s.stale_tickets == 1 and "older configuration generation" in BY_ID["S15"].check(s)


def test_the_reference_governor_conforms_on_reconfigure() -> None:
    """The harness drives the reference through reconfigure and checks it (the spec's branch, the ledger)."""
    from memspec.invariants.repro import replay

    steps = [("issue_ticket", {"request": (8 * 2 * 1024 * 1024, 0, 0)}, []), ("reconfigure", {}, [])]
    run = replay("reference", "system", steps)
    assert [t.action for t in run.trace] == ["issue_ticket", "reconfigure"]
    assert run.trace[-1].outcome.startswith("returns") and run.state.tickets
    assert all(t.state == TicketState.FAILED for t in run.state.tickets.values())
