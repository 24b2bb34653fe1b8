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

Import and replay: :func:`replay` runs a snapshot's trace through either
preset, with or without expandable segments, and answers seed 003's question
*would expandable segments have avoided this OOM?*  :func:`to_svg` draws the
segments and their blocks (live, free, pending).
"""

from __future__ import annotations

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


def load(f: BinaryIO | str) -> dict:
    """Read a pickled snapshot (ours or PyTorch's) and check its shape.

    Only load snapshots you trust: this is :mod:`pickle`."""
    try:
        if isinstance(f, str):
            with open(f, "rb") as fh:
                snap = pickle.load(fh)
        else:
            snap = pickle.load(f)
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError) as e:
        raise InvalidRequest(f"not a readable snapshot pickle: {type(e).__name__}: {e}") from e
    if not isinstance(snap, dict) or "segments" not in snap:
        raise InvalidRequest("not a memory snapshot: expected a dict with 'segments' (torch.cuda.memory._snapshot())")
    snap.setdefault("device_traces", [[]])
    snap.setdefault("allocator_settings", {})
    return snap


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
    prev = None
    for i, e in enumerate((snap.get("device_traces") or [[]])[0]):
        a = e.get("action")
        last, prev = prev, a
        auto = last in ("segment_free", "segment_unmap") or (a == "segment_unmap" and last == "free_completed"
                                                            and preset == "seed")
        if a in ("segment_free", "segment_unmap") and not auto:
            alloc.empty_cache()  # a release the program asked for (empty_cache, or an OOM retry)
        elif a == "alloc":
            res.allocs += 1
            try:
                live[e["addr"]] = alloc.malloc(int(e["size"]), int(e.get("stream", 0)))
            except OutOfMemory as err:
                res.ooms.append({"index": i, "size": int(e["size"]), "message": str(err), "error": err})
                skipped.add(e["addr"])
            res.peak_reserved = max(res.peak_reserved, alloc.memory_reserved())
        elif a == "free_requested":
            blk = live.pop(e["addr"], None)
            if blk is not None:
                res.frees += 1
                alloc.free(blk)
            elif e["addr"] in skipped:
                skipped.discard(e["addr"])
        elif a == "oom":
            # the request that failed (its rounded size): does it fail here too?
            res.original_ooms.append(i)
            try:
                blk = alloc.malloc(int(e["size"]), int(e.get("stream", 0)))
            except OutOfMemory as err:
                res.ooms.append({"index": i, "size": int(e["size"]), "message": str(err), "error": err})
            else:
                alloc.free(blk)  # the program got an exception, not a tensor
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


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


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
            out.append(f'<rect class="{_LABELS.get(state, state)}" x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row - 8}" '
                       f'fill="{_COLOURS.get(state, "#999")}" stroke="#fff"><title>{_esc(title)}</title></rect>')
    ly = top + row * max(1, len(segs)) + 15
    for i, (state, colour) in enumerate(_COLOURS.items()):
        out.append(f'<rect x="{10 + i * 110}" y="{ly}" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{26 + i * 110}" y="{ly + 10}">{_LABELS[state]}</text>')
    out.append("</svg>")
    return "\n".join(out)
