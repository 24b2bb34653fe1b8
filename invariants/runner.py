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
from memspec.invariants.wire import (_int, _literal_repr, _plain, _stats_into, _stats_msg,  # noqa: F401
                                     _step_msg, _trace_from, _trace_msg)


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
        ch.send({"t": "error", "level": level, "error": f"{type(err).__name__}: {err}"})
        return []
    guard.what = f"building the target {target!r} (its factory)"
    probe, err = guard.call(build_probe, tref, capacity)
    if err is not None:
        msg = str(err) if isinstance(err, TargetError) else \
            f"target {tref.name!r} factory raised {type(err).__module__}.{type(err).__name__}: {err}"
        ch.send({"t": "error", "level": level, "error": msg})
        return []
    plans: list = []
    try:
        lv = [tref.mutant.level] if tref.mutant is not None and level == "all" else levels_for(probe.kind, level)
        if not lv:
            ch.send({"t": "error", "level": level,
                     "error": f"level {level!r} does not apply to a target of kind {probe.kind!r}"})
            return []
        for lvl in lv:
            if lvl in skip or (only is not None and lvl not in only):
                continue
            guard.what = f"probing the target for the {lvl} level"
            plan, err = guard.call(make_plan, tref, lvl, capacity=capacity, timeout=timeout, machine=machine,
                                   probe=probe)
            if err is not None:
                ch.send({"t": "error", "level": lvl, "error": f"{type(err).__name__}: {err}"})
                continue
            plans.append(plan)
    finally:
        guard.what = "closing the probe instance"
        guard.call(close_probe, probe)
        guard.limit = None
    return plans


def _child(ch: Channel, target: str, level: str, skip: list, opts: dict) -> None:
    """The supervised child: probe the target once, plan each level, run it,
    and say everything on ``ch``.  Nothing it sends is code."""
    for plan in plan_in_child(ch, target, level, skip, capacity=opts["capacity"], timeout=opts["timeout"],
                              build_timeout=opts["build_timeout"], machine=opts["machine"]):
        _run_child_plan(ch, plan, opts)


def plan_msg(plan: E.Plan) -> dict:
    """What a child says of a plan before running it (read by :class:`_Parent`)."""
    return {"t": "plan", "level": plan.level, "target": plan.target,
            "invariants": [[inv.id, inv.title] for inv in plan.machine.invariants], "na": plan.na,
            "capabilities": plan.capabilities, "actions": [a.name for a in plan.actions],
            "declares": plan.declares, "undrawn": _undrawn(plan),
            "absent": sorted(not_at_level(plan)), "witnesses": plan.witnesses,
            "env": dict(getattr(plan.factory, "memspec_env", None) or {}),
            "timeout": plan.timeout, "factory_kwargs": plan.factory_kwargs, "machine_ref": plan.machine_ref}


def _run_child_plan(ch: Channel, plan: E.Plan, opts: dict) -> None:
    ch.send(plan_msg(plan))
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
    res = run_hypothesis(plan, sets, seed=opts["seed"], shrink_seconds=opts["shrink_seconds"],
                         until=frozenset(opts.get("until") or ()) or None)
    ch.send({"t": "result", "level": plan.level, "errors": res.errors, "notes": list(res.notes),
             "stats": _stats_msg(plan.stats),
             "failures": [{"invariant": f.invariant, "cause": f.cause, "reason": f.reason,
                           "trace": _trace_msg(f.trace), "std": f.steps_to_detection, "flaky": f.flaky,
                           "cap": f.capacity, "also": [str(c) for c in f.consequences],
                           "check": f.check, "key": list(f.key) if f.key is not None else None,
                           "masks": [list(k) for k in f.needs_masks], "likely": f.likely_cause}
                          for f in res.failures]})


def _cap(v: Any) -> int | None:
    """A device capacity the (untrusted) child named: a positive int, or None."""
    return v if type(v) is int and v > 0 else None


def _str(v: Any) -> str:
    return v if isinstance(v, str) else repr(v)


def _key(v: Any) -> tuple | None:
    """A failure's mask key the (untrusted) child named: ``(action or None, check id)``."""
    if isinstance(v, list) and len(v) == 2 and (v[0] is None or isinstance(v[0], str)) and isinstance(v[1], str):
        return (v[0], v[1])
    return None


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
            env = m.get("env")
            if isinstance(env, dict):
                info.env = {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)}
            wit = m.get("witnesses")
            if isinstance(wit, dict):
                info.witnesses = {_str(k): [[_str(x) for x in w] for w in v if isinstance(w, list) and len(w) == 3]
                                  for k, v in wit.items() if isinstance(v, list)}
            absent = m.get("absent")
            if isinstance(absent, list):
                info.absent = [_str(a) for a in absent]
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
            r.notes += [_str(e) for e in m.get("notes") or [] if isinstance(m.get("notes"), list)]
            for f in m.get("failures") or []:
                if isinstance(f, dict):
                    r.failures.append(Failure(self.target, r.level, _str(f.get("invariant")), _str(f.get("cause")),
                                              _str(f.get("reason")), _trace_from(f.get("trace") or []),
                                              f.get("std") if isinstance(f.get("std"), int) else None,
                                              flaky=bool(f.get("flaky")), capacity=_cap(f.get("cap")),
                                              consequences=[_str(c) for c in f.get("also") or []
                                                            if isinstance(f.get("also"), list)],
                                              check=f.get("check") if isinstance(f.get("check"), str) else None,
                                              key=_key(f.get("key")),
                                              likely_cause=f.get("likely") if isinstance(f.get("likely"), str)
                                              else None,
                                              needs_masks=tuple(k for k in map(_key, f.get("masks") or [])
                                                                if k is not None)
                                              if isinstance(f.get("masks"), list) else ()))
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
    opts = {"profile": profile, "examples": examples, "steps": steps, "seed": seed, "db": db, "capacity": capacity,
            "until": list(until or ()), "timeout": timeout, "machine": machine, "shrink": shrink, "shrink_seconds": shrink_seconds,
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
        for plan in plan_in_child(ch, target, level, [], capacity=None, timeout=timeout, build_timeout=None,
                                  machine=machine):
            ch.send({"t": "plan", "level": plan.level,
                     "invariants": [[inv.id, inv.title] for inv in plan.machine.invariants]})

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

