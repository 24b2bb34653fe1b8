"""Every executable check can fire (issue 13, deliverable 6).

Each record an invariant reads (``misreleased``, ``premature_frees``,
``foreign_frees``, ``readonly_writes``, ``hot_evictions``) is planted here by
the behaviour it exists to catch, and the invariant must report it; the same
scenario on the spec as written must hold.  ``test_poll_ignoring_fences``
is the issue's example: a spec whose ``poll`` frees regardless of fences.
"""

from __future__ import annotations

from typing import Any

import pytest

from memspec.spec import eager as allocation, ep as release, holders, shared as sharing
from memspec.spec.invariants import BY_ID
from memspec.spec.mechanism import MECHANISM
from memspec.spec.ep import queue_snapshot
from memspec.spec.selfcheck import drive
from memspec.spec.state import Seen
from memspec.spec.system import SYSTEM

PAGE = 4096


def sys_state() -> Any:
    return SYSTEM.init(capacity=32 * PAGE, page=PAGE, virtual_backing=True, shared_mapping=True)


def mech_state() -> Any:
    return MECHANISM.init(capacity=16 * PAGE, page=PAGE, virtual_backing=True, shared_mapping=True, ep=True)


def reason(inv: str, s: Any) -> str | None:
    i = BY_ID[inv]
    return i.check(s) or (i.full_check or i.check)(s)


# -- S1 misreleased: the drop queued the installed mechanism, not the creator --

def _s1_scenario() -> Any:
    s = sys_state()
    a = drive(SYSTEM, s, "allocate_owned", size=PAGE)
    drive(SYSTEM, s, "select", mechanism=1)
    drive(SYSTEM, s, "drop", allocation=a)
    pending = queue_snapshot(s)
    drive(SYSTEM, s, "poll", pending=pending, value=Seen(None, {"done": [True] * len(pending), "ran": len(pending)}))
    return s


def test_misreleased_fires_when_the_entry_names_the_installed_mechanism():
    good = _s1_scenario()
    assert reason("S1", good) is None and good.misreleased == 0
    original = release.new_entry

    def wrong_creator(s, what, fences, creator, refund, physical, owned=None, exact=True):
        return original(s, what, fences, s.registry.installed, refund, physical, owned, exact)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(release, "new_entry", wrong_creator)
        bad = _s1_scenario()
    assert bad.misreleased == 1
    assert "other than the creator" in reason("S1", bad)


# -- S4 premature_frees: poll frees regardless of fences -----------------------

def _s4_scenario() -> Any:
    s = sys_state()
    st = drive(SYSTEM, s, "new_stream")
    a = drive(SYSTEM, s, "allocate_owned", size=PAGE)
    drive(SYSTEM, s, "use", allocation=a, stream=st)
    drive(SYSTEM, s, "drop", allocation=a)
    drive(SYSTEM, s, "poll", pending=queue_snapshot(s))  # the witness: the fence is not done, nothing runs
    return s


def test_poll_ignoring_fences():
    good = _s4_scenario()
    assert reason("S4", good) is None and len(good.queue) == 1

    def regardless(s, pending, done):  # learns what was reported, then runs every queued release
        for (seq, fences), flag in zip(pending, done):
            if flag:
                for f in fences:
                    release.learn_done(s, f)
        s.in_poll = True
        try:
            for seq, _f in pending:
                if seq in s.queue:
                    release.run_entry(s, s.queue[seq])
            return len(pending)
        finally:
            s.in_poll = False

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(release, "run_done", regardless)
        bad = _s4_scenario()
    assert bad.premature_frees == 1
    assert "fence" in reason("S4", bad)


def test_poll_that_marks_every_fence_done_before_running_is_caught():
    """A poll that runs every queued release and marks its fences done
    afterwards: the check reads the fences before the run, so it fires."""
    def learn_all(s, pending, done):
        s.in_poll = True
        try:
            for seq, fences in pending:
                if seq in s.queue:
                    release.run_entry(s, s.queue[seq])
                    for f in fences:
                        release.learn_done(s, f)
            return len(pending)
        finally:
            s.in_poll = False

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(release, "run_done", learn_all)
        bad = _s4_scenario()
    assert bad.premature_frees == 1 and reason("S4", bad)


# -- S1 foreign_frees (mechanism level) ---------------------------------------

def test_foreign_frees_fires_when_the_twins_allocation_is_freed():
    s = mech_state()
    own = drive(MECHANISM, s, "allocate", size=PAGE)
    foreign = drive(MECHANISM, s, "allocate_foreign", size=PAGE)
    drive(MECHANISM, s, "deallocate", handle=own)
    assert reason("S1", s) is None and s.foreign_frees == 0
    # what deallocate without its ForeignAllocation guard would do: free it
    allocation._free_allocation(s, foreign, s.allocations[foreign].footprint)
    assert s.foreign_frees == 1
    assert "foreign" in reason("S1", s)


# -- S13 readonly_writes --------------------------------------------------------

def _s13_scenario() -> Any:
    s = mech_state()
    h = drive(MECHANISM, s, "create", size=PAGE)
    r = drive(MECHANISM, s, "shared_reserve", size=2 * PAGE)
    m = drive(MECHANISM, s, "map", handle=h, place=(r, 0), read_only=True)
    return s, (m, r, 0, PAGE)


def test_readonly_writes_fires_when_the_guard_is_removed():
    s, mapping = _s13_scenario()
    from memspec.spec.errors import ReadOnlyViolation

    drive(MECHANISM, s, "write_through", mapping=mapping, error=ReadOnlyViolation)
    assert reason("S13", s) is None and s.readonly_writes == 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sharing, "rejects_writes", lambda m: False)
        s, mapping = _s13_scenario()
        drive(MECHANISM, s, "write_through", mapping=mapping)
    assert s.readonly_writes == 1
    assert "read-only" in reason("S13", s)


# -- S6 hot_evictions ------------------------------------------------------------

def _s6_scenario() -> Any:
    s = sys_state()
    drive(SYSTEM, s, "load_weight", weight=("w0", True, PAGE))
    drive(SYSTEM, s, "load_weight", weight=("w1", False, 2 * PAGE))
    t = drive(SYSTEM, s, "issue_ticket", request=(PAGE, 0, 0))
    drive(SYSTEM, s, "respond", answer=(t, holders.WEIGHTS, False), pending=queue_snapshot(s))
    return s


def test_hot_evictions_fires_when_pressure_takes_a_hot_weight():
    good = _s6_scenario()
    assert reason("S6", good) is None and good.hot_evictions == 0
    with pytest.MonkeyPatch.context() as mp:
        # victims() without its "cold only" guard: the witness's released bytes
        # become every resident weight, hot ones included
        def any_resident(s, released):
            return [w for w in s.weights.values() if w.resident]

        mp.setattr(holders, "victims", any_resident)
        bad = _s6_scenario()
    assert bad.hot_evictions >= 1
    assert "hot" in reason("S6", bad)
