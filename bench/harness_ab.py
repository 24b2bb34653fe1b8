"""A/B of the supervised harness's step record, in one process, interleaved:
``python -m bench.harness_ab [REPS]``.

``before``: every step sent to the supervisor as one pipe message, its
arguments made safe by an ``ast.literal_eval(repr(args))`` round trip (the
code before the :class:`~memspec.invariants.guard.StepLog`; emulated here by
hiding the log and the plain-literal fast path from the runner).  ``after``:
the steps in the shared StepLog, plain arguments sent as their repr.  Each
side runs ``memspec conform reference`` (CI profile, 100 x 50, both levels);
CPU microseconds per step of the supervised child (``RUSAGE_CHILDREN``) and
of the supervisor (``process_time``), and the bare Hypothesis machine's in
the same run.  CPU time, not wall: on a shared machine the wall clock
measures the scheduler too.
"""

from __future__ import annotations

import resource
import sys
import time

from bench.bare import bare_rate


def _one(after: bool) -> tuple[float, float, int]:
    from memspec.invariants import runner

    class _NoLog:
        current = None

    real_log, real_plain = runner.StepLog, runner._plain
    if not after:
        runner.StepLog = _NoLog
        runner._plain = lambda v, depth=0: False
    try:
        b, c = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time()
        results = runner.conform("reference", "all", profile="ci", examples=100, steps=50, out_dir=None)
        a, parent = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time() - c
    finally:
        runner.StepLog, runner._plain = real_log, real_plain
    steps = sum(r.stats.steps for r in results if r.plan is not None)
    bad = [(r.level, r.errors, [f.invariant for f in r.failures]) for r in results if r.errors or r.failures]
    if bad or not steps:
        raise SystemExit(f"conform reference did not run clean: {bad}")
    child = (a.ru_utime - b.ru_utime) + (a.ru_stime - b.ru_stime)
    return child / steps * 1e6, parent / steps * 1e6, steps


def main(argv: list[str]) -> int:
    reps = int(argv[0]) if argv else 3
    res: dict[bool, list] = {False: [], True: []}
    bare = []
    for i in range(reps):
        c = time.process_time()
        r = bare_rate(100, 50)
        bare.append((time.process_time() - c) / r[1] * 1e6)
        for after in ((False, True) if i % 2 == 0 else (True, False)):
            res[after].append(_one(after))
    print(f"bare Hypothesis CPU us/step: {', '.join(f'{x:.0f}' for x in bare)}")
    for after in (False, True):
        rows = res[after]
        print(f"{'after ' if after else 'before'}: child CPU us/step {', '.join(f'{x[0]:.0f}' for x in rows)}; "
              f"supervisor {', '.join(f'{x[1]:.0f}' for x in rows)}; {rows[0][2]} steps a run; "
              f"bare / child (best runs) {min(bare) / min(x[0] for x in rows):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
