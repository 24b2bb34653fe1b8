"""The random walk's speed levers keep its checks (issue 16, deliverable 1).

* Data integrity in the walk is sampled as stated (``walk.sample_note``):
  the round robin re-verifies on one step in ``WALK_VERIFY_EVERY``; a
  corruption is still caught (at the latest by the full verify at the end
  of the run).
"""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from memspec.invariants import integrity as I  # noqa: E402
from memspec.invariants import walk as W  # noqa: E402
from memspec.invariants.planning import make_plan  # noqa: E402

TOY = "tests.hostile_targets:TOY"


def _round_robin_steps(monkeypatch, every: int, steps: int = 120) -> tuple[list, list, int]:
    """The steps (of the run) on which a region was verified, the steps on
    which a region the step neither touched nor bound was verified (only the
    round robin verifies those), and the steps walked."""
    seen: list = []
    untouched: list = []
    orig = I.Integrity.after_step

    def after_step(self, touched, bound):
        n0 = calls["verify"]
        calls["named"] = set(touched) | set(bound)
        calls["in_step"] = True
        try:
            orig(self, touched, bound)
        finally:
            calls["in_step"] = False
        if calls["verify"] > n0:
            seen.append(self.run.nsteps)

    calls: dict = {"verify": 0, "named": set(), "in_step": False}
    verify = I.Integrity._verify

    def counting_verify(self, region):
        calls["verify"] += 1
        # (the full verify at the end of a run is not a step's)
        if calls["in_step"] and region.ref not in calls["named"] and (not untouched or untouched[-1] != self.run.nsteps):
            untouched.append(self.run.nsteps)
        return verify(self, region)

    monkeypatch.setattr(I.Integrity, "after_step", after_step)
    monkeypatch.setattr(I.Integrity, "_verify", counting_verify)
    plan = make_plan("reference", "mechanism")
    res = W.walk(plan, max_steps=steps, seed=3, run_length=steps, verify_every=every)
    assert not res.failures and not res.errors, ([f.violation for f in res.failures], res.errors)
    assert res.runs == 1                                  # one run: its steps are numbered 1..steps
    return seen, untouched, res.steps


def test_walk_round_robin_verifies_on_one_step_in_k(monkeypatch):
    every_step, every_untouched, n = _round_robin_steps(monkeypatch, 1)
    sampled, sampled_untouched, n2 = _round_robin_steps(monkeypatch, 4)
    assert n == n2
    assert len(every_step) > n // 2                      # the harness's way: nearly every step has regions to verify
    # ``_verify`` also runs for a touched region that changed shape: only steps
    # where the round robin was due may verify an untouched region, so the
    # sampled run verifies on far fewer steps
    assert 0 < len(sampled) < len(every_step) * 3 // 4
    # the round robin is due on the first step of a run, then on every 4th:
    # an untouched region is verified only on steps 1, 5, 9, ... (a run
    # starts empty, so step 1 itself has no untouched region to verify; which
    # step first binds one depends on the draw)
    assert sampled_untouched and [s for s in sampled_untouched if s % 4 != 1] == [], sampled_untouched
    # not vacuous: verifying every step, the round robin reaches untouched
    # regions on the other steps too
    assert any(s % 4 != 1 for s in every_untouched), every_untouched


@pytest.mark.parametrize("every", [1, 4, 16])
def test_walk_catches_overlapping_memory_with_sampled_verification(every):
    plan = make_plan("tests.hostile_targets:toy_overlap", "mechanism", machine=TOY)
    res = W.walk(plan, max_steps=2_000, seed=0, run_length=25, integrity_sample=1, verify_every=every)
    assert [(f.violation.invariant, f.violation.cause) for f in res.failures] == [("T3", "data")]


def test_walk_states_its_sample():
    note = W.sample_note()
    assert f"1 step in {W.WALK_VERIFY_EVERY}" in note and f"1 new region in {W.WALK_INTEGRITY_SAMPLE}" in note
    assert "end of each run" in note and "after every step" in note


# --------------------------------------------------------------------------
# Re-evaluate invariants on change (Run.check_after)
# --------------------------------------------------------------------------

from dataclasses import replace  # noqa: E402

from memspec.invariants import harness as H  # noqa: E402
from memspec.spec.core import _nothing  # noqa: E402

LEVELS = ("mechanism", "system")


@pytest.mark.parametrize("level", LEVELS)
def test_a_step_whose_branch_changes_nothing_leaves_the_state_and_every_verdict_as_they_were(monkeypatch, level):
    """The skip is sound: on every step where the engine did not evaluate
    the invariants, the spec state is unchanged (its repr) and a full
    evaluation finds every invariant holding, as the engine assumed."""
    plan = make_plan("reference", level)
    skipped = {"n": 0, "ran": 0}
    orig_apply = H.Run.apply

    def apply(self, action, args, choices=None):
        before = repr(self.state)
        held = self._invariants_held
        ts = orig_apply(self, action, args, choices)
        skipped["ran"] += 1
        if held and not self._state_changed:
            skipped["n"] += 1
            assert repr(self.state) == before, f"{action.name} changed the state on a no-op branch"
            assert self.machine.check_invariants(self.state) == []
        return ts

    monkeypatch.setattr(H.Run, "apply", apply)
    res = W.walk(plan, max_steps=1_500, seed=5, run_length=50)
    assert not res.failures and not res.errors, ([f.violation for f in res.failures], res.errors)
    assert skipped["ran"] == res.steps and skipped["n"] > res.steps // 10   # the skip is taken, and often


def _plant(state):
    """Break S1 on the spec state (both levels count misreleases in one field)."""
    if hasattr(state, "misreleased"):
        state.misreleased += 1
    else:
        state.foreign_frees += 1


def _planting(action):
    """``action`` whose every branch also breaks S1 when the spec follows it."""
    def step(state, **args):
        outs = action.step(state, **args)

        def wrap(then):
            def planted(v):
                r = then(v)
                _plant(state)
                return r
            return planted

        return replace(outs, branches=tuple(replace(b, then=wrap(b.then)) for b in outs.branches))

    return replace(action, step=step)


@pytest.mark.parametrize("level", LEVELS)
def test_a_violation_planted_through_each_action_is_caught_at_its_step(level):
    """For every action of the level: a walk whose only change is that this
    action's branches also break S1 fails on S1 at the first step that runs
    the action -- the step a full evaluation after every step would fail at."""
    plan = make_plan("reference", level)
    actions = list(plan.actions)
    caught = []
    for i, a in enumerate(actions):
        plan.actions = actions[:i] + [_planting(a)] + actions[i + 1:]
        guard = H.CallGuard(plan.timeout, plan.guard_mode)
        for seed in range(12):
            v, _choices = W.walk_once(plan, W.run_seed(seed, i), 60, guard)
            ran = [k for k, ts in enumerate(v.trace if v is not None else []) if ts.action == a.name]
            if v is None:
                continue   # the walk never drew the action: another seed
            assert (v.invariant, v.cause) == ("S1", "invariant"), (a.name, v)
            assert ran and v.step == ran[0] + 1 == len(v.trace), (a.name, v.step, ran)
            caught.append(a.name)
            break
    plan.actions = actions
    assert len(caught) >= len(actions) - 2, sorted(set(x.name for x in actions) - set(caught))


def test_fuzz_walk_states_its_sample_in_the_json_report(tmp_path):
    import json

    from memspec.commands import fuzz

    out = tmp_path / "fuzz.json"
    rc = fuzz.main(["reference", "--mode", "walk", "--minutes", "0.03", "--jobs", "1", "--level", "mechanism",
                    "--db", str(tmp_path / "db"), "--out", str(tmp_path / "repro"), "--quiet", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["steps"] > 0, doc
    assert doc["sample"] == W.sample_note()


# --------------------------------------------------------------------------
# The walk's chooser draws what RandomChooser draws (replays stay valid)
# --------------------------------------------------------------------------

import random  # noqa: E402


def test_walk_chooser_draws_and_records_exactly_what_random_chooser_does():
    a, b = H.RandomChooser(random.Random(7), []), W.WalkChooser(random.Random(7), [])
    got_a, got_b = [], []
    for i in range(4000):
        lo = i % 5 - 2
        hi = lo + (i * 7919) % (1 << (i % 40))   # widths 1 .. 2**39, hi == lo included
        got_a.append((a.integer(lo, hi), a.boolean(), a.weighted((1, 3, i % 4 + 1)), a.choice("xyz")))
        got_b.append((b.integer(lo, hi), b.boolean(), b.weighted((1, 3, i % 4 + 1)), b.choice("xyz")))
    assert got_a == got_b and a.record == b.record
    assert len(set(x[0] for x in got_a)) > 1000     # not a degenerate stream


@pytest.mark.parametrize("level", LEVELS)
def test_a_walk_run_is_the_engines_run_step_for_step(level):
    """The walk's runs (``walk_once``) take the same steps, with the same
    choices, as the engine's Run driven by RandomChooser: a walk's recorded
    choices replay in Hypothesis unchanged."""
    plan = make_plan("reference", level)
    guard = H.CallGuard(plan.timeout, "direct")
    for seed in range(3):
        rng = random.Random(W.run_seed(seed, 0))
        record: list = []
        chooser = H.RandomChooser(rng, record)
        run = H.Run(plan, guard, chooser)
        trace = []
        try:
            for _ in range(60):
                record.append(False)
                ts = run.step(chooser)
                trace.append((ts.action, repr(ts.args), ts.outcome, ts.bound))
            record.append(True)
            run.teardown()
        finally:
            run.close()
        v, choices = W.walk_once(plan, W.run_seed(seed, 0), 60, guard)
        assert v is None and choices == record
        assert len(set(a for a, *_ in trace)) > 5


# --------------------------------------------------------------------------
# The spec's kernels: the plain-int fast path answers as the general path
# --------------------------------------------------------------------------

def test_kernels_fast_path_answers_as_before_and_still_builds_z3_terms():
    from memspec.spec import kernels as K

    vals = (True, False, 0, 1, -3, 7)
    for x in vals:
        for y in vals:
            assert K.both(x, y) == (bool(x) and bool(y)) and type(K.both(x, y)) is bool
            assert K.either(x, y) == (bool(x) or bool(y)) and type(K.either(x, y)) is bool
            for z in vals:
                assert K.ite(x, y, z) is (y if x else z)
    assert K.ledger_ok(K.Ledger(10, 4, 3, 3)) is True and K.ledger_ok(K.Ledger(10, 4, 3, 2)) is False
    assert K.ledger_ok(K.Ledger(10, 11, 0, -1)) is False
    z3 = pytest.importorskip("z3")
    a, b = z3.Ints("a b")
    assert z3.is_expr(K.both(a > 0, True)) and z3.is_expr(K.ite(a > b, a, 1)) and z3.is_expr(K.floordiv(a, 4))
    s = z3.Solver()
    s.add(K.ite(a > b, a, b) < a)
    assert s.check() == z3.unsat


# --------------------------------------------------------------------------
# The reference EP's read fast path answers as its checked path
# --------------------------------------------------------------------------

def test_reference_ep_read_fast_path_keeps_every_answer_and_refusal():
    from memspec.reference import targets
    from memspec.spec.api import AllocationRequest
    from memspec.spec.errors import DeviceFault, InvalidRequest

    inst = targets.reference()
    ep, sim = inst.ep, inst.ep.sim
    page = sim.page_size
    a = inst.mechanism.allocator().allocate(AllocationRequest(3 * page))
    s = ep.new_stream()
    ep.write(s, a.address + page - 8, b"y" * 16)
    ep.synchronize(s)
    done = sim.items_executed
    assert ep.read(s, a.address + page - 8, 16) == b"y" * 16      # across a page boundary (the checked path)
    assert ep.read(s, a.address + page - 4, 4) == b"y" * 4         # one page (the fast path)
    assert ep.read(s, a.address, 4) == bytes(4)                    # a page never written reads zeros
    assert sim.items_executed == done + 3                          # each read is one executed copy
    for bad in [(True, a.address, 4), (999, a.address, 4), (s, a.address, True), (s, a.address, 0),
                (s, float(a.address), 4)]:
        with pytest.raises(InvalidRequest):
            ep.read(*bad)
    with pytest.raises(DeviceFault):
        ep.read(s, 0x10, 4)                                        # unmapped: a fault, as before
    ep.write(s, a.address, b"z" * 4)                               # queued work: the read waits for it
    assert ep.read(s, a.address, 4) == b"zzzz"
    ep.close()
    with pytest.raises(InvalidRequest):
        ep.read(s, a.address, 4)                                   # a closed EP refuses
