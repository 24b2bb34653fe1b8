"""Provider/context lifetime: pinned while anything made in it lives.

Seed 000, migration step 3: *Establish provider/context pinning: the context
is not destroyed while an allocation is still alive.*  A DeviceAllocation
*must remember, or indirectly reference: the allocator that created it; the
corresponding device and provider context; the queue/fence needed for safe
release.*

A context's pins are its live allocations, weights, reservations and KV
requests plus its queued releases (S10).
"""

from __future__ import annotations

from typing import Any

from memspec.spec.core import Returns, action, only, outcomes
from memspec.spec.errors import ContextBusy
from memspec.spec.state import SysState


def pins(s: SysState) -> int:
    """Live objects made in the context plus its queued releases."""
    return s.live_objects + len(s.queue)


@action(role="ProcessMemoryManager", perform=lambda sut: sut.manager.destroy_context(sut.context_id),
        enabled=lambda s: s.registry.context_alive, invariants=("S10",))
def destroy_context(s: SysState) -> Any:
    """Destroy the binding's provider context.

    While it is pinned: ContextBusy, and it stays alive.  Unpinned: returns
    None and the context is gone (nothing more can be allocated through the
    binding).
    """
    n = pins(s)
    if n:
        return only(ContextBusy, blame="S10", describe=f"{n} pin(s): live allocations or queued releases")

    def then(_v: Any) -> None:
        s.registry.context_alive = False

    return outcomes(Returns("None", lambda v: v is None, then, lambda: None), blame="S10")


ACTIONS = [destroy_context]
