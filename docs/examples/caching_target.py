"""A caching-level target: an allocator with one stream and no expandable segments.

A caching allocator (seed 003: *PyTorch layers a caching allocator on top
[of cudaMalloc]*) is checked against the spec's ``CACHING`` machine.  This
example adapts an allocator whose interface is narrower than PyTorch's: it
serves a single stream (stream 0) and has no ``record_stream``, no
expandable segments.  ``TargetInstance.caching`` says so, and the
invariants only a second stream or ``record_stream`` could exercise are N/A
with that reason -- never FAIL or ERROR.

The allocator itself is the reference's seed-003 toy (the ``"seed"``
policy) on a simulated device; a real project puts its own allocator behind
the same five methods.

``memspec conform docs.examples.caching_target:target``
"""

from __future__ import annotations

from memspec.reference.caching import CachingAllocator, SimulatedDevice
from memspec.spec.api import CachingTarget, MiB, TargetInstance


class OneStreamAllocator:
    """The interface the harness drives (``memspec.spec.api.CachingAllocator``,
    minus ``record_stream``): ``malloc``/``free``/``complete_stream``/
    ``synchronize``/``empty_cache``/``memory_stats`` (``torch.cuda`` names)."""

    def __init__(self, capacity: int) -> None:
        self.device = SimulatedDevice(capacity)
        self._inner = CachingAllocator(preset="seed", device=self.device)

    def malloc(self, size: int, stream: int = 0):
        return self._inner.malloc(size, stream)

    def free(self, block) -> None:
        self._inner.free(block)

    def complete_stream(self, stream: int) -> None:
        self._inner.complete_stream(stream)

    def synchronize(self) -> None:
        self._inner.synchronize()

    def empty_cache(self) -> int:
        return self._inner.empty_cache()

    def memory_stats(self) -> dict:
        return self._inner.memory_stats()

    def memory_summary(self) -> str:
        return self._inner.memory_summary()

    def snapshot(self) -> dict:
        return self._inner.snapshot()


def target(capacity: int | None = None) -> TargetInstance:
    cap = capacity or 64 * MiB
    alloc = OneStreamAllocator(cap)
    return TargetInstance(
        mechanism=None,                               # segments come from the allocator's own driver
        kind="caching",
        allocator=alloc,
        physical_bytes=lambda: alloc.device.used,     # what the device holds, not the allocator's stats
        capacity=cap,
        caching=CachingTarget(policy="seed", expandable=False, streams=1, record_stream=False),
    )
