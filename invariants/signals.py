"""Hypothesis-native signals of a conformance run.

Every step of the conformance state machine records Hypothesis
:func:`~hypothesis.event`\\ s -- the action drawn, the outcome branch the
implementation took, and the boundary values its arguments hit -- so that
``pytest --hypothesis-show-statistics`` (with the memspec plugin) and
Hypothesis's observability output (``HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY``,
read by tools such as Tyche) show the distribution of what ran.

No :func:`~hypothesis.target` is reported: scoring each example by the
number of distinct outcome branches it took was tried and made the shipped
``growth-keeps-partial-mapping`` mutant (S9) take over 8 minutes to kill
instead of 43 s (same catalog, same machine), because the targeted phase
spends the example budget hill-climbing on that score.

Boundaries come from the spec, not from a list here: the integer arguments
of the machine's ``init`` (the page, the capacity) and the ``K_*`` constants
of the module that defines the machine (the caching allocator's block,
pool and segment thresholds), each exactly and at +-1.
"""

from __future__ import annotations

import sys
from typing import Any

#: argument values below this are reference ids or counts, not sizes
_LEAST = 256


def boundaries(plan: Any) -> dict[int, str]:
    """``{value: name}`` of the boundary values of ``plan``'s machine (cached on the plan)."""
    cached = plan.__dict__.get("_memspec_boundaries")
    if cached is not None:
        return cached
    named: dict[str, int] = {}
    for k, v in (getattr(plan, "init_kwargs", None) or {}).items():
        if type(v) is int and v >= _LEAST:
            named[k] = v
    init = getattr(getattr(plan, "machine", None), "init", None)
    mod = sys.modules.get(getattr(init, "__module__", "") or "")
    if mod is not None:
        for k, v in vars(mod).items():
            if k.startswith("K_") and type(v) is int and v >= _LEAST:
                named[k] = v
    out: dict[int, str] = {}
    for k, v in sorted(named.items(), key=lambda kv: kv[1]):
        for d, suffix in ((0, ""), (-1, "-1"), (1, "+1")):
            out.setdefault(v + d, k + suffix)
    plan.__dict__["_memspec_boundaries"] = out
    return out


def step(run: Any, ts: Any) -> None:
    """Events for one executed step (``ts``: the engine's trace step; None
    when the engine skipped the step because no action was available)."""
    from hypothesis import event

    if ts is None:
        event("action: (none available)")
        return
    event(f"action: {ts.action}")
    event(f"outcome: {ts.action} -> {ts.outcome}")
    bounds = boundaries(run.plan)
    if bounds:
        for k, v in ts.args.items():
            if type(v) is int and v in bounds:
                event(f"boundary: {ts.action}.{k} = {bounds[v]}")


class HypothesisStatistics:
    """Hypothesis's statistics of the runs inside a ``with`` block, also of
    runs in a forked child (``memspec conform`` runs the engine in a
    supervised child, where Hypothesis's own collector callback would set a
    value in the child's memory only): each run's statistics are appended as
    one JSON line to a temporary file and read back, as data, when the block
    ends.  ``texts(nodeid)`` gives them as ``--hypothesis-show-statistics``
    prints them."""

    def __init__(self) -> None:
        self.stats: list[dict] = []
        self._path: str | None = None
        self._cm: Any = None

    def __enter__(self) -> "HypothesisStatistics":
        import os
        import tempfile

        from hypothesis.statistics import collector

        fd, self._path = tempfile.mkstemp(prefix="memspec-stats-", suffix=".jsonl")
        os.close(fd)
        path = self._path

        def note(stats: dict) -> None:
            import json

            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(stats, default=str) + "\n")

        self._cm = collector.with_value(note)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> bool:
        import json
        import os

        self._cm.__exit__(*exc)
        try:
            with open(self._path or "", encoding="utf-8") as fh:
                for line in fh:
                    try:
                        d = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(d, dict):
                        self.stats.append(d)
        except OSError:
            pass
        finally:
            try:
                os.unlink(self._path or "")
            except OSError:
                pass
        return False

    def texts(self, nodeid: str | None = None) -> str:
        from hypothesis.statistics import describe_statistics

        out = []
        for d in self.stats:
            if nodeid is not None:
                d = {**d, "nodeid": nodeid}
            try:
                out.append(describe_statistics(d))
            except Exception as e:  # noqa: BLE001 - malformed statistics are reported, not raised
                out.append(f"(statistics could not be described: {type(e).__name__}: {e})")
        return "\n\n".join(out)
