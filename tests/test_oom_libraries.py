"""OOM messages of GPU allocator libraries: CuPy, RAPIDS RMM, Numba, llama.cpp/ggml, vLLM.

Each names its stack, reads every figure it prints and gives a verdict only those figures support
("presumed" where they do not decide), with that library's own remedies first.  Messages are
built from the formats the libraries print (cupy/cuda/memory.pyx's OutOfMemoryError, rmm's
detail/error.hpp and pool_memory_resource, numba's CudaAPIError, ggml-cuda's buffer allocation,
vLLM's worker profiling); the corpus holds the real ones, with their sources.
"""

from __future__ import annotations

from memspec.triage import oom as lib

GiB, MiB = lib.GiB, lib.MiB


def _run(msg: str):
    f = lib.parse(msg)
    return f, lib.triage(f)


# ---------------------------------------------------------------------------
# CuPy
# ---------------------------------------------------------------------------

def test_cupy_pool_limit_binds():
    f, v = _run("cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 1,073,741,824 bytes "
                "(allocated so far: 3,221,225,984 bytes, limit set to: 4,294,967,296 bytes).")
    assert f.stack == "cupy" and v.stack == "cupy"
    assert (f.requested, f.reserved, f.allowed) == (GiB, 3 * GiB + 512, 4 * GiB)
    assert v.cause == "memory-fraction"
    assert "set_limit" in (v.binding or "") or "CUPY_GPU_MEMORY_LIMIT" in (v.binding or "")
    assert "free_all_blocks" in v.next_steps[0] and "set_limit" in v.next_steps[0]
    assert any("> the pool's limit" in e for e in v.evidence)


def test_cupy_at_the_limit_exactly_is_the_device_refusing():
    """CuPy refuses at the limit only when held + request would exceed it (memory.pyx: limit < total);
    at equality it asked the device, which refused -- the limit is printed in every message once set."""
    f, v = _run("cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 1,073,741,824 bytes "
                "(allocated so far: 3,221,225,472 bytes, limit set to: 4,294,967,296 bytes).")
    assert f.stack == "cupy" and (f.requested, f.reserved, f.allowed) == (GiB, 3 * GiB, 4 * GiB)
    assert v.cause == "does-not-fit" and v.binding is None   # the limit is printed but does not bind
    assert any("did not fire" in e for e in v.evidence) and any(e.startswith("presumed") for e in v.evidence)


def test_cupy_without_a_limit_reads_request_and_pool():
    f, v = _run("Out of memory allocating 1,073,741,824 bytes (allocated so far: 15,032,385,536 bytes).")
    assert f.stack == "cupy" and f.kind == "cupy"
    assert (f.requested, f.reserved, f.allowed) == (GiB, 14 * GiB, None)
    assert v.cause == "does-not-fit" and any(e.startswith("presumed") for e in v.evidence)
    assert "chunks" in v.next_steps[0] and "nvidia-smi" in v.next_steps[1]


def test_cupy_before_7_printed_the_total_with_the_request():
    f, v = _run("cupy.cuda.memory.OutOfMemoryError: out of memory to allocate 1073741824 bytes "
                "(total 12373894656 bytes)")
    assert f.stack == "cupy" and f.requested == GiB
    assert f.reserved == 12373894656 - GiB and "reserved" in f.derived
    assert v.cause == "does-not-fit"


def test_cupy_request_larger_than_its_limit():
    f, v = _run("Out of memory allocating 8,589,934,592 bytes (allocated so far: 0 bytes, "
                "limit set to: 4,294,967,296 bytes).")
    assert f.stack == "cupy" and v.cause == "does-not-fit" and "limit" in v.next_steps[0]


def test_two_cupy_messages_are_two_failures():
    f, _ = _run("Out of memory allocating 512 bytes (allocated so far: 1,024 bytes).\n"
                "Out of memory allocating 2,048 bytes (allocated so far: 4,096 bytes).")
    assert f.messages == 2 and (f.requested, f.reserved) == (2048, 4096)


# ---------------------------------------------------------------------------
# RAPIDS RMM
# ---------------------------------------------------------------------------

def test_rmm_bare_cuda_error():
    f, v = _run("MemoryError: std::bad_alloc: out_of_memory: CUDA error at: /opt/conda/include/rmm/mr/device/"
                "cuda_memory_resource.hpp:70: cudaErrorMemoryAllocation out of memory")
    assert f.stack == "rmm" and f.parsed() == {}
    assert v.cause == "does-not-fit" and any(e.startswith("presumed") for e in v.evidence)
    assert "partitions" in v.next_steps[0]
    assert any("spill" in s for s in v.next_steps)


def test_rmm_before_0_13_rmmerror():
    f, v = _run("rmm.rmm.RMMError: RMM_ERROR_OUT_OF_MEMORY")
    assert f.stack == "rmm" and v.cause == "does-not-fit" and any(e.startswith("presumed") for e in v.evidence)


def test_rmm_pool_maximum_binds_with_figures():
    f, v = _run("MemoryError: std::bad_alloc: out_of_memory: RMM failure at:/x/include/rmm/mr/pool_memory_resource"
                ".hpp:70: Maximum pool size exceeded (failed to allocate 1.000000 GiB): Not enough room to grow, "
                "current/max/try size = 3.500000 GiB, 4.000000 GiB, 1.000000 GiB")
    assert f.stack == "rmm" and (f.requested, f.reserved, f.allowed) == (GiB, 3 * GiB + GiB // 2, 4 * GiB)
    assert v.cause == "memory-fraction" and "maximum_pool_size" in v.next_steps[0]
    assert "RMM's maximum pool size" in (v.binding or "")


def test_rmm_unlimited_maximum_is_no_limit():
    """An unset maximum prints SIZE_MAX (16 EiB): not a limit; the device refused to grow the pool."""
    f, v = _run("RMM failure at:/x/pool_memory_resource.hpp:70: Maximum pool size exceeded (failed to allocate "
                "1.000000 GiB): Not enough room to grow, current/max/try size = 3.500000 GiB, 16.000000 EiB, "
                "1.000000 GiB")
    assert f.stack == "rmm" and f.allowed is None and f.reserved == 3 * GiB + GiB // 2
    assert v.cause != "memory-fraction"


def test_rmm_pool_exceeded_with_upstream_error_is_the_device():
    f, v = _run("MemoryError: std::bad_alloc: out_of_memory: RMM failure at:/x/pool_memory_resource.hpp:252: "
                "Maximum pool size exceeded (failed to allocate 1.000000 GiB): CUDA error (failed to allocate "
                "1073741824 bytes) at: /x/cuda_memory_resource.hpp:62: cudaErrorMemoryAllocation out of memory")
    assert f.stack == "rmm" and f.requested == GiB and f.messages == 1
    assert v.cause == "does-not-fit" and any("refused to grow" in e for e in v.evidence)


def test_rmm_old_pool_message_does_not_decide():
    f, v = _run("MemoryError: std::bad_alloc: out_of_memory: RMM failure at:/x/include/rmm/mr/device/"
                "pool_memory_resource.hpp:196: Maximum pool size exceeded")
    assert f.stack == "rmm" and v.cause == "unknown"
    assert "maximum_pool_size" in v.next_steps[0] and any(e.startswith("missing:") for e in v.evidence)


def test_rmm_pool_creation_too_large():
    f, v = _run("$ dask-cuda-worker tcp://localhost:8786 --rmm-pool-size 100GB\n"
                "distributed.utils - ERROR - std::bad_alloc: out_of_memory: RMM failure at:/x/include/rmm/mr/device/"
                "pool_memory_resource.hpp:183: Maximum pool size exceeded")
    assert f.stack == "rmm" and v.cause == "does-not-fit" and "rmm-pool-size" in v.next_steps[0]


def test_rmm_limiting_adaptor():
    f, v = _run("MemoryError: std::bad_alloc: out_of_memory: RMM failure at:/x/limiting_resource_adaptor_impl.cpp:"
                "57: Exceeded memory limit (failed to allocate 2.000000 GiB)")
    assert f.stack == "rmm" and f.requested == 2 * GiB
    assert v.cause == "memory-fraction" and "allocation_limit" in v.next_steps[0]


# ---------------------------------------------------------------------------
# Numba
# ---------------------------------------------------------------------------

def test_numba_cumemalloc():
    f, v = _run("numba.cuda.cudadrv.driver.CudaAPIError: [2] Call to cuMemAlloc results in "
                "CUDA_ERROR_OUT_OF_MEMORY")
    assert f.stack == "numba" and f.kind == "numba" and f.parsed() == {}
    assert v.cause == "does-not-fit" and any(e.startswith("presumed") for e in v.evidence)
    assert "chunks" in v.next_steps[0] and any("NUMBA_CUDA_MEMORY_MANAGER" in s for s in v.next_steps)


# ---------------------------------------------------------------------------
# llama.cpp / ggml
# ---------------------------------------------------------------------------

def test_ggml_weights_on_load():
    f, v = _run("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 1: cudaMalloc "
                "failed: out of memory\nalloc_tensor_range: failed to allocate CUDA1 buffer of size 4294967296\n"
                "llama_model_load: error loading model: unable to allocate CUDA1 buffer")
    assert f.stack == "ggml" and f.requested == 4096 * MiB and f.device == 1 and f.messages == 1
    assert not f.truncated and not f.warnings   # ggml's line ends on a byte count: not a cut
    assert v.cause == "does-not-fit" and "-ngl" in v.next_steps[0]
    assert any("device 1" in e and "weights" in e for e in v.evidence)


def test_ggml_reads_free_memory_from_the_load_line():
    f, v = _run("llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 3060) (0000:01:00.0) - "
                "10958 MiB free\n" + "llama_model_loader: - kv   0: general.architecture str = llama\n" * 50
                + "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 12000.00 MiB on device 0: cudaMalloc failed: "
                "out of memory\nalloc_tensor_range: failed to allocate CUDA0 buffer of size 12582912000\n")
    assert f.stack == "ggml" and f.free == 10958 * MiB and f.requested == 12582912000
    assert v.cause == "does-not-fit" and not any(e.startswith("presumed") for e in v.evidence)
    assert any("free when llama.cpp started" in e for e in v.evidence)


def test_ggml_lines_back_to_back_are_separate_failures():
    """A CuPy anchor must not read 'out of memory' + the next line's 'allocating N MiB' as one message."""
    f, _ = _run("allocating 4096.00 MiB on device 0: cudaMalloc failed: out of memory\n" * 3)
    assert f.stack == "ggml" and f.messages == 3 and f.requested == 4096 * MiB


def test_ggml_compute_buffer_names_the_batch_knobs_first():
    f, v = _run("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9866.00 MiB on device 0: cudaMalloc "
                "failed: out of memory\nggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 10345250816\n"
                "graph_reserve: failed to allocate compute buffers")
    assert f.stack == "ggml" and f.requested == 10345250816
    assert "-ub" in v.next_steps[0] and "-c" in v.next_steps[0]


def test_ggml_repeated_failures_are_counted():
    line = ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9866.00 MiB on device 1: cudaMalloc failed: "
            "out of memory\nggml_gallocr_reserve_n: failed to allocate CUDA1 buffer of size 10345250816\n")
    f, _ = _run(line * 3)
    assert f.messages == 3 and f.device == 1


# ---------------------------------------------------------------------------
# vLLM
# ---------------------------------------------------------------------------

_VLLM_ERR = ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
             "initializing the engine.")


def test_vllm_cache_blocks_is_an_oom():
    f, v = _run(_VLLM_ERR)
    assert f.stack == "vllm" and v.cause == "memory-fraction"
    assert "gpu_memory_utilization" in v.next_steps[0] and any(e.startswith("presumed") for e in v.evidence)


def test_vllm_profile_figures_decide_the_fraction():
    f, v = _run("INFO worker.py:267] the current vLLM instance can use total_gpu_memory (8.00GiB) x "
                "gpu_memory_utilization (0.70) = 5.60GiB\nINFO worker.py:267] model weights take 5.20GiB; "
                "non_torch_memory takes 0.03GiB; PyTorch activation peak memory takes 1.42GiB; the rest of the "
                "memory reserved for KV Cache is -1.05GiB.\n" + _VLLM_ERR)
    assert f.stack == "vllm" and f.total == 8 * GiB and abs(f.allowed - 5.6 * GiB) < 0.01 * GiB
    assert abs(f.allocated - 5.2 * GiB) < 0.01 * GiB and abs(f.activation_peak - 1.42 * GiB) < 0.01 * GiB
    assert f.kv_cache < 0
    assert v.cause == "memory-fraction" and "from 0.70 to" in v.next_steps[0]


def test_vllm_weights_larger_than_the_card_do_not_fit():
    f, v = _run("INFO worker.py:267] the current vLLM instance can use total_gpu_memory (31.74GiB) x "
                "gpu_memory_utilization (0.95) = 30.15GiB\nINFO worker.py:267] model weights take 29.50GiB; "
                "non_torch_memory takes 0.20GiB; PyTorch activation peak memory takes 2.10GiB; the rest of the "
                "memory reserved for KV Cache is -1.65GiB.\n" + _VLLM_ERR)
    assert f.stack == "vllm" and v.cause == "does-not-fit" and "quantized" in v.next_steps[0]


def test_vllm_max_model_len_larger_than_the_kv_budget():
    f, v = _run("ValueError: To serve at least one request with the models's max seq len (65536), (7.0 GiB KV cache "
                "is needed, which is larger than the available KV cache memory (2.39 GiB). Based on the available "
                "memory, the estimated maximum model length is 22336. Try increasing `gpu_memory_utilization` or "
                "decreasing `max_model_len` when initializing the engine.")
    assert f.stack == "vllm" and f.requested == 7 * GiB and abs(f.kv_cache - 2.39 * GiB) < 0.01 * GiB
    assert v.cause == "memory-fraction"
    assert "max_model_len" in v.next_steps[0] and "22336" in v.next_steps[0]


def test_vllm_v0_max_seq_len_in_tokens():
    f, v = _run("ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be "
                "stored in KV cache (3664). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
                "initializing the engine.")
    assert f.stack == "vllm" and v.cause == "memory-fraction" and "<= 3664" in v.next_steps[0]


# ---------------------------------------------------------------------------
# the class: the JSON names the stack and carries the figures
# ---------------------------------------------------------------------------

def test_json_of_a_library_message():
    f, v = _run("Out of memory allocating 1,073,741,824 bytes (allocated so far: 15,032,385,536 bytes).")
    out = v.as_json(f)
    assert out["stack"] == "cupy" and out["parsed"] == {"requested": GiB, "reserved": 14 * GiB}

