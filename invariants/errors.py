"""What the engine raises and reports: a :class:`Violation` per invariant,
errors of the spec, of the target, and stand-ins for a call that hung or
killed its process."""

from __future__ import annotations

# The spec model itself raised while stepping (a bug in the spec, not in the target): defined by
# the spec, whose choosers raise it too (an empty domain, bad weights); one class for both layers
from memspec.spec.core import SpecError  # noqa: F401 (re-exported)

#: Pseudo-invariant ids for failures that are not a spec invariant.
SPEC_ERROR = "SPEC"      # the spec itself crashed (a bug in the model, not in the target)
TARGET_ERROR = "TARGET"  # the target factory or teardown crashed


class Violation(AssertionError):
    """A conformance failure, attributed to one invariant.

    ``cause`` is one of ``outcome`` (a permitted error type but not permitted
    here, or a permitted return rejected by the spec), ``unexpected-exception``
    (an exception outside the contract), ``wrong-type`` (a return of the wrong
    type), ``hang``, ``crash`` (the target killed its process), ``invariant``,
    ``observation``, ``data``, ``capability``.
    """

    def __init__(self, invariant: str, cause: str, reason: str, trace: list | None = None, step: int | None = None):
        super().__init__(f"{invariant} [{cause}] {reason}")
        self.invariant = invariant
        self.cause = cause
        self.reason = reason
        self.trace = list(trace or [])
        self.step = step


_VIOLATION_CLASSES: dict[str, type[Violation]] = {}


def violation_class(invariant: str) -> type[Violation]:
    """One subclass per invariant id: Hypothesis keys distinct bugs by
    exception type, so a shrink never trades one invariant's failure for
    another's."""
    cls = _VIOLATION_CLASSES.get(invariant)
    if cls is None:
        safe = "".join(ch if ch.isalnum() else "_" for ch in invariant)
        cls = type(f"Violation_{safe}", (Violation,), {"__module__": __name__})
        _VIOLATION_CLASSES[invariant] = cls
    return cls




class TargetError(Exception):
    """The target could not be built or torn down (factory raised)."""


class HangResult(Exception):
    """Stand-in error value for a call that did not return in time."""


_HangResult = HangResult  # older name
