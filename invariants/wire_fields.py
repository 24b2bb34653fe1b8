"""The child <-> parent messages of a supervised run, part one: the checked
readers every message is decoded with, and the records messages carry
(a trace step, a failure, a run's statistics, a step of the current
example).  Part of :mod:`~memspec.invariants.wire` (the message kinds and
the one decoder; it re-exports every name here).

What a child says is untrusted: literals only (JSON, arguments as a Python
literal read by ``ast.literal_eval``), and every field's type is checked
when it is read.  A field that is missing, of the wrong type, out of range
or too large is a :class:`WireError` naming the message kind and the field
-- never a ``KeyError``/``TypeError``/``AttributeError`` of the reader."""

from __future__ import annotations

import ast
import math
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any, Callable

from memspec.invariants import engine as E
from memspec.invariants.results import Failure

#: the longest text a field may hold (characters), the most items of a list or dict, the largest int
MAX_TEXT = 1 << 20
MAX_ITEMS = 1 << 20
MAX_INT = 1 << 63


class WireError(ValueError):
    """A message from a child that is not what its kind says (a harness
    error: a child built by memspec never sends one)."""

    def __init__(self, kind: str, field: str, problem: str) -> None:
        self.kind, self.field, self.problem = kind, field, problem
        super().__init__(f'harness error: malformed "{kind}" message from the child: field "{field}" {problem}')


# --------------------------------------------------------------------------
# Checked readers: (kind, path, value) -> value, or WireError
# --------------------------------------------------------------------------

def get(kind: str, m: dict, name: str, path: str = "") -> Any:
    """Field ``name`` of dict ``m`` (at ``path``), or a WireError that it is missing."""
    if type(m) is not dict:
        raise WireError(kind, path.rstrip(".") or "<message>", "is not a dict")
    try:
        return m[name]
    except KeyError:
        raise WireError(kind, path + name, "is missing") from None


def text(kind: str, path: str, v: Any) -> str:
    if type(v) is not str:
        raise WireError(kind, path, "is not a str")
    if len(v) > MAX_TEXT:
        raise WireError(kind, path, f"is too long ({len(v)} characters)")
    return v


def integer(kind: str, path: str, v: Any) -> int:
    if type(v) is not int:
        raise WireError(kind, path, "is not an int")
    if not -MAX_INT < v < MAX_INT:
        raise WireError(kind, path, "is out of range")
    return v


def number(kind: str, path: str, v: Any) -> float:
    """A finite int or float (JSON's ``Infinity``/``NaN`` are not)."""
    if type(v) is int:
        return float(integer(kind, path, v))
    if type(v) is not float or not math.isfinite(v):
        raise WireError(kind, path, "is not a finite number")
    return v


def flag(kind: str, path: str, v: Any) -> bool:
    if type(v) is not bool:
        raise WireError(kind, path, "is not a bool")
    return v


def optional(read: Callable) -> Callable:
    """``read``, or None for a None value."""
    return lambda kind, path, v: None if v is None else read(kind, path, v)


def list_of(read: Callable) -> Callable:
    def reader(kind: str, path: str, v: Any) -> list:
        if type(v) is not list:
            raise WireError(kind, path, "is not a list")
        if len(v) > MAX_ITEMS:
            raise WireError(kind, path, f"is too long ({len(v)} items)")
        return [read(kind, f"{path}[{i}]", x) for i, x in enumerate(v)]
    return reader


def dict_of(read: Callable) -> Callable:
    """A dict of str keys (JSON's), each value read by ``read``."""
    def reader(kind: str, path: str, v: Any) -> dict:
        if type(v) is not dict:
            raise WireError(kind, path, "is not a dict")
        if len(v) > MAX_ITEMS:
            raise WireError(kind, path, f"is too long ({len(v)} items)")
        out = {}
        for k, x in v.items():
            if type(k) is not str or len(k) > MAX_TEXT:
                raise WireError(kind, f"{path} key", "is not a str")
            out[k] = read(kind, f"{path}.{k[:40]}", x)
        return out
    return reader


def pair_of(first: Callable, second: Callable, third: Callable | None = None) -> Callable:
    """A list of exactly two (or three) items, read as a tuple."""
    n = 2 if third is None else 3

    def reader(kind: str, path: str, v: Any) -> tuple:
        if type(v) is not list or len(v) != n:
            raise WireError(kind, path, f"is not a list of {n}")
        items = (first(kind, f"{path}[0]", v[0]), second(kind, f"{path}[1]", v[1]))
        return items if third is None else (*items, third(kind, f"{path}[2]", v[2]))
    return reader


def field(kind: str, m: dict, name: str, read: Callable, path: str = "") -> Any:
    """``read`` of field ``name`` of ``m``."""
    return read(kind, path + name, get(kind, m, name, path))


def choice(kind: str, path: str, v: Any) -> int | bool:
    """A recorded primitive choice: an int (``integer``) or a bool (``boolean``)."""
    return v if type(v) is bool else integer(kind, path, v)


ints = list_of(integer)
#: a step's recorded choices
choices = list_of(choice)
texts = list_of(text)
counts = dict_of(integer)
#: a failure's mask key ``(action or None, check id)``
mask_key = pair_of(optional(text), text)


# --------------------------------------------------------------------------
# Arguments: a Python literal's text
# --------------------------------------------------------------------------

#: types whose repr ``ast.literal_eval`` reads back as an equal value (``float``: when finite)
_PLAIN = (int, str, bool, bytes, type(None))


def _plain(v: Any, depth: int = 0) -> bool:
    """``v`` is made of :data:`_PLAIN` values (exact types), finite floats,
    tuples, lists and dicts of them: its repr is a literal of an equal value
    without parsing it back."""
    t = type(v)
    if t in _PLAIN:
        return True
    if t is float:
        return v == v and v not in (float("inf"), float("-inf"))
    if depth > 8:
        return False
    if t is tuple or t is list:
        return all(_plain(x, depth + 1) for x in v)
    if t is dict:
        return all(_plain(k, depth + 1) and _plain(x, depth + 1) for k, x in v.items())
    return False


def _literal_repr(v: Any) -> str | None:
    if _plain(v):   # the common case (ints, ids, tuples of them): no parse per step
        return repr(v)
    try:
        r = repr(v)
        return r if ast.literal_eval(r) == v else None
    except Exception:  # noqa: BLE001
        return None


def arguments(kind: str, path: str, v: Any) -> dict:
    """A step's arguments from their literal's text (None: they were not
    literals, read as no arguments)."""
    if v is None:
        return {}
    src = text(kind, path, v)
    try:
        got = ast.literal_eval(src)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise WireError(kind, path, "is not a Python literal") from None
    if type(got) is not dict:
        raise WireError(kind, path, "is not a dict literal")
    return got


# --------------------------------------------------------------------------
# A trace step: {"a", "args", "c", "o", "b"}
# --------------------------------------------------------------------------

def trace_step_to_wire(ts: E.TraceStep) -> dict:
    return {"a": ts.action, "args": _literal_repr(ts.args), "c": list(ts.choices), "o": ts.outcome,
            "b": list(ts.bound)}


def trace_step_from_wire(kind: str, path: str, d: Any) -> E.TraceStep:
    return E.TraceStep(field(kind, d, "a", text, path + "."), field(kind, d, "args", arguments, path + "."),
                       field(kind, d, "c", choices, path + "."), field(kind, d, "o", text, path + "."),
                       tuple(field(kind, d, "b", ints, path + ".")))


def trace_to_wire(trace: list) -> list:
    return [trace_step_to_wire(ts) for ts in trace]


def trace_from_wire(v: Any, kind: str = "trace", path: str = "trace") -> list:
    """Trace steps from their wire form: every field checked (WireError)."""
    return list_of(trace_step_from_wire)(kind, path, v)


# (older names, kept for callers outside the harness core)
_trace_msg = trace_to_wire
_trace_from = trace_from_wire


# --------------------------------------------------------------------------
# A failure: one record, what conform's and fuzz's children send of a Failure
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class FailureRecord:
    """What a child says of a :class:`~memspec.invariants.results.Failure`
    (its target and level are the message's)."""

    invariant: str
    cause: str
    reason: str
    trace: tuple            # of engine.TraceStep
    steps_to_detection: int | None = None
    flaky: bool = False
    capacity: int | None = None
    consequences: tuple = ()
    check: str | None = None
    key: tuple | None = None
    needs_masks: tuple = ()
    likely_cause: str | None = None

    @classmethod
    def of(cls, f: Failure) -> "FailureRecord":
        return cls(str(f.invariant), str(f.cause), str(f.reason), tuple(f.trace), f.steps_to_detection,
                   bool(f.flaky), f.capacity, tuple(str(c) for c in f.consequences), f.check,
                   tuple(f.key) if f.key is not None else None, tuple(tuple(k) for k in f.needs_masks),
                   f.likely_cause)

    def to_failure(self, target: str, level: str) -> Failure:
        cap = self.capacity if self.capacity is not None and self.capacity > 0 else None
        return Failure(target, level, self.invariant, self.cause, self.reason, list(self.trace),
                       self.steps_to_detection, flaky=self.flaky, capacity=cap,
                       consequences=list(self.consequences), check=self.check, key=self.key,
                       needs_masks=self.needs_masks, likely_cause=self.likely_cause)

    def to_wire(self) -> dict:
        return {"invariant": self.invariant, "cause": self.cause, "reason": self.reason,
                "trace": trace_to_wire(self.trace), "std": self.steps_to_detection, "flaky": self.flaky,
                "cap": self.capacity, "also": list(self.consequences), "check": self.check,
                "key": list(self.key) if self.key is not None else None,
                "masks": [list(k) for k in self.needs_masks], "likely": self.likely_cause}

    @classmethod
    def from_wire(cls, kind: str, path: str, d: Any) -> "FailureRecord":
        p = path + "."
        return cls(field(kind, d, "invariant", text, p), field(kind, d, "cause", text, p),
                   field(kind, d, "reason", text, p), tuple(field(kind, d, "trace", list_of(trace_step_from_wire), p)),
                   field(kind, d, "std", optional(integer), p), field(kind, d, "flaky", flag, p),
                   field(kind, d, "cap", optional(integer), p), tuple(field(kind, d, "also", texts, p)),
                   field(kind, d, "check", optional(text), p), field(kind, d, "key", optional(mask_key), p),
                   tuple(field(kind, d, "masks", list_of(mask_key), p)), field(kind, d, "likely", optional(text), p))


def failure_to_wire(f: Failure) -> dict:
    return FailureRecord.of(f).to_wire()


def failure_from_wire(target: str, level: str, d: Any, kind: str = "failure", path: str = "failure") -> Failure:
    return FailureRecord.from_wire(kind, path, d).to_failure(target, level)


# --------------------------------------------------------------------------
# A run's statistics
# --------------------------------------------------------------------------

def stats_to_wire(st: E.Stats) -> dict:
    return {"examples": st.examples, "steps": st.steps, "seconds": st.seconds, "actions": dict(st.actions),
            "outcomes": [[a, o, n] for (a, o), n in st.outcomes.items()], "offered": dict(st.offered),
            "accepted": dict(st.accepted), "boundaries": dict(st.boundaries),
            "first": dict(st.first_failure_steps), "failing": st.failures_seen}


_outcome = pair_of(text, text, integer)


def stats_from_wire(kind: str, path: str, d: Any) -> E.Stats:
    p = path + "."
    return E.Stats(field(kind, d, "examples", integer, p), field(kind, d, "steps", integer, p),
                   field(kind, d, "seconds", number, p), Counter(field(kind, d, "actions", counts, p)),
                   Counter({(a, o): n for a, o, n in field(kind, d, "outcomes", list_of(_outcome), p)}),
                   Counter(field(kind, d, "offered", counts, p)), Counter(field(kind, d, "accepted", counts, p)),
                   Counter(field(kind, d, "boundaries", counts, p)), field(kind, d, "first", counts, p),
                   field(kind, d, "failing", integer, p))


def stats_into(dst: E.Stats, src: E.Stats) -> None:
    """Every figure of ``src`` into ``dst`` (the object a display may hold)."""
    for f in fields(E.Stats):
        setattr(dst, f.name, getattr(src, f.name))


# --------------------------------------------------------------------------
# A step of the current example (the hot path: one per step, to the StepLog)
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """``"s"``: a step about to be called (its arguments' literal text), with
    what the step before it answered (``po``/``pb``: the last step's answer
    may never come).  Written to the child's StepLog (sent on the channel
    only when the log is full); decoded by the parent only when it reads the
    log of a child that died."""

    T = "s"
    action: str
    args: str | None
    choices: tuple
    prev_outcome: str | None = None
    prev_bound: tuple | None = None

    def to_wire(self) -> dict:
        m = {"t": "s", "a": self.action, "args": self.args, "c": list(self.choices)}
        if self.prev_outcome is not None:
            m["po"], m["pb"] = self.prev_outcome, list(self.prev_bound or ())
        return m

    @staticmethod
    def wire_of(ts: E.TraceStep, prev: E.TraceStep | None) -> dict:
        """``Step(...).to_wire()`` of trace step ``ts`` (after ``prev``), built
        directly: the child's per-step cost (no record, no check)."""
        m = {"t": "s", "a": ts.action, "args": _literal_repr(ts.args), "c": list(ts.choices)}
        if prev is not None:
            m["po"], m["pb"] = prev.outcome, list(prev.bound)
        return m

    @classmethod
    def from_wire(cls, m: Any) -> "Step":
        k = cls.T
        po = m.get("po") if type(m) is dict else None
        return cls(field(k, m, "a", text), field(k, m, "args", optional(text)), tuple(field(k, m, "c", choices)),
                   None if po is None else text(k, "po", po),
                   None if po is None else tuple(field(k, m, "pb", ints)))


def steps_to_trace(steps: list) -> list:
    """The trace of an example from its :class:`Step` records: each step's
    ``po``/``pb`` is the answer of the one before; the last has none."""
    trace: list = []
    for i, s in enumerate(steps):
        if trace and s.prev_outcome is not None:
            trace[-1].outcome, trace[-1].bound = s.prev_outcome, tuple(s.prev_bound or ())
        trace.append(E.TraceStep(s.action, arguments("s", f"steps[{i}].args", s.args), list(s.choices), "", ()))
    return trace
