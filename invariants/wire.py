"""The child <-> parent messages of a supervised run: what a child says of
its steps, traces and statistics, and how the parent reads them back
(untrusted: literals only, every field type-checked)."""

from __future__ import annotations

import ast
from collections import Counter
from typing import Any

from memspec.invariants import engine as E



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


def _step_msg(ts: E.TraceStep) -> dict:
    return {"t": "s", "a": ts.action, "args": _literal_repr(ts.args), "c": list(ts.choices)}


def _trace_msg(trace: list) -> list:
    return [{"a": ts.action, "args": _literal_repr(ts.args), "c": list(ts.choices), "o": ts.outcome,
             "b": list(ts.bound)} for ts in trace]


def _trace_from(msgs: list) -> list:
    """Trace steps rebuilt from the child's (untrusted) messages: literals only."""
    out = []
    for m in msgs:
        if not isinstance(m, dict):
            continue
        args: Any = m.get("args")
        try:
            args = ast.literal_eval(args) if isinstance(args, str) else {}
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            args = {}
        if not isinstance(args, dict):
            args = {}
        choices = [c for c in m.get("c") or [] if isinstance(c, (int, bool))]
        bound = tuple(b for b in m.get("b") or [] if isinstance(b, int))
        out.append(E.TraceStep(str(m.get("a")), args, choices, str(m.get("o", "")), bound))
    return out


def _stats_msg(st: E.Stats) -> dict:
    return {"examples": st.examples, "steps": st.steps, "seconds": st.seconds, "actions": dict(st.actions),
            "outcomes": [[a, o, n] for (a, o), n in st.outcomes.items()], "offered": dict(st.offered), "accepted": dict(st.accepted),
            "boundaries": dict(st.boundaries),
            "first": dict(st.first_failure_steps), "failing": st.failures_seen}


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _stats_into(st: E.Stats, m: dict) -> None:
    st.examples, st.steps = _int(m.get("examples")), _int(m.get("steps"))
    sec = m.get("seconds")
    st.seconds = float(sec) if isinstance(sec, (int, float)) else 0.0
    st.failures_seen = _int(m.get("failing"))
    acts = m.get("actions")
    if isinstance(acts, dict):
        st.actions = Counter({str(k): _int(v) for k, v in acts.items()})
    outs = m.get("outcomes")
    if isinstance(outs, list):
        st.outcomes = Counter({(str(x[0]), str(x[1])): _int(x[2]) for x in outs if isinstance(x, list) and len(x) == 3})
    for name in ("offered", "accepted", "boundaries"):
        d = m.get(name)
        if isinstance(d, dict):
            setattr(st, name, Counter({str(k): _int(v) for k, v in d.items()}))
    first = m.get("first")
    if isinstance(first, dict):
        st.first_failure_steps = {str(k): _int(v) for k, v in first.items()}


