"""A system-level target that brings its own Governor.

At the system level the harness wires seed 000's roles around the target's
mechanism.  A target may bring any of them through ``TargetInstance.roles``
(a :class:`~memspec.spec.api.SystemRoles` of factories); the reference fills
the others.  Here the mechanism, its EP and the device are the reference's
(``memspec.reference.targets.reference``) and the Governor is this module's:
an authority that keeps an audit trail of every ledger change.

``memspec conform docs.examples.system_target:target --level system``
"""

from __future__ import annotations

from memspec.reference.governor import ReferenceGovernor
from memspec.reference.targets import reference
from memspec.spec.api import Grant, Lease, SystemRoles, TargetInstance


class AuditedGovernor(ReferenceGovernor):
    """A Governor (``memspec.spec.api.Governor``) that records who was
    granted, charged and refunded what -- the kind of policy layer an
    allocator project puts around its accounts.  The ledger rule it must keep
    (S11): ``capacity == free + granted + charged``."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.audit: list[tuple[str, str, int]] = []

    def reserve(self, holder: str, nbytes: int) -> Grant:
        g = super().reserve(holder, nbytes)
        self.audit.append(("grant", holder, g.nbytes))
        return g

    def commit(self, grant: Grant, actual: int) -> Lease:
        lease = super().commit(grant, actual)
        self.audit.append(("charge", lease.holder, lease.nbytes))
        return lease

    def refund(self, lease: Lease, nbytes: int | None = None) -> int:
        n = super().refund(lease, nbytes)  # keep the base's signature: a partial decommit refunds part of a lease
        self.audit.append(("refund", lease.holder, n))
        return n


def target(capacity: int | None = None) -> TargetInstance:
    inst = reference(capacity) if capacity is not None else reference()
    inst.roles = SystemRoles(governor=AuditedGovernor)   # governor(capacity) -> Governor
    return inst
