"""Planted-bug mechanisms and roles ("mutants"): each breaks exactly one invariant.

Every module in this package defines ``MUTANTS: list[Mutant]``.  The
conformance harness must catch every one of them, blamed on the invariant it
names; ``memspec mutants`` prints the kill table.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

from memspec.spec.api import TargetInstance


@dataclass(frozen=True)
class Mutant:
    """A planted bug.

    ``factory(**kw) -> TargetInstance`` makes the broken target, through
    the public target contract only: a broken mechanism or EP, or a broken
    role the target brings itself (``TargetInstance.roles``).
    """

    name: str
    invariant: str
    description: str
    factory: Callable[..., TargetInstance]
    level: str = "mechanism"  # "mechanism" | "system" | "caching"


def all_mutants() -> list[Mutant]:
    """Every mutant of every module in this package, in module order."""
    found: list[Mutant] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        found.extend(getattr(mod, "MUTANTS", []))
    return found
