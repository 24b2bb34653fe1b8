"""The caching allocator of seed 003, as an executable state machine.

Seed 003: *cudaMalloc is slow and page-granular, so PyTorch layers a caching
allocator on top -- module 01 ch19's segregated-fit, replayed. Hence the real
OOM: "out of memory" almost never means out of bytes; it means out of
contiguous, policy-satisfiable memory.*

State: *segments* (one cudaMalloc each, or one expandable VA arena), each
tiled by *blocks* (``live``, ``pending`` -- freed but waiting for events on
other streams --, ``free``, or ``unmapped`` inside an arena); two *pools*
(small: rounded size <= 1 MiB; large); *streams* whose recorded *events*
complete when the caller says the stream's work is done.

The policy is a parameter with two presets (:data:`PRESETS`):

* ``pytorch`` -- PyTorch 2.5 (``c10/cuda/CUDACachingAllocator.cpp``) exactly:
  kMinBlockSize 512, kSmallSize 1 MiB, kSmallBuffer 2 MiB, kLargeBuffer
  20 MiB, kMinLargeAlloc 10 MiB, kRoundLarge 2 MiB; rounding with optional
  power-of-two divisions; ``get_allocation_size``; ``should_split``; best
  fit on ``(stream, size, address)`` within the request's stream; coalescing;
  record_stream events; empty_cache of whole free segments; max_split_size;
  garbage_collection_threshold; expandable segments (2 MiB / 20 MiB pages
  mapped on demand, unmapped at empty_cache or the OOM retry).
* ``seed`` -- the seed's toy: large requests round to 2 MiB, *a free block
  splits only if the remainder is itself legal (>= 512 B small pool, >= 2 MiB
  large pool)*, 20 MiB large segments (``max(20 MiB, request)``), no OOM
  retry, and under expandable segments *a freed block's pages unmap --
  physical memory returns to the driver immediately* (2 MiB pages).

The spec is a refinement oracle: the policy is deterministic, so ``malloc``
predicts the exact block (address and size) or the exact OOM figures; the
only freedom left to an implementation is where its driver places a new
segment, which the spec learns from the answer.  An answer that differs is
diagnosed (which rule it breaks) and recorded; the invariant of that rule
then fails.  Observations compare the implementation's statistics and block
layout (read through ``memory_stats()`` and ``snapshot()``) with the spec's.

The pure kernels (:func:`round_size`, :func:`choose_pool`,
:func:`segment_size`, :func:`should_split`) carry PEP 316 contracts for
CrossHair.

``CACHING.init(*, policy, capacity, expandable, max_split_size=None,
roundup_power2_divisions=0, memory_fraction=None,
garbage_collection_threshold=0.0)``; actions call ``sut.allocator``
(``malloc(size, stream)``, ``free(block)``, ``record_stream(block, stream)``,
``complete_stream(stream)``, ``empty_cache()``) and ``sut.ref(id)``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from memspec.spec.api import MiB
from memspec.spec.core import Domain, Invariant, Machine, Observation, Raises, Returns, action, only, outcomes
from memspec.spec.errors import DoubleFree, OutOfMemory

K_MIN_BLOCK = 512
K_SMALL_SIZE = MiB
K_SMALL_BUFFER = 2 * MiB
K_LARGE_BUFFER = 20 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB
ONE_EB = 1 << 60
PRESETS = ("pytorch", "seed")
STREAMS = 3

FREE, LIVE, PENDING, UNMAPPED = "free", "live", "pending", "unmapped"


# ==========================================================================
# Pure kernels (PEP 316 contracts; CrossHair checks them)
# ==========================================================================

def round_size(size: int, seed_preset: bool = False, divisions: int = 0) -> int:
    """The rounding ladder.

    Seed 003: *Every request rounds to a 512 B multiple (kMinBlockSize) ...
    above 1 MiB, 2 MiB multiples* (the ``seed`` preset).  PyTorch 2.5: below
    512 -> 512; with ``divisions`` d > 1 and ``size > 512 * d`` the next of d
    equal steps between two powers of two (a power of two stays); otherwise
    the next 512 multiple.

    pre: size > 0
    pre: divisions == 0 or divisions in (1, 2, 4, 8, 16)
    post: __return__ >= size
    post: __return__ % K_MIN_BLOCK == 0 or (divisions > 1 and not seed_preset)
    post: seed_preset or divisions > 1 or __return__ - size < K_MIN_BLOCK or size < K_MIN_BLOCK
    post: not seed_preset or size <= K_SMALL_SIZE or __return__ % K_ROUND_LARGE == 0
    """
    if seed_preset:
        step = K_MIN_BLOCK if size <= K_SMALL_SIZE else K_ROUND_LARGE
        return (size + step - 1) // step * step
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    if divisions > 1 and size > K_MIN_BLOCK * divisions:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor // divisions
        low = size - size % step
        return size if low == size else low + step
    return (size + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK


def divisions_for(size: int, table: tuple[int, ...]) -> int:
    """The roundup_power2_divisions entry for ``size``: 16 intervals, one per
    power of two from 1 MiB to 64 GiB (clamped at both ends)."""
    if not table:
        return 0
    return table[min(max(0, size.bit_length() - 1 - 20), len(table) - 1)]


def choose_pool(rounded: int) -> str:
    """Seed 003: *Requests <= 1 MiB go to the small pool, ... requests > 1 MiB
    ... go to the large pool.*  Pools never mix.

    pre: rounded > 0
    post: __return__ in ("small", "large")
    post: (__return__ == "small") == (rounded <= K_SMALL_SIZE)
    """
    return "small" if rounded <= K_SMALL_SIZE else "large"


def segment_size(rounded: int, seed_preset: bool = False) -> int:
    """Bytes of the cudaMalloc that serves a request with no free block.

    Seed 003: *served from 2 MiB segments ... served from 20 MiB segments
    (kLargeBuffer)*.  PyTorch 2.5 ``get_allocation_size``: <= 1 MiB -> 2 MiB;
    < 10 MiB -> 20 MiB; else the next 2 MiB multiple.  The toy: ``max(20 MiB,
    request)``.

    pre: rounded > 0
    post: __return__ >= rounded
    post: seed_preset or rounded <= K_SMALL_SIZE or __return__ % K_ROUND_LARGE == 0
    post: rounded > K_SMALL_SIZE or __return__ == K_SMALL_BUFFER
    post: rounded <= K_SMALL_SIZE or __return__ >= K_MIN_LARGE_ALLOC
    """
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if seed_preset:
        return max(K_LARGE_BUFFER, rounded)
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return (rounded + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE


def should_split(remaining: int, size: int, small: bool, seed_preset: bool = False,
                 expandable: bool = False, max_split_size: int = 0) -> bool:
    """Whether a free block serving ``size`` bytes splits off ``remaining``.

    Seed 003: *A free block splits only if the remainder is itself legal (>=
    512 B small pool, >= 2 MiB large pool); a freed 5 MiB block serving a 4 MiB
    request is handed over whole.*  PyTorch 2.5: small pool or expandable
    segments: ``remaining >= 512``; large pool: ``size < max_split_size and
    remaining > 1 MiB`` (strict).  ``max_split_size == 0`` means unlimited.

    pre: remaining >= 0 and size > 0 and max_split_size >= 0
    post: not __return__ or remaining >= K_MIN_BLOCK
    post: not (__return__ and seed_preset and not small) or remaining >= K_ROUND_LARGE
    post: not (__return__ and not seed_preset and not small and not expandable) or remaining > K_SMALL_SIZE
    post: not (__return__ and max_split_size > 0 and not small and not expandable and not seed_preset) or size < max_split_size
    """
    if seed_preset:
        return remaining >= (K_MIN_BLOCK if small else K_ROUND_LARGE)
    if small or expandable:
        return remaining >= K_MIN_BLOCK
    return (max_split_size == 0 or size < max_split_size) and remaining > K_SMALL_SIZE


def format_size(n: int) -> str:
    """PyTorch's ``format_size`` (the OOM message's figures)."""
    if n <= 1024:
        return f"{n} bytes"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20)):
        if n <= scale << 10:
            return f"{n / scale:.2f} {unit}"
    return f"{n / (1 << 30):.2f} GiB"


def format_mib(n: int) -> str:
    """The seed toy's figures (``16 MiB``)."""
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n / MiB:.2f} MiB"


# ==========================================================================
# State
# ==========================================================================

@dataclass(frozen=True)
class Policy:
    preset: str = "pytorch"
    capacity: int = 64 * MiB
    expandable: bool = False
    max_split_size: int = 0           # 0 = unlimited
    divisions: tuple[int, ...] = ()  # roundup_power2_divisions, 16 entries or ()
    memory_fraction: float | None = None
    gc_threshold: float = 0.0
    arena_factor: float = 0.0         # VA of an expandable arena / capacity; 0 = the preset's

    @property
    def arena(self) -> float:
        """PyTorch reserves 1.125 x device memory per arena; the toy's VA is
        *endless* (16 x here)."""
        return self.arena_factor or (16.0 if self.seed else 1.125)

    @property
    def seed(self) -> bool:
        return self.preset == "seed"

    @property
    def allowed(self) -> int | None:
        return None if self.memory_fraction is None else int(self.memory_fraction * self.capacity)

    def rounded(self, size: int) -> int:
        return round_size(size, self.seed, divisions_for(size, self.divisions))

    def page(self, small: bool) -> int:
        """Expandable-segment page: PyTorch 2 MiB (small) / 20 MiB (large); the toy's 2 MiB."""
        return K_ROUND_LARGE if self.seed or small else K_LARGE_BUFFER


@dataclass
class Block:
    offset: int
    size: int
    state: str
    stream: int
    requested: int = 0
    ref: int | None = None
    uses: set[int] = field(default_factory=set)   # live: streams recorded by record_stream
    waits: int = 0                                 # pending: events not yet processed
    gc_base: int = 0


@dataclass
class Segment:
    sid: int
    base: int | None     # learned from the implementation's first answer in it
    size: int
    small: bool
    stream: int
    expandable: bool
    page: int
    blocks: list[Block]

    def address(self, b: Block) -> int:
        assert self.base is not None
        return self.base + b.offset


@dataclass
class CachingState:
    policy: Policy
    segments: list[Segment] = field(default_factory=list)
    next_sid: int = 0
    next_ref: int = 1
    where: dict[int, int] = field(default_factory=dict)      # live/pending ref -> sid
    freed: set[int] = field(default_factory=set)              # refs freed (for double-free)
    issued: dict[int, int] = field(default_factory=dict)      # stream -> events recorded
    completed: dict[int, int] = field(default_factory=dict)   # stream -> events completed
    events: list[tuple[int, int, int]] = field(default_factory=list)  # (stream, value, ref) not yet processed
    gc_calls: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    num_ooms: int = 0
    violations: list[tuple[str, str]] = field(default_factory=list)

    # -- aggregates ------------------------------------------------------
    def seg(self, sid: int) -> Segment:
        for s in self.segments:
            if s.sid == sid:
                return s
        raise KeyError(sid)

    def block_of(self, ref: int) -> tuple[Segment, int]:
        s = self.seg(self.where[ref])
        for i, b in enumerate(s.blocks):
            if b.ref == ref:
                return s, i
        raise KeyError(ref)

    def reserved(self, small: bool | None = None) -> int:
        n = 0
        for s in self.segments:
            if small is None or s.small == small:
                n += s.size if not s.expandable else sum(b.size for b in s.blocks if b.state != UNMAPPED)
        return n

    def figure(self, states: tuple[str, ...], small: bool | None = None, requested: bool = False) -> int:
        return sum((b.requested if requested else b.size)
                   for s in self.segments if small is None or s.small == small
                   for b in s.blocks if b.state in states)

    def largest_free(self) -> int:
        return max((b.size for s in self.segments for b in s.blocks if b.state == FREE), default=0)


def _violate(st: CachingState, inv: str, why: str) -> None:
    st.violations.append((inv, why))


# ==========================================================================
# The policy as state transitions (on a copy; ``then`` commits it)
# ==========================================================================

def _allocatable(b: Block | None) -> bool:
    return b is not None and b.state == FREE and not b.uses


def _merge_around(seg: Segment, i: int) -> int:
    """Coalesce block ``i`` with free neighbours of the same mapped state; return its new index."""
    b = seg.blocks[i]
    kind = b.state
    if i + 1 < len(seg.blocks) and seg.blocks[i + 1].state == kind:
        nb = seg.blocks.pop(i + 1)
        b.size += nb.size
    if i > 0 and seg.blocks[i - 1].state == kind:
        pb = seg.blocks.pop(i - 1)
        b.offset, b.size = pb.offset, b.size + pb.size
        i -= 1
    return i


def _is_split(seg: Segment) -> bool:
    return len(seg.blocks) > 1


def _free_block(st: CachingState, seg: Segment, i: int) -> None:
    """A freed block (events done) returns to its pool and merges with free neighbours."""
    b = seg.blocks[i]
    st.where.pop(b.ref, None)
    b.state, b.ref, b.requested, b.uses, b.waits = FREE, None, 0, set(), 0
    b.gc_base = st.gc_calls[seg.small]
    i = _merge_around(seg, i)
    if st.policy.seed and seg.expandable:
        _unmap(st, seg, i)  # the toy: pages returned at free


def _process_events(st: CachingState) -> None:
    keep = []
    done_refs = []
    for stream, value, ref in st.events:
        if st.completed.get(stream, 0) >= value:
            done_refs.append(ref)
        else:
            keep.append((stream, value, ref))
    st.events = keep
    for ref in done_refs:
        seg, i = st.block_of(ref)
        seg.blocks[i].waits -= 1
        if seg.blocks[i].waits == 0:
            _free_block(st, seg, i)


def _candidates(st: CachingState, small: bool, stream: int, r: int) -> list[tuple[int, int, Segment, int]]:
    """Free mapped blocks of the pool on ``stream`` with size >= r, in (size, address) order."""
    out = []
    for s in st.segments:
        if s.small != small or s.base is None:
            continue
        for i, b in enumerate(s.blocks):
            if b.state == FREE and b.stream == stream and b.size >= r:
                out.append((b.size, s.base + b.offset, s, i))
    out.sort(key=lambda t: (t[0], t[1]))
    return out


def _get_free_block(st: CachingState, small: bool, stream: int, r: int) -> tuple[Segment, int] | None:
    """Best fit: the smallest free block >= r on the request's stream (ties: lowest address)."""
    pol = st.policy
    if pol.gc_threshold > 0 and pol.allowed is not None:
        st.gc_calls[small] += 1
    cands = _candidates(st, small, stream, r)
    if not cands:
        return None
    k = 0
    if cands[0][2].expandable:
        def grow(t):
            s, i = t[2], t[3]
            nxt = s.blocks[i + 1] if i + 1 < len(s.blocks) else None
            return s.blocks[i].size + (nxt.size if nxt is not None and nxt.state == UNMAPPED else 0)
        while cands[k][2].expandable and k + 1 < len(cands) and grow(cands[k + 1]) < grow(cands[k]):
            k += 1
    size, _, seg, i = cands[k]
    ms = pol.max_split_size
    if ms:
        if r < ms and size >= ms:
            return None
        if r >= ms and size >= r + K_LARGE_BUFFER:
            return None
    return seg, i


def _used(st: CachingState) -> int:
    return st.reserved()


def _new_segment(st: CachingState, size: int, small: bool, stream: int, expandable: bool, page: int) -> Segment:
    seg = Segment(st.next_sid, None, size, small, stream, expandable, page,
                  [Block(0, size, UNMAPPED if expandable else FREE, stream)])
    st.next_sid += 1
    st.segments.append(seg)
    return seg


def _map(st: CachingState, seg: Segment, i: int, size: int) -> int | None:
    """Map whole pages from the start of unmapped block ``i`` to cover ``size``; merge; return the new index."""
    b = seg.blocks[i]
    end = min(-(-(b.offset + size) // seg.page) * seg.page, b.offset + b.size)
    n = end - b.offset
    if _used(st) + n > st.policy.capacity:
        return None
    if n < b.size:
        seg.blocks.insert(i + 1, Block(end, b.size - n, UNMAPPED, b.stream))
        b.size = n
    b.state = FREE
    b.gc_base = st.gc_calls[seg.small]
    return _merge_around(seg, i)


def _unmap(st: CachingState, seg: Segment, i: int) -> int:
    """Unmap the whole pages inside free block ``i``; return the bytes unmapped."""
    b = seg.blocks[i]
    begin = -(-b.offset // seg.page) * seg.page
    end = (b.offset + b.size) // seg.page * seg.page
    if end <= begin:
        return 0
    parts = []
    if begin > b.offset:
        parts.append(Block(b.offset, begin - b.offset, FREE, b.stream))
    mid = Block(begin, end - begin, UNMAPPED, b.stream)
    parts.append(mid)
    if b.offset + b.size > end:
        parts.append(Block(end, b.offset + b.size - end, FREE, b.stream))
    seg.blocks[i:i + 1] = parts
    _merge_around(seg, seg.blocks.index(mid))
    if len(seg.blocks) == 1 and seg.blocks[0].state == UNMAPPED:
        st.segments.remove(seg)  # the whole arena is unmapped: its VA is released
    return end - begin


def _find_expandable(st: CachingState, small: bool, stream: int, r: int) -> tuple[Segment, int]:
    arenas = sorted((s for s in st.segments if s.expandable and s.small == small and s.stream == stream),
                    key=lambda s: s.base if s.base is not None else 1 << 62)
    for s in arenas:
        for i, b in enumerate(s.blocks):
            if b.state != UNMAPPED:
                continue
            j = i - 1 if i > 0 and _allocatable(s.blocks[i - 1]) else i
            got, k = 0, j
            while got < r and k < len(s.blocks) and (s.blocks[k].state == UNMAPPED or _allocatable(s.blocks[k])):
                got += s.blocks[k].size
                k += 1
            if got >= r:
                return s, j
    page = st.policy.page(small)
    size = -(-int(st.policy.capacity * st.policy.arena) // page) * page
    return _new_segment(st, size, small, stream, True, page), 0


def _try_expandable(st: CachingState, small: bool, stream: int, r: int) -> tuple[Segment, int] | None:
    seg, i = _find_expandable(st, small, stream, r)
    if seg.blocks[i].state == UNMAPPED:
        j = _map(st, seg, i, min(seg.blocks[i].size, r))
        if j is None:
            return None
        i = j
    while seg.blocks[i].size < r:
        j = _map(st, seg, i + 1, min(r - seg.blocks[i].size, seg.blocks[i + 1].size))
        if j is None:
            return None
        i = j
    return seg, i


def _alloc_block(st: CachingState, small: bool, stream: int, r: int, alloc: int) -> tuple[Segment, int] | None:
    pol = st.policy
    if pol.allowed is not None and _used(st) + alloc > pol.allowed:
        return None
    if pol.expandable:
        return _try_expandable(st, small, stream, r)
    if _used(st) + alloc > pol.capacity:
        return None
    return _new_segment(st, alloc, small, stream, False, 0), 0


def _release_segment(st: CachingState, seg: Segment) -> int:
    st.segments.remove(seg)
    return seg.size


def _release_cached(st: CachingState) -> int:
    """empty_cache / the OOM retry: wait for every event, free the segments
    that are one whole free block, unmap whole free pages of arenas."""
    for s in list(st.issued):
        st.completed[s] = st.issued[s]
    _process_events(st)
    released = 0
    for seg in list(st.segments):
        if seg.expandable:
            changed = True
            while changed and seg in st.segments:
                changed = False
                for i, b in enumerate(seg.blocks):
                    if b.state == FREE:
                        n = _unmap(st, seg, i)
                        if n:
                            released += n
                            changed = True
                            break
        elif len(seg.blocks) == 1 and seg.blocks[0].state == FREE:
            released += _release_segment(st, seg)
    return released


def _release_available(st: CachingState, small: bool, stream: int, r: int) -> bool:
    ms = st.policy.max_split_size
    if not ms:
        return False
    want = max(r, ms)
    blocks = sorted(((b.size, s.base + b.offset, s) for s in st.segments if s.small == small and not s.expandable
                     for b in s.blocks if b.state == FREE and b.stream == stream), key=lambda t: (t[0], t[1]))
    big = [t for t in blocks if t[0] >= want]
    if big:
        seg = big[0][2]
        if len(seg.blocks) != 1:
            return False
        _release_segment(st, seg)
        return True
    released = 0
    for size, _, seg in reversed(blocks):
        if released >= want or size < ms:
            break
        if len(seg.blocks) == 1:
            released += _release_segment(st, seg)
    return released >= want


def _garbage_collect(st: CachingState) -> None:
    pol = st.policy
    threshold = int(pol.gc_threshold * pol.allowed)
    if _used(st) <= threshold:
        return
    target = _used(st) - threshold
    whole = [s for s in st.segments if not s.small and not s.expandable and len(s.blocks) == 1 and s.blocks[0].state == FREE]
    if not whole:
        return
    calls = st.gc_calls[False]
    total_age = sum(calls - s.blocks[0].gc_base for s in whole)
    count = len(whole)
    reclaimed, freed = 0, True
    while reclaimed < target and freed and count > 0:
        avg = total_age / count
        freed = False
        for s in sorted(whole, key=lambda s: (s.stream, s.size, s.base)):
            if s in st.segments and calls - s.blocks[0].gc_base >= avg:
                freed = True
                reclaimed += s.size
                total_age -= calls - s.blocks[0].gc_base
                count -= 1
                _release_segment(st, s)
        whole = [s for s in whole if s in st.segments]


@dataclass
class Prediction:
    """What malloc must do: serve ``(seg, index)`` (sizes after the split) or raise OOM."""

    state: CachingState
    seg: Segment | None = None
    index: int = 0
    rounded: int = 0
    split_from: int = 0            # size of the free block before the split
    oom: dict[str, Any] | None = None


def predict_malloc(st0: CachingState, size: int, stream: int) -> Prediction:
    """PyTorch's ``malloc`` (and the toy's ``alloc``) step by step on a copy of the state."""
    st = copy.deepcopy(st0)
    pol = st.policy
    _process_events(st)
    r = pol.rounded(size)
    small = choose_pool(r) == "small"
    alloc = segment_size(r, pol.seed)
    found = _get_free_block(st, small, stream, r)
    if found is None:
        if pol.gc_threshold > 0 and pol.allowed is not None:
            _garbage_collect(st)
        found = _alloc_block(st, small, stream, r, alloc)
        if found is None and not pol.seed:
            if _release_available(st, small, stream, r):
                found = _alloc_block(st, small, stream, r, alloc)
            if found is None:
                _release_cached(st)
                found = _alloc_block(st, small, stream, r, alloc)
    if found is None:
        reserved = st.reserved()
        allocated = st.figure((LIVE,))
        tried = r if (pol.seed and pol.expandable) else alloc
        st.num_ooms += 1
        return Prediction(st, rounded=r, oom={
            "requested": tried, "total_capacity": pol.capacity, "free": pol.capacity - reserved,
            "allocated": allocated, "reserved": reserved, "reserved_unallocated": reserved - allocated,
            "largest_free_block": st.largest_free()})
    seg, i = found
    b = seg.blocks[i]
    whole = b.size
    if should_split(whole - r, r, seg.small, pol.seed, pol.expandable, pol.max_split_size):
        seg.blocks.insert(i + 1, Block(b.offset + r, whole - r, FREE, stream, gc_base=st.gc_calls[seg.small]))
        b.size = r
    b.state, b.requested, b.stream = LIVE, size, stream
    return Prediction(st, seg, i, r, whole)


# ==========================================================================
# Actions
# ==========================================================================

def _commit(st: CachingState, new: CachingState) -> None:
    st.__dict__.update(new.__dict__)


def _sizes(state: Any, c: Any) -> int:
    kind = c.integer(0, 9)
    if kind <= 3:
        return c.integer(1, K_SMALL_SIZE)                 # small pool
    if kind <= 7:
        return c.integer(K_SMALL_SIZE + 1, 12 * MiB)      # large pool, 20 MiB segments
    if kind == 8:
        return c.choice((512, K_SMALL_SIZE, K_SMALL_SIZE + 1, 2 * MiB, 3 * MiB + 1, 5 * MiB + 1, 10 * MiB + 1, 21 * MiB))
    return c.integer(12 * MiB, 40 * MiB)


SIZES = Domain("request size: small-pool, large-pool, boundaries (512 B, 1 MiB, 10 MiB) and big", _sizes)
STREAM = Domain(f"stream in [0, {STREAMS})", lambda _s, c: c.integer(0, STREAMS - 1))


def _live(st: CachingState) -> list[int]:
    return sorted(r for r in st.where if _block_state(st, r) == LIVE)


def _block_state(st: CachingState, ref: int) -> str:
    seg, i = st.block_of(ref)
    return seg.blocks[i].state


LIVE_REF = Domain("a live block", lambda s, c: c.choice(_live(s)), lambda s: bool(_live(s)))
FREED_REF = Domain("a block already freed", lambda s, c: c.choice(sorted(s.freed)), lambda s: bool(s.freed))


def _diagnose_block(st: CachingState, p: Prediction, v: Any, size: int, stream: int) -> tuple[str, str]:
    """Which rule an unexpected malloc answer breaks."""
    r = p.rounded
    small = choose_pool(r) == "small"
    if getattr(v, "requested_size", None) != size or getattr(v, "stream", None) != stream:
        return "C2", f"the block handle says requested_size={getattr(v, 'requested_size', None)}, stream={getattr(v, 'stream', None)}; asked {size} on stream {stream}"
    if v.size < r:
        return "C2", f"a {v.size}-byte block for a request rounded to {r}: it overlaps its neighbour"
    if p.oom is not None:
        inv = "C8" if st.policy.expandable else "C1"
        return inv, (f"served {v.size} bytes where the spec has no policy-satisfiable memory "
                     f"(reserved {p.oom['reserved']} of {st.policy.capacity}): reserved would exceed the device")
    for seg in st.segments:
        if seg.base is None or not (seg.base <= v.address < seg.base + seg.size):
            continue
        for b in seg.blocks:
            a = seg.base + b.offset
            if not (a <= v.address < a + b.size):
                continue
            where = f"block at {a:#x} ({b.size} bytes, {b.state}) of segment {seg.sid}"
            if b.state == LIVE:
                return "C2", f"returned {v.address:#x}, inside the live {where}: overlap"
            if b.state == PENDING:
                return "C7", f"returned {v.address:#x}, inside the {where}, whose free waits for events on other streams"
            if b.state == UNMAPPED:
                return "C8", f"returned {v.address:#x}, an unmapped page of expandable {where} the spec would not map"
            if seg.small != small:
                return "C4", f"a {choose_pool(r)}-pool request served from the {'small' if seg.small else 'large'} pool's {where}"
            if b.stream != stream:
                return "C7", f"a stream-{stream} request reused the stream-{b.stream} {where}"
            if v.address != a:
                return "C2", f"returned {v.address:#x}, not the start of the {where}"
            legal = should_split(b.size - r, r, seg.small, st.policy.seed, st.policy.expandable, st.policy.max_split_size)
            if v.size == r and b.size > r and not legal:
                return "C5", f"split the {where} for {r} bytes leaving an illegal {b.size - r}-byte remainder"
            if v.size == b.size and b.size > r and legal:
                return "C5", f"handed the whole {where} to a {r}-byte request though the {b.size - r}-byte remainder is legal"
            if v.size not in (r, b.size):
                return "C5", f"a {v.size}-byte block cut from the {where} for a {r}-byte request"
            return "C4", f"served from the {where}, not the best fit (spec: {_describe_pred(p)})"
    if p.seg is not None and p.seg.base is not None:
        return "C4", f"a new segment at {v.address:#x} though a fitting free block exists (spec: {_describe_pred(p)})"
    return "C5", f"a {v.size}-byte block at {v.address:#x} (spec: {_describe_pred(p)})"


def _describe_pred(p: Prediction) -> str:
    if p.oom is not None:
        return "OutOfMemory"
    b = p.seg.blocks[p.index]
    where = f"{p.seg.base + b.offset:#x}" if p.seg.base is not None else f"offset {b.offset} of a new segment"
    return f"{b.size} bytes at {where}"


def _overlaps_known(st: CachingState, addr: int, size: int) -> bool:
    return any(s.base is not None and addr < s.base + s.size and s.base < addr + size for s in st.segments)


def _check_oom(st: CachingState, figures: dict, err: BaseException) -> None:
    """C9: the OOM's figures and message equal the allocator's state."""
    for k, want in figures.items():
        got = getattr(err, k, None)
        if got != want:
            _violate(st, "C9", f"OutOfMemory.{k} = {got!r}, the state says {want!r}")
            return
    msg = str(err)
    fmt = format_mib if st.policy.seed else format_size
    for label, n in (("Tried to allocate", figures["requested"]),
                     ("reserved but unallocated", figures["reserved_unallocated"])):
        if fmt(n) not in msg:
            _violate(st, "C9", f"the message does not say {fmt(n)} for {label!r}: {msg!r}")
            return
    if not st.policy.seed and "expandable_segments" not in msg:
        _violate(st, "C9", "the message lacks the expandable_segments hint")


def _malloc_step(st: CachingState, size: int, stream: int):
    if size >= ONE_EB:
        return outcomes(Raises(OutOfMemory, "more than 1EB", then=lambda e: None if "more than 1EB" in str(e)
                               else _violate(st, "C9", f"1 EB request: message {str(e)!r}")), blame="C9")
    p = predict_malloc(st, size, stream)
    ref = st.next_ref

    def bind(v: Any) -> int:
        nb = p.seg.blocks[p.index]
        nb.ref = ref
        if p.seg.base is None:
            p.seg.base = v.address - nb.offset
        p.state.where[ref] = p.seg.sid
        p.state.next_ref = ref + 1
        _commit(st, p.state)
        return ref

    if p.oom is not None:
        def on_oom(e: BaseException) -> None:
            _commit(st, p.state)
            _check_oom(st, p.oom, e)

        def unexpected_block(v: Any) -> int:
            inv, why = _diagnose_block(st, p, v, size, stream)
            _violate(st, inv, f"malloc({size}, stream={stream}): {why}")
            return ref

        return outcomes(Raises(OutOfMemory, "no policy-satisfiable memory", then=on_oom),
                        Returns("a block the state cannot hold (diagnosed)", accepts=lambda v: hasattr(v, "address"),
                                then=unexpected_block),
                        blame="C9")

    nb = p.seg.blocks[p.index]

    def exact(v: Any) -> bool:
        if v.size != nb.size or v.requested_size != size or v.stream != stream:
            return False
        if p.seg.base is not None:
            return v.address == p.seg.base + nb.offset
        return not _overlaps_known(st, v.address - nb.offset, p.seg.size)

    def other_block(v: Any) -> int:
        inv, why = _diagnose_block(st, p, v, size, stream)
        _violate(st, inv, f"malloc({size}, stream={stream}): {why}")
        return ref

    def spurious_oom(e: BaseException) -> None:
        inv = "C8" if st.policy.expandable else "C9"
        _violate(st, inv, f"malloc({size}, stream={stream}) raised OutOfMemory ({e}) but the spec serves "
                          f"{_describe_pred(p)} (reserved {st.reserved()} of {st.policy.capacity})")

    def witness() -> Any:
        base = p.seg.base if p.seg.base is not None else (1 << 48) + p.seg.sid * (1 << 46)
        return _Witness(base + nb.offset, nb.size, size, stream)

    return outcomes(
        Returns(f"the predicted block: {_describe_pred(p)}", accepts=exact, then=bind, witness=witness),
        Returns("another block (diagnosed)", accepts=lambda v: hasattr(v, "address") and hasattr(v, "size"), then=other_block),
        Raises(OutOfMemory, "where the spec has memory (diagnosed)", then=spurious_oom),
        blame="C4",
    )


@dataclass(frozen=True)
class _Witness:
    address: int
    size: int
    requested_size: int
    stream: int


@action(role="caching", params={"size": SIZES, "stream": STREAM},
        perform=lambda sut, size, stream: sut.allocator.malloc(size, stream),
        invariants=("C2", "C3", "C4", "C5", "C7", "C8", "C9", "C1"), weight=6)
def malloc(st: CachingState, size: int, stream: int):
    """Allocate ``size`` bytes for work on ``stream``: round, pick the pool,
    best-fit a free block of that pool and stream, else a new segment
    (cudaMalloc, or pages of an expandable arena), else (pytorch) release
    cached blocks and retry, else OutOfMemory.

    Seed 003: *allocation is an exact-size hit or a best-fit-by-size search --
    no global walk.*"""
    return _malloc_step(st, size, stream)


def _free_step(st: CachingState, ref: int):
    def then(_v: Any) -> None:
        seg, i = st.block_of(ref)
        b = seg.blocks[i]
        st.freed.add(ref)
        if b.uses:
            b.state = PENDING
            for s in sorted(b.uses):
                st.issued[s] = st.issued.get(s, 0) + 1
                st.events.append((s, st.issued[s], ref))
                b.waits += 1
            b.uses = set()
        else:
            _free_block(st, seg, i)

    return outcomes(Returns("None", accepts=lambda v: v is None, then=then, witness=lambda: None), blame="C3")


@action(role="caching", params={"ref": LIVE_REF}, perform=lambda sut, ref: sut.allocator.free(sut.ref(ref)),
        invariants=("C3", "C7", "C2", "C1"), weight=4)
def free(st: CachingState, ref: int):
    """Free a live block. With uses on other streams (record_stream) it stays
    pending until their events complete; otherwise it returns to its pool at
    once and merges with free neighbours.

    Seed 003: *adjacent free blocks would merge*."""
    return _free_step(st, ref)


@action(role="caching", params={"ref": FREED_REF}, perform=lambda sut, ref: sut.allocator.free(sut.ref(ref)),
        invariants=("C2",), weight=1)
def double_free(st: CachingState, ref: int):
    """Freeing a block twice is refused (DoubleFree), even if its address was reused."""
    return only(DoubleFree, blame="C2", describe="the block was already freed")


@action(role="caching", params={"ref": LIVE_REF, "stream": STREAM},
        perform=lambda sut, ref, stream: sut.allocator.record_stream(sut.ref(ref), stream),
        invariants=("C7",), weight=2)
def record_stream(st: CachingState, ref: int, stream: int):
    """``Tensor.record_stream``: work on ``stream`` uses the block; its free
    will wait for that work (an event recorded at free time)."""
    def then(_v: Any) -> None:
        seg, i = st.block_of(ref)
        b = seg.blocks[i]
        if stream != b.stream:
            b.uses.add(stream)
    return outcomes(Returns("None", accepts=lambda v: v is None, then=then, witness=lambda: None), blame="C7")


@action(role="caching", params={"stream": STREAM},
        perform=lambda sut, stream: sut.allocator.complete_stream(stream), invariants=("C7",), weight=2)
def complete_stream(st: CachingState, stream: int):
    """The device finished the work queued on ``stream``: its events are
    complete; pending frees finish at the next malloc or empty_cache."""
    def then(_v: Any) -> None:
        st.completed[stream] = st.issued.get(stream, 0)
    return outcomes(Returns("None", accepts=lambda v: v is None, then=then, witness=lambda: None), blame="C7")


@action(role="caching", perform=lambda sut: sut.allocator.empty_cache(), invariants=("C6", "C3", "C7", "C2", "C1"),
        weight=1)
def empty_cache(st: CachingState):
    """Wait for all events, then release every segment that is one whole free
    block (unmap the whole free pages of expandable arenas); return the bytes
    released.

    Seed 003: *empty_cache() releases segments that are entirely free to the
    driver; it moves, merges, and defragments nothing inside partially-live
    segments.*"""
    new = copy.deepcopy(st)
    released = _release_cached(new)

    def ok(_v: Any) -> None:
        _commit(st, new)

    def wrong(v: Any) -> None:
        _commit(st, new)
        _violate(st, "C6", f"empty_cache() released {v} bytes; the fully-free segments/pages hold {released}")

    return outcomes(Returns(f"{released} (bytes released)", accepts=lambda v: v == released, then=ok, witness=lambda: released),
                    Returns("another figure (diagnosed)", accepts=lambda v: isinstance(v, int), then=wrong),
                    blame="C6")


# ==========================================================================
# Invariants C1..C9
# ==========================================================================

def _recorded(inv: str):
    def check(st: CachingState) -> str | None:
        for i, why in st.violations:
            if i == inv:
                return why
        return None
    return check


def layout_violations(segments: list[dict]) -> dict[str, str | None]:
    """C2/C3/C4 over a layout in ``snapshot()['segments']`` form (used on the
    spec's own state and on the implementation's snapshot)."""
    out: dict[str, str | None] = {"C2": None, "C3": None, "C4": None}
    for s in segments:
        at = s["address"]
        prev_state = None
        for b in s["blocks"]:
            if b["address"] != at and out["C2"] is None:
                out["C2"] = f"segment {s['address']:#x}: block at {b['address']:#x}, expected {at:#x} (gap or overlap)"
            at = b["address"] + b["size"]
            st = b["state"]
            if st == "inactive" and prev_state == "inactive" and out["C3"] is None:
                out["C3"] = f"segment {s['address']:#x}: adjacent free blocks at {b['address']:#x} left uncoalesced"
            prev_state = st
            if st == "active_allocated" and out["C4"] is None:
                pool = "small" if b["requested_size"] <= K_SMALL_SIZE else "large"
                if pool != s["segment_type"]:
                    out["C4"] = (f"a {pool}-pool request ({b['requested_size']} bytes) lives in a "
                                 f"{s['segment_type']}-pool segment at {s['address']:#x}")
        if at != s["address"] + s["total_size"] and out["C2"] is None:
            out["C2"] = f"segment {s['address']:#x}: blocks end at {at:#x}, the segment at {s['address'] + s['total_size']:#x}"
    return out


def spec_segments(st: CachingState) -> list[dict]:
    """The spec's layout in ``snapshot()['segments']`` form: mapped ranges of
    arenas are segments of their own, as in PyTorch."""
    names = {FREE: "inactive", LIVE: "active_allocated", PENDING: "active_pending_free"}
    out = []
    for s in st.segments:
        if s.base is None:
            continue
        runs: list[list[Block]] = []
        cur: list[Block] = []
        for b in s.blocks:
            if b.state == UNMAPPED:
                if cur:
                    runs.append(cur)
                cur = []
            else:
                cur.append(b)
        if cur:
            runs.append(cur)
        for run in runs:
            out.append({
                "address": s.base + run[0].offset, "total_size": sum(b.size for b in run),
                "segment_type": "small" if s.small else "large", "is_expandable": s.expandable, "stream": s.stream,
                "blocks": [{"address": s.base + b.offset, "size": b.size, "state": names[b.state],
                            "requested_size": b.requested if b.state != FREE else 0} for b in run],
            })
    out.sort(key=lambda d: d["address"])
    return out


def _c1(st: CachingState) -> str | None:
    for small in (None, True, False):
        name = {None: "all", True: "small_pool", False: "large_pool"}[small]
        res = st.reserved(small)
        act = st.figure((LIVE, PENDING), small)
        req = st.figure((LIVE, PENDING), small, requested=True)
        if not (res >= act >= req):
            return f"{name}: reserved {res} >= allocated {act} >= requested {req} fails"
    if st.reserved() > st.policy.capacity:
        return f"reserved {st.reserved()} exceeds the device's {st.policy.capacity} bytes"
    return _recorded("C1")(st)


def _layout_check(inv: str):
    def check(st: CachingState) -> str | None:
        why = _recorded(inv)(st)
        if why:
            return why
        return layout_violations(spec_segments(st))[inv]
    return check


def _c3(st: CachingState) -> str | None:
    why = _layout_check("C3")(st)
    if why:
        return why
    for s in st.segments:  # unmapped runs of an arena coalesce too
        for a, b in zip(s.blocks, s.blocks[1:]):
            if a.state == b.state == UNMAPPED:
                return f"segment {s.sid}: adjacent unmapped blocks at offsets {a.offset} and {b.offset}"
    return None


def _c5(st: CachingState) -> str | None:
    why = _recorded("C5")(st)
    if why:
        return why
    if st.policy.seed and not st.policy.expandable:
        for s in st.segments:
            if not s.small:
                for b in s.blocks:
                    if b.size % K_ROUND_LARGE:
                        return f"segment {s.sid}: a {b.size}-byte large-pool block (the remainder floor is 2 MiB)"
    return None


def _c7(st: CachingState) -> str | None:
    why = _recorded("C7")(st)
    if why:
        return why
    for s in st.segments:
        for b in s.blocks:
            if b.state == PENDING and b.waits <= 0:
                return f"segment {s.sid}: block at offset {b.offset} pending with no event"
    return None


INVARIANTS = [
    Invariant("C1", "reserved >= allocated >= requested",
              "reserved ≥ allocated ≥ requested, always.", _c1),
    Invariant("C2", "blocks tile their segment",
              "SEGMENT 0 = one cudaMalloc VA reservation ... the span would have to cross a live tensor", _layout_check("C2")),
    Invariant("C3", "adjacent free blocks coalesce",
              "coalesce — every hole's neighbors are live 6 MiB blocks, and adjacent free blocks would merge", _c3),
    Invariant("C4", "pools never mix; best fit within the pool",
              "Pools never mix. A 900 KiB request will not carve a large-pool free block", _layout_check("C4")),
    Invariant("C5", "split only with a legal remainder",
              "A free block splits only if the remainder is itself legal (≥ 512 B small pool, ≥ 2 MiB large pool)", _c5),
    Invariant("C6", "empty_cache releases exactly the fully-free segments",
              "empty_cache() releases segments that are entirely free to the driver; it moves, merges, and "
              "defragments nothing inside partially-live segments", _recorded("C6")),
    Invariant("C7", "no reuse before the events of other streams complete",
              "GPU release must obey stream/fence ordering (seed 000); seed 003's caching allocator reuses a "
              "block only on its stream, and only after the events of the other streams that used it complete", _c7),
    Invariant("C8", "expandable segments: OOM only at physical exhaustion",
              "A freed block's pages unmap — physical memory returns to the driver immediately — and a later large "
              "request maps fresh pages into a fresh contiguous VA run.", _recorded("C8")),
    Invariant("C9", "the OOM message's figures equal the state",
              "The OOM message is the diagnosis: \"N GiB is reserved by PyTorch but unallocated\" = fragmentation",
              _recorded("C9")),
]


# ==========================================================================
# Observations: the implementation's stats and layout against the spec's
# ==========================================================================

def _impl_segments(sut: Any) -> list[dict]:
    segs = sut.allocator.snapshot()["segments"]
    return sorted(({"address": s["address"], "total_size": s["total_size"], "segment_type": s["segment_type"],
                    "is_expandable": s["is_expandable"], "stream": s["stream"],
                    "blocks": [{"address": b["address"], "size": b["size"], "state": b["state"],
                                "requested_size": b["requested_size"] if b["state"] != "inactive" else 0}
                               for b in s["blocks"]]} for s in segs), key=lambda d: d["address"])


def _impl_layout_check(inv: str):
    def observed(sut: Any, _r: Any) -> str | None:
        return layout_violations(_impl_segments(sut))[inv]
    return observed


def _pending(segments: list[dict]) -> list[int]:
    return sorted(b["address"] for s in segments for b in s["blocks"] if b["state"] == "active_pending_free")


def _stats_expected(st: CachingState, _r: Any) -> dict[str, int]:
    out = {}
    for small, name in ((None, "all"), (True, "small_pool"), (False, "large_pool")):
        out[f"reserved_bytes.{name}.current"] = st.reserved(small)
        out[f"allocated_bytes.{name}.current"] = st.figure((LIVE,), small)
        out[f"active_bytes.{name}.current"] = st.figure((LIVE, PENDING), small)
        out[f"requested_bytes.{name}.current"] = st.figure((LIVE, PENDING), small, requested=True)
    out["num_ooms"] = st.num_ooms
    return out


def _stats_observed(sut: Any, _r: Any) -> dict[str, int]:
    flat = sut.allocator.memory_stats()
    return {k: flat[k] for k in _stats_expected(CachingState(Policy()), None)}


def _global(_s: Any, _t: Any):
    return (None,)


OBSERVATIONS = [
    Observation("layout tiles (C2)", "C2", _global, lambda st, r: None, _impl_layout_check("C2")),
    Observation("free neighbours coalesced (C3)", "C3", _global, lambda st, r: None, _impl_layout_check("C3")),
    Observation("pools never mix (C4)", "C4", _global, lambda st, r: None, _impl_layout_check("C4")),
    Observation("pending frees (C7)", "C7", _global, lambda st, r: _pending(spec_segments(st)),
                lambda sut, r: _pending(_impl_segments(sut))),
    Observation("memory_stats (C1)", "C1", _global, _stats_expected, _stats_observed),
    Observation("segments and blocks (C2)", "C2", _global, lambda st, r: spec_segments(st),
                lambda sut, r: _impl_segments(sut)),
]


def init(*, policy: str = "pytorch", capacity: int = 64 * MiB, expandable: bool = False, max_split_size: int | None = None,
         roundup_power2_divisions: int | tuple[int, ...] = 0, memory_fraction: float | None = None,
         garbage_collection_threshold: float = 0.0, arena_factor: float | None = None) -> CachingState:
    """The initial state: no segments, no events."""
    if policy not in PRESETS:
        raise ValueError(f"unknown policy {policy!r}; expected one of {PRESETS}")
    d = roundup_power2_divisions
    table = (d,) * 16 if isinstance(d, int) and d else tuple(d) if d else ()
    return CachingState(Policy(
        preset=policy, capacity=capacity, expandable=expandable, max_split_size=max_split_size or 0,
        divisions=table, memory_fraction=memory_fraction, gc_threshold=garbage_collection_threshold,
        arena_factor=arena_factor or 0.0))


CACHING: Machine[CachingState] = Machine(
    name="caching",
    doc=__doc__ or "",
    init=init,
    actions=[malloc, free, double_free, record_stream, complete_stream, empty_cache],
    invariants=INVARIANTS,
    observations=OBSERVATIONS,
)
