"""Fast random-walk fuzzing (``memspec fuzz --mode walk``).

The same engine as the Hypothesis harness -- spec oracle, outcome matching,
invariants, observations, data integrity -- but the choices come from a
seeded ``random.Random`` instead of Hypothesis's engine, so a step costs only
what the spec and the target cost.

Every walk records its choice sequence in Hypothesis's primitive form (see
:class:`~memspec.invariants.harness.RandomChooser`).  A failure is handed to
Hypothesis for shrinking: the sequence is saved in the example database under
the key of :func:`shrink_test`, whose loop draws exactly the same choices
(a "continue" boolean per step, then the step's own draws), so Hypothesis's
*reuse* phase replays the walk and its shrinker minimises it.  Before that,
:func:`preshrink` deletes whole steps (delta debugging over the steps the
replay marks, bounded by a count of replays, each candidate kept when it
fails with the same invariant): Hypothesis's own deletions rarely line up
with a whole step, so it then starts from far fewer steps.  The shrunk
failure is then written as a standalone reproduction like any other.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from memspec.invariants import harness as H


@dataclass
class WalkFailure:
    violation: H.Violation
    seed: int
    run_index: int
    choices: list
    steps: int   # total steps of the walk when it was found


@dataclass
class WalkResult:
    plan: H.Plan
    seconds: float = 0.0
    runs: int = 0
    failures: list[WalkFailure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return self.plan.stats.steps

    def rate(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0


def run_seed(seed: int, index: int) -> int:
    """The seed of run ``index`` of a walk started with ``seed`` (re-runnable)."""
    return random.Random(f"memspec-walk:{seed}:{index}").getrandbits(64)


def walk_once(plan: H.Plan, seed: int, run_length: int, guard: H.CallGuard) -> tuple[H.Violation | None, list]:
    """One run of ``run_length`` steps from a fresh target; ``(violation or None, choices)``.

    With a guard in ``"watched"`` mode the whole run is one unit of work on
    the guard's worker thread (:meth:`~memspec.invariants.guard.CallGuard.run_watched`):
    no thread hand-off per target call.  A call that hangs there fails the
    run blamed on what the guard was told the call was for, as in
    ``"thread"`` mode."""
    if guard.mode != "watched":
        return _walk_once(plan, seed, run_length, guard, [])
    holder: list = []
    out, err = guard.run_watched(_walk_once, plan, seed, run_length, guard, holder)
    if err is None:
        return out
    if not isinstance(err, H.HangResult):
        raise err  # a SpecError / TargetError, as the run raised it
    if not holder:  # the factory or the wiring around it hung
        raise H.TargetError(f"target {plan.target!r} could not be built: {guard.what} hangs ({err})")
    run, record = holder
    run.failed = True
    st = plan.stats
    st.failures_seen += 1
    st.first_failure_steps.setdefault(guard.blame, st.steps)
    if run.trace and not run.trace[-1].outcome:
        run.trace[-1].outcome = "hangs"
    v = H.violation_class(guard.blame)(guard.blame, "hang", f"{guard.what} hangs: {err}", run.trace, run.nsteps)
    return v, record


def _walk_once(plan: H.Plan, seed: int, run_length: int, guard: H.CallGuard, holder: list) -> tuple:
    rng = random.Random(seed)
    record: list = []
    chooser = WalkChooser(rng, record)
    run = H.Run(plan, guard, chooser)
    holder += (run, record)
    try:
        for _ in range(run_length):
            record.append(False)  # "continue", as the shrink loop draws it
            run.step(chooser)
        record.append(True)       # "stop"
        run.teardown()
    except H.Violation as v:
        return v, record
    finally:
        run.close()
    return None, record


#: the walk's chooser lives with the other choosers (compiled with them by
#: ``memspec build-native``: an interpreted class cannot subclass a compiled one)
WalkChooser = H.WalkChooser


#: the walk writes its pattern into one new memory region in this many and
#: only reads the others back (faults still caught): the writes dominate a
#: step's cost on a simulated device that materialises pages on first write.
#: A replay in Hypothesis or a reproduction patterns all of them.
WALK_INTEGRITY_SAMPLE = 8
#: the walk re-verifies the round robin's regions (``VERIFY_PER_STEP`` of
#: them, read back and compared) on one step in this many; the regions a
#: step touched or bound are still refreshed on every step, and every region
#: is verified at the end of every run.  A replay in Hypothesis or a
#: reproduction verifies on every step.
WALK_VERIFY_EVERY = 4


def sample_note(integrity_sample: int = WALK_INTEGRITY_SAMPLE, verify_every: int = WALK_VERIFY_EVERY) -> str:
    """What the walk checks and when, as a run states it: the spec's outcome
    set, invariants and observations after every step as the harness checks
    them, data integrity on the stated sample."""
    from memspec.invariants.integrity import VERIFY_PER_STEP

    return ("checked after every step: the answer against the spec's outcome set; every invariant "
            "(re-evaluated whenever the step's branch changed the spec state: a no-op branch leaves every "
            "verdict as it was); every observation (every global figure, the figures of the refs the step "
            "touched or bound and of the tickets whose state changed); full invariant scan at the end of each run; "
            f"data integrity sampled: pattern written into 1 new region in {integrity_sample} (others read back), "
            f"{VERIFY_PER_STEP} regions re-verified round robin on 1 step in {verify_every}, "
            "the regions a step touched or bound refreshed on every step, "
            "every region verified at the end of each run")


def walk(plan: H.Plan, *, seconds: float | None = None, max_steps: int | None = None, seed: int = 0,
         run_length: int = 200, stop_on_failure: bool = True, on_progress: Callable[[WalkResult], None] | None = None,
         guard: H.CallGuard | None = None, integrity_sample: int = WALK_INTEGRITY_SAMPLE,
         verify_every: int = WALK_VERIFY_EVERY) -> WalkResult:
    """Random walks until ``seconds`` or ``max_steps`` run out (or a failure).

    Data integrity is sampled as :func:`sample_note` states
    (``integrity_sample``, ``verify_every``; 1 and 1: as the harness)."""
    res = WalkResult(plan)
    old_sample, old_every = plan.integrity_sample, plan.integrity_verify_every
    plan.integrity_sample, plan.integrity_verify_every = integrity_sample, verify_every
    g = guard or H.CallGuard(plan.timeout, plan.guard_mode)
    if guard is None and g.mode == "thread":
        g.mode = "watched"  # no supervisor: one thread hand-off per run, not per call
    g.install()
    seen: set[str] = set()
    t0 = time.perf_counter()
    st = plan.stats
    start_steps = st.steps
    try:
        i = 0
        while True:
            if seconds is not None and time.perf_counter() - t0 >= seconds:
                break
            if max_steps is not None and st.steps - start_steps >= max_steps:
                break
            rs = run_seed(seed, i)
            try:
                v, choices = walk_once(plan, rs, run_length, g)
            except (H.SpecError, H.TargetError) as e:
                res.errors.append(f"{type(e).__name__}: {e}")
                break
            res.runs += 1
            if v is not None and v.invariant not in seen:
                seen.add(v.invariant)
                res.failures.append(WalkFailure(v, seed, i, choices, st.steps))
                if stop_on_failure:
                    break
            i += 1
            if on_progress is not None:
                res.seconds = time.perf_counter() - t0
                on_progress(res)
    finally:
        g.uninstall()
        plan.integrity_sample, plan.integrity_verify_every = old_sample, old_every
        res.seconds = time.perf_counter() - t0
        st.seconds += res.seconds
    return res


# --------------------------------------------------------------------------
# Handing a walk's failure to Hypothesis
# --------------------------------------------------------------------------

#: the label of the span the replay marks around each step
STEP_SPAN = 0x6D656D


def _replay(plan: H.Plan, guard: H.CallGuard, max_steps: int, cd: Any, starts: list | None = None) -> None:
    """Run the walk's loop on the choices of ``cd`` (a ``ConjectureData``):
    per step a "stop?" boolean then the step's draws, each step in a span
    (so Hypothesis can delete whole steps).  ``starts``: gets the index in
    the choice sequence of each step's "stop?" draw (the steps run)."""
    chooser = H.HypothesisChooser(cd)
    run = H.Run(plan, guard, chooser)
    try:
        i = 0
        while True:
            cd.start_span(STEP_SPAN)
            at = len(cd.nodes) if starts is not None else 0
            stop = cd.draw_boolean(p=1 / 64, forced=True if i >= max_steps else None)
            if stop:
                cd.stop_span()
                break
            if starts is not None:
                starts.append(at)
            run.step(chooser)
            cd.stop_span()
            i += 1
        run.teardown()
    finally:
        run.close()


def shrink_test(plan: H.Plan, max_steps: int, guard: H.CallGuard) -> Callable:
    """A ``@given`` test whose choice sequence has the walk's shape:
    per step a "stop?" boolean then the step's draws (spans mark steps so
    Hypothesis can delete whole steps)."""
    from hypothesis import given, strategies as st

    @given(st.data())
    def memspec_walk_replay(data):
        _replay(plan, guard, max_steps, data.conjecture_data)

    return memspec_walk_replay


# --------------------------------------------------------------------------
# Step-level pre-shrink: whole steps deleted before Hypothesis shrinks
# --------------------------------------------------------------------------

#: replays the step-level pre-shrink may make for one failure (a count, not
#: seconds: its result does not depend on the machine's load)
PRESHRINK_REPLAYS = 100


@dataclass
class PreShrink:
    """What :func:`preshrink` made of a failing choice sequence."""
    choices: list                  # the shortest failing sequence found (as the replay consumed it)
    violation: H.Violation | None  # its violation (None: the sequence did not fail again as it was found)
    steps_before: int = 0          # steps of the first replay (everything after the failing step dropped)
    steps_after: int = 0
    replays: int = 0
    kept: int = 0                  # candidates kept (each deleted at least one whole step)


def replay_choices(plan: H.Plan, guard: H.CallGuard, max_steps: int,
                   choices: list) -> tuple[H.Violation | None, list, list]:
    """Replay ``choices`` deterministically through the shrink test's loop
    (``ConjectureData.for_choices``, as Hypothesis replays a choice
    sequence): ``(violation or None, the choices consumed, the index of each
    step's "stop?" draw)``."""
    from hypothesis.internal.conjecture.data import ConjectureData

    cd = ConjectureData.for_choices(choices)
    starts: list = []
    v = None
    try:
        _replay(plan, guard, max_steps, cd, starts)
    except KeyboardInterrupt:
        raise
    except H.Violation as e:
        v = e
    except BaseException:  # noqa: BLE001 - ran out of choices, or the spec/target could not run it: no failure
        v = None
    return v, list(cd.choices), starts


def preshrink(plan: H.Plan, failure: WalkFailure, guard: H.CallGuard, *, max_steps: int | None = None,
              replays: int | None = None, until: float | None = None) -> PreShrink:
    """Delete whole steps from ``failure``'s choice sequence, keeping a
    candidate when its replay fails with a violation of the same invariant.

    The first replay drops everything after the failing step (what it did
    not consume); then delta debugging over the steps: runs of half the
    steps, a quarter, ..., single steps, each tried for deletion in turn.
    Bounded by ``replays`` replays (the first included; default
    :data:`PRESHRINK_REPLAYS`), and, as a safety only, by ``until`` (a
    ``time.perf_counter()`` value: the shrink budget's end, which a fuzzing
    campaign sets; no new replay starts after it)."""
    inv = failure.violation.invariant
    replays = PRESHRINK_REPLAYS if replays is None else replays
    max_steps = len(failure.choices) if max_steps is None else max_steps
    v, choices, starts = replay_choices(plan, guard, max_steps, list(failure.choices))
    out = PreShrink(list(failure.choices), None, len(starts), len(starts), 1)
    if v is None or v.invariant != inv:
        return out
    out.choices, out.violation = choices, v
    n = len(starts)
    chunk = max(n // 2, 1)
    def more() -> bool:
        return out.replays < replays and (until is None or time.perf_counter() < until)

    while more() and n > 0:
        i = 0
        while i < n and more():
            j = min(i + chunk, n)
            end = starts[j] if j < n else len(choices)
            cand = choices[:starts[i]] + choices[end:]
            if not cand or cand[-1] is not True:
                cand.append(True)   # stop: a run that no longer fails mid-step still ends and tears down
            out.replays += 1
            v2, c2, s2 = replay_choices(plan, guard, max_steps, cand)
            if v2 is not None and v2.invariant == inv and len(s2) < n:
                choices, starts, n = c2, s2, len(s2)
                out.choices, out.violation, out.steps_after = c2, v2, n
                out.kept += 1
                continue   # the same position again: the steps that followed moved up
            i = j
        if chunk == 1:
            break
        chunk = max(chunk // 2, 1)
    return out


def shrink(plan: H.Plan, failure: WalkFailure, *, db: Any = None, max_examples: int = 50) -> H.Violation | None:
    """Pre-shrink ``failure`` (:func:`preshrink`: whole steps deleted), then
    replay the result through Hypothesis (reuse + shrink phases) and return
    the shortest violation of the same invariant either found (Hypothesis
    may report several origins; ``None`` if neither reproduced it: the
    target is then nondeterministic)."""
    from hypothesis import Phase, Verbosity, settings
    from hypothesis.database import InMemoryExampleDatabase, choices_to_bytes

    from memspec.invariants.results import _flatten, database_key

    database = db if db is not None else InMemoryExampleDatabase()
    guard = H.CallGuard(plan.timeout, plan.guard_mode)
    max_steps = len(failure.choices)  # an upper bound on the walk's steps
    test = shrink_test(plan, max_steps, guard)
    key = database_key(plan, "walk")
    test._hypothesis_internal_database_key = key
    # the pre-shrink is part of the shrink's seconds (``--shrink-seconds``):
    # what it spends, Hypothesis's shrink (whose ceiling the caller set) no longer gets
    from hypothesis.internal.conjecture import engine as hyp_engine

    budget = float(hyp_engine.MAX_SHRINKING_SECONDS)
    t0 = time.perf_counter()
    guard.install()
    try:
        pre = preshrink(plan, failure, guard, max_steps=max_steps, until=t0 + budget)
    finally:
        guard.uninstall()
    left = max(budget - (time.perf_counter() - t0), 0.0)
    # the *secondary* corpus: examples in the primary one count as already
    # shrunk and would be replayed as they are
    database.save(key + b".secondary", choices_to_bytes(pre.choices))
    s = settings(database=database, max_examples=max_examples, deadline=None, verbosity=Verbosity.quiet,
                 phases=[Phase.reuse, Phase.shrink], report_multiple_bugs=True, derandomize=False,
                 suppress_health_check=list(__import__("hypothesis").HealthCheck))
    guard.install()
    hyp_engine.MAX_SHRINKING_SECONDS = left
    try:
        settings(s)(test)()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001
        found = [x for x, _f in _flatten(e) if isinstance(x, H.Violation)]
        same = [v for v in found if v.invariant == failure.violation.invariant]
        if pre.violation is not None:
            same.append(pre.violation)   # it reproduces on its own too (a deterministic replay)
        # Hypothesis reports every origin it shrank: the shortest of the same invariant
        return min(same, key=lambda v: len(v.trace)) if same else (found or [None])[0]
    finally:
        guard.uninstall()
        hyp_engine.MAX_SHRINKING_SECONDS = budget   # the caller's ceiling again
    return pre.violation
