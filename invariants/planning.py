"""Planning a run: resolve the machine of a level, probe one instance of the
target for its kind and capabilities, and fix everything a run of (target,
level) needs -- the machine, its init arguments, the actions and
observations that apply, and the invariants that are N/A with the reason.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

from memspec.invariants.discovery import TargetRef, resolve
from memspec.invariants.engine import Plan
from memspec.invariants.errors import TargetError
from memspec.invariants.levels import LEVELS, levels_for  # noqa: F401 - re-exported
from memspec.spec import api


def machine_for(level: str) -> Any:
    try:
        return LEVELS[level].machine()
    except KeyError:
        raise ValueError(f"unknown level {level!r} (one of {', '.join(LEVELS)})") from None


def load_machine(ref: str) -> Any:
    """A spec machine named ``package.module:attr`` (for machines other than the built-in levels)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    mod, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def applicability(machine: Any, actions_all: list, actions_on: list, observations_all: list, observations_on: list,
                  caps: dict) -> dict:
    """Invariant id -> reason it is N/A: the invariant needs a capability the
    target lacks (``Invariant.requires``), or every action and observation
    that exercises it does."""
    na = {}
    for inv in machine.invariants:
        lacking = [r for r in getattr(inv, "requires", ()) if not caps.get(r)]
        if lacking:
            na[inv.id] = "capability absent: " + ", ".join(lacking)
            continue
        users = [a for a in actions_all if inv.id in a.invariants]
        users += [o for o in observations_all if o.blame == inv.id]
        if not users:
            continue
        live = [a for a in actions_on if inv.id in a.invariants] + [o for o in observations_on if o.blame == inv.id]
        if not live:
            need = sorted({r for u in users for r in u.requires if not caps.get(r)})
            na[inv.id] = ("capability absent: " + ", ".join(need)) if need else "no action exercises it"
    return na


#: per-example device capacity: a run given ``capacity`` draws, per example,
#: that device or one this many times larger (:attr:`~memspec.invariants.engine.Plan.capacities`).
#: Measured on the reference at the system level (100 examples x 40 steps,
#: 16 MiB): GrantDenied/OutOfMemory refusals fall from 17% to 9-10% of the
#: steps, and the out-of-memory paths of the small device are still taken.
LARGE_DEVICE = 4



def build_probe(tref: TargetRef, capacity: int | None) -> api.TargetInstance:
    """One instance of the target, to learn its kind and capabilities."""
    fkw = {"capacity": capacity} if capacity is not None else {}
    try:
        inst = tref.factory(**fkw)
    except Exception as e:  # noqa: BLE001
        raise TargetError(f"target {tref.name!r} factory raised {type(e).__name__}: {e}") from e
    if not isinstance(inst, api.TargetInstance):
        raise TargetError(f"target {tref.name!r} factory returned {type(inst).__name__}, not a TargetInstance")
    api.adopt_legacy_extras(inst)
    if inst.kind not in api.TARGET_KINDS:
        raise TargetError(f"target {tref.name!r} has kind {inst.kind!r} (one of {', '.join(api.TARGET_KINDS)})")
    return inst


def close_probe(probe: Any) -> None:
    c = getattr(probe, "close", None)
    if c is not None:
        try:
            c()
        except Exception:  # noqa: BLE001 - closing a probe is not judged
            pass


def make_plan(target: str | TargetRef, level: str, *, capacity: int | None = None, timeout: float = 5.0,
              integrity: bool = True, guard_mode: str = "auto", machine: str | None = None,
              probe: api.TargetInstance | None = None) -> Plan:
    """Fix the machine, init arguments and applicable actions of ``target``
    at ``level``, from ``probe`` (one instance of the target; made and
    closed here when not given)."""
    tref = resolve(target) if isinstance(target, str) else target
    if tref.factory is None:
        raise LookupError(f"target {tref.name!r} is unavailable: {tref.error}")
    lv = LEVELS.get(level)
    if lv is None:
        raise ValueError(f"unknown level {level!r} (one of {', '.join(LEVELS)})")
    fkw = {"capacity": capacity} if capacity is not None else {}
    own = probe is None
    if own:
        probe = build_probe(tref, capacity)
    try:
        caps = lv.capabilities(probe)
        machine_ref = machine
        mach = load_machine(machine_ref) if machine_ref else lv.machine()
        init = lv.init(mach, probe, caps)
    finally:
        if own:
            close_probe(probe)
    acts = [a for a in mach.actions if all(caps.get(r, False) for r in a.requires)]
    # Heaviest first: Hypothesis favours small choices (and shrinks towards
    # them), so index 0 of the weighted draw should be a main action.
    acts.sort(key=lambda a: -a.weight)
    obs = [o for o in mach.observations if all(caps.get(r, False) for r in o.requires)]
    start = [o for o in getattr(mach, "start_checks", ()) if all(caps.get(r, False) for r in o.requires)]
    na = applicability(mach, mach.actions, acts, mach.observations, obs, caps)
    make_sut: Callable = lv.make_sut
    capacities: tuple = ()
    if capacity is not None and lv.sized_device and init.get("capacity") == capacity:
        capacities = (capacity, capacity * LARGE_DEVICE)
    return Plan(target=tref.name, level=level, factory=tref.factory, machine=mach, init_kwargs=init,
                actions=acts, observations=obs, capabilities=caps, na=na, make_sut=make_sut,
                factory_kwargs=fkw, timeout=timeout, guard_mode=guard_mode, integrity=integrity,
                mutant=tref.mutant, machine_ref=machine_ref, start_checks=start, capacities=capacities)


def kind_of(tref: TargetRef, capacity: int | None) -> str:
    probe = build_probe(tref, capacity)
    try:
        return probe.kind
    finally:
        close_probe(probe)
