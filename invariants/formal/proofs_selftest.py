"""``memspec prove --self-test``: plant breaks, see each caught, print a kill table.

Each break is planted in a copy (an encoding: a modified :class:`Proof`
built with ``dataclasses.replace``; a spec action or kernel: the module
attribute patched for the duration of the break and restored after) and run
through the detectors that apply:

* ``prove``: the Z3 checks of the invariant's proof (a check that passes on
  the unbroken proof fails; or the unguarded variant is no longer refuted);
* ``prove/agreement``: transition agreement of the invariant's encoded
  actions against the (possibly broken) executable spec;
* ``spec-check``: the spec's own stateful test (``memspec spec-check``) on
  the machine the break lives in; for the caching machine, which
  ``spec-check`` does not drive, a random walk of its actions with every
  C invariant checked after each step (``spec-walk``).

A detector counts only where it is silent on the unbroken project (the
baseline is run first).  A break is *killed* when a detector fires; the
table names it and the first reason.

Every break is put to ``memspec prove``'s own checks first (:func:`prove_first`:
a break that names none gets its machine's agreement); ``spec-check`` and the
caching walk, which are not part of ``prove``, run only as a fallback, and a
catch made by them alone is flagged ``NOT BY PROVE``.  ``--self-test`` exits 1
when a break survives or is caught only outside ``prove`` (each named), or a
detector fires on the unbroken project.

The breaks are built per class (issue 33), each on more than one row, so the
mechanisms are general: a dropped encoded action and an undeclared writer
(derived coverage), a contradictory helper (the satisfiability of each
action's hypotheses; a helper not derived makes the row conditional), a
vacuous invariant (``Inv => Named`` and ``Named`` falsifiable), a weakened
encoding (the Z3 checks and the unguarded refutation), a bug on an error
branch (transition agreement compares error branches' post-states too), a
weakened executable check (invariant strength on perturbed states), a
weakened kernel (the kernel facts proved with the rows, and agreement).
"""

from __future__ import annotations

import random
import time
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Any, Callable, Iterator

from memspec.invariants.formal import proofs_seed000 as E
from memspec.spec.selfcheck import follow
from memspec.invariants.forked import forkable, in_fresh_processes
from memspec.invariants.formal.proofs import Proof, prove
from memspec.spec import kernels as K
from memspec.spec.core import RandomChooser, Returns


from memspec.invariants.formal import proofs_selftest_plants
from memspec.invariants.formal.proofs_selftest_plants import (  # noqa: F401 - the face's names
    Break, _any_pool,
    _can_grant_unchecked, _cancel_keeps_grant, _contradictory_helper, _contradictory_lemma, _drop_frees,
    _eager_shared_free, _identity_reissued, _error_branch_mutates, _exec_weakened_breaks, _footprint_one_page_more,
    _grant_from_charged, _grow_refusal_grows, _guard_removed, _guard_removed_refutes, _kernel, _last_arena_first,
    _merge_loses_next, _no_merge, _patched, _poll_regardless, _proof, _refund_to_granted, _refused_reserve_grants,
    _release_keeps_pages, _release_nothing, _reserved_short, _return_grant_twice, _round_up_short,
    _s10_alloc_no_context, _s11_refund_ghost_stale, _s15_claim_keeps_held, _s1_drop_through_installed,
    _s8_commit_keeps_open_grant, _spec_patch, _strict_seed_split, _swap, _uncharged_growth, _unmap_nothing,
    _vacuous, _vacuous_named, _whole_run, detect_caching_kernels, detect_heap,
)

#: the module this one is assembled from: every name of it, private ones included, is a name of this one
PARTS = (proofs_selftest_plants,)
for _part in PARTS:
    globals().update({_k: _v for _k, _v in vars(_part).items() if not _k.startswith("__")})
del _part


def seed000_ids() -> list[str]:
    """Seed 000's invariant ids in catalog order (:data:`memspec.spec.invariants.CATALOG`, read at each call)."""
    from memspec.spec import invariants as seed000

    return [e.id for e in seed000.CATALOG]


def expected_covered() -> list[str]:
    """Every row a killed break must cover: both catalogs' ids in catalog order (seed 000's, then the
    caching allocator's :data:`memspec.spec.caching.invariants.CATALOG`), then G1 and P1 (rows of
    ``memspec prove`` beyond the catalogs: configuration generations and progress)."""
    from memspec.spec.caching import invariants as caching

    return seed000_ids() + [e.id for e in caching.CATALOG] + ["G1", "P1"]


def catalog() -> list[Break]:
    out: list[Break] = []
    for inv in seed000_ids():   # one guard-removed break per invariant of the catalog, from its proof
        if not any(p.id == inv for p in E.PROOFS + E.MORE_PROOFS):
            raise LookupError(f"{inv} is in the catalog (memspec.spec.invariants) but proofs_seed000 has no "
                              "Proof for it: no guard to remove, so no break to plant")
        p = _proof(inv)
        out.append(Break(f"{inv} encoding: {p.unguarded.name} without its guard ({p.guard})", "encoding", inv,
                         ("prove",), proof=_guard_removed(inv)))
    out += [
        Break("S10 encoding: allocate does not record its context (no pin)", "encoding", "S10", ("prove",),
              proof=_swap("S10", "allocate", _s10_alloc_no_context)),
        Break("S1 encoding: drop queues the release through the mechanism installed now", "encoding", "S1",
              ("prove",), proof=_swap("S1", "drop", _s1_drop_through_installed)),
        Break("S8 encoding: commit keeps the grant's bytes in the open grants", "encoding", "S8", ("prove",),
              proof=_swap("S8", "commit", _s8_commit_keeps_open_grant)),
        Break("S11 encoding: refund_lease leaves the prefix-sum ghost stale", "encoding", "S11", ("prove",),
              proof=_swap("S11", "refund_lease", _s11_refund_ghost_stale)),
        Break("S15 encoding: claim keeps the ticket's held bytes", "encoding", "S15", ("prove",),
              proof=_swap("S15", "claim", _s15_claim_keeps_held)),
        Break("S4 spec: poll frees regardless of fences", "spec", "S4", ("spec-check:system",),
              patch=_spec_patch("memspec.spec.ep", "run_done", _poll_regardless)),
        Break("S1 spec: the queue frees through the installed mechanism", "spec", "S1", ("spec-check:system",),
              patch=_spec_patch("memspec.spec.ep", "releasing_mechanism",
                                lambda _o: (lambda s, e: s.registry.installed))),
        Break("S7 spec: drop frees on the spot", "spec", "S7", ("spec-check:system",),
              patch=_spec_patch("memspec.spec.manager", "drop_owned", _drop_frees)),
        Break("S13 spec: shared pages freed at release while still mapped", "spec", "S13",
              ("spec-check:mechanism", "agreement"),
              patch=_spec_patch("memspec.spec.shared", "_maybe_free", _eager_shared_free)),
        Break("S13 spec: read-only mappings accept writes", "spec", "S13", ("spec-check:mechanism", "agreement"),
              patch=_spec_patch("memspec.spec.shared", "rejects_writes", lambda _o: (lambda m: False))),
        Break("S14 spec: create issues an identity again", "spec", "S14", ("spec-check:mechanism", "agreement"),
              patch=_spec_patch("memspec.spec.shared", "witness_identity", _identity_reissued)),
        Break("S2 spec: KV growth commits without charging", "spec", "S2", ("spec-check:system",),
              patch=_spec_patch("memspec.spec.holders", "grow_commit", _uncharged_growth)),
        Break("S6 spec: pressure may take hot weights", "spec", "S6", ("spec-check:system",),
              patch=_spec_patch("memspec.spec.holders", "victims",
                                lambda _o: (lambda s, released: [w for w in s.weights.values() if w.resident]))),
        Break("S3 spec: capabilities answered from the first snapshot", "spec", "S3", ("spec-check:system",),
              patch=_spec_patch("memspec.spec.manager", "current_capabilities", lambda _o: (lambda s: (0, True, True)))),
        Break("S15 kernel: grant_from_free takes from charged", "kernel", "S15", ("prove", "agreement"),
              patch=_kernel("grant_from_free", _grant_from_charged)),
        Break("S11 kernel: refund returns the bytes to granted", "kernel", "S11", ("prove", "agreement"),
              patch=_kernel("refund", _refund_to_granted)),
        Break("S11 kernel: can_grant ignores what is free", "kernel", "S11", ("prove", "agreement"),
              patch=_kernel("can_grant", _can_grant_unchecked)),
        Break("S15 kernel: return_grant frees twice", "kernel", "S15", ("prove", "agreement"),
              patch=_kernel("return_grant", _return_grant_twice)),
        Break("S11 kernel: cancel_grant keeps the grant", "kernel", "S11", ("prove", "agreement"),
              patch=_kernel("cancel_grant", _cancel_keeps_grant)),
        Break("S9 kernel: round_up rounds down", "kernel", "S9", ("prove", "agreement", "spec-check:system"),
              patch=_kernel("round_up", _round_up_short)),
        Break("C3 spec: freed blocks are not coalesced", "spec", "C3", ("spec-walk:caching",),
              patch=_spec_patch("memspec.spec.caching.policy", "_merge_around", _no_merge)),
        Break("C6 spec: empty_cache keeps the fully-free segments", "spec", "C6",
              ("spec-walk:caching", "caching-agreement"),
              patch=_spec_patch("memspec.spec.caching.policy", "_release_cached", _release_nothing)),
        Break("C1 spec: the reserved figure leaves out the last segment", "spec", "C1", ("spec-walk:caching",),
              patch=_reserved_short),
        Break("C2 spec: coalescing with the next block drops its bytes", "spec", "C2", ("spec-walk:caching",),
              patch=_spec_patch("memspec.spec.caching.policy", "_merge_around", _merge_loses_next)),
        Break("C4 spec: best fit searches both pools", "spec", "C4", ("spec-walk:caching",),
              patch=_spec_patch("memspec.spec.caching.policy", "_candidates", _any_pool)),
        Break("C5 kernel: the seed split rule is strict (remainder > 2 MiB)", "kernel", "C5", ("caching-kernels",),
              patch=_spec_patch("memspec.spec.caching.kernels", "should_split", _strict_seed_split)),
        Break("C8 encoding: an expandable malloc maps the whole run, not only the pages it lacks", "encoding", "C8",
              ("caching-agreement",),
              patch=_spec_patch("memspec.invariants.formal.proofs_caching_heap_actions", "map_len", _whole_run)),
        Break("C8 spec: the seed preset's free keeps its pages mapped", "spec", "C8", ("caching-agreement",),
              patch=_spec_patch("memspec.spec.caching.policy", "_unmap", _unmap_nothing)),
        Break("C8 spec: the expandable first fit picks the last arena by address", "spec", "C8",
              ("caching-agreement",),
              patch=_spec_patch("memspec.spec.caching.policy", "_find_expandable", _last_arena_first)),
        Break("C8 spec: pytorch's OOM retry waits for events but unmaps no page", "spec", "C8", ("caching-agreement",),
              patch=_spec_patch("memspec.spec.caching.policy", "_release_cached", _release_keeps_pages)),
        Break("C8 spec: empty_cache keeps the whole free pages of arenas mapped", "spec", "C8", ("caching-agreement",),
              patch=_spec_patch("memspec.spec.caching.actions", "_release_cached", _release_keeps_pages)),
    ]
    out += [
        Break("engine: a contradictory helper fact in every consecution's hypotheses", "engine", "S2", ("prove",),
              patch=_contradictory_helper),
        Break("S13 encoding: a helper lemma contradicts the invariant", "encoding", "S13", ("prove",),
              proof=_contradictory_lemma("S13")),
        Break("S15 encoding: a helper lemma contradicts the invariant", "encoding", "S15", ("prove",),
              proof=_contradictory_lemma("S15")),
        Break("S10 encoding: the inductive invariant is vacuous (Or(Inv, True))", "encoding", "S10", ("prove",),
              proof=_vacuous("S10")),
        Break("S4 encoding: the named rule is a tautology over the state", "encoding", "S4", ("prove",),
              proof=_vacuous_named("S4")),
        Break("S9 spec: a refused growth (GrantDenied) still commits a page (error branch)", "spec", "S9",
              ("agreement",), patch=_grow_refusal_grows),
        Break("S11 spec: a refused reserve (GrantDenied) still moves a page from free to granted (error branch)",
              "spec", "S11", ("agreement",),
              patch=_error_branch_mutates("system", "reserve", "GrantDenied", _refused_reserve_grants)),
        # reserve_owned's OutOfMemory is reached only on the walk on a device of two pages: caught where
        # the agreement detector walks every walk prove takes for the row (walks.WALKS), not its main three
        Break("S11 spec: a reserve_owned refused for OutOfMemory still moves a page from free to granted (error "
              "branch, on the small device's walk only)", "spec", "S11", ("agreement",),
              patch=_error_branch_mutates("system", "reserve_owned", "OutOfMemory", _refused_reserve_grants)),
        Break("S8 kernel: aligned_footprint admits one page more above the page alignment", "kernel", "S8",
              ("prove",), patch=_kernel("aligned_footprint", _footprint_one_page_more(K.aligned_footprint))),
    ]
    from memspec.invariants.formal.proofs_caching_heap import UNGUARDED

    for inv, (act_name, _guard, words) in UNGUARDED.items():
        out.append(Break(f"{inv} encoding (caching heap): {act_name} without '{words}'", "encoding", inv,
                         (f"heap:{inv}",)))
    out += _exec_weakened_breaks()
    out += _coverage_breaks()
    out += _generation_progress_breaks()
    out += _caching_knob_breaks()
    out += _caching_expandable_breaks()
    return [prove_first(b) for b in out]


#: detectors outside ``memspec prove`` (the spec's own stateful test, the caching machine's walk): a catch
#: by one of them alone is not a catch by ``prove``
OUTSIDE_PROVE = ("spec-check:", "spec-walk:")


def outside_prove(detector: str) -> bool:
    """A detector outside ``memspec prove`` -- or a catch one made (each starts with its detector's name)."""
    return detector.startswith(OUTSIDE_PROVE)


def prove_first(b: Break) -> Break:
    """``b`` with the detectors of ``memspec prove`` first and those outside it last (a fallback, reported
    as such); a break that names none of prove's detectors gets the one of its machine -- the S rows'
    agreement walk (transition and invariant agreement, the executable invariant on every visited state,
    invariant strength) or the caching allocator's agreement -- so every break is put to ``prove``."""
    own = [d for d in b.detectors if not outside_prove(d)]
    if not own:
        own = ["caching-agreement" if b.invariant.startswith("C") else "agreement"]
    return replace(b, detectors=tuple(own) + tuple(d for d in b.detectors if outside_prove(d)))


def by_prove(caught: str | None) -> bool:
    """Was the catch made by one of ``memspec prove``'s own checks (not a detector outside it)?"""
    return bool(caught) and not outside_prove(caught)


# -- caching heap encoding: the policy knobs (memory_fraction, divisions, gc threshold, release_available) --

#: knob -> the consecution goal its guard protects (in the action of proofs_caching_heap.KNOB_UNGUARDED)
KNOB_GOALS = {"memory_fraction": ("reserved",), "roundup_power2_divisions": ("C2:block",),
              "garbage_collection_threshold": ("C2:block",), "release_available": ("C2:block",)}


def detect_heap_knob(knob: str) -> str | None:
    """The knob's guarded action proves its goal and the same action with the guard removed
    (:data:`proofs_caching_heap.KNOB_UNGUARDED`) does not."""
    from memspec.invariants.formal import proofs_caching_heap as H

    return _guard_removed_refutes(*H.KNOB_UNGUARDED[knob], KNOB_GOALS[knob], knob)   # (inv, action, guard, words)


def _caching_knob_breaks() -> list[Break]:
    from memspec.invariants.formal.proofs_caching_heap import KNOB_UNGUARDED

    return [Break(f"{inv} encoding (caching heap, {knob}): {act_name} without '{words}'", "encoding", inv,
                  (f"heap-knob:{knob}",))
            for knob, (inv, act_name, _g, words) in KNOB_UNGUARDED.items()]


# --------------------------------------------------------------------------
# Detectors
# --------------------------------------------------------------------------

def _failing_checks(p: Proof) -> tuple[set[str], bool]:
    """The checks of ``p`` that fail, and an ``assumed: ...`` entry per hypothesis used but not derived
    (``memspec prove`` does not call such a row proved: it is conditional); whether the unguarded
    variant is refuted."""
    r = prove(p)
    return {c.name for c in r.checks if not c.ok} | {f"assumed: {x}" for x in r.assumed}, r.unguarded_refuted


def detect_prove(p: Proof, baseline: tuple[set[str], bool]) -> str | None:
    failed, refuted = _failing_checks(p)
    new = failed - baseline[0]
    if new:
        return f"prove: {sorted(new)[0]} fails"
    if baseline[1] and not refuted:
        return "prove: the unguarded variant is no longer refuted"
    return None


#: agreeing samples the self-test's agreement walk wants on every outcome branch of an encoded action:
#: ``memspec prove``'s own default (``--per-branch`` 25), so a break counted as caught by prove's agreement
#: is one prove's own walk (no more thorough than this) would sample.  A bug on an error branch is caught
#: only where that branch is sampled, so the walk draws until each branch has its quota.  (At 3, S1's
#: "the queue frees through the installed mechanism" went unsampled; at prove's 25 it disagrees.)
DETECT_PER_BRANCH = 25


#: invariant-agreement states per adapter of the self-test's agreement walk (prove's ``--inv-samples``
#: default): on each, the executable and encoded invariants are also compared on perturbed copies
DETECT_INV_SAMPLES = 100


def detect_agreement(inv: str, samples: int = 400, inv_samples: int = DETECT_INV_SAMPLES) -> str | None:
    """Transition agreement of ``inv``'s encoded actions with the (possibly broken) spec on the walks
    ``memspec prove`` takes for the row (:func:`agreement_adapters.run_all` with ``row``: every walk of
    :data:`memspec.invariants.formal.walks.WALKS` with an adapter credited to it, its focused walks
    included), then the invariant strength on perturbed states (:func:`agreement_perturb.strength_problems`)."""
    from memspec.invariants.formal.agreement_adapters import run_all
    from memspec.invariants.formal.agreement_perturb import strength, strength_problems

    reps = run_all(samples, 1, inv_samples, DETECT_PER_BRANCH, row=inv, max_steps=20000)
    for rep in reps:
        if rep.mismatches:
            return f"prove/agreement: {rep.action} disagrees with the spec ({len(rep.mismatches)} samples)"
    for rep in reps:   # prove's row fails on these too ("executable invariant fails on ... visited state(s)")
        if rep.exec_violations:
            return f"prove/agreement (executable invariant on the walk): {rep.exec_violations[0][:160]}"
    why = strength_problems(strength(reps, inv))
    if why:
        return f"prove/agreement (invariant strength): {inv} {why[0][:160]}"
    return None


def detect_spec_check(machine_name: str) -> str | None:
    from memspec.spec.mechanism import MECHANISM
    from memspec.spec.selfcheck import run
    from memspec.spec.system import SYSTEM

    from hypothesis import settings

    m = {"system": SYSTEM, "mechanism": MECHANISM}[machine_name]
    # No example database: a seeded run would replay the failures saved under the one key every
    # state machine shares (``run_state_machine``'s digest) by earlier breaks, earlier self-tests, or
    # other machines, and what is on disk would change which walks run.
    base = settings(database=None)
    # One derandomized sample of 100 walks is a single fixed draw: any change
    # to the action table (PROTOCOL_WEIGHTS re-weighting claim/use/respond, a
    # new action) redraws it, and a plant that needs a short sequence (S4:
    # use, drop, then poll before the stream is synchronized) can fall out of
    # it.  So several fixed samples: the derandomized one and SPEC_CHECK_SEEDS
    # seeded ones -- the same walks every time, never timing-dependent.
    for seed in (None, *SPEC_CHECK_SEEDS):
        try:
            run(m, examples=100, steps=40, seed=seed, shrink=False, base=base)
        except Exception as e:  # a broken invariant or a spec error
            first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
            return f"spec-check: {first[:140]}"
    return None


#: seeded samples of the spec's own walk that :func:`detect_spec_check` runs
#: after the derandomized one (each a fixed, reproducible draw)
SPEC_CHECK_SEEDS = (0, 1)


def detect_caching_walk(walks: int = 60, steps: int = 40) -> str | None:
    """Random walks of the caching machine (both presets, expandable or not,
    several streams), every C invariant checked after each step."""
    from memspec.spec.api import MiB
    from memspec.spec.caching import CACHING, init

    rng = random.Random(0)
    chooser = RandomChooser(rng)
    configs = [dict(policy="pytorch"), dict(policy="seed"), dict(policy="pytorch", expandable=True),
               dict(policy="pytorch", max_split_size=8 * MiB)]
    for w in range(walks):
        st = init(capacity=64 * MiB, **configs[w % len(configs)])
        for _ in range(steps):
            try:
                acts = [a for a in CACHING.actions if a.available(st)]
            except Exception as e:  # the spec's own state is broken
                return f"spec-walk: the state no longer reads ({type(e).__name__}: {e})"
            if not acts:
                break
            act = rng.choices(acts, weights=[a.weight for a in acts])[0]
            try:
                args = act.draw_args(st, chooser)
                outs = act.step(st, **args)
                # the spec's own answers: a witnessed return where there is one (a Raises
                # branch beside it is an implementation's deviation the spec diagnoses)
                served = [b for b in outs.branches if isinstance(b, Returns) and b.witness is not None]
                if not served:  # an OOM or a refusal: nothing the spec itself changes
                    continue
                br = rng.choice(served)
                follow(br)
            except Exception as e:  # the spec itself broke
                return f"spec-walk: {act.name} raised {type(e).__name__}: {e}"
            bad = CACHING.check_invariants(st)
            if bad:
                inv, why = bad[0]
                return f"spec-walk: {inv} after {act.name}: {why[:120]}"
    return None


def detect_caching_agreement() -> str | None:
    """Transition agreement of the caching heap encoding with ``spec/caching``
    (:mod:`memspec.invariants.formal.proofs_caching_agree`: boundary and event
    sweeps of both presets, then random walks), on the (possibly broken) spec."""
    from memspec.invariants.formal.proofs_caching_agree_runs import run_agreement

    rep = run_agreement(seed=0)
    if rep.mismatches:
        return f"prove/caching agreement: {len(rep.mismatches)} disagreements, e.g. {rep.mismatches[0][:120]}"
    return None


# -- derived coverage (issue 33): a machine that leaves out a writer of what its invariant reads --------

#: ``(row, encoded action)`` dropped from the row's machine (the agreement adapter goes with it: the
#: action is no longer in the proof): each encodes a spec action that writes what the row reads
DROPPED = (("S4", "poll"), ("S11", "m_deallocate"), ("S15", "expire"), ("S2", "commit_owned"))


def _dropped(inv: str, action: str) -> Callable[[], Proof]:
    def build() -> Proof:
        p = _proof(inv)
        if not any(a.name == action for a in p.actions):
            raise LookupError(f"{inv}'s machine has no encoded action {action} to drop")
        return replace(p, actions=[a for a in p.actions if a.name != action])
    return build


@contextmanager
def _undeclared(level: str, name: str, owner: str, doc: str, blame: str,
                effect: Callable[[Any], None]) -> Iterator[None]:
    """A spec action no ENCODES names, added to the ``level`` machine for the duration: it takes no
    argument and returns None, ``effect(state)`` its only step (blamed on ``blame``)."""
    from memspec.invariants.formal.proofs_catalog import machines
    from memspec.spec.core import Action, outcomes

    def step(s: Any) -> Any:
        return outcomes(Returns("None", lambda v: v is None, lambda _v: effect(s), lambda: None), blame=blame)

    m = machines()[level]
    with _patched(m, "actions", m.actions + [Action(name, owner, doc, {}, step, lambda sut: None)]):
        yield


def _undeclared_refund() -> Any:
    """A refund path that lowers the session's charge and forgets its physical bytes (what S2 reads)."""
    from memspec.spec import ep

    def effect(s: Any) -> None:
        if s.charged_by.get("session", 0) >= s.page:
            ep.refund(s, "session", s.page)
    return _undeclared("system", "refund_forgetting_physical", "Governor",
                       "A refund that forgets the physical bytes.", "S2", effect)


def _undeclared_trim() -> Any:
    """A trim that takes a page of private bytes off the physical figure (both fields S5 reads; the
    executable S5 still holds, so only derived coverage sees it)."""
    def effect(s: Any) -> None:
        if s.private_bytes >= s.page and s.physical >= s.page:
            s.private_bytes -= s.page
            s.physical -= s.page
    return _undeclared("mechanism", "trim_private", "Mechanism", "A trim of private pages no encoding declares.",
                       "S5", effect)


def detect_coverage(p: Proof) -> str | None:
    """``memspec prove``'s derived coverage of ``p`` (fresh spec-only walks: a planted spec action is
    walked): an unexplained gap or a stale reviewed line fails the row."""
    from memspec.invariants.formal import coverage as F

    why = F.row_coverage(p, F.derive()).problems
    return f"prove/coverage: {why[0][:200]}" if why else None


def _coverage_breaks() -> list[Break]:
    out = [Break(f"{inv} encoding: {act} dropped from the machine (with its adapter)", "encoding", inv,
                 ("coverage",), proof=_dropped(inv, act)) for inv, act in DROPPED]
    out.append(Break("S2 spec: an undeclared action refunds a charge and keeps the physical bytes", "spec", "S2",
                     ("coverage",), patch=_undeclared_refund))
    out.append(Break("S5 spec: an undeclared mechanism action trims private pages off the physical figure", "spec",
                     "S5", ("coverage",), patch=_undeclared_trim))
    return out


#: the detectors run per row: a break's is keyed by its invariant (``prove:S9``), as is its baseline
PER_ROW = ("prove", "agreement", "coverage")


def detector_key(d: str, inv: str) -> str:
    """Detector ``d`` of a break on ``inv``, as its baseline is keyed."""
    return f"{d}:{inv}" if d in PER_ROW else d


def run_key(key: str, proof: Proof | None = None, baselines: dict[str, Any] | None = None) -> Any:
    """The detector ``key`` names (:func:`detector_key`; after its colon, its argument).  ``proof``: the
    row's proof, broken (default the row's own); ``baselines``: the unbroken project's answers, where
    this is a break's run -- ``prove`` then answers with the checks that fail now and did not there;
    without them (a baseline) with the failing checks themselves (:func:`_failing_checks`)."""
    kind, _, arg = key.partition(":")
    if kind in ("prove", "coverage"):
        p = proof if proof is not None else _proof(arg)
        if kind == "coverage":
            return detect_coverage(p)
        return _failing_checks(p) if baselines is None else detect_prove(p, baselines[key])
    run = {"agreement": lambda: detect_agreement(arg), "spec-check": lambda: detect_spec_check(arg),
           "spec-walk": detect_caching_walk, "heap": lambda: detect_heap(arg),
           "heap-knob": lambda: detect_heap_knob(arg), "heap-goal": lambda: detect_heap_goal(*arg.rsplit(":", 1)),
           "caching-kernels": detect_caching_kernels,
           "caching-agreement": detect_caching_agreement, "progress": detect_progress}.get(kind)
    if run is None:
        raise ValueError(key)
    return run()


def run_detector(d: str, b: Break, baselines: dict[str, Any]) -> str | None:
    return run_key(detector_key(d, b.invariant), b.proof() if b.proof is not None else None, baselines)


# --------------------------------------------------------------------------
# Running the catalog: the baselines, then every break in its own process
# --------------------------------------------------------------------------

def _baseline_keys(breaks: list[Break]) -> list[str]:
    """The detectors to run on the unbroken project: ``prove:<inv>`` for each invariant with a break the
    Z3 checks catch, ``agreement:<inv>`` and ``coverage:<inv>`` likewise (:data:`PER_ROW`), then each
    other detector the breaks use (the heap detectors judge a break against its own unbroken action)."""
    used = {d for b in breaks for d in b.detectors}
    keys = [f"{d}:{inv}" for d in PER_ROW for inv in sorted({b.invariant for b in breaks if d in b.detectors},
                                                            key=lambda x: (int(x[1:]), x))]
    keys += ["progress"] if "progress" in used else []
    keys += sorted(d for d in used if d.startswith("spec-"))
    keys += [d for d in ("caching-kernels", "caching-agreement") if d in used]
    return keys


def _run_break(b: Break, baselines: dict[str, Any], problems: dict[str, Any]) -> str | None:
    """Plant ``b`` (its patch entered, restored after), run its detectors until one fires; the catch."""
    with b.patch() if b.patch is not None else nullcontext():
        for d in b.detectors:
            if detector_key(d, b.invariant) in problems:
                continue  # a detector that fires unbroken proves nothing
            caught = run_detector(d, b, baselines)
            if caught:
                return caught
        return None


#: what the forked workers read: (the breaks, the baselines, the problems), set before the pool forks
_WORK: tuple[list[Break], dict[str, Any], dict[str, Any]] | None = None


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def _baseline_job(key: str) -> tuple[Any, float, float]:
    """One detector on the unbroken project (:func:`run_key`): for ``prove:<inv>`` the failing checks and
    whether the unguarded variant is refuted; for the others the detector's answer (None: silent)."""
    return _timed(lambda: run_key(key))


def _break_job(i: int) -> tuple[Any, float, float]:
    assert _WORK is not None
    breaks, baselines, problems = _WORK
    return _timed(lambda: _run_break(breaks[i], baselines, problems))


#: CPU and wall seconds of the last :func:`run_self_test` (for the report only): ``baselines`` and
#: ``breaks`` each the sum over their processes, ``wall`` the whole run's
LAST_RUN: dict[str, float] = {}


def run_self_test(breaks: list[Break] | None = None, *, jobs: int = 1, isolate: bool = True,
                  known: dict[str, Any] | None = None) -> tuple[list[tuple[Break, str | None, float]], dict[str, Any]]:
    """The kill table: ``(break, the catch or None, seconds)`` per break, and the detectors that fire on
    the unbroken project (``problems``: they are not used).

    The baselines run first, then every break.  With ``isolate`` (and a platform that can fork) every
    baseline and every break runs in a process of its own, forked from this one before any of them ran,
    ``jobs`` at a time: a break is judged exactly as if it were planted alone, whatever ran before it.
    Why: without isolation a break runs in the state its predecessors left.  Row 23 of the catalog
    (S13's eager shared free) is caught only by :func:`detect_spec_check`'s seeded walks, and was NOT
    CAUGHT after the whole run's baselines yet caught alone.  Hypothesis draws some integers from a pool
    of constants harvested from every project module imported so far (re-scanned whenever
    ``sys.modules`` grows), so which modules earlier detectors had imported changed the seeded walks;
    with that pool frozen the same sequence catches it.  Isolated, each break starts from this process's
    state (the same for every break).  The rows do not depend on ``jobs``, only the seconds do.

    ``known``: baselines an earlier run of this process computed (a detector's answer on the unbroken
    project is a function of the project's code), reused by key; the ones this run computes are added
    to it.  Several runs over breaks that share detectors (the test suite's) then pay for each once."""
    global _WORK
    breaks = breaks if breaks is not None else catalog()
    t0 = time.perf_counter()
    known = {} if known is None else known
    keys = [k for k in _baseline_keys(breaks) if k not in known]
    # isolated: each job in a process of its own forked from this one (``jobs`` at a time, every fork on
    # this thread: :mod:`memspec.invariants.forked`): whatever it leaves behind (a patch not restored, a
    # cache filled, a Hypothesis database entry, a module imported, a random state) dies with its process
    def run(job: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        return in_fresh_processes(job, items, jobs) if isolate and forkable() else [job(x) for x in items]

    base = run(_baseline_job, keys)
    known.update((k, v) for k, (v, _w, _c) in zip(keys, base))
    baselines = {k: known[k] for k in _baseline_keys(breaks)}
    problems: dict[str, Any] = {}
    for k, v in baselines.items():
        if k.startswith("prove:"):
            if v[0]:
                problems[k] = f"fails unbroken: {sorted(v[0])}"
        elif v:
            problems[k] = v
    _WORK = (breaks, baselines, problems)
    try:
        done = run(_break_job, list(range(len(breaks))))
    finally:
        _WORK = None
    LAST_RUN.clear()
    LAST_RUN.update(baselines=sum(c for _v, _w, c in base), breaks=sum(c for _v, _w, c in done),
                    wall=time.perf_counter() - t0)
    return [(b, caught, secs) for b, (caught, secs, _cpu) in zip(breaks, done)], problems


def names(b: Break, caught: str) -> bool:
    """Does the catch name the invariant the break is planted against (a Z3
    check of its own proof, or its id in the reason)?"""
    return caught.startswith("prove") or f"'{b.invariant}'" in caught or f" {b.invariant} " in caught


def main(jobs: int = 1) -> int:
    """The kill table; exit 0 only when every planted break is caught by ``memspec prove``'s own checks
    (a break that survives, or that only a detector outside prove catches, is named and fails the run)."""
    t0 = time.perf_counter()
    rows, problems = run_self_test(jobs=jobs)
    print(f"{'#':>2} {'break':<78} {'kind':<8} {'inv':<4} caught by")
    print("-" * 140)
    for k, (b, caught, secs) in enumerate(rows, 1):
        tag = "" if not caught or names(b, caught) else " (names another rule)"
        tag += "" if not caught or by_prove(caught) else " (NOT BY PROVE)"
        print(f"{k:>2} {b.name[:78]:<78} {b.kind:<8} {b.invariant:<4} {(caught or 'NOT CAUGHT')[:150]}{tag}  [{secs:.1f}s]")
    killed = sum(1 for _b, c, _s in rows if c)
    survivors = [b.name for b, c, _s in rows if not c]
    outside = [b.name for b, c, _s in rows if c and not by_prove(c)]
    covered = sorted({b.invariant for b, c, _s in rows if c and names(b, c)}, key=lambda x: (x[0], int(x[1:])))
    print(f"\n{killed}/{len(rows)} breaks killed, {killed - len(outside)} by memspec prove's own checks; "
          f"invariants covered by a killed break: {', '.join(covered)}")
    for n in survivors:
        print(f"SURVIVED: {n}")
    for n in outside:
        print(f"caught only outside memspec prove: {n}")
    missing = [i for i in expected_covered() if i not in covered]
    if missing:
        print(f"no killed break for: {', '.join(missing)}")
    for k, v in problems.items():
        print(f"detector {k} fires on the unbroken project (not counted): {v}")
    isolated = "each break in a process of its own" if forkable() else "in this process (no fork here)"
    print(f"self-test {time.perf_counter() - t0:.1f}s wall; CPU {LAST_RUN['baselines']:.1f}s baselines + "
          f"{LAST_RUN['breaks']:.1f}s breaks; --jobs {jobs}, {isolated}")
    return 0 if not survivors and not outside and not problems else 1


# ==========================================================================
# G1 (configuration generations) and P1 (progress)
# ==========================================================================

def _s15_respond_never_grants(s: Any, a: Any) -> Any:
    """S15's respond, but a ticket that reaches its amount stays pending."""
    out, s2 = E._s15_respond(s, a)
    return out, s2.set(tstate=s.tstate)


def _ticket_end_keeps_failed(orig: Any) -> Any:
    from memspec.spec.api import TicketState

    def ticket_end(s: Any, t: Any, state: str) -> int:
        if state == TicketState.FAILED:
            return 0  # reconfigure "fails" the ticket but leaves it pending, holding its bytes
        return orig(s, t, state)
    return ticket_end


def detect_progress() -> str | None:
    """P1 as ``memspec prove`` judges its row (:func:`proofs_progress.record`: Z3's admission proof over
    S15's machine, not vacuous, tight; then the spec walk): the first reason it is not proved."""
    from memspec.invariants.formal.proofs_progress import record

    why = record(150, 0)["_why"]
    return f"progress: P1 not proved: {why[0][:140]}" if why else None


def _generation_progress_breaks() -> list[Break]:
    p = _proof("G1")
    return [
        Break(f"G1 encoding: {p.unguarded.name} without its guard ({p.guard})", "encoding", "G1", ("prove",),
              proof=_guard_removed("G1")),
        Break("S15 spec: reconfigure leaves the old generation's tickets pending", "spec", "S15",
              ("agreement", "spec-check:system"), patch=_spec_patch("memspec.spec.governor", "ticket_end",
                                                        _ticket_end_keeps_failed)),
        Break("P1 encoding: respond never grants a ticket that holds its amount", "encoding", "P1", ("progress",),
              # S15's machine, which P1's sequence runs on, with respond swapped
              patch=lambda: _patched(E, "S15", _swap("S15", "respond", _s15_respond_never_grants)())),
        Break("P1 spec: ModelResidency cannot release its cold weights", "spec", "P1", ("progress",),
              patch=_spec_patch("memspec.spec.holders", "victims",
                                lambda _o: (lambda s, released: [] if released == 0 else None))),
    ]


# ==========================================================================
# the caching heap encoding with expandable segments (proofs_caching_heap's flag ``ex``)
# ==========================================================================

#: expand:map without its device check (proofs_caching_heap.KNOB_UNGUARDED["expandable_segments"]) breaks
#: the reserved <= device conjunct (C1): the knob break above is generated from that entry
KNOB_GOALS["expandable_segments"] = ("reserved",)


def _map_ignores_the_device(orig: Any) -> Any:
    def map_(st: Any, seg: Any, i: int, size: int) -> Any:
        with _patched(st, "policy", replace(st.policy, capacity=1 << 50)):
            return orig(st, seg, i, size)
    return map_


def _map_in_small_pages(orig: Any) -> Any:
    """The heap's ``expand:map`` mapping 2 MiB granules on pytorch's large pool, not its 20 MiB pages (its
    precondition still checks the page-rounded run): the run's unmapped rest starts mid-page, and a later
    mapping there lacks more than the request rounded up to a page (less than the request plus a page):
    C8's exact bound, and only it, fails (its lemma's consecution, ``step:expand:map:align``)."""
    from memspec.invariants.formal import proofs_caching_heap_actions as A
    from memspec.invariants.formal.proofs_caching_heap_terms import K_ROUND_LARGE

    def map_step(s: Any, a: Any, guards: frozenset = frozenset()) -> Any:
        with _patched(A, "page", lambda _s, _small: K_ROUND_LARGE):
            return orig(s, a, guards)
    return map_step


def detect_heap_goal(act_name: str, goal: str) -> str | None:
    """``memspec prove``'s consecution check of one goal of one heap action (``step:<act>:<goal>``) fails."""
    from memspec.invariants.formal import proofs_caching_heap as H

    act = next(a for a in H.actions() if a.name == act_name)
    bad = [(n, r) for n, r, _t in H.consecution(act, 60000, only=(goal,)) if r not in ("proved", "framed")]
    return f"prove (caching heap): step:{act_name}:{bad[0][0]} {bad[0][1]}" if bad else None


def _caching_expandable_breaks() -> list[Break]:
    return [Break("C1 spec: an expandable arena maps pages past the device", "spec", "C1", ("caching-agreement",),
                  patch=_spec_patch("memspec.spec.caching.policy", "_map", _map_ignores_the_device)),
            Break("C8 encoding: expand:map maps 2 MiB granules of pytorch's 20 MiB pages (an OOM lacking more than "
                  "the page-rounded request)", "encoding", "C8", ("heap-goal:expand:map:align",),
                  patch=_spec_patch("memspec.invariants.formal.proofs_caching_heap_actions", "map_step",
                                    _map_in_small_pages))]
