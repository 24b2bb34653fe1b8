"""A walk-mode ``memspec fuzz --quiet`` kill imports only what it uses (issue 35).

Most of a quick kill's CPU outside the shrink is the interpreter's start and
its imports, paid again by every ``memspec fuzz`` command.  The command runs
here under ``python -X importtime`` (which reports the imports of the forked
worker too, on the same stderr) and must not have imported the solvers
(z3, CrossHair: ``memspec prove`` / ``contracts`` only), the HTML report and
its pictures (``--html`` only), the proof and agreement modules, or the live
display (``rich.live``: not with ``--quiet``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

#: module name prefixes a quiet walk-mode kill must not import
UNUSED = ("z3", "crosshair", "hypothesis_crosshair_provider", "rich.live", "memspec.invariants.html_report",
          "memspec.invariants.pictures", "memspec.invariants.formal.proofs", "memspec.invariants.formal.agreement",
          "memspec.invariants.formal.z3native")


def test_quiet_walk_kill_imports_no_solver_report_or_live_display(tmp_path):
    out = tmp_path / "fuzz.json"
    p = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "memspec", "fuzz", "mutant:foreign-free", "--mode", "walk",
         "--jobs", "1", "--until-failure", "--seconds", "60", "--capacity", str(16 << 20), "--quiet",
         "--json", str(out), "--out", str(tmp_path / "repro"), "--db", str(tmp_path / "db")],
        capture_output=True, text=True, cwd=tmp_path, timeout=600)
    doc = json.loads(out.read_text())
    assert [f["invariant"] for f in doc["failures"]] == ["S1"], p.stderr[-2000:]   # the kill itself happened
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$", p.stderr, re.M))
    assert "memspec.invariants.walk" in imported and "memspec.invariants.engine" in imported   # the probe works
    bad = sorted(m for m in imported if any(m == u or m.startswith(u + ".") for u in UNUSED))
    assert bad == []
