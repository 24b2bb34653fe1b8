"""The CUDA implementation on a real driver (skipped without one; see conftest)."""

from __future__ import annotations

import gpu_tool
import pytest

from memspec.cuda_impl.targets import cuda
from memspec.spec.api import ReserveRequest
from memspec.spec.errors import OutOfMemory


def test_granularity_reported():
    out = gpu_tool.info("cuda")
    assert out["driver"] == "cuda"
    g = out["granularity_min"]
    assert g > 0 and g & (g - 1) == 0


def test_differential_replay_emulator_vs_driver():
    assert gpu_tool.differential("cuda", length=2000)


def test_stream_gate_fence():
    assert gpu_tool.gate("cuda")


def test_leak_check_memory_back_to_baseline():
    assert gpu_tool.leak("cuda")


def test_capacity_limit_gives_out_of_memory():
    inst = cuda(64 << 20)
    try:
        vb = inst.mechanism.virtual_backing()
        g = vb.granularity()
        va = vb.reserve(ReserveRequest(256 << 20))
        with pytest.raises(OutOfMemory):
            vb.commit_range(va, 0, va.size)
        assert vb.committed_bytes(va) == 0 and inst.physical_bytes() < g
        vb.release(va)
    finally:
        inst.close()


def test_latency_table_runs():
    rows = gpu_tool.latency("cuda", reps=10)
    assert [r["pages"] for r in rows] == [1, 8, 64]
    assert all(r["commit_us"] > 0 and r["raw_commit_us"] > 0 for r in rows)
