"""The caching allocator over other mechanisms: the reference VMM and the CUDA
implementation on its host driver emulator (seed 003's scenario on each)."""

from __future__ import annotations

import pytest

from memspec.reference.caching import CachingAllocator
from memspec.spec.errors import OutOfMemory

MiB = 1 << 20


def _reference(cap):
    from memspec.reference import targets

    return targets.reference(capacity=cap)


def _cuda_host(cap):
    from memspec.cuda_impl import targets

    return targets.cuda_host(capacity=cap)


@pytest.mark.parametrize("make", [_reference, _cuda_host], ids=["reference", "cuda-host"])
def test_seed_scenario_over_a_mechanism(make):
    t = make(40 * MiB)
    try:
        mech = t.mechanism
        fixed = CachingAllocator(preset="seed", capacity=40 * MiB, driver=mech.allocator(), backing=mech.virtual_backing())
        A = []
        for _ in range(4):
            A.append(fixed.malloc(3 * MiB + 1))
            fixed.malloc(5 * MiB + 1)
        assert t.physical_bytes() == 40 * MiB == fixed.memory_reserved()
        for x in A:
            fixed.free(x)
        with pytest.raises(OutOfMemory) as e:
            fixed.malloc(8 * MiB)
        assert e.value.reserved_unallocated == 16 * MiB and e.value.largest_free_block == 4 * MiB
        assert fixed.empty_cache() == 0
    finally:
        if t.close:
            t.close()
    t = make(40 * MiB)
    try:
        mech = t.mechanism
        exp = CachingAllocator(preset="seed", capacity=40 * MiB, driver=mech.allocator(), backing=mech.virtual_backing(),
                               expandable_segments=True)
        A = []
        for _ in range(4):
            A.append(exp.malloc(3 * MiB + 1))
            exp.malloc(5 * MiB + 1)
        assert t.physical_bytes() == 40 * MiB
        for x in A:
            exp.free(x)
        assert t.physical_bytes() == 24 * MiB == exp.memory_reserved()  # pages returned at free
        arena = min(s["address"] for s in exp.segments())
        p = exp.malloc(8 * MiB)
        assert p.address - arena == 40 * MiB and t.physical_bytes() == 32 * MiB
    finally:
        if t.close:
            t.close()
