"""Caching state: the policy parameters, segments, blocks and streams.

Seed 003: *segments* (one cudaMalloc each, or one expandable VA arena), each
tiled by *blocks*; two *pools*; *streams* whose recorded *events* complete
when the caller says the stream's work is done.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memspec.spec.api import MiB
from memspec.spec.caching.kernels import K_LARGE_BUFFER, K_ROUND_LARGE, divisions_for, round_size

#: the two policy presets: PyTorch 2.5 exactly, and the seed's toy
PRESETS = ("pytorch", "seed")

#: block states
FREE, LIVE, PENDING, UNMAPPED = "free", "live", "pending", "unmapped"


@dataclass(frozen=True)
class Policy:
    preset: str = "pytorch"
    capacity: int = 64 * MiB
    expandable: bool = False
    max_split_size: int = 0           # 0 = unlimited
    divisions: tuple[int, ...] = ()  # roundup_power2_divisions, 16 entries or ()
    memory_fraction: float | None = None
    gc_threshold: float = 0.0
    arena_factor: float = 0.0         # VA of an expandable arena / capacity; 0 = the preset's

    @property
    def arena(self) -> float:
        """PyTorch reserves 1.125 x device memory per arena; the toy's VA is
        *endless* (16 x here)."""
        return self.arena_factor or (16.0 if self.seed else 1.125)

    @property
    def seed(self) -> bool:
        return self.preset == "seed"

    @property
    def allowed(self) -> int | None:
        return None if self.memory_fraction is None else int(self.memory_fraction * self.capacity)

    def rounded(self, size: int) -> int:
        return round_size(size, self.seed, divisions_for(size, self.divisions))

    def page(self, small: bool) -> int:
        """Expandable-segment page: PyTorch 2 MiB (small) / 20 MiB (large); the toy's 2 MiB."""
        return K_ROUND_LARGE if self.seed or small else K_LARGE_BUFFER


@dataclass
class Block:
    offset: int
    size: int
    state: str
    stream: int
    requested: int = 0
    ref: int | None = None
    uses: set[int] = field(default_factory=set)   # live: streams recorded by record_stream
    waits: int = 0                                 # pending: events not yet processed
    gc_base: int = 0

    def __deepcopy__(self, memo: dict) -> "Block":
        # the spec copies its state before every malloc it predicts: a field-by-field copy, not copy's walk
        return Block(self.offset, self.size, self.state, self.stream, self.requested, self.ref, set(self.uses),
                     self.waits, self.gc_base)


@dataclass
class Segment:
    sid: int
    base: int | None     # learned from the implementation's first answer in it
    size: int
    small: bool
    stream: int
    expandable: bool
    page: int
    blocks: list[Block]

    def address(self, b: Block) -> int:
        assert self.base is not None
        return self.base + b.offset

    def __deepcopy__(self, memo: dict) -> "Segment":
        return Segment(self.sid, self.base, self.size, self.small, self.stream, self.expandable, self.page,
                       [b.__deepcopy__(memo) for b in self.blocks])


@dataclass
class CachingState:
    policy: Policy
    streams: int = 3                                          # streams requests are drawn on: [0, streams)
    segments: list[Segment] = field(default_factory=list)
    next_sid: int = 0
    next_ref: int = 1
    where: dict[int, int] = field(default_factory=dict)      # live/pending ref -> sid
    freed: set[int] = field(default_factory=set)              # refs freed (for double-free)
    issued: dict[int, int] = field(default_factory=dict)      # stream -> events recorded
    completed: dict[int, int] = field(default_factory=dict)   # stream -> events completed
    events: list[tuple[int, int, int]] = field(default_factory=list)  # (stream, value, ref) not yet processed
    gc_calls: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    num_ooms: int = 0
    violations: list[tuple[str, str]] = field(default_factory=list)

    def __deepcopy__(self, memo: dict) -> "CachingState":
        """A copy sharing nothing mutable (the policy is frozen; tuples and ints are values)."""
        new = CachingState(self.policy, self.streams, [s.__deepcopy__(memo) for s in self.segments], self.next_sid,
                           self.next_ref, dict(self.where), set(self.freed), dict(self.issued), dict(self.completed),
                           list(self.events), dict(self.gc_calls), self.num_ooms, list(self.violations))
        extra = set(vars(self)) - _STATE_FIELDS
        for k in extra:   # attributes set on a state after it was made (none in the spec): copied the slow way
            import copy

            setattr(new, k, copy.deepcopy(getattr(self, k), memo))
        return new

    # -- aggregates ------------------------------------------------------
    def has(self, capability: str) -> bool:
        """The capabilities this state models (a spec-only run draws what they allow)."""
        return {"record_stream": True, "second_stream": self.streams > 1,
                "expandable_segments": self.policy.expandable}.get(capability, False)

    def seg(self, sid: int) -> Segment:
        for s in self.segments:
            if s.sid == sid:
                return s
        raise KeyError(sid)

    def block_of(self, ref: int) -> tuple[Segment, int]:
        s = self.seg(self.where[ref])
        for i, b in enumerate(s.blocks):
            if b.ref == ref:
                return s, i
        raise KeyError(ref)

    def reserved(self, small: bool | None = None) -> int:
        n = 0
        for s in self.segments:
            if small is None or s.small == small:
                n += s.size if not s.expandable else sum(b.size for b in s.blocks if b.state != UNMAPPED)
        return n

    def figure(self, states: tuple[str, ...], small: bool | None = None, requested: bool = False) -> int:
        return sum((b.requested if requested else b.size)
                   for s in self.segments if small is None or s.small == small
                   for b in s.blocks if b.state in states)

    def count(self, states: tuple[str, ...], small: bool | None = None) -> int:
        """How many blocks are in ``states`` (in one pool, or in all)."""
        return sum(1 for s in self.segments if small is None or s.small == small
                   for b in s.blocks if b.state in states)

    def largest_free(self) -> int:
        return max((b.size for s in self.segments for b in s.blocks if b.state == FREE), default=0)


_STATE_FIELDS = frozenset(CachingState.__dataclass_fields__)


def _violate(st: CachingState, inv: str, why: str) -> None:
    st.violations.append((inv, why))

