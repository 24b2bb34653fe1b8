"""Planted bugs in the caching allocator (seed 003): one per invariant C1..C9.

Each mutant is the reference :class:`~memspec.reference.caching.CachingAllocator`
with exactly one rule broken, wrapped as a ``kind="caching"`` target.  The
conformance run of ``CACHING`` must catch each one, blamed on the invariant
it names.
"""

from __future__ import annotations

from memspec.invariants.mutants import Mutant
from memspec.reference.caching import _M64, K_MIN_BLOCK, CachingAllocator
from memspec.reference.caching_stats import ALL, LARGE, SMALL
from memspec.reference.caching_targets import make_target
from memspec.spec.errors import OutOfMemory


class RequestedNeverFreed(CachingAllocator):
    """C1: ``requested_bytes`` is not decreased when a block returns to the
    pool, so requested overtakes allocated (seed: *reserved >= allocated >=
    requested, always*)."""

    def _free_block(self, b):
        req, idx = b.requested_size, SMALL if b.seg.small else LARGE
        super()._free_block(b)
        self._s_req[ALL].increase(req)
        self._s_req[idx].increase(req)


class OverlappingRemainder(CachingAllocator):
    """C2: a split's remainder starts 512 B too early, overlapping the block
    handed out (blocks no longer tile their segment)."""

    def _alloc_found(self, pool, b, r, size, stream):
        h = super()._alloc_found(pool, b, r, size, stream)
        rest = h.next
        if rest is not None and rest.mapped and pool.free.get(rest.address) is rest and rest.address == h.address + h.size:
            self._remove(pool, rest)
            rest.address -= K_MIN_BLOCK
            rest.size += K_MIN_BLOCK
            self._insert(pool, rest)
        return h


class NoCoalescing(CachingAllocator):
    """C3: a freed block is put back without merging its free neighbours."""

    _freeing = False

    def _free_block(self, b):
        self._freeing = True
        try:
            super()._free_block(b)
        finally:
            self._freeing = False

    def _try_merge(self, pool, dst, src):
        if self._freeing and dst.mapped:
            return 0
        return super()._try_merge(pool, dst, src)


class PoolsMix(CachingAllocator):
    """C4: a small request with no small-pool block carves a large-pool block
    (seed: *A 900 KiB request will not carve a large-pool free block*)."""

    def _get_free_block(self, pool, stream, r):
        b = super()._get_free_block(pool, stream, r)
        if b is None and pool.small:
            b = super()._get_free_block(self._large, stream, r)
        return b


class IllegalSplit(CachingAllocator):
    """C5: a large-pool block is split whatever the remainder (seed: *A free
    block splits only if the remainder is itself legal*)."""

    def _should_split(self, small, remaining, size):
        return remaining >= K_MIN_BLOCK


class NeverSplitLarge(CachingAllocator):
    """C5 (seed preset): a large-pool block is handed over whole even when the
    remainder is legal (>= 2 MiB), e.g. a whole 20 MiB segment for 4 MiB."""

    def _should_split(self, small, remaining, size):
        return super()._should_split(small, remaining, size) if small else False


class EmptyCacheReleasesLive(CachingAllocator):
    """C6: empty_cache also releases a segment whose first block is free
    though later blocks are live (seed: *it moves, merges, and defragments
    nothing inside partially-live segments*)."""

    def empty_cache(self):
        released = super().empty_cache()
        for pool in (self._large, self._small):
            for key in list(pool.blocks):
                b = pool.free.get(key & _M64)
                if b is None or b.seg.expandable or b.prev is not None or b.next is None:
                    continue
                seg = b.seg  # the bug: a partly used segment goes too
                self._remove(pool, b)
                self._driver.deallocate(seg.handle)
                del self._segments[seg.address]
                released += seg.size
        return released


class ReuseBeforeEvent(CachingAllocator):
    """C7: record_stream is forgotten, so a block used on another stream is
    reused as soon as it is freed, before that stream's work completes."""

    def record_stream(self, block, stream):
        self._owned_live(block)


class ArenaNeverGrows(CachingAllocator):
    """C8: one expandable VA arena of exactly the device's size, never a
    second one: when its VA is fenced into holes the allocator OOMs while
    physical pages are still free (seed: *Contiguity becomes a choice made in
    VA space*)."""

    def __init__(self, **kw):
        kw["arena_factor"] = 1.0
        super().__init__(**kw)

    def _find_expandable_block(self, pool, stream, r):
        for key in pool.unmapped.irange(stream << 64, ((stream + 1) << 64) - 1):
            c = pool.unmapped_at[key & _M64]
            if self._allocatable(c.prev):
                c = c.prev
            got, x = 0, c
            while got < r and self._allocatable(x):
                got += x.size
                x = x.next
            if got >= r:
                return c
        if any(s.expandable and s.small == pool.small and s.stream == stream for s in self._segments.values()):
            raise _NoVA()  # the bug: no second arena
        return super()._find_expandable_block(pool, stream, r)

    def _try_allocate_expandable(self, pool, stream, r):
        try:
            return super()._try_allocate_expandable(pool, stream, r)
        except _NoVA:
            return None


class _NoVA(Exception):
    pass


class WrongOomFigures(CachingAllocator):
    """C9: the OOM reports all reserved bytes as "reserved but unallocated"."""

    def _oom(self, pool, stream, r, alloc_size, size):
        try:
            super()._oom(pool, stream, r, alloc_size, size)
        except OutOfMemory as e:
            e.reserved_unallocated = e.reserved
            raise


#: the caching mutants need room for 20 MiB large-pool segments: a smaller
#: device never uses the large pool under the seed preset, and then a
#: large-pool bug cannot show
MIN_CAPACITY = 64 << 20


def _factory(cls: type, preset: str, expandable: bool = False):
    def make(capacity: int | None = None):
        cap = max(capacity or 0, MIN_CAPACITY)
        return make_target(preset, capacity=cap, expandable=expandable, allocator_cls=cls)
    make.__name__ = f"make_{cls.__name__}"
    return make


def _m(name: str, inv: str, cls: type, preset: str = "pytorch", expandable: bool = False) -> Mutant:
    return Mutant(name=name, invariant=inv, description=(cls.__doc__ or "").strip().split("\n\n")[0],
                  factory=_factory(cls, preset, expandable), level="caching")


MUTANTS: list[Mutant] = [
    _m("caching-requested-never-freed", "C1", RequestedNeverFreed),
    _m("caching-overlapping-remainder", "C2", OverlappingRemainder),
    _m("caching-no-coalescing", "C3", NoCoalescing),
    _m("caching-pools-mix", "C4", PoolsMix),
    _m("caching-illegal-split", "C5", IllegalSplit),
    _m("caching-seed-refuses-legal-split", "C5", NeverSplitLarge, preset="seed"),
    _m("caching-empty-cache-releases-live", "C6", EmptyCacheReleasesLive),
    _m("caching-reuse-before-event", "C7", ReuseBeforeEvent),
    _m("caching-arena-never-grows", "C8", ArenaNeverGrows, preset="seed", expandable=True),
    _m("caching-wrong-oom-figures", "C9", WrongOomFigures),
]
