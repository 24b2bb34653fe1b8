"""Protocol templates (issue 12, deliverable 5): the engine plays a protocol
of the spec as a macro-step -- make its objects, call the actions that name
them in the order they do over an object's life, the protocol's other
actions between them, its sweeps last -- learned from the spec alone.
Every test checks a structure read from the spec, or compares runs with and
without templates on the same draws, so each can fail."""

from __future__ import annotations

import random

from memspec.invariants import draws as D
from memspec.invariants import engine as E
from memspec.invariants.choosers import RandomChooser
from memspec.invariants.planning import Template, learn_protocols, make_plan
from memspec.spec.api import MiB


def _plan(level: str = "system"):
    return make_plan("reference", level, capacity=16 * MiB)


def test_templates_are_learned_from_the_spec_alone():
    plan = _plan()
    t = plan.templates
    fence = t["objects of allocate_owned"]
    # the stream a use names is made before the allocation; use before drop (drop ends an object's life)
    assert fence.producers == ("new_stream", "allocate_owned")
    assert fence.consumers.index("use") < fence.consumers.index("drop")
    tickets = t["objects of issue_ticket"]
    assert tickets.producers == ("issue_ticket",)
    # a holder's answer grants the ticket before a claim takes it; expire names every ticket at once: a sweep
    assert tickets.consumers.index("respond") < tickets.consumers.index("claim")
    assert "expire" in tickets.sweeps and "expire" not in tickets.consumers
    assert "load_weight" in tickets.makers and "poll" not in tickets.makers
    # one template per learned group, same names
    assert set(t) == {n for n, _g in plan.protocols}
    # a spec the walk cannot run gives nothing, never an error
    assert learn_protocols(plan.machine, {"capacity": -1}, plan.actions) == ((), ())


def test_a_script_makes_the_objects_first_then_follows_the_life_then_sweeps():
    plan = _plan()
    tpl = plan.templates["objects of issue_ticket"]
    names = dict(D.focus_groups(plan))["objects of issue_ticket"]
    run = E.Run(plan)
    for seed in range(30):
        record: list = []
        script = [a.name for a in reversed(run._draw_script(RandomChooser(random.Random(seed), record), tpl,
                                                            names))]
        assert script[0] == "issue_ticket"
        # the companion that makes something (a weight a holder's answer releases) comes before the consumers
        first_consumer = min(script.index(c) for c in tpl.consumers)
        assert all(i < first_consumer for i, a in enumerate(script) if a == "load_weight")
        assert "load_weight" in script
        # consumers in the learned order, the sweep last
        life = [a for a in script if a in tpl.consumers]
        assert life == sorted(life, key=tpl.consumers.index)
        assert script[-1] == "expire"
        # the same choices draw the same script (Hypothesis replays choices when it shrinks)
        again = [a.name for a in reversed(run._draw_script(_Replay(record), tpl, names))]
        assert again == script
    run.close()


class _Replay:
    def __init__(self, record: list) -> None:
        self.it = iter(record)

    def integer(self, lo: int, hi: int) -> int:
        return next(self.it)


def test_a_template_the_plan_does_not_draw_is_left_out_of_the_script():
    plan = _plan()
    tpl = Template("t", ("new_stream", "no_such_action"), ("use", "drop"), ("poll",))
    run = E.Run(plan)
    script = [a.name for a in reversed(run._draw_script(RandomChooser(random.Random(1)), tpl, frozenset()))]
    run.close()
    assert "no_such_action" not in script and script[0] == "new_stream" and script[-1] == "poll"


def _reach(plan, examples: int) -> dict:
    """Per example (fresh target, 40 random steps): two-stream fence
    orderings polled, claims that succeeded, claimed tickets an expire step
    then passed (the counts bench.deep_protocols reports)."""
    from bench.deep_protocols import _mixed_fences
    from memspec.spec.api import TicketState

    out = {"orderings": 0, "claims": 0, "claimed_past_deadline": 0}
    for seed in range(examples):
        rng = random.Random(seed)
        ch = RandomChooser(rng)
        run = E.Run(plan, chooser=ch)
        for _ in range(40):
            s = run.state
            ts = run.step(ch)
            if ts.action in ("poll", "respond") and _mixed_fences(s):
                out["orderings"] += 1
            if ts.action == "claim" and ts.outcome.startswith("returns"):
                out["claims"] += 1
            if ts.action == "expire" and any(t.state == TicketState.CLAIMED and 0 < t.deadline <= s.clock
                                             for t in s.tickets.values()):
                out["claimed_past_deadline"] += 1
        run.close()
    return out


def test_templates_reach_the_deep_protocols_more_often_on_the_same_draws():
    """The reach figures of bench.deep_protocols on the reference, with and
    without templates (same seeds, same swarm and focus draws otherwise)."""
    plan = _plan()
    with_t = _reach(plan, 150)
    plan.templates = {}
    without = _reach(plan, 150)
    assert with_t["orderings"] > without["orderings"], (with_t, without)
    assert with_t["claims"] > 1.5 * without["claims"], (with_t, without)
    assert with_t["claimed_past_deadline"] >= 1, (with_t, without)
