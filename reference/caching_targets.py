"""Conformance targets for the caching allocator (``memspec conform reference-caching``...).

Each factory returns a fresh :class:`~memspec.spec.api.TargetInstance` of
``kind="caching"`` whose ``allocator`` is a
:class:`~memspec.reference.caching.CachingAllocator` on its own simulated
device (a cudaMalloc with ``capacity`` bytes and a page-granular VMM sharing
that capacity); ``mechanism`` is that device's mechanism.  ``caching`` (a
:class:`~memspec.spec.api.CachingTarget`) names the policy and whether
segments are expandable.
"""

from __future__ import annotations

from memspec.spec.api import CachingTarget, MiB, TargetInstance
from memspec.reference.caching import CachingAllocator, SimulatedDevice

DEFAULT_CAPACITY = 64 * MiB


def make_target(preset: str, *, capacity: int | None = None, expandable: bool = False,
                allocator_cls: type = CachingAllocator, **kw) -> TargetInstance:
    """A caching target: ``preset`` ('pytorch' | 'seed'), optionally with expandable segments."""
    cap = DEFAULT_CAPACITY if capacity is None else capacity
    dev = SimulatedDevice(cap)
    alloc = allocator_cls(preset=preset, device=dev, expandable_segments=expandable, **kw)
    return TargetInstance(
        mechanism=alloc.mechanism,
        physical_bytes=lambda: dev.used,
        capacity=cap,
        kind="caching",
        allocator=alloc,
        caching=CachingTarget(policy=preset, expandable=expandable),
        extras={"policy": preset, "expandable": expandable},  # for the target's own tests
    )


def pytorch_preset(capacity: int | None = None) -> TargetInstance:
    """PyTorch 2.5's policy, fixed segments."""
    return make_target("pytorch", capacity=capacity)


def seed_preset(capacity: int | None = None) -> TargetInstance:
    """The seed's toy policy, fixed segments."""
    return make_target("seed", capacity=capacity)


def pytorch_expandable(capacity: int | None = None) -> TargetInstance:
    """PyTorch 2.5's policy with ``expandable_segments:True``."""
    return make_target("pytorch", capacity=capacity, expandable=True)


def seed_expandable(capacity: int | None = None) -> TargetInstance:
    """The seed's toy with expandable segments (pages returned at free)."""
    return make_target("seed", capacity=capacity, expandable=True)
