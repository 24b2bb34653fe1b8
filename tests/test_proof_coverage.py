"""Proof coverage derived from what the spec writes (issue 33, item 1: :mod:`memspec.invariants.formal.coverage`).

The write sets come from seeded spec-only walks, the read sets from the executable invariants on a
recording proxy; a row's required actions are the writers of what its invariant reads, and a gap (a
required action its machine does not encode) fails the row unless it is a reviewed KNOWN_GAPS line."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from memspec.invariants.formal import coverage as F
from memspec.invariants.formal import proofs_seed000 as E
from memspec.invariants.formal.proofs import Act
from memspec.invariants.formal.proofs_catalog import all_proofs


@pytest.fixture(scope="module")
def fp() -> F.Footprints:
    return F.footprints()


def _proof(row: str) -> Any:
    return next(p for p in all_proofs() if p.id == row)


def _writes(fp: F.Footprints, level: str, action: str, branch_starts: str) -> set[str]:
    out: set[str] = set()
    for (lvl, act, br), ws in fp.writes.items():
        if lvl == level and act == action and br.startswith(branch_starts):
            out |= {F.field_name(w) for w in ws}
    return out


def test_deallocate_writes_what_it_frees(fp: F.Footprints) -> None:
    """spec/eager.py ``_free_allocation``: the record goes dead, its bytes leave eager_bytes and physical,
    its address leaves by_address; no reservation or shared figure moves."""
    w = _writes(fp, "mechanism", "deallocate", "returns")
    assert {"MechAllocation.live", "MechState.eager_bytes", "MechState.physical", "MechState.by_address",
            "MechState.live_count"} <= w, w
    assert not w & {"MechState.committed_bytes", "MechState.shared_bytes", "MechState.private_bytes"}, w
    # a refusal writes nothing
    assert _writes(fp, "mechanism", "deallocate", "raises") == set()


def test_drop_queues_and_refunds_nothing(fp: F.Footprints) -> None:
    """spec/manager.py ``drop_owned``: the object is queued (its live bytes become queued refunds, per
    holder) and no charge moves until the queue runs it (S7)."""
    w = _writes(fp, "system", "drop", "returns")
    assert {"Owned.state", "SysState.queue", "SysState.live_bytes_by[session]",
            "SysState.queued_bytes_by[session]"} <= w, w
    assert not any(f.startswith(("SysState.charged", "SysState.free", "SysState.physical_by")) for f in w), w
    # the queue's run is where the charge is refunded and the physical bytes go
    assert {"SysState.charged_by[session]", "SysState.free", "SysState.physical_by[session]"} <= _writes(
        fp, "system", "poll", "returns"), _writes(fp, "system", "poll", "returns")


def test_s11_reads_the_ledger_and_s9_one_holders_key(fp: F.Footprints) -> None:
    s11 = {F.field_name(r) for r in fp.reads["S11"]}
    assert {"SysState.free", "SysState.granted", "SysState.charged", "SysState.charged_by", "SysState.capacity",
            "MechState.physical"} <= s11, s11
    # S9 reads the KV store's key of the holder ledgers only: another holder's charge is not its business
    s9 = {F.field_name(r) for r in fp.reads["S9"]}
    assert "SysState.charged_by[kv]" in s9 and "SysState.charged_by" not in s9, s9
    assert "SysState.charged_by[session]" not in s9


def test_record_counters_have_static_writers(fp: F.Footprints) -> None:
    """premature_frees is written only on an answer the spec forbids (a release run with a fence not
    done): no walk writes it, the static search finds the actions whose code can."""
    assert not any(("SysState.premature_frees", None) in ws for k, ws in fp.writes.items() if k[2] != F.FORBIDDEN)
    assert {"system:poll", "system:respond"} <= set(fp.static["SysState.premature_frees"])
    assert "system:drop" not in fp.static["SysState.premature_frees"]
    # the reviewed static over-approximations are set aside, each still reported by the search
    assert F.static_problems(fp) == []
    assert ("SysState.governor_evictions", "system:unload_weight") in fp.static_excluded


def test_every_row_is_covered_or_a_reviewed_gap(fp: F.Footprints) -> None:
    """On the project as it is: no unexplained gap, no stale KNOWN_GAPS line, no bad table line."""
    assert F.table_problems([p.id for p in all_proofs()]) == []
    for p in all_proofs():
        cov = F.row_coverage(p, fp)
        assert cov.problems == [], (p.id, cov.problems)
        assert cov.required, f"{p.id}: no spec action writes what it reads?"


def test_dropping_an_encodes_entry_names_the_action(fp: F.Footprints, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENCODES["S4"]["poll"] emptied: S4's machine no longer stands for system:poll, which writes
    premature_frees: the coverage check names the action and the field."""
    before = F.row_coverage(E.S4, fp).problems   # (a stale KNOWN_GAPS line shows here too: not this test's)
    assert not any("system:poll" in w for w in before)
    monkeypatch.setitem(E.ENCODES["S4"], "poll", ())
    try:
        E._annotate()
        cov = F.row_coverage(E.S4, fp)
    finally:
        monkeypatch.undo()
        E._annotate()
    assert [g.action for g in cov.unexplained] == ["system:poll"], cov.problems
    assert "system:poll writes SysState.premature_frees, which S4 reads" in cov.problems[0]
    assert F.row_coverage(E.S4, fp).problems == before   # restored


def test_dropping_an_encoded_action_fails_the_row_in_prove(fp: F.Footprints) -> None:
    from memspec.commands import prove as P

    p = _proof("S11")
    broken = replace(p, actions=[a for a in p.actions if a.name != "m_deallocate"])
    fields = P._coverage_fields(broken, fp)
    assert any("mechanism:deallocate writes MechState.physical" in w for w in fields["_coverage_problems"])
    rec = {"status": "proved", "assumed": [], "declared_actions": [], "encoded_actions": [],
           "invariant_agreement": {"samples": 1, "disagreements": 0}, "transition_agreement": {"a": {"ok": 1}},
           "unguarded": {"refuted": True, "named_invariant_violated": True}, "bounded": None, **fields}
    assert not P._verdict(dict(rec))["proved"]
    ok = dict(rec, **P._coverage_fields(p, fp))
    assert P._verdict(ok)["proved"]


def _a_reviewed_gap(fp: F.Footprints) -> tuple[str, str]:
    """The first KNOWN_GAPS line that is a gap of its row's machine now."""
    for row, action, _why in F.KNOWN_GAPS:
        if action in F.row_coverage(_proof(row), fp).uncovered:
            return row, action
    pytest.skip("no reviewed gap left")


def test_a_reviewed_gap_is_partial_and_not_accepted(fp: F.Footprints) -> None:
    from memspec.commands import prove as P

    row, action = _a_reviewed_gap(fp)
    fields = P._coverage_fields(_proof(row), fp)
    assert action in fields["uncovered"] and not [w for w in fields["_coverage_problems"] if action in w]
    data = {"invariants": {row: {"uncovered": fields["uncovered"]}}}
    assert any(b.startswith(f"{row}: not covered: ") and action in b for b in P.check_acceptance(data, ids=(row,)))


def test_a_stale_known_gap_names_its_line(fp: F.Footprints) -> None:
    """A KNOWN_GAPS line whose action the row's machine now encodes is stale: the row fails, naming the
    line of invariants/formal/coverage.py to delete."""
    row, action = _a_reviewed_gap(fp)
    p = _proof(row)
    closed = replace(p, actions=p.actions + [Act("closing", {}, p.actions[0].step, spec=(action,))])
    cov = F.row_coverage(closed, fp)
    line = F.known_gap_line(row, action)
    assert line is not None
    assert any(f"STALE known gap: ({row!r}, {action!r})" in w and f"invariants/formal/coverage.py:{line}" in w
               for w in cov.problems), cov.problems
    # a line naming an action the row's invariant does not depend on at all is stale too
    extra = F.KNOWN_GAPS + (("S3", "system:synchronize", "nothing"),)
    assert any("STALE known gap: ('S3', 'system:synchronize')" in w
               for w in F.row_coverage(_proof("S3"), fp, known=extra).problems)
    assert F.table_problems(["S3"], known=(("S3", "system:no_such", "x"),)) != []


def test_unreached_branches_and_actions_are_reported() -> None:
    """An action that is never available, and a branch with no witness (a spec-only walk cannot take
    it), are listed as unreached: what the walks could not see is visible."""
    from memspec.spec.core import Action, outcomes
    from memspec.spec.core import Returns as R
    from memspec.spec.errors import OutOfMemory
    from memspec.spec.core import Raises
    from memspec.spec.system import SYSTEM

    def never(s: Any) -> Any:
        return outcomes(R("never", then=lambda v: None, witness=lambda: None), blame="S2")

    def no_witness(s: Any) -> Any:
        return outcomes(R("only with an implementation", then=lambda v: None), Raises(OutOfMemory, "full"),
                        blame="S2")

    mach = replace(SYSTEM, actions=[a for a in SYSTEM.actions if a.name in ("allocate_owned", "drop")] + [
        Action("never", "t", "", {}, never, lambda sut: None, enabled=lambda s: False),
        Action("no_witness", "t", "", {}, no_witness, lambda sut: None)])
    walk = F.Walk("planted", "system", dict(capacity=16 * 4096, page=4096, virtual_backing=True, shared_mapping=True),
                  steps=120)
    got = F.derive(walks=(walk,), machines={"system": mach})
    assert "system:never" in got.unreached
    assert "system:no_witness / returns only with an implementation" in got.unreached
    assert "system:no_witness / raises OutOfMemory (full)" not in got.unreached
    assert got.taken[("system", "no_witness", "raises OutOfMemory (full)")] > 0


def test_an_undeclared_spec_writer_is_named() -> None:
    """A spec action no ENCODES names that lowers the session's charge (what S2 reads): derived
    coverage names it (the self-test's planted spec bug)."""
    from memspec.invariants.formal import proofs_selftest as T

    before = T.detect_coverage(_proof("S2"))   # None, or a stale KNOWN_GAPS line (not this test's)
    assert before is None or "refund_forgetting_physical" not in before
    with T._undeclared_refund():
        caught = T.detect_coverage(_proof("S2"))
    assert caught is not None and "system:refund_forgetting_physical writes SysState.charged_by[session]" in caught
    assert T.detect_coverage(_proof("S2")) == before


def test_the_derivation_is_seeded() -> None:
    a, b = F.derive(scale=0.05), F.derive(scale=0.05)
    assert a.writes == b.writes and a.reads == b.reads and a.taken == b.taken
