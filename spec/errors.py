"""Errors of the memspec contract: one class per meaning.

Seed 000, "no silent no-ops": *when a capability is unsupported, return an
explicit absence or error rather than a successful no-op.*  Every way an
operation can refuse is therefore a distinct exception class here, so that a
conformance harness can tell "refused for the right reason" from "refused for
some reason".  Implementations raise these; the spec predicts them.

Implementations (``reference/``, ``cuda_impl/``, plugins) may import this
module and :mod:`memspec.spec.api`, nothing else from the spec.
"""

from __future__ import annotations


class MemspecError(Exception):
    """Base of every error the contract defines."""


class InvalidRequest(MemspecError, ValueError):
    """A request that no implementation could honour: size <= 0, a size that
    is not an ``int``, an alignment that is not a power of two, an unknown
    holder, a ticket or grant in the wrong state for the call."""


class InvalidRange(MemspecError, ValueError):
    """A byte range that is misaligned to the granularity, empty, reversed,
    past the end of its reservation, or (for ``commit``/``map``) already
    backed."""


class OutOfMemory(MemspecError, MemoryError):
    """Physical capacity is not available for the request.

    Seed 003, "the real OOM": *"out of memory" almost never means out of bytes;
    it means out of contiguous, policy-satisfiable memory.*  The diagnosis
    figures are attributes so tools (``memspec oom explain``) can read them
    without parsing the message. Unknown figures are ``None``.
    """

    def __init__(
        self,
        message: str = "out of memory",
        *,
        requested: int | None = None,
        total_capacity: int | None = None,
        free: int | None = None,
        allocated: int | None = None,
        reserved: int | None = None,
        reserved_unallocated: int | None = None,
        largest_free_block: int | None = None,
        device: int = 0,
    ) -> None:
        super().__init__(message)
        self.requested = requested
        self.total_capacity = total_capacity
        self.free = free
        self.allocated = allocated
        self.reserved = reserved
        self.reserved_unallocated = reserved_unallocated
        self.largest_free_block = largest_free_block
        self.device = device


class GrantDenied(MemspecError):
    """The Governor cannot approve a provisional grant: approving it would
    exceed the authority's capacity.  Distinct from :class:`OutOfMemory`
    (the device itself had no memory): this is a budget refusal."""


class Unsupported(MemspecError, NotImplementedError):
    """The mechanism explicitly does not provide this capability or call.

    Seed 000: *unsupported must not masquerade as a successful no-op.*"""


class ForeignAllocation(MemspecError):
    """The handle was created by another mechanism, allocator or context.

    Seed 000: *an allocation may only be released by the mechanism/context
    that created it.*"""


class DoubleFree(MemspecError):
    """The handle was already released (or its release is already queued)."""


class StaleHandle(MemspecError):
    """The handle's identity (creator + generation) is no longer live, even if
    its address was reused by a newer allocation."""


class ReadOnlyViolation(MemspecError):
    """A write through a read-only mapping of shared physical pages."""


class ContextBusy(MemspecError):
    """A provider context cannot be destroyed: allocations or queued releases
    made in it are still alive (seed 000, "the context is not destroyed while
    an allocation is still alive")."""


class NotRegistered(MemspecError, LookupError):
    """A mechanism, context, authority or device that the manager does not
    know (or no longer knows)."""


class InvalidTicket(MemspecError):
    """A pressure-ticket call made in a state that does not allow it (claiming
    a cancelled ticket, responding to a terminal one, a stale generation)."""


class DeviceFault(MemspecError):
    """An access by device work (copy or kernel) to an unmapped, freed or
    read-only page.  On the simulated device and the host driver emulator this
    is recorded and raised instead of crashing the process."""

    def __init__(self, message: str, *, address: int | None = None, kind: str = "fault") -> None:
        super().__init__(message)
        self.address = address
        self.kind = kind


#: Every error class of the contract, by name (used by reports and the spec).
ALL_ERRORS: dict[str, type[MemspecError]] = {
    cls.__name__: cls
    for cls in (
        InvalidRequest,
        InvalidRange,
        OutOfMemory,
        GrantDenied,
        Unsupported,
        ForeignAllocation,
        DoubleFree,
        StaleHandle,
        ReadOnlyViolation,
        ContextBusy,
        NotRegistered,
        InvalidTicket,
        DeviceFault,
    )
}
