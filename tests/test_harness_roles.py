"""A system-level target brings its own roles through the public target
contract (``TargetInstance.roles``); the reference fills the rest.  A broken
Governor written in a package of its own is caught and blamed on the rule it
breaks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BROKEN_GOVERNOR = textwrap.dedent('''
    """A user's allocator project with its own Governor: ``cancel`` forgets
    to put the grant's bytes back into ``free`` (the ledger loses them)."""
    from memspec.reference.governor import ReferenceGovernor
    from memspec.reference.targets import reference
    from memspec.spec.api import SystemRoles


    class LeakyGovernor(ReferenceGovernor):
        def cancel(self, grant):
            with self._lock:
                g = self._take_grant(grant)
                del self._grants[g.grant_id]
                self._granted -= g.nbytes          # ... and never ``self._free += g.nbytes``
                return g.nbytes


    def target(capacity=None):
        inst = reference(capacity)
        inst.roles = SystemRoles(governor=LeakyGovernor)
        return inst


    def healthy(capacity=None):
        inst = reference(capacity)
        inst.roles = SystemRoles(governor=ReferenceGovernor)
        return inst
''')


def _conform(tmp_path, attr, *extra):
    pkg = tmp_path / "my_allocator_project"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "governor_target.py").write_text(BROKEN_GOVERNOR)
    js = tmp_path / f"{attr}.json"
    cmd = [sys.executable, "-m", "memspec", "conform", f"my_allocator_project.governor_target:{attr}",
           "--level", "system", "--examples", "100", "--steps", "40", "--capacity", str(16 << 20), "--quiet",
           "--json", str(js), "--out", str(tmp_path / "repro"), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    return p, json.loads(js.read_text())["targets"][0]


def test_a_broken_governor_brought_by_the_target_is_blamed_on_the_ledger_rule(tmp_path):
    p, t = _conform(tmp_path, "target", "--until", "S11")
    assert p.returncode == 1, p.stdout + p.stderr
    level = t["levels"][0]
    assert level["level"] == "system" and not level["errors"]
    assert "S11" in {f["invariant"] for f in level["failures"]}, level["failures"]
    s11 = next(f for f in level["failures"] if f["invariant"] == "S11")
    assert s11["trace"] and os.path.exists(s11["repro"])


def test_the_same_package_with_the_reference_governor_passes(tmp_path):
    # a 16 MiB device at 100 x 40 steps may leave a deep protocol UNTESTED (not a pass, not a failure)
    p, t = _conform(tmp_path, "healthy", "--allow-untested")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert t["ok"]


def test_roles_the_target_brings_replace_the_references_and_only_those():
    from docs.examples.system_target import AuditedGovernor, target
    from memspec.reference.manager import ReferenceManager
    from memspec.reference.system import build_system

    system = build_system(target(16 << 20))
    assert isinstance(system.governor, AuditedGovernor)
    assert isinstance(system.manager, ReferenceManager)      # filled by the reference
    system.weights.load("w0", 1 << 20, hot=False)
    assert [a for a, _h, _n in system.governor.audit] == ["grant", "charge"]
