"""Benchmark 7: ``memspec snapshot FILE --replay`` on a generated trace of
1,000,000 events.

The trace is recorded from the reference caching allocator (``pytorch``
preset, ``record_history=True``) on the caching rows' mixed workload with
1,000 live blocks, until it holds 1,000,000 events (alloc, free_requested,
free_completed, segment_*), and written with ``caching_snapshot.dump``
(outside the timing).  The timed run is the CLI as a user runs it, in a fresh
interpreter: load the file, replay the trace with and without expandable
segments, answer *would expandable segments have avoided this OOM?*.  The
rate is trace events per CPU second of that command (interpreter start and
load included; ``RUSAGE_CHILDREN``, so time other processes held the core is
not counted; the wall-clock rate is in the note); memory is the command's
peak RSS (its own ``VmHWM``).  No target: the figures say how long the
answer takes.

When the command's import of ``memspec.reference.caching`` finds a mypyc
build (``memspec build-native``, ``MEMSPEC_NATIVE=1``; the child reports its
``COMPILED``), the row is that run's and the same file is replayed once more
by a child that installs the pure-Python copy first (``bench.caching.load_pure``);
the note gives both.
"""

from __future__ import annotations

import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import FAILED, Row, unavailable

ROOT = Path(__file__).resolve().parents[1]
EVENTS = 1_000_000
QUICK_EVENTS = 20_000
LIVE = 1_000


def make_trace(events: int, path: Path) -> int:
    """Record ``events`` trace events from the reference allocator; write the snapshot; return the count."""
    from bench import workload
    from memspec.reference.caching import CachingAllocator
    from memspec.reference.caching_snapshot import dump

    a = CachingAllocator(preset="pytorch", capacity=1 << 40, record_history=True, max_entries=events)
    rng = random.Random("memspec-bench-replay")
    live = [a.malloc(workload.mixed_size(rng)) for _ in range(LIVE)]
    while len(a._trace) < events:
        i = rng.randrange(LIVE)
        a.free(live[i])
        live[i] = a.malloc(workload.mixed_size(rng))
    snap = a.snapshot()
    dump(snap, str(path))
    return len(snap["device_traces"][0])


def run(quick: bool = False) -> list[Row]:
    n = QUICK_EVENTS if quick else EVENTS
    name = f"memspec snapshot --replay of a {n:,}-event trace"
    try:
        with tempfile.TemporaryDirectory(prefix="memspec-bench-replay-") as d:
            path = Path(d) / "trace.pickle"
            got = make_trace(n, path)
            size = path.stat().st_size
            p, out, cpu, dt = _child(path, "")
            pure = None
            if p.returncode == 0 and "COMPILED True" in out:
                pure = _child(path, "pure")
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        return [unavailable(name, "events/s", "", f"{type(e).__name__}: {e}", status=FAILED)]
    for q in (p, pure[0] if pure else None):
        if q is not None and q.returncode != 0:
            return [unavailable(name, "events/s", "", f"exited {q.returncode}: {(q.stdout + q.stderr)[-200:]}",
                                status=FAILED)]
    last = [ln for ln in out.splitlines() if ln.startswith("replay under")][-1:] or [""]
    peak = _peak(out)
    compiled = pure is not None
    if compiled:
        _, pout, pcpu, pdt = pure
        built = (f"ran compiled (mypyc build); pure Python: {got / pcpu:,.0f} events per CPU second "
                 f"({pcpu:.1f} CPU s, peak RSS {_peak(pout)})")
    else:
        built = "ran pure Python (no mypyc build imported)"
    return [Row(name, got / cpu, "events/s", None, "", None,
                f"{got:,} events in {cpu:.1f} CPU s, {dt:.1f} s wall ({got / dt:,.0f} events per wall second; "
                f"fresh interpreter, load + two replays); peak RSS {peak}; file {size / 2**20:.0f} MiB; {built}; "
                f"{last[0][:90]}",
                extra={"events": got, "seconds": dt, "cpu_seconds": cpu, "file_bytes": size, "peak_rss": peak,
                       "compiled": compiled, "pure_cpu_seconds": pure[2] if pure else cpu})]


def _child(path: Path, mode: str) -> tuple[subprocess.CompletedProcess, str, float, float]:
    """Run the replay command in a fresh interpreter (``mode`` "pure": on the
    pure-Python copy of the allocator); ``(process, output, CPU s, wall s)``."""
    cmd = [sys.executable, "-c", _CHILD, str(path), mode]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return p, p.stdout + p.stderr, cpu or dt, dt


def _peak(out: str) -> str:
    rss = [ln for ln in out.splitlines() if ln.startswith("MAXRSS_KIB ")]
    return f"{int(rss[-1].split()[1]) / 1024:.0f} MiB" if rss else "n/a"


#: the child: ``memspec snapshot FILE --replay``, then its own peak RSS in KiB: ``VmHWM`` of
#: /proc/self/status where there is one (``ru_maxrss`` of a child on Linux also counts the
#: parent's RSS at the fork -- here the bench process holding the recorded trace), else ru_maxrss
_CHILD = (
    "import resource, sys\n"
    "if sys.argv[2] == 'pure':\n"
    "    from bench.caching import load_pure\n"
    "    load_pure(install=True)\n"
    "import memspec.reference.caching as rc\n"
    "print('COMPILED', rc.COMPILED)\n"
    "from memspec.commands import snapshot\n"
    "rc = snapshot.main([sys.argv[1], '--replay'])\n"
    "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "try:\n"
    "    with open('/proc/self/status') as fh:\n"
    "        peak = next(int(ln.split()[1]) for ln in fh if ln.startswith('VmHWM:'))\n"
    "except (OSError, StopIteration, ValueError, IndexError):\n"
    "    pass\n"
    "print('MAXRSS_KIB', peak)\n"
    "sys.exit(rc)\n"
)
