"""The caching heap encoding's state and terms: the first part of
:mod:`memspec.invariants.formal.proofs_caching_heap` (which assembles it; import from there).

Seed 003's constants, the heap's fields and ghost prefix sums, the quantifiers over
block ids (and their four modes), the policy kernels re-stated from the seed's words,
and the invariants' conjuncts over an arbitrary well-formed heap.
"""

from __future__ import annotations

from typing import Any, Callable

import z3

from memspec.invariants.formal.z3fast import And, Implies, Not, Or
from memspec.invariants.formal.solving import Query  # bounded in CPU, in a context of its own

from memspec.invariants.formal.proofs import ARR, BARR, BOOL, CODE, INT, St, at, fresh


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


def sum_step(n: Any, P: Any, c: Callable[[Any], Any], wide: bool = True) -> list[Any]:
    """The step equations of the prefix-sum ghost ``P`` of ``c`` over the ids ``0 <= i < n`` (a list of
    conjuncts): ``P[0] = 0``, ``P[i+1] = P[i] + c(i)``."""
    return [at(P, 0) == 0, _all(n, lambda i: at(P, i + 1) == at(P, i) + c(i), wide=wide)]


def sum_mono(n: Any, P: Any) -> Any:
    """The prefix-sum ghost ``P`` is monotone on ``[0, n]``."""
    return _all2(n, lambda i, j: Implies(i <= j, at(P, i) <= at(P, j)), hi=1)


def _sum(n: Any, P: Any, c: Callable[[Any], Any]) -> Any:
    """``P`` is the checked prefix-sum ghost of ``c`` over the ids ``0 <= i < n``: :func:`sum_step`,
    :func:`sum_mono`."""
    return And(*sum_step(n, P, c), sum_mono(n, P))


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


def _seed_round(n: Any) -> Any:
    """The toy's ladder: 512 B multiples up to 1 MiB, 2 MiB multiples above."""
    return z3.If(n <= K_SMALL, ceil_to(n, K_MIN_BLOCK), ceil_to(n, K_ROUND_LARGE))


def z_round(s: St, n: Any) -> Any:
    """Every request rounds to a 512 B multiple (pytorch: below 512 -> 512); the toy: above 1 MiB, 2 MiB
    multiples.  PyTorch's roundup_power2_divisions, exactly, as a case split per power-of-two interval:
    for ``2**e <= n < 2**(e+1)`` the entry ``d = dv[min(max(0, e - 20), 15)]`` (one per power of two from
    1 MiB, clamped); with ``d > 1`` and ``n > 512 * d`` the next multiple of ``2**e / d`` (a power of two
    stays), else the next 512 multiple."""
    seed_r = _seed_round(n)
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
    seed_r = _seed_round(n)
    up = r >= n if "round-up" not in guards else z3.BoolVal(True)
    return z3.If(s.seed, r == seed_r, And(up, r >= K_MIN_BLOCK, r % K_MIN_BLOCK == 0,
                                             (r <= K_SMALL) == (n <= K_SMALL)))


def legal_divisions(s: St) -> Any:
    return And(*[Or(*[at(s.dv, k) == d for d in DIVISIONS]) for k in range(16)])


def rounding_lemma(timeout_ms: int = 60000) -> str:
    """``round_ok(n, z_round(n))`` for every request ``n >= 1`` and every table of legal entries: one query
    per case of :func:`z_round` (the toy's ladder; each power-of-two interval; outside them), the cases'
    conditions pairwise disjoint (each interval is ``[2**e, 2**(e+1))``), so together they are the claim."""
    s = fresh(FIELDS, "rl")
    n = z3.Int("rl_n")
    cases, plain = _torch_round_cases(s, n)
    queries = [(s.seed, z_round(s, n))] + [(And(Not(s.seed), c), v) for c, v in cases] + \
              [(And(Not(s.seed), *[Not(c) for c, _v in cases]), plain)]
    sol = Query(timeout_ms)
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


def page_aligned(s: St, i: Any) -> Any:
    """An unmapped block starts on a page of its arena (its offset from the arena's base a multiple of the
    pool's page: :func:`page`)."""
    rel = at(s.ad, i) - at(s.sb, i)
    return Implies(And(at(s.al, i), at(s.k, i) == UNM),
                   z3.If(page(s, at(s.sm, i)) == K_ROUND_LARGE, rel % K_ROUND_LARGE == 0, rel % K_LARGE_BUFFER == 0))


def unmapped_aligned(s: St) -> Any:
    """C8's lemma: every unmapped block starts on a page (so the pages a mapping lacks are at most the
    request's page-rounded size).  Inductive with :func:`memspec.invariants.formal.proofs_caching_heap.inv`
    (its own consecution goal ``align``), and a hypothesis of that goal and of C8's step property only: in
    the block invariant (:func:`block_wf`), every hypothesis carried it and ``expand:map``'s consecution went
    from 3 s to over 6 min CPU."""
    return _all(s.n, lambda i: page_aligned(s, i))


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
                  arenas_wf(s),
                  expand_wf(s),
                  Implies(pending_req(s), And(s.mn >= 1, s.mn < ONE_EB, 0 <= s.mt, s.mt < STREAMS,
                                                    round_ok(s, s.mn, s.mr))),
                  Implies(s.md, And(Not(s.seed), *[s[f"c{t}"] == s[f"i{t}"] for t in range(STREAMS)])),
                  Implies(s.gp, s.gce),
                  Implies(s.ra, And(Not(s.seed), Not(s.ex), s.ms > 0, s.wa == z3.If(s.mr > s.ms, s.mr, s.ms),
                                          s.rsum >= 0)))


def arenas_wf(s: St) -> Any:
    """The arenas' VA (expandable segments): at least a page, whole pages of the pool's page."""
    return Implies(s.ex, And(s.vs >= K_SMALL_BUFFER, s.vs % K_ROUND_LARGE == 0, s.vl >= K_SMALL_BUFFER,
                             s.vl % page(s, False) == 0))


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
