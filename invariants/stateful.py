"""The Hypothesis driver: a plan's state machine (one rule that draws the
spec's actions), its settings, and the passes of one run -- in the process
that calls it (a supervised child, under :func:`~memspec.invariants.runner.conform`)."""

from __future__ import annotations

import re
import time
from typing import Any

from memspec.invariants import engine as E
from memspec.invariants import signals
from memspec.invariants import text as T
from memspec.invariants.blame import _dedupe, diagnose, minimize, relate
from memspec.invariants.choosers import HypothesisChooser
from memspec.invariants.errors import SpecError, TargetError, Violation
from memspec.invariants.guard import CallGuard
from memspec.invariants.results import Failure, PlanResult, _flatten, _last_action, database_key  # noqa: F401



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


def build_state_machine(plan: E.Plan, guard: CallGuard | None = None, steps: int | None = None,
                        runs: list | None = None) -> type:
    """A ``RuleBasedStateMachine`` class for the plan: one rule that draws
    :data:`STEPS_PER_RULE` available actions of the spec in turn and runs
    each on spec and target; ``steps`` (the settings' ``stateful_step_count``)
    bounds an example's engine steps.  ``runs``, when given, holds the
    current example's :class:`~memspec.invariants.engine.Run` (its steps are
    the evidence when Hypothesis reports inconsistent draws, see
    :func:`replay_evidence`)."""
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
            if runs is not None:
                runs.clear()   # a new example: none of its steps yet

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
                if runs is not None:
                    runs[:] = [run]
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

    from memspec.invariants.profiles import load as _registers  # the import registers the profiles

    del _registers
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


#: the row a target whose answers differ on replay is reported under
NONDETERMINISM = "NONDET"


def _nondeterministic(e: BaseException) -> bool:
    try:
        from hypothesis.errors import FlakyStrategyDefinition
    except ImportError:  # pragma: no cover - an older Hypothesis
        return type(e).__name__ == "FlakyStrategyDefinition"
    return isinstance(e, FlakyStrategyDefinition)


def collect(result: PlanResult, exc: BaseException) -> None:
    """Sort what a Hypothesis run raised into failures and errors."""
    plan = result.plan
    for e, flaky in _flatten(exc):
        if isinstance(e, Violation):
            result.failures.append(Failure(plan.target, plan.level, e.invariant, e.cause, e.reason, e.trace,
                                           plan.stats.first_failure_steps.get(e.invariant), flaky=flaky,
                                           capacity=getattr(e, "capacity", None),
                                           check=getattr(e, "check", None), key=getattr(e, "key", None),
                                           also_keys=tuple(getattr(e, "also_keys", ()) or ())))
        elif isinstance(e, SpecError):
            result.errors.append(f"spec error: {e}")
        elif _nondeterministic(e):
            # the same choices drew differently: the target's answers depend on more than the steps (history,
            # time, addresses) when a replay of the example's steps shows it (the evidence), else the cause is
            # not shown (see run_hypothesis) -- one named finding, not an ERROR on every row
            evidence = getattr(e, "memspec_evidence", None)
            if evidence:
                why = (f"the target answered the same steps differently when Hypothesis replayed them "
                       f"({type(e).__name__}): {evidence}; its answers depend on more than the calls made")
            else:
                n = len(getattr(e, "trace", None) or [])
                why = f"Hypothesis drew the same choices differently ({type(e).__name__}: {_first_detail(e)})" + (
                    f", and the example's {n} steps, replayed on {getattr(e, 'memspec_replays', 0)} fresh "
                    f"instances of the target, were answered as in the run: not shown to be the target's"
                    if n else " before the example's first step, where no answer of the target's is drawn on: "
                              "not the target's")
            result.failures.append(Failure(plan.target, plan.level, NONDETERMINISM, "nondeterministic", why,
                                           list(getattr(e, "trace", []) or []), None, flaky=True,
                                           check="shown" if evidence else "not-shown"))
        elif isinstance(e, TargetError):
            result.errors.append(str(e))
        else:
            result.errors.append(f"harness error: {type(e).__name__}: {e}")


def _first_detail(e: BaseException) -> str:
    """The line of a Hypothesis error that says what differed (``The second
    test case drew type integer with different constraints than the
    first.``), else its first line."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[min(1, len(lines) - 1)][:300] if lines else type(e).__name__


#: fresh instances the steps of an example Hypothesis drew inconsistently are replayed on, looking
#: for an answer that differs from the run's (the evidence of a target whose answers depend on more
#: than the calls made)
NONDET_REPLAYS = 3


class _AnswerLog(CallGuard):
    """A :class:`CallGuard` that keeps each action call's answer (the value
    returned or the error raised), described -- not the reads of the
    observations that follow it: what the spec's state, hence the next
    draws, is made of."""

    def __init__(self, timeout: float, mode: str) -> None:
        super().__init__(timeout, mode)
        #: ``"step N: action"`` -> the answer of that step's action call (the first call made under
        #: that name: the data checks that may follow under it are not answers)
        self.answers: dict = {}

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, BaseException | None]:
        value, err = super().call(fn, *args, **kwargs)
        what = self.what
        if what.startswith("step ") and ": reading " not in what and what not in self.answers:
            self.answers[what] = _IDENTITY.sub("Identity(...)", f"raises {T.exc_text(err)}" if err is not None else
                                               f"returns {E._describe_value(value, 200)}")
        return value, err


#: an identity in an answer's description: fresh per instance by contract (S14), so never evidence
_IDENTITY = re.compile(r"Identity\([^()]*\)")


def replay_evidence(plan: E.Plan, run: E.Run, replays: int = NONDET_REPLAYS) -> tuple[str | None, int]:
    """Replay the steps ``run`` took -- the same actions with the same
    arguments, on a fresh instance of the target built as ``run``'s was --
    up to ``replays`` times, and compare each step's answer with the run's
    (the branch the target took, or its refusal) and with the other
    replays' (the value itself: a footprint, an address).  Returns
    ``(evidence, replays made)``: the first step answered differently
    (``"step 2 allocate(size=4096, alignment=256): raises OutOfMemory in the
    run, returns an allocation ... on a fresh instance"``), or None when
    every replay answered as the run and the others did (then the
    inconsistency Hypothesis saw is not shown to be the target's).  A replay
    ends at the first step it cannot make (its build fails, the spec cannot
    follow) or that fails a check."""
    steps = list(run.trace)
    made = 0
    first: dict | None = None   # the first replay's answers
    for _ in range(replays if steps else 0):
        made += 1
        guard = _AnswerLog(plan.timeout, plan.guard_mode)
        try:
            again = E.Run(plan, guard, capacity=run.capacity)
        except Exception:  # noqa: BLE001 - a target that cannot be built again shows nothing here
            continue
        guard.answers.clear()   # the calls that built it
        try:
            for i, ts in enumerate(steps):
                call = f"{ts.action}({', '.join(f'{k}={E._describe_value(v, 40)}' for k, v in ts.args.items())})"
                try:
                    again.apply(plan.machine.action(ts.action), dict(ts.args), ts.choices)
                except Violation:
                    pass   # the step's answer is in the trace all the same; nothing after it can run
                except Exception:  # noqa: BLE001 - the spec cannot follow: nothing more to compare
                    break
                got = again.trace[i].outcome if len(again.trace) > i else ""
                if got != ts.outcome:
                    return (f"step {i + 1} {call}: {ts.outcome or 'no answer'} in the run, "
                            f"{got or 'no answer'} on a fresh instance"), made
                key = f"step {i + 1}: {ts.action}"
                if first is not None and key in first and key in guard.answers and guard.answers[key] != first[key]:
                    return (f"step {i + 1} {call}: {first[key]} on one fresh instance, {guard.answers[key]} on "
                            f"another"), made
                if again.failed:
                    break
        finally:
            again.close()
        if first is None:
            first = dict(guard.answers)
    return None, made


class shrink_budget:
    """Bound the shrinking Hypothesis does for one failure.

    ``shrinks``: successful shrinks (Hypothesis's ``MAX_SHRINKS``, a count:
    what a run shrinks to, and so which failures it finds while shrinking,
    is then the same on a quiet and on a busy machine); ``seconds``: a
    wall-clock ceiling (Hypothesis's ``MAX_SHRINKING_SECONDS``, its own is
    300 s), kept only as a safety for a pathological shrink; a fuzzing
    campaign, budgeted in time by design, uses it as its budget.  ``None``
    leaves Hypothesis's value."""

    def __init__(self, seconds: float | None, shrinks: int | None = None) -> None:
        self.seconds = seconds
        self.shrinks = shrinks
        self.old: tuple | None = None

    def __enter__(self):
        try:
            from hypothesis.internal.conjecture import engine

            self.old = (engine.MAX_SHRINKING_SECONDS, engine.MAX_SHRINKS)
            if self.seconds is not None:
                engine.MAX_SHRINKING_SECONDS = self.seconds
            if self.shrinks is not None:
                engine.MAX_SHRINKS = self.shrinks
        except (ImportError, AttributeError):  # pragma: no cover
            self.old = None
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            from hypothesis.internal.conjecture import engine

            engine.MAX_SHRINKING_SECONDS, engine.MAX_SHRINKS = self.old
        return False


#: successful shrinks per failure in conform/mutants runs: a count, so that a
#: run's reproductions and blame do not depend on the machine's load (each
#: failure is then minimized further by :func:`~memspec.invariants.blame.minimize`,
#: bounded by a replay count too)
SHRINKS: int | None = 25

#: wall-clock ceiling of that shrinking, a safety only (Hypothesis's own is
#: 300 s): the count above ends a shrink first on any machine this runs on
SHRINK_SECONDS: float | None = 300.0


#: further passes after a pass that found failures (each with the checks those
#: failures broke masked, every action kept): every distinct failure in one
#: run.  Counted in *full passes' worth of steps*, not in passes: a pass
#: that finds its failure early costs little, so a crash whose leftovers
#: show in one figure after another (the seed toy's small-request crash:
#: six figures over six short passes) still leaves room for a second bug;
#: passes that explore their whole budget stop after 3 more
MORE_PASSES = 3

#: at most this many passes in one run, however cheap (each failure found is
#: then minimized, diagnosed and related: bounded work per failure)
MAX_PASSES = 16




def run_hypothesis(plan: E.Plan, settings: Any, *, seed: int | None = None,
                   shrink_seconds: float | None = -1, more_passes: int | None = None,
                   minimize_steps: bool = True, until: frozenset | None = None) -> PlanResult:
    """Drive the plan's state machine under ``settings`` in this process;
    never raises for a target's misbehaviour (it lands in the result).

    Every distinct failure in one run: after a pass that found failures,
    further passes run, while the run's steps stay within ``more_passes``
    (default :data:`MORE_PASSES`) more passes' worth (``max_examples x
    stateful_step_count`` each; at most :data:`MAX_PASSES` passes), with
    those failures' checks *masked* (``Plan.masks``): every action stays in
    the table, the spec follows the branch whose clause broke (or, for an
    answer it cannot follow, keeps its state), and every other check goes
    on, so an independent second bug is found in the same run with its own
    shrunk reproduction.  Only a hang or a crash (no answer to follow) leaves
    its action out of the later passes.  Then each failure is minimized and
    diagnosed with the others' checks still masked, and the failures are
    related by replay (:func:`~memspec.invariants.blame.relate`): one is
    another's consequence only when its reproduction needs the other's
    broken step.

    ``until`` (invariant ids): no further pass once a failure of one of
    them is found -- a question answered (a mutant killed) ends the run;
    what was found by then is minimized, diagnosed and related as usual."""
    result = PlanResult(plan.target, plan.level, plan)
    actions = list(plan.actions)
    masks0 = plan.masks
    seen = set()
    left = MORE_PASSES if more_passes is None else more_passes
    from hypothesis import Phase

    if Phase.generate not in settings.phases:
        left = 0  # a replay-only run (reuse/shrink) cannot explore further: one pass
    t0 = time.perf_counter()
    spend = (left + 1) * settings.max_examples * settings.stateful_step_count   # steps all passes may take
    s0 = plan.stats.steps
    try:
        for n in range(MAX_PASSES if left else 1):
            if n and plan.stats.steps - s0 >= spend:
                break
            before = len(result.failures)
            _one_pass(plan, settings, seed, shrink_seconds, result, f":pass{n}" if n else "")
            nondet = [f for f in result.failures[before:] if f.invariant == NONDETERMINISM]
            if nondet and Phase.generate in settings.phases:
                # Hypothesis cannot replay this run: judge the target by seeded random walks instead,
                # whose draws need no replay.  Blamed on the target only with the evidence (a step it
                # answered differently on a fresh instance); otherwise the harness's draws may be at
                # fault, and the run says so as an error of its own
                result.failures[before:] = [f for f in result.failures[before:] if f.invariant != NONDETERMINISM]
                shown = [f for f in nondet if f.check == "shown"]
                if not shown:
                    result.errors.append(f"harness error: {nondet[0].reason}")
                budget = max(0, settings.max_examples * settings.stateful_step_count - plan.stats.steps)
                result.notes.append(_walk_instead(plan, result, budget, seed, (shown or nondet)[0].reason))
                break
            new = result.failures[before:]
            fresh = []
            for f in new:
                # one failure per check (its mask key): a figure of the same rule at the same call is
                # another check, and the next pass must mask it too
                key = f.key if f.key is not None else (f.invariant, f.check, _last_action(f))
                if key not in seen:
                    seen.add(key)
                    fresh.append(f)
            result.failures[before:] = fresh
            if not fresh or result.errors:
                break
            if until and any(f.invariant in until for f in result.failures):
                break
            # a failure's check, and the others that failed at the very same step (one answer seen
            # through several figures): masked together, so the next pass looks further, not at them
            keys = {k for f in fresh if f.key is not None and f.cause not in ("hang", "crash")
                    for k in (f.key, *f.also_keys)}
            ended = {a for f in fresh if f.key is None or f.cause in ("hang", "crash")
                     for a in [_last_action(f)] if a is not None}
            if not keys and not ended:
                break
            plan.masks = frozenset(plan.masks | keys)
            if ended:
                plan.actions = [a for a in plan.actions if a.name not in ended]
                plan.partial = True
            plan.__dict__.pop("_weights", None)
            plan.__dict__.pop("_obs_order", None)
            if not plan.actions:
                break
        # the whole action table again: a diagnosis continues a failure with any action
        _restore(plan, actions)
        if minimize_steps:
            every = plan.masks
            done = []
            for f in result.failures:
                # the others' checks stay masked: the diagnosis never re-blames one failure as another
                # independent one the run already found (a leak shown after an alignment bug is the leak)
                plan.masks = frozenset(every - {f.key})
                try:
                    g = diagnose(plan, minimize(plan, f))
                finally:
                    plan.masks = every
                g.diagnosed_masks = tuple(sorted(every - {f.key, g.key}, key=str))
                if g.key is None and g.invariant == f.invariant and g.check == f.check:
                    g.key = f.key
                done.append(g)
            result.failures[:] = _dedupe(relate(plan, done))
    finally:
        _restore(plan, actions)
        plan.masks = masks0
        result.seconds = time.perf_counter() - t0
        plan.stats.seconds += result.seconds
    return result


#: steps of one random walk of :func:`_walk_instead`
WALK_RUN_LENGTH = 50


def _walk_instead(plan: E.Plan, result: PlanResult, budget: int, seed: int | None, why: str = "") -> str:
    """Judge a target Hypothesis cannot replay by seeded random walks
    (:mod:`~memspec.invariants.walk`) for ``budget`` steps: each failure
    found is masked (as between passes) and the walks go on, so every
    independent failure is found; each is then minimized by replay like any
    other.  Returns the note the report shows (``why``: what Hypothesis saw,
    with the evidence)."""
    from memspec.invariants import walk

    start = plan.stats.steps
    seen = set()
    base = 0 if seed is None else int(seed)
    i = 0
    while plan.stats.steps - start < budget and len(seen) < 16:
        left = budget - (plan.stats.steps - start)
        res = walk.walk(plan, max_steps=left, seed=base * 1000003 + i, run_length=WALK_RUN_LENGTH,
                        stop_on_failure=True)
        i += 1
        result.errors += [e for e in res.errors if e not in result.errors]
        if res.errors or not res.failures:
            break
        for wf in res.failures:
            v = wf.violation
            k = (v.invariant, getattr(v, "check", None), v.trace[-1].action if v.trace else None)
            if k in seen:
                continue
            seen.add(k)
            result.failures.append(Failure(plan.target, plan.level, v.invariant, v.cause, v.reason, list(v.trace),
                                           wf.steps, capacity=getattr(v, "capacity", None),
                                           check=getattr(v, "check", None), key=getattr(v, "key", None)))
            key = getattr(v, "key", None)
            if key is not None and v.cause not in ("hang", "crash"):
                plan.masks = frozenset(plan.masks | {key})
            elif v.trace:
                break   # a hang or a crash: nothing to follow past it
    return (f"{why or 'Hypothesis could not replay the run'}: judged by seeded random walks instead "
            f"({plan.stats.steps - start} steps, {i} walk rounds); reproductions replay the steps, which such a "
            f"target may answer differently again")


def _restore(plan: E.Plan, actions: list) -> None:
    plan.actions = actions
    plan.partial = False
    plan.__dict__.pop("_weights", None)
    plan.__dict__.pop("_obs_order", None)



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
    runs: list = []
    cls = build_state_machine(plan, guard, settings.stateful_step_count, runs=runs)
    if seed is not None:
        cls._hypothesis_internal_use_seed = seed
    test = get_state_machine_test(cls, settings=_rule_settings(settings))
    test._hypothesis_internal_database_key = database_key(plan) + suffix.encode()
    try:
        with shrink_budget(SHRINK_SECONDS if shrink_seconds == -1 else shrink_seconds,
                           SHRINKS if shrink_seconds == -1 else None), stable_constants():
            test()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - everything a target does is a result
        flaky = [x for x, _f in _flatten(e) if _nondeterministic(x)]
        if flaky and runs:
            # the example Hypothesis was running when it saw the inconsistent draw: its steps, and
            # whether the target answers them differently on a fresh instance (the evidence)
            evidence, made = replay_evidence(plan, runs[0])
            for x in flaky:
                x.trace, x.memspec_evidence, x.memspec_replays = list(runs[0].trace), evidence, made
        collect(result, e)


