"""Benchmark rows of issue 35: the oracle's cost, per target and level.

The oracle -- the spec's step and the match of the implementation's answer,
the invariants, observations and data checks after every step -- is what a
fuzzing run spends its CPU on.  Each row is the random walk
(``memspec fuzz --mode walk``, :func:`memspec.invariants.walk.walk`: seed 0,
runs of 50 steps, every check) on one target and level, in walk steps per
CPU second of the process that walks (``time.process_time``; best of the
runs: noise only ever adds time):

* ``reference`` at the mechanism and the system level;
* the C example arena (``adapters/c/example_arena.c`` built with the
  machine's C compiler, through the C ABI: ``c:PATH``), mechanism level;
* ``reference-caching`` (the caching level).

Every walk runs in a child process (same interpreter, same workload, the
package imported from a shadow of the tree: :func:`shadow_package`), the
steps timed after a warm-up walk.  With ``MEMSPEC_BENCH_BASELINE=DIR`` (a
checkout of an older commit, e.g. ``git worktree add /tmp/base <commit>``)
the same walks also run on that tree, interleaved with this one's, and the
row's ratio is this tree's rate over the baseline's (the note gives both);
without it the ratio is empty.  The note gives the phase split of a step
(:func:`bench.profile.walk_phases`, CPU us/step, this tree) and the load
average.  The split is wall time scaled to CPU: on a loaded machine (a load
of 10 on 2 cores) a phase's figure moves by +-50% from one run to the next;
instructions per step (valgrind's callgrind, ``bench/README.md``) are the
figures to compare then.  No target: the figures say where the oracle's time goes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import FAILED, NOT_AVAILABLE, Row, unavailable

ROOT = Path(__file__).resolve().parent.parent
ARENA = "c-arena"
#: (target, level) of the rows, in table order (``c-arena``: the C example arena, built here)
CASES = (("reference", "mechanism"), ("reference", "system"), (ARENA, "mechanism"), ("reference-caching", "caching"))
BASELINE_ENV = "MEMSPEC_BENCH_BASELINE"
#: the packages the import root ``memspec`` maps to folders of the checkout (pyproject's package-dir)
_FOLDERS = ("spec", "reference", "cuda_impl", "invariants", "adapters")

_CHILD = r"""
import json, sys, time
from memspec.invariants import runner, walk
import memspec.invariants.engine as E
t, lv, n, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
plan = runner.make_plan(t, lv)
walk.walk(plan, max_steps=min(n, 200), run_length=50, seed=1, stop_on_failure=False)   # warm-up
best, problems = 0.0, []
for _ in range(reps):
    plan = runner.make_plan(t, lv)
    c0 = time.process_time()
    res = walk.walk(plan, max_steps=n, run_length=50, seed=0, stop_on_failure=False)
    cpu = time.process_time() - c0
    best = max(best, res.steps / cpu if cpu > 0 else 0.0)
    problems = [f.violation.invariant for f in res.failures] + list(res.errors)
print("ORACLE-JSON " + json.dumps({"rate": best, "steps": res.steps, "problems": problems, "engine": E.__file__}))
"""


def _steps(quick: bool) -> tuple[int, int, int]:
    """(walk steps per run, timed runs per side, phase-split steps)."""
    return (100, 1, 60) if quick else (3000, 3, 1500)


def build_arena(out: Path) -> tuple[str | None, str]:
    """``(c:PATH target, "")`` of the C example arena built into ``out``, or ``(None, why not)``."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc/gcc) to build adapters/c/example_arena.c"
    c_dir = ROOT / "adapters" / "c"
    lib = out / "libexample_arena.so"
    p = subprocess.run([cc, "-shared", "-fPIC", "-O2", f"-I{c_dir}", "-o", str(lib), str(c_dir / "example_arena.c"),
                        "-ldl"], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        return None, f"building example_arena.c failed: {(p.stderr.strip().splitlines() or ['?'])[-1][:120]}"
    return f"c:{lib}", ""


def shadow_package(tree: Path, out: Path) -> Path:
    """A folder whose ``memspec`` package is ``tree``'s (a copy of its
    ``memspec/`` with the checkout's folders linked in, as the editable
    install maps them): put it first on ``PYTHONPATH`` and run from a
    directory that is not a checkout, and ``import memspec`` is ``tree``'s."""
    pkg = out / "memspec"
    shutil.copytree(tree / "memspec", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for d in _FOLDERS:
        if (tree / d).is_dir():
            os.symlink(tree / d, pkg / d)
    return out


def _walk_in_child(path: Path, cwd: Path, target: str, level: str, n: int, reps: int) -> dict:
    env = dict(os.environ)
    env.pop("MEMSPEC_NATIVE", None)   # pure Python on both sides
    env["PYTHONPATH"] = str(path)
    p = subprocess.run([sys.executable, "-c", _CHILD, target, level, str(n), str(reps)], capture_output=True,
                       text=True, env=env, cwd=cwd, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("ORACLE-JSON ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError((p.stderr.strip().splitlines() or ["?"])[-1][:150])
    return json.loads(lines[-1][len("ORACLE-JSON "):])


def _phases(target: str, level: str, steps: int) -> dict | None:
    try:
        from bench.profile import walk_phases

        return walk_phases(level, steps=steps, run_length=50, target=target)
    except Exception:  # noqa: BLE001 - a breakdown that cannot run leaves the row as it is
        return None


def run(quick: bool = False) -> list[Row]:
    n, reps, phase_steps = _steps(quick)
    base = os.environ.get(BASELINE_ENV)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="memspec-oracle-") as tmp:
        tmp_p = Path(tmp)
        arena, arena_why = build_arena(tmp_p)
        base_path = None
        if base:
            tree = Path(base).resolve()
            if not (tree / "memspec" / "__init__.py").is_file():
                base_why = f"{BASELINE_ENV}={base} is not a memspec checkout"
            else:
                base_path = shadow_package(tree, tmp_p / "baseline")
                base_why = ""
        else:
            base_why = f"no baseline ({BASELINE_ENV} unset)"
        here = shadow_package(ROOT, tmp_p / "current")   # this tree, imported the same way as the baseline
        cwd = tmp_p   # not a checkout: `import memspec` is the one PYTHONPATH names
        for target, level in CASES:
            name = f"oracle walk {target} {level}"
            unit, tgt = "steps/CPU s", ""
            real = arena if target == ARENA else target
            if real is None:
                rows.append(unavailable(name, unit, tgt, arena_why, status=NOT_AVAILABLE))
                continue
            try:
                new, old = {"rate": 0.0, "problems": []}, {"rate": 0.0, "problems": []}
                for _ in range(1 if quick else 2):   # interleaved: a drift of the machine hits both sides alike
                    got = _walk_in_child(here, cwd, real, level, n, reps)
                    new = got if got["rate"] > new["rate"] else new
                    if base_path is not None:
                        got = _walk_in_child(base_path, cwd, real, level, n, reps)
                        old = got if got["rate"] > old["rate"] else old
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                rows.append(unavailable(name, unit, tgt, f"the walk failed: {e}", status=FAILED))
                continue
            ratio = new["rate"] / old["rate"] if base_path is not None and old["rate"] else None
            note = f"{new['rate']:,.0f} steps/CPU s (seed 0, runs of 50 steps, {n} steps, best of {reps}x" \
                   f"{1 if quick else 2})"
            note += f"; baseline {base}: {old['rate']:,.0f} steps/CPU s, this/baseline {ratio:.2f}" if ratio \
                else f"; {base_why}"
            ph = _phases(real, level, phase_steps)
            extra: dict[str, Any] = {"target": target, "level": level, "steps": n, "rate": new["rate"],
                                     "baseline": base, "baseline_rate": old["rate"] if base_path else None,
                                     "load": os.getloadavg()}
            if ph is not None:
                extra["phases_us_per_step"] = ph["phases"]
                extra["cpu_us_per_step"] = ph["cpu_us_per_step"]
                extra["handoff_wall_us_per_step"] = ph.get("handoff_wall_us_per_step")
                note += f"; a step, CPU us ({ph['cpu_us_per_step']:.0f} in all): " + ", ".join(
                    f"{k} {v:.0f}" for k, v in ph["phases"].items())
                if ph.get("handoff_wall_us_per_step") is not None:
                    note += f" (and {ph['handoff_wall_us_per_step']:.0f} us of wall per step handing the runs to " \
                            "the worker thread, outside the split)"
            problems = new["problems"] + old["problems"]
            if problems:
                note += f"; NOTE run not clean: {'; '.join(map(str, problems[:3]))[:150]}"
            note += "; load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
            rows.append(Row(name, new["rate"], unit, ratio, tgt, None, note, extra=extra))
    return rows
