"""Blocks, segments, pools and handles of the reference caching allocator (seed 003).

The records :class:`~memspec.reference.caching.CachingAllocator` keeps --
``_Segment`` (one cudaMalloc or one expandable VA arena), ``_Block`` (a piece
of a segment, linked to its neighbours), ``_Pool`` (a pool's free list) and
the :class:`CachedBlock` handle malloc returns -- with the policy's constants,
the rounding ladder (:func:`round_request`, :func:`segment_bytes`) and the
helpers that run on the free list's ``SortedList`` internals.

Split out of :mod:`memspec.reference.caching`, which re-exports every name
callers import; compiled with it by mypyc (``memspec build-native``).  Only
:mod:`memspec.spec.api` is imported from the spec (layering rule).
"""

from __future__ import annotations

import bisect
import itertools
import reprlib
from typing import Any, Final, Iterator, cast

from sortedcontainers import SortedList  # type: ignore[import-untyped]

from memspec.spec.api import MiB
from memspec.reference.caching_stats import ALL, AllocatorStats, Stat, SumStat

#: (Final: a mypyc build holds them in C statics, not module-dict look-ups)
bisect_right: Final = bisect.bisect_right
insort: Final = bisect.insort

K_MIN_BLOCK: Final = 512
K_SMALL_SIZE: Final = 1 * MiB
K_SMALL_BUFFER: Final = 2 * MiB
K_LARGE_BUFFER: Final = 20 * MiB
K_MIN_LARGE_ALLOC: Final = 10 * MiB
K_ROUND_LARGE: Final = 2 * MiB
PRESETS = ("pytorch", "seed")
ROUNDUP_INTERVALS: Final = 16  # 1 MiB .. 64 GiB, one divisions entry per power of two
_M64: Final = (1 << 64) - 1


def _inc2(stat: list, idx: int, n: int) -> None:
    """``Stat.increase(n)`` on the ``all`` entry and the pool's entry."""
    for s in (stat[ALL], stat[idx]):
        c = s.current + n
        s.current = c
        s.allocated += n
        if c > s.peak:
            s.peak = c


def _dec2(stat: list, idx: int, n: int) -> None:
    """``Stat.decrease(n)`` on the ``all`` entry and the pool's entry."""
    for s in (stat[ALL], stat[idx]):
        s.current -= n


def free_key(stream: int, size: int, addr: int) -> int:
    """The free-list order ``(stream, size, address)`` packed in one int
    (int comparisons are much cheaper than tuple ones)."""
    return (stream << 128) | (size << 64) | addr


def unkey(key: int) -> tuple[int, int, int]:
    return key >> 128, (key >> 64) & _M64, key & _M64


def _pow2_divisions(size: int, divisions: tuple[int, ...]) -> int:
    log_size = size.bit_length() - 1
    index = min(max(0, log_size - 20), ROUNDUP_INTERVALS - 1)
    return divisions[index]


def round_request(size: int, preset: str, divisions: tuple[int, ...] | None = None) -> int:
    """The rounding ladder. pytorch: < 512 -> 512; power-of-two divisions when
    configured and ``size > 512 * d``; else the next 512 multiple.  seed:
    *512 B steps to 1 MiB, then 2 MiB steps forever.*"""
    if preset == "seed":
        if size <= K_SMALL_SIZE:
            return (size + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK
        return (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    if divisions:
        d = _pow2_divisions(size, divisions)
        if d > 1 and size > K_MIN_BLOCK * d:
            if size & (size - 1) == 0:
                return size
            floor = 1 << (size.bit_length() - 1)
            step = floor >> (d.bit_length() - 1)
            if step == 0:
                return floor << 1
            low = size & ~(step - 1)
            return size if low == size else low + step
    return (size + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK


def segment_bytes(rounded: int, preset: str) -> int:
    """Bytes of the cudaMalloc that serves a rounded request with no free
    block.  pytorch (``get_allocation_size``): <= 1 MiB -> 2 MiB; < 10 MiB ->
    20 MiB; else the next 2 MiB multiple.  seed: small -> 2 MiB, large ->
    ``max(20 MiB, rounded)``."""
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if preset == "seed":
        return max(K_LARGE_BUFFER, rounded)
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return (rounded + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE



# --------------------------------------------------------------------------
# Blocks, segments, pools, handles
# --------------------------------------------------------------------------

class _Segment:
    """One cudaMalloc (``expandable=False``) or one expandable VA arena."""

    __slots__ = ("address", "size", "stream", "small", "expandable", "handle", "page", "head", "owner", "pool")

    def __init__(self, address: int, size: int, stream: int, small: bool, expandable: bool, handle: Any,
                 page: int, owner: Any, pool: _Pool):
        self.address, self.size, self.stream, self.small = address, size, stream, small
        self.expandable, self.handle, self.page, self.owner = expandable, handle, page, owner
        self.pool = pool  # the owner's _Pool of this segment's blocks
        self.head: _Block | None = None


class _Block:
    """A block of a segment: the allocator's own record (never handed out).

    ``allocated``, ``size``, ``requested_size``, ``stream``, the neighbour
    links and the event counts are read only from here, never from a
    :class:`CachedBlock` handle."""

    __slots__ = ("address", "size", "requested_size", "stream", "seg", "prev", "next", "allocated", "mapped",
                 "events", "uses", "gc_base", "handle")

    def __init__(self, address: int, size: int, stream: int, seg: _Segment) -> None:
        self.address, self.size, self.stream, self.seg = address, size, stream, seg
        self.requested_size = 0
        self.handle: CachedBlock | None = None  # the record: the one live handle of this block
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.allocated = False
        self.mapped = True
        self.events = 0
        self.uses: set[int] | None = None
        self.gc_base = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:
        return (f"_Block(address={self.address:#x}, size={self.size}, requested_size={self.requested_size}, "
                f"stream={self.stream}, allocated={self.allocated})")


def _describe(h: Any) -> str:
    """A handle's fields for an error message, whatever they hold (never raises)."""
    parts = []
    for name in ("address", "size", "requested_size", "stream"):
        v = getattr(h, name, None)
        parts.append(f"{name}={v:#x}" if name == "address" and type(v) is int else f"{name}={reprlib.repr(v)}")
    return "CachedBlock(" + ", ".join(parts) + ")"


class CachedBlock:
    """The handle :meth:`CachingAllocator.malloc` hands out: ``address``,
    ``size`` (after rounding and the split decision), ``requested_size``,
    ``stream`` -- a read-out for the caller, nothing more.

    The allocator never trusts a handle's fields: ``free`` and
    ``record_stream`` accept a handle only when the allocator's own record --
    the block's ``handle`` slot, set at malloc and cleared at free -- names
    this very object (identity), and the block's segment is this allocator's.
    A copy (``copy.copy``), a hand-built handle with a live block's address,
    a handle whose fields were altered, or a handle already freed is refused
    with a named error (DoubleFree, StaleHandle, ForeignAllocation), the
    ledger unchanged.  Every malloc makes a new handle, so a stale one is
    never live again even when its block or address is recycled."""

    __slots__ = ("address", "size", "requested_size", "stream", "_block", "_freed")

    def __init__(self, address: int = 0, size: int = 0, requested_size: int = 0, stream: int = 0,
                 block: Any = None) -> None:
        # (every argument has a default: a mypyc build's ``CachedBlock.__new__(CachedBlock)``
        # runs this ``__init__``, and a hand-built handle must be refused by name, not by TypeError)
        self.address, self.size, self.requested_size, self.stream = address, size, requested_size, stream
        self._block = block
        self._freed = False

    def __copy__(self) -> CachedBlock:
        """A copy has the same fields (and names the same block) but is never
        live: only the object malloc returned is (``free`` refuses a copy
        with StaleHandle, DoubleFree once the original was freed).  Defined,
        not inherited, so a mypyc build copies as pure Python does."""
        c = CachedBlock(self.address, self.size, self.requested_size, self.stream, self._block)
        c._freed = getattr(self, "_freed", False) is True  # (the pure malloc leaves it unset until free)
        return c

    def __deepcopy__(self, memo: dict[int, Any]) -> CachedBlock:
        """As :meth:`__copy__`: a handle is a read-out; deep-copying it does
        not duplicate the allocator its block belongs to."""
        c = self.__copy__()
        memo[id(self)] = c
        return c

    def __repr__(self) -> str:
        return _describe(self)


def _sl_add(pool: _Pool, v: int) -> None:
    """``pool.blocks.add(v)`` with its common case inlined (sortedcontainers 2.x
    internals: no positional index rebuilt; a full sublist is split as ``add`` does)."""
    maxes = pool.maxes
    lst: list[int]
    if maxes:
        if v >= maxes[-1]:
            pos = len(maxes) - 1
            lst = pool.lists[pos]
            lst.append(v)
            maxes[pos] = v
        else:
            pos = bisect_right(maxes, v)
            lst = pool.lists[pos]
            insort(lst, v)
        bl = pool.blocks
        if pool.index or len(lst) > 2000:
            bl._expand(pos)
        bl._len += 1
    else:
        pool.blocks.add(v)


def _sl_delete(bl: SortedList, maxes: list, lst: list, pos: int, idx: int) -> None:
    """``SortedList._delete(pos, idx)``; its common cases inlined (no positional
    index in use; the sublist stays non-empty and either is the only one or
    is longer than half the load, so nothing is merged)."""
    if not bl._index and len(lst) > 1 and (len(lst) > 501 or len(maxes) == 1):
        del lst[idx]
        bl._len -= 1
        maxes[pos] = lst[-1]
    else:
        bl._delete(pos, idx)


def _keys_after(lists: list, pos: int, idx: int) -> Iterator[int]:
    """The keys of a SortedList (its ``_lists``) after the one at ``(pos,
    idx)``, in order (``irange`` without its set-up, which the expandable
    best fit paid at every malloc)."""
    idx += 1
    for sub in itertools.islice(lists, pos, None):
        yield from itertools.islice(sub, idx, None)
        idx = 0


#: a pool's hot figures: (this pool's, the other pool's, all) for each of allocation,
#: allocated_bytes, requested_bytes, inactive_split, inactive_split_bytes
_Hot = tuple[Stat, Stat, SumStat, Stat, Stat, SumStat, Stat, Stat, SumStat, Stat, Stat, SumStat, Stat, Stat, SumStat]
#: those free updates: allocation, allocated_bytes and requested_bytes of this pool (decreases
#: only), then inactive_split and inactive_split_bytes as in ``_Hot``
_HotFree = tuple[Stat, Stat, Stat, Stat, Stat, SumStat, Stat, Stat, SumStat]


def _hot(s: AllocatorStats, j: int, o: int) -> _Hot:
    """The Stat objects the fast paths of pool ``j`` update (``o``: the
    other pool): for each of allocation, allocated_bytes, requested_bytes,
    inactive_split, inactive_split_bytes, this pool's, the other pool's and
    ``all`` (a SumStat: only its peak is stored)."""
    return cast(_Hot, tuple(x for name in ("allocation", "allocated_bytes", "requested_bytes", "inactive_split",
                                           "inactive_split_bytes")
                            for x in (getattr(s, name)[j], getattr(s, name)[o], getattr(s, name)[ALL])))


class _Pool:
    __slots__ = ("small", "blocks", "maxes", "lists", "index", "free", "unmapped", "unmapped_at", "gc_calls", "hot",
                 "hot_free")

    def __init__(self, small: bool, hot: _Hot) -> None:
        self.small = small
        self.blocks = SortedList()  # free_key(stream, size, address) of free mapped blocks
        assert self.blocks._load == 1000, "the inlined SortedList paths assume the default load factor"
        #: the free list's internals, read by the inlined paths (sortedcontainers 2.x
        #: SortedList mutates these three lists in place and never rebinds them)
        self.maxes: list[int] = self.blocks._maxes
        self.lists: list[list[int]] = self.blocks._lists
        self.index: list[int] = self.blocks._index
        self.free: dict[int, _Block] = {}
        self.unmapped = SortedList()  # (stream << 64) | address of unmapped blocks of expandable arenas
        self.unmapped_at: dict[int, _Block] = {}
        self.gc_calls = 0
        #: the Stat objects the fast paths update (see :func:`_hot`); those free updates
        self.hot = hot
        self.hot_free: _HotFree = (hot[0], hot[3], hot[6], hot[9], hot[10], hot[11], hot[12], hot[13], hot[14])
