"""The invariants S1–S15 of seed 000, as predicates over the spec state.

Each invariant has a stable id, a title, the seed sentence it encodes, and
``check(state) -> None | reason``.  A predicate reads *records the
transitions keep* (what was freed through which mechanism, which fences were
done when a release ran, what the ledger says against what the holders
own...), so a transition that breaks the rule leaves a record that fails the
predicate.  ``check`` costs O(1) in the number of live allocations (it reads
running aggregates); ``full_check`` recomputes the aggregates from scratch.

The same invariant object serves both machines: each predicate looks at the
records of the level it is given (:class:`MechState` or :class:`SysState`)
and holds vacuously where the level has nothing to say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from memspec.spec import kernels as K
from memspec.spec.api import TicketState
from memspec.spec.core import Invariant, Witness
from memspec.spec.state import MechState, SysState

KV = "kv"


class _Levels:
    """A predicate per level: ``check`` dispatches on the state's class and
    ``levels`` (read by :meth:`Invariant.check_for`) names each one."""

    __slots__ = ("mech", "sys")

    def __init__(self, mech: Callable[[MechState], str | None] | None,
                 sys: Callable[[SysState], str | None] | None) -> None:
        self.mech, self.sys = mech, sys

    def __call__(self, s: Any) -> str | None:
        fn = self.mech if isinstance(s, MechState) else self.sys if isinstance(s, SysState) else None
        return fn(s) if fn is not None else None

    @property
    def levels(self) -> dict:
        return {MechState: self.mech, SysState: self.sys}


def _sys(fn: Callable[[SysState], str | None]) -> _Levels:
    return _Levels(None, fn)


def _mech(fn: Callable[[MechState], str | None]) -> _Levels:
    return _Levels(fn, None)


def _both(mech: Callable[[MechState], str | None], sys: Callable[[SysState], str | None]) -> _Levels:
    return _Levels(mech, sys)


def _inv(id: str, title: str, quote: str, check: _Levels, full_check: _Levels | None = None,
         witnesses: tuple = ()) -> Invariant:
    return Invariant(id, title, quote, check, full_check, levels=check.levels, witnesses=witnesses)


def _first(*reasons: str | None) -> str | None:
    for r in reasons:
        if r:
            return r
    return None


# --------------------------------------------------------------------------


def _s1_sys(s: SysState) -> str | None:
    if s.misreleased:
        return f"{s.misreleased} release(s) ran through a mechanism other than the creator"
    return None


def _s1_mech(s: MechState) -> str | None:
    if s.foreign_frees:
        return f"{s.foreign_frees} foreign allocation(s) were freed by the mechanism under test"
    return None


S1 = _inv(
    "S1", "creator-free: an allocation is released only by the mechanism/context that created it",
    "an allocation may only be released by the mechanism/context that created it",
    _both(_s1_mech, _s1_sys),
)


def _s2(s: SysState) -> str | None:
    for h, n in s.physical_by.items():
        if n > s.charged_by.get(h, 0):
            return f"{h}: {n} bytes installed but only {s.charged_by.get(h, 0)} charged"
    for h, n in s.charged_by.items():   # a holder with nothing installed: 0 bytes, never above its charge
        if h not in s.physical_by and n < 0:
            return f"{h}: 0 bytes installed but only {n} charged"
    return None


S2 = _inv(
    "S2", "charge-before-commit: physical bytes committed for a holder never exceed its charge",
    "a charge must be obtained before physical commit", _sys(_s2),
)


def _s3(s: SysState) -> str | None:
    reg = s.registry
    if s.stale_capabilities:
        return f"{s.stale_capabilities} capability answer(s) described a mechanism not installed at that generation"
    if reg.generation is not None and reg.history.get(reg.generation, reg.installed) != reg.installed:
        return f"generation {reg.generation} names mechanism {reg.history[reg.generation]}, installed is {reg.installed}"
    return None


S3 = _inv(
    "S3", "fresh-capability: a capability query answers for the mechanism installed now",
    "a capability query must not return a stale allocator snapshot", _sys(_s3),
)


def _s4(s: SysState) -> str | None:
    if s.premature_frees:
        return f"{s.premature_frees} release(s) ran while a fence of work using them was incomplete"
    return None


S4 = _inv(
    "S4", "fence-release: backing is released only after every fence of work that used it completed",
    "GPU release must obey stream/fence ordering", _sys(_s4),
)


def _s5_mech(s: MechState) -> str | None:
    if s.absent_answered:
        return f"an absent capability was answered with an object ({s.absent_answered} time(s))"
    model = s.eager_bytes + s.committed_bytes + s.shared_bytes + s.private_bytes
    if s.physical != model:
        return f"the mechanism reported {s.physical} physical bytes in use; the pages installed make {model}"
    return None


def _s5_mech_full(s: MechState) -> str | None:
    r = _s5_mech(s)
    if r:
        return r
    for res in s.reservations.values():
        if res.kind == "backing" and not res.foreign and res.reported != len(res.committed) * s.page:
            return f"reservation {res.ref}: commits/decommits reported {res.reported} bytes, {len(res.committed)} pages installed"
    return None


def _s5_sys(s: SysState) -> str | None:
    caps = s.registry.capabilities
    for r in s.reservations:
        o = s.owned[r]
        if not caps[o.creator][0]:
            return f"reservation {r} was made by mechanism {o.creator}, which has no VirtualBacking"
    for q in s.kv.values():
        if q.state == "open" and not caps[q.creator][0]:
            return f"KV request {q.name} lives on mechanism {q.creator}, which has no VirtualBacking"
    return None


S5 = _inv(
    "S5", "no-silent-noop: unsupported is an explicit absence/error; a commit changes committed bytes by exactly its range",
    "unsupported must not masquerade as a successful no-op", _both(_s5_mech, _s5_sys),
    full_check=_both(_s5_mech_full, _s5_sys),
)


def _s6(s: SysState) -> str | None:
    if s.governor_evictions:
        return f"{s.governor_evictions} weight(s) released by someone other than their holder"
    if s.hot_evictions:
        return f"{s.hot_evictions} hot weight(s) released under pressure"
    if s.overclaims:
        return f"{s.overclaims} pressure answer(s) reported more bytes than the holder's releases refunded"
    return None


S6 = _inv(
    "S6", "holder-chooses: the Governor only issues tickets; only holders release, and 0 is a valid answer",
    "the Governor does not choose a holder's victim", _sys(_s6),
    witnesses=(Witness("respond", "returns", "a holder's answer to a pressure ticket"),),
)


def _s7(s: SysState) -> str | None:
    if s.frees_outside_poll:
        return f"{s.frees_outside_poll} release(s) ran outside the deferred-free queue (a drop freed)"
    return None


S7 = _inv(
    "S7", "role-separation: drop enqueues and never frees; the manager never synchronizes streams",
    "the manager selects the allocator but does not duplicate the EP's stream/context responsibilities",
    _sys(_s7),
)


def _s8(s: SysState) -> str | None:
    if s.granted != s.open_grants + s.tickets_held:
        return f"granted {s.granted} != open grants {s.open_grants} + ticket holdings {s.tickets_held} (a grant was kept)"
    for h, n in s.charged_by.items():
        own = s.live_bytes_by.get(h, 0) + s.queued_bytes_by.get(h, 0) + s.lease_bytes.get(h, 0)
        if n != own:
            return f"{h} is charged {n} but its live and queued footprints and leases come to {own}"
    return None


def _s8_full(s: SysState) -> str | None:
    r = _s8(s)
    if r:
        return r
    live: dict[str, int] = {}
    for o in s.owned.values():
        if o.state == "live":
            live[o.holder] = live.get(o.holder, 0) + o.footprint
    live[KV] = live.get(KV, 0) + sum(q.own for q in s.kv.values())
    for h in set(live) | set(s.live_bytes_by):
        if live.get(h, 0) != s.live_bytes_by.get(h, 0):
            return f"{h}: live footprints {live.get(h, 0)} != running total {s.live_bytes_by.get(h, 0)}"
    if s.inexact_entries != sum(1 for e in s.queue.values() if not e.exact):
        return f"inexact queued releases counted {s.inexact_entries}"
    queued: dict[str, int] = {}
    for e in s.queue.values():
        for h, n in e.refund.items():
            queued[h] = queued.get(h, 0) + n
    for h in set(queued) | set(s.queued_bytes_by):
        if queued.get(h, 0) != s.queued_bytes_by.get(h, 0):
            return f"{h}: queued refunds {queued.get(h, 0)} != running total {s.queued_bytes_by.get(h, 0)}"
    return None


S8 = _inv(
    "S8", "exact-accounting: a failed allocation returns its grant; charges equal actual footprints",
    "If the allocation fails, the provisional grant must be returned. When the actual footprint differs from "
    "the plan, act on the real allocated bytes; do not silently keep incorrect accounts.",
    _sys(_s8), full_check=_sys(_s8_full),
)


def _s9(s: SysState) -> str | None:
    own = 0
    for q in s.kv.values():
        own += q.own
        if q.state == "open" and q.committed > q.max_bytes:
            return f"request {q.name} committed {q.committed} > max {q.max_bytes}"
    if own != s.live_bytes_by.get(KV, 0):
        return f"KV views hold {own} bytes but the store's charged live pages are {s.live_bytes_by.get(KV, 0)}"
    if s.physical_by.get(KV, 0) > s.charged_by.get(KV, 0):
        return f"KV has {s.physical_by.get(KV, 0)} bytes mapped but {s.charged_by.get(KV, 0)} charged (a partial growth kept)"
    return None


S9 = _inv(
    "S9", "transactional-growth: a failed growth rolls back the mapping, returns the grant, keeps the old view",
    "If step 4 or 5 fails: roll back the provisional mapping; return the grant; keep the old KV view and request "
    "state; do not expose a partially committed new state.", _sys(_s9),
    witnesses=(Witness("kv_grow", "returns", "a KV growth"),)
)


def _s10(s: SysState) -> str | None:
    pins = s.live_objects + len(s.queue)
    if not s.registry.context_alive and pins:
        return f"the context was destroyed with {pins} pin(s) alive"
    if s.live_objects < 0:
        return f"negative pin count {s.live_objects}"
    return None


S10 = _inv(
    "S10", "context-pinned: a context outlives every allocation and queued release made in it",
    "Establish provider/context pinning: the context is not destroyed while an allocation is still alive.",
    _sys(_s10),
)


def _s11_sys(s: SysState) -> str | None:
    if not K.ledger_ok(K.Ledger(s.capacity, s.free, s.granted, s.charged)):
        return f"ledger broken: capacity {s.capacity} != free {s.free} + granted {s.granted} + charged {s.charged} (or negative)"
    total = sum(s.charged_by.values())
    if total != s.charged:
        return f"holders' charges sum to {total}, the ledger says {s.charged}"
    for h, n in s.charged_by.items():
        if n < 0:
            return f"{h} has a negative charge {n}"
    return None


def _s11_mech(s: MechState) -> str | None:
    if not 0 <= s.physical <= s.capacity:
        return f"{s.physical} physical bytes in use on a device of {s.capacity}"
    return None


S11 = _inv(
    "S11", "ledger-conservation: capacity = free + granted + charged, all >= 0; charges are the holders' sum",
    "Total capacity: 24 GB / Approved: 22 GB / Request: 500 MB / Result: can approve",
    _both(_s11_mech, _s11_sys),
)


def _s12(s: SysState) -> str | None:
    if s.moved_addresses:
        return f"{s.moved_addresses} reservation(s) changed address on commit/decommit"
    return None


S12 = _inv(
    "S12", "stable-address: commit/decommit never move a reservation's base address",
    "The pointer stays the same, so tensor bindings or graph captures that depend on a stable address do not "
    "have to be rebuilt as the KV grows.", _sys(_s12),
)


def _s13_mech(s: MechState) -> str | None:
    if s.readonly_writes:
        return f"{s.readonly_writes} write(s) through a read-only mapping succeeded"
    return None


def _s13_mech_full(s: MechState) -> str | None:
    r = _s13_mech(s)
    if r:
        return r
    live = 0
    for h in s.handles.values():
        if h.freed and (not h.released or h.mappings):
            return f"handle {h.ref} freed with {h.mappings} mapping(s), released={h.released}"
        if not h.freed:
            live += h.size
    if live != s.shared_bytes:
        return f"unfreed handles hold {live} bytes; counted {s.shared_bytes} (a shared page counted twice?)"
    return None


def _s13_sys(s: SysState) -> str | None:
    for q in s.kv.values():
        if q.state == "open" and q.prefix_of is not None:
            origin = s.kv[q.prefix_of]
            if origin.own < q.prefix:
                return f"{q.name} maps {q.prefix} prefix bytes of {origin.name}, which keeps only {origin.own}"
    return None


S13 = _inv(
    "S13", "shared-lifetime: shared pages charged once, freed only after the last mapping and handle; read-only rejects writes",
    "This requires a physical handle, multi-address mapping, reference counting, read-only protection, and "
    "possibly Copy-on-Write.", _both(_s13_mech_full, _s13_sys), full_check=_both(_s13_mech_full, _s13_sys),
)


def _s14_mech(s: MechState) -> str | None:
    if s.duplicate_identities:
        return f"{s.duplicate_identities} handle identity(ies) issued twice"
    if len(s.by_address) != s.live_count:
        return f"{s.live_count} live allocations but {len(s.by_address)} live addresses (a stale handle freed a newer one?)"
    return None


def _s14_sys(s: SysState) -> str | None:
    if s.duplicate_identities:
        return f"{s.duplicate_identities} handle identity(ies) issued twice"
    return None


S14 = _inv(
    "S14", "no-reuse-of-identity: a stale handle is rejected even if its address was reused",
    "DeviceAllocation is an owning handle. It must remember, or indirectly reference: the allocator that "
    "created it; the corresponding device and provider context; the queue/fence needed for safe release; the "
    "associated charge or lease identity.", _both(_s14_mech, _s14_sys),
)


def _s15(s: SysState) -> str | None:
    if s.stale_tickets:
        return f"{s.stale_tickets} pending ticket(s) of an older configuration generation were answered or granted"
    if s.tickets_received != s.tickets_held + s.tickets_returned + s.tickets_claimed:
        return (f"tickets received {s.tickets_received} != held {s.tickets_held} + returned {s.tickets_returned} "
                f"+ claimed {s.tickets_claimed}")
    return None


def _s15_full(s: SysState) -> str | None:
    r = _s15(s)
    if r:
        return r
    for t in s.tickets.values():
        if t.state in TicketState.TERMINAL and t.held:
            return f"terminal ticket {t.ref} ({t.state}) still holds {t.held}"
        if t.returns > 1:
            return f"ticket {t.ref} gave its bytes back {t.returns} times"
        if t.state == TicketState.PENDING and t.generation != s.generation:
            return f"ticket {t.ref} is pending from generation {t.generation}, the configuration is at {s.generation}"
    return None


S15 = _inv(
    "S15", "ticket-exactly-once: a ticket's grant is returned exactly once on cancel/timeout; terminal tickets hold 0",
    "When memory is tight, all it can send is: pressure ticket: try to free 1 GB, priority = ..., deadline = ...",
    _sys(lambda s: _s15_full(s) if len(s.tickets) <= 64 else _s15(s)), full_check=_sys(_s15_full),
    witnesses=(Witness("claim", "returns", "a claim"),)
)


ALL: list[Invariant] = [S1, S2, S3, S4, S5, S6, S7, S8, S9, S10, S11, S12, S13, S14, S15]
BY_ID: dict[str, Invariant] = {i.id: i for i in ALL}


# --------------------------------------------------------------------------
# The catalog: each invariant's id, title and seed quote, defined once here
# (the predicates above carry them); the proofs, docs/SPEC.md and the tests
# read it instead of restating ids, titles or quotes.
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class CatalogEntry:
    """One invariant as the proofs, the docs and the tests name it."""

    id: str
    title: str
    quote: str  # the seed sentence(s) it encodes, verbatim ("..." marks a cut)
    seed: str   # the design text quoted: "000" or "003"


def catalog_of(invariants: Iterable[Invariant], seed: str, *, quoted_from: dict[str, str] | None = None
               ) -> tuple[CatalogEntry, ...]:
    """The catalog of ``invariants`` in their order; ``quoted_from`` names the
    entries whose quote comes from another seed than ``seed``."""
    other = quoted_from or {}
    return tuple(CatalogEntry(i.id, i.title, i.quote, other.get(i.id, seed)) for i in invariants)


#: S1-S15, in order (seed 000); the caching allocator's C1-C9 are
#: :data:`memspec.spec.caching.CATALOG`
CATALOG: tuple[CatalogEntry, ...] = catalog_of(ALL, "000")
IDS: tuple[str, ...] = tuple(e.id for e in CATALOG)
