"""Issue 35, a cheaper oracle step: what the cuts rely on.

* the engine's check sweep memo (``spec.core.CHECKS_MEMO``) exists only
  while a step's checks run, belongs to the state it was made for, and is
  never carried by a copy;
* the caching observations read the implementation's snapshot and
  ``memory_stats()`` once per step, and still see a layout that breaks;
* ``memory_stats()`` keeps its keys sorted;
* the C ABI loader's ``memory()`` check still tells read-write, read-only
  and unmapped memory apart.
"""

from __future__ import annotations

import copy
import ctypes
import mmap
import os
import pickle
import random

import pytest

from memspec.invariants import runner
from memspec.invariants.engine import Run
from memspec.invariants.walk import WalkChooser
from memspec.spec.core import CHECKS_MEMO, ChecksMemo, checks_memo


class _State:
    pass


def test_the_memo_belongs_to_its_state_and_no_copy_carries_it():
    st = _State()
    assert checks_memo(st) is None
    m = ChecksMemo(st)
    m["x"] = 1
    st.__dict__[CHECKS_MEMO] = m
    assert checks_memo(st) is m
    assert checks_memo(copy.deepcopy(st)) is None
    assert checks_memo(copy.copy(st)) is None          # a shallow copy shares the dict, but does not own it
    assert checks_memo(pickle.loads(pickle.dumps(st))) is None


def _walk(plan, seed: int = 0):
    ch = WalkChooser(random.Random(seed), [])
    run = Run(plan, chooser=ch)
    return run, ch


def test_the_engine_opens_the_memo_for_the_checks_only():
    plan = runner.make_plan("reference-caching", "caching")
    run, ch = _walk(plan)
    seen: list = []
    check = run.check_invariants

    def spy():
        seen.append(checks_memo(run.state) is not None)
        return check()

    run.check_invariants = spy
    try:
        for _ in range(30):
            run.step(ch)
            assert CHECKS_MEMO not in vars(run.state)    # gone after the step
        assert seen and all(seen)                       # present while the invariants ran
    finally:
        run.close()


def test_caching_reads_the_snapshot_and_the_stats_once_per_step():
    plan = runner.make_plan("reference-caching", "caching")
    run, ch = _walk(plan)
    alloc = run.sut.allocator
    calls = {"snapshot": 0, "memory_stats": 0}
    for name in calls:
        fn = getattr(alloc, name)

        def counted(*a, _fn=fn, _name=name, **k):
            calls[_name] += 1
            return _fn(*a, **k)

        setattr(alloc, name, counted)
    try:
        for _ in range(40):
            before = dict(calls)
            run.step(ch)
            assert calls["snapshot"] - before["snapshot"] == 1
            assert calls["memory_stats"] - before["memory_stats"] == 1
    finally:
        run.close()


def test_a_broken_layout_is_still_seen_by_every_layout_observation():
    """The three layout observations share one judgement of the snapshot:
    a snapshot with a gap fails C2's, with two free neighbours C3's."""
    from memspec.spec.caching import observations as O

    class Sut:
        reads = None

        class allocator:
            @staticmethod
            def snapshot():
                return {"segments": [{"address": 0, "total_size": 4096, "segment_type": "large",
                                      "is_expandable": False, "stream": 0,
                                      "blocks": [{"address": 0, "size": 1024, "state": "inactive",
                                                  "requested_size": 0},
                                                 {"address": 1024, "size": 1024, "state": "inactive",
                                                  "requested_size": 0},
                                                 {"address": 3072, "size": 1024, "state": "active_allocated",
                                                  "requested_size": 1024}]}]}

    sut = Sut()
    for reads in (None, {}):
        sut.reads = reads
        by = {o.blame: o for o in O.OBSERVATIONS if o.name.startswith(("layout", "free neighbours"))}
        assert "gap or overlap" in by["C2"].observed(sut, None)
        assert "uncoalesced" in by["C3"].observed(sut, None)
        if reads is not None:
            assert set(reads) == {"segments", "layout"}


def test_memory_stats_keys_stay_sorted():
    plan = runner.make_plan("reference-caching", "caching")
    run, ch = _walk(plan)
    try:
        for _ in range(20):
            run.step(ch)
            flat = run.sut.allocator.memory_stats()
            assert list(flat) == sorted(flat)
            assert all(type(v) is int for v in flat.values())
    finally:
        run.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="Linux /proc only")
def test_the_loaders_memory_check_tells_mappings_apart():
    from memspec.adapters.c_plugin import mapped_rw

    buf = ctypes.create_string_buffer(1 << 16)
    assert mapped_rw(ctypes.addressof(buf), 1 << 16) is None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = mmap.PAGESIZE
    ro = libc.mmap(None, 3 * page, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert ro not in (None, ctypes.c_void_p(-1).value)
    try:
        assert "not read-write" in mapped_rw(ro, page)
        assert libc.munmap(ro + page, page) == 0          # a hole in the middle
        assert "not mapped" in mapped_rw(ro + page, 16)
    finally:
        libc.munmap(ro, 3 * page)


@pytest.mark.parametrize("target", ["reference-caching", "reference-caching-seed", "reference-caching-expandable"])
def test_the_one_pass_stats_figures_are_the_states_own(target):
    """The memory_stats observation's spec figures, summed in one pass over
    the blocks, equal ``CachingState.reserved/figure/count`` (same keys, same order)."""
    from memspec.spec.caching import observations as O

    plan = runner.make_plan(target, "caching")
    for seed in range(2):
        run, ch = _walk(plan, seed)
        try:
            for _ in range(60):
                run.step(ch)
                a, b = O._stats_expected(run.state, None), O._stats_expected_by_figures(run.state, None)
                assert a == b and list(a) == list(b)
        finally:
            run.close()


@pytest.mark.parametrize("target", ["reference-caching", "reference-caching-seed", "reference-caching-expandable"])
def test_the_one_pass_segment_figures_are_the_per_pool_ones(target):
    """The segments/inactive-splits observation's spec figures, counted in
    one pass over the segments, equal the per-pool definition (same keys,
    same order)."""
    from memspec.spec.caching import observations as O

    plan = runner.make_plan(target, "caching")
    for seed in range(2):
        run, ch = _walk(plan, seed)
        try:
            for _ in range(60):
                run.step(ch)
                a, b = O._segments_expected(run.state, None), O._segments_expected_by_pools(run.state, None)
                assert a == b and list(a) == list(b)
        finally:
            run.close()


def test_bookkeeping_compares_as_read_as_it_did_with_a_dict_of_offsets():
    """The bookkeeping observation after a run's first read (compared in
    the loop, no dict of offsets) names the same first disagreement: a peak
    below current before any moved offset, else the first family moved."""
    from types import SimpleNamespace

    from memspec.spec.caching import observations as O

    fams = ("a.all", "b.all", "c.all")
    flat = {f"{f}.{p}": 0 for f in fams for p in ("allocated", "current", "freed", "peak")}
    sut = SimpleNamespace(reads=None)
    sut.allocator = SimpleNamespace(memory_stats=lambda: flat)
    assert O._bookkeeping(sut, None) is None              # the first read: the offsets
    assert O._bookkeeping(sut, None) is None
    flat["c.all.allocated"] = 5                            # c moved by 5
    assert O._bookkeeping(sut, None).startswith("c.all: allocated - freed - current moved by 5 ")
    flat["b.all.allocated"] = 2                            # b too: b is first
    assert O._bookkeeping(sut, None).startswith("b.all: allocated - freed - current moved by 2 ")
    flat["c.all.current"], flat["c.all.peak"] = 3, 1       # a peak below current wins over a moved offset
    assert O._bookkeeping(sut, None) == "c.all: peak 1 below current 3"


@pytest.mark.parametrize("target", ["reference-caching", "reference-caching-seed", "reference-caching-expandable"])
def test_c1_from_the_one_pass_figures_is_c1_by_definition(target):
    """C1's check reads the one-pass pool figures (shared with the stats
    observation in a check sweep); it answers as its definition over
    ``CachingState``'s aggregates, on reachable states and on broken ones."""
    import copy as _copy

    from memspec.spec.caching import invariants as CI

    plan = runner.make_plan(target, "caching")
    run, ch = _walk(plan, 3)
    try:
        for _ in range(60):
            run.step(ch)
            st = run.state
            assert CI._c1(st) == CI._c1_by_figures(st)
            for seg in st.segments:    # broken copies: more requested than active, a smaller device
                bad = _copy.deepcopy(st)
                for b in bad.segments[st.segments.index(seg)].blocks:
                    b.requested = b.size + 1
                assert CI._c1(bad) == CI._c1_by_figures(bad)
                break
            tiny = _copy.deepcopy(st)
            tiny.policy = __import__("dataclasses").replace(tiny.policy, capacity=0)   # the policy is shared: a new one
            assert CI._c1(tiny) == CI._c1_by_figures(tiny)
    finally:
        run.close()
