"""``And``, ``Or``, ``Implies`` and ``Not`` that build the very terms z3py's do, faster.

The proofs build their hypotheses through z3py, and most of that time is
z3py's argument coercion: ``z3.And`` finds the arguments' common sort (a
C call and a wrapper object per argument) and casts each to it, although
the encodings only ever pass Boolean terms.  These functions make the same
C call (``Z3_mk_and`` on the same arguments, in the same order) when every
argument is already a Boolean term of one context, and hand anything else
(a Python ``bool``, a probe, a vector, a context argument) to z3py
unchanged.  So each builds the identical AST -- Z3 hash-conses terms, and
the proofs' answers depend on which terms a process builds and in what
order, which these leave as they were (``tests/test_z3fast.py`` checks the
identity).
"""

from __future__ import annotations

from typing import Any

import z3

_BoolRef = z3.BoolRef


def _bools(args: tuple[Any, ...]) -> Any:
    """The common context when every argument is a Boolean term (not a quantifier: z3py's cast
    accepts those too, but they take the general path here) of one context; else None."""
    if not args:
        return None
    ctx = args[0].ctx if type(args[0]) is _BoolRef else None
    if ctx is None:
        return None
    for a in args:
        if type(a) is not _BoolRef or a.ctx is not ctx:
            return None
    return ctx


def _nary(mk: Any, plain: Any, args: tuple[Any, ...]) -> Any:
    flat = tuple(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
    ctx = _bools(flat)
    if ctx is None:
        return plain(*args)
    arr = (z3.Ast * len(flat))(*[a.ast for a in flat])
    return _BoolRef(mk(ctx.ref(), len(flat), arr), ctx)


def And(*args: Any) -> Any:
    """``z3.And``."""
    return _nary(z3.Z3_mk_and, z3.And, args)


def Or(*args: Any) -> Any:
    """``z3.Or``."""
    return _nary(z3.Z3_mk_or, z3.Or, args)


def Implies(a: Any, b: Any) -> Any:
    """``z3.Implies``."""
    ctx = _bools((a, b))
    if ctx is None:
        return z3.Implies(a, b)
    return _BoolRef(z3.Z3_mk_implies(ctx.ref(), a.ast, b.ast), ctx)


def Not(a: Any) -> Any:
    """``z3.Not``."""
    if type(a) is not _BoolRef:
        return z3.Not(a)
    return _BoolRef(z3.Z3_mk_not(a.ctx.ref(), a.ast), a.ctx)


__all__ = ["And", "Or", "Implies", "Not"]
