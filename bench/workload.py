"""Alloc/free workloads for the caching-allocator rows (benchmark 4).

A workload is built once, outside the timed region: ``init`` request sizes
that build the live set, then ``ops``: ``(victim index, new size)`` pairs.
Each pair frees the live block at ``victim`` and allocates a new one in its
place, so the live set stays at exactly ``n_live`` blocks while it is timed.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Callable

MiB = 1 << 20


@dataclass(frozen=True)
class Workload:
    name: str
    n_live: int
    init: list[int]
    ops: list[tuple[int, int]]


def mixed_size(rng: random.Random) -> int:
    """Mixed small/large: 3 in 4 requests in the small pool (any byte count up
    to 1 MiB, so under 512 B classes exact-size hits are rare), 1 in 4 large
    (just over 1 MiB up to 8 MiB)."""
    if rng.random() < 0.75:
        return rng.randint(1, MiB)
    return rng.randint(MiB + 1, 8 * MiB)


def large_size(rng: random.Random) -> int:
    """Large requests only (the seed's toy crashes on small-pool requests):
    just over 1 MiB up to 16 MiB."""
    return rng.randint(MiB + 1, 16 * MiB)


SIZES: dict[str, Callable[[random.Random], int]] = {"mixed": mixed_size, "large": large_size}


def make(kind: str, n_live: int, pairs: int, seed: int = 0) -> Workload:
    rng = random.Random(f"{kind}/{n_live}/{seed}")
    size = SIZES[kind]
    init = [size(rng) for _ in range(n_live)]
    ops = [(rng.randrange(n_live), size(rng)) for _ in range(pairs)]
    return Workload(kind, n_live, init, ops)


def run_pairs(w: Workload, alloc: Callable[[int], Any], free: Callable[[Any], Any]) -> float:
    """Build the live set (untimed), then time the alloc/free pairs; return wall seconds."""
    return timed_pairs(w, alloc, free)[1]


def timed_pairs(w: Workload, alloc: Callable[[int], Any], free: Callable[[Any], Any]) -> tuple[float, float]:
    """Build the live set (untimed), then time the alloc/free pairs; return
    ``(CPU seconds, wall seconds)``.  The CPU time (``time.process_time``:
    this process only) is what the caching rows rate: on a shared machine
    the wall time also counts the time other processes held the core."""
    live = [alloc(n) for n in w.init]
    c0, t0 = time.process_time(), time.perf_counter()
    for i, n in w.ops:
        free(live[i])
        live[i] = alloc(n)
    return time.process_time() - c0, time.perf_counter() - t0
