"""Running the spec on its own: no implementation, only witnesses.

Every step draws an available action (its ``enabled`` holds, its argument
domains are non-empty, the capabilities it ``requires`` are present), asks
it for the set of permitted outcomes, picks one branch a conforming
implementation could take (a ``Returns`` with a ``witness``, or any
``Raises``), follows it, and checks every invariant.  If a spec transition
ever broke an invariant, this is where it shows.

Two drivers share :func:`spec_step` (its halves, :func:`draw_branch` and
:func:`follow`, and :func:`pick_action` are also the steps of the formal
side's walks: proof coverage and encoding agreement):

* :func:`state_machine` -- a Hypothesis ``RuleBasedStateMachine`` whose rules
  are generated from the machine's action table (one rule per action,
  repeated ``weight`` times), choosing through Hypothesis's choice sequence
  (:class:`~memspec.spec.core.HypothesisChooser`: shrinking);
* :func:`random_walk` -- a plain seeded random walk
  (:class:`~memspec.spec.core.RandomChooser`: fast, no shrinking).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from memspec.spec.core import Action, HypothesisChooser, Machine, RandomChooser, Raises, Returns


def usable(action: Action[Any], state: Any) -> bool:
    """The action may be drawn now: its capabilities are present, it is enabled, its domains non-empty."""
    return all(state.has(c) for c in action.requires) and action.available(state)


def takeable(branch: Any) -> bool:
    return isinstance(branch, Raises) or (isinstance(branch, Returns) and branch.witness is not None)


def make_error(cls: type) -> BaseException:
    try:
        return cls("spec-only run")
    except TypeError:  # pragma: no cover - every contract error takes a message
        return cls()


@dataclass
class Step:
    action: str
    args: dict[str, Any]
    branch: str
    broken: list[tuple[str, str]] = field(default_factory=list)


def pick_action(options: Sequence[Action[Any]], rng: random.Random) -> Action[Any]:
    """One of ``options`` (actions :func:`usable` now), drawn by weight: each counts ``max(1, weight)``
    times, one ``rng.randrange`` over the total."""
    k = rng.randrange(sum(max(1, a.weight) for a in options))
    for a in options:
        k -= max(1, a.weight)
        if k < 0:
            return a
    return options[-1]  # pragma: no cover - k < total


def draw_branch(action: Action[Any], state: Any, chooser: Any) -> tuple[dict[str, Any], Any, Any]:
    """The first half of a step: ``action``'s arguments drawn, its permitted outcomes at ``state``, and
    one :func:`takeable` branch picked (``None`` when there is none).  Nothing is applied yet (a caller
    may look at the state before the branch); :func:`follow` applies it."""
    args = action.draw_args(state, chooser)
    outs = action.step(state, **args)
    branches = [b for b in outs.branches if takeable(b)]
    if not branches:
        return args, outs, None
    return args, outs, branches[chooser.integer(0, len(branches) - 1)] if len(branches) > 1 else branches[0]


def follow(branch: Any, where: Callable[[], str] | None = None) -> Any:
    """The second half of a step: ``branch`` applied, spec-only (a ``Returns`` with its witness value,
    a ``Raises`` with its error); the value returned (``None`` for an error).  ``where`` (naming the
    step: its action and arguments): the witness is first checked against its own branch (AssertionError)."""
    if isinstance(branch, Returns):
        value = branch.witness()
        if where is not None and not branch.matches(value):
            raise AssertionError(f"{where()}: the witness {value!r} is not accepted by its own branch")
        branch.then(value)
        return value
    branch.then(make_error(branch.error))
    return None


def spec_step(machine: Machine[Any], state: Any, action: Action[Any], chooser: Any) -> Step:
    """One step of the spec alone (:func:`draw_branch`, then :func:`follow`); returns what happened
    (``broken``: failing invariants)."""
    args, outs, b = draw_branch(action, state, chooser)
    if b is None:
        raise AssertionError(f"{action.name}({args}): no branch can be taken (outcomes: {outs.describe()})")
    follow(b, where=lambda: f"{action.name}({args})")
    label = "returns " + b.describe if isinstance(b, Returns) else "raises " + b.error.__name__
    return Step(action.name, args, label, machine.check_invariants(state))


def random_walk(machine: Machine[Any], init: dict[str, Any], *, steps: int, seed: int = 0,
                full_every: int = 0) -> list[Step]:
    """A seeded random walk of ``steps`` steps; raises AssertionError on the first broken invariant."""
    rng = random.Random(seed)
    chooser = RandomChooser(rng)
    state = machine.init(**init)
    trace: list[Step] = []
    for i in range(steps):
        act = pick_action([a for a in machine.actions if usable(a, state)], rng)
        st = spec_step(machine, state, act, chooser)
        trace.append(st)
        broken = st.broken or (machine.check_invariants(state, full=True) if full_every and i % full_every == 0 else [])
        if broken:
            raise AssertionError(f"step {i} {st.action}({st.args}) -> {st.branch}: broke {broken}")
    return trace


#: capability configurations the spec-only run covers
CONFIGS = [(True, True), (True, False), (False, True), (False, False)]


def state_machine(machine: Machine[Any], *, capacity: int = 64 * 4096, page: int = 4096,
                  configs: Sequence[tuple[bool, bool]] = tuple(CONFIGS), stats: dict[str, int] | None = None) -> type:
    """A Hypothesis ``RuleBasedStateMachine`` for ``machine`` run alone.

    Its rules are generated from the action table; the initial capability
    configuration is drawn from ``configs``; every invariant is checked after
    each step, and the full (scanning) checks at teardown.  ``stats`` (if
    given) counts ``examples`` and ``steps``.
    """
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

    counters = stats if stats is not None else {}
    counters.setdefault("examples", 0)
    counters.setdefault("steps", 0)

    def make_rule(act: Action[Any]) -> Callable[..., None]:
        @precondition(lambda self: self.state is not None and usable(act, self.state))
        @rule(data=st.data())
        def run(self: Any, data: Any) -> None:
            step = spec_step(machine, self.state, act, HypothesisChooser(data))
            counters["steps"] += 1
            assert not step.broken, f"{act.name}({step.args}) -> {step.branch}: broke {step.broken}"

        run.__name__ = f"do_{act.name}"
        return run

    ns: dict[str, Any] = {"state": None}

    @initialize(config=st.sampled_from(list(configs)))
    def setup(self: Any, config: tuple[bool, bool]) -> None:
        vb, sm = config
        self.state = machine.init(capacity=capacity, page=page, virtual_backing=vb, shared_mapping=sm, ep=True)
        counters["examples"] += 1

    @invariant()
    def holds(self: Any) -> None:
        if self.state is not None:
            broken = machine.check_invariants(self.state)
            assert not broken, f"broken: {broken}"

    def teardown(self: Any) -> None:
        if self.state is not None:
            broken = machine.check_invariants(self.state, full=True)
            assert not broken, f"broken (full check): {broken}"

    ns.update(setup=setup, holds=holds, teardown=teardown)
    for act in machine.actions:
        for k in range(max(1, act.weight)):
            ns[f"do_{act.name}_{k}"] = make_rule(act)
    return type(f"{machine.name.title()}SpecMachine", (RuleBasedStateMachine,), ns)


def run(machine: Machine[Any], *, examples: int, steps: int, seed: int | None = None,
        stats: dict[str, int] | None = None, shrink: bool = True, base: Any = None) -> dict[str, int]:
    """Run the spec's stateful test; raises on the first broken invariant (shrunk unless ``shrink=False``).

    ``base``: the Hypothesis ``settings`` to build on (``memspec spec-check``
    passes its ``ci`` profile); default: the settings currently loaded.  The
    spec does not know the CLI's profiles."""
    from hypothesis import Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    stats = stats if stats is not None else {}
    cls = state_machine(machine, stats=stats)
    if seed is not None:
        random.seed(seed)
        # Hypothesis draws an unseeded run's seed from its own generator, not
        # from ``random``: without this a ``seed`` would not reproduce the walks
        cls._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    from hypothesis import HealthCheck

    # No deadline and no "too slow" health check: whether the walk runs (and
    # so the verdict) must not depend on how loaded the machine is.
    cfg = settings(base if base is not None else settings(), max_examples=examples, stateful_step_count=steps,
                   derandomize=seed is None, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                          HealthCheck.data_too_large],
                   phases=list(Phase) if shrink else [Phase.explicit, Phase.reuse, Phase.generate])
    run_state_machine_as_test(cls, settings=cfg)
    return stats


# --------------------------------------------------------------------------
# Driving single steps by hand (unit tests, planted-bug tests, the harness)
# --------------------------------------------------------------------------

_NOTHING = object()


def drive(machine: Machine[Any], state: Any, name: str, *, error: type | None = None, value: Any = _NOTHING,
          **args: Any) -> Any:
    """Run action ``name`` with ``args`` and follow one branch: the one
    raising ``error`` if given; else the one accepting ``value`` if given;
    else the first ``Returns`` with a witness (its witness as the value).
    Returns what the branch's ``then`` returned (a new reference id, if it
    made an object).  AssertionError if no branch fits."""
    outs = machine.action(name).step(state, **args)
    if error is not None:
        for b in outs.branches:
            if isinstance(b, Raises) and issubclass(error, b.error):
                return b.then(make_error(error))
        raise AssertionError(f"{name}({args}): {error.__name__} is not permitted: {outs.describe()}")
    if value is not _NOTHING:
        b = outs.match(value)
        if not isinstance(b, Returns):
            raise AssertionError(f"{name}({args}): {value!r} is not permitted: {outs.describe()}")
        return b.then(value)
    for b in outs.branches:
        if isinstance(b, Returns) and b.witness is not None:
            v = b.witness()
            assert b.matches(v), f"{name}: witness {v!r} rejected by its own branch"
            return b.then(v)
    raise AssertionError(f"{name}({args}): no branch with a witness: {outs.describe()}")


def force(machine: Machine[Any], state: Any, name: str, value: Any, **args: Any) -> Any:
    """Follow the first ``Returns`` branch of ``name`` with ``value`` *without*
    asking its guard (``accepts``): what a spec with that guard removed would
    do.  For planted-bug tests."""
    outs = machine.action(name).step(state, **args)
    for b in outs.branches:
        if isinstance(b, Returns):
            return b.then(value)
    raise AssertionError(f"{name}({args}) has no Returns branch: {outs.describe()}")


def permits(machine: Machine[Any], state: Any, name: str, *, error: type | None = None, value: Any = _NOTHING,
            **args: Any) -> bool:
    """Does the spec permit this answer (without following it)?"""
    outs = machine.action(name).step(state, **args)
    if error is not None:
        return outs.match(None, make_error(error)) is not None
    return isinstance(outs.match(value), Returns)
