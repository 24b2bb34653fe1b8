"""Shared helpers: timing, result rows, the table."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

#: Row statuses. Only ``measured`` rows carry numbers; the others say why not.
MEASURED = "measured"
NOT_AVAILABLE = "not available"   # a dependency has not landed / does not import
NOT_RUN = "not run"               # deliberately not run here (no CUDA driver, --quick)
FAILED = "failed"                 # the benchmark itself raised; the note says what


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
    status: str = MEASURED

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def unavailable(name: str, unit: str, target: str, reason: str, *, status: str = NOT_AVAILABLE) -> Row:
    """A row that could not be measured: no numbers, never counted as met."""
    return Row(name, None, unit, None, target, None, f"{status}: {reason}", status=status)


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
    if x != 0 and abs(x) < 0.01:
        return f"{x:.2e}"
    return f"{x:.{digits}f}"


def met_text(r: Row) -> str:
    if r.status != MEASURED:
        return "-"
    return "-" if r.met is None else ("yes" if r.met else "NO")


def print_table(rows: list[Row]) -> None:
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
    except ImportError:  # pragma: no cover
        for r in rows:
            print(r)
        return
    t = Table(title="memspec benchmarks (ratios measured in this run)")
    for col in ("benchmark", "value", "unit", "ratio", "target", "met", "note"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(*(escape(x) for x in (r.name, fmt(r.value), r.unit, fmt(r.ratio), r.target, met_text(r), r.note)))
    Console(width=220).print(t)


def markdown_table(rows: list[Row]) -> str:
    """The same table as Markdown (for bench/README.md)."""
    out = ["| benchmark | value | unit | ratio | target | met | note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = (r.name, fmt(r.value), r.unit, fmt(r.ratio), r.target, met_text(r), r.note)
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out)
