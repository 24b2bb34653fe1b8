"""``memspec prove --jobs``: the proof groups run in a process pool and the rows
are the same as in one process (only the seconds differ)."""

from __future__ import annotations

import json
from typing import Any

from memspec.commands import prove as P


def _rows(records: list[dict[str, Any]]) -> str:
    """The JSON rows of ``--json`` minus the measured times.  (A counterexample's
    text, printed by ``--traces``, is a Z3 model: which model Z3 returns depends
    on the terms its process built before, so it is not part of the comparison;
    whether the variant was refuted is.)"""
    out = P._json(records, None, 0.0)
    out.pop("total_seconds")
    return json.dumps(out, sort_keys=True)


def test_jobs_1_and_2_give_the_same_rows() -> None:
    args = dict(ids=["S1", "S3", "P1"], samples=30, inv_samples=10, seed=0, caching_on=False, depth=4,
                per_branch=5)
    one, _c1, _t1 = P.run(jobs=1, **args)  # type: ignore[arg-type]
    two, _c2, _t2 = P.run(jobs=2, **args)  # type: ignore[arg-type]
    assert [r["id"] for r in one] == ["S1", "S3", "P1"]
    assert _rows(one) == _rows(two)
    # the S rows read the shared agreement walk: it ran in a worker and came back
    assert all(r["invariant_agreement"]["samples"] > 0 for r in two if r["id"].startswith("S"))


def test_pool_returns_results_in_task_order() -> None:
    # the costliest kinds are submitted first; the results still come back in the tasks' order
    tasks = [("S", "S1"), ("heap", ("init",)), ("S", "S3")]
    got = P._run_tasks(tasks, jobs=2)
    assert [r[0].id for r, _ in (got[0], got[2])] == ["S1", "S3"]
    assert got[1][0]["checks"][0][0] == "init" and got[1][0]["checks"][0][1] == "proved"


def test_heap_units_join_in_unit_order_whatever_ran_them() -> None:
    from memspec.invariants.formal import proofs_caching_heap as H

    units = [u for u in H.heap_units() if u[0] in ("init", "kernels", "knob")][:3]
    serial = H.join_units([H.heap_unit(u) for u in units])
    pooled = H.join_units([r for r, _cpu in P._run_tasks([("heap", u) for u in units], jobs=2)])
    assert [c[:2] for c in serial["checks"]] == [c[:2] for c in pooled["checks"]]
    assert [c[0] for c in serial["checks"]][0] == "init"
    # every unit of the heap induction is listed: each action, each phase, each unguarded variant, each knob
    kinds = {u[0] for u in H.heap_units()}
    assert {"init", "safety", "rounding", "step", "phase", "kernels", "refute", "knob"} <= kinds
    assert {u[1] for u in H.heap_units() if u[0] == "refute"} == set(H.UNGUARDED)
    assert {u[1] for u in H.heap_units(ids=["C2"]) if u[0] == "refute"} == {"C2"}


def test_jobs_below_1_is_refused(capsys: Any) -> None:
    import pytest

    with pytest.raises(SystemExit):
        P.main(["--jobs", "0", "S1"])
    err = capsys.readouterr().err
    assert "--jobs" in err and ("must be at least 1" in err or "must be a positive integer" in err), err


def test_default_jobs_is_the_affinity_count() -> None:
    import os

    assert P.default_jobs() == len(os.sched_getaffinity(0))


def test_unknown_group_is_an_error() -> None:
    import pytest

    with pytest.raises(ValueError, match="unknown proof group"):
        P._task(("nope",))


def test_pool_submits_the_costliest_units_first() -> None:
    # a split part of the heaviest consecution outranks a whole light unit and an S proof
    heavy = ("heap", ("step", "unmap:cache", "sums-mono"))
    light = ("heap", ("init",))
    assert P.task_cost(heavy) > P.task_cost(light) and P.task_cost(heavy) > P.task_cost(("S", "S1"))
    from memspec.invariants.formal import proofs_caching_heap as H

    # a split unit is estimated at its share of the whole action
    whole = H.unit_cost(("step", "unmap:cache"))
    assert H.unit_cost(("step", "unmap:cache", "core")) * len(H.STEP_PARTS) == whole


def test_heavy_consecutions_are_split_into_parts_and_the_parts_cover_every_goal() -> None:
    from memspec.invariants.formal import proofs_caching_heap as H

    units = H.heap_units()
    for name in H.SPLIT_STEPS:
        assert [u for u in units if u[:2] == ("step", name)] == [("step", name, p) for p in H.STEP_PARTS]
    # on a light action: the parts' goals are exactly the whole unit's, each once, with the same verdicts
    whole = H.heap_unit(("step", "record_stream"))["checks"]
    parts = [c for p in H.STEP_PARTS for c in H.heap_unit(("step", "record_stream", p))["checks"]]
    assert sorted(c[:2] for c in parts) == sorted(c[:2] for c in whole)
    assert any(c[0].endswith(":mono") for c in parts) and any(c[0].endswith(":step") for c in parts)


def test_progress_names_every_finished_task_on_stderr(capsys: Any) -> None:
    P.run(ids=["S1", "S3"], samples=0, inv_samples=0, seed=0, caching_on=False, depth=2, jobs=2)
    err = capsys.readouterr().err.splitlines()
    lines = [ln for ln in err if ln.startswith("prove: [")]
    # S1 and S3 (no agreement walk with samples 0): one line each, counted to the total
    assert len(lines) == 2, err
    assert [ln.split("]")[0] for ln in lines] == ["prove: [1/2", "prove: [2/2"]
    assert {ln.split("] ")[1].split(":")[0] for ln in lines} == {"S S1", "S S3"}


def test_quiet_run_prints_no_progress(capsys: Any) -> None:
    P.run(ids=["S1"], samples=0, inv_samples=0, seed=0, caching_on=False, depth=2, jobs=1, quiet=True)
    assert "prove: [" not in capsys.readouterr().err


def test_each_task_runs_in_a_fresh_process() -> None:
    # a proof group never inherits another's Z3 terms: each comes back from a process of its own
    tasks = [("S", "S1"), ("S", "S3")]
    got = P._run_tasks(tasks, jobs=1)
    assert [r[0][0].id for r in got] == ["S1", "S3"]


def test_walks_below_0_is_refused() -> None:
    import pytest

    with pytest.raises(SystemExit):
        P.main(["--walks", "-1", "S1"])
