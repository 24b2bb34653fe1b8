"""How deep a CI-profile run gets on the system level (issue 12, deliverable 5).

``python -m bench.deep_protocols [--target reference] [--examples 100] [--steps 40] [--seeds N] [--baseline REV]``

Runs the target at the system level in this process, under the CI profile
(derandomized Hypothesis, 16 MiB device), and prints, per 1,000 steps:

* successful ``claim`` steps (a granted ticket taken as a grant);
* two-stream fence orderings reached: ``poll``/``respond`` steps whose
  queued releases include one guarded by fences on two or more streams of
  which some, not all, are known done (the state a release that waits for
  one fence only gets wrong); and the same over any streams (one stream:
  ``use``, ``synchronize``, ``use``);
* claimed tickets whose deadline then passes in an ``expire`` step;
* the share of refusal steps (GrantDenied / OutOfMemory);
* steps per CPU second (``time.process_time``: the machine is shared).

Figures, not assertions: compare two runs of this script (``--baseline REV``
runs the engine as at an earlier revision, ``--no-guide``
switches the engine's guidance off, ``--no-templates`` the protocol
templates the engine plays as macro-steps: the same run without them).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter


def _mixed_fences(s, streams_needed: int = 2) -> bool:
    from memspec.spec.ep import fence_known_done

    for e in s.queue.values():
        fs = e.fences
        if len(fs) < 2:
            continue
        streams = {s.fences[f][0] for f in fs}
        if len(streams) < streams_needed:
            continue
        done = [fence_known_done(s, f) for f in fs]
        if any(done) and not all(done):
            return True
    return False


def engine_at(rev: str):
    """The engine's ``Run`` as it was at git revision ``rev`` (read with
    ``git show``, loaded as a module of its own): the "before" of a
    before/after comparison in one process, on the same plan."""
    import os
    import subprocess
    import sys
    import types

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = subprocess.run(["git", "show", f"{rev}:invariants/engine.py"], cwd=root, capture_output=True,
                         text=True, check=True).stdout
    mod = types.ModuleType(f"engine_at_{rev}")
    mod.__file__ = f"<engine at {rev}>"
    sys.modules[mod.__name__] = mod   # its dataclasses look their module up
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)  # our own repository's source, not input
    return mod.Run


def measure(target: str = "reference", examples: int = 100, steps: int = 40, capacity_mib: int = 16,
            guide: bool = True, swarm: bool = True, seed: int | None = None, baseline: str | None = None,
            templates: bool = True) -> dict:
    from memspec.invariants import engine as E
    from memspec.invariants import runner
    from memspec.invariants.planning import make_plan
    from memspec.spec.api import MiB, TicketState

    plan = make_plan(target, "system", capacity=capacity_mib * MiB)
    plan.guide = guide
    plan.swarm = swarm
    if not templates:
        plan.templates = {}
    extra = Counter()
    new_run = E.Run
    if baseline:
        E.Run = engine_at(baseline)
    orig = E.Run.apply

    def apply(self, action, args, choices=None):
        s = self.state
        if action.name in ("poll", "respond") and _mixed_fences(s, 1):
            extra["mixed_fence_polls"] += 1
            if _mixed_fences(s):
                extra["two_stream_orderings"] += 1
        if action.name == "use":
            o = s.owned.get(args["allocation"])
            if o is not None and any(s.fences[f][0] != args["stream"] for f in o.fences):
                extra["second_stream_uses"] += 1
        if action.name == "drop":
            o = s.owned.get(args["allocation"])
            if o is not None and o.state == "live" and len({s.fences[f][0] for f in o.fences}) >= 2:
                extra["two_stream_drops"] += 1
        if action.name == "expire":
            t_now = args["now"][0]
            if any(t.state == TicketState.CLAIMED and 0 < t.deadline <= t_now for t in s.tickets.values()):
                extra["claimed_past_deadline"] += 1
        return orig(self, action, args, choices)

    E.Run.apply = apply
    try:
        sets = runner.hypothesis_settings("ci", examples=examples, steps=steps, seed=seed)
        c0, w0 = time.process_time(), time.perf_counter()
        res = runner.run_hypothesis(plan, sets, seed=seed, shrink_seconds=2, minimize_steps=False)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    finally:
        E.Run.apply = orig
        E.Run = new_run
    st = plan.stats
    n = max(st.steps, 1)
    claims = sum(v for (a, o), v in st.outcomes.items() if a == "claim" and o.startswith("returns"))
    refusals = sum(v for (_a, o), v in st.outcomes.items() if o in ("raises GrantDenied", "raises OutOfMemory"))
    return {
        "target": target, "engine": baseline or "this checkout", "guide": guide, "swarm": swarm,
        "templates": templates,
        "examples": st.examples, "steps": st.steps,
        "failures": sorted({f.invariant for f in res.failures}), "errors": res.errors,
        "claims_per_1k": round(1000 * claims / n, 2),
        "two_stream_orderings_per_1k": round(1000 * extra["two_stream_orderings"] / n, 2),
        "mixed_fence_polls_per_1k": round(1000 * extra["mixed_fence_polls"] / n, 2),
        "second_stream_uses_per_1k": round(1000 * extra["second_stream_uses"] / n, 2),
        "two_stream_drops_per_1k": round(1000 * extra["two_stream_drops"] / n, 2),
        "claimed_past_deadline_per_1k": round(1000 * extra["claimed_past_deadline"] / n, 2),
        "refusal_share": round(refusals / n, 4),
        "cpu_seconds": round(cpu, 2), "wall_seconds": round(wall, 2),
        "steps_per_cpu_second": round(st.steps / cpu, 1) if cpu else None,
        "actions": dict(st.actions.most_common()),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="reference")
    p.add_argument("--examples", type=int, default=100)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--capacity-mib", type=int, default=16)
    p.add_argument("--no-guide", action="store_true")
    p.add_argument("--baseline", metavar="REV", help="run the engine's Run as at git revision REV instead")
    p.add_argument("--seeds", type=int, default=0,
                   help="also run this many seeded (not derandomized) runs and print the per-1k figures' mean")
    p.add_argument("--no-swarm", action="store_true")
    p.add_argument("--no-templates", action="store_true", help="no protocol templates (macro-steps)")
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--set", action="append", default=[], metavar="NAME=INT",
                   help="set a constant of the engine or its draws for this run (experiments), e.g. FOCUS_STEPS=10")
    a = p.parse_args(argv)
    from memspec.invariants import draws as D
    from memspec.invariants import engine as E

    for kv in a.set:
        k, _, v = kv.partition("=")
        mod = D if hasattr(D, k) else E   # the swarm, focus and guidance constants live in draws
        if not hasattr(mod, k):
            p.error(f"--set {kv}: no such constant in invariants.draws or invariants.engine")
        setattr(mod, k, int(v))
    out = measure(a.target, a.examples, a.steps, a.capacity_mib, guide=not a.no_guide, swarm=not a.no_swarm,
                  baseline=a.baseline, templates=not a.no_templates)
    if a.seeds:
        keys = [k for k in out if k.endswith("_per_1k") or k in ("refusal_share", "steps_per_cpu_second")]
        runs = [out] + [measure(a.target, a.examples, a.steps, a.capacity_mib, guide=not a.no_guide,
                                swarm=not a.no_swarm, seed=k + 1, baseline=a.baseline, templates=not a.no_templates)
                for k in range(a.seeds)]
        out["over_seeds"] = {k: [r[k] for r in runs] for k in keys}
        out["mean_over_seeds"] = {k: round(sum(r[k] or 0 for r in runs) / len(runs), 3) for k in keys}
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
