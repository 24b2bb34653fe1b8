"""The GPU image has no z3-solver and no crosshair-tool (issue 14): nothing on
the GPU path (``tests/gpu/run.sh``: ``memspec conform``, the adapters, the
GPU tools) may import them.  Checked in a subprocess whose meta path refuses
both, with Hypothesis' plugin entry points off (hypothesis-crosshair is not
on that image either)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BLOCK = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = ("z3", "crosshair")
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"blocked on the GPU path: {name}")
            return None
    sys.meta_path.insert(0, Block())
""")


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYPOTHESIS_NO_PLUGINS": "1", "MEMSPEC_CUDA_DRIVER": "host"}
    return subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)


def test_the_block_really_blocks():
    p = _run("import z3\n")
    assert p.returncode != 0 and "blocked on the GPU path: z3" in p.stderr


def test_gpu_path_modules_import_without_z3_or_crosshair():
    p = _run("""
        import importlib, runpy, sys
        for m in ["memspec.cli", "memspec.commands.conform", "memspec.commands.targets",
                  "memspec.invariants.runner", "memspec.invariants.harness", "memspec.invariants.repro",
                  "memspec.cuda_impl.targets", "memspec.adapters.cuda_core", "memspec.adapters.cuda_core_checks",
                  "memspec.adapters.c_plugin", "memspec.adapters.cupy_pool", "memspec.adapters.torch_caching",
                  "memspec.adapters.torch_differential", "memspec.reference.caching_targets"]:
            importlib.import_module(m)
        sys.path.insert(0, "tests/gpu")
        importlib.import_module("gpu_tool")
        print("z3/crosshair loaded:", sorted(k for k in sys.modules if k.split(".")[0] in ("z3", "crosshair")))
    """)
    assert p.returncode == 0, p.stderr
    assert "z3/crosshair loaded: []" in p.stdout


def test_gpu_path_runs_conform_without_z3_or_crosshair():
    p = _run("""
        import sys
        from memspec.cli import main
        rc = main(["conform", "cuda-core-vmm", "cuda-host", "--examples", "3", "--steps", "5", "--quiet",
                   "--out", "/tmp/memspec-gpu-path-repro"])
        rc2 = main(["targets", "--no-probe"])
        print("rc", rc, rc2)
    """)
    assert p.returncode == 0, p.stderr[-3000:]
    # cuda-core-vmm fails S5 (the leak), cuda-host passes; both ran to their tables
    assert "rc 1 0" in p.stdout, p.stdout[-3000:]
    assert "memspec conform cuda-core-vmm" in p.stdout and "memspec conform cuda-host" in p.stdout


def test_linktree_makes_memspec_importable_without_pip(tmp_path):
    """run.sh's fallback when pip cannot install (no network, no setuptools):
    the symlink tree alone gives the packages and the target entry points."""
    tree = tmp_path / "site"
    p = subprocess.run([sys.executable, "tests/gpu/linktree.py", str(tree)], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    code = (f"import sys; sys.path.insert(0, {str(tree)!r})\n"
            "import memspec, memspec.spec.api, memspec.adapters.c_plugin  # stdlib-only modules (-S)\n"
            "import importlib.metadata as md\n"
            "print(memspec.__file__)\n"
            "print(sorted(e.name for e in md.entry_points(group='memspec.targets')))\n")
    # -S: no site-packages, so neither the editable install nor its metadata can answer
    q = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert q.returncode == 0, q.stderr
    first, names = q.stdout.splitlines()[:2]
    assert first.startswith(str(tree))
    for t in ("cuda-core-vmm", "cuda-host", "reference", "torch-caching"):
        assert repr(t) in names, names
