"""Owning handles: dropping one only enqueues its release.

Seed 000: *RAII is therefore workable, but Drop should be responsible for
enqueuing, not for synchronizing the whole GPU on an arbitrary thread or
freeing immediately.*  And a DeviceAllocation *must remember, or indirectly
reference: the allocator that created it; the corresponding device and
provider context; the queue/fence needed for safe release; the associated
charge or lease identity.*

A handle's release state lives in a separate :class:`_Release` object, so
``__del__`` (garbage collection, on whatever thread) can enqueue it without
resurrecting the handle.  The queued release runs, after every recorded
fence completes, through the **creator** mechanism (never the one installed
now: invariant S1), then refunds the Governor and unpins the context.

The release is resumable: each step (the ``before`` hooks, the free, each
refund, the unpin, each ``after`` hook) is marked done when it succeeds, so
a release that raises stays on the EP's queue and its retry continues where
it stopped -- nothing is done twice and nothing it holds is dropped.
"""

from __future__ import annotations

import threading
from typing import Callable

from memspec.spec.api import DeviceAllocation, Fence, Lease, VirtualAllocation
from memspec.spec.errors import DoubleFree, InvalidRequest, StaleHandle


class _Release:
    """What a handle's queued release does, and its bookkeeping."""

    def __init__(self, ep, governor, unpin: Callable[[], None]) -> None:
        self.ep = ep
        self.governor = governor
        self.unpin = unpin
        self.lock = threading.Lock()
        self.fences: dict[int, Fence] = {}      # stream -> latest fence using the memory
        self.leases: list[Lease] = []
        self.closed = False
        self.released = False
        self.freed_bytes = 0
        self.before: list[Callable[[], None]] = []   # run first (e.g. unmap a shared prefix)
        self.after: list[Callable[[int], None]] = []  # told the bytes freed
        self._done = {"before": 0, "freed": False, "refunded": 0, "after": 0}   # progress of the release

    def use(self, fence: Fence) -> None:
        if not isinstance(fence, Fence):
            raise InvalidRequest(f"expected a Fence, got {type(fence).__name__}")
        check = getattr(self.ep, "check_fence", None)
        if check is not None:
            check(fence)   # a fence of another EP could never be waited for here
        with self.lock:
            if self.closed:
                raise StaleHandle("use of a handle after it was dropped")
            old = self.fences.get(fence.stream)
            if old is None or fence.value > old.value:
                self.fences[fence.stream] = fence

    def pending_fences(self) -> list[Fence]:
        with self.lock:
            return [f for f in self.fences.values() if not self.ep.fence_done(f)]

    def close(self, free: Callable[[], int]) -> None:
        with self.lock:
            if self.closed:
                raise DoubleFree("handle already dropped (its release is queued or done)")
            self.closed = True
            fences = list(self.fences.values())

        done = self._done

        def run() -> None:   # resumable: a retry continues after the last step that succeeded
            while done["before"] < len(self.before):
                self.before[done["before"]]()
                done["before"] += 1
            if not done["freed"]:
                self.freed_bytes = free()
                done["freed"] = True
            while done["refunded"] < len(self.leases):
                self.governor.refund(self.leases[done["refunded"]])
                done["refunded"] += 1
            if not self.released:
                self.unpin()
                self.released = True
            while done["after"] < len(self.after):
                self.after[done["after"]](self.freed_bytes)
                done["after"] += 1

        self.ep.defer(fences, run)


class _Owning:
    """What both owning handles share: the holder's identity, the queued
    release in ``_r``, and RAII (``with`` and ``__del__`` only enqueue it
    through ``close``, which each kind defines)."""

    allocation: DeviceAllocation | VirtualAllocation
    _r: _Release

    def __init__(self, allocation, holder: str, mechanism_id: str, context_id: str,
                 ep, governor, unpin: Callable[[], None]) -> None:
        self.allocation = allocation
        self.holder = holder
        self.mechanism_id = mechanism_id
        self.context_id = context_id
        self._r = _Release(ep, governor, unpin)

    @property
    def address(self) -> int:
        return self.allocation.address

    def use(self, fence: Fence) -> None:
        """Record that device work completing at ``fence`` uses this memory."""
        self._r.use(fence)

    def pending_fences(self) -> list[Fence]:
        return self._r.pending_fences()

    def on_released(self, fn: Callable[[int], None]) -> None:
        self._r.after.append(fn)

    @property
    def closed(self) -> bool:
        return self._r.closed

    @property
    def released(self) -> bool:
        """The queued release has run (physical bytes freed, charge refunded)."""
        return self._r.released

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._r.closed:
            self.close()

    def __del__(self) -> None:
        try:
            if not self._r.closed:
                self.close()
        except Exception:  # noqa: BLE001 - a finalizer must never raise
            pass


class RefAllocation(_Owning):
    """``OwningAllocation``: an allocation made through a binding and charged to ``holder``."""

    def __init__(self, allocation: DeviceAllocation, holder: str, mechanism_id: str, context_id: str,
                 allocator, lease: Lease, ep, governor, unpin: Callable[[], None]) -> None:
        super().__init__(allocation, holder, mechanism_id, context_id, ep, governor, unpin)
        self.lease = lease
        self._allocator = allocator   # the creator: release goes back through it (S1)
        self._r.leases.append(lease)

    @property
    def footprint(self) -> int:
        return self.allocation.footprint

    def close(self) -> None:
        """Drop: enqueue the release on the EP's deferred-free queue. DoubleFree if repeated."""
        alloc, allocator = self.allocation, self._allocator
        self._r.close(lambda: allocator.deallocate(alloc))

    def __repr__(self) -> str:
        return f"RefAllocation({self.allocation.identity}, {self.holder}, {self.footprint} bytes)"


class RefReservation(_Owning):
    """``OwningReservation``: a holder's VA reservation and its charged commits.

    ``leases`` are the charges of its commits; a decommit refunds bytes from
    the newest ones.  Closing enqueues: release of the whole reservation
    through the creator's VirtualBacking, then refund of every lease.
    """

    def __init__(self, allocation: VirtualAllocation, holder: str, mechanism_id: str, context_id: str,
                 backing, ep, governor, unpin: Callable[[], None]) -> None:
        super().__init__(allocation, holder, mechanism_id, context_id, ep, governor, unpin)
        self.backing = backing        # the creator's VirtualBacking
        self.lock = threading.RLock()
        self.pages: set[int] = set()          # page offsets committed (and charged) through the binding
        self.decommitting: dict = {}          # page offset -> its queued decommit (still mapped)

    @property
    def leases(self) -> list[Lease]:
        return self._r.leases

    def committed(self) -> int:
        """Private bytes committed behind the reservation now, read from the
        backing, less pages whose decommit is queued (0 once released)."""
        if self._r.released:
            return 0
        with self.lock:
            pending = len(self.decommitting)
        return self.backing.committed_bytes(self.allocation) - pending * self.backing.granularity()

    def charged(self) -> int:
        gov = self._r.governor
        return sum(gov.lease_bytes(lease) for lease in self._r.leases)

    def fences(self) -> list[Fence]:
        with self._r.lock:
            return list(self._r.fences.values())

    def before_release(self, fn: Callable[[], None]) -> None:
        self._r.before.append(fn)

    def close(self) -> None:
        """Drop: enqueue release of the reservation (and refund). DoubleFree if repeated."""
        va, backing = self.allocation, self.backing
        self._r.close(lambda: backing.release(va))

    def __repr__(self) -> str:
        return f"RefReservation({self.allocation.identity}, {self.holder}, {self.allocation.size} bytes VA)"
