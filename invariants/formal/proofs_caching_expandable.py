"""C8 -- expandable segments: OutOfMemory only at physical exhaustion.

Seed 003: *A freed block's pages unmap -- physical memory returns to the
driver immediately -- and a later large request maps fresh pages into a
fresh contiguous VA run.*  PyTorch's expandable segments: one VA arena per
pool and stream, physical pages (2 MiB small / 20 MiB large; the toy's 2 MiB)
mapped on demand, whole free pages unmapped at ``empty_cache`` and the OOM
retry (the toy: at free).

The state is an *arbitrary* layout, not one reached in a few steps: blocks
``0 <= i < n`` in address order (arenas are consecutive id ranges, ordered by
address), each with its kind ``k`` (free, live, pending, unmapped), size
``sz`` (>= 0: an empty block is harmless), offset ``off`` in its arena, and
its arena's id ``ar``, page ``pg`` (2 MiB or 20 MiB), pool ``sm``, stream
``sr`` and VA size ``va``; the scalars ``mapped``, ``cap`` (the device),
``fr``/``allowed`` (``memory_fraction``, a symbolic cap) and ``na`` (the next
arena id).  Well-formedness: every block inside its arena, an unmapped block
page-aligned (offset and size multiples of the arena's page), the arena's
fields shared by its blocks, and ``off - S`` constant in an arena.  Ghosts,
each *proved* inductive with the rest (nothing assumed): ``S`` (sizes) and
``M`` (mapped bytes) are prefix sums (``S[0] = M[0] = 0``,
``M[i+1] = M[i] + (sz[i] if k[i] != unmapped else 0)``), both monotone on
``[0, n]``, and ``mapped == M[n] <= cap``.

Actions (each a total function of the state and its arguments, written once
and evaluated two ways: on Z3 terms for the proofs, on Python values for the
agreement with spec/caching):

* ``map`` (``caching:malloc``): the request (rounded ``r``) is served from a
  run ``j .. x`` -- ``u`` the unmapped block the spec's rule picked
  (``_find_expandable``: the first arena by address of the request's pool and
  stream, the first unmapped block in it whose run of free and unmapped blocks
  reaches ``r``; the run starts at the free block before it, if any) and ``x``
  the block holding the request's last byte -- mapping exactly the pages the
  request lacks: every unmapped block in ``j .. x - 1`` and the pages of ``x``
  up to ``ceil(off[j] + r)``.  ``memory_fraction`` first: OutOfMemory when
  ``fr`` and ``mapped + alloc > allowed`` (the toy: ``ceil(r, 2 MiB)``, its pages, for ``alloc``).  Else OutOfMemory iff
  ``mapped + need > cap``; the blocks are mapped one by one, so an
  OutOfMemory leaves the blocks before the first that did not fit mapped
  (``map_oom``);
* ``fresh`` (``caching:malloc``): no run reaches ``r``: a new arena (VA ``va``)
  after every other, its first ``min(ceil(r), va)`` bytes mapped;
* ``fit`` (``caching:malloc``): best fit served the request from a free block
  (split or whole -- the split rule is C5's encoding): nothing mapped;
* ``free`` / ``event`` (``caching:free``, ``caching:malloc``,
  ``caching:empty_cache``): a live block (or a pending one whose events
  completed) becomes free and merges with its free neighbours; the toy then
  unmaps the whole pages inside the merged block;
* ``pend`` (``caching:free``): a live block with recorded uses becomes pending;
* ``unmap`` (``caching:empty_cache``, ``caching:malloc``'s pytorch retry):
  the whole pages inside a free block are unmapped; ``release``: an arena
  with nothing mapped is released.  ``empty_cache`` and the retry are: every
  event completes (``event`` on every pending block), ``unmap`` on every free
  block, ``release`` on every empty arena; the retry then maps again
  (``fresh``/``map``, no best fit: ``alloc_block`` directly).

Proved (Z3, unbounded integers, any ``n``): the initial state satisfies the
invariant and every action preserves it; C8's step property -- an
OutOfMemory leaves less free memory than the pages the request lacks, and
those are at most the request's page-rounded size (``need <= ceil(r, page)``,
over any layout), or it is ``memory_fraction``'s cap
(``allowed - mapped < alloc``; pytorch: ``alloc <= ceil(r, page)``, the toy
checks ``ceil(r, page)`` itself, so also less than the page-rounded request); the unguarded variant (``map`` maps the
whole unmapped block, not only the pages the request lacks) raises
OutOfMemory with the request's pages free (C8 itself refuted).

Quantifiers over block ids are handled as in the heap encoding: a goal's
``for every i`` at a fresh skolem, a hypothesis's at a finite set of terms
(sound: a universal hypothesis implies each instance).

Agreement with spec/caching (random walks of both presets with expandable
segments, with and without ``memory_fraction``, and scripted walks reaching
the multi-block run and the fraction's OutOfMemory): before each step the
spec state is projected to this encoding from its segments and blocks only
(never the policy's functions); the encoding's actions are run on the
projection in the spec's order (completed events, best fit, the fraction's
check, the run or a fresh arena; pytorch's retry: every event, every whole
free page unmapped, then again; the toy's free; empty_cache) and the result
compared with the projection of the spec's next state: OutOfMemory or the
block's address, the mapped bytes, the unmapped byte ranges of every arena
(and empty_cache's answer).  The invariant is evaluated on every projected
state against the spec's C8.

Findings on the spec: the seed preset's fraction check used ``alloc`` (the
segment size a non-expandable malloc would take: the toy's ``max(20 MiB,
r)``), so the toy with ``memory_fraction`` raised OutOfMemory with fewer free
bytes under the cap than 20 MiB but more than the request's pages; the spec
and the reference now check the request's pages there (``cap_size``).  The toy's ``empty_cache`` answer leaves out
the pages its events' frees unmapped on the way (the encoding's answer is
the same).  With ``arena_factor`` set so that an arena's VA is smaller than a
request, ``predict_malloc`` raised IndexError (``_try_expandable`` ran past
the fresh arena's last block); now an OutOfMemory, no arena reserved (spec
and reference; not reachable with the presets' factors, nor in the walks).
"""

from __future__ import annotations

import copy
import random
import time
from typing import Any, Callable

import z3

from memspec.invariants.formal import z3fast as z3f
from memspec.invariants.formal.proofs import at as _select, limit

MiB = 1 << 20
P2, P20 = 2 * MiB, 20 * MiB
PAGES = (P2, P20)
F, L, P, U = 0, 1, 2, 3          # block kinds: free, live, pending, unmapped
KIND = {"free": F, "live": L, "pending": P, "unmapped": U}
ARR_FIELDS = ("k", "sz", "off", "ar", "pg", "sm", "sr", "va")
ARENA_FIELDS = ("ar", "pg", "sm", "sr", "va")
SCALARS = ("n", "mapped", "cap", "fr", "allowed", "na", "seed")


# --------------------------------------------------------------------------
# one set of operators for Z3 terms and Python values
# --------------------------------------------------------------------------

def _py(*xs: Any) -> bool:
    return all(isinstance(x, (bool, int)) for x in xs)


def If(c: Any, a: Any, b: Any) -> Any:
    if isinstance(c, bool):
        return a if c else b
    return z3.If(c, a, b)


def And(*xs: Any) -> Any:
    if _py(*xs):
        return all(xs)
    ys = [x for x in xs if x is not True]
    if any(x is False for x in ys):
        return False
    return z3f.And(*ys)


def Or(*xs: Any) -> Any:
    if _py(*xs):
        return any(xs)
    ys = [x for x in xs if x is not False]
    if any(x is True for x in ys):
        return True
    return z3f.Or(*ys)


def Not(x: Any) -> Any:
    return (not x) if isinstance(x, bool) else z3f.Not(x)


def Implies(a: Any, b: Any) -> Any:
    return Or(Not(a), b)


def Min(a: Any, b: Any) -> Any:
    return If(a <= b, a, b)


def _div(x: Any, d: int) -> Any:
    return x // d if isinstance(x, int) else x / d


def _ceil(x: Any, d: int) -> Any:
    return _div(x + d - 1, d) * d


#: definitions of the fresh page multiples a proof introduced (``q * page`` is the ceiling / floor of a term):
#: definitional, so adding them to every query is sound; they keep the arithmetic free of div and mod
SIDE: list[Any] = []


def _page_mult(x: Any, pg: int, up: bool) -> Any:
    q = z3.FreshInt("c8q")
    SIDE.append(z3f.And(q * pg >= x, q * pg < x + pg) if up else z3f.And(q * pg <= x, x < q * pg + pg))
    return q * pg


def ceil_pg(x: Any, pg: Any) -> Any:
    """``x`` rounded up to the page ``pg`` (2 MiB or 20 MiB: a case split keeps the arithmetic linear)."""
    if isinstance(pg, int) and z3.is_expr(x):
        return _page_mult(x, pg, True)
    return If(pg == P2, _ceil(x, P2), _ceil(x, P20))


def floor_pg(x: Any, pg: Any) -> Any:
    if isinstance(pg, int) and z3.is_expr(x):
        return _page_mult(x, pg, False)
    return If(pg == P2, _div(x, P2) * P2, _div(x, P20) * P20)


def aligned(x: Any, pg: Any) -> Any:
    return If(pg == P2, x % P2 == 0, x % P20 == 0)


# --------------------------------------------------------------------------
# states: scalars and arrays (callables id -> value)
# --------------------------------------------------------------------------

class St(dict):
    """Scalars and arrays; an array is a callable ``id -> value`` (a Z3 select, a Python list, or a
    transformed array built from others)."""

    def __getattr__(self, name: str) -> Any:
        return self[name]

    def set(self, **kv: Any) -> "St":
        out = St(self)
        out.update(kv)
        return out


def _list_fn(xs: list[Any]) -> Callable[[Any], Any]:
    def f(i: Any) -> Any:
        return xs[i] if 0 <= i < len(xs) else 0
    f.values = xs  # type: ignore[attr-defined]
    return f


def sym_state(tag: str = "") -> St:
    """The symbolic pre-state of a proof."""
    s = St()
    for name in SCALARS:
        s[name] = z3.Bool(f"c8{tag}_{name}") if name in ("fr", "seed") else z3.Int(f"c8{tag}_{name}")
    for name in ARR_FIELDS + ("S", "M"):
        arr = z3.Array(f"c8{tag}_{name}", z3.IntSort(), z3.IntSort())
        s[name] = (lambda a: (lambda i: _select(a, i)))(arr)
    return s


def conc_state(blocks: list[dict[str, int]], *, mapped: int, cap: int, fr: bool, allowed: int, na: int,
               seed: bool) -> St:
    """A concrete state from blocks (the ghosts are the prefix sums of the blocks)."""
    s = St(n=len(blocks), mapped=mapped, cap=cap, fr=fr, allowed=allowed, na=na, seed=seed)
    for name in ARR_FIELDS:
        s[name] = _list_fn([b[name] for b in blocks])
    S, M = [0], [0]
    for b in blocks:
        S.append(S[-1] + b["sz"])
        M.append(M[-1] + (0 if b["k"] == U else b["sz"]))
    s["S"], s["M"] = _list_fn(S), _list_fn(M)
    return s


def blocks_of(s: St) -> list[dict[str, int]]:
    return [{f: s[f](i) for f in ARR_FIELDS} for i in range(s.n)]


def materialize(s: St) -> St:
    """A concrete state's arrays as lists again (after a transformation built callables on callables)."""
    out = St(s)
    for name in ARR_FIELDS:
        out[name] = _list_fn([s[name](i) for i in range(s.n)])
    for name in ("S", "M"):
        out[name] = _list_fn([s[name](i) for i in range(s.n + 1)])
    return out


def mb(s: St, i: Any) -> Any:
    """The mapped bytes of block ``i``."""
    return If(s.k(i) == U, 0, s.sz(i))


# --------------------------------------------------------------------------
# quantifiers over ids: concrete (a loop), goal (a skolem), hypothesis (instances)
# --------------------------------------------------------------------------

class Conc:
    def all(self, n: int, body: Callable[[Any], Any]) -> Any:
        return all(body(i) for i in range(n))

    def all2(self, n: int, body: Callable[[Any, Any], Any]) -> Any:
        return all(body(i, j) for i in range(n) for j in range(n))


class Goal:
    def __init__(self) -> None:
        self.a, self.b = z3.Ints("c8_ska c8_skb")

    def all(self, n: Any, body: Callable[[Any], Any]) -> Any:
        return z3f.Implies(z3f.And(0 <= self.a, self.a < n), body(self.a))

    def all2(self, n: Any, body: Callable[[Any, Any], Any]) -> Any:
        return z3f.Implies(z3f.And(0 <= self.a, self.a < n, 0 <= self.b, self.b < n), body(self.a, self.b))


class Hyp:
    def __init__(self, terms: list[Any], pairs: list[Any]) -> None:
        self.terms, self.pairs = _dedup(terms), _dedup(pairs)

    def all(self, n: Any, body: Callable[[Any], Any]) -> Any:
        return z3f.And(*[z3f.Implies(z3f.And(0 <= t, t < n), body(t)) for t in self.terms])

    def all2(self, n: Any, body: Callable[[Any, Any], Any]) -> Any:
        return z3f.And(*[z3f.Implies(z3f.And(0 <= a, a < n, 0 <= b, b < n), body(a, b))
                        for a in self.pairs for b in self.pairs])


def _dedup(ts: list[Any]) -> list[Any]:
    out: list[Any] = []
    for t in ts:
        t = z3.simplify(t if z3.is_expr(t) else z3.IntVal(t))
        if not any(z3.eq(t, x) for x in out):
            out.append(t)
    return out


# --------------------------------------------------------------------------
# the invariant
# --------------------------------------------------------------------------

def blk_wf(s: St, i: Any) -> Any:
    """One block: a legal kind, inside its arena, an unmapped block page-aligned, arena ids below ``na``."""
    k, sz, off, pg, va = s.k(i), s.sz(i), s.off(i), s.pg(i), s.va(i)
    return And(Or(k == F, k == L, k == P, k == U), sz >= 0, off >= 0, off + sz <= va,
               Or(pg == P2, pg == P20), aligned(va, pg), 0 <= s.ar(i), s.ar(i) < s.na,
               Implies(k == U, Or(sz == 0, And(aligned(off, pg), aligned(sz, pg)))))


def sums_step(s: St, i: Any) -> Any:
    return And(s.S(i + 1) == s.S(i) + s.sz(i), s.M(i + 1) == s.M(i) + mb(s, i))


def same_arena(s: St, a: Any, b: Any) -> Any:
    """Arenas in id order; blocks of one arena share its fields and ``off - S`` (offsets are prefix sums)."""
    return And(Implies(a <= b, s.ar(a) <= s.ar(b)),
               Implies(s.ar(a) == s.ar(b), And(*[s[f](a) == s[f](b) for f in ARENA_FIELDS[1:]],
                                               s.off(a) - s.S(a) == s.off(b) - s.S(b))))


def monotone(s: St, a: Any, b: Any) -> Any:
    return Implies(a <= b, And(s.S(a) <= s.S(b), s.M(a) <= s.M(b)))


def inv_parts(s: St, Q: Any) -> list[tuple[str, Any]]:
    """The inductive invariant, in named parts (each a separate goal): mapped <= capacity, mapped is the
    checked prefix-sum ghost of the mapped bytes, the layout well formed."""
    return [
        ("mapped <= capacity", And(s.n >= 0, s.na >= 0, 0 <= s.mapped, s.mapped <= s.cap)),
        ("mapped == M[n], ghosts start at 0", And(s.mapped == s.M(s.n), s.S(0) == 0, s.M(0) == 0)),
        ("blocks well formed", Q.all(s.n, lambda i: blk_wf(s, i))),
        ("prefix sums S, M", Q.all(s.n, lambda i: sums_step(s, i))),
        ("S, M monotone", Q.all2(s.n + 1, lambda a, b: monotone(s, a, b))),
        ("arena fields shared", Q.all2(s.n, lambda a, b: same_arena(s, a, b))),
    ]


def inv(s: St, Q: Any) -> Any:
    return And(*[t for _n, t in inv_parts(s, Q)])


# --------------------------------------------------------------------------
# transformations
# --------------------------------------------------------------------------

def replace(s: St, a: Any, z: Any, news: list[tuple[Any, Any]], arena: dict[str, Any] | None = None) -> St:
    """Blocks ``a .. z-1`` replaced by ``news`` (kind, size), in place (offsets from ``off[a]``, the arena's
    fields from block ``a``), or appended as a new arena (``arena``: its fields; ``a == z == n``)."""
    Lq = len(news)
    d = Lq - (z - a)
    sizes = [sz for _k, sz in news]
    mbs = [If(k == U, 0, sz) for k, sz in news]
    off0 = 0 if arena is not None else s.off(a)
    base = {f: (arena[f] if arena is not None else s[f](a)) for f in ARENA_FIELDS}
    pre_sz = [sum(sizes[:q], 0) for q in range(Lq + 1)]
    pre_mb = [sum(mbs[:q], 0) for q in range(Lq + 1)]

    def pick(i: Any, vals: list[Any], old: Callable[[Any], Any]) -> Any:
        out = old(i - d)
        for q in reversed(range(Lq)):
            out = If(i == a + q, vals[q], out)
        return If(i < a, old(i), out)

    out = St(s)
    out["k"] = lambda i: pick(i, [k for k, _ in news], s.k)
    out["sz"] = lambda i: pick(i, sizes, s.sz)
    out["off"] = lambda i: pick(i, [off0 + pre_sz[q] for q in range(Lq)], s.off)
    for f in ARENA_FIELDS:
        out[f] = (lambda f: lambda i: pick(i, [base[f]] * Lq, s[f]))(f)
    dS = pre_sz[Lq] - (s.S(z) - s.S(a))
    dM = pre_mb[Lq] - (s.M(z) - s.M(a))

    def ghost(old: Callable[[Any], Any], pre: list[Any], delta: Any) -> Callable[[Any], Any]:
        def g(i: Any) -> Any:
            out_ = old(i - d) + delta
            for q in reversed(range(1, Lq + 1)):
                out_ = If(i == a + q, old(a) + pre[q], out_)
            return If(i <= a, old(i), out_)
        return g
    out["S"] = ghost(s.S, pre_sz, dS)
    out["M"] = ghost(s.M, pre_mb, dM)
    out["n"] = s.n + d
    out["mapped"] = s.mapped + dM
    if arena is not None:
        out["na"] = s.na + 1
    return out


def flip(s: St, j: Any, x: Any) -> St:
    """Every unmapped block in ``j .. x-1`` mapped (the blocks there are free or unmapped)."""
    out = St(s)
    out["k"] = lambda i: If(And(j <= i, i < x, s.k(i) == U), F, s.k(i))
    grown = (s.S(x) - s.S(j)) - (s.M(x) - s.M(j))
    out["M"] = lambda i: If(i <= j, s.M(i), If(i <= x, s.M(j) + s.S(i) - s.S(j), s.M(i) + grown))
    out["mapped"] = s.mapped + grown
    return out


def page_of(s: St, small: Any) -> Any:
    """The arena page of the request's pool: the toy 2 MiB; pytorch 2 MiB small, 20 MiB large."""
    return If(Or(s.seed, small), P2, P20)


def segment_size(s: St, r: Any) -> Any:
    """``alloc``: what a non-expandable malloc would take (the fraction's check uses it; kernels.segment_size)."""
    return If(r <= MiB, P2, If(s.seed, If(r > P20, r, P20), If(r < 10 * MiB, P20, _ceil(r, P2))))


class MapArgs(St):
    """r (rounded), small, stream, j (run start), u (its first unmapped block), x (the block holding the
    request's last byte), f (map_oom: the first unmapped block that did not fit)."""


def run_end(s: St, a: MapArgs) -> Any:
    return s.off(a.j) + a.r


def part_of(s: St, a: MapArgs, whole: bool = False, page: Any = None) -> Any:
    """The bytes of block ``x`` in the request: its pages up to ceil(off[j] + r) when unmapped (the unguarded
    variant: the whole block), else all of it."""
    lacking = Min(ceil_pg(run_end(s, a), s.pg(a.x) if page is None else page) - s.off(a.x), s.sz(a.x))
    return If(s.k(a.x) == U, s.sz(a.x) if whole else lacking, s.sz(a.x))


def need(s: St, a: MapArgs, whole: bool = False, page: Any = None) -> Any:
    """The bytes the request maps: the unmapped blocks of ``j .. x-1`` and the lacking pages of ``x``."""
    return (s.S(a.x) - s.S(a.j)) - (s.M(a.x) - s.M(a.j)) + If(s.k(a.x) == U, part_of(s, a, whole, page), 0)


def cap_size(s: St, r: Any) -> Any:
    """What ``memory_fraction``'s cap is checked on (``policy._alloc_block``): pytorch the segment size
    ``alloc`` even when expandable; the toy maps only the pages of ``r`` (``if s.mapped + want > s.device``)."""
    return If(s.seed, _ceil(r, P2), segment_size(s, r))


def frac_oom(s: St, a: MapArgs) -> Any:
    return And(s.fr, s.mapped + cap_size(s, a.r) > s.allowed)


def map_oom_cond(s: St, a: MapArgs, whole: bool = False, page: Any = None) -> Any:
    return s.mapped + need(s, a, whole, page) > s.cap


def map_step(s: St, a: MapArgs, whole: bool = False, page: Any = None) -> St:
    """map, served: the run's unmapped blocks before ``x`` mapped, ``x`` split at the request's last page."""
    part = part_of(s, a, whole, page)
    s1 = flip(s, a.j, a.x)
    kx = s.k(a.x)
    return replace(s1, a.x, a.x + 1, [(If(kx == U, F, kx), part), (kx, s.sz(a.x) - part)])


def map_oom_step(s: St, a: MapArgs) -> St:
    """map, OutOfMemory: the blocks mapped one by one before ``f``, the first that did not fit, stay mapped."""
    return flip(s, a.j, a.f)


def fresh_len(s: St, a: MapArgs, page: Any = None) -> Any:
    return Min(ceil_pg(a.r, page_of(s, a.small) if page is None else page), a.va)


def fresh_step(s: St, a: MapArgs, page: Any = None) -> St:
    c = fresh_len(s, a, page)
    arena = {"ar": s.na, "pg": page_of(s, a.small) if page is None else page, "sm": If(a.small, 1, 0), "sr": a.stream, "va": a.va}
    return replace(s, s.n, s.n, [(F, c), (U, a.va - c)], arena=arena)


def merged(s: St, b: Any) -> tuple[Any, Any]:
    """The id range a freed block ``b`` merges into: its free neighbours in the same arena."""
    lo = If(And(b > 0, s.k(b - 1) == F, s.ar(b - 1) == s.ar(b)), b - 1, b)
    hi = If(And(b + 1 < s.n, s.k(b + 1) == F, s.ar(b + 1) == s.ar(b)), b + 2, b + 1)
    return lo, hi


def unmap_pieces(s: St, lo_off: Any, size: Any, pg: Any) -> list[tuple[Any, Any]]:
    """A free extent [lo, lo + size): its whole pages unmapped, the edges free."""
    b = ceil_pg(lo_off, pg)
    e = floor_pg(lo_off + size, pg)
    has = e > b
    return [(F, If(has, b - lo_off, size)), (U, If(has, e - b, 0)), (F, If(has, lo_off + size - e, 0))]


def free_step(s: St, b: Any, toy_unmap: Any, page: Any = None, case: tuple[int, int] | None = None) -> St:
    """free / event: block ``b`` becomes free and merges; the toy unmaps the whole pages inside.  ``case``
    (proofs): which neighbours merge, (1, 0) the previous only, ... (its precondition says so)."""
    lo, hi = merged(s, b) if case is None else (b - case[0], b + 1 + case[1])
    size = s.S(hi) - s.S(lo)
    pieces = unmap_pieces(s, s.off(lo), size, s.pg(b) if page is None else page)
    kept = [(F, size), (U, 0), (F, 0)]
    news = [(If(toy_unmap, pk, kk), If(toy_unmap, ps, ks)) for (pk, ps), (kk, ks) in zip(pieces, kept)]
    return replace(s, lo, hi, news)


def unmap_step(s: St, i: Any, page: Any = None) -> St:
    """The whole pages inside free block ``i`` unmapped (empty_cache, the retry)."""
    return replace(s, i, i + 1, unmap_pieces(s, s.off(i), s.sz(i), s.pg(i) if page is None else page))


def pend_step(s: St, b: Any) -> St:
    out = St(s)
    out["k"] = lambda i: If(i == b, P, s.k(i))
    return out


def fit_step(s: St, b: Any, r: Any, split: Any) -> St:
    """Best fit: free block ``b`` serves ``r`` bytes, split (the legal remainder stays free) or whole."""
    rr = If(split, r, s.sz(b))
    return replace(s, b, b + 1, [(L, rr), (F, s.sz(b) - rr)])


def release_step(s: St, a: Any, z: Any) -> St:
    """An arena with nothing mapped (ids ``a .. z-1``) is released: its VA returns."""
    return replace(s, a, z, [])


# --------------------------------------------------------------------------
# preconditions
# --------------------------------------------------------------------------

def eligible(s: St, y: Any, arena: Any) -> Any:
    return And(s.ar(y) == arena, Or(s.k(y) == F, s.k(y) == U))


def map_shape(s: St, a: MapArgs, Q: Any) -> Any:
    """The run ``j .. x``: ``u`` unmapped, ``j`` the free block before it or ``u`` itself, every block of
    ``j .. x`` free or unmapped in ``u``'s arena, ``x`` holding the request's last byte."""
    return And(a.r > 0, a.small == (a.r <= MiB), 0 <= a.j, a.j <= a.u, a.u <= a.x, a.x < s.n, s.k(a.u) == U, s.sz(a.u) > 0,
               Or(a.j == a.u, And(a.j + 1 == a.u, s.k(a.j) == F)),
               Q.all(s.n, lambda y: Implies(And(a.j <= y, y <= a.x), eligible(s, y, s.ar(a.u)))),
               s.off(a.x) < run_end(s, a), run_end(s, a) <= s.off(a.x) + s.sz(a.x),
               s.pg(a.u) == page_of(s, a.small))


def map_oom_shape(s: St, a: MapArgs) -> Any:
    """``f``: the first unmapped block of ``j .. x`` whose mapping did not fit (those before it did)."""
    piece = If(a.f == a.x, part_of(s, a), s.sz(a.f))
    before = (s.S(a.f) - s.S(a.j)) - (s.M(a.f) - s.M(a.j))
    return And(a.j <= a.f, a.f <= a.x, s.k(a.f) == U, s.mapped + before <= s.cap,
               s.mapped + before + piece > s.cap)


def reaches(s: St, j: Any, u: Any, r: int) -> Any:
    """Concrete: the run of free and unmapped blocks from ``j`` in ``u``'s arena reaches ``r`` bytes."""
    got, y = 0, j
    while y < s.n and eligible(s, y, s.ar(u)):
        got += s.sz(y)
        if got >= r:
            return True
        y += 1
    return False


def run_start(s: St, u: Any) -> Any:
    return If(And(u > 0, s.k(u - 1) == F, s.ar(u - 1) == s.ar(u)), u - 1, u)


def choose(s: St, r: int, small: bool, stream: int) -> tuple[int, int, int] | None:
    """Concrete, the spec's rule: the first unmapped block (arenas in address order) of the request's pool and
    stream whose run reaches ``r``; (j, u, x), or None (a fresh arena)."""
    for u in range(s.n):
        if s.k(u) == U and s.sm(u) == int(small) and s.sr(u) == stream and s.sz(u) > 0:
            j = run_start(s, u)
            if reaches(s, j, u, r):
                end = s.off(j) + r
                x = next(y for y in range(j, s.n) if s.off(y) < end <= s.off(y) + s.sz(y) and s.ar(y) == s.ar(u))
                return j, u, x
    return None


def first_oom_block(s: St, a: MapArgs) -> int:
    """Concrete: the first unmapped block of the run whose mapping does not fit."""
    for f in range(a.j, a.x + 1):
        if map_oom_shape(s, a.set(f=f)):
            return f
    raise AssertionError("map_oom without a failing block")


def best_fit_exists(s: St, r: int, small: bool, stream: int) -> bool:
    return any(s.k(y) == F and s.sm(y) == int(small) and s.sr(y) == stream and s.sz(y) >= r for y in range(s.n))


# --------------------------------------------------------------------------
# the proofs
# --------------------------------------------------------------------------

BUDGET_MS = 20000


def _check(hyps: list[Any], goal: Any, budget_ms: int | None = None) -> str:
    sol = limit(z3.Solver(), budget_ms or BUDGET_MS)
    sol.add(*SIDE)
    sol.add(*hyps)
    sol.add(z3f.Not(goal))
    res = sol.check()
    return "proved" if res == z3.unsat else str(res)


def _preserved(name: str, s: St, t: St, pre: Callable[[Any], list[Any]], anchors: list[Any],
               d: Any, at: Any = None, width: int = 0, vacuity: bool = True) -> list[tuple[str, str, float]]:
    """Inv(s) and ``pre`` imply Inv(t), part by part; hypotheses instantiated at the anchors, the goal's
    skolems and their images in ``s`` (shifted by ``d``).  ``at``/``width``: the ids ``at .. at+width-1`` of
    ``t`` are new; a per-block goal is then split by where its skolem lies (before, each new id, after)."""
    g = Goal()
    sk = [g.a, g.b]
    terms = list(anchors) + [x + e for x in sk for e in (0, 1, -1)] + [x - d + e for x in sk for e in (0, 1)]
    terms += [x + e for x in anchors for e in (1, -1)] + [s.n, s.n - 1, t.n, 0]
    pairs = list(anchors) + sk + [x - d for x in sk] + [s.n, 0]
    H = Hyp(terms, pairs)
    hyps = [inv(s, H), *pre(H)]
    cases = [z3.BoolVal(True)]
    if at is not None:
        cases = [g.a < at] + [g.a == at + q for q in range(width)] + [g.a >= at + width]
    t0 = time.process_time()
    # the hypotheses are instantiated (quantifier-free): Z3's solver for that logic first; an answer other
    # than unsat is re-checked on the default solver (a goal is proved if either answers unsat; both are
    # sound for unsat); the vacuity check (no claim) takes the first solver's sat
    sols = []
    from memspec.invariants.formal.proofs_caching_heap import qf_solver

    for sol in (qf_solver(BUDGET_MS), limit(z3.Solver(), BUDGET_MS)):
        sol.add(*SIDE)
        sol.add(*hyps)
        sols.append(sol)

    def check(*claim: Any) -> str:
        res = None
        for k, sol in enumerate(sols):
            if k and (res == z3.unsat or (res == z3.sat and not claim)):   # the vacuity check: sat is its answer
                # (a QF attempt that timed out answers unknown: the default solver decides)
                break
            sol.push()
            sol.add(*claim)
            res = sol.check()
            sol.pop()
        return res

    out = [(f"step:{name}: its precondition is satisfiable (not vacuous)",
            "proved" if check() == z3.sat else "vacuous", time.process_time() - t0)] if vacuity else []
    n_side = len(SIDE)
    parts = inv_parts(t, g)
    for sol in sols:
        sol.add(*SIDE[n_side:])  # the page multiples the goals' terms introduced (definitions: sound)
    for part, goal in parts:
        t0 = time.process_time()
        split = part in ("blocks well formed", "prefix sums S, M")
        res = [("proved" if r == z3.unsat else str(r))
               for r in (check(c, z3f.Not(goal)) for c in (cases if split else cases[:1]))]
        bad = [r for r in res if r != "proved"]
        out.append((f"step:{name}: {part}", bad[0] if bad else "proved", time.process_time() - t0))
    return out


def _margs(s: St, tag: str = "") -> MapArgs:
    a = MapArgs()
    for k in ("r", "stream", "j", "u", "x", "f", "va", "b"):
        a[k] = z3.Int(f"c8a{tag}_{k}")
    a["small"] = z3.Bool(f"c8a{tag}_small")
    return a


def proofs(only: tuple[str, ...] | None = None) -> list[tuple[str, str, float]]:
    """Every check of the C8 row: the invariant holds initially and every action preserves it (part by part),
    C8's step property, the kernel fact behind the fraction's form."""
    out: list[tuple[str, str, float]] = []
    want = (lambda nm: only is None or nm in only)
    s = sym_state()
    a = _margs(s)
    if want("init"):
        SIDE.clear()  # the page multiples of the terms built below
        init = s.set(n=0, mapped=0, S=lambda i: 0, M=lambda i: 0)
        for part, goal in inv_parts(init, Goal()):
            t0 = time.process_time()
            out.append((f"init: {part}", _check([s.cap >= 0, s.na >= 0], goal), time.process_time() - t0))
    for pg in PAGES:
        tag = f" [{pg >> 20} MiB pages]"
        if want("map"):
            SIDE.clear()  # the page multiples of the terms built below
            out += _preserved("map (served)" + tag, s, map_step(s, a, page=pg),
                              lambda H, pg=pg: [map_shape(s, a, H), s.pg(a.u) == pg, Not(frac_oom(s, a)),
                                                Not(map_oom_cond(s, a, page=pg))],
                              [a.j, a.u, a.x, a.x + 1], 1, vacuity=pg == P2)  # no split by id: faster here
        if want("fresh"):
            SIDE.clear()  # the page multiples of the terms built below
            out += _preserved("fresh arena" + tag, s, fresh_step(s, a, page=pg),
                              lambda H, pg=pg: [a.r > 0, a.va > 0, page_of(s, a.small) == pg, a.va % pg == 0,
                                                0 <= a.stream, s.mapped + fresh_len(s, a, pg) <= s.cap],
                              [s.n, s.n + 1], 2, s.n, 2, pg == P2)
        b = a.b
        lo, hi = merged(s, b)
        if want("free"):
            SIDE.clear()  # the page multiples of the terms built below
            for toy in ((True, False) if pg == P2 else (True,)):  # pytorch's merge has no page arithmetic
                for mp, mq in ((0, 0), (1, 0), (0, 1), (1, 1)):  # by which free neighbours merge
                    SIDE.clear()
                    what = f"merge {'prev ' * mp}{'next ' * mq}{'' if mp or mq else 'nothing '}"
                    out += _preserved(f"free/event ({'the toy: ' + what + 'and unmap the whole pages' if toy else 'pytorch: ' + what}){tag if toy else ''}", s,
                                      free_step(s, b, toy, page=pg, case=(mp, mq)),
                                      lambda H, pg=pg, mp=mp, mq=mq: [0 <= b, b < s.n, Or(s.k(b) == L, s.k(b) == P),
                                                                      s.pg(b) == pg, lo == b - mp, hi == b + 1 + mq],
                                      [b, b - 1, b + 1, b + 2], 2 - mp - mq, b - mp, 3,
                                      pg == P2 and mp + mq == 2)
        if want("unmap"):
            SIDE.clear()  # the page multiples of the terms built below
            out += _preserved("unmap a free block's whole pages (empty_cache, the retry)" + tag, s,
                              unmap_step(s, b, page=pg),
                              lambda H, pg=pg: [0 <= b, b < s.n, s.k(b) == F, s.pg(b) == pg], [b, b + 1], 2, b, 3, pg == P2)
    if want("map_oom"):
        SIDE.clear()  # the page multiples of the terms built below
        out += _preserved("map (OutOfMemory: the blocks before the failing one stay mapped)", s, map_oom_step(s, a),
                          lambda H: [map_shape(s, a, H), map_oom_shape(s, a)], [a.j, a.u, a.x, a.f], 0)
    b = a.b
    if want("pend"):
        SIDE.clear()  # the page multiples of the terms built below
        out += _preserved("pend (free with recorded uses)", s, pend_step(s, b),
                          lambda H: [0 <= b, b < s.n, s.k(b) == L], [b], 0)
    if want("fit"):
        SIDE.clear()  # the page multiples of the terms built below
        sp = z3.Bool("c8_split")
        out += _preserved("fit (best fit, split or whole)", s, fit_step(s, b, a.r, sp),
                          lambda H: [0 <= b, b < s.n, s.k(b) == F, 0 < a.r, a.r <= s.sz(b)], [b, b + 1], 1)
    if want("release"):
        SIDE.clear()  # the page multiples of the terms built below
        z = a.x
        # a whole arena (ids b .. z-1: the ids around it are other arenas) with nothing mapped
        out += _preserved("release an arena with nothing mapped", s, release_step(s, b, z),
                          lambda H: [0 <= b, b < z, z <= s.n, Or(b == 0, s.ar(b - 1) != s.ar(b)),
                                     Or(z == s.n, s.ar(z) != s.ar(b)), s.M(z) == s.M(b)],
                          [b, z, b - 1, z - 1], b - z)
    if want("C8"):
        SIDE.clear()  # the page multiples of the terms built below
        H0 = Hyp([a.j, a.u, a.x, a.x + 1, a.j + 1, a.u - 1], [a.j, a.u, a.x])
        shape = map_shape(s, a, H0)
        pg = page_of(s, a.small)
        frac = And(s.fr, s.allowed - s.mapped < cap_size(s, a.r))
        t0 = time.process_time()
        out.append(("step:map:C8 OutOfMemory => free < the lacking pages <= ceil(r, page), or the fraction's cap",
                    _check([inv(s, H0), shape, Or(frac_oom(s, a), map_oom_cond(s, a))],
                           Or(frac, And(s.cap - s.mapped < need(s, a), need(s, a) <= ceil_pg(a.r, pg)))),
                    time.process_time() - t0))
        t0 = time.process_time()
        out.append(("step:map: the lacking pages <= ceil(r, page), over any layout",
                    _check([inv(s, H0), shape], need(s, a) <= ceil_pg(a.r, pg)), time.process_time() - t0))
        t0 = time.process_time()
        out.append(("step:fresh:C8 OutOfMemory => free < ceil(r, page), or the fraction's cap",
                    _check([inv(s, H0), a.r > 0, a.va > 0, Or(frac_oom(s, a), s.mapped + fresh_len(s, a) > s.cap)],
                           Or(frac, s.cap - s.mapped < ceil_pg(a.r, pg))), time.process_time() - t0))
        t0 = time.process_time()
        out.append(("kernel: pytorch alloc <= ceil(r, page) (its fraction OutOfMemory is under the page-rounded r)",
                    _check([Not(s.seed), a.r > 0, a.r % 512 == 0, a.small == (a.r <= MiB)], segment_size(s, a.r) <= ceil_pg(a.r, pg)),
                    time.process_time() - t0))
    return out


class Expand:
    """Quantifiers over a concrete ``n`` on Z3 terms (a bounded model for counterexamples)."""

    def all(self, n: int, body: Callable[[Any], Any]) -> Any:
        return And(True, *[body(i) for i in range(n)])

    def all2(self, n: int, body: Callable[[Any, Any], Any]) -> Any:
        return And(True, *[body(i, j) for i in range(n) for j in range(n)])


def refute(whole: bool = True) -> tuple[bool, str]:
    """The unguarded variant (map the whole unmapped block ``x``, not only the pages the request lacks) breaks
    C8: an OutOfMemory with the request's pages free (a genuine layout: every id quantified)."""
    for n in (1, 2, 3):
        s = sym_state("u").set(n=n)
        a = _margs(s, "u")
        Q = Expand()
        sol = limit(z3.Solver(), 20000)
        pg = page_of(s, a.small)
        sol.add(inv(s, Q), map_shape(s, a, Q), Not(frac_oom(s, a)), map_oom_cond(s, a, whole=whole),
                Not(s.cap - s.mapped < ceil_pg(a.r, pg)))
        if sol.check() != z3.sat:
            continue
        m = sol.model()
        ev = lambda x: m.eval(x, model_completion=True)  # noqa: E731
        names = ["free", "live", "pending", "unmapped"]
        blocks = ", ".join(f"{names[ev(s.k(i)).as_long()]} {ev(s.sz(i))} at +{ev(s.off(i))}" for i in range(n))
        return True, (f"  capacity {ev(s.cap)}, mapped {ev(s.mapped)}, page {ev(pg)}; arena blocks: {blocks}\n"
                      f"  malloc (rounded {ev(a.r)}) from the run at block {ev(a.j)} [without: map only the pages "
                      f"the request lacks] maps {ev(need(s, a, whole))} bytes\n  => OutOfMemory with "
                      f"{ev(s.cap - s.mapped)} bytes free >= the request's pages {ev(ceil_pg(a.r, pg))}: C8 violated")
    return False, "without 'map only the pages the request lacks': no violation of C8 found"


UNGUARDED = {"C8": ("malloc:map", "lacking", "map only the pages the request lacks (not the whole unmapped block)")}


# --------------------------------------------------------------------------
# agreement with spec/caching (expandable walks)
# --------------------------------------------------------------------------

class Proj:
    """A projected spec state: the encoding's concrete state, and per arena its base address."""

    def __init__(self, s: St, bases: list[int | None]) -> None:
        self.s, self.bases = s, bases


def project(st: Any) -> Proj:
    """The spec state as this encoding's state, from its segments and blocks only: the bound arenas in address
    order, their blocks in offset order; mapped = the bytes of every block not unmapped."""
    arenas = sorted((g for g in st.segments if g.expandable and g.base is not None), key=lambda g: g.base)
    blocks = [{"k": KIND[b.state], "sz": b.size, "off": b.offset, "ar": ai, "pg": g.page, "sm": int(g.small),
               "sr": g.stream, "va": g.size} for ai, g in enumerate(arenas) for b in g.blocks]
    pol = st.policy
    mapped = sum(b["sz"] for b in blocks if b["k"] != U)
    return Proj(conc_state(blocks, mapped=mapped, cap=pol.capacity, fr=pol.memory_fraction is not None,
                           allowed=pol.allowed or 0, na=len(arenas), seed=pol.seed),
                [g.base for g in arenas])


def canon(p: Proj) -> Proj:
    """The same bytes, tidied as the spec keeps them: empty blocks dropped, neighbouring free (or unmapped)
    blocks of an arena joined; then every arena with nothing mapped released (``release``, the encoding's)."""
    out: list[dict[str, int]] = []
    for b in blocks_of(p.s):
        if b["sz"] == 0:
            continue
        if out and out[-1]["ar"] == b["ar"] and out[-1]["k"] == b["k"] and b["k"] in (F, U):
            out[-1]["sz"] += b["sz"]
        else:
            out.append(dict(b))
    s = p.s
    c = conc_state(out, mapped=s.mapped, cap=s.cap, fr=s.fr, allowed=s.allowed, na=s.na, seed=s.seed)
    bases = list(p.bases)
    i = 0
    while i < c.n:
        z = i
        while z < c.n and c.ar(z) == c.ar(i):
            z += 1
        if c.M(z) == c.M(i):
            c = materialize(release_step(c, i, z))  # arena ids are not renumbered: ``bases`` still holds
            continue
        i = z
    return Proj(c, bases)


def _apply(p: Proj, t: St) -> Proj:
    return canon(Proj(materialize(t), p.bases))


def unmapped_ranges(p: Proj) -> dict[Any, list[tuple[int, int]]]:
    """{arena base (or "new"): [(offset, end)] of its unmapped blocks}, for arenas holding mapped bytes."""
    s = p.s
    out: dict[Any, list[tuple[int, int]]] = {}
    for i in range(s.n):
        key = p.bases[s.ar(i)] if s.ar(i) < len(p.bases) else "new"
        out.setdefault(key, [])
        if s.k(i) == U and s.sz(i):
            rs = out[key]
            if rs and rs[-1][1] == s.off(i):
                rs[-1] = (rs[-1][0], s.off(i) + s.sz(i))
            else:
                rs.append((s.off(i), s.off(i) + s.sz(i)))
    return out


def _find(p: Proj, base: int, offset: int) -> int:
    s = p.s
    for i in range(s.n):
        if p.bases[s.ar(i)] == base and s.off(i) == offset:
            return i
    raise KeyError((base, offset))


def _release_all(p: Proj) -> tuple[Proj, int]:
    """empty_cache / pytorch's retry: every event completes (every pending block freed and merged; the toy
    unmaps at that free), then the whole pages of every free block unmapped, every arena left with nothing
    mapped released; and the bytes that second part unmapped (empty_cache's answer)."""
    while True:
        pend = [i for i in range(p.s.n) if p.s.k(i) == P]
        if not pend:
            break
        p = _apply(p, free_step(p.s, pend[0], p.s.seed))
    after_events = p.s.mapped
    i = 0
    while i < p.s.n:
        if p.s.k(i) == F:
            q = _apply(p, unmap_step(p.s, i))
            if q.s.mapped != p.s.mapped:
                p, i = q, 0
                continue
        i += 1
    return p, after_events - p.s.mapped


def _attempt(p: Proj, r: int, small: bool, stream: int, va: int) -> tuple[str, Proj, Any]:
    """alloc_block: the fraction's check, then the run (or a fresh arena) mapped, or OutOfMemory."""
    s = p.s
    a = MapArgs(r=r, small=small, stream=stream, va=va, j=0, u=0, x=0, f=0)
    if frac_oom(s, a):
        return "fraction", p, None
    run = choose(s, r, small, stream)
    if run is None:
        if s.mapped + fresh_len(s, a) > s.cap:
            return "oom", p, None
        t = _apply(p, fresh_step(s, a))
        return "fresh arena", t, ("new", 0)
    a = a.set(j=run[0], u=run[1], x=run[2])
    if map_oom_cond(s, a):
        return "oom", _apply(p, map_oom_step(s, a.set(f=first_oom_block(s, a)))), None
    nu = sum(1 for y in range(a.j, a.x + 1) if s.k(y) == U and s.sz(y))
    where = (p.bases[s.ar(a.j)], s.off(a.j))
    return ("multi-block run" if nu > 1 else "existing run"), _apply(p, map_step(s, a)), where


def _events_done(before: Any) -> list[int]:
    """Pending refs whose every event completed (a malloc frees them first), in the spec's event order."""
    out: list[int] = []
    for _s, _v, ref in before.events:
        if ref not in out and all(before.completed.get(s2, 0) >= v2 for s2, v2, r2 in before.events if r2 == ref):
            out.append(ref)
    return out


def _free_ref(p: Proj, before: Any, ref: int, pend: bool = False) -> Proj:
    seg, i = before.block_of(ref)
    b = _find(p, seg.base, seg.blocks[i].offset)
    if pend:
        return _apply(p, pend_step(p.s, b))
    return _apply(p, free_step(p.s, b, p.s.seed))


def _invariant_agrees(st: Any, rep: dict[str, Any], where: str) -> None:
    from memspec.spec.caching import CACHING

    rep["inv"][0] += 1
    spec_ok = next(i for i in CACHING.invariants if i.id == "C8").check(st) is None
    enc_ok = bool(inv(project(st).s, Conc()))
    if spec_ok != enc_ok:
        rep["inv"][1] += 1
        rep["inv_examples"].append(f"C8 {where}: spec {spec_ok}, encoding {enc_ok}")


BRANCHES = {"caching:malloc": ("map/existing run", "map/multi-block run", "map/fresh arena", "map/oom",
                               "map/oom: memory_fraction", "map/after the retry's release", "fit"),
            "caching:free": ("free: the toy unmaps", "free: merge", "free: pending"),
            "caching:empty_cache": ("unmap",)}


def new_report() -> dict[str, Any]:
    return {"counts": {a: {b: 0 for b in bs} for a, bs in BRANCHES.items()}, "mismatches": [], "inv": [0, 0],
            "inv_examples": []}


def check_step(st: Any, name: str, args: dict[str, Any], rep: dict[str, Any]) -> None:
    """One spec step on ``st`` (committed), checked against the encoding run on the projection before it."""
    from memspec.spec.caching import CACHING, ONE_EB
    from memspec.spec.caching.policy import predict_malloc
    from memspec.spec.core import Raises

    where = f"{name}{args} on {st.policy.preset} (expandable)"
    _invariant_agrees(st, rep, f"before {name}{args}")
    before = copy.deepcopy(st)
    p = canon(project(before))
    act = next(x for x in CACHING.actions if x.name == name)
    res = act.step(st, **args)
    br = res.branches[0]
    served = None
    if isinstance(br, Raises):
        if name == "malloc" and args["size"] < ONE_EB:
            st.__dict__.update(copy.deepcopy(predict_malloc(before, args["size"], args["stream"]).state).__dict__)
        outcome = "OutOfMemory"
    else:
        got = br.then(br.witness())
        outcome = "returned"
        if name == "malloc":
            seg, i = st.block_of(got)
            served = (seg.base, seg.blocks[i].offset, seg.sid)
        elif name == "empty_cache":
            served = br.witness()
    branch, want, want_where = None, p, None
    if name == "malloc" and args["size"] < ONE_EB:
        pol = before.policy
        r = pol.rounded(args["size"])
        small, stream = r <= MiB, args["stream"]
        for ref in _events_done(before):
            want = _free_ref(want, before, ref)
        va = _ceil(int(pol.capacity * pol.arena), pol.page(small))
        if pol.max_split_size == 0 and best_fit_exists(want.s, r, small, stream):
            branch = "fit"
        else:
            kind, want, want_where = _attempt(want, r, small, stream, va)
            if kind in ("oom", "fraction") and not pol.seed:
                want = _release_all(want)[0]
                kind, want, want_where = _attempt(want, r, small, stream, va)
                if kind not in ("oom", "fraction"):
                    kind = "after the retry's release"
            branch = {"oom": "map/oom", "fraction": "map/oom: memory_fraction"}.get(kind, f"map/{kind}")
        if (outcome == "OutOfMemory") != branch.startswith("map/oom"):
            rep["mismatches"].append(f"{where}: spec {outcome}, encoding {branch}")
            return
        if branch != "fit" and want_where is not None:
            fresh_seg = not any(g.sid == served[2] and g.base is not None for g in before.segments)
            ok = (want_where[0] == "new" and fresh_seg) or (want_where == served[:2] and not fresh_seg)
            if not ok:
                rep["mismatches"].append(f"{where}: spec serves {served[1]:#x} of arena {served[0]:#x}"
                                         f"{' (fresh)' if fresh_seg else ''}, encoding {want_where}")
                return
            if want_where[0] == "new":
                want.bases = want.bases + [served[0]] * (want.s.na - len(want.bases))
    elif name == "free":
        seg, i = before.block_of(args["ref"])
        pend = bool(seg.blocks[i].uses)
        want = _free_ref(p, before, args["ref"], pend)
        branch = "free: pending" if pend else ("free: the toy unmaps" if before.policy.seed else "free: merge")
    elif name == "empty_cache":
        want, released = _release_all(p)
        branch = "unmap"
        if served != released:
            rep["mismatches"].append(f"{where}: spec releases {served}, encoding {released}")
            return
    spec_after = project(st)
    if spec_after.s.mapped != want.s.mapped or unmapped_ranges(spec_after) != unmapped_ranges(want):
        rep["mismatches"].append(f"{where} [{branch}]: spec maps {spec_after.s.mapped} bytes, unmapped "
                                 f"{unmapped_ranges(spec_after)}; encoding {want.s.mapped}, {unmapped_ranges(want)}")
        return
    if branch is not None:
        counts = rep["counts"][f"caching:{name}"]
        counts[branch] = counts.get(branch, 0) + 1


#: scripted walks (pytorch, expandable): a run of several unmapped blocks; memory_fraction's OutOfMemory
SCRIPTS = {
    "multi-block run": (dict(policy="pytorch", capacity=200 * MiB), [
        ("malloc", 20), ("malloc", 20), ("malloc", 20), ("malloc", 20), ("malloc", 20), ("free", 1),
        ("empty_cache", None), ("free", 3), ("empty_cache", None), ("free", 2), ("malloc", 60)]),
    "memory_fraction": (dict(policy="pytorch", capacity=64 * MiB, memory_fraction=0.5), [
        ("malloc", 20), ("malloc", 20)]),
    "memory_fraction (toy)": (dict(policy="seed", capacity=44 * MiB, memory_fraction=0.5), [
        ("malloc", 4), ("malloc", 4)]),
    # arenas of 40 MiB VA: a second arena of the pool; then both have a 20 MiB run: the first by address serves
    "two arenas": (dict(policy="pytorch", capacity=64 * MiB, arena_factor=0.5), [
        ("malloc", 20), ("malloc", 20), ("malloc", 20), ("free", 0), ("empty_cache", None), ("malloc", 20)]),
}


def run_script(key: str, rep: dict[str, Any]) -> Any:
    from memspec.spec import caching as C

    cfg, script = SCRIPTS[key]
    st = C.init(expandable=True, streams=2, **cfg)
    refs: list[int] = []
    for name, arg in script:
        if name == "malloc":
            nxt = st.next_ref
            check_step(st, "malloc", {"size": arg * MiB, "stream": 0}, rep)
            if st.next_ref > nxt:
                refs.append(nxt)
        elif name == "free":
            check_step(st, "free", {"ref": refs[arg]}, rep)
        else:
            check_step(st, name, {}, rep)
    return st


#: the agreement walks of ``memspec prove``: per seed, ``WALKS`` walks of ``STEPS`` steps on each configuration
WALKS, STEPS, SEEDS = 6, 60, 1
CONFIGS = (dict(policy="seed", capacity=44 * MiB), dict(policy="pytorch", capacity=64 * MiB),
           dict(policy="pytorch", capacity=64 * MiB, memory_fraction=0.75))


def _walks(rng: random.Random, walks: int, steps: int, rep: dict[str, Any]) -> None:
    from memspec.spec.core import RandomChooser
    from memspec.invariants.formal.proofs_caching_agree_runs import MIX
    from memspec.spec import caching as C

    for w in range(walks):
        for cfg in CONFIGS:
            st = C.init(expandable=True, streams=2, **cfg)
            ch = RandomChooser(random.Random(rng.random() + w))
            for _ in range(steps):
                name = rng.choice(MIX)
                act = next(a for a in C.CACHING.actions if a.name == name)
                if not act.available(st) or name == "double_free":
                    continue
                check_step(st, name, act.draw_args(st, ch), rep)


class _C8Agreement:
    def __init__(self, rep: dict[str, Any]) -> None:
        self.counts = rep["counts"]
        self.mismatches = rep["mismatches"]
        self.inv = {"C8": rep["inv"]}
        self.inv_examples = rep["inv_examples"]


def run_c8(seed: int = 0, walks: int = WALKS, steps: int = STEPS, seeds: int = SEEDS) -> dict[str, Any]:
    """The proofs, the refutation and the agreement walks (scripted, then seeds ``seed .. seed + seeds - 1``);
    the C8 row's material."""
    t0 = time.process_time()
    checks = proofs()
    rep = new_report()
    for key in SCRIPTS:
        run_script(key, rep)
    for rng in (random.Random(sd) for sd in range(seed, seed + seeds)):
        _walks(rng, walks, steps, rep)
    return {"checks": checks, "refuted": {"C8": refute()}, "unguarded": UNGUARDED,
            "actions": {"malloc": ["caching:malloc"], "free": ["caching:free"], "empty_cache": ["caching:empty_cache"]},
            "bounded": {"C8": None}, "agreement": _C8Agreement(rep), "seconds": time.process_time() - t0}
