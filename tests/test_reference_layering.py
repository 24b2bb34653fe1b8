"""Layering: reference/ imports only ``memspec.spec.api`` and
``memspec.spec.errors`` from the spec (DESIGN.md: *The implementations must
never import the spec's model logic*: a differential check between two copies
of the same code proves nothing).  Checked by parsing every module's imports,
including imports inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

import memspec.reference

ALLOWED_SPEC = {"memspec.spec.api", "memspec.spec.errors"}
REFERENCE = Path(memspec.reference.__file__).parent


def spec_imports(path: Path) -> set[str]:
    """Every spec module a file imports (absolute, relative or via ``from memspec.spec import x``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:                       # relative: from ..spec import x  /  from .x import y
                base = "memspec.reference" if node.level == 1 else "memspec"
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            names = [mod] + [f"{mod}.{a.name}" for a in node.names]
            if mod in ("memspec.spec", "memspec") or mod == "spec":
                names = [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            if n == "spec" or n.startswith("spec.") or n.startswith("memspec.spec"):
                out.add(n if not n.startswith("spec") else "memspec." + n)
    # "from memspec.spec.api import X" also yields "memspec.spec.api.X": keep module names only
    return {n for n in out if n in ALLOWED_SPEC or not any(n.startswith(a + ".") for a in ALLOWED_SPEC)}


def test_checker_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from memspec.spec.api import Fence\n"
                   "def f():\n    from memspec.spec import kernels\n    import memspec.spec.core\n")
    assert spec_imports(bad) - ALLOWED_SPEC == {"memspec.spec.kernels", "memspec.spec.core"}


def test_reference_imports_only_api_and_errors():
    files = [p for p in sorted(REFERENCE.glob("*.py"))]
    assert len(files) >= 10, files
    bad = {}
    for p in files:
        extra = spec_imports(p) - ALLOWED_SPEC
        if extra:
            bad[p.name] = sorted(extra)
    assert bad == {}, f"reference modules import spec model code: {bad}"
