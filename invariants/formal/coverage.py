"""Proof coverage derived from what the spec writes (issue 33, item 1).

A proof of ``memspec prove`` is a Z3 machine of *encoded actions*; which spec
actions each stands for is the hand annotation ``ENCODES``
(:mod:`memspec.invariants.formal.proofs_seed000`).  Checked only against the spec's
own hand annotation (``invariants=(...)`` on each action), a proof could
leave out a spec transition that changes what its invariant reads and still
be called proved.  This module derives the set a proof must encode from the
executable spec itself:

* **write sets** per ``(level, action, branch)``: seeded spec-only walks of
  the two machines of seed 000 (:data:`WALKS`: the coverage walks of the
  formal side's one table, :mod:`memspec.invariants.formal.walks`: the
  mechanism and the system level under each capability configuration, and
  focused walks), each step drawn and followed by the two halves of
  :func:`memspec.spec.selfcheck.spec_step` (a permitted branch, its witness
  value), with a structural snapshot of the state before and after
  the branch (:func:`snapshot`): every field whose value changed is written.
  Granularity ``Record.field`` (the top-level fields of ``MechState`` /
  ``SysState``, the fields of their nested records: ``Owned.state``,
  ``KvRequest.own``, ``Registry.installed``...); a dict or set that gained or
  lost a member is a write of its field, and a record that appeared writes
  every field of its own.  Dicts keyed by holder name (``charged_by``,
  ``physical_by``...) are written per key (``SysState.charged_by[kv]``).
  How often each branch was taken is counted; a branch the spec offered but
  no walk took, and an action no walk drew, are listed (:attr:`Footprints.unreached`):
  what the walks could not show is visible, never silent.
* **read sets** per invariant: each executable invariant of
  :data:`memspec.spec.invariants.ALL` (its ``check`` and its ``full_check``)
  evaluated on a recording proxy of every state the walks visit
  (:class:`_Rec`): each attribute read is logged at the same granularity,
  and a dict read by key logs that key.
* **record counters** (``premature_frees``, ``misreleased``, ...): a field
  an invariant reads that no spec-only step writes is written only where
  an implementation's answer breaks a rule (a forbidden answer, which a
  spec-only walk never takes, and which the proofs model by their unguarded
  variants).  Its writers are found statically (:func:`static_writers`): the
  actions whose step code reaches a ``STORE_ATTR`` of that field (the
  bytecode of the step, of the closures it makes, and of every spec
  function they name).  Each such action is required with the branch
  :data:`FORBIDDEN` -- an over-approximation, by action, never a field left
  unwritten.

A row's **required** actions: every ``level:action`` one of whose branches
writes a field its invariant reads (less :data:`EXCLUDED`); **encoded**: the
spec actions its machine's encoded actions stand for
(:func:`memspec.invariants.formal.proofs_catalog.encoded`, so an action dropped from
the machine drops what it encodes).  A gap is a required action not
encoded: either listed in :data:`KNOWN_GAPS` with its reason (the row is
then "proved over its encoded actions", with ``uncovered``), or unexplained
(the row fails, naming the action and the field).  A known gap that is no
longer a gap is *stale* and fails too, naming the line to delete.
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import random
import re
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from memspec.invariants.formal.walks import RESTART, WALKS as ALL_WALKS, Walk

#: the branch name of a static writer of a record counter (an answer the spec forbids)
FORBIDDEN = "(an answer the spec forbids: static)"

#: fields no required set counts, with the reason (read or written, they say nothing about a rule)
EXCLUDED: dict[str, str] = {
    **{f"{rec}.{f}": why for rec in ("MechState", "SysState") for f, why in (   # fields of both levels
        ("next_ref", "reference-id counter: names objects, no rule reads it"),
        ("w_next_address", "witness support: the spec-only run's address model"),
        ("w_next_identity", "witness support: fresh identities for spec-only witnesses"))},
    "SysState.queue_seq": "queue sequence counter: orders entries, no rule reads it",
    "MechState.w_freed": "witness support: the spec-only run's address model",
    "SysState.w_generation": "witness support: the spec-only run's generation model",
    **{f"MechState.q_{f}": "quality figure (measured, never a verdict)"
       for f in ("allocations", "requested", "footprint", "refused_with_room")},
}

#: Reviewed gaps: ``(row, "level:action", reason)``, one per line.  A row with one is "proved over
#: its encoded actions" and lists the action in ``uncovered``; a gap not listed here fails the row;
#: a line here that is no longer a gap fails too (delete that line).  ``python -m
#: memspec.invariants.formal.coverage`` lists the lines to delete and the gaps with no line.
KNOWN_GAPS: tuple[tuple[str, str, str], ...] = (
    ("S5", "mechanism:reserve_foreign", "makes a reservation S5's full check reads (kind, reported): not in S5's machine"),
    ("S5", "mechanism:shared_reserve", "makes a reservation S5's full check reads (kind, reported): not in S5's machine"),
    ("S5", "system:allocate_owned", "makes an owned object whose creator S5 reads: not in S5's machine"),
    ("S5", "system:load_weight", "makes an owned object whose creator S5 reads: not in S5's machine"),
    ("S5", "system:close_owned", "a binding reservation leaves SysState.reservations: not in S5's machine"),
    ("S5", "system:poll", "a KV request's release runs (state released): not in S5's machine"),
    ("S5", "system:respond", "a KV request's release runs (state released): not in S5's machine"),
    ("S8", "system:cancel_ticket", "ticket holdings move granted (granted = open grants + holdings): not in S8's machine"),
    ("S8", "system:claim", "ticket holdings move to an open grant: not in S8's machine"),
    ("S8", "system:expire", "ticket holdings move granted: not in S8's machine"),
    ("S8", "system:reconfigure", "failed tickets' holdings move granted: not in S8's machine"),
    ("S8", "system:respond", "releases refunded into a ticket (holdings, queued refunds): not in S8's machine"),
    ("S8", "system:decommit_owned", "reservation decommit: the release path is outside S8 (issue 33)"),
    ("S8", "system:drop", "a queued release (live -> queued refunds): not in S8's machine"),
    ("S8", "system:unload_weight", "a queued release (live -> queued refunds): not in S8's machine"),
    ("S8", "system:commit_owned", "a reservation's commit changes its footprint and charge: not in S8's machine"),
    ("S8", "system:kv_grow", "a KV growth changes the store's live bytes and charge: not in S8's machine"),
    ("S8", "system:refund_lease", "a lease refund lowers lease bytes and charge: not in S8's machine"),
    ("S8", "system:poll", "a poll runs queued releases (KV pieces too): kv_release is on S11's machine only; "
                          "on S8's, its unguarded-commit search was refuted or not by the terms built before"),
    ("S13", "system:poll", "S13's keep-pages-for-sharers rule is in no machine: a KV release run (issue 33)"),
    ("S13", "system:respond", "S13's keep-pages-for-sharers rule is in no machine: a KV release run (issue 33)"),
    ("S14", "mechanism:allocate_foreign", "records the twin's identity (duplicate_identities): not S14's on its "
                                          "machine (the queue machine's allocate by the twin is S1's)"),
    ("S14", "mechanism:reserve_foreign", "records the twin's identity (duplicate_identities): not in S14's machine"),
)

#: Reviewed static over-approximations: ``(field, "level:action", reason)``: the bytecode search
#: (:func:`static_writers`) finds a store of the field in code the action reaches, but the action's
#: own call cannot take it.  A line the search no longer reports is stale (delete it).
STATIC_NOT_WRITERS: tuple[tuple[str, str, str], ...] = (
    ("SysState.governor_evictions", "system:unload_weight",
     "unload_weight calls evict(by='holder'): the store runs only for by != 'holder'"),
    ("SysState.hot_evictions", "system:unload_weight",
     "unload_weight calls evict(pressure=False): the store runs only under pressure"),
)


# --------------------------------------------------------------------------
# Snapshots and their differences (write sets)
# --------------------------------------------------------------------------

@functools.cache
def _records() -> tuple[type, ...]:
    """The mutable records of the spec's state (spec/state.py): recursed into field by field."""
    from memspec.spec import state as S

    return tuple(c for c in vars(S).values()
                 if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == S.__name__
                 and not c.__dataclass_params__.frozen)  # type: ignore[attr-defined]


@functools.cache
def _fields_of(cls: type) -> tuple[str, ...]:
    return tuple(x.name for x in dataclasses.fields(cls))


class _Rec(tuple):
    """A record's snapshot: ``(type name, (snapshot of each field))`` (fields: :data:`_NAMED`)."""


class _Map(dict):
    """A dict's (or a ``SortedDict``'s, a ``RefSet``'s) snapshot: key -> snapshot."""


def snapshot(x: Any) -> Any:
    """A structural copy of ``x`` that compares by value: records field by field, dicts key by key,
    sets and lists by their members; a function (a queued entry's ``on_run``) by nothing (its
    effects show in what it writes when it runs)."""
    t = type(x)
    if t in _PLAIN:
        return x
    how = _HOW.get(t)
    if how is None:
        how = _HOW[t] = _how(t)
    return how(x)


_PLAIN = frozenset({int, str, bool, float, type(None)})


def _how(t: type) -> Callable[[Any], Any]:
    """How to snapshot a value of type ``t`` (decided once per type)."""
    if t in _records():
        name, fields = t.__name__, _fields_of(t)
        _NAMED[name] = fields
        return lambda x: _Rec((name, tuple([snapshot(getattr(x, f)) for f in fields])))
    if issubclass(t, dict):   # dict, SortedDict
        return lambda x: _Map({k: snapshot(v) for k, v in x.items()})
    if t.__name__ == "RefSet":
        return lambda x: frozenset(x.items)
    if issubclass(t, (set, frozenset)):
        return frozenset
    if issubclass(t, (list, tuple)):
        return lambda x: tuple(snapshot(v) for v in x)
    if issubclass(t, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return lambda x: "<function>"
    return lambda x: x


_HOW: dict[type, Callable[[Any], Any]] = {}
#: a record type's name -> its fields, in the order of its snapshot's values
_NAMED: dict[str, tuple[str, ...]] = {}


def _new_record_writes(snap: _Rec, out: set[tuple[str, Any]]) -> None:
    name, values = snap
    for f, v in zip(_NAMED[name], values):
        out.add((f"{name}.{f}", None))
        if isinstance(v, _Map):
            for w in v.values():
                if isinstance(w, _Rec):
                    _new_record_writes(w, out)
        elif isinstance(v, _Rec):
            _new_record_writes(v, out)


def _diff_value(where: str, a: Any, b: Any, out: set[tuple[str, Any]]) -> None:
    """The writes that turn snapshot ``a`` of field ``where`` into ``b``."""
    if a == b:
        return
    if isinstance(a, _Rec) and isinstance(b, _Rec) and a[0] == b[0]:
        _diff_record(a, b, out)
        return
    if isinstance(a, _Map) and isinstance(b, _Map):
        keys = set(a) | set(b)
        by_key = all(isinstance(k, str) for k in keys)
        if set(a) != set(b) and not by_key:
            out.add((where, None))   # a member gained or lost
        for k in keys:
            va, vb = a.get(k, _ABSENT), b.get(k, _ABSENT)
            if va == vb:
                continue
            if isinstance(va, _Rec) and isinstance(vb, _Rec) and va[0] == vb[0]:
                _diff_record(va, vb, out)
            else:
                if by_key:
                    out.add((where, k))
                if isinstance(vb, _Rec) and va is _ABSENT:
                    _new_record_writes(vb, out)
                elif not by_key:
                    out.add((where, None))
        return
    out.add((where, None))


_ABSENT = object()


def _diff_record(a: _Rec, b: _Rec, out: set[tuple[str, Any]]) -> None:
    name = a[0]
    for f, va, vb in zip(_NAMED[name], a[1], b[1]):
        if va != vb:
            _diff_value(f"{name}.{f}", va, vb, out)


def writes_between(before: Any, after: Any) -> set[tuple[str, Any]]:
    """``{(Record.field, key or None)}`` the step from snapshot ``before`` to ``after`` wrote."""
    out: set[tuple[str, Any]] = set()
    _diff_record(before, after, out)
    return out


# --------------------------------------------------------------------------
# Recording proxies (read sets)
# --------------------------------------------------------------------------

class _Rd:
    """A recording proxy of a record: each field read is logged as ``(Record.field, None)``; a
    property (``KvRequest.committed``) runs on the proxy, so the fields it reads are logged."""

    __slots__ = ("_o", "_log")

    def __init__(self, o: Any, log: set[tuple[str, Any]]) -> None:
        object.__setattr__(self, "_o", o)
        object.__setattr__(self, "_log", log)

    @property  # type: ignore[misc]
    def __class__(self) -> type:   # isinstance(proxy, SysState) holds
        return type(object.__getattribute__(self, "_o"))

    def __getattr__(self, name: str) -> Any:
        o = object.__getattribute__(self, "_o")
        log = object.__getattribute__(self, "_log")
        cls = type(o)
        attr = getattr(cls, name, None)
        if isinstance(attr, property):
            return attr.fget(self)   # type: ignore[misc]
        v = getattr(o, name)
        where = f"{cls.__name__}.{name}"
        if name in _fields_of(cls):
            if isinstance(v, dict):
                return _RdMap(v, where, log)
            log.add((where, None))
        return _wrap(v, log)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"an invariant wrote {name}: invariants only read")


class _RdMap:
    """A recording proxy of a dict field: a read by a string key (a holder's name) logs that key;
    any other read (iteration, length, an object's ref) logs the whole field."""

    __slots__ = ("_d", "_w", "_log")

    def __init__(self, d: dict, where: str, log: set[tuple[str, Any]]) -> None:
        self._d, self._w, self._log = d, where, log

    def _key(self, k: Any) -> None:
        self._log.add((self._w, k if isinstance(k, str) else None))

    def _all(self) -> None:
        self._log.add((self._w, None))

    def __getitem__(self, k: Any) -> Any:
        self._key(k)
        return _wrap(self._d[k], self._log)

    def get(self, k: Any, default: Any = None) -> Any:
        self._key(k)
        return _wrap(self._d[k], self._log) if k in self._d else default

    def __contains__(self, k: Any) -> bool:
        self._key(k)
        return k in self._d

    def __len__(self) -> int:
        self._all()
        return len(self._d)

    def __bool__(self) -> bool:
        self._all()
        return bool(self._d)

    def __iter__(self) -> Any:
        self._all()
        return iter(list(self._d))

    def keys(self) -> list:
        self._all()
        return list(self._d.keys())

    def values(self) -> list:
        self._all()
        return [_wrap(v, self._log) for v in self._d.values()]

    def items(self) -> list:
        self._all()
        return [(k, _wrap(v, self._log)) for k, v in self._d.items()]


def _wrap(v: Any, log: set[tuple[str, Any]]) -> Any:
    if isinstance(v, _records()):
        return _Rd(v, log)
    if isinstance(v, list):
        return [_wrap(x, log) for x in v]
    return v


def reads_of(fn: Callable[[Any], Any], state: Any) -> set[tuple[str, Any]]:
    """What ``fn`` (an invariant's predicate for ``state``'s level) reads of ``state``."""
    log: set[tuple[str, Any]] = set()
    fn(_Rd(state, log))
    return log


# --------------------------------------------------------------------------
# Static writers of record counters
# --------------------------------------------------------------------------

def _spec_functions() -> dict[str, list[types.CodeType]]:
    """Every function of the spec's modules by name (module-level functions and methods)."""
    import importlib
    import pkgutil

    import memspec.spec as spec_pkg

    out: dict[str, list[types.CodeType]] = {}
    seen: set[int] = set()
    for m in pkgutil.iter_modules(spec_pkg.__path__):
        if m.ispkg:
            continue
        mod = importlib.import_module(f"memspec.spec.{m.name}")
        for v in list(vars(mod).values()):
            cands = [v] + ([x for x in vars(v).values()] if isinstance(v, type) and v.__module__ == mod.__name__ else [])
            for c in cands:
                fn = getattr(c, "fget", c)
                code = getattr(fn, "__code__", None)
                if code is not None and id(code) not in seen and (getattr(fn, "__module__", None) or "").startswith("memspec.spec"):
                    seen.add(id(code))
                    out.setdefault(fn.__name__, []).append(code)
    return out


def _codes_reached(start: Iterable[types.CodeType], funcs: dict[str, list[types.CodeType]]) -> list[types.CodeType]:
    todo, seen, out = list(start), set(), []
    while todo:
        c = todo.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        out.append(c)
        todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]
        for n in c.co_names:
            todo += funcs.get(n, [])
    return out


def _stores(code: types.CodeType) -> set[str]:
    return {i.argval for i in dis.get_instructions(code) if i.opname == "STORE_ATTR"}


def static_writers(machine: Any, attrs: Iterable[str]) -> dict[str, set[str]]:
    """``{action: {attribute}}``: the actions of ``machine`` whose step code (its closures, and every
    spec function they name, transitively) stores one of ``attrs``."""
    want = set(attrs)
    funcs = _spec_functions()
    out: dict[str, set[str]] = {}
    for a in machine.actions:
        got: set[str] = set()
        for c in _codes_reached([a.step.__code__], funcs):
            got |= _stores(c) & want
        if got:
            out[a.name] = got
    return out


# --------------------------------------------------------------------------
# The walks
# --------------------------------------------------------------------------

#: the walks: those of :data:`memspec.invariants.formal.walks.WALKS` with coverage ``steps``
WALKS: tuple[Walk, ...] = tuple(w for w in ALL_WALKS if w.steps)
#: the invariants' reads are recorded on every ``READ_EVERY``-th state of a walk (and at each restart)
READ_EVERY = 5
#: the derivation's seed (fixed: the coverage of a row does not depend on ``memspec prove --seed``)
SEED = 0

Key = tuple[str, str, str]  # (level, action, branch)


@dataclass
class Footprints:
    """What the walks saw: per ``(level, action, branch)`` the fields written and how often it was
    taken; per invariant the fields read."""

    #: ``(level, action, branch) -> {(field, key)}``
    writes: dict[Key, set[tuple[str, Any]]] = field(default_factory=dict)
    taken: dict[Key, int] = field(default_factory=dict)
    #: branches the spec offered and no walk took (no witness, or never drawn)
    offered: dict[Key, int] = field(default_factory=dict)
    #: ``level:action`` drawn at least once
    drawn: dict[str, int] = field(default_factory=dict)
    actions: list[str] = field(default_factory=list)
    #: invariant id -> {(field, key)}
    reads: dict[str, set[tuple[str, Any]]] = field(default_factory=dict)
    #: read fields no step wrote, and the actions that store them statically (``level:action``)
    static: dict[str, list[str]] = field(default_factory=dict)
    #: ``(field, level:action)`` of :data:`STATIC_NOT_WRITERS` the static search did report (and so set aside)
    static_excluded: list[tuple[str, str]] = field(default_factory=list)
    steps: int = 0

    @property
    def unreached(self) -> list[str]:
        """Actions no walk drew, and branches the spec offered that no walk took."""
        out = [a for a in self.actions if a not in self.drawn]
        out += [f"{lvl}:{a} / {b}" for (lvl, a, b) in sorted(self.offered) if (lvl, a, b) not in self.taken]
        return out


_NUM = re.compile(r"0x[0-9a-fA-F]+|\d+")
_SEQ = re.compile(r"N(, N)+")  # a list of figures (the pending tickets [N, N, N]): one kind, whatever its length


def _label(branch: Any) -> str:
    """A branch by its kind: ``raises <Error> (<why>)`` or ``returns <what>``, every number written N."""
    from memspec.spec.core import Raises

    if isinstance(branch, Raises):
        return f"raises {branch.error.__name__}" + (f" ({_SEQ.sub('N...', _NUM.sub('N', branch.describe))})"
                                                    if branch.describe else "")
    return "returns " + _SEQ.sub("N...", _NUM.sub("N", branch.describe))


def _invariant_fns(state: Any) -> list[tuple[str, Callable[[Any], Any]]]:
    from memspec.spec.invariants import ALL

    out = []
    for inv in ALL:
        for chk in (inv.check, inv.full_check):
            if chk is None:
                continue
            levels = getattr(chk, "levels", None)
            fn = levels.get(type(state)) if levels is not None else chk
            if fn is not None:
                out.append((inv.id, fn))
    return out


def derive(seed: int = SEED, walks: tuple[Walk, ...] = WALKS, machines: dict[str, Any] | None = None,
           scale: float = 1.0) -> Footprints:
    """Walk each of ``walks`` (seeded; ``scale`` times its steps) and record the footprints.
    ``machines``: ``{level: machine}`` in place of the spec's (a test's planted action)."""
    from memspec.invariants.formal.proofs_catalog import machines as spec_machines
    from memspec.spec.core import RandomChooser
    from memspec.spec.selfcheck import draw_branch, follow, pick_action, usable

    fp = Footprints()
    mach = {lvl: (machines or {}).get(lvl) or spec_machines()[lvl] for lvl in sorted({w.level for w in walks})}
    for lvl, m in mach.items():
        fp.actions += [f"{lvl}:{a.name}" for a in m.actions]
    for k, walk in enumerate(walks):
        lvl, kw = walk.level, walk.init
        m = mach[lvl]
        acts = [a for a in m.actions if not walk.focus or a.name in walk.focus]
        rng = random.Random(seed * 1000 + k)
        chooser = RandomChooser(rng)
        fns: list[tuple[str, Callable[[Any], Any]]] = []
        state: Any = None
        before: Any = None
        for i in range(int(walk.steps * scale)):
            if state is None or i % RESTART == 0:
                state = m.init(**kw)
                fns = _invariant_fns(state)
                before = snapshot(state)
            if i % READ_EVERY == 0:
                for inv_id, fn in fns:
                    fp.reads.setdefault(inv_id, set()).update(reads_of(fn, state))
            options = [a for a in acts if usable(a, state)]
            if not options:
                state = None
                continue
            act = pick_action(options, rng)
            fp.drawn[f"{lvl}:{act.name}"] = fp.drawn.get(f"{lvl}:{act.name}", 0) + 1
            _args, outs, b = draw_branch(act, state, chooser)
            for ob in outs.branches:
                key = (lvl, act.name, _label(ob))
                fp.offered[key] = fp.offered.get(key, 0) + 1
            if b is None:
                continue
            follow(b)
            key = (lvl, act.name, _label(b))
            fp.taken[key] = fp.taken.get(key, 0) + 1
            after = snapshot(state)
            fp.writes.setdefault(key, set()).update(writes_between(before, after))
            before = after
            fp.steps += 1
    _add_static(fp, mach)
    return fp


def _add_static(fp: Footprints, machines: dict[str, Any]) -> None:
    """Record counters: top-level fields an invariant reads that no walk step wrote; their writers
    found statically, required with the branch :data:`FORBIDDEN`."""
    written = {f for ws in fp.writes.values() for f, _k in ws}
    read = {f for rs in fp.reads.values() for f, _k in rs}
    state_type = {"mechanism": "MechState", "system": "SysState"}
    for lvl, m in machines.items():
        tname = state_type.get(lvl)
        unwritten = {f.split(".", 1)[1] for f in read - written if f.startswith(f"{tname}.") and f not in EXCLUDED}
        if not unwritten:
            continue
        for act, attrs in static_writers(m, unwritten).items():
            for a in sorted(attrs):
                if (f"{tname}.{a}", f"{lvl}:{act}") in _NOT_WRITERS:
                    attrs = attrs - {a}
                    fp.static_excluded.append((f"{tname}.{a}", f"{lvl}:{act}"))
            if not attrs:
                continue
            key = (lvl, act, FORBIDDEN)
            fp.writes.setdefault(key, set()).update((f"{tname}.{a}", None) for a in attrs)
            for a in attrs:
                fp.static.setdefault(f"{tname}.{a}", []).append(f"{lvl}:{act}")


_NOT_WRITERS = {(f, a) for f, a, _why in STATIC_NOT_WRITERS}

_CACHE: dict[Any, tuple[tuple[Any, ...], Footprints]] = {}


def footprints() -> Footprints:
    """The derivation, once per process and catalog (seeded: the same every time).  The key is the
    invariants of :data:`memspec.spec.invariants.ALL` as they are now (id and check functions): one added
    or replaced since (an engineer's scratch S16, a test's) has no read set in a derivation made before it,
    so it gets a derivation of its own."""
    from memspec.invariants.formal.proofs import memo
    from memspec.spec.invariants import ALL

    key = tuple((inv.id, id(inv.check), id(inv.full_check)) for inv in ALL)
    # the invariants kept alive with it: their ids stay theirs
    return memo(_CACHE, key, lambda: (tuple(ALL), derive()))[1]


# --------------------------------------------------------------------------
# Coverage of a proof's machine
# --------------------------------------------------------------------------

def field_name(f: tuple[str, Any]) -> str:
    """``SysState.charged_by[kv]`` for a write or read of one holder's key, else ``Record.field``."""
    return f"{f[0]}[{f[1]}]" if f[1] is not None else f[0]


def _meets(w: tuple[str, Any], reads: dict[str, set[Any]]) -> bool:
    """A write ``(field, key)`` changes what the reads ``{field: {keys}}`` (``None``: every key) saw."""
    keys = reads.get(w[0])
    if keys is None:
        return False
    return w[1] is None or None in keys or w[1] in keys


@dataclass
class Gap:
    """A spec action that writes what a row's invariant reads and that its machine does not encode."""

    action: str                      # "level:action"
    #: branch -> the fields it writes that the invariant reads
    branches: dict[str, list[str]]
    known: str | None = None         # the reason, where :data:`KNOWN_GAPS` lists it

    @property
    def fields(self) -> list[str]:
        return sorted({f for fs in self.branches.values() for f in fs})

    def describe(self, inv: str) -> str:
        how = "; ".join(f"{b}: {', '.join(fs)}" for b, fs in sorted(self.branches.items()))
        return f"{self.action} writes {', '.join(self.fields)}, which {inv} reads ({how})"


@dataclass
class RowCoverage:
    """A row's derived coverage: what its invariant reads, the spec actions (and branches) that write
    it, those its machine encodes, the gaps, and :data:`KNOWN_GAPS` lines that are stale."""

    row: str
    invariant: str
    reads: list[str]
    #: ``level:action`` -> branch -> fields written that the invariant reads
    required: dict[str, dict[str, list[str]]]
    encoded: list[str]
    gaps: list[Gap]
    stale: list[str]

    @property
    def uncovered(self) -> list[str]:
        """The reviewed gaps (:data:`KNOWN_GAPS`): the row is proved over its encoded actions only."""
        return [g.action for g in self.gaps if g.known is not None]

    @property
    def unexplained(self) -> list[Gap]:
        return [g for g in self.gaps if g.known is None]

    @property
    def problems(self) -> list[str]:
        """What fails the row: an unexplained gap, a stale :data:`KNOWN_GAPS` line."""
        out = [f"NOT COVERED (no reviewed reason): {g.describe(self.invariant)}; {self.row}'s machine encodes "
               f"no action for it (add one to ENCODES, or a line to KNOWN_GAPS in {_HERE}: "
               f'("{self.row}", "{g.action}", "<why it is not encoded>"),)' for g in self.unexplained]
        return out + self.stale

    def as_json(self) -> dict[str, Any]:
        return {"invariant": self.invariant, "reads": self.reads, "required": sorted(self.required),
                "required_branches": self.required, "encoded": self.encoded,
                "gaps": [{"action": g.action, "fields": g.fields, "branches": g.branches, "known": g.known}
                         for g in self.gaps],
                "uncovered": self.uncovered, "unexplained": [g.action for g in self.unexplained],
                "stale_known_gaps": self.stale}


_HERE = "invariants/formal/coverage.py"


def known_gap_line(row: str, action: str) -> int | None:
    """The line of this module holding ``(row, action, ...)`` in :data:`KNOWN_GAPS` (or ``(field, action,
    ...)`` in :data:`STATIC_NOT_WRITERS`)."""
    import os

    text = f'("{row}", "{action}"'
    try:
        with open(os.path.realpath(__file__)) as fh:
            return next((n for n, line in enumerate(fh, 1) if text in line), None)
    except OSError:
        return None


def _where(first: str, second: str) -> str:
    """``invariants/formal/coverage.py:<line>`` of the table line that starts ``("first", "second"``."""
    line = known_gap_line(first, second)
    return f"{_HERE}:{line}" if line else _HERE


def row_coverage(p: Any, fp: Footprints | None = None,
                 known: tuple[tuple[str, str, str], ...] | None = None) -> RowCoverage:
    """The derived coverage of proof ``p`` (its machine's actions, as they are now: an action dropped
    from ``p.actions`` no longer encodes anything)."""
    from memspec.invariants.formal.proofs_catalog import encoded

    fp = fp if fp is not None else footprints()
    known = KNOWN_GAPS if known is None else known
    inv = getattr(p, "declared_by", p.id)
    reads: dict[str, set[Any]] = {}
    for f, k in fp.reads.get(inv, set()):
        if f not in EXCLUDED:
            reads.setdefault(f, set()).add(k)
    required: dict[str, dict[str, list[str]]] = {}
    for (lvl, act, branch), ws in sorted(fp.writes.items()):
        hit = sorted({field_name(w) for w in ws if w[0] not in EXCLUDED and _meets(w, reads)})
        if hit:
            required.setdefault(f"{lvl}:{act}", {})[branch] = hit
    enc = encoded(p)
    mine = {a: why for r, a, why in known if r == p.id}
    gaps = [Gap(a, bs, mine.get(a)) for a, bs in sorted(required.items()) if a not in enc]
    gapped = {g.action for g in gaps}
    stale = []
    for a in sorted(mine):
        if a not in gapped:
            why = (f"{p.id}'s machine encodes it" if a in enc else
                   f"nothing {a} writes is read by {inv}" if a not in required else "")
            stale.append(f"STALE known gap: ({p.id!r}, {a!r}) is no longer a gap ({why}): delete its line "
                         f"in KNOWN_GAPS at {_where(p.id, a)}")
    return RowCoverage(p.id, inv, sorted(field_name((f, k)) for f, ks in reads.items() for k in ks),
                       required, enc, gaps, stale)


def table_problems(rows: Iterable[str], known: tuple[tuple[str, str, str], ...] | None = None) -> list[str]:
    """Lines of :data:`KNOWN_GAPS` that name no row of ``rows``, no spec action, or repeat a line."""
    from memspec.invariants.formal.proofs_catalog import machines

    known = KNOWN_GAPS if known is None else known
    names = {f"{lvl}:{a.name}" for lvl, m in machines().items() for a in m.actions}
    rows = set(rows)
    out, seen = [], set()
    for r, a, why in known:
        where = _where(r, a)
        if r not in rows:
            out.append(f"KNOWN_GAPS line ({r!r}, {a!r}) at {where} names no proof row")
        if a not in names:
            out.append(f"KNOWN_GAPS line ({r!r}, {a!r}) at {where} names no spec action")
        if (r, a) in seen:
            out.append(f"KNOWN_GAPS line ({r!r}, {a!r}) at {where} is listed twice")
        if not why.strip():
            out.append(f"KNOWN_GAPS line ({r!r}, {a!r}) at {where} gives no reason")
        seen.add((r, a))
    return out


def static_problems(fp: Footprints | None = None) -> list[str]:
    """Lines of :data:`STATIC_NOT_WRITERS` the static search no longer reports (stale: delete them)."""
    fp = fp if fp is not None else footprints()
    out = []
    for f, a, _why in STATIC_NOT_WRITERS:
        if (f, a) not in fp.static_excluded:
            out.append(f"STALE static exclusion: ({f!r}, {a!r}) is no longer found by the static search: delete "
                       f"its line in STATIC_NOT_WRITERS at {_where(f, a)}")
    return out


def main() -> int:
    """``python -m memspec.invariants.formal.coverage``: every row's derived coverage against
    :data:`KNOWN_GAPS`: the lines to delete (stale) and the gaps with no line (to encode, or to review
    and add), then what the walks did not reach.  Exit 1 when the table needs an edit."""
    from memspec.invariants.formal.proofs_catalog import all_proofs

    fp = footprints()
    bad = table_problems([p.id for p in all_proofs()]) + static_problems(fp)
    for p in all_proofs():
        cov = row_coverage(p, fp)
        print(f"{p.id}: {len(cov.required)} required, {len(cov.uncovered)} reviewed gap(s)"
              + (f": {', '.join(cov.uncovered)}" if cov.uncovered else ""))
        bad += cov.problems
    print("\n".join(bad) if bad else "KNOWN_GAPS matches the proofs' machines")
    print(f"walks: {fp.steps} steps; unreached: {', '.join(fp.unreached) or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
