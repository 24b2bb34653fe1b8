"""The host driver emulator: one test per documented rule, asserting the exact
CUresult, plus the checked facade and driver selection.  No GPU needed."""

from __future__ import annotations

import ctypes

import pytest
from cuda.bindings import driver as cu

from memspec.cuda_impl.driver import (
    CudaError,
    CudaFault,
    CudaOutOfMemory,
    Driver,
    DriverUnavailable,
    open_driver,
    real_driver_available,
)
from memspec.cuda_impl.hostdrv import HostDriver
from memspec.spec.errors import DeviceFault, OutOfMemory

R = cu.CUresult
OK = R.CUDA_SUCCESS
INVALID = R.CUDA_ERROR_INVALID_VALUE
G = 2 << 20


def prop(ordinal: int = 0):
    p = cu.CUmemAllocationProp()
    p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p.location.id = ordinal
    return p


def access(flags):
    a = cu.CUmemAccessDesc()
    a.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    a.location.id = 0
    a.flags = flags
    return a


RW = access(cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
RO = access(cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ)


@pytest.fixture
def d():
    drv = HostDriver(capacity=16 * G)
    assert drv.cuInit(0) == (OK,)
    _, dev = drv.cuDeviceGet(0)
    res, ctx = drv.cuDevicePrimaryCtxRetain(dev)
    assert res == OK
    assert drv.cuCtxSetCurrent(ctx) == (OK,)
    return drv


def create(d, size=G):
    res, h = d.cuMemCreate(size, prop(), 0)
    assert res == OK
    return h


def reserve(d, size=4 * G):
    res, va = d.cuMemAddressReserve(size, 0, 0, 0)
    assert res == OK
    return int(va)


def stream(d):
    res, s = d.cuStreamCreate(1)
    assert res == OK
    return s


# -- R1 granularity -----------------------------------------------------------

def test_granularity_reported_and_configurable():
    d = HostDriver(granularity=64 << 10)
    d.cuInit(0)
    flag = cu.CUmemAllocationGranularity_flags
    assert d.cuMemGetAllocationGranularity(prop(), flag.CU_MEM_ALLOC_GRANULARITY_MINIMUM) == (OK, 64 << 10)
    assert d.cuMemGetAllocationGranularity(prop(), flag.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == (OK, 64 << 10)
    with pytest.raises(ValueError):
        HostDriver(granularity=3 << 20)


def test_create_size_must_be_a_granularity_multiple(d):
    assert d.cuMemCreate(G + 4096, prop(), 0)[0] == INVALID
    assert d.cuMemCreate(0, prop(), 0)[0] == INVALID
    assert d.cuMemCreate(G, prop(1), 0)[0] == R.CUDA_ERROR_INVALID_DEVICE
    assert d.used == 0


def test_reserve_size_and_alignment_must_be_granularity_multiples(d):
    assert d.cuMemAddressReserve(G + 1, 0, 0, 0)[0] == INVALID
    assert d.cuMemAddressReserve(G, 4096, 0, 0)[0] == INVALID
    res, va = d.cuMemAddressReserve(G, 8 * G, 0, 0)
    assert res == OK and int(va) % (8 * G) == 0


def test_map_ptr_size_offset_must_be_aligned(d):
    h, va = create(d, 2 * G), reserve(d)
    assert d.cuMemMap(va + 4096, G, 0, h, 0) == (INVALID,)
    assert d.cuMemMap(va, G + 4096, 0, h, 0) == (INVALID,)
    assert d.cuMemMap(va, G, 4096, h, 0) == (INVALID,)
    assert d.mapped_pages() == 0


# -- R2 map only on reserved, unmapped ranges ----------------------------------

def test_map_only_inside_a_reservation(d):
    h = create(d)
    va = reserve(d, G)
    assert d.cuMemMap(va + G, G, 0, h, 0) == (INVALID,)       # past its end
    assert d.cuMemMap(0x1000_0000_0000, G, 0, h, 0) == (INVALID,)   # never reserved


def test_map_only_on_unmapped_pages(d):
    h1, h2, va = create(d), create(d), reserve(d)
    assert d.cuMemMap(va, G, 0, h1, 0) == (OK,)
    assert d.cuMemMap(va, G, 0, h2, 0) == (INVALID,)


def test_map_within_the_handle_and_only_live_handles(d):
    h, va = create(d), reserve(d)
    assert d.cuMemMap(va, 2 * G, 0, h, 0) == (INVALID,)       # handle is one granule
    assert d.cuMemMap(va, G, G, h, 0) == (INVALID,)
    assert d.cuMemRelease(h) == (OK,)
    assert d.cuMemMap(va, G, 0, h, 0) == (INVALID,)           # released handle


# -- R3 unmap of exactly one mapping ----------------------------------------------

def test_unmap_only_the_whole_mapped_range(d):
    h, va = create(d, 2 * G), reserve(d)
    assert d.cuMemMap(va, 2 * G, 0, h, 0) == (OK,)
    assert d.cuMemUnmap(va, G) == (INVALID,)                  # sub-range
    assert d.cuMemUnmap(va + G, G) == (INVALID,)
    assert d.cuMemUnmap(va, 4 * G) == (INVALID,)              # more than mapped
    assert d.cuMemUnmap(va, 2 * G) == (OK,)
    assert d.cuMemUnmap(va, 2 * G) == (INVALID,)              # twice


# -- R4 release while mapped defers the free ------------------------------------------

def test_release_while_mapped_frees_at_last_unmap(d):
    h, va1, va2 = create(d), reserve(d), reserve(d)
    assert d.cuMemMap(va1, G, 0, h, 0) == (OK,)
    assert d.cuMemMap(va2, G, 0, h, 0) == (OK,)
    assert d.cuMemRelease(h) == (OK,)
    assert d.cuMemGetInfo() == (OK, 15 * G, 16 * G)           # still charged
    assert d.cuMemUnmap(va1, G) == (OK,)
    assert d.cuMemGetInfo() == (OK, 15 * G, 16 * G)
    assert d.cuMemUnmap(va2, G) == (OK,)
    assert d.cuMemGetInfo() == (OK, 16 * G, 16 * G)           # freed at the last unmap
    assert d.live_handles() == 0
    assert d.cuMemRelease(h) == (INVALID,)                    # unknown handle now


def test_retain_allocation_handle_adds_a_reference(d):
    h, va = create(d), reserve(d)
    d.cuMemMap(va, G, 0, h, 0)
    res, h2 = d.cuMemRetainAllocationHandle(va)
    assert res == OK and int(h2) == int(h)
    d.cuMemRelease(h)
    d.cuMemUnmap(va, G)
    assert d.live_handles() == 1                              # the retained reference keeps it
    assert d.cuMemRelease(h2) == (OK,)
    assert d.live_handles() == 0
    assert d.cuMemRetainAllocationHandle(va)[0] == INVALID


# -- R5 address free only when unmapped and exact ------------------------------------------

def test_address_free_only_unmapped_and_with_the_reserved_size(d):
    h, va = create(d), reserve(d, 4 * G)
    d.cuMemMap(va + G, G, 0, h, 0)
    assert d.cuMemAddressFree(va, 4 * G) == (INVALID,)        # still mapped
    d.cuMemUnmap(va + G, G)
    assert d.cuMemAddressFree(va, 2 * G) == (INVALID,)        # not the reserved size
    assert d.cuMemAddressFree(va + G, 3 * G) == (INVALID,)    # not the reserved base
    assert d.cuMemAddressFree(va, 4 * G) == (OK,)
    assert d.reservations() == 0


# -- R6 access --------------------------------------------------------------------------

def test_set_access_needs_a_fully_mapped_range(d):
    h, va = create(d), reserve(d)
    d.cuMemMap(va, G, 0, h, 0)
    assert d.cuMemSetAccess(va, 2 * G, [RW], 1) == (INVALID,)
    assert d.cuMemSetAccess(va, G, [RW], 2) == (INVALID,)
    assert d.cuMemSetAccess(va, G, [RW], 1) == (OK,)
    assert d.cuMemGetAccess(None, va) == (OK, 3)
    assert d.cuMemGetAccess(None, va + G)[0] == INVALID


def test_aliasing_really_aliases(d):
    """One handle at two VAs: a write through one is read through the other."""
    h, va1, va2 = create(d), reserve(d), reserve(d)
    for va in (va1, va2):
        assert d.cuMemMap(va, G, 0, h, 0) == (OK,)
        assert d.cuMemSetAccess(va, G, [RW], 1) == (OK,)
    s = stream(d)
    assert d.cuMemcpyHtoDAsync(va1 + 100, b"alias!", 6, s) == (OK,)
    assert d.cuStreamSynchronize(s) == (OK,)
    assert d.peek(va2 + 100, 6) == b"alias!"
    # and the host memory really is one page: ctypes through VA2 sees it too
    assert ctypes.string_at(va2 + 100, 6) == b"alias!"


def test_read_only_mapping_write_is_a_fault_not_a_crash(d):
    h, va = create(d), reserve(d)
    d.cuMemMap(va, G, 0, h, 0)
    d.cuMemSetAccess(va, G, [RO], 1)
    s = stream(d)
    assert d.cuMemcpyHtoDAsync(va, b"x", 1, s) == (OK,)       # enqueued: the page is mapped
    assert d.cuStreamSynchronize(s) == (R.CUDA_ERROR_ILLEGAL_ADDRESS,)
    assert d.faults[-1].reason == "read-only" and d.faults[-1].address == va
    assert d.cuStreamSynchronize(s) == (OK,)                  # reported once
    buf = bytearray(4)
    assert d.cuMemcpyDtoHAsync(buf, va, 4, s) == (OK,)        # reads are allowed
    assert d.cuStreamSynchronize(s) == (OK,) and buf == b"\0\0\0\0"


def test_mapped_without_access_is_not_accessible(d):
    h, va = create(d), reserve(d)
    d.cuMemMap(va, G, 0, h, 0)                                # cuMemMap grants no access
    s = stream(d)
    buf = bytearray(4)
    assert d.cuMemcpyDtoHAsync(buf, va, 4, s) == (OK,)
    assert d.cuStreamSynchronize(s) == (R.CUDA_ERROR_ILLEGAL_ADDRESS,)
    assert d.faults[-1].reason == "no access"
    with pytest.raises(PermissionError):
        d.peek(va, 4)


# -- R7 capacity and OOM ---------------------------------------------------------------

def test_capacity_bounds_create_and_alloc(d):
    hs = [create(d, 4 * G) for _ in range(3)]
    assert d.cuMemGetInfo() == (OK, 4 * G, 16 * G)
    assert d.cuMemCreate(6 * G, prop(), 0)[0] == R.CUDA_ERROR_OUT_OF_MEMORY
    assert d.cuMemAlloc(5 * G)[0] == R.CUDA_ERROR_OUT_OF_MEMORY
    res, p = d.cuMemAlloc(G + 1)                              # rounded to 2 granules
    assert res == OK and d.cuMemGetInfo() == (OK, 2 * G, 16 * G)
    assert d.cuMemFree(p) == (OK,)
    assert d.cuMemFree(p) == (INVALID,)
    for h in hs:
        d.cuMemRelease(h)
    assert d.cuMemGetInfo() == (OK, 16 * G, 16 * G)


# -- R8/R9 events and the stream gate -----------------------------------------------------

def test_event_not_ready_until_the_gate_opens(d):
    s = stream(d)
    res, ev = d.cuEventCreate(2)
    assert d.cuEventQuery(ev) == (OK,)                        # never recorded
    res, word = d.cuMemHostAlloc(4, cu.CU_MEMHOSTALLOC_DEVICEMAP)
    res, dptr = d.cuMemHostGetDevicePointer(word, 0)
    assert res == OK and int(dptr) == word
    assert d.cuStreamWaitValue32(s, dptr, 1, cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ) == (OK,)
    assert d.cuEventRecord(ev, s) == (OK,)
    assert d.cuEventQuery(ev) == (R.CUDA_ERROR_NOT_READY,)
    assert d.cuStreamQuery(s) == (R.CUDA_ERROR_NOT_READY,)
    assert d.cuStreamSynchronize(s) == (R.CUDA_ERROR_LAUNCH_TIMEOUT,)   # would hang on a GPU
    d.host_write_u32(word, 1)
    assert d.cuEventQuery(ev) == (R.CUDA_ERROR_NOT_READY,)   # lazy device: no time yet
    assert d.advance() == 2                                   # the wait and the record ran
    assert d.cuEventQuery(ev) == (OK,)
    assert d.cuStreamSynchronize(s) == (OK,)


def test_progress_modes():
    """lazy: queued work runs when the host synchronizes (or advance()); eager:
    queries run it too.  Both are legal device speeds."""
    for progress, after_query in (("lazy", R.CUDA_ERROR_NOT_READY), ("eager", OK)):
        d = HostDriver(progress=progress)
        d.cuInit(0)
        _, ctx = d.cuDevicePrimaryCtxRetain(0)
        d.cuCtxSetCurrent(ctx)
        s = stream(d)
        _, ev = d.cuEventCreate(2)
        d.cuEventRecord(ev, s)
        assert d.cuEventQuery(ev) == (after_query,)
        assert d.cuStreamQuery(s) == (after_query,)
        assert d.cuEventSynchronize(ev) == (OK,)
        assert d.cuEventQuery(ev) == (OK,)
    with pytest.raises(ValueError):
        HostDriver(progress="sometimes")


def test_wait_value_needs_a_device_mapped_host_word(d):
    s = stream(d)
    res, plain = d.cuMemHostAlloc(4, 0)
    assert d.cuMemHostGetDevicePointer(plain, 0)[0] == INVALID
    assert d.cuStreamWaitValue32(s, plain, 1, 0) == (INVALID,)


def test_stream_wait_event_orders_streams(d):
    s1, s2 = stream(d), stream(d)
    _, ev = d.cuEventCreate(2)
    _, word = d.cuMemHostAlloc(4, cu.CU_MEMHOSTALLOC_DEVICEMAP)
    d.cuStreamWaitValue32(s1, word, 1, 0)
    d.cuEventRecord(ev, s1)
    d.cuStreamWaitEvent(s2, ev, 0)
    _, ev2 = d.cuEventCreate(2)
    d.cuEventRecord(ev2, s2)
    assert d.cuEventQuery(ev2) == (R.CUDA_ERROR_NOT_READY,)
    d.host_write_u32(word, 1)
    d.advance()
    assert d.cuEventQuery(ev2) == (OK,)


# -- R10 init and contexts --------------------------------------------------------------

def test_calls_before_init_and_without_context():
    d = HostDriver()
    assert d.cuMemGetInfo()[0] == R.CUDA_ERROR_NOT_INITIALIZED
    assert d.cuMemCreate(2 << 20, prop(), 0)[0] == R.CUDA_ERROR_NOT_INITIALIZED
    d.cuInit(0)
    assert d.cuMemAlloc(16)[0] == R.CUDA_ERROR_INVALID_CONTEXT
    assert d.cuStreamCreate(0)[0] == R.CUDA_ERROR_INVALID_CONTEXT
    assert d.cuDeviceGet(1)[0] == R.CUDA_ERROR_INVALID_DEVICE


def test_primary_context_refcount(d):
    assert d.primary_ctx_refcount(0) == 1
    _, dev = d.cuDeviceGet(0)
    _, ctx = d.cuDevicePrimaryCtxRetain(dev)
    assert d.primary_ctx_refcount(0) == 2
    res, p = d.cuMemAlloc(16)
    d.cuDevicePrimaryCtxRelease(dev)
    assert d.cuMemFree(p) == (OK,)                            # still alive: one reference left
    d.cuDevicePrimaryCtxRelease(dev)
    assert d.primary_ctx_refcount(0) == 0
    assert d.cuDevicePrimaryCtxRelease(dev) == (R.CUDA_ERROR_INVALID_CONTEXT,)
    assert d.cuMemAlloc(16)[0] == R.CUDA_ERROR_INVALID_CONTEXT


# -- R11 copies to unmapped memory ----------------------------------------------------------

def test_copy_to_unmapped_is_invalid_at_enqueue_and_a_fault_if_unmapped_later(d):
    h, va = create(d), reserve(d)
    s = stream(d)
    assert d.cuMemcpyHtoDAsync(va, b"x", 1, s) == (INVALID,)  # reserved, not mapped
    d.cuMemMap(va, G, 0, h, 0)
    d.cuMemSetAccess(va, G, [RW], 1)
    _, word = d.cuMemHostAlloc(4, cu.CU_MEMHOSTALLOC_DEVICEMAP)
    d.cuStreamWaitValue32(s, word, 1, 0)
    buf = bytearray(8)
    assert d.cuMemcpyDtoHAsync(buf, va, 8, s) == (OK,)        # queued behind the gate
    d.cuMemRelease(h)
    assert d.cuMemUnmap(va, G) == (OK,)                       # unmap does not wait for the stream
    d.host_write_u32(word, 1)
    assert d.cuStreamSynchronize(s) == (R.CUDA_ERROR_ILLEGAL_ADDRESS,)
    assert d.faults[-1].reason == "unmapped" and d.faults[-1].op == "dtoh"


# -- the facade and driver selection ------------------------------------------------------

def test_facade_raises_typed_errors_with_the_result_name():
    drv = open_driver("host", capacity=4 * G)
    with pytest.raises(CudaError) as e:
        drv.cuMemCreate(G + 1, drv.allocation_prop(0), 0)
    assert e.value.name == "CUDA_ERROR_INVALID_VALUE" and e.value.call == "cuMemCreate"
    with pytest.raises(CudaOutOfMemory) as e:
        drv.cuMemCreate(8 * G, drv.allocation_prop(0), 0)
    assert isinstance(e.value, OutOfMemory) and e.value.name == "CUDA_ERROR_OUT_OF_MEMORY"
    h = drv.cuMemCreate(G, drv.allocation_prop(0), 0)
    assert int(h) > 0
    assert drv.query("cuMemRelease", h) == OK
    assert issubclass(CudaFault, DeviceFault)


def test_driver_selection(monkeypatch):
    monkeypatch.setenv("MEMSPEC_CUDA_DRIVER", "host")
    assert open_driver().kind == "cuda-host"
    monkeypatch.setenv("MEMSPEC_CUDA_DRIVER", "bogus")
    with pytest.raises(ValueError):
        open_driver()
    ok, why = real_driver_available()
    monkeypatch.setenv("MEMSPEC_CUDA_DRIVER", "auto")
    assert open_driver().kind == ("cuda" if ok else "cuda-host")
    if not ok:
        assert why
        with pytest.raises(DriverUnavailable):
            open_driver("cuda")


def test_limit_gives_oom_at_a_chosen_capacity():
    drv = open_driver("host", capacity=16 * G)
    drv.set_limit(2 * G)
    drv.cuMemCreate(2 * G, drv.allocation_prop(0), 0)
    with pytest.raises(CudaOutOfMemory):
        drv.cuMemCreate(G, drv.allocation_prop(0), 0)


def test_import_does_not_load_the_driver():
    """Importing every cuda_impl module never calls the driver."""
    import subprocess
    import sys

    code = (
        "from cuda.bindings import driver as cu\n"
        "called = []\n"
        "for n in [x for x in dir(cu) if x.startswith('cu')]:\n"
        "    setattr(cu, n, lambda *a, n=n: called.append(n))\n"
        "import memspec.cuda_impl, memspec.cuda_impl.driver, memspec.cuda_impl.hostdrv, memspec.cuda_impl.targets\n"
        "import memspec.cuda_impl.ep, memspec.cuda_impl.mechanism, memspec.cuda_impl.vmm, memspec.cuda_impl.shared\n"
        "print('calls', called)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "calls []"


def test_binding_types_round_trip(d):
    """The emulator answers with the real binding types."""
    h = create(d)
    assert isinstance(h, cu.CUmemGenericAllocationHandle)
    res, va = d.cuMemAddressReserve(G, 0, 0, 0)
    assert isinstance(va, cu.CUdeviceptr)
    assert isinstance(stream(d), cu.CUstream)
    assert isinstance(d.cuEventCreate(0)[1], cu.CUevent)
    with pytest.raises(AttributeError):
        d.cuGraphLaunch
    assert d.CUresult is cu.CUresult
    assert isinstance(Driver(d, "cuda-host").types.CUresult.CUDA_SUCCESS, cu.CUresult)


def test_cuda_impl_imports_only_the_contract_from_the_spec():
    """Layering: cuda_impl may import memspec.spec.api and memspec.spec.errors, nothing else of the spec."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "cuda_impl"
    bad = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for n in names:
                if (n.startswith("memspec.spec") and n.split(".")[2:3] not in (["api"], ["errors"])) or \
                        n.startswith(("memspec.reference", "memspec.invariants", "spec.", "reference.")):
                    bad.append(f"{path.name}: {n}")
    assert len(list(root.glob("*.py"))) >= 9
    assert bad == []
