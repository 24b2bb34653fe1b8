"""Invariant strength off the reachable states: the executable invariant and its encoding compared on
*perturbed* spec states (issue 33, "a weakened executable check").

The agreement walk (:func:`memspec.invariants.formal.agreement.walk_and_compare`) compares the executable
invariant (``memspec.spec.invariants``) with the encoded one on projections of *reachable* states,
where both hold: an executable check with a conjunct dropped still holds there, and nothing notices.
Here each sampled state is copied and one leaf of the copy changed at a time (an ``int``: +-1,
+-page or 0; a ``bool``: flipped; an ``int`` element of a set: moved by one of those), giving states
near the reachable ones, mostly unreachable; on each

* the executable invariant (``check``, what every conformance step asserts) is evaluated on the
  perturbed spec state, and
* the encoding on the perturbed state's projection (the adapter's own ``project``): the row's
  *named* invariant (:func:`memspec.invariants.formal.proofs.named_of`, without the auxiliary and ghost
  conjuncts an inductive invariant needs) and its whole inductive invariant.

Two disagreements are counted:

* **executable weaker**: the executable invariant holds but the named encoding fails.  The named
  invariant is the rule the executable check states, read on the projection; a perturbation it
  rejects and the check accepts is a state the check lets through.  Fails the row.
* **encoding weaker**: the executable invariant fails but the whole inductive encoding holds (a field
  the projection does not carry, e.g. a running total the encoding recomputes from the records, or
  a rule the encoding does not state): a figure on the row, not a failure (it fires on the unbroken
  spec wherever the check reads a field the projection leaves out).

A state keeps aggregates next to the records they sum (``open_grants`` beside the grants, a
handle's ``mappings`` beside the mapping records): the executable check reads the aggregate, the
projection the records.  A perturbation of such a *record* is no evidence about the check (it
makes the aggregate stale, a state no transition produces, and the executable check is not meant to
recompute it: ``full_check`` does).  :data:`SHADOWED` lists, per invariant, the leaf patterns of
that kind; they are still perturbed (for the figure) but an "executable weaker" verdict on them is
counted apart (``shadowed``) and does not fail the row.  The list was read off the unbroken spec
(a test checks that every entry is needed and that nothing else fires).

Which leaf: the leaves of the state are grouped by *pattern* (the path with each dictionary key and
list index written ``*``: ``grants.*.nbytes``); a row walks the sorted patterns of the states it is
given in turn (so every field is perturbed, whatever its share of the leaves), the instance and the
new value drawn from a ``random.Random`` seeded by the walk: deterministic in the walk's seed,
nothing depends on time.  A projection that raises or returns ``None`` on a perturbed state (an
object that no longer exists, a count out of the encoding's scope) is skipped and counted.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any, Callable, Iterator

#: fields never perturbed: not state the invariants read (the target's geometry, witness support,
#: quality figures, the implementation objects behind references, what a queue entry runs)
SKIP_FIELDS = frozenset({"geometry", "replacement_geometry", "identities", "identity", "on_run", "obj",
                         "w_next_address", "w_next_identity", "w_generation", "w_freed", "next_ref",
                         "q_allocations", "q_requested", "q_footprint", "q_refused_with_room", "in_poll"})

#: perturbations tried per sampled state (per row still short of invariant samples)
PER_STATE = 3

#: invariant -> the state's fields (a pattern, or a prefix of patterns: ``grants`` covers
#: ``grants.*.nbytes``) whose leaves the executable check reads only through another field: a running
#: total the transitions keep beside the records (the check reads the total, the projection the
#: records), or a record a transition leaves when it breaks the rule (the check reads that record;
#: the encoding states the rule on the state).  Perturbing such a leaf makes a state no transition
#: produces and says nothing about the check: an "executable weaker" verdict there is counted apart
#: (``shadowed``), not as a disagreement.  Read off the unbroken spec; a test checks that the unbroken
#: walk has no other "executable weaker" verdict and that every entry here is needed.
SHADOWED: dict[str, tuple[str, ...]] = {
    # the fence progress a release is judged by is read when it runs (premature_frees), not after
    "S4": ("streams",),
    # the ledger totals (open_grants, tickets_held, live/queued/lease bytes by holder) beside the records
    "S8": ("grants", "kv", "leases", "owned", "queue", "tickets"),
    # a commit/decommit that moves a base address leaves moved_addresses; the addresses are not re-read
    "S12": ("owned",),
    # a handle's mapping count beside the mapping records
    "S13": ("mappings",),
    # live_count and the address index beside the allocation records
    "S14": ("allocations", "by_address"),
}


def is_shadowed(inv: str, pattern: str) -> bool:
    return any(pattern == f or pattern.startswith(f + ".") for f in SHADOWED.get(inv, ()))

Path = tuple[tuple[str, Any], ...]   # ("a", attribute) | ("i", key or index) | ("e", set element)


def _children(obj: Any) -> Iterator[tuple[tuple[str, Any], Any]]:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            if f.name not in SKIP_FIELDS:
                yield ("a", f.name), getattr(obj, f.name)
    elif isinstance(obj, dict):
        for k in sorted(obj, key=repr):
            yield ("i", k), obj[k]
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield ("i", i), v


def leaves(state: Any, max_depth: int = 6) -> dict[str, list[Path]]:
    """Every perturbable leaf of ``state`` (``int`` and ``bool`` values of dataclass fields, dict
    values and list items; ``int`` elements of sets), by pattern, in a deterministic order."""
    out: dict[str, list[Path]] = {}
    seen: set[int] = set()

    def pat(path: Path) -> str:
        return ".".join(str(x) if k == "a" else "*" for k, x in path)

    def go(obj: Any, path: Path, depth: int) -> None:
        if isinstance(obj, bool) or (isinstance(obj, int) and path):
            out.setdefault(pat(path), []).append(path)
            return
        if isinstance(obj, (set, frozenset)):
            ints = sorted(x for x in obj if isinstance(x, int) and not isinstance(x, bool))
            for x in ints:
                out.setdefault(pat(path + (("e", None),)), []).append(path + (("e", x),))
            return
        if depth >= max_depth or id(obj) in seen:
            return
        if not (isinstance(obj, (dict, list)) or (dataclasses.is_dataclass(obj) and not isinstance(obj, type))):
            return
        seen.add(id(obj))
        for step, child in _children(obj):
            go(child, path + (step,), depth + 1)

    go(state, (), 0)
    return out


def _get(obj: Any, step: tuple[str, Any]) -> Any:
    kind, key = step
    return getattr(obj, key) if kind == "a" else obj[key]


def _set(obj: Any, step: tuple[str, Any], value: Any) -> None:
    kind, key = step
    if kind == "a":
        object.__setattr__(obj, key, value)   # frozen records too (the copy is ours)
    else:
        obj[key] = value


def values(v: Any, page: int) -> list[Any]:
    """The values a leaf holding ``v`` is moved to."""
    if isinstance(v, bool):
        return [not v]
    out = []
    for x in (v + 1, v - 1, v + page, v - page, 0):
        if x != v and x not in out:
            out.append(x)
    return out


def _resolve(state: Any, path: Path) -> Any:
    obj = state
    for step in path[:-1]:
        obj = _get(obj, step)
    return obj


def read(state: Any, path: Path) -> Any:
    """The value at ``path`` (a set element: the element)."""
    kind, key = path[-1]
    return key if kind == "e" else _get(_resolve(state, path), path[-1])


def write(state: Any, path: Path, new: Any) -> Callable[[], None] | None:
    """Set the leaf at ``path`` to ``new`` in place; the undo (``None``: not applicable, e.g. a set
    that already holds ``new``)."""
    parent = _resolve(state, path)
    kind, key = path[-1]
    if kind == "e":
        if new in parent:
            return None
        parent.discard(key)
        parent.add(new)

        def undo_set() -> None:
            parent.discard(new)
            parent.add(key)
        return undo_set
    old = _get(parent, path[-1])
    _set(parent, path[-1], new)
    return lambda: _set(parent, path[-1], old)


def describe(path: Path) -> str:
    out = ""
    for kind, key in path:
        out += f".{key}" if kind == "a" else f"[{key!r}]" if kind == "i" else f"{{{key!r}}}"
    return out.lstrip(".")


class Perturber:
    """Which leaves to perturb, row by row: each row walks the sorted patterns of the states it is
    given in turn; the instance of a pattern and its new value are drawn from its own
    ``random.Random(seed)`` (never the walk's: the walk draws the same steps with or without it)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.last: dict[str, str] = {}   # row -> the pattern it perturbed last

    def pick(self, row: str, state: Any, n: int, page: int,
             lv: dict[str, list[Path]] | None = None) -> list[tuple[str, Path, Any]]:
        """``n`` perturbations of ``state`` for ``row``: (pattern, leaf, new value); ``lv``: its
        :func:`leaves`, where the caller has them."""
        lv = leaves(state) if lv is None else lv
        pats = sorted(lv)
        if not pats:
            return []
        last = self.last.get(row)
        start = next((i for i, p in enumerate(pats) if last is None or p > last), 0)
        out = []
        for k in range(min(n, len(pats))):
            p = pats[(start + k) % len(pats)]
            path = self.rng.choice(lv[p])
            new = self.rng.choice(values(read(state, path), page))
            out.append((p, path, new))
            self.last[row] = p
        return out


def perturbed(state: Any, picks: list[tuple[str, Path, Any]], check: Callable[[Any], str | None],
              project: Callable[[Any], Any], evaluate: Callable[[str, str, Any, str | None], None],
              copy_of: Callable[[], Any] | None = None) -> int:
    """Apply each pick to a copy of ``state`` (one deep copy, each pick undone before the next);
    ``evaluate(pattern, where, projection, exec_why)`` on each perturbed state while it is applied
    (``projection`` None: the projection raised or declined).  The skips (a pick not applicable, or
    the executable check raising on the perturbed state)."""
    base = copy_of() if copy_of is not None else copy.deepcopy(state)
    skipped = 0
    for pattern, path, new in picks:
        old = read(base, path)
        undo = write(base, path, new)
        if undo is None:
            skipped += 1
            continue
        try:
            try:
                why = check(base)
            except Exception:  # noqa: BLE001 - the check does not read this state: no verdict
                skipped += 1
                continue
            try:
                pr = project(base)
            except Exception:  # noqa: BLE001 - outside the projection's scope
                pr = None
            evaluate(pattern, f"{describe(path)}: {old!r} -> {new!r}", pr, why)
        finally:
            undo()
    return skipped


def strength(reps: list[Any], inv: str) -> dict[str, Any]:
    """Row ``inv``'s figures of the comparison on perturbed states, over its agreement reports."""
    mine = [r for r in reps if r.invariant == inv]
    by_level: dict[str, dict[str, int]] = {}
    enc_weaker: dict[str, int] = {}
    for r in mine:
        for k, n in r.enc_weaker.items():
            enc_weaker[k] = enc_weaker.get(k, 0) + n
        if r.level:
            d = by_level.setdefault(r.level, {"perturbed": 0, "executable_rejects": 0, "encoding_rejects": 0})
            d["perturbed"] += r.perturbed
            d["executable_rejects"] += r.exec_rejected
            d["encoding_rejects"] += len(r.exec_weaker) + r.shadowed
    weaker = [m for r in mine for m in r.exec_weaker]
    # perturbed states the encoding rejects: with the executable invariant (it rejected them and the
    # whole encoding did not accept them), or without it (weaker or shadowed)
    both = sum(r.exec_rejected for r in mine) - sum(enc_weaker.values())
    rejects = both + len(weaker) + sum(r.shadowed for r in mine)
    return {
        "perturbed": sum(r.perturbed for r in mine), "skipped": sum(r.perturb_skipped for r in mine),
        "executable_weaker": len(weaker), "examples": weaker[:3],
        "shadowed": sum(r.shadowed for r in mine), "shadowed_fields": list(SHADOWED.get(inv, ())),
        # the executable invariant accepts every perturbed state of a level where the named encoding
        # rejects some (accepted, so counted as shadowed or weaker): a check with nothing left to say
        "accepts_everything": sorted(lv for lv, d in by_level.items()
                                     if d["executable_rejects"] == 0 and d["encoding_rejects"] > 0),
        "by_level": by_level,
        # fields whose perturbation the executable invariant rejects and the whole encoding accepts
        # (the projection does not carry them, or the encoding states the rule another way)
        "encoding_weaker": dict(sorted(enc_weaker.items())),
        # no perturbed state the encoding rejects: the projection carries nothing the executable check
        # reads, so a weakened check goes unseen on this row (said, not failed)
        "comparable": rejects > 0,
    }


def strength_problems(st: dict[str, Any]) -> list[str]:
    """What fails a row in :func:`strength`'s figures (empty: nothing)."""
    why = []
    if st.get("executable_weaker"):
        why.append(f"executable invariant weaker than its encoding on {st['executable_weaker']} perturbed "
                   f"state(s), e.g. {st['examples'][0][:220]}")
    for lv in st.get("accepts_everything", []):
        d = st["by_level"][lv]
        why.append(f"executable invariant accepts all {d['perturbed']} perturbed {lv}s; the encoding rejects "
                   f"{d['encoding_rejects']}")
    return why
