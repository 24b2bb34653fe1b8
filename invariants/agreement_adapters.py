"""Projections of the executable spec's states onto the Z3 encodings
(:mod:`memspec.invariants.proofs_seed000`), per action; see
:mod:`memspec.invariants.agreement`."""

from __future__ import annotations

from typing import Any

from memspec.invariants import proofs_seed000 as E
from memspec.invariants.agreement import Adapter, AgreementReport, Universe, flatten, walk_and_compare
from memspec.invariants.proofs import Proof, prefix_values

UMAX = 6  # objects of one kind in a sampled state (the walk restarts beyond)
PAGE = 4096


# ==========================================================================
# Mechanism level (spec/mechanism.py MECHANISM)
# ==========================================================================

def _mech_init() -> Any:
    from memspec.spec.mechanism import init

    return init(capacity=12 * PAGE, page=PAGE, virtual_backing=True, shared_mapping=True, ep=True)


def _mech_too_big(s: Any) -> bool:
    return (len(s.allocations) > UMAX or sum(1 for r in s.reservations.values() if r.kind == "backing") > UMAX
            or len(s.handles) > UMAX or len(s.mappings) > UMAX)


# -- S1 / S14: DeviceAllocator.deallocate ----------------------------------

def _s1_state(s: Any) -> tuple[dict[str, Any], Universe]:
    """Mechanism level: each allocation, made by the mechanism under test (0)
    or by its twin (1, a foreign handle); every freed one was freed by its
    creator unless the spec recorded a foreign free (then: by mechanism -1)."""
    u = Universe()
    ix = u.add("alloc", s.allocations)
    by = (lambda a: -1) if s.foreign_frees else (lambda a: 1 if a.foreign else 0)
    st = {
        "astate": (0, {ix[r]: (E.LIVE if a.live else E.FREED) for r, a in s.allocations.items()}),
        "amech": (0, {ix[r]: (1 if a.foreign else 0) for r, a in s.allocations.items()}),
        "actx": (0, {}), "fctx": (0, {}), "inst": 0,
        "fmech": (0, {ix[r]: by(a) for r, a in s.allocations.items() if not a.live}),
    }
    return st, u


def _s1_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s1_state(s)
    return st, {"x": u.idx["alloc"][args["handle"]], "m": 0, "c": 0}, u


_S1_CMP = ("astate", "amech", "fmech", "fctx", "inst")


def _s1_expected(s: Any, u: Universe, value: Any) -> Any:
    st, u2 = _s1_state(s)
    _adopt(u, u2)
    return flatten(st, E.S1.fields, _S1_CMP, u)


def _s1_alloc_project(foreign: bool) -> Any:
    def project(s: Any, args: dict[str, Any], taken: str) -> Any:
        """A refused allocation (OutOfMemory, InvalidRequest) makes nothing:
        no S1 record to compare (its accounting is S8's and S11's)."""
        if taken != "ok":
            return None
        st, u = _s1_state(s)
        return st, {"x": _new_slot(u, "alloc"), "m": 1 if foreign else 0, "c": 0}, u
    return project


def _s14_state(s: Any) -> tuple[dict[str, Any], Universe]:
    """Every object with an identity (allocations, reservations, physical
    handles; own or foreign) renumbered densely in creation order, so the
    identity of object ``i`` is ``i`` and the next identity is their count."""
    from memspec.spec.state import is_size  # noqa: F401  (the spec's own size rule is not reused here)

    u = Universe()
    objs: dict[int, Any] = {**s.allocations, **s.reservations, **s.handles}
    ix = u.add("obj", objs)

    def live(r: int) -> bool:
        o = objs[r]
        return (not o.released) if r in s.handles else o.live

    st = {
        "astate": (0, {ix[r]: (E.LIVE if live(r) else E.FREED) for r in objs}),
        "gen": (0, {ix[r]: ix[r] for r in objs}),
        "owner": (0, {ix[r]: ix[r] for r in objs}),
        "nextgen": len(objs),
        "addr": (0, {ix[r]: (o.address if r not in s.handles else 0) for r, o in objs.items()}),
        "addrd": (False, {ix[r]: True for r in s.allocations}),
        "foreign": (False, {ix[r]: bool(getattr(o, "foreign", False)) for r, o in objs.items()}),
        "byaddr": (E.NOADDR, {addr: ix[r] for addr, r in s.by_address.items()}),
    }
    return st, u


def _s14_sys_state(s: Any) -> tuple[dict[str, Any], Universe]:
    """The system level: the owning objects the binding handed out."""
    u = Universe()
    ix = u.add("obj", s.owned)
    st = {
        "astate": (0, {ix[r]: (E.LIVE if o.state == "live" else E.FREED) for r, o in s.owned.items()}),
        "gen": (0, {ix[r]: ix[r] for r in s.owned}), "owner": (0, {ix[r]: ix[r] for r in s.owned}),
        "nextgen": len(s.owned), "addr": (0, {}), "addrd": (False, {}), "foreign": (False, {}),
        "byaddr": (E.NOADDR, {}),
    }
    return st, u


_S14_CMP = ("astate", "addrd", "foreign", "nextgen")


def _s14_expected_with(state_fn: Any) -> Any:
    def expected(s: Any, u: Universe, value: Any) -> Any:
        st, u2 = state_fn(s)
        _adopt(u, u2)
        return flatten(st, E.S14.fields, _S14_CMP, u)
    return expected


def _s14_err(errors: tuple[str, ...], cond: dict[str, bool], taken: str) -> int:
    """The index (1-based) of the first error outside S14 that the spec state
    forces (``cond``); else the error the walk follows where the spec only
    allows one (an OutOfMemory, a page-rounded plan over the budget); else 0."""
    for i, e in enumerate(errors):
        if cond.get(e):
            return i + 1
    return errors.index(taken) + 1 if taken in errors else 0


def _not_size(x: Any) -> bool:
    return not (isinstance(x, int) and not isinstance(x, bool) and x > 0)


def _s14_make_project(errors_of: str, kind: str) -> Any:
    errors = E._S14_MAKE[errors_of][0]

    def project(s: Any, args: dict[str, Any], taken: str) -> Any:
        st, u = _s14_state(s) if kind == "mech" else _s14_sys_state(s)
        size = args["size"]
        cond = {"InvalidRequest": _not_size(size) or (errors_of == "create" and size % s.page != 0)}
        if errors_of == "allocate_owned" and not cond["InvalidRequest"]:
            cond["GrantDenied"] = size > s.free
        if errors_of == "reserve_owned":
            cond["Unsupported"] = not s.registry.capabilities[s.registry.installed][0]
        err = _s14_err(errors, cond, taken)
        # a fresh address no live allocation owns (the spec's witness picks it after this step)
        ad = max([0] + [k + 1 for k in st["byaddr"][1]]) if errors_of == "allocate" else 0
        return st, {"x": _new_slot(u, "obj"), "ad": ad, "err": err}, u
    return project


def _s14_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s14_state(s)
    return st, {"x": u.idx["obj"][args["handle"]]}, u


def _s14_res_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s14_state(s)
    ref = args["reservation"]
    r = s.reservations[ref]
    mapped = r.live and not r.foreign and bool(getattr(r, "backed", ()))
    return st, {"x": u.idx["obj"][ref], "err": 1 if mapped else 0}, u


# -- S5: VirtualBacking ----------------------------------------------------

_S5_SYS_EMPTY = {"free": 0, "ostate": (0, {}), "rcap": (False, {}), "osize": (0, {}), "ocb": (0, {}),
                 "kst": (0, {}), "kcap": (False, {})}


def _s5_state(s: Any, ret: int = 0, answer: int = 0) -> tuple[dict[str, Any], Universe]:
    u = Universe()
    res = {r: v for r, v in s.reservations.items() if v.kind == "backing"}
    ix = u.add("res", res)
    u.pages = max([v.size // s.page for v in res.values()] + [0]) + 2
    st = {
        "cap": s.virtual_backing, "scap": s.shared_mapping, "page": s.page, "capacity": s.capacity,
        "physical": s.physical, "foreign": s.foreign_bytes,
        "other": s.eager_bytes + s.shared_bytes + s.private_bytes, "ctot": s.committed_bytes,
        "absent": s.absent_answered,
        "rlive": (False, {ix[r]: v.live for r, v in res.items()}),
        "rforeign": (False, {ix[r]: v.foreign for r, v in res.items()}),
        "rsize": (0, {ix[r]: v.size for r, v in res.items()}),
        "pc": {ix[r]: set(v.committed) for r, v in res.items()},
        "reported": (0, {ix[r]: v.reported for r, v in res.items()}),
        "answer": answer, "ret": ret, **_S5_SYS_EMPTY,
    }
    return st, u


_S5_CMP = ("cap", "physical", "ctot", "absent", "rlive", "rforeign", "rsize", "pc", "reported")


def _s5_span_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s5_state(s)
    ref, lo, hi = args["span"]
    return st, {"r": u.idx["res"][ref], "lo": lo, "hi": hi, "oom": taken == "OutOfMemory"}, u


def _s5_ret_expected(s: Any, u: Universe, value: Any) -> Any:
    st, u2 = _s5_state(s, ret=value if _is_int(value) else 0)
    _adopt(u, u2)
    u.pages = max(u.pages, u2.pages)
    return flatten(st, E.S5.fields, _S5_CMP + ("ret",), u)


def _s5_release_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s5_state(s)
    if args["reservation"] not in u.idx["res"]:
        return None
    return st, {"r": u.idx["res"][args["reservation"]]}, u


def _s5_reserve_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    from memspec.spec import kernels as K

    st, u = _s5_state(s)
    size = args["size"]
    bad = _not_size(size)
    return st, {"r": _new_slot(u, "res"), "n": s.page if bad else K.round_up(size, s.page), "bad": bad,
                "oom": taken == "OutOfMemory"}, u


def _s5_query_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s5_state(s)
    return st, {}, u


def _s5_query_expected(s: Any, u: Universe, value: Any) -> Any:
    st, _ = _s5_state(s, answer=0 if value is None else 1)
    return flatten(st, E.S5.fields, _S5_CMP + ("answer",), u)


# -- S13: SharedMapping ----------------------------------------------------

def _s13_state(s: Any, ret: int = 0) -> tuple[dict[str, Any], Universe]:
    u = Universe()
    hx = u.add("handle", s.handles)
    mx = u.add("mapping", s.mappings)
    shared_res = {r: v for r, v in s.reservations.items() if v.kind == "shared"}
    rx = u.add("res", shared_res)
    hs, ms = s.handles, s.mappings
    st = {
        "page": s.page, "capacity": s.capacity, "physical": s.physical, "foreign": getattr(s, "foreign_bytes", 0),
        "shared": s.shared_bytes,
        "private": s.private_bytes,
        "hexists": (False, {hx[r]: True for r in hs}),
        "hsize": (0, {hx[r]: h.size for r, h in hs.items()}),
        "hreleased": (False, {hx[r]: h.released for r, h in hs.items()}),
        "hmaps": (0, {hx[r]: h.mappings for r, h in hs.items()}),
        "hfreed": (False, {hx[r]: h.freed for r, h in hs.items()}),
        "mlive": (False, {mx[r]: m.live for r, m in ms.items()}),
        "mh": (0, {mx[r]: hx[m.handle] for r, m in ms.items()}),
        "msize": (0, {mx[r]: m.size for r, m in ms.items()}),
        "mro": (False, {mx[r]: m.read_only for r, m in ms.items()}),
        "mpriv": (False, {mx[r]: m.private for r, m in ms.items()}),
        "rowrites": s.readonly_writes,
        "rlive": (False, {rx[r]: v.live for r, v in shared_res.items()}),
        "ret": ret,
        "nm": len(ms),
        "PM": {hx[h]: prefix_values([1 if (m.live and not m.private and m.handle == h) else 0
                                     for _r, m in sorted(ms.items())]) for h in hs},
        # the KV part of S13 is the system level's
        "cap": s.virtual_backing, "scap": s.shared_mapping, "kst": (0, {}), "kown": (0, {}), "korig": (-1, {}),
        "kpre": (0, {}),
    }
    return st, u


_S13_CMP = ("physical", "shared", "private", "hexists", "hsize", "hreleased", "hmaps", "hfreed",
            "mlive", "mh", "msize", "mro", "mpriv", "rowrites", "rlive")


def _misplaced(s: Any, ref: int, off: int, size: int) -> bool:
    """A map that does not fit: misaligned, past the end, or over a backed page."""
    r = s.reservations[ref]
    if off % s.page or off + size > r.size or off < 0:
        return True
    return any(p in r.backed for p in range(off // s.page, (off + size) // s.page))


def _s13_expected(s: Any, u: Universe, value: Any) -> Any:
    st, u2 = _s13_state(s, ret=value if isinstance(value, int) else 0)
    # a mapping made by this step gets the next dense index, as in the projection
    for k in ("handle", "mapping", "res"):
        if len(u2.idx[k]) > len(u.idx[k]):
            u.idx[k] = u2.idx[k]
    return flatten(st, E.S13.fields, _S13_CMP + ("ret",), u)


def _s13_create_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s13_state(s)
    u.idx["handle"] = {**u.idx["handle"], -1: len(u.idx["handle"])}  # the new handle's slot
    n = args["size"]
    if not isinstance(n, int) or isinstance(n, bool):
        return None  # a non-int size: the spec's InvalidRequest, not an arithmetic case
    return st, {"h": len(s.handles), "n": n, "oom": taken == "OutOfMemory"}, u


def _s13_map_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s13_state(s)
    h = s.handles[args["handle"]]
    ref, off = args["place"]
    u.idx["mapping"] = {**u.idx["mapping"], -1: len(u.idx["mapping"])}
    return st, {"m": len(s.mappings), "h": u.idx["handle"][args["handle"]], "ro": args["read_only"],
                "r": u.idx["res"][ref], "bad": _misplaced(s, ref, off, h.size)}, u


def _s13_mapping_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s13_state(s)
    mref, res, _off, size = args["mapping"]
    return st, {"m": u.idx["mapping"][mref], "size": size, "oom": taken == "OutOfMemory"}, u


def _s13_handle_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s13_state(s)
    return st, {"h": u.idx["handle"][args["handle"]]}, u


def _s13_write_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s13_state(s)
    return st, {"m": u.idx["mapping"][args["mapping"][0]]}, u


def _s13_free_res_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s13_state(s)
    ref = args["reservation"]
    r = s.reservations[ref]
    return st, {"r": u.idx["res"][ref], "mapped": bool(r.backed)}, u


MECH_ADAPTERS = [
    Adapter("S14", "free", "deallocate", _s14_project, _s14_expected_with(_s14_state), _S14_CMP),
    Adapter("S14", "release_reservation", "release_reservation", _s14_res_project, _s14_expected_with(_s14_state),
            _S14_CMP),
    Adapter("S14", "free_shared_reservation", "free_shared_reservation", _s14_res_project,
            _s14_expected_with(_s14_state), _S14_CMP),
] + [
    Adapter("S14", n, n, _s14_make_project(n, "mech"), _s14_expected_with(_s14_state), _S14_CMP)
    for n in ("allocate", "create", "reserve", "shared_reserve")
] + [
    Adapter("S5", "query_virtual_backing", "query_virtual_backing", _s5_query_project, _s5_query_expected,
            _S5_CMP + ("answer",)),
    Adapter("S5", "query_shared_mapping", "query_shared_mapping", _s5_query_project, _s5_query_expected,
            _S5_CMP + ("answer",)),
    Adapter("S5", "reserve", "reserve", _s5_reserve_project, _s5_ret_expected, _S5_CMP),
    Adapter("S5", "committed_bytes", "committed_bytes", _s5_release_project, _s5_ret_expected, _S5_CMP + ("ret",)),
    Adapter("S5", "commit_range", "commit_range", _s5_span_project, _s5_ret_expected, _S5_CMP + ("ret",)),
    Adapter("S5", "decommit_range", "decommit_range", _s5_span_project, _s5_ret_expected, _S5_CMP + ("ret",)),
    Adapter("S5", "release_reservation", "release_reservation", _s5_release_project, _s5_ret_expected, _S5_CMP + ("ret",)),
    Adapter("S13", "create", "create", _s13_create_project, _s13_expected, _S13_CMP),
    Adapter("S13", "map", "map", _s13_map_project, _s13_expected, _S13_CMP + ("ret",)),
    Adapter("S13", "unmap", "unmap", _s13_mapping_project, _s13_expected, _S13_CMP + ("ret",)),
    Adapter("S13", "copy_on_write", "copy_on_write", _s13_mapping_project, _s13_expected, _S13_CMP + ("ret",)),
    Adapter("S13", "release_handle", "release_handle", _s13_handle_project, _s13_expected, _S13_CMP + ("ret",)),
    Adapter("S13", "write_through", "write_through", _s13_write_project, _s13_expected, _S13_CMP),
    Adapter("S13", "mapping_count", "mapping_count", _s13_handle_project, _s13_expected, _S13_CMP + ("ret",)),
    Adapter("S13", "free_shared_reservation", "free_shared_reservation", _s13_free_res_project, _s13_expected,
            _S13_CMP),
]


# -- S12: mechanism reservations keep their address --------------------------

def _aligned_nonempty(lo: int, hi: int, page: int) -> bool:
    return 0 <= lo < hi and lo % page == 0 and hi % page == 0


def _s12_bad(page: int, size: int, committed: Any, lo: int, hi: int, commit: bool) -> bool:
    """InvalidRange for a reason other than S12's guard (the end past the
    reservation): misaligned, empty, reversed, a page already (commit) or
    not (decommit) committed."""
    if not _aligned_nonempty(lo, hi, page):
        return True
    if hi > size:
        return False  # the guard's case
    span = range(lo // page, hi // page)
    return any(p in committed for p in span) if commit else not all(p in committed for p in span)


def _s12_mech_state(s: Any) -> tuple[dict[str, Any], Universe]:
    u = Universe()
    res = {r: v for r, v in s.reservations.items() if v.kind == "backing"}
    ix = u.add("res", res)
    st = {
        "rstate": (0, {ix[r]: (E.LIVE if v.live else E.FREED) for r, v in res.items()}),
        "base": (0, {ix[r]: v.address for r, v in res.items()}),
        "base0": (0, {ix[r]: v.address for r, v in res.items()}),
        "rsize": (0, {ix[r]: v.size for r, v in res.items()}),
        "kc": (0, {ix[r]: len(v.committed) * s.page for r, v in res.items()}),
        "rforeign": (False, {ix[r]: v.foreign for r, v in res.items()}),
        "nextva": s.w_next_address, "free": 0, "cap": s.virtual_backing, "scap": s.shared_mapping,
    }
    return st, u


_S12_MECH_CMP = ("rstate", "base", "rsize", "kc")


def _s12_mech_project(commit: bool) -> Any:
    def project(s: Any, args: dict[str, Any], taken: str) -> Any:
        st, u = _s12_mech_state(s)
        ref, lo, hi = args["span"]
        r = s.reservations[ref]
        return st, {"r": u.idx["res"][ref], "lo": lo, "hi": hi, "oom": taken == "OutOfMemory",
                    "bad": _s12_bad(s.page, r.size, r.committed, lo, hi, commit)}, u
    return project


def _s12_mech_expected(s: Any, u: Universe, value: Any) -> Any:
    st, _ = _s12_mech_state(s)
    return flatten(st, E.S12.fields, _S12_MECH_CMP, u)


MECH_ADAPTERS += [
    Adapter("S12", "commit_range", "commit_range", _s12_mech_project(True), _s12_mech_expected, _S12_MECH_CMP),
    Adapter("S12", "decommit_range", "decommit_range", _s12_mech_project(False), _s12_mech_expected, _S12_MECH_CMP),
]


def run_mechanism(samples: int, seed: int, inv_samples: int = 0, per_branch: int | None = None,
                  prior: list[AgreementReport] | None = None) -> list[AgreementReport]:
    from memspec.spec.mechanism import MECHANISM

    proofs: dict[str, Proof] = {p.id: p for p in E.PROOFS}
    return walk_and_compare(MECHANISM, _mech_init, MECH_ADAPTERS, proofs, samples, seed, _mech_too_big,
                            inv_samples=inv_samples, per_branch=per_branch, prior=prior)




# ==========================================================================
# System level (spec/system.py SYSTEM)
# ==========================================================================

def _sys_init() -> Any:
    from memspec.spec.system import init

    return init(capacity=16 * PAGE, page=PAGE, virtual_backing=True, shared_mapping=True)


def _sys_too_big(s: Any) -> bool:
    return (len(s.grants) > UMAX or len(s.leases) > UMAX or len(s.tickets) > UMAX
            or sum(1 for o in s.owned.values() if o.kind == "allocation") > UMAX)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _new_slot(u: Universe, kind: str) -> int:
    n = len(u.idx[kind])
    u.idx[kind] = {**u.idx[kind], -1 - n: n}
    return n


def _adopt(u: Universe, u2: Universe) -> None:
    for k, m in u2.idx.items():
        if len(m) >= len(u.idx.get(k, {})):
            u.idx[k] = m


# -- S15 / G1: pressure tickets and configuration generations ----------------

_TSTATE = {"pending": E.T_PENDING, "granted": E.T_GRANTED, "claimed": E.T_CLAIMED, "cancelled": E.T_CANCELLED,
           "timed_out": E.T_TIMED_OUT, "failed": E.T_FAILED}


def _s15_state(s: Any, out_bytes: int = 0) -> tuple[dict[str, Any], Universe]:
    u = Universe()
    tx = u.add("ticket", s.tickets)
    ts = s.tickets
    order = [tk for _r, tk in sorted(ts.items())]
    st = {
        "cap": s.capacity, "free": s.free, "granted": s.granted, "charged": s.charged,
        "tstate": (0, {tx[r]: _TSTATE.get(t.state, 9) for r, t in ts.items()}),
        "held": (0, {tx[r]: t.held for r, t in ts.items()}),
        "ret": (0, {tx[r]: t.returns for r, t in ts.items()}),
        "amount": (0, {tx[r]: t.amount for r, t in ts.items()}),
        "deadline": (0, {tx[r]: t.deadline for r, t in ts.items()}),
        "tgen": (0, {tx[r]: t.generation for r, t in ts.items()}),
        "gen": s.generation,
        "sumheld": s.tickets_held, "sumgr": s.open_grants, "out_bytes": out_bytes, "nt": len(ts),
        "PP": prefix_values([tk.held if tk.state == "pending" else 0 for tk in order]),
        "PN": prefix_values([tk.held if tk.state == "granted" else 0 for tk in order]),
    }
    return st, u


_S15_CMP = ("cap", "free", "granted", "charged", "tstate", "held", "ret", "amount", "deadline", "tgen", "gen")


def _s15_expected(s: Any, u: Universe, value: Any) -> Any:
    n = value if _is_int(value) else getattr(value, "nbytes", 0)
    st, u2 = _s15_state(s, out_bytes=n if _is_int(n) else 0)
    _adopt(u, u2)
    return flatten(st, E.S15.fields, _S15_CMP + ("out_bytes",), u)


def _s15_plain_expected(s: Any, u: Universe, value: Any) -> Any:
    st, u2 = _s15_state(s)
    _adopt(u, u2)
    return flatten(st, E.S15.fields, _S15_CMP, u)


def _s15_issue_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    amount, _priority, deadline = args["request"]
    if not _is_int(amount):
        return None
    st, u = _s15_state(s)
    return st, {"t": _new_slot(u, "ticket"), "n": amount, "dl": deadline}, u


def _s15_ticket_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s15_state(s)
    return st, {"t": u.idx["ticket"][args["ticket"]]}, u


def _s15_respond_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    """A holder's answer: ``r`` is what its releases refunded -- the value the
    step returns, filled in by :func:`_s15_respond_expected`.  Skipped when
    releases are already queued: the answer runs those too (other holders'
    refunds, outside the encoding)."""
    if s.queue and taken == "ok":
        return None
    st, u = _s15_state(s)
    enc_args = {"t": u.idx["ticket"][args["answer"][0]], "r": 0}
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


def _s15_reconfigure_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s15_state(s)
    return st, {}, u


def _s15_adapters(inv: str) -> list[Adapter]:
    return [
        Adapter(inv, "issue_ticket", "issue_ticket", _s15_issue_project, _s15_plain_expected, _S15_CMP),
        Adapter(inv, "respond", "respond", _s15_respond_project, _s15_respond_expected, _S15_CMP),
        Adapter(inv, "claim", "claim", _s15_ticket_project, _s15_expected, _S15_CMP + ("out_bytes",)),
        Adapter(inv, "cancel_ticket", "cancel_ticket", _s15_ticket_project, _s15_expected, _S15_CMP + ("out_bytes",)),
        Adapter(inv, "expire", "expire", _s15_expire_project, _s15_plain_expected, _S15_CMP,
                permit=_s15_expire_permit),
        Adapter(inv, "reconfigure", "reconfigure", _s15_reconfigure_project, _s15_plain_expected, _S15_CMP),
    ]


#: S15's and G1's adapters (one machine, two properties), sampled by :func:`run_tickets`
TICKET_ADAPTERS = _s15_adapters("S15") + _s15_adapters("G1")

#: the ticket protocol's actions and what it needs (resident cold weights to release): the walk
#: that samples S15 and G1 runs on these, so that granted tickets (claim ok) are common
_TICKET_WALK = ("issue_ticket", "respond", "claim", "cancel_ticket", "expire", "reconfigure", "load_weight",
                "set_hot", "unload_weight")


def _tickets_init() -> Any:
    """SYSTEM's init, then ModelResidency loads two cold weights (spec steps, so
    the state is reachable): a holder then has bytes to release for a ticket."""
    from memspec.spec.selfcheck import drive
    from memspec.spec.system import SYSTEM

    s = _sys_init()
    for name in ("w1", "w2"):
        drive(SYSTEM, s, "load_weight", weight=(name, False, s.weights[name].pages * s.page))
    return s


class _Restricted:
    def __init__(self, machine: Any, names: tuple[str, ...]) -> None:
        self.actions = [a for a in machine.actions if a.name in names]


def run_tickets(samples: int, seed: int, inv_samples: int = 0, per_branch: int | None = None,
                prior: list[AgreementReport] | None = None) -> list[AgreementReport]:
    """S15 and G1 on the ticket protocol's actions of SYSTEM (every state it
    visits is a reachable SYSTEM state: a subset of its actions from its init)."""
    from memspec.spec.system import SYSTEM

    proofs: dict[str, Proof] = {p.id: p for p in E.PROOFS + E.MORE_PROOFS}
    ads = [a for a in TICKET_ADAPTERS if a.invariant in proofs]
    return walk_and_compare(_Restricted(SYSTEM, _TICKET_WALK), _tickets_init, ads, proofs, samples, seed + 15,
                            _sys_too_big, inv_samples=inv_samples, per_branch=per_branch, prior=prior)


# -- S3: selection and capability queries ------------------------------------

def _s3_state(s: Any, answer: int = 0) -> tuple[dict[str, Any], Universe]:
    reg = s.registry
    u = Universe()
    u.add("device", [0])
    gen = reg.generation if reg.generation is not None else s.w_generation
    return {"inst": (0, {0: reg.installed}), "gen": (0, {0: gen}), "snap": (0, {}), "snapgen": (-1, {}),
            "answer": answer}, u


def _s3_select_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s3_state(s)
    return st, {"d": 0, "m": args["mechanism"]}, u


def _s3_select_expected(s: Any, u: Universe, value: Any) -> Any:
    st, _ = _s3_state(s)
    return flatten(st, E.S3.fields, ("inst", "gen"), u)


def _s3_query_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s3_state(s)
    return st, {"d": 0}, u


def _s3_query_expected(s: Any, u: Universe, value: Any) -> Any:
    st, _ = _s3_state(s, answer=value["mechanism"])
    return flatten(st, E.S3.fields, ("inst", "gen", "answer"), u)


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
] + [
    Adapter("S14", n, n, _s14_make_project(n, "sys"), _s14_expected_with(_s14_sys_state), _S14_CMP)
    for n in ("allocate_owned", "reserve_owned")
]


def run_system(samples: int, seed: int, inv_samples: int = 0, per_branch: int | None = None,
               prior: list[AgreementReport] | None = None) -> list[AgreementReport]:
    from memspec.spec.system import SYSTEM

    proofs: dict[str, Proof] = {p.id: p for p in E.PROOFS}
    return walk_and_compare(SYSTEM, _sys_init, SYS_ADAPTERS, proofs, samples, seed, _sys_too_big,
                            inv_samples=inv_samples, per_branch=per_branch, prior=prior)


def run_all(samples: int = 1000, seed: int = 0, inv_samples: int = 0,
            per_branch: int | None = None) -> list[AgreementReport]:
    """Transition agreement on ``samples`` states per adapter (or, with
    ``per_branch``, until every outcome branch of each adapter's encoded action
    has ``per_branch`` agreeing samples, at most ``samples``), invariant
    agreement on the first ``inv_samples`` of them.  The walks focused on rare
    branches run first: what they sample counts towards the main walks' quotas."""
    out = (run_small_system(samples, seed, inv_samples, per_branch) + run_focused(samples, seed, inv_samples, per_branch)
           + run_bare_mechanism(samples, seed, inv_samples, per_branch))
    out += run_mechanism(samples, seed, inv_samples, per_branch, prior=out)
    out += run_system(samples, seed, inv_samples, per_branch, prior=out)
    return out + run_tickets(samples, seed, inv_samples, per_branch, prior=out)


# -- owned allocations (used by S4 / S7) --------------------------------------

_ASTATE = {"live": E.LIVE, "queued": E.QUEUED, "freed": E.FREED}


def _owned_allocs(s: Any) -> dict[int, Any]:
    return {r: o for r, o in s.owned.items() if o.kind == "allocation"}


# -- S2: charge before commit, per holder --------------------------------------

def _s2_holders() -> dict[str, int]:
    from memspec.spec.governor import KV, SESSION, WEIGHTS

    return {SESSION: 0, WEIGHTS: 1, KV: 2}


def _s2_state(s: Any) -> tuple[dict[str, Any], Universe]:
    """Installed bytes and charge per holder (session 0, weights 1, KV 2), and free."""
    u = Universe()
    hx = _s2_holders()
    u.add("holder", list(hx.values()))
    return {"committed": (0, {i: s.physical_by.get(h, 0) for h, i in hx.items()}),
            "charge": (0, {i: s.charged_by.get(h, 0) for h, i in hx.items()}), "free": s.free}, u


_S2_CMP = ("committed", "charge", "free")


def _s2_expected(s: Any, u: Universe, value: Any) -> Any:
    st, _ = _s2_state(s)
    return flatten(st, E.S2.fields, _S2_CMP, u)


def _s2_range_bad(s: Any, span: tuple[int, int, int]) -> bool:
    """Not a page range inside the reservation, or a page of it committed already (read from the record)."""
    ref, start, end = span
    o = s.owned[ref]
    if not (0 <= start < end <= o.size and start % s.page == 0 and end % s.page == 0):
        return True
    return any(p in o.committed for p in range(start // s.page, end // s.page))


def _s2_commit_owned_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    ref, start, end = args["span"]
    st, u = _s2_state(s)
    return st, {"n": end - start if end > start else 1, "bad_range": _s2_range_bad(s, args["span"]),
                "oom": taken == "OutOfMemory"}, u


def _s2_allocate_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    """The session's footprint is the page-rounded size (the walk's witness);
    not a positive int: InvalidRequest before any accounting, outside S2."""
    size = args["size"]
    if not _is_int(size) or size <= 0:
        return None
    st, u = _s2_state(s)
    return st, {"h": 0, "fp": -(-size // s.page) * s.page, "oom": taken == "OutOfMemory"}, u


def _s2_load_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s2_state(s)
    return st, {"h": 1, "fp": args["weight"][2], "oom": taken == "OutOfMemory"}, u


def _s2_reserve_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    """Not a positive int: InvalidRequest before any accounting, outside S2."""
    n = args["nbytes"]
    if not _is_int(n) or n <= 0:
        return None
    st, u = _s2_state(s)
    return st, {"n": n}, u


def _s2_cancel_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    g = s.grants[args["grant"]]
    st, u = _s2_state(s)
    return st, {"gb": g.nbytes, "open": g.state == "open"}, u


def _s2_commit_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    ref, actual = args["grant"]
    g = s.grants[ref]
    st, u = _s2_state(s)
    return st, {"h": _s2_holders()[g.holder], "gb": g.nbytes, "actual": actual, "open": g.state == "open"}, u


def _s2_grow_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    r, new, fail_at = args["growth"]
    q = s.kv[r]
    st, u = _s2_state(s)
    return st, {"n": -(-new // s.page) * s.page - q.committed, "past": new > q.max_bytes,
                "refuse": taken == "InvalidRequest", "fail": fail_at in (4, 5), "oom": taken == "OutOfMemory"}, u


SYS_ADAPTERS += [
    Adapter("S2", "commit_owned", "commit_owned", _s2_commit_owned_project, _s2_expected, _S2_CMP),
    Adapter("S2", "allocate", "allocate_owned", _s2_allocate_project, _s2_expected, _S2_CMP),
    Adapter("S2", "allocate", "load_weight", _s2_load_project, _s2_expected, _S2_CMP),
    Adapter("S2", "reserve", "reserve", _s2_reserve_project, _s2_expected, _S2_CMP),
    Adapter("S2", "cancel", "cancel", _s2_cancel_project, _s2_expected, _S2_CMP),
    Adapter("S2", "commit", "commit", _s2_commit_project, _s2_expected, _S2_CMP),
    Adapter("S2", "grow", "kv_grow", _s2_grow_project, _s2_expected, _S2_CMP),
]


# -- S9: KvPageStore growth ---------------------------------------------------

def _s9_state(s: Any, ret: int = 0) -> tuple[dict[str, Any], Universe]:
    u = Universe()
    qx = u.add("request", s.kv)
    st = {
        "rsize": (0, {qx[r]: q.max_bytes for r, q in s.kv.items()}),
        "kc": (0, {qx[r]: q.committed for r, q in s.kv.items()}),
        "view": (0, {qx[r]: q.committed for r, q in s.kv.items()}),
        "chg": (0, {qx[r]: q.own for r, q in s.kv.items()}),
        "prefix": (0, {qx[r]: q.prefix for r, q in s.kv.items()}),
        "free": s.free, "page": s.page, "ret": ret,
    }
    return st, u


_S9_CMP = ("rsize", "kc", "view", "chg", "free")


def _s9_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    r, new, fail_at = args["growth"]
    st, u = _s9_state(s)
    return st, {"r": u.idx["request"][r], "nb": new, "fail": fail_at or 0, "oom": taken == "OutOfMemory",
                "refuse": taken == "InvalidRequest"}, u


def _s9_expected(s: Any, u: Universe, value: Any) -> Any:
    st, _ = _s9_state(s, ret=value if _is_int(value) else 0)
    return flatten(st, E.S9.fields, _S9_CMP + ("ret",), u)


SYS_ADAPTERS.append(Adapter("S9", "grow", "kv_grow", _s9_project, _s9_expected, _S9_CMP + ("ret",)))


# -- S12: owning reservations and KV requests keep their address ---------------

def _s12_sys_state(s: Any) -> tuple[dict[str, Any], Universe]:
    """Owning reservations (base: the address the target reported, base0:
    the one reserved) and KV requests (the store's stable range, whose
    address the spec does not see: 0) as one kind of reservation."""
    u = Universe()
    res = {r: o for r, o in s.owned.items() if o.kind == "reservation"}
    ix = u.add("res", {**res, **s.kv})
    vb, sm = s.registry.capabilities[s.registry.installed]
    st = {
        "rstate": (0, {**{ix[r]: (E.LIVE if o.state == "live" else E.FREED) for r, o in res.items()},
                       **{ix[r]: (E.LIVE if q.state == "open" else E.FREED) for r, q in s.kv.items()}}),
        "base": (0, {ix[r]: o.address for r, o in res.items()}),
        "base0": (0, {ix[r]: o.base for r, o in res.items()}),
        "rsize": (0, {**{ix[r]: o.size for r, o in res.items()}, **{ix[r]: q.max_bytes for r, q in s.kv.items()}}),
        "kc": (0, {**{ix[r]: len(o.committed) * s.page for r, o in res.items()},
                   **{ix[r]: q.committed for r, q in s.kv.items()}}),
        "rforeign": (False, {}), "nextva": s.w_next_address, "free": s.free, "cap": vb, "scap": sm,
    }
    return st, u


_S12_SYS_CMP = ("rstate", "base", "rsize", "kc", "free")


def _s12_sys_expected(cmp: tuple[str, ...]) -> Any:
    def expected(s: Any, u: Universe, value: Any) -> Any:
        st, u2 = _s12_sys_state(s)
        _adopt(u, u2)
        return flatten(st, E.S12.fields, cmp, u)
    return expected


def _s12_span_project(commit: bool) -> Any:
    def project(s: Any, args: dict[str, Any], taken: str) -> Any:
        st, u = _s12_sys_state(s)
        ref, lo, hi = args["span"]
        o = s.owned[ref]
        return st, {"r": u.idx["res"][ref], "lo": lo, "hi": hi, "oom": taken == "OutOfMemory",
                    "bad": _s12_bad(s.page, o.size, o.committed, lo, hi, commit)}, u
    return project


def _s12_reserve_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    from memspec.spec import kernels as K

    st, u = _s12_sys_state(s)
    size = args["size"]
    bad = _not_size(size)
    return st, {"r": _new_slot(u, "res"), "n": s.page if bad else K.round_up(size, s.page), "bad": bad,
                "oom": taken == "OutOfMemory"}, u


def _s12_kv_open_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    _ref, max_bytes, origin, prefix = args["request"]
    st, u = _s12_sys_state(s)
    bad = origin is not None and (prefix > s.kv[origin].own or prefix > max_bytes)
    return st, {"r": _new_slot(u, "res"), "n": max_bytes, "bad": bad, "oom": False, "prefix": origin is not None}, u


def _s12_kv_grow_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    from memspec.spec import kernels as K

    r, new, fail_at = args["growth"]
    st, u = _s12_sys_state(s)
    return st, {"r": u.idx["res"][r], "end": K.round_up(new, s.page), "refuse": taken == "InvalidRequest",
                "fail": fail_at in (4, 5), "oom": taken == "OutOfMemory"}, u


SYS_ADAPTERS += [
    Adapter("S12", "reserve_owned", "reserve_owned", _s12_reserve_project,
            _s12_sys_expected(("rstate", "base", "base0", "rsize", "kc")), ("rstate", "base", "base0", "rsize", "kc")),
    Adapter("S12", "kv_open", "kv_open", _s12_kv_open_project, _s12_sys_expected(("rstate", "rsize")),
            ("rstate", "rsize")),
    Adapter("S12", "commit", "commit_owned", _s12_span_project(True), _s12_sys_expected(_S12_SYS_CMP), _S12_SYS_CMP),
    Adapter("S12", "decommit", "decommit_owned", _s12_span_project(False), _s12_sys_expected(_S12_SYS_CMP),
            _S12_SYS_CMP),
    Adapter("S12", "kv_grow", "kv_grow", _s12_kv_grow_project, _s12_sys_expected(_S12_SYS_CMP), _S12_SYS_CMP),
]


# -- a small device: reservations larger than it (the OutOfMemory the spec allows) --

def _small_sys_init() -> Any:
    from memspec.spec.system import init

    return init(capacity=2 * PAGE, page=PAGE, virtual_backing=True, shared_mapping=True)


#: spec actions whose OutOfMemory branch needs a size past the device: reserve_owned
#: draws at most 8 pages, fewer than the main walk's 16
SMALL_SYS_ADAPTERS = [a for a in SYS_ADAPTERS if a.spec_action == "reserve_owned" and a.invariant in ("S12", "S14")]
#: (S5's adapters are appended below, where they are defined)


def run_small_system(samples: int, seed: int, inv_samples: int = 0, per_branch: int | None = None,
                     prior: list[AgreementReport] | None = None) -> list[AgreementReport]:
    from memspec.spec.system import SYSTEM

    proofs: dict[str, Proof] = {p.id: p for p in E.PROOFS}
    n = max(20, samples // 8)
    return walk_and_compare(SYSTEM, _small_sys_init, SMALL_SYS_ADAPTERS, proofs, n, seed + 1, _sys_too_big,
                            inv_samples=min(inv_samples, n), per_branch=per_branch, prior=prior)


def _extra_small(n: int, seed: int, inv: int, ids: set[str]) -> list[AgreementReport]:
    return run_small_system(n, seed, inv) if ids & {"S5", "S12", "S14"} else []


# -- focused walks: the spec's own machine restricted to a few of its actions -----
#
# Branches the full walk reaches rarely (a KV prefix larger than what its
# origin committed; a shared reservation freed while still mapped) are
# reached by walking only the actions that build those states.  The states
# are reachable in the full machine (the same actions from the same init).

class _Focused:
    def __init__(self, machine: Any, names: tuple[str, ...]) -> None:
        self.actions = [a for a in machine.actions if a.name in names]


_KV_FOCUS = ("kv_open", "kv_grow", "kv_close")
_SHARED_FOCUS = ("shared_reserve", "create", "map", "unmap", "free_shared_reservation")


def run_focused(samples: int, seed: int, inv_samples: int = 0, per_branch: int | None = None,
                prior: list[AgreementReport] | None = None) -> list[AgreementReport]:
    from memspec.spec.mechanism import MECHANISM
    from memspec.spec.system import SYSTEM

    proofs: dict[str, Proof] = {p.id: p for p in E.PROOFS}
    n = max(20, samples // 8)
    kv = [a for a in SYS_ADAPTERS if a.spec_action == "kv_open" and a.invariant in ("S5", "S12", "S13")]
    sh = [a for a in MECH_ADAPTERS if a.spec_action == "free_shared_reservation" and a.invariant in ("S13", "S14")]
    n_kv = max(40, samples // 3)  # an oversized prefix is ~3% of kv_open's draws
    return (walk_and_compare(_Focused(SYSTEM, _KV_FOCUS), _sys_init, kv, proofs, n_kv, seed + 2, _sys_too_big,
                             inv_samples=min(inv_samples, n_kv), favour=0.1, per_branch=per_branch, prior=prior)
            + walk_and_compare(_Focused(MECHANISM, _SHARED_FOCUS), _mech_init, sh, proofs, n, seed + 3, _mech_too_big,
                               inv_samples=min(inv_samples, n), favour=0.1, per_branch=per_branch, prior=prior))


def _extra_focused(n: int, seed: int, inv: int, ids: set[str]) -> list[AgreementReport]:
    return run_focused(n, seed, inv) if ids & {"S5", "S12", "S13", "S14"} else []


EXTRA_WALKS = [_extra_small, _extra_focused]


# -- S13: KvPageStore read-only prefixes ------------------------------------------

_KST = {"open": 1, "closed": 2, "released": 2}


def _s13_sys_state(s: Any) -> tuple[dict[str, Any], Universe]:
    u = Universe()
    qx = u.add("request", s.kv)
    vb, sm = s.registry.capabilities[s.registry.installed]
    st = {
        "page": s.page, "capacity": s.capacity, "physical": 0, "foreign": 0, "shared": 0, "private": 0,
        "hexists": (False, {}), "hsize": (0, {}), "hreleased": (False, {}), "hmaps": (0, {}), "hfreed": (False, {}),
        "mlive": (False, {}), "mh": (0, {}), "msize": (0, {}), "mro": (False, {}), "mpriv": (False, {}),
        "rowrites": 0, "ret": 0, "PM": {}, "nm": 0, "rlive": (False, {}), "cap": vb, "scap": sm,
        "kst": (0, {qx[r]: _KST[q.state] for r, q in s.kv.items()}),
        "kown": (0, {qx[r]: q.own for r, q in s.kv.items()}),
        "korig": (-1, {qx[r]: qx[q.prefix_of] for r, q in s.kv.items() if q.prefix_of is not None}),
        "kpre": (0, {qx[r]: q.prefix for r, q in s.kv.items()}),
    }
    return st, u


_S13_KV_CMP = ("kst", "kown", "korig", "kpre")


def _s13_sys_expected(s: Any, u: Universe, value: Any) -> Any:
    st, u2 = _s13_sys_state(s)
    _adopt(u, u2)
    return flatten(st, E.S13.fields, _S13_KV_CMP, u)


def _s13_kv_open_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    _ref, max_bytes, origin, prefix = args["request"]
    st, u = _s13_sys_state(s)
    q = _new_slot(u, "request")
    return st, {"q": q, "n": max_bytes, "org": u.idx["request"][origin] if origin is not None else 0,
                "p": prefix if origin is not None else 0, "hasorig": origin is not None}, u


def _s13_kv_close_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s13_sys_state(s)
    return st, {"q": u.idx["request"][args["request"]]}, u


SYS_ADAPTERS += [
    Adapter("S13", "kv_open", "kv_open", _s13_kv_open_project, _s13_sys_expected, _S13_KV_CMP),
    Adapter("S13", "kv_close", "kv_close", _s13_kv_close_project, _s13_sys_expected, _S13_KV_CMP),
]


# -- S5: the binding's reservations and KV requests need VirtualBacking ---------

def _s5_sys_state(s: Any, ret: int = 0) -> tuple[dict[str, Any], Universe]:
    u = Universe()
    res = {r: o for r, o in s.owned.items() if o.kind == "reservation"}
    ox = u.add("res", res)
    qx = u.add("kv", s.kv)
    caps = s.registry.capabilities
    vb, sm = caps[s.registry.installed]
    st = {
        "cap": vb, "scap": sm, "page": s.page, "capacity": s.capacity, "physical": 0, "foreign": 0, "other": 0,
        "ctot": 0, "absent": 0, "rlive": (False, {}), "rforeign": (False, {}), "rsize": (0, {}), "pc": {},
        "reported": (0, {}), "answer": 0, "ret": ret, "free": s.free,
        "ostate": (0, {ox[r]: (E.LIVE if r in s.reservations else E.FREED) for r in res}),
        "rcap": (False, {ox[r]: caps[o.creator][0] for r, o in res.items()}),
        "osize": (0, {ox[r]: o.size for r, o in res.items()}),
        "ocb": (0, {ox[r]: len(o.committed) * s.page for r, o in res.items()}),
        "kst": (0, {qx[r]: (E.LIVE if q.state == "open" else E.FREED) for r, q in s.kv.items()}),
        "kcap": (False, {qx[r]: caps[q.creator][0] for r, q in s.kv.items()}),
    }
    return st, u


def _s5_sys_expected(cmp: tuple[str, ...]) -> Any:
    def expected(s: Any, u: Universe, value: Any) -> Any:
        facts = getattr(value, "facts", None)  # commit_owned returns Seen(None, {"bytes": ..., "address": ...})
        ret = facts.get("bytes", 0) if isinstance(facts, dict) else 0
        st, u2 = _s5_sys_state(s, ret=ret if _is_int(ret) else 0)
        _adopt(u, u2)
        return flatten(st, E.S5.fields, cmp, u)
    return expected


def _s5_reserve_owned_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    from memspec.spec import kernels as K

    st, u = _s5_sys_state(s)
    size = args["size"]
    bad = _not_size(size)
    return st, {"r": _new_slot(u, "res"), "n": s.page if bad else K.round_up(size, s.page), "bad": bad,
                "oom": taken == "OutOfMemory"}, u


def _s5_commit_owned_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s5_sys_state(s)
    ref, lo, hi = args["span"]
    o = s.owned[ref]
    return st, {"r": u.idx["res"][ref], "lo": lo, "hi": hi, "oom": taken == "OutOfMemory",
                "bad": _s12_bad(s.page, o.size, o.committed, lo, hi, True)}, u


def _s5_kv_open_project(s: Any, args: dict[str, Any], taken: str) -> Any:
    _ref, max_bytes, origin, prefix = args["request"]
    st, u = _s5_sys_state(s)
    bad = origin is not None and (prefix > s.kv[origin].own or prefix > max_bytes)
    return st, {"q": _new_slot(u, "kv"), "bad": bad, "prefix": origin is not None}, u


_S5_OWN_CMP = ("ostate", "rcap", "osize", "ocb", "free")
SYS_ADAPTERS += [
    Adapter("S5", "reserve_owned", "reserve_owned", _s5_reserve_owned_project, _s5_sys_expected(_S5_OWN_CMP),
            _S5_OWN_CMP),
    Adapter("S5", "commit_owned", "commit_owned", _s5_commit_owned_project,
            _s5_sys_expected(_S5_OWN_CMP + ("ret",)), _S5_OWN_CMP + ("ret",)),
    Adapter("S5", "kv_open", "kv_open", _s5_kv_open_project, _s5_sys_expected(("kst", "kcap")), ("kst", "kcap")),
]


# on a small device reserve_owned may be refused (OutOfMemory) and commit_owned outruns the budget (GrantDenied)
SMALL_SYS_ADAPTERS += [a for a in SYS_ADAPTERS if a.invariant == "S5" and a.spec_action in ("reserve_owned", "commit_owned")]


# -- S5: a mechanism without VirtualBacking or SharedMapping answers None -------

def _bare_mech_init() -> Any:
    from memspec.spec.mechanism import init

    return init(capacity=12 * PAGE, page=PAGE, virtual_backing=False, shared_mapping=False, ep=True)


def run_bare_mechanism(samples: int, seed: int, inv_samples: int = 0, per_branch: int | None = None,
                       prior: list[AgreementReport] | None = None) -> list[AgreementReport]:
    from memspec.spec.mechanism import MECHANISM

    proofs: dict[str, Proof] = {p.id: p for p in E.PROOFS}
    ads = [a for a in MECH_ADAPTERS if a.invariant == "S5" and a.spec_action.startswith("query_")]
    n = max(20, samples // 8)
    return walk_and_compare(MECHANISM, _bare_mech_init, ads, proofs, n, seed + 4, _mech_too_big,
                            inv_samples=min(inv_samples, n), per_branch=per_branch, prior=prior)


def _extra_bare(n: int, seed: int, inv: int, ids: set[str]) -> list[AgreementReport]:
    return run_bare_mechanism(n, seed, inv) if "S5" in ids else []


EXTRA_WALKS.append(_extra_bare)


# -- S8 / S11: the ledger model ----------------------------------------------
# Every figure is recomputed from the spec's records (grants, tickets, owned
# objects, KV requests, leases, queue entries), except the running totals the
# spec keeps (open_grants, tickets_held, charged_by, live/queued/lease bytes
# by holder), which are projected as they are: the encoding proves them equal
# to the records' sums, and the agreement checks that the spec keeps them so.

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


def _l_zero_mech() -> dict[str, Any]:
    return {"phys": 0, "mcap": 0, "mst": (0, {}), "mb": (0, {}), "PMB": prefix_values([]), "nm": 0,
            "mk": (0, {}), "hrel": (0, {}), "hmaps": (0, {}), "mh": (0, {})}


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

    grants, tickets = sorted(s.grants.items()), sorted(s.tickets.items())
    st = {
        "cap": s.capacity, "free": s.free, "granted": s.granted, "charged": s.charged, "og": s.open_grants,
        "th": s.tickets_held, "page": s.page, "ret": ret,
        "cb": per_holder(s.charged_by), "lb": per_holder(s.live_bytes_by), "qb": per_holder(s.queued_bytes_by),
        "lsb": per_holder(s.lease_bytes),
        "gst": (0, {gx[r]: _GSTATE[g.state] for r, g in grants}), "gb": (0, {gx[r]: g.nbytes for r, g in grants}),
        "PG": prefix_values([g.nbytes if g.state == "open" else 0 for _r, g in grants]), "ng": len(grants),
        "tst": (0, {tx[r]: _TSTATE.get(t.state, 9) for r, t in tickets}), "tb": (0, {tx[r]: t.held for r, t in tickets}),
        "ta": (0, {tx[r]: t.amount for r, t in tickets}),
        "PTP": prefix_values([t.held if t.state == "pending" else 0 for _r, t in tickets]),
        "PTG": prefix_values([0 if t.state == "pending" else t.held for _r, t in tickets]),
        "nt": len(tickets),
        "ist": (0, {i: it[3] for i, it in enumerate(items)}), "ih": (0, {i: it[1] for i, it in enumerate(items)}),
        "ik": (0, {i: it[2] for i, it in enumerate(items)}), "ib": (0, {i: it[4] for i, it in enumerate(items)}),
        "n": len(items), "PLV": keyed(E.I_LIVE), "PQ": keyed(E.I_QUEUED), "PLS": keyed(E.I_LEASE),
        "PC": prefix_values([nb if st_ in (E.I_LIVE, E.I_QUEUED, E.I_LEASE) else 0 for _k, _h, _kd, st_, nb in items]),
        **_l_zero_mech(),
    }
    _l_pad(u)
    return st, u


_L_CMP = ("cap", "free", "granted", "charged", "og", "th", "cb", "lb", "qb", "lsb", "gst", "gb", "tst", "tb")
_L_CMP_ITEMS = _L_CMP + ("ist", "ib")


def _l_expected(s: Any, u: Universe, value: Any) -> Any:
    ret = value if _is_int(value) else getattr(value, "nbytes", 0) if isinstance(value, Grant) else 0
    st, u2 = _l_state(s, ret=ret)
    for k in ("grant", "ticket"):
        if len(u2.idx[k]) >= len(u.idx[k]):
            u.idx[k] = u2.idx[k]
    if len(u2.idx["item"]) >= len(u.idx["item"]):
        u.idx["item"] = u2.idx["item"]
    return flatten(st, E.S11.fields, _L_CMP_ITEMS + ("ret",), u)


def _l_new(u: Universe, kind: str) -> int:
    n = len(u.idx[kind])
    u.idx[kind] = {**u.idx[kind], ("new", n): n}
    return n


def _size(x: Any) -> int:
    return x if _is_int(x) and x > 0 else 0


def _l_reserve_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _l_state(s)
    return st, {"g": _l_new(u, "grant"), "nb": _size(args["nbytes"])}, u


def _l_commit_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _l_state(s)
    ref, actual = args["grant"]
    _l_new(u, "item")
    return st, {"g": u.idx["grant"][ref], "actual": actual}, u


def _l_cancel_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _l_state(s)
    return st, {"g": u.idx["grant"][args["grant"]]}, u


def _l_refund_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _l_state(s)
    return st, {"x": u.idx["item"][(1, args["lease"])]}, u


def _l_alloc_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    from memspec.spec import kernels as K

    size = _size(args["size"])
    st, u = _l_state(s)
    _l_new(u, "item")
    return st, {"size": size, "fp": K.round_up(size, s.page) if size else 0, "oom": taken == "OutOfMemory"}, u


def _l_load_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _l_state(s)
    _l_new(u, "item")
    return st, {"nb": args["weight"][2], "oom": taken == "OutOfMemory"}, u


def _l_commit_owned_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    from memspec.spec.vmm import pages, range_legal

    ref, start, end = args["span"]
    o = s.owned[ref]
    bad = not range_legal(s, o, start, end) or any(p in o.committed for p in pages(s, start, end))
    st, u = _l_state(s)
    return st, {"x": u.idx["item"][(1, ref)], "nb": max(end - start, 1), "bad": bad, "oom": taken == "OutOfMemory"}, u


def _l_kv_grow_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    from memspec.spec import kernels as K

    r, new, fail_at = args["growth"]
    q = s.kv[r]
    st, u = _l_state(s)
    return st, {"x": u.idx["item"][(1, r)], "d": K.round_up(new, s.page) - q.committed, "past": new > q.max_bytes,
                "refuse": taken == "InvalidRequest", "fail": fail_at in (4, 5), "oom": taken == "OutOfMemory"}, u


def _l_drop_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _l_state(s)
    return st, {"x": u.idx["item"][(1, args["allocation"])]}, u


def _l_unload_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _l_state(s)
    return st, {"x": u.idx["item"][(1, s.weights[args["weight"]].owned)]}, u


def _done_seqs(s: Any, pending: Any) -> list[int]:
    """The queued releases the walk's poll runs: those whose fences the spec knows done."""
    from memspec.spec.ep import known_flags

    return [seq for (seq, _f), done in zip(pending, known_flags(s, pending)) if done and seq in s.queue]


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


def _l_claim_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _l_state(s)
    return st, {"t": u.idx["ticket"][args["ticket"]], "g": _l_new(u, "grant")}, u


def _l_ticket_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _l_state(s)
    return st, {"t": u.idx["ticket"][args["ticket"]]}, u


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
    victims = [w for w in s.weights.values() if w.resident and not w.hot][:2] if holder == "weights" else []
    if len(seqs) + len(victims) > 1:
        return None  # several releases: the encoding runs one per step
    if victims:
        return st, {"t": t, "x": u.idx["item"][(1, victims[0].owned)], "mode": 2}, u
    if seqs:
        x = _entry_item(s, u, seqs[0])
        return None if x is None else (st, {"t": t, "x": x, "mode": 1}, u)
    return st, {"t": t, "x": 0, "mode": 0}, u


def _l_reconfigure_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _l_state(s)
    return st, {}, u


_L_RET = ("cancel", "refund_lease", "claim", "cancel_ticket")
#: the ledger projection is the whole Governor state (a few ms a sample, more for an invariant
#: evaluation): S8 / S11 sample 25 adapters, so each takes a share of the run's samples (60 of the
#: default 400) and 10 invariant-agreement states; past its share an adapter still samples every
#: outcome it has seen fewer than ``agreement.RARE`` times, so a rare branch is not lost to the share
_L_WEIGHT, _L_MAX_INV = 0.15, 10


def _l_ad(inv: str, act: str, spec: str, project: Any, items: bool = True, also: tuple[str, ...] = ()) -> Adapter:
    """``items``: compare the charge items too (not where a queued piece leaves the queue)."""
    # commit's GrantDenied (the footprint exceeds the grant by more than is free) needs an almost full
    # ledger: its adapter is not capped and samples its outcomes in equal shares
    rare = act == "commit"
    # kv_grow's InvalidRequest (a growth of nothing refused, which the spec permits) is one draw in
    # ~20: the adapter keeps a larger share so that the walk draws kv_grow often enough to meet it
    weight = 0.375 if act == "kv_grow" else _L_WEIGHT
    return Adapter(inv, act, spec, project, _l_expected,
                   (_L_CMP_ITEMS if items else _L_CMP) + (("ret",) if act in _L_RET else ()), also=also,
                   balance=3 if rare else 0, weight=weight, max_inv_samples=_L_MAX_INV)


_L_SYS = [("reserve", "reserve", _l_reserve_p, True), ("commit", "commit", _l_commit_p, True),
          ("cancel", "cancel", _l_cancel_p, True), ("allocate_owned", "allocate_owned", _l_alloc_p, True),
          ("load_weight", "load_weight", _l_load_p, True)]
_L_SYS11 = [("refund_lease", "refund_lease", _l_refund_p, True),
            ("commit_owned", "commit_owned", _l_commit_owned_p, True), ("kv_grow", "kv_grow", _l_kv_grow_p, True),
            ("drop", "drop", _l_drop_p, True), ("unload_weight", "unload_weight", _l_unload_p, True),
            ("poll", "poll", _l_poll_p, False),
            ("cancel_ticket", "cancel_ticket", _l_ticket_p, True), ("expire", "expire", _l_expire_p, True),
            ("respond", "respond", _l_respond_p, False), ("reconfigure", "reconfigure", _l_reconfigure_p, True)]
# S8's actions are encoded by S11's very steps (one ledger model): each sample counts for both
SYS_ADAPTERS += [_l_ad("S11", a, sa, pr, it, also=("S8",)) for a, sa, pr, it in _L_SYS]
SYS_ADAPTERS += [_l_ad("S11", a, sa, pr, it) for a, sa, pr, it in _L_SYS11]
# claim succeeds only on a granted ticket: sampled on the ticket protocol's walk, where they are common
TICKET_ADAPTERS += [_l_ad("S11", "claim", "claim", _l_claim_p)]
# commit's GrantDenied (the footprint exceeds the grant by more than is free) needs an almost full
# ledger: the walk on a device of two pages reaches it often
SMALL_SYS_ADAPTERS += [a for a in SYS_ADAPTERS if a.invariant == "S11" and a.action == "commit"]


# -- S8 / S11 at the mechanism level: the device's physical bytes --------------

def _l_mech_state(s: Any, ret: int = 0) -> tuple[dict[str, Any], Universe]:
    """The ledger is the system level's (all 0 here); the device holds
    ``physical`` bytes, the sum of what its live objects hold: own live
    allocations (footprint), backing reservations (committed bytes), handles
    not freed, private (copied) mappings."""
    u = Universe()
    objs: list[tuple[Any, int, int, int]] = []
    for r, a in s.allocations.items():
        objs.append((("a", r), E.I_LIVE if (a.live and not a.foreign) else E.I_GONE, 0 if a.foreign else a.footprint,
                     E.M_ALLOC))
    for r, v in s.reservations.items():
        if v.kind == "backing":
            objs.append((("r", r), E.I_LIVE if v.live else E.I_GONE, v.reported, E.M_RES))
    for r, h in s.handles.items():
        objs.append((("h", r), E.I_GONE if h.freed else E.I_LIVE, h.size, E.M_HANDLE))
    for r, m in s.mappings.items():
        objs.append((("m", r), (E.I_LIVE if m.private else E.M_SHARED) if m.live else E.I_GONE, m.size, E.M_MAP))
    objs.sort(key=lambda o: o[0][1])  # by reference: a new object comes last
    ix = u.idx["mitem"] = {o[0]: i for i, o in enumerate(objs)}
    u.idx["holder"] = {h: h for h in E.HOLDERS_H}
    hs = {ix[("h", r)]: h for r, h in s.handles.items()}
    dev = {"mk": (0, {i: o[3] for i, o in enumerate(objs)}),
           "hrel": (0, {i: int(h.released) for i, h in hs.items()}),
           "hmaps": (0, {i: h.mappings for i, h in hs.items()}),
           "mh": (0, {ix[("m", r)]: ix[("h", m.handle)] for r, m in s.mappings.items()})}
    st = {"cap": 0, "free": 0, "granted": 0, "charged": 0, "og": 0, "th": 0, "page": s.page, "ret": ret,
          "cb": (0, {}), "lb": (0, {}), "qb": (0, {}), "lsb": (0, {}), "gst": (0, {}), "gb": (0, {}),
          "PG": prefix_values([]), "ng": 0, "tst": (0, {}), "tb": (0, {}), "ta": (0, {}),
          "nt": 0, "ist": (0, {}), "ih": (0, {}), "ik": (0, {}), "ib": (0, {}), "n": 0, "PTP": prefix_values([]),
          "PTG": prefix_values([]),
          "PLV": {}, "PQ": {}, "PLS": {}, "PC": prefix_values([]),
          "phys": s.physical, "mcap": s.capacity,
          "mst": (0, {i: o[1] for i, o in enumerate(objs)}),
          "mb": (0, {i: o[2] for i, o in enumerate(objs)}),
          "PMB": prefix_values([o[2] if o[1] == E.I_LIVE else 0 for o in objs]), "nm": len(objs), **dev}
    _l_pad(u)
    return st, u


_M_CMP = ("phys", "mst", "mb", "mk", "hrel", "hmaps", "mh")


def _l_mech_expected(s: Any, u: Universe, value: Any) -> Any:
    st, u2 = _l_mech_state(s, ret=value if _is_int(value) else 0)
    if len(u2.idx["mitem"]) >= len(u.idx["mitem"]):
        u.idx["mitem"] = u2.idx["mitem"]
    return flatten(st, E.S11.fields, _M_CMP + ("ret",), u)


def _l_m_alloc_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    from memspec.spec import kernels as K

    from memspec.spec.eager import ALIGNMENT

    size, align = _size(args["size"]), args.get("alignment", ALIGNMENT)
    bad = not (_is_int(align) and align > 0 and align & (align - 1) == 0)
    st, u = _l_mech_state(s)
    _l_new(u, "mitem")
    fp = K.round_up(size, s.page) if size and not bad else 0  # the walk's footprint: the witness's
    return st, {"size": size, "bad_align": bad, "fp": fp, "oom": taken == "OutOfMemory"}, u


def _l_m_dealloc_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _l_mech_state(s)
    return st, {"x": u.idx["mitem"][("a", args["handle"])], "foreign": s.allocations[args["handle"]].foreign}, u


def _l_m_span_p(commit: bool) -> Any:
    """commit_range / decommit_range: ``bad`` is a range the spec refuses for
    a reason other than the handle: misaligned, empty, reversed, past the
    end, a page already (commit) or not (decommit) committed."""
    def project(s: Any, args: dict[str, Any], taken: str) -> Any:
        ref, lo, hi = args["span"]
        r = s.reservations[ref]
        bad = (not _aligned_nonempty(lo, hi, s.page) or hi > r.size
               or _s12_bad(s.page, r.size, r.committed, lo, hi, commit))
        st, u = _l_mech_state(s)
        return st, {"x": u.idx["mitem"][("r", ref)], "nb": max(hi - lo, 1), "foreign": r.foreign, "bad": bad,
                    "oom": taken == "OutOfMemory"}, u
    return project


def _l_m_release_res_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _l_mech_state(s)
    ref = args["reservation"]
    return st, {"x": u.idx["mitem"][("r", ref)], "foreign": s.reservations[ref].foreign}, u


def _l_m_create_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    size = args["size"]
    bad = not _is_int(size) or size <= 0 or size % s.page != 0
    st, u = _l_mech_state(s)
    _l_new(u, "mitem")
    return st, {"size": 0 if bad else size, "bad": bad, "oom": taken == "OutOfMemory"}, u


def _l_m_release_handle_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _l_mech_state(s)
    return st, {"x": u.idx["mitem"][("h", args["handle"])]}, u


def _l_m_mapping_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    """unmap / copy_on_write of ``(mapping, reservation, offset, size)``:
    ``bad``: not its exact size."""
    mref, _res, _off, size = args["mapping"]
    m = s.mappings[mref]
    st, u = _l_mech_state(s)
    return st, {"x": u.idx["mitem"][("m", mref)], "h": u.idx["mitem"][("h", m.handle)],
                "bad": size != m.size,
                "oom": taken == "OutOfMemory"}, u


MECH_ADAPTERS += [
    Adapter("S11", f"m_{name}", name, project, _l_mech_expected, _M_CMP + (("ret",) if ret else ()),
            weight=_L_WEIGHT, max_inv_samples=_L_MAX_INV)
    for name, project, ret in [("commit_range", _l_m_span_p(True), True), ("decommit_range", _l_m_span_p(False), True),
                               ("release_reservation", _l_m_release_res_p, True), ("create", _l_m_create_p, False),
                               ("release_handle", _l_m_release_handle_p, True), ("unmap", _l_m_mapping_p, True),
                               ("copy_on_write", _l_m_mapping_p, True)]
]
MECH_ADAPTERS += [
    # S8's encoding of allocate is S11's (same step, same fields): each sample counts for both
    Adapter("S11", "m_allocate", "allocate", _l_m_alloc_p, _l_mech_expected, _M_CMP, also=("S8",),
            weight=_L_WEIGHT, max_inv_samples=_L_MAX_INV),
    Adapter("S11", "m_deallocate", "deallocate", _l_m_dealloc_p, _l_mech_expected, _M_CMP + ("ret",),
            weight=_L_WEIGHT, max_inv_samples=_L_MAX_INV),
]


# -- S1 (system), S4, S7, S10: the deferred-free queue ------------------------
#
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
    """A :class:`Universe` whose objects are keyed (see :func:`_queue_objects`)."""

    def index(self, keys: list[Any]) -> dict[Any, int]:
        """Dense indices of ``keys``: those known keep theirs, new ones follow."""
        m = dict(self.idx.get("q", {}))
        for k in keys:
            if k not in m:
                m[k] = len(m)
        self.idx["q"] = m
        return m


def _fence_known_done(s: Any, f: int) -> bool:
    stream, item = s.fences[f]
    return s.streams[stream].completed >= item


def _qstate(s: Any, u: QueueUniverse | None = None) -> tuple[dict[str, Any], QueueUniverse]:
    """The S4/S7 fence machine: objects' states, ``use[x][stream]`` the last
    work item of each stream recorded on x, streams' launched/completed."""
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
    for k, i in ix.items():  # a queued decommit that ran is gone from the queue: freed
        if k[0] == "entry" and i not in astate:
            astate[i] = E.FREED
    st = {"astate": (0, astate), "use": use,
          "iss": (0, {sx[r]: x.launched for r, x in s.streams.items()}),
          "done": (0, {sx[r]: x.completed for r, x in s.streams.items()})}
    return st, u


_Q_CMP = ("astate", "use", "iss", "done")


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
    """The fence machine's adapters for ``inv`` (and ``also``: S7 encodes
    every action by the same step as S4, so each sample counts for both)."""
    exp = _keyed_expected(inv, _qstate, _Q_CMP)

    def ad(action: str, spec_action: str, arg: Any, ok_only: bool = False, **kw: Any) -> Adapter:
        return Adapter(inv, action, spec_action, _keyed(_qstate, arg, ok_only), exp, _Q_CMP, also=also,
                       finite=True, **kw)

    obj = lambda key: (lambda s, u, a: {"x": _q_obj(s, u, a[key])})  # noqa: E731
    use = lambda key: (lambda s, u, a: {"x": _q_obj(s, u, a[key]), "st": _stream_ix(u, a["stream"])})  # noqa: E731
    return [
        # allocate_owned's refusals make nothing (S8's and S11's to compare)
        ad("allocate", "allocate_owned", lambda s, u, a: {"x": _new(u)}, ok_only=True),
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
    ]




def _ready(s: Any, u: Any) -> tuple[bool, dict[int, bool]]:
    """Which queued objects have every fence known done (what the EP must
    report done just before ``poll``), from the streams' records."""
    ix = u.idx["q"]
    return (False, {ix[k]: all(_fence_known_done(s, f) for f in fences)
                    for k, code, fences, _c in _queue_objects(s) if code == E.QUEUED})


def _s10_state(s: Any, u: QueueUniverse | None = None) -> tuple[dict[str, Any], QueueUniverse]:
    """S10: every queue object, made in the one provider context (0)."""
    objs = _queue_objects(s)
    u = u if u is not None else QueueUniverse()
    ix = u.index([k for k, *_ in objs])
    astate = {ix[k]: code for k, code, _f, _c in objs}
    for k, i in ix.items():
        if k[0] == "entry" and i not in astate:
            astate[i] = E.FREED
    return {"astate": (0, astate), "actx": (0, {}), "calive": (False, {0: s.registry.context_alive})}, u


def _s1_sys_state(s: Any, u: QueueUniverse | None = None) -> tuple[dict[str, Any], QueueUniverse]:
    """S1 at the system level: every queue object with its creator; a freed
    one was freed by its creator unless the spec recorded a release through
    another mechanism (``misreleased``: then by mechanism -1)."""
    objs = _queue_objects(s)
    u = u if u is not None else QueueUniverse()
    ix = u.index([k for k, *_ in objs])
    astate = {ix[k]: code for k, code, _f, _c in objs}
    amech = {ix[k]: c for k, _code, _f, c in objs}
    for k, i in ix.items():
        if k[0] == "entry" and i not in astate:
            astate[i] = E.FREED
            amech[i] = getattr(u, "creators", {}).get(k, 0)
    u.creators = {**getattr(u, "creators", {}), **{k: c for k, _code, _f, c in objs}}  # type: ignore[attr-defined]
    fmech = {i: (-1 if s.misreleased else amech.get(i, 0)) for i, code in astate.items() if code == E.FREED}
    return {"astate": (0, astate), "amech": (0, amech), "actx": (0, {}), "fmech": (0, fmech), "fctx": (0, {}),
            "inst": s.registry.installed}, u


def _keyed_expected(inv: str, state: Any, cmp: tuple[str, ...]) -> Any:
    fields = E.PROOFS[[p.id for p in E.PROOFS].index(inv)].fields

    def expected(s: Any, u: Any, value: Any) -> Any:
        m = u.idx["q"]
        if ("new", 0) in m:  # the object the step made takes the slot reserved for it
            new = [k for k, *_ in _queue_objects(s) if k not in m]
            if new:  # an error branch made nothing: the slot stays empty
                m[new[-1]] = m.pop(("new", 0))
        st, _ = state(s, u)
        return flatten(st, fields, cmp, u)
    return expected


def _keyed(state: Any, arg: Any, ok_only: bool = False) -> Any:
    def project(s: Any, args: dict[str, Any], taken: str) -> Any:
        if ok_only and taken != "ok":
            return None
        st, u = state(s)
        return st, arg(s, u, args), u
    return project


def _new(u: Any) -> int:
    return u.index([("new", 0)])[("new", 0)]


_S10_CMP = ("astate", "calive")
_S1_SYS_CMP = ("astate", "amech", "fmech", "inst")
_S10_EXP = _keyed_expected("S10", _s10_state, _S10_CMP)
_S1_EXP = _keyed_expected("S1", _s1_sys_state, _S1_SYS_CMP)
_ONE = lambda key: (lambda s, u, a: {"x": _q_obj(s, u, a[key])})  # noqa: E731


def _s10(action: str, spec_action: str, arg: Any, ok_only: bool = False, **kw: Any) -> Adapter:
    return Adapter("S10", action, spec_action, _keyed(_s10_state, arg, ok_only), _S10_EXP, _S10_CMP, finite=True, **kw)


def _s1(action: str, spec_action: str, arg: Any) -> Adapter:
    return Adapter("S1", action, spec_action, _keyed(_s1_sys_state, arg), _S1_EXP, _S1_SYS_CMP, finite=True)


SYS_ADAPTERS += [
    # allocate_owned's refusals make nothing (S8's and S11's to compare)
    _s10("allocate", "allocate_owned", lambda s, u, a: {"x": _new(u), "c": 0}, ok_only=True),
    _s10("drop", "drop", _ONE("allocation")),
    _s10("close", "close_owned", _ONE("reservation")),
    _s10("close", "kv_close", _ONE("request")),
    _s10("decommit", "decommit_owned", lambda s, u, a: {"x": _q_obj(s, u, a["span"][0]), "y": _new(u),
                                                        "bad": _decommit_bad(s, a["span"])},
         balance=2, helpers=_DECOMMIT_HELPERS),
    _s10("poll", "poll", lambda s, u, a: {"ready": _ready(s, u)}),
    _s10("destroy_context", "destroy_context", lambda s, u, a: {"c": 0}),
    _s1("select", "select", lambda s, u, a: {"m": a["mechanism"]}),
    _s1("poll", "poll", lambda s, u, a: {"ready": _ready(s, u)}),
]

MECH_ADAPTERS += [
    Adapter("S1", "release", "deallocate", _s1_project, _s1_expected, _S1_CMP),
    Adapter("S1", "allocate", "allocate", _s1_alloc_project(False), _s1_expected, _S1_CMP),
    Adapter("S1", "allocate", "allocate_foreign", _s1_alloc_project(True), _s1_expected, _S1_CMP),
]
SYS_ADAPTERS += _q_adapters("S4", also=("S7",))


# -- S6: tickets answered by the holders that choose their own victims ---------

def _s6_state(s: Any) -> tuple[dict[str, Any], Universe]:
    u = Universe()
    wx = u.add("weight", s.weights)
    tx = u.add("ticket", s.tickets)
    ws, ts = s.weights, sorted(s.tickets.items())
    st = {
        "res": (False, {wx[n]: w.resident for n, w in ws.items()}),
        "hot": (False, {wx[n]: w.hot for n, w in ws.items()}),
        "wb": (0, {wx[n]: w.pages * s.page for n, w in ws.items()}),
        "tstate": (0, {tx[r]: _TSTATE.get(t.state, 9) for r, t in ts}),
        "held": (0, {tx[r]: t.held for r, t in ts}), "amount": (0, {tx[r]: t.amount for r, t in ts}),
        "gov_ev": s.governor_evictions, "hot_ev": s.hot_evictions, "over": s.overclaims,
    }
    return st, u


_S6_CMP = ("res", "hot", "tstate", "held", "amount", "gov_ev", "hot_ev", "over")


def _s6_expected(s: Any, u: Universe, value: Any) -> Any:
    st, u2 = _s6_state(s)
    _adopt(u, u2)
    return flatten(st, E.S6.fields, _S6_CMP, u)


def _s6_issue_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s6_state(s)
    return st, {"t": _new_slot(u, "ticket"), "n": _size(args["request"][0])}, u


def _s6_set_hot_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    st, u = _s6_state(s)
    return st, {"w": u.idx["weight"][args["weight"]], "h": bool(args["hot"])}, u


def _s6_respond_p(s: Any, args: dict[str, Any], taken: str) -> Any:
    """The walk's answer (respond's witness): ModelResidency's first two cold
    resident weights; KvPageStore 0, with what its own done releases refund."""
    t_ref, holder, terminal = args["answer"]
    st, u = _s6_state(s)
    a = {"t": u.idx["ticket"][t_ref], "holder": E.H_WEIGHTS if holder == "weights" else E.H_KV, "nv": 0,
         "v1": 0, "v2": 0, "r": 0, "refunded": 0}
    if terminal or taken != "ok":
        return st, a, u
    if holder == "weights":
        cold = [n for n, w in s.weights.items() if w.resident and not w.hot][:2]
        a["nv"] = len(cold)
        for k, n in zip(("v1", "v2"), cold):
            a[k] = u.idx["weight"][n]
    else:
        done = set(_done_seqs(s, args["pending"]))
        a["refunded"] = sum(e.refund.get("kv", 0) for q, e in s.queue.items() if q in done)
    return st, a, u


SYS_ADAPTERS += [
    Adapter("S6", "issue_ticket", "issue_ticket", _s6_issue_p, _s6_expected, _S6_CMP),
    Adapter("S6", "set_hot", "set_hot", _s6_set_hot_p, _s6_expected, _S6_CMP),
    Adapter("S6", "respond", "respond", _s6_respond_p, _s6_expected, _S6_CMP),
]
