"""The caching allocator of seed 003, as an executable state machine.

Seed 003: *cudaMalloc is slow and page-granular, so PyTorch layers a caching
allocator on top -- module 01 ch19's segregated-fit, replayed. Hence the real
OOM: "out of memory" almost never means out of bytes; it means out of
contiguous, policy-satisfiable memory.*

State: *segments* (one cudaMalloc each, or one expandable VA arena), each
tiled by *blocks* (``live``, ``pending`` -- freed but waiting for events on
other streams --, ``free``, or ``unmapped`` inside an arena); two *pools*
(small: rounded size <= 1 MiB; large); *streams* whose recorded *events*
complete when the caller says the stream's work is done.

The policy is a parameter with two presets (:data:`PRESETS`):

* ``pytorch`` -- PyTorch 2.5 (``c10/cuda/CUDACachingAllocator.cpp``) exactly:
  kMinBlockSize 512, kSmallSize 1 MiB, kSmallBuffer 2 MiB, kLargeBuffer
  20 MiB, kMinLargeAlloc 10 MiB, kRoundLarge 2 MiB; rounding with optional
  power-of-two divisions; ``get_allocation_size``; ``should_split``; best
  fit on ``(stream, size, address)`` within the request's stream; coalescing;
  record_stream events; empty_cache of whole free segments; max_split_size;
  garbage_collection_threshold; expandable segments (2 MiB / 20 MiB pages
  mapped on demand, unmapped at empty_cache or the OOM retry).
* ``seed`` -- the seed's toy: large requests round to 2 MiB, *a free block
  splits only if the remainder is itself legal (>= 512 B small pool, >= 2 MiB
  large pool)*, 20 MiB large segments (``max(20 MiB, request)``), no OOM
  retry, and under expandable segments *a freed block's pages unmap --
  physical memory returns to the driver immediately* (2 MiB pages).

The spec is a refinement oracle: the policy is deterministic, so ``malloc``
predicts the exact block (address and size) or the exact OOM figures; the
only freedom left to an implementation is where its driver places a new
segment, which the spec learns from the answer.  An answer that differs is
diagnosed (which rule it breaks) and recorded; the invariant of that rule
then fails.  Observations compare the implementation's statistics and block
layout (read through ``memory_stats()`` and ``snapshot()``) with the spec's.

The pure kernels (:func:`round_size`, :func:`choose_pool`,
:func:`segment_size`, :func:`should_split`) carry PEP 316 contracts for
CrossHair.

``CACHING.init(*, policy, capacity, expandable, max_split_size=None,
roundup_power2_divisions=0, memory_fraction=None,
garbage_collection_threshold=0.0)``; actions call ``sut.allocator``
(``malloc(size, stream)``, ``free(block)``, ``record_stream(block, stream)``,
``complete_stream(stream)``, ``empty_cache()``) and ``sut.ref(id)``.

Read in this order (one module per concern, like the seed-000 spec):
:mod:`.kernels` (constants and pure kernels), :mod:`.state` (policy
parameters, segments, blocks), :mod:`.policy` (the policy as state
transitions, the ``malloc`` prediction), :mod:`.actions` (what a caller may
ask, every allowed answer), :mod:`.invariants` (C1-C9),
:mod:`.observations` (stats and layout read back); this module assembles
:data:`CACHING`.
"""

from __future__ import annotations

from memspec.spec.api import MiB
from memspec.spec.caching.actions import (
    FREED_REF, LIVE_REF, ONE_EB, SIZES, STREAM, STREAMS, complete_stream, double_free, empty_cache, free, malloc,
    record_stream,
)
from memspec.spec.caching.invariants import CATALOG, IDS, INVARIANTS, layout_violations, spec_segments
from memspec.spec.caching.kernels import (
    K_LARGE_BUFFER, K_MIN_BLOCK, K_MIN_LARGE_ALLOC, K_ROUND_LARGE, K_SMALL_BUFFER, K_SMALL_SIZE, choose_pool,
    divisions_for, format_mib, format_size, round_size, segment_size, should_split,
)
from memspec.spec.caching.observations import OBSERVATIONS
from memspec.spec.caching.policy import Prediction, predict_malloc
from memspec.spec.caching.state import FREE, LIVE, PENDING, PRESETS, UNMAPPED, Block, CachingState, Policy, Segment
from memspec.spec.core import DataRegion, Machine

__all__ = [
    "CACHING", "init",
    # kernels
    "K_MIN_BLOCK", "K_SMALL_SIZE", "K_SMALL_BUFFER", "K_LARGE_BUFFER", "K_MIN_LARGE_ALLOC", "K_ROUND_LARGE",
    "round_size", "divisions_for", "choose_pool", "segment_size", "should_split", "format_size", "format_mib",
    # state
    "PRESETS", "FREE", "LIVE", "PENDING", "UNMAPPED", "Policy", "Block", "Segment", "CachingState",
    # policy
    "Prediction", "predict_malloc",
    # actions
    "ONE_EB", "STREAMS", "SIZES", "STREAM", "LIVE_REF", "FREED_REF",
    "malloc", "free", "double_free", "record_stream", "complete_stream", "empty_cache",
    # invariants and observations
    "INVARIANTS", "CATALOG", "IDS", "layout_violations", "spec_segments", "OBSERVATIONS",
]

def init(*, policy: str = "pytorch", capacity: int = 64 * MiB, expandable: bool = False, max_split_size: int | None = None,
         roundup_power2_divisions: int | tuple[int, ...] = 0, memory_fraction: float | None = None,
         garbage_collection_threshold: float = 0.0, arena_factor: float | None = None,
         streams: int = STREAMS) -> CachingState:
    """The initial state: no segments, no events.  ``streams``: how many
    streams the allocator serves (requests are drawn on ``[0, streams)``)."""
    if policy not in PRESETS:
        raise ValueError(f"unknown policy {policy!r}; expected one of {PRESETS}")
    if not isinstance(streams, int) or streams < 1:
        raise ValueError(f"streams must be a positive int, got {streams!r}")
    d = roundup_power2_divisions
    table = (d,) * 16 if isinstance(d, int) and d else tuple(d) if d else ()
    return CachingState(Policy(
        preset=policy, capacity=capacity, expandable=expandable, max_split_size=max_split_size or 0,
        divisions=table, memory_fraction=memory_fraction, gc_threshold=garbage_collection_threshold,
        arena_factor=arena_factor or 0.0), streams=min(streams, STREAMS))


def regions(st: CachingState, ref: int, obj: object) -> DataRegion | None:
    """A live block's requested bytes ``[address, address + requested_size)``
    (what the caller may use): they keep what was written into them until
    the block is freed, whatever the allocator splits off, coalesces or
    hands out around them.  A fault or a changed byte is C2 (*blocks tile
    their segment*: someone else's block lies on these bytes)."""
    sid = st.where.get(ref)
    if sid is None:
        return None
    seg, i = st.block_of(ref)
    if seg.blocks[i].state != LIVE:
        return None
    address, n = getattr(obj, "address", None), getattr(obj, "requested_size", None)
    if type(address) is not int or type(n) is not int or n <= 0:
        return None
    return DataRegion("C2", "C2", extent=(address, n), page=K_ROUND_LARGE)


CACHING: Machine[CachingState] = Machine(
    name="caching",
    doc=__doc__ or "",
    init=init,
    actions=[malloc, free, double_free, record_stream, complete_stream, empty_cache],
    invariants=INVARIANTS,
    observations=OBSERVATIONS,
    regions=regions,
)
