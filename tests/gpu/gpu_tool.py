"""GPU checks of the CUDA implementation, runnable on the host emulator too.

``python tests/gpu/gpu_tool.py STEP [--target cuda|cuda-host]`` with STEP one of

* ``info``: driver kind, device name, granularity (minimum and recommended), memory;
* ``differential``: one long seeded trace of mechanism and EP calls replayed
  on the emulator and on ``--target``, every outcome compared;
* ``gate``: the stream-gate fence test (queued read, drop, held stream ->
  still mapped and charged; open -> freed and refunded, no fault);
* ``leak``: 64 x (reserve, commit 64 MiB, release) and ``cuMemGetInfo`` back
  to baseline (the cuda.core creation-handle leak);
* ``latency``: commit/decommit of 1, 8, 64 pages through the VirtualBacking vs
  the raw driver call sequence, median microseconds.

Each step prints its result and exits non-zero on a failed check.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
import time
from typing import Any, Callable

from memspec.cuda_impl.targets import cuda, cuda_host
from memspec.spec.api import AllocationRequest, ReserveRequest, TargetInstance

MiB = 1 << 20


def make(target: str, capacity: int | None = None, **kw: Any) -> TargetInstance:
    if target == "cuda":
        return cuda(capacity, **kw)
    if target == "cuda-host":
        return cuda_host(capacity, **kw)
    raise SystemExit(f"unknown target {target!r} (cuda or cuda-host)")


# --------------------------------------------------------------------------
# info
# --------------------------------------------------------------------------

def info(target: str) -> dict:
    inst = make(target)
    try:
        drv = inst.extras["driver"]
        t = drv.types
        prop = drv.allocation_prop(0)
        flags = t.CUmemAllocationGranularity_flags
        gmin = int(drv.cuMemGetAllocationGranularity(prop, flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
        grec = int(drv.cuMemGetAllocationGranularity(prop, flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        name = drv.cuDeviceGetName(128, drv.cuDeviceGet(0))
        name = name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(name, bytes) else str(name)
        free, total = drv.mem_info()
        out = {"driver": drv.kind, "device": name, "granularity_min": gmin, "granularity_recommended": grec,
               "free": free, "total": total, "version": drv.cuDriverGetVersion()}
    finally:
        inst.close()
    for k, v in out.items():
        print(f"  {k:24s} {v}")
    return out


# --------------------------------------------------------------------------
# differential replay
# --------------------------------------------------------------------------

class Replayer:
    """Runs trace steps on one target; outcomes are normalised so that two
    conforming targets give equal lists (addresses and identities left out)."""

    def __init__(self, inst: TargetInstance) -> None:
        self.inst = inst
        m = inst.mechanism
        self.vb, self.sm, self.alloc, self.ep = m.virtual_backing(), m.shared_mapping(), m.allocator(), inst.ep
        self.g = self.vb.granularity()
        self.res: list[Any] = []
        self.shared_res: list[Any] = []
        self.handles: list[Any] = []
        self.allocs: list[Any] = []
        self.maps: list[tuple[Any, int, int]] = []   # (shared reservation, offset, size)
        self.backed: dict[Any, set] = {}            # reservation identity -> pages backed (from outcomes)
        self.stream = self.ep.new_stream()
        self.ended: set = set()   # identities of reservations released/freed

    def _backed(self, va: Any, page: int) -> int:
        """The address of the ``page``-th page of ``va`` that the outcomes so far
        say is backed.  Copies through an ended reservation would hit
        whatever the address space put there since (layout, not contract), and
        on a GPU a copy into an unmapped page may be a sticky fault that
        poisons the context: both are refused here, the same on every target."""
        if va is None or va.identity in self.ended:
            raise LookupError("reservation ended")
        backed = sorted(self.backed.get(va.identity, ()))
        if not backed:
            raise LookupError("no page backed")
        return va.address + backed[page % len(backed)] * self.g

    def _mark(self, va: Any, first: int, n: int, on: bool) -> None:
        pages = self.backed.setdefault(va.identity, set())
        (pages.update if on else pages.difference_update)(range(first, first + n))

    def run(self, op: tuple) -> tuple:
        name, *args = op
        try:
            value = getattr(self, "op_" + name)(*args)
        except Exception as e:  # noqa: BLE001 - the class is the outcome
            return (name, "raises", type(e).__name__)
        return (name, "returns", value)

    def _pick(self, xs: list, i: int) -> Any:
        """Mostly one of the 3 newest live objects, sometimes any (maybe stale)."""
        if not xs:
            return None
        if i < 13:
            live = [x for x in xs[-12:] if getattr(x, "identity", None) not in self.ended]
            if live:
                return live[-1 - i % min(3, len(live))]
        return xs[i % len(xs)]

    def op_reserve(self, pages: int) -> int:
        va = self.vb.reserve(ReserveRequest(pages * self.g if pages > 0 else pages))
        self.res.append(va)
        return va.size

    def op_commit(self, i: int, a: int, b: int) -> int:
        va = self._pick(self.res, i)
        n = self.vb.commit_range(va, a * self.g, b * self.g)
        self._mark(va, a, b - a, True)
        return n

    def op_commit_ragged(self, i: int, a: int, b: int) -> int:
        return self.vb.commit_range(self._pick(self.res, i), a * self.g + self.g // 2, b * self.g)

    def op_decommit(self, i: int, a: int, b: int) -> int:
        va = self._pick(self.res, i)
        n = self.vb.decommit_range(va, a * self.g, b * self.g)
        self._mark(va, a, b - a, False)
        return n

    def op_committed(self, i: int) -> int:
        return self.vb.committed_bytes(self._pick(self.res, i))

    def op_release(self, i: int) -> int:
        va = self._pick(self.res, i)
        n = self.vb.release(va)
        self.ended.add(va.identity)
        return n

    def op_write(self, i: int, page: int, seed: int) -> None:
        addr = self._backed(self._pick(self.res, i), page)
        data = hashlib.sha256(f"{seed}".encode()).digest()
        self.ep.write(self.stream, addr + (seed % 8) * 64, data)
        self.ep.synchronize(self.stream)

    def op_read(self, i: int, page: int, seed: int) -> str:
        addr = self._backed(self._pick(self.res, i), page)
        return hashlib.sha256(self.ep.read(self.stream, addr + (seed % 8) * 64, 32)).hexdigest()[:16]

    def op_create(self, pages: int) -> int:
        h = self.sm.create(pages * self.g)
        self.handles.append(h)
        return h.size

    def op_shared_reserve(self, pages: int) -> int:
        va = self.sm.reserve(ReserveRequest(pages * self.g))
        self.shared_res.append(va)
        return va.size

    def op_map(self, h: int, r: int, page: int, ro: bool) -> int:
        va = self._pick(self.shared_res, r)
        n = self.sm.map(self._pick(self.handles, h), va, page * self.g, read_only=ro)
        self.maps.append((va, page * self.g, n))
        self._mark(va, page, n // self.g, True)
        return n

    def op_unmap(self, k: int) -> int:
        va, off, size = self._pick(self.maps, k) or (self._pick(self.shared_res, k), 0, self.g)
        n = self.sm.unmap(va, off, size)
        self._mark(va, off // self.g, size // self.g, False)
        return n

    def op_cow(self, k: int) -> int:
        va, off, size = self._pick(self.maps, k) or (self._pick(self.shared_res, k), 0, self.g)
        return self.sm.copy_on_write(va, off, size)

    def op_count(self, h: int) -> int:
        return self.sm.mapping_count(self._pick(self.handles, h))

    def op_release_handle(self, h: int) -> int:
        ph = self._pick(self.handles, h)
        n = self.sm.release(ph)
        self.ended.add(ph.identity)
        return n

    def op_free_reservation(self, r: int) -> None:
        va = self._pick(self.shared_res, r)
        self.sm.free_reservation(va)
        self.ended.add(va.identity)

    def op_shared_write(self, r: int, page: int) -> None:
        addr = self._backed(self._pick(self.shared_res, r), page)
        self.ep.write(self.stream, addr, b"shared-write")
        self.ep.synchronize(self.stream)

    def op_alloc(self, size: int) -> int:
        a = self.alloc.allocate(AllocationRequest(size))
        self.allocs.append(a)
        return a.footprint

    def op_free(self, i: int) -> int:
        a = self._pick(self.allocs, i)
        n = self.alloc.deallocate(a)
        self.ended.add(a.identity)
        return n

    def op_physical(self) -> int:
        return self.inst.physical_bytes()


def make_trace(seed: int, length: int) -> list[tuple]:
    """A seeded mix of legal and illegal calls (the illegal ones must be refused alike)."""
    rnd = random.Random(seed)
    ops: list[tuple] = [("reserve", 8), ("shared_reserve", 4), ("create", 2)]
    table = [  # (weight, op maker)
        (8, lambda i, a, b: ("reserve", rnd.choice([2, 4, 8, 8, 8, 0, -1]))),
        (16, lambda i, a, b: ("commit", i, a, b)),
        (2, lambda i, a, b: ("commit_ragged", i, a, b)),
        (12, lambda i, a, b: ("decommit", i, a, b)),
        (3, lambda i, a, b: ("committed", i)),
        (4, lambda i, a, b: ("release", i)),
        (6, lambda i, a, b: ("write", i, a, rnd.randrange(1 << 20))),
        (6, lambda i, a, b: ("read", *(rnd.choice(writes) if writes and rnd.random() < 0.7
                                       else (i, a, rnd.randrange(1 << 20))))),
        (3, lambda i, a, b: ("create", rnd.choice([1, 1, 2, 0]))),
        (2, lambda i, a, b: ("shared_reserve", rnd.choice([2, 4]))),
        (6, lambda i, a, b: ("map", i, i // 2, rnd.randrange(0, 4), rnd.random() < 0.5)),
        (5, lambda i, a, b: ("unmap", i)),
        (3, lambda i, a, b: ("cow", i)),
        (2, lambda i, a, b: ("count", i)),
        (3, lambda i, a, b: ("release_handle", i)),
        (1, lambda i, a, b: ("free_reservation", i)),
        (3, lambda i, a, b: ("shared_write", i, rnd.randrange(0, 4))),
        (5, lambda i, a, b: ("alloc", rnd.choice([1, 4096, 3 * MiB, 0, 1 << 50]))),
        (5, lambda i, a, b: ("free", i)),
        (3, lambda i, a, b: ("physical",)),
    ]
    weights = [w for w, _ in table]
    writes: list[tuple] = []   # reads mostly revisit an earlier write's place
    for _ in range(length):
        i = rnd.randrange(16)
        a = rnd.randrange(0, 8)
        b = a + rnd.choice([1, 1, 2, 3, 0])
        op = rnd.choices(table, weights)[0][1](i, a, b)
        if op[0] == "write":
            writes.append(op[1:])
        ops.append(op)
    return ops


def replay(inst: TargetInstance, trace: list[tuple]) -> list[tuple]:
    r = Replayer(inst)
    return [r.run(op) for op in trace]


def differential(target: str, *, seed: int = 6, length: int = 2000, pages: int = 48) -> bool:
    """Replay one trace on the emulator and on ``target`` (same granularity and
    capacity); report the first divergence."""
    probe = make(target)
    try:
        g = probe.extras["granularity"]
    finally:
        probe.close()
    capacity = pages * g
    trace = make_trace(seed, length)
    emu = cuda_host(capacity, granularity=g)
    other = make(target, capacity, **({"granularity": g} if target == "cuda-host" else {}))
    try:
        t0 = time.perf_counter()
        a = replay(emu, trace)
        t1 = time.perf_counter()
        b = replay(other, trace)
        t2 = time.perf_counter()
    finally:
        emu.close()
        other.close()
    kinds = {}
    for o in a:
        kinds[o[1]] = kinds.get(o[1], 0) + 1
    diverged = [(n, x, y) for n, (x, y) in enumerate(zip(a, b)) if x != y]
    print(f"  trace: seed {seed}, {len(trace)} calls, granularity {g}, capacity {capacity} "
          f"({', '.join(f'{v} {k}' for k, v in sorted(kinds.items()))})")
    print(f"  emulator {t1 - t0:.2f} s, {target} {t2 - t1:.2f} s")
    if diverged:
        print(f"  DIFFERENT: {len(diverged)} of {len(trace)} outcomes differ; first 5:")
        for n, x, y in diverged[:5]:
            print(f"    #{n} {trace[n]}: emulator {x[1:]} vs {target} {y[1:]}")
        return False
    print(f"  SAME: all {len(trace)} outcomes equal")
    return True


# --------------------------------------------------------------------------
# stream gate and leak
# --------------------------------------------------------------------------

def gate(target: str) -> bool:
    """Queued read, drop, stream held: still mapped and charged; open: freed and refunded."""
    inst = make(target)
    try:
        ep, vb = inst.ep, inst.mechanism.virtual_backing()
        g = vb.granularity()
        base = inst.physical_bytes()
        va = vb.reserve(ReserveRequest(4 * g))
        vb.commit_range(va, 0, 4 * g)
        ep.write(0, va.address, b"gate")
        ep.synchronize(0)
        s = ep.new_stream()
        gt = ep.hold(s)
        fence = ep.launch(s, [(va.address, 4 * g)], [])
        freed: list[int] = []
        ep.defer([fence], lambda: freed.append(vb.release(va)))
        time.sleep(0.05)
        held = (ep.poll(), ep.fence_done(fence), inst.physical_bytes() - base, ep.pending_releases(), list(freed))
        gt.open()
        ep.synchronize(s)
        deadline = time.monotonic() + 10
        while ep.pending_releases() and time.monotonic() < deadline:
            ep.poll()
            time.sleep(0.001)
        after = (inst.physical_bytes() - base, ep.pending_releases(), list(freed), inst.extras["faults"]())
    finally:
        inst.close()
    ok = held == (0, False, 4 * g, 1, []) and after == (0, 0, [4 * g], [])
    print(f"  held: poll ran {held[0]}, fence done {held[1]}, physical {held[2]}, queued {held[3]}")
    print(f"  open: physical {after[0]}, queued {after[1]}, released {after[2]}, faults {after[3]}")
    print("  PASS" if ok else "  FAIL")
    return ok


def leak(target: str, *, rounds: int = 64, nbytes: int = 64 * MiB) -> bool:
    """The cuda.core leak scenario: memory must come back after every release."""
    inst = make(target, None if target == "cuda" else 2 * nbytes)
    try:
        drv = inst.extras["driver"]
        vb = inst.mechanism.virtual_backing()
        free0, total = drv.mem_info()
        worst = 0
        for _ in range(rounds):
            va = vb.reserve(ReserveRequest(nbytes))
            vb.commit_range(va, 0, va.size)
            vb.release(va)
            free, _ = drv.mem_info()
            worst = max(worst, free0 - free)
        free1, _ = drv.mem_info()
    finally:
        inst.close()
    ok = free1 == free0 or (target == "cuda" and abs(free0 - free1) < 2 * MiB and worst < nbytes)
    print(f"  {rounds} x {nbytes // MiB} MiB: free before {free0}, after {free1} "
          f"(difference {free0 - free1}), worst retained between rounds {worst}")
    print("  PASS" if ok else "  FAIL")
    return ok


# --------------------------------------------------------------------------
# latency
# --------------------------------------------------------------------------

def _median_us(fn: Callable[[], object], reps: int) -> float:
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        xs.append((time.perf_counter_ns() - t0) / 1000)
    return statistics.median(xs)


def latency(target: str, *, reps: int = 20, sizes: tuple[int, ...] = (1, 8, 64)) -> list[dict]:
    """Commit/decommit through the VirtualBacking vs the raw sequence
    (cuMemCreate + cuMemMap + cuMemRelease per page, one cuMemSetAccess; cuMemUnmap per page)."""
    inst = make(target, None if target == "cuda" else (max(sizes) + 1) * (2 * MiB))
    rows = []
    try:
        drv = inst.extras["driver"]
        vb = inst.mechanism.virtual_backing()
        g = vb.granularity()
        prop, rw = drv.allocation_prop(0), drv.access_desc(0, read_only=False)
        for n in sizes:
            va = vb.reserve(ReserveRequest(n * g))
            raw = int(drv.cuMemAddressReserve(n * g, 0, 0, 0))

            def raw_commit() -> None:
                for i in range(n):
                    h = drv.cuMemCreate(g, prop, 0)
                    drv.cuMemMap(raw + i * g, g, 0, h, 0)
                    drv.cuMemRelease(h)
                drv.cuMemSetAccess(raw, n * g, [rw], 1)

            def raw_decommit() -> None:
                for i in range(n):
                    drv.cuMemUnmap(raw + i * g, g)

            rc, rd, mc, md = [], [], [], []
            for _ in range(reps):
                rc.append(_median_us(raw_commit, 1))
                rd.append(_median_us(raw_decommit, 1))
                mc.append(_median_us(lambda: vb.commit_range(va, 0, n * g), 1))
                md.append(_median_us(lambda: vb.decommit_range(va, 0, n * g), 1))
            drv.cuMemAddressFree(raw, n * g)
            vb.release(va)
            row = {"pages": n, "raw_commit_us": statistics.median(rc), "commit_us": statistics.median(mc),
                   "raw_decommit_us": statistics.median(rd), "decommit_us": statistics.median(md)}
            row["commit_ratio"] = row["commit_us"] / row["raw_commit_us"]
            row["decommit_ratio"] = row["decommit_us"] / row["raw_decommit_us"]
            rows.append(row)
    finally:
        inst.close()
    print(f"  {'pages':>5} {'raw commit':>11} {'commit':>9} {'ratio':>6} {'raw decommit':>13} {'decommit':>9} {'ratio':>6}  (median µs, {reps} reps, {target})")
    for r in rows:
        print(f"  {r['pages']:>5} {r['raw_commit_us']:>11.1f} {r['commit_us']:>9.1f} {r['commit_ratio']:>6.2f} "
              f"{r['raw_decommit_us']:>13.1f} {r['decommit_us']:>9.1f} {r['decommit_ratio']:>6.2f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["info", "differential", "gate", "leak", "latency"])
    p.add_argument("--target", default="cuda", choices=["cuda", "cuda-host"])
    p.add_argument("--length", type=int, default=2000, help="differential trace length")
    p.add_argument("--seed", type=int, default=6)
    p.add_argument("--reps", type=int, default=20, help="latency repetitions")
    a = p.parse_args(argv)
    if a.step == "info":
        info(a.target)
        return 0
    if a.step == "differential":
        return 0 if differential(a.target, seed=a.seed, length=a.length) else 1
    if a.step == "gate":
        return 0 if gate(a.target) else 1
    if a.step == "leak":
        return 0 if leak(a.target) else 1
    latency(a.target, reps=a.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
