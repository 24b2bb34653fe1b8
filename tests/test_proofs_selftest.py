"""``memspec prove --self-test``: planted breaks are caught, by the rule they break;
a plant that changes nothing is not (the detectors can stay silent)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from memspec.invariants.proofs_selftest import Break, catalog, names, run_self_test


def _pick(*prefixes: str) -> list[Break]:
    out = [b for b in catalog() if b.name.startswith(prefixes)]
    assert len(out) == len(prefixes), [b.name for b in out]
    return out


def test_catalog_has_20_breaks_over_every_seed000_invariant() -> None:
    cat = catalog()
    assert len(cat) >= 20
    from memspec.spec.invariants import IDS

    assert {b.invariant for b in cat} >= set(IDS)
    assert {b.kind for b in cat} == {"encoding", "spec", "kernel", "engine"}   # engine: the prover trusting a hypothesis


@pytest.mark.fresh_process
def test_planted_breaks_are_killed_by_their_rule() -> None:
    breaks = _pick("S10 encoding: allocate does not record its context (no pin)", "S4 spec: poll frees regardless of fences",
                   "S11 kernel: can_grant ignores what is free", "C3 spec: freed blocks are not coalesced")
    rows, problems = run_self_test(breaks)
    assert not problems, problems
    for b, caught, _secs in rows:
        assert caught, f"{b.name} was not caught"
        assert names(b, caught), f"{b.name}: caught by another rule: {caught}"


@pytest.mark.fresh_process
def test_a_plant_that_changes_nothing_is_not_caught() -> None:
    @contextmanager
    def nothing():
        yield

    inert = [Break("S3 nothing planted", "spec", "S3", ("spec-check:system",), patch=nothing),
             Break("C3 nothing planted", "spec", "C3", ("spec-walk:caching",), patch=nothing)]
    rows, problems = run_self_test(inert)
    assert not problems, problems
    assert [caught for _b, caught, _s in rows] == [None, None]
