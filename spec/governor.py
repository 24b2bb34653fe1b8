"""The Governor / Authority: the budget department.

Seed 000: *The Governor is like a budget department*::

    Total capacity: 24 GB
    Approved:       22 GB
    Request:        500 MB
    Result:         can approve

*It maintains charges, reservations and leases.  When memory is tight, all
it can send is: pressure ticket: try to free 1 GB, priority = ...,
deadline = ...*  and *Authority never takes bytes directly. The Governor
must not unmap a holder's data directly.  A holder may legitimately release
0 bytes.*

The ledger of the authority (S11)::

    capacity == free + granted + charged        all >= 0
    granted  == open provisional grants + bytes held by pressure tickets
    charged  == sum of the holders' charges

A pressure ticket goes ``pending -> granted -> claimed``; ``pending`` or
``granted`` may be cancelled or time out; a terminal ticket holds 0 and the
bytes it held were given back exactly once (S15).

Configuration generations: the Governor's configuration (the budget it
approves against, *Total capacity: 24 GB / Approved: 22 GB*) carries a
generation, and every ticket the generation it was issued in.  When the
configuration changes (``reconfigure``) the generation moves on and every
ticket still *pending* from an older one fails: the bytes it held go back to
*free* exactly once, it can never be granted or claimed afterwards, and a
holder answering it is told (InvalidTicket).  A ticket already *granted*
keeps its bytes for the requester.  (The configuration's figures are not
part of the model: capacity stays what ``init`` set.)  Holders answer tickets
(``memspec.spec.holders``): the bytes a holder's releases refunded move from
*free* into the ticket, so nobody else takes them before the requester claims.
"""

from __future__ import annotations

from typing import Any

from memspec.spec import kernels as K
from memspec.spec.api import Grant, Lease, Ticket, TicketState
from memspec.spec.core import Domain, Returns, action, only, outcomes
from memspec.spec.errors import GrantDenied, InvalidRequest, InvalidTicket
from memspec.spec.state import GrantRec, LeaseRec, SysState, TicketRec, add, from_refs, is_size, new_ref

#: holders, in the spec's vocabulary; ``perform`` maps them to the names of
#: the system under test's roles
SESSION, WEIGHTS, KV = "session", "weights", "kv"
HOLDERS = (SESSION, WEIGHTS, KV)


def holder_name(sut: Any, holder: str) -> str:
    """The implementation's name for a spec holder."""
    if holder == WEIGHTS:
        return sut.weights.name
    if holder == KV:
        return sut.kv.name
    return SESSION


# --------------------------------------------------------------------------
# Ledger transitions (the kernels of memspec.spec.kernels, on the state)
# --------------------------------------------------------------------------


def ledger(s: SysState) -> K.Ledger:
    return K.Ledger(s.capacity, s.free, s.granted, s.charged)


def _set(s: SysState, led: K.Ledger) -> None:
    s.free, s.granted, s.charged = led.free, led.granted, led.charged


def take_grant(s: SysState, n: int) -> None:
    """Provisional grant of ``n`` bytes (caller checked it fits)."""
    _set(s, K.grant(ledger(s), n))
    s.open_grants += n


def return_grant(s: SysState, n: int) -> None:
    """*If the allocation fails, the provisional grant must be returned.*"""
    _set(s, K.cancel_grant(ledger(s), n))
    s.open_grants -= n


def charge(s: SysState, holder: str, granted: int, actual: int) -> None:
    """Turn a grant of ``granted`` bytes into a charge of the *actual* bytes
    (*act on the real allocated bytes; do not silently keep incorrect accounts*)."""
    _set(s, K.commit_grant(ledger(s), granted, actual))
    s.open_grants -= granted
    add(s.charged_by, holder, actual)


def charge_at_footprint(s: SysState, holder: str, planned: int, footprint: int) -> None:
    """The allocation transaction's accounting: grant, then charge the footprint."""
    take_grant(s, planned)
    charge(s, holder, planned, footprint)


# --------------------------------------------------------------------------
# Provisional grants and leases, used directly
# --------------------------------------------------------------------------


def _draw_grant_size(s: SysState, c: Any) -> Any:
    k = c.integer(0, 9)
    if k <= 6:
        return c.integer(1, 3) * s.page // 2
    if k == 7:
        return c.choice((0, -1))
    return s.capacity + s.page


@action(role="Governor",
        params={"nbytes": Domain("mostly half-pages, sometimes 0, negative or more than the capacity", _draw_grant_size)},
        perform=lambda sut, nbytes: sut.governor.reserve(SESSION, nbytes), invariants=("S8", "S11"), weight=2)
def reserve(s: SysState, nbytes: Any) -> Any:
    """Ask for a provisional grant of ``nbytes`` for the session holder.

    Not a positive int: InvalidRequest.  More than is free: GrantDenied.
    Otherwise returns a Grant of ``nbytes``; free drops and granted rises by
    that much (*B->>G: reserve(authority, holder, role, N); G-->>B:
    provisional grant*).  Every refusal leaves the ledger unchanged.
    """
    if not is_size(nbytes):
        return only(InvalidRequest, blame="S11")
    if nbytes > s.free:
        return only(GrantDenied, blame="S11", describe=f"{nbytes} > free {s.free}")

    def then(_v: Grant) -> int:
        ref = new_ref(s)
        s.grants[ref] = GrantRec(ref, SESSION, nbytes)
        s.grant_refs.add(ref)
        take_grant(s, nbytes)
        return ref

    return outcomes(
        Returns(f"a Grant of {nbytes}", lambda v: isinstance(v, Grant) and v.nbytes == nbytes, then,
                lambda: Grant(s.next_ref, SESSION, nbytes)),
        blame="S11",
    )


def _draw_commit(s: SysState, c: Any) -> tuple[int, int]:
    ref = s.grant_refs.at(c.integer(0, len(s.grant_refs) - 1))
    n = s.grants[ref].nbytes
    return (ref, max(0, n + c.integer(-2, 2) * (s.page // 4)))


@action(role="Governor",
        params={"grant": Domain("(grant, actual bytes): a grant (open, committed or cancelled) and a footprint near it",
                                _draw_commit, lambda s: len(s.grant_refs) > 0)},
        perform=lambda sut, grant: sut.governor.commit(sut.ref(grant[0]), grant[1]),
        invariants=("S2", "S8", "S11"), weight=2)
def commit(s: SysState, grant: tuple[int, int]) -> Any:
    """Turn an open grant into a lease charged at the actual bytes.

    The grant must be open -- committing a grant already committed or
    cancelled is a commit without a grant: InvalidRequest.  If the actual
    bytes exceed the grant by more than is free: GrantDenied, nothing
    changes.  Otherwise returns a Lease of exactly ``actual`` bytes; the
    grant's bytes leave *granted*, ``actual`` joins the holder's charge and
    the difference returns to (or comes from) *free*.
    """
    ref, actual = grant
    g = s.grants[ref]
    if g.state != "open":
        return only(InvalidRequest, blame="S2", describe=f"the grant is {g.state}: no grant to commit")
    if actual - g.nbytes > s.free:
        return only(GrantDenied, blame="S8", describe=f"{actual - g.nbytes} more needed, {s.free} free")

    def then(_v: Lease) -> int:
        g.state = "committed"
        charge(s, g.holder, g.nbytes, actual)
        lref = new_ref(s)
        s.leases[lref] = LeaseRec(lref, g.holder, actual)
        s.lease_refs.add(lref)
        add(s.lease_bytes, g.holder, actual)
        return lref

    return outcomes(
        Returns(f"a Lease of exactly {actual}", lambda v: isinstance(v, Lease) and v.nbytes == actual, then,
                lambda: Lease(s.next_ref, g.holder, actual)),
        blame="S8",
    )


@action(role="Governor", params={"grant": from_refs("a grant (open, committed or cancelled)", lambda s: s.grant_refs)},
        perform=lambda sut, grant: sut.governor.cancel(sut.ref(grant)), invariants=("S8", "S11"))
def cancel(s: SysState, grant: int) -> Any:
    """Return a provisional grant that will not be used.

    An open grant: returns its bytes, which go back to *free* exactly once.
    A grant already committed or cancelled: InvalidRequest.
    """
    g = s.grants[grant]
    if g.state != "open":
        return only(InvalidRequest, blame="S8", describe=f"the grant is {g.state}")

    def then(_v: int) -> None:
        g.state = "cancelled"
        return_grant(s, g.nbytes)

    return outcomes(Returns(f"exactly {g.nbytes}", lambda v: v == g.nbytes, then, lambda: g.nbytes), blame="S8")


@action(role="Governor", params={"lease": from_refs("a lease (live or refunded)", lambda s: s.lease_refs)},
        perform=lambda sut, lease: sut.governor.refund(sut.ref(lease)), invariants=("S11",))
def refund_lease(s: SysState, lease: int) -> Any:
    """Release a lease's charge after its physical bytes were freed.

    A live lease: returns its bytes; they leave the holder's charge for
    *free*.  Refunding it again: InvalidRequest.
    """
    l_ = s.leases[lease]
    if l_.refunded:
        return only(InvalidRequest, blame="S11", describe="already refunded")

    def then(_v: int) -> None:
        from memspec.spec.ep import refund

        l_.refunded = True
        s.lease_bytes[l_.holder] -= l_.nbytes
        refund(s, l_.holder, l_.nbytes)

    return outcomes(Returns(f"exactly {l_.nbytes}", lambda v: v == l_.nbytes, then, lambda: l_.nbytes), blame="S11")


# --------------------------------------------------------------------------
# Pressure tickets
# --------------------------------------------------------------------------


def ticket_receive(s: SysState, t: TicketRec, n: int) -> None:
    """``n`` bytes a holder's releases refunded move from free into the ticket."""
    if t.state == TicketState.PENDING and t.generation != s.generation:
        s.stale_tickets += 1  # a pending ticket of an older configuration should have failed
    _set(s, K.grant_from_free(ledger(s), n))
    t.held += n
    t.received += n
    s.tickets_held += n
    s.tickets_received += n
    if t.state == TicketState.PENDING and t.held >= t.amount:
        t.state = TicketState.GRANTED


def ticket_end(s: SysState, t: TicketRec, state: str) -> int:
    """A ticket becomes terminal; the bytes it holds go back to free, exactly once."""
    n = t.held
    _set(s, K.return_grant(ledger(s), n))
    t.held = 0
    t.returned += n
    t.returns += 1
    s.tickets_held -= n
    s.tickets_returned += n
    t.state = state
    return n


def _draw_ticket_args(s: SysState, c: Any) -> tuple[int, int, int]:
    k = c.integer(0, 9)
    amount = c.integer(1, 4) * s.page if k else c.choice((0, -s.page))
    deadline = 0 if c.boolean() else s.clock + c.integer(1, 5)
    return (amount, c.integer(0, 3), deadline)


@action(role="Governor",
        params={"request": Domain("(amount, priority, deadline): 1..4 pages (sometimes 0 or negative), deadline 0 = none",
                                  _draw_ticket_args)},
        perform=lambda sut, request: sut.governor.issue_ticket(SESSION, *request),
        enabled=lambda s: len(s.ticket_refs) < 40, invariants=("S6", "S15"))
def issue_ticket(s: SysState, request: tuple[int, int, int]) -> Any:
    """Send a pressure ticket: *try to free N bytes, priority = ..., deadline = ...*

    An amount that is not a positive int: InvalidRequest.  Otherwise returns
    a pending ticket holding 0 bytes; the Governor frees nothing itself
    (*Authority never takes bytes directly*).
    """
    amount, priority, deadline = request
    if not is_size(amount):
        return only(InvalidRequest, blame="S15")

    def then(_v: Ticket) -> int:
        ref = new_ref(s)
        s.tickets[ref] = TicketRec(ref, amount, priority, deadline, generation=s.generation)
        s.ticket_refs.add(ref)
        return ref

    return outcomes(
        Returns("a pending ticket holding 0",
                lambda v: isinstance(v, Ticket) and v.amount == amount and v.state == TicketState.PENDING
                and v.held == 0 and type(v.generation) is int,
                then, lambda: Ticket(s.next_ref, SESSION, amount, priority, deadline, 1)),
        blame="S15",
    )


TICKETS = from_refs("a ticket (any state)", lambda s: s.ticket_refs)


@action(role="Governor", params={"ticket": TICKETS}, perform=lambda sut, ticket: sut.governor.claim(sut.ref(ticket)),
        invariants=("S15", "S11"))
def claim(s: SysState, ticket: int) -> Any:
    """The requester takes what a granted ticket holds as a provisional grant.

    A granted ticket: returns a Grant of exactly the bytes held; the ticket
    becomes claimed and holds 0 (the bytes stay *granted*, now as the
    grant).  Any other state: InvalidTicket.
    """
    t = s.tickets[ticket]
    if t.state != TicketState.GRANTED:
        return only(InvalidTicket, blame="S15", describe=f"the ticket is {t.state}")
    n = t.held

    def then(_v: Grant) -> int:
        t.held = 0
        t.claimed += n
        t.state = TicketState.CLAIMED
        s.tickets_held -= n
        s.tickets_claimed += n
        ref = new_ref(s)
        s.grants[ref] = GrantRec(ref, SESSION, n)
        s.grant_refs.add(ref)
        s.open_grants += n
        return ref

    return outcomes(Returns(f"a Grant of exactly {n}", lambda v: isinstance(v, Grant) and v.nbytes == n, then,
                            lambda: Grant(s.next_ref, SESSION, n)), blame="S15")


@action(role="Governor", params={"ticket": TICKETS},
        perform=lambda sut, ticket: sut.governor.cancel_ticket(sut.ref(ticket)), invariants=("S15", "S11"))
def cancel_ticket(s: SysState, ticket: int) -> Any:
    """Cancel a pending or granted ticket.

    Returns the bytes it held, which go back to *free* exactly once; the
    ticket is cancelled and holds 0.  A terminal ticket (claimed, cancelled,
    timed out): InvalidTicket, and nothing is returned again.
    """
    t = s.tickets[ticket]
    if t.state in TicketState.TERMINAL:
        return only(InvalidTicket, blame="S15", describe=f"the ticket is already {t.state}")
    n = t.held
    return outcomes(Returns(f"exactly {n}", lambda v: v == n, lambda _v: ticket_end(s, t, TicketState.CANCELLED),
                            lambda: n), blame="S15")


def _draw_now(s: SysState, c: Any) -> tuple[int, tuple[int, ...]]:
    now = s.clock + c.integer(0, 4)
    live = tuple(r for r in s.ticket_refs if s.tickets[r].state not in TicketState.TERMINAL)
    return (now, live)


def _perform_expire(sut: Any, now: tuple[int, tuple[int, ...]]) -> tuple[int, ...]:
    t, live = now
    ids = {x.ticket_id for x in sut.governor.expire(t)}
    return tuple(r for r in live if sut.ref(r).ticket_id in ids)


@action(role="Governor",
        params={"now": Domain("(the time now, the live tickets): now advances by 0..4", _draw_now)},
        perform=_perform_expire, invariants=("S15", "S11"))
def expire(s: SysState, now: tuple[int, tuple[int, ...]]) -> Any:
    """Time out every live ticket whose deadline (0: none) has passed.

    Returns exactly the live tickets with ``0 < deadline <= now``; each
    becomes timed out and its bytes go back to *free*, exactly once.
    """
    t_now, live = now
    due = tuple(r for r in live if 0 < s.tickets[r].deadline <= t_now)

    def then(_v: Any) -> None:
        s.clock = max(s.clock, t_now)
        for r in due:
            ticket_end(s, s.tickets[r], TicketState.TIMED_OUT)

    return outcomes(Returns(f"the tickets {list(due)}", lambda v: tuple(v) == due, then, lambda: due), blame="S15")


@action(role="Governor", perform=lambda sut: sut.governor.reconfigure(), invariants=("S15", "S11"))
def reconfigure(s: SysState) -> Any:
    """The Governor's configuration changes: a new generation.

    Returns the new generation, an int.  Every ticket still *pending* from
    an older generation fails: the bytes it held go back to *free*, exactly
    once, and it holds 0; it can never be granted or claimed, and a holder
    that answers it gets InvalidTicket.  Granted tickets are kept.
    """
    stale = [r for r in s.ticket_refs if s.tickets[r].state == TicketState.PENDING]

    def accepts(v: Any) -> bool:
        return type(v) is int

    def then(_v: Any) -> None:
        s.generation += 1
        for r in stale:
            ticket_end(s, s.tickets[r], TicketState.FAILED)

    return outcomes(Returns(f"a new generation; the pending tickets {stale} fail", accepts, then,
                            lambda: s.generation + 1), blame="S15", touched=tuple(stale))


ACTIONS = [reserve, commit, cancel, refund_lease, issue_ticket, claim, cancel_ticket, expire, reconfigure]
