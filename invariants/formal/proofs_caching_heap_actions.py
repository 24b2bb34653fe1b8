"""The caching heap encoding's transitions: the second part of
:mod:`memspec.invariants.formal.proofs_caching_heap` (which assembles it; import from there).

Every encoded action (malloc's paths, free, record_stream, the stream events,
empty_cache, the garbage collection and release_available phases), expandable
segments (the mapping of a run, a fresh arena, the unmap of whole free pages), and the
phase actions that the covered actions are instances of.
"""

from __future__ import annotations

from typing import Any, Callable

import z3

from memspec.invariants.formal.z3fast import And, Implies, Not, Or

from memspec.invariants.formal.proofs import INT, OK, PENDING, Act, St, at, upd
from memspec.invariants.formal.proofs_caching_heap_terms import (
    DOUBLE, FREE, K_LARGE_BUFFER, K_MIN_BLOCK, K_SMALL, LIVE, MODE, ONE_EB, OOM, PEND, STREAMS, SUMS, UNM, _all,
    _all2, _contrib, ceil_pg, floor_pg, idle, page, round_ok, total, z_segment, z_split,
)


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


#: a block's recorded uses and events, none (a new block, a block served, a free or unmapped block split off)
NO_USES = {**{f"u{t}": False for t in range(STREAMS)}, **{f"e{t}": 0 for t in range(STREAMS)}}


def _new_segment(s: St, r: Any, small: Any, t: Any, base: Any, alloc: Any, rqn: Any) -> St:
    """A new segment at ``base``: its first block serves the request, the legal remainder stays free."""
    split = z_split(s, alloc - r, r, small)
    return _add_segment(s, base, alloc, small, t, r, z3.If(split, r, alloc), split, (LIVE, rqn), FREE, alloc)


def _add_segment(s: St, base: Any, size: Any, small: Any, t: Any, cut: Any, first: Any, two: Any,
                 head: tuple[Any, Any], tail: int, mapped: Any) -> St:
    """A segment (or arena) of ``size`` bytes at ``base`` (ids ``n``, ``n + 1``): its first block of ``first``
    bytes (kind and requested bytes ``head``) and, when ``two``, the rest from ``cut`` on (kind ``tail``);
    reserved grows by ``mapped``.  A new segment (:func:`_new_segment`) and a fresh arena (:func:`fresh_step`)."""
    n = s.n
    fields = {"al": True, "ad": base, "sz": first, "k": head[0], "rq": head[1], "sm": small, "sr": t,
              "sb": base, "ss": size, "pv": -1, "nx": z3.If(two, n + 1, -1), **NO_USES}
    rest = {**fields, "al": two, "ad": base + cut, "sz": size - cut, "k": tail, "rq": 0, "pv": n, "nx": -1}
    out = St(s)
    for f in fields:
        out[f] = upd(upd(s[f], n, fields[f]), n + 1, z3.If(two, rest[f], at(s[f], n + 1)))
    out.update(_reserve(s, small, mapped))
    # appended ids: 2 (the second is dead when not ``two``: contributes 0)
    out = _update_sums(s, out, [], 2)
    out["n"] = n + z3.If(two, 2, 1)
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


def best_fit(s: St, b: Any, b2: Any, cand: Callable[[Any], Any]) -> Any:
    """``b`` is get_free_block's choice among the candidates ``cand``: the smallest (size, then lowest
    address); with expandable segments PyTorch's walk on to smaller expandable sizes (:func:`grow_best`,
    ``b2`` the successor candidate).  Malloc's precondition and C4's step property."""
    bsz = at(s.sz, b)
    plain = _all(s.n, lambda j: Implies(
        cand(j), Or(at(s.sz, j) > bsz, And(at(s.sz, j) == bsz, at(s.ad, j) >= at(s.ad, b)))))
    return z3.If(s.ex, grow_best(s, b, b2, cand), plain)


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
    best = And(0 <= b, b < s.n, cand(b), z3.BoolVal(True) if "best" in guards else best_fit(s, b, a.b2, cand))
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
#: how pytorch's retry ends (``malloc_retry:``): a new segment, OutOfMemory, the mapping again
RETRY_PATHS = ("new", "oom", "expand")


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
    r, b = m["r"], a.b
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
    for f, v in {"sz": z3.If(split, r, bsz), "k": LIVE, "rq": size, **NO_USES}.items():
        fit[f] = upd(s[f], b, v)
    _cut(s, fit, b, split, at(s.ad, b) + r, bsz - r, FREE)
    fit = _update_sums(s, fit, [(b, z3.BoolVal(True))], 1)
    fit["n"] = n + z3.If(split, 1, 0)
    return fit


def _cut(s: St, out: St, b: Any, two: Any, ad: Any, size: Any, kind: int) -> None:
    """When ``two``, block ``n`` of ``out`` is the tail of block ``b`` from ``ad`` on (``size`` bytes of
    ``kind``), linked after it: the remainder of a best fit (:func:`_serve`), the pages of an unmapped block
    not mapped (:func:`map_step`)."""
    n, q = s.n, at(s.nx, b)
    rest = {"al": two, "ad": ad, "sz": size, "k": kind, "rq": 0, "sm": at(s.sm, b), "sr": at(s.sr, b),
            "sb": at(s.sb, b), "ss": at(s.ss, b), "pv": b, "nx": q, **NO_USES}
    for f, v in rest.items():
        out[f] = upd(out[f], n, z3.If(two, v, at(s[f], n)))
    out["nx"] = z3.If(two, upd(out["nx"], b, n), out["nx"])
    out["pv"] = z3.If(And(two, q != -1), upd(out["pv"], q, n), out["pv"])


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


def map_len(s: St, q: Any, guards: frozenset = frozenset()) -> Any:
    """``_map``: the pages of unmapped block ``q`` from its start up to the request's last byte (the head's
    bytes already count), at most the block (C8's unguarded variant, ``map-lacking`` removed: the whole
    block)."""
    if "map-lacking" in guards:
        return at(s.sz, q)
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


def map_step(s: St, a: St, guards: frozenset = frozenset()) -> tuple[Any, St]:
    """expand:map: the pages of unmapped block ``b`` (the target) are mapped; they become free and merge
    with the head (and, the block mapped whole, with a free block after it); the rest stays unmapped."""
    q = a.b
    m = map_len(s, q, guards)
    part = m < at(s.sz, q)
    n = s.n
    s1 = St(s)
    _cut(s, s1, q, part, at(s.ad, q) + m, at(s.sz, q) - m, UNM)
    s1["sz"] = upd(s1["sz"], q, m)
    merged, touched = _merge_free(s1, q)
    out = _update_sums(s, merged, touched, 1)
    out.update(_reserve(s, at(s.sm, q), m))
    out["n"] = n + z3.If(part, 1, 0)
    out["xh"] = q
    return PENDING, out


def fresh_step(s: St, a: St) -> tuple[Any, St]:
    """expand:fresh: a new arena (VA ``vs``/``vl``) at a fresh base, its first pages mapped (the head)."""
    small = s.mr <= K_SMALL
    va, m = _arena_va(s, small), fresh_len(s)
    out = _add_segment(s, a.base, va, small, s.mt, m, m, m < va, (FREE, 0), UNM, m)
    out["xh"] = s.n
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


def _fails(s: St, guards: frozenset = frozenset()) -> Any:
    """The next mapping does not fit the device."""
    q = _target(s)
    used = s.Rs + s.Rl
    # (a fresh arena whose VA is smaller than the request: no arena can hold it)
    return z3.If(q == -1, And(s.xh == -1, Or(used + fresh_len(s) > s.cap, no_arena_holds(s))),
                 And(0 <= q, q < s.n, at(s.al, q), at(s.k, q) == UNM, used + map_len(s, q, guards) > s.cap))


def no_arena_holds(s: St) -> Any:
    """A fresh arena's VA is smaller than the request (``arena_factor`` that small: not the presets')."""
    return _arena_va(s, s.mr <= K_SMALL) < s.mr


def lacking(s: St) -> Any:
    """The bytes the mapping's next step maps (C8: an OutOfMemory leaves less free than these): the lacking
    pages of the target unmapped block, or a fresh arena's first pages."""
    q = _target(s)
    return z3.If(q == -1, fresh_len(s), map_len(s, q))


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
    common = {"k": FREE, "rq": 0, "sm": at(s.sm, b), "sr": at(s.sr, b), "sb": sb, "ss": at(s.ss, b), **NO_USES}
    hf = {"al": head > 0, "ad": at(s.ad, b), "sz": head, "pv": p, "nx": b, **common}
    tf = {"al": tail > 0, "ad": sb + E, "sz": tail, "pv": b, "nx": q, **common}
    s1 = St(s)
    for f in hf:
        s1[f] = upd(upd(s[f], n, hf[f]), n + 1, tf[f])
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

    def mk_end(phase: str, path: str, pre: Callable[..., Any], params: tuple[str, ...]) -> Act:
        """A phase's end (the garbage collection's, release_available's): the pending request goes on."""
        return Act(f"{phase}:{path}", {k: INT for k in params},
                   phase_new_step if path == "new" else (lambda s, a: cont_step(s, a, path, s.mn, s.mt, s.mr)),
                   lambda s, a: pre(s, a, path, guards), spec=("caching:malloc",))

    def mk_free(path: str) -> Act:
        return Act(f"free:{path}", {"b": INT}, lambda s, a: free_step(s, a, path, guards),
                   lambda s, a: And(live_pre(s, a), free_path(s, a, path, guards)), spec=("caching:free",))

    def fail(s: St, a: St) -> list[Any]:
        """expand:oom / expand:retry: ``b`` is the target after the head and its pages do not fit."""
        return [s.xp, _growing(s), a.b == _target(s), Or(s.xh == -1, at(s.pv, a.b) == s.xh), _fails(s, guards)]

    def pages(s: St, b: Any) -> list[Any]:
        """unmap:free / unmap:cache: ``b`` is a free block holding a whole page."""
        return [0 <= b, b < s.n, at(s.al, b), at(s.k, b) == FREE, has_pages(s, b)]

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
        *[mk_end("gc_end", p, gc_end_pre, ("base", "lf", "lw", "u")) for p in CONT_PATHS],
        Act("avail:big", {"b": INT}, release_step, avail_big_pre, spec=("caching:malloc",)),
        Act("avail:one", {"b": INT}, release_step, lambda s, a: avail_one_pre(s, a, guards),
            spec=("caching:malloc",)),
        *[mk_end("avail_end", p, avail_end_pre, ("b", "base", "lf", "lw")) for p in ("new", "retry")],
        *[mk_retry(p) for p in RETRY_PATHS],
        # expandable segments: the mapping's steps, the unmap of whole free pages
        Act("expand:map", {"b": INT}, lambda s, a: map_step(s, a, guards),
            lambda s, a: And(s.xp, _growing(s), a.b == _target(s), 0 <= a.b, a.b < s.n, at(s.al, a.b),
                                Or(s.xh == -1, at(s.pv, a.b) == s.xh),
                                at(s.k, a.b) == UNM,
                                z3.BoolVal(True) if "map-room" in guards else
                                s.Rs + s.Rl + map_len(s, a.b, guards) <= s.cap),
            spec=("caching:malloc",)),
        Act("expand:fresh", {"base": INT}, fresh_step,
            lambda s, a: And(s.xp, s.xh == -1, s.xq == -1, s.Rs + s.Rl + fresh_len(s) <= s.cap,
                                fresh_len(s) >= s.mr, _fresh_base(s, a.base, _arena_va(s, s.mr <= K_SMALL))),
            spec=("caching:malloc",)),
        Act("expand:serve", {"b": INT}, lambda s, a: serve_step(s, a, guards),
            lambda s, a: And(s.xp, s.xh != -1, a.b == s.xh, at(s.sz, s.xh) >= s.mr), spec=("caching:malloc",)),
        # (``b``: the target that does not fit, -1 a fresh arena, after the head -- named so that the proofs
        # see its block and the head)
        Act("expand:oom", {"b": INT, "lf": INT, "lw": INT}, lambda s, a: expand_fail_step(s, a, "oom"),
            lambda s, a: And(*fail(s, a), Or(s.seed, s.x2), _largest_free_ok(s, a.lf, a.lw)),
            spec=("caching:malloc",)),
        Act("expand:retry", {"b": INT}, lambda s, a: expand_fail_step(s, a, "retry"),
            lambda s, a: And(*fail(s, a), Not(s.seed), Not(s.x2)), spec=("caching:malloc",)),
        Act("unmap:free", {"b": INT}, lambda s, a: unmap_step(s, a, False),
            lambda s, a: And(s.ex, s.seed, idle(s), *pages(s, a.b)),
            spec=("caching:free", "caching:malloc", "caching:empty_cache")),
        Act("unmap:cache", {"b": INT}, lambda s, a: unmap_step(s, a, True),
            lambda s, a: And(s.ex, Or(idle(s), s.md), _no_pending(s), *pages(s, a.b)),
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
