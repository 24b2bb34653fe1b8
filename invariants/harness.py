"""The conformance engine: drive a spec :class:`~memspec.spec.core.Machine`
and an implementation side by side, one action at a time.

Generic over the machine: nothing here knows an action by name.  Each step

1. draws an *available* action from the machine's action table (by weight)
   and its arguments through a :class:`~memspec.spec.core.Chooser`
   (Hypothesis draws, a seeded ``random.Random``, or a recorded sequence);
2. asks the spec for the set of permitted outcomes (``action.step``);
3. performs the same call on the implementation under a per-call timeout;
4. finds the branch the implementation took (``Outcomes.match``), or fails
   blamed on ``Outcomes.blame`` naming the cause (wrong outcome, unexpected
   exception type, wrong return type, hang);
5. lets the spec follow that branch (``branch.then``) and binds the returned
   implementation object(s) to the spec reference id(s) ``then`` returned;
6. checks every invariant (cheap ``check``), the observations of the refs the
   step touched plus the global ones, and the data written into live memory.

A failure raises a :class:`Violation` (an ``AssertionError``) whose class is
specific to the invariant blamed, so Hypothesis shrinks each invariant's
counterexample separately and the report attributes it to that invariant.

Seed 000 is the yardstick: *"unsupported must not masquerade as a successful
no-op"* -- so the harness never trusts what the implementation says about
itself: it compares with the spec and reads the bytes back.
"""

from __future__ import annotations

import queue
from bisect import bisect_right
import signal
import threading
import time
from time import perf_counter as _perf_counter
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from memspec.spec import api
from memspec.spec.errors import DeviceFault, MemspecError

#: Pseudo-invariant ids for failures that are not a spec invariant.
SPEC_ERROR = "SPEC"      # the spec itself crashed (a bug in the model, not in the target)
TARGET_ERROR = "TARGET"  # the target factory or teardown crashed


# --------------------------------------------------------------------------
# Failures
# --------------------------------------------------------------------------

class Violation(AssertionError):
    """A conformance failure, attributed to one invariant.

    ``cause`` is one of ``outcome`` (a permitted error type but not permitted
    here, or a permitted return rejected by the spec), ``unexpected-exception``
    (an exception outside the contract), ``wrong-type`` (a return of the wrong
    type), ``hang``, ``invariant``, ``observation``, ``data``, ``capability``.
    """

    def __init__(self, invariant: str, cause: str, reason: str, trace: list | None = None, step: int | None = None):
        super().__init__(f"{invariant} [{cause}] {reason}")
        self.invariant = invariant
        self.cause = cause
        self.reason = reason
        self.trace = list(trace or [])
        self.step = step


_VIOLATION_CLASSES: dict[str, type[Violation]] = {}


def violation_class(invariant: str) -> type[Violation]:
    """One subclass per invariant id: Hypothesis keys distinct bugs by
    exception type, so a shrink never trades one invariant's failure for
    another's."""
    cls = _VIOLATION_CLASSES.get(invariant)
    if cls is None:
        safe = "".join(ch if ch.isalnum() else "_" for ch in invariant)
        cls = type(f"Violation_{safe}", (Violation,), {"__module__": __name__})
        _VIOLATION_CLASSES[invariant] = cls
    return cls


class SpecError(Exception):
    """The spec model itself raised while stepping (a bug in the spec, not in the target)."""


class TargetError(Exception):
    """The target could not be built or torn down (factory raised)."""


class Hang(BaseException):
    """Raised inside a call that exceeded the per-call timeout (BaseException
    so a target's ``except Exception`` cannot swallow it)."""


class _HangResult(Exception):
    """Stand-in error value for a call that did not return in time."""


# --------------------------------------------------------------------------
# Per-call timeout
# --------------------------------------------------------------------------

class CallGuard:
    """Run implementation calls with a per-call timeout.

    On the main thread an interval timer (``SIGALRM``) interrupts a call that
    overruns; elsewhere a persistent worker thread runs the call and the
    caller waits with a timeout, abandoning the worker if it hangs.  Either
    way a hang is reported, never waited out.

    A guard installed by its owner with :meth:`install` (who then calls
    :meth:`uninstall`) keeps the timer running between calls and re-arms it
    only when a tenth of the timeout has passed since it was last armed: a
    call may then be interrupted after 0.9x to 1x the timeout, and a step's
    dozen calls cost no ``setitimer`` system call each.  An alarm that fires
    between calls is ignored.  A guard installed lazily by its first call
    arms and disarms the timer around every call (nobody would stop it).
    """

    def __init__(self, timeout: float = 5.0, mode: str = "auto") -> None:
        self.timeout = float(timeout)
        if mode == "auto":
            mode = "signal" if (threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")) else "thread"
        self.mode = mode
        self._armed = False
        self._old_handler: Any = None
        self._installed = False
        self._keep = False          # keep the timer running between calls (explicit install)
        self._armed_at = -1e18      # perf_counter() when the timer was last armed
        self._worker: _Worker | None = None

    def _hung(self) -> "_HangResult":
        r = _HangResult(f"did not return within {self.timeout:g} s")
        # Once a target has hung, shrinking replays the hang many times: wait
        # less from now on (a call that takes this long already failed once).
        self.timeout = max(0.05, min(self.timeout, self.timeout / 4))
        self._armed_at = -1e18
        return r

    # signal mode --------------------------------------------------------
    def _on_alarm(self, signum, frame):  # pragma: no cover - timing dependent
        # stays armed (the timer repeats) until the call unwinds: a Hang
        # swallowed by a finalizer or a bare ``except`` is raised again
        if self._armed:
            raise Hang()

    def install(self) -> None:
        self._install()
        self._keep = self._installed

    def _install(self) -> None:
        if self.mode == "signal" and not self._installed:
            if threading.current_thread() is not threading.main_thread():
                self.mode = "thread"
                return
            self._old_handler = signal.signal(signal.SIGALRM, self._on_alarm)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old_handler or signal.SIG_DFL)
            self._installed = False
            self._keep = False
            self._armed_at = -1e18

    def call(self, fn: Callable, *args, **kwargs) -> tuple[Any, BaseException | None]:
        """``(value, None)`` or ``(None, error)``; a hang gives a :class:`_HangResult` error."""
        if self.mode == "signal":
            if not self._installed:
                self._install()
                if self.mode != "signal":
                    return self.call(fn, *args, **kwargs)
            keep = self._keep
            try:
                if keep:
                    now = _perf_counter()
                    if now - self._armed_at > 0.1 * self.timeout:
                        signal.setitimer(signal.ITIMER_REAL, self.timeout, 0.05)
                        self._armed_at = now
                    self._armed = True
                    try:
                        value = fn(*args, **kwargs)
                    finally:
                        self._armed = False
                else:
                    self._armed = True
                    signal.setitimer(signal.ITIMER_REAL, self.timeout, 0.05)
                    try:
                        value = fn(*args, **kwargs)
                    finally:
                        self._armed = False
                        signal.setitimer(signal.ITIMER_REAL, 0)
            except Hang:
                return None, self._hung()
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # noqa: BLE001 - a target may raise anything
                return None, e
            return value, None
        return self._thread_call(fn, args, kwargs)

    def _thread_call(self, fn, args, kwargs):
        if self._worker is None:
            self._worker = _Worker()
        box: list = []
        ev = threading.Event()
        self._worker.jobs.put((fn, args, kwargs, box, ev))
        if not ev.wait(self.timeout):
            self._worker = None  # abandoned: it is stuck in the target
            return None, self._hung()
        return box[0]


class _Worker:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        t = threading.Thread(target=self._loop, name="memspec-call", daemon=True)
        t.start()

    def _loop(self) -> None:
        while True:
            fn, args, kwargs, box, ev = self.jobs.get()
            try:
                box.append((fn(*args, **kwargs), None))
            except BaseException as e:  # noqa: BLE001
                box.append((None, e))
            ev.set()


# --------------------------------------------------------------------------
# Choosers
# --------------------------------------------------------------------------

class HypothesisChooser:
    """Draws through Hypothesis's choice sequence (shrinkable).

    Uses the low-level ``ConjectureData.draw_integer``/``draw_boolean`` when
    available (a strategy ``data.draw`` costs about twice as much per draw);
    ``choice`` draws an index, so its choice sequence is the same as the
    random walk's (see :class:`RandomChooser`) and a walk can be replayed
    into Hypothesis for shrinking.
    """

    __slots__ = ("_int", "_bool", "_cd", "_w", "_cum")

    def __init__(self, data: Any) -> None:
        cd = getattr(data, "conjecture_data", data)
        self._cd = None
        self._w: tuple | None = None   # the last weights drawn by, and their running totals
        self._cum: tuple = ()
        if hasattr(cd, "draw_integer") and hasattr(cd, "draw_boolean"):
            self._cd = cd
            self._int = cd.draw_integer  # (min_value, max_value)
            self._bool = cd.draw_boolean
        else:  # pragma: no cover - older/newer Hypothesis without the low-level API
            from hypothesis import strategies as st

            self._int = lambda lo, hi: data.draw(st.integers(lo, hi))
            self._bool = lambda: data.draw(st.booleans())

    def integer(self, lo: int, hi: int) -> int:
        return self._int(lo, hi)

    def weighted(self, weights: tuple) -> int:
        """An index drawn with probability proportional to ``weights``: one
        plain integer draw in ``[0, sum(weights))`` mapped through the
        cumulative weights (see :func:`_weighted_index`).

        Hypothesis's integer distribution favours 0 a little (about 5% extra
        here), which lands on the table's first, heaviest action; a plain
        draw costs about half a ``weights=`` draw, and shrinking still moves
        towards index 0."""
        if weights is self._w:
            cum = self._cum
        else:
            cum = self._cum = _cumulative(weights)
            self._w = weights
        return bisect_right(cum, self._int(0, cum[-1] - 1))

    def choice(self, options: Sequence[Any]) -> Any:
        if not isinstance(options, (list, tuple, range)):
            options = list(options)
        n = len(options)
        if n == 0:
            raise SpecError("choice from an empty domain")
        return options[self._int(0, n - 1)] if n > 1 else options[0]

    def boolean(self) -> bool:
        return bool(self._bool())


_CUMULATIVE: dict = {}


def _cumulative(weights: tuple) -> tuple:
    """Running totals of ``weights`` (cached per weight tuple)."""
    cum = _CUMULATIVE.get(weights)
    if cum is None:
        if not weights or any(not isinstance(w, int) or w <= 0 for w in weights):
            raise SpecError(f"action weights must be positive ints, got {weights!r}")
        total, out = 0, []
        for w in weights:
            total += w
            out.append(total)
        cum = _CUMULATIVE[weights] = tuple(out)
    return cum


def _weighted_index(cum: tuple, k: int) -> int:
    """The index whose slot ``[cum[i-1], cum[i])`` holds ``k``."""
    return bisect_right(cum, k)


class RandomChooser:
    """A seeded ``random.Random`` chooser that records the choice sequence
    in Hypothesis's primitive form (``int`` for integer/choice index, ``bool``)."""

    __slots__ = ("rng", "record")

    def __init__(self, rng: Any, record: list | None = None) -> None:
        self.rng = rng
        self.record = record

    def integer(self, lo: int, hi: int) -> int:
        v = self.rng.randint(lo, hi) if hi > lo else lo
        if self.record is not None:
            self.record.append(v)
        return v

    def weighted(self, weights: tuple) -> int:
        """As :meth:`HypothesisChooser.weighted` (the same recorded draw)."""
        cum = _cumulative(weights)
        return _weighted_index(cum, self.integer(0, cum[-1] - 1))

    def choice(self, options: Sequence[Any]) -> Any:
        if not isinstance(options, (list, tuple, range)):
            options = list(options)
        n = len(options)
        if n == 0:
            raise SpecError("choice from an empty domain")
        return options[self.integer(0, n - 1)] if n > 1 else options[0]

    def boolean(self) -> bool:
        v = self.rng.random() < 0.5
        if self.record is not None:
            self.record.append(v)
        return v


class ReplayChooser:
    """Replays a recorded choice sequence (used by reproductions when an
    argument value is not a Python literal)."""

    def __init__(self, choices: Sequence[Any]) -> None:
        self.choices = list(choices)
        self.i = 0

    def _next(self):
        if self.i >= len(self.choices):
            raise SpecError("recorded choice sequence exhausted (the spec or target is nondeterministic)")
        v = self.choices[self.i]
        self.i += 1
        return v

    def integer(self, lo: int, hi: int) -> int:
        return int(self._next())

    def choice(self, options: Sequence[Any]) -> Any:
        options = list(options) if not isinstance(options, (list, tuple, range)) else options
        return options[self.integer(0, len(options) - 1)] if len(options) > 1 else options[0]

    def boolean(self) -> bool:
        return bool(self._next())


class RecordingChooser:
    """Wraps a chooser and records the primitive choices it makes."""

    __slots__ = ("inner", "record", "_integer")

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.record: list = []
        self._integer = inner.integer

    def integer(self, lo: int, hi: int) -> int:
        v = self._integer(lo, hi)
        self.record.append(v)
        return v

    def choice(self, options: Sequence[Any]) -> Any:
        options = list(options) if not isinstance(options, (list, tuple, range)) else options
        n = len(options)
        if n == 0:
            raise SpecError("choice from an empty domain")
        return options[self.integer(0, n - 1)] if n > 1 else options[0]

    def boolean(self) -> bool:
        v = self.inner.boolean()
        self.record.append(v)
        return v


# --------------------------------------------------------------------------
# Systems under test built by the harness
# --------------------------------------------------------------------------

class RefTable:
    """``refs`` + ``ref(id)``: the implementation objects bound to spec ids."""

    def __init__(self) -> None:
        self.refs: dict[int, object] = {}

    def ref(self, ref_id: int) -> object:
        try:
            return self.refs[ref_id]
        except KeyError:
            raise SpecError(f"the spec asked for reference #{ref_id}, which no step bound") from None


class MechanismSUT(RefTable):
    """:class:`~memspec.spec.api.MechanismUnderTest`: the target's mechanism,
    a second independent instance of it (the source of foreign handles), its
    EP if any, and the physical-bytes probe."""

    def __init__(self, instance: api.TargetInstance, foreign: api.TargetInstance) -> None:
        super().__init__()
        self.instance = instance
        self.foreign_instance = foreign
        self.mechanism = instance.mechanism
        self.foreign = foreign.mechanism
        self.ep = instance.ep
        self.physical_bytes = instance.physical_bytes
        self.capacity = instance.capacity


class CachingSUT(RefTable):
    """What the caching allocator machine's ``perform`` functions see."""

    def __init__(self, instance: api.TargetInstance) -> None:
        super().__init__()
        self.instance = instance
        self.allocator = instance.allocator
        self.ep = instance.ep
        self.mechanism = instance.mechanism
        self.physical_bytes = instance.physical_bytes
        self.capacity = instance.capacity


# --------------------------------------------------------------------------
# Plan: everything fixed for one (target, level)
# --------------------------------------------------------------------------

@dataclass
class Stats:
    examples: int = 0
    steps: int = 0
    seconds: float = 0.0
    actions: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    #: invariant id -> total steps run (all examples) when it first failed
    first_failure_steps: dict = field(default_factory=dict)
    failures_seen: int = 0

    def rate(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Plan:
    """A target at one level, with the machine, its init arguments, the
    actions/observations that apply, and the invariants that do not (N/A)."""

    target: str
    level: str
    factory: Callable[..., api.TargetInstance]
    machine: Any
    init_kwargs: dict
    actions: list
    observations: list
    capabilities: dict
    na: dict  # invariant id -> reason
    make_sut: Callable[[api.TargetInstance], Any]
    factory_kwargs: dict = field(default_factory=dict)
    timeout: float = 5.0
    guard_mode: str = "auto"
    integrity: bool = True
    #: pattern one new region in ``integrity_sample`` (chosen by its ref id,
    #: so a replay patterns a superset); 1 = every region
    integrity_sample: int = 1
    stats: Stats = field(default_factory=Stats)
    on_step: Callable[["Plan"], None] | None = None
    mutant: Any = None
    machine_ref: str | None = None  # "module:attr" of a machine other than the level's

    @property
    def invariant_ids(self) -> list[str]:
        return [inv.id for inv in self.machine.invariants]

    def titles(self) -> dict[str, str]:
        return {inv.id: inv.title for inv in self.machine.invariants}

    def new_run(self, guard: CallGuard | None = None) -> "Run":
        return Run(self, guard)


def _describe_value(v: Any, limit: int = 120) -> str:
    try:
        r = repr(v)
    except Exception:  # noqa: BLE001 - a hostile __repr__
        r = f"<{type(v).__name__} with a failing repr>"
    return r if len(r) <= limit else r[: limit - 3] + "..."


@dataclass
class TraceStep:
    """One executed step: the action, its arguments (and the primitive
    choices that drew them), what happened, and the ids bound."""

    action: str
    args: dict
    choices: list
    outcome: str
    bound: tuple = ()


# --------------------------------------------------------------------------
# Run: one example (a fresh target, a fresh spec state)
# --------------------------------------------------------------------------

class Run:
    """One execution from the initial state: a fresh target instance and spec state."""

    def __init__(self, plan: Plan, guard: CallGuard | None = None) -> None:
        self.plan = plan
        self.machine = plan.machine
        self.guard = guard or CallGuard(plan.timeout, plan.guard_mode)
        self.trace: list[TraceStep] = []
        self.instance: api.TargetInstance | None = None
        self.foreign: api.TargetInstance | None = None
        self.closed = False
        self.failed = False
        self.nsteps = 0
        self._action = None
        self._obs_cache: dict | None = None
        self._checks: list | None = None
        try:
            self.instance = plan.factory(**plan.factory_kwargs)
            self.sut = plan.make_sut(self, self.instance)
        except Violation:
            raise
        except SpecError:
            raise
        except Exception as e:  # noqa: BLE001
            raise TargetError(f"target {plan.target!r} could not be built: {type(e).__name__}: {e}") from e
        try:
            self.state = self.machine.init(**plan.init_kwargs)
        except Exception as e:  # noqa: BLE001
            raise SpecError(f"{self.machine.name}.init{plan.init_kwargs} raised {type(e).__name__}: {e}") from e
        self.integrity = make_integrity(self) if plan.integrity else None
        self.physical = PhysicalProbe.make(self)
        self._checks = _step_checks(self.machine, self.state)
        self.nsteps = 0
        plan.stats.examples += 1

    # -- failing --------------------------------------------------------
    def fail(self, invariant: str, cause: str, reason: str) -> None:
        self.failed = True
        st = self.plan.stats
        st.failures_seen += 1
        st.first_failure_steps.setdefault(invariant, st.steps)
        raise violation_class(invariant)(invariant, cause, reason, self.trace, self.nsteps)

    # -- one step -------------------------------------------------------
    def available(self) -> list:
        state = self.state
        try:
            return [a for a in self.plan.actions if a.available(state)]
        except Exception as e:  # noqa: BLE001
            raise SpecError(f"an action's availability check raised {type(e).__name__}: {e}") from e

    def choose(self, chooser: Any) -> tuple[Any, dict, list]:
        """Draw an available action (by weight) and its arguments.

        First up to three draws over the whole table (weights fixed, so the
        draw costs one availability check instead of one per action); if
        all land on unavailable actions, one draw over the available ones."""
        weighted = getattr(chooser, "weighted", None)
        acts = self.plan.actions
        if weighted is not None and len(acts) > 1:
            ws = self.plan.__dict__.get("_weights")
            if ws is None:
                ws = self.plan.__dict__["_weights"] = tuple(x.weight for x in acts)
            state = self.state
            for _ in range(3):
                a = acts[weighted(ws)]
                try:
                    ok = a.available(state)
                except Exception as e:  # noqa: BLE001
                    raise SpecError(f"{a.name}: availability check raised {type(e).__name__}: {e}") from e
                if ok:
                    return self._draw_args(a, chooser)
        avail = self.available()
        if not avail:
            raise SpecError(f"{self.machine.name}: no action is available in this state")
        n = len(avail)
        if n == 1:
            a = avail[0]
        else:
            weighted = getattr(chooser, "weighted", None)
            if weighted is not None:
                a = avail[weighted(tuple(x.weight for x in avail))]
            else:
                total = 0
                for x in avail:
                    total += x.weight
                k = chooser.integer(0, total - 1)
                for a in avail:
                    k -= a.weight
                    if k < 0:
                        break
        return self._draw_args(a, chooser)

    def _draw_args(self, a: Any, chooser: Any) -> tuple[Any, dict, list]:
        rec = RecordingChooser(chooser)
        try:
            args = a.draw_args(self.state, rec)
        except SpecError:
            raise
        except Exception as e:  # noqa: BLE001
            raise SpecError(f"drawing arguments of {a.name} raised {type(e).__name__}: {e}") from e
        return a, args, rec.record

    def step(self, chooser: Any) -> TraceStep:
        action, args, choices = self.choose(chooser)
        return self.apply(action, args, choices)

    def apply(self, action: Any, args: dict, choices: list | None = None) -> TraceStep:
        """Run ``action(**args)`` on spec and implementation and check everything."""
        plan = self.plan
        st = plan.stats
        st.steps += 1
        self.nsteps += 1
        st.actions[action.name] += 1
        ts = TraceStep(action.name, dict(args), list(choices or []), "", ())
        self.trace.append(ts)
        state = self.state
        try:
            outs = action.step(state, **args)
        except Exception as e:  # noqa: BLE001
            raise SpecError(f"{action.name}.step({args}) raised {type(e).__name__}: {e}") from e
        value, err = self.guard.call(action.perform, self.sut, **args)
        if isinstance(err, SpecError):
            raise err
        branch = outs.match(value, err)
        if branch is None:
            ts.outcome = self._describe_answer(value, err)
            self.fail(outs.blame, *self._mismatch(action, args, outs, value, err))
        is_return = err is None
        ts.outcome = ("returns " + branch.describe) if is_return else f"raises {type(err).__name__}"
        st.outcomes[(action.name, ts.outcome)] += 1
        try:
            result = branch.then(value if is_return else err)
        except Exception as e:  # noqa: BLE001
            raise SpecError(f"{action.name}: following branch {ts.outcome!r} raised {type(e).__name__}: {e}") from e
        bound = self._bind(result, value) if is_return else ()
        ts.bound = bound
        self._action = action
        self.check_after(outs.touched, bound, args)
        if plan.on_step is not None:
            plan.on_step(plan)
        return ts

    @staticmethod
    def _describe_answer(value: Any, err: BaseException | None) -> str:
        if isinstance(err, _HangResult):
            return "hangs"
        if err is not None:
            return f"raises {type(err).__name__}: {err}"
        return f"returns {_describe_value(value)}"

    def _mismatch(self, action, args, outs, value, err) -> tuple[str, str]:
        expected = outs.describe()
        call = f"{action.name}({', '.join(f'{k}={_describe_value(v, 40)}' for k, v in args.items())})"
        if isinstance(err, _HangResult):
            return "hang", f"{call} hangs: {err} (expected: {expected})"
        if err is not None and not isinstance(err, MemspecError):
            return "unexpected-exception", (
                f"{call} raised {type(err).__module__}.{type(err).__name__}: {err} -- not an error of the contract "
                f"(expected: {expected})")
        if err is not None:
            return "outcome", f"{call} raised {type(err).__name__}: {err} (expected: {expected})"
        # A normal return that no Returns branch accepts.
        returns = [b for b in outs.branches if hasattr(b, "accepts")]
        if isinstance(value, _NEVER_RETURNED):
            return "wrong-type", (f"{call} returned {type(value).__module__}.{type(value).__name__} "
                                  f"{_describe_value(value)}: no call of the contract returns that (expected: {expected})")
        if not returns:
            return "outcome", f"{call} returned {_describe_value(value)} instead of raising (expected: {expected})"
        if _wrong_type(returns, value):
            return "wrong-type", (f"{call} returned {type(value).__module__}.{type(value).__name__} "
                                  f"{_describe_value(value)}: not the type the contract returns (expected: {expected})")
        return "outcome", f"{call} returned {_describe_value(value)} (expected: {expected})"

    def _bind(self, result: Any, value: Any) -> tuple:
        refs = getattr(self.sut, "refs", None)
        if refs is None:
            return ()
        if type(value).__name__ == "Seen" and hasattr(value, "obj"):
            value = value.obj  # the spec's wrapper of what perform read: bind the implementation object
        if isinstance(result, int) and not isinstance(result, bool):
            refs[result] = value
            return (result,)
        if isinstance(result, tuple) and result and all(isinstance(r, int) and not isinstance(r, bool) for r in result):
            if isinstance(value, (tuple, list)) and len(value) == len(result):
                for r, v in zip(result, value):
                    refs[r] = v
            else:
                for r in result:
                    refs[r] = value
            return result
        return ()

    # -- checks ---------------------------------------------------------
    def check_after(self, touched: tuple, bound: tuple, args: dict | None = None) -> None:
        state = self.state
        checks = self._checks
        if checks is None:
            try:
                bad = self.machine.check_invariants(state)
            except Exception as e:  # noqa: BLE001
                raise SpecError(f"an invariant check raised {type(e).__name__}: {e}") from e
            if bad:
                inv, why = bad[0]
                self.fail(inv, "invariant", why)
        else:
            bad = None
            try:
                for inv, fn in checks:  # all of them, as check_invariants (a crash is a SpecError)
                    why = fn(state)
                    if why is not None and bad is None:
                        bad = (inv, why)
            except Exception as e:  # noqa: BLE001
                raise SpecError(f"an invariant check raised {type(e).__name__}: {e}") from e
            if bad is not None:
                self.fail(bad[0], "invariant", bad[1])
        if self.plan.observations:
            self.check_observations(touched + bound)
        if self.physical is not None:
            self.physical.check(bound)
        integrity = self.integrity
        if integrity is not None:
            if args:
                # the refs the arguments name, each once (a second refresh of
                # a ref in the same state finds nothing to do)
                regions = integrity.regions
                named = tuple(v for v in args.values() if type(v) is int and v in regions and v not in touched)
                if named:
                    touched = touched + named
            integrity.after_step(touched, bound)

    def _observations_for(self, action: Any) -> list:
        """The plan's observations, those blamed on the action's own
        invariants first (in the action's order): when one wrong answer
        shows in several figures, the report names the rule the action is
        about."""
        cache = self._obs_cache
        if cache is None:
            cache = self._obs_cache = self.plan.__dict__.setdefault("_obs_order", {})
        key = getattr(action, "name", None)
        order = cache.get(key)
        if order is None:
            invs = list(getattr(action, "invariants", ()) or ())
            rank = {inv: i for i, inv in enumerate(invs)}
            order = sorted(self.plan.observations, key=lambda o: rank.get(o.blame, len(rank)))
            cache[key] = order
        return order

    def check_observations(self, touched: tuple) -> None:
        """Compare every applicable observation's spec figure with the
        implementation's, in the action's order (see :meth:`_observations_for`).

        The implementation's figures are read in one guarded call (queries
        have no effects); the first difference, error or hang in that order
        is the failure."""
        state = self.state
        jobs = []
        add = jobs.append
        for obs in self._observations_for(self._action):
            try:
                for r in obs.refs(state, touched):
                    add((obs, r))
            except Exception as e:  # noqa: BLE001
                raise SpecError(f"observation {obs.name}: refs() raised {type(e).__name__}: {e}") from e
        if not jobs:
            return
        box: list = []
        _, hang = self.guard.call(self._observe_all, jobs, box)
        got = box[:]  # a worker abandoned in a hang may still append
        if hang is not None and not isinstance(hang, _HangResult):
            raise hang if isinstance(hang, SpecError) else SpecError(
                f"reading the observations raised {type(hang).__name__}: {hang}")
        for i, (obs, r) in enumerate(jobs):
            try:
                expected = obs.expected(state, r)
            except Exception as e:  # noqa: BLE001
                raise SpecError(f"observation {obs.name}: expected() raised {type(e).__name__}: {e}") from e
            if i == len(got):  # the read that hung
                self.fail(obs.blame, "hang", f"reading {self._where(obs, r)} hangs: {hang}")
            value, err = got[i]
            if err is not None:
                if isinstance(err, SpecError):
                    raise err
                cause = "unexpected-exception" if not isinstance(err, MemspecError) else "observation"
                self.fail(obs.blame, cause,
                          f"reading {self._where(obs, r)} raised {type(err).__name__}: {err} (spec: {expected!r})")
            if value != expected:
                self.fail(obs.blame, "observation",
                          f"{self._where(obs, r)}: implementation says {_describe_value(value)}, spec says {expected!r}")
        if hang is not None:
            obs, r = jobs[-1]
            self.fail(obs.blame, "hang", f"reading {self._where(obs, r)} hangs: {hang}")

    def _observe_all(self, jobs: list, got: list) -> None:
        """Run under the guard: each observation's ``observed`` in turn, its
        ``(value, error)`` appended to ``got`` (a hang stops the loop)."""
        sut = self.sut
        for obs, r in jobs:
            try:
                got.append((obs.observed(sut, r), None))
            except (Hang, KeyboardInterrupt):
                raise
            except BaseException as e:  # noqa: BLE001 - a target may raise anything
                got.append((None, e))

    @staticmethod
    def _where(obs: Any, r: Any) -> str:
        return f"{obs.name}" + (f" of #{r}" if r is not None else "")

    def teardown(self) -> None:
        """End of the example: full invariant scan, full data verify, close the target."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.failed:
                return
            try:
                bad = self.machine.check_invariants(self.state, full=True)
            except Exception as e:  # noqa: BLE001
                raise SpecError(f"a full invariant check raised {type(e).__name__}: {e}") from e
            if bad:
                inv, why = bad[0]
                self.fail(inv, "invariant", why + " (full check at end of run)")
            if self.integrity is not None:
                self.integrity.verify_all()
        finally:
            self.close()

    def close(self) -> None:
        for inst in (self.instance, getattr(self, "foreign", None)):
            c = getattr(inst, "close", None) if inst is not None else None
            if c is not None:
                try:
                    self.guard.call(c)
                except Exception:  # noqa: BLE001 - teardown must not crash the harness
                    pass


def _level_wrappers() -> dict:
    """The code objects of the spec's level wrappers (``_sys``, ``_mech``,
    ``_both`` in :mod:`memspec.spec.invariants`), or ``{}`` when that module
    does not define them as expected."""
    global _WRAPPERS
    if _WRAPPERS is None:
        try:
            from memspec.spec import invariants as SI
            from memspec.spec.state import MechState, SysState

            _WRAPPERS = {SI._sys(len).__code__: ("sys", SysState), SI._mech(len).__code__: ("mech", MechState),
                         SI._both(len, len).__code__: ("both", MechState)}
        except Exception:  # noqa: BLE001 - no such wrappers: every check runs as it is
            _WRAPPERS = {}
    return _WRAPPERS


_WRAPPERS: dict | None = None


def _specialise(check: Callable, state: Any) -> Callable | None:
    """``check`` narrowed to ``state``'s level: a ``_sys``/``_mech`` wrapper
    is its predicate on its own level and ``None`` (holds vacuously, skipped)
    on the other; ``_both`` is the predicate of ``state``'s level.  The same
    answers, without the per-step ``isinstance`` dispatch (the state object
    of a run never changes type)."""
    code = getattr(check, "__code__", None)
    info = _level_wrappers().get(code) if code is not None else None
    if info is None or not check.__closure__:
        return check
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in check.__closure__)))
    kind, cls = info
    mine = isinstance(state, cls)
    if kind == "both":
        return cells["mech"] if mine else cells["sys"]
    return cells["fn"] if mine else None


def _step_checks(machine: Any, state: Any) -> list | None:
    """``[(invariant id, check)]`` to run after every step: every invariant
    of ``machine`` in order, each narrowed to the run's level (see
    :func:`_specialise`); those that hold vacuously at this level are left
    out.  ``None`` (run ``machine.check_invariants``) when the machine
    overrides how its invariants are checked."""
    try:
        from memspec.spec.core import Machine

        if not isinstance(machine, Machine) or type(machine).check_invariants is not Machine.check_invariants \
                or "check_invariants" in getattr(machine, "__dict__", {}):
            return None
        out = []
        for inv in machine.invariants:
            fn = _specialise(inv.check, state)
            if fn is not None:
                out.append((inv.id, fn))
        return out
    except Exception:  # noqa: BLE001 - fall back to the machine's own loop
        return None


class PhysicalProbe:
    """Mechanism level: the physical bytes the target's device holds (its
    ``physical_bytes`` probe, independent of its own bookkeeping) must equal
    what the spec says is installed (``state.physical``) plus what the
    foreign twin took on the same device.  Blamed on S5, as the spec's own
    mechanism-level S5 check of reported against installed bytes: a release
    (or commit) answered as done whose bytes did not move is a success that
    did not happen (*no silent no-ops*).  One probe per step: flat cost."""

    def __init__(self, run: Run, probe: Callable[[], int], base: int) -> None:
        self.run = run
        self.probe = probe
        self.base = base
        self.foreign = 0

    @classmethod
    def make(cls, run: Run) -> "PhysicalProbe | None":
        if run.plan.level != "mechanism" or not hasattr(run.state, "physical"):
            return None
        probe = getattr(run.sut, "physical_bytes", None)
        if probe is None:
            return None
        v, err = run.guard.call(probe)
        if err is not None or not isinstance(v, int):
            return None
        return cls(run, probe, v - run.state.physical)

    def check(self, bound: tuple) -> None:
        s = self.run.state
        allocs = getattr(s, "allocations", {})
        for r in bound:
            rec = allocs.get(r)
            if rec is not None and getattr(rec, "foreign", False):
                self.foreign += rec.footprint
        got, err = self.run.guard.call(self.probe)
        if err is not None:
            self.run.fail("S5", "hang" if isinstance(err, _HangResult) else "observation",
                          f"the physical-bytes probe raised {type(err).__name__}: {err}")
        want = self.base + s.physical + self.foreign
        if got != want:
            self.run.fail("S5", "observation",
                          f"the device holds {got} physical bytes; the spec accounts for {want} "
                          f"({s.physical} installed + {self.foreign} by the foreign twin"
                          + (f" + {self.base} before the run" if self.base else "") + ")")


def _safe_witness(b: Any) -> Any:
    try:
        return b.witness() if b.witness is not None else None
    except Exception:  # noqa: BLE001
        return None


#: types no call of the contract ever returns
_NEVER_RETURNED = (str, bytes, bytearray, float, complex, dict, set, frozenset)


def _wrong_type(returns: list, value: Any) -> bool:
    """A return is of the wrong type when the spec's witnesses show another
    type, or when every ``accepts`` predicate crashes on it (a predicate over
    a handle's fields applied to a string, say)."""
    if isinstance(value, _NEVER_RETURNED):
        return True
    kinds = set()
    for b in returns:
        w = _safe_witness(b)
        if w is not None:
            kinds.add(type(w))
    if kinds:
        if isinstance(value, bool) or not any(isinstance(value, k) for k in kinds):
            # ints are interchangeable with bools only when the spec says so
            if not (bool in kinds and isinstance(value, bool)):
                return True
        return False
    crashed = 0
    for b in returns:
        try:
            b.accepts(value)
        except Exception:  # noqa: BLE001
            crashed += 1
    return crashed == len(returns)


# --------------------------------------------------------------------------
# Data integrity
# --------------------------------------------------------------------------

STAMP = 16          # bytes per stamp
FULL_LIMIT = 4096   # ranges up to this size get a full pattern
MAX_STAMPS = 2      # page stamps per range otherwise (start, end, sampled page boundaries): each
                    # stamp may materialise a simulated page, so keep them few
VERIFY_PER_STEP = 2 # ranges re-verified per step (round robin): flat per-step cost


def _pattern(ref: int, gen: int, offset: int, n: int) -> bytes:
    """A distinct, position-dependent pattern for ``ref`` (so a copy of one
    range into another, or a shifted mapping, is also caught)."""
    seed = ((ref * 0x9E3779B1) ^ (gen * 0x85EBCA77) ^ (offset * 0xC2B2AE3D)) & 0xFFFFFFFFFFFFFFFF
    block = seed.to_bytes(8, "little") + (ref & 0xFFFFFFFF).to_bytes(4, "little") + (offset & 0xFFFFFFFF).to_bytes(4, "little")
    reps = n // 16 + 1
    return (block * reps)[:n]


@dataclass
class _Region:
    ref: int
    gen: int
    spans: list  # [(address, size)] written
    blame_fault: str
    blame_mismatch: str
    probe: bool = False  # not patterned: only checked to be readable (no fault)
    want: list | None = None  # the pattern of each span (computed once)

    def patterns(self) -> list:
        if self.want is None:
            self.want = [_pattern(self.ref, self.gen, addr, n) for addr, n in self.spans]
        return self.want


class Integrity:
    """Writes a distinct pattern into every live allocation and committed
    range through the EP's copies, and verifies it later.

    Which ranges are live is read from the spec through a per-machine
    *locator* (``locate(run, ref_id, obj) -> (spans, blame_fault,
    blame_mismatch) | None``); the bytes are written and read through the
    target's EP on a stream of the harness's own (synchronized at once, so the
    harness's copies never race the spec's fences).  Per step only the ranges
    the step touched or bound are (re)written and ``VERIFY_PER_STEP`` others
    are verified round robin, so the cost per step does not grow with the
    live set; :meth:`verify_all` scans everything at the end of a run.

    Blame: a :class:`DeviceFault` writing a range the spec says is backed is
    blamed on what the locator names (S5 for a commit or allocation that
    "succeeded" without backing); a changed byte on what it names for
    mismatches (S4 when the range's release is queued behind a fence, S11
    otherwise: two live ranges sharing physical bytes means the ledger counts
    bytes that do not exist).
    """

    def __init__(self, run: Run, ep: Any, locate: Callable) -> None:
        self.run = run
        self.ep = ep
        self.locate = locate
        self.regions: dict[int, _Region] = {}
        self.order: list[int] = []
        self.cursor = 0
        self.gen = 0
        self.stream: int | None = None

    def _stream(self) -> int:
        if self.stream is None:
            s, err = self.run.guard.call(self.ep.new_stream)
            if err is not None:
                self.run.fail("S7", "unexpected-exception" if not isinstance(err, MemspecError) else "data",
                              f"EP new_stream() raised {type(err).__name__}: {err}")
            self.stream = s
        return self.stream

    def _spans(self, address: int, size: int, page: int) -> list:
        if size <= FULL_LIMIT:
            return [(address, size)]
        spans = [(address, STAMP), (address + size - STAMP, STAMP)]
        page = max(int(page or 0), STAMP)
        first = (address // page + 1) * page
        n = (address + size - first) // page if first < address + size else 0
        step = max(1, n // MAX_STAMPS + (1 if n % MAX_STAMPS else 0)) if n else 1
        p = first
        while p + STAMP <= address + size - STAMP and len(spans) < MAX_STAMPS + 2:
            spans.append((p, STAMP))
            p += page * step
        return spans

    def _write(self, region: _Region) -> None:
        if region.probe:
            self._verify(region)
            return
        s = self._stream()
        done: list = []
        # one guarded call writes every stamp and runs the copies (so they
        # never race the spec's fences); ``done`` says which span failed
        _, err = self.run.guard.call(self._write_spans, s, region, done)
        if err is not None:
            addr, n = region.spans[len(done) if len(done) < len(region.spans) else 0]
            self._io_fail(region, addr, n, "writing", err)

    def _write_spans(self, s: int, region: _Region, done: list) -> None:
        write = self.ep.write
        for (addr, _n), data in zip(region.spans, region.patterns()):
            write(s, addr, data)
            done.append(addr)
        self.ep.synchronize(s)

    def _read_spans(self, s: int, spans: list, got: list) -> None:
        read = self.ep.read
        for addr, n in spans:
            got.append(read(s, addr, n))

    def _verify(self, region: _Region) -> None:
        s = self._stream()
        got: list = []
        spans = region.spans
        _, err = self.run.guard.call(self._read_spans, s, spans, got)
        if err is not None:
            addr, n = spans[len(got)] if len(got) < len(spans) else spans[-1]
            self._io_fail(region, addr, n, "reading", err)
        if region.probe:
            return
        for (addr, n), data, want in zip(spans, got, region.patterns()):
            if data != want and bytes(data) != want:
                self.run.fail(region.blame_mismatch, "data",
                              f"bytes of #{region.ref} at {addr:#x}+{n} changed behind its back (expected the harness's "
                              f"pattern, read {bytes(data)[:16].hex()}...): overlapping or prematurely reused memory")

    def _io_fail(self, region: _Region, addr: int, n: int, verb: str, err: BaseException) -> None:
        if isinstance(err, _HangResult):
            self.run.fail(region.blame_fault, "hang", f"{verb} #{region.ref} at {addr:#x}+{n} through the EP hangs")
        if isinstance(err, DeviceFault):
            self.run.fail(region.blame_fault, "data",
                          f"{verb} #{region.ref} at {addr:#x}+{n} faulted ({err}) although the spec says it is backed")
        cause = "unexpected-exception" if not isinstance(err, MemspecError) else "data"
        self.run.fail(region.blame_fault, cause, f"{verb} #{region.ref} at {addr:#x}+{n} raised {type(err).__name__}: {err}")

    def refresh(self, ref: int) -> None:
        """Re-read the spec's view of ``ref``: (re)write it if its backed ranges changed, drop it if dead."""
        run = self.run
        refs = getattr(run.sut, "refs", None)
        obj = refs.get(ref) if refs is not None else None
        try:
            loc = self.locate(run, ref, obj)
        except Exception as e:  # noqa: BLE001
            raise SpecError(f"locating the data of #{ref} raised {type(e).__name__}: {e}") from e
        old = self.regions.get(ref)
        if loc is None:
            if old is not None:
                del self.regions[ref]
            return
        spans, blame_fault, blame_mismatch = loc
        if old is not None and old.spans == spans:
            old.blame_fault, old.blame_mismatch = blame_fault, blame_mismatch
            return
        sample = run.plan.integrity_sample
        probe = bool(sample > 1 and (ref * 2654435761) % 4093 % sample)  # outside the sample: read, don't write
        if old is not None:
            # Only ranges still covered keep their pattern: verify the spans
            # that remain, then rewrite the new layout.
            keep = [sp for sp in old.spans if sp in spans]
            if keep:
                self._verify(_Region(ref, old.gen, keep, blame_fault, blame_mismatch, old.probe))
        self.gen += 1
        region = _Region(ref, self.gen, spans, blame_fault, blame_mismatch, probe)
        self.regions[ref] = region
        if old is None:
            self.order.append(ref)
        self._write(region)

    def after_step(self, touched: tuple, bound: tuple) -> None:
        refresh = self.refresh
        for r in bound:
            refresh(r)
        for r in touched:
            if r is not None and r not in bound:
                refresh(r)
        # round-robin verification of a few others
        order = self.order
        regions = self.regions
        checked = 0
        tries = 0
        while order and checked < VERIFY_PER_STEP and tries < 2 * VERIFY_PER_STEP:
            tries += 1
            cursor = self.cursor
            if cursor >= len(order):
                cursor = self.cursor = 0
            ref = order[cursor]
            if ref not in regions:
                # dead: swap-remove
                order[cursor] = order[-1]
                order.pop()
                continue
            self.cursor = cursor + 1
            refresh(ref)  # liveness may have changed by a step that did not name it
            region = regions.get(ref)
            if region is not None:
                self._verify(region)
            checked += 1

    def verify_all(self) -> None:
        for ref in list(self.regions):
            self.refresh(ref)
            region = self.regions.get(ref)
            if region is not None:
                self._verify(region)


#: machine name -> locator; see :class:`Integrity`.  Filled by
#: :mod:`memspec.invariants.locators` style functions registered below.
LOCATORS: dict[str, Callable] = {}


def register_locator(machine_name: str) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        LOCATORS[machine_name] = fn
        return fn
    return deco


def make_integrity(run: Run) -> Integrity | None:
    ep = getattr(run.sut, "ep", None)
    locate = LOCATORS.get(getattr(run.machine, "name", ""))
    if locate is None:
        locate = getattr(run.machine, "_memspec_locator", None)
    if ep is None or locate is None:
        return None
    return Integrity(run, ep, locate)


# --------------------------------------------------------------------------
# Locators of the spec's machines (which bytes the spec says are backed)
# --------------------------------------------------------------------------

def _page_spans(address: int, pages: Any, page: int) -> list:
    """Stamps at the start and end of committed pages (sampled to MAX_STAMPS pages)."""
    idx = sorted(pages)
    if len(idx) > MAX_STAMPS:
        stride = len(idx) / MAX_STAMPS
        idx = [idx[int(i * stride)] for i in range(MAX_STAMPS)]
    spans = []
    for i in idx:
        base = address + i * page
        spans.append((base, STAMP))
        spans.append((base + page - STAMP, STAMP))
    return spans


@register_locator("mechanism")
def locate_mechanism(run: Run, ref: int, obj: Any):
    """Mechanism level: a live own allocation's ``[address, address+size)``
    and a live own VirtualBacking reservation's committed pages.

    Blame: a fault on either is S5 (*a commit/allocation that returns success
    without mapping*); a changed byte is S11 (two live ranges on the same
    physical bytes: the device's accounts count bytes that do not exist).
    Shared mappings alias by design and are not patterned.
    """
    s = run.state
    rec = s.allocations.get(ref) if hasattr(s, "allocations") else None
    if rec is not None:
        if rec.live and not rec.foreign:
            a = obj if isinstance(obj, api.DeviceAllocation) else None
            addr = a.address if a is not None else rec.address
            return run.integrity._spans(addr, rec.size, s.page), "S5", "S11"
        return None
    res = s.reservations.get(ref) if hasattr(s, "reservations") else None
    if res is not None and res.live and not res.foreign and res.kind == "backing" and res.committed:
        return _page_spans(res.address, res.committed, s.page), "S5", "S11"
    return None


@register_locator("system")
def locate_system(run: Run, ref: int, obj: Any):
    """System level: an owning allocation (``OwningAllocation.allocation``)
    and the committed pages of an owning reservation, while the spec says
    they are live or their release is queued behind a fence.

    Blame: live -- a fault is S5 (backing that was never installed), a
    changed byte S11 (bytes counted twice); queued -- either is S4 (*backing
    is released only after every fence of work that used it has completed*).
    """
    s = run.state
    owned = getattr(s, "owned", None)
    rec = owned.get(ref) if owned is not None else None
    if rec is None or rec.state not in ("live", "queued"):
        return None
    inner = getattr(obj, "allocation", None)
    if inner is None or getattr(rec, "creator", 0) != 0:
        # only what the target's own mechanism made: the system's extra
        # mechanism may live on another device than the target's EP copies to
        return None
    blame = ("S5", "S11") if rec.state == "live" else ("S4", "S4")
    if rec.kind == "allocation" and isinstance(inner, api.DeviceAllocation):
        return (run.integrity._spans(inner.address, inner.size, s.page),) + blame
    if rec.kind == "reservation" and isinstance(inner, api.VirtualAllocation) and rec.committed:
        return (_page_spans(inner.address, rec.committed, s.page),) + blame
    return None
