"""The caching heap encoding's policy knobs (memory_fraction, roundup_power2_divisions,
garbage_collection_threshold, release_available with max_split_size): proved, refuted
without their guards, checked against spec/caching, and each planted break caught."""

from __future__ import annotations

import pytest

from memspec.invariants.formal import proofs_caching_agree as A
from memspec.invariants.formal import proofs_caching_agree_runs as AR
from memspec.invariants.formal import proofs_caching_heap as H

MiB = 1 << 20
KNOB_ACTIONS = ["malloc:gc", "malloc:avail", "gc_end:oom", "gc_end:avail", "avail_end:retry", "phase:release",
                "phase:new"]


def _rebind(monkeypatch, name: str, value) -> None:  # type: ignore[no-untyped-def]
    """Rebind ``name`` in the heap encoding's face and in each of its parts that has it
    (:data:`proofs_caching_heap.PARTS`): the parts call each other's functions directly."""
    for m in (H, *H.PARTS):
        if hasattr(m, name):
            monkeypatch.setattr(m, name, value)


def test_rounding_lemma_is_proved() -> None:
    assert H.rounding_lemma() == "proved"


def test_rounding_lemma_fails_when_the_division_rounding_rounds_down(monkeypatch) -> None:
    """A planted break in the exact kernel (a division interval rounds down) fails the lemma."""
    orig = H._torch_round_cases

    def down(s, n):  # type: ignore[no-untyped-def]
        cases, plain = orig(s, n)
        cond, _val = cases[12]                              # sizes in [4 MiB, 8 MiB)
        cases[12] = (cond, (n / (1 << 19)) * (1 << 19))    # floor to the 512 KiB step
        return cases, plain

    _rebind(monkeypatch, "_torch_round_cases", down)
    assert H.rounding_lemma() != "proved"


def test_division_kernel_agrees_with_the_spec_at_every_threshold() -> None:
    assert H.kernel_boundary_agreement() == []
    # the thresholds include each entry's start and the steps inside the 1-8 MiB intervals
    pts = H.division_points((4,) * 16)
    assert 2048 in pts and (1 << 20) + (1 << 18) in pts


def test_division_kernel_agreement_catches_a_slip_at_the_entry_start(monkeypatch) -> None:
    """The spec's ``size > 512 * d`` made ``>=`` is caught at ``512 * d`` exactly."""
    from memspec.spec.caching import kernels as SK

    orig = SK.round_size

    def slip(size, seed_preset=False, divisions=0):  # type: ignore[no-untyped-def]
        if not seed_preset and divisions > 1 and size == SK.K_MIN_BLOCK * divisions:
            floor = 1 << (size.bit_length() - 1)
            step = floor // divisions
            return -(-size // step) * step + step     # rounds as if inside the interval's next step
        return orig(size, seed_preset, divisions)

    monkeypatch.setattr(SK, "round_size", slip)
    bad = H.kernel_boundary_agreement()
    assert any("size=2048" in b for b in bad), bad[:3]


@pytest.mark.parametrize("action", KNOB_ACTIONS)
def test_knob_actions_are_inductive(action: str) -> None:
    act = next(a for a in H.actions() + H.phase_actions() if a.name == action)
    res = H.consecution(act, timeout_ms=60000)
    assert res and all(r in ("proved", "framed") for _n, r, _t in res), [x for x in res if x[1] not in ("proved", "framed")]


@pytest.mark.parametrize("knob", sorted(H.KNOB_UNGUARDED))
def test_each_knob_without_its_guard_breaks_its_invariant(knob: str) -> None:
    inv, act_name, _g, _w = H.KNOB_UNGUARDED[knob]
    ok, trace = H.refute(inv, knob=knob)
    assert ok, trace
    assert f"=> {inv} violated" in trace and act_name in trace


@pytest.mark.parametrize("knob", sorted(H.KNOB_UNGUARDED))
def test_self_test_kills_each_knob_break(knob: str) -> None:
    from memspec.invariants.formal import proofs_selftest as ST

    caught = ST.detect_heap_knob(knob)
    assert caught and H.KNOB_UNGUARDED[knob][0] in caught, caught


def test_knob_sweep_agrees_and_samples_every_knob_branch() -> None:
    rep = A.Agreement()
    AR.knob_sweep(rep)
    assert rep.mismatches == [], rep.mismatches[:3]
    m = rep.counts["caching:malloc"]
    # (gc_end:expand, with expandable segments: test_proofs_caching_heap_expandable)
    for branch in ("malloc:gc", "gc:release", *[f"gc_end:{p}" for p in H.CONT_PATHS if p != "expand"], "malloc:avail",
                   "avail:big", "avail:one", "avail_end:new", "avail_end:retry", *A.KNOB_BRANCHES):
        assert m[branch] > 0, branch
    assert all(bad == 0 for _n, bad in rep.inv.values()), rep.inv


def _knob_mismatches(monkeypatch, module: str, attr: str, make) -> list[str]:  # type: ignore[no-untyped-def]
    import importlib

    mod = importlib.import_module(module)
    monkeypatch.setattr(mod, attr, make(getattr(mod, attr)))
    rep = A.Agreement()
    AR.knob_sweep(rep)
    return rep.mismatches


def test_agreement_catches_a_spec_that_ignores_memory_fraction(monkeypatch) -> None:
    from memspec.spec.caching.policy import _new_segment

    def make(_orig):  # type: ignore[no-untyped-def]
        def alloc_block(st, small, stream, r, alloc):  # type: ignore[no-untyped-def]
            if st.reserved() + alloc > st.policy.capacity:
                return None
            return _new_segment(st, alloc, small, stream, False, 0), 0
        return alloc_block

    assert _knob_mismatches(monkeypatch, "memspec.spec.caching.policy", "_alloc_block", make)


def test_agreement_catches_a_garbage_collection_of_the_small_pool(monkeypatch) -> None:
    """The spec's gc releases whole free small-pool segments too: not a legal victim of gc:release."""
    def make(orig):  # type: ignore[no-untyped-def]
        def gc(st):  # type: ignore[no-untyped-def]
            orig(st)
            if st.reserved() > int(st.policy.gc_threshold * st.policy.allowed):
                for s in [s for s in st.segments if s.small and len(s.blocks) == 1 and s.blocks[0].state == "free"]:
                    st.segments.remove(s)
        return gc

    monkeypatch.setattr(AR, "KNOB_SCRIPTS", AR.KNOB_SCRIPTS + (
        ("pytorch", {"capacity": 64 << 20, "memory_fraction": 0.75, "garbage_collection_threshold": 0.25},
         (("malloc", 1, 0), ("malloc", 15, 0), ("free", 0), ("malloc", 40, 0))),))
    assert _knob_mismatches(monkeypatch, "memspec.spec.caching.policy", "_garbage_collect", make)


def test_agreement_catches_release_available_below_max_split_size(monkeypatch) -> None:
    """The spec's release_available that frees every whole segment (ignoring max_split_size and the want)."""
    def make(_orig):  # type: ignore[no-untyped-def]
        def release_available(st, small, stream, r):  # type: ignore[no-untyped-def]
            if not st.policy.max_split_size:
                return False
            gone = [s for s in st.segments if s.small == small and len(s.blocks) == 1 and s.blocks[0].state == "free"]
            for s in gone:
                st.segments.remove(s)
            return bool(gone)
        return release_available

    assert _knob_mismatches(monkeypatch, "memspec.spec.caching.policy", "_release_available", make)


def test_agreement_catches_a_spec_that_ignores_the_divisions(monkeypatch) -> None:
    from memspec.spec.caching import state as S

    monkeypatch.setattr(S.Policy, "rounded", lambda self, size: S.round_size(size, self.seed, 0))
    rep = A.Agreement()
    AR.knob_sweep(rep)
    assert rep.mismatches


@pytest.mark.parametrize("action", sorted(H.COVERED))
def test_phase_steps_are_instances_of_their_phase_action(action: str) -> None:
    act = next(a for a in H.actions() if a.name == action)
    assert H.covered(act) == "proved"


@pytest.mark.parametrize("knob,action", [("garbage_collection_threshold", "gc:release"),
                                         ("release_available", "avail:one")])
def test_an_unguarded_release_is_not_an_instance_of_the_phase_release(knob: str, action: str) -> None:
    """Without its whole-segment guard the release's precondition no longer implies phase:release's:
    the covering check fails (so the action would not be proved by it)."""
    guard = H.KNOB_UNGUARDED[knob][2]
    act = next(a for a in H.actions(frozenset({guard})) if a.name == action)
    assert H.covered(act) != "proved"
