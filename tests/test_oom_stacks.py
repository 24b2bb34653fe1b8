"""Issue 34: the stack and its binding limit first; every format's figures; the adversarial inputs.

Messages here are built from the formats the stacks print (the corpus holds the real ones, with sources)."""

from __future__ import annotations

import json

import pytest

from memspec.commands import oom as cli
from memspec.triage import oom as lib

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

OOM2X = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req}. GPU 0 has a total capacity of "
         "23.65 GiB of which {free} is free. {procs}Of the allocated memory {alloc} is allocated by PyTorch, and "
         "{ru} is reserved by PyTorch but unallocated.")


def msg(req="512.00 MiB", free="200.00 MiB", alloc="22.00 GiB", ru="30.00 MiB", procs=""):
    return OOM2X.format(req=req, free=free, alloc=alloc, ru=ru, procs=procs)


def test_a_2mb_log_with_one_oom_inside_is_found():
    line = "2026-01-01 12:00:00 INFO step 1234 loss 0.1234 lr 3e-4 allocated 21.90 GiB reserved 23.00 GiB\n"
    log = line * (1_000_000 // len(line)) + msg() + "\n" + line * (1_000_000 // len(line))
    assert len(log) > 2_000_000
    f = lib.parse(log)
    assert f.messages == 1 and f.requested == 512 * MiB and f.stack == "pytorch-cuda"
    assert lib.triage(f).cause == "does-not-fit"


def test_two_ooms_all_listed_the_last_triaged_and_any_selectable():
    first = msg(req="20.00 MiB", free="2.00 GiB", alloc="1.00 GiB", ru="10.00 MiB",
                procs="Process 4242 has 20.00 GiB memory in use. ")
    last = msg()
    f = lib.parse("epoch 1\n" + first + "\n... retrying with a larger batch ...\n" + last + "\n")
    assert f.messages == 2 and f.index == 2 and f.requested == 512 * MiB
    assert [s["requested"] for s in f.summaries] == [20 * MiB, 512 * MiB]
    v = lib.triage(f)
    assert any("2 out-of-memory messages" in e and "triaged: #2" in e for e in v.evidence)
    g = lib.parse(first + "\n" + last, which=1)
    assert g.index == 1 and lib.triage(g).cause == "other-processes"
    with pytest.raises(ValueError):
        lib.parse(first, which=3)


def test_a_truncated_paste_is_flagged():
    cut = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 6 has a total capacity of 44.53 GiB"
    f = lib.parse(cut)
    assert f.truncated and any(w.startswith("truncated") for w in f.warnings)
    v = lib.triage(f)
    assert v.evidence[0].startswith("WARNING: truncated")
    assert not lib.parse(msg()).truncated
    g = lib.parse("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.79 GiB total capacity; "
                  "6.45 GiB already allocated; 11.6")
    assert g.truncated


@pytest.mark.parametrize("text", [
    "RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not enough memory: you tried to "
    "allocate 2183135232 bytes.",
    "Resource exhausted: OOM when allocating tensor with shape[64,416,416,3] and type float on "
    "/job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu",
    "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 3.43 GiB for an array with shape (1000, 460800) "
    "and data type float64",
])
def test_host_ram_is_triaged_as_host_memory_not_gpu(text):
    f = lib.parse(text)
    v = lib.triage(f)
    assert f.stack == "host" and v.cause == "host-memory"
    assert "RAM" in v.next_steps[0] and not any("nvidia-smi" in s or "PYTORCH_CUDA_ALLOC_CONF" in s
                                                for s in v.next_steps)


def test_a_mistyped_unit_and_a_1000x_figure_are_flagged():
    f = lib.parse(msg(alloc="22.00 GB", ru="30.00 MB"))
    assert any(w.startswith("unit ambiguity") for w in f.warnings)
    g = lib.parse("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.79 MiB total capacity; 6.45 GiB "
                  "already allocated; 11.69 MiB free; 6.56 GiB reserved in total by PyTorch)")
    assert any("inconsistent figures" in w and "unit typed wrong" in w for w in g.warnings)
    assert not lib.parse(msg()).warnings


def test_own_ddp_ranks_on_one_gpu_are_not_co_tenants():
    procs = "".join(f"Process {31000 + i} has 1.02 GiB memory in use. " for i in range(15))
    f = lib.parse(msg(free="20.00 MiB", alloc="6.00 GiB", procs=procs
                      + "Including non-PyTorch memory, this process has 7.00 GiB memory in use. "))
    v = lib.triage(f)
    assert v.cause == "own-ranks" and "set_device" in v.next_steps[0] and "do not kill" in v.next_steps[0]
    # unequal, far-apart PIDs stay co-tenants
    g = lib.parse(msg(free="20.00 MiB", alloc="6.00 GiB",
                      procs="Process 100 has 9.00 GiB memory in use. Process 20000 has 7.00 GiB memory in use. "
                            "Process 55555 has 1.00 GiB memory in use. "
                            "Including non-PyTorch memory, this process has 7.00 GiB memory in use. "))
    assert lib.triage(g).cause == "other-processes"


def test_cache_held_by_pending_cross_stream_frees_is_not_fragmentation():
    v = lib.triage(lib.parse(msg(req="2.00 GiB", free="100.00 MiB", alloc="845.00 KiB", ru="11.50 GiB")))
    assert v.cause == "stream-events" and "synchronize" in v.next_steps[0] and "empty_cache" in v.next_steps[0]


def test_growth_step_over_step_is_a_leak():
    log = "\n".join(msg(req="512.00 MiB", alloc=a, free="100.00 MiB") for a in ("12.00 GiB", "16.00 GiB", "22.00 GiB"))
    v = lib.triage(lib.parse(log))
    assert v.cause == "leak" and "accumulates" in v.next_steps[0]


def test_memory_fraction_binds_before_graph_pools():
    f = lib.parse("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity "
                  "of 287.98 GiB of which 275.86 GiB is free. 1.05 GiB allowed; Of the allocated memory 1017.01 MiB "
                  "is allocated by PyTorch, with 17.00 MiB allocated in private pools (e.g., HIP Graphs), and 54.99 "
                  "MiB is reserved by PyTorch but unallocated.")
    v = lib.triage(f)
    assert f.stack == "pytorch-hip" and v.cause == "memory-fraction" and "fraction" in v.next_steps[0]
    assert "rocm-smi" not in v.next_steps[0] and not any("nvidia-smi" in s for s in v.next_steps)


def test_mps_reasons_with_max_allowed_and_its_own_knobs():
    f = lib.parse("RuntimeError: MPS backend out of memory (MPS allocated: 17.68 GB, other allocations: 3.95 MB, "
                  "max allowed: 18.13 GB). Tried to allocate 1024.00 MB on private pool.")
    v = lib.triage(f)
    assert f.stack == "pytorch-mps" and v.cause == "does-not-fit" and "max allowed" in v.next_steps[0]
    assert any("PYTORCH_MPS_HIGH_WATERMARK_RATIO" in s for s in v.next_steps)
    assert not any("nvidia-smi" in s or "memory_stats" in s for s in v.next_steps)


def test_tensorflow_shape_times_dtype_and_bfc_stats():
    f = lib.parse("Resource exhausted: OOM when allocating tensor with shape[16,112,112,147] and type half on "
                  "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc")
    assert f.stack == "tensorflow" and f.requested == 16 * 112 * 112 * 147 * 2 and f.tensor_shape == "[16,112,112,147]"
    g = lib.parse("Stats: \nLimit:                 10198757376\nInUse:                 10029289984\n"
                  "W bfc_allocator.cc:275] Ran out of memory trying to allocate 39.81MiB.  See logs for memory state.\n"
                  "W op_kernel.cc:968] Resource exhausted: OOM when allocating tensor with shape[256,832,7,7]\n"
                  "ResourceExhaustedError: OOM when allocating tensor with shape[256,832,7,7]")
    assert (g.allowed, g.allocated, g.messages) == (10198757376, 10029289984, 1)
    v = lib.triage(g)
    assert v.cause == "does-not-fit" and "BFC limit" in v.next_steps[0]
    h = lib.triage(lib.parse("E cuda_dnn.cc:328] Could not create cudnn handle: CUDNN_STATUS_INTERNAL_ERROR"))
    assert h.cause == "framework-preallocation" and "set_memory_growth" in h.next_steps[0]


def test_xla_buffer_assignment_and_fraction():
    f = lib.parse("XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4770354232 bytes.\n"
                  "BufferAssignment OOM Debugging.\nBufferAssignment stats:\n   parameter allocation:  372.76MiB\n"
                  "   total allocation:   14.44GiB\n")
    v = lib.triage(f)
    assert f.stack == "jax" and abs(f.program_total - 14.44 * GiB) < 0.01 * GiB
    assert v.cause == "does-not-fit" and "XLA_PYTHON_CLIENT_MEM_FRACTION" in v.next_steps[0]
    w = lib.triage(lib.parse("RESOURCE_EXHAUSTED: Failed to allocate request for 176.00MiB (184549376B) on device "
                             "ordinal 0"))
    assert w.cause == "framework-preallocation" and "XLA_PYTHON_CLIENT_PREALLOCATE" in w.next_steps[0]


def test_cuda_malloc_async_block_all_figures():
    f = lib.parse("torch.cuda.OutOfMemoryError: Allocation on device 5 would exceed allowed memory. (out of memory)\n"
                  "Currently allocated     : 54.14 GiB\nRequested               : 686.41 MiB\n"
                  "Device limit            : 79.35 GiB\nFree (according to CUDA): 27.19 MiB\n"
                  "PyTorch limit (set by user-supplied memory fraction)\n                        : 17179869184.00 GiB")
    assert f.stack == "pytorch-cuda-async" and None not in (f.allocated, f.requested, f.total, f.free, f.allowed)
    v = lib.triage(f)
    assert v.cause == "fragmentation" and "backend:native" in v.next_steps[0]
    assert v.binding.startswith("the device's total")     # an absurd 'PyTorch limit' does not bind


def test_nccl_calloc_bytes_are_read():
    f = lib.parse("node:2134736:2285781 [0] include/alloc.h:185 NCCL WARN Failed to CUDA calloc 6291456 bytes")
    assert f.stack == "nccl" and f.requested == 6291456 and lib.triage(f).cause == "nccl"


def test_cli_lists_every_message_and_picks_one(capsys):
    log = msg(req="20.00 MiB") + "\n" + msg()
    assert cli.main(["explain", log]) == 0
    out = capsys.readouterr().out
    assert "2 out-of-memory messages" in out and "#1" in out and "#2" in out
    assert cli.main(["explain", "--json", "--message", "1", log]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["triaged_message"] == 1 and j["parsed"]["requested"] == 20 * MiB and len(j["messages"]) == 2
    assert cli.main(["explain", "--message", "5", log]) == 2
    assert "holds 2 out-of-memory message" in capsys.readouterr().err


# PyTorch 1.x wording: the cached-but-unallocated bytes are reserved - allocated
V1 = ("RuntimeError: CUDA out of memory. Tried to allocate {req} (GPU 0; 4.00 GiB total capacity; 1.60 GiB already "
      "allocated; 200.00 MiB free; 2.10 GiB reserved in total by PyTorch)")


def test_a_cache_too_small_to_hold_the_request_at_the_cards_edge_is_does_not_fit():
    """512 MiB stranded, 200 MiB free: a 600 MiB request fits neither alone, only both together, and placed
    perfectly it would leave under 3% of the card -- the live set is at the edge, not fragmented.  The same card
    asked for 400 MiB (the cache alone could hold it) stays fragmentation."""
    v = lib.triage(lib.parse(V1.format(req="600.00 MiB")))
    assert v.cause == "does-not-fit", v.evidence
    assert any("even coalesced into one block the cache could not hold it" in e for e in v.evidence), v.evidence
    assert "shrink" in v.next_steps[0] or "batch" in v.next_steps[0]
    w = lib.triage(lib.parse(V1.format(req="400.00 MiB")))
    assert w.cause == "fragmentation", w.evidence


TF_INIT = ("ResourceExhaustedError (see above for traceback): OOM when allocating tensor of shape [200000,512] and "
           "type float\n\t [[Node: {node} = Const[dtype=DT_FLOAT, value=Tensor<type: float shape: [200000,512] "
           "values: [0 0 0]...>, _device=\"/job:localhost/replica:0/task:0/device:GPU:0\"]()]]")


def test_tensorflow_oom_while_initialising_a_variable_does_not_blame_the_batch():
    """A variable's (or optimizer slot's) initializer fails before any batch ran: the message cannot tell a GPU
    already held at start-up from variables too large for the card -- 'unknown', with the check that decides first;
    the same tensor failing in a compute node keeps the presumed does-not-fit."""
    f = lib.parse(TF_INIT.format(node="emb/Adam_1/Initializer/zeros"))
    assert f.stack == "tensorflow" and f.requested == 200000 * 512 * 4
    v = lib.triage(f)
    assert v.cause == "unknown", v.evidence
    assert any("before any batch ran" in e for e in v.evidence)
    assert "nvidia-smi" in v.next_steps[0] and "batch" not in v.next_steps[0]
    w = lib.triage(lib.parse(TF_INIT.format(node="dense_1/MatMul")))
    assert w.cause == "does-not-fit" and any(e.startswith("presumed") for e in w.evidence)
    assert "batch" in w.next_steps[0]
