"""Host driver emulator: constants, host syscalls, argument checks and the emulator's state records.

Part of :mod:`memspec.cuda_impl.hostdrv` (split along its sections, each module
under 1,200 lines); every name here is a name of that module: import from there.
"""

from __future__ import annotations

import ctypes
import mmap as _mmap
import os
import resource
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from cuda.bindings import driver as _cu

R = _cu.CUresult
SUCCESS = R.CUDA_SUCCESS

MiB = 1 << 20

PROT_NONE = 0
PROT_READ = 1
PROT_WRITE = 2
MAP_SHARED = _mmap.MAP_SHARED
MAP_PRIVATE = _mmap.MAP_PRIVATE
MAP_ANONYMOUS = _mmap.MAP_ANONYMOUS
MAP_FIXED = 0x10
MAP_NORESERVE = 0x4000
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.restype = ctypes.c_int
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

ACCESS_NONE = int(_cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE)
ACCESS_READ = int(_cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ)
ACCESS_RW = int(_cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
_HOST_PROT = {ACCESS_NONE: PROT_NONE, ACCESS_READ: PROT_READ, ACCESS_RW: PROT_READ | PROT_WRITE}

WAIT_GEQ = int(_cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
WAIT_EQ = int(_cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_EQ)
WAIT_AND = int(_cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_AND)
WAIT_NOR = int(_cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_NOR)
HOSTALLOC_DEVICEMAP = int(_cu.CU_MEMHOSTALLOC_DEVICEMAP)


def _raise_nofile_limit() -> None:
    """One memfd per physical handle: let the process open as many as it may."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16), hard))
        except (ValueError, OSError):
            pass


def _sys_mmap(addr: int, size: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
    p = _libc.mmap(addr or None, size, prot, flags, fd, offset)
    if p is None or p == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap failed: {os.strerror(err)}")
    return int(p)


def _sys_munmap(addr: int, size: int) -> None:
    if _libc.munmap(addr, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"munmap failed: {os.strerror(err)}")


def _sys_mprotect(addr: int, size: int, prot: int) -> None:
    if _libc.mprotect(addr, size, prot) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mprotect failed: {os.strerror(err)}")


def _i(x: Any) -> int:
    """Raw value of a binding handle type or an int (None counts as 0)."""
    return 0 if x is None else int(x)


#: the host's user address space (x86-64 and AArch64 with 4-level tables:
#: 128 TiB).  Every size, offset and size + alignment is checked against it
#: before any system call: ctypes passes ``size_t`` modulo 2**64, so an
#: unchecked 2**64 would reach mmap as a small size.
HOST_VA_LIMIT = 1 << 47


def _n(x: Any) -> int | None:
    """A byte count or offset as an int in ``[0, HOST_VA_LIMIT]``; None for
    anything else (negative, too large for the host, not an integer)."""
    if isinstance(x, bool):
        return None
    try:
        v = int(x)
    except (TypeError, ValueError, OverflowError):
        return None
    if isinstance(x, float) and v != x:
        return None
    return v if 0 <= v <= HOST_VA_LIMIT else None


def _too_big(x: Any) -> bool:
    """An integer byte count larger than the host can map (OUT_OF_MEMORY, as
    a driver answers a request beyond the device)."""
    return isinstance(x, int) and not isinstance(x, bool) and x > HOST_VA_LIMIT


# --------------------------------------------------------------------------
# Emulator state
# --------------------------------------------------------------------------

@dataclass
class _Physical:
    """A ``cuMemCreate`` allocation: a memfd plus its reference counts."""

    handle: int
    size: int
    fd: int
    refs: int = 1          # handle references (creation + cuMemRetainAllocationHandle)
    mappings: int = 0      # live cuMemMap mappings


@dataclass
class _Mapping:
    va: int
    size: int
    phys: _Physical
    offset: int


@dataclass
class _Page:
    mapping: _Mapping
    access: int = ACCESS_NONE


@dataclass
class _Linear:
    """A ``cuMemAlloc`` allocation (own memfd, mapped read/write)."""

    base: int
    size: int
    fd: int


@dataclass
class _HostBlock:
    base: int
    size: int
    flags: int
    buf: Any


@dataclass
class _Event:
    handle: int
    recorded: int = 0      # serial of the latest record op enqueued
    reached: int = 0       # serial of the latest record op executed
    stream: int | None = None


@dataclass
class _Stream:
    handle: int
    flags: int
    queue: deque = field(default_factory=deque)
    error: Any = None      # CUresult reported once at the next observation


@dataclass(frozen=True)
class Fault:
    """A device access the emulator refused (it would have been an illegal address)."""

    stream: int
    op: str
    address: int
    reason: str


@dataclass
class _Context:
    handle: int
    device: int
    refs: int = 0
    generation: int = 0

