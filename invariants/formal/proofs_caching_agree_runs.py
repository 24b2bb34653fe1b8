"""The runs of the caching agreement (:mod:`memspec.invariants.formal.proofs_caching_agree`):
the random walks' policies (:data:`WALKS`, :data:`EXPANDABLE_WALKS`), the
directed boundary, event, knob and expandable-segment scripts, and how
``memspec prove`` cuts them into parts, runs each part (seeded) and merges
their reports.  What each step is compared on is the agreement module's
:func:`~memspec.invariants.formal.proofs_caching_agree.check_step`."""

from __future__ import annotations

import copy
import random
import time
from typing import Any

from memspec.invariants.formal import proofs_caching_heap as H
from memspec.invariants.formal.proofs_caching_agree import Agreement, check_step

# --------------------------------------------------------------------------
# the walks and the boundary sweep
# --------------------------------------------------------------------------

#: (preset, capacity, streams, max_split_size, other policy knobs) of the random walks: capacities small enough
#: that the OOM and retry paths are reached; memory_fraction, garbage_collection_threshold and
#: roundup_power2_divisions in some
WALKS = (("seed", 44 << 20, 3, 0, {}), ("pytorch", 44 << 20, 3, 0, {}), ("seed", 64 << 20, 2, 4 << 20, {}),
         ("pytorch", 64 << 20, 2, 0, {}),
         ("pytorch", 64 << 20, 2, 4 << 20, {"roundup_power2_divisions": 4, "memory_fraction": 0.8,
                                            "garbage_collection_threshold": 0.6}),
         ("seed", 64 << 20, 2, 0, {"memory_fraction": 0.7, "garbage_collection_threshold": 0.5}))
#: the walk's action mix (malloc-heavy, frees to make holes)
MIX = ("malloc",) * 6 + ("free",) * 4 + ("record_stream", "record_stream", "complete_stream", "complete_stream",
                                          "empty_cache", "double_free")


def walk(rep: Agreement, preset: str, capacity: int, streams: int, max_split_size: int, knobs: dict[str, Any],
         steps: int, rng: random.Random, guards: frozenset = frozenset()) -> None:
    from memspec.spec.core import RandomChooser
    from memspec.spec import caching as C

    st = C.init(policy=preset, capacity=capacity, streams=streams, max_split_size=max_split_size, **knobs)
    ch = RandomChooser(rng)
    for _ in range(steps):
        name = rng.choice(MIX)
        act = next(a for a in C.CACHING.actions if a.name == name)
        if not act.available(st):
            continue
        args = act.draw_args(st, ch)
        check_step(st, name, args, rep, guards)


def boundary_sweep(rep: Agreement, preset: str, capacity: int = 44 << 20, guards: frozenset = frozenset()) -> None:
    """malloc at every boundary size of the policy (exactly and +-1; and 1 EB -1/0/+1), from an empty
    allocator (the new-segment path at every rounding, segment-size and split threshold) and from one whose
    20 MiB large and 2 MiB small segments are free (the best-fit path at the same thresholds)."""
    from memspec.spec import caching as C
    from memspec.spec.caching.actions import size_boundaries

    empty = C.init(policy=preset, capacity=capacity, streams=1)
    warm = C.init(policy=preset, capacity=capacity, streams=1)
    refs = []
    for size in (20 << 20, 1 << 20):
        res = next(a for a in C.CACHING.actions if a.name == "malloc").step(warm, size=size, stream=0)
        refs.append(res.branches[0].then(res.branches[0].witness()))
    for ref in refs:
        res = next(a for a in C.CACHING.actions if a.name == "free").step(warm, ref=ref)
        res.branches[0].then(None)
    sizes = tuple(size_boundaries(empty)) + (H.ONE_EB - 1, H.ONE_EB, H.ONE_EB + 1)
    for start in (empty, warm):
        for size in sizes:
            check_step(copy.deepcopy(start), "malloc", {"size": size, "stream": 0}, rep, guards)


#: directed scripts for the stream events (each preset; :func:`run_scripts`' steps, three streams, 44 MiB): a block
#: used on two other streams (record_stream), freed (pending, two events), one stream completed before a malloc
#: (its event processed, the block still waits), the other before an empty_cache (the last event frees it)
EVENT_SCRIPTS = ((("malloc", 3, 0), ("malloc", 4, 0), ("record", 0, 1), ("record", 0, 2), ("free", 0), ("complete", 1),
                  ("malloc", 1, 0), ("complete", 2), ("malloc", 1, 1), ("empty_cache",)),
                 (("malloc", 3, 0), ("record", 0, 1), ("record", 0, 2), ("free", 0), ("complete", 2), ("empty_cache",)))


def event_sweep(rep: Agreement, preset: str, guards: frozenset = frozenset()) -> None:
    """:data:`EVENT_SCRIPTS` under ``preset``."""
    run_scripts(rep, [(preset, {"capacity": 44 << 20}, steps) for steps in EVENT_SCRIPTS], 3, guards)


def run_scripts(rep: Agreement, scripts: Any, streams: int, guards: frozenset = frozenset()) -> None:
    """Directed scripts ``(preset, init keywords, steps)``, each from a fresh allocator of ``streams`` streams;
    a step is ``("malloc", MiB or (bytes,), stream)``, ``("free", k)`` (the k-th block malloc'd),
    ``("record", k, stream)``, ``("complete", stream)`` or ``("empty_cache",)``."""
    from memspec.spec import caching as C
    for preset, kw, script in scripts:
        st = C.init(policy=preset, streams=streams, **kw)
        refs: list[int] = []
        for step in script:
            if step[0] == "malloc":
                size = step[1][0] if isinstance(step[1], tuple) else step[1] << 20
                nxt = st.next_ref
                check_step(st, "malloc", {"size": size, "stream": step[2]}, rep, guards)
                refs.append(nxt if st.next_ref > nxt else -1)
            elif step[0] == "free":
                check_step(st, "free", {"ref": refs[step[1]]}, rep, guards)
            elif step[0] == "record":
                check_step(st, "record_stream", {"ref": refs[step[1]], "stream": step[2]}, rep, guards)
            elif step[0] == "complete":
                check_step(st, "complete_stream", {"stream": step[1]}, rep, guards)
            else:
                check_step(st, "empty_cache", {}, rep, guards)


#: directed scripts for the policy knobs' branches (:func:`run_scripts`' steps, one stream)
_GC = {"capacity": 64 << 20, "memory_fraction": 0.75, "garbage_collection_threshold": 0.5}
KNOB_SCRIPTS: tuple[tuple[str, dict[str, Any], tuple[tuple[Any, ...], ...]], ...] = (
    # garbage collection (usage 40 MiB > 24 MiB) frees the whole 20 MiB segment, then a new segment fits
    ("pytorch", _GC, (("malloc", 15, 0), ("malloc", 15, 0), ("free", 0), ("malloc", 20, 0))),
    # ... then none fits the 48 MiB cap: pytorch's retry (OutOfMemory); the toy's OutOfMemory
    ("pytorch", _GC, (("malloc", 15, 0), ("malloc", 15, 0), ("free", 0), ("malloc", 40, 0))),
    ("seed", _GC, (("malloc", 15, 0), ("malloc", 15, 0), ("free", 0), ("malloc", 30, 0))),
    # ... with max_split_size: release_available finds nothing, then the retry
    ("pytorch", {**_GC, "max_split_size": 4 << 20}, (("malloc", 15, 0), ("malloc", 15, 0), ("free", 0), ("malloc", 40, 0))),
    # pytorch's retry serves a small request from a new segment, split: the 2 MiB small segment does not fit
    # next to the cached 20 MiB one, the retry releases that one, the new segment's remainder is split off
    ("pytorch", {"capacity": 21 << 20}, (("malloc", 20, 0), ("free", 0), ("malloc", 1, 0))),
    # release_available: an oversize cached segment (20 MiB >= max_split_size) is released for a 3 MiB request
    ("pytorch", {"capacity": 44 << 20, "max_split_size": 4 << 20},
     (("malloc", 2, 0), ("malloc", 20, 0), ("free", 0), ("malloc", 3, 0))),
    # ... none holds the want: whole segments from the largest down until it is reached (two of the three
    # 20 MiB ones), then a new segment
    ("pytorch", {"capacity": 64 << 20, "max_split_size": 4 << 20},
     (("malloc", 5, 0), ("malloc", 5, 0), ("malloc", 5, 0), ("free", 0), ("free", 1), ("free", 2), ("malloc", 30, 0))),
    # ... or not reached (then the retry, OutOfMemory)
    ("pytorch", {"capacity": 64 << 20, "max_split_size": 4 << 20},
     (("malloc", 5, 0), ("malloc", 5, 0), ("malloc", 5, 0), ("free", 0), ("free", 1), ("malloc", 50, 0))),
    # memory_fraction: the per-process cap (32 MiB) refuses the second segment the device would hold
    ("pytorch", {"capacity": 64 << 20, "memory_fraction": 0.5}, (("malloc", 20, 0), ("malloc", 20, 0))),
    ("seed", {"capacity": 64 << 20, "memory_fraction": 0.5}, (("malloc", 15, 0), ("malloc", 15, 0))),
)


def knob_sweep(rep: Agreement, guards: frozenset = frozenset()) -> None:
    """:data:`KNOB_SCRIPTS`, then every boundary size of a pytorch policy with roundup_power2_divisions
    (a mixed table and 4 everywhere) from an empty allocator."""
    from memspec.spec import caching as C
    run_scripts(rep, KNOB_SCRIPTS, 1, guards)
    for table in ((1, 2, 4, 8, 16, 2, 4, 8, 16, 1, 2, 4, 8, 16, 2, 4), (4,) * 16):
        empty = C.init(policy="pytorch", capacity=44 << 20, streams=1, roundup_power2_divisions=table)
        for size in division_sizes(table):
            check_step(copy.deepcopy(empty), "malloc", {"size": size, "stream": 0}, rep, guards)


def division_sizes(table: tuple[int, ...]) -> tuple[int, ...]:
    """Requests at the divisions' thresholds, +-1: each entry's start ``512 * d``, and in the intervals of
    1, 2, 4 and 8 MiB their start and first step (the kernels are checked at every threshold by
    :func:`~memspec.invariants.formal.proofs_caching_heap.kernel_boundary_agreement`; this drives malloc)."""
    pts = {512 * d for d in set(table) if d > 1}
    for e in (20, 21, 22, 23):
        d = table[min(max(0, e - 20), 15)]
        pts |= {1 << e, (1 << e) + (1 << e) // max(d, 1)}
    return tuple(sorted({p + k for p in pts for k in (-1, 0, 1) if p + k > 0}))


#: expandable segments (the flag on): directed scripts for the branches a short walk may miss
#: (:func:`run_scripts`' steps, two streams)
_EX = {"expandable": True}
EXPANDABLE_SCRIPTS: tuple[tuple[str, dict[str, Any], tuple[tuple[Any, ...], ...]], ...] = (
    # a fresh arena maps two 20 MiB pages for 30 MiB; freed, empty_cache unmaps them and the arena goes
    ("pytorch", {**_EX, "capacity": 64 << 20}, (("malloc", 30, 0), ("free", 0), ("empty_cache",))),
    # a second stream's fresh arena does not fit: pytorch's retry unmaps the first arena's free pages, then maps
    ("pytorch", {**_EX, "capacity": 64 << 20}, (("malloc", 30, 0), ("free", 0), ("malloc", 30, 1))),
    # ... and with no free page to unmap: the retry's OutOfMemory; the toy's at once
    ("pytorch", {**_EX, "capacity": 64 << 20}, (("malloc", 30, 0), ("malloc", 30, 1))),
    ("seed", {**_EX, "capacity": 44 << 20}, (("malloc", 30, 0), ("malloc", 30, 1))),
    # the toy unmaps a freed block's pages; the hole's unmapped block is mapped whole for the next request
    ("seed", {**_EX, "capacity": 44 << 20}, (("malloc", 2, 0), ("malloc", 2, 0), ("malloc", 2, 0), ("free", 1),
                                             ("malloc", 2, 0))),
    # the toy: a pending block freed by its event at malloc and at empty_cache unmaps there
    ("seed", {**_EX, "capacity": 44 << 20}, (("malloc", 2, 0), ("record", 0, 1), ("free", 0), ("complete", 1),
                                             ("malloc", 2, 0), ("record", 1, 1), ("free", 1), ("complete", 1),
                                             ("empty_cache",))),
    # the head holds the request with exactly 512 B to spare (the split threshold with expandable segments)
    ("pytorch", {**_EX, "capacity": 64 << 20}, (("malloc", ((20 << 20) - 512,), 0),)),
    # best fit walks past the smallest candidate (8 MiB, an unmapped run after it) to a 10 MiB one
    ("pytorch", {**_EX, "capacity": 64 << 20}, (("malloc", 10, 0), ("malloc", 10, 0), ("malloc", 12, 0), ("free", 0),
                                                ("malloc", 5, 0))),
    # memory_fraction and the garbage collection with arenas: the collection releases no arena
    ("pytorch", {**_EX, "capacity": 64 << 20, "memory_fraction": 0.75, "garbage_collection_threshold": 0.5},
     (("malloc", 15, 0), ("malloc", 15, 0), ("free", 0), ("malloc", 1, 1), ("malloc", 40, 1))),
    # (C8) a run of several unmapped blocks mapped one by one for a 60 MiB request
    ("pytorch", {**_EX, "capacity": 200 << 20}, (("malloc", 20, 0), ("malloc", 20, 0), ("malloc", 20, 0),
                                                 ("malloc", 20, 0), ("malloc", 20, 0), ("free", 1), ("empty_cache",),
                                                 ("free", 3), ("empty_cache",), ("free", 2), ("malloc", 60, 0))),
    # (C8) the toy's memory_fraction cap with arenas, checked on the request's pages: 8 MiB mapped, a 16 MiB
    # request over the 22 MiB cap is refused (the device has 36 MiB free)
    ("seed", {**_EX, "capacity": 44 << 20, "memory_fraction": 0.5}, (("malloc", 4, 0), ("malloc", 4, 0),
                                                                      ("malloc", 16, 0))),
    # (C8) arenas of 40 MiB VA: a second arena of the pool and stream; then both have a 20 MiB run: the first
    # by address serves
    ("pytorch", {**_EX, "capacity": 64 << 20, "arena_factor": 0.5},
     (("malloc", 20, 0), ("malloc", 20, 0), ("malloc", 20, 0), ("free", 0), ("empty_cache",), ("malloc", 20, 0))),
)
#: the random walks with expandable segments (the policies of :data:`WALKS` that reach the arenas' branches)
EXPANDABLE_WALKS = (("seed", 44 << 20, 3, 0, _EX), ("pytorch", 64 << 20, 3, 0, _EX),
                    ("pytorch", 64 << 20, 2, 4 << 20, {**_EX, "memory_fraction": 0.75,
                                                       "garbage_collection_threshold": 0.5}))


def expandable_sweep(rep: Agreement, guards: frozenset = frozenset()) -> None:
    """:data:`EXPANDABLE_SCRIPTS`."""
    run_scripts(rep, EXPANDABLE_SCRIPTS, 2, guards)


#: random walks per configuration of :data:`WALKS` and :data:`EXPANDABLE_WALKS` (``memspec prove --walks``):
#: with the directed scripts and sweeps one walk each samples every branch (a second took the agreement
#: from 36 to 66 s CPU and reached no branch the scripts miss)
WALKS_PER_CONFIG = 1


def agreement_parts(walks_per_config: int = WALKS_PER_CONFIG, expandable: bool = True) -> list[tuple[Any, ...]]:
    """The independent parts of :func:`run_agreement` (each run by :func:`agreement_part`, in any process:
    ``memspec prove --jobs``; :func:`merge_agreements` joins them into the serial run's report): the sweeps
    of each preset, the knob sweep, each walk, the expandable scripts and each expandable walk."""
    parts: list[tuple[Any, ...]] = [("sweeps", preset) for preset in ("seed", "pytorch")]
    parts.append(("knobs",))
    parts += [("walk", w, i) for w in range(walks_per_config) for i in range(len(WALKS))]
    if expandable:
        parts.append(("expandable-scripts",))
        parts += [("expandable-walk", w, i) for w in range(walks_per_config) for i in range(len(EXPANDABLE_WALKS))]
    return parts


def _walk_seeds(seed: int, walks_per_config: int, expandable: bool) -> dict[tuple[Any, ...], float]:
    """Each walk's seed, drawn in the serial order (the plain walks, then the expandable ones)."""
    rng = random.Random(seed)
    return {p: rng.random() + p[1] for p in agreement_parts(walks_per_config, expandable) if p[0].endswith("walk")}


def agreement_part(part: tuple[Any, ...], steps: int = 30, walks_per_config: int = WALKS_PER_CONFIG, seed: int = 0,
                   guards: frozenset = frozenset(), expandable: bool = True) -> Agreement:
    """One part of :func:`agreement_parts`, on a report of its own."""
    t0 = time.process_time()
    rep = Agreement()
    kind = part[0]
    if kind == "sweeps":
        boundary_sweep(rep, part[1], guards=guards)
        event_sweep(rep, part[1], guards=guards)
    elif kind == "knobs":
        knob_sweep(rep, guards=guards)
    elif kind in ("walk", "expandable-walk"):
        cfg = (WALKS if kind == "walk" else EXPANDABLE_WALKS)[part[2]]
        rng = random.Random(_walk_seeds(seed, walks_per_config, expandable)[part])
        walk(rep, *cfg, steps=steps, rng=rng, guards=guards)
    elif kind == "expandable-scripts":
        expandable_sweep(rep, guards)
    else:
        raise ValueError(f"unknown agreement part {part!r}")
    rep.seconds = time.process_time() - t0
    return rep


def merge_agreements(reps: list[Agreement]) -> Agreement:
    """The reports of :func:`agreement_parts`, in the parts' order, as one: branch counts, samples and
    mismatches add up; a state that two parts evaluated is counted once (as the serial run, which evaluates
    each distinct state once)."""
    out = Agreement()
    for r in reps:
        for act, branches in r.counts.items():
            d = out.counts.setdefault(act, {})
            for b, k in branches.items():
                d[b] = d.get(b, 0) + k
        out.mismatches += r.mismatches
        out.samples += r.samples
        out.seconds += r.seconds
        if len(out.inv_examples) < 20:
            out.inv_examples += r.inv_examples[:20 - len(out.inv_examples)]
        for key, evaluated in r.seen.items():
            if key in out.seen:
                continue
            out.seen[key] = evaluated
            for inv_id, disagrees in evaluated:
                out.inv[inv_id][0] += 1
                out.inv[inv_id][1] += int(disagrees)
    return out


def run_agreement(steps: int = 30, walks_per_config: int = WALKS_PER_CONFIG, seed: int = 0,
                  guards: frozenset = frozenset(), expandable: bool = True) -> Agreement:
    """The walks of :data:`WALKS` and the boundary sweeps of both presets; with ``expandable`` the scripts
    and walks with expandable segments (:data:`EXPANDABLE_SCRIPTS`, :data:`EXPANDABLE_WALKS`): every part
    of :func:`agreement_parts`, one after the other, merged."""
    t0 = time.process_time()
    rep = merge_agreements([agreement_part(p, steps, walks_per_config, seed, guards, expandable)
                            for p in agreement_parts(walks_per_config, expandable)])
    rep.seconds = time.process_time() - t0
    return rep
