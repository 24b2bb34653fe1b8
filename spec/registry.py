"""ProcessMemoryManager: registration, mechanism selection, capabilities.

Seed 000: the ProcessMemoryManager is responsible for *Registration,
mechanism selection, authority, provider/context lifetime*, not for
*Deciding which weight or KV page to evict*.

*The effective allocator may change.  A CUDA EP may first use ordinary
cuMemAlloc and later install a VMM arena.  If something caches the old
allocator and then uses it to free a pointer created by the new allocator,
that causes a cross-allocator free.*  Hence: selecting a mechanism bumps a
generation; a capability query answers for the mechanism installed *now*
(S3: *a capability query must not return a stale allocator snapshot*); and
what was allocated before a replacement is still released by its creator (S1).

The system under test registers two mechanisms on the device: ``[0]`` the
target's (selected first) and ``[1]`` an eager-only alternative with neither
VirtualBacking nor SharedMapping, used for replacement.
"""

from __future__ import annotations

from typing import Any

from memspec.spec.core import Returns, action, one_of, outcomes
from memspec.spec.state import Seen, SysState
from memspec.spec.allocation import mechanism_index


def current_capabilities(s: SysState) -> tuple[int, bool, bool]:
    """What a capability query must answer: the mechanism installed now and
    its capabilities (never a snapshot taken earlier)."""
    i = s.registry.installed
    vb, sm = s.registry.capabilities[i]
    return (i, vb, sm)


def _perform_select(sut: Any, mechanism: int) -> int:
    return sut.manager.select(sut.device, sut.mechanism_ids[mechanism])


@action(role="ProcessMemoryManager", params={"mechanism": one_of(0, 1, describe="mechanism 0 (the target) or 1 (eager only)")},
        perform=_perform_select, invariants=("S3", "S1"))
def select(s: SysState, mechanism: int) -> Any:
    """Install a registered mechanism on the device.

    Returns the new generation: greater than the last one when the mechanism
    changes (a replacement bumps it), not smaller when it is re-selected.
    Allocations made before stay owned by their creator mechanism.
    """
    reg = s.registry
    last = reg.generation
    bump = mechanism != reg.installed

    def accepts(v: Any) -> bool:
        if type(v) is not int:
            return False
        if last is None:
            return True
        return v > last if bump else v >= last

    def then(v: int) -> None:
        reg.installed = mechanism
        reg.generation = v
        reg.history[v] = mechanism
        reg.selections += 1

    def witness() -> int:
        base = s.w_generation if last is None else last
        s.w_generation = base + 1
        return base + 1

    return outcomes(Returns("the new generation", accepts, then, witness), blame="S3")


def _caps_facts(sut: Any, caps: Any) -> Seen:
    return Seen(None, {
        "mechanism": mechanism_index(sut, caps.mechanism_id),
        "generation": caps.generation,
        "virtual_backing": caps.virtual_backing,
        "shared_mapping": caps.shared_mapping,
    })


def _answer(s: SysState) -> Any:
    i, vb, sm = current_capabilities(s)
    gen = s.registry.generation

    def accepts(v: Any) -> bool:
        return (
            isinstance(v, Seen)
            and v["mechanism"] == i
            and v["virtual_backing"] is vb
            and v["shared_mapping"] is sm
            and type(v["generation"]) is int
            and (gen is None or v["generation"] == gen)
        )

    def then(v: Seen) -> None:
        reg = s.registry
        if reg.generation is None:
            reg.generation = v["generation"]
            reg.history[v["generation"]] = reg.installed
        # S3: the answer must describe what the registry had installed at that generation
        if reg.history.get(v["generation"], reg.installed) != v["mechanism"] or v["mechanism"] != reg.installed:
            s.stale_capabilities += 1

    def witness() -> Seen:
        g = gen
        if g is None:
            g = s.w_generation
        return Seen(None, {"mechanism": i, "generation": g, "virtual_backing": vb, "shared_mapping": sm})

    return outcomes(Returns(f"mechanism {i} with virtual_backing={vb}, shared_mapping={sm}, the current generation",
                            accepts, then, witness), blame="S3")


@action(role="MemoryBinding", perform=lambda sut: _caps_facts(sut, sut.binding.capabilities()), invariants=("S3",))
def binding_capabilities(s: SysState) -> Any:
    """Ask the binding what the device's mechanism can do.

    Answers for the mechanism installed now: its id, the current generation
    and whether it provides VirtualBacking and SharedMapping -- also right
    after a replacement (*a capability query must not return a stale
    allocator snapshot*).
    """
    return _answer(s)


@action(role="ProcessMemoryManager", perform=lambda sut: _caps_facts(sut, sut.manager.capabilities(sut.device)),
        invariants=("S3",))
def manager_capabilities(s: SysState) -> Any:
    """Ask the manager what the device's installed mechanism can do.

    Same answer as the binding's: the mechanism installed now, the current
    generation, its capabilities.
    """
    return _answer(s)


ACTIONS = [select, binding_capabilities, manager_capabilities]
