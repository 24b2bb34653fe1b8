"""Time-budgeted fuzzing under supervision: the engine behind ``memspec fuzz``.

Every piece of the target's code -- its import, its factory, its steps, the
replays that shrink its failures -- runs in a child forked by
:func:`~memspec.invariants.guard.supervise`, as in ``memspec conform``; this
process only reads what the children say (conform's messages, read by
:class:`~memspec.invariants.runner._Parent`, plus the few below).  A target
that exits, raises ``BaseException``, crashes, hangs (also in C) or stops
its own process, in its factory or in a step, ends its child and is
reported -- a FAIL with the steps so far (the child's StepLog), or an ERROR
-- never a dead, endless or green run.

* **workers** (``jobs`` of them, each its own supervised child, seeds
  ``seed + w * SEED_STRIDE``): resolve the target, plan each level, fuzz it
  (Hypothesis rounds or random walks).  A failure is sent as soon as it is
  found (``found``: its steps, its walk seed and run), so a worker that dies
  afterwards loses nothing.  With one job the worker shrinks its failures
  itself; with more, the first failure stops them all (a flag in shared
  memory) and nobody shrinks in a worker.
* **the shrinker** (a supervised child, after the workers): replays what the
  workers found and could not shrink -- the shared database (Hypothesis mode),
  a walk's seed and run, a dead worker's last steps -- shrinks and diagnoses
  it, and sends each result as soon as it has one.  A replay that kills the
  shrinker keeps the worker's own report of that failure; the next one goes
  on in a fresh shrinker.

Each child is killed at a hard deadline (:func:`hard_bound`): the budget,
plus the shrink time, plus one unit of work, plus a build allowance, plus
:data:`HARD_GRACE`.
"""

from __future__ import annotations

import threading
import time
from time import monotonic as _monotonic   # the progress throttle's own clock (tests replace ``time``)
from dataclasses import dataclass, field
from typing import Any, Callable

from memspec.invariants import runner
from memspec.invariants import wire as W
from memspec.invariants.discovery import DEFAULT_TARGET
from memspec.invariants.guard import BUILD_SECONDS, StepLog, supervise
from memspec.invariants.fuzz_db import _Counter, lost_saves, open_database  # noqa: F401 - re-exported
from memspec.invariants.fuzz_rounds import (REPLAY_MAX_STEPS, ROUND_SECONDS, SHRINK_SECONDS,  # noqa: F401
                                            ShrinkBudget, _failure_msg, _noop, _round_settings,
                                            _shrink_walk_failure, _worker_failure, dedupe, flatten,
                                            fuzz_hypothesis, fuzz_walk, replay_steps, replay_walk_database,
                                            round_cap, trace_from, trace_msg)

#: seed distance between two workers' seed ranges
SEED_STRIDE = 1_000_003
#: seconds a child may run past its stated bound before it is killed (slack for a loaded machine)
HARD_GRACE = 30.0


@dataclass
class FuzzOptions:
    """What ``memspec fuzz`` was asked (the names of its flags)."""

    target: str = DEFAULT_TARGET
    mode: str = "hypothesis"
    level: str = "all"
    seconds: float = 60.0
    seed: int = 0
    jobs: int = 1
    db: str | None = "memspec-out/db"
    db_readonly_github: str | None = None
    db_artifact: str = "hypothesis-example-db"
    steps: int | None = None
    timeout: float = 5.0
    shrink_seconds: float = SHRINK_SECONDS
    capacity: int | None = None
    out: str | None = "memspec-out/repro"
    machine: str | None = None
    build_timeout: float | None = None
    #: end at the first failure (shrunk, with its reproduction) instead of fuzzing on to the deadline;
    #: with several jobs the first failure already stops them all
    until_failure: bool = False


@dataclass
class FuzzRun:
    """What a run found and what it cost."""

    results: list = field(default_factory=list)   # one PlanResult per level (failures, errors)
    steps: int = 0
    workers: list = field(default_factory=list)   # per worker: seed, steps, seconds, ready_s, cpu figures
    fuzz_seconds: float = 0.0
    fuzz_cpu: float | None = None
    parent_cpu: float | None = None
    parent_setup_cpu: float | None = None
    shrink_used: float = 0.0


def stated_bound(opts: FuzzOptions) -> float:
    """The bound ``--help`` states: budget + one shrink + one round in flight."""
    return opts.seconds + opts.shrink_seconds + round_cap(opts.seconds)


def hard_bound(opts: FuzzOptions) -> float:
    """Seconds after its start at which a child is killed, whatever it is doing:
    the stated bound plus the target's build allowance and one call's timeout
    plus :data:`HARD_GRACE`."""
    build = opts.build_timeout or max(opts.timeout, BUILD_SECONDS)
    return stated_bound(opts) + build + opts.timeout + HARD_GRACE






# --------------------------------------------------------------------------
# The children: what they say
# --------------------------------------------------------------------------

def _fail_dict(f) -> dict:
    """A failure as conform's child sends it (one record: :class:`~memspec.invariants.wire.FailureRecord`)."""
    return W.failure_to_wire(f)


def _fail_from(target: str, level: str, d: Any) -> "runner.Failure":
    """A failure from a child's (untrusted) message: every field checked (WireError)."""
    return W.failure_from_wire(target, level, d)


def _plan_msg(plan) -> dict:
    return runner.plan_msg(plan)


def _plans(ch, opts: FuzzOptions, skip: list, only: list | None = None) -> list:
    """Resolve the target, build it once, choose the levels, plan each: in
    this (supervised) child, as conform's child does (:func:`~memspec.invariants.runner.plan_in_child`)."""
    return runner.plan_in_child(ch, opts.target, opts.level, skip, capacity=opts.capacity, timeout=opts.timeout,
                                build_timeout=opts.build_timeout, machine=opts.machine, only=only)


def _hook(ch, plan) -> None:
    """conform's per-step protocol: the example's steps to the StepLog (read
    only if this child dies), progress on the channel."""
    log = StepLog.current
    last = [0.0]

    last_run: list = [None]
    sent = [0]
    step_wire = W.Step.wire_of

    def on_call(run, ts) -> None:
        if ts is None:
            before = last_run[0]
            firsts = len(plan.stats.first_failure_steps)
            if before is not None and before.failed and before.trace and firsts > sent[0]:
                sent[0] = firsts   # the first example of each invariant that failed (not every shrink step)
                # the example before failed: its steps reach the parent now, before the worker
                # goes on (a target that kills it next must not take the finding with it)
                ch.send(W.FailedExample(plan.level, tuple(before.trace), before.capacity).to_wire())
            last_run[0] = run
            if log is not None:
                log.reset()
            ch.send(W.ExampleStart(run.capacity).to_wire())
            return
        msg = step_wire(ts, run.trace[-2] if len(run.trace) >= 2 else None)
        if log is None or not log.append(msg, run.plan.stats.steps):
            ch.send(msg)

    def on_step(p) -> None:
        now = _monotonic()
        if now - last[0] > 0.25:
            last[0] = now
            ch.send(W.Progress.of(p.stats).to_wire())

    plan.on_call, plan.on_step = on_call, on_step


def _worker(ch, opts: FuzzOptions, w: int, skip: list, stop_flag: _Counter, seconds: float, t_fork: float) -> None:
    """One worker (a supervised child): plan, then fuzz each level with its
    own seed range for ``seconds`` from the end of its start."""
    c_start = time.process_time()
    ch.send(W.Hello().to_wire())
    plans = _plans(ch, opts, skip)
    if not plans:
        return
    ready_s, start_cpu = time.perf_counter() - t_fork, time.process_time() - c_start
    one = opts.jobs == 1
    seed = opts.seed + w * SEED_STRIDE
    halt = opts.until_failure or not one   # whether a failure found stops this worker's fuzzing
    database = open_database(opts.db, opts.db_readonly_github, opts.db_artifact)
    shrink = ShrinkBudget(opts.shrink_seconds)
    deadline = time.perf_counter() + seconds
    fuzz_cpu = 0.0

    def stop() -> bool:
        return stop_flag.is_set() and halt

    def note(text: str) -> None:
        ch.send(W.Note(text).to_wire())

    try:
        for i, plan in enumerate(plans):
            share = (deadline - time.perf_counter()) / (len(plans) - i)
            if share <= 0 or stop():
                break
            ch.send(_plan_msg(plan))
            _hook(ch, plan)
            res = runner.PlanResult(plan.target, plan.level, plan)

            def found(f, walk_at, lvl=plan.level) -> None:
                ch.send(W.Found(lvl, W.FailureRecord.of(f), tuple(walk_at) if walk_at else None).to_wire())
                if one and opts.until_failure:
                    stop_flag.set()   # the one worker shrinks it, then stops (fuzz_walk / the rounds read stop())

            c0 = time.process_time()
            try:
                if opts.mode == "walk":
                    if w == 0 and not one:   # the database's walk counterexamples, once, by one worker
                        for f in replay_walk_database(plan, database):
                            stop_flag.set()
                            ch.send(W.Found(plan.level, W.FailureRecord.of(f), None, True).to_wire())
                    rs = [] if stop() else fuzz_walk(
                        plan, share, opts, note, shrink=shrink, seed=seed, stop=stop, database=database,
                        on_failure=None if one else (lambda wf: stop_flag.set()), on_found=found)
                else:
                    rs = fuzz_hypothesis(plan, share, opts, note, shrink=shrink, seed=seed, stop=stop,
                                         database=database, may_shrink=one, on_found=found)
                    if not one and any(r.failures for r in rs):
                        stop_flag.set()
            except Exception as e:  # noqa: BLE001 - the engine's own error: reported, the level ends
                rs = []
                res.errors.append(f"{type(e).__name__}: {e}")
            fuzz_cpu += time.process_time() - c0
            for r in rs:
                res.failures += r.failures
                res.errors += r.errors
                res.notes += list(getattr(r, "notes", []) or [])
            plan.on_call = plan.on_step = None
            ch.send(W.Result(plan.level, tuple(res.errors), tuple(res.notes), plan.stats,
                             tuple(W.FailureRecord.of(f) for f in res.failures), one).to_wire())
    finally:
        ch.send(W.WorkerStats(float(ready_s), float(start_cpu), float(fuzz_cpu),
                              float(time.process_time() - c_start), float(shrink.used)).to_wire())


def _shrinker(ch, opts: FuzzOptions, tasks: list) -> None:
    """The shrinker (a supervised child): replay and shrink what the workers
    found.  ``tasks``: ``[index, level, kind, payload]``; kind ``hyp-db``
    (replay the shared database), ``walk`` (a walk's seed and run), ``db``
    (the walk database), ``steps`` (a failure's or a dead worker's steps).
    Each result is sent as soon as it is known (``shrunk``), a replayed
    failure also before it is minimized (``replayed``)."""
    from hypothesis import Phase

    from memspec.invariants import harness as H
    from memspec.invariants import walk

    ch.send(W.Hello().to_wire())
    levels = sorted({t[1] for t in tasks})
    plans = {p.level: p for p in _plans(ch, opts, [], only=levels)}
    database = open_database(opts.db, opts.db_readonly_github, opts.db_artifact)
    shrink = ShrinkBudget(opts.shrink_seconds)
    got: dict = {}   # level -> invariants already reported
    for index, lvl, kind, payload in tasks:
        plan = plans.get(lvl)
        ch.send(W.Task(index).to_wire())
        if plan is None:
            continue
        said = got.setdefault(lvl, set())

        def send(f, what=W.Shrunk, index=index, lvl=lvl):
            ch.send(what(index, lvl, W.FailureRecord.of(f)).to_wire())

        if kind == "hyp-db":
            sets = runner.hypothesis_settings("fuzz", examples=1, steps=opts.steps, db=None, database=database,
                                              phases=[Phase.reuse, Phase.shrink])
            with shrink.take():
                res = runner.run_hypothesis(plan, sets, shrink_seconds=max(shrink.left, 0.0))
            for f in dedupe(res.failures):
                if f.invariant not in said:
                    said.add(f.invariant)
                    send(f)
        elif kind == "db":
            for f in replay_walk_database(plan, database):
                if f.invariant not in said:
                    said.add(f.invariant)
                    send(f)
        elif kind == "walk":
            inv, seed, run_index, steps = payload
            if inv in said:
                continue
            guard = H.CallGuard(plan.timeout, plan.guard_mode)
            v, choices = walk.walk_once(plan, walk.run_seed(seed, run_index), opts.steps or 200, guard)
            if v is not None:
                said.add(v.invariant)
                send(runner.Failure(plan.target, lvl, v.invariant, v.cause, v.reason, v.trace, steps), W.Replayed)
                send(_shrink_walk_failure(plan, walk.WalkFailure(v, seed, run_index, choices, steps), database,
                                          shrink))
        elif kind == "steps":
            inv, cause, reason, sent = payload
            if inv in said:
                continue
            sent = {**sent, "on_replayed": lambda f: send(f, W.Replayed) if f.invariant not in said else None}
            f = _worker_failure(plan, inv, cause, reason, sent)
            if f.invariant in said:
                continue
            if "not reproduced on replay" not in f.reason:
                said.add(f.invariant)
                send(f)


# --------------------------------------------------------------------------
# The parent: supervising the children
# --------------------------------------------------------------------------

class _Worker:
    """This process's view of one worker."""

    def __init__(self, w: int) -> None:
        self.w = w
        self.results: list = []        # PlanResults (conform's _Parent fills them)
        self.done: list = []
        self.found: list = []          # (level, Failure, walk (seed, run) or None, from the walk db)
        self.stats: dict = {}
        self.progress: dict = {}       # level -> (steps, covered actions, outcomes, actions, seconds)
        self.shrunk_levels: set = set()
        self.failed_examples: list = []  # (level, steps as sent, capacity): examples that failed, as they ended


def _supervised(work: Callable, opts: FuzzOptions, on_message: Callable, parent, seconds: float,
                on_malformed: Callable | None = None):
    """One supervised child: ``work(ch)``; its death reported by ``parent``
    (conform's ``_Parent``).  Killed at ``seconds`` past its start at the latest.
    Each message is decoded once (every field checked): ``on_message`` gets
    its record first, ``parent`` what it leaves; a malformed message is a
    harness error of ``parent``'s current plan (``_Parent.malformed``), or
    goes to ``on_malformed`` when given."""
    def handle(m: dict) -> None:
        try:
            rec = W.decode(m)
        except W.WireError as e:
            (on_malformed or parent.malformed)(e, m)
            return
        if not on_message(rec):
            parent.on_record(rec)

    end = supervise(work, timeout=opts.timeout, on_message=handle, deadline=time.monotonic() + seconds)
    if end.death is not None or parent.current is not None:
        parent.died(end)
    return end


def _drive(opts: FuzzOptions, wk: _Worker, stop_flag: _Counter, deadline: float, hard: float,
           fork_lock: threading.Lock, t_fork: float, on_progress: Callable, note: Callable) -> None:
    """Run worker ``wk`` until the budget is spent; a worker that died is
    started again for the levels it had not finished (as conform does),
    unless another worker found a failure."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0 and wk.results:
            break
        parent = runner._Parent(opts.target, opts.level, wk.results, wk.done, None, None, None)
        released = [False]

        def release() -> None:
            if not released[0]:
                released[0] = True
                fork_lock.release()

        def on_message(rec: W.Message, parent=parent) -> bool:
            if isinstance(rec, W.Hello):
                release()
                return True
            if isinstance(rec, W.Found):
                f = rec.failure.to_failure(opts.target, rec.level)
                wk.found.append((rec.level, f, rec.walk, rec.db))
                note(f"{rec.level} {f.invariant} [{f.cause}] {f.reason[:90]} (worker {wk.w})")
                return True
            if isinstance(rec, W.FailedExample):
                if rec.trace and len(wk.failed_examples) < 8:
                    wk.failed_examples.append((rec.level, list(rec.trace), rec.capacity))
                return True
            if isinstance(rec, W.Note):
                return True
            if isinstance(rec, W.WorkerStats):
                wk.stats = rec.figures()
                return True
            if isinstance(rec, W.Result):
                if rec.shrunk:
                    wk.shrunk_levels.add(rec.level)
                return False
            if isinstance(rec, W.Progress) and parent.current is not None:
                wk.progress[parent.current.level] = (
                    rec.steps, frozenset(a for a, n in rec.actions.items() if n), rec.outcomes,
                    len(parent.current.plan.actions), rec.seconds)
                on_progress(wk.w, dict(wk.progress))
            return False

        fork_lock.acquire()
        try:
            end = _supervised(lambda ch: _worker(ch, opts, wk.w, list(wk.done), stop_flag, max(left, 0.0), t_fork),
                              opts, on_message, parent, hard)
        finally:
            release()
        for r in wk.results:
            if r.plan is not None and r.level not in wk.progress:
                wk.progress[r.level] = (r.plan.stats.steps, frozenset(a for a, n in r.plan.stats.actions.items() if n),
                                        len(r.plan.stats.outcomes), len(r.plan.actions), r.plan.stats.seconds)
        if end.death is None:
            break
        if opts.jobs > 1:
            stop_flag.set()
        note(f"worker {wk.w}: {end.death}")
        if parent.stopped or stop_flag.is_set() and (opts.jobs > 1 or opts.until_failure) \
                or time.perf_counter() >= deadline:
            break


def _key(f) -> tuple:
    return (f.invariant, f.cause)


def run(opts: FuzzOptions, *, on_progress: Callable = _noop, note: Callable = _noop) -> FuzzRun:
    """(The caller registers the ``fuzz`` Hypothesis profile first: ``memspec.profiles``.)
    Fuzz ``opts.target`` for ``opts.seconds`` in ``opts.jobs`` supervised
    workers, then shrink in a supervised shrinker what they could not;
    one PlanResult per level, repros written under ``opts.out``."""
    import hypothesis.database  # noqa: F401 - once here, before the forks (every child needs it)
    import hypothesis.stateful  # noqa: F401

    from memspec.invariants import walk as _walk  # noqa: F401

    t0 = time.perf_counter()
    c0 = time.process_time()
    out = FuzzRun()
    deadline = t0 + opts.seconds
    hard = hard_bound(opts)
    stop_flag = _Counter()
    fork_lock = threading.Lock()
    workers = [_Worker(w) for w in range(opts.jobs)]
    out.parent_setup_cpu = time.process_time() - c0
    t_fork = time.perf_counter()
    c_fork = time.process_time()
    if opts.jobs == 1:
        _drive(opts, workers[0], stop_flag, deadline, hard, fork_lock, t_fork, on_progress, note)
    else:
        threads = [threading.Thread(target=_drive, args=(opts, wk, stop_flag, deadline, hard, fork_lock, t_fork,
                                                         on_progress, note), daemon=True, name=f"memspec-fuzz-{wk.w}")
                   for wk in workers]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    out.fuzz_seconds = time.perf_counter() - t0
    if opts.jobs > 1:
        out.parent_cpu = time.process_time() - c_fork
    out.steps = sum(v[0] for wk in workers for v in wk.progress.values())
    out.workers = [{"worker": wk.w, "seed": opts.seed + wk.w * SEED_STRIDE,
                    "steps": sum(v[0] for v in wk.progress.values()),
                    "seconds": sum(v[4] for v in wk.progress.values()),
                    **{k: wk.stats.get(k) for k in ("ready_s", "start_cpu_s", "cpu_s")}} for wk in workers]
    if opts.jobs == 1:
        out.fuzz_cpu = workers[0].stats.get("fuzz_cpu_s")
    else:
        cpus = [wk.stats.get("cpu_s") for wk in workers]
        out.fuzz_cpu = sum(cpus) if all(isinstance(x, (int, float)) for x in cpus) else None
    out.shrink_used = sum(wk.stats.get("shrink_s", 0.0) or 0.0 for wk in workers)
    out.results = _gather(opts, workers, note, out)
    return out


def _gather(opts: FuzzOptions, workers: list, note: Callable, out: FuzzRun) -> list:
    """One PlanResult per level: the workers' final failures, what the
    shrinker made of the rest (each distinct failure once), the errors once."""
    levels: dict = {}      # level -> PlanResult
    final: dict = {}       # level -> {key: Failure}
    tasks: list = []       # [index, level, kind, payload]
    fallback: dict = {}    # task index -> (level, Failure) kept when the shrinker gives nothing
    hyp_levels: set = set()
    for wk in workers:
        for r in wk.results:
            agg = levels.get(r.level)
            if agg is None:
                agg = levels[r.level] = runner.PlanResult(opts.target, r.level, r.plan)
            elif agg.plan is None and r.plan is not None:
                agg.plan = r.plan
            agg.errors += r.errors
            agg.notes += [n for n in r.notes if n not in agg.notes]
            fin = final.setdefault(r.level, {})
            for f in r.failures:
                if r.level in wk.shrunk_levels or not f.trace:
                    fin.setdefault(_key(f), f)   # shrunk in the worker (--jobs 1), or nothing to replay
                elif f.cause in ("hang", "crash"):
                    # a worker that died: its last steps (StepLog) replayed -- they may show what it
                    # found before it died; the death itself is reported in any case
                    fin.setdefault(_key(f), f)
                    tasks.append([len(tasks), r.level, "steps", (f.invariant, f.cause, f.reason, _failure_msg(f))])
                # (any other failure of an unshrunk level came as "found" too)
        finished = {r.level for r in wk.results if r.level in wk.shrunk_levels}
        for lvl, trace, cap in wk.failed_examples:
            if lvl in finished:
                continue   # the worker shrank and reported what it found there
            tasks.append([len(tasks), lvl, "steps", ("?", "found", "a failed example",
                                                     {"trace": trace_msg(trace), "capacity": cap})])
        for lvl, f, walk_at, from_db in wk.found:
            if lvl in wk.shrunk_levels and any(r.level == lvl for r in wk.results):
                continue   # the worker shrank it and said so
            idx = len(tasks)
            fallback[idx] = (lvl, f)
            if from_db:
                tasks.append([idx, lvl, "db", None])
            elif walk_at is not None:
                tasks.append([idx, lvl, "walk", (f.invariant, walk_at[0], walk_at[1], f.steps_to_detection)])
            else:
                if opts.mode == "hypothesis" and opts.jobs > 1 and lvl not in hyp_levels:
                    hyp_levels.add(lvl)
                    tasks.insert(0, [-1 - len(hyp_levels), lvl, "hyp-db", None])
                tasks.append([idx, lvl, "steps", (f.invariant, f.cause, f.reason, _failure_msg(f))])
    if tasks:
        _shrink_all(opts, tasks, fallback, final, levels, note, out)
    results = []
    for lvl, agg in levels.items():
        fs = list(final.get(lvl, {}).values())
        seen: dict = {}
        for f in fs:
            k = _key(f)
            if k not in seen or len(f.trace) < len(seen[k].trace):
                seen[k] = f
        agg.failures = list(seen.values())
        agg.errors = list(dict.fromkeys(agg.errors))
        if opts.out and agg.plan is not None:
            runner.write_repros(agg, opts.out, target_name=opts.target)
        results.append(agg)
    for lvl in final:
        if lvl not in levels:
            r = runner.PlanResult(opts.target, lvl, None)
            r.failures = list(final[lvl].values())
            results.append(r)
    return results


def _shrink_all(opts: FuzzOptions, tasks: list, fallback: dict, final: dict, levels: dict, note: Callable,
                out: FuzzRun) -> None:
    """Run the tasks in supervised shrinkers: a shrinker that dies on a task
    is followed by a fresh one for the tasks after it.  A task with no
    result keeps the worker's own report."""
    results: dict = {}     # task index -> {invariant: (level, Failure)} ("shrunk" replaces "replayed")
    completed: set = set()  # tasks the shrinker finished (a task it died on is not)
    pending = list(tasks)
    malformed: list = []   # (level or None, harness error): a message of the shrinker's that did not decode
    t0 = time.perf_counter()
    for _attempt in range(len(tasks) + 1):
        if not pending:
            break
        current = [None]

        def on_message(rec: W.Message) -> bool:
            if isinstance(rec, W.Task):
                if current[0] is not None:
                    completed.add(current[0])
                current[0] = rec.index
            elif isinstance(rec, W.Shrunk):   # or Replayed
                got = results.setdefault(rec.index, {})
                got[rec.failure.invariant] = (rec.level, rec.failure.to_failure(opts.target, rec.level))
            elif isinstance(rec, W.Error):
                note(f"shrinker: {rec.error}")
            return True

        def on_malformed(e: W.WireError, m) -> None:
            lvl = m.get("level") if isinstance(m, dict) else None
            malformed.append((lvl if type(lvl) is str and lvl in levels else None, str(e)))
            note(f"shrinker: {e}")

        parent = runner._Parent(opts.target, opts.level, [], [], None, None, None)
        bound = opts.shrink_seconds + max(opts.timeout, BUILD_SECONDS) + opts.timeout * 4 + HARD_GRACE
        end = _supervised(lambda ch, todo=list(pending): _shrinker(ch, opts, todo), opts, on_message, parent, bound,
                          on_malformed)
        if end.death is None:
            completed.add(current[0])
            break
        note(f"shrinker: {end.death}")
        at = current[0]
        order = [t[0] for t in pending]
        pending = pending[order.index(at) + 1:] if at in order else []
        if time.perf_counter() - t0 > opts.shrink_seconds + HARD_GRACE:
            break
    out.shrink_used += time.perf_counter() - t0
    for idx, got in results.items():
        for lvl, f in got.values():
            final.setdefault(lvl, {})[_key(f)] = f
    for idx, (lvl, f) in fallback.items():
        if idx in results:
            continue
        fin = final.setdefault(lvl, {})
        if _key(f) not in fin:
            if idx in completed:   # replayed to the end without failing again
                f.reason += " (not reproduced on replay: nondeterministic target?)"
            fin[_key(f)] = f
    for lvl in final:
        if lvl not in levels:
            levels[lvl] = runner.PlanResult(opts.target, lvl, None)
    for lvl, err in malformed:   # a harness error of the level it names (of every level when it names none)
        for name, agg in levels.items():
            if lvl in (None, name) and err not in agg.errors:
                agg.errors.append(err)
