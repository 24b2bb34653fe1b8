"""C8 -- expandable segments: OutOfMemory only at physical exhaustion.

Seed 003: *A freed block's pages unmap -- physical memory returns to the
driver immediately -- and a later large request maps fresh pages into a
fresh contiguous VA run.*  PyTorch's expandable segments: one VA arena per
pool and stream, physical pages (2 MiB small / 20 MiB large; the toy's 2 MiB)
mapped on demand, whole free pages unmapped at ``empty_cache`` and the OOM
retry (the toy: at free).

What is encoded (Z3, unbounded integers) is the *page-mapping step* of an
expandable ``malloc`` that found no fitting free block: the request (rounded
``r``) is served from a run of its arena -- an allocatable free block of
``f`` bytes (``f < r``, else best fit would have served it; 0 if none)
followed by ``u`` unmapped bytes starting on a page boundary, ``f + u >= r``
(a fresh arena is ``f = 0``, ``u`` its VA) -- by mapping the whole pages the
request still lacks, ``need = min(ceil((r - f) / page) * page, u)``; it
raises OutOfMemory iff ``mapped + need > capacity`` (``mapped`` after the
pytorch retry released the whole free pages).  The seed toy's free unmaps the
whole pages inside the coalesced free block.

* inductive: ``0 <= mapped <= capacity`` over both steps;
* C8 (a step property): an OutOfMemory leaves less free physical memory than
  the request's page-rounded size, ``capacity - mapped < ceil(r / page) * page``
  -- never a failure for want of contiguous VA;
* the unguarded variant (map the whole run, not only the pages the request
  lacks) is refuted: it raises OutOfMemory with the memory free;
* agreement with spec/caching on random walks of both presets with
  expandable segments: every expandable malloc (served from an existing run,
  from a fresh arena, OutOfMemory) and every toy free is the encoded step on
  the projection (mapped bytes, the run and the freed extent computed from
  the segments' blocks), and the encoded state predicate (mapped <=
  capacity; the toy: no free block holds a whole page) agrees with the
  executable C8 on every state.

Bounded (reported so): the choice of the arena and run (``_find_expandable``:
first arena by address, first unmapped block whose run reaches ``r``) and
runs of more than one free/unmapped pair are not encoded -- the run is the
one the spec used, read from its answer; ``memory_fraction`` is not encoded.
"""

from __future__ import annotations

import copy
import random
import time
from typing import Any

import z3

from memspec.invariants.proofs import limit

MiB = 1 << 20
PAGES = (2 * MiB, 20 * MiB)

cap, mapped, r, f, u, pg, rel = z3.Ints("x_cap x_mapped x_r x_f x_u x_pg x_rel")
lo, hi, base = z3.Ints("x_lo x_hi x_base")


def ceil_to(x: Any, unit: Any) -> Any:
    return ((x + unit - 1) / unit) * unit


def inv() -> Any:
    return z3.And(0 <= mapped, mapped <= cap)


def map_pre() -> Any:
    """A run the request fits: page size of the pool, f < r <= f + u, u page-aligned, the released bytes mapped."""
    return z3.And(z3.Or(*[pg == p for p in PAGES]), r > 0, 0 <= f, f < r, u >= r - f, u % pg == 0,
                  0 <= rel, rel <= mapped)


def need(whole_run: bool = False) -> Any:
    """The bytes mapped: the pages the request lacks (the unguarded variant: the whole run)."""
    return u if whole_run else z3.If(ceil_to(r - f, pg) < u, ceil_to(r - f, pg), u)


def map_step(whole_run: bool = False) -> tuple[Any, Any]:
    """(OutOfMemory?, mapped after) -- after releasing ``rel`` bytes of whole free pages (pytorch's retry)."""
    m = mapped - rel
    oom = m + need(whole_run) > cap
    return oom, z3.If(oom, m, m + need(whole_run))


def c8(oom: Any) -> Any:
    """OutOfMemory only at physical exhaustion: less free memory than the request's pages."""
    return z3.Implies(oom, cap - (mapped - rel) < ceil_to(r, pg))


def unmap_pre() -> Any:
    """The toy's free: the coalesced free block [lo, hi) of an arena at ``base``, all of it mapped."""
    return z3.And(z3.Or(*[pg == p for p in PAGES]), base >= 0, base % pg == 0, base <= lo, lo < hi,
                  hi - lo <= mapped)


def unmapped_bytes() -> Any:
    """The whole pages inside [lo, hi) (pages aligned to the arena's base)."""
    b = ceil_to(lo - base, pg)
    e = ((hi - base) / pg) * pg
    return z3.If(e > b, e - b, 0)


def _query(*claims: Any) -> str:
    sol = limit(z3.Solver(), 10000)
    sol.add(*claims)
    res = sol.check()
    return "proved" if res == z3.unsat else str(res)


def proofs() -> list[tuple[str, str, float]]:
    out = []
    for name, claim in (
        ("init: nothing mapped", lambda: _query(z3.And(mapped == 0, cap >= 0), z3.Not(inv()))),
        ("step:map: mapped <= capacity", lambda: _query(inv(), map_pre(), z3.Not(
            z3.And(0 <= map_step()[1], map_step()[1] <= cap)))),
        ("step:map:C8", lambda: _query(inv(), map_pre(), z3.Not(c8(map_step()[0])))),
        ("step:free_unmap: mapped <= capacity", lambda: _query(inv(), unmap_pre(), z3.Not(z3.And(
            0 <= mapped - unmapped_bytes(), mapped - unmapped_bytes() <= cap)))),
        ("step:free_unmap: only whole pages inside the free block", lambda: _query(
            unmap_pre(), z3.Not(z3.And(0 <= unmapped_bytes(), unmapped_bytes() <= hi - lo,
                                       unmapped_bytes() % pg == 0))))):
        t0 = time.process_time()
        out.append((name, claim(), time.process_time() - t0))
    return out


def refute() -> tuple[bool, str]:
    """The unguarded variant (map the whole run) breaks C8: a concrete state."""
    sol = limit(z3.Solver(), 10000)
    oom, _m = map_step(whole_run=True)
    sol.add(inv(), map_pre(), z3.Not(c8(oom)))
    if sol.check() != z3.sat:
        return False, "without 'map only the pages the request lacks': no violation of C8 found"
    m = sol.model()
    ev = lambda x: m.eval(x, model_completion=True)  # noqa: E731
    return True, (f"  capacity {ev(cap)}, mapped {ev(mapped)} (released {ev(rel)}), page {ev(pg)}\n"
                  f"  malloc (rounded {ev(r)}) from a run of {ev(f)} free + {ev(u)} unmapped bytes "
                  f"[without: map only the pages the request lacks]\n  => OutOfMemory with "
                  f"{ev(cap - (mapped - rel))} bytes free >= the request's pages {ev(ceil_to(r, pg))}: C8 violated")


UNGUARDED = {"C8": ("malloc:map", "lacking", "map only the pages the request lacks (not the whole run)")}


# --------------------------------------------------------------------------
# agreement with spec/caching (expandable walks)
# --------------------------------------------------------------------------

def _eval(term: Any, **vals: int) -> Any:
    subs = [(z3.Int(f"x_{k}"), z3.IntVal(v)) for k, v in vals.items()]
    v = z3.simplify(z3.substitute(term, *subs))
    if z3.is_int_value(v):
        return v.as_long()
    if z3.is_true(v) or z3.is_false(v):
        return z3.is_true(v)
    raise ValueError(f"did not simplify to a value: {v}")


def mapped_bytes(st: Any) -> int:
    """Mapped bytes, from the blocks: every block not unmapped (whole segments when not expandable)."""
    return sum(b.size for s in st.segments for b in s.blocks if b.state != "unmapped")


def _state_ok(st: Any) -> bool:
    """The encoded state predicate: mapped <= capacity; the toy: no free block holds a whole page."""
    ok = _eval(inv(), mapped=mapped_bytes(st), cap=st.policy.capacity)
    if st.policy.seed:
        for s in st.segments:
            if not s.expandable or s.base is None:
                continue
            for b in s.blocks:
                if b.state == "free" and _eval(unmapped_bytes(), lo=s.base + b.offset, hi=s.base + b.offset + b.size,
                                               base=s.base, pg=s.page):
                    ok = False
    return ok


def _run_of(before: Any, seg_after: Any, addr: int) -> tuple[int, int] | None:
    """(f, u) of the run at ``addr`` in the state before: the free block starting there (or none) and the
    unmapped block after it; a segment new in this step is a fresh arena (0, its VA)."""
    old = next((s for s in before.segments if s.sid == seg_after.sid), None)
    if old is None or old.base is None:
        return 0, seg_after.size
    for k, b in enumerate(old.blocks):
        if old.base + b.offset != addr:
            continue
        if b.state == "unmapped":
            return 0, b.size
        if b.state == "free" and k + 1 < len(old.blocks) and old.blocks[k + 1].state == "unmapped":
            return b.size, old.blocks[k + 1].size
    return None


def _free_extents(st: Any, also_done_pending: bool) -> list[tuple[int, int, int, int]]:
    """(lo, hi, base, page) of each coalesced free run of the arenas (pending blocks whose events all
    completed count as free when ``also_done_pending``), from the blocks."""
    done = {ref for ref in st.where} if also_done_pending else set()
    if also_done_pending:
        for (s_, v, ref) in st.events:
            if st.completed.get(s_, 0) < v:
                done.discard(ref)
    out = []
    for s in st.segments:
        if not s.expandable or s.base is None:
            continue
        cur = None
        for b in s.blocks + [None]:
            free = b is not None and (b.state == "free" or (b.state == "pending" and b.ref in done))
            if free:
                cur = (cur[0], b.offset + b.size) if cur else (b.offset, b.offset + b.size)
            elif cur:
                out.append((s.base + cur[0], s.base + cur[1], s.base, s.page))
                cur = None
    return out


def _releases(before: Any) -> list[tuple[str, int]]:
    """The bytes a malloc may have unmapped before mapping, by the encoding's ``unmapped_bytes``: none; the
    toy's frees of the pending blocks whose events completed; pytorch's retry (every whole free page)."""
    def pages(extents: list[tuple[int, int, int, int]]) -> int:
        return sum(_eval(unmapped_bytes(), lo=a, hi=b, base=c, pg=d) for a, b, c, d in extents)

    out = [("no release", 0)]
    if before.policy.seed:
        freed_now = [e for e in _free_extents(before, True) if e not in _free_extents(before, False)]
        out.append(("after the events' frees unmapped", pages(freed_now)))
    else:
        out.append(("after the retry's release", pages(_free_extents(before, True))))
    return out


def check_step(st: Any, name: str, args: dict[str, Any], rep: dict[str, Any]) -> None:
    from memspec.spec.caching import CACHING
    from memspec.spec.caching.policy import predict_malloc
    from memspec.spec.core import Raises

    rep["inv"][0] += 1
    spec_ok = next(i for i in CACHING.invariants if i.id == "C8").check(st) is None
    if spec_ok != _state_ok(st):
        rep["inv"][1] += 1
        rep["inv_examples"].append(f"C8 before {name}{args}: spec {spec_ok}, encoding {not spec_ok}")
    before = copy.deepcopy(st)
    act = next(a for a in CACHING.actions if a.name == name)
    res = act.step(st, **args)
    br = res.branches[0]
    where = f"{name}{args} on {st.policy.preset} (expandable)"
    if name == "malloc":
        p = predict_malloc(before, args["size"], args["stream"])
        if isinstance(br, Raises):
            if args["size"] >= (1 << 60):
                return
            st.__dict__.update(copy.deepcopy(p.state).__dict__)
            # OutOfMemory: C8 on the state after the retry's release; the run the spec could not map is the
            # cheapest the encoding allows (a fresh arena needs at most the request's pages)
            r_ = before.policy.rounded(args["size"])
            page = before.policy.page(r_ <= MiB)
            ok = _eval(c8(z3.BoolVal(True)), cap=st.policy.capacity, mapped=mapped_bytes(st), rel=0, r=r_, pg=page)
            rep["counts"]["caching:malloc"]["malloc:map/oom"] += 1
            if not ok:
                rep["mismatches"].append(f"{where}: OutOfMemory with {st.policy.capacity - mapped_bytes(st)} bytes "
                                         f"free >= the request's {page}-byte pages")
            return
        ref = br.then(br.witness())
        seg, i = st.block_of(ref)
        addr = seg.base + seg.blocks[i].offset
        fresh = not any(s.sid == seg.sid and s.base is not None for s in before.segments)
        if mapped_bytes(st) <= mapped_bytes(before) and not fresh:
            return  # served by best fit from mapped memory (or after a release): not this step
        run = _run_of(before, seg, addr)
        if run is None:
            rep["mismatches"].append(f"{where}: served at {addr:#x}, not at the start of a free+unmapped run")
            return
        oom, after = map_step()
        rep["counts"]["caching:malloc"]["malloc:map/fresh arena" if fresh else "malloc:map/existing run"] += 1
        tried = []
        for label, rel_ in _releases(before):
            vals = dict(cap=st.policy.capacity, mapped=mapped_bytes(before), rel=rel_,
                        r=before.policy.rounded(args["size"]), f=run[0], u=run[1], pg=seg.page)
            if not _eval(map_pre(), **vals):
                tried.append(f"{label}: outside the precondition")
                continue
            got = None if _eval(oom, **vals) else _eval(after, **vals)
            if got == mapped_bytes(st):
                if label != "no release":
                    rep["counts"]["caching:malloc"][f"malloc:map/{label}"] += 1
                return
            tried.append(f"{label} ({rel_} bytes released): {'OutOfMemory' if got is None else got}")
        rep["mismatches"].append(f"{where}: spec maps to {mapped_bytes(st)} bytes from run {run}; encoding: "
                                 + "; ".join(tried))
        return
    if isinstance(br, Raises):
        return
    if name == "free" and before.policy.seed:
        seg0, i0 = before.block_of(args["ref"])
        blocks = seg0.blocks
        if blocks[i0].uses:
            br.then(br.witness())
            return
        lo_, hi_ = seg0.base + blocks[i0].offset, seg0.base + blocks[i0].offset + blocks[i0].size
        if i0 > 0 and blocks[i0 - 1].state == "free":
            lo_ -= blocks[i0 - 1].size
        if i0 + 1 < len(blocks) and blocks[i0 + 1].state == "free":
            hi_ += blocks[i0 + 1].size
        br.then(br.witness())
        vals = dict(lo=lo_, hi=hi_, base=seg0.base, pg=seg0.page, mapped=mapped_bytes(before), cap=st.policy.capacity)
        want = mapped_bytes(before) - _eval(unmapped_bytes(), **vals)
        rep["counts"]["caching:free"]["free_unmap"] += 1
        if want != mapped_bytes(st):
            rep["mismatches"].append(f"{where}: encoding leaves {want} bytes mapped, spec {mapped_bytes(st)}")
        return
    br.then(br.witness())


def run_c8(seed: int = 0, walks: int = 3, steps: int = 50) -> dict[str, Any]:
    """The proofs, the refutation and the agreement walks; the C8 row's material."""
    from memspec.invariants.agreement import RandomChooser
    from memspec.invariants.proofs_caching_agree import MIX
    from memspec.spec import caching as C

    t0 = time.process_time()
    checks = proofs()
    rep: dict[str, Any] = {"counts": {"caching:malloc": {"malloc:map/existing run": 0, "malloc:map/fresh arena": 0,
                                                         "malloc:map/oom": 0,
                                                         "malloc:map/after the events' frees unmapped": 0,
                                                         "malloc:map/after the retry's release": 0},
                                      "caching:free": {"free_unmap": 0}},
                           "mismatches": [], "inv": [0, 0], "inv_examples": []}
    rng = random.Random(seed)
    for w in range(walks):
        for preset, capacity in (("seed", 44 << 20), ("pytorch", 64 << 20)):
            st = C.init(policy=preset, capacity=capacity, expandable=True, streams=2)
            ch = RandomChooser(random.Random(rng.random() + w))
            for _ in range(steps):
                name = rng.choice(MIX)
                act = next(a for a in C.CACHING.actions if a.name == name)
                if not act.available(st):
                    continue
                check_step(st, name, act.draw_args(st, ch), rep)
    agreement = _C8Agreement(rep)
    return {"checks": checks, "refuted": {"C8": refute()}, "unguarded": UNGUARDED,
            "actions": {"malloc:map": ["caching:malloc"], "free_unmap": ["caching:free"]},
            "bounded": {"C8": BOUNDED}, "agreement": agreement, "seconds": time.process_time() - t0}


BOUNDED = ("the page-mapping step of one run (an allocatable free block then unmapped pages) and the toy's "
           "unmap-at-free are encoded; the choice of arena and run (_find_expandable), runs of several "
           "free/unmapped pairs, best fit inside arenas, empty_cache's unmapping and memory_fraction are not")


class _C8Agreement:
    def __init__(self, rep: dict[str, Any]) -> None:
        self.counts = rep["counts"]
        self.mismatches = rep["mismatches"]
        self.inv = {"C8": rep["inv"]}
        self.inv_examples = rep["inv_examples"]
