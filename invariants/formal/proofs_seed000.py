"""Z3 encodings of the seed-000 invariants S1-S15 (see :mod:`memspec.invariants.formal.proofs`).

Each encoding keeps only the state an invariant talks about; object records
(allocations, reservations, holders, tickets, handles, mappings, contexts) are
arrays indexed by an unbounded object id, sizes and counters are unbounded
integers, and all ledger arithmetic goes through :mod:`memspec.spec.kernels`.
Object lifecycle codes: 0 none (id never used), 1 live, 2 queued (dropped,
waiting for fences), 3 freed.

The encodings are split by invariant group, each module under 1,200 lines:
:mod:`.proofs_seed000_objects` (S1, S3 through S5, S7, S10 and S14; S1, S7, S10 and S14 on S4's
deferred-free queue machine, S12 and S13 on S5's VMM machine), :mod:`.proofs_seed000_ledger`
(the ledger model: S2, S8, S9, S11), and this module (S15, G1 and S6 on S15's ticket machine, the proof lists
:data:`PROOFS` / :data:`MORE_PROOFS` and the encoded-action catalog).  Every name of
the parts is a name of this module: import from here.

Rows that state their rule on the same spec actions share one machine (the same
fields, the same steps and preconditions; each row with its own invariant, named rule
and unguarded variant): S1, S7, S10 and S14 are proved on S4's deferred-free queue machine
(the device level's allocations, reservations and handles, their creations and releases,
on it too: S1's creator, S14's identities and address map), S12 and S13 on S5's VMM machine
(reservations of both levels, physical handles, mappings, KV prefixes), S2, S8 and S9 on
S11's ledger model, G1 and S6 on S15's ticket machine (its respond is one relation:
S15's refund of the answer's bytes into the ticket and S6's choice of victims).  The ledger model's
device level encodes reservations, handles and mappings by the VMM machine's very relations.
"""

from __future__ import annotations

from typing import Any

import z3

from memspec.invariants.formal.z3fast import And, Implies, Not, Or
from memspec.invariants.formal.proofs import (
    ARR, BARR, BOOL, INT, OK, Act, Proof, St, at, on_ok, outcome, prefix_append, prefix_sum, upd,
)
from memspec.spec import kernels as K
from memspec.invariants.formal import proofs_seed000_objects, proofs_seed000_ledger
from memspec.invariants.formal.proofs_seed000_objects import (
    FREED, H_KV, H_WEIGHTS, S1, S10, S12, S13, S14, S3, S4, S5, S7, T_CANCELLED, T_CLAIMED, T_FAILED, T_GRANTED,
    T_PENDING, T_TIMED_OUT, Z0, _fences_done, _s10_inv, _s12_inv, _s13_prefix_covered, _s14_owns_address, _s1_named,
    _s5_named, _terminal, catalog,
)
from memspec.invariants.formal.proofs_seed000_ledger import (
    S11, S2, S8, S9, _CANCEL_TICKET, _L_NEW, _RECONFIGURE, _TICKET_EXISTS, _cancel_ticket, _claim, _end, _ledger,
    _reconfigure, _respond, _s11_named, _s2_named, _s8_named, _s9_named, _tpend, _trest, _with_ledger,
)

#: the modules this one is assembled from, in order (split by invariant group); a name
#: defined there is one object, whichever module a caller reads it from, so a test that rebinds one
#: (``monkeypatch.setattr``) rebinds it in each module of :data:`PARTS` that has it and here
PARTS = (proofs_seed000_objects, proofs_seed000_ledger)
# the package face: every name of the parts, private ones included, is a name of this module, as before the split
for _part in PARTS:
    globals().update({_k: _v for _k, _v in vars(_part).items() if not _k.startswith("__")})
del _part


# ==========================================================================
# S15 ticket-exactly-once  (mirrors spec/governor.py: issue_ticket, claim,
# cancel_ticket, expire, reconfigure; spec/holders.py: respond, set_hot):
# the ticket machine, shared by S15, G1 and S6; its tickets are laid out as
# the ledger model's, and claim, cancel_ticket, expire's timeout, reconfigure
# and respond's move into the ticket are the ledger model's relations
# (:mod:`.proofs_seed000_ledger`: one relation per ticket action)
#
# Configuration generations: every ticket records the generation it was
# issued in (tgen); reconfigure bumps gen and fails every pending ticket at
# once, returning what they held.  Two prefix-sum ghosts split what the
# tickets hold into pending (PP) and the rest (PN, i.e. granted), so that
# reconfigure's "every pending ticket gives its bytes back" is one step:
# free += PP[nt], and PP becomes 0 everywhere.
#
# S6's part (holder-chooses): the weights ModelResidency holds (res: resident,
# hot: in use, never a victim) and the spec's S6 counters (gov_ev: released by
# someone other than the holder, hot_ev: hot weights released under pressure,
# over: answers reporting more than the holder's releases refunded).  The
# answer's bytes are one figure, r: what the releases refunded (the victims'
# real footprints, as the spec refunds them), moved into the ticket; the
# victims are the holder's choice, not tied to r here (the agreement compares
# both, victims and bytes, with the spec's answer).
# ==========================================================================

# T_FAILED, _terminal, H_WEIGHTS / H_KV: with the codes every encoding shares (proofs_seed000_objects)


def _returned(st: Any) -> Any:
    """The terminal states that give the held bytes back (claim hands them over instead)."""
    return Or(st == T_CANCELLED, st == T_TIMED_OUT, st == T_FAILED)


def _s15_issue(s: St, a: St):
    out = outcome((a.n <= 0, "InvalidRequest"))
    return on_ok(out, s, s.set(tstate=upd(s.tstate, a.t, T_PENDING), held=upd(s.held, a.t, 0),
                               returns=upd(s.returns, a.t, 0), amount=upd(s.amount, a.t, a.n),
                               deadline=upd(s.deadline, a.t, a.dl), tgen=upd(s.tgen, a.t, s.gen),
                               PP=prefix_append(s.PP, s.nt, 0), PN=prefix_append(s.PN, s.nt, 0), nt=s.nt + 1))


def _evict(s: St, w: Any, go: Any) -> St:
    """holders.evict(by="holder", pressure=True) of weight ``w`` when ``go``:
    it leaves residency; a hot one is recorded (S6's ``hot_evictions``)."""
    return s.set(res=upd(s.res, w, And(at(s.res, w), Not(go))),
                 hot_ev=s.hot_ev + K.ite(And(go, at(s.hot, w)), 1, 0))


def _s15_released(s: St, a: St) -> tuple[St, Any]:
    """The ticket machine's releases of ``holder``'s answer to ticket ``t`` (its respond is the ledger
    model's :func:`_respond` with them): ModelResidency evicts its ``nv`` (0..2) victims ``v1``,
    ``v2``, KvPageStore none; the releases refund ``r`` bytes of the charge to free (spec/ep.py
    refund), which the answer reports.  KvPageStore reporting more than its own releases
    ``refunded`` is an overclaim (S6)."""
    wts = a.holder == H_WEIGHTS
    s1 = _evict(_evict(s, a.v1, And(wts, a.nv >= 1)), a.v2, And(wts, a.nv >= 2))
    over = s.over + K.ite(And(Not(wts), a.r > a.refunded), 1, 0)
    return _with_ledger(s1, K.refund(_ledger(s), a.r), over=over), a.r


_s15_respond = _respond(_s15_released)


def _set_hot(s: St, a: St):
    return on_ok(z3.IntVal(OK), s, s.set(hot=upd(s.hot, a.w, a.h)))


def _s15_expire(s: St, a: St):
    """One ticket's timeout: the spec's expire times out every due ticket, one
    after the other; here ``t``'s part (an error outcome: ``t`` is left alone)."""
    st = at(s.tstate, a.t)
    dl = at(s.deadline, a.t)
    out = outcome((_terminal(st), "InvalidTicket"), (Not(And(0 < dl, dl <= a.now)), "InvalidRequest"))
    return on_ok(out, s, _end(s, a.t, T_TIMED_OUT))


def _s15_inv(s: St, o: Any) -> Any:
    st, h, r = at(s.tstate, o), at(s.held, o), at(s.returns, o)
    return And(
        K.ledger_ok(_ledger(s)), s.granted == s.sumheld + s.sumgr, s.sumgr >= 0,
        st >= 0, st <= T_FAILED, h >= 0, Implies(_terminal(st), h == 0), Implies(st == 0, And(h == 0, r == 0)),
        r >= 0, r <= 1, Implies(r == 1, _returned(st)), Implies(_returned(st), r == 1),
        # generations: no pending ticket of an older configuration
        Implies(st != 0, at(s.tgen, o) <= s.gen), Implies(st == T_PENDING, at(s.tgen, o) == s.gen),
        # what the tickets hold: pending (PP) + the rest (PN: granted), prefix-sum ghosts over dense ticket ids
        Implies(st != 0, And(0 <= o, o < s.nt)),
        prefix_sum(s.PP, s.nt, lambda i: _tpend(at(s.tstate, i), at(s.held, i))),
        prefix_sum(s.PN, s.nt, lambda i: _trest(at(s.tstate, i), at(s.held, i))),
        s.sumheld == at(s.PP, s.nt) + at(s.PN, s.nt),
    )


_T = {"t": INT}


def _respond_pre(check: bool):
    """A holder releases only bytes it is charged for (the spec's victims are its own resident
    weights), answering a known ticket.  Its choice (S6): ModelResidency's victims are distinct
    resident weights and (the guard) cold; KvPageStore names none and reports at most what its own
    releases ``refunded``."""
    def pre(s: St, a: St) -> Any:
        def ok_victim(v: Any) -> Any:
            return And(at(s.res, v), Not(at(s.hot, v))) if check else at(s.res, v)
        wts = And(a.holder == H_WEIGHTS, 0 <= a.nv, a.nv <= 2, Implies(a.nv >= 1, ok_victim(a.v1)),
                  Implies(a.nv >= 2, And(ok_victim(a.v2), a.v2 != a.v1)))
        kv = And(a.holder == H_KV, a.nv == 0, a.r <= a.refunded)
        return And(a.r >= 0, a.r <= s.charged, at(s.tstate, a.t) != 0, Or(wts, kv))
    return pre


_RESPOND = {"t": INT, "holder": INT, "nv": INT, "v1": INT, "v2": INT, "r": INT, "refunded": INT}
_S15_FIELDS = {"cap": INT, "free": INT, "granted": INT, "charged": INT, "tstate": ARR, "held": ARR, "returns": ARR,
               "amount": ARR, "deadline": ARR, "tgen": ARR, "gen": INT, "sumheld": INT, "sumgr": INT,
               "ret": INT, "PP": ARR, "PN": ARR, "nt": INT,
               # S6's part: the weights (resident, hot) and the spec's S6 counters
               "res": BARR, "hot": BARR, "gov_ev": INT, "hot_ev": INT, "over": INT}


def _s15_init(s: St) -> Any:
    """No ticket yet; any weights resident, hot or cold (load_weight, S11's, may have loaded them)."""
    return And(s.cap >= 0, s.free >= 0, s.charged >= 0, s.free + s.charged == s.cap, s.granted == 0,
                  s.tstate == Z0(), s.held == Z0(), s.returns == Z0(), s.sumheld == 0, s.sumgr == 0,
                  s.nt == 0, at(s.PP, 0) == 0, at(s.PN, 0) == 0, s.gov_ev == 0, s.hot_ev == 0, s.over == 0)


#: the ticket machine's actions, one list (the same step and precondition functions) for S15, G1 and S6
_TICKET_ACTS = [
    Act("issue_ticket", {"t": INT, "n": INT, "dl": INT}, _s15_issue, pre=lambda s, a: a.t == s.nt, objs=("t",)),
    Act("respond", _RESPOND, _s15_respond, pre=_respond_pre(True), objs=("t",)),
    Act("claim", _T, _claim, pre=_TICKET_EXISTS, objs=("t",)),
    _CANCEL_TICKET,
    Act("expire", {"t": INT, "now": INT}, _s15_expire, pre=_TICKET_EXISTS, objs=("t",)),
    _RECONFIGURE,
    Act("set_hot", {"w": INT, "h": BOOL}, _set_hot, pre=lambda s, a: at(s.res, a.w), objs=("w",)),
]


def _on_tickets(head: tuple[str, str, str], inv: Any, unguarded: Act, guard: str, **kw: Any) -> Proof:
    """A row on the ticket machine: its fields, initial states and actions, action by action (so every
    agreement sample of the machine is the row's too); its own invariant, unguarded variant, guard."""
    return Proof(*head, fields=dict(_S15_FIELDS), init=_s15_init, inv=inv, actions=list(_TICKET_ACTS),
                 unguarded=unguarded, guard=guard, **kw)


#: what a ticket holds is at most what the tickets hold (S15's and G1's lemma, derived from the invariant)
_HELD_LEMMA = dict(lemmas=lambda s, o, a: Implies(Not(_terminal(at(s.tstate, o))), at(s.held, o) <= s.sumheld),
                   lemma_doc="what a ticket holds is at most the sum of what the tickets hold")

S15 = _on_tickets(catalog("S15"), _s15_inv, Act("cancel_ticket", _T, _cancel_ticket(False), pre=_TICKET_EXISTS,
                                                objs=("t",)),
                  "cancel of a terminal ticket raises InvalidTicket (its grant was already returned)", bmc_depth=3,
                  **_HELD_LEMMA)


def _g1_step(name: str, s: St, a: St, out: Any, s2: St, o: Any) -> Any:
    """A ticket of an older generation that is not granted (nor claimed) never becomes either."""
    old = And(at(s.tgen, o) < s.gen, at(s.tstate, o) != T_GRANTED, at(s.tstate, o) != T_CLAIMED)
    return Implies(old, And(at(s2.tstate, o) != T_GRANTED, at(s2.tstate, o) != T_CLAIMED))


#: G1: configuration-generation invalidation of pending tickets (issue 13, from the onnx-genai TLA+
#: specs the design comes from), on S15's machine: same state, same actions, its own guard.
G1 = _on_tickets(
    ("G1", "generation",
     "When memory is tight, all it can send is: pressure ticket: try to free 1 GB, priority = ..., deadline = ... "
     "(and: Total capacity: 24 GB / Approved: 22 GB -- the configuration the tickets were issued under)"),
    _s15_inv, Act("reconfigure", {}, _reconfigure(False)),
    "reconfigure fails every pending ticket of the older generation (their bytes returned once)",
    step_prop=_g1_step, bmc_depth=3, **_HELD_LEMMA)
G1.declared_by = "S15"  # type: ignore[attr-defined]  (the spec's actions declare S15; G1 is part of it)


# ==========================================================================
# S6 holder-chooses, on S15's ticket machine  (spec/governor.py issue_ticket,
# spec/holders.py set_hot and respond: the Governor only issues tickets; a
# holder answers by choosing its own victims -- ModelResidency only cold
# resident weights, KvPageStore none, reporting at most what its own releases
# refunded)
# ==========================================================================

def _s6_named(s: St, o: Any) -> Any:
    return And(s.gov_ev == 0, s.hot_ev == 0, s.over == 0)


def _s6_inv(s: St, o: Any) -> Any:
    """The named rule, and (S15's) no pending ticket of an older configuration: a holder's 0 is
    then accepted on every pending ticket."""
    return And(_s6_named(s, o), Implies(at(s.tstate, o) == T_PENDING, at(s.tgen, o) == s.gen))


def _s6_prop(name: str, s: St, a: St, out: Any, s2: St, o: Any) -> Any:
    if name == "respond":  # only the answering holder's weights move, and 0 is a valid answer
        return And(Implies(a.holder != H_WEIGHTS, at(s2.res, o) == at(s.res, o)),
                   Implies(And(a.holder == H_KV, a.r == 0, at(s.tstate, a.t) == T_PENDING), out == OK))
    # the Governor's own actions (issue, claim, cancel, expire, reconfigure) take nothing from any holder
    return at(s2.res, o) == at(s.res, o)


S6 = _on_tickets(catalog("S6"), _s6_inv, Act("respond", _RESPOND, _s15_respond, pre=_respond_pre(False), objs=("t",)),
                 "ModelResidency's victims are cold resident weights (a hot weight is never released under pressure)",
                 step_prop=_s6_prop, bmc_depth=2)


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
    "S3": {"select": ("system:select",), "query": ("system:binding_capabilities", "system:manager_capabilities",
                                                    "system:allocate_owned")},
    # the deferred-free queue machine (S1, S4, S7, S10: one machine, below), with the device level's
    # allocations (S1's: made by the mechanism under test or its twin, freed on the spot)
    "S4": {"allocate": ("system:allocate_owned", "system:load_weight", "system:reserve_owned", "system:kv_open",
                        "mechanism:allocate", "mechanism:allocate_foreign"),
           "release": ("mechanism:deallocate",), "use": ("system:use", "system:use_owned", "system:kv_use"),
           "drop": ("system:drop",), "close": ("system:close_owned", "system:unload_weight", "system:kv_close"),
           "decommit": ("system:decommit_owned",), "synchronize": ("system:synchronize",), "poll": ("system:poll",),
           "respond": ("system:respond",), "select": ("system:select",),
           "destroy_context": ("system:destroy_context",)},
    # the VMM machine (S5, S12, S13: one machine, below)
    "S5": {**{n: (f"mechanism:{n}",) for n in ("query_virtual_backing", "query_shared_mapping", "reserve", "commit_range",
                                                "decommit_range", "committed_bytes", "release_reservation", "create",
                                                "map", "unmap", "copy_on_write", "release_handle", "write_through",
                                                "mapping_count", "free_shared_reservation")},
           **{n: (f"system:{n}",) for n in ("reserve_owned", "commit_owned", "decommit_owned", "kv_open", "kv_grow",
                                            "kv_close")},
           # issue 33: the mechanism's eager writers of physical
           **{f"m_{n}": (f"mechanism:{n}",) for n in ("allocate", "deallocate")}},
    "S11": {**{n: (f"system:{n}",) for n in ("reserve", "commit", "cancel", "refund_lease", "allocate_owned",
                                             "load_weight", "commit_owned", "kv_grow", "drop", "unload_weight",
                                             "poll", "claim", "cancel_ticket", "expire", "respond")},
            **{f"m_{n}": (f"mechanism:{n}",) for n in ("allocate", "deallocate", "commit_range", "decommit_range",
                                                        "release_reservation", "create", "release_handle", "unmap",
                                                        "copy_on_write")},
            "reconfigure": ("system:reconfigure",),
            **{n: (f"system:{n}",) for n in _L_NEW if n != "kv_release"}, "kv_release": ("system:poll",)},
    # on S4's queue machine: its creations and the device level's releases (not the twin's allocate: a gap)
    "S14": {"allocate": ("mechanism:allocate", "mechanism:create", "mechanism:reserve", "mechanism:shared_reserve",
                         "system:allocate_owned", "system:reserve_owned"),
            "release": ("mechanism:deallocate", "mechanism:release_reservation"),
            "free_shared_reservation": ("mechanism:free_shared_reservation",)},
    "S15": {"issue_ticket": ("system:issue_ticket",), "respond": ("system:respond",), "claim": ("system:claim",),
            "cancel_ticket": ("system:cancel_ticket",), "expire": ("system:expire",),
            "reconfigure": ("system:reconfigure",), "set_hot": ("system:set_hot",)},
}
ENCODES["G1"] = ENCODES["S6"] = ENCODES["S15"]  # G1 and S6 are on S15's ticket machine
ENCODES["S1"] = ENCODES["S7"] = ENCODES["S10"] = ENCODES["S4"]  # S1, S7 and S10 are on S4's queue machine
ENCODES["S12"] = ENCODES["S13"] = ENCODES["S5"]  # S12 and S13 are on S5's VMM machine
#: S2's, S8's and S9's machines are part of S11's (one ledger model, the same steps; S9's kv_use is not S11's)
ENCODES["S2"] = {a.name: ENCODES["S11"][a.name] for a in S2.actions}
ENCODES["S8"] = {a.name: ENCODES["S11"][a.name] for a in S8.actions}
ENCODES["S9"] = {**{a.name: ENCODES["S11"][a.name] for a in S9.actions if a.name != "kv_use"},
                 "kv_use": ("system:kv_use",)}


def _shared_map(s: St, x: Any) -> Any:
    return And(at(s.mlive, x), Not(at(s.mpriv, x)))


NAMED: dict[str, Any] = {
    "S1": _s1_named,
    "S2": _s2_named,
    "S3": lambda s, d: Implies(at(s.snapgen, d) == at(s.gen, d), at(s.snap, d) == at(s.inst, d)),
    "S4": lambda s, o: Implies(at(s.astate, o) == FREED, _fences_done(s, o)),
    "S5": _s5_named,  # + the step properties: a successful commit changes exactly the range
    "S6": _s6_named,
    "S7": lambda s, o: z3.BoolVal(True),  # a step property: drop enqueues, never frees or synchronizes
    "S8": _s8_named,
    "S9": _s9_named,
    "S10": _s10_inv,
    "S11": _s11_named,
    "S12": _s12_inv,
    "S13": lambda s, o: And(Implies(_shared_map(s, o), Not(at(s.hfreed, at(s.mh, o)))),
                               s.rowrites == 0,
                               _s13_prefix_covered(s, o)),
    "S14": _s14_owns_address,  # + the step property: a stale handle is rejected
    "S15": lambda s, o: And(at(s.returns, o) <= 1,
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
