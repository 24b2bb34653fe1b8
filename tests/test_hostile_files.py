"""Hostile files: snapshots and generated reproductions run nothing.

A snapshot is what people receive in bug reports and CI artifacts; a
reproduction is what a maintainer runs after a target failed.  Neither may
execute text that came from outside: a crafted snapshot pickle and a crafted
error message must leave the marker file uncreated, end in a named error
(SnapshotError, an InvalidRequest) or as inert data, exit != 0 where a
command reads them.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from memspec.commands import snapshot as snapshot_cmd
from memspec.invariants import repro
from memspec.invariants.harness import TraceStep
from memspec.reference import caching_snapshot as cs
from memspec.reference.caching import CachingAllocator
from memspec.spec.errors import InvalidRequest

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


class _Evil:
    """Unpickling this calls os.system: it creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_pickle(marker: Path) -> bytes:
    return pickle.dumps({"segments": [], "device_traces": [[]], "x": _Evil(marker)})


def test_crafted_snapshot_pickle_runs_nothing_load(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(cs.SnapshotError, match="posix.system|os.system|only plain data"):
        cs.load(io.BytesIO(_evil_pickle(marker)))
    assert not marker.exists()
    assert issubclass(cs.SnapshotError, InvalidRequest)


@pytest.mark.parametrize("cmd", [["snapshot"], ["oom", "explain", "--snapshot"]])
def test_crafted_snapshot_pickle_runs_nothing_cli(tmp_path, cmd):
    marker = tmp_path / "pwned"
    f = tmp_path / "snap.pickle"
    f.write_bytes(_evil_pickle(marker))
    p = subprocess.run([sys.executable, "-m", "memspec", *cmd, str(f)], capture_output=True, text=True, timeout=60)
    assert not marker.exists()
    assert p.returncode != 0
    assert "only plain data" in p.stderr and "Traceback" not in p.stderr


def test_plain_pickle_of_a_global_reference_is_refused():
    # not even a harmless global (a class reference) is looked up
    data = pickle.dumps({"segments": [], "cls": int})
    with pytest.raises(cs.SnapshotError, match="builtins.int"):
        cs.load(io.BytesIO(data))


def test_own_and_json_snapshots_still_load(tmp_path):
    a = CachingAllocator(preset="pytorch", capacity=64 * MiB, record_history=True)
    x = a.malloc(3 * MiB)
    a.free(x)
    snap = a.snapshot()
    buf = io.BytesIO()
    cs.dump(snap, buf)
    buf.seek(0)
    assert cs.load(buf) == snap
    j = tmp_path / "snap.json"
    j.write_text(json.dumps(snap))
    back = cs.load(str(j))
    assert back["segments"][0]["total_size"] == snap["segments"][0]["total_size"]


def test_pytorch_oom_entries_with_device_free_load():
    snap = {"segments": [], "device_traces": [[{"action": "oom", "device_free": 3 * MiB, "size": 8 * MiB,
                                                 "stream": 0, "time_us": 1, "frames": []},
                                                {"action": "user_defined", "frames": []}]]}
    back = cs.load(io.BytesIO(pickle.dumps(snap)))
    assert back["device_traces"][0][0]["device_free"] == 3 * MiB


def _seg(**over):
    seg = {"device": 0, "address": 0, "total_size": 2 * MiB, "allocated_size": 0, "active_size": 0,
           "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
           "is_expandable": False, "frames": [],
           "blocks": [{"address": 0, "size": 2 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]}
    seg.update(over)
    return seg


@pytest.mark.parametrize("snap,field", [
    ({"segments": "abc"}, "'segments'"),
    ({"segments": [_seg(address="0x10")]}, "'address'"),
    ({"segments": [_seg(total_size=True)]}, "'total_size'"),
    ({"segments": [_seg(total_size=-1)]}, "negative"),
    ({"segments": [_seg(blocks=[{"size": 1}])]}, "'state'"),
    ({"segments": [_seg(blocks=[{"size": "big", "state": "inactive"}])]}, "'size'"),
    ({"segments": [_seg(is_expandable="yes")]}, "'is_expandable'"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 0}]]}, "'addr' and 'size'"),
    ({"segments": [], "device_traces": [[{"action": ["alloc"], "addr": 0, "size": 1}]]}, "'action'"),
    ({"segments": [], "device_traces": [[{"action": "oom", "device_free": "lots", "size": 1}]]}, "'device_free'"),
    ({"segments": [], "device_traces": [[{"action": "oom", "device_free": 5}]]}, "'size'"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 0, "size": 1.5}]]}, "'size'"),
    ({"segments": [], "device_traces": {"a": 1}}, "device_traces"),
    ({"segments": [], "allocator_settings": {"memspec_capacity": "10"}}, "memspec_capacity"),
    ({"segments": [], "allocator_settings": {"memspec_preset": "evil"}}, "memspec_preset"),
    ({"segments": [_seg(address=1 << 80)]}, "'address'"),
    ([1, 2], "not a memory snapshot"),
    # a layout no allocator makes: blocks outside their segment, overlapping blocks or segments
    ({"segments": [_seg(blocks=[{"address": 0, "size": 3 * MiB, "state": "active_allocated"}])]}, "lies outside"),
    ({"segments": [_seg(blocks=[{"size": 1 * MiB, "state": "active_allocated"}] * 3)]}, "segments[0].blocks["),
    ({"segments": [_seg(blocks=[{"size": 2 * MiB, "state": "active_allocated"},
                                {"size": 1 * MiB, "state": "inactive"}])]}, "lies outside"),
    ({"segments": [_seg(blocks=[{"address": 0, "size": MiB, "state": "inactive"},
                                {"address": MiB // 2, "size": MiB, "state": "inactive"}])]}, "overlaps"),
    ({"segments": [_seg(), _seg(address=MiB, blocks=[{"address": MiB, "size": 2 * MiB, "state": "inactive"}])]},
     "segments[1]: overlaps segments[0]"),
])
def test_malformed_snapshot_fields_are_named(tmp_path, snap, field):
    f = tmp_path / "bad.pickle"
    f.write_bytes(pickle.dumps(snap))
    with pytest.raises(cs.SnapshotError) as ei:
        cs.load(str(f))
    assert field in str(ei.value)
    p = subprocess.run([sys.executable, "-m", "memspec", "snapshot", str(f), "--replay"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "cannot read" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_segments_of_other_devices_may_share_addresses_and_blocks_may_leave_gaps():
    """Not every odd layout is refused: one address on two devices, and a segment whose blocks
    do not cover it all (a snapshot may leave blocks out), load."""
    gap = _seg(blocks=[{"address": MiB, "size": MiB, "state": "active_allocated", "frames": []}])
    snap = {"segments": [_seg(device=0), _seg(device=1), dict(gap, address=4 * MiB,
                         blocks=[dict(gap["blocks"][0], address=5 * MiB)])]}
    assert cs.check_snapshot(snap) is snap


@pytest.mark.parametrize("blob", [b"\x00\x01\x02garbage\xff", b"", b"{not json", b"\x80\x05K\x01.", b"(" * 100000])
def test_binary_or_truncated_snapshot_is_a_named_error(tmp_path, blob):
    f = tmp_path / "bad.bin"
    f.write_bytes(blob)
    with pytest.raises(cs.SnapshotError):
        cs.load(str(f))
    assert snapshot_cmd.main([str(f)]) == 2


def test_snapshot_svg_escapes_block_strings(tmp_path):
    evil = '<script>alert(1)</script>"'
    snap = {"segments": [_seg(segment_type=evil, blocks=[
        {"address": 0, "size": 2 * MiB, "requested_size": 0, "state": evil, "frames": []}])]}
    f = tmp_path / "snap.pickle"
    f.write_bytes(pickle.dumps(snap))
    svg = tmp_path / "out.svg"
    assert snapshot_cmd.main([str(f), "--svg", str(svg)]) == 0
    text = svg.read_text()
    assert "<script" not in text and "&lt;script&gt;" in text
    import xml.etree.ElementTree as ET

    ET.fromstring(text)  # well-formed: no attribute broken out of


def test_snapshot_strings_reach_the_terminal_escaped(tmp_path, capsys):
    snap = {"segments": [_seg(segment_type="\x1b]0;owned\x07", blocks=[
        {"address": 0, "size": 2 * MiB, "requested_size": 0, "state": "\x1b[2J", "frames": []}])]}
    f = tmp_path / "snap.pickle"
    f.write_bytes(pickle.dumps(snap))
    assert snapshot_cmd.main([str(f)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b" in out


def test_unwritable_snapshot_outputs_fail_before_anything_runs(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for flag in ("--out", "--svg"):
        with pytest.raises(SystemExit) as ei:
            snapshot_cmd.main([flag, str(blocker / "sub" / "x")])
        assert ei.value.code == 2
        err = capsys.readouterr()
        assert "not writable" in err.err and "segments" not in err.out  # refused before the demo ran


# --------------------------------------------------------------------------
# reproductions
# --------------------------------------------------------------------------

HOSTILE_TEXTS = [
    "boom\rimport os; os.system('touch {m}')",
    "boom\x0cimport os; os.system('touch {m}')",
    "boom\u2028import os; os.system('touch {m}')",
    "boom\u2029import os; os.system('touch {m}')",
    "boom\x85import os; os.system('touch {m}')",
    "boom\x0bimport os; os.system('touch {m}')",
    'boom"""\nimport os; os.system(\'touch {m}\')\n"""',
    "boom\\\nimport os; os.system('touch {m}')",
    "boom\n__import__('os').system('touch {m}')",
]


class _NastyRepr:
    """A 'literal' whose repr changes after the first call (to code)."""

    calls = 0

    def __init__(self, marker):
        self.marker = marker

    def __repr__(self):
        _NastyRepr.calls += 1
        return "1" if _NastyRepr.calls == 1 else f"__import__('os').system('touch {self.marker}')"

    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


@pytest.mark.parametrize("text", HOSTILE_TEXTS)
def test_generated_repro_runs_no_target_text(tmp_path, text):
    marker = tmp_path / "pwned"
    t = text.format(m=marker)
    _NastyRepr.calls = 0
    trace = [TraceStep("step\r" + t, {"size": _NastyRepr(marker)}, [1, 2], t, (1,))]
    failure = SimpleNamespace(invariant="S1" + t, cause="outcome" + t, reason=t, trace=trace)
    plan = SimpleNamespace(target="reference", level="mechanism", factory_kwargs={"capacity": None}, timeout=5.0,
                           machine_ref=None, titles=lambda: {}, env={})
    src = repro.render(failure, plan, target_name="reference")
    code = compile(src, "repro.py", "exec")  # a valid module
    assert code is not None
    path = tmp_path / "repro.py"
    path.write_text(src)
    # only the module's constants run; replay_main is not called (not __main__)
    ns: dict = {"__name__": "repro_under_test"}
    exec(compile(src, str(path), "exec"), ns)  # noqa: S102 - the generated file, under test
    assert not marker.exists()
    assert ns["REASON"] == t and ns["OUTCOMES"][0].startswith(t)
    assert ns["STEPS"][0][1] is None or ns["STEPS"][0][1] == {"size": 1}
    assert ns["TARGET"] == "reference"


def test_generated_repro_file_runs_standalone_without_executing_text(tmp_path):
    marker = tmp_path / "pwned"
    t = f"bad\rimport os; os.system('touch {marker}')"
    failure = SimpleNamespace(invariant="S1", cause="outcome", reason=t, trace=[])
    plan = SimpleNamespace(target="reference", level="mechanism", factory_kwargs={"capacity": None}, timeout=5.0,
                           machine_ref=None, titles=lambda: {"S1": t}, env={})
    path = tmp_path / "r.py"
    path.write_text(repro.render(failure, plan))
    p = subprocess.run([sys.executable, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert not marker.exists()
    assert p.returncode == 0 and "did not reproduce" in p.stdout, p.stdout + p.stderr
