"""Planted-bug mechanisms and roles ("mutants"): each breaks exactly one invariant.

Every module in this package defines ``MUTANTS: list[Mutant]``.  The
conformance harness must catch every one of them, blamed on the invariant it
names; ``memspec mutants`` prints the kill table.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

from memspec.spec.api import TargetInstance


@dataclass(frozen=True)
class Mutant:
    """A planted bug.

    ``factory(**kw) -> TargetInstance`` makes the broken target (for a bug in a
    mechanism or EP).  For a bug in a role (governor, manager, holder, owning
    handle) ``factory`` makes the healthy target and ``patch_system(system)``
    breaks the wired system the harness built around it.
    """

    name: str
    invariant: str
    description: str
    factory: Callable[..., TargetInstance]
    level: str = "mechanism"  # "mechanism" | "system" | "caching"
    patch_system: Callable[[Any], Any] | None = None


def all_mutants() -> list[Mutant]:
    """Every mutant of every module in this package, in module order."""
    found: list[Mutant] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        found.extend(getattr(mod, "MUTANTS", []))
    return found
