"""``cupy-pool``: CuPy's device ``MemoryPool`` as a seed-000 DeviceAllocator.  GPU only.

``allocate`` is ``pool.malloc(size)`` (a ``MemoryPointer``), ``deallocate``
drops the adapter's reference to it (CuPy returns the block to the pool when
the pointer dies).  The handle identities are the adapter's (CuPy has none:
a ``MemoryPointer`` is freed by garbage collection, never twice), so foreign,
double and stale frees are refused by this bookkeeping.  ``capacity`` is
``pool.set_limit(size=capacity)``.

No physical-bytes probe: the pool keeps freed blocks cached (that is its
job), so the device's free memory says nothing about what a deallocate
returned; S5's physical check is N/A here.  The target's EP is memspec's CUDA
EP on the same primary context, so data-integrity checks copy through the
driver into CuPy's memory.
"""

from __future__ import annotations

import threading
from typing import Any

from memspec.spec.api import AllocationRequest, DeviceAllocation, DeviceKey, IdentitySource, TargetInstance
from memspec.spec.errors import DoubleFree, ForeignAllocation, InvalidRequest, OutOfMemory, StaleHandle

from memspec.adapters._common import require_gpu, require_module


class CupyAllocator:
    """``DeviceAllocator`` over one ``cupy.cuda.MemoryPool``."""

    def __init__(self, cupy: Any, pool: Any) -> None:
        self.cupy = cupy
        self.pool = pool
        self.ids = IdentitySource("cupy-pool")
        self.live: dict[Any, Any] = {}
        self.freed: set[Any] = set()
        self.key = DeviceKey("cuda", 0)
        self.lock = threading.Lock()

    def device(self) -> DeviceKey:
        return self.key

    def allocate(self, request: AllocationRequest) -> DeviceAllocation:
        size = request.size
        with self.lock:
            try:
                mem = self.pool.malloc(size)
            except self.cupy.cuda.memory.OutOfMemoryError as e:
                raise OutOfMemory(f"cupy MemoryPool.malloc({size}): {e}") from None
            except (TypeError, ValueError, OverflowError) as e:
                raise InvalidRequest(f"cupy MemoryPool.malloc({size!r}): {type(e).__name__}: {e}") from None
            ident = self.ids.new()
            self.live[ident] = mem
            footprint = int(getattr(mem.mem, "size", size))
            return DeviceAllocation(int(mem.ptr), size, footprint, ident, self.key)

    def deallocate(self, allocation: DeviceAllocation) -> int:
        if not isinstance(allocation, DeviceAllocation):
            raise InvalidRequest(f"expected a DeviceAllocation, got {type(allocation).__name__}")
        with self.lock:
            ident = allocation.identity
            if ident.creator != self.ids.creator:
                raise ForeignAllocation(f"{ident} was not made by {self.ids.creator}")
            mem = self.live.pop(ident, None)
            if mem is None:
                raise DoubleFree(f"{ident} was already freed") if ident in self.freed else StaleHandle(str(ident))
            self.freed.add(ident)
            del mem  # the pool takes the block back when the MemoryPointer dies
            return allocation.footprint

    def close(self) -> None:
        with self.lock:
            self.live.clear()
        self.pool.free_all_blocks()


class CupyMechanism:
    def __init__(self, alloc: CupyAllocator) -> None:
        self.name = "cupy-pool"
        self._alloc = alloc

    def allocator(self) -> CupyAllocator:
        return self._alloc

    def virtual_backing(self) -> None:
        return None

    def shared_mapping(self) -> None:
        return None


def _with_extras(inst: TargetInstance, **extras: Any) -> TargetInstance:
    """The only place this adapter fills ``TargetInstance`` beyond the constructor keywords."""
    inst.extras = dict(extras)
    return inst


def cupy_pool(capacity: int | None = None) -> TargetInstance:
    """A fresh ``cupy.cuda.MemoryPool`` on device 0 (GPU only)."""
    cupy = require_module("cupy", "cupy-pool")
    require_gpu("cupy-pool")
    from memspec.cuda_impl.context import PrimaryContext
    from memspec.cuda_impl.driver import open_driver
    from memspec.cuda_impl.ep import CudaExecutionProvider

    cupy.cuda.Device(0).use()
    drv = open_driver("cuda")
    ep = CudaExecutionProvider(drv, PrimaryContext(drv, 0))
    made: list[CupyAllocator] = []

    def make() -> CupyMechanism:
        pool = cupy.cuda.MemoryPool()
        if capacity is not None:
            pool.set_limit(size=int(capacity))
        a = CupyAllocator(cupy, pool)
        made.append(a)
        return CupyMechanism(a)

    def close() -> None:
        for a in made:
            a.close()
        ep.close(force=True)

    free, total = drv.mem_info()
    cap = (free - free % (2 << 20)) if capacity is None else min(int(capacity), total)
    inst = TargetInstance(mechanism=make(), ep=ep, physical_bytes=None, capacity=cap, close=close)
    return _with_extras(inst, make_foreign=make)
