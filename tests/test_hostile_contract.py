"""Hostile use of the contract on both targets (reference and cuda-host):
forged and altered handles, wrong types, another EP's streams and fences,
another governor's grants, releases that fail once, work after close.  Each
case asserts a named error, an unchanged ledger (physical bytes, governor),
and that nothing ran (no bytes written, nothing freed)."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from memspec.cuda_impl.targets import cuda_host
from memspec.reference.ep import ReferenceEP
from memspec.reference.governor import ReferenceGovernor
from memspec.reference.system import build_system
from memspec.reference.targets import reference
from memspec.spec.api import AllocationRequest, Fence, Identity, Lease, ReserveRequest
from memspec.spec.errors import (
    ContextBusy,
    DoubleFree,
    ForeignAllocation,
    InvalidRequest,
    MemspecError,
    StaleHandle,
)

G = 2 << 20


@pytest.fixture(params=["reference", "cuda-host"])
def target(request):
    inst = reference(64 * G) if request.param == "reference" else cuda_host(64 * G)
    yield inst
    inst.close()


def _forgeries(h):
    """Copies of handle ``h`` with odd identities and altered fields."""
    out = []
    for ident in ("x", 7, None, ("a", 1), Identity(h.identity.creator, [1]), Identity(5, 1),
                  Identity(h.identity.creator, "1"), Identity(h.identity.creator, 10 ** 9)):
        out.append(dataclasses.replace(h, identity=ident))
    return out


# -- 15: forged handles, altered sizes ------------------------------------------

def test_forged_allocation_identities_give_named_errors(target):
    a = target.mechanism.allocator()
    h = a.allocate(AllocationRequest(3 * G))
    phys = target.physical_bytes()
    for bad in _forgeries(h) + [dataclasses.replace(h, size=1), dataclasses.replace(h, size=h.size + G),
                                dataclasses.replace(h, address=h.address + G)]:
        with pytest.raises((InvalidRequest, ForeignAllocation, StaleHandle, DoubleFree)):
            a.deallocate(bad)
        assert target.physical_bytes() == phys          # nothing freed
    assert a.deallocate(h) >= 3 * G                      # the genuine handle still works


def test_forged_reservation_and_physical_handles_give_named_errors(target):
    vb, sm = target.mechanism.virtual_backing(), target.mechanism.shared_mapping()
    va = vb.reserve(ReserveRequest(4 * G))
    vb.commit_range(va, 0, 2 * G)
    ph = sm.create(2 * G)
    phys = target.physical_bytes()
    for bad in _forgeries(va) + [dataclasses.replace(va, size=8 * G), dataclasses.replace(va, size=2 * G)]:
        with pytest.raises((InvalidRequest, ForeignAllocation, StaleHandle, DoubleFree)):
            vb.release(bad)
        with pytest.raises((InvalidRequest, ForeignAllocation, StaleHandle)):
            vb.commit_range(bad, 2 * G, 4 * G)
    for bad in _forgeries(ph) + [dataclasses.replace(ph, size=4 * G)]:
        with pytest.raises((InvalidRequest, ForeignAllocation, StaleHandle)):
            sm.map(bad, va, 2 * G, read_only=False)
        with pytest.raises((InvalidRequest, ForeignAllocation, StaleHandle, DoubleFree)):
            sm.release(bad)
    assert target.physical_bytes() == phys
    assert vb.committed_bytes(va) == 2 * G
    sm.release(ph)
    vb.release(va)


# -- 7: read_only must be a bool --------------------------------------------------

@pytest.mark.parametrize("ro", [None, 0, 1, "", "yes", 0.0])
def test_map_read_only_must_be_a_bool(target, ro):
    sm = target.mechanism.shared_mapping()
    va = sm.reserve(ReserveRequest(4 * G))
    ph = sm.create(2 * G)
    phys = target.physical_bytes()
    with pytest.raises(InvalidRequest):
        sm.map(ph, va, 0, read_only=ro)
    assert sm.mapping_count(ph) == 0 and target.physical_bytes() == phys
    sm.map(ph, va, 0, read_only=True)      # a bool still works
    sm.unmap(va, 0, 2 * G)
    sm.release(ph)
    sm.free_reservation(va)


# -- 12 / 15: EP argument types ---------------------------------------------------

@pytest.mark.parametrize("data", [5, None, "abc", [1, 2], 3.0])
def test_write_rejects_wrong_types(target, data):
    a = target.mechanism.allocator()
    h = a.allocate(AllocationRequest(G))
    ep = target.ep
    ep.write(0, h.address, b"\x07" * 8)
    ep.synchronize(0)
    with pytest.raises(InvalidRequest):
        ep.write(0, h.address, data)
    ep.synchronize(0)
    assert ep.read(0, h.address, 8) == b"\x07" * 8     # nothing was written (write(s, a, 5) zeroed 5 bytes)
    a.deallocate(h)


@pytest.mark.parametrize("reads,writes", [(None, []), ([], None), (5, []), ([(0, 1)], "x"), ([("a", 1)], [])])
def test_launch_rejects_non_range_lists(target, reads, writes):
    with pytest.raises(InvalidRequest):
        target.ep.launch(0, reads, writes)


@pytest.mark.parametrize("args", [("0", 0, 4), (0, 1.5, 4), (0, 0, "4"), (0, 0, None), (None, 0, 4)])
def test_read_rejects_wrong_types(target, args):
    with pytest.raises(InvalidRequest):
        target.ep.read(*args)


# -- 15: the reference EP refuses another EP's stream or fence ----------------------

def test_reference_ep_refuses_another_eps_stream_and_fence():
    inst = reference(16 * G)
    try:
        ep = inst.ep
        other = ReferenceEP(inst.extras["device"], name="other")
        s_other = other.new_stream()
        f_other = other.record(s_other)
        h = inst.mechanism.allocator().allocate(AllocationRequest(G))
        for call in (lambda: ep.write(s_other, h.address, b"x"), lambda: ep.launch(s_other, [], []),
                     lambda: ep.read(s_other, h.address, 1), lambda: ep.fill(s_other, h.address, 1, 0),
                     lambda: ep.fence_done(f_other), lambda: ep.defer([f_other], lambda: None),
                     lambda: ep.run_until(f_other), lambda: ep.advance(s_other),
                     lambda: ep.synchronize(s_other), lambda: ep.fence_done(Fence(10 ** 6, 1))):
            with pytest.raises(InvalidRequest):
                call()
        assert ep.pending_releases() == 0 and inst.extras["device"].queued(s_other) == 0
        inst.mechanism.allocator().deallocate(h)
    finally:
        inst.close()


# -- 13: governor grants and leases are bound to their governor --------------------

def test_governor_refuses_another_governors_grant_and_forged_leases():
    A, B = ReferenceGovernor(100 * G, name="A"), ReferenceGovernor(100 * G, name="B")
    ga = A.reserve("h", G)
    gb = B.reserve("h", G)
    la = A.commit(ga, 3 * G)
    before_a, before_b = A.ledger(), B.ledger()
    with pytest.raises(InvalidRequest, match="not a live grant of A"):
        A.commit(gb, G)
    with pytest.raises(InvalidRequest):
        A.cancel(gb)
    lb = B.commit(gb, G)
    for forged in (Lease(la.lease_id, la.holder, 1), Lease(la.lease_id, "other", la.nbytes), lb,
                   Lease(la.lease_id + 1000, "h", 1), Lease([1], "h", 1)):
        with pytest.raises(InvalidRequest):
            A.refund(forged)
        with pytest.raises(InvalidRequest):
            A.split(forged, 1)
        with pytest.raises(InvalidRequest):
            A.merge([forged])
    assert A.ledger() == before_a and A.balanced()
    with pytest.raises(InvalidRequest):
        A.merge([la, la])          # the same lease twice would double its bytes
    assert A.refund(copy.copy(la)) == 3 * G     # a faithful copy is the same lease
    assert A.ledger() == (100 * G, 100 * G, 0, 0)
    assert B.ledger() == (before_b[0], before_b[1], 0, G)


# -- 8: a release that raises once stays queued and is retried -----------------------

def _flaky(obj, name, failures=1):
    real = getattr(obj, name)
    left = [failures]

    def f(*args, **kwargs):
        if left[0]:
            left[0] -= 1
            raise RuntimeError("transient failure in the release")
        return real(*args, **kwargs)
    setattr(obj, name, f)


@pytest.mark.parametrize("kind", ["reference", "cuda-host"])
def test_failed_release_stays_queued_and_nothing_is_lost(kind):
    inst = reference(64 * G) if kind == "reference" else cuda_host(64 * G)
    sys_ = build_system(inst)
    try:
        b, gov, ep, mgr = sys_.binding, sys_.governor, sys_.ep, sys_.manager
        h = b.allocate("weights", 3 * G)
        phys, charged, pins = inst.physical_bytes(), gov.charged(), mgr.pins(sys_.context_id)
        assert phys > 0 and charged > 0 and pins >= 1
        _flaky(inst.mechanism.allocator(), "deallocate")
        h.close()
        ep.synchronize()
        with pytest.raises(RuntimeError, match="transient"):
            ep.poll()
        # nothing it holds was dropped: bytes, charge and pin are still there, and it is still queued
        assert ep.pending_releases() == 1 and not h.released
        assert inst.physical_bytes() == phys and gov.charged() == charged and mgr.pins(sys_.context_id) == pins
        with pytest.raises(DoubleFree):
            h.close()                                  # the drop itself is done once
        with pytest.raises(ContextBusy):
            mgr.destroy_context(sys_.context_id)
        assert ep.poll() == 1                          # the retry succeeds
        assert h.released and ep.pending_releases() == 0
        assert inst.physical_bytes() == 0 and gov.charged() == 0 and gov.balanced()
        assert mgr.pins(sys_.context_id) == pins - 1 == 0
        mgr.destroy_context(sys_.context_id)           # no longer busy: nothing was leaked
    finally:
        sys_.close()


def test_failed_release_resumes_after_the_step_that_failed():
    """A release whose refund raises once: on retry the bytes are not freed twice."""
    inst = reference(64 * G)
    sys_ = build_system(inst)
    try:
        b, gov, ep = sys_.binding, sys_.governor, sys_.ep
        h = b.allocate("weights", 3 * G)
        _flaky(gov, "refund")
        h.close()
        with pytest.raises(RuntimeError):
            ep.drain()
        assert inst.physical_bytes() == 0 and gov.charged() > 0     # freed, charge still held
        assert ep.poll() == 1
        assert gov.charged() == 0 and gov.balanced() and h.released
    finally:
        sys_.close()


# -- 10: work after close ---------------------------------------------------------

def test_cuda_host_refuses_work_after_close_and_second_close_is_a_noop():
    inst = cuda_host(16 * G)
    emu = inst.extras["emulator"]
    mech, ep = inst.mechanism, inst.ep
    a = mech.allocator().allocate(AllocationRequest(G))
    va = mech.virtual_backing().reserve(ReserveRequest(2 * G))
    inst.close()
    assert emu.primary_ctx_refcount(0) == 0 and inst.physical_bytes() == 0
    for call in (lambda: mech.allocator().allocate(AllocationRequest(G)),
                 lambda: mech.allocator().deallocate(a),
                 lambda: mech.virtual_backing().reserve(ReserveRequest(G)),
                 lambda: mech.virtual_backing().release(va),
                 lambda: mech.shared_mapping().create(G),
                 lambda: ep.new_stream(), lambda: ep.write(0, a.address, b"x"), lambda: ep.launch(0, [], []),
                 lambda: ep.defer([], lambda: None), lambda: ep.poll(), lambda: ep.synchronize()):
        with pytest.raises(InvalidRequest, match="closed"):
            call()
    assert emu.primary_ctx_refcount(0) == 0          # nothing re-retained the context
    inst.close()                                     # idempotent: nothing left to free
    mech.close()
    ep.close()
    assert emu.primary_ctx_refcount(0) == 0 and inst.physical_bytes() == 0


def test_reference_target_close_is_real():
    inst = reference(16 * G)
    mech, ep, dev = inst.mechanism, inst.ep, inst.extras["device"]
    h = mech.allocator().allocate(AllocationRequest(G))
    f = ep.write(0, h.address, b"abc")
    inst.close()
    assert ep.fence_done is not None and dev.closed and inst.physical_bytes() == 0
    assert ep.pending_releases() == 0 and dev.queued() == 0
    for call in (lambda: mech.allocator().allocate(AllocationRequest(G)),
                 lambda: mech.virtual_backing().reserve(ReserveRequest(G)),
                 lambda: ep.new_stream(), lambda: ep.write(0, h.address, b"x"), lambda: ep.launch(0, [], []),
                 lambda: ep.defer([f], lambda: None)):
        with pytest.raises(MemspecError):
            call()
    inst.close()                                     # second close: a no-op
    assert inst.physical_bytes() == 0
