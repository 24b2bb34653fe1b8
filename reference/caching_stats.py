"""Statistics and messages of the reference caching allocator (seed 003).

Key names and ``Stat`` semantics follow PyTorch 2.5's
``torch.cuda.memory_stats()`` so that tools written for PyTorch read ours:
``{allocation, segment, active, inactive_split, allocated_bytes,
reserved_bytes, active_bytes, inactive_split_bytes,
requested_bytes}.{all, small_pool, large_pool}.{current, peak, allocated,
freed}`` plus ``oversize_allocations``, ``oversize_segments``,
``num_alloc_retries``, ``num_ooms``, ``max_split_size``,
``num_sync_all_streams``, ``num_device_alloc``, ``num_device_free``.

Seed 003: *reserved >= allocated >= requested, always.* The summary reads in
that order: *requested -> allocated -> reserved, then the ratios and the OOM
count.*

Only :mod:`memspec.spec.api`/:mod:`memspec.spec.errors` may be imported
from the spec here (layering rule).
"""

from __future__ import annotations

from typing import Final

from memspec.spec.api import GiB, KiB, MiB

STAT_NAMES = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
POOL_NAMES = ("all", "small_pool", "large_pool")
ALL: Final = 0
SMALL: Final = 1
LARGE: Final = 2

ONE_EB: Final = 1 << 60
ONE_EB_MESSAGE = "CUDA out of memory. Tried to allocate more than 1EB memory."


class Stat:
    """PyTorch's ``Stat``: ``increase(n)``: current += n, peak = max(peak,
    current), allocated += n; ``decrease(n)``: current -= n, freed += n.

    ``freed`` is derived rather than counted (a decrease then touches one
    field): since the last ``reset_accumulated`` (when ``base`` took the
    current value), current = base + allocated - freed."""

    __slots__ = ("current", "peak", "allocated", "base")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.base = 0

    @property
    def freed(self) -> int:
        return self.base + self.allocated - self.current

    def increase(self, n: int) -> None:
        c = self.current + n
        self.current = c
        if c > self.peak:
            self.peak = c
        self.allocated += n

    def decrease(self, n: int) -> None:
        self.current -= n

    def reset_accumulated(self) -> None:
        self.allocated = 0
        self.base = self.current

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated, "freed": self.freed}


#: derived from ``allocation``/``allocated_bytes`` and the pending frees (see AllocatorStats)
DERIVED = ("active", "active_bytes")
#: figures whose ``all`` entry is a :class:`SumStat` of its two pools'
SUMMED = ("allocation", "allocated_bytes", "requested_bytes", "inactive_split", "inactive_split_bytes")


class SumStat:
    """The ``all`` entry of a pooled figure that changes on every malloc and
    free: ``current`` and ``allocated`` are the sums of the small and large
    pools' (each change happens in exactly one pool), so only the peak is
    its own, checked after every increase (:func:`increase_pooled`)."""

    __slots__ = ("parts", "peak", "base")

    def __init__(self, small: Stat, large: Stat) -> None:
        self.parts = (small, large)
        self.peak = self.base = 0

    @property
    def current(self) -> int:
        return self.parts[0].current + self.parts[1].current

    @property
    def allocated(self) -> int:
        return self.parts[0].allocated + self.parts[1].allocated

    @property
    def freed(self) -> int:
        return self.base + self.allocated - self.current

    def increase(self, n: int) -> None:
        """The pools carry the figure: only the peak is checked here."""
        c = self.current
        if c > self.peak:
            self.peak = c

    def decrease(self, n: int) -> None:
        """The pools carry the figure: nothing to do."""

    def reset_accumulated(self) -> None:
        self.base = self.current

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated, "freed": self.freed}


def increase_pooled(stat: list, idx: int, n: int) -> None:
    """``Stat.increase(n)`` on pool ``idx``'s entry; the ``all`` entry (a
    :class:`SumStat`) follows, its peak checked."""
    s = stat[idx]
    c = s.current + n
    s.current = c
    s.allocated += n
    if c > s.peak:
        s.peak = c
    t = stat[ALL]
    c = t.current
    if c > t.peak:
        t.peak = c


def _summed() -> list:
    """``[all, small_pool, large_pool]`` of a figure whose ``all`` entry is the pools' sum."""
    small, large = Stat(), Stat()
    return [SumStat(small, large), small, large]


class AllocatorStats:
    """Every counter of one device's caching allocator.

    ``active`` and ``active_bytes`` are not counted separately: a block is
    active while it is allocated or its free is pending on another stream's
    events, so ``active = allocation + pending`` (``pending``,
    ``pending_bytes``: per pool, the frees waiting on events), and both rise
    only at malloc, by the same amounts as ``allocation``/``allocated_bytes``
    -- hence the same ``allocated`` (cumulative) figure.  Their peak is the
    larger of ``allocation``'s peak and the highest active figure seen at a
    malloc while a free was pending (``note_malloc_while_pending``) or at
    the last ``reset_peak``.  The malloc/free hot path thus updates three
    figures (count, bytes, requested) instead of five; reading ``active``
    builds the ``Stat`` objects from them."""

    def __init__(self) -> None:
        # one list per figure, indexed ALL/SMALL/LARGE (the SUMMED ones' ALL entry is a SumStat)
        self.allocation: list = _summed()
        self.segment: list = [Stat(), Stat(), Stat()]
        self.inactive_split: list = _summed()
        self.allocated_bytes: list = _summed()
        self.reserved_bytes: list = [Stat(), Stat(), Stat()]
        self.inactive_split_bytes: list = _summed()
        self.requested_bytes: list = _summed()
        self.pending = [0, 0, 0]  # frees waiting on events: count, per ALL/SMALL/LARGE
        self.pending_bytes = [0, 0, 0]
        self._xpeak = [0, 0, 0]  # highest active count seen while a free was pending (or at reset_peak)
        self._xpeak_bytes = [0, 0, 0]
        self._act_base = [0, 0, 0]  # active.current at the last reset_accumulated
        self._actb_base = [0, 0, 0]
        self.oversize_allocations = Stat()
        self.oversize_segments = Stat()
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.max_split_size = -1  # PyTorch prints SIZE_MAX cast to int64: -1 = unlimited

    @staticmethod
    def _derive(of: list, pend: list, xpeak: list, base: list) -> list:
        out = []
        for j in (ALL, SMALL, LARGE):
            a, s = of[j], Stat()
            s.current = a.current + pend[j]
            s.allocated = a.allocated
            s.peak = max(a.peak, xpeak[j])
            s.base = base[j]
            out.append(s)
        return out

    @property
    def active(self) -> list:
        """``active`` (blocks allocated or pending free), built on read."""
        return self._derive(self.allocation, self.pending, self._xpeak, self._act_base)

    @property
    def active_bytes(self) -> list:
        return self._derive(self.allocated_bytes, self.pending_bytes, self._xpeak_bytes, self._actb_base)

    def add_pending(self, idx: int, n: int) -> None:
        """A free of ``n`` bytes in pool ``idx`` now waits on events (still active)."""
        for j in (ALL, idx):
            self.pending[j] += 1
            self.pending_bytes[j] += n

    def drop_pending(self, idx: int, n: int) -> None:
        """A pending free of ``n`` bytes completed (no longer active)."""
        for j in (ALL, idx):
            self.pending[j] -= 1
            self.pending_bytes[j] -= n

    def note_malloc_while_pending(self, idx: int) -> None:
        """After a malloc in pool ``idx`` while frees are pending: the active
        figures exceed allocation's, so their peaks are tracked here."""
        for j in (ALL, idx):
            c = self.allocation[j].current + self.pending[j]
            if c > self._xpeak[j]:
                self._xpeak[j] = c
            c = self.allocated_bytes[j].current + self.pending_bytes[j]
            if c > self._xpeak_bytes[j]:
                self._xpeak_bytes[j] = c

    def flat(self) -> dict[str, int]:
        """``torch.cuda.memory_stats()``: flattened with '.', keys sorted.

        The figures are read in :data:`_FLAT_KEYS`' order and placed in
        sorted order by a permutation made once (no key text per read)."""
        vals: list[int] = []
        for name in STAT_NAMES:
            stats = getattr(self, name)
            if len(stats) != len(POOL_NAMES):
                raise ValueError(f"{name}: {len(stats)} pool entries, not {len(POOL_NAMES)}")
            for stat in stats:
                vals += (stat.current, stat.peak, stat.allocated, stat.freed)
        for s in (self.oversize_allocations, self.oversize_segments):
            vals += (s.current, s.peak, s.allocated, s.freed)
        vals += (self.num_alloc_retries, self.num_ooms, self.num_sync_all_streams, self.num_device_alloc,
                 self.num_device_free, self.max_split_size)
        return dict(zip(_FLAT_SORTED, [vals[i] for i in _FLAT_ORDER]))

    def reset_peak(self) -> None:
        for name in STAT_NAMES:
            if name not in DERIVED:
                for s in getattr(self, name):
                    s.peak = s.current
        for j in (ALL, SMALL, LARGE):
            self._xpeak[j] = self.allocation[j].current + self.pending[j]
            self._xpeak_bytes[j] = self.allocated_bytes[j].current + self.pending_bytes[j]
        self.oversize_allocations.peak = self.oversize_allocations.current
        self.oversize_segments.peak = self.oversize_segments.current

    def reset_accumulated(self) -> None:
        for j in (ALL, SMALL, LARGE):
            self._act_base[j] = self.allocation[j].current + self.pending[j]
            self._actb_base[j] = self.allocated_bytes[j].current + self.pending_bytes[j]
        for name in STAT_NAMES:
            if name not in DERIVED:
                for s in getattr(self, name):
                    s.reset_accumulated()
        for s in (self.oversize_allocations, self.oversize_segments):
            s.reset_accumulated()
        self.num_alloc_retries = self.num_ooms = self.num_sync_all_streams = 0
        self.num_device_alloc = self.num_device_free = 0


#: the keys of ``AllocatorStats.flat()`` in the order it reads the figures
#: (each ``Stat``'s ``current``, ``peak``, ``allocated``, ``freed``: ``Stat.as_dict``'s)
_FLAT_KEYS: tuple[str, ...] = tuple(
    [f"{name}.{pool}.{field}" for name in STAT_NAMES for pool in POOL_NAMES
     for field in ("current", "peak", "allocated", "freed")]
    + [f"{name}.{field}" for name in ("oversize_allocations", "oversize_segments")
       for field in ("current", "peak", "allocated", "freed")]
    + ["num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
       "max_split_size"])
#: read position of each key in sorted key order, and the sorted keys
_FLAT_ORDER: tuple[int, ...] = tuple(sorted(range(len(_FLAT_KEYS)), key=lambda i: _FLAT_KEYS[i]))
_FLAT_SORTED: tuple[str, ...] = tuple(_FLAT_KEYS[i] for i in _FLAT_ORDER)


# --------------------------------------------------------------------------
# Sizes and messages
# --------------------------------------------------------------------------

def format_size(n: int) -> str:
    """PyTorch's ``format_size``: "N bytes" up to 1024, then KiB/MiB/GiB with two decimals."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= MiB:
        return f"{n / KiB:.2f} KiB"
    if n <= GiB:
        return f"{n / MiB:.2f} MiB"
    return f"{n / GiB:.2f} GiB"


def format_mib(n: int) -> str:
    """The seed toy's figures: whole MiB (``40 MiB``); two decimals when not whole."""
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n / MiB:.2f} MiB"


def pytorch_oom_message(
    *,
    tried: int,
    device: int,
    total: int,
    free: int,
    allocated: int,
    reserved: int,
    allowed: int | None = None,
    processes: dict[int, int] | None = None,
    private_pools: int = 0,
) -> str:
    """PyTorch 2.5's OOM text (``CUDACachingAllocator.cpp``, ``malloc``)."""
    proc = "".join(f"Process {pid} has {format_size(b)} memory in use. " for pid, b in sorted((processes or {}).items()))
    allowed_info = f"{format_size(allowed)} allowed; " if allowed is not None else ""
    private = f"with {format_size(private_pools)} allocated in private pools (e.g., CUDA Graphs), " if private_pools else ""
    return (
        f"CUDA out of memory. Tried to allocate {format_size(tried)}. GPU {device} has a total capacity of "
        f"{format_size(total)} of which {format_size(free)} is free. {proc}{allowed_info}"
        f"Of the allocated memory {format_size(allocated + private_pools)} is allocated by PyTorch, {private}"
        f"and {format_size(reserved - allocated - private_pools)} is reserved by PyTorch but unallocated. "
        "If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
        "See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def seed_oom_message(*, tried: int, total: int, reserved: int, allocated: int, largest_free: int) -> str:
    """The seed toy's OOM text: *CUDA out of memory. Tried to allocate 20 MiB
    (device 40 MiB; 40 MiB reserved; 16 MiB is reserved but unallocated;
    largest free block 4 MiB)*."""
    return (
        f"CUDA out of memory. Tried to allocate {format_mib(tried)} (device {format_mib(total)}; "
        f"{format_mib(reserved)} reserved; {format_mib(reserved - allocated)} is reserved but unallocated; "
        f"largest free block {format_mib(largest_free)})"
    )


def memory_summary(flat: dict[str, int], *, title: str = "CUDA Memory Summary") -> str:
    """The human-readable table, read top to bottom as the seed says:
    *requested -> allocated -> reserved, then the ratios and the OOM count.*"""

    def row(label: str, key: str, fmt=format_size) -> str:
        cells = [fmt(flat[f"{key}.all.{f}"]) for f in ("current", "peak", "allocated", "freed")]
        return f"| {label:<24}| " + " | ".join(f"{c:>11}" for c in cells) + " |"

    def count(n: int) -> str:
        return str(n)

    req = flat["requested_bytes.all.current"]
    alloc = flat["allocated_bytes.all.current"]
    res = flat["reserved_bytes.all.current"]
    r1 = f"{alloc / req:.3f}" if req else "n/a"
    r2 = f"{res / alloc:.3f}" if alloc else "n/a"
    width = 80
    head = f"| {'Metric':<24}| " + " | ".join(f"{h:>11}" for h in ("Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed")) + " |"
    lines = [
        "|" + "=" * (width - 2) + "|",
        f"|{title:^{width - 2}}|",
        "|" + "-" * (width - 2) + "|",
        f"|{'  OOM events: ' + str(flat['num_ooms']) + '   |   cudaMalloc retries: ' + str(flat['num_alloc_retries']):<{width - 2}}|",
        "|" + "=" * (width - 2) + "|",
        head,
        "|" + "-" * (width - 2) + "|",
        row("Requested memory", "requested_bytes"),
        row("Allocated memory", "allocated_bytes"),
        row("Active memory", "active_bytes"),
        row("GPU reserved memory", "reserved_bytes"),
        row("Non-releasable memory", "inactive_split_bytes"),
        "|" + "-" * (width - 2) + "|",
        row("Allocations", "allocation", count),
        row("Active allocs", "active", count),
        row("GPU reserved segments", "segment", count),
        row("Non-releasable allocs", "inactive_split", count),
        "|" + "-" * (width - 2) + "|",
        f"| Ratio of allocated to requested memory | {r1:>8} |   <- internal fragmentation (rounding tax)",
        f"| Ratio of reserved to allocated memory  | {r2:>8} |   <- segment slack and holes",
        f"| Segments {flat['segment.all.current']:<6} | Inactive splits {flat['inactive_split.all.current']:<6} "
        f"| OOM events {flat['num_ooms']:<4} | cudaMalloc retries {flat['num_alloc_retries']:<4} |",
        "|" + "=" * (width - 2) + "|",
    ]
    return "\n".join(lines)
