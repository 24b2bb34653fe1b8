"""A mechanism-level target: a page-granular eager allocator on a toy device.

``memspec conform docs.examples.mechanism_target:target`` checks it at the
mechanism level and at the system level (the reference roles wired around
it).  It has no VirtualBacking, no SharedMapping and no EP: those actions,
and the data checks that copy through an EP, are N/A with the reason.
"""

from __future__ import annotations

import threading

from memspec.spec.api import (AllocationRequest, AllocatorGeometry, DeviceAllocation, DeviceKey, IdentitySource, MiB,
                              TargetInstance, is_power_of_two)
from memspec.spec.errors import DoubleFree, ForeignAllocation, InvalidRequest, OutOfMemory, StaleHandle

PAGE = 2 * MiB


class ToyDevice:
    """Physical pages, shared by every allocator on the device."""

    def __init__(self, capacity: int) -> None:
        self.key = DeviceKey("toy")
        self.capacity = capacity - capacity % PAGE
        self.free_pages = list(range(self.capacity // PAGE - 1, -1, -1))   # page numbers, lowest last
        self.lock = threading.Lock()

    def used(self) -> int:
        """The physical bytes in use (the target's ``physical_bytes`` probe)."""
        return self.capacity - len(self.free_pages) * PAGE


class EagerAllocator:
    """``DeviceAllocator``: each allocation takes whole pages at once, one
    contiguous run of free page numbers (addresses are page numbers x PAGE)."""

    def __init__(self, dev: ToyDevice) -> None:
        self.dev = dev
        self.ids = IdentitySource("toy-eager")
        self.live: dict = {}        # identity -> (allocation, pages)
        self.dead: set = set()

    def device(self) -> DeviceKey:
        return self.dev.key

    def allocate(self, request: AllocationRequest) -> DeviceAllocation:
        size = request.size
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise InvalidRequest(f"size must be a positive int, got {size!r}")
        align = request.alignment
        if not is_power_of_two(align):
            raise InvalidRequest(f"alignment must be a power of two, got {align!r}")
        step = max(align // PAGE, 1)                             # an alignment above the page: start pages
        n = -(-size // PAGE)
        with self.dev.lock:
            free = sorted(self.dev.free_pages)
            for i in range(len(free) - n + 1):
                if free[i] % step == 0 and free[i + n - 1] - free[i] == n - 1:   # n consecutive free pages, aligned
                    pages = free[i:i + n]
                    break
            else:
                raise OutOfMemory(f"no {n} contiguous free pages", requested=size)
            for p in pages:
                self.dev.free_pages.remove(p)
            a = DeviceAllocation(pages[0] * PAGE, size, n * PAGE, self.ids.new(), self.dev.key)
            self.live[a.identity] = (a, pages)
            return a

    def deallocate(self, allocation: DeviceAllocation) -> int:
        ident = getattr(allocation, "identity", None)
        if getattr(ident, "creator", None) != self.ids.creator:
            raise ForeignAllocation("not made by this allocator")
        with self.dev.lock:
            if ident in self.dead:
                raise DoubleFree(f"{ident} was already freed")
            rec = self.live.pop(ident, None)
            if rec is None:
                raise StaleHandle(f"{ident} is not an allocation of this allocator")
            self.dead.add(ident)
            a, pages = rec
            self.dev.free_pages.extend(pages)
            return a.footprint


class EagerMechanism:
    """``DeviceMemoryMechanism`` with the required allocator only: both
    optional capabilities answer ``None`` (explicitly absent)."""

    name = "toy-eager"

    def __init__(self, dev: ToyDevice) -> None:
        self._alloc = EagerAllocator(dev)

    def allocator(self) -> EagerAllocator:
        return self._alloc

    def virtual_backing(self) -> None:
        return None

    def shared_mapping(self) -> None:
        return None


def target(capacity: int | None = None) -> TargetInstance:
    """The factory ``memspec conform`` calls, once per example."""
    dev = ToyDevice(capacity or 64 * MiB)
    return TargetInstance(
        mechanism=EagerMechanism(dev),
        physical_bytes=dev.used,                      # the device's own count, not the allocator's
        capacity=dev.capacity,
        make_foreign=lambda: EagerMechanism(dev),     # a twin on the same device: its handles are foreign
        # how it packs memory, declared so the suite holds it to it: whole pages, page-aligned
        # addresses, nothing of its own on the device (leave it out and these are only measured)
        geometry=AllocatorGeometry.page_rounded(PAGE, alignment=PAGE),
    )
