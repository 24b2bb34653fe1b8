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

The module is split along its sections, each under 1,200 lines:
:mod:`.hostdrv_state` (constants, host syscalls, argument checks, the state
records), :mod:`.hostdrv_memory` (the memory calls, a mixin of :class:`HostDriver`),
:mod:`.hostdrv_streams` (streams, events, copies, running queued work, the host-side
test helpers: a mixin too) and this module (:class:`HostDriver`: its state, helpers,
init/device/context calls; failure injection).  Every name of the parts, private
ones included, is a name of this module: import from here.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

from cuda.bindings import driver as _cu
from sortedcontainers import SortedDict

from memspec.cuda_impl import hostdrv_memory, hostdrv_state, hostdrv_streams
from memspec.cuda_impl.hostdrv_state import (ACCESS_NONE, ACCESS_READ, Fault, MiB, R, SUCCESS, _Context, _Event,
    _Page, _Physical, _Stream, _i, _raise_nofile_limit, _sys_munmap)
from memspec.cuda_impl.hostdrv_memory import _MemoryCalls
from memspec.cuda_impl.hostdrv_streams import _StreamCalls

#: the modules this one is assembled from, in order; a name defined there is one
#: object, whichever module a caller reads it from, so a test that rebinds one
#: (``monkeypatch.setattr``) rebinds it in each module of :data:`PARTS` that has it and here
PARTS = (hostdrv_state, hostdrv_memory, hostdrv_streams)
# the face: every name of the parts, private ones included, is a name of this module, as before the split
for _part in PARTS:
    globals().update({_k: _v for _k, _v in vars(_part).items() if not _k.startswith("__")})
del _part


class HostDriver(_MemoryCalls, _StreamCalls):
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
