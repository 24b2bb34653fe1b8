"""What one run is asked and what it counted: the :class:`Plan` of a
target at one level (the machine, the actions and observations that apply,
the invariants that do not, the guidance and the masks of a later pass) and
its :class:`Stats`.  Built by :mod:`~memspec.invariants.planning`, run by
:class:`~memspec.invariants.engine.Run` (which re-exports both)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from memspec.spec import api


@dataclass
class Stats:
    examples: int = 0
    steps: int = 0
    seconds: float = 0.0
    actions: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    #: action name -> steps where the spec offered a returning (accepting) branch
    offered: Counter = field(default_factory=Counter)
    #: action name -> steps that took an accepting branch (a return; for a
    #: ``misuse`` action, its refusal)
    accepted: Counter = field(default_factory=Counter)
    #: "action.param=value" -> steps whose argument was one of the spec's
    #: boundary values (``Domain.boundaries``)
    boundaries: Counter = field(default_factory=Counter)
    #: invariant id -> total steps run (all examples) when it first failed
    first_failure_steps: dict = field(default_factory=dict)
    failures_seen: int = 0

    def rate(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Plan:
    """A target at one level, with the machine, its init arguments, the
    actions/observations that apply, and the invariants that do not (N/A)."""

    target: str
    level: str
    factory: Callable[..., api.TargetInstance]
    machine: Any
    init_kwargs: dict
    actions: list
    observations: list
    capabilities: dict
    na: dict  # invariant id -> reason
    make_sut: Callable[[Any, api.TargetInstance], Any]
    factory_kwargs: dict = field(default_factory=dict)
    timeout: float = 5.0
    guard_mode: str = "auto"
    integrity: bool = True
    #: pattern one new region in ``integrity_sample`` (chosen by its ref id,
    #: so a replay patterns a superset); 1 = every region
    integrity_sample: int = 1
    #: re-verify ``VERIFY_PER_STEP`` regions round robin on one step in this
    #: many (1 = every step); every region is verified at the end of a run
    integrity_verify_every: int = 1
    stats: Stats = field(default_factory=Stats)
    on_step: Callable[["Plan"], None] | None = None
    #: called with (run, trace step) before each action's call on the target,
    #: and with (run, None) when an example starts (a supervised child
    #: reports its trace through it)
    on_call: Callable[[Any, Any], None] | None = None   # (engine.Run, engine.TraceStep or None)
    #: the machine's start checks that apply (capability answers)
    start_checks: list = field(default_factory=list)
    #: seconds the factory may take (``None``: the larger of ``timeout`` and ``BUILD_SECONDS``)
    build_timeout: float | None = None
    mutant: Any = None
    machine_ref: str | None = None  # "module:attr" of a machine other than the level's
    #: swarm testing: each example draws which actions it uses and how often
    swarm: bool = True
    #: guidance: redraw arguments the spec can only refuse (see ``draws.Draws._draw_args``)
    guide: bool = True
    #: some actions are left out (a later pass of ``run_hypothesis``): a
    #: state where none of the rest is available ends nothing, the step is skipped
    partial: bool = False
    #: ``((name, action names), ...)``: the spec's protocols over one kind of
    #: object (``planning.protocol_groups``), which an example's swarm may favour
    protocols: tuple = ()
    #: per-example device capacity: a run given a chooser draws one of these
    #: (index 0, the small device, is what shrinking moves towards), so one
    #: run reaches both the out-of-memory paths of a small device and the
    #: protocols a small device refuses before they get deep (empty: the
    #: factory's ``capacity`` for every example)
    capacities: tuple = ()
    #: ``{protocol name: planning.Template}``: the protocols an example may
    #: play as a macro-step (a short script of the protocol's actions, see
    #: ``draws.Draws._draw_script``)
    templates: dict = field(default_factory=dict)
    #: names of the actions whose spec declares a failure path the arguments
    #: select (an injected fault, see :func:`~memspec.invariants.draws.failure_path`; learned by
    #: ``planning.learn_protocols``): each example's guidance keeps
    #: :data:`~memspec.invariants.draws.FAULT_QUOTA` such draws of each (see ``draws.Draws._draw_args``)
    faults: frozenset = frozenset()
    #: checks a later pass masks (see :func:`mask_key`): a failure found
    #: earlier in the run, whose branch the spec now follows anyway, so that
    #: the run goes on checking everything else (a failure masks, it does
    #: not blind: every action stays in the table)
    masks: frozenset = frozenset()
    #: the reproduction files written for this plan's failures (none overwrites another)
    repro_paths: set = field(default_factory=set, repr=False, compare=False)

    @property
    def invariant_ids(self) -> list[str]:
        return [inv.id for inv in self.machine.invariants]

    @property
    def declares(self) -> dict[str, list[str]]:
        """``{invariant id: [names of the machine's actions that declare it]}``
        (every action of the machine, drawn or not: a declaring action that a
        missing capability removed is the reason an invariant is untested)."""
        return {inv.id: [a.name for a in self.machine.actions if inv.id in getattr(a, "invariants", ())]
                for inv in self.machine.invariants}

    @property
    def witnesses(self) -> dict[str, list]:
        """``{invariant id: [[action, outcome, describe], ...]}``: the outcomes
        a PASS of the invariant needs (``Invariant.witnesses``) whose action
        is in the machine."""
        names = {a.name for a in self.machine.actions}
        return {inv.id: [[w.action, w.outcome, w.describe] for w in inv.witnesses if w.action in names]
                for inv in self.machine.invariants if getattr(inv, "witnesses", ())}

    @property
    def action_names(self) -> list[str]:
        return [a.name for a in self.actions]

    @property
    def undrawn(self) -> dict[str, list[str]]:
        """``{action name: [capabilities it needs that the target lacks]}``
        for the machine's actions this plan does not draw."""
        drawn = set(self.action_names)
        return {a.name: [r for r in getattr(a, "requires", ()) if not self.capabilities.get(r)]
                for a in self.machine.actions if a.name not in drawn}

    @property
    def absent(self) -> list[str]:
        """The invariants with no action declaring them and no observation
        or start check blamed on them at this level (sorted): their cells
        read "\u2014" (not part of this level), never PASS."""
        declares = self.declares
        observed = {o.blame for o in self.observations or ()} | {o.blame for o in self.start_checks or ()}
        observed |= {o.blame for o in getattr(self.machine, "observations", ()) or ()}
        return sorted(inv for inv in self.invariant_ids if not declares.get(inv) and inv not in observed)

    @property
    def env(self) -> dict:
        """The environment the target needs at process start (``factory.memspec_env``)."""
        return dict(getattr(self.factory, "memspec_env", None) or {})

    def titles(self) -> dict[str, str]:
        return {inv.id: inv.title for inv in self.machine.invariants}

    def presupposed(self) -> dict[str, frozenset]:
        """``{invariant id: the rules its check takes for granted}``
        (:attr:`~memspec.spec.core.Invariant.presupposes`; only those that
        declare some)."""
        got = self.__dict__.get("_presupposed")
        if got is None:
            got = self.__dict__["_presupposed"] = {
                inv.id: frozenset(inv.presupposes) for inv in self.machine.invariants
                if getattr(inv, "presupposes", ())}
        return got
