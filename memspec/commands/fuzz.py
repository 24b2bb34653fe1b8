"""``memspec fuzz [TARGET] --minutes N``: time-budgeted fuzzing of a target.

Modes:

* ``hypothesis`` (default) -- the conformance state machine under the
  ``fuzz`` profile, in rounds of fresh seeds (round ``i`` uses ``seed + i``)
  until the time is up.  Failures are saved to the example database
  (``--db``, replayed first on the next run) and written as reproductions.
* ``walk`` -- random action sequences through the same spec oracle and checks
  without Hypothesis's engine per step (several times faster); a failure is
  handed to Hypothesis for shrinking, then saved and written the same way.

A live display shows steps/s, the actions and outcomes covered and the
failures so far.  Exit status 1 if anything failed.
"""

from __future__ import annotations

from memspec.invariants.report import console as _report_console

import argparse
import sys
import time

from memspec.invariants.discovery import DEFAULT_TARGET


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memspec fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("target", nargs="?", default=None, help=f"target (default {DEFAULT_TARGET})")
    p.add_argument("--target", dest="target_opt", default=None, help="same as the positional TARGET")
    p.add_argument("--minutes", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=None, help="budget in seconds (overrides --minutes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--db", default="memspec-out/db", help="Hypothesis example database directory")
    p.add_argument("--mode", choices=("hypothesis", "walk"), default="hypothesis")
    p.add_argument("--level", choices=("mechanism", "system", "caching", "all"), default="all")
    p.add_argument("--steps", type=int, default=None, help="steps per run (default: profile / 200 for walk)")
    p.add_argument("--timeout", type=float, default=5.0, help="per-call timeout in seconds")
    p.add_argument("--capacity", type=int, default=None)
    p.add_argument("--out", default="memspec-out/repro", help="directory for reproduction files")
    p.add_argument("--machine", default=None, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report of the run")
    return p


class Display:
    """The live panel: throughput, coverage, failures."""

    def __init__(self, target: str, mode: str, budget: float) -> None:
        self.target, self.mode, self.budget = target, mode, budget
        self.t0 = time.perf_counter()
        self.plans: list = []
        self.failures: list[str] = []

    def __rich__(self):
        from rich.table import Table

        t = Table(title=f"memspec fuzz {self.target} ({self.mode})", show_header=False)
        el = time.perf_counter() - self.t0
        steps = sum(p.stats.steps for p in self.plans)
        t.add_row("elapsed", f"{el:.0f} / {self.budget:.0f} s")
        t.add_row("steps", f"{steps}  ({steps / el if el else 0:.0f} steps/s)")
        for p in self.plans:
            t.add_row(f"{p.level}: actions", f"{len(p.stats.actions)}/{len(p.actions)} covered")
            t.add_row(f"{p.level}: outcomes", f"{len(p.stats.outcomes)} seen")
        from rich.markup import escape

        t.add_row("failures", escape("\n".join(self.failures)) or "none")
        return t


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    from rich.live import Live

    from memspec.invariants import runner
    from memspec.invariants.discovery import resolve

    target = args.target or args.target_opt or DEFAULT_TARGET
    budget = args.seconds if args.seconds is not None else args.minutes * 60
    console = _report_console()
    disp = Display(target, args.mode, budget)
    results = []
    deadline = time.perf_counter() + budget
    try:
        tref = resolve(target)
        kind = runner._kind_of(tref, args.capacity)
    except Exception as e:  # noqa: BLE001
        console.print(f"[red]cannot fuzz {target}[/]: {type(e).__name__}: {e}")
        return 2
    levels = [tref.mutant.level] if tref.mutant is not None and args.level == "all" else runner.levels_for(kind, args.level)
    if not levels:
        console.print(f"[red]level {args.level!r} does not apply to a target of kind {kind!r}[/]")
        return 2
    import contextlib

    live = contextlib.nullcontext() if args.quiet else Live(disp, console=console, refresh_per_second=4,
                                                              transient=False, redirect_stdout=False)
    with live:
        for i, lvl in enumerate(levels):
            share = (deadline - time.perf_counter()) / (len(levels) - i)
            try:
                plan = runner.make_plan(tref, lvl, capacity=args.capacity, timeout=args.timeout, machine=args.machine)
            except Exception as e:  # noqa: BLE001
                disp.failures.append(f"{lvl}: ERROR {type(e).__name__}: {e}")
                continue
            disp.plans.append(plan)
            if args.mode == "walk":
                results += fuzz_walk(plan, share, args, disp)
            else:
                results += fuzz_hypothesis(plan, share, args, disp)
    bad = [f for r in results for f in r.failures] + [e for r in results for e in r.errors]
    steps = sum(p.stats.steps for p in disp.plans)
    el = time.perf_counter() - disp.t0
    console.print(f"steps run: {steps}; {steps / el if el else 0:.0f} steps/s; {el:.1f} s; seed {args.seed}; db {args.db}")
    from rich.markup import escape

    for r in results:
        for f in r.failures:
            console.print(f"[red]FAIL {f.invariant}[/] " + escape(f"[{f.cause}] ({r.level}, {f.shrunk_length} steps) {f.reason}")
                          + (f"\n    python {f.repro}" if f.repro else ""))
        for e in r.errors:
            console.print(f"[yellow]ERROR[/] ({r.level}) " + escape(e))
    if args.html:
        from memspec.invariants import html_report

        html_report.write_html(args.html, {target: results}, html_report.parameters_from_args(args, (
            "mode", "level", "minutes", "seconds", "seed", "steps", "capacity", "timeout", "db")), tool="memspec fuzz")
        console.print(f"report: {args.html}")
    console.print("[green]no failures[/]" if not bad else f"[red]{len(bad)} failure(s)[/]")
    return 1 if bad else 0


def fuzz_hypothesis(plan, seconds: float, args, disp) -> list:
    from memspec.invariants import runner

    end = time.perf_counter() + seconds
    out = []
    rnd = 0
    seen: set[str] = set()
    while time.perf_counter() < end:
        # rounds of fresh seeds; a round is small so the budget is honoured
        left = end - time.perf_counter()
        examples = max(5, min(200, int(left * 5)))
        sets = runner.hypothesis_settings("fuzz", examples=examples, steps=args.steps, db=args.db,
                                          seed=args.seed + rnd)
        res = runner.run_hypothesis(plan, sets, seed=args.seed + rnd)
        res.failures = [f for f in res.failures if f.invariant not in seen]
        seen.update(f.invariant for f in res.failures)
        runner.write_repros(res, args.out, target_name=plan.target)
        for f in res.failures:
            disp.failures.append(f"{plan.level} {f.invariant} [{f.cause}] {f.reason[:90]}")
        out.append(res)
        rnd += 1
        if res.errors:
            break
    return out


def fuzz_walk(plan, seconds: float, args, disp) -> list:
    from hypothesis.database import DirectoryBasedExampleDatabase

    from memspec.invariants import runner, walk

    res = runner.PlanResult(plan.target, plan.level, plan)
    db = DirectoryBasedExampleDatabase(args.db) if args.db else None
    end = time.perf_counter() + seconds
    seed = args.seed
    seen: set[str] = set()
    while time.perf_counter() < end:
        w = walk.walk(plan, seconds=end - time.perf_counter(), seed=seed, run_length=args.steps or 200)
        res.errors += w.errors
        for wf in w.failures:
            if wf.violation.invariant in seen:
                continue
            seen.add(wf.violation.invariant)
            v = walk.shrink(plan, wf, db=db) or wf.violation
            f = runner.Failure(plan.target, plan.level, v.invariant, v.cause, v.reason, v.trace, wf.steps)
            res.failures.append(f)
            disp.failures.append(f"{plan.level} {f.invariant} [{f.cause}] {f.reason[:90]} (walk seed {wf.seed} run {wf.run_index})")
        if w.errors or not w.failures:
            break
        seed += 1  # continue with the next seed after a failure
    runner.write_repros(res, args.out, target_name=plan.target)
    return [res]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
