"""The caching spec's request sizes include a free block's remainder at each
split threshold: a split rule compares ``block - request``, so its bounds
are reached by requests relative to the blocks free now, not only by the
fixed list of request sizes (seed 003: *A free block splits only if the
remainder is itself legal (>= 512 B small pool, >= 2 MiB large pool)*)."""

from __future__ import annotations

from memspec.spec import caching as spec
from memspec.spec.caching import actions as A
from memspec.spec.caching.state import FREE

MiB = 1 << 20


def _malloc(st, size: int) -> None:
    outs = spec.CACHING.action("malloc").step(st, size=size, stream=0)
    first = outs.branches[0]
    first.then(first.witness())
    assert not spec.CACHING.check_invariants(st)


def _free_sizes(st) -> set:
    return {b.size for s in st.segments for b in s.blocks if b.state == FREE}


class _Kind:
    """A chooser that draws the size kind ``kind``, then the i-th option."""

    def __init__(self, kind: int, i: int) -> None:
        self.kind, self.i = kind, i

    def integer(self, lo: int, hi: int) -> int:
        return self.kind if (lo, hi) == (0, 11) else lo + self.i

    def choice(self, options):
        return options[self.i]


def test_no_free_block_no_remainder_sizes_and_the_fixed_list_is_drawn_instead():
    st = spec.CACHING.init(policy="pytorch")
    assert A.remainder_sizes(st) == ()
    # the remainder kind falls back to the fixed list, drawn as often as before
    assert A._sizes(st, _Kind(9, 0)) == A._sizes(st, _Kind(7, 0)) == A.fixed_boundaries(st)[0]


def test_remainders_at_each_split_threshold_of_a_small_and_a_large_free_block():
    st = spec.CACHING.init(policy="pytorch")
    _malloc(st, 4096)            # a 2 MiB small segment: 4 KiB live, the rest free
    _malloc(st, 3 * MiB)         # a 20 MiB large segment: 3 MiB live, 17 MiB free
    small, large = 2 * MiB - 4096, 17 * MiB
    assert _free_sizes(st) == {small, large}
    rel = A.remainder_sizes(st)
    assert rel == tuple(sorted(set(rel))) and all(r > 0 for r in rel)
    for f in (small, large):
        # exact fit, and the remainder exactly at 512 B / 1 MiB / 2 MiB with a 512 B step either side
        for t in (0, 512, MiB, 2 * MiB):
            if f - t - 512 > 0:
                assert {f - t - 512, f - t, f - t + 512} <= set(rel), (f, t)
    # the boundaries counted are both lists; the remainder kind draws the remainders, the fixed kind the fixed list
    assert set(A.size_boundaries(st)) == set(rel) | set(A.fixed_boundaries(st))
    assert set(A.fixed_boundaries(st)) >= set(A.boundaries())
    assert A._sizes(st, _Kind(10, 3)) == rel[3]
    assert A._sizes(st, _Kind(8, 3)) == A.fixed_boundaries(st)[3]


def test_a_request_leaving_exactly_512_bytes_splits_them_off():
    """The boundary the remainders reach: under the pytorch preset a small
    block's remainder of exactly 512 B is split off (``remaining >= 512``),
    an exact fit leaves nothing."""
    st = spec.CACHING.init(policy="pytorch")
    _malloc(st, MiB)             # a 2 MiB small segment: 1 MiB live, 1 MiB free
    assert _free_sizes(st) == {MiB}
    assert {MiB - 512, MiB} <= set(A.remainder_sizes(st))
    _malloc(st, MiB - 512)
    assert _free_sizes(st) == {512}
    _malloc(st, 512)             # an exact fit: nothing left over
    assert _free_sizes(st) == set()


def _spurious_oom(requested: int):
    """malloc(64 MiB) on a fresh 64 MiB device, answered OutOfMemory with
    ``requested`` as the size the allocator says it tried: the rule blamed."""
    from memspec.spec.errors import OutOfMemory

    st = spec.CACHING.init(policy="pytorch", capacity=64 * MiB)
    outs = spec.CACHING.action("malloc").step(st, size=64 * MiB, stream=0)
    err = OutOfMemory("CUDA out of memory.", requested=requested)
    branch = outs.match(None, err)
    assert branch is not None and getattr(branch, "error", None) is OutOfMemory
    branch.then(err)
    return [inv for inv, _why in st.violations]


def test_a_spurious_oom_that_tried_another_segment_size_breaks_the_segment_ladder():
    """An OutOfMemory where the spec cuts a new segment: when the size the
    allocator says it tried is not the ladder's (64 MiB for 64 MiB), the
    segment ladder is the rule broken (C2), not the message's figures (C9)."""
    assert _spurious_oom(66 * MiB) == ["C2"]
    assert _spurious_oom(64 * MiB) == ["C9"]
