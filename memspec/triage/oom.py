"""Out-of-memory messages: read every figure, then say why it failed.

Seed 003: *Read the error before touching anything. Its two lines
(reserved-but-unallocated; other-process usage) do the first two flowchart
steps for you.*  This module reads those lines -- in every format PyTorch has
printed since 1.x, plus the driver's plain ``CUDA error: out of memory``, the
library statuses (cuBLAS, cuDNN, NCCL) and TensorFlow/JAX's
``RESOURCE_EXHAUSTED`` -- and then goes one step before the seed's flowchart:
**does the request fit at all?**  Only then does it walk the six causes in the
seed's order (*fragmentation -> other processes -> NCCL buffers -> CUDA graph
private pools -> cuDNN workspaces -> driver/kernel reserve*), each fired by
evidence in the figures, and says ``unknown`` -- with what is missing -- when
the figures do not decide.

Formats read (PyTorch's ``c10/cuda/CUDACachingAllocator.cpp`` across versions):

* 1.x-2.0: ``Tried to allocate X (GPU d; T total capacity; A already allocated;
  F free; [L allowed; ]R reserved in total by PyTorch)``; before 1.5 the last
  figure is ``R cached)``.
* 2.1-2.2: ``Tried to allocate X. GPU d has a total capacty of T of which F is
  free.`` (sic), 2.3+: ``total capacity``; then ``Process P has U memory in
  use.`` lines (other PIDs -- and, inside a container, this process's own
  line), ``Including non-PyTorch memory, this process has U memory in use.``,
  ``L allowed;``, ``Of the allocated memory A is allocated by PyTorch, [with G
  allocated in private pools (e.g., CUDA Graphs), ]and U is reserved by
  PyTorch but unallocated.``  A includes G; reserved = A + U.
* the seed toy's ``(device T; R reserved; U is reserved but unallocated;
  largest free block B)``; MPS's ``MPS allocated: A, ... max allowed: L``;
  TensorFlow/JAX ``Out of memory while trying to allocate N bytes``.

Sizes: ``bytes``, ``KiB/MiB/GiB/TiB`` (powers of 1024) and ``KB/MB/GB/TB``
(read as powers of 1024 too, as PyTorch's MPS message and nvidia-smi mean
them).  Every figure is returned in bytes.

Untrusted input: the text is scanned in linear time -- literal searches for
``memory``/``allocat`` and a few library names, then anchored, possessive
patterns in a bounded window around each hit (no pattern can backtrack over a
run of digits).  Binary input is refused with :class:`BinaryInput`.

The module is split along its sections, each under 1,200 lines:
:mod:`.oom_figures` (units, cause and stack ids, :class:`Figures`, :func:`fmt`),
:mod:`.oom_read` (reading the text; memory_stats() and nvidia-smi),
:mod:`.oom_triage` (:class:`Verdict`, PyTorch's cause walk, each cause's next
steps) and this module (the stacks, :func:`triage`, the report).  Every name of
the parts, private ones included, is a name of this module: import from here.
"""

from __future__ import annotations

from . import oom_figures, oom_read, oom_triage
from .oom_figures import CAUSES, FIGURES, LIBRARY_STACKS, MAX_READ, STACKS, Figures, GiB, MiB, fmt
from .oom_triage import _SEGMENT_FLOOR, Verdict, _triage_pytorch

#: the modules this one is assembled from, in order; a name defined there is one
#: object, whichever module a caller reads it from, so a test that rebinds one
#: (``monkeypatch.setattr``) rebinds it in each module of :data:`PARTS` that has it and here
PARTS = (oom_figures, oom_read, oom_triage)
# the face: every name of the parts, private ones included, is a name of this module, as before the split
for _part in PARTS:
    globals().update({_k: _v for _k, _v in vars(_part).items() if not _k.startswith("__")})
del _part


# ---------------------------------------------------------------------------
# Stacks: the binding limit first, then that stack's causes and knobs
# ---------------------------------------------------------------------------

#: XLA's default preallocation (XLA_PYTHON_CLIENT_MEM_FRACTION) -- 75% of the device since jaxlib 0.4
_XLA_DEFAULT_FRACTION = 0.75


def budget(f: Figures) -> tuple[int | None, str]:
    """The tightest limit the message names: (bytes, what it is)."""
    lims: list[tuple[int, str]] = []
    if f.total:
        lims.append((f.total, f"the device's total capacity {fmt(f.total)}"))
    pool_under = f.stack in ("cupy", "rmm") and f.allowed is not None and f.reserved is not None \
        and f.requested is not None and f.reserved + f.requested <= f.allowed   # a pool under its cap: not binding
    if f.allowed and (f.total is None or f.allowed < f.total) and not pool_under:
        name = {"pytorch-mps": "MPS's max allowed",
                "tensorflow": "TensorFlow's BFC memory limit", "tensorflow-rocm": "TensorFlow's BFC memory limit",
                "jax": "XLA's memory limit",
                "pytorch-cuda-async": "the PyTorch limit (per-process memory fraction)",
                "cupy": "CuPy's pool limit (MemoryPool.set_limit / CUPY_GPU_MEMORY_LIMIT)",
                "rmm": "RMM's maximum pool size",
                "vllm": "vLLM's budget (total x gpu_memory_utilization)"}.get(
                    f.stack, "the per-process memory fraction ('allowed')")
        lims.append((f.allowed, f"{name} {fmt(f.allowed)}"))
    if f.stack == "jax" and f.total and not f.allowed:
        lims.append((int(f.total * _XLA_DEFAULT_FRACTION),
                     f"XLA's preallocated pool (XLA_PYTHON_CLIENT_MEM_FRACTION, {_XLA_DEFAULT_FRACTION:.0%} of "
                     f"{fmt(f.total)} by default)"))
    if not lims:
        return None, ""
    return min(lims)


def _own_ranks(f: Figures) -> list[tuple[int, int]] | None:
    """Three or more 'Process P has U' lines of about the same size and near-consecutive PIDs: one job's
    ranks (torchrun/DDP processes) that each made a CUDA context on this device."""
    lines = f.other_processes or []
    if len(lines) < 3:
        return None
    pids = sorted(p for p, _ in lines)
    sizes = [u for _, u in lines]
    if pids[-1] - pids[0] > 8 * len(pids) + 16:
        return None
    lo, hi = min(sizes), max(sizes)
    if hi > 1.25 * lo + 64 * MiB:
        return None
    return lines


def _localise(steps: list[str], stack: str) -> list[str]:
    """The stack's own tool names in shared advice."""
    if stack == "pytorch-hip":
        subs = [("nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv", "rocm-smi --showpids "
                 "(amd-smi process)"), ("nvidia-smi", "rocm-smi"), ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"),
                ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"), ("CUDA graphs", "HIP graphs")]
    elif stack == "pytorch-xpu":
        subs = [("nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv", "xpu-smi ps"),
                ("nvidia-smi", "xpu-smi"), ("torch.cuda.", "torch.xpu."), ("CUDA_VISIBLE_DEVICES",
                                                                          "ZE_AFFINITY_MASK")]
    else:
        return steps
    out = []
    for st in steps:
        for a, b in subs:
            st = st.replace(a, b)
        out.append(st)
    return out


def _host(f: Figures) -> Verdict:
    R = f.requested
    ev = ["a CPU allocator failed (DefaultCPUAllocator / numpy / TensorFlow's cpu allocator): this is host RAM, "
          "not GPU memory -- GPU figures, nvidia-smi and PYTORCH_CUDA_ALLOC_CONF do not apply"]
    if R is not None:
        ev.append(f"requested {fmt(R)} of host memory")
    steps = [f"host RAM is the binding limit{f' ({fmt(R)} could not be allocated)' if R else ''}: shrink what is "
             "held at once -- a smaller batch, tile or image, data loaded in chunks or memory-mapped -- or give the "
             "host more: RAM, swap, or a larger Windows page file (virtual memory)",
             "see what holds host RAM (free -h, top; Task Manager on Windows): each DataLoader worker copies the "
             "dataset object (fewer workers), other programs, an earlier model still referenced",
             "load checkpoints without a host copy: torch.load(path, mmap=True, map_location='cuda'), "
             "safetensors, low_cpu_mem_usage=True",
             "restart the process (last: only if memory was leaked by earlier steps)"]
    if R is not None and R >= 1 << 40:
        steps.insert(0, f"{fmt(R)} is more than any host has: print the shape being allocated -- a size "
                        "computation is wrong (a dimension squared, a length read from corrupt data)")
    return Verdict("host-memory", ev, steps)


def _tf_handle(f: Figures) -> Verdict:
    ev = ["TensorFlow could not create a cuDNN/cuBLAS handle: by default TensorFlow maps nearly all GPU memory at "
          "start-up, leaving the library none for its handle and workspace (or another process holds the GPU)"]
    steps = ["turn on memory growth so TensorFlow takes memory as needed: tf.config.experimental.set_memory_growth("
             "gpu, True) for every GPU before any op (TF 1.x: config.gpu_options.allow_growth = True), or "
             "TF_FORCE_GPU_ALLOW_GROWTH=true",
             "or cap TensorFlow below the card: tf.config.set_logical_device_configuration(gpu, "
             "[tf.config.LogicalDeviceConfiguration(memory_limit=MB)]) (TF 1.x: per_process_gpu_memory_fraction)",
             "nvidia-smi: if another process (a second notebook, a JAX or PyTorch job) holds the GPU, stop it",
             "if memory growth does not help: the same error comes from a CUDA/cuDNN version that does not match "
             "the TensorFlow build"]
    return Verdict("framework-preallocation", ev, steps)


def _tf(f: Figures, ev: list[str]) -> Verdict:
    R, L, U = f.requested, f.allowed, f.allocated
    smi = "rocm-smi --showpids" if f.stack == "tensorflow-rocm" else \
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"
    growth = ("memory growth: tf.config.experimental.set_memory_growth(gpu, True) (TF 1.x: allow_growth=True) or "
              "TF_FORCE_GPU_ALLOW_GROWTH=true")
    shrink = ("shrink the batch (model.fit(batch_size=...), or the tf.data .batch()), the image size or the "
              "sequence length")
    if f.tensor_shape:
        ev.append(f"the tensor that failed: shape {f.tensor_shape}"
                  + (f" x {f.dtype} = {fmt(f.tensor_bytes)}" if f.tensor_bytes is not None else
                     " (no dtype printed: size unknown)"))
    if "failalloc" in f.hints and "tfstats" not in f.hints and not f.tensor_shape:
        ev.append("'failed to allocate ... from device' from the stream executor: the allocator asked the driver for "
                  "a region and the device did not have it"
                  + (" -- a run of requests shrinking by 0.9x is TensorFlow's start-up preallocation backing off"
                     if "backoff" in f.hints else "")
                  + "; TensorFlow sizes that region from what the device reports free, so memory held by another "
                  "process is the usual reason")
        return Verdict("other-processes", ev, [
            f"{smi}: find the process holding the device (another TensorFlow/JAX/PyTorch job, a stale notebook "
            "kernel) and stop it",
            "let processes share the device: " + growth + ", or a per-process memory_limit",
            "run on another device (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES) or schedule the jobs apart",
            "restart the machine's stuck processes last"])
    if L is not None and U is not None and R is not None:
        if U + R > L or L - U < 0.05 * L:   # over the limit, or under it by crumbs: full either way
            ev.append(f"InUse {fmt(U)} + requested {fmt(R)} = {fmt(U + R)} > TensorFlow's BFC limit {fmt(L)}: the "
                      "live tensors fill the allocator's region -- the workload does not fit")
            return Verdict("does-not-fit", ev, [
                f"TensorFlow's BFC limit ({fmt(L)}) is the binding limit: {shrink}",
                "mixed precision (tf.keras.mixed_precision.set_global_policy('mixed_float16')) and fewer "
                "activations kept (tf.recompute_grad)",
                "if the limit is well below the card: it was capped (memory_limit / per_process_gpu_memory_fraction) "
                "or another process held memory at start-up -- " + smi,
                "a larger device, or split the model/batch across devices (tf.distribute)"])
        ev.append(f"InUse {fmt(U)} + requested {fmt(R)} <= TensorFlow's BFC limit {fmt(L)}, yet no free chunk "
                  "could take it: the free space is split between live chunks (fragmentation)")
        return Verdict("fragmentation", ev, [
            "TF_GPU_ALLOCATOR=cuda_malloc_async (TensorFlow >= 2.5): CUDA's stream-ordered pool instead of the BFC "
            "allocator's fixed region",
            "steady tensor shapes: pad/bucket variable-length inputs so freed chunks are reused",
            shrink, "restart the process (last)"])
    if L is not None and U is not None and U >= 0.95 * L:
        ev.append(f"InUse {fmt(U)} = {100 * U / L:.0f}% of TensorFlow's BFC limit {fmt(L)}: the region is full of "
                  "live tensors")
        return Verdict("does-not-fit", ev, [
            f"TensorFlow's BFC limit ({fmt(L)}) is the binding limit: {shrink}",
            "mixed precision (mixed_float16) and recomputation (tf.recompute_grad)",
            f"if the limit is below the card: {smi} for another process, or raise memory_limit",
            "a larger device, or tf.distribute across devices"])
    if "tfinit" in f.hints:
        # no allocator figures, but the failing node initialises a variable: no batch had run yet
        ev.append("the failing node initialises a variable (a '/Initializer/' node; optimizer slots such as Adam's "
                  "two per variable included): the OOM came before any batch ran, so the batch size is not the "
                  "cause. Either the GPU was already held when TensorFlow started (it only maps what is free then: "
                  "another process, a stale notebook kernel) or the model's variables do not fit the card -- the "
                  "message has no figures to tell which")
        ev.append("missing: total, free and what other processes hold on the device (nvidia-smi decides it)")
        return Verdict("unknown", ev, [
            f"{smi}: if another process holds the GPU (a second TensorFlow process or notebook, a job not visible "
            "in your ps), stop it or run on another device -- or let them share it with " + growth,
            "if the GPU was empty: the variables themselves do not fit -- add up the variables"
            + (f" (the failing one, {f.tensor_shape}, is {fmt(f.tensor_bytes)})" if f.tensor_bytes else "")
            + " with the optimizer's slots (Adam keeps two copies of each); shrink the largest (vocabulary, "
            "embedding width), place large embeddings on the CPU, or use a lighter optimizer",
            "a larger device, or split the variables across devices (tf.distribute)"])
    # a shape or a bare ResourceExhaustedError: no allocator figures
    ev.append("presumed: the message carries no allocator figures (no BFC stats, no free/total); the commonest "
              "cause of a TensorFlow OOM is a workload too large for the card -- the steps say how to tell")
    return Verdict("does-not-fit", ev, [
        shrink + (f" (the failing tensor {f.tensor_shape} scales with its first dimension)" if f.tensor_shape
                  else ""),
        f"{smi}: if another process holds the GPU (TensorFlow preallocates nearly all of it, so a second TF "
        "process or notebook on the same GPU fails at once), stop it or enable " + growth,
        "mixed precision (mixed_float16); add report_tensor_allocations_upon_oom to RunOptions (TF 1.x) or read "
        "the BFC summary above the error to see what holds memory",
        "a larger device, or tf.distribute across devices"])


def _jax(f: Figures, ev: list[str]) -> Verdict:
    R, T = f.requested, f.total
    frac = ("XLA_PYTHON_CLIENT_MEM_FRACTION (the share of the GPU JAX preallocates, .75 by default; lower it when "
            "TensorFlow, PyTorch, cuDNN or another JAX process need memory beside the pool, raise it toward .95 when "
            "JAX is alone) or XLA_PYTHON_CLIENT_PREALLOCATE=false (allocate on demand; more fragmentation)")
    if R is not None and T and R > T:
        ev.append(f"requested {fmt(R)} > the device's {fmt(T)}: no pool setting can place it")
        return Verdict("does-not-fit", ev, [
            f"the device's {fmt(T)} is the binding limit and the request is {R / T:.1f}x it: find the operation "
            "(the buffer's shape in the BufferAssignment dump, or jax.debug) and shrink what it is given or process "
            "it in chunks (jax.lax.map / scan over slices); check the shape arithmetic",
            "rematerialise (jax.checkpoint) and donate buffers (donate_argnums) to cut the program's peak",
            "shard across devices (jax.sharding) or use a larger device"])
    if f.program_total is not None:
        ev.append(f"XLA's BufferAssignment: the program needs {fmt(f.program_total)} in total (parameters, outputs "
                  "and temporaries) while one more buffer" + (f" of {fmt(R)}" if R else "") + " could not be placed")
        lim, lim_name = budget(f)
        if lim is not None:
            ev.append(f"binding limit: {lim_name}")
        return Verdict("does-not-fit", ev, [
            f"XLA's pool (XLA_PYTHON_CLIENT_MEM_FRACTION, .75 of the GPU by default) is the binding limit and the "
            f"compiled program needs {fmt(f.program_total)}: shrink the batch, sequence or image size -- or a GPU "
            "with more memory",
            "rematerialise (jax.checkpoint) and donate buffers (donate_argnums) to cut the peak",
            "if JAX is alone on the GPU: XLA_PYTHON_CLIENT_MEM_FRACTION=.95 gives the pool most of the card",
            "shard across devices (jax.sharding)"])
    ev.append("JAX preallocates a pool (75% of the GPU by default) and allocates inside it: an OOM with no program "
              "figures means the pool is the binding limit -- too small for the step, or memory outside it (cuDNN "
              "workspaces, TensorFlow or PyTorch in the same process, another JAX process) left it short")
    return Verdict("framework-preallocation", ev, [
        f"XLA's preallocated pool is the binding limit: set {frac}",
        "nvidia-smi: another JAX/TensorFlow/PyTorch process on the same GPU preallocates too -- give each a "
        "fraction or stop it; data-loading TensorFlow can run CPU-only (tf.config.set_visible_devices([], 'GPU'))",
        "shrink the batch; jax.checkpoint and donate_argnums cut the peak",
        "restart the process (last)"])


def _mps(f: Figures, ev: list[str]) -> Verdict:
    R, A, O, L = f.requested, f.allocated, f.other_allocations, f.allowed
    water = ("PYTORCH_MPS_HIGH_WATERMARK_RATIO raises MPS's cap (a ratio of the recommended working set; 0.0 "
             "removes it -- macOS may then swap hard or freeze)")
    if None in (R, A, L):
        ev.append("the MPS figures are incomplete (MPS prints MPS allocated, other allocations, max allowed and the "
                  "request; no free/total and no nvidia-smi exist on Apple GPUs)")
        return Verdict("unknown", ev, [
            "paste the whole 'MPS backend out of memory (...)' line", water,
            "shrink the batch, resolution or model", "torch.mps.empty_cache() between models; restart last"])
    used = A + (O or 0)
    if used + R > L:
        ev.append(f"MPS allocated {fmt(A)} + other allocations {fmt(O)} + requested {fmt(R)} = {fmt(used + R)} > "
                  f"max allowed {fmt(L)}: the cap binds")
        if O and O >= max(R, L // 4):
            ev.append(f"other allocations {fmt(O)} is memory the Metal device holds outside PyTorch's MPS "
                      "allocator (other models, another framework in the process)")
        return Verdict("does-not-fit", ev, [
            f"MPS's max allowed ({fmt(L)}) is the binding limit: shrink the batch, image size or sequence length, "
            "or use a smaller or lower-precision model (fp16/bf16, quantized)",
            water,
            "free what other models hold: del them and torch.mps.empty_cache(); unload models between steps",
            "restart the process (last)"])
    ev.append(f"MPS allocated {fmt(A)} + other {fmt(O)} + requested {fmt(R)} <= max allowed {fmt(L)}: the cap was "
              "not reached -- the allocator's heaps are fragmented or the system refused the buffer")
    return Verdict("fragmentation", ev, [
        "torch.mps.empty_cache() between steps or models, then retry", "steady tensor shapes", water,
        "restart the process (last)"])


def _async(f: Figures, ev: list[str]) -> Verdict:
    R, A, T, F, L = f.requested, f.allocated, f.total, f.free, f.allowed
    if L is not None and T is not None and L >= T:
        ev.append(f"PyTorch limit {fmt(L)} >= the device's {fmt(T)}: no memory fraction is set, it does not bind")
        L = None
    if None in (R, A, T):
        ev.append("the cudaMallocAsync block is incomplete (it prints Currently allocated, Requested, Device limit, "
                  "Free)")
        return Verdict("unknown", ev, ["paste the whole block", "nvidia-smi for other processes",
                                       "shrink the batch"])
    if L is not None and A + R > L:
        ev.append(f"allocated {fmt(A)} + requested {fmt(R)} > the PyTorch limit {fmt(L)} (memory fraction)")
        return Verdict("memory-fraction", ev, [
            f"the per-process memory fraction ({fmt(L)}) is the binding limit, not the device ({fmt(T)}): raise "
            "torch.cuda.set_per_process_memory_fraction or remove the call", "shrink the batch"])
    if A + R > 0.98 * T:
        ev.append(f"allocated {fmt(A)} + requested {fmt(R)} > the device's {fmt(T)}: the workload does not fit")
        return Verdict("does-not-fit", ev, [
            f"the device's total ({fmt(T)}) is the binding limit: shrink the batch, sequence length or resolution",
            "mixed precision and activation checkpointing", "shard (FSDP) or offload"])
    held = T - A - (F or 0)
    ev.append(f"device {fmt(T)} - allocated {fmt(A)} - free {fmt(F)} = {fmt(held)} is held by nobody PyTorch "
              "counts: under backend:cudaMallocAsync that is the CUDA pool's freed-but-cached memory (or another "
              "process); the request fits the device, not the pool's layout")
    return Verdict("fragmentation", ev, [
        "switch back to PyTorch's native allocator with expandable segments: PYTORCH_CUDA_ALLOC_CONF="
        "backend:native,expandable_segments:True (PyTorch >= 2.1)",
        "or keep cudaMallocAsync and trim its pool before big steps: torch.cuda.synchronize(); "
        "torch.cuda.empty_cache() (releases the pool's cached memory)",
        "nvidia-smi --query-compute-apps=pid,used_memory --format=csv: rule out another process holding the "
        f"{fmt(held)}",
        "shrink the batch; restart the process last"])


# ---------------------------------------------------------------------------
# Allocator libraries: CuPy, RMM, Numba, llama.cpp/ggml, vLLM -- each with its own figures and remedies
# ---------------------------------------------------------------------------

_SMI = "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"


def _presumed_device(what: str) -> str:
    return (f"presumed: {what}; the message prints neither the device's total nor its free memory, so it cannot "
            "tell a working set too large for the card (the commonest cause) from memory held elsewhere -- another "
            "process, or another library in this process (PyTorch's cache, TensorFlow/JAX preallocation, a second "
            "pool) -- the second step tells them apart")


def _cupy(f: Figures, ev: list[str]) -> Verdict:
    R, H, L = f.requested, f.reserved, f.allowed
    free_cache = ("cupy.get_default_memory_pool().free_all_blocks() (and get_default_pinned_memory_pool()'s) "
                  "returns the pool's cached free blocks to the device; a split block returns only when all its "
                  "parts are free")
    shrink = ("shrink the working set: process the arrays in chunks, del intermediates inside loops, write into "
              "existing arrays (out=, in-place ops) and use smaller dtypes (float32 for float64)")
    if "reserved" in f.derived:
        ev.append(f"the pool held {fmt(H)} (= {f.derived['reserved']}: CuPy < 7 printed 'total' with the request added)")
    if R is None:
        ev.append("the CuPy message is incomplete: no request size")
        return Verdict("unknown", ev + ["missing: requested, the pool's total"], [
            "paste the whole 'Out of memory allocating N bytes (...)' line", free_cache, shrink])
    if L is not None and H is not None and H + R > L:
        ev.append(f"the pool holds {fmt(H)} + requested {fmt(R)} = {fmt(H + R)} > the pool's limit {fmt(L)} "
                  "(MemoryPool.set_limit or CUPY_GPU_MEMORY_LIMIT): CuPy refused before asking the device -- "
                  "the device's free memory does not enter into it")
        ev.append("what 'allocated so far' counts: the pool's total -- arrays in use and the cached free blocks "
                  "it keeps for reuse. CuPy 7-12 checks the limit before freeing that cache, so cached blocks "
                  "alone can trip it (cupy/cupy#7678); CuPy >= 13 frees the cache and collects garbage first, "
                  "so there the figure is what is still in use")
        if R > L:
            ev.append(f"the request alone ({fmt(R)}) is larger than the limit: no freeing can place it")
            return Verdict("does-not-fit", ev, [
                f"the request ({fmt(R)}) is larger than the pool's limit ({fmt(L)}): raise the limit "
                "(set_limit(size=...) or set_limit(fraction=...), CUPY_GPU_MEMORY_LIMIT) if the device has room, "
                "or shrink what the operation is given (chunks)", shrink,
                f"{_SMI}: the device's free memory, before raising the limit"])
        return Verdict("memory-fraction", ev, [
            f"the pool's limit ({fmt(L)}) binds, not the device: {free_cache} -- call it before the large "
            "allocation (CuPy 7-12 counts the cache against the limit and does not free it first); or raise the "
            "limit: MemoryPool.set_limit(size=...) / set_limit(fraction=...), or CUPY_GPU_MEMORY_LIMIT "
            "(bytes or '90%')",
            "del arrays no longer needed (and results kept in lists or closures) so the pool's in-use bytes drop; "
            "CuPy >= 13 frees its cache and runs gc before refusing at the limit",
            shrink,
            f"{_SMI}: if you raise the limit, check the device has the room"])
    if L is not None and H is not None:
        ev.append(f"the pool holds {fmt(H)} + requested {fmt(R)} = {fmt(H + R)} <= its limit {fmt(L)}: CuPy "
                  "refuses at the limit only when the total would exceed it, so the limit did not fire -- the "
                  "device itself refused (CuPy prints the limit in every message once one is set); the device "
                  f"could not give this process the {fmt(L)} the limit allows")
    held = f"the pool holds {fmt(H)}" if H is not None else "the pool's total is not printed"
    ev.append(f"CuPy freed its cached blocks and ran gc, retried, and the device still refused {fmt(R)}; {held} "
              "('allocated so far': arrays in use, plus -- in CuPy 7-12 -- the cache it had before freeing it)")
    ev.append(_presumed_device("this process's arrays fill the device"))
    return Verdict("does-not-fit", ev, [
        shrink,
        f"{_SMI}: if another process holds the device, stop it; if this process holds much more than the pool's "
        f"{fmt(H) if H is not None else 'total'}, another library in it does (PyTorch's cache: "
        "torch.cuda.empty_cache(); TensorFlow/JAX preallocation) -- or share one pool (cupy.cuda.set_allocator "
        "with RMM's or PyTorch's allocator)",
        "at the failure, compare cupy.get_default_memory_pool().used_bytes() / total_bytes() with "
        "cupy.cuda.Device().mem_info (free, total)",
        "managed memory oversubscribes the device (slow): cupy.cuda.set_allocator(cupy.cuda.MemoryPool("
        "cupy.cuda.malloc_managed).malloc)"])


def _rmm(f: Figures, ev: list[str]) -> Verdict:
    R, H, L = f.requested, f.reserved, f.allowed
    spill = ("spill to host instead of failing: dask-cuda's device_memory_limit / --device-memory-limit (and "
             "jit_unspill), cuDF's spilling (CUDF_SPILL=on)")
    chunks = ("smaller pieces: more, smaller partitions (dask_cudf: a smaller blocksize / npartitions), "
              "cudf.read_csv/read_parquet in chunks (byte_range, row groups), fewer columns loaded")
    if "rmmlimit" in f.hints:
        ev.append("RMM's limiting_resource_adaptor refused: the allocation would exceed the adaptor's allocation "
                  "limit -- a configured cap, not the device")
        return Verdict("memory-fraction", ev, [
            "the RMM limiting adaptor's allocation limit binds, not the device: raise it "
            "(rmm.mr.LimitingResourceAdaptor(upstream, allocation_limit=...)) or fit under it", chunks, spill])
    if L is not None and H is not None and R is not None:
        if H + R > L:
            ev.append(f"the pool holds {fmt(H)} + requested {fmt(R)} = {fmt(H + R)} > its maximum_pool_size "
                      f"{fmt(L)}: the pool may not grow -- its configured maximum binds, not the device")
            if R > L:
                return Verdict("does-not-fit", ev, [
                    f"the request ({fmt(R)}) is larger than the pool's maximum ({fmt(L)}): raise "
                    "maximum_pool_size if the device has room, or " + chunks, spill])
            return Verdict("memory-fraction", ev, [
                f"RMM's maximum pool size ({fmt(L)}) binds: raise maximum_pool_size (rmm.reinitialize("
                "pool_allocator=True, maximum_pool_size=...), PoolMemoryResource(..., maximum_pool_size=...), "
                "dask-cuda --rmm-maximum-pool-size) if the device has room, or leave it unset",
                spill, chunks,
                "a pool split into many partly used blocks cannot place a large request: release long-lived "
                "buffers, or use rmm.mr.ArenaMemoryResource / CudaAsyncMemoryResource"])
        ev.append(f"the pool holds {fmt(H)} + requested {fmt(R)} <= its maximum {fmt(L)}: the device refused to "
                  "grow the pool")
    creating = "rmm-create" in f.hints
    if "rmmmax" in f.hints and creating and R is None:
        ev.append("the text shows the pool being created with a set initial size (rmm_pool_size / "
                  "initial_pool_size): RMM raises 'Maximum pool size exceeded' when that first block cannot be "
                  "allocated -- the initial size is more than the device can give")
        return Verdict("does-not-fit", ev, [
            "the pool's initial size is larger than the device's free memory: set it smaller "
            "(dask-cuda --rmm-pool-size / rmm_pool_size, rmm.reinitialize(initial_pool_size=...)) -- below "
            "nvidia-smi's free memory, leaving room for the CUDA context and allocations outside the pool",
            f"{_SMI}: another process holding the device shrinks what the pool can take",
            spill])
    if "rmmmax" in f.hints and "rmm-upstream" in f.hints:
        ev.append("'Maximum pool size exceeded' with the upstream's cudaErrorMemoryAllocation as its reason: the "
                  "pool was under its maximum and the device refused to grow it")
    elif "rmmmax" in f.hints and L is None:
        ev.append("RMM says 'Maximum pool size exceeded' both when the pool reached its maximum_pool_size and when "
                  "the device refused to grow it (RMM before 25.04 does not print which, nor any figure)")
        return Verdict("unknown", ev + ["missing: the pool's size, its maximum and the device's free memory "
                                        "(RMM >= 25.04 prints 'current/max/try size')"], [
            "if a maximum_pool_size is set (rmm.reinitialize, PoolMemoryResource, dask-cuda "
            "--rmm-maximum-pool-size): raise it or leave it unset -- the pool may then take the whole device",
            f"if not: the device is full -- {_SMI} for other processes; then " + chunks,
            spill,
            "managed memory oversubscribes the device (slow): rmm.reinitialize(managed_memory=True) "
            "(a pool over managed memory needs a maximum_pool_size above the device's)"])
    what = f"RMM asked the device for {fmt(R)} and cudaMalloc refused" if R is not None else \
        "RMM's CUDA memory resource got cudaErrorMemoryAllocation from cudaMalloc (the request is not printed)"
    ev.append(what)
    ev.append(_presumed_device("cuDF/RMM's working set is too large for the device"))
    return Verdict("does-not-fit", ev, [
        chunks + " -- cuDF's readers and joins take several times the input's size in temporaries",
        f"{_SMI}: another process on the device (a second notebook kernel using cuDF, a dask worker sharing the "
        "GPU) is the cause instead -- stop it or give each its own GPU",
        spill,
        "managed memory oversubscribes the device (slow): rmm.reinitialize(managed_memory=True)"])


def _numba(f: Figures, ev: list[str]) -> Verdict:
    ev.append("Numba's memalloc flushed its pending deallocations and retried once, then the driver's cuMemAlloc "
              "still returned CUDA_ERROR_OUT_OF_MEMORY; Numba prints no size or figures")
    ev.append(_presumed_device("the device arrays do not fit"))
    return Verdict("does-not-fit", ev, [
        "shrink what is on the device at once: copy and process the data in chunks, reuse device arrays "
        "(copy_to_device into an existing array) rather than allocating per call, smaller dtypes",
        f"{_SMI}: if another process holds the device, stop it; if this process holds more than Numba's arrays, "
        "another library does (cuDF/RMM's pool, CuPy's pool, PyTorch's cache) -- let Numba allocate from the same "
        "pool (NUMBA_CUDA_MEMORY_MANAGER=rmm.allocators.numba, or CuPy's EMM plugin)",
        "at the failure, numba.cuda.current_context().get_memory_info() gives (free, total); deallocations inside "
        "a cuda.defer_cleanup() block wait until it ends",
        "restart the process (last)"])


def _ggml(f: Figures, ev: list[str]) -> Verdict:
    R, D = f.requested, f.device
    phase = next((h.split(":", 1)[1] for h in f.hints if h.startswith("ggml:")), "unknown")
    where = {"weights": "the model's weights (loading the layers offloaded to the GPU)",
             "compute": "the compute buffer (sized by the context and the (u)batch)",
             "kv": "the KV cache (sized by the context and the parallel slots)",
             "unknown": "a backend buffer"}[phase]
    dev = f" on device {D}" if D is not None else ""
    ev.append(f"ggml asked cudaMalloc for {fmt(R)}{dev} for {where}, and the driver refused"
              if R is not None else f"ggml's cudaMalloc failed{dev} for {where} (no size printed)")
    if "ggml-free-at-load" in f.hints and f.free is not None and R is not None and R > f.free:
        ev.append(f"the log's load line says the device had {fmt(f.free)} free when llama.cpp started: the "
                  f"{fmt(R)} buffer alone is larger -- it cannot fit, whatever else runs")
    else:
        if "ggml-free-at-load" in f.hints and f.free is not None:
            ev.append(f"the device had {fmt(f.free)} free at load (the log's 'using device' line); the buffers "
                      "allocated since (weights, KV cache, compute) take their share of it")
        ev.append(_presumed_device("the buffer does not fit beside what the device already holds"))
    layers = ("offload fewer layers: -ngl / --n-gpu-layers N (the rest run on the CPU), or a smaller model or "
              "quantization (Q4_K_M instead of Q8_0)")
    compute = ("a smaller compute buffer: a smaller -ub/--ubatch-size and -b/--batch-size, a smaller context -c, "
               "flash attention (-fa on)")
    kv = ("a smaller KV cache: a smaller context -c, a quantized cache (--cache-type-k q8_0 --cache-type-v q8_0), "
          "fewer parallel slots (-np)")
    split = ("several GPUs: move layers off the full device with --tensor-split (e.g. -ts 3,1), or "
             "--split-mode layer")
    smi = f"{_SMI}: another process (a second server, a desktop app) holding the device is the cause instead"
    first = {"weights": [layers, compute], "compute": [compute, layers], "kv": [kv, compute],
             "unknown": [layers, compute]}[phase]
    return Verdict("does-not-fit", ev, first + [smi, split] + ([kv] if phase != "kv" else []))


def _vllm(f: Figures, ev: list[str]) -> Verdict:
    T, A, W, N, P, K = f.total, f.allowed, f.allocated, f.other_allocations, f.activation_peak, f.kv_cache
    util = (A / T) if (A and T) else None
    knobs = ("cut the activation peak: lower max_num_batched_tokens / max_num_seqs (and max_model_len); "
             "--enforce-eager skips the CUDA-graph memory")
    smaller = ("a smaller or quantized model (AWQ/GPTQ/FP8), or tensor_parallel_size > 1 to split the weights "
               "across GPUs")
    R = f.requested
    lens = {h.split(":", 1)[0]: int(h.split(":", 1)[1]) for h in f.hints if h.startswith("vllm-") and ":" in h}
    mx, est = lens.get("vllm-maxlen"), lens.get("vllm-estlen")   # configured max_model_len; what the KV holds
    if R is not None and K is not None and K > 0 and R > K:
        ev.append(f"one request at max_model_len{f' {mx}' if mx else ''} needs {fmt(R)} of KV cache; "
                  f"{fmt(K)} is available -- what gpu_memory_utilization leaves after the weights and the "
                  "activation peak: the configured budget binds, not the device")
        return Verdict("memory-fraction", ev, [
            "fit the budget to the configuration: lower max_model_len (--max-model-len"
            + (f" <= {est}, vLLM's own estimate" if est else f", to about {K / R:.0%} of {mx}" if mx else "")
            + ") or raise gpu_memory_utilization (the fraction of the card vLLM may use) if the GPU has the room",
            "a smaller KV cache per token: kv_cache_dtype=fp8; " + knobs, smaller])
    if R is None and mx is not None and est is not None and est < mx:
        ev.append(f"max_model_len {mx} tokens > the {est} tokens the KV cache can hold under gpu_memory_utilization: "
                  "one request at the full length would not fit the configured budget")
        return Verdict("memory-fraction", ev, [
            f"fit the budget to the configuration: lower max_model_len (--max-model-len <= {est}) or raise "
            "gpu_memory_utilization (the fraction of the card vLLM may use) if the GPU has the room",
            "a smaller KV cache per token: kv_cache_dtype=fp8; " + knobs, smaller])
    if T is not None and A is not None and W is not None:
        need = W + (N or 0) + (P or 0)
        ev.append(f"vLLM's budget = total {fmt(T)} x gpu_memory_utilization {util:.2f} = {fmt(A)}; weights {fmt(W)} "
                  f"+ non-torch {fmt(N)} + activation peak {fmt(P)} = {fmt(need)}"
                  + (f"; left for the KV cache: {fmt(K)}" if K is not None else ""))
        if need > 0.95 * T:
            ev.append(f"{fmt(need)} > 95% of the card ({fmt(int(0.95 * T))}): no gpu_memory_utilization leaves "
                      "room for a KV cache -- the model does not fit this device")
            return Verdict("does-not-fit", ev, [smaller + f": the weights alone take {fmt(W)} of {fmt(T)}",
                                                knobs, "a GPU with more memory"])
        want = min(0.95, (need + max(T // 20, GiB // 2)) / T)
        ev.append(f"{fmt(need)} > the budget {fmt(A)} but < the card's {fmt(T)}: the configured fraction binds, "
                  f"not the device -- at gpu_memory_utilization ~{want:.2f} a KV cache fits")
        return Verdict("memory-fraction", ev, [
            f"raise gpu_memory_utilization from {util:.2f} to ~{want:.2f} (--gpu-memory-utilization; the fraction "
            "is of the whole card, so anything else on the GPU must fit in the rest)", knobs, smaller])
    ev.append("vLLM sizes its KV cache as total x gpu_memory_utilization less the weights and the profiled "
              "activation peak (older versions also count other processes' memory) and none was left; the "
              "profiling lines before the error ('model weights take ...', 'reserved for KV Cache is ...', "
              "'Available KV cache memory') would say whether the fraction or the card binds")
    ev.append("presumed: the configured fraction binds (the error's own advice); missing: total, the fraction, "
              "the weights")
    return Verdict("memory-fraction", ev, [
        "raise gpu_memory_utilization (--gpu-memory-utilization; 0.9 by default -- a small fraction leaves the "
        "weights no room for a KV cache); the fraction is of the whole card, so anything else on the GPU must fit "
        "in the rest",
        knobs,
        smaller + " -- if the weights alone approach the card",
        f"{_SMI}: another process on the GPU shrinks what vLLM can take"])


_LIBRARIES = {"cupy": _cupy, "rmm": _rmm, "numba": _numba, "ggml": _ggml, "vllm": _vllm}


def triage(f: Figures, *, distributed: bool = False, cudnn_benchmark: bool = False,
           cuda_graphs: bool = False) -> Verdict:
    """Which stack, what binds, then that stack's causes in order -- each on evidence."""
    pre: list[str] = [f"WARNING: {w}" for w in f.warnings]
    pre.append(f"stack: {STACKS.get(f.stack, f.stack)}")
    if f.messages > 1:
        pre.append(f"{f.messages} out-of-memory messages in the input"
                   + (f" (GPUs {', '.join(map(str, f.devices))})" if len(f.devices) > 1 else "")
                   + f"; triaged: #{f.index}" + (" (the last failure, usually the fatal one)"
                                                 if f.index == f.messages else "")
                   + " -- --message N triages another")
    if f.unread:
        pre.append(f"the log holds more out-of-memory text than is read closely: the first {fmt(MAX_READ)} of it "
                   f"were read, {fmt(f.unread)} more were not")
    lim, lim_name = budget(f)
    if lim is not None and f.stack not in ("host", "jax"):
        pre.append(f"binding limit: {lim_name}")
    v = _dispatch(f, distributed=distributed, cudnn_benchmark=cudnn_benchmark, cuda_graphs=cuda_graphs)
    v.evidence = pre + v.evidence
    v.next_steps = _localise(v.next_steps, f.stack)
    if f.truncated and v.cause == "unknown":
        v.next_steps.insert(0, "the message is truncated: paste all of it (every figure after the cut is unknown)")
    v.stack = f.stack
    v.binding = lim_name or None
    return v


def _dispatch(f: Figures, **flags: bool) -> Verdict:
    ev: list[str] = list(f.stats_notes) if f.stack not in ("pytorch-cuda", "pytorch-hip", "pytorch-xpu",
                                                              "cuda-runtime", "unknown", "nccl", "cudnn") else []
    if f.stack == "host":
        return _host(f)
    if "handle" in f.hints and f.requested is None and f.total is None:
        return _tf_handle(f)
    if f.stack == "pytorch-mps":
        return _mps(f, ev)
    if f.stack == "pytorch-cuda-async":
        return _async(f, ev)
    if f.stack in ("tensorflow", "tensorflow-rocm"):
        return _tf(f, ev)
    if f.stack == "jax":
        return _jax(f, ev)
    if f.stack in LIBRARY_STACKS:
        return _LIBRARIES[f.stack](f, ev)
    # PyTorch's caching allocator (CUDA, HIP, XPU), NCCL, library statuses, bare runtime errors
    pv = _pytorch_extra(f, flags)
    if pv is not None:
        return pv
    v = _triage_pytorch(f, **flags)
    if v.cause == "unknown" and f.requested is None and f.total is None and f.allocated is None \
            and not (f.hints & {"nccl", "cudnn", "allocfail", "cublas", "unreadable", "overflow"}) \
            and f.kind == "driver" and not flags.get("distributed") \
            and not flags.get("cudnn_benchmark") and not flags.get("cuda_graphs"):
        v = Verdict("does-not-fit", [
            "presumed: the message is the runtime's bare 'out of memory' and carries no figures; the commonest cause "
            "is a workload too large for the card -- the second step tells it from a co-tenant"],
            ["shrink the batch (keep the effective batch with gradient accumulation), the input size or the model",
             "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv: if another process holds "
             "the card, that is the cause instead -- stop it",
             "get the figures: PyTorch >= 2.1 prints free, reserved and other processes in its OOM message "
             "(upgrade, or print torch.cuda.memory_summary() in an except block)",
             "mixed precision, activation checkpointing; restart the process last"])
    if v.cause == "does-not-fit" and f.stack == "pytorch-hip" and f.total and \
            (f.total <= 4 * GiB or (f.requested or 0) > f.total):
        v.next_steps.insert(0, f"the HIP device reports {fmt(f.total)}: on an APU (Ryzen/Strix iGPU) that is the "
                               "BIOS carve-out (UMA frame buffer) or the GTT window, not the RAM -- raise the UMA "
                               "size in the BIOS or the GTT limit (amdgpu.gttsize / ttm pages_limit) and update ROCm; "
                               "on a discrete card, shrink what the operation is given")
    return v


def _pytorch_extra(f: Figures, flags: dict[str, bool]) -> Verdict | None:
    """Causes the six-cause walk does not know: a binding memory fraction, the job's own ranks, cache held by
    pending cross-stream frees, growth across iterations, an APU's carve-out."""
    R, T, A, Rs, Fr = f.requested, f.total, f.allocated, f.reserved, f.free
    ru = f.reserved_unallocated
    ev: list[str] = []
    if "growing" in f.hints:
        ev.extend(f.stats_notes)
        ev.append("the live (allocated) figure grows from one OOM to the next: memory accumulates across "
                  "iterations rather than one step being too large")
        return Verdict("leak", ev, [
            "find what accumulates across steps: losses/outputs kept with their graph (use loss.item(), "
            ".detach()), lists of tensors, caches keyed by shape, hooks that store activations",
            "compare two steps: torch.cuda.memory._record_memory_history(); dump snapshots at steps N and N+k "
            "(torch.cuda.memory._dump_snapshot) and diff them (memspec oom explain --snapshot)",
            "wrap evaluation in torch.no_grad()/inference_mode", "restart the process (last: the leak comes back)"])
    if f.allowed is not None and T and f.allowed < 0.98 * T and Fr is not None and R is not None:
        used = Rs if Rs is not None else (A or 0)
        floor = _SEGMENT_FLOOR.get(R, R) if f.kind.startswith("pytorch") else R
        # 'Tried to allocate' is the segment cudaMalloc was refused; the printed 'allowed' is rounded to 2 decimals
        if used + R > f.allowed * 0.995 and Fr >= floor:
            ev.extend(f"{k} {fmt(getattr(f, k))} = {why}" for k, why in f.derived.items()
                      if k in ("reserved", "reserved_unallocated"))
            ev.append(f"reserved {fmt(used)} + requested {fmt(floor)} > {fmt(f.allowed)} allowed, while the device "
                      f"has {fmt(Fr)} free of {fmt(T)}: the per-process memory fraction binds, not the device")
            if f.private_pools:
                ev.append(f"private pools ({fmt(f.private_pools)}) are part of the reserved memory under that cap, "
                          "not the cause")
            return Verdict("memory-fraction", ev, [
                f"the per-process memory fraction is the binding limit ({fmt(f.allowed)} allowed of {fmt(T)}): raise "
                "torch.cuda.set_per_process_memory_fraction(...) or find the code (a test, a serving framework's "
                "gpu_memory_utilization) that set it",
                "or fit under it: shrink the batch"
                + (", or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to waste less of the allowed memory "
                   f"({fmt(ru)} of it is reserved but unallocated)" if ru is not None and ru >= floor else ""),
                "torch.cuda.empty_cache() returns cached segments so they stop counting against the cap"])
    ranks = _own_ranks(f)
    if ranks is not None and R is not None:
        total_ranks = sum(u for _, u in ranks)
        ev.append(f"{len(ranks)} 'Process' lines of about {fmt(min(u for _, u in ranks))}-"
                  f"{fmt(max(u for _, u in ranks))} with near-consecutive PIDs ({ranks[0][0]}..{ranks[-1][0]}): "
                  f"the job's own ranks, each with a CUDA context (and maybe tensors) on this device "
                  f"-- {fmt(total_ranks)} in all; not co-tenants to kill")
        return Verdict("own-ranks", ev, [
            "pin each rank to its own GPU before any CUDA work: torch.cuda.set_device(local_rank) (or "
            "device=f'cuda:{local_rank}'), and torch.load(..., map_location=f'cuda:{local_rank}' or 'cpu') so "
            "checkpoints do not land on GPU 0; do not kill these processes -- they are the job",
            "check that nothing calls torch.cuda.* (empty_cache, synchronize, memory stats) before set_device, "
            "and that CUDA_VISIBLE_DEVICES is not set identically for all ranks",
            "then size the batch for one rank per GPU"])
    if A is not None and Rs and ru is not None and R is not None and A <= 0.01 * Rs and Rs >= GiB \
            and ru >= R and (T is None or Rs >= 0.1 * T):
        ev.append(f"PyTorch holds {fmt(Rs)} reserved but only {fmt(A)} allocated: with almost nothing live there "
                  "are no live blocks to fence holes, so this is not fragmentation -- the cache is held by frees "
                  "still waiting on events recorded on other streams (record_stream, side streams, NCCL)")
        return Verdict("stream-events", ev, [
            "torch.cuda.synchronize() then torch.cuda.empty_cache(): once the streams finish, the pending frees "
            "complete and the cached segments can be released and reused",
            "stop record_stream() on tensors freed every step (let the side stream own them, or wait on an event "
            "before freeing); allocate on the stream that uses the tensor",
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True only after that (it does not release pending frees)",
            "restart the process (last)"])
    return None


def explain_text(f: Figures, v: Verdict) -> str:
    """The human-readable report."""
    fig = "; ".join(f"{k.replace('_', ' ')} {fmt(getattr(f, k))}" for k in FIGURES
                    if k != "other_processes" and getattr(f, k) is not None)
    lines = [f"OOM ({STACKS.get(f.stack, f.stack)}; format {f.kind}): {fig or 'no figures'}"]
    if f.tensor_shape:
        lines.append(f"tensor: shape {f.tensor_shape}" + (f" {f.dtype} = {fmt(f.tensor_bytes)}" if f.dtype else ""))
    if f.messages > 1:
        lines.append(f"{f.messages} out-of-memory messages in the input (triaged: #{f.index}; --message N for another):")
        for d in f.summaries[:20]:
            figs = ", ".join(f"{k.replace('_', ' ')} {fmt(d[k])}" for k in FIGURES if k in d)
            lines.append(f"  {'*' if d['index'] == f.index else ' '}#{d['index']} [{d['stack']}] {figs or 'no figures'}"
                         + (" (not a failure: TensorFlow says it will retry)" if d.get("not_a_failure") else ""))
        if len(f.summaries) > 20:
            lines.append(f"   ... {len(f.summaries) - 20} more")
    if f.other_processes:
        lines.append("other processes: " + ", ".join(f"{p} {fmt(u)}" for p, u in f.other_processes))
    lines.append(f"verdict: {v.cause} -- {CAUSES[v.cause]}")
    lines += ["evidence:"] + [f"  - {e}" for e in v.evidence]
    lines += ["next steps (cheapest first):"] + [f"  {i}. {s}" for i, s in enumerate(v.next_steps, 1)]
    return "\n".join(lines)


def figures_from_snapshot(snap: dict) -> Figures:
    """Figures from a ``torch.cuda.memory._snapshot()`` (segments, and the
    trace's last ``oom`` entry: its size and ``device_free``)."""
    segs = snap.get("segments") or []
    f = Figures(kind="snapshot")
    f.reserved = sum(int(s["total_size"]) for s in segs)
    f.allocated = sum(int(b["size"]) for s in segs for b in s.get("blocks", []) if b.get("state") == "active_allocated")
    f.reserved_unallocated = f.reserved - f.allocated
    f.largest_free_block = max((int(b["size"]) for s in segs for b in s.get("blocks", []) if b.get("state") == "inactive"),
                               default=0)
    pools = sum(int(b["size"]) for s in segs if tuple(s.get("segment_pool_id") or (0, 0)) != (0, 0)
                for b in s.get("blocks", []) if b.get("state") == "active_allocated")
    f.private_pools = pools
    f.segments = len(segs)
    cap = (snap.get("allocator_settings") or {}).get("memspec_capacity")
    if cap:
        f.total = int(cap)
    for trace in snap.get("device_traces") or []:
        for e in trace or []:
            if e.get("action") == "oom":
                f.requested = int(e["size"])
                free = e.get("device_free", e.get("addr"))
                f.free = int(free) if free is not None else None
    if f.total is not None and f.free is not None:
        f.other_processes = None
    return f

