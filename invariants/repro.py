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
import sys
from pathlib import Path
from typing import Any, Sequence

from memspec.invariants import engine as E
from memspec.invariants import text as T
from memspec.invariants.choosers import ReplayChooser
from memspec.invariants.errors import Violation
from memspec.invariants.guard import CallGuard
from memspec.invariants.planning import make_plan
from memspec.invariants.results import PlanView


def _literal(v: Any) -> bool:
    try:
        return ast.literal_eval(repr(v)) == v
    except Exception:  # noqa: BLE001
        return False


def _data(v: Any, default: Any = None) -> str:
    """Python source for ``v`` as plain data, or for ``default`` when ``v`` is
    not a literal.  The text written is the repr of what
    :func:`ast.literal_eval` rebuilt (builtin types only), never the repr of
    an object the target handed over, so a target's ``__repr__`` or a string
    full of ``\\r``, ``\\x0c`` or ``\\u2028`` can only ever become an
    escaped string literal -- never a line of code or the end of a comment."""
    try:
        text = repr(v)
        back = ast.literal_eval(text)
        if back != v:
            return repr(default)
    except Exception:  # noqa: BLE001 - anything unusual is not data
        return repr(default)
    return repr(back)


def _safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s).strip("_")[:120] or "x"


def _env_of(plan: PlanView) -> dict:
    """The environment the plan's target declares it needs at process start
    (``factory.memspec_env``, sent by the supervised child as ``PlanInfo.env``):
    string keys and values only."""
    env = plan.env
    if not isinstance(env, dict):
        return {}
    return {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str) and _ENV_KEY.fullmatch(k)
            and "\0" not in v and len(v) <= 4096}


#: the variables a reproduction sets for its target: allocator and glibc tunables only (never a
#: loader variable such as LD_PRELOAD that would make a replay run something else)
_ENV_KEY = re.compile(r"GLIBC_TUNABLES|(MALLOC|MIMALLOC|JEMALLOC|JE_MALLOC|TCMALLOC|MEMSPEC)_[A-Z0-9_]+")


def render(failure: Any, plan: PlanView, target_name: str | None = None) -> str:
    """The reproduction's source.  Text that the target (or a plugin) supplied
    -- error messages, outcomes, the reason, names -- is written only as
    repr-escaped data (``REASON``, ``OUTCOMES``, ``STEPS``), never inside a
    comment or the docstring, so nothing in it can become code."""
    target = target_name or plan.target
    steps, outcomes = [], []
    for i, ts in enumerate(failure.trace, 1):
        steps.append(f"    ({_data(T.safe_str(ts.action))}, {_data(ts.args)}, {_data(list(ts.choices), [])}),  # step {i}")
        bound = ", ".join(f"#{b}" for b in ts.bound) if ts.bound else ""
        outcomes.append(f"    {_data(T.safe_str(ts.outcome) + (f'; bound {bound}' if bound else ''))},  # step {i}")
    title = f"{T.safe_str(failure.invariant)} {plan.titles().get(failure.invariant, '')} [{T.safe_str(failure.cause)}]"
    return f'''#!/usr/bin/env python
"""memspec reproduction of a conformance failure (see FAILURE and REASON).

Run it from the project root: ``python {{this file}}``.  While the bug is
present it raises the same Violation; once fixed it prints "did not
reproduce" and exits 0.
"""
import os
import sys

# the environment the target needs at process start (a library loaded with dlopen may need a
# glibc tunable): the reproduction starts itself again with it when it is missing
ENV = {_data(_env_of(plan))}
if any(os.environ.get(k) != v for k, v in ENV.items()) and not os.environ.get("MEMSPEC_REPRO_REEXEC"):
    os.execve(sys.executable, [sys.executable, *sys.argv], {{**os.environ, **ENV, "MEMSPEC_REPRO_REEXEC": "1"}})

sys.path.insert(0, os.getcwd())
sys.path.insert(0, {_data(os.getcwd())})

from memspec.invariants.repro import replay_main  # noqa: E402

FAILURE = {_data(str(title))}
REASON = {_data(T.safe_str(failure.reason))}
TARGET = {_data(str(target))}
LEVEL = {_data(str(plan.level))}
CAPACITY = {_data(getattr(failure, "capacity", None) or plan.factory_kwargs.get("capacity"))}
TIMEOUT = {_data(plan.timeout, 5.0)}
EXPECT = ({_data(T.safe_str(failure.invariant))}, {_data(T.safe_str(failure.cause))})
MACHINE = {_data(plan.machine_ref)}
# the rule broken was named by a diagnosis that went on past these symptoms (a figure that
# differed first); the replay goes on past a differing figure likewise
SYMPTOMS = [{", ".join(_data(T.safe_str(c, 300)) for c in getattr(failure, "consequences", []) or [])}]
# checks of other failures of the run that these steps pass through (masked, as in the run); empty:
# the steps fail on their own
MASKS = {_data([list(k) for k in getattr(failure, "needs_masks", ()) or ()], [])}

# (action, arguments or None when they are not literals, recorded choices)
STEPS = [
{chr(10).join(steps)}
]

# what each step did on the target (its outcome as recorded)
OUTCOMES = [
{chr(10).join(outcomes)}
]

if __name__ == "__main__":
    sys.exit(replay_main(TARGET, LEVEL, STEPS, expect=EXPECT, capacity=CAPACITY, timeout=TIMEOUT,
                         machine=MACHINE, past_symptoms=bool(SYMPTOMS), masks=MASKS))
'''


def write_repro(failure: Any, plan: PlanView, out_dir: str, target_name: str | None = None) -> Path:
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    check = failure.check
    stem = _safe_name(f"{target_name or plan.target}-{plan.level}-{failure.invariant}"
                      + (f"-{check}" if check else "") + f"-{failure.cause}")
    path = d / (stem + ".py")
    taken = plan.repro_paths
    n = 2
    while str(path) in taken:   # every counterexample its own file, never one overwriting another
        path = d / f"{stem}-{n}.py"
        n += 1
    taken.add(str(path))
    path.write_text(render(failure, plan, target_name), encoding="utf-8", errors="backslashreplace")
    return path


def replay(target: str, level: str, steps: Sequence[tuple], *, capacity: int | None = None,
           timeout: float = 5.0, machine: str | None = None, past_symptoms: bool = False,
           masks: Sequence = ()) -> E.Run:
    """Replay ``steps`` on a fresh target and spec; raises the Violation if one occurs.

    ``past_symptoms``: a figure that differs before the last step (cause
    ``observation``) is printed as a symptom and the replay goes on, as the
    diagnosis that blamed the rule broken did (see
    :func:`~memspec.invariants.runner.diagnose`)."""
    plan = make_plan(target, level, capacity=capacity, timeout=timeout, machine=machine)
    # the checks another failure of the same run broke, which this one's steps run through (the
    # spec follows those answers anyway, as the run did): a reproduction says so, it does not hide it
    plan.masks = frozenset((m[0] if isinstance(m[0], str) else None, str(m[1])) for m in masks
                           if isinstance(m, (list, tuple)) and len(m) == 2)
    if plan.masks:
        print("masked (other failures of the run, which these steps pass through): "
              + ", ".join(f"{k}" + (f" at {a}" if a else "") for a, k in sorted(plan.masks, key=str)), file=sys.stderr)
    guard = CallGuard(timeout)
    run = E.Run(plan, guard)
    try:
        for i, (name, args, choices) in enumerate(steps, 1):
            action = plan.machine.action(name)
            if args is None:
                args = action.draw_args(run.state, ReplayChooser(choices))
            try:
                run.apply(action, args, choices)
            except Violation as v:
                if not (past_symptoms and v.cause == "observation" and i < len(steps)):
                    raise
                print(f"step {i}: first shown as {T.terminal(v.invariant, 200)} [{T.terminal(v.cause, 200)}] "
                      f"{T.terminal(v.reason)}", file=sys.stderr)
        run.teardown()
    finally:
        run.close()
    return run


def replay_main(target: str, level: str, steps: Sequence[tuple], *, expect: tuple | None = None,
                capacity: int | None = None, timeout: float = 5.0, machine: str | None = None,
                past_symptoms: bool = False, masks: Sequence = ()) -> int:
    try:
        replay(target, level, steps, capacity=capacity, timeout=timeout, machine=machine,
               past_symptoms=past_symptoms, masks=masks)
    except Violation as v:
        if v.__cause__ is not None:  # the target's own traceback first
            import traceback

            print("the target raised:", file=sys.stderr)
            traceback.print_exception(type(v.__cause__), v.__cause__, v.__cause__.__traceback__, file=sys.stderr)
        same = expect is None or v.invariant == expect[0]
        what = f"{T.terminal(v.invariant, 200)} [{T.terminal(v.cause, 200)}] {T.terminal(v.reason)}"
        print(f"reproduced: FAIL {what}" if same
              else f"FAILED DIFFERENTLY: expected {T.terminal(expect[0], 200)}, got {what}")
        raise
    print(f"did not reproduce: {len(steps)} steps ran and every check passed on {target!r} at level {level!r}")
    return 0


def write_repros(result: Any, out_dir: str, target_name: str | None = None) -> None:
    """Write the reproduction of every failure of ``result`` (a
    :class:`~memspec.invariants.runner.PlanResult`); a file that cannot be
    written is an error of the result, not a crash."""
    for f in result.failures:
        if not f.trace:
            continue   # no steps to replay (a process that died between examples): nothing to reproduce
        try:
            f.repro = str(write_repro(f, result.plan, out_dir, target_name=target_name))
        except Exception as e:  # noqa: BLE001
            result.errors.append(f"could not write a reproduction for {T.safe_str(f.invariant, 200)}: {T.exc_text(e, 500)}")
