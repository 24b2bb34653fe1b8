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
    "memory-fraction": "a per-process limit binds (PyTorch's memory fraction, 'X allowed'), not the device",
    "framework-preallocation": "the framework's own up-front pool (TensorFlow, JAX/XLA) is the limit, or left "
                               "too little for a library or another process",
    "stream-events": "cached blocks held by frees waiting on events recorded on other streams",
    "own-ranks": "the job's own ranks (DDP/torchrun processes) each hold memory on one device",
    "leak": "memory grows step over step: something accumulates across iterations",
    "host-memory": "host RAM, not GPU memory: the CPU allocator failed",
    "unknown": "the figures do not decide; the evidence says what is missing",
}

#: how each stack is named in the report
STACKS: dict[str, str] = {
    "pytorch-cuda": "PyTorch, CUDA caching allocator",
    "pytorch-cuda-async": "PyTorch, CUDA backend:cudaMallocAsync",
    "pytorch-hip": "PyTorch on ROCm/HIP (caching allocator)",
    "pytorch-mps": "PyTorch on Apple MPS",
    "pytorch-xpu": "PyTorch on Intel XPU",
    "tensorflow": "TensorFlow (BFC allocator / stream executor)",
    "tensorflow-rocm": "TensorFlow on ROCm",
    "jax": "JAX / XLA",
    "nccl": "NCCL (communication buffers)",
    "cudnn": "a CUDA library status (cuDNN/cuBLAS)",
    "cuda-runtime": "the CUDA runtime/driver (no allocator figures)",
    "host": "host RAM (a CPU allocator)",
    "unknown": "unrecognised",
}

#: Figures of ``parsed`` in ``--json`` order.
FIGURES = ("requested", "total", "free", "allocated", "reserved", "reserved_unallocated", "this_process",
           "other_processes", "private_pools", "allowed", "other_allocations", "program_total")

_UNIT = {b"b": 1, b"byte": 1, b"bytes": 1, b"kib": KiB, b"kb": KiB, b"mib": MiB, b"mb": MiB,
         b"gib": GiB, b"gb": GiB, b"tib": TiB, b"tb": TiB}

#: A size right at a position (forward).  Bounded, possessive: no backtracking.
_FWD = re.compile(rb"[ \t\r\n\f\v]{0,8}([0-9]{1,30}+(?:\.[0-9]{0,30}+)?)(?![0-9.][0-9])[ \t\r\n\f\v]{0,4}"
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
_ANCHORS = re.compile(rb"(?=[otamfrcipl(gwdub])(?:" + b"|".join([
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
    # PyTorch's cudaMallocAsync backend (c10/cuda/CUDAMallocAsyncAllocator.cpp)
    rb"(?P<asyncoom>would" + _W + rb"exceed" + _W + rb"allowed" + _W + rb"memory)",
    rb"(?P<curalloc>currently" + _W + rb"allocated[ \t]*+:)",
    rb"(?P<reqline>(?<![a-z_])requested[ \t]*+:)",
    rb"(?P<devlimit>device" + _W + rb"limit[ \t]*+:)",
    rb"(?P<freecuda>free" + _W + rb"\(according" + _W + rb"to" + _W + rb"cuda\)[ \t]*+:)",
    rb"(?P<fraclim>memory" + _W + rb"fraction\)" + _O + rb":)",
    # MPS
    rb"(?P<otheralloc>other" + _W + rb"allocations" + _O + rb":)",
    # TensorFlow: shapes, BFC stats, stream executor; XLA
    rb"(?P<tfshape>oom" + _W + rb"when" + _W + rb"allocating" + _W + rb"tensor" + _W + rb"(?:with|of)" + _W + rb"shape)",
    rb"(?P<tflimit>(?<![a-z_])(?:memory_)?limit_?:[ \t]*+[0-9]{1,20}+(?![0-9.]))",
    rb"(?P<tfinuse>(?<![a-z_])inuse:[ \t]*+[0-9]{1,20}+(?![0-9.]))",
    rb"(?P<failalloc>failed" + _W + rb"to" + _W + rb"allocate(?:" + _W + rb"request" + _W + rb"for)?)",
    rb"(?P<unable>unable" + _W + rb"to" + _W + rb"allocate)",
    rb"(?P<reported>free" + _W + rb"memory/total" + _W + rb"memory:[ \t]*+[0-9]{1,20}+/[0-9]{1,20}+)",
    rb"(?P<xlatotal>(?<![a-z_])total" + _W + rb"allocation:)",
    rb"(?P<resex>resource(?:_|" + _W + rb")?exhausted)",
    # NCCL
    rb"(?P<calloc>cuda" + _W + rb"(?:calloc|malloc)(?:" + _W + rb"async)?)",
]) + rb")")   # the look-ahead lets the engine skip bytes no anchor can start with

_DIGITS = re.compile(rb"[0-9]{1,20}+")
#: "[d0,d1,...] and type T on /job:.../device:GPU:0 by allocator GPU_0_bfc" after "with shape"
_TFSHAPE = re.compile(rb"[ \t]*+\[([0-9, ]{0,240}+)(\]?)(?:[ \t]*+and[ \t]++type[ \t]++([a-z0-9_]{1,20}+))?"
                      rb"(?:[ \t]*+on[ \t]++[^ \t\r\n]{0,80}?device:(cpu|gpu|xla_gpu)(?::[0-9]{1,3}+)?)?"
                      rb"(?:[ \t]*+by[ \t]++allocator[ \t]++([a-z0-9_]{1,40}+))?")
#: "7.35G (7889485824 bytes)" / "176.00MiB (184549376B)": the exact byte count in parentheses
_PAREN_BYTES = re.compile(rb"[ \t]*+[0-9.]{1,30}+[ \t]*+[a-z]{0,3}+[ \t]*+\(([0-9]{1,20}+)[ \t]*+(?:bytes|b)\)")
_DTYPE_BYTES = {b"float": 4, b"float32": 4, b"half": 2, b"float16": 2, b"bfloat16": 2, b"double": 8, b"float64": 8,
                b"int32": 4, b"int64": 8, b"int16": 2, b"int8": 1, b"uint8": 1, b"uint16": 2, b"uint32": 4,
                b"uint64": 8, b"bool": 1, b"complex64": 8, b"complex128": 16, b"qint8": 1, b"quint8": 1,
                b"qint32": 4}   # the look-ahead lets the engine skip bytes no anchor can start with

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
    ("tfinit", b"/initializer/"),                 # a TensorFlow node that initialises a variable (or a slot)
)
#: Literals whose neighbourhood is read for figures.
#: Literals that open an OOM message; the figures are read in a window around each.
_SEEDS = (b"of memory", b"to allocate", b"outofmemory", b"out_of_memory", b"memoryallocation",
          b"resource_exhausted", b"_alloc_failed", b"total capac", b"oom when allocating", b"resourceexhausted",
          b"resource exhausted", b"exceed allowed memory", b"cuda calloc", b"inuse:", b"enough memory",
          b"hiperror_t(1002)", b"handle: cu")
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
    #: the software stack that printed it: pytorch-cuda, pytorch-cuda-async, pytorch-hip, pytorch-mps,
    #: pytorch-xpu, tensorflow, tensorflow-rocm, jax, nccl, cudnn, cuda-runtime, host
    stack: str = "unknown"
    other_allocations: int | None = None   # MPS: memory the device holds outside PyTorch's MPS allocator
    program_total: int | None = None       # XLA BufferAssignment "total allocation"
    tensor_shape: str | None = None        # TensorFlow "OOM when allocating tensor with shape[...]"
    dtype: str | None = None
    tensor_bytes: int | None = None        # shape x dtype size
    #: flags a reader must see before the verdict: unit ambiguity, inconsistent figures, truncation
    warnings: list[str] = field(default_factory=list)
    truncated: bool = False
    not_failure: bool = False              # TF BFC "the caller indicates that this is not a failure"
    #: every OOM message found, in order: {"index", "stack", figures...}; ``index`` is the one triaged
    summaries: list[dict] = field(default_factory=list)
    index: int = 0
    span: tuple[int, int] = (0, 0)

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
    __slots__ = ("f", "has_fig", "oom", "lo", "hi", "fmt")

    def __init__(self) -> None:
        self.f = Figures()
        self.has_fig = False
        self.oom = False
        self.lo = -1
        self.hi = -1
        self.fmt: set[str] = set()


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

    def once(name: str, value: int | None) -> None:
        """A figure a block prints twice (TF's 'Sum Total of in-use chunks' and 'InUse'): keep the first."""
        if value is not None and getattr(cur.f, name) is None:
            setattr(cur.f, name, value)
            cur.has_fig = True

    for lo, hi in windows:
        new()
        for m in _ANCHORS.finditer(low, lo, hi):
            a = m.lastgroup
            if cur.lo < 0:
                cur.lo = m.start()
            cur.hi = max(cur.hi, m.end())
            if a == "pid":
                a = "proc"
            elif a == "dev":
                a = "gpu"
            if a == "oom":
                # TensorFlow prints its BFC stats between the two 'ran out of memory' lines of one failure
                if cur.has_fig and not ("tfstats" in cur.fmt and cur.f.requested is None):
                    new()
                cur.oom = True
            elif a == "tried":
                got = _size_after(low, m.end())
                if got is None:
                    cur.f.hints.add("unreadable")
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
                    cur.fmt.add("2.x")
                else:
                    put("total", _size_before(low, m.start()))
                    cur.fmt.add("1.x")
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
                    cur.fmt.add("cached")
            elif a == "bypt":
                put("allocated", _size_before(low, m.start()))
                cur.fmt.add("2.x")
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
                    cur.fmt.add("seed")
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
                    cur.fmt.add("mps")
            elif a == "maxallowed":
                got = _size_after(low, m.end())
                if got:
                    put("allowed", got[0])
            elif a == "gpu":
                if cur.f.device is None and (cur.oom or cur.has_fig):
                    cur.f.device = int(m.group("dev"))
            elif a == "resex":
                cur.oom = True
            elif a == "asyncoom":
                if cur.has_fig:
                    new()
                cur.oom = True
                cur.fmt.add("async")
            elif a in ("curalloc", "reqline", "devlimit", "freecuda", "fraclim"):
                got = _size_after(low, m.end())
                if got:
                    name = {"curalloc": "allocated", "reqline": "requested", "devlimit": "total",
                            "freecuda": "free", "fraclim": "allowed"}[a]
                    if name == "requested" and cur.f.requested is not None and "async" in cur.fmt:
                        new()
                    (once if "async" in cur.fmt else put)(name, got[0])
            elif a == "otheralloc":
                got = _size_after(low, m.end())
                if got:
                    put("other_allocations", got[0])
            elif a == "tfshape":
                sm = _TFSHAPE.match(low, m.end())
                dims_txt, closed, dtype = sm.group(1), sm.group(2), sm.group(3)
                dims = [int(d) for d in _DIGITS.findall(dims_txt)] if dims_txt is not None else []
                nbytes = None
                if closed and dtype in _DTYPE_BYTES and len(dims) <= 32:
                    n = 1
                    for d in dims:
                        n *= d
                    nbytes = n * _DTYPE_BYTES[dtype]
                shape = "[" + ",".join(map(str, dims)) + ("]" if closed else "")
                attach = cur.f.tensor_shape is None and (cur.f.requested is not None or cur.has_fig) \
                    and "tfshape" not in cur.fmt
                if not attach and (cur.has_fig or cur.oom):
                    new()
                cur.oom = True
                cur.has_fig = True
                cur.fmt.add("tfshape")
                cur.f.tensor_shape, cur.f.tensor_bytes = shape, nbytes
                cur.f.dtype = dtype.decode() if dtype else None
                if not closed:
                    cur.f.truncated = True
                if sm.group(4) == b"cpu":
                    cur.fmt.add("host")
                if sm.group(5):
                    cur.fmt.add("alloc:" + sm.group(5).decode())
                if cur.f.requested is None and nbytes is not None:
                    cur.f.requested = nbytes
            elif a in ("tflimit", "tfinuse"):
                d = _DIGITS.search(low, m.start() + 5, m.end())
                v = int(d.group()) if d else 0
                if v > 0:
                    name = "allowed" if a == "tflimit" else "allocated"
                    if getattr(cur.f, name) is not None and "tfstats" in cur.fmt and cur.f.requested is not None:
                        new()
                    once(name, v)
                    cur.fmt.add("tfstats")
            elif a in ("failalloc", "unable", "calloc"):
                pm = _PAREN_BYTES.match(low, m.end())
                got = (int(pm.group(1)), pm.end()) if pm else _size_after(low, m.end())
                if got:
                    if cur.f.requested is not None and "tfstats" not in cur.fmt:
                        new()
                    put("requested", got[0])
                    cur.oom = True
                    cur.fmt.add(a)
            elif a == "reported":
                f_, t_ = low[m.start():m.end()].rsplit(b":", 1)[1].strip().split(b"/")
                once("free", int(f_))
                once("total", int(t_))
            elif a == "xlatotal":
                got = _size_after(low, m.end())
                if got:
                    once("program_total", got[0])
                    cur.fmt.add("bufferassignment")
            if a == "tried" and low.find(b"not a failure", m.end(), m.end() + 300) >= 0:
                cur.f.not_failure = True
    new()
    out = []
    for r in recs:
        fm = r.fmt
        f = r.f
        f.span = (r.lo, r.hi)
        f.hints |= {x for x in fm if x in ("host", "async", "tfshape", "tfstats", "failalloc", "unable", "calloc",
                                           "bufferassignment")}
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
        elif "async" in fm:
            f.kind = "pytorch-async"
        elif fm & {"tfshape", "tfstats", "failalloc", "bufferassignment"}:
            f.kind = "tensorflow"
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


#: Literals that say which stack printed a message, looked for around it (first match wins, in order).
_STACK_MARKERS: tuple[tuple[str, tuple[bytes, ...]], ...] = (
    ("host", (b"defaultcpuallocator", b"$ torch: not enough memory", b"buy new ram", b"by allocator cpu",
              b"by allocator mklcpu", b"device:cpu:", b"_arraymemoryerror", b"memoryerror: unable to allocate",
              b"cannot allocate memory)", b"cpu out of memory")),
    ("pytorch-mps", (b"mps backend out of memory", b"mps allocated", b"pytorch_mps_high_watermark_ratio")),
    ("pytorch-cuda-async", (b"would exceed allowed memory", b"free (according to cuda)")),
    ("pytorch-xpu", (b"xpu out of memory",)),
    ("pytorch-hip", (b"hip out of memory", b"pytorch_hip_alloc_conf", b"(e.g., hip graphs)")),
    ("jax", (b"xlaruntimeerror", b"bufferassignment", b"xla_python_client", b"jaxlib", b"local_client.cc",
             b"device ordinal", b"pjrt", b"gpu_cudamallocasync_allocator", b"jax.", b"/jax/")),
    ("tensorflow-rocm", (b"rocm_driver", b"hip_error_outofmemory", b"hiperror_t(", b"rocm_dnn")),
    ("tensorflow", (b"resourceexhaustederror", b"oom when allocating tensor", b"bfc_allocator", b"_bfc)",
                    b"stream_executor", b"tensorflow", b"could not create cudnn handle",
                    b"failed to create cublas handle", b"allocator (gpu_")),
    ("nccl", (b"nccl warn", b"nccl error", b"ncclunhandledcudaerror", b"nccl info")),
    ("pytorch-cuda", (b"cuda out of memory", b"pytorch_cuda_alloc_conf", b"reserved in total by pytorch",
                      b"already allocated", b"reserved by pytorch")),
    ("cudnn", (b"cudnn_status_alloc_failed", b"cublas_status_alloc_failed", b"cusolver_status_alloc_failed",
               b"cufft_alloc_failed")),
    ("cuda-runtime", (b"cuda error: out of memory", b"cuda runtime error", b"cudaerrormemoryallocation",
                      b"cuda_error_out_of_memory", b"thcudacheck", b"out of memory")),
)
#: TF/JAX failures to create a library handle: the framework took the memory the library needed
_HANDLE_FAILURES = (b"could not create cudnn handle", b"failed to create cublas handle",
                    b"cublas_status_not_initialized", b"failed to get convolution algorithm")
#: PyTorch CUDA/HIP/XPU print GiB/MiB/KiB; a "GB"/"MB" there was retyped (or is another tool's figure)
_DECIMAL_UNIT = re.compile(rb"[0-9](?:\.[0-9]{1,4})?[ \t]{0,2}+(gb|mb|kb|tb)(?![a-z])")


def _stack_of(low: bytes, lo: int, hi: int) -> str:
    a, b = max(0, lo - 600), min(len(low), hi + 600)
    for name, lits in _STACK_MARKERS:
        if any(low.find(x, a, b) >= 0 for x in lits):
            return name
    return "unknown"


def _agree(x: int | None, y: int | None) -> bool:
    return x is None or y is None or abs(x - y) <= max(1, 0.01 * max(x, y))


_MERGE_FIELDS = ("requested", "total", "free", "allocated", "reserved", "reserved_unallocated", "this_process",
                 "private_pools", "allowed", "other_allocations", "program_total", "tensor_bytes")


def _merge_repeats(recs: list[Figures]) -> list[Figures]:
    """One failure printed twice (a traceback then its re-raise, TF's log line then its exception, the BFC
    summary then the op's shape) is one message: merge neighbours whose common figures agree."""
    out: list[Figures] = []
    for f in recs:
        p = out[-1] if out else None
        have_p = {k for k in _MERGE_FIELDS if getattr(p, k) is not None} if p is not None else set()
        have_f = {k for k in _MERGE_FIELDS if getattr(f, k) is not None}
        whole_again = have_f == have_p and len(have_f) >= 3   # a second complete message: a second failure
        if p is not None and not whole_again and f.span[0] - p.span[1] <= 4096 and p.stack == f.stack \
                and all(_agree(getattr(p, k), getattr(f, k)) for k in _MERGE_FIELDS) \
                and (f.tensor_shape is None or p.tensor_shape in (None, f.tensor_shape)) \
                and not (f.process_lines and p.process_lines and f.process_lines != p.process_lines):
            for k in _MERGE_FIELDS + ("tensor_shape", "dtype", "device", "largest_free_block"):
                if getattr(p, k) is None and getattr(f, k) is not None:
                    setattr(p, k, getattr(f, k))
            if not p.process_lines:
                p.process_lines = f.process_lines
            p.hints |= f.hints
            p.truncated = p.truncated and f.truncated
            p.span = (p.span[0], max(p.span[1], f.span[1]))
            if p.kind in ("driver", "pytorch-partial") and f.kind not in ("driver", "pytorch-partial"):
                p.kind = f.kind
            continue
        out.append(f)
    return out


def _check(f: Figures, low: bytes, whole_len: int) -> None:
    """Unit ambiguity, inconsistent figures and truncation, as warnings on ``f``."""
    a, b = max(0, f.span[0] - 200), min(len(low), f.span[1] + 200)
    w = f.warnings
    if f.stack in ("pytorch-cuda", "pytorch-hip", "pytorch-xpu", "pytorch-cuda-async") \
            and _DECIMAL_UNIT.search(low, max(0, f.span[0] - 120), f.span[1] + 40):
        w.append("unit ambiguity: the message shows GB/MB, which PyTorch never prints here (it prints GiB/MiB): "
                 "the figures were read as GiB/MiB (1024-based); if they were retyped as decimal GB they are ~7% "
                 "smaller -- paste the original message")
    if f.stack == "pytorch-mps" and _DECIMAL_UNIT.search(low, f.span[0], f.span[1] + 40):
        f.stats_notes.append("MPS prints binary sizes labelled GB/MB (PyTorch's MPS format_size): read as GiB/MiB")
    cap = f.total
    pairs = [("allocated", f.allocated), ("reserved", f.reserved), ("free", f.free),
             ("this process", f.this_process), ("allowed", f.allowed if f.stack in ("tensorflow", "jax") else None)]
    if cap:
        for name, v in pairs:
            if v is None or v <= cap * 1.02:
                continue
            ratio = v / cap
            if ratio >= 4:
                w.append(f"inconsistent figures: {name} {fmt(v)} > total {fmt(cap)}"
                         + (f" (x{ratio:.0f}: a unit typed wrong? MiB for GiB, or GB for MB)"
                            if 500 <= ratio <= 2000 else "")
                         + " -- the triage below may be wrong")
            elif name in ("allocated", "reserved", "this process"):
                f.stats_notes.append(f"{name} {fmt(v)} exceeds the card's {fmt(cap)}: on Windows the driver lends "
                                     "host memory (shared GPU memory / sysmem fallback) -- slow, and full anyway")
            else:
                w.append(f"inconsistent figures: {name} {fmt(v)} > total {fmt(cap)}")
            break
        listed = sum(u for _, u in f.process_lines)
        if listed > cap * 1.05:
            w.append(f"inconsistent figures: the listed processes hold {fmt(listed)} > total {fmt(cap)}")
    if f.allocated is not None and f.reserved is not None and "reserved" not in f.derived \
            and f.allocated > f.reserved * 1.02 and f.stack.startswith("pytorch"):
        r = f.allocated / max(1, f.reserved)
        w.append(f"inconsistent figures: allocated {fmt(f.allocated)} > reserved {fmt(f.reserved)}"
                 + (f" (x{r:.0f}: a unit typed wrong?)" if 500 <= r <= 2000 else "")
                 + "; PyTorch's reserved memory always covers what it allocated")
    if f.requested is not None and cap and f.requested >= 500 * cap:
        w.append(f"the request {fmt(f.requested)} is {f.requested / cap:.0f}x the total: a size computation "
                 "overflowed, or a unit was typed wrong")
    if f.total is not None and f.free is not None and f.reserved is not None and "free" not in f.derived \
            and f.free + f.reserved > f.total * 1.05:
        w.append(f"inconsistent figures: free {fmt(f.free)} + reserved {fmt(f.reserved)} > total {fmt(f.total)}")
    # truncation: a format whose closing part never came
    seg = low[f.span[0]:min(len(low), f.span[1] + 400)]
    cut = None
    if "2.x" in f.hints or (f.kind == "pytorch-2.x"):
        if b"but unallocated" not in seg and f.reserved_unallocated is None:
            cut = "PyTorch 2.x always ends with 'Of the allocated memory ... reserved by PyTorch but unallocated'"
    if f.kind in ("pytorch-1.x", "pytorch-1.x-cached") and b"(gpu" in seg and b")" not in seg[seg.find(b"(gpu"):]:
        cut = "the '(GPU ...' figures never close with ')'"
    if f.stack == "pytorch-mps" and b"mps allocated" in seg and f.allowed is None:
        cut = "MPS prints 'max allowed' after 'MPS allocated'"
    if f.stack == "pytorch-cuda-async" and b"currently allocated" in seg and f.free is None:
        cut = "the cudaMallocAsync block ends with 'Free (according to CUDA)'"
    if "bufferassignment" not in f.hints and b"bufferassignment stats" in seg:
        cut = "XLA's BufferAssignment stats end with 'total allocation'"
    if f.truncated and cut is None:
        cut = "the tensor shape is not closed with ']'"
    if cut is None and f.span[1] >= whole_len - 2 and f.kind != "driver":
        tail = low[max(0, whole_len - 12):whole_len].rstrip()
        if tail[-1:].isdigit() or tail.endswith((b";", b",", b"(")):
            cut = "the input ends in the middle of the message"
    if cut is not None:
        f.truncated = True
        w.append(f"truncated: the message is cut off ({cut}); the missing figures are unknown, not zero -- "
                 "paste the whole message")


def _summary(i: int, f: Figures) -> dict[str, Any]:
    d: dict[str, Any] = {"index": i, "stack": f.stack}
    d.update({k: v for k, v in f.parsed().items() if k != "other_processes"})
    if f.tensor_shape:
        d["tensor_shape"] = f.tensor_shape
    if f.device is not None:
        d["device"] = f.device
    if f.not_failure:
        d["not_a_failure"] = True
    return d


def parse(data: bytes | str, *, pid: int | None = None, which: int | None = None) -> Figures:
    """Read an OOM message (or a log holding one or several).

    Every message is read; the one returned is the **last** real failure
    (usually the fatal one) unless ``which`` (1-based; negative counts from
    the end) picks another.  ``summaries`` lists them all, ``messages`` counts
    them.  Raises :class:`BinaryInput` or :class:`NotAnOOM`."""
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
    handle = next((x for x in _HANDLE_FAILURES if low.find(x, 0, 1 << 20) >= 0), None)
    recs = _scan(low, read)
    for r in recs:
        r.stack = _stack_of(low, r.span[0], r.span[1])
        if "host" in r.hints:
            r.stack = "host"
    ooms = [r for r in recs if r.kind != "driver" or r.requested is not None]
    if not recs and not (hints & {"driver", "allocfail", "tensorflow"}) and handle is None:
        raise NotAnOOM("the text is not an out-of-memory message (no 'out of memory', 'Tried to allocate', "
                       "'RESOURCE_EXHAUSTED', 'OOM when allocating' or allocation-failure status found)")
    if not recs:
        f0 = Figures(kind="tensorflow" if "tensorflow" in hints or handle else "driver")
        f0.span = (0, len(low))
        f0.stack = _stack_of(low, 0, min(len(low), 4096))
        if handle is not None:
            f0.hints.add("handle")
            if f0.stack in ("unknown", "cuda-runtime", "cudnn"):
                f0.stack = "tensorflow"
        recs = [f0]
    figured = _merge_repeats(ooms or recs)
    failures = [i for i, r in enumerate(figured) if not r.not_failure] or list(range(len(figured)))
    if which is None:
        pick = failures[-1]
    else:
        if which == 0 or abs(which) > len(figured):
            raise ValueError(f"--message {which}: the input holds {len(figured)} out-of-memory message(s)")
        pick = which - 1 if which > 0 else len(figured) + which
    best = figured[pick]
    best.hints |= hints
    if handle is not None:
        best.hints.add("handle")
    best.messages = len(figured)
    best.index = pick + 1
    best.devices = sorted({r.device for r in figured if r.device is not None})
    best.unread = unread
    best.summaries = [_summary(i + 1, r) for i, r in enumerate(figured[:200])]
    # TensorFlow's start-up preallocation backs off by 0.9x per retry: a run of shrinking failures
    reqs = [r.requested for r in figured if "failalloc" in r.hints and r.requested]
    if len(reqs) >= 2 and all(0.8 <= b / a <= 0.95 for a, b in zip(reqs, reqs[1:])):
        best.hints.add("backoff")
    # a leak across iterations: the same failure's live figure growing message after message
    grow = [r.allocated for r in figured if r.allocated]
    if len(grow) >= 3 and all(b > a for a, b in zip(grow, grow[1:])) and grow[-1] >= 1.2 * grow[0]:
        best.hints.add("growing")
        best.stats_notes.append("allocated grows message after message: " + " -> ".join(fmt(x) for x in grow[-6:]))
    _complete(best)
    resolve_self(best, pid)
    _check(best, low, len(low))
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
    stack: str = "unknown"
    binding: str | None = None

    def as_json(self, f: Figures) -> dict[str, Any]:
        out = {"parsed": f.parsed(), "cause": self.cause, "evidence": self.evidence, "next_steps": self.next_steps,
               "stack": self.stack, "binding_limit": self.binding, "warnings": f.warnings,
               "truncated": f.truncated, "messages": f.summaries, "triaged_message": f.index}
        if f.tensor_shape:
            out["tensor"] = {"shape": f.tensor_shape, "dtype": f.dtype, "bytes": f.tensor_bytes}
        return out


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


def _triage_pytorch(f: Figures, *, distributed: bool = False, cudnn_benchmark: bool = False,
                    cuda_graphs: bool = False) -> Verdict:
    """PyTorch's caching allocator: does it fit?  Then seed 003's six causes in order, each on evidence."""
    flags = {"distributed": distributed, "cudnn_benchmark": cudnn_benchmark, "cuda_graphs": cuda_graphs}
    ev: list[str] = []
    R = f.requested
    T = f.total
    cap = f.allowed if f.allowed is not None else T
    cap_name = "allowed" if f.allowed is not None else "total"
    floor = _SEGMENT_FLOOR.get(R, R) if (R is not None and f.kind.startswith(("pytorch", "seed"))) else R
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

    # does-not-fit: the live set is at the card's edge (the issue's "97% full of live tensors")
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

    # does-not-fit: the stranded cache could not hold the request even coalesced into one block (ru < the
    # request), so placing it takes fresh device memory as well -- and a perfect packer would leave under 10%
    # of the limit: the live set is at the edge, defragmenting buys one allocation, not the workload
    if ru is not None and floor is not None and ru < floor and best is not None and best >= floor and cap \
            and best - floor < 0.1 * cap and not hinted and other_weight < max(need or 0, cap // 20):
        ev.append(f"reserved-but-unallocated {fmt(ru)} < the {fmt(floor)} requested: even coalesced into one "
                  f"block the cache could not hold it, so it needs fresh device memory too; placed by a perfect "
                  f"packer ({formula} = {fmt(best)}) it would leave {fmt(best - floor)} = "
                  f"{100 * (best - floor) / cap:.1f}% of the {cap_name} {fmt(cap)} -- the live set is at the edge: "
                  "the workload does not fit (a defragmenting setting would place this request, not the next)")
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


# ---------------------------------------------------------------------------
# Stacks: the binding limit first, then that stack's causes and knobs
# ---------------------------------------------------------------------------

#: XLA's default preallocation (XLA_PYTHON_CLIENT_MEM_FRACTION) -- 75% of the device since jaxlib 0.4
_XLA_DEFAULT_FRACTION = 0.75


def budget(f: Figures) -> tuple[int | None, str]:
    """The tightest limit the message names: (bytes, what it is)."""
    lims: list[tuple[int, str]] = []
    if f.total:
        lims.append((f.total, f"the device's total capacity {fmt(f.total)}"))
    if f.allowed and (f.total is None or f.allowed < f.total):
        name = {"pytorch-mps": "MPS's max allowed",
                "tensorflow": "TensorFlow's BFC memory limit", "tensorflow-rocm": "TensorFlow's BFC memory limit",
                "jax": "XLA's memory limit",
                "pytorch-cuda-async": "the PyTorch limit (per-process memory fraction)"}.get(
                    f.stack, "the per-process memory fraction ('allowed')")
        lims.append((f.allowed, f"{name} {fmt(f.allowed)}"))
    if f.stack == "jax" and f.total and not f.allowed:
        lims.append((int(f.total * _XLA_DEFAULT_FRACTION),
                     f"XLA's preallocated pool (XLA_PYTHON_CLIENT_MEM_FRACTION, {_XLA_DEFAULT_FRACTION:.0%} of "
                     f"{fmt(f.total)} by default)"))
    if not lims:
        return None, ""
    return min(lims)


def _own_ranks(f: Figures) -> list[tuple[int, int]] | None:
    """Three or more 'Process P has U' lines of about the same size and near-consecutive PIDs: one job's
    ranks (torchrun/DDP processes) that each made a CUDA context on this device."""
    lines = f.other_processes or []
    if len(lines) < 3:
        return None
    pids = sorted(p for p, _ in lines)
    sizes = [u for _, u in lines]
    if pids[-1] - pids[0] > 8 * len(pids) + 16:
        return None
    lo, hi = min(sizes), max(sizes)
    if hi > 1.25 * lo + 64 * MiB:
        return None
    return lines


def _localise(steps: list[str], stack: str) -> list[str]:
    """The stack's own tool names in shared advice."""
    if stack == "pytorch-hip":
        subs = [("nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv", "rocm-smi --showpids "
                 "(amd-smi process)"), ("nvidia-smi", "rocm-smi"), ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"),
                ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"), ("CUDA graphs", "HIP graphs")]
    elif stack == "pytorch-xpu":
        subs = [("nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv", "xpu-smi ps"),
                ("nvidia-smi", "xpu-smi"), ("torch.cuda.", "torch.xpu."), ("CUDA_VISIBLE_DEVICES",
                                                                          "ZE_AFFINITY_MASK")]
    else:
        return steps
    out = []
    for st in steps:
        for a, b in subs:
            st = st.replace(a, b)
        out.append(st)
    return out


def _host(f: Figures) -> Verdict:
    R = f.requested
    ev = ["a CPU allocator failed (DefaultCPUAllocator / numpy / TensorFlow's cpu allocator): this is host RAM, "
          "not GPU memory -- GPU figures, nvidia-smi and PYTORCH_CUDA_ALLOC_CONF do not apply"]
    if R is not None:
        ev.append(f"requested {fmt(R)} of host memory")
    steps = [f"host RAM is the binding limit{f' ({fmt(R)} could not be allocated)' if R else ''}: shrink what is "
             "held at once -- a smaller batch, tile or image, data loaded in chunks or memory-mapped -- or give the "
             "host more: RAM, swap, or a larger Windows page file (virtual memory)",
             "see what holds host RAM (free -h, top; Task Manager on Windows): each DataLoader worker copies the "
             "dataset object (fewer workers), other programs, an earlier model still referenced",
             "load checkpoints without a host copy: torch.load(path, mmap=True, map_location='cuda'), "
             "safetensors, low_cpu_mem_usage=True",
             "restart the process (last: only if memory was leaked by earlier steps)"]
    if R is not None and R >= 1 << 40:
        steps.insert(0, f"{fmt(R)} is more than any host has: print the shape being allocated -- a size "
                        "computation is wrong (a dimension squared, a length read from corrupt data)")
    return Verdict("host-memory", ev, steps)


def _tf_handle(f: Figures) -> Verdict:
    ev = ["TensorFlow could not create a cuDNN/cuBLAS handle: by default TensorFlow maps nearly all GPU memory at "
          "start-up, leaving the library none for its handle and workspace (or another process holds the GPU)"]
    steps = ["turn on memory growth so TensorFlow takes memory as needed: tf.config.experimental.set_memory_growth("
             "gpu, True) for every GPU before any op (TF 1.x: config.gpu_options.allow_growth = True), or "
             "TF_FORCE_GPU_ALLOW_GROWTH=true",
             "or cap TensorFlow below the card: tf.config.set_logical_device_configuration(gpu, "
             "[tf.config.LogicalDeviceConfiguration(memory_limit=MB)]) (TF 1.x: per_process_gpu_memory_fraction)",
             "nvidia-smi: if another process (a second notebook, a JAX or PyTorch job) holds the GPU, stop it",
             "if memory growth does not help: the same error comes from a CUDA/cuDNN version that does not match "
             "the TensorFlow build"]
    return Verdict("framework-preallocation", ev, steps)


def _tf(f: Figures, ev: list[str]) -> Verdict:
    R, L, U = f.requested, f.allowed, f.allocated
    smi = "rocm-smi --showpids" if f.stack == "tensorflow-rocm" else \
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"
    growth = ("memory growth: tf.config.experimental.set_memory_growth(gpu, True) (TF 1.x: allow_growth=True) or "
              "TF_FORCE_GPU_ALLOW_GROWTH=true")
    shrink = ("shrink the batch (model.fit(batch_size=...), or the tf.data .batch()), the image size or the "
              "sequence length")
    if f.tensor_shape:
        ev.append(f"the tensor that failed: shape {f.tensor_shape}"
                  + (f" x {f.dtype} = {fmt(f.tensor_bytes)}" if f.tensor_bytes is not None else
                     " (no dtype printed: size unknown)"))
    if "failalloc" in f.hints and "tfstats" not in f.hints and not f.tensor_shape:
        ev.append("'failed to allocate ... from device' from the stream executor: the allocator asked the driver for "
                  "a region and the device did not have it"
                  + (" -- a run of requests shrinking by 0.9x is TensorFlow's start-up preallocation backing off"
                     if "backoff" in f.hints else "")
                  + "; TensorFlow sizes that region from what the device reports free, so memory held by another "
                  "process is the usual reason")
        return Verdict("other-processes", ev, [
            f"{smi}: find the process holding the device (another TensorFlow/JAX/PyTorch job, a stale notebook "
            "kernel) and stop it",
            "let processes share the device: " + growth + ", or a per-process memory_limit",
            "run on another device (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES) or schedule the jobs apart",
            "restart the machine's stuck processes last"])
    if L is not None and U is not None and R is not None:
        if U + R > L or L - U < 0.05 * L:   # over the limit, or under it by crumbs: full either way
            ev.append(f"InUse {fmt(U)} + requested {fmt(R)} = {fmt(U + R)} > TensorFlow's BFC limit {fmt(L)}: the "
                      "live tensors fill the allocator's region -- the workload does not fit")
            return Verdict("does-not-fit", ev, [
                f"TensorFlow's BFC limit ({fmt(L)}) is the binding limit: {shrink}",
                "mixed precision (tf.keras.mixed_precision.set_global_policy('mixed_float16')) and fewer "
                "activations kept (tf.recompute_grad)",
                "if the limit is well below the card: it was capped (memory_limit / per_process_gpu_memory_fraction) "
                "or another process held memory at start-up -- " + smi,
                "a larger device, or split the model/batch across devices (tf.distribute)"])
        ev.append(f"InUse {fmt(U)} + requested {fmt(R)} <= TensorFlow's BFC limit {fmt(L)}, yet no free chunk "
                  "could take it: the free space is split between live chunks (fragmentation)")
        return Verdict("fragmentation", ev, [
            "TF_GPU_ALLOCATOR=cuda_malloc_async (TensorFlow >= 2.5): CUDA's stream-ordered pool instead of the BFC "
            "allocator's fixed region",
            "steady tensor shapes: pad/bucket variable-length inputs so freed chunks are reused",
            shrink, "restart the process (last)"])
    if L is not None and U is not None and U >= 0.95 * L:
        ev.append(f"InUse {fmt(U)} = {100 * U / L:.0f}% of TensorFlow's BFC limit {fmt(L)}: the region is full of "
                  "live tensors")
        return Verdict("does-not-fit", ev, [
            f"TensorFlow's BFC limit ({fmt(L)}) is the binding limit: {shrink}",
            "mixed precision (mixed_float16) and recomputation (tf.recompute_grad)",
            f"if the limit is below the card: {smi} for another process, or raise memory_limit",
            "a larger device, or tf.distribute across devices"])
    if "tfinit" in f.hints:
        # no allocator figures, but the failing node initialises a variable: no batch had run yet
        ev.append("the failing node initialises a variable (a '/Initializer/' node; optimizer slots such as Adam's "
                  "two per variable included): the OOM came before any batch ran, so the batch size is not the "
                  "cause. Either the GPU was already held when TensorFlow started (it only maps what is free then: "
                  "another process, a stale notebook kernel) or the model's variables do not fit the card -- the "
                  "message has no figures to tell which")
        ev.append("missing: total, free and what other processes hold on the device (nvidia-smi decides it)")
        return Verdict("unknown", ev, [
            f"{smi}: if another process holds the GPU (a second TensorFlow process or notebook, a job not visible "
            "in your ps), stop it or run on another device -- or let them share it with " + growth,
            "if the GPU was empty: the variables themselves do not fit -- add up the variables"
            + (f" (the failing one, {f.tensor_shape}, is {fmt(f.tensor_bytes)})" if f.tensor_bytes else "")
            + " with the optimizer's slots (Adam keeps two copies of each); shrink the largest (vocabulary, "
            "embedding width), place large embeddings on the CPU, or use a lighter optimizer",
            "a larger device, or split the variables across devices (tf.distribute)"])
    # a shape or a bare ResourceExhaustedError: no allocator figures
    ev.append("presumed: the message carries no allocator figures (no BFC stats, no free/total); the commonest "
              "cause of a TensorFlow OOM is a workload too large for the card -- the steps say how to tell")
    return Verdict("does-not-fit", ev, [
        shrink + (f" (the failing tensor {f.tensor_shape} scales with its first dimension)" if f.tensor_shape
                  else ""),
        f"{smi}: if another process holds the GPU (TensorFlow preallocates nearly all of it, so a second TF "
        "process or notebook on the same GPU fails at once), stop it or enable " + growth,
        "mixed precision (mixed_float16); add report_tensor_allocations_upon_oom to RunOptions (TF 1.x) or read "
        "the BFC summary above the error to see what holds memory",
        "a larger device, or tf.distribute across devices"])


def _jax(f: Figures, ev: list[str]) -> Verdict:
    R, T = f.requested, f.total
    frac = ("XLA_PYTHON_CLIENT_MEM_FRACTION (the share of the GPU JAX preallocates, .75 by default; lower it when "
            "TensorFlow, PyTorch, cuDNN or another JAX process need memory beside the pool, raise it toward .95 when "
            "JAX is alone) or XLA_PYTHON_CLIENT_PREALLOCATE=false (allocate on demand; more fragmentation)")
    if R is not None and T and R > T:
        ev.append(f"requested {fmt(R)} > the device's {fmt(T)}: no pool setting can place it")
        return Verdict("does-not-fit", ev, [
            f"the device's {fmt(T)} is the binding limit and the request is {R / T:.1f}x it: find the operation "
            "(the buffer's shape in the BufferAssignment dump, or jax.debug) and shrink what it is given or process "
            "it in chunks (jax.lax.map / scan over slices); check the shape arithmetic",
            "rematerialise (jax.checkpoint) and donate buffers (donate_argnums) to cut the program's peak",
            "shard across devices (jax.sharding) or use a larger device"])
    if f.program_total is not None:
        ev.append(f"XLA's BufferAssignment: the program needs {fmt(f.program_total)} in total (parameters, outputs "
                  "and temporaries) while one more buffer" + (f" of {fmt(R)}" if R else "") + " could not be placed")
        lim, lim_name = budget(f)
        if lim is not None:
            ev.append(f"binding limit: {lim_name}")
        return Verdict("does-not-fit", ev, [
            f"XLA's pool (XLA_PYTHON_CLIENT_MEM_FRACTION, .75 of the GPU by default) is the binding limit and the "
            f"compiled program needs {fmt(f.program_total)}: shrink the batch, sequence or image size -- or a GPU "
            "with more memory",
            "rematerialise (jax.checkpoint) and donate buffers (donate_argnums) to cut the peak",
            "if JAX is alone on the GPU: XLA_PYTHON_CLIENT_MEM_FRACTION=.95 gives the pool most of the card",
            "shard across devices (jax.sharding)"])
    ev.append("JAX preallocates a pool (75% of the GPU by default) and allocates inside it: an OOM with no program "
              "figures means the pool is the binding limit -- too small for the step, or memory outside it (cuDNN "
              "workspaces, TensorFlow or PyTorch in the same process, another JAX process) left it short")
    return Verdict("framework-preallocation", ev, [
        f"XLA's preallocated pool is the binding limit: set {frac}",
        "nvidia-smi: another JAX/TensorFlow/PyTorch process on the same GPU preallocates too -- give each a "
        "fraction or stop it; data-loading TensorFlow can run CPU-only (tf.config.set_visible_devices([], 'GPU'))",
        "shrink the batch; jax.checkpoint and donate_argnums cut the peak",
        "restart the process (last)"])


def _mps(f: Figures, ev: list[str]) -> Verdict:
    R, A, O, L = f.requested, f.allocated, f.other_allocations, f.allowed
    water = ("PYTORCH_MPS_HIGH_WATERMARK_RATIO raises MPS's cap (a ratio of the recommended working set; 0.0 "
             "removes it -- macOS may then swap hard or freeze)")
    if None in (R, A, L):
        ev.append("the MPS figures are incomplete (MPS prints MPS allocated, other allocations, max allowed and the "
                  "request; no free/total and no nvidia-smi exist on Apple GPUs)")
        return Verdict("unknown", ev, [
            "paste the whole 'MPS backend out of memory (...)' line", water,
            "shrink the batch, resolution or model", "torch.mps.empty_cache() between models; restart last"])
    used = A + (O or 0)
    if used + R > L:
        ev.append(f"MPS allocated {fmt(A)} + other allocations {fmt(O)} + requested {fmt(R)} = {fmt(used + R)} > "
                  f"max allowed {fmt(L)}: the cap binds")
        if O and O >= max(R, L // 4):
            ev.append(f"other allocations {fmt(O)} is memory the Metal device holds outside PyTorch's MPS "
                      "allocator (other models, another framework in the process)")
        return Verdict("does-not-fit", ev, [
            f"MPS's max allowed ({fmt(L)}) is the binding limit: shrink the batch, image size or sequence length, "
            "or use a smaller or lower-precision model (fp16/bf16, quantized)",
            water,
            "free what other models hold: del them and torch.mps.empty_cache(); unload models between steps",
            "restart the process (last)"])
    ev.append(f"MPS allocated {fmt(A)} + other {fmt(O)} + requested {fmt(R)} <= max allowed {fmt(L)}: the cap was "
              "not reached -- the allocator's heaps are fragmented or the system refused the buffer")
    return Verdict("fragmentation", ev, [
        "torch.mps.empty_cache() between steps or models, then retry", "steady tensor shapes", water,
        "restart the process (last)"])


def _async(f: Figures, ev: list[str]) -> Verdict:
    R, A, T, F, L = f.requested, f.allocated, f.total, f.free, f.allowed
    if L is not None and T is not None and L >= T:
        ev.append(f"PyTorch limit {fmt(L)} >= the device's {fmt(T)}: no memory fraction is set, it does not bind")
        L = None
    if None in (R, A, T):
        ev.append("the cudaMallocAsync block is incomplete (it prints Currently allocated, Requested, Device limit, "
                  "Free)")
        return Verdict("unknown", ev, ["paste the whole block", "nvidia-smi for other processes",
                                       "shrink the batch"])
    if L is not None and A + R > L:
        ev.append(f"allocated {fmt(A)} + requested {fmt(R)} > the PyTorch limit {fmt(L)} (memory fraction)")
        return Verdict("memory-fraction", ev, [
            f"the per-process memory fraction ({fmt(L)}) is the binding limit, not the device ({fmt(T)}): raise "
            "torch.cuda.set_per_process_memory_fraction or remove the call", "shrink the batch"])
    if A + R > 0.98 * T:
        ev.append(f"allocated {fmt(A)} + requested {fmt(R)} > the device's {fmt(T)}: the workload does not fit")
        return Verdict("does-not-fit", ev, [
            f"the device's total ({fmt(T)}) is the binding limit: shrink the batch, sequence length or resolution",
            "mixed precision and activation checkpointing", "shard (FSDP) or offload"])
    held = T - A - (F or 0)
    ev.append(f"device {fmt(T)} - allocated {fmt(A)} - free {fmt(F)} = {fmt(held)} is held by nobody PyTorch "
              "counts: under backend:cudaMallocAsync that is the CUDA pool's freed-but-cached memory (or another "
              "process); the request fits the device, not the pool's layout")
    return Verdict("fragmentation", ev, [
        "switch back to PyTorch's native allocator with expandable segments: PYTORCH_CUDA_ALLOC_CONF="
        "backend:native,expandable_segments:True (PyTorch >= 2.1)",
        "or keep cudaMallocAsync and trim its pool before big steps: torch.cuda.synchronize(); "
        "torch.cuda.empty_cache() (releases the pool's cached memory)",
        "nvidia-smi --query-compute-apps=pid,used_memory --format=csv: rule out another process holding the "
        f"{fmt(held)}",
        "shrink the batch; restart the process last"])


def triage(f: Figures, *, distributed: bool = False, cudnn_benchmark: bool = False,
           cuda_graphs: bool = False) -> Verdict:
    """Which stack, what binds, then that stack's causes in order -- each on evidence."""
    pre: list[str] = [f"WARNING: {w}" for w in f.warnings]
    pre.append(f"stack: {STACKS.get(f.stack, f.stack)}")
    if f.messages > 1:
        pre.append(f"{f.messages} out-of-memory messages in the input"
                   + (f" (GPUs {', '.join(map(str, f.devices))})" if len(f.devices) > 1 else "")
                   + f"; triaged: #{f.index}" + (" (the last failure, usually the fatal one)"
                                                 if f.index == f.messages else "")
                   + " -- --message N triages another")
    if f.unread:
        pre.append(f"the log holds more out-of-memory text than is read closely: the first {fmt(MAX_READ)} of it "
                   f"were read, {fmt(f.unread)} more were not")
    lim, lim_name = budget(f)
    if lim is not None and f.stack not in ("host", "jax"):
        pre.append(f"binding limit: {lim_name}")
    v = _dispatch(f, distributed=distributed, cudnn_benchmark=cudnn_benchmark, cuda_graphs=cuda_graphs)
    v.evidence = pre + v.evidence
    v.next_steps = _localise(v.next_steps, f.stack)
    if f.truncated and v.cause == "unknown":
        v.next_steps.insert(0, "the message is truncated: paste all of it (every figure after the cut is unknown)")
    v.stack = f.stack
    v.binding = lim_name or None
    return v


def _dispatch(f: Figures, **flags: bool) -> Verdict:
    ev: list[str] = list(f.stats_notes) if f.stack not in ("pytorch-cuda", "pytorch-hip", "pytorch-xpu",
                                                              "cuda-runtime", "unknown", "nccl", "cudnn") else []
    if f.stack == "host":
        return _host(f)
    if "handle" in f.hints and f.requested is None and f.total is None:
        return _tf_handle(f)
    if f.stack == "pytorch-mps":
        return _mps(f, ev)
    if f.stack == "pytorch-cuda-async":
        return _async(f, ev)
    if f.stack in ("tensorflow", "tensorflow-rocm"):
        return _tf(f, ev)
    if f.stack == "jax":
        return _jax(f, ev)
    # PyTorch's caching allocator (CUDA, HIP, XPU), NCCL, library statuses, bare runtime errors
    pv = _pytorch_extra(f, flags)
    if pv is not None:
        return pv
    v = _triage_pytorch(f, **flags)
    if v.cause == "unknown" and f.requested is None and f.total is None and f.allocated is None \
            and not (f.hints & {"nccl", "cudnn", "allocfail", "cublas", "unreadable", "overflow"}) \
            and f.kind == "driver" and not flags.get("distributed") \
            and not flags.get("cudnn_benchmark") and not flags.get("cuda_graphs"):
        v = Verdict("does-not-fit", [
            "presumed: the message is the runtime's bare 'out of memory' and carries no figures; the commonest cause "
            "is a workload too large for the card -- the second step tells it from a co-tenant"],
            ["shrink the batch (keep the effective batch with gradient accumulation), the input size or the model",
             "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv: if another process holds "
             "the card, that is the cause instead -- stop it",
             "get the figures: PyTorch >= 2.1 prints free, reserved and other processes in its OOM message "
             "(upgrade, or print torch.cuda.memory_summary() in an except block)",
             "mixed precision, activation checkpointing; restart the process last"])
    if v.cause == "does-not-fit" and f.stack == "pytorch-hip" and f.total and \
            (f.total <= 4 * GiB or (f.requested or 0) > f.total):
        v.next_steps.insert(0, f"the HIP device reports {fmt(f.total)}: on an APU (Ryzen/Strix iGPU) that is the "
                               "BIOS carve-out (UMA frame buffer) or the GTT window, not the RAM -- raise the UMA "
                               "size in the BIOS or the GTT limit (amdgpu.gttsize / ttm pages_limit) and update ROCm; "
                               "on a discrete card, shrink what the operation is given")
    return v


def _pytorch_extra(f: Figures, flags: dict[str, bool]) -> Verdict | None:
    """Causes the six-cause walk does not know: a binding memory fraction, the job's own ranks, cache held by
    pending cross-stream frees, growth across iterations, an APU's carve-out."""
    R, T, A, Rs, Fr = f.requested, f.total, f.allocated, f.reserved, f.free
    ru = f.reserved_unallocated
    ev: list[str] = []
    if "growing" in f.hints:
        ev.extend(f.stats_notes)
        ev.append("the live (allocated) figure grows from one OOM to the next: memory accumulates across "
                  "iterations rather than one step being too large")
        return Verdict("leak", ev, [
            "find what accumulates across steps: losses/outputs kept with their graph (use loss.item(), "
            ".detach()), lists of tensors, caches keyed by shape, hooks that store activations",
            "compare two steps: torch.cuda.memory._record_memory_history(); dump snapshots at steps N and N+k "
            "(torch.cuda.memory._dump_snapshot) and diff them (memspec oom explain --snapshot)",
            "wrap evaluation in torch.no_grad()/inference_mode", "restart the process (last: the leak comes back)"])
    if f.allowed is not None and T and f.allowed < 0.98 * T and Fr is not None and R is not None:
        used = Rs if Rs is not None else (A or 0)
        floor = _SEGMENT_FLOOR.get(R, R) if f.kind.startswith("pytorch") else R
        # 'Tried to allocate' is the segment cudaMalloc was refused; the printed 'allowed' is rounded to 2 decimals
        if used + R > f.allowed * 0.995 and Fr >= floor:
            ev.extend(f"{k} {fmt(getattr(f, k))} = {why}" for k, why in f.derived.items()
                      if k in ("reserved", "reserved_unallocated"))
            ev.append(f"reserved {fmt(used)} + requested {fmt(floor)} > {fmt(f.allowed)} allowed, while the device "
                      f"has {fmt(Fr)} free of {fmt(T)}: the per-process memory fraction binds, not the device")
            if f.private_pools:
                ev.append(f"private pools ({fmt(f.private_pools)}) are part of the reserved memory under that cap, "
                          "not the cause")
            return Verdict("memory-fraction", ev, [
                f"the per-process memory fraction is the binding limit ({fmt(f.allowed)} allowed of {fmt(T)}): raise "
                "torch.cuda.set_per_process_memory_fraction(...) or find the code (a test, a serving framework's "
                "gpu_memory_utilization) that set it",
                "or fit under it: shrink the batch"
                + (", or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to waste less of the allowed memory "
                   f"({fmt(ru)} of it is reserved but unallocated)" if ru is not None and ru >= floor else ""),
                "torch.cuda.empty_cache() returns cached segments so they stop counting against the cap"])
    ranks = _own_ranks(f)
    if ranks is not None and R is not None:
        total_ranks = sum(u for _, u in ranks)
        ev.append(f"{len(ranks)} 'Process' lines of about {fmt(min(u for _, u in ranks))}-"
                  f"{fmt(max(u for _, u in ranks))} with near-consecutive PIDs ({ranks[0][0]}..{ranks[-1][0]}): "
                  f"the job's own ranks, each with a CUDA context (and maybe tensors) on this device "
                  f"-- {fmt(total_ranks)} in all; not co-tenants to kill")
        return Verdict("own-ranks", ev, [
            "pin each rank to its own GPU before any CUDA work: torch.cuda.set_device(local_rank) (or "
            "device=f'cuda:{local_rank}'), and torch.load(..., map_location=f'cuda:{local_rank}' or 'cpu') so "
            "checkpoints do not land on GPU 0; do not kill these processes -- they are the job",
            "check that nothing calls torch.cuda.* (empty_cache, synchronize, memory stats) before set_device, "
            "and that CUDA_VISIBLE_DEVICES is not set identically for all ranks",
            "then size the batch for one rank per GPU"])
    if A is not None and Rs and ru is not None and R is not None and A <= 0.01 * Rs and Rs >= GiB \
            and ru >= R and (T is None or Rs >= 0.1 * T):
        ev.append(f"PyTorch holds {fmt(Rs)} reserved but only {fmt(A)} allocated: with almost nothing live there "
                  "are no live blocks to fence holes, so this is not fragmentation -- the cache is held by frees "
                  "still waiting on events recorded on other streams (record_stream, side streams, NCCL)")
        return Verdict("stream-events", ev, [
            "torch.cuda.synchronize() then torch.cuda.empty_cache(): once the streams finish, the pending frees "
            "complete and the cached segments can be released and reused",
            "stop record_stream() on tensors freed every step (let the side stream own them, or wait on an event "
            "before freeing); allocate on the stream that uses the tensor",
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True only after that (it does not release pending frees)",
            "restart the process (last)"])
    return None


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
    lines = [f"OOM ({STACKS.get(f.stack, f.stack)}; format {f.kind}): {fig or 'no figures'}"]
    if f.tensor_shape:
        lines.append(f"tensor: shape {f.tensor_shape}" + (f" {f.dtype} = {fmt(f.tensor_bytes)}" if f.dtype else ""))
    if f.messages > 1:
        lines.append(f"{f.messages} out-of-memory messages in the input (triaged: #{f.index}; --message N for another):")
        for d in f.summaries[:20]:
            figs = ", ".join(f"{k.replace('_', ' ')} {fmt(d[k])}" for k in FIGURES if k in d)
            lines.append(f"  {'*' if d['index'] == f.index else ' '}#{d['index']} [{d['stack']}] {figs or 'no figures'}"
                         + (" (not a failure: TensorFlow says it will retry)" if d.get("not_a_failure") else ""))
        if len(f.summaries) > 20:
            lines.append(f"   ... {len(f.summaries) - 20} more")
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

