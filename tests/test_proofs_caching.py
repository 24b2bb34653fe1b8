"""Caching allocator: Z3 synthesizes the shortest fragmentation OOM under
both presets and the executable spec confirms it; with expandable segments no
sequence up to depth 8 fails while whole unpinned pages suffice."""

from __future__ import annotations

import pytest

from memspec.invariants.formal.proofs_caching import (
    EXPANDABLE_SIZES, expandable_no_fragmentation_oom, replay, synthesize,
)

MiB = 1 << 20


@pytest.mark.parametrize("preset", ["pytorch", "seed"])
def test_shortest_fragmentation_oom_is_synthesized_and_real(preset: str) -> None:
    syn = synthesize(preset, max_depth=8)
    assert syn.depth is not None, syn.trace
    assert syn.trace[-1].endswith("OutOfMemory")
    assert syn.free_total >= syn.rounded > MiB  # free >= request, and still it fails
    confirmed, text = replay(syn)
    assert confirmed, text
    # shortest: Z3 finds nothing one op shorter
    if syn.depth > 0:
        assert synthesize(preset, max_depth=syn.depth - 1).depth is None
    # on the heap machine's own actions: the seed's OOM is malloc's, pytorch's the retry's
    assert syn.actions[-1] == ("malloc:oom" if preset == "seed" else "malloc_retry:oom"), syn.actions


def test_the_synthesis_has_no_model_of_its_own() -> None:
    """Issue #33: the synthesis unrolls the heap machine's actions and uses its kernels (no slots model,
    no second set of policy kernels here, nor a second check of them against the spec's: the heap's
    kernel_boundary_agreement is the one)."""
    from memspec.invariants.formal import proofs_caching as P
    from memspec.invariants.formal import proofs_caching_heap_terms as T

    assert not hasattr(P, "Slots") and not hasattr(P, "malloc") and not hasattr(P, "free")
    assert P.z_round is T.z_round and not hasattr(P, "kernel_agreement")
    assert not any(hasattr(P, k) for k in ("z_segment", "z_split", "_kernels"))
    assert set(P.MALLOC_ACTS) | set(P.RETRY_ACTS) | set(P.FREE_ACTS) <= {a.name for a in P.H.actions()}


def test_replay_rejects_a_sequence_that_does_not_fail() -> None:
    syn = synthesize("seed", max_depth=8)
    ok_trace = type(syn)("seed", 0, ["t0 = malloc(2 MiB)", "malloc(4 MiB)"])
    confirmed, text = replay(ok_trace)
    assert not confirmed and "succeeded" in text


@pytest.mark.parametrize("preset", ["pytorch", "seed"])
def test_expandable_segments_oom_only_at_page_exhaustion(preset: str) -> None:
    r = expandable_no_fragmentation_oom(preset, depth=8, sizes=EXPANDABLE_SIZES)
    assert r.states > 100
    assert r.page_level is None, r.page_level


def test_expandable_search_finds_page_pinning_when_it_exists() -> None:
    """The search is not vacuous: at byte level the pytorch preset's 20 MiB
    pages pinned by a straddling block do fail a request smaller than the free bytes."""
    r = expandable_no_fragmentation_oom("pytorch", depth=8, sizes=EXPANDABLE_SIZES)
    assert r.byte_level is not None and r.byte_level[-1].endswith("OutOfMemory")


def test_c1_c2_c3_are_proved_on_the_heap_machine_not_by_a_bounded_search_here() -> None:
    """C1-C3 had a second, bounded encoding here (every malloc/free sequence up to depth 4 on the slots
    model); they are the heap machine's rows, unbounded (its initiation and C1: the test below)."""
    from memspec.invariants.formal import proofs_caching as P
    from memspec.invariants.formal import proofs_caching_heap as H

    assert not hasattr(P, "bounded_c_invariants")
    assert all(H.BOUNDED[c] is None and c in H.NAMED and c in H.UNGUARDED for c in ("C1", "C2", "C3"))


def test_heap_proof_catches_a_free_that_does_not_coalesce() -> None:
    """(Was the bounded search's: a free without the merge breaks C3; now the heap machine's consecution.)"""
    from memspec.invariants.formal import proofs_caching_heap as H

    bad = next(a for a in H.actions(frozenset({"merge-next"})) if a.name == "free:merge")
    res = dict((n, r) for n, r, _t in H.consecution(bad, 60000, only=("C3",)))
    assert res["C3"] != "proved", res


# --------------------------------------------------------------------------
# C1-C9 over an arbitrary well-formed heap (proofs_caching_heap)
# --------------------------------------------------------------------------

def test_heap_initiation_and_c1_as_a_consequence() -> None:
    from memspec.invariants.formal import proofs_caching_heap as H

    assert H.initiation() == "proved"
    assert H.safety_c1() == "proved"


@pytest.mark.parametrize("action", ["double_free", "record_stream", "complete_stream", "empty_cache_wait",
                                    "empty_cache", "malloc:eb", "malloc:retry", "process_event:wait"])
def test_heap_consecution_of_an_action(action: str) -> None:
    from memspec.invariants.formal import proofs_caching_heap as H

    act = next(a for a in H.actions() if a.name == action)
    res = H.consecution(act, timeout_ms=60000)
    assert res and all(r in ("proved", "framed") for _n, r, _t in res), [x for x in res if x[1] not in ("proved", "framed")]


def test_heap_consecution_fails_when_empty_cache_releases_any_free_block() -> None:
    """A planted break (empty_cache without the whole-segment guard) is not proved."""
    from memspec.invariants.formal import proofs_caching_heap as H

    act = next(a for a in H.actions(frozenset({"whole"})) if a.name == "empty_cache")
    res = dict((n, r) for n, r, _t in H.consecution(act, timeout_ms=60000, only=("C2:block", "step:C6")))
    assert res["step:C6"] != "proved" or res["C2:block"] != "proved", res


@pytest.mark.parametrize("inv", ["C1", "C2", "C3", "C4", "C5", "C6", "C7", "C9"])
def test_each_unguarded_variant_breaks_its_named_invariant(inv: str) -> None:
    from memspec.invariants.formal import proofs_caching_heap as H

    ok, trace = H.refute(inv)
    assert ok, trace
    assert f"=> {inv} violated" in trace and H.UNGUARDED[inv][0] in trace


def test_guarded_action_is_not_refuted() -> None:
    """The refutation search is not vacuous: with its guard kept, the C4 action breaks nothing."""
    from memspec.invariants.formal import proofs_caching_heap as H

    saved = H.UNGUARDED["C4"]
    H.UNGUARDED["C4"] = ("malloc:fit", "none-removed", "nothing removed")
    try:
        ok, trace = H.refute("C4")
    finally:
        H.UNGUARDED["C4"] = saved
    assert not ok, trace


def test_heap_encoding_covers_every_declaring_spec_action() -> None:
    from memspec.invariants.formal import proofs_caching_heap as H
    from memspec.invariants.formal.proofs_catalog import declared, machines

    known = {f"{lvl}:{a.name}" for lvl, m in machines().items() for a in m.actions}
    enc = {n for a in H.actions() for n in a.spec}
    assert enc <= known
    from memspec.spec.caching import IDS

    for i in IDS:
        assert set(declared(i)) <= enc, i


def test_z3_kernels_agree_with_the_spec_at_every_threshold() -> None:
    from memspec.invariants.formal import proofs_caching_heap as H

    assert H.kernel_boundary_agreement() == []


def test_threshold_agreement_catches_a_strict_seed_split_rule(monkeypatch) -> None:
    """The issue's slip: the seed preset's split rule with > instead of >= is caught at the 2 MiB remainder."""
    from memspec.invariants.formal import proofs_caching_heap as H
    from memspec.spec.caching import kernels as SK

    orig = SK.should_split

    def strict(remaining, size, small, seed_preset=False, expandable=False, max_split_size=0):  # type: ignore[no-untyped-def]
        if seed_preset:
            return remaining > (SK.K_MIN_BLOCK if small else SK.K_ROUND_LARGE)
        return orig(remaining, size, small, seed_preset, expandable, max_split_size)

    monkeypatch.setattr(SK, "should_split", strict)
    bad = H.kernel_boundary_agreement()
    assert any("remaining=2097152" in b and "seed=True" in b for b in bad), bad[:3]


def test_self_test_kills_the_caching_breaks() -> None:
    """The C entries of ``memspec prove --self-test``: the strict seed split rule and
    two heap-encoding breaks are each caught, naming the invariant."""
    from memspec.invariants.formal import proofs_selftest as ST

    mine = [b for b in ST.catalog() if b.invariant in ("C5", "C3", "C7")
            and (b.detectors[0] in ("caching-kernels", "heap:C3", "heap:C7"))]
    assert {b.detectors[0] for b in mine} == {"caching-kernels", "heap:C3", "heap:C7"}
    rows, problems = ST.run_self_test(mine)
    assert not problems, problems
    for b, caught, _t in rows:
        assert caught and ST.names(b, caught) and b.invariant in caught, (b.name, caught)
