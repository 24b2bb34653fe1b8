"""The registry of levels: which spec machine checks a target of which kind,
how the run's initial state is parameterised from the target, and what the
machine's ``perform`` functions are handed (the system under test).

This is the only place that names the levels; the engine and the runner
iterate over :data:`LEVELS`.  Adding a level is one :class:`Level` here and
its machine in the spec.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from memspec.invariants.errors import SpecError
from memspec.spec import api


class RefTable:
    """``refs`` + ``ref(id)``: the implementation objects bound to spec ids."""

    def __init__(self) -> None:
        self.refs: dict[int, object] = {}

    def ref(self, ref_id: int) -> object:
        try:
            return self.refs[ref_id]
        except KeyError:
            raise SpecError(f"the spec asked for reference #{ref_id}, which no step bound") from None


class MechanismSUT(RefTable):
    """:class:`~memspec.spec.api.MechanismUnderTest`: the target's mechanism,
    a second independent instance of it (the source of foreign handles), its
    EP if any, and ``physical_bytes()`` counted from the start of the run."""

    def __init__(self, instance: api.TargetInstance, foreign: Any, twin: api.TargetInstance | None) -> None:
        super().__init__()
        self.instance = instance
        self.mechanism = instance.mechanism
        self.foreign = foreign
        self.ep = instance.ep
        self.capacity = instance.capacity
        self._probes = [p for p in (instance.physical_bytes, twin.physical_bytes if twin is not None else None)
                        if p is not None]
        self._base = sum(p() for p in self._probes)

    def physical_bytes(self) -> int:
        """What the device (and a twin built on a device of its own) holds now, less what it held at the start
        (read once per step: the observations of a step share one read)."""
        reads = getattr(self, "reads", None)
        if reads is not None and "physical" in reads:
            return reads["physical"]
        v = sum(p() for p in self._probes) - self._base
        if reads is not None:
            reads["physical"] = v
        return v


class CachingSUT(RefTable):
    """What the caching allocator machine's ``perform`` functions see."""

    def __init__(self, instance: api.TargetInstance) -> None:
        super().__init__()
        self.instance = instance
        self.allocator = instance.allocator
        self.ep = instance.ep
        self.mechanism = instance.mechanism
        self.physical_bytes = instance.physical_bytes
        self.capacity = instance.capacity


# --------------------------------------------------------------------------
# Capabilities and init arguments
# --------------------------------------------------------------------------

def mechanism_capabilities(instance: api.TargetInstance) -> dict[str, bool]:
    """Discover what a fresh instance provides (``None`` = explicitly absent)."""
    mech = instance.mechanism
    vb = mech.virtual_backing() if mech is not None else None
    sm = mech.shared_mapping() if mech is not None else None
    return {
        "virtual_backing": vb is not None,
        "shared_mapping": sm is not None,
        "ep": instance.ep is not None,
        "physical_bytes": instance.physical_bytes is not None,
    }


def caching_capabilities(instance: api.TargetInstance) -> dict[str, bool]:
    caps = mechanism_capabilities(instance) if instance.mechanism is not None else {
        "virtual_backing": False, "shared_mapping": False, "ep": instance.ep is not None,
        "physical_bytes": instance.physical_bytes is not None}
    c = caching_of(instance)
    caps.update({"second_stream": c.streams > 1, "record_stream": bool(c.record_stream),
                 "expandable_segments": bool(c.expandable)})
    return caps


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


def _accepts(fn: Callable, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def geometry_of(instance: api.TargetInstance) -> api.AllocatorGeometry:
    """The allocator geometry the target declares (nothing declared: only
    the seed's rules are checked, the rest measured)."""
    g = instance.geometry
    if g is None:
        return api.UNDECLARED_GEOMETRY
    if not isinstance(g, api.AllocatorGeometry):
        raise TypeError(f"TargetInstance.geometry must be an AllocatorGeometry, not {type(g).__name__}")
    return g


def mechanism_init(machine: Any, instance: api.TargetInstance, caps: dict) -> dict:
    init = {"capacity": instance.capacity, "page": _page_of(instance), "virtual_backing": caps["virtual_backing"],
            "shared_mapping": caps["shared_mapping"]}
    if _accepts(machine.init, "ep"):
        init["ep"] = bool(caps.get("ep"))
    if _accepts(machine.init, "geometry"):
        init["geometry"] = geometry_of(instance)
    if _accepts(machine.init, "replacement_geometry"):
        roles = instance.roles
        brings = roles is not None and roles.extra_mechanism is not None
        init["replacement_geometry"] = geometry_of(instance) if brings else None
    return init


def caching_of(instance: api.TargetInstance) -> api.CachingTarget:
    c = instance.caching
    if not isinstance(c, api.CachingTarget):
        raise TypeError("a caching target must say what its allocator is: TargetInstance.caching="
                        "CachingTarget(policy='pytorch' or 'seed', expandable=..., streams=..., record_stream=...)")
    return c


def caching_init(machine: Any, instance: api.TargetInstance, caps: dict) -> dict:
    c = caching_of(instance)
    kw: dict = {"policy": c.policy, "capacity": instance.capacity, "expandable": bool(c.expandable)}
    for name, value in dict(c.options).items():
        if not _accepts(machine.init, name):
            raise TypeError(f"CachingTarget.options names {name!r}, which the caching machine's init does not take")
        kw[name] = value
    for name, value in (("streams", c.streams), ("record_stream", c.record_stream)):
        if _accepts(machine.init, name):
            kw[name] = value
    return kw


# --------------------------------------------------------------------------
# Systems under test
# --------------------------------------------------------------------------

def mechanism_sut(run: Any, instance: api.TargetInstance) -> MechanismSUT:
    """The target's mechanism and its foreign twin (``make_foreign()``, or a
    second instance from the factory)."""
    api.adopt_legacy_extras(instance)
    twin = None
    if instance.make_foreign is not None:
        foreign = instance.make_foreign()
    else:
        twin = run.plan.factory(**run.plan.factory_kwargs)
        run.foreign = twin
        foreign = twin.mechanism
    return MechanismSUT(instance, foreign, twin)


def system_sut(run: Any, instance: api.TargetInstance) -> Any:
    """The roles of seed 000 around the target: those it brings
    (``TargetInstance.roles``), the reference's for the rest."""
    api.adopt_legacy_extras(instance)
    from memspec.reference.system import build_system

    system = build_system(instance, capacity=instance.capacity)
    if not hasattr(system, "refs"):
        system.refs = {}
    return system


def caching_sut(run: Any, instance: api.TargetInstance) -> CachingSUT:
    api.adopt_legacy_extras(instance)
    return CachingSUT(instance)


# --------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Level:
    """One level: its machine (``module:attr`` in the spec, loaded when
    needed), the target kinds it applies to, how to discover a target's
    capabilities, the machine's init arguments, and the system under test."""

    name: str
    machine_ref: str
    kinds: tuple[str, ...]
    capabilities: Callable[[api.TargetInstance], dict]
    init: Callable[[Any, api.TargetInstance, dict], dict]
    make_sut: Callable[[Any, api.TargetInstance], Any]
    #: draws the device per example (small, or ``planning.LARGE_DEVICE`` times
    #: larger): the system level, where a small device refuses before the
    #: protocols get deep (the caching level's targets keep their own device;
    #: the mechanism level keeps the one device, whose out-of-memory paths are
    #: what it checks)
    sized_device: bool = False

    def machine(self) -> Any:
        import importlib

        mod, _, attr = self.machine_ref.partition(":")
        return getattr(importlib.import_module(mod), attr)


LEVELS: dict[str, Level] = {lv.name: lv for lv in (
    Level("mechanism", "memspec.spec.mechanism:MECHANISM", ("mechanism",), mechanism_capabilities, mechanism_init,
          mechanism_sut),
    Level("system", "memspec.spec.system:SYSTEM", ("mechanism",), mechanism_capabilities, mechanism_init, system_sut,
          sized_device=True),
    Level("caching", "memspec.spec.caching:CACHING", ("caching",), caching_capabilities, caching_init, caching_sut),
)}


def levels_for(kind: str, level: str) -> list[str]:
    """Which levels apply to a target of ``kind`` when ``level`` (or ``"all"``) is asked."""
    return [name for name, lv in LEVELS.items() if kind in lv.kinds and level in ("all", name)]
