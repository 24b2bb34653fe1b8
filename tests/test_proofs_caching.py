"""Caching allocator: Z3 synthesizes the shortest fragmentation OOM under
both presets and the executable spec confirms it; with expandable segments no
sequence up to depth 8 fails while whole unpinned pages suffice."""

from __future__ import annotations

import pytest

from memspec.invariants.proofs_caching import (
    EXPANDABLE_SIZES, expandable_no_fragmentation_oom, kernel_agreement, replay, synthesize,
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


def test_z3_policy_kernels_agree_with_the_spec() -> None:
    assert kernel_agreement(samples=1000) == []


@pytest.mark.parametrize("preset", ["pytorch", "seed"])
def test_c1_c2_c3_hold_for_every_sequence_up_to_depth_4(preset: str) -> None:
    from memspec.invariants.proofs_caching import C_DEPTH, bounded_c_invariants

    r = bounded_c_invariants(preset, depth=C_DEPTH)
    assert r.ok, r.results


def test_bounded_proof_catches_a_free_that_does_not_coalesce(monkeypatch) -> None:
    import z3

    from memspec.invariants import proofs_caching as PC

    def free_without_merge(st, i):  # type: ignore[no-untyped-def]
        out = st.copy()
        out.free = [z3.If(i == j, True, st.free[j]) for j in range(len(st.used))]
        return out

    monkeypatch.setattr(PC, "free", free_without_merge)
    r = PC.bounded_c_invariants("seed", depth=3)
    assert r.results["C3"].startswith("VIOLATED"), r.results
