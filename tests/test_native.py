"""The opt-in compiled build (memspec/native.py).

Pure Python is the default and the source of truth: the loader must fall
back to it, with a warning, whenever the build is missing, stale, made for
other sources, or enabled too late.  These tests need no compiler.  The last
one (slow; skipped without mypy and a C compiler) builds the native modules
and checks that the compiled walk takes exactly the pure walk's steps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import warnings
from pathlib import Path

import pytest

from memspec import native

# A child process: enables (or not) the native build from the environment,
# then reports where the hot modules came from.
_WHERE = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as w:
        import memspec
        from memspec import native
        import memspec.spec.core, memspec.reference.device
    print(json.dumps({"info": native.info(),
                      "core": memspec.spec.core.__file__, "device": memspec.reference.device.__file__,
                      "warnings": [f"{x.category.__name__}: {x.message}" for x in w]}))
""")


def _child(code: str, cache: Path, native_env: str | None = "1") -> dict:
    env = {k: v for k, v in os.environ.items() if k != native.ENV}
    env[native.CACHE_ENV] = str(cache)
    if native_env is not None:
        env[native.ENV] = native_env
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _fake_build(root: Path, hashes: dict[str, str]) -> Path:
    """A build directory with a manifest for ``hashes`` (and empty extension files)."""
    key = native.build_key(hashes)
    d = root / key
    exts = {}
    for m in hashes:
        rel = Path(*m.split(".")).with_suffix(".so")
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(b"")
        exts[m] = str(rel)
    (d / native.MANIFEST).write_text(json.dumps({"key": key, "python": native._python_tag(), "sources": hashes,
                                                 "extensions": exts}))
    return d


def test_missing_build_falls_back_to_pure_python_with_a_warning(tmp_path):
    out = _child(_WHERE, tmp_path / "empty")
    assert out["info"]["native"] is False
    assert out["core"].endswith("core.py") and out["device"].endswith("device.py")
    assert any("NativeFallback" in w and "no native build" in w for w in out["warnings"]), out["warnings"]


def test_without_the_env_variable_nothing_is_looked_up(tmp_path):
    out = _child(_WHERE, tmp_path / "empty", native_env=None)
    assert out["info"] == {"native": False, "build": None, "compiled": []}
    assert out["warnings"] == []
    out = _child(_WHERE, tmp_path / "empty", native_env="0")
    assert out["info"]["native"] is False and out["warnings"] == []


def test_stale_build_falls_back_and_names_the_changed_modules(tmp_path):
    hashes = native.source_hashes()
    stale = dict(hashes)
    changed = "memspec.spec.core"
    stale[changed] = "0" * 64  # built from other sources
    _fake_build(tmp_path, stale)
    dest, why = native.stale_reason(root=tmp_path)
    assert dest is None and "stale" in why and changed in why
    out = _child(_WHERE, tmp_path)
    assert out["info"]["native"] is False and out["core"].endswith("core.py")
    assert any("stale" in w and changed in w for w in out["warnings"]), out["warnings"]


def test_a_tampered_manifest_is_not_trusted(tmp_path):
    """A build directory whose key matches but whose recorded hashes do not
    (edited by hand, or a key collision) is refused."""
    hashes = native.source_hashes()
    d = _fake_build(tmp_path, hashes)
    mf = json.loads((d / native.MANIFEST).read_text())
    tampered = native.MODULES[-1]
    mf["sources"][tampered] = "f" * 64
    (d / native.MANIFEST).write_text(json.dumps(mf))
    dest, why = native.stale_reason(root=tmp_path)
    assert dest is None and "does not match" in why and tampered in why


def test_a_build_for_another_python_or_with_missing_files_is_refused(tmp_path):
    hashes = native.source_hashes()
    d = _fake_build(tmp_path, hashes)
    assert native.stale_reason(root=tmp_path) == (d, None)
    gone = native.MODULES[1]
    (d / Path(*gone.split("."))).with_suffix(".so").unlink()
    dest, why = native.stale_reason(root=tmp_path)
    assert dest is None and f"lacks {gone}" in why
    mf = json.loads((d / native.MANIFEST).read_text())
    mf["python"] = "cpython-27-.so"
    (d / native.MANIFEST).write_text(json.dumps(mf))
    dest, why = native.stale_reason(root=tmp_path)
    assert dest is None and "cpython-27" in why


def test_enabling_after_the_modules_were_imported_falls_back(tmp_path):
    """Mixing a compiled module with the pure one already loaded would give
    two versions of every class: refused."""
    _fake_build(tmp_path, native.source_hashes())  # a build that would otherwise be used
    # (in a child without MEMSPEC_NATIVE: this process may run the real build already)
    got = _child(textwrap.dedent(f"""
        import json, warnings
        from pathlib import Path
        import memspec.spec.core  # imported as Python first
        from memspec import native
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ok = native.enable(root=Path({str(tmp_path)!r}))
        print(json.dumps({{"ok": ok, "active": native.active(),
                          "warnings": [f"{{x.category.__name__}}: {{x.message}}" for x in w]}}))
    """), tmp_path, native_env=None)
    assert got["ok"] is False and got["active"] is False
    assert any(x.startswith("NativeFallback") and "already imported" in x for x in got["warnings"]), got


def test_build_without_mypy_is_a_named_error(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "_mypy_version", lambda: None)
    with pytest.raises(native.NativeError, match="mypy is not installed"):
        native.build(root=tmp_path)


def test_the_build_key_covers_every_source_and_the_python():
    hashes = native.source_hashes()
    assert set(native.MODULES) <= set(hashes) and "memspec.spec.state" in hashes  # the type context too
    k = native.build_key(hashes)
    for m in list(hashes)[:3]:
        assert native.build_key({**hashes, m: "0" * 64}) != k


def _can_compile() -> str | None:
    if native._mypy_version() is None:
        return "mypy is not installed (the `native` extra)"
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc})"
    if not Path(sysconfig.get_paths()["include"], "Python.h").is_file():
        return "no Python headers"
    return None


# the walk's own per-step record, run by run: the action, its arguments,
# the matched outcome, the ids bound, then the run's primitive choices
_TRACE = textwrap.dedent("""
    import json, random
    import memspec
    from memspec import native
    from memspec.invariants import harness as H, runner, walk
    out = {"levels": {}}
    for level in ("mechanism", "system"):
        plan = runner.make_plan("reference", level)
        guard = H.CallGuard(plan.timeout, plan.guard_mode)
        guard.install()
        trace = []
        for i in range(RUNS):
            record = []
            chooser = walk.WalkChooser(random.Random(walk.run_seed(0, i)), record)  # the walk's own
            run = H.Run(plan, guard, chooser)
            try:
                for _ in range(LENGTH):
                    run.step(chooser)
                run.teardown()
            except H.Violation as v:
                trace.append(["violation", v.invariant, str(v)])
            finally:
                run.close()
            trace += [[t.action, repr(sorted(t.args.items())), t.outcome, repr(t.bound)] for t in run.trace]
            trace.append(repr(record))
        guard.uninstall()
        st = plan.stats
        out["levels"][level] = {"trace": trace, "steps": st.steps,
                                **{k: sorted(map(repr, getattr(st, k).items()))
                                   for k in ("actions", "outcomes", "accepted", "boundaries")}}
    import memspec.reference.caching  # (not a walk module: loaded so that info lists every module built)
    out["info"] = native.info()  # after the walks: what they imported, from where
    print(json.dumps(out))
""").replace("RUNS", "60").replace("LENGTH", "50")


@pytest.mark.slow
@pytest.mark.skipif(_can_compile() is not None, reason=f"native build impossible here: {_can_compile()}")
def test_compiled_walk_takes_the_pure_walks_steps():
    """Builds (or reuses) the native modules in the default cache, then runs
    the same seeded walks with and without them: the same actions,
    arguments, outcomes, bound ids and choices, step by step."""
    root = native.cache_root()
    native.build(root=root)
    pure = _child(_TRACE, root, native_env=None)
    comp = _child(_TRACE, root)
    assert pure["info"]["native"] is False
    assert comp["info"]["native"] is True, comp["info"]
    assert set(comp["info"]["compiled"]) == set(native.MODULES)
    for level in ("mechanism", "system"):
        p, c = pure["levels"][level], comp["levels"][level]
        assert p["steps"] >= 60 * 50 and len(p["accepted"]) > 3
        assert len(c["trace"]) == len(p["trace"])
        for i, (a, b) in enumerate(zip(p["trace"], c["trace"])):
            assert a == b, f"{level}: first difference at trace item {i}: pure {a!r} vs compiled {b!r}"
        assert c == p


def test_cli_native_flag_falls_back_with_a_warning(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != native.ENV}
    env[native.CACHE_ENV] = str(tmp_path / "empty")
    p = subprocess.run([sys.executable, "-m", "memspec", "--native", "--version"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0 and "memspec" in p.stdout
    assert "NativeFallback" in p.stderr and "no native build" in p.stderr
