"""VMM ``VirtualBacking`` on the CUDA driver.

Seed 000: *A VMM can separate the "virtual address" from the "physical
backing"* -- ``reserve`` is ``cuMemAddressReserve`` (no physical bytes),
``commit_range`` installs one ``cuMemCreate`` page per granule with
``cuMemMap`` and one ``cuMemSetAccess`` over the range, ``decommit_range``
``cuMemUnmap``s page by page (a sub-range of one mapping cannot be unmapped),
``release`` unmaps what is left and ``cuMemAddressFree``s.

Two real-world bugs this must not have (cuda.core VirtualMemoryResource):

* the creation reference of every ``cuMemCreate`` handle is released right
  after ``cuMemMap`` -- the mapping keeps the memory alive, and unmapping it
  frees the memory; keeping the creation reference leaks every page;
* nothing here unmaps under queued work by itself: decommit and release run
  when called, and the execution provider's deferred-free queue calls them
  only after the fences of the work that used the range completed.

Every multi-call operation is a transaction: each driver call that succeeded
records its undo, and an error rolls the undos back in reverse, so *on error
nothing stays committed* (seed 000: *roll back the provisional mapping*).
The reservation registry is shared with :class:`~memspec.cuda_impl.shared.CudaSharedMapping`
of the same mechanism (it must accept either's reservations).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from memspec.spec.api import (
    DeviceKey,
    Identity,
    IdentitySource,
    PhysicalHandle,
    ReserveRequest,
    VirtualAllocation,
    is_power_of_two,
)
from memspec.spec.errors import (
    DoubleFree,
    ForeignAllocation,
    InvalidRange,
    InvalidRequest,
    OutOfMemory,
    StaleHandle,
)
from memspec.cuda_impl.context import PrimaryContext
from memspec.cuda_impl.driver import CudaError, CudaOutOfMemory, Driver


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def round_up(n: int, g: int) -> int:
    return -(-n // g) * g


def check_identity(ident: Any, creator: str, what: str) -> None:
    """A handle's identity must be an :class:`Identity` with an int
    generation (anything else -- a forged handle -- is InvalidRequest) made
    by ``creator`` (else ForeignAllocation).  The caller then checks it
    against its own records."""
    if not isinstance(ident, Identity) or not isinstance(ident.creator, str) or not _is_int(ident.generation):
        raise InvalidRequest(f"{what} handle has a forged identity {ident!r:.80}")
    if ident.creator != creator:
        raise ForeignAllocation(f"{what} {ident} was made by another mechanism ({creator} is this one)")


@dataclass
class _Page:
    """One granule of a reservation: ``kind`` "private" (a committed page; the
    mapping holds the only reference unless ``leaked``), "shared" (one page
    of a SharedMapping mapping) or "cow" (a private copy that replaced a
    shared page by copy-on-write; it still belongs to that mapping)."""

    kind: str
    mapping: Any = None      # _SharedMap for shared pages
    handle: Any = None       # leaked creation reference (mutant only)


@dataclass
class _Reservation:
    va: VirtualAllocation
    pages: dict[int, _Page] = field(default_factory=dict)   # granule index -> page

    @property
    def base(self) -> int:
        return self.va.address

    def private_pages(self) -> int:
        return sum(1 for p in self.pages.values() if p.kind == "private")


class Transaction:
    """Undo log of driver calls: ``record(undo)`` after each call that
    succeeded; ``rollback()`` runs them in reverse and collects their errors."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Callable[[], object]]] = []

    def record(self, what: str, undo: Callable[[], object]) -> int:
        self._undo.append((what, undo))
        return len(self._undo) - 1

    def forget(self, index: int) -> None:
        self._undo[index] = ("", lambda: None)

    def rollback(self) -> list[str]:
        failed: list[str] = []
        while self._undo:
            what, undo = self._undo.pop()
            try:
                undo()
            except Exception as e:  # keep undoing the rest
                failed.append(f"{what}: {e}")
        return failed


class VmmCore:
    """State shared by a mechanism's VirtualBacking and SharedMapping: the
    driver, context pins, identities, reservations, shared handles."""

    def __init__(self, drv: Driver, ctx: PrimaryContext, *, kind: str, leak_creation_handles: bool = False) -> None:
        self.drv = drv
        self.ctx = ctx
        self.ordinal = ctx.ordinal
        self.device_key = DeviceKey(drv.kind, ctx.ordinal)
        self.ids = IdentitySource(kind)
        self.lock = threading.RLock()
        self.prop = drv.allocation_prop(ctx.ordinal)
        t = drv.types
        self.gran = int(drv.cuMemGetAllocationGranularity(
            self.prop, t.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
        self.rw = drv.access_desc(ctx.ordinal, read_only=False)
        self.ro = drv.access_desc(ctx.ordinal, read_only=True)
        self.reservations: dict[Any, _Reservation] = {}
        self.handles: dict[Any, Any] = {}       # Identity -> shared._Handle
        self.leak_creation_handles = leak_creation_handles
        self._stream: Any = None
        self.closed = False       # set by the mechanism's close(): every later call is refused

    def live_check(self) -> None:
        if self.closed:
            raise InvalidRequest(f"mechanism {self.ids.creator} is closed")

    # -- identity checks --------------------------------------------------
    def reservation(self, va: Any, *, releasing: bool = False) -> _Reservation:
        self.live_check()
        if not isinstance(va, VirtualAllocation):
            raise InvalidRequest(f"expected a VirtualAllocation, got {type(va).__name__}")
        check_identity(va.identity, self.ids.creator, "reservation")
        self.ctx.make_current()   # contexts are per thread; a drop may run on any thread
        r = self.reservations.get(va.identity)
        if r is None:
            if releasing:
                raise DoubleFree(f"reservation {va.identity} was already released")
            raise StaleHandle(f"reservation {va.identity} is no longer live")
        if r.va.address != va.address or r.va.size != va.size:
            raise StaleHandle(f"reservation {va.identity} does not match the live one")
        return r

    def page_range(self, r: _Reservation, start: Any, end: Any) -> range:
        """Granule indices of ``[start, end)``; InvalidRange unless aligned, non-empty, inside."""
        if not (_is_int(start) and _is_int(end)):
            raise InvalidRange(f"range bounds must be ints, got {start!r}, {end!r}")
        g = self.gran
        if not 0 <= start < end <= r.va.size:
            raise InvalidRange(f"[{start}, {end}) is empty, reversed or outside the reservation of {r.va.size} bytes")
        if start % g or end % g:
            raise InvalidRange(f"[{start}, {end}) is not aligned to the granularity {g}")
        return range(start // g, end // g)

    # -- driver helpers -----------------------------------------------------
    def oom(self, e: CudaOutOfMemory, requested: int) -> OutOfMemory:
        try:
            free, total = self.drv.mem_info()
        except CudaError:
            free = total = None
        return OutOfMemory(
            f"CUDA out of memory: {e.call} could not get {requested} bytes (free {free} of {total})",
            requested=requested, free=free, total_capacity=total, device=self.ordinal)

    def stream(self) -> Any:
        """A private non-blocking stream for the mechanism's own copies."""
        if self._stream is None:
            self.ctx.make_current()
            self._stream = self.drv.cuStreamCreate(1)   # CU_STREAM_NON_BLOCKING
        return self._stream

    def new_reservation(self, request: Any) -> VirtualAllocation:
        self.live_check()
        if not isinstance(request, ReserveRequest):
            raise InvalidRequest(f"expected a ReserveRequest, got {type(request).__name__}")
        size, alignment = request.size, request.alignment
        if not _is_int(size) or size <= 0:
            raise InvalidRequest(f"reservation size must be a positive int, got {size!r}")
        if not _is_int(alignment) or (alignment != 0 and not is_power_of_two(alignment)):
            raise InvalidRequest(f"alignment must be 0 or a power of two, got {alignment!r}")
        g = self.gran
        rounded = round_up(size, g)
        with self.lock:
            self.ctx.make_current()
            try:
                ptr = self.drv.cuMemAddressReserve(rounded, alignment if alignment > g else 0, 0, 0)
            except CudaOutOfMemory as e:
                raise self.oom(e, rounded) from e
            try:
                self.ctx.pin()
            except BaseException:
                self.drv.cuMemAddressFree(ptr, rounded)
                raise
            va = VirtualAllocation(int(ptr), rounded, self.ids.new(), self.device_key)
            self.reservations[va.identity] = _Reservation(va)
            return va

    def unmap_page(self, r: _Reservation, i: int) -> int:
        """Unmap granule ``i`` of ``r``; return the physical bytes this frees."""
        g = self.gran
        page = r.pages[i]
        self.drv.cuMemUnmap(r.base + i * g, g)
        del r.pages[i]
        if page.kind == "private":
            # what the mechanism believes it freed; a leaked creation reference
            # (the mutant) keeps the memory alive, visible only in cuMemGetInfo
            return g
        m = page.mapping
        if page.kind == "cow":
            m.cow.discard(i)
            return g
        m.pages.discard(i)
        if not m.pages:
            m.handle.mappings.discard(m)
        return m.handle.page_unmapped(self)

    def end_reservation(self, r: _Reservation) -> int:
        """Unmap every page left and free the address range; return physical bytes freed."""
        freed = 0
        for i in sorted(r.pages):
            freed += self.unmap_page(r, i)
        self.drv.cuMemAddressFree(r.base, r.va.size)
        del self.reservations[r.va.identity]
        self.ctx.unpin()
        return freed


class CudaVirtualBacking:
    """``VirtualBacking`` over cuMemAddressReserve/cuMemCreate/cuMemMap/cuMemSetAccess."""

    def __init__(self, core: VmmCore) -> None:
        self._core = core

    def granularity(self) -> int:
        return self._core.gran

    def reserve(self, request: ReserveRequest) -> VirtualAllocation:
        """Reserve VA rounded up to the granularity; takes no physical bytes."""
        return self._core.new_reservation(request)

    def commit_range(self, allocation: VirtualAllocation, start: int, end: int) -> int:
        """Install one physical page per granule of ``[start, end)``; return
        ``end - start`` (seed 000: no successful no-ops).  Transactional."""
        c = self._core
        drv, g = c.drv, c.gran
        with c.lock:
            r = c.reservation(allocation)
            pages = c.page_range(r, start, end)
            if any(i in r.pages for i in pages):
                raise InvalidRange(f"[{start}, {end}) is already (partly) backed")
            tx = Transaction()
            made: dict[int, _Page] = {}
            try:
                for i in pages:
                    addr = r.base + i * g
                    h = drv.cuMemCreate(g, c.prop, 0)
                    rel = tx.record(f"cuMemRelease({int(h):#x})", lambda h=h: drv.cuMemRelease(h))
                    drv.cuMemMap(addr, g, 0, h, 0)
                    tx.record(f"cuMemUnmap({addr:#x})", lambda a=addr: drv.cuMemUnmap(a, g))
                    if c.leak_creation_handles:
                        made[i] = _Page("private", handle=h)
                    else:
                        # the mapping now holds the memory: drop the creation reference
                        drv.cuMemRelease(h)
                        tx.forget(rel)
                        made[i] = _Page("private")
                drv.cuMemSetAccess(r.base + start, end - start, [c.rw], 1)
            except CudaError as e:
                failed = tx.rollback()
                if failed:
                    e.add_note("rollback failures: " + "; ".join(failed))
                if isinstance(e, CudaOutOfMemory):
                    raise c.oom(e, end - start) from e
                raise
            r.pages.update(made)
            return end - start

    def decommit_range(self, allocation: VirtualAllocation, start: int, end: int) -> int:
        """Unmap every page of ``[start, end)`` (all must be committed private
        pages); keep the address.  Return the bytes released."""
        c = self._core
        with c.lock:
            r = c.reservation(allocation)
            pages = c.page_range(r, start, end)
            missing = [i for i in pages if i not in r.pages or r.pages[i].kind != "private"]
            if missing:
                raise InvalidRange(f"[{start}, {end}) is not entirely committed (granule {missing[0]} is not)")
            for i in pages:
                c.unmap_page(r, i)
            return end - start

    def committed_bytes(self, allocation: VirtualAllocation) -> int:
        c = self._core
        with c.lock:
            return c.reservation(allocation).private_pages() * c.gran

    def release(self, allocation: VirtualAllocation) -> int:
        """End the reservation; decommit what is left (shared mappings in it
        are unmapped too).  Return physical bytes released."""
        c = self._core
        with c.lock:
            return c.end_reservation(c.reservation(allocation, releasing=True))


__all__ = ["CudaVirtualBacking", "VmmCore", "Transaction", "round_up", "PhysicalHandle"]
