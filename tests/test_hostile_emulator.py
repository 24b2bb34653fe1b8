"""Hostile sizes for the host driver emulator: every size is bounded against
the host's address space before any system call (ctypes would pass
``size_t`` modulo 2**64), answers a CUresult, and leaks no context pin;
the EP's host memory stays bounded however many bytes kernels touch."""

from __future__ import annotations

import ctypes

import pytest
from cuda.bindings import driver as cu

from memspec.cuda_impl import ep as cuda_ep
from memspec.cuda_impl.hostdrv import HOST_VA_LIMIT, HostDriver
from memspec.cuda_impl.targets import cuda_host
from memspec.spec.api import ReserveRequest
from memspec.spec.errors import DeviceFault, InvalidRequest, OutOfMemory

R = cu.CUresult
OK = R.CUDA_SUCCESS
INVALID = R.CUDA_ERROR_INVALID_VALUE
OOM = R.CUDA_ERROR_OUT_OF_MEMORY
G = 2 << 20


@pytest.fixture
def d():
    drv = HostDriver(capacity=16 * G)
    assert drv.cuInit(0) == (OK,)
    _, dev = drv.cuDeviceGet(0)
    res, ctx = drv.cuDevicePrimaryCtxRetain(dev)
    assert res == OK and drv.cuCtxSetCurrent(ctx) == (OK,)
    return drv


def prop():
    p = cu.CUmemAllocationProp()
    p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p.location.id = 0
    return p


@pytest.mark.parametrize("size,alignment,want", [
    (2 ** 64, 0, OOM),                 # wrapped to 2 MiB by c_size_t before the fix
    (2 ** 64 - G, 0, OOM),             # size + align wraps to 0
    (2 ** 64 - G, G, OOM),
    (HOST_VA_LIMIT, 0, OOM),           # size + align just past the host
    (2 ** 70, 0, OOM),
    (-G, 0, INVALID),
    (G, -G, INVALID),
    (G, 2 ** 64, INVALID),
    ("x", 0, INVALID),
])
def test_address_reserve_sizes_are_bounded_before_mmap(d, size, alignment, want):
    before = dict(d._reservations)
    out = d.cuMemAddressReserve(size, alignment, 0, 0)
    assert out[0] == want
    assert dict(d._reservations) == before       # nothing reserved


@pytest.mark.parametrize("call,args,want", [
    ("cuMemCreate", (2 ** 64, "prop", 0), OOM),
    ("cuMemCreate", (-G, "prop", 0), INVALID),
    ("cuMemAlloc", (2 ** 64,), OOM),
    ("cuMemAlloc", (-1,), INVALID),
    ("cuMemAlloc", (2 ** 64 + 1,), OOM),
    ("cuMemHostAlloc", (2 ** 64, 0), OOM),
    ("cuMemHostAlloc", (-5, 0), INVALID),
    ("cuMemHostAlloc", (HOST_VA_LIMIT, 0), OOM),   # ctypes cannot make it: an error, not an exception
])
def test_allocation_sizes_are_bounded(d, call, args, want):
    args = tuple(prop() if a == "prop" else a for a in args)
    used = d.used
    out = getattr(d, call)(*args)
    assert out[0] == want
    assert d.used == used


def test_copies_with_wrapped_counts_or_wild_host_pointers_are_refused(d):
    ok, base = d.cuMemAlloc(G)
    assert ok == OK
    _, s = d.cuStreamCreate(0)
    _, host = d.cuMemHostAlloc(64, 0)
    for n in (2 ** 64, 2 ** 64 + 8, -1):
        assert d.cuMemcpyHtoDAsync(base, host, n, s)[0] == INVALID
        assert d.cuMemcpyDtoHAsync(host, base, n, s)[0] == INVALID
        assert d.cuMemsetD8Async(base, 1, n, s)[0] == INVALID
    victim = ctypes.create_string_buffer(b"keep", 64)        # memory the process owns, not pinned
    assert d.cuMemcpyDtoHAsync(ctypes.addressof(victim), base, 64, s)[0] == INVALID
    assert d.cuMemcpyDtoHAsync(host, base, 128, s)[0] == INVALID   # past the pinned block
    assert d.cuStreamSynchronize(s) == (OK,)
    assert victim.value == b"keep"


def test_map_and_access_sizes_are_bounded(d):
    ok, va = d.cuMemAddressReserve(4 * G, 0, 0, 0)
    _, h = d.cuMemCreate(G, prop(), 0)
    assert d.cuMemMap(va, 2 ** 64 + G, 0, h, 0)[0] == INVALID
    assert d.cuMemMap(va, G, 2 ** 64, h, 0)[0] == INVALID
    assert d.cuMemMap(va, G, -G, h, 0)[0] == INVALID
    assert d.cuMemUnmap(va, 2 ** 64 + G)[0] == INVALID
    assert d.cuMemAddressFree(va, 2 ** 64 + 4 * G)[0] == INVALID
    assert d.cuMemAddressFree(va, 4 * G) == (OK,)


def test_huge_reservation_through_the_target_is_oom_and_leaks_no_pin():
    inst = cuda_host(8 * G)
    try:
        vb, ep, emu = inst.mechanism.virtual_backing(), inst.ep, inst.extras["emulator"]
        pins = ep.ctx.pins
        for size in (2 ** 64, 2 ** 64 - G, 2 ** 63, HOST_VA_LIMIT):
            with pytest.raises(OutOfMemory):
                vb.reserve(ReserveRequest(size))
        assert ep.ctx.pins == pins and inst.physical_bytes() == 0
        va = vb.reserve(ReserveRequest(2 * G))      # the emulator still works and owns only what it made
        vb.commit_range(va, 0, 2 * G)
        f = ep.write(0, va.address, b"abc")
        ep.synchronize(0)
        assert ep.fence_done(f) and ep.read(0, va.address, 3) == b"abc"
        assert vb.release(va) == 2 * G
        assert ep.ctx.pins == pins
    finally:
        inst.close()
    assert emu.primary_ctx_refcount(0) == 0


def test_kernels_over_large_ranges_hold_bounded_host_memory():
    """Before: every kernel staged its full read/write ranges in pinned memory
    until its fence was observed (an 8-minute fuzz peaked at 8.5 GB RSS)."""
    inst = cuda_host(64 * G)
    try:
        vb, ep, emu = inst.mechanism.virtual_backing(), inst.ep, inst.extras["emulator"]
        va = vb.reserve(ReserveRequest(32 * G))
        vb.commit_range(va, 0, 32 * G)
        s = ep.new_stream()
        for _ in range(20):                       # 20 kernels x 64 MiB read + 64 MiB write, none observed
            ep.launch(s, [(va.address, 32 * G)], [(va.address, 32 * G)])
        pinned = sum(b.size for b in emu._host.values())
        assert pinned <= cuda_ep.KERNEL_SCRATCH + 4096   # one small scratch per stream (+ nothing per kernel)
        for i in range(40):                       # small writes are staged, and bounded per stream
            ep.write(s, va.address + i, b"x" * (G // 2))
        assert sum(b.size for b in emu._host.values()) <= cuda_ep.KERNEL_SCRATCH + cuda_ep.STAGED_CAP + G
        ep.synchronize(s)
        assert ep.read(s, va.address, 4) == b"xxxx"
        vb.release(va)
    finally:
        inst.close()
    assert emu._host == {} or len(emu._host) == 0


def test_wrong_types_reach_no_system_call(d):
    assert d.cuMemAlloc(1.5)[0] == INVALID
    assert d.cuMemAlloc(True)[0] == INVALID
    assert d.cuMemHostAlloc(None, 0)[0] == INVALID
    inst = cuda_host(4 * G)
    try:
        with pytest.raises(DeviceFault):
            inst.ep.read(0, 0, 2 ** 64)   # unmapped: a fault, and no 2**64-byte host buffer was asked for
        with pytest.raises(InvalidRequest):
            inst.ep.read(0, 0, 2.5)
    finally:
        inst.close()


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0])


def test_kernels_do_not_make_unwritten_device_memory_resident():
    """On the emulator device memory is host memory (memfd pages): a kernel
    that copied its whole ranges made every page of them resident (the 5-minute
    cuda-host fuzz then peaked at 1.2 GB RSS with a 1 GiB device).  The stand-in
    kernel touches one byte per mapping page, and still faults per page."""
    inst = cuda_host(512 * G)
    try:
        vb, ep = inst.mechanism.virtual_backing(), inst.ep
        va = vb.reserve(ReserveRequest(256 * G))          # 512 MiB, never written
        vb.commit_range(va, 0, 256 * G)
        before = _rss_kib()
        ep.launch(0, [(va.address, 256 * G)], [(va.address + 7, 256 * G - 7)])
        ep.synchronize(0)
        assert _rss_kib() - before < 64 * 1024            # < 64 MiB resident for 1 GiB of kernel ranges
        vb.decommit_range(va, 2 * G, 4 * G)               # a hole in the middle: still seen by the kernel
        with pytest.raises(DeviceFault, match="not mapped"):
            ep.launch(0, [(va.address, 256 * G)], [])      # the probe of the decommitted page faults
        ep.synchronize(0)
        vb.release(va)
    finally:
        inst.close()
