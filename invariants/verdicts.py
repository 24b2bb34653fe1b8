"""Coverage-aware verdicts: a row says PASS only with evidence that the
actions it is about ran and succeeded.

Seed 000: *"unsupported must not masquerade as a successful no-op"* -- nor
may "never exercised" masquerade as a pass.  For every invariant the engine
counts, per action that declares it (``Action.invariants``), the steps run,
the steps that took an accepting branch (the call returned; a refusal is a
``Raises`` branch) and the steps where the spec offered one.  A row is

* **PASS** when every declaring action that the run could draw took an
  accepting branch at least :data:`MIN_ACCEPTED` times (an invariant that
  no action declares is checked after every step: it needs
  :data:`MIN_ACCEPTED` steps);
* **UNTESTED** otherwise, with the reason (``claim succeeded 0 times in 23
  steps (the spec offered success 0 times)``): not a pass;
  a ``misuse`` action (a double free) counts its refusals instead;
* **N/A** when a capability the target lacks removes the invariant (decided
  by the plan, with its reason), or when every declaring action was
  answered ``Unsupported`` where the spec allowed nothing else (or never
  became available because of that).  Such actions are left out of the
  other rows' evidence too.

The counts go into the JSON and JUnit reports.
"""

from __future__ import annotations

from typing import Any

#: accepting steps each declaring action needs for a PASS: three successes
#: of every call the rule is about, in the run's whole budget
MIN_ACCEPTED = 3


def accepted_counts(stats: Any) -> dict[str, int]:
    """``{action: steps that took an accepting branch}``: the engine's tally
    (a return, or the refusal of a ``misuse`` action), else the returns in
    the outcome tally."""
    acc = getattr(stats, "accepted", None)
    if acc:
        return {str(k): int(v) for k, v in acc.items()}
    out: dict[str, int] = {}
    for (a, o), n in stats.outcomes.items():
        if o.startswith("returns"):
            out[a] = out.get(a, 0) + n
    return out


def witness_count(stats: Any, action: str, outcome: str) -> int:
    """How many answers of ``action`` had an outcome kind containing ``outcome``."""
    return sum(int(n) for (a, o), n in stats.outcomes.items() if a == action and outcome in o)


def coverage(declares: dict[str, list[str]], drawn: list[str], stats: Any,
             threshold: int = MIN_ACCEPTED, witnesses: dict | None = None) -> dict[str, dict]:
    """``{invariant: {"tested": bool, "reason": str, "actions": {action: counts}}}``.

    ``declares`` maps each invariant to the machine's actions that declare
    it, ``drawn`` names the actions the plan draws (capabilities removed the
    others), ``stats`` is the plan's :class:`~memspec.invariants.engine.Stats`."""
    acc = accepted_counts(stats)
    offered = getattr(stats, "offered", {}) or {}
    drawn_set = set(drawn)
    # actions the target answered Unsupported every time, where the spec
    # allowed nothing else: a capability it lacks (seed 000: *unsupported
    # must be an explicit absence*), so N/A, not untested
    unsupported = sorted(a for a in drawn_set if stats.actions.get(a, 0) > 0 and not offered.get(a, 0)
                         and stats.outcomes.get((a, "raises Unsupported"), 0) == stats.actions.get(a, 0))
    out: dict[str, dict] = {}
    for inv, decl in declares.items():
        counts = {a: {"steps": int(stats.actions.get(a, 0)), "accepted": acc.get(a, 0),
                      "offered": int(offered.get(a, 0))} for a in decl}
        applicable = [a for a in decl if a in drawn_set]
        # with a capability absent, an action that never became available
        # (nothing it needs could be made) is excused with it
        excused = [a for a in applicable if a in unsupported or (unsupported and counts[a]["steps"] == 0)]
        if applicable and len(excused) == len(applicable):
            out[inv] = {"tested": False, "na": f"the target answers Unsupported to {', '.join(unsupported)}",
                        "reason": "", "actions": counts}
            continue
        applicable = [a for a in applicable if a not in excused]
        missing: list[str] = []
        if stats.steps == 0:
            missing.append("no step ran")
        elif not decl:
            if stats.steps < threshold:
                missing.append(f"checked after {stats.steps} steps (no action declares it; needs {threshold})")
        elif not applicable:
            missing.append("no action that declares it is drawn for this target (" + ", ".join(decl) + ")")
        for a in applicable:
            c = counts[a]
            if c["accepted"] < threshold:
                missing.append(f"{a} succeeded {c['accepted']} times in {c['steps']} steps "
                               f"(the spec offered success {c['offered']} times; needs {threshold})")
        seen_w = {}
        for action, outcome, describe in (witnesses or {}).get(inv, ()):
            if action not in drawn_set or action in excused:
                continue
            n = witness_count(stats, action, outcome)
            seen_w[describe] = n
            if n < threshold and stats.steps:
                missing.append(f"witness missing: {describe} ({action} -> {outcome}) seen {n} times "
                               f"(needs {threshold})")
        out[inv] = {"tested": not missing, "reason": "; ".join(missing), "actions": counts,
                    "witnesses": seen_w}
    return out
