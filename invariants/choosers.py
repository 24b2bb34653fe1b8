"""Sources of choices for the engine (:class:`~memspec.spec.core.Chooser`):
Hypothesis's choice sequence (shrinkable) and a seeded ``random.Random`` that
records its choices in Hypothesis's primitive form (so a random walk can be
replayed into Hypothesis) -- :class:`~memspec.spec.core.HypothesisChooser`
and :class:`~memspec.spec.core.RandomChooser`, the spec's own, the one class
of each that every walk uses (imported here for the harness) -- and the
harness's: the walk's faster :class:`RandomChooser` (:class:`WalkChooser`), a
step's packed draws, a recorded sequence, and a recorder.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, Sequence

from memspec.invariants.errors import SpecError
from memspec.spec.core import HypothesisChooser, RandomChooser, _choice_by_integer, _cumulative, _weighted_index

__all__ = ["HypothesisChooser", "PackedChooser", "PackedRecorder", "RandomChooser", "RecordingChooser", "ReplayChooser",
           "WalkChooser", "_choice_by_integer", "_cumulative", "_weighted_index", "recorder"]


class WalkChooser(RandomChooser):
    """:class:`RandomChooser` with the same
    draws, value for value (``randint(lo, hi)`` is ``lo +
    _randbelow(hi - lo + 1)``), without ``randint``'s and ``randrange``'s
    argument checks on every draw."""

    __slots__ = ("_below", "_random", "_wlast", "_wcum")

    def __init__(self, rng: Any, record: list | None = None) -> None:
        super().__init__(rng, record)
        self._below = rng._randbelow  # type: ignore[attr-defined]
        self._random = rng.random
        #: the weights of the last :meth:`weighted` draw and their running totals (a run
        #: draws its actions over one swarm's weights, the same tuple, step after step)
        self._wlast: tuple | None = None
        self._wcum: tuple = ()

    def weighted(self, weights: tuple) -> int:
        """:meth:`RandomChooser.weighted`, value for value, without hashing
        the weights again when they are the same tuple as the last draw's."""
        if weights is not self._wlast:
            self._wcum = _cumulative(weights)
            self._wlast = weights
        cum = self._wcum
        total = cum[-1]
        v = self._below(total) if total > 1 else 0
        if self.record is not None:
            self.record.append(v)
        return bisect_right(cum, v)

    def integer(self, lo: int, hi: int) -> int:
        v = lo + self._below(hi - lo + 1) if hi > lo else lo
        if self.record is not None:
            self.record.append(v)
        return v

    def boolean(self) -> bool:
        v = self._random() < 0.5
        if self.record is not None:
            self.record.append(v)
        return v


#: width of the integer a :class:`PackedChooser` draws at once
PACK_BITS = 64
_PACK_MAX = (1 << PACK_BITS) - 1
#: a draw over more values than this is its own choice (sizes: Hypothesis's
#: own distribution -- small values, its constants -- and shrinking apply)
PACK_SMALL = 256
#: a repeated action draw of a step (:meth:`PackedChooser.weighted`) is packed up to this total weight
PACK_WEIGHTS = 1 << 16
#: a packed draw over ``n`` values needs this many times ``n`` values of room
#: left in its integer (the digit's bias stays under 1 / this)
PACK_SLACK = 256
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix(x: int) -> int:
    """A bijection of ``[0, 2**64)`` with ``_mix(0) == 0`` (the splitmix64
    finaliser): Hypothesis draws wide integers mostly small, and the digits
    of a packed integer must each be about uniform; shrinking the integer to
    0 still makes every digit 0 (each draw's smallest value)."""
    x ^= x >> 30
    x = (x * _M1) & _PACK_MAX
    x ^= x >> 27
    x = (x * _M2) & _PACK_MAX
    return x ^ (x >> 31)


class PackedChooser:
    """Serves a step's small draws (a reference among the live ones, a
    boolean, a count of a script) from one wide integer of the ``inner``
    chooser, as digits of a mixed radix; each choice of Hypothesis costs
    about as much as a step's own work, and a step used to make a dozen.

    * a draw over one value (``integer(5, 5)``) takes no choice at all;
    * a draw over more than :data:`PACK_SMALL` values (a size in bytes) is
      one choice of ``inner``, as before;
    * the others take the next digit of the current packed integer, drawn
      (one ``inner.integer(0, 2**64 - 1)``, mixed by :func:`_mix`) when the
      room left is too small.

    :meth:`new_step` starts a fresh integer, so a step's choices never feed
    another's (Hypothesis deletes steps whole when it shrinks).  The
    recorded choices of a step (:class:`RecordingChooser` around this one)
    are the decoded values, so a reproduction replays them unchanged; a
    random walk (:class:`RandomChooser` inside) records the wide integers,
    which replay into Hypothesis as the same choices."""

    __slots__ = ("inner", "_int", "_v", "_room", "_weighted", "_drew", "_wlast", "_wcum")

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._int = inner.integer
        self._weighted = inner.weighted
        self._v = 0
        self._room = 0
        self._drew = False
        #: the weights of the last packed :meth:`weighted` draw and their running totals (a
        #: run's redraws are over one swarm's weights, the same tuple: not hashed again)
        self._wlast: tuple | None = None
        self._wcum: tuple = ()

    def new_step(self) -> None:
        self._room = 0
        self._drew = False

    def weighted(self, weights: tuple) -> int:
        """The step's first action draw is one choice of ``inner`` (Hypothesis
        shrinks it towards index 0, the heaviest action); a second one in
        the same step (the first landed on an unavailable action, or gave
        its step away) is a packed draw when the weights total at most
        :data:`PACK_WEIGHTS`."""
        if not self._drew:
            self._drew = True
            return self._weighted(weights)
        if weights is not self._wlast:
            self._wcum = _cumulative(weights)
            self._wlast = weights
        cum = self._wcum
        total = cum[-1]
        return bisect_right(cum, self._digit(total) if total <= PACK_WEIGHTS else self._int(0, total - 1))

    def integer(self, lo: int, hi: int) -> int:
        n = hi - lo + 1
        if n == 1:
            return lo
        if n > PACK_SMALL or n < 1:
            return self._int(lo, hi)
        # :meth:`_digit`, inline (every small draw of a step comes here)
        room = self._room
        if room < n * PACK_SLACK:
            self._v = _mix(self._int(0, _PACK_MAX))
            room = 1 << PACK_BITS
        v = self._v
        self._v = v // n
        self._room = room // n
        return lo + v % n

    def _digit(self, n: int) -> int:
        """The next digit in ``[0, n)`` of the packed integer (a new one
        drawn when the room left is under ``n * PACK_SLACK``)."""
        room = self._room
        if room < n * PACK_SLACK:
            self._v = _mix(self._int(0, _PACK_MAX))
            room = 1 << PACK_BITS
        v = self._v
        self._v = v // n
        self._room = room // n
        return v % n

    def choice(self, options: Sequence[Any]) -> Any:
        return _choice_by_integer(self, options)

    def boolean(self) -> bool:
        # :meth:`integer` over (0, 1), inline
        room = self._room
        if room < 2 * PACK_SLACK:
            self._v = _mix(self._int(0, _PACK_MAX))
            room = 1 << PACK_BITS
        v = self._v
        self._v = v // 2
        self._room = room // 2
        return v % 2 == 1


class PackedRecorder:
    """``RecordingChooser(packed)`` for a :class:`PackedChooser` ``packed``:
    the same values from the same packed state, the same record, in one
    frame per draw instead of two (the guided argument draws of a step,
    ``draws.Draws._draw_args``, make most of a step's small draws through
    it).  ``record`` is replaced by the caller for each draw it keeps apart
    (``rec.record = []``), so one recorder serves a whole run."""

    __slots__ = ("inner", "record", "_int")

    def __init__(self, inner: PackedChooser) -> None:
        self.inner = inner
        self.record: list = []
        self._int = inner._int

    def integer(self, lo: int, hi: int) -> int:
        # PackedChooser.integer, inline, then recorded as RecordingChooser.integer records it
        n = hi - lo + 1
        if n == 1:
            v = lo
        elif n > PACK_SMALL or n < 1:
            v = self._int(lo, hi)
        else:
            p = self.inner
            room = p._room
            if room < n * PACK_SLACK:
                p._v = _mix(self._int(0, _PACK_MAX))
                room = 1 << PACK_BITS
            x = p._v
            p._v = x // n
            p._room = room // n
            v = lo + x % n
        self.record.append(v)
        return v

    def choice(self, options: Sequence[Any]) -> Any:
        return _choice_by_integer(self, options)

    def boolean(self) -> bool:
        v = self.inner.boolean()
        self.record.append(v)
        return v


def recorder(chooser: Any) -> Any:
    """``RecordingChooser(chooser)``, or for a :class:`PackedChooser` the
    :class:`PackedRecorder` that draws and records the same."""
    return PackedRecorder(chooser) if type(chooser) is PackedChooser else RecordingChooser(chooser)


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
        return _choice_by_integer(self, options)

    def boolean(self) -> bool:
        v = self.inner.boolean()
        self.record.append(v)
        return v
