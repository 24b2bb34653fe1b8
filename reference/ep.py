"""The Execution Provider: seed 000's *device context, stream, copy, kernel,
fence, release ordering* -- and not *global capacity policy*.

Work is asynchronous: ``write``/``fill``/``launch`` only enqueue on a stream of
the :class:`~.device.SimDevice` and return a :class:`Fence`; the device runs
it when its clock is advanced (:meth:`advance`, :meth:`run_until`,
:meth:`synchronize`, or :meth:`read`, which waits for its own copy).

The deferred-free queue is the release flow of seed 000::

    owning handle Drop -> enter the EP/context deferred-free queue
    -> wait for the related stream/fence to finish -> allocator actually frees
    -> update mapped-zone refund and Governor charge

:meth:`defer` only appends to a lock-free ``deque`` (safe from a garbage
collector finalizer on any thread, never blocks, never frees); :meth:`poll`
moves entries into the pending list and runs, outside any EP lock, the
releases whose fences have all completed.  Releases never run before their
fences (invariant S4) and run in submission order among the ready ones.  A
release that raises stays queued (in its place) and is retried by the next
:meth:`poll`: what it holds -- charge, device bytes, context pin -- is
released when it finally succeeds, never dropped with the error.

Streams and fences belong to the EP that made them: another EP's stream or
fence (they share one device's stream numbers) is refused with
InvalidRequest.  :meth:`close` drains the EP and refuses all later work
(InvalidRequest); a second close is a no-op.

Host copies check the page table when enqueued: a copy into a read-only page
raises ReadOnlyViolation and a copy touching an unmapped page raises
DeviceFault (both recorded on the device), nothing enqueued.  A kernel is
checked when it runs: a store into a read-only or unmapped page is then a
recorded DeviceFault (seed 000's peer: *a kernel store into a read-only page
is a sticky fault*).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Sequence

from memspec.spec.api import DeviceKey, Fence, new_creator_id
from memspec.spec.errors import ContextBusy, InvalidRequest, ReadOnlyViolation

from memspec.reference.common import is_int
from memspec.reference.device import SimDevice, WorkItem


class _Deferred:
    __slots__ = ("fences", "release", "seq")

    def __init__(self, fences: tuple[Fence, ...], release: Callable[[], object], seq: int) -> None:
        self.fences = fences
        self.release = release
        self.seq = seq


class ReferenceEP:
    """``ExecutionProvider`` over a :class:`SimDevice` (one provider context)."""

    def __init__(self, device: SimDevice, *, name: str = "reference-ep") -> None:
        self.sim = device
        self.context_id = new_creator_id(name)
        self.default_stream = device.new_stream()
        self._own: set[int] = {self.default_stream}   # streams made by this EP
        self.closed = False
        self._incoming: deque[_Deferred] = deque()   # appended lock-free by defer()
        self._pending: list[_Deferred] = []
        self._poll_lock = threading.Lock()
        self._seq = 0
        self.released = 0                 # releases run so far
        self.release_errors: list[BaseException] = []

    # -- context and streams --------------------------------------------

    def device(self) -> DeviceKey:
        return self.sim.key

    def new_stream(self) -> int:
        self._live()
        sid = self.sim.new_stream()
        self._own.add(sid)
        return sid

    def _live(self) -> None:
        if self.closed:
            raise InvalidRequest(f"execution provider {self.context_id} is closed")

    def _mine(self, stream: object) -> int:
        """``stream`` if this EP made it; InvalidRequest otherwise (closed EP,
        another EP's stream, not an int)."""
        self._live()
        if not is_int(stream) or stream not in self._own:
            raise InvalidRequest(f"stream {stream!r} was not made by this execution provider ({self.context_id})")
        return stream  # type: ignore[return-value]

    def check_fence(self, fence: object) -> Fence:
        """``fence`` if it is a Fence on one of this EP's streams; InvalidRequest otherwise."""
        if not isinstance(fence, Fence):
            raise InvalidRequest(f"expected a Fence, got {type(fence).__name__}")
        if not is_int(fence.stream) or fence.stream not in self._own:
            raise InvalidRequest(f"{fence!r} is on a stream this execution provider ({self.context_id}) did not make")
        return fence

    # -- copies and kernels (enqueue; return a fence) -------------------

    def _check_host_copy(self, address: object, size: int, *, write: bool) -> None:
        if not is_int(address):
            raise InvalidRequest(f"address must be an int, got {address!r}")
        fault = self.sim.check_access(address, size, write=write, what="copy")  # type: ignore[arg-type]
        if fault is None:
            return
        if fault.kind == "read_only":
            raise ReadOnlyViolation(str(fault)) from fault
        raise fault

    def write(self, stream: int, address: int, data: bytes) -> Fence:
        """Enqueue a host-to-device copy of ``data`` to ``address``."""
        self._mine(stream)
        if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) == 0:
            raise InvalidRequest("write takes non-empty bytes")
        data = bytes(data)
        self._check_host_copy(address, len(data), write=True)
        return self.sim.enqueue(stream, WorkItem("write", writes=((address, len(data)),), data=data))

    def fill(self, stream: int, address: int, size: int, byte: int) -> Fence:
        """Enqueue a memset of ``size`` bytes to ``byte``."""
        self._mine(stream)
        if not is_int(size) or size <= 0 or not is_int(byte) or not 0 <= byte < 256:
            raise InvalidRequest(f"fill needs size > 0 and a byte value, got {size!r}/{byte!r}")
        self._check_host_copy(address, size, write=True)
        return self.sim.enqueue(stream, WorkItem("fill", writes=((address, size),), byte=byte))

    def read(self, stream: int, address: int, size: int) -> bytes:
        """Device-to-host copy ordered after the stream's queued work; waits for it."""
        if not (type(stream) is int and type(address) is int and type(size) is int and size > 0
                and not self.closed and stream in self._own):   # (plain valid arguments: checked above at once)
            self._mine(stream)
            if not is_int(size) or size <= 0:
                raise InvalidRequest(f"read size must be an int > 0, got {size!r}")
            if not is_int(address):
                raise InvalidRequest(f"address must be an int, got {address!r}")
        data = self.sim.read_now(stream, address, size)  # nothing queued ahead: checked and run at once
        if data is not None:
            return data
        self._check_host_copy(address, size, write=False)
        item = WorkItem("read", reads=((address, size),))
        fence = self.sim.enqueue(stream, item)
        self.sim.run_until(fence)
        if item.fault is not None:
            raise item.fault
        return item.result[0]

    @staticmethod
    def _ranges(ranges: Sequence[tuple[int, int]], what: str) -> tuple[tuple[int, int], ...]:
        if not isinstance(ranges, (list, tuple)):
            raise InvalidRequest(f"{what} ranges must be a list of (address, size) pairs, got {type(ranges).__name__}")
        out = []
        for r in ranges:
            if not (isinstance(r, tuple) and len(r) == 2 and is_int(r[0]) and is_int(r[1]) and r[1] > 0):
                raise InvalidRequest(f"{what} range must be (address, size > 0), got {r!r}")
            out.append(r)
        return tuple(out)

    def launch(
        self,
        stream: int,
        reads: Sequence[tuple[int, int]],
        writes: Sequence[tuple[int, int]],
        *,
        pattern: int = 0x5A,
    ) -> Fence:
        """Enqueue a stand-in kernel: when it runs it reads every ``reads``
        range (see :meth:`kernel_result`) and fills every ``writes`` range with ``pattern``."""
        self._mine(stream)
        if not is_int(pattern):
            raise InvalidRequest(f"pattern must be an int, got {pattern!r}")
        item = WorkItem("kernel", reads=self._ranges(reads, "read"), writes=self._ranges(writes, "write"), byte=pattern & 0xFF)
        return self.sim.enqueue(stream, item)

    def kernel_result(self, fence: Fence) -> list[bytes] | None:
        """The bytes the kernel completing at ``fence`` read, once it has run."""
        return self.sim.result(self.check_fence(fence))

    # -- fences and the clock -------------------------------------------

    def record(self, stream: int | None = None) -> Fence:
        """A fence after everything enqueued so far on ``stream``."""
        return self.sim.current_fence(self.default_stream if stream is None else self._mine(stream))

    def fence_done(self, fence: Fence) -> bool:
        return self.sim.fence_done(self.check_fence(fence))

    def advance(self, stream: int, n: int = 1) -> int:
        """Run up to ``n`` queued items of ``stream`` (the explicit device clock)."""
        return self.sim.advance(self._mine(stream), n)

    def run_until(self, fence: Fence) -> None:
        self.sim.run_until(self.check_fence(fence))

    def synchronize(self, stream: int | None = None) -> None:
        """Let the device run the stream's (or every stream's) queued work.
        Does not run deferred releases: that is :meth:`poll`."""
        if stream is None:
            self._live()
            for sid in sorted(self._own):
                self.sim.synchronize(sid)
        else:
            self.sim.synchronize(self._mine(stream))

    # -- deferred-free queue --------------------------------------------

    def defer(self, fences: Sequence[Fence], release: Callable[[], object]) -> None:
        """Queue ``release`` behind ``fences``. Only enqueues: safe from any
        thread, including a garbage-collector finalizer; never blocks, never frees."""
        self._live()
        fs = tuple(fences)
        for f in fs:
            self.check_fence(f)
        if not callable(release):
            raise InvalidRequest("defer needs a callable release")
        self._seq += 1   # only used for ordering among ready releases; races are harmless
        self._incoming.append(_Deferred(fs, release, self._seq))

    def _ready(self, d: _Deferred) -> bool:
        return all(self.sim.fence_done(f) for f in d.fences)

    def poll(self) -> int:
        """Run the queued releases whose fences are done; return how many ran.
        A release that raises stays queued, in its place, and is retried by
        the next poll (nothing it holds is lost); the error is recorded in
        :attr:`release_errors` and the first one re-raised after the others
        have run."""
        with self._poll_lock:
            while self._incoming:
                self._pending.append(self._incoming.popleft())
            ready, waiting = [], []
            for d in self._pending:
                (ready if self._ready(d) else waiting).append(d)
            self._pending = waiting
        errors = []
        failed = []
        for d in ready:
            try:
                d.release()
            except BaseException as e:  # noqa: BLE001 - recorded, re-raised below
                errors.append(e)
                failed.append(d)
        if failed:
            with self._poll_lock:   # back in submission order, ahead of later entries
                self._pending = sorted(failed + self._pending, key=lambda d: d.seq)
        ran = len(ready) - len(failed)
        self.released += ran
        if errors:
            self.release_errors.extend(errors)
            raise errors[0]
        return ran

    def pending_releases(self) -> int:
        with self._poll_lock:
            return len(self._pending) + len(self._incoming)

    def close(self) -> None:
        """Run all device work and every queued release, then refuse all later
        work (InvalidRequest).  A release that still fails is raised and the
        EP stays open (close again to retry); a second close is a no-op."""
        if self.closed:
            return
        if self._incoming or self._pending or self.sim.queued():
            self.drain()
        if self.pending_releases():
            raise ContextBusy(f"{self.context_id}: {self.pending_releases()} releases still queued")
        self.closed = True

    def drain(self) -> int:
        """Run all device work, then every queued release (tests and teardown)."""
        if self.closed:
            return 0
        self.synchronize()
        n = 0
        while self.pending_releases():
            ran = self.poll()
            n += ran
            if not ran:
                self.synchronize()
                if not self.poll() and self.pending_releases():
                    break
        return n
