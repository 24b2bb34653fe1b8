"""Caching kernel pairs for ``crosshair diffbehavior``: spec/caching.py's pure
kernels against the reference caching allocator's own functions
(reference/caching.py).  Same conventions as
:mod:`memspec.invariants.formal.contracts_pairs` (``None`` outside the domain)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

_DIVS = (2, 4, 8, 16)


def spec_round_pytorch(size: int) -> Optional[int]:
    from memspec.spec.caching import round_size

    return round_size(size) if size > 0 else None


def ref_round_pytorch(size: int) -> Optional[int]:
    from memspec.reference.caching import round_request

    return round_request(size, "pytorch") if size > 0 else None


def spec_round_seed(size: int) -> Optional[int]:
    from memspec.spec.caching import round_size

    return round_size(size, True) if size > 0 else None


def ref_round_seed(size: int) -> Optional[int]:
    from memspec.reference.caching import round_request

    return round_request(size, "seed") if size > 0 else None


def spec_round_divisions(size: int, d: int) -> Optional[int]:
    """roundup_power2_divisions with the same ``d`` for every interval."""
    from memspec.spec.caching import round_size

    return round_size(size, False, d) if size > 0 and d in _DIVS else None


def ref_round_divisions(size: int, d: int) -> Optional[int]:
    from memspec.reference.caching import round_request

    return round_request(size, "pytorch", (d,) * 16) if size > 0 and d in _DIVS else None


def spec_segment(rounded: int, seed: bool) -> Optional[int]:
    from memspec.spec.caching import segment_size

    return segment_size(rounded, seed) if rounded > 0 else None


def ref_segment(rounded: int, seed: bool) -> Optional[int]:
    from memspec.reference.caching import segment_bytes

    return segment_bytes(rounded, "seed" if seed else "pytorch") if rounded > 0 else None


def spec_split(remaining: int, size: int, small: bool, seed: bool, expandable: bool, max_split: int) -> Optional[bool]:
    from memspec.spec.caching import should_split

    if remaining < 0 or size <= 0 or max_split < 0:
        return None
    return should_split(remaining, size, small, seed, expandable, max_split)


def ref_split(remaining: int, size: int, small: bool, seed: bool, expandable: bool, max_split: int) -> Optional[bool]:
    from memspec.reference.caching import CachingAllocator

    if remaining < 0 or size <= 0 or max_split < 0:
        return None
    me = SimpleNamespace(preset="seed" if seed else "pytorch", expandable=expandable, _max_split=max_split or None)
    return CachingAllocator._should_split(me, small, remaining, size)  # type: ignore[arg-type]


#: ``(name, X, what is compared)``: ``spec_X`` against ``ref_X`` (:func:`.contracts_pairs.pairs_of`)
ROWS: tuple[tuple[str, str, str], ...] = (
    ("round_size[pytorch]", "round_pytorch", "caching.round_size vs reference round_request('pytorch')"),
    ("round_size[seed]", "round_seed", "caching.round_size(seed) vs round_request('seed')"),
    ("round_size[divisions]", "round_divisions", "power-of-two divisions"),
    ("segment_size", "segment", "caching.segment_size vs reference segment_bytes"),
    ("should_split", "split", "caching.should_split vs CachingAllocator._should_split"),
)

NOTES = ["choose_pool: the reference has no standalone counterpart (it tests `rounded <= 1 MiB` inline in malloc); "
         "not diffed"]
