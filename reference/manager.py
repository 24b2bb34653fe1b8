"""ProcessMemoryManager and MemoryBinding: seed 000's wiring roles.

The manager is responsible for *registration, mechanism selection,
authority, provider/context lifetime* and not for *deciding which weight or
KV page to evict*; it *selects the allocator but does not duplicate the EP's
stream/context responsibilities* (it never synchronizes a stream).

* ``select`` installs a mechanism on a device and bumps the device's
  generation; ``capabilities`` always answers for the mechanism installed
  **now** (invariant S3: *a capability query must not return a stale
  allocator snapshot*).  Allocations keep the mechanism that created them and
  are released through it even after a replacement (S1).
* A context is pinned by every live allocation/reservation made in it and
  every queued release of one; ``destroy_context`` raises ContextBusy while
  pinned (S10: *the context is not destroyed while an allocation is still
  alive*).

The binding runs seed 000's first sequence diagram::

    H->>B: request N bytes;  B->>G: reserve(authority, holder, role, N)
    G-->>B: provisional grant;  B->>E/A: allocate(N, alignment)
    B->>G: commit(grant, actual bytes);  B-->>H: usable view

*If the allocation fails, the provisional grant must be returned. When the
actual footprint differs from the plan, act on the real allocated bytes.*
The grant is planned at the requested size; the charge is the footprint.
For VirtualBacking it charges before it commits (S2): grant ``end - start``,
``commit_range``, then charge the bytes actually committed.
"""

from __future__ import annotations

import itertools
import threading
from typing import Callable

from memspec.spec.api import (
    AllocationRequest,
    Capabilities,
    DeviceKey,
    DeviceMemoryMechanism,
    ExecutionProvider,
    Governor,
    Grant,
    ReserveRequest,
)
from memspec.spec.errors import (
    ContextBusy,
    ForeignAllocation,
    GrantDenied,
    InvalidRange,
    InvalidRequest,
    NotRegistered,
    StaleHandle,
    Unsupported,
)

from memspec.reference.common import check_size, is_int
from memspec.reference.handles import RefAllocation, RefReservation


class ReferenceManager:
    """``ProcessMemoryManager``: registry, selection, authorities, context pins."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._serial = itertools.count(1)
        self._mechanisms: dict[str, tuple[DeviceKey, DeviceMemoryMechanism]] = {}
        self._contexts: dict[str, ExecutionProvider] = {}
        self._authorities: dict[str, Governor] = {}
        self._installed: dict[DeviceKey, tuple[str, int]] = {}   # device -> (mechanism id, generation)
        self._generation: dict[DeviceKey, int] = {}
        self._pins: dict[str, int] = {}
        self.destroyed: set[str] = set()

    # -- registration -----------------------------------------------------

    def register_mechanism(self, device: DeviceKey, mechanism: DeviceMemoryMechanism) -> str:
        """Register a mechanism for ``device`` (its allocator must be on that
        device, else InvalidRequest); returns its mechanism id."""
        if not isinstance(device, DeviceKey):
            raise InvalidRequest(f"expected a DeviceKey, got {device!r}")
        alloc = mechanism.allocator()
        if alloc.device() != device:
            raise InvalidRequest(f"mechanism {mechanism.name!r} is on {alloc.device()}, not {device}")
        with self._lock:
            mid = f"mech{next(self._serial)}:{mechanism.name}"
            self._mechanisms[mid] = (device, mechanism)
            return mid

    def register_context(self, ep: ExecutionProvider) -> str:
        with self._lock:
            cid = ep.context_id
            if cid in self._contexts or cid in self.destroyed:
                raise InvalidRequest(f"context {cid} is already registered (or was destroyed)")
            self._contexts[cid] = ep
            self._pins[cid] = 0
            return cid

    def register_authority(self, governor: Governor) -> str:
        with self._lock:
            aid = f"authority{next(self._serial)}"
            self._authorities[aid] = governor
            return aid

    def mechanism(self, mechanism_id: str) -> DeviceMemoryMechanism:
        with self._lock:
            if mechanism_id not in self._mechanisms:
                raise NotRegistered(f"mechanism {mechanism_id!r} is not registered")
            return self._mechanisms[mechanism_id][1]

    def context(self, context_id: str) -> ExecutionProvider:
        with self._lock:
            ep = self._contexts.get(context_id)
            if ep is None:
                raise NotRegistered(f"context {context_id!r} is not registered" +
                                    (" (destroyed)" if context_id in self.destroyed else ""))
            return ep

    def authority(self, authority_id: str) -> Governor:
        with self._lock:
            g = self._authorities.get(authority_id)
            if g is None:
                raise NotRegistered(f"authority {authority_id!r} is not registered")
            return g

    # -- selection --------------------------------------------------------

    def select(self, device: DeviceKey, mechanism_id: str) -> int:
        """Install ``mechanism_id`` on ``device``; return the new generation."""
        with self._lock:
            if mechanism_id not in self._mechanisms:
                raise NotRegistered(f"mechanism {mechanism_id!r} is not registered")
            mdev, _ = self._mechanisms[mechanism_id]
            if mdev != device:
                raise InvalidRequest(f"mechanism {mechanism_id} is registered for {mdev}, not {device}")
            gen = self._generation.get(device, 0) + 1
            self._generation[device] = gen
            self._installed[device] = (mechanism_id, gen)
            return gen

    def installed(self, device: DeviceKey) -> tuple[str, DeviceMemoryMechanism, int]:
        """``(mechanism id, mechanism, generation)`` installed on ``device`` now."""
        with self._lock:
            if device not in self._installed:
                raise NotRegistered(f"no mechanism selected on {device}")
            mid, gen = self._installed[device]
            return mid, self._mechanisms[mid][1], gen

    def capabilities(self, device: DeviceKey) -> Capabilities:
        mid, mech, gen = self.installed(device)
        return Capabilities(device, mid, gen, mech.virtual_backing() is not None, mech.shared_mapping() is not None)

    def bind(self, device: DeviceKey, context_id: str, authority_id: str) -> "ReferenceBinding":
        with self._lock:
            self.installed(device)
            ep = self.context(context_id)
            gov = self.authority(authority_id)
            if ep.device() != device:
                raise InvalidRequest(f"context {context_id} is on {ep.device()}, not {device}")
            return ReferenceBinding(self, device, context_id, authority_id, ep, gov)

    # -- context pins -----------------------------------------------------

    def pin(self, context_id: str) -> Callable[[], None]:
        """Pin a live context; return the matching (exactly-once) unpin."""
        with self._lock:
            self.context(context_id)
            self._pins[context_id] += 1
        done = [False]

        def unpin() -> None:
            with self._lock:
                if not done[0]:
                    done[0] = True
                    self._pins[context_id] -= 1
        return unpin

    def pins(self, context_id: str) -> int:
        """Live allocations + queued releases made in the context (0 once destroyed)."""
        with self._lock:
            if context_id in self.destroyed:
                return 0
            if context_id not in self._pins:
                raise NotRegistered(f"context {context_id!r} is not registered")
            return self._pins[context_id]

    def destroy_context(self, context_id: str) -> None:
        """Raises ContextBusy while pinned; NotRegistered if unknown."""
        with self._lock:
            self.context(context_id)
            if self._pins[context_id]:
                raise ContextBusy(
                    f"context {context_id} still pinned by {self._pins[context_id]} live allocation(s) "
                    "or queued release(s)"
                )
            del self._contexts[context_id]
            del self._pins[context_id]
            self.destroyed.add(context_id)


class _Decommit:
    """One queued decommit: its page offsets, and those a later commit revived."""

    def __init__(self, offsets: range) -> None:
        self.offsets = offsets
        self.revived: set[int] = set()
        self.ran = False


class GrowthTxn:
    """Steps 3, 4 and 6 of seed 000's KV growth transaction over one reservation.

    Construction (step 3) takes the provisional grant for the whole range;
    :meth:`commit` (step 4) installs backing, possibly in several pieces;
    :meth:`finish` (step 6) charges the range; :meth:`rollback` (after a
    failure at step 4 or 5) decommits every piece it installed and returns
    the grant.  Pages of the range whose decommit is still queued behind a
    fence are still mapped: they are *revived* (taken back from the queued
    decommit) instead of being mapped again -- a VA page in use by device
    work is never remapped under it.
    """

    def __init__(self, binding: "ReferenceBinding", reservation: RefReservation, start: int, end: int) -> None:
        self.b = binding
        self.res = reservation
        self.start, self.end = start, end
        self.page = reservation.backing.granularity()
        self.pieces: list[tuple[int, int]] = []
        self.revived: list[tuple[int, _Decommit]] = []
        self.grant: Grant | None = binding.governor.reserve(reservation.holder, end - start)
        self.done = False

    def commit(self, start: int, end: int) -> int:
        """Install backing for ``[start, end)`` (within the transaction):
        pages whose decommit is still queued are claimed back from it (they
        are still mapped), the others are committed in contiguous pieces."""
        if not (self.start <= start < end <= self.end):
            raise InvalidRange(f"[{start}, {end}) is outside the transaction's [{self.start}, {self.end})")
        with self.res.lock:
            for off in range(start, end, self.page):
                entry = self.res.decommitting.pop(off, None)
                if entry is not None:
                    entry.revived.add(off)
                    self.revived.append((off, entry))
            pending = {off for off, _ in self.revived}
        n, run = 0, None
        for off in range(start, end + self.page, self.page):
            fresh = off < end and off not in pending
            if fresh and run is None:
                run = off
            elif not fresh and run is not None:
                n += self.res.backing.commit_range(self.res.allocation, run, off)
                self.pieces.append((run, off))
                run = None
        return n

    def finish(self) -> int:
        """Charge the whole range (fresh pages and revived ones) and record it."""
        n = self.end - self.start
        lease = self.b.governor.commit(self.grant, n)
        with self.res.lock:
            self.res.leases.append(lease)
            self.res.pages.update(range(self.start, self.end, self.page))
        self.grant, self.done = None, True
        return n

    def rollback(self) -> None:
        if self.done:
            return
        for s_, e in reversed(self.pieces):
            self.res.backing.decommit_range(self.res.allocation, s_, e)
        self.pieces.clear()
        with self.res.lock:      # give revived pages back to their queued decommit (or unmap them if it ran)
            for off, entry in self.revived:
                if entry.ran:
                    self.res.backing.decommit_range(self.res.allocation, off, off + self.page)
                else:
                    entry.revived.discard(off)
                    self.res.decommitting[off] = entry
            self.revived.clear()
        if self.grant is not None:
            self.b.governor.cancel(self.grant)
            self.grant = None
        self.done = True


class ReferenceBinding:
    """``MemoryBinding``: one device + context + authority, through the manager.

    The mechanism is looked up at every call (the one installed now); handles
    remember their creator.  ``governor`` and ``ep`` are exposed for holders.
    """

    def __init__(self, manager: ReferenceManager, device: DeviceKey, context_id: str, authority_id: str,
                 ep: ExecutionProvider, governor: Governor) -> None:
        self.manager = manager
        self.device = device
        self.context_id = context_id
        self.authority_id = authority_id
        self.ep = ep
        self.governor = governor

    def capabilities(self) -> Capabilities:
        return self.manager.capabilities(self.device)

    def _context_live(self) -> None:
        self.manager.context(self.context_id)   # NotRegistered once destroyed

    def allocate(self, holder: str, size: int, *, alignment: int = 256) -> RefAllocation:
        """Grant ``size`` -> allocate -> charge the footprint; on failure the
        grant is returned and nothing is left behind."""
        if not isinstance(holder, str) or not holder:
            raise InvalidRequest(f"holder must be a non-empty str, got {holder!r}")
        check_size(size)
        self._context_live()
        mid, mech, _ = self.manager.installed(self.device)
        alloc = mech.allocator()
        grant = self.governor.reserve(holder, size)
        try:
            a = alloc.allocate(AllocationRequest(size, alignment))
        except BaseException:
            self.governor.cancel(grant)
            raise
        try:
            lease = self.governor.commit(grant, a.footprint)
        except GrantDenied:
            # never exposed, never used by device work: free it directly, then return the grant
            alloc.deallocate(a)
            self.governor.cancel(grant)
            raise
        unpin = self.manager.pin(self.context_id)
        return RefAllocation(a, holder, mid, self.context_id, alloc, lease, self.ep, self.governor, unpin)

    def reserve(self, holder: str, size: int) -> RefReservation:
        """Reserve VA through the installed mechanism's VirtualBacking
        (Unsupported if it has none). Takes no physical bytes, so no charge."""
        mid, mech, _ = self.manager.installed(self.device)
        vb = mech.virtual_backing()
        if vb is None:
            raise Unsupported(f"mechanism {mid} has no VirtualBacking (explicitly absent)")
        if not isinstance(holder, str) or not holder:
            raise InvalidRequest(f"holder must be a non-empty str, got {holder!r}")
        check_size(size)
        self._context_live()
        va = vb.reserve(ReserveRequest(size))
        unpin = self.manager.pin(self.context_id)
        return RefReservation(va, holder, mid, self.context_id, vb, self.ep, self.governor, unpin)

    def _own(self, reservation: object) -> RefReservation:
        if not isinstance(reservation, RefReservation):
            raise InvalidRequest(f"expected a reservation made by a binding, got {type(reservation).__name__}")
        if reservation.context_id != self.context_id:
            raise ForeignAllocation(f"reservation of context {reservation.context_id} used through {self.context_id}")
        if reservation.closed:
            raise StaleHandle(f"reservation {reservation.allocation.identity} was dropped")
        return reservation

    def transaction(self, reservation: RefReservation, start: int, end: int) -> GrowthTxn:
        """Start a charge-before-commit transaction over ``[start, end)``.
        Checked first, with the ledger untouched: a page-aligned range inside
        the reservation (InvalidRange), none of its pages committed already
        (InvalidRange)."""
        res = self._own(reservation)
        page = res.backing.granularity()
        if not is_int(start) or not is_int(end) or start < 0 or end <= start or end > res.allocation.size \
                or start % page or end % page:
            raise InvalidRange(f"[{start!r}, {end!r}) is not a page-aligned range inside {res.allocation.size} bytes")
        with res.lock:
            busy = [o for o in range(start, end, page) if o in res.pages]
        if busy:
            raise InvalidRange(f"offset {busy[0]} of [{start}, {end}) is already committed")
        return GrowthTxn(self, res, start, end)

    def commit(self, reservation: RefReservation, start: int, end: int) -> int:
        """Charge-then-commit ``[start, end)``: grant, ``commit_range``,
        charge; on failure roll back the mapping and return the grant."""
        txn = self.transaction(reservation, start, end)
        try:
            txn.commit(start, end)
            return txn.finish()
        except BaseException:
            txn.rollback()
            raise

    def decommit(self, reservation: RefReservation, start: int, end: int) -> int:
        """Decommit ``[start, end)``: the pages leave the reservation's
        committed bytes now; their unmapping and refund are queued behind the
        reservation's fences (seed 000: *wait for the related stream/fence
        to finish*).  Every page must be committed (InvalidRange otherwise,
        nothing changes).  Returns ``end - start``."""
        res = self._own(reservation)
        page = res.backing.granularity()
        if not is_int(start) or not is_int(end) or start < 0 or end <= start or end > res.allocation.size \
                or start % page or end % page:
            raise InvalidRange(f"[{start!r}, {end!r}) is not a page-aligned range inside {res.allocation.size} bytes")
        offsets = range(start, end, page)
        entry = _Decommit(offsets)
        with res.lock:
            missing = [o for o in offsets if o not in res.pages]
            if missing:
                raise InvalidRange(f"offset {missing[0]} of [{start}, {end}) is not committed")
            for o in offsets:
                res.pages.discard(o)
                res.decommitting[o] = entry
        n = end - start
        unpin = self.manager.pin(self.context_id)
        gov = self.governor

        def release() -> None:
            try:
                with res.lock:
                    entry.ran = True
                    if res.released:      # the reservation's own release freed (and refunded) everything
                        return
                    mine = [o for o in offsets if o not in entry.revived]
                    for o in mine:
                        res.decommitting.pop(o, None)
                    run = None
                    for o in mine + [None]:
                        if run is not None and (o is None or o != run[1]):
                            res.backing.decommit_range(res.allocation, run[0], run[1])
                            run = None
                        if o is not None:
                            run = (run[0], o + page) if run else (o, o + page)
                left = n
                with res.lock:
                    for lease in reversed(list(res.leases)):
                        if not left:
                            break
                        have = gov.lease_bytes(lease)
                        take = min(left, have)
                        if take and take == have:
                            gov.refund(lease)  # the whole lease: the contract's own call
                        elif take:
                            gov.refund(lease, take)  # part of it: the reference Governor's partial refund
                        left -= take
                        if gov.lease_bytes(lease) == 0:
                            res.leases.remove(lease)
            finally:
                unpin()

        self.ep.defer(res.fences(), release)
        return n
