"""Z3 encodings of the seed-000 invariants S1-S15 (see :mod:`memspec.invariants.proofs`).

Each encoding keeps only the state an invariant talks about; object records
(allocations, reservations, holders, tickets, handles, mappings, contexts) are
arrays indexed by an unbounded object id, sizes and counters are unbounded
integers, and all ledger arithmetic goes through :mod:`memspec.spec.kernels`.
Object lifecycle codes: 0 none (id never used), 1 live, 2 queued (dropped,
waiting for fences), 3 freed.
"""

from __future__ import annotations

from typing import Any

import z3

from memspec.invariants.z3fast import And, Implies, Not, Or
from memspec.invariants.proofs import (
    ARR, ARR2, ARR2B, BARR, BOOL, CODE, INT, OK, PENDING, Act, Proof, St, at, count_append, count_change, merge, on_ok,
    outcome, prefix_append, prefix_change, prefix_count, prefix_sum, upd,
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
# S1 creator-free
# ==========================================================================
# ``amech[x]`` / ``actx[x]``: the mechanism and context that created object
# ``x``; ``fmech[x]`` / ``fctx[x]``: those that released it; ``inst``: the
# mechanism installed now (the system level may replace it: *If something
# caches the old allocator and then uses it to free a pointer created by the
# new allocator, that causes a cross-allocator free*).

def _s1_alloc(s: St, a: St):
    """An allocation made by mechanism ``m`` (0: the one under test, 1: its
    twin, the source of foreign handles) in context ``c``."""
    return on_ok(z3.IntVal(OK), s, s.set(astate=upd(s.astate, a.x, LIVE), amech=upd(s.amech, a.x, a.m),
                                         actx=upd(s.actx, a.x, a.c)))


def _s1_release(check: bool):
    """``deallocate`` through mechanism ``m`` in context ``c``: a handle that
    mechanism did not create is refused (ForeignAllocation); one freed
    already, DoubleFree.  Unguarded: the creator is not checked."""
    def step(s: St, a: St):
        st = at(s.astate, a.x)
        foreign = Or(at(s.amech, a.x) != a.m, at(s.actx, a.x) != a.c) if check else z3.BoolVal(False)
        out = outcome((st == FREED, "DoubleFree"), (st != LIVE, "StaleHandle"), (foreign, "ForeignAllocation"))
        return on_ok(out, s, s.set(astate=upd(s.astate, a.x, FREED), fmech=upd(s.fmech, a.x, a.m),
                                   fctx=upd(s.fctx, a.x, a.c)))
    return step


def _s1_enqueue(s: St, a: St):
    """A live object's release is queued (drop, close_owned, unload_weight,
    kv_close; a decommit queues part of one): S1 does not depend on which, so
    any live object may be queued at any time (an over-approximation)."""
    return on_ok(z3.IntVal(OK), s, s.set(astate=upd(s.astate, a.x, QUEUED)))


def _s1_select(s: St, a: St):
    """``select``: mechanism ``m`` is installed (what was made before keeps its creator)."""
    return on_ok(z3.IntVal(OK), s, s.set(inst=a.m))


def _s1_poll(s: St, a: St):
    """``poll`` runs the queued releases the EP reports done (``ready``), each
    *released by the mechanism/context that created it* -- not by the one
    installed now."""
    j = z3.Int("s1_j")
    runs = And(at(s.astate, j) == QUEUED, at(a.ready, j))
    return on_ok(z3.IntVal(OK), s, s.set(
        astate=z3.Lambda([j], z3.If(runs, FREED, at(s.astate, j))),
        fmech=z3.Lambda([j], z3.If(runs, at(s.amech, j), at(s.fmech, j))),
        fctx=z3.Lambda([j], z3.If(runs, at(s.actx, j), at(s.fctx, j)))))


_P3 = {"x": INT, "m": INT, "c": INT}
#: the mechanism level has no queue: a handle drawn for deallocate is live or freed
_S1_MECH_HANDLE = lambda s, a: Or(at(s.astate, a.x) == LIVE, at(s.astate, a.x) == FREED)  # noqa: E731
S1 = Proof(
    *catalog("S1"),
    fields={"astate": ARR, "amech": ARR, "actx": ARR, "fmech": ARR, "fctx": ARR, "inst": INT},
    init=lambda s: s.astate == Z0(),
    inv=lambda s, o: Implies(at(s.astate, o) == FREED,
                                And(at(s.fmech, o) == at(s.amech, o), at(s.fctx, o) == at(s.actx, o))),
    actions=[
        Act("allocate", _P3, _s1_alloc, pre=lambda s, a: at(s.astate, a.x) == NONE, objs=("x",)),
        Act("release", _P3, _s1_release(True), pre=_S1_MECH_HANDLE, objs=("x",)),
        Act("enqueue", {"x": INT}, _s1_enqueue, pre=lambda s, a: at(s.astate, a.x) == LIVE, objs=("x",)),
        Act("select", {"m": INT}, _s1_select),
        Act("poll", {"ready": BARR}, _s1_poll),
    ],
    unguarded=Act("release", _P3, _s1_release(False), pre=_S1_MECH_HANDLE, objs=("x",)),
    guard="release checks the handle's creating mechanism and context (else ForeignAllocation)",
    bmc_depth=2,
)


# ==========================================================================
# S2 charge-before-commit
# ==========================================================================
# Per holder ``h`` (0 session, 1 ModelResidency, 2 KvPageStore):
# ``committed[h]`` the physical bytes installed for it, ``charge[h]`` what
# the Governor charges it; ``free`` the Governor's free bytes.  Every action
# that installs physical bytes first obtains their charge (*a charge must be
# obtained before physical commit*): the Governor can charge at most what is
# free (``K.minimum(n, free)``), and the guard refuses (GrantDenied) unless
# all ``n`` bytes are.  The unguarded variant drops that guard: the bytes are
# mapped, the Governor charges what it can.

def _s2_install(s: St, h: Any, n: Any) -> St:
    """Charge ``n`` bytes to holder ``h`` (as much as is free), then install them."""
    return s.set(committed=upd(s.committed, h, at(s.committed, h) + n),
                 charge=upd(s.charge, h, at(s.charge, h) + K.minimum(n, s.free)), free=s.free - n)


def _s2_reserve(s: St, a: St):
    """Governor ``reserve``: a provisional grant of ``n`` bytes leaves free (GrantDenied if more than is free)."""
    out = outcome((Not(K.can_grant(K.Ledger(0, s.free, 0, 0), a.n)), "GrantDenied"))
    return on_ok(out, s, s.set(free=s.free - a.n))


def _s2_cancel(s: St, a: St):
    """Governor ``cancel``: an open grant's ``gb`` bytes return to free (not open: InvalidRequest)."""
    out = outcome((Not(a.open), "InvalidRequest"))
    return on_ok(out, s, s.set(free=s.free + a.gb))


def _s2_commit(s: St, a: St):
    """Governor ``commit``: an open grant of ``gb`` bytes becomes a lease of
    ``actual`` bytes charged to ``h``; the difference comes from free
    (GrantDenied if more than is free).  Installs nothing."""
    out = outcome((Not(a.open), "InvalidRequest"), (a.actual - a.gb > s.free, "GrantDenied"))
    return on_ok(out, s, s.set(charge=upd(s.charge, a.h, at(s.charge, a.h) + a.actual),
                               free=s.free - (a.actual - a.gb)))


def _s2_allocate(s: St, a: St):
    """``allocate_owned`` (holder 0) and ``load_weight`` (holder 1): the
    allocation transaction charges the footprint ``fp`` (GrantDenied if it is
    not free), then the device allocates it (or OutOfMemory, grant returned)."""
    out = outcome((a.fp > s.free, "GrantDenied"), (a.oom, "OutOfMemory"))
    return on_ok(out, s, _s2_install(s, a.h, a.fp))


def _s2_commit_owned(check: bool):
    """``commit_owned``: charge-then-commit ``n`` bytes of a reservation
    (``bad_range``: InvalidRange, S5's check; ``oom``: the device's answer)."""
    def step(s: St, a: St):
        pairs = [(a.bad_range, "InvalidRange")] + ([(a.n > s.free, "GrantDenied")] if check else [])
        out = outcome(*pairs, (a.oom, "OutOfMemory"))
        return on_ok(out, s, _s2_install(s, 0, a.n))
    return step


def _s2_grow(s: St, a: St):
    """``kv_grow`` by ``n`` bytes (holder 2): past the request's maximum,
    InvalidRange (``past``); nothing to grow, 0 or InvalidRequest
    (``refuse``); the growth not free, GrantDenied; an injected failure
    (``fail``) or OutOfMemory is rolled back; else charged, then committed."""
    grows = a.n > 0
    out = outcome((a.past, "InvalidRange"), (And(Not(grows), a.refuse), "InvalidRequest"),
                  (And(grows, a.n > s.free), "GrantDenied"), (And(grows, a.fail), "MemspecError"),
                  (And(grows, a.oom), "OutOfMemory"))
    return on_ok(out, s, _s2_install(s, 2, K.ite(grows, a.n, 0)))


_S2_OWNED = {"n": INT, "bad_range": BOOL, "oom": BOOL}
S2 = Proof(
    *catalog("S2"),
    fields={"committed": ARR, "charge": ARR, "free": INT},
    init=lambda s: And(s.committed == Z0(), s.charge == Z0(), s.free >= 0),
    inv=lambda s, h: And(0 <= at(s.committed, h), at(s.committed, h) <= at(s.charge, h), s.free >= 0),
    actions=[
        Act("reserve", {"n": INT}, _s2_reserve, pre=lambda s, a: a.n > 0),
        Act("cancel", {"gb": INT, "open": BOOL}, _s2_cancel, pre=lambda s, a: a.gb > 0),
        Act("commit", {"h": INT, "gb": INT, "actual": INT, "open": BOOL}, _s2_commit,
            pre=lambda s, a: And(a.gb > 0, a.actual >= 0), objs=("h",)),
        Act("allocate", {"h": INT, "fp": INT, "oom": BOOL}, _s2_allocate,
            pre=lambda s, a: And(a.fp > 0, Or(a.h == 0, a.h == 1)), objs=("h",)),
        Act("commit_owned", _S2_OWNED, _s2_commit_owned(True), pre=lambda s, a: a.n > 0),
        Act("grow", {"n": INT, "past": BOOL, "refuse": BOOL, "fail": BOOL, "oom": BOOL}, _s2_grow),
    ],
    unguarded=Act("commit_owned", _S2_OWNED, _s2_commit_owned(False), pre=lambda s, a: a.n > 0),
    guard="commit_owned requires the Governor to charge all the bytes (else GrantDenied) before mapping them",
    bmc_depth=2,
)


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
# S4 fence-release  (and the queue used by S7)
# ==========================================================================

# Streams are unbounded: ``iss[st]`` / ``done[st]`` count the work items
# launched on / completed by stream ``st``; ``use[x][st]`` is the last item of
# stream ``st`` that used object ``x`` (0: none).  An object is anything whose
# release goes through the deferred-free queue (seed 000: *owning handle Drop
# -> enter the EP/context deferred-free queue -> wait for the related
# stream/fence to finish -> allocator actually frees*): an owning allocation,
# a weight, an owning reservation, a KV request, or a queued decommit of some
# of a reservation's pages.

def _fence_fields() -> dict[str, str]:
    return {"astate": ARR, "use": ARR2, "iss": ARR, "done": ARR}


def _fence_init(s: St) -> Any:
    return And(s.astate == Z0(), s.iss == Z0(), s.done == Z0(), s.use == z3.K(z3.IntSort(), Z0()))


def _q_alloc(s: St, a: St):
    """An object is made (an owning allocation): live, no work has used it yet."""
    return on_ok(z3.IntVal(OK), s, s.set(astate=upd(s.astate, a.x, LIVE), use=upd(s.use, a.x, Z0())))


def _q_use(s: St, a: St):
    """*H->>E: submit GPU work that uses the allocation*: one more work item
    on stream ``st``, recorded as the object's fence on that stream."""
    item = at(s.iss, a.st) + 1
    return on_ok(z3.IntVal(OK), s, s.set(iss=upd(s.iss, a.st, item),
                                         use=upd(s.use, a.x, upd(at(s.use, a.x), a.st, item))))


def _q_drop(s: St, a: St):
    """*Drop should be responsible for enqueuing*: a live object's release is
    queued (a second drop: DoubleFree); nothing is freed, no stream waited on."""
    out = outcome((at(s.astate, a.x) != LIVE, "DoubleFree"))
    return on_ok(out, s, s.set(astate=upd(s.astate, a.x, QUEUED)))


def _q_decommit(s: St, a: St):
    """A decommit of a live reservation's pages (``bad``: a page of the range
    is not committed, InvalidRange) queues their release as a new object
    ``y``, behind every fence recorded on the reservation so far."""
    out = outcome((a.bad, "InvalidRange"))
    return on_ok(out, s, s.set(astate=upd(s.astate, a.y, QUEUED), use=upd(s.use, a.y, at(s.use, a.x))))


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
    frees*); the others stay queued.  Unguarded: every queued release runs."""
    def step(s: St, a: St):
        j = z3.Int("poll_j")
        runs = And(at(s.astate, j) == QUEUED, _fences_done(s, j) if check else z3.BoolVal(True))
        return on_ok(z3.IntVal(OK), s, s.set(astate=z3.Lambda([j], z3.If(runs, FREED, at(s.astate, j)))))
    return step


_X = {"x": INT}
_STREAM_PRE = lambda s, a: a.st >= 0  # noqa: E731
_LIVE_X = lambda s, a: at(s.astate, a.x) == LIVE  # noqa: E731
_FENCE_ACTS = [
    Act("allocate", _X, _q_alloc, pre=lambda s, a: at(s.astate, a.x) == NONE, objs=("x",)),
    Act("use", {"x": INT, "st": INT}, _q_use, pre=lambda s, a: And(_STREAM_PRE(s, a), _LIVE_X(s, a)), objs=("x",)),
    Act("drop", _X, _q_drop, pre=lambda s, a: at(s.astate, a.x) != NONE, objs=("x",)),
    # close_owned, unload_weight, kv_close: the same enqueue, drawn on live objects only
    Act("close", _X, _q_drop, pre=_LIVE_X, objs=("x",)),
    Act("decommit", {"x": INT, "y": INT, "bad": BOOL}, _q_decommit,
        pre=lambda s, a: And(_LIVE_X(s, a), at(s.astate, a.y) == NONE), objs=("x", "y")),
    Act("synchronize", {"st": INT, "every": BOOL}, _q_sync, pre=_STREAM_PRE),
    Act("progress", {"st": INT, "k": INT}, _q_progress, pre=lambda s, a: And(_STREAM_PRE(s, a), a.k >= 1)),
    Act("poll", {}, _q_poll(True)),
]


def _s4_inv(s: St, o: Any) -> Any:
    st = z3.Int("inv_st")
    u, iss, done = at(at(s.use, o), st), at(s.iss, st), at(s.done, st)
    return z3.ForAll([st], And(0 <= done, done <= iss, u <= iss,
                                  Implies(at(s.astate, o) == FREED, u <= done)))


S4 = Proof(
    *catalog("S4"),
    fields=_fence_fields(), init=_fence_init, inv=_s4_inv, actions=list(_FENCE_ACTS),
    unguarded=Act("poll", {}, _q_poll(False)),
    guard="the deferred-free queue frees only after every fence recorded on the allocation completed",
    bmc_depth=4,
)


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


def _s5_commit(s: St, a: St):
    n = a.hi - a.lo
    pg = z3.Int("pg")
    row = at(s.pc, a.r)
    new_row = z3.Lambda([pg], Or(at(row, pg), _in_range(pg, a.lo, a.hi, s.page)))
    out = outcome(*_s5_handle_errors(s, a.r),
                  (Not(K.range_ok(a.lo, a.hi, at(s.rsize, a.r), s.page)), "InvalidRange"),
                  (_some_page(s, a.r, a.lo, a.hi, True), "InvalidRange"),
                  (_oom(s, n, a.oom), "OutOfMemory"))
    return on_ok(out, s, s.set(pc=upd(s.pc, a.r, new_row), reported=upd(s.reported, a.r, at(s.reported, a.r) + n),
                               physical=s.physical + n, ctot=s.ctot + n, ret=n))


def _s5_decommit(s: St, a: St):
    n = a.hi - a.lo
    pg = z3.Int("pg")
    row = at(s.pc, a.r)
    new_row = z3.Lambda([pg], And(at(row, pg), Not(_in_range(pg, a.lo, a.hi, s.page))))
    out = outcome(*_s5_handle_errors(s, a.r),
                  (Not(K.range_ok(a.lo, a.hi, at(s.rsize, a.r), s.page)), "InvalidRange"),
                  (_some_page(s, a.r, a.lo, a.hi, False), "InvalidRange"))
    return on_ok(out, s, s.set(pc=upd(s.pc, a.r, new_row), reported=upd(s.reported, a.r, at(s.reported, a.r) - n),
                               physical=s.physical - n, ctot=s.ctot - n, ret=n))


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
    if name == "committed_bytes":
        return Implies(out == OK, s2.ret == at(s.reported, a.r))
    if name == "release_reservation":
        return Implies(out == OK, And(s2.ret == at(s.reported, a.r), s.physical - s2.physical == s2.ret))
    return z3.BoolVal(True)


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
        Act("commit_range", _SPAN_OOM, _s5_commit, pre=_CAP),
        Act("decommit_range", _SPAN, _s5_decommit, pre=_CAP),
        Act("committed_bytes", {"r": INT}, _s5_committed_bytes, pre=_CAP),
        Act("release_reservation", {"r": INT}, _s5_release, pre=_CAP),
        Act("reserve_owned", _S5_RES, _s5_reserve_owned(True), pre=lambda s, a: at(s.ostate, a.r) == NONE),
        Act("commit_owned", {**_SPAN, "bad": BOOL, "oom": BOOL}, _s5_commit_owned,
            pre=lambda s, a: at(s.ostate, a.r) == LIVE),
        Act("kv_open", {"q": INT, "bad": BOOL, "prefix": BOOL}, _s5_kv_open, pre=lambda s, a: at(s.kst, a.q) == NONE),
    ],
    unguarded=Act("reserve_owned", _S5_RES, _s5_reserve_owned(False), pre=lambda s, a: at(s.ostate, a.r) == NONE),
    guard="reserve through the binding needs the installed mechanism's VirtualBacking (else Unsupported), never "
          "a reservation no commit can back",
    step_prop=_s5_prop,
    bmc_depth=1,
)


# ==========================================================================
# S6 holder-chooses  (mirrors spec/governor.py issue_ticket, spec/holders.py
# set_hot and respond: the Governor only issues tickets; a holder answers by
# choosing its own victims -- ModelResidency only cold resident weights,
# KvPageStore none, reporting at most what its own releases refunded)
# ==========================================================================

T_PENDING, T_GRANTED, T_CLAIMED, T_CANCELLED, T_TIMED_OUT = 1, 2, 3, 4, 5
H_WEIGHTS, H_KV = 0, 1  # the holders that answer tickets


def _s6_issue(s: St, a: St):
    out = outcome((a.n <= 0, "InvalidRequest"))
    return on_ok(out, s, s.set(tstate=upd(s.tstate, a.t, T_PENDING), held=upd(s.held, a.t, 0),
                               amount=upd(s.amount, a.t, a.n)))


def _s6_set_hot(s: St, a: St):
    return on_ok(z3.IntVal(OK), s, s.set(hot=upd(s.hot, a.w, a.h)))


def _s6_evict(s: St, w: Any, go: Any) -> St:
    """holders.evict(by="holder", pressure=True) of weight ``w`` when ``go``:
    it leaves residency; a hot one is recorded (S6's ``hot_evictions``)."""
    return s.set(res=upd(s.res, w, And(at(s.res, w), Not(go))),
                 hot_ev=s.hot_ev + K.ite(And(go, at(s.hot, w)), 1, 0))


def _s6_respond(s: St, a: St):
    """``holder`` answers ticket ``t``: ModelResidency evicts ``nv`` (0..2)
    victims ``v1``, ``v2`` and reports their bytes; KvPageStore evicts none and
    reports ``r``, at most the ``refunded`` bytes its own releases gave back
    (more is an overclaim).  The ticket holds the report; granted once it
    holds its amount.  A terminal ticket: InvalidTicket."""
    out = outcome((Or(at(s.tstate, a.t) == 0, _terminal(at(s.tstate, a.t))), "InvalidTicket"))
    wts = a.holder == H_WEIGHTS
    s1 = _s6_evict(_s6_evict(s, a.v1, And(wts, a.nv >= 1)), a.v2, And(wts, a.nv >= 2))
    r = K.ite(wts, K.ite(a.nv >= 1, at(s.wb, a.v1), 0) + K.ite(a.nv >= 2, at(s.wb, a.v2), 0), a.r)
    held = at(s.held, a.t) + r
    st = K.ite(Or(at(s.tstate, a.t) == T_GRANTED, held >= at(s.amount, a.t)), T_GRANTED, at(s.tstate, a.t))
    return on_ok(out, s, s1.set(held=upd(s.held, a.t, held), tstate=upd(s.tstate, a.t, st),
                                over=s.over + K.ite(And(Not(wts), a.r > a.refunded), 1, 0)))


def _s6_pre(check: bool):
    """The holder's choice: a known ticket; victims distinct weights (and,
    the guard, resident and cold); KV reports ``0 <= r <= refunded``."""
    def pre(s: St, a: St) -> Any:
        def ok_victim(v: Any) -> Any:
            return And(at(s.res, v), Not(at(s.hot, v))) if check else at(s.res, v)
        wts = And(a.holder == H_WEIGHTS, 0 <= a.nv, a.nv <= 2, Implies(a.nv >= 1, ok_victim(a.v1)),
                     Implies(a.nv >= 2, And(ok_victim(a.v2), a.v2 != a.v1)))
        kv = And(a.holder == H_KV, a.nv == 0, 0 <= a.r, a.r <= a.refunded)
        return And(at(s.tstate, a.t) != 0, Or(wts, kv))
    return pre


def _s6_prop(name: str, s: St, a: St, out: Any, s2: St, o: Any) -> Any:
    if name == "issue_ticket":  # the Governor's own action takes nothing from any holder
        return at(s2.res, o) == at(s.res, o)
    if name == "respond":  # only the answering holder's weights move, and 0 is a valid answer
        return And(Implies(a.holder != H_WEIGHTS, at(s2.res, o) == at(s.res, o)),
                      Implies(And(a.holder == H_KV, a.r == 0, at(s.tstate, a.t) == T_PENDING), out == OK))
    return z3.BoolVal(True)


_S6_RESPOND = {"t": INT, "holder": INT, "nv": INT, "v1": INT, "v2": INT, "r": INT, "refunded": INT}
S6 = Proof(
    *catalog("S6"),
    fields={"res": BARR, "hot": BARR, "wb": ARR, "tstate": ARR, "held": ARR, "amount": ARR,
            "gov_ev": INT, "hot_ev": INT, "over": INT},
    # any weights resident (hot or cold) and of any size >= 0: load_weight (S8/S11's) may have loaded them
    init=lambda s: And(s.tstate == Z0(), s.held == Z0(), s.gov_ev == 0, s.hot_ev == 0, s.over == 0,
                          z3.ForAll([z3.Int("w0")], at(s.wb, z3.Int("w0")) >= 0)),
    inv=lambda s, o: And(s.gov_ev == 0, s.hot_ev == 0, s.over == 0, at(s.held, o) >= 0,
                            Implies(at(s.res, o), at(s.wb, o) >= 0)),
    actions=[
        Act("issue_ticket", {"t": INT, "n": INT}, _s6_issue, pre=lambda s, a: at(s.tstate, a.t) == 0, objs=("t",)),
        Act("set_hot", {"w": INT, "h": BOOL}, _s6_set_hot, pre=lambda s, a: at(s.res, a.w), objs=("w",)),
        Act("respond", _S6_RESPOND, _s6_respond, pre=_s6_pre(True), objs=("t", "v1", "v2")),
    ],
    unguarded=Act("respond", _S6_RESPOND, _s6_respond, pre=_s6_pre(False), objs=("t", "v1", "v2")),
    guard="ModelResidency's victims are cold resident weights (a hot weight is never released under pressure)",
    step_prop=_s6_prop,
    bmc_depth=2,
)


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


S7 = Proof(
    *catalog("S7"),
    fields=_fence_fields(), init=_fence_init, inv=_s4_inv,
    # the queue machine of S4, action by action (so S4's agreement samples are S7's too)
    actions=list(_FENCE_ACTS),
    unguarded=Act("drop", _X, _s7_drop_frees, pre=_FENCE_ACTS[2].pre, objs=("x",)),
    guard="Drop only enqueues on the deferred-free queue",
    step_prop=_s7_prop,
    bmc_depth=2,
)


# ==========================================================================
# S8 exact-accounting and S11 ledger-conservation: ONE ledger model
# (mirrors spec/governor.py, spec/manager.py, spec/holders.py, spec/ep.py,
# spec/vmm.py commit_owned, spec/eager.py allocate/deallocate)
#
# The Governor's ledger (cap, free, granted, charged), the spec's running
# totals (open grants ``og``, ticket holdings ``th``, per holder: charge
# ``cb``, live footprints ``lb``, queued refunds ``qb``, unrefunded leases
# ``lsb``) and the records they summarise: grants, tickets, and *charge
# items* -- every charged thing a holder has: an owning allocation, a weight,
# an owning reservation's committed bytes, a KV request's own pages (live),
# a release waiting in the deferred-free queue (queued), a lease.  Each
# summary is checked by a prefix-sum ghost over dense ids (keyed by holder
# for the per-holder ones), part of the invariant, so nothing is assumed.
# What the tickets hold is split in two ghosts, pending (``PTP``) and the
# rest (``PTG``), so that reconfigure's "every pending ticket gives its bytes
# back" is one step (as S15's machine does it).
# The device side (mechanism level): physical bytes against capacity, the
# sum of what the live mechanism objects hold (*device objects*: own
# allocations, backing reservations' committed bytes, physical handles not
# freed, private copies of mappings; a live shared mapping holds no bytes of
# its own, its handle does).
# ==========================================================================

def _ledger(s: St) -> K.Ledger:
    return K.Ledger(s.cap, s.free, s.granted, s.charged)


def _with_ledger(s: St, l: K.Ledger, **kw: Any) -> St:
    return s.set(cap=l.capacity, free=l.free, granted=l.granted, charged=l.charged, **kw)


SESSION_H, WEIGHTS_H, KV_H = 0, 1, 2          # the spec's holders
HOLDERS_H = (SESSION_H, WEIGHTS_H, KV_H)
G_OPEN, G_COMMITTED, G_CANCELLED = 1, 2, 3    # grant states
I_LIVE, I_QUEUED, I_LEASE, I_GONE = 1, 2, 3, 4  # charge-item states
K_ALLOC, K_WEIGHT, K_KV, K_LEASE, K_PIECE, K_RES = 1, 2, 3, 4, 5, 6  # charge-item kinds


def _kput(P2: Any, n: Any, key: Any, v: Any) -> Any:
    """Keyed prefix sums after appending id ``n`` contributing ``v`` under ``key``."""
    k = z3.Int("kp_k")
    return z3.Lambda([k], prefix_append(at(P2, k), n, z3.If(k == key, v, 0)))


def _kchg(P2: Any, x: Any, key: Any, d: Any) -> Any:
    """Keyed prefix sums after id ``x``'s contribution under ``key`` changed by ``d``."""
    k = z3.Int("kc_k")
    return z3.Lambda([k], prefix_change(at(P2, k), x, z3.If(k == key, d, 0)))


_BUCKETS = (("PLV", I_LIVE), ("PQ", I_QUEUED), ("PLS", I_LEASE))


def _contrib(st: Any, b: Any, which: int) -> Any:
    return z3.If(st == which, b, 0)


def _charged(st: Any, b: Any) -> Any:
    """What an item adds to ``charged``: its bytes while live, queued or a lease."""
    return z3.If(And(st >= I_LIVE, st <= I_LEASE), b, 0)


#: the holder every kind of charge item belongs to (a queued piece: any)
_KIND_HOLDER = {K_ALLOC: SESSION_H, K_WEIGHT: WEIGHTS_H, K_KV: KV_H, K_LEASE: SESSION_H, K_RES: SESSION_H}


def _item_set(s: St, x: Any, nst: Any, nb: Any) -> St:
    """Charge item ``x`` (existing) now in state ``nst`` with ``nb`` bytes: the ghosts follow."""
    h, st, b = at(s.ih, x), at(s.ist, x), at(s.ib, x)
    kw = {P: _kchg(s[P], x, h, _contrib(nst, nb, w) - _contrib(st, b, w)) for P, w in _BUCKETS}
    return s.set(ist=upd(s.ist, x, nst), ib=upd(s.ib, x, nb), PC=prefix_change(s.PC, x, _charged(nst, nb) - _charged(st, b)),
                 **kw)


def _item_new(s: St, h: Any, kind: int, nst: int, b: Any) -> St:
    """A new charge item (id ``n``) of holder ``h``."""
    kw = {P: _kput(s[P], s.n, h, _contrib(z3.IntVal(nst), b, w)) for P, w in _BUCKETS}
    return s.set(ist=upd(s.ist, s.n, nst), ih=upd(s.ih, s.n, h), ik=upd(s.ik, s.n, kind), ib=upd(s.ib, s.n, b),
                 PC=prefix_append(s.PC, s.n, _charged(z3.IntVal(nst), b)), n=s.n + 1, **kw)


def _hadd(arr: Any, h: Any, d: Any) -> Any:
    return upd(arr, h, at(arr, h) + d)


def _charge(s: St, h: Any, planned: Any, fp: Any, **kw: Any) -> St:
    """governor.charge_at_footprint: grant ``planned``, charge the footprint ``fp`` to ``h``."""
    l = K.commit_grant(K.grant(_ledger(s), planned), planned, fp)
    return _with_ledger(s, l, cb=_hadd(s.cb, h, fp), **kw)


def _refund(s: St, h: Any, b: Any, **kw: Any) -> St:
    """ep.refund: a charge of ``b`` bytes of holder ``h`` released."""
    return _with_ledger(s, K.refund(_ledger(s), b), cb=_hadd(s.cb, h, -b), **kw)


# -- the Governor: grants and leases (spec/governor.py) ---------------------

def _l_reserve(check: bool):
    def step(s: St, a: St):
        l = _ledger(s)
        pairs = [(a.nb <= 0, "InvalidRequest")]
        if check:
            pairs.append((Not(K.can_grant(l, a.nb)), "GrantDenied"))
        return on_ok(outcome(*pairs), s, _with_ledger(s, K.grant(l, a.nb), gst=upd(s.gst, a.g, G_OPEN),
                                                     gb=upd(s.gb, a.g, a.nb), og=s.og + a.nb,
                                                     PG=prefix_append(s.PG, s.ng, a.nb), ng=s.ng + 1))
    return step


def _l_commit(check: bool):
    def step(s: St, a: St):
        b = at(s.gb, a.g)
        pairs = [(at(s.gst, a.g) != G_OPEN, "InvalidRequest")] if check else []
        pairs.append((Not(K.can_commit(_ledger(s), b, a.actual)), "GrantDenied"))
        s1 = _with_ledger(s, K.commit_grant(_ledger(s), b, a.actual), gst=upd(s.gst, a.g, G_COMMITTED), og=s.og - b,
                          PG=prefix_change(s.PG, a.g, -b if check else -_contrib(at(s.gst, a.g), b, G_OPEN)),
                          cb=_hadd(s.cb, SESSION_H, a.actual), lsb=_hadd(s.lsb, SESSION_H, a.actual))
        return on_ok(outcome(*pairs), s, _item_new(s1, SESSION_H, K_LEASE, I_LEASE, a.actual))
    return step


def _l_cancel(s: St, a: St):
    b = at(s.gb, a.g)
    out = outcome((at(s.gst, a.g) != G_OPEN, "InvalidRequest"))
    return on_ok(out, s, _with_ledger(s, K.cancel_grant(_ledger(s), b), gst=upd(s.gst, a.g, G_CANCELLED),
                                      og=s.og - b, ret=b, PG=prefix_change(s.PG, a.g, -b)))


def _l_refund_lease(s: St, a: St):
    b, h = at(s.ib, a.x), at(s.ih, a.x)
    out = outcome((at(s.ist, a.x) != I_LEASE, "InvalidRequest"))
    s1 = _refund(s, h, b, lsb=_hadd(s.lsb, h, -b), ret=b)
    return on_ok(out, s, _item_set(s1, a.x, I_GONE, b))


# -- the allocation transaction (spec/manager.py, holders.py, vmm.py) --------

def _l_allocate_owned(s: St, a: St):
    """allocate_owned: grant ``size``, allocate (the device may refuse:
    ``oom``), commit the charge at the footprint (which must fit, else the
    plan is refused); every failure returns the grant."""
    l0 = _ledger(s)
    l1 = K.grant(l0, a.size)
    out = outcome((a.size <= 0, "InvalidRequest"), (Not(K.can_grant(l0, a.size)), "GrantDenied"),
                  (a.oom, "OutOfMemory"), (Not(K.can_commit(l1, a.size, a.fp)), "GrantDenied"))
    s1 = _charge(s, SESSION_H, a.size, a.fp, lb=_hadd(s.lb, SESSION_H, a.fp))
    return on_ok(out, s, _item_new(s1, SESSION_H, K_ALLOC, I_LIVE, a.fp))


def _l_load_weight(s: St, a: St):
    out = outcome((Not(K.can_grant(_ledger(s), a.nb)), "GrantDenied"), (a.oom, "OutOfMemory"))
    s1 = _charge(s, WEIGHTS_H, a.nb, a.nb, lb=_hadd(s.lb, WEIGHTS_H, a.nb))
    return on_ok(out, s, _item_new(s1, WEIGHTS_H, K_WEIGHT, I_LIVE, a.nb))


def _l_commit_owned(s: St, a: St):
    """commit_owned on reservation item ``x``: charge-then-commit ``nb`` bytes."""
    out = outcome((a.bad, "InvalidRange"), (Not(K.can_grant(_ledger(s), a.nb)), "GrantDenied"),
                  (a.oom, "OutOfMemory"))
    s1 = _charge(s, SESSION_H, a.nb, a.nb, lb=_hadd(s.lb, SESSION_H, a.nb))
    return on_ok(out, s, _item_set(s1, a.x, I_LIVE, at(s.ib, a.x) + a.nb))


def _l_kv_grow(s: St, a: St):
    """kv_grow of request item ``x`` by ``d`` bytes (the page-rounded growth):
    ``past``: beyond max_bytes; ``refuse``: nothing to grow answered
    InvalidRequest; ``fail``: a failure injected at step 4/5; ``oom``."""
    out = outcome((a.past, "InvalidRange"), (And(a.d <= 0, a.refuse), "InvalidRequest"), (a.d <= 0, "ok"),
                  (Not(K.can_grant(_ledger(s), a.d)), "GrantDenied"), (a.fail, "MemspecError"),
                  (a.oom, "OutOfMemory"))
    s1 = _item_set(_charge(s, KV_H, a.d, a.d, lb=_hadd(s.lb, KV_H, a.d)), a.x, I_LIVE, at(s.ib, a.x) + a.d)
    return out, merge(And(out == OK, a.d > 0), s1, s)


# -- releases: drop, unload, the deferred-free queue (spec/ep.py) -------------

def _enqueue(s: St, x: Any) -> St:
    """drop_owned: a live item's footprint moves from live to queued (never refunded here)."""
    h, b = at(s.ih, x), at(s.ib, x)
    return _item_set(s.set(lb=_hadd(s.lb, h, -b), qb=_hadd(s.qb, h, b)), x, I_QUEUED, b)


def _run(s: St, x: Any) -> St:
    """ep.run_entry: a queued release runs; its holder's charge is refunded."""
    h, b = at(s.ih, x), at(s.ib, x)
    return _item_set(_refund(s, h, b, qb=_hadd(s.qb, h, -b)), x, I_GONE, b)


def _l_drop(s: St, a: St):
    out = outcome((at(s.ist, a.x) != I_LIVE, "DoubleFree"))
    return on_ok(out, s, _enqueue(s, a.x))


def _l_unload(s: St, a: St):
    return on_ok(z3.IntVal(OK), s, _enqueue(s, a.x))


def _l_poll(s: St, a: St):
    """poll runs the releases whose fences are done, one release per step
    (``run_done`` runs them one after another); ``none``: nothing was done."""
    return on_ok(z3.IntVal(OK), s, merge(a.none, s, _run(s, a.x)))


# -- pressure tickets (spec/governor.py, holders.py respond) ----------------

def _tpend(st: Any, h: Any) -> Any:
    """What a ticket in state ``st`` holding ``h`` adds to the pending ghost ``PTP``."""
    return z3.If(st == T_PENDING, h, 0)


def _trest(st: Any, h: Any) -> Any:
    """... and to ``PTG`` (every other state; a terminal ticket holds 0)."""
    return z3.If(st == T_PENDING, 0, h)


def _tmove(s: St, t: Any, st2: Any, h2: Any) -> dict[str, Any]:
    """The ticket ghosts after ticket ``t`` goes to state ``st2`` holding ``h2``."""
    st, h = at(s.tst, t), at(s.tb, t)
    return {"PTP": prefix_change(s.PTP, t, _tpend(st2, h2) - _tpend(st, h)),
            "PTG": prefix_change(s.PTG, t, _trest(st2, h2) - _trest(st, h))}


def _tend(s: St, t: Any, st: int) -> St:
    """governor.ticket_end: the ticket's holdings go back to free, once."""
    h = at(s.tb, t)
    return _with_ledger(s, K.return_grant(_ledger(s), h), tst=upd(s.tst, t, st), tb=upd(s.tb, t, 0), th=s.th - h,
                        ret=h, **_tmove(s, t, z3.IntVal(st), z3.IntVal(0)))


def _l_claim(s: St, a: St):
    out = outcome((at(s.tst, a.t) != T_GRANTED, "InvalidTicket"))
    h = at(s.tb, a.t)
    return on_ok(out, s, s.set(tst=upd(s.tst, a.t, T_CLAIMED), tb=upd(s.tb, a.t, 0), th=s.th - h, og=s.og + h, ret=h,
                               **_tmove(s, a.t, z3.IntVal(T_CLAIMED), z3.IntVal(0)),
                               gst=upd(s.gst, a.g, G_OPEN), gb=upd(s.gb, a.g, h),
                               PG=prefix_append(s.PG, s.ng, h), ng=s.ng + 1))


def _l_cancel_ticket(s: St, a: St):
    out = outcome((_terminal(at(s.tst, a.t)), "InvalidTicket"))
    return on_ok(out, s, _tend(s, a.t, T_CANCELLED))


def _l_expire(s: St, a: St):
    """expire times out every due live ticket, one ticket per step; ``none``: none due."""
    return on_ok(z3.IntVal(OK), s, merge(a.none, s, _tend(s, a.t, T_TIMED_OUT)))


def _l_reconfigure(s: St, a: St):
    """reconfigure: a new generation (not part of the ledger); every pending
    ticket fails at once, and what they hold (``PTP[nt]``) goes back to free."""
    i = z3.Int("l_rc_i")
    pend = lambda x: at(s.tst, x) == T_PENDING  # noqa: E731
    back = at(s.PTP, s.nt)
    return on_ok(z3.IntVal(OK), s, _with_ledger(
        s, K.return_grant(_ledger(s), back), th=s.th - back,
        tst=z3.Lambda([i], z3.If(pend(i), T_FAILED, at(s.tst, i))), tb=z3.Lambda([i], z3.If(pend(i), 0, at(s.tb, i))),
        PTP=Z0()))


def _l_respond(s: St, a: St):
    """A holder answers ticket ``t``: ``mode`` 0 nothing released; 1 a queued
    release ``x`` of its own ran (0 reported); 2 the cold weight ``x`` was its
    victim: dropped, run, and its bytes reported.  The reported bytes move
    from free into the ticket (ticket_receive)."""
    out = outcome((_terminal(at(s.tst, a.t)), "InvalidTicket"))
    h, b, st0 = at(s.ih, a.x), at(s.ib, a.x), at(s.ist, a.x)
    # the release runs: a queued one (mode 1), or the victim's, queued and run at once (mode 2: live ->
    # refunded, its queued bytes come and go); either way the item's charge is refunded
    gone = _item_set(_refund(s, h, b, lb=_hadd(s.lb, h, -_contrib(st0, b, I_LIVE)),
                             qb=_hadd(s.qb, h, -_contrib(st0, b, I_QUEUED))), a.x, I_GONE, b)
    ran = merge(a.mode == 0, s, gone)
    r = K.ite(a.mode == 2, at(s.ib, a.x), 0)
    held = at(s.tb, a.t) + r
    nst = K.ite(And(at(s.tst, a.t) == T_PENDING, held >= at(s.ta, a.t)), T_GRANTED, at(s.tst, a.t))
    s1 = _with_ledger(ran, K.grant_from_free(_ledger(ran), r), tb=upd(s.tb, a.t, held), tst=upd(s.tst, a.t, nst),
                      th=s.th + r, **_tmove(ran, a.t, nst, held))
    return on_ok(out, s, s1)


# -- the device (mechanism level: spec/eager.py, vmm.py, shared.py) ----------
# Device objects ``mst``/``mb`` (kind ``mk``): an own allocation (its
# footprint), a backing reservation (its committed bytes), a physical handle
# (its size; ``hrel``: its creator released it, ``hmaps``: its mapping
# count), a mapping of handle ``mh`` (live shared: M_SHARED, no bytes of its
# own; after copy-on-write: live, its private bytes).  A foreign object (made
# by the twin) and a reservation that is misused in a way S11 does not talk
# about (a misaligned range, a page already (not) committed) are the
# arguments ``foreign`` / ``bad``; the twin's share of the device, ``oom``.

M_ALLOC, M_RES, M_HANDLE, M_MAP = 1, 2, 3, 4  # device-object kinds
M_SHARED = 5                                 # a live mapping on its handle's pages (no bytes of its own)


def _m_new(s: St, kind: int, b: Any, **kw: Any) -> St:
    """A new live device object (id ``nm``) of ``b`` bytes: the device takes them."""
    return s.set(phys=s.phys + b, mst=upd(s.mst, s.nm, I_LIVE), mb=upd(s.mb, s.nm, b), mk=upd(s.mk, s.nm, kind),
                 PMB=prefix_append(s.PMB, s.nm, b), nm=s.nm + 1, **kw)


def _m_set(s: St, x: Any, nst: Any, nb: Any) -> St:
    """Device object ``x`` now in state ``nst`` holding ``nb``: physical bytes and the ghost follow."""
    d = _contrib(nst, nb, I_LIVE) - _contrib(at(s.mst, x), at(s.mb, x), I_LIVE)
    return s.set(phys=s.phys + d, mst=upd(s.mst, x, nst), mb=upd(s.mb, x, nb), PMB=prefix_change(s.PMB, x, d))


def _m_allocate(check: bool):
    def step(s: St, a: St):
        pairs = [(Or(a.size <= 0, a.bad_align), "InvalidRequest")]
        if check:
            pairs.append((s.phys + a.fp > s.mcap, "OutOfMemory"))
        pairs.append((a.oom, "OutOfMemory"))
        return on_ok(outcome(*pairs), s, _m_new(s, M_ALLOC, a.fp))
    return step


def _m_release(s: St, a: St):
    """deallocate: a live allocation it made is freed and its footprint returned."""
    b = at(s.mb, a.x)
    out = outcome((a.foreign, "ForeignAllocation"), (at(s.mst, a.x) != I_LIVE, "StaleHandle"))
    return on_ok(out, s, s.set(phys=s.phys - b, mst=upd(s.mst, a.x, I_GONE), ret=b,
                               PMB=prefix_change(s.PMB, a.x, -b)))


def _m_commit_range(s: St, a: St):
    """VirtualBacking.commit_range of ``nb`` bytes on reservation ``x``:
    foreign, released, or a range that is not legal and uncommitted
    (``bad``) are refused; OutOfMemory exactly when ``physical + nb`` exceeds
    the capacity (or the twin holds the rest: ``oom``); else the device
    takes ``nb`` bytes for ``x``."""
    out = outcome((a.foreign, "ForeignAllocation"), (at(s.mst, a.x) != I_LIVE, "StaleHandle"), (a.bad, "InvalidRange"),
                  (s.phys + a.nb > s.mcap, "OutOfMemory"), (a.oom, "OutOfMemory"))
    return on_ok(out, s, _m_set(s, a.x, I_LIVE, at(s.mb, a.x) + a.nb).set(ret=a.nb))


def _m_decommit_range(s: St, a: St):
    """decommit_range: every page of the range committed (else ``bad``:
    InvalidRange); its ``nb`` bytes go back to the device."""
    out = outcome((a.foreign, "ForeignAllocation"), (at(s.mst, a.x) != I_LIVE, "StaleHandle"), (a.bad, "InvalidRange"))
    return on_ok(out, s, _m_set(s, a.x, I_LIVE, at(s.mb, a.x) - a.nb).set(ret=a.nb))


def _m_release_reservation(s: St, a: St):
    """release_reservation: foreign or released already refused; what is
    still committed goes back to the device (and is returned)."""
    out = outcome((a.foreign, "ForeignAllocation"), (at(s.mst, a.x) != I_LIVE, "StaleHandle"))
    return on_ok(out, s, _m_set(s, a.x, I_GONE, 0).set(ret=at(s.mb, a.x)))


def _m_create(s: St, a: St):
    """SharedMapping.create: ``size`` (a positive page multiple, else
    ``bad``) physical bytes taken once; OutOfMemory exactly when they do not fit."""
    out = outcome((a.bad, "InvalidRequest"), (s.phys + a.size > s.mcap, "OutOfMemory"), (a.oom, "OutOfMemory"))
    return on_ok(out, s, _m_new(s, M_HANDLE, a.size, hrel=upd(s.hrel, s.nm, 0), hmaps=upd(s.hmaps, s.nm, 0)))


def _m_maybe_free(s: St, h: Any) -> St:
    """shared._maybe_free: a handle released, unmapped everywhere and not freed yet is freed."""
    due = And(at(s.hrel, h) != 0, at(s.hmaps, h) == 0, at(s.mst, h) == I_LIVE)
    return merge(due, _m_set(s, h, I_GONE, at(s.mb, h)), s)


def _m_release_handle(s: St, a: St):
    """release_handle: the creator's reference dropped (again: DoubleFree);
    returns the handle's size if no mapping remains (freed now), else 0."""
    out = outcome((at(s.hrel, a.x) != 0, "DoubleFree"))
    s1 = s.set(hrel=upd(s.hrel, a.x, 1), ret=K.ite(at(s.hmaps, a.x) == 0, at(s.mb, a.x), 0))
    return on_ok(out, s, _m_maybe_free(s1, a.x))


def _m_mapped(s: St, x: Any) -> Any:
    """``x`` is a live mapping (shared, or copied: private)."""
    return Or(at(s.mst, x) == I_LIVE, at(s.mst, x) == M_SHARED)


def _mapping_out(s: St, a: St, *more: tuple[Any, str]) -> Any:
    """A call on mapping ``x`` whose range is not exactly one live mapping (``bad``): InvalidRange.
    (The spec's reservation checks cannot fire: a reservation is not freed while mapped.)"""
    return outcome((Or(a.bad, Not(_m_mapped(s, a.x))), "InvalidRange"), *more)


def _m_unmap(s: St, a: St):
    """unmap of mapping ``x`` (of handle ``h``): private pages are freed;
    else the handle loses a mapping (freed if released and now unmapped)."""
    out = _mapping_out(s, a)
    private = _m_set(s, a.x, I_GONE, at(s.mb, a.x))
    shared = _m_maybe_free(s.set(mst=upd(s.mst, a.x, I_GONE), hmaps=upd(s.hmaps, a.h, at(s.hmaps, a.h) - 1)), a.h)
    return on_ok(out, s, merge(at(s.mst, a.x) == I_LIVE, private, shared).set(ret=at(s.mb, a.x)))


def _m_copy_on_write(s: St, a: St):
    """copy_on_write of shared mapping ``x``: private pages of its size are
    taken (OutOfMemory exactly when they do not fit), then the handle loses
    the mapping (freed if released and now unmapped)."""
    b = at(s.mb, a.x)
    out = _mapping_out(s, a, (at(s.mst, a.x) == I_LIVE, "InvalidRange"), (s.phys + b > s.mcap, "OutOfMemory"),
                       (a.oom, "OutOfMemory"))
    s1 = _m_set(s, a.x, I_LIVE, b)
    s1 = _m_maybe_free(s1.set(hmaps=upd(s1.hmaps, a.h, at(s1.hmaps, a.h) - 1), ret=b), a.h)
    return on_ok(out, s, s1)


def _sel(s: St, f: str, i: Any) -> Any:
    """``at(s[f], i)``, built once per state and concrete index ``i`` (an unrolled ghost reads each
    record several times: invariant agreement spent most of its time building the same selects)."""
    if not isinstance(i, int):
        return at(s[f], i)
    memo = s.__dict__.setdefault("_sel", {})
    t = memo.get((f, i))
    if t is None:
        t = memo[(f, i)] = at(s[f], i)
    return t


def _holder_part(s: St, o: Any) -> Any:
    """At a holder ``o`` (0..2): its charge is its live footprints, queued
    refunds and leases, each the sum over its charge items (keyed prefix-sum
    ghosts).  Nothing to say at any other object (on a concrete object
    outside 0..2 the formula is not built: invariant agreement's fast path)."""
    if z3.is_int_value(o) and not 0 <= o.as_long() <= 2:
        return z3.BoolVal(True)
    return Implies(And(0 <= o, o <= 2), And(
        at(s.cb, o) == at(s.lb, o) + at(s.qb, o) + at(s.lsb, o),
        *[And(prefix_count(s[P], s.n, o, lambda k, i, w=w: z3.If(And(_sel(s, "ist", i) == w,
                                                                             _sel(s, "ih", i) == k),
                                                                     _sel(s, "ib", i), 0)),
                 at(s[tot], o) == at(at(s[P], o), s.n))
          for (P, w), tot in zip(_BUCKETS, ("lb", "qb", "lsb"))]))


def _l_global(s: St) -> list[Any]:
    """The conjuncts of ``_l_inv`` that name no object: the ledger, the
    running totals and the prefix-sum ghosts over every record.  Built once
    per state (kept with it): invariant agreement states the invariant at
    every object of a projected state, and unrolling every ghost once per
    object dominated its cost."""
    hit = s.__dict__.get("_global")
    if hit is not None:
        return hit
    sel = lambda f, i: _sel(s, f, i)  # noqa: E731
    g = [
        K.ledger_ok(_ledger(s)), s.page > 0,
        s.granted == s.og + s.th, s.charged == at(s.cb, 0) + at(s.cb, 1) + at(s.cb, 2),
        prefix_sum(s.PC, s.n, lambda i: _charged(sel("ist", i), sel("ib", i))), s.charged == at(s.PC, s.n),
        prefix_sum(s.PG, s.ng, lambda i: _contrib(sel("gst", i), sel("gb", i), G_OPEN)), s.og == at(s.PG, s.ng),
        prefix_sum(s.PTP, s.nt, lambda i: _tpend(sel("tst", i), sel("tb", i))),
        prefix_sum(s.PTG, s.nt, lambda i: _trest(sel("tst", i), sel("tb", i))), s.th == at(s.PTP, s.nt) + at(s.PTG, s.nt),
        0 <= s.phys, s.phys <= s.mcap,
        prefix_sum(s.PMB, s.nm, lambda i: _contrib(sel("mst", i), sel("mb", i), I_LIVE)), s.phys == at(s.PMB, s.nm),
    ]
    s.__dict__["_global"] = g
    return g


def _l_inv(s: St, o: Any) -> Any:
    """The ledger is conserved; granted is the open grants plus the tickets'
    holdings; each holder's charge is its live footprints, queued refunds and
    leases; the running totals equal their records (prefix-sum ghosts); the
    device holds the sum of its live objects' bytes, at most its capacity."""
    def live_item(i: Any) -> Any:
        return at(s.ist, i) != 0
    return And(
        *_l_global(s),
        _holder_part(s, o),
        # charge items: dense ids, a holder, bytes >= 0
        Implies(live_item(o), And(0 <= o, o < s.n, 0 <= at(s.ih, o), at(s.ih, o) <= 2, at(s.ib, o) >= 0)),
        *[Implies(And(live_item(o), at(s.ik, o) == k), at(s.ih, o) == h) for k, h in _KIND_HOLDER.items()],
        # grants
        Implies(at(s.gst, o) != 0, And(0 <= o, o < s.ng, at(s.gb, o) >= 0)),
        # tickets
        Implies(at(s.tst, o) != 0, And(0 <= o, o < s.nt)), at(s.tb, o) >= 0,
        Implies(Or(at(s.tst, o) == 0, _terminal(at(s.tst, o))), at(s.tb, o) == 0),
        # device objects: dense ids, bytes >= 0
        Implies(at(s.mst, o) != 0, And(0 <= o, o < s.nm, at(s.mb, o) >= 0)),
    )


Z00 = lambda: z3.K(z3.IntSort(), Z0())  # noqa: E731
_L_FIELDS = {"cap": INT, "free": INT, "granted": INT, "charged": INT, "og": INT, "th": INT, "page": INT, "ret": INT,
             "cb": ARR, "lb": ARR, "qb": ARR, "lsb": ARR,
             "gst": ARR, "gb": ARR, "PG": ARR, "ng": INT,
             "tst": ARR, "tb": ARR, "ta": ARR, "PTP": ARR, "PTG": ARR, "nt": INT,
             "ist": ARR, "ih": ARR, "ik": ARR, "ib": ARR, "n": INT, "PLV": ARR2, "PQ": ARR2, "PLS": ARR2, "PC": ARR,
             "phys": INT, "mcap": INT, "mst": ARR, "mb": ARR, "PMB": ARR, "nm": INT,
             "mk": ARR, "hrel": ARR, "hmaps": ARR, "mh": ARR}


_L_COUNTS = ("n", "ng", "nt", "nm")  # the dense-id counts of the ghosts


def _l_init(s: St) -> Any:
    return And(s.cap >= 0, s.free == s.cap, s.granted == 0, s.charged == 0, s.og == 0, s.th == 0, s.page > 0,
                  s.cb == Z0(), s.lb == Z0(), s.qb == Z0(), s.lsb == Z0(),
                  s.gst == Z0(), s.ng == 0, at(s.PG, 0) == 0, s.tst == Z0(), s.tb == Z0(), s.nt == 0,
                  at(s.PTP, 0) == 0, at(s.PTG, 0) == 0,
                  s.ist == Z0(), s.n == 0, s.PLV == Z00(), s.PQ == Z00(), s.PLS == Z00(), at(s.PC, 0) == 0,
                  s.phys == 0, s.mcap >= 0, s.mst == Z0(), s.nm == 0, at(s.PMB, 0) == 0)


def _l_inst(s: St, o: Any, a: St) -> list:
    """No further instance: ``charged`` is itself a checked prefix sum over
    the items (so a refund of one item's bytes keeps it >= 0), and each
    holder's buckets are stated at the invariant's free object."""
    return []


def _kind(k: int):
    return lambda s, a: at(s.ik, a.x) == k


_ITEM = lambda s, a: at(s.ist, a.x) != 0  # noqa: E731


def _m_kind(k: int):
    """``x`` is a device object of kind ``k``."""
    return lambda s, a: And(at(s.mst, a.x) != 0, at(s.mk, a.x) == k)


_M_SPAN = {"x": INT, "nb": INT, "foreign": BOOL, "bad": BOOL, "oom": BOOL}
_M_MAPPING = {"x": INT, "h": INT, "bad": BOOL}


def _m_mapping_pre(s: St, a: St) -> Any:
    """``x`` a live mapping (the spec draws unmap's and copy_on_write's from the live ones) of handle ``h``."""
    return And(_m_kind(M_MAP)(s, a), _m_mapped(s, a.x), at(s.mh, a.x) == a.h, at(s.mst, a.h) != 0,
                  at(s.mk, a.h) == M_HANDLE)
_L_ACTS: dict[str, Act] = {a.name: a for a in [
    Act("reserve", {"g": INT, "nb": INT}, _l_reserve(True), pre=lambda s, a: a.g == s.ng, objs=("g",)),
    Act("commit", {"g": INT, "actual": INT}, _l_commit(True),
        pre=lambda s, a: And(at(s.gst, a.g) != 0, a.actual >= 0), objs=("g",)),
    Act("cancel", {"g": INT}, _l_cancel, pre=lambda s, a: at(s.gst, a.g) != 0, objs=("g",)),
    Act("refund_lease", {"x": INT}, _l_refund_lease, pre=lambda s, a: And(_ITEM(s, a), _kind(K_LEASE)(s, a)),
        objs=("x",)),
    Act("allocate_owned", {"size": INT, "fp": INT, "oom": BOOL}, _l_allocate_owned,
        pre=lambda s, a: Or(a.size <= 0, K.footprint_ok(a.size, a.fp, s.page))),
    Act("load_weight", {"nb": INT, "oom": BOOL}, _l_load_weight, pre=lambda s, a: a.nb > 0),
    Act("commit_owned", {"x": INT, "nb": INT, "bad": BOOL, "oom": BOOL}, _l_commit_owned,
        pre=lambda s, a: And(_ITEM(s, a), _kind(K_RES)(s, a), at(s.ist, a.x) == I_LIVE, a.nb > 0), objs=("x",)),
    Act("kv_grow", {"x": INT, "d": INT, "past": BOOL, "refuse": BOOL, "fail": BOOL, "oom": BOOL}, _l_kv_grow,
        pre=lambda s, a: And(_ITEM(s, a), _kind(K_KV)(s, a), at(s.ist, a.x) == I_LIVE), objs=("x",)),
    Act("drop", {"x": INT}, _l_drop, pre=lambda s, a: And(_ITEM(s, a), _kind(K_ALLOC)(s, a)), objs=("x",)),
    Act("unload_weight", {"x": INT}, _l_unload,
        pre=lambda s, a: And(_kind(K_WEIGHT)(s, a), at(s.ist, a.x) == I_LIVE), objs=("x",)),
    Act("poll", {"x": INT, "none": BOOL}, _l_poll, pre=lambda s, a: Or(a.none, at(s.ist, a.x) == I_QUEUED),
        objs=("x",)),
    Act("claim", {"t": INT, "g": INT}, _l_claim, pre=lambda s, a: And(at(s.tst, a.t) != 0, a.g == s.ng),
        objs=("t", "g")),
    Act("cancel_ticket", {"t": INT}, _l_cancel_ticket, pre=lambda s, a: at(s.tst, a.t) != 0, objs=("t",)),
    Act("expire", {"t": INT, "none": BOOL}, _l_expire,
        pre=lambda s, a: Or(a.none, And(at(s.tst, a.t) != 0, Not(_terminal(at(s.tst, a.t))))), objs=("t",)),
    Act("respond", {"t": INT, "x": INT, "mode": INT}, _l_respond,
        pre=lambda s, a: And(at(s.tst, a.t) != 0, Or(
            a.mode == 0, And(a.mode == 1, at(s.ist, a.x) == I_QUEUED),
            And(a.mode == 2, _kind(K_WEIGHT)(s, a), at(s.ist, a.x) == I_LIVE, at(s.ih, a.x) == WEIGHTS_H))),
        objs=("t", "x")),
    # ``bad_align``: an alignment that is not a power of two; the footprint is at least the size
    # (aligned_footprint: the page-rounded size plus the alignment beyond the page)
    Act("m_allocate", {"size": INT, "bad_align": BOOL, "fp": INT, "oom": BOOL}, _m_allocate(True),
        pre=lambda s, a: Or(a.size <= 0, a.bad_align, a.fp >= a.size)),
    Act("m_deallocate", {"x": INT, "foreign": BOOL}, _m_release, pre=_m_kind(M_ALLOC), objs=("x",)),
    Act("m_commit_range", _M_SPAN, _m_commit_range, pre=lambda s, a: And(_m_kind(M_RES)(s, a), a.nb > 0),
        objs=("x",)),
    # a legal range whose every page is committed holds at most the reservation's committed bytes
    Act("m_decommit_range", _M_SPAN, _m_decommit_range,
        pre=lambda s, a: And(_m_kind(M_RES)(s, a), a.nb > 0,
                                Or(a.bad, a.foreign, at(s.mst, a.x) != I_LIVE, a.nb <= at(s.mb, a.x))),
        objs=("x",)),
    Act("m_release_reservation", {"x": INT, "foreign": BOOL}, _m_release_reservation, pre=_m_kind(M_RES),
        objs=("x",)),
    Act("m_create", {"size": INT, "bad": BOOL, "oom": BOOL}, _m_create, pre=lambda s, a: Or(a.bad, a.size > 0)),
    Act("m_release_handle", {"x": INT}, _m_release_handle, pre=_m_kind(M_HANDLE), objs=("x",)),
    Act("m_unmap", _M_MAPPING, _m_unmap, pre=_m_mapping_pre, objs=("x", "h")),
    Act("m_copy_on_write", dict(_M_MAPPING, oom=BOOL), _m_copy_on_write, pre=_m_mapping_pre, objs=("x", "h")),
    Act("reconfigure", {}, _l_reconfigure),
]}


def _l_acts(*names: str) -> list[Act]:
    return [_L_ACTS[n] for n in names]


def _s8_named(s: St, o: Any) -> Any:
    """S8 on the records: granted is the open grants plus what tickets hold,
    and a holder's charge is its live footprints, queued refunds and leases."""
    return And(s.granted == at(s.PG, s.ng) + at(s.PTP, s.nt) + at(s.PTG, s.nt),
                  Implies(And(0 <= o, o <= 2), at(s.cb, o) == sum(at(at(s[P], o), s.n) for P, _w in _BUCKETS)))


S8 = Proof(
    *catalog("S8"),
    fields=dict(_L_FIELDS), init=_l_init, inv=_l_inv, inst=_l_inst,
    counts=_L_COUNTS,
    actions=_l_acts("reserve", "commit", "cancel", "allocate_owned", "load_weight", "m_allocate"),
    unguarded=Act("commit", {"g": INT, "actual": INT}, _l_commit(False),
                  pre=lambda s, a: And(at(s.gst, a.g) != 0, a.actual >= 0), objs=("g",)),
    guard="only an open grant can be committed (a committed or cancelled one: InvalidRequest)",
    bmc_depth=3,
)


# ==========================================================================
# S9 transactional-growth
# ==========================================================================

def _s9_grow(check: bool):
    """spec/holders.py kv_grow: the six-step transaction.  ``fail`` 4/5 injects
    a failure at that step, ``oom`` is the device's OutOfMemory at step 4;
    ``refuse``: a growth of nothing may answer 0 or InvalidRequest."""
    def step(s: St, a: St):
        kc = at(s.kc, a.r)
        new = K.round_up(a.nb, s.page)
        delta = new - kc
        out = outcome((a.nb > at(s.rsize, a.r), "InvalidRange"),
                      (And(delta <= 0, a.refuse), "InvalidRequest"), (delta <= 0, "ok"),
                      (delta > s.free, "GrantDenied"), (Or(a.fail == 4, a.fail == 5), "MemspecError"),
                      (a.oom, "OutOfMemory"))
        grows = And(out == OK, delta > 0)
        ok = s.set(kc=upd(s.kc, a.r, new), view=upd(s.view, a.r, new),
                   chg=upd(s.chg, a.r, at(s.chg, a.r) + delta), free=s.free - delta, ret=delta)
        nxt = merge(grows, ok, merge(out == OK, s.set(ret=0), s))
        if not check:  # step 5 failed: grant returned but the new mapping is left in place
            bad = And(a.fail == 5, out == code_of("MemspecError"))
            nxt = merge(bad, s.set(kc=upd(s.kc, a.r, new)), nxt)
        return out, nxt
    return step


def code_of(name: str) -> int:
    return CODE[name]


_GROW = {"r": INT, "nb": INT, "fail": INT, "oom": BOOL, "refuse": BOOL}
_GROW_PRE = lambda s, a: Or(a.fail == 0, a.fail == 4, a.fail == 5)  # noqa: E731
S9 = Proof(
    *catalog("S9"),
    # kc: committed bytes of the request's view (its prefix, mapped read-only from the request it
    # shares and charged there, plus its own growth); chg: what the request itself is charged
    fields={"rsize": ARR, "kc": ARR, "view": ARR, "chg": ARR, "prefix": ARR, "free": INT, "page": INT, "ret": INT},
    init=lambda s: And(s.kc == s.prefix, s.view == s.prefix, s.chg == Z0(), s.free >= 0, s.page > 0),
    inv=lambda s, r: And(at(s.view, r) == at(s.kc, r), at(s.chg, r) + at(s.prefix, r) == at(s.kc, r),
                            at(s.chg, r) >= 0, s.free >= 0, s.page > 0),
    actions=[Act("grow", _GROW, _s9_grow(True), pre=_GROW_PRE, objs=("r",))],
    unguarded=Act("grow", _GROW, _s9_grow(False), pre=_GROW_PRE, objs=("r",)),
    guard="a failure at step 4/5 rolls back the mapping (and returns the grant)",
    bmc_depth=1,
)


# ==========================================================================
# S10 context-pinned
# ==========================================================================
# Objects as for S4 (anything released through the deferred-free queue),
# each made in context ``actx[x]``; ``calive[c]``: context ``c`` exists.
# A context's pins are its live and queued objects, stated as they are
# (*the context is not destroyed while an allocation is still alive*), so no
# counter or ghost sum is needed: destroy_context asks whether one exists.

def _s10_create(s: St, a: St):
    """The provider context is created (the system starts with it)."""
    return on_ok(z3.IntVal(OK), s, s.set(calive=upd(s.calive, a.c, True)))


def _s10_alloc(s: St, a: St):
    """An owning allocation is made in the binding's context (the binding is
    used only while its context is alive)."""
    return on_ok(z3.IntVal(OK), s, s.set(astate=upd(s.astate, a.x, LIVE), actx=upd(s.actx, a.x, a.c)))


def _s10_drop(s: St, a: St):
    """Drop / close: the release is queued; the object still pins its context."""
    out = outcome((at(s.astate, a.x) != LIVE, "DoubleFree"))
    return on_ok(out, s, s.set(astate=upd(s.astate, a.x, QUEUED)))


def _s10_decommit(s: St, a: St):
    """A decommit queues a release ``y`` made in the reservation's context."""
    out = outcome((a.bad, "InvalidRange"))
    return on_ok(out, s, s.set(astate=upd(s.astate, a.y, QUEUED), actx=upd(s.actx, a.y, at(s.actx, a.x))))


def _s10_poll(s: St, a: St):
    """``poll`` runs the queued releases the EP reports done (``ready``):
    they stop pinning their context."""
    j = z3.Int("s10_j")
    runs = And(at(s.astate, j) == QUEUED, at(a.ready, j))
    return on_ok(z3.IntVal(OK), s, s.set(astate=z3.Lambda([j], z3.If(runs, FREED, at(s.astate, j)))))


def _pinned(s: St, c: Any) -> Any:
    """Some live or queued object was made in context ``c``."""
    j = z3.Int("pin_j")
    return z3.Exists([j], And(alive(s, j), at(s.actx, j) == c))


def _s10_destroy(check: bool):
    """destroy_context: while pinned, ContextBusy and it stays alive.
    Unguarded: destroyed whatever still pins it."""
    def step(s: St, a: St):
        pairs = [(_pinned(s, a.c), "ContextBusy")] if check else []
        return on_ok(outcome(*pairs), s, s.set(calive=upd(s.calive, a.c, False)))
    return step


def _s10_inv(s: St, o: Any) -> Any:
    """A live or queued object's context is alive."""
    return Implies(alive(s, o), at(s.calive, at(s.actx, o)))


_C = {"c": INT}
_S10_LIVE = lambda s, a: at(s.astate, a.x) == LIVE  # noqa: E731
S10 = Proof(
    *catalog("S10"),
    fields={"astate": ARR, "actx": ARR, "calive": BARR},
    init=lambda s: And(s.astate == Z0(), s.calive == F0()),
    inv=_s10_inv,
    actions=[
        Act("create_context", _C, _s10_create, pre=lambda s, a: Not(at(s.calive, a.c))),
        Act("allocate", {"x": INT, "c": INT}, _s10_alloc,
            pre=lambda s, a: And(at(s.astate, a.x) == NONE, at(s.calive, a.c)), objs=("x",)),
        Act("drop", _X, _s10_drop, pre=lambda s, a: at(s.astate, a.x) != NONE, objs=("x",)),
        Act("close", _X, _s10_drop, pre=_S10_LIVE, objs=("x",)),
        Act("decommit", {"x": INT, "y": INT, "bad": BOOL}, _s10_decommit,
            pre=lambda s, a: And(_S10_LIVE(s, a), at(s.astate, a.y) == NONE), objs=("x", "y")),
        Act("poll", {"ready": BARR}, _s10_poll),
        Act("destroy_context", _C, _s10_destroy(True), pre=lambda s, a: at(s.calive, a.c)),
    ],
    unguarded=Act("destroy_context", _C, _s10_destroy(False), pre=lambda s, a: at(s.calive, a.c)),
    guard="destroy_context raises ContextBusy while allocations or queued releases pin it",
    bmc_depth=3,
)


# ==========================================================================
# S11 ledger-conservation: the ledger model of S8 (above), every action
# that declares S11 (system level: the Governor, the binding, the holders,
# the deferred-free queue; mechanism level: the device's physical bytes)
# ==========================================================================

def _s11_named(s: St, o: Any) -> Any:
    """capacity == free + granted + charged, all >= 0; the holders' charges
    sum to charged, each >= 0; the device holds 0..capacity physical bytes."""
    return And(K.ledger_ok(_ledger(s)), s.charged == at(s.cb, 0) + at(s.cb, 1) + at(s.cb, 2),
                  Implies(And(0 <= o, o <= 2), at(s.cb, o) >= 0),
                  0 <= s.phys, s.phys <= s.mcap)


S11 = Proof(
    *catalog("S11"),
    fields=dict(_L_FIELDS), init=_l_init, inv=_l_inv, inst=_l_inst,
    counts=_L_COUNTS,
    actions=_l_acts("reserve", "commit", "cancel", "refund_lease", "allocate_owned", "load_weight", "commit_owned",
                    "kv_grow", "drop", "unload_weight", "poll", "claim", "cancel_ticket", "expire", "respond",
                    "m_allocate", "m_deallocate", "m_commit_range", "m_decommit_range", "m_release_reservation",
                    "m_create", "m_release_handle", "m_unmap", "m_copy_on_write", "reconfigure"),
    unguarded=Act("reserve", {"g": INT, "nb": INT}, _l_reserve(False), pre=lambda s, a: a.g == s.ng, objs=("g",)),
    guard="the Governor grants only what is free (can_grant)",
    bmc_depth=1,
)


# ==========================================================================
# S12 stable-address  (mirrors spec/vmm.py reserve_owned, commit_owned,
# decommit_owned, commit_range, decommit_range and spec/holders.py kv_open,
# kv_grow)
#
# A reservation (an owning reservation, a KV request's stable range, a
# mechanism reservation) has a base address ``base`` (``base0``: the one it
# was reserved at) and a size.  Every committing action has the same body:
# to install backing up to ``end`` the range must cover ``end``; a range
# that does not is grown by reserving a bigger one elsewhere and moving the
# pointer (what an allocator without VMM does: allocate bigger, copy).  The
# one guard that keeps the pointer stable is the range check: ``end`` past
# the reservation is InvalidRange.  Byte ends are page-rounded by the
# adapter (``end``), so the machine is linear; what S12 does not talk about
# (misaligned or empty ranges, a page already (not) committed, a prefix
# larger than its origin) is the argument ``bad``; an OutOfMemory the spec
# merely allows is ``oom``; kv_grow's injected failure ``fail`` and its
# permitted refusal of a no-op ``refuse``.
# ==========================================================================

def _s12_place(s: St, r: Any, end: Any) -> St:
    """Back the range up to ``end``: a reservation too small is re-reserved
    bigger at the next free address (the pointer moves)."""
    moved = end > at(s.rsize, r)
    return s.set(base=upd(s.base, r, K.ite(moved, s.nextva, at(s.base, r))),
                 rsize=upd(s.rsize, r, K.maximum(at(s.rsize, r), end)),
                 nextva=K.ite(moved, s.nextva + end, s.nextva))


def _s12_range_guard(s: St, r: Any, end: Any) -> tuple[Any, str]:
    """The guard S12 rests on: a commit stays inside the reservation."""
    return (end > at(s.rsize, r), "InvalidRange")


def _s12_commit_owned(check: bool):
    def step(s: St, a: St):
        errs = [(a.bad, "InvalidRange")] + ([_s12_range_guard(s, a.r, a.hi)] if check else []) + [
            (a.hi - a.lo > s.free, "GrantDenied"), (a.oom, "OutOfMemory")]
        out = outcome(*errs)
        return on_ok(out, s, _s12_place(s, a.r, a.hi).set(free=s.free - (a.hi - a.lo),
                                                           kc=upd(s.kc, a.r, at(s.kc, a.r) + (a.hi - a.lo))))
    return step


def _s12_commit_range(s: St, a: St):
    out = outcome((at(s.rforeign, a.r), "ForeignAllocation"), (at(s.rstate, a.r) != LIVE, "StaleHandle"),
                  (a.bad, "InvalidRange"), _s12_range_guard(s, a.r, a.hi), (a.oom, "OutOfMemory"))
    return on_ok(out, s, _s12_place(s, a.r, a.hi).set(kc=upd(s.kc, a.r, at(s.kc, a.r) + (a.hi - a.lo))))


def _s12_decommit_range(s: St, a: St):
    out = outcome((at(s.rforeign, a.r), "ForeignAllocation"), (at(s.rstate, a.r) != LIVE, "StaleHandle"),
                  (a.bad, "InvalidRange"), _s12_range_guard(s, a.r, a.hi))
    return on_ok(out, s, s.set(kc=upd(s.kc, a.r, at(s.kc, a.r) - (a.hi - a.lo))))


def _s12_decommit_owned(s: St, a: St):
    """The pages leave now, their refund is queued: no figure of S12 but the
    committed bytes changes, and the address stays."""
    out = outcome((a.bad, "InvalidRange"), _s12_range_guard(s, a.r, a.hi))
    return on_ok(out, s, s.set(kc=upd(s.kc, a.r, at(s.kc, a.r) - (a.hi - a.lo))))


def _s12_kv_grow(s: St, a: St):
    """Grow to ``end`` (page-rounded new bytes; ``max_bytes`` is a page multiple)."""
    delta = a.end - at(s.kc, a.r)
    out = outcome(_s12_range_guard(s, a.r, a.end), (And(delta <= 0, a.refuse), "InvalidRequest"),
                  (delta <= 0, "ok"), (delta > s.free, "GrantDenied"), (a.fail, "MemspecError"),
                  (a.oom, "OutOfMemory"))
    grown = _s12_place(s, a.r, a.end).set(free=s.free - delta, kc=upd(s.kc, a.r, a.end))
    return out, merge(And(out == OK, delta > 0), grown, s)


def _s12_reserve(unsupported: Any, oom: bool = True):
    def step(s: St, a: St):
        out = outcome((unsupported(s, a), "Unsupported"), (a.bad, "InvalidRequest"),
                      *([(a.oom, "OutOfMemory")] if oom else []))
        return on_ok(out, s, s.set(rstate=upd(s.rstate, a.r, LIVE), base=upd(s.base, a.r, s.nextva),
                                   base0=upd(s.base0, a.r, s.nextva), rsize=upd(s.rsize, a.r, a.n),
                                   kc=upd(s.kc, a.r, 0), rforeign=upd(s.rforeign, a.r, False),
                                   nextva=s.nextva + a.n + 1))
    return step


_S12_RES = {"r": INT, "n": INT, "bad": BOOL, "oom": BOOL}
_S12_SPAN = {"r": INT, "lo": INT, "hi": INT, "bad": BOOL, "oom": BOOL}
_S12_NEW = lambda s, a: And(at(s.rstate, a.r) == NONE, a.n > 0)  # noqa: E731
_S12_DRAWN = lambda s, a: at(s.rstate, a.r) != NONE  # noqa: E731  (an existing reservation)
_S12_LIVE = lambda s, a: at(s.rstate, a.r) == LIVE  # noqa: E731  (drawn from the live ones)
S12 = Proof(
    *catalog("S12"),
    fields={"rstate": ARR, "base": ARR, "base0": ARR, "rsize": ARR, "kc": ARR, "rforeign": BARR, "nextva": INT,
            "free": INT, "cap": BOOL, "scap": BOOL},
    init=lambda s: And(s.rstate == Z0(), s.nextva >= 0),
    inv=lambda s, r: Implies(at(s.rstate, r) == LIVE, at(s.base, r) == at(s.base0, r)),
    actions=[
        Act("reserve_owned", _S12_RES, _s12_reserve(lambda s, a: Not(s.cap)), pre=_S12_NEW, objs=("r",)),
        Act("kv_open", {**_S12_RES, "prefix": BOOL}, _s12_reserve(lambda s, a: Or(Not(s.cap),
                                                                                    And(a.prefix, Not(s.scap))),
                                                       oom=False),
            pre=_S12_NEW, objs=("r",)),
        Act("commit", _S12_SPAN, _s12_commit_owned(True), pre=_S12_LIVE, objs=("r",)),
        Act("decommit", _S12_SPAN, _s12_decommit_owned, pre=_S12_LIVE, objs=("r",)),
        Act("kv_grow", {"r": INT, "end": INT, "refuse": BOOL, "fail": BOOL, "oom": BOOL}, _s12_kv_grow,
            pre=lambda s, a: at(s.rstate, a.r) == LIVE, objs=("r",)),
        Act("commit_range", _S12_SPAN, _s12_commit_range, pre=_S12_DRAWN, objs=("r",)),
        Act("decommit_range", _S12_SPAN, _s12_decommit_range, pre=_S12_DRAWN, objs=("r",)),
    ],
    unguarded=Act("commit", _S12_SPAN, _s12_commit_owned(False), pre=_S12_LIVE, objs=("r",)),
    guard="commit stays inside the reservation (else InvalidRange), never relocating it",
    bmc_depth=2,
)


# ==========================================================================
# S13 shared-lifetime  (mirrors spec/shared.py: create, map, unmap,
# copy_on_write, mapping_count, release_handle, write_through,
# free_shared_reservation, and spec/holders.py kv_open, kv_close).  Shared
# reservations are ``rlive``; a misplaced or already-backed range is the
# argument ``bad``, a reservation with a page still mapped ``mapped``.  No foreign shared reservation exists (the
# twin makes only VirtualBacking ones) and unmap/copy_on_write are drawn
# from the live mappings (whose reservation is live: it cannot be freed
# while mapped), so those errors are outside the actions' domains.
# KvPageStore prefixes: request ``q`` open (``kst`` 1, closed 2) maps
# ``kpre[q]`` read-only bytes of origin ``korig[q]`` (-1: none), whose
# committed bytes ``kown`` must cover every open sharer's prefix.
# ==========================================================================

def _s13_maybe_free(s: St, h: Any) -> St:
    """Free a handle's pages once released and unmapped everywhere (once)."""
    go = And(at(s.hreleased, h), at(s.hmaps, h) == 0, Not(at(s.hfreed, h)))
    return s.set(hfreed=upd(s.hfreed, h, Or(at(s.hfreed, h), go)),
                 shared=K.ite(go, s.shared - at(s.hsize, h), s.shared),
                 physical=K.ite(go, s.physical - at(s.hsize, h), s.physical))


def _s13_create(s: St, a: St):
    out = outcome((Or(a.n <= 0, K.mod(a.n, s.page) != 0), "InvalidRequest"),
                  (_oom(s, a.n, a.oom), "OutOfMemory"))
    return on_ok(out, s, s.set(hexists=upd(s.hexists, a.h, True), hsize=upd(s.hsize, a.h, a.n),
                               hreleased=upd(s.hreleased, a.h, False), hmaps=upd(s.hmaps, a.h, 0),
                               hfreed=upd(s.hfreed, a.h, False), shared=s.shared + a.n, physical=s.physical + a.n))


def _s13_map(s: St, a: St):
    out = outcome((Not(at(s.rlive, a.r)), "StaleHandle"), (at(s.hreleased, a.h), "StaleHandle"),
                  (a.bad, "InvalidRange"))
    return on_ok(out, s, s.set(mlive=upd(s.mlive, a.m, True), mh=upd(s.mh, a.m, a.h),
                               msize=upd(s.msize, a.m, at(s.hsize, a.h)), mro=upd(s.mro, a.m, a.ro),
                               mpriv=upd(s.mpriv, a.m, False), hmaps=upd(s.hmaps, a.h, at(s.hmaps, a.h) + 1),
                               ret=at(s.hsize, a.h), PM=count_append(s.PM, s.nm, a.h), nm=s.nm + 1))


def _mapping_errors(s: St, a: St) -> list:
    return [(Or(Not(at(s.mlive, a.m)), a.size != at(s.msize, a.m)), "InvalidRange")]


def _s13_unmap(s: St, a: St):
    out = outcome(*_mapping_errors(s, a))
    h, sz, priv = at(s.mh, a.m), at(s.msize, a.m), at(s.mpriv, a.m)
    s1 = s.set(mlive=upd(s.mlive, a.m, False), ret=sz,
               # a shared mapping gives back its reference; a private (copied) one frees its own pages
               hmaps=K.ite(priv, s.hmaps, upd(s.hmaps, h, at(s.hmaps, h) - 1)),
               PM=count_change(s.PM, a.m, h, K.ite(priv, 0, -1)),
               private=K.ite(priv, s.private - sz, s.private),
               physical=K.ite(priv, s.physical - sz, s.physical))
    return out, merge(out == OK, merge(priv, s1, _s13_maybe_free(s1, h)), s)


def _s13_cow(s: St, a: St):
    sz, h = at(s.msize, a.m), at(s.mh, a.m)
    out = outcome(*_mapping_errors(s, a), (at(s.mpriv, a.m), "InvalidRange"),
                  (_oom(s, sz, a.oom), "OutOfMemory"))
    s1 = s.set(mpriv=upd(s.mpriv, a.m, True), private=s.private + sz, physical=s.physical + sz,
               hmaps=upd(s.hmaps, h, at(s.hmaps, h) - 1), ret=sz, PM=count_change(s.PM, a.m, h, -1))
    return on_ok(out, s, _s13_maybe_free(s1, h))


def _s13_release(check: bool):
    def step(s: St, a: St):
        out = outcome((at(s.hreleased, a.h), "DoubleFree"))
        unmapped = at(s.hmaps, a.h) == 0
        s1 = s.set(hreleased=upd(s.hreleased, a.h, True), ret=K.ite(unmapped, at(s.hsize, a.h), 0))
        if check:
            return on_ok(out, s, _s13_maybe_free(s1, a.h))
        # frees the pages with the creator's reference, mapped or not
        go = Not(at(s.hfreed, a.h))
        s2 = s1.set(hfreed=upd(s.hfreed, a.h, True), shared=K.ite(go, s.shared - at(s.hsize, a.h), s.shared),
                    physical=K.ite(go, s.physical - at(s.hsize, a.h), s.physical), ret=at(s.hsize, a.h))
        return on_ok(out, s, s2)
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


def _s13_kv_open(s: St, a: St):
    """kv_open: a prefix maps ``p`` committed bytes of an open origin, charged
    once there; it must not exceed what the origin committed."""
    out = outcome((Or(Not(s.cap), And(a.hasorig, Not(s.scap))), "Unsupported"),
                  (And(a.hasorig, Or(a.p > at(s.kown, a.org), a.p > a.n)), "InvalidRequest"))
    return on_ok(out, s, s.set(kst=upd(s.kst, a.q, 1), kown=upd(s.kown, a.q, 0),
                               korig=upd(s.korig, a.q, K.ite(a.hasorig, a.org, -1)),
                               kpre=upd(s.kpre, a.q, K.ite(a.hasorig, a.p, 0))))


def _s13_kv_close(s: St, a: St):
    """kv_close: the release is queued (it runs in poll); the request is closed."""
    return on_ok(z3.IntVal(OK), s, s.set(kst=upd(s.kst, a.q, 2)))


def _s13_prefix_covered(s: St, o: Any) -> Any:
    """An open request's read-only prefix is backed by its origin's committed bytes."""
    return Implies(And(at(s.kst, o) == 1, at(s.korig, o) >= 0), at(s.kown, at(s.korig, o)) >= at(s.kpre, o))


def _s13_inv(s: St, o: Any) -> Any:
    h = at(s.mh, o)
    shared_map = And(at(s.mlive, o), Not(at(s.mpriv, o)))
    return And(
        s.physical <= s.capacity, at(s.hmaps, o) >= 0, s.page > 0,
        Implies(at(s.hfreed, o), And(at(s.hreleased, o), at(s.hmaps, o) == 0)),
        Implies(at(s.hexists, o), at(s.hsize, o) > 0),
        Implies(at(s.mlive, o), And(at(s.hexists, h), at(s.msize, o) == at(s.hsize, h))),
        Implies(shared_map, Not(at(s.hfreed, h))),
        s.rowrites == 0,
        # KV prefixes
        _s13_prefix_covered(s, o), at(s.kown, o) >= 0,
        Implies(at(s.kst, o) == 0, And(at(s.korig, o) == -1, at(s.kpre, o) == 0)),
        Implies(And(at(s.kst, o) != 0, at(s.korig, o) >= 0), at(s.kst, at(s.korig, o)) != 0),
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


_MAPARGS = {"m": INT, "size": INT}
_DRAWN_MAPPING = lambda s, a: at(s.mlive, a.m)  # noqa: E731  (drawn from the live mappings)
S13 = Proof(
    *catalog("S13"),
    fields={"page": INT, "capacity": INT, "physical": INT, "foreign": INT, "shared": INT, "private": INT,
            "hexists": BARR, "hsize": ARR, "hreleased": BARR, "hmaps": ARR, "hfreed": BARR,
            "mlive": BARR, "mh": ARR, "msize": ARR, "mro": BARR, "mpriv": BARR, "rowrites": INT, "ret": INT,
            "PM": ARR2, "nm": INT, "rlive": BARR,
            "cap": BOOL, "scap": BOOL, "kst": ARR, "kown": ARR, "korig": ARR, "kpre": ARR},
    init=lambda s: And(s.page > 0, s.physical == 0, s.physical <= s.capacity, s.shared == 0, s.private == 0,
                          s.hexists == F0(), s.hmaps == Z0(), s.hfreed == F0(), s.hreleased == F0(),
                          s.mlive == F0(), s.rowrites == 0, s.nm == 0, s.PM == z3.K(z3.IntSort(), Z0()),
                          s.kst == Z0(), s.kown == Z0(), s.korig == z3.K(z3.IntSort(), z3.IntVal(-1)), s.kpre == Z0()),
    inv=_s13_inv, lemmas=_s13_lemmas, step_prop=_s13_prop,
    lemma_doc="a handle's mapping count is at least its live shared mappings (1, or 2 for two distinct ones)",
    # the invariant at the handle a mapping maps (sound: Inv is proved for every object)
    inst=lambda s, o, a: [at(s.mh, o)] + [at(s.mh, a[k]) for k in ("m", "h") if k in a],
    actions=[
        Act("create", {"h": INT, "n": INT, "oom": BOOL}, _s13_create, pre=lambda s, a: Not(at(s.hexists, a.h)), objs=("h",)),
        Act("map", {"m": INT, "h": INT, "r": INT, "ro": BOOL, "bad": BOOL}, _s13_map,
            pre=lambda s, a: And(a.m == s.nm, at(s.hexists, a.h)),
            objs=("m", "h")),
        Act("unmap", _MAPARGS, _s13_unmap, pre=_DRAWN_MAPPING, objs=("m",)),
        Act("copy_on_write", {**_MAPARGS, "oom": BOOL}, _s13_cow, pre=_DRAWN_MAPPING, objs=("m",)),
        Act("release_handle", {"h": INT}, _s13_release(True), pre=lambda s, a: at(s.hexists, a.h), objs=("h",)),
        Act("write_through", {"m": INT}, _s13_write, pre=lambda s, a: at(s.mlive, a.m), objs=("m",)),
        Act("mapping_count", {"h": INT}, _s13_count, pre=lambda s, a: at(s.hexists, a.h), objs=("h",)),
        Act("free_shared_reservation", {"r": INT, "mapped": BOOL}, _s13_free_res),
        Act("kv_open", {"q": INT, "n": INT, "org": INT, "p": INT, "hasorig": BOOL}, _s13_kv_open,
            pre=lambda s, a: And(at(s.kst, a.q) == 0, a.q >= 0, a.p >= 0,
                                    Implies(a.hasorig, And(a.org >= 0, a.org != a.q, at(s.kst, a.org) == 1)))),
        Act("kv_close", {"q": INT}, _s13_kv_close, pre=lambda s, a: at(s.kst, a.q) == 1),
    ],
    unguarded=Act("release_handle", {"h": INT}, _s13_release(False), pre=lambda s, a: at(s.hexists, a.h), objs=("h",)),
    guard="physical pages are freed only when the last mapping is gone",
    bmc_depth=3,
    timeout_ms=90000,  # map's consecution takes ~3 s of CPU (mappings, handles and KV prefixes in one machine)
)


# ==========================================================================
# S14 no-reuse-of-identity  (mirrors spec/eager.py allocate/deallocate,
# spec/vmm.py reserve/release_reservation/reserve_owned, spec/sharing.py
# shared_reserve/create/free_shared_reservation, spec/manager.py allocate_owned)
#
# Every object (allocation, reservation, physical handle) gets a fresh
# identity ``gen`` from the counter ``nextgen`` (``owner`` maps an identity
# back to its object, so two objects never share one).  Eager allocations
# also own their address in ``byaddr`` (the spec's ``by_address``); an
# address is reused once its allocation is freed.  The errors outside S14
# (a size that is not a size, the Governor's or the device's refusal, no
# VirtualBacking) are the argument ``err``, computed by the agreement
# adapter from the spec state (an OutOfMemory the spec merely allows: from
# the branch the walk follows).
# ==========================================================================

NOADDR = -1


def _s14_make(errors: tuple[str, ...], addressed: bool):
    """A creation: ``err == k`` raises ``errors[k-1]``; else object ``x`` is
    live with the next identity (and, if ``addressed``, owns address ``ad``)."""
    def step(s: St, a: St):
        out = outcome(*[(a.err == i + 1, e) for i, e in enumerate(errors)])
        return on_ok(out, s, s.set(astate=upd(s.astate, a.x, LIVE), gen=upd(s.gen, a.x, s.nextgen),
                                   owner=upd(s.owner, s.nextgen, a.x), nextgen=s.nextgen + 1,
                                   addr=upd(s.addr, a.x, a.ad), addrd=upd(s.addrd, a.x, addressed),
                                   foreign=upd(s.foreign, a.x, False),
                                   byaddr=upd(s.byaddr, a.ad, a.x) if addressed else s.byaddr))

    def pre(s: St, a: St) -> Any:
        free_addr = at(s.byaddr, a.ad) == NOADDR if addressed else z3.BoolVal(True)
        return And(at(s.astate, a.x) == NONE, a.x >= 0, a.ad >= 0, free_addr, a.err >= 0, a.err <= len(errors))
    return step, pre


def _s14_free(check: bool):
    """DeviceAllocator.deallocate: the allocation at the handle's address is
    freed.  The guard: the handle's own identity must still be live (else
    StaleHandle when its address now belongs to a newer allocation,
    DoubleFree otherwise) -- without it a stale handle frees whatever lives
    at its recycled address."""
    def step(s: St, a: St):
        here = at(s.byaddr, at(s.addr, a.x))
        reused = here != NOADDR
        errs = [(at(s.foreign, a.x), "ForeignAllocation")]
        if check:
            errs += [(And(at(s.astate, a.x) != LIVE, reused), "StaleHandle"), (at(s.astate, a.x) != LIVE, "DoubleFree")]
        else:
            errs += [(Not(reused), "DoubleFree")]  # nothing lives at the address
        out = outcome(*errs)
        return on_ok(out, s, s.set(astate=upd(s.astate, here, FREED), byaddr=upd(s.byaddr, at(s.addr, a.x), NOADDR)))
    return step


def _s14_release(errors: tuple[str, ...]):
    """release_reservation / free_shared_reservation: resolved by identity;
    a foreign one is refused, a released one is DoubleFree (or StaleHandle);
    ``err == k`` raises ``errors[k-1]`` (free_shared_reservation: still mapped)."""
    def step(s: St, a: St):
        out = outcome((at(s.foreign, a.x), "ForeignAllocation"), (at(s.astate, a.x) != LIVE, "DoubleFree"),
                      *[(a.err == i + 1, e) for i, e in enumerate(errors)])
        return on_ok(out, s, s.set(astate=upd(s.astate, a.x, FREED)))
    return step


def _s14_prop(name: str, s: St, a: St, out: Any, s2: St, o: Any) -> Any:
    if name in ("free", "release_reservation", "free_shared_reservation"):
        # a handle that is not live is rejected and nothing changes
        return Implies(at(s.astate, a.x) != LIVE, And(out != OK, at(s2.astate, o) == at(s.astate, o)))
    return z3.BoolVal(True)


def _s14_owns_address(s: St, o: Any) -> Any:
    """A live own eager allocation owns its address (the spec's ``by_address``
    holds exactly the live allocations)."""
    return Implies(And(at(s.astate, o) == LIVE, at(s.addrd, o), Not(at(s.foreign, o))),
                      at(s.byaddr, at(s.addr, o)) == o)


def _s14_inv(s: St, o: Any) -> Any:
    return And(s.nextgen >= 0, _s14_owns_address(s, o),
                  Implies(at(s.astate, o) != NONE,
                             And(o >= 0, at(s.owner, at(s.gen, o)) == o, at(s.gen, o) < s.nextgen, at(s.gen, o) >= 0,
                                    Implies(at(s.addrd, o), at(s.addr, o) >= 0))),
                  # what an address is owned by is a live own eager allocation at that address
                  Implies(And(o >= 0, at(s.byaddr, o) != NOADDR),
                             And(at(s.astate, at(s.byaddr, o)) == LIVE, at(s.addrd, at(s.byaddr, o)),
                                    Not(at(s.foreign, at(s.byaddr, o))), at(s.addr, at(s.byaddr, o)) == o)))


_S14_MAKE = {  # encoded action -> (errors outside S14, owns an address)
    "allocate": (("InvalidRequest", "OutOfMemory"), True),
    "create": (("InvalidRequest", "OutOfMemory"), False),
    "reserve": (("InvalidRequest", "OutOfMemory"), False),
    "shared_reserve": (("InvalidRequest", "OutOfMemory"), False),
    "allocate_owned": (("InvalidRequest", "GrantDenied", "OutOfMemory"), False),
    "reserve_owned": (("Unsupported", "InvalidRequest", "OutOfMemory"), False),
}
_XE = {"x": INT, "ad": INT, "err": INT}
_LIVE_OR_FREED = lambda s, a: Or(at(s.astate, a.x) == LIVE, at(s.astate, a.x) == FREED)  # noqa: E731  (drawn: existing)
_ALLOC = lambda s, a: And(_LIVE_OR_FREED(s, a), at(s.addrd, a.x))  # noqa: E731  (an eager allocation)
_NOT_ALLOC = lambda s, a: And(_LIVE_OR_FREED(s, a), Not(at(s.addrd, a.x)))  # noqa: E731  (a reservation)


def _s14_make_act(name: str) -> Act:
    errors, addressed = _S14_MAKE[name]
    step, pre = _s14_make(errors, addressed)
    return Act(name, _XE, step, pre=pre, objs=("x",))


S14 = Proof(
    *catalog("S14"),
    fields={"astate": ARR, "gen": ARR, "addr": ARR, "addrd": BARR, "foreign": BARR, "byaddr": ARR, "owner": ARR,
            "nextgen": INT},
    init=lambda s: And(s.astate == Z0(), s.nextgen == 0, s.byaddr == z3.K(z3.IntSort(), z3.IntVal(NOADDR))),
    inv=_s14_inv,
    actions=[_s14_make_act(n) for n in _S14_MAKE] + [
        Act("free", {"x": INT}, _s14_free(True), pre=_ALLOC, objs=("x",)),
        Act("release_reservation", {"x": INT}, _s14_release(()), pre=_NOT_ALLOC, objs=("x",)),
        Act("free_shared_reservation", {"x": INT, "err": INT}, _s14_release(("InvalidRange",)),
            pre=lambda s, a: And(_NOT_ALLOC(s, a), Not(at(s.foreign, a.x)), a.err >= 0, a.err <= 1),
            objs=("x",)),
    ],
    unguarded=Act("free", {"x": INT}, _s14_free(False), pre=_ALLOC, objs=("x",)),
    guard="deallocate resolves a handle by its identity: a handle no longer live is refused (StaleHandle/DoubleFree) "
          "even when a newer allocation lives at its address",
    step_prop=_s14_prop,
    # the invariant at the addresses an action reads (sound: Inv is proved for every integer)
    inst=lambda s, o, a: [at(s.addr, o)] + ([at(s.addr, a.x), at(s.byaddr, at(s.addr, a.x))] if "x" in a else [])
    + ([a.ad] if "ad" in a else []),
    safety=lambda s, o: Implies(at(s.astate, o) != NONE, at(s.gen, o) < s.nextgen),
    bmc_depth=4,
)


# ==========================================================================
# S15 ticket-exactly-once  (mirrors spec/governor.py: issue_ticket, claim,
# cancel_ticket, expire, reconfigure; spec/holders.py: respond)
#
# Configuration generations: every ticket records the generation it was
# issued in (tgen); reconfigure bumps gen and fails every pending ticket at
# once, returning what they held.  Two prefix-sum ghosts split what the
# tickets hold into pending (PP) and the rest (PN, i.e. granted), so that
# reconfigure's "every pending ticket gives its bytes back" is one step:
# free += PP[nt], and PP becomes 0 everywhere.
# ==========================================================================

T_FAILED = 6


def _terminal(st: Any) -> Any:
    return Or(st == T_CLAIMED, st == T_CANCELLED, st == T_TIMED_OUT, st == T_FAILED)


def _returned(st: Any) -> Any:
    """The terminal states that give the held bytes back (claim hands them over instead)."""
    return Or(st == T_CANCELLED, st == T_TIMED_OUT, st == T_FAILED)


def _pend_part(st: Any, h: Any) -> Any:
    return z3.If(st == T_PENDING, h, 0)


def _gr_part(st: Any, h: Any) -> Any:
    return z3.If(st == T_GRANTED, h, 0)


def _moved(s: St, t: Any, st2: Any, h2: Any) -> dict[str, Any]:
    """The ghosts after ticket ``t`` goes to state ``st2`` holding ``h2``."""
    st, h = at(s.tstate, t), at(s.held, t)
    return {"PP": prefix_change(s.PP, t, _pend_part(st2, h2) - _pend_part(st, h)),
            "PN": prefix_change(s.PN, t, _gr_part(st2, h2) - _gr_part(st, h))}


def _s15_issue(s: St, a: St):
    out = outcome((a.n <= 0, "InvalidRequest"))
    return on_ok(out, s, s.set(tstate=upd(s.tstate, a.t, T_PENDING), held=upd(s.held, a.t, 0),
                               ret=upd(s.ret, a.t, 0), amount=upd(s.amount, a.t, a.n),
                               deadline=upd(s.deadline, a.t, a.dl), tgen=upd(s.tgen, a.t, s.gen),
                               PP=prefix_append(s.PP, s.nt, 0), PN=prefix_append(s.PN, s.nt, 0), nt=s.nt + 1))


def _s15_respond(check_gen: bool = True):
    def step(s: St, a: St):
        """A holder answers ticket ``t``: its releases refund ``r`` bytes of its
        charge to free (spec/ep.py refund), and the Governor moves them from
        free into the ticket (spec/governor.py ticket_receive)."""
        st = at(s.tstate, a.t)
        stale = And(st == T_PENDING, at(s.tgen, a.t) != s.gen) if check_gen else z3.BoolVal(False)
        out = outcome((Not(Or(st == T_PENDING, st == T_GRANTED)), "InvalidTicket"), (stale, "InvalidTicket"))
        l = K.grant_from_free(K.refund(_ledger(s), a.r), a.r)
        held = at(s.held, a.t) + a.r
        st2 = K.ite(And(st == T_PENDING, held >= at(s.amount, a.t)), T_GRANTED, st)
        return on_ok(out, s, _with_ledger(s, l, held=upd(s.held, a.t, held), tstate=upd(s.tstate, a.t, st2),
                                          sumheld=s.sumheld + a.r, **_moved(s, a.t, st2, held)))
    return step


def _s15_claim(s: St, a: St):
    out = outcome((at(s.tstate, a.t) != T_GRANTED, "InvalidTicket"))
    h = at(s.held, a.t)
    return on_ok(out, s, s.set(tstate=upd(s.tstate, a.t, T_CLAIMED), held=upd(s.held, a.t, 0),
                               sumheld=s.sumheld - h, sumgr=s.sumgr + h, out_bytes=h,
                               **_moved(s, a.t, T_CLAIMED, 0)))


def _end(s: St, t: Any, st: int) -> St:
    h = at(s.held, t)
    return _with_ledger(s, K.return_grant(_ledger(s), h), tstate=upd(s.tstate, t, st), held=upd(s.held, t, 0),
                        ret=upd(s.ret, t, at(s.ret, t) + 1), sumheld=s.sumheld - h, out_bytes=h,
                        **_moved(s, t, st, 0))


def _s15_cancel(check: bool):
    def step(s: St, a: St):
        out = outcome((_terminal(at(s.tstate, a.t)), "InvalidTicket")) if check else z3.IntVal(OK)
        return on_ok(out, s, _end(s, a.t, T_CANCELLED))
    return step


def _s15_expire(s: St, a: St):
    """One ticket's timeout: the spec's expire times out every due ticket, one
    after the other; here ``t``'s part (an error outcome: ``t`` is left alone)."""
    st = at(s.tstate, a.t)
    dl = at(s.deadline, a.t)
    out = outcome((_terminal(st), "InvalidTicket"), (Not(And(0 < dl, dl <= a.now)), "InvalidRequest"))
    return on_ok(out, s, _end(s, a.t, T_TIMED_OUT))


def _s15_reconfigure(fail_stale: bool):
    def step(s: St, a: St):
        """A new generation; every pending ticket fails at once and gives back what it holds."""
        if not fail_stale:
            return on_ok(z3.IntVal(OK), s, s.set(gen=s.gen + 1))
        i = z3.Int("rc_i")
        pend = lambda x: at(s.tstate, x) == T_PENDING  # noqa: E731
        back = at(s.PP, s.nt)
        return on_ok(z3.IntVal(OK), s, _with_ledger(
            s, K.return_grant(_ledger(s), back), gen=s.gen + 1,
            tstate=z3.Lambda([i], z3.If(pend(i), T_FAILED, at(s.tstate, i))),
            held=z3.Lambda([i], z3.If(pend(i), 0, at(s.held, i))),
            ret=z3.Lambda([i], z3.If(pend(i), at(s.ret, i) + 1, at(s.ret, i))),
            sumheld=s.sumheld - back, out_bytes=back, PP=z3.K(z3.IntSort(), z3.IntVal(0))))
    return step


def _s15_inv(s: St, o: Any) -> Any:
    st, h, r = at(s.tstate, o), at(s.held, o), at(s.ret, o)
    return And(
        K.ledger_ok(_ledger(s)), s.granted == s.sumheld + s.sumgr, s.sumgr >= 0,
        st >= 0, st <= T_FAILED, h >= 0, Implies(_terminal(st), h == 0), Implies(st == 0, And(h == 0, r == 0)),
        r >= 0, r <= 1, Implies(r == 1, _returned(st)), Implies(_returned(st), r == 1),
        # generations: no pending ticket of an older configuration
        Implies(st != 0, at(s.tgen, o) <= s.gen), Implies(st == T_PENDING, at(s.tgen, o) == s.gen),
        # what the tickets hold: pending (PP) + granted (PN), prefix-sum ghosts over dense ticket ids
        Implies(st != 0, And(0 <= o, o < s.nt)),
        prefix_sum(s.PP, s.nt, lambda i: _pend_part(at(s.tstate, i), at(s.held, i))),
        prefix_sum(s.PN, s.nt, lambda i: _gr_part(at(s.tstate, i), at(s.held, i))),
        s.sumheld == at(s.PP, s.nt) + at(s.PN, s.nt),
    )


_T = {"t": INT}
_EXISTS = lambda s, a: at(s.tstate, a.t) != 0  # noqa: E731  (the spec draws existing tickets)
#: a holder releases only bytes it is charged for (the spec's victims are its own resident weights)
_RESPOND_PRE = lambda s, a: And(a.r >= 0, a.r <= s.charged, at(s.tstate, a.t) != 0)  # noqa: E731
_S15_FIELDS = {"cap": INT, "free": INT, "granted": INT, "charged": INT, "tstate": ARR, "held": ARR, "ret": ARR,
               "amount": ARR, "deadline": ARR, "tgen": ARR, "gen": INT, "sumheld": INT, "sumgr": INT,
               "out_bytes": INT, "PP": ARR, "PN": ARR, "nt": INT}


def _s15_init(s: St) -> Any:
    return And(s.cap >= 0, s.free >= 0, s.charged >= 0, s.free + s.charged == s.cap, s.granted == 0,
                  s.tstate == Z0(), s.held == Z0(), s.ret == Z0(), s.sumheld == 0, s.sumgr == 0,
                  s.nt == 0, at(s.PP, 0) == 0, at(s.PN, 0) == 0)


def _s15_actions(fail_stale: bool = True) -> list[Act]:
    return [
        Act("issue_ticket", {"t": INT, "n": INT, "dl": INT}, _s15_issue, pre=lambda s, a: a.t == s.nt, objs=("t",)),
        Act("respond", {"t": INT, "r": INT}, _s15_respond(), pre=_RESPOND_PRE, objs=("t",)),
        Act("claim", _T, _s15_claim, pre=_EXISTS, objs=("t",)),
        Act("cancel_ticket", _T, _s15_cancel(True), pre=_EXISTS, objs=("t",)),
        Act("expire", {"t": INT, "now": INT}, _s15_expire, pre=_EXISTS, objs=("t",)),
        Act("reconfigure", {}, _s15_reconfigure(fail_stale)),
    ]


S15 = Proof(
    *catalog("S15"),
    fields=dict(_S15_FIELDS),
    init=_s15_init,
    inv=_s15_inv,
    lemmas=lambda s, o, a: Implies(Not(_terminal(at(s.tstate, o))), at(s.held, o) <= s.sumheld),
    lemma_doc="what a ticket holds is at most the sum of what the tickets hold",
    actions=_s15_actions(),
    unguarded=Act("cancel_ticket", _T, _s15_cancel(False), pre=_EXISTS, objs=("t",)),
    guard="cancel of a terminal ticket raises InvalidTicket (its grant was already returned)",
    bmc_depth=3,
)


def _g1_step(name: str, s: St, a: St, out: Any, s2: St, o: Any) -> Any:
    """A ticket of an older generation that is not granted (nor claimed) never becomes either."""
    old = And(at(s.tgen, o) < s.gen, at(s.tstate, o) != T_GRANTED, at(s.tstate, o) != T_CLAIMED)
    return Implies(old, And(at(s2.tstate, o) != T_GRANTED, at(s2.tstate, o) != T_CLAIMED))


#: G1: configuration-generation invalidation of pending tickets (issue 13, from the onnx-genai TLA+
#: specs the design comes from), on S15's machine: same state, same actions, its own guard.
G1 = Proof(
    "G1", "generation",
    "When memory is tight, all it can send is: pressure ticket: try to free 1 GB, priority = ..., deadline = ... "
    "(and: Total capacity: 24 GB / Approved: 22 GB -- the configuration the tickets were issued under)",
    fields=dict(_S15_FIELDS),
    init=_s15_init,
    inv=_s15_inv,
    lemmas=lambda s, o, a: Implies(Not(_terminal(at(s.tstate, o))), at(s.held, o) <= s.sumheld),
    lemma_doc="what a ticket holds is at most the sum of what the tickets hold",
    actions=_s15_actions(),
    unguarded=Act("reconfigure", {}, _s15_reconfigure(False)),
    guard="reconfigure fails every pending ticket of the older generation (their bytes returned once)",
    step_prop=_g1_step,
    bmc_depth=3,
)
G1.declared_by = "S15"  # type: ignore[attr-defined]  (the spec's actions declare S15; G1 is part of it)


PROOFS = [S1, S2, S3, S4, S5, S6, S7, S8, S9, S10, S11, S12, S13, S14, S15]
#: proofs of properties that are not catalog invariants (G1 lives on S15's machine)
MORE_PROOFS = [G1]


# ==========================================================================
# What each encoded action stands for in the executable spec ("level:action",
# checked against the spec's action tables by ``coverage``), and the named
# invariant an unguarded variant must break (auxiliary and ghost conjuncts
# of ``inv`` excluded).
# ==========================================================================

ENCODES: dict[str, dict[str, tuple[str, ...]]] = {
    "S1": {"allocate": ("mechanism:allocate", "mechanism:allocate_foreign"), "release": ("mechanism:deallocate",),
           "select": ("system:select",), "poll": ("system:poll",)},
    "S2": {"reserve": ("system:reserve",), "commit": ("system:commit",), "cancel": ("system:cancel",),
           "allocate": ("system:allocate_owned", "system:load_weight"), "commit_owned": ("system:commit_owned",),
           "grow": ("system:kv_grow",)},
    "S3": {"select": ("system:select",), "query": ("system:binding_capabilities", "system:manager_capabilities",
                                                    "system:allocate_owned")},
    "S4": {"allocate": ("system:allocate_owned",), "use": ("system:use", "system:use_owned", "system:kv_use"),
           "drop": ("system:drop",), "close": ("system:close_owned", "system:unload_weight", "system:kv_close"),
           "decommit": ("system:decommit_owned",), "synchronize": ("system:synchronize",), "poll": ("system:poll",)},
    "S5": {**{n: (f"mechanism:{n}",) for n in ("query_virtual_backing", "query_shared_mapping", "reserve", "commit_range",
                                                "decommit_range", "committed_bytes", "release_reservation")},
           **{n: (f"system:{n}",) for n in ("reserve_owned", "commit_owned", "kv_open")}},
    "S6": {n: (f"system:{n}",) for n in ("issue_ticket", "set_hot", "respond")},
    "S7": {"allocate": ("system:allocate_owned",), "use": ("system:use", "system:use_owned", "system:kv_use"),
           "drop": ("system:drop",), "close": ("system:close_owned", "system:unload_weight", "system:kv_close"),
           "decommit": ("system:decommit_owned",), "synchronize": ("system:synchronize",), "poll": ("system:poll",)},
    "S8": {"reserve": ("system:reserve",), "commit": ("system:commit",), "cancel": ("system:cancel",),
           "allocate_owned": ("system:allocate_owned",), "load_weight": ("system:load_weight",),
           "m_allocate": ("mechanism:allocate",)},
    "S9": {"grow": ("system:kv_grow",)},
    "S10": {"allocate": ("system:allocate_owned",), "drop": ("system:drop",),
            "close": ("system:close_owned", "system:kv_close"), "decommit": ("system:decommit_owned",),
            "poll": ("system:poll",), "destroy_context": ("system:destroy_context",)},
    "S11": {**{n: (f"system:{n}",) for n in ("reserve", "commit", "cancel", "refund_lease", "allocate_owned",
                                             "load_weight", "commit_owned", "kv_grow", "drop", "unload_weight",
                                             "poll", "claim", "cancel_ticket", "expire", "respond")},
            **{f"m_{n}": (f"mechanism:{n}",) for n in ("allocate", "deallocate", "commit_range", "decommit_range",
                                                        "release_reservation", "create", "release_handle", "unmap",
                                                        "copy_on_write")},
            "reconfigure": ("system:reconfigure",)},
    "S12": {"reserve_owned": ("system:reserve_owned",), "kv_open": ("system:kv_open",),
            "commit": ("system:commit_owned",), "decommit": ("system:decommit_owned",), "kv_grow": ("system:kv_grow",),
            "commit_range": ("mechanism:commit_range",), "decommit_range": ("mechanism:decommit_range",)},
    "S13": {**{n: (f"mechanism:{n}",) for n in ("create", "map", "unmap", "copy_on_write", "release_handle",
                                                 "write_through", "mapping_count", "free_shared_reservation")},
            "kv_open": ("system:kv_open",), "kv_close": ("system:kv_close",)},
    "S14": {"allocate": ("mechanism:allocate",), "free": ("mechanism:deallocate",), "create": ("mechanism:create",),
            "reserve": ("mechanism:reserve",), "shared_reserve": ("mechanism:shared_reserve",),
            "release_reservation": ("mechanism:release_reservation",),
            "free_shared_reservation": ("mechanism:free_shared_reservation",),
            "allocate_owned": ("system:allocate_owned",), "reserve_owned": ("system:reserve_owned",)},
    "S15": {"issue_ticket": ("system:issue_ticket",), "respond": ("system:respond",), "claim": ("system:claim",),
            "cancel_ticket": ("system:cancel_ticket",), "expire": ("system:expire",),
            "reconfigure": ("system:reconfigure",)},
}
ENCODES["G1"] = ENCODES["S15"]  # G1 is on S15's machine


def _shared_map(s: St, x: Any) -> Any:
    return And(at(s.mlive, x), Not(at(s.mpriv, x)))


NAMED: dict[str, Any] = {
    "S2": lambda s, h: at(s.committed, h) <= at(s.charge, h),
    "S3": lambda s, d: Implies(at(s.snapgen, d) == at(s.gen, d), at(s.snap, d) == at(s.inst, d)),
    "S4": lambda s, o: Implies(at(s.astate, o) == FREED, _fences_done(s, o)),
    "S5": _s5_named,  # + the step properties: a successful commit changes exactly the range
    "S6": lambda s, o: And(s.gov_ev == 0, s.hot_ev == 0, s.over == 0),
    "S7": lambda s, o: z3.BoolVal(True),  # a step property: drop enqueues, never frees or synchronizes
    "S8": _s8_named,
    "S9": lambda s, r: And(at(s.view, r) == at(s.kc, r), at(s.chg, r) + at(s.prefix, r) == at(s.kc, r)),
    "S10": lambda s, o: Implies(alive(s, o), at(s.calive, at(s.actx, o))),
    "S11": _s11_named,
    "S12": lambda s, r: Implies(at(s.rstate, r) == LIVE, at(s.base, r) == at(s.base0, r)),
    "S13": lambda s, o: And(Implies(_shared_map(s, o), Not(at(s.hfreed, at(s.mh, o)))),
                               s.rowrites == 0,
                               _s13_prefix_covered(s, o)),
    "S14": lambda s, o: _s14_owns_address(s, o),  # + the step property: a stale handle is rejected
    "S15": lambda s, o: And(at(s.ret, o) <= 1,
                               Implies(_terminal(at(s.tstate, o)), at(s.held, o) == 0)),
    "G1": lambda s, o: Implies(at(s.tstate, o) == T_PENDING, at(s.tgen, o) == s.gen),
}


def _annotate() -> None:
    from dataclasses import replace

    for p in PROOFS + MORE_PROOFS:
        enc = ENCODES.get(p.id, {})
        p.actions = [replace(a, spec=enc.get(a.name, ())) for a in p.actions]
        p.unguarded = replace(p.unguarded, spec=enc.get(p.unguarded.name, ()))
        if p.id in NAMED:
            p.named = NAMED[p.id]


_annotate()
