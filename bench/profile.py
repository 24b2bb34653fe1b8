"""``python -m bench.profile GROUP [--quick] [--top N] [--sort tottime]``:
run one benchmark group under cProfile and print its hot spots.

This is how the analysis in bench/README.md was made (py-spy, when
installed, gives the same picture without the profiler's overhead:
``py-spy record -o out.svg -- python -m bench --only GROUP``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys

from bench.__main__ import GROUPS, _load
from bench.common import print_table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile")
    p.add_argument("group", choices=list(GROUPS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--sort", default="tottime", choices=["tottime", "cumulative", "ncalls"])
    p.add_argument("--out", help="also dump the raw profile here (for snakeviz etc.)")
    args = p.parse_args(argv)
    prof = cProfile.Profile()
    rows = prof.runcall(_load(GROUPS[args.group]), args.quick)
    print_table(rows)
    if args.out:
        prof.dump_stats(args.out)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(args.sort).print_stats(args.top)
    print(buf.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
