"""``memspec prove`` checks itself (issue 33): each break class is caught by prove's own checks.

Fast: each test runs one proof or one small agreement walk (a few seconds).  The whole catalog,
each break in a process of its own, is ``memspec prove --self-test``.
"""

from __future__ import annotations

import pytest

import inspect
from dataclasses import replace

import z3

from memspec.invariants.formal import proofs as P
from memspec.invariants.formal import proofs_selftest as T
from memspec.invariants.formal.proofs_catalog import all_proofs


def _p(i: str):
    return next(p for p in all_proofs() if p.id == i)


def _failing(r) -> list[str]:
    return [c.name for c in r.checks if not c.ok]


def test_unbroken_rows_pass_the_new_checks() -> None:
    for i in ("S2", "S3", "S7", "S10"):
        r = P.prove(_p(i))
        assert r.proved, (i, _failing(r))
        assert any(c.name == "named:implied" for c in r.checks)
        assert r.named_invariant_violated, (i, r.unguarded_violates)


def test_contradictory_helper_is_caught() -> None:
    with T._contradictory_helper():
        r = P.prove(_p("S2"))
    assert not r.proved
    assert any(n.startswith("hyp:") for n in _failing(r))


def test_vacuous_invariant_is_caught() -> None:
    r = P.prove(T._vacuous("S10")())
    assert "named:implied" in _failing(r)


def test_named_rule_that_is_constant_true_is_caught() -> None:
    p = _p("S2")
    r = P.prove(replace(p, named=lambda s, o: z3.BoolVal(True), step_prop=None))
    assert "named:not-trivial" in _failing(r)


def test_weakened_kernel_is_caught() -> None:
    with T._kernel("aligned_footprint", T._footprint_one_page_more(P.K.aligned_footprint))():
        r = P.prove(_p("S2"))
    assert any(n.startswith("kernel:aligned_footprint") for n in _failing(r))


def test_spec_bug_on_an_error_branch_is_caught() -> None:
    assert T.detect_agreement("S9") is None
    with T._grow_refusal_grows():
        caught = T.detect_agreement("S9")
    assert caught and "grow" in caught


def test_named_invariant_violated_is_computed() -> None:
    r3 = P.prove(_p("S3"))            # its unguarded query breaks the step property (the answer)
    assert r3.unguarded_violates == "step property"
    r2 = P.prove(_p("S2"))
    assert r2.unguarded_violates == "named invariant"
    ok, _trace, what = P.refute_unguarded_ex(replace(_p("S2"), unguarded=_p("S2").action("commit_owned")))
    assert not ok and what == ""


def test_executable_invariant_asserted_along_the_walk() -> None:
    import dataclasses

    from memspec.invariants.formal import agreement_adapters as A
    from memspec.invariants.formal.agreement import walk_and_compare
    from memspec.spec import invariants as SI
    from memspec.spec.system import SYSTEM

    proofs = {p.id: p for p in all_proofs()}
    mine = [a for a in A.SYS_ADAPTERS if a.invariant == "S9" or "S9" in a.also]  # S9 rides on the ledger's
    old = SI.BY_ID["S9"]
    lv = SI._sys(lambda s: "planted: always fails")
    SI.BY_ID["S9"] = dataclasses.replace(old, check=lv, levels=lv.levels)
    try:
        reps = walk_and_compare(SYSTEM, A._sys_init, mine, proofs, 5, 1, A._sys_too_big, max_steps=200)
    finally:
        SI.BY_ID["S9"] = old
    assert any(r.exec_violations for r in reps)


def test_solver_budgets_are_rlimit_units_only() -> None:
    from memspec.invariants.formal import proofs_caching_heap as H

    assert not hasattr(H, "QF_WALL_MS")
    for mod in (P, H, *H.PARTS):
        assert 'set("timeout"' not in inspect.getsource(mod)


# --------------------------------------------------------------------------
# a weakened executable check (issue 33): the invariants compared on perturbed states
# --------------------------------------------------------------------------

@pytest.mark.slow
def test_weakened_executable_checks_are_caught() -> None:
    """Each planted weakening of an executable invariant (a conjunct dropped) is caught by the
    agreement's comparison on perturbed states, which is silent on the unbroken spec; none is left
    in ``uncaught()``."""
    breaks = T._exec_weakened_breaks()
    assert len({b.invariant for b in breaks}) >= 3 and not T.uncaught()
    assert all(b.name in {c.name for c in T.catalog()} for b in breaks)
    for b in breaks:
        assert T.detect_agreement(b.invariant) is None, b.invariant
        with b.patch():
            caught = T.detect_agreement(b.invariant)
        assert caught and "invariant strength" in caught and f" {b.invariant} " in caught, (b.name, caught)


def test_a_weakened_check_is_caught_by_prove_rows() -> None:
    """``memspec prove``'s verdict reads the same figures: the row of a weakened S8 is not proved."""
    from memspec.commands.prove import _verdict
    from memspec.invariants.formal.agreement_perturb import strength, strength_problems

    with T._s8_exec_weakened():
        reps = _ledger_walk(samples=40, inv_samples=10)
    st = strength(reps, "S8")
    assert st["executable_weaker"] and strength_problems(st)
    rec = {"status": "proved", "assumed": [], "declared_actions": [], "encoded_actions": [],
           "invariant_agreement": {"samples": 1, "disagreements": 0}, "transition_agreement": {"a": {"ok": 1}},
           "unguarded": {"refuted": True, "named_invariant_violated": True}, "bounded": "",
           "invariant_strength": st}
    assert not _verdict(rec)["proved"] and any("weaker than its encoding" in w for w in rec["_why"])


def _ledger_walk(samples: int, inv_samples: int, seed: int = 1, perturb: int | None = None) -> list:
    from memspec.invariants.formal import agreement_adapters as A
    from memspec.invariants.formal.agreement import walk_and_compare
    from memspec.spec.system import SYSTEM

    proofs = {p.id: p for p in all_proofs()}
    mine = [a for a in A.SYS_ADAPTERS if "S8" in a.also]
    return walk_and_compare(SYSTEM, A._sys_init, mine, proofs, samples, seed, A._sys_too_big, max_steps=3000,
                            inv_samples=inv_samples, perturb=perturb)


def test_perturbations_are_deterministic_and_leave_the_walk_alone() -> None:
    """The perturbed leaves and values depend on the seed only; the walk (samples, branches,
    invariant samples) is the same with or without them; the walker never touches the walked state."""
    from memspec.invariants.formal import agreement_perturb as PT
    from memspec.invariants.formal.agreement_adapters import _sys_init

    st = _sys_init()

    def values(s) -> dict:
        return {p: [PT.read(s, x) for x in xs] for p, xs in PT.leaves(s).items()}

    before = values(st)
    a, b = PT.Perturber(5), PT.Perturber(5)
    picks = [a.pick("S8", st, 4, st.page) for _ in range(6)]
    assert picks == [b.pick("S8", st, 4, st.page) for _ in range(6)]
    pats = [p for ps in picks for p, _path, _v in ps]
    assert len(set(pats)) == len(pats) or len(set(pats)) == len(PT.leaves(st))   # the patterns in turn
    seen = []
    PT.perturbed(st, picks[0], lambda s: None, lambda s: s.granted,
                 lambda pat, where, pr, why: seen.append((pat, where, pr)))
    assert len(seen) == 4 and values(st) == before

    def figures(reps: list) -> list:
        return [(r.invariant, r.action, r.samples, r.inv_samples, sorted(r.branches.items()), r.perturbed,
                 r.perturb_skipped, r.exec_weaker, r.shadowed, sorted(r.enc_weaker.items()), r.exec_rejected)
                for r in reps]

    one, two = _ledger_walk(30, 6), _ledger_walk(30, 6)
    assert figures(one) == figures(two) and sum(r.perturbed for r in one) > 0
    off = _ledger_walk(30, 6, perturb=0)
    assert [f[:5] for f in figures(off)] == [f[:5] for f in figures(one)]
    assert sum(r.perturbed for r in off) == 0


# --------------------------------------------------------------------------
# every break class of issue 33, on more than one row, caught by prove's own checks
# --------------------------------------------------------------------------

#: issue 33's break classes -> the self-test breaks (name prefixes) that plant each, on different rows
CLASSES = {
    "a dropped encoded action": ("S4 encoding: poll dropped", "S15 encoding: expire dropped"),
    "a contradictory helper": ("engine: a contradictory helper", "S13 encoding: a helper lemma",
                               "S15 encoding: a helper lemma"),
    "a vacuous invariant": ("S10 encoding: the inductive invariant is vacuous", "S4 encoding: the named rule is a"),
    "a weakened encoding": ("S10 encoding: allocate does not record", "S8 encoding: commit keeps"),
    "a spec bug on an undeclared writer": ("S2 spec: an undeclared action", "S5 spec: an undeclared mechanism"),
    "a bug on an error branch": ("S9 spec: a refused growth", "S11 spec: a refused reserve"),
    "a weakened executable check": ("S8 spec: the executable S8 drops", "S12 spec: the executable S12 drops"),
    "a weakened kernel": ("S11 kernel: refund returns", "S8 kernel: aligned_footprint"),
}


def test_every_break_class_is_planted_on_two_rows() -> None:
    cat = T.catalog()
    for cls, prefixes in CLASSES.items():
        found = [b for p in prefixes for b in cat if b.name.startswith(p)]
        assert len(found) == len(prefixes), (cls, [p for p in prefixes if not any(b.name.startswith(p) for b in cat)])
        assert len({b.invariant for b in found}) >= 2, cls


def test_every_break_is_put_to_prove_first() -> None:
    """Each break's first detector is one of ``memspec prove``'s own (the spec's stateful test and the
    caching walk are a reported fallback only)."""
    for b in T.catalog():
        assert b.detectors and not T.outside_prove(b.detectors[0]), b.name
        outside = [i for i, d in enumerate(b.detectors) if T.outside_prove(d)]
        assert all(i > j for i in outside for j, d in enumerate(b.detectors) if not T.outside_prove(d)), b.name


def test_contradictory_helper_lemma_is_caught_on_another_row() -> None:
    r = P.prove(T._contradictory_lemma("S15")())
    assert not r.proved and r.assumed
    assert T.detect_prove(T._contradictory_lemma("S15")(), T._failing_checks(_p("S15")))


def test_vacuous_named_rule_is_caught_on_another_row() -> None:
    r = P.prove(T._vacuous_named("S4")())
    assert "named:not-trivial" in _failing(r)


@pytest.mark.slow
def test_error_branch_bug_is_caught_on_another_action() -> None:
    assert T.detect_agreement("S11") is None
    with T._error_branch_mutates("system", "reserve", "GrantDenied", T._refused_reserve_grants)():
        caught = T.detect_agreement("S11")
    assert caught and "reserve" in caught


def test_a_bug_only_the_small_device_walk_reaches_is_caught_as_prove_catches_it() -> None:
    """reserve_owned's OutOfMemory is reached only on the walk on a device of two pages: the self-test's
    agreement detector walks every walk ``memspec prove`` takes for the row, so a bug on that branch is
    caught (the mechanism, system and ticket walks alone, all it walked before, never take the branch)."""
    from memspec.invariants.formal.agreement_adapters import run_all

    with T._error_branch_mutates("system", "reserve_owned", "OutOfMemory", T._refused_reserve_grants)():
        caught = T.detect_agreement("S11")
        main_only = run_all(400, 1, 0, T.DETECT_PER_BRANCH, walks=("mechanism", "system", "tickets"), row="S11",
                            max_steps=20000)
    assert caught and "reserve_owned" in caught, caught
    assert not [r for r in main_only if r.mismatches]
    assert not [r for r in main_only if r.spec_action == "reserve_owned" and r.outcomes.get("OutOfMemory")]


def test_undeclared_mechanism_writer_is_caught_by_coverage() -> None:
    assert T.detect_coverage(_p("S5")) is None
    with T._undeclared_trim():
        caught = T.detect_coverage(_p("S5"))
    assert caught and "trim_private" in caught


def test_self_test_exit_names_survivors_and_catches_outside_prove(monkeypatch, capsys) -> None:
    """``--self-test`` exits non-zero, naming the break, when one survives or only a detector outside
    ``memspec prove`` catches it."""
    a = T.Break("A planted", "spec", "S1", ("agreement",))
    b = T.Break("B planted", "spec", "S1", ("agreement",))
    monkeypatch.setattr(T, "expected_covered", lambda: [])
    monkeypatch.setitem(T.LAST_RUN, "baselines", 0.0)
    monkeypatch.setitem(T.LAST_RUN, "breaks", 0.0)
    for rows, want in ((([(a, "prove: x fails", 0.0), (b, None, 0.0)], {}), "SURVIVED: B planted"),
                       (([(a, "prove: x fails", 0.0), (b, "spec-check: S1 broken", 0.0)], {}),
                        "caught only outside memspec prove: B planted"),
                       (([(a, "prove: x fails", 0.0), (b, "prove/agreement: y", 0.0)], {}), None)):
        monkeypatch.setattr(T, "run_self_test", lambda jobs=1, _r=rows: _r)
        rc = T.main()
        out = capsys.readouterr().out
        assert (rc == 0) == (want is None), out
        assert want is None or want in out


def test_weakened_round_up_is_caught_by_prove_on_s9() -> None:
    """A weakened round_up (the page rounding S9's growth rests on) fails S9's kernel facts."""
    assert P.prove(_p("S9")).proved
    with T._kernel("round_up", T._round_up_short)():
        r = P.prove(_p("S9"))
    assert any(n.startswith("kernel:round_up") for n in _failing(r))
