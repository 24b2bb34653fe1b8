"""``SharedMapping`` on the CUDA driver: one ``cuMemCreate`` handle mapped at
several virtual addresses (the programming guide's *virtual aliasing*).

Seed 000: *This requires a physical handle, multi-address mapping, reference
counting, read-only protection, and possibly Copy-on-Write.*

* ``create`` is one ``cuMemCreate``; the creator's reference is kept until
  ``release`` (``cuMemRelease``), after which the driver frees the memory when
  the last mapping goes -- the same lifetime rule, enforced by the driver.
* ``map`` maps the handle granule by granule (``cuMemMap`` with the handle
  offset), so that copy-on-write and unmapping can work page by page, then
  sets access once: ``PROT_READ`` for a read-only mapping, so device writes
  through it fault.
* ``copy_on_write`` of one whole mapping puts a fresh private page (its own
  ``cuMemCreate``) behind each of its granules with the same bytes (a
  device-to-device copy on the mechanism's own stream, synchronized),
  transactionally.  The copy sees work that completed before the call: a
  mechanism holds no fences, so the caller waits for (or synchronizes) writes
  still queued to the shared pages first.  The mapping then holds private pages: the handle loses
  it (``mapping_count`` drops), and ``unmap`` later removes and frees them.
* ``mapping_count`` counts live ``map`` calls still mapping the handle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memspec.spec.api import PhysicalHandle, ReserveRequest, VirtualAllocation
from memspec.spec.errors import (
    DoubleFree,
    ForeignAllocation,
    InvalidRange,
    InvalidRequest,
    StaleHandle,
)
from memspec.cuda_impl.driver import CudaError, CudaOutOfMemory
from memspec.cuda_impl.vmm import Transaction, VmmCore, _is_int, _Page, _Reservation, check_identity


@dataclass(eq=False)
class _Handle:
    ph: PhysicalHandle
    cu: Any
    released: bool = False
    mapped_pages: int = 0
    mappings: set = field(default_factory=set)

    def page_unmapped(self, core: VmmCore) -> int:
        """One driver mapping of this handle went; return the bytes freed by it."""
        self.mapped_pages -= 1
        if self.released and self.mapped_pages == 0:
            del core.handles[self.ph.identity]
            core.ctx.unpin()
            return self.ph.size
        return 0


@dataclass(eq=False)
class _SharedMap:
    res: _Reservation
    offset: int
    size: int
    handle: _Handle
    read_only: bool
    pages: set = field(default_factory=set)   # granule indices still mapping the handle
    cow: set = field(default_factory=set)     # granule indices replaced by private copies


class CudaSharedMapping:
    """``SharedMapping`` over one ``cuMemCreate`` handle per physical allocation."""

    def __init__(self, core: VmmCore) -> None:
        self._core = core

    def granularity(self) -> int:
        return self._core.gran

    def reserve(self, request: ReserveRequest) -> VirtualAllocation:
        return self._core.new_reservation(request)

    def free_reservation(self, allocation: VirtualAllocation) -> None:
        """End a reservation; it must have no page backed (InvalidRange otherwise)."""
        c = self._core
        with c.lock:
            r = c.reservation(allocation, releasing=True)
            if r.pages:
                raise InvalidRange(f"reservation {allocation.identity} still has {len(r.pages)} backed pages")
            c.end_reservation(r)

    # -- handles ------------------------------------------------------------
    def _handle(self, handle: Any, *, releasing: bool = False, live: bool = True) -> _Handle:
        c = self._core
        c.live_check()
        if not isinstance(handle, PhysicalHandle):
            raise InvalidRequest(f"expected a PhysicalHandle, got {type(handle).__name__}")
        check_identity(handle.identity, c.ids.creator, "physical handle")
        c.ctx.make_current()
        h = c.handles.get(handle.identity)
        if h is None or (live and h.released):
            if releasing:
                raise DoubleFree(f"physical handle {handle.identity} was already released")
            raise StaleHandle(f"physical handle {handle.identity} was released")
        if h.ph.size != handle.size:
            raise StaleHandle(f"physical handle {handle.identity} does not match the live one (size {handle.size!r:.40})")
        return h

    def create(self, size: int) -> PhysicalHandle:
        """Physical pages of ``size`` bytes (a positive multiple of the granularity)."""
        c = self._core
        c.live_check()
        if not _is_int(size) or size <= 0 or size % c.gran:
            raise InvalidRequest(f"size must be a positive multiple of {c.gran}, got {size!r}")
        with c.lock:
            c.ctx.make_current()
            try:
                cu = c.drv.cuMemCreate(size, c.prop, 0)
            except CudaOutOfMemory as e:
                raise c.oom(e, size) from e
            try:
                c.ctx.pin()
            except BaseException:
                c.drv.cuMemRelease(cu)
                raise
            ph = PhysicalHandle(size, c.ids.new(), c.device_key)
            c.handles[ph.identity] = _Handle(ph, cu)
            return ph

    def map(self, handle: PhysicalHandle, allocation: VirtualAllocation, offset: int, *, read_only: bool) -> int:
        """Map the whole handle at ``allocation.address + offset``; return the bytes mapped."""
        c = self._core
        drv, g = c.drv, c.gran
        if not isinstance(read_only, bool):
            raise InvalidRequest(f"read_only must be a bool, got {read_only!r}")
        with c.lock:
            h = self._handle(handle)
            r = c.reservation(allocation)
            if not _is_int(offset):
                raise InvalidRange(f"offset must be an int, got {offset!r}")
            pages = c.page_range(r, offset, offset + h.ph.size)
            if any(i in r.pages for i in pages):
                raise InvalidRange(f"[{offset}, {offset + h.ph.size}) is already (partly) backed")
            tx = Transaction()
            try:
                for k, i in enumerate(pages):
                    addr = r.base + i * g
                    drv.cuMemMap(addr, g, k * g, h.cu, 0)
                    tx.record(f"cuMemUnmap({addr:#x})", lambda a=addr: drv.cuMemUnmap(a, g))
                drv.cuMemSetAccess(r.base + offset, h.ph.size, [c.ro if read_only else c.rw], 1)
            except CudaError as e:
                failed = tx.rollback()
                if failed:
                    e.add_note("rollback failures: " + "; ".join(failed))
                raise
            m = _SharedMap(r, offset, h.ph.size, h, bool(read_only), set(pages))
            for i in pages:
                r.pages[i] = _Page("shared", mapping=m)
            h.mapped_pages += len(pages)
            h.mappings.add(m)
            return h.ph.size

    def unmap(self, allocation: VirtualAllocation, offset: int, size: int) -> int:
        """Remove exactly one mapping made by :meth:`map` (with the private
        pages copy-on-write put there, which are freed); return its size."""
        c = self._core
        with c.lock:
            r = c.reservation(allocation)
            m = self._mapping_at(r, offset, size)
            for i in sorted(m.pages | m.cow):
                c.unmap_page(r, i)
            return m.size

    def _mapping_at(self, r: _Reservation, offset: Any, size: Any) -> _SharedMap:
        if not (_is_int(offset) and _is_int(size)):
            raise InvalidRange(f"offset and size must be ints, got {offset!r}, {size!r}")
        g = self._core.gran
        first = r.pages.get(offset // g) if offset % g == 0 else None
        m = first.mapping if first is not None and first.kind in ("shared", "cow") else None
        if m is None or m.offset != offset or m.size != size:
            raise InvalidRange(f"[{offset}, {offset + size}) is not exactly one mapping made by map()")
        return m

    def copy_on_write(self, allocation: VirtualAllocation, offset: int, size: int) -> int:
        """Replace the shared pages of exactly one mapping ``[offset, offset+size)``
        by private writable copies with the same bytes; return the private
        bytes newly committed (its size).  Transactional."""
        c = self._core
        drv, g = c.drv, c.gran
        with c.lock:
            r = c.reservation(allocation)
            m0 = self._mapping_at(r, offset, size)
            if m0.cow:
                raise InvalidRange(f"[{offset}, {offset + size}) was copied on write already: its pages are private")
            pages = sorted(m0.pages)
            tx = Transaction()
            c.ctx.make_current()
            stream = c.stream()
            try:
                tmp = drv.cuMemAddressReserve(size, 0, 0, 0)
                tx.record("cuMemAddressFree(tmp)", lambda: drv.cuMemAddressFree(tmp, size))
                fresh = []
                for k in range(len(pages)):
                    h = drv.cuMemCreate(g, c.prop, 0)
                    tx.record(f"cuMemRelease({int(h):#x})", lambda h=h: drv.cuMemRelease(h))
                    drv.cuMemMap(int(tmp) + k * g, g, 0, h, 0)
                    tx.record("cuMemUnmap(tmp page)", lambda a=int(tmp) + k * g: drv.cuMemUnmap(a, g))
                    fresh.append(h)
                drv.cuMemSetAccess(tmp, size, [c.rw], 1)
                drv.cuMemcpyDtoDAsync(tmp, r.base + offset, size, stream)
                drv.cuStreamSynchronize(stream)
                # swap each shared granule for its private copy
                olds = []
                for k, i in enumerate(pages):
                    addr = r.base + i * g
                    m = r.pages[i].mapping
                    old = drv.cuMemRetainAllocationHandle(addr)
                    olds.append(old)
                    tx.record("cuMemRelease(retained)", lambda o=old: drv.cuMemRelease(o))
                    drv.cuMemUnmap(addr, g)
                    hoff = i * g - m.offset
                    desc = c.ro if m.read_only else c.rw

                    def remap(a=addr, o=old, hoff=hoff, desc=desc):
                        drv.cuMemMap(a, g, hoff, o, 0)
                        drv.cuMemSetAccess(a, g, [desc], 1)

                    tx.record(f"remap({addr:#x})", remap)
                    drv.cuMemMap(addr, g, 0, fresh[k], 0)
                    tx.record(f"cuMemUnmap({addr:#x})", lambda a=addr: drv.cuMemUnmap(a, g))
                drv.cuMemSetAccess(r.base + offset, size, [c.rw], 1)
            except CudaError as e:
                failed = tx.rollback()
                if failed:
                    e.add_note("rollback failures: " + "; ".join(failed))
                if isinstance(e, CudaOutOfMemory):
                    raise c.oom(e, size) from e
                raise
            # committed: drop the temporary view and every extra reference
            for k in range(len(pages)):
                drv.cuMemUnmap(int(tmp) + k * g, g)
                drv.cuMemRelease(fresh[k])
            drv.cuMemAddressFree(tmp, size)
            for k, i in enumerate(pages):
                m = r.pages[i].mapping
                drv.cuMemRelease(olds[k])              # the reference retained for the undo
                m.pages.discard(i)
                m.cow.add(i)
                if not m.pages:
                    m.handle.mappings.discard(m)
                m.handle.page_unmapped(c)
                r.pages[i] = _Page("cow", mapping=m)
            return size

    def mapping_count(self, handle: PhysicalHandle) -> int:
        """Live mappings of ``handle`` (StaleHandle once its memory is freed)."""
        with self._core.lock:
            return len(self._handle(handle, live=False).mappings)

    def release(self, handle: PhysicalHandle) -> int:
        """Drop the creator's reference (``cuMemRelease``); return the bytes
        freed now: the handle's size if nothing maps it, else 0 (freed at the
        last unmap)."""
        c = self._core
        with c.lock:
            h = self._handle(handle, releasing=True)
            c.drv.cuMemRelease(h.cu)
            h.released = True
            if h.mapped_pages == 0:
                del c.handles[handle.identity]
                c.ctx.unpin()
                return h.ph.size
            return 0
