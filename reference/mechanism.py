"""Mechanism bundles with honest capabilities.

Seed 000: *every mechanism only needs to implement the minimal
DeviceAllocator; only implementations that truly support address/backing
separation provide VirtualBacking; only implementations that truly support
physical-page sharing provide SharedMapping; when a capability is
unsupported, return an explicit absence or error rather than a successful
no-op.*

:class:`ReferenceMechanism` bundles an :class:`~.eager.EagerAllocator`
(always) with an optional :class:`~.vmm.ReferenceVirtualBacking` and an
optional :class:`~.shared.ReferenceSharedMapping` over one shared
reservation table.  An absent capability is ``None``, never a stub.
"""

from __future__ import annotations

from memspec.spec.api import DeviceAllocator, SharedMapping, VirtualBacking

from memspec.reference.device import SimDevice
from memspec.reference.eager import EagerAllocator
from memspec.reference.shared import ReferenceSharedMapping
from memspec.reference.vmm import ReferenceVirtualBacking, VaSpace


class ReferenceMechanism:
    """A ``DeviceMemoryMechanism`` on a :class:`SimDevice`.

    Each instance has its own creator identities: a handle made by one
    instance is *foreign* to every other, even on the same device.
    """

    def __init__(
        self,
        device: SimDevice,
        *,
        virtual_backing: bool = True,
        shared_mapping: bool = True,
        name: str = "reference",
    ) -> None:
        self.name = name
        self.sim = device
        self._alloc = EagerAllocator(device, kind=f"{name}-eager")
        self._space = VaSpace(device, name) if (virtual_backing or shared_mapping) else None
        self._vb = ReferenceVirtualBacking(self._space) if virtual_backing and self._space else None
        self._sm = ReferenceSharedMapping(self._space) if shared_mapping and self._space else None

    def allocator(self) -> DeviceAllocator:
        return self._alloc

    def virtual_backing(self) -> VirtualBacking | None:
        """``None``: this mechanism explicitly cannot separate address from backing."""
        return self._vb

    def shared_mapping(self) -> SharedMapping | None:
        """``None``: this mechanism explicitly cannot share physical pages."""
        return self._sm

    def __repr__(self) -> str:
        caps = [c for c, on in (("vmm", self._vb), ("shared", self._sm)) if on]
        return f"ReferenceMechanism({self.name!r}, eager{'+' if caps else ''}{'+'.join(caps)})"


def full(device: SimDevice, name: str = "reference") -> ReferenceMechanism:
    """Eager allocator + VirtualBacking + SharedMapping."""
    return ReferenceMechanism(device, name=name)


def eager_only(device: SimDevice, name: str = "reference-eager") -> ReferenceMechanism:
    """Eager allocator only: ``virtual_backing()`` and ``shared_mapping()`` answer ``None``."""
    return ReferenceMechanism(device, virtual_backing=False, shared_mapping=False, name=name)


def vmm_only(device: SimDevice, name: str = "reference-vmm") -> ReferenceMechanism:
    """Eager allocator + VirtualBacking; ``shared_mapping()`` answers ``None``."""
    return ReferenceMechanism(device, shared_mapping=False, name=name)
