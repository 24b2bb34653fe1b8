"""The conformance engine on a toy spec machine and toy targets (tests/hostile_targets.py):
outcome matching and blame, observations, data integrity, hostile targets,
reproductions, the CLI and its reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from memspec.invariants import harness as H  # noqa: E402
from memspec.invariants import runner  # noqa: E402

TOY = "tests.hostile_targets:TOY"


def conform(target, **kw):
    kw.setdefault("examples", 40)
    kw.setdefault("steps", 25)
    kw.setdefault("out_dir", None)
    (res,) = runner.conform(f"tests.hostile_targets:{target}", "mechanism", machine=TOY, **kw)
    return res


def status(res):
    return {inv: st for inv, _t, st, _d in res.rows()}


def test_healthy_toy_passes_and_absent_capability_is_na():
    res = conform("toy")
    assert res.ok, (res.errors, [(f.invariant, f.reason) for f in res.failures])
    # T3 has no action and no observation at this level: "\u2014" (not part of it), never PASS
    assert status(res) == {"T1": "PASS", "T2": "PASS", "T3": "\u2014", "T4": "N/A", "T5": "PASS"}
    assert "virtual_backing" in dict((r[0], r[3]) for r in res.rows())["T4"]
    assert res.stats.steps >= 40 * 10 and len(res.stats.actions) == 4


@pytest.mark.parametrize("target, invariant, cause", [
    ("toy_overlap", "T3", "data"),                 # bookkeeping right, bytes shared: only the pattern check sees it
    ("toy_no_map", "T1", "data"),                  # success without backing: the write faults
    ("toy_double_free_ok", "T2", "outcome"),       # a permitted return type where only errors are permitted
    ("toy_leak_ledger", "T1", "observation"),      # the implementation's own figure disagrees with the spec
])
def test_planted_toy_bugs_are_caught_by_the_right_invariant(target, invariant, cause):
    res = conform(target)
    assert [(f.invariant, f.cause) for f in res.failures] == [(invariant, cause)]
    f = res.failures[0]
    assert 1 <= f.shrunk_length <= 6 and f.steps_to_detection is not None
    assert status(res)[invariant] == "FAIL" and not res.errors


@pytest.mark.parametrize("target, cause, words", [
    ("toy_raises", "unexpected-exception", "KeyError"),
    ("toy_wrong_type", "wrong-type", "builtins.str"),
    ("toy_exits", "unexpected-exception", "SystemExit"),
    ("toy_hangs", "hang", "did not return"),
    ("toy_hangs_busy", "hang", "did not return"),
])
def test_hostile_targets_fail_by_name_and_never_crash_the_harness(target, cause, words):
    # A short call timeout only where the target hangs; the others never hang, so a
    # generous one: a healthy call slowed by a loaded machine must not be called a hang.
    res = conform(target, timeout=0.2 if cause == "hang" else 60, examples=10, steps=10)
    assert res.failures, res.errors
    assert {f.cause for f in res.failures} == {cause}
    assert all(words in f.reason for f in res.failures)
    assert not res.errors


def test_a_factory_that_raises_is_an_error_row_not_a_crash():
    res = conform("toy_factory_raises")
    assert res.errors and "hostile factory" in res.errors[0] and not res.ok


def test_reproduction_file_fails_the_same_way_on_its_own(tmp_path):
    res = conform("toy_overlap", out_dir=str(tmp_path))
    path = res.failures[0].repro
    assert path and os.path.exists(path)
    p = subprocess.run([sys.executable, path], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "Violation_T3" in p.stderr and "reproduced: FAIL T3" in p.stdout
    # the same steps on the healthy toy do not fail
    text = Path(path).read_text().replace("toy_overlap'", "toy'")
    fixed = tmp_path / "fixed.py"
    fixed.write_text(text)
    p2 = subprocess.run([sys.executable, str(fixed)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p2.returncode == 0 and "did not reproduce" in p2.stdout


def test_violation_classes_are_per_invariant():
    assert H.violation_class("S5") is H.violation_class("S5")
    assert H.violation_class("S5") is not H.violation_class("S4")
    assert issubclass(H.violation_class("S5"), AssertionError)


def test_call_guard_reports_hang_in_thread_mode_too():
    import threading

    g = H.CallGuard(0.1, mode="thread")
    # a call that cannot finish (not a slow one: a 5 s sleep would end on its own): released below
    never = threading.Event()
    try:
        v, err = g.call(never.wait)
    finally:
        never.set()
    assert isinstance(err, H._HangResult)
    # the hang shortened the guard's timeout (to 0.05 s) for shrinking: the healthy calls that
    # follow get a generous one, so a loaded machine cannot turn them into hangs
    g.timeout = 60
    assert g.call(lambda: 7) == (7, None)
    _, err = g.call(lambda: {}["x"])
    assert isinstance(err, KeyError)


def test_cli_exit_status_json_and_junit(tmp_path):
    js, ju = tmp_path / "r.json", tmp_path / "r.xml"
    cmd = [sys.executable, "-m", "memspec", "conform", "tests.hostile_targets:toy", "tests.hostile_targets:toy_overlap",
           "--machine", TOY, "--level", "mechanism", "--examples", "20", "--steps", "20", "--quiet",
           "--json", str(js), "--junit", str(ju), "--out", str(tmp_path / "repro")]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "steps run:" in p.stdout and "steps/s" in p.stdout and "FAIL" in p.stdout
    data = json.loads(js.read_text())
    by = {t["target"]: t for t in data["targets"]}
    assert by["tests.hostile_targets:toy"]["ok"] and not by["tests.hostile_targets:toy_overlap"]["ok"]
    fails = by["tests.hostile_targets:toy_overlap"]["levels"][0]["failures"]
    assert fails[0]["invariant"] == "T3" and os.path.exists(fails[0]["repro"])
    root = ET.parse(ju).getroot()
    # one FAIL; the rows the failing run stopped short of exercising are UNTESTED (typed failures), not PASS
    assert len([f for f in root.findall(".//failure") if f.get("type") != "untested"]) == 1
    assert len(root.findall(".//skipped")) == 2
    ok = subprocess.run(cmd[:5] + ["--machine", TOY, "--level", "mechanism", "--examples", "10", "--quiet"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_a_stub_capability_object_fails_the_machines_start_check():
    res = conform("toy_stub_capability", examples=5, steps=5)
    assert [(f.invariant, f.cause) for f in res.failures] == [("T5", "capability")]
    assert "lacks" in res.failures[0].reason and "commit_range" in res.failures[0].reason
