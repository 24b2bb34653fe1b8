"""Conformance targets for the caching allocator (``memspec conform reference-caching``...).

Each factory returns a fresh :class:`~memspec.spec.api.TargetInstance` of
``kind="caching"`` whose ``allocator`` is a
:class:`~memspec.reference.caching.CachingAllocator` on its own simulated
device (a cudaMalloc with ``capacity`` bytes and a page-granular VMM sharing
that capacity); ``mechanism`` is that device's mechanism.  ``caching`` (a
:class:`~memspec.spec.api.CachingTarget`) names the policy and whether
segments are expandable; ``ep`` (:class:`BlockMemory`) holds the blocks'
bytes, so the harness's data checks reach every live block.
"""

from __future__ import annotations

from typing import Callable, Sequence

from memspec.spec.api import CachingTarget, DeviceKey, Fence, MiB, TargetInstance
from memspec.spec.errors import InvalidRequest
from memspec.reference.caching import CachingAllocator, SimulatedDevice

DEFAULT_CAPACITY = 64 * MiB


class BlockMemory:
    """The bytes behind a simulated caching allocator's blocks, reached as a
    caller's copies reach them: the target's ``ExecutionProvider`` (copies
    complete at once; no kernels run here).  Sparse, in 4 KiB chunks;
    bytes never written read as zero.  The harness writes a pattern into
    every live block through it and reads it back."""

    CHUNK = 4096

    def __init__(self, key: DeviceKey) -> None:
        self._key = key
        self._chunks: dict[int, bytearray] = {}
        self._streams = 0

    def device(self) -> DeviceKey:
        return self._key

    def new_stream(self) -> int:
        self._streams += 1
        return self._streams

    def _span(self, address: object, size: object) -> None:
        if type(address) is not int or type(size) is not int or address < 0 or size < 0:
            raise InvalidRequest(f"a copy needs a non-negative int address and size, got {address!r}+{size!r}")

    def write(self, stream: int, address: int, data: bytes) -> Fence:
        data = bytes(data)
        self._span(address, len(data))
        at, i = address, 0
        while i < len(data):
            base, off = divmod(at, self.CHUNK)
            n = min(self.CHUNK - off, len(data) - i)
            chunk = self._chunks.setdefault(base, bytearray(self.CHUNK))
            chunk[off:off + n] = data[i:i + n]
            at, i = at + n, i + n
        return Fence(stream, 0)

    def read(self, stream: int, address: int, size: int) -> bytes:
        self._span(address, size)
        out = bytearray()
        at, end = address, address + size
        while at < end:
            base, off = divmod(at, self.CHUNK)
            n = min(self.CHUNK - off, end - at)
            chunk = self._chunks.get(base)
            out += chunk[off:off + n] if chunk is not None else bytes(n)
            at += n
        return bytes(out)

    def launch(self, stream: int, reads: Sequence[tuple[int, int]], writes: Sequence[tuple[int, int]]) -> Fence:
        return Fence(stream, 0)

    def fence_done(self, fence: Fence) -> bool:
        return True

    def synchronize(self, stream: int | None = None) -> None:
        return None

    def defer(self, fences: Sequence[Fence], release: Callable[[], object]) -> None:
        release()

    def poll(self) -> int:
        return 0

    def pending_releases(self) -> int:
        return 0


def make_target(preset: str, *, capacity: int | None = None, expandable: bool = False,
                allocator_cls: type = CachingAllocator, **kw) -> TargetInstance:
    """A caching target: ``preset`` ('pytorch' | 'seed'), optionally with expandable segments."""
    cap = DEFAULT_CAPACITY if capacity is None else capacity
    dev = SimulatedDevice(cap)
    alloc = allocator_cls(preset=preset, device=dev, expandable_segments=expandable, **kw)
    return TargetInstance(
        mechanism=alloc.mechanism,
        ep=BlockMemory(dev.key),
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
