"""``memspec demo kv``: seed 000's KV story, end to end on the reference.

1. reserve 10 GiB of virtual address space for a request's KV (no physical pages);
2. grow it 100 MiB -> 120 MiB by the six-step transaction, ledger printed each step;
3. a commit failure injected at step 4 of the growth to 160 MiB: rolled back
   (old view and request state kept, grant returned); then the growth succeeds;
4. a second request shares the first one's system-prompt prefix through
   SharedMapping: its physical pages are counted (and charged) once;
5. a pressure ticket (*try to free 1 GB*): ModelResidency answers with 700 MiB
   of cold weights, KvPageStore answers 0 (its pages are in use by in-flight
   kernels); the ticket times out and its bytes return exactly once;
6. the release flow: the request is dropped while a kernel still reads it;
   nothing is freed until the fence completes.

Every ledger line shows the Governor's figures next to the KV bytes measured
on the simulated device's page table (distinct physical pages behind the
requests' addresses): the charge of ``kv`` must equal them at every step.

Options: ``--quiet`` prints only the final check.
"""

from __future__ import annotations

import sys
from typing import Callable

from memspec.spec.api import GiB, MiB
from memspec.reference.system import ReferenceSystem, build_system
from memspec.reference.targets import reference


def mib(n: int) -> str:
    return f"{n / MiB:,.0f} MiB"


def kv_physical(sut: ReferenceSystem, seen: dict | None = None) -> int:
    """Distinct physical pages mapped behind every KV request's view (open
    ones, and dropped ones whose release may still be queued), read from the
    device page table, not from any ledger."""
    dev, phys = sut.sim, set()
    views = dict(seen or {})
    views.update({r: sut.kv.view(r) for r in sut.kv.requests()})
    for v in views.values():
        for off in range(0, v.nbytes, dev.page_size):
            e = dev.entry(v.address + off)
            if e is not None:
                phys.add(e.phys)
    return len(phys) * dev.page_size


class Story:
    def __init__(self, out: Callable[[str], None]) -> None:
        self.out = out
        self.sut = build_system(reference(24 * GiB))     # seed 000: *Total capacity: 24 GB*
        self.records: list[dict] = []
        self.seen: dict = {}    # request -> its largest view, kept after the request is dropped

    def ledger(self, label: str) -> dict:
        g, s = self.sut.governor, self.sut
        for r in s.kv.requests():
            self.seen[r] = s.kv.view(r)
        cap, free, granted, charged = g.ledger()
        rec = {
            "label": label,
            "capacity": cap, "free": free, "granted": granted, "charged": charged,
            "charged_kv": g.charged("kv"), "charged_weights": g.charged("weights"),
            "kv_physical": kv_physical(s, self.seen),
            "committed": {r: s.kv.committed(r) for r in s.kv.requests()},
            "device_physical": s.sim.physical_bytes(),
        }
        self.records.append(rec)
        per = ", ".join(f"{r}={mib(n)}" for r, n in rec["committed"].items()) or "-"
        self.out(
            f"  ledger [{label}]: free={mib(free)} granted={mib(granted)} charged={mib(charged)} "
            f"(kv={mib(rec['charged_kv'])} weights={mib(rec['charged_weights'])})"
            f" | kv physical={mib(rec['kv_physical'])} committed: {per} | device={mib(rec['device_physical'])}"
        )
        return rec

    def run(self) -> list[dict]:
        s, out = self.sut, self.out
        kv, w, g, ep = s.kv, s.weights, s.governor, s.ep
        out(f"Device: {mib(s.sim.capacity)} of {mib(s.sim.page_size)} pages; Governor capacity {mib(g.capacity())}")
        out("\nModel weights (ModelResidency): one hot decoder, two cold encoders")
        w.load("decoder", 12 * GiB, hot=True)
        w.load("vision-encoder", 300 * MiB, hot=False)
        w.load("audio-encoder", 400 * MiB, hot=False)
        self.ledger("weights loaded")

        out("\n1. VirtualBacking.reserve(10 GiB) for request A: a stable address, no physical pages")
        kv.open("A", 10 * GiB)
        base = kv.view("A").address
        out(f"  reserved {mib(kv.reservation('A').allocation.size)} at {base:#x}")
        self.ledger("reserved")

        for target in (100 * MiB, 120 * MiB):
            out(f"\n2-6. grow A to {mib(target)}: grant -> commit_range -> update view -> charge")
            n = kv.grow("A", target)
            out(f"  committed {mib(n)} more; view v{kv.view('A').version} = {mib(kv.view('A').nbytes)} at {kv.view('A').address:#x}")
            self.ledger(f"A={mib(target)}")

        out("\n   grow A to 160 MiB with a commit failure injected at step 4")
        old_view = kv.view("A")
        try:
            kv.grow("A", 160 * MiB, fail_at=4)
        except Exception as e:  # noqa: BLE001 - the story prints it
            out(f"  step 4 failed: {type(e).__name__}: {e}")
        assert kv.view("A") == old_view, "old view not kept"
        out(f"  rolled back: view still v{old_view.version} = {mib(old_view.nbytes)}; grant returned (granted={mib(g.granted())})")
        self.ledger("after rollback")
        kv.grow("A", 160 * MiB)
        out(f"  retried: view v{kv.view('A').version} = {mib(kv.view('A').nbytes)}, same address: {kv.view('A').address == base}")
        self.ledger("A=160 MiB")

        out("\n4. request B shares A's 64 MiB system-prompt prefix (SharedMapping, read-only)")
        ep.write(ep.default_stream, base, b"<system prompt KV>")
        kv.open("B", 10 * GiB, prefix_of="A", prefix_bytes=64 * MiB)
        kv.grow("B", 100 * MiB)
        ab = kv.committed("A") + kv.committed("B")
        out(f"  A and B map {mib(ab)} in total, but only {mib(kv_physical(s))} of physical pages: the prefix is counted once")
        out(f"  B reads the prefix: {ep.read(ep.default_stream, kv.view('B').address, 18)!r}")
        self.ledger("A=160 MiB, B=100 MiB (64 shared)")

        out("\n5. in-flight kernels read A and B; a pressure ticket: try to free 1 GiB, priority 1, deadline t=100")
        for r in ("A", "B"):
            kv.use(r, ep.launch(ep.default_stream, [(kv.view(r).address, 4096)], []))
            kv.set_evictable(r)
        t = g.issue_ticket("new-session", 1 * GiB, priority=1, deadline=100)
        released_w = w.on_pressure(t)
        g.respond(t, w.name, released_w)
        released_kv = kv.on_pressure(t)
        g.respond(t, kv.name, released_kv)
        out(f"  ModelResidency: two cold weights can free {mib(released_w)}")
        out(f"  KvPageStore: all pages are in use by in-flight kernels, can free only {mib(released_kv)}")
        out(f"  ticket #{t.ticket_id}: {t.state}, holds {mib(t.held)} of {mib(t.amount)} asked")
        self.ledger("ticket answered")
        expired = g.expire(100)
        out(f"  t=100: ticket {expired[0].state}; its {mib(released_w)} returned once (granted={mib(g.granted())})")
        self.ledger("ticket timed out")

        out("\n6. release flow: drop request A while its kernel has not run")
        kv.close("A")
        out(f"  dropped: queued releases={ep.pending_releases()}, run now={ep.poll()}; A's pages still mapped: "
            f"{s.sim.is_mapped(base + 100 * MiB)}")
        self.ledger("A dropped, fence pending")
        ep.synchronize()
        ran = ep.poll()
        out(f"  fence done -> {ran} release(s) ran: A's private pages freed, refunded; the prefix stays for B")
        self.ledger("A released")

        kv.close("B")
        w.unload("decoder")
        s.drain()
        self.ledger("all released")
        return self.records


def check(records: list[dict]) -> list[str]:
    """Every printed ledger is consistent: it balances, and the kv charge
    equals the KV physical bytes measured on the page table."""
    bad = []
    for r in records:
        if r["capacity"] != r["free"] + r["granted"] + r["charged"]:
            bad.append(f"[{r['label']}] ledger does not balance")
        if r["charged_kv"] != r["kv_physical"]:
            bad.append(f"[{r['label']}] kv charged {r['charged_kv']} != kv physical {r['kv_physical']}")
        if r["charged"] != r["device_physical"]:
            bad.append(f"[{r['label']}] charged {r['charged']} != device physical {r['device_physical']}")
    return bad


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    quiet = "--quiet" in argv
    records = Story((lambda _s: None) if quiet else print).run()
    bad = check(records)
    if bad:
        print("\nINCONSISTENT:\n  " + "\n  ".join(bad))
        return 1
    print(f"\nconsistent: at all {len(records)} steps the kv charge equals the KV pages on the device "
          "and the ledger balances")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
