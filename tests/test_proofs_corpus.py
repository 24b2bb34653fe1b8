"""Z3-synthesized traces replayed against targets (``memspec conform --corpus``)."""

from __future__ import annotations

from memspec.invariants.corpus import CorpusTrace, build_corpus, replay
from memspec.spec.api import MiB


def test_corpus_holds_a_z3_fragmentation_oom_per_preset() -> None:
    corpus = build_corpus()
    assert {t.preset for t in corpus} == {"pytorch", "seed"}
    for t in corpus:
        assert t.steps[-1][0] == "malloc" and t.expect == "OutOfMemory"


def test_reference_targets_take_the_spec_branch_and_reach_the_oom() -> None:
    corpus = {t.preset: t for t in build_corpus()}
    for target, preset in (("reference-caching", "pytorch"), ("reference-caching-seed", "seed")):
        r = replay(target, corpus[preset])
        assert r.ok, r.detail
        assert "ends OutOfMemory" in r.detail and r.branches[-1][1].startswith("raises OutOfMemory")


def test_a_target_that_leaves_the_spec_branch_fails() -> None:
    trace = CorpusTrace("oom", "hand-made", "pytorch", [("malloc", {"size": 40 * MiB, "stream": 0}),
                                                        ("malloc", {"size": 40 * MiB, "stream": 0})],
                        "OutOfMemory", capacity=64 * MiB)
    r = replay("mutant:caching-wrong-oom-figures", trace)
    assert not r.ok and "C9" in r.detail
