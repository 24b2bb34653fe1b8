"""The harness's layout: no import cycles among its modules (function-level
imports included), and nothing in invariants/ or spec/ imports the CLI layer
(``memspec.cli``, ``memspec.commands``, ``memspec.profiles``,
``memspec.pytest_plugin``).  The rules are written in README ("Layering")."""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the harness's own modules (proofs/agreement/contracts are checked by their own tests)
HARNESS = ["errors", "choosers", "guard", "integrity", "engine", "levels", "planning", "runner", "repro", "walk",
           "harness", "discovery", "report", "pytest_suite", "profiles"]
CLI = ("memspec.cli", "memspec.commands", "memspec.profiles", "memspec.pytest_plugin", "memspec.__main__")


def _imports(path: str) -> set[str]:
    """Every module a file imports, at any depth (function bodies included)."""
    tree = ast.parse(open(path).read(), path)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_no_import_cycles_among_the_harness_modules():
    graph = {}
    for m in HARNESS:
        deps = _imports(os.path.join(ROOT, "invariants", f"{m}.py"))
        graph[m] = {d.split(".")[2] for d in deps if d.startswith("memspec.invariants.") and d.split(".")[2] in HARNESS}
        graph[m].discard(m)
    state: dict = {}

    def visit(n, path):
        if state.get(n) == 1:
            raise AssertionError("import cycle: " + " -> ".join(path + [n]))
        if state.get(n) == 2:
            return
        state[n] = 1
        for d in sorted(graph[n]):
            visit(d, path + [n])
        state[n] = 2

    for n in HARNESS:
        visit(n, [])
    assert "runner" not in graph["repro"] and "runner" not in graph["engine"]


def test_invariants_and_spec_never_import_the_cli_layer():
    bad = []
    for top in ("invariants", "spec"):
        for dirpath, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    p = os.path.join(dirpath, f)
                    bad += [f"{os.path.relpath(p, ROOT)} imports {d}" for d in _imports(p)
                            if d.startswith(CLI) or d == "memspec" and False]
    assert not bad, bad


def test_the_engine_names_no_invariant_and_no_level():
    import re

    for m in ("engine", "guard", "integrity", "choosers", "errors", "harness", "runner", "planning"):
        src = open(os.path.join(ROOT, "invariants", f"{m}.py")).read()
        assert not re.search(r'"S[0-9]+"|"C[0-9]"', src), m
    for m in ("engine", "integrity", "runner", "planning"):
        src = open(os.path.join(ROOT, "invariants", f"{m}.py")).read()
        assert not re.search(r'"(mechanism|system|caching)"', src), m
