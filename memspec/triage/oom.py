"""Out-of-memory messages: read every figure, then say why it failed.

Seed 003: *Read the error before touching anything. Its two lines
(reserved-but-unallocated; other-process usage) do the first two flowchart
steps for you.*  This module reads those lines -- in every format PyTorch has
printed since 1.x, plus the driver's plain ``CUDA error: out of memory``, the
library statuses (cuBLAS, cuDNN, NCCL) and TensorFlow/JAX's
``RESOURCE_EXHAUSTED`` -- and then goes one step before the seed's flowchart:
**does the request fit at all?**  Only then does it walk the six causes in the
seed's order (*fragmentation -> other processes -> NCCL buffers -> CUDA graph
private pools -> cuDNN workspaces -> driver/kernel reserve*), each fired by
evidence in the figures, and says ``unknown`` -- with what is missing -- when
the figures do not decide.

Formats read (PyTorch's ``c10/cuda/CUDACachingAllocator.cpp`` across versions):

* 1.x-2.0: ``Tried to allocate X (GPU d; T total capacity; A already allocated;
  F free; [L allowed; ]R reserved in total by PyTorch)``; before 1.5 the last
  figure is ``R cached)``.
* 2.1-2.2: ``Tried to allocate X. GPU d has a total capacty of T of which F is
  free.`` (sic), 2.3+: ``total capacity``; then ``Process P has U memory in
  use.`` lines (other PIDs -- and, inside a container, this process's own
  line), ``Including non-PyTorch memory, this process has U memory in use.``,
  ``L allowed;``, ``Of the allocated memory A is allocated by PyTorch, [with G
  allocated in private pools (e.g., CUDA Graphs), ]and U is reserved by
  PyTorch but unallocated.``  A includes G; reserved = A + U.
* the seed toy's ``(device T; R reserved; U is reserved but unallocated;
  largest free block B)``; MPS's ``MPS allocated: A, ... max allowed: L``;
  TensorFlow/JAX ``Out of memory while trying to allocate N bytes``.

Sizes: ``bytes``, ``KiB/MiB/GiB/TiB`` (powers of 1024) and ``KB/MB/GB/TB``
(read as powers of 1024 too, as PyTorch's MPS message and nvidia-smi mean
them).  Every figure is returned in bytes.

Untrusted input: the text is scanned in linear time -- literal searches for
``memory``/``allocat`` and a few library names, then anchored, possessive
patterns in a bounded window around each hit (no pattern can backtrack over a
run of digits).  Binary input is refused with :class:`BinaryInput`.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import re
from dataclasses import dataclass, field
from typing import Any

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

#: The verdict ids (``--json``'s ``cause``).
CAUSES: dict[str, str] = {
    "does-not-fit": "the request cannot fit: larger than the card, or larger than every byte this process could get",
    "fragmentation": "seed cause 1: reserved-but-unallocated memory stranded in partly used segments",
    "other-processes": "seed cause 2: memory held outside this process's PyTorch (co-tenants)",
    "nccl": "seed cause 3: NCCL communication buffers",
    "graph-pools": "seed cause 4: CUDA graph private pools",
    "cudnn-workspace": "seed cause 5: a cuDNN workspace",
    "driver-reserve": "seed cause 6: driver/kernel reserve (memory the driver reports but will not give)",
    "unknown": "the figures do not decide; the evidence says what is missing",
}

#: Figures of ``parsed`` in ``--json`` order.
FIGURES = ("requested", "total", "free", "allocated", "reserved", "reserved_unallocated", "this_process",
           "other_processes", "private_pools", "allowed")

_UNIT = {b"b": 1, b"byte": 1, b"bytes": 1, b"kib": KiB, b"kb": KiB, b"mib": MiB, b"mb": MiB,
         b"gib": GiB, b"gb": GiB, b"tib": TiB, b"tb": TiB}

#: A size right at a position (forward).  Bounded, possessive: no backtracking.
_FWD = re.compile(rb"[ \t\r\n\f\v]{0,8}([0-9]{1,30}+(?:\.[0-9]{1,30}+)?)(?![0-9.][0-9])[ \t\r\n\f\v]{0,4}"
                  rb"(bytes|byte|kib|mib|gib|tib|kb|mb|gb|tb|b)(?![a-z])")
#: A size ending right before a position (searched in a <= 80-byte window).
_BACK = re.compile(rb"([0-9]{1,30}(?:\.[0-9]{1,30})?)[ \t\r\n\f\v]{0,4}"
                   rb"(bytes|byte|kib|mib|gib|tib|kb|mb|gb|tb|b)[ \t\r\n\f\v]{0,4}\Z")
_BACK_WINDOW = 80

_W = rb"[ \t\r\n\f\v]++"      # whitespace run between words (wrapped lines)
_O = rb"[ \t\r\n\f\v]*+"
_OF = re.compile(_W + rb"of(?![a-z])")
_IS_FREE = re.compile(_W + rb"is" + _W + rb"free")

#: Anchors inside a window: (name, pattern).  Each is tried only where its
#: first word occurs; all are possessive.
_ANCHORS = re.compile(rb"(?=[otamfrcipl(gw])(?:" + b"|".join([
    rb"(?P<oom>out" + _W + rb"of" + _W + rb"memory)",
    rb"(?P<tried>tr(?:ied|ying)" + _W + rb"to" + _W + rb"allocate)",
    rb"(?P<xla>memory" + _W + rb"allocating)",
    rb"(?P<cap>total" + _W + rb"capac(?:i)?ty)",
    rb"(?P<already>already" + _W + rb"allocated)",
    rb"(?P<free1>(?<![a-z])free" + _O + rb"[;)])",
    rb"(?P<ofwhich>of" + _W + rb"which)",
    rb"(?P<allowed>(?<![a-z])allowed" + _O + rb";)",
    rb"(?P<restotal>reserved" + _W + rb"in" + _W + rb"total)",
    rb"(?P<cached>(?<![a-z])cached" + _O + rb"[;)])",
    rb"(?P<bypt>is" + _W + rb"allocated" + _W + rb"by" + _W + rb"pytorch)",
    rb"(?P<pools>allocated" + _W + rb"in" + _W + rb"private" + _W + rb"pools)",
    rb"(?P<ru>is" + _W + rb"reserved" + _W + rb"(?:by" + _W + rb"pytorch" + _W + rb")?but" + _W + rb"unallocated)",
    rb"(?P<this>this" + _W + rb"process" + _W + rb"has)",
    rb"(?P<proc>(?<![a-z])process" + _W + rb"(?P<pid>[0-9]{1,10}+)" + _W + rb"has)",
    rb"(?P<seeddev>\(device)(?![a-z])",
    rb"(?P<seedres>(?<![a-z])reserved" + _O + rb";)",
    rb"(?P<largest>largest" + _W + rb"free" + _W + rb"block)",
    rb"(?P<mpsalloc>mps" + _W + rb"allocated" + _O + rb":)",
    rb"(?P<maxallowed>max" + _W + rb"allowed" + _O + rb":)",
    rb"(?P<gpu>(?<![a-z])gpu" + _W + rb"(?P<dev>[0-9]{1,3}+)(?![0-9]))",
]) + rb")")   # the look-ahead lets the engine skip bytes no anchor can start with

#: Whole-text markers: (hint, literal in the lower-cased text).
_MARKERS: tuple[tuple[str, bytes], ...] = (
    ("nccl", b"nccl"),
    ("cudnn", b"cudnn"),
    ("cublas", b"cublas_status_alloc_failed"),
    ("allocfail", b"_status_alloc_failed"),       # CUBLAS_/CUDNN_/CUSOLVER_STATUS_ALLOC_FAILED
    ("driver", b"cuda error: out of memory"),
    ("driver", b"cuda runtime error (2)"),
    ("driver", b"cudaerrormemoryallocation"),
    ("driver", b"cuda_error_out_of_memory"),
    ("driver", b"hiperroroutofmemory"),
    ("tensorflow", b"resource_exhausted"),
    ("tensorflow", b"resource exhausted"),
    ("tensorflow", b"oom when allocating"),
    ("overflow", b"more than 1eb"),
    ("expandable", b"expandable_segments:true"),
)
#: Literals whose neighbourhood is read for figures.
#: Literals that open an OOM message; the figures are read in a window around each.
_SEEDS = (b"of memory", b"to allocate", b"outofmemory", b"out_of_memory", b"memoryallocation",
          b"resource_exhausted", b"_alloc_failed", b"total capac")
_BEFORE, _AFTER = 400, 2000
#: at most this many bytes of message windows are read closely (~1,200 messages);
#: the rest are counted, not read -- the work stays bounded whatever the log
MAX_READ = 512 << 10
#: markers looked for in the whole text; the others only where a window is read
_GLOBAL_MARKERS = ("nccl", "cudnn")


class NotAnOOM(ValueError):
    """The text carries no out-of-memory message."""


class BinaryInput(ValueError):
    """The input is not text (NUL bytes, invalid UTF-8, or mostly control bytes)."""


@dataclass
class Figures:
    """What one OOM message says, every size in bytes (None: not in the input)."""

    kind: str = "unknown"      # pytorch-2.x | pytorch-1.x | pytorch-1.x-cached | seed | mps | tensorflow | driver | snapshot
    requested: int | None = None
    total: int | None = None
    free: int | None = None
    allocated: int | None = None          # PyTorch's allocated bytes (private pools included)
    reserved: int | None = None
    reserved_unallocated: int | None = None
    this_process: int | None = None
    other_processes: list[tuple[int, int]] | None = None   # (pid, bytes); None: the input cannot say
    private_pools: int | None = None
    allowed: int | None = None
    largest_free_block: int | None = None
    device: int | None = None
    #: figures computed from others (e.g. reserved = allocated + unallocated), with the formula
    derived: dict[str, str] = field(default_factory=dict)
    #: "Process P has U" lines as printed (before deciding which one is this process)
    process_lines: list[tuple[int, int]] = field(default_factory=list)
    self_pid_note: str | None = None
    hints: set[str] = field(default_factory=set)
    messages: int = 1
    devices: list[int] = field(default_factory=list)
    stats_notes: list[str] = field(default_factory=list)
    inactive_split: int | None = None
    segments: int | None = None
    unread: int = 0            # bytes of message windows beyond MAX_READ, counted but not read

    def parsed(self) -> dict[str, Any]:
        """The ``--json`` ``parsed`` object: figures in bytes, absent when unknown."""
        out: dict[str, Any] = {}
        for k in FIGURES:
            v = getattr(self, k)
            if v is None:
                continue
            if k == "other_processes":
                out[k] = [{"pid": pid, "used": used} for pid, used in v]
            else:
                out[k] = v
        return out


# ---------------------------------------------------------------------------
# Reading the text
# ---------------------------------------------------------------------------

_TEXT_OK = bytes(range(0x20, 0x100)) + b"\t\n\r\f\v\x1b"


def to_bytes(data: bytes | str) -> bytes:
    """Check that ``data`` is text and return it as UTF-8 bytes.

    Raises :class:`BinaryInput` for NUL bytes, invalid UTF-8, or more than 1%
    control bytes.  Linear: a handful of C-level passes."""
    if isinstance(data, str):
        try:
            raw = data.encode("utf-8")
        except UnicodeEncodeError as e:   # lone surrogates
            raise BinaryInput(f"the input is not text: {e.reason} at character {e.start}") from None
    else:
        raw = bytes(data)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BinaryInput(f"the input is not UTF-8 text (byte {e.start}: {e.reason}); "
                              "paste the error message, not a binary file") from None
    controls = len(raw.translate(None, _TEXT_OK))    # NUL included: one pass
    nul = raw.find(b"\x00") if controls else -1
    if nul >= 0:
        raise BinaryInput(f"the input is binary (a NUL byte at offset {nul}); paste the error message text")
    if raw and controls * 100 > len(raw):
        raise BinaryInput(f"the input is binary ({controls} control bytes in {len(raw)})")
    return raw


def _num(num: bytes, unit: bytes) -> int:
    return int(round(float(num) * _UNIT[unit]))


def _size_after(s: bytes, pos: int) -> tuple[int, int] | None:
    m = _FWD.match(s, pos)
    if not m:
        return None
    return _num(m.group(1), m.group(2)), m.end()


def _size_before(s: bytes, pos: int) -> int | None:
    lo = max(0, pos - _BACK_WINDOW)
    m = _BACK.search(s, lo, pos)
    if not m:
        return None
    start = m.start(1)
    if start > 0 and s[start - 1:start] in (b".",) or (start > 0 and 48 <= s[start - 1] <= 57):
        return None   # the number runs on past the window: not a figure we can read
    return _num(m.group(1), m.group(2))


def _windows(low: bytes) -> list[tuple[int, int]]:
    """Merged [lo, hi) windows around every seed literal (C-level finds).

    After a hit the search resumes ``skip`` bytes further on, and the hit's
    window reaches ``skip`` further to cover the hits skipped; while hits keep
    coming densely the skip doubles (up to 64 KiB), so a log that is nothing
    but OOM messages costs a few thousand finds, not one per message."""
    hits: list[tuple[int, int]] = []
    base, top = _AFTER // 2, 64 << 10
    for lit in _SEEDS:
        skip = base
        p = low.find(lit)
        while p >= 0:
            hits.append((p, skip))
            q = low.find(lit, p + skip)
            skip = min(top, skip * 2) if 0 <= q < p + 2 * skip else base
            p = q
    if not hits:
        return []
    hits.sort()
    out: list[list[int]] = []
    n = len(low)
    for p, skip in hits:
        lo, hi = max(0, p - _BEFORE), min(n, p + _AFTER + skip)
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


class _Rec:
    __slots__ = ("f", "has_fig", "oom")

    def __init__(self) -> None:
        self.f = Figures()
        self.has_fig = False
        self.oom = False


def _scan(low: bytes, windows: list[tuple[int, int]]) -> list[Figures]:
    """Every OOM message in the text, in order (one Figures each)."""
    recs: list[_Rec] = []
    cur = _Rec()

    def new() -> _Rec:
        nonlocal cur
        if cur.has_fig or cur.oom:
            recs.append(cur)
        cur = _Rec()
        return cur

    def put(name: str, value: int | None) -> None:
        if value is None:
            return
        if getattr(cur.f, name) is not None:
            new()
        setattr(cur.f, name, value)
        cur.has_fig = True

    formats: dict[int, set[str]] = {}
    for lo, hi in windows:
        new()
        for m in _ANCHORS.finditer(low, lo, hi):
            a = m.lastgroup
            if a == "pid":
                a = "proc"
            elif a == "dev":
                a = "gpu"
            if a == "oom":
                if cur.has_fig:
                    new()
                cur.oom = True
            elif a == "tried":
                got = _size_after(low, m.end())
                if got is None:
                    if low.startswith(b" more than 1eb", m.end()) or low.startswith(b"more than 1eb", m.end() + 1):
                        if cur.has_fig:
                            new()
                        cur.f.hints.add("overflow")
                        cur.oom = True
                    continue
                put("requested", got[0])   # a second 'Tried to allocate' starts the next message
                cur.oom = True
            elif a == "xla":
                got = _size_after(low, m.end())
                if got:
                    put("requested", got[0])
            elif a == "cap":
                after = _OF.match(low, m.end())
                if after:
                    got = _size_after(low, after.end())
                    put("total", got[0] if got else None)
                    formats.setdefault(id(cur), set()).add("2.x")
                else:
                    put("total", _size_before(low, m.start()))
                    formats.setdefault(id(cur), set()).add("1.x")
            elif a == "already":
                put("allocated", _size_before(low, m.start()))
            elif a == "free1":
                put("free", _size_before(low, m.start()))
            elif a == "ofwhich":
                got = _size_after(low, m.end())
                if got and _IS_FREE.match(low, got[1]):
                    put("free", got[0])
            elif a == "allowed":
                put("allowed", _size_before(low, m.start()))
            elif a == "restotal":
                put("reserved", _size_before(low, m.start()))
            elif a == "cached":
                # PyTorch 1.0-1.4: "X cached)" = amount_cached - amount_allocated
                v = _size_before(low, m.start())
                if v is not None:
                    put("reserved_unallocated", v)
                    formats.setdefault(id(cur), set()).add("cached")
            elif a == "bypt":
                put("allocated", _size_before(low, m.start()))
                formats.setdefault(id(cur), set()).add("2.x")
            elif a == "pools":
                put("private_pools", _size_before(low, m.start()))
            elif a == "ru":
                put("reserved_unallocated", _size_before(low, m.start()))
            elif a == "this":
                got = _size_after(low, m.end())
                if got:
                    put("this_process", got[0])
            elif a == "proc":
                got = _size_after(low, m.end())
                if got:
                    cur.f.process_lines.append((int(m.group("pid")), got[0]))
                    cur.has_fig = True
            elif a == "seeddev":
                got = _size_after(low, m.end())
                if got:
                    put("total", got[0])
                    formats.setdefault(id(cur), set()).add("seed")
            elif a == "seedres":
                put("reserved", _size_before(low, m.start()))
            elif a == "largest":
                got = _size_after(low, m.end())
                if got:
                    put("largest_free_block", got[0])
            elif a == "mpsalloc":
                got = _size_after(low, m.end())
                if got:
                    put("allocated", got[0])
                    formats.setdefault(id(cur), set()).add("mps")
            elif a == "maxallowed":
                got = _size_after(low, m.end())
                if got:
                    put("allowed", got[0])
            elif a == "gpu":
                if cur.f.device is None and (cur.oom or cur.has_fig):
                    cur.f.device = int(m.group("dev"))
    new()
    out = []
    for r in recs:
        fm = formats.get(id(r), set())
        f = r.f
        if "seed" in fm:
            f.kind = "seed"
        elif "mps" in fm:
            f.kind = "mps"
        elif "2.x" in fm:
            f.kind = "pytorch-2.x"
        elif "cached" in fm:
            f.kind = "pytorch-1.x-cached"
        elif "1.x" in fm or f.reserved is not None:
            f.kind = "pytorch-1.x"
        elif r.has_fig:
            f.kind = "tensorflow" if f.requested is not None and f.total is None else "pytorch-partial"
        else:
            f.kind = "driver"
        out.append(f)
    return out


def _complete(f: Figures) -> None:
    """Derive what the printed figures imply (recorded in ``derived``)."""
    if f.kind == "seed":
        if f.reserved is not None and f.reserved_unallocated is not None and f.allocated is None:
            f.allocated = f.reserved - f.reserved_unallocated
            f.derived["allocated"] = "reserved - reserved_unallocated"
        if f.total is not None and f.reserved is not None and f.free is None:
            f.free = max(0, f.total - f.reserved)
            f.derived["free"] = "total - reserved (the toy has no other tenant)"
    if f.reserved is None and f.allocated is not None and f.reserved_unallocated is not None:
        f.reserved = f.allocated + f.reserved_unallocated
        f.derived["reserved"] = "allocated + reserved_unallocated"
    if f.reserved_unallocated is None and f.reserved is not None and f.allocated is not None:
        f.reserved_unallocated = max(0, f.reserved - f.allocated)
        f.derived["reserved_unallocated"] = "reserved - allocated"
    if f.kind == "pytorch-2.x" and f.other_processes is None and f.this_process is not None:
        # PyTorch >= 2.1 lists every process the driver reports; when it printed this
        # process's own line, no other line means no other process.  (No line at all:
        # the driver gave no list -- unknown, not none.)
        f.other_processes = []


def resolve_self(f: Figures, pid: int | None = None) -> None:
    """Decide which ``Process P has U`` line (if any) is this process.

    PyTorch prints ``this process has`` only when the driver's PID equals
    ``getpid()``; inside a container the PIDs differ, so the process's own
    usage is printed as ``Process P has U``.  With ``pid`` given, that line is
    this process.  Otherwise, when no ``this process`` line was printed, the
    single line whose usage covers PyTorch's reserved memory (a process's own
    usage always includes its reserved memory; the CUDA context adds
    hundreds of MiB) is taken as this process, and said so."""
    lines = list(f.process_lines)
    if not lines:
        return
    mine: tuple[int, int] | None = None
    if pid is not None:
        mine = next((pl for pl in lines if pl[0] == pid), None)
        if mine is not None:
            f.self_pid_note = f"process {pid} is this process (--pid)"
    elif f.this_process is None and f.reserved is not None:
        covering = [pl for pl in lines if pl[1] >= f.reserved]
        listed = sum(u for _, u in lines)
        if covering and f.total is not None and f.free is not None:
            # which story explains the card's used memory better: one of the lines is
            # this process, or none is (then this process adds its reserved + a context)?
            used = f.total - f.free
            if abs(used - listed) > abs(used - (listed + f.reserved + _CONTEXT_ALLOWANCE // 3)):
                covering = []
                f.self_pid_note = (f"the listed processes ({fmt(listed)}) plus this process's {fmt(f.reserved)} "
                                   f"reserved explain the {fmt(used)} in use: none of them is this process")
        if covering:
            mine = min(covering, key=lambda pl: pl[1] - f.reserved)
            f.self_pid_note = (f"no 'this process has' line, and process {mine[0]}'s {fmt(mine[1])} covers PyTorch's "
                               f"{fmt(f.reserved)} reserved: it is this process, printed by PID because the "
                               "driver's PID differs from the process's own (a container)"
                               + ("" if len(covering) == 1 else "; several lines qualify, the closest is taken "
                                  "-- pass --pid to say which"))
    if mine is not None and f.this_process is None:
        f.this_process = mine[1]
        f.derived["this_process"] = f"the 'Process {mine[0]} has' line"
    f.other_processes = [pl for pl in lines if pl is not mine]


def parse(data: bytes | str, *, pid: int | None = None) -> Figures:
    """Read an OOM message (or a log holding one or several).

    Returns the figures of the message with the most figures (the first on a
    tie); ``messages`` and ``devices`` say how many were found.  Raises
    :class:`BinaryInput` or :class:`NotAnOOM`."""
    raw = to_bytes(data)
    low = raw.lower()
    budget, read, unread = MAX_READ, [], 0
    for lo, hi in _windows(low):
        take = min(hi - lo, budget)
        if take > 0:
            read.append((lo, lo + take))
        unread += (hi - lo) - max(take, 0)
        budget -= max(take, 0)
    hints = set()
    for h, lit in _MARKERS:
        if h in _GLOBAL_MARKERS:
            if low.find(lit) >= 0:
                hints.add(h)
        elif any(low.find(lit, lo, hi) >= 0 for lo, hi in read):
            hints.add(h)
    recs = _scan(low, read)
    ooms = [r for r in recs if r.kind != "driver" or r.requested is not None]
    if not recs and not (hints & {"driver", "allocfail", "tensorflow"}):
        raise NotAnOOM("the text is not an out-of-memory message (no 'out of memory', 'Tried to allocate', "
                       "'RESOURCE_EXHAUSTED' or allocation-failure status found)")
    if not recs:
        recs = [Figures(kind="tensorflow" if "tensorflow" in hints else "driver")]
    figured = ooms or recs

    def score(f: Figures) -> int:
        return sum(getattr(f, k) is not None for k in FIGURES) + len(f.process_lines)

    best = max(figured, key=score)   # max keeps the first of equals
    best.hints |= hints
    best.messages = len(figured)
    best.devices = sorted({r.device for r in figured if r.device is not None})
    best.unread = unread
    _complete(best)
    resolve_self(best, pid)
    return best


# ---------------------------------------------------------------------------
# Other inputs: memory_stats(), nvidia-smi
# ---------------------------------------------------------------------------

MAX_STATS_BYTES = 4 * MiB


def parse_memory_stats(text: str) -> dict[str, int]:
    """``torch.cuda.memory_stats()`` as printed (a dict, an ``OrderedDict([...])``
    repr, or JSON).  Parsed with :func:`json.loads` or
    :func:`ast.literal_eval` -- never evaluated -- on at most 4 MiB."""
    if len(text) > MAX_STATS_BYTES:
        raise ValueError(f"memory_stats text is {len(text)} characters; at most {MAX_STATS_BYTES} are read")
    s = text.strip()
    if s.startswith("OrderedDict(") and s.endswith(")"):
        s = s[len("OrderedDict("):-1].strip()
    try:
        obj = json.loads(s)
    except ValueError:
        try:
            obj = ast.literal_eval(s)
        except (ValueError, SyntaxError, MemoryError, RecursionError) as e:
            raise ValueError(f"not a memory_stats() dict: {type(e).__name__}: {e}") from None
    if isinstance(obj, list):
        try:
            obj = dict(obj)
        except (TypeError, ValueError):
            raise ValueError("not a memory_stats() dict: a list that is not of (key, value) pairs") from None
    if not isinstance(obj, dict):
        raise ValueError(f"not a memory_stats() dict: got {type(obj).__name__}")
    out: dict[str, int] = {}
    for k, v in obj.items():
        if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = int(v)
    if not any(k.startswith(("allocated_bytes.", "reserved_bytes.")) for k in out):
        raise ValueError("not a memory_stats() dict: no allocated_bytes.* / reserved_bytes.* keys")
    return out


def apply_memory_stats(f: Figures, stats: dict[str, int]) -> None:
    """Fill what the message lacks from ``memory_stats()`` (taken by the user,
    possibly at another moment than the OOM: said in the evidence)."""
    a = stats.get("allocated_bytes.all.current")
    r = stats.get("reserved_bytes.all.current")
    if f.allocated is None and a is not None:
        f.allocated = a
        f.derived["allocated"] = "memory_stats allocated_bytes.all.current"
    if f.reserved is None and r is not None:
        f.reserved = r
        f.derived["reserved"] = "memory_stats reserved_bytes.all.current"
    if f.reserved_unallocated is None and f.reserved is not None and f.allocated is not None:
        f.reserved_unallocated = max(0, f.reserved - f.allocated)
        f.derived["reserved_unallocated"] = "reserved - allocated"
    isb = stats.get("inactive_split_bytes.all.current")
    if isb is not None:
        f.inactive_split = isb
    notes = []
    for k in ("num_ooms", "num_alloc_retries", "segment.all.current", "inactive_split.all.current"):
        if k in stats:
            notes.append(f"{k}={stats[k]}")
    if a is not None and r is not None:
        notes.append(f"reserved/allocated = {r / a:.2f}" if a else "allocated is 0")
    if notes:
        f.stats_notes.append("memory_stats: " + ", ".join(notes))
    _complete(f)


def parse_nvidia_smi(text: str) -> list[tuple[int, int]]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv`` (any
    extra columns, with or without ``noheader``/``nounits``) -> [(pid, bytes)]."""
    if len(text) > MAX_STATS_BYTES:
        raise ValueError(f"nvidia-smi text is {len(text)} characters; at most {MAX_STATS_BYTES} are read")
    rows = [r for r in csv.reader(io.StringIO(text)) if r and any(c.strip() for c in r)]
    if not rows:
        raise ValueError("empty nvidia-smi output")
    head = [c.strip().lower() for c in rows[0]]
    pid_col = mem_col = None
    unit_default = MiB
    if any(h.startswith("pid") for h in head):
        pid_col = next(i for i, h in enumerate(head) if h.startswith("pid"))
        mem_col = next((i for i, h in enumerate(head) if "used_memory" in h or "used_gpu_memory" in h), None)
        if mem_col is None:
            raise ValueError("nvidia-smi output has no used_memory column (use --query-compute-apps=pid,used_memory)")
        if "[" in head[mem_col]:
            u = head[mem_col].split("[", 1)[1].rstrip("]").strip().encode()
            unit_default = _UNIT.get(u, MiB)
        rows = rows[1:]
    else:
        pid_col, mem_col = 0, len(head) - 1   # noheader: pid first, used_memory last
    out = []
    for r in rows:
        if max(pid_col, mem_col) >= len(r):
            raise ValueError(f"nvidia-smi row has too few columns: {r!r}")
        p, m = r[pid_col].strip(), r[mem_col].strip()
        if not p.isdigit():
            raise ValueError(f"nvidia-smi row without a PID: {r!r}")
        parts = m.split()
        if m.lower() in ("[n/a]", "n/a", "[not supported]"):
            continue
        try:
            val = float(parts[0])
        except (ValueError, IndexError):
            raise ValueError(f"nvidia-smi used_memory is not a number: {m!r}") from None
        unit = _UNIT.get(parts[1].lower().encode(), None) if len(parts) > 1 else unit_default
        if unit is None:
            raise ValueError(f"nvidia-smi used_memory has an unknown unit: {m!r}")
        out.append((int(p), int(round(val * unit))))
    return out


def apply_nvidia_smi(f: Figures, procs: list[tuple[int, int]], pid: int | None = None) -> None:
    """Merge nvidia-smi's processes with the message's ``Process`` lines and
    decide again which one is this process."""
    seen = {p for p, _ in f.process_lines}
    for p, used in procs:
        if p not in seen:
            f.process_lines.append((p, used))
    if pid is None and f.this_process is not None and f.derived.get("this_process") is None:
        # the message printed 'this process has U': the nvidia-smi row of (about) U is this process
        close = [pl for pl in procs if abs(pl[1] - f.this_process) <= max(64 * MiB, f.this_process // 50)]
        if len(close) == 1:
            pid = close[0][0]
    if f.derived.get("this_process", "").startswith("the 'Process"):
        f.this_process = None
        del f.derived["this_process"]
    resolve_self(f, pid)
    if f.other_processes is None:
        f.other_processes = []


# ---------------------------------------------------------------------------
# Triage
# ---------------------------------------------------------------------------


def fmt(n: int | None) -> str:
    """PyTorch's format_size: bytes up to 1 KiB, then KiB/MiB/GiB with two decimals."""
    if n is None:
        return "?"
    neg, n = n < 0, abs(n)
    if n <= KiB:
        s = f"{n} bytes"
    elif n < MiB:
        s = f"{n / KiB:.2f} KiB"
    elif n < GiB:
        s = f"{n / MiB:.2f} MiB"
    elif n < TiB:
        s = f"{n / GiB:.2f} GiB"
    else:
        s = f"{n / TiB:.2f} TiB"
    return "-" + s if neg else s


@dataclass
class Verdict:
    cause: str
    evidence: list[str]
    next_steps: list[str]

    def as_json(self, f: Figures) -> dict[str, Any]:
        return {"parsed": f.parsed(), "cause": self.cause, "evidence": self.evidence, "next_steps": self.next_steps}


#: ``Tried to allocate`` prints the size cudaMalloc was asked for: a request of
#: (1 MiB, 10 MiB] asks for a 20 MiB segment, one <= 1 MiB for a 2 MiB segment
#: (kLargeBuffer, kSmallBuffer); the tensor itself may be much smaller.
_SEGMENT_FLOOR = {20 * MiB: MiB + 512, 2 * MiB: 512}

#: memory a process holds outside PyTorch's allocator without anything being
#: wrong: the CUDA context, cuBLAS/cuDNN handles and workspaces (CUDA 12.x:
#: a few hundred MiB to ~1 GiB) -- plus the driver's own reserve.
_CONTEXT_ALLOWANCE = 3 * GiB // 2


def _hint(f: Figures, flags: dict[str, bool], name: str) -> str | None:
    """Why a library is implicated: a flag or the text itself, or None."""
    flag = {"nccl": "distributed", "cudnn": "cudnn_benchmark", "graphs": "cuda_graphs"}[name]
    if flags.get(flag):
        return f"--{flag.replace('_', '-')} given"
    if name in f.hints:
        return f"the text mentions {name.upper() if name == 'nccl' else 'cuDNN'}"
    return None


def _fits(f: Figures) -> tuple[int | None, int | None, str]:
    """(room on the device, room for the request at best, formula)."""
    if f.free is None:
        return None, None, ""
    room = f.free
    formula = f"free {fmt(f.free)}"
    if f.allowed is not None and f.reserved is not None:
        under_cap = max(0, f.allowed - f.reserved)
        if under_cap < room:
            room = under_cap
            formula = f"min(free {fmt(f.free)}, allowed {fmt(f.allowed)} - reserved {fmt(f.reserved)})"
    if f.reserved_unallocated is None:
        return room, None, formula
    return room, room + f.reserved_unallocated, formula + f" + reserved-but-unallocated {fmt(f.reserved_unallocated)}"


def triage(f: Figures, *, distributed: bool = False, cudnn_benchmark: bool = False,
           cuda_graphs: bool = False) -> Verdict:
    """Does it fit?  Then seed 003's six causes in order, each on evidence."""
    flags = {"distributed": distributed, "cudnn_benchmark": cudnn_benchmark, "cuda_graphs": cuda_graphs}
    ev: list[str] = []
    R = f.requested
    T = f.total
    cap = f.allowed if f.allowed is not None else T
    cap_name = "allowed" if f.allowed is not None else "total"
    floor = _SEGMENT_FLOOR.get(R, R) if (R is not None and f.kind.startswith(("pytorch", "seed"))) else R
    if f.messages > 1:
        ev.append(f"{f.messages} out-of-memory messages in the input" +
                  (f" (GPUs {', '.join(map(str, f.devices))})" if len(f.devices) > 1 else "") +
                  "; the one with the most figures is triaged")
    if f.unread:
        ev.append(f"the log holds more out-of-memory text than is read closely: the first {fmt(MAX_READ)} of it "
                  f"were read, {fmt(f.unread)} more were not")
    if f.self_pid_note:
        ev.append(f.self_pid_note)
    for k, why in f.derived.items():
        if k in ("reserved", "reserved_unallocated", "this_process", "allocated", "free"):
            ev.append(f"{k} {fmt(getattr(f, k))} = {why}")
    ev.extend(f.stats_notes)
    if R is not None and floor != R:
        ev.append(f"'Tried to allocate {fmt(R)}' is a whole segment: the tensor asked for may be as small as "
                  f"{fmt(floor)} (requests of 1-10 MiB get a 20 MiB segment, <= 1 MiB a 2 MiB one)")

    others = sum(u for _, u in f.other_processes) if f.other_processes else 0
    room, best, formula = _fits(f)
    expandable_ok = best is not None and floor is not None and floor <= best
    nccl_why, cudnn_why, graphs_why = _hint(f, flags, "nccl"), _hint(f, flags, "cudnn"), _hint(f, flags, "graphs")
    nonpt = (f.this_process - f.reserved) if (f.this_process is not None and f.reserved is not None) else None
    # memory outside this process's PyTorch that no listed co-tenant explains
    if T is not None and f.free is not None and f.reserved is not None:
        outside = T - f.free - f.reserved
        unlisted = outside - others - (max(nonpt, 0) if nonpt is not None else 0)
    else:
        outside = unlisted = None

    # ---- 0. not a size at all
    if "overflow" in f.hints and R is None:
        return Verdict("does-not-fit", ev + [
            "'Tried to allocate more than 1EB': the size itself is absurd (>= 2**60 bytes) -- a shape or size "
            "computation overflowed or went negative"], [
            "find the allocation in the traceback and print the shape it was given; fix the arithmetic "
            "(negative dimension, int overflow, a length read from corrupt data)"])

    # ---- 1. does it fit at all?
    if R is not None and cap is not None and R > cap:
        ev.append(f"requested {fmt(R)} > {cap_name} {fmt(cap)}: the request alone is larger than "
                  f"{'the memory this process may use' if f.allowed is not None else 'the whole card'}; "
                  "no allocator setting can place it")
        if cudnn_why:
            ev.append(f"{cudnn_why}: a single request this large is typically the workspace of the convolution "
                      "algorithm cuDNN picked, not a tensor")
            return Verdict("cudnn-workspace", ev, _steps("cudnn-workspace", f, expandable_ok))
        return Verdict("does-not-fit", ev, _steps("does-not-fit-request", f, expandable_ok))

    if R is not None and best is not None and floor > best:
        short = floor - best
        ev.append(f"requested {fmt(floor)} > {formula} = {fmt(best)}: even a perfectly packed allocator "
                  f"(expandable segments included) could not place it; {fmt(short)} short")
        holders = []
        if others:
            holders.append(f"other processes {fmt(others)} ({', '.join(f'{p}: {fmt(u)}' for p, u in f.other_processes)})")
        if f.private_pools:
            holders.append(f"CUDA-graph private pools {fmt(f.private_pools)}")
        if nonpt is not None:
            holders.append(f"this process outside PyTorch {fmt(nonpt)} (this process {fmt(f.this_process)} - "
                           f"reserved {fmt(f.reserved)})")
        if f.allocated is not None:
            holders.append(f"PyTorch's live tensors {fmt(f.allocated - (f.private_pools or 0))}")
        if holders:
            ev.append("who holds the card: " + "; ".join(holders))
        # who, if released, would make room -- in the seed's order
        if others >= short:
            ev.append(f"the other processes hold {fmt(others)} >= the {fmt(short)} missing")
            return Verdict("other-processes", ev, _steps("other-processes", f, expandable_ok))
        if nonpt is None and unlisted is not None and f.other_processes is None \
                and unlisted - _CONTEXT_ALLOWANCE >= max(short, T // 5):
            ev.append(f"total {fmt(T)} - free {fmt(f.free)} - reserved {fmt(f.reserved)} = {fmt(outside)} is held "
                      f"outside this process's PyTorch; a CUDA context and the driver's reserve explain about "
                      f"{fmt(_CONTEXT_ALLOWANCE)}, leaving {fmt(unlisted - _CONTEXT_ALLOWANCE)} >= the {fmt(short)} "
                      "missing: another process (the message lists none; check nvidia-smi)")
            return Verdict("other-processes", ev, _steps("other-processes", f, expandable_ok))
        if nccl_why and ((nonpt is not None and nonpt >= short) or "nccl" in f.hints
                         or (nonpt is None and unlisted is not None and unlisted >= short)):
            held = nonpt if nonpt is not None else unlisted
            ev.append(f"{nccl_why}; {fmt(held)} of device memory is outside PyTorch's allocator, where NCCL keeps "
                      "its communication buffers")
            return Verdict("nccl", ev, _steps("nccl", f, expandable_ok))
        if (f.private_pools or 0) >= short:
            ev.append(f"private pools hold {fmt(f.private_pools)} >= the {fmt(short)} missing")
            return Verdict("graph-pools", ev, _steps("graph-pools", f, expandable_ok))
        if graphs_why and f.private_pools is None:
            ev.append(f"{graphs_why}; the message predates the private-pool figure, so the graphs' share is unknown")
            return Verdict("graph-pools", ev, _steps("graph-pools", f, expandable_ok))
        if cudnn_why and (R >= 256 * MiB or (T and R >= T // 20)):
            ev.append(f"{cudnn_why}; a {fmt(R)} request on top of a nearly full card is the shape of a cuDNN "
                      "workspace spike")
            return Verdict("cudnn-workspace", ev, _steps("cudnn-workspace", f, expandable_ok))
        if nonpt is not None and nonpt - _CONTEXT_ALLOWANCE >= short:
            ev.append(f"this process holds {fmt(nonpt)} outside PyTorch's allocator (more than a CUDA context): "
                      "another library in the process (NCCL, cuDNN/cuBLAS workspaces, a second framework) -- "
                      "the message cannot say which")
            return Verdict("unknown", ev + ["missing: which library holds the non-PyTorch memory "
                                            "(rerun with NCCL_DEBUG=INFO, or say --distributed / --cudnn-benchmark)"],
                           _steps("unknown", f, expandable_ok))
        if unlisted is not None and nonpt is not None and unlisted >= short and unlisted > _CONTEXT_ALLOWANCE:
            ev.append(f"{fmt(unlisted)} of the card is held by nobody listed (total - free - this process - "
                      "other processes): processes the driver does not show (other containers) or the driver's reserve")
            cause = "other-processes" if T and unlisted >= T // 7 else "driver-reserve"
            return Verdict(cause, ev, _steps(cause, f, expandable_ok))
        if f.allocated is not None and T:
            ev.append(f"PyTorch's live tensors take {fmt(f.allocated)} = {100 * f.allocated / T:.0f}% of the "
                      f"card: the workload does not fit")
        return Verdict("does-not-fit", ev, _steps("does-not-fit-live", f, expandable_ok))

    # ---- the request could be placed by a perfect packer (or the figures cannot say)
    need = None
    if R is not None and room is not None:
        need = floor - room if floor > room else floor
        if floor <= room:
            ev.append(f"the driver reported {fmt(f.free)} free >= the {fmt(floor)} asked, yet the allocation "
                      "failed: the free figure is not all allocatable (the driver's own page tables and reserve; "
                      "on Windows, WDDM), or another process took it meanwhile")
    ru = f.reserved_unallocated
    other_weight = others
    if f.other_processes is None and unlisted is not None:
        other_weight = max(0, unlisted - _CONTEXT_ALLOWANCE)
    ratio = (f.reserved / f.allocated) if (f.reserved is not None and f.allocated) else None
    headroom = (f.free + ru) if (f.free is not None and ru is not None) else None
    hinted = bool(nccl_why or cudnn_why or graphs_why) or (T is not None and (f.private_pools or 0) >= T // 10)
    strong_frag = ru is not None and need is not None and ru >= need and (
        (ratio is not None and ratio >= 1.3)
        or (R is not None and ru >= R and headroom is not None and cap and headroom >= 0.1 * cap))

    # does-not-fit: the live set is at the card's edge (the "97% full of live tensors")
    live = f.allocated - (f.private_pools or 0) if f.allocated is not None else None   # graphs' pools aside
    if live is not None and cap and live >= 0.9 * cap and (ru is None or ru < 0.05 * cap) \
            and other_weight < 0.05 * cap:
        ev.append(f"PyTorch's live tensors take {fmt(live)} = {100 * live / cap:.0f}% of the "
                  f"{cap_name} {fmt(cap)}; reserved-but-unallocated is only {fmt(ru)}: defragmenting would buy "
                  "under 5% -- the workload is at the edge")
        return Verdict("does-not-fit", ev, _steps("does-not-fit-live", f, expandable_ok))
    if headroom is not None and cap and headroom < 0.1 * cap and not strong_frag and not hinted \
            and other_weight < max(need or 0, cap // 20):
        ev.append(f"free {fmt(f.free)} + reserved-but-unallocated {fmt(ru)} = {fmt(headroom)} = "
                  f"{100 * headroom / cap:.1f}% of the {cap_name} {fmt(cap)}: even perfectly packed, the card is "
                  f"full of this process's memory"
                  + (f" (reserved/allocated = {ratio:.2f}, ordinary churn)" if ratio else "")
                  + " -- the workload does not fit")
        return Verdict("does-not-fit", ev, _steps("does-not-fit-live", f, expandable_ok))

    # cause 1: fragmentation
    if strong_frag and ru >= other_weight:
        ev.append(f"reserved-but-unallocated {fmt(ru)} >= the {fmt(need)} the request lacks, yet no cached block "
                  f"could serve it: the free bytes are split between live blocks (fragmentation); "
                  f"{formula} = {fmt(best)} >= {fmt(floor)}, so a packer that maps pages (expandable segments) "
                  "can place it")
        if f.largest_free_block is not None:
            ev.append(f"largest free block {fmt(f.largest_free_block)} < {fmt(floor)}")
        if ratio is not None:
            ev.append(f"reserved/allocated = {fmt(f.reserved)}/{fmt(f.allocated)} = {ratio:.2f}"
                      + (" (>= 1.3: the seed's fragmentation signature)" if ratio >= 1.3 else ""))
        return Verdict("fragmentation", ev, _steps("fragmentation", f, expandable_ok))
    # cause 2: other processes
    if need is not None and other_weight >= need and (other_weight >= (T or 0) // 20):
        if f.other_processes:
            ev.append(f"other processes hold {fmt(others)} ({', '.join(f'{p}: {fmt(u)}' for p, u in f.other_processes)}) "
                      f">= the {fmt(need)} the request lacks")
        else:
            ev.append(f"total {fmt(T)} - free {fmt(f.free)} - reserved {fmt(f.reserved)} = {fmt(outside)} is outside "
                      f"this process's PyTorch; beyond a CUDA context and driver reserve (~{fmt(_CONTEXT_ALLOWANCE)}) "
                      f"{fmt(other_weight)} is unexplained -- another process (the message lists none; check nvidia-smi)")
        return Verdict("other-processes", ev, _steps("other-processes", f, expandable_ok))
    # cause 3: NCCL
    if nccl_why and (nonpt is None or need is None or nonpt >= need or "nccl" in f.hints):
        ev.append(f"{nccl_why}" + (f"; this process holds {fmt(nonpt)} outside PyTorch's allocator" if nonpt is not None else
                                   "; NCCL's buffers live outside PyTorch's figures"))
        return Verdict("nccl", ev, _steps("nccl", f, expandable_ok))
    # cause 4: graph pools
    if f.private_pools and need is not None and (f.private_pools >= need or (T and f.private_pools >= T // 10)):
        ev.append(f"private pools (CUDA graphs) hold {fmt(f.private_pools)} >= the {fmt(need)} the request lacks")
        return Verdict("graph-pools", ev, _steps("graph-pools", f, expandable_ok))
    if graphs_why and f.private_pools is None:
        ev.append(f"{graphs_why}; the message carries no private-pool figure")
        return Verdict("graph-pools", ev, _steps("graph-pools", f, expandable_ok))
    # cause 5: cuDNN
    if cudnn_why and (R is None or R >= 64 * MiB or "cudnn" in f.hints):
        ev.append(f"{cudnn_why}" + (f"; the {fmt(R)} request is workspace-sized" if R is not None else ""))
        return Verdict("cudnn-workspace", ev, _steps("cudnn-workspace", f, expandable_ok))
    # cause 6: driver reserve
    if R is not None and room is not None and floor <= room and f.reserved is not None:
        ev.append(f"nothing in the figures holds the memory the driver calls free: {fmt(f.free)} it reports "
                  "is not allocatable to this process")
        return Verdict("driver-reserve", ev, _steps("driver-reserve", f, expandable_ok))
    if nonpt is not None and unlisted is not None and need is not None and unlisted >= need and unlisted > 0:
        ev.append(f"{fmt(unlisted)} of the card is held by nobody listed (total - free - this process - others): "
                  "the driver's reserve")
        return Verdict("driver-reserve", ev, _steps("driver-reserve", f, expandable_ok))
    # fragmentation, weaker: free + stranded cache would fit it
    if ru is not None and best is not None and floor is not None and floor <= best and need is not None and ru >= need:
        ev.append(f"{formula} = {fmt(best)} >= the {fmt(floor)} requested: the stranded {fmt(ru)} is what the "
                  "device lacks")
        return Verdict("fragmentation", ev, _steps("fragmentation", f, expandable_ok))

    missing = [k for k in ("requested", "total", "free", "reserved", "allocated") if getattr(f, k) is None]
    if f.kind == "driver":
        ev.append("the message is the driver's (or a library's) bare 'out of memory': it carries no figures")
    if "cublas" in f.hints:
        ev.append("CUBLAS_STATUS_ALLOC_FAILED: cuBLAS could not allocate its handle/workspace -- the card was "
                  "already full when cuBLAS initialised")
    ev.append("missing: " + (", ".join(missing) if missing else "nothing decisive: no cause's evidence holds"))
    return Verdict("unknown", ev, _steps("unknown", f, expandable_ok))


def _steps(kind: str, f: Figures, expandable_ok: bool) -> list[str]:
    """Next steps, cheapest first; none that the figures rule out."""
    old = f.kind in ("pytorch-1.x", "pytorch-1.x-cached")
    expandable = ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch >= 2.1; one environment variable): "
                  "maps pages into one growing segment instead of stranding holes")
    shrink = "shrink the batch (keep the effective batch with gradient accumulation), the sequence length or the resolution"
    if kind == "does-not-fit-request":
        steps = ["find the operation in the traceback and shrink what it is given (batch, sequence length, "
                 "resolution), or process it in chunks: no allocator setting can place a request larger than the card",
                 "lower precision (fp16/bf16, 8/4-bit weights) to shrink that tensor",
                 "if it is a convolution: torch.backends.cudnn.benchmark=False (workspace-hungry algorithms are "
                 "skipped)",
                 "shard the model or the operation across GPUs (FSDP, tensor parallel) or offload to the CPU",
                 f"a device with more than {fmt(f.requested)} free"]
    elif kind == "does-not-fit-live":
        steps = [shrink,
                 "mixed precision (torch.autocast, bf16) and torch.no_grad()/inference_mode for evaluation",
                 "activation checkpointing (torch.utils.checkpoint) to trade compute for memory",
                 "free what is no longer needed (del tensors, don't accumulate loss tensors with their graphs; "
                 "empty_cache() only hands cache back to other processes, it does not make room for you)",
                 "shard (FSDP/ZeRO), offload, or a larger device"]
        if expandable_ok:
            steps.insert(1, expandable)
        if f.allowed is not None and f.free is not None and f.reserved is not None and f.free > f.allowed - f.reserved:
            steps.insert(0, f"the per-process limit binds ({fmt(f.allowed)} allowed; the device has {fmt(f.free)} "
                            "free): raise torch.cuda.set_per_process_memory_fraction, or shrink the batch to fit it")
    elif kind == "fragmentation":
        steps = []
        if expandable_ok:
            if old:
                steps.append("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:<N> (this PyTorch predates expandable "
                             "segments; N a little above the usual request) -- or upgrade to >= 2.1 and set "
                             "expandable_segments:True")
            else:
                steps.append(expandable)
        steps += ["steady tensor shapes: pad or bucket variable-length batches so freed blocks are reused",
                  shrink,
                  "restart the process (last: the holes come back with the workload)",
                  "note: torch.cuda.empty_cache() will not help -- it releases only wholly free segments, and "
                  "the stranded bytes sit between live blocks"]
    elif kind == "other-processes":
        steps = ["nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv: find the co-tenant "
                 "(a stale notebook kernel, a zombie dataloader, another job) and stop it",
                 "run on another GPU (CUDA_VISIBLE_DEVICES) or schedule the jobs apart",
                 "if the GPU must be shared: cap each process (torch.cuda.set_per_process_memory_fraction) or "
                 "use MPS to share one context"]
    elif kind == "nccl":
        steps = ["rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALLOC to see NCCL's allocations",
                 "destroy communicators/process groups you no longer use (dist.destroy_process_group); create "
                 "subgroups once, not per step",
                 "shrink NCCL's buffers: NCCL_BUFFSIZE, fewer channels (NCCL_MAX_NCHANNELS / NCCL_MIN_NCHANNELS), "
                 "or NCCL_NVLS_ENABLE=0",
                 "leave headroom for NCCL: a smaller batch, or a lower memory fraction for PyTorch's cache"]
    elif kind == "graph-pools":
        steps = ["drop CUDA graphs you no longer replay (the pool is freed only when the graph object dies); "
                 "torch._dynamo.reset() after torch.compile(mode='reduce-overhead')",
                 "capture fewer shapes (pad to a few buckets) and share one pool between graphs "
                 "(torch.cuda.graph_pool_handle()); serving engines: fewer capture sizes or eager mode",
                 "leave headroom for the graphs when sizing the batch / KV cache"]
    elif kind == "cudnn-workspace":
        steps = ["torch.backends.cudnn.benchmark=False (and/or deterministic=True): cuDNN then skips the "
                 "workspace-hungry algorithms",
                 "cap cuDNN's workspace (CUDNN_CONV_WSCAP_DBG=<MiB>, cuDNN v8 API) or upgrade cuDNN/PyTorch",
                 "shrink the convolution's input (batch, resolution) or run it in chunks",
                 "budget for the workspace, not only the tensors, when sizing the batch"]
    elif kind == "driver-reserve":
        steps = ["budget for the card's real capacity: total minus the driver/ECC reserve and the CUDA context "
                 "(0.5-1 GiB+), and size the batch to that",
                 "free the display: run headless or on a GPU without a monitor (Windows/WDDM holds memory for it)",
                 "check nvidia-smi -q -d MEMORY for reserved memory and ECC; a driver/CUDA update can change it"]
        if expandable_ok:
            steps.append(expandable)
    else:
        steps = ["paste the whole error message (PyTorch >= 2.1 prints free, reserved-but-unallocated and other "
                 "processes) or rerun to get it",
                 "give memspec the allocator's state: torch.cuda.memory_stats() (--memory-stats FILE) and "
                 "nvidia-smi --query-compute-apps=pid,used_memory --format=csv (--nvidia-smi FILE)",
                 "record a snapshot (torch.cuda.memory._record_memory_history(); torch.cuda.memory._dump_snapshot()) "
                 "and run memspec oom explain --snapshot FILE",
                 "say what runs: --distributed, --cudnn-benchmark, --cuda-graphs"]
    return steps


def explain_text(f: Figures, v: Verdict) -> str:
    """The human-readable report."""
    fig = "; ".join(f"{k.replace('_', ' ')} {fmt(getattr(f, k))}" for k in FIGURES
                    if k != "other_processes" and getattr(f, k) is not None)
    lines = [f"OOM ({f.kind}): {fig or 'no figures'}"]
    if f.other_processes:
        lines.append("other processes: " + ", ".join(f"{p} {fmt(u)}" for p, u in f.other_processes))
    lines.append(f"verdict: {v.cause} -- {CAUSES[v.cause]}")
    lines += ["evidence:"] + [f"  - {e}" for e in v.evidence]
    lines += ["next steps (cheapest first):"] + [f"  {i}. {s}" for i, s in enumerate(v.next_steps, 1)]
    return "\n".join(lines)


def figures_from_snapshot(snap: dict) -> Figures:
    """Figures from a ``torch.cuda.memory._snapshot()`` (segments, and the
    trace's last ``oom`` entry: its size and ``device_free``)."""
    segs = snap.get("segments") or []
    f = Figures(kind="snapshot")
    f.reserved = sum(int(s["total_size"]) for s in segs)
    f.allocated = sum(int(b["size"]) for s in segs for b in s.get("blocks", []) if b.get("state") == "active_allocated")
    f.reserved_unallocated = f.reserved - f.allocated
    f.largest_free_block = max((int(b["size"]) for s in segs for b in s.get("blocks", []) if b.get("state") == "inactive"),
                               default=0)
    pools = sum(int(b["size"]) for s in segs if tuple(s.get("segment_pool_id") or (0, 0)) != (0, 0)
                for b in s.get("blocks", []) if b.get("state") == "active_allocated")
    f.private_pools = pools
    f.segments = len(segs)
    cap = (snap.get("allocator_settings") or {}).get("memspec_capacity")
    if cap:
        f.total = int(cap)
    for trace in snap.get("device_traces") or []:
        for e in trace or []:
            if e.get("action") == "oom":
                f.requested = int(e["size"])
                free = e.get("device_free", e.get("addr"))
                f.free = int(free) if free is not None else None
    if f.total is not None and f.free is not None:
        f.other_processes = None
    return f

