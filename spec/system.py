"""SYSTEM: the executable spec of seed 000's roles wired together.

Seed 000, in one sentence: *Allocator answers "how to obtain ordinary
memory", VirtualBacking answers "when to install real memory behind an
address", and SharedMapping answers "how multiple addresses share physical
memory"; the Governor keeps the accounts, the Holder chooses what to evict,
the EP keeps device operations correctly ordered, and the
ProcessMemoryManager wires these roles together safely.*

=======================  ===============================================
ProcessMemoryManager     registry, selection, capabilities (``manager``), context pins (``context``)
Governor / Authority     ledger, grants, leases, pressure tickets (``governor``)
MemoryBinding            the allocation transaction (``manager``), reservations (``vmm``)
Execution Provider       streams, fences, deferred-free queue (``ep``)
Holders                  ModelResidency, KvPageStore (``holders``)
=======================  ===============================================

``SYSTEM.init(capacity=, page=, virtual_backing=, shared_mapping=)`` makes
the state: the Governor's capacity equals the device's, mechanism ``[0]``
(the target, with the given capabilities) is installed, mechanism ``[1]`` is
eager only.  ``perform(sut, **args)`` receives a ``SystemUnderTest``.

Driving it: draw an action's arguments from the state, call ``step`` for
the permitted outcomes and ``perform`` on the implementation, find the
branch that matches the answer (``Outcomes.match``) and call its ``then``.
When ``then`` returns an int, that is a fresh reference id: bind the value
``perform`` returned to it (a :class:`~memspec.spec.state.Seen` wraps the
implementation object in ``obj`` and the figures of the answer, already in
the spec's vocabulary, in ``facts``); later ``perform`` calls get it back
through ``sut.ref(id)``.  A KV request's reference id ``r`` is named
``f"kv{r}"`` in the implementation.  Holders are spec names (``session``,
``weights``, ``kv``); ``perform`` maps them to the implementation's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from memspec.spec import context, ep, governor, holders, manager, vmm
from memspec.spec.api import DeviceAllocation, VirtualAllocation
from memspec.spec.core import DataRegion, Machine, Observation, global_figure
from memspec.spec.invariants import ALL
from memspec.spec.state import Registry, Seen, SysState


def init(*, capacity: int, page: int, virtual_backing: bool, shared_mapping: bool, ep: bool = True,
         device_capacity: int | None = None, geometry: Any = None, replacement_geometry: Any = None) -> SysState:
    """Nothing allocated, nothing granted: ``free == capacity`` (the
    Governor's capacity); the target mechanism installed; ModelResidency's
    four weights not loaded.  ``device_capacity`` (default ``capacity``) is
    the device's physical size, when a harness gives the Governor more
    budget than the device has (so the device, not the budget, refuses)."""
    if capacity <= 0 or page <= 0 or capacity % page:
        raise ValueError(f"capacity ({capacity}) must be a positive multiple of page ({page})")
    reg = Registry(capabilities=[(bool(virtual_backing), bool(shared_mapping)), (False, False)])
    s = SysState(capacity, page, bool(virtual_backing), bool(shared_mapping), reg, free=capacity,
                 device_capacity=capacity if device_capacity is None else int(device_capacity))
    s.geometry = geometry   # the target mechanism's declared AllocatorGeometry (None: memspec's own, strict)
    # the replacement mechanism's (the target's own twin: its geometry; the reference's: None, page-rounded)
    s.replacement_geometry = replacement_geometry
    holders.init_holders(s)
    return s


class AtLeast:
    """An expected figure known only from below (a KV request's release may
    be queued in several pieces)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int) and other >= self.n

    def __repr__(self) -> str:
        return f">= {self.n}"


def _expected_pending(s: SysState, _ref: Any) -> Any:
    n = len(s.queue)
    return AtLeast(n) if s.inexact_entries else n


#: a global figure, read after every step
_always = global_figure


def _touched_kv(s: SysState, touched: tuple[int, ...]) -> list[int]:
    return [r for r in touched if r in s.kv and s.kv[r].state == "open"]


def _changed_tickets(s: SysState, _touched: tuple[int, ...]) -> list[int]:
    """The tickets whose state or held bytes the step changed in the spec
    (a claim, a cancel, a time-out, a holder's answer)."""
    seen = s.__dict__.setdefault("_observed_tickets", {})
    out = []
    for r in s.ticket_refs:
        t = s.tickets[r]
        now = (t.state, t.held)
        if seen.get(r) != now:
            seen[r] = now
            out.append(r)
    return out


def _ticket_figures(t: Any) -> tuple:
    return (t.state, t.held)


def _touched_reservations(s: SysState, touched: tuple[int, ...]) -> list[int]:
    return [r for r in touched if r in s.owned and s.owned[r].kind == "reservation" and s.owned[r].state == "live"]


OBSERVATIONS = [
    Observation("governor.free", "S11", _always, lambda s, _r: s.free, lambda sut, _r: sut.governor.free()),
    Observation("governor.granted", "S8", _always, lambda s, _r: s.granted, lambda sut, _r: sut.governor.granted()),
    Observation("governor.charged(session)", "S8", _always, lambda s, _r: s.charged_by.get(governor.SESSION, 0),
                lambda sut, _r: sut.governor.charged(governor.SESSION)),
    Observation("governor.charged(weights)", "S8", _always, lambda s, _r: s.charged_by.get(governor.WEIGHTS, 0),
                lambda sut, _r: sut.governor.charged(sut.weights.name)),
    Observation("governor.charged(kv)", "S9", _always, lambda s, _r: s.charged_by.get(governor.KV, 0),
                lambda sut, _r: sut.governor.charged(sut.kv.name)),
    Observation("ep.pending_releases", "S7", _always, _expected_pending, lambda sut, _r: sut.ep.pending_releases()),
    Observation("manager.pins > 0", "S10", _always, lambda s, _r: context.pins(s) > 0,
                lambda sut, _r: sut.manager.pins(sut.context_id) > 0),
    Observation("weights.resident_bytes", "S6", _always,
                lambda s, _r: sum(holders.weight_footprint(s, w) for w in s.weights.values() if w.resident),
                lambda sut, _r: sut.weights.resident_bytes()),
    # The Ticket the Governor issued is the live record of the request
    # (``Ticket.state``, ``Ticket.held``): *terminal tickets hold 0*.
    Observation("ticket (state, held)", "S15", _changed_tickets,
                lambda s, r: _ticket_figures(s.tickets[r]), lambda sut, r: _ticket_figures(sut.ref(r))),
    Observation("kv.committed", "S9", _touched_kv, lambda s, r: s.kv[r].committed,
                lambda sut, r: sut.kv.committed(holders.kv_name(r)), requires=("virtual_backing",)),
    Observation("reservation.committed", "S12", _touched_reservations,
                lambda s, r: len(s.owned[r].committed) * s.page, lambda sut, r: vmm.reservation_of(sut, r).committed(),
                requires=("virtual_backing",)),
]


def regions(s: SysState, ref: int, obj: Any) -> DataRegion | None:
    """An owning allocation (``OwningAllocation.allocation``) and the
    committed pages of an owning reservation made by the target's own
    mechanism, while the spec says they are live or their release is queued
    behind a fence (the extra mechanism may live where the EP cannot copy).

    Blame: live -- a fault is S5 (backing that was never installed), a
    changed byte S11 (bytes counted twice); queued -- either is S4 (*backing
    is released only after every fence of work that used it has completed*).
    """
    q = s.kv.get(ref)
    if q is not None:
        return _kv_region(s, ref, q)
    rec = s.owned.get(ref)
    if rec is not None and rec.kind == "weight":
        return _weight_region(s, ref, rec)
    if rec is None or rec.state not in ("live", "queued") or getattr(rec, "creator", 0) != 0:
        return None
    inner = getattr(obj, "allocation", None)
    fault, mismatch = ("S5", "S11") if rec.state == "live" else ("S4", "S4")
    if rec.kind == "allocation" and isinstance(inner, DeviceAllocation):
        return DataRegion(fault, mismatch, extent=(inner.address, inner.size), page=s.page)
    if rec.kind == "reservation" and isinstance(inner, VirtualAllocation) and rec.committed:
        return DataRegion(fault, mismatch, pages=(inner.address, rec.committed, s.page))
    return None


def _holder_address(holder: Any, name: str) -> int | None:
    """``holder.address(name)`` when the holder reports where its memory is
    (an optional method of the contract), else ``None``."""
    fn = getattr(holder, "address", None)
    return fn(name) if callable(fn) else None


def _weight_region(s: SysState, ref: int, rec: Any) -> DataRegion | None:
    """A resident weight: *ModelResidency* holds its bytes until it is
    unloaded or released under pressure.  Its memory is named by the weight
    (``weights.address(name)``), so the bytes are keyed by the weight's load
    (``("weight", ref)``): wherever the holder keeps it, it reads back what
    was written.  A fault is S5, changed bytes S6 (*only the holder
    understands the data*: it must keep it)."""
    w = next((w for w in s.weights.values() if w.owned == ref), None)
    if w is None or not w.resident or rec.state != "live" or getattr(rec, "creator", 0) != 0:
        return None
    name = w.name
    return DataRegion("S5", "S6", extent=(0, w.pages * s.page), page=s.page, alias=(("weight", ref), 0),
                      locate=lambda sut: _holder_address(sut.weights, name))


def _kv_region(s: SysState, ref: int, q: Any) -> DataRegion | None:
    """An open KV request's committed pages, at ``kv.address(name)``.  A
    request's own pages are the bytes of key ``("kv", ref)``; a sharer's
    first ``prefix`` bytes are *the same batch of prefix physical pages* as
    its origin's, mapped read-only: key ``("kv", origin)`` (a write there
    must be refused, the bytes read the same through both).  After growth
    the earlier pages keep their bytes (*keep the old KV view*): a fault is
    S5, a changed byte S9.  An origin whose prefix was ever shared is only
    read (its prefix pages are read-only from then on); a sharer's pages
    past its prefix are not checked."""
    if q.state != "open" or q.creator != 0:
        return None
    name = q.name
    locate = lambda sut: _holder_address(sut.kv, name)  # noqa: E731
    if q.prefix_of is not None:
        if q.prefix <= 0:
            return None
        return DataRegion("S5", "S13", extent=(0, q.prefix), page=s.page, alias=(("kv", q.prefix_of), 0),
                          writable=False, locate=locate)
    if q.own <= 0:
        return None
    return DataRegion("S5", "S9", extent=(0, q.own), page=s.page, alias=(("kv", ref), 0),
                      writable=True if q.shared_upto == 0 else None, locate=locate)


def unwrap(value: Any) -> Any:
    """A :class:`Seen` answer binds the implementation object it wraps."""
    return value.obj if isinstance(value, Seen) else value


#: Actions that run device work on the target's memory (a stand-in kernel
#: reading and writing an allocation): only an EP of the target's own
#: reaches that memory, so without one they are not drawn (N/A, "ep").
_KERNELS_ON_TARGET_MEMORY = ("use", "use_owned", "kv_use")


def _needs_target_ep(actions: list) -> list:
    return [replace(a, requires=a.requires + ("ep",)) if a.name in _KERNELS_ON_TARGET_MEMORY else a
            for a in actions]


#: Budget for protocols whose accepting branch lies several steps deep: a
#: ``claim`` succeeds only on a ticket a holder's answer has *granted* (an
#: issue, a resident cold weight, a ``respond``), which holds in about 2% of
#: the states a run visits; a fence ordering over two streams needs ``use``
#: of one allocation on both before its drop; a deadline needs ``expire``.
#: A harness that calls a row PASS only when every declaring action
#: succeeded (coverage-aware verdicts) needs them drawn more often than the
#: table's defaults.  ``{action name: weight}``.
PROTOCOL_WEIGHTS = {"claim": 8, "respond": 5, "decommit_owned": 2, "use": 8, "expire": 3}


def _weighted(actions: list) -> list:
    return [replace(a, weight=PROTOCOL_WEIGHTS[a.name]) if a.name in PROTOCOL_WEIGHTS else a for a in actions]


SYSTEM: Machine[SysState] = Machine(
    name="system",
    doc=__doc__ or "",
    init=init,
    actions=_weighted(_needs_target_ep(manager.ACTIONS + governor.ACTIONS + manager.BINDING_ACTIONS + ep.ACTIONS
                             + vmm.SYS_ACTIONS + holders.ACTIONS + context.ACTIONS)),
    invariants=list(ALL),
    observations=OBSERVATIONS,
    regions=regions,
    unwrap=unwrap,
    ep_blame="S7",
)
