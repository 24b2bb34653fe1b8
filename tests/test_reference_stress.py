"""Thread safety: 4 threads x 10,000 mixed operations on one reference
system (allocate, copy, kernel, drop by close / by garbage collection,
advance, poll, reserve/commit/decommit, weights, pressure tickets), then a
drain: the ledger balances to the byte, every physical page is returned, and
no device fault happened.  Each thread writes its own pattern into what it
owns and reads it back, so an overlap or a premature reuse would show up as
corrupted bytes."""

from __future__ import annotations

import random
import threading
import time

from memspec.spec.api import MiB
from memspec.spec.errors import GrantDenied, OutOfMemory
from memspec.reference.system import build_system
from memspec.reference.targets import reference

THREADS = 4
OPS = 10_000
PAGE = 2 * MiB


def worker(sut, tid: int, counts: dict, errors: list) -> None:
    rng = random.Random(tid)
    ep, b = sut.ep, sut.binding
    stream = ep.new_stream()
    live: list = []
    res = b.reserve(f"kv{tid}", 8 * PAGE)
    weights: list[str] = []
    tickets: list = []
    done = 0
    try:
        for i in range(OPS):
            op = rng.randrange(12)
            try:
                if op <= 1 and len(live) < 6:
                    h = b.allocate(f"t{tid}", rng.randint(1, 2 * PAGE))
                    tag = bytes([tid + 1, i & 0xFF]) * 8
                    h.use(ep.write(stream, h.address, tag))
                    live.append((h, tag))
                elif op == 2 and live:
                    h, tag = rng.choice(live)
                    got = ep.read(stream, h.address, len(tag))
                    if got != tag:
                        errors.append(f"thread {tid}: read {got!r}, wrote {tag!r}")
                elif op == 3 and live:
                    h, _ = rng.choice(live)
                    h.use(ep.launch(stream, [(h.address, 64)], [(h.address + 64, 64)], pattern=tid))
                elif op == 4 and live:
                    h, _ = live.pop(rng.randrange(len(live)))
                    h.close()
                elif op == 5 and live:
                    h, _ = live.pop(rng.randrange(len(live)))
                    del h                              # dropped: the finalizer enqueues
                elif op == 6:
                    ep.advance(stream, rng.randint(1, 4))
                elif op == 7:
                    ep.poll()
                elif op == 8:
                    off = rng.randrange(8) * PAGE
                    with res.lock:     # a decommit queued behind a fence keeps the page until it runs
                        busy, there = off in res.decommitting, off in res.pages
                    if there and not busy:
                        b.decommit(res, off, off + PAGE)
                    elif not there:
                        b.commit(res, off, off + PAGE)
                elif op == 9:
                    if len(weights) < 2:
                        name = f"w{tid}.{i}"
                        sut.weights.load(name, rng.randint(1, PAGE), hot=rng.random() < 0.5)
                        weights.append(name)
                    else:
                        sut.weights.unload(weights.pop(rng.randrange(len(weights))))
                elif op == 10:
                    if tickets:
                        sut.governor.cancel_ticket(tickets.pop())
                    else:
                        tickets.append(sut.governor.issue_ticket(f"t{tid}", PAGE))
                else:
                    res.use(ep.launch(stream, [], []))
                done += 1
            except (GrantDenied, OutOfMemory):
                counts["denied"] = counts.get("denied", 0) + 1
                done += 1
        for h, _ in live:
            h.close()
        for w in weights:
            sut.weights.unload(w)
        for t in tickets:
            sut.governor.cancel_ticket(t)
        res.close()
    except BaseException as e:  # noqa: BLE001 - reported by the main thread
        errors.append(f"thread {tid}: {type(e).__name__}: {e}")
    counts[tid] = done


def test_four_threads_mixed_operations_then_drain_balances():
    sut = build_system(reference())
    counts: dict = {}
    errors: list = []
    threads = [threading.Thread(target=worker, args=(sut, t, counts, errors)) for t in range(THREADS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    sut.drain()
    assert errors == []
    assert sum(counts[t] for t in range(THREADS)) == THREADS * OPS
    cap = sut.governor.capacity()
    assert sut.governor.ledger() == (cap, cap, 0, 0)                 # balanced to the byte
    assert sut.governor.live_leases() == 0 and sut.governor.live_grants() == 0
    assert sut.sim.physical_bytes() == 0 and sut.sim.mapped_pages() == 0   # every page returned
    assert sut.sim.faults == [] and sut.ep.release_errors == []
    assert sut.manager.pins(sut.context_id) == 0 and sut.ep.pending_releases() == 0
    print(f"\nstress: {THREADS}x{OPS} ops in {elapsed:.2f}s = {THREADS * OPS / elapsed:,.0f} ops/s "
          f"({counts.get('denied', 0)} refused by budget/capacity)")
