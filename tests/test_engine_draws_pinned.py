"""The engine's draws, pinned (issue 32): a seeded engine run makes the same
chooser calls, in the same order, as it did at commit 3aa91a4 -- the commit
before the drawing logic moved out of ``invariants/engine.py`` into
``invariants/draws.py`` and the three ``RandomChooser`` classes became one.

``tests/data/engine_draws_3aa91a4.json`` was generated at 3aa91a4 (not by
this code): for the reference target at the ``system`` and ``mechanism``
levels, seeds 0-2, 30 steps each, a ``Run`` built with
``RandomChooser(random.Random(seed), record)`` and stepped with
``RandomChooser(random.Random(seed + 1), record)``; it holds every recorded
choice (the packed wide integers and the booleans), the actions drawn, the
focus left at the end and a sha256 of the steps' ``(action, args,
choices)``.  Hypothesis replays the engine's choice sequences and saved
reproductions replay its recorded choices, so any change of draw order is a
bug: if this test fails, the change is in the draws, not in the data file.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from memspec.invariants import engine as E
from memspec.invariants.choosers import RandomChooser, WalkChooser
from memspec.invariants.planning import make_plan
from memspec.spec.api import MiB

PINNED = json.loads((Path(__file__).parent / "data" / "engine_draws_3aa91a4.json").read_text())


def _example(level: str, seed: int, chooser: type = RandomChooser, steps: int = 30) -> dict:
    plan = make_plan("reference", level, capacity=16 * MiB)
    record: list = []
    run = E.Run(plan, chooser=chooser(random.Random(seed), record))
    ch = chooser(random.Random(seed + 1), record)
    try:
        for _ in range(steps):
            run.step(ch)
    finally:
        run.close()
    return {"level": level, "seed": seed, "focus": run.focus,
            "actions": [t.action for t in run.trace],
            "record": [v if type(v) is bool else int(v) for v in record],
            "args_sha256": hashlib.sha256(repr([(t.action, t.args, t.choices) for t in run.trace])
                                          .encode()).hexdigest()}


@pytest.mark.parametrize("pinned", PINNED, ids=lambda e: f"{e['level']}-{e['seed']}")
def test_a_seeded_run_draws_what_it_drew_before_the_split(pinned):
    got = _example(pinned["level"], pinned["seed"])
    assert got["record"] == pinned["record"]
    assert got == pinned


@pytest.mark.parametrize("pinned", PINNED[:2], ids=lambda e: f"{e['level']}-{e['seed']}")
def test_the_walk_chooser_draws_the_same(pinned):
    assert _example(pinned["level"], pinned["seed"], WalkChooser) == pinned


def test_one_random_chooser_under_every_former_import_path():
    """Issue 32: ``spec.selfcheck``, ``invariants.formal.agreement`` and
    ``invariants.choosers`` each had a ``RandomChooser``; now they all name
    the spec's one class (``spec.core``), and the walk's ``WalkChooser`` is
    that class with the same draws; ``spec.selfcheck.DataChooser`` became
    the spec's ``HypothesisChooser``, which the harness uses too."""
    from memspec.invariants import choosers, harness
    from memspec.invariants.formal import agreement
    from memspec.invariants.errors import SpecError
    from memspec.spec import core, selfcheck

    assert selfcheck.RandomChooser is agreement.RandomChooser is choosers.RandomChooser is core.RandomChooser
    assert harness.RandomChooser is core.RandomChooser
    assert issubclass(choosers.WalkChooser, core.RandomChooser)
    assert choosers.HypothesisChooser is selfcheck.HypothesisChooser is core.HypothesisChooser
    assert not hasattr(selfcheck, "DataChooser")
    assert SpecError is core.SpecError
    # a one-value draw takes nothing from the generator (the harness's behaviour, now everyone's)
    a, b = random.Random(5), random.Random(5)
    ch = core.RandomChooser(a)
    assert ch.integer(3, 3) == 3 and ch.choice(["only"]) == "only"
    assert a.random() == b.random()
    with pytest.raises(SpecError, match="empty domain"):
        ch.choice([])
