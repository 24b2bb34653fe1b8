"""The memspec contract: what a plugin implements, in the seed's vocabulary.

Seed 000, in one sentence: *Allocator answers "how to obtain ordinary memory",
VirtualBacking answers "when to install real memory behind an address", and
SharedMapping answers "how multiple addresses share physical memory"; the
Governor keeps the accounts, the Holder chooses what to evict, the EP keeps
device operations correctly ordered, and the ProcessMemoryManager wires these
roles together safely.*

This module holds only types: handles, requests, and ``Protocol`` classes for
each role.  Implementations (``memspec.reference``, ``memspec.cuda_impl``,
third-party plugins) import this module and :mod:`memspec.spec.errors` and
nothing else of the spec, so that checking them against the spec's model is a
comparison of two independent things.

Changes from the seed's Rust sketch (kept deliberately small):

* ``commit_range``/``decommit_range`` take ``start, end`` byte offsets into
  the reservation (Rust ``Range<u64>``) and return the bytes newly committed /
  actually released instead of ``CommitResult``/``DecommitResult``.
* ``VirtualBacking.release`` ends a reservation; ``SharedMapping.reserve`` lets
  a mechanism that shares pages without general VMM still provide addresses.
* Handles carry an :class:`Identity` (creator + generation), never derived
  from the address and never reused, so a stale handle is rejected even when
  its address was recycled.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, runtime_checkable

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

#: Default page (granularity) of device mappings: seed 003, "pages are 64 KiB
#: and 2 MiB"; VMM granularity is 2 MiB on current GPUs.
DEFAULT_PAGE = 2 * MiB


# --------------------------------------------------------------------------
# Identities
# --------------------------------------------------------------------------

@dataclass(frozen=True, order=True)
class Identity:
    """Who made a handle, and which of its makings this is.

    ``creator`` names one mechanism (or role) instance; ``generation`` counts
    that creator's handles from 1 and is never reused.  Two handles are the
    same handle iff their identities are equal, whatever their addresses.
    """

    creator: str
    generation: int

    def __str__(self) -> str:
        return f"{self.creator}#{self.generation}"


_creator_serial = itertools.count(1)
_creator_lock = threading.Lock()


def new_creator_id(kind: str) -> str:
    """A process-unique creator name such as ``"reference-eager/3"``."""
    with _creator_lock:
        return f"{kind}/{next(_creator_serial)}"


class IdentitySource:
    """Thread-safe generator of never-reused identities for one creator."""

    def __init__(self, kind: str) -> None:
        self.creator = new_creator_id(kind)
        self._next = itertools.count(1)
        self._lock = threading.Lock()

    def new(self) -> Identity:
        with self._lock:
            return Identity(self.creator, next(self._next))


@dataclass(frozen=True)
class DeviceKey:
    """A device: its driver kind (``"sim"``, ``"cuda"``, ``"cuda-host"``) and ordinal."""

    kind: str
    ordinal: int = 0

    def __str__(self) -> str:
        return f"{self.kind}:{self.ordinal}"


# --------------------------------------------------------------------------
# Requests and handles
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class AllocationRequest:
    """Ask for ``size`` bytes aligned to ``alignment`` (a power of two).

    Validation is the allocator's job: a size that is not a positive ``int``
    must raise :class:`~memspec.spec.errors.InvalidRequest`.
    """

    size: int
    alignment: int = 256


@dataclass(frozen=True)
class ReserveRequest:
    """Reserve ``size`` bytes of virtual address space (no physical pages)."""

    size: int
    alignment: int = 0


@dataclass(frozen=True, eq=False)
class DeviceAllocation:
    """An ordinary allocation. Seed 000: *DeviceAllocation is an owning handle.
    It must remember, or indirectly reference: the allocator that created it;
    the corresponding device and provider context; ...*

    ``size`` is what was requested, ``footprint`` the physical bytes actually
    taken (``footprint >= size``).  Equality is identity.
    """

    address: int
    size: int
    footprint: int
    identity: Identity
    device: DeviceKey
    #: where the allocator's block for this allocation starts, when it is
    #: not ``address`` (an in-band header, or padding taken to align the
    #: start): the footprint is then the bytes ``[block, block + footprint)``
    #: and overlap is judged on them.  ``None``: the block starts at ``address``
    #: (its footprint may still run past ``size``: rounding, alignment padding)
    block: int | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceAllocation) and other.identity == self.identity

    def __hash__(self) -> int:
        return hash(self.identity)


# --------------------------------------------------------------------------
# Geometry: how an allocator packs memory (declared, not demanded)
# --------------------------------------------------------------------------

#: the footprint rules a :class:`FootprintBound` may name
ROUNDINGS = ("unit", "pow2", "classes")


def _is_count(v: object, *, positive: bool = False) -> bool:
    return type(v) is int and (v > 0 if positive else v >= 0)


@dataclass(frozen=True)
class FootprintBound:
    """The most footprint an allocator takes for a request: its packing
    policy, declared so that the suite can hold it to it.

    The most footprint for ``size`` bytes aligned to ``alignment`` is, by
    ``rounding``:

    * ``"unit"`` -- ``size + header`` rounded up to the geometry's unit
      (page-granular allocators, bump and slab allocators with one granule);
    * ``"pow2"`` -- the next power of two >= ``max(size + header, min_class)``
      (buddy allocators, power-of-two size classes);
    * ``"classes"`` -- the smallest of ``classes`` (ascending) >= ``size +
      header``; beyond the last, ``size + header`` rounded up to the unit;

    with ``next_class=True`` one class more (good-fit allocators, TLSF: a
    request is served from a free block of the next class up); then, for an
    alignment above the geometry's own ``alignment``, plus the ``alignment -
    unit`` bytes an allocator may take to find an aligned start; then
    rounded up to the unit.  ``fn(size, alignment) -> int``, when given,
    replaces all of it.

    A bound is a promise with two sides: a footprint above it is a FAIL, and
    so is an OutOfMemory on an empty device for a request whose bound fits
    the capacity less the declared overhead.
    """

    rounding: str = "unit"
    header: int = 0
    min_class: int = 0
    classes: tuple[int, ...] = ()
    next_class: bool = False
    fn: Callable[[int, int], int] | None = None

    def __post_init__(self) -> None:
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"FootprintBound.rounding is {self.rounding!r}: one of {', '.join(ROUNDINGS)}")
        if not _is_count(self.header):
            raise ValueError(f"FootprintBound.header must be an int >= 0, not {self.header!r}")
        if not _is_count(self.min_class):
            raise ValueError(f"FootprintBound.min_class must be an int >= 0, not {self.min_class!r}")
        cls = tuple(self.classes)
        if any(not _is_count(c, positive=True) for c in cls) or list(cls) != sorted(set(cls)):
            raise ValueError(f"FootprintBound.classes must be ascending positive ints, not {self.classes!r}")
        if self.rounding == "classes" and not cls:
            raise ValueError("FootprintBound(rounding='classes') needs its classes")
        if self.fn is not None and not callable(self.fn):
            raise ValueError("FootprintBound.fn must be callable: fn(size, alignment) -> most footprint")
        object.__setattr__(self, "classes", cls)


@dataclass(frozen=True)
class AllocatorGeometry:
    """How a :class:`DeviceAllocator` packs memory, as its target declares it
    (``TargetInstance.geometry``; C plugins: ``memspec_geometry``).

    Seed 000 requires of every allocator that the footprint is at least the
    request and is *the real allocated bytes* (*act on the real allocated
    bytes; do not silently keep incorrect accounts*); how it rounds, aligns
    and pads is its own business.  What it declares here, the suite holds it
    to; what it leaves undeclared is measured and reported as a quality
    figure, never a FAIL.

    * ``unit`` -- the allocation unit (granule), in bytes: the bytes from an
      allocation's address that are its own are its size rounded up to the
      unit, no more than its footprint (1: just its size).
    * ``alignment`` -- every address is aligned to this, whatever the
      request asks (a request's own alignment is always honoured).
    * ``bound`` -- the most footprint for a request (:class:`FootprintBound`);
      ``None``: undeclared (footprint above the request, and refusals while
      the device had room, are quality figures).
    * ``overhead`` -- bytes of the capacity the allocator keeps for itself
      (metadata, slabs, extent padding): ``physical_bytes()`` may exceed the
      live footprints by up to this much, and an empty device offers the
      capacity less this much.  ``None``: undeclared (measured: the probe
      must show at least the live footprints, and the excess is reported).
    """

    unit: int = 1
    alignment: int = 1
    bound: FootprintBound | None = None
    overhead: int | None = None
    #: the largest alignment a request may ask (an API with no per-allocation
    #: alignment, e.g. cuda.core's ``addr_align`` fixed per resource): a
    #: request above it may be refused with InvalidRequest.  ``None``: every
    #: power of two is honoured
    max_alignment: int | None = None

    def __post_init__(self) -> None:
        if not _is_count(self.unit, positive=True):
            raise ValueError(f"AllocatorGeometry.unit must be a positive int, not {self.unit!r}")
        if not (_is_count(self.alignment, positive=True) and self.alignment & (self.alignment - 1) == 0):
            raise ValueError(f"AllocatorGeometry.alignment must be a power of two, not {self.alignment!r}")
        if self.bound is not None and not isinstance(self.bound, FootprintBound):
            raise ValueError(f"AllocatorGeometry.bound must be a FootprintBound or None, not {type(self.bound).__name__}")
        if self.overhead is not None and not _is_count(self.overhead):
            raise ValueError(f"AllocatorGeometry.overhead must be an int >= 0 or None, not {self.overhead!r}")
        m = self.max_alignment
        if m is not None and not (_is_count(m, positive=True) and m & (m - 1) == 0 and m >= self.alignment):
            raise ValueError(f"AllocatorGeometry.max_alignment must be a power of two >= alignment, or None, not {m!r}")

    @classmethod
    def page_rounded(cls, page: int, alignment: int = 256) -> "AllocatorGeometry":
        """The strict geometry of a page-granular eager allocator with no
        metadata of its own on the device (memspec's own allocators): the
        footprint at most the request rounded up to the page (plus
        ``alignment - page`` for an alignment above the page), addresses
        aligned to ``alignment``, physical bytes exactly the live footprints."""
        return cls(unit=page, alignment=alignment, bound=FootprintBound("unit"), overhead=0)


#: what the suite assumes of a target that declares nothing
UNDECLARED_GEOMETRY = AllocatorGeometry()


@dataclass(frozen=True, eq=False)
class VirtualAllocation:
    """A virtual-address reservation: ``size`` bytes at a stable ``address``.

    Seed 000: *The pointer stays the same, so tensor bindings or graph captures
    that depend on a stable address do not have to be rebuilt as the KV grows.*
    """

    address: int
    size: int
    identity: Identity
    device: DeviceKey

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VirtualAllocation) and other.identity == self.identity

    def __hash__(self) -> int:
        return hash(self.identity)


@dataclass(frozen=True, eq=False)
class PhysicalHandle:
    """Physical backing that may be mapped at several virtual addresses."""

    size: int
    identity: Identity
    device: DeviceKey

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PhysicalHandle) and other.identity == self.identity

    def __hash__(self) -> int:
        return hash(self.identity)


# --------------------------------------------------------------------------
# Mechanisms (what an allocator plugin implements)
# --------------------------------------------------------------------------

@runtime_checkable
class DeviceAllocator(Protocol):
    """Required. Seed 000: *Ordinary allocate/free mechanism*; not responsible
    for *budget and hot/cold data policy*."""

    def device(self) -> DeviceKey: ...

    def allocate(self, request: AllocationRequest) -> DeviceAllocation:
        """Take ``footprint >= request.size`` physical bytes now (eager).
        Raises InvalidRequest, OutOfMemory."""
        ...

    def deallocate(self, allocation: DeviceAllocation) -> int:
        """Free an allocation this allocator made; return the bytes actually
        freed (its footprint).  Raises ForeignAllocation, DoubleFree,
        StaleHandle."""
        ...


@runtime_checkable
class VirtualBacking(Protocol):
    """Optional. Seed 000: *reserve/map/unmap of physical backing*."""

    def granularity(self) -> int:
        """Page size of commits, in bytes (a power of two)."""
        ...

    def reserve(self, request: ReserveRequest) -> VirtualAllocation:
        """Reserve VA rounded up to the granularity; takes no physical bytes."""
        ...

    def commit_range(self, allocation: VirtualAllocation, start: int, end: int) -> int:
        """Install physical pages behind ``[start, end)`` (offsets, page
        aligned).  Return the bytes newly committed, which must be exactly
        ``end - start`` (seed 000: no successful no-ops).  Raises InvalidRange
        (misaligned, outside, already committed), OutOfMemory, StaleHandle,
        ForeignAllocation.  On error nothing stays committed."""
        ...

    def decommit_range(self, allocation: VirtualAllocation, start: int, end: int) -> int:
        """Remove backing from ``[start, end)`` (must be committed); keep the
        address. Return the bytes actually released."""
        ...

    def committed_bytes(self, allocation: VirtualAllocation) -> int: ...

    def release(self, allocation: VirtualAllocation) -> int:
        """End the reservation; decommit what is left. Return physical bytes released."""
        ...


@runtime_checkable
class SharedMapping(Protocol):
    """Optional. Seed 000: *This requires a physical handle, multi-address
    mapping, reference counting, read-only protection, and possibly
    Copy-on-Write.*"""

    def granularity(self) -> int: ...

    def reserve(self, request: ReserveRequest) -> VirtualAllocation:
        """VA to map shared handles into (a mechanism that also provides
        VirtualBacking must accept either's reservations)."""
        ...

    def free_reservation(self, allocation: VirtualAllocation) -> None:
        """End a reservation made by :meth:`reserve`; it must be unmapped."""
        ...

    def create(self, size: int) -> PhysicalHandle:
        """Physical pages (size a multiple of the granularity). Raises OutOfMemory."""
        ...

    def map(self, handle: PhysicalHandle, allocation: VirtualAllocation, offset: int, *, read_only: bool) -> int:
        """Map the whole handle at ``allocation.address + offset``; return the
        bytes mapped.  Raises InvalidRange if any page there is backed."""
        ...

    def unmap(self, allocation: VirtualAllocation, offset: int, size: int) -> int:
        """Remove a mapping made by :meth:`map` (the whole of it)."""
        ...

    def copy_on_write(self, allocation: VirtualAllocation, offset: int, size: int) -> int:
        """Replace the shared pages mapped at ``[offset, offset+size)`` by
        private writable copies with the same bytes; return the private bytes
        newly committed."""
        ...

    def mapping_count(self, handle: PhysicalHandle) -> int:
        """Number of live mappings of ``handle`` (its reference count minus the handle itself)."""
        ...

    def release(self, handle: PhysicalHandle) -> int:
        """Drop the creator's reference. Physical bytes are freed once no
        mapping remains; return the bytes freed now (0 while still mapped)."""
        ...


@runtime_checkable
class DeviceMemoryMechanism(Protocol):
    """A bundle of capabilities, negotiated explicitly (seed 000):

    *let Some(backing) = mechanism.virtual_backing() else { return
    use_eager_allocation_path(); };*
    """

    name: str

    def allocator(self) -> DeviceAllocator: ...

    def virtual_backing(self) -> VirtualBacking | None:
        """``None`` means explicitly absent. Never a stub that returns success."""
        ...

    def shared_mapping(self) -> SharedMapping | None: ...


# --------------------------------------------------------------------------
# Execution provider (device ordering)
# --------------------------------------------------------------------------

@dataclass(frozen=True, order=True)
class Fence:
    """Completes when ``stream`` has executed its work up to ``value``.
    Seed 000: *A synchronization object indicating whether prior
    asynchronous device work has completed.*"""

    stream: int
    value: int


@runtime_checkable
class ExecutionProvider(Protocol):
    """Seed 000: *device context, stream, copy, kernel, fence, release
    ordering*; not *global capacity policy*.

    Work is asynchronous: ``write``/``launch`` enqueue and return a fence.
    ``read`` waits for its own copy (and what precedes it on the stream).
    The deferred-free queue (``defer``/``poll``) never blocks and never frees
    before the given fences have completed.
    """

    context_id: str

    def device(self) -> DeviceKey: ...

    def new_stream(self) -> int: ...

    def write(self, stream: int, address: int, data: bytes) -> Fence:
        """Enqueue a host-to-device copy."""
        ...

    def read(self, stream: int, address: int, size: int) -> bytes:
        """Device-to-host copy ordered after the stream's queued work; waits."""
        ...

    def launch(self, stream: int, reads: Sequence[tuple[int, int]], writes: Sequence[tuple[int, int]]) -> Fence:
        """Enqueue a stand-in kernel reading/writing ``(address, size)`` ranges."""
        ...

    def fence_done(self, fence: Fence) -> bool: ...

    def synchronize(self, stream: int | None = None) -> None:
        """Let the device run the stream's (or every stream's) queued work."""
        ...

    def defer(self, fences: Sequence[Fence], release: Callable[[], object]) -> None:
        """Deferred free: run ``release`` once every fence is done; never now
        on the caller's thread unless they already are done."""
        ...

    def poll(self) -> int:
        """Run the queued releases whose fences are done; return how many ran."""
        ...

    def pending_releases(self) -> int: ...


# --------------------------------------------------------------------------
# Accounting roles
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Grant:
    """A provisional grant: capacity set aside for ``holder``, not yet charged."""

    grant_id: int
    holder: str
    nbytes: int


@dataclass(frozen=True)
class Lease:
    """Seed 000 glossary: *A record of capacity ownership already committed to a holder.*"""

    lease_id: int
    holder: str
    nbytes: int


class TicketState:
    PENDING = "pending"      # issued, holders are being asked
    GRANTED = "granted"      # enough was released; the ticket holds the bytes
    CLAIMED = "claimed"      # the requester took the bytes as a grant (terminal)
    CANCELLED = "cancelled"  # terminal; bytes (if granted) returned exactly once
    TIMED_OUT = "timed_out"  # terminal; as cancelled
    FAILED = "failed"        # terminal; stale generation
    TERMINAL = frozenset({"claimed", "cancelled", "timed_out", "failed"})


@dataclass
class Ticket:
    """Seed 000: *pressure ticket: try to free 1 GB, priority = ..., deadline = ...*"""

    ticket_id: int
    requester: str
    amount: int
    priority: int
    deadline: int
    generation: int
    state: str = TicketState.PENDING
    held: int = 0          # bytes the ticket holds (only while GRANTED)
    released: dict[str, int] = field(default_factory=dict)  # holder -> bytes it released


@runtime_checkable
class Governor(Protocol):
    """Seed 000: *Capacity approval, reservation, lease, pressure ticket*;
    not *deleting a holder's data directly*.

    Ledger: ``capacity == free + granted + charged`` at all times.
    """

    def capacity(self) -> int: ...
    def free(self) -> int: ...
    def granted(self) -> int: ...
    def charged(self, holder: str | None = None) -> int: ...

    def reserve(self, holder: str, nbytes: int) -> Grant:
        """Provisional grant. Raises GrantDenied, InvalidRequest."""
        ...

    def commit(self, grant: Grant, actual: int) -> Lease:
        """Turn a grant into a charge of the *actual* bytes (seed: *act on the
        real allocated bytes*); the difference is returned or taken."""
        ...

    def cancel(self, grant: Grant) -> int:
        """Return a provisional grant (failed allocation). Returns its bytes."""
        ...

    def refund(self, lease: Lease) -> int:
        """Release a charge after the physical bytes were freed."""
        ...

    def issue_ticket(self, requester: str, amount: int, priority: int = 0, deadline: int = 0) -> Ticket: ...
    def respond(self, ticket: Ticket, holder: str, released: int) -> Ticket: ...
    def claim(self, ticket: Ticket) -> Grant: ...
    def cancel_ticket(self, ticket: Ticket) -> int: ...
    def expire(self, now: int) -> list[Ticket]: ...

    def reconfigure(self) -> int:
        """The configuration changes: a new generation (returned); every ticket
        still pending from an older generation fails, its bytes returned once."""
        ...


@runtime_checkable
class Holder(Protocol):
    """Seed 000: *Understanding what the data means and choosing a safe
    victim*.  Only holders release; 0 is a valid answer."""

    name: str

    def on_pressure(self, ticket: Ticket) -> int:
        """Release what can be released safely; return the bytes released (may be 0)."""
        ...


# --------------------------------------------------------------------------
# Wiring roles: manager, binding, owning handles, holders
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Capabilities:
    """A capability answer for the mechanism installed *now* on a device.

    Seed 000: *a capability query must not return a stale allocator snapshot.*
    """

    device: DeviceKey
    mechanism_id: str
    generation: int
    virtual_backing: bool
    shared_mapping: bool


@runtime_checkable
class OwningAllocation(Protocol):
    """An owning handle. Seed 000: *Drop should be responsible for enqueuing,
    not for synchronizing the whole GPU on an arbitrary thread or freeing
    immediately.*  ``close()`` (or ``with``, or garbage collection) enqueues
    the release on the EP's deferred-free queue, guarded by every fence
    recorded with :meth:`use`; the queue later frees and refunds."""

    allocation: DeviceAllocation
    holder: str
    mechanism_id: str
    context_id: str

    def use(self, fence: Fence) -> None:
        """Record that submitted device work (completing at ``fence``) uses this allocation."""
        ...

    def close(self) -> None:
        """Drop: enqueue the release. A second close raises DoubleFree."""
        ...

    @property
    def closed(self) -> bool: ...


@runtime_checkable
class OwningReservation(Protocol):
    """A holder's virtual reservation with its committed (charged) prefix."""

    allocation: VirtualAllocation
    holder: str
    mechanism_id: str
    context_id: str

    def committed(self) -> int: ...
    def use(self, fence: Fence) -> None: ...
    def close(self) -> None: ...

    @property
    def closed(self) -> bool: ...


@runtime_checkable
class MemoryBinding(Protocol):
    """Seed 000: *The binding ties together the correct device, mechanism,
    context, authority, capabilities and lifetime.*  It runs the ordinary
    allocation transaction (reserve grant -> allocate -> commit charge at the
    actual footprint; cancel the grant on failure) and hands out owning handles."""

    device: DeviceKey
    context_id: str
    authority_id: str

    def capabilities(self) -> Capabilities: ...

    def allocate(self, holder: str, size: int) -> OwningAllocation: ...

    def reserve(self, holder: str, size: int) -> OwningReservation:
        """Reserve VA through the installed mechanism's VirtualBacking (Unsupported if absent)."""
        ...

    def commit(self, reservation: OwningReservation, start: int, end: int) -> int:
        """Charge-then-commit ``[start, end)``: grant, ``commit_range``, charge;
        on failure roll back the mapping and return the grant."""
        ...

    def decommit(self, reservation: OwningReservation, start: int, end: int) -> int:
        """Decommit ``[start, end)`` (deferred behind the reservation's fences) and refund."""
        ...


@runtime_checkable
class ProcessMemoryManager(Protocol):
    """Seed 000: *Registration, mechanism selection, authority,
    provider/context lifetime*; not *deciding which weight or KV page to evict*,
    and it *selects the allocator but does not duplicate the EP's
    stream/context responsibilities*."""

    def register_mechanism(self, device: DeviceKey, mechanism: DeviceMemoryMechanism) -> str: ...
    def register_context(self, ep: ExecutionProvider) -> str: ...
    def register_authority(self, governor: Governor) -> str: ...

    def select(self, device: DeviceKey, mechanism_id: str) -> int:
        """Install a mechanism on the device; return its generation (a replacement bumps it)."""
        ...

    def capabilities(self, device: DeviceKey) -> Capabilities: ...

    def bind(self, device: DeviceKey, context_id: str, authority_id: str) -> MemoryBinding: ...

    def pins(self, context_id: str) -> int:
        """Live allocations + queued releases made in the context."""
        ...

    def destroy_context(self, context_id: str) -> None:
        """Raises ContextBusy while pinned."""
        ...


@runtime_checkable
class ModelResidencyHolder(Protocol):
    """Seed 000: *ModelResidency: two cold weights can free 700 MB.*

    Optional: ``address(weight) -> int | None`` -- where a loaded weight's
    bytes are now (``None``: not loaded).  A holder that has it gets its
    weights' data checked (written, and read back while resident).
    Optional: ``footprint(weight) -> int | None`` -- the real footprint of a
    loaded weight: the spec charges that (without it, the bytes asked for)."""

    name: str

    def load(self, weight: str, size: int, *, hot: bool) -> None:
        """Allocate a weight through the binding (charged to this holder)."""
        ...

    def set_hot(self, weight: str, hot: bool) -> None: ...
    def unload(self, weight: str) -> None: ...
    def resident_bytes(self) -> int: ...
    def on_pressure(self, ticket: Ticket) -> int: ...


@runtime_checkable
class KvPageStoreHolder(Protocol):
    """Seed 000: *KvPageStore: all pages are in use by in-flight kernels, can
    free only 0.*  Grows a request's KV by the 6-step transaction.

    Optional: ``address(request) -> int | None`` -- the stable address of an
    open request's KV (``None``: not open).  A store that has it gets its
    pages' data checked (earlier pages survive growth; a shared prefix reads
    the same through the origin and the sharer and refuses writes)."""

    name: str

    def open(self, request: str, max_bytes: int, *, prefix_of: str | None = None, prefix_bytes: int = 0) -> None:
        """Reserve ``max_bytes`` of VA for a request; optionally map the first
        ``prefix_bytes`` read-only from ``prefix_of``'s physical pages."""
        ...

    def grow(self, request: str, new_bytes: int, *, fail_at: int | None = None) -> int:
        """Grow the request's committed KV to ``new_bytes`` (page rounded).
        ``fail_at`` in {4, 5} injects a failure at that step; the store must
        roll back (seed 000 steps 1-6) and re-raise. Returns bytes newly committed."""
        ...

    def committed(self, request: str) -> int: ...
    def use(self, request: str, fence: Fence) -> None: ...
    def close(self, request: str) -> None: ...
    def on_pressure(self, ticket: Ticket) -> int: ...


@runtime_checkable
class SystemUnderTest(Protocol):
    """What a harness hands to the spec's system-level ``perform`` functions:
    the roles of seed 000 wired around a target's mechanism.  ``ref(id)``
    returns the implementation object the harness bound to spec reference
    ``id`` (an owning handle, a reservation, a ticket...)."""

    manager: ProcessMemoryManager
    governor: Governor
    ep: ExecutionProvider
    binding: MemoryBinding
    weights: ModelResidencyHolder
    kv: KvPageStoreHolder
    device: DeviceKey
    mechanism_ids: list[str]   # registered mechanisms; [0] is selected first
    context_id: str
    authority_id: str

    def ref(self, ref_id: int) -> object: ...


@runtime_checkable
class MechanismUnderTest(Protocol):
    """What a harness hands to the spec's mechanism-level ``perform``
    functions: the target's mechanism, a second independent instance of it
    (the source of *foreign* handles), its EP if any, and ``ref(id)``."""

    mechanism: DeviceMemoryMechanism
    foreign: DeviceMemoryMechanism
    ep: ExecutionProvider | None

    def ref(self, ref_id: int) -> object: ...


# --------------------------------------------------------------------------
# The caching allocator (seed 003)
# --------------------------------------------------------------------------

@runtime_checkable
class CachingBlockHandle(Protocol):
    """What a caching allocator's ``malloc`` returns: the block's ``address``
    and ``size`` (after rounding and the split decision), the
    ``requested_size`` and the ``stream`` it was allocated on."""

    address: int
    size: int
    requested_size: int
    stream: int


@runtime_checkable
class CachingAllocator(Protocol):
    """Seed 003: *PyTorch layers a caching allocator on top [of cudaMalloc]
    -- module 01 ch19's segregated-fit, replayed.*  The interface the
    ``CACHING`` spec machine drives (``TargetInstance.kind == "caching"``,
    ``TargetInstance.allocator``); names follow ``torch.cuda``."""

    def malloc(self, size: int, stream: int = 0) -> CachingBlockHandle:
        """Raises InvalidRequest, OutOfMemory (with the diagnosis figures)."""
        ...

    def free(self, block: CachingBlockHandle) -> None:
        """Raises DoubleFree, ForeignAllocation. Deferred on events when the
        block was recorded on other streams."""
        ...

    def record_stream(self, block: CachingBlockHandle, stream: int) -> None: ...

    def complete_stream(self, stream: int) -> None:
        """Test control: the work queued so far on ``stream`` has completed."""
        ...

    def synchronize(self) -> None: ...

    def empty_cache(self) -> int:
        """Release fully-free segments (and whole free pages of expandable
        segments); return the bytes released."""
        ...

    def memory_stats(self) -> dict[str, int]:
        """``torch.cuda.memory_stats()`` keys and semantics."""
        ...

    def memory_summary(self) -> str: ...

    def snapshot(self) -> dict:
        """``torch.cuda.memory._snapshot()`` structure."""
        ...


# --------------------------------------------------------------------------
# Targets (what `memspec conform` runs against)
# --------------------------------------------------------------------------

#: The levels a target can be checked at (see ``memspec.invariants.levels``):
#: ``"mechanism"`` and ``"system"`` for a seed-000 mechanism target,
#: ``"caching"`` for a seed-003 caching allocator.
TARGET_KINDS = ("mechanism", "caching")


@dataclass(frozen=True)
class CachingTarget:
    """What a caching-level target tells the harness about its allocator
    (``TargetInstance.caching``).  Every field is read once, when the run is
    planned; nothing here is called during a step.

    * ``policy`` -- the spec's policy the allocator claims to follow:
      ``"pytorch"`` (PyTorch 2.5's rounding, split and segment rules) or
      ``"seed"`` (seed 003's toy).  Required: the spec cannot predict block
      sizes without it.
    * ``expandable`` -- ``expandable_segments:True`` (segments grow by pages
      instead of new ``cudaMalloc`` calls).
    * ``streams`` -- how many streams the allocator accepts (``1``: only
      stream 0; the actions that need a second stream are then N/A).
    * ``record_stream`` -- the allocator implements ``record_stream`` (else
      the cross-stream invariants are N/A, "record_stream absent").
    * ``options`` -- further keyword arguments of the caching machine's
      ``init`` the allocator is configured with (e.g. ``max_split_size``);
      an unknown name is an error of the target, reported at planning.
    """

    policy: str
    expandable: bool = False
    streams: int = 2
    record_stream: bool = True
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SystemRoles:
    """Roles a system-level target brings itself (``TargetInstance.roles``).

    At the system level the harness wires seed 000's roles around the
    target's mechanism: *the ProcessMemoryManager wires these roles together
    safely*.  Every role left ``None`` is filled by the reference
    implementation; a role given here replaces the reference one, so an
    allocator project can put its own Governor, manager, binding or holders
    under the suite.  Each is a *factory*, called once per example in this
    order, with what the roles before it produced:

    * ``governor(capacity) -> Governor`` -- the authority;
    * ``manager() -> ProcessMemoryManager`` -- registry, selection, pins;
    * ``binding(manager, device, context_id, authority_id) -> MemoryBinding``
      -- default ``manager.bind(device, context_id, authority_id)``;
    * ``weights(binding) -> ModelResidencyHolder`` and
      ``kv(binding) -> KvPageStoreHolder`` -- the holders;
    * ``extra_mechanism() -> DeviceMemoryMechanism`` -- the eager-only
      mechanism registered second (the replacement ``select`` installs); it
      must live where the target's EP can copy to (default: a reference
      eager mechanism on a simulated device, which suits only a target
      without its own EP).

    The EP is ``TargetInstance.ep`` (a reference EP when absent).
    """

    governor: Callable[[int], "Governor"] | None = None
    manager: Callable[[], "ProcessMemoryManager"] | None = None
    binding: Callable[..., "MemoryBinding"] | None = None
    weights: Callable[["MemoryBinding"], "ModelResidencyHolder"] | None = None
    kv: Callable[["MemoryBinding"], "KvPageStoreHolder"] | None = None
    extra_mechanism: Callable[[], "DeviceMemoryMechanism"] | None = None

    def given(self) -> list[str]:
        """The names of the roles this target brings."""
        return [n for n in ("governor", "manager", "binding", "weights", "kv", "extra_mechanism")
                if getattr(self, n) is not None]


@dataclass
class TargetInstance:
    """A fresh system under test, made by a target factory
    (``factory(capacity=None) -> TargetInstance``).  The harness builds one
    per example and never shares it between examples.

    Every field the harness reads is here; of ``extras`` it reads only the
    keys of the former contract (:func:`adopt_legacy_extras`).

    * ``mechanism`` -- the :class:`DeviceMemoryMechanism` under test
      (required for ``kind="mechanism"``; for ``kind="caching"`` the
      mechanism the allocator draws its segments from, or ``None``).
    * ``ep`` -- the target's own :class:`ExecutionProvider`: the harness
      writes and reads back a pattern in every region a caller can see
      through its copies, and the system level uses it as the EP.  ``None``:
      the data checks and the actions that need an EP are N/A.
    * ``physical_bytes()`` -- the physical bytes the target holds right now
      (``cuMemGetInfo``, a simulated device's page count), independent of its
      own bookkeeping; compared after every mechanism-level step with what
      the spec says is installed.  ``None``: that observation is N/A.
    * ``capacity`` -- the device's bytes (the Governor's capacity at the
      system level, the OOM limit at the caching level).
    * ``close()`` -- tear everything down at the end of an example.
    * ``kind`` -- ``"mechanism"`` or ``"caching"`` (:data:`TARGET_KINDS`).
    * ``allocator`` -- for ``kind="caching"``: the :class:`CachingAllocator`.
    * ``caching`` -- for ``kind="caching"``: its :class:`CachingTarget`
      (policy, expandable segments, streams, ``record_stream``).
    * ``make_foreign()`` -- a second, independent mechanism of the same kind
      on the same device (its handles are *foreign* to ``mechanism``: the
      mechanism must refuse them).  ``None``: the harness calls the factory
      once more for the twin.
    * ``roles`` -- :class:`SystemRoles` the target brings at the system level.
    * ``device`` -- an object the reference roles may share with the target
      (the reference's ``SimDevice``); ``None`` for any other target.
    * ``geometry`` -- how the mechanism's :class:`DeviceAllocator` packs
      memory (:class:`AllocatorGeometry`): what it declares is checked, what
      it leaves out is measured.  ``None``: nothing declared.
    * ``extras`` -- anything else the target exposes to its own tests (the
      keys of the former untyped contract are still understood: see
      :func:`adopt_legacy_extras`).
    """

    mechanism: DeviceMemoryMechanism | None
    ep: ExecutionProvider | None = None
    physical_bytes: Callable[[], int] | None = None
    capacity: int | None = None
    close: Callable[[], None] | None = None
    kind: str = "mechanism"
    allocator: object | None = None
    caching: CachingTarget | None = None
    make_foreign: Callable[[], DeviceMemoryMechanism] | None = None
    roles: SystemRoles | None = None
    device: object | None = None
    extras: dict = field(default_factory=dict)
    geometry: AllocatorGeometry | None = None


def adopt_legacy_extras(instance: TargetInstance) -> TargetInstance:
    """Targets written against the former, untyped contract put these keys in
    ``extras``; each is moved into its typed field (when that is unset) and
    the instance returned.  ``make_foreign`` -> ``make_foreign``,
    ``make_extra_mechanism`` -> ``roles.extra_mechanism``, ``device`` ->
    ``device``, ``policy`` (+ ``expandable``) -> ``caching``."""
    ex = instance.extras or {}
    if not ex:
        return instance
    if instance.make_foreign is None and callable(ex.get("make_foreign")):
        instance.make_foreign = ex["make_foreign"]
    if callable(ex.get("make_extra_mechanism")):
        roles = instance.roles or SystemRoles()
        if roles.extra_mechanism is None:
            instance.roles = SystemRoles(**{**{n: getattr(roles, n) for n in roles.given()},
                                            "extra_mechanism": ex["make_extra_mechanism"]})
    if instance.device is None and ex.get("device") is not None:
        instance.device = ex["device"]
    if instance.caching is None and instance.kind == "caching" and isinstance(ex.get("policy"), str):
        instance.caching = CachingTarget(policy=ex["policy"], expandable=bool(ex.get("expandable", False)))
    return instance


#: A target factory: ``factory(capacity=None) -> TargetInstance``.
TargetFactory = Callable[..., TargetInstance]


def is_power_of_two(n: int) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0 and (n & (n - 1)) == 0
