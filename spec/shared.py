"""SharedMapping: *how multiple addresses share physical memory*.

Seed 000::

    A's virtual address ─┐
                         ├── same batch of prefix physical pages
    B's virtual address ─┘

*This requires a physical handle, multi-address mapping, reference counting,
read-only protection, and possibly Copy-on-Write.  Supporting ordinary VMM
reserve/map does not imply supporting these features, so it should be a
separate, optional capability.*

The rules (S13): a handle's physical pages are taken once at ``create``,
whatever the number of addresses it is later mapped at, and freed only after
its creator's ``release`` **and** its last unmap; a read-only mapping rejects
writes; copy-on-write replaces the shared pages at one address by private
pages with the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memspec.spec.api import DEFAULT_PAGE, PhysicalHandle, ReserveRequest
from memspec.spec.core import Domain, Raises, Returns, action, booleans, only, outcomes
from memspec.spec.errors import DeviceFault, DoubleFree, InvalidRange, InvalidRequest, OutOfMemory, ReadOnlyViolation, StaleHandle
from memspec.spec.state import oom_rule, MechHandle, MechMapping, MechState, from_refs, is_size, new_ref, remember_identity, witness_identity
from memspec.spec.eager import WITNESS_DEVICE
from memspec.spec.vmm import handle_blame, handle_errors, reserve_outcomes, RESERVE_SIZES


def _sm(sut: Any) -> Any:
    return sut.mechanism.shared_mapping()


# -- reservations -----------------------------------------------------------


def _perform_shared_reserve(sut: Any, size: Any) -> Any:
    return _sm(sut).reserve(ReserveRequest(size))


@action(role="SharedMapping", params={"size": RESERVE_SIZES}, perform=_perform_shared_reserve,
        requires=("shared_mapping",), invariants=("S14",))
def shared_reserve(s: MechState, size: Any) -> Any:
    """Reserve virtual address space to map shared handles into.

    As ``VirtualBacking.reserve``: a reservation of at least
    ``round_up(size, page)`` bytes, page-aligned, fresh identity, no physical
    bytes; InvalidRequest for a size that is not a positive int.
    """
    return reserve_outcomes(s, size, "shared")


def _perform_free_reservation(sut: Any, reservation: int) -> None:
    return _sm(sut).free_reservation(sut.ref(reservation))


@action(role="SharedMapping", params={"reservation": from_refs("a shared reservation", lambda s: s.shared_refs)},
        perform=_perform_free_reservation, requires=("shared_mapping",), invariants=("S13", "S14"))
def free_shared_reservation(s: MechState, reservation: int) -> Any:
    """End a shared reservation; nothing may be mapped in it.

    Returns None.  Still mapped: InvalidRange and nothing changes.  Already
    freed: DoubleFree (or StaleHandle).
    """
    r = s.reservations[reservation]
    errs = handle_errors(r)
    if errs:
        return outcomes(*errs, blame=handle_blame(r, "S14"))
    if r.backed:
        return only(InvalidRange, blame="S13", describe=f"{len(r.backed)} page(s) still mapped")

    def then(_v: Any) -> None:
        r.live = False

    return outcomes(Returns("None", lambda v: v is None, then, lambda: None), blame="S13")


# -- physical handles ---------------------------------------------------------


def _draw_handle_size(s: Any, c: Any) -> Any:
    k = c.integer(0, 7)
    if k <= 5:
        return c.integer(1, 2) * s.page
    return c.choice((0, s.page + 1, -s.page))


def _perform_create(sut: Any, size: Any) -> PhysicalHandle:
    return _sm(sut).create(size)


@action(role="SharedMapping",
        params={"size": Domain("1 or 2 pages; sometimes 0, negative or not a page multiple", _draw_handle_size)},
        perform=_perform_create, requires=("shared_mapping",), invariants=("S11", "S13", "S14"), weight=2)
def create(s: MechState, size: Any) -> Any:
    """Create physical pages that may be mapped at several addresses.

    ``size`` must be a positive multiple of the page, else InvalidRequest
    (or InvalidRange).  Takes ``size`` physical bytes once; OutOfMemory
    exactly when they do not fit.
    """
    if not is_size(size) or size % s.page:
        return outcomes(Raises(InvalidRequest, "not a positive page multiple"),
                        Raises(InvalidRange, "not a positive page multiple"), blame="S5")
    may_return, may_oom = oom_rule(s, size)
    if not may_return:
        return only(OutOfMemory, blame="S13", describe=f"{s.physical} + {size} > capacity")

    def then(v: PhysicalHandle) -> int:
        ref = new_ref(s)
        s.handles[ref] = MechHandle(ref, v.size, v.identity)
        remember_identity(s, v.identity)
        s.handle_refs.add(ref)
        s.shared_bytes += size
        s.physical += v.size
        return ref

    branches: list[Any] = [
        Returns(f"a handle of {size} bytes with a fresh identity",
                lambda v: isinstance(v, PhysicalHandle) and v.size == size and v.identity not in s.identities,
                then, lambda: PhysicalHandle(size, witness_identity(s, "spec-phys"), WITNESS_DEVICE))]
    if may_oom:
        branches.append(Raises(OutOfMemory, "the device is full (the twin holds pages of it)"))
    return outcomes(*branches, blame="S13")


def _draw_place(s: MechState, c: Any) -> tuple[int, int]:
    ref = s.shared_refs.at(c.integer(0, len(s.shared_refs) - 1))
    r = s.reservations[ref]
    n = max(1, r.size // s.page)
    # half the time the start (where any handle that fits the reservation
    # fits), else any page, the end included
    off = 0 if c.boolean() else c.integer(0, n) * s.page
    if c.integer(0, 7) == 0:
        off += s.page // 2
    return (ref, off)


PLACE = Domain("(shared reservation, offset): half the time its start, else any page (the end included), "
               "sometimes misaligned",
               _draw_place, lambda s: len(s.shared_refs) > 0)


def _perform_map(sut: Any, handle: int, place: tuple[int, int], read_only: bool) -> int:
    ref, off = place
    return _sm(sut).map(sut.ref(handle), sut.ref(ref), off, read_only=read_only)


@action(role="SharedMapping",
        params={"handle": from_refs("a physical handle", lambda s: s.handle_refs), "place": PLACE, "read_only": booleans()},
        perform=_perform_map, requires=("shared_mapping",), invariants=("S13",), weight=5)
def map(s: MechState, handle: int, place: tuple[int, int], read_only: bool) -> Any:  # noqa: A001
    """Map a whole handle at ``offset`` of a shared reservation, read-only or not.

    The handle must not be released (StaleHandle), the reservation live, the
    offset page-aligned, the handle fit inside, and no page there backed
    (else InvalidRange).  Returns the bytes mapped (the handle's size); the
    handle's mapping count goes up by one; no new physical bytes.
    """
    ref, off = place
    h = s.handles[handle]
    r = s.reservations[ref]
    errs = handle_errors(r)
    if h.released:
        errs.append(Raises(StaleHandle, "handle released by its creator"))
    if r.live:
        if off % s.page or off + h.size > r.size or off < 0:
            errs.append(Raises(InvalidRange, "misaligned or past the end"))
        elif any(p in r.backed for p in range(off // s.page, (off + h.size) // s.page)):
            errs.append(Raises(InvalidRange, "a page there is already backed"))
    if errs:   # the reservation's own handle refused (S1, S14), else the shared handle's rule (S13)
        return outcomes(*errs, blame="S13" if h.released else handle_blame(r, "S13"), touched=(handle,))

    def then(v: int) -> int:
        mref = new_ref(s)
        s.mappings[mref] = MechMapping(mref, handle, ref, off, h.size, read_only)
        s.mapping_refs.add(mref)
        r.mappings[off] = mref
        r.backed.update(range(off // s.page, (off + h.size) // s.page))
        h.mappings += 1
        return mref

    return outcomes(Returns(f"exactly {h.size}", lambda v: type(v) is int and v == h.size, then, lambda: h.size),
                    blame="S13", touched=(handle,))


def _maybe_free(s: MechState, h: MechHandle) -> int:
    """Free a handle's pages if released and unmapped everywhere; bytes freed."""
    if h.released and h.mappings == 0 and not h.freed:
        h.freed = True
        s.shared_bytes -= h.size
        return h.size
    return 0


def _draw_mapping(s: MechState, c: Any) -> tuple[int, int, int, int]:
    mref = s.mapping_refs.at(c.integer(0, len(s.mapping_refs) - 1))
    m = s.mappings[mref]
    if c.integer(0, 7) == 0:
        return (mref, m.reservation, m.offset, m.size + s.page)  # not exactly one mapping
    return (mref, m.reservation, m.offset, m.size)


MAPPING = Domain("(mapping, reservation, offset, size): a live mapping made by map, mostly with its exact size, "
                 "sometimes a range that is not exactly one mapping",
                 _draw_mapping, lambda s: len(s.mapping_refs) > 0)


def _mapping_errors(s: MechState, m: MechMapping, size: int) -> list[Any]:
    r = s.reservations[m.reservation]
    errs = handle_errors(r)
    if errs:
        return errs
    if not m.live or size != m.size:
        return [Raises(InvalidRange, "no mapping covers exactly that range")]
    return []


def _perform_unmap(sut: Any, mapping: tuple[int, int, int, int]) -> int:
    _mref, res, offset, size = mapping
    return _sm(sut).unmap(sut.ref(res), offset, size)


@action(role="SharedMapping", params={"mapping": MAPPING}, perform=_perform_unmap,
        requires=("shared_mapping",), invariants=("S13", "S11"), weight=2)
def unmap(s: MechState, mapping: tuple[int, int, int, int]) -> Any:
    """Remove one whole mapping made by ``map`` (``[offset, offset + size)``).

    Returns the bytes unmapped.  A range that is not exactly one live
    mapping: InvalidRange, nothing changes.  The handle's mapping count drops
    by one; its pages are freed if it was released and this was its last
    mapping.  After copy-on-write the mapping's pages are private copies:
    unmap removes and frees them.
    """
    mref, _res, _off, size = mapping
    m = s.mappings[mref]
    errs = _mapping_errors(s, m, size)
    if errs:
        return outcomes(*errs, blame=handle_blame(s.reservations[m.reservation], "S13"), touched=(m.handle, mref))
    h = s.handles[m.handle]
    r = s.reservations[m.reservation]

    def then(v: int) -> None:
        m.live = False
        s.mapping_refs.discard(mref)
        del r.mappings[m.offset]
        r.backed.difference_update(range(m.offset // s.page, (m.offset + m.size) // s.page))
        if m.private:
            s.private_bytes -= m.size
            s.physical -= m.size
        else:
            h.mappings -= 1
            s.physical -= _maybe_free(s, h)

    return outcomes(Returns(f"exactly {m.size}", lambda v: type(v) is int and v == m.size, then, lambda: m.size),
                    blame="S13", touched=(m.handle, mref))


def _perform_cow(sut: Any, mapping: tuple[int, int, int, int]) -> int:
    _mref, res, offset, size = mapping
    return _sm(sut).copy_on_write(sut.ref(res), offset, size)


@action(role="SharedMapping", params={"mapping": MAPPING}, perform=_perform_cow,
        requires=("shared_mapping",), invariants=("S13", "S11"), weight=3)
def copy_on_write(s: MechState, mapping: tuple[int, int, int, int]) -> Any:
    """Replace the shared pages of one mapping by private writable copies.

    Returns the private bytes newly committed (the mapping's size);
    OutOfMemory exactly when they do not fit.  The handle loses that mapping
    (and is freed if released and now unmapped everywhere).  A range that is
    not exactly one live shared mapping: InvalidRange.
    """
    mref, _res, _off, size = mapping
    m = s.mappings[mref]
    errs = _mapping_errors(s, m, size)
    if not errs and m.private:
        errs = [Raises(InvalidRange, "the pages there are private already")]
    if errs:
        return outcomes(*errs, blame=handle_blame(s.reservations[m.reservation], "S13"), touched=(m.handle, mref))
    may_return, may_oom = oom_rule(s, m.size)
    if not may_return:
        return only(OutOfMemory, blame="S13", touched=(m.handle, mref))
    h = s.handles[m.handle]

    def then(v: int) -> None:
        m.private = True
        s.private_bytes += m.size
        s.physical += v
        h.mappings -= 1
        s.physical -= _maybe_free(s, h)

    branches: list[Any] = [Returns(f"exactly {m.size}", lambda v: type(v) is int and v == m.size, then, lambda: m.size)]
    if may_oom:
        branches.append(Raises(OutOfMemory, "the device is full (the twin holds pages of it)"))
    return outcomes(*branches, blame="S13", touched=(m.handle, mref))


def _perform_count(sut: Any, handle: int) -> int:
    return _sm(sut).mapping_count(sut.ref(handle))


@action(role="SharedMapping", params={"handle": from_refs("a physical handle", lambda s: s.handle_refs)},
        perform=_perform_count, requires=("shared_mapping",), invariants=("S13",))
def mapping_count(s: MechState, handle: int) -> Any:
    """The number of live mappings of a handle (its reference count minus the creator's).

    Returns exactly that; a freed handle: StaleHandle.
    """
    h = s.handles[handle]
    if h.freed:
        return outcomes(Raises(StaleHandle, "freed"), Raises(DoubleFree, "freed"), blame="S13")
    return outcomes(Returns(f"exactly {h.mappings}", lambda v: type(v) is int and v == h.mappings, witness=lambda: h.mappings),
                    blame="S13")


def _perform_release(sut: Any, handle: int) -> int:
    return _sm(sut).release(sut.ref(handle))


@action(role="SharedMapping", params={"handle": from_refs("a physical handle", lambda s: s.handle_refs)},
        perform=_perform_release, requires=("shared_mapping",), invariants=("S13", "S11"))
def release_handle(s: MechState, handle: int) -> Any:
    """Drop the creator's reference to a handle.

    Returns the bytes freed now: its size if no mapping remains, else 0 (the
    pages go at the last unmap).  Releasing again: DoubleFree (or StaleHandle).
    """
    h = s.handles[handle]
    if h.released:
        return outcomes(Raises(DoubleFree, "already released"), Raises(StaleHandle, "already released"),
                        blame="S13", touched=(handle,))
    n = h.size if h.mappings == 0 else 0

    def then(v: int) -> None:
        h.released = True
        s.physical -= _maybe_free(s, h)

    return outcomes(Returns(f"exactly {n}", lambda v: type(v) is int and v == n, then, lambda: n),
                    blame="S13", touched=(handle,))


# -- read-only protection -------------------------------------------------


#: bytes written at the start of every page of a mapping (and at its end)
WRITE_BYTES = 64


@dataclass(frozen=True)
class PagesWritten:
    """What :func:`write_through` saw when the pages of one mapping did not
    all answer alike: the offsets written and the offsets refused (a
    read-only mapping whose later pages are writable, say)."""

    written: tuple[int, ...]
    refused: tuple[str, ...]

    def __repr__(self) -> str:
        return f"written at offsets {list(self.written)}, refused at {list(self.refused)}"


def _perform_write(sut: Any, mapping: tuple[int, int, int, int]) -> Any:
    """Write ``WRITE_BYTES`` at the start of every page of the mapping and at
    its end, each its own copy and synchronize: every page is tried, so one
    that accepts a write among pages that refuse it shows (PagesWritten)."""
    _mref, res, offset, size = mapping
    ep = sut.ep
    stream = ep.new_stream()
    base = sut.ref(res).address + offset
    page = _page_of(sut)
    places = list(range(0, size, page)) + [size - WRITE_BYTES]
    written, refused, first = [], [], None
    for off in places:
        try:
            ep.write(stream, base + off, bytes((off // page + i) & 0xFF for i in range(WRITE_BYTES)))
            ep.synchronize(stream)
            written.append(off)
        except (ReadOnlyViolation, DeviceFault) as e:
            refused.append(f"{off}: {type(e).__name__}")
            first = first or e
    if written and refused:
        return PagesWritten(tuple(written), tuple(refused))
    if first is not None:
        raise first
    return None


def _page_of(sut: Any) -> int:
    sm = _sm(sut)
    g = getattr(sm, "granularity", None)
    return int(g()) if callable(g) else DEFAULT_PAGE


def _draw_exact_mapping(s: MechState, c: Any) -> tuple[int, int, int, int]:
    mref = s.mapping_refs.at(c.integer(0, len(s.mapping_refs) - 1))
    if c.boolean():
        # the widest read-only mapping: the protection of its later pages
        ro = [r for r in s.mapping_refs if rejects_writes(s.mappings[r])]
        if ro:
            mref = max(ro, key=lambda r: (s.mappings[r].size, r))
    m = s.mappings[mref]
    return (mref, m.reservation, m.offset, m.size)


EXACT_MAPPING = Domain("(mapping, reservation, offset, size): a live mapping made by map, with its exact size; "
                       "half the time the widest read-only one", _draw_exact_mapping, lambda s: len(s.mapping_refs) > 0)


@action(role="SharedMapping", params={"mapping": EXACT_MAPPING}, perform=_perform_write,
        requires=("shared_mapping", "ep"), invariants=("S13",), weight=4)
def write_through(s: MechState, mapping: tuple[int, int, int, int]) -> Any:
    """Copy 64 bytes from the host to the start of every page of a live
    mapping and to its end, each followed by a synchronize.

    Through a read-only (not copied) mapping every write is rejected:
    ReadOnlyViolation, or DeviceFault when the device reports it, and the
    bytes there do not change (*read-only protection*); through a writable
    or private one every write completes (None).  Some pages written and
    others refused is neither.
    """
    m = s.mappings[mapping[0]]
    if rejects_writes(m):
        return outcomes(Raises(ReadOnlyViolation, "read-only mapping"), Raises(DeviceFault, "write to a read-only page"),
                        blame="S13", touched=(mapping[0],))
    return outcomes(Returns("None", lambda v: v is None, lambda v: _wrote(s, m), lambda: None), blame="S13",
                    touched=(mapping[0],))


def rejects_writes(m: Any) -> bool:
    """A read-only mapping that was not copied rejects writes."""
    return m.read_only and not m.private


def _wrote(s: MechState, m: Any) -> None:
    """A write succeeded: S13's record if the mapping was read-only."""
    if m.read_only and not m.private:
        s.readonly_writes += 1
    if m.private:
        m.writes += 1
    else:
        s.handles[m.handle].writes += 1


MECH_ACTIONS = [shared_reserve, free_shared_reservation, create, map, unmap, copy_on_write, mapping_count,
                release_handle, write_through]
