"""The conformance suite as pytest items (used by :mod:`memspec.pytest_plugin`).

``pytest --memspec-target=TARGET`` adds, for each target and level, one test
per invariant: ``memspec[TARGET/LEVEL/S5 no-silent-noop]``.  The harness runs
once per (target, level), on the first of its tests; each test then reports
its invariant: pass, fail with the shrunk counterexample and the path of its
standalone reproduction, or skip with the N/A reason (capability absent).
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from memspec.invariants import runner


class MemspecFailure(Exception):
    """An invariant failed on the target (the item's failure)."""


class MemspecItem(pytest.Item):
    def __init__(self, *, target: str, level: str, invariant: str, cache: dict, opts: dict, **kw: Any) -> None:
        super().__init__(**kw)
        self.target, self.level, self.invariant, self.cache, self.opts = target, level, invariant, cache, opts

    def _result(self) -> runner.PlanResult:
        key = (self.target, self.level)
        if key not in self.cache:
            o = self.opts
            from memspec.invariants.signals import HypothesisStatistics

            with HypothesisStatistics() as stats:  # --hypothesis-show-statistics: the run's events, on this item
                (res,) = runner.conform(self.target, self.level, profile=o["profile"], examples=o["examples"],
                                        steps=o["steps"], seed=o["seed"], out_dir=o["out"], timeout=o["timeout"],
                                        machine=o["machine"])
            if stats.stats:
                self.hypothesis_statistics = stats.texts(self.nodeid)
            self.cache[key] = res
        return self.cache[key]

    def runtest(self) -> None:
        res = self._result()
        for inv, _title, status, detail in res.rows():
            if inv != self.invariant:
                continue
            if status == "N/A":
                pytest.skip(f"N/A: {detail}")
            if status == "ERROR":
                raise MemspecFailure(f"ERROR: {detail}")
            if status == "FAIL":
                f = next(x for x in res.failures if x.invariant == inv)
                steps = "\n".join(f"  {i}. {s.action}({', '.join(f'{k}={v!r}' for k, v in s.args.items())}) -> {s.outcome}"
                                  for i, s in enumerate(f.trace, 1))
                raise MemspecFailure(f"{inv} [{f.cause}] {f.reason}\nshrunk counterexample ({f.shrunk_length} steps):\n"
                                     f"{steps}" + (f"\nreproduction: python {shlex.quote(str(f.repro))}" if f.repro else ""))
            return
        if res.errors:
            raise MemspecFailure("; ".join(res.errors))
        raise MemspecFailure(f"{self.invariant} not in the results of {self.target}/{self.level}")

    def repr_failure(self, excinfo, style=None):  # noqa: D401 - pytest hook
        if isinstance(excinfo.value, MemspecFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"memspec {self.target}/{self.level}/{self.invariant}"


class MemspecTarget(pytest.Collector):
    def __init__(self, *, target: str, opts: dict, cache: dict, **kw: Any) -> None:
        super().__init__(**kw)
        self.target, self.opts, self.cache = target, opts, cache

    def collect(self):
        # the target's factory runs in a supervised child, never in pytest's process
        for lvl, invariants, error in runner.describe(self.target, self.opts["level"], machine=self.opts["machine"]):
            if error is not None:
                yield _ErrorItem.from_parent(self, name=f"{lvl}/setup", message=error)
                continue
            for inv, title in invariants:
                yield MemspecItem.from_parent(self, name=f"{lvl}/{inv} {title}", target=self.target, level=lvl,
                                              invariant=inv, cache=self.cache, opts=self.opts)


class _ErrorItem(pytest.Item):
    def __init__(self, *, message: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.message = message

    def runtest(self) -> None:
        raise MemspecFailure(self.message)

    def repr_failure(self, excinfo, style=None):
        return str(excinfo.value)


def add_items(session: Any, config: Any, items: list) -> None:
    """Append the suite's items for every ``--memspec-target``."""
    opts = {
        "profile": config.getoption("memspec_profile"),
        "examples": config.getoption("memspec_examples"),
        "steps": config.getoption("memspec_steps"),
        "seed": config.getoption("memspec_seed"),
        "level": config.getoption("memspec_level"),
        "out": config.getoption("memspec_out"),
        "timeout": config.getoption("memspec_timeout"),
        "machine": config.getoption("memspec_machine"),
    }
    cache: dict = {}
    for target in config.getoption("memspec_target"):
        col = MemspecTarget.from_parent(session, name=f"memspec[{target}]", target=target, opts=opts, cache=cache)
        items.extend(col.collect())
