"""pytest plugin (entry point ``pytest11: memspec``).

``pytest --memspec-target=TARGET`` runs the conformance suite against TARGET
inside the user's own test session (see :mod:`memspec.invariants.pytest_suite`).
Without the option this plugin does nothing.
"""

from __future__ import annotations


def pytest_addoption(parser):  # pragma: no cover - exercised through pytest itself
    group = parser.getgroup("memspec")
    group.addoption(
        "--memspec-target",
        action="append",
        default=[],
        metavar="TARGET",
        help="run memspec's conformance suite against TARGET (entry-point name or package.module:attr); repeatable",
    )
