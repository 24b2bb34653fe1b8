"""C8 (expandable segments) encoding: proofs over any layout, the unguarded refutation, agreement with
spec/caching on every branch, and planted breaks each caught."""

from __future__ import annotations

import random

import pytest

from memspec.invariants.formal import proofs_caching_expandable as E
from memspec.invariants.formal import proofs_selftest as T

MiB = 1 << 20


def _agreement(seeds: int = 1) -> dict:
    rep = E.new_report()
    for key in E.SCRIPTS:
        E.run_script(key, rep)
    for sd in range(seeds):
        E._walks(random.Random(sd), E.WALKS, E.STEPS, rep)
    return rep


def test_c8_step_property_and_map_oom_proved_over_any_layout() -> None:
    out = E.proofs(("map_oom", "C8"))
    assert len(out) >= 10 and all(r == "proved" for _n, r, _t in out), out
    assert any("OutOfMemory => free < the lacking pages" in n for n, _r, _t in out)


def test_unguarded_map_is_refuted_on_c8_and_the_guarded_one_is_not() -> None:
    ok, trace = E.refute()
    assert ok and "C8 violated" in trace
    ok2, why = E.refute(whole=False)
    assert not ok2 and "no violation" in why


def test_an_encoding_that_maps_the_whole_block_fails_its_capacity_proof(monkeypatch) -> None:
    orig = E.map_step
    monkeypatch.setattr(E, "map_step", lambda s, a, whole=False, page=None: orig(s, a, True, page))
    out = dict((n, r) for n, r, _t in E.proofs(("map",)))
    assert any(r != "proved" for n, r in out.items() if "mapped <= capacity" in n), out


def test_agreement_on_scripts_and_walks_samples_every_branch() -> None:
    rep = _agreement()
    assert rep["mismatches"] == [], rep["mismatches"][:3]
    assert all(n > 0 for bs in rep["counts"].values() for n in bs.values()), rep["counts"]
    assert rep["inv"][0] > 500 and rep["inv"][1] == 0


def test_two_arenas_script_serves_from_the_first_arena_by_address() -> None:
    rep = E.new_report()
    st = E.run_script("two arenas", rep)
    assert rep["mismatches"] == []
    large = sorted((g for g in st.segments if g.expandable and not g.small), key=lambda g: g.base)
    assert len(large) == 2
    first = large[0]
    assert [b.state for b in first.blocks] == ["live", "live"]  # the freed page of the first arena reused


def test_multi_block_run_maps_two_unmapped_blocks() -> None:
    rep = E.new_report()
    E.run_script("multi-block run", rep)
    assert rep["mismatches"] == [] and rep["counts"]["caching:malloc"]["map/multi-block run"] == 1


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
    rep = _agreement()
    assert rep["mismatches"], rep["counts"]


def test_invariant_agreement_catches_an_encoding_that_disagrees(monkeypatch) -> None:
    orig = E.blk_wf
    monkeypatch.setattr(E, "blk_wf", lambda s, i: E.And(orig(s, i), s.sz(i) % (3 * MiB) == 0))
    rep = E.new_report()
    E.run_script("multi-block run", rep)
    assert rep["inv"][1] > 0


def test_projection_reads_blocks_only(monkeypatch) -> None:
    from memspec.spec import caching as C
    from memspec.spec.caching import policy as P

    st = C.init(policy="pytorch", capacity=64 * MiB, expandable=True, streams=2)
    E.check_step(st, "malloc", {"size": 3 * MiB, "stream": 0}, E.new_report())
    for name in ("_merge_around", "_free_block", "_find_expandable", "_map", "_unmap", "_release_cached",
                 "predict_malloc"):
        monkeypatch.setattr(P, name, lambda *a, **k: (_ for _ in ()).throw(AssertionError("policy called")))
    p = E.project(st)
    assert p.s.mapped == 20 * MiB and p.s.n == 3 and E.unmapped_ranges(p) == {p.bases[0]: [(20 * MiB, 80 * MiB)]}
