"""``python -m bench.phase_instructions [--target T] [--level L] [--steps N] [--jobs J]``:
where a walk step goes, in instructions (valgrind's callgrind), not time.

The oracle rows' phase split (:func:`bench.profile.walk_phases`) is wall
time scaled to CPU time: on a loaded machine a phase's figure moves by +-50%
from one run to the next.  Instructions do not move with the load.  Each
phase is counted in a process of its own, under
``valgrind --tool=callgrind --collect-atstart=no``: the phase's function is
wrapped so that collection is on from its entry to its exit (a callgrind
client request through a tiny C library built here with the machine's C
compiler), for the steps of the walk the oracle rows time (seed 0, runs of
50 steps, after a warm-up walk).  One phase per process, so no wrapper is
inside another's count; each count less its calls times a wrapped no-op's
instructions (measured too).  The phases are those of ``walk_phases``
(exclusive: a phase that calls another is counted less it):

* ``draw: guidance`` -- ``Run.choose`` less the spec's outcome sets it
  computes (``draws._spec_outcomes``: ``draw: spec outcome sets``, which
  ``apply`` reuses for the step it keeps);
* ``target call`` -- ``Action.perform`` (the implementation's own call);
* ``spec + match`` -- ``Run.apply`` less the call and the checks;
* ``invariants``, ``observations``, ``data integrity`` -- the checks
  (``observations`` includes the start checks of each run, ``run setup``
  too);
* ``check_after rest``, ``run setup`` (``Run.__init__``), ``run end``
  (``Run.teardown``), ``walk loop`` (the rest of a run).

Needs ``valgrind``, ``valgrind/callgrind.h`` and a C compiler; without them
it says so and exits 2.  About a minute per phase on an idle core (13
processes per target and level).  Reads nothing but prints; no timing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: the functions counted, each in a process of its own
PHASES = ("_walk_once", "choose", "_spec_outcomes", "apply", "perform", "check_after", "check_invariants",
          "check_observations", "after_step", "__init__", "teardown")

_TOGGLE_C = "#include <valgrind/callgrind.h>\nvoid memspec_cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }\n"

_CHILD = r"""
import ctypes, dataclasses, sys
tog = ctypes.CDLL(sys.argv[1]).memspec_cg_toggle
target, level, n, phase = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
armed, calls = [False], [0]
def wrap(fn):
    def w(*a, **k):
        if not armed[0]:
            return fn(*a, **k)
        calls[0] += 1
        tog()
        try:
            return fn(*a, **k)
        finally:
            tog()
    return w
if phase == "calibrate":
    f = wrap(lambda: None)
    armed[0] = True
    for _ in range(n):
        f()
    print("PHASE-CALLS", n, 0)
    sys.exit(0)
from memspec.invariants import draws, engine, integrity, runner, walk
owners = {"choose": engine.Run, "apply": engine.Run, "check_after": engine.Run, "check_invariants": engine.Run,
          "check_observations": engine.Run, "__init__": engine.Run, "teardown": engine.Run,
          "after_step": integrity.Integrity}
def make():
    plan = runner.make_plan(target, level)
    if phase == "perform":
        plan.actions = [dataclasses.replace(a, perform=wrap(a.perform)) for a in plan.actions]
    return plan
if phase == "_spec_outcomes":
    draws._spec_outcomes = wrap(draws._spec_outcomes)
elif phase == "_walk_once":
    walk._walk_once = wrap(walk._walk_once)
elif phase != "perform":
    setattr(owners[phase], phase, wrap(getattr(owners[phase], phase)))
walk.walk(make(), max_steps=100, run_length=50, seed=1, stop_on_failure=False)   # warm-up, not counted
plan = make()
armed[0] = True
res = walk.walk(plan, max_steps=n, run_length=50, seed=0, stop_on_failure=False)
armed[0] = False
if res.failures or res.errors:
    print("PHASE-PROBLEMS", [f.violation.invariant for f in res.failures] + list(res.errors))
print("PHASE-CALLS", calls[0], res.steps)
"""


def available() -> str:
    """``""`` when the counts can be made here, else why not."""
    if shutil.which("valgrind") is None:
        return "no valgrind on this machine"
    if not Path("/usr/include/valgrind/callgrind.h").is_file():
        return "no valgrind/callgrind.h (the valgrind development headers)"
    if (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")) is None:
        return "no C compiler (cc/gcc)"
    return ""


def _build(out: Path) -> Path:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    src = out / "toggle.c"
    src.write_text(_TOGGLE_C)
    lib = out / "libmemspec_cg_toggle.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(src)], check=True, capture_output=True)
    return lib


def _count(lib: Path, tmp: Path, target: str, level: str, steps: int, phase: str) -> tuple[int, int, int]:
    """``(instructions collected, wrapped calls, steps)`` of one process."""
    out = tmp / f"cg.{phase}.out"
    env = dict(os.environ, PYTHONHASHSEED="0")
    env.pop("MEMSPEC_NATIVE", None)
    p = subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--callgrind-out-file={out}",
                        sys.executable, "-c", _CHILD, str(lib), target, level, str(steps), phase],
                       capture_output=True, text=True, env=env, timeout=3600)
    out.unlink(missing_ok=True)
    got = re.search(r"Collected : (\d+)", p.stderr)
    calls = re.search(r"PHASE-CALLS (\d+) (\d+)", p.stdout)
    if p.returncode != 0 or got is None or calls is None:
        raise RuntimeError(f"{phase}: {(p.stderr.strip().splitlines() or ['?'])[-1][:200]}")
    problems = re.search(r"PHASE-PROBLEMS (.*)", p.stdout)
    if problems:
        raise RuntimeError(f"{phase}: the walk was not clean: {problems.group(1)[:200]}")
    return int(got.group(1)), int(calls.group(1)), int(calls.group(2))


def split(counts: dict, wrapper: float) -> dict:
    """Exclusive instructions per step of each phase from the inclusive
    ``counts`` (``{phase: (instructions, calls, steps)}``), each less its
    calls times ``wrapper`` (a wrapped no-op's instructions)."""
    steps = max(counts["_walk_once"][2], 1)
    inc = {k: (ins - calls * wrapper) / steps for k, (ins, calls, _n) in counts.items()}
    out = {
        "draw: guidance": inc["choose"] - inc["_spec_outcomes"],
        "draw: spec outcome sets": inc["_spec_outcomes"],
        "target call": inc["perform"],
        "spec + match": inc["apply"] - inc["perform"] - inc["check_after"],
        "invariants": inc["check_invariants"],
        "observations": inc["check_observations"],
        "data integrity": inc["after_step"],
        "check_after rest": inc["check_after"] - inc["check_invariants"] - inc["check_observations"]
        - inc["after_step"],
        "run setup": inc["__init__"],
        "run end": inc["teardown"],
    }
    out["walk loop"] = inc["_walk_once"] - inc["choose"] - inc["apply"] - inc["__init__"] - inc["teardown"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.phase_instructions")
    p.add_argument("--target", default="reference", help="a memspec target (reference, c:PATH, ...)")
    p.add_argument("--level", default="mechanism")
    p.add_argument("--steps", type=int, default=600, help="walk steps counted per phase (default %(default)s)")
    p.add_argument("--jobs", type=int, default=2, help="valgrind processes at once (default %(default)s)")
    args = p.parse_args(argv)
    why = available()
    if why:
        print(f"phase instructions not available: {why}")
        return 2
    with tempfile.TemporaryDirectory(prefix="memspec-phase-ir-") as tmp:
        tmp_p = Path(tmp)
        lib = _build(tmp_p)
        jobs = [("calibrate", 20_000)] + [(ph, args.steps) for ph in PHASES]
        with ThreadPoolExecutor(max(1, args.jobs)) as ex:
            futs = {ph: ex.submit(_count, lib, tmp_p, args.target, args.level, n, ph) for ph, n in jobs}
            counts = {ph: f.result() for ph, f in futs.items()}
    ins, calls, _ = counts.pop("calibrate")
    wrapper = ins / calls
    phases = split(counts, wrapper)
    total = sum(phases.values())
    print(f"{args.target} {args.level}: {total:,.0f} instructions per walk step ({counts['_walk_once'][2]} steps, "
          f"seed 0, runs of 50; each phase less {wrapper:,.0f} per wrapped call)")
    for k, v in phases.items():
        print(f"  {v:11,.0f}  {100 * v / total:5.1f}%  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
