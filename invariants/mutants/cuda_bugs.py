"""The two real-world VMM bugs (cuda.core VirtualMemoryResource, 2025-2026),
planted in the CUDA implementation and run on the host driver emulator.

* ``cuda-host-creation-handle-leak``: ``commit_range`` never ``cuMemRelease``s
  the ``cuMemCreate`` reference after ``cuMemMap``, so decommitted and
  released pages never return to the device (64 x 64 MiB allocate/close left
  4 GiB retained on an H100).  The mechanism's own answers stay right (it
  *believes* it freed the pages); only the device sees it: ``cuMemGetInfo``
  (``physical_bytes``) stays above the spec's physical bytes, and on a small
  device commits (and creates) start failing with OutOfMemory where the
  spec says they must succeed.  The harness has no physical-bytes
  observation (yet), so it is caught through that OutOfMemory: S5, the
  blame of ``commit_range``'s outcome (``create``'s, S13, also fires).  A
  ``physical_bytes`` observation, if added, would blame S11 (the device
  holds more than live + queued footprints).
* ``cuda-host-unmap-before-fence``: the execution provider's deferred-free
  queue runs releases at the next poll without waiting for their fences, so
  pages are unmapped while queued work still uses them (the illegal memory access also
  reproduced in vLLM).  S4: a queued read after the drop faults, and the
  release is observed before its fence completed.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from memspec.spec.api import Fence, TargetInstance
from memspec.cuda_impl.ep import CudaExecutionProvider
from memspec.cuda_impl.targets import cuda_host
from memspec.invariants.mutants import Mutant


class UnorderedReleaseEP(CudaExecutionProvider):
    """BUG: the deferred-free queue does not wait for the fences: ``poll``
    runs every queued release (unmap, cuMemRelease, cuMemFree) at once, as a
    host-side free with no stream ordering does."""

    def _ready(self, d: Any) -> bool:
        return True


#: the leak shows as OutOfMemory only once leaked pages fill the device: a
#: small device (4 pages of 2 MiB) makes that happen within a short run
LEAK_DEFAULT_CAPACITY = 8 << 20


def leaky_cuda_host(capacity: int | None = None, **kw: Any) -> TargetInstance:
    return cuda_host(LEAK_DEFAULT_CAPACITY if capacity is None else capacity, leak_creation_handles=True, **kw)


def unordered_cuda_host(capacity: int | None = None, **kw: Any) -> TargetInstance:
    return cuda_host(capacity, ep_factory=UnorderedReleaseEP, **kw)


MUTANTS = [
    Mutant(
        name="cuda-host-creation-handle-leak",
        invariant="S5",
        description="VMM commit keeps the cuMemCreate reference after cuMemMap: freed pages never return "
                    "(cuMemGetInfo stays high; cuda.core VirtualMemoryResource leak)",
        factory=leaky_cuda_host,
        level="mechanism",
    ),
    Mutant(
        name="cuda-host-unmap-before-fence",
        invariant="S4",
        description="the EP's deferred free unmaps/releases at once, while queued work still uses the range "
                    "(cuda.core VirtualMemoryResource / vLLM illegal memory access)",
        factory=unordered_cuda_host,
        level="system",
    ),
]
