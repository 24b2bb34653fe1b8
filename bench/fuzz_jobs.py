"""Benchmark 6: ``memspec fuzz --jobs 2`` against ``--jobs 1``, same run.

Both run ``memspec fuzz reference --mode walk`` as a subprocess for the same
budget on the same machine, back to back; each reports its own figures as
JSON (``--json``).  The rate is the total steps of all workers divided by the
command's fuzzing wall time (for ``--jobs 2`` that includes starting the
worker interpreters: what a user gets).  Target: ``--jobs 2`` >= 1.8x
``--jobs 1`` -- reachable only with two idle cores.

``--jobs 1`` runs twice, before and after ``--jobs 2``, and the baseline is
the mean of the two (a drift of the machine's speed over the three runs
cancels; this VM's speed drifts 20% between two identical 15 s walks a
minute apart).  The note also gives the ratio against the faster of the two,
which noise alone biases low.  Each command's CPU seconds (its own and its workers',
from ``RUSAGE_CHILDREN``) go in the note: CPU seconds / wall seconds is the
number of cores the command actually got, and steps per CPU second of
``--jobs 2`` over ``--jobs 1`` is the parallel efficiency, which does not
depend on how many cores were free (1.0: the workers cost nothing extra).

A third row states the **CPU-normalized** ratio: the wall-clock ratio
``--jobs 2`` would reach with a core per process, computed from CPU
seconds alone.  Each command reports the CPU of its fuzzing proper
(``fuzz_cpu_s``: the walks; with ``--jobs 2`` its workers', their start
included); the rest of its CPU (``RUSAGE_CHILDREN``: interpreter, imports,
target, plans, display, report) is its serial part ``s``.  With a core per
process each fuzzes the budget ``B`` at its measured steps per CPU second
``r``, so ``rate = jobs x r x B / (s + B)`` and the ratio is
``2 x (r2 / r1) x (s1 + B) / (s2 + B)``: it counts every CPU second either
command spent, and is what the code scales to whatever the load; the
wall-clock row is what this machine gave in this run.  The note of the
``--jobs 2`` row says where a worker's time went before it fuzzed: seconds
from the fork to its first step and the CPU seconds that took (the plans
and imports are made once in the parent, before the fork), the parent's
CPU seconds while the workers ran (queue and display), and how evenly the
workers' steps split.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import FAILED, Row, unavailable

ROOT = Path(__file__).resolve().parents[1]
TARGET = "reference"


def _fuzz(jobs: int, seconds: float, tmp: Path) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / f"jobs{jobs}.json"
    cmd = [sys.executable, "-m", "memspec", "fuzz", TARGET, "--mode", "walk", "--seconds", str(seconds),
           "--jobs", str(jobs), "--db", str(tmp / f"db{jobs}"), "--out", str(tmp / f"repro{jobs}"), "--quiet",
           "--json", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds * 4 + 120,
                       env={**os.environ, "PYTHONHASHSEED": "0"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0 or not out.is_file():
        raise RuntimeError(f"memspec fuzz --jobs {jobs} exited {p.returncode}: {(p.stdout + p.stderr)[-300:]}")
    doc = json.loads(out.read_text())
    # the command and its workers (waited for inside it), user + system
    doc["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return doc


def _mean_run(a: dict, b: dict) -> dict:
    """The two bracketing ``--jobs 1`` runs as one: steps, seconds and CPU
    seconds averaged (``a`` itself when both are the same run: ``--quick``)."""
    if a is b:
        return a
    keys = ("steps", "fuzz_s", "cpu_s", "fuzz_cpu_s")
    out = {k: (a[k] + b[k]) / 2 for k in keys if isinstance(a.get(k), (int, float)) and isinstance(b.get(k), (int, float))}
    return {**a, **out}


def run(quick: bool = False) -> list[Row]:
    seconds = 3.0 if quick else 20.0
    names = ("fuzz --jobs 1 step rate (walk, reference)", "fuzz --jobs 2 step rate (walk, reference)",
             "fuzz jobs scaling, CPU-normalized (2 vs 1)")
    tgt = ">= 1.8x --jobs 1"
    try:
        with tempfile.TemporaryDirectory(prefix="memspec-bench-jobs-") as d:
            one_a = _fuzz(1, seconds, Path(d) / "a")
            two = _fuzz(2, seconds, Path(d) / "b")
            one_b = one_a if quick else _fuzz(1, seconds, Path(d) / "c")
    except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as e:
        return [unavailable(n, "x" if i == 2 else "steps/s", tgt if i else "", str(e), status=FAILED)
                for i, n in enumerate(names)]
    one = _mean_run(one_a, one_b)
    r1 = one["steps"] / one["fuzz_s"]
    r2 = two["steps"] / two["fuzz_s"]
    ratio = r2 / r1
    fast = max(one_a["steps"] / one_a["fuzz_s"], one_b["steps"] / one_b["fuzz_s"])
    per = ", ".join(f"w{w['worker']} {w['steps'] / w['seconds']:,.0f}/s" for w in two["workers"] if w["seconds"])
    cpus = os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    eff = (two["steps"] / two["cpu_s"]) / (one["steps"] / one["cpu_s"]) if two["cpu_s"] and one["cpu_s"] else float("nan")
    ws = two["workers"]
    starts = [w.get("ready_s") for w in ws if w.get("ready_s") is not None]
    start_cpu = [w.get("start_cpu_s") for w in ws if w.get("start_cpu_s") is not None]
    w_steps = [w["steps"] for w in ws]
    even = min(w_steps) / max(w_steps) if w_steps and max(w_steps) else float("nan")
    # per CPU second, the workers' seeds compared apart from the CPU the scheduler gave each
    w_rate = [w["steps"] / w["cpu_s"] for w in ws if w.get("cpu_s")]
    even_cpu = min(w_rate) / max(w_rate) if w_rate and max(w_rate) else float("nan")
    where = (f"worker start (fork to first step): {', '.join(f'{x:.2f}' for x in starts)} s wall, "
             f"{', '.join(f'{x:.3f}' for x in start_cpu)} s CPU; parent CPU while fuzzing "
             f"{two.get('parent_cpu_s') or 0:.2f} s, before the fork {two.get('parent_setup_cpu_s') or 0:.2f} s; "
             f"workers' steps min/max {even:.2f}, steps per CPU second min/max {even_cpu:.2f}") if starts else \
        "worker start not reported"
    f1, f2, budget = one.get("fuzz_cpu_s"), two.get("fuzz_cpu_s"), one.get("budget_s") or seconds
    if f1 and f2 and one["cpu_s"] and two["cpu_s"]:
        # (c1, c2: per CPU second; r1, r2 stay the wall-clock rates of the rows)
        c1, c2 = one["steps"] / f1, two["steps"] / f2
        s1, s2 = max(one["cpu_s"] - f1, 0.0), max(two["cpu_s"] - f2, 0.0)
        normalized = 2 * (c2 / c1) * (s1 + budget) / (s2 + budget)
        how = (f"2 x (r2 / r1) x (s1 + B) / (s2 + B) with fuzzing steps per CPU second r1 {c1:,.0f} (--jobs 1) and "
               f"r2 {c2:,.0f} (--jobs 2, per worker CPU second), serial CPU s1 {s1:.2f} s and s2 {s2:.2f} s, "
               f"B {budget:g} s")
    else:  # commands that did not report their fuzzing CPU: the efficiency alone
        normalized = 2 * eff
        how = "2 x steps per CPU second of --jobs 2 / --jobs 1 (the commands did not report their fuzzing CPU)"
    return [
        Row(names[0], r1, "steps/s", None, "", None,
            f"baseline (mean of two runs bracketing --jobs 2: {one_a['steps'] / one_a['fuzz_s']:,.0f} and "
            f"{one_b['steps'] / one_b['fuzz_s']:,.0f}/s); {one['steps']:,.0f} steps in {one['fuzz_s']:.1f} s; "
            f"{one['cpu_s'] / one['fuzz_s']:.2f} cores' CPU",
            extra={"runs": [one_a, one_b]}),
        Row(names[1], r2, "steps/s", ratio, tgt, ratio >= 1.8,
            f"{two['steps']} steps in {two['fuzz_s']:.1f} s incl. worker start; per worker while stepping: {per}; "
            f"got {two['cpu_s'] / two['fuzz_s']:.2f} cores' CPU; steps per CPU second vs --jobs 1: {eff:.2f}; "
            f"vs the faster --jobs 1 run: {r2 / fast:.2f}x; "
            f"{cpus} cores, load average {load:.1f}; {where}",
            extra={"json": two, "parallel_efficiency": eff, "ratio_vs_faster": r2 / fast}),
        Row(names[2], normalized, "x", normalized, tgt + " (CPU-normalized)", normalized >= 1.8,
            f"{how}: the ratio with a core per process; the wall ratio of this run was {ratio:.2f} at "
            f"load average {load:.1f}",
            extra={"parallel_efficiency": eff, "wall_ratio": ratio, "load": load}),
    ]
