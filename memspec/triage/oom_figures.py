"""OOM figures: units, cause and stack ids, the :class:`Figures` record, :func:`fmt`.

Part of :mod:`memspec.triage.oom` (split along its sections, each module under
1,200 lines); every name here is a name of that module: import from there.
"""

from __future__ import annotations

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
    "memory-fraction": "a configured per-process limit binds, not the device (PyTorch's memory fraction 'X allowed', "
                       "CuPy's pool limit, RMM's maximum pool size or limiting adaptor, vLLM's gpu_memory_utilization)",
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
    "cupy": "CuPy memory pool",
    "rmm": "RAPIDS RMM (memory resource / pool; cuDF, dask-cuda)",
    "numba": "Numba CUDA (driver allocation, no allocator figures)",
    "ggml": "llama.cpp / ggml CUDA backend",
    "vllm": "vLLM engine (KV-cache sizing under gpu_memory_utilization)",
    "unknown": "unrecognised",
}

#: Figures of ``parsed`` in ``--json`` order.
FIGURES = ("requested", "total", "free", "allocated", "reserved", "reserved_unallocated", "this_process",
           "other_processes", "private_pools", "allowed", "other_allocations", "program_total", "activation_peak",
           "kv_cache")
#: stacks that are allocator libraries (not a framework's allocator): each has its own triage in ``oom``
LIBRARY_STACKS = ("cupy", "rmm", "numba", "ggml", "vllm")

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
_ANCHORS = re.compile(rb"(?=[otamfrcipl(gwdubenk])(?:" + b"|".join([
    # allocator libraries, before 'out of memory' (an alternative that matches first wins)
    rb"(?P<cupy>out" + _W + rb"of" + _W + rb"memory[ \t]++(?:allocating|to[ \t]++allocate)(?=[ \t]++[0-9]))",   # one line
    rb"(?P<ggml>allocating(?=" + _W + rb"[0-9.]{1,30}+" + _O + rb"[kmg]ib" + _W + rb"on" + _W + rb"device))",
    rb"(?P<bufsize>buffer" + _W + rb"of" + _W + rb"size" + _W + rb"(?P<bufn>[0-9]{1,20}+)(?![0-9.]))",
    rb"(?P<rmmgrow>current/max/try" + _W + rb"size" + _O + rb"=)",
    rb"(?P<rmmmax>maximum" + _W + rb"pool" + _W + rb"size" + _W + rb"exceeded)",
    rb"(?P<rmmlimit>exceeded" + _W + rb"memory" + _W + rb"limit)",
    rb"(?P<vllmcap>total_gpu_memory" + _O + rb"\()",
    rb"(?P<vllmw>model" + _W + rb"weights" + _W + rb"take)",
    rb"(?P<vllmnt>non_torch_memory" + _W + rb"takes)",
    rb"(?P<vllmact>activation" + _W + rb"peak" + _W + rb"memory" + _W + rb"takes)",
    rb"(?P<vllmkv>(?:reserved" + _W + rb"for" + _W + rb"kv" + _W + rb"cache" + _W + rb"is|available" + _W + rb"kv"
    + _W + rb"cache" + _W + rb"memory" + _O + rb"[:(]))",
    # vLLM V1: "max seq len (X), Y GiB KV cache is needed, which is larger than the available KV cache memory (Z GiB)"
    rb"(?P<vllmneed>kv" + _W + rb"cache" + _W + rb"is" + _W + rb"needed)",
    rb"(?P<vllmlen>(?:max" + _W + rb"seq" + _W + rb"len" + _O + rb"\(|maximum" + _W + rb"model" + _W + rb"length"
    + _W + rb"is|tokens" + _W + rb"that" + _W + rb"can" + _W + rb"be" + _W + rb"stored" + _W + rb"in" + _W + rb"kv"
    + _W + rb"cache" + _O + rb"\()" + _O + rb"(?P<vlen>[0-9]{1,12}+))",
    rb"(?P<vllmnone>no" + _W + rb"available" + _W + rb"memory" + _W + rb"for" + _W + rb"the" + _W + rb"cache"
    + _W + rb"blocks)",
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
    ("driver", b"rmm_error_out_of_memory"),      # RMM < 0.13's RMMError (rmm.rmm.RMMError: RMM_ERROR_OUT_OF_MEMORY)
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
          b"hiperror_t(1002)", b"handle: cu", b"cudamalloc failed", b"pool size exceeded", b"exceeded memory limit",
          b"memory for the cache blocks", b"for kv cache is", b"kv cache memory:", b"kv cache is needed",
          b"stored in kv cache")
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
    activation_peak: int | None = None     # vLLM's profile: "PyTorch activation peak memory takes X"
    kv_cache: int | None = None            # vLLM: memory left for the KV cache (negative: none)
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



#: memory a process holds outside PyTorch's allocator without anything being
#: wrong: the CUDA context, cuBLAS/cuDNN handles and workspaces (CUDA 12.x:
#: a few hundred MiB to ~1 GiB) -- plus the driver's own reserve.
_CONTEXT_ALLOWANCE = 3 * GiB // 2
