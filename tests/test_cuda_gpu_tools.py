"""The GPU run's steps (tests/gpu/gpu_tool.py, tests/gpu/run.sh) exercised on
the host emulator, so the script a GPU runner executes is itself tested here."""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "gpu"))

import gpu_tool  # noqa: E402

from memspec.cuda_impl.targets import cuda_host  # noqa: E402
from memspec.invariants.mutants.cuda_bugs import leaky_cuda_host  # noqa: E402

G = 2 << 20


def test_differential_replay_agrees_between_two_emulators():
    assert gpu_tool.differential("cuda-host", seed=3, length=600)


def test_differential_replay_exposes_the_leak_mutant():
    trace = gpu_tool.make_trace(3, 600)
    good, bad = cuda_host(48 * G), leaky_cuda_host(48 * G)
    try:
        a, b = gpu_tool.replay(good, trace), gpu_tool.replay(bad, trace)
    finally:
        good.close()
        bad.close()
    diff = [(x, y) for x, y in zip(a, b) if x != y]
    assert diff, "the leaking mechanism replayed exactly like the healthy one"
    assert any(x[0] == "physical" or y[2] == "OutOfMemory" for x, y in diff)


def test_gate_leak_and_info_steps_on_the_emulator():
    assert gpu_tool.gate("cuda-host")
    assert gpu_tool.leak("cuda-host", rounds=8)
    out = gpu_tool.info("cuda-host")
    assert out["driver"] == "cuda-host" and out["granularity_min"] == G


def test_latency_table_on_the_emulator():
    rows = gpu_tool.latency("cuda-host", reps=2, sizes=(1, 8))
    assert [r["pages"] for r in rows] == [1, 8]
    assert all(r["commit_us"] > 0 and r["raw_decommit_us"] > 0 for r in rows)


def test_run_sh_plan():
    out = subprocess.run(["bash", os.path.join(HERE, "gpu", "run.sh"), "--dry-run", "--plan"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for step in ("info", "conform", "differential", "gate", "leak", "latency", "pytest"):
        assert f"  {step}" in out.stdout
    assert "target cuda-host" in out.stdout and "conform cuda-host" in out.stdout
