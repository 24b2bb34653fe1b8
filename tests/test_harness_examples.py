"""The worked examples of README "Writing a target" (docs/examples/) conform,
and what they lack is N/A with the reason -- never FAIL or ERROR."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from memspec.invariants import runner  # noqa: E402


def rows(results):
    return {(r.level, inv): (st, d) for r in results for inv, _t, st, d in r.rows()}


def test_mechanism_example_conforms_at_both_levels_and_lacks_only_what_it_says():
    results = runner.conform("docs.examples.mechanism_target:target", examples=30, steps=25, out_dir=None)
    assert [r.level for r in results] == ["mechanism", "system"]
    assert all(r.ok for r in results), [(r.level, r.errors, [(f.invariant, f.reason) for f in r.failures])
                                        for r in results]
    got = rows(results)
    assert got[("mechanism", "S13")] == ("N/A", "capability absent: ep, shared_mapping")
    assert got[("mechanism", "S12")][0] == "N/A" and "virtual_backing" in got[("mechanism", "S12")][1]
    # no EP of its own: the kernels that would touch its memory are not drawn
    assert "use" not in results[1].plan.actions and "use_owned" not in results[1].plan.actions
    assert results[0].stats.actions["allocate"] > 0 and results[0].stats.actions["deallocate"] > 0


def test_caching_example_with_one_stream_and_fixed_segments():
    (res,) = runner.conform("docs.examples.caching_target:target", examples=30, steps=25, out_dir=None)
    assert res.ok, (res.errors, [(f.invariant, f.reason) for f in res.failures])
    got = rows([res])
    assert got[("caching", "C7")] == ("N/A", "capability absent: second_stream")
    assert got[("caching", "C8")] == ("N/A", "capability absent: expandable_segments")
    assert "record_stream" not in res.plan.actions
    assert {st for (_l, inv), (st, _d) in got.items() if inv not in ("C7", "C8")} == {"PASS"}


def test_system_example_brings_its_own_governor_and_conforms():
    (res,) = runner.conform("docs.examples.system_target:target", "system", examples=30, steps=25, out_dir=None)
    assert res.ok, (res.errors, [(f.invariant, f.reason) for f in res.failures])
    assert res.stats.actions["reserve"] + res.stats.actions["allocate_owned"] > 0
