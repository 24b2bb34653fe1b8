"""pytest plugin (entry point ``pytest11: memspec``).

``pytest --memspec-target=TARGET`` runs the conformance suite against TARGET
inside the user's own test session, one test per invariant of each level
(see :mod:`memspec.invariants.pytest_suite`), so it drops into their CI.
Without the option this plugin does nothing.
"""

from __future__ import annotations

import argparse

from memspec.argtypes import out_dir, positive_int, seconds
from memspec.invariants.levels import LEVELS


def _seed(text: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _target(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("empty target name")
    return text


def pytest_addoption(parser):  # pragma: no cover - exercised through pytest itself
    # every value is checked by its type as the command line is parsed: a bad one is pytest's one-line
    # usage error (exit status 4), never a default silently used or a failure inside the suite
    group = parser.getgroup("memspec")
    group.addoption(
        "--memspec-target",
        action="append",
        default=[],
        type=_target,
        metavar="TARGET",
        help="run memspec's conformance suite against TARGET (entry-point name or package.module:attr); repeatable",
    )
    group.addoption("--memspec-level", default="all", choices=(*LEVELS, "all"),
                    help="which levels of the suite to run (default all that apply)")
    group.addoption("--memspec-examples", type=positive_int, default=None, help="runs per level (default: the profile's)")
    group.addoption("--memspec-steps", type=positive_int, default=None, help="steps per run (default: the profile's)")
    group.addoption("--memspec-seed", type=_seed, default=None, help="random seed (default: derandomized)")
    group.addoption("--memspec-profile", default="ci", choices=("ci", "dev", "fuzz"), help="Hypothesis profile")
    # checked in pytest_configure, and only with --memspec-target: argparse would check a string
    # default in every pytest session of every project that has memspec installed
    group.addoption("--memspec-out", default=None,
                    help="where reproduction files are written (default memspec-out/repro)")
    group.addoption("--memspec-timeout", type=seconds, default=5.0, help="per-call timeout (s); a hang is a failure")
    group.addoption("--memspec-machine", default=None, help="package.module:attr of a spec machine other than the level's")


def pytest_configure(config):  # pragma: no cover - exercised in a subprocess test
    if not config.getoption("memspec_target", default=None):
        return
    import pytest

    out = config.getoption("memspec_out")
    try:
        config.option.memspec_out = out_dir(out if out is not None else "memspec-out/repro")
    except argparse.ArgumentTypeError as e:
        raise pytest.UsageError(f"--memspec-out: {e}") from None


def pytest_collection_modifyitems(session, config, items):  # pragma: no cover - exercised in a subprocess test
    if not config.getoption("memspec_target", default=None):
        return
    from memspec.invariants.pytest_suite import add_items

    add_items(session, config, items)
