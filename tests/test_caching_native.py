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


def test_the_pure_module_says_it_is_not_compiled():
    import memspec.reference.caching as rc

    assert rc.COMPILED is False and rc.__file__.endswith(".py")
    assert rc._new_block is object.__new__  # the pure hot paths skip __init__ frames


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
