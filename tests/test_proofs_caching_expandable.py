"""C8 (expandable segments: OutOfMemory only at physical exhaustion) on the caching heap machine: its step
property proved on every OutOfMemory of an arena, the unguarded refutation, agreement with spec/caching on
the expandable scripts, and planted breaks each caught."""

from __future__ import annotations

import pytest

from memspec.invariants.formal import proofs_caching_agree as A
from memspec.invariants.formal import proofs_caching_agree_runs as AR
from memspec.invariants.formal import proofs_caching_heap as H
from memspec.invariants.formal import proofs_selftest as T

MiB = 1 << 20
#: the heap actions that carry C8's step property: the mapping's failures, the memory_fraction OutOfMemory
C8_ACTIONS = ("expand:oom", "expand:retry", "malloc:oom", "gc_end:oom", "malloc_retry:oom")


def _act(name: str, guards: frozenset = frozenset()) -> H.Act:
    return next(a for a in H.actions(guards) if a.name == name)


def _fresh_compiles(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(A, "_COMPILED", {})
    monkeypatch.setattr(A, "_PRES", {})


def _scripts() -> A.Agreement:
    rep = A.Agreement()
    AR.expandable_sweep(rep)
    return rep


@pytest.mark.parametrize("name", C8_ACTIONS)
def test_c8_step_property_is_proved_on_every_arena_oom(name: str) -> None:
    res = dict((n, r) for n, r, _t in H.consecution(_act(name), 30000, only=("step:C8",)))
    assert res == {"step:C8": "proved"}, res


def test_c8_is_a_step_property_of_those_actions_only() -> None:
    from memspec.invariants.formal.proofs import _args, fresh

    for act in H.actions():
        s = fresh(H.FIELDS, "s")
        a = _args(act, "a")
        out, s2 = act.step(s, a)
        assert ("C8" in H.step_ok(act.name, s, a, out, s2)) == (act.name in C8_ACTIONS), act.name


def test_unguarded_map_is_refuted_on_c8_and_the_guarded_one_proves_it() -> None:
    ok, trace = H.refute("C8")
    assert ok and "=> C8 violated (step property)" in trace and "expand:oom" in trace
    assert T.detect_heap("C8") is not None   # the guard removed: step:C8 no longer proved


def test_agreement_on_the_expandable_scripts_samples_c8s_branches() -> None:
    rep = _scripts()
    assert rep.mismatches == [], rep.mismatches[:3]
    m = rep.counts["caching:malloc"]
    for branch in ("expand:map", "expand:fresh", "expand:oom", "expand:retry", "expand:map/the whole block",
                   "expand:map/part of the block", "malloc:oom", "malloc_retry:oom"):
        assert m[branch] > 0, (branch, m)
    assert rep.inv["C8"][0] > 20 and rep.inv["C8"][1] == 0


def test_two_arenas_script_serves_from_the_first_arena_by_address() -> None:
    from memspec.spec import caching as C

    preset, kw, script = next(x for x in AR.EXPANDABLE_SCRIPTS if x[1].get("arena_factor") == 0.5)
    st = C.init(policy=preset, streams=2, **kw)
    rep = A.Agreement()
    refs = []
    for step in script:
        if step[0] == "malloc":
            nxt = st.next_ref
            A.check_step(st, "malloc", {"size": step[1] * MiB, "stream": step[2]}, rep)
            refs.append(nxt)
        elif step[0] == "free":
            A.check_step(st, "free", {"ref": refs[step[1]]}, rep)
        else:
            A.check_step(st, "empty_cache", {}, rep)
    assert rep.mismatches == [], rep.mismatches
    large = sorted((g for g in st.segments if g.expandable and not g.small), key=lambda g: g.base)
    assert len(large) == 2
    assert [b.state for b in large[0].blocks] == ["live", "live"]  # the freed page of the first arena reused


def test_an_encoding_that_maps_the_whole_block_is_caught_by_the_agreement(monkeypatch) -> None:
    from memspec.invariants.formal import proofs_caching_heap_actions as HA

    _fresh_compiles(monkeypatch)
    monkeypatch.setattr(HA, "map_len", T._whole_run(HA.map_len))
    rep = _scripts()
    assert rep.mismatches, rep.counts["caching:malloc"]


@pytest.mark.parametrize("module,attr,make", [
    ("memspec.spec.caching.policy", "_unmap", T._unmap_nothing),
    ("memspec.spec.caching.policy", "_find_expandable", T._last_arena_first),
    ("memspec.spec.caching.policy", "_release_cached", T._release_keeps_pages),
    ("memspec.spec.caching.actions", "_release_cached", T._release_keeps_pages),
])
def test_planted_spec_breaks_are_caught_by_the_agreement(monkeypatch, module, attr, make) -> None:
    import importlib

    mod = importlib.import_module(module)
    monkeypatch.setattr(mod, attr, make(getattr(mod, attr)))
    rep = _scripts()
    assert rep.mismatches, rep.counts


def test_invariant_agreement_catches_a_c8_encoding_that_disagrees(monkeypatch) -> None:
    _fresh_compiles(monkeypatch)
    monkeypatch.setattr(A, "_INV_TERMS", {})
    monkeypatch.setitem(H.NAMED, "C8", lambda s: s.Rs + s.Rl <= 0)   # fails once anything is mapped
    rep = _scripts()
    assert rep.inv["C8"][1] > 0
