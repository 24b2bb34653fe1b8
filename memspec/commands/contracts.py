"""``memspec contracts``: CrossHair on the spec's pure kernels.

Runs ``crosshair check`` on the PEP 316 contracts of the spec kernels and
``crosshair diffbehavior`` between each kernel and its reference counterpart;
prints a table; exits 1 on any counterexample or difference.
"""

from __future__ import annotations

import argparse
import json

from memspec.argtypes import jobs as jobs_type
from memspec.argtypes import max_jobs, out_file


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="memspec contracts", description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-condition-timeout", type=float, default=2.0, help="CrossHair seconds per condition (check)")
    ap.add_argument("--diff-timeout", type=float, default=4.0, help="CrossHair seconds per diffbehavior pair")
    ap.add_argument("--jobs", type=jobs_type, default=min(4, max_jobs()),
                    help="CrossHair subprocesses at a time (default 4: each diff runs until its paths are "
                         "exhausted, so the same iterations in less wall time on a shared machine)")
    ap.add_argument("--module-timeout", type=float, default=600.0,
                    help="wall seconds after which one CrossHair process (a module's check, a diff pair) is killed; "
                         "its rows then say TIMEOUT (not finished), never clean or counterexample (default 600)")
    ap.add_argument("--json", metavar="FILE", type=out_file)
    ns = ap.parse_args(argv)

    from memspec.invariants.formal import run_contracts

    rep = run_contracts(ns.per_condition_timeout, ns.diff_timeout, ns.jobs, ns.module_timeout)
    w = max([len(r.target) for r in rep.rows] + [10])
    print(f"{'kind':<6} {'target':<{w}} {'result':<16} {'time':>7}  detail")
    for r in rep.rows:
        res = {"clean": "no cex", "same": "same", "counterexample": "COUNTEREXAMPLE", "different": "DIFFERENT",
               "timeout": "TIMEOUT", "error": "ERROR"}.get(r.verdict, "ERROR")
        cond = f" ({r.conditions} conditions)" if r.conditions else ""
        print(f"{r.kind:<6} {r.target:<{w}} {res:<16} {r.seconds:6.2f}s  {r.detail[:160]}{cond}")
    for s in rep.skipped:
        print(f"skipped: {s}")
    bad = {v: sum(1 for r in rep.rows if r.verdict == v) for v in ("counterexample", "different", "timeout", "error")}
    summary = "all clean" if rep.ok else "FAILURES: " + ", ".join(f"{n} {v}" for v, n in bad.items() if n)
    print(f"\n{len(rep.rows)} rows, {summary}; CrossHair wall time {rep.seconds:.1f}s")
    if ns.json:
        from memspec.commands._output import write_output
        from memspec.invariants.report import write_file

        doc = {"ok": rep.ok, "seconds": rep.seconds, "skipped": rep.skipped, "rows": [r.__dict__ for r in rep.rows]}
        if not write_output("memspec contracts", "--json", ns.json,
                            lambda: write_file(ns.json, json.dumps(doc, indent=2, default=str))):
            return 2
    return 0 if rep.ok else 1
