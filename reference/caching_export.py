"""The caching allocator's own view as a ``torch.cuda.memory._snapshot()`` dict.

:meth:`memspec.reference.caching.CachingAllocator.snapshot` calls
:func:`export_snapshot`; loading, replaying and drawing snapshots is
:mod:`memspec.reference.caching_snapshot`'s (which depends on the allocator,
so the export lives here: no import cycle between the two).
"""

from __future__ import annotations

from typing import Any

from memspec.spec.api import MiB


def export_snapshot(alloc: Any) -> dict:
    """``torch.cuda.memory._snapshot()`` of a :class:`~memspec.reference.caching.CachingAllocator`."""
    segments = []
    for seg in alloc.segments():
        runs: list[list[dict]] = []
        cur: list[dict] = []
        for b in seg["blocks"]:
            if b["state"] == "unmapped":
                if cur:
                    runs.append(cur)
                cur = []
            else:
                cur.append(b)
        if cur:
            runs.append(cur)
        for run in runs:
            blocks = [{"address": b["address"], "size": b["size"], "requested_size": b["requested_size"],
                       "state": b["state"], "frames": []} for b in run]
            segments.append({
                "device": alloc.device_index,
                "address": run[0]["address"],
                "total_size": sum(b["size"] for b in run),
                "allocated_size": sum(b["size"] for b in run if b["state"] == "active_allocated"),
                "active_size": sum(b["size"] for b in run if b["state"] != "inactive"),
                "requested_size": sum(b["requested_size"] for b in run if b["state"] != "inactive"),
                "stream": seg["stream"],
                "segment_type": seg["segment_type"],
                "segment_pool_id": (0, 0),
                "is_expandable": seg["is_expandable"],
                "frames": [],
                "blocks": blocks,
            })
    segments.sort(key=lambda s: s["address"])
    trace = []
    for (a, addr, size, stream, t) in alloc.trace_entries():
        e = {"action": a, "addr": addr, "size": size, "stream": stream, "time_us": t, "frames": []}
        if a == "oom":
            # PyTorch records the device's free bytes of an OOM as ``device_free``
            # (torch/cuda/_memory_viz.py ``trace`` and MemoryViz.js read it); ``addr``
            # carries the same figure for memspec's older readers.
            e["device_free"] = addr
        trace.append(e)
    ms = alloc.stats.max_split_size
    conf = [f"expandable_segments:{'True' if alloc.expandable else 'False'}"]
    if ms != -1:
        conf.append(f"max_split_size_mb:{ms // MiB}")
    return {
        "segments": segments,
        "device_traces": [trace],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": ",".join(conf),
            "max_split_size": ms,
            "garbage_collection_threshold": alloc.gc_threshold,
            "expandable_segments": alloc.expandable,
            "roundup_power2_divisions": list(alloc._divisions or ()),
            # memspec's own keys (PyTorch's viewer ignores unknown keys)
            "memspec_preset": alloc.preset,
            "memspec_capacity": alloc.capacity,
        },
        "external_annotations": [],
    }
