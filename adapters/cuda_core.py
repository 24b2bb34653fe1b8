"""cuda.core under the suite: ``cuda-core-vmm`` and ``cuda-core-mr``.

``cuda-core-vmm`` -- cuda.core's ``VirtualMemoryResource`` (pure Python over
the CUDA VMM calls) as a seed-000 *DeviceAllocator*: ``allocate`` is
``mr.allocate(size, stream=s)``, ``deallocate`` is ``mr.deallocate(ptr,
size, stream=s)`` (``s``: the target EP's stream 0), and the allocator's
extra :meth:`VmmAllocator.grow` is ``mr.modify_allocation`` (growth that may
move the buffer).  ``virtual_backing()`` and ``shared_mapping()`` answer
``None``: the resource has no reserve/commit/map API of its own, and its
growth may change the address, which no spec machine models yet (see
docs/FINDINGS.md).

Where it runs: on a GPU over the real driver; without one over memspec's host
driver emulator (:mod:`memspec.cuda_impl.hostdrv`, same names, argument
conventions and return tuples as ``cuda.bindings.driver``).  cuda.core's
module calls the driver only through its module-global ``driver``;
:func:`cuda_core_driver` points that global at a switch that forwards every
``cu*`` call to the backend of the adapter making the call (and binding types
to ``cuda.bindings.driver``).  On the emulator three more globals need a
stand-in, because they reach the real driver library: ``Buffer`` (Cython
``Buffer.from_handle``), ``raise_if_driver_error`` (formats through the real
``cuGetErrorName``) and ``cuda.core._stream.Stream_accept`` (only a real
``Stream`` passes).  On a GPU only ``driver`` is switched, to a pass-through
that enforces the target's ``capacity`` on ``cuMemCreate``.  Everything is
restored when the last instance closes (or the ``with`` block ends).

The handle identities are the adapter's: cuda.core's ``Buffer`` is the
owner, and a ``DeviceAllocation`` names one Buffer by an identity minted here
(foreign, double and stale frees are refused by this bookkeeping, never sent
to cuda.core).  What cuda.core does with the bytes is checked against the
device: ``physical_bytes`` is ``cuMemGetInfo``'s ``total - free``.

``cuda-core-mr`` -- any cuda.core ``MemoryResource`` by import path
(``MEMSPEC_OPTION_RESOURCE=cuda.core:DeviceMemoryResource``, the default),
GPU only.  Its API is pointer + size, so the adapter invents the handle
identities (a ``DeviceAllocation`` names one ``Buffer``); the physical probe
is ``cuMemGetInfo``, which pooled resources legitimately keep short (the pool
keeps freed memory), so a pooling resource is expected to fail S5's physical
probe by design: read its report with that in mind.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from memspec.spec.api import (
    AllocationRequest,
    AllocatorGeometry,
    FootprintBound,
    DeviceAllocation,
    DeviceKey,
    IdentitySource,
    MiB,
    TargetInstance,
)
from memspec.spec.errors import DoubleFree, ForeignAllocation, InvalidRequest, OutOfMemory, StaleHandle

from memspec.adapters._common import TargetUnavailable, load_object, option, require_gpu, require_module

#: default capacity of the emulated device
DEFAULT_HOST_CAPACITY = 256 * MiB
GRANULARITY = 2 * MiB

_backend: contextvars.ContextVar[Any] = contextvars.ContextVar("memspec_cuda_core_backend", default=None)


# --------------------------------------------------------------------------
# The injection (one place; undone when the last user leaves)
# --------------------------------------------------------------------------

class _DriverSwitch:
    """Stands in for ``cuda.bindings.driver`` inside cuda.core's VMM module:
    ``cu*`` functions go to the backend of the adapter call in progress,
    everything else (types, enums) to the real binding module."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        if name.startswith("cu"):
            b = _backend.get()
            # outside an adapter call (other users of cuda.core in the process): the real driver
            return getattr(self._real if b is None else b, name)
        return getattr(self._real, name)


class HostBuffer:
    """Stand-in for cuda.core's ``Buffer`` on the emulator: what the VMM
    module uses of it (``from_handle``, ``handle``, ``size``/``_size``,
    ``is_closed``, ``_clear``, ``close``)."""

    def __init__(self, ptr: Any, size: int, mr: Any) -> None:
        self.handle = int(ptr)
        self._size = int(size)
        self.memory_resource = mr
        self.is_closed = False

    @classmethod
    def from_handle(cls, ptr: Any, size: int, mr: Any = None, owner: Any = None) -> "HostBuffer":
        return cls(ptr, size, mr)

    @property
    def size(self) -> int:
        return self._size

    def _clear(self) -> None:
        self.handle, self._size, self.is_closed = 0, 0, True

    def close(self, stream: Any = None) -> None:
        if not self.is_closed:
            self.memory_resource.deallocate(self.handle, self._size, stream=stream)
            self._clear()


@dataclass(frozen=True)
class HostStream:
    """Stand-in for a cuda.core ``Stream`` on the emulator: the emulated ``CUstream``."""

    handle: Any


def _host_raise_if_driver_error(res: Any) -> None:
    from cuda.bindings import driver as cu

    from memspec.cuda_impl.driver import error_for

    if res != cu.CUresult.CUDA_SUCCESS:
        raise error_for(res, "cuda.core VirtualMemoryResource")


class _Injection:
    """Reference-counted patch of cuda.core's module globals (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.saved: list[tuple[Any, str, Any]] = []
        self.host_users = 0

    def enter(self, host: bool) -> None:
        import cuda.core._memory._virtual_memory_resource as vmr
        import cuda.core._stream as cstream
        from cuda.bindings import driver as real

        with self.lock:
            if self.users == 0:
                self._set(vmr, "driver", _DriverSwitch(real))
            if host and self.host_users == 0:
                orig_accept = cstream.Stream_accept

                def stream_accept(arg: Any, *a: Any, **kw: Any) -> Any:
                    return arg if isinstance(arg, HostStream) else orig_accept(arg, *a, **kw)

                self._set(vmr, "Buffer", HostBuffer)
                self._set(vmr, "raise_if_driver_error", _host_raise_if_driver_error)
                self._set(cstream, "Stream_accept", stream_accept)
            self.users += 1
            self.host_users += int(host)

    def _set(self, mod: Any, name: str, value: Any) -> None:
        self.saved.append((mod, name, getattr(mod, name)))
        setattr(mod, name, value)

    def leave(self, host: bool) -> None:
        with self.lock:
            self.users -= 1
            self.host_users -= int(host)
            keep = 1 if self.users else 0
            if self.host_users == 0 or self.users == 0:
                # undo in reverse order: host stand-ins first, the switch when nobody is left
                while len(self.saved) > keep:
                    mod, name, value = self.saved.pop()
                    setattr(mod, name, value)

    def active(self) -> bool:
        return self.users > 0


INJECTION = _Injection()


@contextlib.contextmanager
def cuda_core_driver(backend: Any, *, host: bool) -> Iterator[None]:
    """Run cuda.core's VirtualMemoryResource over ``backend`` for the block:
    the module globals are patched (see the module docstring) and calls made
    in the block go to ``backend``.  ``host``: the emulator (also replace
    ``Buffer``, ``raise_if_driver_error``, ``Stream_accept``)."""
    INJECTION.enter(host)
    token = _backend.set(backend)
    try:
        yield
    finally:
        _backend.reset(token)
        INJECTION.leave(host)


class _LimitedDriver:
    """The real binding with a byte limit on ``cuMemCreate`` (GPU runs at a
    chosen capacity); every other call passes through unchanged."""

    def __init__(self, real: Any, limit: int | None) -> None:
        self._real = real
        self.limit = limit
        res, free, total = real.cuMemGetInfo()
        self.baseline = int(total) - int(free)

    def cuMemCreate(self, size: Any, prop: Any, flags: Any) -> Any:
        if self.limit is not None:
            _res, free, total = self._real.cuMemGetInfo()
            if int(total) - int(free) - self.baseline + int(size) > self.limit:
                return (self._real.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
        return self._real.cuMemCreate(size, prop, flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


# --------------------------------------------------------------------------
# DeviceAllocator over a cuda.core MemoryResource
# --------------------------------------------------------------------------

def _cuda_error_name(e: BaseException) -> str:
    name = getattr(e, "name", None)
    if isinstance(name, str) and name.startswith("CUDA_ERROR"):
        return name
    text = str(e)
    for word in text.replace(":", " ").replace(",", " ").split():
        if word.startswith("CUDA_ERROR_"):
            return word
    return ""


def translate(e: BaseException, what: str) -> BaseException:
    """cuda.core's failures as the contract's errors: out of memory ->
    OutOfMemory; an invalid value or a size Python cannot use -> InvalidRequest;
    anything else unchanged (the harness reports it as unexpected)."""
    if isinstance(e, (OutOfMemory, InvalidRequest)):
        return e
    name = _cuda_error_name(e)
    if name == "CUDA_ERROR_OUT_OF_MEMORY" or isinstance(e, MemoryError):
        return OutOfMemory(f"{what}: {e}")
    if name == "CUDA_ERROR_INVALID_VALUE" or isinstance(e, (TypeError, ValueError, OverflowError)):
        return InvalidRequest(f"{what}: {type(e).__name__}: {e}")
    return e


class MemoryResourceAllocator:
    """``DeviceAllocator`` over a cuda.core ``MemoryResource``: Buffers are
    owned here, named by identities minted here."""

    kind = "cuda-core-mr"

    def __init__(self, mr: Any, backend: Any, key: DeviceKey, stream: Any, *, host: bool) -> None:
        self.mr = mr
        self.backend = backend
        self.key = key
        self.stream = stream
        self.host = host
        self.ids = IdentitySource(self.kind)
        self.live: dict[Any, Any] = {}
        self.freed: set[Any] = set()
        self._lock = threading.RLock()

    def _on(self) -> Any:
        return cuda_core_driver(self.backend, host=self.host)

    def device(self) -> DeviceKey:
        return self.key

    def allocate(self, request: AllocationRequest) -> DeviceAllocation:
        size = request.size
        align = request.alignment
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            # cuda.core's allocate takes no alignment: the contract's check is made here
            raise InvalidRequest(f"alignment must be a power of two, got {align!r}")
        if align > GRANULARITY:
            # cuda.core aligns every reservation to its resource's addr_align (the granularity by
            # default), fixed per resource: a larger alignment cannot be asked per allocation
            raise InvalidRequest(f"alignment {align:#x} above this resource's addr_align {GRANULARITY:#x}")
        with self._lock, self._on():
            try:
                buf = self.mr.allocate(size, stream=self.stream)
            except Exception as e:  # noqa: BLE001 - translated, or re-raised as is
                raise translate(e, f"allocate({size!r})") from e
            ident = self.ids.new()
            self.live[ident] = buf
            return DeviceAllocation(int(buf.handle), size, int(buf.size), ident, self.key)

    def _take(self, allocation: Any) -> Any:
        if not isinstance(allocation, DeviceAllocation):
            raise InvalidRequest(f"expected a DeviceAllocation, got {type(allocation).__name__}")
        ident = allocation.identity
        if ident.creator != self.ids.creator:
            raise ForeignAllocation(f"{ident} was not made by {self.ids.creator}")
        buf = self.live.pop(ident, None)
        if buf is None:
            if ident in self.freed:
                raise DoubleFree(f"{ident} was already freed")
            raise StaleHandle(f"{ident} is not a live allocation of {self.ids.creator}")
        self.freed.add(ident)
        return buf

    def deallocate(self, allocation: DeviceAllocation) -> int:
        """Free through ``mr.deallocate(ptr, size, stream=s)``; return the
        footprint cuda.core was asked to free (it returns nothing; the
        physical probe checks what really happened)."""
        with self._lock, self._on():
            buf = self._take(allocation)
            self.mr.deallocate(buf.handle, buf.size, stream=self.stream)
            _forget(buf)
            return allocation.footprint

    def close(self) -> None:
        """Free every live Buffer (best effort, at teardown)."""
        with self._lock, self._on():
            for ident, buf in list(self.live.items()):
                try:
                    self.mr.deallocate(buf.handle, buf.size, stream=self.stream)
                except Exception:  # noqa: BLE001 - teardown: the device goes away next
                    pass
                _forget(buf)
                del self.live[ident]


def _forget(buf: Any) -> None:
    """The Buffer no longer owns the memory (so its destructor frees nothing)."""
    clear = getattr(buf, "_clear", None)
    if clear is not None:
        try:
            clear()
        except Exception:  # noqa: BLE001
            pass


class VmmAllocator(MemoryResourceAllocator):
    """The ``VirtualMemoryResource`` allocator, plus growth."""

    kind = "cuda-core-vmm"

    def grow(self, allocation: DeviceAllocation, new_size: int) -> DeviceAllocation:
        """``mr.modify_allocation(buf, new_size)``: the same identity, maybe a
        new address (cuda.core moves the buffer when it cannot extend the VA
        range in place).  Outside the spec (no machine models a growable
        allocation that may move)."""
        with self._lock, self._on():
            if allocation.identity not in self.live:
                self._take(allocation)  # raises the right error
            buf = self.live[allocation.identity]
            try:
                new = self.mr.modify_allocation(buf, new_size)
            except Exception as e:  # noqa: BLE001
                raise translate(e, f"modify_allocation({new_size!r})") from e
            self.live[allocation.identity] = new
            return DeviceAllocation(int(new.handle), new_size, int(new.size), allocation.identity, self.key)


class Mechanism:
    """A ``DeviceMemoryMechanism`` with only the allocator."""

    def __init__(self, name: str, alloc: MemoryResourceAllocator) -> None:
        self.name = name
        self._alloc = alloc

    def allocator(self) -> MemoryResourceAllocator:
        return self._alloc

    def virtual_backing(self) -> None:
        return None

    def shared_mapping(self) -> None:
        return None


# --------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------

def host_vmm() -> Any:
    """A VirtualMemoryResource without ``Device(0)`` (which needs the real
    driver): ``__new__`` plus the attributes ``__init__`` would set."""
    from cuda.core._memory._virtual_memory_resource import VirtualMemoryResource, VirtualMemoryResourceOptions

    class _Dev:
        device_id = 0

    mr = VirtualMemoryResource.__new__(VirtualMemoryResource)
    mr.config = VirtualMemoryResourceOptions()
    mr.device = _Dev()
    return mr


def _ep_stream(ep: Any, index: int = 0) -> Any:
    """The ``CUstream`` behind the EP's stream ``index``."""
    return ep._streams[index].cu  # the EP has no public accessor for driver handles


def _with_extras(inst: TargetInstance, **extras: Any) -> TargetInstance:
    """The only place this adapter fills ``TargetInstance`` beyond the constructor keywords."""
    inst.extras = dict(extras)
    return inst


def driver_of(inst: TargetInstance) -> Any:
    """The checked :class:`~memspec.cuda_impl.driver.Driver` of an instance made here (read back from
    what :func:`_with_extras` stored: the other place to port)."""
    return inst.extras["driver"]


@dataclass
class _Bench:
    """What one cuda-core target instance is made of."""

    drv: Any
    ctx: Any
    ep: Any
    host: bool
    backend: Any


def _bench(capacity: int | None, target: str) -> _Bench:
    from memspec.cuda_impl.context import PrimaryContext
    from memspec.cuda_impl.driver import open_driver
    from memspec.cuda_impl.ep import CudaExecutionProvider

    require_module("cuda.core", target)
    drv = open_driver(None, capacity=DEFAULT_HOST_CAPACITY if capacity is None else int(capacity),
                      granularity=GRANULARITY)
    host = drv.kind == "cuda-host"
    ctx = PrimaryContext(drv, 0)
    ep = CudaExecutionProvider(drv, ctx)
    backend = drv.backend if host else _LimitedDriver(drv.backend, capacity)
    return _Bench(drv, ctx, ep, host, backend)


def _release_leaked_handles(emulator: Any) -> None:
    """Teardown on the emulator only: release physical handles nothing maps
    any more (the creation references cuda.core never released), so the
    memfds behind them are closed.  Reads the emulator's handle table."""
    for h, phys in list(emulator._physical.items()):
        while phys.refs > 0 and phys.mappings == 0 and h in emulator._physical:
            emulator.cuMemRelease(h)


def _instance(b: _Bench, make_alloc: Callable[[], MemoryResourceAllocator], name: str,
              capacity: int | None, *, enforce_limit: bool = True) -> TargetInstance:
    INJECTION.enter(b.host)
    made: list[MemoryResourceAllocator] = []
    try:
        alloc = make_alloc()
    except BaseException:
        INJECTION.leave(b.host)
        b.ep.close(force=True)
        raise
    made.append(alloc)
    free, total = b.drv.mem_info()
    baseline = total - free

    def physical_bytes() -> int:
        f, t = b.drv.mem_info()
        return (t - f) - baseline

    def make_foreign() -> Mechanism:
        a = make_alloc()
        made.append(a)
        return Mechanism(f"{name}-twin", a)

    closed = [False]

    def close() -> None:
        if closed[0]:
            return
        closed[0] = True
        try:
            for a in made:
                a.close()
            b.ep.close(force=True)
            if b.host:
                _release_leaked_handles(b.drv.emulator)
        finally:
            INJECTION.leave(b.host)

    if b.host:
        cap = b.drv.emulator.capacity
    elif enforce_limit:
        cap = total if capacity is None else min(int(capacity), total)
    else:  # the limit cannot be enforced inside a Cython resource: what is free now
        cap = free - free % GRANULARITY
    # VMM's documented geometry: physical memory in granularity pages (cuMemCreate),
    # nothing else taken from the device
    inst = TargetInstance(mechanism=Mechanism(name, alloc), ep=b.ep, physical_bytes=physical_bytes,
                          capacity=cap, close=close,
                          geometry=AllocatorGeometry(unit=GRANULARITY, alignment=256, bound=FootprintBound("unit"),
                                                     overhead=0, max_alignment=GRANULARITY))
    # make_extra_mechanism: the system level's replacement mechanism must be reachable
    # through this target's EP (the reference default lives on a detached simulated device)
    return _with_extras(inst, make_foreign=make_foreign, make_extra_mechanism=make_foreign, driver=b.drv,
                        emulator=b.drv.emulator)


def cuda_core_vmm(capacity: int | None = None) -> TargetInstance:
    """cuda.core's VirtualMemoryResource: on the real driver when a GPU is
    present (``MEMSPEC_CUDA_DRIVER=auto``), else on the host emulator."""
    b = _bench(capacity, "cuda-core-vmm")

    def make() -> VmmAllocator:
        if b.host:
            mr = host_vmm()
            stream: Any = HostStream(_ep_stream(b.ep))
        else:
            from cuda.core import Device, Stream
            from cuda.core._memory._virtual_memory_resource import VirtualMemoryResource

            Device(0).set_current()
            mr = VirtualMemoryResource(0)
            stream = Stream.from_handle(int(_ep_stream(b.ep)))
        return VmmAllocator(mr, b.backend, DeviceKey(b.drv.kind, 0), stream, host=b.host)

    return _instance(b, make, "cuda-core-vmm", capacity)


def cuda_core_mr(capacity: int | None = None) -> TargetInstance:
    """Any cuda.core MemoryResource, named by ``MEMSPEC_OPTION_RESOURCE``
    (``package.module:Class``, default ``cuda.core:DeviceMemoryResource``),
    constructed as ``Class(0)``.  GPU only."""
    spec = option("resource", "cuda.core:DeviceMemoryResource")
    require_module("cuda.core", "cuda-core-mr")
    require_gpu("cuda-core-mr")
    try:
        cls = load_object(spec)
    except Exception as e:  # noqa: BLE001
        raise TargetUnavailable(f"target 'cuda-core-mr': cannot load MEMSPEC_OPTION_RESOURCE={spec!r}: {e}") from e
    b = _bench(capacity, "cuda-core-mr")

    def make() -> MemoryResourceAllocator:
        from cuda.core import Device, Stream

        Device(0).set_current()
        return MemoryResourceAllocator(cls(0), b.backend, DeviceKey(b.drv.kind, 0),
                                       Stream.from_handle(int(_ep_stream(b.ep))), host=False)

    return _instance(b, make, f"cuda-core-mr:{spec}", capacity, enforce_limit=False)
