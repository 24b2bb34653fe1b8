"""Unit tests of the MECHANISM spec: every action, every error outcome."""

from __future__ import annotations

import pytest

from memspec.spec.api import DeviceAllocation, DeviceKey, Identity, PhysicalHandle, VirtualAllocation
from memspec.spec.errors import (
    DeviceFault,
    DoubleFree,
    ForeignAllocation,
    InvalidRange,
    InvalidRequest,
    OutOfMemory,
    ReadOnlyViolation,
    StaleHandle,
)
from memspec.spec.mechanism import MECHANISM
from memspec.spec.selfcheck import drive, permits, usable

PAGE = 4096
CAP = 16 * PAGE
DEV = DeviceKey("test")


def fresh(vb: bool = True, sm: bool = True):
    return MECHANISM.init(capacity=CAP, page=PAGE, virtual_backing=vb, shared_mapping=sm, ep=True)


def alloc_value(addr: int, size: int, fp: int, gen: int) -> DeviceAllocation:
    return DeviceAllocation(addr, size, fp, Identity("impl", gen), DEV)


def ok(s) -> None:
    assert MECHANISM.check_invariants(s, full=True) == []


def test_init_rejects_a_capacity_that_is_not_whole_pages():
    with pytest.raises(ValueError):
        MECHANISM.init(capacity=PAGE + 1, page=PAGE, virtual_backing=False, shared_mapping=False)


def test_capability_queries_absent_must_be_none():
    s = fresh(vb=False, sm=False)
    assert permits(MECHANISM, s, "query_virtual_backing", value=None)
    assert not permits(MECHANISM, s, "query_virtual_backing", value=object())
    assert not permits(MECHANISM, s, "query_shared_mapping", value=object())
    s2 = fresh(vb=True, sm=False)
    assert not permits(MECHANISM, s2, "query_virtual_backing", value=None)  # present: None would hide it


def test_actions_needing_an_absent_capability_are_not_drawn():
    s = fresh(vb=False, sm=False)
    drive(MECHANISM, s, "allocate", size=PAGE)
    names = {a.name for a in MECHANISM.actions if usable(a, s)}
    assert "allocate" in names and "deallocate" in names
    assert not names & {"reserve", "commit_range", "create", "map"}


@pytest.mark.parametrize("size", [0, -PAGE, 1.5, "4096", True])
def test_allocate_invalid_size_only_invalid_request(size):
    s = fresh()
    outs = MECHANISM.action("allocate").step(s, size=size)
    assert [type(b).__name__ for b in outs.branches] == ["Raises"]
    assert outs.branches[0].error is InvalidRequest


def test_allocate_footprint_bounds_overlap_and_identity():
    s = fresh()
    assert permits(MECHANISM, s, "allocate", size=100, value=alloc_value(0, 100, PAGE, 1))
    assert permits(MECHANISM, s, "allocate", size=100, value=alloc_value(0, 100, 100, 1))
    assert not permits(MECHANISM, s, "allocate", size=100, value=alloc_value(0, 100, 99, 1))      # smaller than asked
    assert not permits(MECHANISM, s, "allocate", size=100, value=alloc_value(0, 100, 2 * PAGE, 1))  # over-rounded
    assert not permits(MECHANISM, s, "allocate", size=100, value=alloc_value(8, 100, PAGE, 1))    # misaligned
    r = drive(MECHANISM, s, "allocate", size=100, value=alloc_value(0, 100, PAGE, 1))
    assert s.allocations[r].footprint == PAGE and s.physical == PAGE
    assert not permits(MECHANISM, s, "allocate", size=100, value=alloc_value(2048, 100, PAGE, 2))  # overlaps
    assert not permits(MECHANISM, s, "allocate", size=100, value=alloc_value(PAGE, 100, PAGE, 1))  # identity reused
    ok(s)


def test_allocate_oom_rules():
    s = fresh()
    huge = MECHANISM.action("allocate").step(s, size=4 * CAP)
    assert [b.error for b in huge.branches] == [OutOfMemory]
    empty = MECHANISM.action("allocate").step(s, size=CAP)
    assert not empty.match(None, OutOfMemory("x")), "OOM on an empty device for size <= capacity is not allowed"
    drive(MECHANISM, s, "allocate", size=PAGE)
    later = MECHANISM.action("allocate").step(s, size=PAGE)
    assert later.match(None, OutOfMemory("fragmentation")) is not None


def test_deallocate_own_returns_footprint():
    s = fresh()
    r = drive(MECHANISM, s, "allocate", size=100, value=alloc_value(0, 100, PAGE, 1))
    assert not permits(MECHANISM, s, "deallocate", handle=r, value=100)
    drive(MECHANISM, s, "deallocate", handle=r, value=PAGE)
    assert s.physical == 0 and not s.allocations[r].live
    ok(s)


def test_double_free_is_refused():
    s = fresh()
    r = drive(MECHANISM, s, "allocate", size=PAGE)
    drive(MECHANISM, s, "deallocate", handle=r)
    outs = MECHANISM.action("deallocate").step(s, handle=r)
    assert {b.error for b in outs.branches} == {DoubleFree, StaleHandle}
    assert outs.match(PAGE) is None


def test_foreign_free_is_refused():
    s = fresh()
    f = drive(MECHANISM, s, "allocate_foreign", size=PAGE)
    outs = MECHANISM.action("deallocate").step(s, handle=f)
    assert [b.error for b in outs.branches] == [ForeignAllocation] and outs.blame == "S1"


def test_stale_handle_after_address_reuse():
    s = fresh()
    a = drive(MECHANISM, s, "allocate", size=PAGE, value=alloc_value(0, PAGE, PAGE, 1))
    drive(MECHANISM, s, "deallocate", handle=a)
    b = drive(MECHANISM, s, "allocate", size=PAGE, value=alloc_value(0, PAGE, PAGE, 2))  # same address
    outs = MECHANISM.action("deallocate").step(s, handle=a)
    assert outs.match(None, StaleHandle("stale")) is not None
    assert outs.match(PAGE) is None, "freeing the newer allocation through the stale handle must not be allowed"
    assert "newer allocation" in outs.describe() and outs.blame == "S14"
    assert s.allocations[b].live


def test_reserve_takes_no_physical_and_rounds():
    s = fresh()
    assert [b.error for b in MECHANISM.action("reserve").step(s, size=0).branches] == [InvalidRequest]
    va = VirtualAllocation(1 << 20, 2 * PAGE, Identity("impl-va", 1), DEV)
    assert not permits(MECHANISM, s, "reserve", size=PAGE + 1, value=VirtualAllocation(1 << 20, PAGE, Identity("i", 1), DEV))
    r = drive(MECHANISM, s, "reserve", size=PAGE + 1, value=va)
    assert s.reservations[r].size == 2 * PAGE and s.physical == 0


def _reserved(s, pages=4):
    return drive(MECHANISM, s, "reserve", size=pages * PAGE)


def test_commit_range_exact_and_no_silent_noop():
    s = fresh()
    r = _reserved(s)
    assert not permits(MECHANISM, s, "commit_range", span=(r, 0, 2 * PAGE), value=0)        # a successful no-op
    assert not permits(MECHANISM, s, "commit_range", span=(r, 0, 2 * PAGE), value=PAGE)
    drive(MECHANISM, s, "commit_range", span=(r, 0, 2 * PAGE), value=2 * PAGE)
    assert s.physical == 2 * PAGE
    ok(s)


@pytest.mark.parametrize("span", [(PAGE // 2, PAGE), (0, 0), (2 * PAGE, PAGE), (0, 5 * PAGE), (0, PAGE)])
def test_commit_range_invalid_ranges(span):
    s = fresh()
    r = _reserved(s)
    drive(MECHANISM, s, "commit_range", span=(r, 0, PAGE))  # so (0, PAGE) is already committed
    outs = MECHANISM.action("commit_range").step(s, span=(r, *span))
    assert [b.error for b in outs.branches] == [InvalidRange]


def test_commit_range_oom_exactly_at_capacity():
    s = fresh()
    r = drive(MECHANISM, s, "reserve", size=CAP + 2 * PAGE, value=VirtualAllocation(0, CAP + 2 * PAGE, Identity("i", 1), DEV))
    fits = MECHANISM.action("commit_range").step(s, span=(r, 0, CAP))
    assert fits.match(None, OutOfMemory("x")) is None and fits.match(CAP) is not None
    over = MECHANISM.action("commit_range").step(s, span=(r, 0, CAP + PAGE))
    assert [b.error for b in over.branches] == [OutOfMemory]


def test_decommit_committed_bytes_and_release():
    s = fresh()
    r = _reserved(s)
    assert [b.error for b in MECHANISM.action("decommit_range").step(s, span=(r, 0, PAGE)).branches] == [InvalidRange]
    drive(MECHANISM, s, "commit_range", span=(r, 0, 3 * PAGE))
    drive(MECHANISM, s, "decommit_range", span=(r, PAGE, 2 * PAGE), value=PAGE)
    assert permits(MECHANISM, s, "committed_bytes", reservation=r, value=2 * PAGE)
    assert not permits(MECHANISM, s, "committed_bytes", reservation=r, value=3 * PAGE)
    drive(MECHANISM, s, "release_reservation", reservation=r, value=2 * PAGE)
    assert s.physical == 0
    again = MECHANISM.action("release_reservation").step(s, reservation=r)
    assert {b.error for b in again.branches} == {DoubleFree, StaleHandle}
    stale = MECHANISM.action("commit_range").step(s, span=(r, 0, PAGE))
    assert {b.error for b in stale.branches} == {DoubleFree, StaleHandle}
    ok(s)


def test_foreign_reservation_is_refused():
    s = fresh()
    f = drive(MECHANISM, s, "reserve_foreign", size=2 * PAGE)
    for name, args in [("commit_range", {"span": (f, 0, PAGE)}), ("committed_bytes", {"reservation": f}),
                       ("release_reservation", {"reservation": f})]:
        assert [b.error for b in MECHANISM.action(name).step(s, **args).branches] == [ForeignAllocation]


def test_shared_mapping_lifetime_and_counts():
    s = fresh(vb=False)
    assert {b.error for b in MECHANISM.action("create").step(s, size=PAGE + 1).branches} == {InvalidRequest, InvalidRange}
    h = drive(MECHANISM, s, "create", size=PAGE, value=PhysicalHandle(PAGE, Identity("p", 1), DEV))
    a = drive(MECHANISM, s, "shared_reserve", size=2 * PAGE)
    b = drive(MECHANISM, s, "shared_reserve", size=2 * PAGE)
    m1 = drive(MECHANISM, s, "map", handle=h, place=(a, 0), read_only=True, value=PAGE)
    m2 = drive(MECHANISM, s, "map", handle=h, place=(b, PAGE), read_only=False, value=PAGE)
    assert s.physical == PAGE, "shared pages are taken once"
    assert [x.error for x in MECHANISM.action("map").step(s, handle=h, place=(a, 0), read_only=True).branches] == [InvalidRange]
    assert permits(MECHANISM, s, "mapping_count", handle=h, value=2)
    drive(MECHANISM, s, "release_handle", handle=h, value=0)  # still mapped: nothing freed
    assert [x.error for x in MECHANISM.action("map").step(s, handle=h, place=(a, PAGE), read_only=True).branches] == [StaleHandle]
    assert [x.error for x in MECHANISM.action("free_shared_reservation").step(s, reservation=a).branches] == [InvalidRange]
    drive(MECHANISM, s, "unmap", mapping=(m1, a, 0, PAGE), value=PAGE)
    assert s.physical == PAGE
    bad = MECHANISM.action("unmap").step(s, mapping=(m2, b, PAGE, 2 * PAGE))
    assert [x.error for x in bad.branches] == [InvalidRange]
    drive(MECHANISM, s, "unmap", mapping=(m2, b, PAGE, PAGE), value=PAGE)
    assert s.physical == 0 and s.handles[h].freed, "freed after the last unmap and the release"
    assert {x.error for x in MECHANISM.action("mapping_count").step(s, handle=h).branches} == {StaleHandle, DoubleFree}
    drive(MECHANISM, s, "free_shared_reservation", reservation=a, value=None)
    ok(s)


def test_read_only_write_rejected_and_copy_on_write():
    s = fresh(vb=False)
    h = drive(MECHANISM, s, "create", size=PAGE)
    a = drive(MECHANISM, s, "shared_reserve", size=PAGE)
    m = drive(MECHANISM, s, "map", handle=h, place=(a, 0), read_only=True)
    w = MECHANISM.action("write_through").step(s, mapping=(m, a, 0, PAGE))
    assert {b.error for b in w.branches} == {ReadOnlyViolation, DeviceFault} and w.match(None) is None
    assert not permits(MECHANISM, s, "copy_on_write", mapping=(m, a, 0, PAGE), value=0)
    drive(MECHANISM, s, "copy_on_write", mapping=(m, a, 0, PAGE), value=PAGE)
    assert s.physical == 2 * PAGE and s.handles[h].mappings == 0
    assert permits(MECHANISM, s, "write_through", mapping=(m, a, 0, PAGE), value=None)
    drive(MECHANISM, s, "release_handle", handle=h, value=PAGE)  # no mapping left: freed now
    assert s.physical == PAGE
    ok(s)
