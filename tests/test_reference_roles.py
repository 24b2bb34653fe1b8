"""Reference roles: Governor, ProcessMemoryManager/MemoryBinding, EP and
owning handles, holders.  Every error path names its exception and leaves
the ledger (and the device) unchanged."""

from __future__ import annotations

import gc
import threading

import pytest

from memspec.spec.api import (
    Capabilities,
    DeviceKey,
    ExecutionProvider,
    Fence,
    Governor,
    Grant,
    KvPageStoreHolder,
    Lease,
    MemoryBinding,
    MiB,
    ModelResidencyHolder,
    OwningAllocation,
    OwningReservation,
    ProcessMemoryManager,
    SystemUnderTest,
    TicketState,
)
from memspec.spec.errors import (
    ContextBusy,
    DoubleFree,
    ForeignAllocation,
    GrantDenied,
    InvalidRange,
    InvalidRequest,
    InvalidTicket,
    NotRegistered,
    OutOfMemory,
    StaleHandle,
    Unsupported,
)
from memspec.reference.governor import ReferenceGovernor
from memspec.reference.holders import InjectedFailure
from memspec.reference.system import build_system
from memspec.reference.targets import reference, reference_eager, reference_vmm

PAGE = 2 * MiB
CAP = 256 * MiB


def snap(sys_) -> tuple:
    """Ledger + device state that a refused call must not change."""
    return sys_.governor.ledger(), sys_.sim.physical_bytes(), sys_.sim.mapped_pages(), sys_.manager.pins(sys_.context_id)


@pytest.fixture
def sut():
    return build_system(reference())


def drained(s) -> bool:
    s.drain()
    return (s.governor.ledger() == (s.governor.capacity(), s.governor.capacity(), 0, 0)
            and s.sim.physical_bytes() == 0 and s.manager.pins(s.context_id) == 0 and not s.sim.faults)


# --------------------------------------------------------------------------
# Governor
# --------------------------------------------------------------------------

def test_governor_ledger_grant_commit_cancel_refund():
    g = ReferenceGovernor(100)
    assert isinstance(g, Governor)
    gr = g.reserve("h", 30)
    assert g.ledger() == (100, 70, 30, 0)
    lease = g.commit(gr, 40)                      # actual footprint larger than planned
    assert g.ledger() == (100, 60, 0, 40) and g.charged("h") == 40 and lease.nbytes == 40
    gr2 = g.reserve("h", 10)
    assert g.cancel(gr2) == 10 and g.ledger() == (100, 60, 0, 40)
    assert g.refund(lease, 15) == 15 and g.charged("h") == 25
    assert g.refund(lease) == 25 and g.ledger() == (100, 100, 0, 0) and g.charged("h") == 0


def test_zero_byte_lease_refunds_after_the_holders_charge_is_gone():
    g = ReferenceGovernor(100)
    zero = g.commit(g.reserve("s", 10), 0)          # an allocation that took nothing
    full_ = g.commit(g.reserve("s", 10), 10)
    assert g.refund(full_) == 10 and g.charged("s") == 0
    assert g.refund(zero) == 0 and g.ledger() == (100, 100, 0, 0)
    with pytest.raises(InvalidRequest):
        g.refund(zero)


def test_governor_errors_leave_ledger_unchanged():
    g = ReferenceGovernor(100)
    gr = g.reserve("h", 50)
    lease = g.commit(g.reserve("h", 10), 10)
    before = g.ledger()
    for bad in (0, -1, 1.5, True, "x"):
        with pytest.raises(InvalidRequest):
            g.reserve("h", bad)
    with pytest.raises(InvalidRequest):
        g.reserve("", 1)
    with pytest.raises(GrantDenied):
        g.reserve("h", 41)
    with pytest.raises(GrantDenied):
        g.commit(gr, 91)                          # 41 more than granted, only 40 free
    with pytest.raises(InvalidRequest):
        g.commit(gr, -1)
    with pytest.raises(InvalidRequest):
        g.cancel(Grant(999, "h", 5))
    with pytest.raises(InvalidRequest):
        g.refund(Lease(999, "h", 5))
    with pytest.raises(InvalidRequest):
        g.refund(lease, 11)
    assert g.ledger() == before
    g.refund(lease)
    with pytest.raises(InvalidRequest):
        g.refund(lease)                           # refunded once only
    g.commit(gr, 50)
    with pytest.raises(InvalidRequest):
        g.cancel(gr)                              # committed grants cannot be cancelled
    assert g.balanced()


def test_ticket_granted_claimed():
    g = ReferenceGovernor(1000)
    lease = g.commit(g.reserve("weights", 800), 800)
    t = g.issue_ticket("kv", 500, priority=1, deadline=10)
    assert t.state == TicketState.PENDING
    g.refund(lease, 300)                 # the holder's release refunded 300 ...
    g.respond(t, "weights", 300)         # ... and it answers the ticket with them
    g.respond(t, "kv", 0)                # 0 is a valid answer
    assert t.state == TicketState.PENDING and t.held == 300 and g.free() == 200
    g.refund(lease, 200)
    g.respond(t, "weights", 200)
    assert t.state == TicketState.GRANTED and t.held == 500 and t.released == {"weights": 500, "kv": 0}
    assert g.ledger() == (1000, 200, 500, 300)
    grant = g.claim(t)
    assert t.state == TicketState.CLAIMED and t.held == 0 and grant.nbytes == 500 and grant.holder == "kv"
    g.commit(grant, 500)
    assert g.ledger() == (1000, 200, 0, 800) and g.charged("kv") == 500
    with pytest.raises(InvalidTicket):
        g.claim(t)
    with pytest.raises(InvalidTicket):
        g.cancel_ticket(t)


def test_ticket_cancel_and_timeout_return_bytes_exactly_once():
    g = ReferenceGovernor(1000)
    t1 = g.issue_ticket("kv", 100)
    t2 = g.issue_ticket("kv", 100, deadline=5)
    g.respond(t1, "weights", 100)
    g.respond(t2, "weights", 40)
    assert g.ledger() == (1000, 860, 140, 0)
    assert g.expire(4) == []
    assert g.expire(5) == [t2] and t2.state == TicketState.TIMED_OUT and t2.held == 0
    assert g.cancel_ticket(t1) == 100 and t1.state == TicketState.CANCELLED
    assert g.ledger() == (1000, 1000, 0, 0)
    for bad in (lambda: g.cancel_ticket(t1), lambda: g.cancel_ticket(t2), lambda: g.respond(t1, "w", 0)):
        with pytest.raises(InvalidTicket):
            bad()
    assert g.expire(100) == [] and g.ledger() == (1000, 1000, 0, 0)


def test_reconfigure_fails_stale_pending_tickets():
    g = ReferenceGovernor(1000)
    pending = g.issue_ticket("kv", 100)
    g.respond(pending, "w", 30)
    granted = g.issue_ticket("kv", 10)
    g.respond(granted, "w", 10)
    g.reconfigure()
    assert pending.state == TicketState.FAILED and pending.held == 0
    assert granted.state == TicketState.GRANTED
    with pytest.raises(InvalidTicket):
        g.respond(pending, "w", 1)
    assert g.ledger() == (1000, 990, 10, 0)
    with pytest.raises(InvalidRequest):
        g.respond(g.issue_ticket("kv", 5), "w", 10_000)     # more than was ever refunded
    with pytest.raises(InvalidTicket):
        ReferenceGovernor(10).claim(granted)                 # another governor's ticket


# --------------------------------------------------------------------------
# manager, binding
# --------------------------------------------------------------------------

def test_system_satisfies_protocols(sut):
    assert isinstance(sut, SystemUnderTest)
    assert isinstance(sut.manager, ProcessMemoryManager) and isinstance(sut.binding, MemoryBinding)
    assert isinstance(sut.ep, ExecutionProvider) and isinstance(sut.weights, ModelResidencyHolder)
    assert isinstance(sut.kv, KvPageStoreHolder)
    assert sut.ep is sut.instance.ep and sut.governor.capacity() == CAP


def test_selection_generations_and_fresh_capabilities(sut):
    m = sut.manager
    caps = sut.binding.capabilities()
    assert isinstance(caps, Capabilities)
    assert caps.mechanism_id == sut.mechanism_ids[0] and caps.virtual_backing and caps.shared_mapping
    gen = m.select(sut.device, sut.mechanism_ids[1])
    now = sut.binding.capabilities()                 # the same binding answers for the mechanism installed now
    assert now.generation == gen == caps.generation + 1
    assert now.mechanism_id == sut.mechanism_ids[1] and not now.virtual_backing and not now.shared_mapping
    with pytest.raises(Unsupported):
        sut.binding.reserve("kv", PAGE)
    with pytest.raises(NotRegistered):
        m.select(sut.device, "nope")
    with pytest.raises(NotRegistered):
        m.capabilities(DeviceKey("sim", 7))
    with pytest.raises(NotRegistered):
        m.bind(sut.device, "no-context", sut.authority_id)


def test_allocation_released_through_its_creator_after_replacement(sut):
    h = sut.binding.allocate("w", 3 * MiB)
    creator = sut.manager.mechanism(sut.mechanism_ids[0]).allocator()
    sut.manager.select(sut.device, sut.mechanism_ids[1])
    h2 = sut.binding.allocate("w", MiB)              # made by the new mechanism
    assert h.mechanism_id == sut.mechanism_ids[0] and h2.mechanism_id == sut.mechanism_ids[1]
    h.close()
    h2.close()
    sut.ep.poll()
    assert not creator.is_live(h.allocation) and h.released and h2.released
    assert drained(sut)


def test_binding_allocate_charges_actual_footprint(sut):
    h = sut.binding.allocate("weights", PAGE + 10)
    assert isinstance(h, OwningAllocation)
    assert sut.governor.charged("weights") == 2 * PAGE == h.allocation.footprint == sut.sim.physical_bytes()
    assert sut.manager.pins(sut.context_id) == 1
    h.close()
    sut.ep.poll()
    assert drained(sut)


def test_binding_failed_allocation_returns_its_grant(sut):
    before = snap(sut)
    for bad in (0, -5, 2.0, True):
        with pytest.raises(InvalidRequest):
            sut.binding.allocate("w", bad)
    with pytest.raises(GrantDenied):
        sut.binding.allocate("w", 1 << 50)          # the budget refuses first
    assert snap(sut) == before
    # a governor larger than the device: the grant is given, the device says OutOfMemory, the grant comes back
    big = build_system(reference(64 * MiB), capacity=1 << 40)
    before = snap(big)
    with pytest.raises(OutOfMemory):
        big.binding.allocate("w", 128 * MiB)
    assert snap(big) == before and big.governor.live_grants() == 0


def test_binding_footprint_larger_than_budget_is_refused_cleanly():
    s = build_system(reference(64 * MiB), capacity=3 * MiB)
    before = snap(s)
    with pytest.raises(GrantDenied):
        s.binding.allocate("w", 2 * MiB + 1)      # grant of 2 MiB+1 fits, its 4 MiB footprint does not
    assert snap(s) == before and s.governor.live_grants() == 0


def test_binding_reserve_commit_decommit(sut):
    r = sut.binding.reserve("kv", 10 * PAGE)
    assert isinstance(r, OwningReservation) and sut.governor.ledger()[3] == 0
    assert sut.binding.commit(r, 0, 4 * PAGE) == 4 * PAGE
    assert r.committed() == 4 * PAGE == sut.governor.charged("kv") == sut.sim.physical_bytes()
    before = snap(sut)
    for start, end in ((0, PAGE), (PAGE, 0), (1, PAGE), (9 * PAGE, 11 * PAGE)):
        with pytest.raises(InvalidRange):
            sut.binding.commit(r, start, end)
    with pytest.raises(InvalidRange):
        sut.binding.decommit(r, 4 * PAGE, 5 * PAGE)     # not committed
    big = sut.binding.reserve("kv", 1 << 40)
    with pytest.raises(GrantDenied):
        sut.binding.commit(big, 0, 1 << 40)
    with pytest.raises(InvalidRange):
        sut.binding.commit(r, 2 * PAGE, 6 * PAGE)   # pages 2-3 already committed: refused before any grant
    big.close()
    assert sut.ep.poll() == 1
    assert snap(sut) == before
    f = sut.ep.launch(0, [(r.address + 3 * PAGE, 16)], [])
    r.use(f)
    assert sut.binding.decommit(r, 2 * PAGE, 4 * PAGE) == 2 * PAGE
    # the pages leave the committed bytes now; unmapping and refund wait for the fence
    assert r.committed() == 2 * PAGE and sut.governor.charged("kv") == 4 * PAGE
    assert sut.sim.physical_bytes() == 4 * PAGE and sut.sim.is_mapped(r.address + 3 * PAGE)
    assert sut.ep.pending_releases() == 1 and sut.ep.poll() == 0
    with pytest.raises(InvalidRange):
        sut.binding.decommit(r, 2 * PAGE, 3 * PAGE)     # not committed any more
    # committing a page whose decommit is queued takes it back (never remapped under the kernel)
    assert sut.binding.commit(r, 2 * PAGE, 3 * PAGE) == PAGE
    assert r.committed() == 3 * PAGE and sut.governor.charged("kv") == 5 * PAGE and sut.sim.physical_bytes() == 4 * PAGE
    sut.ep.synchronize()
    assert sut.ep.kernel_result(f) == [bytes(16)] and not sut.sim.faults
    assert sut.ep.poll() == 1
    assert r.committed() == 3 * PAGE == sut.governor.charged("kv") == sut.sim.physical_bytes()
    assert sut.sim.is_mapped(r.address + 2 * PAGE) and not sut.sim.is_mapped(r.address + 3 * PAGE)
    r.close()
    with pytest.raises(StaleHandle):
        sut.binding.commit(r, 4 * PAGE, 5 * PAGE)
    sut.ep.poll()
    assert sut.governor.charged("kv") == 0
    assert drained(sut)


def test_reserve_unsupported_without_virtual_backing():
    s = build_system(reference_eager())
    before = snap(s)
    with pytest.raises(Unsupported):
        s.binding.reserve("kv", PAGE)
    with pytest.raises(Unsupported):
        s.kv.open("a", PAGE)
    assert snap(s) == before


def test_destroy_context_busy_while_pinned(sut):
    ob = sut.other_binding
    h = ob.allocate("w", MiB)
    f = sut.other_ep.fill(0 if False else sut.other_ep.default_stream, h.address, 8, 1)
    h.use(f)
    with pytest.raises(ContextBusy):
        sut.manager.destroy_context(sut.other_context_id)
    h.close()                                        # the queued release still pins it
    sut.other_ep.poll()
    assert sut.manager.pins(sut.other_context_id) == 1
    with pytest.raises(ContextBusy):
        sut.manager.destroy_context(sut.other_context_id)
    sut.other_ep.synchronize()
    assert sut.other_ep.poll() == 1
    sut.manager.destroy_context(sut.other_context_id)
    with pytest.raises(NotRegistered):
        ob.allocate("w", MiB)
    with pytest.raises(NotRegistered):
        sut.manager.destroy_context(sut.other_context_id)


# --------------------------------------------------------------------------
# EP, owning handles, deferred free
# --------------------------------------------------------------------------

def test_fence_ordering_is_observable(sut):
    """A kernel queued over an allocation, the handle dropped, the device not
    advanced: the page is still mapped and the kernel's later read sees the
    original bytes; after the fence, the page is free."""
    ep = sut.ep
    h = sut.binding.allocate("w", PAGE)
    addr = h.address
    ep.write(ep.default_stream, addr, b"original")
    k = ep.launch(ep.default_stream, [(addr, 8)], [])
    h.use(k)
    h.close()                                        # drop: only enqueues
    assert ep.pending_releases() == 1 and ep.poll() == 0
    assert sut.sim.is_mapped(addr) and sut.sim.physical_bytes() == PAGE and sut.governor.charged("w") == PAGE
    # meanwhile someone else allocates: the page must not be handed out again
    other = sut.binding.allocate("x", PAGE)
    assert other.address != addr
    ep.advance(ep.default_stream, 1)                 # the copy ran, the kernel has not
    assert not ep.fence_done(k) and ep.poll() == 0 and sut.sim.is_mapped(addr)
    ep.advance(ep.default_stream, 1)
    assert ep.kernel_result(k) == [b"original"] and not sut.sim.faults
    assert ep.poll() == 1
    assert not sut.sim.is_mapped(addr) and sut.governor.charged("w") == 0 and h.released
    other.close()
    assert drained(sut)


def test_premature_free_would_fault(sut):
    """The same scenario with the release run too early (a bug) shows up as a
    recorded device fault: what the fence ordering prevents."""
    ep = sut.ep
    h = sut.binding.allocate("w", PAGE)
    k = ep.launch(ep.default_stream, [(h.address, 8)], [])
    creator = sut.manager.mechanism(h.mechanism_id).allocator()
    creator.deallocate(h.allocation)                 # bypass the queue
    with pytest.raises(Exception) as e:
        ep.run_until(k)
    assert type(e.value).__name__ == "DeviceFault" and sut.sim.faults


def test_close_twice_is_double_free_and_use_after_close_is_stale(sut):
    h = sut.binding.allocate("w", PAGE)
    h.close()
    with pytest.raises(DoubleFree):
        h.close()
    with pytest.raises(StaleHandle):
        h.use(sut.ep.record())
    assert sut.ep.pending_releases() == 1
    sut.ep.poll()
    with pytest.raises(DoubleFree):
        h.close()
    assert drained(sut)


def test_context_manager_and_garbage_collection_only_enqueue(sut):
    with sut.binding.allocate("w", PAGE) as h:
        h.use(sut.ep.fill(sut.ep.default_stream, h.address, 4, 7))
    assert h.closed and not h.released and sut.ep.pending_releases() == 1

    def drop_in_thread():
        x = sut.binding.allocate("w", PAGE)
        x.use(sut.ep.record())
        del x
        gc.collect()

    t = threading.Thread(target=drop_in_thread)
    t.start()
    t.join()
    assert sut.ep.pending_releases() == 2            # the finalizer enqueued; it freed nothing
    assert sut.governor.charged("w") == 2 * PAGE and sut.sim.physical_bytes() == 2 * PAGE
    sut.ep.synchronize()
    assert sut.ep.poll() == 2
    assert drained(sut)


def test_defer_rejects_bad_input(sut):
    with pytest.raises(InvalidRequest):
        sut.ep.defer(["not a fence"], lambda: None)
    with pytest.raises(InvalidRequest):
        sut.ep.defer([], "not callable")
    assert sut.ep.pending_releases() == 0


# --------------------------------------------------------------------------
# holders
# --------------------------------------------------------------------------

def test_model_residency_evicts_only_cold_idle_weights(sut):
    w = sut.weights
    w.load("hot", 10 * MiB, hot=True)
    w.load("cold-a", 6 * MiB, hot=False)
    w.load("cold-b", 4 * MiB, hot=False)
    w.load("cold-busy", 8 * MiB, hot=False)
    w.use("cold-busy", sut.ep.launch(sut.ep.default_stream, [(w.handle("cold-busy").address, 4)], []))
    with pytest.raises(InvalidRequest):
        w.load("hot", MiB, hot=True)
    t = sut.governor.issue_ticket("kv", 64 * MiB)
    freed = w.on_pressure(t)
    assert freed == 10 * MiB and set(w.weights()) == {"hot", "cold-busy"}
    sut.governor.respond(t, w.name, freed)
    assert t.held == 10 * MiB and sut.governor.charged("weights") == 18 * MiB
    assert sut.sim.physical_bytes() == 18 * MiB
    assert w.on_pressure(sut.governor.issue_ticket("kv", MiB)) == 0      # nothing safe left: 0 is valid
    sut.governor.cancel_ticket(t)
    w.unload("hot")
    w.unload("cold-busy")
    assert drained(sut)


def test_kv_growth_transaction_and_rollback(sut):
    kv = sut.kv
    kv.open("a", 1 << 30)
    base = kv.view("a").address
    assert kv.grow("a", 5 * MiB) == 6 * MiB and kv.committed("a") == 6 * MiB == sut.governor.charged("kv")
    for step in (4, 5):
        before, view = snap(sut), kv.view("a")
        with pytest.raises(InjectedFailure) as e:
            kv.grow("a", 20 * MiB, fail_at=step)
        assert e.value.step == step
        assert snap(sut) == before and kv.view("a") == view and kv.committed("a") == 6 * MiB
        assert sut.governor.live_grants() == 0
    assert kv.grow("a", 20 * MiB) == 14 * MiB and kv.view("a").address == base and kv.view("a").nbytes == 20 * MiB
    assert kv.grow("a", 10 * MiB) == 0
    before = snap(sut)
    with pytest.raises(InvalidRequest):
        kv.grow("a", 2 << 30)
    with pytest.raises(InvalidRequest):
        kv.grow("a", 30 * MiB, fail_at=3)
    with pytest.raises(InvalidRequest):
        kv.grow("nope", MiB)
    with pytest.raises(InvalidRequest):
        kv.open("a", MiB)
    assert snap(sut) == before
    kv.close("a")
    assert drained(sut)


def test_kv_growth_denied_by_budget_changes_nothing():
    s = build_system(reference(), capacity=8 * MiB)
    s.kv.open("a", 1 << 30)
    s.kv.grow("a", 4 * MiB)
    before, view = snap(s), s.kv.view("a")
    with pytest.raises(GrantDenied):
        s.kv.grow("a", 16 * MiB)
    assert snap(s) == before and s.kv.view("a") == view


def test_kv_prefix_shared_pages_counted_once(sut):
    kv, ep = sut.kv, sut.ep
    kv.open("a", 1 << 30)
    kv.grow("a", 8 * MiB)
    ep.write(ep.default_stream, kv.view("a").address + 3, b"system prompt")
    ep.synchronize()
    charged = sut.governor.charged("kv")
    kv.open("b", 1 << 30, prefix_of="a", prefix_bytes=4 * MiB)
    assert sut.governor.charged("kv") == charged and sut.sim.physical_bytes() == 8 * MiB   # no new charge
    kv.grow("b", 6 * MiB)
    assert kv.committed("b") == 6 * MiB and kv.committed("a") == 8 * MiB
    # physical: a's 8 MiB (4 shared) + b's 2 private; the shared 4 MiB charged once
    assert sut.sim.physical_bytes() == 10 * MiB == sut.governor.charged("kv") == charged + 2 * MiB
    assert kv.shared_bytes() == 4 * MiB
    assert ep.read(ep.default_stream, kv.view("b").address + 3, 13) == b"system prompt"
    assert ep.read(ep.default_stream, kv.view("a").address + 3, 13) == b"system prompt"
    with pytest.raises(Exception) as e:
        ep.write(ep.default_stream, kv.view("b").address, b"x")      # the shared prefix is read-only
    assert type(e.value).__name__ == "ReadOnlyViolation" and sut.sim.faults[-1].kind == "read_only"
    sut.sim.faults.clear()
    kv.open("c", 1 << 30, prefix_of="a", prefix_bytes=6 * MiB)      # a longer prefix of the same origin
    assert sut.sim.physical_bytes() == 10 * MiB and kv.prefix_users("a") == {"a", "b", "c"}
    assert kv.committed("c") == 6 * MiB and kv.shared_bytes() == 6 * MiB
    with pytest.raises(InvalidRequest):
        kv.open("d", 1 << 30, prefix_of="a", prefix_bytes=10 * MiB)  # more than a has backed
    kv.close("a")
    ep.poll()
    assert sut.sim.physical_bytes() == 8 * MiB == sut.governor.charged("kv")   # b and c still map 6 MiB of a
    kv.close("c")
    ep.poll()
    assert sut.sim.physical_bytes() == 6 * MiB == sut.governor.charged("kv")   # b: 4 shared + 2 own
    kv.close("b")
    assert drained(sut)


def test_kv_prefix_needs_shared_mapping():
    s = build_system(reference_vmm())
    s.kv.open("a", 1 << 30)
    s.kv.grow("a", 4 * MiB)
    before = snap(s)
    with pytest.raises(Unsupported):
        s.kv.open("b", 1 << 30, prefix_of="a", prefix_bytes=4 * MiB)
    assert snap(s) == before and s.kv.requests() == ["a"]


def test_kv_pages_in_flight_are_never_released(sut):
    kv, ep = sut.kv, sut.ep
    kv.open("a", 1 << 30)
    kv.grow("a", 8 * MiB)
    kv.set_evictable("a")
    k = ep.launch(ep.default_stream, [(kv.view("a").address, 8)], [])
    kv.use("a", k)
    t = sut.governor.issue_ticket("weights", 4 * MiB)
    assert kv.on_pressure(t) == 0 and kv.committed("a") == 8 * MiB       # in use: 0
    ep.synchronize()
    freed = kv.on_pressure(t)
    assert freed == 8 * MiB and kv.requests() == [] and sut.sim.physical_bytes() == 0
    sut.governor.respond(t, kv.name, freed)
    assert t.state == TicketState.GRANTED
    sut.governor.cancel_ticket(t)
    assert drained(sut)


def test_targets_probe_physical_bytes():
    for make, vb, sm in ((reference, True, True), (reference_eager, False, False), (reference_vmm, True, False)):
        inst = make(32 * MiB)
        m = inst.mechanism
        assert inst.capacity == 32 * MiB and inst.physical_bytes() == 0
        assert (m.virtual_backing() is not None, m.shared_mapping() is not None) == (vb, sm)
        a = m.allocator().allocate(__import__("memspec.spec.api", fromlist=["x"]).AllocationRequest(1))
        assert inst.physical_bytes() == PAGE
        twin = inst.extras["make_foreign"]()
        with pytest.raises(ForeignAllocation):
            twin.allocator().deallocate(a)
        assert isinstance(inst.ep.record(), Fence)


def test_binding_refuses_another_contexts_reservation_and_foreign_device(sut):
    r = sut.binding.reserve("kv", 4 * PAGE)
    before = snap(sut)
    with pytest.raises(ForeignAllocation):
        sut.other_binding.commit(r, 0, PAGE)
    with pytest.raises(ForeignAllocation):
        sut.other_binding.decommit(r, 0, PAGE)
    assert snap(sut) == before
    other = reference()
    with pytest.raises(InvalidRequest):
        sut.manager.register_mechanism(DeviceKey("sim", 3), other.mechanism)   # its allocator is on sim:0
    assert sut.manager.pins(sut.other_context_id) == 0
    r.close()
    assert drained(sut)
