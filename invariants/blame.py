"""Blame: which rule a failure broke, and which failures are one bug.

A shrunk counterexample is minimized (:func:`minimize`), the rule it broke
named (:func:`diagnose`), and the failures of one run related
(:func:`relate`): a failure is the consequence of another only when a
replay proves it.  Everything here replays steps on fresh targets and specs
(:func:`_replay_steps`); nothing trusts the order in which checks happened
to fail.
"""

from __future__ import annotations

import dataclasses

from typing import Any, Callable

from memspec.invariants import draws as D
from memspec.invariants import engine as E
from memspec.invariants.errors import Violation, violation_class
from memspec.invariants.guard import CallGuard
from memspec.invariants.results import Failure, _last_action


def _dedupe(failures: list) -> list:
    """One failure per (invariant, action it ended on) once each is blamed
    on the rule broken (two symptoms re-blamed to the same rule at the same
    call are one failure): the shorter reproduction, the fewer steps to
    detection, the consequences of both."""
    out: dict = {}
    for f in failures:
        key = (f.invariant, f.check, _last_action(f))
        g = out.get(key)
        if g is None or key[2] is None:
            out[key if key[2] is not None else (key, id(f))] = f
            continue
        keep, other = (f, g) if len(f.trace) < len(g.trace) else (g, f)
        dets = [d for d in (f.steps_to_detection, g.steps_to_detection) if d is not None]
        keep.steps_to_detection = min(dets) if dets else None
        keep.consequences = list(dict.fromkeys(list(keep.consequences) + list(other.consequences)))
        out[key] = keep
    # one rule's clauses failing at the very same steps are one counterexample (each later pass
    # masked the one before): one failure, the other clauses listed with it
    same: dict = {}
    for f in out.values():
        steps = tuple((getattr(t, "action", None), tuple(getattr(t, "choices", ()) or ())) for t in f.trace)
        k = (f.invariant, steps) if steps and f.cause not in ("hang", "crash") else (id(f),)
        g = same.get(k)
        if g is None:
            same[k] = f
            continue
        g.consequences = list(dict.fromkeys(list(g.consequences) + [_describe(f, len(f.trace))]
                                            + list(f.consequences)))
    return list(same.values())


#: replays the step minimizer may spend on one failure
MINIMIZE_REPLAYS = 200


def _ints(v: Any) -> set:
    """The ints in an argument value (nested in tuples, lists, dicts)."""
    if type(v) is int:
        return {v}
    if isinstance(v, dict):
        v = list(v.values())
    if isinstance(v, (tuple, list)):
        out: set = set()
        for x in v:
            out |= _ints(x)
        return out
    return set()


def _refused(ts: Any) -> bool:
    return str(getattr(ts, "outcome", "")).startswith("raises ")


class _Unreplayable(Exception):
    """A candidate the spec could not have drawn (an action unavailable in
    the state the earlier steps left, an empty domain)."""


class _ClampChooser:
    """Draws a step's arguments again from recorded choices, each clamped
    into the range asked for (a missing one is the smallest): whatever the
    steps before left in the state, the arguments are ones the spec draws
    there -- a reference bound by a step that was removed is never named."""

    def __init__(self, choices: list) -> None:
        self.choices, self.i, self.record = list(choices), 0, []

    def _next(self) -> Any:
        v = self.choices[self.i] if self.i < len(self.choices) else 0
        self.i += 1
        return v

    def integer(self, lo: int, hi: int) -> int:
        v = self._next()
        v = lo if type(v) is not int else min(max(v, lo), hi)
        self.record.append(v)
        return v

    def choice(self, options: Any) -> Any:
        options = list(options) if not isinstance(options, (list, tuple, range)) else options
        if not options:
            raise _Unreplayable("choice from an empty domain")
        return options[self.integer(0, len(options) - 1)] if len(options) > 1 else options[0]

    def boolean(self) -> bool:
        v = bool(self._next())
        self.record.append(v)
        return v


def _smaller(ch: list) -> list:
    """Candidate choice lists of one step, each one choice made smaller:
    zero, then half (arguments drawn from smaller choices are smaller sizes,
    earlier references)."""
    out = []
    for j, v in enumerate(ch):
        if type(v) is bool:
            if v:
                out.append(ch[:j] + [False] + ch[j + 1:])
        elif type(v) is int and v > 0:
            out.append(ch[:j] + [0] + ch[j + 1:])
            if v > 1:
                out.append(ch[:j] + [v // 2] + ch[j + 1:])
    return out


def minimize(plan: E.Plan, failure: Failure, *, replays: int | None = None) -> Failure:
    """Remove the steps Hypothesis's shrinker left in a counterexample that
    the failure does not need, then make the remaining arguments smaller:
    delta debugging over steps.  In order: every refusal at once, chunks of
    steps (halves, quarters, ...), each refusal, each other step (latest
    first; a step that bound a reference also together with the later
    steps that name it), then each step's argument choices (zero, half).

    Each candidate is replayed on a fresh target and spec (same device):
    every step's arguments are *drawn again by the spec* from the step's
    recorded choices in the state the kept steps leave (a removed step's
    references are never named; an action the spec does not offer there
    makes the candidate invalid).  A candidate is kept only when the replay
    fails the same invariant, so the counterexample stays a counterexample
    of the spec's own drawing.  Hypothesis deletes steps by their choices,
    and a refused step whose choices feed a later draw survives its
    shrinking; this does not.  A hang or a crash is left as it is
    (replaying it is the supervisor's business).  At most ``replays``
    (default :data:`MINIMIZE_REPLAYS`)."""
    trace = list(failure.trace)
    if len(trace) < 2 or failure.cause in ("hang", "crash") or any(not isinstance(ts, E.TraceStep) for ts in trace):
        return failure
    budget = [MINIMIZE_REPLAYS if replays is None else replays]
    saved = (plan.stats, plan.on_call, plan.on_step)
    plan.stats, plan.on_call, plan.on_step = E.Stats(), None, None
    guard = CallGuard(plan.timeout, plan.guard_mode)
    best: list = [trace, None]

    def size(tr: list) -> tuple:
        return (len(tr), sum(int(c) for ts in tr for c in ts.choices if type(c) in (int, bool)))

    def fails(steps: list) -> bool:
        """Replay ``[(action name, choices)]``: True (and kept) when it fails
        the same invariant with a smaller counterexample."""
        if budget[0] <= 0 or not steps:
            return False
        budget[0] -= 1
        run = None
        try:
            run = E.Run(plan, guard, capacity=failure.capacity)
            for name, choices in steps:
                action = plan.machine.action(name)
                if not action.available(run.state):
                    return False
                ch = _ClampChooser(choices)
                args = action.draw_args(run.state, ch)
                run.apply(action, args, ch.record)
            run.teardown()
        except Violation as v:
            if v.invariant == failure.invariant and getattr(v, "check", None) == failure.check \
                    and size(v.trace) < size(best[0]):
                best[0], best[1] = list(v.trace), v
                return True
            return False
        except Exception:  # noqa: BLE001 - a candidate the spec cannot replay is not a counterexample
            return False
        finally:
            if run is not None:
                run.close()
        return False

    def steps_of(tr: list, drop: set = frozenset()) -> list:
        return [(ts.action, list(ts.choices)) for j, ts in enumerate(tr) if j not in drop]

    try:
        refusals = {i for i, ts in enumerate(trace[:-1]) if _refused(ts)}
        if refusals:
            fails(steps_of(trace, refusals))
        # chunks: halves, quarters, ... of the steps before the failing one
        n = len(best[0]) // 2
        while n >= 2 and budget[0] > 0:
            i = 0
            while i < len(best[0]) - 1 and budget[0] > 0:
                cur = best[0]
                if not fails(steps_of(cur, set(range(i, min(i + n, len(cur) - 1))))):
                    i += n
            n //= 2
        for flt in (_refused, lambda ts: True, lambda ts: True):   # the last pass: what the second freed
            i = len(best[0]) - 2              # the last step is where it fails: keep it
            while i >= 0 and budget[0] > 0:
                cur = best[0]
                if flt(cur[i]) and not fails(steps_of(cur, {i})) and cur[i].bound:
                    # a step that bound a reference, with the later steps that name it
                    used = set(cur[i].bound)
                    drop = {i} | {j for j in range(i + 1, len(cur) - 1) if used & _ints(cur[j].args)}
                    if len(drop) > 1:
                        fails(steps_of(cur, drop))
                i = min(i - 1, len(best[0]) - 2)
        # smaller arguments: each step's choices, one at a time
        i = 0
        while i < len(best[0]) and budget[0] > 0:
            cur = best[0]
            for ch in _smaller(list(cur[i].choices)):
                cand = steps_of(cur)
                cand[i] = (cur[i].action, ch)
                if fails(cand):
                    break
            else:
                i += 1
    finally:
        plan.stats, plan.on_call, plan.on_step = saved
    v = best[1]
    if v is None:
        return failure
    return Failure(failure.target, failure.level, failure.invariant, v.cause, v.reason, list(v.trace),
                   failure.steps_to_detection, failure.repro, failure.flaky, failure.capacity,
                   list(failure.consequences), check=failure.check, key=failure.key)


DIAGNOSE_BLAME = True


def _replay_steps(plan: E.Plan, guard: CallGuard, capacity: int | None, steps: list, *,
                  then: Callable | None = None, found: list | None = None,
                  hits: list | None = None) -> Violation | None:
    """Replay ``[(action name, choices)]`` (arguments drawn again by the
    spec, see :class:`_ClampChooser`) on a fresh target and spec; the
    Violation it raised, or None.  ``then(run, violation)`` runs on the
    failing run before it is closed (a diagnosis continues it there);
    ``found`` receives every check that failed at the failing step
    (``(invariant, cause, reason)``, in the engine's blame order).
    Raises :class:`_Unreplayable` for a candidate the spec cannot draw."""
    run = None
    try:
        run = E.Run(plan, guard, capacity=capacity)
        if found is not None:
            own = run._fail_found

            def capture(fs: list) -> None:
                found[:] = run._blame_first(list(fs))
                own(fs)

            run._fail_found = capture
        for name, choices in steps:
            action = plan.machine.action(name)
            if not action.available(run.state):
                raise _Unreplayable(f"{name} is not available")
            ch = _ClampChooser(choices)
            args = action.draw_args(run.state, ch)
            run.apply(action, args, ch.record)
        run.teardown()
    except Violation as v:
        if then is not None:
            then(run, v)
        return v
    finally:
        if run is not None:
            if hits is not None:
                hits[:] = list(getattr(run, "masked_hits", ()))
            run.close()
    return None


#: causes that are a figure read from the implementation (a symptom: the
#: rule it shows may be another's); the others are a call the spec forbids,
#: bytes that changed, or the spec's own invariant
_FIGURES = ("observation",)
#: causes that are a call crashing (an exception that is no error of the contract, a value of no
#: type the contract returns): evidence about that call alone
_CRASHES = ("unexpected-exception", "wrong-type")

#: replays a diagnosis may spend on one failure (every two-step continuation
#: of the system machine's 30 actions: about 930, some milliseconds each)
DIAGNOSE_REPLAYS = 1000


def _describe(v: Any, step: int | None = None) -> str:
    at = f" (step {step})" if step is not None else ""
    return f"{v.invariant} [{v.cause}]{at} {v.reason}"


def diagnose(plan: E.Plan, failure: Failure, *, replays: int | None = None, _depth: int = 0) -> Failure:
    """Name the rule the implementation broke, not the first figure that
    showed it (issue 12: *blame the rule that was broken*).  The shrunk
    counterexample is re-checked on fresh replays:

    0. **The step's own rule**: when checks of several rules fail at the
       failing step, and one of them is a rule the step's action declares
       (a ``drop`` that frees at once: its queued bytes fault, S4's data
       check, but the rule a drop is about is S7), that rule is the one the
       step broke (the spec's own invariant failing on its state keeps
       its blame).
    1. **A step only the blame needs**: each earlier step is left out in
       turn (arguments drawn again by the spec); when the shorter example
       then fails under another invariant (at the same call, or sooner),
       the step left out only decided which rule the failure showed as
       (not when the same call merely shows another of the figures it
       showed before: that is the same symptom in another order): a
       mechanism switch making ``poll`` blame S1 for a fence the EP read
       wrong; allocations that filled the device so that a segment rounded
       up too far shows as an out-of-memory; a pending free that made a
       missing coalesce show only in ``empty_cache``'s figure.  The rule
       the shorter counterexample breaks is the one broken (of several,
       the one failing soonest).
    2. **A symptom**: when the failure is a figure read from the
       implementation (cause ``observation``: a ledger total, a pin count,
       a queue length) of a rule the failing step's action does not declare
       (the action's own rule, the engine already puts first), the example
       is continued past it: one step, then two, with each action the spec
       offers there (smallest arguments).  A continuation that fails as a
       call the spec forbids, a fault or changed bytes, under a rule *none*
       of the failing step's checks named, shows the rule broken (a release
       run before its fence: the queue length and the context's pins are
       off at once; after ``synchronize``, ``poll`` finds the release gone
       that only now may run: S4).  Of several, the nearest (fewest steps),
       then the most specific (declared by the fewest actions).  The same
       for the ledger's total (:func:`_ledger`) when the action declares
       it but other rules' figures are off at that step too: a total
       every second action moves is where a broken rule shows, seldom the
       rule (a ledger bug alone leaves the other figures right).

    When 0 or 1 ends on another rule's *figure*, that failure is itself a
    symptom and is diagnosed in turn (at most :data:`DIAGNOSE_DEPTH` times,
    within what is left of the replays).

    The blamed failure keeps its own trace; the first failure is listed in
    ``consequences``.  A hang or a crash is left as it is.  At most
    ``replays`` (default :data:`DIAGNOSE_REPLAYS`)."""
    trace = list(failure.trace)
    if not DIAGNOSE_BLAME or not trace or failure.cause in ("hang", "crash") \
            or any(not isinstance(ts, E.TraceStep) for ts in trace):
        return failure
    saved = (plan.stats, plan.on_call, plan.on_step)
    plan.stats, plan.on_call, plan.on_step = E.Stats(), None, None
    guard = CallGuard(plan.timeout, plan.guard_mode)
    budget = [DIAGNOSE_REPLAYS if replays is None else replays]
    steps = [(ts.action, list(ts.choices)) for ts in trace]
    last = trace[-1].action
    found: Violation | None = None

    def replay(cand: list, **kw: Any) -> Violation | None:
        if budget[0] <= 0:
            return None
        budget[0] -= 1
        try:
            return _replay_steps(plan, guard, failure.capacity, cand, **kw)
        except Exception:  # noqa: BLE001 - a candidate the spec cannot draw, or a replay that cannot run
            return None

    own = list(getattr(plan.machine.action(last), "invariants", ()) or ())
    seen: list = []
    try:
        # 0. the step's action's own rule, when another rule's check failed first at that step
        v0 = replay(steps, found=seen)
        same = v0 is not None and v0.invariant == failure.invariant and len(v0.trace) == len(steps)
        if same and failure.invariant not in own and failure.cause != "invariant":
            mine = [x for x in seen if x[0] in own]
            if mine:
                pick = min(mine, key=lambda x: own.index(x[0]))
                inv, cause, why = pick[:3]
                rest = [f"{x[0]} [{x[1]}] {x[2]}" for x in seen if (x[0], x[2]) != (inv, why)]
                if rest:
                    why += " -- at this step also: " + "; ".join(rest[:4]) \
                        + (f"; {len(rest) - 4} more" if len(rest) > 4 else "")
                chk = pick[3] if len(pick) > 3 else None
                found = violation_class(inv + (f".{chk}" if chk else ""))(inv, cause, why, list(v0.trace),
                                                                           len(v0.trace))
                found.check = chk
                found.key = (None, f"{inv}.{chk}" if chk else f"{inv}.{cause}")
        # 1. a step only the blame needs: the variants one step shorter
        pre = plan.presupposed()
        if found is None:
            symptoms = {x[0] for x in seen} | {failure.invariant}
            for i in range(len(steps) - 2, -1, -1):
                v = replay(steps[:i] + steps[i + 1:])
                if v is None or v.invariant == failure.invariant or v.cause in ("hang", "crash") or not v.trace:
                    continue
                if pre.get(v.invariant, frozenset()) & symptoms:
                    continue   # a rule that takes the failing one for granted: its consequence
                if len(v.trace) == len(steps) - 1 and v.cause in _FIGURES and v.invariant in symptoms:
                    continue   # the same call showing another of the figures it showed: no new rule
                if found is None or len(v.trace) < len(found.trace):
                    found = v
        # 2. a symptom: continue past it (also the ledger's total when other rules' figures are off too)
        spread = failure.invariant in own and _ledger(plan, failure.invariant) \
            and any(x[0] != failure.invariant and x[1] in _FIGURES for x in seen)
        if found is None and same and failure.cause in _FIGURES and (failure.invariant not in own or spread):
            symptoms = {x[0] for x in seen} | {failure.invariant}
            found = _continue(plan, steps, failure, symptoms, replay)
    finally:
        plan.stats, plan.on_call, plan.on_step = saved
    if found is None:
        return failure
    first = _describe(failure, len(trace))
    out = Failure(failure.target, failure.level, found.invariant, found.cause, found.reason, list(found.trace),
                  failure.steps_to_detection, None, failure.flaky, failure.capacity,
                  [first] + list(failure.consequences), check=getattr(found, "check", None),
                  key=getattr(found, "key", None))
    if found.cause in _FIGURES and _depth < DIAGNOSE_DEPTH:
        # a shorter example that shows another rule's *figure* (a pin count, a queue length) names a
        # symptom too, not yet the rule broken: diagnose it in turn (a holder's answer that ran a release
        # before its fence showed as the queue length (S7), one step shorter as the pins (S10), continued
        # past them as the release gone at ``poll``: S4)
        left = max(budget[0], 0)
        if left:
            again = diagnose(plan, out, replays=left, _depth=_depth + 1)
            if again is not out:
                return again
    return out


#: how many times a diagnosis that ended on another rule's figure is diagnosed again (:func:`diagnose`)
DIAGNOSE_DEPTH = 2


#: replays :func:`relate` may spend on one run's failures
RELATE_REPLAYS = 400


def relate(plan: E.Plan, failures: list, *, replays: int | None = None) -> list:
    """The failures of one run, each on its own row unless a replay proves
    it a consequence of another (issue 31: *a consequence is proved, not
    presumed*).

    A later pass masks the checks earlier failures broke (``Plan.masks``),
    so a failure found there may have run through another's broken step
    (the spec followed that answer).  For each failure ``a``, its shrunk
    steps are replayed with every other failure's check masked, recording
    where a masked check would have failed:

    * none did: ``a`` needs no other failure -- its reproduction fails on
      its own; it keeps its own row;
    * some did (the steps of failures ``b``): ``a``'s steps are replayed
      without those steps.  ``a`` is ``b``'s consequence only when it then
      no longer fails under its rule (it needed ``b``'s broken step); when
      it still fails, with no masked check hit, that shorter reproduction
      is ``a``'s own, on its own row.

    A hang or a crash is never a consequence (the supervisor reports it).
    ``b`` carries ``a`` in its ``consequences``.  At most ``replays``
    (default :data:`RELATE_REPLAYS`)."""
    fs = list(failures)
    if len(fs) < 2 or not DIAGNOSE_BLAME:
        return fs
    every = plan.masks
    owners = {f.key: f for f in fs if f.key is not None}
    saved = (plan.stats, plan.on_call, plan.on_step, plan.masks)
    plan.stats, plan.on_call, plan.on_step = E.Stats(), None, None
    guard = CallGuard(plan.timeout, plan.guard_mode)
    budget = [RELATE_REPLAYS if replays is None else replays]

    def ok(f: Failure) -> bool:
        return bool(f.trace) and f.cause not in ("hang", "crash") and all(isinstance(t, E.TraceStep) for t in f.trace)

    def same(v: Any, f: Failure, n: int) -> bool:
        return v is not None and v.invariant == f.invariant and getattr(v, "check", None) == f.check \
            and len(v.trace) == n

    parent: dict = {}
    try:
        for a in fs:
            if not ok(a) or budget[0] <= 0:
                continue
            plan.masks = frozenset(every - {a.key})
            steps = [(t.action, list(t.choices)) for t in a.trace]
            hits: list = []
            budget[0] -= 1
            try:
                v = _replay_steps(plan, guard, a.capacity, steps, hits=hits)
            except Exception:  # noqa: BLE001 - a trace the spec cannot draw again: leave it as it is
                continue
            if not same(v, a, len(steps)) or not hits:
                continue
            # the steps where another failure's masked check fired (the failing step itself too: an
            # answer the spec could not follow, whose state then shows in this failure's figures)
            at = sorted({i - 1 for i, k in hits if 0 < i <= len(steps) and k != a.key and k not in a.also_keys})
            roots = [owners[k] for _i, k in hits if k in owners and owners[k] is not a]
            if not at:
                continue
            cand = [st for j, st in enumerate(steps) if j not in at]
            budget[0] -= 1
            again: list = []
            try:
                w = _replay_steps(plan, guard, a.capacity, cand, hits=again)
            except Exception:  # noqa: BLE001 - the rest cannot be drawn without those steps: needed
                w = None
            if same(w, a, len(cand)) and not again:
                a.trace = list(w.trace)   # its own reproduction, without the other's broken step
                a.reason = w.reason
            elif not same(w, a, len(cand)) and roots:
                parent[id(a)] = roots[0]
            else:   # it needs those steps but is no proven consequence: its reproduction masks them, and says so
                a.needs_masks = tuple(sorted({k for _i, k in hits if k != a.key}, key=str))
    finally:
        plan.stats, plan.on_call, plan.on_step, plan.masks = saved
    out = []
    for f in fs:
        p = parent.get(id(f))
        seen_chain = {id(f)}
        while p is not None and id(p) in parent and id(p) not in seen_chain:
            seen_chain.add(id(p))
            p = parent[id(p)]
        if p is None or p is f:
            out.append(f)
            continue
        p.consequences = list(p.consequences) + [_describe(f, len(f.trace))] + list(f.consequences)
        dets = [d for d in (f.steps_to_detection, p.steps_to_detection) if d is not None]
        p.steps_to_detection = min(dets) if dets else None
    return _relate_figures(plan, out, replays=replays)


def _relate_figures(plan: E.Plan, failures: list, *, replays: int | None = None) -> list:
    """A figure read from the implementation (a ledger total, a pin count:
    cause ``observation``) that is another rule's symptom, shown by replay:
    ``a`` (the figure) is a consequence of ``b``, of another rule, when
    ``b``'s rule breaks in ``a``'s state and not the other way round.  Only
    a figure is ever related this way (issue 31: a call the spec forbids, a
    fault or changed bytes is a rule of its own, never presumed another's
    consequence).  Checked on fresh replays of the
    shrunk counterexamples (arguments drawn again by the spec):

    * ``a``'s steps with its failing step replaced by ``b``'s failing step
      fail there under ``b``'s rule, as a call the spec forbids, a fault or
      changed bytes (not a figure): the state ``a`` failed in already
      breaks ``b``'s rule (a holder's answer whose ledger total is off
      after the EP ran a release before its fence: ``poll`` there runs the
      release early, S4);
    * ``b``'s steps with its failing step replaced by ``a``'s do not fail
      under ``a``'s rule (``a``'s call, where ``b`` broke its rule, is
      fine, or cannot be made: no ticket to answer);
    * ``b`` is not a crash of its call (an exception no error of the
      contract: ``unexpected-exception``, ``wrong-type``): that is evidence
      about that one call, a bug of its own, never the root of another
      failure (a target whose free always crashes, and an overlap found
      without a free, are two bugs).

    Two independent bugs each break their own rule in the other's state
    (or in neither), so both stay.  ``b`` then carries ``a`` in its
    ``consequences``, and the steps at which the run first detected either
    (``a``'s symptom was the bug's first sign).  When ``a`` is a figure
    (a ledger total off), ``b``'s rule may break only later: ``a``'s example
    is also continued past its failure, one step then two (as
    :func:`diagnose` does), for a failure under ``b``'s rule.  A hang or a crash is
    never a consequence (the supervisor reports it).  At most ``replays``
    (default :data:`RELATE_REPLAYS`)."""
    fs = list(failures)
    if len(fs) < 2 or not DIAGNOSE_BLAME:
        return fs
    saved = (plan.stats, plan.on_call, plan.on_step)
    plan.stats, plan.on_call, plan.on_step = E.Stats(), None, None
    guard = CallGuard(plan.timeout, plan.guard_mode)
    budget = [RELATE_REPLAYS if replays is None else replays]

    def ok(f: Failure) -> bool:
        return bool(f.trace) and f.cause not in ("hang", "crash") and all(isinstance(t, E.TraceStep) for t in f.trace)

    every = plan.masks

    def breaks(x: Failure, y: Failure, figures: bool) -> bool:
        """``x``'s steps with its failing step replaced by ``y``'s fail there under ``y``'s rule
        (the other failures' checks masked, as they were when these were found; ``y``'s not)."""
        plan.masks = frozenset(every - {y.key, *y.also_keys})
        try:
            return _breaks(x, y, figures)
        finally:
            plan.masks = every

    def _breaks(x: Failure, y: Failure, figures: bool) -> bool:
        if budget[0] <= 0:
            return False
        budget[0] -= 1
        steps = [(t.action, list(t.choices)) for t in x.trace[:-1]] + [(y.trace[-1].action,
                                                                         list(y.trace[-1].choices))]
        try:
            v = _replay_steps(plan, guard, x.capacity, steps)
        except Exception:  # noqa: BLE001 - a candidate the spec cannot draw breaks nothing
            return False
        if v is not None and v.invariant == y.invariant and len(v.trace) == len(steps) \
                and (figures or v.cause not in _FIGURES) and v.cause not in ("hang", "crash"):
            return True
        if figures or x.cause not in _FIGURES:
            return False
        # a figure off (a ledger total): continued past it, does ``y``'s rule break (``synchronize``
        # then ``poll`` find the release gone that only now may run)?
        steps = [(t.action, list(t.choices)) for t in x.trace]

        def replay(cand: list, **kw: Any) -> Violation | None:
            if budget[0] <= 0:
                return None
            budget[0] -= 1
            try:
                return _replay_steps(plan, guard, x.capacity, cand, **kw)
            except Exception:  # noqa: BLE001
                return None

        hit = _continue(plan, steps, x, {x.invariant}, replay, only=y.invariant)
        return hit is not None

    try:
        changed = True
        while changed:
            changed = False
            for a in fs:
                if not ok(a) or a.cause not in _FIGURES:   # only a figure can be another rule's symptom
                    continue
                for b in fs:
                    if b is a or b.invariant == a.invariant or not ok(b) or b.cause in _FIGURES + _CRASHES:
                        continue
                    if breaks(a, b, False) and not breaks(b, a, True):
                        dets = [d for d in (a.steps_to_detection, b.steps_to_detection) if d is not None]
                        merged = dataclasses.replace(
                            b, steps_to_detection=min(dets) if dets else None, flaky=b.flaky or a.flaky,
                            consequences=list(b.consequences) + [_describe(a, len(a.trace))] + list(a.consequences))
                        fs = [merged if f is b else f for f in fs if f is not a]
                        changed = True
                        break
                if changed:
                    break
    finally:
        plan.stats, plan.on_call, plan.on_step = saved
    return fs


def _continue(plan: E.Plan, steps: list, failure: Failure, symptoms: set, replay: Callable,
              only: str | None = None) -> Violation | None:
    """Continue the failing example one step, then two, past its failing
    step (each action the spec offers, smallest arguments); the first
    continuation's failure that is a rule (not a figure, not a hang) under
    an invariant not in ``symptoms`` (``only``: under that one), the most
    specific of the nearest."""
    names = [a.name for a in plan.actions]
    if only is not None:   # the actions about that rule first (``synchronize``, ``poll`` for S4)
        names.sort(key=lambda nm: only not in (getattr(plan.machine.action(nm), "invariants", ()) or ()))
    rank = _declared_by(plan)
    n = len(plan.machine.actions) + 1

    def probe(prefix: list, name: str, ok: list) -> Violation | None:
        """Replay ``steps``, then ``prefix`` (names) and ``name`` past the
        failure; the rule-level Violation of the last, if any.  ``ok``
        receives the names that ran clean (the next round extends them)."""
        got: list = []

        def then(run: Any, v0: Violation) -> None:
            if v0.invariant != failure.invariant or len(v0.trace) != len(steps):
                return   # not the failure being diagnosed
            for k, nm in enumerate(prefix + [name]):
                action = plan.machine.action(nm)
                try:
                    if not action.available(run.state):
                        return
                    ch = _ClampChooser([])
                    args = action.draw_args(run.state, ch)
                    run.apply(action, args, ch.record)
                except Violation as v1:
                    if v1.cause in _FIGURES:   # the same figures stay off: the example goes on
                        continue
                    if k == len(prefix) and v1.cause not in ("hang", "crash"):
                        got.append(v1)
                    return
                except Exception:  # noqa: BLE001 - a probe the spec cannot draw tells nothing
                    return
            ok.append(name)

        replay(steps, then=then)
        hit = got[0] if got else None
        if hit is not None and only is not None and hit.invariant != only:
            return None
        if hit is None or hit.invariant in symptoms or plan.presupposed().get(hit.invariant, frozenset()) & symptoms:
            return None   # the same rule again, or one that takes a failing rule for granted: a consequence
        return hit

    clean: list = []
    hits = [h for h in (probe([], nm, clean) for nm in names) if h is not None]
    if not hits:
        for first in clean:
            hits += [h for h in (probe([first], nm, []) for nm in names) if h is not None]
            if hits:
                break
    if not hits:
        return None
    return min(hits, key=lambda v: (rank.get(v.invariant, n), names.index(v.trace[-1].action)))


#: a rule is the ledger when one of at least this many actions declares it, more than any other rule
#: and more than ``FOCUS_MAX_SHARE`` of them (a small table's most declared rule is no ledger)
LEDGER_MIN_ACTIONS = 10


def _ledger(plan: E.Plan, inv: str) -> bool:
    """``inv`` is the machine's ledger: the rule declared by the most
    actions, more than :data:`~memspec.invariants.draws.FOCUS_MAX_SHARE`
    of a table of at least :data:`LEDGER_MIN_ACTIONS` (S11, *every byte is
    accounted for*, which 16 of the system's 32 actions move).  Its total
    off together with another rule's figure is a symptom of that step:
    the diagnosis continues past it for the rule broken (a holder's answer
    whose poll ran a release before its fence: the ledger, the pins and the
    queue length are all off; ``synchronize`` then ``poll`` show S4)."""
    rank = _declared_by(plan)
    n = len(plan.machine.actions)
    top = max(rank.values(), default=0)
    return n >= LEDGER_MIN_ACTIONS and rank.get(inv, 0) == top > D.FOCUS_MAX_SHARE * n \
        and sum(1 for v in rank.values() if v == top) == 1


def _declared_by(plan: E.Plan) -> dict:
    """``{invariant: how many of the machine's actions declare it}`` (fewer:
    a more specific rule)."""
    rank: dict = {}
    for a in plan.machine.actions:
        for inv in getattr(a, "invariants", ()) or ():
            rank[inv] = rank.get(inv, 0) + 1
    return rank


