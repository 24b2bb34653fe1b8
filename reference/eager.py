"""The eager allocator: seed 000's *ordinary allocate/free mechanism*.

*An ordinary eager allocator takes the full physical capacity when the
allocation is created: Request 10 GB ≈ immediately need 10 GB of physical
capacity.*

Footprint rule (documented choice): ``footprint = round_up(size, page_size)``
of the device -- the allocator maps whole physical pages behind every
allocation at ``allocate`` time, so the footprint is exactly the physical
bytes taken, and the device's page count proves it.  (No sub-page arena: a
finer unit would make two allocations share a physical page, which the
page-table device could not tell apart.)

Addresses come from an arena of virtual address space reserved once per
allocator (four times the device capacity, so OutOfMemory is decided by
physical pages, not by arena fragmentation), managed best-fit over ordered
free ranges with ``sortedcontainers``.  Addresses are reused; identities
never are (seed 000: *Identities are opaque, never derived from pointers*).
"""

from __future__ import annotations

import threading

from memspec.spec.api import AllocationRequest, DeviceAllocation, DeviceKey, Identity, IdentitySource
from memspec.spec.errors import DoubleFree, ForeignAllocation, InvalidRequest, OutOfMemory, StaleHandle

from memspec.reference.common import check_alignment, check_size, is_int, round_up
from memspec.reference.device import RangeAllocator, SimDevice


class EagerAllocator:
    """``DeviceAllocator`` over a :class:`SimDevice`: best fit, page-granular footprint."""

    def __init__(self, device: SimDevice, *, kind: str = "reference-eager") -> None:
        self._dev = device
        self._ids = IdentitySource(kind)
        self.creator = self._ids.creator
        self._lock = threading.RLock()
        arena = 4 * device.capacity
        self._arena_base = device.va_reserve(arena)
        self._arena = RangeAllocator(self._arena_base, arena, device.page_size)
        self._live: dict[Identity, tuple[DeviceAllocation, list[int]]] = {}
        self._issued = 0  # highest generation handed out

    # -- DeviceAllocator ------------------------------------------------

    def device(self) -> DeviceKey:
        return self._dev.key

    def footprint(self, size: int) -> int:
        """The footprint :meth:`allocate` will take for ``size`` bytes."""
        return round_up(check_size(size), self._dev.page_size)

    def live_bytes(self) -> int:
        with self._lock:
            return sum(a.footprint for a, _ in self._live.values())

    def live_count(self) -> int:
        with self._lock:
            return len(self._live)

    def allocate(self, request: AllocationRequest) -> DeviceAllocation:
        """Take ``round_up(size, page)`` physical bytes now. Raises
        InvalidRequest (size not a positive int, alignment not a power of
        two) or OutOfMemory; on error nothing is taken."""
        if not isinstance(request, AllocationRequest):
            raise InvalidRequest(f"allocate takes an AllocationRequest, got {type(request).__name__}")
        size = check_size(request.size)
        align = check_alignment(request.alignment)
        page = self._dev.page_size
        fp = round_up(size, page)
        with self._lock:
            free = self._dev.free_pages() * page
            if fp > free:
                raise OutOfMemory(
                    f"eager allocate of {size} bytes needs {fp} bytes of pages; {free} free "
                    f"of {self._dev.capacity}",
                    requested=size,
                    total_capacity=self._dev.capacity,
                    free=free,
                    allocated=self._dev.physical_bytes(),
                    largest_free_block=free,
                    device=self._dev.key.ordinal,
                )
            addr = self._arena.alloc(fp, max(align, page))
            if addr is None:
                raise OutOfMemory(
                    f"eager allocate of {size} bytes: no {fp}-byte range aligned to {align} in the arena",
                    requested=size,
                    total_capacity=self._dev.capacity,
                    free=free,
                    largest_free_block=self._arena.largest_free(),
                    device=self._dev.key.ordinal,
                )
            try:
                phys = self._dev.alloc_pages(fp // page)
            except OutOfMemory:
                self._arena.free(addr, fp)
                raise
            self._dev.map(addr, phys, writable=True)
            ident = self._ids.new()
            self._issued = max(self._issued, ident.generation)
            alloc = DeviceAllocation(addr, size, fp, ident, self._dev.key)
            self._live[ident] = (alloc, phys)
            return alloc

    def _lookup(self, allocation: object) -> tuple[DeviceAllocation, list[int]]:
        if not isinstance(allocation, DeviceAllocation):
            raise InvalidRequest(f"expected a DeviceAllocation, got {type(allocation).__name__}")
        ident = allocation.identity
        if not isinstance(ident, Identity) or ident.creator != self.creator:
            raise ForeignAllocation(
                f"allocation {ident} was not made by this allocator ({self.creator}); "
                "seed 000: an allocation may only be released by the mechanism that created it"
            )
        rec = self._live.get(ident) if is_int(ident.generation) else None   # a forged generation: no record
        if rec is None:
            if is_int(ident.generation) and 0 < ident.generation <= self._issued:
                raise DoubleFree(f"allocation {ident} at {allocation.address:#x} was already freed")
            raise StaleHandle(f"allocation {ident} was never issued by {self.creator}")
        live = rec[0]
        if (live.address, live.size, live.footprint) != (allocation.address, allocation.size, allocation.footprint):
            raise StaleHandle(f"handle {ident} does not describe the live allocation (forged or altered)")
        return rec

    def deallocate(self, allocation: DeviceAllocation) -> int:
        """Free an allocation made here; return its footprint.  Raises
        ForeignAllocation (another allocator's handle), DoubleFree (its
        identity was already freed, even if the address is now reused),
        StaleHandle (never issued here, or altered)."""
        with self._lock:
            alloc, phys = self._lookup(allocation)
            page = self._dev.page_size
            self._dev.unmap(alloc.address, len(phys))
            self._dev.release_pages(phys)
            self._arena.free(alloc.address, alloc.footprint)
            del self._live[alloc.identity]
            return len(phys) * page

    def is_live(self, allocation: DeviceAllocation) -> bool:
        with self._lock:
            rec = self._live.get(allocation.identity)
            return rec is not None and rec[0].address == allocation.address
