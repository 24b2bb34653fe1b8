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

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from memspec.invariants import engine as E
from memspec.invariants import verdicts as V
from memspec.invariants.blame import (DIAGNOSE_BLAME, DIAGNOSE_DEPTH, DIAGNOSE_REPLAYS,  # noqa: F401 - re-exported
                                      LEDGER_MIN_ACTIONS, MINIMIZE_REPLAYS, RELATE_REPLAYS, _ClampChooser,
                                      _CRASHES, _FIGURES, _continue, _declared_by, _dedupe, _describe, _ints,
                                      _ledger, _refused, _replay_steps, _smaller, _Unreplayable,
                                      diagnose, minimize, relate)
from memspec.invariants.discovery import TargetRef, resolve
from memspec.invariants.errors import TARGET_ERROR, SpecError, TargetError, Violation, violation_class  # noqa: F401
from memspec.invariants.guard import BUILD_SECONDS, CallGuard, Channel, StepLog, supervise
from memspec.invariants.levels import LEVELS, levels_for  # noqa: F401 - re-exported
from memspec.invariants.planning import (applicability, build_probe, close_probe, kind_of,  # noqa: F401
                                         load_machine, machine_for, make_plan)
from memspec.invariants.repro import write_repros  # noqa: F401 - re-exported

from memspec.invariants.results import (Failure, PlanInfo, PlanResult, Verdict, _last_action,  # noqa: F401
                                        _undrawn, combine, not_at_level)
from memspec.invariants.stateful import (MORE_PASSES, SHRINK_SECONDS, STEPS_PER_RULE,  # noqa: F401 - re-exported
                                         _flatten, _one_pass, build_state_machine, collect, database_key,
                                         hypothesis_settings, run_hypothesis, shrink_budget, stable_constants)
from memspec.invariants import wire as W
from memspec.invariants.wire import WireError, _literal_repr, _plain  # noqa: F401 - re-exported


def plan_in_child(ch: Channel, target: str, level: str, skip: list, *, capacity: int | None, timeout: float,
                  build_timeout: float | None, machine: str | None, only: list | None = None) -> list:
    """In a supervised child: resolve ``target``, build it once, choose the
    levels (its mutant's, or those of its kind), plan each not in ``skip``
    (and in ``only`` when given); each call guarded, an error said on
    ``ch``.  The one place a child plans a target (``conform``, ``fuzz``)."""
    guard = CallGuard(timeout, "direct")
    guard.blame, guard.what = TARGET_ERROR, f"importing the target {target!r}"
    guard.limit = build_timeout or max(timeout, BUILD_SECONDS)   # imports and a first factory call
    tref, err = guard.call(resolve, target)
    if err is None and tref.factory is None:
        err = LookupError(tref.error or "unavailable")
    if err is not None:
        ch.send(W.Error(level, f"{type(err).__name__}: {err}").to_wire())
        return []
    guard.what = f"building the target {target!r} (its factory)"
    probe, err = guard.call(build_probe, tref, capacity)
    if err is not None:
        msg = str(err) if isinstance(err, TargetError) else \
            f"target {tref.name!r} factory raised {type(err).__module__}.{type(err).__name__}: {err}"
        ch.send(W.Error(level, msg).to_wire())
        return []
    plans: list = []
    try:
        lv = [tref.mutant.level] if tref.mutant is not None and level == "all" else levels_for(probe.kind, level)
        if not lv:
            ch.send(W.Error(level, f"level {level!r} does not apply to a target of kind {probe.kind!r}").to_wire())
            return []
        for lvl in lv:
            if lvl in skip or (only is not None and lvl not in only):
                continue
            guard.what = f"probing the target for the {lvl} level"
            plan, err = guard.call(make_plan, tref, lvl, capacity=capacity, timeout=timeout, machine=machine,
                                   probe=probe)
            if err is not None:
                ch.send(W.Error(lvl, f"{type(err).__name__}: {err}").to_wire())
                continue
            plans.append(plan)
    finally:
        guard.what = "closing the probe instance"
        guard.call(close_probe, probe)
        guard.limit = None
    return plans


@dataclass(frozen=True)
class RunOptions:
    """How conform's child runs each plan (what :func:`conform` was asked),
    checked where it is made."""

    profile: str = "ci"
    examples: int | None = None
    steps: int | None = None
    seed: int | None = None
    db: str | None = None
    capacity: int | None = None
    until: tuple = ()
    timeout: float = 5.0
    machine: str | None = None
    shrink: bool = False
    shrink_seconds: float | None = -1
    build_timeout: float | None = None

    def __post_init__(self) -> None:
        def bad(name: str, what: str) -> None:
            raise TypeError(f"run option {name}={getattr(self, name)!r} is not {what}")

        def opt_int(name: str) -> None:
            v = getattr(self, name)
            if v is not None and (type(v) is not int):
                bad(name, "an int or None")

        def opt_num(name: str) -> None:
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                bad(name, "a number or None")

        if not isinstance(self.profile, str):
            bad("profile", "a str")
        for name in ("examples", "steps", "seed", "capacity"):
            opt_int(name)
        for name in ("db", "machine"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                bad(name, "a str or None")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not self.timeout > 0:
            bad("timeout", "a positive number")
        opt_num("shrink_seconds")
        opt_num("build_timeout")
        if not isinstance(self.shrink, bool):
            bad("shrink", "a bool")
        if not isinstance(self.until, tuple) or not all(isinstance(u, str) for u in self.until):
            bad("until", "a tuple of invariant ids")


def _child(ch: Channel, target: str, level: str, skip: list, opts: RunOptions) -> None:
    """The supervised child: probe the target once, plan each level, run it,
    and say everything on ``ch``.  Nothing it sends is code."""
    for plan in plan_in_child(ch, target, level, skip, capacity=opts.capacity, timeout=opts.timeout,
                              build_timeout=opts.build_timeout, machine=opts.machine):
        _run_child_plan(ch, plan, opts)


def plan_msg(plan: E.Plan) -> dict:
    """What a child says of a plan before running it (read by :class:`_Parent`)."""
    return W.PlanMsg.of(plan).to_wire()


def _run_child_plan(ch: Channel, plan: E.Plan, opts: RunOptions) -> None:
    ch.send(plan_msg(plan))
    last = [0.0]

    # the steps of the current example go to the shared StepLog (read by the
    # supervisor only if this process dies); the channel carries the examples'
    # starts, progress and results -- and a step only when the log is full
    log = StepLog.current
    step_wire = W.Step.wire_of

    def on_call(run: E.Run, ts: E.TraceStep | None) -> None:
        if ts is None:
            if log is not None:
                log.reset()
            ch.send(W.ExampleStart(run.capacity).to_wire())
            return
        # what the previous step answered rides with this one (the last one's answer may never come)
        msg = step_wire(ts, run.trace[-2] if len(run.trace) >= 2 else None)
        if log is None or not log.append(msg, run.plan.stats.steps):
            ch.send(msg)

    def on_step(p: E.Plan) -> None:
        now = time.perf_counter()
        if now - last[0] > 0.2:
            last[0] = now
            ch.send(W.Progress.of(p.stats).to_wire())

    plan.on_call = on_call
    plan.on_step = on_step
    plan.build_timeout = opts.build_timeout
    extra: dict = {}
    if not opts.shrink:
        from hypothesis import Phase

        extra["phases"] = [Phase.explicit, Phase.reuse, Phase.generate]
    sets = hypothesis_settings(opts.profile, examples=opts.examples, steps=opts.steps, db=opts.db,
                               seed=opts.seed, **extra)
    res = run_hypothesis(plan, sets, seed=opts.seed, shrink_seconds=opts.shrink_seconds,
                         until=frozenset(opts.until) or None)
    ch.send(W.Result(plan.level, tuple(res.errors), tuple(res.notes), plan.stats,
                     tuple(W.FailureRecord.of(f) for f in res.failures)).to_wire())


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

    def on_message(self, m: Any) -> None:
        """A message from the child, as :func:`~memspec.invariants.guard.supervise`
        parsed it: decoded (every field checked), then taken in; a malformed
        one is a harness error of the plan it came in (:meth:`malformed`)."""
        try:
            rec = W.decode(m)
        except WireError as e:
            self.malformed(e, m)
            return
        self.on_record(rec)

    def malformed(self, e: WireError, m: Any = None) -> None:
        """A message that is not what its kind says: the current plan (else
        the level the message names, else the run's) ends with a harness
        ERROR; the messages after it are read as usual."""
        r = self.current
        if r is None:
            lvl = m.get("level") if isinstance(m, dict) else None
            r = PlanResult(self.target, lvl if type(lvl) is str and len(lvl) <= 100 else self.level, None)
        r.errors.append(str(e))
        self.results.append(r)
        self.done.append(r.level)
        if self.current is None and r.level == self.level:
            self.stopped = True
        self.current = None

    def on_record(self, rec: W.Message) -> None:
        if isinstance(rec, W.Step):   # a step the child's StepLog had no room for
            self.trace.append(rec)
            if self.current is not None:   # counted here too: a child that dies sends no result
                st = self.current.plan.stats
                st.steps += 1
                st.actions[rec.action] += 1
        elif isinstance(rec, W.ExampleStart):
            self.trace = []
            self.capacity = rec.capacity if rec.capacity is not None and rec.capacity > 0 else None
            if self.current is not None:
                self.current.plan.stats.examples += 1
        elif isinstance(rec, W.Progress):
            if self.current is None:
                return
            st = self.current.plan.stats
            st.examples, st.steps, st.failures_seen = rec.examples, rec.steps, rec.failing
            st.actions = Counter(rec.actions)
            if self.on_step is not None:
                self.on_step(self.current.plan)
        elif isinstance(rec, W.PlanMsg):
            info = rec.to_info(self.target, self.mutant)
            self.current = PlanResult(self.target, rec.level, info, min_accepted=self.min_accepted)
            self.trace = []
            self._t0 = time.perf_counter()
            if self.on_plan is not None:
                self.on_plan(info)
        elif isinstance(rec, W.Result):
            r = self.current
            if r is None:
                return
            W.stats_into(r.plan.stats, rec.stats)
            r.seconds = r.plan.stats.seconds
            r.errors += list(rec.errors)
            r.notes += list(rec.notes)
            r.failures += [f.to_failure(self.target, r.level) for f in rec.failures]
            self.results.append(r)
            self.done.append(r.level)
            self.current = None
        elif isinstance(rec, W.Error):
            r = PlanResult(self.target, rec.level, None)
            r.errors.append(rec.error)
            self.results.append(r)
            self.done.append(r.level)
            if self.current is None and r.level == self.level:
                self.stopped = True
        elif isinstance(rec, W.Fatal):
            r = self.current or PlanResult(self.target, self.level, None)
            r.errors.append(f"harness error: {rec.error}")
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
        steps: list = []
        bad: WireError | None = None
        for m in end.log:   # read only now (the child wrote them, unchecked, one per step)
            try:
                steps.append(W.Step.from_wire(m))
            except WireError as e:
                bad = e
                break
        if bad is None:
            steps += self.trace
        if self.current is not None:
            st = self.current.plan.stats
            st.steps = max(st.steps, end.log_steps if type(end.log_steps) is int else 0)
        try:
            trace = W.steps_to_trace(steps)
        except WireError as e:
            bad, trace = bad or e, []
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
        if bad is not None:   # the steps are reported as far as they could be read
            r.errors.append(str(bad))
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
            on_plan: Callable | None = None, machine: str | None = None, shrink: bool = False,
            shrink_seconds: float | None = -1, build_timeout: float | None = None,
            min_accepted: int = V.MIN_ACCEPTED, until: tuple[str, ...] | None = None) -> list[PlanResult]:
    """Run every applicable level of ``target`` under supervision; one
    :class:`PlanResult` per level.  Never raises for what the target does.
    ``timeout`` bounds each call into the target; ``build_timeout`` its
    import and factory (default: the larger of ``timeout`` and
    :data:`~memspec.invariants.guard.BUILD_SECONDS`).  ``min_accepted``:
    accepting steps each declaring action needs for a PASS (fewer:
    UNTESTED, see :mod:`~memspec.invariants.verdicts`).  ``until``:
    invariant ids whose first failure ends a level's run (no further
    masked pass; see :func:`~memspec.invariants.stateful.run_hypothesis`).

    ``shrink``: also run Hypothesis's shrink phase, bounded by
    :data:`~memspec.invariants.stateful.SHRINKS` successful shrinks.  Off by
    default: every failure is minimized by
    :func:`~memspec.invariants.blame.minimize` (steps, then arguments;
    bounded by a replay count), and on the shipped mutant catalog
    Hypothesis's shrink added nothing for its cost (46 mutants: median
    reproduction 2 steps without it, 2.5 with it; 44 s of CPU without it,
    634 s with it; every blame the same).  Both bounds are counts, so a
    run's reproductions and blame do not depend on the machine's load."""
    opts = RunOptions(profile, examples, steps, seed, db, capacity, tuple(until or ()), timeout, machine, shrink,
                      shrink_seconds, build_timeout)
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
        for plan in plan_in_child(ch, target, level, [], capacity=None, timeout=timeout, build_timeout=None,
                                  machine=machine):
            ch.send(plan_msg(plan))

    end = supervise(work, timeout=timeout)
    out = []
    for m in end.messages:
        try:
            rec = W.decode(m)
        except WireError as e:
            lvl = m.get("level")
            out.append((lvl if type(lvl) is str and len(lvl) <= 100 else level, [], str(e)))
            continue
        if isinstance(rec, W.PlanMsg):
            out.append((rec.level, list(rec.invariants), None))
        elif isinstance(rec, W.Error):
            out.append((rec.level, [], rec.error))
    if end.death is not None:
        out.append((level, [], f"target {target!r}: {end.death}"))
    return out


def _kind_of(tref: TargetRef, capacity: int | None) -> str:
    """The kind of ``tref``'s instances (one instance built and closed here)."""
    return kind_of(tref, capacity)

