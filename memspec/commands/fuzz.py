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

Isolation, as in ``memspec conform``: the target's import, its factory and
every step run only in supervised children (``invariants/fuzz.py``, on
``guard.supervise``); this process reads what they say.  A target that exits
(any status), raises ``BaseException``, crashes, aborts, hangs (also in C) or
stops itself -- in its factory or in a step -- is a FAIL (with the steps so
far and a reproduction) or an ERROR, and the exit status is 1.  A failure a
worker found is sent at once, and a dead worker's last steps come back
through its shared step log, so nothing it found is lost.

Parallel jobs (``--jobs N``, default: all cores): N supervised workers fuzz
with distinct seeds (worker ``w`` starts at ``seed + w * 1,000,003``) and
share one example database (Hypothesis's directory database is safe for
concurrent writers).  Workers do not shrink: the first failure any worker
finds stops them all; a supervised shrinker replays it (Hypothesis mode: from
the shared database; walk mode: the worker's seed and run; a dead worker:
its last steps) and shrinks it; each distinct failure is reported once.  One
live display sums the workers.  Each worker plans the target itself, in its
own child.

The budget: the command ends within ``N`` minutes plus the shrink of one
failure (``--shrink-seconds``, default 30 s, all failures of a run together)
plus the unit of work in flight at the deadline -- in walk mode one run of
``--steps`` steps, in Hypothesis mode one round (rounds are sized from the
measured time per example to at most ``ROUND_SECONDS`` = min(10 s, budget/10,
at least 1 s) each, and the first round is 2 examples).  The deadline is
checked between rounds (Hypothesis) and between runs (walk); with ``--jobs``
add the workers' start.  "The shrink" is Hypothesis's: it takes no new
shrink step after ``--shrink-seconds``, then replays the shrunk example once;
every call inside a unit of work is bounded by ``--timeout`` (the target's
import and factory by max(``--timeout``, 20 s)).  Whatever the target does,
each child is killed at the latest at that bound plus the build allowance,
one ``--timeout`` and 30 s (``invariants.fuzz.hard_bound``).

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
from memspec.invariants import fuzz as engine
from memspec.invariants import text as T
from memspec.invariants.discovery import DEFAULT_TARGET
from memspec.invariants.fuzz import (ROUND_SECONDS, SEED_STRIDE, SHRINK_SECONDS,  # noqa: F401 - re-exported
                                     lost_saves, open_database)
from memspec.invariants.report import console as _report_console


def escape_markup(text: str) -> str:
    from rich.markup import escape

    return escape(text)


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
    p.add_argument("--build-timeout", type=positive_float, default=None,
                   help="seconds the target's import and factory may take (default: max(--timeout, 20))")
    p.add_argument("--shrink-seconds", type=_non_negative_float, default=SHRINK_SECONDS,
                   help="time to shrink failures, all of a run together (default %(default)s)")
    p.add_argument("--capacity", type=positive_int, default=None)
    p.add_argument("--out", type=out_dir, default="memspec-out/repro", help="directory for reproduction files")
    p.add_argument("--json", metavar="FILE", type=out_file, default=None, help="write the run's figures and failures as JSON")
    p.add_argument("--machine", default=None, help=argparse.SUPPRESS)
    p.add_argument("--until-failure", action="store_true",
                   help="end at the first failure (shrunk, with its reproduction) instead of fuzzing on to the "
                        "deadline; with --jobs > 1 the first failure always stops every worker")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--html", metavar="FILE", type=out_file, help="write a self-contained HTML report of the run")
    return p


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
        self.shrink_used = 0.0
        self.failures: list[str] = []
        #: --jobs: worker -> level -> (steps, covered action names, outcomes seen, total actions)
        self.workers: dict[int, dict[str, tuple[int, frozenset, int, int]]] = {}
        #: --jobs: worker -> level -> seconds fuzzed
        self.worker_seconds: dict[int, dict[str, float]] = {}

    def steps(self) -> int:
        return sum(v[0] for w in self.workers.values() for v in w.values())

    def __rich__(self):
        from rich.markup import escape
        from rich.table import Table

        jobs = f", {self.jobs} jobs" if self.jobs > 1 else ""
        t = Table(title=f"memspec fuzz {escape(self.target)} ({self.mode}{jobs})", show_header=False)
        el = time.perf_counter() - self.t0
        steps = self.steps()
        t.add_row("elapsed", f"{el:.0f} / {self.budget:.0f} s")
        t.add_row("steps", f"{steps}  ({steps / el if el else 0:.0f} steps/s)")
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


def options(args, jobs: int) -> engine.FuzzOptions:
    """The engine's options from the command line."""
    return engine.FuzzOptions(
        target=args.target or args.target_opt or DEFAULT_TARGET, mode=args.mode, level=args.level,
        seconds=_budget(args), seed=args.seed, jobs=jobs, db=args.db, db_readonly_github=args.db_readonly_github,
        db_artifact=args.db_artifact, steps=args.steps, timeout=args.timeout, shrink_seconds=args.shrink_seconds,
        capacity=args.capacity, out=args.out, machine=args.machine,
        build_timeout=args.build_timeout, until_failure=args.until_failure)


def main(argv: list[str]) -> int:
    import contextlib

    args = parser().parse_args(argv)
    if args.target and args.target_opt and args.target != args.target_opt:
        parser().error(f"two different targets: {args.target!r} and --target {args.target_opt!r}")
    jobs = args.jobs or min(default_jobs(), jobs_cap())
    if args.db:
        why = probe_db(args.db)
        if why is not None:
            say(f"memspec fuzz: --db {args.db} cannot persist anything ({why}): "
                "the counterexamples of this run will not be saved")
    from memspec import profiles as _profiles  # noqa: F401 - the "fuzz" profile, before the forks

    opts = options(args, jobs)
    console = _report_console()
    disp = Display(opts.target, args.mode, opts.seconds, jobs)

    def on_progress(w: int, levels: dict) -> None:
        disp.workers[w] = {lvl: v[:4] for lvl, v in levels.items()}
        disp.worker_seconds[w] = {lvl: v[4] for lvl, v in levels.items()}

    if args.quiet:   # no live display: rich.live is not even imported
        live = contextlib.nullcontext()
    else:
        from rich.live import Live

        live = Live(disp, console=console, refresh_per_second=4, transient=False, redirect_stdout=False)
    with live:
        got = engine.run(opts, on_progress=on_progress, note=disp.failures.append)
    disp.parent_cpu, disp.parent_setup_cpu, disp.fuzz_cpu = got.parent_cpu, got.parent_setup_cpu, got.fuzz_cpu
    disp.shrink_used = got.shrink_used
    disp.failures[:] = [f"{r.level} {f.invariant} [{f.cause}] {f.reason[:90]}" for r in got.results for f in r.failures]
    return _report(console, args, disp, got.results, got.steps, jobs=jobs, workers=got.workers if jobs > 1 else [],
                   fuzz_seconds=got.fuzz_seconds if jobs > 1 else None)


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
            term.run(lambda e=e, r=r: console.print(f"[yellow]ERROR[/] ({r.level}) " + escape(T.terminal(e)),
                                                    soft_wrap=True))   # one line
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
            "bound_s": disp.budget + args.shrink_seconds + engine.round_cap(disp.budget),
            "shrink_s": disp.shrink_used,
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
