"""Host driver emulator: the subset of ``cuda.bindings.driver`` that
``cuda_impl`` uses, on real host memory.

Same function names, same argument conventions, same ``(CUresult, value...)``
return tuples, and the real binding types (``CUresult``, ``CUdeviceptr``,
``CUmemGenericAllocationHandle``, ``CUstream``, ``CUevent``...), which construct
without a driver.  So the code in ``cuda_impl`` is the same on a GPU and here.

Physical memory is real: every ``cuMemCreate`` handle is a ``memfd`` of its
size; ``cuMemAddressReserve`` is ``mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|
MAP_NORESERVE)``; ``cuMemMap`` is ``mmap(MAP_FIXED|MAP_SHARED, fd, offset)``,
so two virtual addresses mapped from one handle really alias one physical
page; ``cuMemUnmap`` maps ``PROT_NONE`` anonymous memory back over the range.
Host protections mirror ``cuMemSetAccess``.  The emulator never lets Python
touch a page its own page table does not allow: an access it would refuse is
recorded as a fault (``faults``) and reported as ``CUDA_ERROR_ILLEGAL_ADDRESS``.

Rules enforced (the real driver's per-case codes are not documented; until a
GPU run records them, misuse answers ``CUDA_ERROR_INVALID_VALUE``, as the
notes ask):

* R1 granularity: ``cuMemCreate`` size, ``cuMemAddressReserve`` size and
  alignment, ``cuMemMap`` ptr/size/offset, ``cuMemUnmap`` and
  ``cuMemSetAccess`` ptr/size are multiples of the granularity -> INVALID_VALUE.
* R2 ``cuMemMap`` only inside one reservation, only on pages not currently
  mapped, only within the handle, only with a live handle -> INVALID_VALUE.
* R3 ``cuMemUnmap`` only of exactly the range one ``cuMemMap`` mapped -> INVALID_VALUE.
* R4 ``cuMemRelease`` while mapped succeeds; the physical memory is freed (and
  ``cuMemGetInfo`` refunded) when the last mapping goes.  Releasing an unknown
  or already released handle -> INVALID_VALUE (undefined on a real driver).
* R5 ``cuMemAddressFree`` only with the exact reserved ``(ptr, size)`` and only
  when no page is mapped -> INVALID_VALUE.
* R6 ``cuMemSetAccess`` only on a fully mapped range; flags are enforced: a
  copy writing a ``PROT_READ`` page (or touching a ``PROT_NONE`` one) faults.
* R7 capacity: ``cuMemCreate``/``cuMemAlloc`` beyond the configured capacity ->
  OUT_OF_MEMORY; ``cuMemGetInfo`` reports ``(capacity - used, capacity)``.
* R8 events: ``cuEventQuery`` is NOT_READY until the stream has executed the
  recorded point (SUCCESS before the first record).
* R9 ``cuStreamWaitValue32`` on a host-mapped word (``cuMemHostAlloc`` with
  DEVICEMAP + ``cuMemHostGetDevicePointer``) holds the stream until the word
  satisfies the condition.
* R10 every call before ``cuInit`` -> NOT_INITIALIZED; calls needing a context
  (``cuMemAlloc``, streams, events, host allocations, copies) without a
  current live one -> INVALID_CONTEXT; primary contexts are refcounted by
  ``cuDevicePrimaryCtxRetain``/``Release``.
* R11 an async copy naming an address that is not mapped device memory at
  enqueue time -> INVALID_VALUE; one whose range was unmapped (or made
  inaccessible) before it ran is a recorded fault, ILLEGAL_ADDRESS at the
  next ``cuStreamSynchronize``/``cuStreamQuery``/``cuEventQuery`` observing
  that stream (reported once: not sticky, unlike a real kernel fault).

Execution model (deterministic, no background thread): each stream is a FIFO
of queued operations, run from its head for as long as the head operation is
runnable (a wait-value whose word does not satisfy its condition, or a
wait-event on an unfinished record, blocks its stream).  *When* the device
runs is the ``progress`` setting, two legal device speeds:

* ``"lazy"`` (default): work runs only when the host synchronizes
  (``cuStreamSynchronize`` runs that stream, ``cuEventSynchronize`` that
  stream up to the event -- each also as far as needed into streams it waits
  on -- ``cuCtxSynchronize`` every stream) or calls
  :meth:`HostDriver.advance` (the device got some time: every stream).  Queries
  (``cuEventQuery``, ``cuStreamQuery``) answer NOT_READY until then.  A release
  ordered before its fence is therefore always observable: the fence is not
  done, and the queued work faults when it finally runs.
* ``"eager"``: queries also run every runnable operation first, so ungated
  work has completed by the time anyone asks (an infinitely fast device).

Nothing else (in particular not ``cuMemUnmap``, ``cuMemRelease`` or
``cuMemFree``) runs queued work.  A synchronize that cannot finish (a stream
held by a word only the host can write) would hang a real program; after
``sync_timeout`` seconds of polling the emulator answers
``CUDA_ERROR_LAUNCH_TIMEOUT`` instead.  The null stream (0) is an ordinary
stream here (no legacy implicit synchronization).
"""

from __future__ import annotations

import ctypes
import itertools
import mmap as _mmap
import os
import resource
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from cuda.bindings import driver as _cu
from sortedcontainers import SortedDict

R = _cu.CUresult
SUCCESS = R.CUDA_SUCCESS

MiB = 1 << 20

PROT_NONE = 0
PROT_READ = 1
PROT_WRITE = 2
MAP_SHARED = _mmap.MAP_SHARED
MAP_PRIVATE = _mmap.MAP_PRIVATE
MAP_ANONYMOUS = _mmap.MAP_ANONYMOUS
MAP_FIXED = 0x10
MAP_NORESERVE = 0x4000
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.restype = ctypes.c_int
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

ACCESS_NONE = int(_cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE)
ACCESS_READ = int(_cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ)
ACCESS_RW = int(_cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
_HOST_PROT = {ACCESS_NONE: PROT_NONE, ACCESS_READ: PROT_READ, ACCESS_RW: PROT_READ | PROT_WRITE}

WAIT_GEQ = int(_cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
WAIT_EQ = int(_cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_EQ)
WAIT_AND = int(_cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_AND)
WAIT_NOR = int(_cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_NOR)
HOSTALLOC_DEVICEMAP = int(_cu.CU_MEMHOSTALLOC_DEVICEMAP)


def _raise_nofile_limit() -> None:
    """One memfd per physical handle: let the process open as many as it may."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16), hard))
        except (ValueError, OSError):
            pass


def _sys_mmap(addr: int, size: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
    p = _libc.mmap(addr or None, size, prot, flags, fd, offset)
    if p is None or p == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap failed: {os.strerror(err)}")
    return int(p)


def _sys_munmap(addr: int, size: int) -> None:
    if _libc.munmap(addr, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"munmap failed: {os.strerror(err)}")


def _sys_mprotect(addr: int, size: int, prot: int) -> None:
    if _libc.mprotect(addr, size, prot) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mprotect failed: {os.strerror(err)}")


def _i(x: Any) -> int:
    """Raw value of a binding handle type or an int (None counts as 0)."""
    return 0 if x is None else int(x)


#: the host's user address space (x86-64 and AArch64 with 4-level tables:
#: 128 TiB).  Every size, offset and size + alignment is checked against it
#: before any system call: ctypes passes ``size_t`` modulo 2**64, so an
#: unchecked 2**64 would reach mmap as a small size.
HOST_VA_LIMIT = 1 << 47


def _n(x: Any) -> int | None:
    """A byte count or offset as an int in ``[0, HOST_VA_LIMIT]``; None for
    anything else (negative, too large for the host, not an integer)."""
    if isinstance(x, bool):
        return None
    try:
        v = int(x)
    except (TypeError, ValueError, OverflowError):
        return None
    if isinstance(x, float) and v != x:
        return None
    return v if 0 <= v <= HOST_VA_LIMIT else None


def _too_big(x: Any) -> bool:
    """An integer byte count larger than the host can map (OUT_OF_MEMORY, as
    a driver answers a request beyond the device)."""
    return isinstance(x, int) and not isinstance(x, bool) and x > HOST_VA_LIMIT


# --------------------------------------------------------------------------
# Emulator state
# --------------------------------------------------------------------------

@dataclass
class _Physical:
    """A ``cuMemCreate`` allocation: a memfd plus its reference counts."""

    handle: int
    size: int
    fd: int
    refs: int = 1          # handle references (creation + cuMemRetainAllocationHandle)
    mappings: int = 0      # live cuMemMap mappings


@dataclass
class _Mapping:
    va: int
    size: int
    phys: _Physical
    offset: int


@dataclass
class _Page:
    mapping: _Mapping
    access: int = ACCESS_NONE


@dataclass
class _Linear:
    """A ``cuMemAlloc`` allocation (own memfd, mapped read/write)."""

    base: int
    size: int
    fd: int


@dataclass
class _HostBlock:
    base: int
    size: int
    flags: int
    buf: Any


@dataclass
class _Event:
    handle: int
    recorded: int = 0      # serial of the latest record op enqueued
    reached: int = 0       # serial of the latest record op executed
    stream: int | None = None


@dataclass
class _Stream:
    handle: int
    flags: int
    queue: deque = field(default_factory=deque)
    error: Any = None      # CUresult reported once at the next observation


@dataclass(frozen=True)
class Fault:
    """A device access the emulator refused (it would have been an illegal address)."""

    stream: int
    op: str
    address: int
    reason: str


@dataclass
class _Context:
    handle: int
    device: int
    refs: int = 0
    generation: int = 0


class HostDriver:
    """An emulated CUDA driver with ``device_count`` devices of ``capacity``
    bytes each, mapping granularity ``granularity`` (default 2 MiB).

    Call it exactly like ``cuda.bindings.driver``: ``(res, ptr) =
    drv.cuMemAddressReserve(size, 0, 0, 0)``.  Binding types and enums are
    forwarded from ``cuda.bindings.driver`` (``drv.CUresult`` ...); a
    ``cu*`` function the emulator does not provide raises AttributeError.
    """

    def __init__(
        self,
        *,
        capacity: int = 1 << 30,
        granularity: int = 2 * MiB,
        recommended_granularity: int | None = None,
        device_count: int = 1,
        sync_timeout: float = 0.0,
        progress: str = "lazy",
        name: str = "memspec host emulator",
    ) -> None:
        host_page = os.sysconf("SC_PAGE_SIZE")
        if granularity <= 0 or granularity & (granularity - 1) or granularity % host_page:
            raise ValueError(f"granularity must be a power of two multiple of the host page ({host_page}), got {granularity}")
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        if progress not in ("lazy", "eager"):
            raise ValueError(f"progress must be 'lazy' or 'eager', got {progress!r}")
        _raise_nofile_limit()
        self.progress = progress
        self.capacity = int(capacity)
        self.granularity = int(granularity)
        self.recommended_granularity = int(recommended_granularity or granularity)
        self.device_count = device_count
        self.sync_timeout = sync_timeout
        self.name = name
        self.used = 0
        self.faults: list[Fault] = []
        #: how many times each cu* function was called (for tests and the latency table)
        self.calls: dict[str, int] = {}
        self._lock = threading.RLock()
        self._initialized = False
        self._handles = itertools.count(0x1000)
        self._serial = itertools.count(1)
        self._physical: dict[int, _Physical] = {}
        self._reservations: SortedDict = SortedDict()   # base -> size
        self._mappings: SortedDict = SortedDict()       # va -> _Mapping
        self._pages: dict[int, _Page] = {}              # page va -> page
        self._linear: SortedDict = SortedDict()         # base -> _Linear
        self._host: SortedDict = SortedDict()           # base -> _HostBlock
        self._streams: dict[int, _Stream] = {0: _Stream(0, 0)}
        self._events: dict[int, _Event] = {}
        self._contexts: dict[int, _Context] = {}
        self._current: int = 0

    # -- binding types pass through -------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("cu"):
            raise AttributeError(f"the host driver emulator does not provide {name}")
        return getattr(_cu, name)

    # -- introspection for tests ----------------------------------------
    def primary_ctx_refcount(self, ordinal: int = 0) -> int:
        ctx = self._contexts.get(ordinal)
        return ctx.refs if ctx else 0

    def live_handles(self) -> int:
        """Physical allocations (cuMemCreate) whose memory is not freed yet."""
        return len(self._physical)

    def mapped_pages(self) -> int:
        return len(self._pages)

    def reservations(self) -> int:
        return len(self._reservations)

    def queued(self, stream: Any = None) -> int:
        if stream is None:
            return sum(len(s.queue) for s in self._streams.values())
        s = self._streams.get(_i(stream))
        return len(s.queue) if s else 0

    # -- helpers -----------------------------------------------------------
    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _aligned(self, *values: int) -> bool:
        g = self.granularity
        return all(v % g == 0 for v in values)

    def _ctx_ok(self) -> bool:
        ctx = self._contexts.get(self._current_device())
        return self._current != 0 and ctx is not None and ctx.refs > 0 and ctx.handle == self._current

    def _current_device(self) -> int:
        for ctx in self._contexts.values():
            if ctx.handle == self._current:
                return ctx.device
        return -1

    def _reservation_of(self, va: int, size: int) -> tuple[int, int] | None:
        idx = self._reservations.bisect_right(va) - 1
        if idx < 0:
            return None
        base, rsize = self._reservations.peekitem(idx)
        if base <= va and va + size <= base + rsize:
            return base, rsize
        return None

    def _block_of(self, table: SortedDict, addr: int):
        idx = table.bisect_right(addr) - 1
        if idx < 0:
            return None
        blk = table.peekitem(idx)[1]
        return blk if blk.base <= addr < blk.base + blk.size else None

    def _check_prop(self, prop: Any) -> R | None:
        try:
            if int(prop.type) != int(_cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED):
                return R.CUDA_ERROR_INVALID_VALUE
            if int(prop.location.type) != int(_cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE):
                return R.CUDA_ERROR_INVALID_VALUE
            if not 0 <= int(prop.location.id) < self.device_count:
                return R.CUDA_ERROR_INVALID_DEVICE
        except (AttributeError, TypeError, ValueError):
            return R.CUDA_ERROR_INVALID_VALUE
        return None

    def _free_physical(self, phys: _Physical) -> None:
        os.close(phys.fd)
        del self._physical[phys.handle]
        self.used -= phys.size

    def _device_range(self, addr: int, n: int, need: int) -> str | None:
        """Why device work may not access ``[addr, addr+n)`` with ``need``
        (ACCESS_READ or ACCESS_RW), or None when it may."""
        if n <= 0:
            return None
        for table in (self._linear, self._host):
            blk = self._block_of(table, addr)
            if blk is not None:
                return None if addr + n <= blk.base + blk.size else "past the end of the allocation"
        g = self.granularity
        page = addr - addr % g
        while page < addr + n:
            p = self._pages.get(page)
            if p is None:
                return "unmapped"
            if p.access & need != need:
                return "read-only" if p.access == ACCESS_READ else "no access"
            page += g
        return None

    def _is_device_memory(self, addr: int, n: int) -> bool:
        """R11 at enqueue: the range is mapped device memory now (any access flags)."""
        return self._device_range(addr, n, ACCESS_NONE) is None

    # ----------------------------------------------------------------------
    # Init, devices, contexts
    # ----------------------------------------------------------------------
    def cuInit(self, flags: int = 0):
        with self._lock:
            self._count("cuInit")
            if _i(flags) != 0:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            self._initialized = True
            return (SUCCESS,)

    def cuDriverGetVersion(self):
        self._count("cuDriverGetVersion")
        return (SUCCESS, 13000)

    def cuDeviceGetCount(self):
        with self._lock:
            self._count("cuDeviceGetCount")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, 0)
            return (SUCCESS, self.device_count)

    def cuDeviceGet(self, ordinal: int):
        with self._lock:
            self._count("cuDeviceGet")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, None)
            if not 0 <= int(ordinal) < self.device_count:
                return (R.CUDA_ERROR_INVALID_DEVICE, None)
            return (SUCCESS, _cu.CUdevice(int(ordinal)))

    def cuDeviceGetName(self, length: int, dev: Any):
        self._count("cuDeviceGetName")
        return (SUCCESS, self.name.encode()[: int(length)])

    def cuDevicePrimaryCtxRetain(self, dev: Any):
        with self._lock:
            self._count("cuDevicePrimaryCtxRetain")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, None)
            d = _i(dev)
            if not 0 <= d < self.device_count:
                return (R.CUDA_ERROR_INVALID_DEVICE, None)
            ctx = self._contexts.get(d)
            if ctx is None:
                ctx = self._contexts[d] = _Context(next(self._handles), d)
            if ctx.refs == 0:
                ctx.generation += 1
            ctx.refs += 1
            return (SUCCESS, _cu.CUcontext(ctx.handle))

    def cuDevicePrimaryCtxRelease(self, dev: Any):
        with self._lock:
            self._count("cuDevicePrimaryCtxRelease")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            ctx = self._contexts.get(_i(dev))
            if ctx is None or ctx.refs == 0:
                return (R.CUDA_ERROR_INVALID_CONTEXT,)
            ctx.refs -= 1
            if ctx.refs == 0:
                self._destroy_context_resources()
                if self._current == ctx.handle:
                    self._current = 0
            return (SUCCESS,)

    def _destroy_context_resources(self) -> None:
        """The primary context went: its streams, events, cuMemAlloc and host
        allocations die with it (cuMemCreate memory does not)."""
        for base in list(self._linear):
            blk = self._linear.pop(base)
            _sys_munmap(blk.base, blk.size)
            os.close(blk.fd)
            self.used -= blk.size
        self._host.clear()
        self._streams = {0: _Stream(0, 0)}
        self._events.clear()

    def cuCtxSetCurrent(self, ctx: Any):
        with self._lock:
            self._count("cuCtxSetCurrent")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            h = _i(ctx)
            if h != 0 and not any(c.handle == h and c.refs > 0 for c in self._contexts.values()):
                return (R.CUDA_ERROR_INVALID_CONTEXT,)
            self._current = h
            return (SUCCESS,)

    def cuCtxGetCurrent(self):
        self._count("cuCtxGetCurrent")
        return (SUCCESS, _cu.CUcontext(self._current))

    def cuCtxSynchronize(self):
        with self._lock:
            self._count("cuCtxSynchronize")
            if not self._ctx_ok():
                return (R.CUDA_ERROR_INVALID_CONTEXT,)
            for h in sorted(self._streams):
                res = self._synchronize(self._streams[h])
                if res != SUCCESS:
                    return (res,)
            return (SUCCESS,)

    # ----------------------------------------------------------------------
    # Memory information
    # ----------------------------------------------------------------------
    def cuMemGetInfo(self):
        with self._lock:
            self._count("cuMemGetInfo")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, 0, 0)
            return (SUCCESS, self.capacity - self.used, self.capacity)

    def cuMemGetAllocationGranularity(self, prop: Any, option: Any):
        with self._lock:
            self._count("cuMemGetAllocationGranularity")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, 0)
            bad = self._check_prop(prop)
            if bad is not None:
                return (bad, 0)
            opt = _i(option)
            if opt == int(_cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM):
                return (SUCCESS, self.granularity)
            if opt == int(_cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED):
                return (SUCCESS, self.recommended_granularity)
            return (R.CUDA_ERROR_INVALID_VALUE, 0)

    # ----------------------------------------------------------------------
    # Virtual memory management
    # ----------------------------------------------------------------------
    def cuMemCreate(self, size: int, prop: Any, flags: int):
        with self._lock:
            self._count("cuMemCreate")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, None)
            bad = self._check_prop(prop)
            if bad is not None:
                return (bad, None)
            if _too_big(size):
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            size = _n(size)
            if size is None or size <= 0 or not self._aligned(size) or _i(flags) != 0:
                return (R.CUDA_ERROR_INVALID_VALUE, None)
            if self.used + size > self.capacity:
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            fd = os.memfd_create("memspec-physical", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, size)
            except OSError:
                os.close(fd)
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            h = next(self._handles)
            self._physical[h] = _Physical(h, size, fd)
            self.used += size
            return (SUCCESS, _cu.CUmemGenericAllocationHandle(h))

    def cuMemRelease(self, handle: Any):
        with self._lock:
            self._count("cuMemRelease")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            phys = self._physical.get(_i(handle))
            if phys is None or phys.refs == 0:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            phys.refs -= 1
            if phys.refs == 0 and phys.mappings == 0:
                self._free_physical(phys)
            return (SUCCESS,)

    def cuMemRetainAllocationHandle(self, addr: Any):
        with self._lock:
            self._count("cuMemRetainAllocationHandle")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, None)
            a = _i(addr)
            page = self._pages.get(a - a % self.granularity)
            if page is None:
                return (R.CUDA_ERROR_INVALID_VALUE, None)
            page.mapping.phys.refs += 1
            return (SUCCESS, _cu.CUmemGenericAllocationHandle(page.mapping.phys.handle))

    def cuMemAddressReserve(self, size: int, alignment: int, addr: Any, flags: int):
        with self._lock:
            self._count("cuMemAddressReserve")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, None)
            if _too_big(size) and _n(alignment) is not None and _i(flags) == 0:
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)   # more address space than the host has
            size, alignment = _n(size), _n(alignment)
            if size is None or alignment is None or size <= 0 or not self._aligned(size) or _i(flags) != 0:
                return (R.CUDA_ERROR_INVALID_VALUE, None)
            if alignment < 0 or (alignment and (alignment & (alignment - 1) or not self._aligned(alignment))):
                return (R.CUDA_ERROR_INVALID_VALUE, None)
            align = max(alignment, self.granularity)
            if size + align > HOST_VA_LIMIT:
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)   # more address space than the host has
            # the hint is not honoured (the driver need not honour it either)
            try:
                raw = _sys_mmap(0, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)
            except OSError:
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            base = (raw + align - 1) // align * align
            if base > raw:
                _sys_munmap(raw, base - raw)
            tail = raw + size + align - (base + size)
            if tail:
                _sys_munmap(base + size, tail)
            self._reservations[base] = size
            return (SUCCESS, _cu.CUdeviceptr(base))

    def cuMemAddressFree(self, ptr: Any, size: int):
        with self._lock:
            self._count("cuMemAddressFree")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            base, size = _i(ptr), _n(size)
            if size is None or self._reservations.get(base) != size:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            if next(iter(self._mappings.irange(base, base + size - 1)), None) is not None:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            try:
                _sys_munmap(base, size)
            except OSError:
                return (R.CUDA_ERROR_UNKNOWN,)   # nothing changed: the reservation stays
            del self._reservations[base]
            return (SUCCESS,)

    def cuMemMap(self, ptr: Any, size: int, offset: int, handle: Any, flags: int):
        with self._lock:
            self._count("cuMemMap")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            va, size, offset = _i(ptr), _n(size), _n(offset)
            if size is None or offset is None or size <= 0 or _i(flags) != 0 or not self._aligned(va, size, offset):
                return (R.CUDA_ERROR_INVALID_VALUE,)
            phys = self._physical.get(_i(handle))
            if phys is None or phys.refs == 0 or offset + size > phys.size:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            if self._reservation_of(va, size) is None:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            g = self.granularity
            if any((va + o) in self._pages for o in range(0, size, g)):
                return (R.CUDA_ERROR_INVALID_VALUE,)
            try:
                _sys_mmap(va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, phys.fd, offset)
            except OSError:
                return (R.CUDA_ERROR_OUT_OF_MEMORY,)
            m = _Mapping(va, size, phys, offset)
            self._mappings[va] = m
            for o in range(0, size, g):
                self._pages[va + o] = _Page(m)
            phys.mappings += 1
            return (SUCCESS,)

    def cuMemUnmap(self, ptr: Any, size: int):
        with self._lock:
            self._count("cuMemUnmap")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            va, size = _i(ptr), _n(size)
            m = self._mappings.get(va)
            if m is None or m.size != size:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            try:
                _sys_mmap(va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED)
            except OSError:
                return (R.CUDA_ERROR_OUT_OF_MEMORY,)   # nothing changed: still mapped
            del self._mappings[va]
            for o in range(0, size, self.granularity):
                del self._pages[va + o]
            phys = m.phys
            phys.mappings -= 1
            if phys.refs == 0 and phys.mappings == 0:
                self._free_physical(phys)
            return (SUCCESS,)

    def cuMemSetAccess(self, ptr: Any, size: int, desc: Any, count: int):
        with self._lock:
            self._count("cuMemSetAccess")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            va, size = _i(ptr), _n(size)
            descs = list(desc) if isinstance(desc, (list, tuple)) else [desc]
            if size is None or _n(count) != len(descs) or not descs or size <= 0 or not self._aligned(va, size):
                return (R.CUDA_ERROR_INVALID_VALUE,)
            flags = None
            for d in descs:
                try:
                    if int(d.location.type) != int(_cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE):
                        return (R.CUDA_ERROR_INVALID_VALUE,)
                    if not 0 <= int(d.location.id) < self.device_count:
                        return (R.CUDA_ERROR_INVALID_DEVICE,)
                    f = int(d.flags)
                except (AttributeError, TypeError, ValueError):
                    return (R.CUDA_ERROR_INVALID_VALUE,)
                if f not in _HOST_PROT:
                    return (R.CUDA_ERROR_INVALID_VALUE,)
                flags = f
            g = self.granularity
            pages = [self._pages.get(va + o) for o in range(0, size, g)]
            if any(p is None for p in pages):
                return (R.CUDA_ERROR_INVALID_VALUE,)
            try:
                _sys_mprotect(va, size, _HOST_PROT[flags])
            except OSError:
                return (R.CUDA_ERROR_OUT_OF_MEMORY,)
            for p in pages:
                p.access = flags
            return (SUCCESS,)

    def cuMemGetAccess(self, location: Any, ptr: Any):
        with self._lock:
            self._count("cuMemGetAccess")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, 0)
            a = _i(ptr)
            p = self._pages.get(a - a % self.granularity)
            if p is None:
                return (R.CUDA_ERROR_INVALID_VALUE, 0)
            return (SUCCESS, p.access)

    # ----------------------------------------------------------------------
    # Linear device memory and host memory
    # ----------------------------------------------------------------------
    def cuMemAlloc(self, bytesize: int):
        with self._lock:
            self._count("cuMemAlloc")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, None)
            if not self._ctx_ok():
                return (R.CUDA_ERROR_INVALID_CONTEXT, None)
            if _too_big(bytesize):
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            n = _n(bytesize)
            if n is None or n <= 0:
                return (R.CUDA_ERROR_INVALID_VALUE, None)
            g = self.granularity
            size = -(-n // g) * g
            if self.used + size > self.capacity or size + g > HOST_VA_LIMIT:
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            fd = os.memfd_create("memspec-linear", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, size)
                raw = _sys_mmap(0, size + g, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)
            except OSError:
                os.close(fd)
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            base = (raw + g - 1) // g * g
            try:
                _sys_mmap(base, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0)
            except OSError:
                _sys_munmap(raw, size + g)
                os.close(fd)
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            if base > raw:
                _sys_munmap(raw, base - raw)
            if raw + g - base:
                _sys_munmap(base + size, raw + g - base)
            self._linear[base] = _Linear(base, size, fd)
            self.used += size
            return (SUCCESS, _cu.CUdeviceptr(base))

    def cuMemFree(self, dptr: Any):
        with self._lock:
            self._count("cuMemFree")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            if not self._ctx_ok():
                return (R.CUDA_ERROR_INVALID_CONTEXT,)
            blk = self._linear.get(_i(dptr))
            if blk is None:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            del self._linear[blk.base]
            _sys_munmap(blk.base, blk.size)
            os.close(blk.fd)
            self.used -= blk.size
            return (SUCCESS,)

    def cuMemHostAlloc(self, bytesize: int, flags: int):
        with self._lock:
            self._count("cuMemHostAlloc")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, 0)
            if not self._ctx_ok():
                return (R.CUDA_ERROR_INVALID_CONTEXT, 0)
            if _too_big(bytesize):
                return (R.CUDA_ERROR_OUT_OF_MEMORY, 0)
            n = _n(bytesize)
            if n is None or n <= 0:
                return (R.CUDA_ERROR_INVALID_VALUE, 0)
            try:
                buf = (ctypes.c_char * n)()
            except (MemoryError, OverflowError, ValueError):
                return (R.CUDA_ERROR_OUT_OF_MEMORY, 0)
            base = ctypes.addressof(buf)
            self._host[base] = _HostBlock(base, n, int(flags), buf)
            return (SUCCESS, base)

    def cuMemFreeHost(self, p: Any):
        with self._lock:
            self._count("cuMemFreeHost")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            base = _i(p)
            if base not in self._host:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            del self._host[base]
            return (SUCCESS,)

    def cuMemHostGetDevicePointer(self, p: Any, flags: int):
        with self._lock:
            self._count("cuMemHostGetDevicePointer")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, None)
            a = _i(p)
            blk = self._block_of(self._host, a)
            if blk is None or not blk.flags & HOSTALLOC_DEVICEMAP or _i(flags) != 0:
                return (R.CUDA_ERROR_INVALID_VALUE, None)
            return (SUCCESS, _cu.CUdeviceptr(a))   # unified addressing: same value

    # ----------------------------------------------------------------------
    # Streams and events
    # ----------------------------------------------------------------------
    def cuStreamCreate(self, flags: int):
        with self._lock:
            self._count("cuStreamCreate")
            if not self._ctx_ok():
                return (R.CUDA_ERROR_INVALID_CONTEXT, None)
            h = next(self._handles)
            self._streams[h] = _Stream(h, _i(flags))
            return (SUCCESS, _cu.CUstream(h))

    def cuStreamDestroy(self, stream: Any):
        with self._lock:
            self._count("cuStreamDestroy")
            h = _i(stream)
            if h == 0 or h not in self._streams:
                return (R.CUDA_ERROR_INVALID_HANDLE,)
            # the driver lets queued work finish after destroy; so do we, if it can
            self._pump()
            s = self._streams.pop(h)
            if s.queue:
                # work still gated: keep it runnable under a hidden name
                self._streams[-h] = s
            return (SUCCESS,)

    def _stream(self, stream: Any) -> _Stream | None:
        return self._streams.get(_i(stream))

    def cuStreamQuery(self, stream: Any):
        with self._lock:
            self._count("cuStreamQuery")
            s = self._stream(stream)
            if s is None:
                return (R.CUDA_ERROR_INVALID_HANDLE,)
            if self.progress == "eager":
                self._pump()
            if s.error is not None:
                err, s.error = s.error, None
                return (err,)
            return (SUCCESS if not s.queue else R.CUDA_ERROR_NOT_READY,)

    def cuStreamSynchronize(self, stream: Any):
        with self._lock:
            self._count("cuStreamSynchronize")
            s = self._stream(stream)
            if s is None:
                return (R.CUDA_ERROR_INVALID_HANDLE,)
            return (self._synchronize(s),)

    def _synchronize(self, s: _Stream, until: _Event | None = None) -> R:
        """Give ``s`` device time until its queue is empty (or, with ``until``,
        until that event's latest record is reached), releasing the lock
        between tries; LAUNCH_TIMEOUT after ``sync_timeout`` seconds, else the
        stream's pending error (cleared), else SUCCESS."""
        deadline = time.monotonic() + self.sync_timeout
        while True:
            self._pump_stream(s, until=until)
            if (until.reached >= until.recorded) if until is not None else not s.queue:
                break
            if time.monotonic() >= deadline:
                return R.CUDA_ERROR_LAUNCH_TIMEOUT
            self._lock.release()
            try:
                time.sleep(0.001)
            finally:
                self._lock.acquire()
        if s.error is not None:
            err, s.error = s.error, None
            return err
        return SUCCESS

    def cuEventCreate(self, flags: int):
        with self._lock:
            self._count("cuEventCreate")
            if not self._ctx_ok():
                return (R.CUDA_ERROR_INVALID_CONTEXT, None)
            h = next(self._handles)
            self._events[h] = _Event(h)
            return (SUCCESS, _cu.CUevent(h))

    def cuEventDestroy(self, event: Any):
        with self._lock:
            self._count("cuEventDestroy")
            if self._events.pop(_i(event), None) is None:
                return (R.CUDA_ERROR_INVALID_HANDLE,)
            return (SUCCESS,)

    def cuEventRecord(self, event: Any, stream: Any):
        with self._lock:
            self._count("cuEventRecord")
            ev, s = self._events.get(_i(event)), self._stream(stream)
            if ev is None or s is None:
                return (R.CUDA_ERROR_INVALID_HANDLE,)
            serial = next(self._serial)
            ev.recorded, ev.stream = serial, s.handle
            s.queue.append(("record", ev, serial))
            return (SUCCESS,)

    def cuEventQuery(self, event: Any):
        with self._lock:
            self._count("cuEventQuery")
            ev = self._events.get(_i(event))
            if ev is None:
                return (R.CUDA_ERROR_INVALID_HANDLE,)
            if self.progress == "eager":
                self._pump()
            s = self._streams.get(ev.stream) if ev.stream is not None else None
            if s is not None and s.error is not None:
                err, s.error = s.error, None
                return (err,)
            return (SUCCESS if ev.reached >= ev.recorded else R.CUDA_ERROR_NOT_READY,)

    def cuEventSynchronize(self, event: Any):
        with self._lock:
            self._count("cuEventSynchronize")
            ev = self._events.get(_i(event))
            if ev is None:
                return (R.CUDA_ERROR_INVALID_HANDLE,)
            s = self._streams.get(ev.stream) if ev.stream is not None else None
            if s is None:
                return (SUCCESS,)
            return (self._synchronize(s, until=ev),)

    def cuStreamWaitEvent(self, stream: Any, event: Any, flags: int):
        with self._lock:
            self._count("cuStreamWaitEvent")
            ev, s = self._events.get(_i(event)), self._stream(stream)
            if ev is None or s is None:
                return (R.CUDA_ERROR_INVALID_HANDLE,)
            s.queue.append(("wait_event", ev, ev.recorded))
            return (SUCCESS,)

    def cuStreamWaitValue32(self, stream: Any, addr: Any, value: Any, flags: int):
        with self._lock:
            self._count("cuStreamWaitValue32")
            s = self._stream(stream)
            if s is None:
                return (R.CUDA_ERROR_INVALID_HANDLE,)
            a, f = _i(addr), _i(flags)
            if a % 4 or f not in (WAIT_GEQ, WAIT_EQ, WAIT_AND, WAIT_NOR):
                return (R.CUDA_ERROR_INVALID_VALUE,)
            blk = self._block_of(self._host, a)
            lin = self._block_of(self._linear, a)
            if (blk is None or not blk.flags & HOSTALLOC_DEVICEMAP or a + 4 > blk.base + blk.size) and lin is None:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            s.queue.append(("wait_value", a, int(value) & 0xFFFFFFFF, f))
            return (SUCCESS,)

    def cuStreamWriteValue32(self, stream: Any, addr: Any, value: Any, flags: int):
        with self._lock:
            self._count("cuStreamWriteValue32")
            s = self._stream(stream)
            if s is None:
                return (R.CUDA_ERROR_INVALID_HANDLE,)
            a = _i(addr)
            if a % 4 or self._device_range(a, 4, ACCESS_RW) is not None:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            s.queue.append(("write_value", a, int(value) & 0xFFFFFFFF))
            return (SUCCESS,)

    # ----------------------------------------------------------------------
    # Copies
    # ----------------------------------------------------------------------
    def _host_src(self, src: Any, n: int):
        """A pointer is read when the copy runs (pinned-memory semantics); a
        Python buffer is staged now (pageable semantics)."""
        if isinstance(src, int):
            return src
        return bytes(memoryview(src).cast("B")[:n])

    def _host_range_ok(self, p: Any, n: int) -> bool:
        """An integer host pointer must name ``n`` bytes of one
        ``cuMemHostAlloc`` block: the emulator cannot tell a valid pageable
        pointer from a wild one, and a wild one would be written through."""
        if not isinstance(p, int):
            return True
        blk = self._block_of(self._host, p)
        return blk is not None and p + n <= blk.base + blk.size

    def _enqueue_checks(self, hStream: Any, count: Any, *device_ptrs: Any):
        """Enqueue-time checks shared by the async copies and memset: the
        stream exists (else INVALID_HANDLE); the byte count is not negative and
        each device pointer names device memory for that many bytes (R11 at
        enqueue; else INVALID_VALUE).  Returns ``(failure, stream, addresses,
        n)``; ``failure`` is the result tuple to return, or None."""
        s = self._stream(hStream)
        if s is None:
            return (R.CUDA_ERROR_INVALID_HANDLE,), None, (), 0
        addrs, n = tuple(_i(p) for p in device_ptrs), _n(count)
        if n is None or not all(self._is_device_memory(a, n) for a in addrs):
            return (R.CUDA_ERROR_INVALID_VALUE,), None, (), 0
        return None, s, addrs, n

    def cuMemcpyHtoDAsync(self, dstDevice: Any, srcHost: Any, ByteCount: int, hStream: Any):
        with self._lock:
            self._count("cuMemcpyHtoDAsync")
            bad, s, addrs, n = self._enqueue_checks(hStream, ByteCount, dstDevice)
            if bad:
                return bad
            if not self._host_range_ok(srcHost, n):
                return (R.CUDA_ERROR_INVALID_VALUE,)
            s.queue.append(("htod", addrs[0], self._host_src(srcHost, n), n))
            return (SUCCESS,)

    def cuMemcpyDtoHAsync(self, dstHost: Any, srcDevice: Any, ByteCount: int, hStream: Any):
        with self._lock:
            self._count("cuMemcpyDtoHAsync")
            bad, s, addrs, n = self._enqueue_checks(hStream, ByteCount, srcDevice)
            if bad:
                return bad
            src = addrs[0]
            if not self._host_range_ok(dstHost, n):
                return (R.CUDA_ERROR_INVALID_VALUE,)
            if isinstance(dstHost, int):
                dst, keep = dstHost, None
            else:
                keep = (ctypes.c_char * n).from_buffer(dstHost)
                dst = ctypes.addressof(keep)
            s.queue.append(("dtoh", dst, src, n, keep))
            return (SUCCESS,)

    def cuMemcpyDtoDAsync(self, dstDevice: Any, srcDevice: Any, ByteCount: int, hStream: Any):
        with self._lock:
            self._count("cuMemcpyDtoDAsync")
            bad, s, addrs, n = self._enqueue_checks(hStream, ByteCount, dstDevice, srcDevice)
            if bad:
                return bad
            s.queue.append(("dtod", *addrs, n))
            return (SUCCESS,)

    def cuMemsetD8Async(self, dstDevice: Any, uc: int, N: int, hStream: Any):
        with self._lock:
            self._count("cuMemsetD8Async")
            bad, s, addrs, n = self._enqueue_checks(hStream, N, dstDevice)
            if bad:
                return bad
            s.queue.append(("memset", addrs[0], int(uc) & 0xFF, n))
            return (SUCCESS,)

    # ----------------------------------------------------------------------
    # The device: running queued work
    # ----------------------------------------------------------------------
    def _runnable(self, op: tuple) -> bool:
        kind = op[0]
        if kind == "wait_value":
            _, a, value, f = op
            word = ctypes.c_uint32.from_address(a).value
            if f == WAIT_GEQ:
                return ((word - value) & 0xFFFFFFFF) < 0x80000000   # cyclic >=, as the driver
            if f == WAIT_EQ:
                return word == value
            if f == WAIT_AND:
                return (word & value) != 0
            return (~(word | value) & 0xFFFFFFFF) != 0
        if kind == "wait_event":
            _, ev, target = op
            return ev.reached >= target
        return True

    def _fault(self, s: _Stream, op: str, address: int, reason: str) -> None:
        self.faults.append(Fault(s.handle, op, address, reason))
        s.error = R.CUDA_ERROR_ILLEGAL_ADDRESS

    def _faulted(self, s: _Stream, kind: str, *ranges: tuple[int, int, int]) -> bool:
        """Check each ``(address, n, need)`` the device is about to touch, in
        order; at the first it may not, record the fault and say so."""
        for addr, n, need in ranges:
            why = self._device_range(addr, n, need)
            if why:
                self._fault(s, kind, addr, why)
                return True
        return False

    def _execute(self, s: _Stream, op: tuple) -> None:
        kind = op[0]
        if kind == "record":
            _, ev, serial = op
            ev.reached = max(ev.reached, serial)
        elif kind == "htod":
            _, dst, src, n = op
            if not self._faulted(s, kind, (dst, n, ACCESS_RW)):
                ctypes.memmove(dst, src, n)
        elif kind == "dtoh":
            _, dst, src, n, _keep = op
            if not self._faulted(s, kind, (src, n, ACCESS_READ)):
                ctypes.memmove(dst, src, n)
        elif kind == "dtod":
            _, dst, src, n = op
            if not self._faulted(s, kind, (src, n, ACCESS_READ), (dst, n, ACCESS_RW)):
                ctypes.memmove(dst, src, n)
        elif kind == "memset":
            _, dst, value, n = op
            if not self._faulted(s, kind, (dst, n, ACCESS_RW)):
                ctypes.memset(dst, value, n)
        elif kind == "write_value":
            _, a, value = op
            if not self._faulted(s, kind, (a, 4, ACCESS_RW)):
                ctypes.c_uint32.from_address(a).value = value
        # wait_value / wait_event: nothing to do once runnable

    def _pump_stream(self, s: _Stream, until: _Event | None = None, _busy: set | None = None) -> int:
        """Run ``s`` from its head (only as far as ``until``'s latest record, if
        given) and, for a wait on another stream's event, that stream as far
        as needed: a synchronize gives time to what it waits for, not to
        unrelated streams."""
        busy = _busy if _busy is not None else set()
        busy.add(s.handle)
        ran = 0
        while s.queue:
            if until is not None and until.reached >= until.recorded:
                break
            op = s.queue[0]
            if not self._runnable(op) and op[0] == "wait_event":
                ev = op[1]
                other = self._streams.get(ev.stream) if ev.stream is not None else None
                if other is None:
                    other = self._streams.get(-ev.stream) if ev.stream is not None else None
                if other is not None and other.handle not in busy:
                    ran += self._pump_stream(other, until=ev, _busy=busy)
            if not self._runnable(op):
                break
            self._execute(s, s.queue.popleft())
            ran += 1
        busy.discard(s.handle)
        return ran

    def _pump(self) -> int:
        """Run every stream's runnable head operations until none is; return how many ran."""
        ran = 0
        progress = True
        while progress:
            progress = False
            for h in sorted(self._streams):
                s = self._streams[h]
                while s.queue and self._runnable(s.queue[0]):
                    self._execute(s, s.queue.popleft())
                    ran += 1
                    progress = True
            for h in [h for h, s in self._streams.items() if h < 0 and not s.queue]:
                del self._streams[h]
        return ran

    # ----------------------------------------------------------------------
    # Host-side helpers for tests (not driver calls)
    # ----------------------------------------------------------------------
    def advance(self) -> int:
        """The device gets time: run every runnable queued operation; return how many ran."""
        with self._lock:
            return self._pump()

    def host_write_u32(self, addr: int, value: int) -> None:
        """Write a host-mapped word from the host (what ``ctypes`` does on a GPU)."""
        with self._lock:
            blk = self._block_of(self._host, addr)
            if blk is None or addr + 4 > blk.base + blk.size:
                raise ValueError(f"{addr:#x} is not inside a host allocation")
            ctypes.c_uint32.from_address(addr).value = value & 0xFFFFFFFF

    def peek(self, addr: int, n: int) -> bytes:
        """Read device memory as the device would (after checking the page
        table); raises PermissionError instead of touching an inaccessible page."""
        with self._lock:
            why = self._device_range(addr, n, ACCESS_READ)
            if why:
                raise PermissionError(f"{addr:#x}+{n}: {why}")
            return ctypes.string_at(addr, n)


# --------------------------------------------------------------------------
# Failure injection (tests of transactional rollback)
# --------------------------------------------------------------------------

_OUTPUTS = {
    "cuMemCreate": 1, "cuMemAddressReserve": 1, "cuMemAlloc": 1, "cuMemGetInfo": 2,
    "cuMemRetainAllocationHandle": 1, "cuStreamCreate": 1, "cuEventCreate": 1, "cuMemHostAlloc": 1,
    "cuMemHostGetDevicePointer": 1, "cuMemGetAccess": 1, "cuMemGetAllocationGranularity": 1,
    "cuDeviceGet": 1, "cuDevicePrimaryCtxRetain": 1, "cuDeviceGetCount": 1,
}


class FailureInjector:
    """Wraps a driver backend; ``fail(name, result, after=n)`` makes the
    ``n+1``-th next call of ``name`` return ``result`` without doing anything
    (once).  Everything else passes through."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._plan: dict[str, list] = {}
        self.injected: list[str] = []

    def fail(self, name: str, result: Any = R.CUDA_ERROR_UNKNOWN, *, after: int = 0) -> None:
        self._plan[name] = [after, result]

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.backend, name)
        if not name.startswith("cu"):
            return fn

        def call(*args: Any) -> Any:
            plan = self._plan.get(name)
            if plan is not None:
                if plan[0] == 0:
                    del self._plan[name]
                    self.injected.append(name)
                    return (plan[1],) + (None,) * _OUTPUTS.get(name, 0)
                plan[0] -= 1
            return fn(*args)

        return call
