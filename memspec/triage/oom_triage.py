"""OOM triage: the :class:`Verdict`, PyTorch's cause walk and the next steps of each cause.

Part of :mod:`memspec.triage.oom` (split along its sections, each module under
1,200 lines); every name here is a name of that module: import from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .oom_figures import (Figures, MiB, _CONTEXT_ALLOWANCE, fmt)


# ---------------------------------------------------------------------------
# Triage
# ---------------------------------------------------------------------------


@dataclass
class Verdict:
    cause: str
    evidence: list[str]
    next_steps: list[str]
    stack: str = "unknown"
    binding: str | None = None

    def as_json(self, f: Figures) -> dict[str, Any]:
        out = {"parsed": f.parsed(), "cause": self.cause, "evidence": self.evidence, "next_steps": self.next_steps,
               "stack": self.stack, "binding_limit": self.binding, "warnings": f.warnings,
               "truncated": f.truncated, "messages": f.summaries, "triaged_message": f.index}
        if f.tensor_shape:
            out["tensor"] = {"shape": f.tensor_shape, "dtype": f.dtype, "bytes": f.tensor_bytes}
        return out


#: ``Tried to allocate`` prints the size cudaMalloc was asked for: a request of
#: (1 MiB, 10 MiB] asks for a 20 MiB segment, one <= 1 MiB for a 2 MiB segment
#: (kLargeBuffer, kSmallBuffer); the tensor itself may be much smaller.
_SEGMENT_FLOOR = {20 * MiB: MiB + 512, 2 * MiB: 512}



def _hint(f: Figures, flags: dict[str, bool], name: str) -> str | None:
    """Why a library is implicated: a flag or the text itself, or None."""
    flag = {"nccl": "distributed", "cudnn": "cudnn_benchmark", "graphs": "cuda_graphs"}[name]
    if flags.get(flag):
        return f"--{flag.replace('_', '-')} given"
    if name in f.hints:
        return f"the text mentions {name.upper() if name == 'nccl' else 'cuDNN'}"
    return None


def _fits(f: Figures) -> tuple[int | None, int | None, str]:
    """(room on the device, room for the request at best, formula)."""
    if f.free is None:
        return None, None, ""
    room = f.free
    formula = f"free {fmt(f.free)}"
    if f.allowed is not None and f.reserved is not None:
        under_cap = max(0, f.allowed - f.reserved)
        if under_cap < room:
            room = under_cap
            formula = f"min(free {fmt(f.free)}, allowed {fmt(f.allowed)} - reserved {fmt(f.reserved)})"
    if f.reserved_unallocated is None:
        return room, None, formula
    return room, room + f.reserved_unallocated, formula + f" + reserved-but-unallocated {fmt(f.reserved_unallocated)}"


def _triage_pytorch(f: Figures, *, distributed: bool = False, cudnn_benchmark: bool = False,
                    cuda_graphs: bool = False) -> Verdict:
    """PyTorch's caching allocator: does it fit?  Then seed 003's six causes in order, each on evidence."""
    flags = {"distributed": distributed, "cudnn_benchmark": cudnn_benchmark, "cuda_graphs": cuda_graphs}
    ev: list[str] = []
    R = f.requested
    T = f.total
    cap = f.allowed if f.allowed is not None else T
    cap_name = "allowed" if f.allowed is not None else "total"
    floor = _SEGMENT_FLOOR.get(R, R) if (R is not None and f.kind.startswith(("pytorch", "seed"))) else R
    if f.self_pid_note:
        ev.append(f.self_pid_note)
    for k, why in f.derived.items():
        if k in ("reserved", "reserved_unallocated", "this_process", "allocated", "free"):
            ev.append(f"{k} {fmt(getattr(f, k))} = {why}")
    ev.extend(f.stats_notes)
    if R is not None and floor != R:
        ev.append(f"'Tried to allocate {fmt(R)}' is a whole segment: the tensor asked for may be as small as "
                  f"{fmt(floor)} (requests of 1-10 MiB get a 20 MiB segment, <= 1 MiB a 2 MiB one)")

    others = sum(u for _, u in f.other_processes) if f.other_processes else 0
    room, best, formula = _fits(f)
    expandable_ok = best is not None and floor is not None and floor <= best
    nccl_why, cudnn_why, graphs_why = _hint(f, flags, "nccl"), _hint(f, flags, "cudnn"), _hint(f, flags, "graphs")
    nonpt = (f.this_process - f.reserved) if (f.this_process is not None and f.reserved is not None) else None
    # memory outside this process's PyTorch that no listed co-tenant explains
    if T is not None and f.free is not None and f.reserved is not None:
        outside = T - f.free - f.reserved
        unlisted = outside - others - (max(nonpt, 0) if nonpt is not None else 0)
    else:
        outside = unlisted = None

    # ---- 0. not a size at all
    if "overflow" in f.hints and R is None:
        return Verdict("does-not-fit", ev + [
            "'Tried to allocate more than 1EB': the size itself is absurd (>= 2**60 bytes) -- a shape or size "
            "computation overflowed or went negative"], [
            "find the allocation in the traceback and print the shape it was given; fix the arithmetic "
            "(negative dimension, int overflow, a length read from corrupt data)"])

    # ---- 1. does it fit at all?
    if R is not None and cap is not None and R > cap:
        ev.append(f"requested {fmt(R)} > {cap_name} {fmt(cap)}: the request alone is larger than "
                  f"{'the memory this process may use' if f.allowed is not None else 'the whole card'}; "
                  "no allocator setting can place it")
        if cudnn_why:
            ev.append(f"{cudnn_why}: a single request this large is typically the workspace of the convolution "
                      "algorithm cuDNN picked, not a tensor")
            return Verdict("cudnn-workspace", ev, _steps("cudnn-workspace", f, expandable_ok))
        return Verdict("does-not-fit", ev, _steps("does-not-fit-request", f, expandable_ok))

    if R is not None and best is not None and floor > best:
        short = floor - best
        ev.append(f"requested {fmt(floor)} > {formula} = {fmt(best)}: even a perfectly packed allocator "
                  f"(expandable segments included) could not place it; {fmt(short)} short")
        holders = []
        if others:
            holders.append(f"other processes {fmt(others)} ({', '.join(f'{p}: {fmt(u)}' for p, u in f.other_processes)})")
        if f.private_pools:
            holders.append(f"CUDA-graph private pools {fmt(f.private_pools)}")
        if nonpt is not None:
            holders.append(f"this process outside PyTorch {fmt(nonpt)} (this process {fmt(f.this_process)} - "
                           f"reserved {fmt(f.reserved)})")
        if f.allocated is not None:
            holders.append(f"PyTorch's live tensors {fmt(f.allocated - (f.private_pools or 0))}")
        if holders:
            ev.append("who holds the card: " + "; ".join(holders))
        # who, if released, would make room -- in the seed's order
        if others >= short:
            ev.append(f"the other processes hold {fmt(others)} >= the {fmt(short)} missing")
            return Verdict("other-processes", ev, _steps("other-processes", f, expandable_ok))
        if nonpt is None and unlisted is not None and f.other_processes is None \
                and unlisted - _CONTEXT_ALLOWANCE >= max(short, T // 5):
            ev.append(f"total {fmt(T)} - free {fmt(f.free)} - reserved {fmt(f.reserved)} = {fmt(outside)} is held "
                      f"outside this process's PyTorch; a CUDA context and the driver's reserve explain about "
                      f"{fmt(_CONTEXT_ALLOWANCE)}, leaving {fmt(unlisted - _CONTEXT_ALLOWANCE)} >= the {fmt(short)} "
                      "missing: another process (the message lists none; check nvidia-smi)")
            return Verdict("other-processes", ev, _steps("other-processes", f, expandable_ok))
        if nccl_why and ((nonpt is not None and nonpt >= short) or "nccl" in f.hints
                         or (nonpt is None and unlisted is not None and unlisted >= short)):
            held = nonpt if nonpt is not None else unlisted
            ev.append(f"{nccl_why}; {fmt(held)} of device memory is outside PyTorch's allocator, where NCCL keeps "
                      "its communication buffers")
            return Verdict("nccl", ev, _steps("nccl", f, expandable_ok))
        if (f.private_pools or 0) >= short:
            ev.append(f"private pools hold {fmt(f.private_pools)} >= the {fmt(short)} missing")
            return Verdict("graph-pools", ev, _steps("graph-pools", f, expandable_ok))
        if graphs_why and f.private_pools is None:
            ev.append(f"{graphs_why}; the message predates the private-pool figure, so the graphs' share is unknown")
            return Verdict("graph-pools", ev, _steps("graph-pools", f, expandable_ok))
        if cudnn_why and (R >= 256 * MiB or (T and R >= T // 20)):
            ev.append(f"{cudnn_why}; a {fmt(R)} request on top of a nearly full card is the shape of a cuDNN "
                      "workspace spike")
            return Verdict("cudnn-workspace", ev, _steps("cudnn-workspace", f, expandable_ok))
        if nonpt is not None and nonpt - _CONTEXT_ALLOWANCE >= short:
            ev.append(f"this process holds {fmt(nonpt)} outside PyTorch's allocator (more than a CUDA context): "
                      "another library in the process (NCCL, cuDNN/cuBLAS workspaces, a second framework) -- "
                      "the message cannot say which")
            return Verdict("unknown", ev + ["missing: which library holds the non-PyTorch memory "
                                            "(rerun with NCCL_DEBUG=INFO, or say --distributed / --cudnn-benchmark)"],
                           _steps("unknown", f, expandable_ok))
        if unlisted is not None and nonpt is not None and unlisted >= short and unlisted > _CONTEXT_ALLOWANCE:
            ev.append(f"{fmt(unlisted)} of the card is held by nobody listed (total - free - this process - "
                      "other processes): processes the driver does not show (other containers) or the driver's reserve")
            cause = "other-processes" if T and unlisted >= T // 7 else "driver-reserve"
            return Verdict(cause, ev, _steps(cause, f, expandable_ok))
        if f.allocated is not None and T:
            ev.append(f"PyTorch's live tensors take {fmt(f.allocated)} = {100 * f.allocated / T:.0f}% of the "
                      f"card: the workload does not fit")
        return Verdict("does-not-fit", ev, _steps("does-not-fit-live", f, expandable_ok))

    # ---- the request could be placed by a perfect packer (or the figures cannot say)
    need = None
    if R is not None and room is not None:
        need = floor - room if floor > room else floor
        if floor <= room:
            ev.append(f"the driver reported {fmt(f.free)} free >= the {fmt(floor)} asked, yet the allocation "
                      "failed: the free figure is not all allocatable (the driver's own page tables and reserve; "
                      "on Windows, WDDM), or another process took it meanwhile")
    ru = f.reserved_unallocated
    other_weight = others
    if f.other_processes is None and unlisted is not None:
        other_weight = max(0, unlisted - _CONTEXT_ALLOWANCE)
    ratio = (f.reserved / f.allocated) if (f.reserved is not None and f.allocated) else None
    headroom = (f.free + ru) if (f.free is not None and ru is not None) else None
    hinted = bool(nccl_why or cudnn_why or graphs_why) or (T is not None and (f.private_pools or 0) >= T // 10)
    strong_frag = ru is not None and need is not None and ru >= need and (
        (ratio is not None and ratio >= 1.3)
        or (R is not None and ru >= R and headroom is not None and cap and headroom >= 0.1 * cap))

    # does-not-fit: the live set is at the card's edge (the "97% full of live tensors")
    live = f.allocated - (f.private_pools or 0) if f.allocated is not None else None   # graphs' pools aside
    if live is not None and cap and live >= 0.9 * cap and (ru is None or ru < 0.05 * cap) \
            and other_weight < 0.05 * cap:
        ev.append(f"PyTorch's live tensors take {fmt(live)} = {100 * live / cap:.0f}% of the "
                  f"{cap_name} {fmt(cap)}; reserved-but-unallocated is only {fmt(ru)}: defragmenting would buy "
                  "under 5% -- the workload is at the edge")
        return Verdict("does-not-fit", ev, _steps("does-not-fit-live", f, expandable_ok))
    if headroom is not None and cap and headroom < 0.1 * cap and not strong_frag and not hinted \
            and other_weight < max(need or 0, cap // 20):
        ev.append(f"free {fmt(f.free)} + reserved-but-unallocated {fmt(ru)} = {fmt(headroom)} = "
                  f"{100 * headroom / cap:.1f}% of the {cap_name} {fmt(cap)}: even perfectly packed, the card is "
                  f"full of this process's memory"
                  + (f" (reserved/allocated = {ratio:.2f}, ordinary churn)" if ratio else "")
                  + " -- the workload does not fit")
        return Verdict("does-not-fit", ev, _steps("does-not-fit-live", f, expandable_ok))

    # does-not-fit: the stranded cache could not hold the request even coalesced into one block (ru < the
    # request), so placing it takes fresh device memory as well -- and a perfect packer would leave under 10%
    # of the limit: the live set is at the edge, defragmenting buys one allocation, not the workload
    if ru is not None and floor is not None and ru < floor and best is not None and best >= floor and cap \
            and best - floor < 0.1 * cap and not hinted and other_weight < max(need or 0, cap // 20):
        ev.append(f"reserved-but-unallocated {fmt(ru)} < the {fmt(floor)} requested: even coalesced into one "
                  f"block the cache could not hold it, so it needs fresh device memory too; placed by a perfect "
                  f"packer ({formula} = {fmt(best)}) it would leave {fmt(best - floor)} = "
                  f"{100 * (best - floor) / cap:.1f}% of the {cap_name} {fmt(cap)} -- the live set is at the edge: "
                  "the workload does not fit (a defragmenting setting would place this request, not the next)")
        return Verdict("does-not-fit", ev, _steps("does-not-fit-live", f, expandable_ok))
    # cause 1: fragmentation
    if strong_frag and ru >= other_weight:
        ev.append(f"reserved-but-unallocated {fmt(ru)} >= the {fmt(need)} the request lacks, yet no cached block "
                  f"could serve it: the free bytes are split between live blocks (fragmentation); "
                  f"{formula} = {fmt(best)} >= {fmt(floor)}, so a packer that maps pages (expandable segments) "
                  "can place it")
        if f.largest_free_block is not None:
            ev.append(f"largest free block {fmt(f.largest_free_block)} < {fmt(floor)}")
        if ratio is not None:
            ev.append(f"reserved/allocated = {fmt(f.reserved)}/{fmt(f.allocated)} = {ratio:.2f}"
                      + (" (>= 1.3: the seed's fragmentation signature)" if ratio >= 1.3 else ""))
        return Verdict("fragmentation", ev, _steps("fragmentation", f, expandable_ok))
    # cause 2: other processes
    if need is not None and other_weight >= need and (other_weight >= (T or 0) // 20):
        if f.other_processes:
            ev.append(f"other processes hold {fmt(others)} ({', '.join(f'{p}: {fmt(u)}' for p, u in f.other_processes)}) "
                      f">= the {fmt(need)} the request lacks")
        else:
            ev.append(f"total {fmt(T)} - free {fmt(f.free)} - reserved {fmt(f.reserved)} = {fmt(outside)} is outside "
                      f"this process's PyTorch; beyond a CUDA context and driver reserve (~{fmt(_CONTEXT_ALLOWANCE)}) "
                      f"{fmt(other_weight)} is unexplained -- another process (the message lists none; check nvidia-smi)")
        return Verdict("other-processes", ev, _steps("other-processes", f, expandable_ok))
    # cause 3: NCCL
    if nccl_why and (nonpt is None or need is None or nonpt >= need or "nccl" in f.hints):
        ev.append(f"{nccl_why}" + (f"; this process holds {fmt(nonpt)} outside PyTorch's allocator" if nonpt is not None else
                                   "; NCCL's buffers live outside PyTorch's figures"))
        return Verdict("nccl", ev, _steps("nccl", f, expandable_ok))
    # cause 4: graph pools
    if f.private_pools and need is not None and (f.private_pools >= need or (T and f.private_pools >= T // 10)):
        ev.append(f"private pools (CUDA graphs) hold {fmt(f.private_pools)} >= the {fmt(need)} the request lacks")
        return Verdict("graph-pools", ev, _steps("graph-pools", f, expandable_ok))
    if graphs_why and f.private_pools is None:
        ev.append(f"{graphs_why}; the message carries no private-pool figure")
        return Verdict("graph-pools", ev, _steps("graph-pools", f, expandable_ok))
    # cause 5: cuDNN
    if cudnn_why and (R is None or R >= 64 * MiB or "cudnn" in f.hints):
        ev.append(f"{cudnn_why}" + (f"; the {fmt(R)} request is workspace-sized" if R is not None else ""))
        return Verdict("cudnn-workspace", ev, _steps("cudnn-workspace", f, expandable_ok))
    # cause 6: driver reserve
    if R is not None and room is not None and floor <= room and f.reserved is not None:
        ev.append(f"nothing in the figures holds the memory the driver calls free: {fmt(f.free)} it reports "
                  "is not allocatable to this process")
        return Verdict("driver-reserve", ev, _steps("driver-reserve", f, expandable_ok))
    if nonpt is not None and unlisted is not None and need is not None and unlisted >= need and unlisted > 0:
        ev.append(f"{fmt(unlisted)} of the card is held by nobody listed (total - free - this process - others): "
                  "the driver's reserve")
        return Verdict("driver-reserve", ev, _steps("driver-reserve", f, expandable_ok))
    # fragmentation, weaker: free + stranded cache would fit it
    if ru is not None and best is not None and floor is not None and floor <= best and need is not None and ru >= need:
        ev.append(f"{formula} = {fmt(best)} >= the {fmt(floor)} requested: the stranded {fmt(ru)} is what the "
                  "device lacks")
        return Verdict("fragmentation", ev, _steps("fragmentation", f, expandable_ok))

    missing = [k for k in ("requested", "total", "free", "reserved", "allocated") if getattr(f, k) is None]
    if f.kind == "driver":
        ev.append("the message is the driver's (or a library's) bare 'out of memory': it carries no figures")
    if "cublas" in f.hints:
        ev.append("CUBLAS_STATUS_ALLOC_FAILED: cuBLAS could not allocate its handle/workspace -- the card was "
                  "already full when cuBLAS initialised")
    ev.append("missing: " + (", ".join(missing) if missing else "nothing decisive: no cause's evidence holds"))
    return Verdict("unknown", ev, _steps("unknown", f, expandable_ok))




def _steps(kind: str, f: Figures, expandable_ok: bool) -> list[str]:
    """Next steps, cheapest first; none that the figures rule out."""
    old = f.kind in ("pytorch-1.x", "pytorch-1.x-cached")
    expandable = ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch >= 2.1; one environment variable): "
                  "maps pages into one growing segment instead of stranding holes")
    shrink = "shrink the batch (keep the effective batch with gradient accumulation), the sequence length or the resolution"
    if kind == "does-not-fit-request":
        steps = ["find the operation in the traceback and shrink what it is given (batch, sequence length, "
                 "resolution), or process it in chunks: no allocator setting can place a request larger than the card",
                 "lower precision (fp16/bf16, 8/4-bit weights) to shrink that tensor",
                 "if it is a convolution: torch.backends.cudnn.benchmark=False (workspace-hungry algorithms are "
                 "skipped)",
                 "shard the model or the operation across GPUs (FSDP, tensor parallel) or offload to the CPU",
                 f"a device with more than {fmt(f.requested)} free"]
    elif kind == "does-not-fit-live":
        steps = [shrink,
                 "mixed precision (torch.autocast, bf16) and torch.no_grad()/inference_mode for evaluation",
                 "activation checkpointing (torch.utils.checkpoint) to trade compute for memory",
                 "free what is no longer needed (del tensors, don't accumulate loss tensors with their graphs; "
                 "empty_cache() only hands cache back to other processes, it does not make room for you)",
                 "shard (FSDP/ZeRO), offload, or a larger device"]
        if expandable_ok:
            steps.insert(1, expandable)
        if f.allowed is not None and f.free is not None and f.reserved is not None and f.free > f.allowed - f.reserved:
            steps.insert(0, f"the per-process limit binds ({fmt(f.allowed)} allowed; the device has {fmt(f.free)} "
                            "free): raise torch.cuda.set_per_process_memory_fraction, or shrink the batch to fit it")
    elif kind == "fragmentation":
        steps = []
        if expandable_ok:
            if old:
                steps.append("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:<N> (this PyTorch predates expandable "
                             "segments; N a little above the usual request) -- or upgrade to >= 2.1 and set "
                             "expandable_segments:True")
            else:
                steps.append(expandable)
        steps += ["steady tensor shapes: pad or bucket variable-length batches so freed blocks are reused",
                  shrink,
                  "restart the process (last: the holes come back with the workload)",
                  "note: torch.cuda.empty_cache() will not help -- it releases only wholly free segments, and "
                  "the stranded bytes sit between live blocks"]
    elif kind == "other-processes":
        steps = ["nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv: find the co-tenant "
                 "(a stale notebook kernel, a zombie dataloader, another job) and stop it",
                 "run on another GPU (CUDA_VISIBLE_DEVICES) or schedule the jobs apart",
                 "if the GPU must be shared: cap each process (torch.cuda.set_per_process_memory_fraction) or "
                 "use MPS to share one context"]
    elif kind == "nccl":
        steps = ["rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALLOC to see NCCL's allocations",
                 "destroy communicators/process groups you no longer use (dist.destroy_process_group); create "
                 "subgroups once, not per step",
                 "shrink NCCL's buffers: NCCL_BUFFSIZE, fewer channels (NCCL_MAX_NCHANNELS / NCCL_MIN_NCHANNELS), "
                 "or NCCL_NVLS_ENABLE=0",
                 "leave headroom for NCCL: a smaller batch, or a lower memory fraction for PyTorch's cache"]
    elif kind == "graph-pools":
        steps = ["drop CUDA graphs you no longer replay (the pool is freed only when the graph object dies); "
                 "torch._dynamo.reset() after torch.compile(mode='reduce-overhead')",
                 "capture fewer shapes (pad to a few buckets) and share one pool between graphs "
                 "(torch.cuda.graph_pool_handle()); serving engines: fewer capture sizes or eager mode",
                 "leave headroom for the graphs when sizing the batch / KV cache"]
    elif kind == "cudnn-workspace":
        steps = ["torch.backends.cudnn.benchmark=False (and/or deterministic=True): cuDNN then skips the "
                 "workspace-hungry algorithms",
                 "cap cuDNN's workspace (CUDNN_CONV_WSCAP_DBG=<MiB>, cuDNN v8 API) or upgrade cuDNN/PyTorch",
                 "shrink the convolution's input (batch, resolution) or run it in chunks",
                 "budget for the workspace, not only the tensors, when sizing the batch"]
    elif kind == "driver-reserve":
        steps = ["budget for the card's real capacity: total minus the driver/ECC reserve and the CUDA context "
                 "(0.5-1 GiB+), and size the batch to that",
                 "free the display: run headless or on a GPU without a monitor (Windows/WDDM holds memory for it)",
                 "check nvidia-smi -q -d MEMORY for reserved memory and ECC; a driver/CUDA update can change it"]
        if expandable_ok:
            steps.append(expandable)
    else:
        steps = ["paste the whole error message (PyTorch >= 2.1 prints free, reserved-but-unallocated and other "
                 "processes) or rerun to get it",
                 "give memspec the allocator's state: torch.cuda.memory_stats() (--memory-stats FILE) and "
                 "nvidia-smi --query-compute-apps=pid,used_memory --format=csv (--nvidia-smi FILE)",
                 "record a snapshot (torch.cuda.memory._record_memory_history(); torch.cuda.memory._dump_snapshot()) "
                 "and run memspec oom explain --snapshot FILE",
                 "say what runs: --distributed, --cudnn-benchmark, --cuda-graphs"]
    return steps

