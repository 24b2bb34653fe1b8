"""Sources of choices for the engine (:class:`~memspec.spec.core.Chooser`):
Hypothesis's choice sequence (shrinkable), a seeded ``random.Random`` that
records its choices in Hypothesis's primitive form (so a random walk can be
replayed into Hypothesis), a recorded sequence, and a recorder.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, Sequence

from memspec.invariants.errors import SpecError


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
