"""Conformance targets of the reference (entry points ``memspec.targets``).

* ``reference``       -- eager allocator + VirtualBacking + SharedMapping;
* ``reference-eager`` -- eager allocator only (both optional capabilities ``None``);
* ``reference-vmm``   -- eager allocator + VirtualBacking, no SharedMapping.

Each factory builds a fresh :class:`~.device.SimDevice` (default 256 MiB of
2 MiB pages, so fuzzing reaches OutOfMemory quickly), the mechanism, and a
:class:`~.ep.ReferenceEP` over the same device.  ``physical_bytes`` probes the
pages actually held on the device (independent of any bookkeeping).
``device`` is the SimDevice (the reference roles of the system level share
it) and ``make_foreign`` makes a second, independent mechanism of the same
kind on the same device: the source of *foreign* handles.
"""

from __future__ import annotations

from typing import Callable

from memspec.spec.api import DEFAULT_PAGE, AllocatorGeometry, TargetInstance

from memspec.reference.device import DEFAULT_CAPACITY, SimDevice
from memspec.reference.ep import ReferenceEP
from memspec.reference.mechanism import ReferenceMechanism, eager_only, full, vmm_only


def _target(make: Callable[[SimDevice], ReferenceMechanism], capacity: int | None, page_size: int) -> TargetInstance:
    dev = SimDevice(capacity or DEFAULT_CAPACITY, page_size)
    mech = make(dev)
    ep = ReferenceEP(dev)

    def make_foreign() -> ReferenceMechanism:
        return make(dev)

    return TargetInstance(
        mechanism=mech,
        ep=ep,
        physical_bytes=dev.physical_bytes,
        capacity=dev.capacity,
        close=lambda: _close(ep, dev),
        kind="mechanism",
        make_foreign=make_foreign,
        device=dev,
        # memspec's own allocator: page-rounded footprints, 256-aligned
        # addresses, nothing of its own on the device -- held to all of it
        geometry=AllocatorGeometry.page_rounded(page_size),
        extras={"device": dev, "make_foreign": make_foreign},  # for the reference's own tests
    )


def _close(ep: ReferenceEP, dev: SimDevice) -> None:
    """Teardown: run the EP's queued work and releases, then close the
    device (every page freed, all later work refused); idempotent."""
    if not dev.closed:
        ep.close()
        dev.close()


def reference(capacity: int | None = None, *, page_size: int = DEFAULT_PAGE) -> TargetInstance:
    """Full bundle: eager + VirtualBacking + SharedMapping."""
    return _target(full, capacity, page_size)


def reference_eager(capacity: int | None = None, *, page_size: int = DEFAULT_PAGE) -> TargetInstance:
    """Eager only: ``virtual_backing()`` and ``shared_mapping()`` answer ``None``."""
    return _target(eager_only, capacity, page_size)


def reference_vmm(capacity: int | None = None, *, page_size: int = DEFAULT_PAGE) -> TargetInstance:
    """Eager + VirtualBacking; ``shared_mapping()`` answers ``None``."""
    return _target(vmm_only, capacity, page_size)
