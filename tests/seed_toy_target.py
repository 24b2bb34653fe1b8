"""Seed 003's ``toy_alloc.py`` (the ``Sim`` listing of
``shared/seeds/003_5119c376f66a0078.txt``, copied verbatim below) wrapped as a
caching-level target, written from README.md's "Writing a target" section.

The toy has two real bugs the run must report:

* a small request (<= 1 MiB) crashes: ``_find`` classifies a block by its own
  size (``b.size <= MB``), so the fresh 2 MiB small-pool segment's block is
  never a "small" block, ``_find`` returns ``None`` and ``alloc`` calls
  ``_rem(None)`` (an unexpected exception out of ``malloc``);
* a double free is accepted silently (``free`` never checks ``b.free``).

The adapter below is deliberately thin: it translates the toy's interface to
the ``CachingAllocator`` one (``malloc``/``free``/``complete_stream``/
``synchronize``/``empty_cache``/``memory_stats``/``snapshot``), its ``OOM`` into
``OutOfMemory`` with the diagnosis figures, and refuses what is not the toy's
business (a size that is not a positive ``int``, another allocator's handle).
It adds no double-free check: that is the toy's job, and the bug under test.

``memspec conform tests.seed_toy_target:target``
"""

from __future__ import annotations

from memspec.spec.api import CachingTarget, MiB, TargetInstance
from memspec.spec.errors import ForeignAllocation, InvalidRequest, OutOfMemory

# ---------------------------------------------------------------------------
# The allocator under test: seed 003's listing, verbatim.
# ---------------------------------------------------------------------------

# toy_alloc.py -- PyTorch's CUDACachingAllocator replayed on CPU (policy from
# c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.5): small pool <= 1 MiB, 512 B
# rounding, 2 MiB segments; large pool, 2 MiB rounding, 20 MiB segments;
# size-class free lists; split only if the remainder is legal; adjacent frees
# coalesce; empty_cache() drops fully-free segments.
MB = 1 << 20

class OOM(Exception): pass

class Block:
    def __init__(s, seg, off, size):
        s.seg, s.off, s.size, s.free, s.req = seg, off, size, True, 0
    def __str__(s):
        return (f"seg{s.seg}[{s.off//MB}..{(s.off+s.size)//MB})M "
                f"{s.size//MB}M {'FREE' if s.free else 'LIVE'}")

def round_size(n):
    if n <= MB:  return (n + 511) // 512 * 512       # 512 B ladder
    return (n + 2*MB - 1) // (2*MB) * (2*MB)         # 2 MiB ladder

class Sim:
    def __init__(s, device):
        s.device, s.reserved = device, 0
        s.requested = s.allocated = 0                # the disagreeing sums
        s.segments, s.free_lists = [], {}            # 1 segment = 1 cudaMalloc

    def _cudaMalloc(s, size):                        # the driver boundary
        if s.reserved + size > s.device:
            free = sum(b.size for l in s.free_lists.values() for b in l)
            big = max((b.size for l in s.free_lists.values() for b in l), default=0)
            raise OOM(f"CUDA out of memory. Tried to allocate {size//MB} MiB "
                      f"(device {s.device//MB} MiB; {s.reserved//MB} MiB reserved; "
                      f"{free//MB} MiB is reserved but unallocated; "
                      f"largest free block {big//MB} MiB)")
        s.reserved += size
        s.segments.append([Block(len(s.segments), 0, size)])
        s._add(s.segments[-1][0])

    def _add(s, b):  s.free_lists.setdefault(b.size, []).append(b)
    def _rem(s, b):
        s.free_lists[b.size].remove(b)
        if not s.free_lists[b.size]: del s.free_lists[b.size]

    def _find(s, want):
        small = want <= MB                           # pools never mix
        if want in s.free_lists:
            for b in s.free_lists[want]:
                if (b.size <= MB) == small: return b
        c = [b for l in s.free_lists.values() for b in l
             if b.size >= want and (b.size <= MB) == small]
        return min(c, key=lambda b: b.size) if c else None

    def _split(s, b, want):
        rem = b.size - want
        if rem >= (512 if want <= MB else 2*MB):     # remainder must be legal
            tail = Block(b.seg, b.off + want, rem)
            s.segments[b.seg].append(tail); s._add(tail)
            b.size = want                            # split; remainder recycled
        # else: whole block handed over -> internal fragmentation, no split

    def alloc(s, n):
        want = round_size(n)
        b = s._find(want)
        if b is None:
            s._cudaMalloc(2*MB if want <= MB else max(20*MB, want))  # OOM born here
            b = s._find(want)
        s._rem(b); s._split(b, want); b.free = False; b.req = n
        s.requested += n; s.allocated += b.size
        return b

    def free(s, b):
        b.free = True
        s.allocated -= b.size; s.requested -= b.req
        seg = s.segments[b.seg]
        while True:                                  # coalesce adjacent frees
            nbr = next((o for o in seg if o is not b and o.free and
                        (o.off + o.size == b.off or b.off + b.size == o.off)), None)
            if nbr is None: break
            s._rem(nbr)
            lo, hi = (nbr, b) if nbr.off < b.off else (b, nbr)
            lo.size += hi.size; seg.remove(hi); b = lo
        s._add(b)

    def empty_cache(s):                              # fully-free segments only
        rel = 0
        for seg, blocks in enumerate(s.segments):
            if blocks and all(x.free for x in blocks):
                rel += blocks[0].size
                for b in blocks: s._rem(b)
                s.segments[seg] = []
        s.reserved -= rel
        return rel


# ---------------------------------------------------------------------------
# The adapter: the toy behind the CachingAllocator interface.
# ---------------------------------------------------------------------------

_SEGMENT_STRIDE = 1 << 40      # segment i lives at [(i + 1) * stride, ...): distinct addresses


class ToyHandle:
    """What ``malloc`` returns (``CachingBlockHandle``): address, size after
    rounding and split, requested size, stream -- and the toy's ``Block``."""

    __slots__ = ("address", "size", "requested_size", "stream", "_block", "_owner")

    def __init__(self, block: Block, requested: int, owner: "ToyCachingAllocator") -> None:
        self.address = (block.seg + 1) * _SEGMENT_STRIDE + block.off
        self.size = block.size
        self.requested_size = requested
        self.stream = 0
        self._block = block
        self._owner = owner

    def __repr__(self) -> str:
        return f"ToyHandle({self.address:#x}, size={self.size}, requested={self.requested_size})"


class ToyCachingAllocator:
    """``Sim`` with ``torch.cuda`` names: one stream, no ``record_stream``,
    no expandable segments."""

    def __init__(self, capacity: int) -> None:
        self.sim = Sim(device=capacity)
        self.num_ooms = 0

    def malloc(self, size: int, stream: int = 0) -> ToyHandle:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise InvalidRequest(f"size must be a positive int, got {size!r}")
        if stream != 0:
            raise InvalidRequest(f"one stream only (0), got {stream!r}")
        try:
            block = self.sim.alloc(size)
        except OOM as e:
            self.num_ooms += 1
            want = round_size(size)
            tried = 2 * MB if want <= MB else max(20 * MB, want)   # the segment alloc() asked _cudaMalloc for
            free = [b for l in self.sim.free_lists.values() for b in l]
            raise OutOfMemory(
                str(e), requested=tried, total_capacity=self.sim.device,
                free=self.sim.device - self.sim.reserved, allocated=self.sim.allocated,
                reserved=self.sim.reserved, reserved_unallocated=sum(b.size for b in free),
                largest_free_block=max((b.size for b in free), default=0)) from None
        return ToyHandle(block, size, self)

    def free(self, block: ToyHandle) -> None:
        if not isinstance(block, ToyHandle) or block._owner is not self:
            raise ForeignAllocation(f"not a block of this allocator: {block!r}")
        self.sim.free(block._block)          # the toy's free, unchecked: no double-free test added here

    def complete_stream(self, stream: int) -> None:
        pass                                  # one stream, no events: nothing is ever deferred

    def synchronize(self) -> None:
        pass

    def empty_cache(self) -> int:
        return self.sim.empty_cache()

    def memory_stats(self) -> dict:
        pools = {"small_pool": [0, 0, 0], "large_pool": [0, 0, 0]}   # reserved, allocated, requested
        for blocks in self.sim.segments:
            if not blocks:
                continue
            seg_size = sum(b.size for b in blocks)
            p = pools["small_pool" if seg_size == 2 * MB else "large_pool"]   # small segments are 2 MiB
            p[0] += seg_size
            for b in blocks:
                if not b.free:
                    p[1] += b.size
                    p[2] += b.req
        stats = {"num_ooms": self.num_ooms}
        alls = {"reserved_bytes": self.sim.reserved, "allocated_bytes": self.sim.allocated,
                "active_bytes": self.sim.allocated, "requested_bytes": self.sim.requested}
        for i, key in enumerate(("reserved_bytes", "allocated_bytes", "requested_bytes")):
            stats[f"{key}.all.current"] = alls[key]
            for pool, vals in pools.items():
                stats[f"{key}.{pool}.current"] = vals[i]
        stats["active_bytes.all.current"] = alls["active_bytes"]
        for pool, vals in pools.items():
            stats[f"active_bytes.{pool}.current"] = vals[1]
        return stats

    def snapshot(self) -> dict:
        """``torch.cuda.memory._snapshot()`` form: the toy's segments and blocks."""
        segments = []
        for i, blocks in enumerate(self.sim.segments):
            if not blocks:                   # released by empty_cache
                continue
            base = (i + 1) * _SEGMENT_STRIDE
            total = sum(b.size for b in blocks)
            segments.append({
                "address": base, "total_size": total,
                "segment_type": "small" if total == 2 * MB else "large",
                "is_expandable": False, "stream": 0,
                "blocks": [{"address": base + b.off, "size": b.size,
                            "state": "inactive" if b.free else "active_allocated",
                            "requested_size": 0 if b.free else b.req}
                           for b in sorted(blocks, key=lambda b: b.off)],
            })
        return {"segments": segments}


def target(capacity: int | None = None) -> TargetInstance:
    cap = capacity or 64 * MiB
    alloc = ToyCachingAllocator(cap)
    return TargetInstance(
        mechanism=None,
        kind="caching",
        allocator=alloc,
        physical_bytes=lambda: alloc.sim.reserved,   # the toy's driver boundary: what _cudaMalloc holds
        capacity=cap,
        caching=CachingTarget(policy="seed", expandable=False, streams=1, record_stream=False),
    )
