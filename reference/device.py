"""The simulated device: the ground truth the reference roles run on.

It is honest in the ways that matter to seed 000:

* **Physical pages hold real bytes.**  Capacity is a number of pages of
  ``page_size`` bytes (2 MiB by default, 64 KiB selectable).  A page's bytes
  are held sparsely (:class:`PageData`: a background byte plus the 4 KiB
  chunks written since), created on first write, so a 24 GiB device costs
  nothing until touched and a 16-byte write into a 2 MiB page costs 4 KiB.  Seed 000: *The committed bytes in the ledger cannot by
  themselves prove where the data currently physically resides* -- this
  device can: :meth:`SimDevice.physical_bytes` counts pages actually held.
* **A page table** maps virtual pages to physical pages with a permission
  (read-write or read-only).  Several virtual pages may map one physical page
  (SharedMapping); a physical page cannot be freed while any virtual page
  still maps it.
* **Streams run queued work** (copy in, copy out, fill, and a stand-in
  "kernel" that reads and writes given ranges) only when the explicit device
  clock is advanced (:meth:`advance`, :meth:`run_until`, :meth:`synchronize`).
  Each stream's fences are monotonically increasing values.  So *CPU submits
  kernel / CPU drops the last owning handle / GPU is still reading the
  buffer* is a state a test can hold still and look at.
* **A bad access is a recorded fault, not a crash.**  Work that touches an
  unmapped (never mapped, unmapped, freed) page, or writes a read-only page,
  appends a :class:`~memspec.spec.errors.DeviceFault` to :attr:`faults` and
  raises it; nothing of that work item is applied (all pages are checked
  before any byte moves).

Thread safety: one re-entrant lock guards all device state.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Sequence

from sortedcontainers import SortedDict, SortedList

from memspec.spec.api import DEFAULT_PAGE, KiB, MiB, DeviceKey, Fence
from memspec.spec.errors import DeviceFault, InvalidRange, InvalidRequest, OutOfMemory

from memspec.reference.common import is_int

#: Default capacity of a simulated device built by the reference targets.
DEFAULT_CAPACITY = 256 * MiB
#: The finer page size a device may be built with (seed 003: *pages are 64 KiB and 2 MiB*).
SMALL_PAGE = 64 * KiB

_VA_BASE = 1 << 32          # address 0 (and the low 4 GiB) is never valid
_VA_SIZE = 1 << 47          # 128 TiB of virtual address space


class RangeAllocator:
    """Best fit over ordered free ranges (``sortedcontainers``, no linear scans).

    Free ranges are kept twice: by ``(size, start)`` for best fit (one
    ``bisect``) and by ``start`` for coalescing with both neighbours on free
    (two ``bisect``s).  All starts and sizes are multiples of ``unit``.
    Not thread-safe by itself: its owner locks.
    """

    def __init__(self, start: int, size: int, unit: int) -> None:
        if start % unit or size % unit or size <= 0:
            raise InvalidRequest(f"range allocator over [{start:#x}, +{size}) not aligned to {unit}")
        self.unit = unit
        self.start = start
        self.size = size
        self._by_size: SortedList = SortedList()
        self._by_start: SortedDict = SortedDict()
        self.free_bytes = 0
        self._insert(start, size)

    def _insert(self, start: int, size: int) -> None:
        self._by_size.add((size, start))
        self._by_start[start] = size
        self.free_bytes += size

    def _remove(self, start: int, size: int) -> None:
        self._by_size.remove((size, start))
        del self._by_start[start]
        self.free_bytes -= size

    def largest_free(self) -> int:
        return self._by_size[-1][0] if self._by_size else 0

    def alloc(self, size: int, align: int) -> int | None:
        """Start of the best-fitting free range for ``size`` bytes aligned to
        ``align``, or ``None`` if no free range fits."""
        need = size if align <= self.unit else size + align - self.unit
        i = self._by_size.bisect_left((need, -1))
        if i == len(self._by_size):
            return None
        fsize, fstart = self._by_size[i]
        self._remove(fstart, fsize)
        a = -(-fstart // align) * align
        if a > fstart:
            self._insert(fstart, a - fstart)
        end, fend = a + size, fstart + fsize
        if fend > end:
            self._insert(end, fend - end)
        return a

    def free(self, start: int, size: int) -> None:
        """Return ``[start, start+size)``, coalescing with free neighbours."""
        end = start + size
        idx = self._by_start.bisect_left(start)
        if idx < len(self._by_start):
            rs, rsize = self._by_start.peekitem(idx)
            if rs < end:
                raise InvalidRange(f"free of [{start:#x}, {end:#x}) overlaps a free range at {rs:#x}")
            if rs == end:
                self._remove(rs, rsize)
                end += rsize
        if idx > 0:
            ls, lsize = self._by_start.peekitem(idx - 1)
            if ls + lsize > start:
                raise InvalidRange(f"free of [{start:#x}, ...) overlaps a free range at {ls:#x}")
            if ls + lsize == start:
                self._remove(ls, lsize)
                start = ls
        self._insert(start, end - start)


#: granule of a page's sparse contents (every page size is a multiple of it)
CHUNK = 4 * KiB
_UNIFORM: dict[int, bytes] = {}


def _uniform(byte: int, n: int) -> bytes:
    """``n`` bytes of ``byte`` (whole chunks shared: immutable)."""
    if n == CHUNK:
        u = _UNIFORM.get(byte)
        if u is None:
            u = _UNIFORM[byte] = bytes([byte]) * CHUNK
        return u
    return bytes(n) if byte == 0 else bytes([byte]) * n


class PageData:
    """The contents of one physical page: every byte is ``base`` except in
    the chunks of ``chunks`` (chunk index -> ``CHUNK`` immutable bytes).

    Chunks are immutable, so a snapshot (what a kernel saw) is a copy of the
    dict, not of the bytes.  Byte for byte the same as a ``bytearray`` of the
    page; only the host memory it costs differs.
    """

    __slots__ = ("base", "chunks")

    def __init__(self, base: int = 0, chunks: dict[int, bytes] | None = None) -> None:
        self.base = base
        self.chunks: dict[int, bytes] = {} if chunks is None else chunks

    def copy(self) -> "PageData":
        return PageData(self.base, dict(self.chunks))

    def read(self, off: int, n: int) -> bytes:
        chunks = self.chunks
        if not chunks:
            return _uniform(self.base, n)
        first, last = off // CHUNK, (off + n - 1) // CHUNK
        if first == last:
            c = chunks.get(first)
            if c is None:
                return _uniform(self.base, n)
            o = off - first * CHUNK
            return c[o:o + n]
        if last - first < len(chunks):
            keys = [k for k in range(first, last + 1) if k in chunks]
        else:
            keys = sorted(k for k in chunks if first <= k <= last)
        out = bytearray()
        pos, end = off, off + n
        for k in keys:
            start = k * CHUNK
            if start > pos:
                out += _uniform(self.base, start - pos)
                pos = start
            stop = min(start + CHUNK, end)
            out += chunks[k][pos - start:stop - start]
            pos = stop
        if end > pos:
            out += _uniform(self.base, end - pos)
        return bytes(out)

    def _chunk(self, k: int) -> bytes:
        c = self.chunks.get(k)
        return _uniform(self.base, CHUNK) if c is None else c

    def write(self, off: int, data: bytes) -> None:
        pos, end, i = off, off + len(data), 0
        while pos < end:
            k, o = divmod(pos, CHUNK)
            m = min(CHUNK - o, end - pos)
            if m == CHUNK:
                self.chunks[k] = bytes(data[i:i + m])
            else:
                c = self._chunk(k)
                self.chunks[k] = c[:o] + data[i:i + m] + c[o + m:]
            pos += m
            i += m

    def fill(self, off: int, n: int, byte: int, page_size: int) -> None:
        if off == 0 and n == page_size:
            self.base, self.chunks = byte, {}
            return
        pos, end = off, off + n
        while pos < end:
            k, o = divmod(pos, CHUNK)
            m = min(CHUNK - o, end - pos)
            if m == CHUNK:
                if byte == self.base:
                    self.chunks.pop(k, None)
                else:
                    self.chunks[k] = _uniform(byte, CHUNK)
            else:
                c = self._chunk(k)
                self.chunks[k] = c[:o] + _uniform(byte, m) + c[o + m:]
            pos += m


class Snapshot:
    """What a read saw, without copying bytes: ``(page contents or None for a
    never-written page, offset, length)`` pieces, materialised by :meth:`data`."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: list) -> None:
        self.pieces = pieces

    def data(self) -> bytes:
        out = bytearray()
        for page, off, n in self.pieces:
            out += page.read(off, n) if page is not None else bytes(n)
        return bytes(out)


@dataclass
class PageEntry:
    """One page-table entry: the physical page behind a virtual page and its permission."""

    phys: int
    writable: bool


@dataclass
class WorkItem:
    """One queued unit of device work.

    ``kind`` is ``"write"`` (host-to-device copy of ``data``), ``"read"``
    (device-to-host copy; the bytes land in ``result``), ``"fill"`` (memset
    ``size`` bytes to ``byte``) or ``"kernel"`` (reads every range of
    ``reads`` into ``result`` -- what the kernel saw -- then fills every range
    of ``writes`` with ``byte``; a kernel's ``result`` holds
    :class:`Snapshot` objects, materialised by :meth:`SimDevice.result`).
    """

    kind: str
    reads: tuple[tuple[int, int], ...] = ()
    writes: tuple[tuple[int, int], ...] = ()
    data: bytes = b""
    byte: int = 0
    fence: Fence | None = None
    result: list[bytes] = field(default_factory=list)
    fault: DeviceFault | None = None
    done: bool = False


class _Stream:
    __slots__ = ("sid", "queue", "submitted", "completed")

    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.queue: deque[WorkItem] = deque()
        self.submitted = 0   # value of the last enqueued item's fence
        self.completed = 0   # value of the last executed item's fence


class SimDevice:
    """A simulated GPU: physical pages, a page table, streams and a clock.

    ``capacity`` is rounded down to whole pages (at least one page).
    """

    #: kernel results kept for :meth:`result` (oldest dropped first)
    RESULTS_KEPT = 4096

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        page_size: int = DEFAULT_PAGE,
        *,
        key: DeviceKey | None = None,
    ) -> None:
        if not is_int(page_size) or page_size < 4 * KiB or page_size & (page_size - 1):
            raise InvalidRequest(f"page size must be a power of two >= 4 KiB, got {page_size!r}")
        if not is_int(capacity) or capacity < page_size:
            raise InvalidRequest(f"capacity must be an int of at least one page, got {capacity!r}")
        self.page_size = page_size
        self.npages = capacity // page_size
        self.capacity = self.npages * page_size
        self.key = key or DeviceKey("sim", 0)
        self._lock = threading.RLock()
        # physical pages: never-used ones are handed out by a counter, freed ones by a stack
        self._fresh = 0
        self._recycled: list[int] = []
        self._in_use = 0
        self._data: dict[int, PageData] = {}
        self._mapcount: dict[int, int] = {}
        self._allocated: set[int] = set()
        # page table: virtual page number -> entry
        self._pt: dict[int, PageEntry] = {}
        self._va = RangeAllocator(_VA_BASE, _VA_SIZE, page_size)
        # streams
        self._streams: dict[int, _Stream] = {}
        self._stream_ids = itertools.count(0)
        self._results: OrderedDict[Fence, list] = OrderedDict()
        self.faults: list[DeviceFault] = []
        self.items_executed = 0
        self.closed = False

    def _open(self) -> None:
        if self.closed:
            raise InvalidRequest(f"device {self.key} is closed")

    def close(self) -> None:
        """Tear the device down: every physical page, mapping, reservation and
        queued item goes (nothing stays allocated), and every later call that
        would take, map or run anything raises InvalidRequest.  A second close
        is a no-op."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._allocated.clear()
            self._data.clear()
            self._mapcount.clear()
            self._pt.clear()
            self._in_use = 0     # the VA space is left as it was: va_reserve/va_free refuse from now on
            for st in self._streams.values():
                st.queue.clear()

    # ------------------------------------------------------------------
    # physical pages
    # ------------------------------------------------------------------

    def free_pages(self) -> int:
        with self._lock:
            return self.npages - self._in_use

    def pages_in_use(self) -> int:
        with self._lock:
            return self._in_use

    def physical_bytes(self) -> int:
        """Bytes of physical pages held right now (the probe a target exposes)."""
        with self._lock:
            return self._in_use * self.page_size

    def touched_bytes(self) -> int:
        """Bytes of the pages written at least once (their contents are held
        sparsely, so the host memory spent is at most this)."""
        with self._lock:
            return len(self._data) * self.page_size

    def alloc_pages(self, n: int) -> list[int]:
        """Take ``n`` physical pages; OutOfMemory (nothing taken) if fewer are free."""
        with self._lock:
            self._open()
            if n > self.npages - self._in_use:
                raise OutOfMemory(
                    f"device {self.key}: {n} pages of {self.page_size} bytes requested, "
                    f"{self.npages - self._in_use} free",
                    requested=n * self.page_size,
                    total_capacity=self.capacity,
                    free=(self.npages - self._in_use) * self.page_size,
                    allocated=self._in_use * self.page_size,
                    device=self.key.ordinal,
                )
            out = []
            for _ in range(n):
                if self._recycled:
                    p = self._recycled.pop()
                else:
                    p = self._fresh
                    self._fresh += 1
                out.append(p)
                self._allocated.add(p)
            self._in_use += n
            return out

    def release_pages(self, pages: Sequence[int]) -> None:
        """Return physical pages. A page still mapped somewhere, or not held,
        is refused (InvalidRange) and nothing is returned."""
        with self._lock:
            self._open()
            for p in pages:
                if p not in self._allocated:
                    raise InvalidRange(f"physical page {p} is not held")
                if self._mapcount.get(p):
                    raise InvalidRange(f"physical page {p} is still mapped {self._mapcount[p]} time(s)")
            for p in pages:
                self._allocated.discard(p)
                self._data.pop(p, None)
                self._recycled.append(p)
            self._in_use -= len(pages)

    def copy_page(self, src: int, dst: int) -> None:
        """Physical page copy (used by copy-on-write)."""
        with self._lock:
            data = self._data.get(src)
            if data is None:
                self._data.pop(dst, None)
            else:
                self._data[dst] = data.copy()

    # ------------------------------------------------------------------
    # virtual address space and page table
    # ------------------------------------------------------------------

    def va_reserve(self, size: int, alignment: int = 0) -> int:
        """Reserve ``size`` bytes of VA (a page multiple); OutOfMemory if the VA space cannot."""
        with self._lock:
            self._open()
            align = max(alignment, self.page_size)
            a = self._va.alloc(size, align)
            if a is None:
                raise OutOfMemory(
                    f"device {self.key}: no {size}-byte range of virtual address space left",
                    requested=size,
                    total_capacity=self.capacity,
                    largest_free_block=self._va.largest_free(),
                    device=self.key.ordinal,
                )
            return a

    def va_free(self, address: int, size: int) -> None:
        with self._lock:
            self._open()
            vp = address // self.page_size
            for i in range(size // self.page_size):
                if vp + i in self._pt:
                    raise InvalidRange(f"VA [{address:#x}, +{size}) still has mapped pages")
            self._va.free(address, size)

    def map(self, address: int, phys: Sequence[int], *, writable: bool = True) -> None:
        """Map consecutive virtual pages from ``address`` to ``phys``; every
        virtual page must be unmapped and every physical page held."""
        with self._lock:
            self._open()
            if address % self.page_size:
                raise InvalidRange(f"map at {address:#x} is not page aligned")
            vp = address // self.page_size
            for i, p in enumerate(phys):
                if vp + i in self._pt:
                    raise InvalidRange(f"virtual page {(vp + i) * self.page_size:#x} is already mapped")
                if p not in self._allocated:
                    raise InvalidRange(f"physical page {p} is not held")
            for i, p in enumerate(phys):
                self._pt[vp + i] = PageEntry(p, writable)
                self._mapcount[p] = self._mapcount.get(p, 0) + 1

    def unmap(self, address: int, npages: int) -> list[int]:
        """Unmap ``npages`` mapped virtual pages; return their physical pages."""
        with self._lock:
            self._open()
            vp = address // self.page_size
            for i in range(npages):
                if vp + i not in self._pt:
                    raise InvalidRange(f"virtual page {(vp + i) * self.page_size:#x} is not mapped")
            out = []
            for i in range(npages):
                e = self._pt.pop(vp + i)
                c = self._mapcount[e.phys] - 1
                if c:
                    self._mapcount[e.phys] = c
                else:
                    del self._mapcount[e.phys]
                out.append(e.phys)
            return out

    def entry(self, address: int) -> PageEntry | None:
        """The page-table entry covering ``address`` (None: unmapped)."""
        with self._lock:
            e = self._pt.get(address // self.page_size)
            return None if e is None else PageEntry(e.phys, e.writable)

    def is_mapped(self, address: int) -> bool:
        with self._lock:
            return address // self.page_size in self._pt

    def mapped_pages(self) -> int:
        with self._lock:
            return len(self._pt)

    # ------------------------------------------------------------------
    # access checks and byte movement
    # ------------------------------------------------------------------

    def _fault(self, message: str, address: int, kind: str) -> DeviceFault:
        f = DeviceFault(message, address=address, kind=kind)
        self.faults.append(f)
        return f

    def check_access(self, address: int, size: int, *, write: bool, what: str = "access") -> DeviceFault | None:
        """The fault an access would raise (recorded), or None if every page is fine."""
        with self._lock:
            if not (type(address) is int or is_int(address)) or not (type(size) is int or is_int(size)) or size < 0:
                return self._fault(f"{what}: bad range {address!r}+{size!r}", 0, "bad_range")
            ps = self.page_size
            first, last = address // ps, (address + max(size, 1) - 1) // ps
            if first == last:  # one page: the common case
                e = self._pt.get(first)
                if e is not None and (e.writable or not write):
                    return None
            for vp in range(first, last + 1):
                e = self._pt.get(vp)
                if e is None:
                    return self._fault(f"{what} of unmapped page {vp * ps:#x}", vp * ps, "unmapped")
                if write and not e.writable:
                    return self._fault(f"{what}: write to read-only page {vp * ps:#x}", vp * ps, "read_only")
            return None

    def _pieces(self, address: int, size: int):
        ps = self.page_size
        pos, end = address, address + size
        while pos < end:
            vp, off = divmod(pos, ps)
            n = min(ps - off, end - pos)
            yield self._pt[vp].phys, off, n
            pos += n

    def _read(self, address: int, size: int) -> bytes:
        data = self._data
        if size <= self.page_size:
            vp, off = divmod(address, self.page_size)
            if off + size <= self.page_size:  # one page: the common case
                page = data.get(self._pt[vp].phys)
                return page.read(off, size) if page is not None else bytes(size)
        out = bytearray()
        for phys, off, n in self._pieces(address, size):
            page = data.get(phys)
            out += page.read(off, n) if page is not None else bytes(n)
        return bytes(out)

    def _snapshot(self, address: int, size: int) -> Snapshot:
        """What ``_read`` would return now, as a :class:`Snapshot` (pages copied
        chunk-table deep: later writes do not show through)."""
        data = self._data
        pieces = []
        for phys, off, n in self._pieces(address, size):
            page = data.get(phys)
            pieces.append((page.copy() if page is not None else None, off, n))
        return Snapshot(pieces)

    def _write(self, address: int, data: bytes) -> None:
        pos = 0
        pages = self._data
        for phys, off, n in self._pieces(address, len(data)):
            page = pages.get(phys)
            if page is None:
                page = pages[phys] = PageData()
            page.write(off, data[pos:pos + n] if n != len(data) else data)
            pos += n

    def _fill(self, address: int, size: int, byte: int) -> None:
        ps = self.page_size
        for phys, off, n in self._pieces(address, size):
            page = self._data.get(phys)
            if page is None:
                if byte == 0:
                    continue
                page = self._data[phys] = PageData()
            page.fill(off, n, byte, ps)

    def peek(self, address: int, size: int) -> bytes:
        """Host-side debug read, no stream ordering (a fault is recorded and raised)."""
        with self._lock:
            f = self.check_access(address, size, write=False, what="peek")
            if f is not None:
                raise f
            return self._read(address, size)

    # ------------------------------------------------------------------
    # streams, fences and the clock
    # ------------------------------------------------------------------

    def new_stream(self) -> int:
        with self._lock:
            self._open()
            sid = next(self._stream_ids)
            self._streams[sid] = _Stream(sid)
            return sid

    def _stream(self, sid: object) -> _Stream:
        s = self._streams.get(sid) if is_int(sid) else None  # type: ignore[arg-type]
        if s is None:
            raise InvalidRequest(f"unknown stream {sid!r}")
        return s

    def enqueue(self, stream: int, item: WorkItem) -> Fence:
        with self._lock:
            self._open()
            s = self._stream(stream)
            s.submitted += 1
            item.fence = Fence(s.sid, s.submitted)
            s.queue.append(item)
            return item.fence

    def current_fence(self, stream: int) -> Fence:
        """A fence that completes once everything enqueued so far on ``stream`` has run."""
        with self._lock:
            s = self._stream(stream)
            return Fence(s.sid, s.submitted)

    def fence_done(self, fence: Fence) -> bool:
        with self._lock:
            s = self._stream(fence.stream)
            if not is_int(fence.value) or fence.value > s.submitted:
                raise InvalidRequest(f"fence {fence} was never issued on stream {s.sid}")
            return s.completed >= fence.value

    def queued(self, stream: int | None = None) -> int:
        with self._lock:
            if stream is None:
                return sum(len(s.queue) for s in self._streams.values())
            return len(self._stream(stream).queue)

    def _execute(self, item: WorkItem) -> None:
        """Run one item: check every page first, then move bytes."""
        fault = None
        for a, n in item.reads:
            fault = fault or self.check_access(a, n, write=False, what=f"{item.kind} read")
        for a, n in item.writes:
            fault = fault or self.check_access(a, n, write=True, what=f"{item.kind} write")
        if fault is None:
            if item.kind == "write":
                self._write(item.writes[0][0], item.data)
            elif item.kind == "fill":
                a, n = item.writes[0]
                self._fill(a, n, item.byte)
            elif item.kind == "kernel":
                # what the kernel saw, without copying it: materialised by result()
                item.result = [self._snapshot(a, n) for a, n in item.reads]  # type: ignore[misc]
                for a, n in item.writes:
                    self._fill(a, n, item.byte)
                if item.fence is not None:
                    self._results[item.fence] = item.result
                    while len(self._results) > self.RESULTS_KEPT:
                        self._results.popitem(last=False)
            else:
                item.result = [self._read(a, n) for a, n in item.reads]
        item.fault = fault
        item.done = True
        self.items_executed += 1

    def advance(self, stream: int, n: int = 1) -> int:
        """Let ``stream`` execute up to ``n`` queued items; return how many ran.
        A faulting item completes (as faulted) and its fault is raised."""
        with self._lock:
            s = self._stream(stream)
            ran = 0
            while ran < n and s.queue:
                item = s.queue.popleft()
                self._execute(item)
                s.completed = item.fence.value  # type: ignore[union-attr]
                ran += 1
                if item.fault is not None:
                    raise item.fault
            return ran

    def read_now(self, stream: int, address: int, size: int) -> bytes | None:
        """A device-to-host copy of ``[address, +size)`` run at once when
        ``stream`` has nothing queued, as checking the copy, enqueueing it and
        :meth:`run_until` would (a fault is recorded and raised, nothing
        enqueued; else the stream's fence advances); ``None`` when work is
        queued (enqueue it instead)."""
        with self._lock:
            s = self._streams.get(stream) if type(stream) is int else None
            if s is None:
                s = self._stream(stream)
            if s.queue:
                return None
            if type(address) is int and type(size) is int and size > 0:
                # one mapped page (the common case): check_access and _read's own fast path, inline
                vp, off = divmod(address, self.page_size)
                e = self._pt.get(vp) if off + size <= self.page_size else None
                if e is not None:
                    s.submitted += 1
                    s.completed = s.submitted
                    self.items_executed += 1
                    page = self._data.get(e.phys)
                    return page.read(off, size) if page is not None else bytes(size)
            fault = self.check_access(address, size, write=False, what="copy")
            if fault is not None:
                raise fault
            s.submitted += 1
            s.completed = s.submitted
            self.items_executed += 1
            return self._read(address, size)

    def run_until(self, fence: Fence) -> None:
        """Advance ``fence.stream`` until ``fence`` is done."""
        with self._lock:
            s = self._stream(fence.stream)
            if fence.value > s.submitted:
                raise InvalidRequest(f"fence {fence} was never issued on stream {s.sid}")
            while s.completed < fence.value:
                self.advance(s.sid, 1)

    def synchronize(self, stream: int | None = None) -> None:
        """Run the stream's (or every stream's) queued work to the end."""
        with self._lock:
            sids = list(self._streams) if stream is None else [self._stream(stream).sid]
            for sid in sids:
                s = self._streams[sid]
                while s.queue:
                    self.advance(sid, 1)

    def result(self, fence: Fence) -> list[bytes] | None:
        """What the kernel completing at ``fence`` read (None if not run or forgotten)."""
        with self._lock:
            got = self._results.get(fence)
            if got is None:
                return None
            if any(isinstance(r, Snapshot) for r in got):
                got[:] = [r.data() if isinstance(r, Snapshot) else r for r in got]
            return list(got)
