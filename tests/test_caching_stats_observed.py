"""``memory_stats()`` beyond the current byte figures (C1): the counts of
allocated and active blocks, the segment count and the inactive splits
(segments of fixed size), and the implementation's own bookkeeping (each
``Stat``'s peak at least its current figure; ``allocated - freed - current``
constant over a run).

Each planted statistics bug below leaves every byte figure right, so the
observations before these (the four byte figures and ``num_ooms``) never
saw it; the same walks of the caching machine as the conformance tests
(``tests/test_caching_conformance.py``) now blame C1.
"""

from __future__ import annotations

import pytest

from memspec.invariants.mutants.caching import _factory
from memspec.reference.caching import CachingAllocator
from memspec.spec.caching import observations as O

from test_caching_conformance import walk


class _EditedStats(CachingAllocator):
    def memory_stats(self) -> dict:
        st = super().memory_stats()
        self.edit(st)
        return st

    def edit(self, st: dict) -> None:
        raise NotImplementedError


class InactiveSplitsNeverCounted(_EditedStats):
    """``inactive_split`` and its bytes stay 0 (cached blocks of split segments not counted)."""

    def edit(self, st: dict) -> None:
        for k in list(st):
            if k.startswith("inactive_split") and k.endswith(".current"):
                st[k] = 0


class PendingCountedAsAllocated(_EditedStats):
    """``allocation`` counts the blocks whose free waits for a stream's event too (it is ``active``'s count)."""

    def edit(self, st: dict) -> None:
        for pool in ("all", "small_pool", "large_pool"):
            st[f"allocation.{pool}.current"] = st[f"active.{pool}.current"]


class FreedNeverAccumulated(_EditedStats):
    """No ``freed`` figure ever grows (a decrease forgets to accumulate)."""

    def edit(self, st: dict) -> None:
        for k in list(st):
            if k.endswith(".freed"):
                st[k] = 0


class PeakNeverRaised(_EditedStats):
    """Peaks stay at 0."""

    def edit(self, st: dict) -> None:
        for k in list(st):
            if k.endswith(".peak"):
                st[k] = 0


class SegmentCountedOnceAPool(_EditedStats):
    """``segment`` counts 1 per pool that has any segment."""

    def edit(self, st: dict) -> None:
        for pool in ("small_pool", "large_pool"):
            st[f"segment.{pool}.current"] = min(st[f"segment.{pool}.current"], 1)
        st["segment.all.current"] = st["segment.small_pool.current"] + st["segment.large_pool.current"]


BUGS = [InactiveSplitsNeverCounted, PendingCountedAsAllocated, FreedNeverAccumulated, PeakNeverRaised,
        SegmentCountedOnceAPool]


def _first_failure(cls: type, observations=None, seeds: int = 40):
    fac = _factory(cls, "pytorch")
    for seed in range(seeds):
        got = walk(fac, seed) if observations is None else _walk_with(fac, seed, observations)
        if got is not None:
            return got
    return None


def _walk_with(fac, seed, observations):
    from memspec.spec.caching import CACHING

    saved = list(CACHING.observations)
    CACHING.observations[:] = observations
    try:
        return walk(fac, seed)
    finally:
        CACHING.observations[:] = saved


@pytest.mark.parametrize("cls", BUGS, ids=lambda c: c.__name__)
def test_a_statistics_bug_that_leaves_the_bytes_right_is_blamed_on_c1(cls):
    got = _first_failure(cls)
    assert got is not None, f"{cls.__name__} survived"
    inv, how, reason, _step = got
    assert (inv, how) == ("C1", "observation"), got
    assert "memory_stats" in reason


def _bytes_only(d: dict) -> dict:
    return {k: v for k, v in d.items() if "_bytes." in k or k == "num_ooms"}


@pytest.mark.parametrize("cls", BUGS, ids=lambda c: c.__name__)
def test_the_byte_figures_alone_never_saw_it(cls):
    from memspec.spec.core import Observation

    before = [o for o in O.OBSERVATIONS if o.name not in (
        "memory_stats (C1)", "memory_stats segments and inactive splits (C1)", "memory_stats bookkeeping (C1)")]
    assert len(before) == len(O.OBSERVATIONS) - 3
    # the memory_stats observation as it was: the four byte figures per pool and num_ooms
    before.append(Observation("memory_stats (C1)", "C1", O._global,
                              lambda st, r: _bytes_only(O._stats_expected(st, r)),
                              lambda sut, r: _bytes_only(O._stats_observed(sut, r))))
    assert _first_failure(cls, before, seeds=10) is None


def test_the_bookkeeping_baseline_is_taken_at_the_first_read():
    """A reset of the accumulated figures before the run (the torch adapter
    makes one) moves ``allocated - freed - current`` once: the first read
    is the baseline, only a change after it is a failure."""
    from types import SimpleNamespace

    figures = {"allocated_bytes.all.current": 512, "allocated_bytes.all.peak": 512,
               "allocated_bytes.all.allocated": 0, "allocated_bytes.all.freed": 0}
    sut = SimpleNamespace(allocator=SimpleNamespace(memory_stats=lambda: dict(figures)))
    assert O._bookkeeping(sut, None) is None            # after a reset: -512, the baseline
    figures.update({"allocated_bytes.all.current": 1024, "allocated_bytes.all.peak": 1024,
                    "allocated_bytes.all.allocated": 512})
    assert O._bookkeeping(sut, None) is None            # still -512
    figures["allocated_bytes.all.freed"] = 512            # a decrease that forgot the current figure
    assert "moved by -512" in O._bookkeeping(sut, None)
    figures.update({"allocated_bytes.all.freed": 0, "allocated_bytes.all.peak": 100})
    assert "peak 100 below current 1024" in O._bookkeeping(sut, None)


class OnlyTheRequiredFigures(CachingAllocator):
    """A plugin that reports just the figures the README requires (the byte
    figures and ``num_ooms``): its missing counts are not compared."""

    def memory_stats(self) -> dict:
        return {k: v for k, v in super().memory_stats().items() if "_bytes." in k and k.endswith(".current")
                or k == "num_ooms"}


def test_counts_an_implementation_does_not_report_are_not_compared():
    assert _first_failure(OnlyTheRequiredFigures, seeds=10) is None
    assert repr(O.NOT_REPORTED) == "not reported" and O.NOT_REPORTED == 7 and not (O.NOT_REPORTED != 7)
    assert {"a": 3} == {"a": O.NOT_REPORTED} and not ({"a": 3} != {"a": O.NOT_REPORTED})
