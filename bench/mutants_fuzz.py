"""The mutant catalog under time-budgeted fuzzing, next to its CI-profile kill table (issues 16, 35).

``python -m bench.mutants_fuzz [--mode hypothesis|walk] [--until-failure] [--jobs 2] [--minutes 2]
[--only NAME ...] [--baseline DIR] [--json FILE] [--ci FILE]``

Runs ``memspec fuzz mutant:NAME --mode MODE --jobs J --minutes M --json F``
(and ``--until-failure`` when given: a killed mutant then stops at its first
failure, shrunk) for every mutant of ``memspec mutants --list`` (a
subprocess each: ``--level all``, the kill table's 16 MiB device for
mechanism- and system-level mutants), one after the other, and prints per
mutant whether a failure was found, the invariant of the first failure (the
blame), the command's wall time and its CPU seconds (``RUSAGE_CHILDREN``:
the workers and the shrinker included), and the fuzz's own figures from its
``--json`` (the shrink's wall seconds, the steps run).  Each command gets an
empty example database of its own (a counterexample saved by an earlier run
would be replayed first, and the mutant found at once).  The summary: the
count killed, the count killed with the expected blame, and the median and
the worst CPU seconds per killed mutant (the time to kill).

``--baseline DIR``: another checkout (e.g. ``git worktree add --detach DIR
COMMIT``) run the same way, mutant by mutant, interleaved with this one (a
drift of the machine hits both sides alike); each side imports its own
``memspec`` (a shadow package on ``PYTHONPATH``, run from a directory that is
not a checkout, as ``bench.oracle`` does), and the summary is given per side.

``--ci FILE``: a ``memspec mutants --json`` kill table (the CI profile) to
compare with, mutant by mutant: killed by both, by fuzz only, by the CI
profile only, by neither.

A figure, not an assertion: the fuzzers' seeds are drawn per run (walk mode:
``--seed``, 0 by default, so both sides of ``--baseline`` walk the same
runs).  The first failure any worker finds stops the command (with ``--jobs
1`` only under ``--until-failure``), so a killed mutant costs its time to
detection plus the shrink, a survivor the whole budget.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: the kill table's device for mechanism- and system-level mutants (``memspec mutants --capacity``)
CAPACITY = 16 * 1024 * 1024


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def fuzz_command(name: str, level: str, tmp: str, *, mode: str, jobs: int, minutes: float, seed: int,
                 until_failure: bool) -> list[str]:
    """The ``memspec fuzz`` command line of one mutant (its files under ``tmp``)."""
    cmd = [sys.executable, "-m", "memspec", "fuzz", f"mutant:{name}", "--mode", mode, "--jobs", str(jobs),
           "--minutes", str(minutes), "--seed", str(seed), "--json", os.path.join(tmp, "fuzz.json"), "--quiet",
           "--out", os.path.join(tmp, "repro"), "--db", os.path.join(tmp, "db")]
    if until_failure:
        cmd.append("--until-failure")
    if level in ("mechanism", "system"):
        cmd += ["--capacity", str(CAPACITY)]
    return cmd


def run_one(name: str, level: str, jobs: int, minutes: float, *, mode: str = "hypothesis", seed: int = 0,
            until_failure: bool = False, pythonpath: str | None = None, cwd: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="memspec-mfuzz-") as tmp:
        out = os.path.join(tmp, "fuzz.json")
        cmd = fuzz_command(name, level, tmp, mode=mode, jobs=jobs, minutes=minutes, seed=seed,
                           until_failure=until_failure)
        env = None
        if pythonpath is not None:
            env = dict(os.environ)
            env.pop("MEMSPEC_NATIVE", None)   # pure Python on both sides
            env["PYTHONPATH"] = pythonpath
        c0, t0 = _children_cpu(), time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
        row = {"name": name, "level": level, "exit": p.returncode, "wall_s": round(wall, 2),
               "cpu_s": round(cpu, 2), "blame": None, "failures": 0}
        try:
            with open(out) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            row["error"] = f"no --json report ({e}); stderr: {p.stderr.strip()[-300:]}"
            return row
        fails = data.get("failures") or []
        row["failures"] = len(fails)
        row["steps"] = data.get("steps")
        row["shrink_s"] = data.get("shrink_s")
        if fails:
            row["blame"] = fails[0].get("invariant")
            row["shrunk_steps"] = fails[0].get("steps")
        return row


def summary(rows: list[dict]) -> dict:
    """Killed, killed with the expected blame, and the CPU seconds per killed mutant (median, worst)."""
    killed = [r for r in rows if r["blame"]]
    right = [r for r in killed if r["blame"] == r["expected"]]
    cpus = sorted(r["cpu_s"] for r in killed)
    walls = sorted(r["wall_s"] for r in killed)
    return {"mutants": len(rows), "killed": len(killed), "expected_blame": len(right),
            "median_cpu_s": statistics.median(cpus) if cpus else None, "worst_cpu_s": cpus[-1] if cpus else None,
            "median_wall_s": statistics.median(walls) if walls else None,
            "worst_wall_s": walls[-1] if walls else None,
            "worst_cpu_mutant": max(killed, key=lambda r: r["cpu_s"])["name"] if killed else None}


#: the checkout's folders the editable install maps into the package (pyproject.toml's package-dir)
_FOLDERS = ("spec", "reference", "cuda_impl", "invariants", "adapters")


def shadow_package(tree: Path, out: Path) -> Path:
    """A folder whose ``memspec`` package is ``tree``'s: a copy of its
    ``memspec/`` (links to the folders already there, e.g. made by hand in a
    worktree, left out) with the checkout's folders linked in, as the
    editable install maps them (as ``bench.oracle.shadow_package``).  First
    on ``PYTHONPATH``, from a directory that is not a checkout, ``import
    memspec`` is ``tree``'s."""
    pkg = out / "memspec"
    shutil.copytree(tree / "memspec", pkg, ignore=shutil.ignore_patterns("__pycache__", *_FOLDERS))
    for d in _FOLDERS:
        if (tree / d).is_dir():
            os.symlink(tree / d, pkg / d)
    return out


def _which(pythonpath: str | None, cwd: str | None) -> str:
    """The file ``memspec.invariants.engine`` is imported from on one side (which code runs)."""
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath is not None else None
    p = subprocess.run([sys.executable, "-c", "import os, memspec.invariants.engine as e; print(os.path.realpath(e.__file__))"],
                       capture_output=True, text=True, env=env, cwd=cwd)
    return (p.stdout.strip() or p.stderr.strip()[-200:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("hypothesis", "walk"), default="hypothesis", help="passed to memspec fuzz")
    ap.add_argument("--until-failure", action="store_true", help="passed to memspec fuzz")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--baseline", metavar="DIR", help="another checkout, run interleaved with this one")
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
    with tempfile.TemporaryDirectory(prefix="memspec-mfuzz-trees-") as trees:
        # side -> (PYTHONPATH, cwd); None: this interpreter's own import path
        sides: dict[str, tuple[str | None, str | None]] = {"this": (None, None)}
        if args.baseline:
            root = Path(__file__).resolve().parent.parent
            base = Path(args.baseline).resolve()
            if not (base / "memspec" / "__init__.py").is_file():
                ap.error(f"--baseline {args.baseline} is not a memspec checkout")
            sides = {"this": (str(shadow_package(root, Path(trees) / "this")), trees),
                     "baseline": (str(shadow_package(base, Path(trees) / "baseline")), trees)}
        for side, (pp, cwd) in sides.items():
            print(f"{side}: memspec.invariants.engine from {_which(pp, cwd)}", flush=True)
        rows: dict[str, list[dict]] = {side: [] for side in sides}
        t0 = time.perf_counter()
        for i, m in enumerate(ms, 1):
            for side, (pp, cwd) in sides.items():
                row = run_one(m.name, m.level, args.jobs, args.minutes, mode=args.mode, seed=args.seed,
                              until_failure=args.until_failure, pythonpath=pp, cwd=cwd)
                row["expected"] = m.invariant
                if m.name in ci:
                    row["ci_blame"] = ci[m.name].get("blame")
                rows[side].append(row)
                print(f"[{i}/{len(ms)} {time.perf_counter() - t0:6.0f}s]"
                      + (f" {side:8s}" if len(sides) > 1 else "")
                      + f" {m.name:36s} {m.invariant:4s} "
                      f"fuzz: {row['blame'] or 'survived':8s} {row['wall_s']:6.1f}s wall {row['cpu_s']:6.1f}s CPU"
                      + (f" (shrink {row['shrink_s']:.1f}s wall)" if row.get("shrink_s") else "")
                      + (f"  ci: {row.get('ci_blame') or 'survived'}" if m.name in ci else "")
                      + (f"  ERROR {row['error']}" if "error" in row else ""), flush=True)
    flags = f"--mode {args.mode} --jobs {args.jobs} --minutes {args.minutes:g} --seed {args.seed}" \
        + (" --until-failure" if args.until_failure else "")
    sums = {}
    for side, rs in rows.items():
        s = sums[side] = summary(rs)
        fmt = (lambda v: "-" if v is None else f"{v:.2f}")
        print(f"{side + ': ' if len(sides) > 1 else ''}fuzz {flags}: {s['killed']}/{s['mutants']} killed, "
              f"{s['expected_blame']} with the expected blame; CPU s per killed mutant: median "
              f"{fmt(s['median_cpu_s'])}, worst {fmt(s['worst_cpu_s'])} ({s['worst_cpu_mutant']}); wall s: median "
              f"{fmt(s['median_wall_s'])}, worst {fmt(s['worst_wall_s'])}")
    if len(sides) > 1 and sums["baseline"]["median_cpu_s"] and sums["this"]["median_cpu_s"] is not None:
        print(f"this/baseline: median CPU {sums['this']['median_cpu_s'] / sums['baseline']['median_cpu_s']:.2f}, "
              f"worst CPU {sums['this']['worst_cpu_s'] / sums['baseline']['worst_cpu_s']:.2f}")
    print(f"{time.perf_counter() - t0:.0f} s in all")
    if ci:
        rs = rows["this"]
        both = [r for r in rs if r["blame"] and r.get("ci_blame")]
        fuzz_only = [r["name"] for r in rs if r["blame"] and r["name"] in ci and not r.get("ci_blame")]
        ci_only = [r["name"] for r in rs if not r["blame"] and r.get("ci_blame")]
        print(f"vs the CI profile: both {len(both)}, fuzz only {fuzz_only or 'none'}, CI only {ci_only or 'none'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": args.mode, "jobs": args.jobs, "minutes": args.minutes, "seed": args.seed,
                       "until_failure": args.until_failure, "baseline": args.baseline,
                       "summary": sums, "rows": rows["this"],
                       **({"baseline_rows": rows["baseline"]} if "baseline" in rows else {})}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
