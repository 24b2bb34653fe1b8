"""The conformance engine: drive a spec :class:`~memspec.spec.core.Machine`
and an implementation side by side, one action at a time.

Generic over the machine: nothing here knows an action, a state field or an
invariant by name.  Each step

1. draws an *available* action from the machine's action table (by weight)
   and its arguments through a :class:`~memspec.spec.core.Chooser`;
2. asks the spec for the set of permitted outcomes (``action.step``);
3. performs the same call on the implementation through the
   :class:`~memspec.invariants.guard.CallGuard` (anything it raises is an
   answer to judge; a hang or a crash is the supervisor's to report);
4. finds the branch the implementation took (``Outcomes.match``), or fails
   blamed on ``Outcomes.blame`` naming the cause (wrong outcome, unexpected
   exception type, wrong return type, hang);
5. lets the spec follow that branch (``branch.then``) and binds the returned
   implementation object(s) (``Machine.unwrap``) to the reference id(s)
   ``then`` returned;
6. checks every invariant (``Machine.step_checks``), the observations of the
   refs the step touched plus the global ones, and the data written into
   the regions the machine describes (``Machine.regions``).

A failure raises a :class:`Violation` (an ``AssertionError``) whose class is
specific to the invariant blamed, so Hypothesis shrinks each invariant's
counterexample separately and the report attributes it to that invariant.

Seed 000 is the yardstick: *"unsupported must not masquerade as a successful
no-op"* -- so the harness never trusts what the implementation says about
itself: it compares with the spec and reads the bytes back.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from memspec.invariants.choosers import PackedChooser, RecordingChooser
from memspec.invariants.errors import TARGET_ERROR, HangResult, SpecError, TargetError, Violation, violation_class
from memspec.invariants.guard import BUILD_SECONDS, CallGuard
from memspec.invariants.integrity import make_integrity
from memspec.invariants import text as T
from memspec.spec import api
from memspec.spec.core import Raises
from memspec.spec.core import _nothing as _SPEC_NO_OP
from memspec.spec.errors import MemspecError


# --------------------------------------------------------------------------
# Plan: everything fixed for one (target, level)
# --------------------------------------------------------------------------

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
    on_call: Callable[["Run", "TraceStep | None"], None] | None = None
    #: the machine's start checks that apply (capability answers)
    start_checks: list = field(default_factory=list)
    #: seconds the factory may take (``None``: the larger of ``timeout`` and ``BUILD_SECONDS``)
    build_timeout: float | None = None
    mutant: Any = None
    machine_ref: str | None = None  # "module:attr" of a machine other than the level's
    #: swarm testing: each example draws which actions it uses and how often
    swarm: bool = True
    #: guidance: redraw arguments the spec can only refuse (see ``Run._draw_args``)
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
    #: ``Run._draw_script``)
    templates: dict = field(default_factory=dict)
    #: names of the actions whose spec declares a failure path the arguments
    #: select (an injected fault, see :func:`failure_path`; learned by
    #: ``planning.learn_protocols``): each example's guidance keeps
    #: :data:`FAULT_QUOTA` such draws of each (see ``Run._draw_args``)
    faults: frozenset = frozenset()
    #: checks a later pass masks (see :func:`mask_key`): a failure found
    #: earlier in the run, whose branch the spec now follows anyway, so that
    #: the run goes on checking everything else (a failure masks, it does
    #: not blind: every action stays in the table)
    masks: frozenset = frozenset()

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

    def new_run(self, guard: CallGuard | None = None) -> "Run":
        return Run(self, guard)


_KIND_NUMBER = re.compile(r"0x[0-9a-fA-F]+|\d+")
_KINDS: dict = {}


def _kind_of_outcome(outcome: str) -> str:
    """An outcome's kind: its text with every number written ``N``, so
    coverage counts branches, not the figures a branch was described with
    (``returns an allocation of N bytes, footprint [N, N] ...``)."""
    k = _KINDS.get(outcome)
    if k is None:
        k = _KIND_NUMBER.sub("N", outcome)
        if len(_KINDS) < 10_000:
            _KINDS[outcome] = k
    return k


def _describe_value(v: Any, limit: int = 160) -> str:
    if isinstance(v, api.DeviceAllocation):   # addresses in hex, the figures a reader compares first
        try:
            blk = f", block={v.block:#x}" if type(v.block) is int else ""
            r = (f"DeviceAllocation(address={v.address:#x}, size={v.size}, footprint={v.footprint}{blk}, "
                 f"identity={v.identity!r})")
        except Exception:  # noqa: BLE001 - fields of the wrong type: the plain repr below
            r = None
        if r is not None:
            return r if len(r) <= limit else r[: limit - 3] + "..."
    try:
        r = repr(v)
    except Exception:  # noqa: BLE001 - a hostile __repr__
        r = f"<{type(v).__name__} with a failing repr>"
    return r if len(r) <= limit else r[: limit - 3] + "..."


@dataclass
class TraceStep:
    """One executed step: the action, its arguments (and the primitive
    choices that drew them), what happened, and the ids bound."""

    action: str
    args: dict
    choices: list
    outcome: str
    bound: tuple = ()
    #: the references it bound and named (the guidance's, see ``Run._recent_refs``)
    refs: tuple | None = field(default=None, repr=False, compare=False)


# --------------------------------------------------------------------------
# Run: one example (a fresh target, a fresh spec state)
# --------------------------------------------------------------------------

class Run:
    """One execution from the initial state: a fresh target instance and spec state."""

    def __init__(self, plan: Plan, guard: CallGuard | None = None, chooser: Any = None,
                 capacity: int | None = None) -> None:
        self.plan = plan
        self.machine = plan.machine
        self.guard = guard or CallGuard(plan.timeout, plan.guard_mode)
        self.trace: list[TraceStep] = []
        self.instance: api.TargetInstance | None = None
        self.foreign: api.TargetInstance | None = None
        self.closed = False
        self.failed = False
        self.nsteps = 0
        self._action = None
        #: (action, args, Outcomes or None) the guidance computed for the step being drawn
        self._outs: tuple | None = None
        self._obs_cache: dict | None = None
        self._checks: list | None = None
        #: every invariant held on the state as it is now (re-evaluate on change)
        self._invariants_held = False
        #: the last step's branch may have changed the spec state
        self._state_changed = True
        #: the packed draws of the chooser the steps are drawn from (see :meth:`step`)
        self._packed: PackedChooser | None = None
        self._swarm: tuple | None = None   # (actions, weights) of this example (swarm testing)
        #: the protocol this example's swarm favours (``focus_groups``), if any
        self.focus: str | None = None
        self._base: tuple | None = None    # the swarm's (actions, weights) before a focus
        #: the macro-step being played (actions still to draw, first last), see ``_draw_script``
        self._script: list = []
        #: when the focus is next drawn again (a script's end, or :data:`FOCUS_STEPS` later)
        self._refocus_at = FOCUS_STEPS
        #: (action, references named) of the calls this example drew (guidance: fresh calls first)
        self._seen: set = set()
        #: action -> guided draws in this example, and those the spec offered an accepting branch
        self._drawn: Counter = Counter()
        self._offered: Counter = Counter()
        #: action -> failure-path draws kept in this example; (action, failure path) -> the same, per path
        self._faulted: Counter = Counter()
        self._fault_paths: Counter = Counter()
        #: actions a draw of this example showed a failure path (besides ``Plan.faults``)
        self._fault_seen: set = set()
        #: ``[(step, mask key)]``: the masked checks (``Plan.masks``) that would have failed, and where
        self.masked_hits: list = []
        fkw = plan.factory_kwargs
        caps = plan.capacities
        if capacity is None and chooser is not None and len(caps) > 1:
            capacity = caps[chooser.integer(0, len(caps) - 1)]
        if capacity is not None and capacity != fkw.get("capacity"):
            fkw = {**fkw, "capacity": capacity}
        #: the device capacity of this example (a reproduction rebuilds the target with it)
        self.capacity = fkw.get("capacity")
        if plan.on_call is not None:
            plan.on_call(self, None)
        g = self.guard
        g.blame, g.what, g.limit = TARGET_ERROR, f"building the target {plan.target!r}", plan.build_timeout or max(
            g.timeout, BUILD_SECONDS)
        try:
            self.instance, err = g.call(plan.factory, **fkw)
            if err is None:
                g.what = f"wiring the {plan.level} level around the target"
                self.sut, err = g.call(plan.make_sut, self, self.instance)
        finally:
            g.limit = None
        if isinstance(err, (SpecError, Violation)):
            raise err
        if err is not None:
            what = "hangs" if isinstance(err, HangResult) else f"raised {T.exc_text(err)}"
            raise TargetError(f"target {plan.target!r} could not be built: {g.what} {what}") from err
        init = plan.init_kwargs
        if fkw is not plan.factory_kwargs and "capacity" in init:
            init = {**init, "capacity": self.instance.capacity}   # the spec's device is this example's
        try:
            self.state = self.machine.init(**init)
        except Exception as e:  # noqa: BLE001
            raise SpecError(f"{self.machine.name}.init{init} raised {type(e).__name__}: {e}") from e
        self.integrity = make_integrity(self) if plan.integrity else None
        self._checks = _step_checks(self.machine, self.state)
        self.nsteps = 0
        plan.stats.examples += 1
        if plan.start_checks:
            self._action = None
            self.check_observations((), plan.start_checks, "capability")

    # -- failing --------------------------------------------------------
    def _hit(self, hit: tuple) -> None:
        """A masked check that would have failed (``(step, mask key)``)."""
        hits = self.__dict__.setdefault("masked_hits", [])
        hits.append(hit)

    def fail(self, invariant: str, cause: str, reason: str, exc: BaseException | None = None, *,
             check: str | None = None, key: tuple | None = None, also: tuple = ()) -> None:
        """Raise the Violation; ``exc`` (what the target raised, if it
        raised) is chained as its cause, so a reproduction shows the
        target's own traceback.  ``check`` names the clause of the rule
        that broke (``alignment`` of S8), ``key`` its :func:`mask_key`."""
        self.failed = True
        st = self.plan.stats
        st.failures_seen += 1
        st.first_failure_steps.setdefault(invariant, st.steps)
        v = violation_class(invariant + (f".{check}" if check else ""))(invariant, cause, reason, self.trace,
                                                                          self.nsteps)
        v.check = check
        v.key = key
        v.also_keys = also   # the mask keys of the other checks that failed at the same step
        v.masked_hits = list(getattr(self, "masked_hits", ()))
        v.capacity = getattr(self, "capacity", None)
        if isinstance(exc, BaseException) and not isinstance(exc, HangResult):
            raise v from exc
        raise v

    # -- one step -------------------------------------------------------
    def available(self) -> list:
        state = self.state
        try:
            return [a for a in self.plan.actions if a.available(state)]
        except Exception as e:  # noqa: BLE001
            raise SpecError(f"an action's availability check raised {type(e).__name__}: {e}") from e

    def choose(self, chooser: Any) -> tuple[Any, dict, list]:
        """Draw an available action (by weight) and its arguments.

        First up to three draws over the whole table (weights fixed, so the
        draw costs one availability check instead of one per action); if
        all land on unavailable actions, one draw over the available ones."""
        weighted = getattr(chooser, "weighted", None)
        acts = self.plan.actions
        if weighted is not None and len(acts) > 1:
            swarm = self._swarm
            if swarm is None:
                swarm = self._swarm = self._draw_swarm(chooser)
            elif self._base is not None and self.nsteps >= self._refocus_at and not self._script:
                swarm = self._swarm = self._draw_focus(chooser, *self._base)
            script = self._script
            while script:
                a = script.pop()
                try:
                    ok = a.available(self.state)
                except Exception as e:  # noqa: BLE001
                    raise SpecError(f"{a.name}: availability check raised {type(e).__name__}: {e}") from e
                if ok:
                    if not script:
                        self._refocus_at = self.nsteps + 1   # the script ends: the next step draws a new focus
                    return self._draw_args(a, chooser)[:3]
            acts, ws = swarm
            state = self.state
            guided = self.plan.guide
            tries = 0
            for _ in range(3 + (REDRAWS if guided else 0)):
                a = acts[weighted(ws)]
                try:
                    ok = a.available(state)
                except Exception as e:  # noqa: BLE001
                    raise SpecError(f"{a.name}: availability check raised {type(e).__name__}: {e}") from e
                if ok:
                    drawn = self._draw_args(a, chooser)
                    # guidance: an action the spec can only refuse here may
                    # give its step to another (the chooser decides)
                    if not guided or tries == REDRAWS or drawn[3] or not chooser.boolean():
                        return drawn[:3]
                    tries += 1
        avail = self.available()
        if not avail:
            if self.plan.partial:
                raise _Stuck
            raise SpecError(f"{self.machine.name}: no action is available in this state")
        n = len(avail)
        if n == 1:
            a = avail[0]
        else:
            weighted = getattr(chooser, "weighted", None)
            if weighted is not None:
                a = avail[weighted(tuple(x.weight for x in avail))]
            else:
                total = 0
                for x in avail:
                    total += x.weight
                k = chooser.integer(0, total - 1)
                for a in avail:
                    k -= a.weight
                    if k < 0:
                        break
        return self._draw_args(a, chooser)[:3]

    def _draw_swarm(self, chooser: Any) -> tuple:
        """Swarm testing: each example draws, per action, one of *as
        weighted*, *off*, *four times as likely*, *as weighted* (shrinking
        goes to the first: the table's own weights), so that one example
        spends its steps on a few actions and reaches deeper sequences of
        them (Groce et al., *Swarm Testing*, ISSTA 2012).  An action that is
        off is still drawn when nothing else is available.

        Then a *focus* (see :func:`focus_groups`): about half the examples
        pick one protocol of the spec -- the actions of one role, or those
        that declare one invariant -- switch its actions on and weight them
        so that together they take about half the draws: a multi-step
        protocol of a few light actions (a fence ordering over two streams:
        ``new_stream``, ``use``, ``synchronize``, ``poll``; a ticket's
        life: ``issue_ticket``, ``respond``, ``claim``, ``expire``) gets
        the steps to go deep while the other actions still build the state
        it needs.  Shrinking goes to no focus (a draw of 0)."""
        acts = self.plan.actions
        if not self.plan.swarm:
            ws = self.plan.__dict__.get("_weights")
            if ws is None:
                ws = self.plan.__dict__["_weights"] = tuple(x.weight for x in acts)
            return acts, ws
        on, ws = [], []
        for a in acts:
            k = chooser.integer(0, 3)
            if k != 1:
                on.append(a)
                ws.append(a.weight * (SWARM_BOOST if k == 2 else 1))
        if not on:
            on, ws = list(acts), [x.weight for x in acts]
        self._base = (on, ws)
        return self._draw_focus(chooser, on, ws)

    def _draw_focus(self, chooser: Any, on: list, ws: list) -> tuple:
        """The focus of the next :data:`FOCUS_STEPS` steps (see
        :meth:`_draw_swarm`): none, or one of :func:`focus_groups`."""
        groups = focus_groups(self.plan)
        self.focus = None
        self._refocus_at = self.nsteps + FOCUS_STEPS
        if groups:
            # two small draws, each about uniform (one draw over every group
            # is not: Hypothesis favours some integers of a wide range):
            # none, a role or an invariant, or (PROTOCOL_KINDS times as
            # often) a protocol, played as a script when it has a template
            proto = [g for g in groups if g[0].startswith("objects of ")]
            other = [g for g in groups if not g[0].startswith("objects of ")]
            kind = chooser.integer(0, 2 + PROTOCOL_KINDS - 1)
            pool = (proto or other) if kind >= 2 else (other or proto) if kind == 1 else None
            if pool:
                name, names = pool[chooser.integer(0, len(pool) - 1)] if len(pool) > 1 else pool[0]
                self.focus = name
                on, ws = _focused(self.plan.actions, on, ws, names)
                tpl = self.plan.templates.get(name)
                if tpl is not None and kind >= 2:
                    self._script = self._draw_script(chooser, tpl, names)
        return on, tuple(ws)

    def _draw_script(self, chooser: Any, tpl: Any, names: frozenset) -> list:
        """A macro-step: one protocol played as a short script (issue 12:
        *multi-stream fence orderings, ticket claim/expire interleavings*
        are 5-8-step orderings a weighted draw rarely makes in a row).

        From the protocol's :class:`~memspec.invariants.planning.Template`
        (learned from the spec): first what its actions name is made (each
        other producer 2 or 1 times: two streams, so that two uses can be
        on different ones; then the protocol's own object once; then each
        other action of the focus that makes something 1-2 times:
        ``load_weight``, whose cold weights a holder's answer releases);
        then each consumer 1-3 times in the order the spec's walk saw them
        over an object's life (``use``, then ``drop``; ``respond``, then
        ``claim``), the last one, which ends the life, once; each other
        action of the focus (``synchronize``, ``poll``) 1-2 times at drawn
        places after the first consumer (before it nothing of the object is
        there to act on); then the sweeps 1-3 times (``expire``, naming
        every ticket: time passes over the object's end).  Every count and
        place is one integer of the chooser.  The script's actions are
        drawn in turn, each with the usual argument guidance (the
        references the last steps made: the script's own object); one not
        available when its turn comes is skipped (a script none of whose
        actions is available leaves the focus's weights to the
        :data:`FOCUS_STEPS` steps).  When it ends, the next step draws the
        next focus.  Returns the script reversed (``pop()`` gives the
        next)."""
        acts = {a.name: a for a in self.plan.actions}
        used = set(tpl.producers) | set(tpl.consumers) | set(tpl.sweeps)
        others = sorted(n for n in names if n not in used and n in acts)
        makers = set(tpl.makers)
        # two of each object the protocol's own object is used with (two streams: a use on each)
        head = [acts[q] for q in tpl.producers[:-1] if q in acts for _ in range(2 - chooser.integer(0, 1))]
        if tpl.producers[-1] in acts:
            head.append(acts[tpl.producers[-1]])
        head += [acts[q] for q in others if q in makers for _ in range(1 + chooser.integer(0, 1))]
        life = [c for c in tpl.consumers if c in acts]
        # the last consumer ends the object's life (``drop``): once
        body = [acts[c] for c in life for _ in range(1 + (chooser.integer(0, 2) if c != life[-1] else 0))]
        for c in others:
            if c not in makers:
                for _ in range(1 + chooser.integer(0, 1)):
                    # after the first consumer: before it, nothing of the object is there to act on
                    body.insert(chooser.integer(min(1, len(body)), len(body)), acts[c])
        tail = [acts[c] for c in tpl.sweeps if c in acts for _ in range(1 + chooser.integer(0, 2))]
        script = head + body + tail
        script.reverse()
        return script

    def _draw_args(self, a: Any, chooser: Any) -> tuple[Any, dict, list, bool]:
        """Draw ``a``'s arguments, guided towards the protocol's progress.

        Up to :data:`ARG_REDRAWS` more draws (:data:`RARE_ARG_REDRAWS` when
        the action's accepting branch is rare in this run, see
        :meth:`_rare`), each one a boolean of the chooser (so shrinking
        keeps or drops it); the best draw is kept, by (1) the spec offers
        an accepting branch for it (a claim of a ticket that is granted, not
        one that can only be refused), (2) this example has not made this
        call with these references yet, (3) it names more of the references
        the last :data:`RECENT_STEPS` steps touched or made (a ``use`` of
        the allocation just made, on the stream just made; the ``drop`` of
        the allocation just used): sequences over one object go deep.
        Actions whose arguments draw nothing (read from the state) draw once.
        Only the kept draw's choices are recorded (a replay draws once).

        An action whose spec declares a failure path its arguments select
        (``Plan.faults``: a failure injected at a step of a transaction,
        which only the rollback of a real implementation shows) is a
        *rare-branch quota* first (an action whose draw showed one in this
        example is one from then on): until this example has kept
        :data:`FAULT_QUOTA` such draws of it, its draws try as hard as a
        rare action's (the first :data:`RARE_SURE_DRAWS` whatever the
        chooser says) and keep a failure path over an accepting branch, a
        path not kept yet in this example (``failure_path``: the injected
        step) over one kept already.  Accepting alone would never keep
        one: the spec can only refuse an injected failure."""
        guided = self.plan.guide and getattr(chooser, "weighted", None) is not None
        state = self.state
        best = None
        if guided and a.params:
            quota = self._faulted[a.name] < FAULT_QUOTA
            hunt = quota and (a.name in self.plan.faults or a.name in self._fault_seen)
            rare = hunt or self._rare(a)
            limit = RARE_ARG_REDRAWS if rare else ARG_REDRAWS
            sure = RARE_SURE_DRAWS if rare else 0
            paths = self._fault_paths
            recent = self._recent_refs()
            seen = self._seen
            misuse = getattr(a, "misuse", False)
            for attempt in range(limit + 1):
                rec = RecordingChooser(chooser)
                args = _draw(a, state, rec)
                outs = _spec_outcomes(a, state, args)
                accepting = outs is None or misuse or any(hasattr(b, "accepts") for b in outs.branches)
                refs = _refs_in(args)
                fresh = (a.name, refs) not in seen
                near = sum(1 for r in refs if r in recent)
                fault = failure_path(outs) if quota else None
                if fault is not None and not hunt:
                    # seen in this example: its later draws hunt for the quota (per example, not per
                    # run: the same choices must draw the same arguments when Hypothesis replays them)
                    self._fault_seen.add(a.name)
                # the quota: a failure path not kept yet in this example (2), one kept already (1)
                want = 0 if fault is None else 2 if not paths[(a.name, fault)] else 1
                score = (want, accepting, fresh, min(near, len(refs)))
                if best is None or score > best[0]:
                    best = (score, args, rec.record, outs, accepting, refs, fault)
                if want == 2 or not rec.record or attempt == limit:
                    break
                if not hunt and accepting and fresh and near >= min(len(refs), 2):
                    break
                if (accepting or attempt >= sure) and not chooser.boolean():
                    break
            _score, args, record, outs, accepting, refs, fault = best
            if fault is not None:
                self._faulted[a.name] += 1
                paths[(a.name, fault)] += 1
            # kept for apply(): the same action, arguments and state give the same outcomes
            self._outs = (a, args, outs)
            seen.add((a.name, refs))
            self._drawn[a.name] += 1
            if accepting:
                self._offered[a.name] += 1
            # a failure path kept for the quota keeps its step too (choose() gives a refusal's away)
            return a, args, record, accepting or fault is not None
        rec = RecordingChooser(chooser)
        args = _draw(a, state, rec)
        if guided:
            outs = _spec_outcomes(a, state, args)
            self._outs = (a, args, outs)
            accepting = outs is None or getattr(a, "misuse", False) or any(hasattr(b, "accepts") for b in outs.branches)
        else:
            accepting = True
        return a, args, rec.record, accepting

    def _rare(self, a: Any) -> bool:
        """The spec offered ``a`` an accepting branch in fewer than one in
        :data:`RARE_SHARE` of its draws in this example so far (a ``claim``
        of a granted ticket, say): its draws try harder for one.  Counted
        per example, not per run: the same choices must draw the same
        arguments when Hypothesis replays them (shrinking)."""
        return self._offered[a.name] * RARE_SHARE <= self._drawn[a.name]

    def _recent_refs(self) -> frozenset:
        """The reference ids the last :data:`RECENT_STEPS` steps of this
        example named in their arguments or bound."""
        out: set = set()
        for ts in self.trace[-RECENT_STEPS:]:
            refs = ts.refs
            if refs is None:   # a finished step's: computed once
                refs = ts.refs = ts.bound + _refs_in(ts.args)
            out.update(refs)
        return frozenset(out)

    def step(self, chooser: Any) -> TraceStep | None:
        """One step drawn from ``chooser``: a guided chooser (one with
        ``weighted``: Hypothesis's, a random walk's) serves the step's
        small draws packed, a few to each of its choices (see
        :class:`~memspec.invariants.choosers.PackedChooser`)."""
        packed = self._packed
        if packed is None or packed.inner is not chooser:
            packed = self._packed = PackedChooser(chooser) if PACKED_DRAWS and hasattr(chooser, "weighted") else None
        if packed is not None:
            packed.new_step()
            chooser = packed
        try:
            action, args, choices = self.choose(chooser)
        except _Stuck:  # a pass that leaves actions out may leave none available: nothing to do
            return None
        return self.apply(action, args, choices)

    def apply(self, action: Any, args: dict, choices: list | None = None) -> TraceStep:
        """Run ``action(**args)`` on spec and implementation and check everything."""
        plan = self.plan
        st = plan.stats
        st.steps += 1
        self.nsteps += 1
        st.actions[action.name] += 1
        ts = TraceStep(action.name, dict(args), list(choices or []), "", ())
        self.trace.append(ts)
        state = self.state
        for k, bfn in _boundaries_of(action):
            v = args.get(k)
            if type(v) is int:
                try:
                    hit = v in bfn(state)
                except Exception as e:  # noqa: BLE001
                    raise SpecError(f"{action.name}: boundaries of {k} raised {type(e).__name__}: {e}") from e
                if hit:
                    st.boundaries[f"{action.name}.{k}={v}"] += 1
        drawn, self._outs = self._outs, None
        if drawn is not None and drawn[0] is action and drawn[1] is args and drawn[2] is not None:
            outs = drawn[2]  # computed by the guidance of choose() on this very state
        else:
            try:
                outs = action.step(state, **args)
            except Exception as e:  # noqa: BLE001
                raise SpecError(f"{action.name}.step({args}) raised {type(e).__name__}: {e}") from e
        misuse = getattr(action, "misuse", False)
        if misuse:
            st.offered[action.name] += 1
        else:
            for b in outs.branches:
                if hasattr(b, "accepts"):  # a Returns branch: the call may succeed here
                    st.offered[action.name] += 1
                    break
        g = self.guard
        g.blame, g.what = outs.blame, f"step {self.nsteps}: {action.name}"
        if plan.on_call is not None:
            plan.on_call(self, ts)
        value, err = g.call(action.perform, self.sut, **args)
        if isinstance(err, SpecError):
            raise err
        branch = outs.match(value, err)
        if branch is None:
            branch = self._no_match(action, args, outs, value, err, ts)
            if branch is None:   # a masked answer the spec cannot follow: its state stays as it was
                self._action = action
                self._state_changed = False
                self.check_after(outs.touched, (), args)
                if plan.on_step is not None:
                    plan.on_step(plan)
                return ts
        is_return = err is None
        ts.outcome = ("returns " + branch.describe) if is_return else f"raises {type(err).__name__}"
        st.outcomes[(action.name, _kind_of_outcome(ts.outcome))] += 1
        if is_return or misuse:
            st.accepted[action.name] += 1
        try:
            result = branch.then(value if is_return else err)
        except Exception as e:  # noqa: BLE001
            raise SpecError(f"{action.name}: following branch {ts.outcome!r} raised {type(e).__name__}: {e}") from e
        bound = self._bind(result, value) if is_return else ()
        ts.bound = bound
        self._action = action
        # a branch whose ``then`` is the spec's no-op left the state as it was
        self._state_changed = branch.then is not _SPEC_NO_OP
        self.check_after(outs.touched, bound, args)
        if plan.on_step is not None:
            plan.on_step(plan)
        return ts

    def _no_match(self, action: Any, args: dict, outs: Any, value: Any, err: BaseException | None,
                  ts: "TraceStep") -> Any:
        """An answer no branch accepts.  When it has a branch's shape and
        breaks named clauses of it (:class:`~memspec.spec.core.Check`), the
        first clause not masked is the failure (``S8.alignment``); when
        every clause it breaks is masked, the spec follows that branch (the
        branch is returned).  An answer of no branch's shape fails the
        action's rule as a whole, unless that failure is masked: then
        ``None`` (the spec cannot follow it; its state is left as it was)."""
        masks = self.plan.masks
        hang = isinstance(err, HangResult)
        near = None if hang else outs.closest(value, err)
        if near is not None:
            b, bad = near
            keys = [(action.name, c.id) for c in bad]
            left = [c for c, k in zip(bad, keys) if k not in masks]
            if not left:
                for k in keys:
                    self._hit((self.nsteps, k))
                return b
            c = left[0]
            ts.outcome = self._describe_answer(value, err)
            call = f"{action.name}({', '.join(f'{k}={_describe_value(v, 40)}' for k, v in args.items())})"
            got = f"raised {T.exc_text(err)}" if err is not None else f"returned {_describe_value(value)}"
            why = (f"{call} {got}: breaks {c.id}" + (f" ({c.describe})" if c.describe else "")
                   + (f"; also {', '.join(x.id for x in left[1:])}" if len(left) > 1 else ""))
            self.fail(c.rule, "outcome", why, exc=err, check=c.name, key=(action.name, c.id))
        cause, why = self._mismatch(action, args, outs, value, err)
        key = (action.name, f"{outs.blame}.{cause}")
        if cause not in ("hang", "crash") and key in masks:
            self._hit((self.nsteps, key))
            ts.outcome = "masked: " + self._describe_answer(value, err)
            return None
        ts.outcome = self._describe_answer(value, err)
        self.fail(outs.blame, cause, why, exc=err, key=key)
        return None

    @staticmethod
    def _describe_answer(value: Any, err: BaseException | None) -> str:
        if isinstance(err, HangResult):
            return "hangs"
        if err is not None:
            return f"raises {T.exc_text(err)}"
        return f"returns {_describe_value(value)}"

    def _mismatch(self, action, args, outs, value, err) -> tuple[str, str]:
        expected = outs.describe()
        call = f"{action.name}({', '.join(f'{k}={_describe_value(v, 40)}' for k, v in args.items())})"
        if isinstance(err, HangResult):
            return "hang", f"{call} hangs: {T.safe_str(err)} (expected: {expected})"
        if err is not None and not isinstance(err, MemspecError):
            return "unexpected-exception", (
                f"{call} raised {T.exc_text(err, qualified=True)} -- not an error of the contract "
                f"(expected: {expected})")
        if err is not None:
            return "outcome", f"{call} raised {T.exc_text(err)} (expected: {expected})"
        # A normal return that no Returns branch accepts.
        returns = [b for b in outs.branches if hasattr(b, "accepts")]
        if isinstance(value, _NEVER_RETURNED):
            return "wrong-type", (f"{call} returned {type(value).__module__}.{type(value).__name__} "
                                  f"{_describe_value(value)}: no call of the contract returns that (expected: {expected})")
        if not returns:
            return "outcome", f"{call} returned {_describe_value(value)} instead of raising (expected: {expected})"
        if _wrong_type(returns, value):
            return "wrong-type", (f"{call} returned {type(value).__module__}.{type(value).__name__} "
                                  f"{_describe_value(value)}: not the type the contract returns (expected: {expected})")
        return "outcome", f"{call} returned {_describe_value(value)} (expected: {expected})"

    def _bind(self, result: Any, value: Any) -> tuple:
        refs = getattr(self.sut, "refs", None)
        if refs is None:
            return ()
        value = self.machine.unwrap(value)  # what perform read, as the machine wraps it: bind the implementation object
        if isinstance(result, int) and not isinstance(result, bool):
            refs[result] = value
            return (result,)
        if isinstance(result, tuple) and result and all(isinstance(r, int) and not isinstance(r, bool) for r in result):
            if isinstance(value, (tuple, list)) and len(value) == len(result):
                for r, v in zip(result, value):
                    refs[r] = v
            else:
                for r in result:
                    refs[r] = value
            return result
        return ()

    # -- checks ---------------------------------------------------------
    def check_after(self, touched: tuple, bound: tuple, args: dict | None = None) -> None:
        """Every check after a step.  When several fail at once, the report
        blames the rule that was broken, not its downstream figure (see
        :meth:`_blame_first`); the others are listed as consequences."""
        found: list = self.check_invariants()   # [(invariant, cause, reason)] of this step
        if self.plan.observations:
            self.check_observations(touched + bound, found=found)
        integrity = self.integrity
        if integrity is not None:
            if args:
                # the refs the arguments name, each once (a second refresh of
                # a ref in the same state finds nothing to do)
                regions = integrity.regions
                named = tuple(v for v in args.values() if type(v) is int and v in regions and v not in touched)
                if named:
                    touched = touched + named
            masks = self.plan.masks
            if not found and not masks:
                integrity.after_step(touched, bound)
            else:
                try:  # a data check that fails too may be the rule broken
                    integrity.after_step(touched, bound)
                except Violation as v:
                    key = (None, f"{v.invariant}.{v.cause}")
                    if key in masks:   # masked: its bytes are no longer known to the spec; no more data checks
                        self._hit((self.nsteps, key))
                        self.integrity = None
                    else:
                        found.append((v.invariant, v.cause, v.reason))
        if found:
            self._fail_found(found)

    def check_invariants(self) -> list:
        """``[(invariant, "invariant", reason)]`` of every invariant that
        fails on the spec state now (a crashing check is a SpecError)."""
        state = self.state
        checks = self._checks
        found: list = []
        if checks is None:  # the machine checks its invariants its own way: ask it every step
            try:
                bad = self.machine.check_invariants(state)
            except Exception as e:  # noqa: BLE001
                raise SpecError(f"an invariant check raised {type(e).__name__}: {e}") from e
            found += [(inv, "invariant", why) for inv, why in bad]
        elif self._invariants_held and not self._state_changed:
            # Re-evaluate on change: an invariant is a predicate over the spec
            # state, and this step's branch did not change the state since
            # every invariant last held on it, so each holds now as it did then
            # (tests/test_walk_speed.py checks this against a full evaluation).
            pass
        else:
            try:
                for inv, fn in checks:  # all of them, as check_invariants (a crash is a SpecError)
                    why = fn(state)
                    if why is not None:
                        found.append((inv, "invariant", why))
            except Exception as e:  # noqa: BLE001
                raise SpecError(f"an invariant check raised {type(e).__name__}: {e}") from e
        self._invariants_held = not found
        masks = self.plan.masks
        if found and masks:
            kept = []
            for x in found:
                key = (None, f"{x[0]}.invariant")
                if key in masks:
                    self._hit((self.nsteps, key))
                else:
                    kept.append(x)
            found = kept
        return found

    def _rank(self) -> dict:
        """``{invariant: how many of the machine's actions declare it}``: a
        rule few actions are about (fence ordering, a refcount, a ticket's
        state) is more specific than one every action touches (the ledger's
        totals), so it is the one a step broke when both fail."""
        rank = self.plan.__dict__.get("_rank")
        if rank is None:
            rank = {}
            for a in self.machine.actions:
                for inv in getattr(a, "invariants", ()) or ():
                    rank[inv] = rank.get(inv, 0) + 1
            self.plan.__dict__["_rank"] = rank
        return rank

    def _blame_first(self, found: list) -> list:
        """``found`` in blame order: a rule that another failing one at this
        step presupposes before that one (its consequence: ``empty_cache``
        releasing too little because free neighbours were never merged is
        C3's failure, not C6's); then the spec's own diagnosis (an invariant
        failing on the spec state) before a data check before a figure read
        from the implementation; within each, the invariants the step's
        action declares, in the order it declares them (the spec lists the
        rule the action is about before the ledger totals it also moves),
        then the others, the more specific first (fewer declaring actions);
        then the order the checks ran."""
        rank = self._rank()
        own = list(getattr(self._action, "invariants", ()) or ())
        n = len(self.machine.actions) + 1
        cause_rank = {"invariant": 0, "data": 1, "observation": 2}
        pre = self.plan.presupposed()
        failing = {x[0] for x in found}
        keyed = [((1 if pre.get(inv, frozenset()) & failing else 0, cause_rank.get(cause, 1),
                   (0, own.index(inv)) if inv in own else (1, rank.get(inv, n)), i),
                  x) for i, x in enumerate(found) for inv, cause in [x[:2]]]
        return [x for _k, x in sorted(keyed, key=lambda kx: kx[0])]

    def _fail_found(self, found: list) -> None:
        ordered = self._blame_first(found)
        inv, cause, why = ordered[0][:3]
        check = ordered[0][3] if len(ordered[0]) > 3 else None
        rest = [x for x in ordered[1:] if x[0] != inv or x[2] != why]
        if rest:
            why += " -- at this step also: " + "; ".join(f"{x[0]} [{x[1]}] {x[2]}" for x in rest[:4]) \
                + (f"; {len(rest) - 4} more" if len(rest) > 4 else "")
        key = (None, f"{inv}.{check}") if check else (None, f"{inv}.{cause}")
        also = tuple((None, f"{x[0]}.{x[3]}") if len(x) > 3 and x[3] else (None, f"{x[0]}.{x[1]}")
                     for x in ordered[1:])
        self.fail(inv, cause, why, check=check, key=key, also=also)

    def _observations_for(self, action: Any) -> list:
        """The plan's observations, those blamed on the action's own
        invariants first (in the action's order): when one wrong answer
        shows in several figures, the report names the rule the action is
        about."""
        cache = self._obs_cache
        if cache is None:
            cache = self._obs_cache = self.plan.__dict__.setdefault("_obs_order", {})
        key = getattr(action, "name", None)
        order = cache.get(key)
        if order is None:
            invs = list(getattr(action, "invariants", ()) or ())
            rank = {inv: i for i, inv in enumerate(invs)}
            order = sorted(self.plan.observations, key=lambda o: rank.get(o.blame, len(rank)))
            cache[key] = order
        return order

    def check_observations(self, touched: tuple, start: list | None = None, cause: str = "observation",
                           found: list | None = None) -> None:
        """Compare every applicable observation's spec figure with the
        implementation's, in the action's order (see :meth:`_observations_for`).

        The implementation's figures are read in one guarded call (queries
        have no effects); the first difference, error or hang in that order
        is the failure."""
        state = self.state
        jobs = []
        add = jobs.append
        if start is not None:
            jobs = [(obs, None) for obs in start]
        else:
            for obs in self._observations_for(self._action):
                try:
                    for r in obs.refs(state, touched):
                        add((obs, r))
                except Exception as e:  # noqa: BLE001
                    raise SpecError(f"observation {obs.name}: refs() raised {type(e).__name__}: {e}") from e
        if not jobs:
            return
        box: list = []
        g = self.guard
        g.blame, g.what = jobs[0][0].blame, f"step {self.nsteps}: reading {jobs[0][0].name}"
        _, hang = g.call(self._observe_all, jobs, box)
        got = box[:]  # a worker abandoned in a hang may still append
        if hang is not None and not isinstance(hang, HangResult):
            raise hang if isinstance(hang, SpecError) else SpecError(
                f"reading the observations raised {T.exc_text(hang)}")
        masks = self.plan.masks
        for (obs, r), (value, err) in zip(jobs, got):
            try:
                expected = obs.expected(state, r)
            except Exception as e:  # noqa: BLE001
                raise SpecError(f"observation {obs.name}: expected() raised {type(e).__name__}: {e}") from e
            name = getattr(obs, "check", "") or obs.name
            key = (None, f"{obs.blame}.{name}")
            if err is not None:
                if isinstance(err, SpecError):
                    raise err
                if key in masks:
                    self._hit((self.nsteps, key))
                    continue
                self.fail(obs.blame, "unexpected-exception" if not isinstance(err, MemspecError) else cause,
                          f"reading {self._where(obs, r)} raised {T.exc_text(err)} (spec: {expected!r})",
                          check=name, key=key)
            if value != expected:
                if key in masks:
                    self._hit((self.nsteps, key))
                    continue
                why = f"{self._where(obs, r)}: {_diff(expected, value)}"
                if found is None:
                    self.fail(obs.blame, cause, why, check=name, key=key)
                found.append((obs.blame, cause, why, name))
        if len(got) < len(jobs):  # the read that hung (its spec figure must still compute)
            obs, r = jobs[len(got)]
            try:
                obs.expected(state, r)
            except Exception as e:  # noqa: BLE001
                raise SpecError(f"observation {obs.name}: expected() raised {type(e).__name__}: {e}") from e
            self.fail(obs.blame, "hang", f"reading {self._where(obs, r)} hangs: {hang}")
        if hang is not None:
            obs, r = jobs[-1]
            self.fail(obs.blame, "hang", f"reading {self._where(obs, r)} hangs: {hang}")

    def _observe_all(self, jobs: list, got: list) -> None:
        """Run under the guard: each observation's ``observed`` in turn, its
        ``(value, error)`` appended to ``got`` (a hang stops the loop)."""
        sut = self.sut
        try:   # one step's reads, shared by the observations that read the same figure
            sut.reads = {}
        except AttributeError:
            pass
        try:
            for obs, r in jobs:
                try:
                    got.append((obs.observed(sut, r), None))
                except BaseException as e:  # noqa: BLE001 - a target may raise anything
                    got.append((None, e))
        finally:
            try:
                sut.reads = None
            except AttributeError:
                pass

    @staticmethod
    def _where(obs: Any, r: Any) -> str:
        return f"{obs.name}" + (f" of #{r}" if r is not None else "")

    def teardown(self) -> None:
        """End of the example: full invariant scan, full data verify, close the target."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.failed:
                return
            try:
                bad = self.machine.check_invariants(self.state, full=True)
            except Exception as e:  # noqa: BLE001
                raise SpecError(f"a full invariant check raised {type(e).__name__}: {e}") from e
            if bad:
                inv, why = bad[0]
                self.fail(inv, "invariant", why + " (full check at end of run)", key=(None, f"{inv}.invariant"))
            if self.integrity is not None:
                self.integrity.verify_all()
        finally:
            self.close()

    def close(self) -> None:
        g = self.guard
        for inst in (self.instance, getattr(self, "foreign", None)):
            c = getattr(inst, "close", None) if inst is not None else None
            if c is not None:
                g.blame, g.what = TARGET_ERROR, "closing the target"
                g.call(c)  # an error closing is not judged: teardown must not crash the harness


class _Stuck(Exception):
    """No action of a partial table is available (see ``Plan.partial``)."""


#: a guided chooser serves each step's small draws packed (see :meth:`Run.step`;
#: ``bench/harness_ab.py`` compares the two).  ON: with
#: ``runner.STEPS_PER_RULE`` 4 it cuts the Hypothesis choices per step of
#: ``conform reference`` from 10.7 to 2.4 and its CPU per step by 40-45%.  It
#: changes what the CI profile's derandomized examples draw.  Its kill power
#: was compared with the unpacked draws over four seeds (the derandomized
#: one and 1-3; bench/README.md, session 10) rather than at the derandomized
#: seed alone, where the catalog had been tuned with the unpacked draws: the
#: two miss about as often, and what they miss is the same class of bug
#: (exact sizes on the caching thresholds), which the caching sizes now reach
#: through the free blocks' remainders
PACKED_DRAWS = True
#: how much more likely a swarm-boosted action is drawn in its example
SWARM_BOOST = 4
#: extra action draws when the spec offers no accepting branch (guidance)
REDRAWS = 1
#: extra argument draws of the same action (guidance, see ``Run._draw_args``)
ARG_REDRAWS = 2
#: ... when the spec rarely offered the action an accepting branch in this run
RARE_ARG_REDRAWS = 6
#: ... of which this many are drawn whatever the chooser says (the others each cost a boolean)
RARE_SURE_DRAWS = 3
#: an action's accepting branch is rare when offered in fewer than 1 in this many of its steps
RARE_SHARE = 10
#: failure-path draws (``Plan.faults``) each example's guidance keeps per action
FAULT_QUOTA = 2
#: how many of the last steps' references an argument draw prefers
RECENT_STEPS = 4
#: a focus group (``focus_groups``) may cover at most this share of the actions
FOCUS_MAX_SHARE = 0.4
#: of the focus draws, none : a role or an invariant : a protocol (its script) = 1 : 1 : this many
PROTOCOL_KINDS = 3
#: a focus lasts this many steps (a protocol's script: until it ends), then the next is drawn
FOCUS_STEPS = 20
#: the focused actions together weigh this many times the others (2: two thirds of the draws)
FOCUS_RATIO = 2
#: a role of at most this many actions joins a protocol focus one of its actions is in
FOCUS_SMALL_ROLE = 4


def _draw(a: Any, state: Any, rec: Any) -> dict:
    try:
        return a.draw_args(state, rec)
    except SpecError:
        raise
    except Exception as e:  # noqa: BLE001
        raise SpecError(f"drawing arguments of {a.name} raised {type(e).__name__}: {e}") from e


def _refs_in(args: dict) -> tuple:
    """The ints among ``args``' values and one level into tuples (the
    reference ids an action names: ``allocation``, ``(grant, actual)``,
    ``(ticket, holder, terminal)``)."""
    out = []
    for v in args.values():
        if type(v) is int:
            out.append(v)
        elif type(v) is tuple:
            out.extend(x for x in v if type(x) is int)
    return tuple(out)


def focus_groups(plan: Any) -> tuple:
    """``((name, frozenset of action names), ...)``: the protocols an
    example's swarm may favour, read from the spec (nothing here names an
    action): the actions of each role, and those declaring each invariant,
    when there are at least two of them and at most :data:`FOCUS_MAX_SHARE`
    of the plan's actions (a ledger every action moves is no protocol);
    the same set once.  Cached on the plan."""
    got = plan.__dict__.get("_focus")
    if got is not None and got[0] is plan.actions:
        return got[1]
    acts = plan.actions
    here = {a.name for a in acts}
    cap = max(2, int(len(acts) * FOCUS_MAX_SHARE))
    by: dict = {}
    roles: dict = {}
    for a in acts:
        role = getattr(a, "role", None)
        if role:
            by.setdefault(f"role {role}", []).append(a.name)
            roles.setdefault(a.name, role)
        for inv in getattr(a, "invariants", ()) or ():
            by.setdefault(f"invariant {inv}", []).append(a.name)
    # the protocols over one kind of object (``Plan.protocols``), with the
    # small roles of their actions (``use`` brings the EP's ``synchronize``, ``poll``)
    small = {r: names for r, names in ((k[5:], v) for k, v in by.items() if k.startswith("role "))
             if len(names) <= FOCUS_SMALL_ROLE}
    declared = {k[10:]: set(v) for k, v in by.items() if k.startswith("invariant ")}
    for name, names in getattr(plan, "protocols", ()) or ():
        base = {n for n in names if n in here}
        # a rule few actions declare, two of them in the protocol (S6: a
        # holder's answer to a ticket), brings the roles of the others
        # (ModelResidency, whose cold weights the answer releases) -- unless
        # that makes the protocol too big to be one
        g = set(base)
        for inv, ds in declared.items():
            if len(ds) <= FOCUS_SMALL_ROLE and len(ds & base) >= 2:
                g |= ds
        for n in list(g):
            g.update(small.get(roles.get(n), ()))
        if len(g) > cap:
            g = set(base)
            for n in list(g):
                g.update(small.get(roles.get(n), ()))
        by[name] = sorted(g)
    out, sets = [], set()
    for name, names in by.items():
        s = frozenset(names)
        if 2 <= len(s) <= cap and s not in sets:
            sets.add(s)
            out.append((name, s))
    groups = tuple(out)
    plan.__dict__["_focus"] = (acts, groups)
    return groups


def _focused(acts: list, on: list, ws: list, names: frozenset) -> tuple:
    """Switch the actions ``names`` on, each as likely as the others (a
    protocol's light steps, ``new_stream`` say, as often as its heavy
    ones), together :data:`FOCUS_RATIO` times as likely as the others."""
    ons = {a.name for a in on}
    on = list(on) + [a for a in acts if a.name in names and a.name not in ons]
    ws = list(ws) + [1 for a in acts if a.name in names and a.name not in ons]
    n = sum(1 for a in on if a.name in names)
    rest = sum(w for a, w in zip(on, ws) if a.name not in names)
    each = max(1, -(-rest * FOCUS_RATIO // max(n, 1)))
    return on, [each if a.name in names else w for a, w in zip(on, ws)]


#: id(action) -> (action, [(param, its domain's ``boundaries``)]): the
#: params whose boundary hits a step counts, listed once per action
_BOUNDARIES: dict[int, tuple] = {}


def _boundaries_of(action: Any) -> list:
    got = _BOUNDARIES.get(id(action))
    if got is None or got[0] is not action:
        got = _BOUNDARIES[id(action)] = (action, [(k, d.boundaries) for k, d in action.params.items()
                                                  if getattr(d, "boundaries", None) is not None])
    return got[1]


def failure_path(outs: Any) -> str | None:
    """The failure path ``outs`` is, or ``None``: an outcome whose one
    permitted answer is *any* error of the contract (``Raises`` of the base
    ``MemspecError``) is a failure the caller's arguments injected -- not a
    refusal the state forces, which names its error class (``GrantDenied``).
    Named by its description with every number of two or more digits as
    ``N`` (``"injected failure at step 4: rolled back"``: one path per
    step; sizes in a description do not make new paths)."""
    if outs is None or len(outs.branches) != 1:
        return None
    b = outs.branches[0]
    if not isinstance(b, Raises) or b.error is not MemspecError:
        return None
    return _NUMBER.sub("N", b.describe)


_NUMBER = re.compile(r"\d{2,}")


def _spec_outcomes(action: Any, state: Any, args: dict) -> Any:
    """``action.step(state, **args)``, or ``None`` when the spec crashes
    (apply() steps again and reports the crash)."""
    try:
        return action.step(state, **args)
    except Exception:  # noqa: BLE001
        return None


def _step_checks(machine: Any, state: Any) -> list | None:
    """``[(invariant id, check)]`` to run after every step (the machine's
    :meth:`~memspec.spec.core.Machine.step_checks`); ``None`` (run
    ``machine.check_invariants``) when the machine overrides how its
    invariants are checked or does not say."""
    from memspec.spec.core import Machine

    if not isinstance(machine, Machine) or type(machine).check_invariants is not Machine.check_invariants \
            or "check_invariants" in getattr(machine, "__dict__", {}):
        return None
    return machine.step_checks(state)


def _diff(expected: Any, observed: Any) -> str:
    """The expected and observed figures, as a difference: for two dicts
    (or records) only the keys that differ; for numbers the signed gap."""
    e, o = expected, observed
    if hasattr(e, "__dict__") and hasattr(o, "__dict__") and not isinstance(e, type):
        e, o = vars(e), vars(o)
    if isinstance(e, dict) and isinstance(o, dict):
        keys = [k for k in dict.fromkeys([*e, *o]) if e.get(k, _MISSING) != o.get(k, _MISSING)]
        parts = [f"{k}: spec {_describe_value(e.get(k, _MISSING), 40)} != implementation "
                 f"{_describe_value(o.get(k, _MISSING), 40)}" for k in keys[:6]]
        return "figures differ -- " + "; ".join(parts) + (f"; {len(keys) - 6} more" if len(keys) > 6 else "")
    if type(e) is int and type(o) is int:
        return f"implementation says {o}, spec says {e} (implementation {o - e:+d})"
    return f"implementation says {_describe_value(o)}, spec says {e!r}"


class _Missing:
    def __repr__(self) -> str:
        return "<absent>"


_MISSING = _Missing()


def _safe_witness(b: Any) -> Any:
    try:
        return b.witness() if b.witness is not None else None
    except Exception:  # noqa: BLE001
        return None


#: types no call of the contract ever returns
_NEVER_RETURNED = (str, bytes, bytearray, float, complex, dict, set, frozenset)


def _wrong_type(returns: list, value: Any) -> bool:
    """A return is of the wrong type when the spec's witnesses show another
    type, or when every ``accepts`` predicate crashes on it (a predicate over
    a handle's fields applied to a string, say)."""
    if isinstance(value, _NEVER_RETURNED):
        return True
    kinds = set()
    for b in returns:
        w = _safe_witness(b)
        if w is not None:
            kinds.add(type(w))
    if kinds:
        if isinstance(value, bool) or not any(isinstance(value, k) for k in kinds):
            # ints are interchangeable with bools only when the spec says so
            if not (bool in kinds and isinstance(value, bool)):
                return True
        return False
    crashed = 0
    for b in returns:
        try:
            b.accepts(value)
        except Exception:  # noqa: BLE001
            crashed += 1
    return crashed == len(returns)
