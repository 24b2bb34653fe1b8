"""Transition and invariant agreement of the caching heap encoding
(:mod:`memspec.invariants.formal.proofs_caching_heap`) with the executable caching
spec (``spec/caching``).

Seed 003: *the spec is a refinement oracle: the policy is deterministic, so
malloc predicts the exact block (address and size) or the exact OOM figures.*
The Z3 encoding is proved inductive over an arbitrary well-formed heap; this
module checks that it is the *same machine* as the executable spec:

* **states**: reachable spec states come from random walks of ``CACHING``
  (both presets, one to three streams, record_stream, sizes from the spec's
  own draw domain :data:`~memspec.spec.caching.actions.SIZES`, whose boundary
  draws hit every threshold exactly and at +-1) and from a directed sweep of
  every boundary size of :func:`~memspec.spec.caching.actions.size_boundaries`
  (and 1 EB -1/0/+1) from an empty allocator and from one whose segments are
  all free.  Each is *projected* onto the encoding's fields by
  :func:`project`, computed from segments and blocks directly (addresses,
  sizes, kinds, events, the tiling neighbours, the prefix sums, reserved
  bytes): no spec aggregate or policy function is reused.
* **transition agreement**: for every spec step the encoded actions it stands
  for run on the projection (a malloc is the encoded ``process_event`` steps
  for the events that completed, then the one malloc path whose precondition
  holds -- the rounded size by the encoding's own kernel ``z_round`` with the
  policy's divisions table, the best-fit argument the smallest fitting block
  by the driver (the precondition admits only the best one; the spec's choice
  shows in the state compared after the step) --, then the phases: the
  garbage collection's ``gc:release`` steps with the spec's victims as
  arguments (the encoding admits any whole large-pool segment: the spec's
  must be among them) and ``gc_end``; release_available's ``avail:`` steps and
  ``avail_end``; for pytorch's retry the events and ``malloc_retry``); the
  alive blocks (by address: size, kind, requested, pool, stream, segment,
  recorded uses and event values, neighbours), the counters, reserved bytes,
  the phase flags, the ghost sums' totals, the answer (bytes released, the
  OOM figures) must equal the projection of the spec's state after the step.
  Branch counts are per spec action and encoded action, with the split
  decision (``/split``, ``/whole``), the remainder exactly on the split
  threshold, a request the divisions round off the 512 B ladder and a segment
  only the memory_fraction cap refuses as branches of their own: a branch
  with 0 samples fails ``prove``.  Policies: both presets, with and without
  max_split_size, memory_fraction, garbage_collection_threshold and
  roundup_power2_divisions (``WALKS``, ``KNOB_SCRIPTS`` in
  :mod:`~memspec.invariants.formal.proofs_caching_agree_runs`).
* **invariant agreement**: each C invariant's encoding (``NAMED``) evaluated
  on the projection must equal the executable invariant's verdict on the state.

Evaluation: each encoded action is built once per heap size ``n`` (Python
int: every quantifier over block ids is the conjunction over them) on
symbolic fields.  Its terms are evaluated on each sample by
:mod:`~memspec.invariants.formal.z3native` (the term DAG as straight-line Python);
the first evaluation of each compiled action and every
``CROSS_CHECK_EVERY``-th after it are also evaluated by Z3 itself (the
outputs packed into one term, the concrete projection substituted, simplified:
no solver call) and must give the same values, or the run stops with the
evaluator's defect.  A term outside that module's fragment is evaluated by
Z3 alone.

Expandable segments (the flag on, :data:`EXPANDABLE_SCRIPTS` and
:data:`EXPANDABLE_WALKS`): the projection keeps the unmapped blocks (reserved
is the mapped bytes, counted from the blocks); the driver re-states the run
choice (first arena by address, first unmapped block whose run holds the
request) and PyTorch's expandable best fit from the projected blocks, then the
mapping's steps (``expand:map``/``fresh``/``serve``/``oom``/``retry``), the
toy's ``unmap:free`` after a free and ``unmap:cache`` at empty_cache and the
retry run until the spec's step is matched, with their own branch counts
(:data:`EXPANDABLE_BRANCHES`).  These are C8's agreement too: C8 is a step
property of this machine's mapping failures (and of the memory_fraction
OutOfMemory with arenas), not a machine of its own.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any, Iterator

import z3

from memspec.invariants.formal import proofs_caching_heap as H
from memspec.invariants.formal import z3native as native
from memspec.invariants.formal.proofs import (
    ARR, BARR, BOOL, INT, OUTCOMES, St, _sort, at, concrete, prefix_values,
)

_KIND = {"free": H.FREE, "live": H.LIVE, "pending": H.PEND, "unmapped": H.UNM}
#: block fields compared by address (the ghost neighbours ``pv``/``nx`` are compared as addresses)
BLOCK_FIELDS = ("sz", "k", "rq", "sm", "sr", "sb", "ss", *[f"u{t}" for t in range(H.STREAMS)],
                *[f"e{t}" for t in range(H.STREAMS)])
SCALARS = ("Rs", "Rl", *[f"i{t}" for t in range(H.STREAMS)], *[f"c{t}" for t in range(H.STREAMS)], "md", "gp", "ra",
           "xp")
#: the invariants with an encoding evaluated on heap states (every C row: one machine, :data:`~.NAMED`)
HEAP_INVARIANTS = tuple(H.NAMED)


# --------------------------------------------------------------------------
# projection: spec state -> the encoding's fields (from segments and blocks)
# --------------------------------------------------------------------------

def project(st: Any) -> tuple[dict[str, Any], dict[int, int]]:
    """Spec state -> concrete encoding fields (``n`` an int, arrays as
    ``(default, {id: value})``); and spec ref -> block id."""
    rows: list[tuple[Any, Any]] = []
    for seg in st.segments:
        if seg.base is not None:
            rows += [(seg, b) for b in seg.blocks]
    # dead ids (al false) pad the heap to a multiple of PAD (the encoding allows them: a block merged away
    # or released is dead), so one compiled action serves every heap of up to that many blocks
    n = -(-len(rows) // PAD) * PAD
    arr: dict[str, dict[int, Any]] = {f: {} for f, k in H.FIELDS.items() if k in (ARR, BARR)}
    refs: dict[int, int] = {}
    for i, (seg, b) in enumerate(rows):
        if b.state not in _KIND:
            raise ValueError(f"block state {b.state!r} has no heap encoding")
        if b.ref is not None:
            refs[b.ref] = i
        ev = {s: v for (s, v, ref) in st.events if ref == b.ref} if b.state == "pending" else {}
        first, last = seg.blocks[0] is b, seg.blocks[-1] is b
        vals = {"al": True, "ad": seg.base + b.offset, "sz": b.size, "k": _KIND[b.state],
                "rq": b.requested if b.state in ("live", "pending") else 0, "sm": seg.small, "sr": b.stream,
                "sb": seg.base, "ss": seg.size, "pv": -1 if first else i - 1, "nx": -1 if last else i + 1}
        for t in range(H.STREAMS):
            vals[f"u{t}"] = (t in b.uses) if b.state == "live" else (t in ev)
            vals[f"e{t}"] = ev.get(t, 0)
        for f, v in vals.items():
            arr[f][i] = v
    pol = st.policy
    allowed = None if pol.memory_fraction is None else int(pol.memory_fraction * pol.capacity)
    gce = pol.gc_threshold > 0 and allowed is not None
    out: dict[str, Any] = {"n": n, "seed": pol.seed, "ms": pol.max_split_size, "cap": pol.capacity,
                           "hf": allowed is not None, "lim": allowed or 0, "gce": gce,
                           "gth": int(pol.gc_threshold * allowed) if gce else 0,
                           "md": False, "gp": False, "ra": False, "mn": 0, "mt": 0, "mr": 0, "wa": 0, "rsum": 0,
                           "ret": 0, "oq": 0, "orr": 0, "oa": 0, "olf": 0,
                           # expandable segments: an arena's VA is the capacity times the preset's factor, in
                           # whole pages of its pool (2 MiB; pytorch's large pool 20 MiB)
                           "ex": pol.expandable, "vs": _va(pol, True), "vl": _va(pol, False),
                           "xp": False, "xh": -1, "xq": -1, "x2": False}
    for t in range(H.STREAMS):
        out[f"i{t}"], out[f"c{t}"] = st.issued.get(t, 0), st.completed.get(t, 0)
    # reserved: the bytes of every block not unmapped (a plain segment: its size), segments without a base
    # (an arena whose first mapping failed) included
    out["Rs"] = sum(b.size for s in st.segments if s.small for b in s.blocks if b.state != "unmapped")
    out["Rl"] = sum(b.size for s in st.segments if not s.small for b in s.blocks if b.state != "unmapped")
    arr["dv"] = dict(enumerate(pol.divisions))
    for f, k in H.FIELDS.items():
        if k in (ARR, BARR) and f not in H.SUMS:
            out[f] = (False if k == BARR else 0, arr[f])
    _sums(out)
    return out, refs


#: heaps are padded with dead ids to a multiple of this
PAD = 4


def _va(pol: Any, small: bool) -> int:
    page = H.K_ROUND_LARGE if pol.seed or small else H.K_LARGE_BUFFER
    return -(-int(pol.capacity * pol.arena) // page) * page


def _contribution(nm: str, v: dict[str, Any]) -> int:
    small, kind = H.SUMS[nm]
    if not v["al"] or v["sm"] != small:
        return 0
    whole = v["sz"] == v["ss"] and not v["ex"]
    active = v["k"] in (H.LIVE, H.PEND)
    return {"N": v["sz"] if v["k"] == H.FREE and not whole else 0,
            "W": v["sz"] if v["k"] == H.FREE and whole else 0,
            "A": v["sz"] if active else 0, "L": v["sz"] if v["k"] == H.LIVE else 0,
            "Q": v["sz"] - v["rq"] if active else 0}[kind]


def _sums(vals: dict[str, Any]) -> None:
    """The ghost prefix sums of a heap in the projection's form, from its blocks."""
    rows = [{**{f: _g(vals, f, i) for f in ("al", "sz", "ss", "k", "rq", "sm")}, "ex": vals["ex"]}
            for i in range(vals["n"])]
    for nm in H.SUMS:
        vals[nm] = prefix_values([_contribution(nm, v) for v in rows])


# --------------------------------------------------------------------------
# Z3 evaluation of an encoded action on a concrete heap
# --------------------------------------------------------------------------

#: the block arrays an action writes (the policy's divisions table ``dv`` is read only: carried over)
_ARRAY_FIELDS = [f for f, k in H.FIELDS.items() if k in (ARR, BARR) and f not in H.SUMS and f != "dv"]
_SCALAR_FIELDS = [f for f, k in H.FIELDS.items() if k in (INT, BOOL) and f != "n"]


def _as_int(e: Any) -> Any:
    return z3.If(e, z3.IntVal(1), z3.IntVal(0)) if z3.is_bool(e) else e


@contextlib.contextmanager
def _eval_memo() -> Iterator[None]:
    """Build with the heap encoding's term memo on (:func:`proofs_caching_heap._reads`): these terms are
    only evaluated on concrete heaps, never handed to a solver."""
    was, H.MODE.eval_memo = H.MODE.eval_memo, True
    try:
        yield
    finally:
        H.MODE.eval_memo = was


def _symbolic(n: int) -> St:
    """A heap of ``n`` blocks on symbolic fields (``n`` a Python int: every quantifier over block ids is the
    conjunction over them)."""
    return St({f: (n if f == "n" else z3.Const(f"{f}@ag", _sort(H.FIELDS[f]))) for f in H.FIELDS})


class Terms:
    """Terms on the fields of :func:`_symbolic` and the arguments ``a``, evaluated on a concrete heap (the
    projection's form) as integers (a Boolean: 0 or 1): by :mod:`z3native`; the first evaluation and every
    ``CROSS_CHECK_EVERY``-th also by Z3 (the terms packed into one, the concrete values substituted,
    simplified: no solver call), which must give the same values; by Z3 alone for a term outside that
    module's fragment."""

    def __init__(self, s: St, a: St, terms: list[Any], what: str) -> None:
        self.s, self.a, self.what, self.size = s, a, what, len(terms)
        self._fields = [f for f in H.FIELDS if f != "n"]
        self._names = [(f, f"{f}@ag") for f in self._fields]
        self._packed = native.pack(terms)
        self._prog = native.build(terms)

    def __call__(self, vals: dict[str, Any], args: dict[str, int] | None = None) -> list[int]:
        args = args or {}
        env = lambda: {**{nm: vals[f] for f, nm in self._names},  # noqa: E731
                       **{f"{p}@agarg": args.get(p, 0) for p in self.a}}
        return native.checked(self._prog, env, lambda v: [int(x) for x in v], lambda: self._by_z3(vals, args),
                              self.what)

    def _by_z3(self, vals: dict[str, Any], args: dict[str, int]) -> list[int]:
        subs = [(self.s[f], concrete(H.FIELDS[f], vals[f])) for f in self._fields]
        v = z3.simplify(z3.substitute(self._packed, *subs, *[(x, z3.IntVal(args.get(p, 0))) for p, x in self.a.items()]))
        got = native.unpack(v, self.size, self.what)
        left = [x for x in got if not isinstance(x, int)]
        if left:
            raise ValueError(f"{self.what}: a term did not simplify to a value: {str(left[0])[:200]}")
        return got


class Compiled:
    """One encoded action on heaps of ``n`` blocks: its precondition and its
    outputs (outcome, every field at ids ``0..n+1``, scalars, the sums'
    totals) built once on symbolic fields (:class:`Terms`)."""

    def __init__(self, act: H.Act, n: int) -> None:
        self.act, self.n = act, n
        self.s = _symbolic(n)
        self.a = St({p: z3.Int(f"{p}@agarg") for p in act.params})
        with _eval_memo():
            pre = act.pre(self.s, self.a)
        self.pre = Terms(self.s, self.a, [z3.simplify(pre if z3.is_expr(pre) else z3.BoolVal(bool(pre)))],
                         f"{act.name}'s precondition")
        self.outputs: Terms | None = None

    def _build(self) -> None:
        act, n = self.act, self.n
        with _eval_memo():
            out, s2 = act.step(self.s, self.a)
        n2 = s2["n"]
        keys: list[tuple[str, int | None]] = [("outcome", None), ("n", None)]
        terms: list[Any] = [z3.IntVal(out) if isinstance(out, int) else out, z3.IntVal(n2) if isinstance(n2, int) else n2]
        for f in _ARRAY_FIELDS:
            for i in range(n + 2):
                keys.append((f, i))
                terms.append(_as_int(at(s2[f], i)))
        for f in _SCALAR_FIELDS:
            v = s2[f]
            keys.append((f, None))
            terms.append(_as_int(v if z3.is_expr(v) else (z3.BoolVal(v) if isinstance(v, bool) else z3.IntVal(v))))
        for nm in H.SUMS:
            keys.append((f"total:{nm}", None))
            terms.append(at(s2[nm], terms[1]))
        self.keys, self.outputs = keys, Terms(self.s, self.a, terms, f"{act.name}'s outputs")

    def applies(self, vals: dict[str, Any], args: dict[str, int]) -> bool:
        return bool(self.pre(vals, args)[0])

    def run(self, vals: dict[str, Any], args: dict[str, int]) -> tuple[str, dict[str, Any]]:
        """The outcome and the post-state (concrete, in the projection's form)."""
        if self.outputs is None:
            self._build()
        got = self.outputs(vals, args)
        out: dict[str, Any] = {"n": got[1]}
        arrays: dict[str, dict[int, Any]] = {f: {} for f in _ARRAY_FIELDS}
        totals = {}
        for idx, (f, i) in enumerate(self.keys):
            val = got[idx]
            if f in ("outcome", "n"):
                continue
            if f.startswith("total:"):
                totals[f[6:]] = val
            elif i is None:
                out[f] = bool(val) if H.FIELDS[f] == BOOL else val
            else:
                arrays[f][i] = bool(val) if H.FIELDS[f] == BARR else val
        for f in _ARRAY_FIELDS:
            out[f] = (False if H.FIELDS[f] == BARR else 0, arrays[f])
        out["dv"] = vals["dv"]
        _sums(out)   # the ghost sums of the post-state, as the next step's hypothesis needs them: from its blocks
        out["_totals"] = totals
        return OUTCOMES[got[0]], out


_COMPILED: dict[tuple[str, int, frozenset], Compiled] = {}


def compiled(act: H.Act, n: int, guards: frozenset = frozenset()) -> Compiled:
    key = (act.name, n, guards)
    c = _COMPILED.get(key)
    if c is None:
        c = _COMPILED[key] = Compiled(act, n)
    return c


_INV_TERMS: dict[int, Terms] = {}


def encoded_invariants(vals: dict[str, Any]) -> dict[str, bool]:
    """Each C invariant's encoding (:data:`proofs_caching_heap.NAMED`) on a concrete heap (:class:`Terms`)."""
    n = vals["n"]
    if n not in _INV_TERMS:
        s = _symbolic(n)
        _INV_TERMS[n] = Terms(s, St(), [z3.simplify(H.NAMED[c](s)) for c in HEAP_INVARIANTS], "the encoded invariants")
    return dict(zip(HEAP_INVARIANTS, (bool(x) for x in _INV_TERMS[n](vals))))


# --------------------------------------------------------------------------
# comparing states
# --------------------------------------------------------------------------

def _g(vals: dict[str, Any], f: str, i: int) -> Any:
    d, items = vals[f]
    return items.get(i, d)


def blocks_by_address(vals: dict[str, Any]) -> dict[int, tuple]:
    """The alive blocks by address: every compared field, and the neighbours as addresses."""
    out = {}
    for i in range(vals["n"]):
        if not _g(vals, "al", i):
            continue
        nb = tuple(-1 if _g(vals, f, i) == -1 else _g(vals, "ad", _g(vals, f, i)) for f in ("pv", "nx"))
        out[_g(vals, "ad", i)] = tuple(int(_g(vals, f, i)) for f in BLOCK_FIELDS) + nb
    return out


def totals(vals: dict[str, Any]) -> dict[str, int]:
    if "_totals" in vals:
        return vals["_totals"]
    return {nm: vals[nm][1][vals["n"]] for nm in H.SUMS}


def diff(enc: dict[str, Any], spec: dict[str, Any]) -> str | None:
    be, bs = blocks_by_address(enc), blocks_by_address(spec)
    if be != bs:
        k = next(k for k in sorted(set(be) | set(bs)) if be.get(k) != bs.get(k))
        names = (*BLOCK_FIELDS, "prev", "next")
        return f"block at {k:#x}: encoding {dict(zip(names, be.get(k, ())))}, spec {dict(zip(names, bs.get(k, ())))}"
    for f in SCALARS:
        if enc[f] != spec[f]:
            return f"{f}: encoding {enc[f]}, spec {spec[f]}"
    te, ts = totals(enc), totals(spec)
    if te != ts:
        k = next(k for k in H.SUMS if te[k] != ts[k])
        return f"sum {k}: encoding {te[k]}, spec {ts[k]}"
    return None


# --------------------------------------------------------------------------
# one spec step against the encoding
# --------------------------------------------------------------------------

def _acts(guards: frozenset = frozenset()) -> dict[str, H.Act]:
    return {a.name: a for a in H.actions(guards)}


def branch_table() -> dict[str, dict[str, int]]:
    """Every (spec action, encoded branch) pair, from the encoding's action table, at 0."""
    out: dict[str, dict[str, int]] = {}
    for a in H.actions():
        for sp in a.spec:
            out.setdefault(sp, {})[a.name] = 0
    m = out["caching:malloc"]
    for path in ("malloc:fit", "malloc:new"):
        for sub in ("split", "whole", "remainder on the split threshold"):
            m[f"{path}/{sub}"] = 0
    m["malloc_retry:new/split"] = 0
    for name in KNOB_BRANCHES + EXPANDABLE_BRANCHES:
        m[name] = 0
    return out


#: expandable segments' own branches of malloc: the head serves split or whole (and with the remainder on the
#: split threshold); the mapping takes part of an unmapped block or the whole of it; best fit walks past the
#: smallest candidate to a smaller expandable size
EXPANDABLE_BRANCHES = ("expand:serve/split", "expand:serve/whole", "expand:serve/remainder on the split threshold",
                       "expand:map/part of the block", "expand:map/the whole block",
                       "malloc:fit/past the smallest (expandable size)")


#: the policy knobs' own branches of malloc: a request the divisions round off the 512 B ladder; a new
#: segment the device would hold but the memory_fraction cap refuses
KNOB_BRANCHES = ("malloc/rounded by roundup_power2_divisions", "malloc/refused by the memory_fraction cap only")


@dataclass
class Agreement:
    counts: dict[str, dict[str, int]] = field(default_factory=branch_table)
    mismatches: list[str] = field(default_factory=list)
    inv: dict[str, list[int]] = field(default_factory=lambda: {c: [0, 0] for c in HEAP_INVARIANTS})
    inv_examples: list[str] = field(default_factory=list)
    samples: int = 0
    seconds: float = 0.0
    #: each distinct state evaluated, with the invariants it was evaluated on and whether they disagreed
    #: (so that the parts of :func:`agreement_parts` merge into exactly the serial run's counts)
    seen: dict = field(default_factory=dict)

    def count(self, spec_action: str, branch: str) -> None:
        d = self.counts.setdefault(spec_action, {})
        d[branch] = d.get(branch, 0) + 1

    def bad(self, why: str) -> None:
        self.mismatches.append(why)


@dataclass
class _Steps:
    """The encoded actions (``guards`` removed) that one spec step stands for, each counted under
    ``spec_action`` in ``rep``."""
    acts: dict[str, H.Act]
    rep: Agreement
    spec_action: str
    guards: frozenset

    def one(self, cands: list[tuple[str, dict[str, int]]], vals: dict[str, Any],
            label: str) -> tuple[str, str, dict[str, Any]]:
        """The one step of ``cands`` (``(encoded action, arguments)``) whose precondition holds (exactly one
        must), run and counted: ``(its name, outcome, post-state)``."""
        hold = [(nm, a) for nm, a in cands if compiled(self.acts[nm], vals["n"], self.guards).applies(vals, a)]
        if len(hold) != 1:
            raise _NoPath(f"{label}: encoded steps whose precondition holds: {[nm for nm, _a in hold] or 'none'}")
        nm, a = hold[0]
        o, v2 = compiled(self.acts[nm], vals["n"], self.guards).run(vals, a)
        self.rep.count(self.spec_action, nm)
        return nm, o, v2

    def paths(self, names: Any, vals: dict[str, Any], args: dict[str, int], label: str) -> tuple[str, str, dict[str, Any]]:
        return self.one([(nm, args) for nm in names], vals, label)

    def served(self, path: str, split: bool, rem: int, thresholds: tuple[int, ...]) -> None:
        """A request served by ``path`` (a best fit, a new segment, the mapping's head): split or whole, and
        the remainder exactly on the split threshold, as branches of their own."""
        self.rep.count(self.spec_action, f"{path}/{'split' if split else 'whole'}")
        if rem in thresholds:
            self.rep.count(self.spec_action, f"{path}/remainder on the split threshold")

    def drain(self, vals: dict[str, Any]) -> dict[str, Any]:
        """Process every completed event of every pending block (encoded ``process_event``)."""
        while True:
            due = [(i, t) for i in range(vals["n"]) if _g(vals, "al", i) and _g(vals, "k", i) == H.PEND
                   for t in range(H.STREAMS) if _g(vals, f"u{t}", i) and vals[f"c{t}"] >= _g(vals, f"e{t}", i)]
            if not due:
                return vals
            i, t = due[0]
            nm, _o, vals = self.paths(["process_event:wait", "process_event:free"], vals, {"b": i, "t": t},
                                      f"process_event(block {i}, stream {t})")
            if nm == "process_event:free":
                vals = self.toy_unmap(vals, i)

    def _unmappable(self, name: str, vals: dict[str, Any], ids: Any) -> list[int]:
        """The blocks of ``ids`` that ``unmap:free`` / ``unmap:cache`` applies to (its precondition: with
        expandable segments, a free block holding a whole page of its arena), by address."""
        c = compiled(self.acts[name], vals["n"], self.guards)
        return sorted((i for i in ids if _g(vals, "al", i) and c.applies(vals, {"b": i})), key=lambda i: _g(vals, "ad", i))

    def toy_unmap(self, vals: dict[str, Any], b: int) -> dict[str, Any]:
        """The toy's free with expandable segments: the whole pages inside the freed (merged) block unmap."""
        if not self._unmappable("unmap:free", vals, [b]):
            return vals
        return self.paths(["unmap:free"], vals, {"b": b}, f"unmap:free(block {b})")[2]

    def unmap_all(self, vals: dict[str, Any]) -> dict[str, Any]:
        """empty_cache / pytorch's retry with expandable segments: the whole free pages of every arena unmap,
        the lowest address first."""
        for _ in range(4 * vals["n"] + 4):
            todo = self._unmappable("unmap:cache", vals, range(vals["n"])) if vals["ex"] else []   # (pre: ex)
            if not todo:
                return vals
            vals = self.paths(["unmap:cache"], vals, {"b": todo[0]}, f"unmap:cache(block {todo[0]})")[2]
        raise _NoPath("unmap:cache does not terminate")

    def expand(self, enc: dict[str, Any], base: int, r: int) -> tuple[str, str, dict[str, Any]]:
        """The expandable mapping's steps until it serves the request or fails (the one whose precondition
        holds: map the run's next unmapped block, a fresh arena, serve from the head, OutOfMemory or the retry)."""
        for _ in range(2 * enc["n"] + 4):
            xh, xq = enc["xh"], enc["xq"]
            target = xq if xh == -1 else _g(enc, "nx", xh)
            lf, lw = _largest(enc)
            nm, o, enc2 = self.one([("expand:serve", {"b": xh}), ("expand:map", {"b": target}),
                                    ("expand:fresh", {"base": base}), ("expand:oom", {"b": target, "lf": lf, "lw": lw}),
                                    ("expand:retry", {"b": target})], enc, "expandable mapping")
            if nm == "expand:map":
                self.rep.count(self.spec_action,
                               f"expand:map/{'part of the block' if enc2['n'] > enc['n'] else 'the whole block'}")
            if nm == "expand:serve":
                self.served(nm, enc2["n"] > enc["n"], _g(enc, "sz", xh) - r,
                            _split_threshold(bool(enc["seed"]), r <= H.K_SMALL, True))
            enc = enc2
            if nm not in ("expand:map", "expand:fresh"):
                return nm, o, enc
        raise _NoPath("the expandable mapping does not terminate")


class _NoPath(Exception):
    pass


# --------------------------------------------------------------------------
# expandable segments: the driver's choices (re-stated from the seed's rules on the projected blocks, never
# the spec's functions) and the encoded steps they drive
# --------------------------------------------------------------------------

def _cands(vals: dict[str, Any], r: int, stream: int, small: bool | None = None) -> list[int]:
    """Free blocks of the pool (``small``; None: the pool of ``r``) and stream holding ``r`` bytes, by (size,
    address): best fit's candidates, release_available's blocks."""
    small = r <= H.K_SMALL if small is None else small
    fits = [i for i in range(vals["n"]) if _g(vals, "al", i) and _g(vals, "k", i) == H.FREE
            and bool(_g(vals, "sm", i)) == small and _g(vals, "sr", i) == stream and _g(vals, "sz", i) >= r]
    return sorted(fits, key=lambda i: (_g(vals, "sz", i), _g(vals, "ad", i)))


def _grow_size(vals: dict[str, Any], i: int) -> int:
    q = _g(vals, "nx", i)
    return _g(vals, "sz", i) + (_g(vals, "sz", q) if q != -1 and _g(vals, "k", q) == H.UNM else 0)


def _best_fit(vals: dict[str, Any], r: int, stream: int) -> tuple[int, int]:
    """The best fit and its successor candidate (-1: none): the smallest; with expandable segments PyTorch's
    walk on while the next candidate's expandable size (size + the unmapped block after it) is smaller."""
    cs = _cands(vals, r, stream)
    if not cs:
        return -1, -1
    k = 0
    if vals["ex"]:
        while k + 1 < len(cs) and _grow_size(vals, cs[k + 1]) < _grow_size(vals, cs[k]):
            k += 1
    return cs[k], (cs[k + 1] if k + 1 < len(cs) else -1)


def _run_choice(vals: dict[str, Any], r: int, stream: int) -> int:
    """The run an expandable malloc grows (seed 003: *maps fresh pages into a fresh contiguous VA run*; the
    first arena by address of the pool and stream, the first unmapped block in it whose run of free and
    unmapped blocks -- from the free block before it -- holds ``r``): that unmapped block, or -1 (a fresh
    arena)."""
    small = r <= H.K_SMALL
    ids = [i for i in range(vals["n"]) if _g(vals, "al", i)]
    arenas = sorted({_g(vals, "sb", i) for i in ids if bool(_g(vals, "sm", i)) == small and _g(vals, "sr", i) == stream})
    for base in arenas:
        blocks = sorted((i for i in ids if _g(vals, "sb", i) == base), key=lambda i: _g(vals, "ad", i))
        for pos, i in enumerate(blocks):
            if _g(vals, "k", i) != H.UNM:
                continue
            start = pos - 1 if pos > 0 and _g(vals, "k", blocks[pos - 1]) == H.FREE else pos
            got = 0
            for j in blocks[start:]:
                if _g(vals, "k", j) not in (H.FREE, H.UNM):
                    break
                got += _g(vals, "sz", j)
                if got >= r:
                    return i
    return -1


def _largest(vals: dict[str, Any], exclude_whole: bool = False) -> tuple[int, int]:
    best, who = 0, 0
    for i in range(vals["n"]):
        if _g(vals, "al", i) and _g(vals, "k", i) == H.FREE and _g(vals, "sz", i) > best:
            if exclude_whole and _g(vals, "sz", i) == _g(vals, "ss", i):
                continue
            best, who = _g(vals, "sz", i), i
    return best, who


def _split_threshold(preset_seed: bool, small: bool, expandable: bool = False) -> tuple[int, ...]:
    """The smallest legal remainder(s): the seed's 512 B / 2 MiB; pytorch's 512 B small pool (and with
    expandable segments), > 1 MiB large."""
    if small or (expandable and not preset_seed):
        return (H.K_MIN_BLOCK,)
    return (H.K_ROUND_LARGE,) if preset_seed else (H.K_SMALL, H.K_SMALL + H.K_MIN_BLOCK)


def check_step(st: Any, name: str, args: dict[str, Any], rep: Agreement, guards: frozenset = frozenset()) -> None:
    """Run spec action ``name`` on ``st`` (committing its own allowed answer)
    and compare with the encoded actions on the projection."""
    from memspec.spec.caching import CACHING
    from memspec.spec.core import Raises

    vals, refs = project(st)
    _invariant_agreement(st, vals, rep, f"before {name}{args}")
    act = next(a for a in CACHING.actions if a.name == name)
    before = copy.deepcopy(st)
    res = act.step(st, **args)
    br = res.branches[0]
    value: Any = None
    oom = None
    after: dict[str, Any]
    if isinstance(br, Raises):
        # OutOfMemory / DoubleFree: the spec's own on-error commit (malloc's OOM commits the retry's state)
        if name == "malloc" and args["size"] < H.ONE_EB:
            from memspec.spec.caching.policy import predict_malloc

            p = predict_malloc(before, args["size"], args["stream"])
            oom = p.oom
            st.__dict__.update(copy.deepcopy(p.state).__dict__)
    else:
        w = br.witness()
        ret = br.then(w)
        value = ret if name == "malloc" else w    # malloc: the new ref; empty_cache: the bytes released
    after, _ = project(st)
    rep.samples += 1
    where = f"{name}({', '.join(f'{k}={v}' for k, v in args.items())}) on {st.policy.preset}"
    try:
        enc, out = _encoded_step(before, vals, refs, name, args, value, st,
                                 _Steps(_acts(guards), rep, f"caching:{name}", guards))
    except _NoPath as e:
        rep.bad(f"{where}: {e}")
        return
    if name == "malloc":
        if isinstance(br, Raises) != (out == "OutOfMemory"):
            rep.bad(f"{where}: spec {'OutOfMemory' if isinstance(br, Raises) else 'a block'}, encoding {out}")
            return
        if oom is not None:
            got = {"requested": enc["oq"], "reserved": enc["orr"], "allocated": enc["oa"], "largest_free_block": enc["olf"]}
            want = {k: oom[k] for k in got}
            if got != want:
                rep.bad(f"{where}: OOM figures: encoding {got}, spec {want}")
    if name == "empty_cache" and enc["ret"] != value:
        rep.bad(f"{where}: encoding released {enc['ret']} bytes, spec {value}")
    if name == "double_free" and out != "DoubleFree":
        rep.bad(f"{where}: encoding {out}, spec DoubleFree")
    why = diff(enc, after)
    if why:
        rep.bad(f"{where}: {why}")


#: the spec actions whose step is one encoded action: its paths (the arguments: the block of the spec's
#: ``ref``, the spec's ``stream``)
_ONE_STEP = {"free": ("free:pending", "free:merge"), "double_free": ("double_free",),
             "record_stream": ("record_stream",), "complete_stream": ("complete_stream",)}


def _encoded_step(before: Any, vals: dict[str, Any], refs: dict[int, int], name: str, args: dict[str, Any],
                  value: Any, st: Any, run: _Steps) -> tuple[dict[str, Any], str]:
    if name in _ONE_STEP:
        a = {**({"b": refs.get(args["ref"], -1)} if "ref" in args else {}),   # (double_free's ref: no block)
             **({"t": args["stream"]} if "stream" in args else {})}
        nm, o, enc = run.paths(_ONE_STEP[name], vals, a, name)
        return (run.toy_unmap(enc, a["b"]) if nm == "free:merge" else enc), o
    if name == "empty_cache":
        enc = run.paths(["empty_cache_wait"], vals, {}, "empty_cache (wait)")[2]
        _nm, o, enc = run.paths(["empty_cache"], run.unmap_all(run.drain(enc)), {}, "empty_cache")
        return enc, o
    # malloc
    count = lambda branch: run.rep.count(run.spec_action, branch)  # noqa: E731
    size, stream = args["size"], args["stream"]
    enc = vals if size >= H.ONE_EB else run.drain(vals)
    base = 0
    small_seg = False
    if value is not None:
        seg = st.seg(st.where[value])
        base, small_seg = seg.base, seg.small
    r, alloc = _kernels(vals, size) if size < H.ONE_EB else (0, 0)
    # the best-fit argument, by the driver (the smallest free block of the pool and stream holding r; ties:
    # the lowest address): the encoding's precondition accepts only the best one; the spec's choice shows in
    # the state compared after the step
    b, b2 = _best_fit(enc, r, stream) if size < H.ONE_EB else (-1, -1)
    lf, lw = _largest(enc)
    u = _run_choice(enc, r, stream) if enc["ex"] and size < H.ONE_EB else -1
    margs = {"size": size, "t": stream, "r": r, "b": b, "b2": b2, "u": u, "base": base, "lf": lf, "lw": lw}
    path, o, enc2 = run.paths([f"malloc:{p}" for p in H.MALLOC_PATHS], enc, margs, "malloc")
    if path == "malloc:fit" and enc["ex"] and b != _cands(enc, r, stream)[0]:
        count("malloc:fit/past the smallest (expandable size)")
    if size < H.ONE_EB and not vals["seed"] and r != max(H.K_MIN_BLOCK, -(-size // H.K_MIN_BLOCK) * H.K_MIN_BLOCK):
        count(KNOB_BRANCHES[0])
    used = enc["Rs"] + enc["Rl"] + alloc
    if path != "malloc:fit" and size < H.ONE_EB and enc["hf"] and enc["lim"] < used <= enc["cap"]:
        count(KNOB_BRANCHES[1])
    if path in ("malloc:fit", "malloc:new"):
        run.served(path, enc2["n"] - enc["n"] == (1 if path == "malloc:fit" else 2),
                   (_g(enc, "sz", b) if path == "malloc:fit" else alloc) - r,
                   _split_threshold(st.policy.seed, small_seg, enc["ex"]))
    if path == "malloc:gc":
        # the spec's victims (its age order) are the arguments; the encoding allows any whole large segment
        for vaddr in _gc_victims(before, size, stream):
            vid = next((i for i in range(enc2["n"]) if _g(enc2, "al", i) and _g(enc2, "ad", i) == vaddr), -1)
            _nm, o, enc2 = run.paths(["gc:release"], enc2, {"b": vid}, f"gc release of the segment at {vaddr:#x}")
        lf, lw = _largest(enc2)
        u = _run_choice(enc2, r, stream) if enc2["ex"] else -1
        path, o, enc2 = run.paths([f"gc_end:{p}" for p in H.CONT_PATHS], enc2,
                                  {"base": base, "lf": lf, "lw": lw, "u": u}, "gc end")
    if path.endswith(":avail"):
        for _ in range(enc2["n"] + 2):
            c, j = _avail_choices(enc2)
            end = {"b": c, "base": base, "lf": 0, "lw": 0}
            path, o, enc2 = run.one([("avail:big", {"b": c}), ("avail:one", {"b": j}), ("avail_end:new", end),
                                     ("avail_end:retry", end)], enc2, "release_available")
            if path.startswith("avail_end:"):
                break
    for _attempt in range(2):
        if path.endswith(":expand"):
            path, o, enc2 = run.expand(enc2, base, r)
        if path in ("malloc:retry", "gc_end:retry", "avail_end:retry", "expand:retry"):
            before_retry = enc2["n"]
            enc2 = run.unmap_all(run.drain(enc2))
            lf, lw = _largest(enc2, exclude_whole=not enc2["ex"])
            u = _run_choice(enc2, r, stream) if enc2["ex"] else -1
            path, o, enc2 = run.paths([f"malloc_retry:{p}" for p in H.RETRY_PATHS], enc2,
                                      {"base": base, "lf": lf, "lw": lw, "u": u}, "malloc retry")
            if path == "malloc_retry:new" and enc2["n"] - before_retry == 2:
                count("malloc_retry:new/split")
    return enc2, o


def _gc_victims(before: Any, size: int, stream: int) -> list[int]:
    """The segments (base addresses) the spec's ``_garbage_collect`` releases for this malloc (run on a copy
    up to that point): the nondeterministic victims' arguments, each checked by ``gc:release``'s
    precondition."""
    from memspec.spec.caching import policy as P
    from memspec.spec.caching.kernels import choose_pool

    st = copy.deepcopy(before)
    P._process_events(st)
    r = st.policy.rounded(size)
    small = choose_pool(r) == "small"
    P._get_free_block(st, small, stream, r)
    bases = {s.sid: s.base for s in st.segments}
    P._garbage_collect(st)
    left = {s.sid for s in st.segments}
    return sorted(b for sid, b in bases.items() if sid not in left and b is not None)


def _avail_choices(vals: dict[str, Any]) -> tuple[int, int]:
    """release_available's candidates, by the driver: the smallest free block of the request's pool and
    stream holding the want, and the largest whole segment of at least max_split_size (-1: none)."""
    big = _cands(vals, vals["wa"], vals["mt"], vals["mr"] <= H.K_SMALL)
    elig = [i for i in _cands(vals, vals["ms"], vals["mt"], vals["mr"] <= H.K_SMALL)
            if _g(vals, "sz", i) == _g(vals, "ss", i)]
    return (big[0] if big else -1), (elig[-1] if elig else -1)


_KERNELS: list[Terms] = []


def _kernels(vals: dict[str, Any], size: int) -> tuple[int, int]:
    """The request's rounded size and new-segment size by the encoding's own kernels (``z_round`` with the
    state's divisions table, ``z_segment``; :class:`Terms`): the rounded size is malloc's argument (its
    precondition holds only for a legal one; the state after it is compared), the segment size only names
    the branch."""
    if not _KERNELS:
        s, a = _symbolic(0), St({"size": z3.Int("size@agarg")})
        r = H.z_round(s, a.size)
        _KERNELS.append(Terms(s, a, [r, H.z_segment(s, r)], "the rounding and segment-size kernels"))
    r, alloc = _KERNELS[0](vals, {"size": size})
    return r, alloc


def _state_key(vals: dict[str, Any]) -> Any:
    return tuple((f, vals[f] if not isinstance(vals[f], tuple) else (vals[f][0], tuple(sorted(vals[f][1].items()))))
                 for f in H.FIELDS)


def _invariant_agreement(st: Any, vals: dict[str, Any], rep: Agreement, where: str) -> None:
    """Each distinct state once (the boundary sweeps start many steps from the same two states)."""
    from memspec.spec.caching import INVARIANTS

    key = _state_key(vals)
    if key in rep.seen:
        return
    enc = encoded_invariants(vals)
    evaluated = []
    for inv in INVARIANTS:
        if inv.id not in enc:
            continue
        spec_ok = inv.check(st) is None
        rep.inv[inv.id][0] += 1
        evaluated.append((inv.id, spec_ok != enc[inv.id]))
        if spec_ok != enc[inv.id]:
            rep.inv[inv.id][1] += 1
            if len(rep.inv_examples) < 20:
                rep.inv_examples.append(f"{inv.id} {where}: spec {'holds' if spec_ok else 'fails'}, "
                                        f"encoding {'holds' if enc[inv.id] else 'fails'}")
    rep.seen[key] = tuple(evaluated)

