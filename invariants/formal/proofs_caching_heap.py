"""The caching catalog's invariants (C rows) by induction over an arbitrary well-formed caching heap (seed 003).

Seed 003: *segments (one cudaMalloc each) ... each tiled by blocks; two pools
... "out of memory" almost never means out of bytes; it means out of
contiguous, policy-satisfiable memory.*

The state is an *arbitrary* heap, not one reached from the empty allocator in
a few steps: block ids ``0 <= i < n`` (dense; a block merged away or released
is dead: ``al[i]`` false), each with its address ``ad``, size ``sz``, kind
``k`` (0 free, 1 live, 2 pending), requested bytes ``rq``, pool ``sm``
(small), stream ``sr``, and its segment (``sb`` base, ``ss`` size: a segment
is the set of alive blocks with that base).  ``pv``/``nx`` are ghost witnesses
of the tiling (the block ending where this one starts / starting where it
ends, ``-1`` at the segment's edge).  Streams are the spec's three
(``STREAMS = 3``): per stream the recorded-use flag ``u<s>`` and event value
``e<s>`` of each block, and the stream's issued/completed event counters.

Well-formedness is the inductive invariant (:func:`wf`): sizes positive and
512-aligned, every block inside its segment, blocks of one segment pairwise
disjoint, segments pairwise disjoint, each block's start the segment start or
the end of its ``pv`` block (and its end the segment end or the start of its
``nx`` block), one pool and one stream per segment, requested <= size.  With
non-overlap that is tiling (C2).  The byte figures are checked prefix-sum
ghosts (:func:`memspec.invariants.formal.proofs.prefix_sum`): free / active (live +
pending) / live / slack (size - requested) / whole-free-segment bytes per
pool, proved inductive with the rest, so C1's sums need no lemma.

Actions (each a total function of state and arguments, tied to the spec
actions it stands for):

* ``malloc`` (``caching:malloc``): round (the rounded size ``r`` is an
  argument constrained by :func:`round_ok`, which the exact rounding kernel
  :func:`z_round` -- roundup_power2_divisions included, a case split per
  power-of-two interval -- is proved to satisfy: :func:`rounding_lemma`),
  pick the pool, best fit among the free blocks of that pool and stream (the
  chosen block ``b`` is an argument and the precondition says it is *the*
  best one: smallest, then lowest address; or ``b = -1`` and no block fits),
  the ``max_split_size`` rules of ``get_free_block``, split if
  ``should_split``; else the garbage collection when usage exceeds
  ``garbage_collection_threshold`` (phase ``gp``: ``gc:release`` frees any
  whole free large-pool segment -- the spec's age order picks some of them,
  the agreement passes its victims --, ``gc:end``); then (``malloc:`` or
  ``gc_end:`` + :data:`CONT_PATHS`) a new segment at a fresh base (the
  driver's choice, an argument) if it fits the ``memory_fraction`` cap and
  the device, else the toy's OutOfMemory, else pytorch's
  ``release_available`` when ``max_split_size`` is set (phase ``ra``:
  ``avail:big`` frees the smallest block holding the want if it is a whole
  segment, ``avail:one`` whole segments of at least max_split_size from the
  largest down until the want is reached, ``avail_end:new`` /
  ``avail_end:retry``), else the *retry* (outcome ``pending``: every
  stream's events complete and the request waits in ``md``);
* ``malloc_retry`` (``caching:malloc``): the retry's second half once every
  pending block was processed: release every whole-free segment, then a new
  segment or OutOfMemory with its figures;
* ``process_event`` (``caching:malloc``, ``caching:empty_cache``): the event
  of stream ``s`` on a pending block is complete: drop it; the last one frees
  the block, which coalesces with free neighbours (the spec runs this at the
  start of malloc and in empty_cache);
* ``free`` (``caching:free``): a live block with recorded uses becomes pending
  with one event per stream; otherwise free and coalesced;
* ``double_free``, ``record_stream``, ``complete_stream``;
* ``empty_cache_wait`` / ``empty_cache`` (``caching:empty_cache``): every
  stream's events complete, then (once processed) release exactly the
  whole-free segments and return their bytes.

Expandable segments (seed 003: *A freed block's pages unmap -- physical
memory returns to the driver immediately -- and a later large request maps
fresh pages into a fresh contiguous VA run*), as spec/caching models them,
under the symbolic policy flag ``ex`` (like ``seed``: one proof covers both
values): every segment is then a VA arena (``vs``/``vl`` bytes, whole pages of
:func:`page`: the toy's 2 MiB, pytorch's 2 MiB small / 20 MiB large pool),
tiled by blocks of four kinds -- free, live, pending and *unmapped* (``UNM``)
--; reserved counts the mapped bytes only (unmapped blocks add to no ghost
sum, so ``reserved = free + active`` still holds), a free arena block is never
a whole-free segment, and C3 also forbids two adjacent unmapped blocks.

* ``malloc:expand`` / ``gc_end:expand`` / ``malloc_retry:expand``: no free
  block serves the request and the memory_fraction check (on ``alloc``)
  passes: the mapping starts (phase ``xp``) at the run of an unmapped block
  ``u`` of an arena of the request's pool and stream, its head the free block
  before ``u`` if any (``_find_expandable``'s choice is an argument: the
  agreement passes the spec rule's, re-stated by its driver), or a fresh arena
  (``u = -1``);
* ``expand:map``: the pages of the run's next unmapped block up to the
  request's last byte (page-rounded from the arena's base, at most the block)
  are mapped, if reserved + them fits the device: they become free and merge
  with the head (and, the block mapped whole, with a free block after it);
  ``expand:fresh``: a fresh arena at a fresh base, its first
  ``min(ceil(r, page), VA)`` bytes mapped; ``expand:serve``: the head holds the
  request and serves it like a best fit (pytorch splits any remainder >= 512
  with expandable segments); ``expand:oom`` / ``expand:retry``: the next pages
  do not fit: the pages mapped so far stay mapped, then the toy's OutOfMemory
  ("Tried to allocate" the rounded request), pytorch's retry (whose second
  attempt ends in OutOfMemory);
* ``unmap:free`` (the toy's free, at once and when an event frees a block) and
  ``unmap:cache`` (empty_cache and pytorch's retry, counted in empty_cache's
  answer): the whole pages inside a free block are unmapped (the free edges
  before and after them stay), the unmapped block merges with unmapped
  neighbours, and an arena left all unmapped is released;
* ``malloc:fit`` with expandable segments: PyTorch's best fit walks on from
  the smallest candidate while the next one's *expandable size* (its size
  plus the unmapped block after it) is smaller (:func:`grow_best`).

With the flag, C1's memory_fraction conjunct (reserved within the cap) is
not claimed -- the spec's C1 does not claim it either: the fraction's check
is on ``alloc`` and the mapping takes whole pages, so reserved may pass the
cap (a 22 MiB request under a 32 MiB cap maps two 20 MiB pages).  An arena
whose first mapping failed stays in the spec's state without a base and
without a mapped byte (the spec maps it later like a fresh one): it is not a
block here.

C8 (seed 003: *A freed block's pages unmap -- physical memory returns to the
driver immediately -- and a later large request maps fresh pages into a fresh
contiguous VA run*; the row: OutOfMemory only at physical exhaustion) is a
step property of the mapping's failures, on this machine (no encoding of its
own): at ``expand:oom`` / ``expand:retry`` the device has fewer free bytes
(capacity - reserved) than the pages the next step lacks
(:func:`lacking`: the target unmapped block's pages up to the request's last
byte, or a fresh arena's first pages), or no arena's VA holds the request
(an ``arena_factor`` that small; not the presets'); and those pages are at
most the request rounded up to a page.  That bound rests on a lemma, proved
inductive with the invariant: every unmapped block starts on a page of its
arena (:func:`unmapped_aligned`, the consecution goal ``align`` of every
action); it is a hypothesis of that goal and of C8's step property only (as a
conjunct of the block invariant, in every hypothesis, it took ``expand:map``'s
consecution from 3 s to over 6 min CPU).  At an arena's other
OutOfMemory (``malloc:oom``, ``gc_end:oom``, ``malloc_retry:oom`` with the
flag) it is memory_fraction's cap, checked on ``alloc`` (pytorch) or on the
request's pages (the toy), both at most the page-rounded request.  Its
unguarded variant (``expand:oom`` with :func:`map_len` the whole unmapped
block, not only the pages the request lacks) raises OutOfMemory with the
request's pages free.  Findings on the spec (from C8's first encoding, a
machine of its own since merged into this one): the seed preset's fraction
check used ``alloc`` (the toy's ``max(20 MiB, r)``), so the toy with
``memory_fraction`` raised OutOfMemory with more free bytes under the cap
than the request's pages (the spec and the reference now check the request's
pages there); the toy's ``empty_cache`` answer leaves out the pages its
events' frees unmapped on the way; with ``arena_factor`` set so that an
arena's VA is smaller than a request, ``predict_malloc`` raised IndexError
(now an OutOfMemory, no arena reserved).

The encoding is split by job, each module under 1,200 lines:
:mod:`.proofs_caching_heap_terms` (fields, quantifiers, kernels, the invariants'
conjuncts), :mod:`.proofs_caching_heap_actions` (the transitions and expandable
segments), and this module (the inductive invariant, the proof by initiation and
consecution, the unguarded variants and the C rows of ``memspec prove``).  Every name
of the parts is a name of this module: import from here.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import z3

from memspec.invariants.formal.z3fast import And, Implies, Not, Or
from memspec.invariants.formal import solving
from memspec.invariants.formal.solving import Query  # bounded in CPU, in a context of its own

from memspec.invariants.formal.proofs import Act, St, _args, at, fresh
from memspec.spec.caching.invariants import CATALOG as CACHING_CATALOG
from memspec.invariants.formal import proofs_caching_heap_terms, proofs_caching_heap_actions
from memspec.invariants.formal.proofs_caching_heap_terms import (
    FIELDS, FREE, K_MIN_BLOCK, K_SMALL, MODE, MiB, STREAMS, SUMS, _all, _all2, _contrib,
    arenas_wf, block_wf, c1, c2, c3, c4, c5, c7, ceil_pg, idle, page, pair_wf, reserved_wf, round_ok,
    rounding_lemma, scalars_wf, sum_mono, sum_step, sums_wf, total, unmapped_aligned, wf, z_round, z_segment,
    z_split,
)
from memspec.invariants.formal.proofs_caching_heap_actions import (
    _cand, _largest_free_ok, _no_whole_pages, _target, _whole_free, actions, best_fit, lacking,
    malloc_parts, no_arena_holds, phase_actions, retry_parts, unmap_parts,
)

#: the modules this one is assembled from, in order (split by job); a name
#: defined there is one object, whichever module a caller reads it from, so a test that rebinds one
#: (``monkeypatch.setattr``) rebinds it in each module of :data:`PARTS` that has it and here
PARTS = (proofs_caching_heap_terms, proofs_caching_heap_actions)
# the package face: every name of the parts, private ones included, is a name of this module, as before the split
for _part in PARTS:
    globals().update({_k: _v for _k, _v in vars(_part).items() if not _k.startswith("__")})
del _part


#: encoded action -> the phase action that covers it: the same step function, and its precondition is
#: proved to imply the phase action's (so the phase action's consecution is its own)
COVERED = {"gc:release": "phase:release", "avail:big": "phase:release", "avail:one": "phase:release",
           "gc_end:new": "phase:new", "avail_end:new": "phase:new"}


def covered(act: Act, timeout_ms: int = 30000) -> str:
    """``act`` is an instance of its phase action: the same step, and ``pre(act) => pre(phase action)``."""
    gen = next(g for g in phase_actions() if g.name == COVERED[act.name])
    if act.step is not gen.step:
        return f"not the step of {gen.name}"
    s = fresh(FIELDS, "s")
    a = _args(act, "a")
    r, _m = _check(lambda: act.pre(s, a), lambda: gen.pre(s, a), s, a, timeout_ms)
    return "proved" if r == z3.unsat else str(r)


def init(s: St) -> Any:
    """The empty allocator: no blocks, no events, zero sums, no malloc in progress; any capacity,
    max_split_size, preset, memory fraction, garbage-collection threshold, divisions table, expandable
    segments on or off (arenas of whole pages)."""
    zero = z3.K(z3.IntSort(), z3.IntVal(0))
    return And(s.n == 0, s.cap >= 0, s.ms >= 0, s.Rs == 0, s.Rl == 0, idle(s), arenas_wf(s),
                  *[And(s[f"i{t}"] == 0, s[f"c{t}"] == 0) for t in range(STREAMS)],
                  *[s[nm] == zero for nm in SUMS])


# --------------------------------------------------------------------------
# the inductive invariant, the named invariants, the step properties
# --------------------------------------------------------------------------

def inv(s: St, sums: tuple[str, ...] | None = None) -> Any:
    """The inductive invariant: well-formedness (C2), the checked prefix-sum
    ghosts, reserved = free + active bytes <= the device, and C3, C4, C5, C7
    (C1 follows from it: :func:`c1`, proved as a safety check).  ``sums``: only
    these ghosts (a weaker hypothesis, so still sound).  With C8's lemma
    (:func:`unmapped_aligned`: :data:`ALIGNED_GOALS`) it is inductive: the lemma
    is one more conjunct, a hypothesis only of the goals that read it."""
    return And(wf(s), sums_wf(s, tuple(SUMS) if sums is None else sums), reserved_wf(s), c3(s), c4(s), c5(s), c7(s))


def step_ok(name: str, s: St, a: St, out: Any, s2: St) -> dict[str, Any]:
    """Properties of one transition, by invariant (each must hold on every step)."""
    props: dict[str, Any] = {}
    if name in ("malloc:fit", "malloc:oom"):
        m = malloc_parts(s, a)
        fit = z3.BoolVal(True)
        b, r, small = a.b, m["r"], m["small"]
        rem = at(s.sz, b) - r
    if name == "expand:serve":
        fit = z3.BoolVal(True)
        b, r = s.xh, s.mr
        small = r <= K_SMALL
        rem = at(s.sz, b) - r
        # C4: served from an arena of the request's pool and stream
        props["C4"] = And(at(s.sm, b) == small, at(s.sr, b) == s.mt, at(s2.rq, b) == s.mn)
    if name == "malloc:fit":
        # C4: served from the request's pool, the best fit (smallest, then lowest address; with expandable
        # segments PyTorch's walk on to smaller expandable sizes: :func:`grow_best`)
        cand = lambda j: _cand(s, j, r, small, a.t)  # noqa: E731
        props["C4"] = Implies(fit, And(at(s.sm, b) == small, best_fit(s, b, a.b2, cand)))
    if name in ("malloc:fit", "expand:serve"):
        # C5: a split leaves a legal remainder (the split rule :func:`z_split`, checked against the spec's at
        # every threshold: seed 003's >= 512 B small pool, >= 2 MiB large pool; pytorch's > 1 MiB and below
        # max_split_size); a block is handed over whole only when the remainder is illegal
        legal = z_split(s, rem, r, small)
        split_done = And(at(s2.sz, b) == r, rem > 0)
        props["C5"] = Implies(fit, And(Implies(split_done, legal), Implies(Not(split_done), Not(legal))))
        # C7: a block is reused only on its own stream, and only when free (not pending)
        props["C7"] = Implies(fit, And(at(s.sr, b) == (a.t if name == "malloc:fit" else s.mt),
                                             at(s.k, b) == FREE))
    if name in ("malloc:oom", "gc_end:oom", "expand:oom", "malloc_retry:oom"):
        props["C9"] = _figures_ok(s2, a.lf, a.lw)
    if name == "unmap:cache":
        # C6 (an arena): exactly the whole pages inside the free block go, reserved and the answer move by them,
        # and the free edges left hold no whole page
        _rel, B, E, _has = unmap_parts(s, a.b)
        pg = page(s, at(s.sm, a.b))
        head, tail = B - _rel, _rel + at(s.sz, a.b) - E
        props["C6"] = And(s2.Rs + s2.Rl == s.Rs + s.Rl - (E - B), s2.ret == s.ret + (E - B),
                             head < pg, tail < pg, E - B >= pg)
    if name in ("expand:oom", "expand:retry"):
        # C8 (expandable segments: OutOfMemory only at physical exhaustion): the device has less free than the
        # pages the next step lacks (or no arena's VA holds the request), and those are at most the request
        # rounded up to a page (the target starts on a page: C8's lemma, :func:`unmapped_aligned`, a hypothesis
        # of this goal); ``lacking`` is the guarded one (the unguarded action maps the whole block)
        more, pg = lacking(s), page(s, s.mr <= K_SMALL)
        props["C8"] = And(Or(s.cap - (s.Rs + s.Rl) < more, And(_target(s) == -1, no_arena_holds(s))),
                          more <= ceil_pg(s.mr, pg))
    if name in ("malloc:oom", "gc_end:oom", "malloc_retry:oom"):
        # C8, an arena's other OutOfMemory: memory_fraction's cap, checked on ``alloc`` (pytorch) or the
        # request's pages (the toy), both at most the page-rounded request
        rr = s.mr if name != "malloc:oom" else a.r
        rel = retry_parts(s, a)["rel"] if name == "malloc_retry:oom" else s
        want = z3.If(s.seed, ceil_pg(rr, page(s, rr <= K_SMALL)), z_segment(s, rr))
        props["C8"] = Implies(s.ex, And(s.hf, rel.Rs + rel.Rl + want > s.lim,
                                        want <= ceil_pg(rr, page(s, rr <= K_SMALL))))
    if name.startswith("process_event"):
        ev = [Implies(a.t == tt, s[f"c{tt}"] >= at(s[f"e{tt}"], a.b)) for tt in range(STREAMS)]
        props["C7"] = And(*ev)
    if name == "empty_cache":
        # C6: exactly the whole-free segments go, and the answer is their bytes
        # (expandable segments: no whole free page is left -- the unmap:cache steps took them -- and the
        # answer is what they unmapped)
        props["C6"] = And(_all(s.n, lambda o: at(s2.al, o) == And(at(s.al, o), Not(_whole_free(s, o)))),
                             s2.ret == z3.If(s.ex, s.ret, total(s, "Ws") + total(s, "Wl")),
                             Implies(s.ex, _no_whole_pages(s2)))
    return props


def _figures_ok(s2: St, lf: Any, lw: Any) -> Any:
    """C9: the OOM's figures are the state's: reserved, allocated (live), largest free block.  (The request
    tried is each OOM step's own figure, :func:`_tried`, compared with the spec's by the agreement: here it
    was the same term on both sides.)"""
    return And(s2.orr == s2.Rs + s2.Rl, s2.oa == total(s2, "Ls") + total(s2, "Ll"),
                  s2.olf == lf, _largest_free_ok(s2, lf, lw))


NAMED: dict[str, Callable[[St], Any]] = {
    "C1": c1, "C2": c2, "C3": c3, "C4": c4, "C5": c5, "C6": lambda s: z3.BoolVal(True), "C7": c7,
    "C8": lambda s: z3.BoolVal(True), "C9": lambda s: z3.BoolVal(True),
}


# --------------------------------------------------------------------------
# the proof: initiation and consecution by quantifier instantiation
# --------------------------------------------------------------------------

def goals(s2: St) -> list[tuple[str, Callable[[], Any]]]:
    """The invariant's conjuncts, each checked as its own query."""
    out: list[tuple[str, Callable[[], Any]]] = [
        ("scalars", lambda: scalars_wf(s2)),
        ("C2:block", lambda: _all(s2.n, lambda i: block_wf(s2, i))),
        ("C2:pair", lambda: _all2(s2.n, lambda i, j: pair_wf(s2, i, j))),
    ]
    for nm in SUMS:
        out.append((f"sum:{nm}:step", lambda nm=nm: And(*sum_step(s2.n, s2[nm], _contrib(s2, nm), wide=False))))
        out.append((f"sum:{nm}:mono", lambda nm=nm: sum_mono(s2.n, s2[nm])))
    out += [("reserved", lambda: reserved_wf(s2)), ("C3", lambda: c3(s2)),
            ("C4", lambda: c4(s2)), ("C5", lambda: c5(s2)), ("C7", lambda: c7(s2)),
            ("align", lambda: unmapped_aligned(s2))]
    return out


#: the goals whose hypothesis has C8's lemma (:func:`unmapped_aligned`): its own consecution and C8's step
#: property (every other goal's hypothesis leaves it out: weaker, so still sound)
ALIGNED_GOALS = ("align", "step:C8")


def _terms(s: St, a: St, extra: list[Any], sums_only: bool = False) -> None:
    """The instance terms of a hypothesis: the goal's skolems, the ids the action touches, 0 and n
    (``sums_only``: a prefix sum changes only at the touched ids: not their neighbours' neighbours)."""
    base: list[Any] = [s.n, s.n + 1, z3.IntVal(0)] + list(extra)
    if not sums_only:
        for e in extra:
            base += [at(s.pv, e), at(s.nx, e)]
    if "b" in a:
        b = a.b
        p, q = at(s.pv, b), at(s.nx, b)
        base += [b, p, q] + ([] if sums_only else [at(s.pv, p), at(s.nx, q)])
    for x in ("u", "b2"):
        if x in a:
            base += [a[x], at(s.pv, a[x]), at(s.nx, a[x])]
    if "lw" in a:
        base.append(a.lw)
    out = []
    for x in base:
        out += [x, x + 1]
    MODE.terms, MODE.terms1 = out, base
    MODE.anchors = base + [x + 1 for x in extra]


#: the heap's queries are quantifier-free once :data:`MODE` has instantiated the invariant's quantifiers
#: (arrays, linear integer arithmetic): Z3's solver configured for that logic answers most of them far
#: faster than the default one (``unmap:cache`` ghost-sum monotonicity 25 s -> 2 s CPU, ``expand:map``
#: 207 s -> 13 s).  An answer other than unsat is re-checked on the default solver, so a goal is proved if
#: either answers unsat (both sound for unsat) and a counterexample always comes from the default solver.
#: The QF attempt is only a shortcut, bounded by its own resource limit (:data:`QF_MS`, rlimit units,
#: never the clock: a wall-clock bound made its CPU depend on load, 30 s -> 412 s for C8 with both cores
#: busy).  On some falsifiable goals it does not answer within it; a verdict never rests on that, since the
#: default solver (resource limit only, as every check before) then decides.
QF_LOGIC = "QF_AUFLIA"
#: budget of a QF attempt in ms of CPU on a quiet core (:class:`~.solving.Query`): the slowest proof it
#: gives takes ~6 s CPU on a quiet core
QF_MS = 10_000


#: a QF attempt's seeds and shares of its budget: short attempts only (a shortcut, the default solver
#: decides after it).  Its whole-budget attempt ran away where Z3's count does not reach and noticed
#: the watchdog's interrupt late: 64 s of CPU for a 10 s budget (``expand:map`` under the self-test's
#: break "2 MiB granules"), where the old single QF check had answered in the main context by luck.
QF_LADDER = ((0, 1 / 4), (1, 1 / 4), (2, 1 / 2))


def qf_solver(timeout_ms: int) -> Query:
    """A solver for :data:`QF_LOGIC`, bounded by the smaller of the check's budget and :data:`QF_MS`
    (:class:`~.solving.Query`)."""
    return Query(min(timeout_ms, QF_MS), QF_LOGIC, ladder=QF_LADDER)


def _instantiate(hyp: Callable[[], Any], goal: Callable[[], Any], s: St, a: St, shared: bool = False,
                 sums_only: bool = False) -> tuple[Any, Any]:
    """``(hypothesis, goal)``: the goal's quantifiers skolem constants (``shared``: one per arity), the
    hypothesis's instantiated at them and at the ids the action touches (:func:`_terms`)."""
    MODE.kind, MODE.skolems, MODE.shared = "skolem", [], shared
    try:
        g = goal()
        MODE.kind = "inst"
        _terms(s, a, list(MODE.skolems), sums_only)
        h = hyp()
    finally:
        MODE.kind, MODE.shared, MODE.terms, MODE.terms1, MODE.anchors, MODE.skolems = "forall", False, [], [], [], []
    return h, g


def _check(hyp: Callable[[], Any], goal: Callable[[], Any], s: St, a: St, timeout_ms: int = 30000,
           solvers: dict | None = None) -> tuple[Any, Any]:
    h, g = _instantiate(hyp, goal, s, a)
    if solvers is not None:
        # one incremental solver per hypothesis: the goal is pushed and popped (an answer other than
        # unsat is re-checked below on fresh solvers, so sharing never changes a verdict)
        key = h.get_id()
        if key not in solvers:
            solvers[key] = (h, qf_solver(timeout_ms))
            solvers[key][1].add(h)
        sol = solvers[key][1]
        sol.push()
        sol.add(Not(g))
        r = sol.check()
        sol.pop()
        if r == z3.unsat:
            return r, None
    else:
        sol = qf_solver(timeout_ms)
        sol.add(h, Not(g))
        if sol.check() == z3.unsat:
            return z3.unsat, None
    return solving.check(h, Not(g), budget_ms=timeout_ms)


def _framed(s: St, s2: St, g: Callable[[St], Any]) -> bool:
    """The conjunct reads no field the step changed: it is its own hypothesis."""
    probe = St({f: s[f] if z3.eq(s2[f], s[f]) else z3.Const(f"changed@{f}", s[f].sort()) for f in s})
    e = g(probe)
    seen, stack = set(), [e]
    while stack:
        x = stack.pop()
        if x.get_id() in seen:
            continue
        seen.add(x.get_id())
        if z3.is_const(x) and x.decl().name().startswith("changed@"):
            return False
        stack.extend(x.children())
    return True


def _deps(name: str) -> tuple[str, ...]:
    """The ghost sums a goal's hypothesis needs (fewer hypotheses: still sound)."""
    if name.startswith("sum:"):
        return (name.split(":")[1],)
    if name == "reserved":
        return tuple(nm for nm in SUMS if nm[0] in "NWA")
    return tuple(SUMS) if name in ("step:C6", "step:C9") else ()


#: consecution goals are checked in four groups (one query each, one shared skolem or skolem pair per
#: group, a hypothesis with only the conjuncts the group needs: weaker, so still sound); a group that is not
#: proved at once is re-checked goal by goal with the whole invariant as hypothesis (the verdict per goal)
GROUPS = ("sums-step", "sums-mono")


def _group(name: str) -> str | None:
    if name.startswith("sum:"):
        return "sums-step" if name.endswith(":step") else "sums-mono"
    return None


def _group_hyp(group: str, s: St, names: list[str]) -> Any:
    """The hypothesis of a group (the ghost sums without their monotonicity where no goal needs it)."""
    deps = sorted({d for n in names for d in _deps(n)})
    if group.startswith("sums"):
        body = [scalars_wf(s), _all(s.n, lambda i: block_wf(s, i))]
    else:
        body = [wf(s), c3(s), c4(s), c5(s), c7(s)]
    for nm in (tuple(SUMS) if group == "sums-mono" else deps):
        body += sum_step(s.n, s[nm], _contrib(s, nm))
        if group == "sums-mono":
            body.append(sum_mono(s.n, s[nm]))
    if group != "sums-step" and any(n == "reserved" for n in names):
        body.append(reserved_wf(s))
    return And(*body)


def _check_group(group: str, items: list[tuple[str, Callable[[], Any]]], s: St, a: St, pre: Callable[[], Any],
                 timeout_ms: int) -> Any:
    h, g = _instantiate(lambda: And(_group_hyp(group, s, [n for n, _f in items]), pre()),
                        lambda: And(*[f() for _n, f in items]), s, a, shared=True, sums_only=group.startswith("sums"))
    sol = qf_solver(timeout_ms)   # a group not proved here is re-checked goal by goal (:func:`_check`)
    sol.add(h, Not(g))
    return sol.check()


#: goals checked first on an action's shared incremental solver (the order changes Z3's search, never a
#: verdict: each goal is its own push/pop): C5 after the others took 9-12.5 s CPU in the core units of the
#: unmap actions and 0.25-0.5 s first (those units 12.4 -> 4.0 s, 14.4 -> 3.8 s; expand:serve's 3.5 -> 1.4 s);
#: first in malloc:fit's and expand:map's units it cost more (8.7 -> 20.3 s, 4.1 -> 6.1 s): not there
GOALS_FIRST = {"unmap:cache": ("C5",), "unmap:free": ("C5",), "expand:serve": ("C5",)}


def consecution(act: Act, timeout_ms: int = 30000, only: tuple[str, ...] = (),
                grouped: bool = True, part: str | None = None) -> list[tuple[str, str, float]]:
    """``Inv /\\ Pre /\\ Step => Inv'`` conjunct by conjunct, and the step
    properties: ``(goal, result, seconds)``.  A conjunct that reads no field
    the step changed is ``framed`` (it is literally its own hypothesis).  Each
    goal's quantifiers become skolem constants; the hypothesis (with the ghost
    sums the goal needs) is instantiated at them and at the ids the action
    touches.  ``grouped``: first one query per :data:`GROUPS` entry (goals
    proved together are reported ``proved``, their seconds the group's share);
    any group not proved so is re-checked goal by goal."""
    s = fresh(FIELDS, "s")
    a = _args(act, "a")
    out, s2 = act.step(s, a)
    s2 = St({f: (v if z3.is_ast(v) else (z3.BoolVal(v) if isinstance(v, bool) else z3.IntVal(v))) for f, v in s2.items()})
    res: list[tuple[str, str, float]] = []
    props = step_ok(act.name, s, a, out, s2)
    todo = [(n, g, True) for n, g in goals(s2)] + [(f"step:{i}", (lambda i=i: step_ok(act.name, s, a, out, s2)[i]), False)
                                                    for i in props]
    pending: list[tuple[str, Callable[[], Any]]] = []
    # C8's lemma last, its terms built (by ``_framed``) only once every other goal is checked: built first,
    # they changed Z3's search on the others (unmap:cache's C5 went from 1 s to minutes of CPU)
    late = [x for x in todo if x[0] == "align"]
    first = [x for x in todo if x[0] in GOALS_FIRST.get(act.name, ())]
    for name, g, is_inv in first + [x for x in todo if x[0] != "align" and x not in first] + late:
        if only and name not in only:
            continue
        if part is not None and (_group(name) or "core") != part:
            continue
        if name == "align":
            pending.append((name, g))
            continue
        t0 = time.process_time()
        if is_inv and _framed(s, s2, lambda st, name=name: dict(goals(st))[name]()):
            res.append((name, "framed", time.process_time() - t0))
            continue
        pending.append((name, g))
    if grouped:
        rest = [(n, g) for n, g in pending if _group(n) is None]
        for group in GROUPS:
            items = [(n, g) for n, g in pending if _group(n) == group]
            if not items:
                continue
            t0 = time.process_time()
            r = _check_group(group, items, s, a, lambda: act.pre(s, a), timeout_ms)
            if r == z3.unsat:
                share = (time.process_time() - t0) / len(items)
                res += [(n, "proved", share) for n, _g in items]
            else:
                rest += items
        pending = rest
    hyps: dict[Any, Any] = {}   # (deps, lemma, skolems) -> the instantiated hypothesis (built once per action)
    solvers: dict[Any, Any] = {}

    def hyp(deps: tuple[str, ...], lemma: bool = False) -> Any:
        key = (deps, lemma, tuple(str(x) for x in MODE.terms1), len(MODE.terms))
        if key not in hyps:
            hyps[key] = And(inv(s, deps), act.pre(s, a), *([unmapped_aligned(s)] if lemma else []))
        return hyps[key]

    for name, g in pending:
        t0 = time.process_time()
        if name == "align" and _framed(s, s2, unmapped_aligned):
            res.append((name, "framed", time.process_time() - t0))
            continue
        r = None
        if grouped and _deps(name) and name.startswith("step:"):
            # the step properties read the ghost sums only through the step's own definitions: first without them
            r, _m = _check(lambda: hyp(()), g, s, a, timeout_ms // 4, solvers if grouped else None)
        if r != z3.unsat:
            r, _m = _check(lambda name=name: hyp(_deps(name), name in ALIGNED_GOALS), g, s, a, timeout_ms,
                           solvers if grouped else None)
        res.append((name, "proved" if r == z3.unsat else str(r), time.process_time() - t0))
    return res


def safety_c1(timeout_ms: int = 30000) -> str:
    """C1 follows from the invariant: reserved = free + active >= active; slack >= 0; reserved <= the device."""
    s = fresh(FIELDS, "s")
    r, _m = _check(lambda: inv(s), lambda: c1(s), s, St(), timeout_ms)
    return "proved" if r == z3.unsat else str(r)


def initiation() -> str:
    """The empty allocator satisfies the invariant and C8's lemma (``init`` has no quantifier to instantiate)."""
    s = fresh(FIELDS, "s")
    h, g = _instantiate(lambda: init(s), lambda: And(inv(s), unmapped_aligned(s)), s, St())
    sol = Query(30000)
    sol.add(h, Not(g))
    return "proved" if sol.check() == z3.unsat else "FAILED"


# --------------------------------------------------------------------------
# unguarded variants: the same action with one guard removed
# --------------------------------------------------------------------------

#: invariant -> (encoded action, guard removed, the guard in words)
UNGUARDED: dict[str, tuple[str, str, str]] = {
    "C1": ("malloc:new", "room", "a new segment only if reserved + its size fits the device"),
    "C2": ("malloc:new", "fresh", "a new segment's base is disjoint from every segment"),
    "C3": ("free:merge", "merge-next", "a freed block merges with its next neighbour when that is free"),
    "C4": ("malloc:fit", "pool", "a candidate block is of the request's pool"),
    "C5": ("malloc:fit", "split", "split only if should_split (the remainder is legal)"),
    "C6": ("empty_cache", "whole", "empty_cache releases a free block only if it is its whole segment"),
    "C7": ("process_event:free", "event", "an event is processed only when its stream completed it"),
    "C8": ("expand:oom", "map-lacking", "map only the pages the request lacks (not the whole unmapped block)"),
    "C9": ("malloc_retry:oom", "after", "the OOM figures are taken after the retry released the cache"),
}

#: the policy knobs' unguarded variants: knob -> (invariant, encoded action, guard removed, the guard in words)
KNOB_UNGUARDED: dict[str, tuple[str, str, str, str]] = {
    "memory_fraction": ("C1", "malloc:new", "cap", "a new segment only if it fits the memory_fraction cap"),
    "roundup_power2_divisions": ("C1", "malloc:new", "round-up", "the rounded size is at least the request"),
    "garbage_collection_threshold": ("C2", "gc:release", "gc-whole",
                                     "the garbage collection releases only whole free segments"),
    "release_available": ("C2", "avail:one", "avail-whole", "release_available releases only whole segments"),
    "expandable_segments": ("C1", "expand:map", "map-room",
                            "an arena's pages are mapped only if reserved + them fits the device"),
}

#: the refutation's search: heaps of at most this many blocks (every quantifier expanded exactly)
REFUTE_BLOCKS = 4


#: a refutation's budget (ms of CPU, :class:`~.solving.Query`): every refutation's heap comes in under
#: 0.4 s of CPU under some seed of the ladder (C8's under seed 1 in 0.07 s, while seed 0 runs away, so
#: the ladder's first attempt, 1/16 of this budget, is the cost of C8's refutation: 12.5 s at 60 s)
REFUTE_MS = 20000


def refute(inv_id: str, timeout_ms: int = REFUTE_MS, knob: str | None = None) -> tuple[bool, str]:
    """A well-formed heap (the whole inductive invariant holds on it, at most
    :data:`REFUTE_BLOCKS` blocks, every quantifier expanded exactly) from which
    the unguarded action breaks the invariant it names.  ``(refuted, trace)``."""
    act_name, guard, words = UNGUARDED[inv_id] if knob is None else KNOB_UNGUARDED[knob][1:]
    act = next(x for x in actions(frozenset({guard})) if x.name == act_name)
    s = fresh(FIELDS, "u")
    a = _args(act, "u")
    MODE.kind, MODE.bound = "bounded", REFUTE_BLOCKS + 2
    try:
        out, s2 = act.step(s, a)
        named = NAMED.get(inv_id)
        bad = [Not(named(s2))] if named is not None else []
        props = step_ok(act_name, s, a, out, s2)
        if inv_id in props:
            bad.append(Not(props[inv_id]))
        hyp = And(inv(s), unmapped_aligned(s), s.n <= REFUTE_BLOCKS, act.pre(s, a))
    finally:
        MODE.kind, MODE.bound = "forall", 0
    r, m = solving.check(hyp, Or(*bad), budget_ms=timeout_ms)
    if m is None:
        return False, f"without '{words}': no violation of {inv_id} found ({r})"
    ev = lambda x: m.eval(x, model_completion=True)  # noqa: E731
    n = ev(s.n).as_long()
    lines = [f"  from a well-formed heap of {n} block(s) (seed preset: {ev(s.seed)}, capacity {ev(s.cap)}, "
             f"max_split_size {ev(s.ms)}, memory_fraction cap {ev(s.lim) if z3.is_true(ev(s.hf)) else 'unset'}, "
             f"expandable segments: {ev(s.ex)}, reserved {ev(s.Rs + s.Rl)}"
             + (f"; mapping {ev(s.mr)} bytes, head {ev(s.xh)}" if z3.is_true(ev(s.xp)) else "") + "):"]
    for i in range(n):
        if z3.is_true(ev(at(s.al, i))):
            lines.append(f"    block {i}: addr {ev(at(s.ad, i))} size {ev(at(s.sz, i))} "
                         f"{('free', 'live', 'pending', 'unmapped')[ev(at(s.k, i)).as_long()]} stream {ev(at(s.sr, i))} "
                         f"segment {ev(at(s.sb, i))}+{ev(at(s.ss, i))}")
    lines.append(f"  {act_name}(" + ", ".join(f"{k}={ev(v)}" for k, v in a.items()) + f") [without: {words}]")
    # what the model breaks, evaluated (never copied from "refuted"): the named invariant or the step property
    what = ("named invariant" if named is not None and not z3.is_true(ev(named(s2)))
            else "step property" if inv_id in props and not z3.is_true(ev(props[inv_id])) else "unknown")
    lines.append(f"  => {inv_id} violated ({what})")
    return True, "\n".join(lines)


# --------------------------------------------------------------------------
# the C rows of ``memspec prove``
# --------------------------------------------------------------------------

#: the caching catalog's rows this heap encoding does not prove, keyed by id, and why: none (C8, expandable
#: segments' OutOfMemory only at physical exhaustion, is a step property of the mapping's failures here)
NOT_HEAP_ENCODED: dict[str, str] = {}
#: what the encoding leaves out, per invariant of the caching catalog (:data:`memspec.spec.caching.CATALOG`,
#: in its order; a proof with a restriction is reported bounded, never proved): nothing for every row but
#: those of :data:`NOT_HEAP_ENCODED` -- one encoding of both presets and of expandable segments on and off
#: (symbolic flags) over an arbitrary well-formed heap
BOUNDED: dict[str, str | None] = {e.id: NOT_HEAP_ENCODED.get(e.id) for e in CACHING_CATALOG}


#: the consecution checks of an action in three units (each its own pool task): the invariant's conjuncts
#: and the step properties, the ghost sums' step equations, the ghost sums' monotonicity
STEP_PARTS = ("core", *GROUPS)
#: rough CPU seconds of the costliest units (measured one by one; only the pool's order depends on it)
HEAP_UNIT_COST = {"unmap:cache": 50.0, "malloc:fit": 28.0, "expand:map": 11.0, "malloc:new": 11.0,
                  "unmap:free": 10.7, "expand:serve": 5.5, "malloc_retry:expand": 4.7}
#: the actions whose consecution is split into :data:`STEP_PARTS`: those of :data:`HEAP_UNIT_COST` (over
#: ~10 s CPU in one unit when measured)
SPLIT_STEPS = tuple(HEAP_UNIT_COST)


def unit_cost(unit: tuple[str, ...]) -> float:
    """A static estimate of a unit's CPU seconds (for the pool's longest-first order)."""
    if unit[0] in ("refute", "knob"):
        return 3.0
    if unit[0] == "step" and len(unit) > 1:
        whole = HEAP_UNIT_COST.get(unit[1], 2.0)
        return whole / len(STEP_PARTS) if len(unit) > 2 else whole
    return 1.0


def heap_units(ids: list[str] | None = None) -> list[tuple[str, ...]]:
    """The independent checks of the heap induction (initiation, C1 as a consequence, consecution of every
    encoded action -- shared by C1-C9: one inductive invariant --, each invariant's unguarded variant), in
    report order: each unit is run by :func:`heap_unit` (in any process: ``memspec prove --jobs``) and the
    results joined by :func:`join_units`."""
    units: list[tuple[str, ...]] = [("init",), ("safety",), ("rounding",)]
    for act in actions():
        if act.name in COVERED:
            units.append(("covered", act.name))
        elif act.name in SPLIT_STEPS:
            units += [("step", act.name, part) for part in STEP_PARTS]
        else:
            units.append(("step", act.name))
    units += [("phase", act.name) for act in phase_actions()]
    units.append(("kernels",))
    units += [("refute", c) for c in UNGUARDED if ids is None or c in ids]
    units += [("knob", k) for k in KNOB_UNGUARDED]
    return units


def heap_unit(unit: tuple[str, ...], timeout_ms: int = 20000) -> dict[str, Any]:
    """One unit of :func:`heap_units`: ``{"checks": [(name, result, cpu s)], "refuted": {id: (ok, trace)}}``."""
    kind = unit[0]
    checks: list[tuple[str, str, float]] = []
    refuted: dict[str, tuple[bool, str]] = {}
    t1 = time.process_time()
    if kind == "init":
        checks.append(("init", initiation(), 0.0))
    elif kind == "safety":
        checks.append(("safety:C1", safety_c1(timeout_ms), 0.0))
    elif kind == "rounding":
        res = rounding_lemma()
        checks.append(("lemma: the rounding kernel (divisions) satisfies malloc's rounding constraints",
                       res, time.process_time() - t1))
    elif kind == "covered":
        act = next(x for x in actions() if x.name == unit[1])
        res = covered(act, timeout_ms)
        checks.append((f"step:{act.name}: an instance of {COVERED[act.name]} (same step, precondition implies "
                       f"its)", res, time.process_time() - t1))
    elif kind in ("step", "phase"):
        act = next(x for x in (actions() if kind == "step" else phase_actions()) if x.name == unit[1])
        part = unit[2] if len(unit) > 2 else None
        checks += [(f"step:{act.name}:{goal}", result, secs)
                   for goal, result, secs in consecution(act, timeout_ms, part=part)]
    elif kind == "kernels":
        bad = kernel_boundary_agreement()
        checks.append(("kernels at every threshold vs spec/caching",
                       "proved" if not bad else f"{len(bad)} mismatches: {bad[:2]}", 0.0))
    elif kind == "refute":
        refuted[unit[1]] = refute(unit[1])
    elif kind == "knob":
        c, act_name, _g, words = KNOB_UNGUARDED[unit[1]]
        ok, _trace = refute(c, knob=unit[1])
        checks.append((f"refuted: {act_name} without '{words}' ({unit[1]}) breaks {c}",
                       "proved" if ok else "NOT refuted", 0.0))
    else:
        raise ValueError(f"unknown heap unit {unit!r}")
    return {"checks": checks, "refuted": refuted, "seconds": time.process_time() - t1}


def join_units(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The heap induction's record (checks, per-invariant refutations, CPU seconds summed over the units)
    from the units' results, in the units' order (so the record does not depend on which process ran which
    unit)."""
    checks = [c for r in results for c in r["checks"]]
    refuted = {k: v for r in results for k, v in r["refuted"].items()}
    return {"checks": checks, "refuted": refuted, "seconds": sum(r["seconds"] for r in results),
            "actions": {a.name: list(a.spec) for a in actions()}}


#: the divisions tables the kernel agreement checks (besides none): one entry everywhere, and a mixed table
DIVISION_TABLES = ((4,) * 16, (1, 2, 4, 8, 16, 2, 4, 8, 16, 1, 2, 4, 8, 16, 2, 16))


def division_points(table: tuple[int, ...]) -> tuple[int, ...]:
    """The thresholds of the division rounding: each power of two from 2**10 to 2**40 and, inside its
    interval, every step of the entry that applies (up to 16), and each entry's start ``512 * d``."""
    pts = {K_MIN_BLOCK * d for d in table if d > 1}
    for e in range(10, 41):
        d = table[min(max(0, e - 20), 15)]
        step = (1 << e) // d if d > 1 else 1 << e
        pts.update((1 << e) + k * step for k in range(max(d, 1)))
    return tuple(sorted(pts))


def kernel_boundary_agreement(max_split_sizes: tuple[int, ...] = (0, 4 * MiB)) -> list[str]:
    """The Z3 kernels (rounding, segment size, split rule) against
    spec/caching's at every threshold of the policy exactly and at +-1
    (:func:`memspec.spec.caching.kernels.boundaries`: request sizes and the
    split rules' remainders), both presets, both pools, with and without
    ``max_split_size``; the rounding with roundup_power2_divisions
    (:data:`DIVISION_TABLES`) at every threshold of :func:`division_points`
    +-1, where the spec's rounded size must also satisfy :func:`round_ok`
    (what the proofs use); the mismatches.  Read from the spec's module at
    call time, so a patched spec kernel is what is compared."""
    from memspec.spec.caching import kernels as SK

    n, r, rem, ms = z3.Ints("kb_n kb_r kb_rem kb_ms")
    seed, ex = z3.Bool("kb_seed"), z3.Bool("kb_ex")
    small = z3.Bool("kb_small")
    dv = z3.Array("kb_dv", z3.IntSort(), z3.IntSort())
    st = St({"seed": seed, "ms": ms, "dv": dv, "ex": ex})
    er, es, ep = z_round(st, n), z_segment(st, r), z_split(st, rem, r, small)
    ok = round_ok(st, n, r)
    ev = lambda e, *subs: z3.simplify(z3.substitute(e, *subs))  # noqa: E731  (a kernel at concrete values)
    bad: list[str] = []
    none = z3.K(z3.IntSort(), z3.IntVal(0))
    for table in DIVISION_TABLES:
        arr = none
        for k, d in enumerate(table):
            arr = z3.Store(arr, k, d)
        er_t = ev(er, (seed, z3.BoolVal(False)), (dv, arr))
        ok_t = z3.substitute(ok, (seed, z3.BoolVal(False)), (dv, arr))
        for size in sorted({p + d for p in division_points(table) for d in (-1, 0, 1)}):
            want = SK.round_size(size, False, SK.divisions_for(size, table))
            got = ev(er_t, (n, z3.IntVal(size))).as_long()
            if got != want:
                bad.append(f"divisions {table[:4]}... size={size}: z3 round {got}, spec {want}")
            if not z3.is_true(ev(ok_t, (n, z3.IntVal(size)), (r, z3.IntVal(want)))):
                bad.append(f"divisions {table[:4]}... size={size}: the spec's rounding {want} breaks round_ok")
    for msz in max_split_sizes:
        points = SK.boundaries(msz)
        for preset_seed in (False, True):
            base = [(seed, z3.BoolVal(preset_seed)), (ms, z3.IntVal(msz)), (dv, none)]
            for size in points:
                rounded = SK.round_size(size, preset_seed)
                got_r = ev(er, *base, (n, z3.IntVal(size))).as_long()
                got_s = ev(es, *base, (r, z3.IntVal(rounded))).as_long()
                want_s = SK.segment_size(rounded, preset_seed)
                if (got_r, got_s) != (rounded, want_s):
                    bad.append(f"seed={preset_seed} size={size}: z3 round/segment {(got_r, got_s)}, spec {(rounded, want_s)}")
            # the split rule reads the request only through ``request < max_split_size``: the requests at
            # that threshold (+-1 block) and one below every threshold, against every remainder
            reqs = sorted({SK.round_size(x, preset_seed) for x in points if msz and abs(x - msz) <= K_MIN_BLOCK}
                          | {K_MIN_BLOCK, SK.round_size(3 * MiB, preset_seed)})
            for rounded in reqs:
                for sm in (True, False):
                    for exp in (False, True):   # expandable segments: pytorch splits any remainder >= 512
                        for remaining in points:
                            got = z3.is_true(ev(ep, *base, (ex, z3.BoolVal(exp)), (small, z3.BoolVal(sm)),
                                                (rem, z3.IntVal(remaining)), (r, z3.IntVal(rounded))))
                            want = SK.should_split(remaining, rounded, sm, preset_seed, exp, msz)
                            if got != want:
                                bad.append(f"seed={preset_seed} small={sm} expandable={exp} ms={msz} "
                                           f"request={rounded} remaining={remaining}: z3 split={got}, spec split={want}")
    return bad
