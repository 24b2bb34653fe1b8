"""``memspec conform [TARGET ...]``: run the spec against allocator targets.

For each target (default ``reference``) and level (``mechanism``, ``system``;
``caching`` for a caching-allocator target) the harness drives the spec and
the target side by side under Hypothesis, then prints one row per invariant:
PASS, FAIL (with the shortest counterexample written as a standalone Python
reproduction under ``--out``), N/A with the reason, or UNTESTED with the
reason (the actions that declare it did not succeed ``--min-accepted``
times: not a pass).  Exit status 1 on any FAIL or ERROR, and on any
UNTESTED unless ``--allow-untested``.

Output paths (``--json``, ``--junit``, ``--html``, ``--out``, ``--db``) are
checked before the run (exit status 2, one line).  Text from the target is
made safe once where the results arrive (bounded, encodable; control
characters shown escaped on the terminal).  An output that cannot be written
after the run (a full disk) is said in one line on stderr, the others are
still written, and the exit status is 2.

A TARGET is an entry point of the group ``memspec.targets`` (see ``memspec
targets``), ``package.module:attr`` naming a factory, or ``mutant:NAME``.
"""

from __future__ import annotations

from memspec.invariants.report import console as _report_console

import argparse
import shlex
import sys

from rich.markup import escape

from memspec.argtypes import invariant_id, non_negative_int, out_dir, out_file, positive_int, seconds
from memspec.commands._output import Terminal, write_output

from memspec.invariants.discovery import DEFAULT_TARGET
from memspec.invariants.levels import LEVELS


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memspec conform", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*", metavar="TARGET", help=f"targets to check (default: {DEFAULT_TARGET})")
    p.add_argument("--examples", type=positive_int, default=None, help="runs (fresh target each) per level (default: the profile's; ci 200)")
    p.add_argument("--steps", type=positive_int, default=None, help="steps per run (default: the profile's; ci 50)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: derandomized under ci)")
    p.add_argument("--json", metavar="FILE", type=out_file, help="write the results as JSON")
    p.add_argument("--junit", metavar="FILE", type=out_file, help="write the results as JUnit XML")
    p.add_argument("--html", metavar="FILE", type=out_file, help="write a self-contained HTML report (verdicts, coverage, "
                   "each failure replayed step by step with pictures of the spec's state)")
    p.add_argument("--db", metavar="DIR", type=out_dir, help="Hypothesis example database directory (failures are replayed first)")
    p.add_argument("--level", choices=(*LEVELS, "all"), default="all")
    p.add_argument("--profile", choices=("ci", "dev", "fuzz"), default="ci")
    p.add_argument("--timeout", type=seconds, default=5.0, help="per-call timeout in seconds (a hang is a FAIL)")
    p.add_argument("--capacity", type=positive_int, default=None, help="device capacity in bytes passed to the factory")
    p.add_argument("--out", type=out_dir, default="memspec-out/repro", help="directory for reproduction files")
    p.add_argument("--machine", default=None, help=argparse.SUPPRESS)  # package.module:attr of another spec machine
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--allow-untested", action="store_true",
                   help="exit 0 although some invariant is UNTESTED (its actions never succeeded often enough)")
    p.add_argument("--min-accepted", type=non_negative_int, default=None,
                   help="accepting steps each declaring action needs for a PASS (default 3)")
    p.add_argument("--until", metavar="INV", action="append", type=invariant_id, default=None,
                   help="end a level's run once this invariant has failed (no further masked pass; repeatable)")
    p.add_argument("--corpus", action="store_true", help="replay the Z3-synthesized traces (memspec.invariants.corpus)")
    return p


def _corpus(targets: list[str]) -> int:
    """``--corpus``: the replays run the targets' code (import, factory,
    steps), so they run in a supervised child, as a conformance run does: a
    target that exits (``sys.exit(0)`` and ``os._exit(0)`` included),
    crashes or hangs in a call is one line on stderr and exit status 1,
    never a green run."""
    from memspec.invariants import text as T
    from memspec.invariants.corpus import main as corpus_main
    from memspec.invariants.guard import supervise

    def work(ch) -> None:  # type: ignore[no-untyped-def]
        try:
            rc = corpus_main(targets)
        finally:
            sys.stdout.flush()   # the child leaves by os._exit: its buffered rows would be lost
        ch.send({"t": "rc", "rc": rc if type(rc) is int else 1})

    end = supervise(work, timeout=60.0)
    rcs = [m.get("rc") for m in end.messages if m.get("t") == "rc"]
    fatal = [m.get("error") for m in end.messages if m.get("t") == "fatal"]
    if end.death is None and not fatal and len(rcs) == 1 and type(rcs[0]) is int and 0 <= rcs[0] <= 255:
        return rcs[0]
    why = f"the replay raised {T.safe_str(fatal[0], 2000)}" if fatal else (end.death or "no result")
    print(f"memspec conform --corpus {T.terminal(' '.join(targets), 500)}: {T.terminal(why, 2000)}",
          file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.corpus:
        return _corpus(args.targets or [DEFAULT_TARGET])
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from memspec.invariants import report, runner
    from memspec.invariants import text as T

    console = _report_console(stderr=False)
    targets = args.targets or [DEFAULT_TARGET]
    examples = args.examples  # None: the profile's (ci: 200 runs of 50 steps per level)
    steps = args.steps
    all_results: dict[str, list] = {}
    extra = {} if args.min_accepted is None else {"min_accepted": args.min_accepted}
    if args.until:
        extra["until"] = tuple(args.until)
    progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(), TextColumn("{task.fields[info]}"),
                        TimeElapsedColumn(), console=console, transient=True, disable=args.quiet)
    with progress:
        for target in targets:
            state = {"task": None, "n": 0}

            def on_plan(plan, target=target, state=state):
                from memspec.invariants.runner import hypothesis_settings

                total = examples or hypothesis_settings(args.profile).max_examples
                state["task"] = progress.add_task(T.terminal(f"{target} [{plan.level}]", 300), total=total, info="")

            def on_step(plan, state=state):  # called with the child's progress, a few times a second
                if state["task"] is not None:
                    st = plan.stats
                    progress.update(state["task"], completed=min(st.examples, progress.tasks[-1].total or st.examples),
                                    info=f"{st.steps} steps, {len(st.outcomes)} outcomes, {st.failures_seen} failing")

            all_results[target] = runner.conform(
                target, args.level, profile=args.profile, examples=examples, steps=steps, seed=args.seed,
                db=args.db, capacity=args.capacity, timeout=args.timeout, out_dir=args.out,
                on_step=on_step, on_plan=on_plan, machine=args.machine, **extra)
    T.clean_results(all_results)   # the boundary: every target-derived string bounded and encodable, once
    term = Terminal("memspec conform")
    ok = True
    untested = 0
    total_steps = 0
    total_secs = 0.0
    for target, results in all_results.items():
        term.run(lambda target=target, results=results: report.print_table(console, target, results))
        for r in results:
            ok = ok and r.ok
            untested += len(r.untested)
            total_steps += r.stats.steps
            total_secs += r.stats.seconds
            for f in r.failures:
                if f.repro:
                    term.run(lambda f=f, r=r: console.print(
                        f"  [red]FAIL {escape(T.terminal(f.invariant, 200))}[/] ({r.level}, {f.shrunk_length} steps): "
                        + escape(T.terminal(f"{shlex.quote(sys.executable)} {shlex.quote(str(f.repro))}")),
                        soft_wrap=True))   # one line: the command can be copied
    rate = total_steps / total_secs if total_secs else 0.0
    term.run(lambda: console.print(f"steps run: {total_steps}; {rate:.0f} steps/s; {total_secs:.1f} s"))
    written = True
    if args.json:
        written &= write_output("memspec conform", "--json", args.json, lambda: report.write_json(args.json, all_results))
    if args.junit:
        written &= write_output("memspec conform", "--junit", args.junit,
                                lambda: report.write_junit(args.junit, all_results))
    if args.html:
        from memspec.invariants import html_report

        if write_output("memspec conform", "--html", args.html, lambda: html_report.write_html(
                args.html, all_results, html_report.parameters_from_args(args, (
                    "level", "profile", "examples", "steps", "seed", "capacity", "timeout", "db")))):
            term.run(lambda: console.print(escape(f"report: {T.terminal(args.html)}")))
        else:
            written = False
    if not ok:
        term.run(lambda: console.print("[red]conformance FAILED[/]"))
        return 1 if written and not term.failed else 2
    if untested:
        term.run(lambda: console.print(
            f"[magenta]{untested} invariant row(s) UNTESTED[/] (not a pass"
            + ("; allowed by --allow-untested)" if args.allow_untested else "; --allow-untested to accept)")))
        return 2 if not written or term.failed else 0 if args.allow_untested else 1
    term.run(lambda: console.print("[green]all invariants hold[/]"))
    return 0 if written and not term.failed else 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
