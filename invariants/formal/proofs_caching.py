"""Bounded model checking of fragmentation in the caching allocator (seed 003).

Seed 003: *"out of memory" almost never means out of bytes; it means out of
contiguous, policy-satisfiable memory ... Free: 16 MiB. Request: 8 MiB.
Failure.*

Z3 synthesizes the *shortest* sequence of ``malloc``/``free`` calls after
which a request fails although the total free memory (capacity minus the
allocated bytes) is at least the rounded request, under the ``pytorch``
preset and the seed's preset (:mod:`memspec.spec.caching`); the sequence is
then replayed on the executable caching spec, which must raise OutOfMemory
with the same figures.  With expandable segments it shows that no such
sequence exists up to depth ``k`` (see :func:`expandable_no_fragmentation_oom`).

The encoding: one stream, the large pool (requests > 1 MiB; pools never mix,
so the small pool is an independent copy of the same argument), no
``max_split_size``, no memory fraction.  Blocks are ``N`` slots (``used``,
segment, offset, size, free), segments ``S`` slots (alive, size); sizes are
unbounded Z3 integers.  ``malloc``: round, best fit (smallest free block,
ties by lowest address), split if the remainder is legal, else a new segment
if it fits the capacity, else (pytorch only) release every fully-free
segment and retry, else OOM.  ``free``: coalesce with free neighbours.

What this unrolls is this module's own slots model of malloc/free, not the heap
machine's actions (:mod:`memspec.invariants.formal.proofs_caching_heap`, which proves
C1-C9); only the policy kernels (rounding, segment size, split rule) are the heap
encoding's, applied to a concrete policy state (:func:`policy`).  Unrolling the heap
machine's own actions from its empty heap was tried (issue #33): sound, and it replayed,
but pytorch's depth-1 query (``malloc:new``, then ``malloc:retry`` and
``malloc_retry:oom``) took 1 s to 80 s CPU or ran out of its resource limit depending
on how the terms were built, against 0.3 s here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import z3

from memspec.invariants.formal.proofs import limit  # Z3 resource limits, not wall-clock timeouts
from memspec.invariants.formal.proofs import St

from memspec.spec.api import MiB

# the seed's size constant and policy kernels, stated once: the heap encoding's
from memspec.invariants.formal.proofs_caching_heap_terms import K_SMALL, z_round, z_segment, z_split


def policy(seed: bool) -> St:
    """The policy fields the heap's kernels read (:func:`z_round`, :func:`z_segment`, :func:`z_split`),
    concrete: the preset, no max_split_size, no roundup_power2_divisions table, no expandable segments."""
    return St(seed=z3.BoolVal(seed), ms=z3.IntVal(0), ex=z3.BoolVal(False), dv=z3.K(z3.IntSort(), z3.IntVal(0)))


def _kernels(seed: bool) -> tuple[Any, Any, Any]:
    """The heap's kernels at :func:`policy`, simplified, for a large-pool request: ``(round(n),
    segment(r), split(remaining, r))`` as functions of Z3 terms."""
    p = policy(seed)
    return (lambda n: z3.simplify(z_round(p, n)), lambda r: z3.simplify(z_segment(p, r)),
            lambda rem, r: z3.simplify(z_split(p, rem, r, z3.BoolVal(False))))


@dataclass
class Slots:
    used: list[Any]
    seg: list[Any]
    off: list[Any]
    size: list[Any]
    free: list[Any]
    salive: list[Any]
    ssize: list[Any]
    nslots: Any
    nsegs: Any

    def ite(self, c: Any, other: "Slots") -> "Slots":
        f = lambda a, b: [z3.If(c, x, y) for x, y in zip(a, b)]  # noqa: E731
        return Slots(f(self.used, other.used), f(self.seg, other.seg), f(self.off, other.off),
                     f(self.size, other.size), f(self.free, other.free), f(self.salive, other.salive),
                     f(self.ssize, other.ssize), z3.If(c, self.nslots, other.nslots), z3.If(c, self.nsegs, other.nsegs))

    def copy(self) -> "Slots":
        return Slots(list(self.used), list(self.seg), list(self.off), list(self.size), list(self.free),
                     list(self.salive), list(self.ssize), self.nslots, self.nsegs)

    def reserved(self) -> Any:
        return z3.Sum([z3.If(a, s, 0) for a, s in zip(self.salive, self.ssize)])

    def allocated(self) -> Any:
        return z3.Sum([z3.If(z3.And(u, z3.Not(f)), s, 0) for u, f, s in zip(self.used, self.free, self.size)])

    def put(self, idx: Any, **kw: Any) -> None:
        for j in range(len(self.used)):
            hit = idx == j
            for k, v in kw.items():
                arr = getattr(self, k)
                arr[j] = z3.If(hit, v, arr[j])


def initial(n: int, nseg: int) -> Slots:
    return Slots([z3.BoolVal(False)] * n, [z3.IntVal(0)] * n, [z3.IntVal(0)] * n, [z3.IntVal(0)] * n,
                 [z3.BoolVal(False)] * n, [z3.BoolVal(False)] * nseg, [z3.IntVal(0)] * nseg, z3.IntVal(0), z3.IntVal(0))


def _pick(flags: list[Any], vals: list[Any]) -> Any:
    out = vals[-1]
    for f, v in zip(reversed(flags[:-1]), reversed(vals[:-1])):
        out = z3.If(f, v, out)
    return out


def malloc(st: Slots, n: Any, seed: bool, capacity: int) -> tuple[Slots, Any, Any, Any]:
    """``(next state, ok, rounded, found-a-free-block)``."""
    N = len(st.used)
    k_round, k_segment, k_split = _kernels(seed)
    r = k_round(n)
    cand = [z3.And(st.used[j], st.free[j], st.size[j] >= r) for j in range(N)]

    def better(i: int, j: int) -> Any:  # block i is preferred to block j
        return z3.Or(st.size[i] < st.size[j],
                     z3.And(st.size[i] == st.size[j],
                            z3.Or(st.seg[i] < st.seg[j], z3.And(st.seg[i] == st.seg[j], st.off[i] < st.off[j]))))

    best = [z3.And(cand[j], *[z3.Implies(cand[i], better(j, i)) for i in range(N) if i != j]) for j in range(N)]
    found = z3.Or(*cand)
    b = _pick(best, list(range(N)))
    bsize, bseg, boff = _pick(best, st.size), _pick(best, st.seg), _pick(best, st.off)

    # (1) serve from the best free block, splitting a legal remainder
    s1 = st.copy()
    split = k_split(bsize - r, r)
    s1.put(b, size=z3.If(split, r, bsize), free=z3.BoolVal(False))
    s1.put(st.nslots, used=split, seg=bseg, off=boff + r, size=bsize - r, free=z3.BoolVal(True))
    s1.nslots = st.nslots + z3.If(split, 1, 0)

    # (2) a new segment, if it fits; pytorch first releases fully-free segments when it does not
    alloc = k_segment(r)
    fits = st.reserved() + alloc <= capacity
    rel = st.copy()
    if not seed:
        for s in range(len(st.salive)):
            whole = z3.Or(*[z3.And(st.used[j], st.free[j], st.seg[j] == s, st.off[j] == 0, st.size[j] == st.ssize[s])
                            for j in range(N)])
            whole = z3.And(st.salive[s], whole)
            rel.salive[s] = z3.And(st.salive[s], z3.Not(whole))
            for j in range(N):
                rel.used[j] = z3.And(rel.used[j], z3.Not(z3.And(whole, st.seg[j] == s)))
        fits2 = rel.reserved() + alloc <= capacity
        base = st.ite(fits, rel)
        can = z3.Or(fits, fits2)
    else:
        base, can = st, fits
    s2 = base.copy()
    split2 = k_split(alloc - r, r)
    seg_id = base.nsegs
    for s in range(len(st.salive)):
        s2.salive[s] = z3.If(seg_id == s, True, base.salive[s])
        s2.ssize[s] = z3.If(seg_id == s, alloc, base.ssize[s])
    s2.put(base.nslots, used=z3.BoolVal(True), seg=seg_id, off=z3.IntVal(0), size=z3.If(split2, r, alloc),
           free=z3.BoolVal(False))
    s2.put(base.nslots + 1, used=split2, seg=seg_id, off=r, size=alloc - r, free=z3.BoolVal(True))
    s2.nslots = base.nslots + z3.If(split2, 2, 1)
    s2.nsegs = base.nsegs + 1

    nxt = s1.ite(found, s2.ite(can, st))
    return nxt, z3.Or(found, can), r, found


def free(st: Slots, i: Any) -> Slots:
    """Free the live block in slot ``i``; coalesce with free neighbours of its segment."""
    N = len(st.used)
    seg, off, size = _pick([i == j for j in range(N)], st.seg), _pick([i == j for j in range(N)], st.off), \
        _pick([i == j for j in range(N)], st.size)
    prev = [z3.And(st.used[j], st.free[j], st.seg[j] == seg, st.off[j] + st.size[j] == off) for j in range(N)]
    nxt = [z3.And(st.used[j], st.free[j], st.seg[j] == seg, st.off[j] == off + size) for j in range(N)]
    has_p, has_n = z3.Or(*prev), z3.Or(*nxt)
    p, q = _pick(prev, list(range(N))), _pick(nxt, list(range(N)))
    psize, poff, qsize = _pick(prev, st.size), _pick(prev, st.off), _pick(nxt, st.size)
    total = size + z3.If(has_p, psize, 0) + z3.If(has_n, qsize, 0)
    out = st.copy()
    keep = z3.If(has_p, p, i)
    for j in range(N):
        gone = z3.Or(z3.And(j == i, has_p), z3.And(has_n, j == q))
        out.used[j] = z3.And(st.used[j], z3.Not(gone))
        out.size[j] = z3.If(keep == j, total, st.size[j])
        out.off[j] = z3.If(keep == j, z3.If(has_p, poff, off), st.off[j])
        out.free[j] = z3.If(keep == j, True, st.free[j])
    return out


@dataclass
class Synthesis:
    preset: str
    depth: int | None
    trace: list[str]
    request: int = 0
    rounded: int = 0
    free_total: int = 0
    reserved: int = 0
    allocated: int = 0
    seconds: float = 0.0
    replayed: str = ""


def synthesize(preset: str, capacity: int = 40 * MiB, max_depth: int = 8, unit: int = MiB) -> Synthesis:
    """The shortest op sequence (<= ``max_depth`` ops) after which a large
    request fails with ``capacity - allocated >= rounded request``.
    Request sizes are multiples of ``unit`` plus 0 or 1 byte (so the 512 B and
    2 MiB rounding both matter) to keep the printed trace readable."""
    seed = preset == "seed"
    t0 = time.perf_counter()
    N, S = 2 * max_depth + 2, max_depth + 1
    for k in range(0, max_depth + 1):
        sol = limit(z3.Solver(), 30000)
        st = initial(N, S)
        ops = []
        for t in range(k):
            is_alloc = z3.Bool(f"alloc{t}")
            units, extra, idx = z3.Int(f"units{t}"), z3.Int(f"extra{t}"), z3.Int(f"slot{t}")
            n = units * unit + extra
            sol.add(z3.Or(extra == 0, extra == 1), units >= 1, n > K_SMALL, n <= capacity)
            a_st, ok, _, _ = malloc(st, n, seed, capacity)
            live = [z3.And(st.used[j], z3.Not(st.free[j])) for j in range(N)]
            sol.add(z3.Implies(z3.Not(is_alloc), z3.And(idx >= 0, idx < N, _pick([idx == j for j in range(N)], live))))
            sol.add(z3.Implies(is_alloc, ok))  # every earlier malloc succeeds
            f_st = free(st, idx)
            st = a_st.ite(is_alloc, f_st)
            ops.append((is_alloc, units, extra, idx))
        fu, fe = z3.Int("final_units"), z3.Int("final_extra")
        fn = fu * unit + fe
        sol.add(z3.Or(fe == 0, fe == 1), fu >= 1, fn > K_SMALL, fn <= capacity)
        _, ok, r, _ = malloc(st, fn, seed, capacity)
        free_total = capacity - st.allocated()
        sol.add(z3.Not(ok), free_total >= r)
        res = sol.check()
        if res == z3.sat:
            m = sol.model()
            ev = lambda x: m.eval(x, model_completion=True).as_long()  # noqa: E731
            trace, slot_ref = [], {}
            cur = initial(N, S)
            nref = 0
            for t, (is_alloc, units, extra, idx) in enumerate(ops):
                if z3.is_true(m.eval(is_alloc, model_completion=True)):
                    size = ev(units) * unit + ev(extra)
                    trace.append(f"t{nref} = malloc({_fmt(size)})")
                    # which slot holds the new block: the one that turned live
                    nxt, _, _, _ = malloc(cur, z3.IntVal(size), seed, capacity)
                    before = {j for j in range(N) if z3.is_true(m.eval(z3.And(cur.used[j], z3.Not(cur.free[j])), model_completion=True))}
                    after = {j for j in range(N) if z3.is_true(m.eval(z3.And(nxt.used[j], z3.Not(nxt.free[j])), model_completion=True))}
                    new = sorted(after - before)
                    # a block can move slot only by a merge, which frees it; the new live slot is unique
                    if new:
                        slot_ref[new[0]] = f"t{nref}"
                    nref += 1
                    cur = nxt
                else:
                    j = ev(idx)
                    trace.append(f"free({slot_ref.get(j, f'slot {j}')})")
                    cur = free(cur, z3.IntVal(j))
            size = ev(fu) * unit + ev(fe)
            trace.append(f"malloc({_fmt(size)})  -> OutOfMemory")
            return Synthesis(preset, k, trace, size, ev(r), ev(free_total), ev(st.reserved()), ev(st.allocated()),
                             time.perf_counter() - t0)
        if res == z3.unknown:
            return Synthesis(preset, None, [f"unknown at depth {k}"], seconds=time.perf_counter() - t0)
    return Synthesis(preset, None, [f"no fragmentation OOM up to depth {max_depth}"], seconds=time.perf_counter() - t0)


def _fmt(n: int) -> str:
    mib, rest = divmod(n, MiB)
    return f"{mib} MiB" + (f" + {rest} B" if rest else "")


def _parse(s: str) -> int:
    parts = s.replace(" B", "").split(" MiB")
    n = int(parts[0]) * MiB
    tail = parts[1].strip() if len(parts) > 1 else ""
    if tail.startswith("+"):
        n += int(tail[1:].strip())
    return n


def replay(syn: Synthesis, capacity: int = 40 * MiB, expandable: bool = False) -> tuple[bool, str]:
    """Run the synthesized sequence through the executable caching spec's
    ``malloc``/``free`` actions (spec-only: the predicted block is the
    witness).  ``(the last malloc raised OutOfMemory and every earlier one
    succeeded, description)``."""
    from memspec.spec import caching as C
    from memspec.spec.core import Raises

    st = C.CachingState(C.Policy(preset=syn.preset, capacity=capacity, expandable=expandable))
    refs: dict[str, int] = {}
    for k, line in enumerate(syn.trace):
        last = k == len(syn.trace) - 1
        if line.startswith("free("):
            out = C.free.step(st, ref=refs[line[5:-1]])
            out.branches[0].then(None)
            continue
        name = line.split("=")[0].strip() if "=" in line.split("(")[0] else None
        call = line.split("=", 1)[1] if name else line
        size = _parse(call[call.index("(") + 1:call.index(")")])
        out = C.malloc.step(st, size=size, stream=0)
        first = out.branches[0]
        if isinstance(first, Raises):
            figures = f"reserved {_fmt(st.reserved())}, allocated {_fmt(st.figure((C.LIVE,)))}, " \
                      f"free (capacity - allocated) {_fmt(capacity - st.figure((C.LIVE,)))}, " \
                      f"largest free block {_fmt(st.largest_free())}"
            return last, f"step {k + 1} malloc({_fmt(size)}) -> OutOfMemory; {figures}"
        ref = first.then(first.witness())
        if name:
            refs[name] = ref
        if last:
            return False, f"the final malloc({_fmt(size)}) succeeded on the executable spec"
    return False, "no malloc in the trace"


# --------------------------------------------------------------------------
# Expandable segments: bounded exhaustive search over the executable spec
# --------------------------------------------------------------------------

@dataclass
class ExpandableCheck:
    preset: str
    depth: int
    sizes: tuple[int, ...]
    states: int
    byte_level: list[str] | None      # shortest trace failing with capacity - allocated >= request (or None)
    page_level: list[str] | None      # shortest trace failing with enough unpinned pages (or None)
    seconds: float


def _pinned_pages(st: Any) -> int:
    from memspec.spec import caching as C

    pages = set()
    for s in st.segments:
        for b in s.blocks:
            if b.state in (C.LIVE, C.PENDING) and s.expandable:
                first, last = b.offset // s.page, (b.offset + b.size - 1) // s.page
                pages.update((s.sid, p) for p in range(first, last + 1))
    return len(pages)


def _layout_key(st: Any) -> Any:
    return tuple((s.sid, s.small, tuple((b.offset, b.size, b.state, b.ref is not None) for b in s.blocks))
                 for s in st.segments)


def expandable_no_fragmentation_oom(preset: str = "pytorch", capacity: int = 40 * MiB, depth: int = 8,
                                    sizes: tuple[int, ...] = (2 * MiB, 19 * MiB, 21 * MiB),
                                    max_states: int = 200000) -> ExpandableCheck:
    """Breadth-first over every malloc (sizes from ``sizes``) / free sequence
    of length <= ``depth`` on the executable caching spec with expandable
    segments (states deduplicated by block layout).  Reports the shortest
    sequence ending in an OutOfMemory with ``capacity - allocated >= rounded
    request`` (byte level) and with enough whole unpinned pages for the
    request (page level: physical exhaustion did not cause it)."""
    import copy as _copy

    from memspec.spec import caching as C
    from memspec.spec.core import Raises

    t0 = time.perf_counter()
    init = C.CachingState(C.Policy(preset=preset, capacity=capacity, expandable=True))
    frontier = [(init, [], {})]
    seen = {_layout_key(init)}
    byte_cex = page_cex = None
    for _d in range(depth):
        nxt = []
        for st, trace, names in frontier:
            for size in sizes:
                s2 = _copy.deepcopy(st)
                out = C.malloc.step(s2, size=size, stream=0)
                first = out.branches[0]
                if isinstance(first, Raises):
                    r = s2.policy.rounded(size)
                    allocated = s2.figure((C.LIVE, C.PENDING))
                    line = trace + [f"malloc({_fmt(size)})  -> OutOfMemory"]
                    if byte_cex is None and capacity - allocated >= r:
                        byte_cex = line
                    page = s2.policy.page(C.choose_pool(r) == "small")
                    free_pages = capacity // page - _pinned_pages(s2)
                    if page_cex is None and free_pages * page >= -(-r // page) * page:
                        page_cex = line
                    continue
                ref = first.then(first.witness())
                key = _layout_key(s2)
                if key in seen:
                    continue
                seen.add(key)
                nm = f"t{len(names)}"
                nxt.append((s2, trace + [f"{nm} = malloc({_fmt(size)})"], {**names, ref: nm}))
            for ref in sorted(st.where):
                s2 = _copy.deepcopy(st)
                out = C.free.step(s2, ref=ref)
                out.branches[0].then(None)
                key = _layout_key(s2)
                if key in seen:
                    continue
                seen.add(key)
                nxt.append((s2, trace + [f"free({names.get(ref, ref)})"], names))
        frontier = nxt
        if page_cex is not None or len(seen) > max_states or not frontier:
            break
    return ExpandableCheck(preset, depth, sizes, len(seen), byte_cex, page_cex, time.perf_counter() - t0)


def kernel_agreement(samples: int = 1000, seed: int = 0) -> list[str]:
    """The heap's Z3 policy kernels at the synthesis's concrete policy state
    (:func:`_kernels`) against spec/caching.py's on random large-pool values
    (substitute + simplify); the mismatches.  (The heap's
    ``kernel_boundary_agreement`` checks the same kernels on a symbolic policy,
    at every threshold +-1; this one at the state the synthesis uses, off the
    thresholds.)"""
    import random

    from memspec.spec import caching as C

    rng = random.Random(seed)
    n, r, rem = z3.Ints("n r rem")
    bad = []
    for preset_seed in (False, True):
        k_round, k_segment, k_split = _kernels(preset_seed)
        er, es, ep = k_round(n), k_segment(r), k_split(rem, r)
        for _ in range(samples):
            size = rng.choice([rng.randint(K_SMALL + 1, 64 * MiB), rng.randint(1, 40) * MiB + rng.choice((-1, 0, 1))])
            size = max(size, K_SMALL + 1)
            rounded = C.round_size(size, preset_seed)
            remaining = rng.randint(0, 24 * MiB)
            got = (z3.simplify(z3.substitute(er, (n, z3.IntVal(size)))).as_long(),
                   z3.simplify(z3.substitute(es, (r, z3.IntVal(rounded)))).as_long(),
                   z3.is_true(z3.simplify(z3.substitute(ep, (rem, z3.IntVal(remaining)), (r, z3.IntVal(rounded))))))
            want = (rounded, C.segment_size(rounded, preset_seed), C.should_split(remaining, rounded, False, preset_seed))
            if got != want:
                bad.append(f"seed={preset_seed} size={size} remaining={remaining}: z3 {got} spec {want}")
    return bad


@dataclass
class CachingReport:
    synth: list[Synthesis]
    replays: list[tuple[bool, str]]
    expandable: list[ExpandableCheck]
    kernel_mismatches: list[str]
    seconds: float

    @property
    def ok(self) -> bool:
        return (all(s.depth is not None for s in self.synth) and all(ok for ok, _ in self.replays)
                and all(e.page_level is None for e in self.expandable) and not self.kernel_mismatches)


#: malloc sizes of the expandable search: a 2 MiB block (splits a 20 MiB page),
#: a 19 MiB one (straddles a page boundary after it), and a 21 MiB request
EXPANDABLE_SIZES = (2 * MiB, 19 * MiB, 21 * MiB)


def run_caching(depth: int = 8, samples: int = 1000, sizes: tuple[int, ...] = EXPANDABLE_SIZES) -> CachingReport:
    t0 = time.perf_counter()
    synth = [synthesize(p, max_depth=depth) for p in ("pytorch", "seed")]
    replays = [replay(s) if s.depth is not None else (False, "nothing to replay") for s in synth]
    exp = [expandable_no_fragmentation_oom(p, depth=depth, sizes=sizes) for p in ("pytorch", "seed")]
    km = kernel_agreement(samples)
    # C1-C9 are proved by induction over any well-formed heap (proofs_caching_heap), not by this bounded search
    return CachingReport(synth, replays, exp, km, time.perf_counter() - t0)
