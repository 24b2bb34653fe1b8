"""``memspec oom explain``: the parser (every PyTorch format), the triage, the inputs, the CLI, safety.

Format strings are those of PyTorch's c10/cuda/CUDACachingAllocator.cpp across versions
(1.0-1.4 ``cached``, 1.5-2.0 ``reserved in total by PyTorch``, 2.1-2.2 ``total capacty``,
2.3+ ``total capacity`` with private pools); messages below are built from them.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memspec.commands import oom as cli
from memspec.reference.caching_stats import format_size, pytorch_oom_message
from memspec.triage import oom as lib

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def close(got, want, unit):
    return got is not None and abs(got - want) <= 0.005 * unit + 1


# ---------------------------------------------------------------- formats

V10 = ("RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; "
       "8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)")
V13_INACTIVE = ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB (GPU 1; 7.94 GiB total capacity; "
                "7.33 GiB already allocated; 1.12 MiB free; 40.48 MiB cached; 3.00 MiB inactive)")
V1X = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.79 GiB total capacity; "
       "6.45 GiB already allocated; 11.69 MiB free; 6.56 GiB reserved in total by PyTorch)")
V1X_ALLOWED = ("RuntimeError: CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0; 39.59 GiB total capacity; "
               "9.50 GiB already allocated; 28.95 GiB free; 10.00 GiB allowed; 9.52 GiB reserved in total by PyTorch) "
               "If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")
V21 = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 has a total capacty of "
       "4.00 GiB of which 41.56 MiB is free. Including non-PyTorch memory, this process has 3.44 GiB memory in use. "
       "Of the allocated memory 2.58 GiB is allocated by PyTorch, and 1.90 MiB is reserved by PyTorch but "
       "unallocated.")
V23 = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 304.00 MiB. GPU 0 has a total capacity of "
       "94.97 GiB of which 218.81 MiB is free. Process 4242 has 1.50 GiB memory in use. Including non-PyTorch "
       "memory, this process has 93.84 GiB memory in use. 90.00 GiB allowed; Of the allocated memory 91.19 GiB is "
       "allocated by PyTorch, with 118.00 MiB allocated in private pools (e.g., CUDA Graphs), and 744.36 MiB is "
       "reserved by PyTorch but unallocated.")
SEED = ("CUDA out of memory. Tried to allocate 20 MiB (device 40 MiB; 40 MiB reserved; "
        "16 MiB is reserved but unallocated; largest free block 4 MiB)")
NIGHT = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 39.39 GiB of which "
         "1.10 GiB is free. Process 23187 has 27.30 GiB memory in use. Of the allocated memory 8.10 GiB is "
         "allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated.")
CONTAINER = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 546.00 MiB. GPU 0 has a total capacity "
             "of 15.77 GiB of which 514.19 MiB is free. Process 562167 has 15.25 GiB memory in use. Of the allocated "
             "memory 13.73 GiB is allocated by PyTorch, with 46.00 MiB allocated in private pools (e.g., CUDA "
             "Graphs), and 736.86 MiB is reserved by PyTorch but unallocated.")
GRAPH = ("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 39.39 GiB of which "
         "100.00 MiB is free. Of the allocated memory 38.50 GiB is allocated by PyTorch, with 1.40 GiB allocated "
         "in private pools (e.g., CUDA Graphs), and 20.00 MiB is reserved by PyTorch but unallocated.")
FULL = ("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which "
        "200.00 MiB is free. Of the allocated memory 22.00 GiB is allocated by PyTorch, and 30.00 MiB is "
        "reserved by PyTorch but unallocated.")


def test_pytorch_1_0_cached_is_reserved_but_unallocated():
    f = lib.parse(V10)
    assert f.kind == "pytorch-1.x-cached" and f.device == 0
    assert close(f.requested, 12.5 * MiB, MiB) and close(f.total, 10.92 * GiB, GiB)
    assert close(f.allocated, 8.57 * MiB, MiB) and close(f.free, 9.28 * GiB, GiB)
    assert close(f.reserved_unallocated, 4.68 * MiB, MiB)          # cached - allocated, per 1.0's format
    assert f.derived["reserved"] == "allocated + reserved_unallocated"
    g = lib.parse(V13_INACTIVE)
    assert close(g.reserved_unallocated, 40.48 * MiB, MiB) and g.device == 1


def test_pytorch_1x_reserved_and_allowed():
    f = lib.parse(V1X)
    assert f.kind == "pytorch-1.x" and f.other_processes is None   # 1.x cannot say
    assert close(f.reserved, 6.56 * GiB, GiB) and close(f.free, 11.69 * MiB, MiB)
    assert f.reserved_unallocated == f.reserved - f.allocated
    g = lib.parse(V1X_ALLOWED)
    assert close(g.allowed, 10 * GiB, GiB) and close(g.reserved, 9.52 * GiB, GiB)


def test_pytorch_2_1_capacty_spelling_and_this_process():
    f = lib.parse(V21)
    assert f.kind == "pytorch-2.x"
    assert close(f.total, 4 * GiB, GiB) and close(f.free, 41.56 * MiB, MiB)
    assert close(f.this_process, 3.44 * GiB, GiB) and f.other_processes == []


def test_pytorch_2_3_every_line():
    f = lib.parse(V23)
    assert close(f.allowed, 90 * GiB, GiB) and close(f.private_pools, 118 * MiB, MiB)
    assert close(f.this_process, 93.84 * GiB, GiB)
    assert [p for p, _ in f.other_processes] == [4242]              # 'this process' printed: the rest are others
    assert f.reserved == f.allocated + f.reserved_unallocated


def test_wrapped_lines_and_both_units():
    wrapped = ("RuntimeError: CUDA out of memory. Tried to allocate 226.00 MiB (GPU 0; 2.00 GiB total capacity;\n"
               "838.72 MiB already allocated; 122.43 MiB free; 944.00 MiB reserved in total by PyTorch)\n")
    f = lib.parse(wrapped)
    assert close(f.reserved, 944 * MiB, MiB) and close(f.allocated, 838.72 * MiB, MiB)
    g = lib.parse("CUDA out of memory. Tried to allocate 1.50 GB. GPU 0 has a total capacity of 8 GB of which 512 MB "
                  "is free. Of the allocated memory\n   6.5 GB is allocated by PyTorch, and 100 KB is reserved by\n"
                  "   PyTorch but unallocated.")
    assert (g.requested, g.free, g.reserved_unallocated) == (int(1.5 * GiB), 512 * MiB, 100 * KiB)


def test_seed_toy_format():
    f = lib.parse(SEED)
    assert (f.kind, f.requested, f.reserved_unallocated, f.largest_free_block) == ("seed", 20 * MiB, 16 * MiB, 4 * MiB)
    assert f.allocated == 24 * MiB and f.free == 0


def test_driver_tensorflow_jax_mps():
    assert lib.parse("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be ...").kind == "driver"
    assert lib.parse("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`").kind == "driver"
    f = lib.parse("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                  "17179869184 bytes.")
    assert f.kind == "tensorflow" and f.requested == 17179869184
    g = lib.parse("W bfc_allocator.cc:456] Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.22GiB "
                  "(rounded to 1310720000)")
    assert close(g.requested, 1.22 * GiB, GiB)
    m = lib.parse("RuntimeError: MPS backend out of memory (MPS allocated: 17.81 GB, other allocations: 1.02 GB, "
                  "max allowed: 18.13 GB). Tried to allocate 256.00 MB on private pool.")
    assert m.kind == "mps" and close(m.allowed, 18.13 * GiB, GiB) and close(m.requested, 256 * MiB, MiB)


def test_several_gpus_in_one_log():
    log = ("[rank1]: " + V1X.replace("GPU 0", "GPU 1") + "\n[rank0]: " + V21 + "\n")
    f = lib.parse(log)
    assert f.messages == 2 and f.devices == [0, 1]
    assert f.kind == "pytorch-2.x" and f.index == 2                # the last message (usually the fatal one)
    v = lib.triage(f)
    assert any("2 out-of-memory messages" in e and "GPUs 0, 1" in e for e in v.evidence)


def test_one_eb_overflow():
    f = lib.parse("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate more than 1EB memory.")
    v = lib.triage(f)
    assert v.cause == "does-not-fit" and "overflow" in v.evidence[-1]


# ------------------------------------------------------- round trip through PyTorch's format (property)

def _fmt_1x(tried, device, total, free, allocated, reserved, allowed):
    allowed_info = f"{format_size(allowed)} allowed; " if allowed is not None else ""
    return (f"CUDA out of memory. Tried to allocate {format_size(tried)} (GPU {device}; {format_size(total)} total "
            f"capacity; {format_size(allocated)} already allocated; {format_size(free)} free; {allowed_info}"
            f"{format_size(reserved)} reserved in total by PyTorch)")


def _tol(n):
    return 1 if n <= 1024 else 0.005 * (KiB if n < MiB else MiB if n < GiB else GiB) + 1


sizes = st.integers(0, 200 * GiB)


@settings(max_examples=150, deadline=None)
@given(tried=st.integers(1, 200 * GiB), total=st.integers(1, 200 * GiB), free=sizes, allocated=sizes,
       extra=st.integers(0, 50 * GiB), pools=st.integers(0, 5 * GiB), allowed=st.none() | sizes,
       procs=st.dictionaries(st.integers(1, 4_000_000), st.integers(1, 80 * GiB), max_size=4),
       device=st.integers(0, 15), old=st.booleans())
def test_every_figure_read_back_within_rounding(tried, total, free, allocated, extra, pools, allowed, procs, device,
                                                old):
    reserved = allocated + pools + extra
    if old:
        msg = _fmt_1x(tried, device, total, free, allocated, reserved, allowed)
        want = dict(requested=tried, total=total, free=free, allocated=allocated, reserved=reserved, allowed=allowed)
    else:
        msg = pytorch_oom_message(tried=tried, device=device, total=total, free=free, allocated=allocated,
                                  reserved=reserved, allowed=allowed, processes=procs, private_pools=pools)
        want = dict(requested=tried, total=total, free=free, allocated=allocated + pools,
                    reserved_unallocated=extra, allowed=allowed, private_pools=pools or None)
    f = lib.parse(msg)
    assert f.device == device
    for k, v in want.items():
        got = getattr(f, k)
        if v is None:
            assert got is None, (k, msg)
        else:
            assert got is not None and abs(got - v) <= _tol(v), (k, got, v, msg)
    if not old:
        assert [p for p, _ in f.process_lines] == sorted(procs)
        assert all(abs(u - procs[p]) <= _tol(procs[p]) for p, u in f.process_lines)


# ---------------------------------------------------------------- whose line is it

def test_container_own_line_is_this_process():
    f = lib.parse(CONTAINER)
    assert close(f.this_process, 15.25 * GiB, GiB) and f.other_processes == []
    assert "container" in f.self_pid_note
    v = lib.triage(f)
    assert v.cause != "other-processes"   # its own line must not be blamed on a co-tenant


def test_co_tenant_line_is_not_this_process():
    f = lib.parse(NIGHT)
    assert f.this_process is None and [p for p, _ in f.other_processes] == [23187]
    assert lib.triage(f).cause == "other-processes"


def test_pid_flag_decides():
    f = lib.parse(NIGHT, pid=23187)
    assert close(f.this_process, 27.3 * GiB, GiB) and f.other_processes == []


# ---------------------------------------------------------------- triage

@pytest.mark.parametrize("text,flags,cause", [
    (SEED, {}, "fragmentation"),
    (NIGHT, {}, "other-processes"),
    (GRAPH, {}, "graph-pools"),
    (FULL, {}, "does-not-fit"),
    (FULL, {"distributed": True}, "nccl"),
    (FULL, {"cudnn_benchmark": True}, "cudnn-workspace"),
    (V1X, {}, "does-not-fit"),
    ("CUDA out of memory. Tried to allocate 55.57 GiB. GPU 0 has a total capacty of 12.00 GiB of which 9.02 GiB "
     "is free. Of the allocated memory 984.52 MiB is allocated by PyTorch, and 463.48 MiB is reserved by PyTorch "
     "but unallocated.", {}, "does-not-fit"),
    ("RuntimeError: CUDA error: out of memory", {}, "does-not-fit"),   # presumed, and said so
    ("NCCL WARN Cuda failure 'out of memory'", {}, "nccl"),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED", {}, "cudnn-workspace"),
])
def test_triage(text, flags, cause):
    v = lib.triage(lib.parse(text), **flags)
    assert v.cause == cause, v.evidence
    assert v.evidence and v.next_steps


def test_request_larger_than_card_says_so_and_never_suggests_expandable():
    v = lib.triage(lib.parse("CUDA out of memory. Tried to allocate 48.01 GiB (GPU 0; 15.78 GiB total capacity; "
                             "4.00 GiB already allocated; 10.75 GiB free; 4.00 GiB reserved in total by PyTorch)"))
    assert v.cause == "does-not-fit" and "> total 15.78 GiB" in v.evidence[-1]
    assert not any("expandable" in s for s in v.next_steps)
    w = lib.triage(lib.parse("... cudnn_convolution ... CUDA out of memory. Tried to allocate 48.01 GiB (GPU 0; "
                             "15.78 GiB total capacity; 4.00 GiB already allocated; 10.75 GiB free; 4.00 GiB "
                             "reserved in total by PyTorch)"))
    assert w.cause == "cudnn-workspace" and "benchmark=False" in w.next_steps[0]


def test_a_bare_runtime_error_is_presumed_and_says_so():
    """No figures at all: the commonest cause, labelled 'presumed', with the co-tenant check second."""
    v = lib.triage(lib.parse("RuntimeError: CUDA error: out of memory"))
    assert v.cause == "does-not-fit" and any(e.startswith("presumed") for e in v.evidence)
    assert "batch" in v.next_steps[0] and "nvidia-smi" in v.next_steps[1]


def test_unknown_names_what_is_missing():
    v = lib.triage(lib.parse("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                             "39.39 GiB of which 1.10 GiB is free."))
    assert v.cause == "unknown" and any("missing:" in e and "reserved" in e for e in v.evidence)


def test_evidence_carries_the_arithmetic():
    v = lib.triage(lib.parse(FULL))
    assert any("requested 512.00 MiB > free 200.00 MiB + reserved-but-unallocated 30.00 MiB = 230.00 MiB" in e
               for e in v.evidence), v.evidence


@settings(max_examples=300, deadline=None)
@given(tried=st.integers(1, 64 * GiB), total=st.integers(GiB, 96 * GiB), free=st.integers(0, 96 * GiB),
       allocated=st.integers(0, 96 * GiB), extra=st.integers(0, 16 * GiB), pools=st.integers(0, 4 * GiB),
       procs=st.dictionaries(st.integers(1, 99999), st.integers(1, 40 * GiB), max_size=3),
       flags=st.fixed_dictionaries({"distributed": st.booleans(), "cudnn_benchmark": st.booleans(),
                                    "cuda_graphs": st.booleans()}))
def test_no_step_the_figures_rule_out(tried, total, free, allocated, extra, pools, procs, flags):
    """Expandable segments are never advised for a request larger than free + reserved-but-unallocated;
    killing co-tenants is never the first step when none holds memory; the cause is a known id."""
    msg = pytorch_oom_message(tried=tried, device=0, total=total, free=free, allocated=allocated,
                              reserved=allocated + pools + extra, processes=procs, private_pools=pools)
    f = lib.parse(msg)
    v = lib.triage(f, **flags)
    assert v.cause in lib.CAUSES
    floor = {20 * MiB: MiB + 512, 2 * MiB: 512}.get(f.requested, f.requested)
    if floor > f.free + f.reserved_unallocated:
        assert not any("expandable_segments" in s or "max_split_size" in s for s in v.next_steps), (msg, v)
    if v.cause == "other-processes" and f.other_processes is not None:
        assert sum(u for _, u in f.other_processes) > 0 or f.this_process is not None
    if v.cause == "does-not-fit":
        assert "batch" in v.next_steps[0] or "shrink" in v.next_steps[0]


# ---------------------------------------------------------------- other inputs

STATS = {"allocated_bytes.all.current": 6 * GiB, "reserved_bytes.all.current": 9 * GiB,
         "inactive_split_bytes.all.current": 2 * GiB, "num_ooms": 1, "num_alloc_retries": 3}


@pytest.mark.parametrize("text", [
    json.dumps(STATS), repr(STATS),
    "OrderedDict([" + ", ".join(f"({k!r}, {v})" for k, v in STATS.items()) + "])",
])
def test_memory_stats_forms(text):
    assert lib.parse_memory_stats(text) == STATS


def test_memory_stats_fill_what_the_message_lacks():
    f = lib.parse("RuntimeError: CUDA error: out of memory")
    lib.apply_memory_stats(f, STATS)
    assert (f.allocated, f.reserved, f.reserved_unallocated) == (6 * GiB, 9 * GiB, 3 * GiB)
    assert any("reserved/allocated = 1.50" in e for e in lib.triage(f).evidence)


@pytest.mark.parametrize("text", ["__import__('os').system('touch PWNED')", "{'a': (lambda: 1)()}", "[1, 2",
                                  "{'x': 1}", "'a' * 10**9", "x" * (5 << 20)])
def test_memory_stats_refused_never_evaluated(text, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError):
        lib.parse_memory_stats(text)
    assert not (tmp_path / "PWNED").exists()


def test_nvidia_smi_forms_and_self():
    csv_text = "pid, used_memory [MiB]\n1234, 27955 MiB\n5678, 1024 MiB\n"
    assert lib.parse_nvidia_smi(csv_text) == [(1234, 27955 * MiB), (5678, 1024 * MiB)]
    assert lib.parse_nvidia_smi("1234, 27955\n5678, 1024\n") == [(1234, 27955 * MiB), (5678, 1024 * MiB)]
    assert lib.parse_nvidia_smi("pid, process_name, used_gpu_memory [MiB]\n77, python, 512 MiB\n") == [(77, 512 * MiB)]
    f = lib.parse(V21)          # 'this process has 3.44 GiB'
    lib.apply_nvidia_smi(f, lib.parse_nvidia_smi("pid, used_memory [MiB]\n11, 3523 MiB\n12, 900 MiB\n"))
    assert [p for p, _ in f.other_processes] == [12]   # 3523 MiB ~ 3.44 GiB is this process
    with pytest.raises(ValueError):
        lib.parse_nvidia_smi("pid, used_memory [MiB]\nabc, 12 MiB\n")
    with pytest.raises(ValueError):
        lib.parse_nvidia_smi("pid, name\n1, x\n")


# ---------------------------------------------------------------- CLI

def test_json_exact_shape_and_bytes(capsys):
    assert cli.main(["explain", "--json", NIGHT]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"parsed", "cause", "evidence", "next_steps", "stack", "binding_limit", "warnings", "truncated",
            "messages", "triaged_message"} == set(out)
    assert out["stack"] == "pytorch-cuda" and out["binding_limit"].startswith("the device's total capacity")
    assert set(out["parsed"]) <= set(lib.FIGURES) and "this_process" not in out["parsed"]
    assert out["parsed"]["requested"] == 2 * GiB and out["parsed"]["other_processes"][0]["pid"] == 23187
    assert out["cause"] == "other-processes" and all(isinstance(s, str) for s in out["next_steps"])
    assert cli.main(["explain", "--json", "RuntimeError: CUDA error: out of memory"]) == 0
    assert json.loads(capsys.readouterr().out)["parsed"] == {}


def test_cli_inputs(tmp_path, capsys, monkeypatch):
    msg = tmp_path / "m.txt"
    msg.write_text("RuntimeError: CUDA error: out of memory\n")
    stats = tmp_path / "s.txt"
    stats.write_text(repr(STATS))
    smi = tmp_path / "smi.csv"
    smi.write_text("pid, used_memory [MiB]\n1, 9500 MiB\n2, 20000 MiB\n")
    assert cli.main(["explain", "--json", "--file", str(msg), "--memory-stats", str(stats), "--nvidia-smi", str(smi),
                     "--pid", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parsed"]["reserved"] == 9 * GiB and out["parsed"]["other_processes"] == [{"pid": 2, "used": 20000 * MiB}]
    assert out["parsed"]["this_process"] == 9500 * MiB
    import io
    import sys
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(FULL.encode())))
    assert cli.main(["explain", "--distributed"]) == 0
    assert "verdict: nccl" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["explain", "--pid", "-3", FULL])


def test_cli_errors_are_named_and_exit_2(tmp_path, capsys):
    b = tmp_path / "garbage.bin"
    b.write_bytes(bytes(range(256)) * 64)
    assert cli.main(["explain", "--file", str(b)]) == 2
    assert "not" in capsys.readouterr().err
    assert cli.main(["explain", "hello world"]) == 2
    assert "not an out-of-memory message" in capsys.readouterr().err
    assert cli.main(["explain", "--file", str(tmp_path / "missing.txt")]) == 2
    bad = tmp_path / "stats.txt"
    bad.write_text("__import__('os')")
    assert cli.main(["explain", "--memory-stats", str(bad), FULL]) == 2


def test_snapshot_path_still_answers_the_seed_question(tmp_path, capsys):
    from memspec.commands import snapshot as snapshot_cmd
    from memspec.reference import caching_snapshot as cs

    p = tmp_path / "snap.pickle"
    cs.dump(snapshot_cmd.fragmented_demo("seed").snapshot(), str(p))
    assert cli.main(["explain", "--snapshot", str(p)]) == 0
    out = capsys.readouterr().out
    assert "verdict: fragmentation" in out and "would expandable segments have avoided this OOM? YES" in out


# ---------------------------------------------------------------- untrusted input

def test_binary_garbage_is_a_clear_error():
    with pytest.raises(lib.BinaryInput):
        lib.parse(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(lib.BinaryInput):
        lib.parse(b"CUDA out of memory \xff\xfe")
    with pytest.raises(lib.BinaryInput):
        lib.parse("\x01\x02\x03" * 100 + "CUDA out of memory")


def test_runs_of_digits_finish_with_a_clear_result():
    """Issue 15 item 9: patterns began with an unanchored number (quadratic).  No timing here:
    10 MB of digits must simply come back, refused as not an OOM, or with an unreadable size."""
    with pytest.raises(lib.NotAnOOM):
        lib.parse("7" * 10_000_000)
    f = lib.parse("CUDA out of memory. Tried to allocate " + "9" * 100_000 + " MiB (GPU 0; " + "1" * 100_000
                  + " GiB total capacity; 2 GiB already allocated; 3 GiB free; 4 GiB reserved in total by PyTorch)")
    assert f.requested is None and f.total is None          # numbers longer than any real figure are not read
    assert (f.allocated, f.free, f.reserved) == (2 * GiB, 3 * GiB, 4 * GiB)
    assert lib.triage(f).cause in lib.CAUSES


def test_crafted_message_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    evil = ("CUDA out of memory. Tried to allocate __import__('os').system('touch PWNED') MiB; "
            "{'__class__': 1} eval(exec('open(\"PWNED\",\"w\")'))")
    f = lib.parse(evil)
    lib.triage(f)
    assert not (tmp_path / "PWNED").exists() and f.requested is None


def test_fmt_matches_pytorch_format_size():
    for n in (0, 1024, 1025, 5 * MiB, 3 * GiB + 7, 2 ** 45):
        assert lib.fmt(n) == format_size(n) or (n >= 2 ** 40 and lib.fmt(n).endswith("TiB"))
    assert not math.isnan(0.0)


def test_huge_logs_read_a_bounded_part_and_say_so():
    log = (FULL + "\n") * (2 * lib.MAX_READ // len(FULL))
    f = lib.parse(log)
    assert f.unread > 0 and f.messages > 100
    v = lib.triage(f)
    assert v.cause == "does-not-fit" and any("were not" in e for e in v.evidence)


def test_a_binding_memory_fraction_is_named_first():
    v = lib.triage(lib.parse(V1X_ALLOWED))
    assert v.cause == "memory-fraction" and "set_per_process_memory_fraction" in v.next_steps[0]
    assert any(e.startswith("binding limit: the per-process memory fraction") for e in v.evidence)
    assert not any("expandable" in s for s in v.next_steps)


def test_cli_on_100kb_of_digits_answers_and_exits_2(capsys):
    """Issue 15 item 9 through the command: 100 KB of digits is refused at once with a clear message."""
    assert cli.main(["explain", "9" * 100_000]) == 2
    assert "not an out-of-memory message" in capsys.readouterr().err
    assert cli.main(["explain", "--json", "CUDA out of memory. Tried to allocate " + "9" * 100_000 + " MiB"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cause"] == "unknown" and "requested" not in out["parsed"]


def test_the_triage_library_imports_no_cli_and_no_memspec_module():
    """memspec/triage is a library: the CLI calls it, it never calls back (stdlib only)."""
    import ast
    import pathlib

    src = pathlib.Path(lib.__file__)
    for path in src.parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("memspec"), (path.name, node.module)
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("memspec") for a in node.names), path.name


def test_a_card_full_of_graph_pools_is_graph_pools_not_does_not_fit():
    v = lib.triage(lib.parse(
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 47.53 GiB of "
        "which 896.00 KiB is free. Process 1686436 has 47.51 GiB memory in use. Of the allocated memory 47.00 GiB is "
        "allocated by PyTorch, with 46.22 GiB allocated in private pools (e.g., CUDA Graphs), and 149.10 MiB is "
        "reserved by PyTorch but unallocated."))
    assert v.cause == "graph-pools" and "graph" in v.next_steps[0]


def test_snapshot_that_loads_but_cannot_be_replayed_is_said_not_a_traceback(tmp_path, capsys):
    """A plain-data snapshot with traces but no segments: the replay cannot size a device.
    The verdict must still print, with the reason the expandable-segments replay was skipped."""
    import pickle

    p = tmp_path / "noseg.pickle"
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 0, "size": 512, "stream": 0}]]}))
    assert cli.main(["explain", "--snapshot", str(p)]) == 0
    out = capsys.readouterr().out
    assert "replay not possible" in out and "capacity" in out
