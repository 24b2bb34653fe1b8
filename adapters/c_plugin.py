"""Plugins in C: ``memspec conform c:path/to/libplugin.so``.

Loads a shared library written against ``adapters/c/memspec_plugin.h``
(ABI version 1) with ctypes and presents it as a seed-000
``DeviceMemoryMechanism``.  Each status code of the ABI becomes the
:mod:`memspec.spec.errors` class the header names; an unknown code is a
:class:`PluginError`.  The loader trusts nothing it gets back: a table with
the wrong ABI version or a missing required entry point is refused, optional
capabilities must be all-or-nothing, and handles are rebuilt from the
library's own fields on every call (the library decides foreign/stale/freed).

Marshalling (the ABI carries ``int64_t`` sizes): a size that is not a Python
``int`` is refused here with InvalidRequest, as a C caller's compiler would
refuse it; one beyond ``int64_t`` is OutOfMemory (no device holds it).

``physical_bytes`` is the library's ``physical_bytes`` entry point (computed
from its free structures, per the header), absent when NULL.  The library's
``create(capacity, share_with)`` with ``share_with`` set gives the *foreign*
twin on the same device.  When the library declares the host memory its
addresses live in (``memory``), the target gets a :class:`HostEP`
(synchronous copies, bounds-checked against that range: an infinitely fast
device) and the data-integrity checks run; otherwise ``ep`` is None.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Callable

from collections import deque

from memspec.spec.api import (
    AllocationRequest,
    DeviceAllocation,
    DeviceKey,
    Fence,
    Identity,
    PhysicalHandle,
    ReserveRequest,
    TargetInstance,
    VirtualAllocation,
    new_creator_id,
)
from memspec.spec import errors as E

ABI_VERSION = 1
INT64_MAX = (1 << 63) - 1

#: status code -> error class (memspec_plugin.h's enum)
STATUS = {
    1: E.InvalidRequest,
    2: E.InvalidRange,
    3: E.OutOfMemory,
    4: E.Unsupported,
    5: E.ForeignAllocation,
    6: E.DoubleFree,
    7: E.StaleHandle,
    8: E.ReadOnlyViolation,
}


class PluginError(E.MemspecError, RuntimeError):
    """The library broke the ABI (bad table, unknown status code...)."""


class Handle(ctypes.Structure):
    _fields_ = [("owner", ctypes.c_uint64), ("generation", ctypes.c_uint64), ("address", ctypes.c_uint64),
                ("size", ctypes.c_uint64), ("footprint", ctypes.c_uint64)]


_vp, _u64, _i64, _i32, _u32 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32, ctypes.c_uint32
_H = ctypes.POINTER(Handle)
_U = ctypes.POINTER(_u64)
F = ctypes.CFUNCTYPE

_VB = ["vb_granularity", "vb_reserve", "vb_commit", "vb_decommit", "vb_committed_bytes", "vb_release"]
_SM = ["sm_granularity", "sm_reserve", "sm_free_reservation", "sm_create", "sm_map", "sm_unmap",
       "sm_copy_on_write", "sm_mapping_count", "sm_release"]


class Table(ctypes.Structure):
    _fields_ = [
        ("abi_version", _u32),
        ("name", ctypes.c_char_p),
        ("create", F(_vp, _u64, _vp)),
        ("destroy", F(None, _vp)),
        ("capacity", F(_u64, _vp)),
        ("physical_bytes", F(_u64, _vp)),
        ("last_error", F(ctypes.c_char_p, _vp)),
        ("memory", F(None, _vp, ctypes.POINTER(_u64), ctypes.POINTER(_u64))),
        ("allocate", F(_i32, _vp, _i64, _u64, _H)),
        ("deallocate", F(_i32, _vp, _H, _U)),
        ("vb_granularity", F(_u64, _vp)),
        ("vb_reserve", F(_i32, _vp, _i64, _u64, _H)),
        ("vb_commit", F(_i32, _vp, _H, _u64, _u64, _U)),
        ("vb_decommit", F(_i32, _vp, _H, _u64, _u64, _U)),
        ("vb_committed_bytes", F(_i32, _vp, _H, _U)),
        ("vb_release", F(_i32, _vp, _H, _U)),
        ("sm_granularity", F(_u64, _vp)),
        ("sm_reserve", F(_i32, _vp, _i64, _u64, _H)),
        ("sm_free_reservation", F(_i32, _vp, _H)),
        ("sm_create", F(_i32, _vp, _i64, _H)),
        ("sm_map", F(_i32, _vp, _H, _H, _u64, _i32, _U)),
        ("sm_unmap", F(_i32, _vp, _H, _u64, _u64, _U)),
        ("sm_copy_on_write", F(_i32, _vp, _H, _u64, _u64, _U)),
        ("sm_mapping_count", F(_i32, _vp, _H, _U)),
        ("sm_release", F(_i32, _vp, _H, _U)),
    ]


def _present(fn: Any) -> bool:
    return bool(ctypes.cast(fn, ctypes.c_void_p).value)


class Library:
    """One loaded plugin library and its checked table."""

    _cache: dict[str, "Library"] = {}
    _lock = threading.Lock()

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise LookupError(f"cannot load C plugin {path!r}: {e}") from e
        try:
            get = self.lib.memspec_plugin_v1
        except AttributeError as e:
            raise LookupError(f"{path!r} does not export memspec_plugin_v1") from e
        get.restype = ctypes.POINTER(Table)
        get.argtypes = []
        ptr = get()
        if not ptr:
            raise LookupError(f"{path!r}: memspec_plugin_v1() returned NULL")
        self.t: Table = ptr.contents
        if self.t.abi_version != ABI_VERSION:
            raise LookupError(f"{path!r}: ABI version {self.t.abi_version}, this loader speaks {ABI_VERSION}")
        missing = [n for n in ("create", "destroy", "capacity", "allocate", "deallocate") if not _present(getattr(self.t, n))]
        if missing:
            raise LookupError(f"{path!r}: required entry points are NULL: {', '.join(missing)}")
        raw = self.t.name
        self.name = raw.decode("utf-8", "replace")[:64] if raw else os.path.basename(path)
        self.has_vb = self._all_or_none(_VB, "VirtualBacking")
        self.has_sm = self._all_or_none(_SM, "SharedMapping")

    def _all_or_none(self, names: list[str], what: str) -> bool:
        got = [n for n in names if _present(getattr(self.t, n))]
        if got and len(got) != len(names):
            raise LookupError(f"{self.path!r}: {what} entry points must be all set or all NULL; "
                              f"missing {', '.join(sorted(set(names) - set(got)))}")
        return bool(got)

    @classmethod
    def load(cls, path: str) -> "Library":
        key = os.path.realpath(path)
        with cls._lock:
            if key not in cls._cache:
                cls._cache[key] = cls(key)
            return cls._cache[key]


class Instance:
    """One ``create()``d plugin instance: handles in and out, statuses to errors."""

    def __init__(self, lib: Library, capacity: int, share_with: "Instance | None" = None) -> None:
        self.lib = lib
        self.t = lib.t
        self.ptr = self.t.create(capacity, share_with.ptr if share_with else None)
        if not self.ptr:
            raise PluginError(f"{lib.name}: create({capacity}) returned NULL")
        self.creator = new_creator_id(f"c:{lib.name}")
        #: creator name -> the library's owner token (to rebuild handles of any instance of this library)
        self.owners = share_with.owners if share_with else {}
        self.key = share_with.key if share_with else DeviceKey(f"c:{lib.name}", 0)
        self.lock = share_with.lock if share_with else threading.RLock()
        self.closed = False

    # -- marshalling ----------------------------------------------------
    def check(self, status: int, call: str) -> None:
        if status == 0:
            return
        cls = STATUS.get(status)
        msg = ""
        if _present(self.t.last_error):
            raw = self.t.last_error(self.ptr)
            msg = raw.decode("utf-8", "replace")[:200] if raw else ""
        if cls is None:
            raise PluginError(f"{self.lib.name}: {call} returned unknown status {status}")
        raise cls(f"{self.lib.name}: {call}: {msg or cls.__name__}")

    @staticmethod
    def size_arg(size: Any, call: str) -> int:
        if not isinstance(size, int) or isinstance(size, bool):
            raise E.InvalidRequest(f"{call}: size {size!r} is not an int (the ABI takes int64_t)")
        if size > INT64_MAX:
            raise E.OutOfMemory(f"{call}: size {size} exceeds int64_t; no device holds it")
        if size < -INT64_MAX:
            raise E.InvalidRequest(f"{call}: size {size} is not positive")
        return size

    @staticmethod
    def u64(v: Any, call: str) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= (1 << 64) - 1:
            raise E.InvalidRange(f"{call}: {v!r} is not a byte offset")
        return v

    def identity(self, h: Handle) -> Identity:
        self.owners[self.creator] = h.owner
        return Identity(self.creator, int(h.generation))

    def handle(self, obj: Any, kind: type, call: str) -> Handle:
        if not isinstance(obj, kind):
            raise E.InvalidRequest(f"{call}: expected a {kind.__name__}, got {type(obj).__name__}")
        ident = obj.identity
        h = Handle()
        h.owner = self.owners.get(ident.creator, 0)  # unknown creator: owner 0, which no instance uses
        h.generation = ident.generation if 0 < ident.generation < (1 << 64) else 0
        h.address = getattr(obj, "address", 0) & ((1 << 64) - 1)
        h.size = obj.size & ((1 << 64) - 1)
        h.footprint = getattr(obj, "footprint", 0) & ((1 << 64) - 1)
        return h

    def call(self, name: str, *args: Any) -> Any:
        with self.lock:
            if self.closed:
                raise E.InvalidRequest(f"{self.lib.name}: instance is destroyed")
            return getattr(self.t, name)(self.ptr, *args)

    def destroy(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                self.t.destroy(self.ptr)


class Allocator:
    """``DeviceAllocator`` over the plugin's allocate/deallocate."""

    def __init__(self, inst: Instance) -> None:
        self.i = inst

    def device(self) -> DeviceKey:
        return self.i.key

    def allocate(self, request: AllocationRequest) -> DeviceAllocation:
        size = self.i.size_arg(request.size, "allocate")
        align = request.alignment if isinstance(request.alignment, int) and request.alignment > 0 else 0
        out = Handle()
        self.i.check(self.i.call("allocate", size, align, ctypes.byref(out)), f"allocate({size})")
        return DeviceAllocation(int(out.address), size, int(out.footprint), self.i.identity(out), self.i.key)

    def deallocate(self, allocation: DeviceAllocation) -> int:
        h = self.i.handle(allocation, DeviceAllocation, "deallocate")
        freed = _u64()
        self.i.check(self.i.call("deallocate", ctypes.byref(h), ctypes.byref(freed)), "deallocate")
        return int(freed.value)


class _Capability:
    def __init__(self, inst: Instance, prefix: str) -> None:
        self.i = inst
        self.p = prefix

    def granularity(self) -> int:
        return int(self.i.call(self.p + "granularity"))

    def reserve(self, request: ReserveRequest) -> VirtualAllocation:
        size = self.i.size_arg(request.size, "reserve")
        align = request.alignment if isinstance(request.alignment, int) and request.alignment >= 0 else 0
        out = Handle()
        self.i.check(self.i.call(self.p + "reserve", size, align, ctypes.byref(out)), f"reserve({size})")
        return VirtualAllocation(int(out.address), int(out.size), self.i.identity(out), self.i.key)

    def _out(self, name: str, *args: Any) -> int:
        out = _u64()
        self.i.check(self.i.call(name, *args, ctypes.byref(out)), name)
        return int(out.value)

    def _res(self, allocation: Any, call: str) -> Any:
        return ctypes.byref(self.i.handle(allocation, VirtualAllocation, call))


class VirtualBacking(_Capability):
    """``VirtualBacking`` over the plugin's vb_* entry points."""

    def __init__(self, inst: Instance) -> None:
        super().__init__(inst, "vb_")

    def commit_range(self, allocation: VirtualAllocation, start: int, end: int) -> int:
        return self._out("vb_commit", self._res(allocation, "commit_range"), self.i.u64(start, "commit_range"),
                         self.i.u64(end, "commit_range"))

    def decommit_range(self, allocation: VirtualAllocation, start: int, end: int) -> int:
        return self._out("vb_decommit", self._res(allocation, "decommit_range"), self.i.u64(start, "decommit_range"),
                         self.i.u64(end, "decommit_range"))

    def committed_bytes(self, allocation: VirtualAllocation) -> int:
        return self._out("vb_committed_bytes", self._res(allocation, "committed_bytes"))

    def release(self, allocation: VirtualAllocation) -> int:
        return self._out("vb_release", self._res(allocation, "release"))


class SharedMapping(_Capability):
    """``SharedMapping`` over the plugin's sm_* entry points."""

    def __init__(self, inst: Instance) -> None:
        super().__init__(inst, "sm_")

    def free_reservation(self, allocation: VirtualAllocation) -> None:
        self.i.check(self.i.call("sm_free_reservation", self._res(allocation, "free_reservation")), "free_reservation")

    def create(self, size: int) -> PhysicalHandle:
        size = self.i.size_arg(size, "create")
        out = Handle()
        self.i.check(self.i.call("sm_create", size, ctypes.byref(out)), f"create({size})")
        return PhysicalHandle(int(out.size), self.i.identity(out), self.i.key)

    def _phys(self, handle: Any, call: str) -> Any:
        return ctypes.byref(self.i.handle(handle, PhysicalHandle, call))

    def map(self, handle: PhysicalHandle, allocation: VirtualAllocation, offset: int, *, read_only: bool) -> int:
        return self._out("sm_map", self._phys(handle, "map"), self._res(allocation, "map"), self.i.u64(offset, "map"),
                         1 if read_only else 0)

    def unmap(self, allocation: VirtualAllocation, offset: int, size: int) -> int:
        return self._out("sm_unmap", self._res(allocation, "unmap"), self.i.u64(offset, "unmap"), self.i.u64(size, "unmap"))

    def copy_on_write(self, allocation: VirtualAllocation, offset: int, size: int) -> int:
        return self._out("sm_copy_on_write", self._res(allocation, "copy_on_write"), self.i.u64(offset, "copy_on_write"),
                         self.i.u64(size, "copy_on_write"))

    def mapping_count(self, handle: PhysicalHandle) -> int:
        return self._out("sm_mapping_count", self._phys(handle, "mapping_count"))

    def release(self, handle: PhysicalHandle) -> int:
        return self._out("sm_release", self._phys(handle, "release"))


class Mechanism:
    """The plugin instance as a ``DeviceMemoryMechanism``."""

    def __init__(self, inst: Instance, *, eager_only: bool = False) -> None:
        self.inst = inst
        self.name = f"c:{inst.lib.name}" + ("-eager" if eager_only else "")
        self._alloc = Allocator(inst)
        self._vb = VirtualBacking(inst) if inst.lib.has_vb and not eager_only else None
        self._sm = SharedMapping(inst) if inst.lib.has_sm and not eager_only else None

    def allocator(self) -> Allocator:
        return self._alloc

    def virtual_backing(self) -> VirtualBacking | None:
        return self._vb

    def shared_mapping(self) -> SharedMapping | None:
        return self._sm


class HostEP:
    """``ExecutionProvider`` for a plugin whose device memory is host memory
    (``[base, base+size)``): every copy and stand-in kernel runs at once
    (fences are done when issued), ``defer`` queues and ``poll`` runs the
    queue.  An access outside the range is a DeviceFault, never a host access."""

    def __init__(self, key: DeviceKey, base: int, size: int) -> None:
        self.context_id = new_creator_id(f"{key.kind}-host-ep")
        self._key = key
        self.base, self.size = base, size
        self._issued: list[int] = []
        self._queue: deque = deque()
        self._lock = threading.Lock()
        self.new_stream()

    def device(self) -> DeviceKey:
        return self._key

    def new_stream(self) -> int:
        with self._lock:
            self._issued.append(0)
            return len(self._issued) - 1

    def _fence(self, stream: Any) -> Fence:
        if not isinstance(stream, int) or isinstance(stream, bool) or not 0 <= stream < len(self._issued):
            raise E.InvalidRequest(f"unknown stream {stream!r}")
        self._issued[stream] += 1
        return Fence(stream, self._issued[stream])

    def _check(self, address: Any, n: Any, what: str) -> None:
        if not (isinstance(address, int) and isinstance(n, int)) or n < 0:
            raise E.InvalidRequest(f"{what}: ({address!r}, {n!r}) is not an address range")
        if n and not (self.base <= address and address + n <= self.base + self.size):
            raise E.DeviceFault(f"{what} at {address:#x}+{n}: outside the plugin's memory", address=address,
                                kind="unmapped")

    def write(self, stream: int, address: int, data: bytes) -> Fence:
        with self._lock:
            self._check(address, len(data), "write")
            f = self._fence(stream)
            ctypes.memmove(address, bytes(data), len(data))
            return f

    def read(self, stream: int, address: int, size: int) -> bytes:
        with self._lock:
            self._check(address, size, "read")
            self._fence(stream)
            return ctypes.string_at(address, size) if size else b""

    def launch(self, stream: int, reads: Any, writes: Any) -> Fence:
        with self._lock:
            for a, n in list(reads) + list(writes):
                self._check(a, n, "kernel")
            for a, n in writes:  # read and write back: the bytes stay as they are
                if n:
                    ctypes.memmove(a, ctypes.string_at(a, n), n)
            return self._fence(stream)

    def fence_done(self, fence: Fence) -> bool:
        if not isinstance(fence, Fence) or not 0 <= fence.stream < len(self._issued) \
                or not 0 <= fence.value <= self._issued[fence.stream]:
            raise E.InvalidRequest(f"{fence!r} was never issued")
        return True

    def synchronize(self, stream: int | None = None) -> None:
        if stream is not None and not 0 <= stream < len(self._issued):
            raise E.InvalidRequest(f"unknown stream {stream!r}")

    def defer(self, fences: Any, release: Callable[[], object]) -> None:
        fences = tuple(fences)
        for f in fences:
            self.fence_done(f)
        if not callable(release):
            raise E.InvalidRequest("release must be callable")
        self._queue.append(release)

    def poll(self) -> int:
        ran, errors = 0, []
        while self._queue:
            r = self._queue.popleft()
            ran += 1
            try:
                r()
            except BaseException as e:  # the entry is consumed either way
                errors.append(e)
        if errors:
            raise errors[0]
        return ran

    def pending_releases(self) -> int:
        return len(self._queue)


def _with_extras(inst: TargetInstance, **extras: Any) -> TargetInstance:
    """The only place this adapter fills ``TargetInstance`` beyond the constructor keywords."""
    inst.extras = dict(extras)
    return inst


def factory(path: str) -> Callable[..., TargetInstance]:
    """The target factory for the plugin at ``path`` (loaded now: a bad
    library is refused before any run)."""
    lib = Library.load(path)

    def make(capacity: int | None = None) -> TargetInstance:
        first = Instance(lib, 0 if capacity is None else int(capacity))
        twins: list[Instance] = []

        def make_foreign(eager_only: bool = False) -> Mechanism:
            t = Instance(lib, 0, share_with=first)
            twins.append(t)
            return Mechanism(t, eager_only=eager_only)

        def close() -> None:
            for t in twins:
                t.destroy()
            first.destroy()

        probe = (lambda: int(first.call("physical_bytes"))) if _present(lib.t.physical_bytes) else None
        ep = None
        if _present(lib.t.memory):
            base, size = _u64(), _u64()
            first.call("memory", ctypes.byref(base), ctypes.byref(size))
            if base.value and size.value:
                ep = HostEP(first.key, int(base.value), int(size.value))
        inst = TargetInstance(mechanism=Mechanism(first), ep=ep, physical_bytes=probe,
                              capacity=int(first.call("capacity")), close=close)
        # the system level's replacement mechanism (eager only, as the system
        # spec assumes): another instance on the same device, so its memory is
        # reachable through the same EP
        return _with_extras(inst, make_foreign=make_foreign,
                            make_extra_mechanism=lambda: make_foreign(eager_only=True))

    make.__name__ = f"c_plugin_{lib.name}"
    make.__doc__ = f"C plugin {lib.name} ({path})"
    return make
