"""The caching heap encoding agrees with spec/caching (transitions and
invariants), and the agreement catches planted spec breaks (C8 included:
one machine for every C row)."""

from __future__ import annotations

import copy

import pytest

from memspec.invariants.formal import proofs_caching_agree as A
from memspec.invariants.formal import proofs_caching_agree_runs as AR
from memspec.invariants.formal import proofs_caching_agree_runs as R

MiB = 1 << 20


@pytest.fixture(scope="module")
def parts() -> dict:
    """Every part of the agreement ``memspec prove`` runs (``run_agreement(steps=30, seed=0)``: the sweeps of
    each preset, the knob sweep, the walks), each computed once on a report of its own: the tests below take
    copies (a report is plain data) instead of running the same deterministic sweeps again."""
    return {p: AR.agreement_part(p, steps=30, seed=0) for p in AR.agreement_parts()}


def _steps(preset: str, script, rep: A.Agreement, streams: int = 1) -> None:
    from memspec.spec import caching as C

    st = C.init(policy=preset, capacity=44 * MiB, streams=streams)
    refs: list[int] = []
    for name, args in script:
        args = {k: (refs[v] if k == "ref" else v) for k, v in args.items()}
        A.check_step(st, name, args, rep)
        if name == "malloc" and st.where:
            refs.append(max(st.where))


#: malloc two blocks of one segment, free the first, then the second (it merges with the previous free block)
MERGE_PREVIOUS = [("malloc", {"size": 3 * MiB, "stream": 0}), ("malloc", {"size": 4 * MiB, "stream": 0}),
                  ("free", {"ref": 0}), ("free", {"ref": 1})]


@pytest.mark.parametrize("preset", ["seed", "pytorch"])
def test_boundary_and_event_sweeps_agree_and_reach_every_threshold_branch(parts, preset: str) -> None:
    rep = copy.deepcopy(parts[("sweeps", preset)])   # AR.boundary_sweep, then AR.event_sweep, on a fresh report
    _steps(preset, MERGE_PREVIOUS, rep)
    assert rep.mismatches == []
    m = rep.counts["caching:malloc"]
    for branch in ("malloc:fit/split", "malloc:fit/whole", "malloc:new/split", "malloc:new/whole",
                   "malloc:fit/remainder on the split threshold", "malloc:new/remainder on the split threshold",
                   "malloc:eb", "process_event:wait", "process_event:free"):
        assert m[branch] > 0, branch
    assert rep.counts["caching:free"]["free:merge"] >= 2 and rep.counts["caching:free"]["free:pending"] >= 1
    assert all(n > 0 and bad == 0 for n, bad in rep.inv.values()), rep.inv


def test_walks_agree_with_every_branch_sampled(parts, monkeypatch) -> None:
    # run_agreement itself runs, each of its parts read from the fixture (computed with the same arguments)
    plain = R.agreement_part

    def part(p, *args, **kw):  # type: ignore[no-untyped-def]
        if kw or args != (30, AR.WALKS_PER_CONFIG, 0, frozenset(), True):
            return plain(p, *args, **kw)
        return copy.deepcopy(parts[p])

    monkeypatch.setattr(R, "agreement_part", part)
    rep = AR.run_agreement(steps=30, seed=0)   # what `memspec prove` runs (WALKS_PER_CONFIG)
    assert rep.samples == sum(r.samples for r in parts.values()) > 0
    assert rep.mismatches == [], rep.mismatches[:3]
    unsampled = [(a, b) for a, bs in rep.counts.items() for b, n in bs.items() if n == 0]
    assert unsampled == []
    assert all(bad == 0 for _n, bad in rep.inv.values())


def test_spec_that_stops_merging_with_the_previous_free_block_is_caught(monkeypatch) -> None:
    from memspec.spec.caching import policy as P

    def merge_next_only(seg, i):  # type: ignore[no-untyped-def]
        b = seg.blocks[i]
        if i + 1 < len(seg.blocks) and seg.blocks[i + 1].state == b.state:
            b.size += seg.blocks.pop(i + 1).size
        return i

    monkeypatch.setattr(P, "_merge_around", merge_next_only)
    rep = A.Agreement()
    _steps("seed", MERGE_PREVIOUS, rep)
    assert any(m.startswith("free(") for m in rep.mismatches), rep.mismatches


def test_seed_split_rule_with_strict_comparison_is_caught(monkeypatch) -> None:
    """The issue's slip: ``remaining > 2 MiB`` instead of ``>=`` in the seed preset's large pool."""
    from memspec.spec.caching import kernels as K
    from memspec.spec.caching import policy as P

    orig = K.should_split

    def strict(remaining, size, small, seed_preset=False, expandable=False, max_split_size=0):  # type: ignore[no-untyped-def]
        if seed_preset and not small:
            return remaining > K.K_ROUND_LARGE
        return orig(remaining, size, small, seed_preset, expandable, max_split_size)

    monkeypatch.setattr(P, "should_split", strict)
    rep = A.Agreement()
    AR.boundary_sweep(rep, "seed")
    assert rep.mismatches, "the strict split rule went unnoticed"
    assert any("malloc(size=" in m for m in rep.mismatches)


def test_invariant_agreement_catches_an_encoding_that_disagrees(monkeypatch) -> None:
    """An encoded C5 stricter than the spec's (4 MiB multiples) disagrees on reachable states."""
    import z3

    from memspec.invariants.formal import proofs_caching_heap as H
    from memspec.invariants.formal.proofs import at

    def c5_wrong(s):  # type: ignore[no-untyped-def]
        return H._all(s.n, lambda i: z3.Implies(z3.And(at(s.al, i), s.seed, z3.Not(at(s.sm, i))),
                                                at(s.sz, i) % (4 * MiB) == 0))

    monkeypatch.setitem(H.NAMED, "C5", c5_wrong)
    monkeypatch.setattr(A, "_INV_TERMS", {})
    rep = A.Agreement()
    _steps("seed", [("malloc", {"size": 5 * MiB, "stream": 0}), ("malloc", {"size": 1 * MiB, "stream": 0})], rep)
    assert rep.inv["C5"][1] > 0, rep.inv
    assert rep.inv["C3"] == [2, 0]


def test_projection_never_calls_the_policy(monkeypatch) -> None:
    """The projection reads segments and blocks only: with every policy function broken it still works."""
    from memspec.spec import caching as C
    from memspec.spec.caching import policy as P

    st = C.init(policy="seed", capacity=44 * MiB)
    rep = A.Agreement()
    A.check_step(st, "malloc", {"size": 3 * MiB, "stream": 0}, rep)
    for name in ("_merge_around", "_free_block", "_candidates", "_get_free_block", "_release_cached", "predict_malloc"):
        monkeypatch.setattr(P, name, lambda *a, **k: (_ for _ in ()).throw(AssertionError("policy called")))
    vals, refs = A.project(st)
    assert vals["Rl"] == 20 * MiB and len(refs) == 1
    assert sorted(A.blocks_by_address(vals)) == sorted({s.base + b.offset for s in st.segments for b in s.blocks})


def _fake_heap(refuted: bool = True) -> dict:
    from memspec.invariants.formal.proofs_caching_heap import UNGUARDED, actions

    return {"checks": [("init", "proved", 0.0)], "refuted": {c: (refuted, "trace") for c in UNGUARDED},
            "actions": {a.name: list(a.spec) for a in actions()}}


def test_caching_rows_carry_the_agreement_and_fail_on_a_mismatch() -> None:
    from memspec.commands.prove import _caching_records

    rep = A.Agreement()
    for spec_action, branches in rep.counts.items():
        for b in branches:
            branches[b] = 1
    rep.inv = {c: [5, 0] for c in A.HEAP_INVARIANTS}
    rows = {r["id"]: r for r in _caching_records(_fake_heap(), rep)}
    c3 = rows["C3"]
    assert c3["transition_agreement"]["caching:free"] == {"free:pending": 1, "free:merge": 1, "unmap:free": 1}
    assert c3["invariant_agreement"] == {"samples": 5, "disagreements": 0}
    assert c3["unguarded"]["refuted"] and set(c3["declared_actions"]) <= set(c3["encoded_actions"])
    assert not any(w.startswith(("transition", "invariant", "branches")) for w in c3["_why"]), c3["_why"]
    # one mismatch, one unsampled branch, one invariant disagreement: each named in the verdict
    rep.mismatches.append("free(ref=1) on seed: block at 0x0: ...")
    rep.counts["caching:free"]["free:pending"] = 0
    rep.inv["C3"] = [5, 1]
    c3 = {r["id"]: r for r in _caching_records(_fake_heap(), rep)}["C3"]
    assert not c3["proved"]
    why = " | ".join(c3["_why"])
    assert "transition agreement: 1 disagreements" in why and "caching:free/free:pending" in why
    assert "invariant agreement: 1/5 disagree" in why
    # C8 is a row of the same machine: the heap's checks and the same agreement
    c8 = rows["C8"]
    assert c8["status"] == "proved" and c8["encoded_actions"] == rows["C3"]["encoded_actions"]
    assert c8["invariant_agreement"] == {"samples": 5, "disagreements": 0}
    assert c8["transition_agreement"] == rows["C3"]["transition_agreement"]


def test_agreement_parts_merge_into_the_serial_counts(parts) -> None:
    """The pool runs each part of the agreement in its own report: merged, they give what one report
    collecting the same sweeps gives (a state two parts both evaluated is counted once)."""
    part = parts[("sweeps", "seed")]   # the seed preset's sweeps on a fresh report (deterministic)
    # the same states twice: counted once in the invariant agreement.  The serial report's first pass is
    # that part (the same sweeps on a fresh report); the second pass runs here, on a copy of it
    serial = copy.deepcopy(part)
    AR.boundary_sweep(serial, "seed")
    AR.event_sweep(serial, "seed")
    merged = AR.merge_agreements([part, copy.deepcopy(part)])
    assert merged.inv == serial.inv and merged.inv == part.inv
    assert sum(n for n, _bad in merged.inv.values()) > 0
    # transitions are not deduplicated: every step checked is a sample
    assert merged.samples == serial.samples == 2 * part.samples
    assert merged.counts == serial.counts and merged.mismatches == serial.mismatches == []
    assert merged.counts["caching:malloc"]["malloc:fit/split"] == 2 * part.counts["caching:malloc"]["malloc:fit/split"]
    parts = AR.agreement_parts()
    assert ("knobs",) in parts and ("expandable-scripts",) in parts
    assert len([p for p in parts if p[0] == "walk"]) == AR.WALKS_PER_CONFIG * len(AR.WALKS)
    assert len([p for p in parts if p[0] == "expandable-walk"]) == AR.WALKS_PER_CONFIG * len(AR.EXPANDABLE_WALKS)
    two = AR.agreement_parts(walks_per_config=2)   # --walks 2: a second walk of every configuration
    assert len([p for p in two if p[0] == "walk"]) == 2 * len(AR.WALKS)
    assert len([p for p in two if p[0] == "expandable-walk"]) == 2 * len(AR.EXPANDABLE_WALKS)


def test_knob_scripts_reach_pytorchs_retry_then_split(parts) -> None:
    # the one branch that only a second random walk per configuration used to reach
    rep = parts[("knobs",)]   # AR.knob_sweep on a fresh report
    assert rep.mismatches == [], rep.mismatches[:3]
    assert rep.counts["caching:malloc"]["malloc_retry:new/split"] > 0


def test_memoized_builders_give_the_very_terms_of_a_plain_build() -> None:
    """The evaluation memo (``MODE.eval_memo``) must not change a term: Z3 shares equal terms, so the
    memoized build and the plain one are the same AST."""
    import z3

    from memspec.invariants.formal import proofs_caching_heap as H
    from memspec.invariants.formal.proofs import St, _sort

    act = next(a for a in H.actions() if a.name == "malloc:fit")
    s = St({f: (6 if f == "n" else z3.Const(f"{f}@memo", _sort(H.FIELDS[f]))) for f in H.FIELDS})
    a = St({p: z3.Int(f"{p}@memoarg") for p in act.params})
    plain = act.pre(s, a)
    with A._eval_memo():
        memo = act.pre(s, a)
        again = act.pre(s, a)
    assert H.MODE.eval_memo is False
    assert plain.eq(memo) and memo.eq(again)
