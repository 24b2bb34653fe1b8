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

The encoding is the heap machine's (:mod:`memspec.invariants.formal.proofs_caching_heap`,
the one that proves C1-C9): the synthesis unrolls its own actions (preconditions and
steps) from its empty heap (:func:`~memspec.invariants.formal.proofs_caching_heap.init`),
the policy fixed to the preset: one stream, no ``max_split_size``, no memory fraction,
no garbage-collection threshold, no roundup_power2_divisions, no expandable segments;
every quantifier over block ids expanded below a bound the unrolling cannot pass (the
heap's ``bounded`` mode).  A user-level ``malloc`` is one ``malloc:*`` action and, when
that leaves the request pending (pytorch's ``malloc:retry``), one ``malloc_retry:*``
action; a ``free`` is one ``free:*`` action; only these user-level calls count towards
the depth.  The rounded size (an argument of the heap's malloc, there only constrained
by ``round_ok``) is fixed to the heap's exact kernel ``z_round`` at the preset's policy
(:func:`empty_heap`).  Request sizes are whole ``unit`` multiples plus 0 or 1 byte, above
1 MiB (the large pool; pools never mix, so the small pool is an independent copy of
the same argument).

The search is over the actions' names, depth first, every prefix checked (each
action whose precondition is false under the fixed policy is dropped before Z3 sees
it): one query per feasible sequence of actions.  A symbolic choice of the action at
each call (one query per depth) took pytorch's depth-1 query from 1 s to 80 s CPU or
past its resource limit depending on how the terms were built.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import z3

from memspec.invariants.formal.solving import Query  # bounded in CPU, in a context of its own
from memspec.invariants.formal.proofs import ARR, BARR, INT, OK, St, fresh
from memspec.invariants.formal import proofs_caching_heap as H

from memspec.spec.api import MiB

# the seed's size constant and policy kernels, stated once: the heap encoding's
from memspec.invariants.formal.proofs_caching_heap_terms import K_SMALL, z_round


#: the heap machine's actions a user-level call may take: a malloc's paths, then (the request left pending:
#: pytorch's retry) the retry's ends; a free's paths.  Under the fixed policy the garbage collection,
#: release_available, the expandable mapping and ``free:pending`` (no stream records a use) never hold.
MALLOC_ACTS = tuple(f"malloc:{p}" for p in H.MALLOC_PATHS)
RETRY_ACTS = tuple(f"malloc_retry:{p}" for p in H.RETRY_PATHS)
FREE_ACTS = ("free:merge", "free:pending")


def empty_heap(seed: bool, capacity: int) -> St:
    """The heap's empty allocator under a preset, concrete (no blocks, zero sums, no malloc in progress; every
    field zero or false but the preset and the capacity: so the policy the heap's kernels read is the preset
    with no max_split_size, no roundup_power2_divisions table, no expandable segments);
    :func:`~memspec.invariants.formal.proofs_caching_heap.init` holds of it."""
    zero = {ARR: z3.K(z3.IntSort(), z3.IntVal(0)), BARR: z3.K(z3.IntSort(), z3.BoolVal(False)), INT: z3.IntVal(0)}
    s = St({f: zero.get(k, z3.BoolVal(False)) for f, k in H.FIELDS.items()})
    return s.set(seed=z3.BoolVal(seed), cap=z3.IntVal(capacity))


def _simp(s: St) -> St:
    return St({f: z3.simplify(v) if z3.is_expr(v) else v for f, v in s.items()})


def _apply(s: St, name: str, tag: str, extra: tuple[Any, ...] = ()) -> tuple[Any, Any, St, St] | None:
    """The heap action ``name`` from ``s`` (fresh arguments): ``(precondition and extra, outcome, next
    state, arguments)``, or None where the precondition is false under the fixed policy."""
    act = _ACTS[name]
    a = fresh(act.params, tag)
    pre = z3.simplify(z3.And(act.pre(s, a), *[f(a) for f in extra]))
    if z3.is_false(pre):
        return None
    out, s2 = act.step(s, a)
    return pre, z3.simplify(z3.IntVal(out) if isinstance(out, int) else out), s2, a


_ACTS = {a.name: a for a in H.actions()}


def _mallocs(s: St, size: Any, tag: str, want: int) -> list[tuple[list[str], Any, St, Any, Any]]:
    """Every way the heap's malloc of ``size`` on stream 0 (rounded by ``z_round``) ends in ``want``:
    ``(actions, precondition, next state, the id of the block served, the rounded size)``."""
    r = z3.simplify(z_round(s, size))
    out = []
    for m in MALLOC_ACTS:
        got = _apply(s, m, f"{tag}:{m}", (lambda a: a.size == size, lambda a: a.t == 0, lambda a: a.r == r))
        if got is None:
            continue
        pre, res, s1, a = got
        served = a.b if m == "malloc:fit" else s.n
        if z3.is_true(z3.simplify(res == H.PENDING)):
            s1 = _simp(s1)
            for nm in RETRY_ACTS:
                got2 = _apply(s1, nm, f"{tag}:{nm}")
                if got2 is not None and z3.is_true(z3.simplify(got2[1] == want)):
                    out.append(([m, nm], z3.And(pre, got2[0]), got2[2], s1.n, r))
        elif z3.is_true(z3.simplify(res == want)):
            out.append(([m], pre, s1, served, r))
    return out


def _size(name: str, unit: int, capacity: int) -> tuple[Any, Any, Any]:
    """A request size ``units * unit + extra`` (extra 0 or 1 byte), in the large pool, within the device."""
    units, extra = z3.Int(f"units{name}"), z3.Int(f"extra{name}")
    n = units * unit + extra
    return n, z3.And(z3.Or(extra == 0, extra == 1), units >= 1, n > K_SMALL, n <= capacity), (units, extra)


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
    actions: list[str] = field(default_factory=list)   # the heap machine's actions taken, in order


def synthesize(preset: str, capacity: int = 40 * MiB, max_depth: int = 8, unit: int = MiB) -> Synthesis:
    """The shortest op sequence (<= ``max_depth`` user-level malloc/free calls) after
    which a large request fails with ``capacity - allocated >= rounded request``, on the
    heap machine's actions (see the module docstring; the figures are the heap's
    OutOfMemory figures).  Request sizes are multiples of ``unit`` plus 0 or 1 byte (so
    the 512 B and 2 MiB rounding both matter) to keep the printed trace readable."""
    seed = preset == "seed"
    t0 = time.perf_counter()
    for k in range(0, max_depth + 1):
        sol = Query(30000)
        s0 = empty_heap(seed, capacity)
        sol.add(z3.simplify(H.init(s0)))
        unknown = [False]

        def leaf(st: St, hist: list[Any]) -> Any:
            n, ok_n, uf = _size("_final", unit, capacity)
            for names, pre, s2, _ref, r in _mallocs(st, n, "final", H.OOM):
                sol.push()
                sol.add(ok_n, pre, capacity - s2.oa >= r)
                res = sol.check()
                if res == z3.sat:
                    return hist + [("oom", names, uf, None)], sol.model(), s2, n, r
                unknown[0] |= res == z3.unknown
                sol.pop()
            return None

        def calls(st: St, t: int, hist: list[Any]) -> Any:
            if t == k:
                return leaf(st, hist)
            n, ok_n, uf = _size(str(t), unit, capacity)
            opts = [("malloc", names, z3.And(ok_n, pre), s2, ref, uf)
                    for names, pre, s2, ref, _r in _mallocs(st, n, str(t), OK)]
            for nm in FREE_ACTS:
                got = _apply(st, nm, f"{t}:{nm}")
                if got is not None:
                    opts.append(("free", [nm], z3.And(got[0], got[1] == OK), got[2], got[3].b, None))
            for kind, names, pre, s2, ref, uf in opts:
                sol.push()
                sol.add(pre)
                if sol.check() != z3.unsat:   # (unknown: searched on; the leaf's answer decides)
                    found = calls(_simp(s2), t + 1, hist + [(kind, names, uf, ref)])
                    if found is not None:
                        return found
                sol.pop()
            return None

        H.MODE.kind, H.MODE.bound = "bounded", 2 * k + 2   # each malloc appends at most 2 block ids
        try:
            found = calls(s0, 0, [])
        finally:
            H.MODE.kind, H.MODE.bound = "forall", 0
        if found is not None:
            hist, m, s_oom, fn, r = found
            ev = lambda x: m.eval(x, model_completion=True).as_long()  # noqa: E731
            trace, acts, names, nref = [], [], {}, 0
            for kind, act_names, uf, ref in hist:
                acts += act_names
                if kind == "free":
                    b = ev(ref)
                    trace.append(f"free({names.get(b, f'block {b}')})")
                    continue
                size = ev(uf[0]) * unit + ev(uf[1])
                if kind == "oom":
                    trace.append(f"malloc({_fmt(size)})  -> OutOfMemory")
                    continue
                nm = f"t{nref}"
                nref += 1
                names[ev(ref)] = nm   # a block keeps its id until it dies (a merge keeps the freed one's)
                trace.append(f"{nm} = malloc({_fmt(size)})")
            return Synthesis(preset, k, trace, ev(fn), ev(r), ev(capacity - s_oom.oa), ev(s_oom.orr), ev(s_oom.oa),
                             time.perf_counter() - t0, actions=acts)
        if unknown[0]:
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


def spec_steps(syn: Synthesis, capacity: int = 40 * MiB,
               expandable: bool = False) -> Iterator[tuple[str, dict[str, int], Any, Any]]:
    """The synthesized trace on the executable caching spec's ``malloc``/``free`` actions (spec only: a
    malloc's predicted block is the witness; one that raises commits nothing), step by step: ``(action,
    arguments, the state after it, the malloc's first branch or None)``.  :func:`replay` and the
    conformance corpus (:mod:`memspec.invariants.corpus`) read a trace only through it."""
    from memspec.spec import caching as C
    from memspec.spec.core import Raises

    st = C.CachingState(C.Policy(preset=syn.preset, capacity=capacity, expandable=expandable))
    refs: dict[str, int] = {}
    for line in syn.trace:
        if line.startswith("free("):
            args = {"ref": refs[line[5:-1]]}
            C.free.step(st, **args).branches[0].then(None)
            yield "free", args, st, None
            continue
        name = line.split("=")[0].strip() if "=" in line.split("(")[0] else None
        call = line.split("=", 1)[1] if name else line
        args = {"size": _parse(call[call.index("(") + 1:call.index(")")]), "stream": 0}
        first = C.malloc.step(st, **args).branches[0]
        if not isinstance(first, Raises):
            ref = first.then(first.witness())
            if name:
                refs[name] = ref
        yield "malloc", args, st, first


def replay(syn: Synthesis, capacity: int = 40 * MiB, expandable: bool = False) -> tuple[bool, str]:
    """Run the synthesized sequence through the executable caching spec (:func:`spec_steps`).  ``(the last
    malloc raised OutOfMemory and every earlier one succeeded, description)``."""
    from memspec.spec import caching as C
    from memspec.spec.core import Raises

    for k, (action, args, st, first) in enumerate(spec_steps(syn, capacity, expandable)):
        last = k == len(syn.trace) - 1
        if action == "free":
            continue
        if isinstance(first, Raises):
            figures = f"reserved {_fmt(st.reserved())}, allocated {_fmt(st.figure((C.LIVE,)))}, " \
                      f"free (capacity - allocated) {_fmt(capacity - st.figure((C.LIVE,)))}, " \
                      f"largest free block {_fmt(st.largest_free())}"
            return last, f"step {k + 1} malloc({_fmt(args['size'])}) -> OutOfMemory; {figures}"
        if last:
            return False, f"the final malloc({_fmt(args['size'])}) succeeded on the executable spec"
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


def run_caching(depth: int = 8, sizes: tuple[int, ...] = EXPANDABLE_SIZES) -> CachingReport:
    """The synthesis and its replays (both presets), the expandable search, and the heap's policy kernels
    against spec/caching's (:func:`~memspec.invariants.formal.proofs_caching_heap.kernel_boundary_agreement`,
    the one kernel agreement: at every threshold of the policy and +-1, a symbolic policy)."""
    t0 = time.perf_counter()
    synth = [synthesize(p, max_depth=depth) for p in ("pytorch", "seed")]
    replays = [replay(s) if s.depth is not None else (False, "nothing to replay") for s in synth]
    exp = [expandable_no_fragmentation_oom(p, depth=depth, sizes=sizes) for p in ("pytorch", "seed")]
    km = H.kernel_boundary_agreement()
    # C1-C9 are proved by induction over any well-formed heap (proofs_caching_heap), not by this bounded search
    return CachingReport(synth, replays, exp, km, time.perf_counter() - t0)
