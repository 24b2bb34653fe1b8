"""``ExecutionProvider`` on CUDA streams and events.

Seed 000: *device context, stream, copy, kernel, fence, release ordering*.

* Context: the provider pins the device's primary context for its lifetime,
  and each queued release adds a pin until it has run, so the context
  outlives every allocation and queued release (S10).  ``close`` raises
  ContextBusy while releases are queued.
* Streams: ``new_stream`` creates a non-blocking ``CUstream``; stream 0 is the
  provider's first stream (not CUDA's legacy null stream).
* Fences: ``Fence(stream, value)`` is the ``value``-th piece of work enqueued
  on the provider's stream; each is a ``CUevent`` recorded right after that
  work.  ``fence_done`` asks ``cuEventQuery`` (NOT_READY -> False); stream
  order makes every earlier fence of the stream done too.
* Copies: ``write`` stages the bytes in pinned host memory
  (``cuMemHostAlloc``) and enqueues ``cuMemcpyHtoDAsync`` (a pageable source
  could make the driver synchronize with a held stream); the staging buffer
  lives until the fence.  Host memory is bounded: at most ``STAGED_CAP``
  (16 MiB) of write data is staged per stream -- a write that would pass it
  first frees what completed fences allow, then waits for the stream (unless
  a ``hold`` gate keeps it, where waiting could not finish).  ``read`` enqueues ``cuMemcpyDtoHAsync`` into pinned
  memory and synchronizes the stream.  A write into a page whose access is
  ``PROT_READ`` (``cuMemGetAccess``) raises ReadOnlyViolation before anything
  is enqueued.
* Kernels: ``launch`` is a stand-in kernel built from copies, the same on the
  emulator and on a GPU: it touches every mapping page (granule) of each
  range it names -- one byte per page, at the range's start and at each page
  boundary inside it: read ranges are copied device-to-host into a pinned
  scratch byte, write ranges are read and written back unchanged (DtoH then
  HtoD of the same byte), in stream order.  Faults are per page (the
  driver's page table is), so it faults exactly where a kernel touching the
  whole range would: on an unmapped page, or a read-only one for writes; and
  it leaves data as it was.  Host memory is bounded: one 64-byte pinned
  scratch per stream, whatever the kernel's size; and it does not make the
  host touch device bytes the program never wrote (on the emulator, device
  memory is host memory: copying whole ranges made every page resident).
* Deferred free: ``defer(fences, release)`` only enqueues; ``poll`` runs, in
  order, the releases all of whose fences ``cuEventQuery`` reports complete.
  Nothing is unmapped under queued work (the cuda.core bug).  A release that
  raises stays queued, in its place, with its context pin, and is retried by
  the next ``poll``.
* Lifetime: after ``close`` every call raises InvalidRequest (the provider
  is closed); a second ``close`` is a no-op (the first one freed everything,
  or raised and left the provider open to be closed again).
* Holding a stream (tests): ``hold(stream)`` enqueues ``cuStreamWaitValue32``
  on a host-mapped word (``cuMemHostAlloc(DEVICEMAP)`` +
  ``cuMemHostGetDevicePointer``); ``gate.open()`` writes the word from the host.
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from memspec.spec.api import DeviceKey, Fence, new_creator_id
from memspec.spec.errors import (
    ContextBusy,
    DeviceFault,
    InvalidRequest,
    MemspecError,
    ReadOnlyViolation,
    Unsupported,
)
from memspec.cuda_impl.context import PrimaryContext
from memspec.cuda_impl.driver import CudaError, Driver, error_for

CU_STREAM_NON_BLOCKING = 1
CU_EVENT_DISABLE_TIMING = 2

#: chunk of a ``read`` (the pinned buffer it copies through)
SCRATCH = 1 << 21
#: pinned scratch of each stream for the stand-in kernel's one-byte probes (reused in stream order)
KERNEL_SCRATCH = 64
#: most bytes of ``write`` data staged in pinned memory per stream while their copies are queued
STAGED_CAP = 16 << 20


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass
class _Stream:
    cu: Any
    issued: int = 0                                    # last fence value handed out
    done: int = 0                                      # every fence <= done is complete
    fences: deque = field(default_factory=deque)       # (value, event) not yet known complete
    staging: deque = field(default_factory=deque)      # (value, host ptr, bytes) freed once value is done
    staged: int = 0                                    # bytes in ``staging``
    scratch: int = 0                                   # the stream's kernel scratch (SCRATCH bytes), 0 until used


@dataclass
class _Deferred:
    fences: tuple[Fence, ...]
    release: Callable[[], object]


class StreamGate:
    """A stream held by ``cuStreamWaitValue32(word >= 1)``; ``open()`` lets it go."""

    def __init__(self, ep: "CudaExecutionProvider", stream: int, word: int) -> None:
        self.ep = ep
        self.stream = stream
        self.word = word
        self.is_open = False

    def open(self) -> None:
        """Write 1 into the host-mapped word from the host (as ctypes would on a GPU)."""
        ctypes.c_uint32.from_address(self.word).value = 1
        self.is_open = True


class CudaExecutionProvider:
    """``ExecutionProvider`` over a checked :class:`~memspec.cuda_impl.driver.Driver`."""

    def __init__(self, drv: Driver, ctx: PrimaryContext | None = None) -> None:
        self.drv = drv
        self.ctx = ctx or PrimaryContext(drv, 0)
        self.context_id = new_creator_id(f"{drv.kind}-ep")
        self._key = DeviceKey(drv.kind, self.ctx.ordinal)
        self._lock = threading.RLock()
        self.ctx.pin()
        self._closed = False
        t = drv.types
        prop = drv.allocation_prop(self.ctx.ordinal)
        self._gran = int(drv.cuMemGetAllocationGranularity(
            prop, t.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
        self._loc = t.CUmemLocation()
        self._loc.type = t.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self._loc.id = self.ctx.ordinal
        self._prot_read = int(t.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ)
        self._not_ready = t.CUresult.CUDA_ERROR_NOT_READY
        self._success = t.CUresult.CUDA_SUCCESS
        self._streams: list[_Stream] = []
        self._spare_events: list[Any] = []
        self._queue: deque[_Deferred] = deque()
        self._gates: list[StreamGate] = []
        self.new_stream()

    # -- basics ---------------------------------------------------------
    def device(self) -> DeviceKey:
        return self._key

    def granularity(self) -> int:
        return self._gran

    def new_stream(self) -> int:
        with self._lock:
            self._live()
            self.ctx.make_current()
            cu = self.drv.cuStreamCreate(CU_STREAM_NON_BLOCKING)
            self._streams.append(_Stream(cu))
            return len(self._streams) - 1

    def _live(self) -> None:
        if self._closed:
            raise InvalidRequest(f"execution provider {self.context_id} is closed")

    def _stream(self, stream: Any) -> _Stream:
        self._live()
        if not _is_int(stream) or not 0 <= stream < len(self._streams):
            raise InvalidRequest(f"unknown stream {stream!r}")
        return self._streams[stream]

    def _check_fence(self, fence: Any) -> _Stream:
        if not isinstance(fence, Fence):
            raise InvalidRequest(f"expected a Fence, got {type(fence).__name__}")
        s = self._stream(fence.stream)
        if not _is_int(fence.value) or not 0 <= fence.value <= s.issued:
            raise InvalidRequest(f"{fence} was never issued (stream {fence.stream} is at {s.issued})")
        return s

    def _event(self) -> Any:
        if self._spare_events:
            return self._spare_events.pop()
        return self.drv.cuEventCreate(CU_EVENT_DISABLE_TIMING)

    def _fence(self, index: int, s: _Stream, staging: Sequence[tuple[int, int]] = ()) -> Fence:
        ev = self._event()
        self.drv.cuEventRecord(ev, s.cu)
        s.issued += 1
        s.fences.append((s.issued, ev))
        for p, n in staging:
            s.staging.append((s.issued, p, n))
            s.staged += n
        return Fence(index, s.issued)

    def _completed(self, s: _Stream, value: int) -> None:
        """Every fence of ``s`` up to ``value`` is complete: recycle and free."""
        s.done = max(s.done, value)
        while s.fences and s.fences[0][0] <= s.done:
            self._spare_events.append(s.fences.popleft()[1])
        while s.staging and s.staging[0][0] <= s.done:
            _, p, n = s.staging.popleft()
            s.staged -= n
            self.drv.cuMemFreeHost(p)

    def _pinned(self, n: int) -> int:
        return int(self.drv.cuMemHostAlloc(max(n, 1), 0))

    @staticmethod
    def _fault(e: CudaError, what: str, address: int) -> DeviceFault:
        if isinstance(e, DeviceFault):
            return e
        if e.name == "CUDA_ERROR_INVALID_VALUE":
            return DeviceFault(f"{what} at {address:#x}: {e} (not mapped device memory)", address=address, kind="unmapped")
        raise e

    def _check_writable(self, address: int, size: int) -> None:
        """ReadOnlyViolation if any VMM page of the range is mapped ``PROT_READ``."""
        g = self._gran
        page = address - address % g
        while page < address + size:
            res, flags = self.drv.backend.cuMemGetAccess(self._loc, page)
            if res == self._success and int(flags) == self._prot_read:
                raise ReadOnlyViolation(f"write to {address:#x}+{size}: page {page:#x} is mapped read-only")
            page += g

    @staticmethod
    def _ranges(ranges: Any, what: str) -> list[tuple[int, int]]:
        if not isinstance(ranges, (list, tuple)):
            raise InvalidRequest(f"{what} must be a list of (address, size) pairs, got {type(ranges).__name__}")
        out = []
        for r in ranges:
            if not (isinstance(r, (tuple, list)) and len(r) == 2 and _is_int(r[0]) and _is_int(r[1]) and r[1] >= 0):
                raise InvalidRequest(f"{what} must be (address, size) pairs of ints, got {r!r}")
            out.append((r[0], r[1]))
        return out

    def _probes(self, address: int, size: int):
        """One address in every mapping page of ``[address, address+size)``:
        the start, then each page boundary inside the range."""
        if size > 0:
            yield address
            g = self._gran
            yield from range(address - address % g + g, address + size, g)

    # -- work -----------------------------------------------------------
    def write(self, stream: int, address: int, data: bytes) -> Fence:
        """Enqueue a host-to-device copy of ``data`` (staged in pinned memory)."""
        with self._lock:
            s = self._stream(stream)
            if not _is_int(address):
                raise InvalidRequest(f"address must be an int, got {address!r}")
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise InvalidRequest(f"write takes bytes, got {type(data).__name__}")
            data = bytes(data)
            n = len(data)
            staging: list[int] = []
            if n:
                self._check_writable(address, n)
                self.ctx.make_current()
                self._bound_staging(stream, s, n)
                p = self._pinned(n)
                ctypes.memmove(p, data, n)
                try:
                    self.drv.cuMemcpyHtoDAsync(address, p, n, s.cu)
                except CudaError as e:
                    self.drv.cuMemFreeHost(p)
                    raise self._fault(e, "write", address) from e
                staging.append((p, n))
            return self._fence(stream, s, staging)

    def _bound_staging(self, index: int, s: _Stream, n: int) -> None:
        """Keep the stream's staged write bytes within ``STAGED_CAP``: free
        what completed fences allow, then wait for the stream's queued work
        (not while a gate holds it: that wait could not end)."""
        if s.staged + n <= STAGED_CAP or not s.staging:
            return
        self.fence_done(Fence(index, s.issued))
        if s.staged + n > STAGED_CAP and s.staging and not any(
                g.stream == index and not g.is_open for g in self._gates):
            self._sync(s)

    def read(self, stream: int, address: int, size: int) -> bytes:
        """Device-to-host copy after the stream's queued work; waits for it."""
        with self._lock:
            s = self._stream(stream)
            if not (_is_int(address) and _is_int(size)) or size < 0:
                raise InvalidRequest(f"read needs int address and size >= 0, got {address!r}, {size!r}")
            if size == 0:
                return b""
            self.ctx.make_current()
            k = min(size, SCRATCH)
            p = self._pinned(k)   # bounded: the copy runs in chunks through it
            out = bytearray()
            try:
                for off in range(0, size, k):
                    n = min(k, size - off)
                    try:
                        self.drv.cuMemcpyDtoHAsync(p, address + off, n, s.cu)
                    except CudaError as e:
                        raise self._fault(e, "read", address + off) from e
                    self._sync(s)
                    out += ctypes.string_at(p, n)
                return bytes(out)
            finally:
                self.drv.cuMemFreeHost(p)

    def launch(self, stream: int, reads: Sequence[tuple[int, int]], writes: Sequence[tuple[int, int]]) -> Fence:
        """Enqueue the stand-in kernel: read every ``reads`` range, read and
        write back every ``writes`` range, in stream order."""
        with self._lock:
            s = self._stream(stream)
            rs, ws = self._ranges(reads, "reads"), self._ranges(writes, "writes")
            for a, n in ws:
                if n:
                    self._check_writable(a, n)
            self.ctx.make_current()
            error: BaseException | None = None
            try:
                if (rs or ws) and not s.scratch:
                    s.scratch = self._pinned(KERNEL_SCRATCH)
                for a, n in rs:
                    for p in self._probes(a, n):
                        try:
                            self.drv.cuMemcpyDtoHAsync(s.scratch, p, 1, s.cu)
                        except CudaError as e:
                            raise self._fault(e, "kernel read", p) from e
                for a, n in ws:
                    for p in self._probes(a, n):
                        try:
                            self.drv.cuMemcpyDtoHAsync(s.scratch, p, 1, s.cu)
                        except CudaError as e:
                            raise self._fault(e, "kernel read", p) from e
                        try:
                            self.drv.cuMemcpyHtoDAsync(p, s.scratch, 1, s.cu)
                        except CudaError as e:
                            raise self._fault(e, "kernel write", p) from e
            except MemspecError as e:
                error = e
            fence = self._fence(stream, s)   # what was enqueued stays ordered
            if error is not None:
                raise error
            return fence

    def fence_done(self, fence: Fence) -> bool:
        with self._lock:
            s = self._check_fence(fence)
            if fence.value <= s.done:
                return True
            self.ctx.make_current()
            while s.fences and s.fences[0][0] <= fence.value:
                value, ev = s.fences[0]
                res = self.drv.query("cuEventQuery", ev)
                if res == self._not_ready:
                    return False
                if res != self._success:
                    raise error_for(res, "cuEventQuery")
                self._completed(s, value)
            return fence.value <= s.done

    def _sync(self, s: _Stream) -> None:
        res = self.drv.query("cuStreamSynchronize", s.cu)
        if res == self._success or getattr(res, "name", "") == "CUDA_ERROR_ILLEGAL_ADDRESS":
            self._completed(s, s.issued)
        self.drv.check(res, "cuStreamSynchronize")

    def synchronize(self, stream: int | None = None) -> None:
        """Wait until the stream's (or every stream's) queued work has run."""
        with self._lock:
            self._live()
            self.ctx.make_current()
            targets = self._streams if stream is None else [self._stream(stream)]
            first: BaseException | None = None
            for s in targets:
                try:
                    self._sync(s)
                except CudaError as e:
                    first = first or e
            if first is not None:
                raise first

    # -- deferred free ----------------------------------------------------
    def defer(self, fences: Sequence[Fence], release: Callable[[], object]) -> None:
        """Enqueue ``release`` behind ``fences``; never runs it now (a drop only enqueues)."""
        with self._lock:
            self._live()
            fences = tuple(fences)
            for f in fences:
                self._check_fence(f)
            if not callable(release):
                raise InvalidRequest("release must be callable")
            self.ctx.pin()   # the context outlives the queued release
            self._queue.append(_Deferred(fences, release))

    def _ready(self, d: _Deferred) -> bool:
        return all(self.fence_done(f) for f in d.fences)

    def poll(self) -> int:
        """Run, in order, every queued release whose fences are all complete.
        The releases run outside the provider's lock (they call into the
        mechanism and the accounting roles, which may call back into the EP)."""
        errors: list[BaseException] = []
        with self._lock:
            self._live()
            ready: list[_Deferred] = []
            keep: deque[_Deferred] = deque()
            while self._queue:
                d = self._queue.popleft()
                try:
                    ok = self._ready(d)
                except DeviceFault as e:
                    errors.append(e)
                    ok = False
                (ready if ok else keep).append(d)
            self._queue = keep
        failed: list[_Deferred] = []
        for d in ready:
            try:
                d.release()
            except BaseException as e:  # stays queued (with its pin) and is retried
                errors.append(e)
                failed.append(d)
            else:
                self.ctx.unpin()
        if failed:
            with self._lock:   # ahead of everything queued after them, in order
                self._queue.extendleft(reversed(failed))
        if errors:
            raise errors[0]
        return len(ready) - len(failed)

    def pending_releases(self) -> int:
        with self._lock:
            return len(self._queue)

    # -- stream gate -------------------------------------------------------
    def hold(self, stream: int) -> StreamGate:
        """Hold ``stream``: later work waits until ``gate.open()``."""
        with self._lock:
            s = self._stream(stream)
            self.ctx.make_current()
            t = self.drv.types
            word = int(self.drv.cuMemHostAlloc(4, int(t.CU_MEMHOSTALLOC_DEVICEMAP)))
            ctypes.c_uint32.from_address(word).value = 0
            dptr = self.drv.cuMemHostGetDevicePointer(word, 0)
            try:
                self.drv.cuStreamWaitValue32(s.cu, dptr, 1, int(t.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ))
            except CudaError as e:
                self.drv.cuMemFreeHost(word)
                if e.name == "CUDA_ERROR_NOT_SUPPORTED":
                    raise Unsupported("stream memory operations (cuStreamWaitValue32) are not supported") from e
                raise
            gate = StreamGate(self, stream, word)
            self._gates.append(gate)
            return gate

    # -- lifetime -----------------------------------------------------------
    def close(self, *, force: bool = False) -> None:
        """Tear down streams and events and drop the context pin.  ContextBusy
        while releases are queued, unless ``force`` (then gates are opened,
        streams drained and the queue run first)."""
        with self._lock:
            if self._closed:
                return
            if self._queue and not force:
                raise ContextBusy(f"{self.context_id}: {len(self._queue)} releases still queued")
            for g in self._gates:
                if not g.is_open:
                    if not force:
                        raise ContextBusy(f"{self.context_id}: stream {g.stream} is still held")
                    g.open()
            errors: list[BaseException] = []
            try:
                self.synchronize()
            except MemspecError as e:
                errors.append(e)
            try:
                self.poll()
            except BaseException as e:
                errors.append(e)
            if self._queue:
                raise ContextBusy(f"{self.context_id}: {len(self._queue)} releases could not run")
            self.ctx.make_current()
            for s in self._streams:
                for _, ev in s.fences:
                    self.drv.cuEventDestroy(ev)
                s.fences.clear()
                while s.staging:
                    self.drv.cuMemFreeHost(s.staging.popleft()[1])
                s.staged = 0
                if s.scratch:
                    self.drv.cuMemFreeHost(s.scratch)
                    s.scratch = 0
                self.drv.cuStreamDestroy(s.cu)
            for ev in self._spare_events:
                self.drv.cuEventDestroy(ev)
            self._spare_events.clear()
            for g in self._gates:
                self.drv.cuMemFreeHost(g.word)
            self._gates.clear()
            self._closed = True
            self.ctx.unpin()
            if errors and not force:
                raise errors[0]
