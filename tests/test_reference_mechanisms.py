"""Reference mechanisms and the simulated device: every contract error path
raises its named exception and leaves the device exactly as it was."""

from __future__ import annotations

import pytest

from memspec.spec.api import (
    AllocationRequest,
    DeviceAllocation,
    DeviceMemoryMechanism,
    Fence,
    Identity,
    KiB,
    MiB,
    ReserveRequest,
    SharedMapping,
    VirtualAllocation,
    VirtualBacking,
)
from memspec.spec.errors import (
    DeviceFault,
    DoubleFree,
    ForeignAllocation,
    InvalidRange,
    InvalidRequest,
    OutOfMemory,
    ReadOnlyViolation,
    StaleHandle,
)
from memspec.reference.device import RangeAllocator, SimDevice, WorkItem
from memspec.reference.ep import ReferenceEP
from memspec.reference.mechanism import eager_only, full, vmm_only

PAGE = 2 * MiB
PIB = 1 << 50
BAD_SIZES = [0, -1, -PAGE, 1.0, 2.5, True, False, "4096", None]


def state(dev: SimDevice) -> tuple:
    """Everything an error must leave unchanged."""
    return dev.pages_in_use(), dev.mapped_pages(), dev.touched_bytes(), len(dev._va._by_start), dev._va.free_bytes


@pytest.fixture
def dev() -> SimDevice:
    return SimDevice(64 * MiB)


# --------------------------------------------------------------------------
# the simulated device
# --------------------------------------------------------------------------

def test_device_pages_are_lazy_and_hold_real_bytes():
    big = SimDevice(24 << 30)        # 24 GiB costs nothing until touched
    assert big.npages == 24 << 30 >> 21 and big.touched_bytes() == 0
    mech = full(big)
    a = mech.allocator().allocate(AllocationRequest(3 * PAGE))
    assert big.physical_bytes() == 3 * PAGE and big.touched_bytes() == 0
    ep = ReferenceEP(big)
    ep.write(0, a.address + PAGE - 2, b"xyzw")    # straddles two pages
    assert big.touched_bytes() == 0                # not run yet: the clock has not moved
    assert ep.read(0, a.address + PAGE - 2, 4) == b"xyzw"
    assert big.touched_bytes() == 2 * PAGE


def test_device_small_page_selectable():
    d = SimDevice(1 * MiB, 64 * KiB)
    a = full(d).allocator().allocate(AllocationRequest(100))
    assert a.footprint == 64 * KiB and d.physical_bytes() == 64 * KiB


def test_device_fault_is_recorded_not_a_crash(dev):
    ep = ReferenceEP(dev)
    with pytest.raises(DeviceFault) as e:
        ep.write(0, 1 << 40, b"x")
    assert e.value.kind == "unmapped" and dev.faults[-1] is e.value
    # a kernel over an unmapped range faults when it runs, and the stream moves on
    f = ep.launch(0, [(1 << 40, 16)], [])
    assert not ep.fence_done(f)
    with pytest.raises(DeviceFault):
        ep.synchronize()
    assert ep.fence_done(f) and len(dev.faults) == 2


def test_fences_are_monotonic_and_the_clock_is_explicit(dev):
    a = full(dev).allocator().allocate(AllocationRequest(PAGE))
    ep = ReferenceEP(dev)
    s = ep.new_stream()
    fences = [ep.fill(s, a.address, 8, i) for i in range(1, 4)]
    assert [f.value for f in fences] == [1, 2, 3] and all(f.stream == s for f in fences)
    assert not any(map(ep.fence_done, fences))
    assert ep.advance(s, 2) == 2
    assert [ep.fence_done(f) for f in fences] == [True, True, False]
    assert dev.peek(a.address, 1) == b"\x02"
    ep.run_until(fences[2])
    assert dev.peek(a.address, 1) == b"\x03"
    with pytest.raises(InvalidRequest):
        ep.fence_done(Fence(s, 99))   # never issued


def test_range_allocator_best_fit_and_coalescing():
    r = RangeAllocator(0, 100 * PAGE, PAGE)
    a = r.alloc(10 * PAGE, PAGE)
    b = r.alloc(5 * PAGE, PAGE)
    c = r.alloc(20 * PAGE, PAGE)
    r.free(a, 10 * PAGE)           # hole of 10 pages at 0
    assert r.alloc(3 * PAGE, PAGE) == a    # best fit: the 10-page hole, not the tail
    r.free(a, 3 * PAGE)
    r.free(b, 5 * PAGE)
    r.free(c, 20 * PAGE)
    assert r.free_bytes == 100 * PAGE and len(r._by_start) == 1   # fully coalesced
    big = r.alloc(PAGE, 64 * PAGE)
    assert big % (64 * PAGE) == 0
    with pytest.raises(InvalidRange):
        r.free(big, PAGE) or r.free(big, PAGE)   # second free overlaps


# --------------------------------------------------------------------------
# eager allocator
# --------------------------------------------------------------------------

def test_capabilities_are_honest(dev):
    for m, vb, sm in ((full(dev), True, True), (eager_only(dev), False, False), (vmm_only(dev), True, False)):
        assert isinstance(m, DeviceMemoryMechanism)
        assert (m.virtual_backing() is not None) == vb and (m.shared_mapping() is not None) == sm
        if vb:
            assert isinstance(m.virtual_backing(), VirtualBacking)
        if sm:
            assert isinstance(m.shared_mapping(), SharedMapping)


def test_eager_allocate_takes_page_rounded_footprint(dev):
    al = full(dev).allocator()
    a = al.allocate(AllocationRequest(PAGE + 1))
    assert a.size == PAGE + 1 and a.footprint == 2 * PAGE and dev.physical_bytes() == 2 * PAGE
    assert dev.is_mapped(a.address) and dev.is_mapped(a.address + PAGE)
    assert al.deallocate(a) == 2 * PAGE and dev.physical_bytes() == 0 and not dev.is_mapped(a.address)


@pytest.mark.parametrize("size", BAD_SIZES)
def test_eager_bad_sizes(dev, size):
    al = full(dev).allocator()
    before = state(dev)
    with pytest.raises(InvalidRequest):
        al.allocate(AllocationRequest(size))
    assert state(dev) == before


@pytest.mark.parametrize("alignment", [0, 3, -4, 1.0, True, 3 * PAGE])
def test_eager_bad_alignment(dev, alignment):
    al = full(dev).allocator()
    before = state(dev)
    with pytest.raises(InvalidRequest):
        al.allocate(AllocationRequest(100, alignment))
    assert state(dev) == before


def test_eager_large_alignment_honoured(dev):
    a = full(dev).allocator().allocate(AllocationRequest(100, 16 * PAGE))
    assert a.address % (16 * PAGE) == 0


def test_eager_out_of_memory(dev):
    al = full(dev).allocator()
    before = state(dev)
    with pytest.raises(OutOfMemory) as e:
        al.allocate(AllocationRequest(PIB))
    assert e.value.requested == PIB and e.value.total_capacity == dev.capacity
    assert state(dev) == before
    keep = al.allocate(AllocationRequest(dev.capacity - PAGE))
    with pytest.raises(OutOfMemory):
        al.allocate(AllocationRequest(2 * PAGE))
    assert dev.physical_bytes() == dev.capacity - PAGE and al.deallocate(keep)


def test_eager_foreign_double_stale(dev):
    m, twin = full(dev), full(dev)
    al = m.allocator()
    a = al.allocate(AllocationRequest(100))
    f = twin.allocator().allocate(AllocationRequest(100))
    before = state(dev)
    with pytest.raises(ForeignAllocation):
        al.deallocate(f)
    assert state(dev) == before
    al.deallocate(a)
    b = al.allocate(AllocationRequest(100))
    assert b.address == a.address and b.identity != a.identity     # address reused, identity not
    before = state(dev)
    with pytest.raises(DoubleFree):
        al.deallocate(a)
    never = DeviceAllocation(b.address, 100, PAGE, Identity(al.creator, 10_000), dev.key)
    with pytest.raises(StaleHandle):
        al.deallocate(never)
    forged = DeviceAllocation(b.address + PAGE, 100, PAGE, b.identity, dev.key)
    with pytest.raises(StaleHandle):
        al.deallocate(forged)
    with pytest.raises(InvalidRequest):
        al.deallocate("not a handle")
    assert state(dev) == before and al.is_live(b)


# --------------------------------------------------------------------------
# VirtualBacking
# --------------------------------------------------------------------------

def test_reserve_takes_no_pages_and_commit_is_exact(dev):
    vb = full(dev).virtual_backing()
    va = vb.reserve(ReserveRequest(10 << 30))       # 10 GB of VA on a 64 MiB device
    assert va.size == 10 << 30 and dev.physical_bytes() == 0
    base = va.address
    assert vb.commit_range(va, 0, 4 * PAGE) == 4 * PAGE
    assert vb.commit_range(va, 6 * PAGE, 8 * PAGE) == 2 * PAGE
    assert vb.committed_bytes(va) == 6 * PAGE == dev.physical_bytes()
    assert vb.decommit_range(va, PAGE, 3 * PAGE) == 2 * PAGE
    assert vb.committed_bytes(va) == 4 * PAGE == dev.physical_bytes()
    assert not dev.is_mapped(base + PAGE) and dev.is_mapped(base) and va.address == base   # stable base
    assert vb.release(va) == 4 * PAGE and dev.physical_bytes() == 0 and dev.mapped_pages() == 0


def test_reserve_errors(dev):
    vb = full(dev).virtual_backing()
    before = state(dev)
    for size in BAD_SIZES:
        with pytest.raises(InvalidRequest):
            vb.reserve(ReserveRequest(size))
    with pytest.raises(InvalidRequest):
        vb.reserve(ReserveRequest(PAGE, 3))
    with pytest.raises(OutOfMemory):
        vb.reserve(ReserveRequest(PIB))      # more than the whole virtual address space
    assert state(dev) == before


@pytest.mark.parametrize("start,end", [
    (0, 0), (PAGE, 0), (-PAGE, PAGE), (1, PAGE), (0, PAGE + 1), (0, 5 * PAGE), (4 * PAGE, 6 * PAGE),
    (0.0, PAGE), (0, True),
])
def test_commit_bad_ranges(dev, start, end):
    vb = full(dev).virtual_backing()
    va = vb.reserve(ReserveRequest(4 * PAGE))
    vb.commit_range(va, 0, PAGE)
    before = state(dev)
    with pytest.raises(InvalidRange):
        vb.commit_range(va, start, end)
    assert state(dev) == before and vb.committed_bytes(va) == PAGE


def test_commit_already_committed_and_decommit_uncommitted(dev):
    vb = full(dev).virtual_backing()
    va = vb.reserve(ReserveRequest(4 * PAGE))
    vb.commit_range(va, PAGE, 2 * PAGE)
    before = state(dev)
    with pytest.raises(InvalidRange):
        vb.commit_range(va, 0, 2 * PAGE)    # page 1 already backed: nothing of page 0 may stay
    with pytest.raises(InvalidRange):
        vb.decommit_range(va, 0, 2 * PAGE)  # page 0 not committed
    assert state(dev) == before and vb.committed_bytes(va) == PAGE


def test_commit_out_of_memory_leaves_nothing(dev):
    vb = full(dev).virtual_backing()
    va = vb.reserve(ReserveRequest(1 << 30))
    before = state(dev)
    with pytest.raises(OutOfMemory):
        vb.commit_range(va, 0, dev.capacity + PAGE)
    assert state(dev) == before and vb.committed_bytes(va) == 0


def test_reservation_foreign_stale_double(dev):
    m, twin = full(dev), full(dev)
    vb = m.virtual_backing()
    va = vb.reserve(ReserveRequest(2 * PAGE))
    other = twin.virtual_backing().reserve(ReserveRequest(2 * PAGE))
    with pytest.raises(ForeignAllocation):
        vb.commit_range(other, 0, PAGE)
    vb.release(va)
    va2 = vb.reserve(ReserveRequest(2 * PAGE))
    assert va2.address == va.address           # address reused
    before = state(dev)
    with pytest.raises(StaleHandle):
        vb.commit_range(va, 0, PAGE)
    with pytest.raises(StaleHandle):
        vb.committed_bytes(va)
    with pytest.raises(DoubleFree):
        vb.release(va)
    with pytest.raises(StaleHandle):
        vb.commit_range(VirtualAllocation(va2.address, va2.size, Identity(va2.identity.creator, 999), dev.key), 0, PAGE)
    assert state(dev) == before and vb.committed_bytes(va2) == 0


# --------------------------------------------------------------------------
# SharedMapping
# --------------------------------------------------------------------------

def test_shared_pages_counted_once_and_freed_after_last_unmap_and_release(dev):
    m = full(dev)
    sm, vb = m.shared_mapping(), m.virtual_backing()
    h = sm.create(2 * PAGE)
    a = vb.reserve(ReserveRequest(4 * PAGE))      # either capability's reservations are accepted
    b = sm.reserve(ReserveRequest(4 * PAGE))
    assert sm.map(h, a, 0, read_only=False) == 2 * PAGE
    assert sm.map(h, b, 2 * PAGE, read_only=True) == 2 * PAGE
    assert sm.mapping_count(h) == 2 and dev.physical_bytes() == 2 * PAGE    # counted once
    ep = ReferenceEP(dev)
    ep.write(0, a.address + 5, b"prompt")
    assert ep.read(0, b.address + 2 * PAGE + 5, 6) == b"prompt"           # one physical page, two VAs
    assert sm.release(h) == 0 and dev.physical_bytes() == 2 * PAGE       # still mapped
    with pytest.raises(StaleHandle):
        sm.map(h, a, 2 * PAGE, read_only=True)                          # released: no new mapping
    assert sm.unmap(a, 0, 2 * PAGE) == 2 * PAGE and sm.mapping_count(h) == 1 and dev.physical_bytes() == 2 * PAGE
    assert sm.unmap(b, 2 * PAGE, 2 * PAGE) == 2 * PAGE
    assert dev.physical_bytes() == 0
    with pytest.raises((StaleHandle, DoubleFree)):
        sm.release(h)
    with pytest.raises(StaleHandle):
        sm.mapping_count(h)
    sm.free_reservation(b)
    with pytest.raises(DoubleFree):
        sm.free_reservation(b)


def test_read_only_mapping_rejects_writes(dev):
    m = full(dev)
    sm = m.shared_mapping()
    h = sm.create(PAGE)
    va = sm.reserve(ReserveRequest(PAGE))
    sm.map(h, va, 0, read_only=True)
    ep = ReferenceEP(dev)
    before = state(dev)
    with pytest.raises(ReadOnlyViolation):
        ep.write(0, va.address, b"x")                  # a host copy is refused when enqueued
    assert dev.faults[-1].kind == "read_only"
    f = ep.launch(0, [], [(va.address, 8)])             # a kernel store faults when it runs
    with pytest.raises(DeviceFault) as e:
        ep.run_until(f)
    assert e.value.kind == "read_only" and dev.peek(va.address, 8) == bytes(8)
    assert state(dev) == before


def test_shared_map_unmap_errors(dev):
    m = full(dev)
    sm = m.shared_mapping()
    h = sm.create(2 * PAGE)
    va = sm.reserve(ReserveRequest(4 * PAGE))
    sm.map(h, va, 0, read_only=True)
    twin = full(dev).shared_mapping()
    before = state(dev)
    for off in (PAGE, 3 * PAGE, PAGE // 2, -PAGE):
        with pytest.raises(InvalidRange):
            sm.map(h, va, off, read_only=True)       # overlap, past the end, misaligned, negative
    with pytest.raises(InvalidRange):
        sm.unmap(va, 0, PAGE)                         # cuts the mapping in part
    with pytest.raises(InvalidRange):
        sm.unmap(va, 0, 3 * PAGE)                     # a page that is not a mapping
    with pytest.raises(InvalidRange):
        sm.free_reservation(va)                       # still mapped
    for size in (0, PAGE + 1, -PAGE, 1.5):
        with pytest.raises(InvalidRequest):
            sm.create(size)
    with pytest.raises(OutOfMemory):
        sm.create(dev.capacity)
    with pytest.raises(ForeignAllocation):
        twin.mapping_count(h)
    assert state(dev) == before and sm.mapping_count(h) == 1


def test_copy_on_write_makes_private_copies(dev):
    m = full(dev)
    sm, vb = m.shared_mapping(), m.virtual_backing()
    h = sm.create(2 * PAGE)
    a = vb.reserve(ReserveRequest(2 * PAGE))
    b = vb.reserve(ReserveRequest(2 * PAGE))
    sm.map(h, a, 0, read_only=True)
    sm.map(h, b, 0, read_only=True)
    ep = ReferenceEP(dev)
    dev._write(a.address, b"shared!")     # seed the shared page directly (both mappings are read-only)
    assert sm.copy_on_write(b, 0, 2 * PAGE) == 2 * PAGE
    assert sm.mapping_count(h) == 1 and dev.physical_bytes() == 4 * PAGE
    assert vb.committed_bytes(b) == 2 * PAGE
    ep.write(0, b.address, b"PRIVATE")              # now writable
    assert ep.read(0, b.address, 7) == b"PRIVATE" and ep.read(0, a.address, 7) == b"shared!"
    with pytest.raises(InvalidRange):
        sm.copy_on_write(b, 0, 2 * PAGE)            # already private
    assert sm.unmap(b, 0, 2 * PAGE) == 2 * PAGE     # the copies go with the mapping
    sm.release(h)
    sm.unmap(a, 0, 2 * PAGE)
    assert dev.physical_bytes() == 0


def test_release_reservation_drops_its_mappings(dev):
    m = full(dev)
    sm, vb = m.shared_mapping(), m.virtual_backing()
    h = sm.create(PAGE)
    va = vb.reserve(ReserveRequest(3 * PAGE))
    sm.map(h, va, 0, read_only=True)
    vb.commit_range(va, PAGE, 3 * PAGE)
    sm.release(h)
    assert dev.physical_bytes() == 3 * PAGE
    assert vb.release(va) == 3 * PAGE and dev.physical_bytes() == 0 and dev.mapped_pages() == 0


def test_work_item_checks_every_page_before_moving_bytes(dev):
    m = full(dev)
    a = m.allocator().allocate(AllocationRequest(PAGE))
    item = WorkItem("write", writes=((a.address + PAGE - 2, 4),), data=b"abcd")   # second page unmapped
    f = dev.enqueue(0 if 0 in dev._streams else dev.new_stream(), item)
    with pytest.raises(DeviceFault):
        dev.run_until(f)
    assert dev.peek(a.address + PAGE - 2, 2) == b"\x00\x00"     # nothing of it was applied


def test_unmap_and_copy_on_write_take_exactly_one_mapping(dev):
    m = full(dev)
    sm = m.shared_mapping()
    h1, h2 = sm.create(PAGE), sm.create(PAGE)
    va = sm.reserve(ReserveRequest(4 * PAGE))
    sm.map(h1, va, 0, read_only=True)
    sm.map(h2, va, PAGE, read_only=True)             # adjacent
    before = state(dev)
    with pytest.raises(InvalidRange):
        sm.unmap(va, 0, 2 * PAGE)                     # two mappings at once
    with pytest.raises(InvalidRange):
        sm.copy_on_write(va, 0, 2 * PAGE)
    assert state(dev) == before and sm.mapping_count(h1) == sm.mapping_count(h2) == 1
    assert sm.unmap(va, PAGE, PAGE) == PAGE and sm.mapping_count(h2) == 0
