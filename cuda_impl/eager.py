"""Eager ``DeviceAllocator`` on ``cuMemAlloc``/``cuMemFree``.

Seed 000: *An ordinary eager allocator takes the full physical capacity when
the allocation is created.*  Requests are rounded up to the device's mapping
granularity before ``cuMemAlloc`` (so the footprint reported is the bytes the
driver really takes, which ``cuMemGetInfo`` can confirm); an alignment larger
than the granularity is met by over-allocating ``alignment - granularity``
bytes and aligning the returned address inside, and the footprint says so.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from memspec.spec.api import AllocationRequest, DeviceAllocation, DeviceKey, IdentitySource, is_power_of_two
from memspec.spec.errors import DoubleFree, ForeignAllocation, InvalidRequest, OutOfMemory, StaleHandle
from memspec.cuda_impl.context import PrimaryContext
from memspec.cuda_impl.driver import CudaError, CudaOutOfMemory, Driver
from memspec.cuda_impl.vmm import _is_int, check_identity, round_up


@dataclass
class _Live:
    allocation: DeviceAllocation
    base: int


class CudaEagerAllocator:
    """``DeviceAllocator`` whose every allocation is one ``cuMemAlloc``."""

    def __init__(self, drv: Driver, ctx: PrimaryContext, granularity: int, *, kind: str = "cuda-eager") -> None:
        self._drv = drv
        self._ctx = ctx
        self._gran = granularity
        self._key = DeviceKey(drv.kind, ctx.ordinal)
        self._ids = IdentitySource(kind)
        self._live: dict[Any, _Live] = {}
        self._issued = 0
        self._lock = threading.Lock()
        self.closed = False   # set by the mechanism's close()

    def device(self) -> DeviceKey:
        return self._key

    def _live_check(self) -> None:
        if self.closed:
            raise InvalidRequest(f"allocator {self._ids.creator} is closed (its mechanism was closed)")

    def live_bytes(self) -> int:
        with self._lock:
            return sum(x.allocation.footprint for x in self._live.values())

    def allocate(self, request: AllocationRequest) -> DeviceAllocation:
        """Take ``footprint >= request.size`` bytes now.  Raises InvalidRequest, OutOfMemory."""
        self._live_check()
        if not isinstance(request, AllocationRequest):
            raise InvalidRequest(f"expected an AllocationRequest, got {type(request).__name__}")
        size, alignment = request.size, request.alignment
        if not _is_int(size) or size <= 0:
            raise InvalidRequest(f"size must be a positive int, got {size!r}")
        if not is_power_of_two(alignment):
            raise InvalidRequest(f"alignment must be a power of two, got {alignment!r}")
        g = self._gran
        footprint = round_up(size + max(0, alignment - g), g)
        with self._lock:
            self._ctx.pin()
            try:
                self._ctx.make_current()
                base = int(self._drv.cuMemAlloc(footprint))
            except CudaOutOfMemory as e:
                self._ctx.unpin()
                try:
                    free, total = self._drv.mem_info()
                except CudaError:
                    free = total = None
                raise OutOfMemory(
                    f"CUDA out of memory: cuMemAlloc could not get {footprint} bytes (free {free} of {total})",
                    requested=size, free=free, total_capacity=total, device=self._ctx.ordinal) from e
            except BaseException:
                self._ctx.unpin()
                raise
            address = round_up(base, alignment)
            a = DeviceAllocation(address, size, footprint, self._ids.new(), self._key)
            self._issued = a.identity.generation
            self._live[a.identity] = _Live(a, base)
            return a

    def deallocate(self, allocation: DeviceAllocation) -> int:
        """``cuMemFree`` an allocation this allocator made; return its footprint."""
        self._live_check()
        if not isinstance(allocation, DeviceAllocation):
            raise InvalidRequest(f"expected a DeviceAllocation, got {type(allocation).__name__}")
        ident = allocation.identity
        check_identity(ident, self._ids.creator, "allocation")
        with self._lock:
            live = self._live.get(ident)
            if live is None:
                if ident.generation <= self._issued:
                    raise DoubleFree(f"allocation {ident} was already freed")
                raise StaleHandle(f"allocation {ident} was never issued by this allocator")
            a = live.allocation
            if (a.address, a.size, a.footprint, a.device) != (allocation.address, allocation.size,
                                                               allocation.footprint, allocation.device):
                raise StaleHandle(f"allocation {ident} does not match the live one")
            self._ctx.make_current()
            self._drv.cuMemFree(live.base)
            del self._live[ident]
            self._ctx.unpin()
            return live.allocation.footprint
