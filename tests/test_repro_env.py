"""A reproduction carries the environment its target needs at process start
(a zoo allocator loaded with dlopen may need a glibc tunable), and only
allocator and glibc tunables: never a loader variable."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from memspec.invariants import repro
from memspec.invariants.results import Failure


def _plan(env: dict) -> SimpleNamespace:
    return SimpleNamespace(target="tests.env_probe_target:make", level="mechanism", factory_kwargs={}, timeout=5.0,
                           machine_ref=None, env=env, titles=lambda: {})


def test_the_reproduction_sets_the_declared_tunables_and_nothing_else(tmp_path):
    env = {"MEMSPEC_PROBE_FLAG": "on", "GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=4096",
           "LD_PRELOAD": "/tmp/evil.so", "PYTHONPATH": "/tmp"}
    f = Failure("t", "mechanism", "S8", "outcome", "why", [], 1)
    src = repro.render(f, _plan(env))
    assert "MEMSPEC_PROBE_FLAG" in src and "GLIBC_TUNABLES" in src
    assert "LD_PRELOAD" not in src and "PYTHONPATH" not in src
    # the prelude re-executes with the environment: run just the lines before the replay
    head = src.split("sys.path.insert(0, os.getcwd())")[0] + \
        "\nprint(os.environ.get('MEMSPEC_PROBE_FLAG'), os.environ.get('MEMSPEC_REPRO_REEXEC'))\n"
    p = tmp_path / "prelude.py"
    p.write_text(head)
    out = subprocess.run([sys.executable, str(p)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["on", "1"], out.stdout


def test_no_environment_no_reexec(tmp_path):
    src = repro.render(Failure("t", "mechanism", "S8", "outcome", "why", [], 1), _plan({}))
    assert "ENV = {}" in src
