"""The invariant catalogs (S1-S15 in memspec.spec.invariants, C1-C9 in
memspec.spec.caching) are the one list of ids, titles and quotes: each entry
matches its predicate, can fire (an action or observation of its machine
names it), and has a planted-bug mutant.  Adding an invariant to a catalog
without these fails here, by id."""

from __future__ import annotations

import pytest

from memspec.invariants.mutants import all_mutants
from memspec.spec.caching import CACHING
from memspec.spec.caching import CATALOG as CACHING_CATALOG
from memspec.spec.invariants import ALL, CATALOG
from memspec.spec.mechanism import MECHANISM
from memspec.spec.system import SYSTEM

ENTRIES = [(e, (MECHANISM, SYSTEM)) for e in CATALOG] + [(e, (CACHING,)) for e in CACHING_CATALOG]
MUTANTS = all_mutants()


def test_catalogs_are_the_predicates_ids_titles_and_quotes():
    assert [(e.id, e.title, e.quote) for e in CATALOG] == [(i.id, i.title, i.quote) for i in ALL]
    assert [(e.id, e.title, e.quote) for e in CACHING_CATALOG] == [(i.id, i.title, i.quote) for i in CACHING.invariants]
    ids = [e.id for e, _ in ENTRIES]
    assert len(ids) == len(set(ids)), "an id is used twice"
    assert {e.seed for e, _ in ENTRIES} <= {"000", "003"}


@pytest.mark.parametrize("entry,machines", ENTRIES, ids=[e.id for e, _ in ENTRIES])
def test_every_invariant_can_fire_and_has_a_mutant(entry, machines):
    named = {i for m in machines for a in m.actions for i in a.invariants} | {
        o.blame for m in machines for o in m.observations}
    assert entry.id in named, f"no action or observation of {[m.name for m in machines]} is checked against {entry.id}"
    assert entry.id in {i.id for m in machines for i in m.invariants}, f"{entry.id} is not among the machine's invariants"
    assert any(m.invariant == entry.id for m in MUTANTS), f"no planted-bug mutant is blamed on {entry.id}"
