"""Benchmark 6: ``memspec fuzz --jobs 2`` against ``--jobs 1``, same run.

Both run ``memspec fuzz reference --mode walk`` as a subprocess for the same
budget on the same machine, back to back; each reports its own figures as
JSON (``--json``).  The rate is the total steps of all workers divided by the
command's fuzzing wall time (for ``--jobs 2`` that includes starting the
worker interpreters: what a user gets).  Target: ``--jobs 2`` >= 1.8x
``--jobs 1`` -- reachable only with two idle cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import FAILED, Row, unavailable

ROOT = Path(__file__).resolve().parents[1]
TARGET = "reference"


def _fuzz(jobs: int, seconds: float, tmp: Path) -> dict:
    out = tmp / f"jobs{jobs}.json"
    cmd = [sys.executable, "-m", "memspec", "fuzz", TARGET, "--mode", "walk", "--seconds", str(seconds),
           "--jobs", str(jobs), "--db", str(tmp / f"db{jobs}"), "--out", str(tmp / f"repro{jobs}"), "--quiet",
           "--json", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds * 4 + 120,
                       env={**os.environ, "PYTHONHASHSEED": "0"})
    if p.returncode != 0 or not out.is_file():
        raise RuntimeError(f"memspec fuzz --jobs {jobs} exited {p.returncode}: {(p.stdout + p.stderr)[-300:]}")
    return json.loads(out.read_text())


def run(quick: bool = False) -> list[Row]:
    seconds = 3.0 if quick else 20.0
    names = ("fuzz --jobs 1 step rate (walk, reference)", "fuzz --jobs 2 step rate (walk, reference)")
    tgt = ">= 1.8x --jobs 1"
    try:
        with tempfile.TemporaryDirectory(prefix="memspec-bench-jobs-") as d:
            one = _fuzz(1, seconds, Path(d))
            two = _fuzz(2, seconds, Path(d))
    except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as e:
        return [unavailable(n, "steps/s", tgt if i else "", str(e), status=FAILED) for i, n in enumerate(names)]
    r1 = one["steps"] / one["fuzz_s"]
    r2 = two["steps"] / two["fuzz_s"]
    ratio = r2 / r1
    per = ", ".join(f"w{w['worker']} {w['steps'] / w['seconds']:,.0f}/s" for w in two["workers"] if w["seconds"])
    cpus = os.cpu_count()
    return [
        Row(names[0], r1, "steps/s", None, "", None, f"baseline; {one['steps']} steps in {one['fuzz_s']:.1f} s",
            extra={"json": one}),
        Row(names[1], r2, "steps/s", ratio, tgt, ratio >= 1.8,
            f"{two['steps']} steps in {two['fuzz_s']:.1f} s incl. worker start; per worker while stepping: {per}; "
            f"{cpus} cores (shared)", extra={"json": two}),
    ]
