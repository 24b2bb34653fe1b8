"""A thin facade over ``cuda.bindings.driver`` (or the host emulator) that
checks every ``CUresult``.

``drv.cuMemCreate(size, prop, 0)`` returns the outputs without the result
(one value, a tuple of several, or None) and raises :class:`CudaError`
carrying the result's name (``CUDA_ERROR_INVALID_VALUE``...) on anything but
``CUDA_SUCCESS``.  ``CUDA_ERROR_OUT_OF_MEMORY`` raises :class:`CudaOutOfMemory`
(also a :class:`~memspec.spec.errors.OutOfMemory`), ``CUDA_ERROR_ILLEGAL_ADDRESS``
raises :class:`CudaFault` (also a :class:`~memspec.spec.errors.DeviceFault`).
Results that are answers rather than failures (``CUDA_ERROR_NOT_READY`` from
``cuEventQuery``) are read with :meth:`Driver.query`.

Which driver: ``MEMSPEC_CUDA_DRIVER=auto|cuda|host`` (default ``auto``: the
real driver when ``cuInit`` succeeds, else the host emulator).  Nothing here
loads the driver at import time.
"""

from __future__ import annotations

import os
from typing import Any

from memspec.spec.errors import DeviceFault, MemspecError, OutOfMemory


class CudaError(MemspecError, RuntimeError):
    """A driver call returned something other than ``CUDA_SUCCESS``."""

    def __init__(self, result: Any, call: str, detail: str = "") -> None:
        self.result = result
        self.name = getattr(result, "name", str(result))
        self.call = call
        msg = f"{call} failed: {self.name}"
        if detail:
            msg += f" ({detail})"
        Exception.__init__(self, msg)


class CudaOutOfMemory(CudaError, OutOfMemory):
    """``CUDA_ERROR_OUT_OF_MEMORY``: the device had no physical memory for the call."""

    def __init__(self, result: Any, call: str, detail: str = "", *, requested: int | None = None,
                 free: int | None = None, total: int | None = None) -> None:
        CudaError.__init__(self, result, call, detail)
        self.requested = requested
        self.total_capacity = total
        self.free = free
        self.allocated = None
        self.reserved = None
        self.reserved_unallocated = None
        self.largest_free_block = None
        self.device = 0


class CudaFault(CudaError, DeviceFault):
    """``CUDA_ERROR_ILLEGAL_ADDRESS``: device work touched an unmapped or protected page."""

    def __init__(self, result: Any, call: str, detail: str = "", *, address: int | None = None) -> None:
        CudaError.__init__(self, result, call, detail)
        self.address = address
        self.kind = "illegal_address"


class DriverUnavailable(MemspecError, RuntimeError):
    """The real CUDA driver cannot be loaded or initialised on this machine."""


_SPECIAL = {
    "CUDA_ERROR_OUT_OF_MEMORY": CudaOutOfMemory,
    "CUDA_ERROR_ILLEGAL_ADDRESS": CudaFault,
}


def error_for(result: Any, call: str, detail: str = "") -> CudaError:
    cls = _SPECIAL.get(getattr(result, "name", ""), CudaError)
    return cls(result, call, detail)


class Driver:
    """Checked calls into ``backend`` (``cuda.bindings.driver`` or a
    :class:`~memspec.cuda_impl.hostdrv.HostDriver`).

    ``kind`` is ``"cuda"`` (real driver) or ``"cuda-host"`` (emulator);
    ``types`` is ``cuda.bindings.driver`` for the binding types either way;
    ``emulator`` is the HostDriver or None.
    """

    def __init__(self, backend: Any, kind: str) -> None:
        from cuda.bindings import driver as types

        self.backend = backend
        self.kind = kind
        self.types = types
        self.emulator = backend if kind == "cuda-host" else None
        self._success = types.CUresult.CUDA_SUCCESS
        #: optional budget (bytes) on top of the device: cuMemCreate/cuMemAlloc
        #: fail with CUDA_ERROR_OUT_OF_MEMORY once (total - free - limit_baseline)
        #: would exceed it; lets a real GPU show OOM at a chosen capacity
        self.limit: int | None = None
        self.limit_baseline = 0

    def set_limit(self, limit: int | None) -> None:
        """Cap the bytes this process may take from now on (None: the device's own capacity)."""
        self.limit = None
        if limit is not None:
            free, total = self.mem_info()
            self.limit_baseline = total - free
            self.limit = int(limit)

    def call(self, name: str, *args: Any) -> Any:
        """Call ``name``; raise :class:`CudaError` unless it succeeded; return its outputs."""
        if self.limit is not None and name in ("cuMemCreate", "cuMemAlloc"):
            free, total = self.mem_info()
            if total - free - self.limit_baseline + int(args[0]) > self.limit:
                raise CudaOutOfMemory(self.types.CUresult.CUDA_ERROR_OUT_OF_MEMORY, name,
                                      f"over the {self.limit}-byte limit", requested=int(args[0]))
        out = getattr(self.backend, name)(*args)
        res = out[0]
        if res != self._success:
            raise error_for(res, name)
        if len(out) == 1:
            return None
        if len(out) == 2:
            return out[1]
        return tuple(out[1:])

    def query(self, name: str, *args: Any) -> Any:
        """Call ``name`` and return its CUresult unchecked (for NOT_READY answers)."""
        return getattr(self.backend, name)(*args)[0]

    def check(self, res: Any, name: str) -> None:
        if res != self._success:
            raise error_for(res, name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("cu"):
            def checked(*args: Any, _name: str = name) -> Any:
                return self.call(_name, *args)
            checked.__name__ = name
            return checked
        raise AttributeError(name)

    # convenience ----------------------------------------------------------
    def mem_info(self) -> tuple[int, int]:
        """``(free, total)`` from ``cuMemGetInfo``."""
        free, total = self.call("cuMemGetInfo")
        return int(free), int(total)

    def allocation_prop(self, ordinal: int) -> Any:
        t = self.types
        prop = t.CUmemAllocationProp()
        prop.type = t.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = t.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = ordinal
        return prop

    def access_desc(self, ordinal: int, *, read_only: bool) -> Any:
        t = self.types
        desc = t.CUmemAccessDesc()
        desc.location.type = t.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = ordinal
        desc.flags = (t.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ if read_only
                      else t.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return desc


def _real_backend() -> Any:
    """``cuda.bindings.driver`` after a successful ``cuInit(0)``, else DriverUnavailable."""
    try:
        from cuda.bindings import driver as cu
    except ImportError as e:  # pragma: no cover - cuda-python is a dependency
        raise DriverUnavailable(f"cuda-python is not installed: {e}") from e
    try:
        (res,) = cu.cuInit(0)
    except Exception as e:  # the library itself cannot be loaded
        raise DriverUnavailable(f"the CUDA driver library cannot be loaded: {e}") from e
    if res != cu.CUresult.CUDA_SUCCESS:
        raise DriverUnavailable(f"cuInit(0) failed: {res.name}")
    try:
        res, count = cu.cuDeviceGetCount()
    except Exception as e:  # pragma: no cover
        raise DriverUnavailable(f"cuDeviceGetCount failed: {e}") from e
    if res != cu.CUresult.CUDA_SUCCESS or count < 1:
        raise DriverUnavailable("no CUDA device is present")
    return cu


def real_driver_available() -> tuple[bool, str]:
    """(True, "") when the real driver initialises, else (False, why)."""
    try:
        _real_backend()
    except DriverUnavailable as e:
        return False, str(e)
    return True, ""


def open_driver(which: str | None = None, **host_options: Any) -> Driver:
    """A checked :class:`Driver`: ``which`` is ``"cuda"``, ``"host"`` or
    ``"auto"`` (default: ``$MEMSPEC_CUDA_DRIVER`` or ``auto``).  ``host_options``
    go to :class:`~memspec.cuda_impl.hostdrv.HostDriver` (capacity, granularity...)."""
    which = (which or os.environ.get("MEMSPEC_CUDA_DRIVER") or "auto").lower()
    if which not in ("auto", "cuda", "host"):
        raise ValueError(f"MEMSPEC_CUDA_DRIVER must be auto, cuda or host, not {which!r}")
    if which in ("auto", "cuda"):
        try:
            return Driver(_real_backend(), "cuda")
        except DriverUnavailable:
            if which == "cuda":
                raise
    from memspec.cuda_impl.hostdrv import HostDriver

    backend = HostDriver(**host_options)
    drv = Driver(backend, "cuda-host")
    drv.cuInit(0)
    return drv
