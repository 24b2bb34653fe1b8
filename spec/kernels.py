"""Pure arithmetic kernels of the spec: rounding and ledger transitions.

These functions are the spec's arithmetic, written once and used three ways:
by the executable spec on Python ``int``s, by the Z3 proofs on symbolic
integers (``z3.ArithRef``), and by CrossHair through their PEP 316 contracts.
So they never branch on their arguments with ``if``: conditionals go through
:func:`ite`, comparisons through :func:`both`.

The ledger of an authority (seed 000, Governor: *Total capacity: 24 GB /
Approved: 22 GB / Request: 500 MB / Result: can approve*) is three numbers
with ``capacity == free + granted + charged`` (invariant S11).
"""

from __future__ import annotations

from typing import Any, NamedTuple


def _is_symbolic(x: Any) -> bool:
    t = type(x)
    return t is not int and t is not bool and t.__module__.startswith("z3")


#: the plain Python types the executable spec computes with (never symbolic)
_PLAIN = frozenset((int, bool))


def ite(cond: Any, then: Any, other: Any) -> Any:
    """``then if cond else other``, also for a Z3 boolean ``cond``."""
    if type(cond) is bool and type(then) in _PLAIN and type(other) in _PLAIN:
        return then if cond else other   # the executable spec's case, without a module lookup per argument
    if _is_symbolic(cond) or _is_symbolic(then) or _is_symbolic(other):
        import z3  # only when given symbolic terms; the spec itself is stdlib-only

        return z3.If(cond, then, other)
    return then if cond else other


def both(a: Any, b: Any) -> Any:
    """Logical and, also for Z3 booleans."""
    if type(a) is bool and type(b) is bool:
        return bool(a) and bool(b)   # as below: only the symbolic test is skipped
    if _is_symbolic(a) or _is_symbolic(b):
        import z3

        return z3.And(a, b)
    return bool(a) and bool(b)


def either(a: Any, b: Any) -> Any:
    """Logical or, also for Z3 booleans."""
    if type(a) is bool and type(b) is bool:
        return bool(a) or bool(b)
    if _is_symbolic(a) or _is_symbolic(b):
        import z3

        return z3.Or(a, b)
    return bool(a) or bool(b)


def floordiv(a: int, b: int) -> int:
    """``a // b`` for ``b > 0``, also on Z3 integers.

    Python's ``//`` is not defined on ``z3.ArithRef``; Z3's integer ``/`` is
    Euclidean division, which equals floor division whenever the divisor is
    positive (the only case the spec uses: page sizes and granularities).

    pre: b > 0
    post: __return__ * b <= a < (__return__ + 1) * b
    """
    if _is_symbolic(a) or _is_symbolic(b):
        return a / b
    return a // b


def mod(a: int, b: int) -> int:
    """``a % b`` for ``b > 0``, also on Z3 integers (Z3's ``%`` is the
    Euclidean remainder: in ``[0, b)`` like Python's for ``b > 0``).

    pre: b > 0
    post: 0 <= __return__ < b
    post: (a - __return__) % b == 0
    """
    return a % b


def minimum(a: int, b: int) -> int:
    """``min(a, b)``, also on Z3 integers.

    post: __return__ == min(a, b)
    """
    return ite(a <= b, a, b)


def maximum(a: int, b: int) -> int:
    """``max(a, b)``, also on Z3 integers.

    post: __return__ == max(a, b)
    """
    return ite(a >= b, a, b)


# --------------------------------------------------------------------------
# Rounding
# --------------------------------------------------------------------------

def round_up(n: int, page: int) -> int:
    """Smallest multiple of ``page`` that is >= ``n``.

    Seed 003: *A 64-byte tensor never buys a 64-byte mapping; the smallest
    currency unit is a page.*

    pre: page > 0
    pre: n >= 0
    post: __return__ >= n
    post: __return__ % page == 0
    post: __return__ - n < page
    """
    return floordiv(n + page - 1, page) * page


def round_down(n: int, page: int) -> int:
    """Largest multiple of ``page`` that is <= ``n``.

    pre: page > 0
    pre: n >= 0
    post: __return__ <= n
    post: __return__ % page == 0
    post: n - __return__ < page
    """
    return floordiv(n, page) * page


def page_span(start: int, end: int, page: int) -> int:
    """Bytes of the page-rounded range covering ``[start, end)``: what a
    successful commit of that range installs when nothing in it was backed
    (seed 000, S5: a successful commit changes committed bytes by exactly the
    page-rounded new range).

    pre: page > 0
    pre: 0 <= start < end
    post: __return__ >= end - start
    post: __return__ % page == 0
    post: __return__ - (end - start) < 2 * page
    """
    return round_up(end, page) - round_down(start, page)


def range_ok(start: int, end: int, size: int, page: int) -> Any:
    """A commit/decommit range is legal: page-aligned, non-empty, inside the
    reservation of ``size`` bytes (errors.InvalidRange otherwise).

    pre: page > 0
    post: __return__ == (0 <= start < end <= size and start % page == 0 and end % page == 0)
    """
    return both(
        both(both(0 <= start, start < end), end <= size),
        both(mod(start, page) == 0, mod(end, page) == 0),
    )


# --------------------------------------------------------------------------
# The ledger: capacity == free + granted + charged
# --------------------------------------------------------------------------

class Ledger(NamedTuple):
    """One authority's accounts (all in bytes)."""

    capacity: int
    free: int
    granted: int
    charged: int


def ledger_ok(l: Ledger) -> Any:
    """S11: the ledger balances and nothing is negative.

    post: __return__ == (l.capacity == l.free + l.granted + l.charged and min(l.free, l.granted, l.charged) >= 0)
    """
    return both(
        l.capacity == l.free + l.granted + l.charged,
        both(both(l.free >= 0, l.granted >= 0), l.charged >= 0),
    )


def can_grant(l: Ledger, n: int) -> Any:
    """Seed 000: the Governor approves a request iff it fits what is free.

    post: __return__ == (n > 0 and n <= l.free)
    """
    return both(n > 0, n <= l.free)


def grant(l: Ledger, n: int) -> Ledger:
    """Provisional grant of ``n`` bytes (caller checked :func:`can_grant`).

    pre: n > 0 and n <= l.free
    post: not ledger_ok(l) or ledger_ok(__return__)
    post: sum(__return__[1:]) == sum(l[1:]) and __return__.capacity == l.capacity
    post: tuple(__return__) == (l.capacity, l.free - n, l.granted + n, l.charged)
    """
    return Ledger(l.capacity, l.free - n, l.granted + n, l.charged)


def cancel_grant(l: Ledger, n: int) -> Ledger:
    """Return an unused provisional grant of ``n`` bytes (seed 000: *If the
    allocation fails, the provisional grant must be returned.*)

    pre: 0 < n <= l.granted
    post: not ledger_ok(l) or ledger_ok(__return__)
    post: sum(__return__[1:]) == sum(l[1:]) and __return__.capacity == l.capacity
    post: tuple(__return__) == (l.capacity, l.free + n, l.granted - n, l.charged)
    """
    return Ledger(l.capacity, l.free + n, l.granted - n, l.charged)


def can_commit(l: Ledger, granted: int, actual: int) -> Any:
    """A grant of ``granted`` bytes can become a charge of ``actual`` bytes iff
    the difference (if the footprint is larger than planned) is free.

    post: __return__ == (actual >= 0 and actual - granted <= l.free)
    """
    return both(actual >= 0, actual - granted <= l.free)


def commit_grant(l: Ledger, granted: int, actual: int) -> Ledger:
    """Turn a grant into a charge at the *actual* bytes (seed 000: *act on the
    real allocated bytes; do not silently keep incorrect accounts*).

    pre: 0 < granted <= l.granted
    pre: actual >= 0 and actual - granted <= l.free
    post: not ledger_ok(l) or ledger_ok(__return__)
    post: sum(__return__[1:]) == sum(l[1:]) and __return__.capacity == l.capacity
    post: tuple(__return__) == (l.capacity, l.free + granted - actual, l.granted - granted, l.charged + actual)
    """
    return Ledger(l.capacity, l.free + granted - actual, l.granted - granted, l.charged + actual)


def refund(l: Ledger, n: int) -> Ledger:
    """Release a charge of ``n`` bytes after the physical bytes were freed.

    pre: 0 <= n <= l.charged
    post: not ledger_ok(l) or ledger_ok(__return__)
    post: sum(__return__[1:]) == sum(l[1:]) and __return__.capacity == l.capacity
    post: tuple(__return__) == (l.capacity, l.free + n, l.granted, l.charged - n)
    """
    return Ledger(l.capacity, l.free + n, l.granted, l.charged - n)


def grant_from_free(l: Ledger, n: int) -> Ledger:
    """A pressure ticket takes ``n`` free bytes into its grant (the part of
    its amount that was already free when holders answered).

    pre: 0 <= n <= l.free
    post: not ledger_ok(l) or ledger_ok(__return__)
    post: sum(__return__[1:]) == sum(l[1:]) and __return__.capacity == l.capacity
    post: tuple(__return__) == (l.capacity, l.free - n, l.granted + n, l.charged)
    """
    return Ledger(l.capacity, l.free - n, l.granted + n, l.charged)


def return_grant(l: Ledger, n: int) -> Ledger:
    """A ticket's held bytes (or any grant) go back to free: cancel and
    timeout (S15: *returned exactly once*).  Same arithmetic as
    :func:`cancel_grant`, but 0 is allowed (a ticket that holds nothing).

    pre: 0 <= n <= l.granted
    post: not ledger_ok(l) or ledger_ok(__return__)
    post: sum(__return__[1:]) == sum(l[1:]) and __return__.capacity == l.capacity
    post: tuple(__return__) == (l.capacity, l.free + n, l.granted - n, l.charged)
    """
    return Ledger(l.capacity, l.free + n, l.granted - n, l.charged)


def footprint_ok(requested: int, actual: int, page: int) -> Any:
    """An allocation's actual footprint is legal: at least the request, at
    most the request rounded up to the page (seed 003: *the smallest currency
    unit is a page*).

    pre: page > 0 and requested > 0
    post: __return__ == (requested <= actual <= round_up(requested, page))
    """
    return both(requested <= actual, actual <= round_up(requested, page))


def aligned_footprint(requested: int, alignment: int, page: int) -> int:
    """The most an allocation of ``requested`` bytes aligned to
    ``alignment`` may take: the request rounded up to the page, and for an
    alignment above the page also the ``alignment - page`` bytes an
    allocator may take to find an aligned start (a driver that only aligns
    to its granularity over-allocates that much).

    pre: page > 0 and requested > 0 and alignment > 0
    post: __return__ >= requested
    post: __return__ % page == 0
    post: alignment > page or __return__ == round_up(requested, page)
    """
    return round_up(requested + maximum(alignment - page, 0), page)


# --------------------------------------------------------------------------
# Boundaries: the values at the kernels' own thresholds (a harness draws them)
# --------------------------------------------------------------------------

def size_boundaries(page: int, room: int, capacity: int) -> tuple[int, ...]:
    """Request sizes at every threshold the mechanism's kernels compare a
    size with, exactly and at +-1: the page (``round_up``'s step: seed 003,
    *the smallest currency unit is a page*) and two of them (a second page
    starts), what is still free (``room``: the device exactly full) and one
    page over it, and the capacity and one page over it.  Only positive
    sizes (the illegal ones are drawn elsewhere)."""
    key = (page, room, capacity)
    got = _SIZE_BOUNDARIES.get(key)
    if got is None:   # a pure function of three ints: computed once per distinct triple
        points = {page, 2 * page, room, room + page, capacity, capacity + page}
        got = tuple(sorted({p + d for p in points for d in (-1, 0, 1) if p + d > 0}))
        if len(_SIZE_BOUNDARIES) >= 4096:
            _SIZE_BOUNDARIES.clear()
        _SIZE_BOUNDARIES[key] = got
    return got


#: (page, room, capacity) -> :func:`size_boundaries`; (page, default) -> :func:`alignment_boundaries`
_SIZE_BOUNDARIES: dict = {}
_ALIGNMENT_BOUNDARIES: dict = {}


def alignment_boundaries(page: int, default: int) -> tuple[int, ...]:
    """Alignments at every threshold :func:`aligned_footprint` and the
    address check compare with: the request's default, the page, the powers
    of two above the page up to four pages (an allocator that aligns only to
    its page is caught there), each exactly (legal: a power of two) and at
    +-1 (illegal: not a power of two, refused with InvalidRequest)."""
    key = (page, default)
    got = _ALIGNMENT_BOUNDARIES.get(key)
    if got is None:
        points = {default, page, 2 * page, 4 * page}
        got = tuple(sorted({p + d for p in points for d in (-1, 0, 1) if p + d > 0}))
        if len(_ALIGNMENT_BOUNDARIES) >= 4096:
            _ALIGNMENT_BOUNDARIES.clear()
        _ALIGNMENT_BOUNDARIES[key] = got
    return got
