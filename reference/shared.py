"""SharedMapping: seed 000's *how multiple addresses share physical memory*.

*A's virtual address ─┐ ├── same batch of prefix physical pages / B's virtual
address ─┘.  This requires a physical handle, multi-address mapping,
reference counting, read-only protection, and possibly Copy-on-Write.*

* ``create`` takes physical pages once (counted once, whatever the number of
  addresses it is later mapped at).
* ``map`` installs the whole handle at an offset of a reservation, read-only
  or writable; read-only is enforced by the device's page table, so a write
  through it is a recorded fault (and ``ReadOnlyViolation`` for a host copy).
* ``mapping_count`` is the number of live mappings (the reference count minus
  the creator's own reference).
* The physical pages are freed only after the last unmap **and** the
  creator's ``release`` (invariant S13).
* ``copy_on_write`` replaces shared pages at one address by private copies
  with the same bytes (a page is private once copied; the mapping it came from
  ends when none of its pages remain shared there).
"""

from __future__ import annotations

from memspec.spec.api import Identity, PhysicalHandle, VirtualAllocation
from memspec.spec.errors import DoubleFree, ForeignAllocation, InvalidRange, InvalidRequest, StaleHandle

from memspec.reference.common import check_range, check_size, is_int
from memspec.reference.vmm import OverVaSpace, PhysRecord


class ReferenceSharedMapping(OverVaSpace):
    """``SharedMapping`` over the :class:`VaSpace` of one mechanism instance."""

    def free_reservation(self, allocation: VirtualAllocation) -> None:
        """End a reservation; InvalidRange if anything is still mapped in it."""
        self._s.free_reservation(allocation)

    # -- physical handles -----------------------------------------------

    def _handle(self, handle: object, *, releasing: bool = False, counting: bool = False) -> PhysRecord:
        """The live record of ``handle``. A released handle still mapped
        somewhere can be counted but not mapped again; a freed one is stale."""
        if not isinstance(handle, PhysicalHandle):
            raise InvalidRequest(f"expected a PhysicalHandle, got {type(handle).__name__}")
        ident = handle.identity
        if not isinstance(ident, Identity) or ident.creator != self._s.handle_ids.creator:
            raise ForeignAllocation(f"physical handle {ident} was not made by this mechanism")
        ph = self._s.handles.get(ident) if is_int(ident.generation) else None   # a forged generation: no record
        if ph is None:
            was = is_int(ident.generation) and 0 < ident.generation <= self._s.handles_issued
            if releasing and was:
                raise DoubleFree(f"physical handle {ident} was already released and freed")
            raise StaleHandle(f"physical handle {ident} is not live" + (" (freed)" if was else " (never issued)"))
        if len(ph.pages) * self._s.page != handle.size:
            raise StaleHandle(f"handle {ident} does not describe the live physical handle (altered)")
        if ph.released and not releasing and not counting:
            raise StaleHandle(f"physical handle {ident} was released by its creator")
        if ph.released and releasing:
            raise DoubleFree(f"physical handle {ident} was already released")
        return ph

    def create(self, size: int) -> PhysicalHandle:
        """Physical pages for ``size`` bytes (a positive multiple of the page,
        else InvalidRequest). Raises OutOfMemory; nothing taken on error."""
        check_size(size)
        if size % self._s.page:
            raise InvalidRequest(f"shared handle size {size} is not a multiple of the {self._s.page}-byte page")
        with self._s.lock:
            pages = self._s.dev.alloc_pages(size // self._s.page)
            ident = self._s.handle_ids.new()
            self._s.handles_issued = max(self._s.handles_issued, ident.generation)
            self._s.handles[ident] = PhysRecord(ident, pages)
            return PhysicalHandle(size, ident, self._s.dev.key)

    def map(self, handle: PhysicalHandle, allocation: VirtualAllocation, offset: int, *, read_only: bool) -> int:
        """Map the whole handle at ``allocation.address + offset``; return
        the bytes mapped. InvalidRange if misaligned, past the end, or any
        page there is already backed."""
        if not isinstance(read_only, bool):
            raise InvalidRequest(f"read_only must be a bool, got {read_only!r}")
        with self._s.lock:
            ph = self._handle(handle)
            rec = self._s.lookup(allocation)
            if not is_int(offset):
                raise InvalidRange(f"offset must be an int, got {offset!r}")
            idx = self._s.pages_of(rec, offset, offset + handle.size)
            for i in idx:
                if i in rec.private or i in rec.shared:
                    raise InvalidRange(f"page at offset {i * self._s.page} of {allocation.identity} is already backed")
            self._s.dev.map(rec.va.address + idx.start * self._s.page, ph.pages, writable=not read_only)
            m = self._s.new_mapping(ph.identity, rec, idx.start, len(idx), read_only)
            for i in idx:
                rec.shared[i] = m.mapping_id
            ph.mappings.add(m.mapping_id)
            return len(idx) * self._s.page

    def unmap(self, allocation: VirtualAllocation, offset: int, size: int) -> int:
        """Remove one whole mapping made by :meth:`map`, exactly ``[offset,
        offset+size)``: its shared pages, and the private copies made from it
        by copy-on-write (freed).  Any other range (part of a mapping, two
        mappings, a page that is not a mapping) is InvalidRange and nothing
        changes.  Returns the bytes unmapped."""
        with self._s.lock:
            rec = self._s.lookup(allocation)
            if not is_int(offset) or not is_int(size):
                raise InvalidRange(f"unmap range must be ints, got {offset!r}+{size!r}")
            idx = self._s.pages_of(rec, offset, offset + size)
            mids: set[int] = set()
            for i in idx:
                mid = rec.shared.get(i, rec.cow.get(i))
                if mid is None:
                    raise InvalidRange(f"page at offset {i * self._s.page} of {allocation.identity} is not a shared mapping")
                mids.add(mid)
            if len(mids) != 1:
                raise InvalidRange(f"[{offset}, {offset + size}) spans {len(mids)} mappings; unmap one whole mapping")
            m = self._s.mappings[next(iter(mids))]
            if (m.first, m.npages) != (idx.start, len(idx)) or (m.remaining | m.cow) != set(idx):
                raise InvalidRange(f"[{offset}, {offset + size}) is not exactly mapping {m.mapping_id}")
            for mid in sorted(mids):
                m = self._s.mappings[mid]
                for i in sorted(m.cow):
                    self._s.dev.unmap(rec.va.address + i * self._s.page, 1)
                    self._s.dev.release_pages([rec.private.pop(i)])
                    self._s.forget_cow(rec, i)
                if m.remaining:
                    self._s.drop_mapping(rec, m, sorted(m.remaining))
            return len(idx) * self._s.page

    def copy_on_write(self, allocation: VirtualAllocation, offset: int, size: int) -> int:
        """Replace the shared pages at ``[offset, offset+size)`` by private,
        writable copies holding the same bytes; return the private bytes
        newly committed.  InvalidRange if any page there is not shared;
        OutOfMemory (nothing changed) if the copies do not fit."""
        with self._s.lock:
            rec = self._s.lookup(allocation)
            if not is_int(offset) or not is_int(size):
                raise InvalidRange(f"copy-on-write range must be ints, got {offset!r}+{size!r}")
            idx = self._s.pages_of(rec, offset, offset + size)
            mids = {rec.shared.get(i) for i in idx}
            if None in mids:
                raise InvalidRange(f"a page of [{offset}, {offset + size}) of {allocation.identity} is not shared")
            if len(mids) != 1:
                raise InvalidRange(f"[{offset}, {offset + size}) spans {len(mids)} mappings; copy within one")
            fresh = self._s.dev.alloc_pages(len(idx))
            dev, page = self._s.dev, self._s.page
            for i, p in zip(idx, fresh):
                addr = rec.va.address + i * page
                old = dev.entry(addr)
                dev.copy_page(old.phys, p)  # type: ignore[union-attr]
                m = self._s.mappings[rec.shared[i]]
                m.cow.add(i)
                rec.cow[i] = m.mapping_id
                self._s.drop_mapping(rec, m, [i])
                dev.map(addr, [p], writable=True)
                rec.private[i] = p
            return len(idx) * page

    def mapping_count(self, handle: PhysicalHandle) -> int:
        with self._s.lock:
            ph = self._handle(handle, counting=True)
            return len(ph.mappings)

    def release(self, handle: PhysicalHandle) -> int:
        """Drop the creator's reference; physical pages are freed now if no
        mapping remains (return their bytes), else at the last unmap (return 0).
        A second release raises DoubleFree."""
        with self._s.lock:
            ph = self._handle(handle, releasing=True)
            ph.released = True
            return self._s.maybe_free(ph)
