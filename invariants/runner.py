"""Running the harness: build a :class:`~memspec.invariants.harness.Plan`
for a target at a level, drive it with Hypothesis (a
``RuleBasedStateMachine`` whose single rule draws an action from the spec's
action table), and collect per-invariant results.

Levels (issue 4, "Two levels"):

* ``mechanism`` -- the spec's ``MECHANISM`` machine over the target's
  ``DeviceMemoryMechanism`` (capabilities discovered and passed to ``init``;
  the actions of absent capabilities are not drawn and their invariants are
  N/A unless another action covers them);
* ``system`` -- ``SYSTEM`` over the reference roles wired around the
  target's mechanism (``memspec.reference.system.build_system``);
* ``caching`` -- ``CACHING`` over a target of kind ``caching``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from memspec.spec import api
from memspec.invariants import harness as H
from memspec.invariants import signals
from memspec.invariants.discovery import TargetRef, capabilities, resolve

LEVELS = ("mechanism", "system", "caching")


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------

@dataclass
class Failure:
    """One shrunk counterexample."""

    target: str
    level: str
    invariant: str
    cause: str
    reason: str
    trace: list
    steps_to_detection: int | None
    repro: str | None = None
    flaky: bool = False

    @property
    def shrunk_length(self) -> int:
        return len(self.trace)


@dataclass
class PlanResult:
    target: str
    level: str
    plan: H.Plan | None
    failures: list[Failure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)   # spec/target/harness errors (not a target FAIL)
    seconds: float = 0.0

    @property
    def stats(self) -> H.Stats:
        return self.plan.stats if self.plan is not None else H.Stats()

    def rows(self) -> list[tuple[str, str, str, str]]:
        """``(invariant id, title, status, detail)`` for every invariant of the level."""
        if self.plan is None:
            return []
        out = []
        failed = {}
        for f in self.failures:
            failed.setdefault(f.invariant, f)
        titles = self.plan.titles()
        for inv in self.plan.invariant_ids:
            if inv in failed:
                f = failed[inv]
                out.append((inv, titles.get(inv, ""), "FAIL", f"[{f.cause}] {f.reason}"))
            elif inv in self.plan.na:
                out.append((inv, titles.get(inv, ""), "N/A", self.plan.na[inv]))
            elif self.errors:
                out.append((inv, titles.get(inv, ""), "ERROR", self.errors[0]))
            else:
                out.append((inv, titles.get(inv, ""), "PASS", ""))
        for inv, f in failed.items():
            if inv not in titles:
                out.append((inv, "", "FAIL", f"[{f.cause}] {f.reason}"))
        return out

    @property
    def ok(self) -> bool:
        return not self.failures and not self.errors


# --------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------

def machine_for(level: str) -> Any:
    if level == "mechanism":
        from memspec.spec.mechanism import MECHANISM

        return MECHANISM
    if level == "system":
        from memspec.spec.system import SYSTEM

        return SYSTEM
    if level == "caching":
        from memspec.spec.caching import CACHING

        return CACHING
    raise ValueError(f"unknown level {level!r} (one of {', '.join(LEVELS)})")


def levels_for(kind: str, level: str) -> list[str]:
    """Which levels apply to a target of ``kind`` when ``level`` is asked."""
    if kind == "caching":
        return ["caching"] if level in ("all", "caching") else []
    if level == "all":
        return ["mechanism", "system"]
    return [level] if level in ("mechanism", "system") else []


def _page_of(instance: api.TargetInstance) -> int:
    mech = instance.mechanism
    for getter in ("virtual_backing", "shared_mapping"):
        cap = getattr(mech, getter)() if mech is not None else None
        if cap is not None:
            try:
                return int(cap.granularity())
            except Exception:  # noqa: BLE001
                pass
    return api.DEFAULT_PAGE


def _mechanism_sut(run: H.Run, instance: api.TargetInstance) -> H.MechanismSUT:
    make_foreign = (instance.extras or {}).get("make_foreign")
    if make_foreign is not None:
        # the target's own twin (an independent mechanism on the same device:
        # its handles may even reuse addresses of ours)
        foreign = api.TargetInstance(mechanism=make_foreign(), ep=instance.ep, capacity=instance.capacity)
    else:
        foreign = run.plan.factory(**run.plan.factory_kwargs)
        run.foreign = foreign
    sut = H.MechanismSUT(instance, foreign)
    check_capability_answers(run, instance.mechanism, run.plan.capabilities)
    return sut


def check_capability_answers(run: H.Run, mech: Any, caps: dict) -> None:
    """Seed 000, *"when a capability is unsupported, return an explicit absence
    or error rather than a successful no-op"*: an absent capability answers
    ``None`` (every time), a present one is an object with the protocol's
    methods.  Blamed on S5."""
    for cap, proto in (("virtual_backing", api.VirtualBacking), ("shared_mapping", api.SharedMapping)):
        got, err = run.guard.call(getattr(mech, cap))
        if err is not None:
            run.fail("S5", "capability", f"{cap}() raised {type(err).__name__}: {err}")
        if caps.get(cap):
            if got is None:
                run.fail("S5", "capability", f"{cap}() answered None now but an object when discovered")
            missing = [m for m in proto.__dict__ if not m.startswith("_") and callable(getattr(proto, m, None))
                       and not callable(getattr(got, m, None))]
            if missing:
                run.fail("S5", "capability", f"{cap}() object lacks {', '.join(sorted(missing))}")
        elif got is not None:
            run.fail("S5", "capability", f"{cap}() answered {type(got).__name__} now but None when discovered")


def _system_sut(patch: Callable | None) -> Callable:
    def make(run: H.Run, instance: api.TargetInstance) -> Any:
        from memspec.reference.system import build_system

        system = build_system(instance, capacity=instance.capacity)
        if patch is not None:
            system = patch(system) or system
        if not hasattr(system, "refs"):
            system.refs = {}
        return system

    return make


def _caching_sut(run: H.Run, instance: api.TargetInstance) -> H.CachingSUT:
    return H.CachingSUT(instance)


def _caching_init(instance: api.TargetInstance) -> dict:
    ex = instance.extras or {}
    alloc = instance.allocator
    policy = ex.get("policy", getattr(alloc, "policy", None))
    if policy is not None and not isinstance(policy, str):
        policy = getattr(policy, "name", policy)
    kw = {"policy": policy, "capacity": instance.capacity, "expandable": bool(ex.get("expandable", getattr(alloc, "expandable", False)))}
    try:  # other policy knobs the target names in extras and the machine's init accepts
        import inspect

        from memspec.spec.caching import CACHING

        params = inspect.signature(CACHING.init).parameters
        kw.update({k: v for k, v in ex.items() if k in params and k not in kw})
    except Exception:  # noqa: BLE001
        pass
    return kw


def applicability(machine: Any, actions_all: list, actions_on: list, observations_all: list, observations_on: list,
                  caps: dict) -> dict:
    """Invariant id -> reason it is N/A: every action and observation that
    exercises it needs a capability the target lacks."""
    na = {}
    for inv in machine.invariants:
        users = [a for a in actions_all if inv.id in a.invariants]
        users += [o for o in observations_all if o.blame == inv.id]
        if not users:
            continue
        live = [a for a in actions_on if inv.id in a.invariants] + [o for o in observations_on if o.blame == inv.id]
        if not live:
            need = sorted({r for u in users for r in u.requires if not caps.get(r)})
            na[inv.id] = ("capability absent: " + ", ".join(need)) if need else "no action exercises it"
    return na


def load_machine(ref: str) -> Any:
    """A spec machine named ``package.module:attr`` (for machines other than the built-in levels)."""
    import importlib
    import os
    import sys

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    mod, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def make_plan(target: str | TargetRef, level: str, *, capacity: int | None = None, timeout: float = 5.0,
              integrity: bool = True, guard_mode: str = "auto", patch_system: Callable | None = None,
              machine: str | None = None) -> H.Plan:
    """Resolve the target, probe a fresh instance for its kind and
    capabilities, and fix the machine, init arguments and applicable actions."""
    tref = resolve(target) if isinstance(target, str) else target
    if tref.factory is None:
        raise LookupError(f"target {tref.name!r} is unavailable: {tref.error}")
    fkw = {"capacity": capacity} if capacity is not None else {}
    try:
        probe = tref.factory(**fkw)
    except Exception as e:  # noqa: BLE001
        raise H.TargetError(f"target {tref.name!r} factory raised {type(e).__name__}: {e}") from e
    try:
        caps = capabilities(probe) if probe.mechanism is not None else {"virtual_backing": False, "shared_mapping": False,
                                                                        "ep": probe.ep is not None, "physical_bytes": False}
        machine_ref = machine
        machine = load_machine(machine_ref) if machine_ref else machine_for(level)
        patch = patch_system or tref.patch_system
        if level == "mechanism":
            init = {"capacity": probe.capacity, "page": _page_of(probe), "virtual_backing": caps["virtual_backing"],
                    "shared_mapping": caps["shared_mapping"]}
            make_sut: Callable = _mechanism_sut
        elif level == "system":
            init = {"capacity": probe.capacity, "page": _page_of(probe), "virtual_backing": caps["virtual_backing"],
                    "shared_mapping": caps["shared_mapping"]}
            make_sut = _system_sut(patch)
        else:
            init = _caching_init(probe)
            make_sut = _caching_sut
    finally:
        c = getattr(probe, "close", None)
        if c is not None:
            try:
                c()
            except Exception:  # noqa: BLE001
                pass
    try:
        import inspect

        if "ep" in inspect.signature(machine.init).parameters and level in ("mechanism", "system"):
            init["ep"] = bool(caps.get("ep"))
    except (TypeError, ValueError):
        pass
    acts = [a for a in machine.actions if all(caps.get(r, False) for r in a.requires)]
    # Heaviest first: Hypothesis favours small choices (and shrinks towards
    # them), so index 0 of the weighted draw should be a main action.
    acts.sort(key=lambda a: -a.weight)
    obs = [o for o in machine.observations if all(caps.get(r, False) for r in o.requires)]
    na = applicability(machine, machine.actions, acts, machine.observations, obs, caps)
    return H.Plan(target=tref.name, level=level, factory=tref.factory, machine=machine, init_kwargs=init,
                  actions=acts, observations=obs, capabilities=caps, na=na, make_sut=make_sut,
                  factory_kwargs=fkw, timeout=timeout, guard_mode=guard_mode, integrity=integrity,
                  mutant=tref.mutant, machine_ref=machine_ref)


# --------------------------------------------------------------------------
# Hypothesis driver
# --------------------------------------------------------------------------

def build_state_machine(plan: H.Plan, guard: H.CallGuard | None = None) -> type:
    """A ``RuleBasedStateMachine`` class for the plan: one rule that draws an
    available action of the spec and runs it on spec and target."""
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, rule

    g = guard or H.CallGuard(plan.timeout, plan.guard_mode)

    class ConformanceMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.run = H.Run(plan, g)
            self._chooser: H.HypothesisChooser | None = None
            self._data: Any = None

        @rule(data=st.data())
        def step(self, data):
            # one chooser per example: every step draws from the same data
            cd = getattr(data, "conjecture_data", data)
            if cd is not self._data:
                self._data = cd
                self._chooser = H.HypothesisChooser(cd)
            signals.step(self.run, self.run.step(self._chooser))  # Hypothesis event()s: action, branch, boundaries

        def teardown(self):
            self.run.teardown()

    safe = "".join(ch if ch.isalnum() else "_" for ch in f"{plan.target}_{plan.level}")
    ConformanceMachine.__name__ = ConformanceMachine.__qualname__ = f"Conformance_{safe}"
    return ConformanceMachine


def hypothesis_settings(profile: str = "ci", *, examples: int | None = None, steps: int | None = None,
                        db: str | None = None, seed: int | None = None, **extra: Any):
    from hypothesis import Verbosity, settings
    from memspec import profiles as _profiles  # noqa: F401 - registers the profiles

    base = settings.get_profile(profile)
    kw: dict[str, Any] = {"verbosity": Verbosity.quiet, "deadline": None, "report_multiple_bugs": True}
    if examples is not None:
        kw["max_examples"] = examples
    if steps is not None:
        kw["stateful_step_count"] = steps
    if db is not None:
        from hypothesis.database import DirectoryBasedExampleDatabase

        kw["database"] = DirectoryBasedExampleDatabase(db)
    if seed is not None:
        kw["derandomize"] = False
    kw.update(extra)
    return settings(base, **kw)


def database_key(plan: H.Plan, flavour: str = "stateful") -> bytes:
    m = plan.mutant.name if plan.mutant is not None else ""
    return f"memspec:{flavour}:{plan.target}:{plan.level}:{m}:{plan.machine.name}".encode()


def _flatten(e: BaseException) -> list[tuple[BaseException, bool]]:
    from hypothesis.errors import FlakyFailure

    if isinstance(e, BaseExceptionGroup):
        flaky = isinstance(e, FlakyFailure)
        out = []
        for sub in e.exceptions:
            out += [(x, flaky or f) for x, f in _flatten(sub)]
        return out
    return [(e, False)]


def collect(result: PlanResult, exc: BaseException) -> None:
    """Sort what a Hypothesis run raised into failures and errors."""
    plan = result.plan
    for e, flaky in _flatten(exc):
        if isinstance(e, H.Violation):
            result.failures.append(Failure(plan.target, plan.level, e.invariant, e.cause, e.reason, e.trace,
                                           plan.stats.first_failure_steps.get(e.invariant), flaky=flaky))
        elif isinstance(e, H.SpecError):
            result.errors.append(f"spec error: {e}")
        elif isinstance(e, H.TargetError):
            result.errors.append(str(e))
        else:
            result.errors.append(f"harness error: {type(e).__name__}: {e}")


class shrink_budget:
    """Bound the time Hypothesis spends shrinking one failure (its engine's
    own limit is 300 s; a conformance run wants its counterexample sooner)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.old = None

    def __enter__(self):
        if self.seconds is not None:
            try:
                from hypothesis.internal.conjecture import engine

                self.old = engine.MAX_SHRINKING_SECONDS
                engine.MAX_SHRINKING_SECONDS = self.seconds
            except (ImportError, AttributeError):  # pragma: no cover
                self.old = None
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            from hypothesis.internal.conjecture import engine

            engine.MAX_SHRINKING_SECONDS = self.old
        return False


#: seconds of shrinking per failure in conform/mutants runs (None: Hypothesis's default)
SHRINK_SECONDS: float | None = 30.0


def run_hypothesis(plan: H.Plan, settings: Any, *, seed: int | None = None,
                   shrink_seconds: float | None = -1) -> PlanResult:
    """Drive the plan's state machine under ``settings``; never raises for a
    target's misbehaviour (it lands in the result)."""
    from hypothesis.stateful import get_state_machine_test

    result = PlanResult(plan.target, plan.level, plan)
    guard = H.CallGuard(plan.timeout, plan.guard_mode)
    cls = build_state_machine(plan, guard)
    if seed is not None:
        cls._hypothesis_internal_use_seed = seed
    test = get_state_machine_test(cls, settings=settings)
    test._hypothesis_internal_database_key = database_key(plan)
    guard.install()
    t0 = time.perf_counter()
    try:
        with shrink_budget(SHRINK_SECONDS if shrink_seconds == -1 else shrink_seconds):
            test()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - everything a target does is a result
        collect(result, e)
    finally:
        guard.uninstall()
        result.seconds = time.perf_counter() - t0
        plan.stats.seconds += result.seconds
    return result


def write_repros(result: PlanResult, out_dir: str, target_name: str | None = None) -> None:
    from memspec.invariants.repro import write_repro

    for f in result.failures:
        try:
            f.repro = str(write_repro(f, result.plan, out_dir, target_name=target_name))
        except Exception as e:  # noqa: BLE001
            result.errors.append(f"could not write a reproduction for {f.invariant}: {type(e).__name__}: {e}")


def conform(target: str, level: str = "all", *, profile: str = "ci", examples: int | None = None,
            steps: int | None = None, seed: int | None = None, db: str | None = None, capacity: int | None = None,
            timeout: float = 5.0, out_dir: str | None = "memspec-out/repro", on_step: Callable | None = None,
            on_plan: Callable | None = None, machine: str | None = None, shrink: bool = True,
            shrink_seconds: float | None = -1) -> list[PlanResult]:
    """Run every applicable level of ``target``; one :class:`PlanResult` per level."""
    results: list[PlanResult] = []
    try:
        tref = resolve(target)
        if tref.factory is None:
            raise LookupError(tref.error or "unavailable")
        probe_kind = _kind_of(tref, capacity)
    except Exception as e:  # noqa: BLE001
        r = PlanResult(target, level, None)
        r.errors.append(f"{type(e).__name__}: {e}")
        return [r]
    lv = levels_for(probe_kind, level)
    if tref.mutant is not None and level == "all":
        lv = [tref.mutant.level]
    if not lv:
        r = PlanResult(target, level, None)
        r.errors.append(f"level {level!r} does not apply to a target of kind {probe_kind!r}")
        return [r]
    extra: dict = {}
    if not shrink:
        from hypothesis import Phase

        extra["phases"] = [Phase.explicit, Phase.reuse, Phase.generate]
    sets = hypothesis_settings(profile, examples=examples, steps=steps, db=db, seed=seed, **extra)
    for lvl in lv:
        try:
            plan = make_plan(tref, lvl, capacity=capacity, timeout=timeout, machine=machine)
        except Exception as e:  # noqa: BLE001
            r = PlanResult(target, lvl, None)
            r.errors.append(f"{type(e).__name__}: {e}")
            results.append(r)
            continue
        plan.on_step = on_step
        if on_plan is not None:
            on_plan(plan)
        res = run_hypothesis(plan, sets, seed=seed, shrink_seconds=shrink_seconds)
        if out_dir:
            write_repros(res, out_dir, target_name=target)
        results.append(res)
    return results


def _kind_of(tref: TargetRef, capacity: int | None) -> str:
    inst = tref.factory(**({"capacity": capacity} if capacity is not None else {}))
    try:
        return getattr(inst, "kind", "mechanism")
    finally:
        c = getattr(inst, "close", None)
        if c is not None:
            try:
                c()
            except Exception:  # noqa: BLE001
                pass
