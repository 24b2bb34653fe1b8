"""A/B of the harness's Hypothesis draws, in one process, interleaved:
``python -m bench.harness_ab [REPS]``.

``before``: one Hypothesis choice per draw of the engine (every argument,
every guidance boolean, every swarm and script count; a draw over a single
value too) and one engine step per invocation of the state machine's rule
(``engine.PACKED_DRAWS`` off, ``stateful.STEPS_PER_RULE`` 1: the default until
session 10).
``after``: a step's small draws packed into one wide choice
(:class:`~memspec.invariants.choosers.PackedChooser`), :data:`AFTER_STEPS_PER_RULE`
engine steps per rule invocation (the default since session 10: over
four seeds they kill the caching catalog about as often as ``before`` (64 vs 65
of 68 kills, 67 vs 68 with the remainder sizes), see
``engine.PACKED_DRAWS``).  Each side runs ``memspec conform reference`` (CI profile,
100 x 50, both levels); CPU microseconds per step of the supervised child
(``RUSAGE_CHILDREN``) and of the supervisor (``process_time``), Hypothesis
choices per step (counted in the child as each test case ends), and the
bare Hypothesis machine's CPU per step and choices per step in the same run.
CPU time, not wall: on a shared machine the wall clock measures the
scheduler too.
"""

from __future__ import annotations

import mmap
import resource
import struct
import sys
import time

from bench.bare import bare_rate

#: the ``after`` side's engine steps per rule invocation
AFTER_STEPS_PER_RULE = 4
#: shared with the supervised child (made before its fork): choices, test cases
_COUNT = mmap.mmap(-1, 16)


def _count_choices() -> None:
    """Count every test case's choices (``ConjectureData.freeze``) into
    :data:`_COUNT`, in this process and in the children it forks."""
    from hypothesis.internal.conjecture.data import ConjectureData

    if getattr(ConjectureData.freeze, "_memspec_ab", False):
        return
    orig = ConjectureData.freeze

    def freeze(self) -> None:
        if not self.frozen:
            n, cases = struct.unpack_from("<QQ", _COUNT, 0)
            struct.pack_into("<QQ", _COUNT, 0, n + len(self.nodes), cases + 1)
        orig(self)

    freeze._memspec_ab = True
    ConjectureData.freeze = freeze


def _choices() -> tuple[int, int]:
    n, cases = struct.unpack_from("<QQ", _COUNT, 0)
    struct.pack_into("<QQ", _COUNT, 0, 0, 0)
    return n, cases


def _one(after: bool) -> tuple[float, float, int, float]:
    from memspec.invariants import engine, runner, stateful

    real = engine.PACKED_DRAWS, stateful.STEPS_PER_RULE
    engine.PACKED_DRAWS, stateful.STEPS_PER_RULE = (True, AFTER_STEPS_PER_RULE) if after else (False, 1)
    try:
        _choices()
        b, c = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time()
        results = runner.conform("reference", "all", profile="ci", examples=100, steps=50, out_dir=None)
        a, parent = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time() - c
        nodes, _cases = _choices()
    finally:
        engine.PACKED_DRAWS, stateful.STEPS_PER_RULE = real
    steps = sum(r.stats.steps for r in results if r.plan is not None)
    bad = [(r.level, r.errors, [f.invariant for f in r.failures]) for r in results if r.errors or r.failures]
    if bad or not steps:
        raise SystemExit(f"conform reference did not run clean: {bad}")
    child = (a.ru_utime - b.ru_utime) + (a.ru_stime - b.ru_stime)
    return child / steps * 1e6, parent / steps * 1e6, steps, nodes / steps


def main(argv: list[str]) -> int:
    reps = int(argv[0]) if argv else 3
    _count_choices()
    res: dict[bool, list] = {False: [], True: []}
    bare = []
    for i in range(reps):
        _choices()
        c = time.process_time()
        r = bare_rate(100, 50)
        nodes, _cases = _choices()
        bare.append(((time.process_time() - c) / r[1] * 1e6, nodes / r[1]))
        for after in ((False, True) if i % 2 == 0 else (True, False)):
            res[after].append(_one(after))
    print(f"bare Hypothesis: CPU us/step {', '.join(f'{x[0]:.0f}' for x in bare)}; "
          f"choices/step {', '.join(f'{x[1]:.2f}' for x in bare)}")
    best_bare = min(x[0] for x in bare)
    for after in (False, True):
        rows = res[after]
        print(f"{'after ' if after else 'before'}: child CPU us/step {', '.join(f'{x[0]:.0f}' for x in rows)}; "
              f"supervisor {', '.join(f'{x[1]:.0f}' for x in rows)}; choices/step "
              f"{', '.join(f'{x[3]:.2f}' for x in rows)}; {rows[0][2]} steps a run; "
              f"bare / child: {', '.join(f'{b[0] / x[0]:.3f}' for b, x in zip(bare, rows))} "
              f"(best runs {best_bare / min(x[0] for x in rows):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
