"""The roles of seed 000 wired around one target's mechanism.

:func:`build_system` is what a harness hands to the spec's system-level
actions (``spec.api.SystemUnderTest``)::

    ProcessMemoryManager ── register / select / pin lifetime
    ├── Governor (one authority, capacity = the device's)
    ├── Execution Provider (the target's own if it has one, else a reference EP)
    └── MemoryBinding(device, mechanism installed now, context, authority)
            └── holders: ModelResidency ("weights"), KvPageStore ("kv")

``mechanism_ids[0]`` is the target's mechanism (selected first);
``mechanism_ids[1]`` is an extra eager-only reference mechanism on the same
device key, registered so replacement (``select``) can be exercised.
``other_context_id``/``other_binding`` are a second provider context on the
same device and authority, for context-destroy tests.

A target may bring any role itself (``TargetInstance.roles``, a
:class:`~memspec.spec.api.SystemRoles`); the reference fills the rest.
"""

from __future__ import annotations

from memspec.spec.api import DeviceKey, SystemRoles, TargetInstance

from memspec.reference.device import SimDevice
from memspec.reference.ep import ReferenceEP
from memspec.reference.governor import ReferenceGovernor
from memspec.reference.holders import KvPageStore, ModelResidency
from memspec.reference.manager import ReferenceBinding, ReferenceManager
from memspec.reference.mechanism import eager_only


class ReferenceSystem:
    """``SystemUnderTest``: manager, governor, ep, binding, holders, refs.

    Each role comes from ``instance.roles`` (:class:`~memspec.spec.api.SystemRoles`)
    when the target brings it, else from the reference."""

    def __init__(self, instance: TargetInstance, capacity: int | None = None) -> None:
        self.instance = instance
        roles = instance.roles or SystemRoles()
        mech = instance.mechanism
        self.device: DeviceKey = mech.allocator().device()
        sim = instance.device
        if not isinstance(sim, SimDevice):
            # a target with no simulated device: the reference roles still need one
            # for their own EP and the extra mechanism (same device key, detached memory)
            sim = SimDevice(capacity or instance.capacity or 256 << 20, key=self.device)
        self.sim = sim
        cap = capacity or instance.capacity or sim.capacity
        self.governor = roles.governor(cap) if roles.governor is not None else ReferenceGovernor(cap)
        self.ep = instance.ep if instance.ep is not None else ReferenceEP(sim)
        self.manager = roles.manager() if roles.manager is not None else ReferenceManager()
        # the replacement mechanism must live where the target's EP can reach it
        extra = roles.extra_mechanism() if roles.extra_mechanism is not None \
            else eager_only(sim, name="reference-extra")
        self.mechanism_ids = [
            self.manager.register_mechanism(self.device, mech),
            self.manager.register_mechanism(self.device, extra),
        ]
        self.manager.select(self.device, self.mechanism_ids[0])
        self.context_id = self.manager.register_context(self.ep)
        self.authority_id = self.manager.register_authority(self.governor)
        bind = roles.binding if roles.binding is not None else (lambda m, d, c, a: m.bind(d, c, a))
        self.binding = bind(self.manager, self.device, self.context_id, self.authority_id)
        self.other_ep = ReferenceEP(sim, name="reference-ep-other")
        self.other_context_id = self.manager.register_context(self.other_ep)
        self.other_binding = bind(self.manager, self.device, self.other_context_id, self.authority_id)
        self.weights = roles.weights(self.binding) if roles.weights is not None else ModelResidency(self.binding)
        self.kv = roles.kv(self.binding) if roles.kv is not None else KvPageStore(self.binding)
        self.refs: dict[int, object] = {}

    def ref(self, ref_id: int) -> object:
        """The implementation object bound to spec reference ``ref_id``."""
        return self.refs[ref_id]

    def drain(self) -> None:
        """Run all device work and every queued release, on both contexts."""
        for ep in (self.ep, self.other_ep):
            if hasattr(ep, "drain"):
                ep.drain()
            else:
                ep.synchronize()
                ep.poll()

    def close(self) -> None:
        if self.instance.close is not None:
            self.instance.close()


def build_system(instance: TargetInstance, *, capacity: int | None = None) -> ReferenceSystem:
    """Wire ``instance.mechanism`` into the roles ``instance.roles`` brings
    and the reference's for the others (see the module docstring)."""
    return ReferenceSystem(instance, capacity)
