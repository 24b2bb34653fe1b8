"""Test helpers for the harness: a toy spec machine with a toy target (so the
engine is tested on its own), and hostile targets (raise an unexpected
exception type, return the wrong type, hang) built on the toy and on the
reference.

Importable as ``tests.hostile_targets`` from the project root, so the
targets can be named ``tests.hostile_targets:NAME`` on a command line.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

from memspec.spec import api, core
from memspec.spec.errors import DeviceFault, DoubleFree, InvalidRequest, OutOfMemory, StaleHandle

TOY_CAPACITY = 64 * 1024


# --------------------------------------------------------------------------
# The toy spec: an eager allocator with a byte ledger
# --------------------------------------------------------------------------

class ToyState:
    def __init__(self, capacity: int, virtual_backing: bool = False) -> None:
        self.capacity = capacity
        self.virtual_backing = virtual_backing
        self.used = 0
        self.live: dict[int, int] = {}   # ref -> footprint
        self.live_list: list[int] = []
        self.freed: list[int] = []
        self.next_ref = 1


def _alloc_step(s: ToyState, size: int) -> core.Outcomes:
    def bind(a):
        r = s.next_ref
        s.next_ref += 1
        s.live[r] = a.footprint
        s.live_list.append(r)
        s.used += a.footprint
        return r

    branches = [core.Returns("an allocation of footprint >= size",
                             accepts=lambda a: isinstance(a, api.DeviceAllocation) and a.size == size and a.footprint >= size
                             and s.used + a.footprint <= s.capacity,
                             then=bind)]
    if s.used + size > s.capacity - 256:
        branches.append(core.Raises(OutOfMemory, "capacity exhausted"))
    return core.outcomes(*branches, blame="T1")


def _free_step(s: ToyState, ref: int) -> core.Outcomes:
    fp = s.live[ref]

    def drop(_v):
        s.used -= fp
        del s.live[ref]
        s.live_list.remove(ref)
        s.freed.append(ref)

    return core.outcomes(core.Returns(f"{fp}", accepts=lambda v: v == fp, then=drop, witness=lambda: fp), blame="T1",
                         touched=(ref,))


def _free_again_step(s: ToyState, ref: int) -> core.Outcomes:
    return core.outcomes(core.Raises(DoubleFree), core.Raises(StaleHandle), blame="T2")


def _alloc_perform(sut, size):
    return sut.mechanism.allocator().allocate(api.AllocationRequest(size))


def _free_perform(sut, ref):
    return sut.mechanism.allocator().deallocate(sut.ref(ref))


def _bad_size_step(s: ToyState, size: int) -> core.Outcomes:
    return core.only(InvalidRequest, blame="T2")


def _toy_regions(s: ToyState, ref: int, obj) -> core.DataRegion | None:
    """A live allocation's bytes: a fault is T1 (success without backing), a changed byte T3."""
    if ref in s.live and isinstance(obj, api.DeviceAllocation):
        return core.DataRegion("T1", "T3", extent=(obj.address, obj.size))
    return None


def _vb_answer(sut, _r):
    got = sut.mechanism.virtual_backing()
    if got is None:
        return None
    missing = sorted(m for m in ("commit_range", "decommit_range", "reserve", "release") if not callable(getattr(got, m, None)))
    return f"an object that lacks {', '.join(missing)}" if missing else "present"


TOY = core.Machine(
    name="toy",
    doc="A toy eager allocator with a byte ledger (tests of the engine only).",
    init=lambda *, capacity=None, page=None, virtual_backing=False, shared_mapping=False: ToyState(
        capacity or TOY_CAPACITY, virtual_backing),
    actions=[
        core.action(role="allocator", params={"size": core.ints(1, 8192)}, perform=_alloc_perform, weight=3,
                    invariants=("T1",))(_alloc_step),
        core.action(role="allocator", params={"ref": core.pick("live", lambda s: s.live_list)}, perform=_free_perform,
                    weight=2, invariants=("T1",))(_free_step),
        core.action(role="allocator", params={"ref": core.pick("freed", lambda s: s.freed)}, perform=_free_perform,
                    invariants=("T2",))(_free_again_step),
        core.action(role="allocator", params={"size": core.ints(-4, 0)}, perform=_alloc_perform,
                    invariants=("T2",))(_bad_size_step),
    ],
    invariants=[
        core.Invariant("T1", "ledger", "the Governor keeps the accounts",
                       lambda s: None if 0 <= s.used <= s.capacity else f"used {s.used} outside [0, {s.capacity}]"),
        core.Invariant("T2", "errors", "one exception per meaning", lambda s: None),
        core.Invariant("T3", "data", "overlapping allocations are caught", lambda s: None),
        core.Invariant("T4", "virtual", "needs virtual backing", lambda s: None),
        core.Invariant("T5", "capabilities", "an absent capability is None, never a stub", lambda s: None),
    ],
    observations=[
        core.Observation("used bytes", "T1", refs=lambda s, t: (None,), expected=lambda s, r: s.used,
                         observed=lambda sut, r: sut.mechanism.allocator().used_bytes()),
    ],
    regions=_toy_regions,
    start_checks=[core.Observation("virtual_backing()", "T5", refs=lambda s, t: (None,),
                                   expected=lambda s, r: "present" if s.virtual_backing else None,
                                   observed=_vb_answer)],
)
# an action only a mechanism with virtual backing gets: T4 is N/A on the toy
TOY.actions.append(core.action(role="backing", params={}, perform=lambda sut: None, requires=("virtual_backing",),
                               invariants=("T4",))(lambda s: core.outcomes(core.Returns("None"), blame="T4")))
TOY.actions[-1] = core.Action(**{**TOY.actions[-1].__dict__, "name": "reserve"})


# --------------------------------------------------------------------------
# The toy target
# --------------------------------------------------------------------------

class ToyEP:
    context_id = "toy-ctx"

    def __init__(self, size: int = 8 << 20) -> None:
        self.mem = bytearray(size)
        self.mapped: set[int] = set()  # page numbers (256 B) that are mapped
        self.streams = 0

    def device(self):
        return api.DeviceKey("sim")

    def new_stream(self):
        self.streams += 1
        return self.streams

    def _check(self, address, size):
        for p in range(address // 256, (address + size - 1) // 256 + 1):
            if p not in self.mapped:
                raise DeviceFault(f"unmapped page at {p * 256:#x}", address=p * 256)

    def write(self, stream, address, data):
        self._check(address, len(data))
        self.mem[address:address + len(data)] = data
        return api.Fence(stream, 1)

    def read(self, stream, address, size):
        self._check(address, size)
        return bytes(self.mem[address:address + size])

    def synchronize(self, stream=None):
        return None


class ToyAllocator:
    def __init__(self, ep: ToyEP, *, overlap=False, double_free_ok=False, no_map=False, leak_ledger=False) -> None:
        self.ep = ep
        self.ids = api.IdentitySource("toy")
        self.next = 256
        self.live: dict[api.Identity, api.DeviceAllocation] = {}
        self.dead: set[api.Identity] = set()
        self.used = 0
        self.overlap, self.double_free_ok, self.no_map, self.leak_ledger = overlap, double_free_ok, no_map, leak_ledger

    def device(self):
        return api.DeviceKey("sim")

    def used_bytes(self):
        return self.used

    def allocate(self, request):
        size = request.size
        if not isinstance(size, int) or size <= 0:
            raise InvalidRequest(f"size {size!r}")
        fp = (size + 255) // 256 * 256
        if self.used + fp > TOY_CAPACITY - 256:
            raise OutOfMemory(requested=size)
        addr = 256 if self.overlap else self.next
        self.next += fp
        if not self.no_map:
            self.ep.mapped.update(range(addr // 256, (addr + fp) // 256))
        a = api.DeviceAllocation(addr, size, fp, self.ids.new(), self.device())
        self.live[a.identity] = a
        self.used += fp
        return a

    def deallocate(self, allocation):
        if allocation.identity in self.dead:
            if self.double_free_ok:
                return 0
            raise DoubleFree(str(allocation.identity))
        a = self.live.pop(allocation.identity)
        self.dead.add(a.identity)
        if not self.leak_ledger:
            self.used -= a.footprint
        return a.footprint


class ToyMechanism:
    name = "toy"

    def __init__(self, alloc):
        self._alloc = alloc

    def allocator(self):
        return self._alloc

    def virtual_backing(self):
        return None

    def shared_mapping(self):
        return None


def _toy(**bugs):
    def factory(capacity=None):
        ep = ToyEP()
        return api.TargetInstance(mechanism=ToyMechanism(ToyAllocator(ep, **bugs)), ep=ep, capacity=capacity or TOY_CAPACITY)
    return factory


toy = _toy()
toy_overlap = _toy(overlap=True)            # every allocation at the same address: only the data check sees it (T3)
toy_double_free_ok = _toy(double_free_ok=True)  # a double free "succeeds" (T2 outcome)
toy_no_map = _toy(no_map=True)              # allocate succeeds without backing (fault on write, T1)
toy_leak_ledger = _toy(leak_ledger=True)    # the allocator's own ledger never goes down (T1 observation)


# --------------------------------------------------------------------------
# Hostile targets
# --------------------------------------------------------------------------

class _Hostile(ToyAllocator):
    mode = "raise"
    after = 3

    def allocate(self, request):
        self.after -= 1
        if self.after < 0:
            if self.mode == "raise":
                raise KeyError("hostile: not a contract error")
            if self.mode == "wrong-type":
                return "0x1000"
            if self.mode == "hang":
                time.sleep(3600)
            if self.mode == "hang-busy":
                while True:
                    pass
            if self.mode == "hang-lock":
                threading.Event().wait()
            if self.mode == "exit":
                raise SystemExit(3)
            if self.mode == "segfault":
                ctypes.string_at(0)                      # SIGSEGV inside C
            if self.mode == "hang-c-sleep":
                ctypes.CDLL(None).sleep(3600)            # blocks in libc's sleep(): no Python bytecode runs
            if self.mode == "hang-pipe":
                r, _w = os.pipe()
                os.read(r, 1)                            # a blocking read nobody will ever answer
            if self.mode == "os-exit":
                os._exit(0)                              # "success" exit status, no result
            if self.mode == "base-exception":
                raise _HostileBase("not an Exception")
        return super().allocate(request)


def _hostile(mode):
    def factory(capacity=None):
        ep = ToyEP()
        alloc = _Hostile(ep)
        alloc.mode = mode
        return api.TargetInstance(mechanism=ToyMechanism(alloc), ep=ep, capacity=capacity or TOY_CAPACITY)
    return factory


toy_raises = _hostile("raise")
toy_wrong_type = _hostile("wrong-type")
toy_hangs = _hostile("hang")
toy_hangs_busy = _hostile("hang-busy")
toy_hangs_lock = _hostile("hang-lock")
toy_exits = _hostile("exit")
toy_segfaults = _hostile("segfault")
toy_hangs_in_c = _hostile("hang-c-sleep")
toy_hangs_on_pipe = _hostile("hang-pipe")
toy_os_exits = _hostile("os-exit")
toy_raises_base_exception = _hostile("base-exception")


class _HostileBase(BaseException):
    """A BaseException that is neither SystemExit nor KeyboardInterrupt."""


def toy_factory_raises(capacity=None):
    raise RuntimeError("hostile factory")


def toy_factory_exits_0(capacity=None):
    sys.exit(0)                       # would turn a run green if the harness took it for the end


def toy_factory_os_exits(capacity=None):
    os._exit(0)


def toy_factory_hangs(capacity=None):
    ctypes.CDLL(None).sleep(3600)


def toy_factory_base_exception(capacity=None):
    raise _HostileBase("hostile factory")


def toy_factory_segfaults(capacity=None):
    ctypes.string_at(0)


# Hostile wrappers of the reference mechanism (used once it exists).

class _HostileAllocatorProxy:
    def __init__(self, inner, mode, after=2):
        self._inner, self._mode, self._after = inner, mode, after

    def __getattr__(self, k):
        return getattr(self._inner, k)

    def allocate(self, request):
        self._after -= 1
        if self._after < 0:
            if self._mode == "raise":
                raise KeyError("hostile")
            if self._mode == "wrong-type":
                return 12345
            if self._mode == "hang":
                time.sleep(3600)
        return self._inner.allocate(request)


class _HostileMechanismProxy:
    def __init__(self, inner, mode):
        self._inner = inner
        self._alloc = _HostileAllocatorProxy(inner.allocator(), mode)
        self.name = getattr(inner, "name", "hostile")

    def __getattr__(self, k):
        return getattr(self._inner, k)

    def allocator(self):
        return self._alloc


def _reference_hostile(mode):
    def factory(capacity=None):
        from memspec.reference.targets import reference_eager

        inst = reference_eager(capacity) if capacity is not None else reference_eager()
        inst.mechanism = _HostileMechanismProxy(inst.mechanism, mode)
        return inst
    return factory


reference_raises = _reference_hostile("raise")
reference_wrong_type = _reference_hostile("wrong-type")
reference_hangs = _reference_hostile("hang")


class _StubCapabilityMechanism(ToyMechanism):
    def virtual_backing(self):
        return object()   # a "present" capability that implements nothing: a silent no-op in disguise


def toy_stub_capability(capacity=None):
    ep = ToyEP()
    return api.TargetInstance(mechanism=_StubCapabilityMechanism(ToyAllocator(ep)), ep=ep,
                              capacity=capacity or TOY_CAPACITY)
