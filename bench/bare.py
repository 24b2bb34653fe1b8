"""A bare Hypothesis state machine: the baseline for the harness step rate.

Trivial rules (a counter and a list), the same settings the harness is run
with, so ``harness steps/s / bare steps/s`` measures what the spec oracle,
the implementation and the checks cost on top of Hypothesis itself.
"""

from __future__ import annotations

import time

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test


def bare_rate(examples: int, steps: int, seed: int = 0) -> tuple[float, int, float]:
    """Run the bare machine; return (steps/s, steps, seconds)."""
    counter = {"steps": 0}

    class Bare(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.items: list[int] = []

        @rule(x=st.integers(0, 1 << 20))
        def push(self, x: int) -> None:
            counter["steps"] += 1
            self.items.append(x)

        @rule()
        def pop(self) -> None:
            counter["steps"] += 1
            if self.items:
                self.items.pop()

        @invariant()
        def bounded(self) -> None:
            assert len(self.items) <= steps

    cfg = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    t0 = time.perf_counter()
    run_state_machine_as_test(Bare, settings=cfg)
    dt = time.perf_counter() - t0
    return counter["steps"] / dt, counter["steps"], dt
