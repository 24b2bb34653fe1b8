"""Projections of the executable spec's states onto the Z3 encodings
(:mod:`memspec.invariants.formal.proofs_seed000`), per action; see
:mod:`memspec.invariants.formal.agreement`.

The adapters are split by level, each module under 1,200 lines:
:mod:`.agreement_adapters_mech` (the mechanism level), :mod:`.agreement_adapters_system`
(the system level's protocols), and this module (the ledger model of S2 / S8 / S9 / S11 at both
levels, the deferred-free queue machine of S1, S4, S7, S10, S14).  The adapter lists are
one list each, extended in that order.  Every name of the parts is a name of this
module: import from here.
"""

from __future__ import annotations

from typing import Any

from memspec.invariants.formal import proofs_seed000 as E
from memspec.invariants.formal.agreement import Adapter, Universe, flatten
from memspec.invariants.formal.proofs import prefix_values
from memspec.invariants.formal import agreement_adapters_mech, agreement_adapters_system
from memspec.invariants.formal.agreement_adapters_mech import (
    MECH_ADAPTERS, _empty, _expected, _is_int, _not_size, _project, _ret,
    _res_args, _res_record, _shm_create_args, _shm_handle_args, _shm_mapping_args, _shm_record, _span_args,
)
from memspec.invariants.formal.agreement_adapters_system import (
    SMALL_SYS_ADAPTERS, SYS_ADAPTERS, TICKET_ADAPTERS, _ASTATE, _answer_victims, _done_seqs, _kv_open_refusals,
    _kv_growth, _kv_record, _kv_run, _ticket_record,
)

#: the modules this one is assembled from, in order (split by level); a name
#: defined there is one object, whichever module a caller reads it from, so a test that rebinds one
#: (``monkeypatch.setattr``) rebinds it in each module of :data:`PARTS` that has it and here
PARTS = (agreement_adapters_mech, agreement_adapters_system)
# the package face: every name of the parts, private ones included, is a name of this module, as before the split
for _part in PARTS:
    globals().update({_k: _v for _k, _v in vars(_part).items() if not _k.startswith("__")})
del _part


# -- S2 / S8 / S9 / S11: the ledger model ------------------------------------
# Every figure is recomputed from the spec's records (grants, tickets, owned
# objects, KV requests, leases, queue entries), except the running totals the
# spec keeps (open_grants, tickets_held, charged_by, live/queued/lease bytes
# and physical bytes by holder), which are projected as they are: the encoding proves them equal
# to the records' sums, and the agreement checks that the spec keeps them so.
# A KV request's item carries its view (S9): committed bytes, the view, the prefix.

from memspec.spec.api import Grant  # noqa: E402

_GSTATE = {"open": E.G_OPEN, "committed": E.G_COMMITTED, "cancelled": E.G_CANCELLED}
_HOLDER_IX = {"session": E.SESSION_H, "weights": E.WEIGHTS_H, "kv": E.KV_H}
_OWNED_KIND = {"allocation": E.K_ALLOC, "weight": E.K_WEIGHT, "reservation": E.K_RES}
_OWNED_STATE = {"live": E.I_LIVE, "queued": E.I_QUEUED, "freed": E.I_GONE}


def _l_items(s: Any) -> list[tuple[Any, int, int, int, int]]:
    """``(key, holder, kind, state, bytes)`` of every charge item, in id order:
    queued pieces not of an owned object first (by queue seq), then owned
    objects, KV requests and leases by reference (a new one comes last)."""
    items: list[tuple[Any, int, int, int, int]] = []
    for seq, e in s.queue.items():
        if e.owned is not None and e.owned in s.owned:
            continue
        for h, nb in sorted(e.refund.items()):
            items.append(((0, seq, h), _HOLDER_IX[h], E.K_PIECE, E.I_QUEUED, nb))
    for r, o in s.owned.items():
        if o.kind in _OWNED_KIND:
            items.append(((1, r), _HOLDER_IX[o.holder], _OWNED_KIND[o.kind], _OWNED_STATE[o.state], o.footprint))
    for r, q in s.kv.items():
        items.append(((1, r), E.KV_H, E.K_KV, E.I_LIVE, q.own))
    for r, l_ in s.leases.items():
        items.append(((1, r), _HOLDER_IX[l_.holder], E.K_LEASE, E.I_GONE if l_.refunded else E.I_LEASE, l_.nbytes))
    return sorted(items, key=lambda t: t[0])


def _l_views(s: Any, u: Universe) -> dict[str, Any]:
    """Each KV request's item: the bytes committed in its view (its own pages and its prefix), the
    view, the prefix mapped from its origin."""
    return _kv_record(s, {r: u.idx["item"][(1, r)] for r in s.kv}, ikc="committed", iview="committed", ipre="prefix")


def _l_pad(u: Universe) -> None:
    """Round the universe up to a multiple of 4 objects, with room for one the step makes: the
    encoded relation is compiled once per universe size, and a compile costs as much as ~50 samples."""
    n = max(len(m) for m in u.idx.values()) + 1
    u.idx["pad"] = {("pad", i): i for i in range(-(-n // 4) * 4)}


def _l_state(s: Any, ret: int = 0) -> tuple[dict[str, Any], Universe]:
    u = Universe()
    u.add("holder", list(E.HOLDERS_H))
    gx = u.add("grant", s.grants)
    tx = u.add("ticket", s.tickets)
    items = _l_items(s)
    u.idx["item"] = {it[0]: i for i, it in enumerate(items)}
    hx = {name: ix for name, ix in _HOLDER_IX.items()}

    def per_holder(d: dict[str, int]) -> tuple[int, dict[int, int]]:
        return (0, {hx[h]: n for h, n in d.items()})

    def keyed(which: int) -> dict[int, Any]:
        return {h: prefix_values([nb if (st == which and hh == h) else 0 for _k, hh, _kd, st, nb in items])
                for h in E.HOLDERS_H}

    grants = sorted(s.grants.items())
    st = {
        **_empty(E.S11.fields),
        "cap": s.capacity, "free": s.free, "granted": s.granted, "charged": s.charged, "og": s.open_grants,
        "page": s.page, "ret": ret, **_ticket_record(s, tx),
        "cb": per_holder(s.charged_by), "lb": per_holder(s.live_bytes_by), "qb": per_holder(s.queued_bytes_by),
        "lsb": per_holder(s.lease_bytes), "pb": per_holder(s.physical_by),
        "gst": (0, {gx[r]: _GSTATE[g.state] for r, g in grants}), "gb": (0, {gx[r]: g.nbytes for r, g in grants}),
        "PG": prefix_values([g.nbytes if g.state == "open" else 0 for _r, g in grants]), "ng": len(grants),
        "ist": (0, {i: it[3] for i, it in enumerate(items)}), "ih": (0, {i: it[1] for i, it in enumerate(items)}),
        "ik": (0, {i: it[2] for i, it in enumerate(items)}), "ib": (0, {i: it[4] for i, it in enumerate(items)}),
        "n": len(items), "PLV": keyed(E.I_LIVE), "PQ": keyed(E.I_QUEUED), "PLS": keyed(E.I_LEASE),
        "PC": prefix_values([nb if st_ in (E.I_LIVE, E.I_QUEUED, E.I_LEASE) else 0 for _k, _h, _kd, st_, nb in items]),
        **_l_views(s, u),
    }
    _l_pad(u)
    return st, u


_L_CMP = ("cap", "free", "granted", "charged", "og", "sumheld", "cb", "lb", "qb", "lsb", "pb", "gst", "gb", "tstate",
          "held")
_L_CMP_ITEMS = _L_CMP + ("ist", "ib", "ikc", "iview", "ipre")


# the value returned: an int, or a Grant's bytes (commit); the padding is the pre-state's
_l_expected = _expected(_l_state, E.S11.fields, _L_CMP_ITEMS + ("ret",), adopt=("grant", "ticket", "item"),
                        value=lambda v: {"ret": v if _is_int(v) else v.nbytes if isinstance(v, Grant) else 0})


def _l_new(u: Universe, kind: str) -> int:
    n = len(u.idx[kind])
    u.idx[kind] = {**u.idx[kind], ("new", n): n}
    return n


def _size(x: Any) -> int:
    return x if _is_int(x) and x > 0 else 0


def _new_item(args_fn: Any) -> Any:
    """The arguments of an action that makes a charge item: the item's slot (the next index) first."""
    def fn(s: Any, u: Universe, a: dict[str, Any], taken: str) -> dict[str, Any]:
        _l_new(u, "item")
        return args_fn(s, u, a, taken)
    return fn


def _l_item(key: str) -> Any:
    """The charge item of the owned record, KV request or lease that the argument ``key`` names."""
    return lambda s, u, a, taken: {"x": u.idx["item"][(1, a[key])]}


def _l_alloc_args(s: Any, u: Universe, a: dict[str, Any], taken: str) -> dict[str, Any]:
    from memspec.spec import kernels as K

    size = _size(a["size"])
    return {"size": size, "fp": K.round_up(size, s.page) if size else 0, "oom": taken == "OutOfMemory"}


def _l_commit_owned_args(s: Any, u: Universe, a: dict[str, Any], taken: str) -> dict[str, Any]:
    from memspec.spec.vmm import pages, range_legal

    ref, start, end = a["span"]
    o = s.owned[ref]
    bad = not range_legal(s, o, start, end) or any(p in o.committed for p in pages(s, start, end))
    return {"x": u.idx["item"][(1, ref)], "nb": max(end - start, 1), "bad": bad, "oom": taken == "OutOfMemory"}


def _l_kv_grow_args(s: Any, u: Universe, a: dict[str, Any], taken: str) -> dict[str, Any]:
    r, new, _fail_at = a["growth"]
    g = _kv_growth(s, a, taken, {r: u.idx["item"][(1, r)]})
    return {"x": g.pop("r"), "d": g.pop("end") - s.kv[r].committed, "past": new > s.kv[r].max_bytes, **g}


#: the arguments of the ledger machine's encoded actions, one entry per action, each read off the one
#: projection of the system state (:func:`_l_state`; an action that makes an object takes the next index)
_L_ARGS = {
    "reserve": lambda s, u, a, taken: {"g": _l_new(u, "grant"), "nb": _size(a["nbytes"])},
    "commit": _new_item(lambda s, u, a, taken: {"g": u.idx["grant"][a["grant"][0]], "actual": a["grant"][1]}),
    "cancel": lambda s, u, a, taken: {"g": u.idx["grant"][a["grant"]]},
    "refund_lease": _l_item("lease"),
    "allocate_owned": _new_item(_l_alloc_args),
    "load_weight": _new_item(lambda s, u, a, taken: {"nb": a["weight"][2], "oom": taken == "OutOfMemory"}),
    "commit_owned": _l_commit_owned_args,
    "kv_grow": _l_kv_grow_args,
    "drop": _l_item("allocation"),
    "unload_weight": lambda s, u, a, taken: {"x": u.idx["item"][(1, s.weights[a["weight"]].owned)]},
    "claim": lambda s, u, a, taken: {"t": u.idx["ticket"][a["ticket"]], "g": _l_new(u, "grant")},
    "cancel_ticket": lambda s, u, a, taken: {"t": u.idx["ticket"][a["ticket"]]},
    "reconfigure": lambda s, u, a, taken: {},
    "reserve_owned": _new_item(lambda s, u, a, taken: {
        "unsup": not s.registry.capabilities[s.registry.installed][0], "bad": _not_size(a["size"]),
        "oom": taken == "OutOfMemory"}),
    "close_owned": _l_item("reservation"),
    "kv_open": _new_item(lambda s, u, a, taken: {**_kv_open_refusals(s, a["request"]), "oom": False,
                                                 "p": a["request"][3] if a["request"][2] is not None else 0}),
    "kv_close": _l_item("request"),
    "kv_use": _l_item("request"),
}


def _entry_item(s: Any, u: Universe, seq: int) -> int | None:
    """The charge item a queue entry releases (one refund of one holder), else None."""
    e = s.queue[seq]
    if e.owned is not None and e.owned in s.owned:
        return u.idx["item"][(1, e.owned)]
    if len(e.refund) != 1:
        return None
    (h,) = e.refund
    return u.idx["item"][(0, seq, h)]


def _l_poll_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    seqs = _done_seqs(s, args["pending"])
    if len(seqs) > 1:
        return None  # several releases: the encoding runs one per step
    st, u = _l_state(s)
    x = _entry_item(s, u, seqs[0]) if seqs else 0
    if x is None:
        return None
    return st, {"x": x, "none": not seqs}, u


def _l_expire_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    t_now, live = args["now"]
    due = [r for r in live if s.tickets[r].state not in ("claimed", "cancelled", "timed_out", "failed")
           and 0 < s.tickets[r].deadline <= t_now]  # the spec's expire: live tickets past their deadline
    if len(due) > 1:
        return None  # several tickets: the encoding times out one per step
    st, u = _l_state(s)
    return st, {"t": u.idx["ticket"][due[0]] if due else 0, "none": not due}, u


def _l_respond_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    t_ref, holder, terminal = args["answer"]
    st, u = _l_state(s)
    t = u.idx["ticket"][t_ref]
    if terminal or taken != "ok":
        return st, {"t": t, "x": 0, "mode": 0}, u
    seqs = _done_seqs(s, args["pending"])
    victims = _answer_victims(s, holder)
    if len(seqs) + len(victims) > 1:
        return None  # several releases: the encoding runs one per step
    if victims:
        return st, {"t": t, "x": u.idx["item"][(1, victims[0].owned)], "mode": 2}, u
    if seqs:
        x = _entry_item(s, u, seqs[0])
        return None if x is None else (st, {"t": t, "x": x, "mode": 1}, u)
    return st, {"t": t, "x": 0, "mode": 0}, u


def _l_kv_release_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    """A poll whose done releases are KV requests' only, changing at most two
    requests' own bytes (the encoding's step); other polls: the ``poll`` adapter."""
    seqs = _done_seqs(s, args["pending"])
    if not seqs or any(s.queue[q].kv is None for q in seqs):
        return None
    _freed, own = _kv_run(s, [s.queue[q].kv for q in seqs])
    changed = sorted(r for r in own if own[r] != s.kv[r].own)
    if not changed or len(changed) > 2:
        return None
    st, u = _l_state(s)
    ix = u.idx["item"]
    c = changed + [None]
    return st, {"x": ix[(1, c[0])], "kx": own[c[0]], "y": ix[(1, c[1])] if c[1] is not None else 0,
                "ky": own[c[1]] if c[1] is not None else 0, "two": c[1] is not None}, u


_L_RET = ("cancel", "refund_lease", "claim", "cancel_ticket")
#: the ledger projection is the whole Governor state (a few ms a sample, more for an invariant
#: evaluation): S8 / S11 sample 25 adapters, so each takes a share of the run's samples (60 of the
#: default 400) and 10 invariant-agreement states; past its share an adapter still samples every
#: outcome it has seen fewer than ``agreement.RARE`` times, so a rare branch is not lost to the share
_L_WEIGHT, _L_MAX_INV = 0.15, 10


#: every encoded action's projection: the ledger projection with the action's arguments (:data:`_L_ARGS`),
#: or one of its own where a step's releases decide whether the sample is one the encoding runs
_L_PROJECT = {**{a: _project(_l_state, f) for a, f in _L_ARGS.items()},
              "poll": _l_poll_p, "expire": _l_expire_p, "respond": _l_respond_p, "kv_release": _l_kv_release_p}
#: the spec action of an encoded action named otherwise; the actions whose charge items are not compared
#: (a queued piece leaves the queue)
_L_SPEC, _L_NO_ITEMS = {"kv_release": "poll"}, ("poll", "respond")


def _l_ad(inv: str, act: str, also: tuple[str, ...] = ()) -> Adapter:
    items = act not in _L_NO_ITEMS
    # commit's GrantDenied (the footprint exceeds the grant by more than is free) needs an almost full
    # ledger: its adapter is not capped and samples its outcomes in equal shares
    rare = act == "commit"
    # kv_grow's InvalidRequest (a growth of nothing refused, which the spec permits) is one draw in
    # ~20: the adapter keeps a larger share so that the walk draws kv_grow often enough to meet it
    weight = 0.375 if act == "kv_grow" else _L_WEIGHT
    return Adapter(inv, act, _L_SPEC.get(act, act), _L_PROJECT[act], _l_expected,
                   (_L_CMP_ITEMS if items else _L_CMP) + (("ret",) if act in _L_RET else ()), also=also,
                   balance=3 if rare else 0, weight=weight, max_inv_samples=_L_MAX_INV)


_L_SYS = ("reserve", "commit", "cancel", "allocate_owned", "load_weight")
_L_SYS11 = ("refund_lease", "commit_owned", "kv_grow", "drop", "unload_weight", "poll", "cancel_ticket", "expire",
            "respond", "reconfigure")
# S8's actions are encoded by S11's very steps (one ledger model): each sample counts for both
SYS_ADAPTERS += [_l_ad("S11", a, also=("S8",)) for a in _L_SYS]
SYS_ADAPTERS += [_l_ad("S11", a) for a in _L_SYS11]
# issue 33: the reservation and KV request paths, on both rows' machine
_L_SYS_NEW = ("reserve_owned", "close_owned", "kv_open", "kv_close", "kv_release")
SYS_ADAPTERS += [_l_ad("S11", a) for a in _L_SYS_NEW]  # S8's and S9's shares: below
# S9's kv_use (a fence recorded: nothing of the ledger changes) is not S11's action
SYS_ADAPTERS += [_l_ad("S9", "kv_use")]
# claim succeeds only on a granted ticket: sampled on the ticket protocol's walk, where they are common
TICKET_ADAPTERS += [_l_ad("S11", "claim")]
# commit's GrantDenied (the footprint exceeds the grant by more than is free) needs an almost full
# ledger: the walk on a device of two pages reaches it often
SMALL_SYS_ADAPTERS += [a for a in SYS_ADAPTERS if a.invariant == "S11" and a.action in ("commit", "reserve_owned")]


# -- S8 / S11 at the mechanism level: the device's physical bytes --------------

def _l_mech_state(s: Any, ret: int = 0) -> tuple[dict[str, Any], Universe]:
    """The ledger is the system level's (all 0 here); the device holds
    ``physical`` bytes, the sum of what its live objects hold: own live
    allocations (footprint), backing reservations (committed bytes), handles
    not freed, private (copied) mappings; the last three's records as the VMM
    machine projects them (:func:`_res_record`, :func:`_shm_record`, at their ids here)."""
    u = Universe()
    objs: list[tuple[Any, int, int, int]] = []
    for r, a in s.allocations.items():
        objs.append((("a", r), E.I_LIVE if (a.live and not a.foreign) else E.I_GONE, 0 if a.foreign else a.footprint,
                     E.M_ALLOC))
    res = {r: v for r, v in s.reservations.items() if v.kind == "backing"}
    objs += [(("r", r), E.I_LIVE, v.reported if v.live else 0, E.M_RES) for r, v in res.items()]
    objs += [(("h", r), E.I_LIVE, 0 if h.freed else h.size, E.M_HANDLE) for r, h in s.handles.items()]
    objs += [(("m", r), E.I_LIVE, m.size if (m.live and m.private) else 0, E.M_MAP) for r, m in s.mappings.items()]
    objs.sort(key=lambda o: o[0][1])  # by reference: a new object comes last
    ix = u.idx["mitem"] = {o[0]: i for i, o in enumerate(objs)}
    u.idx["holder"] = {h: h for h in E.HOLDERS_H}
    rx = u.idx["res"] = {r: ix[("r", r)] for r in res}
    hx = u.idx["handle"] = {r: ix[("h", r)] for r in s.handles}
    mx = u.idx["mapping"] = {r: ix[("m", r)] for r in s.mappings}
    st = {**_empty(E.S11.fields), "page": s.page, "ret": ret,
          "mst": (0, {i: o[1] for i, o in enumerate(objs)}), "mb": (0, {i: o[2] for i, o in enumerate(objs)}),
          "mk": (0, {i: o[3] for i, o in enumerate(objs)}),
          "PMB": prefix_values([o[2] if o[1] == E.I_LIVE else 0 for o in objs]), "nm": len(objs),
          **_res_record(s, res, rx), **_shm_record(s, hx, mx)}
    _l_pad(u)
    return st, u


#: (not a reservation's size, owner or pages: the VMM machine compares them, on the same relations)
_M_CMP = ("physical", "mst", "mb", "mk", "rlive", "reported", "hexists", "hsize", "hreleased", "hmaps", "hfreed",
          "mlive", "mh", "msize", "mpriv")


_l_mech_expected = _expected(_l_mech_state, E.S11.fields, _M_CMP + ("ret",), adopt=("mitem",), value=_ret)


def _l_m_alloc_args(s: Any, u: Universe, a: dict[str, Any], taken: str) -> dict[str, Any]:
    from memspec.spec import kernels as K

    from memspec.spec.eager import ALIGNMENT

    size, align = _size(a["size"]), a.get("alignment", ALIGNMENT)
    bad = not (_is_int(align) and align > 0 and align & (align - 1) == 0)
    _l_new(u, "mitem")
    fp = K.round_up(size, s.page) if size and not bad else 0  # the walk's footprint: the witness's
    return {"size": size, "bad_align": bad, "fp": fp, "oom": taken == "OutOfMemory"}


#: the device-side encoded actions (``m_<spec action>``): their arguments, read off the one device
#: projection (:func:`_l_mech_state`; SharedMapping's: the VMM machine's), and whether the step's value is
#: compared
_L_M_ARGS = {
    "commit_range": (_span_args, True), "decommit_range": (_span_args, True), "release_reservation": (_res_args, True),
    "create": (_shm_create_args("mitem"), False), "release_handle": (_shm_handle_args, True),
    "unmap": (_shm_mapping_args, True), "copy_on_write": (_shm_mapping_args, True),
    "allocate": (_l_m_alloc_args, False),
    "deallocate": (lambda s, u, a, taken: {"x": u.idx["mitem"][("a", a["handle"])],
                                           "foreign": s.allocations[a["handle"]].foreign}, True),
}
MECH_ADAPTERS += [
    # S8's encoding of allocate is S11's (same step, same fields): each sample counts for both
    Adapter("S11", f"m_{name}", name, _project(_l_mech_state, args), _l_mech_expected,
            _M_CMP + (("ret",) if ret else ()), also=("S8",) if name == "allocate" else (),
            weight=_L_WEIGHT, max_inv_samples=_L_MAX_INV)
    for name, (args, ret) in _L_M_ARGS.items()
]


# S2's, S8's and S9's machines are part of S11's (one ledger model, the very same steps): each sample
# of an action one of them encodes counts for it too
for _a in SYS_ADAPTERS + MECH_ADAPTERS + TICKET_ADAPTERS + SMALL_SYS_ADAPTERS:
    for _row in ("S2", "S8", "S9"):
        if _a.invariant == "S11" and _a.action in E.ENCODES[_row] and _row not in _a.also:
            _a.also = _a.also + (_row,)


# -- S1, S4, S7, S10, S14: the deferred-free queue -----------------------------
#
# S1, S4, S7, S10 and S14 are one machine (S4's), the system state projected once
# (:func:`_qstate`; the mechanism state: :func:`_q_mech_state`): one adapter
# per spec action, credited to the rows that claim it (S14: the creations).
# The objects of these encodings are everything released through the queue:
# owned records (allocation, weight, reservation) and KV requests by
# reference id, then queued decommits (queue entries of neither) by entry
# sequence number.  Each is keyed; the dense index of a key is fixed by the
# state before the step, and an object the step makes gets the next index.
# States, fences and creators are read from the records themselves (never
# from the spec's own ``pins()``, ``known_flags`` or ``releasing_mechanism``).

_KV_STATE = {"open": E.LIVE, "closed": E.QUEUED, "released": E.FREED}


def _queue_objects(s: Any) -> list[tuple[Any, int, list[int], int]]:
    """``(key, lifecycle code, fence refs, creator)`` of every queue object."""
    out = [(("ref", r), _ASTATE[o.state], o.fences, o.creator) for r, o in s.owned.items()]
    out += [(("ref", r), _KV_STATE[q.state], q.fences, q.creator) for r, q in s.kv.items()]
    out.sort(key=lambda t: t[0][1])
    out += [(("entry", seq), E.QUEUED, e.fences, e.creator) for seq, e in sorted(s.queue.items())
            if e.owned is None and getattr(e, "kv", None) is None]
    return out


class QueueUniverse(Universe):
    """A :class:`Universe` whose objects are keyed (see :func:`_queue_objects`); ``creators``: the
    creator of every object seen (a queued decommit that ran is gone from the queue, its creator not)."""

    creators: dict[Any, int] = {}   # replaced, never changed in place

    def index(self, keys: list[Any]) -> dict[Any, int]:
        """Dense indices of ``keys``: those known keep theirs, new ones follow."""
        m = dict(self.idx.get("q", {}))
        for k in keys:
            if k not in m:
                m[k] = len(m)
        self.idx["q"] = m
        return m


def _releasers(s: Any) -> dict[Any, int]:
    """The mechanism each queued release is recorded to run through: its queue entry's ``creator``
    (an owned record's, a KV request's, a queued decommit's), by the object's key."""
    out = {}
    for seq, e in s.queue.items():
        ref = e.owned if e.owned is not None else getattr(e, "kv", None)
        out[("ref", ref) if ref is not None else ("entry", seq)] = e.creator
    return out


def _qstate(s: Any, u: QueueUniverse | None = None) -> tuple[dict[str, Any], QueueUniverse]:
    """The queue machine: objects' states, ``use[x][stream]`` the last work item
    of each stream recorded on x, streams' launched/completed; every object
    made in the one provider context (0), alive or not, by its creator; a
    freed one freed by its creator unless the spec recorded a release through
    another mechanism (``misreleased``: then by mechanism -1), a queued one to
    be released by the mechanism its entry records."""
    objs = _queue_objects(s)
    u = u if u is not None else QueueUniverse()
    ix = u.index([k for k, *_ in objs])
    sx = {r: i for i, r in enumerate(sorted(s.streams))}
    u.idx["stream"] = sx
    use: dict[int, tuple[int, dict[int, int]]] = {}
    for k, _st, fences, _c in objs:
        row: dict[int, int] = {}
        for f in fences:
            stream, item = s.fences[f]
            row[sx[stream]] = max(row.get(sx[stream], 0), item)
        use[ix[k]] = (0, row)
    astate = {ix[k]: code for k, code, _f, _c in objs}
    amech = {ix[k]: c for k, _code, _f, c in objs}
    for k, i in ix.items():  # a queued decommit that ran is gone from the queue: freed
        if k[0] == "entry" and i not in astate:
            astate[i], amech[i] = E.FREED, u.creators.get(k, 0)
    u.creators = {**u.creators, **{k: c for k, _code, _f, c in objs}}
    rel = _releasers(s)
    fmech = {ix[k]: rel.get(k, c) for k, code, _f, c in objs if code == E.QUEUED}
    fmech.update({i: (-1 if s.misreleased else amech[i]) for i, code in astate.items() if code == E.FREED})
    st = {"astate": (0, astate), "use": use,
          "iss": (0, {sx[r]: x.launched for r, x in s.streams.items()}),
          "done": (0, {sx[r]: x.completed for r, x in s.streams.items()}),
          "actx": (0, {}), "calive": (False, {0: s.registry.context_alive}),
          "amech": (0, amech), "fmech": (0, fmech), "fctx": (0, {}), "inst": s.registry.installed,
          "dev": (False, {}), "addr": (E.NOADDR, {}), "byaddr": (E.NOADDR, {})}   # S14's: no address owned
    return st, u


#: (not ``fctx`` nor ``dev``: the one context's, never the device level's; no system action writes them else)
_Q_CMP = ("astate", "use", "iss", "done", "actx", "calive", "amech", "fmech", "inst")
#: the system level's spec actions S14 claims on the queue machine (its creations of owned objects)
_S14_SYS = ("allocate_owned", "reserve_owned")


def _stream_ix(u: Any, stream: int) -> int:
    return u.idx["stream"][stream]


def _q_obj(s: Any, u: Any, ref: int) -> int:
    return u.idx["q"][("ref", ref)]


def _decommit_bad(s: Any, span: tuple[int, int, int]) -> bool:
    """The range is not page-aligned inside the reservation, or one of its
    pages is not committed (read from the owned record)."""
    ref, start, end = span
    o = s.owned[ref]
    if not (0 <= start < end <= o.size and start % s.page == 0 and end % s.page == 0):
        return True
    return not all(p in o.committed for p in range(start // s.page, end // s.page))


#: a decommit succeeds only on committed pages of a live owning reservation
_DECOMMIT_HELPERS = ("reserve_owned", "commit_owned")


def _q_adapters(inv: str, also: tuple[str, ...] = ()) -> list[Adapter]:
    """The queue machine's adapters for ``inv`` (and ``also``: S1, S7 and S10 encode
    every action by the same step as S4, so each sample counts for each)."""
    def ad(action: str, spec_action: str, arg: Any, **kw: Any) -> Adapter:
        project = _project(_qstate, _q_alloc_args if arg is None else lambda s, u, a, taken: arg(s, u, a))
        return Adapter(inv, action, spec_action, project, _q_expected, _Q_CMP, finite=True,
                       also=also + (("S14",) if spec_action in _S14_SYS else ()), **kw)

    obj = lambda key: (lambda s, u, a: {"x": _q_obj(s, u, a[key])})  # noqa: E731
    use = lambda key: (lambda s, u, a: {"x": _q_obj(s, u, a[key]), "st": _stream_ix(u, a["stream"])})  # noqa: E731
    return [
        # each makes one queue object, live, with no fence yet, by the mechanism installed now; their
        # refusals make nothing (other rows' rules)
        *[ad("allocate", n, None) for n in ("allocate_owned", "load_weight", "reserve_owned", "kv_open")],
        ad("use", "use", use("allocation")),
        ad("use", "use_owned", use("reservation")),
        ad("use", "kv_use", use("request")),
        ad("drop", "drop", obj("allocation")),
        ad("close", "close_owned", obj("reservation")),
        ad("close", "kv_close", obj("request")),
        ad("close", "unload_weight", lambda s, u, a: {"x": _q_obj(s, u, s.weights[a["weight"]].owned)}),
        ad("decommit", "decommit_owned", lambda s, u, a: {"x": _q_obj(s, u, a["span"][0]), "y": _new(u),
                                                          "bad": _decommit_bad(s, a["span"])},
           balance=2, helpers=_DECOMMIT_HELPERS),
        ad("synchronize", "synchronize",
           lambda s, u, a: {"st": 0 if a["stream"] is None else _stream_ix(u, a["stream"]), "every": a["stream"] is None}),
        ad("poll", "poll", lambda s, u, a: {}),
        ad("select", "select", lambda s, u, a: {"m": a["mechanism"]}),
        Adapter(inv, "respond", "respond", _q_respond_p, _q_expected, _Q_CMP, also=also, finite=True,
                helpers=("use", "drop", "kv_use", "kv_close", "load_weight")),
        ad("destroy_context", "destroy_context", lambda s, u, a: {"c": 0}),
    ]


def _q_respond_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    """The walk's answer (the spec's witness): ModelResidency reports its first
    two cold resident weights' bytes and releases the weights the spec's
    :func:`~memspec.spec.holders.victims` picks for that sum (the holder's
    choice: an argument of the encoding); KvPageStore none.  An answer that
    releases nothing and finds no done release queued: skipped (the identity)."""
    from memspec.spec.holders import victims, weight_footprint

    t_ref, holder, terminal = args["answer"]
    st, u = _qstate(s)
    if terminal or taken != "ok":
        return st, {"nv": 0, "v1": 0, "v2": 0, "terminal": True}, u
    cold = _answer_victims(s, holder)
    vs = victims(s, sum(weight_footprint(s, w) for w in cold)) if cold else []
    if vs is None or len(vs) > 2:
        return None  # not an answer of at most two victims
    if not vs and not _done_seqs(s, args["pending"]):
        return None
    v = [_q_obj(s, u, w.owned) for w in vs] + [0, 0]
    return st, {"nv": len(vs), "v1": v[0], "v2": v[1], "terminal": False}, u


def _q_expected(s: Any, u: Any, value: Any) -> Any:
    m = u.idx["q"]
    if ("new", 0) in m:  # the object the step made takes the slot reserved for it
        new = [k for k, *_ in _queue_objects(s) if k not in m]
        if new:  # an error branch made nothing: the slot stays empty
            m[new[-1]] = m.pop(("new", 0))
    st, _ = _qstate(s, u)
    return flatten(st, E.S4.fields, _Q_CMP, u)


def _q_alloc_args(s: Any, u: Any, a: dict[str, Any], taken: str) -> Any:
    """A creation of the system level: a new object (a refusal makes nothing: other rows' to compare)."""
    return None if taken != "ok" else {"x": _new(u), "c": 0, "m": s.registry.installed, "dev": False, "ad": E.NOADDR}


def _new(u: Any) -> int:
    return u.index([("new", 0)])[("new", 0)]


SYS_ADAPTERS += _q_adapters("S4", also=("S1", "S7", "S10"))
#: reserve_owned's OutOfMemory needs a size past the device: the small device's walk (S14's, S4's)
SMALL_SYS_ADAPTERS += [a for a in SYS_ADAPTERS if a.invariant == "S4" and a.spec_action == "reserve_owned"]
