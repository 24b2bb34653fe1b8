"""No PASS on nothing (issue 31, item 4): for every row of both catalogs,
at every level, a run whose witness never happened reads UNTESTED (or
"—" where the invariant has no action at that level), never PASS.

Each case builds the statistics of a run in which every action of the
machine ran and succeeded plenty, and every witness outcome was seen; that
run is a PASS.  Then the row's evidence is taken away -- its explicit
witness outcome (``Invariant.witnesses``), or else the successes of one
action that declares it -- and the same row must read UNTESTED, naming what
is missing.  The verdict code is the one the report uses
(:class:`~memspec.invariants.results.PlanResult`)."""

from __future__ import annotations


import pytest

from memspec.invariants import engine as E
from memspec.invariants.results import PlanInfo, PlanResult
from memspec.spec.caching import CACHING
from memspec.spec.mechanism import MECHANISM
from memspec.spec.system import SYSTEM

N = 50
MACHINES = {"mechanism": MECHANISM, "system": SYSTEM, "caching": CACHING}
CASES = [(lvl, inv.id) for lvl, m in MACHINES.items() for inv in m.invariants]


def _plan(level: str) -> tuple:
    m = MACHINES[level]
    plan = E.Plan("t", level, None, m, {}, list(m.actions), list(m.observations), {}, {}, None,
                  start_checks=list(m.start_checks))
    declares = {inv.id: [a.name for a in m.actions if inv.id in a.invariants] for inv in m.invariants}
    names = {a.name for a in m.actions}
    wit = {inv.id: [[w.action, w.outcome, w.describe] for w in inv.witnesses if w.action in names]
           for inv in m.invariants if inv.witnesses}
    from memspec.invariants.results import not_at_level

    info = PlanInfo("t", level, [(i.id, i.title) for i in m.invariants], {}, {}, [a.name for a in m.actions],
                    5.0, {}, None, declares=declares, witnesses=wit, absent=sorted(not_at_level(plan)))
    return m, info


def _full_stats(m) -> E.Stats:
    st = E.Stats(examples=N, steps=N * len(m.actions))
    for a in m.actions:
        st.actions[a.name] = N
        st.accepted[a.name] = N
        st.offered[a.name] = N
        st.outcomes[(a.name, "returns something")] = N
    for inv in m.invariants:
        for w in inv.witnesses:
            st.outcomes[(w.action, f"returns {w.outcome}" if not w.outcome.startswith(("returns", "raises"))
                         else w.outcome)] += N
    return st


def _row(info: PlanInfo, inv: str) -> tuple:
    res = PlanResult("t", info.level, info)
    return next(r for r in res.rows() if r[0] == inv)


@pytest.mark.parametrize("level,inv", CASES)
def test_a_row_without_its_witness_is_untested_not_pass(level, inv):
    m, info = _plan(level)
    info.stats = _full_stats(m)
    before = _row(info, inv)
    if inv in info.absent:
        assert before[2] == "\u2014", before   # not part of this level: never PASS
        return
    assert before[2] == "PASS", before
    assert before[3].startswith("rests on: "), before
    witnesses = info.witnesses.get(inv)
    st = info.stats
    if witnesses:
        for action, outcome, _d in witnesses:
            for key in [k for k in st.outcomes if k[0] == action and outcome in k[1]]:
                del st.outcomes[key]
        after = _row(info, inv)
        assert after[2] == "UNTESTED" and "witness missing" in after[3], after
    else:
        declaring = info.declares.get(inv) or []
        if not declaring:   # checked after every step: no step ran is what takes its evidence away
            info.stats = E.Stats()
            after = _row(info, inv)
            assert after[2] == "UNTESTED", after
            return
        st.accepted[declaring[0]] = 0
        after = _row(info, inv)
        assert after[2] == "UNTESTED" and declaring[0] in after[3], after


def test_the_named_witnesses_exist():
    """The rows the issue names carry the witness it names."""
    by = {inv.id: inv for m in MACHINES.values() for inv in m.invariants}
    assert [w.action for w in by["C6"].witnesses] == ["empty_cache"]
    assert [w.outcome for w in by["C9"].witnesses] == ["OutOfMemory"]
    assert [w.action for w in by["S15"].witnesses] == ["claim"]
    assert [w.action for w in by["S9"].witnesses] == ["kv_grow"]


def test_an_empty_cache_that_released_nothing_is_no_witness_of_c6():
    from memspec.invariants.engine import _kind_of_outcome

    assert "bytes released" not in _kind_of_outcome("returns 0 (nothing fully free to release)")
    assert "bytes released" in _kind_of_outcome("returns 2097152 (bytes released)")
