"""Snapshots (torch.cuda.memory._snapshot() form), replay, SVG.  (``memspec oom explain``: tests/test_oom*.py.)"""

from __future__ import annotations

import io
import pickle

import pytest

from memspec.commands import oom, snapshot as snapshot_cmd
from memspec.reference import caching_snapshot as cs
from memspec.reference.caching import CachingAllocator
from memspec.spec.errors import InvalidRequest, OutOfMemory

MiB = 1 << 20


def _workload(a: CachingAllocator) -> None:
    import random

    rng = random.Random(7)
    live = []
    for _ in range(300):
        if live and rng.random() < 0.4:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            n = rng.choice([rng.randint(1, MiB), rng.randint(MiB + 1, 9 * MiB)])
            try:
                live.append(a.malloc(n, rng.randint(0, 1)))
            except OutOfMemory:
                pass
        if rng.random() < 0.05:
            a.empty_cache()


def _layout(snap: dict) -> list:
    return [(s["address"], s["total_size"], s["segment_type"], s["is_expandable"],
             [(b["address"], b["size"], b["requested_size"], b["state"]) for b in s["blocks"]])
            for s in snap["segments"]]


@pytest.mark.parametrize("preset,expandable", [("pytorch", False), ("seed", False), ("pytorch", True), ("seed", True)])
def test_round_trip_export_import_replay(preset, expandable):
    a = CachingAllocator(preset=preset, capacity=96 * MiB, expandable_segments=expandable, record_history=True)
    _workload(a)
    snap = a.snapshot()
    buf = io.BytesIO()
    cs.dump(snap, buf)
    buf.seek(0)
    back = cs.load(buf)
    assert back == snap
    res = cs.replay(back)
    assert (res.preset, res.expandable, res.capacity) == (preset, expandable, 96 * MiB)
    assert _layout(res.allocator.snapshot()) == _layout(snap)  # same segments and blocks
    assert res.allocator.memory_reserved() == a.memory_reserved()


def test_snapshot_shape_matches_pytorch():
    a = CachingAllocator(preset="pytorch", capacity=64 * MiB, record_history=True)
    x = a.malloc(3 * MiB + 1)
    y = a.malloc(1000, 1)
    a.record_stream(y, 2)
    a.free(y)
    snap = a.snapshot()
    assert set(snap) == {"segments", "device_traces", "allocator_settings", "external_annotations"}
    seg = snap["segments"][0]
    assert {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
            "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"} <= set(seg)
    assert set(seg["blocks"][0]) == {"address", "size", "requested_size", "state", "frames"}
    states = {b["state"] for s in snap["segments"] for b in s["blocks"]}
    assert states == {"active_allocated", "active_pending_free", "inactive"}
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert actions == ["segment_alloc", "alloc", "segment_alloc", "alloc", "free_requested"]
    assert snap["device_traces"][0][1]["size"] == 3 * MiB + 1 and x.address == snap["device_traces"][0][1]["addr"]
    e = CachingAllocator(preset="pytorch", capacity=64 * MiB, expandable_segments=True, record_history=True)
    blk = e.malloc(4 * MiB)
    e.free(blk)
    e.empty_cache()
    assert [t["action"] for t in e.snapshot()["device_traces"][0]] == [
        "segment_map", "alloc", "free_requested", "free_completed", "segment_unmap"]


def test_replay_answers_the_expandable_question():
    a = snapshot_cmd.fragmented_demo("seed")
    snap = a.snapshot()
    assert [e["action"] for e in snap["device_traces"][0]][-1] == "oom"
    avoided, fixed, exp = cs.would_expandable_avoid_oom(snap)
    assert avoided and len(fixed.ooms) == 1 and not exp.ooms
    avoided, fixed, exp = cs.would_expandable_avoid_oom(snap, preset="pytorch")
    assert not avoided and len(exp.ooms) == 1  # PyTorch's 20 MiB pages stay pinned by live blocks


def test_capacity_estimated_from_a_foreign_trace():
    snap = snapshot_cmd.fragmented_demo("seed").snapshot()
    del snap["allocator_settings"]["memspec_capacity"]
    assert cs.estimate_capacity(snap) == 40 * MiB  # reserved at the OOM + the free bytes it records


def test_svg_draws_live_free_and_pending(tmp_path):
    a = CachingAllocator(preset="pytorch", capacity=64 * MiB)
    a.malloc(MiB // 2)
    y = a.malloc(MiB // 2)
    a.record_stream(y, 1)
    a.free(y)
    svg = cs.to_svg(a.snapshot())
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    for cls in ("live", "free", "pending"):
        assert f'class="{cls}"' in svg
    out = tmp_path / "s.svg"
    p = tmp_path / "s.pickle"
    assert snapshot_cmd.main(["--out", str(p), "--svg", str(out)]) == 0
    assert out.read_text().count("<rect") >= 8 and pickle.loads(p.read_bytes())["segments"]


def test_load_refuses_what_is_not_a_snapshot(tmp_path):
    p = tmp_path / "x.pickle"
    p.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(InvalidRequest):
        cs.load(str(p))
    assert snapshot_cmd.main([str(p)]) == 2
    p.write_bytes(b"not a pickle at all")
    with pytest.raises(InvalidRequest):
        cs.load(str(p))
    assert oom.main(["explain", "--snapshot", str(p)]) == 2


def _full_trace_checks_accept(e) -> bool:
    """The per-entry checks of check_snapshot without the fast path."""
    try:
        cs._check_fields(e, "e", cs._TRACE_REQUIRED, cs._TRACE_OPTIONAL)
    except cs.SnapshotError:
        return False
    need = cs._TRACE_NEEDS.get(e["action"], ())
    return all(f in e for f in need) and e.get("size", 0) >= 0 and e.get("device_free", 0) >= 0


def test_fast_trace_check_accepts_only_what_the_full_checks_accept():
    good = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 12, "frames": []}
    variants = [good, dict(good, time_us=1.5), {"action": "oom", "size": 1, "device_free": 7},
                {"action": "snapshot"}, dict(good, extra=object())]
    bad = [dict(good, size=True), dict(good, addr=1 << 64), dict(good, size=-1), dict(good, time_us=float("nan")),
           dict(good, time_us=float("inf")), dict(good, stream="0"), dict(good, frames={}), dict(good, action=1),
           {"addr": 1, "size": 1}, {"action": "alloc", "size": 1}, {"action": "oom", "size": 1, "device_free": -1},
           dict(good, size=None), dict(good, size=2.0), [("action", "alloc")], "alloc"]
    for e in variants:
        assert cs._trace_entry_plain(e) and _full_trace_checks_accept(e), e
    for e in bad:
        assert not cs._trace_entry_plain(e), e
        if isinstance(e, dict) and "action" in e:
            assert not _full_trace_checks_accept(e), e

    class S(str):
        pass

    odd = dict(good, action=S("alloc"))  # a str subclass: the fast path declines, the full checks decide
    assert not cs._trace_entry_plain(odd) and _full_trace_checks_accept(odd)
    snap = {"segments": [], "device_traces": [[good, odd]]}
    assert cs.check_snapshot(snap) is snap
    with pytest.raises(cs.SnapshotError, match=r"device_traces\[0\]\[1\].*'size'"):
        cs.check_snapshot({"segments": [], "device_traces": [[good, dict(good, size=True)]]})
