"""``memspec snapshot``: export, read, replay and draw allocator snapshots.

``memspec snapshot [PICKLE] [--out FILE] [--svg FILE] [--replay] [--preset P]
[--expandable] [--capacity MiB]``

* ``PICKLE``: a ``torch.cuda.memory._snapshot()`` pickle (PyTorch's
  ``_dump_snapshot`` output or ours) or the same structure as JSON.  Without it, the seed's fragmented
  40 MiB device (the moment of the 8 MiB OOM) is built on the reference
  allocator (``--preset``, default ``seed``).
* ``--out FILE``: write the snapshot pickle (PyTorch's memory viewer reads it).
* ``--svg FILE``: draw segments and blocks (live, free, pending).
* ``--replay``: run the trace through ``--preset`` with and without
  expandable segments and answer *would expandable segments have avoided
  this OOM?*

Untrusted files are safe to open: the pickle is read by an unpickler that
accepts plain data only (dict, list, str, numbers; no globals, so nothing in
the file can run), then every field memspec reads is type-checked; a bad file
is a one-line error and exit status 2.  ``--out``/``--svg`` are checked for
writability before anything runs; the SVG escapes every string it draws.
"""

from __future__ import annotations

import argparse
import os
import sys

from memspec.argtypes import out_file, positive_int
from memspec.spec.errors import MemspecError, OutOfMemory

MB = 1 << 20


def fragmented_demo(preset: str = "seed", capacity: int = 40 * MB):
    """The seed's scenario up to its OOM, with history recorded; returns the allocator."""
    from memspec.reference.caching import CachingAllocator

    a = CachingAllocator(preset=preset, capacity=capacity, record_history=True)
    A = []
    for _ in range(4):
        A.append(a.malloc(3 * MB + 1))
        a.malloc(5 * MB + 1)
    for x in A:
        a.free(x)
    try:
        a.malloc(8 * MB)
    except OutOfMemory:
        pass
    return a


def _plain(x: object) -> str:
    """A string from the file, safe for a terminal: control characters escaped."""
    s = str(x)
    return s if s.isprintable() else repr(s)[1:-1]


def describe(snap: dict) -> str:
    segs = snap["segments"]
    lines = [f"{len(segs)} segments, reserved {sum(s['total_size'] for s in segs) / MB:.2f} MiB, "
             f"allocated {sum(s['allocated_size'] for s in segs) / MB:.2f} MiB"]
    for s in segs:
        lines.append(f"  {_plain(s['segment_type']):<5} {'exp ' if s.get('is_expandable') else ''}{s['address']:#x} "
                     f"{s['total_size'] / MB:.2f} MiB: " + " ".join(
                         f"[{b['size'] / MB:.2f}M {dict(active_allocated='LIVE', inactive='FREE', active_pending_free='PENDING').get(b['state'], _plain(b['state']))}]"
                         for b in s["blocks"]))
    trace = (snap.get("device_traces") or [[]])[0]
    if trace:
        from collections import Counter

        c = Counter(e["action"] for e in trace)
        lines.append("trace: " + ", ".join(f"{_plain(k)} {v}" for k, v in sorted(c.items())))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from memspec.invariants.pictures import snapshot_svg
    from memspec.reference import caching_snapshot as cs

    ap = argparse.ArgumentParser(prog="memspec snapshot", description=__doc__.split("\n\n")[0])
    ap.add_argument("pickle", nargs="?", help="snapshot pickle to read (default: the seed's fragmented device)")
    ap.add_argument("--out", type=out_file, help="write the snapshot pickle here")
    ap.add_argument("--svg", type=out_file, help="draw the segments and blocks into this SVG file")
    ap.add_argument("--replay", action="store_true", help="replay the trace with and without expandable segments")
    ap.add_argument("--preset", choices=("pytorch", "seed"), help="policy for the replay / the demo (default: the snapshot's, else seed)")
    ap.add_argument("--expandable", action="store_true", help="build the demo with expandable segments")
    ap.add_argument("--capacity", type=positive_int, help="device capacity in MiB (default: from the snapshot)")
    args = ap.parse_args(argv)
    if args.capacity is not None and args.capacity <= 0:
        ap.error("--capacity must be positive")
    if args.pickle:
        try:
            snap = cs.load(args.pickle)
        except (OSError, MemspecError) as e:
            print(f"memspec snapshot: cannot read {args.pickle}: {e}", file=sys.stderr)
            return 2
    else:
        cap = (args.capacity or 40) * MB
        a = fragmented_demo(args.preset or "seed", cap)
        if args.expandable:
            a.set_allocator_settings(expandable_segments=True)
        snap = a.snapshot()
    print(describe(snap))
    from memspec.commands._output import write_output
    from memspec.invariants.report import write_file

    written = True
    if args.out:
        def dump():
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            cs.dump(snap, args.out)

        if write_output("memspec snapshot", "--out", args.out, dump):
            print(f"wrote {args.out}")
        else:
            written = False
    if args.svg:
        if write_output("memspec snapshot", "--svg", args.svg, lambda: write_file(args.svg, snapshot_svg(snap))):
            print(f"wrote {args.svg}")
        else:
            written = False
    if not written:
        return 2
    if args.replay:
        cap = args.capacity * MB if args.capacity else None
        try:
            avoided, fixed, exp = cs.would_expandable_avoid_oom(snap, preset=args.preset, capacity=cap)
        except MemspecError as e:
            print(f"memspec snapshot: cannot replay {args.pickle}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        print(f"replay under {fixed.preset} on {fixed.capacity / MB:.2f} MiB: {fixed.allocs} allocs, "
              f"fixed segments -> {len(fixed.ooms)} OOM(s), expandable segments -> {len(exp.ooms)} OOM(s)")
        print("would expandable segments have avoided this OOM? " + ("YES" if avoided else "no"))
    return 0
