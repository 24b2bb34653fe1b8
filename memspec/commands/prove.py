"""``memspec prove``: Z3 inductive proofs of the spec's invariants.

Prints a matrix, one row per invariant: the inductive proof (initiation,
consecution for every action touching it, safety where it is a
strengthening), the refutation of its unguarded variant (a concrete trace),
and the encoding-agreement samples of its actions against the executable
spec.  Exit status 1 if any proof fails, any unguarded variant is *not*
refuted, or any agreement sample disagrees.
"""

from __future__ import annotations

import argparse
import json
import time


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="memspec prove", description=__doc__.split("\n\n")[0])
    ap.add_argument("ids", nargs="*", help="invariant ids (default: all)")
    ap.add_argument("--samples", type=int, default=1000, help="agreement samples per encoded action (default 1000)")
    ap.add_argument("--no-agreement", action="store_true", help="skip the encoding-agreement samples")
    ap.add_argument("--traces", action="store_true", help="print each unguarded variant's counterexample trace")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-caching", action="store_true", help="skip the caching allocator's fragmentation checks")
    ap.add_argument("--depth", type=int, default=8, help="bound of the fragmentation searches (default 8)")
    ns = ap.parse_args(argv)

    from memspec.invariants.proofs import all_proofs, prove

    proofs = [p for p in all_proofs() if not ns.ids or p.id in ns.ids]
    if ns.ids and len(proofs) != len(set(ns.ids)):
        known = ", ".join(p.id for p in all_proofs())
        print(f"memspec prove: unknown invariant id in {ns.ids}; known: {known}")
        return 2

    agree: dict[str, tuple[int, int, float, list[str]]] = {}
    agreement_note = ""
    t_all = time.perf_counter()
    if not ns.no_agreement:
        from memspec.invariants.agreement import run_agreement

        for rep in run_agreement(samples=ns.samples, seed=ns.seed):
            n, bad, secs, msgs = agree.get(rep.invariant, (0, 0, 0.0, []))
            agree[rep.invariant] = (n + rep.samples, bad + len(rep.mismatches), secs + rep.seconds,
                                    msgs + [f"{rep.action}: {m}" for m in rep.mismatches[:3]])

    rows = []
    failed = False
    for p in proofs:
        r = prove(p)
        n, bad, secs, msgs = agree.get(p.id, (0, 0, 0.0, []))
        ok = r.proved and r.unguarded_refuted and bad == 0
        failed |= not ok
        rows.append((p, r, n, bad, secs, msgs))

    hdr = f"{'id':<4} {'invariant':<22} {'proved':<14} {'unguarded refuted':<22} {'agreement samples':<22}"
    print(hdr)
    print("-" * len(hdr))
    for p, r, n, bad, secs, msgs in rows:
        proved = f"{'proved' if r.proved else 'FAILED'} {r.seconds:5.2f}s"
        unguarded = f"{'refuted' if r.unguarded_refuted else 'NOT REFUTED'} {r.unguarded_seconds:5.2f}s"
        ag = "-" if ns.no_agreement else (f"{n} ok {secs:5.2f}s" if bad == 0 and n else
                                          (f"{bad}/{n} DISAGREE" if n else "none encoded"))
        print(f"{p.id:<4} {p.title:<22} {proved:<14} {unguarded:<22} {ag:<22}")
        for c in r.checks:
            if not c.ok:
                print(f"     {c.name}: {c.detail}")
        if not r.unguarded_refuted:
            print(f"     unguarded variant ({p.guard}): {r.unguarded_trace}")
        if ns.traces and r.unguarded_refuted:
            print(f"     without: {p.guard}")
            print("\n".join("   " + line for line in r.unguarded_trace.splitlines()))
        for m in msgs:
            print(f"     disagreement {m}")
        if p.bounded:
            print(f"     bounded: {p.bounded}")
    caching = None
    if not ns.no_caching and not ns.ids:
        from memspec.invariants.proofs_caching import run_caching

        caching = run_caching(depth=ns.depth, samples=ns.samples)
        failed |= not caching.ok
        print(f"\ncaching allocator (seed 003), large pool, one stream, capacity 40 MiB  [{caching.seconds:.1f}s]")
        for syn, (rok, rtext) in zip(caching.synth, caching.replays):
            if syn.depth is None:
                print(f"  {syn.preset}: NO fragmentation OOM found up to depth {ns.depth} ({syn.trace[0]})")
                continue
            print(f"  {syn.preset}: shortest fragmentation OOM (Z3, {syn.seconds:.1f}s): {syn.depth} op(s) then the failing malloc;"
                  f" free {syn.free_total // 2**20} MiB >= request {syn.rounded / 2**20:.2f} MiB")
            for line in syn.trace:
                print(f"      {line}")
            print(f"    replayed on the executable spec: {'confirmed' if rok else 'NOT CONFIRMED'}: {rtext}")
        for e in caching.expandable:
            head = (f"  {e.preset} + expandable segments: every malloc/free sequence of length <= {e.depth} "
                    f"(sizes {', '.join(f'{x / 2**20:g} MiB' for x in e.sizes)}; {e.states} states)")
            print(head)
            print("    page level (OOM although enough whole unpinned pages): " +
                  ("none" if e.page_level is None else "FOUND: " + "; ".join(e.page_level)))
            print("    byte level (OOM although capacity - allocated >= request): " +
                  ("none" if e.byte_level is None else "; ".join(e.byte_level) +
                   "  (live blocks pin partly used pages: physical exhaustion at page granularity)"))
        print(f"  Z3 policy kernels vs spec/caching/kernels.py: {2 * ns.samples} samples, "
              + ("agree" if not caching.kernel_mismatches else f"{len(caching.kernel_mismatches)} DISAGREE: {caching.kernel_mismatches[:2]}"))
        for b in caching.bounded or []:
            print(f"  {b.preset}: bounded proofs over every malloc/free sequence of <= {b.depth} ops, symbolic sizes "
                  f"[{b.seconds:.1f}s]: " + "; ".join(f"{c} {v}" for c, v in b.results.items()))
        print("  C4-C9 and inductive (unbounded) C proofs: not encoded (the conformance harness checks them on the executable spec)")
    total = time.perf_counter() - t_all
    print(f"\n{len(rows)} invariants; total {total:.2f}s" + (f"; {agreement_note}" if agreement_note else ""))
    if ns.json:
        with open(ns.json, "w") as fh:
            json.dump({
                "total_seconds": total,
                "ok": not failed,
                "caching": None if caching is None else {
                    "ok": caching.ok, "seconds": caching.seconds,
                    "synthesis": [{"preset": x.preset, "depth": x.depth, "trace": x.trace, "request": x.request,
                                   "rounded": x.rounded, "free": x.free_total, "replay_confirmed": rr[0],
                                   "replay": rr[1]} for x, rr in zip(caching.synth, caching.replays)],
                    "expandable": [{"preset": e.preset, "depth": e.depth, "sizes": list(e.sizes), "states": e.states,
                                    "page_level": e.page_level, "byte_level": e.byte_level} for e in caching.expandable],
                    "kernel_mismatches": caching.kernel_mismatches},
                "invariants": [{
                    "id": p.id, "title": p.title, "proved": r.proved,
                    "checks": [{"name": c.name, "ok": c.ok, "seconds": c.seconds, "detail": c.detail} for c in r.checks],
                    "unguarded_guard": p.guard, "unguarded_refuted": r.unguarded_refuted,
                    "unguarded_trace": r.unguarded_trace, "unguarded_seconds": r.unguarded_seconds,
                    "agreement_samples": n, "agreement_mismatches": bad, "agreement_seconds": secs,
                    "bounded": p.bounded,
                } for p, r, n, bad, secs, msgs in rows],
            }, fh, indent=2)
    return 1 if failed else 0
