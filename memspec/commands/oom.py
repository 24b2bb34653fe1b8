"""``memspec oom explain``: walk seed 003's six-cause triage for an OOM.

Seed 003: *Read the error before touching anything. Its two lines
(reserved-but-unallocated; other-process usage) do the first two flowchart
steps for you.*  The triage order is the seed's: fragmentation -> other
processes -> NCCL buffers -> CUDA graph pools -> cuDNN workspaces -> driver
reserve.

Input: the OOM message as arguments, ``--file FILE`` (``-`` = stdin), or
``--snapshot PICKLE`` (a ``torch.cuda.memory._snapshot()`` pickle: the
figures are read from its segments, and its trace is replayed to answer
*would expandable segments have avoided this OOM?*).  Hints the message
cannot carry: ``--distributed`` (NCCL communicators alive),
``--graphs`` (CUDA graphs captured), ``--cudnn-benchmark``.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field

_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SIZE = r"([0-9]+(?:\.[0-9]+)?)\s*(bytes|KiB|MiB|GiB|TiB)"

CAUSES = {
    1: "fragmentation",
    2: "other processes",
    3: "NCCL communication buffers",
    4: "CUDA graph private pools",
    5: "cuDNN workspaces",
    6: "driver/kernel reserve",
}

#: The seed's fix ladder for each cause (its flowchart, verbatim in substance).
LADDERS = {
    1: ["expandable_segments:True (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)",
        "steady tensor shapes (pad variable batches)", "smaller batch", "restart (last)",
        "empty_cache() will not help: every segment holds a live block"],
    2: ["talk to the neighbour or move (nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv)",
        "MPS to share one context"],
    3: ["NCCL scratch lives until process exit; audit the communicator count and destroy unused communicators"],
    4: ["drop or re-capture the graphs; reserved falls only when the graph object dies"],
    5: ["budget for the chosen algorithm's workspace, not just tensors (cudnn.benchmark picks by speed)"],
    6: ["driver/ECC reserve: budget = total minus 0.5-1 GiB+ (card and CUDA version dependent)"],
}


def _bytes(num: str, unit: str) -> int:
    return int(round(float(num) * _UNITS[unit]))


@dataclass
class Figures:
    """What an OOM message (or a snapshot) says."""

    kind: str = "unknown"                   # "pytorch" | "seed" | "1EB" | "snapshot" | "unknown"
    tried: int | None = None
    device: int | None = None
    total: int | None = None
    free: int | None = None
    allocated: int | None = None
    reserved: int | None = None
    reserved_unallocated: int | None = None
    private_pools: int = 0
    largest_free_block: int | None = None
    allowed: int | None = None
    processes: dict[int, int] = field(default_factory=dict)
    segments: int | None = None


def parse_message(text: str) -> Figures:
    """Read PyTorch 2.x's OOM text, the seed toy's, or the 1 EB message."""
    t = " ".join(text.split())
    f = Figures()
    if "more than 1EB" in t:
        f.kind = "1EB"
        return f
    m = re.search(r"Tried to allocate " + _SIZE, t)
    if m:
        f.tried = _bytes(*m.groups())
    m = re.search(r"GPU (\d+) has a total capacity of " + _SIZE + r" of which " + _SIZE + r" is free", t)
    if m:
        f.kind = "pytorch"
        f.device = int(m.group(1))
        f.total = _bytes(m.group(2), m.group(3))
        f.free = _bytes(m.group(4), m.group(5))
    for pid, num, unit in re.findall(r"Process (\d+) has " + _SIZE + r" memory in use", t):
        f.processes[int(pid)] = _bytes(num, unit)
    m = re.search(_SIZE + r" allowed;", t)
    if m:
        f.allowed = _bytes(*m.groups())
    m = re.search(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch", t)
    if m:
        f.allocated = _bytes(*m.groups())
    m = re.search(r"with " + _SIZE + r" allocated in private pools", t)
    if m:
        f.private_pools = _bytes(*m.groups())
    m = re.search(_SIZE + r" is reserved by PyTorch but unallocated", t)
    if m:
        f.reserved_unallocated = _bytes(*m.groups())
    # the seed toy: (device 40 MiB; 40 MiB reserved; 16 MiB is reserved but unallocated; largest free block 4 MiB)
    m = re.search(r"\(device " + _SIZE + r"; " + _SIZE + r" reserved; " + _SIZE + r" is reserved but unallocated; "
                  r"largest free block " + _SIZE + r"\)", t)
    if m:
        g = m.groups()
        f.kind = "seed"
        f.total = _bytes(g[0], g[1])
        f.reserved = _bytes(g[2], g[3])
        f.reserved_unallocated = _bytes(g[4], g[5])
        f.largest_free_block = _bytes(g[6], g[7])
        f.allocated = f.reserved - f.reserved_unallocated
        f.free = f.total - f.reserved
    if f.reserved is None and f.allocated is not None and f.reserved_unallocated is not None:
        f.reserved = f.allocated + f.reserved_unallocated
    if f.kind == "unknown" and ("out of memory" not in t.lower()):
        f.kind = "not-an-oom"
    return f


def figures_from_snapshot(snap: dict) -> Figures:
    segs = snap["segments"]
    f = Figures(kind="snapshot")
    f.reserved = sum(s["total_size"] for s in segs)
    f.allocated = sum(b["size"] for s in segs for b in s["blocks"] if b["state"] == "active_allocated")
    f.reserved_unallocated = f.reserved - f.allocated
    f.largest_free_block = max((b["size"] for s in segs for b in s["blocks"] if b["state"] == "inactive"), default=0)
    f.private_pools = sum(b["size"] for s in segs if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0)
                          for b in s["blocks"] if b["state"] == "active_allocated")
    f.segments = len(segs)
    cap = snap.get("allocator_settings", {}).get("memspec_capacity")
    if cap:
        f.total = int(cap)
    for e in (snap.get("device_traces") or [[]])[0]:
        if e.get("action") == "oom":
            f.tried = int(e["size"])
            f.free = int(e["addr"])
    return f


def _fmt(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("GiB", "MiB", "KiB"):
        if n >= _UNITS[unit]:
            return f"{n / _UNITS[unit]:.2f} {unit}"
    return f"{n} bytes"


@dataclass
class Verdict:
    cause: int | None
    steps: list[str]
    ladder: list[str]


def triage(f: Figures, *, distributed: bool = False, graphs: bool = False, cudnn_benchmark: bool = False) -> Verdict:
    """The seed's 3 a.m. flowchart, top to bottom; the first cause that holds wins."""
    steps: list[str] = []
    tried = f.tried or 0
    if f.kind == "1EB":
        return Verdict(None, ["the request itself is absurd (>= 1 EB): a size computation overflowed or went "
                              "negative; not a memory problem -- fix the shape arithmetic"], [])
    ru = f.reserved_unallocated
    ratio = (f.reserved / f.allocated) if f.reserved and f.allocated else None
    frag = ru is not None and ((tried and ru >= tried) or (ratio is not None and ratio >= 1.3))
    why = (f"{_fmt(ru)} is reserved but unallocated" + (f" (>= the {_fmt(tried)} asked)" if tried and ru is not None and ru >= tried else "")
           + (f"; reserved/allocated = {ratio:.2f}" if ratio else ""))
    if f.largest_free_block is not None:
        why += f"; largest free block {_fmt(f.largest_free_block)}"
    steps.append(f"1. fragmentation? {'YES' if frag else 'no'}: {why if ru is not None else 'no reserved-but-unallocated figure'}")
    if frag:
        return Verdict(1, steps, LADDERS[1])
    others = sum(f.processes.values())
    co = bool(f.processes) and (others >= tried or (f.total and others >= 0.05 * f.total))
    steps.append(f"2. other processes? {'YES' if co else 'no'}: " + (
        ", ".join(f"process {p} holds {_fmt(b)}" for p, b in sorted(f.processes.items())) if f.processes
        else "no 'Process P has X memory in use' line"))
    if co:
        return Verdict(2, steps, LADDERS[2])
    steps.append(f"3. NCCL buffers? {'YES' if distributed else 'unknown'}: " + (
        "distributed run with live communicators" if distributed else "not distributed (or not told: --distributed)"))
    if distributed:
        return Verdict(3, steps, LADDERS[3])
    pools = f.private_pools > 0 or graphs
    steps.append(f"4. CUDA graph pools? {'YES' if pools else 'no'}: " + (
        f"{_fmt(f.private_pools)} allocated in private pools" if f.private_pools else
        ("graphs captured (--graphs)" if graphs else "no private-pool memory")))
    if pools:
        return Verdict(4, steps, LADDERS[4])
    steps.append(f"5. cuDNN workspaces? {'YES' if cudnn_benchmark else 'unknown'}: " + (
        "cudnn.benchmark is on" if cudnn_benchmark else "not told (--cudnn-benchmark)"))
    if cudnn_benchmark:
        return Verdict(5, steps, LADDERS[5])
    unexplained = None
    if f.total is not None and f.free is not None and f.reserved is not None:
        unexplained = f.total - f.free - f.reserved - others
    steps.append("6. driver/kernel reserve: by elimination" + (
        f"; {_fmt(unexplained)} of the device is held outside PyTorch's reserved memory and the listed processes "
        "(context, driver, ECC)" if unexplained is not None else ""))
    return Verdict(6, steps, LADDERS[6])


def explain(f: Figures, **hints: bool) -> str:
    v = triage(f, **hints)
    lines = [f"OOM ({f.kind}): tried {_fmt(f.tried)}; device {_fmt(f.total)}, free {_fmt(f.free)}; "
             f"reserved {_fmt(f.reserved)}, allocated {_fmt(f.allocated)}, reserved but unallocated {_fmt(f.reserved_unallocated)}"]
    lines += v.steps
    if v.cause is not None:
        lines.append(f"verdict: cause #{v.cause}, {CAUSES[v.cause]}")
        lines.append("fix ladder (cheapest first): " + " -> ".join(v.ladder))
    else:
        lines.append("verdict: not an out-of-memory condition")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="memspec oom explain", description=__doc__.split("\n\n")[0])
    ap.add_argument("verb", choices=("explain",))
    ap.add_argument("message", nargs="*", help="the OOM message text")
    ap.add_argument("--file", help="read the message from FILE ('-' = stdin)")
    ap.add_argument("--snapshot", help="a torch.cuda.memory._snapshot() pickle")
    ap.add_argument("--distributed", action="store_true", help="NCCL communicators are alive")
    ap.add_argument("--graphs", action="store_true", help="CUDA graphs were captured")
    ap.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark=True")
    ap.add_argument("--svg", help="with --snapshot: draw its segments and blocks into this SVG file")
    args = ap.parse_args(argv)
    if args.svg and not args.snapshot:
        ap.error("--svg draws a snapshot: give --snapshot PICKLE")
    hints = dict(distributed=args.distributed, graphs=args.graphs, cudnn_benchmark=args.cudnn_benchmark)
    if args.snapshot:
        from memspec.reference.caching_snapshot import load, would_expandable_avoid_oom

        from memspec.spec.errors import InvalidRequest

        try:
            snap = load(args.snapshot)
        except (OSError, InvalidRequest) as e:
            print(f"memspec oom explain: cannot read {args.snapshot}: {e}", file=sys.stderr)
            return 2
        f = figures_from_snapshot(snap)
        print(explain(f, **hints))
        if args.svg:
            from memspec.invariants.pictures import snapshot_svg

            with open(args.svg, "w", encoding="utf-8") as fh:
                fh.write(snapshot_svg(snap))
            print(f"wrote {args.svg}")
        if (snap.get("device_traces") or [[]])[0]:
            avoided, fixed, exp = would_expandable_avoid_oom(snap)
            print(f"replay ({fixed.preset}, capacity {_fmt(fixed.capacity)}): fixed segments -> "
                  f"{len(fixed.ooms)} OOM(s); expandable segments -> {len(exp.ooms)} OOM(s)")
            print("would expandable segments have avoided this OOM? " + ("YES" if avoided else "no"))
        return 0
    if args.file:
        try:
            text = sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8").read()
        except OSError as e:
            print(f"memspec oom explain: cannot read {args.file}: {e}", file=sys.stderr)
            return 2
    elif args.message:
        text = " ".join(args.message)
    else:
        text = sys.stdin.read()
    f = parse_message(text)
    if f.kind == "not-an-oom":
        print("memspec oom explain: the text is not a CUDA out-of-memory message", file=sys.stderr)
        return 2
    print(explain(f, **hints))
    return 0
