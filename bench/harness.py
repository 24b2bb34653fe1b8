"""Benchmarks 1-3: the conformance harness, the random-walk fuzzer, and the
per-step cost as the live set grows.

1. ``memspec conform reference`` (both levels, mechanism and system) under
   Hypothesis vs the bare Hypothesis state machine of ``bench/bare.py`` with
   the same examples x steps, in the same run.  Target >= 0.5x.
2. The random-walk fuzz mode (``memspec fuzz --mode walk``): same spec
   oracle and checks, no Hypothesis engine per step.  Target >= 5x bare.
3. Time per step of the mixed phase of a walk that first builds a live set
   of 10, 1,000, 10,000 allocations.  Target: @10,000 <= 1.5x @10.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from bench.bare import bare_rate
from bench.common import Row, unavailable

HARNESS_TARGET = "reference"
#: what each row needs; a row reads "not available" only when one of these is missing
HARNESS_DEPS = ("memspec.invariants.runner", "memspec.reference.targets", "memspec.spec.mechanism", "memspec.spec.system")
WALK_DEPS = ("memspec.invariants.walk", "memspec.reference.targets", "memspec.spec.system")
_bare_cache: dict[tuple[int, int], tuple[float, int, float]] = {}


def _settings(quick: bool) -> tuple[int, int]:
    return (3, 10) if quick else (100, 50)


def bare(quick: bool) -> tuple[float, int, float]:
    """The bare Hypothesis rate for this run's examples x steps (measured once per run)."""
    key = _settings(quick)
    if key not in _bare_cache:
        _bare_cache[key] = bare_rate(*key)
    return _bare_cache[key]


def _missing(*modules: str) -> str | None:
    for m in modules:
        try:
            if importlib.util.find_spec(m) is None:
                return f"{m} has not landed"
        except (ImportError, ValueError) as e:
            return f"{m} does not import ({e})"
    return None


def harness_rows(quick: bool = False) -> list[Row]:
    examples, steps = _settings(quick)
    b_rate, b_steps, b_dt = bare(quick)
    rows = [Row("bare Hypothesis step rate", b_rate, "steps/s", None, "", None,
                f"baseline: {examples} examples x {steps} steps; {b_steps} steps in {b_dt:.2f} s")]
    name, unit, tgt = f"harness step rate (conform {HARNESS_TARGET})", "steps/s", ">= 0.5x bare"
    why = _missing(*HARNESS_DEPS)
    if why:
        return rows + [unavailable(name, unit, tgt, why)]
    from memspec.invariants import runner

    results = runner.conform(HARNESS_TARGET, "all", profile="ci", examples=examples, steps=steps, out_dir=None)
    errors = [e for r in results for e in r.errors]
    steps_run = sum(r.stats.steps for r in results if r.plan is not None)
    seconds = sum(r.seconds for r in results)
    if errors and not steps_run:
        return rows + [unavailable(name, unit, tgt, f"conform {HARNESS_TARGET}: {errors[0][:150]}")]
    rate = steps_run / seconds
    ratio = rate / b_rate
    per_level = {r.level: {"steps": r.stats.steps, "seconds": r.seconds,
                           "rate": (r.stats.steps / r.seconds if r.seconds else None)} for r in results}
    fails = [f"{f.invariant}" for r in results for f in r.failures]
    note = "levels " + ", ".join(f"{lv} {d['rate']:,.0f}/s" for lv, d in per_level.items() if d["rate"])
    if fails or errors:
        note += f"; NOTE run not clean: {len(fails)} FAIL ({', '.join(fails[:4])}), {len(errors)} errors"
    rows.append(Row(name, rate, unit, ratio, tgt, ratio >= 0.5, note,
                    extra={"steps": steps_run, "seconds": seconds, "levels": per_level, "failures": fails,
                           "errors": errors[:5]}))
    return rows


def walk_rows(quick: bool = False) -> list[Row]:
    name, unit, tgt = f"walk fuzz step rate ({HARNESS_TARGET})", "steps/s", ">= 5x bare"
    why = _missing(*WALK_DEPS)
    if why:
        return [unavailable(name, unit, tgt, why)]
    return [unavailable(name, unit, tgt, "integration with invariants.walk pending")]


LIVE = (10, 1_000, 10_000)


def liveset_rows(quick: bool = False) -> list[Row]:
    names = [f"step time @{n:,} live" for n in LIVE]
    why = _missing(*WALK_DEPS)
    if why:
        return [unavailable(n, "us/step", "<= 1.5x @10" if lv == LIVE[-1] else "", why) for n, lv in zip(names, LIVE)]
    return [unavailable(n, "us/step", "", "integration with invariants.walk pending") for n in names]
