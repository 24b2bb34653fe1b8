"""The conformance engine: drive a spec :class:`~memspec.spec.core.Machine`
and an implementation side by side, one action at a time.

Generic over the machine: nothing here knows an action, a state field or an
invariant by name.  Each step

1. draws an *available* action from the machine's action table (by weight)
   and its arguments through a :class:`~memspec.spec.core.Chooser` (how:
   :mod:`memspec.invariants.draws`, the base class of :class:`Run`);
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
from dataclasses import dataclass, field
from typing import Any

from memspec.invariants.choosers import PackedChooser
from memspec.invariants.draws import Draws, _Stuck
from memspec.invariants.errors import TARGET_ERROR, HangResult, SpecError, TargetError, Violation, violation_class
from memspec.invariants.guard import BUILD_SECONDS, CallGuard
from memspec.invariants.integrity import make_integrity
from memspec.invariants import text as T
from memspec.invariants.plan import Plan, Stats  # noqa: F401 - the engine's face: callers name E.Plan, E.Stats
from memspec.spec import api
from memspec.spec.core import CHECKS_MEMO, ChecksMemo, Returns, _nothing as _SPEC_NO_OP, global_figure as _GLOBAL_FIGURE
from memspec.spec.errors import MemspecError


_KIND_NUMBER = re.compile(r"0x[0-9a-fA-F]+|\d+")
_KINDS: dict = {}


def _kind_of_outcome(outcome: str) -> str:
    """An outcome's kind: its text with every number written ``N``, so
    coverage counts branches, not the figures a branch was described with
    (``returns an allocation of N bytes, footprint [N, N] ...``)."""
    k = _KINDS.get(outcome)
    if k is None:
        k = _KIND_NUMBER.sub("N", outcome)
        if len(_KINDS) >= 10_000:   # full (a long fuzz run): start over, so the outcomes of now are cached
            _KINDS.clear()
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
    #: the references it bound and named (the guidance's, see ``draws.Draws._recent_refs``)
    refs: tuple | None = field(default=None, repr=False, compare=False)


# --------------------------------------------------------------------------
# Run: one example (a fresh target, a fresh spec state)
# --------------------------------------------------------------------------

class Run(Draws):
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
        #: (action, args, Outcomes or None, the references args names or None) the guidance computed
        #: for the step being drawn
        self._outs: tuple | None = None
        self._obs_cache: dict | None = None
        self._checks: list | None = None
        #: every invariant held on the state as it is now (re-evaluate on change)
        self._invariants_held = False
        #: the last step's branch may have changed the spec state
        self._state_changed = True
        #: the packed draws of the chooser the steps are drawn from (see :meth:`step`)
        self._packed: PackedChooser | None = None
        self._init_draws()
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
        if key is None and cause == "data":   # a data check raised from the integrity layer: maskable as after_step masks it
            key = (None, f"{invariant}.data")
        v.key = key
        v.also_keys = also   # the mask keys of the other checks that failed at the same step
        v.masked_hits = list(getattr(self, "masked_hits", ()))
        v.capacity = getattr(self, "capacity", None)
        if isinstance(exc, BaseException) and not isinstance(exc, HangResult):
            raise v from exc
        raise v

    # -- one step -------------------------------------------------------
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
        meta = _ACTION_META.get(id(action))
        if meta is None or meta[0] is not action:
            meta = _action_meta(action)
        _a, name, bounds, misuse = meta
        st.actions[name] += 1
        ts = TraceStep(name, dict(args), list(choices) if choices else [], "", ())
        self.trace.append(ts)
        state = self.state
        for k, bfn in bounds:
            v = args.get(k)
            if type(v) is int:
                try:
                    hit = v in bfn(state)
                except Exception as e:  # noqa: BLE001
                    raise SpecError(f"{name}: boundaries of {k} raised {type(e).__name__}: {e}") from e
                if hit:
                    st.boundaries[f"{name}.{k}={v}"] += 1
        drawn, self._outs = self._outs, None
        drawn_refs = None
        if drawn is not None and drawn[0] is action and drawn[1] is args and drawn[2] is not None:
            outs = drawn[2]  # computed by the guidance of choose() on this very state
            drawn_refs = drawn[3]   # the references ``args`` names (``draws._refs_in``), if the guidance had them
        else:
            try:
                outs = action.step(state, **args)
            except Exception as e:  # noqa: BLE001
                raise SpecError(f"{name}.step({args}) raised {type(e).__name__}: {e}") from e
        if misuse:
            st.offered[name] += 1
        else:
            for b in outs.branches:
                if type(b) is Returns or hasattr(b, "accepts"):  # a Returns branch: the call may succeed here
                    st.offered[name] += 1
                    break
        g = self.guard
        g.blame, g.what = outs.blame, f"step {self.nsteps}: {name}"
        if plan.on_call is not None:
            plan.on_call(self, ts)
        value, err = g.call(action.perform, self.sut, **args)
        if err is not None and isinstance(err, SpecError):
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
        ts.outcome = outcome = ("returns " + branch.describe) if is_return else f"raises {type(err).__name__}"
        kind = _KINDS.get(outcome)
        st.outcomes[(name, kind if kind is not None else _kind_of_outcome(outcome))] += 1
        if is_return or misuse:
            st.accepted[action.name] += 1
        try:
            result = branch.then(value if is_return else err)
        except Exception as e:  # noqa: BLE001
            raise SpecError(f"{name}: following branch {ts.outcome!r} raised {type(e).__name__}: {e}") from e
        bound = self._bind(result, value) if is_return else ()
        ts.bound = bound
        if drawn_refs is not None:
            ts.refs = bound + drawn_refs   # as ``Draws._recent_refs`` would compute it from ``ts``
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
        if type(result) is int or (isinstance(result, int) and not isinstance(result, bool)):
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
        :meth:`_blame_first`); the others are listed as consequences.

        While the checks run, the spec state carries a fresh
        :data:`~memspec.spec.core.CHECKS_MEMO` dict (nothing changes the
        state meanwhile): what several checks derive from the state alike is
        computed once per step."""
        state = self.state
        d = getattr(state, "__dict__", None)
        if d is None:
            return self._check_after(touched, bound, args)
        # one memo per run, emptied and handed to the state before each sweep
        # (removed from the state after it, as a fresh one was)
        memo = self.__dict__.get("_memo")
        if memo is None:
            memo = self._memo = ChecksMemo(state)
        else:
            memo.clear()
            memo.owner = state
        d[CHECKS_MEMO] = memo
        try:
            return self._check_after(touched, bound, args)
        finally:
            d.pop(CHECKS_MEMO, None)
            memo.clear()

    def _check_after(self, touched: tuple, bound: tuple, args: dict | None = None) -> None:
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
                refs = obs.refs
                if refs is _GLOBAL_FIGURE:   # a global figure: (None,) after every step, without the call
                    add((obs, None))
                    continue
                try:
                    for r in refs(state, touched):
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
            if err is None and not value != expected:   # the same comparison as below, once
                continue   # the common case: nothing to name (the check's key is built only for a failure)
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
            masks = self.plan.masks
            for inv, why in bad:   # a masked invariant stays masked here too (its failure was found before)
                key = (None, f"{inv}.invariant")
                if key in masks:
                    self._hit((self.nsteps, key))
                    continue
                self.fail(inv, "invariant", why + " (full check at end of run)", key=key)
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




#: id(action) -> (action, its name, its params' boundaries (:func:`_boundaries_of`), whether it is a misuse)
_ACTION_META: dict[int, tuple] = {}


def _action_meta(action: Any) -> tuple:
    got = _ACTION_META[id(action)] = (action, action.name, _boundaries_of(action), getattr(action, "misuse", False))
    return got


#: id(action) -> (action, [(param, its domain's ``boundaries``)]): the
#: params whose boundary hits a step counts, listed once per action
_BOUNDARIES: dict[int, tuple] = {}


def _boundaries_of(action: Any) -> list:
    got = _BOUNDARIES.get(id(action))
    if got is None or got[0] is not action:
        got = _BOUNDARIES[id(action)] = (action, [(k, d.boundaries) for k, d in action.params.items()
                                                  if getattr(d, "boundaries", None) is not None])
    return got[1]




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
