"""Z3 encodings of seed 000's invariants S1, S3 through S5, S7 and S10: the first part of
:mod:`memspec.invariants.formal.proofs_seed000` (which assembles them; import from there).

S1 creator-free, S3 fresh-capability, S4 fence-release (the deferred-free queue
machine, with the objects' contexts and creators: S1, S7 and S10 are proved on it
too), S5 no-silent-noop, S7 role-separation, S10 context-pinned; with the codes every
encoding shares (object lifecycle, ticket states, the holders that answer tickets) and
:func:`catalog`.  S6 holder-chooses is proved on S15's ticket machine (in the face), S2
charge-before-commit on the ledger model (:mod:`.proofs_seed000_ledger`).
"""

from __future__ import annotations

from typing import Any

import z3

from memspec.invariants.formal.z3fast import And, Implies, Not, Or
from memspec.invariants.formal.proofs import (
    ARR, ARR2, ARR2B, BARR, BOOL, CODE, INT, OK, Act, Proof, St, at, on_ok, outcome, upd,
)
from memspec.spec import kernels as K
from memspec.spec.invariants import BY_ID as CATALOG


def catalog(inv_id: str) -> tuple[str, str, str]:
    """``(id, title, seed quote)`` of an invariant, read from the spec's catalog
    (:mod:`memspec.spec.invariants`): defined once, never restated here."""
    inv = CATALOG[inv_id]
    return inv.id, inv.title.split(":")[0].strip(), inv.quote


NONE, LIVE, QUEUED, FREED = 0, 1, 2, 3
Z0 = lambda: z3.K(z3.IntSort(), z3.IntVal(0))  # noqa: E731
F0 = lambda: z3.K(z3.IntSort(), z3.BoolVal(False))  # noqa: E731


def alive(s: St, o: Any) -> Any:
    return Or(at(s.astate, o) == LIVE, at(s.astate, o) == QUEUED)


# ==========================================================================
# S3 fresh-capability
# ==========================================================================

def _s3_select(s: St, a: St):
    return on_ok(z3.IntVal(OK), s, s.set(inst=upd(s.inst, a.d, a.m), gen=upd(s.gen, a.d, at(s.gen, a.d) + 1)))


def _s3_query(check: bool):
    def step(s: St, a: St):
        cached = at(s.snapgen, a.d) == at(s.gen, a.d) if check else at(s.snapgen, a.d) >= 0
        answer = K.ite(cached, at(s.snap, a.d), at(s.inst, a.d))
        nxt = s.set(answer=answer,
                    snap=upd(s.snap, a.d, K.ite(cached, at(s.snap, a.d), at(s.inst, a.d))),
                    snapgen=upd(s.snapgen, a.d, K.ite(cached, at(s.snapgen, a.d), at(s.gen, a.d))))
        return on_ok(z3.IntVal(OK), s, nxt)
    return step


def _s3_prop(name: str, s: St, a: St, out: Any, s2: St, o: Any) -> Any:
    if name == "query":
        return s2.answer == at(s.inst, a.d)  # the answer is the mechanism installed now
    return z3.BoolVal(True)


S3 = Proof(
    *catalog("S3"),
    fields={"inst": ARR, "gen": ARR, "snap": ARR, "snapgen": ARR, "answer": INT},
    init=lambda s: And(s.gen == Z0(), s.snapgen == z3.K(z3.IntSort(), z3.IntVal(-1))),
    inv=lambda s, d: And(at(s.snapgen, d) <= at(s.gen, d),
                            Implies(at(s.snapgen, d) == at(s.gen, d), at(s.snap, d) == at(s.inst, d))),
    actions=[
        Act("select", {"d": INT, "m": INT}, _s3_select, objs=("d",)),
        Act("query", {"d": INT}, _s3_query(True), objs=("d",)),
    ],
    unguarded=Act("query", {"d": INT}, _s3_query(False), objs=("d",)),
    guard="a cached capability is used only if its generation is the installed one",
    step_prop=_s3_prop,
    bmc_depth=3,
)


# ==========================================================================
# S1 creator-free, S4 fence-release: the deferred-free queue machine, shared by S1, S4, S7 and S10
# ==========================================================================

# Streams are unbounded: ``iss[st]`` / ``done[st]`` count the work items
# launched on / completed by stream ``st``; ``use[x][st]`` is the last item of
# stream ``st`` that used object ``x`` (0: none).  An object is anything whose
# release goes through the deferred-free queue (seed 000: *owning handle Drop
# -> enter the EP/context deferred-free queue -> wait for the related
# stream/fence to finish -> allocator actually frees*): an owning allocation,
# a weight, an owning reservation, a KV request, or a queued decommit of some
# of a reservation's pages.  Each is made in context ``actx[x]``;
# ``calive[c]``: context ``c`` exists (S10's part of the state: a context's
# pins are its live and queued objects, stated as they are, so no counter or
# ghost sum is needed).  The initial contexts are any (the system starts with
# its provider context): no object exists, so none is pinned.
#
# S1's part: ``amech[x]`` / ``actx[x]``: the mechanism and context that
# created object ``x``; ``fmech[x]`` / ``fctx[x]``: those that release it
# (the queue entry records them when the release is queued; the device
# level's deallocate when it frees); ``inst``: the mechanism installed now
# (the system level may replace it: *If something caches the old allocator
# and then uses it to free a pointer created by the new allocator, that
# causes a cross-allocator free*).  The device level is on the same machine:
# ``dev[x]``, an allocation the mechanism made itself (``allocate`` by
# mechanism ``m``: 0 the one under test, 1 its twin, the source of foreign
# handles), freed on the spot by ``release`` (its deallocate) and never used
# through a stream (no fence is ever recorded on it).

def _fence_fields() -> dict[str, str]:
    return {"astate": ARR, "use": ARR2, "iss": ARR, "done": ARR, "actx": ARR, "calive": BARR,
            "amech": ARR, "fmech": ARR, "fctx": ARR, "inst": INT, "dev": BARR}


def _fence_init(s: St) -> Any:
    return And(s.astate == Z0(), s.iss == Z0(), s.done == Z0(), s.use == z3.K(z3.IntSort(), Z0()))


def _q_alloc(s: St, a: St):
    """An object is made (an owning allocation, a weight, an owning
    reservation, a KV request; ``dev``: the device level's allocation) by
    mechanism ``m`` in the binding's context ``c`` (the binding is used only
    while its context is alive): live, no work has used it yet."""
    return on_ok(z3.IntVal(OK), s, s.set(astate=upd(s.astate, a.x, LIVE), use=upd(s.use, a.x, Z0()),
                                         actx=upd(s.actx, a.x, a.c), amech=upd(s.amech, a.x, a.m),
                                         dev=upd(s.dev, a.x, a.dev)))


def _q_release(check: bool):
    """The device level's ``deallocate`` through mechanism ``m`` in context
    ``c``: a handle that mechanism did not create is refused
    (ForeignAllocation); one freed already, DoubleFree.  Unguarded (S1's):
    the creator is not checked."""
    def step(s: St, a: St):
        st = at(s.astate, a.x)
        foreign = Or(at(s.amech, a.x) != a.m, at(s.actx, a.x) != a.c) if check else z3.BoolVal(False)
        out = outcome((st == FREED, "DoubleFree"), (st != LIVE, "StaleHandle"), (foreign, "ForeignAllocation"))
        return on_ok(out, s, s.set(astate=upd(s.astate, a.x, FREED), fmech=upd(s.fmech, a.x, a.m),
                                   fctx=upd(s.fctx, a.x, a.c)))
    return step


def _q_release_pre(s: St, a: St) -> Any:
    """The device level has no queue: a handle drawn for deallocate is one of its allocations, live or freed."""
    return And(at(s.dev, a.x), Or(at(s.astate, a.x) == LIVE, at(s.astate, a.x) == FREED))


def _q_select(s: St, a: St):
    """``select``: mechanism ``m`` is installed (what was made before keeps its creator)."""
    return on_ok(z3.IntVal(OK), s, s.set(inst=a.m))


def _q_use(s: St, a: St):
    """*H->>E: submit GPU work that uses the allocation*: one more work item
    on stream ``st``, recorded as the object's fence on that stream."""
    item = at(s.iss, a.st) + 1
    return on_ok(z3.IntVal(OK), s, s.set(iss=upd(s.iss, a.st, item),
                                         use=upd(s.use, a.x, upd(at(s.use, a.x), a.st, item))))


def _by_creator(s: St, x: Any, y: Any = None) -> dict[str, Any]:
    """Object ``x`` (``y``: a piece of it) is released *by the mechanism/context
    that created it* -- not by the one installed now: what its queue entry records."""
    y = x if y is None else y
    return {"fmech": upd(s.fmech, y, at(s.amech, x)), "fctx": upd(s.fctx, y, at(s.actx, x))}


def _q_drop(s: St, a: St):
    """*Drop should be responsible for enqueuing*: a live object's release is
    queued (a second drop: DoubleFree), through its creator; nothing is freed,
    no stream waited on (the object still pins its context)."""
    out = outcome((at(s.astate, a.x) != LIVE, "DoubleFree"))
    return on_ok(out, s, s.set(astate=upd(s.astate, a.x, QUEUED), **_by_creator(s, a.x)))


def _q_decommit(s: St, a: St):
    """A decommit of a live reservation's pages (``bad``: a page of the range
    is not committed, InvalidRange) queues their release as a new object
    ``y``, behind every fence recorded on the reservation so far, made in the
    reservation's context by its creator (who releases it)."""
    out = outcome((a.bad, "InvalidRange"))
    return on_ok(out, s, s.set(astate=upd(s.astate, a.y, QUEUED), use=upd(s.use, a.y, at(s.use, a.x)),
                               actx=upd(s.actx, a.y, at(s.actx, a.x)), amech=upd(s.amech, a.y, at(s.amech, a.x)),
                               dev=upd(s.dev, a.y, False), **_by_creator(s, a.x, a.y)))


def _q_sync(s: St, a: St):
    """``synchronize(stream)`` (``every``: all streams): the device runs the
    stream's queued work, so every work item launched on it is done."""
    return on_ok(z3.IntVal(OK), s, s.set(done=z3.If(a.every, s.iss, upd(s.done, a.st, at(s.iss, a.st)))))


def _q_progress(s: St, a: St):
    """The device completes ``k`` more items of a stream on its own (the EP
    may report such a fence done before anyone synchronizes)."""
    return on_ok(z3.IntVal(OK), s, s.set(done=upd(s.done, a.st, K.minimum(at(s.iss, a.st), at(s.done, a.st) + a.k))))


def _fences_done(s: St, x: Any) -> Any:
    st = z3.Int("fd_st")
    return z3.ForAll([st], at(at(s.use, x), st) <= at(s.done, st))


def _q_poll(check: bool):
    """``poll``: the queue runs every queued release whose fences are all done
    (*wait for the related stream/fence to finish*; then *allocator actually
    frees*, through the mechanism the entry records); the others stay queued.
    Unguarded (S4's): every queued release runs."""
    def step(s: St, a: St):
        j = z3.Int("poll_j")
        runs = And(at(s.astate, j) == QUEUED, _fences_done(s, j) if check else z3.BoolVal(True))
        return on_ok(z3.IntVal(OK), s, s.set(astate=z3.Lambda([j], z3.If(runs, FREED, at(s.astate, j)))))
    return step


def _q_respond(s: St, a: St):
    """A holder answers a pressure ticket (a terminal one: InvalidTicket):
    its ``nv`` (0..2) victims ``v1``, ``v2`` -- live objects with no fence
    pending (a weight: ModelResidency's cold weights) -- are dropped (through
    their creators) and run at once, and the queue runs every queued release
    whose fences are all done, as ``poll`` does (*wait for the related
    stream/fence to finish*)."""
    j = z3.Int("resp_j")
    victim = Or(And(a.nv >= 1, j == a.v1), And(a.nv >= 2, j == a.v2))
    runs = Or(victim, And(at(s.astate, j) == QUEUED, _fences_done(s, j)))
    out = outcome((a.terminal, "InvalidTicket"))
    s1 = s.set(astate=z3.Lambda([j], z3.If(runs, FREED, at(s.astate, j))))
    s2 = s1.set(**{f: z3.If(a.nv >= 1, v, s1[f]) for f, v in _by_creator(s1, a.v1).items()})
    return on_ok(out, s, s2.set(**{f: z3.If(a.nv >= 2, v, s2[f]) for f, v in _by_creator(s2, a.v2).items()}))


def _q_respond_pre(s: St, a: St) -> Any:
    def ok(v: Any) -> Any:
        return And(at(s.astate, v) == LIVE, _fences_done(s, v))
    return And(0 <= a.nv, a.nv <= 2, Implies(a.nv >= 1, ok(a.v1)), Implies(a.nv >= 2, And(ok(a.v2), a.v2 != a.v1)))


def _q_create_context(s: St, a: St):
    """The provider context is created (the system starts with it)."""
    return on_ok(z3.IntVal(OK), s, s.set(calive=upd(s.calive, a.c, True)))


def _pinned(s: St, c: Any) -> Any:
    """Some live or queued object was made in context ``c``."""
    j = z3.Int("pin_j")
    return z3.Exists([j], And(alive(s, j), at(s.actx, j) == c))


def _q_destroy_context(check: bool):
    """destroy_context: while pinned, ContextBusy and it stays alive.
    Unguarded: destroyed whatever still pins it."""
    def step(s: St, a: St):
        pairs = [(_pinned(s, a.c), "ContextBusy")] if check else []
        return on_ok(outcome(*pairs), s, s.set(calive=upd(s.calive, a.c, False)))
    return step


_X = {"x": INT}
_C = {"c": INT}
_XMC = {"x": INT, "m": INT, "c": INT}
_STREAM_PRE = lambda s, a: a.st >= 0  # noqa: E731
_LIVE_X = lambda s, a: at(s.astate, a.x) == LIVE  # noqa: E731
#: the queue machine's actions, one list (the same step and precondition functions) for S1, S4, S7 and S10
_FENCE_ACTS = [
    Act("allocate", {**_XMC, "dev": BOOL}, _q_alloc,
        pre=lambda s, a: And(at(s.astate, a.x) == NONE, at(s.calive, a.c)), objs=("x",)),
    # work uses the binding's objects (never the device level's own allocations)
    Act("use", {"x": INT, "st": INT}, _q_use,
        pre=lambda s, a: And(_STREAM_PRE(s, a), _LIVE_X(s, a), Not(at(s.dev, a.x))), objs=("x",)),
    Act("drop", _X, _q_drop, pre=lambda s, a: at(s.astate, a.x) != NONE, objs=("x",)),
    # close_owned, unload_weight, kv_close: the same enqueue, drawn on live objects only
    Act("close", _X, _q_drop, pre=_LIVE_X, objs=("x",)),
    Act("decommit", {"x": INT, "y": INT, "bad": BOOL}, _q_decommit,
        pre=lambda s, a: And(_LIVE_X(s, a), at(s.astate, a.y) == NONE), objs=("x", "y")),
    Act("synchronize", {"st": INT, "every": BOOL}, _q_sync, pre=_STREAM_PRE),
    Act("progress", {"st": INT, "k": INT}, _q_progress, pre=lambda s, a: And(_STREAM_PRE(s, a), a.k >= 1)),
    Act("poll", {}, _q_poll(True)),
    # respond's releases: the victims' (no fence pending) and the queued ones whose fences are done
    Act("respond", {"nv": INT, "v1": INT, "v2": INT, "terminal": BOOL}, _q_respond, pre=_q_respond_pre,
        objs=("v1", "v2")),
    Act("create_context", _C, _q_create_context, pre=lambda s, a: Not(at(s.calive, a.c))),
    Act("destroy_context", _C, _q_destroy_context(True), pre=lambda s, a: at(s.calive, a.c)),
    # the device level's deallocate and the system's select (S1's)
    Act("release", _XMC, _q_release(True), pre=_q_release_pre, objs=("x",)),
    Act("select", {"m": INT}, _q_select),
]
_fence_pre = lambda name: next(a.pre for a in _FENCE_ACTS if a.name == name)  # noqa: E731


def _s4_inv(s: St, o: Any) -> Any:
    st = z3.Int("inv_st")
    u, iss, done = at(at(s.use, o), st), at(s.iss, st), at(s.done, st)
    return z3.ForAll([st], And(0 <= done, done <= iss, u <= iss,
                                  Implies(at(s.astate, o) == FREED, u <= done),
                                  Implies(at(s.dev, o), u == 0)))  # the device level's: no fence


def _on_queue(row: str, inv: Any, unguarded: Act, guard: str, **kw: Any) -> Proof:
    """Row ``row`` on the queue machine: its fields, initial states and actions, action by action (so
    every agreement sample of the machine is the row's too); its own invariant, unguarded variant, guard."""
    return Proof(*catalog(row), fields=_fence_fields(), init=_fence_init, inv=inv, actions=list(_FENCE_ACTS),
                 unguarded=unguarded, guard=guard, **kw)


S4 = _on_queue("S4", _s4_inv, Act("poll", {}, _q_poll(False)),
               "the deferred-free queue frees only after every fence recorded on the allocation completed", bmc_depth=4)


def _by_its_creator(s: St, o: Any) -> Any:
    return And(at(s.fmech, o) == at(s.amech, o), at(s.fctx, o) == at(s.actx, o))


def _s1_named(s: St, o: Any) -> Any:
    """Every freed object was freed by the mechanism and context that created it."""
    return Implies(at(s.astate, o) == FREED, _by_its_creator(s, o))


# S1 creator-free, on the queue machine: the device level's deallocate checks the creator; the
# queue's releases (poll's, respond's) run through the one their entry records, the creator
S1 = _on_queue(
    # and a queued release records its creator (what poll and respond run it through)
    "S1", lambda s, o: Implies(Or(at(s.astate, o) == QUEUED, at(s.astate, o) == FREED), _by_its_creator(s, o)),
    Act("release", _XMC, _q_release(False), pre=_q_release_pre, objs=("x",)),
    "release checks the handle's creating mechanism and context (else ForeignAllocation)", bmc_depth=2)


# ==========================================================================
# S5 no-silent-noop  (mirrors spec/vmm.py: reserve, commit_range,
# decommit_range, committed_bytes, release_reservation, reserve_owned,
# commit_owned; spec/mechanism.py: query_virtual_backing,
# query_shared_mapping; spec/holders.py: kv_open)
#
# The invariant is the spec's own (spec/invariants.py ``_s5_mech`` /
# ``_s5_sys``): no absent capability was ever answered with an object
# (``absent``: the spec's ``absent_answered``); the physical bytes the
# mechanism reported are the pages installed (``physical == other + ctot``,
# ``other``: eager, shared and private bytes, which no S5 action changes);
# every live owning reservation and open KV request was made by a mechanism
# with VirtualBacking (``rcap``/``kcap``).  Each commit/decommit changes the
# reservation's reported bytes, the total and ``physical`` by exactly
# ``end - start`` and returns it (a step property); ``committed_bytes``
# answers the bytes the commits reported.  Nothing here needs a page count:
# the page set ``pc`` decides only the guards, so the machine holds for a
# symbolic page with no lemma.  VirtualBacking's methods exist only on a
# mechanism that has it (``requires``), so their domain is ``cap``; the
# explicit refusal without it is the system level's (reserve_owned,
# kv_open: Unsupported).  Sizes that are not sizes, a misaligned or
# already-committed owned range, an oversized prefix are the argument ``bad``;
# an OutOfMemory the spec allows is ``oom``.
# ==========================================================================

def _in_range(p: Any, lo: Any, hi: Any, page: Any) -> Any:
    return And(K.floordiv(lo, page) <= p, p < K.floordiv(hi, page))


def _some_page(s: St, r: Any, lo: Any, hi: Any, committed: bool) -> Any:
    """Is some page of [lo, hi) of reservation r committed (or, with
    ``committed=False``, not committed)?"""
    p = z3.Int("pg")
    row = at(s.pc, r)
    hit = at(row, p) if committed else Not(at(row, p))
    return z3.Exists([p], And(_in_range(p, lo, hi, s.page), hit))


def _oom(s: St, n: Any, oom: Any) -> Any:
    """spec/state.py oom_rule: OutOfMemory when the bytes do not fit, and allowed
    (the environment's choice ``oom``) when they would not fit with what a twin
    on the same device holds; never from fragmentation."""
    return Or(s.physical + n > s.capacity, And(oom, s.physical + s.foreign + n > s.capacity))


def _s5_handle_errors(s: St, r: Any) -> list:
    return [(at(s.rforeign, r), "ForeignAllocation"), (Not(at(s.rlive, r)), "StaleHandle")]


def _s5_query(which: str, check: bool):
    """A capability query: the object when present, ``None`` when absent (the
    guard); a stub answered for an absent capability is counted in ``absent``."""
    def step(s: St, a: St):
        present = s[which]
        answer = K.ite(present, 1, 0) if check else z3.IntVal(1)
        return on_ok(z3.IntVal(OK), s, s.set(answer=answer,
                                             absent=s.absent + K.ite(And(Not(present), answer == 1), 1, 0)))
    return step


def _s5_reserve(s: St, a: St):
    out = outcome((a.bad, "InvalidRequest"), (a.oom, "OutOfMemory"))
    return on_ok(out, s, s.set(rlive=upd(s.rlive, a.r, True), rforeign=upd(s.rforeign, a.r, False),
                               rsize=upd(s.rsize, a.r, a.n), reported=upd(s.reported, a.r, 0),
                               pc=upd(s.pc, a.r, z3.K(z3.IntSort(), z3.BoolVal(False)))))


def _s5_span(commit: bool):
    """commit_range (``commit``) / decommit_range of [lo, hi): the pages join (leave) the page set,
    their ``n`` bytes are added to (taken from) what is reported, physical and the committed total."""
    def step(s: St, a: St):
        n = a.hi - a.lo
        pg = z3.Int("pg")
        row = at(s.pc, a.r)
        new_row = z3.Lambda([pg], Or(at(row, pg), _in_range(pg, a.lo, a.hi, s.page)) if commit
                            else And(at(row, pg), Not(_in_range(pg, a.lo, a.hi, s.page))))
        out = outcome(*_s5_handle_errors(s, a.r),
                      (Not(K.range_ok(a.lo, a.hi, at(s.rsize, a.r), s.page)), "InvalidRange"),
                      (_some_page(s, a.r, a.lo, a.hi, commit), "InvalidRange"),
                      *([(_oom(s, n, a.oom), "OutOfMemory")] if commit else []))
        move = (lambda x: x + n) if commit else (lambda x: x - n)
        return on_ok(out, s, s.set(pc=upd(s.pc, a.r, new_row), reported=upd(s.reported, a.r, move(at(s.reported, a.r))),
                                   physical=move(s.physical), ctot=move(s.ctot), ret=n))
    return step


def _s5_committed_bytes(s: St, a: St):
    out = outcome(*_s5_handle_errors(s, a.r))
    return on_ok(out, s, s.set(ret=at(s.reported, a.r)))


def _s5_release(s: St, a: St):
    n = at(s.reported, a.r)
    out = outcome(*_s5_handle_errors(s, a.r))
    return on_ok(out, s, s.set(pc=upd(s.pc, a.r, z3.K(z3.IntSort(), z3.BoolVal(False))), reported=upd(s.reported, a.r, 0),
                               physical=s.physical - n, ctot=s.ctot - n, rlive=upd(s.rlive, a.r, False), ret=n))


def _s5_reserve_owned(check: bool):
    """The binding's reserve: without the installed mechanism's VirtualBacking,
    Unsupported (the guard); the reservation records whether its creator has it."""
    def step(s: St, a: St):
        out = outcome(*([(Not(s.cap), "Unsupported")] if check else []), (a.bad, "InvalidRequest"),
                      (a.oom, "OutOfMemory"))
        return on_ok(out, s, s.set(ostate=upd(s.ostate, a.r, LIVE), rcap=upd(s.rcap, a.r, s.cap),
                                   osize=upd(s.osize, a.r, a.n), ocb=upd(s.ocb, a.r, 0)))
    return step


def _s5_commit_owned(s: St, a: St):
    n = a.hi - a.lo
    out = outcome((Or(a.bad, a.hi > at(s.osize, a.r)), "InvalidRange"), (n > s.free, "GrantDenied"),
                  (a.oom, "OutOfMemory"))
    return on_ok(out, s, s.set(ocb=upd(s.ocb, a.r, at(s.ocb, a.r) + n), free=s.free - n, ret=n))


def _s5_kv_open(s: St, a: St):
    out = outcome((Or(Not(s.cap), And(a.prefix, Not(s.scap))), "Unsupported"), (a.bad, "InvalidRequest"))
    return on_ok(out, s, s.set(kst=upd(s.kst, a.q, LIVE), kcap=upd(s.kcap, a.q, s.cap)))


def _s5_device(s: St, a: St):
    """The mechanism's other writers of ``physical`` (issue 33): allocate,
    deallocate (eager bytes), create, release_handle, unmap, copy_on_write
    (shared and private bytes): on success the device's physical bytes and
    ``other`` move by the same ``d`` (a free: ``d < 0``; copy_on_write: its
    private copy, less the handle's pages when that was their last mapping)
    and no reservation's committed bytes change.  ``code``: the outcome the
    spec answers (these actions' refusals are other rows' rules; here they
    change nothing)."""
    return on_ok(a.code, s, s.set(physical=s.physical + a.d, other=s.other + a.d))


#: each writer's refusals (one class where the spec permits two: DoubleFree for StaleHandle,
#: InvalidRequest for InvalidRange)
_S5_CODES = {"m_allocate": ("InvalidRequest", "OutOfMemory"), "m_deallocate": ("ForeignAllocation", "DoubleFree"),
             "m_create": ("InvalidRequest", "OutOfMemory"), "m_release_handle": ("DoubleFree",),
             "m_unmap": ("InvalidRange",), "m_copy_on_write": ("InvalidRange", "OutOfMemory")}


def _s5_device_pre(name: str):
    codes = (OK,) + tuple(CODE[e] for e in _S5_CODES[name])
    return lambda s, a: And(Or(*[a.code == c for c in codes]), s.other + a.d >= 0)


def _s5_named(s: St, o: Any) -> Any:
    """The spec's S5 (both levels), at object ``o``."""
    return And(s.absent == 0, s.physical == s.other + s.ctot,
                  Implies(at(s.ostate, o) == LIVE, at(s.rcap, o)), Implies(at(s.kst, o) == LIVE, at(s.kcap, o)))


def _s5_prop(name: str, s: St, a: St, out: Any, s2: St, o: Any) -> Any:
    if name in ("query_virtual_backing", "query_shared_mapping"):  # explicit absence
        return s2.answer == K.ite(s["cap" if name == "query_virtual_backing" else "scap"], 1, 0)
    if name in ("commit_range", "decommit_range"):
        sign = 1 if name == "commit_range" else -1
        delta = at(s2.reported, a.r) - at(s.reported, a.r)
        return Implies(out == OK, And(s2.ret == a.hi - a.lo, s2.ret > 0, delta == sign * s2.ret,
                                            s2.physical - s.physical == sign * s2.ret, s2.ctot - s.ctot == sign * s2.ret))
    if name == "commit_owned":
        return Implies(out == OK, And(s2.ret == a.hi - a.lo, at(s2.ocb, a.r) - at(s.ocb, a.r) == s2.ret))
    if name in _S5_DEVICE:  # the bytes it reports moved are the device's, never a reservation's
        return Implies(out == OK, And(s2.physical - s.physical == a.d, s2.ctot == s.ctot,
                                      s2.reported == s.reported, s2.pc == s.pc))
    if name == "committed_bytes":
        return Implies(out == OK, s2.ret == at(s.reported, a.r))
    if name == "release_reservation":
        return Implies(out == OK, And(s2.ret == at(s.reported, a.r), s.physical - s2.physical == s2.ret))
    return z3.BoolVal(True)


_S5_DEVICE = ("m_allocate", "m_deallocate", "m_create", "m_release_handle", "m_unmap", "m_copy_on_write")
_SPAN = {"r": INT, "lo": INT, "hi": INT}
_SPAN_OOM = {**_SPAN, "oom": BOOL}
_CAP = lambda s, a: s.cap  # noqa: E731  (VirtualBacking's methods exist only when it is provided)
_S5_RES = {"r": INT, "n": INT, "bad": BOOL, "oom": BOOL}
S5 = Proof(
    *catalog("S5"),
    fields={"cap": BOOL, "scap": BOOL, "page": INT, "capacity": INT, "physical": INT, "foreign": INT, "other": INT,
            "ctot": INT, "absent": INT, "rlive": BARR, "rforeign": BARR, "rsize": ARR, "pc": ARR2B, "reported": ARR,
            "answer": INT, "ret": INT, "free": INT, "ostate": ARR, "rcap": BARR, "osize": ARR, "ocb": ARR,
            "kst": ARR, "kcap": BARR},
    init=lambda s: And(s.page > 0, s.capacity >= 0, s.physical == 0, s.other == 0, s.ctot == 0, s.absent == 0,
                          s.rlive == F0(), s.reported == Z0(), s.ostate == Z0(), s.kst == Z0(),
                          s.pc == z3.K(z3.IntSort(), z3.K(z3.IntSort(), z3.BoolVal(False)))),
    inv=lambda s, r: And(s.page > 0, _s5_named(s, r)),
    actions=[
        Act("query_virtual_backing", {}, _s5_query("cap", True)),
        Act("query_shared_mapping", {}, _s5_query("scap", True)),
        Act("reserve", _S5_RES, _s5_reserve, pre=lambda s, a: And(s.cap, Not(at(s.rlive, a.r)))),
        Act("commit_range", _SPAN_OOM, _s5_span(True), pre=_CAP),
        Act("decommit_range", _SPAN, _s5_span(False), pre=_CAP),
        Act("committed_bytes", {"r": INT}, _s5_committed_bytes, pre=_CAP),
        Act("release_reservation", {"r": INT}, _s5_release, pre=_CAP),
        Act("reserve_owned", _S5_RES, _s5_reserve_owned(True), pre=lambda s, a: at(s.ostate, a.r) == NONE),
        Act("commit_owned", {**_SPAN, "bad": BOOL, "oom": BOOL}, _s5_commit_owned,
            pre=lambda s, a: at(s.ostate, a.r) == LIVE),
        Act("kv_open", {"q": INT, "bad": BOOL, "prefix": BOOL}, _s5_kv_open, pre=lambda s, a: at(s.kst, a.q) == NONE),
        *[Act(n, {"d": INT, "code": INT}, _s5_device, pre=_s5_device_pre(n)) for n in _S5_DEVICE],
    ],
    unguarded=Act("reserve_owned", _S5_RES, _s5_reserve_owned(False), pre=lambda s, a: at(s.ostate, a.r) == NONE),
    guard="reserve through the binding needs the installed mechanism's VirtualBacking (else Unsupported), never "
          "a reservation no commit can back",
    step_prop=_s5_prop,
    bmc_depth=1,
)


# ==========================================================================
# Ticket states (S15's ticket machine, on which S6 is proved too; read by S11's ledger model)
# ==========================================================================

T_PENDING, T_GRANTED, T_CLAIMED, T_CANCELLED, T_TIMED_OUT = 1, 2, 3, 4, 5
T_FAILED = 6   # a pending ticket of a configuration that reconfigure replaced (S15's generations)


def _terminal(st: Any) -> Any:
    return Or(st == T_CLAIMED, st == T_CANCELLED, st == T_TIMED_OUT, st == T_FAILED)


H_WEIGHTS, H_KV = 0, 1  # the holders that answer tickets


# ==========================================================================
# S7 role-separation
# ==========================================================================

def _s7_drop_frees(s: St, a: St):
    """The unguarded drop: the release skips the deferred-free queue and frees
    on the spot (the guarded one is S4's ``_q_drop``: it only enqueues)."""
    out = outcome((at(s.astate, a.x) != LIVE, "DoubleFree"))
    return on_ok(out, s, s.set(astate=upd(s.astate, a.x, FREED)))


def _s7_prop(name: str, s: St, a: St, out: Any, s2: St, o: Any) -> Any:
    """*Drop should be responsible for enqueuing, not for synchronizing the
    whole GPU on an arbitrary thread or freeing immediately*: every
    enqueueing action leaves its object queued and no stream's progress
    changed, and frees nothing else."""
    if name in ("drop", "close", "decommit"):
        x = a.y if name == "decommit" else a.x
        return And(Implies(out == OK, at(s2.astate, x) == QUEUED), s2.done == s.done,
                      Implies(at(s2.astate, o) == FREED, at(s.astate, o) == FREED))
    return z3.BoolVal(True)


S7 = _on_queue("S7", _s4_inv, Act("drop", _X, _s7_drop_frees, pre=_fence_pre("drop"), objs=("x",)),
               "Drop only enqueues on the deferred-free queue", step_prop=_s7_prop, bmc_depth=2)


# ==========================================================================
# S10 context-pinned: the queue machine of S4 (its ``actx`` / ``calive``)
# ==========================================================================

def _s10_inv(s: St, o: Any) -> Any:
    """A live or queued object's context is alive."""
    return Implies(alive(s, o), at(s.calive, at(s.actx, o)))


S10 = _on_queue("S10", _s10_inv, Act("destroy_context", _C, _q_destroy_context(False),
                                     pre=_fence_pre("destroy_context")),
                "destroy_context raises ContextBusy while allocations or queued releases pin it", bmc_depth=3)
