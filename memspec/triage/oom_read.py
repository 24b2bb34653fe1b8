"""OOM messages read: the text scan, the pick of the message, memory_stats() and nvidia-smi.

Part of :mod:`memspec.triage.oom` (split along its sections, each module under
1,200 lines); every name here is a name of that module: import from there.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import re
from typing import Any

from .oom_figures import (BinaryInput, Figures, LIBRARY_STACKS, MAX_READ, MiB, NotAnOOM, _AFTER, _ANCHORS, _BACK,
    _BACK_WINDOW, _BEFORE, _CONTEXT_ALLOWANCE, _DIGITS, _DTYPE_BYTES, _FWD, _GLOBAL_MARKERS, _IS_FREE, _MARKERS,
    _OF, _PAREN_BYTES, _SEEDS, _TFSHAPE, _UNIT, fmt)


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
                if cur.has_fig and not ("tfstats" in cur.fmt and cur.f.requested is None) \
                        and not ("ggml" in cur.fmt and low.rfind(b"failed:", max(0, m.start() - 12), m.start()) >= 0):
                    new()   # (ggml's own line ends 'cudaMalloc failed: out of memory': the same failure)
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
            elif a == "cupy":
                got_c = _cupy_figures(low, m.end())
                if got_c:
                    req, held, with_req, limit = got_c
                    put("requested", req)   # a second CuPy message starts the next record
                    cur.oom = True
                    cur.fmt.add("cupy")
                    if held is not None:
                        cur.f.reserved = max(0, held - req) if with_req else held
                        if with_req:   # CuPy < 7 printed the pool's total with the request added
                            cur.f.derived["reserved"] = "the printed 'total' less the request (CuPy < 7 adds it)"
                    if limit is not None:
                        cur.f.allowed = limit
                        cur.fmt.add("cupy-limit")
            elif a == "ggml":
                got = _size_after(low, m.end())
                if got:
                    put("requested", got[0])   # one 'allocating' line per failure: a second starts the next
                    cur.oom = True
                    cur.fmt.add("ggml")
                    dm = _GGML_DEV.match(low, got[1])
                    if dm:
                        cur.f.device = int(dm.group(1))
            elif a == "bufsize":
                # ggml: "alloc_tensor_range: failed to allocate CUDA0 buffer of size N" (the exact bytes)
                if low.rfind(b"failed to allocate", max(0, m.start() - 48), m.start()) >= 0:
                    v = int(m.group("bufn"))
                    if cur.f.requested is None or _agree(cur.f.requested, v):
                        cur.f.requested = v
                        cur.has_fig = cur.oom = True
            elif a == "rmmgrow":
                # RMM >= 25.04: "Not enough room to grow, current/max/try size = A, B, C"
                gm = _RMM_GROW.match(low, m.end())
                if gm:
                    vals = [_num_unit(gm.group(i), gm.group(i + 1)) for i in (1, 3, 5)]
                    if vals[0] is not None:
                        once("reserved", vals[0])
                    if vals[1] is not None:
                        once("allowed", vals[1])
                    if vals[2] is not None:
                        once("requested", vals[2])
                    cur.fmt.add("rmmgrow")
                cur.oom = True
            elif a in ("rmmmax", "rmmlimit"):
                cur.oom = True
                cur.fmt.add(a)
            elif a == "vllmcap":
                vm = _VLLM_CAP.match(low, m.end())
                if vm:
                    once("total", _num_unit(vm.group(1), vm.group(2)))
                    once("allowed", _num_unit(vm.group(4), vm.group(5)))
                    cur.fmt.add("vllm")
            elif a in ("vllmw", "vllmnt", "vllmact"):
                got = _size_after(low, m.end())
                if got:
                    once({"vllmw": "allocated", "vllmnt": "other_allocations", "vllmact": "activation_peak"}[a],
                         got[0])
                    cur.fmt.add("vllm")
            elif a == "vllmkv":
                km = _SIGNED.match(low, m.end())
                got = _size_after(low, km.end()) if km else None
                if got:
                    once("kv_cache", -got[0] if km.group(1) else got[0])
                    cur.fmt.add("vllm")
            elif a == "vllmneed":
                v = _size_before(low, m.start())
                if v is not None:
                    if cur.f.requested is not None and "vllm" in cur.fmt:
                        new()
                    put("requested", v)
                    cur.oom = True
                    cur.fmt.add("vllm")
            elif a == "vllmlen":
                # 'max seq len (X)': the configured max_model_len; 'maximum model length is N' / 'tokens that
                # can be stored in KV cache (N)': what the KV budget holds
                which = "vllm-maxlen" if low.startswith(b"max", m.start()) \
                    and not low.startswith(b"maximum", m.start()) else "vllm-estlen"
                cur.f.hints.add(f"{which}:{int(m.group('vlen'))}")
                if which == "vllm-estlen" and low.startswith(b"tokens", m.start()):
                    cur.oom = True   # V0: "The model's max seq len (X) is larger than the maximum number of tokens..."
                    cur.fmt.add("vllm")
            elif a == "vllmnone":
                cur.oom = True
                cur.fmt.add("vllm")
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
        lib_kind = next((k for k in ("cupy", "ggml", "vllm", "rmmgrow", "rmmmax", "rmmlimit") if k in fm), None)
        if lib_kind is not None:
            f.kind = "rmm" if lib_kind.startswith("rmm") else lib_kind
            f.hints |= {x for x in fm if x.startswith(("rmm", "cupy"))}
        elif "seed" in fm:
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


#: CuPy's OutOfMemoryError, after "Out of memory allocating" / "out of memory to allocate" (cupy/cuda/memory.pyx):
#: "N bytes (allocated so far: A bytes[, limit set to: L bytes])." (CuPy >= 7, thousands separators) or
#: "N bytes (total T bytes[, limit set to L bytes])" (CuPy < 7: T includes the request)
_CUPY = re.compile(rb"[ \t\r\n]{1,8}+([0-9][0-9,]{0,40}+)[ \t\r\n]{1,8}+bytes(?:[ \t\r\n]*+\((allocated[ \t\r\n]++so"
                   rb"[ \t\r\n]++far:|total)[ \t\r\n]*+([0-9][0-9,]{0,40}+)[ \t\r\n]++bytes(?:[ \t\r\n]*+,[ \t\r\n]*+limit"
                   rb"[ \t\r\n]++set[ \t\r\n]++to:?[ \t\r\n]*+([0-9][0-9,]{0,40}+)[ \t\r\n]++bytes)?)?")
#: ggml: "allocating 4096.00 MiB on device 0: cudaMalloc failed"
_GGML_DEV = re.compile(rb"[ \t]++on[ \t]++device[ \t]++([0-9]{1,3}+)")
#: llama.cpp: "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA ...) (0000:01:00.0) - 10958 MiB free"
_GGML_FREE = re.compile(rb"using device (?:cuda|rocm|vulkan)([0-9]{1,3}+) \([^\n]{0,160}?\) - ([0-9]{1,9}+) mib free")
#: RMM: " A unit, B unit, C unit" after "current/max/try size =" (units up to EiB: SIZE_MAX is an unlimited maximum)
_RMM_GROW = re.compile(rb"[ \t]*+([0-9]{1,30}+(?:\.[0-9]{1,30}+)?)[ \t]*+([a-z]{1,3}+)[ \t]*+,[ \t]*+([0-9]{1,30}+(?:\.[0-9]{1,30}+)?)"
                       rb"[ \t]*+([a-z]{1,3}+)[ \t]*+,[ \t]*+([0-9]{1,30}+(?:\.[0-9]{1,30}+)?)[ \t]*+([a-z]{1,3}+)")
#: vLLM: "total_gpu_memory (79.19GiB) x gpu_memory_utilization (0.90) = 71.27GiB"
_VLLM_CAP = re.compile(rb"[ \t]*+([0-9]{1,12}+(?:\.[0-9]{1,12}+)?)[ \t]*+(gib|mib|gb|mb)[ \t]*+\)[ \t]*+x[ \t]*+"
                       rb"gpu_memory_utilization[ \t]*+\([ \t]*+([0-9.]{1,12}+)[ \t]*+\)[ \t]*+=[ \t]*+"
                       rb"([0-9]{1,12}+(?:\.[0-9]{1,12}+)?)[ \t]*+(gib|mib|gb|mb)")
_SIGNED = re.compile(rb"[ \t]*+(-?)")


def _num_unit(num: bytes, unit: bytes) -> int | None:
    u = _UNIT.get(unit)
    return None if u is None else int(round(float(num) * u))


def _cupy_figures(low: bytes, pos: int) -> tuple[int, int | None, bool, int | None] | None:
    """CuPy's OutOfMemoryError after its anchor: (request, pool total, printed with the request added?, limit)."""
    cm = _CUPY.match(low, pos)
    if not cm:
        return None
    held = int(cm.group(3).replace(b",", b"")) if cm.group(3) is not None else None
    limit = int(cm.group(4).replace(b",", b"")) if cm.group(4) is not None else None
    return int(cm.group(1).replace(b",", b"")), held, cm.group(2) == b"total", limit


#: text that shows an RMM pool being created with a set initial size (rather than grown)
_RMM_CREATE = (b"--rmm-pool-size", b"rmm_pool_size=", b"plugin.setup", b"initialize_allocator", b"initial_pool_size")


def _ggml_phase(text: bytes) -> str:
    """Which llama.cpp buffer failed: the weights, the compute buffer or the KV cache (its log's function names)."""
    if any(x in text for x in (b"gallocr_reserve", b"compute buffer", b"compute pp buffer", b"graph_reserve")):
        return "compute"
    if any(x in text for x in (b"alloc_tensor_range", b"llama_model_load", b"load_tensors", b"error loading model")):
        return "weights"
    if any(x in text for x in (b"kv_cache_init", b"kv buffer", b"llama_kv_cache")):
        return "kv"
    return "unknown"


def _library_context(f: Figures, low: bytes) -> None:
    """Context an allocator library's message leaves around it, as hints: an RMM pool being created, the
    llama.cpp buffer that failed."""
    lo, hi = max(0, f.span[0] - 4000), min(len(low), f.span[1] + 600)
    near = low[lo:hi]
    if f.stack == "rmm" and any(x in near for x in _RMM_CREATE):
        f.hints.add("rmm-create")
    if f.stack == "rmm" and b"cudaerrormemoryallocation" in low[f.span[0]:min(len(low), f.span[1] + 600)]:
        f.hints.add("rmm-upstream")   # RMM >= 25.04 appends the upstream's error: the device refused the growth
    if f.stack == "ggml":
        f.hints.add("ggml:" + _ggml_phase(low[max(0, f.span[0] - 200):min(len(low), f.span[1] + 600)]))
        # llama.cpp's load line "using device CUDA0 (name) - 23038 MiB free" (printed once, at load): the last
        # one for the failing device, before the failure
        dev = f.device if f.device is not None else 0
        free_at_load = None
        for dm in _GGML_FREE.finditer(low, 0, f.span[0]):
            if int(dm.group(1)) == dev:
                free_at_load = int(dm.group(2)) * MiB
        if free_at_load is not None and f.free is None:
            f.free = free_at_load
            f.hints.add("ggml-free-at-load")


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
    # allocator libraries (before the frameworks and the bare runtime: their messages name the runtime's error)
    ("cupy", (b"cupy.cuda.memory", b"cupy/cuda/memory", b"out of memory allocating", b"(allocated so far:",
              b"out of memory to allocate", b"cupy_gpu_memory_limit")),
    ("rmm", (b"rmm/mr/", b"rmm failure at", b"rmm_error_out_of_memory", b"rmm._lib", b"librmm",
             b"maximum pool size exceeded", b"current/max/try size", b"rmmerror")),
    ("numba", (b"call to cumemalloc", b"numba.cuda", b"numba/cuda", b"cudaapierror")),
    ("ggml", (b"ggml_backend_cuda", b"ggml_gallocr", b"alloc_tensor_range", b"ggml_cuda", b"llama_model_load",
              b"llama_kv_cache", b"cudamalloc failed: out of memory")),
    ("vllm", (b"no available memory for the cache blocks", b"for kv cache is", b"available kv cache memory",
              b"gpu_memory_utilization (", b"kv cache is needed", b"stored in kv cache")),
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
        # ggml prints one 'allocating ... cudaMalloc failed' line per attempt, never one failure twice
        whole_again = whole_again or (p is not None and p.kind == f.kind == "ggml" and "requested" in have_f)
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
    if cut is None and f.span[1] >= whole_len - 2 and f.kind not in ("driver", "ggml"):   # ggml ends on a byte count
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
        if r.stack in LIBRARY_STACKS and r.kind in ("driver", "tensorflow", "pytorch-partial"):
            r.kind = r.stack
    ooms = [r for r in recs if r.kind != "driver" or r.requested is not None]
    if not recs and not (hints & {"driver", "allocfail", "tensorflow"}) and handle is None:
        raise NotAnOOM("the text is not an out-of-memory message (no 'out of memory', 'Tried to allocate', "
                       "'RESOURCE_EXHAUSTED', 'OOM when allocating' or allocation-failure status found)")
    if not recs:
        f0 = Figures(kind="tensorflow" if "tensorflow" in hints or handle else "driver")
        f0.span = (0, len(low))
        f0.stack = _stack_of(low, 0, min(len(low), 4096))
        if f0.stack in LIBRARY_STACKS:
            f0.kind = f0.stack
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
    if best.stack in LIBRARY_STACKS:
        _library_context(best, low)
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

