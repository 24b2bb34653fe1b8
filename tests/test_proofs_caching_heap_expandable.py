"""Expandable segments in the caching heap encoding (the flag ``ex``): the new actions are
inductive (one proof for both flag values), reachable from a well-formed heap with the flag
on, their unguarded variant is refuted naming C1, the agreement with spec/caching counts
their branches with 0 mismatches, and planted breaks (in the encoding, in the spec) are caught."""

from __future__ import annotations

import pytest
import z3

from memspec.invariants.formal import proofs_caching_agree as A
from memspec.invariants.formal import proofs_caching_agree_runs as AR
from memspec.invariants.formal import proofs_caching_heap as H
from memspec.invariants.formal.solving import Query

MiB = 1 << 20
NEW_ACTIONS = ["malloc:expand", "gc_end:expand", "malloc_retry:expand", "expand:map", "expand:fresh",
               "expand:serve", "expand:oom", "expand:retry", "unmap:free", "unmap:cache"]


def _rebind(monkeypatch, name: str, value) -> None:  # type: ignore[no-untyped-def]
    """Rebind ``name`` in the heap encoding's face and in each of its parts that has it
    (:data:`proofs_caching_heap.PARTS`): the parts call each other's functions directly."""
    for m in (H, *H.PARTS):
        if hasattr(m, name):
            monkeypatch.setattr(m, name, value)


def _act(name: str, guards: frozenset = frozenset()) -> H.Act:
    return next(a for a in H.actions(guards) if a.name == name)


@pytest.mark.parametrize("action", NEW_ACTIONS)
def test_expandable_action_is_inductive(action: str) -> None:
    res = H.consecution(_act(action), timeout_ms=60000)
    assert res and all(r in ("proved", "framed") for _n, r, _t in res), [x for x in res if x[1] not in ("proved", "framed")]


@pytest.mark.parametrize("action", NEW_ACTIONS)
def test_expandable_action_is_enabled_on_some_well_formed_heap(action: str) -> None:
    """Not vacuous: a heap of at most 4 blocks satisfies the whole invariant, the flag and the precondition."""
    from memspec.invariants.formal.proofs import _args, fresh

    act = _act(action)
    s, a = fresh(H.FIELDS, "v"), _args(act, "v")
    H.MODE.kind, H.MODE.bound = "bounded", H.REFUTE_BLOCKS + 2
    try:
        hyp = z3.And(H.inv(s), s.n <= H.REFUTE_BLOCKS, s.ex, act.pre(s, a))
    finally:
        H.MODE.kind, H.MODE.bound = "forall", 0
    sol = Query(60000)   # CPU-bounded, its own context (never the clock)
    sol.add(hyp)
    assert sol.check() == z3.sat


def test_the_flag_is_symbolic_in_every_consecution() -> None:
    """One proof covers both values: init admits either, and the new actions need it on."""
    from memspec.invariants.formal.proofs import fresh

    s = fresh(H.FIELDS, "f")
    for val in (True, False):
        sol = Query(20000)
        sol.add(H.init(s), s.ex == val)
        assert sol.check() == z3.sat
    sol = Query(20000)
    sol.add(H.scalars_wf(s), s.xp, z3.Not(s.ex))
    assert sol.check() == z3.unsat


def test_map_without_the_device_check_is_refuted_naming_c1() -> None:
    ok, trace = H.refute("C1", knob="expandable_segments")
    assert ok, trace
    assert "expand:map" in trace and "=> C1 violated" in trace and "expandable segments: True" in trace


def test_planted_encoding_break_map_forgets_reserved_is_caught(monkeypatch) -> None:
    orig = H.map_step

    def forgets(s, a, guards=frozenset()):  # type: ignore[no-untyped-def]
        out, s2 = orig(s, a, guards)
        return out, s2.set(Rs=s.Rs, Rl=s.Rl)

    _rebind(monkeypatch, "map_step", forgets)
    res = dict((n, r) for n, r, _t in H.consecution(_act("expand:map"), timeout_ms=60000, only=("reserved",)))
    assert res["reserved"] != "proved", res


def test_planted_encoding_break_unmap_without_merging_is_caught(monkeypatch) -> None:
    """The unmapped pages left unmerged with unmapped neighbours break C3's unmapped conjunct."""
    orig = H._merge_free

    def no_unmapped_merge(s, b, guards=frozenset(), kind=H.FREE):  # type: ignore[no-untyped-def]
        return orig(s, b, frozenset({"merge-next"}) if kind == H.UNM else guards, kind)

    _rebind(monkeypatch, "_merge_free", no_unmapped_merge)
    res = dict((n, r) for n, r, _t in H.consecution(_act("unmap:cache"), timeout_ms=60000, only=("C3",)))
    assert res["C3"] != "proved", res


def test_agreement_counts_every_expandable_branch() -> None:
    rep = A.Agreement()
    AR.expandable_sweep(rep)
    assert rep.mismatches == [], rep.mismatches[:3]
    m = rep.counts["caching:malloc"]
    for branch in A.EXPANDABLE_BRANCHES + ("malloc:expand", "gc_end:expand", "malloc_retry:expand", "expand:map",
                                           "expand:fresh", "expand:serve", "expand:oom", "expand:retry",
                                           "unmap:free", "unmap:cache"):
        assert m[branch] > 0, branch
    assert rep.counts["caching:free"]["unmap:free"] > 0
    assert rep.counts["caching:empty_cache"]["unmap:cache"] > 0 and rep.counts["caching:empty_cache"]["unmap:free"] > 0
    assert all(n > 0 and bad == 0 for n, bad in rep.inv.values()), rep.inv


def _fresh_compiles(monkeypatch) -> None:
    monkeypatch.setattr(A, "_COMPILED", {})


def test_agreement_catches_an_encoding_that_maps_without_rounding_to_pages(monkeypatch) -> None:
    _fresh_compiles(monkeypatch)

    def exact(s, q, guards=frozenset()):  # type: ignore[no-untyped-def]
        need = s.mr - z3.If(s.xh == -1, 0, H.at(s.sz, s.xh))
        return z3.If(need < H.at(s.sz, q), need, H.at(s.sz, q))

    _rebind(monkeypatch, "map_len", exact)
    rep = A.Agreement()
    AR.expandable_sweep(rep)
    assert rep.mismatches, "a mapping of the bytes needed, not whole pages, went unnoticed"


def test_agreement_catches_a_spec_whose_mapping_ignores_the_device(monkeypatch) -> None:
    from memspec.invariants.formal.proofs_selftest import _map_ignores_the_device
    from memspec.spec.caching import policy as P

    monkeypatch.setattr(P, "_map", _map_ignores_the_device(P._map))
    rep = A.Agreement()
    AR.expandable_sweep(rep)
    assert rep.mismatches, "a spec mapping past the device went unnoticed"


def test_expandable_reserved_may_pass_the_memory_fraction_cap_and_c1_agrees() -> None:
    """Why C1's fraction conjunct is not claimed with the flag: the spec's check is on ``alloc`` (22 MiB under a
    32 MiB cap) but the mapping takes two 20 MiB pages; the encoded C1 and the spec's agree on that state."""
    from memspec.spec import caching as C

    st = C.init(policy="pytorch", capacity=64 * MiB, memory_fraction=0.5, expandable=True, streams=1)
    rep = A.Agreement()
    A.check_step(st, "malloc", {"size": 22 * MiB, "stream": 0}, rep)
    assert rep.mismatches == [], rep.mismatches
    assert st.reserved() == 40 * MiB > st.policy.allowed
    vals, _refs = A.project(st)
    enc = A.encoded_invariants(vals)
    assert enc["C1"] and next(i for i in C.INVARIANTS if i.id == "C1").check(st) is None


def test_every_caching_row_is_unbounded_on_the_heap() -> None:
    from memspec.spec.caching import IDS

    assert list(H.BOUNDED) == list(IDS)
    assert H.NOT_HEAP_ENCODED == {}
    assert all(H.BOUNDED[i] is None for i in IDS)
    assert set(H.UNGUARDED) == set(IDS) and set(H.NAMED) == set(IDS)
