"""The spec's state, explicit and in the seed's vocabulary.

Two machines share these records:

* :class:`MechState` -- the *mechanism level*: one ``DeviceMemoryMechanism``
  (DeviceAllocator, optional VirtualBacking, optional SharedMapping) on a
  device of ``capacity`` physical bytes with pages of ``page`` bytes.
* :class:`SysState` -- the *system level*: the roles of seed 000 wired around
  that mechanism: ProcessMemoryManager (registry, selection, context pins),
  Governor/Authority (the ledger, grants, leases, pressure tickets), the
  Execution Provider (streams, fences, the deferred-free queue), the Holders
  (ModelResidency, KvPageStore) and the owning handles a MemoryBinding hands out.

Objects the implementation makes (allocations, reservations, tickets...) are
named in the spec by *reference ids*: ints handed out by :func:`new_ref`.  A
harness binds the implementation's object to that id and gives it back to
``perform`` through ``sut.ref(id)``.

Every invariant (``memspec.spec.invariants``) is a predicate over these
records.  Figures that would need a scan are kept as running aggregates that
the actions maintain, so a check costs O(1) whatever the number of live
objects; ``full_check`` recomputes them from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedDict

# --------------------------------------------------------------------------
# What perform() saw
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """What a ``perform`` function read from the implementation.

    ``obj`` is the implementation's object (bound by the harness to the spec
    reference the branch allocates; ``None`` in a spec-only run) and
    ``facts`` the figures of the answer translated into the spec's vocabulary
    (e.g. ``mechanism`` = index into ``sut.mechanism_ids`` rather than an
    implementation-chosen string).
    """

    obj: Any
    facts: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.facts[key]


def obj_of(value: Any) -> Any:
    """The implementation object behind a bound reference (unwraps :class:`Seen`)."""
    return value.obj if isinstance(value, Seen) else value


# ==========================================================================
# Mechanism level
# ==========================================================================


@dataclass
class MechAllocation:
    """An ordinary (eager) allocation made by the mechanism under test, or by
    its independent twin (``foreign``: the source of foreign handles)."""

    ref: int
    address: int
    size: int
    footprint: int
    identity: Any
    foreign: bool = False
    live: bool = True
    #: the bytes ``[lo, hi)`` the allocation holds on the device (overlap is
    #: judged on them; see :func:`memspec.spec.eager.extent`)
    lo: int = 0
    hi: int = 0


@dataclass
class MechReservation:
    """A virtual-address reservation: ``kind`` "backing" (VirtualBacking.reserve)
    or "shared" (SharedMapping.reserve)."""

    ref: int
    kind: str
    address: int
    size: int
    identity: Any
    foreign: bool = False
    live: bool = True
    #: VirtualBacking: indices of pages with private backing installed
    committed: set[int] = field(default_factory=set)
    #: bytes the mechanism reported as newly committed minus those it reported
    #: released: must always equal ``len(committed) * page`` (S5)
    reported: int = 0
    #: SharedMapping: offset -> mapping ref; and page index -> mapping ref
    mappings: dict[int, int] = field(default_factory=dict)
    backed: set[int] = field(default_factory=set)


@dataclass
class MechHandle:
    """A physical handle (SharedMapping.create): pages that may be mapped at
    several virtual addresses; freed once released and unmapped everywhere."""

    ref: int
    size: int
    identity: Any
    released: bool = False
    mappings: int = 0
    freed: bool = False
    #: writes a caller made through its writable mappings (the bytes changed)
    writes: int = 0


@dataclass
class MechMapping:
    """One mapping of a physical handle into a shared reservation; after
    copy-on-write it is ``private`` (its own pages, no longer the handle's)."""

    ref: int
    handle: int
    reservation: int
    offset: int
    size: int
    read_only: bool
    private: bool = False
    live: bool = True
    #: writes a caller made into the private copy (after copy-on-write)
    writes: int = 0


@dataclass
class MechState:
    capacity: int
    page: int
    virtual_backing: bool
    shared_mapping: bool
    ep: bool = False
    #: how the allocator under test packs memory, as its target declares it
    #: (``memspec.spec.api.AllocatorGeometry``; ``None``: memspec's own strict
    #: page-rounded geometry, for runs of the spec on its own)
    geometry: Any = None
    next_ref: int = 1
    allocations: dict[int, MechAllocation] = field(default_factory=dict)
    #: live own allocations by address (overlap checks in O(log n))
    by_address: SortedDict = field(default_factory=SortedDict)
    reservations: dict[int, MechReservation] = field(default_factory=dict)
    handles: dict[int, MechHandle] = field(default_factory=dict)
    mappings: dict[int, MechMapping] = field(default_factory=dict)
    streams: list[int] = field(default_factory=list)
    # reference ids by category, for O(1) draws
    live_allocs: "RefSet" = field(default_factory=lambda: RefSet())
    other_allocs: "RefSet" = field(default_factory=lambda: RefSet())   # freed or foreign
    foreign_live: int = 0
    #: physical bytes the twin holds: it may share the device (the reference's
    #: twin does), so they may explain an OutOfMemory but never require one
    foreign_bytes: int = 0
    backing_refs: "RefSet" = field(default_factory=lambda: RefSet())
    shared_refs: "RefSet" = field(default_factory=lambda: RefSet())
    handle_refs: "RefSet" = field(default_factory=lambda: RefSet())
    mapping_refs: "RefSet" = field(default_factory=lambda: RefSet())
    # physical bytes in use, by component (aggregates, S11/S13)
    eager_bytes: int = 0
    committed_bytes: int = 0
    shared_bytes: int = 0
    private_bytes: int = 0
    physical: int = 0          # maintained from the implementation's answers
    live_count: int = 0        # own live allocations
    # records the invariants read
    identities: set[Any] = field(default_factory=set)
    duplicate_identities: int = 0      # S14
    foreign_frees: int = 0             # S1: a foreign handle freed here
    absent_answered: int = 0           # S5: an absent capability answered with an object
    readonly_writes: int = 0           # S13: a write through a read-only mapping succeeded
    # witness support (spec-only runs): a simple address model
    w_next_address: int = 1 << 32
    w_freed: dict[int, int] = field(default_factory=dict)  # freed address -> footprint
    w_next_identity: int = 1
    #: quality figures of an allocator whose geometry leaves them undeclared
    #: (measured, never a FAIL): bytes of footprint beyond the requests of
    #: the allocations made, and OutOfMemory answers on an empty device for a
    #: request that fitted it
    q_allocations: int = 0
    q_requested: int = 0
    q_footprint: int = 0
    q_refused_with_room: int = 0

    def has(self, capability: str) -> bool:
        return {
            "virtual_backing": self.virtual_backing,
            "shared_mapping": self.shared_mapping,
            "ep": self.ep,
        }.get(capability, False)


# ==========================================================================
# System level
# ==========================================================================


@dataclass
class Registry:
    """ProcessMemoryManager's registry: mechanisms on the device, the one
    installed now, and the selection generation (a replacement bumps it)."""

    #: per registered mechanism index: (virtual_backing, shared_mapping)
    capabilities: list[tuple[bool, bool]]
    installed: int = 0
    generation: int | None = None          # learnt from the first answer
    #: generation -> mechanism index installed at that generation (S3)
    history: dict[int, int] = field(default_factory=dict)
    selections: int = 0
    context_alive: bool = True


@dataclass
class GrantRec:
    ref: int
    holder: str
    nbytes: int
    state: str = "open"        # open | committed | cancelled


@dataclass
class LeaseRec:
    ref: int
    holder: str
    nbytes: int
    refunded: bool = False


@dataclass
class TicketRec:
    """A pressure ticket: *try to free N bytes, priority = ..., deadline = ...*"""

    ref: int
    amount: int
    priority: int
    deadline: int
    state: str = "pending"     # TicketState values
    held: int = 0              # bytes the ticket holds now (counted as granted)
    received: int = 0          # bytes holders released into it, ever
    returned: int = 0          # bytes given back to free (cancel/timeout), ever
    returns: int = 0           # how many times bytes were given back (S15: <= 1)
    claimed: int = 0           # bytes handed to the requester as a grant
    generation: int = 1        # the Governor's configuration generation when it was issued


@dataclass
class Stream:
    ref: int
    launched: int = 0          # work items submitted
    completed: int = 0         # work items known complete


@dataclass
class Owned:
    """Something physical a holder owns through the binding: an owning
    allocation, a weight, a reservation, a KV request.  ``footprint`` is what
    its charge covers; ``charged_to`` the holder carrying that charge
    (``None`` once the charge moved to a pressure ticket)."""

    ref: int
    kind: str                  # "allocation" | "weight" | "reservation"
    holder: str
    size: int
    footprint: int
    creator: int               # mechanism index that made it (S1)
    charged_to: str | None
    fences: list[tuple[int, int]] = field(default_factory=list)  # (stream ref, work item)
    state: str = "live"        # live | queued | freed
    address: int | None = None  # reservations: base address (S12)
    base: int | None = None
    committed: set[int] = field(default_factory=set)  # reservations: committed pages
    decommitting: dict[int, int] = field(default_factory=dict)  # page -> queued decommit (entry seq) still mapping it


@dataclass
class QueueEntry:
    """A deferred free: run once every fence is done (seed 000: *enter the
    EP/context deferred-free queue; wait for the related stream/fence to
    finish; allocator actually frees; update ... Governor charge*)."""

    seq: int
    what: str                  # description
    fences: list[tuple[int, int]]
    creator: int               # the mechanism that must free it (S1)
    refund: dict[str, int]     # holder -> bytes refunded when it runs
    physical: int              # physical bytes it frees
    owned: int | None = None   # Owned ref finished by this entry
    exact: bool = True         # the implementation queues exactly one release for it
    on_run: Any = None         # what else changes in the spec when it runs (a decommit's pages go)
    kv: Any = None             # KV request released by this entry (its creator is recorded there, S1)


@dataclass
class KvRequest:
    """A KvPageStore request: a stable reservation whose committed prefix grows."""

    name: str
    max_bytes: int
    creator: int
    own: int = 0               # bytes committed by growth (charged to the store)
    prefix: int = 0            # bytes mapped read-only from ``prefix_of`` (charged once, there)
    prefix_of: int | None = None   # the origin request's ref id
    sharers: dict[int, int] = field(default_factory=dict)  # sharer request -> its prefix bytes, until its release runs
    fences: list[tuple[int, int]] = field(default_factory=list)
    state: str = "open"        # open | closed (release queued) | released (private pages gone)
    #: the most bytes of it ever shared as a prefix (those pages stay read-only here)
    shared_upto: int = 0

    @property
    def committed(self) -> int:
        return self.own + self.prefix


@dataclass
class Weight:
    name: str
    pages: int
    hot: bool = True
    resident: bool = False
    owned: int | None = None


@dataclass
class SysState:
    capacity: int
    page: int
    virtual_backing: bool
    shared_mapping: bool
    registry: Registry
    #: physical bytes of the device (default: the Governor's capacity)
    device_capacity: int = 0
    #: the target mechanism's declared ``AllocatorGeometry`` (``None``: the
    #: spec's own strict page-rounded one)
    geometry: Any = None
    #: the replacement mechanism's (mechanism 1): the target's geometry when
    #: it brings that mechanism itself, ``None`` for the reference's
    replacement_geometry: Any = None
    next_ref: int = 1
    # -- Governor ledger: capacity == free + granted + charged (S11)
    free: int = 0
    granted: int = 0
    charged: int = 0
    charged_by: dict[str, int] = field(default_factory=dict)
    grants: dict[int, GrantRec] = field(default_factory=dict)
    leases: dict[int, LeaseRec] = field(default_factory=dict)
    open_grants: int = 0           # sum of open grants' bytes
    lease_bytes: dict[str, int] = field(default_factory=dict)  # unrefunded leases per holder
    tickets: dict[int, TicketRec] = field(default_factory=dict)
    tickets_held: int = 0          # sum of held over tickets
    tickets_received: int = 0
    tickets_returned: int = 0
    tickets_claimed: int = 0
    #: the Governor's configuration generation (``reconfigure`` bumps it; the
    #: pending tickets of an older generation fail)
    generation: int = 1
    stale_tickets: int = 0         # S15: a ticket of an older generation was answered or granted while pending
    clock: int = 0
    # -- EP
    streams: dict[int, Stream] = field(default_factory=dict)
    fences: dict[int, tuple[int, int]] = field(default_factory=dict)  # fence ref -> (stream ref, work item)
    queue: dict[int, QueueEntry] = field(default_factory=dict)
    queue_seq: int = 0
    inexact_entries: int = 0       # queued releases the implementation may split in pieces
    in_poll: bool = False
    # -- owned objects (owning allocations, weights, reservations)
    owned: dict[int, Owned] = field(default_factory=dict)
    live_allocs: "RefSet" = field(default_factory=lambda: RefSet())    # owning allocations, live
    dead_allocs: "RefSet" = field(default_factory=lambda: RefSet())    # owning allocations, closed
    reservations: "RefSet" = field(default_factory=lambda: RefSet())   # binding reservations, all
    grant_refs: "RefSet" = field(default_factory=lambda: RefSet())
    lease_refs: "RefSet" = field(default_factory=lambda: RefSet())
    ticket_refs: "RefSet" = field(default_factory=lambda: RefSet())
    live_bytes_by: dict[str, int] = field(default_factory=dict)    # charged footprints of live owned
    queued_bytes_by: dict[str, int] = field(default_factory=dict)  # refunds waiting in the queue
    physical_by: dict[str, int] = field(default_factory=dict)      # bytes installed for a holder
    live_objects: int = 0          # pins from owned objects + KV requests
    # -- holders
    weights: dict[str, Weight] = field(default_factory=dict)
    kv: dict[int, KvRequest] = field(default_factory=dict)
    # -- records the invariants read
    misreleased: int = 0           # S1: freed through a mechanism other than its creator
    stale_capabilities: int = 0    # S3
    premature_frees: int = 0       # S4: freed while a fence was incomplete
    governor_evictions: int = 0    # S6: data released by someone other than its holder
    hot_evictions: int = 0         # S6
    overclaims: int = 0            # S6: a holder reported bytes its releases did not refund
    frees_outside_poll: int = 0    # S7: a drop (or anything but the queue) freed
    moved_addresses: int = 0       # S12
    duplicate_identities: int = 0  # S14
    identities: set[Any] = field(default_factory=set)
    # witness support
    w_generation: int = 1
    w_next_address: int = 1 << 40
    w_next_identity: int = 1

    def has(self, capability: str) -> bool:
        if capability == "virtual_backing":
            return self.virtual_backing
        if capability == "shared_mapping":
            return self.shared_mapping
        return capability == "ep"


def new_ref(state: MechState | SysState) -> int:
    """A fresh spec reference id (never reused)."""
    r = state.next_ref
    state.next_ref += 1
    return r


def add(d: dict[str, int], key: str, n: int) -> None:
    d[key] = d.get(key, 0) + n


class RefSet:
    """Reference ids with O(1) add, remove and pick-by-index (so drawing a
    live handle costs the same at 10 or 10,000 live objects)."""

    __slots__ = ("items", "pos")

    def __init__(self) -> None:
        self.items: list[int] = []
        self.pos: dict[int, int] = {}

    def add(self, ref: int) -> None:
        if ref not in self.pos:
            self.pos[ref] = len(self.items)
            self.items.append(ref)

    def discard(self, ref: int) -> None:
        i = self.pos.pop(ref, None)
        if i is None:
            return
        last = self.items.pop()
        if i < len(self.items):
            self.items[i] = last
            self.pos[last] = i

    def __contains__(self, ref: object) -> bool:
        return ref in self.pos

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(list(self.items))

    def at(self, i: int) -> int:
        return self.items[i]


# --------------------------------------------------------------------------
# Small helpers the role modules share
# --------------------------------------------------------------------------


def oom_rule(state: Any, need: int) -> tuple[bool, bool]:
    """Page-granular physical requests (commit, create, copy-on-write):
    ``(may succeed, may raise OutOfMemory)``.  Success needs the bytes to fit
    what the mechanism holds; OutOfMemory is allowed only at physical
    exhaustion (counting what a twin on the same device may hold), never
    from fragmentation."""
    may_return = state.physical + need <= state.capacity
    may_oom = state.physical + state.foreign_bytes + need > state.capacity
    return may_return, may_oom


def is_size(x: Any) -> bool:
    """A byte count a request may carry: a positive ``int`` (not ``bool``)."""
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def from_refs(describe: str, *sets: Any) -> Any:
    """A :class:`~memspec.spec.core.Domain` drawing one reference id from the
    first non-empty of ``sets(state)`` (each a getter returning a
    :class:`RefSet`), in O(1)."""
    from memspec.spec.core import Domain

    def draw(state: Any, chooser: Any) -> int:
        # the non-empty sets, by a loop (not a comprehension over a generator: no function
        # objects made per call; a harness draws several times a step)
        avail: list[RefSet] = []
        for g in sets:
            rs = g(state)
            if len(rs):
                avail.append(rs)
        rs = avail[chooser.integer(0, len(avail) - 1)] if len(avail) > 1 else avail[0]
        return rs.at(chooser.integer(0, len(rs) - 1))

    def available(state: Any) -> bool:
        for g in sets:
            if len(g(state)):
                return True
        return False

    return Domain(describe, draw, available)


def witness_identity(state: Any, creator: str = "spec") -> Any:
    """A never-reused identity for a spec-only witness value."""
    from memspec.spec.api import Identity

    n = state.w_next_identity
    state.w_next_identity += 1
    return Identity(creator, n)


def remember_identity(state: Any, identity: Any) -> None:
    """Record an identity a handle was issued with (S14: never reused)."""
    if identity in state.identities:
        state.duplicate_identities += 1
    state.identities.add(identity)
