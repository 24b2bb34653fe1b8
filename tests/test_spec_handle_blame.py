"""A call on a reservation whose handle must be refused is blamed on the
handle's rule, whatever the call: another instance's reservation on S1
(*creator-only*), a released one on S14 (*a stale handle is rejected even
if its address was reused*); the call's own rule (S5 for a commit) only
when the handle is good.  (Found by a planted bug written for the purpose:
a VirtualBacking that matched a stale handle by address and size committed
into the newer reservation, and was blamed S5.)"""

from __future__ import annotations

import pytest

from memspec.spec import mechanism, shared, vmm
from memspec.spec.state import MechReservation

MiB = 1 << 20


def _state_with(**flags):
    s = mechanism.init(capacity=64 * MiB, page=2 * MiB, virtual_backing=True, shared_mapping=True)
    r = MechReservation(ref=7, kind="backing", address=1 << 40, size=8 * MiB, identity=object(), **flags)
    s.reservations[7] = r
    return s


@pytest.mark.parametrize("flags, rule", [({"live": False}, "S14"), ({"foreign": True}, "S1"), ({}, "S5")])
def test_commit_decommit_and_committed_bytes_blame_the_handle_rule(flags, rule):
    s = _state_with(**flags)
    if not flags:
        s.reservations[7].committed.add(1)   # so that the decommit below is legal
    assert vmm.commit_range.step(s, span=(7, 0, 2 * MiB)).blame == rule
    assert vmm.decommit_range.step(s, span=(7, 2 * MiB, 4 * MiB)).blame == rule
    assert vmm.committed_bytes.step(s, reservation=7).blame == rule


def test_a_misaligned_commit_on_a_good_handle_stays_the_calls_rule():
    outs = vmm.commit_range.step(_state_with(), span=(7, 1, 2 * MiB))
    assert outs.blame == "S5" and "InvalidRange" in outs.describe()


def test_releasing_a_foreign_reservation_is_s1_a_released_one_s14():
    assert vmm.release_reservation.step(_state_with(foreign=True), reservation=7).blame == "S1"
    assert vmm.release_reservation.step(_state_with(live=False), reservation=7).blame == "S14"
    s = _state_with(live=False)
    s.reservations[7].kind = "shared"
    assert shared.free_shared_reservation.step(s, reservation=7).blame == "S14"
