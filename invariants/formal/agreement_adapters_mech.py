"""Agreement adapters of the mechanism level (spec/mechanism.py MECHANISM): the first
part of :mod:`memspec.invariants.formal.agreement_adapters` (which assembles them; import
from there).

the queue machine's device level (S1, S4, S7, S10, S14: the creations and releases
of allocations, reservations and handles), the VMM machine (S5, S12, S13: VirtualBacking, the mechanism's
reservations, SharedMapping); :data:`MECH_ADAPTERS` (extended in :mod:`.agreement_adapters` by the
ledger model's and the queue's adapters) and the helpers every level shares.
"""

from __future__ import annotations

from typing import Any

from memspec.invariants.formal import proofs_seed000 as E
from memspec.invariants.formal.agreement import Adapter, Universe, flatten
from memspec.invariants.formal.proofs import ARR, BARR, BOOL, CODE, INT, prefix_values


UMAX = 6  # objects of one kind in a sampled state (the walk restarts beyond)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _new_slot(u: Universe, kind: str) -> int:
    n = len(u.idx[kind])
    u.idx[kind] = {**u.idx[kind], -1 - n: n}
    return n


def _adopt(u: Universe, u2: Universe, kinds: Any = None) -> None:
    """The post-state's indices (of the object ``kinds``, default all) where they are no fewer."""
    for k, m in u2.idx.items():
        if (kinds is None or k in kinds) and len(m) >= len(u.idx.get(k, {})):
            u.idx[k] = m


def _ret(value: Any) -> dict[str, Any]:
    """The value a step returns, as the encodings' ``ret`` (0 for anything but an int)."""
    return {"ret": value if _is_int(value) else 0}


def _expected(state_fn: Any, fields: Any, cmp: tuple[str, ...], adopt: bool = True, value: Any = None) -> Any:
    """The expected post-state of an adapter: ``state_fn``'s projection of the
    spec's post-state (with ``value(v)``'s keywords: what the step returned, as
    the projection records it), its fields ``cmp`` flattened (the new objects'
    indices adopted into the step's universe unless ``adopt`` is false; those of
    the kinds ``adopt`` names if it is a tuple)."""
    def expected(s: Any, u: Universe, v: Any) -> Any:
        st, u2 = state_fn(s, **(value(v) if value is not None else {}))
        if adopt:
            _adopt(u, u2, None if adopt is True else adopt)
        return flatten(st, fields, cmp, u)
    return expected


def _project(state_fn: Any, args_fn: Any) -> Any:
    """An adapter's projection: one state record's projection (``state_fn``)
    with one action's arguments (``args_fn(s, u, args, taken)``), shared by
    every invariant that projects that record or encodes that action."""
    def project(s: Any, args: dict[str, Any], taken: str) -> Any:
        st, u = state_fn(s)
        a = args_fn(s, u, args, taken)
        return None if a is None else (st, a, u)  # None: not a sample the encoding runs
    return project


def _reserve_args(s: Any, u: Universe, args: dict[str, Any], taken: str) -> dict[str, Any]:
    """reserve / reserve_owned: a new reservation slot, its page-rounded size (one page when not a size)."""
    from memspec.spec import kernels as K

    bad = _not_size(args["size"])
    return {"r": _new_slot(u, "res"), "n": s.page if bad else K.round_up(args["size"], s.page), "bad": bad,
            "oom": taken == "OutOfMemory"}


def _owned_span_args(commit: bool) -> Any:
    """commit_owned / decommit_owned: the owned reservation's span, refused for a reason other than
    S12's guard."""
    def args_fn(s: Any, u: Universe, args: dict[str, Any], taken: str) -> dict[str, Any]:
        ref, lo, hi = args["span"]
        o = s.owned[ref]
        return {"r": u.idx["res"][ref], "lo": lo, "hi": hi, "oom": taken == "OutOfMemory",
                "bad": _s12_bad(s.page, o.size, o.committed, lo, hi, commit)}
    return args_fn


# ==========================================================================
# Mechanism level (spec/mechanism.py MECHANISM)
# ==========================================================================

def _mech_init() -> Any:
    """The mechanism walk's initial state (:data:`memspec.invariants.formal.walks.WALKS`)."""
    from memspec.invariants.formal.walks import BY_NAME, start

    return start(BY_NAME["mechanism"])


def _mech_too_big(s: Any) -> bool:
    return (len(s.allocations) > UMAX or sum(1 for r in s.reservations.values() if r.kind == "backing") > UMAX
            or len(s.handles) > UMAX or len(s.mappings) > UMAX)


# -- the queue machine's device level (S1, S4, S7, S10, S14): its creations and releases --

def _q_mech_state(s: Any) -> tuple[dict[str, Any], Universe]:
    """Mechanism level, on the queue machine: every object with an identity
    (allocations, reservations, physical handles; own or foreign) the device's
    own (``dev``), renumbered densely in creation order (the identity of
    object ``i`` is ``i``: a new one takes the next); made by the
    mechanism under test (0) or by its twin (1, a foreign handle) in the one
    context (0); every freed one was freed by its creator unless the spec
    recorded a foreign free (then: by mechanism -1); the own allocations'
    addresses (the spec's ``by_address``).  No stream, no queue."""
    u = Universe()
    objs: dict[int, Any] = {**s.allocations, **s.reservations, **s.handles}
    ix = u.add("obj", objs)

    def live(r: int) -> bool:
        return (not objs[r].released) if r in s.handles else objs[r].live

    foreign = {r: bool(getattr(o, "foreign", False)) for r, o in objs.items()}
    st = {
        "astate": (0, {ix[r]: (E.LIVE if live(r) else E.FREED) for r in objs}),
        "amech": (0, {ix[r]: (1 if foreign[r] else 0) for r in objs}),
        "actx": (0, {}), "fctx": (0, {}), "inst": 0,
        "fmech": (0, {ix[r]: (-1 if s.foreign_frees else 1 if foreign[r] else 0) for r in objs if not live(r)}),
        "dev": (False, {ix[r]: True for r in objs}),
        "use": {}, "iss": (0, {}), "done": (0, {}), "calive": (False, {0: True}),
        "addr": (E.NOADDR, {ix[r]: a.address for r, a in s.allocations.items() if not a.foreign}),
        "byaddr": (E.NOADDR, {addr: ix[r] for addr, r in s.by_address.items()}),
    }
    return st, u


#: what the device level's adapters compare (not the address map: a new allocation's address is the
#: witness's, picked after the step)
_Q_MECH_CMP = ("astate", "amech", "fmech", "fctx", "inst", "dev")
_q_mech_expected = _expected(_q_mech_state, E.S4.fields, _Q_MECH_CMP)
def _q_mech_alloc_project(foreign: bool = False, addressed: bool = False) -> Any:
    """A creation by the mechanism (``foreign``: its twin): a new object, the device's own; an own
    allocation at a fresh address no live allocation owns (the spec's witness picks it after this step).
    A refused creation makes nothing: no record to compare (its accounting is S8's and S11's)."""
    def args(s: Any, u: Universe, a: dict[str, Any], taken: str) -> Any:
        ad = max([0] + [k + 1 for k in s.by_address]) if addressed else E.NOADDR
        return None if taken != "ok" else {"x": _new_slot(u, "obj"), "m": 1 if foreign else 0, "c": 0, "dev": True,
                                           "ad": ad}
    return _project(_q_mech_state, args)


def _q_mech_release_project(handle: str) -> Any:
    """deallocate (its ``handle``), release_reservation, free_shared_reservation (their ``reservation``;
    still mapped: ``bad``) through the mechanism under test."""
    def args(s: Any, u: Universe, a: dict[str, Any], taken: str) -> Any:
        out = {"x": u.idx["obj"][a[handle]], "m": 0, "c": 0}
        if handle == "reservation" and s.reservations[a[handle]].kind == "shared":
            r = s.reservations[a[handle]]
            out["bad"] = r.live and bool(r.backed)
        return out
    return _project(_q_mech_state, args)


def _q_mech(row: str, spec_action: str, project: Any, also: tuple[str, ...]) -> Adapter:
    action = {"deallocate": "release", "release_reservation": "release"}.get(spec_action, spec_action)
    action = "allocate" if action in ("allocate_foreign", "create", "reserve", "shared_reserve") else action
    return Adapter(row, action, spec_action, project, _q_mech_expected, _Q_MECH_CMP, also=also)


#: the rows on S4's queue machine that claim the device level's allocate and deallocate
_ON_QUEUE = ("S1", "S7", "S10", "S14")


def _not_size(x: Any) -> bool:
    return not (isinstance(x, int) and not isinstance(x, bool) and x > 0)


# -- the VMM machine (S5, S12, S13): VirtualBacking and SharedMapping -------

def _empty(fields: dict[str, str], **given: Any) -> dict[str, Any]:
    """A projected state of an encoding's ``fields`` with nothing in its records (0, False, no entry):
    what a level does not have (the system level's records at the mechanism level, and back), but
    the fields ``given``."""
    none = {INT: 0, BOOL: False, ARR: (0, {}), BARR: (False, {})}  # a two-level array: no row
    return {f: given.get(f, none.get(k, {})) for f, k in fields.items()}


def _shm_record(s: Any, hx: dict[int, int], mx: dict[int, int]) -> dict[str, Any]:
    """SharedMapping's record, one projection for both machines that encode it (the VMM machine, S11's
    ledger model): the handles and mappings at the dense indices ``hx`` / ``mx`` each gives them, and
    the device's figures they are counted against."""
    hs, ms = s.handles, s.mappings
    return {
        "physical": s.physical, "capacity": s.capacity, "foreign": s.foreign_bytes,
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
    }


def _res_record(s: Any, res: dict[int, Any], ix: dict[int, int]) -> dict[str, Any]:
    """The mechanism's reservations ``res`` at the dense indices ``ix``: one projection for both machines
    that encode them (the VMM machine, S11's ledger model)."""
    return {"rlive": (False, {ix[r]: v.live for r, v in res.items()}),
            "rforeign": (False, {ix[r]: v.foreign for r, v in res.items()}),
            "rsize": (0, {ix[r]: v.size for r, v in res.items()}), "pc": {ix[r]: set(v.committed) for r, v in res.items()},
            "reported": (0, {ix[r]: v.reported for r, v in res.items()})}


def _vmm_state(s: Any, ret: int = 0, answer: int = 0) -> tuple[dict[str, Any], Universe]:
    """The VMM machine (S5, S12, S13) at the mechanism level: its reservations (VirtualBacking and
    shared ones), physical handles and their mappings."""
    u = Universe()
    res = {r: v for r, v in s.reservations.items() if v.kind in ("backing", "shared")}
    ix = u.add("res", res)
    hx = u.add("handle", s.handles)
    mx = u.add("mapping", s.mappings)
    u.pages = max([v.size // s.page for v in res.values()] + [0]) + 2
    hs, ms = s.handles, s.mappings
    st = {
        **_empty(E.S5.fields, korig=(-1, {})),
        "cap": s.virtual_backing, "scap": s.shared_mapping, "page": s.page, **_shm_record(s, hx, mx),
        "eager": s.eager_bytes, "shared": s.shared_bytes,
        "private": s.private_bytes, "ctot": s.committed_bytes, "absent": s.absent_answered,
        "rowrites": s.readonly_writes, "answer": answer, "ret": ret, "nextva": s.w_next_address,
        **_res_record(s, res, ix),
        # S12: a mechanism reservation's address is the one it was reserved at
        "base": (0, {ix[r]: v.address for r, v in res.items()}), "base0": (0, {ix[r]: v.address for r, v in res.items()}),
        "nm": len(ms),
        "PM": {hx[h]: prefix_values([1 if (m.live and not m.private and m.handle == h) else 0
                                     for _r, m in sorted(ms.items())]) for h in hs},
    }
    return st, u


#: what the mechanism-level adapters of the VMM machine compare: the figures and the reservations
#: (S5's, with S12's bases) on a reservation's action, the figures and the handles and mappings (S13's)
#: on a handle's or a mapping's, all of them on the actions S5 and S13 encoded before they shared the machine
_FIGURES = ("cap", "physical", "eager", "shared", "private", "ctot", "absent", "rowrites", "rlive")
_RES_CMP = _FIGURES + ("rforeign", "rsize", "pc", "reported", "base", "base0")
_SHM_CMP = _FIGURES + ("hexists", "hsize", "hreleased", "hmaps", "hfreed", "mlive", "mh", "msize", "mro", "mpriv")
_VMM_CMP = _RES_CMP + _SHM_CMP[len(_FIGURES):]
#: the rows proved on S5's VMM machine besides S5: each sample is theirs too
_ON_VMM = ("S12", "S13")
#: invariant-agreement states per adapter of the VMM machine: three rows compare the invariants (and
#: their perturbed copies) on each, over 23 adapters -- about as many per row as S5 (16 adapters), S12
#: (7) and S13 (10) had on their own machines, within ``memspec prove``'s time
_VMM_MAX_INV = 50


def _vmm_expected(cmp: tuple[str, ...]) -> Any:
    """The post-state's projection, its fields ``cmp`` (what the step returned as ``ret``); the objects a
    step made get the next dense indices, as in the projection."""
    def expected(s: Any, u: Universe, value: Any) -> Any:
        st, u2 = _vmm_state(s, ret=value if _is_int(value) else 0)
        _adopt(u, u2)
        u.pages = max(u.pages, u2.pages)
        return flatten(st, E.S5.fields, cmp, u)
    return expected


#: commit_range's / decommit_range's and committed_bytes' / release_reservation's arguments on either machine
_span_args = lambda s, u, a, taken: {  # noqa: E731
    "r": u.idx["res"][a["span"][0]], "lo": a["span"][1], "hi": a["span"][2], "oom": taken == "OutOfMemory"}
_res_args = lambda s, u, a, taken: (  # noqa: E731
    {"r": u.idx["res"][a["reservation"]]} if a["reservation"] in u.idx["res"] else None)
_s5_span_project = _project(_vmm_state, _span_args)
_s5_release_project = _project(_vmm_state, _res_args)


_s5_reserve_project = _project(_vmm_state, _reserve_args)


_s5_query_project = _project(_vmm_state, lambda s, u, a, taken: {})


_s5_query_expected = _expected(_vmm_state, E.S5.fields, _RES_CMP + ("answer",), adopt=False,
                               value=lambda v: {"answer": 0 if v is None else 1})


def _s5_device_d(s: Any, action: str, args: dict[str, Any]) -> int:
    """The physical bytes a successful ``action`` moves (the walk's witness:
    an allocation's footprint is its page-rounded size), read off the records."""
    from memspec.spec import kernels as K

    if action == "allocate":
        return K.round_up(args["size"], s.page)
    return -s.allocations[args["handle"]].footprint


_S5_ONE_OF = {"StaleHandle": "DoubleFree"}


def _s5_device_project(action: str) -> Any:
    return _project(_vmm_state, lambda s, u, a, taken: {"d": _s5_device_d(s, action, a) if taken == "ok" else 0,
                                                        "code": CODE[_S5_ONE_OF.get(taken, taken)]})


def _misplaced(s: Any, ref: int, off: int, size: int) -> bool:
    """A map that does not fit: misaligned, past the end, or over a backed page."""
    r = s.reservations[ref]
    if off % s.page or off + size > r.size or off < 0:
        return True
    return any(p in r.backed for p in range(off // s.page, (off + size) // s.page))


def _shm_create_args(kind: str) -> Any:
    """create's arguments on either machine: the new handle's slot, the next object of ``kind`` (a
    handle; the ledger model's: a device object)."""
    def args_fn(s: Any, u: Universe, args: dict[str, Any], taken: str) -> Any:
        if not _is_int(args["size"]):
            return None  # a non-int size: the spec's InvalidRequest, not an arithmetic case
        return {"h": _new_slot(u, kind), "n": args["size"], "oom": taken == "OutOfMemory"}
    return args_fn


#: unmap's / copy_on_write's and release_handle's / mapping_count's arguments on either machine
_shm_mapping_args = lambda s, u, a, taken: {  # noqa: E731
    "m": u.idx["mapping"][a["mapping"][0]], "size": a["mapping"][3], "oom": taken == "OutOfMemory"}
_shm_handle_args = lambda s, u, a, taken: {"h": u.idx["handle"][a["handle"]]}  # noqa: E731


def _s13_map_args(s: Any, u: Universe, args: dict[str, Any], taken: str) -> dict[str, Any]:
    h = s.handles[args["handle"]]
    ref, off = args["place"]
    u.idx["mapping"] = {**u.idx["mapping"], -1: len(u.idx["mapping"])}
    return {"m": len(s.mappings), "h": u.idx["handle"][args["handle"]], "ro": args["read_only"],
            "r": u.idx["res"][ref], "bad": _misplaced(s, ref, off, h.size)}


_s13_mapping_project = _project(_vmm_state, _shm_mapping_args)
_s13_handle_project = _project(_vmm_state, _shm_handle_args)
_s13_write_project = _project(_vmm_state, lambda s, u, a, taken: {"m": u.idx["mapping"][a["mapping"][0]]})
_s13_free_res_project = _project(_vmm_state, lambda s, u, a, taken: {
    "r": u.idx["res"][a["reservation"]], "mapped": bool(s.reservations[a["reservation"]].backed)})


def _vmm(action: str, spec_action: str, project: Any, cmp: tuple[str, ...], ret: bool = True) -> Adapter:
    """An adapter of the VMM machine: S5's, each sample credited to S12 and S13 too."""
    cmp = cmp + (("ret",) if ret else ())
    return Adapter("S5", action, spec_action, project, _vmm_expected(cmp), cmp, also=_ON_VMM,
                   max_inv_samples=_VMM_MAX_INV)


MECH_ADAPTERS = [
    # the device level on the queue machine: S4's allocate and deallocate credited to its four other rows,
    # the twin's allocate not to S14 (a gap), the reservations' and handles' creations and releases S14's
    # (free_shared_reservation: an action of its own, no foreign shared reservation exists)
    _q_mech("S4", "deallocate", _q_mech_release_project("handle"), _ON_QUEUE),
    _q_mech("S4", "allocate", _q_mech_alloc_project(addressed=True), _ON_QUEUE),
    _q_mech("S4", "allocate_foreign", _q_mech_alloc_project(foreign=True), _ON_QUEUE[:-1]),
    *[_q_mech("S14", n, _q_mech_alloc_project(), ()) for n in ("create", "reserve", "shared_reserve")],
    _q_mech("S14", "release_reservation", _q_mech_release_project("reservation"), ()),
    # S14's; its samples witness the hypotheses of the action on every row of the machine
    _q_mech("S4", "free_shared_reservation", _q_mech_release_project("reservation"), _ON_QUEUE),
] + [
    _vmm(f"m_{n}", n, _s5_device_project(n), _RES_CMP, ret=False) for n in ("allocate", "deallocate")
] + [
    Adapter("S5", n, n, _s5_query_project, _s5_query_expected, _RES_CMP + ("answer",), also=_ON_VMM,
            max_inv_samples=_VMM_MAX_INV)
    for n in ("query_virtual_backing", "query_shared_mapping")
] + [
    _vmm("reserve", "reserve", _s5_reserve_project, _RES_CMP, ret=False),
    _vmm("committed_bytes", "committed_bytes", _s5_release_project, _RES_CMP),
    _vmm("commit_range", "commit_range", _s5_span_project, _RES_CMP),
    _vmm("decommit_range", "decommit_range", _s5_span_project, _RES_CMP),
    _vmm("release_reservation", "release_reservation", _s5_release_project, _RES_CMP),
    _vmm("create", "create", _project(_vmm_state, _shm_create_args("handle")), _VMM_CMP, ret=False),
    _vmm("map", "map", _project(_vmm_state, _s13_map_args), _SHM_CMP),
    _vmm("unmap", "unmap", _s13_mapping_project, _VMM_CMP),
    _vmm("copy_on_write", "copy_on_write", _s13_mapping_project, _VMM_CMP),
    _vmm("release_handle", "release_handle", _s13_handle_project, _VMM_CMP),
    _vmm("write_through", "write_through", _s13_write_project, _SHM_CMP, ret=False),
    _vmm("mapping_count", "mapping_count", _s13_handle_project, _SHM_CMP),
    _vmm("free_shared_reservation", "free_shared_reservation", _s13_free_res_project, _SHM_CMP, ret=False),
]


# -- the reservation ranges the VMM machine refuses for a reason of its own ------------

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
