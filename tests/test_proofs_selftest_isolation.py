"""``memspec prove --self-test`` judges each break as if it were planted alone.

A whole run once missed row 23 (S13's eager shared free), which is caught
when planted alone: the modules earlier detectors had imported changed
Hypothesis's pool of local constants, hence the spec-check's seeded walks.
Every baseline and every break now runs in a process of its own (forked
before any ran), and the spec-check's seeded runs use no example database.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import pytest

from memspec.invariants.formal import proofs_selftest as T
from memspec.spec.caching import policy as Pol


def _catalog(prefix: str) -> T.Break:
    (b,) = [b for b in T.catalog() if b.name.startswith(prefix)]
    return b


def _leaky_c3() -> T.Break:
    """C3's planted break (no coalescing), whose patch also leaves a second change behind: best fit never
    sees a cached block (``policy._candidates`` answers nothing) and is never restored -- the leak of a
    patched module attribute."""
    c3 = _catalog("C3 spec: freed blocks are not coalesced")

    @contextmanager
    def leaky() -> Iterator[None]:
        Pol._candidates = lambda st, small, stream, r: []  # never restored
        with c3.patch():
            yield

    return T.Break("C3 spec (leaky): freed blocks are not coalesced", "spec", "C3", c3.detectors, patch=leaky)


@pytest.fixture(scope="module")
def known() -> dict:
    """The unbroken project's detector answers, computed by the first run that needs them and reused by the
    next (``run_self_test(known=...)``): they depend only on the project's code."""
    return {}


@pytest.mark.slow
def test_a_break_that_leaks_does_not_mask_the_next(monkeypatch, known) -> None:
    orig = Pol._candidates
    monkeypatch.setattr(Pol, "_candidates", orig)  # restored at teardown whatever the run leaves
    c4 = _catalog("C4 spec: best fit searches both pools")
    # C4's break widens best fit to both pools: after the leak there is no candidate to widen
    rows, problems = T.run_self_test([_leaky_c3(), c4], known=known)
    assert not problems, problems
    for b, caught, _secs in rows:
        assert caught, f"{b.name} was not caught after the first break"
        assert T.names(b, caught), f"{b.name}: {caught}"
    assert Pol._candidates is orig  # the breaks ran in their own processes: nothing leaked here


@pytest.mark.slow
def test_without_isolation_the_leak_changes_the_second_verdict(monkeypatch, known) -> None:
    """The same two breaks in one process: the second is judged on a spec the first left changed (what
    the isolation prevents).  Since every break goes to ``prove``'s caching agreement first, the leak is
    no longer silent -- it is the leak, not C4's own break, that the second row reports -- so the
    check is that the second row's verdict is not the one C4's break gets planted alone."""
    monkeypatch.setattr(Pol, "_candidates", Pol._candidates)
    c4 = _catalog("C4 spec: best fit searches both pools")
    reused = set(T._baseline_keys([c4])) <= set(known)
    (alone,), problems = T.run_self_test([c4], known=known)
    assert not problems, problems
    assert alone[1] and T.names(alone[0], alone[1]), alone
    if reused:   # the baselines an earlier test computed were reused: no baseline process ran
        assert T.LAST_RUN["baselines"] == 0, T.LAST_RUN
    rows, _problems = T.run_self_test([_leaky_c3(), c4], isolate=False, known=known)
    assert rows[0][1] and T.names(rows[0][0], rows[0][1])
    assert rows[1][1] != alone[1], (rows[1][1], alone[1])


@pytest.mark.slow
def test_jobs_do_not_change_the_rows() -> None:
    breaks = [_catalog("C3 spec: freed blocks are not coalesced"), _catalog("C4 spec: best fit searches both pools"),
              _catalog("S10 encoding: allocate does not record its context (no pin)")]
    one, _p1 = T.run_self_test(breaks, jobs=1)
    two, _p2 = T.run_self_test(breaks, jobs=2)
    assert [(b.name, c) for b, c, _s in one] == [(b.name, c) for b, c, _s in two]
    assert all(c for _b, c, _s in one)
    assert T.LAST_RUN["breaks"] > 0  # the CPU of the break processes is counted


def test_spec_check_writes_no_example_database(tmp_path) -> None:
    """A seeded spec-check that fails would save its example under the one key every state machine
    shares, and a later run would replay it first: the self-test's runs use no database."""
    from hypothesis import settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    s13 = _catalog("S4 spec: poll frees regardless of fences")   # a break the seeded spec-check catches
    settings.register_profile("selftest-db-probe", database=DirectoryBasedExampleDatabase(str(tmp_path)))
    previous = settings._current_profile
    settings.load_profile("selftest-db-probe")
    try:
        with s13.patch():
            caught = T.detect_spec_check("system")
    finally:
        settings.load_profile(previous)
    assert caught and "S4" in caught  # caught: the failing example would have been saved
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
