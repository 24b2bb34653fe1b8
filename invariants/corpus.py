"""Z3 drives the implementations: traces Z3 finds, replayed against targets.

DESIGN.md (*Formal checks*): the traces the solver synthesizes are run
against every target through the conformance harness, which checks at each
step that the target takes the branch the spec takes.  ``memspec conform
--corpus`` runs them.

What the corpus holds:

* for each caching preset (``pytorch``, ``seed``) the shortest fragmentation
  OOM Z3 synthesizes (:func:`memspec.invariants.formal.proofs_caching.synthesize`:
  free bytes >= the request, yet malloc fails) as a ``malloc``/``free``
  sequence on the caching machine;
* for every Z3 encoding of seed 000 that exists when the corpus is built
  (:func:`memspec.invariants.formal.proofs_catalog.all_proofs`, read at run time)
  and every encoded action with a spec counterpart (the agreement adapters
  of :mod:`memspec.invariants.formal.agreement_adapters`), one trace per outcome
  branch Z3 finds for it (:func:`memspec.invariants.formal.proofs.branches`), and
  one per unguarded variant: a step where removing the guard changes what
  the encoding does (the guarded action refuses where the unguarded one
  accepts, or both accept with different next states) -- the step Z3's
  refutation of the unguarded variant turns on.

How a seed-000 trace is found (:func:`realize`): the encodings are abstract
machines, so a trace is realized at the spec level by a walk of the spec
machine run against the reference target (the harness checks every step).
Z3 drives it: before each step, each candidate's arguments are projected
onto the encodings and the encoded relation decides which branch the step
takes there; candidates that reach a branch (or a guard) no trace reaches
yet are preferred; a step whose encoded branch is the goal and whose target
answer is consistent with it ends the goal's trace.  Replaying a trace on a
target (:func:`replay_seed000`) runs it under the harness (every step must
take a branch the spec permits) and the last step must end in the outcome
recorded on the reference: the implementation takes the branch the spec
takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memspec.spec.api import MiB

CAPACITY = 40 * MiB  # the synthesis' device


@dataclass
class CorpusTrace:
    name: str
    source: str                      # what produced it
    preset: str                      # the caching preset it was synthesized for
    steps: list[tuple[str, dict[str, Any]]]
    expect: str                      # the outcome of the last step on its own preset
    capacity: int = CAPACITY


@dataclass
class ReplayResult:
    trace: CorpusTrace
    target: str
    ok: bool
    detail: str
    branches: list[tuple[str, str]] = field(default_factory=list)  # (action, outcome) per step
    #: PASS, FAIL (a Violation: the harness judged an answer impermissible) or UNTESTED (every answer
    #: permitted, but the trace did not end on the synthesized outcome: no verdict on it)
    status: str = ""

    def __post_init__(self) -> None:
        if not self.status:
            self.status = "PASS" if self.ok else "FAIL"


def _steps_from_synthesis(syn: Any) -> list[tuple[str, dict[str, Any]]]:
    """The synthesized text trace as caching-machine steps; a free names the
    spec reference its malloc made (found by running the spec alone:
    :func:`memspec.invariants.formal.proofs_caching.spec_steps`)."""
    from memspec.invariants.formal.proofs_caching import spec_steps

    return [(action, args) for action, args, _st, _first in spec_steps(syn, CAPACITY)]


def build_corpus(depth: int = 6) -> list[CorpusTrace]:
    """Every trace Z3 synthesizes for the corpus (see the module docstring)."""
    from memspec.invariants.formal import synthesize

    out = []
    for preset in ("pytorch", "seed"):
        syn = synthesize(preset, max_depth=depth)
        if syn.depth is None:
            continue
        out.append(CorpusTrace(f"fragmentation-oom[{preset}]", f"Z3 synthesis, depth {syn.depth}", preset,
                               _steps_from_synthesis(syn), "OutOfMemory"))
    return out


def replay(target: str, trace: CorpusTrace, timeout: float = 5.0) -> ReplayResult:
    """Run ``trace`` on ``target`` and the spec side by side (the harness
    fails the run where the target leaves the spec's branch); on the preset
    it was synthesized for, the last step must also end as expected."""
    from memspec.invariants import harness as H
    from memspec.invariants.repro import replay as harness_replay

    try:
        run = harness_replay(target, "caching", [(a, args, []) for a, args in trace.steps],
                             capacity=trace.capacity, timeout=timeout)
    except H.Violation as v:
        return ReplayResult(trace, target, False, f"{v.invariant} [{v.cause}] {v.reason}")
    branches = [(t.action, t.outcome) for t in run.trace]
    pol = getattr(run.state, "policy", None)
    preset, expandable = getattr(pol, "preset", None), getattr(pol, "expandable", False)
    capacity = getattr(pol, "capacity", None)
    if preset == trace.preset and not expandable and capacity == trace.capacity:
        last = branches[-1][1] if branches else ""
        if trace.expect not in last:
            # every answer was one the spec permits (else a Violation above): not a failure of the target
            return ReplayResult(trace, target, False, f"last step {last!r}, which the spec permits; the synthesis "
                                f"ended {trace.expect}: the trace's end not reached", branches, "UNTESTED")
        return ReplayResult(trace, target, True, f"{len(branches)} steps, each on the spec's branch; ends {trace.expect}",
                            branches)
    return ReplayResult(trace, target, True, f"{len(branches)} steps, each on the spec's branch "
                        f"(target: {preset}{' + expandable' if expandable else ''}, capacity {capacity}: the "
                        "trace's end is not asserted there)", branches)


def run_corpus(targets: list[str], depth: int = 6) -> tuple[list[ReplayResult], int]:
    """Replay the caching corpus on every target; ``(results, number of traces)``."""
    corpus = build_corpus(depth)
    return [replay(t, tr) for t in targets for tr in corpus], len(corpus)


def _is_caching(target: str) -> bool:
    from memspec.invariants.planning import kind_of
    from memspec.invariants.discovery import resolve

    try:
        return kind_of(resolve(target), None) == "caching"
    except Exception:  # noqa: BLE001
        return False


def main(targets: list[str], steps: int = 3000) -> int:
    """``memspec conform --corpus``: one row per (target, trace), then the counts."""
    caching_targets = [t for t in targets if _is_caching(t)]
    seed_targets = [t for t in targets if t not in caching_targets]
    results, n = run_corpus(caching_targets) if caching_targets else ([], 0)
    branches = {b for r in results for b in r.branches}
    for r in results:
        print(f"{r.target:<30} {r.trace.name:<28} {r.status:<8}  {r.detail}")
    failures = sum(1 for r in results if r.status == "FAIL")
    if caching_targets:
        print(f"\ncaching corpus: {n} Z3 trace(s) x {len(caching_targets)} target(s); {len(branches)} distinct "
              f"(action, branch) pairs taken; {failures} failure(s)")
    ran = any(r.ok for r in results)
    if seed_targets:
        gs, traces = build_seed000(steps=steps)
        reps = [r for t in seed_targets for r in _replay_or_realize(t, traces, steps)]
        for r in reps:
            if not r.ok:
                print(f"{r.target:<30} {r.trace.goal.name:<60} {r.status:<8}  {r.detail}")
        failures += sum(1 for r in reps if r.status == "FAIL")
        ran = ran or any(r.ok for r in reps)
        missing = [g.name for g in gs if g not in {t.goal for t in traces}]
        nb = len([g for g in gs if g.kind == "branch"])
        nu = len(gs) - nb
        cov_b = len([t for t in traces if t.goal.kind == "branch"])
        print(f"\nseed-000 corpus: {len(traces)} Z3-driven trace(s) ({cov_b}/{nb} encoded branches, "
              f"{len(traces) - cov_b}/{nu} unguarded variants) x {len(seed_targets)} target(s): "
              f"{sum(1 for r in reps if r.ok)}/{len(reps)} replays on the spec's branches"
              + "".join(f", {k} {st}" for st in ("FAIL", "UNTESTED", "N/A")
                        for k in [sum(1 for r in reps if r.status == st)] if k))
        for t in seed_targets:
            if not any(r.ok for r in reps if r.target == t):
                print(f"  {t}: no trace reached its goal here: nothing of the seed-000 corpus was tested on it")
        for name in missing:
            print(f"  not reached in {steps} steps per level: {name}")
    return 0 if ran and not failures else 1


# ==========================================================================
# Seed 000: a trace per encoded branch and per unguarded variant
# ==========================================================================

#: the device every seed-000 trace is realized and replayed on (32 pages of 2 MiB:
#: small, so refusals for want of memory are reachable)
SEED000_CAPACITY = 64 * MiB
REALIZE_ON = "reference"


@dataclass(frozen=True)
class Goal:
    level: str          # "mechanism" or "system"
    invariant: str
    action: str         # the encoded action
    spec_action: str
    branch: str         # the encoded outcome; "unguarded" goals: the guard's refusal
    kind: str = "branch"

    @property
    def name(self) -> str:
        tag = "unguarded" if self.kind == "unguarded" else self.branch
        return f"{self.invariant}:{self.level}:{self.spec_action}/{self.action}/{tag}"


@dataclass
class Seed000Trace:
    goal: Goal
    steps: list[tuple[str, dict[str, Any]]]
    expect: str         # the last step's outcome on the reference: "ok" or the error's name
    encoded: str        # the encoding's branch at the last step
    #: every step's outcome on the reference, in order ("ok" or the error's name): a replay on
    #: another target follows the trace only while the target takes the same branches
    outcomes: list[str] = field(default_factory=list)


def _adapters() -> list[Any]:
    """Every adapter the agreement module defines now (any module-level list of them)."""
    from memspec.invariants.formal import agreement_adapters as A
    from memspec.invariants.formal import Adapter

    seen: dict[tuple[str, str, str], Any] = {}
    for v in vars(A).values():
        if isinstance(v, list) and v and all(isinstance(x, Adapter) for x in v):
            for ad in v:
                seen.setdefault((ad.invariant, ad.action, ad.spec_action), ad)
    return list(seen.values())


def _level_of(spec_action: str) -> str | None:
    from memspec.spec.mechanism import MECHANISM
    from memspec.spec.system import SYSTEM

    for lvl, m in (("system", SYSTEM), ("mechanism", MECHANISM)):
        if any(a.name == spec_action for a in m.actions):
            return lvl
    return None


def _lvl_for(ad: Any) -> str | None:
    """The level an adapter projects from: the mechanism adapters project MechState."""
    from memspec.invariants.formal import agreement_adapters as A

    if ad in getattr(A, "MECH_ADAPTERS", []):
        return "mechanism"
    return _level_of(ad.spec_action) if _level_of(ad.spec_action) == "system" else None


def goals() -> list[Goal]:
    """Every branch of every encoded action with an adapter, and every unguarded
    variant with one, for the encodings that exist now."""
    from memspec.invariants.formal import all_proofs, branches

    proofs = {p.id: p for p in all_proofs()}
    out: list[Goal] = []
    cache: dict[tuple[str, str], list[str]] = {}
    for ad in _adapters():
        p = proofs.get(ad.invariant)
        lvl = _lvl_for(ad)
        if p is None or lvl is None:
            continue
        try:
            act = p.action(ad.action)
        except KeyError:
            continue
        key = (p.id, act.name)
        if key not in cache:
            cache[key] = branches(p, act)
        out += [Goal(lvl, p.id, act.name, ad.spec_action, b) for b in cache[key]]
        # the rows the adapter also credits share the machine (its branches are the same goals), each with an
        # unguarded variant of its own
        for q in [p] + [proofs[i] for i in ad.also if i in proofs]:
            if q.unguarded.name == act.name:
                out.append(Goal(lvl, q.id, act.name, ad.spec_action, "refused", "unguarded"))
    return out


def _outcome_name(ts: Any) -> str:
    return "ok" if ts.outcome.startswith("returns") else ts.outcome.split()[1].rstrip(":")


class _Evaluator:
    """The encoded outcome of a candidate step, from the projected pre-state."""

    def __init__(self) -> None:
        from memspec.invariants.formal import all_proofs

        self.proofs = {p.id: p for p in all_proofs()}
        self.cache: dict[tuple[Any, ...], Any] = {}

    def outcome(self, ad: Any, act: Any, state: Any, args: dict[str, Any], taken: str) -> str | None:
        from memspec.invariants.formal import Compiled

        try:
            pr = ad.project(state, args, taken)
        except Exception:  # noqa: BLE001  (a projection outside its scope: no goal here)
            return None
        if pr is None:
            return None
        enc_state, enc_args, u = pr
        p = self.proofs[ad.invariant]
        key = (p.id, act.name, id(act), u.nobj, u.pages)
        c = self.cache.get(key)
        if c is None:
            c = self.cache[key] = Compiled(p, act, u.nobj, u.pages, ())
        try:
            return c.values(enc_state, enc_args)[("outcome", None)]
        except Exception:  # noqa: BLE001
            return None


    def differs(self, ad: Any, guarded: Any, unguarded: Any, state: Any, args: dict[str, Any],
                taken: str) -> str | None:
        """Where removing the guard changes what the encoding does here: the
        guarded outcome (``"refused: <error>"``), or ``"effect"`` when both
        accept but the next states differ; ``None`` where the guard is idle.
        One closed formula per (proof, universe), decided by substitution."""
        import z3

        from memspec.invariants.formal import ARR, BARR, BOOL, INT, Compiled, fresh
        from memspec.invariants.formal.proofs import _args

        try:
            pr = ad.project(state, args, taken)
        except Exception:  # noqa: BLE001
            return None
        if pr is None:
            return None
        enc_state, enc_args, u = pr
        p = self.proofs[ad.invariant]
        key = ("diff", p.id, id(guarded), id(unguarded), u.nobj)
        c = self.cache.get(key)
        if c is None:
            st, a = fresh(p.fields, "gd"), _args(guarded, "gd")
            og, sg = guarded.step(st, a)
            ou, su = unguarded.step(st, a)
            diffs = []
            for f, k in p.fields.items():
                if k in (INT, BOOL):
                    diffs.append(sg[f] != su[f])
                elif k in (ARR, BARR):
                    diffs += [z3.Select(sg[f], i) != z3.Select(su[f], i) for i in range(u.nobj)]
            c = self.cache[key] = (st, a, og, ou, z3.Or(og != ou, *diffs))
        st, a, og, ou, expr = c
        subs = [(st[f], concrete(k, enc_state[f])) for f, k in p.fields.items()]
        subs += [(a[n], concrete(k, enc_args[n])) for n, k in guarded.params.items()]
        try:
            if not Compiled._truth(z3.substitute(expr, *subs)):
                return None
            go = z3.simplify(z3.substitute(og, *subs))
            uo = z3.simplify(z3.substitute(ou, *subs))
        except Exception:  # noqa: BLE001
            return None
        if not (z3.is_int_value(go) and z3.is_int_value(uo)):
            return None
        from memspec.invariants.formal import OUTCOMES

        gname, uname = OUTCOMES[go.as_long()], OUTCOMES[uo.as_long()]
        if gname != uname:
            return f"refused: {gname}" if uname == "ok" else None
        return "effect"


def concrete(kind: str, value: Any) -> Any:
    from memspec.invariants.formal import concrete as lit

    return lit(kind, value)


def _permitted(outs: Any) -> list[str]:
    from memspec.invariants.formal import outcome_name

    return sorted({outcome_name(b) for b in outs.branches})


def realize(level: str, wanted: list[Goal], *, steps: int = 3000, seed: int = 0,
            restart_every: int = 30, on: str | None = None) -> dict[Goal, Seed000Trace]:
    """Walk the spec at ``level`` against target ``on`` (default
    :data:`REALIZE_ON`, the reference), Z3's encoded relations steering
    towards the goals (module docstring); the trace found for each goal
    reached."""
    import random

    from memspec.invariants import engine as E
    from memspec.spec.core import RandomChooser
    from memspec.invariants.guard import CallGuard
    from memspec.invariants.planning import make_plan

    rng = random.Random(seed)
    chooser = RandomChooser(rng)
    plan = make_plan(on or REALIZE_ON, level, capacity=SEED000_CAPACITY)
    ev = _Evaluator()
    by_spec: dict[str, list[tuple[Goal, Any, Any]]] = {}
    # an adapter projects onto its machine, which the rows it also credits share
    ads = {(i, a.action, a.spec_action): a for a in _adapters() for i in (a.invariant,) + tuple(a.also)}
    for g in wanted:
        ad = ads[(g.invariant, g.action, g.spec_action)]
        p = ev.proofs[g.invariant]
        act = p.unguarded if g.kind == "unguarded" else p.action(g.action)
        by_spec.setdefault(g.spec_action, []).append((g, ad, act))
    found: dict[Goal, Seed000Trace] = {}
    done = 0
    while done < steps and len(found) < len(wanted):
        run = E.Run(plan, CallGuard(plan.timeout))
        trail: list[tuple[str, dict[str, Any]]] = []
        took_all: list[str] = []
        try:
            for _ in range(restart_every):
                done += 1
                avail = run.available()
                needy = [a for a in avail if any(g not in found for g, _ad, _act in by_spec.get(a.name, []))]
                pool = needy if needy and rng.random() < 0.7 else avail
                act = rng.choices(pool, weights=[a.weight for a in pool])[0]
                best = None
                for _try in range(4):
                    args = act.draw_args(run.state, chooser)
                    outs = act.step(run.state, **args)
                    hits = []
                    for taken in _permitted(outs):
                        for g, ad, enc in by_spec.get(act.name, []):
                            if g in found:
                                continue
                            if g.kind == "unguarded":
                                guarded = ev.proofs[g.invariant].action(g.action)
                                d = ev.differs(ad, guarded, enc, run.state, args, taken)
                                if d is not None:
                                    hits.append((g, taken, d))
                                continue
                            got = ev.outcome(ad, enc, run.state, args, taken)
                            if got == g.branch:
                                hits.append((g, taken, got))
                    if best is None or hits:
                        best = (args, hits)
                    if hits:
                        break
                args, hits = best
                ts = run.apply(act, args, [])
                trail.append((act.name, dict(args)))
                took = _outcome_name(ts)
                took_all.append(took)
                for g, taken, enc_out in hits:
                    if g not in found and taken == took:
                        found[g] = Seed000Trace(g, list(trail), took, enc_out, list(took_all))
        except E.Violation:  # the reference failing a check here is a finding of its own, not a trace
            pass
        finally:
            run.close()
    return found


def build_seed000(steps: int = 3000, seed: int = 0) -> tuple[list[Goal], list[Seed000Trace]]:
    """The goals Z3's encodings give now and the traces realized for them."""
    gs = goals()
    out: list[Seed000Trace] = []
    for level in ("mechanism", "system"):
        mine = [g for g in gs if g.level == level]
        if mine:
            out += list(realize(level, mine, steps=steps, seed=seed).values())
    return gs, out


@dataclass
class Seed000Replay:
    trace: Seed000Trace
    target: str
    ok: bool
    detail: str
    #: PASS (every step on the reference's branch, the goal reached), FAIL (the harness judged an
    #: answer of the target impermissible: a Violation, with its invariant), N/A (the trace needs
    #: what this target does not offer: an action of a role it lacks, or it declined a capability
    #: with Unsupported, which the spec permits) or UNTESTED (the target took another branch the
    #: spec permits, so the trace cannot go on to its goal: no verdict on this goal)
    status: str = ""

    def __post_init__(self) -> None:
        if not self.status:
            self.status = "PASS" if self.ok else "FAIL"


_PLANS: dict[tuple[str, str], Any] = {}


def _plan(target: str, level: str, timeout: float) -> Any:
    from memspec.invariants.planning import make_plan

    key = (target, level)
    if key not in _PLANS:
        _PLANS[key] = make_plan(target, level, capacity=SEED000_CAPACITY, timeout=timeout)
    return _PLANS[key]


def _replay_or_realize(target: str, traces: list[Seed000Trace], steps: int) -> list[Seed000Replay]:
    """The reference's traces replayed on ``target``; the goals whose trace it
    cannot follow (N/A, UNTESTED: it took another permitted branch, e.g.
    declined a capability) are then realized on ``target`` itself -- the same
    Z3-steered walk, with this target's answers choosing the branches -- and
    those traces replayed on it.  A goal it still does not reach keeps the
    first replay's reason."""
    reps = [replay_seed000(target, tr) for tr in traces]
    if target == REALIZE_ON:
        return reps
    again = [r.trace.goal for r in reps if r.status in ("N/A", "UNTESTED")]
    own: dict[Goal, Seed000Trace] = {}
    for level in ("mechanism", "system"):
        mine = [g for g in again if g.level == level]
        if mine:
            own.update(realize(level, mine, steps=steps, on=target))
    out = []
    for r in reps:
        tr = own.get(r.trace.goal)
        if tr is not None:
            r2 = replay_seed000(target, tr)
            if r2.status in ("PASS", "FAIL"):
                r2.detail += f" (a trace realized on {target} itself: the reference's {r.detail[:1].lower()}{r.detail[1:]})"
                r = r2
        out.append(r)
    return out


def replay_seed000(target: str, trace: Seed000Trace, timeout: float = 5.0) -> Seed000Replay:
    """Run the trace on a fresh instance of ``target`` under the harness (as
    :func:`memspec.invariants.repro.replay`, one plan per target and level).

    The trace was realized on the reference: it reaches its goal only while
    the target takes the reference's branch at every step.  A target may
    take another branch the spec permits (an allocator with other
    capabilities or another packing than the reference's): the replay then
    stops there with N/A (an action of a role the target lacks, or
    ``Unsupported``: a capability it declines) or UNTESTED (any other
    permitted branch), never FAIL.  FAIL is a Violation only: the harness
    judged an answer impermissible, which fails on its own."""
    from memspec.invariants import engine as E
    from memspec.invariants.guard import CallGuard
    from memspec.spec.core import SpecError

    plan = _plan(target, trace.goal.level, timeout)
    offered = {a.name for a in plan.actions}
    n = len(trace.steps)
    run = None

    def stop(status: str, why: str) -> Seed000Replay:
        return Seed000Replay(trace, target, False, why, status)

    try:
        run = E.Run(plan, CallGuard(timeout))
        for k, (name, args) in enumerate(trace.steps):
            if name not in offered:
                return stop("N/A", f"step {k + 1}/{n} calls {name}, which {target} does not offer at the "
                                   f"{trace.goal.level} level (a role it lacks)")
            try:
                ts = run.apply(plan.machine.action(name), dict(args), [])
            except SpecError as e:   # the arguments name what this target's path did not make
                return stop("UNTESTED", f"step {k + 1}/{n} ({name}) cannot be replayed here: {e}")
            got = _outcome_name(ts)
            want = trace.outcomes[k] if k < len(trace.outcomes) else (trace.expect if k == n - 1 else None)
            if want is not None and got != want:
                where = "the goal's step" if k == n - 1 else f"step {k + 1}/{n}"
                why = (f"{where} ({name}): {target} took {got}, which the spec permits, where the reference "
                       f"took {want}" + ("" if k == n - 1 else ": the trace cannot go on to its goal"))
                return stop("N/A" if got == "Unsupported" else "UNTESTED", why)
        run.teardown()
    except E.Violation as v:
        return Seed000Replay(trace, target, False, f"{v.invariant} [{v.cause}] {v.reason}", "FAIL")
    finally:
        if run is not None:
            run.close()
    last = _outcome_name(run.trace[-1]) if run.trace else ""
    return Seed000Replay(trace, target, True, f"{len(run.trace)} steps on the spec's branches; ends {last}")
