"""``memspec mutants [--only NAME ...]``: run every planted-bug mutant of
:mod:`memspec.invariants.mutants` under the CI profile and print the kill
table: mutant, expected invariant, the invariant blamed (and the others the
run failed), steps to detection, shrunk length, wall and CPU seconds.
Progress shows done/total and the elapsed time.  Exit status 1 if any
mutant survives or is blamed on another invariant than the one it targets.

Mechanism- and system-level mutants run on a small device (``--capacity``,
default 16 MiB) so that the refusal paths (OutOfMemory, GrantDenied) are
reached within a CI budget; caching targets keep their own device.
"""

from __future__ import annotations

from memspec.invariants.report import console as _report_console

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from memspec.argtypes import out_dir, out_file, positive_int
from memspec.spec.api import MiB


@dataclass
class Kill:
    """One mutant's row.  ``blame`` is the invariant the run reported first
    (the failure found at the fewest steps, after the runner's diagnosis of
    the rule broken: :func:`~memspec.invariants.runner.diagnose`); ``also``
    the other invariants the run failed, and the checks the diagnosis
    listed as consequences of the blamed rule."""

    name: str
    expected: str
    level: str
    blame: str | None = None
    also: list = field(default_factory=list)          # other invariants failed, in the order found
    consequences: list = field(default_factory=list)  # the blamed failure's symptoms ("S10 [observation] ...")
    steps_to_detection: int | None = None
    shrunk_length: int | None = None
    seconds: float = 0.0       # wall time
    cpu_seconds: float = 0.0   # CPU time of the supervised run (its children)
    errors: list = field(default_factory=list)
    repro: str | None = None

    @property
    def caught_by(self) -> list:
        return ([self.blame] if self.blame else []) + [i for i in self.also if i != self.blame]

    @property
    def verdict(self) -> str:
        if self.errors and not self.blame:
            return "ERROR"
        if not self.blame:
            return "SURVIVED"
        return "KILLED" if self.blame == self.expected else "WRONG"

    def as_json(self) -> dict:
        return {"name": self.name, "expected": self.expected, "level": self.level, "blame": self.blame,
                "also_failed": list(self.also), "consequences": list(self.consequences),
                "caught_by": self.caught_by, "steps_to_detection": self.steps_to_detection,
                "shrunk_length": self.shrunk_length, "seconds": round(self.seconds, 2),
                "cpu_seconds": round(self.cpu_seconds, 2), "errors": list(self.errors), "repro": self.repro,
                "verdict": self.verdict}


def kill_from_json(d: Any) -> Kill:
    """A row of a ``--json`` file read back (plain data, checked field by
    field; anything else is a ValueError)."""
    if not isinstance(d, dict) or not all(isinstance(d.get(k), str) for k in ("name", "expected", "level")):
        raise ValueError(f"not a kill-table row: {str(d)[:80]}")

    def num(k: str) -> Any:
        v = d.get(k)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def strs(k: str) -> list:
        v = d.get(k)
        return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []

    k = Kill(d["name"], d["expected"], d["level"], blame=d["blame"] if isinstance(d.get("blame"), str) else None,
             also=strs("also_failed"), consequences=strs("consequences"), errors=strs("errors"),
             repro=d["repro"] if isinstance(d.get("repro"), str) else None)
    k.steps_to_detection = int(num("steps_to_detection")) if num("steps_to_detection") is not None else None
    k.shrunk_length = int(num("shrunk_length")) if num("shrunk_length") is not None else None
    k.seconds, k.cpu_seconds = float(num("seconds") or 0.0), float(num("cpu_seconds") or 0.0)
    return k


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the supervised run)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def blame_of(failures: list) -> tuple:
    """``(blamed failure or None, the others)``: the failure the run found
    at the fewest steps is the blame (ties: the order reported), after any
    failure that is *likely* another's consequence (``likely_cause``: the
    other's rule breaks in its state)."""
    if not failures:
        return None, []
    order = sorted(range(len(failures)), key=lambda i: (getattr(failures[i], "likely_cause", None) is not None,
                                                        failures[i].steps_to_detection is None,
                                                        failures[i].steps_to_detection or 0, i))
    return failures[order[0]], [failures[i] for i in order[1:]]


def run_mutant(m, *, examples: int, steps: int, capacity: int | None, out_dir: str | None, profile: str = "ci",
               seed: int | None = None, timeout: float = 5.0, shrink_seconds: float | None = -1) -> Kill:
    from memspec.invariants import runner

    t0, c0 = time.perf_counter(), _cpu()
    cap = capacity if m.level in ("mechanism", "system") else None  # caching targets keep their own device
    (r,) = runner.conform(f"mutant:{m.name}", "all", profile=profile, examples=examples, steps=steps,
                          capacity=cap, out_dir=out_dir, seed=seed, timeout=timeout, shrink_seconds=shrink_seconds,
                          until=(m.invariant,))   # killed: no further pass (what was found first stays the blame)
    k = Kill(m.name, m.invariant, m.level, seconds=time.perf_counter() - t0, cpu_seconds=_cpu() - c0,
             errors=list(r.errors))
    first, rest = blame_of(r.failures)
    if first is not None:
        k.blame = first.invariant
        k.also = list(dict.fromkeys(f.invariant for f in rest if f.invariant != first.invariant))
        k.consequences = list(first.consequences)
        k.steps_to_detection, k.shrunk_length, k.repro = first.steps_to_detection, first.shrunk_length, first.repro
    return k


def kill_table(kills: list) -> "Any":
    """The kill table, 100 columns wide at most: mutant, level, expected,
    blame, also failed, steps to detection, shrunk length, seconds (wall
    and CPU), verdict."""
    from rich.table import Table

    t = Table(title="memspec mutants: kill table (steps: to detection; shrunk: steps)", width=100)
    t.add_column("mutant", overflow="fold", ratio=3)
    for col in ("level", "exp", "blame", "also"):
        t.add_column(col, overflow="fold")
    for col in ("steps", "shrunk", "wall s", "cpu s", "verdict"):
        t.add_column(col, no_wrap=True)
    style = {"KILLED": "green", "WRONG": "yellow", "SURVIVED": "bold red", "ERROR": "bold red"}
    for k in kills:
        t.add_row(k.name, k.level[:4], k.expected, k.blame or "-", ",".join(k.also) or "-",
                  str(k.steps_to_detection or "-"), str(k.shrunk_length or "-"), f"{k.seconds:.0f}",
                  f"{k.cpu_seconds:.0f}", f"[{style[k.verdict]}]{k.verdict}[/]")
    return t


def summary(kills: list) -> dict:
    """Killed count, median steps to detection and median shrunk length
    (of the blamed failure, over every mutant a failure was reported for),
    total seconds."""
    killed = [k for k in kills if k.verdict == "KILLED"]
    caught = [k for k in kills if k.blame is not None]
    det = [k.steps_to_detection for k in caught if k.steps_to_detection is not None]
    shr = [k.shrunk_length for k in caught if k.shrunk_length is not None]
    return {"killed": len(killed), "total": len(kills),
            "median_steps_to_detection": statistics.median(det) if det else None,
            "median_shrunk_length": statistics.median(shr) if shr else None,
            "seconds": round(sum(k.seconds for k in kills), 1),
            "cpu_seconds": round(sum(k.cpu_seconds for k in kills), 1)}


def T_terminal(s, limit=2000):
    from memspec.invariants.text import terminal

    return terminal(s, limit)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="memspec mutants", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="run only this mutant (repeatable)")
    p.add_argument("--examples", type=positive_int, default=100)
    p.add_argument("--steps", type=positive_int, default=40)
    p.add_argument("--capacity", type=positive_int, default=16 * MiB, help="device capacity for the mutants' targets")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--out", type=out_dir, default="memspec-out/repro")
    p.add_argument("--json", metavar="FILE", type=out_file)
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--merge", action="append", default=[], metavar="FILE",
                   help="print one kill table from the --json files of runs made in pieces (repeatable); runs nothing")
    args = p.parse_args(argv)
    from rich.markup import escape

    from memspec.invariants.mutants import all_mutants

    console = _report_console()
    if args.merge:
        import json

        kills = []
        try:
            for path in args.merge:
                with open(path) as fh:
                    data = json.load(fh)
                rows = data.get("mutants") if isinstance(data, dict) else None
                if not isinstance(rows, list):
                    raise ValueError(f"{path}: no 'mutants' list (not a memspec mutants --json file)")
                kills += [kill_from_json(d) for d in rows]
        except (OSError, ValueError) as e:
            console.print(f"[red]memspec mutants --merge: {escape(str(e))}[/]")
            return 2
        return _results(console, kills, args)
    ms = [m for m in all_mutants() if not args.only or m.name in args.only]
    if args.list:
        for m in ms:
            console.print(f"{m.name:36s} {m.invariant:4s} {m.level:9s} {escape(m.description)}")
        return 0
    if not ms:
        console.print(f"[red]no mutant named {', '.join(args.only)}[/]")
        return 2
    kills = []
    t_start = time.perf_counter()
    for i, m in enumerate(ms, 1):
        console.print(f"  [{i - 1}/{len(ms)} done, {time.perf_counter() - t_start:.0f} s] {m.name} "
                      f"({m.invariant}, {m.level})...", end="")
        k = run_mutant(m, examples=args.examples, steps=args.steps, capacity=args.capacity, out_dir=args.out,
                       seed=args.seed)
        console.print(f" {k.verdict}" + (f" (blamed {k.blame})" if k.verdict == "WRONG" else "")
                      + f" in {k.seconds:.1f} s")
        kills.append(k)
    console.print(f"  [{len(kills)}/{len(ms)} done, {time.perf_counter() - t_start:.0f} s]")
    return _results(console, kills, args)


def _results(console: Any, kills: list, args: Any) -> int:
    """Print the kill table and the medians, write ``--json``; the exit status."""
    from rich.markup import escape

    console.print(kill_table(kills))
    s = summary(kills)
    killed = s["killed"]
    console.print(f"killed {killed}/{len(kills)} with the expected blame; median steps to detection "
                  f"{s['median_steps_to_detection'] if s['median_steps_to_detection'] is not None else '-'}; "
                  f"median shrunk length "
                  f"{s['median_shrunk_length'] if s['median_shrunk_length'] is not None else '-'}; "
                  f"{s['seconds']:.0f} s wall, {s['cpu_seconds']:.0f} s CPU")
    for k in kills:
        for c in k.consequences:
            console.print(f"[dim]{k.name}[/]: {k.blame} blamed; first shown as " + escape(T_terminal(c, 200)))
        for e in k.errors:
            console.print(f"[yellow]{k.name}[/]: " + escape(T_terminal(e)))
    if args.json:
        import json

        from memspec.commands._output import write_output
        from memspec.invariants import text as T
        from memspec.invariants.report import write_file

        doc = {"mutants": [k.as_json() for k in kills], "summary": s,
               "settings": {"profile": "ci", "examples": args.examples, "steps": args.steps,
                            "capacity": args.capacity, "seed": args.seed}}
        if not write_output("memspec mutants", "--json", args.json,
                            lambda: write_file(args.json, json.dumps(T.clean(doc), indent=2, default=str) + "\n")):
            return 2
    return 0 if killed == len(kills) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
