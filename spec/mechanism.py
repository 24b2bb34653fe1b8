"""MECHANISM: the executable spec of one ``DeviceMemoryMechanism``.

Seed 000: *every mechanism only needs to implement the minimal
DeviceAllocator; only implementations that truly support address/backing
separation provide VirtualBacking; only implementations that truly support
physical-page sharing provide SharedMapping; when a capability is
unsupported, return an explicit absence or error rather than a successful
no-op.* ::

    trait DeviceMemoryMechanism {
        fn allocator(&self) -> &dyn DeviceAllocator;
        fn virtual_backing(&self) -> Option<&dyn VirtualBacking>;
        fn shared_mapping(&self) -> Option<&dyn SharedMapping>;
    }

``MECHANISM.init(capacity=, page=, virtual_backing=, shared_mapping=, ep=False)``
makes the state; the harness discovers the capabilities and passes them.
Actions whose ``requires`` names an absent capability are not drawn; the
capability queries below check that the absence is explicit (``None``).
``perform(sut, **args)`` receives a ``MechanismUnderTest``.
"""

from __future__ import annotations

from typing import Any

from memspec.spec import eager, shared, vmm
from memspec.spec.api import AllocatorGeometry, DeviceAllocation, SharedMapping, VirtualBacking
from memspec.spec.core import DataRegion, Machine, Observation, Returns, Within, action, global_figure, outcomes
from memspec.spec.invariants import ALL
from memspec.spec.state import MechState


def init(*, capacity: int, page: int, virtual_backing: bool, shared_mapping: bool, ep: bool = False,
         geometry: AllocatorGeometry | None = None) -> MechState:
    """A device of ``capacity`` physical bytes in pages of ``page`` bytes,
    nothing allocated, with the mechanism's discovered capabilities and its
    allocator's declared geometry (``None``: the strict page-rounded one of
    memspec's own allocators, :meth:`AllocatorGeometry.page_rounded`)."""
    if capacity <= 0 or page <= 0 or ((virtual_backing or shared_mapping or geometry is None) and capacity % page):
        raise ValueError(f"capacity ({capacity}) must be a positive multiple of page ({page})")
    if geometry is None:
        geometry = AllocatorGeometry.page_rounded(page)
    if not isinstance(geometry, AllocatorGeometry):
        raise ValueError(f"geometry must be an AllocatorGeometry, not {type(geometry).__name__}")
    return MechState(capacity, page, bool(virtual_backing), bool(shared_mapping), ep=bool(ep), geometry=geometry)


def _answer(present: bool, protocol: type, name: str) -> Any:
    def accepts(v: Any) -> bool:
        if not present:
            return v is None
        return isinstance(v, _Present) or isinstance(v, protocol)

    def then(v: Any) -> None:
        return None

    return outcomes(
        Returns(f"an object implementing {name}" if present else "None (explicitly absent)", accepts, then,
                (lambda: _Present()) if present else (lambda: None)),
        blame="S5",
    )


class _Present:
    """Spec-only witness standing for a present capability object."""


@action(role="DeviceMemoryMechanism", perform=lambda sut: sut.mechanism.virtual_backing(), invariants=("S5",))
def query_virtual_backing(s: MechState) -> Any:
    """Ask the mechanism for its VirtualBacking.

    Returns an object implementing VirtualBacking when the capability is
    provided, else ``None`` -- never a stub whose calls succeed without
    doing anything (*unsupported must not masquerade as a successful no-op*).
    """
    out = _answer(s.virtual_backing, VirtualBacking, "VirtualBacking")
    return out if s.virtual_backing else _strict_none(s, out)


@action(role="DeviceMemoryMechanism", perform=lambda sut: sut.mechanism.shared_mapping(), invariants=("S5",))
def query_shared_mapping(s: MechState) -> Any:
    """Ask the mechanism for its SharedMapping.

    Returns an object implementing SharedMapping when provided, else ``None``
    (*Supporting ordinary VMM reserve/map does not imply supporting these
    features, so it should be a separate, optional capability.*)
    """
    out = _answer(s.shared_mapping, SharedMapping, "SharedMapping")
    return out if s.shared_mapping else _strict_none(s, out)


def _strict_none(s: MechState, out: Any) -> Any:
    """For an absent capability: record (S5) if a non-None answer is ever followed."""
    b = out.branches[0]

    def then(v: Any) -> None:
        if v is not None:
            s.absent_answered += 1

    return outcomes(Returns(b.describe, b.accepts, then, b.witness), blame="S5")


# --------------------------------------------------------------------------
# Observations: figures the spec predicts, read back from the mechanism
# --------------------------------------------------------------------------


def _touched_reservations(s: MechState, touched: tuple[int, ...]) -> list[int]:
    out = []
    for r in touched:
        rec = s.reservations.get(r)
        if rec is not None and rec.kind == "backing" and rec.live and not rec.foreign:
            out.append(r)
    return out


def _touched_handles(s: MechState, touched: tuple[int, ...]) -> list[int]:
    return [h for h in touched if h in s.handles and not s.handles[h].freed]


OBSERVATIONS = [
    Observation(
        "committed_bytes",
        "S5",
        _touched_reservations,
        lambda s, r: len(s.reservations[r].committed) * s.page,
        lambda sut, r: sut.mechanism.virtual_backing().committed_bytes(sut.ref(r)),
        requires=("virtual_backing",),
    ),
    Observation(
        "mapping_count",
        "S13",
        _touched_handles,
        lambda s, h: s.handles[h].mappings,
        lambda sut, h: sut.mechanism.shared_mapping().mapping_count(sut.ref(h)),
        requires=("shared_mapping",),
    ),
    Observation(
        # Seed 000, *act on the real allocated bytes; do not silently keep
        # incorrect accounts*: the device's own count
        # (``TargetInstance.physical_bytes``, counted from the start of the
        # run) holds at least every byte the spec says is installed (the live
        # footprints, committed pages, shared pages) plus what the foreign
        # twin took on the same device: a footprint answered larger than what
        # the device took is an account that is wrong.
        "physical bytes held (at least the live footprints)",
        "S8",
        global_figure,
        lambda s, _r: Within(s.physical + s.foreign_bytes),
        lambda sut, _r: sut.physical_bytes(),
        requires=("physical_bytes",),
        check="physical-min",
    ),
    Observation(
        # Seed 000, *no silent no-ops*: a release (or commit) answered as
        # done whose bytes did not move is a success that did not happen.
        # The device holds no more than the spec says is installed, plus
        # the overhead the allocator declares for itself (its geometry; only
        # where declared: an undeclared overhead is measured, not judged).
        "physical bytes held (at most the live footprints plus the declared overhead)",
        "S5",
        lambda s, _t: (None,) if s.geometry is None or s.geometry.overhead is not None else (),
        lambda s, _r: Within(s.physical + s.foreign_bytes,
                             s.physical + s.foreign_bytes + (s.geometry.overhead if s.geometry is not None else 0)),
        lambda sut, _r: sut.physical_bytes(),
        requires=("physical_bytes",),
        check="physical-max",
    ),
]


def _capability_answer(getter: str, protocol: type) -> Any:
    """What ``mechanism.<getter>()`` answers, in the spec's terms: ``None``,
    ``"present"`` (an object with every method of ``protocol``), or what is
    missing."""

    def observed(sut: Any, _r: Any) -> Any:
        got = getattr(sut.mechanism, getter)()
        if got is None:
            return None
        missing = sorted(m for m in protocol.__dict__ if not m.startswith("_") and callable(getattr(protocol, m, None))
                         and not callable(getattr(got, m, None)))
        return f"an object lacking {', '.join(missing)}" if missing else "present"

    return observed


#: Seed 000, *"when a capability is unsupported, return an explicit absence
#: or error rather than a successful no-op"*: at the start of a run each
#: capability query answers as it did when the target was discovered -- an
#: object with the protocol's methods, or ``None``.
START_CHECKS = [
    Observation("virtual_backing()", "S5", global_figure,
                lambda s, _r: "present" if s.virtual_backing else None,
                _capability_answer("virtual_backing", VirtualBacking)),
    Observation("shared_mapping()", "S5", global_figure,
                lambda s, _r: "present" if s.shared_mapping else None,
                _capability_answer("shared_mapping", SharedMapping)),
]


def regions(s: MechState, ref: int, obj: Any) -> DataRegion | None:
    """The bytes a caller of the mechanism can see: a live own allocation's
    ``[address, address+size)`` and a live own VirtualBacking reservation's
    committed pages.

    Blame: a fault on either is S5 (*a commit/allocation that returns
    success without mapping*); a changed byte is S11 (two live ranges on the
    same physical bytes: the device's accounts count bytes that do not
    exist).

    A live mapping of a physical handle is an *alias* of the handle's bytes
    (key ``("handle", h)``): *A's virtual address and B's virtual address
    -- same batch of prefix physical pages*; a write through one is seen
    through every other, and the bytes live as long as the handle does.  A
    read-only mapping is read, never written.  After copy-on-write the
    mapping holds *private pages with the same bytes* (``copy_of`` the
    handle).  A fault or a changed byte on a mapping is S13.
    """
    m = s.mappings.get(ref)
    if m is not None:
        res = s.reservations.get(m.reservation)
        if not m.live or res is None or not res.live or res.foreign:
            return None
        extent = (res.address + m.offset, m.size)
        key = ("handle", m.handle)
        if m.private:
            return DataRegion("S13", "S13", extent=extent, page=s.page, copy_of=key, version=m.writes)
        return DataRegion("S13", "S13", extent=extent, page=s.page, alias=(key, 0), writable=not m.read_only,
                          version=s.handles[m.handle].writes)
    rec = s.allocations.get(ref)
    if rec is not None:
        if rec.live and not rec.foreign:
            addr = obj.address if isinstance(obj, DeviceAllocation) else rec.address
            return DataRegion("S5", "S11", extent=(addr, rec.size), page=s.page)
        return None
    res = s.reservations.get(ref)
    if res is not None and res.live and not res.foreign and res.kind == "backing" and res.committed:
        return DataRegion("S5", "S11", pages=(res.address, res.committed, s.page))
    return None


MECHANISM: Machine[MechState] = Machine(
    name="mechanism",
    doc=__doc__ or "",
    init=init,
    actions=[query_virtual_backing, query_shared_mapping]
    + eager.MECH_ACTIONS
    + vmm.MECH_ACTIONS
    + shared.MECH_ACTIONS,
    invariants=list(ALL),
    observations=OBSERVATIONS,
    regions=regions,
    start_checks=START_CHECKS,
    ep_blame="S7",
)
