"""Seeing a run: what the HTML report and the Hypothesis events cost.

* ``report size``: the HTML report of a 200-example conformance run of the
  shipped ``release-before-fence`` mutant (one failure, S4), in KiB.
* ``--html time / run time``: building the report (the failure replayed in a
  supervised child, a picture per step, the HTML) against the conformance
  run it reports on -- the same run, so the ratio is what ``--html`` adds.
* ``step rate with events / without``: the conformance engine on the
  reference target (system level) with the per-step ``event()`` calls and
  with them switched off, alternating in one process.

``python -m bench --only report``.
"""

from __future__ import annotations

import os
import tempfile
import time

from bench.common import Row

MUTANT = "mutant:release-before-fence"


def _html_rows(quick: bool) -> list[Row]:
    from memspec.invariants import html_report, runner

    examples = 20 if quick else 200
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        res = runner.conform(MUTANT, "all", examples=examples, capacity=16 << 20, out_dir=os.path.join(d, "repro"))
        t1 = time.perf_counter()
        path = os.path.join(d, "report.html")
        html_report.write_html(path, {MUTANT: res}, {"examples": examples})
        t2 = time.perf_counter()
        size = os.path.getsize(path)
    fails = sum(len(r.failures) for r in res)
    run_s, html_s = t1 - t0, t2 - t1
    note = f"{examples} examples, {fails} failure(s), run {run_s:.1f} s, report {html_s:.2f} s"
    return [Row("HTML report size (mutant run, one failure)", size / 1024, "KiB", None, "", None, note),
            Row("--html time / run time (same run)", html_s, "s", html_s / run_s if run_s else None, "", None, note)]


def _events_row(quick: bool) -> Row:
    from memspec.invariants import runner, signals
    from memspec.invariants.planning import make_plan

    examples = 5 if quick else 15
    plan = make_plan("reference", "system")
    sets = runner.hypothesis_settings("ci", examples=examples, steps=50)
    real = signals.step
    times = {True: 0.0, False: 0.0}
    steps = {True: 0, False: 0}
    try:
        for rnd in range(12 if not quick else 2):   # fine interleaving: the machine's load drifts
            for on in ((True, False) if rnd % 2 == 0 else (False, True)):
                signals.step = real if on else (lambda *a: None)
                plan.stats = type(plan.stats)()
                t0 = time.perf_counter()
                runner.run_hypothesis(plan, sets)
                times[on] += time.perf_counter() - t0
                steps[on] += plan.stats.steps
    finally:
        signals.step = real
    r_on, r_off = steps[True] / times[True], steps[False] / times[False]
    return Row("step rate with events / without (reference, system)", r_on, "steps/s", r_on / r_off, "", None,
               f"without: {r_off:.0f} steps/s; {steps[True]} and {steps[False]} steps")


def run(quick: bool = False) -> list[Row]:
    return _html_rows(quick) + [_events_row(quick)]
