"""The cheaper guided argument draw (issue 35) draws what the plain one drew.

* :class:`~memspec.invariants.choosers.PackedRecorder` gives the values,
  the record and the packed state of ``RecordingChooser(PackedChooser(..))``
  call for call (integer of every width, choice, boolean);
* a trace step's references (``TraceStep.refs``), handed over from the
  guidance instead of computed again, are ``bound + _refs_in(args)``, as
  ``Draws._recent_refs`` computes them.

The draws themselves are pinned by ``tests/test_engine_draws_pinned.py``.
"""

from __future__ import annotations

import random

from memspec.invariants import engine as E
from memspec.invariants.choosers import PackedChooser, PackedRecorder, RecordingChooser, WalkChooser
from memspec.invariants.draws import _refs_in
from memspec.invariants.planning import make_plan
from memspec.spec.api import MiB
from memspec.spec.core import SpecError


def _calls(rng: random.Random, n: int) -> list:
    out = []
    for _ in range(n):
        k = rng.randrange(6)
        if k == 0:
            out.append(("integer", (5, 5)))                                  # one value: no choice
        elif k == 1:
            lo = rng.randrange(-3, 10)
            out.append(("integer", (lo, lo + rng.randrange(1, 300))))         # packed or its own choice
        elif k == 2:
            out.append(("integer", (0, rng.randrange(1, 1 << 40))))          # wide: its own choice
        elif k == 3:
            out.append(("choice", (tuple(range(rng.randrange(1, 6))),)))
        elif k == 4:
            out.append(("choice", ([7],)))                                    # one option: nothing recorded
        else:
            out.append(("boolean", ()))
    return out


def test_packed_recorder_draws_and_records_as_a_recording_chooser_over_the_packed_one():
    for seed in range(20):
        calls = _calls(random.Random(seed), 300)
        plain_inner, fast_inner = WalkChooser(random.Random(seed), []), WalkChooser(random.Random(seed), [])
        plain_p, fast_p = PackedChooser(plain_inner), PackedChooser(fast_inner)
        plain, fast = RecordingChooser(plain_p), PackedRecorder(fast_p)
        for i, (name, args) in enumerate(calls):
            if i % 37 == 0:   # a new step: a fresh packed integer
                plain_p.new_step()
                fast_p.new_step()
            if i % 50 == 0:   # the caller keeps each draw's record apart
                plain.record = []
                fast.record = []
            assert getattr(fast, name)(*args) == getattr(plain, name)(*args), (seed, i, name, args)
            assert fast.record == plain.record
            assert (fast_p._v, fast_p._room) == (plain_p._v, plain_p._room)
        assert fast_inner.record == plain_inner.record


def test_packed_recorder_refuses_an_empty_choice_as_the_recording_chooser_does():
    fast = PackedRecorder(PackedChooser(WalkChooser(random.Random(0), [])))
    try:
        fast.choice(())
    except SpecError as e:
        assert "empty domain" in str(e)
    else:
        raise AssertionError("no error")


def test_trace_refs_handed_over_by_the_guidance_are_bound_plus_the_args_refs():
    for level in ("mechanism", "system"):
        plan = make_plan("reference", level, capacity=16 * MiB)
        for seed in range(3):
            run = E.Run(plan, chooser=WalkChooser(random.Random(seed), []))
            ch = WalkChooser(random.Random(seed + 1), [])
            handed = 0
            try:
                for _ in range(60):
                    ts = run.step(ch)
                    if ts is not None and ts.refs is not None:
                        handed += 1
                        assert ts.refs == ts.bound + _refs_in(ts.args)
            finally:
                run.close()
            assert handed > 0
