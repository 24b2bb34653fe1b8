"""The engine's packed draws (issue 16: the harness at half the bare
Hypothesis rate; on by default, ``engine.PACKED_DRAWS`` and
``runner.STEPS_PER_RULE``; bench/README.md compares their kill power over
seeds): a step's small draws come from one wide choice of the chooser, a
one-value draw takes none, sizes stay their own choice, each step starts a
fresh integer, and the Hypothesis state machine runs several engine steps
per rule invocation without running more steps than asked."""

from __future__ import annotations

import random
from collections import Counter

from memspec.invariants import engine as E
from memspec.invariants import runner, stateful  # noqa: F401
from memspec.invariants.choosers import PACK_SMALL, PackedChooser, RandomChooser, ReplayChooser, _mix


class _Counting:
    """A chooser that counts its own choices (a stand-in for Hypothesis's)."""

    def __init__(self, values=None, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.values = list(values) if values is not None else None
        self.calls: list = []

    def integer(self, lo: int, hi: int) -> int:
        v = self.values.pop(0) if self.values is not None else self.rng.randint(lo, hi)
        self.calls.append((lo, hi, v))
        return v

    def weighted(self, weights: tuple) -> int:
        self.calls.append(("weighted", weights))
        return 0

    def boolean(self) -> bool:
        self.calls.append(("boolean",))
        return self.rng.random() < 0.5

    def choice(self, options):
        return options[self.integer(0, len(options) - 1)] if len(options) > 1 else options[0]


def test_small_draws_share_one_choice_and_one_value_draws_take_none():
    inner = _Counting()
    p = PackedChooser(inner)
    p.new_step()
    got = [p.integer(0, 3) for _ in range(10)] + [p.boolean() for _ in range(5)] + [p.integer(7, 7)]
    assert got[-1] == 7
    assert len(inner.calls) == 1 and inner.calls[0][:2] == (0, (1 << 64) - 1)
    assert all(0 <= v <= 3 for v in got[:10])


def test_a_size_is_its_own_choice_and_a_new_step_a_new_integer():
    inner = _Counting()
    p = PackedChooser(inner)
    p.new_step()
    p.integer(0, 3)
    size = p.integer(1, 3 * 2 * 1024 * 1024)                       # more than PACK_SMALL values
    assert inner.calls[-1][:2] == (1, 3 * 2 * 1024 * 1024) and size == inner.calls[-1][2]
    p.integer(0, 3)
    assert len(inner.calls) == 2                                    # still the step's packed integer
    p.new_step()
    p.integer(0, 3)
    assert len(inner.calls) == 3                                    # the next step's own


def test_a_packed_integer_runs_out_and_the_next_is_drawn():
    inner = _Counting()
    p = PackedChooser(inner)
    p.new_step()
    for _ in range(40):                                             # 40 draws of 256 values: 320 bits
        p.integer(0, PACK_SMALL - 1)
    assert len(inner.calls) >= 5


def test_zero_decodes_to_every_draws_smallest_value():
    """Shrinking the packed choice to 0 makes every argument its domain's smallest."""
    assert _mix(0) == 0
    p = PackedChooser(_Counting(values=[0]))
    p.new_step()
    assert [p.integer(5, 9), p.integer(-2, 2), p.boolean(), p.choice("abc")] == [5, -2, False, "a"]


def test_mix_is_a_bijection_on_a_sample_and_digits_are_about_uniform():
    xs = list(range(5000)) + [random.Random(1).getrandbits(64) for _ in range(5000)]
    assert len({_mix(x) for x in xs}) == len(set(xs))
    # small packed integers (Hypothesis draws wide integers mostly small) still give uniform digits
    counts = Counter()
    for x in range(1, 4001):
        p = PackedChooser(_Counting(values=[x]))
        p.new_step()
        counts[(p.integer(0, 3), p.integer(0, 2))] += 1
    assert len(counts) == 12
    assert max(counts.values()) < 1.3 * 4000 / 12 and min(counts.values()) > 0.7 * 4000 / 12, counts


def test_the_steps_first_action_draw_is_its_own_choice_a_repeat_is_packed():
    inner = _Counting()
    p = PackedChooser(inner)
    p.new_step()
    assert p.weighted((3, 2, 1)) == 0
    assert inner.calls == [("weighted", (3, 2, 1))]
    k = p.weighted((3, 2, 1))
    assert 0 <= k <= 2 and inner.calls[-1][:2] == (0, (1 << 64) - 1)
    p.new_step()
    p.weighted((3, 2, 1))
    assert inner.calls[-1] == ("weighted", (3, 2, 1))


def test_recorded_choices_are_the_decoded_values_and_replay_the_same_arguments(monkeypatch):
    """A trace step's choices are what each domain drew (one-value draws
    included), not the packed integer: a reproduction replays them into the
    same arguments."""
    monkeypatch.setattr(E, "PACKED_DRAWS", True)
    plan = runner.make_plan("reference", "mechanism")
    run = E.Run(plan, capacity=plan.factory_kwargs.get("capacity"))
    try:
        rng = random.Random(5)
        for _ in range(40):
            run.step(RandomChooser(rng))
    finally:
        run.close()
    trace = run.trace
    assert len(trace) == 40 and sum(1 for ts in trace if ts.choices) >= 20
    again = E.Run(plan, capacity=run.capacity)
    try:
        for ts in trace:
            assert all(type(c) is bool or abs(c) < (1 << 40) for c in ts.choices), ts
            a = plan.machine.action(ts.action)
            args = a.draw_args(again.state, ReplayChooser(ts.choices))
            assert args == ts.args, (ts.action, ts.choices)
            again.apply(a, args)
    finally:
        again.close()


def test_a_walk_records_the_packed_choices_and_replays_them_into_the_same_steps(monkeypatch):
    monkeypatch.setattr(E, "PACKED_DRAWS", True)
    plan = runner.make_plan("reference", "mechanism")
    record: list = []
    run = E.Run(plan, chooser=RandomChooser(random.Random(3), record))
    steps = []
    try:
        ch = RandomChooser(random.Random(4), record)
        for _ in range(25):
            ts = run.step(ch)
            steps.append(None if ts is None else (ts.action, ts.args))
    finally:
        run.close()

    class _Replay:
        def __init__(self, values):
            self.values = list(values)

        def integer(self, lo, hi):
            return self.values.pop(0)

        def weighted(self, weights):
            from bisect import bisect_right

            from memspec.invariants.choosers import _cumulative

            cum = _cumulative(weights)
            return bisect_right(cum, self.integer(0, cum[-1] - 1))

    rep = _Replay(record)
    run2 = E.Run(plan, chooser=rep)
    try:
        again = []
        for _ in range(25):
            ts = run2.step(rep)
            again.append(None if ts is None else (ts.action, ts.args))
    finally:
        run2.close()
    assert again == steps and not rep.values


def test_the_state_machine_runs_at_most_the_steps_asked_several_per_rule(monkeypatch):
    from hypothesis.internal.conjecture.data import ConjectureData

    plan = runner.make_plan("reference", "mechanism")
    longest = [0]
    real_teardown = E.Run.teardown

    def teardown(self):
        longest[0] = max(longest[0], self.nsteps)
        return real_teardown(self)

    nodes = [0]
    real_freeze = ConjectureData.freeze

    def freeze(self):
        if not self.frozen:
            nodes[0] += len(self.nodes)
        return real_freeze(self)

    monkeypatch.setattr(E.Run, "teardown", teardown)
    monkeypatch.setattr(ConjectureData, "freeze", freeze)
    monkeypatch.setattr(E, "PACKED_DRAWS", True)
    monkeypatch.setattr(stateful, "STEPS_PER_RULE", 3)
    res = runner.run_hypothesis(plan, runner.hypothesis_settings("ci", examples=10, steps=7), more_passes=0)
    assert not res.failures and not res.errors
    assert longest[0] == 7                                          # the last rule invocation runs fewer steps
    # per step: the action, one packed integer, a size now and then, half a stop boolean
    # (measured 2.9 on both levels at 100 x 50; 10-12 with one choice per draw)
    assert nodes[0] / plan.stats.steps < 5, nodes[0] / plan.stats.steps


def test_unpacked_a_step_draws_as_before(monkeypatch):
    """With packing off a guided chooser is used as it is: every draw its own choice."""
    monkeypatch.setattr(E, "PACKED_DRAWS", False)
    plan = runner.make_plan("reference", "mechanism")
    inner = _Counting(seed=2)
    run = E.Run(plan, chooser=inner)
    try:
        for _ in range(10):
            run.step(inner)
    finally:
        run.close()
    assert run._packed is None
    ints = [c for c in inner.calls if type(c[0]) is int]
    assert ints and not any(c[1] == (1 << 64) - 1 for c in ints)
