"""Snapshots of the caching allocator in ``torch.cuda.memory._snapshot()`` form.

The structure PyTorch 2.5 pickles with ``torch.cuda.memory._dump_snapshot``
(and its memory viewer reads): ``segments`` (address order; each with
``device, address, total_size, allocated_size, active_size, requested_size,
stream, segment_type, segment_pool_id, is_expandable, frames, blocks``; each
block ``address, size, requested_size, state, frames`` with states
``active_allocated``, ``active_pending_free``, ``inactive``), ``device_traces``
(one list per device of ``{action, addr, size, stream, time_us, frames}``,
``oom`` entries with ``device_free``, with actions ``alloc, free_requested, free_completed, segment_alloc,
segment_free, segment_map, segment_unmap, oom``), ``allocator_settings`` and
``external_annotations``.  Each mapped range of an expandable segment is a
segment of its own, as in PyTorch.  The export itself
(``CachingAllocator.snapshot()``) is :mod:`memspec.reference.caching_export`.

:func:`load` is safe on untrusted files (bug reports, CI artifacts): a
pickle is read by an unpickler that allows no globals -- plain dicts, lists,
strings and numbers only, so nothing in the file can run -- or the file is
JSON; then every field memspec reads is type-checked
(:class:`SnapshotError`, an InvalidRequest, names the first bad one).

Import and replay: :func:`replay` runs a snapshot's trace through either
preset, with or without expandable segments, and answers seed 003's question
*would expandable segments have avoided this OOM?*  :func:`to_svg` draws the
segments and their blocks (live, free, pending).
"""

from __future__ import annotations

import html
import io
import json
import pickle
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from memspec.reference.caching import CachingAllocator
from memspec.spec.api import MiB
from memspec.spec.errors import InvalidRequest, OutOfMemory

_SETTINGS_KEYS = ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold", "expandable_segments",
                  "roundup_power2_divisions")


def dump(snapshot: dict, f: BinaryIO | str) -> None:
    """``torch.cuda.memory._dump_snapshot``: pickle the structure."""
    if isinstance(f, str):
        with open(f, "wb") as fh:
            pickle.dump(snapshot, fh)
    else:
        pickle.dump(snapshot, f)


class SnapshotError(InvalidRequest):
    """A snapshot file that is not plain snapshot data: unreadable, a pickle
    that names any global (class, function), or a field of the wrong type."""


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only (dict, list, tuple, str, bytes, int, float,
    bool, None): every global lookup -- the way a pickle builds objects or
    calls functions -- is refused, so loading runs nothing from the file."""

    def find_class(self, module: str, name: str):  # noqa: D102
        raise SnapshotError(f"snapshot pickle refers to {module}.{name}: only plain data (dict, list, str, int, ...) "
                            "is accepted")


#: segment field -> accepted types (PyTorch's ``_snapshot()``; older versions lack some optional ones)
_SEG_REQUIRED = {"address": int, "total_size": int, "blocks": list}
_SEG_OPTIONAL = {"device": int, "allocated_size": int, "active_size": int, "requested_size": int, "stream": int,
                 "segment_type": str, "segment_pool_id": (list, tuple), "is_expandable": bool, "frames": list}
_BLOCK_REQUIRED = {"size": int, "state": str}
_BLOCK_OPTIONAL = {"address": int, "requested_size": int, "frames": list}
_TRACE_REQUIRED = {"action": str}
_TRACE_OPTIONAL = {"addr": int, "size": int, "stream": int, "time_us": (int, float), "frames": list,
                   "device_free": int}
#: actions memspec replays and the fields each needs (PyTorch's oom entries carry device_free, not addr);
#: other actions (PyTorch adds some over versions) are kept, with their known fields type-checked
_TRACE_NEEDS = {a: ("addr", "size") for a in ("alloc", "free_requested", "free_completed", "segment_alloc",
                                                "segment_free", "segment_map", "segment_unmap")}
_TRACE_NEEDS["oom"] = ("size",)
_SETTINGS_TYPES = {"PYTORCH_CUDA_ALLOC_CONF": str, "max_split_size": (int, type(None)), "garbage_collection_threshold": (int, float, type(None)),
                   "expandable_segments": bool, "roundup_power2_divisions": list, "memspec_preset": str,
                   "memspec_capacity": int}
_MAX_INT = 1 << 64


def _typed(v: Any, types: tuple) -> bool:
    if v is None:
        return type(None) in types
    if isinstance(v, bool):
        return bool in types          # a bool is not an int here
    if isinstance(v, int):
        return int in types and -_MAX_INT < v < _MAX_INT
    if isinstance(v, float):
        return float in types and v == v and abs(v) != float("inf")
    return isinstance(v, types)


def _check_fields(obj: Any, where: str, required: dict, optional: dict) -> dict:
    if not isinstance(obj, dict):
        raise SnapshotError(f"{where}: expected a dict, got {type(obj).__name__}")
    for key, types in list(required.items()) + list(optional.items()):
        if key not in obj:
            if key in required:
                raise SnapshotError(f"{where}: missing field {key!r}")
            continue
        v = obj[key]
        ok = _typed(v, types if isinstance(types, tuple) else (types,))
        if not ok:
            raise SnapshotError(f"{where}: field {key!r} has the wrong type or range ({type(v).__name__} {v!r:.60})")
    return obj


#: per trace field: the exact types accepted without a second look (int and
#: float still get their range check); anything else goes to _check_fields
_TRACE_FAST = {k: frozenset(t if isinstance(t, tuple) else (t,)) for k, t in {**_TRACE_REQUIRED, **_TRACE_OPTIONAL}.items()}
_INF = float("inf")


def _trace_entry_plain(e: Any) -> bool:
    """True when trace entry ``e`` is a dict whose known fields all have an
    accepted exact type and range, its ``action`` is there and has the fields
    it needs, and no size is negative -- what :func:`_check_fields` and the
    checks after it accept, at a fraction of their cost (a trace of a long
    run has millions of entries).  False sends the entry to the full checks,
    which name the problem (or accept, e.g., a ``str`` subclass)."""
    if type(e) is not dict or "action" not in e:
        return False
    fast = _TRACE_FAST
    for k, v in e.items():
        ok = fast.get(k)
        if ok is None:
            continue  # a field memspec does not read: kept, unchecked (as _check_fields)
        tv = type(v)
        if tv is int:
            if int not in ok or not -_MAX_INT < v < _MAX_INT:
                return False
        elif tv is float:
            if float not in ok or v != v or v == _INF or v == -_INF:
                return False
        elif tv not in ok or tv is bool:
            return False
    need = _TRACE_NEEDS.get(e["action"])
    if need is not None:
        for f in need:
            if f not in e:
                return False
    return e.get("size", 0) >= 0 and e.get("device_free", 0) >= 0


def _check_layout(seg: dict, i: int) -> None:
    """A segment's blocks lie inside it and do not overlap (a real
    allocator's blocks are pieces of their segment: a snapshot where they
    are not is corrupt or crafted, and every figure drawn from it --
    allocated above reserved, say -- would be nonsense)."""
    lo, hi = seg["address"], seg["address"] + seg["total_size"]
    order = sorted(range(len(seg["blocks"])), key=lambda j: seg["blocks"][j]["address"])
    end, prev = lo, None
    for j in order:
        b = seg["blocks"][j]
        a, n = b["address"], b["size"]
        if a < lo or a + n > hi:
            raise SnapshotError(f"segments[{i}].blocks[{j}]: [{a:#x}, {a + n:#x}) lies outside its segment "
                                f"[{lo:#x}, {hi:#x})")
        if a < end and prev is not None:
            raise SnapshotError(f"segments[{i}].blocks[{j}]: overlaps segments[{i}].blocks[{prev}] "
                                f"(starts at {a:#x}, before {end:#x})")
        end, prev = a + n, j


def _check_disjoint(segs: list) -> None:
    """Segments of one device do not overlap (each is its own reservation)."""
    order = sorted(range(len(segs)), key=lambda i: (segs[i].get("device", 0), segs[i]["address"]))
    prev = None
    for i in order:
        s = segs[i]
        if prev is not None:
            p = segs[prev]
            if p.get("device", 0) == s.get("device", 0) and s["address"] < p["address"] + p["total_size"]:
                raise SnapshotError(f"segments[{i}]: overlaps segments[{prev}] (starts at {s['address']:#x}, "
                                    f"before {p['address'] + p['total_size']:#x})")
        prev = i


def check_snapshot(snap: Any) -> dict:
    """Schema check of every field memspec reads; fills PyTorch's optional
    fields an older snapshot lacks.  SnapshotError (an InvalidRequest) names
    the first bad field."""
    if not isinstance(snap, dict) or "segments" not in snap:
        raise SnapshotError("not a memory snapshot: expected a dict with 'segments' (torch.cuda.memory._snapshot())")
    if not isinstance(snap["segments"], list):
        raise SnapshotError("'segments' must be a list")
    for i, seg in enumerate(snap["segments"]):
        _check_fields(seg, f"segments[{i}]", _SEG_REQUIRED, _SEG_OPTIONAL)
        if seg["address"] < 0 or seg["total_size"] < 0:
            raise SnapshotError(f"segments[{i}]: negative address or size")
        for j, b in enumerate(seg["blocks"]):
            _check_fields(b, f"segments[{i}].blocks[{j}]", _BLOCK_REQUIRED, _BLOCK_OPTIONAL)
            if b["size"] < 0:
                raise SnapshotError(f"segments[{i}].blocks[{j}]: negative size")
            b.setdefault("requested_size", b["size"])
        live = [b for b in seg["blocks"] if b["state"] == "active_allocated"]
        seg.setdefault("segment_type", "large" if seg["total_size"] > (1 << 20) else "small")
        seg.setdefault("is_expandable", False)
        seg.setdefault("allocated_size", sum(b["size"] for b in live))
        addr = seg["address"]
        for b in seg["blocks"]:   # PyTorch before 2.1 gave blocks no address: they are laid out in order
            if "address" not in b:
                b["address"] = addr
            addr = b["address"] + b["size"]
        _check_layout(seg, i)
    _check_disjoint(snap["segments"])
    traces = snap.setdefault("device_traces", [[]])
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise SnapshotError("'device_traces' must be a list of lists (one per device)")
    for d, trace in enumerate(traces):
        for k, e in enumerate(trace):
            if _trace_entry_plain(e):
                continue
            _check_fields(e, f"device_traces[{d}][{k}]", _TRACE_REQUIRED, _TRACE_OPTIONAL)
            need = _TRACE_NEEDS.get(e["action"], ())
            if any(f not in e for f in need):
                raise SnapshotError(f"device_traces[{d}][{k}]: a {e['action']} entry needs {' and '.join(map(repr, need))}")
            if e.get("size", 0) < 0 or e.get("device_free", 0) < 0:
                raise SnapshotError(f"device_traces[{d}][{k}]: negative size")
    settings = snap.setdefault("allocator_settings", {})
    _check_fields(settings, "allocator_settings", {}, _SETTINGS_TYPES)
    if settings.get("memspec_preset", "pytorch") not in ("pytorch", "seed"):
        raise SnapshotError(f"allocator_settings: unknown memspec_preset {settings['memspec_preset']!r:.60}")
    if settings.get("memspec_capacity", 1) <= 0:
        raise SnapshotError("allocator_settings: memspec_capacity must be positive")
    return snap


def load(f: BinaryIO | str) -> dict:
    """Read a snapshot (ours or PyTorch's ``_dump_snapshot`` pickle, or the
    same structure as JSON) and check every field memspec reads.

    Safe on untrusted files: a pickle is read by an unpickler that accepts
    only plain data (no globals: nothing in the file can build an object or
    call a function), then :func:`check_snapshot` checks the schema.  Any
    problem is a :class:`SnapshotError` (an InvalidRequest) naming it."""
    if isinstance(f, str):
        with open(f, "rb") as fh:
            head = fh.read(4096)
            if head.lstrip()[:1] not in (b"{", b"[", b"") and fh.seekable():
                # a pickle: unpickled straight from the file, never held whole in memory as well
                fh.seek(0)
                return check_snapshot(_unpickle(fh))
            raw = head + fh.read()
    else:
        raw = f.read()
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogateescape")
    head = raw.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            snap = json.loads(raw.decode("utf-8"))
        except (ValueError, TypeError, RecursionError, MemoryError, OverflowError) as e:
            raise SnapshotError(f"not a readable snapshot (pickle or JSON): {type(e).__name__}: {str(e)[:200]}") from None
    else:
        snap = _unpickle(io.BytesIO(raw))
    return check_snapshot(snap)


def _unpickle(fh: BinaryIO) -> Any:
    """Plain data from a pickle stream (:class:`_PlainUnpickler`); any failure is a SnapshotError."""
    try:
        return _PlainUnpickler(fh).load()
    except SnapshotError:
        raise
    except (pickle.UnpicklingError, ValueError, EOFError, TypeError, KeyError, IndexError, AttributeError,
            ImportError, RecursionError, MemoryError, OverflowError) as e:
        raise SnapshotError(f"not a readable snapshot (pickle or JSON): {type(e).__name__}: {str(e)[:200]}") from None


# --------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------

@dataclass
class ReplayResult:
    """What happened when a trace ran through one configuration."""

    preset: str
    expandable: bool
    capacity: int
    allocs: int = 0
    frees: int = 0
    ooms: list[dict] = field(default_factory=list)       # {"index", "size", "message"} of replayed OOMs
    original_ooms: list[int] = field(default_factory=list)  # trace indexes of the snapshot's own OOMs
    allocator: Any = None
    peak_reserved: int = 0

    @property
    def ok(self) -> bool:
        return not self.ooms


def estimate_capacity(snap: dict) -> int:
    """The device capacity a trace implies: ``memspec_capacity`` if we wrote
    it, else (at the first OOM) reserved-at-that-time + the free bytes the OOM
    entry records, else the peak of segment sizes reserved."""
    cap = snap.get("allocator_settings", {}).get("memspec_capacity")
    if cap:
        return int(cap)
    reserved = peak = 0
    for e in (snap.get("device_traces") or [[]])[0]:
        a = e.get("action")
        if a in ("segment_alloc", "segment_map"):
            reserved += e["size"]
        elif a in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
        elif a == "oom":
            return reserved + int(e.get("device_free", e.get("addr", 0)))
        peak = max(peak, reserved)
    if peak == 0:
        peak = sum(s["total_size"] for s in snap["segments"])
    return peak


def replay(snap: dict, *, preset: str | None = None, expandable: bool | None = None, capacity: int | None = None,
           record_history: bool = True) -> ReplayResult:
    """Run the snapshot's ``alloc``/``free_requested`` trace through a fresh
    allocator.  An ``alloc`` that OOMs in the replay is recorded and skipped
    (its later free is ignored), so the rest of the trace still runs; an
    ``oom`` entry (a request that failed when the trace was recorded) is
    retried: recorded if it fails again, freed at once if it succeeds.  A run
    of ``segment_free``/``segment_unmap`` entries that no free caused is an
    ``empty_cache()`` (or an OOM retry) and is replayed as one."""
    settings = snap.get("allocator_settings", {})
    preset = preset or settings.get("memspec_preset", "pytorch")
    if expandable is None:
        expandable = bool(settings.get("expandable_segments", False))
    capacity = capacity or estimate_capacity(snap)
    ms = settings.get("max_split_size", -1)
    alloc = CachingAllocator(preset=preset, capacity=capacity, expandable_segments=expandable,
                             max_split_size=None if ms in (-1, None) or preset == "seed" else int(ms),
                             record_history=record_history)
    res = ReplayResult(preset, expandable, capacity, allocator=alloc)
    live: dict[int, Any] = {}
    skipped: set[int] = set()
    # the loop runs once per trace event (millions for a long run): locals, no per-event
    # method lookups
    malloc, free, pop = alloc.malloc, alloc.free, live.pop
    reserved = alloc.stats.reserved_bytes[0]  # the 'all' entry, read after each alloc for the peak
    ooms = res.ooms
    peak = n_allocs = n_frees = 0
    releases = ("segment_free", "segment_unmap")
    seed = preset == "seed"
    prev = None
    for i, e in enumerate((snap.get("device_traces") or [[]])[0]):
        a = e.get("action")
        last, prev = prev, a
        if a == "alloc":
            n_allocs += 1
            try:
                live[e["addr"]] = malloc(int(e["size"]), int(e.get("stream", 0)))
            except OutOfMemory as err:
                ooms.append({"index": i, "size": int(e["size"]), "message": str(err), "error": err})
                skipped.add(e["addr"])
            c = reserved.current
            if c > peak:
                peak = c
        elif a == "free_requested":
            blk = pop(e["addr"], None)
            if blk is not None:
                n_frees += 1
                free(blk)
            elif e["addr"] in skipped:
                skipped.discard(e["addr"])
        elif a in releases:
            # a release no free caused: empty_cache (or an OOM retry); one run of them is one call
            auto = last in releases or (a == "segment_unmap" and last == "free_completed" and seed)
            if not auto:
                alloc.empty_cache()
        elif a == "oom":
            # the request that failed (its rounded size): does it fail here too?
            res.original_ooms.append(i)
            try:
                blk = malloc(int(e["size"]), int(e.get("stream", 0)))
            except OutOfMemory as err:
                ooms.append({"index": i, "size": int(e["size"]), "message": str(err), "error": err})
            else:
                free(blk)  # the program got an exception, not a tensor
    res.allocs, res.frees, res.peak_reserved = n_allocs, n_frees, peak
    return res


def would_expandable_avoid_oom(snap: dict, *, preset: str | None = None, capacity: int | None = None) -> tuple[bool, ReplayResult, ReplayResult]:
    """Seed 003's question: replay without and with expandable segments.
    True when the fixed-segment replay OOMs and the expandable one does not."""
    fixed = replay(snap, preset=preset, expandable=False, capacity=capacity, record_history=False)
    exp = replay(snap, preset=preset, expandable=True, capacity=capacity, record_history=False)
    return bool(fixed.ooms) and not exp.ooms, fixed, exp


# --------------------------------------------------------------------------
# Picture
# --------------------------------------------------------------------------

_COLOURS = {"active_allocated": "#d9534f", "inactive": "#5cb85c", "active_pending_free": "#f0ad4e"}
_LABELS = {"active_allocated": "live", "inactive": "free", "active_pending_free": "pending"}


def _esc(s: object) -> str:
    """Text or attribute value for the SVG: every markup character escaped."""
    return html.escape(str(s), quote=True)


def to_svg(snap: dict, *, width: int = 900, row: int = 34) -> str:
    """Segments as rows, blocks as boxes scaled to the largest segment:
    live (red), free (green), pending (orange)."""
    segs = snap["segments"]
    biggest = max((s["total_size"] for s in segs), default=1)
    left, top = 170, 40
    scale = (width - left - 20) / biggest
    h = top + row * max(1, len(segs)) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" font-family="monospace" font-size="11">',
           f'<text x="10" y="20" font-size="13">{len(segs)} segments, '
           f'{sum(s["total_size"] for s in segs) / MiB:.2f} MiB reserved, '
           f'{sum(s["allocated_size"] for s in segs) / MiB:.2f} MiB allocated</text>']
    for k, s in enumerate(segs):
        y = top + k * row
        label = f'{s["segment_type"]}{"*" if s.get("is_expandable") else ""} {s["total_size"] / MiB:.1f}M'
        out.append(f'<text x="10" y="{y + 16}">{_esc(label)}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{s["total_size"] * scale:.2f}" height="{row - 8}" fill="none" stroke="#333"/>')
        for b in s["blocks"]:
            x = left + (b["address"] - s["address"]) * scale
            w = max(b["size"] * scale, 0.5)
            state = b["state"]
            title = f'{_LABELS.get(state, state)} {b["size"]} bytes at {b["address"]:#x} (requested {b["requested_size"]})'
            out.append(f'<rect class="{_esc(_LABELS.get(state, state))}" x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row - 8}" '
                       f'fill="{_COLOURS.get(state, "#999")}" stroke="#fff"><title>{_esc(title)}</title></rect>')
    ly = top + row * max(1, len(segs)) + 15
    for i, (state, colour) in enumerate(_COLOURS.items()):
        out.append(f'<rect x="{10 + i * 110}" y="{ly}" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{26 + i * 110}" y="{ly + 10}">{_LABELS[state]}</text>')
    out.append("</svg>")
    return "\n".join(out)
