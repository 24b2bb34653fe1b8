"""CrossHair on the spec kernels: contracts hold, spec and reference kernels
behave the same, and both checks can fail (a planted bug is caught)."""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memspec.invariants.formal.contracts import check_module, diff_pair, run_contracts
from memspec.invariants.formal.contracts_pairs import all_pairs
from memspec.spec import kernels as K


@pytest.mark.slow
def test_crosshair_check_and_diffbehavior_find_nothing() -> None:
    rep = run_contracts(per_condition_timeout=2.0, diff_timeout=4.0, jobs=2)
    checked = {r.target for r in rep.rows if r.kind == "check"}
    assert {"kernels.round_up", "kernels.grant", "kernels.commit_grant", "kernels.refund"} <= checked
    pairs, _ = all_pairs()
    assert {r.target for r in rep.rows if r.kind == "diff"} == {p[0] for p in pairs}
    bad = [f"{r.kind} {r.target}: {r.detail}" for r in rep.rows if not r.ok]
    assert not bad, bad


def test_crosshair_check_catches_a_broken_contract(tmp_path, monkeypatch) -> None:
    (tmp_path / "kmutant.py").write_text(textwrap.dedent('''
        def round_up(n: int, page: int) -> int:
            """
            pre: page > 0
            pre: n >= 0
            post: __return__ >= n
            post: __return__ % page == 0
            post: __return__ - n < page
            """
            return (n // page + 1) * page
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    rows = check_module("kmutant", per_condition_timeout=2.0, timeout=60)
    assert [r.target for r in rows] == ["kmutant.round_up"]
    assert not rows[0].ok and "round_up" in rows[0].detail and rows[0].verdict == "counterexample"


def test_diffbehavior_catches_a_different_twin() -> None:
    row = diff_pair("mutant", "memspec.invariants.formal.contracts_pairs.spec_round_up",
                    "memspec.invariants.formal.contracts_pairs.mutant_round_up", per_condition_timeout=4.0)
    assert not row.ok and row.verdict == "different", (row.verdict, row.detail)


# The kernels' own properties, run on Hypothesis' CrossHair backend (symbolic
# execution picks the inputs instead of random generation).
SYMBOLIC = settings(backend="crosshair", max_examples=30, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


@SYMBOLIC
@given(st.integers(min_value=0), st.integers(min_value=1))
def test_round_up_properties_on_crosshair_backend(n: int, page: int) -> None:
    r = K.round_up(n, page)
    assert r >= n and r % page == 0 and r - n < page
    assert K.round_down(n, page) <= n < K.round_down(n, page) + page
    assert K.mod(r, page) == 0


@SYMBOLIC
@given(st.integers(min_value=0), st.integers(min_value=0), st.integers(min_value=0),
       st.integers(min_value=1), st.integers(min_value=0))
def test_ledger_transaction_conserves_capacity_on_crosshair_backend(free: int, granted: int, charged: int,
                                                                    n: int, actual: int) -> None:
    l = K.Ledger(free + granted + charged, free, granted, charged)
    if not K.can_grant(l, n):
        assert n > free
        return
    g = K.grant(l, n)
    assert K.ledger_ok(g)
    after = K.commit_grant(g, n, actual) if K.can_commit(g, n, actual) else K.cancel_grant(g, n)
    assert K.ledger_ok(after)
    assert after.granted == granted
    if K.can_commit(g, n, actual):
        assert after.charged == charged + actual
        assert K.ledger_ok(K.refund(after, actual)) and K.refund(after, actual).free == free
    else:
        assert after == l


def test_a_killed_crosshair_run_is_a_timeout_not_a_verdict(tmp_path, monkeypatch) -> None:
    """A CrossHair process killed at the wall-clock limit has shown nothing:
    its rows say ``timeout`` (not clean, not counterexample), for a module
    check and for a diff pair alike."""
    import memspec.invariants.formal.contracts as c

    (tmp_path / "kfine.py").write_text(textwrap.dedent('''
        def ident(n: int) -> int:
            """
            post: __return__ == n
            """
            return n
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(c, "_run", lambda args, timeout: (124, f"timed out after {timeout}s\n", float(timeout)))
    rows = c.check_module("kfine", per_condition_timeout=2.0, timeout=7)
    assert [(r.target, r.ok, r.verdict) for r in rows] == [("kfine.ident", False, "timeout")]
    assert "7s" in rows[0].detail
    row = c.diff_pair("p", "a.f", "b.f", timeout=9)
    assert (row.ok, row.verdict) == (False, "timeout")


def test_finished_rows_carry_their_verdict(tmp_path, monkeypatch) -> None:
    (tmp_path / "kfine2.py").write_text(textwrap.dedent('''
        def ident(n: int) -> int:
            """
            post: __return__ == n
            """
            return n
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    rows = check_module("kfine2", per_condition_timeout=1.0, timeout=300)
    assert [(r.ok, r.verdict) for r in rows] == [(True, "clean")]


def test_crosshair_runs_the_pure_python_modules_even_with_the_native_build_enabled(monkeypatch) -> None:
    """CrossHair executes the modules on symbolic values; a mypyc build takes
    none (with ``MEMSPEC_NATIVE=1`` every caching diff said DIFFERENT): its
    subprocesses never get the switch."""
    import subprocess

    from memspec import native
    from memspec.invariants.formal import contracts

    seen: dict = {}

    def fake_run(cmd, **kw):
        seen["env"] = kw["env"]
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setenv(native.ENV, "1")
    monkeypatch.setattr(contracts.subprocess, "run", fake_run)
    contracts._run(["check", "x"], 5.0)
    assert native.ENV not in seen["env"] and seen["env"]["PYTHONHASHSEED"] == "0"
    assert contracts.NATIVE_ENV == native.ENV
