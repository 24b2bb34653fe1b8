"""Edges of the caching spec's expandable segments, answered by the spec and the reference alike.

* An arena smaller than the request (``arena_factor`` below the presets'
  1.125 and 16): no arena can hold it, so malloc is an OutOfMemory (the spec
  raised IndexError, the reference AttributeError, on a fresh arena that
  ran out of blocks).
* ``memory_fraction`` under the seed preset with expandable segments: the
  toy maps only the rounded request's pages (``if s.mapped + want >
  s.device``), so the cap is checked on those pages, not on the
  ``max(20 MiB, r)`` segment a non-expandable malloc would take.  PyTorch
  (the ``pytorch`` preset) checks the segment size even when expandable.
"""

from __future__ import annotations

import pytest

from memspec.reference.caching import CachingAllocator
from memspec.spec import caching as spec
from memspec.spec.errors import OutOfMemory

MiB = 1 << 20


def _both(st, a, size):
    """malloc(size) on stream 0, by the reference and by the spec (its predicted branch, followed with the
    reference's own OutOfMemory where both refuse, so C9 judges the reference's figures): the two answers."""
    p = spec.predict_malloc(st, size, 0)
    try:
        ref = ("ok", a.malloc(size, 0).size)
        err = None
    except OutOfMemory as e:
        ref, err = ("oom", e.requested), e
    outs = spec.CACHING.action("malloc").step(st, size=size, stream=0)
    first = outs.branches[0]
    if p.oom is not None:
        assert getattr(first, "error", None) is OutOfMemory, outs.describe()
        mine = ("oom", p.oom["requested"])
        if err is not None:
            first.then(err)
    else:
        mine = ("ok", p.seg.blocks[p.index].size)
        first.then(first.witness())
    assert not spec.CACHING.check_invariants(st)
    return mine, ref


@pytest.mark.parametrize("preset", ["pytorch", "seed"])
def test_request_larger_than_an_arena_is_an_out_of_memory(preset):
    kw = dict(capacity=64 * MiB, arena_factor=0.25)  # arenas of 16 MiB of VA
    st = spec.init(policy=preset, expandable=True, **kw)
    a = CachingAllocator(preset=preset, expandable_segments=True, **kw)
    assert _both(st, a, 30 * MiB) == (("oom", 30 * MiB),) * 2
    assert st.reserved() == a.memory_reserved() == 0
    # a request that fits an arena is still served, from the first arena, by both
    assert _both(st, a, 8 * MiB) == (("ok", 8 * MiB),) * 2
    # one arena: 16 MiB of VA in whole pages (the toy's 2 MiB; pytorch's large-pool 20 MiB)
    assert [s.size for s in st.segments if s.expandable] == [16 * MiB if preset == "seed" else 20 * MiB]


# (preset, expandable, request) -> served under a 10 MiB cap on a 64 MiB device
CAP_CASES = [
    ("seed", True, 2 * MiB, True),      # the toy maps one 2 MiB page: within the cap
    ("seed", True, 10 * MiB, True),     # exactly the cap
    ("seed", True, 12 * MiB, False),    # one page over
    ("seed", True, 1000, True),         # a small request: one 2 MiB page
    ("seed", False, 2 * MiB, False),    # a non-expandable malloc takes a 20 MiB segment
    ("pytorch", True, 2 * MiB, False),  # PyTorch checks the 20 MiB segment size even when expandable
    ("pytorch", False, 2 * MiB, False),
]


@pytest.mark.parametrize("preset,expandable,size,served", CAP_CASES)
def test_memory_fraction_cap_checks_what_the_malloc_takes(preset, expandable, size, served):
    kw = dict(capacity=64 * MiB, memory_fraction=10 / 64)  # the cap: 10 MiB
    st = spec.init(policy=preset, expandable=expandable, **kw)
    a = CachingAllocator(preset=preset, expandable_segments=expandable, **kw)
    mine, ref = _both(st, a, size)
    assert mine == ref, (mine, ref)
    assert mine[0] == ("ok" if served else "oom"), mine
    assert st.reserved() == a.memory_reserved() <= 10 * MiB


def test_seed_expandable_cap_fills_page_by_page():
    """Under the seed preset with expandable segments, five 2 MiB requests fill a 10 MiB cap and the sixth
    is refused, by the spec and the reference alike (a 20 MiB check refused the first)."""
    kw = dict(capacity=64 * MiB, memory_fraction=10 / 64)
    st = spec.init(policy="seed", expandable=True, **kw)
    a = CachingAllocator(preset="seed", expandable_segments=True, **kw)
    for _ in range(5):
        assert _both(st, a, 2 * MiB) == (("ok", 2 * MiB),) * 2
    assert st.reserved() == a.memory_reserved() == 10 * MiB
    assert _both(st, a, 2 * MiB) == (("oom", 2 * MiB),) * 2
