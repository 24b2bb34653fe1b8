"""Caching invariants C1-C9, each quoting seed 003.

Some are predicates over the state (C1, C3, C5, C7; C2 and C4 over the
layout); the others (C6, C8, C9) fail when an action recorded a diagnosed
answer against that rule.  :func:`layout_violations` also judges an
implementation's ``snapshot()`` layout (see :mod:`.observations`).
"""

from __future__ import annotations

from memspec.spec.caching.kernels import K_ROUND_LARGE, K_SMALL_SIZE
from memspec.spec.caching.state import FREE, LIVE, PENDING, UNMAPPED, Block, CachingState
from memspec.spec.core import Invariant, Witness, checks_memo, once
from memspec.spec.invariants import CatalogEntry, catalog_of


def _recorded(inv: str):
    def check(st: CachingState) -> str | None:
        for i, why in st.violations:
            if i == inv:
                return why
        return None
    return check


def layout_violations(segments: list[dict]) -> dict[str, str | None]:
    """C2/C3/C4 over a layout in ``snapshot()['segments']`` form (used on the
    spec's own state and on the implementation's snapshot)."""
    out: dict[str, str | None] = {"C2": None, "C3": None, "C4": None}
    for s in segments:
        at = s["address"]
        prev_state = None
        for b in s["blocks"]:
            if b["address"] != at and out["C2"] is None:
                out["C2"] = f"segment {s['address']:#x}: block at {b['address']:#x}, expected {at:#x} (gap or overlap)"
            at = b["address"] + b["size"]
            st = b["state"]
            if st == "inactive" and prev_state == "inactive" and out["C3"] is None:
                out["C3"] = f"segment {s['address']:#x}: adjacent free blocks at {b['address']:#x} left uncoalesced"
            prev_state = st
            if st == "active_allocated" and out["C4"] is None:
                pool = "small" if b["requested_size"] <= K_SMALL_SIZE else "large"
                if pool != s["segment_type"]:
                    out["C4"] = (f"a {pool}-pool request ({b['requested_size']} bytes) lives in a "
                                 f"{s['segment_type']}-pool segment at {s['address']:#x}")
        if at != s["address"] + s["total_size"] and out["C2"] is None:
            out["C2"] = f"segment {s['address']:#x}: blocks end at {at:#x}, the segment at {s['address'] + s['total_size']:#x}"
    return out


def spec_segments(st: CachingState) -> list[dict]:
    """The spec's layout in ``snapshot()['segments']`` form: mapped ranges of
    arenas are segments of their own, as in PyTorch.  Built once per check
    sweep of a harness (:func:`~memspec.spec.core.checks_memo`: C2, C3, C4
    and two observations read it), else on every call; never to be mutated."""
    return once(checks_memo(st), "segments", _spec_segments, st)


def _spec_layout(st: CachingState) -> dict[str, str | None]:
    """:func:`layout_violations` of the spec's layout (once per check sweep, as :func:`spec_segments`)."""
    return once(checks_memo(st), "layout", _layout_of, st)


def _layout_of(st: CachingState) -> dict[str, str | None]:
    return layout_violations(spec_segments(st))


def _spec_segments(st: CachingState) -> list[dict]:
    names = {FREE: "inactive", LIVE: "active_allocated", PENDING: "active_pending_free"}
    out = []
    for s in st.segments:
        if s.base is None:
            continue
        runs: list[list[Block]] = []
        cur: list[Block] = []
        for b in s.blocks:
            if b.state == UNMAPPED:
                if cur:
                    runs.append(cur)
                cur = []
            else:
                cur.append(b)
        if cur:
            runs.append(cur)
        for run in runs:
            out.append({
                "address": s.base + run[0].offset, "total_size": sum(b.size for b in run),
                "segment_type": "small" if s.small else "large", "is_expandable": s.expandable, "stream": s.stream,
                "blocks": [{"address": s.base + b.offset, "size": b.size, "state": names[b.state],
                            "requested_size": b.requested if b.state != FREE else 0} for b in run],
            })
    out.sort(key=lambda d: d["address"])
    return out


def pool_figures(st: CachingState) -> dict:
    """``{None | True | False: [reserved, allocated bytes, active bytes,
    requested bytes, allocated blocks, active blocks]}``, in all and per pool
    (small, large): ``CachingState.reserved``, ``figure((LIVE,))``,
    ``figure((LIVE, PENDING))``, ``figure((LIVE, PENDING), requested=True)``,
    ``count((LIVE,))``, ``count((LIVE, PENDING))`` in one pass over the
    blocks; once per check sweep (:func:`~memspec.spec.core.checks_memo`:
    C1 and the ``memory_stats`` observation read it).  Never to be mutated."""
    return once(checks_memo(st), "pools", _pool_figures, st)


def _pool_figures(st: CachingState) -> dict:
    acc: dict = {None: [0] * 6, True: [0] * 6, False: [0] * 6}
    for s in st.segments:
        # the pools as CachingState's aggregates select them (``s.small == small``)
        pools = (acc[None], acc[True]) if s.small == True else (acc[None], acc[False]) if s.small == False \
            else (acc[None],)  # noqa: E712
        reserved = s.size if not s.expandable else sum(b.size for b in s.blocks if b.state != UNMAPPED)
        alloc = active = req = n_alloc = n_active = 0
        for b in s.blocks:
            state = b.state
            if state == LIVE:
                alloc += b.size
                n_alloc += 1
            elif state != PENDING:
                continue
            active += b.size
            req += b.requested
            n_active += 1
        for a in pools:
            a[0] += reserved
            a[1] += alloc
            a[2] += active
            a[3] += req
            a[4] += n_alloc
            a[5] += n_active
    return acc


def _c1(st: CachingState) -> str | None:
    figures = pool_figures(st)
    for small in (None, True, False):
        name = {None: "all", True: "small_pool", False: "large_pool"}[small]
        res, _alloc, act, req = figures[small][:4]
        if not (res >= act >= req):
            return f"{name}: reserved {res} >= allocated {act} >= requested {req} fails"
    if figures[None][0] > st.policy.capacity:
        return f"reserved {figures[None][0]} exceeds the device's {st.policy.capacity} bytes"
    return _recorded("C1")(st)


def _c1_by_figures(st: CachingState) -> str | None:
    """:func:`_c1` from ``CachingState``'s own aggregates (its definition; the tests compare the two)."""
    for small in (None, True, False):
        name = {None: "all", True: "small_pool", False: "large_pool"}[small]
        res = st.reserved(small)
        act = st.figure((LIVE, PENDING), small)
        req = st.figure((LIVE, PENDING), small, requested=True)
        if not (res >= act >= req):
            return f"{name}: reserved {res} >= allocated {act} >= requested {req} fails"
    if st.reserved() > st.policy.capacity:
        return f"reserved {st.reserved()} exceeds the device's {st.policy.capacity} bytes"
    return _recorded("C1")(st)


def _layout_check(inv: str):
    def check(st: CachingState) -> str | None:
        why = _recorded(inv)(st)
        if why:
            return why
        return _spec_layout(st)[inv]
    return check


def _c3(st: CachingState) -> str | None:
    why = _layout_check("C3")(st)
    if why:
        return why
    for s in st.segments:  # unmapped runs of an arena coalesce too
        for a, b in zip(s.blocks, s.blocks[1:]):
            if a.state == b.state == UNMAPPED:
                return f"segment {s.sid}: adjacent unmapped blocks at offsets {a.offset} and {b.offset}"
    return None


def _c5(st: CachingState) -> str | None:
    why = _recorded("C5")(st)
    if why:
        return why
    if st.policy.seed and not st.policy.expandable:
        for s in st.segments:
            if not s.small:
                for b in s.blocks:
                    if b.size % K_ROUND_LARGE:
                        return f"segment {s.sid}: a {b.size}-byte large-pool block (the remainder floor is 2 MiB)"
    return None


def _c7(st: CachingState) -> str | None:
    why = _recorded("C7")(st)
    if why:
        return why
    for s in st.segments:
        for b in s.blocks:
            if b.state == PENDING and b.waits <= 0:
                return f"segment {s.sid}: block at offset {b.offset} pending with no event"
    return None


INVARIANTS = [
    Invariant("C1", "reserved >= allocated >= requested",
              "reserved ≥ allocated ≥ requested, always.", _c1),
    Invariant("C2", "blocks tile their segment",
              "SEGMENT 0 = one cudaMalloc VA reservation ... the span would have to cross a live tensor", _layout_check("C2"),
              # the spec's layout has every free neighbour merged: a missed merge shows in it too
              presupposes=("C3",)),
    Invariant("C3", "adjacent free blocks coalesce",
              "coalesce — every hole's neighbors are live 6 MiB blocks, and adjacent free blocks would merge", _c3),
    Invariant("C4", "pools never mix; best fit within the pool",
              "Pools never mix. A 900 KiB request will not carve a large-pool free block", _layout_check("C4"),
              # the best fit is judged on the spec's layout, where free neighbours are merged
              presupposes=("C3",)),
    Invariant("C5", "split only with a legal remainder",
              "A free block splits only if the remainder is itself legal (≥ 512 B small pool, ≥ 2 MiB large pool)", _c5),
    Invariant("C6", "empty_cache releases exactly the fully-free segments",
              "empty_cache() releases segments that are entirely free to the driver; it moves, merges, and "
              "defragments nothing inside partially-live segments", _recorded("C6"),
              # a segment is entirely free only once its free blocks were merged into one
              presupposes=("C3",),
              witnesses=(Witness("empty_cache", "bytes released", "a fully-free segment released"),)),
    Invariant("C7", "no reuse before the events of other streams complete (seed 000's fence rule)",
              # seed 003 never names streams: this rule is seed 000's, applied to the caching allocator
              # (a block is reused only on its stream, after the events of the other streams that used it)
              "GPU release must obey stream/fence ordering", _c7, requires=("second_stream",)),
    Invariant("C8", "expandable segments: OOM only at physical exhaustion",
              "A freed block's pages unmap — physical memory returns to the driver immediately — and a later large "
              "request maps fresh pages into a fresh contiguous VA run.", _recorded("C8"),
              requires=("expandable_segments",),
              # a request the spec serves from merged free blocks is no exhaustion where they were never merged
              presupposes=("C3",),
              witnesses=(Witness("malloc", "OutOfMemory", "an OutOfMemory raised"),)),
    Invariant("C9", "the OOM message's figures equal the state",
              "The OOM message is the diagnosis ... \"N GiB is reserved by PyTorch but unallocated\" = fragmentation",
              _recorded("C9"),
              # (as C8: an OOM where the spec serves from merged free blocks is the missed merge's)
              presupposes=("C3",),
              witnesses=(Witness("malloc", "OutOfMemory", "an OutOfMemory raised"),)),
]


#: C1-C9, in order: ids, titles and quotes (seed 003; C7 quotes seed 000's fence rule)
CATALOG: tuple[CatalogEntry, ...] = catalog_of(INVARIANTS, "003", quoted_from={"C7": "000"})
IDS: tuple[str, ...] = tuple(e.id for e in CATALOG)
