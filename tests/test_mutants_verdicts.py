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
    assert not {m.name for m in V.NOT_YET_KILLED} & {m.name for m in all_mutants()}
    names = {m.name for m in all_mutants()}
    assert {m.name for m in V.MUTANTS} <= names           # shipped: `memspec mutants` runs them
    levels = {m.level for m in V.MUTANTS}
    assert levels == {"caching", "system"}
    assert {m.invariant for m in V.MUTANTS} >= {"C2", "C5", "S4", "S15"}


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
