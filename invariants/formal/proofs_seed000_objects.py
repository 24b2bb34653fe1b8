"""Z3 encodings of seed 000's invariants S1, S3 through S5, S7, S10, S12, S13 and S14: the first part of
:mod:`memspec.invariants.formal.proofs_seed000` (which assembles them; import from there).

S1 creator-free, S3 fresh-capability, S4 fence-release (the deferred-free queue
machine, with the objects' contexts, creators and identities: S1, S7, S10 and S14 are
proved on it too), S5 no-silent-noop (the VMM machine: S12 stable-address and S13 shared-lifetime are
proved on it too), S7 role-separation, S10 context-pinned, S14 no-reuse-of-identity; with the codes every
encoding shares (object lifecycle, ticket states, the holders that answer tickets) and
:func:`catalog`.  S6 holder-chooses is proved on S15's ticket machine (in the face), S2
charge-before-commit on the ledger model (:mod:`.proofs_seed000_ledger`).
"""

from __future__ import annotations

from typing import Any

import z3

from memspec.invariants.formal.z3fast import And, Implies, Not, Or
from memspec.invariants.formal.proofs import (
    ARR, ARR2, ARR2B, BARR, BOOL, CODE, INT, OK, Act, Proof, St, at, count_append, count_change, merge, on_ok, outcome,
    prefix_append, prefix_change, prefix_count, upd,
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
# S1 creator-free, S4 fence-release: the deferred-free queue machine, shared by S1, S4, S7, S10 and S14
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
# ``dev[x]``, an object the mechanism made itself (``allocate`` by mechanism
# ``m``: 0 the one under test, 1 its twin, the source of foreign handles): an
# allocation, a reservation (VirtualBacking's or a shared one), a physical
# handle; freed on the spot by ``release`` (deallocate, release_reservation,
# free_shared_reservation) and never used through a stream (no fence is ever
# recorded on it).
#
# S14's part (no-reuse-of-identity; mirrors spec/eager.py allocate/deallocate,
# spec/vmm.py reserve/release_reservation/reserve_owned, spec/shared.py
# shared_reserve/create/free_shared_reservation, spec/manager.py
# allocate_owned): an object's identity is its id; every object made takes an
# id never used (``astate`` none) and no action makes one none again, so two
# objects never share one.  The device's own eager allocations also own
# their address ``addr`` in ``byaddr`` (the spec's ``by_address``; ``NOADDR``:
# none, also the address of every other object); an address is reused once its
# allocation is freed.  deallocate resolves a handle by its identity: a handle
# no longer live is refused even when a newer allocation lives at its address.
# A creation's refusal (a size that is not a size, the Governor's or the
# device's refusal, no VirtualBacking: other rows' rules) makes nothing: outside the machine.

NOADDR = -1


def _fence_fields() -> dict[str, str]:
    return {"astate": ARR, "use": ARR2, "iss": ARR, "done": ARR, "actx": ARR, "calive": BARR,
            "amech": ARR, "fmech": ARR, "fctx": ARR, "inst": INT, "dev": BARR,
            # S14's: the device's address map
            "addr": ARR, "byaddr": ARR}


def _fence_init(s: St) -> Any:
    return And(s.astate == Z0(), s.iss == Z0(), s.done == Z0(), s.use == z3.K(z3.IntSort(), Z0()),
               s.addr == z3.K(z3.IntSort(), z3.IntVal(NOADDR)), s.byaddr == z3.K(z3.IntSort(), z3.IntVal(NOADDR)))


def _q_alloc(s: St, a: St):
    """An object is made (an owning allocation, a weight, an owning
    reservation, a KV request; ``dev``: the device level's allocation,
    reservation or handle) by mechanism ``m`` in the binding's context ``c``
    (the binding is used only while its context is alive): live, no work has
    used it yet (a fresh identity: an id never used); an eager allocation of the device
    (``ad``: not NOADDR) owns its address."""
    return on_ok(z3.IntVal(OK), s, s.set(astate=upd(s.astate, a.x, LIVE), use=upd(s.use, a.x, Z0()),
                                  actx=upd(s.actx, a.x, a.c), amech=upd(s.amech, a.x, a.m),
                                  dev=upd(s.dev, a.x, a.dev), addr=upd(s.addr, a.x, a.ad),
                                  byaddr=upd(s.byaddr, a.ad, K.ite(a.ad == NOADDR, NOADDR, a.x))))


def _q_alloc_pre(s: St, a: St) -> Any:
    """A new object in a live context; an address only for the device's own eager allocation, one no
    allocation owns."""
    return And(at(s.astate, a.x) == NONE, at(s.calive, a.c),
               Or(a.ad == NOADDR, And(a.ad >= 0, a.x >= 0, a.dev, at(s.byaddr, a.ad) == NOADDR)))


def _q_release(creator: bool, identity: bool):
    """The device level's ``deallocate`` (also release_reservation, free_shared_reservation)
    through mechanism ``m`` in context ``c``: a handle that mechanism did not
    create is refused (ForeignAllocation); one freed already, DoubleFree;
    (free_shared_reservation's) ``bad``: still mapped (InvalidRange).  Unguarded
    without ``creator`` (S1's): the creator is not checked; without
    ``identity`` (S14's): the handle is resolved by its address, so a stale
    one frees whatever lives at its recycled address."""
    def step(s: St, a: St):
        st, ad = at(s.astate, a.x), at(s.addr, a.x)
        here = at(s.byaddr, ad)
        foreign = Or(at(s.amech, a.x) != a.m, at(s.actx, a.x) != a.c) if creator else z3.BoolVal(False)
        if identity:
            x, errs = a.x, [(st == FREED, "DoubleFree"), (st != LIVE, "StaleHandle")]
        else:
            reused = And(st != LIVE, ad != NOADDR, here != NOADDR)
            x, errs = K.ite(reused, here, a.x), [(And(st != LIVE, Not(reused)), "DoubleFree")]
        out = outcome(*errs, (foreign, "ForeignAllocation"), *([(a.bad, "InvalidRange")] if "bad" in a else []))
        return on_ok(out, s, s.set(astate=upd(s.astate, x, FREED), fmech=upd(s.fmech, x, a.m),
                                   fctx=upd(s.fctx, x, a.c), byaddr=upd(s.byaddr, ad, NOADDR)))
    return step


def _q_release_pre(s: St, a: St) -> Any:
    """The device level has no queue: a handle drawn for release is one of its objects, live or freed."""
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
                               dev=upd(s.dev, a.y, False), addr=upd(s.addr, a.y, NOADDR), **_by_creator(s, a.x, a.y)))


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
#: the queue machine's actions, one list (the same step and precondition functions) for S1, S4, S7, S10 and S14
_FENCE_ACTS = [
    Act("allocate", {**_XMC, "dev": BOOL, "ad": INT}, _q_alloc, pre=_q_alloc_pre, objs=("x",)),
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
    # the device level's releases and the system's select (S1's); a shared reservation is never foreign
    Act("release", _XMC, _q_release(True, True), pre=_q_release_pre, objs=("x",)),
    Act("free_shared_reservation", {**_XMC, "bad": BOOL}, _q_release(True, True),
        pre=lambda s, a: And(_q_release_pre(s, a), at(s.amech, a.x) == a.m, at(s.actx, a.x) == a.c), objs=("x",)),
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
    Act("release", _XMC, _q_release(False, True), pre=_q_release_pre, objs=("x",)),
    "release checks the handle's creating mechanism and context (else ForeignAllocation)", bmc_depth=2)


# ==========================================================================
# The VMM machine: S5 no-silent-noop, S12 stable-address and S13
# shared-lifetime on one machine (mirrors spec/vmm.py: reserve, commit_range,
# decommit_range, committed_bytes, release_reservation, reserve_owned,
# commit_owned, decommit_owned; spec/mechanism.py: query_virtual_backing,
# query_shared_mapping; spec/eager.py: allocate, deallocate; spec/shared.py
# (below); spec/holders.py: kv_open, kv_grow, kv_close)
#
# Two reservation records, each indexed by the reservations of its level:
# the mechanism's (``rlive``, ``rforeign``, ``rsize``, the page set ``pc``,
# the bytes the commits ``reported``) and the system level's owned ones --
# the binding's owning reservations and the KV requests' stable ranges
# (``ostate``, ``rcap``: made by a mechanism with VirtualBacking, ``osize``:
# the size or the request's maximum, ``ocb``: its committed bytes; a
# request's own bytes and prefix, S13's).  Both have a base address ``base``
# (``base0``: the one reserved at; the next free one is ``nextva``).  The
# physical bytes are ``eager + shared + private + ctot`` (allocations, shared
# handles, private copies, committed reservation pages).
#
# S5: the invariant is the spec's own (spec/invariants.py ``_s5_mech`` /
# ``_s5_sys``): no absent capability was ever answered with an object
# (``absent``: the spec's ``absent_answered``); the physical bytes the
# mechanism reported are the pages installed (``physical == eager + shared +
# private + ctot``; no reservation action changes the first three, and no
# handle's or mapping's action the last); every live owning reservation and
# open KV request was made by a
# mechanism with VirtualBacking (``rcap``).  Each commit/decommit changes the
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
#
# S12: a live reservation's base is the one it was reserved at.  Every
# committing action of the system level has the same body: to install
# backing up to ``end`` the range must cover ``end``; a range that does not
# is grown by reserving a bigger one elsewhere and moving the pointer (what
# an allocator without VMM does: allocate bigger, copy).  The one guard that
# keeps the pointer stable is the range check: ``end`` past the reservation
# is InvalidRange.  Byte ends are page-rounded by the adapter (``end``), so
# the machine is linear; kv_grow's injected failure is ``fail``, its
# permitted refusal of a no-op ``refuse``.
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


def _vmm_new_base(s: St, r: Any, n: Any) -> dict[str, Any]:
    """A reservation of ``n`` bytes at the next free address (its base and the one it was reserved at)."""
    return {"base": upd(s.base, r, s.nextva), "base0": upd(s.base0, r, s.nextva), "nextva": s.nextva + n + 1}


def _s5_reserve(s: St, a: St):
    out = outcome((a.bad, "InvalidRequest"), (a.oom, "OutOfMemory"))
    return on_ok(out, s, s.set(rlive=upd(s.rlive, a.r, True), rforeign=upd(s.rforeign, a.r, False),
                               rsize=upd(s.rsize, a.r, a.n), reported=upd(s.reported, a.r, 0),
                               pc=upd(s.pc, a.r, z3.K(z3.IntSort(), z3.BoolVal(False))), **_vmm_new_base(s, a.r, a.n)))


#: the kinds of S11's ledger model's device objects (its ``mk``; a new handle's is written here)
M_ALLOC, M_RES, M_HANDLE, M_MAP = 1, 2, 3, 4


def _m_new(s: St, kind: int, b: Any) -> St:
    """A new live device object of S11's ledger model (id ``nm``) of ``b`` bytes: the device takes them."""
    return s.set(physical=s.physical + b, mst=upd(s.mst, s.nm, LIVE), mb=upd(s.mb, s.nm, b),
                 mk=upd(s.mk, s.nm, kind), PMB=prefix_append(s.PMB, s.nm, b), nm=s.nm + 1)


def _dev_bytes(s: St, x: Any, d: Any, fig: str, new: bool = False) -> St:
    """The device after reservation, handle or mapping ``x`` takes ``d`` more bytes (gives them back:
    ``d < 0``): ``physical`` moves by ``d``, and with it this machine's figure ``fig`` (``ctot``,
    ``shared``, ``private``), or what S11's ledger model's device object ``x`` holds (``mb``) and its
    ghost (``PMB``; a ``new`` handle is its next object ``nm``): ONE relation per action for both."""
    if "PMB" not in s:
        return s.set(physical=s.physical + d, **{fig: s[fig] + d})
    if new:
        return _m_new(s, M_HANDLE, d)
    return s.set(physical=s.physical + d, mb=upd(s.mb, x, at(s.mb, x) + d), PMB=prefix_change(s.PMB, x, d))


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
        d = n if commit else -n
        s1 = s.set(pc=upd(s.pc, a.r, new_row), reported=upd(s.reported, a.r, at(s.reported, a.r) + d), ret=n)
        return on_ok(out, s, _dev_bytes(s1, a.r, d, "ctot"))
    return step


def _s5_committed_bytes(s: St, a: St):
    out = outcome(*_s5_handle_errors(s, a.r))
    return on_ok(out, s, s.set(ret=at(s.reported, a.r)))


def _s5_release(s: St, a: St):
    n = at(s.reported, a.r)
    out = outcome(*_s5_handle_errors(s, a.r))
    s1 = s.set(pc=upd(s.pc, a.r, z3.K(z3.IntSort(), z3.BoolVal(False))), reported=upd(s.reported, a.r, 0),
               rlive=upd(s.rlive, a.r, False), ret=n)
    return on_ok(out, s, _dev_bytes(s1, a.r, -n, "ctot"))


def _vmm_owned_new(s: St, a: St) -> St:
    """An owned reservation (or a KV request's stable range) of ``n`` bytes, nothing committed; it
    records whether its creator has VirtualBacking."""
    return s.set(ostate=upd(s.ostate, a.r, LIVE), rcap=upd(s.rcap, a.r, s.cap), osize=upd(s.osize, a.r, a.n),
                 ocb=upd(s.ocb, a.r, 0), **_vmm_new_base(s, a.r, a.n))


def _vmm_reserve_owned(check: bool):
    """The binding's reserve: without the installed mechanism's VirtualBacking,
    Unsupported (S5's guard)."""
    def step(s: St, a: St):
        out = outcome(*([(Not(s.cap), "Unsupported")] if check else []), (a.bad, "InvalidRequest"),
                      (a.oom, "OutOfMemory"))
        return on_ok(out, s, _vmm_owned_new(s, a))
    return step


def _vmm_place(s: St, r: Any, end: Any) -> St:
    """Back the owned range up to ``end``: a reservation too small is re-reserved
    bigger at the next free address (the pointer moves)."""
    moved = end > at(s.osize, r)
    return s.set(base=upd(s.base, r, K.ite(moved, s.nextva, at(s.base, r))),
                 osize=upd(s.osize, r, K.maximum(at(s.osize, r), end)),
                 nextva=K.ite(moved, s.nextva + end, s.nextva))


def _vmm_range_guard(s: St, r: Any, end: Any) -> tuple[Any, str]:
    """The guard S12 rests on: a commit stays inside the reservation."""
    return (end > at(s.osize, r), "InvalidRange")


def _vmm_commit_owned(check: bool):
    """commit_owned: charge-then-commit ``n`` bytes of an owned reservation
    (without the range guard: S12's unguarded variant, which re-reserves)."""
    def step(s: St, a: St):
        n = a.hi - a.lo
        out = outcome((a.bad, "InvalidRange"), *([_vmm_range_guard(s, a.r, a.hi)] if check else []),
                      (n > s.free, "GrantDenied"), (a.oom, "OutOfMemory"))
        return on_ok(out, s, _vmm_place(s, a.r, a.hi).set(ocb=upd(s.ocb, a.r, at(s.ocb, a.r) + n), free=s.free - n,
                                                          ret=n))
    return step


def _vmm_decommit_owned(s: St, a: St):
    """The pages leave now, their refund is queued: only the committed bytes
    change, and the address stays."""
    out = outcome((a.bad, "InvalidRange"), _vmm_range_guard(s, a.r, a.hi))
    return on_ok(out, s, s.set(ocb=upd(s.ocb, a.r, at(s.ocb, a.r) - (a.hi - a.lo))))


def _kv_grow(s: St, a: St, d: Any, past: Any, short: Any, grown: St) -> tuple[Any, St]:
    """kv_grow (spec/holders.py), ONE relation for this machine and S11's ledger model: a growth by
    ``d`` page-rounded bytes; ``past``: beyond max_bytes; ``refuse``: a no-op answered InvalidRequest;
    ``short``: the Governor cannot grant ``d``; ``fail``: injected at step 4/5; ``oom``: the device's
    at step 4.  Only a growth that succeeds is ``grown`` (each machine's record of it)."""
    out = outcome((past, "InvalidRange"), (And(d <= 0, a.refuse), "InvalidRequest"), (d <= 0, "ok"),
                  (short, "GrantDenied"), (a.fail, "MemspecError"), (a.oom, "OutOfMemory"))
    return out, merge(And(out == OK, d > 0), grown, s)


def _vmm_kv_grow(s: St, a: St):
    """Grow a KV request to ``end`` (``max_bytes`` is a page multiple: S12's range guard is past
    it): its own committed bytes (``kown``, what a sharer's prefix may map) grow by as much."""
    delta = a.end - at(s.ocb, a.r)
    grown = _vmm_place(s, a.r, a.end).set(free=s.free - delta, ocb=upd(s.ocb, a.r, a.end),
                                          kown=upd(s.kown, a.r, at(s.kown, a.r) + delta))
    return _kv_grow(s, a, delta, _vmm_range_guard(s, a.r, a.end)[0], delta > s.free, grown)


def _s5_device(s: St, a: St):
    """The mechanism's eager writers of ``physical`` (issue 33): allocate,
    deallocate: on success the device's physical bytes and the eager bytes
    move by the same ``d`` (a free: ``d < 0``) and no reservation's
    committed bytes change.  ``code``: the outcome the spec answers (these
    actions' refusals are other rows' rules; here they change nothing)."""
    return on_ok(a.code, s, s.set(physical=s.physical + a.d, eager=s.eager + a.d))


#: each writer's refusals (one class where the spec permits two: DoubleFree for StaleHandle)
_S5_CODES = {"m_allocate": ("InvalidRequest", "OutOfMemory"), "m_deallocate": ("ForeignAllocation", "DoubleFree")}


def _s5_device_pre(name: str):
    """The spec's answer (an allocation never past the device: its OutOfMemory rule)."""
    codes = (OK,) + tuple(CODE[e] for e in _S5_CODES[name])
    return lambda s, a: And(Or(*[a.code == c for c in codes]), s.eager + a.d >= 0, s.physical + a.d <= s.capacity)


# -- SharedMapping (S13's rule): physical handles, their mappings, KV prefixes --
#
# (mirrors spec/shared.py: create, map, unmap, copy_on_write, mapping_count,
# release_handle, write_through, free_shared_reservation, and spec/holders.py
# kv_open, kv_close).  Shared reservations are ``rlive`` too (the mechanism's
# reservations of either kind); a misplaced or already-backed range is the
# argument ``bad``, a reservation with a page still mapped ``mapped``.  No
# foreign shared reservation exists (the twin makes only VirtualBacking ones)
# and unmap/copy_on_write are drawn from the live mappings (whose reservation
# is live: it cannot be freed while mapped), so those errors are outside the
# actions' domains.  KvPageStore prefixes: request ``q`` open (``ostate``
# live, closed: freed) maps ``kpre[q]`` read-only bytes of origin
# ``korig[q]`` (-1: none), whose own committed bytes ``kown`` must cover
# every open sharer's prefix.
#
# ONE record and ONE relation per action of a handle's life (create, unmap,
# copy_on_write, release_handle, the free they trigger), as of a
# reservation's commit_range, decommit_range, release_reservation (above):
# shared by this machine and S11's ledger model (its ``m_<action>``, on its
# device ids), each counting the bytes its own way (:func:`_dev_bytes`).
# Handle ``h``: ``hexists``, ``hsize``, ``hreleased`` (its creator released
# it), ``hmaps`` (its live, not copied mappings; here checked by ``PM``, a
# prefix-count ghost over the dense mapping ids), ``hfreed``; mapping ``m`` of
# handle ``mh[m]``: ``mlive``, ``msize``, ``mro``, ``mpriv`` (copied: private
# pages of its own).

def _shm_unshare(s: St, m: Any, h: Any) -> St:
    """Mapping ``m`` no longer shares handle ``h``'s pages: ``hmaps[h]`` (and this machine's ``PM``) drop it."""
    pm = {"PM": count_change(s.PM, m, h, -1)} if "PM" in s else {}
    return s.set(hmaps=upd(s.hmaps, h, at(s.hmaps, h) - 1), **pm)


def _shm_maybe_free(s: St, h: Any) -> St:
    """shared._maybe_free: a handle's pages are freed once released and unmapped everywhere (once)."""
    go = And(at(s.hreleased, h), at(s.hmaps, h) == 0, Not(at(s.hfreed, h)))
    return merge(go, _dev_bytes(s.set(hfreed=upd(s.hfreed, h, True)), h, -at(s.hsize, h), "shared"), s)


def _shm_create(s: St, a: St):
    """create: ``n`` (a positive page multiple) physical bytes taken once, in new handle ``h``;
    OutOfMemory by the device's rule."""
    out = outcome((Or(a.n <= 0, K.mod(a.n, s.page) != 0), "InvalidRequest"),
                  (_oom(s, a.n, a.oom), "OutOfMemory"))
    s1 = s.set(hexists=upd(s.hexists, a.h, True), hsize=upd(s.hsize, a.h, a.n), hreleased=upd(s.hreleased, a.h, False),
               hmaps=upd(s.hmaps, a.h, 0), hfreed=upd(s.hfreed, a.h, False))
    return on_ok(out, s, _dev_bytes(s1, a.h, a.n, "shared", new=True))


def _s13_map(s: St, a: St):
    out = outcome((Not(at(s.rlive, a.r)), "StaleHandle"), (at(s.hreleased, a.h), "StaleHandle"),
                  (a.bad, "InvalidRange"))
    return on_ok(out, s, s.set(mlive=upd(s.mlive, a.m, True), mh=upd(s.mh, a.m, a.h),
                               msize=upd(s.msize, a.m, at(s.hsize, a.h)), mro=upd(s.mro, a.m, a.ro),
                               mpriv=upd(s.mpriv, a.m, False), hmaps=upd(s.hmaps, a.h, at(s.hmaps, a.h) + 1),
                               ret=at(s.hsize, a.h), PM=count_append(s.PM, s.nm, a.h), nm=s.nm + 1))


def _mapping_errors(s: St, a: St) -> list:
    """A range that is not exactly one live mapping (``size``: the range's): InvalidRange."""
    return [(Or(Not(at(s.mlive, a.m)), a.size != at(s.msize, a.m)), "InvalidRange")]


def _shm_unmap(s: St, a: St):
    """unmap of mapping ``m``: a private (copied) one frees its own pages; a shared one gives back its
    reference (the handle is freed if released and now unmapped)."""
    out = outcome(*_mapping_errors(s, a))
    h, sz = at(s.mh, a.m), at(s.msize, a.m)
    s1 = s.set(mlive=upd(s.mlive, a.m, False), ret=sz)
    done = merge(at(s.mpriv, a.m), _dev_bytes(s1, a.m, -sz, "private"), _shm_maybe_free(_shm_unshare(s1, a.m, h), h))
    return out, merge(out == OK, done, s)


def _shm_cow(s: St, a: St):
    """copy_on_write of shared mapping ``m``: private pages of its size are taken (OutOfMemory by the
    device's rule), then the handle loses the mapping (freed if released and now unmapped)."""
    sz, h = at(s.msize, a.m), at(s.mh, a.m)
    out = outcome(*_mapping_errors(s, a), (at(s.mpriv, a.m), "InvalidRange"),
                  (_oom(s, sz, a.oom), "OutOfMemory"))
    s1 = _dev_bytes(_shm_unshare(s.set(mpriv=upd(s.mpriv, a.m, True), ret=sz), a.m, h), a.m, sz, "private")
    return on_ok(out, s, _shm_maybe_free(s1, h))


def _shm_release(check: bool):
    """release_handle: the creator's reference dropped (again: DoubleFree); returns the handle's size
    if no mapping remains (freed now), else 0.  Unguarded (S13's variant): the pages are freed with
    the creator's reference, mapped or not."""
    def step(s: St, a: St):
        out = outcome((at(s.hreleased, a.h), "DoubleFree"))
        unmapped = at(s.hmaps, a.h) == 0
        s1 = s.set(hreleased=upd(s.hreleased, a.h, True), ret=K.ite(unmapped, at(s.hsize, a.h), 0))
        if check:
            return on_ok(out, s, _shm_maybe_free(s1, a.h))
        s2 = merge(Not(at(s.hfreed, a.h)), _dev_bytes(s1, a.h, -at(s.hsize, a.h), "shared"), s1)
        return on_ok(out, s, s2.set(hfreed=upd(s.hfreed, a.h, True), ret=at(s.hsize, a.h)))
    return step


def _s13_write(s: St, a: St):
    """The write lands in the mapping's pages; the guard: through a read-only
    (not copied) mapping it is rejected.  ``rowrites`` counts the writes that
    landed through a read-only mapping (the spec's ``readonly_writes``)."""
    ro = And(at(s.mro, a.m), Not(at(s.mpriv, a.m)))
    out = outcome((ro, "ReadOnlyViolation"))
    return on_ok(out, s, s.set(rowrites=s.rowrites + K.ite(ro, 1, 0)))


def _s13_count(s: St, a: St):
    """mapping_count: the handle's live mappings; a freed handle is stale."""
    out = outcome((at(s.hfreed, a.h), "StaleHandle"))
    return on_ok(out, s, s.set(ret=at(s.hmaps, a.h)))


def _s13_free_res(s: St, a: St):
    """free_shared_reservation: nothing may be mapped in it (else InvalidRange;
    ``mapped``: some page of it is backed, from the adapter -- the proof does
    not track which reservation a mapping is in)."""
    out = outcome((Not(at(s.rlive, a.r)), "DoubleFree"), (a.mapped, "InvalidRange"))
    return on_ok(out, s, s.set(rlive=upd(s.rlive, a.r, False)))


def _vmm_kv_open(s: St, a: St):
    """kv_open: step 1 reserves the request's stable range of ``n`` (its maximum) bytes (no
    VirtualBacking: Unsupported); a prefix (``hasorig``: SharedMapping too) maps ``p`` committed
    bytes of an open origin, charged once there; it must not exceed what the origin committed."""
    out = outcome((Or(Not(s.cap), And(a.hasorig, Not(s.scap))), "Unsupported"),
                  (And(a.hasorig, Or(a.p > at(s.kown, a.org), a.p > a.n)), "InvalidRequest"))
    return on_ok(out, s, _vmm_owned_new(s, a).set(kown=upd(s.kown, a.r, 0),
                                                  korig=upd(s.korig, a.r, K.ite(a.hasorig, a.org, -1)),
                                                  kpre=upd(s.kpre, a.r, K.ite(a.hasorig, a.p, 0))))


def _s13_kv_close(s: St, a: St):
    """kv_close: the release is queued (it runs in poll); the request is closed."""
    return on_ok(z3.IntVal(OK), s, s.set(ostate=upd(s.ostate, a.q, FREED)))


def _s13_prefix_covered(s: St, o: Any) -> Any:
    """An open request's read-only prefix is backed by its origin's committed bytes."""
    return Implies(And(at(s.ostate, o) == LIVE, at(s.korig, o) >= 0), at(s.kown, at(s.korig, o)) >= at(s.kpre, o))


# -- the machine, and the rows on it -----------------------------------------

def _s5_named(s: St, o: Any) -> Any:
    """The spec's S5 (both levels), at object ``o`` (an owned reservation or a KV request)."""
    return And(s.absent == 0, s.physical == s.eager + s.shared + s.private + s.ctot,
               Implies(at(s.ostate, o) == LIVE, at(s.rcap, o)))


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
    if name in _S5_DEVICE:  # the bytes it reports moved are the device's (eager, shared, private), never a reservation's
        return Implies(out == OK, And(*([s2.physical - s.physical == a.d] if name in _S5_CODES else []),
                                      s2.ctot == s.ctot, s2.reported == s.reported, s2.pc == s.pc))
    if name == "committed_bytes":
        return Implies(out == OK, s2.ret == at(s.reported, a.r))
    if name == "release_reservation":
        return Implies(out == OK, And(s2.ret == at(s.reported, a.r), s.physical - s2.physical == s2.ret))
    return z3.BoolVal(True)


_S5_DEVICE = ("m_allocate", "m_deallocate", "create", "release_handle", "unmap", "copy_on_write")
_SPAN = {"r": INT, "lo": INT, "hi": INT}
_SPAN_OOM = {**_SPAN, "oom": BOOL}
_OWNED_SPAN = {**_SPAN_OOM, "bad": BOOL}
_CAP = lambda s, a: s.cap  # noqa: E731  (VirtualBacking's methods exist only when it is provided)
_S5_RES = {"r": INT, "n": INT, "bad": BOOL, "oom": BOOL}
_OWNED_NEW = lambda s, a: And(at(s.ostate, a.r) == NONE, a.n > 0)  # noqa: E731
_OWNED_LIVE = lambda s, a: at(s.ostate, a.r) == LIVE  # noqa: E731  (drawn from the live ones)
_MAPARGS = {"m": INT, "size": INT}
_CREATE = {"h": INT, "n": INT, "oom": BOOL}
_DRAWN_MAPPING = lambda s, a: at(s.mlive, a.m)  # noqa: E731  (drawn from the live mappings)
_HANDLE = lambda s, a: at(s.hexists, a.h)  # noqa: E731  (drawn from the handles)
_VMM_FIELDS = {
    "cap": BOOL, "scap": BOOL, "page": INT, "capacity": INT, "physical": INT, "foreign": INT, "eager": INT,
    "shared": INT, "private": INT, "ctot": INT, "absent": INT, "rowrites": INT, "answer": INT, "ret": INT,
    "free": INT, "nextva": INT,
    # the mechanism's reservations (VirtualBacking and shared ones)
    "rlive": BARR, "rforeign": BARR, "rsize": ARR, "pc": ARR2B, "reported": ARR,
    # physical handles and their mappings (``PM``/``nm``: a prefix-count ghost over dense mapping ids)
    "hexists": BARR, "hsize": ARR, "hreleased": BARR, "hmaps": ARR, "hfreed": BARR,
    "mlive": BARR, "mh": ARR, "msize": ARR, "mro": BARR, "mpriv": BARR, "PM": ARR2, "nm": INT,
    # the system level's owned reservations and KV requests (their prefixes)
    "ostate": ARR, "rcap": BARR, "osize": ARR, "ocb": ARR, "kown": ARR, "korig": ARR, "kpre": ARR,
    # either level's base address (S12)
    "base": ARR, "base0": ARR}


def _vmm_init(s: St) -> Any:
    """Nothing committed, mapped or owned yet; the mechanism's reservations (``rlive``) may exist
    (S13 has no shared_reserve: its shared reservations are made before), each at its first base."""
    return And(s.page > 0, s.capacity >= 0, s.physical == 0, s.eager == 0, s.shared == 0, s.private == 0,
               s.ctot == 0, s.absent == 0, s.rowrites == 0, s.nextva >= 0, s.base == s.base0, s.reported == Z0(),
               s.pc == z3.K(z3.IntSort(), z3.K(z3.IntSort(), z3.BoolVal(False))),
               s.hexists == F0(), s.hmaps == Z0(), s.hfreed == F0(), s.hreleased == F0(), s.mlive == F0(),
               s.nm == 0, s.PM == z3.K(z3.IntSort(), Z0()), s.ostate == Z0(), s.kown == Z0(),
               s.korig == z3.K(z3.IntSort(), z3.IntVal(-1)), s.kpre == Z0())


#: the VMM machine's actions, one list (the same step and precondition functions) for S5, S12 and S13
_VMM_ACTS = [
    Act("query_virtual_backing", {}, _s5_query("cap", True)),
    Act("query_shared_mapping", {}, _s5_query("scap", True)),
    Act("reserve", _S5_RES, _s5_reserve, pre=lambda s, a: And(s.cap, Not(at(s.rlive, a.r)))),
    Act("commit_range", _SPAN_OOM, _s5_span(True), pre=_CAP),
    Act("decommit_range", _SPAN, _s5_span(False), pre=_CAP),
    Act("committed_bytes", {"r": INT}, _s5_committed_bytes, pre=_CAP),
    Act("release_reservation", {"r": INT}, _s5_release, pre=_CAP),
    Act("reserve_owned", _S5_RES, _vmm_reserve_owned(True), pre=_OWNED_NEW),
    Act("commit_owned", _OWNED_SPAN, _vmm_commit_owned(True), pre=_OWNED_LIVE),
    Act("decommit_owned", _OWNED_SPAN, _vmm_decommit_owned, pre=_OWNED_LIVE),
    Act("kv_open", {"r": INT, "n": INT, "org": INT, "p": INT, "hasorig": BOOL}, _vmm_kv_open,
        pre=lambda s, a: And(_OWNED_NEW(s, a), a.r >= 0, a.p >= 0,
                             Implies(a.hasorig, And(a.org >= 0, a.org != a.r, at(s.ostate, a.org) == LIVE)))),
    Act("kv_grow", {"r": INT, "end": INT, "refuse": BOOL, "fail": BOOL, "oom": BOOL}, _vmm_kv_grow, pre=_OWNED_LIVE),
    Act("kv_close", {"q": INT}, _s13_kv_close, pre=lambda s, a: at(s.ostate, a.q) == LIVE),
    *[Act(n, {"d": INT, "code": INT}, _s5_device, pre=_s5_device_pre(n)) for n in _S5_CODES],
    Act("create", _CREATE, _shm_create, pre=lambda s, a: Not(at(s.hexists, a.h)), objs=("h",)),
    Act("map", {"m": INT, "h": INT, "r": INT, "ro": BOOL, "bad": BOOL}, _s13_map,
        pre=lambda s, a: And(a.m == s.nm, at(s.hexists, a.h)), objs=("m", "h")),
    Act("unmap", _MAPARGS, _shm_unmap, pre=_DRAWN_MAPPING, objs=("m",)),
    Act("copy_on_write", {**_MAPARGS, "oom": BOOL}, _shm_cow, pre=_DRAWN_MAPPING, objs=("m",)),
    Act("release_handle", {"h": INT}, _shm_release(True), pre=_HANDLE, objs=("h",)),
    Act("write_through", {"m": INT}, _s13_write, pre=_DRAWN_MAPPING, objs=("m",)),
    Act("mapping_count", {"h": INT}, _s13_count, pre=_HANDLE, objs=("h",)),
    Act("free_shared_reservation", {"r": INT, "mapped": BOOL}, _s13_free_res),
]

S5 = Proof(
    *catalog("S5"),
    fields=dict(_VMM_FIELDS), init=_vmm_init,
    inv=lambda s, r: And(s.page > 0, _s5_named(s, r)),
    actions=list(_VMM_ACTS),
    unguarded=Act("reserve_owned", _S5_RES, _vmm_reserve_owned(False), pre=_OWNED_NEW),
    guard="reserve through the binding needs the installed mechanism's VirtualBacking (else Unsupported), never "
          "a reservation no commit can back",
    step_prop=_s5_prop,
    bmc_depth=1,
)


def _s12_inv(s: St, r: Any) -> Any:
    """A live reservation (the mechanism's, or an owned one or a KV request's range) keeps its base."""
    return Implies(Or(at(s.rlive, r), at(s.ostate, r) == LIVE), at(s.base, r) == at(s.base0, r))


S12 = Proof(
    *catalog("S12"),
    fields=dict(_VMM_FIELDS), init=_vmm_init, inv=_s12_inv,
    # the VMM machine of S5, action by action (so S5's agreement samples are S12's too)
    actions=list(_VMM_ACTS),
    unguarded=Act("commit_owned", _OWNED_SPAN, _vmm_commit_owned(False), pre=_OWNED_LIVE),
    guard="commit stays inside the reservation (else InvalidRange), never relocating it",
    bmc_depth=2,
)


def _s13_inv(s: St, o: Any) -> Any:
    h = at(s.mh, o)
    shared_map = And(at(s.mlive, o), Not(at(s.mpriv, o)))
    return And(
        at(s.hmaps, o) >= 0, s.page > 0,
        Implies(at(s.hfreed, o), And(at(s.hreleased, o), at(s.hmaps, o) == 0)),
        Implies(at(s.hexists, o), at(s.hsize, o) > 0),
        Implies(at(s.mlive, o), And(at(s.hexists, h), at(s.msize, o) == at(s.hsize, h))),
        Implies(shared_map, Not(at(s.hfreed, h))),
        s.rowrites == 0,
        # KV prefixes
        _s13_prefix_covered(s, o), at(s.kown, o) >= 0,
        Implies(at(s.ostate, o) == NONE, And(at(s.korig, o) == -1, at(s.kpre, o) == 0)),
        Implies(And(at(s.ostate, o) != NONE, at(s.korig, o) >= 0), at(s.ostate, at(s.korig, o)) != NONE),
        # hmaps[h] counts the live, not copied mappings of h: a keyed prefix-count
        # ghost over dense mapping ids checks it
        Implies(at(s.mlive, o), And(0 <= o, o < s.nm)),
        Implies(Not(at(s.hexists, o)), at(s.hmaps, o) == 0),
        prefix_count(s.PM, s.nm, o, lambda k, i: z3.If(And(at(s.mlive, i), Not(at(s.mpriv, i)),
                                                              at(s.mh, i) == k), 1, 0)),
        at(s.hmaps, o) == at(at(s.PM, o), s.nm),
    )


def _s13_lemmas(s: St, o: Any, a: St) -> Any:
    # one live, not copied mapping of h means hmaps[h] >= 1, two distinct ones >= 2
    h = at(s.mh, o)
    shared_map = lambda x: And(at(s.mlive, x), Not(at(s.mpriv, x)))  # noqa: E731
    one = Implies(shared_map(o), at(s.hmaps, h) >= 1)
    if "m" not in a:
        return one
    m = a["m"]
    two = Implies(And(o != m, shared_map(o), shared_map(m), at(s.mh, m) == h), at(s.hmaps, h) >= 2)
    return And(one, two)


def _s13_prop(name: str, s: St, a: St, out: Any, s2: St, o: Any) -> Any:
    if name == "map":  # charged once: mapping again takes no new physical bytes
        return And(s2.physical == s.physical, s2.shared == s.shared)
    if name == "release_handle":
        return Implies(out == OK, s2.ret == K.ite(at(s.hmaps, a.h) == 0, at(s.hsize, a.h), 0))
    if name == "mapping_count":
        return Implies(out == OK, s2.ret == at(s.hmaps, a.h))
    return z3.BoolVal(True)


S13 = Proof(
    *catalog("S13"),
    fields=dict(_VMM_FIELDS), init=_vmm_init,
    inv=_s13_inv, lemmas=_s13_lemmas, step_prop=_s13_prop,
    lemma_doc="a handle's mapping count is at least its live shared mappings (1, or 2 for two distinct ones)",
    # the invariant at the handle a mapping maps (sound: Inv is proved for every object)
    inst=lambda s, o, a: [at(s.mh, o)] + [at(s.mh, a[k]) for k in ("m", "h") if k in a],
    # the VMM machine of S5, action by action (so S5's agreement samples are S13's too)
    actions=list(_VMM_ACTS),
    unguarded=Act("release_handle", {"h": INT}, _shm_release(False), pre=_HANDLE, objs=("h",)),
    guard="physical pages are freed only when the last mapping is gone",
    bmc_depth=3,
    timeout_ms=90000,  # map's consecution takes ~3 s of CPU (mappings, handles and KV prefixes in one machine)
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


# ==========================================================================
# S14 no-reuse-of-identity: the queue machine of S4 (its objects' ids, never
# reused, and the device's address map ``addr`` / ``byaddr``)
# ==========================================================================

def _s14_owns_address(s: St, o: Any) -> Any:
    """A live eager allocation of the device owns its address (the spec's ``by_address``
    holds the live allocations)."""
    return Implies(And(at(s.astate, o) == LIVE, at(s.addr, o) != NOADDR), at(s.byaddr, at(s.addr, o)) == o)


def _s14_inv(s: St, o: Any) -> Any:
    """The named rule; an object that owns an address is no address's ``NOADDR``."""
    return And(_s14_owns_address(s, o), Implies(And(at(s.astate, o) != NONE, at(s.addr, o) != NOADDR), o >= 0))


def _s14_prop(name: str, s: St, a: St, out: Any, s2: St, o: Any) -> Any:
    if name in ("release", "free_shared_reservation"):  # a handle that is not live is rejected, nothing changes
        return Implies(at(s.astate, a.x) != LIVE, And(out != OK, at(s2.astate, o) == at(s.astate, o)))
    return z3.BoolVal(True)


S14 = _on_queue("S14", _s14_inv, Act("release", _XMC, _q_release(True, False), pre=_q_release_pre, objs=("x",)),
                "deallocate resolves a handle by its identity: a handle no longer live is refused "
                "(StaleHandle/DoubleFree) even when a newer allocation lives at its address",
                step_prop=_s14_prop, bmc_depth=4)

