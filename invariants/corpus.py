"""Z3 drives the implementations: traces Z3 finds, replayed against targets.

DESIGN.md (*Formal checks*): the traces the solver synthesizes are run
against every target through the conformance harness, which checks at each
step that the target takes the branch the spec takes.  ``memspec conform
--corpus`` runs them.

What the corpus holds now: for each caching preset (``pytorch``, ``seed``)
the shortest fragmentation OOM Z3 synthesizes
(:func:`memspec.invariants.proofs_caching.synthesize`: free bytes >= the
request, yet malloc fails) as a ``malloc``/``free`` sequence on the caching
machine.  Not yet in it: the unguarded refutations of S1-S15 and the
per-branch traces of the encoded actions (they are traces of the abstract
encodings; translating them to spec-level actions is not done).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memspec.spec.api import MiB

CAPACITY = 40 * MiB  # the synthesis' device


@dataclass
class CorpusTrace:
    name: str
    source: str                      # what produced it
    preset: str                      # the caching preset it was synthesized for
    steps: list[tuple[str, dict[str, Any]]]
    expect: str                      # the outcome of the last step on its own preset
    capacity: int = CAPACITY


@dataclass
class ReplayResult:
    trace: CorpusTrace
    target: str
    ok: bool
    detail: str
    branches: list[tuple[str, str]] = field(default_factory=list)  # (action, outcome) per step


def _steps_from_synthesis(syn: Any) -> list[tuple[str, dict[str, Any]]]:
    """The synthesized text trace as caching-machine steps; a free names the
    spec reference its malloc made (found by running the spec alone)."""
    from memspec.invariants.proofs_caching import _parse
    from memspec.spec.caching import free, init, malloc

    st = init(policy=syn.preset, capacity=CAPACITY)
    refs: dict[str, int] = {}
    steps: list[tuple[str, dict[str, Any]]] = []
    for line in syn.trace:
        if line.startswith("free("):
            ref = refs[line[5:-1]]
            steps.append(("free", {"ref": ref}))
            out = free.step(st, ref=ref)
            out.branches[0].then(None)
            continue
        name = line.split("=")[0].strip() if "=" in line.split("(")[0] else None
        call = line.split("=", 1)[1] if name else line
        size = _parse(call[call.index("(") + 1:call.index(")")])
        steps.append(("malloc", {"size": size, "stream": 0}))
        out = malloc.step(st, size=size, stream=0)
        first = out.branches[0]
        if name and hasattr(first, "witness") and first.witness is not None:
            refs[name] = first.then(first.witness())
    return steps


def build_corpus(depth: int = 6) -> list[CorpusTrace]:
    """Every trace Z3 synthesizes for the corpus (see the module docstring)."""
    from memspec.invariants.proofs_caching import synthesize

    out = []
    for preset in ("pytorch", "seed"):
        syn = synthesize(preset, max_depth=depth)
        if syn.depth is None:
            continue
        out.append(CorpusTrace(f"fragmentation-oom[{preset}]", f"Z3 synthesis, depth {syn.depth}", preset,
                               _steps_from_synthesis(syn), "OutOfMemory"))
    return out


def replay(target: str, trace: CorpusTrace, timeout: float = 5.0) -> ReplayResult:
    """Run ``trace`` on ``target`` and the spec side by side (the harness
    fails the run where the target leaves the spec's branch); on the preset
    it was synthesized for, the last step must also end as expected."""
    from memspec.invariants import harness as H
    from memspec.invariants.repro import replay as harness_replay

    try:
        run = harness_replay(target, "caching", [(a, args, []) for a, args in trace.steps],
                             capacity=trace.capacity, timeout=timeout)
    except H.Violation as v:
        return ReplayResult(trace, target, False, f"{v.invariant} [{v.cause}] {v.reason}")
    branches = [(t.action, t.outcome) for t in run.trace]
    pol = getattr(run.state, "policy", None)
    preset, expandable = getattr(pol, "preset", None), getattr(pol, "expandable", False)
    capacity = getattr(pol, "capacity", None)
    if preset == trace.preset and not expandable and capacity == trace.capacity:
        last = branches[-1][1] if branches else ""
        if trace.expect not in last:
            return ReplayResult(trace, target, False, f"last step {last!r}, expected {trace.expect}", branches)
        return ReplayResult(trace, target, True, f"{len(branches)} steps, each on the spec's branch; ends {trace.expect}",
                            branches)
    return ReplayResult(trace, target, True, f"{len(branches)} steps, each on the spec's branch "
                        f"(target: {preset}{' + expandable' if expandable else ''}, capacity {capacity}: the "
                        "trace's end is not asserted there)", branches)


def run_corpus(targets: list[str], depth: int = 6) -> tuple[list[ReplayResult], int]:
    """Replay the whole corpus on every target; ``(results, number of traces)``."""
    corpus = build_corpus(depth)
    return [replay(t, tr) for t in targets for tr in corpus], len(corpus)


def main(targets: list[str]) -> int:
    """``memspec conform --corpus``: print one row per (target, trace)."""
    results, n = run_corpus(targets)
    branches = {b for r in results for b in r.branches}
    for r in results:
        print(f"{r.target:<30} {r.trace.name:<28} {'PASS' if r.ok else 'FAIL'}  {r.detail}")
    print(f"\ncorpus: {n} Z3 trace(s) x {len(targets)} target(s); {len(branches)} distinct (action, branch) pairs "
          f"taken; {sum(1 for r in results if not r.ok)} failure(s)")
    return 0 if results and all(r.ok for r in results) else 1
