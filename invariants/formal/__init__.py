"""The formal side: Z3 proofs of the spec's invariants (``memspec prove``) and CrossHair on its
kernels (``memspec contracts``).

**The engine and the seed-000 rows.**  :mod:`.proofs` is the Z3 engine: a proof is a small
transition system (:class:`~.proofs.Proof`: typed fields, an initial predicate, encoded actions,
an inductive invariant) proved by induction, with its own checks (each action's hypotheses
satisfiable, the inductive invariant implying the named one) and its unguarded variants refuted;
:mod:`.z3fast` builds z3py's ``And``/``Or``/``Implies``/``Not`` terms without the coercion;
every check is a :class:`.solving.Query` (its own Z3 context, a CPU-bounded ladder of seeds).
:mod:`.proofs_seed000` holds the encodings of S1-S15 and G1 (assembled from
:mod:`.proofs_seed000_objects` and :mod:`.proofs_seed000_ledger`); :mod:`.proofs_catalog` lists
every proof and what each encodes; :mod:`.proofs_progress` is P1 (progress, liveness as safety).

**The caching rows (seed 003).**  :mod:`.proofs_caching` is the OOM synthesis (a bounded unrolling of
the heap machine's own actions) and the bounded expandable-segments search;
:mod:`.proofs_caching_heap` proves the C rows by induction over an arbitrary well-formed heap (assembled from :mod:`.proofs_caching_heap_terms` and
:mod:`.proofs_caching_heap_actions`; expandable segments and C8 included);
:mod:`.proofs_caching_agree` compares the heap encoding with the executable caching
spec step by step, and :mod:`.proofs_caching_agree_runs` holds its walks and directed scripts and
cuts them into the parts ``prove`` runs.

**What ties the encodings to the executable spec.**  :mod:`.agreement` walks the spec's own
machines and compares every encoded action and invariant on the projection of each reachable
state; the projections are the adapters of :mod:`.agreement_adapters` (assembled from
:mod:`.agreement_adapters_mech` and :mod:`.agreement_adapters_system`); :mod:`.agreement_perturb`
compares the executable and encoded invariants on perturbed, mostly unreachable, states (a
weakened executable check); :mod:`.z3native` evaluates encoded terms as straight-line Python for
those walks.  :mod:`.coverage` derives from the spec what each proof must encode (the fields each
step writes, the fields each invariant reads; reviewed gaps in ``KNOWN_GAPS``).  Both walk the
machines of one table, :mod:`.walks`, each step :mod:`memspec.spec.selfcheck`'s.
:mod:`.proofs_selftest` is ``memspec prove --self-test`` (its planted breaks in
:mod:`.proofs_selftest_plants`).  :mod:`.contracts`, with its pairs in :mod:`.contracts_pairs` and
:mod:`.contracts_caching_pairs`, runs CrossHair on the spec's kernels.

**The face.**  Callers outside this package import the names of :data:`__all__` from here; tests
and the modules above reach into the modules themselves.  A name is looked up in its module at each
access (nothing is cached here), so importing this package imports neither Z3 nor CrossHair, and a
name rebound in its module (a test's monkeypatch, a planted break) is what callers of the face get.
"""

from __future__ import annotations

import importlib
from typing import Any

#: the public face: name -> (module of this package, the name there)
_FACE: dict[str, tuple[str, str]] = {
    # the engine (memspec prove; the corpus builds its traces with the sorts and literals)
    "prove": ("proofs", "prove"), "branches": ("proofs", "branches"), "fresh": ("proofs", "fresh"),
    "concrete": ("proofs", "concrete"), "OUTCOMES": ("proofs", "OUTCOMES"),
    "ARR": ("proofs", "ARR"), "BARR": ("proofs", "BARR"), "BOOL": ("proofs", "BOOL"), "INT": ("proofs", "INT"),
    # the rows and what they encode
    "all_proofs": ("proofs_catalog", "all_proofs"), "declared": ("proofs_catalog", "declared"),
    "encoded": ("proofs_catalog", "encoded"), "machines": ("proofs_catalog", "machines"),
    "progress_record": ("proofs_progress", "record"),
    # the S rows' agreement and invariant strength
    "run_agreement": ("agreement_adapters", "run_all"), "Adapter": ("agreement", "Adapter"),
    "Compiled": ("agreement", "Compiled"), "outcome_name": ("agreement", "outcome_name"),
    "strength": ("agreement_perturb", "strength"), "strength_problems": ("agreement_perturb", "strength_problems"),
    # coverage derived from the spec
    "footprints": ("coverage", "footprints"), "row_coverage": ("coverage", "row_coverage"),
    "static_problems": ("coverage", "static_problems"), "table_problems": ("coverage", "table_problems"),
    # the caching rows, in the units prove schedules
    "run_caching": ("proofs_caching", "run_caching"), "synthesize": ("proofs_caching", "synthesize"),
    "BOUNDED": ("proofs_caching_heap", "BOUNDED"), "UNGUARDED": ("proofs_caching_heap", "UNGUARDED"),
    "heap_unit": ("proofs_caching_heap", "heap_unit"), "heap_units": ("proofs_caching_heap", "heap_units"),
    "join_units": ("proofs_caching_heap", "join_units"), "unit_cost": ("proofs_caching_heap", "unit_cost"),
    "WALKS_PER_CONFIG": ("proofs_caching_agree_runs", "WALKS_PER_CONFIG"),
    "agreement_part": ("proofs_caching_agree_runs", "agreement_part"),
    "agreement_parts": ("proofs_caching_agree_runs", "agreement_parts"),
    "merge_agreements": ("proofs_caching_agree_runs", "merge_agreements"),
    # prove --self-test, and memspec contracts
    "self_test": ("proofs_selftest", "main"), "run_contracts": ("contracts", "run_contracts"),
}

__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    try:
        module, attr = _FACE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(f"{__name__}.{module}"), attr)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FACE))
