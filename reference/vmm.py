"""Page-granular VirtualBacking: seed 000's *when to install real memory behind an address*.

*10 GB contiguous virtual address / 0..100 MB → mapped real VRAM / 100 MB..10 GB
→ address only for now.*  ``reserve`` takes virtual address space only;
``commit_range`` installs physical pages behind a page-aligned range and
returns exactly the bytes it installed; ``decommit_range`` removes them and
keeps the address; ``committed_bytes`` counts the private pages installed by
``commit_range`` (pages mapped through :mod:`.shared` are counted by their
physical handle, once, never per address -- seed 000: shared prefix pages are
*counted once*).  The base address never moves (invariant S12).

The reservation table lives in :class:`VaSpace`, shared with the
SharedMapping of the same mechanism, so either capability accepts the
other's reservations (``spec.api``: *a mechanism that also provides
VirtualBacking must accept either's reservations*).

Handle errors (one meaning each): a reservation made by another mechanism
instance -> ForeignAllocation; ``release`` of an identity already released
-> DoubleFree; any other use of a released, never-issued or altered
reservation -> StaleHandle.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from memspec.spec.api import DeviceKey, Identity, IdentitySource, ReserveRequest, VirtualAllocation
from memspec.spec.errors import DoubleFree, ForeignAllocation, InvalidRange, InvalidRequest, StaleHandle

from memspec.reference.common import check_alignment, check_range, check_size, is_int, round_up
from memspec.reference.device import SimDevice


@dataclass
class Mapping:
    """One SharedMapping.map of a physical handle into a reservation."""

    mapping_id: int
    handle: Identity
    reservation: Identity
    first: int                # first page index in the reservation
    npages: int
    read_only: bool
    remaining: set[int] = field(default_factory=set)   # page indices still shared
    cow: set[int] = field(default_factory=set)         # page indices copied-on-write (private now)


@dataclass
class Reservation:
    va: VirtualAllocation
    npages: int
    private: dict[int, int] = field(default_factory=dict)   # page index -> physical page
    shared: dict[int, int] = field(default_factory=dict)    # page index -> mapping id
    cow: dict[int, int] = field(default_factory=dict)       # private page index copied from mapping id


@dataclass
class PhysRecord:
    """A SharedMapping physical handle: its pages and live mappings."""

    identity: Identity
    pages: list[int]
    mappings: set[int] = field(default_factory=set)
    released: bool = False    # the creator's reference was dropped
    freed: bool = False       # physical pages returned to the device


class VaSpace:
    """Reservations, physical handles and mappings of one mechanism instance."""

    def __init__(self, device: SimDevice, kind: str) -> None:
        self.dev = device
        self.page = device.page_size
        self.lock = threading.RLock()
        self.ids = IdentitySource(kind + "-va")
        self.handle_ids = IdentitySource(kind + "-phys")
        self.reservations: dict[Identity, Reservation] = {}
        self.issued = 0
        self.handles: dict[Identity, PhysRecord] = {}
        self.handles_issued = 0
        self.mappings: dict[int, Mapping] = {}
        self._next_mapping = 0

    # -- reservations ---------------------------------------------------

    def reserve(self, request: ReserveRequest) -> VirtualAllocation:
        if not isinstance(request, ReserveRequest):
            raise InvalidRequest(f"reserve takes a ReserveRequest, got {type(request).__name__}")
        size = round_up(check_size(request.size), self.page)
        align = check_alignment(request.alignment, allow_zero=True)
        with self.lock:
            addr = self.dev.va_reserve(size, align)
            ident = self.ids.new()
            self.issued = max(self.issued, ident.generation)
            va = VirtualAllocation(addr, size, ident, self.dev.key)
            self.reservations[ident] = Reservation(va, size // self.page)
            return va

    def lookup(self, va: object, *, releasing: bool = False) -> Reservation:
        if not isinstance(va, VirtualAllocation):
            raise InvalidRequest(f"expected a VirtualAllocation, got {type(va).__name__}")
        ident = va.identity
        if not isinstance(ident, Identity) or ident.creator != self.ids.creator:
            raise ForeignAllocation(f"reservation {ident} was not made by this mechanism ({self.ids.creator})")
        rec = self.reservations.get(ident) if is_int(ident.generation) else None   # a forged generation: no record
        if rec is None:
            was = is_int(ident.generation) and 0 < ident.generation <= self.issued
            if releasing and was:
                raise DoubleFree(f"reservation {ident} was already released")
            raise StaleHandle(f"reservation {ident} is not live" + ("" if was else " (never issued)"))
        if (rec.va.address, rec.va.size) != (va.address, va.size):
            raise StaleHandle(f"handle {ident} does not describe the live reservation (forged or altered)")
        return rec

    def pages_of(self, rec: Reservation, start: object, end: object) -> range:
        s, e = check_range(start, end, rec.va.size, self.page)
        return range(s // self.page, e // self.page)

    # -- private pages (VirtualBacking) ---------------------------------

    def commit(self, va: VirtualAllocation, start: int, end: int) -> int:
        with self.lock:
            rec = self.lookup(va)
            idx = self.pages_of(rec, start, end)
            for i in idx:
                if i in rec.private or i in rec.shared:
                    raise InvalidRange(f"page {i} of {va.identity} at offset {i * self.page} is already backed")
            phys = self.dev.alloc_pages(len(idx))    # OutOfMemory: nothing taken
            self.dev.map(rec.va.address + idx.start * self.page, phys, writable=True)
            for i, p in zip(idx, phys):
                rec.private[i] = p
            return len(idx) * self.page

    def decommit(self, va: VirtualAllocation, start: int, end: int) -> int:
        with self.lock:
            rec = self.lookup(va)
            idx = self.pages_of(rec, start, end)
            for i in idx:
                if i not in rec.private:
                    raise InvalidRange(
                        f"page {i} of {va.identity} at offset {i * self.page} is not committed"
                        + (" (it is a shared mapping: unmap it)" if i in rec.shared else "")
                    )
            self.dev.unmap(rec.va.address + idx.start * self.page, len(idx))
            self.dev.release_pages([rec.private.pop(i) for i in idx])
            for i in idx:
                self.forget_cow(rec, i)
            return len(idx) * self.page

    def committed(self, va: VirtualAllocation) -> int:
        with self.lock:
            return len(self.lookup(va).private) * self.page

    def release(self, va: VirtualAllocation) -> int:
        """Unmap everything left (private pages freed; shared mappings
        dropped, their handles freed if that was the last reference), then
        free the VA.  Returns physical bytes freed now."""
        with self.lock:
            rec = self.lookup(va, releasing=True)
            freed = self.drop_private(rec)
            for mid in sorted({m for m in rec.shared.values()}):
                freed += self.drop_mapping(rec, self.mappings[mid], sorted(self.mappings[mid].remaining))
            self.dev.va_free(rec.va.address, rec.va.size)
            del self.reservations[va.identity]
            return freed

    def free_reservation(self, va: VirtualAllocation) -> None:
        with self.lock:
            rec = self.lookup(va, releasing=True)
            if rec.private or rec.shared:
                raise InvalidRange(
                    f"reservation {va.identity} still has {len(rec.private) + len(rec.shared)} mapped page(s)"
                )
            self.dev.va_free(rec.va.address, rec.va.size)
            del self.reservations[va.identity]

    def drop_private(self, rec: Reservation) -> int:
        freed = 0
        for i in sorted(rec.private):
            self.dev.unmap(rec.va.address + i * self.page, 1)
            self.dev.release_pages([rec.private.pop(i)])
            self.forget_cow(rec, i)
            freed += self.page
        return freed

    def forget_cow(self, rec: Reservation, i: int) -> None:
        """Page ``i`` (a private copy made by copy-on-write) is gone."""
        mid = rec.cow.pop(i, None)
        if mid is not None:
            m = self.mappings[mid]
            m.cow.discard(i)
            if not m.remaining and not m.cow:
                del self.mappings[mid]

    # -- shared mappings (used by SharedMapping) ------------------------

    def new_mapping(self, handle: Identity, rec: Reservation, first: int, npages: int, ro: bool) -> Mapping:
        self._next_mapping += 1
        m = Mapping(self._next_mapping, handle, rec.va.identity, first, npages, ro, set(range(first, first + npages)))
        self.mappings[m.mapping_id] = m
        return m

    def drop_mapping(self, rec: Reservation, m: Mapping, pages: list[int]) -> int:
        """Unmap ``pages`` of mapping ``m``; if none remain, the mapping ends
        and its handle is freed when released and unmapped everywhere.
        Returns physical bytes freed."""
        for i in pages:
            self.dev.unmap(rec.va.address + i * self.page, 1)
            del rec.shared[i]
            m.remaining.discard(i)
        if m.remaining:
            return 0
        if not m.cow:
            del self.mappings[m.mapping_id]
        ph = self.handles[m.handle]
        ph.mappings.discard(m.mapping_id)
        return self.maybe_free(ph)

    def maybe_free(self, ph: PhysRecord) -> int:
        if ph.released and not ph.mappings and not ph.freed:
            self.dev.release_pages(ph.pages)
            ph.freed = True
            del self.handles[ph.identity]
            return len(ph.pages) * self.page
        return 0


class OverVaSpace:
    """What both capabilities of one mechanism share: its :class:`VaSpace`
    (device, page, reservations)."""

    def __init__(self, space: VaSpace) -> None:
        self._s = space

    def device(self) -> DeviceKey:
        return self._s.dev.key

    def granularity(self) -> int:
        return self._s.page

    def reserve(self, request: ReserveRequest) -> VirtualAllocation:
        """Reserve VA rounded up to the page; takes no physical bytes.
        Raises InvalidRequest (size/alignment), OutOfMemory (no VA left, e.g. 1 PiB)."""
        return self._s.reserve(request)


class ReferenceVirtualBacking(OverVaSpace):
    """``VirtualBacking`` over a :class:`VaSpace` (see the module docstring)."""

    def commit_range(self, allocation: VirtualAllocation, start: int, end: int) -> int:
        """Install private pages behind ``[start, end)``; return exactly
        ``end - start``.  Raises InvalidRange (misaligned, empty, past the
        end, already backed), OutOfMemory, StaleHandle, ForeignAllocation;
        on error nothing is committed."""
        return self._s.commit(allocation, start, end)

    def decommit_range(self, allocation: VirtualAllocation, start: int, end: int) -> int:
        """Remove the private pages of ``[start, end)`` (every page must be
        committed, else InvalidRange and nothing changes); the address stays."""
        return self._s.decommit(allocation, start, end)

    def committed_bytes(self, allocation: VirtualAllocation) -> int:
        return self._s.committed(allocation)

    def release(self, allocation: VirtualAllocation) -> int:
        """End the reservation, decommitting and unmapping what is left.
        A second release raises DoubleFree."""
        return self._s.release(allocation)
