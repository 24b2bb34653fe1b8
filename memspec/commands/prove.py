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
    total = time.perf_counter() - t_all
    print(f"\n{len(rows)} invariants; total {total:.2f}s" + (f"; {agreement_note}" if agreement_note else ""))
    if ns.json:
        with open(ns.json, "w") as fh:
            json.dump({
                "total_seconds": total,
                "ok": not failed,
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
