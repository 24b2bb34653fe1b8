"""The harness's layout: no import cycles among its modules (function-level
imports included), and nothing in invariants/ or spec/ imports the CLI layer
(``memspec.cli``, ``memspec.commands``, ``memspec.profiles``,
``memspec.pytest_plugin``).  The rules are written in README ("Layering")."""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the harness's own modules (proofs/agreement/contracts are checked by their own tests)
HARNESS = ["errors", "choosers", "guard", "integrity", "plan", "draws", "engine", "levels", "planning", "runner",
           "repro", "walk", "harness", "discovery", "report", "pytest_suite", "profiles", "fuzz", "fuzz_rounds",
           "fuzz_db", "stateful", "blame", "wire", "results"]
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


def _py_files(*dirs: str) -> list[str]:
    out = []
    for d in dirs:
        for base, _sub, files in os.walk(os.path.join(ROOT, d)):
            out += [os.path.join(base, f) for f in files if f.endswith(".py")]
    return sorted(out)


def _calls_of(name: str, path: str) -> list[int]:
    """Lines that call ``name`` (``name(...)`` or ``x.name(...)``) or hand it to a guard as a callee."""
    tree = ast.parse(open(path).read(), path)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            passed = [a.id for a in node.args if isinstance(a, ast.Name)]
            if called == name or name in passed:
                lines.append(node.lineno)
    return lines


def test_the_level_choice_and_target_resolution_are_each_written_once():
    """Issue 32: one place chooses a target's levels (``runner.plan_in_child``:
    its mutant's level, or those of its kind, through ``levels.levels_for``)
    and one module reads the ``memspec.targets`` entry points
    (``discovery``); every command and the pytest plugin plan through it."""
    files = _py_files("invariants", "memspec", "adapters")
    sites = {os.path.relpath(p, ROOT): ls for p in files if (ls := _calls_of("levels_for", p))}
    assert sites == {"invariants/runner.py": sites.get("invariants/runner.py")} and len(sites[
        "invariants/runner.py"]) == 1, sites
    readers = [os.path.relpath(p, ROOT) for p in files if "entry_points(" in open(p).read()]
    assert readers == ["invariants/discovery.py"], readers
    defs = [os.path.relpath(p, ROOT) for p in files
            if any(isinstance(n, ast.FunctionDef) and n.name in ("resolve", "levels_for")
                   for n in ast.walk(ast.parse(open(p).read(), p)))]
    assert sorted(defs) == ["invariants/discovery.py", "invariants/levels.py"], defs


def test_commands_import_no_private_name_of_the_harness():
    """Issue 32: ``memspec/commands/*.py`` keep argparse and display; they
    name no private (``_name``) of ``memspec.invariants`` -- neither imported
    nor read as an attribute of an imported harness module."""
    bad = []
    for p in _py_files(os.path.join("memspec", "commands")):
        tree = ast.parse(open(p).read(), p)
        mods: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("memspec.invariants"):
                for a in node.names:
                    if a.name.startswith("_"):
                        bad.append(f"{os.path.basename(p)}:{node.lineno} imports {node.module}.{a.name}")
                    mods.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("memspec.invariants"):
                        mods.add(a.asname or a.name.split(".")[0])
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in mods:
                    bad.append(f"{os.path.basename(p)}:{node.lineno} reads {base.id}...{node.attr}")
    assert not bad, bad
