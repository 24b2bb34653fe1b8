"""The supervised child's step record (issue 16, harness per-step cost): the
steps of the current example go to a :class:`StepLog` in shared memory, not
one pipe message each; the supervisor reads it only when the child died, and
a step that does not fit travels on the channel as before.  Either way a
crash is reported with every step of its example, in order.
"""

from __future__ import annotations

import math
import os
import sys
from enum import IntEnum

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from memspec.invariants import runner  # noqa: E402
from memspec.invariants.guard import StepLog  # noqa: E402

TOY = "tests.hostile_targets:TOY"


def test_steplog_round_trip_reset_and_overflow():
    log = StepLog(size=200)
    assert log.append({"t": "s", "a": "alloc", "args": "{'size': 1}", "c": [1, 2]}, 7)
    assert log.append({"t": "s", "a": "free", "args": "{}", "c": [], "po": "returns ok", "pb": [3]}, 8)
    msgs, steps = log.read()
    assert [m["a"] for m in msgs] == ["alloc", "free"] and steps == 8 and msgs[1]["pb"] == [3]
    # a step that does not fit is refused whole (the caller sends it on the channel)
    assert not log.append({"t": "s", "a": "x" * 300}, 9)
    assert [m["a"] for m in log.read()[0]] == ["alloc", "free"]
    log.reset()
    assert log.read()[0] == []
    assert log.append({"t": "s", "a": "again"}, 10)
    assert [m["a"] for m in log.read()[0]] == ["again"]


def test_steplog_reads_only_json_objects():
    """What the child wrote is untrusted: a line that is not a JSON object is left out."""
    log = StepLog(size=4096)
    log.append({"t": "s", "a": "ok"}, 1)
    start = 16 + log.used
    junk = b"__import__('os')\n[1, 2]\n"
    log.mem[start:start + len(junk)] = junk
    log.used += len(junk)
    log.append({"t": "s", "a": "after"}, 2)
    assert [m["a"] for m in log.read()[0]] == ["ok", "after"]


def _crash(tmp_path, **kw):
    (res,) = runner.conform("tests.hostile_targets:toy_segfaults", "mechanism", machine=TOY, examples=10, steps=10,
                            out_dir=str(tmp_path), timeout=60, **kw)
    assert not res.errors, res.errors
    (f,) = res.failures
    return f


def test_a_crash_reports_the_steps_of_its_example_from_the_log_or_the_channel(tmp_path, monkeypatch):
    """The same run with the log as it is and with a log too small for any
    step (every step then goes on the channel): the same trace."""
    f_log = _crash(tmp_path / "log")
    monkeypatch.setattr(StepLog, "SIZE", 24)   # the header and no room for a step
    f_pipe = _crash(tmp_path / "pipe")
    assert f_log.trace, "the crash was reported without its steps"
    assert [(s.action, s.args, s.outcome) for s in f_log.trace] == [(s.action, s.args, s.outcome) for s in f_pipe.trace]
    assert f_log.trace[-1].outcome == "kills the process"
    assert all(s.outcome and s.outcome != "kills the process" for s in f_log.trace[:-1])
    assert f"step {len(f_log.trace)}: {f_log.trace[-1].action}" in f_log.reason


class _Kind(IntEnum):
    A = 1


@pytest.mark.parametrize("value, literal", [
    ({"size": 4096, "handle": (1, 2), "flag": True, "name": "x", "none": None}, True),
    ({"pending": ((1, (3,)), (2, ())), "b": b"\x00"}, True),
    ({"f": 1.5}, True),
    ({"f": math.nan}, False),
    ({"f": math.inf}, False),
    ({"k": _Kind.A}, False),          # an int subclass: its repr is not a literal
    ({"o": object()}, False),
])
def test_step_args_are_sent_as_literals_only(value, literal):
    r = runner._literal_repr(value)
    if literal:
        import ast

        assert r is not None and ast.literal_eval(r) == value
    else:
        assert r is None
