"""reference/caching.py, its parts caching_blocks.py and caching_segments.py,
and caching_stats.py stay compilable by mypyc: they type-check under mypy
(mypyc refuses modules that do not), and the pure module reports itself as
not compiled."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the caching allocator's modules, compiled together (the face ``caching`` and its parts)
CACHING_MODULES = ("memspec.reference.caching", "memspec.reference.caching_blocks",
                   "memspec.reference.caching_segments", "memspec.reference.caching_stats")


def test_the_module_says_whether_it_runs_compiled():
    import memspec.reference.caching as rc
    import memspec.reference.caching_stats as rs

    assert rc.COMPILED is (not rc.__file__.endswith(".py"))
    if not rc.COMPILED:
        assert rc._new_block is object.__new__  # the pure hot paths skip __init__ frames
    else:  # a build: compiled functions carry no code object
        assert not hasattr(rc.CachingAllocator.malloc, "__code__") and not rs.__file__.endswith(".py")
        for m in CACHING_MODULES:  # the parts are compiled with the face
            assert not importlib.import_module(m).__file__.endswith(".py"), m


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
    compiled = [m.rsplit(".", 1)[1] + ".py" for m in CACHING_MODULES]
    for f in (*compiled, "caching_export.py", "caching_snapshot.py"):
        shutil.copy(ROOT / "reference" / f, pkg / "reference" / f)
    p = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--python-executable", sys.executable,
                        *(f"memspec/reference/{f}" for f in compiled)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and f"Success: no issues found in {len(compiled)} source files" in p.stdout, \
        p.stdout + p.stderr


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


def test_handles_copy_and_hand_build_into_refused_never_live_handles():
    """``CachedBlock`` copies itself (a mypyc class cannot be rebuilt by
    ``copyreg`` without arguments): a copy, a deep copy and a handle built
    with ``__new__`` are all refused by name, and the original still frees."""
    import copy

    from memspec.reference.caching import CachedBlock, CachingAllocator
    from memspec.spec.errors import DoubleFree, ForeignAllocation, StaleHandle

    a = CachingAllocator(preset="seed", capacity=1 << 30)
    h = a.malloc(3000)
    before = a.memory_stats()
    c, d = copy.copy(h), copy.deepcopy(h)
    assert (c.address, c.size, c.requested_size, c.stream) == (h.address, h.size, h.requested_size, h.stream)
    assert c._block is h._block and d._block is h._block and c is not h and d is not h
    forged = CachedBlock.__new__(CachedBlock)
    for name in ("address", "size", "requested_size", "stream", "_block"):
        setattr(forged, name, getattr(h, name))
    for bad in (c, d, forged):
        with pytest.raises(StaleHandle):
            a.free(bad)
    assert a.memory_stats() == before
    a.free(h)
    with pytest.raises(DoubleFree):
        a.free(copy.copy(h))  # a copy of a freed handle is that freed handle's copy
    with pytest.raises(ForeignAllocation):
        CachingAllocator(preset="seed", capacity=1 << 30).free(c)
    assert a.memory_allocated() == 0


def test_an_int_memory_fraction_reads_back_as_a_float():
    """Compiled, a ``float`` attribute converts an int; pure Python stores
    ``float(fraction)`` too, so both read the same (and the cap is exact)."""
    from memspec.reference.caching import CachingAllocator

    a = CachingAllocator(preset="pytorch", capacity=(1 << 60) + 1, memory_fraction=1)
    assert type(a.memory_fraction) is float and a.memory_fraction == 1.0
    assert a._allowed == (1 << 60) + 1  # int(1 * capacity), not int(1.0 * capacity)


# A child process: the caching allocator under both presets and the knobs its
# fused and hooked paths take, driven by one seeded workload; prints where the
# module came from and every figure it reports.
_CACHING_RUN = textwrap.dedent("""
    import json, random
    import memspec
    from memspec import native
    import memspec.reference.caching as rc
    from memspec.spec.errors import MemspecError
    MiB = 1 << 20
    out = {"compiled": rc.COMPILED, "file": rc.__file__, "runs": []}
    configs = [("pytorch", {}), ("seed", {}), ("pytorch", {"expandable_segments": True}),
               ("seed", {"expandable_segments": True}), ("pytorch", {"max_split_size": 40 * MiB}),
               ("pytorch", {"roundup_power2_divisions": 4, "memory_fraction": 0.75,
                            "garbage_collection_threshold": 0.5})]
    for preset, kw in configs:
        rng = random.Random(f"{preset}/{sorted(kw.items())}")
        a = rc.CachingAllocator(preset=preset, capacity=1 << 30, record_history=True, **kw)
        live, log = [], []
        for step in range(3000):
            r = rng.random()
            try:
                if r < 0.5 or not live:
                    n = rng.randint(1, MiB) if rng.random() < 0.6 else rng.randint(MiB + 1, 40 * MiB)
                    live.append(a.malloc(n, rng.choice((0, 0, 0, 1))))
                elif r < 0.9:
                    a.free(live.pop(rng.randrange(len(live))))
                elif r < 0.95:
                    a.record_stream(live[rng.randrange(len(live))], rng.choice((1, 2)))
                elif r < 0.98:
                    a.complete_stream(rng.choice((0, 1, 2)))
                else:
                    log.append(("empty_cache", a.empty_cache()))
            except MemspecError as e:
                log.append((type(e).__name__, str(e)))
        out["runs"].append({"config": [preset, repr(sorted(kw.items()))], "log": log,
                            "stats": a.memory_stats(), "segments": a.segments(),
                            "trace": [list(t) for t in a.trace_entries()]})
    out["info"] = native.info()
    print(json.dumps(out))
""")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mypyc") is None or shutil.which("cc") is None,
                    reason="native build impossible here: mypy(c) or a C compiler is missing")
def test_compiled_caching_allocator_reports_the_pure_figures():
    """Builds (or reuses) the native modules in the default cache, then runs
    one seeded workload over both presets and their knobs pure and compiled:
    the same errors, statistics, segments and trace, figure for figure."""
    from memspec import native

    assert set(CACHING_MODULES) <= set(native.MODULES)
    root = native.cache_root()
    native.build(root=root)

    def child(native_env: str | None) -> dict:
        env = {k: v for k, v in os.environ.items() if k != native.ENV}
        env[native.CACHE_ENV] = str(root)
        if native_env is not None:
            env[native.ENV] = native_env
        p = subprocess.run([sys.executable, "-c", _CACHING_RUN], capture_output=True, text=True, env=env,
                           timeout=900)
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    pure, comp = child(None), child("1")
    assert pure["compiled"] is False and pure["file"].endswith(".py")
    assert comp["compiled"] is True and not comp["file"].endswith(".py"), comp["info"]
    assert set(CACHING_MODULES) <= set(comp["info"]["compiled"])
    assert any(r["log"] for r in pure["runs"]) and all(r["trace"] for r in pure["runs"])
    for p, c in zip(pure["runs"], comp["runs"]):
        assert p["config"] == c["config"]
        for key in ("log", "stats", "segments", "trace"):
            assert p[key] == c[key], f"{p['config']}: {key} differs compiled"
