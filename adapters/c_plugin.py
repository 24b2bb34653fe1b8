"""Plugins in C: ``memspec conform c:path/to/libplugin.so`` (and ``c:zoo:NAME``).

Loads a shared library written against ``adapters/c/memspec_plugin.h`` with
ctypes -- ABI version 2 (``memspec_plugin_v2``) when the library exports it,
else version 1 (``memspec_plugin_v1``) -- and presents it as a seed-000
``DeviceMemoryMechanism``.  Each status code of the ABI becomes the
:mod:`memspec.spec.errors` class the header names; an unknown code is a
:class:`PluginError`.  The loader trusts nothing it gets back: a table with
the wrong ABI version, unknown flags or a missing required entry point is
refused, optional capabilities must be all-or-nothing, a declared geometry
and a declared memory range are checked (a bad one is a one-line
:class:`PluginError` naming the field, which the harness reports as the
target failing to build), and handles are rebuilt from the library's own
fields on every call (the library decides foreign/stale/freed).

Marshalling (the ABI carries ``int64_t`` sizes): a size that is not a Python
``int`` is refused here with InvalidRequest, as a C caller's compiler would
refuse it; one beyond ``int64_t`` is OutOfMemory (no device holds it).

ABI 2 adds to a handle ``block`` (where the allocation's footprint starts
when not at its address: ``DeviceAllocation.block``), to the table an
optional ``geometry`` (``TargetInstance.geometry``: what the allocator
declares is checked, the rest measured) and ``flags``.

``physical_bytes`` is the library's ``physical_bytes`` entry point (computed
from its free structures, per the header), absent when NULL.  The library's
``create(capacity, share_with)`` with ``share_with`` set gives the *foreign*
twin on the same device.  The target gets a :class:`HostEP` (synchronous
copies: an infinitely fast device) when the host can reach the device's
memory, and the data-integrity checks run; otherwise ``ep`` is None.  What it
may touch is its :class:`Reach`:

* :class:`Region` -- the library declares the host range its addresses live
  in (``memory``; checked mapped read-write when the target is made);
* :class:`LiveAllocations` -- ABI 2's ``MEMSPEC_HOST_POINTERS`` (a malloc-style
  allocator whose pointers are host memory anywhere): only the bytes of the
  allocations live right now, ``[address, block + footprint)`` of each, kept
  by the loader from the allocate/deallocate answers of every instance on
  the device.

An access outside the reach is a DeviceFault, never a host access.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import sys
import threading
from collections import deque
from typing import Any, Callable

from memspec.spec.api import (
    AllocationRequest,
    AllocatorGeometry,
    FootprintBound,
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

ABI_VERSION = 1          # memspec_plugin_v1
ABI_VERSION_2 = 2        # memspec_plugin_v2
ABI_VERSIONS = (ABI_VERSION_2, ABI_VERSION)   # tried in this order
INT64_MAX = (1 << 63) - 1
U64_MAX = (1 << 64) - 1
#: memspec_plugin.h's flags
HOST_POINTERS = 1
KNOWN_FLAGS = HOST_POINTERS
#: memspec_plugin.h's MEMSPEC_MAX_CLASSES and MEMSPEC_OVERHEAD_UNDECLARED
MAX_CLASSES = 4096
OVERHEAD_UNDECLARED = U64_MAX
#: memspec_bound_kind -> FootprintBound.rounding (0: no bound declared)
BOUND_KINDS = {0: None, 1: "unit", 2: "pow2", 3: "classes"}
#: the largest unit, alignment, header or class a geometry may declare (1 TiB): beyond it, a garbage value
GEOMETRY_LIMIT = 1 << 40

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
    """``memspec_handle`` (ABI 1)."""
    _fields_ = [("owner", ctypes.c_uint64), ("generation", ctypes.c_uint64), ("address", ctypes.c_uint64),
                ("size", ctypes.c_uint64), ("footprint", ctypes.c_uint64)]


class Handle2(ctypes.Structure):
    """``memspec_handle2`` (ABI 2): ``memspec_handle`` and ``block``."""
    _fields_ = Handle._fields_ + [("block", ctypes.c_uint64)]


class Geometry(ctypes.Structure):
    """``memspec_geometry`` (ABI 2)."""
    _fields_ = [("unit", ctypes.c_uint64), ("alignment", ctypes.c_uint64), ("bound", ctypes.c_uint32),
                ("next_class", ctypes.c_uint32), ("header", ctypes.c_uint64), ("min_class", ctypes.c_uint64),
                ("classes", ctypes.c_void_p), ("nclasses", ctypes.c_uint64), ("overhead", ctypes.c_uint64),
                ("max_alignment", ctypes.c_uint64)]


_vp, _u64, _i64, _i32, _u32 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32, ctypes.c_uint32
_U = ctypes.POINTER(_u64)
F = ctypes.CFUNCTYPE

_VB = ["vb_granularity", "vb_reserve", "vb_commit", "vb_decommit", "vb_committed_bytes", "vb_release"]
_SM = ["sm_granularity", "sm_reserve", "sm_free_reservation", "sm_create", "sm_map", "sm_unmap",
       "sm_copy_on_write", "sm_mapping_count", "sm_release"]


def _table_fields(handle: type, v2: bool) -> list:
    """The fields of ``memspec_plugin`` (v1) or ``memspec_plugin2`` (v2): one
    layout, the handle type and v2's tail aside."""
    _H = ctypes.POINTER(handle)
    fields = [
        ("abi_version", _u32),
        ("name", ctypes.c_void_p),   # read by hand: untrusted bytes, bounded
        ("create", F(_vp, _u64, _vp)),
        ("destroy", F(None, _vp)),
        ("capacity", F(_u64, _vp)),
        ("physical_bytes", F(_u64, _vp)),
        ("last_error", F(ctypes.c_void_p, _vp)),
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
    if v2:
        fields += [("geometry", F(None, _vp, ctypes.POINTER(Geometry))), ("flags", _u64)]
    return fields


class Table(ctypes.Structure):
    """``memspec_plugin`` (ABI 1)."""
    _fields_ = _table_fields(Handle, v2=False)


class Table2(ctypes.Structure):
    """``memspec_plugin2`` (ABI 2)."""
    _fields_ = _table_fields(Handle2, v2=True)


#: ABI version -> (exported symbol, table, handle)
ABI = {ABI_VERSION_2: ("memspec_plugin_v2", Table2, Handle2), ABI_VERSION: ("memspec_plugin_v1", Table, Handle)}


def _present(fn: Any) -> bool:
    return bool(ctypes.cast(fn, ctypes.c_void_p).value)


# --------------------------------------------------------------------------
# Reading the plugin's memory without trusting it
# --------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
_libc.write.restype = ctypes.c_ssize_t
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_peek_lock = threading.Lock()
_peek_pipe: list[int] = []


def peek(address: int, n: int) -> bytes | None:
    """The ``n`` bytes at ``address`` (``n`` <= 64 KiB), or None when any of
    them is not readable: the kernel copies them into a pipe and answers
    EFAULT for an unmapped byte, where a plain read would crash the process."""
    if not (isinstance(address, int) and isinstance(n, int)) or address <= 0 or n < 0 or n > 65536 \
            or address + n > U64_MAX:
        return None
    if n == 0:
        return b""
    with _peek_lock:
        if not _peek_pipe:
            _peek_pipe.extend(os.pipe())
        r, w = _peek_pipe
        got = bytearray()
        while len(got) < n:   # page by page: a write may stop at the first unreadable page
            at = address + len(got)
            k = min(n - len(got), _PAGE - at % _PAGE)
            if _libc.write(w, at, k) != k:
                os.read(r, 65536) if _pending(r) else None
                return None
            got += os.read(r, k)
        return bytes(got)


def _pending(fd: int) -> bool:
    import select

    return bool(select.select([fd], [], [], 0)[0])


def text(address: Any, limit: int = 200) -> str:
    """A NUL-terminated string the plugin gave, read at most ``limit`` bytes
    and only where readable; "" for NULL or unreadable.  Control characters
    become spaces (the text lands in one-line reports)."""
    if not isinstance(address, int) or address <= 0:
        return ""
    raw = bytearray()
    while len(raw) < limit:
        at = address + len(raw)
        chunk = peek(at, min(limit - len(raw), _PAGE - at % _PAGE))
        if chunk is None:
            break
        cut = chunk.find(b"\0")
        raw += chunk if cut < 0 else chunk[:cut]
        if cut >= 0:
            break
    out = raw.decode("utf-8", "replace")
    return "".join(ch if ch.isprintable() else " " for ch in out).strip()


def mapped_rw(base: int, size: int) -> str | None:
    """Why ``[base, base + size)`` is not host memory the loader may read and
    write (None: it is).  Linux: every byte must lie in mappings of
    ``/proc/self/maps`` that are readable and writable; elsewhere its first
    and last bytes must be readable."""
    if base <= 0:
        return "its base is NULL"
    if size <= 0:
        return "it is empty"
    if base + size - 1 > U64_MAX:
        return f"{base:#x} + {size} overflows 64 bits"
    try:
        with open("/proc/self/maps", "rb") as f:
            lines = f.read().splitlines()
        # the kernel lists the mappings in address order: start at the last
        # one that begins at or below ``base`` (the ones before end at or
        # below its start), found by bisection, and parse only from there
        first = max(bisect.bisect_right(lines, base, key=_map_start) - 1, 0)
        at, end = base, base + size
        for line in lines[first:]:
            fields = line.split()
            lo_s, _, hi_s = fields[0].partition(b"-")
            lo, hi = int(lo_s, 16), int(hi_s, 16)
            if lo > at:
                break   # in address order: no later mapping holds ``at``
            if hi <= at:
                continue
            perms = fields[1].decode("ascii", "replace")
            if not perms.startswith("rw"):
                return f"{lo:#x}-{hi:#x} is mapped {perms}, not read-write"
            at = hi
            if at >= end:
                return None
    except (OSError, ValueError, IndexError):
        if peek(base, 1) is None or peek(base + size - 1, 1) is None:
            return "its first or last byte is not readable"
        return None
    return f"{at:#x} is not mapped in this process (/proc/self/maps)"


def _map_start(line: bytes) -> int:
    """The start address of a ``/proc/self/maps`` line."""
    return int(line[: line.index(b"-")], 16)


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
        for version in ABI_VERSIONS:
            symbol, table, handle = ABI[version]
            get = getattr(self.lib, symbol, None)
            if get is not None:
                break
        else:
            raise LookupError(f"{path!r} exports neither memspec_plugin_v2 nor memspec_plugin_v1")
        get.restype = ctypes.POINTER(table)
        get.argtypes = []
        ptr = get()
        if not ptr:
            raise LookupError(f"{path!r}: {symbol}() returned NULL")
        if peek(ctypes.addressof(ptr.contents), ctypes.sizeof(table)) is None:
            raise LookupError(f"{path!r}: {symbol}() returned an unreadable table")
        self.abi, self.Handle = version, handle
        self.t = ptr.contents
        if self.t.abi_version != version:
            raise LookupError(f"{path!r}: {symbol}() says ABI version {self.t.abi_version}, expected {version}")
        missing = [n for n in ("create", "destroy", "capacity", "allocate", "deallocate") if not _present(getattr(self.t, n))]
        if missing:
            raise LookupError(f"{path!r}: required entry points are NULL: {', '.join(missing)}")
        self.flags = int(self.t.flags) if version >= 2 else 0
        if self.flags & ~KNOWN_FLAGS:
            raise LookupError(f"{path!r}: flags {self.flags:#x} has bits this loader does not know "
                              f"(known: MEMSPEC_HOST_POINTERS={HOST_POINTERS})")
        self.name = text(self.t.name, 64) or os.path.basename(path)
        self.has_vb = self._all_or_none(_VB, "VirtualBacking")
        self.has_sm = self._all_or_none(_SM, "SharedMapping")
        self.has_geometry = version >= 2 and _present(self.t.geometry)
        self.host_pointers = bool(self.flags & HOST_POINTERS)
        if self.host_pointers and _present(self.t.memory):
            raise LookupError(f"{path!r}: MEMSPEC_HOST_POINTERS and a memory range are exclusive "
                              "(one says where the device's memory is, the other that it is anywhere)")
        if self.host_pointers and (self.has_vb or self.has_sm):
            raise LookupError(f"{path!r}: MEMSPEC_HOST_POINTERS with VirtualBacking/SharedMapping: "
                              "the EP could not reach committed pages or mappings")

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


def read_geometry(g: Geometry) -> AllocatorGeometry:
    """``memspec_geometry`` as the plugin filled it -> the spec's
    :class:`AllocatorGeometry`; a bad field is a :class:`PluginError`
    naming it."""
    def bad(field: str, why: str) -> PluginError:
        return PluginError(f"geometry.{field} {why}")

    unit, align = int(g.unit), int(g.alignment)
    if not 1 <= unit <= GEOMETRY_LIMIT:
        raise bad("unit", f"is {unit}: must be 1..{GEOMETRY_LIMIT}")
    if not (1 <= align <= GEOMETRY_LIMIT and align & (align - 1) == 0):
        raise bad("alignment", f"is {align}: must be a power of two <= {GEOMETRY_LIMIT}")
    kind = int(g.bound)
    if kind not in BOUND_KINDS:
        raise bad("bound", f"is {kind}: must be MEMSPEC_BOUND_NONE/UNIT/POW2/CLASSES (0..3)")
    if int(g.next_class) not in (0, 1):
        raise bad("next_class", f"is {int(g.next_class)}: must be 0 or 1")
    header, min_class, n = int(g.header), int(g.min_class), int(g.nclasses)
    if header > GEOMETRY_LIMIT:
        raise bad("header", f"is {header}: more than {GEOMETRY_LIMIT}")
    if min_class > GEOMETRY_LIMIT:
        raise bad("min_class", f"is {min_class}: more than {GEOMETRY_LIMIT}")
    if n > MAX_CLASSES:
        raise bad("nclasses", f"is {n}: more than MEMSPEC_MAX_CLASSES ({MAX_CLASSES})")
    classes: tuple[int, ...] = ()
    if n:
        if not g.classes:
            raise bad("classes", f"is NULL with nclasses {n}")
        raw = peek(int(g.classes), 8 * n)
        if raw is None:
            raise bad("classes", f"points at {int(g.classes):#x}, where {n} uint64_t are not readable")
        classes = tuple(int.from_bytes(raw[8 * i:8 * i + 8], sys.byteorder)
                        for i in range(n))
        if any(not 0 < c <= GEOMETRY_LIMIT for c in classes) or list(classes) != sorted(set(classes)):
            raise bad("classes", f"must be ascending positive sizes <= {GEOMETRY_LIMIT}: {list(classes[:8])}"
                                 f"{'...' if n > 8 else ''}")
    rounding = BOUND_KINDS[kind]
    if rounding is None and (header or min_class or n or g.next_class):
        raise bad("bound", "is MEMSPEC_BOUND_NONE but header/min_class/classes/next_class are set")
    if rounding == "classes" and not n:
        raise bad("classes", "is empty with MEMSPEC_BOUND_CLASSES")
    if rounding not in (None, "classes") and n:
        raise bad("classes", f"are given with bound {rounding.upper()} (only MEMSPEC_BOUND_CLASSES reads them)")
    if rounding != "pow2" and min_class:
        raise bad("min_class", "is set without MEMSPEC_BOUND_POW2")
    overhead = int(g.overhead)
    if overhead != OVERHEAD_UNDECLARED and overhead > INT64_MAX:
        raise bad("overhead", f"is {overhead}: not a byte count (MEMSPEC_OVERHEAD_UNDECLARED to leave it out)")
    most = int(g.max_alignment)
    if most and not (align <= most <= GEOMETRY_LIMIT and most & (most - 1) == 0):
        raise bad("max_alignment", f"is {most}: must be 0 (no limit) or a power of two from alignment ({align}) "
                                   f"to {GEOMETRY_LIMIT}")
    try:
        bound = None if rounding is None else FootprintBound(rounding, header=header, min_class=min_class,
                                                            classes=classes, next_class=bool(g.next_class))
        return AllocatorGeometry(unit=unit, alignment=align, bound=bound,
                                 overhead=None if overhead == OVERHEAD_UNDECLARED else overhead,
                                 max_alignment=most or None)
    except ValueError as e:
        raise PluginError(f"geometry: {e}") from e


# --------------------------------------------------------------------------
# What the host EP may touch
# --------------------------------------------------------------------------

class Reach:
    """The host bytes the loader's EP may read and write."""

    def contains(self, address: int, n: int) -> bool:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class Region(Reach):
    """``[base, base + size)``: the range the library's ``memory`` declared."""

    def __init__(self, base: int, size: int) -> None:
        self.base, self.size = base, size

    def contains(self, address: int, n: int) -> bool:
        return self.base <= address and address + n <= self.base + self.size

    def describe(self) -> str:
        return f"the plugin's memory [{self.base:#x}, +{self.size})"


class LiveAllocations(Reach):
    """The allocations live right now on one device (all its instances):
    ``[address, block + footprint)`` of each, as the library answered.
    Kept by the loader: added on a successful allocate, removed on a
    successful deallocate and when the instance that made it is destroyed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []          # sorted
        self._ends: dict[int, list] = {}      # start -> [end, identity] (the last one made there)
        self._by_id: dict[Identity, int] = {}

    def add(self, identity: Identity, start: int, end: int) -> None:
        with self._lock:
            if start in self._ends:           # a live claim at the same start: the library overlaps itself
                old = self._ends[start][1]
                self._by_id.pop(old, None)
            else:
                bisect.insort(self._starts, start)
            self._ends[start] = [end, identity]
            self._by_id[identity] = start

    def remove(self, identity: Identity) -> None:
        with self._lock:
            start = self._by_id.pop(identity, None)
            if start is not None and self._ends.get(start, [0, None])[1] == identity:
                del self._ends[start]
                self._starts.pop(bisect.bisect_left(self._starts, start))

    def remove_creator(self, creator: str) -> None:
        for ident in [i for i in list(self._by_id) if i.creator == creator]:
            self.remove(ident)

    def contains(self, address: int, n: int) -> bool:
        with self._lock:
            i = bisect.bisect_right(self._starts, address) - 1
            return i >= 0 and address + n <= self._ends[self._starts[i]][0]

    def __len__(self) -> int:
        return len(self._by_id)

    def describe(self) -> str:
        return f"the {len(self)} live allocations"


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
        #: the device's live allocations (MEMSPEC_HOST_POINTERS: the EP's reach), shared by its instances
        self.live: LiveAllocations | None = (share_with.live if share_with else
                                             LiveAllocations() if lib.host_pointers else None)
        self.closed = False

    # -- marshalling ----------------------------------------------------
    def check(self, status: int, call: str) -> None:
        if status == 0:
            return
        cls = STATUS.get(status)
        msg = text(self.t.last_error(self.ptr)) if _present(self.t.last_error) else ""
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

    def handle(self, obj: Any, kind: type, call: str) -> Any:
        """The ABI's handle for ``obj`` (``memspec_handle`` or, ABI 2,
        ``memspec_handle2``), rebuilt from its fields."""
        if not isinstance(obj, kind):
            raise E.InvalidRequest(f"{call}: expected a {kind.__name__}, got {type(obj).__name__}")
        ident = obj.identity

        def u64(v: Any) -> int:
            return v & U64_MAX if isinstance(v, int) else 0

        h = self.lib.Handle()
        h.owner = self.owners.get(ident.creator, 0)  # unknown creator: owner 0, which no instance uses
        h.generation = ident.generation if isinstance(ident.generation, int) and 0 < ident.generation <= U64_MAX else 0
        h.address = u64(getattr(obj, "address", 0))
        h.size = u64(obj.size)
        h.footprint = u64(getattr(obj, "footprint", 0))
        if self.lib.abi >= 2:
            h.block = u64(getattr(obj, "block", None) or 0)
        return h

    def geometry(self) -> AllocatorGeometry | None:
        """What the library declares of its packing (ABI 2's ``geometry``;
        None when it has none)."""
        if not self.lib.has_geometry:
            return None
        g = Geometry(unit=1, alignment=1, bound=0, next_class=0, header=0, min_class=0, classes=None, nclasses=0,
                     overhead=OVERHEAD_UNDECLARED, max_alignment=0)
        self.call("geometry", ctypes.byref(g))
        return read_geometry(g)

    def call(self, name: str, *args: Any) -> Any:
        with self.lock:
            if self.closed:
                raise E.InvalidRequest(f"{self.lib.name}: instance is destroyed")
            return getattr(self.t, name)(self.ptr, *args)

    def destroy(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                if self.live is not None:   # its allocations go with it
                    self.live.remove_creator(self.creator)
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
        out = self.i.lib.Handle()
        self.i.check(self.i.call("allocate", size, align, ctypes.byref(out)), f"allocate({size})")
        address, footprint = int(out.address), int(out.footprint)
        block = int(out.block) if self.i.lib.abi >= 2 and out.block else None
        ident = self.i.identity(out)
        if self.i.live is not None:
            # the EP's reach: the bytes the library says are this allocation's, from the address on
            # ([block, block + footprint) that does not hold them is the spec's to judge: S8's block clause)
            start = address if block is None else block
            self.i.live.add(ident, address, start + footprint if start <= address else address)
        return DeviceAllocation(address, size, footprint, ident, self.i.key, block=block)

    def deallocate(self, allocation: DeviceAllocation) -> int:
        h = self.i.handle(allocation, DeviceAllocation, "deallocate")
        freed = _u64()
        self.i.check(self.i.call("deallocate", ctypes.byref(h), ctypes.byref(freed)), "deallocate")
        if self.i.live is not None:
            self.i.live.remove(allocation.identity)
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
        out = self.i.lib.Handle()
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
        out = self.i.lib.Handle()
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
    """``ExecutionProvider`` for a plugin whose device memory is host memory:
    every copy and stand-in kernel runs at once (fences are done when
    issued), ``defer`` queues and ``poll`` runs the queue.  It touches only
    its :class:`Reach` (a declared region, or the live allocations); an
    access outside it is a DeviceFault, never a host access."""

    def __init__(self, key: DeviceKey, reach: Reach) -> None:
        self.context_id = new_creator_id(f"{key.kind}-host-ep")
        self._key = key
        self.reach = reach
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
        if not (isinstance(address, int) and isinstance(n, int)) or isinstance(address, bool) or n < 0:
            raise E.InvalidRequest(f"{what}: ({address!r}, {n!r}) is not an address range")
        if n and not (address > 0 and self.reach.contains(address, n)):
            raise E.DeviceFault(f"{what} at {address:#x}+{n}: outside {self.reach.describe()}", address=address,
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
    library is refused before any run).  ``zoo:NAME`` names an allocator of
    the zoo (:mod:`memspec.adapters.zoo`), resolved by the discovery before
    this is called (the zoo builds its shim and loads it through here)."""
    if path.startswith("zoo:"):
        raise ValueError(f"{path!r}: a zoo allocator is resolved by memspec.adapters.zoo.factory")
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

        try:
            probe = (lambda: int(first.call("physical_bytes"))) if _present(lib.t.physical_bytes) else None
            ep = None
            if _present(lib.t.memory):
                base, size = _u64(), _u64()
                first.call("memory", ctypes.byref(base), ctypes.byref(size))
                why = mapped_rw(int(base.value), int(size.value))
                if why is not None:
                    raise PluginError(f"{lib.name}: memory() gave [{int(base.value):#x}, +{int(size.value)}): {why}")
                ep = HostEP(first.key, Region(int(base.value), int(size.value)))
            elif first.live is not None:
                ep = HostEP(first.key, first.live)
            geometry = first.geometry()
            cap = int(first.call("capacity"))
            if not 0 < cap <= INT64_MAX:
                raise PluginError(f"{lib.name}: capacity() is {cap}: must be 1..INT64_MAX bytes")
        except BaseException:
            close()
            raise
        inst = TargetInstance(mechanism=Mechanism(first), ep=ep, physical_bytes=probe, capacity=cap, close=close,
                              geometry=geometry, make_foreign=make_foreign)
        # the system level's replacement mechanism (eager only, as the system
        # spec assumes): another instance on the same device, so its memory is
        # reachable through the same EP
        return _with_extras(inst, make_foreign=make_foreign,
                            make_extra_mechanism=lambda: make_foreign(eager_only=True))

    make.__name__ = f"c_plugin_{lib.name}"
    make.__doc__ = f"C plugin {lib.name} ({path})"
    return make
