"""The mutant catalog under time-budgeted fuzzing, next to its CI-profile kill table (issue 16).

``python -m bench.mutants_fuzz [--jobs 2] [--minutes 2] [--only NAME ...] [--json FILE] [--ci FILE]``

Runs ``memspec fuzz mutant:NAME --jobs J --minutes M --json F`` for every
mutant of ``memspec mutants --list`` (a subprocess each: default mode,
``--level all``, the kill table's 16 MiB device for mechanism- and
system-level mutants), one after the other, and prints per mutant whether a
failure was found, the invariant of the first failure (the blame), the
command's wall time and its CPU seconds (``RUSAGE_CHILDREN``: the workers
included).  Each command gets an empty example database of its own (a
counterexample saved by an earlier run would be replayed first, and the
mutant found at once).  ``--ci FILE``: a ``memspec mutants --json`` kill table (the CI
profile) to compare with, mutant by mutant: killed by both, by fuzz only,
by the CI profile only, by neither.

A figure, not an assertion: the fuzzers' seeds are drawn per run.  The
first failure any worker finds stops the command, so a killed mutant costs
its time to detection plus the shrink, a survivor the whole budget.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

#: the kill table's device for mechanism- and system-level mutants (``memspec mutants --capacity``)
CAPACITY = 16 * 1024 * 1024


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_one(name: str, level: str, jobs: int, minutes: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="memspec-mfuzz-") as tmp:
        out = os.path.join(tmp, "fuzz.json")
        cmd = [sys.executable, "-m", "memspec", "fuzz", f"mutant:{name}", "--jobs", str(jobs),
               "--minutes", str(minutes), "--json", out, "--quiet", "--out", os.path.join(tmp, "repro"),
               "--db", os.path.join(tmp, "db")]
        if level in ("mechanism", "system"):
            cmd += ["--capacity", str(CAPACITY)]
        c0, t0 = _children_cpu(), time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
        row = {"name": name, "level": level, "exit": p.returncode, "wall_s": round(wall, 1),
               "cpu_s": round(cpu, 1), "blame": None, "failures": 0}
        try:
            with open(out) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            row["error"] = f"no --json report ({e}); stderr: {p.stderr.strip()[-300:]}"
            return row
        fails = data.get("failures") or []
        row["failures"] = len(fails)
        if fails:
            row["blame"] = fails[0].get("invariant")
        return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--ci", metavar="FILE", help="a `memspec mutants --json` kill table to compare with")
    args = ap.parse_args(argv)
    from memspec.invariants.mutants import all_mutants

    ms = [m for m in all_mutants() if not args.only or m.name in args.only]
    if args.only and len(ms) != len(set(args.only)):
        known = {m.name for m in all_mutants()}
        ap.error(f"unknown mutant(s): {', '.join(sorted(set(args.only) - known))}")
    ci: dict[str, dict] = {}
    if args.ci:
        with open(args.ci) as f:
            d = json.load(f)
        for k in (d.get("mutants") if isinstance(d, dict) else d) or []:
            if isinstance(k, dict) and isinstance(k.get("name"), str):
                ci[k["name"]] = k
    rows = []
    t0 = time.perf_counter()
    for i, m in enumerate(ms, 1):
        row = run_one(m.name, m.level, args.jobs, args.minutes)
        row["expected"] = m.invariant
        if m.name in ci:
            row["ci_blame"] = ci[m.name].get("blame")
        rows.append(row)
        print(f"[{i}/{len(ms)} {time.perf_counter() - t0:6.0f}s] {m.name:36s} {m.invariant:4s} "
              f"fuzz: {row['blame'] or 'survived':8s} {row['wall_s']:6.1f}s wall {row['cpu_s']:6.1f}s CPU"
              + (f"  ci: {row.get('ci_blame') or 'survived'}" if m.name in ci else "")
              + (f"  ERROR {row['error']}" if "error" in row else ""), flush=True)
    killed = [r for r in rows if r["blame"]]
    right = [r for r in killed if r["blame"] == r["expected"]]
    print(f"fuzz --jobs {args.jobs} --minutes {args.minutes:g}: {len(killed)}/{len(rows)} killed, "
          f"{len(right)} with the expected blame; {time.perf_counter() - t0:.0f} s in all")
    if ci:
        both = [r for r in rows if r["blame"] and r.get("ci_blame")]
        fuzz_only = [r["name"] for r in rows if r["blame"] and r["name"] in ci and not r.get("ci_blame")]
        ci_only = [r["name"] for r in rows if not r["blame"] and r.get("ci_blame")]
        print(f"vs the CI profile: both {len(both)}, fuzz only {fuzz_only or 'none'}, CI only {ci_only or 'none'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"jobs": args.jobs, "minutes": args.minutes, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
