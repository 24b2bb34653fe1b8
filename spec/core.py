"""The grammar of the executable spec: actions, outcomes, invariants.

Read this first; every role module of the spec is written in these terms.

*An action* is one thing a caller may ask of the system (``allocate``,
``commit_range``, ``respond to a ticket``...).  For a given spec state and
arguments it does not compute *the* answer: it returns the **set of outcomes a
conforming implementation may produce** (:class:`Outcomes`), e.g. "returns an
allocation whose footprint is in ``[n, round_up(n)]``, or raises
OutOfMemory".  Each outcome carries ``then``: how the spec's state follows
that branch.  A harness runs the same action on an implementation, finds the
branch its answer matches, and lets the spec follow it.  That is a refinement
check: legitimate nondeterminism (an OOM caused by fragmentation, a fence
that happens to have completed) is allowed, anything else is caught and
blamed on the invariant the outcome set names.

*An argument domain* (:class:`Domain`) says what values an argument ranges
over, possibly depending on the state (pick one of the live handles, or one
that was already freed).  Domains draw through a :class:`Chooser`, so the
same spec runs under Hypothesis (shrinking) or a plain random walk.

*An invariant* is a named predicate over the spec state with a stable id
(S1..S15, C1..C9) and the seed sentence it encodes.

*An observation* compares a figure the spec predicts with the same figure
read from the implementation (committed bytes of a reservation, charge of a
holder, mapping count of a handle) and is blamed on an invariant when they
differ.

This module is stdlib only (``mypy_extensions``, when installed, only marks
the generic classes for the optional compiled build, ``memspec/native.py``).
"""

from __future__ import annotations

import inspect
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, Protocol, Sequence, TypeVar

from memspec.spec.errors import MemspecError

try:  # the optional mypyc build (memspec/native.py) compiles this module
    from mypy_extensions import mypyc_attr
except ImportError:  # pure Python: a no-op
    def mypyc_attr(*_args: Any, **_kwargs: Any) -> Any:
        return lambda cls: cls

S = TypeVar("S")  # a spec state


def _nothing(_: Any) -> None:
    return None


def _same(v: Any) -> Any:
    return v


def _always(_: Any) -> bool:
    return True


#: the key, in a spec state's ``__dict__``, of a dict that lives only while a
#: harness checks that state after a step (invariants, observations, data
#: regions: nothing changes the state meanwhile); a spec may keep there what
#: several of its checks derive from the state alike (the caching spec's
#: layout), computed once per check sweep instead of once per check.  Absent
#: at any other time: a check called on its own computes afresh.
CHECKS_MEMO = "_memspec_checks_memo"


@mypyc_attr(native_class=False)  # a dict subclass: never a native class of the compiled build
class ChecksMemo(dict):
    """The dict of :data:`CHECKS_MEMO`: a copy of the state (``deepcopy``,
    ``copy``) carries ``None`` instead, so that no copy sees what was
    derived from the state it was copied from after either one changes
    (and a shallow copy, which shares it, is not its ``owner``)."""

    __slots__ = ("owner",)

    def __init__(self, owner: Any) -> None:
        super().__init__()
        self.owner = owner

    def __copy__(self) -> None:
        return None

    def __deepcopy__(self, _memo: dict) -> None:
        return None

    def __reduce__(self) -> tuple:
        return (type(None), ())


def checks_memo(state: Any) -> dict | None:
    """The dict of :data:`CHECKS_MEMO` while a harness checks ``state``, else ``None``."""
    d = getattr(state, "__dict__", None)
    m = d.get(CHECKS_MEMO) if d is not None else None
    return m if m is not None and m.owner is state else None


def once(memo: dict | None, key: str, compute: Callable[[Any], Any], arg: Any) -> Any:
    """``compute(arg)``, kept in ``memo`` under ``key`` and read from there
    after (a :func:`checks_memo` of a state, or a harness's per-step dict of
    reads); with no ``memo``, computed afresh.  What it returns is shared:
    never to be mutated."""
    if memo is None:
        return compute(arg)
    got = memo.get(key)
    if got is None:
        got = memo[key] = compute(arg)
    return got


# --------------------------------------------------------------------------
# Outcomes
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    """One named clause of a branch: a rule of its own.

    A branch whose answer has the right shape but breaks a clause is blamed
    on that clause (``S8.alignment``), not on the branch as a whole, so a
    clause that is wrong for one allocator can never hide another that is
    broken; and a harness can *mask* one clause after it failed (follow the
    branch anyway) and keep checking the others.  ``holds(value)`` is the
    predicate (``value``: what was returned, or the error raised); ``rule`` is
    the invariant it belongs to, ``name`` the clause.
    """

    rule: str
    name: str
    holds: Callable[[Any], bool]
    describe: str = ""

    @property
    def id(self) -> str:
        return f"{self.rule}.{self.name}"

    def ok(self, value: Any) -> bool:
        try:
            return bool(self.holds(value))
        except Exception:  # a value of the wrong shape breaks the clause
            return False


def _failing(checks: tuple, value: Any) -> list:
    return [c for c in checks if not c.ok(value)]


@dataclass(frozen=True)
class Returns:
    """The implementation returns normally with a value that ``accepts``
    and that every one of ``checks`` holds for.

    ``accepts`` is the answer's shape (the right type, the size asked for);
    ``checks`` are the named clauses a value of that shape must keep
    (:class:`Check`).  ``then(value)`` updates the spec state along this
    branch.  If it returns an ``int`` (or a tuple of ints), that is the
    spec-side reference id(s) the harness binds to the implementation's
    returned object(s).
    """

    describe: str
    accepts: Callable[[Any], bool] = _always
    then: Callable[[Any], Any] = _nothing
    #: ``witness()`` makes a value a conforming implementation could return on
    #: this branch; it lets the spec run on its own (``memspec spec-check``,
    #: the random walk) with no implementation. ``None``: the branch cannot be
    #: taken without an implementation.
    witness: Callable[[], Any] | None = None
    checks: tuple = ()
    #: the branch's stable id (its outcome kind, without the numbers of
    #: ``describe``): coverage and witnesses count it
    id: str = "returns"

    def shaped(self, value: Any = None, error: BaseException | None = None) -> bool:
        if error is not None:
            return False
        try:
            return bool(self.accepts(value))
        except Exception:  # a value of the wrong shape does not match
            return False

    def matches(self, value: Any = None, error: BaseException | None = None) -> bool:
        # shaped() and every Check.ok(), inline (the harness's check of every answer)
        if error is not None:
            return False
        try:
            if not self.accepts(value):
                return False
        except Exception:  # a value of the wrong shape does not match
            return False
        for c in self.checks:
            try:
                if not c.holds(value):
                    return False
            except Exception:  # a value of the wrong shape breaks the clause
                return False
        return True

    def failing(self, value: Any = None, error: BaseException | None = None) -> list:
        """The clauses ``value`` breaks (the branch's shape holds)."""
        return _failing(self.checks, value)


@dataclass(frozen=True)
class Raises:
    """The implementation raises ``error`` (or a subclass), where every one
    of ``checks`` holds (a clause on when this refusal is allowed: an
    OutOfMemory on an empty device whose declared bound fits is not)."""

    error: type[MemspecError]
    describe: str = ""
    then: Callable[[BaseException], Any] = _nothing
    checks: tuple = ()

    @property
    def id(self) -> str:
        return f"raises {self.error.__name__}"

    def shaped(self, value: Any = None, error: BaseException | None = None) -> bool:
        return error is not None and isinstance(error, self.error)

    def matches(self, value: Any = None, error: BaseException | None = None) -> bool:
        # shaped() and every Check.ok(), inline
        if error is None or not isinstance(error, self.error):
            return False
        for c in self.checks:
            try:
                if not c.holds(error):
                    return False
            except Exception:  # noqa: BLE001 - as Check.ok
                return False
        return True

    def failing(self, value: Any = None, error: BaseException | None = None) -> list:
        return _failing(self.checks, error)


Outcome = Returns | Raises


@dataclass(frozen=True)
class Outcomes:
    """Every answer a conforming implementation may give, and the invariant
    to blame when the implementation's answer is none of them."""

    branches: tuple[Outcome, ...]
    blame: str
    touched: tuple[int, ...] = ()  # spec reference ids whose observations must be rechecked
    #: answers that are *not* permitted here but have a named clause of their
    #: own (an OutOfMemory on an empty device whose declared bound fits:
    #: ``S8.refused-fit``): never matched, only named when the answer is one
    #: of them (:meth:`closest`), and followed only when that clause is masked
    forbidden: tuple = ()

    def match(self, value: Any = None, error: BaseException | None = None) -> Outcome | None:
        for b in self.branches:
            if b.matches(value, error):
                return b
        return None

    def closest(self, value: Any = None, error: BaseException | None = None) -> tuple | None:
        """For an answer no branch matches: ``(branch, clauses it breaks)``
        of the branch whose shape the answer has and that it breaks the
        fewest clauses of; ``None`` when no branch has its shape (the answer
        is wrong as a whole, blamed on :attr:`blame`)."""
        best = None
        for b in self.branches + self.forbidden:
            if not b.checks or not b.shaped(value, error):
                continue
            bad = b.failing(value, error)
            if best is None or len(bad) < len(best[1]):
                best = (b, bad)
        return best

    def describe(self) -> str:
        parts = []
        for b in self.branches:
            if isinstance(b, Returns):
                parts.append(f"returns {b.describe}")
            else:
                parts.append(f"raises {b.error.__name__}" + (f" ({b.describe})" if b.describe else ""))
        return " | ".join(parts)


def outcomes(*branches: Outcome, blame: str, touched: Iterable[int] = (), forbidden: Iterable[Outcome] = ()) -> Outcomes:
    return Outcomes(tuple(branches), blame, tuple(touched), tuple(forbidden))


def only(error: type[MemspecError], *, blame: str, describe: str = "", touched: Iterable[int] = ()) -> Outcomes:
    """The single permitted outcome is raising ``error``; state is unchanged."""
    return Outcomes((Raises(error, describe),), blame, tuple(touched))


# --------------------------------------------------------------------------
# Argument domains
# --------------------------------------------------------------------------

class Chooser(Protocol):
    """Source of choices: Hypothesis's choice sequence (:class:`HypothesisChooser`)
    or a seeded ``random.Random`` (:class:`RandomChooser`)."""

    def integer(self, lo: int, hi: int) -> int: ...
    def choice(self, options: Sequence[Any]) -> Any: ...
    def boolean(self) -> bool: ...


@dataclass(frozen=True)
class Domain:
    """Values an argument ranges over, given the current state."""

    describe: str
    draw: Callable[[Any, Chooser], Any]
    #: ``available(state)`` is False when nothing can be drawn (no handle yet)
    available: Callable[[Any], bool] = _always
    #: ``boundaries(state)``: the values at the spec's own thresholds this
    #: domain draws (exactly and at +-1); a harness reports which a run hit
    boundaries: Callable[[Any], Sequence[Any]] | None = None


def ints(lo: int, hi: int, describe: str | None = None) -> Domain:
    return Domain(describe or f"int in [{lo}, {hi}]", lambda _s, c: c.integer(lo, hi))


def one_of(*values: Any, describe: str | None = None) -> Domain:
    vals = tuple(values)
    return Domain(describe or "one of " + ", ".join(map(repr, vals)), lambda _s, c: c.choice(vals))


def booleans() -> Domain:
    return Domain("bool", lambda _s, c: c.boolean())


def pick(describe: str, options: Callable[[Any], Sequence[Any]]) -> Domain:
    """One element of ``options(state)`` (e.g. the ids of live handles)."""
    return Domain(describe, lambda s, c: c.choice(options(s)), lambda s: len(options(s)) > 0)


# --------------------------------------------------------------------------
# Choosers: the one seeded chooser, and Hypothesis's
# --------------------------------------------------------------------------

@mypyc_attr(native_class=False)  # an exception: never a native class of the compiled build
class SpecError(Exception):
    """The spec model itself raised while stepping (a bug in the spec, not in
    the target): a chooser asked for a choice from an empty domain or for a
    weighted draw over weights that are not positive ints.  The harness
    (``memspec.invariants.errors``) raises and reports the same class."""


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
        if len(_CUMULATIVE) > 4096:  # swarm testing makes a weight tuple per example
            _CUMULATIVE.clear()
        cum = _CUMULATIVE[weights] = tuple(out)
    return cum


def _weighted_index(cum: tuple, k: int) -> int:
    """The index whose slot ``[cum[i-1], cum[i])`` holds ``k``."""
    return bisect_right(cum, k)


def _choice_by_integer(chooser: Any, options: Sequence[Any]) -> Any:
    """One of ``options`` by the chooser's own ``integer`` draw (none for a
    one-value domain); an empty domain is a spec error, never an IndexError."""
    if not isinstance(options, (list, tuple, range)):
        options = list(options)
    n = len(options)
    if n == 0:
        raise SpecError("choice from an empty domain")
    return options[chooser.integer(0, n - 1)] if n > 1 else options[0]


class RandomChooser:
    """The seeded :class:`Chooser` over a ``random.Random`` (every random walk:
    the spec's own, its documentation's samples, the proofs' agreement walks,
    the harness's walks), recording the choice sequence in Hypothesis's
    primitive form (``int`` for an integer or a choice's index, ``bool``)
    into ``record`` when given, so that a walk replays into Hypothesis.

    A draw over one value (``integer(5, 5)``, a choice of one option) takes
    nothing from ``rng`` and records it as drawn; :meth:`weighted` is one
    integer draw over the weights' total, as :class:`HypothesisChooser`'s."""

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
        """An index drawn with probability proportional to ``weights``:
        one :meth:`integer` in ``[0, sum(weights))`` (the same recorded draw
        as :meth:`HypothesisChooser.weighted`)."""
        cum = _cumulative(weights)
        return _weighted_index(cum, self.integer(0, cum[-1] - 1))

    def choice(self, options: Sequence[Any]) -> Any:
        return _choice_by_integer(self, options)

    def boolean(self) -> bool:
        v = self.rng.random() < 0.5
        if self.record is not None:
            self.record.append(v)
        return v


class HypothesisChooser:
    """Draws through Hypothesis's choice sequence (shrinkable): ``data`` is a
    ``st.data()`` object or a ``ConjectureData``.

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
        return _choice_by_integer(self, options)

    def boolean(self) -> bool:
        return bool(self._bool())


# --------------------------------------------------------------------------
# Actions
# --------------------------------------------------------------------------

@mypyc_attr(native_class=False)  # mypyc: a generic dataclass cannot be a native class
@dataclass(frozen=True)
class Action(Generic[S]):
    """One thing a caller may ask; see the module docstring.

    ``step(state, **args) -> Outcomes`` is the spec.  ``perform(sut, **args)``
    does the same call on a system under test through the contract API (the
    harness gives it the implementation objects bound to reference ids via
    ``sut.ref(id)``).  ``enabled(state)`` is the precondition under which a
    caller may issue the action at all (the implementation must then answer
    with one of the outcomes, errors included).
    """

    name: str
    role: str
    doc: str
    params: dict[str, Domain]
    step: Callable[..., Outcomes]
    perform: Callable[..., Any]
    enabled: Callable[[Any], bool] = _always
    invariants: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()  # capabilities: "virtual_backing", "shared_mapping", "ep"
    weight: int = 1
    #: a misuse the spec always refuses (a double free): its refusal is the
    #: answer that exercises its invariants (a harness counts those steps as
    #: accepted); otherwise only a returning branch counts
    misuse: bool = False

    @property
    def precondition(self) -> str:
        """First paragraph of the step's docstring, for the generated docs."""
        return self.doc.strip().split("\n\n")[0]

    def available(self, state: Any) -> bool:
        if self.enabled is not _always and not self.enabled(state):
            return False
        for d in self.params.values():
            if d.available is not _always and not d.available(state):  # a domain with nothing to draw
                return False
        return True

    def draw_args(self, state: Any, chooser: Chooser) -> dict[str, Any]:
        # a loop, not a comprehension: the same dict in the same order, without a function
        # object made per call (a harness draws an action's arguments several times a step)
        args: dict[str, Any] = {}
        for k, d in self.params.items():
            args[k] = d.draw(state, chooser)
        return args


def action(
    *,
    role: str,
    params: dict[str, Domain] | None = None,
    perform: Callable[..., Any],
    enabled: Callable[[Any], bool] = _always,
    invariants: Sequence[str] = (),
    requires: Sequence[str] = (),
    weight: int = 1,
    misuse: bool = False,
) -> Callable[[Callable[..., Outcomes]], Action[Any]]:
    """Decorator turning a ``step`` function into an :class:`Action`."""

    def wrap(fn: Callable[..., Outcomes]) -> Action[Any]:
        return Action(
            name=fn.__name__,
            role=role,
            doc=inspect.getdoc(fn) or "",
            params=dict(params or {}),
            step=fn,
            perform=perform,
            enabled=enabled,
            invariants=tuple(invariants),
            requires=tuple(requires),
            weight=weight,
            misuse=misuse,
        )

    return wrap


# --------------------------------------------------------------------------
# Invariants and observations
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Witness:
    """An outcome that shows an invariant's rule was exercised, not merely
    reachable: ``action``'s answer whose outcome kind (the branch's
    description with its numbers written ``N``) contains ``outcome``
    (``empty_cache`` returning ``N (bytes released)``: a fully-free segment
    was released).  A PASS needs each witness seen ``--min-accepted``
    times; else the row is UNTESTED, naming the witness missing."""

    action: str
    outcome: str
    describe: str


@mypyc_attr(native_class=False)  # mypyc: a generic dataclass cannot be a native class
@dataclass(frozen=True)
class Invariant(Generic[S]):
    """A named predicate over the spec state.

    ``check(state)`` returns ``None`` when it holds and a one-line reason when
    it does not.  It must be cheap (use aggregates the actions maintain);
    ``full_check`` may scan everything and is run at the end of a run.
    """

    id: str
    title: str
    quote: str  # the seed sentence it encodes
    check: Callable[[Any], str | None]
    full_check: Callable[[Any], str | None] | None = None
    #: ``{state class: predicate or None}`` when the invariant reads a
    #: different record per level (``None``: holds vacuously at that level);
    #: ``check`` then dispatches on the state's class.  A harness asks
    #: :meth:`check_for` once per run instead of dispatching every step.
    levels: dict | None = field(default=None, compare=False, hash=False)
    #: capabilities without which nothing can break it (N/A for a target
    #: that lacks one, e.g. ``("expandable_segments",)``)
    requires: tuple[str, ...] = ()
    #: rules this one's check takes for granted: when one of them fails at
    #: the same step, this failure is its consequence, not the rule broken
    #: (a segment is *entirely free* for ``empty_cache`` only once its free
    #: blocks were merged: C6 presupposes C3)
    presupposes: tuple[str, ...] = ()
    #: the outcomes that show the rule was exercised (:class:`Witness`)
    witnesses: tuple = ()

    def check_for(self, state: Any) -> Callable[[Any], str | None] | None:
        """The predicate for ``state``'s level (``None``: vacuous there)."""
        if self.levels is None:
            return self.check
        for cls, fn in self.levels.items():
            if isinstance(state, cls):
                return fn
        return None


class Within:
    """An observation's expected figure that is a range, not one value:
    ``[lo, hi]`` (``hi=None``: no upper end).  ``observed != Within(...)``
    is True exactly when the observed figure lies outside it."""

    __slots__ = ("lo", "hi")

    def __init__(self, lo: int, hi: int | None = None) -> None:
        self.lo, self.hi = lo, hi

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Within):
            return (self.lo, self.hi) == (other.lo, other.hi)
        return type(other) is int and self.lo <= other and (self.hi is None or other <= self.hi)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"at least {self.lo}" if self.hi is None else (
            f"{self.lo}" if self.lo == self.hi else f"between {self.lo} and {self.hi}")


def global_figure(_state: Any, _touched: Any) -> tuple:
    """The ``refs`` of an observation of one global figure, read after
    every step: ``(None,)``.  A harness may recognise it (``obs.refs is
    global_figure``) and schedule the figure without calling it."""
    return _GLOBAL_REFS


_GLOBAL_REFS = (None,)


@dataclass(frozen=True)
class Observation:
    """A figure predicted by the spec and read from the implementation.

    ``refs(state, touched)`` yields the reference ids to compare after a step
    (usually just the touched ones; ``None`` ref means a global figure);
    ``expected(state, ref)`` and ``observed(sut, ref)`` give the two figures.
    """

    name: str
    blame: str
    refs: Callable[[Any, tuple[int, ...]], Iterable[int | None]]
    expected: Callable[[Any, int | None], Any]
    observed: Callable[[Any, int | None], Any]
    requires: tuple[str, ...] = ()
    #: the clause of ``blame`` it checks, named in a failure (``S8.physical-min``;
    #: empty: the observation's name)
    check: str = ""


@dataclass(frozen=True)
class DataRegion:
    """Memory a caller can see, which must keep the bytes written into it.

    Either one ``extent`` ``(address, size)`` or ``pages``: ``(base,
    page indices, page size)`` of committed pages.  A harness writes a
    pattern there through the EP and reads it back later: a fault is blamed
    on ``blame_fault`` (the spec says it is backed), changed bytes on
    ``blame_mismatch`` (someone else's bytes live there).
    """

    blame_fault: str
    blame_mismatch: str
    extent: tuple[int, int] | None = None
    pages: tuple[int, Any, int] | None = None
    #: the page size of an ``extent`` (a harness stamps page boundaries)
    page: int = 0
    #: ``(key, offset)``: these bytes are those of shared memory ``key``
    #: (a physical handle) from ``offset`` on; every region with the same
    #: key is an alias and must show the same bytes: what is written through
    #: one is read back through the others, and the bytes survive until the
    #: last alias goes
    alias: tuple[Any, int] | None = None
    #: ``False``: a caller may not write here (a read-only mapping): a write
    #: anywhere must be refused and leave the bytes unchanged; ``None``: only
    #: part of it is writable (a harness only reads it)
    writable: bool | None = True
    #: ``key`` of the alias this region was until now (copy-on-write): it
    #: must hold the bytes the alias showed when it stopped being one, and
    #: from then on neither side's writes show through the other
    copy_of: Any = None
    #: changes whenever a caller's own write (an action of the spec) changed
    #: the bytes: a harness writes its pattern anew instead of comparing
    version: Any = None
    #: ``locate(sut) -> address | None``: the region lies at ``extent``
    #: *offset* from the address the implementation reports now (a holder's
    #: weight or KV request, whose memory the contract names by key, not by a
    #: handle); ``None``: the implementation does not say (no check)
    locate: Callable[[Any], Any] | None = None


def fast_frozen_init(cls: type) -> type:
    """Give the frozen dataclass ``cls`` an ``__init__`` that stores its
    fields, in their order and with their defaults, straight into the
    instance's dict.  The dataclass's own sets each field through
    ``object.__setattr__`` (a :class:`DataRegion` took 2 us, a
    :class:`Returns` 1.5 us), and a harness builds several of these on every
    step (each branch of a step's outcome set, each region it describes).
    The instance is the same and stays frozen (an assignment still raises).
    Left as it is where the shortcut would not be the same ``__init__``: a
    field with a factory, not in ``__init__``, keyword-only, a
    ``__post_init__``, or a compiled class without a ``__dict__``."""
    import dataclasses

    if "__post_init__" in dir(cls) or "__slots__" in cls.__dict__:
        return cls
    params, body, ns = [], [], {}
    for f in dataclasses.fields(cls):
        if not f.init or f.default_factory is not dataclasses.MISSING or getattr(f, "kw_only", False) is True \
                or not f.name.isidentifier():
            return cls
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            ns["_d_" + f.name] = f.default
            params.append(f"{f.name}=_d_{f.name}")
        body.append(f"    d[{f.name!r}] = {f.name}")
    src = f"def __init__(self, {', '.join(params)}):\n    d = self.__dict__\n" + ("\n".join(body) or "    pass") + "\n"
    try:
        exec(src, ns)   # noqa: S102 - generated from the class's own field names
        init = ns["__init__"]
        init.__qualname__ = f"{cls.__qualname__}.__init__"
        init.__module__ = cls.__module__   # exec left it None: readers of a function's module (footprints) see the class's
        init.__doc__ = "Stores the fields into the instance's dict (:func:`fast_frozen_init`)."
        old = cls.__init__
        cls.__init__ = init   # type: ignore[misc]
        if not hasattr(cls.__new__(cls), "__dict__"):
            cls.__init__ = old   # type: ignore[misc]
    except (TypeError, AttributeError):
        return cls
    return cls


for _cls in (Check, Returns, Raises, Outcomes, DataRegion):
    fast_frozen_init(_cls)


@mypyc_attr(native_class=False)  # mypyc: a generic dataclass cannot be a native class
@dataclass
class Machine(Generic[S]):
    """A whole executable spec: how to make the initial state, its action
    table, invariants and observations.  The harness needs nothing else.

    What a harness needs beyond the actions, the machine says too, so that
    the harness knows no machine by name:

    * ``regions(state, ref, obj) -> DataRegion | None`` -- which bytes of
      reference ``ref`` (bound to the implementation's ``obj``) a caller can
      see now; ``None``: none (dead, foreign, or not memory).
    * ``start_checks`` -- observations compared once, when a run starts
      (``refs`` is ignored; ``expected(state, None)`` against
      ``observed(sut, None)``), e.g. capability answers.
    * ``unwrap(value)`` -- the implementation object inside what a
      ``perform`` returned (the harness binds that to the reference id).
    * ``ep_blame`` -- the invariant blamed when the EP the harness reads
      memory through fails outside any action (e.g. ``new_stream``).
    """

    name: str
    doc: str
    init: Callable[..., S]
    actions: list[Action[S]]
    invariants: list[Invariant[S]]
    observations: list[Observation] = field(default_factory=list)
    regions: Callable[[Any, int, Any], DataRegion | None] | None = None
    start_checks: list[Observation] = field(default_factory=list)
    unwrap: Callable[[Any], Any] = _same
    ep_blame: str | None = None

    def step_checks(self, state: S) -> list[tuple[str, Callable[[Any], str | None]]]:
        """``[(invariant id, predicate)]`` for ``state``'s level, in order,
        leaving out the invariants that hold vacuously there: the same
        answers as :meth:`check_invariants`, without a per-step dispatch."""
        out = []
        for inv in self.invariants:
            fn = inv.check_for(state)
            if fn is not None:
                out.append((inv.id, fn))
        return out

    def invariant(self, id: str) -> Invariant[S]:
        for inv in self.invariants:
            if inv.id == id:
                return inv
        raise KeyError(id)

    def action(self, name: str) -> Action[S]:
        for a in self.actions:
            if a.name == name:
                return a
        raise KeyError(name)

    def check_invariants(self, state: S, *, full: bool = False) -> list[tuple[str, str]]:
        """``[(invariant id, reason)]`` for every invariant that fails."""
        bad = []
        for inv in self.invariants:
            fn = inv.full_check if (full and inv.full_check) else inv.check
            why = fn(state)
            if why is not None:
                bad.append((inv.id, why))
        return bad
