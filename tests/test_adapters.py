"""Real allocators under the suite (issue 14): cuda.core's VirtualMemoryResource
on the host emulator, C plugins through the C ABI, and the GPU-only adapters
(skipped here with the reason)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memspec.adapters._common import TargetUnavailable
from memspec.invariants import runner
from memspec.invariants.discovery import resolve
from memspec.spec.api import AllocationRequest, MiB
from memspec.spec.errors import DoubleFree, ForeignAllocation, InvalidRequest

ROOT = Path(__file__).resolve().parent.parent
C_DIR = ROOT / "adapters" / "c"


@pytest.fixture
def host_driver(monkeypatch):
    """cuda-core-vmm on the host emulator, also on a machine with a GPU."""
    monkeypatch.setenv("MEMSPEC_CUDA_DRIVER", "host")


def _failures(results):
    return {(r.level, f.invariant, f.cause) for r in results for f in r.failures}


# --------------------------------------------------------------------------
# cuda-core-vmm on the host emulator
# --------------------------------------------------------------------------

def test_cuda_core_vmm_conform_reports_the_leak_as_s5(host_driver, tmp_path):
    results = runner.conform("cuda-core-vmm", "mechanism", examples=15, steps=15, out_dir=str(tmp_path))
    assert [r.level for r in results] == ["mechanism"] and not results[0].errors
    # judged by Hypothesis itself: the emulator answers the same calls the same way in every example
    # (a run Hypothesis cannot replay is judged by walks instead, with a note naming the step answered
    # differently -- see tests/test_harness_replay_consistency.py)
    assert not results[0].notes, results[0].notes
    every = results[0].failures
    # the second finding: cuda.core's allocate takes no alignment, so an alignment above the
    # granularity is not honoured (an S8 outcome naming the alignment), reached since the
    # harness draws alignments from the spec
    others = [f for f in every if (f.invariant, f.cause) != ("S5", "observation")]
    assert all((f.invariant, f.cause) == ("S8", "outcome") and "alignment" in f.reason for f in others), others
    fails = [f for f in every if (f.invariant, f.cause) == ("S5", "observation")]
    assert len(fails) == 1, every
    assert "physical bytes" in fails[0].reason
    # the shortest counterexample is allocate then deallocate (2 steps)
    assert 2 <= fails[0].shrunk_length <= 4
    statuses = {inv: st for inv, _t, st, _d in results[0].rows()}
    assert statuses["S1"] == "PASS" and statuses["S14"] == "PASS"
    assert statuses["S12"] == "N/A" and statuses["S13"] == "N/A"   # no VirtualBacking/SharedMapping


def test_cuda_core_vmm_verdict_does_not_depend_on_where_the_emulator_maps(host_driver, monkeypatch):
    """The cause of the FlakyStrategyDefinition the leak test above was once xfailed for (d1697ae):
    in a long-lived xdist worker the emulator's reservations (``mmap``) land elsewhere from one
    example to the next than in a fresh process; the adapter passed an alignment above the
    granularity on without it, so whether the address was 4 or 8 MiB-aligned -- an S8 verdict --
    changed between two runs of the same steps, and Hypothesis found the same choices ending at
    different steps.  With the reservations moved as below, d1697ae's harness gave that very error
    in 3 of 3 runs (0 of 2 without the move, 0 of 2 with the move and such alignments refused).  The
    adapter refuses them now (``max_alignment``): the verdict is the same wherever they land."""
    import itertools

    from memspec.cuda_impl import hostdrv_memory as HM

    reserve, free = HM._MemoryCalls.cuMemAddressReserve, HM._MemoryCalls.cuMemAddressFree
    spread = itertools.count()

    def elsewhere(self, size, alignment, addr, flags):
        # 1..4 granules of address space taken first, then given back: the reservation lands
        # 0, 2, 4 or 6 MiB past an 8 MiB boundary, in turn
        k = next(spread) % 4 + 1
        _res, taken = reserve(self, k * self.granularity, 0, 0, 0)
        got = reserve(self, size, alignment, addr, flags)
        free(self, taken, k * self.granularity)
        return got

    monkeypatch.setattr(HM._MemoryCalls, "cuMemAddressReserve", elsewhere)
    results = runner.conform("cuda-core-vmm", "mechanism", examples=15, steps=15, out_dir=None)
    assert [r.level for r in results] == ["mechanism"] and not results[0].errors and not results[0].notes, \
        (results[0].errors, results[0].notes)
    every = results[0].failures
    assert [(f.invariant, f.cause) for f in every] == [("S5", "observation")], every
    assert "physical bytes" in every[0].reason


def test_cuda_core_vmm_translates_errors_and_refuses_bad_handles(host_driver):
    from memspec.adapters.cuda_core import cuda_core_vmm

    inst = cuda_core_vmm()
    try:
        a = inst.mechanism.allocator()
        for bad in (0, -2 * MiB, 1.5, "4096"):
            with pytest.raises(InvalidRequest):
                a.allocate(AllocationRequest(bad))
        x = a.allocate(AllocationRequest(3 * MiB))
        assert x.size == 3 * MiB and x.footprint == 4 * MiB and x.address % (2 * MiB) == 0
        twin = inst.extras["make_foreign"]().allocator()
        with pytest.raises(ForeignAllocation):
            twin.deallocate(x)
        assert a.deallocate(x) == 4 * MiB
        with pytest.raises(DoubleFree):
            a.deallocate(x)
    finally:
        inst.close()


def test_cuda_core_injection_is_undone():
    import cuda.core._memory._virtual_memory_resource as vmr
    import cuda.core._stream as cstream
    from cuda.bindings import driver as real

    from memspec.adapters.cuda_core import HostBuffer, cuda_core_driver
    from memspec.cuda_impl.hostdrv import HostDriver

    before = (vmr.driver, vmr.Buffer, vmr.raise_if_driver_error, cstream.Stream_accept)
    assert before[0] is real
    emu = HostDriver()
    emu.cuInit(0)
    with cuda_core_driver(emu, host=True):
        assert vmr.Buffer is HostBuffer and vmr.driver is not real
        assert vmr.driver.cuMemGetInfo == emu.cuMemGetInfo
        assert vmr.driver.CUresult is real.CUresult
    assert (vmr.driver, vmr.Buffer, vmr.raise_if_driver_error, cstream.Stream_accept) == before


def test_cuda_core_vmm_findings_reproduce_on_the_emulator(host_driver):
    from memspec.adapters import cuda_core_checks as chk

    leak = chk.leak(4 * MiB)
    assert leak["held_after_allocate"] == 4 * MiB and leak["held_after_deallocate"] == 4 * MiB
    s = chk.stream()
    assert s["fence_pending_at_release"] and not s["mapped_after_deallocate"]
    assert "ILLEGAL_ADDRESS" in s["queued_copy"]
    g = chk.grow()
    assert g["moved"] and g["buffer_size_after_grow"] == 5 * MiB and g["held_after_grow"] == 6 * MiB
    assert "INVALID_VALUE" in g["deallocate_after_grow"]


def test_findings_reproductions_run_standalone():
    env = {**os.environ, "MEMSPEC_CUDA_DRIVER": "host"}
    scripts = sorted((ROOT / "docs" / "findings").glob("cuda_core_vmm_*.py"))
    assert [p.name for p in scripts] == ["cuda_core_vmm_grow.py", "cuda_core_vmm_leak.py", "cuda_core_vmm_stream.py"]
    for script in scripts:
        p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 1 and "REPRODUCED" in p.stdout, (script.name, p.stdout, p.stderr)


# --------------------------------------------------------------------------
# C plugins
# --------------------------------------------------------------------------

def _cc() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@pytest.fixture(scope="module")
def arena_libs(tmp_path_factory):
    cc = _cc()
    if cc is None:
        pytest.skip("no C compiler (cc/gcc) on this machine")
    out = tmp_path_factory.mktemp("cplugins")
    libs = {}
    for name, flags in (("ok", []), ("broken", ["-DMEMSPEC_BROKEN_DOUBLE_FREE"]), ("vmm", ["-DMEMSPEC_EXAMPLE_VMM"])):
        lib = out / f"libarena_{name}.so"
        subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", f"-I{C_DIR}", *flags, "-o", str(lib),
                        str(C_DIR / "example_arena.c")], check=True, capture_output=True, timeout=120)
        libs[name] = lib
    return libs


def test_c_example_arena_passes_the_suite(arena_libs):
    results = runner.conform(f"c:{arena_libs['ok']}", "all", examples=25, steps=25, out_dir=None)
    assert [r.level for r in results] == ["mechanism", "system"]
    for r in results:
        assert r.ok and not r.errors, (r.level, r.errors, [(f.invariant, f.reason) for f in r.failures])
        assert r.stats.steps > 0
    statuses = {inv: st for inv, _t, st, _d in results[0].rows()}
    assert statuses["S14"] == "PASS" and statuses["S5"] == "PASS"


def test_c_example_with_virtual_backing_passes_the_suite(arena_libs):
    # 60 runs: the coverage-aware verdict needs decommit_owned to succeed 3 times for S12 to be a PASS
    results = runner.conform(f"c:{arena_libs['vmm']}", "all", examples=60, steps=25, out_dir=None)
    assert [r.level for r in results] == ["mechanism", "system"]
    for r in results:
        assert r.ok and not r.errors, (r.level, r.errors, [(f.invariant, f.reason) for f in r.failures])
    acts = results[0].stats.actions
    for a in ("reserve", "commit_range", "decommit_range", "committed_bytes", "release_reservation"):
        assert acts[a] > 0, acts
    statuses = {inv: st for inv, _t, st, _d in results[1].rows()}
    # applicable (VirtualBacking present: never N/A) and never FAIL; at this budget a rare
    # branch may leave a row UNTESTED, which the coverage-aware verdict reports honestly
    assert statuses["S12"] in ("PASS", "UNTESTED") and statuses["S9"] in ("PASS", "UNTESTED"), statuses


def test_c_broken_twin_is_caught_with_the_expected_blame(arena_libs):
    results = runner.conform(f"c:{arena_libs['broken']}", "mechanism", examples=60, steps=25, out_dir=None)
    fails = [(f.invariant, f.cause) for r in results for f in r.failures]
    assert fails == [("S14", "outcome")], fails
    f = results[0].failures[0]
    # shortest possible: allocate, deallocate, deallocate (the shrinker may stop a step or two above)
    assert "deallocate" in f.reason and "DoubleFree" in f.reason and 3 <= f.shrunk_length <= 6


def test_c_loader_maps_status_codes(arena_libs):
    inst = resolve(f"c:{arena_libs['ok']}").factory(capacity=8 * MiB)
    try:
        a = inst.mechanism.allocator()
        assert inst.mechanism.virtual_backing() is None and inst.mechanism.shared_mapping() is None
        with pytest.raises(InvalidRequest):
            a.allocate(AllocationRequest(0))
        with pytest.raises(InvalidRequest):
            a.allocate(AllocationRequest(1.5))
        x = a.allocate(AllocationRequest(1000))
        assert x.footprint == 1024 and inst.physical_bytes() == 1024
        data = b"memspec" * 10
        inst.ep.write(0, x.address, data)
        assert inst.ep.read(0, x.address, len(data)) == data
        assert a.deallocate(x) == 1024 and inst.physical_bytes() == 0
        with pytest.raises(DoubleFree):
            a.deallocate(x)
    finally:
        inst.close()


def test_c_loader_refuses_a_library_without_the_entry_point(tmp_path):
    cc = _cc()
    if cc is None:
        pytest.skip("no C compiler (cc/gcc) on this machine")
    src = tmp_path / "notaplugin.c"
    src.write_text("int answer(void) { return 42; }\n")
    lib = tmp_path / "libnot.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True, timeout=60)
    with pytest.raises(LookupError, match="memspec_plugin_v1"):
        resolve(f"c:{lib}")
    with pytest.raises(LookupError, match="cannot load"):
        resolve(f"c:{tmp_path / 'missing.so'}")


# --------------------------------------------------------------------------
# GPU-only adapters: listed as unavailable with the reason; run on a GPU
# --------------------------------------------------------------------------

GPU_ONLY = ["cuda-core-mr", "cupy-pool", "torch-caching"]


def _available(target: str) -> None:
    """Skip with the target's own reason when it cannot run here."""
    try:
        inst = resolve(target).factory()
    except TargetUnavailable as e:
        pytest.skip(str(e))
    if inst.close:
        inst.close()


@pytest.mark.gpu
@pytest.mark.parametrize("target", GPU_ONLY)
def test_gpu_adapter_runs_the_suite(target):
    _available(target)
    results = runner.conform(target, "all", examples=5, steps=10, out_dir=None)
    assert results and not any(r.errors for r in results), [r.errors for r in results]
    assert all(r.stats.steps > 0 for r in results)


@pytest.mark.gpu
def test_torch_differential_on_gpu():
    _available("torch-caching")
    from memspec.adapters import torch_differential as d

    assert d.main(["--length", "200"]) in (0, 1)  # 1: a difference, printed for docs/FINDINGS.md


def test_targets_lists_unavailable_adapters_with_the_reason():
    out = subprocess.run([sys.executable, "-m", "memspec", "targets"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "400", "MEMSPEC_CUDA_DRIVER": "host"})
    assert out.returncode == 0, out.stderr
    lines = {ln.split("│")[1].strip(): ln for ln in out.stdout.splitlines() if ln.count("│") > 3}
    for t in GPU_ONLY + ["cuda-core-vmm"]:
        assert t in lines, out.stdout
    assert "available" in lines["cuda-core-vmm"] and "unavailable" not in lines["cuda-core-vmm"]
    for t in GPU_ONLY:
        try:
            resolve(t).factory().close()
            continue  # runs here (a GPU machine)
        except TargetUnavailable as e:
            assert "unavailable" in lines[t], lines[t]
            words = " ".join(out.stdout.replace("│", " ").split())
            assert all(w in words for w in str(e).split()[:6]), (str(e), lines[t])


def test_torch_differential_dry_run_and_compare():
    from memspec.adapters import torch_differential as d

    steps = d.trace(120, 3, 256 * MiB)
    assert steps == d.trace(120, 3, 256 * MiB)   # seeded
    side = d.PresetSide(256 * MiB)
    recs = d.replay(side, steps)
    assert len(recs) == len(steps) and d.compare(steps, recs, recs) is None
    changed = [dict(r) for r in recs]
    changed[7]["num_alloc_retries"] += 1
    assert d.compare(steps, recs, changed) == (7, ["num_alloc_retries"])
    assert d.main(["--dry-run", "--length", "50"]) == 0
