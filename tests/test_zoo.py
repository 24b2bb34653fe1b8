"""The zoo (issue 31): real third-party allocators through the C ABI, each
run through the suite at a small budget, and every registered target
(entry points of ``memspec.targets``) resolved, built and run a few steps --
so an adapter is tested the day it is registered.

Each run is a child process (``python -m memspec conform``): an allocator
loaded into a process stays there, and jemalloc needs an environment the
process must start with (``zoo.required_env``).  A library that is not
installed skips with the package to install; one that is installed but does
not load fails."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import pytest

from memspec.adapters import zoo

#: (level, invariant) cells that FAIL by a real defect of the library (docs/FINDINGS.md), per allocator.
#: A run may or may not reach a known defect at this budget; any other FAIL is a false one.
KNOWN_DEFECTS: dict[str, set[tuple[str, str]]] = {name: set() for name in zoo.ZOO}
# Z1: mimalloc 2.0.9 mi_heap_malloc_aligned returns misaligned pointers for size == k * alignment, alignment 256..1024
# (upstream microsoft/mimalloc#700; docs/findings/mimalloc_aligned_in_arena_heap.c)
KNOWN_DEFECTS["mimalloc"] = {("mechanism", "S8")}


@pytest.fixture(scope="session")
def zoo_env(tmp_path_factory):
    """The environment of the child runs: a cache for the shims of this session."""
    if zoo.compiler() is None:
        pytest.skip("no C compiler (cc/gcc) on this machine: the zoo's shims cannot be built")
    return {**os.environ, "MEMSPEC_ZOO_CACHE": str(tmp_path_factory.mktemp("zoo-cache")), "COLUMNS": "200"}


def _probe(name: str, env: dict) -> None:
    """Skip when the library is not installed; fail when it is and does not load."""
    code = f"from memspec.adapters import zoo; print(*zoo.preflight({name!r}))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**env, **zoo.required_env(name)})
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or ["?"])[-1]
        if "install the Debian package" in why:
            pytest.skip(why)
        pytest.fail(f"zoo:{name} is installed but does not load: {why}")


def _conform(target: str, env: dict, tmp_path, *args: str) -> dict:
    out = tmp_path / "result.json"
    p = subprocess.run([sys.executable, "-m", "memspec", "conform", target, "--quiet", "--allow-untested",
                        "--json", str(out), "--out", str(tmp_path / "repro"), *args],
                       capture_output=True, text=True, timeout=600, env=env)
    assert out.exists(), (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return json.loads(out.read_text())["targets"][0]


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_zoo_allocator_reaches_a_verdict_with_no_false_fail(name, zoo_env, tmp_path):
    _probe(name, zoo_env)
    t = _conform(f"c:zoo:{name}", {**zoo_env, **zoo.required_env(name)}, tmp_path,
                 "--examples", "15", "--steps", "15")
    rows = {r["id"]: r for r in t["invariants"]}
    assert rows, t
    errors = {i: r["detail"] for i, r in rows.items() if r["status"] == "ERROR"}
    assert not errors, errors
    fails = {(level, i): r["detail"] for i, r in rows.items() for level, cell in r["cells"].items() if cell == "FAIL"}
    assert set(fails) <= KNOWN_DEFECTS[name], fails
    # the rows a mechanism with allocate/free alone can earn are earned, not skipped
    for inv in ("S1", "S14"):
        assert rows[inv]["status"] == "PASS", (inv, rows[inv])


def test_jemalloc_without_its_environment_says_so_in_one_line(zoo_env, tmp_path):
    env = {k: v for k, v in zoo_env.items() if k != "GLIBC_TUNABLES"}
    code = "from memspec.adapters import zoo; zoo.preflight('jemalloc')"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    last = (p.stderr.strip().splitlines() or [""])[-1]
    if "install the Debian package" in last:
        pytest.skip(last)
    if p.returncode == 0:
        pytest.skip("this machine's glibc loads libjemalloc.so.2 without the tunable")
    assert "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=" in last and "TargetUnavailable" in last, last


# --------------------------------------------------------------------------
# Every registered target (RMM's one typed suite per resource)
# --------------------------------------------------------------------------

def _entry_points() -> list[str]:
    return sorted({ep.name for ep in importlib.metadata.entry_points(group="memspec.targets")})


SMOKE = textwrap.dedent('''
    import json, sys
    from memspec.adapters._common import TargetUnavailable
    from memspec.invariants import runner
    from memspec.invariants.discovery import resolve
    name = sys.argv[1]
    try:
        ref = resolve(name)
        inst = ref.factory()
        if inst.close:
            inst.close()
    except Exception as e:  # TargetUnavailable, DriverUnavailable: the reason is the message
        if not (isinstance(e, TargetUnavailable) or type(e).__name__.endswith("Unavailable")):
            raise
        print("UNAVAILABLE:", (str(e).splitlines() or [type(e).__name__])[0])
        sys.exit(3)
    results = runner.conform(name, "all", examples=2, steps=6, out_dir=None)
    print(json.dumps([{"level": r.level, "steps": r.stats.steps if r.stats else 0, "errors": r.errors,
                       "failures": [f.invariant for f in r.failures]} for r in results]))
''')


@pytest.mark.parametrize("name", _entry_points())
def test_every_registered_target_runs_a_few_steps(name, tmp_path):
    env = {**os.environ, "MEMSPEC_CUDA_DRIVER": os.environ.get("MEMSPEC_CUDA_DRIVER", "host"),
           "MEMSPEC_ZOO_CACHE": str(tmp_path / "zoo-cache")}
    if name.startswith("zoo-"):
        env.update(zoo.required_env(name[4:]))
    p = subprocess.run([sys.executable, "-c", SMOKE, name], capture_output=True, text=True, timeout=600, env=env,
                       cwd=tmp_path)
    if p.returncode == 3:
        pytest.skip(f"{name}: {p.stdout.strip()}")
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    results = json.loads(p.stdout.strip().splitlines()[-1])
    assert results, name
    for r in results:
        assert not r["errors"], (name, r)
        assert r["steps"] > 0, (name, r)


def test_ci_installs_the_zoo_and_ends_with_the_readme_command():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    ci = (root / ".ci" / "run").read_text()
    for pkg in zoo.PACKAGES:
        assert pkg in ci, pkg
    last = [ln for ln in ci.splitlines() if ln.strip()][-1]
    assert last in (root / "README.md").read_text() and "pytest -n auto" in last
