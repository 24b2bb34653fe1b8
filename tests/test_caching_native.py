"""reference/caching.py and caching_stats.py stay compilable by mypyc: they
type-check under mypy (mypyc refuses modules that do not), and the pure
module reports itself as not compiled."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_module_says_whether_it_runs_compiled():
    import memspec.reference.caching as rc
    import memspec.reference.caching_stats as rs

    assert rc.COMPILED is (not rc.__file__.endswith(".py"))
    if not rc.COMPILED:
        assert rc._new_block is object.__new__  # the pure hot paths skip __init__ frames
    else:  # a build: compiled functions carry no code object
        assert not hasattr(rc.CachingAllocator.malloc, "__code__") and not rs.__file__.endswith(".py")


def test_caching_modules_type_check_for_mypyc(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed (pip install mypy): the mypyc-readiness check needs it")
    # mypy cannot follow the editable install's import hook: lay the modules out as installed
    pkg = tmp_path / "memspec"
    (pkg / "spec").mkdir(parents=True)
    (pkg / "reference").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "reference" / "__init__.py").write_text("")
    for f in ("__init__.py", "api.py", "errors.py"):
        shutil.copy(ROOT / "spec" / f, pkg / "spec" / f)
    for f in ("caching.py", "caching_stats.py", "caching_export.py", "caching_snapshot.py"):
        shutil.copy(ROOT / "reference" / f, pkg / "reference" / f)
    p = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--python-executable", sys.executable,
                        "memspec/reference/caching.py", "memspec/reference/caching_stats.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "Success: no issues found in 2 source files" in p.stdout, p.stdout + p.stderr


def test_a_subclass_override_of_the_segment_size_is_honoured():
    """The slow path asks ``allocation_size`` (a method: an interpreted
    subclass's override holds in a mypyc build too, where a patch of the
    module's ``segment_bytes`` would not be seen)."""
    from memspec.reference.caching import CachingAllocator

    MiB = 1 << 20

    class FortyMiBSegments(CachingAllocator):
        def allocation_size(self, rounded: int) -> int:
            return 40 * MiB

    a = FortyMiBSegments(preset="pytorch", capacity=1 << 30)
    h = a.malloc(3 * MiB)
    assert a.memory_reserved() == 40 * MiB and h.size == 3 * MiB
    plain = CachingAllocator(preset="pytorch", capacity=1 << 30)
    plain.malloc(3 * MiB)
    assert plain.memory_reserved() == 20 * MiB
