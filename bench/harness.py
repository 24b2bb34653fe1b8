"""Benchmarks 1-3: the conformance harness, the random-walk fuzzer, and the
per-step cost as the live set grows.  (Integration pending.)"""

from __future__ import annotations

from bench.bare import bare_rate
from bench.common import Row, unavailable


def harness_rows(quick: bool = False) -> list[Row]:
    examples, steps = (3, 10) if quick else (100, 50)
    b_rate, b_steps, b_dt = bare_rate(examples, steps)
    bare = Row("bare Hypothesis step rate", b_rate, "steps/s", None, "", None,
               f"baseline: {examples} examples x {steps} steps, {b_steps} steps in {b_dt:.2f} s")
    return [bare, unavailable("harness step rate (reference)", "steps/s", ">= 0.5x bare", "invariants.harness has not landed")]


def walk_rows(quick: bool = False) -> list[Row]:
    return [unavailable("walk fuzz step rate (reference)", "steps/s", ">= 5x bare", "invariants.walk has not landed")]


def liveset_rows(quick: bool = False) -> list[Row]:
    return [unavailable(f"step time @{n} live", "us/step", "", "invariants.walk has not landed") for n in (10, 1000, 10000)]
