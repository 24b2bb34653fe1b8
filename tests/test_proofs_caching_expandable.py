"""C8 (expandable segments: OutOfMemory only at physical exhaustion) on the caching heap machine: its step
property proved on every OutOfMemory of an arena, the unguarded refutation, agreement with spec/caching on
the expandable scripts, and planted breaks each caught."""

from __future__ import annotations

import pytest

from memspec.invariants.formal import proofs_caching_agree as A
from memspec.invariants.formal import proofs_caching_agree_runs as AR
from memspec.invariants.formal import proofs_caching_heap as H
from memspec.invariants.formal import proofs_selftest as T
from memspec.invariants.formal.solving import Query

MiB = 1 << 20
#: the heap actions that carry C8's step property: the mapping's failures, the memory_fraction OutOfMemory
C8_ACTIONS = ("expand:oom", "expand:retry", "malloc:oom", "gc_end:oom", "malloc_retry:oom")


def _act(name: str, guards: frozenset = frozenset()) -> H.Act:
    return next(a for a in H.actions(guards) if a.name == name)


def _fresh_compiles(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(A, "_COMPILED", {})


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


#: the actions that make or move an unmapped block (C8's lemma is not framed there)
UNMAPPING = ("expand:map", "expand:fresh", "unmap:free", "unmap:cache")


@pytest.mark.parametrize("name", UNMAPPING)
def test_c8s_lemma_every_unmapped_block_starts_on_a_page_is_inductive(name: str) -> None:
    assert H.initiation() == "proved"
    res = dict((n, r) for n, r, _t in H.consecution(_act(name), 30000, only=("align",)))
    assert res == {"align": "proved"}, res


def test_an_oom_lacking_more_than_the_page_rounded_request_needs_a_run_that_starts_mid_page() -> None:
    """The case only C8's exact bound excludes is expressible: a heap satisfying the whole invariant but C8's
    lemma where expand:oom lacks more than the request rounded up to a page (and less than the request plus a
    page: the weaker bound holds) -- pytorch's 40 MiB arena, 2 MiB live, the 38 MiB unmapped rest from 2 MiB:
    a 20 MiB request lacks the pages up to 40 MiB, 38 MiB > 20 MiB, on a 30 MiB device --, its target
    starting mid-page; excluded by the lemma."""
    import z3

    from memspec.invariants.formal.proofs import _args, at, fresh

    act = _act("expand:oom")
    s, a = fresh(H.FIELDS, "x"), _args(act, "x")
    H.MODE.kind, H.MODE.bound = "bounded", H.REFUTE_BLOCKS + 2
    try:
        more, pg = H.lacking(s), H.page(s, s.mr <= H.K_SMALL)
        hyp = z3.And(H.inv(s), s.n <= H.REFUTE_BLOCKS, act.pre(s, a), more > H.ceil_pg(s.mr, pg), more < s.mr + pg)
        lemma = H.unmapped_aligned(s)
    finally:
        H.MODE.kind, H.MODE.bound = "forall", 0
    pin = [z3.Not(s.seed), s.ex, s.n == 2, s.mr == 20 * MiB, s.mn == 20 * MiB, s.cap == 30 * MiB, s.vl == 40 * MiB,
           at(s.al, 0), at(s.al, 1), at(s.k, 0) == H.LIVE, at(s.k, 1) == H.UNM, at(s.ad, 0) == 0,
           at(s.sz, 0) == 2 * MiB, at(s.ad, 1) == 2 * MiB, at(s.sz, 1) == 38 * MiB, at(s.sb, 0) == 0, at(s.sb, 1) == 0,
           s.xh == -1, s.xq == 1, s.x2, a.b == 1]
    sol = Query(60000)   # CPU-bounded, its own context (never the clock)
    sol.add(hyp, *pin)
    assert sol.check() == z3.sat
    m = sol.model()
    assert m.eval(more).as_long() == 38 * MiB
    assert z3.is_false(m.eval(H.page_aligned(s, a.b), model_completion=True))   # the target starts mid-page
    sol.add(lemma)
    assert sol.check() == z3.unsat


def test_a_mapping_that_leaves_its_run_mid_page_is_caught_by_c8s_lemma_only(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The self-test's break: expand:map maps 2 MiB granules of pytorch's 20 MiB pages.  Every goal of
    expand:map but C8's lemma still proves, and so does C8's step property at expand:oom (the lemma is its
    hypothesis): the lemma's consecution is what catches it (``memspec prove``'s check
    ``step:expand:map:align``)."""
    from memspec.invariants.formal import proofs_caching_heap_actions as HA

    assert T.detect_heap_goal("expand:map", "align") is None
    monkeypatch.setattr(HA, "map_step", T._map_in_small_pages(HA.map_step))
    bad = [(n, r) for n, r, _t in H.consecution(_act("expand:map"), 30000) if r not in ("proved", "framed")]
    assert [n for n, _r in bad] == ["align"], bad
    assert dict((n, r) for n, r, _t in H.consecution(_act("expand:oom"), 30000, only=("step:C8",))) == \
        {"step:C8": "proved"}
    assert "step:expand:map:align" in (T.detect_heap_goal("expand:map", "align") or "")
