"""Allocators nobody here would write this way: shapes other than memspec's
own (in-band headers, power-of-two size classes, sub-page units, no
declared geometry), each with planted bugs switched on by name.  The
conformance suite must judge them by the seed's rules only, find every bug
on its own row, and raise no false FAIL on the correct variants.

* ``size_class(...)`` -- power-of-two classes from 64 bytes, a 16-byte
  in-band header before each address (reported as ``block``), addresses
  aligned to 16, larger alignments by over-allocating; its identities are
  creator + generation.
* ``by_value(...)`` -- a first-fit allocator whose handles carry an identity
  made from the address, so a stale handle *equals* a newer live one at a
  recycled address (a real defect class: handles compared by value).

* ``history_dependent()`` -- ``by_value_ok``, except that every other
  instance made in the process refuses its first request with OutOfMemory
  (legal: no geometry is declared, so a packing policy may refuse): correct
  answers that depend on the process's history, not on the calls made, as
  glibc's (its dynamic mmap threshold) or a device shared with other
  processes.  Hypothesis cannot replay such a target.
* ``history_footprint()`` -- the same kind of history, in a value: every
  other instance rounds each footprint up one 4 KiB unit more (legal: no
  bound is declared), as glibc's footprints change with its mmap threshold.

Bugs (keyword flags): ``double_free`` (a freed block is accepted again and
pushed twice on its free list), ``big_align`` (alignments above 4 KiB are
ignored: the address is only 16-aligned), ``by_value`` (the defect above).
"""

from __future__ import annotations

import itertools
from typing import Any

from memspec.spec import api
from memspec.spec.api import AllocationRequest, DeviceAllocation, DeviceKey, Identity, TargetInstance
from memspec.spec.errors import DoubleFree, ForeignAllocation, InvalidRequest, OutOfMemory, StaleHandle

CAPACITY = 64 * api.MiB
HEADER = 16
BASE = 1 << 40
_instances = itertools.count(1)


def _valid(req: AllocationRequest) -> None:
    if type(req.size) is not int or req.size <= 0:
        raise InvalidRequest(f"size {req.size!r}")
    if not api.is_power_of_two(req.alignment):
        raise InvalidRequest(f"alignment {req.alignment!r}")


class SizeClassAllocator:
    """Power-of-two classes carved from a bump region; freed blocks go on their class's list."""

    def __init__(self, capacity: int, *, double_free: bool = False, big_align: bool = False) -> None:
        self.capacity = capacity
        self.creator = f"sizeclass-{next(_instances)}"
        self.gen = 0
        self.bump = BASE
        self.used = 0          # bytes handed out from the region (blocks, free or not)
        self.free: dict[int, list[int]] = {}
        self.live: dict[Identity, tuple[int, int]] = {}   # identity -> (block, class)
        self.freed: set[Identity] = set()
        self.double_free, self.big_align = double_free, big_align

    def device(self) -> DeviceKey:
        return DeviceKey("host")

    def allocate(self, req: AllocationRequest) -> DeviceAllocation:
        _valid(req)
        align = req.alignment if not (self.big_align and req.alignment > 4096) else 16
        pad = max(0, align - 16)
        cls = 64
        while cls < req.size + HEADER + pad:
            cls *= 2
        lst = self.free.get(cls)
        if lst:
            block = lst.pop()
        else:
            if self.used + cls > self.capacity:
                raise OutOfMemory(f"{cls} bytes do not fit")
            block = self.bump
            self.bump += cls
            self.used += cls
        addr = block + HEADER
        addr += (-addr) % align
        self.gen += 1
        ident = Identity(self.creator, self.gen)
        self.live[ident] = (block, cls)
        return DeviceAllocation(addr, req.size, cls, ident, self.device(), block=block)

    def deallocate(self, a: DeviceAllocation) -> int:
        ident = getattr(a, "identity", None)
        if getattr(ident, "creator", None) != self.creator:
            raise ForeignAllocation("not made here")
        got = self.live.pop(ident, None)
        if got is None:
            if self.double_free and ident in self.freed:
                self.free.setdefault(a.footprint, []).append(a.block)   # the planted bug
                return a.footprint
            raise DoubleFree("already freed")
        self.freed.add(ident)
        block, cls = got
        self.free.setdefault(cls, []).append(block)
        return cls


class ByValueAllocator:
    """First fit over a sorted free list of 4 KiB units; identities made from addresses when ``by_value``."""

    UNIT = 4096

    def __init__(self, capacity: int, *, by_value: bool = False, big_align: bool = False) -> None:
        self.capacity = capacity
        self.creator = f"byvalue-{next(_instances)}"
        self.gen = 0
        self.holes = [(BASE, capacity)]     # (start, length), sorted
        self.live: dict[Identity, tuple[int, int]] = {}
        self.by_value, self.big_align = by_value, big_align

    def device(self) -> DeviceKey:
        return DeviceKey("host")

    def allocate(self, req: AllocationRequest) -> DeviceAllocation:
        _valid(req)
        align = req.alignment if not (self.big_align and req.alignment > 4096) else self.UNIT
        n = -(-req.size // self.UNIT) * self.UNIT
        for i, (start, length) in enumerate(self.holes):
            addr = start + (-start) % max(align, self.UNIT)
            if addr + n <= start + length:
                rest = [(start, addr - start), (addr + n, start + length - addr - n)]
                self.holes[i:i + 1] = [h for h in rest if h[1] > 0]
                fp = addr + n - start if addr > start else n
                fp = n
                self.gen += 1
                ident = Identity(self.creator, addr if self.by_value else self.gen)
                self.live[ident] = (addr, fp)
                return DeviceAllocation(addr, req.size, fp, ident, self.device())
        raise OutOfMemory(f"no hole of {n} bytes")

    def deallocate(self, a: DeviceAllocation) -> int:
        ident = getattr(a, "identity", None)
        if getattr(ident, "creator", None) != self.creator:
            raise ForeignAllocation("not made here")
        got = self.live.pop(ident, None)
        if got is None:
            raise StaleHandle("not live")
        addr, fp = got
        self.holes.append((addr, fp))
        self.holes.sort()
        merged: list = []
        for s, n in self.holes:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((s, n))
        self.holes = merged
        return fp


class _Mechanism:
    def __init__(self, alloc: Any) -> None:
        self._a = alloc
        self.name = type(alloc).__name__

    def allocator(self) -> Any:
        return self._a

    def virtual_backing(self) -> None:
        return None

    def shared_mapping(self) -> None:
        return None


def size_class(capacity: int | None = None, **bugs: bool) -> TargetInstance:
    cap = capacity or CAPACITY
    return TargetInstance(mechanism=_Mechanism(SizeClassAllocator(cap, **bugs)), capacity=cap,
                          make_foreign=lambda: _Mechanism(SizeClassAllocator(cap)))


def by_value(capacity: int | None = None, **bugs: bool) -> TargetInstance:
    cap = capacity or CAPACITY
    return TargetInstance(mechanism=_Mechanism(ByValueAllocator(cap, **bugs)), capacity=cap,
                          make_foreign=lambda: _Mechanism(ByValueAllocator(cap)))


def size_class_ok(capacity: int | None = None) -> TargetInstance:
    return size_class(capacity)


def size_class_double_free(capacity: int | None = None) -> TargetInstance:
    return size_class(capacity, double_free=True)


def size_class_double_free_big_align(capacity: int | None = None) -> TargetInstance:
    return size_class(capacity, double_free=True, big_align=True)


def by_value_ok(capacity: int | None = None) -> TargetInstance:
    return by_value(capacity)


def by_value_stale(capacity: int | None = None) -> TargetInstance:
    return by_value(capacity, by_value=True)


def by_value_stale_big_align(capacity: int | None = None) -> TargetInstance:
    return by_value(capacity, by_value=True, big_align=True)


class _Moody(ByValueAllocator):
    """Refuses its first request when ``moody`` (see ``history_dependent``)."""

    def __init__(self, capacity: int, moody: bool) -> None:
        super().__init__(capacity)
        self.moody = moody

    def allocate(self, req: AllocationRequest) -> DeviceAllocation:
        if self.moody:
            self.moody = False
            raise OutOfMemory("not now (this instance's history)")
        return super().allocate(req)


_moods = itertools.count()


def history_dependent(capacity: int | None = None) -> TargetInstance:
    cap = capacity or CAPACITY
    return TargetInstance(mechanism=_Mechanism(_Moody(cap, next(_moods) % 2 == 1)), capacity=cap,
                          make_foreign=lambda: _Mechanism(ByValueAllocator(cap)))


class _Roomy(ByValueAllocator):
    """One more unit of footprint per allocation when ``roomy`` (see ``history_footprint``)."""

    def __init__(self, capacity: int, roomy: bool) -> None:
        super().__init__(capacity)
        self.roomy = roomy

    def allocate(self, req: AllocationRequest) -> DeviceAllocation:
        if not self.roomy or type(req.size) is not int or req.size <= 0:
            return super().allocate(req)
        a = super().allocate(AllocationRequest(req.size + self.UNIT, req.alignment))
        return DeviceAllocation(a.address, req.size, a.footprint, a.identity, a.device)


def history_footprint(capacity: int | None = None) -> TargetInstance:
    cap = capacity or CAPACITY
    return TargetInstance(mechanism=_Mechanism(_Roomy(cap, next(_moods) % 2 == 1)), capacity=cap,
                          make_foreign=lambda: _Mechanism(ByValueAllocator(cap)))
