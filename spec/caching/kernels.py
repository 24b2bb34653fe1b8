"""Caching kernels: the seed-003 constants and the pure policy functions.

Seed 003: *Every request rounds to a 512 B multiple (kMinBlockSize) ...*.
Each kernel carries PEP 316 contracts (``pre:``/``post:``); CrossHair checks
them (``memspec contracts``) and Z3 re-states them (``invariants/formal/proofs_caching``).
"""

from __future__ import annotations

from memspec.spec.api import MiB

K_MIN_BLOCK = 512
K_SMALL_SIZE = MiB
K_SMALL_BUFFER = 2 * MiB
K_LARGE_BUFFER = 20 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB


def thresholds() -> dict[str, int]:
    """Every constant of the policy above (``K_*``): the thresholds of the
    rounding ladder, the pools, the segment-size ladder and the split rules.
    A harness draws each exactly and at +-1 (a new ``K_`` constant is drawn
    without editing a list)."""
    return {k: v for k, v in globals().items() if k.startswith("K_") and type(v) is int}


def boundaries(max_split_size: int = 0, divisions: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Request sizes at every threshold the kernels compare with, exactly and
    at +-1: the ``K_*`` constants, ``max_split_size`` when set, each
    ``roundup_power2_divisions`` entry's start ``K_MIN_BLOCK * d``, and the
    differences of two of them (the split rules' remainders)."""
    points = set(thresholds().values())
    if max_split_size > 0:
        points.add(max_split_size)
    points.update(K_MIN_BLOCK * d for d in divisions if d > 1)
    # a split leaves ``block - request``: the remainder sits exactly on a
    # threshold when the request is the difference of two of them (a 20 MiB
    # segment serving 19 MiB leaves exactly 1 MiB)
    points.update(a - b for a in tuple(points) for b in tuple(points) if a > b)
    return tuple(sorted({p + d for p in points for d in (-1, 0, 1) if p + d > 0}))


def round_size(size: int, seed_preset: bool = False, divisions: int = 0) -> int:
    """The rounding ladder.

    Seed 003: *Every request rounds to a 512 B multiple (kMinBlockSize) ...
    above 1 MiB, 2 MiB multiples* (the ``seed`` preset).  PyTorch 2.5: below
    512 -> 512; with ``divisions`` d > 1 and ``size > 512 * d`` the next of d
    equal steps between two powers of two (a power of two stays); otherwise
    the next 512 multiple.

    pre: size > 0
    pre: divisions == 0 or divisions in (1, 2, 4, 8, 16)
    post: __return__ >= size
    post: __return__ % K_MIN_BLOCK == 0 or (divisions > 1 and not seed_preset)
    post: seed_preset or divisions > 1 or __return__ - size < K_MIN_BLOCK or size < K_MIN_BLOCK
    post: not seed_preset or size <= K_SMALL_SIZE or __return__ % K_ROUND_LARGE == 0
    """
    if seed_preset:
        step = K_MIN_BLOCK if size <= K_SMALL_SIZE else K_ROUND_LARGE
        return (size + step - 1) // step * step
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    if divisions > 1 and size > K_MIN_BLOCK * divisions:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor // divisions
        low = size - size % step
        return size if low == size else low + step
    return (size + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK


def divisions_for(size: int, table: tuple[int, ...]) -> int:
    """The roundup_power2_divisions entry for ``size``: 16 intervals, one per
    power of two from 1 MiB to 64 GiB (clamped at both ends)."""
    if not table:
        return 0
    return table[min(max(0, size.bit_length() - 1 - 20), len(table) - 1)]


def choose_pool(rounded: int) -> str:
    """Seed 003: *Requests <= 1 MiB go to the small pool, ... requests > 1 MiB
    ... go to the large pool.*  Pools never mix.

    pre: rounded > 0
    post: __return__ in ("small", "large")
    post: (__return__ == "small") == (rounded <= K_SMALL_SIZE)
    """
    return "small" if rounded <= K_SMALL_SIZE else "large"


def segment_size(rounded: int, seed_preset: bool = False) -> int:
    """Bytes of the cudaMalloc that serves a request with no free block.

    Seed 003: *served from 2 MiB segments ... served from 20 MiB segments
    (kLargeBuffer)*.  PyTorch 2.5 ``get_allocation_size``: <= 1 MiB -> 2 MiB;
    < 10 MiB -> 20 MiB; else the next 2 MiB multiple.  The toy: ``max(20 MiB,
    request)``.

    pre: rounded > 0
    post: __return__ >= rounded
    post: seed_preset or rounded <= K_SMALL_SIZE or __return__ % K_ROUND_LARGE == 0
    post: rounded > K_SMALL_SIZE or __return__ == K_SMALL_BUFFER
    post: rounded <= K_SMALL_SIZE or __return__ >= K_MIN_LARGE_ALLOC
    """
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if seed_preset:
        return max(K_LARGE_BUFFER, rounded)
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return (rounded + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE


def should_split(remaining: int, size: int, small: bool, seed_preset: bool = False,
                 expandable: bool = False, max_split_size: int = 0) -> bool:
    """Whether a free block serving ``size`` bytes splits off ``remaining``.

    Seed 003: *A free block splits only if the remainder is itself legal (>=
    512 B small pool, >= 2 MiB large pool); a freed 5 MiB block serving a 4 MiB
    request is handed over whole.*  PyTorch 2.5: small pool or expandable
    segments: ``remaining >= 512``; large pool: ``size < max_split_size and
    remaining > 1 MiB`` (strict).  ``max_split_size == 0`` means unlimited.

    pre: remaining >= 0 and size > 0 and max_split_size >= 0
    post: not __return__ or remaining >= K_MIN_BLOCK
    post: not (__return__ and seed_preset and not small) or remaining >= K_ROUND_LARGE
    post: not (__return__ and not seed_preset and not small and not expandable) or remaining > K_SMALL_SIZE
    post: not (__return__ and max_split_size > 0 and not small and not expandable and not seed_preset) or size < max_split_size
    """
    if seed_preset:
        return remaining >= (K_MIN_BLOCK if small else K_ROUND_LARGE)
    if small or expandable:
        return remaining >= K_MIN_BLOCK
    return (max_split_size == 0 or size < max_split_size) and remaining > K_SMALL_SIZE


def format_size(n: int) -> str:
    """PyTorch's ``format_size`` (the OOM message's figures)."""
    if n <= 1024:
        return f"{n} bytes"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20)):
        if n <= scale << 10:
            return f"{n / scale:.2f} {unit}"
    return f"{n / (1 << 30):.2f} GiB"


def format_mib(n: int) -> str:
    """The seed toy's figures (``16 MiB``)."""
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n / MiB:.2f} MiB"

