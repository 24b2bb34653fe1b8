"""Shared helpers: timing, result rows, the table."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable


@dataclass
class Row:
    """One benchmark result: a measured figure, and a ratio against its baseline."""

    name: str
    value: float | None
    unit: str
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rate(fn: Callable[[], int], *, min_seconds: float = 0.0) -> tuple[float, int, float]:
    """Run ``fn`` (returns work items done) until at least ``min_seconds``; return (items/s, items, seconds)."""
    items = 0
    t0 = time.perf_counter()
    while True:
        items += fn()
        dt = time.perf_counter() - t0
        if dt >= min_seconds:
            return items / dt, items, dt


def fmt(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def print_table(rows: list[Row]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        for r in rows:
            print(r)
        return
    t = Table(title="memspec benchmarks (ratios measured in this run)")
    for col in ("benchmark", "value", "unit", "ratio", "target", "met", "note"):
        t.add_column(col)
    for r in rows:
        met = "-" if r.met is None else ("yes" if r.met else "NO")
        t.add_row(r.name, fmt(r.value), r.unit, fmt(r.ratio), r.target, met, r.note)
    Console(width=200).print(t)
