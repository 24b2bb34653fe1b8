"""Where the caching allocator's segments come from and go back to (seed 003).

The simulated device (a cudaMalloc with a capacity, and VMM pages) and
:class:`SegmentLayer`, the base of
:class:`~memspec.reference.caching.CachingAllocator` that holds its segment
layer: the pools' free lists, the trace, cudaMalloc/cudaFree of whole
segments, the cache releases (max_split_size, garbage collection) and
expandable segments (VA arenas whose pages are mapped and unmapped).

Split out of :mod:`memspec.reference.caching`, which re-exports every name
callers import; compiled with it by mypyc (``memspec build-native``).  Only
:mod:`memspec.spec.api` and :mod:`memspec.spec.errors` are imported from the
spec (layering rule).
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Any, Final, Iterator

from mypy_extensions import mypyc_attr

from memspec.spec.api import (
    DEFAULT_PAGE,
    AllocationRequest,
    DeviceAllocation,
    DeviceKey,
    IdentitySource,
    ReserveRequest,
    VirtualAllocation,
)
from memspec.spec.errors import (
    DoubleFree,
    ForeignAllocation,
    InvalidRange,
    InvalidRequest,
    OutOfMemory,
    StaleHandle,
)
from memspec.reference.caching_stats import LARGE, SMALL, AllocatorStats
from memspec.reference.caching_blocks import (
    _M64,
    K_LARGE_BUFFER,
    K_MIN_BLOCK,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    _Block,
    _dec2,
    _inc2,
    _Pool,
    _Segment,
    _sl_add,
    _sl_delete,
    free_key,
)

#: (Final: a mypyc build holds it in a C static, not a module-dict look-up)
bisect_left: Final = bisect.bisect_left


# --------------------------------------------------------------------------
# The simulated device: a cudaMalloc with a capacity, and VMM pages
# --------------------------------------------------------------------------

class SimulatedDevice:
    """A device with ``capacity`` physical bytes shared by a cudaMalloc-like
    :class:`SimulatedDriver` and a page-granular :class:`SimulatedBacking`.

    ``other_processes`` (pid -> bytes) models co-tenants: seed 003, *the
    driver's pool is shared*.  Virtual addresses are handed out by a bump
    pointer (*VA is not scarce. Physical HBM is.*).
    """

    def __init__(self, capacity: Any, *, page: int = DEFAULT_PAGE, base: int = 0x7F0A_0000_0000,
                 other_processes: dict[int, int] | None = None, name: str = "sim-caching") -> None:
        if not isinstance(capacity, int) or capacity <= 0:
            raise InvalidRequest(f"capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self.page = page
        self.used = 0  # physical bytes this process holds (segments + mapped pages)
        self.other_processes = dict(other_processes or {})
        self._next_va = base
        self.key = DeviceKey("sim", 0)
        self.name = name

    def free_bytes(self) -> int:
        return self.capacity - self.used - sum(self.other_processes.values())

    def mem_get_info(self) -> tuple[int, int]:
        """``cudaMemGetInfo``: (free, total)."""
        return self.free_bytes(), self.capacity

    def take(self, n: int, what: str) -> None:
        if n > self.free_bytes():
            raise OutOfMemory(
                f"simulated device out of memory: {what} needs {n} bytes, {self.free_bytes()} free of {self.capacity}",
                requested=n, total_capacity=self.capacity, free=self.free_bytes(),
            )
        self.used += n

    def give(self, n: int) -> None:
        self.used -= n

    def new_va(self, size: int, align: int) -> int:
        a = (self._next_va + align - 1) // align * align
        self._next_va = a + size
        return a


class SimulatedDriver:
    """``cudaMalloc``/``cudaFree`` as a :class:`~memspec.spec.api.DeviceAllocator`:
    page-granular (seed 003: *3 MiB + 1 B of request becomes 4 MiB of mappings*)."""

    def __init__(self, dev: SimulatedDevice) -> None:
        self.dev = dev
        self._ids = IdentitySource("sim-cudaMalloc")
        self._live: dict[Any, DeviceAllocation] = {}
        self._dead: set[Any] = set()

    def device(self) -> DeviceKey:
        return self.dev.key

    def allocate(self, request: AllocationRequest) -> DeviceAllocation:
        n = request.size
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise InvalidRequest(f"size must be a positive int, got {n!r}")
        fp = (n + self.dev.page - 1) // self.dev.page * self.dev.page
        self.dev.take(fp, f"cudaMalloc({n})")
        a = DeviceAllocation(self.dev.new_va(fp, self.dev.page), n, fp, self._ids.new(), self.dev.key)
        self._live[a.identity] = a
        return a

    def deallocate(self, allocation: DeviceAllocation) -> int:
        if not isinstance(allocation, DeviceAllocation) or allocation.identity.creator != self._ids.creator:
            raise ForeignAllocation(f"{allocation!r} was not made by this driver")
        if allocation.identity in self._dead:
            raise DoubleFree(f"{allocation.identity} already freed")
        if allocation.identity not in self._live:
            raise StaleHandle(f"{allocation.identity} is not live")
        del self._live[allocation.identity]
        self._dead.add(allocation.identity)
        self.dev.give(allocation.footprint)
        return allocation.footprint


class SimulatedBacking:
    """Page-granular VMM (``cuMemAddressReserve``/``cuMemCreate``+``cuMemMap``/
    ``cuMemUnmap``) as a :class:`~memspec.spec.api.VirtualBacking`."""

    def __init__(self, dev: SimulatedDevice) -> None:
        self.dev = dev
        self._ids = IdentitySource("sim-vmm")
        self._pages: dict[Any, set[int]] = {}

    def granularity(self) -> int:
        return self.dev.page

    def _check(self, va: VirtualAllocation, start: int, end: int) -> set[int]:
        if not isinstance(va, VirtualAllocation) or va.identity.creator != self._ids.creator:
            raise ForeignAllocation(f"{va!r} was not reserved here")
        pages = self._pages.get(va.identity)
        if pages is None:
            raise StaleHandle(f"{va.identity} was released")
        g = self.dev.page
        if start < 0 or end > va.size or start >= end or start % g or end % g:
            raise InvalidRange(f"[{start}, {end}) is not a page-aligned range inside {va.size} bytes")
        return pages

    def reserve(self, request: ReserveRequest) -> VirtualAllocation:
        if not isinstance(request.size, int) or request.size <= 0:
            raise InvalidRequest(f"size must be a positive int, got {request.size!r}")
        g = self.dev.page
        size = (request.size + g - 1) // g * g
        va = VirtualAllocation(self.dev.new_va(size, g), size, self._ids.new(), self.dev.key)
        self._pages[va.identity] = set()
        return va

    def commit_range(self, allocation: VirtualAllocation, start: int, end: int) -> int:
        pages = self._check(allocation, start, end)
        g = self.dev.page
        want = range(start // g, end // g)
        if any(p in pages for p in want):
            raise InvalidRange(f"[{start}, {end}) is already (partly) committed")
        self.dev.take(end - start, f"commit of {end - start} bytes")
        pages.update(want)
        return end - start

    def decommit_range(self, allocation: VirtualAllocation, start: int, end: int) -> int:
        pages = self._check(allocation, start, end)
        g = self.dev.page
        want = range(start // g, end // g)
        if not all(p in pages for p in want):
            raise InvalidRange(f"[{start}, {end}) is not wholly committed")
        pages.difference_update(want)
        self.dev.give(end - start)
        return end - start

    def committed_bytes(self, allocation: VirtualAllocation) -> int:
        pages = self._pages.get(allocation.identity)
        if pages is None:
            raise StaleHandle(f"{allocation.identity} was released")
        return len(pages) * self.dev.page

    def release(self, allocation: VirtualAllocation) -> int:
        n = self.committed_bytes(allocation)
        del self._pages[allocation.identity]
        self.dev.give(n)
        return n


class SimulatedMechanism:
    """The mechanism a caching target sits on: the simulated cudaMalloc and VMM."""

    def __init__(self, dev: SimulatedDevice) -> None:
        self.name = dev.name
        self.dev = dev
        self._driver = SimulatedDriver(dev)
        self._backing = SimulatedBacking(dev)

    def allocator(self) -> SimulatedDriver:
        return self._driver

    def virtual_backing(self) -> SimulatedBacking:
        return self._backing

    def shared_mapping(self) -> None:
        return None


# --------------------------------------------------------------------------
# The segment layer of the allocator
# --------------------------------------------------------------------------

@mypyc_attr(allow_interpreted_subclasses=True)  # CachingAllocator, the mutants and tests subclass it
class SegmentLayer:
    """The segment layer of :class:`~memspec.reference.caching.CachingAllocator`
    (its only subclass here, which sets every attribute below in ``__init__``
    and :meth:`~memspec.reference.caching.CachingAllocator.set_allocator_settings`).

    Every hook here is a method a subclass may override (the mutants do:
    ``_try_merge``, ``_find_expandable_block``, ``_try_allocate_expandable``)."""

    # (declared here for mypy and mypyc: the state this layer reads and writes)
    preset: str
    capacity: int
    stats: AllocatorStats
    expandable: bool
    arena_factor: float
    gc_threshold: float
    _seed: bool
    _driver: Any
    _backing: Any
    _small: _Pool
    _large: _Pool
    _segments: dict[int, _Segment]
    _total: int  # total_allocated_memory: bytes of segments and mapped pages
    _max_split: int | None
    _allowed: int | None
    _trace: deque | None
    _clock: Iterator[int]

    # ---------------------------------------------------------------- pools

    def _insert(self, pool: _Pool, b: _Block) -> None:
        _sl_add(pool, (b.stream << 128) | (b.size << 64) | b.address)
        pool.free[b.address] = b
        b.gc_base = pool.gc_calls

    def _remove(self, pool: _Pool, b: _Block) -> None:
        v = (b.stream << 128) | (b.size << 64) | b.address
        bl = pool.blocks
        maxes = bl._maxes
        pos = bisect_left(maxes, v)
        lst = bl._lists[pos]
        idx = bisect_left(lst, v)
        if lst[idx] != v:  # pragma: no cover - a broken free list
            raise KeyError(v)
        _sl_delete(bl, maxes, lst, pos, idx)
        del pool.free[b.address]

    def _insert_unmapped(self, pool: _Pool, b: _Block) -> None:
        pool.unmapped.add((b.stream << 64) | b.address)
        pool.unmapped_at[b.address] = b

    def _remove_unmapped(self, pool: _Pool, b: _Block) -> None:
        pool.unmapped.remove((b.stream << 64) | b.address)
        del pool.unmapped_at[b.address]

    def _pool_of(self, b: _Block) -> _Pool:
        return self._small if b.seg.small else self._large

    def _try_merge(self, pool: _Pool, dst: _Block, src: _Block | None) -> int:
        if src is None or src.allocated or src.events or src.uses or src.mapped != dst.mapped:
            return 0
        if src.mapped:
            self._remove(pool, src)
        else:
            self._remove_unmapped(pool, src)
        if dst.prev is src:
            dst.address = src.address
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
            else:
                dst.seg.head = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # ---------------------------------------------------------------- trace

    def _record(self, action: str, addr: int, size: int, stream: int) -> None:
        if self._trace is not None:
            self._trace.append((action, addr, size, stream, next(self._clock)))

    def record_memory_history(self, enabled: bool = True, max_entries: int = 1_000_000) -> None:
        """``torch.cuda.memory._record_memory_history``."""
        self._trace = deque(maxlen=max_entries) if enabled else None

    # ---------------------------------------------------------------- segments

    def _alloc_block(self, pool: _Pool, stream: int, r: int, alloc_size: int, *, retry: bool) -> _Block | None:
        if retry:
            self.stats.num_alloc_retries += 1
        # memory_fraction: PyTorch checks the segment size; the seed's toy under expandable segments maps only
        # the rounded request's pages (``mapped + want``), so its cap is checked on the pages of ``r``
        cap_size = -(-r // self._page(pool.small)) * self._page(pool.small) if (self._seed and self.expandable) else alloc_size
        if self._allowed is not None and self._total + cap_size > self._allowed:
            return None
        if self.expandable:
            return self._try_allocate_expandable(pool, stream, r)
        try:
            a = self._driver.allocate(AllocationRequest(alloc_size, alignment=K_MIN_BLOCK))
        except OutOfMemory:
            return None
        addr = a.address
        seg = _Segment(addr, alloc_size, stream, pool.small, False, a, 0, self, pool)
        self._segments[addr] = seg
        self._total += alloc_size
        idx = SMALL if pool.small else LARGE
        for s in (self.stats.segment,):
            _inc2(s, idx, 1)
        _inc2(self.stats.reserved_bytes, idx, alloc_size)
        if self._max_split is not None and alloc_size >= self._max_split:
            self.stats.oversize_segments.increase(1)
        self.stats.num_device_alloc += 1
        self._record("segment_alloc", addr, alloc_size, stream)
        b = _Block(addr, alloc_size, stream, seg)
        seg.head = b
        return b

    def _release_block(self, pool: _Pool, b: _Block) -> int:
        """cudaFree a whole free segment (``b`` is its only block, in the pool)."""
        seg = b.seg
        self.stats.num_device_free += 1
        self._record("segment_free", b.address, b.size, b.stream)
        self._remove(pool, b)
        self._driver.deallocate(seg.handle)
        del self._segments[seg.address]
        self._total -= b.size
        idx = SMALL if pool.small else LARGE
        for s, n in ((self.stats.segment, 1), (self.stats.reserved_bytes, b.size)):
            _dec2(s, idx, n)
        if self._max_split is not None and b.size >= self._max_split:
            self.stats.oversize_segments.decrease(1)
        return b.size

    def _release_available_cached_blocks(self, pool: _Pool, stream: int, r: int) -> bool:
        """With max_split_size set: free one oversize cached segment big
        enough, else several oversize ones, largest first."""
        ms = self._max_split
        if ms is None:
            return False
        want = max(r, ms)
        keys: list[int] = [k for k in pool.blocks.irange((stream << 128), ((stream + 1) << 128) - 1)]
        big = [k for k in keys if (k >> 64) & _M64 >= want]
        if not big:
            released = 0
            for k in reversed(keys):
                size = (k >> 64) & _M64
                if released >= want or size < ms:
                    break
                b = pool.free[k & _M64]
                if not b.seg.expandable and not b.is_split():
                    released += self._release_block(pool, b)
            return released >= want
        b = pool.free[big[0] & _M64]
        if b.seg.expandable or b.is_split():
            return False
        self._release_block(pool, b)
        return True

    def _release_blocks(self, pool: _Pool) -> int:
        released = 0
        to_unmap = []
        for key in list(pool.blocks):
            b = pool.free.get(key & _M64)
            if b is None or free_key(b.stream, b.size, b.address) != key:
                continue
            if b.seg.expandable:
                to_unmap.append(b)
            elif b.prev is None and b.next is None:
                released += self._release_block(pool, b)
        for b in to_unmap:
            if pool.free.get(b.address) is b:
                released += self._unmap_block(pool, b)
        return released

    def _garbage_collect(self) -> None:
        """garbage_collection_threshold: when reserved > t * allowed, free
        unsplit large cached blocks, oldest (by reuse interval) first."""
        allowed = self._allowed
        if allowed is None:  # (only called with a memory fraction set)
            return
        threshold = int(self.gc_threshold * allowed)
        if self._total <= threshold:
            return
        target = self._total - threshold
        pool = self._large
        cand = [b for b in pool.free.values() if not b.is_split()]
        if not cand:
            return
        total_age = sum(pool.gc_calls - b.gc_base for b in cand)
        count = len(cand)
        reclaimed = 0
        freed_one = True
        while reclaimed < target and freed_one and count > 0:
            threshold_age = total_age / count
            freed_one = False
            for key in list(pool.blocks):
                b = pool.free.get(key & _M64)
                if b is None or b.is_split() or b.seg.expandable:
                    continue
                age = pool.gc_calls - b.gc_base
                if age >= threshold_age:
                    freed_one = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release_block(pool, b)

    # ---------------------------------------------------------------- expandable segments

    def _page(self, small: bool) -> int:
        if self.preset == "seed":
            return K_ROUND_LARGE
        return K_SMALL_BUFFER if small else K_LARGE_BUFFER

    def _try_allocate_expandable(self, pool: _Pool, stream: int, r: int) -> _Block | None:
        c = self._find_expandable_block(pool, stream, r)
        if c is None:  # a fresh arena's VA is smaller than the request
            return None
        if not c.mapped:
            if not self._map_block(pool, c, min(c.size, r)):
                return None
        while c.size < r:
            nxt: Any = c.next  # (the unmapped block after c: _find_expandable_block found enough)
            if not self._map_block(pool, nxt, min(r - c.size, nxt.size)):
                return None
            c = nxt
        self._remove(pool, c)
        return c

    @staticmethod
    def _allocatable(b: _Block | None) -> bool:
        return b is not None and not b.allocated and b.events == 0 and not b.uses

    def _find_expandable_block(self, pool: _Pool, stream: int, r: int) -> _Block | None:
        for key in pool.unmapped.irange(stream << 64, ((stream + 1) << 64) - 1):
            c = pool.unmapped_at[key & _M64]
            p = c.prev
            if p is not None and self._allocatable(p):
                c = p
            got: int = 0
            x: _Block | None = c
            while got < r and x is not None and self._allocatable(x):
                got += x.size
                x = x.next
            if got >= r:
                return c
        page = self._page(pool.small)
        size = -(-int(self.capacity * self.arena_factor) // page) * page
        if size < r:  # no arena can hold the request (arena_factor below the presets'): OutOfMemory
            return None
        va = self._backing.reserve(ReserveRequest(size))
        seg = _Segment(va.address, va.size - va.size % page, stream, pool.small, True, va, page, self, pool)
        self._segments[seg.address] = seg
        c = _Block(seg.address, seg.size, stream, seg)
        c.mapped = False
        seg.head = c
        self._insert_unmapped(pool, c)
        return c

    def _map_block(self, pool: _Pool, b: _Block, size: int) -> bool:
        seg = b.seg
        page = seg.page
        off = b.address - seg.address
        end = min(-(-(off + size) // page) * page, off + b.size)
        done = []
        try:
            for p in range(off, end, page):
                self._backing.commit_range(seg.handle, p, p + page)
                done.append(p)
        except OutOfMemory:
            for p in done:
                self._backing.decommit_range(seg.handle, p, p + page)
            return False
        mapped = end - off
        self._remove_unmapped(pool, b)
        b.mapped = True
        if mapped < b.size:
            rest = _Block(b.address + mapped, b.size - mapped, b.stream, seg)
            rest.mapped = False
            rest.next = b.next
            if rest.next is not None:
                rest.next.prev = rest
            rest.prev = b
            b.next = rest
            b.size = mapped
            self._insert_unmapped(pool, rest)
        self._try_merge(pool, b, b.prev)
        self._try_merge(pool, b, b.next)
        self._insert(pool, b)
        self._total += mapped
        idx = SMALL if pool.small else LARGE
        _inc2(self.stats.reserved_bytes, idx, mapped)
        self.stats.num_device_alloc += 1
        self._record("segment_map", seg.address + off, mapped, b.stream)
        return True

    def _unmap_block(self, pool: _Pool, b: _Block) -> int:
        """Unmap the whole pages inside free block ``b`` (which is in the pool)."""
        seg = b.seg
        page = seg.page
        off = b.address - seg.address
        begin = -(-off // page) * page
        end = (off + b.size) // page * page
        if end <= begin:
            return 0
        for p in range(begin, end, page):
            self._backing.decommit_range(seg.handle, p, p + page)
        self._remove(pool, b)
        before = seg.address + begin - b.address
        if before > 0:
            bf = _Block(b.address, before, b.stream, seg)
            bf.prev = b.prev
            if bf.prev is not None:
                bf.prev.next = bf
            else:
                seg.head = bf
            bf.next = b
            b.prev = bf
            self._insert(pool, bf)
        after = b.address + b.size - (seg.address + end)
        if after > 0:
            af = _Block(seg.address + end, after, b.stream, seg)
            af.next = b.next
            if af.next is not None:
                af.next.prev = af
            af.prev = b
            b.next = af
            self._insert(pool, af)
        b.address = seg.address + begin
        b.size = end - begin
        b.mapped = False
        self._try_merge(pool, b, b.prev)
        self._try_merge(pool, b, b.next)
        self._insert_unmapped(pool, b)
        n = end - begin
        self._total -= n
        idx = SMALL if pool.small else LARGE
        _dec2(self.stats.reserved_bytes, idx, n)
        self.stats.num_device_free += 1
        self._record("segment_unmap", seg.address + begin, n, b.stream)
        if b.prev is None and b.next is None and b.size == seg.size:
            self._remove_unmapped(pool, b)
            self._backing.release(seg.handle)
            del self._segments[seg.address]
        return n
