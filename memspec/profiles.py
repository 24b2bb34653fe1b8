"""Hypothesis settings profiles (``ci``, ``dev``, ``fuzz``): defined in
:mod:`memspec.invariants.profiles`, below the CLI layer; importing this
module registers them too."""

from __future__ import annotations

from memspec.invariants.profiles import load  # noqa: F401 - registers the profiles

__all__ = ["load"]
