"""Fuzzing one plan, in a supervised child: Hypothesis rounds sized from
the measured rate, or seeded random walks, within a time budget (fuzzing is
budgeted in time by design), one shrink budget for all failures.  Part of
:mod:`memspec.invariants.fuzz` (its workers and shrinker call these)."""

from __future__ import annotations

import time
from typing import Any, Callable

from memspec.invariants import runner
from memspec.invariants import wire
from memspec.invariants.fuzz_db import open_database
from memspec.invariants.guard import CallGuard

#: an upper bound on one Hypothesis round, in seconds (also capped at budget/10)
ROUND_SECONDS = 10.0
#: seconds of shrinking for one failure (all failures of a run share it)
SHRINK_SECONDS = 30.0
#: steps a replayed walk counterexample may take (its own "stop" draws end it first)
REPLAY_MAX_STEPS = 10_000


def round_cap(budget: float) -> float:
    """The longest Hypothesis round: min(ROUND_SECONDS, budget/10), at least 1 s."""
    return min(ROUND_SECONDS, max(1.0, budget / 10))


# --------------------------------------------------------------------------
# Public names for what the CLI layer shows (it imports no private name; memspec.invariants.fuzz re-exports them)
# --------------------------------------------------------------------------

def flatten(e: BaseException) -> list:
    """The leaf exceptions of ``e`` (an exception group flattened), each with its flaky flag."""
    return runner._flatten(e)


def dedupe(failures: list) -> list:
    """One failure per rule broken at one call (the shorter reproduction)."""
    return runner._dedupe(failures)


def replay_steps(plan: Any, guard: CallGuard, capacity: int | None, steps: list) -> Any:
    """Replay ``[(action, choices)]`` on a fresh target: the violation, or None."""
    return runner._replay_steps(plan, guard, capacity, steps)


trace_msg = wire.trace_to_wire
trace_from = wire.trace_from_wire


class ShrinkBudget:
    """The seconds of shrinking left to this run (one budget for all failures)."""

    def __init__(self, seconds: float) -> None:
        self.left = seconds
        self.used = 0.0

    def charge(self, seconds: float) -> None:
        self.left -= seconds
        self.used += seconds

    def take(self):
        """A context that bounds Hypothesis's shrinking by what is left and
        charges the time spent."""
        me = self

        class _Ctx:
            def __enter__(self_inner):
                self_inner.t0 = time.perf_counter()
                self_inner.inner = runner.shrink_budget(max(me.left, 0.0))
                self_inner.inner.__enter__()
                return self_inner

            def __exit__(self_inner, *exc):
                self_inner.inner.__exit__(*exc)
                me.charge(time.perf_counter() - self_inner.t0)
                return False

        return _Ctx()


def _round_settings(opts, seed: int, examples: int, *, first: bool, shrink: bool, database):
    """Settings of one Hypothesis round: the ``fuzz`` profile, the shared
    database; the reuse phase (replay of saved failures) only in the first
    round, the shrink phase only when this process may shrink."""
    from hypothesis import Phase, settings

    phases = [p for p in settings.get_profile("fuzz").phases
              if (first or p is not Phase.reuse) and (shrink or p not in (Phase.shrink, Phase.explain))]
    return runner.hypothesis_settings("fuzz", examples=examples, steps=opts.steps, db=None, seed=seed,
                                      database=database, phases=phases)


def _noop(*_a, **_kw) -> None:
    return None


def fuzz_hypothesis(plan, seconds: float, opts, note: Callable = _noop, *, shrink: ShrinkBudget | None = None,
                    seed: int | None = None, stop=None, database=None, may_shrink: bool = True,
                    on_found: Callable = _noop) -> list:
    """Rounds of fresh seeds until ``seconds`` are up (or ``stop()``).

    A round's size comes from the time per example measured so far: at most
    :func:`round_cap` seconds of examples, never more than what is left; the
    first round is 2 examples (it also replays the database).  Each new
    failure goes to ``on_found`` as soon as its round ends."""
    shrink = shrink or ShrinkBudget(opts.shrink_seconds)
    if database is None:
        database = open_database(opts.db, opts.db_readonly_github, opts.db_artifact)
    base = opts.seed if seed is None else seed
    cap = round_cap(opts.seconds)
    end = time.perf_counter() + seconds
    out = []
    rnd = 0
    seen: set[str] = set()
    per_example: float | None = None
    while time.perf_counter() < end and not (stop and stop()):
        left = end - time.perf_counter()
        examples = 2 if per_example is None else max(1, min(100_000, int(min(left, cap) / per_example)))
        sets = _round_settings(opts, base + rnd, examples, first=rnd == 0, shrink=may_shrink, database=database)
        ex0 = plan.stats.examples
        t0 = time.perf_counter()
        res = runner.run_hypothesis(plan, sets, seed=base + rnd, shrink_seconds=max(shrink.left, 0.0))
        if may_shrink and res.failures:  # the round shrank: charge it all to the shrink budget (conservative)
            shrink.charge(time.perf_counter() - t0)
        ran = plan.stats.examples - ex0
        if ran > 0 and not res.failures:
            per_example = max((time.perf_counter() - t0) / ran, 1e-4)
        res.failures = [f for f in res.failures if f.invariant not in seen]
        seen.update(f.invariant for f in res.failures)
        for f in res.failures:
            on_found(f, None)
            note(f"{plan.level} {f.invariant} [{f.cause}] {f.reason[:90]}")
        out.append(res)
        rnd += 1
        if res.errors or (res.failures and not may_shrink):
            break
    return out


class _Stop(Exception):
    """Another worker found a failure: stop between runs."""


def fuzz_walk(plan, seconds: float, opts, note: Callable = _noop, *, shrink: ShrinkBudget | None = None,
              seed: int | None = None, stop=None, on_failure=None, database=None,
              on_found: Callable = _noop) -> list:
    """Walks until ``seconds`` are up.  With ``on_failure`` None each new
    failure is shrunk (within the shrink budget) and the walk goes on with
    the next seed; otherwise (a worker of several) the first failure goes to
    ``on_failure`` and the walk stops.  Every failure goes to ``on_found``
    first, unshrunk."""
    from memspec.invariants import walk

    shrink = shrink or ShrinkBudget(opts.shrink_seconds)
    res = runner.PlanResult(plan.target, plan.level, plan)
    db = database if database is not None else open_database(opts.db, opts.db_readonly_github, opts.db_artifact)
    end = time.perf_counter() + seconds
    seed = opts.seed if seed is None else seed
    seen: set[str] = set()

    def progress(_w):
        if stop is not None and stop():
            raise _Stop()

    if on_failure is None:   # with several workers, worker 0 replays the database before fuzzing
        for f in replay_walk_database(plan, db):
            seen.add(f.invariant)
            on_found(f, None)
            res.failures.append(f)
            note(f"{plan.level} {f.invariant} [{f.cause}] {f.reason[:90]} (replayed from the database)")
    while time.perf_counter() < end and not (stop and stop()):
        try:
            w = walk.walk(plan, seconds=end - time.perf_counter(), seed=seed, run_length=opts.steps or 200,
                          on_progress=progress)
        except _Stop:
            break
        res.errors += w.errors
        for wf in w.failures:
            if wf.violation.invariant in seen:
                continue
            seen.add(wf.violation.invariant)
            v = wf.violation
            on_found(runner.Failure(plan.target, plan.level, v.invariant, v.cause, v.reason, v.trace, wf.steps),
                     (wf.seed, wf.run_index))
            if on_failure is not None:
                on_failure(wf)
                continue
            res.failures.append(_shrink_walk_failure(plan, wf, db, shrink))
            note(f"{plan.level} {v.invariant} [{v.cause}] {v.reason[:90]} (walk seed {wf.seed} run {wf.run_index})")
        if w.errors or not w.failures or on_failure is not None:
            break
        seed += 1  # continue with the next seed after a failure
    return [res]


def replay_walk_database(plan, db) -> list:
    """The walk counterexamples ``db`` holds for ``plan`` (shrunk by an
    earlier walk here or on another machine -- a campaign's shared database),
    replayed first, as Hypothesis mode's reuse phase replays its own: one
    Failure per invariant that still fails.  Nothing is generated and
    nothing shrunk again."""
    from hypothesis import HealthCheck, Phase, Verbosity, settings

    from memspec.invariants import harness as H
    from memspec.invariants import walk

    if db is None:
        return []
    key = runner.database_key(plan, "walk")
    try:
        if next(iter(db.fetch(key)), None) is None:
            return []   # nothing saved: no Hypothesis run at all
    except Exception:  # noqa: BLE001 - an unreadable (e.g. unreachable GitHub) database replays nothing
        return []
    guard = H.CallGuard(plan.timeout, plan.guard_mode)
    test = walk.shrink_test(plan, REPLAY_MAX_STEPS, guard)
    test._hypothesis_internal_database_key = key
    sets = settings(database=db, max_examples=1, deadline=None, verbosity=Verbosity.quiet, phases=[Phase.reuse],
                    report_multiple_bugs=True, derandomize=False, suppress_health_check=list(HealthCheck))
    try:
        settings(sets)(test)()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - what the target did is a result
        out: dict = {}
        for v, _flaky in flatten(e):
            if isinstance(v, H.Violation) and v.invariant not in out:
                out[v.invariant] = runner.Failure(plan.target, plan.level, v.invariant, v.cause, v.reason, v.trace,
                                                  None)
        return list(out.values())
    return []


def _shrink_walk_failure(plan, wf, db, shrink: ShrinkBudget):
    from memspec.invariants import walk

    v = None
    if shrink.left > 0:
        with shrink.take():
            v = walk.shrink(plan, wf, db=db)
    v = v or wf.violation
    return runner.Failure(plan.target, plan.level, v.invariant, v.cause, v.reason, v.trace, wf.steps)


def _failure_msg(f) -> dict:
    """What a child sends of a failure besides its invariant, cause and
    reason: its steps (action, arguments as a literal, choices, outcome,
    bound ids), the example's device capacity, the steps to detection and
    the consequences."""
    from memspec.invariants import harness as H

    trace = f.trace if all(isinstance(ts, H.TraceStep) for ts in f.trace) else []
    return {"trace": trace_msg(trace), "capacity": f.capacity, "detected": f.steps_to_detection,
            "consequences": [str(c) for c in f.consequences],
            "masks": [list(k) for k in (getattr(f, "diagnosed_masks", ()) or ())]}


def _worker_failure(plan, inv: str, cause: str, reason: str, sent) -> "runner.Failure":
    """A failure a worker found (or the steps a dead worker left), replayed
    here on a fresh target from its steps, arguments drawn again by the spec
    from the recorded choices: a failure again is one like any other,
    minimized and diagnosed here; otherwise it is reported as the worker saw
    it, with the worker's steps, marked not reproduced."""
    from memspec.invariants import harness as H

    sent = sent if isinstance(sent, dict) else {}
    trace = trace_from(sent.get("trace") or [])
    cap = sent.get("capacity") if type(sent.get("capacity")) is int else None
    det = sent.get("detected") if type(sent.get("detected")) is int else None
    cons = [str(c) for c in sent.get("consequences") or []]
    on_replayed = sent.get("on_replayed")
    # the checks of the worker's other failures, masked there while this one was shrunk and diagnosed
    masks = frozenset((m[0] if isinstance(m[0], str) else None, m[1]) for m in sent.get("masks") or []
                      if isinstance(m, list) and len(m) == 2 and isinstance(m[1], str))
    if trace:
        guard = H.CallGuard(plan.timeout, plan.guard_mode)
        saved = (plan.stats, plan.on_call, plan.on_step, plan.masks)
        plan.stats, plan.on_call, plan.on_step, plan.masks = H.Stats(), None, None, masks
        try:
            v = replay_steps(plan, guard, cap, [(ts.action, list(ts.choices)) for ts in trace])
        except Exception:  # noqa: BLE001 - steps the spec cannot replay here: not reproduced
            v = None
        finally:
            plan.stats, plan.on_call, plan.on_step = saved[:3]
        try:
            if v is not None:
                f = runner.Failure(plan.target, plan.level, v.invariant, v.cause, v.reason, list(v.trace), det,
                                   capacity=cap, consequences=cons, check=getattr(v, "check", None),
                                   key=getattr(v, "key", None))
                if callable(on_replayed):   # said before the minimizer replays it again (it may not come back)
                    on_replayed(f)
                return runner.diagnose(plan, runner.minimize(plan, f))
        finally:
            plan.masks = saved[3]
    return runner.Failure(plan.target, plan.level, inv, cause,
                          f"{reason} (not reproduced on replay: nondeterministic target?)", trace, det,
                          capacity=cap, consequences=cons)
