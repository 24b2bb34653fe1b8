"""The reference caching allocator of seed 003: PyTorch's policy and the seed's toy.

Seed 003: *cudaMalloc is slow and page-granular, so PyTorch layers a caching
allocator on top -- module 01 ch19's segregated-fit, replayed.*  This module
is an independent, efficient implementation of both named presets:

* ``pytorch`` -- PyTorch 2.5's ``CUDACachingAllocator`` rules (512 B
  rounding with optional power-of-two divisions; small pool <= 1 MiB in 2 MiB
  segments; large requests in 20 MiB segments below 10 MiB, else 2 MiB
  multiples; large-pool split only when the remainder is > 1 MiB and the
  request < max_split_size; best fit on ``(stream, size, address)``;
  cross-stream frees deferred on events; empty_cache frees whole free
  segments; OOM retry after releasing cached blocks; garbage collection;
  expandable segments in 2 MiB / 20 MiB pages unmapped at empty_cache or the
  OOM retry).
* ``seed`` -- the toy of the seed: *requests > 1 MiB round to a 2 MiB
  multiple ... served from 20 MiB segments*, *a free block splits only if the
  remainder is itself legal (>= 512 B small pool, >= 2 MiB large pool)*, no
  OOM retry (*the OOM is raised at the driver boundary*), and under
  expandable segments *a freed block's pages unmap -- physical memory returns
  to the driver immediately*.

Free blocks live in one ``SortedList`` per pool keyed ``(stream, size,
address)`` (best fit is a ``bisect``); neighbours are linked (``prev``/
``next``) so coalescing never scans.  Segments come from a *driver*: any
:class:`~memspec.spec.api.DeviceAllocator` (default :class:`SimulatedDevice`,
a cudaMalloc with a capacity).  Expandable segments map pages through any
:class:`~memspec.spec.api.VirtualBacking` (default the same simulated
device's; the reference VMM or CUDA's may be passed in).

The allocator is three modules; this one is its face (every name callers
import is a name of this module):

* :mod:`~memspec.reference.caching_blocks` -- the policy's constants and
  rounding ladder, the records (segments, blocks, pools, handles) and the
  free list's ``SortedList`` helpers;
* :mod:`~memspec.reference.caching_segments` -- the simulated device and
  :class:`~memspec.reference.caching_segments.SegmentLayer`, the allocator's
  base: the pools' free lists, cudaMalloc/cudaFree of segments, the cache
  releases, garbage collection, expandable segments;
* this module -- :class:`CachingAllocator`: settings, streams, malloc, free,
  empty_cache, the OOM and the inspection calls.

Only :mod:`memspec.spec.api` and :mod:`memspec.spec.errors` are imported from
the spec (layering rule).

Compiled: these three modules and :mod:`~memspec.reference.caching_stats`
type-check under mypy and compile with mypyc (``memspec build-native``;
compile the four together: the native classes of one are used by the others).  The pure-Python source is the reference and the fallback; the
build runs the same code, with the hot paths' locals typed (``COMPILED`` says
which one runs).  :class:`CachingAllocator` allows interpreted subclasses
(the mutants); the entry points that validate their arguments take ``Any``
so a bad argument still gets its named error, not mypyc's ``TypeError``.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from typing import Any, Callable, Final, Iterator, NoReturn

from mypy_extensions import mypyc_attr

from memspec.spec.errors import (
    DoubleFree,
    ForeignAllocation,
    InvalidRequest,
    OutOfMemory,
    StaleHandle,
)
from memspec.reference.caching_stats import (
    ALL,
    LARGE,
    ONE_EB,
    ONE_EB_MESSAGE,
    SMALL,
    AllocatorStats,
    increase_pooled,
    memory_summary,
    pytorch_oom_message,
    seed_oom_message,
)
from memspec.reference.caching_blocks import (
    _M64,
    K_LARGE_BUFFER,
    K_MIN_BLOCK,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    PRESETS,
    ROUNDUP_INTERVALS,
    CachedBlock,
    _Block,
    _describe,
    _hot,
    _keys_after,
    _Pool,
    _sl_add,
    _sl_delete,
    free_key,
    round_request,
    segment_bytes,
    unkey,
)
from memspec.reference.caching_segments import (
    SegmentLayer,
    SimulatedBacking,
    SimulatedDevice,
    SimulatedDriver,
    SimulatedMechanism,
)

#: the public names, as before the split into caching_blocks and caching_segments (importers
#: read them from here; the private ones the tests and mutants use are names of this module too)
__all__ = [
    "COMPILED", "K_LARGE_BUFFER", "K_MIN_BLOCK", "K_MIN_LARGE_ALLOC", "K_ROUND_LARGE", "K_SMALL_BUFFER",
    "K_SMALL_SIZE", "PRESETS", "ROUNDUP_INTERVALS", "CachedBlock", "CachingAllocator", "SegmentLayer",
    "SimulatedBacking", "SimulatedDevice", "SimulatedDriver", "SimulatedMechanism", "free_key",
    "round_request", "segment_bytes", "unkey",
]

#: (Final: a mypyc build holds them in C statics, not module-dict look-ups)
bisect_left: Final = bisect.bisect_left
bisect_right: Final = bisect.bisect_right
insort: Final = bisect.insort


def _compiled_probe() -> None:
    """Has a code object unless this module runs compiled (mypyc)."""


#: True when this module runs as a mypyc build (``memspec build-native``)
COMPILED: Final = not hasattr(_compiled_probe, "__code__")

#: pure Python: a handle or block without an ``__init__`` frame (the hot paths
#: set every slot they read).  Compiled, the hot paths call the constructors
#: (a C call there; mypyc's classes refuse ``object.__new__``).
_new_block: Any = object.__new__
_new_handle: Any = object.__new__

_STATE_LIVE, _STATE_PENDING, _STATE_FREE = "active_allocated", "active_pending_free", "inactive"


@mypyc_attr(allow_interpreted_subclasses=True)  # the mutants and tests subclass it (compiled by mypyc)
class CachingAllocator(SegmentLayer):
    """One device's caching allocator (see the module docstring); its
    segment layer (pools, segments, cache releases, expandable segments) is
    the base :class:`~memspec.reference.caching_segments.SegmentLayer`.

    ``driver``: a DeviceAllocator for segments (cudaMalloc); ``backing``: a
    VirtualBacking for expandable segments; ``mem_get_info``: ``() -> (free,
    total)``.  With none of them, a :class:`SimulatedDevice` of ``capacity``
    bytes provides all three.
    """

    def __init__(
        self,
        *,
        preset: str = "pytorch",
        capacity: int | None = None,
        expandable_segments: bool = False,
        max_split_size: int | None = None,
        roundup_power2_divisions: tuple[int, ...] | int | None = None,
        garbage_collection_threshold: float = 0.0,
        memory_fraction: Any = None,  # (validated by set_per_process_memory_fraction)
        driver: Any = None,
        backing: Any = None,
        mem_get_info: Callable[[], tuple[int, int]] | None = None,
        device: SimulatedDevice | None = None,
        arena_factor: float | None = None,
        record_history: bool = False,
        max_entries: int = 1_000_000,
        device_index: int = 0,
    ) -> None:
        if preset not in PRESETS:
            raise InvalidRequest(f"unknown preset {preset!r}; expected one of {PRESETS}")
        if device is None and driver is None:
            if capacity is None:
                raise InvalidRequest("give a capacity (simulated device) or a driver")
            device = SimulatedDevice(capacity)
        self.device = device
        self.mechanism: SimulatedMechanism | None
        if device is not None:
            mech = SimulatedMechanism(device)
            self.mechanism = mech
            driver = driver or mech.allocator()
            backing = backing or mech.virtual_backing()
            mem_get_info = mem_get_info or device.mem_get_info
            capacity = capacity if capacity is not None else device.capacity
        else:
            self.mechanism = None
        if capacity is None:
            raise InvalidRequest("capacity is required with a custom driver")
        self.preset = preset
        self._seed = preset == "seed"
        self.capacity = capacity
        self.device_index = device_index
        self._driver = driver
        self._backing = backing
        self._mem_get_info = mem_get_info or (lambda: (self.capacity - self._total, self.capacity))
        self.stats = st = AllocatorStats()
        self._small = _Pool(True, _hot(st, SMALL, LARGE))
        self._large = _Pool(False, _hot(st, LARGE, SMALL))
        self._segments = {}
        self._seg_alloc: dict[int, Any] = {}
        self._pending: set[_Block] = set()
        self._issued: dict[int, int] = {}
        self._completed: dict[int, int] = {}
        self._events: dict[int, deque] = {}
        self._n_events = 0
        self._total = 0  # total_allocated_memory: bytes of segments and mapped pages
        self._clock = itertools.count(1)
        self._trace = deque(maxlen=max_entries) if record_history else None
        self.arena_factor = arena_factor if arena_factor is not None else (16.0 if preset == "seed" else 1.125)
        self.memory_fraction: float | None = None
        self._allowed = None
        self._ever_expandable = False
        self.set_allocator_settings(
            expandable_segments=expandable_segments,
            max_split_size=max_split_size,
            roundup_power2_divisions=roundup_power2_divisions,
            garbage_collection_threshold=garbage_collection_threshold,
        )
        if memory_fraction is not None:
            self.set_per_process_memory_fraction(memory_fraction)
        s = self.stats
        self._s_alloc, self._s_abytes = s.allocation, s.allocated_bytes
        self._s_req, self._s_isplit, self._s_isbytes = s.requested_bytes, s.inactive_split, s.inactive_split_bytes

    # ---------------------------------------------------------------- settings

    def set_allocator_settings(
        self,
        *,
        expandable_segments: bool | None = None,
        max_split_size: int | None | str = "keep",
        roundup_power2_divisions: tuple[int, ...] | int | None | str = "keep",
        garbage_collection_threshold: float | None = None,
    ) -> None:
        """``torch.cuda.memory._set_allocator_settings``: change the config at run time."""
        if expandable_segments is not None:
            if expandable_segments and self._backing is None:
                raise InvalidRequest("expandable segments need a VirtualBacking")
            self.expandable = bool(expandable_segments)
            self._ever_expandable = self._ever_expandable or self.expandable
        if max_split_size != "keep":
            if max_split_size is not None:
                if not isinstance(max_split_size, int) or max_split_size <= K_LARGE_BUFFER:
                    raise InvalidRequest(f"max_split_size must be an int > 20 MiB, got {max_split_size!r}")
                if self.preset == "seed":
                    raise InvalidRequest("the seed preset has no max_split_size")
            self._max_split = max_split_size
            self.stats.max_split_size = -1 if max_split_size is None else max_split_size
        if roundup_power2_divisions != "keep":
            d: Any = roundup_power2_divisions
            if isinstance(d, int):
                d = (d,) * ROUNDUP_INTERVALS
            if d is not None:
                d = tuple(d)
                if len(d) != ROUNDUP_INTERVALS or any(x != 0 and (x < 1 or x & (x - 1)) for x in d):
                    raise InvalidRequest("roundup_power2_divisions: 16 powers of two (or 0)")
            self._divisions = d
        if garbage_collection_threshold is not None:
            if not 0.0 <= garbage_collection_threshold < 1.0:
                raise InvalidRequest("garbage_collection_threshold must be in [0, 1)")
            self.gc_threshold = garbage_collection_threshold
        # the fused paths of malloc/free: the plain allocator (no subclass
        # overriding a hook, no expandable segment ever, no max_split_size,
        # no garbage collection threshold) -- the same steps as the hooks
        self._fast = (type(self) is CachingAllocator and not self._ever_expandable and self._max_split is None
                      and not self.gc_threshold)

    def set_per_process_memory_fraction(self, fraction: Any) -> None:
        """cudaMalloc is refused when reserved + size > fraction * capacity."""
        if type(fraction) not in (int, float) or not 0.0 <= fraction <= 1.0:  # nan fails both comparisons
            raise InvalidRequest(f"fraction must be a number in [0, 1], got {fraction!r}")
        self.memory_fraction = float(fraction)  # (an int fraction reads back as a float, compiled or not)
        self._allowed = int(fraction * self.capacity)

    # ---------------------------------------------------------------- policy

    def round_size(self, size: int) -> int:
        return round_request(size, self.preset, self._divisions)

    def allocation_size(self, rounded: int) -> int:
        return segment_bytes(rounded, self.preset)

    def _should_split(self, small: bool, remaining: int, size: int) -> bool:
        if self.preset == "seed":
            return remaining >= (K_MIN_BLOCK if small else K_ROUND_LARGE)
        if small or self.expandable:
            return remaining >= K_MIN_BLOCK
        ms = self._max_split
        return (ms is None or size < ms) and remaining > K_SMALL_SIZE

    # ---------------------------------------------------------------- streams

    def complete_stream(self, stream: Any) -> None:
        """The device finished every piece of work queued on ``stream`` so far:
        the events recorded on it are now complete (the allocator notices at
        the next malloc or empty_cache)."""
        if type(stream) is not int or stream < 0:
            raise InvalidRequest(f"stream must be a non-negative int, got {stream!r}")
        self._completed[stream] = self._issued.get(stream, 0)

    def synchronize(self) -> None:
        for s in list(self._issued):
            self.complete_stream(s)

    def record_stream(self, block: Any, stream: Any) -> None:
        """``Tensor.record_stream``: the block is used by work on ``stream``;
        its free is then deferred until that work completes."""
        b = self._owned_live(block)
        if type(stream) is not int or stream < 0:
            raise InvalidRequest(f"stream must be a non-negative int, got {stream!r}")
        if stream != b.stream:
            if b.uses is None:
                b.uses = set()
            b.uses.add(stream)

    def _process_events(self) -> None:
        for stream, dq in list(self._events.items()):
            done = self._completed.get(stream, 0)
            while dq and dq[0][0] <= done:
                _, b = dq.popleft()
                self._n_events -= 1
                b.events -= 1
                if b.events == 0:
                    self._pending.discard(b)
                    self.stats.drop_pending(SMALL if b.seg.small else LARGE, b.size)
                    self._free_block(b)

    def _synchronize_and_free_events(self) -> None:
        self.synchronize()
        self.stats.num_sync_all_streams += 1
        self._process_events()

    # ---------------------------------------------------------------- malloc

    def malloc(self, size: Any, stream: Any = 0) -> CachedBlock:
        """Allocate ``size`` bytes for work on ``stream``.

        For the plain allocator (``self._fast``: no subclass overriding a
        hook, no expandable segment ever, no max_split_size, no garbage
        collection threshold) ``_get_free_block`` + ``_alloc_found`` run
        inlined in this one frame, with the statistics straight-line: the
        same steps and the same figures as the hooks (the conformance tests
        run this path; the mutants, subclasses, run the hooks;
        ``tests/test_caching_fused.py`` compares the two step by step)."""
        if type(size) is not int or size <= 0 or type(stream) is not int or stream < 0 or size >= ONE_EB:
            self._bad_request(size, stream)
        n: int = size  # (checked: ints; typed from here on when compiled)
        st: int = stream
        if self._n_events:
            self._process_events()
        if self._divisions:
            r = round_request(n, self.preset, self._divisions)
        elif n <= K_SMALL_SIZE or not self._seed:
            r = K_MIN_BLOCK if n < K_MIN_BLOCK else (n + 511) & ~511
        else:  # the seed's 2 MiB ladder above 1 MiB (K_ROUND_LARGE multiples, as literals)
            r = (n + 0x1FFFFF) & -0x200000
        small = r <= K_SMALL_SIZE
        pool = self._small if small else self._large
        if not self._fast:
            b = self._get_free_block(pool, stream, r)
            if b is None:
                b = self._slow_path(pool, stream, r, size)
            b = self._alloc_found(pool, b, r, size, stream)
        else:
            lo = (st << 128) | (r << 64)
            maxes = pool.maxes
            b = None
            if maxes and lo <= maxes[-1]:  # best fit: two C bisects (sortedcontainers internals)
                pos = bisect_left(maxes, lo)
                sub = pool.lists[pos]
                i = bisect_left(sub, lo)
                key = sub[i]
                if key >> 128 == st:  # SortedList._delete, its common case inlined
                    bl = pool.blocks
                    if len(sub) > (1 if len(maxes) == 1 else 501) and not pool.index:  # (no sublist merge)
                        del sub[i]
                        bl._len -= 1
                        maxes[pos] = sub[-1]
                    else:
                        bl._delete(pos, i)
                    b = pool.free.pop(key & _M64)
            if b is None:
                b = self._slow_path(pool, stream, r, size)
            aP, aO, aA, abP, abO, abA, rqP, rqO, rqA, ispP, ispO, ispA, isbP, isbO, isbA = pool.hot
            prev = b.prev
            bs = b.size
            remaining = bs - r
            if (remaining >= (K_MIN_BLOCK if small else K_ROUND_LARGE) if self._seed
                    else (remaining >= K_MIN_BLOCK if small else remaining > K_SMALL_SIZE)):
                # split: the remainder ``rest`` stays free, after the new block
                rest = b
                b = _Block(rest.address, r, rest.stream, rest.seg) if COMPILED else _new_block(_Block)
                b.address = addr = rest.address
                b.size = bs = r
                b.seg = rest.seg
                b.events = 0
                b.uses = None
                b.mapped = True
                b.prev = prev
                if prev is not None:
                    prev.next = b
                else:
                    rest.seg.head = b
                b.next = rest
                rest.prev = b
                rest.address = ra = addr + r
                rest.size = remaining
                _sl_add(pool, (rest.stream << 128) | (remaining << 64) | ra)
                pool.free[ra] = rest
                rest.gc_base = pool.gc_calls
                if prev is not None or rest.next is not None:  # already split: the split shrinks by r
                    isbP.current -= r
                else:  # a new inactive split: the remainder (Stat.increase; the all entry's peak)
                    c = isbP.current + remaining
                    isbP.current = c
                    isbP.allocated += remaining
                    if c > isbP.peak:
                        isbP.peak = c
                    c += isbO.current
                    if c > isbA.peak:
                        isbA.peak = c
                    c = ispP.current + 1
                    ispP.current = c
                    ispP.allocated += 1
                    if c > ispP.peak:
                        ispP.peak = c
                    c += ispO.current
                    if c > ispA.peak:
                        ispA.peak = c
            elif prev is not None or b.next is not None:  # a whole inactive split handed out
                isbP.current -= bs
                ispP.current -= 1
            b.allocated = True
            b.requested_size = n
            b.stream = st
            # Stat.increase of allocation, allocated_bytes, requested_bytes in this pool, then
            # the peak of their all entry (SumStat); active/active_bytes follow allocation
            c = aP.current + 1
            aP.current = c
            aP.allocated += 1
            if c > aP.peak:
                aP.peak = c
            c += aO.current
            if c > aA.peak:
                aA.peak = c
            c = abP.current + bs
            abP.current = c
            abP.allocated += bs
            if c > abP.peak:
                abP.peak = c
            c += abO.current
            if c > abA.peak:
                abA.peak = c
            c = rqP.current + n
            rqP.current = c
            rqP.allocated += n
            if c > rqP.peak:
                rqP.peak = c
            c += rqO.current
            if c > rqA.peak:
                rqA.peak = c
            if self._pending:
                self.stats.note_malloc_while_pending(SMALL if small else LARGE)
            if self._trace is not None:
                self._record("alloc", b.address, size, stream)
        if COMPILED:
            h = CachedBlock(b.address, b.size, n, st, b)
        else:  # a new handle every time; no __init__ frame
            h = _new_handle(CachedBlock)
            h.address = b.address
            h.size = b.size
            h.requested_size = size
            h.stream = stream
            h._block = b
        b.handle = h
        return h

    def _bad_request(self, size: Any, stream: Any) -> NoReturn:
        """Raise the named error for malloc's arguments (size first, then stream)."""
        if type(size) is not int or size <= 0:
            raise InvalidRequest(f"size must be a positive int, got {size!r}")
        if type(stream) is not int or stream < 0:
            raise InvalidRequest(f"stream must be a non-negative int, got {stream!r}")
        raise OutOfMemory(ONE_EB_MESSAGE, requested=size, total_capacity=self.capacity, device=self.device_index)

    def _get_free_block(self, pool: _Pool, stream: int, r: int) -> _Block | None:
        if self.gc_threshold > 0.0 and self._allowed is not None:
            pool.gc_calls += 1
        bl = pool.blocks
        lo = (stream << 128) | (r << 64)
        maxes = bl._maxes  # sortedcontainers internals: two C bisects, no positional index
        if not maxes or lo > maxes[-1]:
            return None
        pos = bisect_left(maxes, lo)
        sub = bl._lists[pos]
        idx = bisect_left(sub, lo)
        key = sub[idx]
        if key >> 128 != stream:
            return None
        b = pool.free[key & _M64]
        if b.seg.expandable:
            e = self._expandable_pick(pool, stream, _keys_after(bl._lists, pos, idx), b)
            if e is None:
                return None
            b = e
            key = None
        ms = self._max_split
        if ms is not None:
            if r < ms and b.size >= ms:
                return None  # do not return an oversized block for a small request
            if r >= ms and b.size >= r + K_LARGE_BUFFER:
                return None  # nor one too oversized for a large request
        if key is not None:
            _sl_delete(bl, maxes, sub, pos, idx)
            del pool.free[b.address]
        else:
            self._remove(pool, b)
        return b

    def _expandable_pick(self, pool: _Pool, stream: int, it: Iterator[int], b: _Block) -> _Block | None:
        """PyTorch's ``get_free_block`` on an expandable block ``b`` (the best
        fit; ``it``: the free-list keys after it): best fit counts the
        unmapped space a block can grow into; with expandable segments
        switched off, only non-expandable blocks qualify."""
        if self.expandable:
            def grow(x: _Block) -> int:
                return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)
            for k in it:
                if k >> 128 != stream or not b.seg.expandable:
                    break
                nb = pool.free[k & _M64]
                if grow(nb) < grow(b):
                    b = nb
                else:
                    break
            return b
        for k in it:
            if k >> 128 != stream:
                return None
            nb = pool.free[k & _M64]
            if not nb.seg.expandable:
                return nb
        return None

    def _slow_path(self, pool: _Pool, stream: int, r: int, size: int) -> _Block:
        alloc_size = self.allocation_size(r)  # (a method: a subclass's override holds compiled too)
        if self.gc_threshold > 0.0 and self._allowed is not None:
            self._garbage_collect()
        b: _Block | None = self._alloc_block(pool, stream, r, alloc_size, retry=False)
        if b is None and self.preset == "pytorch":
            if self._release_available_cached_blocks(pool, stream, r):
                b = self._alloc_block(pool, stream, r, alloc_size, retry=False)
            if b is None:
                self._release_cached_blocks()
                b = self._alloc_block(pool, stream, r, alloc_size, retry=True)
        if b is None:
            self._oom(pool, stream, r, alloc_size, size)
        return b

    def _alloc_found(self, pool: _Pool, b: _Block, r: int, size: int, stream: int) -> _Block:
        idx = SMALL if pool.small else LARGE
        already_split = b.prev is not None or b.next is not None
        exp = b.seg.expandable
        remaining = b.size - r
        split = self._should_split(pool.small, remaining, r)
        if split:
            rest = b
            b = _Block(rest.address, r, stream, rest.seg)
            b.prev = rest.prev
            if b.prev is not None:
                b.prev.next = b
            else:
                b.seg.head = b
            b.next = rest
            rest.prev = b
            rest.address += r
            rest.size = remaining
            self._insert(pool, rest)
            if not exp:
                if already_split:  # the inactive split shrinks by what is handed out
                    self._s_isbytes[idx].current -= r
                else:  # a new inactive split: the remainder
                    increase_pooled(self._s_isbytes, idx, remaining)
                    increase_pooled(self._s_isplit, idx, 1)
        elif already_split and not exp:  # a whole inactive split handed out
            self._s_isbytes[idx].current -= b.size
            self._s_isplit[idx].current -= 1
        b.allocated = True
        b.requested_size = size
        b.stream = stream
        bs = b.size
        # (active/active_bytes follow allocation: caching_stats.AllocatorStats)
        increase_pooled(self._s_alloc, idx, 1)
        increase_pooled(self._s_abytes, idx, bs)
        increase_pooled(self._s_req, idx, size)
        if self._pending:
            self.stats.note_malloc_while_pending(idx)
        if self._max_split is not None and bs >= self._max_split:
            self.stats.oversize_allocations.increase(1)
        if self._trace is not None:
            self._record("alloc", b.address, size, stream)
        return b

    # ---------------------------------------------------------------- free

    def _refuse(self, handle: Any) -> Exception:
        """The named error for a handle the record does not name (the
        handle's own fields only choose the error's name and text)."""
        if type(handle) is not CachedBlock:
            return InvalidRequest(f"not a block of a caching allocator: {type(handle).__name__}")
        what = _describe(handle)
        b = getattr(handle, "_block", None)
        if type(b) is not _Block or getattr(b.seg, "owner", None) is not self:
            return ForeignAllocation(f"{what} was not allocated by this caching allocator")
        if getattr(handle, "_freed", False) is True:
            return DoubleFree(f"{what} was already freed")
        return StaleHandle(f"{what} is not a live handle of this allocator (a copy or a hand-built handle: "
                           "only the object malloc returned is live)")

    def _owned_live(self, handle: Any) -> _Block:
        """The block of a live handle, from the allocator's own record."""
        try:
            b = handle._block
            if (b.handle is handle and type(handle) is CachedBlock and type(b) is _Block and b.seg.owner is self
                    and (b.prev.next if b.prev is not None else b.seg.head) is b):
                return b
        except AttributeError:
            pass
        raise self._refuse(handle)

    def free(self, block: Any) -> None:
        """Free a block. Allocated stats drop at once; with uses on other
        streams the block waits for their events (``active_pending_free``).
        The handle is checked against the allocator's record, never its own fields.

        For the plain allocator (``self._fast``, see :meth:`malloc`)
        ``_free_block`` and its merges run inlined in this frame."""
        try:
            x = block._block
            if x.handle is not block or type(block) is not CachedBlock or type(x) is not _Block:
                raise AttributeError  # not the live handle this allocator's record names
        except AttributeError:
            raise self._refuse(block) from None
        b: _Block = x  # (a _Block: typed from here on when compiled)
        p = b.prev
        seg = b.seg
        if seg.owner is not self or (p.next if p is not None else seg.head) is not b:
            raise self._refuse(block)
        b.handle = None
        block._freed = True
        b.allocated = False
        if b.uses or not self._fast:
            self._free_hooks(b)
            return
        pool = seg.pool
        aP, abP, rqP, ispP, ispO, ispA, isbP, isbO, isbA = pool.hot_free
        req = b.requested_size
        aP.current -= 1  # (the all entries are the pools' sums)
        abP.current -= b.size
        if self._trace is not None:
            self._record("free_requested", b.address, req, b.stream)
            self._record("free_completed", b.address, req, b.stream)
        rqP.current -= req
        bl = pool.blocks
        maxes = pool.maxes
        lists = pool.lists
        free = pool.free
        net_n = net_b = 0
        lst: list[int]
        if p is not None and not p.allocated and not p.events and not p.uses:  # merge the free block before
            v = (p.stream << 128) | (p.size << 64) | p.address  # SortedList.remove, inlined
            pos = bisect_left(maxes, v)
            lst = lists[pos]
            i = bisect_left(lst, v)
            if lst[i] != v:  # pragma: no cover - a broken free list
                raise KeyError(v)
            if len(lst) > (1 if len(maxes) == 1 else 501) and not pool.index:  # (no sublist merge)
                del lst[i]
                bl._len -= 1
                maxes[pos] = lst[-1]
            else:
                bl._delete(pos, i)
            del free[p.address]
            b.address = p.address
            pp = b.prev = p.prev
            if pp is not None:
                pp.next = b
            else:
                seg.head = b
            b.size += p.size
            net_n = -1
            net_b = -p.size
        q = b.next
        if q is not None and not q.allocated and not q.events and not q.uses:  # merge the free block after
            v = (q.stream << 128) | (q.size << 64) | q.address
            pos = bisect_left(maxes, v)
            lst = lists[pos]
            i = bisect_left(lst, v)
            if lst[i] != v:  # pragma: no cover - a broken free list
                raise KeyError(v)
            if len(lst) > (1 if len(maxes) == 1 else 501) and not pool.index:  # (no sublist merge)
                del lst[i]
                bl._len -= 1
                maxes[pos] = lst[-1]
            else:
                bl._delete(pos, i)
            del free[q.address]
            qn = b.next = q.next
            if qn is not None:
                qn.prev = b
            b.size += q.size
            net_n -= 1
            net_b -= q.size
        a = b.address
        v = (b.stream << 128) | (b.size << 64) | a  # _sl_add(pool, v), inlined
        if maxes:
            if v >= maxes[-1]:
                pos = len(maxes) - 1
                lst = lists[pos]
                lst.append(v)
                maxes[pos] = v
            else:
                pos = bisect_right(maxes, v)
                lst = lists[pos]
                insort(lst, v)
            if pool.index or len(lst) > 2000:
                bl._expand(pos)
            bl._len += 1
        else:
            bl.add(v)
        free[a] = b
        b.gc_base = pool.gc_calls
        if b.prev is not None or b.next is not None:
            net_n += 1
            net_b += b.size
        if net_n > 0:  # Stat.increase / decrease of inactive_split(_bytes), inlined
            c = ispP.current + net_n
            ispP.current = c
            ispP.allocated += net_n
            if c > ispP.peak:
                ispP.peak = c
            c += ispO.current
            if c > ispA.peak:
                ispA.peak = c
        elif net_n:
            ispP.current += net_n
        if net_b > 0:
            c = isbP.current + net_b
            isbP.current = c
            isbP.allocated += net_b
            if c > isbP.peak:
                isbP.peak = c
            c += isbO.current
            if c > isbA.peak:
                isbA.peak = c
        elif net_b:
            isbP.current += net_b

    def _free_hooks(self, b: _Block) -> None:
        """``free`` after the handle check, through the hooks (subclasses,
        expandable segments, max_split_size, deferred frees)."""
        idx = SMALL if b.seg.small else LARGE
        bs = b.size
        self._s_alloc[idx].current -= 1
        self._s_abytes[idx].current -= bs
        if self._trace is not None:
            self._record("free_requested", b.address, b.requested_size, b.stream)
        if self._max_split is not None and b.size >= self._max_split:
            self.stats.oversize_allocations.decrease(1)
        if b.uses:
            for s in sorted(b.uses):
                v = self._issued.get(s, 0) + 1
                self._issued[s] = v
                self._events.setdefault(s, deque()).append((v, b))
                b.events += 1
                self._n_events += 1
            b.uses = None
            self._pending.add(b)
            self.stats.add_pending(idx, bs)
        else:
            self._free_block(b)

    def _free_block(self, b: _Block) -> None:
        if self._trace is not None:
            self._record("free_completed", b.address, b.requested_size, b.stream)
        pool = self._small if b.seg.small else self._large
        req = b.requested_size
        net_n = net_b = 0
        p = b.prev
        if p is not None and not p.allocated and not p.events and not p.uses and p.mapped:
            n = self._try_merge(pool, b, p)
            net_n -= 1
            net_b -= n
        q = b.next
        if q is not None and not q.allocated and not q.events and not q.uses and q.mapped:
            n = self._try_merge(pool, b, q)
            net_n -= 1
            net_b -= n
        self._insert(pool, b)
        if b.prev is not None or b.next is not None:
            net_n += 1
            net_b += b.size
        idx = SMALL if pool.small else LARGE
        if (net_n or net_b) and not b.seg.expandable:
            for stat, n in ((self._s_isplit, net_n), (self._s_isbytes, net_b)):
                if n > 0:
                    increase_pooled(stat, idx, n)
                else:
                    stat[idx].current += n
        # (active/active_bytes follow allocation and the pending frees)
        self._s_req[idx].current -= req
        if self.preset == "seed" and b.seg.expandable:
            self._unmap_block(pool, b)  # the toy: pages returned at free

    # ---------------------------------------------------------------- empty_cache / OOM

    def empty_cache(self) -> int:
        """Wait for outstanding events, then release every segment that is one
        whole free block (unmap whole free pages of expandable segments).
        Returns the bytes released.  Seed 003: *it moves, merges, and
        defragments nothing inside partially-live segments.*"""
        return self._release_cached_blocks()

    def _release_cached_blocks(self) -> int:
        self._synchronize_and_free_events()
        return self._release_blocks(self._large) + self._release_blocks(self._small)

    def largest_free_block(self) -> int:
        return max((b.size for p in (self._small, self._large) for b in p.free.values()), default=0)

    def _oom(self, pool: _Pool, stream: int, r: int, alloc_size: int, size: int) -> NoReturn:
        self.stats.num_ooms += 1
        free, total = self._mem_get_info()
        allocated = self.stats.allocated_bytes[ALL].current
        reserved = self.stats.reserved_bytes[ALL].current
        largest = self.largest_free_block()
        self._record("oom", free, r, stream)
        others = dict(self.device.other_processes) if self.device is not None else {}
        if self.preset == "seed":
            tried = r if self.expandable else alloc_size
            msg = seed_oom_message(tried=tried, total=total, reserved=reserved, allocated=allocated, largest_free=largest)
        else:
            tried = alloc_size
            msg = pytorch_oom_message(tried=tried, device=self.device_index, total=total, free=free,
                                      allocated=allocated, reserved=reserved, allowed=self._allowed, processes=others)
        err = OutOfMemory(msg, requested=tried, total_capacity=total, free=free, allocated=allocated,
                          reserved=reserved, reserved_unallocated=reserved - allocated,
                          largest_free_block=largest, device=self.device_index)
        e: Any = err  # (the spec's OutOfMemory carries these as extra attributes)
        e.request_size = size
        e.rounded_size = r
        e.allowed = self._allowed
        e.other_processes = others
        e.expandable_segments = self.expandable
        e.preset = self.preset
        raise err

    # ---------------------------------------------------------------- inspection

    def memory_stats(self) -> dict[str, int]:
        return self.stats.flat()

    def memory_summary(self) -> str:
        return memory_summary(self.stats.flat())

    def reset_peak_memory_stats(self) -> None:
        self.stats.reset_peak()

    def reset_accumulated_memory_stats(self) -> None:
        self.stats.reset_accumulated()

    def memory_reserved(self) -> int:
        return self.stats.reserved_bytes[ALL].current

    def memory_allocated(self) -> int:
        return self.stats.allocated_bytes[ALL].current

    def memory_requested(self) -> int:
        return self.stats.requested_bytes[ALL].current

    def live_blocks(self) -> int:
        return self.stats.allocation[ALL].current

    def segments(self) -> list[dict]:
        """Every segment in address order with its blocks: ``{address,
        total_size, stream, segment_type, is_expandable, blocks: [{address,
        size, requested_size, state}]}``; states ``active_allocated``,
        ``active_pending_free``, ``inactive`` and, inside expandable arenas,
        ``unmapped``."""
        out = []
        for addr in sorted(self._segments):
            seg = self._segments[addr]
            blocks = []
            b = seg.head
            while b is not None:
                if not b.mapped:
                    state = "unmapped"
                elif b.allocated:
                    state = _STATE_LIVE
                elif b.events:
                    state = _STATE_PENDING
                else:
                    state = _STATE_FREE
                blocks.append({"address": b.address, "size": b.size,
                               "requested_size": b.requested_size if state in (_STATE_LIVE, _STATE_PENDING) else 0,
                               "state": state, "stream": b.stream})
                b = b.next
            out.append({"address": seg.address, "total_size": seg.size, "stream": seg.stream,
                        "segment_type": "small" if seg.small else "large", "is_expandable": seg.expandable,
                        "page": seg.page, "blocks": blocks})
        return out

    def snapshot(self) -> dict:
        """``torch.cuda.memory._snapshot()``-compatible structure (see
        :mod:`memspec.reference.caching_snapshot`)."""
        from memspec.reference.caching_export import export_snapshot

        return export_snapshot(self)

    def trace_entries(self) -> list[tuple]:
        return list(self._trace) if self._trace is not None else []
