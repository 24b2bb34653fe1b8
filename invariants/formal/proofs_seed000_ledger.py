"""Z3 encodings of seed 000's invariants S2, S8, S9 and S11: the second part of
:mod:`memspec.invariants.formal.proofs_seed000` (which assembles them; import from there).

S2 charge-before-commit, S8 exact-accounting, S9 transactional-growth and S11
ledger-conservation: ONE ledger model (every action of the Governor, the holders and the
queue on one state; S2, S8 and S9 on the actions they need, each row its own invariant,
named rule and unguarded variant).  (S10 context-pinned is proved on S4's deferred-free
queue machine, in :mod:`.proofs_seed000_objects`.)
"""

from __future__ import annotations

from typing import Any

import z3

from memspec.invariants.formal.z3fast import And, Implies, Not, Or
from memspec.invariants.formal.proofs import (
    ARR, ARR2, ARR2B, BARR, BOOL, CODE, INT, OK, Act, Proof, St, at, merge, on_ok, outcome, prefix_append,
    prefix_change, prefix_count, prefix_sum, upd,
)
from memspec.spec import kernels as K
from memspec.invariants.formal.proofs_seed000_objects import (
    F0, M_ALLOC, M_HANDLE, M_MAP, M_RES, T_CANCELLED, T_CLAIMED, T_FAILED, T_GRANTED, T_PENDING, T_TIMED_OUT, Z0,
    _CREATE, _DRAWN_MAPPING, _HANDLE, _MAPARGS, _SPAN, _SPAN_OOM, _kv_grow, _m_new, _s5_handle_errors, _s5_release,
    _s5_span, _shm_cow, _shm_create, _shm_release, _shm_unmap, _some_page, _terminal, catalog,
)


# ==========================================================================
# S8 exact-accounting and S11 ledger-conservation: ONE ledger model (S2's
# and S9's too, below; mirrors spec/governor.py, spec/manager.py,
# spec/holders.py, spec/ep.py, spec/vmm.py commit_owned, spec/eager.py
# allocate/deallocate)
#
# The Governor's ledger (cap, free, granted, charged), the spec's running
# totals (open grants ``og``, ticket holdings ``sumheld``, per holder: charge
# ``cb``, live footprints ``lb``, queued refunds ``qb``, unrefunded leases
# ``lsb``, the physical bytes installed for it ``pb``) and the records they
# summarise: grants, tickets, and *charge items* -- every charged thing a
# holder has: an owning allocation, a weight, an owning reservation's
# committed bytes, a KV request's own pages (live), a release waiting in the
# deferred-free queue (queued), a lease.  A KV
# request's item also keeps its view (S9): the bytes committed in it
# (``ikc``), the view it exposes (``iview``) and its prefix mapped read-only
# from the request it shares (``ipre``, charged there); its bytes are its
# own pages, so bytes + prefix == committed == view.  Each
# summary is checked by a prefix-sum ghost over dense ids (keyed by holder
# for the per-holder ones), part of the invariant, so nothing is assumed.
# What the tickets hold is split in two ghosts, pending (``PP``) and the
# rest (``PN``), so that reconfigure's "every pending ticket gives its bytes
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


def _live(s: St, h: Any, d: Any, **kw: Any) -> dict[str, Any]:
    """Holder ``h``'s live footprints change by ``d`` bytes, installed (or freed) with them."""
    return {"lb": _hadd(s.lb, h, d), "pb": _hadd(s.pb, h, d), **kw}


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
    s1 = _charge(s, SESSION_H, a.size, a.fp, **_live(s, SESSION_H, a.fp))
    return on_ok(out, s, _item_new(s1, SESSION_H, K_ALLOC, I_LIVE, a.fp))


def _l_load_weight(s: St, a: St):
    out = outcome((Not(K.can_grant(_ledger(s), a.nb)), "GrantDenied"), (a.oom, "OutOfMemory"))
    s1 = _charge(s, WEIGHTS_H, a.nb, a.nb, **_live(s, WEIGHTS_H, a.nb))
    return on_ok(out, s, _item_new(s1, WEIGHTS_H, K_WEIGHT, I_LIVE, a.nb))


def _l_commit_owned(check: bool):
    """commit_owned on reservation item ``x``: charge-then-commit ``nb`` bytes
    (the Governor charges all of them, else GrantDenied, before they are
    mapped).  Unguarded (S2's variant): the bytes are mapped, the Governor
    charges what it can (what is free)."""
    def step(s: St, a: St):
        pairs = [(a.bad, "InvalidRange")] + ([(Not(K.can_grant(_ledger(s), a.nb)), "GrantDenied")] if check else [])
        out = outcome(*pairs, (a.oom, "OutOfMemory"))
        c = a.nb if check else K.minimum(a.nb, s.free)
        s1 = _charge(s, SESSION_H, c, c, **_live(s, SESSION_H, c, pb=_hadd(s.pb, SESSION_H, a.nb)))
        return on_ok(out, s, _item_set(s1, a.x, I_LIVE, at(s.ib, a.x) + c))
    return step


def _kv_view(s: St, x: Any, kc: Any, view: Any) -> St:
    """KV request item ``x`` now has ``kc`` bytes committed in its view and exposes ``view``."""
    return s.set(ikc=upd(s.ikc, x, kc), iview=upd(s.iview, x, view))


def _l_kv_grow(check: bool):
    """kv_grow of request item ``x`` by ``d`` bytes: the VMM machine's relation (:func:`_kv_grow`);
    a growth commits ``d`` bytes more in the view and charges them to the KV holder."""
    def step(s: St, a: St):
        kc = at(s.ikc, a.x) + a.d
        s1 = _item_set(_charge(s, KV_H, a.d, a.d, **_live(s, KV_H, a.d)), a.x, I_LIVE, at(s.ib, a.x) + a.d)
        out, nxt = _kv_grow(s, a, a.d, a.past, Not(K.can_grant(_ledger(s), a.d)),
                            _kv_view(s1, a.x, kc, at(s.iview, a.x) + a.d))
        if not check:  # step 4/5 failed: the grant returned, but the new mapping is left in place
            nxt = merge(And(a.fail, out == CODE["MemspecError"]), _kv_view(s, a.x, kc, at(s.iview, a.x)), nxt)
        return out, nxt
    return step


# -- releases: drop, unload, the deferred-free queue (spec/ep.py) -------------

def _enqueue(s: St, x: Any) -> St:
    """drop_owned: a live item's footprint moves from live to queued (never refunded here)."""
    h, b = at(s.ih, x), at(s.ib, x)
    return _item_set(s.set(lb=_hadd(s.lb, h, -b), qb=_hadd(s.qb, h, b)), x, I_QUEUED, b)


def _run(s: St, x: Any) -> St:
    """ep.run_entry: a queued release runs: its bytes are freed, its holder's charge refunded."""
    h, b = at(s.ih, x), at(s.ib, x)
    return _item_set(_refund(s, h, b, qb=_hadd(s.qb, h, -b), pb=_hadd(s.pb, h, -b)), x, I_GONE, b)


def _l_drop(s: St, a: St):
    out = outcome((at(s.ist, a.x) != I_LIVE, "DoubleFree"))
    return on_ok(out, s, _enqueue(s, a.x))


def _l_unload(s: St, a: St):
    return on_ok(z3.IntVal(OK), s, _enqueue(s, a.x))


def _l_poll(s: St, a: St):
    """poll runs the releases whose fences are done, one release per step
    (``run_done`` runs them one after another); ``none``: nothing was done."""
    return on_ok(z3.IntVal(OK), s, merge(a.none, s, _run(s, a.x)))


def _l_new_item(kind: int):
    """reserve_owned (an owning reservation) and kv_open (a KV request): a new
    charge item of 0 bytes, live (nothing is charged yet); the refusals
    (``unsup``: no VirtualBacking / SharedMapping; ``bad``: not a size, a
    prefix past its origin's pages; ``oom``: no address space) make nothing.
    A KV request's view starts as the ``p`` prefix bytes mapped from its
    origin (charged there: its own bytes 0)."""
    def step(s: St, a: St):
        out = outcome((a.unsup, "Unsupported"), (a.bad, "InvalidRequest"), (a.oom, "OutOfMemory"))
        s1 = _item_new(s, _KIND_HOLDER[kind], kind, I_LIVE, 0)
        if kind == K_KV:
            s1 = _kv_view(s1, s.n, a.p, a.p).set(ipre=upd(s.ipre, s.n, a.p))
        return on_ok(out, s, s1)
    return step


def _l_kv_close(s: St, a: St):
    """kv_close: the request's release is queued behind its fences; nothing
    is refunded until it runs (its pages stay its live bytes).  kv_use (a
    fence recorded) the same: the view, what is committed and charged stay."""
    return on_ok(z3.IntVal(OK), s, s)


def _kv_keep(s: St, x: Any, k: Any, go: Any) -> St:
    """KV request item ``x`` keeps ``k`` of its own bytes (when ``go``): the rest is freed and
    refunded; its view is its prefix plus what it keeps."""
    freed = at(s.ib, x) - k
    s1 = _item_set(_refund(s, KV_H, freed, **_live(s, KV_H, -freed)), x, I_LIVE, k)
    view = k + at(s.ipre, x)
    return merge(go, _kv_view(s1, x, view, view), s)


def _kv_kept(s: St, x: Any, k: Any) -> Any:
    """``x`` is a KV request's charge item and keeps ``0 <= k <=`` its bytes."""
    return And(at(s.ist, x) == I_LIVE, at(s.ik, x) == K_KV, 0 <= k, k <= at(s.ib, x))


def _l_kv_release(s: St, a: St):
    """poll running KV requests' releases (spec/holders.py release_request):
    request ``x`` (and ``y`` when ``two``) keeps ``kx`` (``ky``) bytes -- what
    its open sharers still map, or nothing -- the rest refunded to free."""
    return on_ok(z3.IntVal(OK), s, _kv_keep(_kv_keep(s, a.x, a.kx, True), a.y, a.ky, a.two))


# -- pressure tickets: ONE ticket record and ONE relation per ticket action ---
# (spec/governor.py ticket_receive, ticket_end, claim, cancel_ticket, expire,
# reconfigure; holders.py respond), shared by this ledger model and S15's
# ticket machine (:mod:`.proofs_seed000`, where G1 and S6 are proved too):
# both lay tickets out the same way -- ``tstate``, ``held``, ``amount``, the
# sum ``sumheld`` of what they hold split in two prefix-sum ghosts, pending
# (``PP``) and the rest (``PN``), over the dense ids ``0 <= t < nt`` -- and
# ``ret`` is what the step hands over or returns.  Each builder writes every
# field the machine has: the ticket machine's generations (``gen``,
# ``tgen``), each ticket's returns (``returns``) and the claimed grants
# (``sumgr``); the ledger model's open grants (``og``, ``gst``, ``gb``,
# ``PG``, ``ng``).  A holder's releases, which respond runs before its
# answer's bytes move into the ticket, are each machine's own records.

def _tpend(st: Any, h: Any) -> Any:
    """What a ticket in state ``st`` holding ``h`` adds to the pending ghost ``PP``."""
    return z3.If(st == T_PENDING, h, 0)


def _trest(st: Any, h: Any) -> Any:
    """... and to ``PN`` (every other state; a terminal ticket holds 0)."""
    return z3.If(st == T_PENDING, 0, h)


def _tmove(s: St, t: Any, st2: Any, h2: Any) -> dict[str, Any]:
    """The ticket ghosts after ticket ``t`` goes to state ``st2`` holding ``h2``."""
    st, h = at(s.tstate, t), at(s.held, t)
    return {"PP": prefix_change(s.PP, t, _tpend(st2, h2) - _tpend(st, h)),
            "PN": prefix_change(s.PN, t, _trest(st2, h2) - _trest(st, h))}


def _end(s: St, t: Any, st: int) -> St:
    """governor.ticket_end: the ticket's holdings go back to free, once (counted in ``returns``)."""
    h = at(s.held, t)
    kw = {"returns": upd(s.returns, t, at(s.returns, t) + 1)} if "returns" in s else {}
    return _with_ledger(s, K.return_grant(_ledger(s), h), tstate=upd(s.tstate, t, st), held=upd(s.held, t, 0),
                        sumheld=s.sumheld - h, ret=h, **_tmove(s, t, z3.IntVal(st), z3.IntVal(0)), **kw)


def _claim(s: St, a: St):
    """claim: a granted ticket's holdings become a grant (the ledger model's open grant ``g``)."""
    out = outcome((at(s.tstate, a.t) != T_GRANTED, "InvalidTicket"))
    h = at(s.held, a.t)
    kw = ({"sumgr": s.sumgr + h} if "sumgr" in s else
          {"og": s.og + h, "gst": upd(s.gst, a.g, G_OPEN), "gb": upd(s.gb, a.g, h),
           "PG": prefix_append(s.PG, s.ng, h), "ng": s.ng + 1})
    return on_ok(out, s, s.set(tstate=upd(s.tstate, a.t, T_CLAIMED), held=upd(s.held, a.t, 0), sumheld=s.sumheld - h,
                               ret=h, **_tmove(s, a.t, z3.IntVal(T_CLAIMED), z3.IntVal(0)), **kw))


def _cancel_ticket(check: bool):
    """cancel_ticket (unguarded, S15's variant: a terminal ticket is ended again)."""
    def step(s: St, a: St):
        out = outcome((_terminal(at(s.tstate, a.t)), "InvalidTicket")) if check else z3.IntVal(OK)
        return on_ok(out, s, _end(s, a.t, T_CANCELLED))
    return step


def _reconfigure(fail_stale: bool):
    """reconfigure: a new generation (the ticket machine's ``gen``); every pending ticket fails at
    once, and what they hold (``PP[nt]``) goes back to free.  Unguarded (G1's variant): only the
    generation moves."""
    def step(s: St, a: St):
        gen = {"gen": s.gen + 1} if "gen" in s else {}
        if not fail_stale:
            return on_ok(z3.IntVal(OK), s, s.set(**gen))
        i = z3.Int("rc_i")
        pend = lambda x: at(s.tstate, x) == T_PENDING  # noqa: E731
        back = at(s.PP, s.nt)
        if "returns" in s:
            gen["returns"] = z3.Lambda([i], z3.If(pend(i), at(s.returns, i) + 1, at(s.returns, i)))
        return on_ok(z3.IntVal(OK), s, _with_ledger(
            s, K.return_grant(_ledger(s), back), sumheld=s.sumheld - back, ret=back, PP=Z0(),
            tstate=z3.Lambda([i], z3.If(pend(i), T_FAILED, at(s.tstate, i))),
            held=z3.Lambda([i], z3.If(pend(i), 0, at(s.held, i))), **gen))
    return step


def _respond(released: Any):
    """respond: a holder answers ticket ``t``; ``released(s, a)`` is the machine's run of the
    holder's releases, ``(state after them, r)``: ``r`` the bytes its answer reports.  They move
    from free into the ticket (governor.ticket_receive), granted once it holds its amount.  A
    ticket neither pending nor granted, or pending from an older configuration (the ticket
    machine's generations): InvalidTicket."""
    def step(s: St, a: St):
        st = at(s.tstate, a.t)
        stale = [(And(st == T_PENDING, at(s.tgen, a.t) != s.gen), "InvalidTicket")] if "tgen" in s else []
        out = outcome((Not(Or(st == T_PENDING, st == T_GRANTED)), "InvalidTicket"), *stale)
        ran, r = released(s, a)
        held = at(s.held, a.t) + r
        nst = K.ite(And(st == T_PENDING, held >= at(s.amount, a.t)), T_GRANTED, st)
        return on_ok(out, s, _with_ledger(ran, K.grant_from_free(_ledger(ran), r), held=upd(s.held, a.t, held),
                                          tstate=upd(s.tstate, a.t, nst), sumheld=s.sumheld + r,
                                          **_tmove(s, a.t, nst, held)))
    return step


def _l_expire(s: St, a: St):
    """expire times out every due live ticket, one ticket per step; ``none``: none due."""
    return on_ok(z3.IntVal(OK), s, merge(a.none, s, _end(s, a.t, T_TIMED_OUT)))


def _l_released(s: St, a: St) -> tuple[St, Any]:
    """The ledger model's releases of a holder's answer: ``mode`` 0 nothing released; 1 a queued
    release ``x`` of its own ran (0 reported); 2 the cold weight ``x`` was its victim: dropped, run,
    and its bytes reported."""
    h, b, st0 = at(s.ih, a.x), at(s.ib, a.x), at(s.ist, a.x)
    # the release runs: a queued one (mode 1), or the victim's, queued and run at once (mode 2: live ->
    # refunded, its queued bytes come and go); either way the item's charge is refunded
    gone = _item_set(_refund(s, h, b, lb=_hadd(s.lb, h, -_contrib(st0, b, I_LIVE)), pb=_hadd(s.pb, h, -b),
                             qb=_hadd(s.qb, h, -_contrib(st0, b, I_QUEUED))), a.x, I_GONE, b)
    return merge(a.mode == 0, s, gone), K.ite(a.mode == 2, b, 0)


_l_respond = _respond(_l_released)

#: the spec draws existing tickets
_TICKET_EXISTS = lambda s, a: at(s.tstate, a.t) != 0  # noqa: E731
#: the ticket actions both machines draw alike: one Act (relation, arguments, precondition) on each
_CANCEL_TICKET = Act("cancel_ticket", {"t": INT}, _cancel_ticket(True), pre=_TICKET_EXISTS, objs=("t",))
_RECONFIGURE = Act("reconfigure", {}, _reconfigure(True))


# -- the device (mechanism level: spec/eager.py, vmm.py, shared.py) ----------
# Device objects over dense ids ``0 <= x < nm`` (kind ``mk``): an own
# allocation (``mst``/``mb``: its state and footprint; a foreign one, made by
# the twin: the argument ``foreign``), a backing reservation, a physical handle
# and a mapping -- their records and relations the VMM machine's (one
# encoding, :mod:`.proofs_seed000_objects`), on these ids; ``mb``: what each
# holds (a reservation's committed bytes, a handle's pages until freed, a
# copied mapping's private pages), ``PMB`` its sum, ``physical``; ``foreign``,
# the bytes the twin holds.

def _holds(s: St, o: Any, b: Any) -> Any:
    """Device object ``o`` (live) holds ``b`` bytes: what its record says it holds."""
    return And(at(s.mst, o) == I_LIVE, at(s.mb, o) == b, b >= 0)


def _m_allocate(check: bool):
    def step(s: St, a: St):
        pairs = [(Or(a.size <= 0, a.bad_align), "InvalidRequest")]
        if check:
            pairs.append((s.physical + a.fp > s.capacity, "OutOfMemory"))
        pairs.append((a.oom, "OutOfMemory"))
        return on_ok(outcome(*pairs), s, _m_new(s, M_ALLOC, a.fp))
    return step


def _m_release(s: St, a: St):
    """deallocate: a live allocation it made is freed and its footprint returned."""
    b = at(s.mb, a.x)
    out = outcome((a.foreign, "ForeignAllocation"), (at(s.mst, a.x) != I_LIVE, "StaleHandle"))
    return on_ok(out, s, s.set(physical=s.physical - b, mst=upd(s.mst, a.x, I_GONE), ret=b,
                               PMB=prefix_change(s.PMB, a.x, -b)))


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
        s.granted == s.og + s.sumheld, s.charged == at(s.cb, 0) + at(s.cb, 1) + at(s.cb, 2),
        prefix_sum(s.PC, s.n, lambda i: _charged(sel("ist", i), sel("ib", i))), s.charged == at(s.PC, s.n),
        prefix_sum(s.PG, s.ng, lambda i: _contrib(sel("gst", i), sel("gb", i), G_OPEN)), s.og == at(s.PG, s.ng),
        prefix_sum(s.PP, s.nt, lambda i: _tpend(sel("tstate", i), sel("held", i))),
        prefix_sum(s.PN, s.nt, lambda i: _trest(sel("tstate", i), sel("held", i))),
        s.sumheld == at(s.PP, s.nt) + at(s.PN, s.nt),
        0 <= s.physical, s.physical <= s.capacity,
        prefix_sum(s.PMB, s.nm, lambda i: _contrib(sel("mst", i), sel("mb", i), I_LIVE)), s.physical == at(s.PMB, s.nm),
    ]
    s.__dict__["_global"] = g
    return g


def _item_facts(s: St, o: Any) -> list[Any]:
    """Charge items: dense ids, a holder (the one of their kind), bytes >= 0."""
    live = at(s.ist, o) != 0
    return [Implies(live, And(0 <= o, o < s.n, 0 <= at(s.ih, o), at(s.ih, o) <= 2, at(s.ib, o) >= 0)),
            *[Implies(And(live, at(s.ik, o) == k), at(s.ih, o) == h) for k, h in _KIND_HOLDER.items()]]


def _l_inv(s: St, o: Any) -> Any:
    """The ledger is conserved; granted is the open grants plus the tickets'
    holdings; each holder's charge is its live footprints, queued refunds and
    leases; the running totals equal their records (prefix-sum ghosts); the
    device holds the sum of its live objects' bytes, at most its capacity."""
    return And(
        *_l_global(s),
        _holder_part(s, o),
        *_item_facts(s, o),
        # grants
        Implies(at(s.gst, o) != 0, And(0 <= o, o < s.ng, at(s.gb, o) >= 0)),
        # tickets
        Implies(at(s.tstate, o) != 0, And(0 <= o, o < s.nt)), at(s.held, o) >= 0,
        Implies(Or(at(s.tstate, o) == 0, _terminal(at(s.tstate, o))), at(s.held, o) == 0),
        # device objects: dense ids, bytes >= 0; a reservation, handle, live mapping: what it holds, its kind
        Implies(at(s.mst, o) != 0, And(0 <= o, o < s.nm, at(s.mb, o) >= 0)),
        Implies(at(s.mk, o) == M_RES, _holds(s, o, z3.If(at(s.rlive, o), at(s.reported, o), 0))),
        Implies(at(s.hexists, o), And(at(s.mk, o) == M_HANDLE, at(s.hsize, o) >= 0,
                                      _holds(s, o, z3.If(at(s.hfreed, o), 0, at(s.hsize, o))))),
        Implies(at(s.mlive, o), And(at(s.mk, o) == M_MAP, at(s.msize, o) >= 0, at(s.hexists, at(s.mh, o)),
                                    _holds(s, o, z3.If(at(s.mpriv, o), at(s.msize, o), 0)))),
    )


Z00 = lambda: z3.K(z3.IntSort(), Z0())  # noqa: E731
_L_FIELDS = {"cap": INT, "free": INT, "granted": INT, "charged": INT, "og": INT, "sumheld": INT, "page": INT,
             "ret": INT,
             "cb": ARR, "lb": ARR, "qb": ARR, "lsb": ARR, "pb": ARR,
             "gst": ARR, "gb": ARR, "PG": ARR, "ng": INT,
             "tstate": ARR, "held": ARR, "amount": ARR, "PP": ARR, "PN": ARR, "nt": INT,
             "ist": ARR, "ih": ARR, "ik": ARR, "ib": ARR, "n": INT, "PLV": ARR2, "PQ": ARR2, "PLS": ARR2, "PC": ARR,
             "ikc": ARR, "iview": ARR, "ipre": ARR,
             "physical": INT, "capacity": INT, "foreign": INT, "mst": ARR, "mb": ARR, "PMB": ARR, "nm": INT, "mk": ARR,
             "rlive": BARR, "rforeign": BARR, "rsize": ARR, "pc": ARR2B, "reported": ARR,
             "hexists": BARR, "hsize": ARR, "hreleased": BARR, "hmaps": ARR, "hfreed": BARR,
             "mlive": BARR, "mh": ARR, "msize": ARR, "mpriv": BARR}


_L_COUNTS = ("n", "ng", "nt", "nm")  # the dense-id counts of the ghosts


def _l_init(s: St) -> Any:
    return And(s.cap >= 0, s.free == s.cap, s.granted == 0, s.charged == 0, s.og == 0, s.sumheld == 0, s.page > 0,
                  s.cb == Z0(), s.lb == Z0(), s.qb == Z0(), s.lsb == Z0(), s.pb == Z0(),
                  s.gst == Z0(), s.ng == 0, at(s.PG, 0) == 0, s.tstate == Z0(), s.held == Z0(), s.nt == 0,
                  at(s.PP, 0) == 0, at(s.PN, 0) == 0,
                  s.ist == Z0(), s.n == 0, s.PLV == Z00(), s.PQ == Z00(), s.PLS == Z00(), at(s.PC, 0) == 0,
                  s.physical == 0, s.capacity >= 0, s.mst == Z0(), s.mk == Z0(), s.nm == 0, at(s.PMB, 0) == 0,
                  s.hexists == F0(), s.mlive == F0())


def _l_inst(s: St, o: Any, a: St) -> list:
    """The handle of mapping ``m`` (its bytes may be freed).  No other: ``charged`` is itself a
    checked prefix sum over the items (so a refund of one item's bytes keeps it >= 0), and each
    holder's buckets are stated at the invariant's free object."""
    return [at(s.mh, a.m)] if "m" in a else []


def _kind(k: int):
    return lambda s, a: at(s.ik, a.x) == k


_ITEM = lambda s, a: at(s.ist, a.x) != 0  # noqa: E731


def _m_kind(k: int):
    """``x`` is a device object of kind ``k``."""
    return lambda s, a: And(at(s.mst, a.x) != 0, at(s.mk, a.x) == k)


_M_RES = lambda s, a: at(s.mk, a.r) == M_RES  # noqa: E731


def _m_decommit_pre(s: St, a: St) -> Any:
    """A range the spec refuses, or one whose every page is committed: it holds at most the
    reservation's committed bytes."""
    return And(_M_RES(s, a), Or(a.hi - a.lo <= at(s.reported, a.r), *[c for c, _e in _s5_handle_errors(s, a.r)],
                                Not(K.range_ok(a.lo, a.hi, at(s.rsize, a.r), s.page)),
                                _some_page(s, a.r, a.lo, a.hi, False)))


_COMMIT_OWNED = {"x": INT, "nb": INT, "bad": BOOL, "oom": BOOL}


def _commit_owned_pre(s: St, a: St) -> Any:
    return And(_ITEM(s, a), _kind(K_RES)(s, a), at(s.ist, a.x) == I_LIVE, a.nb > 0)


_KV_GROW = {"x": INT, "d": INT, "past": BOOL, "refuse": BOOL, "fail": BOOL, "oom": BOOL}


def _kv_grow_pre(s: St, a: St) -> Any:
    return And(_ITEM(s, a), _kind(K_KV)(s, a), at(s.ist, a.x) == I_LIVE)


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
    Act("commit_owned", _COMMIT_OWNED, _l_commit_owned(True), pre=_commit_owned_pre, objs=("x",)),
    Act("kv_grow", _KV_GROW, _l_kv_grow(True), pre=_kv_grow_pre, objs=("x",)),
    Act("drop", {"x": INT}, _l_drop, pre=lambda s, a: And(_ITEM(s, a), _kind(K_ALLOC)(s, a)), objs=("x",)),
    Act("unload_weight", {"x": INT}, _l_unload,
        pre=lambda s, a: And(_kind(K_WEIGHT)(s, a), at(s.ist, a.x) == I_LIVE), objs=("x",)),
    Act("poll", {"x": INT, "none": BOOL}, _l_poll, pre=lambda s, a: Or(a.none, at(s.ist, a.x) == I_QUEUED),
        objs=("x",)),
    Act("claim", {"t": INT, "g": INT}, _claim, pre=lambda s, a: And(at(s.tstate, a.t) != 0, a.g == s.ng),
        objs=("t", "g")),
    _CANCEL_TICKET,
    Act("expire", {"t": INT, "none": BOOL}, _l_expire,
        pre=lambda s, a: Or(a.none, And(at(s.tstate, a.t) != 0, Not(_terminal(at(s.tstate, a.t))))), objs=("t",)),
    Act("respond", {"t": INT, "x": INT, "mode": INT}, _l_respond,
        pre=lambda s, a: And(at(s.tstate, a.t) != 0, Or(
            a.mode == 0, And(a.mode == 1, at(s.ist, a.x) == I_QUEUED),
            And(a.mode == 2, _kind(K_WEIGHT)(s, a), at(s.ist, a.x) == I_LIVE, at(s.ih, a.x) == WEIGHTS_H))),
        objs=("t", "x")),
    # ``bad_align``: an alignment that is not a power of two; the footprint is at least the size
    # (aligned_footprint: the page-rounded size plus the alignment beyond the page)
    Act("m_allocate", {"size": INT, "bad_align": BOOL, "fp": INT, "oom": BOOL}, _m_allocate(True),
        pre=lambda s, a: Or(a.size <= 0, a.bad_align, a.fp >= a.size)),
    Act("m_deallocate", {"x": INT, "foreign": BOOL}, _m_release, pre=_m_kind(M_ALLOC), objs=("x",)),
    # VirtualBacking and SharedMapping: the VMM machine's relations (a new handle: the next device object)
    Act("m_commit_range", _SPAN_OOM, _s5_span(True), pre=_M_RES, objs=("r",)),
    Act("m_decommit_range", _SPAN, _s5_span(False), pre=_m_decommit_pre, objs=("r",)),
    Act("m_release_reservation", {"r": INT}, _s5_release, pre=_M_RES, objs=("r",)),
    Act("m_create", _CREATE, _shm_create, pre=lambda s, a: a.h == s.nm, objs=("h",)),
    Act("m_release_handle", {"h": INT}, _shm_release(True), pre=_HANDLE, objs=("h",)),
    Act("m_unmap", _MAPARGS, _shm_unmap, pre=_DRAWN_MAPPING, objs=("m",)),
    Act("m_copy_on_write", {**_MAPARGS, "oom": BOOL}, _shm_cow, pre=_DRAWN_MAPPING, objs=("m",)),
    _RECONFIGURE,
    # issue 33: the reservation and KV request paths (reserve / open, close, the KV release run by poll)
    Act("reserve_owned", {"unsup": BOOL, "bad": BOOL, "oom": BOOL}, _l_new_item(K_RES)),
    Act("close_owned", {"x": INT}, _l_unload,
        pre=lambda s, a: And(_kind(K_RES)(s, a), at(s.ist, a.x) == I_LIVE), objs=("x",)),
    Act("kv_open", {"unsup": BOOL, "bad": BOOL, "oom": BOOL, "p": INT}, _l_new_item(K_KV),
        pre=lambda s, a: And(Not(a.oom), a.p >= 0)),
    Act("kv_close", {"x": INT}, _l_kv_close, pre=lambda s, a: And(_kind(K_KV)(s, a), at(s.ist, a.x) == I_LIVE),
        objs=("x",)),
    # S9's: a fence recorded on an open request (nothing of the ledger changes)
    Act("kv_use", {"x": INT}, _l_kv_close, pre=lambda s, a: And(_kind(K_KV)(s, a), at(s.ist, a.x) == I_LIVE),
        objs=("x",)),
    Act("kv_release", {"x": INT, "kx": INT, "y": INT, "ky": INT, "two": BOOL}, _l_kv_release,
        pre=lambda s, a: And(_kv_kept(s, a.x, a.kx), Implies(a.two, And(_kv_kept(s, a.y, a.ky), a.x != a.y))),
        objs=("x", "y")),
]}


def _l_acts(*names: str) -> list[Act]:
    return [_L_ACTS[n] for n in names]


#: the actions issue 33 added to the ledger model (both rows)
_L_NEW = ("reserve_owned", "close_owned", "kv_open", "kv_close", "kv_release")
#: the ledger model's actions: S11's machine
_L_ALL = ("reserve", "commit", "cancel", "refund_lease", "allocate_owned", "load_weight", "commit_owned", "kv_grow",
          "drop", "unload_weight", "poll", "claim", "cancel_ticket", "expire", "respond", "m_allocate", "m_deallocate",
          "m_commit_range", "m_decommit_range", "m_release_reservation", "m_create", "m_release_handle", "m_unmap",
          "m_copy_on_write", "reconfigure", *_L_NEW)


def _s8_named(s: St, o: Any) -> Any:
    """S8 on the records: granted is the open grants plus what tickets hold,
    and a holder's charge is its live footprints, queued refunds and leases."""
    return And(s.granted == at(s.PG, s.ng) + at(s.PP, s.nt) + at(s.PN, s.nt),
                  Implies(And(0 <= o, o <= 2), at(s.cb, o) == sum(at(at(s[P], o), s.n) for P, _w in _BUCKETS)))


S8 = Proof(
    *catalog("S8"),
    fields=dict(_L_FIELDS), init=_l_init, inv=_l_inv, inst=_l_inst,
    counts=_L_COUNTS,
    # S11's steps; not all of them: with every one of S11's actions the depth-3 trace of the unguarded
    # commit (reserve, commit, commit) is past the BMC's fixed solver budget inside ``prove``
    # (nor kv_release: with it the BMC's answer depends on the Z3 terms the process built before)
    actions=_l_acts("reserve", "commit", "cancel", "allocate_owned", "load_weight", "m_allocate",
                    *(n for n in _L_NEW if n != "kv_release")),
    unguarded=Act("commit", {"g": INT, "actual": INT}, _l_commit(False),
                  pre=lambda s, a: And(at(s.gst, a.g) != 0, a.actual >= 0), objs=("g",)),
    guard="only an open grant can be committed (a committed or cancelled one: InvalidRequest)",
    bmc_depth=3,
)


# ==========================================================================
# S2 charge-before-commit: on the ledger model (above), the actions that
# charge a holder or install bytes for it, and the ones that lower either
# (spec/governor.py, manager.py, vmm.py commit_owned, holders.py kv_grow,
# the queue's releases: poll, a holder's answer)
#
# Per holder: ``pb`` the physical bytes installed for it, ``cb`` its charge.
# Every action that installs bytes first obtains their charge (*a charge
# must be obtained before physical commit*); a charge is lowered only with
# the bytes behind it (a queued release frees them, then refunds as much),
# or alone where nothing is installed behind it (a lease).  The unguarded
# variant: commit_owned maps the bytes, the Governor charges what it can.
# ==========================================================================

def _s2_named(s: St, h: Any) -> Any:
    """A holder's installed physical bytes never exceed its charge."""
    return Implies(And(0 <= h, h <= 2), at(s.pb, h) <= at(s.cb, h))


def _s2_inv(s: St, o: Any) -> Any:
    """S2's rule with what its steps need of the ledger: a holder's charge is
    its live footprints, queued refunds and leases, each the sum over its
    charge items (as for S8), and the first two are what is installed for it
    (a lease is charge with nothing installed behind it); the items' facts
    (dense ids from 0); an open grant's bytes >= 0 (cancel returns them), free >= 0."""
    return And(_holder_part(s, o), Implies(And(0 <= o, o <= 2), at(s.pb, o) == at(s.lb, o) + at(s.qb, o)),
               *_item_facts(s, o), s.n >= 0, Implies(at(s.gst, o) != 0, at(s.gb, o) >= 0), s.free >= 0)


#: S2's actions on the ledger model (kv_release and poll: a poll running KV releases, or another's)
_S2_ACTS = ("reserve", "cancel", "commit", "refund_lease", "allocate_owned", "load_weight", "commit_owned", "kv_grow",
            "poll", "kv_release", "respond", "reserve_owned")

S2 = Proof(
    *catalog("S2"),
    fields=dict(_L_FIELDS), init=_l_init, inv=_s2_inv,
    actions=_l_acts(*_S2_ACTS),
    unguarded=Act("commit_owned", _COMMIT_OWNED, _l_commit_owned(False), pre=_commit_owned_pre, objs=("x",)),
    guard="commit_owned requires the Governor to charge all the bytes (else GrantDenied) before mapping them",
    bmc_depth=2,
)


# ==========================================================================
# S9 transactional-growth: on the ledger model (above), the actions that
# touch a KV request's view or its pages (spec/holders.py kv_open, kv_use,
# kv_grow, kv_close; poll and respond running the releases)
# ==========================================================================

def _s9_named(s: St, o: Any) -> Any:
    """A KV request's view is what is committed in it, and its own charged
    pages plus its prefix are what is committed."""
    return Implies(And(at(s.ist, o) != 0, at(s.ik, o) == K_KV),
                   And(at(s.iview, o) == at(s.ikc, o), at(s.ib, o) + at(s.ipre, o) == at(s.ikc, o)))


def _s9_inv(s: St, o: Any) -> Any:
    """S9's rule, with what its steps need of the ledger: an item's bytes are
    >= 0 (a release refunds them to free), free >= 0 (a growth takes from it)."""
    return And(_s9_named(s, o), Implies(at(s.ist, o) != 0, at(s.ib, o) >= 0), s.free >= 0, s.page > 0)


#: S9's actions on the ledger model (kv_release and poll: a poll running KV releases, or another's)
_S9_ACTS = ("kv_open", "kv_use", "kv_close", "kv_grow", "kv_release", "poll", "respond")

S9 = Proof(
    *catalog("S9"),
    fields=dict(_L_FIELDS), init=_l_init, inv=_s9_inv,
    actions=_l_acts(*_S9_ACTS),
    unguarded=Act("kv_grow", _KV_GROW, _l_kv_grow(False), pre=_kv_grow_pre, objs=("x",)),
    guard="a failure at step 4/5 rolls back the mapping (and returns the grant)",
    bmc_depth=2,
)


# ==========================================================================
# S11 ledger-conservation: the ledger model (above), every action
# that declares S11 (system level: the Governor, the binding, the holders,
# the deferred-free queue; mechanism level: the device's physical bytes)
# ==========================================================================

def _s11_named(s: St, o: Any) -> Any:
    """capacity == free + granted + charged, all >= 0; the holders' charges
    sum to charged, each >= 0; the device holds 0..capacity physical bytes."""
    return And(K.ledger_ok(_ledger(s)), s.charged == at(s.cb, 0) + at(s.cb, 1) + at(s.cb, 2),
                  Implies(And(0 <= o, o <= 2), at(s.cb, o) >= 0),
                  0 <= s.physical, s.physical <= s.capacity)


S11 = Proof(
    *catalog("S11"),
    fields=dict(_L_FIELDS), init=_l_init, inv=_l_inv, inst=_l_inst,
    counts=_L_COUNTS,
    actions=_l_acts(*_L_ALL),
    unguarded=Act("reserve", {"g": INT, "nb": INT}, _l_reserve(False), pre=lambda s, a: a.g == s.ng, objs=("g",)),
    guard="the Governor grants only what is free (can_grant)",
    bmc_depth=1,
)
