"""Host driver emulator: streams and events, copies, the device running queued work and the
host-side test helpers, a mixin of :class:`~memspec.cuda_impl.hostdrv.HostDriver`.

Part of :mod:`memspec.cuda_impl.hostdrv` (split along its sections, each module
under 1,200 lines); every name here is a name of that module: import from there.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

from cuda.bindings import driver as _cu

from memspec.cuda_impl.hostdrv_state import (ACCESS_READ, ACCESS_RW, Fault, HOSTALLOC_DEVICEMAP, R, SUCCESS,
    WAIT_AND, WAIT_EQ, WAIT_GEQ, WAIT_NOR, _Event, _Stream, _i, _n)


class _StreamCalls:
    """HostDriver's stream, event and copy calls and its execution model (its state and helpers are HostDriver's)."""

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
