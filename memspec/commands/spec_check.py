"""``memspec spec-check [--examples N] [--steps N] [--seed S] [--machine system|mechanism|all] [--no-shrink]``

Run the spec's own Hypothesis stateful test, with no implementation: random
action sequences on the spec alone (branches a conforming implementation
could take, chosen among those with witnesses), every invariant checked
after each step.  Prints a summary; exit 0 if no invariant broke.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="memspec spec-check", description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--seed", type=int, default=None, help="seed (default: derandomized)")
    p.add_argument("--machine", choices=("system", "mechanism", "all"), default="all")
    p.add_argument("--no-shrink", action="store_true", help="report the first failure as found (faster)")
    args = p.parse_args(argv)
    from hypothesis import settings

    from memspec import profiles  # noqa: F401  (registers the profiles)
    from memspec.spec.mechanism import MECHANISM
    from memspec.spec.selfcheck import run
    from memspec.spec.system import SYSTEM

    machines = {"system": [SYSTEM], "mechanism": [MECHANISM], "all": [MECHANISM, SYSTEM]}[args.machine]
    failed = False
    for m in machines:
        stats: dict[str, int] = {}
        t0 = time.perf_counter()
        try:
            run(m, examples=args.examples, steps=args.steps, seed=args.seed, stats=stats, shrink=not args.no_shrink,
                base=settings.get_profile("ci"))
            verdict = "PASS"
        except Exception as e:  # a broken invariant (shrunk) or a spec error
            verdict = f"FAIL: {type(e).__name__}: {e}"
            failed = True
        dt = time.perf_counter() - t0
        print(f"{m.name:<10} {len(m.actions)} actions, {len(m.invariants)} invariants: "
              f"{stats.get('examples', 0)} examples, {stats.get('steps', 0)} steps in {dt:.1f}s -- {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
