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
from memspec.spec.api import (AllocationRequest, AllocatorGeometry, DeviceAllocation, DeviceKey, Fence, Identity,
                              is_power_of_two)
from memspec.spec.core import Check, Domain, Raises, Returns, action, only, outcomes
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


def geometry_of(s: Any) -> AllocatorGeometry:
    """The allocator's declared geometry (the spec's own strict one when the
    state carries none)."""
    g = getattr(s, "geometry", None)
    return g if g is not None else AllocatorGeometry.page_rounded(s.page)


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def plain_identity(i: Any) -> bool:
    """An :class:`~memspec.spec.api.Identity` of a ``str`` and an ``int``, no
    subclass of either: its equality and hash are the dataclass's own (a
    target's object whose ``__hash__`` raises or changes is not one)."""
    return type(i) is Identity and type(i.creator) is str and type(i.generation) is int


def most_footprint(g: AllocatorGeometry, size: int, alignment: int) -> int | None:
    """The most footprint the allocator's declared bound allows for ``size``
    bytes aligned to ``alignment`` (:class:`~memspec.spec.api.FootprintBound`);
    ``None`` when it declares no bound.  For memspec's own page-rounded
    geometry this is :func:`~memspec.spec.kernels.aligned_footprint`."""
    b = g.bound
    if b is None:
        return None
    if b.fn is not None:
        v = b.fn(size, alignment)
        if type(v) is not int or v < size:
            raise ValueError(f"the target's declared FootprintBound.fn({size}, {alignment}) answered {v!r}, "
                             f"not an int >= {size}")
        return v
    x = size + b.header
    if b.rounding == "pow2":
        c = _next_pow2(max(x, b.min_class, 1))
        nxt = 2 * c
    elif b.rounding == "classes":
        bigger = [k for k in b.classes if k >= x]
        c = bigger[0] if bigger else K.round_up(x, g.unit)
        nxt = bigger[1] if len(bigger) > 1 else (c if not bigger else K.round_up(max(x, c + 1), g.unit))
    else:
        c = nxt = x
    if b.next_class:
        c = nxt
    pad = max(0, alignment - g.unit) if alignment > g.alignment else 0
    return K.round_up(c + pad, g.unit)


def extent(address: int, size: int, footprint: int, block: Any, unit: int) -> tuple[int, int]:
    """The bytes ``[lo, hi)`` an allocation holds on the device, on which
    overlap is judged: from its ``block`` start (an in-band header, leading
    alignment padding) over its whole footprint when the allocator says
    where its block starts; otherwise from its address, its size rounded up
    to the allocation unit but no more than its footprint (an allocation
    aligned above the unit may start inside its footprint: the bytes before
    the aligned start are its too, those after it need not be)."""
    if block is not None:
        return block, block + footprint
    return address, address + min(footprint, K.round_up(size, unit))


def _overlaps(s: MechState, lo: int, hi: int) -> bool:
    """Does ``[lo, hi)`` overlap a live allocation's :func:`extent`? O(log n)."""
    idx = s.by_address.bisect_right(lo)
    if idx > 0:
        prev = s.allocations[s.by_address.peekitem(idx - 1)[1]]
        if prev.hi > lo:
            return True
    if idx < len(s.by_address):
        nxt = s.by_address.peekitem(idx)[0]
        if nxt < hi:
            return True
    return False


def _extent_of(s: MechState, v: DeviceAllocation) -> tuple[int, int]:
    return extent(v.address, v.size, v.footprint, getattr(v, "block", None), geometry_of(s).unit)


def _witness_allocation(s: MechState, size: int, align: int = ALIGNMENT, hi: int | None = None) -> DeviceAllocation:
    """A value a conforming allocator could return: the request rounded up
    to the allocation unit (within the declared bound), reusing a freed
    address when one fits (so stale handles meet recycled addresses in
    spec-only runs)."""
    g = geometry_of(s)
    fp = K.round_up(size, g.unit)
    if hi is not None:
        fp = max(size, min(fp, hi))
    address = None
    for a, old in list(itertools.islice(s.w_freed.items(), 4)):
        if old >= fp and a % align == 0 and not _overlaps(s, *extent(a, size, fp, None, g.unit)):
            address = a
            del s.w_freed[a]
            break
    if address is None:
        address = K.round_up(s.w_next_address, align)
        s.w_next_address = address + K.round_up(fp, s.page) + s.page
    return DeviceAllocation(address, size, fp, witness_identity(s), WITNESS_DEVICE)


def _record_allocation(s: MechState, v: DeviceAllocation, *, foreign: bool = False) -> int:
    ref = new_ref(s)
    lo, hi = _extent_of(s, v) if not foreign else (v.address, v.address)
    rec = MechAllocation(ref, v.address, v.size, v.footprint, v.identity, foreign=foreign, lo=lo, hi=hi)
    s.allocations[ref] = rec
    if foreign:
        s.foreign_live += 1
        s.foreign_bytes += v.footprint
        s.other_allocs.add(ref)
        return ref
    remember_identity(s, v.identity)
    s.by_address[lo] = ref
    s.live_allocs.add(ref)
    s.live_count += 1
    s.eager_bytes += v.footprint
    s.physical += v.footprint
    s.q_allocations += 1
    s.q_requested += v.size
    s.q_footprint += v.footprint
    return ref


def _perform_allocate(sut: Any, size: Any, alignment: int = ALIGNMENT) -> DeviceAllocation:
    return sut.mechanism.allocator().allocate(AllocationRequest(size, alignment))


def _refused_with_room(s: MechState) -> None:
    s.q_refused_with_room += 1


@action(role="DeviceAllocator", params={"size": SIZES, "alignment": ALIGNMENTS}, perform=_perform_allocate,
        invariants=("S8", "S11", "S14"), weight=4)
def allocate(s: MechState, size: Any, alignment: int = ALIGNMENT) -> Any:
    """Ask the allocator for ``size`` bytes aligned to ``alignment`` (any
    values; the allocator validates).

    A size that is not a positive int, or an alignment that is not a power
    of two, is refused with InvalidRequest and nothing is taken.  Otherwise
    the allocator returns an allocation of ``size`` bytes and takes its
    footprint from the device at once (*An ordinary eager allocator takes
    the full physical capacity when the allocation is created*), or raises
    OutOfMemory.  Seed 000 asks of every allocator that the footprint is the
    real allocated bytes (*act on the real allocated bytes; do not silently
    keep incorrect accounts*); how it rounds and pads is its own, declared in
    its geometry (:class:`~memspec.spec.api.AllocatorGeometry`).  Each clause
    is a check of its own, reported on its own:

    * ``S8.footprint`` -- the footprint is at least the request;
    * ``S8.bound`` -- at most the declared bound (only where one is declared);
    * ``S8.alignment`` -- the address is aligned to the request's alignment
      and to the alignment the geometry guarantees;
    * ``S8.capacity`` -- the device holds it (the live footprints within the
      capacity, less the declared overhead);
    * ``S8.overlap`` -- its bytes overlap no live allocation's;
    * ``S8.block`` -- where it says its block starts, the block holds the
      address and the requested bytes;
    * ``S14.fresh-identity`` -- its identity was never seen before;
    * ``S8.refused-fit`` -- OutOfMemory is allowed, except on an empty
      device for a request whose declared bound fits (only where a bound and
      the overhead are declared; otherwise such a refusal is counted as a
      quality figure).
    """
    if not is_size(size):
        return only(InvalidRequest, blame="S5", describe="size is not a positive int; nothing taken")
    if not is_power_of_two(alignment):
        return only(InvalidRequest, blame="S5", describe=f"alignment {alignment!r} is not a power of two; nothing taken")
    g = geometry_of(s)
    hi = most_footprint(g, size, alignment)
    align = max(alignment, g.alignment)
    room = s.capacity - (g.overhead or 0)

    def shaped(v: Any) -> bool:
        # plain ints and a plain Identity: a value whose ``__eq__``/``__hash__`` lies or raises is no answer
        # (an int subclass equal to everything would pass ``v.size == size`` with any size)
        return (isinstance(v, DeviceAllocation) and type(v.size) is int and v.size == size and type(v.footprint) is int
                and type(v.address) is int and (v.block is None or type(v.block) is int) and plain_identity(v.identity))

    checks = [Check("S8", "footprint", lambda v: v.footprint >= size, f"footprint >= {size}")]
    if hi is not None:
        checks.append(Check("S8", "bound", lambda v: v.footprint <= hi, f"footprint <= {hi} (the declared bound)"))
    checks += [
        Check("S8", "alignment", lambda v: v.address % align == 0, f"address aligned to {align:#x}"),
        Check("S8", "capacity", lambda v: s.physical + v.footprint <= room,
              f"the live footprints within the device's {room} bytes"),
        Check("S8", "block", lambda v: v.block is None or v.block <= v.address
              and v.address + v.size <= v.block + v.footprint, "its block holds the address and the requested bytes"),
        Check("S8", "overlap", lambda v: not _overlaps(s, *_extent_of(s, v)), "no overlap with a live allocation"),
        Check("S14", "fresh-identity", lambda v: v.identity not in s.identities, "a fresh identity"),
    ]
    bound = f"[{size}, {hi}]" if hi is not None else f">= {size}"
    branches: list[Any] = []
    if s.physical + size <= room:
        branches.append(
            Returns(
                f"an allocation of {size} bytes, footprint {bound}, address aligned to {align:#x}, "
                "fresh identity, no overlap",
                shaped,
                lambda v: _record_allocation(s, v),
                (lambda: _witness_allocation(s, size, align, hi)) if s.physical + K.round_up(size, g.unit) <= room
                else None,
                checks=tuple(checks),
                id="returns an allocation",
            )
        )
    empty = s.physical + s.foreign_bytes == 0
    forbidden: tuple = ()
    if empty and hi is not None and g.overhead is not None and hi <= room:
        forbidden = (Raises(OutOfMemory, "never on an empty device for a request its declared bound fits",
                            checks=(Check("S8", "refused-fit", lambda e: False,
                                          f"an empty device of {room} bytes fits the bound {hi}"),)),)
    elif empty and size <= room:
        branches.append(Raises(OutOfMemory, "no contiguous room (an undeclared packing policy)",
                               lambda e: _refused_with_room(s)))
    else:
        branches.append(Raises(OutOfMemory, "no contiguous room (fragmentation) or no room at all"))
    if g.max_alignment is not None and alignment > g.max_alignment:
        branches.append(Raises(InvalidRequest, f"an alignment above the declared maximum {g.max_alignment:#x}"))
    return outcomes(*branches, blame="S8", forbidden=forbidden)


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
    s.by_address.pop(rec.lo, None)
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
        reused = _overlaps(s, rec.address, rec.address + 1)
        why = "its address now belongs to a newer allocation" if reused else "already freed"
        return outcomes(Raises(StaleHandle, why), Raises(DoubleFree, why), blame="S14")
    return outcomes(
        Returns(
            f"{rec.footprint} (its footprint)",
            lambda v: type(v) is int and v == rec.footprint,   # not a bool, not an int subclass that lies
            lambda v: _free_allocation(s, handle, v),
            lambda: rec.footprint,
        ),
        blame="S1",
        touched=(handle,),
    )


MECH_ACTIONS = [allocate, allocate_foreign, deallocate]
