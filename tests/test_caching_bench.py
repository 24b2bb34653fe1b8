"""bench/caching.py: pure vs compiled variants and the per-op cost ratio's
median (no timing is asserted: only which figures a row carries)."""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import caching as bc  # noqa: E402


def test_pure_copy_is_loaded_from_source_and_sys_modules_is_restored():
    import memspec.reference.caching as mod
    import memspec.reference.caching_stats as stats

    pure = bc.load_pure()
    assert pure is not mod and pure.COMPILED is False
    assert pure.__file__.endswith("caching.py")
    assert pure.CachingAllocator is not mod.CachingAllocator
    # the copy runs on its own caching_stats copy; the normal import is untouched
    assert sys.modules[bc.CACHING] is mod and sys.modules[bc.STATS] is stats
    a = pure.CachingAllocator(preset="seed", capacity=1 << 40)
    assert type(a.stats) is not stats.AllocatorStats
    h = a.malloc(3 << 20)
    assert a.live_blocks() == 1 and h.size == 4 << 20
    a.free(h)
    assert a.live_blocks() == 0 and a.memory_stats()["allocation.all.allocated"] == 1


def test_variants_measure_the_build_and_the_pure_copy(monkeypatch):
    import memspec.reference.caching as mod

    if not mod.COMPILED:
        assert bc.variants() == [("pure", mod)]
        assert "pure Python" in bc.build_text(bc.variants())
        monkeypatch.setattr(mod, "COMPILED", True)  # as a mypyc build reports itself
    vs = bc.variants()
    assert [v for v, _ in vs] == ["compiled", "pure"] and vs[0][1] is mod
    assert vs[1][1].COMPILED is False and "ran compiled" in bc.build_text(vs)


def test_pytorch_rows_give_the_cost_ratio_of_interleaved_trials_and_the_pure_figure(monkeypatch):
    import memspec.reference.caching as mod

    if not mod.COMPILED:
        monkeypatch.setattr(mod, "COMPILED", True)  # two variants (here both run pure code)
    rows = bc.pytorch_rows((50, 200), 300, repeats=1, trials=3)
    assert [r.name for r in rows] == ["caching pytorch @50 live (mixed)", "caching pytorch @200 live (mixed)",
                                      "caching pytorch per-op cost @200 / @50"]
    flat = rows[-1]
    cpu = flat.extra["cpu_seconds"]
    assert all(len(cpu[f"{v}@{n}"]) == 3 for v in ("compiled", "pure") for n in (50, 200))
    assert flat.value == flat.ratio == min(cpu["compiled@200"]) / min(cpu["compiled@50"])
    assert flat.extra["pure_ratio"] == min(cpu["pure@200"]) / min(cpu["pure@50"])
    assert flat.extra["trial_ratios"] == [hi / lo for lo, hi in zip(cpu["compiled@50"], cpu["compiled@200"])]
    assert flat.extra["trial_median"] == statistics.median(flat.extra["trial_ratios"])
    assert flat.met == (flat.value <= 1.5) and "pure Python" in flat.note
    for r in rows[:2]:
        assert r.extra["compiled"] is True and r.extra["pure_rate"] > 0 and "pure " in r.note
    assert rows[1].met == (rows[1].value >= 100_000)


def test_seed_rows_carry_the_pure_ratio():
    from bench.toy import seed_path

    rows = bc.seed_rows((50,), 300, repeats=1)
    if seed_path() is None:
        assert rows[0].met is None and "seed 003" in rows[0].note
        return
    r = rows[0]
    assert math.isclose(r.ratio, r.value / r.extra["toy_rate"]) and r.met == (r.ratio >= 1.0)
    assert r.extra["pure_ratio"] > 0
    assert ("pure Python ratio" in r.note) == r.extra["compiled"]


def test_load_pure_install_makes_later_imports_use_the_pure_copy():
    """The replay row's pure child installs the copy before the CLI imports the allocator."""
    import subprocess

    code = ("import sys\n"
            "from bench.caching import load_pure\n"
            "m = load_pure(install=True)\n"
            "import memspec.reference.caching_snapshot as cs\n"
            "import memspec.reference.caching as rc\n"
            "assert rc is m and cs.CachingAllocator is m.CachingAllocator and m.COMPILED is False\n"
            "assert sys.modules['memspec.reference.caching_stats'].AllocatorStats is type(m.CachingAllocator(capacity=1 << 30).stats)\n"
            "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


def test_opcodes_per_pair_is_deterministic_and_counts_the_ops_frames():
    from bench import workload

    w = workload.make("large", 30, 200)
    seed = [bc.opcodes_per_pair(lambda: bc.reference_ops("seed", bc.load_pure()), w) for _ in range(2)]
    assert seed[0] == seed[1] > 100
    a = bc._DictAllocator()
    before = sys.gettrace()
    d = bc.opcodes_per_pair(lambda: (a.alloc, a.free), w)
    # the dict "allocator" runs a handful of opcodes per call: far fewer than the reference
    assert 0 < d < seed[0] / 5
    assert sys.gettrace() is before  # the tracer is removed


def test_opcodes_per_pair_does_not_count_gc_callbacks():
    """A collection inside the counted loop runs ``gc.callbacks`` (Hypothesis
    installs one); their opcodes are not the allocator's.  CI once read
    739.935 then 739.745 opcodes per pair in one process for this reason."""
    import gc

    from bench import workload

    w = workload.make("large", 30, 200)
    make = lambda: bc.reference_ops("seed", bc.load_pure())  # noqa: E731
    quiet = bc.opcodes_per_pair(make, w)
    calls = []

    def callback(phase, info):
        for _ in range(50):
            calls.append(phase)

    threshold = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(1, 1, 1)  # collect on (nearly) every allocation
    try:
        noisy = bc.opcodes_per_pair(make, w)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(callback)
    assert calls  # the callback did run (around the loop, not inside it)
    assert noisy == quiet
    assert gc.isenabled()


def test_measured_rows_carry_the_load_average_around_their_measurement(monkeypatch):
    from bench import caching as bc
    from bench.common import Row, unavailable

    loads = iter([(0.5, 0, 0), (2.25, 0, 0)])
    monkeypatch.setattr(bc.os, "getloadavg", lambda: next(loads))
    rows = bc._loaded(lambda: [Row("r", 1.0, "pairs/s", note="n"), unavailable("u", "pairs/s", "", "why")])
    assert rows[0].extra["loadavg"] == [0.5, 2.25] and rows[0].note.endswith("load average 0.5 -> 2.2")
    assert "loadavg" not in rows[1].extra and "load average" not in rows[1].note

    def no_loadavg():
        raise OSError("no load average here")

    monkeypatch.setattr(bc.os, "getloadavg", no_loadavg)
    assert "loadavg" not in bc._loaded(lambda: [Row("r", 1.0, "pairs/s")])[0].extra
