"""``python -m bench.profile GROUP [--quick] [--top N] [--sort tottime]``:
run one benchmark group under cProfile and print its hot spots.

This is how the analysis in bench/README.md was made (py-spy, when
installed, gives the same picture without the profiler's overhead:
``py-spy record -o out.svg -- python -m bench --only GROUP``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys

from typing import Any

from bench.__main__ import GROUPS, _load
from bench.common import print_table


#: (label, file suffix, function name) of the harness's per-step phases
#: (the engine's file is read from its code: ``Run`` lives in
#: invariants/engine.py, re-exported by invariants/harness.py)
PHASES = (
    ("draw an action and its arguments (availability of every action)", "engine.py", "choose"),
    ("invariants (Run.check_invariants: every invariant, re-evaluated on change)", "engine.py", "check_invariants"),
    ("observations (spec figure vs implementation figure)", "engine.py", "check_observations"),
    ("data integrity (stamps written/verified through the EP)", "integrity.py", "after_step"),
    ("fresh target + spec state per run (Run.__init__)", "engine.py", "__init__"),
)


def breakdown(stats: pstats.Stats) -> str:
    """Cumulative seconds of the harness phases; ``apply`` minus the checks is
    the spec step + the implementation call + outcome matching."""
    try:
        from memspec.invariants.harness import Run

        run_init_line = Run.__init__.__code__.co_firstlineno
    except ImportError:
        run_init_line = -1
    cum: dict[tuple[str, str], float] = {}
    for (file, line, fn), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if fn == "__init__" and line != run_init_line:
            continue
        key = (file.rsplit("/", 1)[-1], fn)
        cum[key] = cum.get(key, 0.0) + ct
    apply_t = cum.get(("engine.py", "apply"), 0.0)
    check_t = cum.get(("engine.py", "check_after"), 0.0)
    total = cum.get(("engine.py", "choose"), 0.0) + apply_t + cum.get(("engine.py", "__init__"), 0.0)
    if total <= 0:
        return "harness step breakdown: no harness steps in this profile"
    lines = [f"harness step breakdown (cProfile; {total:.2f} s in the harness's steps = 100%, "
             f"of {stats.total_tt:.2f} s profiled):"]  # type: ignore[attr-defined]
    for label, f, fn in PHASES:
        t = cum.get((f, fn), 0.0)
        lines.append(f"  {t:7.2f} s  {100 * t / total:5.1f}%  {label}")
    t = apply_t - check_t
    lines.append(f"  {t:7.2f} s  {100 * t / total:5.1f}%  spec step + implementation call + outcome match (apply - checks)")
    return "\n".join(lines)


#: (label, what is timed) of the walk's phases, exclusive, in step order
WALK_PHASES = (
    ("draw", "choose an available action and draw its arguments (the engine's guidance: swarm, focus, "
             "redraws, each with the spec's outcome set)"),
    ("target call", "the implementation's call (Action.perform through the guard)"),
    ("spec + match", "apply less the call and the checks: trace record, stats, spec outcomes (when not "
                     "reused from the draw), outcome match, the spec following the branch, binding refs"),
    ("invariants", "Run.check_invariants"),
    ("observations", "Run.check_observations (spec figure vs implementation figure)"),
    ("data integrity", "Integrity.after_step (stamps written / read back through the EP)"),
    ("check_after rest", "check_after less the three checks"),
    ("run setup", "fresh target + spec state per run (Run.__init__)"),
    ("run end", "teardown: full invariant scan, full data verify, close"),
    ("walk loop", "the rest of a run: the run's loop and its choice records (the hand-off of each run to the "
                  "guard's worker thread and back is not a phase: see walk_phases)"),
)


def walk_phases(level: str, steps: int = 3000, run_length: int = 50, seed: int = 0, target: str = "reference") -> dict:
    """Where a walk step's time goes, without a profiler's distortion:
    ``{"cpu_us_per_step": ..., "phases": {label: us/step}, "steps": n}``.

    Each phase's method is wrapped with a ``perf_counter_ns`` timer (about
    0.1 us per step for all of them) on the run class the walk uses; the
    phases are exclusive (a phase that calls another is counted less it).
    The shares are of wall time inside the runs, scaled to the walk's CPU
    time per step (``time.process_time``) so that load spread evenly over
    the phases does not show.  The wall time between the runs -- each run
    handed to the guard's worker thread (``CallGuard.run_watched``) and its
    result back: on a loaded machine mostly the wait for a core, not CPU --
    is left out of the scale and given apart (``handoff_wall_us_per_step``):
    counted in, it was the largest "phase" at a load of 10 on 2 cores
    (30-40 us of wall per step, a quarter of the scale), and every phase's
    CPU figure came out that much too small."""
    import dataclasses
    import time
    from time import perf_counter_ns

    from memspec.invariants import integrity as I
    from memspec.invariants import runner, walk

    acc = dict.fromkeys(("choose", "apply", "perform", "check_after", "check_invariants", "check_observations",
                         "after_step", "__init__", "teardown"), 0)

    def timed(key: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t = perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                acc[key] += perf_counter_ns() - t
        return wrapper

    cls = getattr(walk, "WalkRun", None) or __import__("memspec.invariants.engine", fromlist=["Run"]).Run
    saved = {}
    for name in ("choose", "apply", "check_after", "check_invariants", "check_observations", "__init__", "teardown"):
        saved[(cls, name)] = cls.__dict__.get(name)
        setattr(cls, name, timed(name, getattr(cls, name)))
    saved[(I.Integrity, "after_step")] = I.Integrity.__dict__.get("after_step")
    I.Integrity.after_step = timed("after_step", I.Integrity.after_step)
    acc["runs"] = 0
    once = getattr(walk, "_walk_once", None)   # looked up at each call: walk_once runs the timed one
    if once is not None:   # (without it the scale is the walk's whole wall, as before)
        saved[(walk, "_walk_once")] = once
        walk._walk_once = timed("runs", once)
    plan = runner.make_plan(target, level)
    plan.actions = [dataclasses.replace(a, perform=timed("perform", a.perform)) for a in plan.actions]
    try:
        c0, t0 = time.process_time(), perf_counter_ns()
        res = walk.walk(plan, max_steps=steps, run_length=run_length, seed=seed, stop_on_failure=False)
        cpu, wall = time.process_time() - c0, perf_counter_ns() - t0
    finally:
        for (owner, name), fn in saved.items():
            if fn is None:
                delattr(owner, name)
            else:
                setattr(owner, name, fn)
    n = max(res.steps, 1)
    excl = {
        "draw": acc["choose"],
        "target call": acc["perform"],
        "spec + match": acc["apply"] - acc["perform"] - acc["check_after"],
        "invariants": acc["check_invariants"],
        "observations": acc["check_observations"],
        "data integrity": acc["after_step"],
        "check_after rest": acc["check_after"] - acc["check_invariants"] - acc["check_observations"] - acc["after_step"],
        "run setup": acc["__init__"],
        "run end": acc["teardown"],
    }
    runs_wall = acc["runs"] or wall   # wall inside the runs (on the worker thread)
    excl["walk loop"] = runs_wall - sum(excl.values())
    scale = cpu * 1e6 / n / (runs_wall / 1e3 / n) if runs_wall else 0.0   # CPU us per wall us inside the runs
    return {"level": level, "steps": res.steps, "runs": res.runs, "cpu_us_per_step": cpu * 1e6 / n,
            "wall_us_per_step": wall / 1e3 / n, "handoff_wall_us_per_step": (wall - runs_wall) / 1e3 / n,
            "phases": {k: v / 1e3 / n * scale for k, v in excl.items()},
            "failures": [f.violation.invariant for f in res.failures], "errors": res.errors}


def print_walk_phases(levels: tuple = ("mechanism", "system"), steps: int = 3000) -> list[dict]:
    out = []
    for level in levels:
        m = walk_phases(level, steps)
        out.append(m)
        print(f"walk step breakdown, {level}: {m['cpu_us_per_step']:.0f} CPU us/step over {m['steps']} steps "
              f"({m['runs']} runs; phase shares timed per call, scaled to CPU time)")
        for label, desc in WALK_PHASES:
            us = m["phases"][label]
            print(f"  {us:7.1f} us  {100 * us / m['cpu_us_per_step']:5.1f}%  {label}: {desc}")
        print(f"  (and {m['handoff_wall_us_per_step']:.1f} us of wall per step between the runs, handing each to "
              "the guard's worker thread and back: not in the scale)")
        if m["failures"] or m["errors"]:
            print(f"  NOTE run not clean: {m['failures']} {m['errors']}")
    return out


def _walk_on_this_thread() -> None:
    """cProfile sees only the thread it runs on, and the walk runs each run
    on the guard's worker thread (``CallGuard.run_watched``): while
    profiling, run it on the calling thread instead (the same calls and
    counters; no hang watch)."""
    import threading

    from memspec.invariants.guard import CallGuard

    def run_here(self, fn, *args, poll=None):
        self.depth = 0
        self._owner = threading.get_ident()
        try:
            return fn(*args), None
        except BaseException as e:  # noqa: BLE001 - as the worker thread would report it
            return None, e

    CallGuard.run_watched = run_here


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile")
    p.add_argument("group", choices=list(GROUPS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--sort", default="tottime", choices=["tottime", "cumulative", "ncalls"])
    p.add_argument("--out", help="also dump the raw profile here (for snakeviz etc.)")
    p.add_argument("--breakdown", action="store_true",
                   help="harness groups: split a step's time into draw / spec+target call / invariants / "
                        "observations / data integrity / fresh target")
    p.add_argument("--phases", action="store_true",
                   help="walk: time each phase of a walk step per call (no profiler), per level, and stop")
    p.add_argument("--steps", type=int, default=3000, help="--phases: steps per level (default %(default)s)")
    args = p.parse_args(argv)
    _walk_on_this_thread()
    if args.phases:
        print_walk_phases(steps=args.steps)
        return 0
    prof = cProfile.Profile()
    rows = prof.runcall(_load(GROUPS[args.group]), args.quick)
    print_table(rows)
    if args.out:
        prof.dump_stats(args.out)
    if args.breakdown:
        print(breakdown(pstats.Stats(prof)))
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(args.sort).print_stats(args.top)
    print(buf.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
