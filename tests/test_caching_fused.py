"""The fused malloc/free paths of the plain reference caching allocator
(``CachingAllocator._fast``) against the hook path a subclass runs: the same
blocks, segments, free lists and every statistic after every operation, on
random workloads with streams, deferred frees, splits, merges, OOM,
empty_cache and stat resets."""

import random

import pytest

from memspec.reference.caching import CachingAllocator
from memspec.spec.errors import MemspecError

MiB = 1 << 20


class Hooked(CachingAllocator):
    """A subclass: never takes the fused paths (the hooks run, as for the mutants)."""


def _view(a):
    free = sorted((k, b.address, b.size) for pool in (a._small, a._large)
                  for k, b in zip(pool.blocks, (pool.free[k & ((1 << 64) - 1)] for k in pool.blocks)))
    return a.memory_stats(), a.segments(), free, a.live_blocks()


@pytest.mark.parametrize("preset, seed", [("seed", 0), ("seed", 1), ("pytorch", 2), ("pytorch", 3)])
def test_fused_paths_match_the_hooks_step_by_step(preset, seed):
    fast = CachingAllocator(preset=preset, capacity=512 * MiB)
    slow = Hooked(preset=preset, capacity=512 * MiB)
    assert fast._fast and not slow._fast
    rng = random.Random(seed)
    live: list = []
    fused_mallocs = 0
    most_segments = 0
    for step in range(1500):
        op = rng.random()
        if op < 0.5 or not live:
            size = rng.choice([rng.randint(1, 4096), rng.randint(1, MiB), rng.randint(MiB + 1, 40 * MiB)])
            stream = rng.choice([0, 0, 0, 1])
            outs = []
            for a in (fast, slow):
                try:
                    outs.append(a.malloc(size, stream))
                except MemspecError as e:
                    outs.append(type(e))
            if isinstance(outs[0], type) or isinstance(outs[1], type):
                assert outs[0] == outs[1], (step, outs)
            else:
                f, s = outs
                assert (f.address, f.size, f.requested_size, f.stream) == (s.address, s.size, s.requested_size, s.stream)
                live.append((f, s))
                fused_mallocs += 1
        elif op < 0.85:
            f, s = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.2:
                fast.record_stream(f, 2)
                slow.record_stream(s, 2)
            fast.free(f)
            slow.free(s)
        elif op < 0.93:
            for a in (fast, slow):
                a.complete_stream(2)
        elif op < 0.97:
            assert fast.empty_cache() == slow.empty_cache()
        elif op < 0.985:
            fast.reset_peak_memory_stats()
            slow.reset_peak_memory_stats()
        else:
            fast.reset_accumulated_memory_stats()
            slow.reset_accumulated_memory_stats()
        assert _view(fast) == _view(slow), f"step {step}"
        most_segments = max(most_segments, len(fast.segments()))
    assert fused_mallocs > 300 and most_segments > 2


def test_settings_that_change_the_policy_leave_the_fused_paths():
    a = CachingAllocator(preset="pytorch", capacity=512 * MiB)
    assert a._fast
    a.set_allocator_settings(max_split_size=40 * MiB)
    assert not a._fast
    a.set_allocator_settings(max_split_size=None)
    assert a._fast
    a.set_allocator_settings(garbage_collection_threshold=0.5)
    assert not a._fast
    b = CachingAllocator(preset="pytorch", capacity=512 * MiB, expandable_segments=True)
    assert not b._fast
    b.set_allocator_settings(expandable_segments=False)
    assert not b._fast  # its pools may still hold expandable blocks


def test_keys_after_walks_the_free_list_like_irange():
    """The expandable best fit walks the keys after its first candidate with
    ``_keys_after`` (over several sublists here) instead of ``irange``."""
    from bisect import bisect_left

    from sortedcontainers import SortedList

    from memspec.reference.caching import _keys_after

    rng = random.Random(5)
    sl = SortedList(rng.sample(range(10 ** 6), 5000))
    assert len(sl._lists) > 2
    checked = 0
    for lo in rng.sample(range(10 ** 6), 200):
        if lo > sl._maxes[-1]:
            continue
        pos = bisect_left(sl._maxes, lo)
        idx = bisect_left(sl._lists[pos], lo)
        it = sl.irange(minimum=lo)
        next(it)
        assert list(_keys_after(sl._lists, pos, idx)) == list(it)
        checked += 1
    assert checked > 100
