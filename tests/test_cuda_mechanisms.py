"""The CUDA mechanisms on the host driver emulator: the seed 000 contract,
transactional rollback, and the creation-handle release (physical back to
baseline after free)."""

from __future__ import annotations

import pytest
from cuda.bindings import driver as cu

from memspec.cuda_impl.driver import CudaError, open_driver
from memspec.cuda_impl.hostdrv import FailureInjector
from memspec.cuda_impl.mechanism import CudaMechanism
from memspec.cuda_impl.targets import cuda_host
from memspec.spec.api import (
    AllocationRequest,
    DeviceAllocator,
    DeviceMemoryMechanism,
    ReserveRequest,
    SharedMapping,
    VirtualBacking,
)
from memspec.spec.errors import (
    ContextBusy,
    DoubleFree,
    ForeignAllocation,
    InvalidRange,
    InvalidRequest,
    OutOfMemory,
    StaleHandle,
)

G = 2 << 20


@pytest.fixture
def t():
    inst = cuda_host(16 * G)
    yield inst
    inst.close()


def emu(t):
    return t.extras["emulator"]


def test_capabilities_are_honest():
    drv = open_driver("host", capacity=4 * G)
    m = CudaMechanism(drv)
    assert isinstance(m, DeviceMemoryMechanism)
    assert isinstance(m.allocator(), DeviceAllocator)
    assert isinstance(m.virtual_backing(), VirtualBacking)
    assert isinstance(m.shared_mapping(), SharedMapping)
    eager_only = CudaMechanism(drv, m.ctx, vmm=False)
    assert eager_only.virtual_backing() is None and eager_only.shared_mapping() is None
    assert eager_only.name.endswith("eager")


# -- VirtualBacking ---------------------------------------------------------------

def test_reserve_commit_decommit_release(t):
    vb = t.mechanism.virtual_backing()
    assert vb.granularity() == G
    va = vb.reserve(ReserveRequest(5 * G + 1))
    assert va.size == 6 * G and va.address % G == 0
    assert t.physical_bytes() == 0                         # reserve takes no physical bytes
    assert vb.commit_range(va, G, 4 * G) == 3 * G
    assert vb.committed_bytes(va) == 3 * G and t.physical_bytes() == 3 * G
    assert vb.decommit_range(va, 2 * G, 3 * G) == G
    assert vb.committed_bytes(va) == 2 * G and t.physical_bytes() == 2 * G
    assert vb.commit_range(va, 2 * G, 3 * G) == G        # the hole can be refilled
    assert vb.release(va) == 3 * G
    assert t.physical_bytes() == 0 and emu(t).reservations() == 0


def test_commit_keeps_the_address_and_the_bytes(t):
    vb, ep = t.mechanism.virtual_backing(), t.ep
    va = vb.reserve(ReserveRequest(4 * G))
    vb.commit_range(va, 0, G)
    ep.write(0, va.address + 10, b"kv-prefix")
    vb.commit_range(va, G, 3 * G)                          # growth: same base address
    assert ep.read(0, va.address + 10, 9) == b"kv-prefix"
    ep.write(0, va.address + 2 * G, b"grown")
    assert ep.read(0, va.address + 2 * G, 5) == b"grown"
    vb.release(va)


@pytest.mark.parametrize("start,end", [(0, 0), (G, 0), (1, G), (0, G + 1), (0, 5 * G), (-G, G)])
def test_bad_ranges_are_invalid_range(t, start, end):
    vb = t.mechanism.virtual_backing()
    va = vb.reserve(ReserveRequest(4 * G))
    with pytest.raises(InvalidRange):
        vb.commit_range(va, start, end)
    with pytest.raises(InvalidRange):
        vb.decommit_range(va, start, end)
    assert vb.committed_bytes(va) == 0 and t.physical_bytes() == 0


def test_commit_over_committed_and_decommit_of_uncommitted(t):
    vb = t.mechanism.virtual_backing()
    va = vb.reserve(ReserveRequest(4 * G))
    vb.commit_range(va, G, 2 * G)
    with pytest.raises(InvalidRange):
        vb.commit_range(va, 0, 2 * G)
    with pytest.raises(InvalidRange):
        vb.decommit_range(va, G, 3 * G)
    assert vb.committed_bytes(va) == G and t.physical_bytes() == G


@pytest.mark.parametrize("size", [0, -1, 2.5, True, "1"])
def test_bad_reserve_sizes(t, size):
    with pytest.raises(InvalidRequest):
        t.mechanism.virtual_backing().reserve(ReserveRequest(size))


def test_foreign_stale_and_double_release(t):
    vb = t.mechanism.virtual_backing()
    other = t.extras["make_foreign"]().virtual_backing()
    theirs = other.reserve(ReserveRequest(2 * G))
    with pytest.raises(ForeignAllocation):
        vb.commit_range(theirs, 0, G)
    with pytest.raises(ForeignAllocation):
        vb.release(theirs)
    va = vb.reserve(ReserveRequest(2 * G))
    vb.release(va)
    with pytest.raises(StaleHandle):
        vb.commit_range(va, 0, G)
    with pytest.raises(StaleHandle):
        vb.committed_bytes(va)
    with pytest.raises(DoubleFree):
        vb.release(va)
    other.release(theirs)


def test_commit_oom_is_out_of_memory_and_rolls_back(t):
    vb = t.mechanism.virtual_backing()
    va = vb.reserve(ReserveRequest(32 * G))
    vb.commit_range(va, 0, 10 * G)
    with pytest.raises(OutOfMemory) as e:
        vb.commit_range(va, 10 * G, 20 * G)                # 6 granules fit, the 7th does not
    assert e.value.requested == 10 * G and e.value.total_capacity == 16 * G
    assert vb.committed_bytes(va) == 10 * G
    assert t.physical_bytes() == 10 * G                    # nothing of the failed commit stays
    assert emu(t).mapped_pages() == 10 and emu(t).live_handles() == 10


@pytest.mark.parametrize("call,after", [("cuMemCreate", 2), ("cuMemMap", 3), ("cuMemRelease", 1), ("cuMemSetAccess", 0)])
def test_commit_is_transactional_under_injected_failures(t, call, after):
    drv = t.extras["driver"]
    vb = t.mechanism.virtual_backing()
    va = vb.reserve(ReserveRequest(8 * G))
    inj = FailureInjector(drv.backend)
    drv.backend = inj
    inj.fail(call, cu.CUresult.CUDA_ERROR_UNKNOWN, after=after)
    with pytest.raises(CudaError) as e:
        vb.commit_range(va, 0, 6 * G)
    assert e.value.name == "CUDA_ERROR_UNKNOWN" and inj.injected == [call]
    assert vb.committed_bytes(va) == 0
    assert emu(t).mapped_pages() == 0 and emu(t).live_handles() == 0 and t.physical_bytes() == 0
    assert vb.commit_range(va, 0, 6 * G) == 6 * G          # and the range is usable afterwards


def test_creation_handle_released_physical_back_to_baseline(t):
    """The cuda.core leak: 8 commit/release cycles leave nothing behind."""
    vb = t.mechanism.virtual_backing()
    for _ in range(8):
        va = vb.reserve(ReserveRequest(8 * G))
        vb.commit_range(va, 0, 8 * G)
        assert emu(t).live_handles() == 8                  # one handle per page, held by its mapping only
        vb.release(va)
        assert t.physical_bytes() == 0 and emu(t).live_handles() == 0


def test_leak_mutant_is_visible_in_physical_bytes():
    """The planted bug keeps the creation reference: the mechanism believes it
    freed the pages, cuMemGetInfo shows they stayed, and later commits OOM."""
    from memspec.invariants.mutants.cuda_bugs import leaky_cuda_host

    bad = leaky_cuda_host(8 * G)
    try:
        vb = bad.mechanism.virtual_backing()
        va = vb.reserve(ReserveRequest(4 * G))
        assert vb.commit_range(va, 0, 4 * G) == 4 * G
        assert vb.release(va) == 4 * G                     # its own answer is "freed"
        assert bad.physical_bytes() == 4 * G               # the device disagrees
        va2 = vb.reserve(ReserveRequest(8 * G))
        with pytest.raises(OutOfMemory):
            vb.commit_range(va2, 0, 8 * G)                 # an empty-looking device is full
    finally:
        bad.close()


# -- SharedMapping -----------------------------------------------------------------

def test_shared_pages_charged_once_and_freed_after_last_unmap(t):
    sm, ep = t.mechanism.shared_mapping(), t.ep
    h = sm.create(2 * G)
    a, b = sm.reserve(ReserveRequest(4 * G)), sm.reserve(ReserveRequest(4 * G))
    assert sm.map(h, a, 0, read_only=True) == 2 * G
    assert sm.map(h, b, 2 * G, read_only=False) == 2 * G
    assert sm.mapping_count(h) == 2 and t.physical_bytes() == 2 * G   # charged once
    ep.write(0, b.address + 2 * G + 7, b"prompt")
    assert ep.read(0, a.address + 7, 6) == b"prompt"                  # one physical page, two VAs
    assert sm.release(h) == 0                                         # still mapped
    with pytest.raises(StaleHandle):
        sm.map(h, a, 2 * G, read_only=True)
    with pytest.raises(DoubleFree):
        sm.release(h)
    assert sm.unmap(a, 0, 2 * G) == 2 * G
    assert sm.mapping_count(h) == 1 and t.physical_bytes() == 2 * G
    assert sm.unmap(b, 2 * G, 2 * G) == 2 * G
    assert t.physical_bytes() == 0
    with pytest.raises(StaleHandle):
        sm.mapping_count(h)
    sm.free_reservation(a)
    sm.free_reservation(b)
    with pytest.raises(DoubleFree):
        sm.free_reservation(a)


def test_release_unmapped_handle_frees_now(t):
    sm = t.mechanism.shared_mapping()
    h = sm.create(G)
    assert t.physical_bytes() == G
    assert sm.release(h) == G and t.physical_bytes() == 0


def test_shared_errors(t):
    sm = t.mechanism.shared_mapping()
    for bad in (0, -G, G + 1, 1.0):
        with pytest.raises(InvalidRequest):
            sm.create(bad)
    h = sm.create(2 * G)
    r = sm.reserve(ReserveRequest(3 * G))
    with pytest.raises(InvalidRange):
        sm.map(h, r, G // 2, read_only=True)               # misaligned
    with pytest.raises(InvalidRange):
        sm.map(h, r, 2 * G, read_only=True)                # past the end
    sm.map(h, r, 0, read_only=True)
    with pytest.raises(InvalidRange):
        sm.map(h, r, G, read_only=True)                    # overlaps a backed page
    with pytest.raises(InvalidRange):
        sm.unmap(r, 0, 3 * G)                              # not exactly one mapping
    with pytest.raises(InvalidRange):
        sm.free_reservation(r)                             # still mapped
    other = t.extras["make_foreign"]().shared_mapping()
    with pytest.raises(ForeignAllocation):
        other.map(h, other.reserve(ReserveRequest(2 * G)), 0, read_only=True)
    with pytest.raises(OutOfMemory):
        sm.create(16 * G)
    assert t.physical_bytes() == 2 * G


def test_copy_on_write(t):
    sm, ep = t.mechanism.shared_mapping(), t.ep
    h = sm.create(2 * G)
    a, b = sm.reserve(ReserveRequest(2 * G)), sm.reserve(ReserveRequest(2 * G))
    sm.map(h, a, 0, read_only=False)
    sm.map(h, b, 0, read_only=True)
    ep.write(0, a.address + G + 3, b"system prompt")
    ep.synchronize(0)      # the copy is ordered after completed work only (the mechanism has no fences)
    assert sm.copy_on_write(b, 0, 2 * G) == 2 * G
    assert t.physical_bytes() == 4 * G and sm.mapping_count(h) == 1
    assert ep.read(0, b.address + G + 3, 13) == b"system prompt"     # same bytes
    ep.write(0, b.address + G + 3, b"SYSTEM")                        # now private and writable
    assert ep.read(0, a.address + G + 3, 6) == b"system"             # the shared page is untouched
    with pytest.raises(InvalidRange):
        sm.copy_on_write(b, 0, 2 * G)                                 # private already
    with pytest.raises(InvalidRange):
        sm.copy_on_write(a, 0, G)                                     # not exactly one mapping
    assert sm.unmap(b, 0, 2 * G) == 2 * G                             # frees the private copies
    assert t.physical_bytes() == 2 * G
    sm.release(h)
    sm.unmap(a, 0, 2 * G)
    assert t.physical_bytes() == 0 and emu(t).live_handles() == 0


def test_copy_on_write_rolls_back_on_oom():
    inst = cuda_host(5 * G)
    try:
        sm = inst.mechanism.shared_mapping()
        h = sm.create(2 * G)
        a = sm.reserve(ReserveRequest(2 * G))
        sm.map(h, a, 0, read_only=True)
        sm.create(2 * G)                                   # 4 of 5 granules used
        before = (inst.physical_bytes(), inst.extras["emulator"].mapped_pages(), inst.extras["emulator"].reservations())
        with pytest.raises(OutOfMemory):
            sm.copy_on_write(a, 0, 2 * G)
        assert (inst.physical_bytes(), inst.extras["emulator"].mapped_pages(), inst.extras["emulator"].reservations()) == before
        assert sm.mapping_count(h) == 1
    finally:
        inst.close()


def test_shared_map_is_transactional(t):
    drv = t.extras["driver"]
    sm = t.mechanism.shared_mapping()
    h = sm.create(2 * G)
    r = sm.reserve(ReserveRequest(2 * G))
    inj = FailureInjector(drv.backend)
    drv.backend = inj
    inj.fail("cuMemSetAccess")
    with pytest.raises(CudaError):
        sm.map(h, r, 0, read_only=True)
    assert emu(t).mapped_pages() == 0 and sm.mapping_count(h) == 0
    assert sm.map(h, r, 0, read_only=True) == 2 * G


# -- eager allocator ------------------------------------------------------------------

def test_eager_allocate_and_free(t):
    alloc = t.mechanism.allocator()
    a = alloc.allocate(AllocationRequest(1000))
    assert a.size == 1000 and a.footprint == G and a.address % 256 == 0
    assert t.physical_bytes() == G
    big = alloc.allocate(AllocationRequest(G, alignment=8 * G))
    assert big.address % (8 * G) == 0 and big.footprint >= G
    t.ep.write(0, a.address, b"eager")
    assert t.ep.read(0, a.address, 5) == b"eager"
    assert alloc.deallocate(a) == G
    with pytest.raises(DoubleFree):
        alloc.deallocate(a)
    alloc.deallocate(big)
    assert t.physical_bytes() == 0


def test_eager_errors(t):
    alloc = t.mechanism.allocator()
    for bad in (0, -5, 1.5, None):
        with pytest.raises(InvalidRequest):
            alloc.allocate(AllocationRequest(bad))
    with pytest.raises(InvalidRequest):
        alloc.allocate(AllocationRequest(16, alignment=3))
    with pytest.raises(OutOfMemory):
        alloc.allocate(AllocationRequest(1 << 50))
    theirs = t.extras["make_foreign"]().allocator().allocate(AllocationRequest(16))
    with pytest.raises(ForeignAllocation):
        alloc.deallocate(theirs)
    assert t.physical_bytes() == G


def test_mechanism_pins_the_context_while_anything_lives():
    drv = open_driver("host", capacity=8 * G)
    m = CudaMechanism(drv)
    e = drv.emulator
    a = m.allocator().allocate(AllocationRequest(10))
    va = m.virtual_backing().reserve(ReserveRequest(G))
    with pytest.raises(ContextBusy):
        m.close()
    assert e.primary_ctx_refcount(0) == 1
    m.allocator().deallocate(a)
    m.virtual_backing().release(va)
    m.close()
    assert e.primary_ctx_refcount(0) == 0


def test_extra_mechanism_is_eager_only_and_reachable_by_the_ep(t):
    extra = t.extras["make_extra_mechanism"]()
    assert extra.virtual_backing() is None and extra.shared_mapping() is None
    a = extra.allocator().allocate(AllocationRequest(64))
    t.ep.write(0, a.address, b"extra")
    assert t.ep.read(0, a.address, 5) == b"extra"
    with pytest.raises(ForeignAllocation):
        t.mechanism.allocator().deallocate(a)
    assert extra.allocator().deallocate(a) == G
