"""Snapshots memspec exports open in PyTorch's own tools.

The readers below are re-implementations, written from the snapshot format as
``torch/cuda/_memory_viz.py`` (``segsum``, ``trace``) and the memory viewer
(``torch/utils/viz/MemoryViz.js``: annotate, the backward replay behind the
"Active Memory Timeline"/segment view, and the allocation timeline) read it --
not copies of them.  Each check is what makes the real reader fail, assert or
draw nonsense: a missing field, blocks that do not tile their segment, a
``free_requested`` for a block the replay does not hold, a block outside every
segment, an ``oom`` entry without ``device_free``.
"""

from __future__ import annotations

import io
import random

import pytest

from memspec.reference import caching_snapshot as cs
from memspec.reference.caching import CachingAllocator
from memspec.spec.errors import OutOfMemory

MiB = 1 << 20

ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom"}


def segsum_reader(snap: dict) -> tuple[int, int, int]:
    """What ``segsum`` computes: per segment, allocated (requested bytes of live blocks),
    internal free (rounding) and external free; their sum must be the segment's size."""
    reserved = allocated = internal = external = 0
    for seg in snap["segments"]:
        assert isinstance(seg["total_size"], int) and isinstance(seg["stream"], int) and "address" in seg
        reserved += seg["total_size"]
        s_alloc = s_int = s_ext = 0
        for b in seg["blocks"]:
            assert "frames" in b and isinstance(b["frames"], list)       # else the legacy 'history' path is taken
            if b["state"] == "active_allocated":
                assert 0 <= b["requested_size"] <= b["size"]
                s_alloc += b["requested_size"]
                s_int += b["size"] - b["requested_size"]
            else:
                s_ext += b["size"]
        assert s_alloc + s_int + s_ext == seg["total_size"], "blocks must tile their segment"
        allocated, internal, external = allocated + s_alloc, internal + s_int, external + s_ext
    assert allocated + internal + external == reserved
    return reserved, allocated, external


def trace_reader(snap: dict) -> list[str]:
    """What ``trace`` prints per entry (it reads addr/size, device_free for oom, and each
    segment's address and allocated_size to name the segment an allocation lands in)."""
    for seg in snap["segments"]:
        assert isinstance(seg["allocated_size"], int)
    out = []
    for d in snap["device_traces"]:
        for e in d:
            a = e["action"]
            assert a in ACTIONS, a
            if a == "oom":
                out.append(f"oom {e['size']} requested, {e['device_free']} free")
            elif a != "snapshot":
                out.append(f"{a} {e['addr']} {e['size']}")
    return out


def viewer_reader(snap: dict, device: int = 0) -> int:
    """The memory viewer: annotate (block addresses by walking each segment from its
    address; free_requested+free_completed pairs merge into 'free'), then replay the trace
    backwards from the final state, as the segment view does for its first event."""
    segs = [s for s in snap["segments"] if s["device"] == device]
    blocks = {}
    for s in segs:
        addr = s["address"]
        for b in s["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[addr] = {"addr": addr, "size": b["size"], "requested_size": b["requested_size"],
                                "free_requested": b["state"] == "active_pending_free"}
            addr += b["size"]
        assert addr == s["address"] + s["total_size"]
    events = []
    for t in snap["device_traces"][device]:
        assert isinstance(t.get("frames", []), list) and "stream" in t
        if t["action"] == "free_completed" and events and events[-1]["action"] == "free_requested" \
                and events[-1]["addr"] == t["addr"]:
            events[-1] = dict(events[-1], action="free")
            continue
        events.append(dict(t))
    live_segs = [{"addr": s["address"], "size": s["total_size"], "stream": s["stream"]} for s in segs]

    def containing(addr, size):
        return next((s for s in live_segs if s["addr"] <= addr and addr + size <= s["addr"] + s["size"]), None)

    for e in reversed(events):
        a = e["action"]
        if a in ("free", "free_completed"):
            blocks[e["addr"]] = {"addr": e["addr"], "size": e["size"], "requested_size": e["size"],
                                 "free_requested": a == "free_completed"}
        elif a == "free_requested":
            assert e["addr"] in blocks, f"free_requested of a block the replay does not hold: {e}"
            blocks[e["addr"]]["free_requested"] = False
        elif a == "alloc":
            blocks.pop(e["addr"], None)
        elif a == "segment_free":
            live_segs.append({"addr": e["addr"], "size": e["size"], "stream": e["stream"]})
        elif a == "segment_unmap":
            # the viewer maps the range back and merges it with touching ranges of the same stream
            seg = {"addr": e["addr"], "size": e["size"], "stream": e["stream"]}
            for o in [o for o in live_segs if o["stream"] == seg["stream"]
                      and (o["addr"] + o["size"] == seg["addr"] or seg["addr"] + seg["size"] == o["addr"])]:
                live_segs.remove(o)
                lo = min(o["addr"], seg["addr"])
                seg = {"addr": lo, "size": o["size"] + seg["size"], "stream": seg["stream"]}
            live_segs.append(seg)
        elif a == "segment_alloc":
            idx = next((i for i, s in enumerate(live_segs) if s["addr"] == e["addr"]), None)
            assert idx is not None, f"segment_alloc of a segment the replay does not hold: {e}"
            live_segs.pop(idx)
        elif a == "segment_map":
            s = containing(e["addr"], e["size"])
            assert s is not None, f"segment_map outside every segment: {e}"
            # cut the mapped range out of the segment holding it
            head = e["addr"] - s["addr"]
            tail = s["addr"] + s["size"] - (e["addr"] + e["size"])
            live_segs.remove(s)
            if head:
                live_segs.append({"addr": s["addr"], "size": head, "stream": s["stream"]})
            if tail:
                live_segs.append({"addr": e["addr"] + e["size"], "size": tail, "stream": s["stream"]})
        elif a == "oom":
            assert "device_free" in e and isinstance(e["device_free"], int)
        for b in blocks.values():
            assert containing(b["addr"], b["requested_size"]) is not None, f"block outside every segment after {e}"
    return len(events)


def _snapshot(preset: str, expandable: bool, seed: int) -> dict:
    a = CachingAllocator(preset=preset, capacity=64 * MiB, expandable_segments=expandable, record_history=True)
    rng = random.Random(seed)
    live = []
    ooms = 0
    for i in range(400):
        if live and rng.random() < 0.45:
            b = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.1:
                a.record_stream(b, 1)
            a.free(b)
        else:
            n = rng.choice([rng.randint(1, MiB), rng.randint(MiB + 1, 12 * MiB)])
            try:
                live.append(a.malloc(n, 0))
            except OutOfMemory:
                ooms += 1
        if rng.random() < 0.03:
            a.empty_cache()
    assert ooms, "the workload must hit an OOM so the oom entry is exercised"
    return a.snapshot()


@pytest.mark.parametrize("preset,expandable", [("pytorch", False), ("pytorch", True), ("seed", False), ("seed", True)])
@pytest.mark.parametrize("seed", [1, 2])
def test_export_reads_in_pytorch_tools(preset, expandable, seed):
    snap = _snapshot(preset, expandable, seed)
    buf = io.BytesIO()
    cs.dump(snap, buf)                        # what _dump_snapshot writes and the tools unpickle
    buf.seek(0)
    back = cs.load(buf)
    reserved, allocated, external = segsum_reader(back)
    assert reserved == sum(s["total_size"] for s in back["segments"])
    lines = trace_reader(back)
    assert any(l.startswith("oom ") for l in lines)
    assert viewer_reader(back) > 0


def test_oom_entries_carry_device_free():
    snap = _snapshot("pytorch", False, 3)
    ooms = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
    assert ooms and all(isinstance(e["device_free"], int) and e["device_free"] >= 0 for e in ooms)


def test_readers_catch_what_the_tools_would_choke_on():
    """The readers are checks that can fail: each broken field is caught."""
    snap = _snapshot("pytorch", False, 4)
    bad = {**snap, "device_traces": [[{k: v for k, v in e.items() if k != "device_free"} for e in snap["device_traces"][0]]]}
    with pytest.raises(KeyError):
        trace_reader(bad)
    seg0 = dict(snap["segments"][0], total_size=snap["segments"][0]["total_size"] + 512)
    with pytest.raises(AssertionError):
        segsum_reader({**snap, "segments": [seg0] + snap["segments"][1:]})
    first_free = next(i for i, e in enumerate(snap["device_traces"][0]) if e["action"] == "free_completed")
    dropped = [e for i, e in enumerate(snap["device_traces"][0]) if i != first_free]
    with pytest.raises(AssertionError):
        viewer_reader({**snap, "device_traces": [dropped]})


def test_a_pytorch_made_oom_entry_without_addr_is_read():
    """PyTorch's own snapshots carry the OOM's free bytes only as ``device_free``."""
    from memspec.triage import oom as lib

    snap = {"segments": [{"device": 0, "address": 1 << 30, "total_size": 20 * MiB, "allocated_size": 4 * MiB,
                          "active_size": 4 * MiB, "requested_size": 4 * MiB, "stream": 0, "segment_type": "large",
                          "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                          "blocks": [{"address": 1 << 30, "size": 4 * MiB, "requested_size": 4 * MiB,
                                      "state": "active_allocated", "frames": []},
                                     {"address": (1 << 30) + 4 * MiB, "size": 16 * MiB, "requested_size": 0,
                                      "state": "inactive", "frames": []}]}],
            "device_traces": [[{"action": "segment_alloc", "addr": 1 << 30, "size": 20 * MiB, "stream": 0,
                                "time_us": 1, "frames": []},
                               {"action": "alloc", "addr": 1 << 30, "size": 4 * MiB, "stream": 0,
                                "time_us": 2, "frames": []},
                               {"action": "oom", "device_free": 2 * MiB, "size": 40 * MiB, "stream": 0,
                                "time_us": 2, "frames": []}]],
            "allocator_settings": {}, "external_annotations": []}
    f = lib.figures_from_snapshot(snap)
    assert (f.requested, f.free, f.reserved, f.allocated) == (40 * MiB, 2 * MiB, 20 * MiB, 4 * MiB)
    assert cs.estimate_capacity(snap) == 22 * MiB
    segsum_reader(snap)
    trace_reader(snap)
    assert viewer_reader(snap) == 3
