"""Finding conformance targets.

A *target* is a factory ``factory(capacity=None) -> TargetInstance`` that
returns a fresh system under test each call.  Targets are named three ways:

* an entry point of the group ``memspec.targets`` (``reference``,
  ``reference-eager``, ``cuda-host``, ... or a plugin's own);
* ``package.module:attr`` -- any importable factory;
* ``mutant:NAME`` -- a planted-bug target of :mod:`memspec.invariants.mutants`
  (a plain factory like any other; the name is kept for the report);
* ``c:path/to/libplugin.so`` -- a C plugin (``adapters/c/memspec_plugin.h``),
  loaded by :mod:`memspec.adapters.c_plugin`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass, field
from typing import Any, Callable

from memspec.invariants.levels import mechanism_capabilities

GROUP = "memspec.targets"
DEFAULT_TARGET = "reference"


@dataclass
class TargetRef:
    """A resolved target name: its factory, where it came from, and (for a
    mutant) the mutant record."""

    name: str
    factory: Callable[..., Any] | None
    source: str
    error: str | None = None
    mutant: Any = None
    meta: dict = field(default_factory=dict)


def _entry_points() -> list:
    try:
        return list(importlib.metadata.entry_points(group=GROUP))
    except TypeError:  # pragma: no cover - Python < 3.10 API
        return list(importlib.metadata.entry_points().get(GROUP, []))


def _load_attr(spec: str) -> Callable[..., Any]:
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise LookupError(f"{spec!r} is not of the form package.module:attr")
    import os
    import sys

    if os.getcwd() not in sys.path:  # like ``python -m``: the working directory's modules are importable
        sys.path.insert(0, os.getcwd())
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise LookupError(f"{spec!r} is not callable")
    return obj


def list_targets() -> list[TargetRef]:
    """Every entry-point target, loaded (a failing import is reported in ``error``)."""
    out: list[TargetRef] = []
    seen: set[str] = set()
    for ep in sorted(_entry_points(), key=lambda e: e.name):
        if ep.name in seen:
            continue
        seen.add(ep.name)
        try:
            fac = ep.load()
            out.append(TargetRef(ep.name, fac, f"entry point {ep.value}"))
        except Exception as e:  # noqa: BLE001 - report, never crash the listing
            out.append(TargetRef(ep.name, None, f"entry point {ep.value}", error=f"{type(e).__name__}: {e}"))
    return out


def resolve(name: str) -> TargetRef:
    """Resolve a target name; raises :class:`LookupError` with the reason."""
    if name.startswith("mutant:"):
        from memspec.invariants.mutants import all_mutants

        want = name.split(":", 1)[1]
        for m in all_mutants():
            if m.name == want:
                return TargetRef(name, m.factory, f"mutant ({m.description})", mutant=m)
        raise LookupError(f"no mutant named {want!r}")
    if name.startswith("c:zoo:"):
        from memspec.adapters.zoo import factory as zoo_factory

        return TargetRef(name, zoo_factory(name[6:]), f"zoo allocator {name[6:]}")
    if name.startswith("c:"):
        from memspec.adapters.c_plugin import factory as c_plugin_factory

        return TargetRef(name, c_plugin_factory(name[2:]), f"C plugin {name[2:]}")
    if ":" in name:
        try:
            return TargetRef(name, _load_attr(name), "module attribute")
        except LookupError:
            raise
        except Exception as e:  # noqa: BLE001
            raise LookupError(f"cannot load {name!r}: {type(e).__name__}: {e}") from e
    for ep in _entry_points():
        if ep.name == name:
            try:
                return TargetRef(name, ep.load(), f"entry point {ep.value}")
            except Exception as e:  # noqa: BLE001
                raise LookupError(f"target {name!r} ({ep.value}) failed to import: {type(e).__name__}: {e}") from e
    known = ", ".join(sorted({e.name for e in _entry_points()})) or "none"
    raise LookupError(f"unknown target {name!r} (known: {known}; or use package.module:attr)")


def capabilities(instance: Any) -> dict[str, bool]:
    """Discover what a fresh instance provides (``None`` = explicitly absent)."""
    return mechanism_capabilities(instance)
