"""The caching policy as state transitions on a copy of the state.

Each function reads and edits a :class:`~memspec.spec.caching.state.CachingState`;
an action runs them on a copy and its ``then`` commits the copy.
:func:`predict_malloc` is the refinement oracle: the exact block (or the exact
OOM) a conforming allocator produces.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from memspec.spec.caching.kernels import K_LARGE_BUFFER, choose_pool, segment_size, should_split
from memspec.spec.caching.state import FREE, LIVE, UNMAPPED, Block, CachingState, Segment


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


def _find_expandable(st: CachingState, small: bool, stream: int, r: int) -> tuple[Segment, int] | None:
    """The first run (by arena address) of free and unmapped blocks that holds ``r``, else a fresh arena;
    ``None`` when a fresh arena's VA (``arena`` x capacity) is itself smaller than ``r`` (no arena can hold
    the request: an OutOfMemory, never reached with the presets' 1.125 and 16)."""
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
    if size < r:
        return None
    return _new_segment(st, size, small, stream, True, page), 0


def _try_expandable(st: CachingState, small: bool, stream: int, r: int) -> tuple[Segment, int] | None:
    found = _find_expandable(st, small, stream, r)
    if found is None:
        return None
    seg, i = found
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
    # memory_fraction: the device allocation is refused when reserved + its size > the cap.  PyTorch checks
    # the segment size (``alloc``) even with expandable segments; the seed's toy under expandable segments
    # allocates no segment, it maps the rounded request's pages (``if s.mapped + want > s.device``), and its
    # OutOfMemory reports ``r`` as tried: the cap is checked on the pages of ``r`` there (``r`` itself in the
    # large pool), not on ``max(20 MiB, r)``, so reserved stays within the cap whatever the run maps.
    size = -(-r // pol.page(small)) * pol.page(small) if (pol.seed and pol.expandable) else alloc
    if pol.allowed is not None and _used(st) + size > pol.allowed:
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

