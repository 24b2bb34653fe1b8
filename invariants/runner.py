"""Running the harness: plan a target at each level that applies (see
:mod:`~memspec.invariants.levels`), drive each plan with Hypothesis (a
``RuleBasedStateMachine`` whose single rule draws an action from the spec's
action table), and collect per-invariant results.

:func:`conform` runs all of it under supervision (:func:`~memspec.invariants.guard.supervise`):
the target's code -- its factory included -- runs in a forked child; the
parent only reads what the child says.  A hang (also in C code), a
segfault, ``os._exit``, ``sys.exit`` or any ``BaseException`` is then a
reported FAIL or ERROR naming the step and the action, with a reproduction
of the example's steps so far, and the run carries on with the next level.
"""

from __future__ import annotations

import ast
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from memspec.invariants import engine as E
from memspec.invariants import verdicts as V
from memspec.invariants import signals
from memspec.invariants.choosers import HypothesisChooser
from memspec.invariants.discovery import TargetRef, resolve
from memspec.invariants.errors import TARGET_ERROR, SpecError, TargetError, Violation, violation_class
from memspec.invariants.guard import BUILD_SECONDS, CallGuard, Channel, StepLog, supervise
from memspec.invariants.levels import LEVELS, levels_for  # noqa: F401 - re-exported
from memspec.invariants.planning import (applicability, build_probe, close_probe, kind_of,  # noqa: F401
                                         load_machine, machine_for, make_plan)
from memspec.invariants.repro import write_repros  # noqa: F401 - re-exported

# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------


@dataclass
class Failure:
    """One shrunk counterexample (or, for a hang or a crash, the example's
    steps up to the call that never came back)."""

    target: str
    level: str
    invariant: str
    cause: str
    reason: str
    trace: list
    steps_to_detection: int | None
    repro: str | None = None
    flaky: bool = False
    #: the device capacity of the failing example (per-example capacity; None: the plan's)
    capacity: int | None = None
    #: the other failures the same root cause showed (``"S10 [observation] ..."``), when the
    #: diagnosis (:func:`diagnose`) named another rule than the first check that failed
    consequences: list = field(default_factory=list)

    @property
    def shrunk_length(self) -> int:
        return len(self.trace)


@dataclass
class PlanInfo:
    """What the supervisor knows of a plan run in a child: what the report,
    the reproduction and the progress display read of a :class:`~memspec.invariants.engine.Plan`."""

    target: str
    level: str
    invariants: list          # [(id, title)]
    na: dict
    capabilities: dict
    actions: list             # action names drawn
    timeout: float
    factory_kwargs: dict
    machine_ref: str | None
    stats: E.Stats = field(default_factory=E.Stats)
    mutant: Any = None
    declares: dict = field(default_factory=dict)  # invariant id -> declaring action names
    undrawn: dict = field(default_factory=dict)   # action name -> capabilities it needs that the target lacks

    @property
    def invariant_ids(self) -> list[str]:
        return [i for i, _t in self.invariants]

    @property
    def action_names(self) -> list[str]:
        return list(self.actions)

    def titles(self) -> dict[str, str]:
        return dict(self.invariants)


@dataclass
class PlanResult:
    target: str
    level: str
    plan: Any   # an engine Plan (in-process) or a PlanInfo (supervised)
    failures: list[Failure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)   # spec/target/harness errors (not a target FAIL)
    seconds: float = 0.0
    #: accepting steps each declaring action needs for a PASS (:mod:`~memspec.invariants.verdicts`)
    min_accepted: int = V.MIN_ACCEPTED

    def coverage(self) -> dict[str, dict]:
        """Per invariant: tested or not, why, and the counts per declaring action."""
        if self.plan is None:
            return {}
        return V.coverage(getattr(self.plan, "declares", {}) or {}, self.plan.action_names, self.stats,
                          self.min_accepted)

    @property
    def stats(self) -> E.Stats:
        return self.plan.stats if self.plan is not None else E.Stats()

    def rows(self) -> list[tuple[str, str, str, str]]:
        """``(invariant id, title, status, detail)`` for every invariant of the level."""
        if self.plan is None:
            return []
        out = []
        failed: dict = {}
        for f in self.failures:
            failed.setdefault(f.invariant, f)
        titles = self.plan.titles()
        cov = self.coverage()
        for inv in self.plan.invariant_ids:
            if inv in failed:
                f = failed[inv]
                out.append((inv, titles.get(inv, ""), "FAIL", f"[{f.cause}] {f.reason}"))
            elif inv in self.plan.na:
                out.append((inv, titles.get(inv, ""), "N/A", self.plan.na[inv]))
            elif self.errors:
                out.append((inv, titles.get(inv, ""), "ERROR", self.errors[0]))
            elif inv in cov and cov[inv].get("na"):
                out.append((inv, titles.get(inv, ""), "N/A", cov[inv]["na"]))
            elif inv in cov and not cov[inv]["tested"] and (why := self._capability_absent(inv)):
                out.append((inv, titles.get(inv, ""), "N/A", why))
            elif inv in cov and not cov[inv]["tested"]:
                out.append((inv, titles.get(inv, ""), "UNTESTED", cov[inv]["reason"]))
            else:
                out.append((inv, titles.get(inv, ""), "PASS", ""))
        for inv, f in failed.items():
            if inv not in titles:
                out.append((inv, "", "FAIL", f"[{f.cause}] {f.reason}"))
        return out

    def _capability_absent(self, inv: str) -> str | None:
        """The N/A reason when no action declaring ``inv`` is drawn because
        each needs a capability the target lacks (``use_owned`` without an
        Execution Provider); None otherwise."""
        decl = (getattr(self.plan, "declares", {}) or {}).get(inv) or []
        undrawn = _undrawn(self.plan)
        if not decl or any(a not in undrawn for a in decl):
            return None
        need = sorted({r for a in decl for r in undrawn[a]})
        return f"capability absent: {', '.join(need)} (needed by {', '.join(decl)})" if need else None

    @property
    def ok(self) -> bool:
        return not self.failures and not self.errors

    @property
    def untested(self) -> list[str]:
        """Invariants with no FAIL/ERROR/N/A whose actions did not run enough to judge."""
        return [inv for inv, _t, st, _d in self.rows() if st == "UNTESTED"]


# --------------------------------------------------------------------------
# Hypothesis driver (in the process that calls it)
# --------------------------------------------------------------------------

#: engine steps per invocation of the state machine's rule.  Hypothesis's
#: stateful loop costs, per rule invocation, about what a whole step of the
#: bare machine costs (its stop boolean, its rule and ``data()`` draws, their
#: spans, its invariant hook); several engine steps per invocation share it
#: (measured, CPU per step of both levels of ``conform reference`` at 100 x
#: 50, with ``engine.PACKED_DRAWS``: 1 step 747-857 us, 2: 570-677, 3:
#: 601-629, 4: 544-691).  4 by default, with the packed draws (see
#: ``engine.PACKED_DRAWS`` for the kill power compared over seeds).  Above
#: 1, each engine step is its own span of choices and ``stateful_step_count``
#: still counts engine steps (see :func:`_rule_settings`).
STEPS_PER_RULE = 4
#: the label of an engine step's span of choices
_STEP_SPAN = 0x6D656D73


def build_state_machine(plan: E.Plan, guard: CallGuard | None = None, steps: int | None = None) -> type:
    """A ``RuleBasedStateMachine`` class for the plan: one rule that draws
    :data:`STEPS_PER_RULE` available actions of the spec in turn and runs
    each on spec and target; ``steps`` (the settings' ``stateful_step_count``)
    bounds an example's engine steps."""
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, rule

    g = guard or CallGuard(plan.timeout, plan.guard_mode)
    per_rule = STEPS_PER_RULE
    limit = steps

    class ConformanceMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.run: E.Run | None = None   # built at the first step: it draws the example's device capacity
            self._chooser: HypothesisChooser | None = None
            self._data: Any = None
            self._steps = 0

        @rule(data=st.data())
        def step(self, data):
            # one chooser per example: every step draws from the same data
            cd = getattr(data, "conjecture_data", data)
            if cd is not self._data:
                self._data = cd
                self._chooser = HypothesisChooser(cd)
            run = self.run
            if run is None:
                run = self.run = E.Run(plan, g, self._chooser)
            chooser = self._chooser
            if per_rule == 1:   # the rule's own span is the step's
                signals.step(run, run.step(chooser))  # Hypothesis event()s: action, branch, boundaries
                return
            for _ in range(per_rule):
                if limit is not None and self._steps >= limit:
                    return
                self._steps += 1
                cd.start_span(_STEP_SPAN)
                signals.step(run, run.step(chooser))
                cd.stop_span()

        def teardown(self):
            if self.run is not None:
                self.run.teardown()

    safe = "".join(ch if ch.isalnum() else "_" for ch in f"{plan.target}_{plan.level}")
    ConformanceMachine.__name__ = ConformanceMachine.__qualname__ = f"Conformance_{safe}"
    return ConformanceMachine


def _rule_settings(settings: Any) -> Any:
    """``settings`` with ``stateful_step_count`` counting rule invocations
    (:data:`STEPS_PER_RULE` engine steps each, rounded up) instead of
    engine steps."""
    from hypothesis import settings as Settings

    n = settings.stateful_step_count
    return Settings(settings, stateful_step_count=max(1, -(-n // STEPS_PER_RULE)))


def hypothesis_settings(profile: str = "ci", *, examples: int | None = None, steps: int | None = None,
                        db: str | None = None, seed: int | None = None, **extra: Any):
    from hypothesis import Verbosity, settings

    from memspec.invariants import profiles as _profiles  # noqa: F401 - registers the profiles

    base = settings.get_profile(profile)
    kw: dict[str, Any] = {"verbosity": Verbosity.quiet, "deadline": None, "report_multiple_bugs": True}
    if examples is not None:
        kw["max_examples"] = examples
    if steps is not None:
        kw["stateful_step_count"] = steps
    if db is not None:
        from hypothesis.database import DirectoryBasedExampleDatabase

        kw["database"] = DirectoryBasedExampleDatabase(db)
    if seed is not None:
        kw["derandomize"] = False
    kw.update(extra)
    return settings(base, **kw)


def database_key(plan: E.Plan, flavour: str = "stateful") -> bytes:
    m = plan.mutant.name if plan.mutant is not None else ""
    return f"memspec:{flavour}:{plan.target}:{plan.level}:{m}:{plan.machine.name}".encode()


def _flatten(e: BaseException) -> list[tuple[BaseException, bool]]:
    from hypothesis.errors import FlakyFailure

    if isinstance(e, BaseExceptionGroup):
        flaky = isinstance(e, FlakyFailure)
        out = []
        for sub in e.exceptions:
            out += [(x, flaky or f) for x, f in _flatten(sub)]
        return out
    return [(e, False)]


def collect(result: PlanResult, exc: BaseException) -> None:
    """Sort what a Hypothesis run raised into failures and errors."""
    plan = result.plan
    for e, flaky in _flatten(exc):
        if isinstance(e, Violation):
            result.failures.append(Failure(plan.target, plan.level, e.invariant, e.cause, e.reason, e.trace,
                                           plan.stats.first_failure_steps.get(e.invariant), flaky=flaky,
                                           capacity=getattr(e, "capacity", None)))
        elif isinstance(e, SpecError):
            result.errors.append(f"spec error: {e}")
        elif isinstance(e, TargetError):
            result.errors.append(str(e))
        else:
            result.errors.append(f"harness error: {type(e).__name__}: {e}")


class shrink_budget:
    """Bound the time Hypothesis spends shrinking one failure (its engine's
    own limit is 300 s; a conformance run wants its counterexample sooner)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.old = None

    def __enter__(self):
        if self.seconds is not None:
            try:
                from hypothesis.internal.conjecture import engine

                self.old = engine.MAX_SHRINKING_SECONDS
                engine.MAX_SHRINKING_SECONDS = self.seconds
            except (ImportError, AttributeError):  # pragma: no cover
                self.old = None
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            from hypothesis.internal.conjecture import engine

            engine.MAX_SHRINKING_SECONDS = self.old
        return False


#: seconds of shrinking per failure in conform/mutants runs (None: Hypothesis's default)
SHRINK_SECONDS: float | None = 30.0


#: further passes after a pass that found failures (each draws only actions
#: that no failure found so far ended on): every distinct failure in one run
MORE_PASSES = 2


def _last_action(f: Any) -> str | None:
    """The action a failure's trace ended on (None when the trace is empty or
    its last entry was never decoded, e.g. a supervised child that died)."""
    last = f.trace[-1] if f.trace else None
    return getattr(last, "action", None)


def run_hypothesis(plan: E.Plan, settings: Any, *, seed: int | None = None,
                   shrink_seconds: float | None = -1, more_passes: int | None = None,
                   minimize_steps: bool = True) -> PlanResult:
    """Drive the plan's state machine under ``settings`` in this process;
    never raises for a target's misbehaviour (it lands in the result).

    Every distinct failure in one run: after a pass that found failures, up
    to ``more_passes`` (default :data:`MORE_PASSES`) further passes run with
    the actions those failures ended on left out, so a second bug reachable
    without them is reported with its own shrunk reproduction (a target that
    crashes on one action still has its other actions checked)."""
    result = PlanResult(plan.target, plan.level, plan)
    actions = list(plan.actions)
    seen = set()
    left = MORE_PASSES if more_passes is None else more_passes
    from hypothesis import Phase

    if Phase.generate not in settings.phases:
        left = 0  # a replay-only run (reuse/shrink) cannot explore further: one pass
    t0 = time.perf_counter()
    try:
        for n in range(left + 1):
            before = len(result.failures)
            _one_pass(plan, settings, seed, shrink_seconds, result, f":pass{n}" if n else "")
            new = result.failures[before:]
            fresh = []
            for f in new:
                key = (f.invariant, _last_action(f))
                if key not in seen:
                    seen.add(key)
                    fresh.append(f)
            result.failures[before:] = fresh
            ended = {a for a in (_last_action(f) for f in fresh) if a is not None}
            if not fresh or result.errors or not ended:
                break
            plan.actions = [a for a in plan.actions if a.name not in ended]
            plan.partial = True
            plan.__dict__.pop("_weights", None)
            plan.__dict__.pop("_obs_order", None)
            if not plan.actions:
                break
        # the whole action table again: a diagnosis continues a failure with any action (a later
        # pass left out the actions earlier failures ended on, ``poll`` say: the one that shows S4)
        _restore(plan, actions)
        if minimize_steps:
            result.failures[:] = _dedupe(relate(plan, [diagnose(plan, minimize(plan, f))
                                                      for f in result.failures]))
    finally:
        _restore(plan, actions)
        result.seconds = time.perf_counter() - t0
        plan.stats.seconds += result.seconds
    return result


def _restore(plan: E.Plan, actions: list) -> None:
    plan.actions = actions
    plan.partial = False
    plan.__dict__.pop("_weights", None)
    plan.__dict__.pop("_obs_order", None)


def _dedupe(failures: list) -> list:
    """One failure per (invariant, action it ended on) once each is blamed
    on the rule broken (two symptoms re-blamed to the same rule at the same
    call are one failure): the shorter reproduction, the fewer steps to
    detection, the consequences of both."""
    out: dict = {}
    for f in failures:
        key = (f.invariant, _last_action(f))
        g = out.get(key)
        if g is None or key[1] is None:
            out[key if key[1] is not None else (key, id(f))] = f
            continue
        keep, other = (f, g) if len(f.trace) < len(g.trace) else (g, f)
        dets = [d for d in (f.steps_to_detection, g.steps_to_detection) if d is not None]
        keep.steps_to_detection = min(dets) if dets else None
        keep.consequences = list(dict.fromkeys(list(keep.consequences) + list(other.consequences)))
        out[key] = keep
    return list(out.values())


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
            if v.invariant == failure.invariant and size(v.trace) < size(best[0]):
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
                   list(failure.consequences))


DIAGNOSE_BLAME = True


def _replay_steps(plan: E.Plan, guard: CallGuard, capacity: int | None, steps: list, *,
                  then: Callable | None = None, found: list | None = None) -> Violation | None:
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
                inv, cause, why = min(mine, key=lambda x: own.index(x[0]))
                rest = [f"{i} [{c}] {w}" for i, c, w in seen if (i, w) != (inv, why)]
                if rest:
                    why += " -- consequences at this step: " + "; ".join(rest[:4]) \
                        + (f"; {len(rest) - 4} more" if len(rest) > 4 else "")
                found = violation_class(inv)(inv, cause, why, list(v0.trace), len(v0.trace))
        # 1. a step only the blame needs: the variants one step shorter
        pre = plan.presupposed()
        if found is None:
            symptoms = {inv for inv, _c, _w in seen} | {failure.invariant}
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
            and any(inv != failure.invariant and c in _FIGURES for inv, c, _w in seen)
        if found is None and same and failure.cause in _FIGURES and (failure.invariant not in own or spread):
            symptoms = {inv for inv, _c, _w in seen} | {failure.invariant}
            found = _continue(plan, steps, failure, symptoms, replay)
    finally:
        plan.stats, plan.on_call, plan.on_step = saved
    if found is None:
        return failure
    first = _describe(failure, len(trace))
    out = Failure(failure.target, failure.level, found.invariant, found.cause, found.reason, list(found.trace),
                  failure.steps_to_detection, None, failure.flaky, failure.capacity,
                  [first] + list(failure.consequences))
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
    """Several failures of one run, each blamed on the rule broken (issue
    12: *name the invariant whose rule the implementation broke ... list
    the other failures as consequences*): a failure ``a`` is a consequence
    of another, ``b``, of another rule, when ``b``'s rule breaks in ``a``'s
    state and not the other way round.  Checked on fresh replays of the
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

    def breaks(x: Failure, y: Failure, figures: bool) -> bool:
        """``x``'s steps with its failing step replaced by ``y``'s fail there under ``y``'s rule."""
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
                if not ok(a):
                    continue
                for b in fs:
                    if b is a or b.invariant == a.invariant or not ok(b) or b.cause in _FIGURES + _CRASHES:
                        continue
                    if breaks(a, b, False) and not breaks(b, a, True):
                        dets = [d for d in (a.steps_to_detection, b.steps_to_detection) if d is not None]
                        merged = Failure(b.target, b.level, b.invariant, b.cause, b.reason, list(b.trace),
                                         min(dets) if dets else None, b.repro, b.flaky or a.flaky, b.capacity,
                                         list(b.consequences) + [_describe(a, len(a.trace))] + list(a.consequences))
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
    actions, more than :data:`~memspec.invariants.engine.FOCUS_MAX_SHARE`
    of a table of at least :data:`LEDGER_MIN_ACTIONS` (S11, *every byte is
    accounted for*, which 16 of the system's 32 actions move).  Its total
    off together with another rule's figure is a symptom of that step:
    the diagnosis continues past it for the rule broken (a holder's answer
    whose poll ran a release before its fence: the ledger, the pins and the
    queue length are all off; ``synchronize`` then ``poll`` show S4)."""
    rank = _declared_by(plan)
    n = len(plan.machine.actions)
    top = max(rank.values(), default=0)
    return n >= LEDGER_MIN_ACTIONS and rank.get(inv, 0) == top > E.FOCUS_MAX_SHARE * n \
        and sum(1 for v in rank.values() if v == top) == 1


def _declared_by(plan: E.Plan) -> dict:
    """``{invariant: how many of the machine's actions declare it}`` (fewer:
    a more specific rule)."""
    rank: dict = {}
    for a in plan.machine.actions:
        for inv in getattr(a, "invariants", ()) or ():
            rank[inv] = rank.get(inv, 0) + 1
    return rank


class stable_constants:
    """Make a run's draws independent of what else the process imported.

    Hypothesis mixes into its draws (about 5% of integers) the literal
    constants of every *local* module in ``sys.modules`` at the time
    (``hypothesis.internal.conjecture.providers._get_local_constants``).  A
    derandomized run therefore drew differently after a test suite had
    imported more of the project than a test run alone: the cause of the
    order-dependent miss of ``shared-freed-while-mapped`` (caught alone,
    missed in the full suite).  Inside this block the pool is fixed: the
    constants of the spec's own modules (its page sizes and thresholds),
    whatever the process imported."""

    _pool: Any = None

    def __enter__(self):
        self.old = None
        try:
            from hypothesis.internal.conjecture import providers
        except ImportError:  # pragma: no cover - an older Hypothesis without local constants
            return self
        if not hasattr(providers, "_get_local_constants"):  # pragma: no cover
            return self
        pool = stable_constants._pool
        if pool is None:
            pool = stable_constants._pool = _spec_constants()
        self.old = providers._get_local_constants
        providers._get_local_constants = lambda: pool
        _clear_constants_cache(providers)
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            from hypothesis.internal.conjecture import providers

            providers._get_local_constants = self.old
            _clear_constants_cache(providers)
        return False


def _clear_constants_cache(providers: Any) -> None:
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    inner = getattr(cache, "cache", None)
    if inner is not None and hasattr(inner, "clear"):
        inner.clear()


def _spec_constants() -> Any:
    """The literal constants of the modules of ``memspec.spec`` (every one,
    imported here in name order), as Hypothesis collects them."""
    import importlib
    import pkgutil

    from hypothesis.internal.constants_ast import Constants, constants_from_module

    import memspec.spec as spec_pkg

    out = Constants()
    names = sorted(m.name for m in pkgutil.walk_packages(spec_pkg.__path__, "memspec.spec."))
    for name in names:
        try:
            out |= constants_from_module(importlib.import_module(name))
        except Exception:  # noqa: BLE001 - a module whose source cannot be read adds nothing
            continue
    return out


def _one_pass(plan: E.Plan, settings: Any, seed: int | None, shrink_seconds: float | None, result: PlanResult,
              suffix: str) -> None:
    from hypothesis.stateful import get_state_machine_test

    guard = CallGuard(plan.timeout, plan.guard_mode)
    cls = build_state_machine(plan, guard, settings.stateful_step_count)
    if seed is not None:
        cls._hypothesis_internal_use_seed = seed
    test = get_state_machine_test(cls, settings=_rule_settings(settings))
    test._hypothesis_internal_database_key = database_key(plan) + suffix.encode()
    try:
        with shrink_budget(SHRINK_SECONDS if shrink_seconds == -1 else shrink_seconds), stable_constants():
            test()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - everything a target does is a result
        collect(result, e)


# --------------------------------------------------------------------------
# Supervised conformance runs
# --------------------------------------------------------------------------

#: types whose repr ``ast.literal_eval`` reads back as an equal value (``float``: when finite)
_PLAIN = (int, str, bool, bytes, type(None))


def _plain(v: Any, depth: int = 0) -> bool:
    """``v`` is made of :data:`_PLAIN` values (exact types), finite floats,
    tuples, lists and dicts of them: its repr is a literal of an equal value
    without parsing it back."""
    t = type(v)
    if t in _PLAIN:
        return True
    if t is float:
        return v == v and v not in (float("inf"), float("-inf"))
    if depth > 8:
        return False
    if t is tuple or t is list:
        return all(_plain(x, depth + 1) for x in v)
    if t is dict:
        return all(_plain(k, depth + 1) and _plain(x, depth + 1) for k, x in v.items())
    return False


def _literal_repr(v: Any) -> str | None:
    if _plain(v):   # the common case (ints, ids, tuples of them): no parse per step
        return repr(v)
    try:
        r = repr(v)
        return r if ast.literal_eval(r) == v else None
    except Exception:  # noqa: BLE001
        return None


def _step_msg(ts: E.TraceStep) -> dict:
    return {"t": "s", "a": ts.action, "args": _literal_repr(ts.args), "c": list(ts.choices)}


def _trace_msg(trace: list) -> list:
    return [{"a": ts.action, "args": _literal_repr(ts.args), "c": list(ts.choices), "o": ts.outcome,
             "b": list(ts.bound)} for ts in trace]


def _trace_from(msgs: list) -> list:
    """Trace steps rebuilt from the child's (untrusted) messages: literals only."""
    out = []
    for m in msgs:
        if not isinstance(m, dict):
            continue
        args: Any = m.get("args")
        try:
            args = ast.literal_eval(args) if isinstance(args, str) else {}
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            args = {}
        if not isinstance(args, dict):
            args = {}
        choices = [c for c in m.get("c") or [] if isinstance(c, (int, bool))]
        bound = tuple(b for b in m.get("b") or [] if isinstance(b, int))
        out.append(E.TraceStep(str(m.get("a")), args, choices, str(m.get("o", "")), bound))
    return out


def _stats_msg(st: E.Stats) -> dict:
    return {"examples": st.examples, "steps": st.steps, "seconds": st.seconds, "actions": dict(st.actions),
            "outcomes": [[a, o, n] for (a, o), n in st.outcomes.items()], "offered": dict(st.offered), "accepted": dict(st.accepted),
            "boundaries": dict(st.boundaries),
            "first": dict(st.first_failure_steps), "failing": st.failures_seen}


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _stats_into(st: E.Stats, m: dict) -> None:
    st.examples, st.steps = _int(m.get("examples")), _int(m.get("steps"))
    sec = m.get("seconds")
    st.seconds = float(sec) if isinstance(sec, (int, float)) else 0.0
    st.failures_seen = _int(m.get("failing"))
    acts = m.get("actions")
    if isinstance(acts, dict):
        st.actions = Counter({str(k): _int(v) for k, v in acts.items()})
    outs = m.get("outcomes")
    if isinstance(outs, list):
        st.outcomes = Counter({(str(x[0]), str(x[1])): _int(x[2]) for x in outs if isinstance(x, list) and len(x) == 3})
    for name in ("offered", "accepted", "boundaries"):
        d = m.get(name)
        if isinstance(d, dict):
            setattr(st, name, Counter({str(k): _int(v) for k, v in d.items()}))
    first = m.get("first")
    if isinstance(first, dict):
        st.first_failure_steps = {str(k): _int(v) for k, v in first.items()}


def _child(ch: Channel, target: str, level: str, skip: list, opts: dict) -> None:
    """The supervised child: probe the target once, plan each level, run it,
    and say everything on ``ch``.  Nothing it sends is code."""
    guard = CallGuard(opts["timeout"], "direct")
    guard.blame, guard.what = TARGET_ERROR, f"importing the target {target!r}"
    guard.limit = opts["build_timeout"] or max(opts["timeout"], BUILD_SECONDS)   # imports and a first factory call
    tref, err = guard.call(resolve, target)
    if err is None and tref.factory is None:
        err = LookupError(tref.error or "unavailable")
    if err is not None:
        ch.send({"t": "error", "level": level, "error": f"{type(err).__name__}: {err}"})
        return
    guard.what = f"building the target {target!r} (its factory)"
    probe, err = guard.call(build_probe, tref, opts["capacity"])
    if err is not None:
        msg = str(err) if isinstance(err, TargetError) else \
            f"target {tref.name!r} factory raised {type(err).__module__}.{type(err).__name__}: {err}"
        ch.send({"t": "error", "level": level, "error": msg})
        return
    plans: list = []
    try:
        kind = probe.kind
        lv = levels_for(kind, level)
        if tref.mutant is not None and level == "all":
            lv = [tref.mutant.level]
        if not lv:
            ch.send({"t": "error", "level": level,
                     "error": f"level {level!r} does not apply to a target of kind {kind!r}"})
            return
        for lvl in lv:
            if lvl in skip:
                continue
            guard.what = f"probing the target for the {lvl} level"
            plan, err = guard.call(make_plan, tref, lvl, capacity=opts["capacity"], timeout=opts["timeout"],
                                   machine=opts["machine"], probe=probe)
            if err is not None:
                ch.send({"t": "error", "level": lvl, "error": f"{type(err).__name__}: {err}"})
                continue
            plans.append(plan)
    finally:
        guard.what = "closing the probe instance"
        guard.call(close_probe, probe)
        guard.limit = None
    for plan in plans:
        _run_child_plan(ch, plan, opts)


def _run_child_plan(ch: Channel, plan: E.Plan, opts: dict) -> None:
    ch.send({"t": "plan", "level": plan.level, "target": plan.target,
             "invariants": [[inv.id, inv.title] for inv in plan.machine.invariants], "na": plan.na,
             "capabilities": plan.capabilities, "actions": [a.name for a in plan.actions], "declares": plan.declares, "undrawn": _undrawn(plan),
             "timeout": plan.timeout, "factory_kwargs": plan.factory_kwargs, "machine_ref": plan.machine_ref})
    last = [0.0]

    # the steps of the current example go to the shared StepLog (read by the
    # supervisor only if this process dies); the channel carries the examples'
    # starts, progress and results -- and a step only when the log is full
    log = StepLog.current

    def on_call(run: E.Run, ts: E.TraceStep | None) -> None:
        if ts is None:
            if log is not None:
                log.reset()
            ch.send({"t": "ex", "cap": run.capacity})
            return
        msg = _step_msg(ts)
        if len(run.trace) >= 2:   # what the previous step answered (the last one's answer may never come)
            prev = run.trace[-2]
            msg["po"], msg["pb"] = prev.outcome, list(prev.bound)
        if log is None or not log.append(msg, run.plan.stats.steps):
            ch.send(msg)

    def on_step(p: E.Plan) -> None:
        now = time.perf_counter()
        if now - last[0] > 0.2:
            last[0] = now
            st = p.stats
            ch.send({"t": "p", "examples": st.examples, "steps": st.steps, "failing": st.failures_seen,
                     "outcomes": len(st.outcomes), "actions": dict(st.actions)})

    plan.on_call = on_call
    plan.on_step = on_step
    plan.build_timeout = opts["build_timeout"]
    extra: dict = {}
    if not opts["shrink"]:
        from hypothesis import Phase

        extra["phases"] = [Phase.explicit, Phase.reuse, Phase.generate]
    sets = hypothesis_settings(opts["profile"], examples=opts["examples"], steps=opts["steps"], db=opts["db"],
                               seed=opts["seed"], **extra)
    res = run_hypothesis(plan, sets, seed=opts["seed"], shrink_seconds=opts["shrink_seconds"])
    ch.send({"t": "result", "level": plan.level, "errors": res.errors, "stats": _stats_msg(plan.stats),
             "failures": [{"invariant": f.invariant, "cause": f.cause, "reason": f.reason,
                           "trace": _trace_msg(f.trace), "std": f.steps_to_detection, "flaky": f.flaky,
                           "cap": f.capacity, "also": [str(c) for c in f.consequences]}
                          for f in res.failures]})


def _undrawn(plan: Any) -> dict:
    """``{action name: [capabilities it needs that the target lacks]}`` for
    the machine's actions a plan does not draw (an engine Plan or a PlanInfo)."""
    got = getattr(plan, "undrawn", None)
    if isinstance(got, dict):
        return got
    machine = getattr(plan, "machine", None)
    if machine is None:
        return {}
    caps = getattr(plan, "capabilities", {}) or {}
    drawn = set(plan.action_names)
    return {a.name: [r for r in getattr(a, "requires", ()) if not caps.get(r)] for a in machine.actions
            if a.name not in drawn}


def _cap(v: Any) -> int | None:
    """A device capacity the (untrusted) child named: a positive int, or None."""
    return v if type(v) is int and v > 0 else None


def _str(v: Any) -> str:
    return v if isinstance(v, str) else repr(v)


class _Parent:
    """The supervisor's view of one child: the plans it announced, the
    current example's steps, the results."""

    def __init__(self, target: str, level: str, results: list, done: list, on_step: Callable | None,
                 on_plan: Callable | None, mutant: Any) -> None:
        self.target, self.level, self.results, self.done = target, level, results, done
        self.on_step, self.on_plan, self.mutant = on_step, on_plan, mutant
        self.current: PlanResult | None = None
        self.trace: list = []
        self.capacity: int | None = None   # the device capacity of the current example
        self.stopped = False
        self.min_accepted = V.MIN_ACCEPTED

    @staticmethod
    def _add_step(trace: list, m: dict) -> None:
        """Append step message ``m`` to ``trace``; its ``po``/``pb`` are the
        previous step's answer."""
        if trace and "po" in m:
            trace[-1] = {**trace[-1], "o": m.get("po"), "b": m.get("pb")}
        trace.append(m)

    def on_message(self, m: dict) -> None:
        t = m.get("t")
        if t == "s":   # a step the child's StepLog had no room for
            self._add_step(self.trace, m)
            if self.current is not None:   # counted here too: a child that dies sends no result
                st = self.current.plan.stats
                st.steps += 1
                st.actions[_str(m.get("a"))] += 1
        elif t == "ex":
            self.trace = []
            self.capacity = _cap(m.get("cap"))
            if self.current is not None:
                self.current.plan.stats.examples += 1
        elif t == "p" and self.current is not None:
            st = self.current.plan.stats
            st.examples, st.steps, st.failures_seen = _int(m.get("examples")), _int(m.get("steps")), _int(m.get("failing"))
            acts = m.get("actions")
            if isinstance(acts, dict):
                st.actions = Counter({_str(k): _int(v) for k, v in acts.items()})
            if self.on_step is not None:
                self.on_step(self.current.plan)
        elif t == "plan":
            lvl = _str(m.get("level"))
            inv = [(_str(x[0]), _str(x[1])) for x in m.get("invariants") or [] if isinstance(x, list) and len(x) == 2]
            na = {_str(k): _str(v) for k, v in (m.get("na") or {}).items()} if isinstance(m.get("na"), dict) else {}
            caps = {_str(k): bool(v) for k, v in (m.get("capabilities") or {}).items()} \
                if isinstance(m.get("capabilities"), dict) else {}
            fkw = m.get("factory_kwargs") if isinstance(m.get("factory_kwargs"), dict) else {}
            info = PlanInfo(self.target, lvl, inv, na, caps, [_str(a) for a in m.get("actions") or []],
                            float(m.get("timeout") or 5.0), {"capacity": fkw["capacity"]} if "capacity" in fkw else {},
                            m.get("machine_ref") if isinstance(m.get("machine_ref"), str) else None,
                            mutant=self.mutant)
            und = m.get("undrawn")
            if isinstance(und, dict):
                info.undrawn = {_str(k): [_str(r) for r in v] for k, v in und.items() if isinstance(v, list)}
            decl = m.get("declares")
            if isinstance(decl, dict):
                info.declares = {_str(k): [_str(a) for a in v] for k, v in decl.items() if isinstance(v, list)}
            self.current = PlanResult(self.target, lvl, info, min_accepted=self.min_accepted)
            self.trace = []
            self._t0 = time.perf_counter()
            if self.on_plan is not None:
                self.on_plan(info)
        elif t == "result" and self.current is not None:
            r = self.current
            _stats_into(r.plan.stats, m.get("stats") or {})
            r.seconds = r.plan.stats.seconds
            r.errors += [_str(e) for e in m.get("errors") or []]
            for f in m.get("failures") or []:
                if isinstance(f, dict):
                    r.failures.append(Failure(self.target, r.level, _str(f.get("invariant")), _str(f.get("cause")),
                                              _str(f.get("reason")), _trace_from(f.get("trace") or []),
                                              f.get("std") if isinstance(f.get("std"), int) else None,
                                              flaky=bool(f.get("flaky")), capacity=_cap(f.get("cap")),
                                              consequences=[_str(c) for c in f.get("also") or []
                                                            if isinstance(f.get("also"), list)]))
            self.results.append(r)
            self.done.append(r.level)
            self.current = None
        elif t == "error":
            r = PlanResult(self.target, _str(m.get("level")), None)
            r.errors.append(_str(m.get("error")))
            self.results.append(r)
            self.done.append(r.level)
            if self.current is None and r.level == self.level:
                self.stopped = True
        elif t == "fatal":
            r = self.current or PlanResult(self.target, self.level, None)
            r.errors.append(f"harness error: {_str(m.get('error'))}")
            if self.current is not None:
                self.results.append(r)
                self.done.append(r.level)
                self.current = None
            else:
                self.results.append(r)
                self.stopped = True

    def died(self, end: Any) -> None:
        """The child ended without finishing: report it where it happened
        (the steps of its last example: those of its StepLog, then any it
        had to send on the channel)."""
        msgs: list = []
        for m in [*getattr(end, "log", ()), *self.trace]:
            if isinstance(m, dict):
                self._add_step(msgs, m)
        if self.current is not None:
            st = self.current.plan.stats
            st.steps = max(st.steps, _int(getattr(end, "log_steps", 0)))
        trace = _trace_from(msgs)
        where = f"step {len(trace)} ({trace[-1].action})" if trace else "before the first step"
        r = self.current
        if r is None:
            r = PlanResult(self.target, self.level, None)
            r.errors.append(f"target {self.target!r}: {end.death}")
            self.results.append(r)
            self.stopped = True
            return
        r.seconds = time.perf_counter() - self._t0
        r.plan.stats.seconds = r.seconds
        blame = end.blame or TARGET_ERROR
        if blame == TARGET_ERROR:
            r.errors.append(f"target {self.target!r}: {end.death}" + ("" if end.what else f", {where}"))
        else:
            cause = "hang" if end.hang else "crash"
            if trace:
                trace[-1].outcome = "hangs" if end.hang else "kills the process"
            reason = end.death if end.what.startswith("step ") else f"{end.death}, at {where}"
            r.failures.append(Failure(self.target, r.level, blame, cause, reason, trace, r.plan.stats.steps,
                                      capacity=self.capacity))
        self.results.append(r)
        self.done.append(r.level)
        self.current = None


def conform(target: str, level: str = "all", *, profile: str = "ci", examples: int | None = None,
            steps: int | None = None, seed: int | None = None, db: str | None = None, capacity: int | None = None,
            timeout: float = 5.0, out_dir: str | None = "memspec-out/repro", on_step: Callable | None = None,
            on_plan: Callable | None = None, machine: str | None = None, shrink: bool = True,
            shrink_seconds: float | None = -1, build_timeout: float | None = None,
            min_accepted: int = V.MIN_ACCEPTED) -> list[PlanResult]:
    """Run every applicable level of ``target`` under supervision; one
    :class:`PlanResult` per level.  Never raises for what the target does.
    ``timeout`` bounds each call into the target; ``build_timeout`` its
    import and factory (default: the larger of ``timeout`` and
    :data:`~memspec.invariants.guard.BUILD_SECONDS`).  ``min_accepted``:
    accepting steps each declaring action needs for a PASS (fewer:
    UNTESTED, see :mod:`~memspec.invariants.verdicts`)."""
    opts = {"profile": profile, "examples": examples, "steps": steps, "seed": seed, "db": db, "capacity": capacity,
            "timeout": timeout, "machine": machine, "shrink": shrink, "shrink_seconds": shrink_seconds,
            "build_timeout": build_timeout}
    results: list[PlanResult] = []
    done: list[str] = []
    mutant = None
    if target.startswith("mutant:"):  # the shipped catalog: trusted, named in the report
        try:
            mutant = resolve(target).mutant
        except LookupError:
            mutant = None
    for _attempt in range(len(LEVELS) + 1):
        parent = _Parent(target, level, results, done, on_step, on_plan, mutant)
        parent.min_accepted = min_accepted
        end = supervise(lambda ch: _child(ch, target, level, list(done), opts), timeout=timeout,
                        on_message=parent.on_message)
        if end.death is None:
            if parent.current is not None:  # said "done" in the middle of a plan: not possible, but never lost
                parent.died(end)
            break
        parent.died(end)
        if parent.stopped:
            break
    if out_dir:
        for r in results:
            if r.plan is not None:
                write_repros(r, out_dir, target_name=target)
    return results


def describe(target: str, level: str = "all", *, machine: str | None = None, timeout: float = 30.0) -> list:
    """``[(level, [(invariant id, title)], error or None)]`` for ``target``,
    learnt in a supervised child (the factory runs there, once)."""
    def work(ch: Channel) -> None:
        guard = CallGuard(timeout, "direct")
        guard.blame, guard.what = TARGET_ERROR, f"importing the target {target!r}"
        guard.limit = max(timeout, BUILD_SECONDS)
        tref, err = guard.call(resolve, target)
        if err is None and tref.factory is None:
            err = LookupError(tref.error or "unavailable")
        if err is not None:
            ch.send({"t": "error", "level": level, "error": f"{type(err).__name__}: {err}"})
            return
        guard.what = f"building the target {target!r} (its factory)"
        probe, err = guard.call(build_probe, tref, None)
        if err is not None:
            ch.send({"t": "error", "level": level, "error": f"{type(err).__name__}: {err}"})
            return
        try:
            lv = [tref.mutant.level] if tref.mutant is not None and level == "all" else levels_for(probe.kind, level)
            if not lv:
                ch.send({"t": "error", "level": level, "error": f"level {level!r} does not apply to a target of kind {probe.kind!r}"})
            for lvl in lv:
                guard.what = f"probing the target for the {lvl} level"
                plan, err = guard.call(make_plan, tref, lvl, machine=machine, probe=probe)
                if err is not None:
                    ch.send({"t": "error", "level": lvl, "error": f"{type(err).__name__}: {err}"})
                else:
                    ch.send({"t": "plan", "level": lvl,
                             "invariants": [[inv.id, inv.title] for inv in plan.machine.invariants]})
        finally:
            guard.call(close_probe, probe)

    end = supervise(work, timeout=timeout)
    out = []
    for m in end.messages:
        if m.get("t") == "plan":
            out.append((_str(m.get("level")), [(_str(x[0]), _str(x[1])) for x in m.get("invariants") or []
                                              if isinstance(x, list) and len(x) == 2], None))
        elif m.get("t") == "error":
            out.append((_str(m.get("level")), [], _str(m.get("error"))))
    if end.death is not None:
        out.append((level, [], f"target {target!r}: {end.death}"))
    return out


def _kind_of(tref: TargetRef, capacity: int | None) -> str:
    """The kind of ``tref``'s instances (one instance built and closed here)."""
    return kind_of(tref, capacity)
