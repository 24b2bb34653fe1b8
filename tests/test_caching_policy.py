"""Model-level versions of PyTorch's allocator tests and the seed's quiz (seed 003).

Both the spec (``memspec.spec.caching``, run on its own through its
witnesses) and the reference (``memspec.reference.caching``) answer.
"""

from __future__ import annotations

import pytest

from memspec.reference.caching import CachingAllocator, SimulatedDevice
from memspec.spec import caching as spec
from memspec.spec.core import Raises, Returns
from memspec.spec.errors import DoubleFree, ForeignAllocation, InvalidRequest, OutOfMemory

MiB = 1 << 20


# --------------------------------------------------------------------------
# running the spec on its own
# --------------------------------------------------------------------------

def spec_do(st, name, **args):
    """Take the spec's own (first, predicted) branch of an action; return its value."""
    outs = spec.CACHING.action(name).step(st, **args)
    branch = outs.branches[0]
    if isinstance(branch, Raises):
        return branch
    v = branch.witness()
    r = branch.then(v)
    assert not spec.CACHING.check_invariants(st)
    return (r, v) if name == "malloc" else v


# --------------------------------------------------------------------------
# Quiz question 1: rounded block size and pool
# --------------------------------------------------------------------------

Q1 = [  # (request, pytorch rounded, seed rounded, pool)
    (100, 512, 512, "small"),
    (300_000, 300_032, 300_032, "small"),
    (3 * MiB // 2, 3 * MiB // 2, 2 * MiB, "large"),
    (int(2.4 * MiB), 2_516_992, 4 * MiB, "large"),
]


@pytest.mark.parametrize("n,pt,sd,pool", Q1)
def test_quiz_q1_rounding_and_pool(n, pt, sd, pool):
    assert spec.round_size(n) == pt
    assert spec.round_size(n, seed_preset=True) == sd
    assert spec.choose_pool(pt) == pool and spec.choose_pool(sd) == pool
    for preset, want in (("pytorch", pt), ("seed", sd)):
        a = CachingAllocator(preset=preset, capacity=64 * MiB)
        b = a.malloc(n)
        assert b.size == want and b.requested_size == n
        key = "small_pool" if pool == "small" else "large_pool"
        assert a.memory_stats()[f"allocated_bytes.{key}.current"] == want


def _fragmented(preset: str, a_size: int, b_size: int, live: list | None = None) -> CachingAllocator:
    a = CachingAllocator(preset=preset, capacity=40 * MiB)
    A = []
    for _ in range(4):
        A.append(a.malloc(a_size))
        b = a.malloc(b_size)
        if live is not None:
            live.append(b)
    for x in A:
        a.free(x)
    return a


@pytest.mark.parametrize("preset,a_size,b_size", [("seed", 3 * MiB + 1, 5 * MiB + 1), ("pytorch", 4 * MiB, 6 * MiB)])
def test_quiz_q2_ten_mib_on_the_fragmented_state(preset, a_size, b_size):
    a = _fragmented(preset, a_size, b_size)
    layout = [[(b["size"] // MiB, b["state"]) for b in s["blocks"]] for s in a.segments()]
    assert layout == [[(4, "inactive"), (6, "active_allocated"), (4, "inactive"), (6, "active_allocated")]] * 2
    assert a.round_size(10 * MiB) == 10 * MiB  # (a)
    with pytest.raises(OutOfMemory) as e:  # (b) free 16 MiB >= 10 MiB, and it fails
        a.malloc(10 * MiB)
    assert e.value.reserved_unallocated == 16 * MiB and e.value.largest_free_block == 4 * MiB
    # pytorch asks the driver for a 10 MiB segment (>= kMinLargeAlloc), the toy for max(20 MiB, 10 MiB)
    assert e.value.requested == (20 * MiB if preset == "seed" else 10 * MiB)
    with pytest.raises(OutOfMemory):  # (c) 5 MiB does not fit a 4 MiB hole...
        a.malloc(5 * MiB)
    assert a.malloc(4 * MiB).size == 4 * MiB  # ...4 MiB does


def test_quiz_q2_answered_by_the_spec():
    st = spec.CACHING.init(policy="seed", capacity=40 * MiB, expandable=False)
    A = []
    for _ in range(4):
        A.append(spec_do(st, "malloc", size=3 * MiB + 1, stream=0)[0])
        spec_do(st, "malloc", size=5 * MiB + 1, stream=0)
    for r in A:
        spec_do(st, "free", ref=r)
    outs = spec.CACHING.action("malloc").step(st, size=10 * MiB, stream=0)
    first = outs.branches[0]
    assert isinstance(first, Raises) and first.error is OutOfMemory
    p = spec.predict_malloc(st, 10 * MiB, 0)
    assert p.oom["reserved_unallocated"] == 16 * MiB and p.oom["largest_free_block"] == 4 * MiB
    assert p.oom["requested"] == 20 * MiB
    assert spec.predict_malloc(st, 4 * MiB, 0).oom is None


# --------------------------------------------------------------------------
# test_cuda.py, re-expressed
# --------------------------------------------------------------------------

def test_memory_stats_allocate_free_empty_cache():
    a = CachingAllocator(preset="pytorch", capacity=64 * MiB)
    b = a.malloc(1000)
    s = a.memory_stats()
    assert s["allocation.all.current"] == 1 and s["allocation.small_pool.current"] == 1
    assert s["allocated_bytes.all.current"] == 1024 and s["requested_bytes.all.current"] == 1000
    assert s["reserved_bytes.all.current"] == 2 * MiB and s["segment.all.current"] == 1
    assert s["active_bytes.all.current"] == 1024 and s["inactive_split.all.current"] == 1
    assert s["inactive_split_bytes.all.current"] == 2 * MiB - 1024
    a.free(b)
    s = a.memory_stats()
    assert s["allocated_bytes.all.current"] == 0 and s["allocated_bytes.all.freed"] == 1024
    assert s["active_bytes.all.current"] == 0 and s["allocation.all.peak"] == 1
    assert s["inactive_split.all.current"] == 0 and s["reserved_bytes.all.current"] == 2 * MiB
    assert a.empty_cache() == 2 * MiB
    s = a.memory_stats()
    assert s["reserved_bytes.all.current"] == 0 and s["segment.all.freed"] == 1
    assert s["num_device_alloc"] == 1 and s["num_device_free"] == 1 and s["num_sync_all_streams"] == 1
    assert s["reserved_bytes.all.peak"] == 2 * MiB and s["max_split_size"] == -1


@pytest.mark.parametrize("n,segment,pool", [(512, 2 * MiB, "small_pool"), (MiB + 1, 20 * MiB, "large_pool"),
                                            (10 * MiB + 1, 12 * MiB, "large_pool")])
def test_segment_per_request_size(n, segment, pool):
    a = CachingAllocator(preset="pytorch", capacity=64 * MiB)
    a.malloc(n)
    s = a.memory_stats()
    assert s[f"reserved_bytes.{pool}.current"] == segment and s[f"segment.{pool}.current"] == 1


def test_one_exabyte_message():
    a = CachingAllocator(preset="pytorch", capacity=64 * MiB)
    with pytest.raises(OutOfMemory) as e:
        a.malloc(1 << 60)
    assert str(e.value) == "CUDA out of memory. Tried to allocate more than 1EB memory."
    outs = spec.CACHING.action("malloc").step(spec.CACHING.init(policy="pytorch", capacity=64 * MiB, expandable=False),
                                             size=1 << 60, stream=0)
    assert [type(b) for b in outs.branches] == [Raises]


def test_pytorch_oom_message_and_figures():
    dev = SimulatedDevice(40 * MiB, other_processes={4242: 8 * MiB})
    a = CachingAllocator(preset="pytorch", device=dev)
    keep = a.malloc(25 * MiB)
    with pytest.raises(OutOfMemory) as e:
        a.malloc(12 * MiB)
    err = e.value
    assert str(err).startswith("CUDA out of memory. Tried to allocate 12.00 MiB. GPU 0 has a total capacity of "
                               "40.00 MiB of which 6.00 MiB is free. Process 4242 has 8.00 MiB memory in use. "
                               "Of the allocated memory 26.00 MiB is allocated by PyTorch, and 0 bytes is reserved "
                               "by PyTorch but unallocated.")
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in str(err)
    assert (err.requested, err.free, err.allocated, err.reserved, err.reserved_unallocated) == (
        12 * MiB, 6 * MiB, 26 * MiB, 26 * MiB, 0)
    s = a.memory_stats()
    assert s["num_ooms"] == 1 and s["num_alloc_retries"] == 1
    # 25 MiB came from a 26 MiB segment whose 1 MiB remainder is not > 1 MiB: handed over whole
    assert keep.size == 26 * MiB and keep.requested_size == 25 * MiB


def test_max_split_size():
    a = CachingAllocator(preset="pytorch", capacity=80 * MiB, max_split_size=40 * MiB)
    big = a.malloc(60 * MiB)
    a.free(big)
    # a request below max_split_size is never served by a block at least that big;
    # the cached 60 MiB segment is released to make room (release_available_cached_blocks)
    small = a.malloc(30 * MiB)
    s = a.memory_stats()
    assert s["reserved_bytes.all.current"] == 30 * MiB and s["num_alloc_retries"] == 0
    assert s["oversize_segments.freed"] == 1 and s["max_split_size"] == 40 * MiB
    a.free(small)
    b = CachingAllocator(preset="pytorch", capacity=200 * MiB, max_split_size=40 * MiB)
    x = b.malloc(60 * MiB)
    b.free(x)
    y = b.malloc(50 * MiB)  # >= max_split: accepts a block up to request + 20 MiB, never split
    assert (y.address, y.size) == (x.address, 60 * MiB)
    assert b.memory_stats()["oversize_allocations.current"] == 1
    b.free(y)
    z = b.malloc(39 * MiB)  # below max_split: the 60 MiB block is refused, a new segment is made
    assert z.address != x.address and b.memory_reserved() == 100 * MiB


def _expandable_120(toggle: bool) -> None:
    a = CachingAllocator(preset="pytorch", capacity=1024 * MiB, max_split_size=40 * MiB, expandable_segments=True)
    a.set_per_process_memory_fraction(120 / 1024)
    blocks = []
    for i in range(3):
        if toggle:
            a.set_allocator_settings(expandable_segments=(i == 1))
        blocks.append(a.malloc(40 * MiB))
    with pytest.raises(OutOfMemory) as e:
        a.malloc(40 * MiB)
    assert "120.00 MiB allowed;" in str(e.value)
    for b in blocks:
        a.free(b)
    c = a.malloc(120 * MiB)
    assert c.size == 120 * MiB and a.memory_reserved() == 120 * MiB


def test_max_split_expandable_under_120_mib():
    _expandable_120(toggle=False)


def test_max_split_expandable_toggled_like_pytorch():
    _expandable_120(toggle=True)


def test_cross_stream_reuse_only_after_the_event():
    a = CachingAllocator(preset="pytorch", capacity=64 * MiB)
    x = a.malloc(MiB)
    a.record_stream(x, 1)
    a.free(x)
    states = [b["state"] for s in a.snapshot()["segments"] for b in s["blocks"]]
    assert states == ["active_pending_free", "inactive"]
    assert a.memory_stats()["allocated_bytes.all.current"] == 0
    assert a.memory_stats()["active_bytes.all.current"] == MiB
    y = a.malloc(MiB)
    z = a.malloc(MiB)
    assert x.address not in (y.address, z.address)
    a.complete_stream(1)
    w = a.malloc(MiB)
    assert w.address == x.address  # reused at the same address once the event completed


def test_empty_cache_releases_nothing_inside_partly_live_segments():
    live: list = []
    a = _fragmented("seed", 3 * MiB + 1, 5 * MiB + 1, live)
    assert a.empty_cache() == 0 and a.memory_reserved() == 40 * MiB
    for b in live:  # free everything and call it again: 40 MiB returns, and 8 MiB succeeds
        a.free(b)
    assert a.empty_cache() == 40 * MiB and a.memory_reserved() == 0
    assert a.malloc(8 * MiB).size == 8 * MiB


def test_bad_calls_are_refused():
    a = CachingAllocator(preset="pytorch", capacity=64 * MiB)
    other = CachingAllocator(preset="pytorch", capacity=64 * MiB)
    b = a.malloc(4096)
    for bad in (0, -1, 1.5, "10", True):
        with pytest.raises(InvalidRequest):
            a.malloc(bad)
    with pytest.raises(ForeignAllocation):
        other.free(b)
    addr = b.address
    a.free(b)
    with pytest.raises(DoubleFree):
        a.free(b)
    c = a.malloc(4096)  # the address is reused; the stale handle still is refused
    assert c.address == addr
    with pytest.raises(DoubleFree):
        a.free(b)
    a.free(c)
    with pytest.raises(InvalidRequest):
        CachingAllocator(preset="tensorflow", capacity=MiB)


def test_roundup_power2_divisions():
    assert spec.round_size(1200, divisions=4) == 1536  # 1200 <= 512 * 4: plain 512 rounding (PyTorch's guard)
    assert spec.round_size(5000, divisions=4) == 5120
    assert spec.round_size(4096, divisions=4) == 4096
    assert spec.round_size(3 * MiB + 1, divisions=4) == 3 * MiB + MiB // 2
    a = CachingAllocator(preset="pytorch", capacity=64 * MiB, roundup_power2_divisions=4)
    assert a.malloc(5000).size == 5120 and a.malloc(3 * MiB + 1).size == 3 * MiB + MiB // 2


def test_should_split_and_segment_size_kernels():
    assert spec.should_split(MiB + 512, 4 * MiB, small=False)
    assert not spec.should_split(MiB, 4 * MiB, small=False)  # strict > 1 MiB
    assert spec.should_split(512, 4 * MiB, small=False, expandable=True)
    assert not spec.should_split(MiB + 512, 50 * MiB, small=False, max_split_size=40 * MiB)
    assert not spec.should_split(MiB + 512, 4 * MiB, small=False, seed_preset=True)
    assert spec.should_split(2 * MiB, 4 * MiB, small=False, seed_preset=True)
    assert spec.should_split(512, 512, small=True) and not spec.should_split(0, 512, small=True)
    assert [spec.segment_size(n) for n in (512, MiB, MiB + 512, 10 * MiB - 512, 10 * MiB, 11 * MiB)] == [
        2 * MiB, 2 * MiB, 20 * MiB, 20 * MiB, 10 * MiB, 12 * MiB]
    assert spec.segment_size(22 * MiB, seed_preset=True) == 22 * MiB and spec.segment_size(4 * MiB, seed_preset=True) == 20 * MiB


def test_memory_summary_reads_requested_allocated_reserved():
    a = CachingAllocator(preset="seed", capacity=40 * MiB)
    a.malloc(3 * MiB + 1)
    text = a.memory_summary()
    lines = text.splitlines()
    order = [next(i for i, l in enumerate(lines) if l.startswith(f"| {k}")) for k in
             ("Requested memory", "Allocated memory", "GPU reserved memory")]
    assert order == sorted(order)
    assert "Ratio of allocated to requested memory |    1.333" in text
    assert "Segments 1" in text and "OOM events 0" in text


def test_garbage_collection_threshold_frees_old_cached_blocks():
    kw = dict(memory_fraction=0.8, garbage_collection_threshold=0.5)
    a = CachingAllocator(preset="pytorch", capacity=100 * MiB, **kw)
    st = spec.CACHING.init(policy="pytorch", capacity=100 * MiB, expandable=False, **kw)
    blocks, refs = [], []
    for n in (12 * MiB, 14 * MiB, 16 * MiB):
        blocks.append(a.malloc(n))
        refs.append(spec_do(st, "malloc", size=n, stream=0)[0])
    for b, r in zip(blocks[:2], refs[:2]):
        a.free(b)
        spec_do(st, "free", ref=r)
    assert a.memory_reserved() == 42 * MiB  # above the 40 MiB threshold (0.5 of 80 MiB allowed)
    a.malloc(30 * MiB)
    spec_do(st, "malloc", size=30 * MiB, stream=0)
    released = a.memory_stats()["num_device_free"]
    assert released >= 1 and a.memory_reserved() < 72 * MiB  # without GC: 42 + 30
    assert a.memory_reserved() == st.reserved()
