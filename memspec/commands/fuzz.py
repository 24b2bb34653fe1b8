"""``memspec fuzz [TARGET] --minutes N``: time-budgeted fuzzing of a target.

Modes:

* ``hypothesis`` (default) -- the conformance state machine under the
  ``fuzz`` profile, in rounds of fresh seeds (round ``i`` uses ``seed + i``)
  until the time is up.  Failures are saved to the example database
  (``--db``, replayed first on the next run) and written as reproductions.
* ``walk`` -- random action sequences through the same spec oracle and checks
  without Hypothesis's engine per step (several times faster); a failure is
  handed to Hypothesis for shrinking, then saved and written the same way.
  The walk counterexamples already in the database are replayed first.

Parallel jobs (``--jobs N``, default: all cores): N worker processes fuzz
with distinct seeds (worker ``w`` starts at ``seed + w * 1,000,003``) and
share one example database (Hypothesis's directory database is safe for
concurrent writers).  Workers do not shrink: the first failure any worker
finds stops them all; the parent replays it (Hypothesis mode: from the shared
database; walk mode: the worker's seed and run) and shrinks and reports each
distinct failure once.  One live display sums the workers.  The parent makes
the plans (and imports the engine) before the fork; the workers inherit them.

The budget: the command ends within ``N`` minutes plus the shrink of one
failure (``--shrink-seconds``, default 30 s, all failures of a run together)
plus the unit of work in flight at the deadline -- in walk mode one run of
``--steps`` steps, in Hypothesis mode one round (rounds are sized from the
measured time per example to at most ``ROUND_SECONDS`` = min(10 s, budget/10,
at least 1 s) each, and the first round is 2 examples).  The deadline is
checked between rounds (Hypothesis) and between runs (walk); with ``--jobs``
add the workers' start.  "The shrink" is Hypothesis's: it takes no new
shrink step after ``--shrink-seconds``, then replays the shrunk example once;
every call inside a unit of work is bounded by ``--timeout``, so a target
that hangs stretches a unit to at most its steps x ``--timeout``.

A live display shows steps/s, the actions and outcomes covered and the
failures so far.  ``--json FILE`` writes the figures, including the elapsed
time measured by the command itself.  Exit status 1 if anything failed.

Sharing counterexamples across machines: ``--db-readonly-github OWNER/REPO``
reads the failures other runners uploaded as a GitHub Actions artifact
(Hypothesis's ``GitHubArtifactDatabase``, read-only) and replays them first,
while new failures go to the local ``--db`` (both combined with
``MultiplexedDatabase``); see docs/CAMPAIGNS.md.
"""

from __future__ import annotations

from memspec.invariants.report import console as _report_console

import argparse
import json
import math
import os
import shlex
import sys
import time

from memspec.argtypes import jobs as jobs_type
from memspec.argtypes import out_dir, out_file
from memspec.commands._output import Terminal, reason, say, write_output
from memspec.invariants import text as T
from memspec.invariants.discovery import DEFAULT_TARGET


def escape_markup(text: str) -> str:
    from rich.markup import escape

    return escape(text)

#: seed distance between two workers' seed ranges
SEED_STRIDE = 1_000_003
#: an upper bound on one Hypothesis round, in seconds (also capped at budget/10)
ROUND_SECONDS = 10.0
#: seconds of shrinking for one failure (all failures of a run share it)
SHRINK_SECONDS = 30.0


def _positive_finite(kind: type):
    def conv(text: str):
        try:
            v = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"not a {kind.__name__}: {text!r}") from None
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
        return v
    conv.__name__ = f"positive {kind.__name__}"
    return conv


positive_float = _positive_finite(float)
positive_int = _positive_finite(int)


def _non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be finite and >= 0, got {text!r}")
    return v


def _github_repo(text: str) -> str:
    parts = text.split("/")
    if len(parts) != 2 or not all(parts) or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"expected OWNER/REPO, got {text!r}")
    return text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memspec fuzz", description=__doc__.split("\n\n")[0],
                                epilog="Budget: ends within --minutes plus the shrink of one failure "
                                       "(--shrink-seconds) plus the work unit in flight (one walk run of --steps "
                                       f"steps, or one Hypothesis round of <= {ROUND_SECONDS:.0f} s and <= budget/10, "
                                       "at least 1 s); with --jobs add the workers' start. The deadline is checked "
                                       "between rounds (Hypothesis) and between runs (walk); --json reports the "
                                       "elapsed time and this bound (bound_s).")
    p.add_argument("target", nargs="?", default=None, help=f"target (default {DEFAULT_TARGET})")
    p.add_argument("--target", dest="target_opt", default=None, help="same as the positional TARGET")
    p.add_argument("--minutes", type=positive_float, default=1.0,
                   help="time budget in minutes (> 0, finite). The command ends within it plus the shrink of one "
                        "failure plus the unit of work in flight (the bound is stated below)")
    p.add_argument("--seconds", type=positive_float, default=None, help="budget in seconds (overrides --minutes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=jobs_type, default=None,
                   help="worker processes with distinct seeds and one shared database (default: all cores)")
    p.add_argument("--db", type=out_dir, default="memspec-out/db", help="Hypothesis example database directory")
    p.add_argument("--db-readonly-github", metavar="OWNER/REPO", type=_github_repo, default=None,
                   help="also replay counterexamples from this repository's GitHub Actions artifact "
                        "(GitHubArtifactDatabase, read-only; token from $GITHUB_TOKEN)")
    p.add_argument("--db-artifact", default="hypothesis-example-db",
                   help="artifact name for --db-readonly-github (default %(default)s)")
    p.add_argument("--mode", choices=("hypothesis", "walk"), default="hypothesis")
    p.add_argument("--level", choices=("mechanism", "system", "caching", "all"), default="all")
    p.add_argument("--steps", type=positive_int, default=None, help="steps per run (default: profile / 200 for walk)")
    p.add_argument("--timeout", type=positive_float, default=5.0, help="per-call timeout in seconds")
    p.add_argument("--shrink-seconds", type=_non_negative_float, default=SHRINK_SECONDS,
                   help="time to shrink failures, all of a run together (default %(default)s)")
    p.add_argument("--capacity", type=positive_int, default=None)
    p.add_argument("--out", type=out_dir, default="memspec-out/repro", help="directory for reproduction files")
    p.add_argument("--json", metavar="FILE", type=out_file, default=None, help="write the run's figures and failures as JSON")
    p.add_argument("--machine", default=None, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--html", metavar="FILE", type=out_file, help="write a self-contained HTML report of the run")
    return p


def open_database(db: str | None, github: str | None = None, artifact: str = "hypothesis-example-db"):
    """The example database: the local directory ``db``, and with ``github``
    (``OWNER/REPO``) that repository's artifact read-only in front of it.
    Saves go to the local directory only."""
    from hypothesis.database import DirectoryBasedExampleDatabase, MultiplexedDatabase, ReadOnlyDatabase

    local = _CheckedDatabase(db) if db else None
    if not github:
        return local
    from hypothesis.database import GitHubArtifactDatabase

    owner, repo = github.split("/")
    shared = ReadOnlyDatabase(GitHubArtifactDatabase(owner, repo, artifact_name=artifact))
    return MultiplexedDatabase(local, shared) if local is not None else shared


def _checked_database_class():
    from hypothesis.database import DirectoryBasedExampleDatabase

    class CheckedDatabase(DirectoryBasedExampleDatabase):
        """Hypothesis's directory database, which swallows every ``OSError`` of a
        save (a full disk persists nothing, silently): each save is checked by
        reading the value back, and the saves that did not persist are counted
        (``lost``) so the command can say so."""

        lost = 0

        def save(self, key: bytes, value: bytes) -> None:
            super().save(key, value)
            try:
                kept = value in set(self.fetch(key))
            except Exception:  # noqa: BLE001
                kept = False
            if not kept:
                type(self).lost += 1

    return CheckedDatabase


def _CheckedDatabase(path: str):  # noqa: N802 - a class made on first use (Hypothesis is imported late)
    global _CHECKED
    if _CHECKED is None:
        _CHECKED = _checked_database_class()
    return _CHECKED(path)


_CHECKED = None


def lost_saves() -> int:
    """Saves to ``--db`` (in this process) that did not persist."""
    return _CHECKED.lost if _CHECKED is not None else 0


def probe_db(path: str) -> str | None:
    """None if ``path`` (the ``--db`` directory) can persist a value now,
    else why not: a small file is written, synced and removed (a full disk
    fails here, where Hypothesis's own saves would fail silently)."""
    import tempfile

    try:
        os.makedirs(path, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".memspec-db-probe-", dir=path)
    except OSError as e:
        return reason(e)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(b"\0" * 4096)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as e:
        return reason(e)
    finally:
        try:
            os.unlink(name)
        except OSError:
            pass
    return None


class Display:
    """The live panel: throughput, coverage, failures (one per run, whatever the jobs)."""

    def __init__(self, target: str, mode: str, budget: float, jobs: int = 1) -> None:
        self.target, self.mode, self.budget, self.jobs = target, mode, budget, jobs
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        #: --jobs: the parent's own CPU seconds while the workers fuzzed (the display, the queue),
        #: and before the fork (resolving the target, the plans the workers inherit)
        self.parent_cpu: float | None = None
        self.parent_setup_cpu: float | None = None
        #: CPU seconds of the fuzzing itself (the walks or rounds, a shrink in-process; not the
        #: planning): this process's with --jobs 1, the workers' together with --jobs N
        self.fuzz_cpu: float | None = None
        self.plans: list = []
        self.failures: list[str] = []
        #: --jobs: worker -> level -> (steps, covered action names, outcomes seen, total actions)
        self.workers: dict[int, dict[str, tuple[int, frozenset, int, int]]] = {}
        #: --jobs: worker -> level -> seconds fuzzed
        self.worker_seconds: dict[int, dict[str, float]] = {}

    def steps(self) -> int:
        return sum(p.stats.steps for p in self.plans) + sum(
            v[0] for w in self.workers.values() for v in w.values())

    def __rich__(self):
        from rich.markup import escape
        from rich.table import Table

        jobs = f", {self.jobs} jobs" if self.jobs > 1 else ""
        t = Table(title=f"memspec fuzz {escape(self.target)} ({self.mode}{jobs})", show_header=False)
        el = time.perf_counter() - self.t0
        steps = self.steps()
        t.add_row("elapsed", f"{el:.0f} / {self.budget:.0f} s")
        t.add_row("steps", f"{steps}  ({steps / el if el else 0:.0f} steps/s)")
        for p in self.plans:
            t.add_row(f"{p.level}: actions", f"{len(p.stats.actions)}/{len(p.actions)} covered")
            t.add_row(f"{p.level}: outcomes", f"{len(p.stats.outcomes)} seen")
        levels: dict[str, list] = {}
        for w in self.workers.values():
            for lvl, v in w.items():
                levels.setdefault(lvl, []).append(v)
        for lvl, vs in levels.items():
            covered = frozenset().union(*(v[1] for v in vs))
            t.add_row(f"{lvl}: actions", f"{len(covered)}/{max(v[3] for v in vs)} covered ({len(vs)} workers)")
            t.add_row(f"{lvl}: outcomes", f"{max(v[2] for v in vs)} seen (most of one worker)")
        t.add_row("failures", escape("\n".join(T.terminal(x, 300) for x in self.failures)) or "none")
        return t


def default_jobs() -> int:
    """All the cores this process may run on (its CPU affinity where the
    platform has one: a container or ``taskset`` gives fewer than the machine)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def jobs_cap() -> int:
    from memspec.argtypes import max_jobs

    return max_jobs()


def _budget(args) -> float:
    return args.seconds if args.seconds is not None else args.minutes * 60


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.target and args.target_opt and args.target != args.target_opt:
        parser().error(f"two different targets: {args.target!r} and --target {args.target_opt!r}")
    jobs = args.jobs or min(default_jobs(), jobs_cap())
    if args.db:
        why = probe_db(args.db)
        if why is not None:
            say(f"memspec fuzz: --db {args.db} cannot persist anything ({why}): "
                "the counterexamples of this run will not be saved")
    if jobs > 1:
        return main_jobs(args, jobs)
    from rich.live import Live

    from memspec.invariants import runner
    from memspec.invariants.discovery import resolve

    target = args.target or args.target_opt or DEFAULT_TARGET
    budget = _budget(args)
    console = _report_console()
    disp = Display(target, args.mode, budget)
    results = []
    deadline = time.perf_counter() + budget
    try:
        tref = resolve(target)
        kind = runner._kind_of(tref, args.capacity)
    except Exception as e:  # noqa: BLE001
        console.print(f"[red]cannot fuzz {escape_markup(T.terminal(target, 300))}[/]: {escape_markup(T.terminal(T.exc_text(e)))}")
        return 2
    levels = [tref.mutant.level] if tref.mutant is not None and args.level == "all" else runner.levels_for(kind, args.level)
    if not levels:
        console.print(f"[red]level {args.level!r} does not apply to a target of kind {kind!r}[/]")
        return 2
    import contextlib

    shrink = _ShrinkBudget(args.shrink_seconds)
    disp.shrink = shrink
    live = contextlib.nullcontext() if args.quiet else Live(disp, console=console, refresh_per_second=4,
                                                              transient=False, redirect_stdout=False)
    disp.fuzz_cpu = 0.0
    with live:
        for i, lvl in enumerate(levels):
            share = (deadline - time.perf_counter()) / (len(levels) - i)
            if share <= 0:
                break
            try:
                plan = runner.make_plan(tref, lvl, capacity=args.capacity, timeout=args.timeout, machine=args.machine)
            except Exception as e:  # noqa: BLE001
                disp.failures.append(f"{lvl}: ERROR {T.exc_text(e)}")
                continue
            disp.plans.append(plan)
            c_fuzz = time.process_time()
            if args.mode == "walk":
                results += fuzz_walk(plan, share, args, disp, shrink=shrink)
            else:
                results += fuzz_hypothesis(plan, share, args, disp, shrink=shrink)
            disp.fuzz_cpu += time.process_time() - c_fuzz
    steps = sum(p.stats.steps for p in disp.plans)
    return _report(console, args, disp, results, steps, jobs=1, workers=[])


class _ShrinkBudget:
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
        from memspec.invariants import runner

        me = self

        class _Ctx:
            def __enter__(self_inner):
                self_inner.t0 = time.perf_counter()
                self_inner.inner = runner.shrink_budget(max(me.left, 0.0))
                self_inner.inner.__enter__()
                return self_inner

            def __exit__(self_inner, *exc):
                self_inner.inner.__exit__(*exc)
                dt = time.perf_counter() - self_inner.t0
                me.left -= dt
                me.used += dt
                return False

        return _Ctx()


def _report(console, args, disp, results, steps: int, *, jobs: int, workers: list, fuzz_seconds: float | None = None) -> int:
    from rich.markup import escape

    from memspec.invariants.report import write_file

    T.clean_results(results)   # the boundary: every target-derived string bounded and encodable, once
    term = Terminal("memspec fuzz")
    bad = [f for r in results for f in r.failures] + [e for r in results for e in r.errors]
    el = time.perf_counter() - disp.t0
    term.run(lambda: console.print(escape(
        f"steps run: {steps}; {steps / el if el else 0:.0f} steps/s; {el:.1f} s; seed {args.seed}; "
        f"db {T.terminal(args.db)}" + (f"; {jobs} jobs" if jobs > 1 else ""))))
    if getattr(args, "mode", None) == "walk":
        from memspec.invariants.walk import sample_note

        term.run(lambda: console.print(sample_note()))
    for r in results:
        for f in r.failures:
            term.run(lambda f=f, r=r: console.print(
                f"[red]FAIL {escape(T.terminal(f.invariant, 200))}[/] "
                + escape(T.terminal(f"[{f.cause}] ({r.level}, {f.shrunk_length} steps) {f.reason}"))
                + (escape("\n    python " + T.terminal(shlex.quote(str(f.repro)))) if f.repro else ""),
                soft_wrap=True))   # one line: the command can be copied
        for e in r.errors:
            term.run(lambda e=e, r=r: console.print(f"[yellow]ERROR[/] ({r.level}) " + escape(T.terminal(e))))
    lost = lost_saves()
    if args.db and lost:
        say(f"memspec fuzz: --db {args.db}: {lost} database save(s) did not persist "
            "(the directory's writes failed; Hypothesis ignores such errors)")
    written = True
    if args.html:
        from memspec.invariants import html_report

        if write_output("memspec fuzz", "--html", args.html, lambda: html_report.write_html(
                args.html, {disp.target: results}, html_report.parameters_from_args(args, (
                    "mode", "level", "minutes", "seconds", "seed", "steps", "capacity", "timeout", "db")),
                tool="memspec fuzz")):
            term.run(lambda: console.print(escape(f"report: {T.terminal(args.html)}")))
        else:
            written = False
    untested = not bad and steps == 0  # nothing ran: not a pass (e.g. every worker spent the budget starting)
    term.run(lambda: console.print(
        "[green]no failures[/]" if not bad and not untested else
        "[yellow]UNTESTED: no step ran within the budget[/] (raise --minutes/--seconds)" if untested else
        f"[red]{len(bad)} failure(s)[/]"))
    if args.json:
        fs = fuzz_seconds if fuzz_seconds is not None else el
        doc = {
            "target": disp.target, "mode": args.mode, "jobs": jobs, "seed": args.seed,
            "budget_s": disp.budget, "elapsed_s": el, "fuzz_s": fs,
            "bound_s": disp.budget + args.shrink_seconds + min(ROUND_SECONDS, max(1.0, disp.budget / 10)),
            "shrink_s": getattr(disp, "shrink", None).used if getattr(disp, "shrink", None) else 0.0,
            "steps": steps, "steps_per_s": steps / fs if fs else 0.0, "workers": workers,
            "parent_cpu_s": disp.parent_cpu, "parent_setup_cpu_s": disp.parent_setup_cpu,
            "fuzz_cpu_s": disp.fuzz_cpu,
            "failures": [{"level": r.level, "invariant": f.invariant, "cause": f.cause, "reason": f.reason,
                          "steps": f.shrunk_length, "repro": f.repro} for r in results for f in r.failures],
            "errors": [{"level": r.level, "error": e} for r in results for e in r.errors],
            "untested": untested,
            "db_saves_lost": lost,
        }
        if args.mode == "walk":
            from memspec.invariants.walk import sample_note

            doc["sample"] = sample_note()
        written &= write_output("memspec fuzz", "--json", args.json,
                                lambda: write_file(args.json, json.dumps(T.clean(doc), indent=2, default=str) + "\n"))
    if not written:
        return 2
    return 1 if bad or untested else 0


def _round_settings(args, seed: int, examples: int, *, first: bool, shrink: bool, database):
    """Settings of one Hypothesis round: the ``fuzz`` profile, the shared
    database; the reuse phase (replay of saved failures) only in the first
    round, the shrink phase only when this process may shrink."""
    from hypothesis import Phase, settings

    from memspec import profiles as _profiles  # noqa: F401
    from memspec.invariants import runner

    phases = [p for p in settings.get_profile("fuzz").phases
              if (first or p is not Phase.reuse) and (shrink or p not in (Phase.shrink, Phase.explain))]
    return runner.hypothesis_settings("fuzz", examples=examples, steps=args.steps, db=None, seed=seed,
                                      database=database, phases=phases)


def fuzz_hypothesis(plan, seconds: float, args, disp, *, shrink: _ShrinkBudget | None = None,
                    seed: int | None = None, stop=None, database=None, may_shrink: bool = True) -> list:
    """Rounds of fresh seeds until ``seconds`` are up (or ``stop()``).

    A round's size comes from the time per example measured so far: at most
    ``ROUND_SECONDS`` (and budget/10, at least 1 s) of examples, never more
    than what is left; the first round is 2 examples (it also replays the
    database).  So the deadline is checked every few seconds, not after a
    round sized by guesswork."""
    from memspec.invariants import runner

    shrink = shrink or _ShrinkBudget(args.shrink_seconds)
    if database is None:
        database = open_database(args.db, args.db_readonly_github, args.db_artifact)
    base = args.seed if seed is None else seed
    cap = min(ROUND_SECONDS, max(1.0, _budget(args) / 10))
    end = time.perf_counter() + seconds
    out = []
    rnd = 0
    seen: set[str] = set()
    per_example: float | None = None
    while time.perf_counter() < end and not (stop and stop()):
        left = end - time.perf_counter()
        examples = 2 if per_example is None else max(1, min(100_000, int(min(left, cap) / per_example)))
        sets = _round_settings(args, base + rnd, examples, first=rnd == 0, shrink=may_shrink, database=database)
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
        if may_shrink:
            runner.write_repros(res, args.out, target_name=plan.target)
        for f in res.failures:
            disp.failures.append(f"{plan.level} {f.invariant} [{f.cause}] {f.reason[:90]}")
        out.append(res)
        rnd += 1
        if res.errors or (res.failures and not may_shrink):
            break
    return out


def fuzz_walk(plan, seconds: float, args, disp, *, shrink: _ShrinkBudget | None = None, seed: int | None = None,
              stop=None, on_failure=None, database=None) -> list:
    """Walks until ``seconds`` are up.  In-process (``on_failure`` None) each
    new failure is shrunk (within the shrink budget) and the walk goes on
    with the next seed; a worker hands its first failure to ``on_failure``
    and stops."""
    from memspec.invariants import runner, walk

    shrink = shrink or _ShrinkBudget(args.shrink_seconds)
    res = runner.PlanResult(plan.target, plan.level, plan)
    db = database if database is not None else open_database(args.db, args.db_readonly_github, args.db_artifact)
    end = time.perf_counter() + seconds
    seed = args.seed if seed is None else seed
    seen: set[str] = set()

    def progress(_w):
        if stop is not None and stop():
            raise _Stop()

    if on_failure is None:   # a worker's parent replayed the database before the fork
        for f in replay_walk_database(plan, db):
            seen.add(f.invariant)
            res.failures.append(f)
            disp.failures.append(f"{plan.level} {f.invariant} [{f.cause}] {f.reason[:90]} (replayed from the database)")
    while time.perf_counter() < end:
        try:
            w = walk.walk(plan, seconds=end - time.perf_counter(), seed=seed, run_length=args.steps or 200,
                          on_progress=progress)
        except _Stop:
            break
        res.errors += w.errors
        for wf in w.failures:
            if wf.violation.invariant in seen:
                continue
            seen.add(wf.violation.invariant)
            if on_failure is not None:
                on_failure(wf)
                continue
            res.failures.append(_shrink_walk_failure(plan, wf, db, shrink))
            disp.failures.append(f"{plan.level} {wf.violation.invariant} [{wf.violation.cause}] "
                                 f"{wf.violation.reason[:90]} (walk seed {wf.seed} run {wf.run_index})")
        if w.errors or not w.failures or on_failure is not None:
            break
        seed += 1  # continue with the next seed after a failure
    if on_failure is None:
        runner.write_repros(res, args.out, target_name=plan.target)
    return [res]


class _Stop(Exception):
    """Another worker found a failure: stop between runs."""


#: steps a replayed walk counterexample may take (its own "stop" draws end it first)
REPLAY_MAX_STEPS = 10_000


def replay_walk_database(plan, db) -> list:
    """The walk counterexamples ``db`` holds for ``plan`` (shrunk by an
    earlier walk here or on another machine -- a campaign's shared database),
    replayed first, as Hypothesis mode's reuse phase replays its own: one
    :class:`~memspec.invariants.runner.Failure` per invariant that still
    fails.  Hypothesis's reuse phase over the key :func:`walk.shrink`
    saves under; nothing is generated and nothing shrunk again."""
    from hypothesis import HealthCheck, Phase, Verbosity, settings

    from memspec.invariants import harness as H
    from memspec.invariants import runner, walk

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
    guard.install()
    try:
        settings(sets)(test)()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - what the target did is a result
        out: dict = {}
        for v, _flaky in runner._flatten(e):
            if isinstance(v, H.Violation) and v.invariant not in out:
                out[v.invariant] = runner.Failure(plan.target, plan.level, v.invariant, v.cause, v.reason, v.trace,
                                                  None)
        return list(out.values())
    finally:
        guard.uninstall()
    return []


def _shrink_walk_failure(plan, wf, db, shrink: _ShrinkBudget):
    from memspec.invariants import runner, walk

    v = None
    if shrink.left > 0:
        with shrink.take():
            v = walk.shrink(plan, wf, db=db)
    v = v or wf.violation
    return runner.Failure(plan.target, plan.level, v.invariant, v.cause, v.reason, v.trace, wf.steps)


# --------------------------------------------------------------------------
# --jobs N: worker processes
# --------------------------------------------------------------------------

def _worker(w: int, argv: list[str], budget: float, queue, stop_event, built: dict | None = None,
            t_fork: float | None = None) -> None:
    """One worker: fuzz every level with its own seed range for ``budget``
    seconds from the end of its start (the workers' start is on top of the
    budget, as ``--help`` states: a slow start on a loaded machine must not
    eat the budget and leave a worker no time to run) or until a worker found
    a failure; stream progress and the first failure to the parent; never
    shrink.

    ``built``: the plans the parent made before the fork (level -> Plan, or
    the error making it raised), inherited copy-on-write; a level missing
    from it is planned here (``spawn`` platforms).  The ``done`` message
    says when the worker was ready to fuzz (seconds after ``t_fork``) and
    its CPU seconds then and at the end, so a report shows what starting a
    worker cost."""
    import threading

    from memspec.invariants import runner
    from memspec.invariants.discovery import resolve

    c_start = time.process_time()
    ready: list = []   # [seconds after t_fork, CPU seconds] when the first level starts fuzzing
    args = parser().parse_args(argv)
    target = args.target or args.target_opt or DEFAULT_TARGET
    seed = args.seed + w * SEED_STRIDE
    plans: list = []
    done = threading.Event()

    def send_progress() -> None:
        for p in list(plans):
            st = p.stats
            queue.put(("progress", w, p.level, st.steps, frozenset(st.actions), len(st.outcomes), len(p.actions),
                       st.seconds))

    def pump() -> None:
        while not done.wait(0.5):
            send_progress()

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    try:
        tref = resolve(target)
        kind = runner._kind_of(tref, args.capacity)
        levels = [tref.mutant.level] if tref.mutant is not None and args.level == "all" else runner.levels_for(kind, args.level)
        database = open_database(args.db, args.db_readonly_github, args.db_artifact)
        disp = Display(target, args.mode, _budget(args))
        stop = stop_event.is_set
        deadline = time.perf_counter() + budget
        for i, lvl in enumerate(levels):
            share = (deadline - time.perf_counter()) / (len(levels) - i)
            if share <= 0 or stop():
                break
            plan = (built or {}).get(lvl)
            if isinstance(plan, BaseException):
                raise plan
            if plan is None:
                plan = runner.make_plan(tref, lvl, capacity=args.capacity, timeout=args.timeout, machine=args.machine)
            plans.append(plan)
            if not ready:
                ready += [time.perf_counter() - (t_fork if t_fork is not None else 0.0), time.process_time() - c_start]
            if args.mode == "walk" and w == 0:
                # the database's walk counterexamples first (one worker replays them; the parent
                # replays them again to report them, as it does a worker's walk failure)
                for f in replay_walk_database(plan, database):
                    stop_event.set()
                    queue.put(("db-failure", w, lvl, f.invariant, f.cause, f.reason))
                if stop():
                    break
            if args.mode == "walk":
                def found(wf, lvl=lvl):
                    stop_event.set()
                    queue.put(("walk-failure", w, lvl, wf.seed, wf.run_index, wf.violation.invariant,
                               wf.violation.cause, wf.violation.reason, wf.steps))
                rs = fuzz_walk(plan, share, args, disp, seed=seed, stop=stop, on_failure=found, database=database)
            else:
                rs = fuzz_hypothesis(plan, share, args, disp, seed=seed, stop=stop, database=database,
                                     may_shrink=False)
                for r in rs:
                    for f in r.failures:
                        stop_event.set()
                        queue.put(("hyp-failure", w, lvl, f.invariant, f.cause, f.reason, _failure_msg(f)))
            for r in rs:
                for e in r.errors:
                    queue.put(("error", w, lvl, e))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, never lost
        queue.put(("error", w, "?", f"worker {w}: {T.exc_text(e)}"))
    finally:
        done.set()
        th.join()
        send_progress()
        queue.put(("done", w, {"ready_s": ready[0] if ready and t_fork is not None else None,
                               "start_cpu_s": ready[1] if ready else None,
                               "cpu_s": time.process_time() - c_start}))


def main_jobs(args, jobs: int) -> int:
    """``--jobs N``: N workers, one display, failures shrunk once in the parent."""
    import contextlib
    import multiprocessing as mp
    import queue as queue_mod

    from rich.live import Live

    from memspec.invariants import runner
    from memspec.invariants.discovery import resolve

    target = args.target or args.target_opt or DEFAULT_TARGET
    budget = _budget(args)
    console = _report_console()
    disp = Display(target, args.mode, budget, jobs)
    try:
        tref = resolve(target)
        kind = runner._kind_of(tref, args.capacity)
    except Exception as e:  # noqa: BLE001
        console.print(f"[red]cannot fuzz {escape_markup(T.terminal(target, 300))}[/]: {escape_markup(T.terminal(T.exc_text(e)))}")
        return 2
    levels = [tref.mutant.level] if tref.mutant is not None and args.level == "all" else runner.levels_for(kind, args.level)
    if not levels:
        console.print(f"[red]level {args.level!r} does not apply to a target of kind {kind!r}[/]")
        return 2
    argv = _argv_of(args)
    # fork where the platform has it (workers start in milliseconds with the
    # parent's imports; no thread has been started yet), spawn elsewhere
    fork = "fork" in mp.get_all_start_methods() and sys.platform == "linux"
    ctx = mp.get_context("fork" if fork else "spawn")
    # With fork, the plans are made once here, before the fork, and every
    # worker inherits them: N workers do not each import the engine, probe
    # the target and learn the spec's protocols (a spec-only walk) again --
    # the same work `--jobs 1` does once, in the same process as its fuzzing.
    built: dict | None = _build_plans(tref, args, levels) if fork else None
    q = ctx.Queue()
    stop_event = ctx.Event()
    t_fork = time.perf_counter()
    c_fork = time.process_time()
    disp.parent_setup_cpu = c_fork - disp.c0
    procs = [ctx.Process(target=_worker, args=(w, argv, budget, q, stop_event, built, t_fork if fork else None),
                         daemon=True, name=f"memspec-fuzz-{w}") for w in range(jobs)]
    for p in procs:
        p.start()
    starts: dict[int, dict] = {}
    walk_failures: list[tuple] = []
    db_failures: dict[str, dict[str, tuple]] = {}
    hyp_failures: dict[str, dict[str, tuple]] = {}
    errors: dict[str, list[str]] = {}
    running = set(range(jobs))
    live = contextlib.nullcontext() if args.quiet else Live(disp, console=console, refresh_per_second=4,
                                                              transient=False, redirect_stdout=False)
    with live:
        while running:
            try:
                msg = q.get(timeout=0.5)
            except queue_mod.Empty:
                dead = [w for w in running if not procs[w].is_alive() and procs[w].exitcode is not None]
                for w in dead:  # a worker that died without saying "done" (killed, crashed interpreter)
                    if q.empty():
                        errors.setdefault(levels[0], []).append(f"worker {w} died (exit {procs[w].exitcode})")
                        running.discard(w)
                continue
            kind_ = msg[0]
            if kind_ == "progress":
                _, w, lvl, steps, covered, outcomes, n_actions, secs = msg
                disp.workers.setdefault(w, {})[lvl] = (steps, covered, outcomes, n_actions)
                disp.worker_seconds.setdefault(w, {})[lvl] = secs
            elif kind_ == "walk-failure":
                walk_failures.append(msg[1:])
                disp.failures.append(f"{msg[2]} {msg[5]} [{msg[6]}] {str(msg[7])[:90]} (worker {msg[1]}; shrinking)")
            elif kind_ == "db-failure":
                db_failures.setdefault(msg[2], {}).setdefault(msg[3], (msg[4], msg[5]))
                disp.failures.append(f"{msg[2]} {msg[3]} [{msg[4]}] {str(msg[5])[:90]} (replayed from the database)")
            elif kind_ == "hyp-failure":
                hyp_failures.setdefault(msg[2], {}).setdefault(msg[3], (msg[4], msg[5], msg[6] if len(msg) > 6 else None))
                disp.failures.append(f"{msg[2]} {msg[3]} [{msg[4]}] {str(msg[5])[:90]} (worker {msg[1]}; shrinking)")
            elif kind_ == "error":
                errors.setdefault(msg[2], []).append(msg[3])
            elif kind_ == "done":
                running.discard(msg[1])
                if len(msg) > 2 and isinstance(msg[2], dict):
                    starts[msg[1]] = msg[2]
    for p in procs:
        p.join(timeout=10)
    fuzz_seconds = time.perf_counter() - disp.t0
    parent_cpu = time.process_time() - c_fork
    secs = disp.worker_seconds
    workers = [{"worker": w, "seed": args.seed + w * SEED_STRIDE,
                "steps": sum(v[0] for v in disp.workers.get(w, {}).values()),
                "seconds": sum(secs.get(w, {}).values()), **starts.get(w, {})} for w in range(jobs)]
    disp.parent_cpu = parent_cpu
    w_cpu = [w.get("cpu_s") for w in workers]
    disp.fuzz_cpu = sum(w_cpu) if all(isinstance(x, (int, float)) for x in w_cpu) else None
    steps = disp.steps()
    # the parent shrinks and reports each distinct failure once
    results = _shrink_in_parent(tref, args, levels, walk_failures, hyp_failures, disp, db_failures)
    for lvl, errs in errors.items():
        r = next((r for r in results if r.level == lvl), None)
        if r is None:
            r = runner.PlanResult(target, lvl, None)
            results.append(r)
        r.errors += list(dict.fromkeys(errs))
    return _report(console, args, disp, results, steps, jobs=jobs, workers=workers, fuzz_seconds=fuzz_seconds)


def _build_plans(tref, args, levels) -> dict:
    """level -> the plan the workers will fuzz (or the error making it raised,
    which the worker of that level reports as ``--jobs 1`` would)."""
    import hypothesis.database  # noqa: F401 - imported once, before the fork (0.1-0.2 s CPU a process)
    import hypothesis.stateful  # noqa: F401

    from memspec.invariants import runner, walk  # noqa: F401

    out: dict = {}
    for lvl in levels:
        try:
            out[lvl] = runner.make_plan(tref, lvl, capacity=args.capacity, timeout=args.timeout, machine=args.machine)
        except Exception as e:  # noqa: BLE001 - reported by the workers, as --jobs 1 reports it
            out[lvl] = e
    return out


def _shrink_in_parent(tref, args, levels, walk_failures, hyp_levels, disp, db_levels=None) -> list:
    from memspec.invariants import runner, walk
    from memspec.invariants import harness as H

    shrink = _ShrinkBudget(args.shrink_seconds)
    disp.shrink = shrink
    database = open_database(args.db, args.db_readonly_github, args.db_artifact)
    results = []
    plans: dict[str, object] = {}

    def plan_of(lvl):
        if lvl not in plans:
            plans[lvl] = runner.make_plan(tref, lvl, capacity=args.capacity, timeout=args.timeout, machine=args.machine)
        return plans[lvl]

    by_level: dict[str, dict[str, tuple]] = {}
    for (w, lvl, seed, run_index, inv, cause, reason, steps) in walk_failures:
        by_level.setdefault(lvl, {}).setdefault(inv, (seed, run_index, cause, reason, steps))
    for lvl in db_levels or {}:
        by_level.setdefault(lvl, {})
    for lvl, fails in by_level.items():
        plan = plan_of(lvl)
        res = runner.PlanResult(plan.target, lvl, plan)
        guard = H.CallGuard(plan.timeout, plan.guard_mode)
        from_db = (db_levels or {}).get(lvl, {})
        if from_db:   # a worker replayed these from the database: replay them here to report them
            got = {f.invariant: f for f in replay_walk_database(plan, database)}
            for inv, (cause, reason) in from_db.items():
                res.failures.append(got.get(inv) or runner.Failure(
                    plan.target, lvl, inv, cause, f"{reason} (not reproduced on replay: nondeterministic target?)",
                    [], None))
        for inv, (seed, run_index, cause, reason, steps) in fails.items():
            if inv in from_db:
                continue
            guard.install()
            try:
                v, choices = walk.walk_once(plan, walk.run_seed(seed, run_index), args.steps or 200, guard)
            finally:
                guard.uninstall()
            if v is None:  # the target did not fail again on replay: report the worker's finding as is
                res.failures.append(runner.Failure(plan.target, lvl, inv, cause,
                                                   f"{reason} (not reproduced on replay: nondeterministic target?)",
                                                   [], steps))
                continue
            wf = walk.WalkFailure(v, seed, run_index, choices, steps)
            res.failures.append(_shrink_walk_failure(plan, wf, database, shrink))
        runner.write_repros(res, args.out, target_name=plan.target)
        results.append(res)
    for lvl in levels:
        if lvl not in hyp_levels:
            continue
        plan = plan_of(lvl)
        # replay the shared database (the workers saved their failures there) and shrink
        from hypothesis import Phase

        sets = runner.hypothesis_settings("fuzz", examples=1, steps=args.steps, db=None, database=database,
                                          phases=[Phase.reuse, Phase.shrink])
        with shrink.take():
            res = runner.run_hypothesis(plan, sets, shrink_seconds=max(shrink.left, 0.0))
        # each worker saved its failure in the shared database: the replay
        # can shrink two of them to the same counterexample; report it once
        once: dict = {}
        for f in res.failures:
            once.setdefault((f.invariant, f.cause, f.reason), f)
        res.failures = list(once.values())
        got = {f.invariant for f in res.failures}
        extra = [_worker_failure(plan, inv, cause, reason, sent)
                 for inv, (cause, reason, sent) in hyp_levels[lvl].items() if inv not in got]
        if extra:
            res.failures = runner._dedupe(res.failures + extra)
        runner.write_repros(res, args.out, target_name=plan.target)
        results.append(res)
    disp.failures[:] = [f"{r.level} {f.invariant} [{f.cause}] {f.reason[:90]}" for r in results for f in r.failures]
    return results


def _failure_msg(f) -> dict:
    """What a worker sends the parent of a failure besides its invariant,
    cause and reason: its steps (as the supervised child sends them: action,
    arguments as a literal, choices, outcome, bound ids), the example's
    device capacity, the steps to detection and the consequences."""
    from memspec.invariants import harness as H
    from memspec.invariants import runner

    trace = f.trace if all(isinstance(ts, H.TraceStep) for ts in f.trace) else []
    return {"trace": runner._trace_msg(trace), "capacity": f.capacity, "detected": f.steps_to_detection,
            "consequences": [str(c) for c in f.consequences]}


def _worker_failure(plan, inv: str, cause: str, reason: str, sent) -> "runner.Failure":
    """A worker's failure that the replay of the shared database did not give
    back: one found by a later pass of ``run_hypothesis`` (the actions the
    earlier failures ended on left out: its examples are saved under that
    pass's key, which a replay of the whole table never reads), or a target
    that does not fail the same way twice.  The worker's own steps are
    replayed here on a fresh target, arguments drawn again by the spec from
    the recorded choices: a failure again is one like any other, minimized
    and diagnosed here (its first failing check may be a symptom, a figure,
    that the worker's diagnosis blamed on the rule broken: the diagnosis
    here does the same); otherwise it is reported as the worker saw it, with
    the worker's steps, marked not reproduced."""
    from memspec.invariants import harness as H
    from memspec.invariants import runner

    sent = sent if isinstance(sent, dict) else {}
    trace = runner._trace_from(sent.get("trace") or [])
    cap = sent.get("capacity") if type(sent.get("capacity")) is int else None
    det = sent.get("detected") if type(sent.get("detected")) is int else None
    cons = [str(c) for c in sent.get("consequences") or []]
    if trace:
        guard = H.CallGuard(plan.timeout, plan.guard_mode)
        saved = (plan.stats, plan.on_call, plan.on_step)
        plan.stats, plan.on_call, plan.on_step = H.Stats(), None, None
        try:
            v = runner._replay_steps(plan, guard, cap, [(ts.action, list(ts.choices)) for ts in trace])
        except Exception:  # noqa: BLE001 - steps the spec cannot replay here: not reproduced
            v = None
        finally:
            plan.stats, plan.on_call, plan.on_step = saved
        if v is not None:
            f = runner.Failure(plan.target, plan.level, v.invariant, v.cause, v.reason, list(v.trace), det,
                               capacity=cap, consequences=cons)
            return runner.diagnose(plan, runner.minimize(plan, f))
    return runner.Failure(plan.target, plan.level, inv, cause,
                          f"{reason} (not reproduced on replay: nondeterministic target?)", trace, det,
                          capacity=cap, consequences=cons)


def _argv_of(args) -> list[str]:
    """The worker's command line: the parent's options (jobs left out)."""
    out = []
    target = args.target or args.target_opt
    if target:
        out.append(target)
    for name in ("minutes", "seconds", "seed", "db", "db_readonly_github", "db_artifact", "mode", "level", "steps",
                 "timeout", "shrink_seconds", "capacity", "out", "machine"):
        v = getattr(args, name)
        if v is not None:
            out += [f"--{name.replace('_', '-')}", str(v)]
    out.append("--quiet")
    return out


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
