"""``memspec mutants [--only NAME ...]``: run every planted-bug mutant of
:mod:`memspec.invariants.mutants` under the CI profile and print the kill
table: mutant, expected invariant, caught by, steps to detection, shrunk
length.  Exit status 1 if any mutant survives or is caught only by another
invariant than the one it targets.

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
    name: str
    expected: str
    level: str
    caught_by: list = field(default_factory=list)   # invariant ids, expected first when present
    steps_to_detection: int | None = None
    shrunk_length: int | None = None
    seconds: float = 0.0
    errors: list = field(default_factory=list)
    repro: str | None = None

    @property
    def verdict(self) -> str:
        if self.errors and not self.caught_by:
            return "ERROR"
        if not self.caught_by:
            return "SURVIVED"
        return "KILLED" if self.expected in self.caught_by else "WRONG"


def run_mutant(m, *, examples: int, steps: int, capacity: int | None, out_dir: str | None, profile: str = "ci",
               seed: int | None = None, timeout: float = 5.0) -> Kill:
    from memspec.invariants import runner

    t0 = time.perf_counter()
    cap = capacity if m.level in ("mechanism", "system") else None  # caching targets keep their own device
    (r,) = runner.conform(f"mutant:{m.name}", "all", profile=profile, examples=examples, steps=steps,
                          capacity=cap, out_dir=out_dir, seed=seed, timeout=timeout)
    k = Kill(m.name, m.invariant, m.level, seconds=time.perf_counter() - t0, errors=list(r.errors))
    fails = sorted(r.failures, key=lambda f: (f.invariant != m.invariant, f.steps_to_detection or 0))
    k.caught_by = [f.invariant for f in fails]
    if fails:
        f = fails[0]
        k.steps_to_detection, k.shrunk_length, k.repro = f.steps_to_detection, f.shrunk_length, f.repro
    return k


def kill_table(kills: list) -> "Any":
    """The kill table, 100 columns wide at most: mutant, level, expected,
    caught by, steps to detection, shrunk length, seconds, verdict."""
    from rich.table import Table

    t = Table(title="memspec mutants: kill table (steps: to detection; shrunk: steps)", width=100)
    t.add_column("mutant", overflow="fold")
    for col in ("level", "expected", "caught by"):
        t.add_column(col, overflow="fold")
    for col in ("steps", "shrunk", "seconds", "verdict"):
        t.add_column(col, no_wrap=True)
    style = {"KILLED": "green", "WRONG": "yellow", "SURVIVED": "bold red", "ERROR": "bold red"}
    for k in kills:
        t.add_row(k.name, k.level, k.expected, ", ".join(k.caught_by) or "-", str(k.steps_to_detection or "-"),
                  str(k.shrunk_length or "-"), f"{k.seconds:.1f}", f"[{style[k.verdict]}]{k.verdict}[/]")
    return t


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
    args = p.parse_args(argv)
    from rich.markup import escape

    from memspec.invariants.mutants import all_mutants

    console = _report_console()
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
        console.print(f"  [{i}/{len(ms)}, {time.perf_counter() - t_start:.0f} s] {m.name} ({m.invariant}, {m.level})...",
                      end="")
        k = run_mutant(m, examples=args.examples, steps=args.steps, capacity=args.capacity, out_dir=args.out,
                       seed=args.seed)
        console.print(f" {k.verdict} in {k.seconds:.1f} s")
        kills.append(k)
    console.print(kill_table(kills))
    killed = [k for k in kills if k.verdict == "KILLED"]
    det = [k.steps_to_detection for k in killed if k.steps_to_detection is not None]
    shr = [k.shrunk_length for k in killed if k.shrunk_length is not None]
    console.print(f"killed {len(killed)}/{len(kills)}; median steps to detection "
                  f"{statistics.median(det) if det else '-'}; median shrunk length {statistics.median(shr) if shr else '-'}; "
                  f"{sum(k.seconds for k in kills):.0f} s")
    for k in kills:
        for e in k.errors:
            console.print(f"[yellow]{k.name}[/]: " + escape(e))
    if args.json:
        import json

        with open(args.json, "w") as fh:
            json.dump([k.__dict__ | {"verdict": k.verdict} for k in kills], fh, indent=2)
    return 0 if len(killed) == len(kills) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
