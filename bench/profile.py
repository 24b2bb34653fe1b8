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


#: (label, file suffix, function name) of the harness's per-step phases
#: (the engine's file is read from its code: ``Run`` lives in
#: invariants/engine.py, re-exported by invariants/harness.py)
PHASES = (
    ("draw an action and its arguments (availability of every action)", "engine.py", "choose"),
    ("invariants (Run.check_invariants: every invariant, re-evaluated on change)", "engine.py", "check_invariants"),
    ("observations (spec figure vs implementation figure)", "engine.py", "check_observations"),
    ("data integrity (stamps written/verified through the EP)", "integrity.py", "after_step"),
    ("fresh target + spec state per run (Run.__init__)", "engine.py", "__init__"),
)


def breakdown(stats: pstats.Stats) -> str:
    """Cumulative seconds of the harness phases; ``apply`` minus the checks is
    the spec step + the implementation call + outcome matching."""
    try:
        from memspec.invariants.harness import Run

        run_init_line = Run.__init__.__code__.co_firstlineno
    except ImportError:
        run_init_line = -1
    cum: dict[tuple[str, str], float] = {}
    for (file, line, fn), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if fn == "__init__" and line != run_init_line:
            continue
        key = (file.rsplit("/", 1)[-1], fn)
        cum[key] = cum.get(key, 0.0) + ct
    apply_t = cum.get(("engine.py", "apply"), 0.0)
    check_t = cum.get(("engine.py", "check_after"), 0.0)
    total = cum.get(("engine.py", "choose"), 0.0) + apply_t + cum.get(("engine.py", "__init__"), 0.0)
    if total <= 0:
        return "harness step breakdown: no harness steps in this profile"
    lines = [f"harness step breakdown (cProfile; {total:.2f} s in the harness's steps = 100%, "
             f"of {stats.total_tt:.2f} s profiled):"]  # type: ignore[attr-defined]
    for label, f, fn in PHASES:
        t = cum.get((f, fn), 0.0)
        lines.append(f"  {t:7.2f} s  {100 * t / total:5.1f}%  {label}")
    t = apply_t - check_t
    lines.append(f"  {t:7.2f} s  {100 * t / total:5.1f}%  spec step + implementation call + outcome match (apply - checks)")
    return "\n".join(lines)


def _walk_on_this_thread() -> None:
    """cProfile sees only the thread it runs on, and the walk runs each run
    on the guard's worker thread (``CallGuard.run_watched``): while
    profiling, run it on the calling thread instead (the same calls and
    counters; no hang watch)."""
    import threading

    from memspec.invariants.guard import CallGuard

    def run_here(self, fn, *args, poll=None):
        self.depth = 0
        self._owner = threading.get_ident()
        try:
            return fn(*args), None
        except BaseException as e:  # noqa: BLE001 - as the worker thread would report it
            return None, e

    CallGuard.run_watched = run_here


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile")
    p.add_argument("group", choices=list(GROUPS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--sort", default="tottime", choices=["tottime", "cumulative", "ncalls"])
    p.add_argument("--out", help="also dump the raw profile here (for snakeviz etc.)")
    p.add_argument("--breakdown", action="store_true",
                   help="harness groups: split a step's time into draw / spec+target call / invariants / "
                        "observations / data integrity / fresh target")
    args = p.parse_args(argv)
    _walk_on_this_thread()
    prof = cProfile.Profile()
    rows = prof.runcall(_load(GROUPS[args.group]), args.quick)
    print_table(rows)
    if args.out:
        prof.dump_stats(args.out)
    if args.breakdown:
        print(breakdown(pstats.Stats(prof)))
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(args.sort).print_stats(args.top)
    print(buf.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
