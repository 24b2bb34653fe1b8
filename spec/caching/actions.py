"""Caching actions: what a caller may ask the allocator, and every allowed answer.

``malloc``, ``free``, ``double_free``, ``record_stream``, ``complete_stream``
and ``empty_cache`` call ``sut.allocator``; an answer that differs from the
policy's prediction is diagnosed (which rule it breaks) and recorded, and the
invariant of that rule then fails.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from memspec.spec.api import MiB
from memspec.spec.caching.kernels import (K_MIN_BLOCK, K_ROUND_LARGE, K_SMALL_SIZE, boundaries, choose_pool, format_mib,
                                          format_size, segment_size, should_split, thresholds)
from memspec.spec.caching.policy import Prediction, _free_block, _release_cached, predict_malloc
from memspec.spec.caching.state import FREE, LIVE, PENDING, UNMAPPED, CachingState, _violate
from memspec.spec.core import Domain, Raises, Returns, action, only, outcomes
from memspec.spec.errors import DoubleFree, OutOfMemory

#: requests at or above one exabyte are answered OutOfMemory without a plan
ONE_EB = 1 << 60
#: the streams a request may name
STREAMS = 3


def _commit(st: CachingState, new: CachingState) -> None:
    st.__dict__.update(new.__dict__)


_BOUNDARIES: dict = {}   # Policy (frozen) -> its boundaries


def size_boundaries(state: Any) -> tuple[int, ...]:
    """The request sizes at a threshold of the policy (:func:`fixed_boundaries`)
    and the :func:`remainder_sizes` of the blocks free now."""
    out = fixed_boundaries(state)
    rel = remainder_sizes(state)
    return out + rel if rel else out


def fixed_boundaries(state: Any) -> tuple[int, ...]:
    """The request sizes at a threshold of the policy, exactly and at +-1
    (:func:`~memspec.spec.caching.kernels.boundaries`: the rounding ladder,
    the pools, the segment-size ladder incl. exactly 10 MiB, the split
    rules, ``max_split_size``), and the device exactly full and one 2 MiB
    page over (what is not reserved yet, and that plus a page)."""
    pol = state.policy
    cached = _BOUNDARIES.get(pol)
    if cached is None:
        cached = _BOUNDARIES[pol] = boundaries(pol.max_split_size or 0, tuple(pol.divisions or ()))
    left = (pol.allowed if pol.allowed is not None else pol.capacity) - state.reserved()
    return cached if left <= 0 else cached + (left, left + K_ROUND_LARGE)


#: the remainders a split rule compares with (seed 003: *the remainder is itself
#: legal (>= 512 B small pool, >= 2 MiB large pool)*; PyTorch: ``> 1 MiB``),
#: none (an exact fit), and the segment sizes
_REMAINDERS = tuple(sorted({0, *thresholds().values()}))


def remainder_sizes(state: Any) -> tuple[int, ...]:
    """Requests that leave a block free now with a remainder exactly at a
    threshold of the split rules, and one rounding step (512 B) either
    side: ``free - t`` and ``free - t +- 512`` for each free block size and
    each ``t`` of :data:`_REMAINDERS`.

    A split rule compares ``block - request``, not the request: a bound
    tested only on request sizes (:func:`size_boundaries`' fixed list)
    reaches it only when the free block happens to be a segment's whole
    size.  Seed 003: *A free block splits only if the remainder is itself
    legal (>= 512 B small pool, >= 2 MiB large pool); a freed 5 MiB block
    serving a 4 MiB request is handed over whole.*"""
    sizes = {b.size for s in state.segments for b in s.blocks if b.state == FREE}
    if not sizes:
        return ()
    step = K_MIN_BLOCK
    return tuple(sorted({r for f in sizes for t in _REMAINDERS for r in (f - t - step, f - t, f - t + step)
                         if 0 < r}))


def _sizes(state: Any, c: Any) -> int:
    kind = c.integer(0, 11)
    if kind <= 3:
        return c.integer(1, K_SMALL_SIZE)                 # small pool
    if kind <= 6:
        return c.integer(K_SMALL_SIZE + 1, 12 * MiB)      # large pool, 20 MiB segments
    if 9 <= kind <= 10:
        rel = remainder_sizes(state)
        if rel:
            return c.choice(rel)                          # a free block's remainder at a split threshold
    if kind <= 10:
        return c.choice(fixed_boundaries(state))          # every threshold of the policy, exactly and +-1
    return c.integer(12 * MiB, 40 * MiB)


SIZES = Domain("request size: small-pool, large-pool, every threshold of the policy exactly and at +-1 "
               "(512 B, 1 MiB, 2 MiB, 10 MiB, 20 MiB, max_split_size, the device full and a page over), "
               "a free block's remainder exactly at a split threshold and one 512 B step either side, and big",
               _sizes, boundaries=size_boundaries)
STREAM = Domain(f"stream in [0, {STREAMS}) (the allocator's streams)", lambda s, c: c.integer(0, s.streams - 1))


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


def plain_block(v: Any) -> bool:
    """A block handle whose ``address``, ``size``, ``requested_size`` and
    ``stream`` are plain ints (no bool, no int subclass whose comparisons lie
    or raise): the only answer of malloc the spec reads."""
    return all(type(getattr(v, f, None)) is int for f in ("address", "size", "requested_size", "stream"))


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
        if type(got) is not int or got != want:   # a plain int: an int subclass equal to everything is no figure
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
                        Returns("a block the state cannot hold (diagnosed)", accepts=plain_block,
                                then=unexpected_block),
                        blame="C9")

    nb = p.seg.blocks[p.index]

    def exact(v: Any) -> bool:
        if not plain_block(v):
            return False
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
        why = ""
        tried, ladder = getattr(e, "requested", None), segment_size(p.rounded, st.policy.seed)
        if not st.policy.expandable and p.seg.base is None and type(tried) is int and tried != ladder:
            # the spec cuts a new segment too: the size the allocator says it tried is the ladder's step
            inv, why = "C2", (f": it tried a {tried}-byte segment where the segment-size ladder gives {ladder} "
                              f"for a request rounded to {p.rounded}")
        _violate(st, inv, f"malloc({size}, stream={stream}) raised OutOfMemory ({e}) but the spec serves "
                          f"{_describe_pred(p)} (reserved {st.reserved()} of {st.policy.capacity}){why}")

    def witness() -> Any:
        base = p.seg.base if p.seg.base is not None else (1 << 48) + p.seg.sid * (1 << 46)
        return _Witness(base + nb.offset, nb.size, size, stream)

    return outcomes(
        Returns(f"the predicted block: {_describe_pred(p)}", accepts=exact, then=bind, witness=witness),
        Returns("another block (diagnosed)", accepts=plain_block, then=other_block),
        Raises(OutOfMemory, "where the spec has memory (diagnosed)", then=spurious_oom),
        blame="C4",
    )


@dataclass(frozen=True)
class _Witness:
    address: int
    size: int
    requested_size: int
    stream: int


@action(role="CachingAllocator", params={"size": SIZES, "stream": STREAM},
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


@action(role="CachingAllocator", params={"ref": LIVE_REF}, perform=lambda sut, ref: sut.allocator.free(sut.ref(ref)),
        invariants=("C3", "C7", "C2", "C1"), weight=4)
def free(st: CachingState, ref: int):
    """Free a live block. With uses on other streams (record_stream) it stays
    pending until their events complete; otherwise it returns to its pool at
    once and merges with free neighbours.

    Seed 003: *adjacent free blocks would merge*."""
    return _free_step(st, ref)


@action(role="CachingAllocator", params={"ref": FREED_REF}, perform=lambda sut, ref: sut.allocator.free(sut.ref(ref)),
        invariants=("C2",), weight=1, misuse=True)
def double_free(st: CachingState, ref: int):
    """Freeing a block twice is refused (DoubleFree), even if its address was reused."""
    return only(DoubleFree, blame="C2", describe="the block was already freed")


@action(role="CachingAllocator", params={"ref": LIVE_REF, "stream": STREAM},
        perform=lambda sut, ref, stream: sut.allocator.record_stream(sut.ref(ref), stream),
        invariants=("C7",), requires=("record_stream",), weight=2)
def record_stream(st: CachingState, ref: int, stream: int):
    """``Tensor.record_stream``: work on ``stream`` uses the block; its free
    will wait for that work (an event recorded at free time)."""
    def then(_v: Any) -> None:
        seg, i = st.block_of(ref)
        b = seg.blocks[i]
        if stream != b.stream:
            b.uses.add(stream)
    return outcomes(Returns("None", accepts=lambda v: v is None, then=then, witness=lambda: None), blame="C7")


@action(role="CachingAllocator", params={"stream": STREAM},
        perform=lambda sut, stream: sut.allocator.complete_stream(stream), invariants=("C7",), weight=2)
def complete_stream(st: CachingState, stream: int):
    """The device finished the work queued on ``stream``: its events are
    complete; pending frees finish at the next malloc or empty_cache."""
    def then(_v: Any) -> None:
        st.completed[stream] = st.issued.get(stream, 0)
    return outcomes(Returns("None", accepts=lambda v: v is None, then=then, witness=lambda: None), blame="C7")


@action(role="CachingAllocator", perform=lambda sut: sut.allocator.empty_cache(), invariants=("C6", "C3", "C7", "C2", "C1"),
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

    return outcomes(Returns(f"{released} (bytes released)" if released else "0 (nothing fully free to release)",
                            accepts=lambda v: type(v) is int and v == released, then=ok, witness=lambda: released),
                    Returns("another figure (diagnosed)", accepts=lambda v: type(v) is int, then=wrong),
                    blame="C6")

