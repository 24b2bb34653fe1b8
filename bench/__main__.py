"""``python -m bench`` (or ``memspec bench``): run the benchmarks, print the
table, write JSON.

    python -m bench                 # everything (< 10 min on 2 cores)
    python -m bench --quick         # tiny sizes: a smoke run (seconds)
    python -m bench --only caching  # one group: harness walk oracle liveset caching replay jobs formal gpu report oom
    python -m bench --json out.json # default bench-results.json
    python -m bench --markdown t.md # also the table as Markdown

Every figure is compared with a baseline measured in the same run on the
same machine (the ratio column); a row that cannot run says why ("not
available: ..." / "not run: ...") and is never counted as met.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from typing import Callable

from bench.common import FAILED, Row, print_table, unavailable

#: group name -> module:function(quick) -> rows, in table order
GROUPS: dict[str, str] = {
    "harness": "bench.harness:harness_rows",
    "walk": "bench.harness:walk_rows",
    "oracle": "bench.oracle:run",
    "liveset": "bench.harness:liveset_rows",
    "caching": "bench.caching:run",
    "replay": "bench.replay:run",
    "jobs": "bench.fuzz_jobs:run",
    "formal": "bench.formal:run",
    "gpu": "bench.gpu:run",
    "report": "bench.report:run",
    "oom": "bench.oom:run_all",
}


def _load(spec: str) -> Callable[[bool], list[Row]]:
    import importlib

    mod, fn = spec.split(":")
    return getattr(importlib.import_module(mod), fn)


def run_groups(names: list[str], quick: bool, log=print) -> list[Row]:
    rows: list[Row] = []
    for name in names:
        t0 = time.perf_counter()
        log(f"[bench] {name} ...", flush=True)
        try:
            got = _load(GROUPS[name])(quick)
        except Exception as e:  # a benchmark's own crash is a row, not the end of the run
            tb = traceback.format_exc(limit=3)
            got = [unavailable(f"{name} (crashed)", "", "", f"{type(e).__name__}: {e}", status=FAILED)]
            got[0].extra["traceback"] = tb
        log(f"[bench] {name} done in {time.perf_counter() - t0:.1f} s", flush=True)
        rows.extend(got)
    return rows


def main(argv: list[str] | None = None, prog: str = "python -m bench") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks every benchmark runs, figures are not meaningful")
    p.add_argument("--json", default="bench-results.json", metavar="FILE", help="where to write the results (default %(default)s)")
    p.add_argument("--only", action="append", choices=list(GROUPS), metavar="NAME",
                   help=f"run only this group (repeatable): {', '.join(GROUPS)}")
    p.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown (for bench/README.md)")
    args = p.parse_args(argv)
    names = args.only or list(GROUPS)
    t0 = time.perf_counter()
    rows = run_groups(names, args.quick)
    elapsed = time.perf_counter() - t0
    print_table(rows)
    if args.quick:
        print("QUICK MODE: sizes reduced to check that every benchmark runs; the figures and verdicts are not the targets'.")
    measured = [r for r in rows if r.met is not None]
    print(f"targets met: {sum(bool(r.met) for r in measured)}/{len(measured)} measured "
          f"({len(rows) - len(measured)} rows without a target verdict); {elapsed:.0f} s")
    doc = {
        "quick": args.quick,
        "groups": names,
        "elapsed_s": elapsed,
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()},
        "rows": [r.as_dict() for r in rows],
    }
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=2, default=str)
    print(f"wrote {args.json}")
    if args.markdown:
        from bench.common import markdown_table

        with open(args.markdown, "w") as f:
            f.write(markdown_table(rows) + "\n")
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
