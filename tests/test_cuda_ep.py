"""The CUDA execution provider on the host driver emulator: event fences,
copies, the stand-in kernel, the deferred-free queue behind a held stream,
context pinning, and the unmap-before-fence mutant shown detectable."""

from __future__ import annotations

import pytest

from memspec.cuda_impl.targets import cuda_host
from memspec.spec.api import ExecutionProvider, Fence, ReserveRequest
from memspec.spec.errors import ContextBusy, DeviceFault, InvalidRequest, ReadOnlyViolation

G = 2 << 20


@pytest.fixture
def t():
    inst = cuda_host(16 * G)
    yield inst
    inst.close()


def test_is_an_execution_provider(t):
    assert isinstance(t.ep, ExecutionProvider)
    assert t.ep.device().kind == "cuda-host"
    assert t.ep.new_stream() == 1


def test_fences_follow_stream_order(t):
    ep, vb = t.ep, t.mechanism.virtual_backing()
    va = vb.reserve(ReserveRequest(G))
    vb.commit_range(va, 0, G)
    s = ep.new_stream()
    gate = ep.hold(s)
    f1 = ep.write(s, va.address, b"one")
    f2 = ep.launch(s, [(va.address, 16)], [(va.address + 64, 16)])
    assert f2 == Fence(s, f1.value + 1)
    assert not ep.fence_done(f1) and not ep.fence_done(f2)
    gate.open()
    assert not ep.fence_done(f1)                          # lazy device: no time yet
    t.extras["emulator"].advance()                        # the device runs
    assert ep.fence_done(f2) and ep.fence_done(f1)
    assert ep.read(s, va.address, 3) == b"one"
    with pytest.raises(InvalidRequest):
        ep.fence_done(Fence(s, 99))
    with pytest.raises(InvalidRequest):
        ep.write(42, va.address, b"x")
    vb.release(va)


def test_launch_touches_without_changing_and_faults_on_unmapped(t):
    ep, vb = t.ep, t.mechanism.virtual_backing()
    va = vb.reserve(ReserveRequest(2 * G))
    vb.commit_range(va, 0, G)
    ep.write(0, va.address, b"keep me")
    ep.launch(0, [(va.address, 7)], [(va.address, 7)])
    assert ep.read(0, va.address, 7) == b"keep me"
    with pytest.raises(DeviceFault):
        ep.launch(0, [(va.address + G, 8)], [])           # reserved, never committed
    with pytest.raises(DeviceFault):
        ep.write(0, va.address + G, b"x")
    vb.release(va)


def test_write_through_read_only_mapping_is_refused(t):
    ep, sm = t.ep, t.mechanism.shared_mapping()
    h = sm.create(G)
    r = sm.reserve(ReserveRequest(G))
    sm.map(h, r, 0, read_only=True)
    with pytest.raises(ReadOnlyViolation):
        ep.write(0, r.address, b"nope")
    with pytest.raises(ReadOnlyViolation):
        ep.launch(0, [], [(r.address, 4)])
    assert ep.read(0, r.address, 4) == b"\0\0\0\0"
    assert t.extras["faults"]() == []                      # refused before any device access


def test_stream_gate_deferred_free(t):
    """Seed 000: *CPU submits kernel, CPU drops the last owning handle, GPU is
    still reading the buffer* -> the release waits for the fence.  Allocation
    used by queued work, dropped, stream held: still mapped and charged;
    open the word: freed and refunded."""
    ep, vb, emu = t.ep, t.mechanism.virtual_backing(), t.extras["emulator"]
    va = vb.reserve(ReserveRequest(4 * G))
    vb.commit_range(va, 0, 4 * G)
    ep.write(0, va.address, b"data")
    ep.synchronize(0)
    s = ep.new_stream()
    gate = ep.hold(s)
    fence = ep.launch(s, [(va.address, 4 * G)], [])       # the kernel reads the whole range
    freed: list[int] = []
    ep.defer([fence], lambda: freed.append(vb.release(va)))   # the drop only enqueues
    assert ep.pending_releases() == 1 and freed == []
    assert ep.poll() == 0 and ep.poll() == 0
    assert not ep.fence_done(fence)
    assert t.physical_bytes() == 4 * G and emu.mapped_pages() == 4       # still mapped and charged
    pins = emu.primary_ctx_refcount(0)
    with pytest.raises(ContextBusy):
        ep.close()                                        # the queued release pins the context
    gate.open()
    ep.synchronize(s)                                     # the held work runs now
    assert ep.poll() == 1 and freed == [4 * G]
    assert t.physical_bytes() == 0 and emu.mapped_pages() == 0           # freed and refunded
    assert ep.pending_releases() == 0
    assert emu.faults == []                               # the kernel never saw an unmapped page
    assert emu.primary_ctx_refcount(0) == pins            # one driver retain for every pin


def test_context_pinned_while_releases_are_queued():
    inst = cuda_host(4 * G)
    ep, vb, emu = inst.ep, inst.mechanism.virtual_backing(), inst.extras["emulator"]
    va = vb.reserve(ReserveRequest(G))
    gate = ep.hold(0)
    f = ep.launch(0, [], [])
    ep.defer([f], lambda: vb.release(va))
    pins = ep.ctx.pins
    assert pins >= 3                                      # EP + mechanism + reservation + queued release
    with pytest.raises(ContextBusy):
        ep.close()
    gate.open()
    ep.synchronize(0)
    assert ep.poll() == 1
    assert ep.ctx.pins == pins - 2                        # the release and the reservation unpinned
    inst.close()
    assert emu.primary_ctx_refcount(0) == 0 and ep.ctx.pins == 0


def test_unmap_before_fence_mutant_is_caught_as_a_fault():
    """The planted cuda.core/vLLM bug: the queue runs the release without
    waiting for the fence, while the stream still holds a read of the range;
    the release is seen before its fence completed (S4), and when the stream
    runs, the read faults."""
    from memspec.invariants.mutants.cuda_bugs import unordered_cuda_host

    bad = unordered_cuda_host(8 * G)
    try:
        ep, vb = bad.ep, bad.mechanism.virtual_backing()
        va = vb.reserve(ReserveRequest(2 * G))
        vb.commit_range(va, 0, 2 * G)
        s = ep.new_stream()
        gate = ep.hold(s)
        fence = ep.launch(s, [(va.address, 2 * G)], [])
        ep.defer([fence], lambda: vb.release(va))
        assert ep.pending_releases() == 1 and bad.physical_bytes() == 2 * G   # the drop only enqueued
        assert ep.poll() == 1                                                  # ... but poll ignores the fence
        assert not ep.fence_done(fence) and bad.physical_bytes() == 0          # freed before the fence: S4
        gate.open()
        with pytest.raises(DeviceFault):
            ep.synchronize(s)
        reasons = [f.reason for f in bad.extras["faults"]()]   # one per 2 MiB scratch chunk of the kernel
        assert reasons and set(reasons) == {"unmapped"}
    finally:
        bad.close()


def test_healthy_ep_same_scenario_has_no_fault(t):
    """The control for the mutant test: same steps, correct EP, no fault."""
    ep, vb = t.ep, t.mechanism.virtual_backing()
    va = vb.reserve(ReserveRequest(2 * G))
    vb.commit_range(va, 0, 2 * G)
    s = ep.new_stream()
    gate = ep.hold(s)
    fence = ep.launch(s, [(va.address, 2 * G)], [])
    ep.defer([fence], lambda: vb.release(va))
    assert ep.pending_releases() == 1 and ep.poll() == 0   # the healthy queue waits
    assert t.physical_bytes() == 2 * G
    gate.open()
    ep.synchronize(s)
    assert ep.poll() == 1 and t.physical_bytes() == 0 and t.extras["faults"]() == []


def test_close_tears_down_everything():
    inst = cuda_host(4 * G)
    emu = inst.extras["emulator"]
    vb = inst.mechanism.virtual_backing()
    va = vb.reserve(ReserveRequest(2 * G))
    vb.commit_range(va, 0, 2 * G)
    inst.ep.hold(inst.ep.new_stream())
    inst.close()                                          # force: opens gates, frees what is left
    assert emu.primary_ctx_refcount(0) == 0
    assert emu.used == 0 and emu.reservations() == 0 and emu.live_handles() == 0


def test_threads_share_the_ep_and_mechanism():
    """4 threads x 150 rounds of reserve/commit/write/launch/drop/poll on one
    target, then drain: every page returned, nothing queued, no fault."""
    import random
    import threading

    inst = cuda_host(4096 * G)     # room for every release still queued (host pages are only touched by copies)
    ep, vb, alloc = inst.ep, inst.mechanism.virtual_backing(), inst.mechanism.allocator()
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            s = ep.new_stream()
            for _ in range(150):
                if rnd.random() < 0.5:
                    va = vb.reserve(ReserveRequest(2 * G))
                    vb.commit_range(va, 0, 2 * G)
                    f = ep.launch(s, [(va.address, 64)], [(va.address + G, 64)])
                    ep.defer([f], lambda va=va: vb.release(va))
                else:
                    from memspec.spec.api import AllocationRequest

                    a = alloc.allocate(AllocationRequest(rnd.randrange(1, 3 * G)))
                    f = ep.write(s, a.address, b"t" * 16)
                    ep.defer([f], lambda a=a: alloc.deallocate(a))
                if rnd.random() < 0.3:
                    ep.synchronize(s)
                ep.poll()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    try:
        assert errors == []
        ep.synchronize()
        ep.poll()
        assert ep.pending_releases() == 0
        assert inst.physical_bytes() == 0 and inst.extras["faults"]() == []
    finally:
        inst.close()
