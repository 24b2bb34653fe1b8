"""ProcessMemoryManager and MemoryBinding: registration, mechanism selection,
capabilities, and the allocation transaction a binding runs.

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

The allocation transaction is the seed's first sequence diagram, run by a
``MemoryBinding``::

    H->>B: request N bytes
    B->>G: reserve(authority, holder, role, N)   -- provisional grant
    B->>E: allocate with selected mechanism
    B->>G: commit(grant, actual bytes)          -- charge at the real footprint
    B-->>H: usable view

*If the allocation fails, the provisional grant must be returned. When the
actual footprint differs from the plan, act on the real allocated bytes.*
"""

from __future__ import annotations

from typing import Any

from memspec.spec import kernels as K
from memspec.spec.api import Fence
from memspec.spec.core import Check, Domain, Raises, Returns, action, one_of, only, outcomes
from memspec.spec.eager import SIZES
from memspec.spec.errors import DoubleFree, GrantDenied, InvalidRequest, OutOfMemory, Unsupported
from memspec.spec.state import (
    Owned,
    Seen,
    SysState,
    add,
    from_refs,
    is_size,
    new_ref,
    obj_of,
    remember_identity,
    witness_identity,
)



# ==========================================================================
# MemoryBinding: the allocation transaction
# ==========================================================================

def context_alive(s: SysState) -> bool:
    return s.registry.context_alive


def physical_total(s: SysState) -> int:
    return sum(s.physical_by.values())


def new_owned(s: SysState, kind: str, holder: str, size: int, footprint: int, creator: int) -> Owned:
    """Record something physical a holder now owns and is charged for."""
    ref = new_ref(s)
    o = Owned(ref, kind, holder, size, footprint, creator, holder)
    s.owned[ref] = o
    add(s.live_bytes_by, holder, footprint)
    add(s.physical_by, holder, footprint)
    s.live_objects += 1
    return o


def drop_owned(s: SysState, o: Owned, fences: list[int], *, exact: bool = True) -> None:
    """Drop of the last owning handle: enqueue the release (S7: never free here)."""
    from memspec.spec.ep import enqueue, new_entry

    o.state = "queued"
    s.live_objects -= 1
    s.live_bytes_by[o.holder] -= o.footprint
    enqueue(s, new_entry(s, f"{o.kind} {o.ref}", fences, o.creator, {o.holder: o.footprint}, o.footprint, o.ref, exact))


def mechanism_index(sut: Any, mechanism_id: Any) -> int:
    ids = list(sut.mechanism_ids)
    return ids.index(mechanism_id) if mechanism_id in ids else -1


def _perform_sys_allocate(sut: Any, size: Any) -> Seen:
    from memspec.spec.governor import holder_name

    o = sut.binding.allocate(holder_name(sut, "session"), size)
    a = o.allocation
    return Seen(o, {
        "mechanism": mechanism_index(sut, o.mechanism_id),
        "context": o.context_id == sut.context_id,
        "size": a.size,
        "footprint": a.footprint,
        "identity": a.identity,
    })


@action(role="MemoryBinding", params={"size": SIZES}, perform=_perform_sys_allocate, enabled=context_alive,
        invariants=("S2", "S3", "S8", "S11", "S14"), weight=4)
def allocate_owned(s: SysState, size: Any) -> Any:
    """Request ``size`` bytes for the session holder through the binding.

    The binding runs the seed's first sequence diagram: reserve a
    provisional grant, allocate with the mechanism installed *now*, commit
    the charge at the actual footprint, hand out an owning allocation.  Not a
    positive int: InvalidRequest.  The Governor cannot approve it:
    GrantDenied.  The device cannot: OutOfMemory (allowed unless the device
    holds nothing and ``size`` fits the device).  On every failure the grant is
    returned and the ledger is as before (S8).  On success the handle names
    the installed mechanism and the binding's context, its footprint is in
    ``[size, round_up(size, page)]``, and exactly the footprint is charged.
    """
    from memspec.spec.governor import SESSION, charge_at_footprint

    if not is_size(size):
        return only(InvalidRequest, blame="S8", describe="size is not a positive int; ledger unchanged")
    installed = s.registry.installed
    hi, strict, room = planned_footprint(s, size)
    if size > s.free:
        return only(GrantDenied, blame="S8", describe=f"{size} > free {s.free}; ledger unchanged")

    def shaped(v: Any) -> bool:
        return (
            isinstance(v, Seen)
            and v["mechanism"] == installed
            and v["context"] is True
            and v["size"] == size
            and type(v["footprint"]) is int
        )

    checks = [Check("S8", "footprint", lambda v: v["footprint"] >= size, f"footprint >= {size}")]
    if hi is not None:
        checks.append(Check("S8", "bound", lambda v: v["footprint"] <= hi, f"footprint <= {hi} (the declared bound)"))
    checks += [
        Check("S8", "charge", lambda v: v["footprint"] <= s.free,
              f"the real footprint charged within the {s.free} bytes free (else refused, grant returned)"),
        Check("S14", "fresh-identity", lambda v: v["identity"] not in s.identities, "a fresh identity"),
    ]

    def then(v: Seen) -> int:
        fp = v["footprint"]
        charge_at_footprint(s, SESSION, size, fp)
        o = new_owned(s, "allocation", SESSION, size, fp, installed)
        remember_identity(s, v["identity"])
        s.live_allocs.add(o.ref)
        return o.ref

    wfp = hi if hi is not None else K.round_up(size, s.page)

    def witness() -> Seen:
        return Seen(None, {"mechanism": installed, "context": True, "size": size, "footprint": wfp,
                           "identity": witness_identity(s, "spec-owned")})

    bound = f"[{size}, {hi}]" if hi is not None else f">= {size}"
    branches: list[Any] = [Returns(f"an owning allocation, footprint {bound}, charged at its footprint",
                                   shaped, then, witness if wfp <= s.free else None, checks=tuple(checks),
                                   id="returns an owning allocation")]
    if hi is None or hi > s.free:
        branches.append(Raises(GrantDenied, "the real footprint does not fit what is free; ledger unchanged"))
    forbidden: tuple = ()
    if physical_total(s) == 0 and strict and hi is not None and hi <= room:
        forbidden = (Raises(OutOfMemory, "never on an empty device for a request its declared bound fits",
                            checks=(Check("S8", "refused-fit", lambda e: False,
                                          f"an empty device of {room} bytes fits the bound {hi}"),)),)
    else:
        branches.append(Raises(OutOfMemory, "the device could not (fragmentation, or it is smaller than the "
                                            "budget); grant returned"))
    return outcomes(*branches, blame="S8", forbidden=forbidden)


def planned_footprint(s: SysState, size: int) -> tuple:
    """``(most footprint or None, strict, room)`` of an allocation of ``size``
    by the installed mechanism: the target's declared bound (``None``:
    undeclared), or the page-rounded size for a mechanism of the reference's
    (a replacement); ``strict`` when an OutOfMemory on an empty device is
    judged (a bound and the overhead declared); ``room``: the device's bytes
    less the declared overhead."""
    from memspec.spec.api import AllocatorGeometry
    from memspec.spec.eager import geometry_of, most_footprint

    if s.registry.installed != 0:   # the replacement mechanism: the target's own twin, or the reference's
        g = getattr(s, "replacement_geometry", None) or AllocatorGeometry.page_rounded(s.page)
    else:
        g = geometry_of(s)
    hi = most_footprint(g, size, 256)
    return hi, hi is not None and g.overhead is not None, s.device_capacity - (g.overhead or 0)


def _perform_use(sut: Any, allocation: int, stream: int) -> Fence:
    o = obj_of(sut.ref(allocation))
    a = o.allocation
    f = sut.ep.launch(sut.ref(stream), [(a.address, a.size)], [])
    o.use(f)
    return f


@action(role="ExecutionProvider",
        params={"allocation": from_refs("a live owning allocation", lambda s: s.live_allocs),
                "stream": Domain("a stream", lambda s, c: list(s.streams)[c.integer(0, len(s.streams) - 1)],
                                 lambda s: len(s.streams) > 0)},
        perform=_perform_use, invariants=("S4",), weight=3)
def use(s: SysState, allocation: int, stream: int) -> Any:
    """Submit device work that reads the allocation on ``stream``, and record its fence on the owning handle.

    Returns the fence (*H->>E: submit GPU work that uses the allocation*).
    The allocation must not be freed before that fence is done (S4).
    """
    from memspec.spec.ep import launch

    def then(_v: Fence) -> int:
        f = launch(s, stream)
        s.owned[allocation].fences.append(f)
        return f

    return outcomes(Returns("a Fence", lambda v: isinstance(v, Fence), then, lambda: Fence(stream, 0)), blame="S4")


def _perform_drop(sut: Any, allocation: int) -> None:
    obj_of(sut.ref(allocation)).close()


@action(role="OwningAllocation",
        params={"allocation": from_refs("an owning allocation: live, or already dropped", lambda s: s.live_allocs,
                                        lambda s: s.dead_allocs)},
        perform=_perform_drop, invariants=("S7", "S10", "S11"), weight=3)
def drop(s: SysState, allocation: int) -> Any:
    """Drop the last owning handle of an allocation (``close()``).

    A live allocation: returns None having only *enqueued* its release on
    the EP's deferred-free queue, guarded by every fence recorded with
    ``use`` -- nothing is freed and nothing is refunded yet (S7: *Drop
    should be responsible for enqueuing, not for synchronizing the whole GPU
    on an arbitrary thread or freeing immediately*).  Dropped already:
    DoubleFree.
    """
    o = s.owned[allocation]
    if o.state != "live":
        return only(DoubleFree, blame="S7", describe="already dropped")

    def then(_v: Any) -> None:
        s.live_allocs.discard(allocation)
        s.dead_allocs.add(allocation)
        drop_owned(s, o, o.fences)

    return outcomes(Returns("None (the release is queued)", lambda v: v is None, then, lambda: None),
                    blame="S7", touched=(allocation,))


BINDING_ACTIONS = [allocate_owned, use, drop]


# ==========================================================================
# ProcessMemoryManager: selection and capabilities
# ==========================================================================

def current_capabilities(s: SysState) -> tuple[int, bool, bool]:
    """What a capability query must answer: the mechanism installed now and
    its capabilities (never a snapshot taken earlier)."""
    i = s.registry.installed
    vb, sm = s.registry.capabilities[i]
    return (i, vb, sm)


def capability_refusal_is_stale(s: SysState, needs: str) -> tuple:
    """A refusal an action may not give: ``Unsupported`` while the mechanism
    installed now *has* every capability the action needs (``needs``: what
    it needs, in words).  Such a refusal answered from a snapshot of an
    earlier mechanism -- S3, *a capability query must not return a stale
    allocator snapshot* -- so it is blamed on S3's clause
    ``S3.capability-refused``, not on the action's own rule (a refusal is
    never a silent no-op, S5's rule).  Use as an ``outcomes(...,
    forbidden=...)`` entry where the installed mechanism has ``needs``."""
    i = s.registry.installed
    return (Raises(Unsupported, f"never while mechanism {i}, installed now, has {needs}",
                   checks=(Check("S3", "capability-refused", lambda e: False,
                                 f"mechanism {i}, installed now, has {needs}: the refusal answered "
                                 f"for a mechanism not installed"),)),)


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
