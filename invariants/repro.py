"""Standalone reproductions of conformance failures.

:func:`write_repro` writes a shrunk counterexample as a Python file that runs
on its own (``python memspec-out/repro/<name>.py`` from the project root): it
rebuilds the target by name, replays the steps with the recorded arguments on
spec and target side by side through the same engine, and raises the same
:class:`~memspec.invariants.harness.Violation` while the bug is there.  Once
fixed it prints ``did not reproduce`` and exits 0.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Any, Sequence

from memspec.invariants import engine as E
from memspec.invariants.choosers import ReplayChooser
from memspec.invariants.errors import Violation
from memspec.invariants.guard import CallGuard
from memspec.invariants.planning import make_plan


def _literal(v: Any) -> bool:
    try:
        return ast.literal_eval(repr(v)) == v
    except Exception:  # noqa: BLE001
        return False


def _safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s).strip("_")[:120] or "x"


def render(failure: Any, plan: Any, target_name: str | None = None) -> str:
    target = target_name or plan.target
    titles = plan.titles()
    lines = []
    for i, ts in enumerate(failure.trace, 1):
        args = ts.args if _literal(ts.args) else None
        note = ts.outcome + (f"; bound #{', #'.join(map(str, ts.bound))}" if ts.bound else "")
        note = note.replace("\n", " ")
        lines.append(f"    ({ts.action!r}, {args!r}, {list(ts.choices)!r}),  # {i}: {note[:150]}")
    steps = "\n".join(lines)
    reason = failure.reason.replace('"""', "'''")
    return f'''#!/usr/bin/env python
"""memspec reproduction: {failure.invariant} {titles.get(failure.invariant, "")} [{failure.cause}]
target {target!r}, level {plan.level!r}, {len(failure.trace)} steps.

{reason}

Run it from the project root: ``python {{this file}}``.  While the bug is
present it raises the same Violation ({failure.invariant}); once fixed it
prints "did not reproduce" and exits 0.
"""
import os
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, {os.getcwd()!r})

from memspec.invariants.repro import replay_main  # noqa: E402

TARGET = {target!r}
LEVEL = {plan.level!r}
CAPACITY = {plan.factory_kwargs.get("capacity")!r}
TIMEOUT = {plan.timeout!r}
EXPECT = ({failure.invariant!r}, {failure.cause!r})
MACHINE = {plan.machine_ref!r}

# (action, arguments or None when they are not literals, recorded choices)
STEPS = [
{steps}
]

if __name__ == "__main__":
    sys.exit(replay_main(TARGET, LEVEL, STEPS, expect=EXPECT, capacity=CAPACITY, timeout=TIMEOUT,
                         machine=MACHINE))
'''


def write_repro(failure: Any, plan: Any, out_dir: str, target_name: str | None = None) -> Path:
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    name = _safe_name(f"{target_name or plan.target}-{plan.level}-{failure.invariant}-{failure.cause}") + ".py"
    path = d / name
    path.write_text(render(failure, plan, target_name))
    return path


def replay(target: str, level: str, steps: Sequence[tuple], *, capacity: int | None = None,
           timeout: float = 5.0, machine: str | None = None) -> E.Run:
    """Replay ``steps`` on a fresh target and spec; raises the Violation if one occurs."""
    plan = make_plan(target, level, capacity=capacity, timeout=timeout, machine=machine)
    guard = CallGuard(timeout)
    run = E.Run(plan, guard)
    try:
        for name, args, choices in steps:
            action = plan.machine.action(name)
            if args is None:
                args = action.draw_args(run.state, ReplayChooser(choices))
            run.apply(action, args, choices)
        run.teardown()
    finally:
        run.close()
    return run


def replay_main(target: str, level: str, steps: Sequence[tuple], *, expect: tuple | None = None,
                capacity: int | None = None, timeout: float = 5.0, machine: str | None = None) -> int:
    try:
        replay(target, level, steps, capacity=capacity, timeout=timeout, machine=machine)
    except Violation as v:
        same = expect is None or v.invariant == expect[0]
        print(f"reproduced: FAIL {v.invariant} [{v.cause}] {v.reason}" if same
              else f"FAILED DIFFERENTLY: expected {expect[0]}, got {v.invariant} [{v.cause}] {v.reason}")
        raise
    print(f"did not reproduce: {len(steps)} steps ran and every check passed on {target!r} at level {level!r}")
    return 0


def write_repros(result: Any, out_dir: str, target_name: str | None = None) -> None:
    """Write the reproduction of every failure of ``result`` (a
    :class:`~memspec.invariants.runner.PlanResult`); a file that cannot be
    written is an error of the result, not a crash."""
    for f in result.failures:
        try:
            f.repro = str(write_repro(f, result.plan, out_dir, target_name=target_name))
        except Exception as e:  # noqa: BLE001
            result.errors.append(f"could not write a reproduction for {f.invariant}: {type(e).__name__}: {e}")
