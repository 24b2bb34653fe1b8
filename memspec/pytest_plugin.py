"""pytest plugin (entry point ``pytest11: memspec``).

``pytest --memspec-target=TARGET`` runs the conformance suite against TARGET
inside the user's own test session, one test per invariant of each level
(see :mod:`memspec.invariants.pytest_suite`), so it drops into their CI.
Without the option this plugin does nothing.
"""

from __future__ import annotations

from memspec.invariants.levels import LEVELS


def pytest_addoption(parser):  # pragma: no cover - exercised through pytest itself
    group = parser.getgroup("memspec")
    group.addoption(
        "--memspec-target",
        action="append",
        default=[],
        metavar="TARGET",
        help="run memspec's conformance suite against TARGET (entry-point name or package.module:attr); repeatable",
    )
    group.addoption("--memspec-level", default="all", choices=(*LEVELS, "all"),
                    help="which levels of the suite to run (default all that apply)")
    group.addoption("--memspec-examples", type=int, default=None, help="runs per level (default: the profile's)")
    group.addoption("--memspec-steps", type=int, default=None, help="steps per run (default: the profile's)")
    group.addoption("--memspec-seed", type=int, default=None, help="random seed (default: derandomized)")
    group.addoption("--memspec-profile", default="ci", choices=("ci", "dev", "fuzz"), help="Hypothesis profile")
    group.addoption("--memspec-out", default="memspec-out/repro", help="where reproduction files are written")
    group.addoption("--memspec-timeout", type=float, default=5.0, help="per-call timeout (s); a hang is a failure")
    group.addoption("--memspec-machine", default=None, help="package.module:attr of a spec machine other than the level's")


def pytest_collection_modifyitems(session, config, items):  # pragma: no cover - exercised in a subprocess test
    if not config.getoption("memspec_target", default=None):
        return
    from memspec.invariants.pytest_suite import add_items

    add_items(session, config, items)
