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
ghosts (:func:`memspec.invariants.proofs.prefix_sum`): free / active (live +
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
"""

from __future__ import annotations

import time
from typing import Any, Callable

import z3

from memspec.invariants.z3fast import And, Implies, Not, Or
from memspec.invariants.proofs import limit  # Z3 resource limits, not wall-clock timeouts

from memspec.invariants.proofs import (
    ARR, BARR, BOOL, CODE, INT, OK, PENDING, Act, Proof, St, at, upd,
)
from memspec.spec.caching.invariants import CATALOG as CACHING_CATALOG

MiB = 1 << 20
K_MIN_BLOCK = 512
K_SMALL = MiB
K_SMALL_BUFFER = 2 * MiB
K_LARGE_BUFFER = 20 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB
ONE_EB = 1 << 60
STREAMS = 3
FREE, LIVE, PEND, UNM = 0, 1, 2, 3
OOM = CODE["OutOfMemory"]
DOUBLE = CODE["DoubleFree"]

#: the ghost prefix sums: name -> (pool, contribution kind)
#: N free bytes not a whole segment, W whole-free segments, A active (live + pending), L live, Q slack (size - requested)
SUMS = {f"{c}{p}": (p == "s", c) for c in ("N", "W", "A", "L", "Q") for p in ("s", "l")}

FIELDS: dict[str, str] = {
    "n": INT, "al": BARR, "ad": ARR, "sz": ARR, "k": ARR, "rq": ARR, "sm": BARR, "sr": ARR,
    "sb": ARR, "ss": ARR, "pv": ARR, "nx": ARR,
    **{f"u{s}": BARR for s in range(STREAMS)}, **{f"e{s}": ARR for s in range(STREAMS)},
    **{f"i{s}": INT for s in range(STREAMS)}, **{f"c{s}": INT for s in range(STREAMS)},
    "seed": BOOL, "ms": INT, "cap": INT, "Rs": INT, "Rl": INT,
    # expandable segments (the policy flag ``ex``): every segment is a VA arena of ``vs`` (small pool) / ``vl``
    # (large pool) bytes whose pages (:func:`page`) are mapped on demand; a block of kind ``UNM`` is unmapped
    "ex": BOOL, "vs": INT, "vl": INT,
    # the policy's knobs: memory_fraction (``hf``: set; ``lim``: the per-process cap int(fraction * capacity)),
    # garbage_collection_threshold (``gce``: on; ``gth``: int(threshold * cap)), roundup_power2_divisions (``dv``:
    # the 16 entries, 0 = none)
    "hf": BOOL, "lim": INT, "gce": BOOL, "gth": INT, "dv": ARR,
    # a malloc in progress (``mn`` bytes on stream ``mt``, rounded ``mr``) in one of its phases: ``gp`` the
    # garbage collection, ``ra`` release_available (want ``wa``, ``rsum`` released so far), ``md`` the retry
    # after every event completed (release every cached segment)
    "md": BOOL, "gp": BOOL, "ra": BOOL, "mn": INT, "mt": INT, "mr": INT, "wa": INT, "rsum": INT,
    "ret": INT,                                  # empty_cache's answer
    # the expandable malloc in progress (``xp``): the free head ``xh`` of the run grown so far (-1: none yet),
    # the unmapped block ``xq`` to map first when there is no head (-1: a fresh arena), ``x2`` the retry's attempt
    "xp": BOOL, "xh": INT, "xq": INT, "x2": BOOL,
    "oq": INT, "orr": INT, "oa": INT, "olf": INT,  # the last OOM's figures
    **{name: ARR for name in SUMS},
}
#: fields compared by the agreement (the rest are ghosts)
GHOSTS = ("pv", "nx", *SUMS)


# --------------------------------------------------------------------------
# quantifiers over block ids, in four modes:
#  * a concrete heap (``n`` a Python int): the conjunction over the ids;
#  * "skolem" (a goal): the body at a fresh constant in range (the negated
#    goal is then quantifier-free: some id breaks it);
#  * "inst" (a hypothesis): the body at every term of a finite set (sound:
#    a universally quantified hypothesis implies each instance);
#  * "bounded" (model checking from the empty allocator): the conjunction
#    over ids below a bound every reachable ``n`` stays under.
# --------------------------------------------------------------------------

class _Mode:
    kind = "forall"
    shared = False        # skolem mode: one skolem for every unary goal, one pair for every binary one
    terms: list = []      # every instance term (action terms and skolems, each also +1)
    terms1: list = []     # the action terms and skolems (pairs of these)
    anchors: list = []    # skolems, 0 and n (a monotonicity pair has one of these)
    skolems: list = []
    bound = 0
    eval_memo = False     # memoize :func:`_reads` builders (the transition agreement only, never a proof)


MODE = _Mode()


def _all(n: Any, body: Callable[[Any], Any], hi: int = 0, wide: bool = False) -> Any:
    """``for every id 0 <= i < n + hi: body(i)`` (``wide``: instantiated at the +1 terms too)."""
    if isinstance(n, int):
        return And(*[body(z3.IntVal(i)) for i in range(n + hi)]) if n + hi else z3.BoolVal(True)
    lim = n + hi
    if MODE.kind == "skolem":
        i = z3.Int("sku") if MODE.shared else z3.Int(f"sk{len(MODE.skolems)}")
        if not any(z3.eq(i, x) for x in MODE.skolems):
            MODE.skolems.append(i)
        return Implies(And(0 <= i, i < lim), body(i))
    if MODE.kind == "inst":
        return And(*[Implies(And(0 <= x, x < lim), body(x)) for x in (MODE.terms if wide else MODE.terms1)])
    if MODE.kind == "bounded":
        return And(*[Implies(x < lim, body(z3.IntVal(x))) for x in range(MODE.bound + hi)])
    i = z3.FreshInt("i")
    return z3.ForAll([i], Implies(And(0 <= i, i < lim), body(i)))


def _all2(n: Any, body: Callable[[Any, Any], Any], hi: int = 0) -> Any:
    if isinstance(n, int):
        ids = [z3.IntVal(i) for i in range(n + hi)]
        return And(*[body(i, j) for i in ids for j in ids]) if ids else z3.BoolVal(True)
    lim = n + hi
    if MODE.kind == "skolem":
        if MODE.shared:
            i, j = z3.Int("skv0"), z3.Int("skv1")
        else:
            i, j = z3.Int(f"sk{len(MODE.skolems)}"), z3.Int(f"sk{len(MODE.skolems) + 1}")
        MODE.skolems += [x for x in (i, j) if not any(z3.eq(x, y) for y in MODE.skolems)]
        return Implies(And(0 <= i, i < lim, 0 <= j, j < lim), body(i, j))
    if MODE.kind == "inst":
        if hi:
            anchors = {a.get_id() for a in MODE.anchors}
            pairs = [(x, y) for x in MODE.terms for y in MODE.terms
                     if x.get_id() in anchors or y.get_id() in anchors]
        else:
            pairs = [(x, y) for x in MODE.terms1 for y in MODE.terms1]
        return And(*[Implies(And(0 <= x, x < lim, 0 <= y, y < lim), body(x, y)) for x, y in pairs])
    if MODE.kind == "bounded":
        ids = range(MODE.bound + hi)
        return And(*[Implies(And(x < lim, y < lim), body(z3.IntVal(x), z3.IntVal(y))) for x in ids for y in ids])
    i, j = z3.FreshInt("i"), z3.FreshInt("j")
    return z3.ForAll([i, j], Implies(And(0 <= i, i < lim, 0 <= j, j < lim), body(i, j)))


def _sum(n: Any, P: Any, c: Callable[[Any], Any]) -> Any:
    """``P`` is the checked prefix-sum ghost of ``c`` over the ids ``0 <= i < n``:
    ``P[0] = 0``, ``P[i+1] = P[i] + c(i)``, ``P`` monotone on ``[0, n]``."""
    return And(at(P, 0) == 0, _all(n, lambda i: at(P, i + 1) == at(P, i) + c(i), wide=True),
                  _all2(n, lambda i, j: Implies(i <= j, at(P, i) <= at(P, j)), hi=1))


# --------------------------------------------------------------------------
# the policy kernels (spec/caching/kernels.py, re-stated from the seed's words)
# --------------------------------------------------------------------------

def ceil_to(x: Any, unit: int) -> Any:
    return ((x + unit - 1) / unit) * unit


#: the legal roundup_power2_divisions entries (spec/caching/kernels.round_size's contract: 0 = none)
DIVISIONS = (0, 1, 2, 4, 8, 16)
#: the powers of two the division rounding is split on: sizes in ``[2**e, 2**(e+1))`` for these ``e``
#: (below 2**10 no entry can apply: ``size > 512 * d`` with ``d >= 2``; above, past 1 EB)
_EXPS = range(10, 64)


def _torch_round_cases(s: St, n: Any) -> tuple[list[tuple[Any, Any]], Any]:
    """PyTorch's rounding as ``(interval condition, value)`` per power-of-two interval, and the value outside them."""
    plain = z3.If(n < K_MIN_BLOCK, K_MIN_BLOCK, ceil_to(n, K_MIN_BLOCK))
    cases = []
    for e in _EXPS:
        d = at(s.dv, min(max(0, e - 20), 15))
        div = plain
        for dd in DIVISIONS:
            if dd > 1 and (2 << e) > K_MIN_BLOCK * dd:    # else ``n > 512 * d`` cannot hold in this interval
                div = z3.If(And(d == dd, n > K_MIN_BLOCK * dd), ceil_to(n, (1 << e) // dd), div)
        cases.append((And((1 << e) <= n, n < (2 << e)), div))
    return cases, plain


def z_round(s: St, n: Any) -> Any:
    """Every request rounds to a 512 B multiple (pytorch: below 512 -> 512); the toy: above 1 MiB, 2 MiB
    multiples.  PyTorch's roundup_power2_divisions, exactly, as a case split per power-of-two interval:
    for ``2**e <= n < 2**(e+1)`` the entry ``d = dv[min(max(0, e - 20), 15)]`` (one per power of two from
    1 MiB, clamped); with ``d > 1`` and ``n > 512 * d`` the next multiple of ``2**e / d`` (a power of two
    stays), else the next 512 multiple."""
    seed_r = z3.If(n <= K_SMALL, ceil_to(n, K_MIN_BLOCK), ceil_to(n, K_ROUND_LARGE))
    cases, torch_r = _torch_round_cases(s, n)
    for cond, val in cases:
        torch_r = z3.If(cond, val, torch_r)
    return z3.If(s.seed, seed_r, torch_r)


def round_ok(s: St, n: Any, r: Any, guards: frozenset = frozenset()) -> Any:
    """What the proofs use of the rounding (malloc takes the rounded size ``r`` as an argument constrained
    by this): the toy's ladder exactly; pytorch's: ``r >= n``, a 512 multiple >= 512, and in the pool of
    ``n`` (``r <= 1 MiB`` iff ``n <= 1 MiB``).  :func:`rounding_lemma` proves that :func:`z_round` (every
    divisions table of legal entries) satisfies it, and :func:`kernel_boundary_agreement` checks it on the
    spec's own rounding at every threshold."""
    seed_r = z3.If(n <= K_SMALL, ceil_to(n, K_MIN_BLOCK), ceil_to(n, K_ROUND_LARGE))
    up = r >= n if "round-up" not in guards else z3.BoolVal(True)
    return z3.If(s.seed, r == seed_r, And(up, r >= K_MIN_BLOCK, r % K_MIN_BLOCK == 0,
                                             (r <= K_SMALL) == (n <= K_SMALL)))


def legal_divisions(s: St) -> Any:
    return And(*[Or(*[at(s.dv, k) == d for d in DIVISIONS]) for k in range(16)])


def rounding_lemma(timeout_ms: int = 60000) -> str:
    """``round_ok(n, z_round(n))`` for every request ``n >= 1`` and every table of legal entries: one query
    per case of :func:`z_round` (the toy's ladder; each power-of-two interval; outside them), the cases'
    conditions pairwise disjoint (each interval is ``[2**e, 2**(e+1))``), so together they are the claim."""
    from memspec.invariants.proofs import fresh

    s = fresh(FIELDS, "rl")
    n = z3.Int("rl_n")
    cases, plain = _torch_round_cases(s, n)
    queries = [(s.seed, z_round(s, n))] + [(And(Not(s.seed), c), v) for c, v in cases] + \
              [(And(Not(s.seed), *[Not(c) for c, _v in cases]), plain)]
    sol = limit(z3.Solver(), timeout_ms)
    sol.add(n >= 1, legal_divisions(s))
    for cond, val in queries:
        sol.push()
        sol.add(cond, Not(round_ok(s, n, val)))
        r = sol.check()
        sol.pop()
        if r != z3.unsat:
            return f"{r} (case {cond})"
    return "proved"


def z_segment(s: St, r: Any) -> Any:
    """<= 1 MiB: 2 MiB; the toy: max(20 MiB, r); pytorch: < 10 MiB: 20 MiB, else the next 2 MiB multiple."""
    return z3.If(r <= K_SMALL, K_SMALL_BUFFER,
                 z3.If(s.seed, z3.If(r > K_LARGE_BUFFER, r, K_LARGE_BUFFER),
                       z3.If(r < K_MIN_LARGE_ALLOC, K_LARGE_BUFFER, ceil_to(r, K_ROUND_LARGE))))


def z_split(s: St, rem: Any, r: Any, small: Any) -> Any:
    """The toy: remainder >= 512 B small pool, >= 2 MiB large pool; pytorch: small pool or expandable
    segments >= 512, else large pool ``r < max_split_size`` (0 = unlimited) and remainder > 1 MiB."""
    seed_s = z3.If(small, rem >= K_MIN_BLOCK, rem >= K_ROUND_LARGE)
    torch_s = z3.If(Or(small, s.ex), rem >= K_MIN_BLOCK, And(Or(s.ms == 0, r < s.ms), rem > K_SMALL))
    return z3.If(s.seed, seed_s, torch_s)


def page(s: St, small: Any) -> Any:
    """An expandable arena's page: the toy's 2 MiB; pytorch 2 MiB (small pool) / 20 MiB (large pool)."""
    return z3.If(Or(s.seed, small), K_ROUND_LARGE, K_LARGE_BUFFER)


def ceil_pg(x: Any, pg: Any) -> Any:
    """``x`` rounded up to the page ``pg`` (2 MiB or 20 MiB: a case split keeps the division by a constant)."""
    return z3.If(pg == K_ROUND_LARGE, ceil_to(x, K_ROUND_LARGE), ceil_to(x, K_LARGE_BUFFER))


def floor_pg(x: Any, pg: Any) -> Any:
    return z3.If(pg == K_ROUND_LARGE, (x / K_ROUND_LARGE) * K_ROUND_LARGE, (x / K_LARGE_BUFFER) * K_LARGE_BUFFER)


# --------------------------------------------------------------------------
# invariants
# --------------------------------------------------------------------------

def _contrib(s: St, name: str) -> Callable[[Any], Any]:
    small, c = SUMS[name]

    def f(i: Any) -> Any:
        mine = And(at(s.al, i), at(s.sm, i) == small)
        kk, size = at(s.k, i), at(s.sz, i)
        whole = And(size == at(s.ss, i), Not(s.ex))
        act = Or(kk == LIVE, kk == PEND)
        val = {"N": z3.If(And(kk == FREE, Not(whole)), size, 0), "A": z3.If(act, size, 0),
               "L": z3.If(kk == LIVE, size, 0), "Q": z3.If(act, size - at(s.rq, i), 0),
               "W": z3.If(And(kk == FREE, whole), size, 0)}[c]
        return z3.If(mine, val, 0)
    return f


def total(s: St, name: str) -> Any:
    return at(s[name], s.n)


def block_wf(s: St, i: Any) -> Any:
    """One block is well formed: inside its segment, a legal kind (unmapped only in an expandable
    arena), pool and segment size agree (a plain segment: 2 MiB iff small), its pv/nx witnesses are the
    neighbours; the toy's large pool keeps 2 MiB offsets and segment sizes."""
    ad, sz, kk, rq, ss, sb = at(s.ad, i), at(s.sz, i), at(s.k, i), at(s.rq, i), at(s.ss, i), at(s.sb, i)
    p, q = at(s.pv, i), at(s.nx, i)
    us = [at(s[f"u{t}"], i) for t in range(STREAMS)]
    return Implies(at(s.al, i), And(
        sz > 0, sb >= 0,
        sb <= ad, ad + sz <= sb + ss,
        Or(kk == FREE, kk == LIVE, kk == PEND, And(kk == UNM, s.ex)),
        z3.If(Or(kk == FREE, kk == UNM), rq == 0, And(0 < rq, rq <= sz)),
        Implies(Not(s.ex), at(s.sm, i) == (ss == K_SMALL_BUFFER)), ss >= K_SMALL_BUFFER,
        Implies(And(s.seed, Not(at(s.sm, i))), And((ad - sb) % K_ROUND_LARGE == 0, ss % K_ROUND_LARGE == 0)),
        0 <= at(s.sr, i), at(s.sr, i) < STREAMS,
        # the tiling witnesses
        z3.If(p == -1, ad == sb, And(0 <= p, p < s.n, p != i, at(s.al, p), at(s.sb, p) == sb,
                                        at(s.ad, p) + at(s.sz, p) == ad, at(s.nx, p) == i)),
        z3.If(q == -1, ad + sz == sb + ss, And(0 <= q, q < s.n, q != i, at(s.al, q), at(s.sb, q) == sb,
                                                  at(s.ad, q) == ad + sz, at(s.pv, q) == i)),
        # recorded uses are of other streams; events only on pending blocks, each <= its stream's issued count
        *[Implies(us[t], at(s.sr, i) != t) for t in range(STREAMS)],
        *[Implies(And(kk == PEND, us[t]), And(at(s[f"e{t}"], i) >= 1, at(s[f"e{t}"], i) <= s[f"i{t}"]))
          for t in range(STREAMS)],
        Implies(Or(kk == FREE, kk == UNM), And(*[Not(u) for u in us])),
    ))


def pair_wf(s: St, i: Any, j: Any) -> Any:
    """Two alive blocks: the same segment (base) -> disjoint, same size, pool,
    stream; different segments -> disjoint segments."""
    same = at(s.sb, i) == at(s.sb, j)
    return Implies(And(at(s.al, i), at(s.al, j), i != j), z3.If(
        same,
        And(at(s.ss, i) == at(s.ss, j), at(s.sr, i) == at(s.sr, j), at(s.sm, i) == at(s.sm, j),
               Or(at(s.ad, i) + at(s.sz, i) <= at(s.ad, j), at(s.ad, j) + at(s.sz, j) <= at(s.ad, i))),
        Or(at(s.sb, i) + at(s.ss, i) <= at(s.sb, j), at(s.sb, j) + at(s.ss, j) <= at(s.sb, i))))


def pending_req(s: St) -> Any:
    """A malloc is in one of its phases (garbage collection, release_available, the retry, the expandable
    mapping)."""
    return Or(s.md, s.gp, s.ra, s.xp)


def _run_ok(s: St, i: Any, kind: int) -> Any:
    """Block ``i`` is alive, of ``kind``, in an arena of the pending request's pool and stream."""
    return And(0 <= i, i < s.n, at(s.al, i), at(s.k, i) == kind, at(s.sm, i) == (s.mr <= K_SMALL),
                  at(s.sr, i) == s.mt)


def expand_wf(s: St) -> Any:
    """The expandable mapping in progress: its head is a free block of the request's pool and stream, or
    (none yet) the unmapped block to map first is one, or -1 (a fresh arena)."""
    return Implies(s.xp, And(s.ex, Or(s.xh == -1, _run_ok(s, s.xh, FREE)),
                                   Implies(s.xh == -1, Or(s.xq == -1, _run_ok(s, s.xq, UNM)))))


def idle(s: St) -> Any:
    return Not(pending_req(s))


def scalars_wf(s: St) -> Any:
    return And(s.n >= 0, s.cap >= 0, s.ms >= 0,
                  *[And(0 <= s[f"c{t}"], s[f"c{t}"] <= s[f"i{t}"]) for t in range(STREAMS)],
                  # at most one phase; the request it serves
                  Not(And(s.md, s.gp)), Not(And(s.md, s.ra)), Not(And(s.gp, s.ra)),
                  Not(And(s.xp, s.md)), Not(And(s.xp, s.gp)), Not(And(s.xp, s.ra)),
                  # the arenas' VA: at least a page, whole pages of the pool's page
                  Implies(s.ex, And(s.vs >= K_SMALL_BUFFER, s.vs % K_ROUND_LARGE == 0, s.vl >= K_SMALL_BUFFER,
                                          s.vl % page(s, False) == 0)),
                  expand_wf(s),
                  Implies(pending_req(s), And(s.mn >= 1, s.mn < ONE_EB, 0 <= s.mt, s.mt < STREAMS,
                                                    round_ok(s, s.mn, s.mr))),
                  Implies(s.md, And(Not(s.seed), *[s[f"c{t}"] == s[f"i{t}"] for t in range(STREAMS)])),
                  Implies(s.gp, s.gce),
                  Implies(s.ra, And(Not(s.seed), Not(s.ex), s.ms > 0, s.wa == z3.If(s.mr > s.ms, s.mr, s.ms),
                                          s.rsum >= 0)))


def sums_wf(s: St, names: tuple[str, ...]) -> Any:
    return And(*[_sum(s.n, s[nm], _contrib(s, nm)) for nm in names])


def reserved_wf(s: St) -> Any:
    """reserved (per pool) = free + active bytes of the pool, and fits the device."""
    return And(s.Rs == total(s, "Ns") + total(s, "Ws") + total(s, "As"),
                  s.Rl == total(s, "Nl") + total(s, "Wl") + total(s, "Al"),
                  s.Rs + s.Rl <= s.cap, within_cap(s))


def within_cap(s: St) -> Any:
    """With memory_fraction set, reserved stays within the per-process cap (0 if the cap is negative: then
    no segment is ever made).  Not with expandable segments: the fraction's check is on the segment size a
    plain malloc would take (``alloc``), the mapping takes whole pages (a 22 MiB request under a 32 MiB cap
    maps a 40 MiB run of 20 MiB pages); the spec's C1 does not claim it."""
    return Implies(And(s.hf, Not(s.ex)), s.Rs + s.Rl <= z3.If(s.lim > 0, s.lim, 0))


def wf(s: St) -> Any:
    return And(scalars_wf(s), _all(s.n, lambda i: block_wf(s, i)), _all2(s.n, lambda i, j: pair_wf(s, i, j)))


def c1(s: St) -> Any:
    """reserved >= allocated >= requested, per pool and in all; reserved <= the device (and <= the
    memory_fraction cap, when set)."""
    parts = []
    for p in ("s", "l"):
        # reserved >= allocated; allocated - requested (the slack) >= 0
        parts += [s[f"R{p}"] >= total(s, f"A{p}"), total(s, f"Q{p}") >= 0]
    return And(*parts, s.Rs + s.Rl <= s.cap, within_cap(s))


def c2(s: St) -> Any:
    """Blocks tile their segment: every block inside it, no two overlap, each
    start the segment start or another block's end (and each end likewise)."""
    return wf(s)


def c3(s: St) -> Any:
    """No two adjacent free blocks (nor two adjacent unmapped runs of an arena)."""
    return _all2(s.n, lambda i, j: Implies(
        And(at(s.al, i), at(s.al, j), at(s.sb, i) == at(s.sb, j), at(s.ad, i) + at(s.sz, i) == at(s.ad, j)),
        And(Not(And(at(s.k, i) == FREE, at(s.k, j) == FREE)),
               Not(And(at(s.k, i) == UNM, at(s.k, j) == UNM)))))


def c4(s: St) -> Any:
    """Pools never mix: an active block of a small-pool segment serves a request <= 1 MiB and vice versa."""
    return _all(s.n, lambda i: Implies(And(at(s.al, i), Or(at(s.k, i) == LIVE, at(s.k, i) == PEND)),
                                          at(s.sm, i) == (at(s.rq, i) <= K_SMALL)))


def c5(s: St) -> Any:
    """The toy's large pool holds only 2 MiB multiples (a remainder below 2 MiB is never split off; its
    arenas map and unmap whole 2 MiB pages)."""
    return _all(s.n, lambda i: Implies(And(at(s.al, i), s.seed, Not(at(s.sm, i))),
                                          at(s.sz, i) % K_ROUND_LARGE == 0))


def c7(s: St) -> Any:
    """A pending block waits for at least one event of another stream; a free one for none."""
    return _all(s.n, lambda i: Implies(And(at(s.al, i), at(s.k, i) == PEND),
                                          Or(*[at(s[f"u{t}"], i) for t in range(STREAMS)])))


# --------------------------------------------------------------------------
# transitions
# --------------------------------------------------------------------------

def _lam_arr(f: Callable[[Any], Any], sort: Any = None) -> Any:
    j = z3.FreshInt("j")
    return z3.Lambda([j], f(j))


def _update_sums(s: St, s2: St, touched: list[tuple[Any, Any]], appended: int,
                 names: tuple[str, ...] = tuple(SUMS)) -> St:
    """Re-establish the prefix-sum ghosts after the base fields changed at the
    ``touched`` ids (each ``(id, valid)``, pairwise distinct when valid) and
    ``appended`` new ids ``n .. n+appended-1``; only the sums ``names`` (the
    step's caller knows the others' contributions did not change: their
    consecution goals check that)."""
    out = St(s2)
    for nm in names:
        c_old, c_new = _contrib(s, nm), _contrib(s2, nm)
        deltas = [(x, z3.If(ok, c_new(x) - c_old(x), 0)) for x, ok in touched]
        P = s[nm]

        def moved(j: Any, P: Any = P, deltas: Any = deltas) -> Any:
            return at(P, j) + z3.Sum([z3.If(j > x, d, 0) for x, d in deltas] or [z3.IntVal(0)])
        P2 = _lam_arr(moved)
        for q in range(appended):
            P2 = upd(P2, s.n + q + 1, at(P2, s.n + q) + c_new(s.n + q))
        out[nm] = P2
    return out


def _merge_free(s: St, b: Any, guards: frozenset = frozenset(), kind: int = FREE) -> tuple[St, list[tuple[Any, Any]]]:
    """Block ``b`` becomes free (``kind``: unmapped) and coalesces with neighbours of that kind (keeping its id)."""
    p, q = at(s.pv, b), at(s.nx, b)
    mp = And(p != -1, at(s.k, p) == kind)
    mq = And(q != -1, at(s.k, q) == kind) if "merge-next" not in guards else z3.BoolVal(False)
    ad = z3.If(mp, at(s.ad, p), at(s.ad, b))
    size = at(s.sz, b) + z3.If(mp, at(s.sz, p), 0) + z3.If(mq, at(s.sz, q), 0)
    newp = z3.If(mp, at(s.pv, p), p)
    newq = z3.If(mq, at(s.nx, q), q)
    al, pv, nx = s.al, s.pv, s.nx
    al = z3.If(mp, upd(al, p, False), al)
    al = z3.If(mq, upd(al, q, False), al)
    out = s.set(al=al, ad=upd(s.ad, b, ad), sz=upd(s.sz, b, size), k=upd(s.k, b, kind), rq=upd(s.rq, b, 0),
                **{f"u{t}": upd(s[f"u{t}"], b, False) for t in range(STREAMS)},
                **{f"e{t}": upd(s[f"e{t}"], b, 0) for t in range(STREAMS)})
    pv = upd(pv, b, newp)
    nx = upd(nx, b, newq)
    pv = z3.If(newq != -1, upd(pv, newq, b), pv)
    nx = z3.If(newp != -1, upd(nx, newp, b), nx)
    out = out.set(pv=pv, nx=nx)
    touched = [(b, z3.BoolVal(True)), (p, mp), (q, mq)]
    return out, touched


_EVAL_MEMO: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = {}
#: at most this many memoized terms of :func:`_reads` (a cache: clearing it changes no term)
EVAL_MEMO_CAP = 300_000


def _reads(*fields: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Memoize a term builder ``fn(s, *args)`` that reads only ``fields`` of ``s``, by those fields' terms
    and the arguments' (Z3 shares equal terms, so a memoized term is the one a rebuild would give).  Only
    while :data:`MODE` ``.eval_memo`` is set: by the transition agreement, which builds an action's
    encoding on concrete heaps of every size (the n x n instances of a best fit read the same blocks again
    and again) and only evaluates it.  A proof never sets it: which terms Z3 sees built, and in what order,
    changes its search (a memo here once took a 0.5 s goal to 45 s)."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(s: St, *args: Any) -> Any:
            if not MODE.eval_memo:
                return fn(s, *args)
            try:
                key = (fn, *[s[f].ast.value for f in fields],
                       *[(x.ast.value if isinstance(x, z3.AstRef) else x) for x in args])
            except AttributeError:   # a field or an argument that is not a term
                return fn(s, *args)
            got = _EVAL_MEMO.get(key)
            if got is None:
                if len(_EVAL_MEMO) >= EVAL_MEMO_CAP:
                    _EVAL_MEMO.clear()
                got = _EVAL_MEMO[key] = (fn(s, *args), (*[s[f] for f in fields], *args))
            return got[0]

        wrapper.__doc__, wrapper.__name__, wrapper.__wrapped__ = fn.__doc__, fn.__name__, fn  # type: ignore[attr-defined]
        return wrapper
    return deco


@_reads("al", "k", "sz", "sm", "sr")
def _cand(s: St, j: Any, r: Any, small: Any, t: Any, guards: frozenset = frozenset()) -> Any:
    parts = [at(s.al, j), at(s.k, j) == FREE, at(s.sz, j) >= r]
    if "pool" not in guards:
        parts.append(at(s.sm, j) == small)
    if "stream" not in guards:
        parts.append(at(s.sr, j) == t)
    return And(*parts)


def _whole_free(s: St, j: Any) -> Any:
    """A plain segment that is one free block (an arena releases pages instead: :func:`unmap_step`)."""
    return And(at(s.al, j), at(s.k, j) == FREE, at(s.sz, j) == at(s.ss, j), Not(s.ex))


def _no_pending(s: St) -> Any:
    return _all(s.n, lambda j: Not(And(at(s.al, j), at(s.k, j) == PEND)))


def _fresh_base(s: St, base: Any, size: Any) -> Any:
    return And(base >= 0, base % K_MIN_BLOCK == 0,
                  _all(s.n, lambda j: Implies(at(s.al, j), Or(base + size <= at(s.sb, j),
                                                                   at(s.sb, j) + at(s.ss, j) <= base))))


def _release_whole(s: St, guards: frozenset = frozenset()) -> St:
    """Release every whole-free segment: its single free block dies; the pool's reserved and free bytes drop by it."""
    whole = (lambda j: _whole_free(s, j)) if "whole" not in guards else \
        (lambda j: And(at(s.al, j), at(s.k, j) == FREE, Not(s.ex)))
    al = _lam_arr(lambda j: And(at(s.al, j), Not(whole(j))))
    out = s.set(al=al, Rs=s.Rs - total(s, "Ws"), Rl=s.Rl - total(s, "Wl"))
    for p in ("s", "l"):   # whole-free blocks count only in W
        out[f"W{p}"] = z3.K(z3.IntSort(), z3.IntVal(0))
    return out


def _new_segment(s: St, r: Any, small: Any, t: Any, base: Any, alloc: Any, rqn: Any) -> St:
    """A new segment at ``base``: its first block serves the request, the legal remainder stays free."""
    split = z_split(s, alloc - r, r, small)
    n = s.n
    out = s.set(n=n + z3.If(split, 2, 1))
    fields = {"al": True, "ad": base, "sz": z3.If(split, r, alloc), "k": LIVE, "rq": rqn, "sm": small, "sr": t,
              "sb": base, "ss": alloc, "pv": -1, "nx": z3.If(split, n + 1, -1)}
    rem = {"al": split, "ad": base + r, "sz": alloc - r, "k": FREE, "rq": 0, "sm": small, "sr": t,
           "sb": base, "ss": alloc, "pv": n, "nx": -1}
    for f in fields:
        out[f] = upd(upd(s[f], n, fields[f]), n + 1, z3.If(split, rem[f], at(s[f], n + 1)))
    for tt in range(STREAMS):
        out[f"u{tt}"] = upd(upd(s[f"u{tt}"], n, False), n + 1, z3.If(split, False, at(s[f"u{tt}"], n + 1)))
        out[f"e{tt}"] = upd(upd(s[f"e{tt}"], n, 0), n + 1, z3.If(split, 0, at(s[f"e{tt}"], n + 1)))
    out["Rs"] = s.Rs + z3.If(small, alloc, 0)
    out["Rl"] = s.Rl + z3.If(small, 0, alloc)
    # appended ids: 2 (the second is dead when no split: contributes 0)
    out = _update_sums(s, out, [], 2)
    out["n"] = n + z3.If(split, 2, 1)
    return out


def _oom_figures(s: St, tried: Any, lf: Any) -> St:
    res = s.Rs + s.Rl
    return s.set(oq=tried, orr=res, oa=total(s, "Ls") + total(s, "Ll"), olf=lf)


def _largest_free_ok(s: St, lf: Any, lw: Any) -> Any:
    """``lf`` is the largest free block (0 if none), ``lw`` its id -- the OOM message's figure."""
    return And(lf >= 0, _all(s.n, lambda j: Implies(And(at(s.al, j), at(s.k, j) == FREE), at(s.sz, j) <= lf)),
                  Or(lf == 0, And(0 <= lw, lw < s.n, at(s.al, lw), at(s.k, lw) == FREE, at(s.sz, lw) == lf)))


MALLOC_PARAMS = {"size": INT, "t": INT, "r": INT, "b": INT, "b2": INT, "u": INT, "base": INT, "lf": INT, "lw": INT}


def _tried(s: St, r: Any, alloc: Any) -> Any:
    """The OOM's "Tried to allocate": the segment size; the toy with expandable segments: the rounded request."""
    return z3.If(And(s.ex, s.seed), r, alloc)


def room(s: St, alloc: Any, guards: frozenset = frozenset(), r: Any = None) -> Any:
    """``_alloc_block``'s test: the new segment fits the per-process cap (memory_fraction, when set) and the
    device."""
    if "room" in guards:
        return z3.BoolVal(True)
    used = s.Rs + s.Rl + alloc
    if r is not None:
        # the toy with expandable segments maps the rounded request's pages: the cap is checked on them
        used = s.Rs + s.Rl + z3.If(And(s.ex, s.seed), ceil_pg(r, page(s, r <= K_SMALL)), alloc)
    cap = Or(Not(s.hf), used <= s.lim) if "cap" not in guards else z3.BoolVal(True)
    # expandable segments: only the memory_fraction check here (on ``alloc``); the device's is per page mapped
    return z3.If(s.ex, cap, And(cap, used <= s.cap))


@_reads("nx", "sz", "k")
def _grow(s: St, j: Any) -> Any:
    """PyTorch's ``expandable_size``: a free block's size plus the unmapped block after it."""
    q = at(s.nx, j)
    return at(s.sz, j) + z3.If(And(q != -1, at(s.k, q) == UNM), at(s.sz, q), 0)


@_reads("sz", "ad")
def _key_lt(s: St, i: Any, j: Any) -> Any:
    return Or(at(s.sz, i) < at(s.sz, j), And(at(s.sz, i) == at(s.sz, j), at(s.ad, i) < at(s.ad, j)))


def grow_best(s: St, b: Any, b2: Any, cand: Callable[[Any], Any]) -> Any:
    """get_free_block with expandable segments: from the smallest candidate (size, then address) it moves
    on to the next while that one's expandable size is smaller: ``b`` ends a chain of candidates whose
    expandable sizes strictly decrease (every pair of candidates up to ``b``), and ``b2`` (its successor
    candidate, or -1: none) does not continue it."""
    body = lambda i, j: Implies(And(cand(i), cand(j), _key_lt(s, i, j), _key_le(s, j, b)),  # noqa: E731
                                   _grow(s, i) > _grow(s, j))
    if MODE.kind == "inst":
        # a hypothesis: instantiated only at the goal's skolems and the two ids named (fewer instances of a
        # universal hypothesis: weaker, so still sound); only C4's goal reads the chain
        ids = [*MODE.skolems, b, b2]
        chain = And(*[Implies(And(0 <= x, x < s.n, 0 <= y, y < s.n), body(x, y)) for x in ids for y in ids])
    else:
        chain = _all2(s.n, body)
    last = _all(s.n, lambda j: Implies(cand(j), _key_le(s, j, b)))
    succ = And(0 <= b2, b2 < s.n, cand(b2), _key_lt(s, b, b2), _grow(s, b2) >= _grow(s, b),
                  _all(s.n, lambda j: Implies(And(cand(j), _key_lt(s, b, j)), _key_le(s, b2, j))))
    return And(chain, Or(And(b2 == -1, last), succ))


def gc_fires(s: St) -> Any:
    """``_garbage_collect`` runs (threshold and fraction set) and usage exceeds the threshold."""
    return And(s.gce, s.Rs + s.Rl > s.gth)


def malloc_parts(s: St, a: St, guards: frozenset = frozenset()) -> dict[str, Any]:
    """The pieces of malloc shared by its step, its precondition and the agreement's branch names."""
    n, t = a.size, a.t
    r = a.r
    small = r <= K_SMALL
    alloc = z_segment(s, r)
    b = a.b
    bsz = at(s.sz, b)
    cand = lambda j: _cand(s, j, r, small, t, guards)  # noqa: E731
    better = lambda j: Or(at(s.sz, j) > bsz, And(at(s.sz, j) == bsz, at(s.ad, j) >= at(s.ad, b)))  # noqa: E731
    best = And(0 <= b, b < s.n, cand(b),
                  z3.BoolVal(True) if "best" in guards else
                  z3.If(s.ex, grow_best(s, b, a.b2, cand), _all(s.n, lambda j: Implies(cand(j), better(j)))))
    none = _all(s.n, lambda j: Not(cand(j)))
    msrej = And(s.ms > 0, Or(And(r < s.ms, bsz >= s.ms), And(r >= s.ms, bsz >= r + K_LARGE_BUFFER)))
    found = And(b >= 0, Not(msrej))
    split = z_split(s, bsz - r, r, small) if "split" not in guards else bsz - r > 0
    return dict(r=r, small=small, alloc=alloc, best=best, none=none, found=found, room=room(s, alloc, guards, r),
                split=split, eb=n >= ONE_EB)


#: what follows when no cached block serves a request (after the garbage collection, if any): a new segment;
#: the toy's OutOfMemory; pytorch's release_available (max_split_size set) or its retry
CONT_PATHS = ("new", "oom", "retry", "avail", "expand")


def cont_path(s: St, rm: Any, path: str) -> Any:
    """With expandable segments ``rm`` is only the memory_fraction check: then the mapping (``expand``);
    release_available looks at plain segments only (with arenas it releases nothing: the retry)."""
    return {"new": And(rm, Not(s.ex)), "expand": And(rm, s.ex), "oom": And(Not(rm), s.seed),
            "retry": And(Not(rm), Not(s.seed), Or(s.ms == 0, s.ex)),
            "avail": And(Not(rm), Not(s.seed), s.ms > 0, Not(s.ex))}[path]


def expand_choice(s: St, u: Any, small: Any, t: Any) -> Any:
    """The run the mapping grows (``_find_expandable``, an argument: the agreement passes the spec rule's
    choice): an unmapped block of an arena of the request's pool and stream, or -1 (a fresh arena)."""
    return Or(u == -1, And(0 <= u, u < s.n, at(s.al, u), at(s.k, u) == UNM, at(s.sm, u) == small,
                                 at(s.sr, u) == t))


def cont_pre(s: St, a: St, alloc: Any, path: str, guards: frozenset = frozenset(), r: Any = None,
             t: Any = None) -> Any:
    if path == "new":
        return _fresh_base(s, a.base, alloc) if "fresh" not in guards else a.base >= 0
    if path == "oom":
        return _largest_free_ok(s, a.lf, a.lw)
    if path == "expand":
        return expand_choice(s, a.u, (s.mr if r is None else r) <= K_SMALL, s.mt if t is None else t)
    return z3.BoolVal(True)


def _expand_state(s: St, size: Any, t: Any, r: Any, u: Any, second: Any) -> St:
    """The mapping starts at the run of ``u`` (its head: the free block before it, if any) or a fresh arena."""
    p = at(s.pv, u)
    head = z3.If(And(u != -1, p != -1, at(s.k, p) == FREE), p, -1)
    return s.set(xp=True, md=False, gp=False, ra=False, mn=size, mt=t, mr=r, xh=head, xq=u, x2=second)


def _retry_state(s: St, size: Any, t: Any, r: Any) -> St:
    """pytorch's last resort: every stream's events complete (then the retry releases every cached segment)."""
    return s.set(md=True, gp=False, ra=False, xp=False, mn=size, mt=t, mr=r,
                 **{f"c{tt}": s[f"i{tt}"] for tt in range(STREAMS)})


def cont_step(s: St, a: St, path: str, size: Any, t: Any, r: Any) -> tuple[Any, St]:
    small, alloc = r <= K_SMALL, z_segment(s, r)
    done = s.set(gp=False, ra=False)
    if path == "new":
        return OK, _new_segment(done, r, small, t, a.base, alloc, size)
    if path == "oom":
        return OOM, _oom_figures(done, _tried(s, r, alloc), a.lf)
    if path == "retry":
        return PENDING, _retry_state(s, size, t, r)
    if path == "expand":
        return PENDING, _expand_state(s, size, t, r, a.u, z3.BoolVal(False))
    return PENDING, s.set(ra=True, gp=False, mn=size, mt=t, mr=r, wa=z3.If(r > s.ms, r, s.ms), rsum=0)


MALLOC_PATHS = ("fit", "eb", "gc", *CONT_PATHS)


def malloc_path(s: St, a: St, path: str, guards: frozenset = frozenset()) -> Any:
    """Which way malloc goes: over 1 EB; the best fit; the garbage collection (then :data:`CONT_PATHS`);
    else straight to :data:`CONT_PATHS`."""
    m = malloc_parts(s, a, guards)
    no = And(Not(m["eb"]), Not(m["found"]))
    if path == "eb":
        return m["eb"]
    if path == "fit":
        return And(Not(m["eb"]), m["found"])
    if path == "gc":
        return And(no, gc_fires(s))
    return And(no, Not(gc_fires(s)), cont_path(s, m["room"], path))


def malloc_pre(s: St, a: St, path: str, guards: frozenset = frozenset()) -> Any:
    m = malloc_parts(s, a, guards)
    return And(idle(s), a.size >= 1, 0 <= a.t, a.t < STREAMS,
                  Or(m["eb"], round_ok(s, a.size, a.r, guards)),
                  Or(m["eb"], m["best"], And(a.b == -1, m["none"])),
                  malloc_path(s, a, path, guards),
                  cont_pre(s, a, m["alloc"], path, guards, a.r, a.t) if path in CONT_PATHS else z3.BoolVal(True))


def malloc_step(s: St, a: St, path: str, guards: frozenset = frozenset()) -> tuple[Any, St]:
    m = malloc_parts(s, a, guards)
    r, small, alloc, b = m["r"], m["small"], m["alloc"], a.b
    if path == "eb":
        return OOM, s
    if path == "gc":
        return PENDING, s.set(gp=True, mn=a.size, mt=a.t, mr=r)
    if path in CONT_PATHS:
        return cont_step(s, a, path, a.size, a.t, r)
    return OK, _serve(s, b, r, a.size, m["split"])


def _serve(s: St, b: Any, r: Any, size: Any, split: Any) -> St:
    """Free block ``b`` serves the request (rounded ``r``): live, the legal remainder split off free."""
    bsz = at(s.sz, b)
    n = s.n
    fit = St(s)
    for f, v in (("sz", z3.If(split, r, bsz)), ("k", LIVE), ("rq", size)):
        fit[f] = upd(s[f], b, v)
    rem = {"al": split, "ad": at(s.ad, b) + r, "sz": bsz - r, "k": FREE, "rq": 0, "sm": at(s.sm, b),
           "sr": at(s.sr, b), "sb": at(s.sb, b), "ss": at(s.ss, b), "pv": b, "nx": at(s.nx, b)}
    for f, v in rem.items():
        fit[f] = upd(fit[f], n, z3.If(split, v, at(s[f], n)))
    for tt in range(STREAMS):
        fit[f"u{tt}"] = upd(upd(s[f"u{tt}"], b, False), n, z3.If(split, False, at(s[f"u{tt}"], n)))
        fit[f"e{tt}"] = upd(upd(s[f"e{tt}"], b, 0), n, z3.If(split, 0, at(s[f"e{tt}"], n)))
    q = at(s.nx, b)
    fit["nx"] = z3.If(split, upd(fit["nx"], b, n), fit["nx"])
    fit["pv"] = z3.If(And(split, q != -1), upd(fit["pv"], q, n), fit["pv"])
    fit = _update_sums(s, fit, [(b, z3.BoolVal(True))], 1)
    fit["n"] = n + z3.If(split, 1, 0)
    return fit


def _release_one(s: St, b: Any) -> St:
    """Release the segment of whole-free block ``b``: the block dies, its pool's reserved bytes drop by it."""
    sz, small = at(s.sz, b), at(s.sm, b)
    out = s.set(al=upd(s.al, b, False), Rs=s.Rs - z3.If(small, sz, 0), Rl=s.Rl - z3.If(small, 0, sz))
    return _update_sums(s, out, [(b, z3.BoolVal(True))], 0, names=("Ws", "Wl"))   # a whole free block: W only


def gc_release_pre(s: St, a: St, guards: frozenset = frozenset()) -> Any:
    """``_garbage_collect``'s victims, nondeterministically: any whole free segment of the large pool (the
    spec frees the ones aged at least the average, repeatedly, possibly past its target: one of these)."""
    b = a.b
    whole = _whole_free(s, b) if "gc-whole" not in guards else And(at(s.al, b), at(s.k, b) == FREE)
    return And(s.gp, 0 <= b, b < s.n, whole, Not(at(s.sm, b)))


def gc_end_pre(s: St, a: St, path: str, guards: frozenset = frozenset()) -> Any:
    alloc = z_segment(s, s.mr)
    return And(s.gp, cont_path(s, room(s, alloc, guards, s.mr), path), cont_pre(s, a, alloc, path, guards))


def _acand(s: St, j: Any) -> Any:
    """release_available's blocks: free, of the request's pool and stream."""
    return And(at(s.al, j), at(s.k, j) == FREE, at(s.sm, j) == (s.mr <= K_SMALL), at(s.sr, j) == s.mt)


@_reads("sz", "ad")
def _key_le(s: St, i: Any, j: Any) -> Any:
    """``(size, address)`` of block i <= that of block j."""
    return Or(at(s.sz, i) < at(s.sz, j), And(at(s.sz, i) == at(s.sz, j), at(s.ad, i) <= at(s.ad, j)))


def _big_best(s: St, b: Any) -> Any:
    """``b`` is the smallest block (size, then address) of release_available's that holds the want."""
    big = lambda j: And(_acand(s, j), at(s.sz, j) >= s.wa)  # noqa: E731
    return And(0 <= b, b < s.n, big(b), _all(s.n, lambda j: Implies(big(j), _key_le(s, b, j))))


def _no_big(s: St) -> Any:
    return _all(s.n, lambda j: Not(And(_acand(s, j), at(s.sz, j) >= s.wa)))


def _elig(s: St, j: Any, guards: frozenset = frozenset()) -> Any:
    """Released by release_available's loop when reached: a whole free segment of at least max_split_size."""
    whole = at(s.sz, j) == at(s.ss, j) if "avail-whole" not in guards else z3.BoolVal(True)
    return And(_acand(s, j), whole, at(s.sz, j) >= s.ms)


def avail_big_pre(s: St, a: St) -> Any:
    """A block holds the want: the smallest such is released if it is a whole segment."""
    return And(s.ra, Not(s.ex), s.rsum == 0, _big_best(s, a.b), at(s.sz, a.b) == at(s.ss, a.b))


def avail_one_pre(s: St, a: St, guards: frozenset = frozenset()) -> Any:
    """None holds the want: from the largest down (size, then address), whole segments of at least
    max_split_size are released until the want is reached."""
    b = a.b
    return And(s.ra, Not(s.ex), _no_big(s), s.rsum < s.wa, 0 <= b, b < s.n, _elig(s, b, guards),
                  _all(s.n, lambda j: Implies(_elig(s, j, guards), _key_le(s, j, b))))


def avail_end_pre(s: St, a: St, path: str, guards: frozenset = frozenset()) -> Any:
    """release_available is done: the want reached; or the smallest block holding it is not a whole
    segment (nothing released); or none holds it and no whole segment of at least max_split_size is left.
    It succeeded iff the want was reached: then ``_alloc_block`` again, else (or if that fails) the retry."""
    b = a.b
    done = Or(s.rsum >= s.wa,
                 And(s.rsum == 0, _big_best(s, b), at(s.sz, b) != at(s.ss, b)),
                 And(_no_big(s), _all(s.n, lambda j: Not(_elig(s, j)))))
    alloc = z_segment(s, s.mr)
    ok = And(s.rsum >= s.wa, room(s, alloc, guards))
    return And(s.ra, Not(s.ex), done, ok if path == "new" else Not(ok),
                  cont_pre(s, a, alloc, "new", guards) if path == "new" else z3.BoolVal(True))


def avail_end_step(s: St, a: St, path: str) -> tuple[Any, St]:
    if path == "new":
        return cont_step(s, a, "new", s.mn, s.mt, s.mr)
    return PENDING, _retry_state(s, s.mn, s.mt, s.mr)


def retry_parts(s: St, a: St, guards: frozenset = frozenset()) -> dict[str, Any]:
    r = s.mr
    small = r <= K_SMALL
    alloc = z_segment(s, r)
    rel = _release_whole(s)
    return dict(r=r, small=small, alloc=alloc, rel=rel, room=room(rel, alloc, guards, r))


def retry_pre(s: St, a: St, path: str) -> Any:
    """Every pending block processed (and every arena's whole free pages unmapped): a new segment, the
    mapping again (expandable segments), or OutOfMemory."""
    m = retry_parts(s, a)
    rel = m["rel"]
    if path == "new":
        how = And(Not(s.ex), m["room"], _fresh_base(rel, a.base, m["alloc"]))
    elif path == "expand":
        how = And(s.ex, m["room"], expand_choice(rel, a.u, s.mr <= K_SMALL, s.mt))
    else:
        how = And(Not(m["room"]), _largest_free_ok(rel, a.lf, a.lw))
    return And(s.md, _no_pending(s), Implies(s.ex, _no_whole_pages(s)), how)


def retry_step(s: St, a: St, path: str, guards: frozenset = frozenset()) -> tuple[Any, St]:
    m = retry_parts(s, a)
    if path == "expand":
        return PENDING, _expand_state(m["rel"], s.mn, s.mt, s.mr, a.u, z3.BoolVal(True))
    rel = m["rel"].set(md=False, mn=0, mt=0)
    if path == "new":
        return OK, _new_segment(rel, m["r"], m["small"], s.mt, a.base, m["alloc"], s.mn)
    # the figures of the state after the release (the unguarded variant: of the state before it)
    return OOM, _oom_figures(rel if "after" not in guards else s.set(md=False, mn=0, mt=0),
                             _tried(s, m["r"], m["alloc"]), a.lf)


def process_pre(s: St, a: St, guards: frozenset = frozenset()) -> Any:
    b, t = a.b, a.t
    ev = [And(t == tt, at(s[f"u{tt}"], b),
                 z3.BoolVal(True) if "event" in guards else s[f"c{tt}"] >= at(s[f"e{tt}"], b))
          for tt in range(STREAMS)]
    return And(0 <= b, b < s.n, at(s.al, b), at(s.k, b) == PEND, Or(*ev), Not(s.xp))


def process_step(s: St, a: St, path: str) -> tuple[Any, St]:
    b, t = a.b, a.t
    dropped = s.set(**{f"u{tt}": z3.If(t == tt, upd(s[f"u{tt}"], b, False), s[f"u{tt}"]) for tt in range(STREAMS)},
                    **{f"e{tt}": z3.If(t == tt, upd(s[f"e{tt}"], b, 0), s[f"e{tt}"]) for tt in range(STREAMS)})
    if path == "wait":
        return OK, dropped
    freed, touched = _merge_free(dropped, b)
    return OK, _update_sums(s, freed, touched, 0)


def process_last(s: St, a: St) -> Any:
    """The event processed is the block's last one: it becomes free."""
    return And(*[Or(a.t == tt, Not(at(s[f"u{tt}"], a.b))) for tt in range(STREAMS)])


def free_step(s: St, a: St, path: str, guards: frozenset = frozenset()) -> tuple[Any, St]:
    b = a.b
    us = [at(s[f"u{tt}"], b) for tt in range(STREAMS)]
    has = Or(*us) if "uses" not in guards else z3.BoolVal(False)
    pend = s.set(k=upd(s.k, b, PEND), **{f"i{tt}": s[f"i{tt}"] + z3.If(us[tt], 1, 0) for tt in range(STREAMS)},
                 **{f"e{tt}": z3.If(us[tt], upd(s[f"e{tt}"], b, s[f"i{tt}"] + 1), s[f"e{tt}"])
                    for tt in range(STREAMS)})
    pend = _update_sums(s, pend, [(b, z3.BoolVal(True))], 0)
    freed, touched = _merge_free(s, b, guards)
    freed = _update_sums(s, freed, touched, 0)
    return OK, (pend if path == "pending" else freed)


def free_path(s: St, a: St, path: str, guards: frozenset = frozenset()) -> Any:
    has = Or(*[at(s[f"u{tt}"], a.b) for tt in range(STREAMS)])
    if "uses" in guards:
        has = z3.BoolVal(False)
    return has if path == "pending" else Not(has)


def live_pre(s: St, a: St) -> Any:
    return And(0 <= a.b, a.b < s.n, at(s.al, a.b), at(s.k, a.b) == LIVE, idle(s))


def record_step(s: St, a: St) -> tuple[Any, St]:
    b, t = a.b, a.t
    other = t != at(s.sr, b)
    return OK, s.set(**{f"u{tt}": z3.If(And(t == tt, other), upd(s[f"u{tt}"], b, True), s[f"u{tt}"])
                        for tt in range(STREAMS)})


def complete_step(s: St, a: St) -> tuple[Any, St]:
    return OK, s.set(**{f"c{tt}": z3.If(a.t == tt, s[f"i{tt}"], s[f"c{tt}"]) for tt in range(STREAMS)})


def wait_step(s: St, a: St) -> tuple[Any, St]:
    return OK, s.set(ret=0, **{f"c{tt}": s[f"i{tt}"] for tt in range(STREAMS)})


def empty_step(s: St, a: St, guards: frozenset = frozenset()) -> tuple[Any, St]:
    """Release the whole-free segments; with expandable segments the answer is the bytes the ``unmap:cache``
    steps since ``empty_cache_wait`` unmapped."""
    out = _release_whole(s, guards)
    return OK, out.set(ret=z3.If(s.ex, s.ret, s.Rs + s.Rl - (out.Rs + out.Rl)))


# --------------------------------------------------------------------------
# expandable segments: the mapping of a run, a fresh arena, the unmap of whole free pages
# --------------------------------------------------------------------------

def _target(s: St) -> Any:
    """The unmapped block the mapping takes next: after the head, or the first one (-1: a fresh arena)."""
    return z3.If(s.xh == -1, s.xq, at(s.nx, s.xh))


def _growing(s: St) -> Any:
    """The head does not hold the request yet."""
    return Or(s.xh == -1, at(s.sz, s.xh) < s.mr)


def map_len(s: St, q: Any) -> Any:
    """``_map``: the pages of unmapped block ``q`` from its start up to the request's last byte (the head's
    bytes already count), at most the block."""
    need = s.mr - z3.If(s.xh == -1, 0, at(s.sz, s.xh))
    rel = at(s.ad, q) - at(s.sb, q)
    end = ceil_pg(rel + need, page(s, at(s.sm, q))) - rel
    return z3.If(end < at(s.sz, q), end, at(s.sz, q))


def _arena_va(s: St, small: Any) -> Any:
    return z3.If(small, s.vs, s.vl)


def fresh_len(s: St) -> Any:
    """A fresh arena maps the request's pages (at most its VA)."""
    small = s.mr <= K_SMALL
    c = ceil_pg(s.mr, page(s, small))
    return z3.If(c < _arena_va(s, small), c, _arena_va(s, small))


def _reserve(s: St, small: Any, delta: Any) -> dict[str, Any]:
    return {"Rs": s.Rs + z3.If(small, delta, 0), "Rl": s.Rl + z3.If(small, 0, delta)}


def map_step(s: St, a: St) -> tuple[Any, St]:
    """expand:map: the pages of unmapped block ``b`` (the target) are mapped; they become free and merge
    with the head (and, the block mapped whole, with a free block after it); the rest stays unmapped."""
    q = a.b
    m = map_len(s, q)
    part = m < at(s.sz, q)
    n = s.n
    rest = {"al": part, "ad": at(s.ad, q) + m, "sz": at(s.sz, q) - m, "k": UNM, "rq": 0, "sm": at(s.sm, q),
            "sr": at(s.sr, q), "sb": at(s.sb, q), "ss": at(s.ss, q), "pv": q, "nx": at(s.nx, q)}
    s1 = St(s)
    for f, v in rest.items():
        s1[f] = upd(s[f], n, z3.If(part, v, at(s[f], n)))
    for tt in range(STREAMS):
        s1[f"u{tt}"] = upd(s[f"u{tt}"], n, z3.If(part, False, at(s[f"u{tt}"], n)))
        s1[f"e{tt}"] = upd(s[f"e{tt}"], n, z3.If(part, 0, at(s[f"e{tt}"], n)))
    s1["sz"] = upd(s1["sz"], q, m)
    nq = at(s.nx, q)
    s1["nx"] = z3.If(part, upd(s1["nx"], q, n), s1["nx"])
    s1["pv"] = z3.If(And(part, nq != -1), upd(s1["pv"], nq, n), s1["pv"])
    merged, touched = _merge_free(s1, q)
    out = _update_sums(s, merged, touched, 1)
    out.update(_reserve(s, at(s.sm, q), m))
    out["n"] = n + z3.If(part, 1, 0)
    out["xh"] = q
    return PENDING, out


def fresh_step(s: St, a: St) -> tuple[Any, St]:
    """expand:fresh: a new arena (VA ``vs``/``vl``) at a fresh base, its first pages mapped (the head)."""
    small = s.mr <= K_SMALL
    va, m, n, base = _arena_va(s, small), fresh_len(s), s.n, a.base
    part = m < va
    first = {"al": True, "ad": base, "sz": m, "k": FREE, "rq": 0, "sm": small, "sr": s.mt, "sb": base, "ss": va,
             "pv": -1, "nx": z3.If(part, n + 1, -1)}
    rest = {"al": part, "ad": base + m, "sz": va - m, "k": UNM, "rq": 0, "sm": small, "sr": s.mt, "sb": base,
            "ss": va, "pv": n, "nx": -1}
    out = St(s)
    for f in first:
        out[f] = upd(upd(s[f], n, first[f]), n + 1, z3.If(part, rest[f], at(s[f], n + 1)))
    for tt in range(STREAMS):
        out[f"u{tt}"] = upd(upd(s[f"u{tt}"], n, False), n + 1, z3.If(part, False, at(s[f"u{tt}"], n + 1)))
        out[f"e{tt}"] = upd(upd(s[f"e{tt}"], n, 0), n + 1, z3.If(part, 0, at(s[f"e{tt}"], n + 1)))
    out.update(_reserve(s, small, m))
    out = _update_sums(s, out, [], 2)
    out["n"] = n + z3.If(part, 2, 1)
    out["xh"] = n
    return PENDING, out


def serve_step(s: St, a: St, guards: frozenset = frozenset()) -> tuple[Any, St]:
    """expand:serve: the head holds the request: it serves it like a best fit (split if legal)."""
    b, r = s.xh, s.mr
    split = z_split(s, at(s.sz, b) - r, r, r <= K_SMALL) if "split" not in guards else at(s.sz, b) - r > 0
    return OK, _serve(s, b, r, s.mn, split).set(xp=False)


def expand_fail_step(s: St, a: St, path: str) -> tuple[Any, St]:
    """expand:oom / expand:retry: the next pages do not fit the device: the pages mapped so far stay; the
    toy's OutOfMemory (the retry's, pytorch's) or pytorch's retry."""
    done = s.set(xp=False)
    if path == "oom":
        return OOM, _oom_figures(done, _tried(s, s.mr, z_segment(s, s.mr)), a.lf)
    return PENDING, _retry_state(done, s.mn, s.mt, s.mr)


def _fails(s: St) -> Any:
    """The next mapping does not fit the device."""
    q = _target(s)
    used = s.Rs + s.Rl
    # (a fresh arena whose VA is smaller than the request: no arena can hold it)
    return z3.If(q == -1, And(s.xh == -1, Or(used + fresh_len(s) > s.cap,
                                                  _arena_va(s, s.mr <= K_SMALL) < s.mr)),
                 And(0 <= q, q < s.n, at(s.al, q), at(s.k, q) == UNM, used + map_len(s, q) > s.cap))


def unmap_parts(s: St, b: Any) -> tuple[Any, Any, Any, Any]:
    """``_unmap``: the whole pages inside free block ``b`` (offsets from the arena's base): ``[B, E)``."""
    rel = at(s.ad, b) - at(s.sb, b)
    pg = page(s, at(s.sm, b))
    B, E = ceil_pg(rel, pg), floor_pg(rel + at(s.sz, b), pg)
    return rel, B, E, E > B


def has_pages(s: St, b: Any) -> Any:
    return unmap_parts(s, b)[3]


def _no_whole_pages(s: St) -> Any:
    """No free block holds a whole page (of an arena: only with the flag)."""
    return _all(s.n, lambda j: Implies(And(at(s.al, j), at(s.k, j) == FREE), Not(has_pages(s, j))))


def unmap_step(s: St, a: St, count: bool) -> tuple[Any, St]:
    """The whole pages inside free block ``b`` are unmapped: the free edges before and after them become
    blocks ``n`` and ``n + 1`` (dead when empty), the pages an unmapped block that merges with unmapped
    neighbours; an arena left all unmapped is released.  ``count``: the bytes count in empty_cache's answer."""
    b = a.b
    rel, B, E, has = unmap_parts(s, b)
    head, tail = B - rel, rel + at(s.sz, b) - E
    n, p, q, sb = s.n, at(s.pv, b), at(s.nx, b), at(s.sb, b)
    common = {"k": FREE, "rq": 0, "sm": at(s.sm, b), "sr": at(s.sr, b), "sb": sb, "ss": at(s.ss, b)}
    hf = {"al": head > 0, "ad": at(s.ad, b), "sz": head, "pv": p, "nx": b, **common}
    tf = {"al": tail > 0, "ad": sb + E, "sz": tail, "pv": b, "nx": q, **common}
    s1 = St(s)
    for f in hf:
        s1[f] = upd(upd(s[f], n, hf[f]), n + 1, tf[f])
    for tt in range(STREAMS):
        s1[f"u{tt}"] = upd(upd(s[f"u{tt}"], n, False), n + 1, False)
        s1[f"e{tt}"] = upd(upd(s[f"e{tt}"], n, 0), n + 1, 0)
    s1["ad"] = upd(s1["ad"], b, sb + B)
    s1["sz"] = upd(s1["sz"], b, E - B)
    s1["pv"] = upd(s1["pv"], b, z3.If(head > 0, n, p))
    s1["nx"] = upd(s1["nx"], b, z3.If(tail > 0, n + 1, q))
    s1["nx"] = z3.If(And(head > 0, p != -1), upd(s1["nx"], p, n), s1["nx"])
    s1["pv"] = z3.If(And(tail > 0, q != -1), upd(s1["pv"], q, n + 1), s1["pv"])
    merged, touched = _merge_free(s1, b, kind=UNM)
    whole = And(at(merged["pv"], b) == -1, at(merged["nx"], b) == -1)
    merged["al"] = z3.If(whole, upd(merged["al"], b, False), merged["al"])
    merged.update(_reserve(s, at(s.sm, b), -(E - B)))
    if count:
        merged["ret"] = s.ret + (E - B)
    out = _update_sums(s, merged, touched, 2)
    out["n"] = n + 2
    return OK, out   # (both actions' preconditions say the block holds a whole page: ``has``)


def double_step(s: St, a: St) -> tuple[Any, St]:
    return DOUBLE, s


_T = z3.BoolVal(True)


def actions(guards: frozenset = frozenset()) -> list[Act]:
    """Every encoded action, one per outcome path (each tied to the spec action
    it stands for); ``guards`` names guards to remove (the unguarded variants)."""
    def pre_t(s: St, a: St) -> Any:
        return And(0 <= a.t, a.t < STREAMS, idle(s))

    def mk_malloc(path: str) -> Act:
        params = {k: v for k, v in MALLOC_PARAMS.items() if not (k == "u" and path != "expand")}
        return Act(f"malloc:{path}", params, lambda s, a: malloc_step(s, a, path, guards),
                   lambda s, a: malloc_pre(s, a, path, guards), spec=("caching:malloc",))

    def mk_gc_end(path: str) -> Act:
        return Act(f"gc_end:{path}", {"base": INT, "lf": INT, "lw": INT, "u": INT},
                   phase_new_step if path == "new" else (lambda s, a: cont_step(s, a, path, s.mn, s.mt, s.mr)),
                   lambda s, a: gc_end_pre(s, a, path, guards), spec=("caching:malloc",))

    def mk_avail_end(path: str) -> Act:
        return Act(f"avail_end:{path}", {"b": INT, "base": INT, "lf": INT, "lw": INT},
                   phase_new_step if path == "new" else (lambda s, a: avail_end_step(s, a, path)),
                   lambda s, a: avail_end_pre(s, a, path, guards), spec=("caching:malloc",))

    def mk_free(path: str) -> Act:
        return Act(f"free:{path}", {"b": INT}, lambda s, a: free_step(s, a, path, guards),
                   lambda s, a: And(live_pre(s, a), free_path(s, a, path, guards)), spec=("caching:free",))

    def mk_process(path: str) -> Act:
        def pre(s: St, a: St) -> Any:
            last = process_last(s, a)
            return And(process_pre(s, a, guards), last if path == "free" else Not(last))
        return Act(f"process_event:{path}", {"b": INT, "t": INT}, lambda s, a: process_step(s, a, path), pre,
                   spec=("caching:malloc", "caching:empty_cache"))

    def mk_retry(path: str) -> Act:
        return Act(f"malloc_retry:{path}", {"base": INT, "lf": INT, "lw": INT, "u": INT},
                   lambda s, a: retry_step(s, a, path, guards), lambda s, a: retry_pre(s, a, path),
                   spec=("caching:malloc",))

    return [
        *[mk_malloc(p) for p in MALLOC_PATHS],
        Act("gc:release", {"b": INT}, release_step, lambda s, a: gc_release_pre(s, a, guards),
            spec=("caching:malloc",)),
        *[mk_gc_end(p) for p in CONT_PATHS],
        Act("avail:big", {"b": INT}, release_step, avail_big_pre, spec=("caching:malloc",)),
        Act("avail:one", {"b": INT}, release_step, lambda s, a: avail_one_pre(s, a, guards),
            spec=("caching:malloc",)),
        mk_avail_end("new"), mk_avail_end("retry"),
        mk_retry("new"), mk_retry("oom"), mk_retry("expand"),
        # expandable segments: the mapping's steps, the unmap of whole free pages
        Act("expand:map", {"b": INT}, map_step,
            lambda s, a: And(s.xp, _growing(s), a.b == _target(s), 0 <= a.b, a.b < s.n, at(s.al, a.b),
                                Or(s.xh == -1, at(s.pv, a.b) == s.xh),
                                at(s.k, a.b) == UNM,
                                z3.BoolVal(True) if "map-room" in guards else s.Rs + s.Rl + map_len(s, a.b) <= s.cap),
            spec=("caching:malloc",)),
        Act("expand:fresh", {"base": INT}, fresh_step,
            lambda s, a: And(s.xp, s.xh == -1, s.xq == -1, s.Rs + s.Rl + fresh_len(s) <= s.cap,
                                fresh_len(s) >= s.mr, _fresh_base(s, a.base, _arena_va(s, s.mr <= K_SMALL))),
            spec=("caching:malloc",)),
        Act("expand:serve", {"b": INT}, lambda s, a: serve_step(s, a, guards),
            lambda s, a: And(s.xp, s.xh != -1, a.b == s.xh, at(s.sz, s.xh) >= s.mr), spec=("caching:malloc",)),
        Act("expand:oom", {"lf": INT, "lw": INT}, lambda s, a: expand_fail_step(s, a, "oom"),
            lambda s, a: And(s.xp, _growing(s), _fails(s), Or(s.seed, s.x2), _largest_free_ok(s, a.lf, a.lw)),
            spec=("caching:malloc",)),
        Act("expand:retry", {}, lambda s, a: expand_fail_step(s, a, "retry"),
            lambda s, a: And(s.xp, _growing(s), _fails(s), Not(s.seed), Not(s.x2)), spec=("caching:malloc",)),
        Act("unmap:free", {"b": INT}, lambda s, a: unmap_step(s, a, False),
            lambda s, a: And(s.ex, s.seed, idle(s), 0 <= a.b, a.b < s.n, at(s.al, a.b), at(s.k, a.b) == FREE,
                                has_pages(s, a.b)),
            spec=("caching:free", "caching:malloc", "caching:empty_cache")),
        Act("unmap:cache", {"b": INT}, lambda s, a: unmap_step(s, a, True),
            lambda s, a: And(s.ex, Or(idle(s), s.md), _no_pending(s), 0 <= a.b, a.b < s.n, at(s.al, a.b),
                                at(s.k, a.b) == FREE, has_pages(s, a.b)),
            spec=("caching:empty_cache", "caching:malloc")),
        mk_process("wait"), mk_process("free"), mk_free("pending"), mk_free("merge"),
        Act("double_free", {}, double_step, lambda s, a: idle(s), spec=("caching:double_free",)),
        Act("record_stream", {"b": INT, "t": INT}, record_step, lambda s, a: And(live_pre(s, a), 0 <= a.t, a.t < STREAMS),
            spec=("caching:record_stream",)),
        Act("complete_stream", {"t": INT}, complete_step, pre_t, spec=("caching:complete_stream",)),
        Act("empty_cache_wait", {}, wait_step, lambda s, a: idle(s), spec=("caching:empty_cache",)),
        Act("empty_cache", {}, lambda s, a: empty_step(s, a, guards),
            lambda s, a: And(idle(s), _no_pending(s), Implies(s.ex, _no_whole_pages(s))),
            spec=("caching:empty_cache",)),
    ]


def release_step(s: St, a: St) -> tuple[Any, St]:
    """gc:release / avail:big / avail:one: the segment of whole-free block ``b`` is released (in
    release_available, its bytes count towards the want)."""
    out = _release_one(s, a.b)
    out["rsum"] = s.rsum + z3.If(s.ra, at(s.sz, a.b), 0)
    return PENDING, out


def phase_new_step(s: St, a: St) -> tuple[Any, St]:
    """gc_end:new / avail_end:new: the pending request gets a new segment."""
    return cont_step(s, a, "new", s.mn, s.mt, s.mr)


def phase_actions() -> list[Act]:
    """The two steps shared by the phases' actions (:data:`COVERED`), each proved once: any whole free
    segment released during the garbage collection or release_available; a new segment for the pending
    request when it fits."""
    def release_pre(s: St, a: St) -> Any:
        return And(Or(s.gp, s.ra), 0 <= a.b, a.b < s.n, _whole_free(s, a.b))

    def new_pre(s: St, a: St) -> Any:
        alloc = z_segment(s, s.mr)
        return And(Or(s.gp, s.ra), Not(s.ex), room(s, alloc), _fresh_base(s, a.base, alloc))

    return [Act("phase:release", {"b": INT}, release_step, release_pre, spec=("caching:malloc",)),
            Act("phase:new", {"base": INT, "lf": INT, "lw": INT}, phase_new_step, new_pre, spec=("caching:malloc",))]


#: encoded action -> the phase action that covers it: the same step function, and its precondition is
#: proved to imply the phase action's (so the phase action's consecution is its own)
COVERED = {"gc:release": "phase:release", "avail:big": "phase:release", "avail:one": "phase:release",
           "gc_end:new": "phase:new", "avail_end:new": "phase:new"}


def covered(act: Act, timeout_ms: int = 30000) -> str:
    """``act`` is an instance of its phase action: the same step, and ``pre(act) => pre(phase action)``."""
    from memspec.invariants.proofs import _args, fresh

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
    return And(s.n == 0, s.cap >= 0, s.ms >= 0, s.Rs == 0, s.Rl == 0, idle(s),
                  Implies(s.ex, And(s.vs >= K_SMALL_BUFFER, s.vs % K_ROUND_LARGE == 0,
                                          s.vl >= K_SMALL_BUFFER, s.vl % page(s, False) == 0)),
                  *[And(s[f"i{t}"] == 0, s[f"c{t}"] == 0) for t in range(STREAMS)],
                  *[s[nm] == zero for nm in SUMS])


# --------------------------------------------------------------------------
# the inductive invariant, the named invariants, the step properties
# --------------------------------------------------------------------------

def inv(s: St, sums: tuple[str, ...] | None = None) -> Any:
    """The inductive invariant: well-formedness (C2), the checked prefix-sum
    ghosts, reserved = free + active bytes <= the device, and C3, C4, C5, C7
    (C1 follows from it: :func:`c1`, proved as a safety check).  ``sums``: only
    these ghosts (a weaker hypothesis, so still sound)."""
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
        plain = _all(s.n, lambda j: Implies(
            cand(j), Or(at(s.sz, j) > at(s.sz, b), And(at(s.sz, j) == at(s.sz, b), at(s.ad, j) >= at(s.ad, b)))))
        props["C4"] = Implies(fit, And(at(s.sm, b) == small, z3.If(s.ex, grow_best(s, b, a.b2, cand), plain)))
    if name in ("malloc:fit", "expand:serve"):
        # C5: a split leaves a legal remainder (seed 003: >= 512 B small pool, >= 2 MiB large pool; pytorch:
        # > 1 MiB and below max_split_size); a block is handed over whole only when the remainder is illegal
        legal = z3.If(small, rem >= K_MIN_BLOCK,
                      z3.If(s.seed, rem >= K_ROUND_LARGE,
                            z3.If(s.ex, rem >= K_MIN_BLOCK, And(rem > K_SMALL, Or(s.ms == 0, r < s.ms)))))
        split_done = And(at(s2.sz, b) == r, rem > 0)
        props["C5"] = Implies(fit, And(Implies(split_done, legal), Implies(Not(split_done), Not(legal))))
        # C7: a block is reused only on its own stream, and only when free (not pending)
        props["C7"] = Implies(fit, And(at(s.sr, b) == (a.t if name == "malloc:fit" else s.mt),
                                             at(s.k, b) == FREE))
    if name == "malloc:oom":
        props["C9"] = _figures_ok(s2, _tried(s, r, m["alloc"]), a.lf, a.lw)
    if name in ("gc_end:oom", "expand:oom"):
        props["C9"] = _figures_ok(s2, _tried(s, s.mr, z_segment(s, s.mr)), a.lf, a.lw)
    if name == "malloc_retry:oom":
        m = retry_parts(s, a)
        props["C9"] = _figures_ok(s2, _tried(s, m["r"], m["alloc"]), a.lf, a.lw)
    if name == "unmap:cache":
        # C6 (an arena): exactly the whole pages inside the free block go, reserved and the answer move by them,
        # and the free edges left hold no whole page
        _rel, B, E, _has = unmap_parts(s, a.b)
        pg = page(s, at(s.sm, a.b))
        head, tail = B - _rel, _rel + at(s.sz, a.b) - E
        props["C6"] = And(s2.Rs + s2.Rl == s.Rs + s.Rl - (E - B), s2.ret == s.ret + (E - B),
                             head < pg, tail < pg, E - B >= pg)
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


def _figures_ok(s2: St, tried: Any, lf: Any, lw: Any) -> Any:
    """C9: the OOM's figures are the state's: the request tried, reserved, allocated (live), largest free block."""
    return And(s2.oq == tried, s2.orr == s2.Rs + s2.Rl, s2.oa == total(s2, "Ls") + total(s2, "Ll"),
                  s2.olf == lf, _largest_free_ok(s2, lf, lw))


NAMED: dict[str, Callable[[St], Any]] = {
    "C1": c1, "C2": c2, "C3": c3, "C4": c4, "C5": c5, "C6": lambda s: z3.BoolVal(True), "C7": c7,
    "C9": lambda s: z3.BoolVal(True),
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
        c = _contrib(s2, nm)
        out.append((f"sum:{nm}:step", lambda nm=nm, c=c: And(
            at(s2[nm], 0) == 0, _all(s2.n, lambda i: at(s2[nm], i + 1) == at(s2[nm], i) + c(i)))))
        out.append((f"sum:{nm}:mono", lambda nm=nm: _all2(s2.n, lambda i, j: Implies(
            i <= j, at(s2[nm], i) <= at(s2[nm], j)), hi=1)))
    out += [("reserved", lambda: reserved_wf(s2)), ("C3", lambda: c3(s2)),
            ("C4", lambda: c4(s2)), ("C5", lambda: c5(s2)), ("C7", lambda: c7(s2))]
    return out


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
#: budget of a QF attempt in ms of CPU on a quiet core (rlimit units, :func:`limit`): the slowest proof it
#: gives takes ~6 s CPU on a quiet core
QF_MS = 10_000


def qf_solver(timeout_ms: int) -> z3.Solver:
    """A solver for :data:`QF_LOGIC`, bounded by Z3's resource limit only (the smaller of the check's
    budget and :data:`QF_MS`)."""
    return limit(z3.SolverFor(QF_LOGIC), min(timeout_ms, QF_MS))


def _check(hyp: Callable[[], Any], goal: Callable[[], Any], s: St, a: St, timeout_ms: int = 30000,
           solvers: dict | None = None) -> tuple[Any, Any]:
    MODE.kind, MODE.skolems = "skolem", []
    g = goal()
    sks = list(MODE.skolems)
    MODE.kind = "inst"
    _terms(s, a, sks)
    try:
        h = hyp()
    finally:
        MODE.kind, MODE.terms, MODE.terms1, MODE.anchors, MODE.skolems = "forall", [], [], [], []
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
    sol = limit(z3.Solver(), timeout_ms)
    sol.add(h, Not(g))
    r = sol.check()
    return r, (sol.model() if r == z3.sat else None)


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
        c = _contrib(s, nm)
        body += [at(s[nm], 0) == 0, _all(s.n, lambda i, nm=nm, c=c: at(s[nm], i + 1) == at(s[nm], i) + c(i), wide=True)]
        if group == "sums-mono":
            body.append(_all2(s.n, lambda i, j, nm=nm: Implies(i <= j, at(s[nm], i) <= at(s[nm], j)), hi=1))
    if group != "sums-step" and any(n == "reserved" for n in names):
        body.append(reserved_wf(s))
    return And(*body)


def _check_group(group: str, items: list[tuple[str, Callable[[], Any]]], s: St, a: St, pre: Callable[[], Any],
                 timeout_ms: int) -> Any:
    MODE.kind, MODE.skolems, MODE.shared = "skolem", [], True
    try:
        g = And(*[f() for _n, f in items])
        sks = list(MODE.skolems)
    finally:
        MODE.shared = False
    MODE.kind = "inst"
    _terms(s, a, sks, sums_only=group.startswith("sums"))
    try:
        h = And(_group_hyp(group, s, [n for n, _f in items]), pre())
    finally:
        MODE.kind, MODE.terms, MODE.terms1, MODE.anchors, MODE.skolems = "forall", [], [], [], []
    sol = qf_solver(timeout_ms)   # a group not proved here is re-checked goal by goal (:func:`_check`)
    sol.add(h, Not(g))
    return sol.check()


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
    from memspec.invariants.proofs import _args, fresh

    s = fresh(FIELDS, "s")
    a = _args(act, "a")
    out, s2 = act.step(s, a)
    s2 = St({f: (v if z3.is_ast(v) else (z3.BoolVal(v) if isinstance(v, bool) else z3.IntVal(v))) for f, v in s2.items()})
    res: list[tuple[str, str, float]] = []
    props = step_ok(act.name, s, a, out, s2)
    todo = [(n, g, True) for n, g in goals(s2)] + [(f"step:{i}", (lambda i=i: step_ok(act.name, s, a, out, s2)[i]), False)
                                                    for i in props]
    pending: list[tuple[str, Callable[[], Any]]] = []
    for name, g, is_inv in todo:
        if only and name not in only:
            continue
        if part is not None and (_group(name) or "core") != part:
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
    hyps: dict[Any, Any] = {}   # (deps, skolems) -> the instantiated hypothesis (built once per action)
    solvers: dict[Any, Any] = {}

    def hyp(deps: tuple[str, ...]) -> Any:
        key = (deps, tuple(str(x) for x in MODE.terms1), len(MODE.terms))
        if key not in hyps:
            hyps[key] = And(inv(s, deps), act.pre(s, a))
        return hyps[key]

    for name, g in pending:
        t0 = time.process_time()
        r = None
        if grouped and _deps(name) and name.startswith("step:"):
            # the step properties read the ghost sums only through the step's own definitions: first without them
            r, _m = _check(lambda: hyp(()), g, s, a, timeout_ms // 4, solvers if grouped else None)
        if r != z3.unsat:
            r, _m = _check(lambda name=name: hyp(_deps(name)), g, s, a, timeout_ms, solvers if grouped else None)
        res.append((name, "proved" if r == z3.unsat else str(r), time.process_time() - t0))
    return res


def safety_c1(timeout_ms: int = 30000) -> str:
    """C1 follows from the invariant: reserved = free + active >= active; slack >= 0; reserved <= the device."""
    from memspec.invariants.proofs import fresh

    s = fresh(FIELDS, "s")
    r, _m = _check(lambda: inv(s), lambda: c1(s), s, St(), timeout_ms)
    return "proved" if r == z3.unsat else str(r)


def initiation() -> str:
    from memspec.invariants.proofs import fresh

    s = fresh(FIELDS, "s")
    MODE.kind, MODE.skolems = "skolem", []
    g = inv(s)
    MODE.kind, MODE.skolems = "forall", []
    sol = z3.Solver()
    sol.add(init(s), Not(g))
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


def refute(inv_id: str, timeout_ms: int = 60000, knob: str | None = None) -> tuple[bool, str]:
    """A well-formed heap (the whole inductive invariant holds on it, at most
    :data:`REFUTE_BLOCKS` blocks, every quantifier expanded exactly) from which
    the unguarded action breaks the invariant it names.  ``(refuted, trace)``."""
    from memspec.invariants.proofs import _args, fresh

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
        hyp = And(inv(s), s.n <= REFUTE_BLOCKS, act.pre(s, a))
    finally:
        MODE.kind, MODE.bound = "forall", 0
    sol = limit(z3.Solver(), timeout_ms)
    sol.add(hyp, Or(*bad))
    r = sol.check()
    if r != z3.sat:
        return False, f"without '{words}': no violation of {inv_id} found ({r})"
    m = sol.model()
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

#: the caching catalog's rows this heap encoding does not prove, keyed by id, and why: C8 (an OOM with
#: the pages free is the missed merge's) is about the physical pages of an expandable segment's VA arena,
#: which this heap encoding does not model; its row is proved by :mod:`.proofs_caching_expandable`
#: (``memspec prove`` takes C8's checks from there, this text only if that encoding is not run)
NOT_HEAP_ENCODED: dict[str, str] = {
    "C8": "not encoded: expandable segments (physical pages of a VA arena) have no Z3 encoding yet",
}
#: what the encoding leaves out, per invariant of the caching catalog (:data:`memspec.spec.caching.CATALOG`,
#: in its order; a proof with a restriction is reported bounded, never proved): nothing for every row but
#: those of :data:`NOT_HEAP_ENCODED` -- one encoding of both presets and of expandable segments on and off
#: (symbolic flags) over an arbitrary well-formed heap
BOUNDED: dict[str, str | None] = {e.id: NOT_HEAP_ENCODED.get(e.id) for e in CACHING_CATALOG}


#: the consecution checks of an action in three units (each its own pool task): the invariant's conjuncts
#: and the step properties, the ghost sums' step equations, the ghost sums' monotonicity
STEP_PARTS = ("core", *GROUPS)
#: the actions whose consecution is split into :data:`STEP_PARTS` (those over ~10 s CPU in one unit)
SPLIT_STEPS = ("unmap:cache", "unmap:free", "expand:map", "expand:serve", "malloc:fit", "malloc:new",
               "malloc_retry:expand")
#: rough CPU seconds of the costliest units (measured one by one; only the pool's order depends on it)
HEAP_UNIT_COST = {"unmap:cache": 50.0, "malloc:fit": 28.0, "expand:map": 11.0, "malloc:new": 11.0,
                  "unmap:free": 10.7, "expand:serve": 5.5, "malloc_retry:expand": 4.7}


def unit_cost(unit: tuple[str, ...]) -> float:
    """A static estimate of a unit's CPU seconds (for the pool's longest-first order)."""
    if unit[0] in ("refute", "knob"):
        return 3.0
    if unit[0] == "step" and len(unit) > 1:
        whole = HEAP_UNIT_COST.get(unit[1], 2.0)
        return whole / len(STEP_PARTS) if len(unit) > 2 else whole
    return 1.0


def heap_units(ids: list[str] | None = None) -> list[tuple[str, ...]]:
    """The independent checks of :func:`run_heap`, in report order: each unit
    is run by :func:`heap_unit` (in any process: ``memspec prove --jobs``) and
    the results joined by :func:`join_units`."""
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
    """:func:`run_heap`'s record from the units' results, in the units' order (so the
    record does not depend on which process ran which unit)."""
    checks = [c for r in results for c in r["checks"]]
    refuted = {k: v for r in results for k, v in r["refuted"].items()}
    return {"checks": checks, "refuted": refuted, "seconds": sum(r["seconds"] for r in results),
            "actions": {a.name: list(a.spec) for a in actions()}}


def run_heap(timeout_ms: int = 20000, ids: list[str] | None = None,
             map_fn: Callable[..., Any] = map) -> dict[str, Any]:
    """Initiation, C1 as a consequence, consecution of every encoded action
    (shared by C1-C9: one inductive invariant), and each invariant's
    unguarded variant.  Returns checks, per-invariant refutations, CPU seconds
    (summed over the units).  ``map_fn`` runs the units (a process pool's map
    for ``--jobs``); the result is joined in unit order."""
    units = heap_units(ids)
    return join_units(list(map_fn(heap_unit, units, [timeout_ms] * len(units))))


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
    bad: list[str] = []
    none = z3.K(z3.IntSort(), z3.IntVal(0))
    for table in DIVISION_TABLES:
        arr = none
        for k, d in enumerate(table):
            arr = z3.Store(arr, k, d)
        er_t = z3.simplify(z3.substitute(er, (seed, z3.BoolVal(False)), (dv, arr)))
        ok_t = z3.substitute(ok, (seed, z3.BoolVal(False)), (dv, arr))
        for size in sorted({p + d for p in division_points(table) for d in (-1, 0, 1)}):
            want = SK.round_size(size, False, SK.divisions_for(size, table))
            got = z3.simplify(z3.substitute(er_t, (n, z3.IntVal(size)))).as_long()
            if got != want:
                bad.append(f"divisions {table[:4]}... size={size}: z3 round {got}, spec {want}")
            if not z3.is_true(z3.simplify(z3.substitute(ok_t, (n, z3.IntVal(size)), (r, z3.IntVal(want))))):
                bad.append(f"divisions {table[:4]}... size={size}: the spec's rounding {want} breaks round_ok")
    for msz in max_split_sizes:
        points = SK.boundaries(msz)
        for preset_seed in (False, True):
            base = [(seed, z3.BoolVal(preset_seed)), (ms, z3.IntVal(msz)), (dv, none)]
            for size in points:
                rounded = SK.round_size(size, preset_seed)
                got_r = z3.simplify(z3.substitute(er, *base, (n, z3.IntVal(size)))).as_long()
                got_s = z3.simplify(z3.substitute(es, *base, (r, z3.IntVal(rounded)))).as_long()
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
                            got = z3.is_true(z3.simplify(z3.substitute(
                                ep, *base, (ex, z3.BoolVal(exp)), (small, z3.BoolVal(sm)), (rem, z3.IntVal(remaining)),
                                (r, z3.IntVal(rounded)))))
                            want = SK.should_split(remaining, rounded, sm, preset_seed, exp, msz)
                            if got != want:
                                bad.append(f"seed={preset_seed} small={sm} expandable={exp} ms={msz} "
                                           f"request={rounded} remaining={remaining}: z3 split={got}, spec split={want}")
    return bad
