"""``memspec.invariants.forked``: every job in a process of its own, forked on the
calling thread, results in the items' order, failures named."""

from __future__ import annotations

import os

import pytest

from memspec.invariants.forked import ForkedJobError, forkable, in_fresh_processes

pytestmark = pytest.mark.skipif(not forkable(), reason="this platform cannot fork")

#: a module-level value a job changes: a fresh process per job must never see another job's change
_STATE = {"touched": []}


def _touch(x: int) -> tuple[int, list[int], int]:
    _STATE["touched"].append(x)
    return x * x, list(_STATE["touched"]), os.getpid()


def test_results_come_back_in_the_items_order_each_from_a_fresh_process() -> None:
    seen: list[int] = []
    out = in_fresh_processes(_touch, [3, 1, 2, 5], jobs=2, on_done=lambda i, _r: seen.append(i))
    assert [r[0] for r in out] == [9, 1, 4, 25]
    # each job saw only its own change: no job ran in a process another had used
    assert [r[1] for r in out] == [[3], [1], [2], [5]]
    assert len({r[2] for r in out}) == 4 and os.getpid() not in {r[2] for r in out}
    assert sorted(seen) == [0, 1, 2, 3]
    assert _STATE["touched"] == []   # nothing ran in this process


def _boom(x: int) -> int:
    if x == 2:
        raise KeyError("planted")
    return x


def test_a_job_that_raises_is_named_with_its_traceback() -> None:
    with pytest.raises(ForkedJobError) as e:
        in_fresh_processes(_boom, [1, 2, 3], jobs=1)
    assert "job 1 (2)" in str(e.value) and "KeyError: 'planted'" in str(e.value)


def _die(x: int) -> int:
    if x == 1:
        os._exit(7)
    return x


def test_a_process_that_dies_without_a_result_is_reported() -> None:
    with pytest.raises(ForkedJobError) as e:
        in_fresh_processes(_die, [0, 1], jobs=2)
    assert "ended without a result" in str(e.value) and "exit code 7" in str(e.value)


def test_no_items_no_processes() -> None:
    assert in_fresh_processes(_touch, [], jobs=4) == []



def test_a_process_that_dies_while_writing_its_result_is_reported(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from memspec.invariants import forked

    def half_then_die(fd: int, data: bytes) -> None:   # runs in the job's process (a fork of this one)
        os.write(fd, data[: len(data) // 2])
        os._exit(0)

    monkeypatch.setattr(forked, "_write_all", half_then_die)
    with pytest.raises(ForkedJobError) as e:
        in_fresh_processes(_touch, [4], jobs=1)
    assert "job 0 (4)" in str(e.value) and "partial result" in str(e.value)
