"""Agreement adapters of the system level (spec/system.py SYSTEM): the second part of
:mod:`memspec.invariants.formal.agreement_adapters` (which assembles them; import from
there).

S15 / G1 / S6 on the ticket machine (tickets, generations, the holders' answers), S3
selection, S5 / S12 / S13 on the VMM machine (owning reservations and KV requests),
the small-device walk's adapters, S13 read-only prefixes;
:data:`SYS_ADAPTERS`, :data:`TICKET_ADAPTERS` and :func:`run_all` (every agreement walk of
:mod:`memspec.invariants.formal.walks`).
"""

from __future__ import annotations

from typing import Any

from memspec.invariants.formal import proofs_seed000 as E
from memspec.invariants.formal.agreement import Adapter, AgreementReport, Universe, walk_and_compare
from memspec.invariants.formal.proofs import Proof, prefix_values
from memspec.invariants.formal.agreement_adapters_mech import (
    MECH_ADAPTERS, UMAX, _ON_VMM, _VMM_MAX_INV, _empty, _expected, _is_int, _mech_too_big, _new_slot,
    _owned_span_args, _project, _reserve_args, _ret,
)
from memspec.invariants.formal.walks import BY_NAME as WALKS_BY_NAME, start


# ==========================================================================
# System level (spec/system.py SYSTEM)
# ==========================================================================

def _done_seqs(s: Any, pending: Any) -> list[int]:
    """The queued releases the walk's poll runs: those whose fences the spec knows done."""
    from memspec.spec.ep import known_flags

    return [seq for (seq, _f), done in zip(pending, known_flags(s, pending)) if done and seq in s.queue]


def _sys_init() -> Any:
    """The system walk's initial state (:data:`memspec.invariants.formal.walks.WALKS`)."""
    return start(WALKS_BY_NAME["system"])


def _sys_too_big(s: Any) -> bool:
    return (len(s.grants) > UMAX or len(s.leases) > UMAX or len(s.tickets) > UMAX
            or sum(1 for o in s.owned.values() if o.kind == "allocation") > UMAX)


# -- S15 / G1 / S6: pressure tickets, configuration generations, the holders' choice ----------

_TSTATE = {"pending": E.T_PENDING, "granted": E.T_GRANTED, "claimed": E.T_CLAIMED, "cancelled": E.T_CANCELLED,
           "timed_out": E.T_TIMED_OUT, "failed": E.T_FAILED}


def _ticket_record(s: Any, tx: dict[Any, int]) -> dict[str, Any]:
    """The tickets, laid out alike on the ticket machine and the ledger model (one projection of the
    record): state, holdings, amount, what they hold pending (``PP``) and otherwise (``PN``: prefix-sum
    ghosts over the ticket ids) and its sum."""
    ts = sorted(s.tickets.items())
    return {"tstate": (0, {tx[r]: _TSTATE.get(t.state, 9) for r, t in ts}), "held": (0, {tx[r]: t.held for r, t in ts}),
            "amount": (0, {tx[r]: t.amount for r, t in ts}),
            "PP": prefix_values([t.held if t.state == "pending" else 0 for _r, t in ts]),
            "PN": prefix_values([0 if t.state == "pending" else t.held for _r, t in ts]),
            "nt": len(ts), "sumheld": s.tickets_held}


def _s15_state(s: Any, ret: int = 0) -> tuple[dict[str, Any], Universe]:
    u = Universe()
    tx = u.add("ticket", s.tickets)
    wx = u.add("weight", s.weights)
    ts, ws = s.tickets, s.weights
    st = {
        "cap": s.capacity, "free": s.free, "granted": s.granted, "charged": s.charged, **_ticket_record(s, tx),
        "returns": (0, {tx[r]: t.returns for r, t in ts.items()}),
        "deadline": (0, {tx[r]: t.deadline for r, t in ts.items()}),
        "tgen": (0, {tx[r]: t.generation for r, t in ts.items()}),
        "gen": s.generation, "sumgr": s.open_grants, "ret": ret,
        # S6's part: ModelResidency's weights and the spec's S6 counters
        "res": (False, {wx[n]: w.resident for n, w in ws.items()}),
        "hot": (False, {wx[n]: w.hot for n, w in ws.items()}),
        "gov_ev": s.governor_evictions, "hot_ev": s.hot_evictions, "over": s.overclaims,
    }
    return st, u


_S15_CMP = ("cap", "free", "granted", "charged", "tstate", "held", "returns", "amount", "deadline", "tgen", "gen",
            "res", "hot", "gov_ev", "hot_ev", "over")


# claim / cancel_ticket return the bytes handed over (a Grant's), the ret of the encoding
_s15_expected = _expected(_s15_state, E.S15.fields, _S15_CMP + ("ret",),
                          value=lambda v: _ret(v if _is_int(v) else getattr(v, "nbytes", 0)))


_s15_plain_expected = _expected(_s15_state, E.S15.fields, _S15_CMP)


_s15_issue_project = _project(_s15_state, lambda s, u, a, taken: None if not _is_int(a["request"][0]) else {
    "t": _new_slot(u, "ticket"), "n": a["request"][0], "dl": a["request"][2]})


_s15_ticket_project = _project(_s15_state, lambda s, u, a, taken: {"t": u.idx["ticket"][a["ticket"]]})


def _s15_respond_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    """A holder's answer (respond's witness): ModelResidency's victims are its
    first two cold resident weights, KvPageStore names none; ``r`` is what the
    releases refunded -- the value the step returns, filled in by
    :func:`_s15_respond_expected`.  Skipped when releases are already queued:
    the answer runs those too (other holders' refunds, outside the encoding),
    so KvPageStore's own releases refunded nothing here."""
    if s.queue and taken == "ok":
        return None
    t_ref, holder, terminal = args["answer"]
    st, u = _s15_state(s)
    enc_args = {"t": u.idx["ticket"][t_ref], "holder": E.H_WEIGHTS if holder == "weights" else E.H_KV, "nv": 0,
                "v1": 0, "v2": 0, "r": 0, "refunded": 0}
    if not terminal and taken == "ok":
        cold = _answer_victims(s, holder)
        enc_args["nv"] = len(cold)
        for k, w in zip(("v1", "v2"), cold):
            enc_args[k] = u.idx["weight"][w.name]
    u.enc_args = enc_args  # type: ignore[attr-defined]
    return st, enc_args, u


def _s15_respond_expected(s: Any, u: Universe, value: Any) -> Any:
    if value is not None:  # an error branch returns nothing: the releases refunded nothing
        u.enc_args["r"] = value["released"]  # type: ignore[attr-defined]
    return _s15_plain_expected(s, u, value)


def _due(s: Any, now: Any) -> list[int]:
    t_now, live = now
    return [r for r in live if 0 < s.tickets[r].deadline <= t_now]


def _s15_expire_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    """The spec times out every due ticket; the encoding one ticket ``t``: the
    due one (ok), or -- when none is due -- a terminal ticket (InvalidTicket)
    or a live one not due (InvalidRequest), alternating with the clock.
    Skipped when several are due (several encoded steps)."""
    due = _due(s, args["now"])
    if len(due) > 1 or not s.tickets:
        return None
    st, u = _s15_state(s)
    if due:
        t = due[0]
    else:
        terminal = sorted(r for r, tk in s.tickets.items() if _TSTATE[tk.state] in (3, 4, 5, 6))
        live = sorted(r for r in s.tickets if r not in terminal)
        pool = (terminal or live) if args["now"][0] % 2 == 0 else (live or terminal)
        t = pool[len(s.tickets) % len(pool)]
    return st, {"t": u.idx["ticket"][t], "now": args["now"][0]}, u


def _s15_expire_permit(value: Any, enc_args: dict[str, Any]) -> set[str]:
    return {"ok"} if len(tuple(value)) == 1 else {"InvalidTicket", "InvalidRequest"}


_s15_reconfigure_project = _project(_s15_state, lambda s, u, a, taken: {})
_s15_set_hot_project = _project(_s15_state, lambda s, u, a, taken: {"w": u.idx["weight"][a["weight"]],
                                                                   "h": bool(a["hot"])})


_ON_TICKETS = ("G1", "S6")  # the rows proved on S15's ticket machine: each sample is theirs too

#: the ticket machine's adapters (one machine, three properties: S15, G1, S6), sampled by the walk ``tickets``
TICKET_ADAPTERS = [
    Adapter("S15", "issue_ticket", "issue_ticket", _s15_issue_project, _s15_plain_expected, _S15_CMP,
            also=_ON_TICKETS),
    Adapter("S15", "respond", "respond", _s15_respond_project, _s15_respond_expected, _S15_CMP, also=_ON_TICKETS),
    Adapter("S15", "claim", "claim", _s15_ticket_project, _s15_expected, _S15_CMP + ("ret",),
            also=_ON_TICKETS),
    Adapter("S15", "cancel_ticket", "cancel_ticket", _s15_ticket_project, _s15_expected, _S15_CMP + ("ret",),
            also=_ON_TICKETS),
    Adapter("S15", "expire", "expire", _s15_expire_project, _s15_plain_expected, _S15_CMP,
            permit=_s15_expire_permit, also=_ON_TICKETS),
    Adapter("S15", "reconfigure", "reconfigure", _s15_reconfigure_project, _s15_plain_expected, _S15_CMP,
            also=_ON_TICKETS),
    Adapter("S15", "set_hot", "set_hot", _s15_set_hot_project, _s15_plain_expected, _S15_CMP, also=_ON_TICKETS),
]

def _tickets_init() -> Any:
    """The ticket walk's initial state: SYSTEM's, two cold weights loaded (spec steps)."""
    return start(WALKS_BY_NAME["tickets"])


class _Restricted:
    """The spec's machine restricted to the actions ``names`` (its walks visit reachable states only)."""
    def __init__(self, machine: Any, names: tuple[str, ...]) -> None:
        self.actions = [a for a in machine.actions if a.name in names]


def _answer_victims(s: Any, holder: str) -> list[Any]:
    """respond's witness: ModelResidency releases its first two cold resident weights, KvPageStore none."""
    return [w for w in s.weights.values() if w.resident and not w.hot][:2] if holder == "weights" else []


# -- S3: selection and capability queries ------------------------------------

def _s3_state(s: Any, answer: int = 0) -> tuple[dict[str, Any], Universe]:
    reg = s.registry
    u = Universe()
    u.add("device", [0])
    gen = reg.generation if reg.generation is not None else s.w_generation
    return {"inst": (0, {0: reg.installed}), "gen": (0, {0: gen}), "snap": (0, {}), "snapgen": (-1, {}),
            "answer": answer}, u


_s3_select_project = _project(_s3_state, lambda s, u, a, taken: {"d": 0, "m": a["mechanism"]})


_s3_select_expected = _expected(_s3_state, E.S3.fields, ("inst", "gen"), adopt=False)


_s3_query_project = _project(_s3_state, lambda s, u, a, taken: {"d": 0})


_s3_query_expected = _expected(_s3_state, E.S3.fields, ("inst", "gen", "answer"), adopt=False,
                               value=lambda v: {"answer": v["mechanism"]})


def _s3_alloc_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    """allocate_owned answers which mechanism made the allocation: S3's query
    (the mechanism installed now).  Its refusals (no grant, OOM, ...) are
    S8's and S11's, outside S3's encoding."""
    if taken != "ok":
        return None
    return _s3_query_project(s, args, taken)


SYS_ADAPTERS = [
    Adapter("S3", "select", "select", _s3_select_project, _s3_select_expected, ("inst", "gen")),
    Adapter("S3", "query", "binding_capabilities", _s3_query_project, _s3_query_expected, ("inst", "gen", "answer")),
    Adapter("S3", "query", "manager_capabilities", _s3_query_project, _s3_query_expected, ("inst", "gen", "answer")),
    Adapter("S3", "query", "allocate_owned", _s3_alloc_project, _s3_query_expected, ("inst", "gen", "answer")),
]


def run_all(samples: int = 1000, seed: int = 0, inv_samples: int = 0, per_branch: int | None = None, *,
            walks: tuple[str, ...] | None = None, row: str | None = None,
            max_steps: int = 400000) -> list[AgreementReport]:
    """Transition agreement on ``samples`` states per adapter (or, with
    ``per_branch``, until every outcome branch of each adapter's encoded action
    has ``per_branch`` agreeing samples, at most ``samples``), invariant
    agreement on the first ``inv_samples`` of them, on every agreement walk of
    :data:`memspec.invariants.formal.walks.WALKS` (``walks``: those names only).
    The walks focused on rare branches (no ``prior``) run first: what they
    sample counts towards the main walks' quotas.  ``row``: only the adapters
    credited to that row (its own, or by ``also``): the self-test's agreement
    detector walks what ``memspec prove`` walks for the row."""
    from memspec.invariants.formal.proofs_catalog import machines
    from memspec.invariants.formal.walks import WALKS

    proofs: dict[str, Proof] = {p.id: p for p in E.PROOFS + E.MORE_PROOFS}
    lists = {"MECH": MECH_ADAPTERS, "SYS": SYS_ADAPTERS, "SMALL": SMALL_SYS_ADAPTERS, "TICKET": TICKET_ADAPTERS}
    too_big = {"mechanism": _mech_too_big, "system": _sys_too_big}
    out: list[AgreementReport] = []
    for w in sorted((w for w in WALKS if w.adapters and (walks is None or w.name in walks)), key=lambda w: w.prior):
        ads = [a for a in lists[w.adapters] if (w.which is None or w.which(a))
               and (row is None or a.invariant == row or row in a.also)]
        if not ads:
            continue
        m, n = machines()[w.level], w.samples(samples)
        out += walk_and_compare(_Restricted(m, w.focus) if w.focus else m, lambda w=w: start(w), ads, proofs, n,
                                seed + w.offset, too_big[w.level], max_steps=max_steps,
                                inv_samples=min(inv_samples, n), favour=w.favour, per_branch=per_branch,
                                prior=list(out) if w.prior else None)
    return out


# -- owned allocations (used by S4 / S7) --------------------------------------

_ASTATE = {"live": E.LIVE, "queued": E.QUEUED, "freed": E.FREED}


# -- KV releases (read off the request records, for the ledger's kv_release) ----

def _kv_run(s: Any, refs: list[int]) -> tuple[int, dict[int, int]]:
    """The KV bytes the releases of requests ``refs`` free, run in that order
    (spec/holders.py release_request, read off the request records: a
    request's private pages, less the prefix its open sharers still map; a
    sharer's release lets its released origin give back what no one maps),
    and every request's own bytes after."""
    own = {r: q.own for r, q in s.kv.items()}
    sharers = {r: dict(q.sharers) for r, q in s.kv.items()}
    released = {r for r, q in s.kv.items() if q.state == "released"}
    freed = 0
    for r in refs:
        q = s.kv[r]
        released.add(r)
        if q.prefix_of is None:
            keep = max(sharers[r].values(), default=0)
            freed += own[r] - keep
            own[r] = keep
        else:
            freed += own[r]
            own[r] = 0
            o = q.prefix_of
            sharers[o].pop(r, None)
            if o in released:
                keep = max(sharers[o].values(), default=0)
                freed += own[o] - keep
                own[o] = keep
    return freed, own


def _kv_record(s: Any, ix: dict[int, int], **fields: str) -> dict[str, Any]:
    """The KV requests' record, as both machines project it: each field (indexed by ``ix``, the
    request's object) reads one attribute of the spec's request (committed, own, prefix)."""
    return {f: (0, {ix[r]: getattr(q, attr) for r, q in s.kv.items()}) for f, attr in fields.items()}


def _kv_open_refusals(s: Any, request: tuple[Any, int, Any, int]) -> dict[str, bool]:
    """kv_open's refusals, as every row's projection reads them: ``unsup`` (no VirtualBacking, or no
    SharedMapping for a prefix) and ``bad`` (a prefix past what its origin holds, or past the request)."""
    _ref, max_bytes, origin, prefix = request
    vb, sm = s.registry.capabilities[s.registry.installed]
    return {"unsup": not vb or (origin is not None and not sm),
            "bad": origin is not None and (prefix > s.kv[origin].own or prefix > max_bytes)}


# -- the VMM machine (S5, S12, S13): owning reservations and KV requests ------------

def _vmm_sys_state(s: Any, ret: int = 0) -> tuple[dict[str, Any], Universe]:
    """Owning reservations and KV requests as one kind of owned reservation: live
    (an owning one: in the binding's reservations; a request: open), made by a
    mechanism with VirtualBacking or not, its size (a request's maximum), its
    committed bytes, its base (the address the target reported; a request's
    stable range: 0, the spec does not see it) and the one it was reserved at; a
    request's own committed bytes and read-only prefix (of an origin request)."""
    u = Universe()
    res = {r: o for r, o in s.owned.items() if o.kind == "reservation"}
    ix = u.add("res", {**res, **s.kv})
    caps = s.registry.capabilities
    vb, sm = caps[s.registry.installed]
    st = {
        **_empty(E.S5.fields),
        "cap": vb, "scap": sm, "page": s.page, "capacity": s.capacity, "free": s.free, "nextva": s.w_next_address,
        "ret": ret,
        "ostate": (0, {**{ix[r]: (E.LIVE if r in s.reservations else E.FREED) for r in res},
                       **{ix[r]: (E.LIVE if q.state == "open" else E.FREED) for r, q in s.kv.items()}}),
        "rcap": (False, {ix[r]: caps[o.creator][0] for r, o in {**res, **s.kv}.items()}),
        "osize": (0, {**{ix[r]: o.size for r, o in res.items()}, **{ix[r]: q.max_bytes for r, q in s.kv.items()}}),
        "ocb": (0, {**{ix[r]: len(o.committed) * s.page for r, o in res.items()},
                    **{ix[r]: q.committed for r, q in s.kv.items()}}),
        "base": (0, {ix[r]: o.address for r, o in res.items()}),
        "base0": (0, {ix[r]: o.base for r, o in res.items()}),
        "korig": (-1, {ix[r]: ix[q.prefix_of] for r, q in s.kv.items() if q.prefix_of is not None}),
        **_kv_record(s, ix, kown="own", kpre="prefix"),
    }
    return st, u


def _vmm_sys_expected(cmp: tuple[str, ...]) -> Any:
    def bytes_of(value: Any) -> dict[str, Any]:
        facts = getattr(value, "facts", None)  # commit_owned returns Seen(None, {"bytes": ..., "address": ...})
        return _ret(facts.get("bytes", 0) if isinstance(facts, dict) else 0)
    return _expected(_vmm_sys_state, E.S5.fields, cmp, value=bytes_of)


def _vmm_kv_open_args(s: Any, u: Universe, a: dict[str, Any], taken: str) -> dict[str, Any]:
    _ref, max_bytes, origin, prefix = a["request"]
    return {"r": _new_slot(u, "res"), "n": max_bytes, "org": u.idx["res"][origin] if origin is not None else 0,
            "p": prefix if origin is not None else 0, "hasorig": origin is not None}


def _kv_growth(s: Any, a: dict[str, Any], taken: str, ix: dict[int, int]) -> dict[str, Any]:
    """kv_grow's arguments, as both machines' projections read them: the request (``ix``: its object),
    its page-rounded new end, the refusals (``refuse``, the injected ``fail`` at step 4/5, ``oom``)."""
    from memspec.spec import kernels as K

    r, new, fail_at = a["growth"]
    return {"r": ix[r], "end": K.round_up(new, s.page), "refuse": taken == "InvalidRequest",
            "fail": fail_at in (4, 5), "oom": taken == "OutOfMemory"}


_VMM_NEW_CMP = ("ostate", "rcap", "osize", "ocb", "free", "base", "base0")
_VMM_SPAN_CMP = ("ostate", "osize", "ocb", "free", "base")
_VMM_KV_CMP = ("ostate", "rcap", "osize", "kown", "korig", "kpre")


def _vmm_sys(spec_action: str, project: Any, cmp: tuple[str, ...]) -> Adapter:
    """A system-level adapter of the VMM machine: S5's, each sample credited to S12 and S13 too."""
    return Adapter("S5", spec_action, spec_action, project, _vmm_sys_expected(cmp), cmp, also=_ON_VMM,
                   max_inv_samples=_VMM_MAX_INV)


SYS_ADAPTERS += [
    _vmm_sys("reserve_owned", _project(_vmm_sys_state, _reserve_args), _VMM_NEW_CMP),
    _vmm_sys("commit_owned", _project(_vmm_sys_state, _owned_span_args(True)), _VMM_SPAN_CMP + ("ret",)),
    _vmm_sys("decommit_owned", _project(_vmm_sys_state, _owned_span_args(False)), _VMM_SPAN_CMP),
    # a request's base is not the spec's to see: its state, creator's capability, maximum and prefix
    _vmm_sys("kv_open", _project(_vmm_sys_state, _vmm_kv_open_args), _VMM_KV_CMP),
    _vmm_sys("kv_grow", _project(_vmm_sys_state, lambda s, u, a, taken: _kv_growth(s, a, taken, u.idx["res"])),
             _VMM_SPAN_CMP + ("kown",)),
    _vmm_sys("kv_close", _project(_vmm_sys_state, lambda s, u, a, taken: {"q": u.idx["res"][a["request"]]}),
             _VMM_KV_CMP + ("ocb",)),
]


# -- a small device: reservations larger than it (the OutOfMemory the spec allows) --

#: the adapters of the walk on a device of two pages (:data:`memspec.invariants.formal.walks.WALKS`):
#: spec actions whose OutOfMemory branch needs a size past the device: reserve_owned draws at most 8
#: pages, fewer than the main walk's 16 (the VMM machine's; the queue machine's, S14's, are added by
#: :mod:`.agreement_adapters`); on a small device commit_owned outruns the budget (GrantDenied) too
SMALL_SYS_ADAPTERS = [a for a in SYS_ADAPTERS if (a.spec_action == "reserve_owned" and a.invariant == "S5")
                      or (a.spec_action == "commit_owned" and a.invariant == "S5")]
