"""``torch-caching``: PyTorch's CUDA caching allocator at the caching level
(seed 003's ``CACHING`` machine).  GPU only.

Blocks are ``torch.empty(size, dtype=torch.uint8, device="cuda")`` made under
``torch.cuda.stream(s)`` (the caching allocator's ``malloc(size, stream)``),
freed by dropping the tensor; ``record_stream`` is ``Tensor.record_stream``;
``complete_stream`` synchronizes the stream; ``empty_cache``,
``memory_stats``, ``memory_summary`` and ``snapshot`` are ``torch.cuda``'s.
The spec's streams 0, 1, 2 are the default stream and two side streams made
here; snapshot streams are mapped back to those numbers.

What the adapter adds (and says so): a size that is not a positive ``int`` is
refused with InvalidRequest (``torch.empty(0)`` would allocate nothing); a
second free of a handle is refused with DoubleFree by the adapter's own
bookkeeping (a tensor cannot be freed twice); ``torch.cuda.OutOfMemoryError``
becomes OutOfMemory carrying its message and the figures read from
``torch.cuda`` at that moment (allocated, reserved, ``mem_get_info``; the
largest free block is not exposed: None).  ``capacity`` is applied with
``torch.cuda.set_per_process_memory_fraction``.

The allocator is process-global: a target instance starts by emptying the
cache and resetting the statistics, and its ``close`` frees every block and
empties the cache again, so instances must not overlap in time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from memspec.spec.api import TargetInstance
from memspec.spec.errors import DoubleFree, ForeignAllocation, InvalidRequest, OutOfMemory

from memspec.adapters._common import TargetUnavailable, require_gpu, require_module

STREAMS = 3


@dataclass(eq=False)
class TorchBlock:
    """``CachingBlockHandle``: the block PyTorch gave for one malloc."""

    address: int
    size: int
    requested_size: int
    stream: int
    owner: object = field(repr=False, default=None)
    tensor: Any = field(repr=False, default=None)


def oom_error(torch: Any, e: BaseException, requested: int, device: int = 0) -> OutOfMemory:
    """PyTorch's OOM as OutOfMemory: its message, and the figures read from ``torch.cuda`` now."""
    free, total = torch.cuda.mem_get_info(device)
    allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    return OutOfMemory(str(e), requested=requested, total_capacity=int(total), free=int(free),
                       allocated=int(allocated), reserved=int(reserved),
                       reserved_unallocated=int(reserved - allocated), largest_free_block=None, device=device)


class TorchCachingAllocator:
    """seed 003's ``CachingAllocator`` interface over ``torch.cuda``."""

    def __init__(self, torch: Any, device: int = 0) -> None:
        self.torch = torch
        self.device = device
        self.streams = [torch.cuda.default_stream(device)] + [torch.cuda.Stream(device) for _ in range(STREAMS - 1)]
        self.stream_ids = {int(s.cuda_stream): i for i, s in enumerate(self.streams)}
        self.live: dict[int, TorchBlock] = {}

    def _stream(self, stream: Any) -> Any:
        if not isinstance(stream, int) or isinstance(stream, bool) or not 0 <= stream < STREAMS:
            raise InvalidRequest(f"stream {stream!r} is not one of 0..{STREAMS - 1}")
        return self.streams[stream]

    def malloc(self, size: int, stream: int = 0) -> TorchBlock:
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise InvalidRequest(f"size {size!r} is not a positive int")
        torch = self.torch
        s = self._stream(stream)
        try:
            with torch.cuda.stream(s):
                t = torch.empty(size, dtype=torch.uint8, device=f"cuda:{self.device}")
        except torch.cuda.OutOfMemoryError as e:
            raise oom_error(torch, e, size, self.device) from None
        ptr = int(t.data_ptr())
        block_size = self._block_size(ptr)
        b = TorchBlock(ptr, block_size, size, stream, self, t)
        self.live[id(b)] = b
        return b

    def _block_size(self, ptr: int) -> int:
        for seg in self.torch.cuda.memory_snapshot():
            if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
                for blk in seg["blocks"]:
                    if blk["address"] == ptr:
                        return int(blk["size"])
        raise RuntimeError(f"block at {ptr:#x} is not in torch.cuda.memory_snapshot()")

    def _own(self, block: Any) -> TorchBlock:
        if not isinstance(block, TorchBlock) or block.owner is not self:
            raise ForeignAllocation(f"{block!r} was not made by this allocator")
        if id(block) not in self.live:
            raise DoubleFree(f"block at {block.address:#x} was already freed")
        return block

    def free(self, block: TorchBlock) -> None:
        b = self._own(block)
        del self.live[id(b)]
        b.tensor = None  # the last reference: the caching allocator frees (or defers on recorded streams)

    def record_stream(self, block: TorchBlock, stream: int) -> None:
        self._own(block).tensor.record_stream(self._stream(stream))

    def complete_stream(self, stream: int) -> None:
        self._stream(stream).synchronize()

    def synchronize(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def empty_cache(self) -> int:
        before = self.torch.cuda.memory_reserved(self.device)
        self.torch.cuda.empty_cache()
        return before - self.torch.cuda.memory_reserved(self.device)

    def memory_stats(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.torch.cuda.memory_stats(self.device).items() if isinstance(v, (int, float))}

    def memory_summary(self) -> str:
        return self.torch.cuda.memory_summary(self.device)

    def snapshot(self) -> dict:
        segs = []
        for seg in self.torch.cuda.memory_snapshot():
            if seg.get("device", self.device) != self.device:
                continue
            segs.append({
                "address": int(seg["address"]), "total_size": int(seg["total_size"]),
                "segment_type": seg["segment_type"], "is_expandable": bool(seg.get("is_expandable", False)),
                "stream": self.stream_ids.get(int(seg["stream"]), -1),
                "blocks": [{"address": int(b["address"]), "size": int(b["size"]), "state": b["state"],
                            "requested_size": int(b.get("requested_size", 0))} for b in seg["blocks"]],
            })
        return {"segments": segs}

    def close(self) -> None:
        for b in list(self.live.values()):
            b.tensor = None
        self.live.clear()
        self.torch.cuda.synchronize(self.device)
        self.torch.cuda.empty_cache()


def _with_extras(inst: TargetInstance, **extras: Any) -> TargetInstance:
    """The only place this adapter fills ``TargetInstance`` beyond the constructor keywords."""
    inst.extras = dict(extras)
    return inst


def torch_caching(capacity: int | None = None) -> TargetInstance:
    """PyTorch's caching allocator on device 0 (GPU only)."""
    torch = require_module("torch", "torch-caching")
    require_gpu("torch-caching")
    if not torch.cuda.is_available():
        raise TargetUnavailable("target 'torch-caching': torch.cuda.is_available() is False")
    total = torch.cuda.get_device_properties(0).total_memory
    cap = total if capacity is None else min(int(capacity), total)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(cap / total, 0)
    torch.cuda.reset_peak_memory_stats(0)
    torch.cuda.reset_accumulated_memory_stats(0)
    alloc = TorchCachingAllocator(torch, 0)
    expandable = "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    inst = TargetInstance(mechanism=None, ep=None, physical_bytes=lambda: int(torch.cuda.memory_reserved(0)),
                          capacity=cap, close=alloc.close, kind="caching", allocator=alloc)
    return _with_extras(inst, policy="pytorch", expandable=expandable)
