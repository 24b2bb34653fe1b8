"""Differential: one malloc/free/empty_cache trace on PyTorch's CUDA caching
allocator and on memspec's ``pytorch`` preset (``reference-caching``),
compared step by step.

``python -m memspec.adapters.torch_differential [--length N] [--seed S]
[--capacity BYTES] [--dry-run]``

After every step both sides are read: ``allocated_bytes.all.current``,
``reserved_bytes.all.current``, ``segment.all.current``,
``num_alloc_retries``, ``num_ooms``, whether the step raised OutOfMemory, and
the segment layout (each segment's pool, total size and its blocks' sizes and
states in address order; segments compared as a multiset, since the driver
chooses where segments land).  The first differing step is printed with both
sides' figures; exit status 1 on a difference, 0 when the whole trace agrees,
2 when PyTorch or a GPU is missing.

PyTorch's side uses ``torch.cuda.caching_allocator_alloc/delete`` on stream
0 (the default stream) and a side stream, ``torch.cuda.empty_cache``,
``memory_stats`` and ``memory_snapshot``; its capacity is set with
``set_per_process_memory_fraction``.  ``--dry-run`` replays the trace on the
preset only (no GPU) and prints its figures: the CPU half of the check.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import Any

from memspec.spec.errors import OutOfMemory

MiB = 1 << 20
KEYS = ("allocated_bytes.all.current", "reserved_bytes.all.current", "segment.all.current",
        "num_alloc_retries", "num_ooms")


def trace(length: int, seed: int, capacity: int) -> list[tuple]:
    """A seeded trace: ("malloc", size, stream), ("free", index of a malloc), ("empty_cache",)."""
    rng = random.Random(seed)
    out: list[tuple] = []
    live: list[int] = []
    for _ in range(length):
        r = rng.random()
        if r < 0.5 or not live:
            k = rng.random()
            if k < 0.45:
                size = rng.randint(1, 1 * MiB)                      # small pool
            elif k < 0.85:
                size = rng.randint(1 * MiB + 1, 12 * MiB)           # large pool, around the 10 MiB split rule
            elif k < 0.97:
                size = rng.randint(12 * MiB, 64 * MiB)
            else:
                size = rng.randint(capacity // 2, capacity)        # near the cap: retries and OOMs
            live.append(len(out))
            out.append(("malloc", size, rng.choice((0, 0, 0, 1))))
        elif r < 0.93:
            out.append(("free", live.pop(rng.randrange(len(live)))))
        else:
            out.append(("empty_cache",))
    return out


def _layout(segments: list[dict]) -> list:
    rows = []
    for s in segments:
        blocks = tuple((int(b["size"]), b["state"]) for b in sorted(s["blocks"], key=lambda b: b["address"]))
        rows.append((s["segment_type"], int(s["total_size"]), blocks))
    return sorted(rows)


class PresetSide:
    """memspec's ``pytorch`` preset (``reference-caching``)."""

    name = "memspec pytorch preset"

    def __init__(self, capacity: int) -> None:
        from memspec.reference.caching_targets import pytorch_preset

        self.inst = pytorch_preset(capacity)
        self.a = self.inst.allocator

    def malloc(self, size: int, stream: int) -> Any:
        return self.a.malloc(size, stream)

    def free(self, h: Any) -> None:
        self.a.free(h)

    def empty_cache(self) -> None:
        self.a.empty_cache()

    def read(self) -> dict:
        st = self.a.memory_stats()
        return {**{k: int(st[k]) for k in KEYS}, "layout": _layout(self.a.snapshot()["segments"])}

    def close(self) -> None:
        if self.inst.close:
            self.inst.close()


class TorchSide:
    """PyTorch's CUDA caching allocator on device 0."""

    name = "torch"

    def __init__(self, capacity: int) -> None:
        import torch

        self.torch = torch
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(min(1.0, capacity / total), 0)
        torch.cuda.reset_peak_memory_stats(0)
        torch.cuda.reset_accumulated_memory_stats(0)
        self.streams = [torch.cuda.default_stream(0), torch.cuda.Stream(0)]
        self.version = torch.__version__

    def malloc(self, size: int, stream: int) -> Any:
        try:
            return self.torch.cuda.caching_allocator_alloc(size, 0, self.streams[stream])
        except self.torch.cuda.OutOfMemoryError as e:
            raise OutOfMemory(str(e)) from None

    def free(self, h: Any) -> None:
        self.torch.cuda.caching_allocator_delete(h)

    def empty_cache(self) -> None:
        self.torch.cuda.empty_cache()

    def read(self) -> dict:
        st = self.torch.cuda.memory_stats(0)
        segs = [s for s in self.torch.cuda.memory_snapshot() if s.get("device", 0) == 0]
        return {**{k: int(st.get(k, 0)) for k in KEYS}, "layout": _layout(segs)}

    def close(self) -> None:
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()


def replay(side: Any, steps: list[tuple]) -> list[dict]:
    """Run the trace on one side; one record per step (figures + whether it OOMed)."""
    handles: dict[int, Any] = {}
    out = []
    for i, step in enumerate(steps):
        oom = False
        if step[0] == "malloc":
            try:
                handles[i] = side.malloc(step[1], step[2])
            except OutOfMemory:
                oom = True
        elif step[0] == "free":
            h = handles.pop(step[1], None)
            if h is not None:  # the malloc it frees may have OOMed
                side.free(h)
        else:
            side.empty_cache()
        out.append({**side.read(), "oom": oom})
    for h in handles.values():
        side.free(h)
    return out


def compare(steps: list[tuple], a: list[dict], b: list[dict]) -> tuple[int, list[str]] | None:
    """The first step where the records differ, with what differs; None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        diffs = [k for k in (*KEYS, "oom", "layout") if x[k] != y[k]]
        if diffs:
            return i, diffs
    return None


def _fmt(rec: dict) -> str:
    return ", ".join(f"{k.split('.')[0]}={rec[k]}" for k in (*KEYS, "oom")) + f", segments={len(rec['layout'])}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m memspec.adapters.torch_differential", description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--capacity", type=int, default=512 * MiB)
    p.add_argument("--dry-run", action="store_true", help="replay on the preset only (no GPU)")
    args = p.parse_args(argv)
    steps = trace(args.length, args.seed, args.capacity)
    preset = PresetSide(args.capacity)
    try:
        mine = replay(preset, steps)
    finally:
        preset.close()
    last = mine[-1]
    print(f"trace: {len(steps)} steps (seed {args.seed}, capacity {args.capacity}); "
          f"{sum(1 for s in steps if s[0] == 'malloc')} mallocs, {sum(r['oom'] for r in mine)} OOMs on the preset")
    print(f"  preset after the last step: {_fmt(last)}")
    if args.dry_run:
        print("dry run: PyTorch side not run (no GPU)")
        return 0
    from memspec.adapters._common import TargetUnavailable, require_gpu, require_module

    try:
        require_module("torch", "torch differential")
        require_gpu("torch differential")
    except TargetUnavailable as e:
        print(f"cannot run the PyTorch side: {e}")
        return 2
    side = TorchSide(args.capacity)
    try:
        theirs = replay(side, steps)
    finally:
        side.close()
    print(f"  torch {side.version} after the last step: {_fmt(theirs[-1])}")
    diff = compare(steps, mine, theirs)
    if diff is None:
        print(f"AGREE: every step's figures and layout are equal ({len(steps)} steps)")
        return 0
    i, keys = diff
    print(f"DIFFER at step {i}: {steps[i]} -- {', '.join(keys)}")
    for j in range(max(0, i - 3), i + 1):
        print(f"  step {j} {steps[j]}")
        print(f"    preset: {_fmt(mine[j])}")
        print(f"    torch : {_fmt(theirs[j])}")
    if "layout" in keys:
        print(f"    preset layout: {mine[i]['layout']}")
        print(f"    torch layout : {theirs[i]['layout']}")
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
