"""Smoke test of the benchmarks: ``python -m bench --quick`` runs every group
and writes a row for each with numbers, or with the reason it could not run.

Timing targets are never asserted here (bench/README.md has the figures).
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.__main__ import GROUPS  # noqa: E402
from bench.common import MEASURED, NOT_AVAILABLE, NOT_RUN  # noqa: E402


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "memspec benchmarks" in proc.stdout
    return json.loads(out.read_text())


def test_every_group_ran_and_every_row_is_complete(quick_results):
    assert quick_results["quick"] is True
    assert quick_results["groups"] == list(GROUPS)
    rows = quick_results["rows"]
    assert len(rows) >= 15, [r["name"] for r in rows]
    names = [r["name"] for r in rows]
    assert len(set(names)) == len(names), "row names must be unique"
    for r in rows:
        assert r["status"] in (MEASURED, NOT_AVAILABLE, NOT_RUN), r  # no benchmark crashed
        if r["status"] == MEASURED:
            assert _num(r["value"]) and r["value"] > 0, r
            assert r["ratio"] is None or _num(r["ratio"]), r
            assert r["met"] in (True, False, None), r
        else:
            assert r["value"] is None and r["met"] is None, r
            assert r["note"].startswith(r["status"] + ": ") and len(r["note"]) > len(r["status"]) + 3, r


def _rows(results: dict, prefix: str) -> list[dict]:
    return [r for r in results["rows"] if r["name"].startswith(prefix)]


def test_rows_whose_dependencies_are_present_are_measured(quick_results):
    """A row may say "not available" only when its dependency really is absent."""
    from bench.harness import HARNESS_DEPS, WALK_DEPS

    deps = {
        "harness step rate": HARNESS_DEPS,
        "walk fuzz step rate": WALK_DEPS,
        "step time @": WALK_DEPS,
        "caching pytorch": ("memspec.reference.caching",),
        "caching seed vs toy": ("memspec.reference.caching",),
    }
    from bench.toy import seed_path

    for prefix, modules in deps.items():
        rows = _rows(quick_results, prefix)
        assert rows, prefix
        if prefix == "caching seed vs toy" and seed_path() is None:
            # the toy is read from the seed text at run time, never copied here
            assert all(r["status"] != MEASURED for r in rows), rows
            continue
        if all(importlib.util.find_spec(m) is not None for m in modules):
            for r in rows:
                assert r["status"] == MEASURED, r
                assert _num(r["value"]), r
    bare = _rows(quick_results, "bare Hypothesis step rate")
    assert len(bare) == 1 and bare[0]["status"] == MEASURED and _num(bare[0]["value"])


def test_ratio_rows_carry_their_ratio(quick_results):
    for r in quick_results["rows"]:
        if r["status"] == MEASURED and r["target"] and r["name"] != "bare Hypothesis step rate":
            assert _num(r["ratio"]), r
            assert r["met"] in (True, False), r


def test_gpu_rows_without_a_driver_are_not_run_and_never_met(monkeypatch):
    from bench import gpu

    monkeypatch.delenv("MEMSPEC_BENCH_GPU_TARGET", raising=False)
    monkeypatch.setattr(gpu, "cuda_driver", lambda: "no CUDA driver")
    rows = gpu.run(quick=True)
    assert len(rows) == 8
    assert all(r.status == NOT_RUN and r.met is None and r.value is None for r in rows)
    assert all(r.note == "not run: no CUDA driver" for r in rows)


def test_gpu_latency_rows_plumbing_on_the_host_emulator(monkeypatch):
    """The latency rows come from tests/gpu/gpu_tool.py; on the emulator they
    are measured but carry no verdict (not a GPU figure)."""
    from bench import gpu

    if not (ROOT / "tests" / "gpu" / "gpu_tool.py").is_file():
        pytest.skip("tests/gpu/gpu_tool.py not present")
    monkeypatch.setenv("MEMSPEC_BENCH_GPU_TARGET", "cuda-host")
    rows = gpu.run(quick=True)
    lat = [r for r in rows if r.status == MEASURED]
    assert len(lat) == 6
    for r in lat:
        assert _num(r.value) and _num(r.ratio) and r.met is None and "host emulator" in r.note
        assert r.extra["raw_commit_us"] > 0 and r.extra["target"] == "cuda-host"


def test_memspec_bench_outside_a_checkout_says_so(tmp_path, monkeypatch, capsys):
    import memspec
    from memspec.commands import bench as cmd

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(memspec, "__file__", str(tmp_path / "site" / "memspec" / "__init__.py"))
    assert cmd.main(["--quick"]) == 2
    err = capsys.readouterr().err
    assert "bench/" in err and "checkout" in err and str(tmp_path) in err


def test_memspec_bench_finds_the_checkout(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "-m", "memspec", "bench", "--only", "gpu", "--json", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert rows and all(r["name"].startswith("gpu") for r in rows)


def test_toy_extracted_from_the_seed_reproduces_the_seeds_figures():
    """bench/toy.py execs the seed's toy at run time; it must be the seed's
    allocator: *fill: reserved=40M allocated=40M requested=32M* ... *OOM*."""
    from bench.toy import load_toy

    t = load_toy()
    if t is None:
        pytest.skip("seed 003 not present beside the repository")
    MB = t.MB
    sim = t.Sim(device=40 * MB)
    A = []
    for _ in range(4):
        A.append(sim.alloc(3 * MB + 1))
        sim.alloc(5 * MB + 1)
    assert (sim.reserved, sim.allocated, sim.requested) == (40 * MB, 40 * MB, 32 * MB + 8)
    for a in A:
        sim.free(a)
    assert (sim.allocated // MB, sim.requested // MB) == (24, 20)
    with pytest.raises(t.OOM, match="16 MiB is reserved but unallocated"):
        sim.alloc(8 * MB)


def test_caching_workload_keeps_the_live_set_and_is_reproducible():
    from bench import workload

    w = workload.make("mixed", 50, 200)
    assert w == workload.make("mixed", 50, 200) and len(w.init) == 50 and len(w.ops) == 200
    assert all(1 <= n <= 8 * workload.MiB for n in w.init + [n for _, n in w.ops])
    assert all(workload.MiB < n <= 16 * workload.MiB for n in workload.make("large", 20, 50).init)
    live: set[int] = set()
    counter = iter(range(10**6))

    def alloc(n: int) -> int:
        h = next(counter)
        live.add(h)
        return h

    seconds = workload.run_pairs(w, alloc, live.remove)
    assert seconds > 0 and len(live) == 50 and next(counter) == 250


def test_jobs_and_replay_rows_are_measured(quick_results):
    """``--jobs 2`` vs ``--jobs 1`` (same run) and the snapshot replay rate
    come with their figures (and the replay with its peak memory)."""
    jobs = _rows(quick_results, "fuzz --jobs ")
    assert [r["name"][:14] for r in jobs] == ["fuzz --jobs 1 ", "fuzz --jobs 2 "], jobs
    assert all(r["status"] == MEASURED for r in jobs), jobs
    assert _num(jobs[1]["ratio"]) and jobs[1]["met"] in (True, False)
    assert jobs[1]["extra"]["json"]["jobs"] == 2 and len(jobs[1]["extra"]["json"]["workers"]) == 2
    replay = _rows(quick_results, "memspec snapshot --replay")
    assert len(replay) == 1 and replay[0]["status"] == MEASURED, replay
    assert replay[0]["extra"]["events"] >= 20_000 and "peak RSS" in replay[0]["note"]
    assert "n/a" not in replay[0]["extra"]["peak_rss"]


def test_walk_ceiling_is_bare_over_the_target_and_spec_phases():
    """The walk row's ceiling: the ratio a walk with free draws and checks
    would reach (bare CPU / (target call + spec + match)), per level and for
    both levels' steps together; nothing without the bare figure or a phase."""
    from bench.harness import walk_ceiling

    phases = {"mechanism": {"phases": {"draw": 30.0, "target call": 10.0, "spec + match": 10.0}},
              "system": {"phases": {"draw": 30.0, "target call": 20.0, "spec + match": 20.0, "observations": 9.0}}}
    c = walk_ceiling(phases, 120.0)
    assert c == {"mechanism": 6.0, "system": 3.0, "both": 4.0}
    assert walk_ceiling(phases, None) == {} and walk_ceiling({}, 120.0) == {}
    assert walk_ceiling({"mechanism": {"phases": {"draw": 5.0}}}, 120.0) == {}


def test_walk_row_states_its_ceiling(quick_results):
    """The measured walk row says how far a walk whose draws and checks cost
    nothing could go, so a miss of the 5x target reads against it."""
    walk = _rows(quick_results, "walk fuzz step rate")
    assert len(walk) == 1 and walk[0]["status"] == MEASURED, walk
    ceiling = walk[0]["extra"]["ceiling"]
    assert set(ceiling) == {"mechanism", "system", "both"} and all(_num(x) and x > 0 for x in ceiling.values())
    assert "CEILING" in walk[0]["note"]


def test_walk_phases_scale_over_the_runs_and_give_the_hand_off_apart():
    """``bench.profile.walk_phases`` (the split ``--only oracle`` and the walk
    row print): the phases, the in-run loop included, add up to the walk's
    CPU per step (the scale is the wall inside the runs); the wall between
    the runs -- each run handed to the guard's worker thread and back -- is
    given apart, never a phase; the module's patches are undone.  No timing
    is asserted, only the bookkeeping."""
    from bench.profile import WALK_PHASES, walk_phases
    from memspec.invariants import walk as W
    from memspec.invariants.engine import Run

    before = (W._walk_once, Run.__dict__.get("apply"))
    m = walk_phases("mechanism", steps=60, run_length=20)
    assert (W._walk_once, Run.__dict__.get("apply")) == before
    assert m["steps"] >= 60 and not m["failures"] and not m["errors"]
    assert list(m["phases"]) == [label for label, _d in WALK_PHASES]
    assert math.isclose(sum(m["phases"].values()), m["cpu_us_per_step"], rel_tol=1e-6)
    assert _num(m["handoff_wall_us_per_step"]) and 0 <= m["handoff_wall_us_per_step"] <= m["wall_us_per_step"]


def test_phase_instructions_split_is_exclusive_and_less_the_wrappers():
    """``bench.phase_instructions.split``: inclusive counts of one process
    per phase become exclusive instructions per step (a phase less the
    phases it calls), each count less its calls times a wrapped no-op's
    instructions, and they add up to the whole run's."""
    from bench.phase_instructions import PHASES, split

    steps = 10
    inc = {"_walk_once": 1000, "choose": 300, "_spec_outcomes": 100, "apply": 500, "perform": 80, "check_after": 250,
           "check_invariants": 20, "check_observations": 90, "after_step": 60, "__init__": 70, "teardown": 10}
    assert set(inc) == set(PHASES)
    calls = dict.fromkeys(inc, 10)
    counts = {k: (v * steps + calls[k] * 7, calls[k], steps) for k, v in inc.items()}
    got = split(counts, 7.0)
    assert got["draw: guidance"] == 200 and got["draw: spec outcome sets"] == 100
    assert got["target call"] == 80 and got["spec + match"] == 500 - 80 - 250
    assert (got["invariants"], got["observations"], got["data integrity"]) == (20, 90, 60)
    assert got["check_after rest"] == 250 - 20 - 90 - 60 and got["walk loop"] == 1000 - 300 - 500 - 70 - 10
    assert math.isclose(sum(got.values()), 1000)
