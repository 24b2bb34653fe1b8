"""Planning a run: resolve the machine of a level, probe one instance of the
target for its kind and capabilities, and fix everything a run of (target,
level) needs -- the machine, its init arguments, the actions and
observations that apply, and the invariants that are N/A with the reason.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from memspec.invariants.discovery import TargetRef, resolve
from memspec.invariants.engine import Plan
from memspec.invariants.errors import TargetError
from memspec.invariants.levels import LEVELS, levels_for  # noqa: F401 - re-exported
from memspec.invariants.text import safe_repr
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

#: a target's capacity must be below this (what a message from a child carries: wire_fields.MAX_INT)
MAX_CAPACITY = 1 << 63



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
    kind = inst.kind
    # a plain str: a str subclass whose ``__eq__`` says yes to every kind is not a kind
    if type(kind) is not str or kind not in api.TARGET_KINDS:
        of = "" if type(kind) is str else f" of type {type(kind).__name__}"
        raise TargetError(f"target {tref.name!r} has kind {safe_repr(kind, 200)}{of} "
                          f"(one of {', '.join(api.TARGET_KINDS)})")
    cap = inst.capacity
    # the device's bytes are a plain int (no bool, float, NaN or int subclass) that a message can
    # carry (the sizes drawn from it travel in reproductions): a bad one is the target's error
    # here, not a spec error or a lost result later
    if cap is not None and (type(cap) is not int or not 0 < cap < MAX_CAPACITY):
        of = "" if type(cap) is int else f" of type {type(cap).__name__}"
        raise TargetError(f"target {tref.name!r} has capacity {safe_repr(cap, 200)}{of} "
                          f"(a positive int below 2**63, or None)")
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
    learn_init = {**init, "capacity": capacities[-1]} if capacities else init
    faults: set = set()
    groups, templates = learn_protocols(mach, learn_init, acts, faults=faults)
    return Plan(target=tref.name, level=level, factory=tref.factory, machine=mach, init_kwargs=init,
                actions=acts, observations=obs, capabilities=caps, na=na, make_sut=make_sut,
                factory_kwargs=fkw, timeout=timeout, guard_mode=guard_mode, integrity=integrity,
                mutant=tref.mutant, machine_ref=machine_ref, start_checks=start, capacities=capacities,
                protocols=groups, templates={t.name: t for t in templates}, faults=frozenset(faults))


def kind_of(tref: TargetRef, capacity: int | None) -> str:
    probe = build_probe(tref, capacity)
    try:
        return probe.kind
    finally:
        close_probe(probe)


# --------------------------------------------------------------------------
# Protocols: which actions work on the same objects (for the swarm's focus)
# --------------------------------------------------------------------------

#: steps of the spec-only walk that learns which actions name the references others make
LEARN_STEPS = 600
#: a consumer joins a producer's protocol when it named that producer's references this often
LEARN_MIN_NAMED = 3
#: ... and in at least this share of its own draws (an int argument that happens to equal a reference is not)
LEARN_MIN_SHARE = 0.25
#: references are made in increasing order: a returned int further above the newest is a figure, not one
LEARN_REF_GAP = 16
#: an action naming more than this many of one producer's objects per call (on average) names them all at once
LEARN_WIDE = 1.5


def _top_refs(args: dict) -> set:
    out = set()
    for v in args.values():
        if type(v) is int:
            out.add(v)
        elif type(v) is tuple:
            out.update(x for x in v if type(x) is int)
    return out


def _deep_refs(args: dict) -> set:
    """The ints of ``args`` two levels into tuples: an action that names
    every reference of a kind at once (``expire``'s ``(now, the tickets
    issued)``) names them one level below its argument."""
    out = _top_refs(args)
    for v in args.values():
        if type(v) is tuple:
            for x in v:
                if type(x) is tuple:
                    out.update(y for y in x if type(y) is int)
    return out


@dataclass(frozen=True)
class Template:
    """A protocol of the spec as a macro-step (``Run`` plays it as a short
    script of actions): make the objects (``producers``, in the order they
    are needed: the stream a ``use`` names before the allocation), call the
    actions that name them in the order they do over an object's life
    (``consumers``: ``use`` before ``drop``; ``respond`` before ``claim``),
    with the protocol's other actions (``companions``: ``synchronize``,
    ``poll``; an action that names every object at once, ``expire``) at
    drawn places between them.  Learned from the spec alone
    (:func:`learn_protocols`); nothing here names an action."""

    name: str
    producers: tuple
    consumers: tuple
    #: actions that name every object of the kind at once (``expire``: the
    #: tickets issued): played after the consumers, to see each object's end
    sweeps: tuple
    #: the actions that make references anywhere in the spec (``load_weight``
    #: makes a weight's memory): a companion that makes something is played
    #: with the producers, before the consumers that may need it
    makers: tuple = ()


def protocol_groups(machine: Any, init: dict, actions: list, *, steps: int = LEARN_STEPS, seed: int = 0) -> tuple:
    """``((name, frozenset of action names), ...)``: the protocols of the
    spec over one kind of object (see :func:`learn_protocols`)."""
    return learn_protocols(machine, init, actions, steps=steps, seed=seed)[0]


def learn_protocols(machine: Any, init: dict, actions: list, *, steps: int = LEARN_STEPS,
                    seed: int = 0, faults: set | None = None) -> tuple[tuple, tuple]:
    """``(groups, templates)``: the protocols of the spec over one kind of
    object, learned by a seeded walk of the spec alone (witnesses for the
    implementation's answers, as ``memspec spec-check``).

    ``groups`` is ``((name, frozenset of action names), ...)``: for each
    action that makes references (``allocate_owned`` makes allocations),
    the actions that named them in their arguments (``use``, ``drop``) and
    the actions that made the other references those name (``use`` also
    names a stream: ``new_stream``).  ``templates`` is one
    :class:`Template` per group: its consumers ordered by where, on
    average, their accepted calls fall in the life of one object (the
    calls that name it: ``drop`` last), those that name every object at
    once as its sweeps.  Nothing here names an action; a spec the walk
    cannot run (a branch without a witness everywhere) gives what it
    learned until then.

    ``faults``, when given, receives the names of the actions the walk saw
    answer with a failure path (:func:`~memspec.invariants.draws.failure_path`:
    an outcome whose one answer is *any* error of the contract, a failure
    the caller's arguments injected).  The walk draws each action's
    arguments with ``RandomChooser``, so a failure path a domain draws one
    time in five is seen after a few steps of that action."""
    import random

    from memspec.invariants.draws import failure_path

    from memspec.invariants.choosers import RandomChooser
    from memspec.spec.core import Raises, Returns
    from memspec.spec.selfcheck import make_error

    rng = random.Random(seed)
    ch = RandomChooser(rng)
    made: dict = {}       # ref -> the action whose step made it
    named: dict = {}      # producer -> {consumer: times}
    drawn: dict = {}      # action -> times drawn
    life: dict = {}       # ref -> [action names of the accepted steps that named it, in order]
    wide: dict = {}       # (producer, consumer) -> [how many of the producer's refs one step named]
    alive: dict = {}      # producer -> the references it made
    everyone: dict = {}   # (producer, action) -> [draws, draws naming every reference the producer made]
    top = 0               # the newest reference made (references are made in increasing order)
    try:
        s = machine.init(**init)
        for _ in range(steps):
            avail = [a for a in actions if a.available(s)]
            if not avail:
                break
            a = rng.choices(avail, weights=[x.weight for x in avail])[0]
            args = a.draw_args(s, ch)
            drawn[a.name] = drawn.get(a.name, 0) + 1
            refs = _top_refs(args)
            per: dict = {}
            for r in refs:
                p = made.get(r)
                if p is not None and p != a.name:
                    c = named.setdefault(p, {})
                    c[a.name] = c.get(a.name, 0) + 1
                    per[p] = per.get(p, 0) + 1
            for p, k in per.items():
                wide.setdefault((p, a.name), []).append(k)
            deep = _deep_refs(args)
            for p, rs in alive.items():
                # names every object of ``p`` made so far, two levels deep (``expire``'s tickets issued)
                if len(rs) >= 2 and p != a.name:
                    k = everyone.setdefault((p, a.name), [0, 0])
                    k[0] += 1
                    k[1] += rs <= deep
            outs = a.step(s, **args)
            if faults is not None and failure_path(outs) is not None:
                faults.add(a.name)
            bs = [b for b in outs.branches if isinstance(b, Raises) or getattr(b, "witness", None) is not None]
            if not bs:
                continue
            b = bs[rng.randrange(len(bs))]
            res = b.then(b.witness()) if isinstance(b, Returns) else b.then(make_error(b.error))
            if isinstance(b, Returns):
                for r in refs:
                    if r in made and made[r] != a.name:
                        life.setdefault(r, []).append(a.name)
            for r in (res if isinstance(res, tuple) else (res,)):
                # a fresh reference: just above the newest (a count of bytes some steps return is not one)
                if type(r) is int and top < r <= top + LEARN_REF_GAP:
                    made[r] = a.name
                    alive.setdefault(a.name, set()).add(r)
                    top = r
    except Exception:  # noqa: BLE001 - learning is best effort: guidance only
        pass
    consumers = {p: {c for c, n in cs.items() if n >= max(LEARN_MIN_NAMED, LEARN_MIN_SHARE * drawn.get(c, 0))}
                 for p, cs in named.items()}
    producers_of: dict = {}
    for p, cs in consumers.items():
        for c in cs:
            producers_of.setdefault(c, set()).add(p)
    makers = tuple(sorted(set(made.values())))
    # where each consumer's accepted calls fall in an object's life (0: first, 1: last)
    pos: dict = {}
    for r, seq in life.items():
        n = len(seq)
        for i, c in enumerate(seq):
            pos.setdefault((made[r], c), []).append(i / (n - 1) if n > 1 else 0.5)
    out, templates = [], []
    for p in sorted(consumers):
        cs = consumers[p]
        if not cs:
            continue
        group = {p} | cs
        needs: set = set()
        for c in cs:
            needs |= producers_of.get(c, set())
        group |= needs
        out.append((f"objects of {p}", frozenset(group)))
        # one object at a time: an action naming several of the producer's objects per call is a companion
        one = [c for c in cs if c not in needs and sum(wide.get((p, c), [1])) <= LEARN_WIDE * len(wide.get((p, c), [1]))]
        order = sorted(one, key=lambda c: (sum(pos.get((p, c), [0.5])) / len(pos.get((p, c), [0.5])), c))
        every = {c for (q, c), (n, k) in everyone.items() if q == p and n >= LEARN_MIN_NAMED and 2 * k >= n}
        templates.append(Template(f"objects of {p}", tuple(sorted(needs - {p})) + (p,), tuple(order),
                                  tuple(sorted(every - set(one) - needs)), makers))
    return tuple(out), tuple(templates)
