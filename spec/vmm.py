"""VirtualBacking: *when to install real memory behind an address*.

Seed 000: *A VMM can separate the "virtual address" from the "physical
backing".* ::

    10 GB contiguous virtual address
    ├── 0..100 MB      → mapped real VRAM
    └── 100 MB..10 GB  → address only for now

=================  ==========================================================
reserve            Reserve a virtual address, but not necessarily obtain physical memory
commit/map         Install physical backing for a range of addresses
decommit/unmap     Remove backing but keep the address
committed_bytes    Query the physical bytes currently installed for the allocation
=================  ==========================================================

Part 1 is the mechanism level (``VirtualBacking`` of the mechanism under
test; the capability is optional and its absence must be explicit).  Part 2
is the system level: reservations a holder makes through its
``MemoryBinding``, where every commit is charged first (S2), every decommit
is deferred behind the reservation's fences, and the address never moves (S12).
"""

from __future__ import annotations

from typing import Any

from memspec.spec import kernels as K
from memspec.spec.api import ReserveRequest, VirtualAllocation
from memspec.spec.core import Domain, Raises, Returns, action, only, outcomes
from memspec.spec.errors import (
    DoubleFree,
    ForeignAllocation,
    GrantDenied,
    InvalidRange,
    InvalidRequest,
    OutOfMemory,
    StaleHandle,
    Unsupported,
)
from memspec.spec.state import (
    oom_rule,
    MechReservation,
    MechState,
    Seen,
    from_refs,
    is_size,
    new_ref,
    obj_of,
    remember_identity,
    witness_identity,
)
from memspec.spec.eager import WITNESS_DEVICE

# ==========================================================================
# Part 1 -- mechanism level
# ==========================================================================


def reserve_boundaries(s: Any) -> tuple[int, ...]:
    """The sizes at the spec's thresholds (:func:`~memspec.spec.kernels.size_boundaries`):
    the page exactly and +-1, two pages, the device's free bytes and capacity and one page over."""
    return K.size_boundaries(s.page, max(s.capacity - s.physical, 0), s.capacity)


def _draw_reserve_size(s: Any, c: Any) -> Any:
    kind = c.integer(0, 10)
    if kind <= 6:
        return c.integer(1, 8) * s.page
    if kind == 7:
        return c.integer(1, 3 * s.page)
    if kind == 8:
        return c.choice((0, -1, 2.5))
    if kind == 10:
        return c.choice(reserve_boundaries(s))
    return 2 * s.capacity


RESERVE_SIZES = Domain("mostly 1..8 pages, sometimes a ragged size, 0, negative, not an int, 2x the capacity, "
                       "or a threshold of the spec exactly and +-1 (the page, two pages, the capacity)",
                       _draw_reserve_size, boundaries=reserve_boundaries)


def witness_reservation(s: Any, size: int, creator: str = "spec-va") -> VirtualAllocation:
    size = K.round_up(size, s.page)
    addr = s.w_next_address
    s.w_next_address += size + s.page
    return VirtualAllocation(addr, size, witness_identity(s, creator), WITNESS_DEVICE)


def reserve_outcomes(s: MechState, size: Any, kind: str, *, foreign: bool = False) -> Any:
    """Shared by VirtualBacking.reserve and SharedMapping.reserve."""
    if not is_size(size):
        return only(InvalidRequest, blame="S5", describe="size is not a positive int")
    want = K.round_up(size, s.page)

    def accepts(v: Any) -> bool:
        return (
            isinstance(v, VirtualAllocation)
            and isinstance(v.size, int)
            and v.size >= want
            and v.size % s.page == 0
            and v.address % s.page == 0
            and (foreign or v.identity not in s.identities)
        )

    def then(v: VirtualAllocation) -> int:
        ref = new_ref(s)
        s.reservations[ref] = MechReservation(ref, kind, v.address, v.size, v.identity, foreign=foreign)
        if not foreign:
            remember_identity(s, v.identity)
        (s.backing_refs if kind == "backing" else s.shared_refs).add(ref)
        return ref

    branches: list[Any] = [
        Returns(f"a reservation of >= {want} bytes at a page-aligned address; no physical bytes", accepts, then,
                lambda: witness_reservation(s, size, "spec-foreign-va" if foreign else "spec-va"))
    ]
    if size > s.capacity:
        branches.append(Raises(OutOfMemory, "virtual address space is finite"))
    return outcomes(*branches, blame="S5")


def _perform_reserve(sut: Any, size: Any) -> VirtualAllocation:
    return sut.mechanism.virtual_backing().reserve(ReserveRequest(size))


@action(role="VirtualBacking", params={"size": RESERVE_SIZES}, perform=_perform_reserve,
        requires=("virtual_backing",), invariants=("S5", "S14"), weight=2)
def reserve(s: MechState, size: Any) -> Any:
    """Reserve ``size`` bytes of virtual address space (any value).

    Returns a reservation of at least ``round_up(size, page)`` bytes at a
    page-aligned address with a fresh identity, taking no physical bytes
    (*Reserve a virtual address, but not necessarily obtain physical
    memory*).  A size that is not a positive int: InvalidRequest.  A
    reservation larger than the device may be refused with OutOfMemory.
    """
    return reserve_outcomes(s, size, "backing")


def _perform_reserve_foreign(sut: Any, size: int) -> VirtualAllocation:
    return sut.foreign.virtual_backing().reserve(ReserveRequest(size))


@action(role="VirtualBacking", params={"size": Domain("two pages", lambda s, c: 2 * s.page)},
        perform=_perform_reserve_foreign, requires=("virtual_backing",),
        enabled=lambda s: sum(1 for r in s.backing_refs if s.reservations[r].foreign) < 2)
def reserve_foreign(s: MechState, size: int) -> Any:
    """Reserve two pages on the independent twin (the source of foreign reservations).

    The twin returns a reservation; the spec records it as foreign.
    """
    return reserve_outcomes(s, size, "backing", foreign=True)


def draw_span(s: Any, c: Any, ref: int, size: int, committed: set[int]) -> tuple[int, int, int]:
    """A byte range of reservation ``ref``: mostly page-aligned and inside,
    sometimes misaligned, empty, reversed or past the end."""
    page = s.page
    n = max(1, size // page)
    kind = c.integer(0, 11)
    a = c.integer(0, n - 1)
    b = c.integer(a + 1, min(n, a + 3))
    if kind <= 3 and committed:
        # prefer the neighbourhood of what is committed (decommit, overlap)
        a = min(max(0, min(committed) + c.integer(-1, 1)), n - 1)
        b = c.integer(a + 1, min(n, a + 3))
    if kind == 8:
        return (ref, a * page + page // 2, b * page)
    if kind == 9:
        return (ref, a * page, a * page)
    if kind == 10:
        return (ref, b * page, a * page)
    if kind == 11:
        return (ref, a * page, (n + 1) * page)
    return (ref, a * page, b * page)


def _draw_backing_span(s: MechState, c: Any) -> tuple[int, int, int]:
    refs = s.backing_refs
    ref = refs.at(c.integer(0, len(refs) - 1))
    r = s.reservations[ref]
    return draw_span(s, c, ref, r.size, r.committed)


BACKING_SPAN = Domain(
    "(reservation, start, end): mostly a page-aligned range inside a reservation; sometimes "
    "misaligned, empty, reversed, past the end, already (or not) committed, released or foreign",
    _draw_backing_span,
    lambda s: len(s.backing_refs) > 0,
)


def handle_errors(r: MechReservation) -> list[Any]:
    """Errors a call on reservation ``r`` must raise because of the handle itself."""
    if r.foreign:
        return [Raises(ForeignAllocation, "reservation made by another instance")]
    if not r.live:
        return [Raises(StaleHandle, "reservation released"), Raises(DoubleFree, "reservation released")]
    return []


def handle_blame(r: MechReservation, otherwise: str) -> str:
    """The rule a call on reservation ``r`` breaks when it does not refuse
    the handle itself: S1 for another instance's (*creator-only*), S14 for
    a released one (*a stale handle is rejected even if its address was
    reused*); ``otherwise`` the rule of the call."""
    return "S1" if r.foreign else "S14" if not r.live else otherwise


def range_legal(s: Any, r: Any, start: int, end: int) -> bool:
    return bool(K.range_ok(start, end, r.size, s.page))


def pages(s: Any, start: int, end: int) -> range:
    return range(start // s.page, end // s.page)


def _perform_commit(sut: Any, span: tuple[int, int, int]) -> int:
    ref, start, end = span
    return sut.mechanism.virtual_backing().commit_range(sut.ref(ref), start, end)


@action(role="VirtualBacking", params={"span": BACKING_SPAN}, perform=_perform_commit,
        requires=("virtual_backing",), invariants=("S5", "S11", "S12"), weight=4)
def commit_range(s: MechState, span: tuple[int, int, int]) -> Any:
    """Install physical backing behind ``[start, end)`` of a reservation.

    The range must be page-aligned, non-empty and inside, and no page of it
    backed already; else InvalidRange (a foreign or released reservation:
    ForeignAllocation / StaleHandle).  A legal commit returns exactly
    ``end - start`` bytes newly committed (S5: *A successful no-op can hide
    accounting errors*).  OutOfMemory exactly when the device's physical
    bytes in use plus ``end - start`` exceed its capacity; on any error
    nothing stays committed.
    """
    ref, start, end = span
    r = s.reservations[ref]
    errs = handle_errors(r)
    if r.live and not r.foreign:
        if not range_legal(s, r, start, end):
            errs.append(Raises(InvalidRange, "misaligned, empty, reversed or past the end"))
        elif any(p in r.committed for p in pages(s, start, end)):
            errs.append(Raises(InvalidRange, "a page of the range is already committed"))
    if errs:
        return outcomes(*errs, blame=handle_blame(r, "S5"), touched=(ref,))
    need = end - start
    may_return, may_oom = oom_rule(s, need)
    if not may_return:
        return only(OutOfMemory, blame="S5", describe=f"{s.physical} + {need} > capacity {s.capacity}", touched=(ref,))

    def then(v: int) -> None:
        r.committed.update(pages(s, start, end))
        r.reported += v
        s.committed_bytes += need
        s.physical += v

    branches: list[Any] = [Returns(f"exactly {need} (end - start)", lambda v: type(v) is int and v == need, then, lambda: need)]
    if may_oom:
        branches.append(Raises(OutOfMemory, "the device is full (the twin holds pages of it)"))
    return outcomes(*branches, blame="S5", touched=(ref,))


def _perform_decommit(sut: Any, span: tuple[int, int, int]) -> int:
    ref, start, end = span
    return sut.mechanism.virtual_backing().decommit_range(sut.ref(ref), start, end)


@action(role="VirtualBacking", params={"span": BACKING_SPAN}, perform=_perform_decommit,
        requires=("virtual_backing",), invariants=("S5", "S11", "S12"), weight=2)
def decommit_range(s: MechState, span: tuple[int, int, int]) -> Any:
    """Remove the backing of ``[start, end)`` but keep the address.

    Every page of the (page-aligned, inside) range must be committed, else
    InvalidRange and nothing changes.  Returns exactly ``end - start``: the
    bytes actually released.
    """
    ref, start, end = span
    r = s.reservations[ref]
    errs = handle_errors(r)
    if r.live and not r.foreign:
        if not range_legal(s, r, start, end):
            errs.append(Raises(InvalidRange, "misaligned, empty, reversed or past the end"))
        elif not all(p in r.committed for p in pages(s, start, end)):
            errs.append(Raises(InvalidRange, "a page of the range is not committed"))
    if errs:
        return outcomes(*errs, blame=handle_blame(r, "S5"), touched=(ref,))
    n = end - start

    def then(v: int) -> None:
        r.committed.difference_update(pages(s, start, end))
        r.reported -= v
        s.committed_bytes -= n
        s.physical -= v

    return outcomes(
        Returns(f"exactly {n}", lambda v: type(v) is int and v == n, then, lambda: n), blame="S5", touched=(ref,)
    )


def _perform_committed(sut: Any, reservation: int) -> int:
    return sut.mechanism.virtual_backing().committed_bytes(sut.ref(reservation))


@action(role="VirtualBacking", params={"reservation": from_refs("a reservation", lambda s: s.backing_refs)},
        perform=_perform_committed, requires=("virtual_backing",), invariants=("S5",))
def committed_bytes(s: MechState, reservation: int) -> Any:
    """Query the physical bytes currently installed for a reservation.

    Returns exactly ``page * (committed pages)``; a foreign or released
    reservation is refused (ForeignAllocation / StaleHandle).
    """
    r = s.reservations[reservation]
    errs = handle_errors(r)
    if errs:
        return outcomes(*errs, blame=handle_blame(r, "S5"))
    n = len(r.committed) * s.page
    return outcomes(Returns(f"exactly {n}", lambda v: type(v) is int and v == n, witness=lambda: n), blame="S5")


def _perform_release(sut: Any, reservation: int) -> int:
    return sut.mechanism.virtual_backing().release(sut.ref(reservation))


@action(role="VirtualBacking", params={"reservation": from_refs("a reservation", lambda s: s.backing_refs)},
        perform=_perform_release, requires=("virtual_backing",), invariants=("S5", "S11", "S14"))
def release_reservation(s: MechState, reservation: int) -> Any:
    """End a reservation, decommitting what is left.

    Returns the physical bytes released (its committed bytes).  Releasing it
    again: DoubleFree (or StaleHandle); a foreign one: ForeignAllocation.
    """
    r = s.reservations[reservation]
    errs = handle_errors(r)
    if errs:
        return outcomes(*errs, blame=handle_blame(r, "S14"), touched=(reservation,))
    n = len(r.committed) * s.page

    def then(v: int) -> None:
        s.committed_bytes -= n
        s.physical -= v
        r.reported -= v
        r.committed.clear()
        r.live = False

    return outcomes(Returns(f"exactly {n}", lambda v: type(v) is int and v == n, then, lambda: n),
                    blame="S5", touched=(reservation,))


MECH_ACTIONS = [reserve, reserve_foreign, commit_range, decommit_range, committed_bytes, release_reservation]


# ==========================================================================
# Part 2 -- system level: a holder's reservations through its MemoryBinding
# ==========================================================================

from memspec.spec.api import Fence  # noqa: E402
from memspec.spec.state import SysState, add  # noqa: E402


def reservation_of(sut: Any, ref: int) -> Any:
    """The implementation's OwningReservation bound to ``ref``."""
    return obj_of(sut.ref(ref))


def _perform_res_reserve(sut: Any, size: Any) -> Seen:
    from memspec.spec.manager import mechanism_index
    from memspec.spec.governor import SESSION

    o = sut.binding.reserve(SESSION, size)
    va = o.allocation
    return Seen(o, {"mechanism": mechanism_index(sut, o.mechanism_id), "address": va.address, "size": va.size,
                    "identity": va.identity})


def _alive(s: Any) -> bool:
    return s.registry.context_alive and len(s.reservations) < 4


@action(role="MemoryBinding", params={"size": Domain("1..8 pages, sometimes ragged or 0",
                                                     lambda s, c: c.choice((0, c.integer(1, 8) * s.page, c.integer(1, 3 * s.page))))},
        perform=_perform_res_reserve, enabled=_alive, invariants=("S5", "S12", "S14"))
def reserve_owned(s: SysState, size: Any) -> Any:
    """Reserve virtual address for the session holder through the binding.

    Needs the installed mechanism's VirtualBacking: without it Unsupported
    (explicit, S5); with it, never Unsupported (a refusal answered from an
    earlier mechanism's snapshot: S3's clause ``capability-refused``, see
    :func:`~memspec.spec.manager.capability_refusal_is_stale`).  Not a positive int: InvalidRequest.  Returns an owning
    reservation of the installed mechanism with at least ``round_up(size,
    page)`` bytes; nothing is charged (no physical bytes).
    """
    from memspec.spec.manager import capability_refusal_is_stale, new_owned
    from memspec.spec.governor import SESSION

    if not s.registry.capabilities[s.registry.installed][0]:
        return only(Unsupported, blame="S5", describe="the installed mechanism has no VirtualBacking")
    if not is_size(size):
        return outcomes(Raises(InvalidRequest), blame="S5", forbidden=capability_refusal_is_stale(s, "VirtualBacking"))
    want = K.round_up(size, s.page)
    installed = s.registry.installed

    def accepts(v: Any) -> bool:
        return (isinstance(v, Seen) and v["mechanism"] == installed and type(v["size"]) is int and v["size"] >= want
                and v["size"] % s.page == 0 and v["address"] % s.page == 0 and v["identity"] not in s.identities)

    def then(v: Seen) -> int:
        o = new_owned(s, "reservation", SESSION, v["size"], 0, installed)
        o.address = o.base = v["address"]
        remember_identity(s, v["identity"])
        s.reservations.add(o.ref)
        return o.ref

    def witness() -> Seen:
        addr = s.w_next_address
        s.w_next_address += want + s.page
        return Seen(None, {"mechanism": installed, "address": addr, "size": want,
                           "identity": witness_identity(s, "spec-res")})

    branches: list[Any] = [Returns(f"an owning reservation of >= {want} bytes, nothing charged", accepts, then, witness)]
    if size > s.capacity:
        branches.append(Raises(OutOfMemory, "no virtual address space left"))
    return outcomes(*branches, blame="S5", forbidden=capability_refusal_is_stale(s, "VirtualBacking"))


def _draw_res_span(s: SysState, c: Any) -> tuple[int, int, int]:
    ref = s.reservations.at(c.integer(0, len(s.reservations) - 1))
    o = s.owned[ref]
    return draw_span(s, c, ref, o.size, o.committed)


RES_SPAN = Domain("(reservation, start, end): mostly a page range inside a live owning reservation",
                  _draw_res_span, lambda s: len(s.reservations) > 0)


def _perform_res_commit(sut: Any, span: tuple[int, int, int]) -> Seen:
    ref, start, end = span
    o = reservation_of(sut, ref)
    n = sut.binding.commit(o, start, end)
    return Seen(None, {"bytes": n, "address": o.allocation.address})


@action(role="MemoryBinding", params={"span": RES_SPAN}, perform=_perform_res_commit,
        invariants=("S2", "S5", "S11", "S12"), weight=3)
def commit_owned(s: SysState, span: tuple[int, int, int]) -> Any:
    """Charge-then-commit ``[start, end)`` of an owning reservation.

    Illegal range or a page already committed: InvalidRange.  The Governor
    cannot grant ``end - start``: GrantDenied.  The device cannot:
    OutOfMemory (the mapping rolled back, the grant returned).  Success:
    exactly ``end - start`` newly committed and charged to the holder (S2:
    *a charge must be obtained before physical commit*), the reservation's
    address unchanged (S12).  Pages whose decommit is still queued are taken
    back from it (still mapped, charged again) rather than mapped anew.
    """
    from memspec.spec.governor import SESSION, charge_at_footprint

    ref, start, end = span
    o = s.owned[ref]
    if not range_legal(s, o, start, end) or any(p in o.committed for p in pages(s, start, end)):
        return only(InvalidRange, blame="S5", touched=(ref,))
    need = end - start
    if need > s.free:
        return only(GrantDenied, blame="S2", touched=(ref,))

    def then(v: Seen) -> None:
        if v["address"] != o.base:
            s.moved_addresses += 1
        o.address = v["address"]
        charge_at_footprint(s, SESSION, need, need)
        for p in pages(s, start, end):
            o.decommitting.pop(p, None)
        o.committed.update(pages(s, start, end))
        o.footprint += need
        add(s.live_bytes_by, SESSION, need)
        add(s.physical_by, SESSION, need)

    return outcomes(
        Returns(f"exactly {need}, address unchanged",
                lambda v: isinstance(v, Seen) and type(v["bytes"]) is int and v["bytes"] == need and v["address"] == o.base,
                then, lambda: Seen(None, {"bytes": need, "address": o.base})),
        Raises(OutOfMemory, "no physical pages; rolled back, grant returned"),
        blame="S2",
        touched=(ref,),
    )


def _perform_res_decommit(sut: Any, span: tuple[int, int, int]) -> Seen:
    ref, start, end = span
    o = reservation_of(sut, ref)
    n = sut.binding.decommit(o, start, end)
    return Seen(None, {"bytes": n, "address": o.allocation.address})


@action(role="MemoryBinding", params={"span": RES_SPAN}, perform=_perform_res_decommit,
        invariants=("S4", "S7", "S12"))
def decommit_owned(s: SysState, span: tuple[int, int, int]) -> Any:
    """Decommit ``[start, end)`` of an owning reservation, behind its fences.

    Every page must be committed, else InvalidRange.  Returns ``end -
    start``.  The pages leave the reservation's committed bytes now; their
    unmapping and refund are queued behind the reservation's fences (S4:
    *wait for the related stream/fence to finish*); the address stays (S12).
    A later commit over a page whose decommit is still queued takes it back.
    """
    from memspec.spec.governor import SESSION
    from memspec.spec.ep import enqueue, new_entry

    ref, start, end = span
    o = s.owned[ref]
    span_pages = pages(s, start, end)
    if not range_legal(s, o, start, end) or not all(p in o.committed for p in span_pages):
        return only(InvalidRange, blame="S5", touched=(ref,))
    n = end - start

    def then(v: Seen) -> None:
        if v["address"] != o.base:
            s.moved_addresses += 1
        o.committed.difference_update(span_pages)
        o.footprint -= n
        s.live_bytes_by[SESSION] -= n
        e = new_entry(s, f"decommit of reservation {ref}", o.fences, o.creator, {SESSION: n}, n)
        for p in span_pages:
            o.decommitting[p] = e.seq

        def gone() -> None:
            for p in span_pages:
                if o.decommitting.get(p) == e.seq:
                    del o.decommitting[p]

        e.on_run = gone
        enqueue(s, e)

    return outcomes(
        Returns(f"exactly {n}, address unchanged",
                lambda v: isinstance(v, Seen) and v["bytes"] == n and v["address"] == o.base, then,
                lambda: Seen(None, {"bytes": n, "address": o.base})),
        blame="S12", touched=(ref,),
    )


def _perform_res_use(sut: Any, reservation: int, stream: int) -> Fence:
    o = reservation_of(sut, reservation)
    f = sut.ep.launch(sut.ref(stream), [], [])
    o.use(f)
    return f


@action(role="MemoryBinding",
        params={"reservation": from_refs("a live owning reservation", lambda s: s.reservations),
                "stream": Domain("a stream", lambda s, c: list(s.streams)[c.integer(0, len(s.streams) - 1)],
                                 lambda s: len(s.streams) > 0)},
        perform=_perform_res_use, invariants=("S4",))
def use_owned(s: SysState, reservation: int, stream: int) -> Any:
    """Submit device work using a reservation; record its fence on the owning reservation.

    Returns the fence.
    """
    from memspec.spec.ep import launch

    def then(_v: Any) -> int:
        f = launch(s, stream)
        s.owned[reservation].fences.append(f)
        return f

    return outcomes(Returns("a Fence", lambda v: isinstance(v, Fence), then, lambda: Fence(stream, 0)), blame="S4")


@action(role="MemoryBinding", params={"reservation": from_refs("a live owning reservation", lambda s: s.reservations)},
        perform=lambda sut, reservation: reservation_of(sut, reservation).close(), invariants=("S7", "S10"))
def close_owned(s: SysState, reservation: int) -> Any:
    """Drop an owning reservation: its release (decommit what is left, free
    the address, refund) is queued behind its fences.

    Returns None; nothing is freed now (S7).
    """
    from memspec.spec.manager import drop_owned

    o = s.owned[reservation]

    def then(_v: Any) -> None:
        s.reservations.discard(reservation)
        drop_owned(s, o, o.fences)

    return outcomes(Returns("None (release queued)", lambda v: v is None, then, lambda: None), blame="S7")


SYS_ACTIONS = [reserve_owned, commit_owned, decommit_owned, use_owned, close_owned]
