"""The Governor / Authority: seed 000's budget department.

*Total capacity: 24 GB / Approved: 22 GB / Request: 500 MB / Result: can
approve.*  It maintains provisional grants, charges (leases) per holder and
pressure tickets, and nothing else: *Authority never takes bytes directly.
The Governor must not unmap a holder's data directly.*

Ledger, at every instant (invariant S11)::

    capacity == free + granted + charged,  all >= 0

where ``granted`` counts live provisional grants plus bytes held by pressure
tickets, and ``charged`` is the sum of live leases.

Pressure tickets (seed 000: *pressure ticket: try to free 1 GB, priority =
..., deadline = ...*) go ``pending -> granted -> claimed``; ``pending`` or
``granted`` may be cancelled, time out (``expire``) or, if pending, fail
when the governor is reconfigured (``reconfigure`` bumps the generation).
A holder answers a ticket by releasing what it safely can (its releases go
through the EP's deferred-free queue and refund its leases as usual) and the
answer is recorded with :meth:`respond`, which moves the released bytes from
*free* into the ticket (so nobody else takes them before the requester
claims).  Net effect of a holder's answer: its charge becomes the ticket's
grant.  A terminal ticket holds 0; its bytes were returned exactly once
(invariant S15).

Every refusal leaves the ledger unchanged.

Grants, leases and tickets are bound to the governor that issued them: ids
come from one process-wide counter (so two governors never issue the same
id) and every grant or lease handed back is checked against this
governor's own record of it -- id, holder and issued size -- so another
governor's grant, or a hand-built ``Lease(id, holder, nbytes=1)``, is
refused with InvalidRequest and the ledger is unchanged.
"""

from __future__ import annotations

import itertools
import threading

from memspec.spec.api import Grant, Lease, Ticket, TicketState
from memspec.spec.errors import GrantDenied, InvalidRequest, InvalidTicket

from memspec.reference.common import check_size, is_int

#: ids of grants, leases and tickets: unique across every governor of the process
_IDS = itertools.count(1)


class ReferenceGovernor:
    """``Governor`` of one authority with a fixed ``capacity`` (bytes)."""

    def __init__(self, capacity: int, *, name: str = "governor") -> None:
        self.name = name
        self._cap = check_size(capacity, "capacity")
        self._lock = threading.RLock()
        self._free = self._cap
        self._granted = 0
        self._charged = 0
        self._by_holder: dict[str, int] = {}
        self._grants: dict[int, Grant] = {}
        self._leases: dict[int, tuple[str, int]] = {}   # lease id -> (holder, bytes remaining)
        self._issued_leases: dict[int, Lease] = {}       # lease id -> the Lease handed out (live ones)
        self._tickets: dict[int, Ticket] = {}
        self._ids = _IDS
        self.generation = 1
        self.history: list[tuple[int, str, int]] = []   # (ticket id, event, bytes) for tests/demos

    # -- the ledger -----------------------------------------------------

    def capacity(self) -> int:
        return self._cap

    def free(self) -> int:
        with self._lock:
            return self._free

    def granted(self) -> int:
        with self._lock:
            return self._granted

    def charged(self, holder: str | None = None) -> int:
        with self._lock:
            return self._charged if holder is None else self._by_holder.get(holder, 0)

    def ledger(self) -> tuple[int, int, int, int]:
        """``(capacity, free, granted, charged)`` read atomically."""
        with self._lock:
            return self._cap, self._free, self._granted, self._charged

    def balanced(self) -> bool:
        c, f, g, ch = self.ledger()
        return c == f + g + ch and min(f, g, ch) >= 0

    def live_grants(self) -> int:
        with self._lock:
            return len(self._grants)

    def live_leases(self) -> int:
        with self._lock:
            return len(self._leases)

    # -- grants and leases ----------------------------------------------

    @staticmethod
    def _holder(holder: object) -> str:
        if not isinstance(holder, str) or not holder:
            raise InvalidRequest(f"holder must be a non-empty str, got {holder!r}")
        return holder

    def reserve(self, holder: str, nbytes: int) -> Grant:
        """Provisional grant of ``nbytes``. GrantDenied if more than is free."""
        self._holder(holder)
        check_size(nbytes, "grant size")
        with self._lock:
            if nbytes > self._free:
                raise GrantDenied(
                    f"{holder} asks {nbytes} bytes; {self._free} free of {self._cap} "
                    f"({self._granted} granted, {self._charged} charged)"
                )
            g = Grant(next(self._ids), holder, nbytes)
            self._free -= nbytes
            self._granted += nbytes
            self._grants[g.grant_id] = g
            return g

    def _take_grant(self, grant: object) -> Grant:
        if not isinstance(grant, Grant):
            raise InvalidRequest(f"expected a Grant, got {type(grant).__name__}")
        live = self._grants.get(grant.grant_id) if is_int(grant.grant_id) else None
        if live is None or live != grant:
            raise InvalidRequest(f"grant {grant.grant_id!r:.40} is not a live grant of {self.name} "
                                 "(already committed or cancelled, or issued by another governor)")
        return live

    def _lease(self, lease: object) -> tuple[str, int]:
        """The live record of ``lease``: it must be exactly a Lease this
        governor handed out (id, holder and issued size), not a copy altered
        or built by hand, nor another governor's."""
        if not isinstance(lease, Lease):
            raise InvalidRequest(f"expected a Lease, got {type(lease).__name__}")
        rec = self._leases.get(lease.lease_id) if is_int(lease.lease_id) else None
        if rec is None or self._issued_leases.get(lease.lease_id) != lease:
            raise InvalidRequest(f"lease {lease.lease_id!r:.40} is not a live lease of {self.name} "
                                 "(already refunded, altered, or issued by another governor)")
        return rec

    def _new_lease(self, holder: str, nbytes: int) -> Lease:
        lease = Lease(next(self._ids), holder, nbytes)
        self._leases[lease.lease_id] = (holder, nbytes)
        self._issued_leases[lease.lease_id] = lease
        return lease

    def _drop_lease(self, lease_id: int) -> None:
        del self._leases[lease_id]
        del self._issued_leases[lease_id]

    def commit(self, grant: Grant, actual: int) -> Lease:
        """Turn the grant into a charge of the *actual* bytes; the difference
        is returned to free (or taken from it: GrantDenied if not there)."""
        if not is_int(actual) or actual < 0:
            raise InvalidRequest(f"actual bytes must be an int >= 0, got {actual!r}")
        with self._lock:
            g = self._take_grant(grant)
            extra = actual - g.nbytes
            if extra > self._free:
                raise GrantDenied(
                    f"grant {g.grant_id} of {g.nbytes} bytes cannot become a charge of {actual}: "
                    f"{extra} more needed, {self._free} free"
                )
            del self._grants[g.grant_id]
            self._granted -= g.nbytes
            self._free -= extra
            self._charged += actual
            if actual:
                self._by_holder[g.holder] = self._by_holder.get(g.holder, 0) + actual
            return self._new_lease(g.holder, actual)

    def cancel(self, grant: Grant) -> int:
        """Return a provisional grant (seed 000: *If the allocation fails, the
        provisional grant must be returned*). Returns its bytes."""
        with self._lock:
            g = self._take_grant(grant)
            del self._grants[g.grant_id]
            self._granted -= g.nbytes
            self._free += g.nbytes
            return g.nbytes

    def refund(self, lease: Lease, nbytes: int | None = None) -> int:
        """Release a charge after its physical bytes were freed: all that is
        left of the lease, or ``nbytes`` of it (a partial decommit).  A
        lease refunded in full is gone; refunding it again is InvalidRequest."""
        with self._lock:
            holder, left = self._lease(lease)
            n = left if nbytes is None else nbytes
            if not is_int(n) or n < 0 or n > left:
                raise InvalidRequest(f"refund of {nbytes!r} bytes from lease {lease.lease_id} holding {left}")
            if n == left:
                self._drop_lease(lease.lease_id)
            else:
                self._leases[lease.lease_id] = (holder, left - n)
            self._charged -= n
            self._free += n
            h = self._by_holder.get(holder, 0) - n
            if h:
                self._by_holder[holder] = h
            else:
                self._by_holder.pop(holder, None)
            return n

    def split(self, lease: Lease, nbytes: int) -> Lease:
        """Carve ``nbytes`` of a live lease into a new lease of the same
        holder (the ledger does not change: the same bytes, a new record --
        used when pages change owner, e.g. a KV page becoming shared)."""
        with self._lock:
            holder, left = self._lease(lease)
            if not is_int(nbytes) or nbytes <= 0 or nbytes > left:
                raise InvalidRequest(f"cannot split {nbytes!r} bytes from lease {lease.lease_id} holding {left}")
            if nbytes == left:
                self._drop_lease(lease.lease_id)
            else:
                self._leases[lease.lease_id] = (holder, left - nbytes)
            return self._new_lease(holder, nbytes)

    def merge(self, leases: list[Lease]) -> Lease:
        """One lease for several live leases of one holder (ledger unchanged)."""
        with self._lock:
            if not isinstance(leases, (list, tuple)) or not leases:
                raise InvalidRequest("merge takes a non-empty list of live leases of one holder")
            recs = [self._lease(x) for x in leases]
            if len({r[0] for r in recs}) != 1 or len({x.lease_id for x in leases}) != len(leases):
                raise InvalidRequest("merge takes distinct live leases of one holder")
            for x in leases:
                self._drop_lease(x.lease_id)
            return self._new_lease(recs[0][0], sum(r[1] for r in recs))

    def lease_bytes(self, lease: Lease) -> int:
        """Bytes left on a lease of this governor (0 once refunded)."""
        with self._lock:
            if not isinstance(lease, Lease):
                raise InvalidRequest(f"expected a Lease, got {type(lease).__name__}")
            if not is_int(lease.lease_id) or self._issued_leases.get(lease.lease_id) != lease:
                return 0
            return self._leases[lease.lease_id][1]

    # -- pressure tickets -----------------------------------------------

    def issue_ticket(self, requester: str, amount: int, priority: int = 0, deadline: int = 0) -> Ticket:
        """Seed 000: *pressure ticket: try to free 1 GB, priority = ...,
        deadline = ...* (``deadline`` 0: none)."""
        self._holder(requester)
        check_size(amount, "ticket amount")
        if not is_int(priority) or not is_int(deadline) or deadline < 0:
            raise InvalidRequest(f"priority/deadline must be ints (deadline >= 0), got {priority!r}/{deadline!r}")
        with self._lock:
            t = Ticket(next(self._ids), requester, amount, priority, deadline, self.generation)
            self._tickets[t.ticket_id] = t
            self.history.append((t.ticket_id, "issued", amount))
            return t

    def _ticket(self, ticket: object) -> Ticket:
        if not isinstance(ticket, Ticket):
            raise InvalidTicket(f"expected a Ticket, got {type(ticket).__name__}")
        t = self._tickets.get(ticket.ticket_id) if is_int(ticket.ticket_id) else None
        if t is None or t is not ticket:
            raise InvalidTicket(f"ticket {ticket.ticket_id} was not issued by this governor")
        return t

    def tickets(self, state: str | None = None) -> list[Ticket]:
        with self._lock:
            return [t for t in self._tickets.values() if state is None or t.state == state]

    def respond(self, ticket: Ticket, holder: str, released: int) -> Ticket:
        """Record that ``holder`` released ``released`` bytes for the ticket
        (0 is a valid answer).  The bytes (already refunded to free by the
        holder's releases) move into the ticket; once it holds ``amount`` it
        is granted.  InvalidTicket if terminal or of a stale generation;
        InvalidRequest if ``released`` is not an int in ``[0, free]``."""
        self._holder(holder)
        with self._lock:
            t = self._ticket(ticket)
            if t.state not in (TicketState.PENDING, TicketState.GRANTED):
                raise InvalidTicket(f"ticket {t.ticket_id} is {t.state}; no more responses")
            if t.state == TicketState.PENDING and t.generation != self.generation:
                raise InvalidTicket(f"ticket {t.ticket_id} is of generation {t.generation}, now {self.generation}")
            if not is_int(released) or released < 0 or released > self._free:
                raise InvalidRequest(
                    f"{holder} reports {released!r} bytes released but only {self._free} are free: "
                    "a holder reports what its releases already refunded"
                )
            self._free -= released
            self._granted += released
            t.held += released
            t.released[holder] = t.released.get(holder, 0) + released
            self.history.append((t.ticket_id, f"respond:{holder}", released))
            if t.state == TicketState.PENDING and t.held >= t.amount:
                t.state = TicketState.GRANTED
                self.history.append((t.ticket_id, "granted", t.held))
            return t

    def claim(self, ticket: Ticket) -> Grant:
        """The requester takes what the ticket holds as a provisional grant
        (then ``commit``/``cancel`` it as usual). Only a granted ticket."""
        with self._lock:
            t = self._ticket(ticket)
            if t.state != TicketState.GRANTED:
                raise InvalidTicket(f"ticket {t.ticket_id} is {t.state}; only a granted ticket can be claimed")
            g = Grant(next(self._ids), t.requester, t.held)
            self._grants[g.grant_id] = g         # the bytes stay counted as granted
            t.held = 0
            t.state = TicketState.CLAIMED
            self.history.append((t.ticket_id, "claimed", g.nbytes))
            return g

    def _end(self, t: Ticket, state: str) -> int:
        n = t.held
        self._granted -= n
        self._free += n
        t.held = 0
        t.state = state
        self.history.append((t.ticket_id, state, n))
        return n

    def cancel_ticket(self, ticket: Ticket) -> int:
        """Cancel a pending or granted ticket; its bytes return to free
        exactly once (returned). InvalidTicket if already terminal."""
        with self._lock:
            t = self._ticket(ticket)
            if t.state in TicketState.TERMINAL:
                raise InvalidTicket(f"ticket {t.ticket_id} is already {t.state}")
            return self._end(t, TicketState.CANCELLED)

    def expire(self, now: int) -> list[Ticket]:
        """Time out every live ticket whose deadline (if any) is ``<= now``."""
        if not is_int(now):
            raise InvalidRequest(f"now must be an int, got {now!r}")
        with self._lock:
            out = []
            for t in self._tickets.values():
                if t.state not in TicketState.TERMINAL and 0 < t.deadline <= now:
                    self._end(t, TicketState.TIMED_OUT)
                    out.append(t)
            return out

    def reconfigure(self) -> int:
        """Bump the generation; stale *pending* tickets fail (their bytes
        returned once). Returns the new generation."""
        with self._lock:
            self.generation += 1
            for t in self._tickets.values():
                if t.state == TicketState.PENDING and t.generation != self.generation:
                    self._end(t, TicketState.FAILED)
            return self.generation
