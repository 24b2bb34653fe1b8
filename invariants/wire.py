"""The child <-> parent messages of a supervised run: one frozen record per
message kind, each with ``to_wire()`` (plain literals: what the child
sends) and ``from_wire(m)`` (every field checked), and :func:`decode`, the
one way the parent reads a message.  The checked readers and the records
the messages carry (a trace step, a failure, a run's statistics, a step)
are in :mod:`~memspec.invariants.wire_fields`, re-exported here.

A message that is not what its kind says is a :class:`WireError` naming the
kind and the field (``harness error: malformed "result" message from the
child: field "failures[0].trace" is not a list``), never a ``KeyError``.

Kinds: ``plan``, ``ex``, ``s`` (:class:`~memspec.invariants.wire.Step`),
``p``, ``result``, ``error`` (conform's child and fuzz's workers), ``fatal``
and ``done`` (:func:`~memspec.invariants.guard.supervise`), ``hello``,
``note``, ``found``, ``failed-example``, ``wstats`` (fuzz's workers),
``task``, ``shrunk``, ``replayed`` (fuzz's shrinker)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Union

from memspec.invariants import engine as E
from memspec.invariants.results import PlanInfo, not_at_level
from memspec.invariants.wire_fields import (MAX_INT, MAX_ITEMS, MAX_TEXT, FailureRecord, Step,  # noqa: F401
                                            WireError, _literal_repr, _plain, _trace_from, _trace_msg,
                                            arguments, counts, dict_of, failure_from_wire, failure_to_wire,
                                            field, flag, get, integer, ints, list_of, mask_key, number,
                                            optional, pair_of, stats_from_wire, stats_into, stats_to_wire,
                                            steps_to_trace, text, texts, trace_from_wire, trace_step_from_wire,
                                            trace_step_to_wire, trace_to_wire)


@dataclass(frozen=True)
class _Bare:
    """A message with no field but its kind."""

    T: ClassVar[str] = ""

    def to_wire(self) -> dict:
        return {"t": self.T}

    @classmethod
    def from_wire(cls, m: Any) -> "_Bare":
        return cls()


@dataclass(frozen=True)
class Done(_Bare):
    """The child finished its work (sent by the supervisor's child code)."""

    T: ClassVar[str] = "done"


@dataclass(frozen=True)
class Hello(_Bare):
    """A fuzz worker or shrinker started (the parent may fork the next)."""

    T: ClassVar[str] = "hello"


@dataclass(frozen=True)
class ExampleStart:
    """An example starts, on a device of ``capacity`` (None: the plan's)."""

    T: ClassVar[str] = "ex"
    capacity: int | None

    def to_wire(self) -> dict:
        return {"t": self.T, "cap": self.capacity}

    @classmethod
    def from_wire(cls, m: Any) -> "ExampleStart":
        return cls(field(cls.T, m, "cap", optional(integer)))


@dataclass(frozen=True)
class Progress:
    """The run's figures so far (sent a few times a second)."""

    T: ClassVar[str] = "p"
    examples: int
    steps: int
    failing: int
    outcomes: int
    actions: dict
    seconds: float

    @classmethod
    def of(cls, st: E.Stats) -> "Progress":
        return cls(st.examples, st.steps, st.failures_seen, len(st.outcomes), dict(st.actions), float(st.seconds))

    def to_wire(self) -> dict:
        return {"t": self.T, "examples": self.examples, "steps": self.steps, "failing": self.failing,
                "outcomes": self.outcomes, "actions": dict(self.actions), "seconds": self.seconds}

    @classmethod
    def from_wire(cls, m: Any) -> "Progress":
        k = cls.T
        return cls(field(k, m, "examples", integer), field(k, m, "steps", integer), field(k, m, "failing", integer),
                   field(k, m, "outcomes", integer), field(k, m, "actions", counts), field(k, m, "seconds", number))


_invariant = pair_of(text, text)
_witness = pair_of(text, text, text)


@dataclass(frozen=True)
class PlanMsg:
    """A plan about to run: what the report, the reproductions and the
    progress display read of it (:meth:`to_info`)."""

    T: ClassVar[str] = "plan"
    level: str
    target: str
    invariants: tuple            # ((id, title), ...)
    na: dict
    capabilities: dict
    actions: tuple
    declares: dict
    undrawn: dict
    absent: tuple
    witnesses: dict              # {invariant: ((action, outcome, describe), ...)}
    env: dict
    timeout: float
    capacity: int | None
    machine_ref: str | None

    @classmethod
    def of(cls, plan: E.Plan) -> "PlanMsg":
        cap = plan.factory_kwargs.get("capacity")
        return cls(plan.level, plan.target, tuple((inv.id, inv.title) for inv in plan.machine.invariants),
                   dict(plan.na), {k: bool(v) for k, v in plan.capabilities.items()}, tuple(plan.action_names),
                   plan.declares, plan.undrawn, tuple(sorted(not_at_level(plan))),
                   {k: tuple(tuple(w) for w in v) for k, v in plan.witnesses.items()},
                   {k: v for k, v in plan.env.items() if type(k) is str and type(v) is str},
                   float(plan.timeout), cap if type(cap) is int else None, plan.machine_ref)

    def to_info(self, target: str, mutant: Any) -> PlanInfo:
        return PlanInfo(target, self.level, list(self.invariants), dict(self.na), dict(self.capabilities),
                        list(self.actions), self.timeout,
                        {"capacity": self.capacity} if self.capacity is not None else {}, self.machine_ref,
                        mutant=mutant, declares={k: list(v) for k, v in self.declares.items()},
                        undrawn={k: list(v) for k, v in self.undrawn.items()}, absent=list(self.absent),
                        witnesses={k: [list(w) for w in v] for k, v in self.witnesses.items()}, env=dict(self.env))

    def to_wire(self) -> dict:
        return {"t": self.T, "level": self.level, "target": self.target,
                "invariants": [list(x) for x in self.invariants], "na": dict(self.na),
                "capabilities": dict(self.capabilities), "actions": list(self.actions),
                "declares": {k: list(v) for k, v in self.declares.items()},
                "undrawn": {k: list(v) for k, v in self.undrawn.items()}, "absent": list(self.absent),
                "witnesses": {k: [list(w) for w in v] for k, v in self.witnesses.items()}, "env": dict(self.env),
                "timeout": self.timeout, "capacity": self.capacity, "machine_ref": self.machine_ref}

    @classmethod
    def from_wire(cls, m: Any) -> "PlanMsg":
        k = cls.T
        return cls(field(k, m, "level", text), field(k, m, "target", text),
                   tuple(field(k, m, "invariants", list_of(_invariant))), field(k, m, "na", dict_of(text)),
                   field(k, m, "capabilities", dict_of(flag)), tuple(field(k, m, "actions", texts)),
                   {a: tuple(v) for a, v in field(k, m, "declares", dict_of(texts)).items()},
                   {a: tuple(v) for a, v in field(k, m, "undrawn", dict_of(texts)).items()},
                   tuple(field(k, m, "absent", texts)),
                   {a: tuple(v) for a, v in field(k, m, "witnesses", dict_of(list_of(_witness))).items()},
                   field(k, m, "env", dict_of(text)), field(k, m, "timeout", number),
                   field(k, m, "capacity", optional(integer)), field(k, m, "machine_ref", optional(text)))


def _failure(kind: str, path: str, v: Any) -> FailureRecord:
    return FailureRecord.from_wire(kind, path, v)


@dataclass(frozen=True)
class Result:
    """A plan's run ended: its errors, notes, figures and failures
    (``shrunk``: a fuzz worker shrank them itself)."""

    T: ClassVar[str] = "result"
    level: str
    errors: tuple
    notes: tuple
    stats: E.Stats
    failures: tuple              # of FailureRecord
    shrunk: bool = False

    def to_wire(self) -> dict:
        return {"t": self.T, "level": self.level, "errors": list(self.errors), "notes": list(self.notes),
                "stats": stats_to_wire(self.stats), "failures": [f.to_wire() for f in self.failures],
                "shrunk": self.shrunk}

    @classmethod
    def from_wire(cls, m: Any) -> "Result":
        k = cls.T
        return cls(field(k, m, "level", text), tuple(field(k, m, "errors", texts)),
                   tuple(field(k, m, "notes", texts)), field(k, m, "stats", stats_from_wire),
                   tuple(field(k, m, "failures", list_of(_failure))), field(k, m, "shrunk", flag))


@dataclass(frozen=True)
class Error:
    """A level could not be planned (or the target not built): an ERROR row."""

    T: ClassVar[str] = "error"
    level: str
    error: str

    def to_wire(self) -> dict:
        return {"t": self.T, "level": self.level, "error": self.error}

    @classmethod
    def from_wire(cls, m: Any) -> "Error":
        return cls(field(cls.T, m, "level", text), field(cls.T, m, "error", text))


@dataclass(frozen=True)
class Fatal:
    """The child's work raised (sent by :func:`~memspec.invariants.guard.supervise`'s child code)."""

    T: ClassVar[str] = "fatal"
    error: str

    def to_wire(self) -> dict:
        return {"t": self.T, "error": self.error}

    @classmethod
    def from_wire(cls, m: Any) -> "Fatal":
        return cls(field(cls.T, m, "error", text))


@dataclass(frozen=True)
class Note:
    """A line for the user's terminal (fuzz)."""

    T: ClassVar[str] = "note"
    text: str

    def to_wire(self) -> dict:
        return {"t": self.T, "text": self.text}

    @classmethod
    def from_wire(cls, m: Any) -> "Note":
        return cls(field(cls.T, m, "text", text))


_walk_at = pair_of(integer, integer)


@dataclass(frozen=True)
class Found:
    """A fuzz worker found a failure (unshrunk): ``walk`` its walk's
    ``(seed, run)``, ``db`` replayed from the walk database."""

    T: ClassVar[str] = "found"
    level: str
    failure: FailureRecord
    walk: tuple | None = None
    db: bool = False

    def to_wire(self) -> dict:
        return {"t": self.T, "level": self.level, "failure": self.failure.to_wire(),
                "walk": list(self.walk) if self.walk is not None else None, "db": self.db}

    @classmethod
    def from_wire(cls, m: Any) -> "Found":
        k = cls.T
        return cls(field(k, m, "level", text), field(k, m, "failure", _failure),
                   field(k, m, "walk", optional(_walk_at)), field(k, m, "db", flag))


@dataclass(frozen=True)
class FailedExample:
    """The steps of an example that failed, sent as it ended (before the worker goes on)."""

    T: ClassVar[str] = "failed-example"
    level: str
    trace: tuple                 # of engine.TraceStep
    capacity: int | None

    def to_wire(self) -> dict:
        return {"t": self.T, "level": self.level, "trace": trace_to_wire(self.trace), "cap": self.capacity}

    @classmethod
    def from_wire(cls, m: Any) -> "FailedExample":
        k = cls.T
        return cls(field(k, m, "level", text), tuple(field(k, m, "trace", list_of(trace_step_from_wire))),
                   field(k, m, "cap", optional(integer)))


@dataclass(frozen=True)
class WorkerStats:
    """What a fuzz worker cost (seconds)."""

    T: ClassVar[str] = "wstats"
    ready_s: float
    start_cpu_s: float
    fuzz_cpu_s: float
    cpu_s: float
    shrink_s: float

    def to_wire(self) -> dict:
        return {"t": self.T, "ready_s": self.ready_s, "start_cpu_s": self.start_cpu_s,
                "fuzz_cpu_s": self.fuzz_cpu_s, "cpu_s": self.cpu_s, "shrink_s": self.shrink_s}

    def figures(self) -> dict:
        return {k: v for k, v in self.to_wire().items() if k != "t"}

    @classmethod
    def from_wire(cls, m: Any) -> "WorkerStats":
        k = cls.T
        return cls(*(field(k, m, name, number) for name in ("ready_s", "start_cpu_s", "fuzz_cpu_s", "cpu_s",
                                                             "shrink_s")))


@dataclass(frozen=True)
class Task:
    """The shrinker starts task ``index``."""

    T: ClassVar[str] = "task"
    index: int

    def to_wire(self) -> dict:
        return {"t": self.T, "index": self.index}

    @classmethod
    def from_wire(cls, m: Any) -> "Task":
        return cls(field(cls.T, m, "index", integer))


@dataclass(frozen=True)
class Shrunk:
    """The shrinker's result for task ``index``: a minimized, diagnosed failure."""

    T: ClassVar[str] = "shrunk"
    index: int
    level: str
    failure: FailureRecord

    def to_wire(self) -> dict:
        return {"t": self.T, "index": self.index, "level": self.level, "failure": self.failure.to_wire()}

    @classmethod
    def from_wire(cls, m: Any) -> "Shrunk":
        k = cls.T
        return cls(field(k, m, "index", integer), field(k, m, "level", text), field(k, m, "failure", _failure))


@dataclass(frozen=True)
class Replayed(Shrunk):
    """The shrinker replayed task ``index``'s failure (said before it is minimized)."""

    T: ClassVar[str] = "replayed"


Message = Union[Done, Hello, ExampleStart, Step, Progress, PlanMsg, Result, Error, Fatal, Note, Found,
                FailedExample, WorkerStats, Task, Shrunk, Replayed]

#: message kind -> its record
KINDS: dict = {c.T: c for c in (Done, Hello, ExampleStart, Step, Progress, PlanMsg, Result, Error, Fatal, Note,
                                 Found, FailedExample, WorkerStats, Task, Shrunk, Replayed)}


def decode(m: Any) -> Message:
    """The record of message ``m`` (a parsed JSON line from a child): every
    field checked; anything else is a :class:`~memspec.invariants.wire.WireError`."""
    if type(m) is not dict:
        raise WireError("?", "<message>", "is not a dict")
    t = m.get("t")
    cls = KINDS.get(t) if type(t) is str else None
    if cls is None:
        raise WireError(t[:40] if type(t) is str else "?", "t", "names no message kind")
    try:
        return cls.from_wire(m)
    except WireError:
        raise
    except RecursionError:
        raise WireError(cls.T, "<message>", "is nested too deeply") from None


