"""``memory_stats()`` of the reference caching allocator against figures
recomputed from scratch after every operation: currents from the
``segments()`` layout, peaks as running maxima, cumulative totals from the
mallocs -- independent of how the allocator keeps them (the ``all`` entries
as sums of the pools', ``active`` derived from allocation and the pending
frees).  Random workloads with two streams, deferred frees, splits, merges,
OOM, empty_cache and both resets; the plain allocator (fast paths) and a
subclass (hooks)."""

import random

import pytest

from memspec.reference.caching import CachingAllocator
from memspec.spec.errors import MemspecError

MiB = 1 << 20
POOLS = ("all", "small_pool", "large_pool")
EXACT = ("allocation", "allocated_bytes", "active", "active_bytes", "requested_bytes")


class Hooked(CachingAllocator):
    """A subclass: runs the hooks, not the fast paths."""


def _currents(a) -> dict:
    """Every pooled figure's current value, recomputed from the layout."""
    out = {}
    for pool in POOLS:
        segs = [s for s in a.segments() if pool == "all" or s["segment_type"] == pool.split("_")[0]]
        blocks = [(s, b) for s in segs for b in s["blocks"]]
        live = [b for _, b in blocks if b["state"] == "active_allocated"]
        active = [b for _, b in blocks if b["state"] in ("active_allocated", "active_pending_free")]
        split_free = [b for s, b in blocks if b["state"] == "inactive" and len(s["blocks"]) > 1]
        out[f"allocation.{pool}"] = len(live)
        out[f"allocated_bytes.{pool}"] = sum(b["size"] for b in live)
        out[f"active.{pool}"] = len(active)
        out[f"active_bytes.{pool}"] = sum(b["size"] for b in active)
        out[f"requested_bytes.{pool}"] = sum(b["requested_size"] for b in active)
        out[f"inactive_split.{pool}"] = len(split_free)
        out[f"inactive_split_bytes.{pool}"] = sum(b["size"] for b in split_free)
        out[f"reserved_bytes.{pool}"] = sum(s["total_size"] for s in segs)
        out[f"segment.{pool}"] = len(segs)
    return out


@pytest.mark.parametrize("cls", [CachingAllocator, Hooked])
@pytest.mark.parametrize("preset, seed", [("pytorch", 0), ("seed", 1), ("pytorch", 2)])
def test_memory_stats_equal_figures_recomputed_from_scratch(cls, preset, seed):
    a = cls(preset=preset, capacity=256 * MiB)
    rng = random.Random(seed)
    live: list = []
    cur = _currents(a)
    peak = dict(cur)
    total = {k: 0 for k in cur}  # cumulative increases since the last reset_accumulated (EXACT figures)
    base = dict(cur)
    checked_pending = 0
    for step in range(700):
        op = rng.random()
        mallocd = None
        if op < 0.5 or not live:
            size = rng.choice([rng.randint(1, 4096), rng.randint(1, MiB), rng.randint(MiB + 1, 30 * MiB)])
            try:
                h = a.malloc(size, rng.choice([0, 0, 1]))
            except MemspecError:
                h = None
            if h is not None:
                live.append(h)
                mallocd = h
        elif op < 0.85:
            h = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.25:
                a.record_stream(h, 2)
            a.free(h)
        elif op < 0.92:
            a.complete_stream(2)
        elif op < 0.96:
            a.empty_cache()
        elif op < 0.98:
            a.reset_peak_memory_stats()
            peak = _currents(a)
        else:
            a.reset_accumulated_memory_stats()
            total = {k: 0 for k in total}
            base = _currents(a)
        now = _currents(a)
        if mallocd is not None:
            pool = "small_pool" if mallocd.size <= MiB else "large_pool"
            for p in ("all", pool):
                for name, n in (("allocation", 1), ("active", 1), ("allocated_bytes", mallocd.size),
                                ("active_bytes", mallocd.size), ("requested_bytes", mallocd.requested_size)):
                    total[f"{name}.{p}"] += n
        for k, v in now.items():
            peak[k] = max(peak[k], v)
        flat = a.memory_stats()
        for k, v in now.items():
            assert flat[f"{k}.current"] == v, (step, k)
            name = k.split(".")[0]
            if name in EXACT:  # these rise only at malloc: the running maximum is exact
                assert flat[f"{k}.peak"] == peak[k], (step, k)
                assert flat[f"{k}.allocated"] == total[k], (step, k)
                assert flat[f"{k}.freed"] == base[k] + total[k] - v, (step, k)
            elif name.startswith("inactive_split"):  # may peak between two frees completing in one step
                assert flat[f"{k}.peak"] >= peak[k], (step, k)
        checked_pending += now["active.all"] - now["allocation.all"]
    assert checked_pending > 0, "no step had a pending free: the derived active figures went unchecked"
    assert a.memory_stats()["allocation.all.allocated"] > 0
