"""Z3-synthesized traces replayed against targets (``memspec conform --corpus``)."""

from __future__ import annotations

from memspec.invariants.corpus import CorpusTrace, build_corpus, replay
from memspec.spec.api import MiB


def test_corpus_holds_a_z3_fragmentation_oom_per_preset() -> None:
    corpus = build_corpus()
    assert {t.preset for t in corpus} == {"pytorch", "seed"}
    for t in corpus:
        assert t.steps[-1][0] == "malloc" and t.expect == "OutOfMemory"


def test_reference_targets_take_the_spec_branch_and_reach_the_oom() -> None:
    corpus = {t.preset: t for t in build_corpus()}
    for target, preset in (("reference-caching", "pytorch"), ("reference-caching-seed", "seed")):
        r = replay(target, corpus[preset])
        assert r.ok, r.detail
        assert "ends OutOfMemory" in r.detail and r.branches[-1][1].startswith("raises OutOfMemory")


def test_a_target_that_leaves_the_spec_branch_fails() -> None:
    trace = CorpusTrace("oom", "hand-made", "pytorch", [("malloc", {"size": 40 * MiB, "stream": 0}),
                                                        ("malloc", {"size": 40 * MiB, "stream": 0})],
                        "OutOfMemory", capacity=64 * MiB)
    r = replay("mutant:caching-wrong-oom-figures", trace)
    assert not r.ok and "C9" in r.detail and r.status == "FAIL"


def test_a_permitted_end_other_than_the_synthesized_one_is_untested_not_fail() -> None:
    """Every answer the spec permits, but the trace does not end on the outcome it was made for (here a
    trace that claims an OOM where one 40 MiB malloc on a 64 MiB device succeeds): no verdict, not FAIL."""
    trace = CorpusTrace("oom?", "hand-made", "pytorch", [("malloc", {"size": 40 * MiB, "stream": 0})],
                        "OutOfMemory", capacity=64 * MiB)
    r = replay("reference-caching", trace)
    assert not r.ok and r.status == "UNTESTED" and "which the spec permits" in r.detail, (r.status, r.detail)


# -- seed 000: a Z3-driven trace per encoded branch and unguarded variant -------

import pytest  # noqa: E402

from memspec.invariants import corpus as C  # noqa: E402


@pytest.fixture(scope="module")
def seed000() -> tuple[list, list]:
    return C.build_seed000(steps=800)


def test_goals_come_from_the_encodings_that_exist_now() -> None:
    from memspec.invariants.formal.proofs import branches
    from memspec.invariants.formal.proofs_catalog import all_proofs

    gs = C.goals()
    p = {x.id: x for x in all_proofs()}["S15"]
    mine = {(g.action, g.branch) for g in gs if g.invariant == "S15" and g.kind == "branch"}
    assert mine == {(a.name, b) for a in p.actions for b in branches(p, a)}
    assert any(g.kind == "unguarded" and g.invariant == "G1" for g in gs)
    # every row has its unguarded variant as a goal, a row on a shared machine (S7, S10 on S4's; S6, G1 on
    # S15's) through the adapters that also credit it
    assert {g.invariant for g in gs if g.kind == "unguarded"} == {x.id for x in all_proofs()}


def test_seed000_traces_take_the_spec_branch_on_reference_and_cuda_host(seed000) -> None:
    gs, traces = seed000
    assert len(traces) >= 40 and {t.goal.level for t in traces} == {"mechanism", "system"}
    assert sum(1 for t in traces if t.goal.kind == "unguarded") >= 3
    for t in traces:  # each trace ends on the goal: the encoding's branch, the reference's matching outcome
        assert t.encoded == t.goal.branch or t.goal.kind == "unguarded"
    for target in ("reference", "cuda-host"):
        bad = [(r.trace.goal.name, r.detail) for r in (C.replay_seed000(target, t) for t in traces) if not r.ok]
        assert not bad, (target, bad[:3])


def test_a_target_that_leaves_the_spec_branch_fails_a_seed000_trace(seed000) -> None:
    _gs, traces = seed000
    cancels = [t for t in traces if t.goal.spec_action == "cancel" and t.expect == "ok"]
    assert cancels  # a grant cancelled: the trace Z3's S11 branch "cancel ok" drives
    reps = [C.replay_seed000("mutant:cancel-leaks-grant", t) for t in cancels]
    assert all(not r.ok and "S11" in r.detail for r in reps), [r.detail for r in reps]


def test_a_target_with_other_capabilities_gets_no_false_fail_from_the_seed000_corpus(capsys) -> None:
    """reference-eager declines reservations and KV caches (Unsupported, which the spec permits): the
    reference's traces through them are N/A on it, never FAIL, and never a crash (a later step naming a
    KV cache it never opened raised SpecError and took the whole command down); the goals it can reach
    are realized on it and PASS."""
    rc = C.main(["reference-eager"], steps=800)
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("reference-eager ")]
    assert rc == 0, out[-2000:]
    assert rows and not any(" FAIL " in ln for ln in rows), rows[:5]
    na = [ln for ln in rows if " N/A " in ln]
    assert na and all("Unsupported" in ln or "a role it lacks" in ln for ln in na), na[:3]
    (summary,) = [ln for ln in out.splitlines() if ln.startswith("seed-000 corpus:")]
    passed = int(summary.split(": ")[-1].split("/")[0])
    assert passed >= 50 and "N/A" in summary, summary
