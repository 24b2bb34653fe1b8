"""Benchmark 5: wall time of ``memspec prove`` (Z3) and ``memspec contracts``
(CrossHair), each run as a subprocess the way a user runs it.

Targets: prove <= 60 s, contracts <= 120 s.  A run is killed at 1.5x its
target (the row then reads "killed", not met); a run that exits non-zero is
reported as failed with its exit status and no figure.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import subprocess
import sys
import time

from bench.common import FAILED, NOT_RUN, Row, unavailable

COMMANDS = (("prove", 60.0, "Z3 proofs"), ("contracts", 120.0, "CrossHair contracts"))


def _command_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(f"memspec.commands.{name}") is not None
    except ImportError:
        return False


def run(quick: bool = False) -> list[Row]:
    rows = []
    for name, target_s, what in COMMANDS:
        row_name = f"memspec {name} wall time"
        tgt = f"<= {target_s:.0f} s"
        if quick:
            rows.append(unavailable(row_name, "s", tgt, "--quick (the full run takes up to a minute or two)", status=NOT_RUN))
            continue
        if not _command_present(name):
            rows.append(unavailable(row_name, "s", tgt, f"memspec.commands.{name} has not landed"))
            continue
        limit = 1.5 * target_s
        env = dict(os.environ)
        env.setdefault("PYTHONHASHSEED", "0")
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "memspec", name], capture_output=True, text=True,
                                  timeout=limit, env=env)
        except subprocess.TimeoutExpired:
            dt = time.perf_counter() - t0
            rows.append(Row(row_name, dt, "s", dt / target_s, tgt, False, f"killed at {limit:.0f} s ({what})"))
            continue
        dt = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
        if proc.returncode != 0:
            # a run that failed measured nothing: say so, no figure
            r = unavailable(row_name, "s", tgt, f"memspec {name} exited {proc.returncode} after {dt:.1f} s: {tail[0][:100]}",
                            status=FAILED)
            r.extra = {"returncode": proc.returncode, "output_tail": (proc.stdout + proc.stderr)[-2000:]}
            rows.append(r)
            continue
        note = f"cpu {cpu:.0f} s; last line: {tail[0][:90]}"
        met = dt <= target_s
        rows.append(Row(row_name, dt, "s", dt / target_s, tgt, met, note,
                        extra={"returncode": proc.returncode, "cpu_s": cpu, "output_tail": (proc.stdout + proc.stderr)[-2000:]}))
    return rows
