"""Caching observations: the implementation's ``memory_stats()`` and
``snapshot()`` layout read back and compared with the spec's."""

from __future__ import annotations

from typing import Any

from memspec.spec.caching.invariants import layout_violations, pool_figures, spec_segments
from memspec.spec.caching.state import FREE, LIVE, PENDING, CachingState, Policy
from memspec.spec.core import Observation, global_figure, once


def _impl_segments(sut: Any) -> list[dict]:
    """The implementation's ``snapshot()`` layout, normalised; read once per
    step when the harness shares one step's reads among its observations
    (``sut.reads``, see :func:`_memory_stats`): five observations read it,
    and each read exports the whole snapshot."""
    return once(getattr(sut, "reads", None), "segments", _read_segments, sut)


def _read_segments(sut: Any) -> list[dict]:
    segs = sut.allocator.snapshot()["segments"]
    return sorted(({"address": s["address"], "total_size": s["total_size"], "segment_type": s["segment_type"],
                    "is_expandable": s["is_expandable"], "stream": s["stream"],
                    "blocks": [{"address": b["address"], "size": b["size"], "state": b["state"],
                                "requested_size": b["requested_size"] if b["state"] != "inactive" else 0}
                               for b in s["blocks"]]} for s in segs), key=lambda d: d["address"])


def _impl_layout(sut: Any) -> dict[str, str | None]:
    """:func:`layout_violations` of the implementation's layout, judged once
    per step when the step's reads are shared (C2, C3 and C4 read it)."""
    return once(getattr(sut, "reads", None), "layout", _impl_layout_of, sut)


def _impl_layout_of(sut: Any) -> dict[str, str | None]:
    return layout_violations(_impl_segments(sut))


def _impl_layout_check(inv: str):
    def observed(sut: Any, _r: Any) -> str | None:
        return _impl_layout(sut)[inv]
    return observed


def _pending(segments: list[dict]) -> list[int]:
    return sorted(b["address"] for s in segments for b in s["blocks"] if b["state"] == "active_pending_free")


_POOLS = ((None, "all"), (True, "small_pool"), (False, "large_pool"))


def _memory_stats(sut: Any) -> dict:
    """``memory_stats()`` of the implementation, read once per step when the
    harness shares one step's reads among its observations (``sut.reads``,
    a dict for the step, else ``None``): three observations read it, and one
    read costs about 80 us on the reference."""
    return once(getattr(sut, "reads", None), "memory_stats", _read_memory_stats, sut)


def _read_memory_stats(sut: Any) -> dict:
    return sut.allocator.memory_stats()


def _stats_expected(st: CachingState, _r: Any) -> dict[str, int]:
    """``memory_stats()`` figures the state fixes: bytes reserved, allocated,
    active (allocated or pending free) and requested, and the counts of
    allocated and active blocks, per pool and in all (``CachingState``'s
    ``reserved``, ``figure`` and ``count``, summed in one pass over the
    blocks by :func:`~memspec.spec.caching.invariants.pool_figures`, which C1
    shares in a check sweep)."""
    acc = pool_figures(st)
    out = {}
    for small, name in _POOLS:
        a = acc[small]
        out[f"reserved_bytes.{name}.current"] = a[0]
        out[f"allocated_bytes.{name}.current"] = a[1]
        out[f"active_bytes.{name}.current"] = a[2]
        out[f"requested_bytes.{name}.current"] = a[3]
        out[f"allocation.{name}.current"] = a[4]
        out[f"active.{name}.current"] = a[5]
    out["num_ooms"] = st.num_ooms
    return out


def _stats_expected_by_figures(st: CachingState, _r: Any) -> dict[str, int]:
    """:func:`_stats_expected` from ``CachingState``'s own aggregates, one
    walk over the blocks per figure (its definition; the tests compare the two)."""
    out = {}
    for small, name in _POOLS:
        out[f"reserved_bytes.{name}.current"] = st.reserved(small)
        out[f"allocated_bytes.{name}.current"] = st.figure((LIVE,), small)
        out[f"active_bytes.{name}.current"] = st.figure((LIVE, PENDING), small)
        out[f"requested_bytes.{name}.current"] = st.figure((LIVE, PENDING), small, requested=True)
        out[f"allocation.{name}.current"] = st.count((LIVE,), small)
        out[f"active.{name}.current"] = st.count((LIVE, PENDING), small)
    out["num_ooms"] = st.num_ooms
    return out


_STATS_KEYS = tuple(_stats_expected(CachingState(Policy()), None))


class _NotReported:
    """A count the implementation's ``memory_stats()`` does not report: not
    compared (equal to any figure).  The byte figures and ``num_ooms`` must
    be reported (README: the caching contract); the counts of blocks,
    segments and inactive splits are compared where reported."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "not reported"


NOT_REPORTED = _NotReported()


def _required(key: str) -> bool:
    return "_bytes." in key or key == "num_ooms"


#: ``(key, whether the implementation must report it)`` of every compared figure
_STATS_REQUIRED = tuple((k, _required(k)) for k in _STATS_KEYS)


class _NotAnInt:
    """A figure that is not a plain ``int`` (a float, a NaN, an int subclass
    whose ``__eq__`` says yes to everything): equal to no figure, named by
    its type."""

    __slots__ = ("what",)

    def __init__(self, value: Any) -> None:
        self.what = f"a {type(value).__name__}, not an int"

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return self.what


def _plain_figure(v: Any) -> Any:
    return v if type(v) is int or v is NOT_REPORTED else _NotAnInt(v)


def _stats_observed(sut: Any, _r: Any) -> dict[str, Any]:
    flat = _memory_stats(sut)
    # compared as plain ints: ``spec_int == v`` asks ``v.__eq__`` first when ``v`` is an int subclass
    return {k: _plain_figure(flat[k] if req else flat.get(k, NOT_REPORTED)) for k, req in _STATS_REQUIRED}


def _segments_expected(st: CachingState, _r: Any) -> dict[str, int]:
    """The segment count and the *inactive splits* (free blocks of segments
    that hold more than one block: cached, yet not releasable), count and
    bytes, per pool and in all.  Compared for segments of fixed size only
    (see :func:`_fixed_segments`)."""
    # one pass over the segments: [segments, inactive splits, their bytes] per pool
    acc = {True: [0, 0, 0], False: [0, 0, 0]}
    for s in st.segments:
        a = acc[bool(s.small)]
        a[0] += 1
        if len(s.blocks) > 1:
            for b in s.blocks:
                if b.state == FREE:
                    a[1] += 1
                    a[2] += b.size
    small_a, large_a = acc[True], acc[False]
    out = {}
    for small, name in _POOLS:
        a = small_a if small is True else large_a if small is False else [x + y for x, y in zip(small_a, large_a)]
        out[f"segment.{name}.current"] = a[0]
        out[f"inactive_split.{name}.current"] = a[1]
        out[f"inactive_split_bytes.{name}.current"] = a[2]
    return out


def _segments_expected_by_pools(st: CachingState, _r: Any) -> dict[str, int]:
    """:func:`_segments_expected`, one walk over the segments per pool (its definition)."""
    out = {}
    for small, name in _POOLS:
        out[f"segment.{name}.current"] = sum(1 for s in st.segments if small is None or s.small == small)
        split = [b for s in st.segments if (small is None or s.small == small) and len(s.blocks) > 1
                 for b in s.blocks if b.state == FREE]
        out[f"inactive_split.{name}.current"] = len(split)
        out[f"inactive_split_bytes.{name}.current"] = sum(b.size for b in split)
    return out


_SEGMENT_KEYS = tuple(_segments_expected(CachingState(Policy()), None))


def _fixed_segments(st: CachingState, _t: Any):
    """Every step while segments have a fixed size; never with expandable
    segments (PyTorch counts an expandable arena's segments and splits by
    its mapped runs, which this spec does not model)."""
    return () if st.policy.expandable else (None,)


def _segments_observed(sut: Any, _r: Any) -> dict[str, Any]:
    flat = _memory_stats(sut)
    return {k: flat.get(k, NOT_REPORTED) for k in _SEGMENT_KEYS}


#: ``memory_stats()`` families kept as PyTorch's ``Stat``: ``current``, ``peak``,
#: ``allocated`` (the sum of every increase), ``freed`` (of every decrease)
_STAT_PARTS = (".current", ".peak", ".allocated", ".freed")


#: the keys of the last ``memory_stats()`` read -> its ``Stat`` families, sorted by key:
#: ``(family, current key, peak key, allocated key, freed key)`` (the keys rarely change)
_FAMILIES: list = [None, ()]


def _families(flat: dict) -> tuple:
    keys = tuple(flat)
    if keys != _FAMILIES[0]:
        fams = tuple((k[: -len(".current")],) + tuple(k[: -len(".current")] + p for p in _STAT_PARTS)
                     for k in sorted(keys) if k.endswith(".current"))
        _FAMILIES[:] = [keys, fams]
    return _FAMILIES[1]


def _bookkeeping(sut: Any, _r: Any) -> str | None:
    """The implementation's own statistics agree with themselves: each
    ``Stat``'s peak is at least its current figure, and ``allocated - freed
    - current`` stays what it was at the run's first read (zero for a fresh
    allocator; a reset of the accumulated figures before the run moves it
    once).  ``None`` when they agree, else the first that does not."""
    flat = _memory_stats(sut)
    base = getattr(sut, "_memspec_stat_offsets", None)
    if base is not None:   # every read after the run's first: compared as read, no dict of offsets built
        moved = None
        for fam, cur_k, peak_k, up_k, down_k in _families(flat):
            cur = flat[cur_k]
            peak = flat.get(peak_k)
            if type(peak) is int and peak < cur:
                return f"{fam}: peak {peak} below current {cur}"
            if moved is None:
                up = flat.get(up_k)
                if type(up) is int:
                    down = flat.get(down_k)
                    if type(down) is int:
                        b = base.get(fam, _NO_BASE)
                        if b is not _NO_BASE and up - down - cur != b:
                            moved = (fam, up - down - cur - b)
        if moved is None:
            return None
        fam = moved[0]
        return (f"{fam}: allocated - freed - current moved by {moved[1]} "
                f"(allocated {flat[fam + '.allocated']}, freed {flat[fam + '.freed']}, current {flat[fam + '.current']})")
    offsets = {}
    for fam, cur_k, peak_k, up_k, down_k in _families(flat):
        cur = flat[cur_k]
        peak = flat.get(peak_k)
        if type(peak) is int and peak < cur:
            return f"{fam}: peak {peak} below current {cur}"
        up = flat.get(up_k)
        if type(up) is int:
            down = flat.get(down_k)
            if type(down) is int:
                offsets[fam] = up - down - cur
    base = getattr(sut, "_memspec_stat_offsets", None)
    if base is None:
        sut._memspec_stat_offsets = offsets
        return None
    for fam, off in offsets.items():
        if fam in base and off != base[fam]:
            return (f"{fam}: allocated - freed - current moved by {off - base[fam]} "
                    f"(allocated {flat[fam + '.allocated']}, freed {flat[fam + '.freed']}, current {flat[fam + '.current']})")
    return None


_NO_BASE = object()

#: a global figure, read after every step
_global = global_figure


OBSERVATIONS = [
    Observation("layout tiles (C2)", "C2", _global, lambda st, r: None, _impl_layout_check("C2")),
    Observation("free neighbours coalesced (C3)", "C3", _global, lambda st, r: None, _impl_layout_check("C3")),
    Observation("pools never mix (C4)", "C4", _global, lambda st, r: None, _impl_layout_check("C4")),
    Observation("pending frees (C7)", "C7", _global, lambda st, r: _pending(spec_segments(st)),
                lambda sut, r: _pending(_impl_segments(sut))),
    Observation("memory_stats (C1)", "C1", _global, _stats_expected, _stats_observed),
    Observation("memory_stats segments and inactive splits (C1)", "C1", _fixed_segments, _segments_expected,
                _segments_observed),
    Observation("memory_stats bookkeeping (C1)", "C1", _global, lambda st, r: None, _bookkeeping),
    Observation("segments and blocks (C2)", "C2", _global, lambda st, r: spec_segments(st),
                lambda sut, r: _impl_segments(sut)),
]

