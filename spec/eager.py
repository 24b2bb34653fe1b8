"""DeviceAllocator: ordinary (eager) allocation on the mechanism under test.

Seed 000: *Allocator answers "how to obtain ordinary memory"* ... *An ordinary
eager allocator takes the full physical capacity when the allocation is
created: Request 10 GB ≈ immediately need 10 GB of physical capacity.*

This module specifies ``DeviceAllocator.allocate/deallocate`` (mechanism
level).  The system-level allocation transaction that a ``MemoryBinding``
runs on top of it is in :mod:`memspec.spec.manager`.
"""

from __future__ import annotations

import itertools
from typing import Any

from memspec.spec import kernels as K
from memspec.spec.api import AllocationRequest, DeviceAllocation, DeviceKey, Fence, is_power_of_two
from memspec.spec.core import Domain, Raises, Returns, action, only, outcomes
from memspec.spec.errors import (
    DoubleFree,
    ForeignAllocation,
    GrantDenied,
    InvalidRequest,
    OutOfMemory,
    StaleHandle,
)
from memspec.spec.state import (
    MechAllocation,
    MechState,
    Owned,
    Seen,
    SysState,
    add,
    from_refs,
    is_size,
    new_ref,
    obj_of,
    remember_identity,
    witness_identity,
)

ALIGNMENT = 256  # AllocationRequest's default alignment
WITNESS_DEVICE = DeviceKey("spec")


def _room(s: Any) -> int:
    return s.free if isinstance(s, SysState) else s.capacity - s.physical


def size_boundaries(s: Any) -> tuple[int, ...]:
    """The sizes at the spec's thresholds (:func:`~memspec.spec.kernels.size_boundaries`):
    the page exactly and +-1, two pages, the device exactly full and one page over."""
    return K.size_boundaries(s.page, max(_room(s), 0), s.capacity)


def _draw_size(s: Any, c: Any) -> Any:
    """Mostly legal sizes (bytes, whole pages), sometimes illegal ones
    (0, negative, not an int), more than the device holds, or a size at
    one of the spec's thresholds (:func:`size_boundaries`)."""
    kind = c.integer(0, 12)
    if kind <= 5:
        return c.integer(1, 3 * s.page)
    if kind <= 7:
        return c.integer(1, 4) * s.page
    if kind == 8:
        return c.choice((0, -s.page, 1.5, "4096"))
    if kind == 9:
        return 4 * s.capacity + 1
    if kind == 10:
        room = _room(s)
        if room > 0:
            return c.integer(max(1, room - s.page + 1), room)  # all that is left: fragmentation shows
    if kind == 12:
        return c.choice(size_boundaries(s))
    return c.integer(1, max(1, s.capacity // 2))


SIZES = Domain("a byte count: mostly 1..3 pages, sometimes 0, negative, not an int, 4x the capacity, "
               "all that is still free, or a threshold of the spec exactly and +-1 (the page, two pages, "
               "the device exactly full and one page over)", _draw_size, boundaries=size_boundaries)


def alignment_boundaries(s: Any) -> tuple[int, ...]:
    """:func:`~memspec.spec.kernels.alignment_boundaries` of the state's page."""
    return K.alignment_boundaries(s.page, ALIGNMENT)


def _draw_alignment(s: Any, c: Any) -> int:
    if c.integer(0, 3) < 3:
        return ALIGNMENT                     # the request's default (shrinks here)
    return c.choice(alignment_boundaries(s))


ALIGNMENTS = Domain("mostly the default 256; else a threshold exactly and +-1: 256, the page, 2 and 4 pages "
                    "(a power of two is legal, +-1 is not)", _draw_alignment, boundaries=alignment_boundaries)


# ==========================================================================
# Part 1 -- mechanism level: DeviceAllocator
# ==========================================================================


def span(size: int, footprint: int, page: int) -> int:
    """The bytes from an allocation's address on that are its own: its
    footprint, but no more than its size rounded up to the page (an
    allocation aligned above the page may start inside its footprint: the
    bytes before the aligned start are its too, those after it need not be)."""
    return min(footprint, K.round_up(size, page))


def _overlaps(s: MechState, address: int, footprint: int) -> bool:
    """Does ``[address, address+footprint)`` overlap a live allocation's
    :func:`span`? O(log n)."""
    idx = s.by_address.bisect_right(address)
    if idx > 0:
        prev = s.allocations[s.by_address.peekitem(idx - 1)[1]]
        if prev.address + span(prev.size, prev.footprint, s.page) > address:
            return True
    if idx < len(s.by_address):
        nxt = s.by_address.peekitem(idx)[0]
        if nxt < address + footprint:
            return True
    return False


def _witness_allocation(s: MechState, size: int, align: int = ALIGNMENT) -> DeviceAllocation:
    """A value a conforming allocator could return: a page-rounded footprint,
    reusing a freed address when one fits (so stale handles meet recycled
    addresses in spec-only runs)."""
    fp = K.round_up(size, s.page)
    address = None
    for a, old in list(itertools.islice(s.w_freed.items(), 4)):
        if old >= fp and a % align == 0 and not _overlaps(s, a, fp):
            address = a
            del s.w_freed[a]
            break
    if address is None:
        address = K.round_up(s.w_next_address, align)
        s.w_next_address = address + K.round_up(fp, s.page) + s.page
    return DeviceAllocation(address, size, fp, witness_identity(s), WITNESS_DEVICE)


def _record_allocation(s: MechState, v: DeviceAllocation, *, foreign: bool = False) -> int:
    ref = new_ref(s)
    rec = MechAllocation(ref, v.address, v.size, v.footprint, v.identity, foreign=foreign)
    s.allocations[ref] = rec
    if foreign:
        s.foreign_live += 1
        s.foreign_bytes += v.footprint
        s.other_allocs.add(ref)
        return ref
    remember_identity(s, v.identity)
    s.by_address[v.address] = ref
    s.live_allocs.add(ref)
    s.live_count += 1
    s.eager_bytes += v.footprint
    s.physical += v.footprint
    return ref


def _perform_allocate(sut: Any, size: Any, alignment: int = ALIGNMENT) -> DeviceAllocation:
    return sut.mechanism.allocator().allocate(AllocationRequest(size, alignment))


@action(role="DeviceAllocator", params={"size": SIZES, "alignment": ALIGNMENTS}, perform=_perform_allocate,
        invariants=("S8", "S11", "S14"), weight=4)
def allocate(s: MechState, size: Any, alignment: int = ALIGNMENT) -> Any:
    """Ask the allocator for ``size`` bytes aligned to ``alignment`` (any
    values; the allocator validates).

    A size that is not a positive int, or an alignment that is not a power
    of two, is refused with InvalidRequest and nothing is taken.  Otherwise
    the allocator returns an allocation with ``size`` as requested, a
    footprint in ``[size, aligned_footprint(size, alignment, page)]`` (the
    request rounded up to the page, plus ``alignment - page`` for an
    alignment above the page), an address aligned to ``alignment`` (and to
    256) that overlaps no live allocation and a fresh identity, and takes
    the footprint from the device at once (*An ordinary eager allocator
    takes the full physical capacity when the allocation is created*).
    OutOfMemory is allowed when fragmentation could explain it, never when
    the device is empty and the most the footprint may be fits, always when
    the footprint cannot fit.
    """
    if not is_size(size):
        return only(InvalidRequest, blame="S5", describe="size is not a positive int; nothing taken")
    if not is_power_of_two(alignment):
        return only(InvalidRequest, blame="S5", describe=f"alignment {alignment!r} is not a power of two; nothing taken")
    hi = K.aligned_footprint(size, alignment, s.page)
    align = max(alignment, ALIGNMENT)

    def accepts(v: Any) -> bool:
        return (
            isinstance(v, DeviceAllocation)
            and v.size == size
            and type(v.footprint) is int
            and size <= v.footprint <= hi
            and v.address % align == 0
            and s.physical + v.footprint <= s.capacity
            and v.identity not in s.identities
            and not _overlaps(s, v.address, span(size, v.footprint, s.page))
        )

    branches: list[Any] = []
    if s.physical + size <= s.capacity:
        branches.append(
            Returns(
                f"an allocation of {size} bytes, footprint in [{size}, {hi}], address aligned to {align}, "
                "fresh identity, no overlap",
                accepts,
                lambda v: _record_allocation(s, v),
                (lambda: _witness_allocation(s, size, align)) if s.physical + K.round_up(size, s.page) <= s.capacity
                else None,
            )
        )
    if not (s.physical + s.foreign_bytes == 0 and hi <= s.capacity):
        branches.append(Raises(OutOfMemory, "no contiguous room (fragmentation) or no room at all"))
    return outcomes(*branches, blame="S8")


def _perform_allocate_foreign(sut: Any, size: int) -> DeviceAllocation:
    return sut.foreign.allocator().allocate(AllocationRequest(size))


@action(
    role="DeviceAllocator",
    params={"size": Domain("one page", lambda s, c: s.page)},
    perform=_perform_allocate_foreign,
    enabled=lambda s: s.foreign_live < 3,
    invariants=("S1",),
)
def allocate_foreign(s: MechState, size: int) -> Any:
    """Allocate one page from an independent instance of the same mechanism
    (``sut.foreign``), to have a handle the mechanism under test did not make.

    The twin returns an allocation (or, if it is out of memory, OutOfMemory);
    the spec only records it as foreign.
    """
    return outcomes(
        Returns(
            "an allocation made by the twin",
            lambda v: isinstance(v, DeviceAllocation),
            lambda v: _record_allocation(s, v, foreign=True),
            lambda: DeviceAllocation(1 << 50, size, size, witness_identity(s, "spec-foreign"), WITNESS_DEVICE),
        ),
        Raises(OutOfMemory, "the twin is full"),
        blame="S1",
    )


def _free_allocation(s: MechState, ref: int, freed: int) -> None:
    rec = s.allocations[ref]
    if rec.foreign:  # S1: the twin's allocation freed by the mechanism under test
        s.foreign_frees += 1
    rec.live = False
    s.by_address.pop(rec.address, None)
    s.live_allocs.discard(ref)
    s.other_allocs.add(ref)
    s.live_count -= 1
    s.eager_bytes -= rec.footprint
    s.physical -= freed
    s.w_freed[rec.address] = rec.footprint


def _perform_deallocate(sut: Any, handle: int) -> int:
    return sut.mechanism.allocator().deallocate(sut.ref(handle))


@action(
    role="DeviceAllocator",
    params={"handle": from_refs("an allocation: live, freed, or made by the twin", lambda s: s.live_allocs, lambda s: s.other_allocs)},
    perform=_perform_deallocate,
    invariants=("S1", "S14", "S11"),
    weight=3,
)
def deallocate(s: MechState, handle: int) -> Any:
    """Free an allocation through the allocator under test.

    Seed 000: *an allocation may only be released by the mechanism/context
    that created it.*  A live allocation it made is freed and its footprint
    returned (the bytes actually freed).  One made by the twin is refused with
    ForeignAllocation.  One already freed is refused with DoubleFree or
    StaleHandle, also when its address now belongs to a newer allocation
    (*a stale generation or reused address is rejected*): the newer
    allocation stays live.
    """
    rec = s.allocations[handle]
    if rec.foreign:
        return only(ForeignAllocation, blame="S1", describe="made by another instance")
    if not rec.live:
        reused = rec.address in s.by_address
        why = "its address now belongs to a newer allocation" if reused else "already freed"
        return outcomes(Raises(StaleHandle, why), Raises(DoubleFree, why), blame="S14")
    return outcomes(
        Returns(
            f"{rec.footprint} (its footprint)",
            lambda v: isinstance(v, int) and not isinstance(v, bool) and v == rec.footprint,
            lambda v: _free_allocation(s, handle, v),
            lambda: rec.footprint,
        ),
        blame="S1",
        touched=(handle,),
    )


MECH_ACTIONS = [allocate, allocate_foreign, deallocate]
