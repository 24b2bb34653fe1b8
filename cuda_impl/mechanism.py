"""The CUDA mechanism bundle with honest capabilities.

Seed 000: *only implementations that truly support address/backing
separation provide VirtualBacking; only implementations that truly support
physical-page sharing provide SharedMapping; when a capability is
unsupported, return an explicit absence or error rather than a successful
no-op.*  ``CudaMechanism(vmm=False)`` answers ``None`` for both.
"""

from __future__ import annotations

from memspec.spec.errors import ContextBusy
from memspec.cuda_impl.context import PrimaryContext
from memspec.cuda_impl.driver import Driver
from memspec.cuda_impl.eager import CudaEagerAllocator
from memspec.cuda_impl.shared import CudaSharedMapping
from memspec.cuda_impl.vmm import CudaVirtualBacking, VmmCore


class CudaMechanism:
    """``DeviceMemoryMechanism``: eager ``cuMemAlloc`` allocator (always),
    VMM ``VirtualBacking`` and ``SharedMapping`` (when ``vmm``).

    ``leak_creation_handles`` plants the cuda.core leak (mutants only)."""

    def __init__(
        self,
        drv: Driver,
        ctx: PrimaryContext | None = None,
        *,
        name: str | None = None,
        vmm: bool = True,
        shared: bool = True,
        leak_creation_handles: bool = False,
    ) -> None:
        self.drv = drv
        self.ctx = ctx or PrimaryContext(drv, 0)
        self.ctx.pin()          # the mechanism's own pin, dropped by close()
        self._closed = False
        kind = drv.kind
        self.name = name or (f"{kind}-vmm" if vmm else f"{kind}-eager")
        self.core = VmmCore(drv, self.ctx, kind=f"{kind}-vmm", leak_creation_handles=leak_creation_handles)
        self._allocator = CudaEagerAllocator(drv, self.ctx, self.core.gran, kind=f"{kind}-eager")
        self._vb = CudaVirtualBacking(self.core) if vmm else None
        self._sm = CudaSharedMapping(self.core) if (vmm and shared) else None

    def allocator(self) -> CudaEagerAllocator:
        return self._allocator

    def virtual_backing(self) -> CudaVirtualBacking | None:
        return self._vb

    def shared_mapping(self) -> CudaSharedMapping | None:
        return self._sm

    def granularity(self) -> int:
        return self.core.gran

    def live(self) -> int:
        """Live allocations, reservations and physical handles."""
        return len(self._allocator._live) + len(self.core.reservations) + len(self.core.handles)

    def close(self, *, force: bool = False) -> None:
        """Drop the mechanism's context pin.  ContextBusy while anything it made
        lives, unless ``force`` (teardown: frees everything first).  After
        close every call of its allocator, VirtualBacking and SharedMapping
        raises InvalidRequest (nothing re-retains the context); a second close
        is a no-op -- the first left nothing allocated, or raised and left the
        mechanism open, to be closed again."""
        if self._closed:
            return
        if self.live():
            if not force:
                raise ContextBusy(f"{self.name}: {self.live()} allocations/reservations/handles still live")
            self._teardown()
        if self.core._stream is not None:
            self.ctx.make_current()
            self.drv.cuStreamDestroy(self.core._stream)
            self.core._stream = None
        self.core.closed = self._allocator.closed = True
        self.ctx.unpin()
        self._closed = True

    def _teardown(self) -> None:
        core = self.core
        for r in list(core.reservations.values()):
            core.end_reservation(r)
        for h in list(core.handles.values()):
            if not h.released:
                self.drv.cuMemRelease(h.cu)
                h.released = True
            if h.mapped_pages == 0 and h.ph.identity in core.handles:
                del core.handles[h.ph.identity]
                self.ctx.unpin()
        for live in list(self._allocator._live.values()):
            self._allocator.deallocate(live.allocation)
