"""Choosing a :class:`~memspec.invariants.engine.Run`'s next action and its
arguments: the drawing half of a run (the engine runs the step, matches the
answer and checks).

Every choice goes through the run's :class:`~memspec.spec.core.Chooser`, in
a fixed order: Hypothesis replays a run's choice sequence (shrinking) and a
saved reproduction replays its recorded choices, so a change of what is
drawn, or in which order, is a change of every example and every saved
reproduction (``tests/test_engine_draws_pinned.py`` pins a seeded run's).

* swarm testing: each example switches actions off or boosts them
  (:meth:`Draws._draw_swarm`);
* a *focus*: a protocol of the spec the example favours for a while
  (:func:`focus_groups`, :meth:`Draws._draw_focus`), played as a short
  script when the plan has its template (:meth:`Draws._draw_script`);
* guidance of the arguments: redraws towards an accepting branch, fresh
  calls and the references the last steps made, and a quota of failure
  paths (:meth:`Draws._draw_args`, :func:`failure_path`).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from memspec.invariants.choosers import PackedChooser, PackedRecorder, RecordingChooser
from memspec.invariants.errors import SpecError
from memspec.spec.core import Raises, Returns
from memspec.spec.errors import MemspecError


class _Stuck(Exception):
    """No action of a partial table is available (see ``Plan.partial``)."""


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


class Draws:
    """The drawing half of a :class:`~memspec.invariants.engine.Run` (its
    base class): which action the next step calls, and with which arguments.
    It reads the run's ``plan``, ``machine``, ``state``, ``nsteps`` and
    ``trace``, and hands the spec's outcomes of the drawn call to
    ``Run.apply`` through ``_outs`` (the same action, arguments and state
    give the same outcomes: ``apply`` does not step the spec twice)."""

    #: see :meth:`_recorder` (a class default: a run built without ``_init_draws`` has none yet)
    _rec: Any = None

    def _init_draws(self) -> None:
        """This example's drawing state (a fresh run: no swarm, no focus yet)."""
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
        #: (trace, its length, :meth:`_recent_refs`) of the step being drawn
        self._recent: tuple | None = None
        #: the recorder of argument draws (one per chooser: each draw gets a fresh ``record``)
        self._rec: Any = None

    def available(self) -> list:
        """The actions of the plan available in the current state."""
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
            proto, other = _focus_kinds(self.plan, groups)
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
        acts = _by_name(self.plan)
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
        if guided and a.params:
            name = a.name
            # Counter lookups by .get: a missing key costs no __missing__ call
            quota = self._faulted.get(name, 0) < FAULT_QUOTA
            hunt = quota and (name in self.plan.faults or name in self._fault_seen)
            rare = hunt or self._offered.get(name, 0) * RARE_SHARE <= self._drawn.get(name, 0)
            limit = RARE_ARG_REDRAWS if rare else ARG_REDRAWS
            sure = RARE_SURE_DRAWS if rare else 0
            paths = self._fault_paths
            recent = self._recent_refs()
            seen = self._seen
            misuse = getattr(a, "misuse", False)
            best = None
            best_score = None
            rec = self._recorder(chooser)
            #: the attempts so far: (args, outs, accepting, refs, fault); a redraw of the same
            #: arguments (a small domain) reuses its outcomes: the state has not moved
            tried: list = []
            for attempt in range(limit + 1):
                rec.record = record = []
                # _draw, inline
                try:
                    args = a.draw_args(state, rec)
                except SpecError:
                    raise
                except Exception as e:  # noqa: BLE001
                    if _hypothesis_own(e):
                        raise
                    raise SpecError(f"drawing arguments of {a.name} raised {type(e).__name__}: {e}") from e
                for t in tried:
                    if t[0] == args:
                        _a, outs, accepting, refs, fault = t
                        break
                else:
                    outs = _spec_outcomes(a, state, args)
                    fault = None
                    if outs is None:
                        accepting = True
                    else:
                        branches = outs.branches
                        if misuse:
                            accepting = True
                        else:
                            # _offers_return, inline
                            accepting = False
                            for b in branches:
                                if type(b) is Returns or hasattr(b, "accepts"):
                                    accepting = True
                                    break
                        if quota and len(branches) == 1:
                            # failure_path, inline
                            b = branches[0]
                            if isinstance(b, Raises) and b.error is MemspecError:
                                fault = _NUMBER.sub("N", b.describe)
                    refs = _refs_in(args)
                    tried.append((args, outs, accepting, refs, fault))
                fresh = (name, refs) not in seen
                near = 0
                if recent:
                    for r in refs:
                        if r in recent:
                            near += 1
                if fault is not None and not hunt:
                    # seen in this example: its later draws hunt for the quota (per example, not per
                    # run: the same choices must draw the same arguments when Hypothesis replays them)
                    self._fault_seen.add(name)
                # the quota: a failure path not kept yet in this example (2), one kept already (1)
                want = 0 if fault is None else 2 if not paths[(name, fault)] else 1
                nrefs = len(refs)
                score = (want, accepting, fresh, near if near < nrefs else nrefs)
                if best_score is None or score > best_score:
                    best_score = score
                    best = (args, record, outs, accepting, refs, fault)
                if want == 2 or not record or attempt == limit:
                    break
                if not hunt and accepting and fresh and near >= (nrefs if nrefs < 2 else 2):
                    break
                if (accepting or attempt >= sure) and not chooser.boolean():
                    break
            args, record, outs, accepting, refs, fault = best  # type: ignore[misc]
            if fault is not None:
                self._faulted[name] += 1
                paths[(name, fault)] += 1
            # kept for apply(): the same action, arguments and state give the same outcomes (and
            # the trace step names the same references: ``TraceStep.refs`` without a second ``_refs_in``)
            self._outs = (a, args, outs, refs)
            seen.add((name, refs))
            self._drawn[name] += 1
            if accepting:
                self._offered[name] += 1
            # a failure path kept for the quota keeps its step too (choose() gives a refusal's away)
            return a, args, record, accepting or fault is not None
        rec = self._recorder(chooser)
        rec.record = []
        args = _draw(a, state, rec)
        if guided:
            outs = _spec_outcomes(a, state, args)
            self._outs = (a, args, outs, None)
            accepting = outs is None or getattr(a, "misuse", False) or _offers_return(outs)
        else:
            accepting = True
        return a, args, rec.record, accepting

    def _recorder(self, chooser: Any) -> Any:
        """The run's recorder of argument draws from ``chooser``
        (``RecordingChooser(chooser)``, or the :class:`PackedRecorder` that
        draws and records the same from a :class:`PackedChooser`); the
        caller sets a fresh ``record`` for each draw."""
        rec = self._rec
        if rec is None or rec.inner is not chooser:
            rec = self._rec = PackedRecorder(chooser) if type(chooser) is PackedChooser else RecordingChooser(chooser)
        return rec

    def _rare(self, a: Any) -> bool:
        """The spec offered ``a`` an accepting branch in fewer than one in
        :data:`RARE_SHARE` of its draws in this example so far (a ``claim``
        of a granted ticket, say): its draws try harder for one.  Counted
        per example, not per run: the same choices must draw the same
        arguments when Hypothesis replays them (shrinking)."""
        return self._offered[a.name] * RARE_SHARE <= self._drawn[a.name]

    def _recent_refs(self) -> tuple:
        """The reference ids the last :data:`RECENT_STEPS` steps of this
        example named in their arguments or bound, as one tuple (a dozen
        ints at most: membership is a scan in C; repeats allowed), computed
        once per step: the trace grows by one step at a time, each finished
        when the next is drawn."""
        trace = self.trace
        n = len(trace)
        got = self._recent
        if got is not None and got[0] is trace and got[1] == n:
            return got[2]
        recent: tuple = ()
        for ts in trace[-RECENT_STEPS:]:
            refs = ts.refs
            if refs is None:   # a finished step's: computed once
                refs = ts.refs = ts.bound + _refs_in(ts.args)
            recent += refs
        self._recent = (trace, n, recent)
        return recent


def _draw(a: Any, state: Any, rec: Any) -> dict:
    try:
        return a.draw_args(state, rec)
    except SpecError:
        raise
    except Exception as e:  # noqa: BLE001
        if _hypothesis_own(e):
            raise
        raise SpecError(f"drawing arguments of {a.name} raised {type(e).__name__}: {e}") from e


def _hypothesis_own(e: BaseException) -> bool:
    """``e`` is Hypothesis's own (raised by the chooser, not by the spec's
    domain), which Hypothesis must see as it is -- above all
    ``FlakyStrategyDefinition``: this draw's bounds differ from the ones the
    same choices had in an earlier example.  Wrapped in a SpecError it read
    as a defect of the spec, and Hypothesis took it for the example's
    failure (then raised its own again when that example ended early)."""
    return type(e).__module__.split(".", 1)[0] == "hypothesis"


def _offers_return(outs: Any) -> bool:
    """The spec offers a returning (accepting) branch: one with ``accepts``."""
    for b in outs.branches:
        if hasattr(b, "accepts"):
            return True
    return False


def _refs_in(args: dict) -> tuple:
    """The ints among ``args``' values and one level into tuples (the
    reference ids an action names: ``allocation``, ``(grant, actual)``,
    ``(ticket, holder, terminal)``)."""
    out = []
    for v in args.values():
        t = type(v)
        if t is int:
            out.append(v)
        elif t is tuple:
            for x in v:
                if type(x) is int:
                    out.append(x)
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


def _focus_kinds(plan: Any, groups: tuple) -> tuple:
    """``(protocols, others)``: :func:`focus_groups` split into the
    protocols over one kind of object and the roles and invariants (cached
    on the plan with the groups they split)."""
    got = plan.__dict__.get("_focus_kinds")
    if got is not None and got[0] is groups:
        return got[1]
    proto = [g for g in groups if g[0].startswith("objects of ")]
    other = [g for g in groups if not g[0].startswith("objects of ")]
    plan.__dict__["_focus_kinds"] = (groups, (proto, other))
    return proto, other


def _by_name(plan: Any) -> dict:
    """The plan's actions by name (cached on the plan with its table)."""
    got = plan.__dict__.get("_by_name")
    if got is not None and got[0] is plan.actions:
        return got[1]
    acts = {a.name: a for a in plan.actions}
    plan.__dict__["_by_name"] = (plan.actions, acts)
    return acts


def _focused(acts: list, on: list, ws: list, names: frozenset) -> tuple:
    """Switch the actions ``names`` on, each as likely as the others (a
    protocol's light steps, ``new_stream`` say, as often as its heavy
    ones), together :data:`FOCUS_RATIO` times as likely as the others."""
    ons = {a.name for a in on}
    on = list(on)
    ws = list(ws)
    for a in acts:
        if a.name in names and a.name not in ons:
            on.append(a)
            ws.append(1)
    n = 0
    rest = 0
    inside = []
    for a, w in zip(on, ws):
        if a.name in names:
            n += 1
            inside.append(True)
        else:
            rest += w
            inside.append(False)
    each = max(1, -(-rest * FOCUS_RATIO // max(n, 1)))
    return on, [each if i else w for i, w in zip(inside, ws)]


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
