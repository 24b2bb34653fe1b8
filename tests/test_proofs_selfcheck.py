"""``memspec prove`` checks itself (issue 33): each break class is caught by prove's own checks.

Fast: each test runs one proof or one small agreement walk (a few seconds).  The whole catalog,
each break in a process of its own, is ``memspec prove --self-test``.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import z3

from memspec.invariants import proofs as P
from memspec.invariants import proofs_selftest as T
from memspec.invariants.proofs_catalog import all_proofs


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

    from memspec.invariants import agreement_adapters as A
    from memspec.invariants.agreement import walk_and_compare
    from memspec.spec import invariants as SI
    from memspec.spec.system import SYSTEM

    proofs = {p.id: p for p in all_proofs()}
    mine = [a for a in A.SYS_ADAPTERS if a.invariant == "S9"]
    old = SI.BY_ID["S9"]
    lv = SI._sys(lambda s: "planted: always fails")
    SI.BY_ID["S9"] = dataclasses.replace(old, check=lv, levels=lv.levels)
    try:
        reps = walk_and_compare(SYSTEM, A._sys_init, mine, proofs, 5, 1, A._sys_too_big, max_steps=200)
    finally:
        SI.BY_ID["S9"] = old
    assert any(r.exec_violations for r in reps)


def test_solver_budgets_are_rlimit_units_only() -> None:
    from memspec.invariants import proofs_caching_heap as H

    assert not hasattr(H, "QF_WALL_MS")
    for mod in (P, H, *H.PARTS):
        assert 'set("timeout"' not in inspect.getsource(mod)
