"""The CACHING spec against the reference caching targets and every C1..C9 mutant.

A small random-walk driver over the spec's action table (the conformance
harness does the same with Hypothesis): draw an available action, run it on
spec and implementation, follow the matching branch, then check the
invariants and the observations.  The first failure's invariant is the blame.
"""

from __future__ import annotations

import random

import pytest

from memspec.invariants.mutants.caching import MUTANTS
from memspec.reference import caching_targets as targets
from memspec.spec.caching import CACHING

STEPS = 60


class _Chooser:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, options):
        return options[self.rng.randrange(len(options))]

    def boolean(self) -> bool:
        return self.rng.random() < 0.5


class _SUT:
    def __init__(self, instance) -> None:
        self.allocator = instance.allocator
        self.refs: dict[int, object] = {}

    def ref(self, ref_id: int) -> object:
        return self.refs[ref_id]


def walk(factory, seed: int, steps: int = STEPS, **config):
    """``None`` if the run conforms, else ``(invariant, how, reason, step)``.
    ``config``: extra ``CACHING.init`` arguments matching the target's allocator."""
    inst = factory()
    init = {"policy": inst.extras["policy"], "capacity": inst.capacity, "expandable": inst.extras["expandable"]}
    st = CACHING.init(**init, **config)
    sut = _SUT(inst)
    ch = _Chooser(random.Random(seed))
    for n in range(steps):
        avail = [a for a in CACHING.actions if a.available(st)]
        act = ch.choice([a for a in avail for _ in range(a.weight)])
        args = act.draw_args(st, ch)
        outs = act.step(st, **args)
        try:
            value, err = act.perform(sut, **args), None
        except Exception as e:  # noqa: BLE001 - the branch decides
            value, err = None, e
        branch = outs.match(value, err)
        if branch is None:
            return outs.blame, "outcome", f"{act.name}({args}) -> {value!r} / {err!r}; expected {outs.describe()}", n
        ref = branch.then(value if err is None else err)
        if err is None and isinstance(ref, int) and not isinstance(ref, bool):
            sut.refs[ref] = value
        bad = CACHING.check_invariants(st)
        if bad:
            return bad[0][0], "invariant", bad[0][1], n
        for obs in CACHING.observations:
            for r in obs.refs(st, ()):   # the figures that apply in this state (as the engine reads them)
                want, got = obs.expected(st, r), obs.observed(sut, r)
                if want != got:
                    return obs.blame, "observation", f"{obs.name}: implementation {got!r:.200} spec {want!r:.200}", n
    return None


TARGETS = {
    "pytorch": targets.pytorch_preset,
    "seed": targets.seed_preset,
    "pytorch-expandable": targets.pytorch_expandable,
    "seed-expandable": targets.seed_expandable,
}


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_reference_conforms(name):
    for seed in range(25):
        assert walk(TARGETS[name], seed) is None, f"seed {seed}"


MiB = 1 << 20
#: PyTorch's optional settings: allocator keyword arguments == CACHING.init arguments
CONFIGS = {
    "max_split_size": {"max_split_size": 24 * MiB},
    "roundup_power2_divisions": {"roundup_power2_divisions": 4},
    "gc_threshold": {"memory_fraction": 0.75, "garbage_collection_threshold": 0.5},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("expandable", [False, True])
def test_reference_conforms_with_settings(name, expandable):
    cfg = CONFIGS[name]
    if expandable and "garbage_collection_threshold" in cfg:
        cfg = {"memory_fraction": 0.8}
    for seed in range(12):
        got = walk(lambda: targets.make_target("pytorch", capacity=96 * MiB, expandable=expandable, **cfg), seed, **cfg)
        assert got is None, f"seed {seed}: {got}"


def test_the_walk_exercises_every_branch_kind():
    """The driver reaches OOMs, pending frees, splits and releases (so the passes above mean something)."""
    from collections import Counter

    seen: Counter = Counter()
    for seed in range(10):
        inst = targets.pytorch_preset()
        st = CACHING.init(policy="pytorch", capacity=inst.capacity, expandable=False)
        sut = _SUT(inst)
        ch = _Chooser(random.Random(seed))
        for _ in range(STEPS):
            act = ch.choice([a for a in CACHING.actions if a.available(st) for _ in range(a.weight)])
            args = act.draw_args(st, ch)
            outs = act.step(st, **args)
            try:
                value, err = act.perform(sut, **args), None
            except Exception as e:  # noqa: BLE001
                value, err = None, e
            branch = outs.match(value, err)
            seen[(act.name, type(err).__name__ if err else "ok")] += 1
            if act.name == "empty_cache" and value:
                seen["released"] += 1
            ref = branch.then(value if err is None else err)
            if err is None and isinstance(ref, int):
                sut.refs[ref] = value
            seen["pending"] += sum(b.state == "pending" for s in st.segments for b in s.blocks)
    assert seen[("malloc", "OutOfMemory")] > 0 and seen[("malloc", "ok")] > 100
    assert seen[("double_free", "DoubleFree")] > 0 and seen["released"] > 0 and seen["pending"] > 0


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_every_mutant_is_caught_by_its_invariant(mutant):
    for seed in range(60):
        got = walk(mutant.factory, seed)
        if got is not None:
            inv, how, reason, step = got
            assert inv == mutant.invariant, f"{mutant.name}: blamed {inv} ({how}: {reason}) at step {step}"
            return
    pytest.fail(f"{mutant.name} survived 60 walks of {STEPS} steps")
