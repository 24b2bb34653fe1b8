"""The conformance harness, in one import: the engine and its parts.

The harness is split along its seams (each module reads on its own):

* :mod:`~memspec.invariants.errors` -- :class:`Violation` per invariant, spec/target errors;
* :mod:`~memspec.invariants.choosers` -- where choices come from (Hypothesis, a seeded walk, a replay);
* :mod:`~memspec.invariants.guard` -- calling untrusted code: the per-call guard and the supervisor;
* :mod:`~memspec.invariants.integrity` -- the data written into, and read back from, the machine's regions;
* :mod:`~memspec.invariants.engine` -- :class:`Plan`, :class:`Run`: one step of spec and target side by side;
* :mod:`~memspec.invariants.levels` -- the registry of levels (machine, init, system under test);
* :mod:`~memspec.invariants.planning` -- a target at a level made into a :class:`Plan`;
* :mod:`~memspec.invariants.runner` -- Hypothesis over a plan, supervised conformance runs.

Nothing here knows a machine: no action, state field or invariant is named.
"""

from __future__ import annotations

from memspec.invariants.choosers import HypothesisChooser, RandomChooser, RecordingChooser, ReplayChooser, WalkChooser
from memspec.invariants.engine import Plan, Run, Stats, TraceStep
from memspec.invariants.errors import (SPEC_ERROR, TARGET_ERROR, HangResult, SpecError, TargetError, Violation,
                                       _HangResult, violation_class)
from memspec.invariants.guard import CallGuard, Watch, supervise
from memspec.invariants.integrity import Integrity, make_integrity
from memspec.invariants.levels import LEVELS, CachingSUT, Level, MechanismSUT, RefTable

__all__ = [
    "CachingSUT", "CallGuard", "HangResult", "HypothesisChooser", "Integrity", "LEVELS", "Level", "MechanismSUT",
    "Plan", "RandomChooser", "RecordingChooser", "RefTable", "ReplayChooser", "Run", "SPEC_ERROR", "SpecError",
    "Stats", "TARGET_ERROR", "TargetError", "TraceStep", "Violation", "WalkChooser", "Watch", "_HangResult", "make_integrity",
    "supervise", "violation_class",
]
