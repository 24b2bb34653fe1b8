"""Hostile and careless callers of the reference caching allocator (issue 15,
items 5 and 15): a handle is checked against the allocator's own record,
never its own fields, and bad arguments get named errors.

Every refusal leaves the ledger (``memory_stats()``, ``segments()``,
``live_blocks()``) exactly as it was, under every preset and with and without
expandable segments, for small-pool and large-pool blocks.
"""

from __future__ import annotations

import copy
import math

import pytest

from memspec.reference.caching import CachingAllocator
from memspec.spec.errors import DoubleFree, ForeignAllocation, InvalidRequest, MemspecError, StaleHandle

MiB = 1 << 20
HANDLE_ERRORS = (DoubleFree, StaleHandle, ForeignAllocation)

CONFIGS = [(p, e) for p in ("pytorch", "seed") for e in (False, True)]
SIZES = [3000, 3 * MiB + 1]  # small pool, large pool


def _alloc(preset: str, expandable: bool) -> CachingAllocator:
    return CachingAllocator(preset=preset, capacity=1 << 32, expandable_segments=expandable)


def _ledger(a: CachingAllocator):
    return a.memory_stats(), a.segments(), a.live_blocks()


def _hand_built(h):
    """A handle built by hand with every field of ``h`` (works whatever the
    handle class's slots are): what a caller forging a handle would do."""
    cls = type(h)
    f = cls.__new__(cls)
    for klass in cls.__mro__:
        for name in getattr(klass, "__slots__", ()):
            if hasattr(h, name):
                setattr(f, name, getattr(h, name))
    return f


def _assert_usable(a: CachingAllocator, live: list) -> None:
    """After a refusal the allocator still works: new blocks never overlap
    live ones, and freeing everything returns allocated bytes to zero."""
    more = [a.malloc(n) for n in (4096, 2 * MiB + 7, 5 * MiB)]
    spans = sorted((b.address, b.address + b.size) for b in live + more)
    for (s0, e0), (s1, _e1) in zip(spans, spans[1:]):
        assert e0 <= s1, f"overlapping live blocks {spans}"
    for b in live + more:
        a.free(b)
    assert a.memory_allocated() == 0
    assert a.live_blocks() == 0


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("preset,expandable", CONFIGS)
def test_double_free_through_a_copy_is_refused(preset, expandable, size):
    a = _alloc(preset, expandable)
    keep = a.malloc(1000)
    h = a.malloc(size)
    dup = copy.copy(h)
    a.free(h)
    before = _ledger(a)
    with pytest.raises(HANDLE_ERRORS):
        a.free(dup)
    assert _ledger(a) == before
    _assert_usable(a, [keep])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("preset,expandable", CONFIGS)
def test_free_of_a_copy_of_a_live_block_is_refused_and_the_original_still_frees(preset, expandable, size):
    a = _alloc(preset, expandable)
    h = a.malloc(size)
    before = _ledger(a)
    with pytest.raises(HANDLE_ERRORS):
        a.free(copy.copy(h))
    assert _ledger(a) == before
    a.free(h)  # the real handle is still live
    _assert_usable(a, [])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("preset,expandable", CONFIGS)
def test_hand_built_handle_with_a_live_blocks_address_is_refused(preset, expandable, size):
    a = _alloc(preset, expandable)
    h = a.malloc(size)
    forged = _hand_built(h)
    before = _ledger(a)
    with pytest.raises(HANDLE_ERRORS):
        a.free(forged)
    assert _ledger(a) == before
    with pytest.raises(HANDLE_ERRORS):
        a.record_stream(forged, 3)
    assert _ledger(a) == before
    _assert_usable(a, [h])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("preset,expandable", CONFIGS)
def test_stale_copy_is_refused_after_its_address_is_recycled(preset, expandable, size):
    a = _alloc(preset, expandable)
    h = a.malloc(size)
    forged = _hand_built(h)
    a.free(h)
    h2 = a.malloc(size)  # best fit hands the same address out again (not under seed+expandable: pages unmap)
    assert h2.address == h.address or (preset, expandable) == ("seed", True)
    before = _ledger(a)
    for bad in (forged, h, copy.copy(h)):
        with pytest.raises(HANDLE_ERRORS):
            a.free(bad)
        assert _ledger(a) == before
    _assert_usable(a, [h2])


@pytest.mark.parametrize("preset,expandable", CONFIGS)
def test_altered_fields_of_a_live_handle_do_not_reach_the_ledger(preset, expandable):
    """The allocator frees what it handed out, whatever the caller wrote into
    the handle: the stats come back to the empty allocator's."""
    a = _alloc(preset, expandable)
    h = a.malloc(3 * MiB + 1)
    h.size, h.requested_size, h.stream = 1, 1, 7
    a.free(h)
    st = a.memory_stats()
    for key in ("allocated_bytes", "requested_bytes", "active_bytes", "allocation", "active"):
        assert st[f"{key}.all.current"] == 0, key
    _assert_usable(a, [])


@pytest.mark.parametrize("preset,expandable", CONFIGS)
def test_record_stream_refuses_a_bool_stream(preset, expandable):
    a = _alloc(preset, expandable)
    h = a.malloc(3000)
    before = _ledger(a)
    with pytest.raises(InvalidRequest):
        a.record_stream(h, True)
    assert _ledger(a) == before
    a.free(h)  # not deferred on a "stream True"
    assert a.memory_stats()["active.all.current"] == 0


@pytest.mark.parametrize("fraction", ["x", "0.5", None, True, [0.5], 0.5j])
def test_memory_fraction_refuses_non_numbers(fraction):
    a = _alloc("pytorch", False)
    with pytest.raises(InvalidRequest):
        a.set_per_process_memory_fraction(fraction)
    assert a.memory_fraction is None
    if fraction is None:
        return  # the constructor's None means "no fraction"
    with pytest.raises(InvalidRequest):
        CachingAllocator(preset="pytorch", capacity=1 << 30, memory_fraction=fraction)


@pytest.mark.parametrize("fraction", [math.nan, -0.1, 1.5, math.inf])
def test_memory_fraction_refuses_out_of_range(fraction):
    """Regression guard (these already raised before issue 15)."""
    a = _alloc("pytorch", False)
    with pytest.raises(InvalidRequest):
        a.set_per_process_memory_fraction(fraction)
    assert a.memory_fraction is None


@pytest.mark.parametrize("stream", ["x", None, -1, 1.0, True, (1,), [1]])
def test_complete_stream_refuses_anything_but_a_stream(stream):
    a = _alloc("pytorch", False)
    h = a.malloc(3000)
    a.record_stream(h, 2)
    a.free(h)  # pending on stream 2
    before = _ledger(a), dict(a._completed)
    with pytest.raises(InvalidRequest):
        a.complete_stream(stream)
    assert (_ledger(a), dict(a._completed)) == before


def test_errors_are_named_for_other_allocators_and_garbage():
    a, b = _alloc("pytorch", False), _alloc("pytorch", False)
    h = b.malloc(3000)
    with pytest.raises(ForeignAllocation):
        a.free(h)
    for junk in (None, 5, "x", object()):
        with pytest.raises(MemspecError):
            a.free(junk)
    b.free(h)


@pytest.mark.parametrize("preset,expandable", CONFIGS)
def test_a_forged_internal_block_behind_a_forged_handle_is_refused(preset, expandable):
    """Even a handle pointing at a hand-made internal block of a live
    segment (claiming to be its record) is refused: the record is also the
    segment's own block chain, which never links a forged block."""
    import memspec.reference.caching as mod

    a = _alloc(preset, expandable)
    h = a.malloc(3 * MiB + 1)
    real = getattr(h, "_block", None)
    if real is None:
        pytest.skip("handles without an internal block reference")
    fake = mod._Block(h.address, h.size, h.stream, real.seg)
    fake.allocated = True
    forged = _hand_built(h)
    forged._block = fake
    fake.handle = forged
    before = _ledger(a)
    with pytest.raises(HANDLE_ERRORS):
        a.free(forged)
    with pytest.raises(HANDLE_ERRORS):
        a.record_stream(forged, 2)
    assert _ledger(a) == before
    _assert_usable(a, [h])
